"""The frontier's report: the table, the recommended points, the sampler to pick per quality level and the
quality-vs-samples-per-second plot.

A point is *within* a reference when every quality interval (open-ended exact perplexity, in-support %, premature
EOS %, summarisation ROUGE-L: 95 % bootstrap intervals over prompts) overlaps the reference's. Recommended points:
- per sampler: the fastest of its rows within its exact fp32 row at the default step count (threshold decoding and
  ReMDM: within exact fixed-step block remasking);
- per model family: the fastest row of any of the family's samplers within the family's exact reference, its most
  expensive exact fp32 setting (whole-response SDE at the largest NFE measured; block remasking at the most steps);
- threshold decoding against fixed-step remasking at equal exact quality: the fastest of each within the
  remasking family's reference.
Per quality level (the share of open-ended answers that are complete and inside the world's support; summarisation
ROUGE-L): the fastest row of the trained models that reaches it. Oracle rows are the ceiling: quality only, never recommended.

Everything here reads JSON values only and imports no torch: `render_run` gives frontier.md from a run's
runs.jsonl and config.json alone (docs/benchmarks/toy-frontier.md renders its block with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..eval.report import markdown_table
from ..stats import format_interval, separated
from ..artifacts.atomic import atomic_write_text
from ..artifacts.figures import save_figure
from .frontier_points import FAMILIES, REFERENCE_OF, SAMPLERS, frontier_rows, is_exact, is_reference

QUALITY = (("open", "ppl", "open PPL"), ("open", "in_support", "in-support %"),
           ("open", "premature_eos%", "premature EOS %"), ("summarize", "rougeL", "ROUGE-L"))
"""(task, metric, name) whose intervals must overlap a reference's for a row to be within it."""


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


def recommend(rows: Sequence[dict[str, Any]], exact: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest of `rows` (median seconds per sample) whose quality intervals overlap `exact`'s (None when none
    does; a reference among `rows` is within itself)."""
    ok = [r for r in rows if within_exact(r, exact)]
    return min(ok, key=lambda r: r["seconds_per_sample"]) if ok else None


def _trained(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not r.get("oracle")]


FAMILY_REFERENCE = {"DSL model (any SDE)": ("SDE", "Block SDE"), "Masked DLM (any remasking)": ("Block remasking",)}
"""Where a family's exact reference comes from: the first of these samplers that has exact rows."""


def family_reference(rows: Sequence[dict[str, Any]], candidates: Sequence[str]) -> dict[str, Any] | None:
    """The exact reference among `candidates` (the first sampler with exact fixed-step rows): its most expensive
    exact fp32 row, at the largest NFE / step count measured."""
    for s in candidates:
        exact = [r for r in _trained(rows) if r["sampler"] == s and is_exact(r) and r.get("threshold") is None]
        if exact:
            return max(exact, key=lambda r: r.get("budget") or 0)
    return None


