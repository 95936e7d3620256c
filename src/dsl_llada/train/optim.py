"""Optimiser construction for continued pretraining: freezing, AdamW parameter groups, the warmup schedule, the
authors' converter gradient multiplier, and global-norm clipping for sharded (FSDP2) parameters.

Parameter groups (empty ones are dropped; every group carries a ``name`` used for logging and resume checks):

=====================  ===========================================  =====================  ============
group                  parameters                                   learning rate          weight decay
=====================  ===========================================  =====================  ============
``backbone``           backbone matrices                            lr                     weight_decay
``backbone_no_decay``  backbone biases and norm weights             lr                     0
``converter``          converter matrices (value map W, residual)   lr x converter mult    weight_decay
``converter_no_decay`` beta, logit bias, value bias, mask key,      lr x converter mult    0
                       noise embedding
=====================  ===========================================  =====================  ============

In ``grad_hook`` mode (the authors' code) both converter groups use ``lr`` and the converter gradients are multiplied
by the factor instead (:func:`scale_converter_grads` / :func:`register_converter_grad_hooks`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
from torch import nn

from ..core.backbones.base import Backbone
from ..config import ConfigError
from ..core.model import DSLModel
from .train_config import TrainConfig

logger = logging.getLogger("dsl_llada.train")

__all__ = ["CONVERTER_PREFIXES", "apply_freezing", "build_optimizer", "clip_grad_norm_sharded",
           "converter_parameters", "group_parameters", "is_converter_param", "is_no_decay", "lr_lambda", "param_groups",
           "register_converter_grad_hooks", "scale_converter_grads"]

CONVERTER_PREFIXES = ("converter.", "noise_embed.")
NO_DECAY_NAMES = ("converter.beta", "converter.logit_bias", "converter.mask_key", "noise_embed.weight")


def is_converter_param(name: str) -> bool:
    """True for the converter and the noise embedding (names relative to the DSL model)."""
    return name.startswith(CONVERTER_PREFIXES)


def _norm_param_ids(model: nn.Module) -> set[int]:
    """Parameters owned by normalisation layers (any module class named *Norm*: LayerNorm, RMSNorm, ...)."""
    ids: set[int] = set()
    for module in model.modules():
        if "norm" in type(module).__name__.lower():
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def is_no_decay(name: str, param: torch.Tensor, norm_ids: set[int] | None = None) -> bool:
    """Biases, norm weights, scalars/vectors, converter beta / logit bias / mask key and the noise embedding."""
    if name in NO_DECAY_NAMES or name.endswith("bias") or param.dim() < 2:
        return True
    if norm_ids is not None and id(param) in norm_ids:
        return True
    leaf = name.rsplit(".", 2)
    return len(leaf) >= 2 and ("norm" in leaf[-2].lower() or leaf[-2] in ("ln_f",))


def apply_freezing(model: DSLModel | Backbone, config: TrainConfig) -> dict[str, int]:
    """Set requires_grad per the config on a DSLModel or a bare backbone. Returns counts of frozen tensors by reason."""
    counts: dict[str, int] = {}
    dsl = model if isinstance(model, DSLModel) else None
    backbone = model.backbone if isinstance(model, DSLModel) else model
    is_dsl = dsl is not None

    def freeze(params: Iterable[nn.Parameter], why: str) -> None:
        for p in params:
            if p.requires_grad:
                p.requires_grad_(False)
                counts[why] = counts.get(why, 0) + 1

    if config.freeze_backbone:
        freeze(backbone.parameters(), "backbone")
    head = backbone.output_embeddings()
    if config.freeze_lm_head:
        freeze(head.parameters(), "lm_head")
    # Tied head = the input embedding (then freezing wte would freeze the head too).
    tied = head is None or head is backbone.input_embeddings()
    freeze_wte = config.freeze_input_embedding
    if freeze_wte is None:
        ctx = getattr(getattr(model, "config", None), "context_embedding", "converter")
        reads_wte = ctx == "wte" and config.data.format == "sft" and config.objective_options.mask_prompt
        freeze_wte = is_dsl and not tied and not reads_wte
    if freeze_wte:
        freeze(backbone.input_embeddings().parameters(), "input_embedding")
    if dsl is not None:
        fne = config.freeze_noise_embed
        if fne is None:
            fne = not dsl.config.converter.trainable_noise_embed
        dsl.noise_embed.weight.requires_grad_(not fne)
        if fne:
            counts["noise_embed"] = 1
    return counts


def group_parameters(model: nn.Module, *, lr: float, weight_decay: float, converter_lr_mult: float = 1.0,
                     decay_converter_matrices: bool = True, prefix: str = "") -> list[dict]:
    """AdamW parameter groups (see the module docstring): the one place that decides which parameters are the
    converter's and which are decayed. `prefix` is stripped from names (wrapper modules).

    `decay_converter_matrices=False` puts the converter's matrices (value map W, residual) in the no-decay group
    too: the toy demo's choice (`dsl_llada.toy.demo_train`), kept so its numbers do not move. The trainer decays
    them, as the paper's AdamW (wd 0.1 on every weight matrix) and the authors' Hugging Face Trainer do.
    """
    norm_ids = _norm_param_ids(model)
    buckets: dict[str, list[tuple[str, nn.Parameter]]] = {
        "backbone": [], "backbone_no_decay": [], "converter": [], "converter_no_decay": []}
    for full, p in model.named_parameters():
        if not p.requires_grad:
            continue
        name = full[len(prefix):] if prefix and full.startswith(prefix) else full
        converter = is_converter_param(name)
        kind = "converter" if converter else "backbone"
        if is_no_decay(name, p, norm_ids) or (converter and not decay_converter_matrices):
            kind += "_no_decay"
        buckets[kind].append((name, p))
    groups = []
    for kind, items in buckets.items():
        if not items:
            continue
        group_lr = lr * (converter_lr_mult if kind.startswith("converter") else 1.0)
        groups.append({"name": kind, "params": [p for _, p in items], "param_names": [n for n, _ in items],
                       "lr": group_lr, "weight_decay": 0.0 if kind.endswith("no_decay") else weight_decay})
    if not groups:
        raise ConfigError("nothing to train: every parameter is frozen (check freeze_backbone / freeze_* options)")
    return groups


def param_groups(model: nn.Module, config: TrainConfig, *, prefix: str = "") -> list[dict]:
    """The trainer's groups: `group_parameters` with the config's LR, weight decay and converter LR mode
    ('grad_hook' keeps the converter at `lr`; its gradients are scaled instead)."""
    mult = config.converter_lr_mult if config.converter_lr_mode == "param_group" else 1.0
    return group_parameters(model, lr=config.lr, weight_decay=config.weight_decay, converter_lr_mult=mult,
                            prefix=prefix)


def lr_lambda(warmup_steps: int):
    """Multiplier for LambdaLR after `s` completed updates: min(1, (s + 1) / warmup) (no zero-LR first update)."""
    def f(s: int) -> float:
        return 1.0 if warmup_steps <= 0 else min(1.0, (s + 1) / warmup_steps)
    return f


def build_optimizer(groups: list[dict], config: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `groups` (``param_names`` are dropped from the torch groups) + the constant-with-warmup schedule."""
    torch_groups = [{k: v for k, v in g.items() if k != "param_names"} for g in groups]
    opt = torch.optim.AdamW(torch_groups, lr=config.lr, betas=config.betas, eps=config.eps,
                            weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(config.warmup_steps))
    return opt, sched


