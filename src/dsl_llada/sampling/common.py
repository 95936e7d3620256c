"""Shared sampler plumbing: left-padded prompt batches, per-row RNG, outputs, EOS truncation, callbacks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.backbones.base import context_limit


@dataclass
class PromptBatch:
    """Left-padded prompt ids (B, P) with an HF keep-mask (1 = token, 0 = pad).

    `context_checked`: the caller has already checked every prompt + gen_length against the model's context, with
    an error that names the prompt (`run_batches`, the evaluation runner and the server check each request once at
    its entry); the samplers then do not check it again. Left False, the samplers check it themselves."""

    ids: torch.Tensor
    attention_mask: torch.Tensor
    context_checked: bool = False

    @classmethod
    def from_lists(cls, prompts: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu", *,
                   context_checked: bool = False) -> "PromptBatch":
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
        return cls(ids.to(device), mask.to(device), context_checked)

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    def to(self, device: str | torch.device) -> "PromptBatch":
        return PromptBatch(self.ids.to(device), self.attention_mask.to(device), self.context_checked)

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

    def select(self, keep: Sequence[int]) -> None:
        """Keep only the rows at positions `keep` (rows left the batch, `StepInfo.drop`). With one generator per row
        the remaining rows draw exactly what they would have drawn; with one shared generator (or none) the next
        draws come from one smaller tensor, so they differ from an undropped run's."""
        if self.rows is not None:
            self.rows = [self.rows[i] for i in keep]
        self.batch = len(keep)

    def subset(self, rows: Sequence[int]) -> "RowRNG":
        """The draws of only the rows at positions `rows` (rows sitting a step out): with one generator per row the
        others' generators are left untouched, so each row draws what it would draw alone; a shared generator (or
        none) is shared by the subset too."""
        sub = RowRNG(self.gen, len(rows))
        if self.rows is not None:
            sub.rows = [self.rows[i] for i in rows]
        return sub

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


class StepInfo:
    """What a sampler tells a per-step callback (the one observer protocol: progress, traces, guards, streams).

    Everything here is a view of tensors the sampler computed anyway (no copies, no extra model work); a callback
    must not modify them. A callback may keep them past its step: the discrete samplers write each step's `logits`
    into a buffer they reuse at the next step only when nothing else holds it (`positions.LogitsBuffer`,
    copy-on-keep), so kept logits are never overwritten; keeping them costs the run a fresh buffer per kept step.
    `tokens` may be handed over as a zero-argument function: it is then computed on first read only (a guard that
    reads just the logits costs the SDE samplers no argmax). `logits` covers the response positions `window` =
    [lo, hi) only.

    Fields: `step` (0-based; Block SDE counts over all blocks) and `total_steps`; `tokens` (B, L): the current best
    token per response position (committed tokens, [MASK] elsewhere, for the discrete samplers; the argmax for the
    SDE); `gamma`: the SNR reached after this step (SDE); `time`: the discrete samplers' diffusion time after this
    step (1 = all masked, 0 = clean); `committed` (B, L) bool: positions whose token is final at this step (ReMDM's
    loop aside; the SDE commits nothing before its decode, Block SDE the blocks already decoded);
    `newly_committed` (B, L) bool: positions committed by this very step; `logits` (B, hi - lo, V): the step's
    distribution over the vocabulary for the positions `window` (SDE: the corrector's or the decode's raw logits,
    whose softmax is the converter's posterior, the decoded token being the argmax with [MASK] excluded;
    discrete: the guided logits with banned ids at -inf, the committed token being the step's proposal; columns
    no row still masks may be zeros); `decode`: the SDE samplers' decode call after the last solver step of the
    response (or of each Block SDE block), not a solver step (`step` repeats the last step's index; callbacks
    counting steps skip it); `extra`: the sampler's own scalars.

    Rows leaving the batch: `rows` gives, for each row of this step's tensors, its index in the batch the sampler
    was called with (`range(B)` until a row leaves). A callback may call `drop(r, ...)` with such original
    indices: once every callback of this step has returned, the sampler removes those rows from all of its per-row
    state (ids or SDE state, prompt masks, generators, key/value caches) and continues with the others, which get
    exactly the tokens an undropped run gives them when each row has its own generator (`RowRNG`; up to the
    rounding a smaller batch shape may change in some kernels). Later steps' tensors hold only the remaining rows
    (`rows` maps them); the output keeps the original rows, the dropped ones listed in `SampleOutput.dropped`. The
    samplers honour drops at every step and at the SDE samplers' decode calls; a run whose rows are all dropped
    stops there.
    """

    __slots__ = ("step", "total_steps", "_tokens", "gamma", "extra", "time", "committed", "newly_committed",
                 "logits", "window", "decode", "rows", "dropping")

    def __init__(self, step: int, total_steps: int, tokens: torch.Tensor | Callable[[], torch.Tensor],
                 gamma: float | None = None, extra: dict[str, Any] | None = None, *, time: float | None = None,
                 committed: torch.Tensor | None = None, newly_committed: torch.Tensor | None = None,
                 logits: torch.Tensor | None = None, window: tuple[int, int] | None = None, decode: bool = False,
                 rows: Sequence[int] | None = None):
        self.step, self.total_steps, self._tokens = step, total_steps, tokens
        self.gamma, self.extra = gamma, {} if extra is None else extra
        self.time, self.committed, self.newly_committed = time, committed, newly_committed
        self.logits, self.window, self.decode = logits, window, decode
        self.rows: tuple[int, ...] | None = None if rows is None else tuple(rows)
        """Original batch index of each row of this step's tensors (None: the sampler does not say, no drops)."""
        self.dropping: set[int] = set()
        """Original row indices that callbacks asked to drop at this step (`drop`)."""

    def drop(self, *rows: int) -> None:
        """Ask the sampler to remove these rows (original batch indices, see `rows`) after this step."""
        if self.rows is None:
            raise ValueError("this sampler step does not support dropping rows (StepInfo.rows is None)")
        for r in rows:
            if r not in self.rows:
                raise ValueError(f"row {r!r} is not in this step's batch (rows {list(self.rows)})")
            self.dropping.add(int(r))

    @property
    def tokens(self) -> torch.Tensor:
        if not isinstance(self._tokens, torch.Tensor):
            self._tokens = self._tokens()
        return self._tokens

    def __repr__(self) -> str:
        return (f"StepInfo(step={self.step}, total_steps={self.total_steps}, gamma={self.gamma}, time={self.time}, "
                f"window={self.window}, decode={self.decode})")


