"""Training back-ends: one small object per engine, so the trainer and the checkpoint code never test engine flags.

=============  ============================================  =====================================================
back-end       when                                          what differs
=============  ============================================  =====================================================
``plain``      1 process or DDP (accelerate)                 accelerate prepares the module; accelerate's
                                                             accumulate/backward/clip
``fsdp2``      ``sharding: fsdp2`` or an accelerate FSDP     ``fully_shard`` per transformer block; manual
               launch config                                 accumulation; scalar parameters stay replicated and
                                                             their gradients are all-reduced here; global-norm clip
                                                             over DTensors; full state dicts gathered to rank 0
``deepspeed``  an accelerate DeepSpeed launch config         the engine clips inside its step (the norm is read
                                                             after it) and saves its own optimizer partitions
=============  ============================================  =====================================================

Every back-end has the same methods: `shard` (before the optimizer exists), `prepare`, `forward_backward`,
`attach_converter_multiplier` (the authors' converter gradient multiplier), `clip`, `grad_norm_after_step`,
`model_weights`, `save_optimizer` / `load_optimizer`, `close`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.backbones.base import Backbone
from ..config import ConfigError
from ..core.model import DSLModel
from .checkpointing import MODEL_PREFIX, load_tree, save_tree
from .components import ObjectiveModule, configure_deepspeed, shard_fsdp2
from .train_config import TrainConfig
from .optim import clip_grad_norm_sharded, register_converter_grad_hooks, scale_converter_grads

__all__ = ["Backend", "DeepSpeedBackend", "FSDP2Backend", "PlainBackend", "make_backend"]


class Backend:
    """Plain PyTorch module prepared by accelerate (1 process or DDP)."""

    name = "plain"
    update_applied_before_norm = False
    """True when the optimizer step has already happened by the time the gradient norm is known (DeepSpeed)."""

    def __init__(self, acc: Any, config: TrainConfig, mixed_precision: str):
        self.acc, self.config, self.mixed_precision = acc, config, mixed_precision
        self.world = acc.num_processes
        self.wrapped: Any = None
        """The module as the engine runs it (DDP, a DeepSpeed engine, the FSDP2-sharded module); set by prepare()."""
        self.optimizer: torch.optim.Optimizer  # set by prepare()
        self.scheduler: Any = None
        self.module: ObjectiveModule  # set by prepare()
        """The ObjectiveModule itself (unwrapped from DDP/DeepSpeed; the sharded module under FSDP2)."""
        self._hooks: list = []

    # -- setup ----------------------------------------------------------------------------------------------------
    def shard(self, wrapper: ObjectiveModule) -> None:
        """Shard the module in place before its optimizer parameter groups are built (FSDP2 only)."""

    def prepare(self, wrapper: ObjectiveModule, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        self.wrapped, self.optimizer, self.scheduler = self.acc.prepare(wrapper, optimizer, scheduler)
        self.module = self.acc.unwrap_model(self.wrapped)

    def attach_converter_multiplier(self, params: list[nn.Parameter], factor: float) -> None:
        """The authors' converter "LR multiplier" (converter_lr_mode='grad_hook'): gradients times `factor`."""
        self._hooks = register_converter_grad_hooks(params, factor)

    # -- one update -----------------------------------------------------------------------------------------------
    def forward_backward(self, batch: dict[str, torch.Tensor], generator: torch.Generator,
                         last: bool) -> tuple[torch.Tensor, dict[str, float], int]:
        """Objective forward + backward of one micro-batch (`last`: the final micro-batch of the update)."""
        with self.acc.accumulate(self.wrapped):
            loss, metrics, n = self.wrapped(batch, generator)
            self.acc.backward(loss)
        return loss, metrics, n

    def clip(self, params: list[nn.Parameter], max_norm: float | None) -> float | None:
        """Global gradient norm before clipping (None when the engine reports it after the step)."""
        norm = self.acc.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
        return None if norm is None else float(norm)

    def grad_norm_after_step(self) -> float | None:
        return None

    # -- state ----------------------------------------------------------------------------------------------------
    def model_weights(self, model: DSLModel | Backbone, is_dsl: bool, main: bool) -> dict[str, torch.Tensor]:
        """Full weights under their checkpoint names on the main process ({} elsewhere); every process calls it."""
        if not main:
            return {}
        return model.full_state_dict() if isinstance(model, DSLModel) else model.state_dict()

    def save_optimizer(self, state_dir: Path, main: bool) -> None:
        """Write the optimizer state into `state_dir` (every process calls it)."""
        if main:
            save_tree(self.optimizer.state_dict(), state_dir, "optimizer")

    def load_optimizer(self, state_dir: Path, main: bool) -> None:
        self.optimizer.load_state_dict(load_tree(state_dir, "optimizer"))

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