def converter_parameters(model: nn.Module, prefix: str = "") -> list[nn.Parameter]:
    out = []
    for full, p in model.named_parameters():
        name = full[len(prefix):] if prefix and full.startswith(prefix) else full
        if p.requires_grad and is_converter_param(name):
            out.append(p)
    return out


def register_converter_grad_hooks(params: Iterable[nn.Parameter], factor: float) -> list:
    """The authors' converter "LR multiplier": every converter gradient is multiplied by `factor` as it is produced."""
    return [p.register_hook(lambda g, f=factor: g * f) for p in params]


@torch.no_grad()
def scale_converter_grads(params: Iterable[nn.Parameter], factor: float) -> None:
    """Same effect as the hooks, applied once to the accumulated gradients (for sharded parameters, whose
    autograd leaves are not the registered parameters)."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(factor)


@torch.no_grad()
def clip_grad_norm_sharded(params: Iterable[nn.Parameter], max_norm: float | None) -> float:
    """Global L2 gradient norm over DTensor (sharded) and plain (replicated) gradients; clip when `max_norm` > 0.

    Sharded gradients contribute the all-reduced sum of their local squared norms; plain gradients (replicated and
    already averaged across ranks) count once.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    local = torch.zeros((), dtype=torch.float64)
    shared = torch.zeros((), dtype=torch.float64)
    for g in grads:
        if isinstance(g, DTensor):
            local += g.to_local().detach().double().pow(2).sum().cpu()
        else:
            shared += g.detach().double().pow(2).sum().cpu()
    if dist.is_available() and dist.is_initialized():
        dev = grads[0].device if grads and grads[0].device.type == "cuda" else torch.device("cpu")
        t = local.to(dev)
        dist.all_reduce(t)
        local = t.cpu()
    total = math.sqrt(float(local + shared))
    if max_norm and max_norm > 0 and math.isfinite(total):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return total
