"""Tasks on the toy world, LLaDA-style chat rendering and exact response scoring.

Two tasks mirror the paper:

* ``"open"`` — open-ended generation.  Prompt: an instruction naming a topic
  (``write about the ocean .``); response: a sample of that topic's automaton.
* ``"summarize"`` — anchored summarisation.  Prompt: ``summarize : <document>``
  where the document is a world sample with ≥ ``min_doc_sentences`` sentences.
  The response distribution is a small automaton built from the document's key
  words (:func:`summary_machine`); its single most likely string is the
  deterministic ``reference`` (``the <main noun> <first verb> [the <object>] .``).

Both response distributions are PFSAs, so :func:`score_response` is exact.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import words as W
from .pfsa import FINAL, Pfsa, PfsaBuilder
from .world import ToyWorld

TASKS = ("open", "summarize")
_SPLIT_CODES = {"train": 0, "valid": 1, "test": 2}
_TASK_CODES = {"open": 11, "summarize": 12, "mixed": 13}

#: Jinja chat template equivalent to :func:`render_prompt` (word-level, space separated).
CHAT_TEMPLATE = (
    "{{ '" + W.BOS + "' }}{% for m in messages %} " + W.START_HEADER + " {{ m['role'] }} "
    + W.END_HEADER + " {{ m['content'] }} " + W.EOT + "{% endfor %}"
    "{% if add_generation_prompt %} " + W.START_HEADER + " assistant " + W.END_HEADER + "{% endif %}"
)


@dataclass
class TaskExample:
    """One prompt/response pair plus what is needed to score other responses."""

    task: str  #: "open" or "summarize"
    prompt: str  #: raw prompt text (no chat markup)
    response: str  #: a sample of the task's response distribution (training target)
    topic: str
    reference: str | None = None  #: summarisation reference (mode of the summary distribution)
    document: str | None = None  #: summarisation document

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskExample":
        return cls(**d)


@dataclass
class DocAnalysis:
    """Key words of a document: the main (first-subject) noun and its predicates."""

    topic: str
    main: str  #: main noun form as written in the first sentence
    main_num: str  #: "sg" or "pl" (read off the first verb's agreement)
    predicates: list[tuple[str, str | None]]  #: (verb form, object noun or None) with main as subject
    nouns: list[str]  #: every noun form in the document, first-occurrence order


# ---------------------------------------------------------------- chat format
def render_prompt(prompt_text: str) -> str:
    """LLaDA chat template, word-level: BOS, user turn, then the assistant header."""
    return (f"{W.BOS} {W.START_HEADER} user {W.END_HEADER} {prompt_text} {W.EOT} "
            f"{W.START_HEADER} assistant {W.END_HEADER}")


def render_sft_example(prompt: str, response: str, gen_length: int, tokenizer) -> tuple[list[int], int]:
    """``(input_ids, prompt_length)``: chat prompt + response + ``<|eot_id|>`` + EOS padding.

    The response part is exactly ``gen_length`` tokens long, as in LLaDA-Instruct SFT.
    """
    p_ids = tokenizer.encode(render_prompt(prompt), add_special_tokens=False)
    r_ids = tokenizer.encode(response, add_special_tokens=False) if response.strip() else []
    if len(r_ids) + 1 > gen_length:
        raise ValueError(f"response has {len(r_ids)} tokens; with <|eot_id|> it needs "
                         f"{len(r_ids) + 1} > gen_length={gen_length}")
    eot = tokenizer.convert_tokens_to_ids(W.EOT)
    eos = tokenizer.convert_tokens_to_ids(W.EOS)
    return p_ids + r_ids + [eot] + [eos] * (gen_length - len(r_ids) - 1), len(p_ids)


def response_words(generation: str | Sequence[str]) -> list[str]:
    """Words of a generated response: everything before the first ``<|eot_id|>`` / ``<|endoftext|>``."""
    toks = generation.split() if isinstance(generation, str) else list(generation)
    for i, t in enumerate(toks):
        if t in (W.EOT, W.EOS):
            return toks[:i]
    return toks


# ---------------------------------------------------------------- documents
def analyze_document(world: ToyWorld, document: str | Sequence[str]) -> DocAnalysis:
    """Parse a (well-formed) world document by lexicon look-up."""
    toks = document.split() if isinstance(document, str) else list(document)
    sentences: list[list[str]] = []
    cur: list[str] = []
    for t in toks:
        if t == ".":
            sentences.append(cur)
            cur = []
        else:
            cur.append(t)
    main = main_num = topic = ""  # set by the first sentence (the world's words are never empty)
    predicates: list[tuple[str, str | None]] = []
    nouns: list[str] = []
    for sent in sentences:
        subj = verb = obj = None
        for t in sent:
            if subj is None and (t in world.noun_info or t in W.PRONOUNS.values()):
                subj = t
            elif subj is not None and verb is None and t in world.verb_info:
                verb = t
            elif verb is not None and obj is None and t in world.noun_info:
                obj = t
            if t in world.noun_info and t not in nouns:
                nouns.append(t)
        if subj is None or verb is None:
            raise ValueError(f"cannot parse sentence {' '.join(sent)!r}")
        if not main:
            if subj not in world.noun_info:
                raise ValueError("the first sentence's subject must be a noun")
            main, (topic, _, _) = subj, world.noun_info[subj]
            main_num = world.verb_info[verb][3]
        refers = subj == W.PRONOUNS[main_num] or (subj == main and world.verb_info[verb][3] == main_num)
        if refers and (verb, obj) not in predicates:
            predicates.append((verb, obj))
    if not main:
        raise ValueError("empty document")
    return DocAnalysis(topic, main, main_num, predicates, nouns)


def summary_reference(analysis: DocAnalysis) -> str:
    verb, obj = analysis.predicates[0]
    return " ".join(["the", analysis.main, verb] + (["the", obj] if obj else []) + ["."])


def _build_summary(world: ToyWorld, a: DocAnalysis) -> Pfsa:
    c = world.config
    b = PfsaBuilder("S")
    b.add("S", "N", "the", c.summary_p_the)
    b.add("S", "N", "this" if a.main_num == "sg" else "these", 1.0 - c.summary_p_the)
    b.add("N", ("P", None), a.main, 1.0)
    n = len(a.predicates)
    # choosing predicate i from ("P", prev): prev None = first predicate, else the one after "and"
    b.add(("P", None), ("V", 0, 0), a.predicates[0][0], c.summary_p_first if n > 1 else 1.0)
    for i in range(1, n):
        b.add(("P", None), ("V", i, 0), a.predicates[i][0], (1.0 - c.summary_p_first) / (n - 1))
    for prev in range(n):
        for i in range(n):
            if i != prev:
                b.add(("P", prev), ("V", i, 1), a.predicates[i][0], 1.0 / (n - 1))
    for i, (_, obj) in enumerate(a.predicates):
        for depth in (0, 1):
            after = ("A", i, depth)
            if obj is None:
                b.add(("V", i, depth), after, None, 1.0)
            else:
                b.add(("V", i, depth), ("VN", i, depth), "the", 1.0)
                b.add(("VN", i, depth), after, obj, 1.0)
            if depth == 0 and n > 1:
                b.add(after, ("P", i), "and", c.summary_p_and)
                b.add(after, "E", ".", 1.0 - c.summary_p_and)
            else:
                b.add(after, "E", ".", 1.0)
    b.add("E", FINAL, W.EOT, 1.0)
    return b.compile(world.token_to_id, W.EOT, world.alphabet_size)


@functools.lru_cache(maxsize=4096)
def _summary_cached(world: ToyWorld, document: str) -> Pfsa:
    return _build_summary(world, analyze_document(world, document))


def summary_machine(world: ToyWorld, document: str) -> Pfsa:
    """The exact summary distribution (a PFSA) for a document (cached)."""
    return _summary_cached(world, " ".join(document.split()))


# ---------------------------------------------------------------- examples
def _as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def open_prompt(world: ToyWorld, topic: str | int, template: int = 0) -> str:
    return W.OPEN_TEMPLATES[template].format(topic=W.TOPIC_PHRASES[world.topic_index(topic)])


def open_prompts(world: ToyWorld) -> list[tuple[str, str]]:
    """Every (prompt, topic) of the open-ended task (templates × topics)."""
    return [(open_prompt(world, t, j), t) for t in world.topics for j in range(len(W.OPEN_TEMPLATES))]


def sample_document(world: ToyWorld, topic: str | int, rng: np.random.Generator) -> list[str]:
    """A world response with at least ``min_doc_sentences`` sentences (rejection sampling)."""
    while True:
        ws = world.sample_response(topic, rng)
        if ws.count(".") >= world.config.min_doc_sentences:
            return ws


def make_example(world: ToyWorld, task: str, rng: np.random.Generator | int | None) -> TaskExample:
    rng = _as_rng(rng)
    topic = world.topics[int(rng.integers(len(world.topics)))]
    if task == "open":
        prompt = open_prompt(world, topic, int(rng.integers(len(W.OPEN_TEMPLATES))))
        return TaskExample("open", prompt, " ".join(world.sample_response(topic, rng)), topic)
    if task == "summarize":
        doc = " ".join(sample_document(world, topic, rng))
        m = summary_machine(world, doc)
        response = " ".join(world.tokens[i] for i in m.sample(rng)[0])
        ref = summary_reference(analyze_document(world, doc))
        return TaskExample("summarize", f"{W.SUMMARY_PREFIX} {doc}", response, topic, ref, doc)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def make_corpus(world: ToyWorld, n: int, task: str, rng: np.random.Generator | int | None,
                exclude: Iterable[str] = ()) -> list[TaskExample]:
    """``n`` examples of ``task`` ("open", "summarize" or "mixed" = alternating).

    Summarisation examples whose prompt is in ``exclude`` are redrawn (use it to
    keep held-out documents disjoint from training ones); open-ended prompts are
    never redrawn since only ``len(open_prompts(world))`` of them exist.
    """
    rng = _as_rng(rng)
    exclude = set(exclude)
    out: list[TaskExample] = []
    while len(out) < n:
        t = TASKS[len(out) % 2] if task == "mixed" else task
        ex = make_example(world, t, rng)
        if ex.prompt not in exclude or t == "open":
            out.append(ex)
    return out


def split_rng(world: ToyWorld, split: str, task: str) -> np.random.Generator:
    """Independent, reproducible stream per (config.seed, split, task)."""
    if split not in _SPLIT_CODES or task not in _TASK_CODES:
        raise ValueError(f"split must be in {list(_SPLIT_CODES)} and task in {list(_TASK_CODES)}")
    return np.random.default_rng([world.config.seed, _SPLIT_CODES[split], _TASK_CODES[task]])


def make_split(world: ToyWorld, n: int, task: str, split: str = "train",
               exclude: Iterable[str] = ()) -> list[TaskExample]:
    """``make_corpus`` with the split's own seed stream (train / valid / test)."""
    return make_corpus(world, n, task, split_rng(world, split, task), exclude)


