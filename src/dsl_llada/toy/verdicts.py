"""Which of the paper's claims the demo reproduces. Both methods of a claim sample the same held-out prompts, so a
claim is judged by a paired test: the difference (better - worse) against its distribution when the two methods'
labels are swapped at random within each prompt (`stats.paired_permutation_test`). A claim is *reproduced* at an
NFE when p < 0.05 and the difference is on the claimed side, *contradicted* when p < 0.05 on the other side, and
*inconclusive* otherwise. Perplexity is compared as the difference of NLL per token (log perplexity: the same sign
as the perplexity difference).

A claim is *undecidable at this scale* at an NFE when no outcome of the test could reach p < 0.05: only the prompts
on which the two methods' values differ move the statistic, and with k such prompts the two-sided p is at least
2 / 2^k (the observed labelling and its mirror image are always as extreme), which is 0.0625 at k = 5. Rep with
no adjacent repeat on any prompt by either method is the common case. Such a claim gets one line naming every NFE
it covers, not one inconclusive line per NFE.

The paper's headline (SDE "is the only method that achieves low PPL, low repetition, and long output
simultaneously") is judged against every discrete baseline the demo runs, by two claims that per-token perplexity
cannot stand in for on this world (a 4-word answer ending early scores below the world's own samples):

- *complete answers*: the share of answers that are inside the world's support and do not end prematurely
  (`evaluate.is_complete`);
- *perplexity of complete answers*: per-token perplexity compared only on the prompts where both methods wrote a
  complete answer, so an answer cut short or off the grammar cannot lower it, and a method that fails on the hard
  prompts does not keep only its easy ones: a prompt counts for both methods or for neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..stats import ALPHA, bootstrap_ratio, format_interval, paired_permutation_test, verdict_from_test
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
    matched: bool = False
    """Compare only the prompts where both methods wrote a complete answer (for 'ppl_complete')."""


DISCRETE_BASELINES = ("LLaDA", "LLaDA+EOS", "LLaDA+EOS+Block", "ReMDM")
"""The discrete samplers of the demo's comparison (toy/evaluate.py PAPER_METHODS) the headline is judged against."""

HEADLINE = (
    *(Claim(f"DSL-SDE writes complete, in-support answers more often than {b}", "open", "complete", "DSL-SDE", b,
            False, ".0f") for b in DISCRETE_BASELINES),
    *(Claim(f"DSL-SDE's complete answers have lower perplexity than {b}'s (prompts where both are complete)", "open",
            "ppl_complete", "DSL-SDE", b, True, ".2f", matched=True) for b in DISCRETE_BASELINES),
)
"""The paper's headline, length and quality together, against every discrete baseline."""

CLAIMS = (
    *HEADLINE,
    Claim("DSL-SDE writes open-ended text with lower perplexity than LLaDA remasking", "open", "ppl", "DSL-SDE",
          "LLaDA", True, ".2f"),
    Claim("DSL-SDE ends responses prematurely less often than LLaDA remasking", "open", "premature_eos%", "DSL-SDE",
          "LLaDA", True, ".0f"),
    Claim("DSL-SDE repeats adjacent words less than LLaDA remasking", "open", "rep", "DSL-SDE", "LLaDA", True),
    Claim("DSL-SDE summarises better (ROUGE-L) than LLaDA remasking", "summarize", "rougeL", "DSL-SDE", "LLaDA", False),
)

UNDECIDABLE = "undecidable at this scale"

ORACLE = "Oracle "
"""Prefix of the oracle rows (toy/evaluate.py ORACLE_METHODS): each claim is also judged between the oracle versions of
its two methods, the same samplers with the exact denoiser in place of the trained models."""

_LOG_METRICS = ("ppl", "ppl_complete")
"""Metrics compared as NLL per token and shown as perplexity."""


def smallest_p(differing: int) -> float:
    """The smallest two-sided p a paired permutation test can give when the two methods differ on `differing`
    prompts: the observed labelling and its mirror image are as extreme, so p >= 2 / 2^k (1 when none differ)."""
    return 1.0 if differing < 1 else min(1.0, 2.0 ** (1 - differing))


def paired_sums(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], metric: str, *, matched: bool = False
                ) -> tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]:
    """Per-prompt (numerator, denominator) sums of `metric` for both sets of records over the prompts both cover (a
    prompt's samples under several seeds kept together); with `matched`, only the prompts where both have a non-zero
    denominator (for 'ppl_complete': a complete answer)."""
    ca, cb = clusters(a), clusters(b)
    shared = sorted(set(ca) & set(cb))
    sa, sb = metric_sums([ca[i] for i in shared], metric), metric_sums([cb[i] for i in shared], metric)
    keep = [j for j in range(len(shared)) if not matched or (sa[1][j] > 0 and sb[1][j] > 0)]
    return ([sa[0][j] for j in keep], [sa[1][j] for j in keep]), ([sb[0][j] for j in keep], [sb[1][j] for j in keep])


def paired_test(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], metric: str, *, matched: bool = False
                ) -> tuple[float, float] | None:
    """(metric(a) - metric(b), two-sided p) over the prompts both sets of records cover (see `paired_sums`; None
    when they share none). 'ppl' and 'ppl_complete' give the difference of NLL per token."""
    sa, sb = paired_sums(a, b, metric, matched=matched)
    if not sa[0]:
        return None
    return paired_permutation_test(sa, sb)


