"""Masked-diffusion log-likelihood of a continuation given a context (the LLaDA paper's Monte Carlo bound).

For a target y of T tokens after a context c, a masked diffusion LM gives the lower bound

    log p(y | c) >= E_{l ~ U{1..T}} E_{S ⊂ [T], |S| = l} [ (T / l) · Σ_{i ∈ S} log p_θ(y_i | c, y with S masked) ]

(the 1/t weighting with t = l/T). It is exact when T = 1: then l = 1 and the bound is log p_θ(y | c, [MASK]).
The estimate draws K mask patterns per request: mask counts stratified over {1..T} (l_k = 1 + ⌊(k + u)·T/K⌋ with
one uniform u per request, so every count appears ⌊K/T⌋ or ⌈K/T⌉ times), then l_k target positions uniformly.
Only target positions are masked. Rows of all requests are batched together (left-padded, attention mask), and each
request draws from its own seeded generator, so results do not depend on the batch size or on other requests.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.backbones.base import model_device


@dataclass(frozen=True)
class LikelihoodRequest:
    """Token ids of the context and of the continuation whose log-likelihood is wanted."""

    context: tuple[int, ...]
    target: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("a likelihood request needs at least one continuation token")


def _logits(model, ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    return model.logits_from_ids(ids, attention_mask)


def stratified_counts(T: int, K: int, u: float) -> list[int]:
    """K mask counts in 1..T, stratified: l_k = 1 + floor((k + u) T / K)."""
    return [1 + min(T - 1, int((k + u) * T / K)) for k in range(K)]


def mask_patterns(T: int, K: int, generator: torch.Generator) -> list[torch.Tensor]:
    """K boolean masks over the T target positions (mask counts stratified, positions uniform)."""
    u = float(torch.rand((), generator=generator))
    out = []
    for n_masked in stratified_counts(T, K, u):
        m = torch.zeros(T, dtype=torch.bool)
        m[torch.randperm(T, generator=generator)[:n_masked]] = True
        out.append(m)
    return out


def _score_rows(model, rows: list[tuple[list[int], torch.Tensor, list[int]]], *, mask_id: int, pad_id: int,
                batch_size: int, device) -> list[float]:
    """For each row (full ids, mask over the full sequence, gold ids at the masked positions), the sum of
    log p(gold | masked input) over its masked positions."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    out = [0.0] * len(rows)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(rows[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        keep = torch.zeros((len(idx), width), dtype=torch.long)
        masked = torch.zeros((len(idx), width), dtype=torch.bool)
        for r, i in enumerate(idx):
            seq, m, _ = rows[i]
            off = width - len(seq)
            ids[r, off:] = torch.as_tensor(seq)
            keep[r, off:] = 1
            masked[r, off:] = m
        ids = ids.masked_fill(masked, mask_id).to(device)
        attn = None if bool(keep.all()) else keep.to(device)
        logits = _logits(model, ids, attn)
        rows_idx, pos_idx = masked.nonzero(as_tuple=True)  # row-major: each row's masked positions in order
        logp = torch.log_softmax(logits[rows_idx.to(logits.device), pos_idx.to(logits.device)].float(), dim=-1).cpu()
        gold = torch.as_tensor([t for i in idx for t in rows[i][2]])
        picked = logp[torch.arange(len(gold)), gold]
        counts = masked.sum(1).tolist()
        for r, part in zip(idx, picked.split(counts)):
            out[r] = float(part.sum())
    return out


