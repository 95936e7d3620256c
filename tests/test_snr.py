"""SNR schedules for inference (exact grids of docs/provenance.md §3.1) and training SNR draws (§2.3)."""

from __future__ import annotations

import math

import pytest
import torch

from dsl_llada.config import ConfigError, SNRConfig
from dsl_llada.snr import (sample_lognormal, sample_roar, sample_training_snr, sensitive_counts, snr_schedule)
from helpers import gen


def _seg(a: float, b: float, n: int) -> list[float]:
    """n log-uniform points after a, ending at b (independent re-statement of the authors' segment rule)."""
    return [a * (b / a) ** (i / n) for i in range(1, n + 1)]


def _expected_sensitive(S: int, end_at_max: bool = False) -> list[float]:
    n1 = max(1, math.floor(0.05 * S))
    n2 = max(1, math.floor(0.90 * S))
    if n1 + n2 > S:  # S = 1: one jump over the low range
        n1, n2 = 0, S
    n3 = S - n1 - n2
    end2 = 100.0 if (end_at_max and n3 == 0) else 74.0
    return [0.01] + _seg(0.01, 7.0, n1) + _seg(7.0, end2, n2) + _seg(74.0, 100.0, n3)


# -- sensitive schedule: the published grids -----------------------------------------------------------------------
@pytest.mark.parametrize("S, counts", [(1, (0, 1, 0)), (2, (1, 1, 0)), (4, (1, 3, 0)), (8, (1, 7, 0)),
                                       (16, (1, 14, 1)), (32, (1, 28, 3)), (64, (3, 57, 4))])
def test_sensitive_counts(S, counts):
    assert sensitive_counts(S) == counts
    assert sum(counts) == S


def test_sensitive_nfe8_grid():
    g = snr_schedule("sensitive", 4)
    assert g.dtype == torch.float64 and len(g) == 5
    assert [round(x, 1) for x in g.tolist()] == [0.0, 7.0, 15.4, 33.7, 74.0]
    assert g[0].item() == 0.01 and g[1].item() == 7.0 and g[-1].item() == 74.0
    assert torch.allclose(g, torch.tensor(_expected_sensitive(4), dtype=torch.float64), rtol=1e-12)


def test_sensitive_nfe16_grid():
    g = snr_schedule("sensitive", 8)
    assert len(g) == 9
    assert [round(x, 1) for x in g.tolist()[1:]] == [7.0, 9.8, 13.7, 19.2, 26.9, 37.7, 52.8, 74.0]
    assert g[0].item() == 0.01 and g[-1].item() == 74.0
    assert torch.allclose(g, torch.tensor(_expected_sensitive(8), dtype=torch.float64), rtol=1e-12)


def test_sensitive_nfe32_grid():
    g = snr_schedule("sensitive", 16).tolist()
    assert len(g) == 17
    assert g[:2] == [0.01, 7.0]  # n1 = 1: one jump 0.01 -> 7
    assert g[15] == 74.0 and g[16] == 100.0  # n2 = 14 steps 7 -> 74, n3 = 1 step 74 -> 100
    assert sum(7.0 < x < 74.0 for x in g) == 13
    ratios = [g[i + 1] / g[i] for i in range(1, 15)]
    assert max(ratios) - min(ratios) < 1e-9  # log-uniform middle segment
    assert torch.allclose(torch.tensor(g, dtype=torch.float64),
                          torch.tensor(_expected_sensitive(16), dtype=torch.float64), rtol=1e-12)


def test_sensitive_nfe64_grid():
    g = snr_schedule("sensitive", 32).tolist()
    assert len(g) == 33
    assert g[:2] == [0.01, 7.0] and g[29] == 74.0  # n1 = 1, n2 = 28
    assert [round(x, 1) for x in g[30:]] == [81.8, 90.5, 100.0]  # n3 = 3
    assert g[-1] == 100.0
    assert sum(7.0 < x < 74.0 for x in g) == 27
    assert torch.allclose(torch.tensor(g, dtype=torch.float64),
                          torch.tensor(_expected_sensitive(32), dtype=torch.float64), rtol=1e-12)


