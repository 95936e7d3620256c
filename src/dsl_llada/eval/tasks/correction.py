"""Error correction as a task (paper T1, docs/provenance.md §5.1), wrapping `dsl_llada.eval.fix_clean`.

Dataset kinds:
* `random` (e.g. wikitext_texts_100): random-token corruption at each rate in `rates` (default 10/30/50 %); the
  text is re-tokenised with the model's tokenizer (or, with `use_token_ids: true`, its `tokens` field is used
  as is — the paper's LLaDA ids); per-text RNG seeded seed + row number;
* `semantic` (semantic_corruption_manual) and `benchmark` (correction_benchmark_50): original/corrupted sentence
  pairs, tokenised separately and aligned (default: equal-length replacements only; authors: common prefix);
* `noisy-edit`: the typo/OCR edit generator over plain texts.

Each case is scored on every path in `paths` (default ['discrete'] = the authors' probe through wte; 'converter'
= through the DSL converter, clean or at SNR `gamma`). Items are keyed by model (one-forward task), and Fix,
Clean, overcorrect = 1 - Clean, selective = Fix - overcorrect are macro-averaged per (dataset, variant, model).

Options: rates, paths, gamma, id_range [low, high), use_token_ids, max_tokens (default 256), max_edits.
"""

from __future__ import annotations

from typing import Any

from ..eval_config import DatasetSpec, ModelSpec
from ..samples import (
    DataError,
    Sample,
    check_usable,
    infer_kind,
    pick_field,
    read_rows,
    row_id,
    sliced,
)
from ...artifacts.figures import save_figure
from .task import SummaryContext, TaskSummary, usable_paths

KINDS = {"semantic": ("semantic",), "benchmark": ("benchmark",), "noisy-edit": ("noisy", "edit"),
         "random": ("wikitext", "texts", "random")}
OPTIONS = ("rates", "paths", "gamma", "id_range", "use_token_ids", "max_tokens", "max_edits")


