"""Open-ended generation (docs/provenance.md §5.4): prompts (chat template; prompts_200, long-form = first 100 at gen
512/1024 via `limit`/`gen_length`) and WikiText prefix continuation (raw prefix, no template).

Per item: words, per-text Rep, failure tags. Per (dataset, method, NFE): GenPPL from a local causal LM (each text
cut to its first 128 whitespace words re-joined with single spaces; perplexities cached by text hash, so a text is
scored once across methods and report runs), corpus-level D2/D3 and pooled Rep, Len, tag rates; MAUVE on prefix
continuations when `mauve-text` is installed and `mauve: true`.

Task options: `scorer`: 'smollm2' (the offline SmolLM2-135M) or {path, gguf_file, batch_size, max_length, device};
absent = no GenPPL. `mauve`: bool.
"""

from __future__ import annotations

from typing import Any

from ..eval_config import DatasetSpec
from ..samples import (
    Sample,
    check_usable,
    infer_kind,
    pick_field,
    read_rows,
    row_id,
    sliced,
)
from ..report import pivot
from .task import SamplingTask, SummaryContext, TaskSummary, base_row, group_records, seed_values

KINDS = {"prefix": ("prefix", "continuation", "wikitext"), "prompts": ("prompt", "longform", "long-form", "long_form")}
PPL_WORDS = 128


def ppl_text(text: str) -> str:
    """What GenPPL scores: the first 128 whitespace words joined with single spaces."""
    return " ".join(text.split()[:PPL_WORDS])


def _texts(recs: list[dict[str, Any]]) -> list[str]:
    """The outputs of a group's records, an errored item counting as an empty output."""
    return [r.get("text", "") if r.get("error") is None else "" for r in recs]


def _seed_values(recs: list[dict[str, Any]], ppl: dict[str, tuple[float, int]] | None, mode: str) -> dict[str, float | None]:
    """The headline metrics of one seed's records, by the same aggregates as the pooled row."""
    from ..metrics import generation_metrics
    from ..scorers.genppl import gen_ppl

    texts = _texts(recs)
    g = generation_metrics(texts, mode=mode)
    out: dict[str, float | None] = {}
    if ppl is not None:
        out["genppl"] = gen_ppl([ppl[ppl_text(t)] for t in texts if t.strip()], mode=mode)
    out.update({k: None if (v := g[k]) is None else float(v) for k in ("d2", "rep", "len")})
    return out


