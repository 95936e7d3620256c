"""Unit-sphere noise embedding, the softmax converter, noisy states and the posterior-mean denoiser.

Converter (paper §3.1, released-checkpoint layout in docs/provenance.md §1):
    logits = beta * z K^T + b  (K = [E; k_mask], E = unit noise embedding rows, fp32)
    pi     = softmax(logits)    over V + 1 slots (the last slot is [MASK])
    h      = pi W^T + c         (W: (H, V+1) initialised from the backbone's input embedding, mask row last)
The (V+1)-way softmax runs in fp32 and in token chunks so memory stays bounded at V=126,464 and long L.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ConverterConfig
from .numerics import Workspace, denormals_flushed


def flush_tiny(p: torch.Tensor) -> torch.Tensor:
    """Zero probabilities below the smallest normal float. At high SNR most of the softmax underflows into
    subnormals, which make the following CPU matmul several times slower; their total mass is < V * 1e-38.
    Skipped inside `numerics.flush_denormals()`, where the CPU zeroes them in hardware."""
    if denormals_flushed():
        return p
    return p.masked_fill(p < torch.finfo(p.dtype).tiny, 0.0)


SPARSE_MAX_FRACTION = 32
"""The sparse converter gathers W columns for a position only when it keeps at most (V+1) / this many slots; a
position with more (a flat softmax, at low SNR) goes through the dense product, which is cheaper per slot."""


SLOT_ALIGN = 16
"""Inference rows of slot logits start on a multiple of SLOT_ALIGN floats (64 bytes): with V+1 = 32,769 columns every
row of an unpadded buffer starts misaligned, and the slot-logit matmul writing it ran at ~60 % of the speed of an
aligned one (2-core AMD EPYC, MKL; docs/benchmarks/cpu-sampling.md)."""
SLOT_ALIGN_MIN_ROWS = 16
"""...only for chunks of at least this many rows: MKL takes another kernel for 1-3 rows, whose results depend on the
row stride (measured), and the product is cheap there anyway."""


def aligned_slots(n_slots: int, rows: int) -> int:
    """Row width of the inference slot buffer for `rows` x `n_slots` logits: `n_slots` rounded up to a multiple of
    SLOT_ALIGN (from SLOT_ALIGN_MIN_ROWS rows; `n_slots` below). The extra columns hold -inf logits, probability 0.
    Each value is unchanged: only the buffer's row stride differs (bit-identical, tests/test_speed_paths.py)."""
    if rows < SLOT_ALIGN_MIN_ROWS:
        return n_slots
    return -(-n_slots // SLOT_ALIGN) * SLOT_ALIGN


class NoiseEmbedding(nn.Module):
    """The (V, d) table of unit-norm token directions e_v (checkpoint key `noise_embed.weight`)."""

    def __init__(self, vocab_size: int, dim: int, trainable: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim), requires_grad=trainable)

    def unit(self) -> torch.Tensor:
        """Rows re-normalised to the unit sphere (every forward, so a trainable table stays on the sphere)."""
        return F.normalize(self.weight.float(), dim=-1)

    @torch.no_grad()
    def init_random(self, generator: torch.Generator) -> None:
        w = torch.randn(self.weight.shape, generator=generator, dtype=torch.float32)
        self.weight.copy_(F.normalize(w, dim=-1))

    @torch.no_grad()
    def init_pca(self, wte: torch.Tensor) -> None:
        """Top-d principal directions of the centred input embedding, each row normalised to unit norm."""
        x = wte.detach().to(torch.float64)
        x = x - x.mean(0, keepdim=True)
        d = self.weight.shape[1]
        if d > x.shape[1]:
            raise ValueError(f"noise_dim={d} exceeds the backbone hidden size {x.shape[1]} needed for PCA init")
        _, vecs = torch.linalg.eigh(x.T @ x)
        comps = vecs[:, -d:].flip(-1)
        self.weight.copy_(F.normalize((x @ comps).float(), dim=-1))


