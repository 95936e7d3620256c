"""The SDE denoiser ê(y, γ) as one object, shared by the SDE samplers, tests and benchmarks.

One evaluation (paper Algorithm 2, "construct converter input" to "denoiser from Logits"; ê is §3.2's
clean-token embedding estimate):
    h      = converter(γ · y, E, β_inf)                 noisy response states -> backbone input embeddings
    logits = backbone([context | h | future])[window]   clean context before, [MASK] embeddings after (Block SDE)
    ê      = Σ_{v in top-M} softmax(logits)_v E_v       the top-M renormalised posterior mean over the noise table

`Denoiser.logits` is the single place that decides which positions get logits: the backbone is asked for the
window's rows only (`positions=`), so its final norm and output head skip the context and future positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..core.backbones.base import compiled
from ..core.model import DSLModel
from ..core.numerics import Workspace
from .common import ForwardCounter
from .kv_cache import WindowKVCache


def scale_states(y: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """γ · y, the converter's input: one SNR for every row (a float), or one per row (a (B,) tensor, which the
    step-level engine uses for rows at different points of their SNR grids). A row's value is the same either way:
    a float γ is rounded once to y's dtype before the product, as a (B,) tensor of the same values is."""
    if isinstance(gamma, torch.Tensor):
        if gamma.dim() != 1 or gamma.shape[0] != y.shape[0]:
            raise ValueError(f"a per-row gamma must be a (B,) tensor with B = {y.shape[0]} rows, "
                             f"got shape {tuple(gamma.shape)}")
        return gamma.to(device=y.device, dtype=y.dtype).view(-1, *([1] * (y.dim() - 1))) * y
    return gamma * y


@dataclass(frozen=True, eq=False)
class Denoiser:
    """ê(y, γ) for the response window that follows `context`; calling it returns (ê, logits).

    y: (B, W, d) normalised noisy states of the W window positions; γ: the SNR of this evaluation, one float for
    every row or a (B,) tensor with one SNR per row (`scale_states`).

    The fields are never reassigned (`frozen`), but three of them are run state that every call changes and that
    the `with_context` copies share: `forward` counts the passes, `cache` moves to the window being denoised, and
    `workspace` holds reused scratch buffers. So one Denoiser belongs to one sampler run (and one thread); build a
    new one per run with `for_model`.
    """

    model: DSLModel
    context: torch.Tensor
    """(B, C, H) clean input embeddings before the window (prompt, and committed blocks in Block SDE)."""
    noise_table: torch.Tensor
    """E, the (V+1, d) unit-norm noise embedding (`model.unit_noise()`), fixed for a whole sampler call."""
    beta: float
    """β_inf, the converter sharpness at inference (`inference_beta`)."""
    top_m: int
    """Tokens kept (renormalised) in the posterior mean; 0 = full softmax."""
    attention_mask: torch.Tensor | None
    """HF keep-mask over [context | window | future] (None when nothing is padded)."""
    forward: ForwardCounter
    """The backbone, wrapped so that every executed forward pass is counted (shared across blocks)."""
    future: torch.Tensor | None = None
    """(B, F, H) input embeddings after the window (Block SDE, paper Appendix "Block SDE: Untapped Inference
    Headroom": the converter's [MASK] slot for future blocks); None = nothing after the window."""
    tolerance: float = 0.0
    """Sparse converter at inference: drop slots whose probability mass is below this (0 = the exact dense map)."""
    cache: WindowKVCache | None = None
    """Approximate key/value caching around the window (`kv_cache.py`); None = every call is a full forward. When
    set, `forward` counts calls through it."""
    workspace: Workspace = field(default_factory=Workspace)
    """Scratch buffers reused by every call of this denoiser and its `with_context` copies (the converter's
    (W, V+1) slot logits: no fresh allocation, so no page faults, per call)."""

    @classmethod
    def for_model(cls, model: DSLModel, context: torch.Tensor, *, beta: float, top_m: int,
                  attention_mask: torch.Tensor | None = None, future: torch.Tensor | None = None,
                  tolerance: float = 0.0, compile: bool = False, kv_cache: str = "off",
                  cache_refresh: int = 0) -> "Denoiser":
        """A denoiser with a fresh forward counter around `model.backbone` (its `torch.compile`d call when
        `compile`, an approximate key/value cache when `kv_cache` is not 'off') and E = `model.unit_noise()`."""
        cache = None if kv_cache == "off" else WindowKVCache(model.backbone, kv_cache, cache_refresh)
        backbone = cache if cache is not None else compiled(model.backbone) if compile else model.backbone
        return cls(model, context, model.unit_noise(), beta, top_m, attention_mask, ForwardCounter(backbone),
                   future, tolerance, cache)

    def with_context(self, context: torch.Tensor, future: torch.Tensor | None = None) -> "Denoiser":
        """The same denoiser (same E, β, counter) around another window (Block SDE: the next block)."""
        return replace(self, context=context, future=future)

    def select_rows(self, keep: torch.Tensor) -> "Denoiser":
        """The same denoiser for the batch rows at positions `keep` only (rows left the batch, `StepInfo.drop`):
        context, future and attention mask are index-selected; the key/value cache, shared with the `with_context`
        copies, is selected in place (so call this once per drop, on the denoiser in use)."""
        if self.cache is not None:
            self.cache.select_rows(keep)
        mask = None if self.attention_mask is None else self.attention_mask[keep]
        future = None if self.future is None else self.future[keep]
        return replace(self, context=self.context[keep], attention_mask=mask, future=future)

    @property
    def forward_passes(self) -> int:
        """Backbone forwards executed so far through this denoiser and its `with_context` copies."""
        return self.forward.count

    def logits(self, y: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
        """(B, W, V) backbone logits at the window positions for states y at SNR gamma (one forward pass; the
        backbone applies its final norm and output head to the window rows only)."""
        h = self.model.converter(scale_states(y, gamma), self.noise_table, self.beta, tolerance=self.tolerance,
                                 workspace=self.workspace).to(self.context.dtype)
        parts = [self.context, h] if self.future is None else [self.context, h, self.future]
        start = self.context.shape[1]
        if self.cache is not None and (self.cache.lo, self.cache.hi) != (start, start + y.shape[1]):
            self.cache.start_window(start, start + y.shape[1])  # a new window (Block SDE: the next block)
        return self.forward(torch.cat(parts, dim=1), self.attention_mask, positions=slice(start, start + y.shape[1]))

    def __call__(self, y: torch.Tensor, gamma: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ê, logits): the top-M posterior mean over E (B, W, d) and the window logits it came from."""
        logits = self.logits(y, gamma)
        return self.model.posterior_mean(logits, self.top_m, self.noise_table, workspace=self.workspace), logits
