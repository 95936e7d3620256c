"""TrainConfig: everything that defines a continued-pretraining run (DSL, MDM-CPT or XDLM), saved with every
checkpoint (`trainer_state/train_config.json`) and reloadable to the identical object.

Presets live in ``configs/`` (``paper-8b.yaml`` = the paper's Table "Training hyperparameters"; ``toy.yaml`` = a
tiny CPU run; ``toy-world.yaml`` = a CPU run on the toy world measured against its exact Bayes floor).
:func:`load_train_config` reads a YAML/JSON preset and applies dotted ``key=value`` overrides
(``lr=1e-4 data.block_size=64 objective_options.snr.lognormal_per_token=true``).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..config import ConfigBase, ConfigError, DSLConfig, _check, read_config_file  # one validation helper for every config
from ..overrides import apply_overrides, parse_override_value
from .data_config import DataConfig
from .objectives import OBJECTIVES, ObjectiveConfig
from .toy_config import BayesFloorConfig

__all__ = ["TrainConfig", "load_train_config", "apply_overrides", "parse_override_value", "SCRATCH",
           "SPECIAL_TOKENIZERS"]

SCRATCH = "scratch"
"""`init_from` value for a randomly initialised LLaDA built from `scratch_model` (tests, toy runs)."""
SPECIAL_TOKENIZERS = ("bytes", "ids")
"""`tokenizer` values that need no files: UTF-8 bytes (ids 0..255) or whitespace-separated integer ids."""
LOGGERS = ("jsonl", "tensorboard", "wandb")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """One training run. Defaults follow the paper's Table "Training hyperparameters" where it has a value."""

    # -- what to train ---------------------------------------------------------------------------------------
    objective: str = "dsl"
    """'dsl' (continuous noisy token states through the converter), 'mdm' (MDM-CPT control) or 'xdlm' (XDLM control)."""
    objective_options: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """Objective settings: SNR distribution (per-sequence vs per-token LogNormal, ROAR share), MDM/XDLM ε, XDLM k1 and
    loss, prompt masking."""
    init_from: str = ""
    """Where the weights come from: a backbone folder (e.g. LLaDA-8B-Instruct; 'dsl' converts it with `dsl`, the
    controls train it as is), a DSL checkpoint folder (has `noise_embed.weight`; 'dsl' continues it, the controls
    train its backbone only), or 'scratch' (a random LLaDA from `scratch_model`). Required."""
    scratch_model: dict | None = None
    """init_from='scratch' only: LLaDA config.json fields (d_model, n_layers, n_heads, vocab_size, mask_token_id,
    eos_token_id, max_sequence_length, ...); weights ~ N(0, 0.02) seeded by `seed`."""
    tokenizer: str | None = None
    """Tokenizer folder (Hugging Face, local files only). None = the `init_from` folder. 'bytes' = UTF-8 bytes as
    ids 0..255 (the model's special ids must be >= 256); 'ids' = documents are whitespace-separated integer ids
    (pre-tokenised data)."""
    dsl: DSLConfig = field(default_factory=DSLConfig)
    """Converter / noise-embedding settings used when a backbone is converted for 'dsl' (ignored when `init_from`
    is already a DSL checkpoint: its own dsl_config.json wins). Paper: d=100, beta_init=1, trainable embedding."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data source and packing (see dsl_llada.train.data.DataConfig): HF dataset id, local files, block size, shuffle,
    seed, hold-out. Blocks are dealt round-robin to ranks."""

    # -- optimiser ---------------------------------------------------------------------------------------------
    lr: float = 2e-5
    """Backbone learning rate (AdamW), constant after warmup."""
    converter_lr_mult: float = 25.0
    """Converter + noise-embedding learning rate = lr x this (paper: 25x, i.e. 5e-4)."""
    converter_lr_mode: Literal["param_group", "grad_hook"] = "param_group"
    """'param_group': a real optimiser parameter group with LR = lr x converter_lr_mult (paper). 'grad_hook': the
    authors' code: one LR for everything and the converter gradients multiplied by converter_lr_mult (nearly a no-op
    under Adam, but it inflates the global norm the clip sees)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay for matrices; never for biases, norm weights, converter beta / logit bias / mask key
    and the noise embedding."""
    warmup_steps: int = 100
    """Linear warmup: update u (1-based) uses lr x min(1, u / warmup_steps); constant afterwards."""
    max_steps: int = 1000
    """Optimizer updates to run (each = grad_accum micro-batches per process)."""
    per_device_batch_size: int = 1
    """Sequences per micro-batch per process (paper: 1)."""
    grad_accum: int = 4
    """Micro-batches accumulated per update (paper: 4; x 8 GPUs x 1 = 32 sequences per update)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm (over all ranks and all parameters) to this; None or 0 = no clipping."""

    # -- precision, freezing, memory ---------------------------------------------------------------------------
    mixed_precision: Literal["auto", "no", "bf16"] = "auto"
    """'auto' = bf16 autocast on CUDA, fp32 on CPU; 'no' = fp32; 'bf16'. Parameters and optimiser states stay fp32
    (DeepSpeed keeps bf16 weights and fp32 masters); the converter softmax and the loss are always fp32."""
    freeze_lm_head: bool = False
    """Freeze the backbone's output projection (LLaDA `ff_out`). The authors froze it in all their runs (bf16 +
    ZeRO-2 NaNs); the paper table does not mention it."""
    freeze_noise_embed: bool | None = None
    """None = follow the DSL config (`dsl.converter.trainable_noise_embed`, or the checkpoint's). True = frozen
    (authors' released code); False = trainable (paper; re-normalised to the unit sphere in every forward)."""
    freeze_input_embedding: bool | None = None
    """The backbone's token embedding (LLaDA `wte`). None = frozen exactly when the objective never reads it ('dsl'
    with converter context embeddings, or without prompts), else trained. Frozen parameters are not in the optimiser
    (no weight decay drift)."""
    freeze_backbone: bool = False
    """Freeze every backbone parameter ('dsl': only the converter and noise embedding train)."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block in backward (saves activation memory at ~30% more compute)."""
    sharding: Literal["none", "fsdp2"] = "none"
    """'fsdp2': shard the model with torch FSDP2 (`fully_shard` on every transformer block, then the root) under any
    multi-process launcher (torchrun, `accelerate launch` without an FSDP config; CPU/gloo or GPU/NCCL). An
    accelerate FSDP config (configs/fsdp.yaml) selects the same path with its own settings."""
    ddp_find_unused_parameters: bool = False
    """DDP only: let DDP search for parameters without gradients (needed only for custom objectives that skip
    trainable parameters)."""
    world_size: int | None = None
    """Expected number of processes; the run refuses to start under a launcher that gives another number (guards
    the global batch; `--cpu --num_processes 2` silently runs one process). None = any."""

    # -- run ------------------------------------------------------------------------------------------------------
    seed: int = 42
    """Seed of the objective noise (process r uses seed + r), the global RNGs and scratch init (the data shuffle has
    its own `data.seed`)."""
    output_dir: str = "outputs/train"
    """Checkpoints `checkpoint-{step}/`, the final model `final/`, `metrics.jsonl` and tracker logs."""
    resume: str | None = "auto"
    """'auto' = continue from the newest complete checkpoint in output_dir (if any); a checkpoint folder path; None =
    start fresh (refused when output_dir already holds checkpoints)."""
    save_every: int = 100
    """Checkpoint every N updates (0 = only at the end). A checkpoint is always written at the last step."""
    keep_last: int | None = 3
    """Keep the newest N checkpoints (None or 0 = keep all). `final/` is never rotated."""
    save_final: bool = True
    """Write `output_dir/final/` (model only, hard links to the last checkpoint's files where possible)."""
    log_every: int = 10
    """Log every N updates (loss averaged over the window); progress bar every update."""
    eval_every: int = 50
    """Monitoring every N updates (0 = off): fixed-SNR CE/acc, clean and infill CE/acc, converter stats and
    embedding health ('dsl'); clean + infill for the controls. Also at the last step."""
    eval_batches: int = 2
    """Micro-batches per process for monitoring (the data's validation hold-out when `data.validation_every` is
    set, else the first blocks of the training stream, unshuffled); results are averaged over processes."""
    eval_snrs: tuple[float, ...] = (1.0, 5.0, 10.0, 20.0, 50.0)
    """SNRs of the fixed-SNR evaluation ('dsl')."""
    eval_bayes_floor: BayesFloorConfig | None = None
    """Toy world only (`data.toy_world`): every `every` updates and at the end, the held-out cross-entropy of the model,
    of the world's exact Bayes-optimal denoiser (the floor) and their difference (the excess loss), on the same noise
    draws: `eval/bayes_floor/{model_ce,floor,excess}` ('dsl': γ from `objective_options.snr`; the controls: masked
    positions, mean over mask rates 0.1..1.0, each rate also logged). None = off."""
    logging: Literal["jsonl", "tensorboard", "wandb"] = "jsonl"
    """Metrics sink besides `metrics.jsonl` (always written): 'tensorboard' (output_dir/tensorboard) or 'wandb'
    (needs the optional wandb package)."""
    project_name: str = "dsl-llada"
    """Tracker project / run-group name (TensorBoard subfolder, wandb project)."""
    progress: bool = True
    """tqdm progress bar on the main process."""

    _nested: ClassVar[dict[str, type[ConfigBase]]] = {"objective_options": ObjectiveConfig, "dsl": DSLConfig, "data": DataConfig}

    def __post_init__(self) -> None:
        # Friendly construction from plain dicts (TrainConfig(data={...})).
        for name, sub in self._nested.items():
            v = getattr(self, name)
            if isinstance(v, dict):
                object.__setattr__(self, name, sub.from_dict(v))
            elif not isinstance(v, sub):
                raise ConfigError(f"{name}={v!r} must be a {sub.__name__} (or a dict of its fields)")
        if isinstance(self.eval_bayes_floor, dict):
            object.__setattr__(self, "eval_bayes_floor", BayesFloorConfig.from_dict(self.eval_bayes_floor))
        for name in ("betas", "eval_snrs"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
        _check(self.objective in OBJECTIVES, f"objective={self.objective!r} is not valid; expected one of {list(OBJECTIVES)}")
        _check(isinstance(self.init_from, str), f"init_from={self.init_from!r} must be a path string or 'scratch'")
        if self.init_from == SCRATCH:
            _check(isinstance(self.scratch_model, dict) and bool(self.scratch_model),
                   "init_from='scratch' needs scratch_model={d_model: ..., n_layers: ..., n_heads: ..., vocab_size: ..., "
                   "mask_token_id: ..., eos_token_id: ...}")
        elif self.scratch_model is not None:
            _check(isinstance(self.scratch_model, dict), f"scratch_model={self.scratch_model!r} must be a dict or None")
        _check(self.tokenizer is None or (isinstance(self.tokenizer, str) and bool(self.tokenizer)),
               f"tokenizer={self.tokenizer!r} must be a folder path, one of {list(SPECIAL_TOKENIZERS)}, or None")
        _check(_is_num(self.lr) and self.lr > 0, f"lr={self.lr!r} must be a finite number > 0")
        _check(_is_num(self.converter_lr_mult) and self.converter_lr_mult > 0,
               f"converter_lr_mult={self.converter_lr_mult!r} must be a finite number > 0")
        _check(self.converter_lr_mode in ("param_group", "grad_hook"),
               f"converter_lr_mode={self.converter_lr_mode!r} is not valid; expected one of ['param_group', 'grad_hook']")
        _check(isinstance(self.betas, tuple) and len(self.betas) == 2 and all(_is_num(b) and 0 <= b < 1 for b in self.betas),
               f"betas={self.betas!r} must be two numbers in [0, 1)")
        _check(_is_num(self.eps) and self.eps > 0, f"eps={self.eps!r} must be a number > 0")
        _check(_is_num(self.weight_decay) and self.weight_decay >= 0, f"weight_decay={self.weight_decay!r} must be >= 0")
        _check(_is_int(self.warmup_steps) and self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps!r} must be an int >= 0")
        _check(_is_int(self.max_steps) and self.max_steps >= 1, f"max_steps={self.max_steps!r} must be an int >= 1")
        _check(_is_int(self.per_device_batch_size) and self.per_device_batch_size >= 1,
               f"per_device_batch_size={self.per_device_batch_size!r} must be an int >= 1")
        _check(_is_int(self.grad_accum) and self.grad_accum >= 1, f"grad_accum={self.grad_accum!r} must be an int >= 1")
        _check(self.max_grad_norm is None or (_is_num(self.max_grad_norm) and self.max_grad_norm >= 0),
               f"max_grad_norm={self.max_grad_norm!r} must be a number >= 0 or None (no clipping)")
        _check(self.mixed_precision in ("auto", "no", "bf16"),
               f"mixed_precision={self.mixed_precision!r} is not valid; expected one of ['auto', 'no', 'bf16']")
        for name in ("freeze_lm_head", "freeze_backbone", "gradient_checkpointing", "ddp_find_unused_parameters",
                     "save_final", "progress"):
            _check(isinstance(getattr(self, name), bool), f"{name}={getattr(self, name)!r} must be true or false")
        for name in ("freeze_noise_embed", "freeze_input_embedding"):
            v = getattr(self, name)
            _check(v is None or isinstance(v, bool), f"{name}={v!r} must be true, false or null (auto)")
        _check(self.sharding in ("none", "fsdp2"), f"sharding={self.sharding!r} is not valid; expected one of ['none', 'fsdp2']")
        _check(self.world_size is None or (_is_int(self.world_size) and self.world_size >= 1),
               f"world_size={self.world_size!r} must be an int >= 1 or None")
        _check(_is_int(self.seed) and self.seed >= 0, f"seed={self.seed!r} must be an int >= 0")
        _check(isinstance(self.output_dir, str) and bool(self.output_dir), f"output_dir={self.output_dir!r} must be a non-empty path")
        _check(self.resume is None or (isinstance(self.resume, str) and bool(self.resume)),
               f"resume={self.resume!r} must be 'auto', a checkpoint folder, or None")
        _check(_is_int(self.save_every) and self.save_every >= 0, f"save_every={self.save_every!r} must be an int >= 0")
        _check(self.keep_last is None or (_is_int(self.keep_last) and self.keep_last >= 0),
               f"keep_last={self.keep_last!r} must be an int >= 0 or None (keep all)")
        _check(_is_int(self.log_every) and self.log_every >= 1, f"log_every={self.log_every!r} must be an int >= 1")
        _check(_is_int(self.eval_every) and self.eval_every >= 0, f"eval_every={self.eval_every!r} must be an int >= 0")
        _check(_is_int(self.eval_batches) and self.eval_batches >= 1, f"eval_batches={self.eval_batches!r} must be an int >= 1")
        _check(len(self.eval_snrs) >= 1 and all(_is_num(g) and g >= 0 for g in self.eval_snrs),
               f"eval_snrs={self.eval_snrs!r} must be a non-empty list of SNRs >= 0")
        self._check_toy_world()
        _check(self.logging in LOGGERS, f"logging={self.logging!r} is not valid; expected one of {list(LOGGERS)}")
        _check(isinstance(self.project_name, str) and bool(self.project_name), "project_name must be a non-empty string")

    def _check_toy_world(self) -> None:
        floor = self.eval_bayes_floor
        _check(floor is None or isinstance(floor, BayesFloorConfig),
               f"eval_bayes_floor={floor!r} must be a mapping {{n_heldout: ..., every: ...}} or null (off)")
        _check(floor is None or self.data.toy_world is not None,
               "eval_bayes_floor needs the toy-world data source (data.toy_world: {...}, data.format: sft): the floor is "
               "the toy world's exact denoiser's loss, which no other data has; set data.toy_world or remove "
               "eval_bayes_floor")
        _check(self.data.toy_world is None or self.tokenizer is None,
               f"tokenizer={self.tokenizer!r} is not valid with data.toy_world: the toy world's conversations use the "
               f"world's own word-level tokenizer; leave tokenizer out (null)")

    @property
    def converter_lr(self) -> float:
        """Effective converter learning rate (param_group mode) or the gradient multiplier's nominal LR."""
        return self.lr * self.converter_lr_mult

    def global_batch(self, world_size: int) -> int:
        """Sequences per optimizer update."""
        return self.per_device_batch_size * self.grad_accum * world_size


# -- loading presets and overrides ---------------------------------------------------------------------------------
def _coerce(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """YAML 1.1 reads '2e-5' as a string: turn numeric strings into floats where the field is a float."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001  (unresolvable annotations: leave the values alone)
        return data
    nested = getattr(cls, "_nested", {})
    out = dict(data)
    for f in fields(cls):
        if f.name not in out:
            continue
        v = out[f.name]
        sub = nested.get(f.name)
        if sub is not None and isinstance(v, dict):
            out[f.name] = _coerce(sub, v)
            continue
        hint = str(hints.get(f.name, ""))
        if "float" not in hint or "str" in hint:
            continue
        if isinstance(v, str):
            try:
                out[f.name] = float(v)
            except ValueError:
                pass
        elif isinstance(v, list):
            out[f.name] = [float(x) if isinstance(x, str) and _floaty(x) else x for x in v]
    return out


def _floaty(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def load_train_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """A TrainConfig from a YAML/JSON preset (or the defaults when `path` is None) plus dotted overrides.

    A full checkpoint config (`checkpoint-N/trainer_state/train_config.json`) loads too.
    """
    data: dict[str, Any] = {} if path is None else read_config_file(path, "training")
    if "distributed_type" in data or "zero_optimization" in data:
        raise ConfigError(f"{path} is an accelerate/DeepSpeed launcher config: pass it to `accelerate launch "
                          f"--config_file {path}`, and a training preset (e.g. configs/paper-8b.yaml) to --config")
    data = apply_overrides(data, overrides)
    return TrainConfig.from_dict(_coerce(TrainConfig, data))