class Converter(nn.Module):
    """h = softmax(beta * z K^T + b) W^T + c; parameter names follow the released checkpoints (`converter.*`)."""

    def __init__(self, cfg: ConverterConfig, vocab_size: int, hidden_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.logit_bias = nn.Parameter(torch.zeros(vocab_size + 1))
        self.backbone_embedding = nn.Linear(vocab_size + 1, hidden_size, bias=cfg.layout == "released")
        self.beta = nn.Parameter(torch.tensor(float(cfg.beta_init)))
        self.mask_key = nn.Parameter(torch.zeros(cfg.noise_dim)) if cfg.layout == "paper" else None
        self.residual_proj = nn.Linear(cfg.noise_dim, hidden_size) if cfg.residual else None

    @torch.no_grad()
    def init_from_backbone(self, wte: torch.Tensor, mask_id: int) -> None:
        """W = [wte^T | wte[mask]], mask logit bias ln V, beta = beta_init (docs/provenance.md §1.1)."""
        V = self.vocab_size
        if wte.shape[0] != V:
            raise ValueError(f"input embedding has {wte.shape[0]} rows but the converter expects vocab_size={V}")
        W = self.backbone_embedding.weight
        W[:, :V].copy_(wte.T.to(W.dtype))
        W[:, V].copy_(wte[mask_id].to(W.dtype))
        if self.backbone_embedding.bias is not None:
            if self.cfg.value_bias_init == "zeros":
                self.backbone_embedding.bias.zero_()
            else:
                bound = 1.0 / math.sqrt(V + 1)
                self.backbone_embedding.bias.uniform_(-bound, bound)
        self.logit_bias.zero_()
        self.logit_bias[V] = math.log(V)
        self.beta.fill_(self.cfg.beta_init)
        if self.mask_key is not None:
            self.mask_key.zero_()
        if self.residual_proj is not None:
            self.residual_proj.weight.normal_(0.0, 0.01)
            self.residual_proj.bias.zero_()

    # -- the map -----------------------------------------------------------------------------------
    def _needs_grad(self, *tensors: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (any(t.requires_grad for t in tensors)
                                            or any(p.requires_grad for p in self.parameters()))

    def _keys(self, E: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, b): K = [E; k_mask] fp32 and the logit bias b, both padded to `width` >= V+1 slots with zero keys and
        -inf biases (so a padded slot's logit is -inf and its probability exactly 0); cached while E, the mask key
        and the bias are unchanged (inference only)."""
        mk, bias = self.mask_key, self.logit_bias
        stamp = (E._version, None if mk is None else (mk.data_ptr(), mk._version), bias.data_ptr(), bias._version)
        cache = getattr(self, "_key_cache", None)
        if cache is None or cache[0] is not E or cache[1] != stamp:
            keys: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            cache = (E, stamp, keys)
            object.__setattr__(self, "_key_cache", cache)  # not a module attribute: never saved
        if width not in cache[2]:
            n = E.shape[0] + 1
            K = E.new_zeros((width, E.shape[1]), dtype=torch.float32)
            K[: n - 1].copy_(E)
            K[n - 1].copy_(mk.detach() if mk is not None else torch.zeros((), dtype=torch.float32))
            b = torch.full((width,), float("-inf"), dtype=torch.float32, device=E.device)
            b[:n].copy_(bias.detach())
            cache[2][width] = (K, b)
        return cast(tuple[torch.Tensor, torch.Tensor], cache[2][width])

    def _values_t(self) -> torch.Tensor:
        """W^T (V+1, H) contiguous, for row gathers by the sparse path; cached while W is unchanged (inference only)."""
        W = self.backbone_embedding.weight
        stamp = (W.data_ptr(), W._version, W.dtype, W.device)
        cache = getattr(self, "_wt_cache", None)
        if cache is not None and cache[0] == stamp:
            return cast(torch.Tensor, cache[1])
        WT = W.detach().t().contiguous()
        object.__setattr__(self, "_wt_cache", (stamp, WT))
        return WT

    def slot_logits(self, z: torch.Tensor, E: torch.Tensor, beta: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """(N, d) states -> (N, V+1) fp32 converter logits beta * z K^T + b (inference only: written into `out` when
        given, which may be wider than V+1 columns (`aligned_slots`): its extra columns get -inf, and the result is
        the view of its first V+1 columns)."""
        z32 = z.float()
        if not self._needs_grad(z, E, beta):  # inference: one fused matmul + bias into the (N, V+1) result
            n_slots = E.shape[0] + 1
            K, b = self._keys(E.float(), n_slots if out is None else out.shape[-1])
            return torch.addmm(b, z32, K.T, alpha=float(beta), out=out)[:, :n_slots]
        tok = z32 @ E.float().T
        if self.mask_key is None:
            mask = torch.zeros_like(tok[:, :1])
        else:
            mask = (z32 @ self.mask_key.float())[:, None]
        return beta.float() * torch.cat([tok, mask], dim=-1) + self.logit_bias.float()

    def _chunk(self, z: torch.Tensor, E: torch.Tensor, beta: torch.Tensor, tolerance: float = 0.0,
               out: torch.Tensor | None = None, workspace: Workspace | None = None) -> torch.Tensor:
        # The (V+1)-way softmax stays fp32 even under bf16 autocast (bf16 has too few digits for 126k slots).
        with torch.autocast(device_type=z.device.type, enabled=False):
            n_slots = E.shape[0] + 1
            if self._needs_grad(z, E, beta):
                pi = torch.softmax(self.slot_logits(z, E, beta), dim=-1)
            else:  # inference: the slot logits and their softmax share one (N, aligned V+1) buffer, reused per run
                # aligned rows on CPUs only (measured with MKL; a GPU library may pick another algorithm for N)
                shape = (z.shape[0], aligned_slots(n_slots, z.shape[0]) if z.device.type == "cpu" else n_slots)
                buf = torch.empty(shape, dtype=torch.float32, device=z.device) if workspace is None else \
                    workspace.get("converter.slots", shape, torch.float32, z.device)
                self.slot_logits(z, E, beta, buf)
                pi = torch.softmax(buf, dim=-1, out=buf)[:, :n_slots]  # padded slots: exp(-inf) = 0
            pi = flush_tiny(pi)
        lin = self.backbone_embedding
        if tolerance > 0:
            h = self._sparse_values(pi, tolerance)
        elif out is not None and lin.bias is not None:
            h = torch.addmm(lin.bias, pi.to(lin.weight.dtype), lin.weight.T, out=out)
        else:
            h = F.linear(pi.to(lin.weight.dtype), lin.weight, lin.bias)
        if self.residual_proj is not None:
            z32 = z.float()
            z_low = pi[:, : self.vocab_size] @ E.float()
            u = z_low / (z_low.norm(dim=-1, keepdim=True) + 1e-8)
            z_high = z32 - (z32 * u).sum(-1, keepdim=True) * u
            h = h + self.residual_proj(z_high.to(self.residual_proj.weight.dtype))
        if out is not None and h is not out:
            out.copy_(h)
        return h

    def _sparse_values(self, pi: torch.Tensor, tolerance: float) -> torch.Tensor:
        """h from the slots that hold the mass: per row keep every slot with pi >= tolerance / (V+1) (so the dropped
        mass is < tolerance), renormalise, and sum those columns of W (one embedding_bag). Rows that keep too many
        slots for a gather to pay off use the dense product instead (exact for them)."""
        lin = self.backbone_embedding
        n_slots = pi.shape[-1]
        keep = pi >= tolerance / n_slots
        counts = keep.sum(-1)
        sparse = counts <= max(1, n_slots // SPARSE_MAX_FRACTION)
        n_sparse = int(sparse.sum())
        if n_sparse == 0:  # flat softmaxes (low SNR): the dense product
            return F.linear(pi.to(lin.weight.dtype), lin.weight, lin.bias)
        if n_sparse == pi.shape[0]:
            rows = None
            r, col = keep.nonzero(as_tuple=True)  # row-major: each row's slots are contiguous
        else:
            rows = sparse.nonzero().squeeze(1)
            r, col = keep[rows].nonzero(as_tuple=True)
            r = rows[r]
        w = pi[r, col]
        kept = torch.zeros(pi.shape[0], dtype=w.dtype, device=w.device).index_add_(0, r, w)
        w = w / kept[r]
        n = counts if rows is None else counts[rows]
        offsets = torch.cumsum(n, 0) - n
        hs = F.embedding_bag(col, self._values_t(), offsets, mode="sum", per_sample_weights=w.to(lin.weight.dtype))
        if lin.bias is not None:
            hs = hs + lin.bias
        if rows is None:
            return hs
        h = torch.empty(pi.shape[0], lin.out_features, dtype=lin.weight.dtype, device=pi.device)
        dense_rows = (~sparse).nonzero().squeeze(1)
        h[dense_rows] = F.linear(pi[dense_rows].to(lin.weight.dtype), lin.weight, lin.bias)
        h[rows] = hs
        return h

    def forward(self, z: torch.Tensor, E: torch.Tensor, beta: torch.Tensor | float | None = None, *,
                tolerance: float = 0.0, workspace: Workspace | None = None) -> torch.Tensor:
        """Convert states z (..., d) to backbone input embeddings (..., H).

        `E` is the unit noise embedding (V, d) (pass `NoiseEmbedding.unit()`); `beta` overrides the trained
        sharpness (inference uses beta_inf = 2 x trained beta). `tolerance` > 0 selects the sparse inference path
        (slots holding all but < `tolerance` of each position's mass, renormalised; see `_sparse_values`); 0 is
        the exact dense map, and what any call that needs gradients uses. `workspace` (inference) keeps the
        (chunk, V+1) slot buffer between calls (a sampler passes one per run).
        """
        if tolerance < 0 or tolerance >= 1:
            raise ValueError(f"tolerance={tolerance!r} must be in [0, 1) (0 = exact dense converter)")
        b = self.beta if beta is None else torch.as_tensor(beta, dtype=torch.float32, device=z.device)
        lead = z.shape[:-1]
        flat = z.reshape(-1, z.shape[-1])
        n = flat.shape[0]
        step = self.cfg.token_chunk or n or 1
        H = self.backbone_embedding.out_features
        if self._needs_grad(flat, E, b):  # autograd: no in-place output, optionally recompute chunks in backward
            if tolerance:
                raise ValueError(f"tolerance={tolerance!r}: the sparse converter is an inference path; calls that "
                                 f"need gradients (training) use the exact dense converter (tolerance=0)")
            ckpt = self.cfg.checkpoint_chunks
            outs = [checkpoint(self._chunk, flat[s: s + step], E, b, use_reentrant=False) if ckpt
                    else self._chunk(flat[s: s + step], E, b) for s in range(0, n, step)]
            h = torch.cat(outs, dim=0) if outs else flat.new_zeros(0, H)
            return h.reshape(*lead, H)
        W = self.backbone_embedding.weight
        h = torch.empty(n, H, dtype=W.dtype, device=W.device)  # each chunk writes its rows in place: no concatenation
        for s in range(0, n, step):
            self._chunk(flat[s: s + step], E, b, tolerance, out=h[s: s + step], workspace=workspace)
        return h.reshape(*lead, H)

    def clean_embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """The converter's output for a perfectly clean one-hot input: W[:, id] (+ c). Shape (..., H)."""
        h = F.embedding(ids, self.backbone_embedding.weight.T)
        if self.backbone_embedding.bias is not None:
            h = h + self.backbone_embedding.bias
        return h


def noisy_states(E: torch.Tensor, ids: torch.Tensor, gamma: torch.Tensor | float,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """z = gamma * e_x + sqrt(gamma) * eps, eps ~ N(0, I_d); gamma scalar, (B,) per sequence or (B, L) per token.

    Returned in fp32 (gamma and eps are kept in fp32, as the authors).
    """
    e = E[ids].float()
    g = torch.as_tensor(gamma, dtype=torch.float32, device=e.device)
    if g.dim() > 0 and tuple(g.shape) != tuple(ids.shape):  # same shape as ids = per token
        if g.dim() == 1 and ids.dim() == 2:
            if g.shape[0] != ids.shape[0]:
                raise ValueError(f"per-sequence gamma has {g.shape[0]} entries for a batch of {ids.shape[0]}")
            g = g[:, None]
        else:
            raise ValueError(f"per-token gamma shape {tuple(g.shape)} does not match ids shape {tuple(ids.shape)}")
    g = g[..., None] if g.dim() > 0 else g
    eps = torch.randn(e.shape, generator=generator, dtype=torch.float32, device=e.device)
    return g * e + g.clamp_min(0).sqrt() * eps


TOP_M_STRIDE = 8
"""`top_m_values` estimates its threshold from every TOP_M_STRIDE-th logit of a row."""
TOP_M_GROUP = 8
"""`sample_kth_largest` ranks groups of this many consecutive sample values by their largest."""


def sample_kth_largest(x: torch.Tensor, stride: int, k: int) -> torch.Tensor:
    """(rows, 1): the k-th largest value of each row of the strided sample `x[:, ::stride]` (NaN above every number,
    as `topk` orders them), equal to `x[:, ::stride].topk(k).values.amin(-1, keepdim=True)`.

    The sample is cut into groups of TOP_M_GROUP consecutive values (the last one padded with -inf); `topk` picks
    the k groups with the largest maxima, and the k-th largest of their k * TOP_M_GROUP values is the answer: every
    sample value above the k-th largest sits in a group whose maximum is above it, there are fewer than k such
    groups, so all of them are picked, and each other picked group holds a value at least the k-th largest. Two
    `topk`s over k * TOP_M_GROUP and n / (stride * TOP_M_GROUP) values replace one over n / stride."""
    rows, n = x.shape
    ns = -(-n // stride)
    ng = -(-ns // TOP_M_GROUP)
    if ng < k:
        return x[:, ::stride].topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    s = x.new_empty((rows, ng * TOP_M_GROUP))
    s[:, :ns].copy_(x[:, ::stride])
    s[:, ns:].fill_(float("-inf"))
    groups = s.view(rows, ng, TOP_M_GROUP)
    top = groups.amax(-1).topk(k, dim=-1, sorted=False).indices
    picked = groups.gather(1, top.unsqueeze(-1).expand(rows, k, TOP_M_GROUP)).view(rows, k * TOP_M_GROUP)
    return picked.topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)


def flat_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """`mask.reshape(-1).nonzero().squeeze(1)` of a bool tensor, in the same (ascending) order, scanning the mask
    as 32-bit words first: on a sparse mask (top-M candidates: ~2 % of a row) only the non-zero words' bytes are
    scanned again (about 20 % faster on 128 x 32,768 than `nonzero` alone, 2-core AMD EPYC, 1 thread)."""
    flat = mask.reshape(-1)
    if flat.numel() % 4 or flat.storage_offset() % 4 or flat.device.type != "cpu":
        return flat.nonzero().squeeze(1)
    words = flat.view(torch.int32)
    w = words.nonzero().squeeze(1)
    j = words.index_select(0, w).view(torch.bool).nonzero().squeeze(1)
    return w.index_select(0, j >> 2) * 4 + (j & 3)


def top_m_values(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`x.topk(m, dim=-1)` of a 2-D tensor (values in descending order, and the same tokens except for the order of
    exactly tied values), found with less work when a row is much longer than m (CPU; the output head's V = 32k-126k
    against M = 512).

    A threshold t per row is the (1.5 m / s)-th largest of a strided sample (every s-th value, s = TOP_M_STRIDE;
    found by `sample_kth_largest`), so typically ~1.5 m values of the row are >= t; when every row has at least m
    of them (checked, not assumed), the top m of the row are among them, and one `topk` over these candidates gives
    exactly the row's top m. Otherwise (an unlucky sample, NaNs, flat rows) it is `topk` over the whole row.
    Measured at 128 x 32,768, M = 512 on the 2-core AMD EPYC, 1 thread: about 12 ms of CPU time instead of
    `topk`'s 24 (docs/benchmarks/cpu-sampling.md).

    The candidate array (which positions, in which order) decides the order that `topk` gives exactly tied values,
    and that order the summation order of the posterior mean: with bf16 logits ties are common, so the candidates
    must stay exactly these (a different threshold changed bf16 tokens; docs/benchmarks/cpu-sampling.md)."""
    rows, n = x.shape
    k_sub = -(-3 * m // (2 * TOP_M_STRIDE))
    if x.device.type != "cpu" or n < 16 * m or rows == 0:
        return x.topk(m, dim=-1)
    t = sample_kth_largest(x, TOP_M_STRIDE, k_sub)
    # candidates as flat row-major positions: 1-D gathers and scatters (2-D advanced indexing costs ~70 ns/element)
    flat = flat_nonzero(x >= t)
    r = torch.div(flat, n, rounding_mode="floor")
    counts = torch.bincount(r, minlength=rows)
    width = int(counts.max())
    if int(counts.min()) < m or width > n // 4:
        return x.topk(m, dim=-1)
    slot = torch.arange(flat.numel(), device=x.device) - (counts.cumsum(0) - counts)[r] + r * width
    vals = x.new_full((rows * width,), float("-inf")).index_copy_(0, slot, x.reshape(-1).index_select(0, flat))
    cols = torch.zeros(rows * width, dtype=torch.long, device=x.device).index_copy_(0, slot, flat - r * n)
    v, j = vals.view(rows, width).topk(m, dim=-1)
    return v, cols.view(rows, width).gather(1, j)


def posterior_mean(logits: torch.Tensor, E: torch.Tensor, top_m: int = 512, chunk: int = 256,
                   workspace: Workspace | None = None) -> torch.Tensor:
    """Clean-token embedding estimate ê = sum_{v in top-M} p̃_v e_v (paper §3.2). logits (..., V) -> (..., d) fp32.

    Rows are processed `chunk` at a time (each row independently: the chunk size changes no value), so the fp32
    working set stays chunk x V (130 MB at V = 126,464) whatever the batch. top_m = 0 uses the full softmax.
    `workspace` (inference) keeps the fp32 copy of a chunk of bf16/fp16 logits between calls (no fresh 16-130 MB
    allocation, so no page faults, per call). Renormalising the top-M probabilities equals a softmax over the top-M
    logits;
    the gather of the M rows of E and their weighted sum are one `embedding_bag` per chunk of positions.
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.shape[-1] != E.shape[0]:
        raise ValueError(f"logits have {flat.shape[-1]} classes but the noise embedding has {E.shape[0]} rows")
    E32 = E.float()
    outs = []
    for s in range(0, flat.shape[0], chunk):
        part = flat[s: s + chunk]
        if workspace is not None and part.dtype != torch.float32:
            buf = workspace.get("posterior.logits32", (min(chunk, flat.shape[0]), flat.shape[1]), torch.float32,
                                part.device)
            lc = buf[: part.shape[0]].copy_(part)
        else:
            lc = part.float()
        if top_m and top_m < lc.shape[-1]:
            vals, idx = top_m_values(lc, top_m)
            p = flush_tiny(torch.softmax(vals, dim=-1))
            outs.append(F.embedding_bag(idx, E32, mode="sum", per_sample_weights=p))
        else:
            outs.append(torch.softmax(lc, dim=-1) @ E32)
    if len(outs) == 1:
        out = outs[0]
    else:
        out = torch.cat(outs, 0) if outs else flat.new_zeros(0, E.shape[1], dtype=torch.float32)
    return out.reshape(*lead, E.shape[1])
