"""Which of the paper's claims the demo reproduces. Both methods of a claim sample the same held-out prompts, so a
claim is judged at each NFE by a paired test: the difference (better - worse) against its distribution when the two
methods' labels are swapped at random within each prompt (`stats.paired_permutation_test`). Perplexity is compared
as the difference of NLL per token (log perplexity: the same sign as the perplexity difference).

A claim between two methods is one family of tests, one per NFE, and is decided as a family: the p-values are
adjusted by Holm's step-down correction over the NFEs tested (`stats.holm_adjust`), so the chance that any NFE of
the family gives a verdict by chance stays at most 0.05. Five uncorrected tests at 0.05 would give one with a
probability of up to 23 %, and a second training trajectory (another host's kernels round differently) moves such
chance verdicts between *reproduced* and *inconclusive*. At an NFE the claim is *reproduced* when the adjusted
p < 0.05 and the difference is on the claimed side, *contradicted* when it is on the other side. The pair's verdict
is *reproduced* (or *contradicted*) when some NFE is and none goes the other way, *depends on NFE* when both occur
(naming the NFEs of each), and *inconclusive* when no NFE is significant.

A claim is *undecidable at this scale* at an NFE when no outcome of the test could reach p < 0.05: only the prompts
on which the two methods' values differ move the statistic, and with k such prompts the two-sided p is at least
2 / 2^k (the observed labelling and its mirror image are always as extreme), which is 0.0625 at k = 5. Rep with
no adjacent repeat on any prompt by either method is the common case. Such NFEs are left out of the family (a test
that cannot reject adds no chance verdict), and a pair with no other NFE is undecidable as a whole: one line names
every NFE it covers.

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

from ..stats import ALPHA, bootstrap_ratio, format_interval, holm_adjust, paired_permutation_test, verdict_from_test
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
DEPENDS = "depends on NFE"
INCONCLUSIVE = "inconclusive"

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
    out.update(difference=diff, p=p, p_holm=p, lower_is_better=claim.lower_is_better,
               verdict=verdict_from_test(diff, p, lower_is_better=claim.lower_is_better))
    return out


def correct_family(family: Sequence[dict[str, Any]]) -> None:
    """Holm-adjust the p-values of one claim's NFEs between one method pair (`judge` results, in place): each tested
    NFE gets `p_holm` and the verdict the adjusted p gives."""
    tested = [v for v in family if v["p"] is not None]
    for v, adjusted in zip(tested, holm_adjust([v["p"] for v in tested])):
        v["p_holm"] = adjusted
        v["verdict"] = verdict_from_test(v["difference"], adjusted, lower_is_better=v["lower_is_better"])


def pair_verdict(family: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on a claim between one method pair from its corrected NFEs (`correct_family`): the verdict, and
    the NFEs where the claim is reproduced, contradicted, and undecidable."""
    at = {kind: [v["nfe"] for v in family if v["verdict"] == kind] for kind in ("reproduced", "contradicted", UNDECIDABLE)}
    if len(at[UNDECIDABLE]) == len(family):
        verdict = UNDECIDABLE
    elif at["reproduced"] and at["contradicted"]:
        verdict = DEPENDS
    elif at["reproduced"] or at["contradicted"]:
        verdict = "reproduced" if at["reproduced"] else "contradicted"
    else:
        verdict = INCONCLUSIVE
    first = family[0]
    return {"claim": first["claim"], "better": first["better"], "worse": first["worse"], "verdict": verdict,
            "tested": len(family) - len(at[UNDECIDABLE]), **at}


def verdicts(rows: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]],
             claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    """One verdict per (claim, method pair, NFE) where both methods have a row and records: the trained pair, then
    the oracle pair when the rows hold it, each pair's NFEs corrected as one family (`correct_family`). `rows` are
    `aggregate(records)`; the result is a function of the records alone."""
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
    for family in families(out):
        correct_family(family)
    return out


def families(vs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The per-NFE verdicts grouped by (claim, method pair), in order of first appearance."""
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for v in vs:
        grouped.setdefault((v["claim"], v["better"], v["worse"]), []).append(v)
    return list(grouped.values())


def pair_verdicts(vs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One verdict per (claim, method pair) from `verdicts`' output (`pair_verdict`)."""
    return [pair_verdict(f) for f in families(vs)]


def _nfes(vs: Sequence[dict[str, Any]]) -> str:
    return "NFE " + " / ".join(str(v["nfe"]) for v in vs)


def _pair_headline(pv: dict[str, Any]) -> str:
    """'**reproduced** at NFE 4 / 8', '**depends on NFE**: reproduced at NFE 4, contradicted at NFE 16', ..."""
    def at(kind: str) -> str:
        return f"{kind} at NFE {' / '.join(str(n) for n in pv[kind])}"
    if pv["verdict"] == DEPENDS:
        return f"**{DEPENDS}**: {at('reproduced')}; {at('contradicted')}"
    if pv["verdict"] in ("reproduced", "contradicted"):
        return f"**{pv['verdict']}** ({at(pv['verdict'])})"
    return (f"**{INCONCLUSIVE}** (no NFE of {pv['tested']} tested is significant after Holm's correction)")


def verdict_lines(vs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines: the claim; per method pair its verdict (`pair_verdict`), then per tested NFE both
    values with intervals, the paired difference with its p and Holm-adjusted p; a pair's undecidable NFEs share one
    line that gives the reason (a pair undecidable at every NFE is that one line)."""
    lines: list[str] = []
    for claim in dict.fromkeys(v["claim"] for v in vs):
        lines.append(f"- {claim}:")
        for family in families([v for v in vs if v["claim"] == claim]):
            pv = pair_verdict(family)
            pair = f"{pv['better']} vs {pv['worse']}"
            stuck = [v for v in family if v["verdict"] == UNDECIDABLE]
            reason = ""
            if stuck:
                counts = " / ".join(f"{v['differing']} of {v['n_prompts']}" for v in stuck)
                where = " where both are complete" if stuck[0]["metric"] == "ppl_complete" else ""
                reason = (f"the two differ on {counts} prompts{where}; a paired test over k differing prompts cannot "
                          f"reach p < {ALPHA:g} unless k >= {MIN_DIFFERING}")
            if pv["verdict"] == UNDECIDABLE:
                lines.append(f"  - {pair}, {_nfes(stuck)}: **{UNDECIDABLE}** ({reason})")
                continue
            lines.append(f"  - {pair}: {_pair_headline(pv)}")
            for v in (v for v in family if v["verdict"] != UNDECIDABLE):
                a = format_interval(v["value_better"], tuple(v["ci_better"]) if v["ci_better"] else None, v["spec"])
                b = format_interval(v["value_worse"], tuple(v["ci_worse"]) if v["ci_worse"] else None, v["spec"])
                what = "NLL/token" if v["metric"] in _LOG_METRICS else "difference"
                where = f" on {v['n_prompts']} prompts" if v["metric"] == "ppl_complete" else ""
                lines.append(f"    - NFE {v['nfe']}: {v['better']} {a} vs {v['worse']} {b}{where}; paired {what} "
                             f"{v['difference']:+.2f}, p = {v['p']:.2g}, Holm p = {v['p_holm']:.2g} -> {v['verdict']}")
            if stuck:
                lines.append(f"    - {_nfes(stuck)}: {UNDECIDABLE} ({reason})")
    return lines


MIN_DIFFERING = next(k for k in range(1, 64) if smallest_p(k) < ALPHA)
"""Fewest differing prompts with which a paired test can reach p < ALPHA (6 at ALPHA = 0.05)."""
