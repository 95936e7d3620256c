"""Wall time per sample (the paper's wall-time table; docs/provenance.md §5.9), as an evaluation task.

The prompts are a fixed subset of each dataset (numpy RandomState(42) choice of `n_prompts` rows, 20 by default) read
with the protocol of the `source` task (summarization by default, as the paper: its prompts and generation lengths).
The runner gives this task batch size 1, one untimed warm-up call per (method, NFE) before the first timed sample,
and synchronises the device around every sample; each record carries its seconds, generated tokens (the response up
to its first EOS/EoT) and the process's peak memory. The summary reports per (dataset, method, NFE): median and mean
seconds per sample, generated tokens per second (generated tokens only), NFE and forward passes, peak memory, and
plots seconds per sample against NFE with the autoregressive baselines as horizontal lines.

Task options: `n_prompts` (20), `source` ('summarization' | 'generation' | 'reasoning').

Protocol (docs/provenance.md §5.9): batch size 1, the model loaded once, one warm-up call per method, the device
synchronised before and after every sample, median and mean seconds per sample. Throughput counts *generated* tokens
only (the response up to its first EOS/EoT — never the prompt, never padding). Diffusion methods run through this
project's samplers; the autoregressive baselines through any local Hugging Face causal LM's greedy `generate` with
`max_new_tokens` = the generation length, KV cache on or off. Differences from the authors' script: their SDE timing
stops before the final decoding forward (ours includes it: it is part of producing text), and they used an NFE ≤ 16
schedule with one extra step (ours times the schedule the evaluation uses).
"""

from __future__ import annotations

import resource
import statistics
from typing import Any

import numpy as np
import torch

from ...artifacts.figures import save_figure
from ..eval_config import DatasetSpec
from ..samples import Sample
from .generation import GenerationTask
from .reasoning import ReasoningTask
from .summarization import SummarizationTask
from .task import SamplingTask, SummaryContext, TaskSummary, group_records

SOURCES: dict[str, type[SamplingTask]] = {"summarization": SummarizationTask, "generation": GenerationTask,
                                          "reasoning": ReasoningTask}
"""The tasks whose prompts and generation lengths the wall-time task can time (option `source`)."""


def choose_prompts(n_rows: int, k: int, seed: int = 42) -> list[int]:
    """Row indices of the fixed prompt subset: numpy RandomState(seed).choice without replacement (as §5.9)."""
    if n_rows < 1:
        raise ValueError("the dataset has no rows to time")
    return sorted(int(i) for i in np.random.RandomState(seed).choice(n_rows, size=min(k, n_rows), replace=False))


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory so far: CUDA allocator peak on a GPU, the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def plot_walltime(summary: dict[str, dict[str, Any]], path) -> None:
    """Seconds per sample against NFE for each diffusion method, with AR baselines as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    families: dict[str, list[tuple[int, float]]] = {}
    n_ar = 0
    for name, s in summary.items():
        if s.get("nfe") is None:
            ax.axhline(s["median_s"], linestyle=("--", ":", "-.")[n_ar % 3], color=f"C{7 + n_ar % 3}", linewidth=1.2,
                       label=f"{name}")
            n_ar += 1
        else:
            families.setdefault(s.get("family", name), []).append((s["nfe"], s["median_s"]))
    for fam, pts in families.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=fam)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # AR baselines and few-step samplers differ by orders of magnitude
    ax.set_xlabel("NFE")
    ax.set_ylabel("seconds per sample (median)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


class WalltimeTask(SamplingTask):
    name = "walltime"
    batch_size = 1
    """The runner times one sample per call."""
    warmup = True
    """The runner makes one untimed call per (method, NFE) first and records peak memory."""

    def __init__(self) -> None:
        self._source_name = "summarization"

    def _source(self, options: dict[str, Any]) -> SamplingTask:
        return SOURCES[options.get("source", "summarization")]()

    def check_options(self, options: dict[str, Any]) -> None:
        bad = sorted(set(options) - {"n_prompts", "source"})
        if bad:
            raise ValueError(f"task 'walltime': unknown option(s) {bad}; valid: ['n_prompts', 'source']")
        n = options.get("n_prompts", 20)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"task 'walltime': n_prompts={n!r} must be an int >= 1")
        if options.get("source", "summarization") not in SOURCES:
            raise ValueError(f"task 'walltime': source={options.get('source')!r} is not valid; expected one of "
                             f"{list(SOURCES)}")
        self._source_name = options.get("source", "summarization")

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        src = self._source(options)
        rows = src.samples(ds, {})
        keep = choose_prompts(len(rows), int(options.get("n_prompts", 20)), seed=42)
        return [rows[i] for i in keep]

    def gen_length(self, ds: DatasetSpec) -> int:
        return SOURCES[self._source_name]().gen_length(ds)

    def item_metrics(self, info: dict[str, Any], text: str, mode: str) -> dict[str, Any]:
        return {"words": len(text.split())}

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        out = TaskSummary()
        models = {m.name: m for m in ctx.config.methods}
        by_ds: dict[str, dict[str, dict[str, Any]]] = {}
        for (ds, method, nfe), recs in group_records(records).items():
            ok = [r for r in recs if r.get("error") is None]
            if not ok:
                continue
            secs = [r["seconds"] for r in ok]
            toks = sum(r.get("n_tokens") or 0 for r in ok)
            spec = models.get(method)
            ar = spec is not None and spec.preset == "ar"
            row = {"dataset": ds, "method": method, "nfe": None if ar else nfe, "n": len(recs), "errors": len(recs) - len(ok),
                   "median_s": statistics.median(secs), "mean_s": statistics.fmean(secs),
                   "gen_tokens_per_s": toks / sum(secs) if sum(secs) > 0 else 0.0, "mean_gen_tokens": toks / len(ok),
                   "forward_passes": statistics.fmean(r.get("forward_passes") or 0 for r in ok),
                   "peak_mem_mib": max(r.get("peak_mem_mib") or 0.0 for r in ok), "family": method}
            out.rows.append(row)
            by_ds.setdefault(ds, {})[f"{method}@{nfe}" if not ar else method] = row
        lines = []
        for ds, rows in by_ds.items():
            lines += [f"### Wall time: {ds}", "", "| method | NFE | n | median s/sample | mean s/sample | gen tok/s | "
                      "forward passes | peak MiB |", "|---|---|---|---|---|---|---|---|"]
            for r in sorted(rows.values(), key=lambda r: (r["method"], r["nfe"] or 0)):
                lines.append(f"| {r['method']} | {r['nfe'] if r['nfe'] is not None else 'AR'} | {r['n'] - r['errors']} | "
                             f"{r['median_s']:.3f} | {r['mean_s']:.3f} | {r['gen_tokens_per_s']:.1f} | "
                             f"{r['forward_passes']:.0f} | {r['peak_mem_mib']:.0f} |")
            lines.append("")
            ctx.figures_dir.mkdir(parents=True, exist_ok=True)
            path = ctx.figures_dir / f"walltime_{ds}.png"
            plot_walltime(rows, path)
            out.figures.append(str(path.relative_to(ctx.run_dir)))
        out.markdown = "\n".join(lines)
        return out
