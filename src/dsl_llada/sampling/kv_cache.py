"""Approximate key/value caching for samplers that work on one window (block) of the sequence at a time.

Fast-dLLM's prefix and dual caches, for Block SDE and block remasking: at the first model call of a window (and
every `refresh` calls after it) the backbone runs over the whole sequence and every layer's keys/values are kept;
the calls in between recompute only
- 'prefix': the window and everything after it, reusing the cached keys/values of the positions before it
  (prompt and committed blocks);
- 'dual': the window alone, reusing the cached keys/values before *and* after it (future [MASK] positions).
The reused keys/values are those of the last full forward, so they miss what the window changed since (in a
bidirectional model the prompt attends to the response): the logits are approximate. `refresh=1` runs the full
forward at every call (exact); `refresh=0` only at each window's first call. Off by default (`kv_cache='off'`);
docs/benchmarks/cpu-sampling.md measures what it costs on the toy world with exact likelihood.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core.backbones.base import Backbone, KVCache, Positions
from ..config import check_cache_options
from ..errors import ConfigError


class WindowKVCache:
    """A forward `(x, attention_mask, positions=...) -> logits` with approximate key/value reuse.

    `x` is the whole sequence (embeddings, or ids when `embed` is given); `start_window(lo, hi)` names the window the
    following calls work on (and forces a full forward at the next call). `positions` must lie in the rows the
    call recomputes. `full_forwards` / `window_forwards` count the two kinds of calls.
    """

    def __init__(self, backbone: Backbone, mode: str, refresh: int, *,
                 embed: Callable[[torch.Tensor], torch.Tensor] | None = None):
        check_cache_options(mode, refresh)
        if mode == "off":
            raise ValueError("WindowKVCache needs kv_cache 'prefix' or 'dual'")
        if not getattr(backbone, "supports_kv_cache", False):
            family = getattr(backbone, "family", type(backbone).__name__)
            raise ConfigError(f"kv_cache={mode!r} needs a backbone with a key/value cache (the native LLaDA backbone); "
                              f"the {family!r} backbone has none: use kv_cache='off'")
        self.backbone, self.mode, self.refresh, self.embed = backbone, mode, refresh, embed
        self.lo = self.hi = 0
        self._cache: KVCache | None = None
        self._calls = 0
        self.full_forwards = 0
        self.window_forwards = 0

    def start_window(self, lo: int, hi: int) -> None:
        """The next calls work on rows [lo, hi); the first of them runs the full forward."""
        self.lo, self.hi = lo, hi
        self._cache, self._calls = None, 0

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep the cached keys/values of the batch rows at positions `keep` only (rows left the batch)."""
        if self._cache is not None:
            c = self._cache
            self._cache = KVCache([k[keep] for k in c.keys], [v[keep] for v in c.values], c.length)

    def __call__(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 positions: Positions = None) -> torch.Tensor:
        emb = self.embed(x) if self.embed is not None else x
        full = self._cache is None or (self.refresh > 0 and self._calls % self.refresh == 0)
        self._calls += 1
        if full:
            self.full_forwards += 1
            logits, self._cache = self.backbone.forward_cached(emb, attention_mask, positions=positions)
            return logits
        self.window_forwards += 1
        rows_hi = self.hi if self.mode == "dual" else emb.shape[1]
        logits, _ = self.backbone.forward_cached(emb[:, self.lo:rows_hi], attention_mask,
                                                 positions=_shift(positions, self.lo, rows_hi),
                                                 cache=self._cache, start=self.lo)
        return logits


def _shift(positions: Positions, lo: int, hi: int) -> Positions:
    """Whole-sequence positions -> positions within the recomputed rows [lo, hi) (ValueError outside them)."""
    if positions is None:
        raise ValueError("a cached window forward needs explicit positions inside the window")
    if isinstance(positions, slice):
        if positions.step not in (None, 1) or positions.start is None or positions.stop is None:
            raise ValueError(f"positions {positions!r}: only a contiguous slice with start and stop is supported")
        if not lo <= positions.start <= positions.stop <= hi:
            raise ValueError(f"positions [{positions.start}, {positions.stop}) are outside the recomputed rows [{lo}, {hi})")
        return slice(positions.start - lo, positions.stop - lo)
    idx = positions.to(torch.long)
    if idx.numel() and not (int(idx.min()) >= lo and int(idx.max()) < hi):
        raise ValueError(f"positions {idx.tolist()} are outside the recomputed rows [{lo}, {hi})")
    return idx - lo
