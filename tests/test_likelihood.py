"""Masked-diffusion Monte Carlo log-likelihood: exactness for one token, convergence to the enumerated bound,
batch-size invariance, seeding, rolling windows."""

from __future__ import annotations

import math

import pytest
import torch

from dsl_llada.eval.likelihood import (LikelihoodRequest, exact_bound, greedy_match, mc_loglikelihood,
                                       rolling_windows, stratified_counts)
from helpers import MASK, tiny_backbone, tiny_dsl


@pytest.fixture(scope="module")
def model():
    return tiny_backbone(seed=3)


def _direct_logp(model, context, token):
    ids = torch.tensor([list(context) + [MASK]])
    with torch.no_grad():
        return float(torch.log_softmax(model.logits_from_ids(ids)[0, -1].float(), -1)[token])


def test_one_token_estimate_is_the_models_log_probability(model):
    reqs = [LikelihoodRequest((1, 2, 3), (7,)), LikelihoodRequest((5,), (9,))]
    got = mc_loglikelihood(model, reqs, mc_samples=64)
    want = [_direct_logp(model, (1, 2, 3), 7), _direct_logp(model, (5,), 9)]
    assert got == pytest.approx(want, abs=1e-5)
    assert exact_bound(model, reqs[0]) == pytest.approx(want[0], abs=1e-5)


@pytest.mark.parametrize("target", [(7, 11), (4, 20, 33)])
def test_estimate_converges_to_the_enumerated_bound(model, target):
    req = LikelihoodRequest((1, 2, 3, 4), target)
    exact = exact_bound(model, req)
    errs = [abs(mc_loglikelihood(model, [req], mc_samples=k, seed=1)[0] - exact) for k in (6, 400)]
    assert errs[1] < 0.02 * abs(exact) and errs[1] <= errs[0] + 1e-9
    # the bound is below the log-likelihood of any one factorisation's first term alone, and finite
    assert math.isfinite(exact) and exact < 0


def test_two_token_bound_matches_its_formula(model):
    """T = 2: (1/2)·[2·(mean over the two single masks) ] + (1/2)·[1·(both masked, both terms)]."""
    c, (a, b) = (1, 2, 3), (7, 11)
    lp = lambda ids, pos, tok: float(torch.log_softmax(model.logits_from_ids(torch.tensor([ids]))[0, pos], -1)[tok])  # noqa: E731
    single = 0.5 * (lp([*c, MASK, b], 3, a) + lp([*c, a, MASK], 4, b))
    both = lp([*c, MASK, MASK], 3, a) + lp([*c, MASK, MASK], 4, b)
    want = 0.5 * (2 * single) + 0.5 * both
    assert exact_bound(model, LikelihoodRequest(c, (a, b))) == pytest.approx(want, abs=1e-5)


def test_batch_size_invariance_and_seeding(model):
    reqs = [LikelihoodRequest((1, 2), (5, 6, 7)), LikelihoodRequest((3, 4, 5, 6, 7), (8, 9)),
            LikelihoodRequest((2,), (10,))]
    a = mc_loglikelihood(model, reqs, mc_samples=16, batch_size=1, seed=5)
    b = mc_loglikelihood(model, reqs, mc_samples=16, batch_size=13, seed=5)
    assert a == pytest.approx(b, abs=1e-5)
    alone = mc_loglikelihood(model, reqs[1:2], mc_samples=16, seed=6)  # request 1 draws from seed + 1 either way
    assert alone[0] == pytest.approx(a[1], abs=1e-5)
    c = mc_loglikelihood(model, reqs, mc_samples=16, seed=99)
    # a 1-token request has no Monte Carlo noise: equal up to fp32 rounding of another batch layout (a few ulp of a
    # value near 6, ulp 4.8e-7; AVX2 kernels gave 3 ulp), hence 1e-5 like the comparisons above
    assert c[0] != pytest.approx(a[0], abs=1e-3) and c[2] == pytest.approx(a[2], abs=1e-5)


def test_dsl_model_uses_the_discrete_path():
    m = tiny_dsl(seed=2)
    req = LikelihoodRequest((1, 2), (9,))
    assert mc_loglikelihood(m, [req])[0] == pytest.approx(_direct_logp(m, (1, 2), 9), abs=1e-5)


def test_greedy_match_is_exact_for_one_token(model):
    ids = torch.tensor([[1, 2, 3, MASK]])
    best = int(model.logits_from_ids(ids)[0, -1].argmax())
    worst = int(model.logits_from_ids(ids)[0, -1].argmin())
    assert greedy_match(model, [LikelihoodRequest((1, 2, 3), (best,)), LikelihoodRequest((1, 2, 3), (worst,))]) == \
        [True, False]


def test_stratified_counts_and_rolling_windows():
    counts = stratified_counts(3, 9, 0.4)
    assert sorted(counts) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    toks = list(range(100, 123))
    wins = rolling_windows(toks, max_length=10, context_len=4, prefix=(1,))
    assert [t for w in wins for t in w.target] == toks  # every token predicted exactly once
    assert wins[0].context == (1,) and all(len(w.context) + len(w.target) <= 10 for w in wins)
    assert wins[1].context == tuple(toks[2:6])
    with pytest.raises(ValueError, match="context_len"):
        rolling_windows(toks, max_length=4, context_len=4)
    with pytest.raises(ValueError, match="at least one continuation token"):
        LikelihoodRequest((1,), ())
