"""Guards that watch a sampler run and stop it when its numbers are broken (NaN/inf from damaged or diverged weights).

Guards are step callbacks (`StepInfo`, the samplers' one observer protocol), so they see the logits every sampler
computes whatever the key/value-cache mode; no forward hooks. Every caller that runs samplers over user prompts
(`generate`, eval, the server) uses these, so a broken model fails the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .common import StepInfo
from .observers import chain_callbacks

__all__ = ["WEIGHTS_MESSAGE", "FiniteLogitsGuard", "NonFiniteLogitsError", "NonFiniteStateError", "chain_callbacks",
           "check_finite_state", "has_broken_logits"]


class NonFiniteLogitsError(ValueError):
    """The model's first step of a sampler run produced NaN/+inf logits (damaged or diverged weights)."""


WEIGHTS_MESSAGE = ("the model's first forward pass produced non-finite (NaN/inf) logits: its weights are damaged or "
                   "come from a diverged training run")


def has_broken_logits(logits: torch.Tensor) -> bool:
    """NaN or +inf anywhere (the samplers set banned ids, [MASK] included, to -inf on purpose: that is not broken)."""
    return bool(torch.isnan(logits).any() or torch.isposinf(logits).any())


class FiniteLogitsGuard:
    """A step callback that checks the logits of a run's first step (one pass over one (B, W, V) tensor) and raises
    NonFiniteLogitsError at once when they hold NaN/+inf. Use one guard per sampler call."""

    def __init__(self) -> None:
        self.checked = False

    def __call__(self, info: StepInfo) -> None:
        if self.checked or info.logits is None:
            return
        self.checked = True
        if has_broken_logits(info.logits):
            raise NonFiniteLogitsError(WEIGHTS_MESSAGE)


class NonFiniteStateError(NonFiniteLogitsError):
    """A sampler's state or logits became NaN/inf during a run; the message names the settings involved. A kind of
    NonFiniteLogitsError: a sampler's own check can see broken logits at the first step before the step callback's
    guard does, and callers handle both the same way."""


def check_finite_state(values: torch.Tensor, what: str, settings: Mapping[str, object]) -> None:
    """Raise NonFiniteStateError naming `settings` unless every element of `values` is finite (one reduction)."""
    if not bool(torch.isfinite(values).all()):
        shown = ", ".join(f"{k}={v!r}" for k, v in settings.items())
        raise NonFiniteStateError(f"the {what} became non-finite (NaN/inf) with {shown}: these settings leave the "
                                  f"range float32 can hold for this model (lower them), or its weights are damaged")
