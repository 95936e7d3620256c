"""Wall time per sample (the paper's wall-time table; official-impl §5.9), as an evaluation task.

The prompts are a fixed subset of each dataset (numpy RandomState(42) choice of `n_prompts` rows, 20 by default) read
with the protocol of the `source` task (summarization by default, as the paper: its prompts and generation lengths).
The runner gives this task batch size 1, one untimed warm-up call per (method, NFE) before the first timed sample,
and synchronises the device around every sample; each record carries its seconds, generated tokens (the response up
to its first EOS/EoT) and the process's peak memory. The summary reports per (dataset, method, NFE): median and mean
seconds per sample, generated tokens per second (generated tokens only), NFE and forward passes, peak memory, and
plots seconds per sample against NFE with the autoregressive baselines as horizontal lines.

Task options: `n_prompts` (20), `source` ('summarization' | 'generation' | 'reasoning').
"""

from __future__ import annotations

import statistics
from typing import Any

from ..eval_config import DatasetSpec
from ..data import Sample
from ..walltime import choose_prompts, plot_walltime
from .base import SamplingTask, SummaryContext, TaskSummary, group_records

SOURCES = ("summarization", "generation", "reasoning")


class WalltimeTask(SamplingTask):
    name = "walltime"
    batch_size = 1
    """The runner times one sample per call."""
    warmup = True
    """The runner makes one untimed call per (method, NFE) first and records peak memory."""

    def __init__(self) -> None:
        self._source_name = "summarization"

    def _source(self, options: dict[str, Any]):
        from . import get_task

        return get_task(options.get("source", "summarization"))

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
        from . import get_task

        return get_task(self._source_name).gen_length(ds)

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
