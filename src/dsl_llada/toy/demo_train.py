"""The demo's in-process training stages: SFT-format toy conversations, one objective, AdamW with a converter
parameter group, linear warmup, global-norm clipping. (Multi-GPU runs use `dsl_llada.train.trainer`.)"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.backbones.base import Backbone
from ..config import ConfigBase, ConfigError
from ..core.model import DSLModel
from ..core.numerics import deterministic_algorithms
from ..train.objectives import check_finite, get_objective
from ..train.optim import group_parameters
from ..sampling.progress import progress as progress_bar
from .tasks import TaskExample, make_split, render_sft_example
from .world import ToyWorld


@dataclass(frozen=True)
class TrainStage(ConfigBase):
    """One training stage of the demo."""

    objective: str = "dsl"
    """'mdm' (pretraining and the MDM-CPT control), 'dsl', or 'xdlm'."""
    steps: int = 500
    """Optimizer updates."""
    lr: float = 5e-4
    """Backbone learning rate (constant after warmup)."""
    converter_lr_mult: float = 5.0
    """Converter + noise-embedding LR multiplier (paper: 25x at LR 2e-5; smaller here, the toy LR is larger)."""
    warmup: int = 50
    """Linear warmup: update u uses lr * min(1, (u + 1) / warmup)."""
    batch_size: int = 32
    """Conversations per update (drawn with replacement)."""
    weight_decay: float = 0.1
    """AdamW weight decay of the backbone matrices (the converter is not decayed in the demo)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    stratified_t: bool = False
    """MDM: stratified diffusion times across the batch (lower-variance loss; used for the stand-in pretraining)."""
    snr_per_token: bool = False
    """DSL: draw the LogNormal SNR per token instead of per sequence (`SNRConfig.lognormal_per_token`)."""

    def __post_init__(self) -> None:
        if self.objective not in ("mdm", "dsl", "xdlm"):
            raise ConfigError(f"objective={self.objective!r} is not valid; expected one of ['mdm', 'dsl', 'xdlm']")
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ConfigError(f"need steps >= 1, batch_size >= 1 and lr > 0; got {self.steps}, {self.batch_size}, {self.lr}")


def train_conversations(world: ToyWorld, n_train: int) -> list[TaskExample]:
    """The training conversations of the 'train' split: `n_train // 2` open-ended, then `n_train // 2`
    summarisation."""
    half = n_train // 2
    return make_split(world, half, "open", "train") + make_split(world, half, "summarize", "train")


def longest_prompt(tokenizer, examples: list[TaskExample]) -> int:
    """Tokens of the longest chat-templated prompt among `examples` (an SFT block is this + gen_length)."""
    return max(len(tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": e.prompt}],
                                                                  add_generation_prompt=True, tokenize=False),
                                    add_special_tokens=False)) for e in examples)


def sft_tensors(tokenizer, examples: list[TaskExample], gen_length: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, block_size) ids = chat prompt + response + <|eot_id|> + EOS padding, and (N,) prompt lengths."""
    eos = tokenizer.eos_token_id
    ids, plens = [], []
    for ex in examples:
        row, p = render_sft_example(ex.prompt, ex.response, gen_length, tokenizer)
        if len(row) > block_size:
            raise ValueError(f"example of {len(row)} tokens exceeds block_size={block_size}")
        ids.append(row + [eos] * (block_size - len(row)))
        plens.append(p)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(plens, dtype=torch.long)


def _param_groups(model: torch.nn.Module, stage: TrainStage) -> list[dict[str, Any]]:
    """The trainer's grouping function (`dsl_llada.train.optim.group_parameters`) with the demo's one difference:
    the converter's matrices are not decayed (`decay_converter_matrices=False`; the trainer decays them, as the
    paper). Each group keeps its `base_lr` for the warmup."""
    groups = group_parameters(model, lr=stage.lr, weight_decay=stage.weight_decay,
                              converter_lr_mult=stage.converter_lr_mult, decay_converter_matrices=False)
    return [{**{k: v for k, v in g.items() if k != "param_names"}, "base_lr": g["lr"]} for g in groups]


StopCheck = Callable[[int, torch.nn.Module], bool]
"""`check(updates_done, model)`: called every `check_every` updates (model in eval mode); True ends the stage."""
OnUpdate = Callable[[int, torch.nn.Module], None]
"""`on_update(updates_done, model)`: called after every optimizer update, before `check` (e.g. to keep a moving
average of the weights); it must not change the model."""


def run_stage(model: DSLModel | Backbone, tokenizer, examples: list[TaskExample], stage: TrainStage, *, seed: int,
              block_size: int, gen_length: int = 48, progress: bool = True, desc: str = "train",
              check: StopCheck | None = None, check_every: int = 0, on_update: OnUpdate | None = None) -> list[float]:
    """Train `model` in place for `stage.steps` updates (fewer when `check` ends the stage); returns the loss curve.
    Runs with deterministic algorithms (`numerics.deterministic_algorithms`), so the same seed gives the same
    checkpoint on the same machine whatever the thread timing (the demo trains on the CPU; on a CUDA device set
    CUBLAS_WORKSPACE_CONFIG=:4096:8 as PyTorch's deterministic mode requires). The batch draws come from a CPU
    generator on every device; the objective's noise from a generator on the model's device."""
    with deterministic_algorithms():
        return _train(model, tokenizer, examples, stage, seed=seed, block_size=block_size, gen_length=gen_length,
                      progress=progress, desc=desc, check=check, check_every=check_every, on_update=on_update)


def _train(model: DSLModel | Backbone, tokenizer, examples: list[TaskExample], stage: TrainStage, *, seed: int,
           block_size: int, gen_length: int, progress: bool, desc: str, check: StopCheck | None = None,
           check_every: int = 0, on_update: OnUpdate | None = None) -> list[float]:
    ids, plens = sft_tensors(tokenizer, examples, gen_length, block_size)
    options: dict[str, Any] = {"stratified_t": True} if stage.stratified_t else {}
    if stage.snr_per_token:
        options["snr"] = {"lognormal_per_token": True}
    objective = get_objective(stage.objective, mask_prompt=True, **options)
    opt = torch.optim.AdamW(_param_groups(model, stage), betas=(0.9, 0.999), eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    noise_gen = gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(seed)
    if device.type != "cpu":
        ids, plens = ids.to(device), plens.to(device)
    model.train()
    curve: list[float] = []
    bar = progress_bar(range(stage.steps), total=stage.steps, desc=desc, enabled=progress, leave=True)
    for step in bar:
        scale = min(1.0, (step + 1) / max(1, stage.warmup))
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * scale
        idx = torch.randint(0, ids.shape[0], (stage.batch_size,), generator=gen).to(device)
        out = objective(model, {"input_ids": ids[idx], "prompt_length": plens[idx]}, noise_gen)
        check_finite(out.loss, step)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), stage.max_grad_norm)
        opt.step()
        curve.append(float(out.loss.detach()))
        if on_update is not None:
            on_update(step + 1, model)
        if progress and hasattr(bar, "set_postfix") and step % 10 == 0:
            recent = curve[-20:]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}")
        if check is not None and check_every and (step + 1) % check_every == 0:
            model.eval()
            stop = check(step + 1, model)
            model.train()
            if stop:
                break
    model.eval()
    if not all(math.isfinite(v) for v in curve):
        raise FloatingPointError(f"{desc}: non-finite loss in the curve")
    return curve