# ---------------------------------------------------------------- scoring
def response_log_prob(world: ToyWorld, words: Sequence[str], example: TaskExample,
                      epsilon: float | None = None) -> float:
    """Exact log-probability (with the end event) of a response under the task's distribution."""
    eps = world.config.epsilon if epsilon is None else epsilon
    if example.task == "open":
        return world.log_prob(list(words), example.topic, eps)
    if example.task == "summarize":
        if example.document is None:
            raise ValueError("summarisation example without a document")
        return summary_machine(world, example.document).log_prob(world.ids_for_scoring(list(words)), eps)
    raise ValueError(f"unknown task {example.task!r}")


def score_response(world: ToyWorld, text: str | Sequence[str], example: TaskExample,
                   epsilon: float | None = None) -> dict[str, float]:
    """Score a generated response exactly.

    ``text`` is cut at the first ``<|eot_id|>``/``<|endoftext|>``; the end event
    counts as one token.  Returns ``log_prob``, ``nll_sum``, ``n_tokens``,
    ``nll_per_token``, ``ppl`` (under the ε-smoothed model) and ``in_support``
    (1.0 if the pure world gives the response non-zero probability).
    """
    ws = response_words(text)
    lp = response_log_prob(world, ws, example, epsilon)
    n = len(ws) + 1
    in_support = math.isfinite(response_log_prob(world, ws, example, 0.0))
    return {"log_prob": lp, "nll_sum": -lp, "n_tokens": float(n), "nll_per_token": -lp / n,
            "ppl": math.exp(-lp / n), "in_support": float(in_support)}


def corpus_ppl(scores: Iterable[dict[str, float]]) -> float:
    """Token-weighted perplexity ``exp(Σ nll_sum / Σ n_tokens)`` of scored responses."""
    scores = list(scores)
    return math.exp(sum(s["nll_sum"] for s in scores) / sum(s["n_tokens"] for s in scores))
