"""`dsl-llada demo --cache-frontier`: the quality-speed frontier of the exact and approximate speed options.

Options measured, alone and combined: Fast-dLLM-style prefix/dual key/value caching (`sampling/kv_cache.py`, which
reuses stale keys/values between full forwards) at refresh R in {1 (exact), 2, 4, never}; the backbone in bf16 (the
paper's precision recipe, `DSLModel.to_compute_dtype`); the sparse converter (`SDEConfig.converter_tolerance`). On
the toy world the true distribution is known, so quality is measured exactly: for Block SDE and whole-response SDE
(the DSL model) and block remasking (the pretrained masked DLM), the open-ended exact perplexity and in-support %,
the summarisation ROUGE-L (each with its 95 % bootstrap interval over prompts) and the share of tokens equal to the
exact fp32 sampler's, against samples per second. Variants are timed in interleaved rounds (median per variant).
Writes OUT/cache_frontier/: runs.jsonl (one line per variant and round, appended as each finishes; a rerun
resumes), samples.jsonl (round 1's outputs), frontier.md (the table and the recommended points) and frontier.png.
The report (table, recommendation, plot) and its writer are `frontier_report.py`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from ..config import CACHE_MODES, CacheMode, ConfigBase, ConfigError, RemaskConfig, SDEConfig
from ..loading import DTYPES
from ..backbones.base import Backbone
from ..model import DSLModel, cast_for_inference
from ..utils import progress as progress_bar
from ..fingerprints import sampling_key
from .evaluate import aggregate, sampled_rows, score_record
from .sweep import OPEN_KEYS, SUM_KEYS, append_rows, model_fingerprint, read_rows, task_metrics
from .tasks import render_prompt


@dataclass(frozen=True)
class FrontierConfig(ConfigBase):
    """What the cache frontier samples and times; saved in every row it writes."""

    sde_nfe: int = 16
    """Block SDE: NFE per block (each block runs the whole Heun schedule: 2 x NFE/2 + 1 forwards)."""
    remask_steps: int = 32
    """Block remasking: total steps (split equally over the blocks)."""
    blocks: int = 4
    """Blocks per response (block length = gen_length / blocks)."""
    refreshes: tuple = (2, 4, 0)
    """Cached variants' refresh intervals R (0 = only at each block's start); R = 1 is the exact sampler."""
    modes: tuple = ("dual", "prefix")
    """Cache modes measured."""
    dtypes: tuple = ("float32", "bfloat16")
    """Backbone dtypes measured (bf16 = the paper's recipe: converter softmax, posterior and SDE state stay fp32).
    Only pick bf16 where the hardware computes it natively (`loading.auto_dtype`): emulated it is ~400x slower."""
    tolerances: tuple = (1e-3,)
    """Sparse-converter tolerances measured for the SDE samplers (each also with every cache and dtype; the dense
    converter, tolerance 0, is always measured)."""
    whole_sde: bool = True
    """Also measure whole-response SDE (one block: the authors' `sde_generate` setting; no cache)."""
    n_open: int = 48
    """Held-out open-ended prompts (the demo's test split)."""
    n_summarize: int = 24
    """Held-out summarisation prompts."""
    batch_size: int = 8
    rounds: int = 3
    """Timing rounds; each round runs every variant once, in order (quality comes from round 1)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sde_nfe < 2 or self.sde_nfe % 2:
            raise ConfigError(f"sde_nfe={self.sde_nfe!r} must be an even int >= 2")
        if self.blocks < 1 or self.remask_steps % self.blocks:
            raise ConfigError(f"remask_steps={self.remask_steps!r} must be a multiple of blocks={self.blocks!r} >= 1")
        if not self.refreshes or any(not isinstance(r, int) or r < 0 or r == 1 for r in self.refreshes):
            raise ConfigError(f"refreshes={list(self.refreshes)!r}: each must be an int 0 (never) or >= 2 "
                              f"(R = 1 is the exact sampler, always measured)")
        bad = [m for m in self.modes if m not in CACHE_MODES or m == "off"]
        if bad or not self.modes:
            raise ConfigError(f"modes={list(self.modes)!r}: choose from ['dual', 'prefix']")
        if not self.dtypes or any(d not in ("float32", "bfloat16") for d in self.dtypes) or \
                len(set(self.dtypes)) != len(self.dtypes):
            raise ConfigError(f"dtypes={list(self.dtypes)!r}: choose distinct values from ['float32', 'bfloat16']")
        if any(not isinstance(t, float) or not 0.0 < t < 1.0 for t in self.tolerances):
            raise ConfigError(f"tolerances={list(self.tolerances)!r}: each must be a float in (0, 1) "
                              f"(0 = the dense converter, always measured)")
        if self.n_open < 1 or self.n_summarize < 0 or self.batch_size < 1 or self.rounds < 1:
            raise ConfigError("need n_open >= 1, n_summarize >= 0, batch_size >= 1 and rounds >= 1")

    @classmethod
    def preset(cls, *, quick: bool, seed: int = 0) -> "FrontierConfig":
        """--quick: 12 prompts, the dual cache at R in {2, never}, three rounds (about 2 minutes on 2 CPU cores)."""
        if quick:
            return cls(n_open=8, n_summarize=4, rounds=3, modes=("dual",), refreshes=(2, 0), seed=seed)
        return cls(seed=seed)


@dataclass(frozen=True)
class Variant:
    """One point of the frontier: a sampler ('Block SDE', 'SDE' or 'Block remasking') with one cache setting, one
    backbone dtype and one converter tolerance."""

    sampler: str
    mode: CacheMode
    """'off' (no cache) or a cache mode."""
    refresh: int
    dtype: str = "float32"
    tolerance: float = 0.0
    """Sparse converter tolerance (SDE samplers; 0 = dense, exact)."""

    @property
    def cache_label(self) -> str:
        if self.mode == "off":
            return "R=1 (exact)"
        return f"{self.mode}, R={'never' if self.refresh == 0 else self.refresh}"

    @property
    def label(self) -> str:
        """The cache setting, then the approximate options in force ('R=1 (exact)' alone is the exact sampler)."""
        extra = (["bf16"] if self.dtype == "bfloat16" else []) + ([f"sparse {self.tolerance:g}"] if self.tolerance
                                                                   else [])
        return ", ".join([self.cache_label, *extra])

    @property
    def exact(self) -> bool:
        return self.mode == "off" and self.dtype == "float32" and not self.tolerance

    @property
    def model(self) -> str:
        return "base" if self.sampler == "Block remasking" else "dsl"

    def config(self, fc: FrontierConfig, gen_length: int) -> SDEConfig | RemaskConfig:
        blk = gen_length // fc.blocks
        if self.sampler in ("Block SDE", "SDE"):
            return SDEConfig(nfe=fc.sde_nfe, gen_length=gen_length, block_length=blk if self.sampler == "Block SDE"
                             else 0, kv_cache=self.mode, cache_refresh=self.refresh,
                             converter_tolerance=self.tolerance)
        return RemaskConfig(steps=fc.remask_steps, gen_length=gen_length, block_length=blk, eos_inf=True,
                            kv_cache=self.mode, cache_refresh=self.refresh)


SAMPLERS = ("Block SDE", "SDE", "Block remasking")


def variants(fc: FrontierConfig) -> list[Variant]:
    """Per sampler, dtype and converter tolerance: the exact cache setting, then every cache mode x refresh
    (whole-response SDE: no cache; remasking has no converter). The first is the exact fp32 sampler."""
    out = []
    for s in SAMPLERS:
        if s == "SDE" and not fc.whole_sde:
            continue
        caches = [("off", 1)] + ([] if s == "SDE" else [(m, r) for m in fc.modes for r in fc.refreshes])
        tols = (0.0,) if s == "Block remasking" else (0.0, *fc.tolerances)
        out += [Variant(s, m, r, d, t) for d in fc.dtypes for t in tols for m, r in caches]
    return out


def _key(v: Variant, cfg: SDEConfig | RemaskConfig, model_id: str | dict, fc: FrontierConfig) -> str:
    key = {"sampler": v.sampler, "config": cfg.to_dict(), "model": model_id, "n_open": fc.n_open,
           "n_summarize": fc.n_summarize, "batch_size": fc.batch_size, "seed": fc.seed}
    if v.dtype != "float32":  # fp32 rows keep the keys they had before dtypes were measured (they resume)
        key["dtype"] = v.dtype
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def run_frontier(models: dict[str, DSLModel | Backbone], world, tokenizer, examples, out: Path, fc: FrontierConfig, *,
                 gen_length: int, progress: bool = True, echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Sample, score and time every variant for `fc.rounds` interleaved rounds; returns one row per variant."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    ids = {name: sampling_key(model_fingerprint(m), tokenizer) for name, m in models.items()}  # + tokenizer, code
    plan = [(v, v.config(fc, gen_length)) for v in variants(fc)]
    cast: dict[tuple[str, str], DSLModel | Backbone] = {}

    def model_for(v: Variant) -> DSLModel | Backbone:
        if v.dtype == "float32":
            return models[v.model]
        if (v.model, v.dtype) not in cast:  # a copy: the caller's fp32 models stay as they are
            cast[v.model, v.dtype] = cast_for_inference(copy.deepcopy(models[v.model]), DTYPES[v.dtype]).eval()
        return cast[v.model, v.dtype]

    keys = {v: _key(v, cfg, ids[v.model], fc) for v, cfg in plan}
    done = {(r["key"], r["round"]) for r in read_rows(runs_path)}
    prompt_ids = [tokenizer.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in examples]
    todo = [(rnd, v, cfg) for rnd in range(fc.rounds) for v, cfg in plan if (keys[v], rnd) not in done]
    echo(f"cache frontier: {len(plan)} variants x {fc.rounds} round(s), {len(todo)} runs to do, "
         f"{len(examples)} held-out prompts")
    for rnd, v, cfg in progress_bar(todo, desc="cache frontier", enabled=progress):
        model = model_for(v)
        t = time.perf_counter()
        outputs = [out.ids[r.row].tolist() for r, out in sampled_rows(model, prompt_ids, cfg, batch_size=fc.batch_size,
                                                                       seed_of=lambda i: fc.seed * 100_003 + i)]
        seconds = time.perf_counter() - t
        row: dict[str, Any] = {"key": keys[v], "round": rnd, "sampler": v.sampler, "mode": v.mode,
                               "refresh": v.refresh, "dtype": v.dtype, "tolerance": v.tolerance, "label": v.label,
                               "seconds": seconds, "n": len(outputs),
                               "seconds_per_sample": seconds / len(outputs), "config": cfg.to_dict(),
                               "frontier": fc.to_dict(), "model": ids[v.model]}
        if rnd == 0:
            records = []
            for i, ids_i in enumerate(outputs):
                text = tokenizer.decode(ids_i, skip_special_tokens=False)
                records.append(score_record(world, examples[i], text, method=v.label, nfe=0, seed=None, index=i,
                                            forward_passes=0))
            agg = aggregate(records)
            row["open"] = task_metrics(agg, "open", OPEN_KEYS + ("ppl_ci", "in_support_ci"))
            row["summarize"] = task_metrics(agg, "summarize", SUM_KEYS + ("ppl_ci", "rougeL_ci"))
            row["ids"] = outputs
            append_rows(out / "samples.jsonl", [{"key": keys[v], "label": v.label, "sampler": v.sampler, **r}
                                                  for r in records])
        append_rows(runs_path, [row])
    return frontier_rows(read_rows(runs_path), [keys[v] for v, _ in plan])


def frontier_rows(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per variant key (in `keys` order): round-1 quality, median seconds per sample over the rounds (and
    their range), and the share of response tokens equal to (and the speed-up over) its sampler's exact fp32
    variant."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_key.setdefault(r["key"], []).append(r)
    rows = []
    for k in keys:
        rs = sorted(by_key.get(k, []), key=lambda r: r["round"])
        first = next((r for r in rs if r["round"] == 0), None)
        if first is None:
            continue
        times = [r["seconds_per_sample"] for r in rs]
        rows.append({key: first[key] for key in ("sampler", "mode", "refresh", "label", "open", "summarize", "ids",
                                                 "n")}
                    | {"dtype": first.get("dtype", "float32"), "tolerance": first.get("tolerance", 0.0)}
                    | {"seconds_per_sample": statistics.median(times), "seconds_min": min(times),
                       "seconds_max": max(times), "rounds": len(times)})
    exact = {r["sampler"]: r for r in rows if is_exact(r)}
    for r in rows:
        ref = exact.get(r["sampler"])
        if ref is None:
            r["same_tokens"] = r["speedup"] = None
            continue
        same = sum(x == y for a, b in zip(r["ids"], ref["ids"]) for x, y in zip(a, b))
        r["same_tokens"] = 100.0 * same / max(sum(len(b) for b in ref["ids"]), 1)
        r["speedup"] = ref["seconds_per_sample"] / r["seconds_per_sample"]
    return rows


def is_exact(row: dict[str, Any]) -> bool:
    """A frontier row of an exact sampler: no cache, fp32 backbone, dense converter."""
    return row["mode"] == "off" and row.get("dtype", "float32") == "float32" and not row.get("tolerance")
