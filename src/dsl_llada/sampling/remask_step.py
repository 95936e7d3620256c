"""One step of LLaDA's discrete remasking (and of ReMDM-conf-loop), as a pure function with a documented output.

Given the current block's logits and tokens, `remask_step` makes the proposal x0, optionally re-masks committed
tokens (ReMDM, see `remdm.py`), scores each masked position's confidence and commits the top-k of them, where k
follows LLaDA's linear schedule (`transfer_counts`). It changes none of its inputs; the sampling loop around it
(`remask.sample_remask`) runs the model, applies guidance and token bans, and writes the returned tokens back.
This is the paper's LLaDA / LLaDA* baselines (§4 "Setup"; Appendix "LLaDA+EOS+Block") and, with
`config.remdm`, its LLaDA ReMDM baseline (ReMDM-conf-loop, Appendix "ReMDM Inference Hyperparameters").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.backbones.base import SpecialTokens
from ..config import RemaskConfig
from .common import RowRNG
from .guards import NonFiniteStateError
from .remdm import in_loop_window, loop_time, remask_confidence, remask_probabilities, sigma_max

__all__ = ["RemaskStep", "banned_ids", "block_schedule", "guide_and_ban", "remaining_quota", "remask_step", "row_argmax_logsumexp",
           "row_logsumexp", "suppressed_steps", "transfer_counts"]

NEG_INF = float("-inf")


def transfer_counts(n_masked: int, steps: int) -> list[int]:
    """LLaDA's linear schedule: `steps` counts summing to n_masked; base n // steps, the first n % steps get +1."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    if n_masked < 0:
        raise ValueError(f"n_masked={n_masked} must be >= 0")
    base, extra = divmod(int(n_masked), int(steps))
    return [base + 1 if i < extra else base for i in range(steps)]


def remaining_quota(n_masked: torch.Tensor, steps_left: int) -> torch.Tensor:
    """(B,) the linear schedule's count for the next step, recomputed from the masks left: ceil(n / steps_left),
    the first entry of `transfer_counts(n, steps_left)`. On a block the fixed schedule has followed this equals
    its own next count, so a threshold that is never exceeded leaves LLaDA's schedule unchanged."""
    if steps_left < 1:
        raise ValueError(f"steps_left={steps_left} must be >= 1")
    return torch.div(n_masked + (steps_left - 1), steps_left, rounding_mode="floor")


def suppressed_steps(ratio: float, steps_per_block: int) -> int:
    """floor(ratio * S_b): how many leading steps of each block ban EOS and EoT (tolerant of float rounding)."""
    return min(steps_per_block, int(math.floor(ratio * steps_per_block + 1e-9)))


def block_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, W) bool -> (B, steps) long commit counts, computed per row from that row's number of masks."""
    rows = [transfer_counts(int(m), steps) for m in masked.sum(dim=1).tolist()]
    return torch.tensor(rows, dtype=torch.long, device=masked.device)


def banned_ids(config: RemaskConfig, special: SpecialTokens, block_step: int, n_suppress: int) -> list[int]:
    """Token ids whose logits are -inf at this block step: EOS (and EoT) with `eos_inf`, every stop id during the
    first `n_suppress` steps of a block (`eos_suppress_ratio`)."""
    banned: list[int] = []
    if config.eos_inf:
        banned.append(special.eos)
        if config.eos_inf_include_eot and special.eot is not None:
            banned.append(special.eot)
    if block_step < n_suppress:
        banned.extend(special.stop_ids())
    return sorted(set(banned))


def guide_and_ban(logits: torch.Tensor, unconditional: torch.Tensor | None, *, config: RemaskConfig,
                  special: SpecialTokens, block_step: int, n_suppress: int) -> torch.Tensor:
    """The logits a step commits from, computed in place in `logits` (returned): classifier-free guidance
    un + (cfg_scale + 1) (logits - un) when `unconditional` is given, then [MASK] (never proposed) and the
    `banned_ids` of this block step at -inf."""
    if unconditional is not None:
        # in place and bit for bit the same as the out-of-place formula (each op is the same rounding)
        logits.sub_(unconditional).mul_(config.cfg_scale + 1.0).add_(unconditional)
    logits[..., special.mask] = NEG_INF
    for tok in banned_ids(config, special, block_step, n_suppress):
        logits[..., tok] = NEG_INF
    return logits


