"""Training-time monitoring: fixed-SNR, clean and infilling evaluations, converter and noise-embedding health, and
the DSL NLL upper bound. The paper reports none of these; they are what the authors' training script logged (fixed
SNR {1, 5, 10, 20, 50} through the DSL path of paper §3.1, clean and 50 %-[MASK] infilling CE through `wte`, |cos|
and effective rank of noise rows and converter value columns), so runs here can be compared with theirs.

Conventions
- Every function runs under ``torch.no_grad()`` with every module of the model in eval mode, and restores each
  module's own train/eval flag afterwards (so a deliberately frozen sub-module in eval mode stays so).
- ``batches`` is an iterable of training-style batches ``{"input_ids", optional "prompt_length",
  optional "attention_mask"}`` (moved to the model's device here). The evaluated positions are the objectives'
  *eligible* positions: non-padding, non-prompt; prompt positions are fed clean.
- Token averages are over all evaluated positions of all batches (not means of per-batch means).
- Random draws come only from ``generator`` (which must live on the model's device; None = torch's default).
- Results are flat ``dict[str, float]``; the caller adds a prefix when logging.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..core.backbones.base import Backbone
from ..core.backbones.base import model_device as _device
from ..core.converter import noisy_states
from ..core.model import DSLModel
from .objectives import eligible_positions, require_dsl

__all__ = ["clean_eval", "converter_stats", "default_gamma_max", "effective_rank", "eval_mode", "fixed_snr_eval",
           "infill_eval", "mean_abs_cos", "monitor_all", "nll_bound_curve", "nll_upper_bound",
           "noise_embedding_health"]

LN2 = math.log(2.0)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every module in eval mode; restore each module's own flag on exit."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, was in flags:
            m.training = was


def _prepared(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    dev = _device(model)
    out = []
    for b in batches:
        if isinstance(b, torch.Tensor):
            b = {"input_ids": b}
        out.append({k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in b.items()})
    return out


class _Acc:
    """Token-level CE / accuracy accumulator."""

    def __init__(self) -> None:
        self.ce, self.hit, self.n = 0.0, 0.0, 0

    def add(self, logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor) -> None:
        rows, tgt = logits[where].float(), ids[where]
        if tgt.numel():
            self.ce += float(F.cross_entropy(rows, tgt, reduction="sum"))
            self.hit += float((rows.argmax(-1) == tgt).sum())
            self.n += int(tgt.numel())

    def result(self) -> dict[str, float]:
        n = max(self.n, 1)
        return {"ce": self.ce / n if self.n else float("nan"), "acc": self.hit / n if self.n else float("nan"),
                "n_tokens": float(self.n)}


def _snr_logits(model: DSLModel, batch: dict[str, torch.Tensor], gamma: float, E: torch.Tensor,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits through the DSL path with every eligible/response position at SNR `gamma` (prompt clean)."""
    ids = batch["input_ids"]
    eligible, prompt = eligible_positions(batch, True)
    z = noisy_states(E, ids, float(gamma), generator)
    state_mask = ~prompt if bool(prompt.any()) else None
    return model.logits_from_states(ids, z, state_mask, batch.get("attention_mask"), E=E), eligible


# -- evaluations -------------------------------------------------------------------------------------------
@torch.no_grad()
def fixed_snr_eval(model: DSLModel | Backbone, batches: Iterable[dict[str, torch.Tensor]],
                   snrs: tuple[float, ...] = (1, 5, 10, 20, 50),
                   generator: torch.Generator | None = None) -> dict[str, float]:
    """CE / accuracy through the DSL path with every position at a fixed SNR: keys 'snr=<γ>/ce', 'snr=<γ>/acc'."""
    model = require_dsl(model, "fixed_snr_eval")
    data = _prepared(model, batches)
    accs = {g: _Acc() for g in snrs}
    with eval_mode(model):
        E = model.unit_noise()
        for batch in data:
            for g in snrs:
                logits, where = _snr_logits(model, batch, g, E, generator)
                accs[g].add(logits, batch["input_ids"], where)
    out: dict[str, float] = {}
    for g, a in accs.items():
        r = a.result()
        out[f"snr={g:g}/ce"], out[f"snr={g:g}/acc"] = r["ce"], r["acc"]
    return out


