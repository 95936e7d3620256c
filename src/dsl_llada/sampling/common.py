"""Shared sampler plumbing: left-padded prompt batches, per-row RNG, outputs, EOS truncation, callbacks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PromptBatch:
    """Left-padded prompt ids (B, P) with an HF keep-mask (1 = token, 0 = pad)."""

    ids: torch.Tensor
    attention_mask: torch.Tensor

    @classmethod
    def from_lists(cls, prompts: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu") -> "PromptBatch":
        if len(prompts) == 0:
            raise ValueError("no prompts given: need at least one prompt")
        P = max(len(p) for p in prompts)
        if P == 0:
            raise ValueError("all prompts are empty; a prompt needs at least one token (e.g. BOS)")
        ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), P), dtype=torch.long)
        for i, p in enumerate(prompts):
            if len(p):
                ids[i, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
                mask[i, P - len(p):] = 1
        return cls(ids.to(device), mask.to(device))

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    def to(self, device: str | torch.device) -> "PromptBatch":
        return PromptBatch(self.ids.to(device), self.attention_mask.to(device))

    def full_attention_mask(self, gen_length: int) -> torch.Tensor | None:
        """Keep-mask for [prompt | response], or None when nothing is padded (lets backbones skip masking)."""
        if bool(self.attention_mask.all()):
            return None
        ones = torch.ones(self.batch_size, gen_length, dtype=self.attention_mask.dtype, device=self.ids.device)
        return torch.cat([self.attention_mask, ones], dim=1)


class RowRNG:
    """Random draws from one generator for the whole batch, or one generator per row.

    With one generator per row, row i's draws do not depend on the other rows, so a batch of padded prompts
    gives exactly the tokens of the same prompts run one by one with the same per-row generators.
    """

    def __init__(self, generator: torch.Generator | Sequence[torch.Generator] | None, batch: int):
        self.rows: list[torch.Generator] | None = None
        self.gen: torch.Generator | None = None
        if generator is None or isinstance(generator, torch.Generator):
            self.gen = generator
        else:
            if len(generator) != batch:
                raise ValueError(f"got {len(generator)} generators for a batch of {batch}; pass one per row or a single one")
            self.rows = list(generator)
        self.batch = batch

    def _draw(self, fn: Callable[..., torch.Tensor], shape: tuple[int, ...], device: torch.device | str | None,
              dtype: torch.dtype) -> torch.Tensor:
        # Draw on each generator's own device (a CPU generator with a CUDA model is the common case), then move:
        # the numbers depend only on the generator, not on where the model runs.
        if self.rows is None:
            gdev = self.gen.device if self.gen is not None else device
            return fn(shape, generator=self.gen, device=gdev, dtype=dtype).to(device)
        return torch.stack([fn(shape[1:], generator=g, device=g.device, dtype=dtype) for g in self.rows]).to(device)

    def randn(self, shape: tuple[int, ...], device: torch.device | str | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._draw(torch.randn, shape, device, dtype)

    def rand(self, shape: tuple[int, ...], device: torch.device | str | None = None,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._draw(torch.rand, shape, device, dtype)


def stop_lengths(ids: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """Per row, the index of the first stop token (EOS/EoT), or the full length when none occurs."""
    L = ids.shape[1]
    is_stop = torch.zeros_like(ids, dtype=torch.bool)
    for s in stop_ids:
        is_stop |= ids == s
    pos = torch.arange(L, device=ids.device).expand_as(ids)
    return torch.where(is_stop, pos, torch.full_like(pos, L)).min(dim=1).values


@dataclass
class StepInfo:
    """What a sampler tells a per-step callback."""

    step: int
    total_steps: int
    tokens: torch.Tensor
    """Current best token per response position (B, L): committed tokens (discrete) or argmax (SDE)."""
    gamma: float | None = None
    """SNR reached after this step (SDE samplers)."""
    extra: dict[str, Any] = field(default_factory=dict)


StepCallback = Callable[[StepInfo], None]


@dataclass
class SampleOutput:
    """Response tokens and accounting from one sampler call."""

    ids: torch.Tensor
    """(B, L) response tokens as decoded (before truncation)."""
    lengths: torch.Tensor
    """(B,) response length after truncation at the first EOS/EoT (L when truncation is off or none occurs)."""
    nfe: int
    """NFE of the whole response: the denoising steps' model evaluations, without the SDE's final decode (SDE:
    2S per window, so (L/B)·2S for Block SDE; discrete: steps). docs/samplers.md, "Accounting"."""
    forward_passes: int
    """Backbone forward passes actually executed (SDE: 2S + 1; CFG doubles the discrete count)."""
    trajectory: list[torch.Tensor] | None = None
    """Optional per-step (B, L) token snapshots."""
    config: dict[str, Any] = field(default_factory=dict)
    """The sampler config that produced this output."""

    def responses(self) -> list[list[int]]:
        """Per row, the response ids truncated to `lengths`."""
        return [row[: int(n)].tolist() for row, n in zip(self.ids, self.lengths)]


class ForwardCounter:
    """Counts backbone forward passes made through it."""

    def __init__(self, fn: Callable[..., torch.Tensor]):
        self.fn = fn
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.count += 1
        return self.fn(*args, **kwargs)


def check_prompt_fits(max_length: int | None, prompts: PromptBatch, gen_length: int) -> None:
    """One clear error when prompt + response exceeds the model's context of `max_length` tokens (None: unknown)."""
    total = prompts.length + gen_length
    m = max_length
    if m is not None and total > m:
        raise ValueError(f"prompt length {prompts.length} + gen_length {gen_length} = {total} tokens exceeds the "
                         f"model's context of {m}; shorten the prompt or reduce gen_length to at most {m - prompts.length}")
