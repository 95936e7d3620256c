"""LLaDA `generate()`-style discrete remasking (low-confidence / random), with optional ReMDM-conf-loop.

x = [prompt | MASK x L]. The response is split into blocks of `effective_block_length` decoded left to right;
the `steps` are split equally over the blocks (S_b each). At the start of a block with M masked positions the
per-step commit counts are `transfer_counts(M, S_b)` (M // S_b each, the first M mod S_b steps one more).
Each step: one forward (two with CFG), EOS bans, a proposal x0 per position (argmax, or Gumbel-max at T > 0),
a confidence per position (softmax probability of x0, or a uniform draw), and the top-k still-masked positions
of the current block are committed. Committed tokens and prompt tokens never change (except ReMDM re-masking
of committed tokens inside its loop window, see `remdm.py`). The [MASK] id itself is never proposed.

Works on anything with `logits_from_ids(ids, attention_mask)` and `.special` (a Backbone or a DSLModel's
discrete path). Everything is computed per row, and random draws cover only the current block of each row, so
with one generator per row a left-padded batch gives the tokens of the same prompts run one by one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch import nn

from ..backbones.base import with_positions
from ..config import RemaskConfig
from ..numerics import denormals_flushed_during
from ..utils import progress as progress_bar
from .common import (ForwardCounter, PromptBatch, RowRNG, SampleOutput, StepCallback, StepInfo, check_prompt_fits,
                     stop_lengths)
from .positions import block_logits
from .remdm import in_loop_window, loop_time, remask_confidence, remask_probabilities, sample_remdm, sigma_max

__all__ = ["sample_remask", "sample_remdm", "transfer_counts", "suppressed_steps"]

NEG_INF = float("-inf")


def transfer_counts(n_masked: int, steps: int) -> list[int]:
    """LLaDA's linear schedule: `steps` counts summing to n_masked; base n // steps, the first n % steps get +1."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    if n_masked < 0:
        raise ValueError(f"n_masked={n_masked} must be >= 0")
    base, extra = divmod(int(n_masked), int(steps))
    return [base + 1 if i < extra else base for i in range(steps)]


def suppressed_steps(ratio: float, steps_per_block: int) -> int:
    """floor(ratio * S_b): how many leading steps of each block ban EOS and EoT (tolerant of float rounding)."""
    return min(steps_per_block, int(math.floor(ratio * steps_per_block + 1e-9)))


def _row_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, W) bool -> (B, steps) long commit counts, computed per row from that row's number of masks."""
    rows = [transfer_counts(int(m), steps) for m in masked.sum(dim=1).tolist()]
    return torch.tensor(rows, dtype=torch.long, device=masked.device)