class GenerationTask(SamplingTask):
    name = "generation"
    seed_metrics = {"genppl": ".2f", "d2": ".3f", "rep": ".3f", "len": ".1f"}

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        kind = infer_kind(ds, KINDS, self.name)
        rows = read_rows(ds.path)
        idf = pick_field(ds, "id", ("id",), rows, required=False)
        if kind == "prefix":
            pf = pick_field(ds, "prompt", ("prefix_text", "prefix"), rows)
            rf = pick_field(ds, "reference", ("reference_text", "continuation"), rows, required=False)
        else:
            pf = pick_field(ds, "prompt", ("prompt",), rows)
            rf = None
        out = []
        for i, row in sliced(ds, rows):
            p = row.get(pf)
            if not isinstance(p, str) or not p.strip():
                continue
            info: dict[str, Any] = {"kind": kind}
            if rf and isinstance(row.get(rf), str):
                info["reference"] = row[rf]
            if "category" in row:
                info["category"] = row["category"]
            out.append(Sample(row_id(ds, row, i, idf), i, p, kind == "prompts", info))
        return check_usable(ds, out, len(rows), f"rows need a non-empty {pf!r}")

    def gen_length(self, ds: DatasetSpec) -> int:
        return ds.gen_length or 256

    def check_options(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - {"scorer", "mauve"})
        if unknown:
            raise ValueError(f"generation: unknown option(s) {unknown}; valid: ['mauve', 'scorer']")
        from ..scorers.genppl import check_scorer_option

        check_scorer_option(options.get("scorer"))

    def item_metrics(self, info: dict[str, Any], text: str, mode: str) -> dict[str, Any]:
        from ..genfailures import generation_failure_tags
        from ..metrics import repetition_rate

        return {"words": len(text.split()), "rep": repetition_rate(text), "tags": generation_failure_tags(text)}

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        from ..metrics import failure_rates, generation_metrics

        ppl = _nlls(records, ctx)
        rows = []
        for (ds, method, nfe), recs in group_records(records).items():
            row = base_row(ds, method, nfe, recs)
            texts = _texts(recs)
            row.update(generation_metrics(texts, mode=ctx.mode))
            if ppl is not None:
                from ..scorers.genppl import gen_ppl

                vals = [ppl[ppl_text(t)] for t in texts if t.strip()]
                # default: token-weighted exp(total NLL / tokens); authors: exp(mean of per-text mean NLL)
                row["genppl"] = gen_ppl(vals, mode=ctx.mode)
                scored = [(s, n) for s, n in vals if n > 0]
                if scored:  # 95 % bootstrap interval over texts, the same aggregate as the value
                    import numpy as np

                    from ...stats import bootstrap_ratio

                    row["genppl_ci"] = (bootstrap_ratio([s for s, _ in scored], [n for _, n in scored], transform=np.exp)
                                        if ctx.mode != "authors" else
                                        bootstrap_ratio([s / n for s, n in scored], transform=np.exp))
                row["genppl_n"] = sum(1 for _, n in vals if n > 0)
            tags = [(r.get("metrics") or {}).get("tags") or {} for r in recs if r.get("error") is None]
            if tags:
                row.update({f"tag_{k}": v for k, v in failure_rates(tags).items() if k not in
                            ("empty", "premature_eos", "repetition", "degen_ending")})
            if ctx.task.options.get("mauve"):
                row["mauve"] = _mauve(recs)
            row.update(seed_values(recs, lambda rs: _seed_values(rs, ppl, ctx.mode)))
            rows.append(row)
        md = []
        figs = []
        for ds in dict.fromkeys(r["dataset"] for r in rows):
            sub = [r for r in rows if r["dataset"] == ds]
            md += [f"### {ds}", ""]
            if ppl is not None:
                md += ["GenPPL (lower is better):", "", pivot(sub, "genppl", spec=".2f"), ""]
            md += ["D2 (distinct bigrams, corpus level):", "", pivot(sub, "d2", spec=".3f"), "",
                   "Rep (adjacent identical words, pooled):", "", pivot(sub, "rep", spec=".3f"), "",
                   "Len (words):", "", pivot(sub, "len", spec=".1f"), "", _counts(sub), ""]
            curve = [dict(r, ppl=r.get("genppl")) for r in sub if r["nfe"] > 0]
            if curve:
                from ..report import plot_nfe_curves

                panels = ((("ppl", "GenPPL (lower is better)"),) if ppl is not None else ()) + \
                    (("d2", "D2 (higher = more diverse)"), ("rep", "Rep (lower = less repetitive)"))
                p = plot_nfe_curves(curve, ctx.figures_dir / f"generation_{ds}_nfe.png", panels=panels,
                                    title=f"{ds}: generation quality vs NFE")
                figs.append(str(p.relative_to(ctx.run_dir)))
        return TaskSummary(rows=rows, markdown="\n".join(md), figures=figs)


def _counts(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | NFE | n | valid | errors | D3 | s/sample | tokens |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d3 = "–" if r.get("d3") is None else f"{r['d3']:.3f}"
        s = "–" if r.get("seconds_per_sample") is None else f"{r['seconds_per_sample']:.3f}"
        t = "–" if r.get("gen_tokens") is None else f"{r['gen_tokens']:.1f}"
        lines.append(f"| {r['method']} | {r['nfe']} | {r['n']} | {r['valid']} | {r['errors']} | {d3} | {s} | {t} |")
    return "\n".join(lines)


def _nlls(records: list[dict[str, Any]], ctx: SummaryContext) -> dict[str, tuple[float, int]] | None:
    """ppl_text -> (NLL sum, tokens) for every non-empty output, scored once each (cached across methods and runs)."""
    opts = ctx.task.options.get("scorer")
    if not opts:
        return None
    from ..scorers.genppl import scorer_from_option

    scorer = scorer_from_option(opts, ctx.run_dir / "genppl_cache.jsonl")
    texts = list(dict.fromkeys(ppl_text(r.get("text", "")) for r in records
                               if r.get("error") is None and r.get("text", "").strip()))
    return dict(zip(texts, scorer.nll(texts))) if texts else {}


def _mauve(recs: list[dict[str, Any]]) -> float | None:
    """MAUVE of the continuations against the references (None when mauve-text is missing or < 10 texts)."""
    try:
        import mauve
    except ImportError:
        return None
    pairs = [(r["info"]["reference"], r["text"]) for r in recs
             if r.get("error") is None and r.get("text", "").strip() and (r.get("info") or {}).get("reference")]
    if len(pairs) < 10:
        return None
    out = mauve.compute_mauve(p_text=[p for p, _ in pairs], q_text=[q for _, q in pairs], max_text_length=256, verbose=False)
    return float(out.mauve)
