"""Reports: Markdown tables and the paper's NFE-curve figure, written atomically."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..stats import format_interval
from ..artifacts.figures import save_figure

Column = tuple[str, str, str]
"""(row key, header, format spec such as '.2f' or '' for str())."""


def _fmt(v: Any, spec: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and spec:
        return format(v, spec)
    return str(v)


def _cell(row: dict[str, Any], key: str, spec: str) -> str:
    """A value, with its 95 % bootstrap interval when the row carries one (`KEY_ci` = [low, high])."""
    ci = row.get(f"{key}_ci")
    if ci is not None and isinstance(row.get(key), float) and spec:
        return format_interval(row[key], tuple(ci), spec)
    return _fmt(row.get(key), spec)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """A GitHub Markdown table of `rows` restricted to `columns` (a value with a `KEY_ci` interval shows it)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(r, k, f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def pivot(rows: Sequence[dict[str, Any]], value: str, *, row_key: str = "method", col_key: str = "nfe",
          spec: str = ".2f") -> str:
    """A method x NFE table of one metric (with its 95 % bootstrap interval where a row carries `VALUE_ci`)."""
    methods = list(dict.fromkeys(r[row_key] for r in rows))
    cols = sorted({r[col_key] for r in rows})
    cell = {(r[row_key], r[col_key]): r for r in rows}
    head = f"| {row_key} | " + " | ".join(f"{col_key} {c}" for c in cols) + " |"
    sep = "|---|" + "|".join("---" for _ in cols) + "|"
    body = [f"| {m} | " + " | ".join(_cell(cell.get((m, c), {}), value, spec) for c in cols) + " |" for m in methods]
    return "\n".join([head, sep, *body])


def seed_spread_markdown(rows: Sequence[dict[str, Any]], metrics: dict[str, str]) -> list[str]:
    """Markdown lines giving, per (dataset, method, NFE) row and metric, the per-seed values and their spread
    (rows carry `seeds`, and with two or more seeds `per_seed` and `seed_spread`: `eval.tasks.task.seed_values`).
    A run with one seed gets one line saying so; rows without `seeds` (tasks without sampling seeds) get nothing."""
    seeded = [r for r in rows if r.get("seeds")]
    if not seeded:
        return []
    if not any("per_seed" in r for r in seeded):
        seeds = sorted({s for r in seeded for s in r["seeds"]})
        return [f"Spread across seeds: {len(seeds)} seed ({', '.join(map(str, seeds))}), no spread to report "
                "(list two or more `seeds` in the config).", ""]
    out = ["Spread across sampling seeds (each metric recomputed on one seed's items alone; SD over seeds, n - 1):", "",
           "| dataset | method | NFE | metric | per seed | min – max | SD |", "|---|---|---|---|---|---|---|"]
    for r in seeded:
        if "per_seed" not in r:  # a row one seed reached (a run still going, or errors)
            out.append(f"| {r['dataset']} | {r['method']} | {r['nfe']} | – | 1 seed ({r['seeds'][0]}) | – | – |")
            continue
        for key, spec in metrics.items():
            if key not in r["per_seed"]:
                continue
            per = ", ".join(f"{s}: {_fmt(v, spec)}" for s, v in zip(r["seeds"], r["per_seed"][key]))
            sp = r["seed_spread"][key]
            rng = "–" if sp["min"] is None else f"{_fmt(sp['min'], spec)} – {_fmt(sp['max'], spec)}"
            out.append(f"| {r['dataset']} | {r['method']} | {r['nfe']} | {key} | {per} | {rng} | {_fmt(sp['sd'], spec)} |")
    return out + [""]


def plot_nfe_curves(rows: Sequence[dict[str, Any]], path: str | Path,
                    panels: Sequence[tuple[str, str]] = (("ppl", "Perplexity (exact, lower is better)"),
                                                         ("rep", "Rep % (adjacent repeats)"),
                                                         ("len", "Length (words)")),
                    title: str = "") -> Path:
    """One panel per metric, metric vs NFE (log2 x-axis), one line per method; saved as PNG atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (key, label) in zip(axes, panels):
        for m in methods:
            pts = sorted((r["nfe"], r[key]) for r in rows if r["method"] == m and r.get(key) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m,
                        linewidth=2.4 if m.startswith("DSL-SDE") else 1.4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("NFE")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    if panels and panels[0][0] == "ppl":
        axes[0].set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    n_rows = -(-len(labels) // 4) if labels else 0
    fig.tight_layout(rect=(0, 0.06 * n_rows, 1, 1))
    return save_figure(fig, path)
