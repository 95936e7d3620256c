"""Bootstrap intervals (fixed seed), interval comparison and the demo's verdict lines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsl_llada.eval.report import markdown_table, pivot
from dsl_llada.stats import (bootstrap_ratio, format_interval, holm_adjust, paired_permutation_test, separated,
                             verdict_from_test)
from dsl_llada.toy.evaluate import aggregate
from dsl_llada.toy.verdicts import UNDECIDABLE, verdict_lines, verdicts


def test_interval_covers_the_mean_and_is_a_function_of_the_data():
    x = np.random.default_rng(0).normal(10.0, 2.0, size=200)
    lo, hi = bootstrap_ratio(x)
    assert lo < x.mean() < hi
    assert hi - lo == pytest.approx(2 * 1.96 * x.std() / math.sqrt(200), rel=0.2)  # the normal-theory width
    assert bootstrap_ratio(x) == (lo, hi)  # fixed seed: same data, same interval
    assert bootstrap_ratio(x, seed=1) != (lo, hi)  # the seed is really used
    assert bootstrap_ratio([3.0]) == (3.0, 3.0)


def test_ratio_of_sums_with_a_transform_is_perplexity():
    nll, tok = [2.0, 4.0, 6.0], [1, 2, 3]
    lo, hi = bootstrap_ratio(nll, tok, transform=np.exp)
    assert lo == pytest.approx(math.e**2) and hi == pytest.approx(math.e**2)  # every item has ratio 2
    lo, hi = bootstrap_ratio([1.0, 9.0], [1, 1], transform=np.exp)
    assert math.exp(1) <= lo < hi <= math.exp(9)


@pytest.mark.parametrize("bad", [dict(num=[]), dict(num=[1.0, 2.0], den=[1.0]), dict(num=[1.0], level=1.0),
                                 dict(num=[1.0], resamples=0)])
def test_bad_input_is_refused(bad):
    with pytest.raises(ValueError):
        bootstrap_ratio(**bad)


def test_a_verdict_needs_a_significant_paired_test():
    assert verdict_from_test(-1.0, 0.01, lower_is_better=True) == "reproduced"
    assert verdict_from_test(-1.0, 0.01, lower_is_better=False) == "contradicted"
    assert verdict_from_test(1.0, 0.01, lower_is_better=True) == "contradicted"
    assert verdict_from_test(-1.0, 0.05, lower_is_better=True) == "inconclusive"  # p must be below alpha
    assert verdict_from_test(0.0, 0.0001, lower_is_better=True) == "inconclusive"
    assert separated((5, 6), (1, 4)) and not separated((1, 4), (4, 6)) and not separated(None, (1, 2))
    assert format_interval(12.345, (11.0, 13.9)) == "12.35 [11.00, 13.90]"
    assert format_interval(None, None) == "–" and format_interval(1.0, None, ".1f") == "1.0"


def test_holm_adjusts_in_the_given_order_and_stays_monotone():
    # sorted: 0.01 x 4 = 0.04, 0.02 x 3 = 0.06, 0.03 x 2 = 0.06 (raised to stay >= 0.06), 0.5 x 1 = 0.5
    assert holm_adjust([0.5, 0.01, 0.03, 0.02]) == pytest.approx([0.5, 0.04, 0.06, 0.06])
    assert holm_adjust([0.4, 0.3]) == pytest.approx([0.6, 0.6])  # 0.3 x 2, then 0.4 x 1 raised to 0.6
    assert holm_adjust([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert holm_adjust([0.02]) == [0.02] and holm_adjust([]) == []  # one test: unchanged
    # the family-wise rule is stricter than each test alone: 0.03 passes alone, not as one of two
    assert holm_adjust([0.03, 0.2])[0] == pytest.approx(0.06)


def test_holm_refuses_what_is_not_a_p_value():
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\], got \[0.1, 1.5\]"):
        holm_adjust([0.1, 1.5])


def _records(method: str, nll: float, n: int, *, spread: float = 0.0, seeds: int = 1) -> list[dict]:
    rng = np.random.default_rng(sum(map(ord, method)))
    out = []
    for k in range(seeds):
        for i in range(n):
            v = nll + spread * float(rng.normal())
            out.append({"method": method, "task": "open", "nfe": 4, "index": i, "nll_sum": 4 * v, "n_tokens": 4,
                        "in_support": 1.0, "rep": 0.0, "len": 3, "output": f"w{i} x{k}",
                        "tags": {"empty": False, "premature_eos": i % 2 == 0, "repetition": False,
                                 "degen_ending": False}, "forward_passes": 4, **({"sample_seed": k} if k else {})})
    return out


def test_aggregate_gives_intervals_and_the_verdict_follows_them():
    records = _records("DSL-SDE", 1.0, 40, spread=0.1) + _records("LLaDA", 2.0, 40, spread=0.1)
    rows = aggregate(records)
    by = {r["method"]: r for r in rows}
    lo, hi = by["DSL-SDE"]["ppl_ci"]
    assert lo < by["DSL-SDE"]["ppl"] < hi and hi < by["LLaDA"]["ppl_ci"][0]
    assert by["DSL-SDE"]["premature_eos%_ci"][0] < 50 < by["DSL-SDE"]["premature_eos%_ci"][1]
    vs = verdicts(rows, records)
    assert [v["verdict"] for v in vs if v["metric"] == "ppl"] == ["reproduced"]
    # the same prompts end early under both methods: no prompt differs, so no outcome could decide it
    assert [v["verdict"] for v in vs if v["metric"] == "premature_eos%"] == ["undecidable at this scale"]
    text = "\n".join(verdict_lines(vs))
    assert "NFE 4: DSL-SDE" in text and "**reproduced**" in text and "**undecidable at this scale**" in text
    assert "[" in pivot(rows, "ppl") and "[" in markdown_table(rows, [("ppl", "PPL", ".2f")])


def test_overlapping_intervals_are_inconclusive_and_seeds_give_a_spread():
    records = _records("DSL-SDE", 1.0, 6, spread=1.0, seeds=3) + _records("LLaDA", 1.1, 6, spread=1.0, seeds=3)
    rows = aggregate(records)
    assert [v["verdict"] for v in verdicts(rows, records) if v["metric"] == "ppl"] == ["inconclusive"]
    r = next(r for r in rows if r["method"] == "DSL-SDE")
    assert r["n_prompts"] == 6 and r["n"] == 18 and len(r["ppl_seeds"]) == 3


def test_the_paired_test_cancels_what_both_methods_share_and_respects_rare_events():
    """Prompts differ a lot (0..50) and method a is lower by 1 on every prompt: separate intervals overlap, the
    paired test is decisive. Four prompts with an event against none: p = 2/16 (exact), not significant."""
    base = np.arange(50, dtype=float)
    ones = np.ones(50)
    a, b = (base - 1.0, ones), (base, ones)
    assert not separated(bootstrap_ratio(*a), bootstrap_ratio(*b))
    diff, p = paired_permutation_test(a, b)
    assert diff == pytest.approx(-1.0) and p < 1e-3
    assert paired_permutation_test(a, b) == (diff, p)  # fixed seed
    rare = np.zeros(48)
    rare[:4] = 1.0
    diff, p = paired_permutation_test((rare, np.ones(48)), (np.zeros(48), np.ones(48)), permutations=20_000)
    assert diff == pytest.approx(4 / 48) and p == pytest.approx(2 / 16, abs=0.01)
    assert paired_permutation_test((rare, np.ones(48)), (np.zeros(48), np.ones(48)), seed=1)[1] != p  # seed used
    same = paired_permutation_test((base, ones), (base, ones))
    assert same == (0.0, 1.0)  # identical methods: every swap is as extreme
    with pytest.raises(ValueError, match="four equally long"):
        paired_permutation_test((base, ones), (base[:3], ones[:3]))


def test_paired_verdicts_judge_methods_that_differ_by_a_shift_per_prompt():
    """Prompt-level NLL varies widely; DSL-SDE is 0.05 nats/token lower on each prompt. The rows' own intervals
    overlap, the paired test says reproduced; swapped roles say contradicted."""
    def recs(method, shift):
        return [{"method": method, "task": "open", "nfe": 8, "index": i, "nll_sum": 4 * (1.0 + 0.1 * i + shift),
                 "n_tokens": 4, "in_support": 1.0, "rep": 0.0, "len": 3, "output": f"w{i}", "forward_passes": 8,
                 "tags": {"empty": False, "premature_eos": False, "repetition": False, "degen_ending": False}}
                for i in range(30)]
    records = recs("DSL-SDE", 0.0) + recs("LLaDA", 0.05)
    rows = aggregate(records)
    by = {r["method"]: r for r in rows}
    assert not separated(by["DSL-SDE"]["ppl_ci"], by["LLaDA"]["ppl_ci"])
    v = next(v for v in verdicts(rows, records) if v["metric"] == "ppl")
    assert v["verdict"] == "reproduced" and v["difference"] == pytest.approx(-0.05) and v["p"] < 1e-3
    swapped = [{**r, "method": {"DSL-SDE": "LLaDA", "LLaDA": "DSL-SDE"}[r["method"]]} for r in records]
    assert next(v for v in verdicts(aggregate(swapped), swapped) if v["metric"] == "ppl")["verdict"] == "contradicted"
    text = "\n".join(verdict_lines(verdicts(rows, records)))
    assert "  - DSL-SDE vs LLaDA: **reproduced** (reproduced at NFE 8)\n" in text
    assert "; paired NLL/token -0.05, p = 0.0001, Holm p = 0.0001 -> reproduced" in text


def _rec(method: str, i: int, *, nfe: int = 4, nll: float = 4.0, n: int = 4, support: float = 1.0,
         premature: bool = False, rep: float = 0.0) -> dict:
    return {"method": method, "task": "open", "nfe": nfe, "index": i, "nll_sum": nll, "n_tokens": n,
            "in_support": support, "rep": rep, "len": n - 1, "output": f"w{i}", "forward_passes": nfe,
            "tags": {"empty": False, "premature_eos": premature, "repetition": False, "degen_ending": False}}


def test_a_claim_no_outcome_could_decide_is_undecidable_once_for_all_its_nfes():
    """Neither method repeats a word on any of 30 prompts at any NFE: one 'undecidable' line for the pair, no
    'inconclusive' lines."""
    nfes = (4, 8, 16, 32, 64)
    records = [_rec(m, i, nfe=f, nll=4.0 + 0.1 * i + (0.5 if m == "LLaDA" else 0.0)) for m in ("DSL-SDE", "LLaDA")
               for f in nfes for i in range(30)]
    vs = [v for v in verdicts(aggregate(records), records) if v["metric"] == "rep"]
    assert [v["verdict"] for v in vs] == ["undecidable at this scale"] * 5
    assert [v["differing"] for v in vs] == [0] * 5 and [v["p"] for v in vs] == [None] * 5
    text = "\n".join(verdict_lines(verdicts(aggregate(records), records)))
    rep = text.split("repeats adjacent words less than LLaDA remasking:\n")[1].split("\n- ")[0].splitlines()
    assert rep == ["  - DSL-SDE vs LLaDA, NFE 4 / 8 / 16 / 32 / 64: **undecidable at this scale** (the two differ on "
                   "0 of 30 / 0 of 30 / 0 of 30 / 0 of 30 / 0 of 30 prompts; a paired test over k differing prompts "
                   "cannot reach p < 0.05 unless k >= 6)"]
    assert "NFE 64: DSL-SDE" in text and "**inconclusive**" not in text  # perplexity is decided at every NFE


@pytest.mark.parametrize("events,verdict", [(5, "undecidable at this scale"), (6, "reproduced")])
def test_six_differing_prompts_are_the_fewest_a_paired_test_can_decide(events, verdict):
    from dsl_llada.toy.verdicts import MIN_DIFFERING, smallest_p
    assert (smallest_p(0), smallest_p(1), smallest_p(5), smallest_p(6), MIN_DIFFERING) == (1.0, 1.0, 0.0625, 0.03125, 6)
    records = ([_rec("DSL-SDE", i) for i in range(40)]
               + [_rec("LLaDA", i, rep=1.0 if i < events else 0.0) for i in range(40)])
    v = next(v for v in verdicts(aggregate(records), records) if v["metric"] == "rep")
    assert v["verdict"] == verdict and v["differing"] == events
    if events == 6:  # every differing prompt on the claimed side: the exact p is 2 / 2^6
        assert v["p"] == pytest.approx(2 / 64, abs=0.006) and v["difference"] == pytest.approx(-100 * 6 / 40)


def test_the_headline_counts_complete_answers_and_compares_their_perplexity_where_both_are_complete():
    """14 prompts. DSL-SDE: complete on 0-11, off the support on 12-13 (NLL 50 over 5 tokens). LLaDA: 4-token
    answers at NLL 1.0 per token, premature on 0-9 and complete on 10-13. Complete: 12 against 4 of 14, 10 prompts
    for DSL-SDE and 2 against it (exact p = 2 x 79 / 4096 = 0.039). Both are complete only on 10 and 11, too few to
    decide; per-token perplexity of every answer prefers the short ones."""
    records = ([_rec("DSL-SDE", i, nll=6.0, n=5) for i in range(12)]
               + [_rec("DSL-SDE", i, nll=50.0, n=5, support=0.0) for i in (12, 13)]
               + [_rec("LLaDA", i, nll=4.0, n=4, premature=i < 10) for i in range(14)])
    rows = aggregate(records)
    by = {r["method"]: r for r in rows}
    assert (by["DSL-SDE"]["complete"], by["LLaDA"]["complete"]) == (pytest.approx(1200 / 14), pytest.approx(400 / 14))
    assert (by["DSL-SDE"]["n_complete"], by["LLaDA"]["n_complete"]) == (12, 4)
    assert by["DSL-SDE"]["ppl_complete"] == pytest.approx(math.exp(1.2)) and by["LLaDA"]["ppl_complete"] == pytest.approx(math.e)
    assert by["LLaDA"]["ppl"] == pytest.approx(math.e)
    vs = {(v["metric"], v["worse"]): v for v in verdicts(rows, records)}
    assert {w for m, w in vs if m == "complete"} == {"LLaDA"}  # the other baselines have no rows here
    done = vs[("complete", "LLaDA")]
    assert done["difference"] == pytest.approx(800 / 14) and done["differing"] == 12  # prompts 0-9 and 12-13
    assert done["p"] == pytest.approx(2 * 79 / 4096, abs=0.006) and done["verdict"] == "reproduced"
    fair = vs[("ppl_complete", "LLaDA")]
    assert (fair["n_prompts"], fair["differing"], fair["verdict"]) == (2, 2, "undecidable at this scale")
    assert fair["value_better"] == pytest.approx(math.exp(1.2)) and fair["value_worse"] == pytest.approx(math.e)
    assert vs[("ppl", "LLaDA")]["verdict"] == "contradicted"
    text = "\n".join(verdict_lines(verdicts(rows, records)))
    assert ("- DSL-SDE writes complete, in-support answers more often than LLaDA:\n  - DSL-SDE vs LLaDA: **reproduced** "
            "(reproduced at NFE 4)\n    - NFE 4: DSL-SDE 86 [") in text
    assert "(the two differ on 2 of 2 prompts where both are complete;" in text


def test_complete_answer_perplexity_is_judged_on_the_matched_prompts():
    """30 prompts, every answer complete, DSL-SDE 0.1 nats/token lower on each: reproduced on all 30; an incomplete
    LLaDA answer on 10 of them removes those prompts from the comparison for both methods."""
    sde = [_rec("DSL-SDE", i, nll=4 * (1.0 + 0.05 * i)) for i in range(30)]
    llada = [_rec("LLaDA", i, nll=4 * (1.1 + 0.05 * i), premature=i >= 20) for i in range(30)]
    records = sde + llada
    v = next(v for v in verdicts(aggregate(records), records) if v["metric"] == "ppl_complete")
    assert (v["n_prompts"], v["differing"], v["verdict"]) == (20, 20, "reproduced")
    assert v["difference"] == pytest.approx(-0.1) and v["p"] < 1e-3
    assert v["value_better"] == pytest.approx(math.exp(1.0 + 0.05 * 9.5))
    assert "on 20 prompts; paired NLL/token -0.10, p = 0.0001, Holm p = 0.0001 -> reproduced" in "\n".join(verdict_lines([v]))


def _family(shifts: dict[int, float], n: int = 30, *, noise: float = 1.0, seed: int = 3) -> list[dict]:
    """DSL-SDE and LLaDA on n prompts at each NFE of `shifts`: LLaDA's NLL per token is DSL-SDE's plus the NFE's
    shift plus per-prompt noise (a fixed draw), so a shift of 0 is a true null."""
    rng = np.random.default_rng(seed)
    out = []
    for nfe, shift in shifts.items():
        for i in range(n):
            base = 1.0 + 0.05 * i
            out += [_rec("DSL-SDE", i, nfe=nfe, nll=4 * base),
                    _rec("LLaDA", i, nfe=nfe, nll=4 * (base + shift + noise * float(rng.normal())))]
    return out


def test_a_claims_nfes_are_one_family_and_holm_corrects_them():
    """Five NFEs; only NFE 4 has a true shift, large enough to stay significant after the correction. Every tested
    NFE's p is raised to its Holm value, the verdicts follow the adjusted p, and the pair's verdict names NFE 4."""
    from dsl_llada.toy.verdicts import pair_verdicts
    records = _family({4: 2.0, 8: 0.0, 16: 0.0, 32: 0.0, 64: 0.0})
    vs = [v for v in verdicts(aggregate(records), records) if v["metric"] == "ppl"]
    ps = [v["p"] for v in vs]
    assert [v["p_holm"] for v in vs] == pytest.approx(holm_adjust(ps))
    assert all(v["p_holm"] >= v["p"] for v in vs)
    assert [v["verdict"] for v in vs] == ["reproduced"] + ["inconclusive"] * 4
    (pv,) = [pv for pv in pair_verdicts(vs)]
    assert (pv["verdict"], pv["reproduced"], pv["contradicted"], pv["tested"]) == ("reproduced", [4], [], 5)


@pytest.mark.parametrize("seed,shift", [(3, 0.4), (4, 0.6)])
def test_a_p_below_005_alone_is_not_a_verdict_in_a_family_of_five(seed, shift):
    """One NFE with a modest shift (raw p between 0.01 and 0.05 for both noise draws) among four nulls: significant
    alone, not after the correction; the pair is inconclusive."""
    from dsl_llada.toy.verdicts import pair_verdicts
    records = _family({4: shift, 8: 0.0, 16: 0.0, 32: 0.0, 64: 0.0}, seed=seed)
    vs = [v for v in verdicts(aggregate(records), records) if v["metric"] == "ppl"]
    assert 0.01 < vs[0]["p"] < 0.05 and vs[0]["p_holm"] >= 0.05
    assert {v["verdict"] for v in vs} == {"inconclusive"}
    assert pair_verdicts(vs)[0]["verdict"] == "inconclusive"
    text = "\n".join(verdict_lines(vs))
    assert "  - DSL-SDE vs LLaDA: **inconclusive** (no NFE of 5 tested is significant after Holm's correction)" in text


def test_opposite_significant_nfes_make_a_claim_depend_on_nfe_and_undecidable_nfes_leave_the_family():
    """DSL-SDE better at NFE 4, worse at NFE 16; at NFE 8 the two are identical on every prompt (undecidable): the
    family has two tests, and the pair's verdict names both sides."""
    from dsl_llada.toy.verdicts import pair_verdicts
    records = _family({4: 2.0, 8: 0.0, 16: -2.0}, noise=0.5)
    records = [r if not (r["nfe"] == 8 and r["method"] == "LLaDA") else {**r, "nll_sum": 4 * (1.0 + 0.05 * r["index"])}
               for r in records]
    vs = [v for v in verdicts(aggregate(records), records) if v["metric"] == "ppl"]
    assert [v["verdict"] for v in vs] == ["reproduced", "undecidable at this scale", "contradicted"]
    tested = [v for v in vs if v["p"] is not None]
    assert [v["p_holm"] for v in tested] == pytest.approx(holm_adjust([v["p"] for v in tested]))  # m = 2, not 3
    pv = pair_verdicts(vs)[0]
    assert (pv["verdict"], pv["reproduced"], pv["contradicted"], pv[UNDECIDABLE], pv["tested"]) == (
        "depends on NFE", [4], [16], [8], 2)
    text = "\n".join(verdict_lines(vs))
    assert "  - DSL-SDE vs LLaDA: **depends on NFE**: reproduced at NFE 4; contradicted at NFE 16\n" in text
    assert "    - NFE 8: undecidable at this scale (the two differ on 0 of 30 prompts;" in text
