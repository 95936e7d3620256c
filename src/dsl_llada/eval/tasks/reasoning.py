"""GSM8K and MATH with the paper's prompts (official-impl §5.8) and answer scoring in both modes.

Per item the record holds the extracted answer and whether it is correct in the default mode and in the
authors' mode (so one run reports both); the summary's accuracy uses the run's `scoring_mode`.
"""

from __future__ import annotations

from typing import Any

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

KINDS = {"gsm8k": ("gsm8k", "gsm"), "math": ("math",)}
TEMPLATES = {
    "gsm8k": "Solve the following math problem step by step. Show your work and put your final answer after ####."
             "\n\nQuestion: {text}\n\nAnswer:",
    "math": "Solve the following math problem. Show your work and put your final answer in \\boxed{}."
            "\n\nProblem: {text}\n\nSolution:",
}


class ReasoningTask(SamplingTask):
    name = "reasoning"
    seed_metrics = {"acc": ".1f"}

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        kind = infer_kind(ds, KINDS, self.name)
        rows = read_rows(ds.path)
        qf = pick_field(ds, "question", ("question", "problem"), rows)
        gold_candidates = ("gold_answer", "answer") if kind == "gsm8k" else ("gold_answer", "answer", "solution")
        gf = pick_field(ds, "gold", gold_candidates, rows)
        idf = pick_field(ds, "id", ("id", "unique_id", "original_idx"), rows, required=False)
        template = ds.template or TEMPLATES[kind]
        out = []
        for i, row in sliced(ds, rows):
            q, gold = row.get(qf), row.get(gf)
            if not isinstance(q, str) or not q.strip() or gold is None or str(gold).strip() == "":
                continue
            gold = gold_authors = str(gold)
            if kind == "math" and gf == "solution":  # each mode extracts the gold its own way
                from ..answers import extract_math_gold

                gold = extract_math_gold(gold_authors) or ""
                gold_authors = extract_math_gold(gold_authors, "authors")
            elif kind == "gsm8k" and gf != "gold_answer":  # a solution ending in '#### N' (the official field)
                from ..answers import gsm8k_gold

                gold_authors = gsm8k_gold(gold_authors, "authors")
            out.append(Sample(row_id(ds, row, i, idf), i, template.replace("{text}", q), True,
                              {"gold": gold, "gold_authors": gold_authors, "kind": kind}))
        return check_usable(ds, out, len(rows), f"rows need a non-empty {qf!r} and {gf!r}")

    def gen_length(self, ds: DatasetSpec) -> int:
        return ds.gen_length or 256

    def item_metrics(self, info: dict[str, Any], text: str, mode: str) -> dict[str, Any]:
        from .. import answers

        gold_a = info.get("gold_authors", info["gold"])
        if info["kind"] == "gsm8k":
            return {"pred": answers.extract_gsm8k(text, "default"), "pred_authors": answers.extract_gsm8k(text, "authors"),
                    "correct": answers.gsm8k_correct(text, info["gold"], "default"),
                    "correct_authors": answers.gsm8k_correct(text, gold_a, "authors")}
        return {"pred": answers.extract_math(text, "default"), "pred_authors": answers.extract_math(text, "authors"),
                "correct": answers.math_correct(text, info["gold"], "default"),
                "correct_authors": answers.math_correct(text, gold_a, "authors")}

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        rows = []
        for (ds, method, nfe), recs in group_records(records).items():
            row = base_row(ds, method, nfe, recs)
            n = len(recs)
            m = [r.get("metrics") or {} for r in recs]
            # an errored item counts as wrong (it stays in the denominator)
            row["acc_default"] = 100.0 * sum(bool(x.get("correct")) for x in m) / n
            row["acc_authors"] = 100.0 * sum(bool(x.get("correct_authors")) for x in m) / n
            row["acc"] = row["acc_authors"] if ctx.mode == "authors" else row["acc_default"]
            for key, field in (("acc_default", "correct"), ("acc_authors", "correct_authors")):  # 95 % bootstrap
                row[f"{key}_ci"] = bootstrap_ratio([100.0 * bool(x.get(field)) for x in m])
            row["acc_ci"] = row["acc_authors_ci"] if ctx.mode == "authors" else row["acc_default_ci"]
            row["answered"] = sum(1 for x in m if x.get("pred"))
            acc_field = "correct_authors" if ctx.mode == "authors" else "correct"
            row.update(seed_values(recs, lambda rs: {"acc": 100.0 * sum(bool((r.get("metrics") or {}).get(acc_field))
                                                                        for r in rs) / len(rs)}))
            rows.append(row)
        md = []
        for ds in dict.fromkeys(r["dataset"] for r in rows):
            sub = [r for r in rows if r["dataset"] == ds]
            md += [f"### {ds}: accuracy % ({ctx.mode} scoring)", "", pivot(sub, "acc", spec=".1f"), "",
                   f"other mode ({'default' if ctx.mode == 'authors' else 'authors'}):", "",
                   pivot(sub, "acc_default" if ctx.mode == "authors" else "acc_authors", spec=".1f"), "",
                   "samples / valid outputs / with an extracted answer:", "",
                   _counts(sub), ""]
        return TaskSummary(rows=rows, markdown="\n".join(md))


def _counts(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | NFE | n | valid | answered | errors |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['nfe']} | {r['n']} | {r['valid']} | {r.get('answered', '–')} | {r['errors']} |"
              for r in rows]
    return "\n".join(lines)
