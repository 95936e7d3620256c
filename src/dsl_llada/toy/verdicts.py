"""Which of the paper's claims the demo reproduces. Both methods of a claim sample the same held-out prompts, so a
claim is judged on the paired difference: the 95 % bootstrap interval of (better - worse) over prompt resamples
that draw the same prompts for both methods. A claim is *reproduced* at an NFE when that interval lies entirely on
the claimed side of 0, *contradicted* when it lies entirely on the other side, and *inconclusive* when it holds 0.
Perplexity is compared as the difference of NLL per token (log perplexity: the same sign as the perplexity
difference)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..stats import compare_difference, format_interval, paired_difference
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


def paired_interval(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], metric: str) -> tuple[float, float] | None:
    """95 % interval of metric(a) - metric(b) over resamples of the prompts both sets of records cover (None when they
    share none). 'ppl' gives the difference of NLL per token."""
    ca, cb = clusters(a), clusters(b)
    shared = sorted(set(ca) & set(cb))
    if not shared:
        return None
    return paired_difference(metric_sums([ca[i] for i in shared], metric), metric_sums([cb[i] for i in shared], metric))


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
            diff = paired_interval(recs.get((c.task, better, nfe), []), recs.get((c.task, worse, nfe), []), c.metric)
            out.append({"claim": c.text, "nfe": nfe, "metric": c.metric, "better": better, "worse": worse,
                        "value_better": a[c.metric], "ci_better": a.get(f"{c.metric}_ci"),
                        "value_worse": b[c.metric], "ci_worse": b.get(f"{c.metric}_ci"), "difference_ci": diff,
                        "verdict": compare_difference(diff, lower_is_better=c.lower_is_better), "spec": c.spec})
    return out


def verdict_lines(vs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines: the claim, then per NFE both values with intervals, the paired difference's interval
    and the verdict."""
    lines: list[str] = []
    for claim in dict.fromkeys(v["claim"] for v in vs):
        lines.append(f"- {claim}:")
        for v in (v for v in vs if v["claim"] == claim):
            a = format_interval(v["value_better"], tuple(v["ci_better"]) if v["ci_better"] else None, v["spec"])
            b = format_interval(v["value_worse"], tuple(v["ci_worse"]) if v["ci_worse"] else None, v["spec"])
            d = v["difference_ci"]
            what = "NLL/token" if v["metric"] == "ppl" else "difference"
            diff = "" if d is None else f"; paired {what} [{d[0]:+.2f}, {d[1]:+.2f}]"
            lines.append(f"  - NFE {v['nfe']}: {v['better']} {a} vs {v['worse']} {b}{diff} -> **{v['verdict']}**")
    return lines
