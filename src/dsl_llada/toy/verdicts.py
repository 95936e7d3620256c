"""Which of the paper's claims the demo reproduces: a claim is *reproduced* at an NFE only when the two methods'
95 % bootstrap intervals separate in the claimed direction, *contradicted* when they separate the other way, and
*inconclusive* when they overlap (too few prompts or seeds to tell)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..stats import compare, format_interval


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


def verdicts(rows: Sequence[dict[str, Any]], claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    """One verdict per (claim, method pair, NFE) where both methods have a row with an interval: the trained pair,
    then the oracle pair when the rows hold it."""
    cell = {(r["task"], r["method"], r["nfe"]): r for r in rows}
    out = []
    pairs = [(c, c.better, c.worse) for c in claims] + [(c, ORACLE + c.better, ORACLE + c.worse) for c in claims]
    for c, better, worse in sorted(pairs, key=lambda p: claims.index(p[0])):
        for nfe in sorted({r["nfe"] for r in rows if r["task"] == c.task}):
            a, b = cell.get((c.task, better, nfe)), cell.get((c.task, worse, nfe))
            if a is None or b is None or a.get(c.metric) is None or b.get(c.metric) is None:
                continue
            ia, ib = a.get(f"{c.metric}_ci"), b.get(f"{c.metric}_ci")
            out.append({"claim": c.text, "nfe": nfe, "metric": c.metric, "better": better, "worse": worse,
                        "value_better": a[c.metric], "ci_better": ia, "value_worse": b[c.metric], "ci_worse": ib,
                        "verdict": compare(tuple(ia) if ia else None, tuple(ib) if ib else None,
                                           lower_is_better=c.lower_is_better),
                        "spec": c.spec})
    return out


def verdict_lines(vs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines: the claim, then per NFE both values with intervals and the verdict."""
    lines: list[str] = []
    for claim in dict.fromkeys(v["claim"] for v in vs):
        lines.append(f"- {claim}:")
        for v in (v for v in vs if v["claim"] == claim):
            a = format_interval(v["value_better"], tuple(v["ci_better"]) if v["ci_better"] else None, v["spec"])
            b = format_interval(v["value_worse"], tuple(v["ci_worse"]) if v["ci_worse"] else None, v["spec"])
            lines.append(f"  - NFE {v['nfe']}: {v['better']} {a} vs {v['worse']} {b} -> **{v['verdict']}**")
    return lines
