"""Which positions' logits a discrete sampler step needs, so the backbone's output head runs on those rows only."""

from __future__ import annotations

from collections.abc import Callable

import torch


def block_logits(forward: Callable[..., torch.Tensor], x: torch.Tensor, attention_mask: torch.Tensor | None,
                 lo: int, hi: int, mask_id: int, *, masked_only: bool) -> torch.Tensor:
    """fp32 logits (B, hi - lo, V) of the block [lo, hi) of x.

    With `masked_only`, the head runs only on the block's columns where some row still holds [MASK] (the only
    positions a plain LLaDA step reads); the rows of fully committed columns are zeros (finite, and never read:
    their confidences are replaced by -inf before the commit). `forward(x, attention_mask, positions=...)`.
    """
    if masked_only:
        cols = (x[:, lo:hi] == mask_id).any(0).nonzero().squeeze(1)
        if cols.numel() < hi - lo:
            sub = forward(x, attention_mask, positions=cols + lo).float()
            out = sub.new_zeros((x.shape[0], hi - lo, sub.shape[-1]))
            out[:, cols] = sub
            return out
    return forward(x, attention_mask, positions=slice(lo, hi)).float()