def _topk_mask(conf: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row, True at the k[row] highest-confidence positions (ties: lower index first). Callers AND the result
    with eligibility, so ineligible (-inf) positions are never committed even when k exceeds the eligible count."""
    order = torch.argsort(conf, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(conf.shape[-1], device=conf.device).expand_as(order))
    return rank < k.unsqueeze(-1)


LSE_CHUNK_BYTES = 8 << 20
"""`row_logsumexp` works on row chunks whose float64 copy is at most this many bytes."""


def row_logsumexp(logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.logsumexp(logits.double(), -1)`, bit for bit (each row is reduced on its own), over chunks of rows whose
    float64 copies stay under `LSE_CHUNK_BYTES`; with `rows` (bool, `logits.shape[:-1]`) only at those rows, +inf
    at the others (so exp(logit - lse) is 0 there).

    Float64 because the confidences exp(logit - logsumexp) must be LLaDA's float64 softmax: a log-sum-exp rounded
    to float32 has an ulp of 3.8e-6 at 36, which quantises every confidence of such a row to that relative grid,
    ties positions whose float64 confidences differ and reorders others (docs/samplers-discrete.md). Chunked because
    at batch 8 x V = 32k a whole-tensor float64 copy is ~134 MB per step, which the allocator maps fresh (page faults)
    every time; one chunk-sized buffer, reused for every chunk, stays in cache (docs/benchmarks/cpu-sampling.md,
    *Batching*)."""
    return _row_sweep(logits, with_argmax=False, rows=rows)[1]


def row_argmax_logsumexp(logits: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(`logits.argmax(-1)`, `row_logsumexp(logits, rows)`), bit for bit, in one sweep over the same row chunks: each
    chunk is read from memory once and reduced twice while it is in cache (at batch 8 the block logits are 67 MB,
    far past the cache; two whole-tensor passes read them twice). The argmax covers every row."""
    idx, lse = _row_sweep(logits, with_argmax=True, rows=rows)
    assert idx is not None
    return idx, lse


def _row_sweep(logits: torch.Tensor, *, with_argmax: bool,
               rows: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The last-dim argmax of `logits` (when asked) and its float64 logsumexp (only at `rows` when given, +inf
    elsewhere), over row chunks whose float64 copy is at most `LSE_CHUNK_BYTES`."""
    V, lead = logits.shape[-1], logits.shape[:-1]
    flat = logits.reshape(-1, V)
    n = max(1, LSE_CHUNK_BYTES // max(1, V * 8))
    if rows is None and flat.shape[0] <= n:
        return (logits.argmax(dim=-1) if with_argmax else None), torch.logsumexp(logits.double(), dim=-1)
    keep_rows = None if rows is None else rows.reshape(-1)
    idx = torch.empty(flat.shape[0], dtype=torch.long, device=logits.device) if with_argmax else None
    lse = (torch.empty(flat.shape[0], dtype=torch.float64, device=logits.device) if keep_rows is None
           else torch.full((flat.shape[0],), float("inf"), dtype=torch.float64, device=logits.device))
    chunk = torch.empty((min(n, flat.shape[0]), V), dtype=torch.float64, device=logits.device)
    for s in range(0, flat.shape[0], n):
        part = flat[s: s + n]
        if idx is not None:
            torch.argmax(part, dim=-1, out=idx[s: s + n])
        if keep_rows is None:
            c = chunk[: part.shape[0]]
            c.copy_(part)
            torch.logsumexp(c, dim=-1, out=lse[s: s + n])
            continue
        keep = keep_rows[s: s + n].nonzero().squeeze(1)
        if keep.numel():
            c = chunk[: keep.numel()]
            c.copy_(part[keep])
            lse[s + keep] = torch.logsumexp(c, dim=-1)
    return (None if idx is None else idx.view(lead)), lse.view(lead)


def _uniform(rng: RowRNG, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Float64 U[0, 1) draws (RowRNG draws on the generator's own device, so a CPU generator works with a GPU model)."""
    return rng.rand(shape, device=device, dtype=torch.float64)


@dataclass
class RemaskStep:
    """What one remasking step decided for the current block (all (B, W) over the block's positions)."""

    tokens: torch.Tensor
    """The block after the step: committed tokens, [MASK] where still (or again) masked."""
    proposal: torch.Tensor
    """x0, the proposed token per position (argmax, or Gumbel-max at temperature > 0); [MASK] is never proposed."""
    committed: torch.Tensor
    """bool: positions committed (unmasked) in this step."""
    remasked: torch.Tensor
    """bool: committed positions that ReMDM re-masked in this step (all False outside the loop window)."""
    t: float
    """Block time t = 1 - i/S_b of this step."""
    in_loop: bool
    """Whether ReMDM's loop window t_off < t <= t_on was active."""


def remask_step(logits: torch.Tensor, block_tokens: torch.Tensor, quota: torch.Tensor, *, block_step: int,
                steps_per_block: int, config: RemaskConfig, mask_id: int, rng: RowRNG) -> RemaskStep:
    """One step on the current block; changes none of its inputs.

    logits: (B, W, V) float32 logits of the block's positions, after guidance and token bans ([MASK] at -inf).
    block_tokens: (B, W) current tokens ([MASK] = not yet committed). quota: (B,) LLaDA's commit count for this
    step (`block_schedule(...)[:, block_step]`, or `remaining_quota` with a threshold). With `config.threshold`,
    every masked position whose confidence exceeds it is committed too. Random draws, in this order and only when needed: the Gumbel
    noise (temperature > 0), ReMDM's re-mask draws (inside the loop window), the random confidences
    (remasking='random').
    """
    device = logits.device
    S_b, i = steps_per_block, block_step
    T = float(config.temperature)
    # Plain low-confidence remasking reads the confidences of masked positions only: the float64 log-sum-exp (about
    # twice the float32 one's cost) runs at those rows.
    need = block_tokens == mask_id if config.remasking == "low_confidence" and not config.remdm else None
    # proposal x0: argmax of exp(logits) / (-log U)^T  ==  argmax of logits - T log(-log U)  (LLaDA's Gumbel-max)
    if T > 0:
        u = _uniform(rng, tuple(logits.shape), device)
        x0 = (logits.double() - T * torch.log(-torch.log(u))).argmax(dim=-1)
        lse = row_logsumexp(logits, need)
    else:
        x0, lse = row_argmax_logsumexp(logits, need)  # fp32 -> fp64 is exact, so this equals the float64 argmax
    if bool(torch.isnan(lse).any()):  # NaN anywhere in a (read) row's logits (-inf is a legitimate ban); O(B W)
        raise NonFiniteStateError(f"the logits became NaN at block step {i} with temperature={config.temperature!r}, "
                                  f"cfg_scale={config.cfg_scale!r}: the model's weights are damaged, or the guidance "
                                  f"left float32's range (lower cfg_scale); a NaN row would decode as token 0")

    def probs(idx: torch.Tensor) -> torch.Tensor:
        """softmax(logits.double())[idx], computed only at the gathered ids (float64 logit minus float64 lse)."""
        return (logits.gather(-1, idx.unsqueeze(-1)).squeeze(-1).double() - lse).exp()

    xb = block_tokens.clone()
    masked = xb == mask_id
    t = loop_time(i, S_b)
    in_loop = config.remdm and in_loop_window(t, config.remdm_t_on, config.remdm_t_off)
    remasked = torch.zeros_like(masked)
    if in_loop:
        conf_r = remask_confidence(probs, xb, x0, masked, config.remdm_confidence)
        eta = remask_probabilities(conf_r, ~masked, sigma_max(config.remdm_alpha_loop))
        remasked = (~masked) & (_uniform(rng, tuple(masked.shape), device) < eta)
        xb = xb.masked_fill(remasked, mask_id)
        masked = masked | remasked

    if config.remasking == "low_confidence":
        conf = probs(x0)
    else:
        conf = _uniform(rng, tuple(masked.shape), device)
    conf = conf.masked_fill(~masked, NEG_INF)
    k = quota.clone()
    if not (config.remdm and config.remdm_authors_quota):
        k = k + remasked.sum(dim=1)  # re-masked tokens are re-revealed this step: masks never accumulate
        if i == S_b - 1:
            k = masked.sum(dim=1)  # the last step of a block resolves every remaining mask
    if config.threshold is not None:  # also every masked position above the threshold: the top-k with k = their count
        k = torch.maximum(k, (conf > config.threshold).sum(dim=1))
    commit = _topk_mask(conf, k) & masked
    return RemaskStep(tokens=torch.where(commit, x0, xb), proposal=x0, committed=commit, remasked=remasked, t=t,
                      in_loop=bool(in_loop))