def test_sensitive_nfe128_grid():
    g = snr_schedule("sensitive", 64).tolist()
    assert len(g) == 65
    assert g[0] == 0.01 and g[3] == 7.0 and g[60] == 74.0 and g[64] == 100.0  # n1 = 3, n2 = 57, n3 = 4
    assert g[1] == pytest.approx(0.01 * 700 ** (1 / 3), rel=1e-12)  # 0.0888...
    assert round(g[1], 4) == 0.0888 and round(g[2], 2) == 0.79
    assert torch.allclose(torch.tensor(g, dtype=torch.float64),
                          torch.tensor(_expected_sensitive(64), dtype=torch.float64), rtol=1e-12)


@pytest.mark.parametrize("S", [1, 2, 4, 8])
def test_sensitive_low_nfe_ends_at_74(S):
    assert snr_schedule("sensitive", S)[-1].item() == 74.0


def test_single_step_grids():
    assert snr_schedule("sensitive", 1).tolist() == [0.01, 74.0]
    assert snr_schedule("paper-exact", 1).tolist() == [0.01, 100.0]
    assert snr_schedule("uniform", 1).tolist() == [0.01, 100.0]


# -- paper-exact and uniform ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("S", list(range(1, 20)) + [32, 64])
def test_paper_exact_always_ends_at_gamma_max(S):
    g = snr_schedule("paper-exact", S)
    assert len(g) == S + 1 and g[0].item() == 0.01 and g[-1].item() == 100.0
    assert torch.allclose(g, torch.tensor(_expected_sensitive(S, end_at_max=True), dtype=torch.float64), rtol=1e-12)
    if sensitive_counts(S)[2] > 0:  # identical to 'sensitive' whenever the third segment exists
        assert torch.equal(g, snr_schedule("sensitive", S))
    g2 = snr_schedule("paper-exact", S, gamma_max=250.0)
    assert g2[-1].item() == 250.0


@pytest.mark.parametrize("S, lo, hi", [(1, 0.01, 100.0), (4, 0.01, 100.0), (16, 0.05, 80.0), (64, 1.0, 2.0)])
def test_uniform_is_log_uniform(S, lo, hi):
    g = snr_schedule("uniform", S, lo, hi)
    assert len(g) == S + 1 and g[0].item() == lo and g[-1].item() == hi
    ratios = g[1:] / g[:-1]
    assert torch.allclose(ratios, torch.full_like(ratios, (hi / lo) ** (1 / S)), rtol=1e-12)


@pytest.mark.parametrize("name", ["sensitive", "paper-exact", "uniform"])
@pytest.mark.parametrize("S", [1, 2, 3, 4, 5, 8, 10, 16, 20, 32, 50, 64, 100])
def test_schedules_strictly_increasing(name, S):
    g = snr_schedule(name, S)
    assert len(g) == S + 1
    assert bool((g[1:] > g[:-1]).all())


@pytest.mark.parametrize("args, match", [
    (("cosine", 4), "schedule='cosine'"),
    (("sensitive", 0), "steps=0"),
    (("uniform", 4, 0.0, 100.0), "gamma_min"),
    (("uniform", 4, 10.0, 10.0), "gamma_min"),
    (("uniform", 4, 10.0, 1.0), "gamma_min"),
    (("sensitive", 4, 0.01, 50.0), "gamma_max > 74"),
    (("paper-exact", 4, 8.0, 100.0), "gamma_min < 7"),
])
def test_schedule_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        snr_schedule(*args)


# -- training SNR ---------------------------------------------------------------------------------------------------
def test_lognormal_per_sequence_constant_along_length():
    g = sample_training_snr(SNRConfig(distribution="lognormal"), 64, 12, generator=gen(0))
    assert g.shape == (64, 12) and g.dtype == torch.float32
    assert torch.equal(g, g[:, :1].expand(64, 12))
    assert len(torch.unique(g[:, 0])) > 50
    assert (g > 0).all() and (g <= 40).all()


def test_lognormal_per_token_varies():
    g = sample_training_snr(SNRConfig(distribution="lognormal", lognormal_per_token=True), 64, 12, generator=gen(0))
    assert g.shape == (64, 12)
    assert (g.std(dim=1) > 0).all()
    assert len(torch.unique(g)) > 700