PlainBackend = Backend


class DeepSpeedBackend(Backend):
    """DeepSpeed ZeRO through accelerate: the engine clips inside its step and checkpoints its own partitions."""

    name = "deepspeed"
    update_applied_before_norm = True

    def prepare(self, wrapper: ObjectiveModule, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        configure_deepspeed(self.acc, self.config)
        super().prepare(wrapper, optimizer, scheduler)

    def clip(self, params: list[nn.Parameter], max_norm: float | None) -> float | None:
        return None  # gradient_clipping in the DeepSpeed config (configure_deepspeed fills it from max_grad_norm)

    def grad_norm_after_step(self) -> float | None:
        gn = self.wrapped.get_global_grad_norm()
        return None if gn is None else float(gn)

    def save_optimizer(self, state_dir: Path, main: bool) -> None:
        self.wrapped.save_checkpoint(str(state_dir / "deepspeed"), tag="state", save_latest=False)

    def load_optimizer(self, state_dir: Path, main: bool) -> None:
        self.wrapped.load_checkpoint(str(state_dir / "deepspeed"), tag="state", load_optimizer_states=True,
                                     load_lr_scheduler_states=False)


class FSDP2Backend(Backend):
    """`fully_shard` (FSDP2): the module is not passed through accelerate.prepare; accumulation, the replicated
    scalars' gradient all-reduce, the converter multiplier and the global-norm clip are done here."""

    name = "fsdp2"

    def __init__(self, acc: Any, config: TrainConfig, mixed_precision: str):
        super().__init__(acc, config, mixed_precision)
        self.replicated: list[nn.Parameter] = []
        self._converter: tuple[list[nn.Parameter], float] | None = None

    def shard(self, wrapper: ObjectiveModule) -> None:
        self.replicated = shard_fsdp2(wrapper, self.acc.device, self.mixed_precision,
                                      getattr(self.acc.state, "fsdp_plugin", None))

    def prepare(self, wrapper: ObjectiveModule, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        self.wrapped, self.optimizer, self.scheduler = wrapper, optimizer, scheduler
        self.module = wrapper

    def attach_converter_multiplier(self, params: list[nn.Parameter], factor: float) -> None:
        # hooks on sharded parameters never fire (the autograd leaves are the unsharded copies): scale at clip time
        self._converter = (params, factor)

    def forward_backward(self, batch: dict[str, torch.Tensor], generator: torch.Generator,
                         last: bool) -> tuple[torch.Tensor, dict[str, float], int]:
        self.wrapped.set_requires_gradient_sync(last)
        loss, metrics, n = self.wrapped(batch, generator)
        (loss / self.config.grad_accum).backward()
        return loss, metrics, n

    def clip(self, params: list[nn.Parameter], max_norm: float | None) -> float | None:
        if self.replicated and self.world > 1:
            import torch.distributed as dist

            for p in self.replicated:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(self.world)
        if self._converter is not None:
            scale_converter_grads(*self._converter)
        return clip_grad_norm_sharded(params, max_norm)

    def model_weights(self, model: DSLModel | Backbone, is_dsl: bool, main: bool) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full: dict[str, Any] = get_model_state_dict(self.wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        weights = {k.removeprefix(MODEL_PREFIX): v for k, v in full.items()}
        if is_dsl:  # DSLModel.full_state_dict names: backbone keys unprefixed
            weights = {k.removeprefix("backbone."): v for k, v in weights.items()}
        return weights

    def save_optimizer(self, state_dir: Path, main: bool) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(self.wrapped, self.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if main:
            save_tree(state, state_dir, "optimizer")

    def load_optimizer(self, state_dir: Path, main: bool) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        state = load_tree(state_dir, "optimizer") if main else {}
        set_optimizer_state_dict(self.wrapped, self.optimizer, state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def make_backend(acc: Any, config: TrainConfig, mixed_precision: str) -> Backend:
    """The back-end for this launch: DeepSpeed (accelerate DeepSpeed config), FSDP2 (`sharding: fsdp2` or an
    accelerate FSDP config) or plain (1 process / DDP)."""
    from accelerate.utils import DistributedType

    if acc.distributed_type == DistributedType.DEEPSPEED:
        if config.sharding == "fsdp2":
            raise ConfigError("sharding='fsdp2' cannot be combined with a DeepSpeed launch; use sharding='none' "
                              "(DeepSpeed shards by its own zero_optimization stage)")
        return DeepSpeedBackend(acc, config, mixed_precision)
    if config.sharding == "fsdp2" or acc.distributed_type == DistributedType.FSDP:
        return FSDP2Backend(acc, config, mixed_precision)
    return PlainBackend(acc, config, mixed_precision)