class CorrectionTask:
    name = "correction"
    sampling = False

    def check_options(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"correction: unknown option(s) {unknown}; valid: {list(OPTIONS)}")
        for r in options.get("rates", []):
            if not (isinstance(r, (int, float)) and 0 < r < 1):
                raise ValueError(f"correction: rate {r!r} must be a fraction in (0, 1), e.g. 0.3")
        for p in options.get("paths", []):
            if p not in ("discrete", "converter"):
                raise ValueError(f"correction: path {p!r} is not valid; expected 'discrete' or 'converter'")

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        kind = infer_kind(ds, KINDS, self.name)
        rows = read_rows(ds.path)
        idf = pick_field(ds, "id", ("id",), rows, required=False)
        out = []
        if kind in ("semantic", "benchmark"):
            of = pick_field(ds, "original", ("original_text", "original"), rows)
            cf = pick_field(ds, "corrupted", ("corrupted_text", "corrupted"), rows)
            for i, row in sliced(ds, rows):
                if isinstance(row.get(of), str) and isinstance(row.get(cf), str):
                    info: dict[str, Any] = {"kind": kind, "original": row[of], "corrupted": row[cf],
                            **{k: row[k] for k in ("category", "difficulty") if k in row}}
                    if "corruptions" in row:
                        info["corruption_type"] = ",".join(sorted({c.get("corruption_type", "") for c in row["corruptions"]}))
                    out.append(Sample(row_id(ds, row, i, idf), i, row[of], False, info))
            return check_usable(ds, out, len(rows), f"rows need string {of!r} and {cf!r}")
        tf = pick_field(ds, "text", ("text",), rows)
        use_ids = bool(options.get("use_token_ids"))
        if use_ids and kind == "random":
            pick_field(ds, "tokens", ("tokens",), rows)
        for i, row in sliced(ds, rows):
            if isinstance(row.get(tf), str) and row[tf].strip():
                info = {"kind": kind, "text": row[tf]}
                if use_ids and kind == "random":
                    info["tokens"] = row["tokens"]
                out.append(Sample(row_id(ds, row, i, idf), i, row[tf], False, info))
        return check_usable(ds, out, len(rows), f"rows need a non-empty {tf!r}")

    def variants(self, ds: DatasetSpec, options: dict[str, Any], model: ModelSpec) -> list[tuple[str, dict[str, Any]]]:
        kind = infer_kind(ds, KINDS, self.name)
        paths = usable_paths(options, model)  # 'converter' only on DSL checkpoints
        gamma = options.get("gamma")
        extra = {k: options[k] for k in ("id_range", "max_tokens", "max_edits") if k in options}
        out = []
        for path in paths:
            pl = path if path == "discrete" or gamma is None else f"converter@{gamma:g}"
            g = gamma if path == "converter" else None
            if kind == "random":
                out += [(f"rate{r:g}/{pl}", {"kind": kind, "rate": float(r), "path": path, "gamma": g, **extra})
                        for r in options.get("rates", [0.1, 0.3, 0.5])]
            else:
                out.append((pl, {"kind": kind, "path": path, "gamma": g, **extra}))
        return out

    def run_batch(self, loaded, samples: list[Sample], params: dict[str, Any], seed: int,
                  mode: str) -> list[tuple[dict[str, Any] | None, str | None]]:
        from .. import fix_clean as C

        model, tok = loaded.model, loaded.tokenizer
        kind, path, gamma = params["kind"], params["path"], params["gamma"]
        ids = [s.index for s in samples]
        if kind == "random":
            texts = [s.info.get("tokens") or s.info["text"] for s in samples]
            idr = params.get("id_range")
            recs = C.fix_clean_records(model, tok, texts, rate=params["rate"], path=path, gamma=gamma, seed=seed,
                                       batch_size=len(samples), text_ids=ids, max_tokens=params.get("max_tokens", 256),
                                       id_range=tuple(idr) if idr else None, mode=mode)
            by_id = {r["text_id"]: r for r in recs}
        elif kind == "noisy-edit":
            cases = C.noisy_edit_cases([s.info["text"] for s in samples], tok, seed=seed, text_ids=ids,
                                       max_edits=params.get("max_edits", 1))
            by_id = {r["case_id"]: r for r in C.score_cases(model, cases, path=path, gamma=gamma, seed=seed,
                                                            batch_size=len(samples), mode=mode)}
        elif kind == "benchmark" and mode == "authors":  # their realistic-correction suite: token_diff_positions
            rows = [{"id": s.index, "original": s.info["original"], "corrupted": s.info["corrupted"]} for s in samples]
            by_id = {r["case_id"]: r for r in C.realistic_records(model, tok, rows, path=path, gamma=gamma, seed=seed,
                                                                  batch_size=len(samples))}
        else:
            rows = [{"id": s.index, "original": s.info["original"], "corrupted": s.info["corrupted"]} for s in samples]
            cases, _ = C.pair_cases(rows, tok, mode=mode, meta_keys=())
            by_id = {r["case_id"]: r for r in C.score_cases(model, cases, path=path, gamma=gamma, seed=seed,
                                                            batch_size=len(samples), mode=mode)}
        out: list[tuple[dict[str, Any] | None, str | None]] = []
        for s in samples:
            r = by_id.get(s.index)
            if r is None:  # nothing to score: no editable token, or a pair that does not align position by position
                out.append(({"skipped": True}, None))
                continue
            out.append(({k: r[k] for k in ("fix", "clean", "n_tokens", "n_corrupted", "n_uncorrupted")}, None))
        return out

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        from ..fix_clean import aggregate_fix_clean

        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault((r["dataset"], r["variant"], r["method"]), []).append(r)
        rows = []
        for (ds, variant, model), recs in groups.items():
            scored = [r["metrics"] for r in recs if r.get("error") is None and r["metrics"] and not r["metrics"].get("skipped")]
            row: dict[str, Any] = {"dataset": ds, "variant": variant, "model": model, "method": model, "nfe": 0, "n": len(recs),
                   "errors": sum(r.get("error") is not None for r in recs),
                   "skipped": sum(1 for r in recs if (r.get("metrics") or {}).get("skipped")), "scored": len(scored)}
            if scored:
                agg = aggregate_fix_clean(scored)
                row.update({k: (None if agg[k] is None else 100.0 * agg[k]) for k in ("fix", "clean", "overcorrect", "selective")})
                row["n_corrupted"] = agg["n_corrupted"]
            rows.append(row)
        lines = ["| dataset | variant | model | n | scored | skipped | errors | corrupted tokens | Fix % | Clean % | "
                 "overcorrect % | selective |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def f(v: float | None) -> str:
            return "–" if v is None else f"{v:.1f}"

        for r in rows:
            lines.append(f"| {r['dataset']} | {r['variant']} | {r['model']} | {r['n']} | {r['scored']} | {r['skipped']} | "
                         f"{r['errors']} | {r.get('n_corrupted', 0)} | {f(r.get('fix'))} | {f(r.get('clean'))} | "
                         f"{f(r.get('overcorrect'))} | {f(r.get('selective'))} |")
        figs = []
        rate_rows = [r for r in rows if r["variant"].startswith("rate") and r.get("fix") is not None]
        if rate_rows:
            figs.append(_plot_fix_clean(rate_rows, ctx))
        return TaskSummary(rows=rows, markdown="Fix/Clean (macro-averaged over texts, %):\n\n" + "\n".join(lines), figures=figs)


def _plot_fix_clean(rows: list[dict[str, Any]], ctx: SummaryContext) -> str:
    """Fix and Clean vs corruption rate, one line per (model, path)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    series: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        rate, _, path = r["variant"].partition("/")
        series.setdefault(f"{r['dataset']} {r['model']} {path}", []).append((float(rate[4:]) * 100, r["fix"], r["clean"]))
    for label, pts in series.items():
        pts.sort()
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
    for ax, t in zip(axes, ("Fix % (corrupted -> original)", "Clean % (uncorrupted kept)")):
        ax.set_xlabel("corruption rate %")
        ax.set_title(t, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = ctx.figures_dir / "correction_fix_clean.png"
    save_figure(fig, path)
    return str(path.relative_to(ctx.run_dir))


__all__ = ["CorrectionTask", "DataError"]