@torch.no_grad()
def clean_eval(model: DSLModel | Backbone, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
    """CE / accuracy of predicting the clean tokens from the clean ids through the discrete path (`logits_from_ids`)."""
    data = _prepared(model, batches)
    acc = _Acc()
    with eval_mode(model):
        for batch in data:
            ids = batch["input_ids"]
            where, _ = eligible_positions(batch, True)
            acc.add(model.logits_from_ids(ids, batch.get("attention_mask")), ids, where)
    return acc.result()


@torch.no_grad()
def infill_eval(model: DSLModel | Backbone, batches: Iterable[dict[str, torch.Tensor]], mask_rate: float = 0.5,
                generator: torch.Generator | None = None) -> dict[str, float]:
    """Mask each evaluated position iid with probability `mask_rate` (MASK id, discrete path); CE / accuracy on
    the masked positions."""
    if not 0 < mask_rate <= 1:
        raise ValueError(f"mask_rate={mask_rate} must be in (0, 1]")
    data = _prepared(model, batches)
    acc = _Acc()
    mask_id = model.special.mask
    with eval_mode(model):
        for batch in data:
            ids = batch["input_ids"]
            where, _ = eligible_positions(batch, True)
            u = torch.rand(ids.shape, generator=generator, device=ids.device)
            masked = (u < mask_rate) & where
            noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
            acc.add(model.logits_from_ids(noisy, batch.get("attention_mask")), ids, masked)
    out = acc.result()
    out["mask_rate"] = float(mask_rate)
    return out


@torch.no_grad()
def converter_stats(model: DSLModel) -> dict[str, float]:
    """beta, the mask-slot logit bias, and the mean raw norm of the noise-embedding rows (drift of a trainable
    table; the forward always re-normalises)."""
    conv = model.converter
    out = {"beta": float(conv.beta.detach()), "mask_bias": float(conv.logit_bias.detach()[-1]),
           "token_bias_mean": float(conv.logit_bias.detach()[:-1].float().mean()),
           "noise_row_norm_mean": float(model.noise_embed.weight.detach().float().norm(dim=-1).mean())}
    return out


def mean_abs_cos(x: torch.Tensor) -> float:
    """Mean |cosine| over distinct pairs of the rows of x (n, d)."""
    n = x.shape[0]
    if n < 2:
        return float("nan")
    u = F.normalize(x.float(), dim=-1)
    g = (u @ u.T).abs()
    return float((g.sum() - g.diagonal().sum()) / (n * (n - 1)))


def effective_rank(x: torch.Tensor) -> float:
    """exp(entropy of the normalised singular values σ_i / Σσ) of x (n, d)."""
    s = torch.linalg.svdvals(x.float())
    s = s[s > 0]
    if s.numel() == 0:
        return 0.0
    p = s / s.sum()
    return float(torch.exp(-(p * p.log()).sum()))


@torch.no_grad()
def noise_embedding_health(model: DSLModel, n: int = 1000, generator: torch.Generator | None = None,
                           n_rank: int = 256) -> dict[str, float]:
    """Mean |cos| among n random noise rows and among n random converter value columns (token columns of
    W_backbone), and the effective rank of `n_rank` of each. Keys 'noise/…', 'value/…'."""
    E = model.unit_noise()
    W = model.converter.backbone_embedding.weight.detach()
    V = E.shape[0]
    gdev = generator.device if generator is not None else torch.device("cpu")
    idx = torch.randperm(V, generator=generator, device=gdev)[: min(n, V)].to(E.device)
    rows = E[idx]
    cols = W[:, :V].T.index_select(0, idx.to(W.device))
    k = min(n_rank, idx.numel())
    return {"noise/mean_abs_cos": mean_abs_cos(rows), "value/mean_abs_cos": mean_abs_cos(cols),
            "noise/eff_rank": effective_rank(rows[:k]), "value/eff_rank": effective_rank(cols[:k])}


# -- NLL upper bound ---------------------------------------------------------------------------------------
def default_gamma_max(vocab_size: int) -> float:
    """30 · ln V / ln 27 (the authors' quick-bound range; ≈ 107 for LLaDA's V = 126,464)."""
    return 30.0 * math.log(vocab_size) / math.log(27.0)


@torch.no_grad()
def nll_bound_curve(model: DSLModel | Backbone, batches: Iterable[dict[str, torch.Tensor]], n_points: int = 20,
                    gamma_max: float | None = None,
                    generator: torch.Generator | None = None) -> list[dict[str, float]]:
    """The DSL NLL bound along the SNR grid [0] + linspace(γ_max/n, γ_max, n) (n evenly spaced points on
    (0, γ_max] with 0 prepended). Per grid point: 'snr', 'ce_bits' (reconstruction CE, bits/token), 'integrand'
    (½‖Σ_v p_v e_v − e_x‖² / ln 2 with the full-softmax posterior mean), 'integral' (cumulative trapezoid of
    the integrand from 0), 'bound' = integral + ce_bits. All are token averages over the evaluated positions."""
    model = require_dsl(model, "nll_upper_bound")
    if n_points < 1:
        raise ValueError(f"n_points={n_points} must be >= 1")
    gmax = default_gamma_max(model.vocab_size) if gamma_max is None else float(gamma_max)
    if not gmax > 0:
        raise ValueError(f"gamma_max={gamma_max} must be > 0")
    grid = [0.0] + [gmax * (i + 1) / n_points for i in range(n_points)]
    data = _prepared(model, batches)
    ce_sum = [0.0] * len(grid)
    mse_sum = [0.0] * len(grid)
    count = 0
    with eval_mode(model):
        E = model.unit_noise()
        for batch in data:
            ids = batch["input_ids"]
            for k, g in enumerate(grid):
                logits, where = _snr_logits(model, batch, g, E, generator)
                rows, tgt = logits[where].float(), ids[where]
                if k == 0:
                    count += int(tgt.numel())
                if not tgt.numel():
                    continue
                ce_sum[k] += float(F.cross_entropy(rows, tgt, reduction="sum"))
                e_hat = torch.softmax(rows, dim=-1) @ E
                mse_sum[k] += float(((e_hat - E[tgt]) ** 2).sum())
    if count == 0:
        raise ValueError("nll_upper_bound: the batches have no evaluated (non-padding, non-prompt) positions")
    ce_bits = [c / count / LN2 for c in ce_sum]
    integrand = [0.5 * m / count / LN2 for m in mse_sum]
    curve, integral = [], 0.0
    for k, g in enumerate(grid):
        if k:
            integral += 0.5 * (grid[k] - grid[k - 1]) * (integrand[k] + integrand[k - 1])
        curve.append({"snr": g, "ce_bits": ce_bits[k], "integrand": integrand[k], "integral": integral,
                      "bound": integral + ce_bits[k]})
    return curve


@torch.no_grad()
def nll_upper_bound(model: DSLModel | Backbone, batches: Iterable[dict[str, torch.Tensor]], n_points: int = 20,
                    gamma_max: float | None = None, generator: torch.Generator | None = None,
                    return_curve: bool = False) -> dict:
    """min over the SNR grid of ∫₀^γ integrand + CE(γ) (bits/token): the Stochastic Localization bound of the DSL
    paper the DSL-LLaDA paper builds on (§2, "Continuous Denoising for Discrete Tokens"), evaluated on a linear SNR grid.

    Keys: 'nll_bound' (bits/token), 'nll_bound_snr' (argmin γ), 'nll_ce_bits' and 'nll_integral' at the argmin,
    'ce_bits_at_0' (prior CE), 'gamma_max'. Only floats, unless `return_curve` adds 'curve' (the list of
    `nll_bound_curve` points).
    """
    curve = nll_bound_curve(model, batches, n_points, gamma_max, generator)
    best = min(curve, key=lambda c: c["bound"])
    out: dict = {"nll_bound": best["bound"], "nll_bound_snr": best["snr"], "nll_ce_bits": best["ce_bits"],
                 "nll_integral": best["integral"], "ce_bits_at_0": curve[0]["ce_bits"], "gamma_max": curve[-1]["snr"]}
    if return_curve:
        out["curve"] = curve
    return out


# -- everything at once ------------------------------------------------------------------------------------
def monitor_all(model: DSLModel | Backbone, batches: Iterable[dict[str, torch.Tensor]], generator: torch.Generator | None = None,
                *, nll: bool = False, health: bool = True,
                snrs: tuple[float, ...] = (1, 5, 10, 20, 50)) -> dict[str, float]:
    """One flat dict for logging: 'clean/…', 'infill/…' always; for a DSLModel also 'fixed_snr/…' (at `snrs`),
    'converter/…', 'embed/…' (when `health`) and 'nll/…' (when `nll`). The trainer's evaluation is this call."""
    data = _prepared(model, batches)
    out: dict[str, float] = {}
    out.update({f"clean/{k}": v for k, v in clean_eval(model, data).items()})
    out.update({f"infill/{k}": v for k, v in infill_eval(model, data, generator=generator).items()})
    if isinstance(model, DSLModel):
        out.update({f"fixed_snr/{k}": v for k, v in fixed_snr_eval(model, data, snrs, generator=generator).items()})
        out.update({f"converter/{k}": v for k, v in converter_stats(model).items()})
        if health:
            out.update({f"embed/{k}": v for k, v in noise_embedding_health(model, generator=generator).items()})
        if nll:
            out.update({f"nll/{k}": v for k, v in nll_upper_bound(model, data, generator=generator).items()})
    return out
