"""`dsl-llada demo --cache-frontier`: what approximate key/value caching costs, measured with exact likelihood.

Fast-dLLM-style prefix/dual caching (`sampling/kv_cache.py`) reuses stale keys/values between full forwards. On the
toy world the true distribution is known, so its effect on quality is measured exactly: for Block SDE (the DSL
model) and block remasking (the pretrained masked DLM) at R in {1 (exact), 2, 4, never}, the open-ended exact
perplexity and in-support %, the summarisation ROUGE-L and the share of tokens equal to the exact sampler's,
against seconds per sample. Variants are timed in interleaved rounds (median per variant). Writes
OUT/cache_frontier/: runs.jsonl (one line per variant and round, appended as each finishes; a rerun resumes),
samples.jsonl (round 1's outputs), frontier.md (the table) and frontier.png.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import CACHE_MODES, ConfigBase, ConfigError, RemaskConfig, SDEConfig
from ..eval.report import markdown_table
from ..sampling.batches import run_batches
from ..utils import atomic_write_text, save_figure
from ..utils import progress as progress_bar
from .evaluate import aggregate, score_record
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
        if self.n_open < 1 or self.n_summarize < 0 or self.batch_size < 1 or self.rounds < 1:
            raise ConfigError("need n_open >= 1, n_summarize >= 0, batch_size >= 1 and rounds >= 1")

    @classmethod
    def preset(cls, *, quick: bool, seed: int = 0) -> "FrontierConfig":
        return cls(n_open=8, n_summarize=4, rounds=1, seed=seed) if quick else cls(seed=seed)


@dataclass(frozen=True)
class Variant:
    """One point of the frontier: a sampler ('Block SDE' or 'Block remasking') with one cache setting."""

    sampler: str
    mode: str
    """'off' (exact) or a cache mode."""
    refresh: int

    @property
    def label(self) -> str:
        if self.mode == "off":
            return "R=1 (exact)"
        return f"{self.mode}, R={'never' if self.refresh == 0 else self.refresh}"

    @property
    def model(self) -> str:
        return "dsl" if self.sampler == "Block SDE" else "base"

    def config(self, fc: FrontierConfig, gen_length: int) -> SDEConfig | RemaskConfig:
        blk = gen_length // fc.blocks
        if self.sampler == "Block SDE":
            return SDEConfig(nfe=fc.sde_nfe, gen_length=gen_length, block_length=blk, kv_cache=self.mode,
                             cache_refresh=self.refresh)
        return RemaskConfig(steps=fc.remask_steps, gen_length=gen_length, block_length=blk, eos_inf=True,
                            kv_cache=self.mode, cache_refresh=self.refresh)


SAMPLERS = ("Block SDE", "Block remasking")


def variants(fc: FrontierConfig) -> list[Variant]:
    out = []
    for s in SAMPLERS:
        out.append(Variant(s, "off", 1))
        out += [Variant(s, m, r) for m in fc.modes for r in fc.refreshes]
    return out


def _key(v: Variant, cfg: SDEConfig | RemaskConfig, model_id: str, fc: FrontierConfig) -> str:
    key = {"sampler": v.sampler, "config": cfg.to_dict(), "model": model_id, "n_open": fc.n_open,
           "n_summarize": fc.n_summarize, "batch_size": fc.batch_size, "seed": fc.seed}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def run_frontier(models: dict[str, torch.nn.Module], world, tokenizer, examples, out: Path, fc: FrontierConfig, *,
                 gen_length: int, progress: bool = True, echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Sample, score and time every variant for `fc.rounds` interleaved rounds; returns one row per variant."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    ids = {name: model_fingerprint(m) for name, m in models.items()}
    plan = [(v, v.config(fc, gen_length)) for v in variants(fc)]
    keys = {v: _key(v, cfg, ids[v.model], fc) for v, cfg in plan}
    done = {(r["key"], r["round"]) for r in read_rows(runs_path)}
    prompt_ids = [tokenizer.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in examples]
    todo = [(rnd, v, cfg) for rnd in range(fc.rounds) for v, cfg in plan if (keys[v], rnd) not in done]
    echo(f"cache frontier: {len(plan)} variants x {fc.rounds} round(s), {len(todo)} runs to do, "
         f"{len(examples)} held-out prompts")
    for rnd, v, cfg in progress_bar(todo, desc="cache frontier", enabled=progress):
        model = models[v.model]
        t = time.perf_counter()
        outputs: list[list[int]] = []
        for rows in run_batches(model, prompt_ids, cfg, batch_size=fc.batch_size, retry=False,
                                seed_of=lambda i: fc.seed * 100_003 + i):
            outputs += [r.ids for r in rows]
        seconds = time.perf_counter() - t
        row: dict[str, Any] = {"key": keys[v], "round": rnd, "sampler": v.sampler, "mode": v.mode,
                               "refresh": v.refresh, "label": v.label, "seconds": seconds, "n": len(outputs),
                               "seconds_per_sample": seconds / len(outputs), "config": cfg.to_dict(),
                               "frontier": fc.to_dict(), "model": ids[v.model]}
        if rnd == 0:
            records = []
            for i, ids_i in enumerate(outputs):
                text = tokenizer.decode(ids_i, skip_special_tokens=False)
                records.append(score_record(world, examples[i], text, method=v.label, nfe=0, seed=None, index=i,
                                            forward_passes=0))
            agg = aggregate(records)
            row["open"], row["summarize"] = task_metrics(agg, "open", OPEN_KEYS), task_metrics(agg, "summarize", SUM_KEYS)
            row["ids"] = outputs
            append_rows(out / "samples.jsonl", [{"key": keys[v], "label": v.label, "sampler": v.sampler, **r}
                                                  for r in records])
        append_rows(runs_path, [row])
    return frontier_rows(read_rows(runs_path), [keys[v] for v, _ in plan])


def frontier_rows(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per variant key (in `keys` order): round-1 quality, median seconds per sample over the rounds (and
    their range), and the share of response tokens equal to its sampler's exact variant."""
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
                    | {"seconds_per_sample": statistics.median(times), "seconds_min": min(times),
                       "seconds_max": max(times), "rounds": len(times)})
    exact = {r["sampler"]: r for r in rows if r["mode"] == "off"}
    for r in rows:
        ref = exact.get(r["sampler"])
        if ref is None:
            r["same_tokens"] = r["speedup"] = None
            continue
        same = sum(x == y for a, b in zip(r["ids"], ref["ids"]) for x, y in zip(a, b))
        r["same_tokens"] = 100.0 * same / max(sum(len(b) for b in ref["ids"]), 1)
        r["speedup"] = ref["seconds_per_sample"] / r["seconds_per_sample"]
    return rows


