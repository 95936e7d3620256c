"""A step-level sampling engine: requests join at any denoising step and leave when done (continuous batching).

The `sample_*` functions run one fixed batch from its first step to its last. `Engine` instead holds a set of live
rows, each with its own prompt, sampler config, generator and sampler state, and advances all of them by one
backbone forward pass per `step()` (a *tick*):

- DSL-SDE and Block SDE rows carry their noisy state y, their index on their own SNR grid and their Heun stage
  (predictor evaluation, corrector evaluation, or the final decode): a row at NFE 2S takes 2S + 1 ticks per window.
- Remasking rows (low-confidence / random, blocks, EOS bans, a confidence threshold, ReMDM) carry their ids, block,
  step inside the block and commit schedule: a row takes its step count in ticks (with a threshold, the steps its
  blocks actually needed).

Every tick is one batched forward over all live rows, whatever their sampler: each row contributes its input
embeddings (SDE rows: the converter's output for their y at their own SNR, next to the clean prompt; discrete rows:
the token embeddings of their ids; a classifier-free-guidance row also its prompt-masked copy), the sequences are
left-padded to the longest with an attention mask, and the output head runs on the union of the rows' windows
only. The converter runs once per group of SDE rows with the same beta_inf, tolerance and window width, with one
SNR per row (`denoiser.scale_states`); the posterior mean once per group with the same top-M and width. Rows with
`compile=True` go through the compiled backbone in a forward of their own (a compiled call and an eager call are
different programs). Approximate key/value caching (`kv_cache` other than 'off') is refused: its cache follows one
fixed batch through a window's steps, which rows joining and leaving at any step break; run such configs through
the `sample_*` functions.

A row's random draws come from its own generator, in the order the `sample_*` functions draw them, so its tokens
are those of the same request run alone, in a fixed batch or joined mid-way, up to the rounding a different batch
shape or padding can change in some kernels (docs/serving.md, *Batching*): the discrete samplers' tokens are the
same in every arrangement; an SDE row's continuous trajectory can move by that rounding, which on a chaotic
(untrained) model may flip a near-tied token.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core.backbones.base import FROM_MODEL, Backbone, FromModel, compiled, context_limit, model_device
from ..config import RemaskConfig, SDEConfig
from ..errors import ConfigError
from ..core.model import DSLModel
from ..core.numerics import Workspace, denormals_flushed_during
from .common import StepCallback, check_context_fits
from .denoiser import scale_states
from .engine_rows import EngineConfig, EngineResult, RemaskRow, Row, RowSequence, SDERow
from .sde import checked_beta

__all__ = ["Engine", "EngineConfig", "EngineResult"]

@dataclass
class _Pending:
    request_id: int
    tag: Any
    prompt: torch.Tensor
    config: EngineConfig
    generator: torch.Generator | None
    callback: StepCallback | None
    tokens: int


class Engine:
    """Continuous batching over every sampler: `submit` requests at any time, `step` runs one tick (one batched
    backbone forward over all live rows), finished rows come back from `step` as they finish.

    `model`: a DSLModel (every sampler) or a bare Backbone (remasking and ReMDM only). `max_rows` caps the live
    rows; `max_tokens` (optional) caps the batch tokens, prompt + response summed over live rows (a classifier-free
    guidance row counts twice: it runs two sequences). Pending requests are admitted first in, first out at the
    start of each tick while both caps hold; a request that could never fit (more tokens than `max_tokens`, or
    more than the model's context) is refused by `submit` with a ValueError. `context`: the model's longest
    prompt + response when the caller has it already (an opened model's `ModelHandle.context`; default: read from
    the model).

    A row's exception (non-finite state or logits, or its callback raising) ends that row only: its result carries
    `error` and `exception`, and the others go on. An exception of the shared forward pass propagates from `step`
    with every row's state as it was before the tick.
    """

    def __init__(self, model: DSLModel | Backbone, *, max_rows: int = 8, max_tokens: int | None = None,
                 context: int | None | FromModel = FROM_MODEL):
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows={max_rows!r} must be an int >= 1")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"max_tokens={max_tokens!r} must be an int >= 1, or None for no token cap")
        if not isinstance(model, (DSLModel, Backbone)):
            raise ConfigError(f"the engine needs a DSLModel or a Backbone, got {type(model).__name__}")
        self.model = model
        self.backbone: Backbone = model.backbone if isinstance(model, DSLModel) else model
        self.special = model.special
        self.device = model_device(model)
        self.max_rows, self.max_tokens = max_rows, max_tokens
        self.context = context_limit(model) if context is FROM_MODEL else context
        self._pending: deque[_Pending] = deque()
        self._live: list[Row] = []
        self._ids = itertools.count()
        self._noise: torch.Tensor | None = None
        self._workspace = Workspace()
        self.ticks = 0
        """Ticks run so far."""
        self.forward_passes = 0
        """Backbone forward calls made so far (one per tick, more when compiled and eager rows are both live)."""

    # -- the model pieces the rows share
    @property
    def dsl_model(self) -> DSLModel:
        assert isinstance(self.model, DSLModel)
        return self.model

    def grid(self, config: SDEConfig) -> tuple[float, ...]:
        """The SNR grid of `config` (`SDEConfig.snr_grid`: built once, when the config was made)."""
        return config.snr_grid

    def noise_table(self) -> torch.Tensor:
        if self._noise is None:
            self._noise = self.dsl_model.unit_noise()
        return self._noise

    # -- requests
    def submit(self, prompt: Sequence[int] | torch.Tensor, config: EngineConfig, *,
               generator: torch.Generator | None = None, callback: StepCallback | None = None,
               tag: Any = None, context_checked: bool = False) -> int:
        """Queue a request; it joins the running batch at the next tick with room. Returns its request id.

        `prompt`: token ids (at least one). `config`: an SDEConfig or RemaskConfig. `generator`: the row's own
        random generator (None: torch's global one, whose draws then depend on the other rows). `callback(StepInfo)`
        after each of the row's steps, as the `sample_*` functions call it, with batch-of-one tensors (`rows`
        (0,)); `info.drop(0)` ends the row (its result has `dropped`). `tag`: handed back in the result.
        `context_checked`: the caller has checked prompt + gen_length against the same context already (the server
        and `run_continuous` check every request once, naming the prompt); otherwise `submit` checks it."""
        ids = torch.as_tensor(list(prompt) if not isinstance(prompt, torch.Tensor) else prompt, dtype=torch.long)
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"a prompt must be a non-empty list of token ids, got shape {tuple(ids.shape)}")
        if isinstance(config, SDEConfig):
            if not isinstance(self.model, DSLModel):
                raise ValueError(f"sampler {config.sampler_name!r} needs a DSL checkpoint (with noise_embed/"
                                 f"converter); this model is a bare backbone — use 'remask'/'remdm' or convert it")
            checked_beta(self.model, config)
        elif not isinstance(config, RemaskConfig):
            raise ValueError(f"config must be an SDEConfig or a RemaskConfig, got {type(config).__name__}")
        if config.kv_cache != "off":
            raise ConfigError(f"kv_cache={config.kv_cache!r}: the step-level engine runs kv_cache='off' only (an "
                              f"approximate cache follows one fixed batch); use the sample_* functions for it")
        P, L = ids.shape[0], config.gen_length
        if not context_checked:
            check_context_fits(self.context, P, L)
        tokens = (P + L) * (2 if isinstance(config, RemaskConfig) and config.cfg_scale > 0 else 1)
        if self.max_tokens is not None and tokens > self.max_tokens:
            raise ValueError(f"request of {tokens} batch tokens (prompt {P} + gen_length {L}"
                             f"{', twice for cfg_scale > 0' if tokens > P + L else ''}) can never fit the engine's "
                             f"max_tokens={self.max_tokens}; raise max_tokens or shorten the request")
        rid = next(self._ids)
        self._pending.append(_Pending(rid, tag, ids.to(self.device), config, generator, callback, tokens))
        return rid

    def cancel(self, request_id: int) -> EngineResult | None:
        """Remove a pending or live request now; its result (dropped) is returned, None when the id is unknown or
        already finished."""
        for p in self._pending:
            if p.request_id == request_id:
                self._pending.remove(p)  # never admitted: no state, no forward
                L = p.config.gen_length
                ids = torch.full((L,), self.special.mask, dtype=torch.long)
                return EngineResult(p.request_id, p.tag, p.config, ids, 0, 0, 0, 0, dropped=True)
        for row in self._live:
            if row.id == request_id:
                self._live.remove(row)
                return row.abandon(True, None)
        return None

    @property
    def live(self) -> int:
        """Rows in the running batch."""
        return len(self._live)

    @property
    def live_requests(self) -> list[tuple[int, Any]]:
        """(request id, tag) of each live row, in admission order."""
        return [(r.id, r.tag) for r in self._live]

    @property
    def pending(self) -> int:
        """Requests waiting for room."""
        return len(self._pending)

    def __len__(self) -> int:
        """Requests not finished yet (live and pending)."""
        return len(self._live) + len(self._pending)

    @property
    def batch_tokens(self) -> int:
        """Batch tokens of the live rows (what `max_tokens` caps)."""
        return sum(self._tokens_of(r) for r in self._live)

    @staticmethod
    def _tokens_of(row: Row) -> int:
        c = row.config
        return (row.prompt.shape[0] + c.gen_length) * (2 if isinstance(c, RemaskConfig) and c.cfg_scale > 0 else 1)

    def _admit(self, p: _Pending) -> Row:
        kind = SDERow if isinstance(p.config, SDEConfig) else RemaskRow
        return kind(self, p.request_id, p.tag, p.prompt, p.config, p.generator, p.callback)

    # -- ticks
    @torch.no_grad()
    @denormals_flushed_during
    def step(self) -> list[EngineResult]:
        """One tick: admit what fits, one batched forward over the live rows, every row's update. Returns the
        rows that finished at this tick (in admission order)."""
        results: list[EngineResult] = []
        used = self.batch_tokens
        while self._pending and len(self._live) < self.max_rows:
            p = self._pending[0]
            if self.max_tokens is not None and used + p.tokens > self.max_tokens:
                break
            self._pending.popleft()
            try:
                row = self._admit(p)
            except Exception as e:  # noqa: BLE001  (this request's own set-up failed: it ends, the others go on)
                results.append(EngineResult(p.request_id, p.tag, p.config, torch.empty(0, dtype=torch.long), 0, 0,
                                            0, 0, error=f"{type(e).__name__}: {e}", exception=e))
                continue
            self._live.append(row)
            used += p.tokens
        if not self._live:
            return results
        rows = list(self._live)
        sde = [r for r in rows if isinstance(r, SDERow)]
        h = self._convert(sde)
        seqs: dict[int, list[RowSequence]] = {}
        for r in rows:
            seqs[r.id] = [r.sequence(h[r.id])] if isinstance(r, SDERow) else r.sequences()  # type: ignore[attr-defined]
        logits = self._forward(rows, seqs)
        means = self._means([r for r in sde if r.needs_mean], logits)
        self.ticks += 1
        for r in rows:
            r.ticks += 1
            r.forwards += len(seqs[r.id])
            try:
                if isinstance(r, SDERow):
                    done = r.update(logits[r.id][0], means.get(r.id))
                else:
                    assert isinstance(r, RemaskRow)
                    done = r.update([t.float() for t in logits[r.id]])
            except Exception as e:  # noqa: BLE001  (this row's own computation failed: it ends, the others go on)
                done = r.abandon(False, e)
            if done is not None:
                self._live.remove(r)
                results.append(done)
        return results

    def run(self) -> Iterator[EngineResult]:
        """Tick until no request is left, yielding each result as its row finishes."""
        while len(self):
            yield from self.step()

    def _convert(self, rows: list[SDERow]) -> dict[int, torch.Tensor]:
        """The converter's output (W, H) for each SDE row's state at its own SNR, one call per group of rows with
        the same beta_inf, tolerance and window width."""
        out: dict[int, torch.Tensor] = {}
        groups: dict[tuple[float, float, int], list[SDERow]] = {}
        for r in rows:
            groups.setdefault(r.group_key(), []).append(r)
        dtype = self.backbone.input_embeddings().weight.dtype
        for (beta, tol, _), group in groups.items():
            y = torch.cat([r.state_in() for r in group])
            gamma = torch.tensor([r.gamma_in() for r in group], dtype=torch.float64)
            h = self.dsl_model.converter(scale_states(y, gamma), self.noise_table(), beta, tolerance=tol,
                                         workspace=self._workspace).to(dtype)
            for j, r in enumerate(group):
                out[r.id] = h[j]
        return out

    def _means(self, rows: list[SDERow], logits: dict[int, list[torch.Tensor]]) -> dict[int, torch.Tensor]:
        """ê (1, W, d) per SDE row, one posterior-mean call per group with the same top-M and window width."""
        out: dict[int, torch.Tensor] = {}
        groups: dict[tuple[int, int], list[SDERow]] = {}
        for r in rows:
            groups.setdefault((r.config.top_m, r.blk), []).append(r)
        for (top_m, _), group in groups.items():
            e = self.dsl_model.posterior_mean(torch.cat([logits[r.id][0] for r in group]), top_m, self.noise_table(),
                                              workspace=self._workspace)
            for j, r in enumerate(group):
                out[r.id] = e[j: j + 1]
        return out

    def _forward(self, rows: list[Row], seqs: dict[int, list[RowSequence]]) -> dict[int, list[torch.Tensor]]:
        """Per row, per sequence, the (1, W, V) logits of its window: one left-padded forward per compile group."""
        out: dict[int, list[torch.Tensor]] = {}
        for flag in (False, True):
            group = [r for r in rows if bool(r.config.compile) == flag]
            if group:
                flat = [(r.id, s) for r in group for s in seqs[r.id]]
                fn = compiled(self.backbone) if flag else self.backbone
                for rid, lg in zip([rid for rid, _ in flat], self._batched(fn, [s for _, s in flat])):
                    out.setdefault(rid, []).append(lg)
        return out

    def _batched(self, fn: Any, seqs: list[RowSequence]) -> list[torch.Tensor]:
        T = max(s.embeds.shape[0] for s in seqs)
        H = seqs[0].embeds.shape[1]
        ref = seqs[0].embeds
        x = ref.new_zeros((len(seqs), T, H))
        keep = torch.zeros((len(seqs), T), dtype=torch.long, device=ref.device)
        wanted: set[int] = set()
        for i, s in enumerate(seqs):
            off = T - s.embeds.shape[0]
            x[i, off:] = s.embeds
            keep[i, off:] = 1
            cols = range(s.hi - s.lo) if s.columns is None else s.columns
            wanted.update(off + s.lo + c for c in cols)
        attn = None if bool(keep.all()) else keep
        cols_sorted = sorted(wanted)
        if cols_sorted and cols_sorted[-1] - cols_sorted[0] + 1 == len(cols_sorted):
            positions: slice | torch.Tensor = slice(cols_sorted[0], cols_sorted[-1] + 1)
        else:
            positions = torch.tensor(cols_sorted, dtype=torch.long, device=ref.device)
        self.forward_passes += 1
        logits = fn(x, attn, positions=positions)
        where = {c: j for j, c in enumerate(cols_sorted)}
        result = []
        for i, s in enumerate(seqs):
            off = T - s.embeds.shape[0]
            W = s.hi - s.lo
            if s.columns is None:
                a = where[off + s.lo]
                result.append(logits[i: i + 1, a: a + W])
                continue
            lg = logits.new_zeros((1, W, logits.shape[-1]))
            if s.columns:
                idx = torch.tensor([where[off + s.lo + c] for c in s.columns], dtype=torch.long, device=logits.device)
                lg[0, torch.tensor(s.columns, dtype=torch.long, device=logits.device)] = logits[i, idx]
            result.append(lg)
        return result
