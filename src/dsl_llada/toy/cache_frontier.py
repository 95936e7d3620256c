"""`dsl-llada demo --cache-frontier`: the exact quality-seconds frontier of every sampler on the toy world.

What is measured, on the demo's checkpoints (DSL model for the SDE samplers, pretrained MDM for the discrete ones):
- the speed options, alone and combined, at one step count: Fast-dLLM-style prefix/dual key/value caching
  (`sampling/kv_cache.py`, stale keys/values reused between full forwards) at refresh R in {1 (exact), 2, 4, never};
  the backbone in bf16 (the paper's precision recipe, `DSLModel.to_compute_dtype`); the sparse converter
  (`SDEConfig.converter_tolerance`); for Block SDE, whole-response SDE and block remasking;
- the step axis: exact SDE / Block SDE at other NFEs, exact block remasking at other step counts;
- confidence-threshold parallel decoding (`RemaskConfig.threshold`, Fast-dLLM's rule) at several tau, with and
  without a cache; ReMDM at several step counts;
- the ceiling: the same samplers on the exact Bayes-optimal denoisers (`toy/oracle.py`), quality only.
On the toy world the true distribution is known, so quality is exact: the open-ended exact perplexity, in-support %,
premature EOS % and the share of complete in-support answers, the summarisation ROUGE-L (each with its 95 %
bootstrap interval over prompts) and the share of tokens equal to the sampler's exact fp32 variant, against samples
per second at the quality batch (and at batch 1 on the first prompts). Variants are timed in interleaved rounds
(median per variant).
Writes OUT/cache_frontier/: runs.jsonl (one line per variant and round, appended as each finishes; a rerun
resumes), samples.jsonl (round 1's outputs), frontier.md (the table and the recommended points) and frontier.png.
The rows (one per variant, from runs.jsonl) are `frontier_points.py`; the report (table, recommendations, plot) and
its writer are `frontier_report.py`; neither needs torch.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import CACHE_MODES, MAX_NFE, CacheMode, ConfigBase, ConfigError, RemaskConfig, SDEConfig
from ..core.loading import DTYPES
from ..core.backbones.base import Backbone
from ..core.model import DSLModel, cast_for_inference
from ..sampling.progress import progress as progress_bar
from ..runtime.environment import load_average
from ..artifacts.fingerprints import sampling_key
from ..stats import bootstrap_ratio
from .evaluate import aggregate, sampled_rows, score_record
from .frontier_points import SAMPLERS, SDE_SAMPLERS, frontier_rows
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
    sde_nfes: tuple = ()
    """Further NFEs at which exact fp32 whole-response SDE and Block SDE (per block) are measured."""
    remask_steps_grid: tuple = ()
    """Further step counts at which exact fp32 block remasking is measured (each a multiple of `blocks`)."""
    thresholds: tuple = ()
    """Confidence-threshold decoding (block remasking, at most one step per token): the tau values measured."""
    threshold_modes: tuple = ("off",)
    """Cache settings of the threshold rows: 'off', or 'dual' / 'prefix' with R = never (Fast-dLLM's setting)."""
    remdm_steps: tuple = ()
    """ReMDM (block remasking with re-masking of committed tokens): the step counts measured."""
    oracle: bool = False
    """Also run the samplers on the exact Bayes-optimal denoisers (the quality ceiling; their time is the oracle's
    forward-backward, not a network's, so it is not a speed figure)."""
    batch1_prompts: int = 0
    """Also time batch 1 on the first N prompts of each round (0 = no batch-1 timing)."""
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
        if any(not isinstance(n, int) or n < 2 or n % 2 or n > MAX_NFE for n in self.sde_nfes):
            raise ConfigError(f"sde_nfes={list(self.sde_nfes)!r}: each must be an even int from 2 to {MAX_NFE}")
        for name in ("remask_steps_grid", "remdm_steps"):
            steps = getattr(self, name)
            if any(not isinstance(n, int) or n < self.blocks or n % self.blocks or n > MAX_NFE for n in steps):
                raise ConfigError(f"{name}={list(steps)!r}: each must be a multiple of blocks={self.blocks} "
                                  f"from {self.blocks} to {MAX_NFE}")
        if any(not isinstance(t, float) or not 0.0 < t < 1.0 for t in self.thresholds):
            raise ConfigError(f"thresholds={list(self.thresholds)!r}: each must be a float in (0, 1)")
        if not self.threshold_modes or any(m not in CACHE_MODES for m in self.threshold_modes):
            raise ConfigError(f"threshold_modes={list(self.threshold_modes)!r}: choose from {list(CACHE_MODES)}")
        if not 0 <= self.batch1_prompts <= self.n_open + self.n_summarize:
            raise ConfigError(f"batch1_prompts={self.batch1_prompts!r} must be from 0 to n_open + n_summarize = "
                              f"{self.n_open + self.n_summarize}")

    @classmethod
    def preset(cls, *, quick: bool, seed: int = 0) -> "FrontierConfig":
        """--quick: 12 prompts, the dual cache at R in {2, never}, one threshold, three rounds (a few minutes on 2
        CPU cores). Default: 72 prompts, every sampler on its step axis, threshold decoding at four tau with and
        without a cache, ReMDM, the oracle ceiling, batch 8 and batch 1."""
        if quick:
            return cls(n_open=8, n_summarize=4, rounds=3, modes=("dual",), refreshes=(2, 0), thresholds=(0.9,),
                       seed=seed)
        return cls(modes=("dual", "prefix"), refreshes=(2, 0), sde_nfes=(8, 32, 64), remask_steps_grid=(8, 16),
                   thresholds=(0.9, 0.7, 0.5, 0.3), threshold_modes=("off", "dual", "prefix"), remdm_steps=(32, 64),
                   oracle=True, batch1_prompts=12, seed=seed)


@dataclass(frozen=True)
class Variant:
    """One point of the frontier: a sampler with one cache setting, one backbone dtype, one converter tolerance and
    one step count, on the trained model or (`oracle`) on the exact denoiser."""

    sampler: str
    """One of SAMPLERS."""
    mode: CacheMode
    """'off' (no cache) or a cache mode."""
    refresh: int
    dtype: str = "float32"
    tolerance: float = 0.0
    """Sparse converter tolerance (SDE samplers; 0 = dense, exact)."""
    steps: int = 0
    """NFE (SDE samplers, per block for Block SDE) or steps (discrete); 0 = the config's default for the sampler."""
    threshold: float | None = None
    """Threshold remasking's tau."""
    oracle: bool = False

    @property
    def name(self) -> str:
        """The sampler as the table names it ('Oracle ...' on the exact denoiser)."""
        return ("Oracle " if self.oracle else "") + self.sampler

    @property
    def cache_label(self) -> str:
        if self.mode == "off":
            return "R=1 (exact)"
        return f"{self.mode}, R={'never' if self.refresh == 0 else self.refresh}"

    @property
    def label(self) -> str:
        """The step count or tau when not the default, the cache setting, then the approximate options in force
        ('R=1 (exact)' alone is the exact sampler at the default step count)."""
        head = ([f"tau={self.threshold:g}"] if self.threshold is not None else []) + (
            [(f"NFE {self.steps}" if self.sampler in SDE_SAMPLERS else f"{self.steps} steps")] if self.steps else [])
        extra = (["bf16"] if self.dtype == "bfloat16" else []) + ([f"sparse {self.tolerance:g}"] if self.tolerance
                                                                   else [])
        return ", ".join([*head, self.cache_label, *extra])

    @property
    def model(self) -> str:
        if self.oracle:
            return "oracle-dsl" if self.sampler in SDE_SAMPLERS else "oracle"
        return "dsl" if self.sampler in SDE_SAMPLERS else "base"

    def config(self, fc: FrontierConfig, gen_length: int) -> SDEConfig | RemaskConfig:
        blk = gen_length // fc.blocks
        if self.sampler in SDE_SAMPLERS:
            return SDEConfig(nfe=self.steps or fc.sde_nfe, gen_length=gen_length,
                             block_length=blk if self.sampler == "Block SDE" else 0, kv_cache=self.mode,
                             cache_refresh=self.refresh, converter_tolerance=self.tolerance)
        steps = self.steps or (gen_length if self.sampler == "Threshold remasking" else fc.remask_steps)
        return RemaskConfig(steps=steps, gen_length=gen_length, block_length=blk, eos_inf=True, kv_cache=self.mode,
                            cache_refresh=self.refresh, threshold=self.threshold, remdm=self.sampler == "ReMDM")


def variants(fc: FrontierConfig) -> list[Variant]:
    """The speed options (per sampler, dtype and converter tolerance: the exact cache setting, then every cache mode
    x refresh; whole-response SDE has no cache, remasking no converter), then the step axis, threshold decoding,
    ReMDM and the oracle rows. The first is the exact fp32 Block SDE."""
    out = []
    for s in SAMPLERS[:3]:
        if s == "SDE" and not fc.whole_sde:
            continue
        caches = [("off", 1)] + ([] if s == "SDE" else [(m, r) for m in fc.modes for r in fc.refreshes])
        tols = (0.0,) if s == "Block remasking" else (0.0, *fc.tolerances)
        out += [Variant(s, m, r, d, t) for d in fc.dtypes for t in tols for m, r in caches]
    sdes = [s for s in SDE_SAMPLERS if s != "SDE" or fc.whole_sde]
    out += [Variant(s, "off", 1, steps=n) for s in sdes for n in fc.sde_nfes if n != fc.sde_nfe]
    out += [Variant("Block remasking", "off", 1, steps=n) for n in fc.remask_steps_grid if n != fc.remask_steps]
    out += [Variant("Threshold remasking", m, 1 if m == "off" else 0, threshold=t)
            for t in fc.thresholds for m in fc.threshold_modes]
    out += [Variant("ReMDM", "off", 1, steps=n) for n in fc.remdm_steps]
    if fc.oracle:
        oracle_sde = [Variant("SDE" if fc.whole_sde else "Block SDE", "off", 1, steps=n, oracle=True)
                      for n in sorted({fc.sde_nfe, *fc.sde_nfes})]
        out += [*oracle_sde, Variant("Block remasking", "off", 1, oracle=True)]
        out += [Variant("Threshold remasking", "off", 1, threshold=t, oracle=True) for t in fc.thresholds[:1]]
    return out


def _key(v: Variant, cfg: SDEConfig | RemaskConfig, model_id: str | dict, fc: FrontierConfig) -> str:
    key = {"sampler": v.sampler, "config": cfg.to_dict(), "model": model_id, "n_open": fc.n_open,
           "n_summarize": fc.n_summarize, "batch_size": fc.batch_size, "seed": fc.seed}
    if v.dtype != "float32":  # fp32 rows keep the keys they had before dtypes were measured (they resume)
        key["dtype"] = v.dtype
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _sample(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]], cfg: SDEConfig | RemaskConfig,
            fc: FrontierConfig, batch_size: int) -> tuple[list[list[int]], float, dict[str, float]]:
    """Every prompt's response ids, the seconds it took, and the forward passes of the call that made each response
    (mean over responses) and each row's own denoising steps (threshold decoding: data-dependent per row)."""
    outputs, passes, row_steps = [], 0.0, 0.0
    t = time.perf_counter()
    for r, out in sampled_rows(model, prompt_ids, cfg, batch_size=batch_size, seed_of=lambda i: fc.seed * 100_003 + i):
        outputs.append(out.ids[r.row].tolist())
        passes += out.forward_passes
        row_steps += float(out.steps_per_block[r.row].sum()) if out.steps_per_block is not None else out.nfe
    seconds = time.perf_counter() - t
    n = max(len(outputs), 1)
    return outputs, seconds, {"forward_passes": passes / n, "row_steps": row_steps / n}


