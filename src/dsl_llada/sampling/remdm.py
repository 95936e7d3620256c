"""ReMDM-conf-loop: stochastic re-masking of committed tokens inside a loop window (the paper's ReMDM baseline).

The reveal loop is LLaDA's (`remask.sample_remask`, with `remask.sample_remdm` as the shortcut that switches
ReMDM on); this module holds the pure ReMDM pieces that `remask_step.remask_step` calls when `RemaskConfig.remdm`
is on (paper Appendix "ReMDM Inference Hyperparameters").

Per block step i of S_b, t = 1 - i/S_b. Inside the window t_off < t <= t_on:
    sigma_max = min(1, (1 - alpha_loop) / alpha_loop)
    u_j   = 1 - conf_j                       over committed response positions j of the current block
    eta_j = sigma_max * softmax_j(u_j)       (softmax over those positions only)
and each such position is re-masked independently with probability eta_j. conf_j is the model's probability of
the token committed at j (`remdm_confidence='committed'`, default) or of the sampler's current proposal there
(`'argmax'`, the authors' code; at temperature 0 that is the argmax). See docs/samplers-discrete.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WINDOW_TOL = 1e-12
"""Window boundaries are compared with this tolerance so that t = 1 - i/S_b that equals t_off (or t_on) in exact
arithmetic is classified exactly (t_off excluded, t_on included) despite float rounding of 1 - i/S_b."""


def loop_time(block_step: int, steps_per_block: int) -> float:
    """t = 1 - i / S_b for block step i (0-based): 1 at the first step of a block, 1/S_b at the last."""
    return 1.0 - block_step / steps_per_block


def in_loop_window(t: float, t_on: float, t_off: float) -> bool:
    """Whether t lies in the loop window t_off < t <= t_on."""
    return t > t_off + WINDOW_TOL and t <= t_on + WINDOW_TOL


def sigma_max(alpha_loop: float) -> float:
    """Maximum remask probability budget per step: min(1, (1 - alpha) / alpha) (0.111... at alpha 0.9)."""
    return min(1.0, (1.0 - alpha_loop) / alpha_loop)


def remask_probabilities(conf: torch.Tensor, committed: torch.Tensor, sigma: float) -> torch.Tensor:
    """eta_j = sigma * softmax_j(1 - conf_j) over the committed positions of each row (0 elsewhere).

    conf: (B, W) probabilities; committed: (B, W) bool. Rows with no committed position get all zeros.
    """
    scores = (1.0 - conf.to(torch.float64)).masked_fill(~committed, float("-inf"))
    any_committed = committed.any(dim=-1, keepdim=True)
    scores = torch.where(any_committed, scores, torch.zeros_like(scores))  # avoid softmax over all -inf (NaN)
    probs = torch.softmax(scores, dim=-1) * sigma
    return probs.masked_fill(~committed, 0.0)


def remask_confidence(probs: torch.Tensor | Callable[[torch.Tensor], torch.Tensor], block_tokens: torch.Tensor, proposal: torch.Tensor,
                      masked: torch.Tensor, mode: str) -> torch.Tensor:
    """conf_j for the uncertainty u_j = 1 - conf_j.

    'committed': p_j(committed token at j) (our fix); 'argmax': p_j(proposal at j), the authors' choice.
    Masked positions get an arbitrary value (they are excluded by `remask_probabilities`).
    """
    if mode == "argmax":
        idx = proposal
    else:
        idx = torch.where(masked, proposal, block_tokens)
    if isinstance(probs, torch.Tensor):
        return probs.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    return probs(idx)  # a prob_at(idx) function (the sampler avoids materialising the full softmax)