def test_lognormal_moments():
    n = 200_000
    raw = sample_lognormal(SNRConfig(lognormal_clip=1e12), n, 1, generator=gen(1))[:, 0].double()
    assert raw.log().mean().item() == pytest.approx(1.69, abs=0.01)
    assert raw.log().std().item() == pytest.approx(0.9, abs=0.01)
    g = sample_lognormal(SNRConfig(), n, 1, generator=gen(1))[:, 0].double()
    assert g.median().item() == pytest.approx(math.exp(1.69), rel=0.02)  # ~5.42, untouched by the clip
    assert g.max().item() == 40.0
    p_clip = 0.5 * math.erfc((math.log(40) - 1.69) / 0.9 / math.sqrt(2))  # P(N > (ln 40 - mu)/sigma) ~ 0.013
    assert p_clip == pytest.approx(0.013, abs=0.001)
    assert (g == 40.0).double().mean().item() == pytest.approx(p_clip, abs=0.0015)
    # the same draws, clipped: identical below 40
    assert torch.equal(torch.where(raw >= 40, torch.full_like(raw, 40.0), raw).float(), g.float())


def test_roar_ranges_and_clear_fraction():
    cfg = SNRConfig(distribution="roar")
    B, L = 20_000, 8
    g = sample_training_snr(cfg, B, L, generator=gen(2))
    clear = g >= 80
    assert ((g >= 80) & (g <= 100) | (g >= 0) & (g < 1)).all()
    assert not ((g >= 1) & (g < 80)).any()
    k = clear.sum(1)
    assert k.max().item() == L - 1 and k.min().item() == 0  # k ~ U{0..L-1}: never all clear
    counts = torch.bincount(k, minlength=L).double() / B
    assert torch.allclose(counts, torch.full((L,), 1 / L, dtype=torch.float64), atol=0.01)
    assert clear.double().mean().item() == pytest.approx((L - 1) / (2 * L), abs=0.005)
    assert g[clear].mean().item() == pytest.approx(90.0, abs=0.2)
    assert g[~clear].mean().item() == pytest.approx(0.5, abs=0.01)
    # clear positions are a uniformly random subset: every position is equally often clear
    assert torch.allclose(clear.double().mean(0), torch.full((L,), (L - 1) / (2 * L), dtype=torch.float64), atol=0.02)


def test_roar_custom_ranges():
    cfg = SNRConfig(distribution="roar", roar_clear_low=50.0, roar_clear_high=60.0, roar_unknown_high=2.0)
    g = sample_roar(cfg, 500, 6, generator=gen(3))
    assert ((g >= 50) & (g <= 60) | (g >= 0) & (g < 2)).all()
    assert (g >= 1).logical_and(g < 2).any()


def test_mixture_roar_fraction_per_sequence():
    B, L = 20_000, 8
    g = sample_training_snr(SNRConfig(), B, L, generator=gen(4))
    roar_rows = g.std(dim=1) > 0  # log-normal rows are constant along L (per-sequence gamma)
    assert roar_rows.double().mean().item() == pytest.approx(0.1, abs=0.01)
    assert (g[roar_rows] >= 80).any() and not ((g[roar_rows] >= 1) & (g[roar_rows] < 80)).any()
    assert (g[~roar_rows] <= 40).all()


@pytest.mark.parametrize("p, expected", [(0.0, 0.0), (1.0, 1.0)])
def test_mixture_roar_prob_extremes(p, expected):
    g = sample_training_snr(SNRConfig(roar_prob=p), 400, 8, generator=gen(5))
    assert (g.std(dim=1) > 0).double().mean().item() == expected


@pytest.mark.parametrize("dist", ["mixture", "lognormal", "roar"])
def test_same_seed_same_draws(dist):
    cfg = SNRConfig(distribution=dist)
    a = sample_training_snr(cfg, 16, 10, generator=gen(7))
    b = sample_training_snr(cfg, 16, 10, generator=gen(7))
    c = sample_training_snr(cfg, 16, 10, generator=gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_training_snr_rejects_empty_shapes():
    with pytest.raises(ValueError, match="batch >= 1"):
        sample_training_snr(SNRConfig(), 0, 4)
    with pytest.raises(ValueError, match="length >= 1"):
        sample_training_snr(SNRConfig(), 2, 0)
