"""The toy-world data source of `train` (`data.toy_world`): the embedded world's conversations in the padded SFT
layout the demo trains on, with the world's own tokenizer and special tokens.

One conversation per block: the chat-templated prompt, the response, `<|eot_id|>`, then `<|endoftext|>` padding; the
response part is exactly `gen_length` tokens and the rest of the block (longer prompts take more of it) is padding.
The conversations are the world's 'train' split (the demo's training set), alternating open-ended and summarisation
so that every stretch of the stream holds both tasks. The exact oracle of `eval_bayes_floor` knows this layout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..backbones.base import SpecialTokens
from ..config import ConfigError, _check
from ..toy.demo_train import longest_prompt, sft_tensors, train_conversations
from ..toy.tasks import TaskExample
from ..toy.tokenizer import build_tokenizer, special_tokens
from ..toy.world import ToyWorld
from .toy_config import ToyWorldData

__all__ = ["ToyWorldCorpus", "toy_world_blocks", "toy_world_corpus"]


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


@functools.lru_cache(maxsize=2)
def toy_world_corpus(settings: ToyWorldData) -> ToyWorldCorpus:
    """The world, its tokenizer and its `n_train` training conversations (built once per settings)."""
    world = ToyWorld(settings.world_config())
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
