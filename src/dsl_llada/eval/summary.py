"""`dsl-llada eval report RUN_DIR`: summary.json, summary.md (paper table layouts: methods x NFE with sample and
valid counts) and PNG figures, from a run's merged records. Every artifact carries the full config and the
package version."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .. import __version__
from ..runtime.environment import environment_footer
from ..artifacts.atomic import atomic_write_text
from . import shards as R
from .eval_config import EvalConfig
from .report import seed_spread_markdown
from .tasks import SummaryContext, get_task


def load_run(run_dir: str | Path) -> tuple[EvalConfig, dict[str, Any], list[dict[str, Any]]]:
    """(config, marker, merged records) of a run folder."""
    run_dir = Path(run_dir)
    marker = run_dir / R.MARKER
    if not marker.exists():
        raise FileNotFoundError(f"{marker} does not exist: {str(run_dir)!r} is not a `dsl-llada eval run` folder")
    advice = ("restore it from a copy, or run the evaluation again into this folder with `eval run --new-run` (the "
              "old records are moved aside)")
    try:
        meta = json.loads(marker.read_bytes())
    except ValueError as e:  # JSON syntax, or bytes that are not text
        raise ValueError(f"{str(marker)!r} is damaged: not valid JSON ({e}); {advice}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{str(marker)!r} is damaged: it holds no 'config' object; {advice}")
    try:
        cfg = EvalConfig.from_dict(meta["config"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{str(marker)!r} is damaged: its config is not valid ({e}); {advice}") from None
    return cfg, meta, R.read_records(run_dir)


def error_stats(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: items, errored items, their share, and the most common error message (first 160 characters)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        st = out.setdefault(r["task"], {"n": 0, "errors": 0, "_msgs": Counter()})
        st["n"] += 1
        if r.get("error"):
            st["errors"] += 1
            st["_msgs"][str(r["error"])[:160]] += 1
    for st in out.values():
        msgs = st.pop("_msgs")
        st["rate"] = st["errors"] / st["n"] if st["n"] else 0.0
        top = msgs.most_common(1)
        st["most_common"], st["most_common_count"] = (top[0] if top else (None, 0))
    return out


def write_report(run_dir: str | Path, *, mode: str | None = None) -> dict[str, Any]:
    """Summarise every task of the run; returns the summary dict (also written to summary.json)."""
    run_dir = Path(run_dir)
    cfg, meta, records = load_run(run_dir)
    mode = mode or cfg.scoring_mode
    figures_dir = run_dir / "figures"
    figures_dir.mkdir(exist_ok=True)
    stats = error_stats(records)
    summary: dict[str, Any] = {"version": __version__, "run_version": meta.get("version"), "scoring_mode": mode,
                               "config": cfg.to_dict(), "n_records": len(records),
                               "n_errors": sum(r.get("error") is not None for r in records), "errors_by_task": stats,
                               "tasks": {}}
    md = [f"# Evaluation report: {run_dir.name}", "",
          f"dsl-llada {__version__} (run written by {meta.get('version')}); scoring mode `{mode}`; "
          f"{len(records)} records, {summary['n_errors']} with errors.", "",
          "| task | items | errored | errored % | most common error |", "|---|---|---|---|---|"]
    for t, st in stats.items():
        common = "–" if not st["errors"] else f"{st['most_common'].replace('|', '/')} (×{st['most_common_count']})"
        md.append(f"| {t} | {st['n']} | {st['errors']} | {100 * st['rate']:.1f} | {common} |")
    md.append("")
    for tspec in cfg.tasks:
        recs = [r for r in records if r["task"] == tspec.name]
        if not recs:
            continue
        task = get_task(tspec.name)
        res = task.summarize(recs, SummaryContext(cfg, tspec, run_dir, mode, figures_dir))
        summary["tasks"][tspec.name] = {"rows": res.rows, "figures": res.figures, "n_items": stats[tspec.name]["n"],
                                        "n_errors": stats[tspec.name]["errors"], **res.extra}
        md += [f"## {tspec.name}", "", res.markdown, "", *seed_spread_markdown(res.rows, getattr(task, "seed_metrics", {}))]
        md += [f"![{f}]({f})" for f in res.figures] + [""]
    errors = [r for r in records if r.get("error")]
    if errors:
        md += ["## Errors", "", "| item | error |", "|---|---|"]
        md += [f"| {r['key']} | {r['error'][:200].replace('|', '/')} |" for r in errors[:50]]
        md += [f"| … | {len(errors) - 50} more |"] if len(errors) > 50 else []
        md.append("")
    md += ["## Config", "", "```json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True), "```", ""]
    environments = R.read_environments(run_dir)
    summary["environments"] = environments
    md += ["---", "", environment_footer(environments[-1] if environments else None)
           + (f" ({len(environments)} runs/resumes; all in environment.jsonl)" if len(environments) > 1 else ""), ""]
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    atomic_write_text(run_dir / "summary.md", "\n".join(md))
    _stamp_figures(run_dir, summary)
    return summary


def _stamp_figures(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write the config + version into every PNG's metadata (tEXt chunk 'dsl-llada'), atomically."""
    from PIL import Image, PngImagePlugin

    text = json.dumps({"version": summary["version"], "config": summary["config"]}, sort_keys=True)
    for t in summary["tasks"].values():
        for f in t.get("figures", []):
            p = run_dir / f
            img = Image.open(p)
            img.load()
            info = PngImagePlugin.PngInfo()
            info.add_text("dsl-llada", text)
            tmp = p.with_name(f".{p.name}.tmp.png")
            img.save(tmp, pnginfo=info)
            tmp.replace(p)