@torch.no_grad()
def mc_loglikelihood(model, requests: Sequence[LikelihoodRequest], *, mc_samples: int = 128, batch_size: int = 32,
                     seed: int = 0) -> list[float]:
    """Monte Carlo estimate of the bound above for each request (request i draws from a generator seeded
    seed + i). `model` is a DSLModel or a Backbone (discrete path: `logits_from_ids`)."""
    if mc_samples < 1 or batch_size < 1:
        raise ValueError(f"mc_samples={mc_samples} and batch_size={batch_size} must be >= 1")
    special = model.special
    device = model_device(model)
    rows, owner, weight = [], [], []
    for i, req in enumerate(requests):
        T = len(req.target)
        K = 1 if T == 1 else mc_samples  # one token: the bound is exact with a single pattern
        g = torch.Generator().manual_seed(seed + i)
        seq = list(req.context) + list(req.target)
        for m in mask_patterns(T, K, g):
            full = torch.zeros(len(seq), dtype=torch.bool)
            full[len(req.context):] = m
            rows.append((seq, full, [t for t, b in zip(req.target, m.tolist()) if b]))
            owner.append(i)
            weight.append(T / int(m.sum()) / K)
    scores = _score_rows(model, rows, mask_id=special.mask, pad_id=special.pad_id, batch_size=batch_size,
                         device=device)
    totals = [0.0] * len(requests)
    for s, i, w in zip(scores, owner, weight):
        totals[i] += w * s
    return totals


@torch.no_grad()
def exact_bound(model, request: LikelihoodRequest) -> float:
    """The bound computed by enumerating every mask pattern (2^T − 1 forwards; for tests and tiny T)."""
    T = len(request.target)
    if T > 12:
        raise ValueError(f"exact enumeration needs 2^T forwards; T={T} is too long (at most 12)")
    special = model.special
    device = model_device(model)
    total = 0.0
    for n_masked in range(1, T + 1):
        subsets = list(itertools.combinations(range(T), n_masked))
        acc = 0.0
        for S in subsets:
            m = torch.zeros(T, dtype=torch.bool)
            m[list(S)] = True
            full = torch.zeros(len(request.context) + T, dtype=torch.bool)
            full[len(request.context):] = m
            row = (list(request.context) + list(request.target), full, [request.target[j] for j in S])
            acc += _score_rows(model, [row], mask_id=special.mask, pad_id=special.pad_id, batch_size=1,
                               device=device)[0]
        total += (T / n_masked) * acc / math.comb(T, n_masked) / T
    return total


@torch.no_grad()
def greedy_match(model, requests: Sequence[LikelihoodRequest], *, batch_size: int = 32) -> list[bool]:
    """Whether the continuation is the argmax at every target position when the whole target is masked (exact
    for one-token targets; for longer ones this single-pass check is an approximation of greedy decoding)."""
    special = model.special
    device = model_device(model)
    out = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start:start + batch_size]
        width = max(len(r.context) + len(r.target) for r in chunk)
        ids = torch.full((len(chunk), width), special.pad_id, dtype=torch.long)
        keep = torch.zeros_like(ids)
        for r, req in enumerate(chunk):
            seq = list(req.context) + [special.mask] * len(req.target)
            ids[r, width - len(seq):] = torch.as_tensor(seq)
            keep[r, width - len(seq):] = 1
        attn = None if bool(keep.all()) else keep.to(device)
        pred = _logits(model, ids.to(device), attn).argmax(-1).cpu()
        for r, req in enumerate(chunk):
            T = len(req.target)
            out.append(pred[r, width - T:].tolist() == list(req.target))
    return out


def rolling_windows(tokens: Sequence[int], *, max_length: int, context_len: int,
                    prefix: Sequence[int] = ()) -> list[LikelihoodRequest]:
    """Split a text's tokens into consecutive target windows for `loglikelihood_rolling`: each window of at most
    `max_length - context_len` tokens is conditioned on up to `context_len` tokens that precede it (the first on
    `prefix`, e.g. BOS), so every token is predicted exactly once and the window sums give log p(text)."""
    if not 0 <= context_len < max_length or len(prefix) > context_len:
        raise ValueError(f"need len(prefix)={len(prefix)} <= context_len={context_len} < max_length={max_length}")
    step = max_length - context_len
    out = []
    for start in range(0, len(tokens), step):
        ctx = tuple(tokens[max(0, start - context_len):start]) if start else tuple(prefix)
        out.append(LikelihoodRequest(ctx, tuple(tokens[start:start + step])))
    return out
