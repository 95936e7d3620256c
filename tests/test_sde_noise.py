"""Where the Heun sampler puts its noise: the authors' predictor noise (default) against Algorithm 2 as printed.

With a denoiser that ignores its input (ê = c), one Heun step is affine in dW, so the noise a step adds is exact:
    predictor noise:  y' - y_det = (eta / gamma_{s+1}) dW
    as printed:       y' - y_det = 1/2 (eta / gamma_s + eta / gamma_{s+1}) dW
(docs/samplers.md, "Where the noise goes").
"""

from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F

from dsl_llada.cli.main import _sampler_config, build_parser
from dsl_llada.config import SDEConfig
from dsl_llada.sampling import heun_solve


class FixedRNG:
    """Stands in for RowRNG: hands out pre-drawn xi tensors, one per Heun step, and records the shapes asked for."""

    def __init__(self, xis: list[torch.Tensor]):
        self.xis, self.shapes = list(xis), []

    def randn(self, shape, device=None, dtype=torch.float32):
        self.shapes.append(tuple(shape))
        return self.xis.pop(0)


def _constant(c: torch.Tensor):
    return lambda y, gamma: (c.expand_as(y).clone(), torch.zeros(*y.shape[:-1], 3))


def _one_step(grid, eta, predictor_noise, xi, c, y0):
    rng = FixedRNG([xi])
    y = heun_solve(_constant(c), y0, torch.tensor(grid, dtype=torch.float64), eta=eta,
                   predictor_noise=predictor_noise, rng=rng)
    assert rng.shapes == [tuple(y0.shape)] and rng.xis == []  # exactly one draw for the one step
    return y


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("grid", [(0.01, 7.0), (7.0, 9.8), (74.0, 100.0)])
def test_one_heun_step_noise_is_eta_over_gamma_next_with_predictor_noise(seed, grid):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(4, generator=g, dtype=torch.float64) * 0.3
    y0 = F.normalize(torch.randn(2, 3, 4, generator=g, dtype=torch.float64), dim=-1)
    xi = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    g0, g1 = grid
    dW = abs(g1 - g0) ** 0.5 * xi
    eta = 0.1
    y_det = _one_step(grid, 0.0, True, xi, c, y0)
    assert torch.equal(y_det, _one_step(grid, 0.0, False, xi, c, y0))  # eta = 0: placement is irrelevant
    with_pred = _one_step(grid, eta, True, xi, c, y0) - y_det
    printed = _one_step(grid, eta, False, xi, c, y0) - y_det
    torch.testing.assert_close(with_pred, (eta / g1) * dW, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(printed, 0.5 * (eta / g0 + eta / g1) * dW, rtol=1e-12, atol=1e-12)
    # the ratio of the two is 1/2 (gamma_{s+1}/gamma_s + 1): 350.5 at the first step of the sensitive schedule
    ratio = printed.norm() / with_pred.norm()
    assert float(ratio) == pytest.approx(0.5 * (g1 / g0 + 1), rel=1e-9)


def test_different_draws_give_different_noise_but_the_same_identity():
    c = torch.tensor([0.5, -0.5, 0.0], dtype=torch.float64)
    y0 = F.normalize(torch.ones(1, 2, 3, dtype=torch.float64), dim=-1)
    xa = torch.randn(1, 2, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    xb = torch.randn(1, 2, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    y_det = _one_step((0.01, 7.0), 0.0, True, xa, c, y0)
    ya, yb = (_one_step((0.01, 7.0), 0.05, True, x, c, y0) for x in (xa, xb))
    assert not torch.allclose(ya, yb)
    for y, x in ((ya, xa), (yb, xb)):
        torch.testing.assert_close(y - y_det, 0.05 / 7.0 * 6.99 ** 0.5 * x, rtol=1e-12, atol=1e-12)


def test_default_is_the_authors_sampler_and_printed_is_an_option():
    assert SDEConfig().predictor_noise is True
    printed = SDEConfig(predictor_noise=False)
    assert SDEConfig.from_dict(printed.to_dict()) == printed
    assert SDEConfig.from_dict({"nfe": 8}).predictor_noise is True  # configs saved without the field get the default


def _cli(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["generate", "--model", "m", "--prompt", "p", *extra])


def test_cli_predictor_noise_flag(capsys):
    assert _sampler_config(_cli()).predictor_noise is True
    assert _sampler_config(_cli("--no-predictor-noise")).predictor_noise is False
    assert _sampler_config(_cli("--predictor-noise")).predictor_noise is True
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    text = capsys.readouterr().out
    assert "--predictor-noise" in text and "--no-predictor-noise" in text and "Algorithm 2 as printed" in text
