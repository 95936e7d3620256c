"""Log-probabilities of the final tokens, from the sampler's final distribution (a step callback; docs/serving.md).

Which distribution that is depends on the sampler: for the SDE samplers, the converter's posterior of the decode
pass (softmax of its logits, renormalised without [MASK], which the decode never picks); for remasking / ReMDM,
the model's (guided, with banned ids removed) distribution at the step that committed the token (the last commit
for a ReMDM token that was re-masked and committed again). The recorder only looks at the positions committed at
each step, so it costs nothing on steps that commit nothing, and nothing at all when no request asked for logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import StepInfo

MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    """The most likely ids at the same position and step, with their log-probabilities (best first)."""


class LogprobRecorder:
    """Step callback recording, per row and response position, the log-probability of the token committed there
    and the `top` most likely alternatives (0 = the token's own only), over the `batch` rows of the sampler call
    (mapped through `StepInfo.rows` once rows have left the batch)."""

    def __init__(self, batch: int, gen_length: int, top: int, mask_id: int):
        self.B, self.L, self.k, self.mask_id = batch, gen_length, min(int(top), MAX_TOP_LOGPROBS), mask_id
        self.tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        """(chosen token's logprob (B, L), top ids (B, L, k), top logprobs (B, L, k)), made at the first commit."""

    def __call__(self, info: StepInfo) -> None:
        if info.newly_committed is None or info.logits is None or info.window is None:
            return
        lo, hi = info.window
        fresh = info.newly_committed[:, lo:hi]
        if not bool(fresh.any()):
            return
        B = self.B
        if self.tables is None:
            self.tables = (torch.full((B, self.L), float("nan"), dtype=torch.float64),
                           torch.zeros((B, self.L, self.k), dtype=torch.long),
                           torch.zeros((B, self.L, self.k), dtype=torch.float64))
        chosen, top_ids, top_lps = self.tables
        rows, cols = fresh.nonzero(as_tuple=True)
        logits = info.logits[rows, cols].double()  # (N, V): only the committed positions
        logits[:, self.mask_id] = float("-inf")
        lp = torch.log_softmax(logits, dim=-1)
        tokens = info.tokens[rows, cols + lo]
        r, c = rows.cpu(), (cols + lo).cpu()
        if info.rows is not None:  # this step's rows -> the call's original rows
            r = torch.tensor(info.rows, dtype=torch.long)[r]
        chosen[r, c] = lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).cpu()
        if self.k:
            vals, ids = lp.topk(self.k, dim=-1)
            top_ids[r, c] = ids.cpu()
            top_lps[r, c] = vals.cpu()

    def row(self, row: int, length: int, top: int, ids: list[int] | None = None) -> list[TokenLogprob]:
        """The first `length` positions of `row` with `top` alternatives each (ids: the row's response tokens)."""
        if self.tables is None:
            raise RuntimeError("the sampler committed no token through its step callback")
        chosen, top_ids, top_lps = self.tables
        out = []
        for j in range(length):
            alts = [(int(i), float(v)) for i, v in zip(top_ids[row, j, :top].tolist(), top_lps[row, j, :top].tolist())]
            out.append(TokenLogprob(token_id=-1 if ids is None else ids[j], logprob=float(chosen[row, j]), top=alts))
        return out
