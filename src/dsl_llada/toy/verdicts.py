"""Which of the paper's claims the demo reproduces. Both methods of a claim sample the same held-out prompts, so a
claim is judged by a paired test: the difference (better - worse) against its distribution when the two methods'
labels are swapped at random within each prompt (`stats.paired_permutation_test`). A claim is *reproduced* at an
NFE when p < 0.05 and the difference is on the claimed side, *contradicted* when p < 0.05 on the other side, and
*inconclusive* otherwise. Perplexity is compared as the difference of NLL per token (log perplexity: the same sign
as the perplexity difference)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..stats import format_interval, paired_permutation_test, verdict_from_test
from .evaluate import clusters, metric_sums


@dataclass(frozen=True)
class Claim:
    text: str
    task: str
    metric: str
    better: str
    """The method the paper says is better."""
    worse: str
    lower_is_better: bool
    spec: str = ".1f"


CLAIMS = (
    Claim("DSL-SDE writes open-ended text with lower perplexity than LLaDA remasking", "open", "ppl", "DSL-SDE",
          "LLaDA", True, ".2f"),
    Claim("DSL-SDE ends responses prematurely less often than LLaDA remasking", "open", "premature_eos%", "DSL-SDE",
          "LLaDA", True, ".0f"),
    Claim("DSL-SDE repeats adjacent words less than LLaDA remasking", "open", "rep", "DSL-SDE", "LLaDA", True),
    Claim("DSL-SDE summarises better (ROUGE-L) than LLaDA remasking", "summarize", "rougeL", "DSL-SDE", "LLaDA", False),
)


ORACLE = "Oracle "
"""Prefix of the oracle rows (toy/evaluate.py ORACLE_METHODS): each claim is also judged between the oracle versions of
its two methods, the same samplers with the exact denoiser in place of the trained models."""


def paired_test(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], metric: str) -> tuple[float, float] | None:
    """(metric(a) - metric(b), two-sided p) over the prompts both sets of records cover, a prompt's samples under
    several seeds kept together (None when they share none). 'ppl' gives the difference of NLL per token."""
    ca, cb = clusters(a), clusters(b)
    shared = sorted(set(ca) & set(cb))
    if not shared:
        return None
    return paired_permutation_test(metric_sums([ca[i] for i in shared], metric),
                                   metric_sums([cb[i] for i in shared], metric))


def verdicts(rows: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]],
             claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    """One verdict per (claim, method pair, NFE) where both methods have a row and records: the trained pair, then
    the oracle pair when the rows hold it. `rows` are `aggregate(records)`."""
    cell = {(r["task"], r["method"], r["nfe"]): r for r in rows}
    recs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        recs.setdefault((r["task"], r["method"], r["nfe"]), []).append(r)
    out = []
    pairs = [(c, c.better, c.worse) for c in claims] + [(c, ORACLE + c.better, ORACLE + c.worse) for c in claims]
    for c, better, worse in sorted(pairs, key=lambda p: claims.index(p[0])):
        for nfe in sorted({r["nfe"] for r in rows if r["task"] == c.task}):
            a, b = cell.get((c.task, better, nfe)), cell.get((c.task, worse, nfe))
            if a is None or b is None or a.get(c.metric) is None or b.get(c.metric) is None:
                continue
            test = paired_test(recs.get((c.task, better, nfe), []), recs.get((c.task, worse, nfe), []), c.metric)
            verdict = "inconclusive" if test is None else verdict_from_test(*test, lower_is_better=c.lower_is_better)
            out.append({"claim": c.text, "nfe": nfe, "metric": c.metric, "better": better, "worse": worse,
                        "value_better": a[c.metric], "ci_better": a.get(f"{c.metric}_ci"),
                        "value_worse": b[c.metric], "ci_worse": b.get(f"{c.metric}_ci"),
                        "difference": None if test is None else test[0], "p": None if test is None else test[1],
                        "verdict": verdict, "spec": c.spec})
    return out


def verdict_lines(vs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines: the claim, then per NFE both values with intervals, the paired difference with its p
    and the verdict."""
    lines: list[str] = []
    for claim in dict.fromkeys(v["claim"] for v in vs):
        lines.append(f"- {claim}:")
        for v in (v for v in vs if v["claim"] == claim):
            a = format_interval(v["value_better"], tuple(v["ci_better"]) if v["ci_better"] else None, v["spec"])
            b = format_interval(v["value_worse"], tuple(v["ci_worse"]) if v["ci_worse"] else None, v["spec"])
            what = "NLL/token" if v["metric"] == "ppl" else "difference"
            diff = "" if v["p"] is None else f"; paired {what} {v['difference']:+.2f}, p = {v['p']:.2g}"
            lines.append(f"  - NFE {v['nfe']}: {v['better']} {a} vs {v['worse']} {b}{diff} -> **{v['verdict']}**")
    return lines
