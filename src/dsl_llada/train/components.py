"""The pieces a training run is assembled from: the accelerator, the model to train, the tokenizer, the module
accelerate prepares (`ObjectiveModule`), FSDP2 sharding and the DeepSpeed config fill-in."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..core.backbones.base import Backbone, SpecialTokens
from ..core.backbones.llada import LLaDABackbone, LLaDAConfig
from ..core.loading import is_dsl_checkpoint, load_model
from ..config import ConfigError
from ..core.model import DSLModel
from .train_config import SCRATCH, SPECIAL_TOKENIZERS, TrainConfig
from .objectives import ObjectiveOutput

if TYPE_CHECKING:
    from .world_source import FloorMetric, WorldCorpus

logger = logging.getLogger("dsl_llada.train")

__all__ = ["ObjectiveModule", "backbone_of", "configure_deepspeed", "enable_gradient_checkpointing", "flat_config",
           "floor_evaluator", "load_training_model", "make_accelerator", "resolve_tokenizer", "shard_fsdp2", "tokenizer_for_checkpoints"]


class ObjectiveModule(nn.Module):
    """What accelerate prepares: ``forward(batch, generator)`` runs the objective and returns (loss, metrics,
    n_tokens); ``forward(fn=f)`` returns ``f(model)`` (monitoring) from inside the wrapper's forward, so DDP, FSDP and
    DeepSpeed see every use of the parameters (FSDP unshards the root's parameters only inside its forward)."""

    def __init__(self, model: DSLModel | Backbone, objective: Callable[..., ObjectiveOutput]):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: dict[str, torch.Tensor] | None = None, generator: torch.Generator | None = None,
                fn: Callable[[DSLModel | Backbone], Any] | None = None) -> Any:
        if fn is not None:
            return fn(self.model)
        out = self.objective(self.model, batch, generator)
        return out.loss, out.metrics, out.n_tokens


# -- accelerator -----------------------------------------------------------------------------------------------------
def _reset_accelerate_state() -> None:
    """Allow several train() calls in one process (tests, notebooks): accelerate's state objects are singletons."""
    try:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
    except (ImportError, AttributeError):  # pragma: no cover - other accelerate versions
        pass


def make_accelerator(config: TrainConfig, output_dir: Path):
    """(Accelerator, resolved mixed precision). Checks the expected world size."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    c = config
    _reset_accelerate_state()
    cuda = torch.cuda.is_available()
    mp = c.mixed_precision if c.mixed_precision != "auto" else ("bf16" if cuda else "no")
    log_with = None if c.logging == "jsonl" else c.logging
    if log_with is not None:
        from accelerate.utils import is_tensorboard_available, is_wandb_available

        available = is_wandb_available() if log_with == "wandb" else is_tensorboard_available()
        if not available:  # accelerate would silently drop the tracker
            raise ConfigError(f"logging={log_with!r} needs the optional {log_with} package (pip install {log_with}); "
                              f"or use logging='jsonl' (metrics.jsonl is always written)")
    acc = Accelerator(
        gradient_accumulation_steps=c.grad_accum, mixed_precision=mp, cpu=not cuda, log_with=log_with,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "tensorboard")),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=c.ddp_find_unused_parameters)],
        step_scheduler_with_optimizer=False)
    if mp == "bf16" and not cuda:
        logger.warning("mixed_precision='bf16' on CPU: bf16 matmuls are very slow on CPUs without bf16 units")
    if c.world_size is not None and acc.num_processes != c.world_size:
        raise ConfigError(f"world_size={c.world_size} expected but the launcher started {acc.num_processes} "
                          f"process(es); check the launcher (on CPU use `ACCELERATE_USE_CPU=true accelerate launch "
                          f"--multi_gpu --num_processes N`) or set world_size=null")
    return acc, mp


def configure_deepspeed(acc, config: TrainConfig) -> None:
    """Fill the DeepSpeed config's "auto" batch/clip values (we do not hand accelerate a dataloader to infer them)."""
    ds = acc.state.deepspeed_plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = config.per_device_batch_size
    if ds.get("train_batch_size", "auto") == "auto":
        ds["train_batch_size"] = config.global_batch(acc.num_processes)
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = float(config.max_grad_norm or 0.0)
    if ds.get("gradient_accumulation_steps", "auto") not in ("auto", config.grad_accum):
        raise ConfigError(f"the DeepSpeed config sets gradient_accumulation_steps={ds['gradient_accumulation_steps']} "
                          f"but grad_accum={config.grad_accum}; use \"auto\" in the DeepSpeed JSON")


def flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys with scalar values (TensorBoard hparams / wandb config)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_config(v, key + "."))
        else:
            out[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


# -- model and tokenizer ---------------------------------------------------------------------------------------------
def backbone_of(model: DSLModel | Backbone) -> Backbone:
    return model.backbone if isinstance(model, DSLModel) else model


def load_training_model(config: TrainConfig, source: str | Path | nn.Module | None = None) -> DSLModel | Backbone:
    """The model `config.objective` trains: a DSLModel for 'dsl', a bare backbone for the controls.

    `source` (default `config.init_from`): a backbone folder, a DSL checkpoint folder, 'scratch', or a module.
    """
    source = config.init_from if source is None else source
    toy = _toy_corpus(config)
    model: nn.Module
    if isinstance(source, nn.Module):
        model = source
    elif str(source) == SCRATCH:
        fields = toy.scratch_model(config.scratch_model) if toy else dict(config.scratch_model or {})
        cfg = LLaDAConfig.from_hf_dict(fields, where="TrainConfig.scratch_model")
        model = LLaDABackbone(cfg)
        model.init_weights(torch.Generator().manual_seed(config.seed), std=0.02)
    else:
        path = Path(source)
        if not path.is_dir():
            raise FileNotFoundError(f"init_from={str(source)!r} is not a folder (expected a backbone or DSL checkpoint "
                                    f"folder, or 'scratch')")
        if is_dsl_checkpoint(path) and config.objective != "dsl":
            logger.warning("%s is a DSL checkpoint; the %r control trains its backbone only (the converter is "
                           "dropped from the saved checkpoints)", path, config.objective)
        # Not through `open_model`: the run's tokenizer is a setting of its own (`tokenizer`: a folder, 'bytes',
        # 'ids', or the toy world's), which init_from need not hold, and accelerate places the fp32 CPU model itself.
        model = load_model(path, backbone_only=config.objective != "dsl")
    if isinstance(model, Backbone):
        model = DSLModel.convert(model, config.dsl) if config.objective == "dsl" else model
    elif isinstance(model, DSLModel):
        model = model if config.objective == "dsl" else model.backbone
    else:
        raise TypeError(f"the {config.objective!r} objective needs a backbone or a DSLModel, got {type(model).__name__}")
    if toy is not None:
        toy.check_model(backbone_of(model).vocab_size, backbone_of(model).special)
    return model


def _toy_corpus(config: TrainConfig) -> "WorldCorpus | None":
    """The run's toy-world corpus (`data.toy_world`, from the registered `world_source.WorldTraining`), or None."""
    if config.data.toy_world is None:
        return None
    from .world_source import world_training

    return world_training().corpus(config.data.toy_world)


def floor_evaluator(config: TrainConfig) -> "FloorMetric | None":
    """The run's `eval_bayes_floor` measurement (from the registered `world_source.WorldTraining`), or None."""
    if config.eval_bayes_floor is None:
        return None
    from .world_source import world_training

    return world_training().floor_metric(config)


def _byte_encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _ids_encode(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split()]
    except ValueError as e:
        raise ValueError(f"tokenizer='ids' expects whitespace-separated integer token ids; got {text[:60]!r}") from e


def resolve_tokenizer(config: TrainConfig, fallback_dir: Path | None) -> tuple[Any, Path | None]:
    """(tokenizer or str -> ids callable, folder whose tokenizer files are copied into checkpoints)."""
    toy = _toy_corpus(config)
    if toy is not None:  # the world's own tokenizer (saved into every checkpoint)
        return toy.tokenizer, None
    name = config.tokenizer
    if name == "bytes":
        return _byte_encode, None
    if name == "ids":
        return _ids_encode, None
    folder = Path(name) if name else fallback_dir
    if name and folder is not None and not folder.is_dir():  # never a hub id: the tokenizer is a local folder
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise ConfigError(f"tokenizer={name!r}: {what}; set `tokenizer` to a local tokenizer folder (with "
                          f"tokenizer.json), 'bytes' or 'ids'")
    if folder is None:
        raise ConfigError("no tokenizer: set `tokenizer` to a tokenizer folder, 'bytes' or 'ids' (init_from='scratch' "
                          "has no tokenizer files)")
    from ..core.loading import load_tokenizer

    return load_tokenizer(folder, chat_template=False), folder


def tokenizer_for_checkpoints(config: TrainConfig, tokenizer: Any, tokenizer_dir: Path | None, special: SpecialTokens,
                              vocab_size: int) -> Any:
    """The tokenizer object whose `save_pretrained` files go into every checkpoint, or None.

    None when `tokenizer_dir` is set (its files are copied instead). 'bytes'/'ids' get equivalent Hugging Face
    tokenizer files; a tokenizer object passed to the Trainer is saved as is; a bare callable cannot be saved (a
    warning says so: `generate` then needs --tokenizer)."""
    if tokenizer_dir is not None:
        return None
    if isinstance(config.tokenizer, str) and config.tokenizer in SPECIAL_TOKENIZERS and \
            tokenizer in (_byte_encode, _ids_encode):
        from .builtin_tokenizers import builtin_tokenizer

        try:
            return builtin_tokenizer(config.tokenizer, vocab_size, special)
        except ValueError as e:
            logger.warning("checkpoints will hold no tokenizer files: %s", e)
            return None
    if hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    logger.warning("checkpoints will hold no tokenizer files (the tokenizer is a plain callable); pass --tokenizer "
                   "to `dsl-llada generate`")
    return None


def enable_gradient_checkpointing(backbone: Backbone) -> None:
    enable = getattr(backbone, "gradient_checkpointing_enable", None)  # a transformers model's switch
    if enable is not None:
        enable()
    elif hasattr(backbone, "gradient_checkpointing"):  # the native families' flag
        setattr(backbone, "gradient_checkpointing", True)
    else:
        raise ConfigError(f"gradient_checkpointing=true is not supported by {type(backbone).__name__}")


# -- FSDP2 -----------------------------------------------------------------------------------------------------------
def _block_class_names(backbone: nn.Module, plugin: Any) -> set[str]:
    names = {n.strip() for n in (getattr(plugin, "transformer_cls_names_to_wrap", None) or []) if n and n.strip()}
    if not names:
        if isinstance(backbone, LLaDABackbone):
            names = {"LLaDABlock"}
        else:
            names = set(getattr(getattr(backbone, "_hf", None), "_no_split_modules", None) or [])
    if not names:
        raise ConfigError(f"FSDP: cannot tell which modules of {type(backbone).__name__} are transformer blocks; set "
                          f"fsdp_transformer_layer_cls_to_wrap in the accelerate FSDP config")
    return names


def shard_fsdp2(wrapper: ObjectiveModule, device: torch.device, mixed_precision: str,
                plugin: Any = None) -> list[nn.Parameter]:
    """`fully_shard` every transformer block, then the root (in place). Scalar parameters (the converter's beta)
    stay replicated, because fully_shard refuses 0-d tensors: their gradients must be all-reduced by the caller.
    Returns those trainable replicated parameters. `plugin` = accelerate's FSDP plugin (block class names,
    reshard_after_forward), when launched with an accelerate FSDP config."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    backbone = backbone_of(wrapper.model)
    names = _block_class_names(backbone, plugin)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision == "bf16" \
        else MixedPrecisionPolicy()
    reshard = getattr(plugin, "reshard_after_forward", True)
    reshard = reshard if isinstance(reshard, bool) else True
    offload = getattr(plugin, "cpu_offload", None)
    if type(offload).__name__ == "CPUOffloadPolicy" or getattr(offload, "offload_params", False) is True:
        logger.warning("FSDP cpu_offload from the accelerate config is ignored by the trainer's FSDP2 path")
    wrapper.to(device)
    blocks = [m for m in wrapper.modules() if type(m).__name__ in names]
    if not blocks:
        raise ConfigError(f"FSDP: no module of class {sorted(names)} in {type(backbone).__name__}")
    for m in blocks:
        fully_shard(m, mp_policy=mp, reshard_after_forward=reshard)
    scalars = {p for p in wrapper.parameters() if p.dim() == 0}
    fully_shard(wrapper, mp_policy=mp, reshard_after_forward=reshard, ignored_params=scalars or None)
    return [p for p in scalars if p.requires_grad]
