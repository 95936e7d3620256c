"""Zero-shot summarization (docs/provenance.md §5.5/§5.6): XSum, CNN/DM, PubMed, arXiv with the paper's prompts and
generation lengths; ROUGE-1/2/L F1 per sample (rouge-score, rougeL, stemmer, empty output = 0); failure tags;
optional BERTScore from a local encoder folder; ROUGE-1 delta buckets against a baseline method.

Task options: `baseline` (method name for the delta buckets; default: the first method whose preset is 'llada'),
`bertscore` ({model_dir, num_layers, batch_size}; off when absent).
"""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any, cast

from ...stats import bootstrap_ratio
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

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


def _rouge_rows(recs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per-item ROUGE F1 x100 of a group's records (an errored item scores 0)."""
    ms = [(r.get("metrics") or {}) if r.get("error") is None else {} for r in recs]
    return [{k: m.get(k, 0.0) for k in ROUGE_KEYS} for m in ms]

KINDS = {"xsum": ("xsum",), "cnndm": ("cnn", "dailymail", "cnndm"), "pubmed": ("pubmed",), "arxiv": ("arxiv",)}
TEMPLATES = {
    "xsum": "Summarize the following text in one sentence:\n\n{text}",
    "cnndm": "Summarize the following news article in 2-3 sentences:\n\n{text}",
    "pubmed": "Summarize the following scientific paper in a concise abstract:\n\n{text}",
    "arxiv": "Summarize the following research paper in a concise abstract:\n\n{text}",
}
GEN_LENGTH = {"xsum": 128, "cnndm": 256, "pubmed": 256, "arxiv": 256}
MAX_SOURCE_WORDS = 1500
BUCKETS = (("big win", 5.0), ("win", 1.0), ("tie", -1.0), ("loss", -5.0))


def delta_bucket(delta: float) -> str:
    """ROUGE-1 delta bucket (§5.6): >= 5 big win, >= 1 win, > -1 tie, > -5 loss, else big loss."""
    if delta >= 5:
        return "big win"
    if delta >= 1:
        return "win"
    if delta > -1:
        return "tie"
    if delta > -5:
        return "loss"
    return "big loss"


class SummarizationTask(SamplingTask):
    name = "summarization"
    seed_metrics = {"rouge1": ".2f", "rouge2": ".2f", "rougeL": ".2f"}

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        kind = infer_kind(ds, KINDS, self.name)
        rows = read_rows(ds.path)
        pf = pick_field(ds, "prompt", ("prompt",), rows, required=False)
        tf = None if pf else pick_field(ds, "text", ("document", "article", "text"), rows)
        rf = pick_field(ds, "reference", ("reference", "summary", "highlights", "abstract"), rows)
        idf = pick_field(ds, "id", ("id", "idx"), rows, required=False)
        template = ds.template or TEMPLATES[kind]
        out = []
        for i, row in sliced(ds, rows):
            ref = row.get(rf)
            if pf:
                prompt = row.get(pf)
            else:
                text = None if tf is None else row.get(tf)
                prompt = template.replace("{text}", " ".join(text.split()[:MAX_SOURCE_WORDS])
                                          if isinstance(text, str) and len(text.split()) > MAX_SOURCE_WORDS else text) \
                    if isinstance(text, str) else None
            if not isinstance(prompt, str) or not prompt.strip() or not isinstance(ref, str) or not ref.strip():
                continue
            source = prompt if pf else cast(str, text)  # the document as the row holds it (its prompt if ready)
            out.append(Sample(row_id(ds, row, i, idf), i, prompt, True,
                              {"reference": ref, "source_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest()}))
        return check_usable(ds, out, len(rows), f"rows need a non-empty {(pf or tf)!r} and {rf!r}")

    def gen_length(self, ds: DatasetSpec) -> int:
        if ds.gen_length:
            return ds.gen_length
        try:
            return GEN_LENGTH[infer_kind(ds, KINDS, self.name)]
        except ValueError:
            return 256

    def check_options(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - {"baseline", "bertscore"})
        if unknown:
            raise ValueError(f"summarization: unknown option(s) {unknown}; valid: ['baseline', 'bertscore']")
        b = options.get("bertscore")
        if b is not None:
            from ..scorers.bertscore import (
                BERTScoreError,
                _check_folder,
                local_minilm_dir,
            )

            if not isinstance(b, dict):
                raise ValueError(f"summarization option bertscore={b!r} must be {{model_dir: FOLDER|minilm, num_layers: N}}")
            folder = local_minilm_dir() if b.get("model_dir") == "minilm" else Path(str(b.get("model_dir")))
            try:
                _check_folder(folder, int(b.get("num_layers", 6)))
            except (TypeError, ValueError) as e:
                raise BERTScoreError(f"summarization bertscore: {e}") from None

    def item_metrics(self, info: dict[str, Any], text: str, mode: str) -> dict[str, Any]:
        from ..metrics import rouge_scores, summary_failure_tags

        ref = info["reference"]
        m: dict[str, Any] = dict(rouge_scores(ref, text))
        m["words"] = len(text.split())
        m["ref_words"] = len(ref.split())
        m["tags"] = summary_failure_tags(text, mode, reference=ref).as_dict()
        return m

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        from ..metrics import failure_rates, rouge_aggregate

        groups = group_records(records)
        bert = _bertscores(records, ctx.task.options.get("bertscore"), ctx)
        rows = []
        for (ds, method, nfe), recs in groups.items():
            row = base_row(ds, method, nfe, recs)
            ms = [(r.get("metrics") or {}) if r.get("error") is None else {} for r in recs]
            rouge_rows = _rouge_rows(recs)
            row.update(rouge_aggregate(rouge_rows, mode=ctx.mode))
            for k in ("rouge1", "rouge2", "rougeL"):  # 95 % bootstrap intervals over samples (same per-sample values)
                row[f"{k}_ci"] = bootstrap_ratio([round(float(r[k]), 2) if ctx.mode == "authors" else float(r[k])
                                                  for r in rouge_rows])
            words = [m.get("words", 0) for m in ms]
            row.update({"len_mean": statistics.fmean(words), "len_median": statistics.median(words),
                        "ref_len_mean": statistics.fmean([m.get("ref_words", 0) for m in ms if m] or [0])})
            tags = [m.get("tags") or {"empty": True} for m in ms]
            row.update({f"tag_{k}": v for k, v in failure_rates(tags).items()})
            if bert is not None:
                vals = [bert[r["key"]] for r in recs if r["key"] in bert]
                row["bertscore_f1"] = 100.0 * statistics.fmean(v[2] for v in vals) if vals else None
            row.update(seed_values(recs, lambda rs: dict(rouge_aggregate(_rouge_rows(rs), mode=ctx.mode))))
            rows.append(row)
        baseline = ctx.task.options.get("baseline") or next(
            (m.name for m in ctx.config.task_methods(ctx.task) if m.preset == "llada"), None)
        buckets = _delta_buckets(records, baseline, ctx.mode) if baseline else {}
        md = []
        for ds in dict.fromkeys(r["dataset"] for r in rows):
            sub = [r for r in rows if r["dataset"] == ds]
            md += [f"### {ds}: ROUGE F1 x100 ({ctx.mode} aggregate)", "", "ROUGE-1:", "", pivot(sub, "rouge1", spec=".2f"),
                   "", "ROUGE-2:", "", pivot(sub, "rouge2", spec=".2f"), "", "ROUGE-L:", "", pivot(sub, "rougeL", spec=".2f"), ""]
            if bert is not None:
                md += ["BERTScore F1 x100:", "", pivot(sub, "bertscore_f1", spec=".2f"), ""]
            md += ["failure tags (% of samples), length, counts:", "", _tag_table(sub), ""]
            if ds in buckets:
                md += [f"ROUGE-1 delta buckets vs {baseline} (% of common samples):", "", _bucket_table(buckets[ds]), ""]
        figs = []
        if rows:
            from ..report import plot_nfe_curves

            for ds in dict.fromkeys(r["dataset"] for r in rows):
                sub = [r for r in rows if r["dataset"] == ds and r["nfe"] > 0]
                if sub:
                    p = plot_nfe_curves(sub, ctx.figures_dir / f"summarization_{ds}_rouge.png",
                                        panels=(("rouge1", "ROUGE-1 F1"), ("rouge2", "ROUGE-2 F1"), ("rougeL", "ROUGE-L F1")),
                                        title=f"{ds}: ROUGE vs NFE")
                    figs.append(str(p.relative_to(ctx.run_dir)))
        return TaskSummary(rows=rows, markdown="\n".join(md), figures=figs, extra={"delta_buckets": buckets,
                                                                                     "baseline": baseline})


def _delta_buckets(records: list[dict[str, Any]], baseline: str,
                   mode: str = "default") -> dict[str, dict[str, dict[str, float]]]:
    """dataset -> 'method @ NFE' -> bucket -> % of samples (paired by sample id, seed and NFE with the baseline).
    Authors mode buckets the difference of the 2-dp rounded per-sample ROUGE-1 (their records)."""
    from ..authors import rouge1_delta

    base = {(r["dataset"], r["nfe"], r["seed"], r["sample_id"]): (r.get("metrics") or {}).get("rouge1", 0.0)
            for r in records if r["method"] == baseline}
    out: dict[str, dict[str, dict[str, float]]] = {}
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for r in records:
        if r["method"] == baseline:
            continue
        k = (r["dataset"], r["nfe"], r["seed"], r["sample_id"])
        if k not in base:
            continue
        d = rouge1_delta((r.get("metrics") or {}).get("rouge1", 0.0), base[k], mode)
        c = counts.setdefault((r["dataset"], f"{r['method']} @ {r['nfe']}"), {})
        b = delta_bucket(d)
        c[b] = c.get(b, 0) + 1
    for (ds, label), c in counts.items():
        n = sum(c.values())
        out.setdefault(ds, {})[label] = {b: 100.0 * c.get(b, 0) / n for b in
                                         ("big win", "win", "tie", "loss", "big loss")} | {"n": n}
    return out


def _bucket_table(d: dict[str, dict[str, float]]) -> str:
    cols = ("big win", "win", "tie", "loss", "big loss")
    lines = ["| method @ NFE | n | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    lines += [f"| {k} | {int(v['n'])} | " + " | ".join(f"{v[c]:.1f}" for c in cols) + " |" for k, v in d.items()]
    return "\n".join(lines)


def _tag_table(rows: list[dict[str, Any]]) -> str:
    cols = ("tag_empty", "tag_premature_eos", "tag_repetition", "tag_degen_ending")
    lines = ["| method | NFE | n | valid | errors | len mean | len median | ref len | empty % | premature % | repetition % "
             "| degen ending % |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['nfe']} | {r['n']} | {r['valid']} | {r['errors']} | {r['len_mean']:.1f} | "
                     f"{r['len_median']:.1f} | {r['ref_len_mean']:.1f} | " + " | ".join(f"{r.get(c, 0.0):.1f}" for c in cols)
                     + " |")
    return "\n".join(lines)


def _bertscores(records: list[dict[str, Any]], opts: dict[str, Any] | None, ctx: SummaryContext):
    """key -> (P, R, F1) for non-empty outputs, or None when BERTScore is not configured."""
    if not opts:
        return None
    from ..scorers.bertscore import bertscore

    todo = [r for r in records if r.get("error") is None and r.get("text", "").strip()]
    if not todo:
        return {}
    from ..scorers.bertscore import local_minilm_dir

    folder = local_minilm_dir() if opts.get("model_dir") == "minilm" else opts["model_dir"]
    scores = bertscore([r["text"] for r in todo], [r["info"]["reference"] for r in todo], model_dir=folder,
                       num_layers=int(opts.get("num_layers", 6)),
                       batch_size=int(opts.get("batch_size", 16)))
    return {r["key"]: s for r, s in zip(todo, scores)}
