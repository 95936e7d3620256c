"""The step-level engine's rows: one request's sampler state, advanced one tick at a time (`engine.Engine` runs the
ticks). An SDE row (DSL-SDE, Block SDE) carries its noisy state y, its place on its config's SNR grid and its Heun
stage; a remasking row (remasking, threshold decoding, ReMDM) its ids, block, step and commit schedule. Each tick a
row says what it feeds the shared forward (`RowSequence`) and updates itself from its slice of the logits; the
maths are the `sample_*` functions' own (`sde.heun_predict`/`heun_correct`, `remask_step`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..config import RemaskConfig, SDEConfig
from .common import RowRNG, SampleOutput, StepCallback, StepInfo, stop_lengths
from .guards import WEIGHTS_MESSAGE, NonFiniteLogitsError, check_finite_state, has_broken_logits
from .remask import remask_step_info
from .remask_step import guide_and_ban, remask_step, remaining_quota, suppressed_steps, transfer_counts
from .sde import brownian_increment, checked_beta, decode_argmax, heun_correct, heun_predict

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["EngineConfig", "EngineResult", "RemaskRow", "Row", "RowSequence", "SDERow"]

EngineConfig = SDEConfig | RemaskConfig
"""The sampler configs the engine runs: SDEConfig (DSL-SDE, Block SDE) and RemaskConfig (remasking, ReMDM)."""


@dataclass
class EngineResult:
    """One finished request: its response tokens and accounting, or why it stopped early."""

    request_id: int
    """The id `Engine.submit` returned."""
    tag: Any
    """Whatever the caller passed to `submit` as `tag`."""
    config: EngineConfig
    ids: torch.Tensor
    """(L,) response tokens as decoded, on the CPU ([MASK] for a dropped or failed row)."""
    length: int
    """Response length after truncation at the first EOS/EoT (L when truncation is off or none occurs)."""
    nfe: int
    """The response's NFE as `SampleOutput.nfe` counts it (SDE: 2S per window; discrete: steps run)."""
    forward_passes: int
    """Backbone forward passes made for this row (SDE: 2S + 1 per window; discrete: steps, twice with CFG)."""
    ticks: int
    """Engine ticks the row was live for (each tick is one batched forward)."""
    steps_per_block: list[int] | None = None
    """Discrete samplers: the steps the row took in each block; None for the SDE."""
    dropped: bool = False
    """A step callback dropped the row (`StepInfo.drop`) or the caller cancelled it (`Engine.cancel`)."""
    error: str | None = None
    """'ExceptionType: message' when the row's own computation raised (the other rows went on)."""
    exception: BaseException | None = None
    """The exception behind `error` (to re-raise it)."""

    @property
    def response(self) -> list[int]:
        """The response ids truncated at `length`."""
        return self.ids[: self.length].tolist()

    def output(self) -> SampleOutput:
        """This row as a batch-of-one `SampleOutput` (what the `sample_*` function returns for it alone)."""
        spb = None if self.steps_per_block is None else torch.tensor([self.steps_per_block], dtype=torch.long)
        return SampleOutput(ids=self.ids[None], lengths=torch.tensor([self.length]), nfe=self.nfe,
                            forward_passes=self.forward_passes,
                            config={"sampler": self.config.sampler_name, **self.config.to_dict()},
                            dropped=[0] if self.dropped else [], steps_per_block=spb)


@dataclass
class RowSequence:
    """One sequence of a tick's forward: its input embeddings and the window whose logits it needs."""

    embeds: torch.Tensor
    """(T, H) input embeddings."""
    lo: int
    hi: int
    """Window [lo, hi) in the sequence's own columns."""
    columns: list[int] | None = None
    """Columns of the window (0-based inside it) whose logits are needed; None = all (the others are zeros)."""


class Row:
    """A live request. Subclasses hold the sampler state and compute one tick's update from the window logits."""

    def __init__(self, engine: Engine, request_id: int, tag: Any, prompt: torch.Tensor, config: EngineConfig,
                 generator: torch.Generator | None, callback: StepCallback | None):
        self.engine, self.id, self.tag, self.config, self.callback = engine, request_id, tag, config, callback
        self.prompt = prompt
        self.rng = RowRNG(None if generator is None else [generator], 1)
        self.forwards = 0
        self.ticks = 0

    def result(self, ids: torch.Tensor, *, nfe: int, steps_per_block: list[int] | None = None, dropped: bool = False,
               error: BaseException | None = None) -> EngineResult:
        special = self.engine.special
        ids = ids.to("cpu", copy=True)
        if dropped or error is not None:
            length = 0
        elif self.config.truncate_at_eos:
            length = int(stop_lengths(ids[None], special.stop_ids())[0])
        else:
            length = ids.shape[0]
        return EngineResult(self.id, self.tag, self.config, ids, length, nfe, self.forwards, self.ticks,
                            steps_per_block, dropped, None if error is None else f"{type(error).__name__}: {error}",
                            error)

    def notify(self, info: StepInfo) -> bool:
        """Run the callback on `info`; True when it dropped this row."""
        if self.callback is None:
            return False
        self.callback(info)
        return bool(info.dropping)

    def abandon(self, dropped: bool, error: BaseException | None) -> EngineResult:
        raise NotImplementedError


