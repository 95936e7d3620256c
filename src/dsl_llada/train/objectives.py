"""Training objectives: DSL (continuous noisy token states), MDM-CPT and XDLM (the paper's discrete controls).

Every objective is a callable ``objective(model, batch, generator) -> ObjectiveOutput`` built by
:func:`get_objective` from a typed :class:`ObjectiveConfig`:

``batch``
    ``{"input_ids": LongTensor (B, L), optional "prompt_length": LongTensor (B,), optional "attention_mask" (B, L)}``
    already on the model's device. ``attention_mask`` is an HF keep-mask (1 = token, 0 = padding): padded
    positions are never corrupted-for-loss, never targets, and are passed to the backbone as its padding mask.

``generator``
    Every random draw (SNRs, Gaussian noise, diffusion times, corruption coins, replacement ids) comes from this
    ``torch.Generator`` and nothing else, so a step is reproducible from the generator state. It must live on the
    batch's device (``torch.Generator(device=ids.device)``); ``None`` uses torch's default generator of that
    device (reproducible only through ``torch.manual_seed``; not recommended for multi-rank training, where each
    rank should pass its own seeded generator).

Loss positions and normalisation (all three objectives)
    The *eligible* positions are the non-padding positions, minus the prompt (``i < prompt_length[b]``) when
    ``mask_prompt`` is on and the batch has ``prompt_length``. Each loss is a sum over eligible positions divided by
    the number of eligible positions — which is B·L for pretraining blocks, i.e. exactly the authors' code
    ``ΣCE / (B·L)`` (the paper's §3.1 loss is the plain sum over positions; the mean only rescales the LR). With
    prompt masking this is a token-level mean over all response positions of the micro-batch (LLaDA's SFT recipe
    instead divides by each sequence's own answer length and then averages sequences; the two agree when answers
    have equal length).

DSL (paper §3.1, Algorithm 1)
    γ (B, L) ~ `sample_training_snr`; z = γ e_x + √γ ε; logits = backbone(converter(z)); fp32 cross-entropy
    against the clean token at every eligible position (no SNR weighting). With prompt masking the prompt positions
    get clean context embeddings (``state_mask`` False there), as at inference.

MDM-CPT
    Per sequence t ~ U(0, 1), p = (1 − ε) t + ε; each eligible token masked iid with probability p (the backbone's
    own MASK id); logits through the discrete path; loss Σ_masked CE / p, normalised as above (LLaDA's pretraining
    loss). Works on a bare :class:`~dsl_llada.core.backbones.base.Backbone` or a :class:`~dsl_llada.core.model.DSLModel`.

XDLM
    Per sequence α_t = 1 − ((1 − ε) t + ε); per token u ~ U(0, 1): keep if u < α_t, uniformly random id if
    α_t ≤ u < α_t + k1 (1 − α_t), else MASK. Random ids exclude the special ids (mask, eos, eot, bos, pad) unless
    ``exclude_special_from_random=False`` (the authors' code draws from all of [0, V), MASK included).
    ``xdlm_loss="xdm"``: XDM's closed-form KL (the XDLM control of the paper's Appendix "Experimental Details",
    k1 = 10 %, ε = 1e-3; see :func:`xdm_kl`), summed over all eligible positions. ``xdlm_loss="ce"``:
    cross-entropy on the corrupted (random or masked) positions weighted by 1 / (1 − α_t), the probability that a
    position is corrupted — the same estimator as MDM-CPT with "corrupted" in place of "masked"; kept positions carry
    no loss (the model is not trained to leave clean tokens alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from ..core.backbones.base import Backbone
from ..config import ConfigBase, ConfigError, SNRConfig
from ..core.converter import noisy_states
from ..core.model import DSLModel
from ..snr import sample_training_snr

__all__ = [
    "OBJECTIVES", "SNR_BUCKETS", "Objective", "ObjectiveConfig", "ObjectiveOutput", "check_finite", "dsl_loss",
    "eligible_positions", "get_objective", "mdm_corrupt", "mdm_loss", "random_token_table", "snr_bucket_name",
    "xdlm_corrupt", "xdlm_loss", "xdm_kl",
]

OBJECTIVES: tuple[str, ...] = ("dsl", "mdm", "xdlm")

# SNR buckets for the per-bucket DSL metrics (the buckets of the authors' training logs; the paper reports none);
# the last one is closed at 100.
SNR_BUCKETS: tuple[tuple[float, float], ...] = ((0.0, 2.0), (2.0, 5.0), (5.0, 10.0), (10.0, 20.0), (20.0, 100.0))

# XDLM corruption kinds returned by `xdlm_corrupt`.
KEEP, RANDOM, MASKED = 0, 1, 2


@dataclass
class ObjectiveOutput:
    """What an objective returns for one micro-batch."""

    loss: torch.Tensor
    """Scalar fp32 loss to backpropagate, already normalised (see the module docstring)."""
    metrics: dict[str, float]
    """Detached python floats for logging."""
    n_tokens: int
    """Positions with a loss term before normalisation: DSL all eligible positions; MDM the masked positions;
    XDLM-xdm all eligible positions; XDLM-ce the corrupted positions. The normaliser (eligible positions) is in
    ``metrics["n_eligible"]``."""


Objective = Callable[["DSLModel | Backbone", "dict[str, torch.Tensor]", "torch.Generator | None"], ObjectiveOutput]


@dataclass(frozen=True)
class ObjectiveConfig(ConfigBase):
    """Options of the training objectives (only the ones relevant to the chosen objective are read)."""

    snr: SNRConfig = field(default_factory=SNRConfig)
    """DSL: training SNR distribution (paper: 0.9 per-sequence LogNormal + 0.1 per-token smoothed ROAR)."""
    mdm_eps: float = 1e-3
    """MDM-CPT: minimum mask probability ε in p = (1 − ε) t + ε."""
    stratified_t: bool = False
    """MDM: draw the batch's times stratified, t_i = (i + u_i)/B (same marginal U(0,1), lower-variance loss,
    as in MDLM's low-discrepancy sampler). False = iid t per sequence (LLaDA, the paper)."""
    xdlm_eps: float = 1e-3
    """XDLM: ε in α_t = 1 − ((1 − ε) t + ε)."""
    xdlm_k1: float = 0.1
    """XDLM: fraction k1 of the corruption mass that is uniform random-token replacement (rest is MASK)."""
    xdlm_loss: Literal["xdm", "ce"] = "xdm"
    """XDLM loss: 'xdm' = the XDM closed-form KL (authors); 'ce' = 1/(1 − α_t)-weighted CE on corrupted positions."""
    mask_prompt: bool = True
    """SFT: when the batch has `prompt_length`, no loss on prompt tokens and the prompt is given clean (DSL: clean
    context embeddings; MDM/XDLM: never corrupted). Pretraining batches have no `prompt_length`: no effect."""
    exclude_special_from_random: bool = True
    """XDLM: random replacement ids never hit mask/eos/eot/bos/pad. False = authors (uniform over all of [0, V))."""

    _nested: ClassVar[dict[str, type]] = {"snr": SNRConfig}

    def __post_init__(self) -> None:
        if isinstance(self.snr, dict):  # convenience: get_objective("dsl", snr={"distribution": "lognormal"})
            object.__setattr__(self, "snr", SNRConfig.from_dict(self.snr))
        if not isinstance(self.snr, SNRConfig):
            raise ConfigError(f"snr={self.snr!r} must be an SNRConfig (or a dict of its fields)")
        for name in ("mdm_eps", "xdlm_eps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 1):
                raise ConfigError(f"{name}={v!r} must be a float in (0, 1)")
        if self.xdlm_loss not in ("xdm", "ce"):
            raise ConfigError(f"xdlm_loss={self.xdlm_loss!r} is not valid; expected one of ['xdm', 'ce']")
        k1 = self.xdlm_k1
        if not (isinstance(k1, (int, float)) and 0 <= k1 <= 1):
            raise ConfigError(f"xdlm_k1={k1!r} must be in [0, 1]")
        if self.xdlm_loss == "xdm" and k1 == 0:
            raise ConfigError("xdlm_k1=0 is not valid with xdlm_loss='xdm' (the XDM KL divides by k1); "
                              "use xdlm_loss='ce' or the 'mdm' objective for pure masking")


# -- shared helpers ----------------------------------------------------------------------------------------
def eligible_positions(batch: dict[str, torch.Tensor], mask_prompt: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(eligible, prompt) bool masks of shape (B, L): loss positions and (when masked) prompt positions."""
    ids = batch["input_ids"]
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(ids.shape)}")
    B, L = ids.shape
    prompt = torch.zeros(B, L, dtype=torch.bool, device=ids.device)
    pl = batch.get("prompt_length")
    if mask_prompt and pl is not None:
        pl = torch.as_tensor(pl, device=ids.device).reshape(-1)
        if pl.shape[0] != B:
            raise ValueError(f"prompt_length has {pl.shape[0]} entries for a batch of {B}")
        prompt = torch.arange(L, device=ids.device)[None, :] < pl[:, None]
    eligible = ~prompt
    am = batch.get("attention_mask")
    if am is not None:
        if tuple(am.shape) != (B, L):
            raise ValueError(f"attention_mask shape {tuple(am.shape)} does not match input_ids {(B, L)}")
        eligible = eligible & am.to(torch.bool)
    return eligible, prompt


def _rows(logits: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(B, L, V) logits at the True positions of `where` as (N, V) fp32 (no gather copy when all are True)."""
    if bool(where.all()):
        return logits.reshape(-1, logits.shape[-1]).float()
    return logits[where].float()


def _targets(ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    return ids.reshape(-1) if bool(where.all()) else ids[where]


def _f(x: torch.Tensor | float) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def snr_bucket_name(lo: float, hi: float) -> str:
    """Metric prefix of an SNR bucket, e.g. 'snr[0,2)'; the last bucket is closed: 'snr[20,100]'."""
    close = "]" if (lo, hi) == SNR_BUCKETS[-1] else ")"
    return f"snr[{lo:g},{hi:g}{close}"


def require_dsl(model: DSLModel | Backbone, what: str) -> DSLModel:
    """`model` itself when it is a DSLModel (it has the continuous path); else a TypeError naming `what`."""
    if not isinstance(model, DSLModel):
        raise TypeError(f"{what} needs a DSLModel (continuous path); got {type(model).__name__}")
    return model


# -- DSL ---------------------------------------------------------------------------------------------------
def dsl_loss(model: DSLModel | Backbone, batch: dict[str, torch.Tensor], generator: torch.Generator | None,
             cfg: ObjectiveConfig) -> ObjectiveOutput:
    """DSL continued-pretraining loss (see the module docstring). Draws: γ, then ε."""
    model = require_dsl(model, "the 'dsl' objective")
    ids = batch["input_ids"]
    B, L = ids.shape
    eligible, prompt = eligible_positions(batch, cfg.mask_prompt)
    gamma = sample_training_snr(cfg.snr, B, L, generator, ids.device)
    E = model.unit_noise()
    z = noisy_states(E, ids, gamma, generator)
    state_mask = None if not bool(prompt.any()) else ~prompt
    logits = model.logits_from_states(ids, z, state_mask, batch.get("attention_mask"), E=E)
    rows, tgt = _rows(logits, eligible), _targets(ids, eligible)
    ce = F.cross_entropy(rows, tgt, reduction="none")
    n = int(tgt.numel())
    loss = ce.sum() / max(n, 1)

    metrics: dict[str, float] = {"loss": _f(loss), "n_eligible": float(n)}
    with torch.no_grad():
        correct = (rows.argmax(-1) == tgt).float()
        g = gamma.reshape(-1) if bool(eligible.all()) else gamma[eligible]
        if n:
            metrics.update(ce=_f(ce.mean()), acc=_f(correct.mean()), gamma_mean=_f(g.mean()))
        for lo, hi in SNR_BUCKETS:
            name = snr_bucket_name(lo, hi)
            inb = (g >= lo) & ((g <= hi) if name.endswith("]") else (g < hi))
            k = int(inb.sum())
            metrics[f"{name}/n"] = float(k)
            if k:
                metrics[f"{name}/ce"] = _f(ce.detach()[inb].mean())
                metrics[f"{name}/acc"] = _f(correct[inb].mean())
        metrics["beta"] = _f(model.converter.beta)
        metrics["mask_bias"] = _f(model.converter.logit_bias[-1])
    return ObjectiveOutput(loss=loss.float(), metrics=metrics, n_tokens=n)


# -- MDM-CPT -----------------------------------------------------------------------------------------------
def mdm_corrupt(ids: torch.Tensor, mask_id: int, eps: float = 1e-3, generator: torch.Generator | None = None,
                eligible: torch.Tensor | None = None, stratified: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA forward process. Returns (noisy ids, masked (B, L) bool, p (B,) fp32 mask probability).

    Draws, in order: t (B,) ~ U[0, 1), then u (B, L) ~ U[0, 1); position masked iff u < p and eligible.
    """
    B, L = ids.shape
    t = torch.rand(B, generator=generator, device=ids.device)
    if stratified:
        t = (torch.arange(B, device=ids.device) + t) / B
    p = (1 - eps) * t + eps
    u = torch.rand(B, L, generator=generator, device=ids.device)
    masked = u < p[:, None]
    if eligible is not None:
        masked = masked & eligible
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    return noisy, masked, p


def mdm_loss(model: DSLModel | Backbone, batch: dict[str, torch.Tensor], generator: torch.Generator | None,
             cfg: ObjectiveConfig) -> ObjectiveOutput:
    """MDM-CPT: Σ_masked CE / p over the eligible positions' count (LLaDA's pretraining loss)."""
    ids = batch["input_ids"]
    eligible, _ = eligible_positions(batch, cfg.mask_prompt)
    noisy, masked, p = mdm_corrupt(ids, model.special.mask, cfg.mdm_eps, generator, eligible, cfg.stratified_t)
    logits = model.logits_from_ids(noisy, batch.get("attention_mask"))
    rows, tgt = logits[masked].float(), ids[masked]
    ce = F.cross_entropy(rows, tgt, reduction="none")
    w = p[:, None].expand_as(ids)[masked]
    n_elig = int(eligible.sum())
    loss = (ce / w).sum() / max(n_elig, 1)
    k = int(tgt.numel())
    metrics = {"loss": _f(loss), "n_eligible": float(n_elig), "mask_frac": k / max(n_elig, 1),
               "p_mean": _f(p.mean())}
    if k:
        with torch.no_grad():
            metrics.update(ce=_f(ce.mean()), acc=_f((rows.argmax(-1) == tgt).float().mean()))
    return ObjectiveOutput(loss=loss.float(), metrics=metrics, n_tokens=k)


# -- XDLM --------------------------------------------------------------------------------------------------
def random_token_table(vocab_size: int, special: Any, exclude_special: bool = True,
                       device: str | torch.device = "cpu") -> torch.Tensor:
    """The ids random replacement draws from: [0, V) minus mask/eos/eot/bos/pad when `exclude_special`."""
    ids = torch.arange(vocab_size, device=device)
    if not exclude_special:
        return ids
    drop = {special.mask, special.eos, special.eot, special.bos, special.pad_id}
    keep = torch.ones(vocab_size, dtype=torch.bool, device=device)
    for d in drop:
        if d is not None and 0 <= d < vocab_size:
            keep[d] = False
    if not bool(keep.any()):
        raise ValueError(f"every id of the {vocab_size}-token vocabulary is special; "
                         f"nothing to draw random tokens from")
    return ids[keep]


def xdlm_corrupt(ids: torch.Tensor, mask_id: int, table: torch.Tensor, eps: float = 1e-3, k1: float = 0.1,
                 generator: torch.Generator | None = None, eligible: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """XDLM forward process. Returns (noisy ids, kind (B, L) int8 in {KEEP, RANDOM, MASKED}, α (B,) float64).

    Draws, in order: t (B,), u (B, L), replacement indices (B, L) into `table` (drawn for every position so the
    stream does not depend on the outcome). α is computed in float64 (fp32 rounding can make α_t exactly 0 near
    t = 1). Ineligible positions are always kept.
    """
    B, L = ids.shape
    dev = ids.device
    t = torch.rand(B, generator=generator, device=dev)
    alpha = 1.0 - ((1.0 - eps) * t.double() + eps)
    u = torch.rand(B, L, generator=generator, device=dev).double()
    j = torch.randint(0, table.numel(), (B, L), generator=generator, device=dev)
    a = alpha[:, None]
    keep = u < a
    rand = (~keep) & (u < a + k1 * (1.0 - a))
    if eligible is not None:
        keep = keep | ~eligible
        rand = rand & eligible
    kind = torch.full((B, L), MASKED, dtype=torch.int8, device=dev)
    kind[rand] = RANDOM
    kind[keep] = KEEP
    noisy = torch.where(keep, ids, torch.where(rand, table.to(dev)[j], torch.full_like(ids, mask_id)))
    return noisy, kind, alpha


def xdm_kl(logits: torch.Tensor, x: torch.Tensor, z: torch.Tensor, alpha: torch.Tensor, mask_id: int,
           k1: float) -> torch.Tensor:
    """Per-position XDM KL (the XDLM control, paper Appendix "Experimental Details"): logits (N, V), clean x (N,),
    noisy z (N,), α (N,) -> (N,) f64.

    With β = 1 − α, p = softmax(logits) after forcing the MASK logit to the fp32 minimum, v = V,
    r = k1 + v (1 − k1) [z = MASK]:
        F_x = α v p_x + β k1,   F_z = α v p_z + β r,   H_x = α v + β k1,   H_z = α v [z = x] + β r,
        ρ = k1 / H_x if z = x else 1 / β,
        partx = −mean_u log(α v p_u + β k1) + log(β k1)(v − 1)/v + log(α v + β k1)/v,
        KL = ρ [ v([z = x] − p_z)/F_z − (log H_z − log F_z)/α + (log H_x − log F_x) + k1 β partx / α ].
    Numerics: the softmax is fp32; the per-position terms are float64 (so /α stays accurate for α → 0); partx is
    evaluated in the algebraically identical form  log1p(c)/v − mean_u log1p(c p_u),  c = α v / (β k1)  (the
    log(β k1) terms cancel exactly), whose fp32 error does not blow up when divided by a small α. Log arguments are
    clamped at 1e-300. At p = onehot(x) every term is 0 (for all three kinds of z).
    """
    if not 0 < k1 <= 1:
        raise ValueError(f"k1={k1} must be in (0, 1] for the XDM loss")
    lg = logits.float()
    is_mask_col = torch.zeros(lg.shape[-1], dtype=torch.bool, device=lg.device)
    is_mask_col[mask_id] = True
    p = torch.softmax(lg.masked_fill(is_mask_col, torch.finfo(lg.dtype).min), dim=-1)
    v = p.shape[-1]
    a = alpha.to(torch.float64).clamp(1e-12, 1.0 - 1e-12)  # α from xdlm_corrupt is already in [6e-8, 1 − ε]
    b = 1.0 - a
    is_x = z == x
    is_m = z == mask_id
    p_x = p.gather(1, x[:, None])[:, 0].double()
    p_z = p.gather(1, z[:, None])[:, 0].double()
    r = k1 + v * (1.0 - k1) * is_m.double()
    F_x = a * v * p_x + b * k1
    F_z = a * v * p_z + b * r
    H_x = a * v + b * k1
    H_z = a * v * is_x.double() + b * r
    rho = torch.where(is_x, k1 / H_x, 1.0 / b)
    c = (a * v / (b * k1)).float()[:, None]
    partx = torch.log1p(c[:, 0]).double() / v - torch.log1p(c * p).mean(-1).double()
    lg_ = lambda t: torch.log(t.clamp_min(1e-300))  # noqa: E731
    inner = (v * (is_x.double() - p_z) / F_z - (lg_(H_z) - lg_(F_z)) / a + (lg_(H_x) - lg_(F_x))
             + k1 * b * partx / a)
    return rho * inner


def _ce_and_hit_without_mask(logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor, mask_id: int,
                             chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Monitoring only: fp32 CE and argmax-correctness at the `where` positions with the MASK logit suppressed,
    in row chunks so no full (N, V) fp32 copy is made."""
    flat = logits.reshape(-1, logits.shape[-1])
    idx = where.reshape(-1).nonzero().squeeze(1)
    tgt = ids.reshape(-1)[idx]
    ces, hits = [], []
    for s in range(0, idx.numel(), chunk):
        lg = flat.index_select(0, idx[s:s + chunk]).float()  # a copy: safe to edit in place
        lg[:, mask_id] = torch.finfo(lg.dtype).min
        ces.append(F.cross_entropy(lg, tgt[s:s + chunk], reduction="none"))
        hits.append(lg.argmax(-1) == tgt[s:s + chunk])
    if not ces:
        return flat.new_zeros(0, dtype=torch.float32), torch.zeros(0, dtype=torch.bool, device=flat.device)
    return torch.cat(ces), torch.cat(hits)


def xdlm_loss(model: DSLModel | Backbone, batch: dict[str, torch.Tensor], generator: torch.Generator | None,
              cfg: ObjectiveConfig) -> ObjectiveOutput:
    """XDLM continued pretraining with the XDM KL (default) or 1/(1 − α)-weighted CE on corrupted positions."""
    ids = batch["input_ids"]
    sp = model.special
    V = model.vocab_size
    eligible, _ = eligible_positions(batch, cfg.mask_prompt)
    table = random_token_table(V, sp, cfg.exclude_special_from_random, ids.device)
    noisy, kind, alpha = xdlm_corrupt(ids, sp.mask, table, cfg.xdlm_eps, cfg.xdlm_k1, generator, eligible)
    logits = model.logits_from_ids(noisy, batch.get("attention_mask"))
    n_elig = int(eligible.sum())
    a_pos = alpha[:, None].expand(ids.shape)
    if cfg.xdlm_loss == "xdm":
        sel = eligible
        rows = _rows(logits, sel)
        kl = xdm_kl(rows, _targets(ids, sel), _targets(noisy, sel), _targets(a_pos, sel), sp.mask, cfg.xdlm_k1)
        loss = (kl.sum() / max(n_elig, 1)).float()
        n_tok = n_elig
    else:
        sel = kind != KEEP
        rows = logits[sel].float()
        ce = F.cross_entropy(rows, ids[sel], reduction="none")
        loss = ((ce.double() / (1.0 - a_pos[sel])).sum() / max(n_elig, 1)).float()
        n_tok = int(sel.sum())
    metrics: dict[str, float] = {"loss": _f(loss), "n_eligible": float(n_elig), "alpha_mean": _f(alpha.mean())}
    with torch.no_grad():
        kinds = kind[eligible]
        for k, name in ((KEEP, "keep"), (RANDOM, "random"), (MASKED, "mask")):
            metrics[f"{name}_frac"] = _f((kinds == k).float().sum()) / max(n_elig, 1)
        ce_pos, hit = _ce_and_hit_without_mask(logits.detach(), ids, eligible, sp.mask)
        for k, name in ((KEEP, "keep"), (RANDOM, "random"), (MASKED, "mask")):
            m = kinds == k
            if bool(m.any()):
                metrics[f"acc_{name}"] = _f(hit[m].float().mean())
        corrupted = kinds != KEEP
        if bool(corrupted.any()):
            metrics["ce"] = _f(ce_pos[corrupted].mean())
            metrics["acc"] = _f(hit[corrupted].float().mean())
    return ObjectiveOutput(loss=loss, metrics=metrics, n_tokens=n_tok)


# -- registry ----------------------------------------------------------------------------------------------
_LOSSES = {"dsl": dsl_loss, "mdm": mdm_loss, "xdlm": xdlm_loss}


class _BoundObjective:
    """A loss function bound to its config; callable as ``objective(model, batch, generator)``."""

    def __init__(self, name: str, config: ObjectiveConfig):
        self.name, self.config = name, config
        self._fn = _LOSSES[name]

    def __call__(self, model: DSLModel | Backbone, batch: dict[str, torch.Tensor],
                 generator: torch.Generator | None = None) -> ObjectiveOutput:
        return self._fn(model, batch, generator, self.config)

    def __repr__(self) -> str:
        return f"Objective({self.name!r}, {self.config!r})"


def get_objective(name: str, **options: Any) -> Objective:
    """The objective `name` ('dsl', 'mdm' or 'xdlm') with ObjectiveConfig fields as keyword options.

    ``config=ObjectiveConfig(...)`` (or a dict) may be passed as a base that the other options override. The result
    has ``.name`` and ``.config`` (save ``.config.to_dict()`` with the run).
    """
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; valid objectives: {list(OBJECTIVES)}")
    base = options.pop("config", None)
    if base is None:
        base = ObjectiveConfig()
    elif isinstance(base, dict):
        base = ObjectiveConfig.from_dict(base)
    elif not isinstance(base, ObjectiveConfig):
        raise ConfigError(f"config={base!r} must be an ObjectiveConfig or a dict")
    valid = sorted(f for f in ObjectiveConfig.__dataclass_fields__)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"unknown objective option(s) {unknown}; valid options: {valid}")
    return _BoundObjective(name, base.replace(**options) if options else base)


# -- NaN guard ---------------------------------------------------------------------------------------------
def check_finite(loss: torch.Tensor | float | ObjectiveOutput, step: int,
                 metrics: dict[str, float] | None = None) -> None:
    """Raise FloatingPointError naming the step and the metric values when the loss is NaN or infinite.

    Pass an ObjectiveOutput (its metrics are used) or a loss plus an optional metrics dict.
    """
    if isinstance(loss, ObjectiveOutput):
        metrics = loss.metrics if metrics is None else metrics
        loss = loss.loss
    value = _f(loss)
    if math.isfinite(value):
        return
    items = sorted((metrics or {}).items())
    shown = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in items)
    raise FloatingPointError(f"non-finite loss {value} at step {step}; metrics: {{{shown}}}")