def recommendations(rows: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(scope, recommended row, reference row): one per sampler measured (a sampler measured against another's
    reference only when one of its own rows is within it), then one per model family."""
    out = []
    trained = _trained(rows)
    refs = {r["sampler"]: r for r in trained if is_reference(r)}
    for s in SAMPLERS:
        ref = refs.get(REFERENCE_OF.get(s, s))
        best = None if ref is None else recommend([r for r in trained if r["sampler"] == s], ref)
        if ref is not None and best is not None:
            out.append((s, best, ref))
    for family, samplers in FAMILIES.items():
        ref = family_reference(rows, FAMILY_REFERENCE[family])
        best = None if ref is None else recommend([r for r in trained if r["sampler"] in samplers], ref)
        if ref is not None and best is not None:
            out.append((family, best, ref))
    return out


def _rate(r: dict[str, Any], key: str = "seconds_per_sample") -> str:
    return "–" if r.get(key) is None else f"{1 / r[key]:.1f}"


def recommendation_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per recommendation: the point, its samples per second and its speed-up over the reference."""
    lines = []
    for scope, best, ref in recommendations(rows):
        speedup = ref["seconds_per_sample"] / best["seconds_per_sample"]
        lines.append(f"{scope}: recommended {best['sampler']} [{best['label']}] at {_rate(best)} samples/s, "
                     f"{speedup:.2f}x exact fp32 {ref['sampler']} [{ref['label']}] ({_rate(ref)} samples/s); quality "
                     f"intervals overlap the reference's")
    return lines


def _fastest(rows: Sequence[dict[str, Any]], key: str) -> dict[str, Any] | None:
    timed = [r for r in rows if r.get(key)]
    return min(timed, key=lambda r: r[key]) if timed else None


def threshold_line(rows: Sequence[dict[str, Any]]) -> str | None:
    """Threshold decoding against fixed-step remasking at equal exact quality: among the rows within exact block
    remasking's reference, the fastest of each kind, with the same speed options (both exact fp32, no cache) and
    with any; at the quality batch and at batch 1 (None without a threshold row and a fixed-step row within)."""
    ref = family_reference(rows, ("Block remasking",))
    if ref is None:
        return None
    within = [r for r in _trained(rows) if within_exact(r, ref)]
    thr = [r for r in within if r["sampler"] == "Threshold remasking"]
    fixed = [r for r in within if r["sampler"] == "Block remasking"]
    parts = []
    for scope, keep in (("both exact fp32 without a cache", is_exact), ("any speed options", lambda r: True)):
        for key, name in (("seconds_per_sample", "quality batch"), ("seconds_per_sample_b1", "batch 1")):
            bt = _fastest([r for r in thr if keep(r)], key)
            bf = _fastest([r for r in fixed if keep(r)], key)
            if bt is not None and bf is not None:
                parts.append(f"{scope}, {name}: [{bt['label']}] {_rate(bt, key)} samples/s against fixed-step "
                             f"[{bf['label']}] {_rate(bf, key)}, **{bf[key] / bt[key]:.2f}x**")
    if not parts:
        return None
    best = min(thr, key=lambda r: r["seconds_per_sample"])
    passes = f"; {best['forward_passes']:.1f} forward passes per response at [{best['label']}] against " \
             f"{ref['budget']}" if best.get("forward_passes") is not None else ""
    return ("Threshold decoding at equal exact quality (within exact block remasking at "
            f"{ref['budget']} steps): " + "; ".join(parts) + passes)


LEVEL_METRICS = (("open", "complete", "complete & in-support open-ended answers %", (90.0, 75.0, 50.0, 25.0)),
                 ("summarize", "rougeL", "summarisation ROUGE-L", (90.0, 75.0, 60.0, 50.0)))
"""(task, metric, name, levels) of the per-level picks: higher is better for both."""


def level_rows(rows: Sequence[dict[str, Any]], task: str = "open", key: str = "complete",
               levels: Sequence[float] = LEVEL_METRICS[0][3]) -> list[dict[str, Any]]:
    """Per quality level: the fastest trained row (quality batch, and batch 1 when timed) whose `task` `key` reaches
    it."""
    out = []
    for level in levels:
        ok = [r for r in _trained(rows) if ((r.get(task) or {}).get(key) or 0.0) >= level]
        out.append({"level": level, "b8": _fastest(ok, "seconds_per_sample"),
                    "b1": _fastest(ok, "seconds_per_sample_b1")})
    return out


def _pick(r: dict[str, Any] | None, key: str) -> str:
    if r is None:
        return "none reaches it"
    o, s = r.get("open") or {}, r.get("summarize") or {}
    return (f"{r['sampler']} [{r['label']}]: {_rate(r, key)}/s; complete "
            f"{format_interval(o.get('complete'), o.get('complete_ci'), '.0f')} %, PPL {o.get('ppl', float('nan')):.2f}, "
            f"ROUGE-L {format_interval(s.get('rougeL'), s.get('rougeL_ci'), '.1f')}")


def level_table(rows: Sequence[dict[str, Any]], settings: Mapping[str, Any] | None = None) -> str:
    """Per quality level (`LEVEL_METRICS`): the fastest trained row that reaches it, at the quality batch of
    `settings` (the run's `FrontierConfig.to_dict()`) and at batch 1."""
    batch = f"batch {settings['batch_size']}" if settings is not None else "the quality batch"
    lines = []
    for task, key, name, levels in LEVEL_METRICS:
        lines += [f"| {name} | fastest at {batch} | fastest at batch 1 |", "|---|---|---|"]
        for e in level_rows(rows, task, key, levels):
            lines.append(f"| >= {e['level']:.0f} | {_pick(e['b8'], 'seconds_per_sample')} | "
                         f"{_pick(e['b1'], 'seconds_per_sample_b1')} |")
        lines.append("")
    return "\n".join(lines)


COLUMNS = [("sampler", "Sampler", ""), ("label", "Variant", ""), ("rate", "samples/s (range)", ""),
           ("rate_b1", "samples/s, batch 1", ""), ("passes", "passes", ".1f"), ("speedup", "speed-up", ".2f"),
           ("same_tokens", "same tokens %", ".1f"), ("ppl", "open PPL (exact) [95 %]", ""),
           ("in_support", "in-support % [95 %]", ""), ("eos", "premature EOS % [95 %]", ""),
           ("complete", "complete & in-support % [95 %]", ""), ("rougeL", "sum. ROUGE-L [95 %]", ""),
           ("ok", "within reference", "")]


def _table_row(r: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any]:
    o, s = r.get("open") or {}, r.get("summarize") or {}

    def rate(suffix: str) -> str:
        sec = r.get(f"seconds_per_sample{suffix}")
        if sec is None or r.get("oracle"):
            return "–"
        return f"{1 / sec:.1f} ({1 / r[f'seconds_max{suffix}']:.1f}–{1 / r[f'seconds_min{suffix}']:.1f})"

    return {"sampler": r["sampler"], "label": r["label"], "rate": rate(""), "rate_b1": rate("_b1"),
            "passes": r.get("forward_passes"), "speedup": r.get("speedup"), "same_tokens": r.get("same_tokens"),
            "ppl": format_interval(o.get("ppl"), o.get("ppl_ci"), ".2f"),
            "in_support": format_interval(o.get("in_support"), o.get("in_support_ci"), ".0f"),
            "eos": format_interval(o.get("premature_eos%"), o.get("premature_eos%_ci"), ".0f"),
            "complete": format_interval(o.get("complete"), o.get("complete_ci"), ".0f"),
            "rougeL": format_interval(s.get("rougeL"), s.get("rougeL_ci"), ".1f"),
            "ok": "–" if ref is None else ("yes" if within_exact(r, ref) else "no")}


def render_frontier(rows: Sequence[dict[str, Any]], settings: Mapping[str, Any], reference: dict[str, Any]) -> str:
    """The report's Markdown: what was measured (from `settings`, the run's `FrontierConfig.to_dict()`), the table
    (one line per row, then `reference`: the world's own samples on the same prompts), the recommended points and
    the per-level picks. Reads JSON values only, so a run's files (`render_run`) give the same text."""
    refs = {r["sampler"]: r for r in _trained(rows) if is_reference(r)}
    table = [_table_row(r, None if r.get("oracle") else refs.get(REFERENCE_OF.get(r["sampler"], r["sampler"])))
             for r in rows]
    table.append(_table_row({"sampler": "World (true samples)", "label": "–", **reference}, None))
    n = rows[0]["n"] if rows else 0
    b1 = f" and at batch 1 on the first {settings['batch1_prompts']} prompts" if settings['batch1_prompts'] else ""
    intro = (f"Every sampler on the toy world: {n} held-out prompts ({settings['n_open']} open-ended, {settings['n_summarize']} "
             f"summarisation); DSL model: Block SDE over {settings['blocks']} blocks (NFE per block) and whole-response SDE; "
             f"pretrained MDM: block remasking over {settings['blocks']} blocks with EOS banned, fixed-step (default "
             f"{settings['remask_steps']} steps), with confidence threshold tau (at most one step per token) and ReMDM; "
             f"Oracle rows: the same samplers on the exact denoisers (the ceiling; their time is not a speed figure). "
             f"Samples per second at batch {settings['batch_size']}{b1}, median over {settings['rounds']} interleaved round(s) (range "
             f"in brackets); passes = backbone forward passes of the call that made a response (mean; at batch "
             f"{settings['batch_size']}, a threshold-decoded batch runs each block until its slowest row is done). Cache: R "
             f"= a full forward every R model calls of a block ('never' = only at the block's first call), 'dual' "
             f"recomputes the current block only, 'prefix' the block and everything after it. bf16 = backbone in bf16 "
             f"(converter softmax, posterior and SDE state fp32); sparse TOL = sparse converter at that tolerance. "
             f"'complete & in-support' = open-ended answers inside the world's support and not cut short. Speed-up "
             f"and same tokens are against the reference: the sampler's exact fp32 row at its default step count "
             f"(threshold and ReMDM: exact block remasking); 'within reference' = every 95 % interval overlaps "
             f"that row's.\n\n")
    loads = [x for r in rows for x in r.get("loads", [])]
    threads = sorted({t for r in rows for t in r.get("threads", [])})
    if loads:
        intro += (f"Timed with {', '.join(map(str, threads))} thread(s); 1-minute load average at the timed runs "
                  f"{min(loads):.1f}–{max(loads):.1f} (above the thread count means other work shared the CPUs).\n\n")
    recs = "".join(f"- {line}\n" for line in recommendation_lines(rows))
    thr = threshold_line(rows)
    text = intro + markdown_table(table, COLUMNS).rstrip("\n") + "\n"  # a blank line ends the table
    if recs:
        text += "\nRecommended points:\n\n" + recs + (f"- {thr}\n" if thr else "")
    if any((r.get("open") or {}).get("complete") is not None for r in rows):
        text += ("\nWhich sampler to pick at each quality level (trained models; the fastest row that reaches it, "
                 "so rows whose speed ranges overlap are as good a pick):\n\n" + level_table(rows, settings))
    return text


def plot_frontier(rows: Sequence[dict[str, Any]], path: Path, reference: dict[str, Any] | None = None) -> Path:
    """One panel per quality metric (complete & in-support %, exact PPL (log), premature EOS %, ROUGE-L; 95 %
    intervals) against samples per second (log; range over rounds): colour = sampler, filled = exact fp32, hollow =
    an approximate option; the family recommendations starred; the oracle rows as dashed lines (the ceiling) and the
    world's own samples dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("open", "complete", "complete & in-support %"), ("open", "ppl", "open-ended exact PPL"),
              ("open", "premature_eos%", "premature EOS %"), ("summarize", "rougeL", "summarisation ROUGE-L"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
    colors = dict(zip(SAMPLERS, ("tab:blue", "tab:cyan", "tab:red", "tab:orange", "tab:purple")))
    starred = {id(r) for scope, r, _ in recommendations(rows) if scope in FAMILIES}
    trained = _trained(rows)
    for ax, (task, key, title) in zip(axes.flat, panels):
        for r in trained:
            y, ci = (r.get(task) or {}).get(key), _ci(r, task, key)
            if y is None:
                continue
            x = 1 / r["seconds_per_sample"]
            xerr = [[x - 1 / r["seconds_max"]], [1 / r["seconds_min"] - x]]
            yerr = None if ci is None else [[max(y - ci[0], 0.0)], [max(ci[1] - y, 0.0)]]
            c = colors.get(r["sampler"], "k")
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="o", color=c, ms=5, capsize=2, lw=0.7,
                        mfc=c if is_exact(r) else "none")
            if id(r) in starred:
                ax.plot([x], [y], "*", ms=16, mfc="none", mec="k", mew=1.2)
        for r in rows:
            y = (r.get(task) or {}).get(key)
            if r.get("oracle") and y is not None:
                ax.axhline(y, ls="--", lw=0.8, color=colors.get(r["sampler"].removeprefix("Oracle "), "k"), alpha=0.6)
        world = ((reference or {}).get(task) or {}).get(key)
        if world is not None:
            ax.axhline(world, ls=":", lw=1.2, color="k")
        if key == "ppl":
            ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("samples per second (batch of the table)", fontsize=8)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=s) for s, c in colors.items()
               if any(r["sampler"] == s for r in trained)]
    handles += [plt.Line2D([], [], ls="", marker="o", mfc="none", color="0.3", label="approximate (cache/bf16/sparse)"),
                plt.Line2D([], [], ls="", marker="*", ms=12, mfc="none", mec="k", label="family's recommended point"),
                plt.Line2D([], [], ls="--", color="0.3", label="oracle (exact denoiser)"),
                plt.Line2D([], [], ls=":", color="k", label="world's own samples")]
    axes[0][0].legend(handles=handles, fontsize=6, frameon=False)
    fig.suptitle("Toy world: exact quality (95 % intervals) against samples per second, every sampler", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def render_run(runs: Sequence[dict[str, Any]], config: Mapping[str, Any]) -> str:
    """`render_frontier` from a run's files alone: its runs.jsonl lines and its config.json (`keys`: the variants in
    table order, `frontier`: the settings, `reference`: the world's own samples), exactly the demo's frontier.md."""
    return render_frontier(frontier_rows(runs, config["keys"]), config["frontier"], config["reference"])


def write_frontier(rows: Sequence[dict[str, Any]], settings: Mapping[str, Any], reference: dict[str, Any],
                   out: Path) -> None:
    """OUT/frontier.md (the table, the recommended points, the per-level picks) and OUT/frontier.png."""
    out = Path(out)
    atomic_write_text(out / "frontier.md", render_frontier(rows, settings, reference))
    plot_frontier(rows, out / "frontier.png", reference)
