"""LLaDA `generate()`-style discrete remasking (low-confidence / random), with optional ReMDM-conf-loop.

x = [prompt | MASK x L]. The response is split into blocks of `effective_block_length` decoded left to right;
the `steps` are split equally over the blocks (S_b each). At the start of a block with M masked positions the
per-step commit counts are `transfer_counts(M, S_b)` (M // S_b each, the first M mod S_b steps one more).
Each step: one forward (two with CFG), EOS bans, a proposal x0 per position (argmax, or Gumbel-max at T > 0),
a confidence per position (softmax probability of x0, or a uniform draw), and the top-k still-masked positions
of the current block are committed. Committed tokens and prompt tokens never change (except ReMDM re-masking
of committed tokens inside its loop window, see `remdm.py`). The [MASK] id itself is never proposed.

With a confidence threshold (`RemaskConfig.threshold`, Fast-dLLM's parallel decoding) a step also commits every
masked position of the block whose confidence exceeds it, the schedule's count is recomputed from the masks left
(`remaining_quota`), and a block ends as soon as no row has a mask left in it: the steps per block are
data-dependent. A batch runs each block until its slowest row is done; a row that is done sits the remaining
steps out (unchanged, drawing nothing), so its tokens are those of the row run alone.

The per-step decisions (proposal, confidence, commits, ReMDM re-masking) are `remask_step.remask_step`; this
module runs the model, classifier-free guidance and token bans around it. Works on any `DiscreteModel` (a
Backbone or a DSLModel's discrete path). Everything is computed per row, and random draws cover only the current
block of each row, so with one generator per row a left-padded batch gives the tokens of the same prompts run one
by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..core.backbones.base import Backbone, Positions, compiled, model_device, with_positions
from ..config import RemaskConfig
from ..errors import ConfigError
from ..core.numerics import denormals_flushed_during
from .common import (ForwardCounter, LiveRows, PromptBatch, RowRNG, SampleOutput, StepCallback, StepInfo,
                     check_prompt_fits, stop_lengths)
from .kv_cache import WindowKVCache
from .observers import with_progress
from .positions import LogitsBuffer, block_logits
from .remask_step import (RemaskStep, block_schedule, guide_and_ban, remaining_quota, remask_step, suppressed_steps,
                          transfer_counts)

if TYPE_CHECKING:
    from ..core.backbones.base import SpecialTokens

__all__ = ["DiscreteModel", "fewest_equivalent_steps", "sample_remask", "sample_remdm", "transfer_counts",
           "suppressed_steps"]


class DiscreteModel(Protocol):
    """What the discrete samplers need from a model: its special token ids and logits for token ids.

    A context limit is read from `model.backbone.max_length` or `model.max_length` when either exists.
    """

    @property
    def special(self) -> SpecialTokens: ...

    def logits_from_ids(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor: ...


def _forward(model: DiscreteModel, compile: bool) -> Callable[..., torch.Tensor]:
    """`logits_from_ids(ids, attention_mask, positions=...)` of the model; with `compile`, the same through the
    `torch.compile`d backbone (`backbones.base.compiled`: built once, kept on the backbone)."""
    if not compile:
        return with_positions(model.logits_from_ids)
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, Backbone):
        raise ConfigError(f"compile=True needs a Backbone or a DSLModel (its backbone is compiled); "
                          f"got {type(model).__name__}")
    fn = compiled(backbone)

    def forward(ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        return fn(backbone.embed(ids), attention_mask, positions=positions)  # as Backbone.logits_from_ids

    return forward


def _window_cache(model: DiscreteModel, config: RemaskConfig) -> WindowKVCache | None:
    """The approximate key/value cache of `config.kv_cache` around the model's backbone (None when 'off')."""
    if config.kv_cache == "off":
        return None
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, Backbone):
        raise ConfigError(f"kv_cache={config.kv_cache!r} needs a model with a backbone (a DSL checkpoint or a "
                          f"Backbone); got {type(model).__name__}: use kv_cache='off'")
    return WindowKVCache(backbone, config.kv_cache, config.cache_refresh, embed=getattr(backbone, "embed", None))


def _diffusion_time(done_steps: int, steps: int) -> float:
    """Overall diffusion time after `done_steps` of `steps` (1 = all masked, 0 = clean)."""
    return 1.0 - done_steps / steps


