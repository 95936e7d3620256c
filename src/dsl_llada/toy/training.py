"""The toy world's side of training: the data source `data.toy_world` and the metric `eval_bayes_floor`, as the
protocol `dsl_llada.train.world_source.WorldTraining` asks (`TOY_WORLD`; `register()` makes it the process's world).

The data source: the embedded world's conversations in the padded SFT layout the demo trains on, with the world's
own tokenizer and special tokens.

One conversation per block: the chat-templated prompt, the response, `<|eot_id|>`, then `<|endoftext|>` padding; the
response part is exactly `gen_length` tokens and the rest of the block (longer prompts take more of it) is padding.
The conversations are the world's 'train' split (the demo's training set), alternating open-ended and summarisation
so that every stretch of the stream holds both tasks. The exact oracle of `eval_bayes_floor` knows this layout.

The metric: on held-out conversations (the world's 'valid' split, never trained on) the oracle's cross-entropy is the
lowest loss any model can reach there: the Bayes floor. The model's cross-entropy on the same noise draws minus the
floor is its excess loss, the part of its loss that training can still remove (`bayes_floor`):

- a DSL model: γ drawn from the run's own training SNR distribution (`objective_options.snr`), the prompt clean,
  cross-entropy over the response positions (`dsl_excess`);
- a discrete model (the MDM-CPT / XDLM controls): each response position masked with probability p for p on the
  mask-rate grid 0.1..1.0, cross-entropy over the masked positions (`mdm_curve`); the headline values are the means
  over the grid.

The draws are seeded with the run's `seed`, so every measurement of a run uses the same ones and the values are
comparable across steps. Every process measures the whole held-out set (inside the prepared module's forward, as
the monitoring does), so the values are identical on every process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.backbones.base import Backbone, SpecialTokens
from ..config import ConfigError, _check
from ..core.model import DSLModel
from ..train.monitor import eval_mode
from ..train.toy_config import ToyWorldData
from ..train.train_config import TrainConfig
from ..train.world_source import register_world
from .bayes_floor import MASK_RATES, LossPoint, dsl_excess, mdm_curve
from .demo_train import longest_prompt, sft_tensors, train_conversations
from .floor_report import held_out
from .tasks import TaskExample
from .tokenizer import build_tokenizer, special_tokens
from .world import ToyWorld, ToyWorldConfig

logger = logging.getLogger("dsl_llada.train")

__all__ = ["FloorEval", "PREFIX", "TOY_WORLD", "ToyWorldCorpus", "ToyWorldTraining", "register", "toy_world_blocks",
           "toy_world_corpus", "world_config"]

PREFIX = "eval/bayes_floor"
"""Metric names: PREFIX/model_ce, PREFIX/floor, PREFIX/excess (and PREFIX/rate=p/... for discrete models)."""


def world_config(settings: ToyWorldData) -> ToyWorldConfig:
    """The world of `data.toy_world`."""
    return ToyWorldConfig(seed=settings.seed, n_topics=settings.n_topics, max_sentences=settings.max_sentences,
                          gen_length=settings.gen_length)


@dataclass(frozen=True)
class ToyWorldCorpus:
    """A toy world's training conversations with the tokenizer and special tokens a model of it uses."""

    settings: ToyWorldData
    world: ToyWorld
    tokenizer: Any
    special: SpecialTokens
    examples: tuple[TaskExample, ...]

    def scratch_model(self, fields: dict[str, Any] | None) -> dict[str, Any]:
        """`scratch_model` with the world's vocabulary size and special ids filled in where left out; a value that
        contradicts the world is one ConfigError naming it."""
        sp = self.special
        world_ids = {"vocab_size": self.world.vocab_size, "mask_token_id": sp.mask, "eos_token_id": sp.eos,
                     "pad_token_id": sp.pad_id, "eot_token_id": sp.eot, "bos_token_id": sp.bos}
        out = dict(fields or {})
        for key, value in world_ids.items():
            given = out.setdefault(key, value)
            _check(given == value, f"scratch_model.{key}={given!r} does not match the toy world of data.toy_world "
                                   f"({key} {value}); leave it out and the world's value is used")
        return out

    def check_model(self, vocab_size: int, special: SpecialTokens) -> None:
        """ConfigError unless a model's vocabulary and mask / end-of-text / end-of-turn ids are the world's."""
        pairs: list[tuple[str, int | None, int | None]] = [
            ("vocabulary size", vocab_size, self.world.vocab_size), ("mask id", special.mask, self.special.mask),
            ("eos id", special.eos, self.special.eos)]
        if special.eot is not None:  # a model may have no end-of-turn id; one it has must be the world's
            pairs.append(("eot id", special.eot, self.special.eot))
        bad = [f"{what} {have} (the world's: {want})" for what, have, want in pairs if have != want]
        if bad:
            raise ConfigError(f"the model does not fit the toy world of data.toy_world: {'; '.join(bad)}; train a model "
                              f"of this world (init_from='scratch' takes the world's sizes and ids)")

    def blocks(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`toy_world_blocks` of these settings."""
        return toy_world_blocks(self.settings, block_size)


@functools.lru_cache(maxsize=2)
def toy_world_corpus(settings: ToyWorldData) -> ToyWorldCorpus:
    """The world, its tokenizer and its `n_train` training conversations (built once per settings)."""
    world = ToyWorld(world_config(settings))
    tokenizer = build_tokenizer(world)
    convs = train_conversations(world, settings.n_train)
    half = len(convs) // 2
    alternating = tuple(e for pair in zip(convs[:half], convs[half:]) for e in pair)
    return ToyWorldCorpus(settings, world, tokenizer, special_tokens(tokenizer), alternating)


@functools.lru_cache(maxsize=2)
def toy_world_blocks(settings: ToyWorldData, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_train, block_size) token ids and (n_train,) prompt lengths of the training conversations."""
    corpus = toy_world_corpus(settings)
    examples = list(corpus.examples)
    need = longest_prompt(corpus.tokenizer, examples) + settings.gen_length
    _check(block_size >= need, f"data.block_size={block_size} is too small for the toy world's conversations: the "
                               f"longest needs {need} tokens (its prompt, then gen_length={settings.gen_length}); use "
                               f"data.block_size >= {need}")
    return sft_tensors(corpus.tokenizer, examples, settings.gen_length, block_size)


def _values(p: LossPoint) -> dict[str, float]:
    return {"model_ce": p.model_ce, "floor": p.oracle_ce, "excess": p.excess}


class FloorEval:
    """The held-out conversations and settings of one run's `eval_bayes_floor` (built once at setup)."""

    def __init__(self, config: TrainConfig) -> None:
        settings, data = config.eval_bayes_floor, config.data.toy_world
        if settings is None or data is None:
            raise ValueError("FloorEval needs eval_bayes_floor and data.toy_world in the config")
        corpus = toy_world_corpus(data)
        self.world, self.special, self.every = corpus.world, corpus.special, settings.every
        self.ids, self.prompt_length = held_out(corpus.world, corpus.tokenizer, settings.n_heldout, data.gen_length)
        self.snr, self.seed = config.objective_options.snr, config.seed

    def due(self, step: int, last: bool) -> bool:
        return last or step % self.every == 0

    def measure(self, model: DSLModel | Backbone) -> dict[str, float]:
        """The metrics of `model` (named with `PREFIX`), in eval mode and without gradients."""
        with eval_mode(model), torch.no_grad():
            if isinstance(model, DSLModel):
                values = _values(dsl_excess(model, self.world, self.special, self.ids, self.prompt_length,
                                            snr=self.snr, seed=self.seed))
                return {f"{PREFIX}/{k}": v for k, v in values.items()}
            points = mdm_curve(model, self.world, self.special, self.ids, self.prompt_length, MASK_RATES, self.seed)
        out = {f"{PREFIX}/{k}": sum(_values(p)[k] for p in points) / len(points) for k in ("model_ce", "floor", "excess")}
        out.update({f"{PREFIX}/rate={p.level:g}/{k}": v for p in points for k, v in _values(p).items()})
        return out

    def run(self, call: Callable[..., Any], step: int, main: bool) -> dict[str, float]:
        """`measure` through `call(fn=...)` (the prepared module's forward); the main process logs one line."""
        values: dict[str, float] = call(fn=self.measure)
        if main:
            logger.info("step %d: held-out loss %.4f, Bayes floor %.4f, excess %.4f nats per position", step,
                        values[f"{PREFIX}/model_ce"], values[f"{PREFIX}/floor"], values[f"{PREFIX}/excess"])
        return values


class ToyWorldTraining:
    """The embedded toy world as training's `WorldTraining`: `toy_world_corpus` and `FloorEval`."""

    def corpus(self, settings: ToyWorldData) -> ToyWorldCorpus:
        return toy_world_corpus(settings)

    def floor_metric(self, config: TrainConfig) -> FloorEval:
        return FloorEval(config)


TOY_WORLD = ToyWorldTraining()


def register() -> None:
    """Make the toy world the source of `data.toy_world` and `eval_bayes_floor` in this process."""
    register_world(TOY_WORLD)
