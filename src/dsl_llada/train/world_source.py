"""How a world with an exact oracle plugs into training: the data source `data.toy_world` and the metric
`eval_bayes_floor`.

Training defines what it needs from such a world (`WorldTraining`: a `WorldCorpus` for the settings, a `FloorMetric`
for the run) and never builds one itself. The package that owns the world implements the protocol and registers it
with `register_world`; the `dsl-llada train` command registers the embedded toy world before a run starts. A run
that sets `data.toy_world` while no world is registered stops with one ConfigError saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..core.backbones.base import SpecialTokens
from ..config import ConfigError

if TYPE_CHECKING:
    from .toy_config import ToyWorldData
    from .train_config import TrainConfig

__all__ = ["FloorMetric", "WorldCorpus", "WorldTraining", "register_world", "registered_world", "world_training"]


class WorldCorpus(Protocol):
    """A world's training conversations with the tokenizer and special tokens a model of it uses."""

    @property
    def tokenizer(self) -> Any:
        """The world's own tokenizer (saved into every checkpoint of the run)."""
        ...

    @property
    def special(self) -> SpecialTokens:
        """The world's mask / end-of-text / end-of-turn / padding ids."""
        ...

    def scratch_model(self, fields: dict[str, Any] | None) -> dict[str, Any]:
        """`scratch_model` with the world's vocabulary size and special ids filled in where left out; a value that
        contradicts the world is one ConfigError naming it."""
        ...

    def check_model(self, vocab_size: int, special: SpecialTokens) -> None:
        """ConfigError unless a model's vocabulary and special ids are the world's."""
        ...

    def blocks(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conversations, block_size) token ids and (conversations,) prompt lengths, one conversation per block in
        the padded SFT layout; ConfigError when `block_size` cannot hold the longest one."""
        ...


class FloorMetric(Protocol):
    """The run's `eval_bayes_floor` measurement."""

    def due(self, step: int, last: bool) -> bool:
        """Whether to measure after update `step` (`last`: the run's final update)."""
        ...

    def run(self, call: Callable[..., Any], step: int, main: bool) -> dict[str, float]:
        """The metrics, measured through `call(fn=...)` (the prepared module's forward); the main process logs."""
        ...


class WorldTraining(Protocol):
    """What a world provides to training: its corpus for `data.toy_world` and the `eval_bayes_floor` metric."""

    def corpus(self, settings: ToyWorldData) -> WorldCorpus:
        """The world of these settings and its training conversations (the same object for equal settings)."""
        ...

    def floor_metric(self, config: TrainConfig) -> FloorMetric:
        """The `eval_bayes_floor` measurement of a run whose config sets it and `data.toy_world`."""
        ...


_registered: WorldTraining | None = None


def register_world(world: WorldTraining) -> None:
    """Make `world` the source of `data.toy_world` and `eval_bayes_floor` in this process (replacing any earlier
    one)."""
    global _registered
    _registered = world


def registered_world() -> WorldTraining | None:
    """The world registered in this process, or None."""
    return _registered


def world_training() -> WorldTraining:
    """The registered world; ConfigError when a run needs one and none is registered."""
    if _registered is None:
        raise ConfigError("data.toy_world needs the toy world's training source, which this process has not "
                          "registered; run `dsl-llada train`, or call register_world(...) with the toy world's "
                          "training source before training")
    return _registered