@dataclass
class _Run:
    """One remasking run: the loop's constants and the per-row state that follows the rows a callback drops."""

    forward: ForwardCounter
    config: RemaskConfig
    special: SpecialTokens
    P: int
    """Prompt length (left-padded): the response starts at column P."""
    steps_per_block: int
    n_suppress: int
    x: torch.Tensor
    """(B, P + L) prompt and response ids."""
    attn: torch.Tensor | None
    prompt_real: torch.Tensor
    rng: RowRNG
    cache: WindowKVCache | None
    row_steps: torch.Tensor
    """(B, blocks) steps each row took per block."""
    live: LiveRows
    callback: StepCallback | None
    trajectory: list[torch.Tensor] | None
    buffers: tuple[LogitsBuffer, LogitsBuffer] = field(default_factory=lambda: (LogitsBuffer(), LogitsBuffer()))
    """Conditional and unconditional (CFG) block logits."""
    schedule: torch.Tensor | None = None
    """(B, steps_per_block) commits per step of the current block."""
    step: int = 0

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Rows left the batch: every per-row state follows (docs/design.md, "Observers")."""
        self.x, self.prompt_real = self.x[keep], self.prompt_real[keep]
        self.schedule = None if self.schedule is None else self.schedule[keep]
        self.row_steps = self.row_steps[keep.cpu()]
        self.attn = None if self.attn is None else self.attn[keep]
        if self.cache is not None:
            self.cache.select_rows(keep)


def fewest_equivalent_steps(config: RemaskConfig) -> RemaskConfig:
    """The config with the fewest steps whose tokens are `config`'s, row for row (`config` itself when none has
    fewer).

    A block of W positions given S_b > W steps commits one position at each of its first W steps and none after
    (`transfer_counts(W, S_b)`: W // S_b = 0, the first W get one), so its first W steps are those of a run with
    S_b = W (same inputs, same logits, same commits) and the last S_b - W only run the model; their forward passes
    are the only difference. That holds while no step's decision depends on S_b itself and no step draws a random
    number (an idle step would still draw, and the next block's draws would differ): so only greedy low-confidence
    remasking, and a config with a temperature, random remasking, ReMDM (its loop window is a fraction of the
    block's steps), a confidence threshold (its quota is recomputed per step), EOS suppression (a fraction of the
    steps) or a key/value cache (refreshed by call count) is returned unchanged."""
    n_blocks = config.gen_length // config.effective_block_length
    if (config.steps // n_blocks <= config.effective_block_length or config.temperature != 0
            or config.remasking != "low_confidence" or config.remdm or config.threshold is not None
            or config.eos_suppress_ratio > 0 or config.kv_cache != "off"):
        return config
    return config.replace(steps=config.effective_block_length * n_blocks)


@torch.no_grad()
@denormals_flushed_during
def sample_remask(model: DiscreteModel, prompts: PromptBatch, config: RemaskConfig | None = None, *,
                  generator: torch.Generator | Sequence[torch.Generator] | None = None,
                  callback: StepCallback | None = None, progress: bool = False,
                  return_trajectory: bool = False) -> SampleOutput:
    """LLaDA low-confidence / random remasking (ReMDM-conf-loop when `config.remdm`).

    `generator`: one torch.Generator for the batch, a sequence with one per row, or None (global RNG).
    `callback(StepInfo)` after every step: `tokens` are the committed response tokens ([MASK] where none yet),
    `committed` / `newly_committed` the positions holding / just given a token, `logits` the block's guided logits
    the step committed from (banned ids at -inf), `time` the overall diffusion time; `extra` has block,
    block_step, t, in_loop, n_committed, n_remasked (B,) and n_masked (B,). A callback may drop rows
    (`StepInfo.drop`): they leave the batch after that step (the output lists them in `dropped`).
    With `config.threshold` the output's `nfe` is the steps run (at most `config.steps`), `steps_per_block` each
    row's own, and `time` the largest fraction of a row's response still masked.
    """
    config = config or RemaskConfig()
    callback = with_progress(callback, progress, "remask")
    prompts = prompts.to(model_device(model, fallback=prompts.ids.device))
    check_prompt_fits(model, prompts, config.gen_length)
    run = _start(model, prompts, config, generator, callback, return_trajectory)
    blk = config.effective_block_length
    for k_blk in range(config.gen_length // blk):
        _run_block(run, k_blk, run.P + k_blk * blk, run.P + (k_blk + 1) * blk)
        if run.x.shape[0] == 0:
            break
    return _output(run)


def _start(model: DiscreteModel, prompts: PromptBatch, config: RemaskConfig,
           generator: torch.Generator | Sequence[torch.Generator] | None, callback: StepCallback | None,
           return_trajectory: bool) -> _Run:
    """The run's state before the first step: [prompt | MASK x L] and the loop's constants."""
    B, P, L, device = prompts.batch_size, prompts.length, config.gen_length, prompts.ids.device
    mask_id = model.special.mask
    cache = _window_cache(model, config)
    n_blocks = L // config.effective_block_length
    S_b = config.steps // n_blocks
    return _Run(forward=ForwardCounter(cache if cache is not None else _forward(model, config.compile)), config=config,
                special=model.special, P=P, steps_per_block=S_b, n_suppress=suppressed_steps(config.eos_suppress_ratio, S_b),
                x=torch.cat([prompts.ids, torch.full((B, L), mask_id, dtype=torch.long, device=device)], dim=1),
                attn=prompts.full_attention_mask(L), prompt_real=prompts.attention_mask.to(torch.bool),
                rng=RowRNG(generator, B), cache=cache, row_steps=torch.zeros(B, n_blocks, dtype=torch.long),
                live=LiveRows(B), callback=callback, trajectory=[] if return_trajectory else None)


def _run_block(run: _Run, k_blk: int, lo: int, hi: int) -> None:
    """Decode block `k_blk` (columns lo:hi) in at most `steps_per_block` steps."""
    mask_id, S_b = run.special.mask, run.steps_per_block
    run.schedule = block_schedule(run.x[:, lo:hi] == mask_id, S_b)
    if run.cache is not None:
        run.cache.start_window(lo, hi)
    for i in range(S_b):
        quota, active = run.schedule[:, i], None
        if run.config.threshold is not None:  # data-dependent: the block ends when no row has a mask left in it
            n_left = (run.x[:, lo:hi] == mask_id).sum(dim=1)
            if not bool(n_left.any()):
                break
            quota, active = remaining_quota(n_left, S_b - i), n_left > 0
        _one_step(run, k_blk, i, lo, hi, quota, active)
        if run.x.shape[0] == 0:
            break


def _one_step(run: _Run, k_blk: int, i: int, lo: int, hi: int, quota: torch.Tensor, active: torch.Tensor | None) -> None:
    """One denoising step of the current block: guided logits, commits, trajectory, callback (which may drop rows).
    The step's logits are released on return, so the buffers' next view finds them unshared unless a callback
    kept them."""
    config, mask_id, P = run.config, run.special.mask, run.P
    logits = _guided_logits(run.forward, run.x, run.attn, run.prompt_real, lo, hi, config, run.special, i,
                            run.n_suppress, run.buffers)
    st = _step_rows(logits, run.x[:, lo:hi], quota, active, block_step=i, steps_per_block=run.steps_per_block,
                    config=config, mask_id=mask_id, rng=run.rng)
    run.x[:, lo:hi] = st.tokens
    run.row_steps[:, k_blk] += (torch.ones(run.x.shape[0], dtype=torch.long) if active is None else active.cpu())
    if run.trajectory is not None:  # .cpu() of a CPU tensor would alias x
        run.trajectory.append(run.live.expand(run.x[:, P:].to("cpu", copy=True), mask_id))
    if run.callback is not None:
        info = remask_step_info(run.x[:, P:], st, logits, (lo - P, hi - P), config, mask_id, step=run.step, block=k_blk,
                          block_step=i, rows=run.live.rows)
        run.callback(info)
        keep = run.live.after(info, run.rng, run.x.device)
        del info
        if keep is not None:
            run.keep_rows(keep)
    run.step += 1


def _output(run: _Run) -> SampleOutput:
    """The SampleOutput of a finished run: dropped rows back at their places ([MASK] ids, length 0)."""
    config, mask_id = run.config, run.special.mask
    ids = run.x[:, run.P:]
    if config.truncate_at_eos:
        lengths = stop_lengths(ids, run.special.stop_ids())
    else:
        lengths = torch.full((run.x.shape[0],), config.gen_length, dtype=torch.long, device=run.x.device)
    return SampleOutput(ids=run.live.expand(ids.to("cpu", copy=True), mask_id),
                        lengths=run.live.expand(lengths.cpu(), 0),
                        nfe=config.steps if config.threshold is None else run.step, forward_passes=run.forward.count,
                        trajectory=run.trajectory, config={"sampler": config.sampler_name, **config.to_dict()},
                        dropped=run.live.dropped, steps_per_block=run.live.expand(run.row_steps, 0))


def remask_step_info(response: torch.Tensor, st: RemaskStep, logits: torch.Tensor, window: tuple[int, int],
                     config: RemaskConfig, mask_id: int, *, step: int, block: int, block_step: int,
                     rows: Sequence[int]) -> StepInfo:
    """The callback's view of a step: `response` (B, L) the response tokens after it, `window` the block's span."""
    lo, hi = window
    newly = torch.zeros(response.shape, dtype=torch.bool, device=response.device)
    newly[:, lo:hi] = st.committed
    n_masked = (response == mask_id).sum(dim=1)
    time = (_diffusion_time(step + 1, config.steps) if config.threshold is None
            else float(n_masked.max()) / response.shape[1])
    return StepInfo(step=step, total_steps=config.steps, tokens=response.clone(), extra={
        "block": block, "block_step": block_step, "t": st.t, "in_loop": st.in_loop,
        "n_committed": st.committed.sum(dim=1).cpu(), "n_remasked": st.remasked.sum(dim=1).cpu(),
        "n_masked": n_masked.cpu()},
        time=time, committed=response != mask_id, newly_committed=newly, logits=logits, window=window, rows=rows)


def _guided_logits(forward: Callable[..., torch.Tensor], x: torch.Tensor, attn: torch.Tensor | None,
                   prompt_real: torch.Tensor, lo: int, hi: int, config: RemaskConfig, special: SpecialTokens,
                   block_step: int, n_suppress: int, buffers: tuple[LogitsBuffer, LogitsBuffer]) -> torch.Tensor:
    """The fp32 logits (B, hi - lo, V) of the current block after classifier-free guidance and the token bans.

    Logits of the current block only (CFG: prompt -> MASK in the unconditional copy). Kept in fp32: the Gumbel
    draw and the confidences are float64 as LLaDA's, without a whole float64 copy of (blk, V). Written into buffers reused
    across steps (no fresh page-faulting (B, W, V) tensor per step; a callback keeping a step's logits makes the
    buffer allocate anew, see positions.LogitsBuffer)."""
    mask_id, P = special.mask, prompt_real.shape[1]
    logits = block_logits(forward, x, attn, lo, hi, mask_id, masked_only=not config.remdm, buffer=buffers[0])
    un = None
    if config.cfg_scale > 0:
        un_x = x.clone()
        un_x[:, :P] = un_x[:, :P].masked_fill(prompt_real, mask_id)
        un = block_logits(forward, un_x, attn, lo, hi, mask_id, masked_only=not config.remdm, buffer=buffers[1])
    return guide_and_ban(logits, un, config=config, special=special, block_step=block_step, n_suppress=n_suppress)


def _step_rows(logits: torch.Tensor, block_tokens: torch.Tensor, quota: torch.Tensor, active: torch.Tensor | None,
               *, rng: RowRNG, **kw: Any) -> RemaskStep:
    """`remask_step` on the rows where `active` (all rows when None): the other rows sit the step out, unchanged
    and drawing no random numbers, so each row's draws are those of the row run alone (`RowRNG.subset`)."""
    if active is None or bool(active.all()):
        return remask_step(logits, block_tokens, quota, rng=rng, **kw)
    idx = active.nonzero().squeeze(1)
    sub = remask_step(logits[idx], block_tokens[idx], quota[idx], rng=rng.subset(idx.tolist()), **kw)
    tokens, proposal = block_tokens.clone(), block_tokens.clone()
    tokens[idx], proposal[idx] = sub.tokens, sub.proposal
    committed = torch.zeros_like(block_tokens, dtype=torch.bool)
    committed[idx] = sub.committed
    return RemaskStep(tokens=tokens, proposal=proposal, committed=committed, remasked=torch.zeros_like(committed),
                      t=sub.t, in_loop=sub.in_loop)


@torch.no_grad()
def sample_remdm(model: DiscreteModel, prompts: PromptBatch, config: RemaskConfig | None = None, *,
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,
                 callback: StepCallback | None = None, progress: bool = False,
                 return_trajectory: bool = False) -> SampleOutput:
    """ReMDM-conf-loop: `sample_remask` with `config.remdm=True` (paper defaults t_on 0.55, t_off 0.05, alpha 0.9)."""
    config = (config or RemaskConfig()).replace(remdm=True)
    return sample_remask(model, prompts, config, generator=generator, callback=callback, progress=progress,
                         return_trajectory=return_trajectory)