class SDERow(Row):
    """DSL-SDE (one window over the whole response) or Block SDE (one window per block), Heun steps on the row's own
    SNR grid: each step is a predictor tick and a corrector tick, each window ends with a decode tick."""

    config: SDEConfig

    def __init__(self, engine: Engine, *args: Any) -> None:
        super().__init__(engine, *args)
        model = engine.dsl_model
        c = self.config
        self.grid = engine.grid(c)
        self.steps = c.steps
        self.beta = checked_beta(model, c)
        self.eta = c.resolved_eta()
        self.L = c.gen_length
        self.blk = c.block_length or c.gen_length
        self.n_blocks = self.L // self.blk
        self.mask_id = engine.special.mask
        self.response = torch.full((self.L,), self.mask_id, dtype=torch.long, device=engine.device)
        self.settings = {"gamma_min": c.gamma_min, "gamma_max": c.gamma_max, "eta": self.eta, "nfe": c.nfe,
                         "schedule": c.schedule, "beta_inf": self.beta}
        self.block = 0
        self._start_block()

    def _start_block(self) -> None:
        model = self.engine.dsl_model
        lo, hi = self.block * self.blk, (self.block + 1) * self.blk
        self.context = model.context_embed(torch.cat([self.prompt, self.response[:lo]])[None])[0]
        self.future = model.mask_embed(self.response[hi:][None])[0] if hi < self.L else None
        self.y = F.normalize(self.rng.randn((1, self.blk, model.noise_dim), device=self.engine.device), dim=-1)
        self.s = 0
        self.stage = "predictor"

    # -- what this tick evaluates
    def gamma_in(self) -> float:
        if self.stage == "predictor":
            return float(self.grid[self.s])
        if self.stage == "corrector":
            return float(self.grid[self.s + 1])
        return float(self.grid[-1])

    def state_in(self) -> torch.Tensor:
        return self.y_pred if self.stage == "corrector" else self.y

    def group_key(self) -> tuple[float, float, int]:
        return (self.beta, self.config.converter_tolerance, self.blk)

    @property
    def needs_mean(self) -> bool:
        return self.stage != "decode"

    def sequence(self, h: torch.Tensor) -> RowSequence:
        parts = [self.context, h] if self.future is None else [self.context, h, self.future]
        start = self.context.shape[0]
        return RowSequence(torch.cat(parts, dim=0), start, start + self.blk)

    # -- the update after the forward
    def update(self, logits: torch.Tensor, e: torch.Tensor | None) -> EngineResult | None:
        """logits (1, W, V) of the window; e (1, W, d) the posterior mean (None at the decode tick)."""
        lo, hi = self.block * self.blk, (self.block + 1) * self.blk
        if self.stage == "predictor":
            if self.block == 0 and self.s == 0 and has_broken_logits(logits):
                raise NonFiniteLogitsError(WEIGHTS_MESSAGE)
            assert e is not None
            g0, g1 = float(self.grid[self.s]), float(self.grid[self.s + 1])
            self.dW = brownian_increment(self.rng, self.y, g0, g1)
            self.y_pred, self.v0 = heun_predict(self.y, e, g0, g1, self.dW, eta=self.eta,
                                                predictor_noise=self.config.predictor_noise)
            self.stage = "corrector"
            return None
        if self.stage == "corrector":
            assert e is not None
            g0, g1 = float(self.grid[self.s]), float(self.grid[self.s + 1])
            self.y = heun_correct(self.y, self.y_pred, self.v0, e, g0, g1, self.dW, eta=self.eta)
            check_finite_state(self.y, "SDE state", self.settings)
            s = self.s
            self.s += 1
            self.stage = "decode" if self.s == self.steps else "predictor"
            if self.callback is not None:
                mask_id = self.mask_id

                def current() -> torch.Tensor:
                    tokens = self.response.clone()
                    tokens[lo:hi] = decode_argmax(logits, mask_id)[0]
                    return tokens[None]

                committed = (torch.arange(self.L, device=logits.device) < lo)[None]
                info = StepInfo(step=self.block * self.steps + s, total_steps=self.n_blocks * self.steps,
                                tokens=current, gamma=g1, extra={"block": self.block} if self.config.block_length else {},
                                committed=committed, logits=logits, window=(lo, hi), rows=(0,))
                if self.notify(info):
                    return self.abandon(True, None)
            return None
        # decode: argmax with [MASK] excluded; NaN logits name the settings (never token 0 decoded from NaN)
        if bool(torch.isnan(logits).any()):
            check_finite_state(torch.tensor(float("nan")), "converter/backbone logits at the final SNR", self.settings)
        self.response[lo:hi] = decode_argmax(logits, self.mask_id)[0]
        if self.callback is not None:
            pos = torch.arange(self.L, device=logits.device)
            info = StepInfo(step=(self.block + 1) * self.steps - 1, total_steps=self.n_blocks * self.steps,
                            tokens=self.response.clone()[None], gamma=float(self.grid[-1]),
                            extra={"block": self.block} if self.config.block_length else {},
                            committed=(pos < hi)[None], newly_committed=((pos >= lo) & (pos < hi))[None],
                            logits=logits, window=(lo, hi), decode=True, rows=(0,))
            if self.notify(info):
                return self.abandon(True, None)
        self.block += 1
        if self.block == self.n_blocks:
            return self.result(self.response, nfe=self.n_blocks * 2 * self.steps)
        self._start_block()
        return None

    def abandon(self, dropped: bool, error: BaseException | None) -> EngineResult:
        ids = torch.full((self.L,), self.mask_id, dtype=torch.long)
        return self.result(ids, nfe=self.n_blocks * 2 * self.steps, dropped=dropped, error=error)


