"""Failure tags for open-ended generations (the authors' ``failure_mode_analysis.py``, docs/provenance.md §5.4).

Words are ``\\b\\w+\\b`` tokens of the lower-cased text; sentences split after ``. ! ?`` followed by whitespace.
Per text we compute the authors' statistics and turn them into the binary tags their rate table reports:

=====================  ===================================================================================
tag                    fires when
=====================  ===================================================================================
``short``              fewer than 20 words
``incomplete``         the stripped text does not end with ``. ! ? " '`` (an empty text is incomplete)
``word_repeat``        the longest run of one repeated word is >= 3 ("the the the")
``ngram_repeat``       rep_4 = 1 - unique/total word 4-grams is > 0.3
``sentence_repeat``    some normalised sentence occurs >= 3 times
``degenerate_pattern`` commas, periods or newlines are each > 15 % of the characters, or a run of
                       non-alphanumeric characters is longer than 20; an empty text counts as degenerate
``low_diversity``      type-token ratio < 0.4
``severe``             composite severity score > 40 (0-100; weights 0.10 truncation, 0.15 word repeats,
                       0.20 4-gram repeats, 0.15 sentence repeats, 0.20 pattern, 0.20 (1 - TTR))
=====================  ===================================================================================

These are exactly the authors' definitions; there is no separate default mode.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["GENERATION_TAGS", "generation_failure_stats", "generation_failure_tags"]

GENERATION_TAGS = ("short", "incomplete", "word_repeat", "ngram_repeat", "sentence_repeat",
                   "degenerate_pattern", "low_diversity", "severe")


def _words(text: str) -> list[str]:
    return re.findall(r"\b\w+\b", text.lower())


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def generation_failure_stats(text: str) -> dict[str, float | int | bool]:
    """The per-text statistics behind :func:`generation_failure_tags` (word count, runs, rep_n, sentence
    repeats, punctuation ratios, TTR, severity)."""
    w = _words(text)
    n = len(w)
    stripped = text.strip()
    st: dict[str, float | int | bool] = {"word_count": n, "incomplete": (not re.search(r"[.!?\"']$", stripped))
                                         if stripped else True}
    # consecutive repeats
    max_run, run, rep_words = (1 if w else 0), 1, 0
    for i in range(1, n + 1):
        if i < n and w[i] == w[i - 1]:
            run += 1
            continue
        if run >= 2:
            rep_words += run
        max_run = max(max_run, run) if w else 0
        run = 1
    st["max_consec_repeat"] = max_run
    st["consec_repeat_ratio"] = rep_words / n if n else 0.0
    for k in (2, 3, 4, 5):
        grams = [tuple(w[i:i + k]) for i in range(n - k + 1)]
        st[f"rep_{k}"] = 1.0 - len(set(grams)) / len(grams) if grams else 0.0
    # sentences
    sents = [re.sub(r"\s+", " ", s.lower().strip()) for s in _sentences(text)]
    if len(sents) <= 1:
        st.update(exact_sent_repeat_ratio=0.0, near_sent_repeat_ratio=0.0, max_sent_repeat_count=1)
    else:
        counts = Counter(sents)
        sets = [set(_words(s)) for s in sents]
        near = 0
        for i in range(1, len(sets)):
            for j in range(i):
                if sets[i] and sets[j] and len(sets[i] & sets[j]) / len(sets[i] | sets[j]) > 0.8:
                    near += 1
                    break
        st.update(exact_sent_repeat_ratio=sum(c - 1 for c in counts.values()) / len(sents),
                  near_sent_repeat_ratio=near / len(sents), max_sent_repeat_count=counts.most_common(1)[0][1])
    # punctuation patterns
    if not stripped:
        comma = dot = newline = 0.0
        longest, degen = 0, True
    else:
        total = len(text)
        comma, dot, newline = text.count(",") / total, text.count(".") / total, text.count("\n") / total
        longest = max((len(r) for r in re.findall(r"[^a-zA-Z0-9]+", text)), default=0)
        degen = comma > 0.15 or dot > 0.15 or newline > 0.15 or longest > 20
    st.update(comma_ratio=comma, dot_ratio=dot, newline_ratio=newline, longest_punct_run=longest,
              degenerate_pattern=degen)
    st["ttr"] = len(set(w)) / n if n else 0.0
    trunc = 1.0 if n < 20 else (0.3 if st["incomplete"] else 0.0)
    pattern = 1.0 if degen else min(1.0, 5 * max(comma, dot, newline))
    score = (0.10 * trunc + 0.15 * min(1.0, 5 * float(st["consec_repeat_ratio"]))
             + 0.20 * min(1.0, 2 * float(st["rep_4"]))
             + 0.15 * min(1.0, float(st["exact_sent_repeat_ratio"]) + float(st["near_sent_repeat_ratio"]))
             + 0.20 * pattern + 0.20 * (1.0 - float(st["ttr"])))
    st["severity"] = round(100 * score, 2)
    return st


def generation_failure_tags(text: str) -> dict[str, bool]:
    """Binary failure tags of one generation (see the module docstring); feed a list of them to
    :func:`dsl_llada.eval.metrics.failure_rates` for percentages."""
    st = generation_failure_stats(text)
    return {"short": st["word_count"] < 20, "incomplete": bool(st["incomplete"]),
            "word_repeat": st["max_consec_repeat"] >= 3, "ngram_repeat": st["rep_4"] > 0.3,
            "sentence_repeat": st["max_sent_repeat_count"] >= 3,
            "degenerate_pattern": bool(st["degenerate_pattern"]), "low_diversity": st["ttr"] < 0.4,
            "severe": st["severity"] > 40}