def _score(world, tokenizer, examples, v: Variant, outputs: list[list[int]]) -> tuple[dict[str, Any], list[dict]]:
    """Round 1's quality of a variant: the per-task metrics with intervals, and the per-sample records."""
    records = [score_record(world, examples[i], tokenizer.decode(ids_i, skip_special_tokens=False), method=v.label,
                            nfe=0, seed=None, index=i, forward_passes=0) for i, ids_i in enumerate(outputs)]
    agg = aggregate(records)
    opened = task_metrics(agg, "open", OPEN_KEYS + ("ppl_ci", "in_support_ci", "premature_eos%_ci"))
    if opened is not None:
        good = [r for r in records if r["task"] == "open"]
        values = [100.0 * (r["in_support"] == 1.0 and not r["tags"].get("premature_eos")) for r in good]
        opened |= {"complete": sum(values) / len(values), "complete_ci": bootstrap_ratio(values)}
    quality = {"open": opened, "summarize": task_metrics(agg, "summarize", SUM_KEYS + ("ppl_ci", "rougeL_ci"))}
    return quality, records


def run_frontier(models: dict[str, DSLModel | Backbone], world, tokenizer, examples, out: Path, fc: FrontierConfig, *,
                 gen_length: int, progress: bool = True, echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Sample, score and time every variant for `fc.rounds` interleaved rounds; returns one row per variant.
    `models` holds 'base' and 'dsl' (and 'oracle', 'oracle-dsl' when `fc.oracle`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    world_id = hashlib.sha256(json.dumps(world.config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
    ids = {name: sampling_key(model_fingerprint(m), tokenizer) | ({"world": world_id} if name.startswith("oracle")
                                                                  else {}) for name, m in models.items()}
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
        outputs, seconds, passes = _sample(model, prompt_ids, cfg, fc, fc.batch_size)
        row: dict[str, Any] = {"key": keys[v], "round": rnd, "sampler": v.name, "mode": v.mode,
                               "refresh": v.refresh, "dtype": v.dtype, "tolerance": v.tolerance, "label": v.label,
                               "steps": v.steps, "threshold": v.threshold, "oracle": v.oracle,
                               "seconds": seconds, "n": len(outputs), "seconds_per_sample": seconds / len(outputs),
                               **passes, "config": cfg.to_dict(), "frontier": fc.to_dict(), "model": ids[v.model],
                               "load_average": load_average(), "threads": torch.get_num_threads()}
        if fc.batch1_prompts:
            b1 = prompt_ids[:fc.batch1_prompts]
            row["seconds_per_sample_b1"] = _sample(model, b1, cfg, fc, 1)[1] / len(b1)
        if rnd == 0:
            quality, records = _score(world, tokenizer, examples, v, outputs)
            row |= quality | {"ids": outputs}
            append_rows(out / "samples.jsonl", [{"key": keys[v], "label": v.label, "sampler": v.name, **r}
                                                  for r in records])
        append_rows(runs_path, [row])
    return frontier_rows(read_rows(runs_path), [keys[v] for v, _ in plan])