class RemaskRow(Row):
    """LLaDA remasking (and ReMDM-conf-loop): blocks left to right, `steps / n_blocks` steps each, one tick per
    step; with a confidence threshold a block ends as soon as the row has no mask left in it."""

    config: RemaskConfig

    def __init__(self, engine: Engine, *args: Any) -> None:
        super().__init__(engine, *args)
        c = self.config
        self.mask_id = engine.special.mask
        self.P, self.L = self.prompt.shape[0], c.gen_length
        self.blk = c.effective_block_length
        self.n_blocks = self.L // self.blk
        self.S_b = c.steps // self.n_blocks
        self.n_suppress = suppressed_steps(c.eos_suppress_ratio, self.S_b)
        self.x = torch.cat([self.prompt, torch.full((self.L,), self.mask_id, dtype=torch.long, device=engine.device)])
        self.row_steps = [0] * self.n_blocks
        self.step_count = 0
        self.block = 0
        self._start_block()

    def _start_block(self) -> None:
        lo, hi = self._window()
        self.i = 0
        self.schedule = transfer_counts(int((self.x[lo:hi] == self.mask_id).sum()), self.S_b)

    def _window(self) -> tuple[int, int]:
        return self.P + self.block * self.blk, self.P + (self.block + 1) * self.blk

    def sequences(self) -> list[RowSequence]:
        lo, hi = self._window()
        embed = self.engine.backbone.embed
        cols = None
        if not self.config.remdm:  # a plain step reads only the still-masked positions' logits
            cols = (self.x[lo:hi] == self.mask_id).nonzero().squeeze(1).tolist()
        seqs = [RowSequence(embed(self.x[None])[0], lo, hi, cols)]
        if self.config.cfg_scale > 0:  # the unconditional copy: the prompt masked
            un_x = self.x.clone()
            un_x[: self.P] = self.mask_id
            seqs.append(RowSequence(embed(un_x[None])[0], lo, hi, cols))
        return seqs

    def update(self, logits: list[torch.Tensor]) -> EngineResult | None:
        """logits: per sequence (1, W, V) float32 of the block (zeros in columns not asked for)."""
        c, lo, hi = self.config, *self._window()
        guided = guide_and_ban(logits[0], logits[1] if c.cfg_scale > 0 else None, config=c,
                               special=self.engine.special, block_step=self.i, n_suppress=self.n_suppress)
        block = self.x[lo:hi][None]
        if c.threshold is not None:
            quota = remaining_quota((block == self.mask_id).sum(dim=1), self.S_b - self.i)
        else:
            quota = torch.tensor([self.schedule[self.i]], dtype=torch.long, device=block.device)
        st = remask_step(guided, block, quota, block_step=self.i, steps_per_block=self.S_b, config=c,
                         mask_id=self.mask_id, rng=self.rng)
        self.x[lo:hi] = st.tokens[0]
        self.row_steps[self.block] += 1
        if self.callback is not None:
            info = remask_step_info(self.x[self.P:][None], st, guided, (lo - self.P, hi - self.P), c, self.mask_id,
                              step=self.step_count, block=self.block, block_step=self.i, rows=(0,))
            if self.notify(info):
                self.step_count += 1
                return self.abandon(True, None)
        self.step_count += 1
        self.i += 1
        block_done = self.i == self.S_b or (c.threshold is not None and not bool((self.x[lo:hi] == self.mask_id).any()))
        if not block_done:
            return None
        self.block += 1
        if self.block == self.n_blocks:
            nfe = c.steps if c.threshold is None else self.step_count
            return self.result(self.x[self.P:], nfe=nfe, steps_per_block=list(self.row_steps))
        self._start_block()
        return None

    def abandon(self, dropped: bool, error: BaseException | None) -> EngineResult:
        ids = torch.full((self.L,), self.mask_id, dtype=torch.long)
        nfe = self.config.steps if self.config.threshold is None else self.step_count
        return self.result(ids, nfe=nfe, steps_per_block=list(self.row_steps), dropped=dropped, error=error)