StepCallback = Callable[[StepInfo], None]


class LiveRows:
    """The rows of a sampler call that are still in its batch (rows leave through `StepInfo.drop`).

    A sampler passes `rows` to each StepInfo, and after its callbacks calls `after(info, rng)`: None when nothing
    was dropped, else the positions (in this step's tensors) of the rows that stay, with which it index-selects
    the rest of its per-row state (the generators' rows are already selected). `expand` puts the final ids of the
    remaining rows back at their original positions.
    """

    def __init__(self, batch: int):
        self.batch = batch
        self.rows: list[int] = list(range(batch))

    def after(self, info: StepInfo, rng: RowRNG, device: torch.device | str | None = None) -> torch.Tensor | None:
        if not info.dropping:
            return None
        keep = [i for i, r in enumerate(self.rows) if r not in info.dropping]
        self.rows = [self.rows[i] for i in keep]
        rng.select(keep)
        return torch.tensor(keep, dtype=torch.long, device=device)

    @property
    def empty(self) -> bool:
        return not self.rows

    @property
    def dropped(self) -> list[int]:
        alive = set(self.rows)
        return [r for r in range(self.batch) if r not in alive]

    def expand(self, values: torch.Tensor, fill: int | float) -> torch.Tensor:
        """(n_alive, ...) -> (batch, ...): the remaining rows at their original positions, `fill` for dropped ones."""
        if len(self.rows) == self.batch:
            return values
        out = torch.full((self.batch, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
        out[torch.tensor(self.rows, dtype=torch.long, device=values.device)] = values
        return out


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
    dropped: list[int] = field(default_factory=list)
    """Rows a step callback removed from the batch (`StepInfo.drop`): their `ids` are [MASK] and `lengths` 0
    (trajectory snapshots hold [MASK] for them after they left)."""
    steps_per_block: torch.Tensor | None = None
    """(B, n_blocks) denoising steps each row took in each block (discrete remasking; data-dependent with a
    confidence threshold, where a batch runs each block until its slowest row is done); None for other samplers."""

    def responses(self) -> list[list[int]]:
        """Per row, the response ids truncated to `lengths` ([] for a dropped row, see `dropped`)."""
        return [row[: int(n)].tolist() for row, n in zip(self.ids, self.lengths)]


class ForwardCounter:
    """Counts backbone forward passes made through it."""

    def __init__(self, fn: Callable[..., torch.Tensor]):
        self.fn = fn
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.count += 1
        return self.fn(*args, **kwargs)


def check_context_fits(max_length: int | None, prompt_length: int, gen_length: int) -> None:
    """One clear error when prompt + response exceeds the model's context of `max_length` tokens (None: unknown)."""
    total = prompt_length + gen_length
    m = max_length
    if m is not None and total > m:
        raise ValueError(f"prompt length {prompt_length} + gen_length {gen_length} = {total} tokens exceeds the "
                         f"model's context of {m}; shorten the prompt or reduce gen_length to at most "
                         f"{m - prompt_length}")


def check_prompt_fits(model: Any, prompts: PromptBatch, gen_length: int) -> None:
    """The samplers' context check of a batch: skipped when its caller checked it already
    (`PromptBatch.context_checked`), else `check_context_fits` against the model's context."""
    if not prompts.context_checked:
        check_context_fits(context_limit(model), prompts.length, gen_length)