def _value(sums: tuple[list[float], list[float]], metric: str) -> tuple[float, tuple[float, float]]:
    """A method's value of `metric` on the compared prompts, with its 95 % bootstrap interval."""
    ratio = sum(sums[0]) / sum(sums[1])
    if metric in _LOG_METRICS:
        return float(np.exp(ratio)), bootstrap_ratio(*sums, transform=np.exp)
    return ratio, bootstrap_ratio(*sums)


def judge(claim: Claim, better: str, worse: str, nfe: int, a: Sequence[dict[str, Any]],
          b: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on `claim` between the records `a` of `better` and `b` of `worse` at one NFE."""
    sa, sb = paired_sums(a, b, claim.metric, matched=claim.matched)
    n = len(sa[0])
    differing = sum((sa[0][j], sa[1][j]) != (sb[0][j], sb[1][j]) for j in range(n))
    out: dict[str, Any] = {"claim": claim.text, "nfe": nfe, "metric": claim.metric, "better": better, "worse": worse,
                           "n_prompts": n, "differing": differing, "spec": claim.spec, "value_better": None,
                           "ci_better": None, "value_worse": None, "ci_worse": None, "difference": None, "p": None}
    if n:
        (out["value_better"], out["ci_better"]), (out["value_worse"], out["ci_worse"]) = (_value(sa, claim.metric),
                                                                                          _value(sb, claim.metric))
    floor = smallest_p(differing)
    if floor >= ALPHA:
        where = "on the prompts where both wrote a complete answer" if claim.matched else "on the shared prompts"
        out.update(verdict=UNDECIDABLE, reason=f"{differing} of {n} prompts differ {where}; the smallest p a paired "
                                               f"test can reach with {differing} is {floor:.2g}")
        return out
    diff, p = paired_permutation_test(sa, sb)
    out.update(difference=diff, p=p, verdict=verdict_from_test(diff, p, lower_is_better=claim.lower_is_better))
    return out


def verdicts(rows: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]],
             claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    """One verdict per (claim, method pair, NFE) where both methods have a row and records: the trained pair, then
    the oracle pair when the rows hold it. `rows` are `aggregate(records)`; the result is a function of the records
    alone."""
    have = {(r["task"], r["method"], r["nfe"]) for r in rows}
    recs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        recs.setdefault((r["task"], r["method"], r["nfe"]), []).append(r)
    out = []
    for c in claims:
        for better, worse in ((c.better, c.worse), (ORACLE + c.better, ORACLE + c.worse)):
            for nfe in sorted({r["nfe"] for r in rows if r["task"] == c.task}):
                keys = (c.task, better, nfe), (c.task, worse, nfe)
                if not all(k in have and recs.get(k) for k in keys):
                    continue
                out.append(judge(c, better, worse, nfe, recs[keys[0]], recs[keys[1]]))
    return out


def _nfes(vs: Sequence[dict[str, Any]]) -> str:
    return "NFE " + " / ".join(str(v["nfe"]) for v in vs)


def verdict_lines(vs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines: the claim, then per method pair and NFE both values with intervals, the paired
    difference with its p and the verdict; a pair's undecidable NFEs share one line that gives the reason."""
    lines: list[str] = []
    for claim in dict.fromkeys(v["claim"] for v in vs):
        lines.append(f"- {claim}:")
        of_claim = [v for v in vs if v["claim"] == claim]
        for pair in dict.fromkeys((v["better"], v["worse"]) for v in of_claim):
            of_pair = [v for v in of_claim if (v["better"], v["worse"]) == pair]
            for v in (v for v in of_pair if v["verdict"] != UNDECIDABLE):
                a = format_interval(v["value_better"], tuple(v["ci_better"]) if v["ci_better"] else None, v["spec"])
                b = format_interval(v["value_worse"], tuple(v["ci_worse"]) if v["ci_worse"] else None, v["spec"])
                what = "NLL/token" if v["metric"] in _LOG_METRICS else "difference"
                where = f" on {v['n_prompts']} prompts" if v["metric"] == "ppl_complete" else ""
                lines.append(f"  - NFE {v['nfe']}: {v['better']} {a} vs {v['worse']} {b}{where}; paired {what} "
                             f"{v['difference']:+.2f}, p = {v['p']:.2g} -> **{v['verdict']}**")
            stuck = [v for v in of_pair if v["verdict"] == UNDECIDABLE]
            if stuck:
                counts = " / ".join(f"{v['differing']} of {v['n_prompts']}" for v in stuck)
                lines.append(f"  - {_nfes(stuck)}: {pair[0]} vs {pair[1]} -> **{UNDECIDABLE}** (the two differ on "
                             f"{counts} prompts{' where both are complete' if stuck[0]['metric'] == 'ppl_complete' else ''}; "
                             f"a paired test over k differing prompts cannot reach p < {ALPHA:g} unless k >= "
                             f"{MIN_DIFFERING})")
    return lines


MIN_DIFFERING = next(k for k in range(1, 64) if smallest_p(k) < ALPHA)
"""Fewest differing prompts with which a paired test can reach p < ALPHA (6 at ALPHA = 0.05)."""
