"""Step observers built on the samplers' one callback protocol (`StepInfo`): a progress bar and a combinator.

A sampler's `progress=True` is a `StepProgress` chained before the caller's callback; the NaN guard
(`guards.FiniteLogitsGuard`), the server's stream, deadlines and logprobs and the UI's trace are further observers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import StepCallback, StepInfo

__all__ = ["StepProgress", "chain_callbacks", "with_progress"]


class StepProgress:
    """A tqdm bar over a sampler run's steps, advanced by its step callback (the SDE's decode call is no step)."""

    def __init__(self, desc: str):
        self.desc = desc
        self.bar: Any = None

    def __call__(self, info: StepInfo) -> None:
        if info.decode:
            return
        if self.bar is None:
            from .progress import progress

            self.bar = progress(total=info.total_steps, desc=self.desc)
        self.bar.update(1)
        if info.step + 1 >= info.total_steps:
            self.bar.close()


def chain_callbacks(*callbacks: StepCallback | None) -> Callable[[StepInfo], None] | None:
    """One callback calling each given one in order (None entries skipped; None when nothing is left)."""
    live = [c for c in callbacks if c is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def chained(info: StepInfo) -> None:
        for c in live:
            c(info)

    return chained


def with_progress(callback: StepCallback | None, progress: bool, desc: str) -> StepCallback | None:
    """The sampler's callback with a progress bar in front when `progress`."""
    return chain_callbacks(StepProgress(desc), callback) if progress else callback
