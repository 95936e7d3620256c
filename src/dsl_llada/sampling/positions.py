"""Which positions' logits a discrete sampler step needs, so the backbone's output head runs on those rows only,
and the one fp32 logits buffer a sampler run reuses for them across steps."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["LogitsBuffer", "block_logits"]


def _storage_users(t: torch.Tensor) -> int | None:
    """How many tensors (views included) share `t`'s storage; None when this torch cannot tell."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return None
    return int(use_count(t.untyped_storage()._cdata))


class LogitsBuffer:
    """One float32 buffer for the (B, W, V) block logits of a sampler run, reused from step to step.

    At batch 8 x W 64 x V 32k the block logits are 67 MB: allocated fresh every step they are above the allocator's
    mmap threshold, so each step maps new pages and page-faults on first touch (most of remasking's batch-8
    penalty, docs/benchmarks/cpu-sampling.md *Batching*). `view(B, W, V)` hands out a view of one flat buffer, grown only when
    a step needs more elements (a batch that loses rows keeps it).

    Copy-on-keep: a step callback may keep the logits it was shown (the `StepInfo`, the tensor, any view or a
    numpy array of it). Before reusing the buffer, `view` checks that no tensor besides the buffer itself still
    shares its storage; if one does, the kept values are left alone and a fresh buffer is allocated for this and
    later steps, so nothing a callback keeps is ever overwritten (tests/test_logits_buffer.py). The sampler
    must drop its own views of the previous step before the next `view` (else every step allocates, which is
    still correct, only slower). On a torch that cannot count a storage's users, every step allocates.
    """

    def __init__(self) -> None:
        self._flat: torch.Tensor | None = None
        self._idle: int | None = None
        self.allocations = 0
        """Buffers allocated so far (1 for a run where nothing kept a step's logits)."""

    def view(self, B: int, W: int, V: int, device: torch.device) -> torch.Tensor:
        """An uninitialised (B, W, V) float32 view of the buffer, not shared with anything handed out before
        that is still alive."""
        n = B * W * V
        flat = self._flat
        if flat is None or flat.numel() < n or flat.device != device or self._idle is None \
                or _storage_users(flat) != self._idle:
            flat = self._flat = torch.empty(n, dtype=torch.float32, device=device)
            self._idle = _storage_users(flat)  # the count with nothing handed out (the query itself holds one)
            self.allocations += 1
        return flat[:n].view(B, W, V)


def _column_runs(cols: list[int]) -> list[tuple[int, int]]:
    """Sorted column indices -> [(start, stop), ...] runs of consecutive columns."""
    runs: list[tuple[int, int]] = []
    for c in cols:
        if runs and runs[-1][1] == c:
            runs[-1] = (runs[-1][0], c + 1)
        else:
            runs.append((c, c + 1))
    return runs


def block_logits(forward: Callable[..., torch.Tensor], x: torch.Tensor, attention_mask: torch.Tensor | None,
                 lo: int, hi: int, mask_id: int, *, masked_only: bool,
                 buffer: LogitsBuffer | None = None) -> torch.Tensor:
    """fp32 logits (B, hi - lo, V) of the block [lo, hi) of x.

    With `masked_only`, the head runs only on the block's columns where some row still holds [MASK] (the only
    positions a plain LLaDA step reads); the rows of fully committed columns are zeros (finite, and never read:
    their confidences are replaced by -inf before the commit). `forward(x, attention_mask, positions=...)`.
    With `buffer`, the result is written into a view of it (see `LogitsBuffer`) instead of a fresh tensor,
    except when the head's own output already is the whole fp32 result (nothing to copy); the values are the same.
    """
    W = hi - lo
    if masked_only:
        cols = (x[:, lo:hi] == mask_id).any(0).nonzero().squeeze(1)
        if cols.numel() < W:
            sub = forward(x, attention_mask, positions=cols + lo)
            if buffer is None:
                out = sub.new_zeros((x.shape[0], W, sub.shape[-1]), dtype=torch.float32)
                out[:, cols] = sub.float()
                return out
            out = buffer.view(x.shape[0], W, sub.shape[-1], sub.device)
            kept = cols.tolist()
            j = 0
            for a, b in _column_runs(kept):  # one copy_ per run: converts the dtype in place, no fp32 temporary
                out[:, a:b].copy_(sub[:, j: j + b - a])
                j += b - a
            done = set(kept)
            for a, b in _column_runs([c for c in range(W) if c not in done]):
                out[:, a:b].zero_()
            return out
    logits = forward(x, attention_mask, positions=slice(lo, hi))
    if buffer is None or logits.dtype == torch.float32:
        return logits.float()
    out = buffer.view(logits.shape[0], W, logits.shape[-1], logits.device)
    out.copy_(logits)
    return out