COLUMNS = [("sampler", "Sampler", ""), ("label", "Cache", ""), ("time", "ms / sample (range)", ""),
           ("speedup", "speed-up", ".2f"), ("same_tokens", "same tokens %", ".1f"), ("ppl", "open PPL (exact)", ".2f"),
           ("in_support", "in-support %", ".0f"), ("rougeL", "sum. ROUGE-L", ".1f"), ("sum_ppl", "sum. PPL", ".2f")]


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    o, s = r.get("open") or {}, r.get("summarize") or {}
    ms = r.get("seconds_per_sample")
    time_txt = "–" if ms is None else (f"{ms * 1000:.1f} ({r['seconds_min'] * 1000:.1f}–"
                                        f"{r['seconds_max'] * 1000:.1f})")
    return {"sampler": r["sampler"], "label": r["label"], "time": time_txt, "speedup": r.get("speedup"),
            "same_tokens": r.get("same_tokens"), "ppl": o.get("ppl"), "in_support": o.get("in_support"),
            "rougeL": s.get("rougeL"), "sum_ppl": s.get("ppl")}


def render_frontier(rows: Sequence[dict[str, Any]], fc: FrontierConfig, reference: dict[str, Any]) -> str:
    table = [_table_row(r) for r in rows]
    table.append(_table_row({"sampler": "World (true samples)", "label": "–", **reference}))
    n = rows[0]["n"] if rows else 0
    intro = (f"Approximate key/value caching on the toy world: {n} held-out prompts ({fc.n_open} open-ended, "
             f"{fc.n_summarize} summarisation), {fc.blocks} blocks per response, Block SDE NFE {fc.sde_nfe} per block "
             f"(DSL model), block remasking {fc.remask_steps} steps with EOS banned (pretrained MDM), batch "
             f"{fc.batch_size}; times are medians over {fc.rounds} interleaved round(s) (range in brackets). R = a "
             f"full forward every R model calls of a block ('never' = only at the block's first call); 'dual' "
             f"recomputes the current block only, 'prefix' the block and everything after it.\n\n")
    return intro + markdown_table(table, COLUMNS) + "\n"


def plot_frontier(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """One row of panels per sampler: exact PPL (log), in-support %, ROUGE-L and tokens equal to the exact sampler's
    against ms per sample; one line per cache mode through R = 1 (exact), 2, 4, never."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("open", "ppl", "open-ended exact PPL"), ("open", "in_support", "open-ended in-support %"),
              ("summarize", "rougeL", "summarisation ROUGE-L"), (None, "same_tokens", "tokens equal to exact %"))
    samplers = [s for s in SAMPLERS if any(r["sampler"] == s for r in rows)]
    fig, axes = plt.subplots(len(samplers), len(panels), figsize=(3.6 * len(panels), 3.1 * len(samplers)),
                             squeeze=False)
    styles = {"dual": ("-", "tab:blue"), "prefix": ("--", "tab:orange")}
    for i, sampler in enumerate(samplers):
        exact = [r for r in rows if r["sampler"] == sampler and r["mode"] == "off"]
        for j, (task, key, title) in enumerate(panels):
            ax = axes[i][j]
            for mode, (ls, color) in styles.items():
                pts = exact + sorted((r for r in rows if r["sampler"] == sampler and r["mode"] == mode),
                                     key=lambda r: r["refresh"] or float("inf"))
                xy = [(r["seconds_per_sample"] * 1000, r.get(key) if task is None else (r.get(task) or {}).get(key), r)
                      for r in pts]
                xy = [p for p in xy if p[1] is not None]
                if len(xy) < 2:
                    continue
                ax.plot([p[0] for p in xy], [p[1] for p in xy], ls, marker="o", color=color, label=mode)
                for x, y, r in xy:
                    tag = "1" if r["mode"] == "off" else ("never" if r["refresh"] == 0 else str(r["refresh"]))
                    ax.annotate(tag, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
            if key == "ppl":
                ax.set_yscale("log")
            ax.set_title(f"{sampler}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(samplers) - 1:
                ax.set_xlabel("ms per sample")
        axes[i][0].legend(fontsize=7, frameon=False, title="cache", title_fontsize=7)
    fig.suptitle("Toy world: approximate KV caching, quality vs time (point labels: refresh interval R)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def write_frontier(rows, fc: FrontierConfig, reference: dict[str, Any], out: Path) -> None:
    out = Path(out)
    atomic_write_text(out / "frontier.md", render_frontier(rows, fc, reference))
    plot_frontier(rows, out / "frontier.png")
