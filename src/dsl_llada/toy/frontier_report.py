"""The cache frontier's report: the table, the recommended points and the quality-vs-samples-per-second plot.

The recommended point of a sampler is the fastest variant whose quality intervals (open-ended exact perplexity,
in-support %, summarisation ROUGE-L: 95 % bootstrap intervals over prompts) all overlap those of the sampler's exact
fp32 variant; the DSL model's overall recommendation is the fastest SDE variant (block or whole-response) whose
intervals overlap exact fp32 whole-response SDE's, the authors' `sde_generate` setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..eval.report import markdown_table
from ..stats import format_interval, separated
from ..utils import atomic_write_text, save_figure
from .cache_frontier import SAMPLERS, FrontierConfig, is_exact

QUALITY = (("open", "ppl", "open PPL"), ("open", "in_support", "in-support %"), ("summarize", "rougeL", "ROUGE-L"))
"""(task, metric, name) whose intervals must overlap exact fp32's for a variant to be recommendable."""


def _ci(row: dict[str, Any], task: str, key: str) -> tuple[float, float] | None:
    ci = (row.get(task) or {}).get(f"{key}_ci")
    return None if ci is None else (float(ci[0]), float(ci[1]))


def within_exact(row: dict[str, Any], exact: dict[str, Any]) -> bool:
    """True when every quality interval of `row` overlaps `exact`'s (a metric neither row has is skipped; one that
    only one of them has counts as not overlapping)."""
    for task, key, _ in QUALITY:
        a, b = _ci(row, task, key), _ci(exact, task, key)
        if a is None and b is None:
            continue
        if a is None or b is None or separated(a, b):
            return False
    return True


def recommend(rows: Sequence[dict[str, Any]], exact: dict[str, Any]) -> dict[str, Any]:
    """The fastest of `rows` (median seconds per sample) whose quality intervals overlap `exact`'s; `exact` itself
    when none is faster."""
    ok = [r for r in rows if within_exact(r, exact)]
    return min([exact, *ok], key=lambda r: r["seconds_per_sample"])


