"""The toy-world settings of a training run: the data source `data.toy_world` and the metric `eval_bayes_floor`.

Plain validated dataclasses: the world that builds the conversations and computes the metric plugs in through
`world_source` (the toy package implements it; training never imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ConfigBase, _check

__all__ = ["BayesFloorConfig", "ToyWorldData", "MAX_HELDOUT", "MAX_TOY_TOPICS", "MAX_TOY_TRAIN"]

MAX_TOY_SEED = 2**31 - 1
MAX_TOY_TOPICS = 8
"""The topics of the toy world's lexicon (a test holds this equal to the lexicon's own count)."""
MAX_TOY_SENTENCES = 10
"""Longest responses the toy-world source accepts: the response automaton grows with the sentence cap and every
sentence adds 10 words of `gen_length`."""
MAX_TOY_GEN_LENGTH = 1024
MAX_TOY_TRAIN = 200_000
"""Conversations are generated and tokenised in memory when a run starts."""
MAX_HELDOUT = 10_000
MAX_FLOOR_EVERY = 100_000


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_in(name: str, v: Any, lo: int, hi: int, why: str = "") -> None:
    _check(_is_int(v) and lo <= v <= hi, f"{name}={v!r} is not valid: it must be an integer from {lo} to {hi}{why}")


@dataclass(frozen=True)
class ToyWorldData(ConfigBase):
    """`data.toy_world`: train on conversations of the embedded toy world (docs/toy-world.md), tokenised with the
    world's own word-level tokenizer, one conversation per block: chat prompt, response, `<|eot_id|>`, then
    `<|endoftext|>` padding to `data.block_size` (`format: sft`). Defaults are the `dsl-llada demo` world."""

    seed: int = 0
    """The world's seed: the training conversations are its 'train' split, the held-out ones of `eval_bayes_floor`
    its 'valid' split."""
    n_topics: int = 4
    """Topics of the world (1..8; the vocabulary grows with them: 177 tokens for 4, 313 for 8)."""
    max_sentences: int = 3
    """Sentences per response at most (2..10; summarisation documents have at least 2)."""
    gen_length: int = 32
    """Response positions of a conversation: response + `<|eot_id|>` + padding (at least 10 x max_sentences + 1)."""
    n_train: int = 6000
    """Training conversations: n_train / 2 open-ended and n_train / 2 summarisation, alternating (an even number)."""

    def __post_init__(self) -> None:
        _int_in("data.toy_world.seed", self.seed, 0, MAX_TOY_SEED)
        _int_in("data.toy_world.n_topics", self.n_topics, 1, MAX_TOY_TOPICS, " (the topics of the lexicon)")
        _int_in("data.toy_world.max_sentences", self.max_sentences, 2, MAX_TOY_SENTENCES,
                " (summarisation documents have at least 2 sentences)")
        _int_in("data.toy_world.gen_length", self.gen_length, 10 * self.max_sentences + 1, MAX_TOY_GEN_LENGTH,
                f" (a response of max_sentences={self.max_sentences} has up to {10 * self.max_sentences} words, plus "
                f"<|eot_id|>)")
        _int_in("data.toy_world.n_train", self.n_train, 2, MAX_TOY_TRAIN)
        _check(self.n_train % 2 == 0, f"data.toy_world.n_train={self.n_train} is not valid: it must be even (half "
                                      f"open-ended, half summarisation conversations)")


@dataclass(frozen=True)
class BayesFloorConfig(ConfigBase):
    """`eval_bayes_floor`: measure the model against the toy world's exact Bayes-optimal denoiser (needs
    `data.toy_world`). On held-out conversations, with the same noise draws for both, the model's cross-entropy, the
    oracle's (the floor: the lowest loss any model can reach there) and the difference (the excess loss)."""

    n_heldout: int = 64
    """Held-out conversations per task (open-ended and summarisation) from the world's 'valid' split (1..10000)."""
    every: int = 100
    """Measure every N updates and at the last one (1..100000)."""

    def __post_init__(self) -> None:
        _int_in("eval_bayes_floor.n_heldout", self.n_heldout, 1, MAX_HELDOUT, " (conversations per task)")
        _int_in("eval_bayes_floor.every", self.every, 1, MAX_FLOOR_EVERY, " (updates)")
