"""Embedded toy world: a seeded synthetic language with an exactly computable likelihood.

Small enough for a tiny LLaDA-architecture masked diffusion LM to learn on a
CPU in minutes, and structured enough (agreement, a/an, topic consistency,
cross-sentence pronouns, variable length) that factorised parallel decoding
visibly fails.  See ``docs/toy-world.md``.
"""

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

__all__ = [
    "BOS", "CHAT_TEMPLATE", "DocAnalysis", "END_HEADER", "EOS", "EOT", "MASK", "Pfsa",
    "PfsaBuilder", "SPECIAL_TOKENS", "START_HEADER", "TASKS", "TaskExample", "ToyWorld",
    "ToyWorldConfig", "UNK", "analyze_document", "build_tokenizer", "corpus_ppl", "make_corpus",
    "make_example", "make_split", "open_prompt", "open_prompts", "render_prompt",
    "render_sft_example", "response_log_prob", "response_words", "sample_document",
    "score_response", "special_ids", "split_rng", "summary_machine", "summary_reference",
]
