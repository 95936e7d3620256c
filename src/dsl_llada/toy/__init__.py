"""Embedded toy world: a seeded synthetic language with an exactly computable likelihood.

Small enough for a tiny LLaDA-architecture masked diffusion LM to learn on a
CPU in minutes, and structured enough (agreement, a/an, topic consistency,
cross-sentence pronouns, variable length) that factorised parallel decoding
visibly fails.  See ``docs/toy-world.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pfsa import Pfsa, PfsaBuilder
    from .tasks import (
        CHAT_TEMPLATE,
        TASKS,
        DocAnalysis,
        TaskExample,
        analyze_document,
        corpus_ppl,
        make_corpus,
        make_example,
        make_split,
        open_prompt,
        open_prompts,
        render_prompt,
        render_sft_example,
        response_log_prob,
        response_words,
        sample_document,
        score_response,
        split_rng,
        summary_machine,
        summary_reference,
    )
    from .tokenizer import build_tokenizer, special_ids
    from .words import BOS, END_HEADER, EOS, EOT, MASK, SPECIAL_TOKENS, START_HEADER, UNK
    from .world import ToyWorld, ToyWorldConfig

_HOME = {
    **dict.fromkeys(("Pfsa", "PfsaBuilder"), "pfsa"),
    **dict.fromkeys(("CHAT_TEMPLATE", "TASKS", "DocAnalysis", "TaskExample", "analyze_document", "corpus_ppl",
                     "make_corpus", "make_example", "make_split", "open_prompt", "open_prompts", "render_prompt",
                     "render_sft_example", "response_log_prob", "response_words", "sample_document", "score_response",
                     "split_rng", "summary_machine", "summary_reference"), "tasks"),
    **dict.fromkeys(("build_tokenizer", "special_ids"), "tokenizer"),
    **dict.fromkeys(("BOS", "END_HEADER", "EOS", "EOT", "MASK", "SPECIAL_TOKENS", "START_HEADER", "UNK"), "words"),
    **dict.fromkeys(("ToyWorld", "ToyWorldConfig"), "world"),
}
"""Each public name -> the submodule that defines it: loaded on first use (PEP 562), so importing one submodule
(e.g. the torch-free `frontier_points` or `frontier_report`) does not load the world, the tokenizer and torch."""


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "BOS", "CHAT_TEMPLATE", "DocAnalysis", "END_HEADER", "EOS", "EOT", "MASK", "Pfsa",
    "PfsaBuilder", "SPECIAL_TOKENS", "START_HEADER", "TASKS", "TaskExample", "ToyWorld",
    "ToyWorldConfig", "UNK", "analyze_document", "build_tokenizer", "corpus_ppl", "make_corpus",
    "make_example", "make_split", "open_prompt", "open_prompts", "render_prompt",
    "render_sft_example", "response_log_prob", "response_words", "sample_document",
    "score_response", "special_ids", "split_rng", "summary_machine", "summary_reference",
]
