"""Guards that watch a sampler run and stop it when its numbers are broken (NaN/inf from damaged or diverged weights).

Every caller that runs samplers over user prompts (`generate`, eval, the server) uses these, so a broken model fails
the same way everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from ..backbones.base import Backbone
from ..model import DSLModel

__all__ = ["NonFiniteLogitsError", "NonFiniteStateError", "check_finite_first_forward", "check_finite_state"]


class NonFiniteLogitsError(ValueError):
    """The model's first forward pass of a sampler run produced NaN/inf logits (damaged or diverged weights)."""


@contextlib.contextmanager
def check_finite_first_forward(model: DSLModel | Backbone) -> Iterator[None]:
    """Inside the block, the first backbone forward pass is checked for non-finite logits (one `isfinite` over the
    last position, which left padding never covers); a NaN/inf raises NonFiniteLogitsError at once."""
    backbone = model.backbone if isinstance(model, DSLModel) else model
    def hook(_module: torch.nn.Module, _inputs: object, output: object) -> None:
        handle.remove()
        logits = output[0] if isinstance(output, (tuple, list)) else output
        if torch.is_tensor(logits) and logits.dim() == 3 and not bool(torch.isfinite(logits[:, -1]).all()):
            raise NonFiniteLogitsError("the model's first forward pass produced non-finite (NaN/inf) logits: its "
                                       "weights are damaged or come from a diverged training run")

    handle = backbone.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class NonFiniteStateError(ValueError):
    """A sampler's state or logits became NaN/inf during a run; the message names the settings involved."""


def check_finite_state(values: torch.Tensor, what: str, settings: Mapping[str, object]) -> None:
    """Raise NonFiniteStateError naming `settings` unless every element of `values` is finite (one reduction)."""
    if not bool(torch.isfinite(values).all()):
        shown = ", ".join(f"{k}={v!r}" for k, v in settings.items())
        raise NonFiniteStateError(f"the {what} became non-finite (NaN/inf) with {shown}: these settings leave the "
                                  f"range float32 can hold for this model (lower them), or its weights are damaged")
