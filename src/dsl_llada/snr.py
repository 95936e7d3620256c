"""SNR (gamma) distributions for training and SNR schedules for inference. Pure functions on tensors."""

from __future__ import annotations

import math
import typing
from typing import TYPE_CHECKING, Literal

import torch

from .errors import ConfigError

if TYPE_CHECKING:  # annotations only: config imports this module for the schedule names
    from .config import SNRConfig

ScheduleName = Literal["sensitive", "paper-exact", "uniform"]
"""The inference SNR schedules (see `snr_schedule`); the only place their names are listed."""
SCHEDULES: tuple[str, ...] = typing.get_args(ScheduleName)
SENSITIVE_KNEES = (7.0, 74.0)
"""SNRs where the 'sensitive' schedule changes segment (paper Table "Default SDE inference hyperparameters":
5% of the steps 0.01-7, 90% 7-74, 5% 74-100)."""
SENSITIVE_FRACTIONS = (0.05, 0.90)
"""Fractions of the steps spent in the first two segments (floored, at least one each)."""


# -- training ----------------------------------------------------------------------------------------
def sample_lognormal(cfg: SNRConfig, batch: int, length: int, generator: torch.Generator | None = None,
                     device: str | torch.device = "cpu") -> torch.Tensor:
    """LogNormal(mu, sigma) clamped above at `lognormal_clip`: per sequence (broadcast over L) or per token."""
    shape = (batch, length) if cfg.lognormal_per_token else (batch, 1)
    n = torch.randn(shape, generator=generator, device=device)
    g = (cfg.lognormal_mu + cfg.lognormal_sigma * n).exp().clamp_max(cfg.lognormal_clip)
    return g.expand(batch, length).clone()


def sample_roar(cfg: SNRConfig, batch: int, length: int, generator: torch.Generator | None = None,
                device: str | torch.device = "cpu") -> torch.Tensor:
    """Smoothed ROAR: per sequence k ~ U{0..L-1} random positions are clear (gamma ~ U[80, 100]), the rest
    unknown (gamma ~ U[0, 1))."""
    k = torch.randint(0, length, (batch, 1), generator=generator, device=device)
    ranks = torch.rand(batch, length, generator=generator, device=device).argsort(dim=-1).argsort(dim=-1)
    clear = ranks < k
    u_clear = torch.rand(batch, length, generator=generator, device=device)
    u_unknown = torch.rand(batch, length, generator=generator, device=device)
    g_clear = cfg.roar_clear_low + (cfg.roar_clear_high - cfg.roar_clear_low) * u_clear
    g_unknown = cfg.roar_unknown_high * u_unknown
    return torch.where(clear, g_clear, g_unknown)


def sample_training_snr(cfg: SNRConfig, batch: int, length: int, generator: torch.Generator | None = None,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """(B, L) training SNRs; in the mixture, each *sequence* is ROAR with probability `roar_prob`."""
    if batch < 1 or length < 1:
        raise ValueError(f"need batch >= 1 and length >= 1, got {batch}, {length}")
    if cfg.distribution == "lognormal":
        return sample_lognormal(cfg, batch, length, generator, device)
    if cfg.distribution == "roar":
        return sample_roar(cfg, batch, length, generator, device)
    ln = sample_lognormal(cfg, batch, length, generator, device)
    roar = sample_roar(cfg, batch, length, generator, device)
    use_roar = torch.rand(batch, 1, generator=generator, device=device) < cfg.roar_prob
    return torch.where(use_roar, roar, ln)


# -- inference ---------------------------------------------------------------------------------------
def _log_segment(a: float, b: float, n: int) -> list[float]:
    """n points after `a`, log-uniform from a to b (the last is exactly b)."""
    if n <= 0:
        return []
    pts = [a * (b / a) ** (i / n) for i in range(1, n)]
    return pts + [b]


def _floor(x: float) -> int:
    return int(math.floor(x + 1e-9))


def sensitive_counts(steps: int) -> tuple[int, int, int]:
    """The authors' step split n1 = max(1, floor(0.05 S)), n2 = max(1, floor(0.9 S)), n3 = S - n1 - n2."""
    n1 = max(1, _floor(SENSITIVE_FRACTIONS[0] * steps))
    n2 = max(1, _floor(SENSITIVE_FRACTIONS[1] * steps))
    if n1 + n2 > steps:  # S = 1: a single jump over the whole low range
        n1, n2 = 0, steps
    return n1, n2, steps - n1 - n2


def check_schedule(name: str, gamma_min: float, gamma_max: float) -> None:
    """ConfigError unless `name` is a schedule and [gamma_min, gamma_max] suits it (the knees lie inside)."""
    if name not in SCHEDULES:
        raise ConfigError(f"schedule={name!r} is not valid; expected one of {list(SCHEDULES)}")
    if not 0 < gamma_min < gamma_max:
        raise ConfigError(f"need 0 < gamma_min < gamma_max, got {gamma_min!r}, {gamma_max!r}")
    k1, k2 = SENSITIVE_KNEES
    if name in ("sensitive", "paper-exact") and not gamma_min < k1 < k2 < gamma_max:
        raise ConfigError(f"schedule={name!r} has knees at gamma {k1:g} and {k2:g}: it needs gamma_min < {k1:g} and "
                          f"gamma_max > {k2:g}, got {gamma_min!r}, {gamma_max!r} (use schedule='uniform' for other ranges)")


def snr_schedule(name: str, steps: int, gamma_min: float = 0.01, gamma_max: float = 100.0) -> torch.Tensor:
    """Increasing SNR grid of steps + 1 float64 points.

    - 'sensitive': log-uniform segments gamma_min -> 7 -> 74 -> gamma_max with the authors' floors, so a
      run with S <= 8 steps (NFE <= 16) has no third segment and ends at 74;
    - 'paper-exact': the same split, but when the third segment is empty the middle one ends at gamma_max
      (the paper's "0.01 to 100" always holds);
    - 'uniform': log-uniform gamma_min -> gamma_max.
    """
    if steps < 1:
        raise ConfigError(f"steps={steps} must be >= 1")
    check_schedule(name, gamma_min, gamma_max)
    if name == "uniform":
        pts = [gamma_min] + _log_segment(gamma_min, gamma_max, steps)
    else:  # 'sensitive' / 'paper-exact'
        k1, k2 = SENSITIVE_KNEES
        n1, n2, n3 = sensitive_counts(steps)
        end2 = gamma_max if (name == "paper-exact" and n3 == 0) else k2
        pts = [gamma_min] + _log_segment(gamma_min, k1, n1)
        pts += _log_segment(pts[-1], end2, n2) + _log_segment(k2, gamma_max, n3)
    return torch.tensor(pts, dtype=torch.float64)
