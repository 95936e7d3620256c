"""CPU floating-point mode for inference: flush sub-normal numbers to zero in hardware for a sampler's duration.

At high SNR most entries of the converter's (V+1)-way softmax and of the posterior mean's top-M softmax underflow
into sub-normals (below 1.2e-38 in fp32), which make the following CPU matmuls slower. Zeroing them changes nothing
that fp32 can represent in the results (their total mass is below V * 1.2e-38), so the samplers run with the CPU's
flush-to-zero / denormals-are-zero mode on (`torch.set_flush_denormal`) and restore the previous mode afterwards.
Code paths that run outside this context (training) zero them explicitly instead (`converter.flush_tiny`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

_state = threading.local()


def _hardware_flushes() -> bool:
    """Whether this thread's CPU currently flushes sub-normals (a sub-normal result comes out as 0)."""
    tiny = torch.tensor([torch.finfo(torch.float32).tiny], dtype=torch.float32)
    return bool((tiny / 4).item() == 0.0)


def denormals_flushed() -> bool:
    """True inside `flush_denormals()` on a CPU that supports it (then explicit flushing can be skipped)."""
    return getattr(_state, "depth", 0) > 0


@contextmanager
def flush_denormals(enabled: bool = True) -> Iterator[bool]:
    """Flush sub-normals to zero in hardware (x86 FTZ/DAZ) inside the block; the previous mode is restored on exit.

    Yields whether hardware flushing is active (False when disabled or unsupported, e.g. on CPUs without the mode;
    callers then keep their explicit flush). Nesting is allowed. The mode is per thread: enter it in the thread
    that runs the model.
    """
    if not enabled:
        yield False
        return
    previous = _hardware_flushes()
    supported = torch.set_flush_denormal(True)
    if not supported:
        yield False
        return
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield True
    finally:
        _state.depth -= 1
        torch.set_flush_denormal(previous)


@contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """`torch.use_deterministic_algorithms(True)` inside the block; the previous setting (and its warn-only flag)
    is restored on exit. On the CPU some ops (in the DSL objective's backward) otherwise reduce in an order that
    depends on thread timing: two 2-thread runs of the demo's DSL stage with the same seed differed from step 4,
    and agree with this mode on (docs/toy-world.md)."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


F = TypeVar("F", bound=Callable[..., Any])


def denormals_flushed_during(fn: F) -> F:
    """Decorator: run `fn` inside `flush_denormals()` (the samplers use it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with flush_denormals():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class Workspace:
    """Scratch buffers reused across the calls of one sampler run (one per name, reallocated when the shape,
    dtype or device changes).

    On a CPU each fresh large tensor is new memory from the C allocator, and writing it first costs a page fault
    per 4 KiB: the converter's (L, V+1) slot logits are 16.8 MB at L = 128, V = 32,768 (about 4,100 faults per
    call). Reusing one buffer per name for a whole sampler call removes those faults; the buffers are freed with
    the workspace at the end of the call.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of `shape` (the same storage as the previous call of the same shape)."""
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf
