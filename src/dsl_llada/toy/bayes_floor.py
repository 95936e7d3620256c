"""The Bayes floor of the toy world's training objectives and each model's excess loss over it.

On held-out SFT conversations (chat prompt, response, end of turn, EOS padding: what the demo trains on) the
oracle's expected cross-entropy at a corruption level is the lowest loss any model can reach there. A model's
cross-entropy on the *same* draws minus the oracle's is its excess loss: the part of its loss that training can still
remove. Two curves:

- DSL: per-sequence SNR γ on a grid; z = γ e_x + √γ ε formed by the DSL objective's own `noisy_states`, with the
  model's noise table, the prompt clean (as the objective with prompt masking); cross-entropy over the positions
  after the prompt. The oracle reads the same z through the same noise table (`oracle_dsl_model`).
- MDM: mask rate p on a grid; each position after the prompt masked with probability p (the same coins for the
  model and the oracle); cross-entropy over the masked positions.

The draws and the oracle run on the CPU; a model on another device reads the same draws there.

Plus one number per DSL model: the excess loss averaged over the training SNR distribution (`SNRConfig`, drawn as the
objective draws it), the point a training stage is measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.backbones.base import Backbone, SpecialTokens, model_device
from ..config import SNRConfig
from ..core.converter import noisy_states
from ..core.model import DSLModel
from ..snr import sample_training_snr
from .oracle import oracle_dsl_model
from .world import ToyWorld

__all__ = ["DSL_SNRS", "MASK_RATES", "LossPoint", "dsl_curve", "dsl_excess", "mdm_curve"]

DSL_SNRS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""The SNR grid of the DSL curve: from 'almost nothing known' to 'almost every token clear' for a 177-token world."""
MASK_RATES: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
"""The mask-rate grid of the MDM curve."""
CHUNK = 64
"""Conversations per forward."""


@dataclass(frozen=True)
class LossPoint:
    """Mean cross-entropy (nats per scored position) of a model and of the oracle on the same draws."""

    level: float
    """γ (DSL) or the mask rate (MDM)."""
    model_ce: float
    oracle_ce: float
    n: int
    """Scored positions."""

    @property
    def excess(self) -> float:
        return self.model_ce - self.oracle_ce

    def as_dict(self) -> dict[str, float]:
        return {"level": self.level, "model_ce": self.model_ce, "oracle_ce": self.oracle_ce, "excess": self.excess,
                "n": self.n}


def _response(ids: torch.Tensor, prompt_length: torch.Tensor) -> torch.Tensor:
    """(N, T) bool: the positions after each prompt (the objective's eligible positions)."""
    return torch.arange(ids.shape[1])[None, :] >= prompt_length[:, None]


def _ce_sum(logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor) -> float:
    return float(F.cross_entropy(logits[where].double(), ids[where], reduction="sum"))


@torch.no_grad()
def _dsl_point(model: DSLModel, oracle: DSLModel, ids: torch.Tensor, plen: torch.Tensor, gamma_of, seed: int,
               level: float) -> LossPoint:
    gen = torch.Generator().manual_seed(seed)
    m_sum = o_sum = 0.0
    n = 0
    E = model.unit_noise()
    dev, E_cpu = E.device, E.cpu()
    for lo in range(0, ids.shape[0], CHUNK):
        x, p = ids[lo: lo + CHUNK], plen[lo: lo + CHUNK]
        resp = _response(x, p)
        gamma = gamma_of(x.shape[0], x.shape[1], gen)
        z = noisy_states(E_cpu, x, gamma, gen)  # drawn on the CPU: the same z whatever the model's device
        m_sum += _ce_sum(model.logits_from_states(x.to(dev), z.to(dev), resp.to(dev), E=E).cpu(), x, resp)
        o_sum += _ce_sum(oracle.logits_from_states(x, z, resp), x, resp)
        n += int(resp.sum())
    return LossPoint(level, m_sum / n, o_sum / n, n)


def _oracle_for(model: DSLModel, world: ToyWorld, special: SpecialTokens) -> DSLModel:
    return oracle_dsl_model(world, special, model.unit_noise().detach().cpu())


def dsl_curve(model: DSLModel, world: ToyWorld, special: SpecialTokens, ids: torch.Tensor, prompt_length: torch.Tensor,
              snrs: Sequence[float] = DSL_SNRS, seed: int = 0) -> list[LossPoint]:
    """Model and oracle cross-entropy at each per-sequence SNR (same z for both)."""
    oracle = _oracle_for(model, world, special)
    return [_dsl_point(model, oracle, ids, prompt_length,
                       lambda b, t, g, s=float(s): torch.full((b, t), s), seed + k, float(s))
            for k, s in enumerate(snrs)]


def dsl_excess(model: DSLModel, world: ToyWorld, special: SpecialTokens, ids: torch.Tensor, prompt_length: torch.Tensor,
               snr: SNRConfig | None = None, seed: int = 0) -> LossPoint:
    """Model and oracle cross-entropy with γ drawn from the training SNR distribution (`level` is NaN)."""
    cfg = snr or SNRConfig()
    return _dsl_point(model, _oracle_for(model, world, special), ids, prompt_length,
                      lambda b, t, g: sample_training_snr(cfg, b, t, g), seed, float("nan"))


@torch.no_grad()
def mdm_curve(model: DSLModel | Backbone, world: ToyWorld, special: SpecialTokens, ids: torch.Tensor,
              prompt_length: torch.Tensor, rates: Sequence[float] = MASK_RATES, seed: int = 0) -> list[LossPoint]:
    """Model and oracle cross-entropy on masked positions at each mask rate (same masks for both). `model` is a
    backbone or anything with `logits_from_ids` (a DSLModel's discrete path)."""
    from .oracle import ToyOracle

    oracle = ToyOracle(world, special)
    dev = model_device(model)
    points = []
    for k, rate in enumerate(rates):
        gen = torch.Generator().manual_seed(seed + k)
        m_sum = o_sum = 0.0
        n = 0
        for lo in range(0, ids.shape[0], CHUNK):
            x, p = ids[lo: lo + CHUNK], prompt_length[lo: lo + CHUNK]
            masked = (torch.rand(x.shape, generator=gen) < rate) & _response(x, p)
            noisy = torch.where(masked, torch.full_like(x, special.mask), x)
            m_sum += _ce_sum(model.logits_from_ids(noisy.to(dev)).cpu(), x, masked)
            o_sum += _ce_sum(oracle.logits_from_ids(noisy), x, masked)
            n += int(masked.sum())
        points.append(LossPoint(float(rate), m_sum / max(n, 1), o_sum / max(n, 1), n))
    return points