def recommendations(rows: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(scope, recommended row, exact fp32 reference row): one per sampler measured, then 'DSL model (any SDE)'
    against exact fp32 whole-response SDE when that was measured."""
    out = []
    for s in SAMPLERS:
        mine = [r for r in rows if r["sampler"] == s]
        exact = next((r for r in mine if is_exact(r)), None)
        if exact is not None:
            out.append((s, recommend(mine, exact), exact))
    whole = next((r for r in rows if r["sampler"] == "SDE" and is_exact(r)), None)
    if whole is not None:
        sde = [r for r in rows if r["sampler"] in ("SDE", "Block SDE")]
        out.append(("DSL model (any SDE)", recommend(sde, whole), whole))
    return out


def recommendation_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per recommendation: the point, its samples per second and its speed-up over the exact
    reference."""
    lines = []
    for scope, best, exact in recommendations(rows):
        speedup = exact["seconds_per_sample"] / best["seconds_per_sample"]
        lines.append(f"{scope}: recommended {best['sampler']} [{best['label']}] at {1 / best['seconds_per_sample']:.1f}"
                     f" samples/s, {speedup:.2f}x exact fp32 {exact['sampler']} ({1 / exact['seconds_per_sample']:.1f}"
                     f" samples/s); quality intervals overlap exact's")
    return lines


COLUMNS = [("sampler", "Sampler", ""), ("label", "Variant", ""), ("rate", "samples/s (range)", ""),
           ("speedup", "speed-up", ".2f"), ("same_tokens", "same tokens %", ".1f"), ("ppl", "open PPL (exact) [95 %]", ""),
           ("in_support", "in-support % [95 %]", ""), ("rougeL", "sum. ROUGE-L [95 %]", ""), ("ok", "within exact", "")]


def _table_row(r: dict[str, Any], exact: dict[str, Any] | None) -> dict[str, Any]:
    o, s = r.get("open") or {}, r.get("summarize") or {}
    sec = r.get("seconds_per_sample")
    rate = "–" if sec is None else f"{1 / sec:.1f} ({1 / r['seconds_max']:.1f}–{1 / r['seconds_min']:.1f})"
    return {"sampler": r["sampler"], "label": r["label"], "rate": rate, "speedup": r.get("speedup"),
            "same_tokens": r.get("same_tokens"), "ppl": format_interval(o.get("ppl"), o.get("ppl_ci"), ".2f"),
            "in_support": format_interval(o.get("in_support"), o.get("in_support_ci"), ".0f"),
            "rougeL": format_interval(s.get("rougeL"), s.get("rougeL_ci"), ".1f"),
            "ok": "–" if exact is None else ("yes" if within_exact(r, exact) else "no")}


def render_frontier(rows: Sequence[dict[str, Any]], fc: FrontierConfig, reference: dict[str, Any]) -> str:
    exact = {r["sampler"]: r for r in rows if is_exact(r)}
    table = [_table_row(r, exact.get(r["sampler"])) for r in rows]
    table.append(_table_row({"sampler": "World (true samples)", "label": "–", **reference}, None))
    n = rows[0]["n"] if rows else 0
    intro = (f"Speed options on the toy world, alone and combined: {n} held-out prompts ({fc.n_open} open-ended, "
             f"{fc.n_summarize} summarisation); Block SDE NFE {fc.sde_nfe} per block over {fc.blocks} blocks and "
             f"whole-response SDE NFE {fc.sde_nfe} (DSL model), block remasking {fc.remask_steps} steps with EOS banned "
             f"(pretrained MDM); batch {fc.batch_size}; samples per second from the median over {fc.rounds} "
             f"interleaved round(s) (range in brackets). Cache: R = a full forward every R model calls of a block "
             f"('never' = only at the block's first call), 'dual' recomputes the current block only, 'prefix' the "
             f"block and everything after it. bf16 = backbone in bf16 (converter softmax, posterior and SDE state "
             f"fp32); sparse TOL = sparse converter at that tolerance. Speed-up and same tokens are against the "
             f"sampler's exact fp32 row; 'within exact' = every 95 % interval overlaps that row's.\n\n")
    recs = "".join(f"- {line}\n" for line in recommendation_lines(rows))
    return intro + markdown_table(table, COLUMNS) + ("\nRecommended points:\n\n" + recs if recs else "")


def plot_frontier(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """One row of panels per sampler: exact PPL (log), in-support % and ROUGE-L (95 % intervals) against samples
    per second (log; range over rounds); colour = dtype, marker = converter, the exact fp32 interval shaded, the
    recommended point starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samplers = [s for s in SAMPLERS if any(r["sampler"] == s for r in rows)]
    fig, axes = plt.subplots(len(samplers), len(QUALITY), figsize=(4.2 * len(QUALITY), 3.2 * len(samplers)),
                             squeeze=False)
    colors = {"float32": "tab:blue", "bfloat16": "tab:red"}
    best = {scope: r for scope, r, _ in recommendations(rows)}
    for i, sampler in enumerate(samplers):
        mine = [r for r in rows if r["sampler"] == sampler]
        exact = next((r for r in mine if is_exact(r)), None)
        for j, (task, key, title) in enumerate(QUALITY):
            ax = axes[i][j]
            ref = None if exact is None else _ci(exact, task, key)
            if ref is not None:
                ax.axhspan(ref[0], ref[1], color="0.85", zorder=0, label="exact fp32 95 %")
            for r in mine:
                y, ci = (r.get(task) or {}).get(key), _ci(r, task, key)
                if y is None:
                    continue
                x = 1 / r["seconds_per_sample"]
                xerr = [[x - 1 / r["seconds_max"]], [1 / r["seconds_min"] - x]]
                yerr = None if ci is None else [[max(y - ci[0], 0.0)], [max(ci[1] - y, 0.0)]]
                marker = "^" if r.get("tolerance") else "o"
                ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt=marker, color=colors.get(str(r.get("dtype")), "k"),
                            ms=5, capsize=2, lw=0.8, mfc="none" if r["mode"] != "off" else None)
                if r is best.get(sampler):
                    ax.plot([x], [y], "*", ms=16, mfc="none", mec="k", mew=1.2, label="recommended")
                tag = "" if r["mode"] == "off" else ("∞" if r["refresh"] == 0 else str(r["refresh"]))
                if tag:
                    ax.annotate(tag, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
            if key == "ppl":
                ax.set_yscale("log")
            ax.set_xscale("log")
            ax.set_title(f"{sampler}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(samplers) - 1:
                ax.set_xlabel("samples per second")
        handles = [plt.Line2D([], [], ls="", marker="o", color=colors["float32"], label="fp32"),
                   plt.Line2D([], [], ls="", marker="o", color=colors["bfloat16"], label="bf16"),
                   plt.Line2D([], [], ls="", marker="^", color="0.3", label="sparse converter"),
                   plt.Line2D([], [], ls="", marker="o", mfc="none", color="0.3", label="KV cache (R beside)"),
                   plt.Line2D([], [], ls="", marker="*", ms=12, mfc="none", mec="k", label="recommended")]
        axes[i][0].legend(handles=handles, fontsize=6, frameon=False)
    fig.suptitle("Toy world: speed options, quality (95 % intervals) vs samples per second; shaded = exact fp32",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def write_frontier(rows: Sequence[dict[str, Any]], fc: FrontierConfig, reference: dict[str, Any], out: Path) -> None:
    """OUT/frontier.md (the table and the recommended points) and OUT/frontier.png."""
    out = Path(out)
    atomic_write_text(out / "frontier.md", render_frontier(rows, fc, reference))
    plot_frontier(rows, out / "frontier.png")