def _topk_mask(conf: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row, True at the k[row] highest-confidence positions (ties: lower index first). Callers AND the result
    with eligibility, so ineligible (-inf) positions are never committed even when k exceeds the eligible count."""
    order = torch.argsort(conf, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(conf.shape[-1], device=conf.device).expand_as(order))
    return rank < k.unsqueeze(-1)


def _model_device(model) -> torch.device | None:
    if isinstance(model, nn.Module):
        p = next(model.parameters(), None)
        if p is not None:
            return p.device
    return None


def _context_limit(model) -> int | None:
    """max_length of a DSLModel's backbone, or of the model itself (a Backbone); None when unknown."""
    for obj in (getattr(model, "backbone", None), model):
        if obj is not None and hasattr(obj, "max_length"):
            return obj.max_length
    return None


def _uniform(rng: RowRNG, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Float64 U[0, 1) draws (RowRNG draws on the generator's own device, so a CPU generator works with a GPU model)."""
    return rng.rand(shape, device=device, dtype=torch.float64)


def _banned_ids(config: RemaskConfig, special, block_step: int, n_suppress: int) -> list[int]:
    banned: list[int] = []
    if config.eos_inf:
        banned.append(special.eos)
        if config.eos_inf_include_eot and special.eot is not None:
            banned.append(special.eot)
    if block_step < n_suppress:
        banned.extend(special.stop_ids())
    return sorted(set(banned))


@torch.no_grad()
@denormals_flushed_during
def sample_remask(model, prompts: PromptBatch, config: RemaskConfig | None = None, *,
                  generator: torch.Generator | Sequence[torch.Generator] | None = None,
                  callback: StepCallback | None = None, progress: bool = False,
                  return_trajectory: bool = False) -> SampleOutput:
    """LLaDA low-confidence / random remasking (ReMDM-conf-loop when `config.remdm`).

    `generator`: one torch.Generator for the batch, a sequence with one per row, or None (global RNG).
    `callback(StepInfo)` after every step: `tokens` are the committed response tokens ([MASK] where none yet);
    `extra` has block, block_step, t, in_loop, n_committed, n_remasked (B,) and n_masked (B,).
    """
    config = config or RemaskConfig()
    special = model.special
    mask_id = special.mask
    device = _model_device(model) or prompts.ids.device
    prompts = prompts.to(device)
    B, P, L = prompts.batch_size, prompts.length, config.gen_length
    check_prompt_fits(SimpleNamespace(max_length=_context_limit(model)), prompts, L)
    rng = RowRNG(generator, B)

    x = torch.cat([prompts.ids, torch.full((B, L), mask_id, dtype=torch.long, device=device)], dim=1)
    attn = prompts.full_attention_mask(L)
    prompt_real = prompts.attention_mask.to(torch.bool)
    forward = ForwardCounter(with_positions(model.logits_from_ids))

    blk = config.effective_block_length
    n_blocks = L // blk
    S_b = config.steps // n_blocks
    n_suppress = suppressed_steps(config.eos_suppress_ratio, S_b)
    sigma = sigma_max(config.remdm_alpha_loop) if config.remdm else 0.0
    authors_quota = config.remdm and config.remdm_authors_quota
    T = float(config.temperature)
    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None
    schedule = torch.zeros(B, S_b, dtype=torch.long, device=device)

    for step in progress_bar(range(config.steps), total=config.steps, desc="remask", enabled=progress):
        k_blk, i = divmod(step, S_b)
        lo, hi = P + k_blk * blk, P + (k_blk + 1) * blk
        if i == 0:
            schedule = _row_schedule(x[:, lo:hi] == mask_id, S_b)

        # logits of the current block only (CFG: prompt -> MASK in the unconditional copy). Kept in fp32: the
        # Gumbel draw and the confidences below are float64 as LLaDA's, without a float64 copy of (blk, V).
        logits = block_logits(forward, x, attn, lo, hi, mask_id, masked_only=not config.remdm)
        if config.cfg_scale > 0:
            un_x = x.clone()
            un_x[:, :P] = un_x[:, :P].masked_fill(prompt_real, mask_id)
            un = block_logits(forward, un_x, attn, lo, hi, mask_id, masked_only=not config.remdm)
            logits = un + (config.cfg_scale + 1.0) * (logits - un)
        logits[..., mask_id] = NEG_INF  # never propose [MASK] as a token
        for tok in _banned_ids(config, special, i, n_suppress):
            logits[..., tok] = NEG_INF

        # proposal x0: argmax of exp(logits) / (-log U)^T  ==  argmax of logits - T log(-log U)
        if T > 0:
            u = _uniform(rng, tuple(logits.shape), device)
            x0 = (logits.double() - T * torch.log(-torch.log(u))).argmax(dim=-1)
        else:
            x0 = logits.argmax(dim=-1)  # fp32 -> fp64 is exact, so this equals the float64 argmax
        lse = torch.logsumexp(logits, dim=-1).double()

        def probs(idx: torch.Tensor) -> torch.Tensor:
            """softmax(logits)[idx] in float64, computed only at the gathered ids."""
            return (logits.gather(-1, idx.unsqueeze(-1)).squeeze(-1).double() - lse).exp()

        xb = x[:, lo:hi].clone()
        masked = xb == mask_id
        t = loop_time(i, S_b)
        in_loop = config.remdm and in_loop_window(t, config.remdm_t_on, config.remdm_t_off)
        remasked = torch.zeros_like(masked)
        if in_loop:
            conf_r = remask_confidence(probs, xb, x0, masked, config.remdm_confidence)
            eta = remask_probabilities(conf_r, ~masked, sigma)
            remasked = (~masked) & (_uniform(rng, tuple(masked.shape), device) < eta)
            xb = xb.masked_fill(remasked, mask_id)
            masked = masked | remasked

        if config.remasking == "low_confidence":
            conf = probs(x0)
        else:
            conf = _uniform(rng, tuple(masked.shape), device)
        conf = conf.masked_fill(~masked, NEG_INF)
        k = schedule[:, i].clone()
        if not authors_quota:
            k = k + remasked.sum(dim=1)  # re-masked tokens are re-revealed this step: masks never accumulate
            if i == S_b - 1:
                k = masked.sum(dim=1)  # the last step of a block resolves every remaining mask
        commit = _topk_mask(conf, k) & masked
        xb = torch.where(commit, x0, xb)
        x[:, lo:hi] = xb

        if trajectory is not None:
            trajectory.append(x[:, P:].to("cpu", copy=True))  # .cpu() of a CPU tensor would alias x
        if callback is not None:
            callback(StepInfo(step=step, total_steps=config.steps, tokens=x[:, P:].clone(), extra={
                "block": k_blk, "block_step": i, "t": t, "in_loop": bool(in_loop),
                "n_committed": commit.sum(dim=1).cpu(), "n_remasked": remasked.sum(dim=1).cpu(),
                "n_masked": (x[:, P:] == mask_id).sum(dim=1).cpu()}))

    ids = x[:, P:]
    if config.truncate_at_eos:
        lengths = stop_lengths(ids, special.stop_ids())
    else:
        lengths = torch.full((B,), L, dtype=torch.long, device=device)
    return SampleOutput(ids=ids.to("cpu", copy=True), lengths=lengths.cpu(), nfe=config.steps,
                        forward_passes=forward.count, trajectory=trajectory,
                        config={"sampler": "remdm" if config.remdm else "remask", **config.to_dict()})
