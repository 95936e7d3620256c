"""Text-generation, calibration and error-correction metrics.

Pure functions shared by the evaluation suite and the toy-world demo.
Conventions: a *word* is an element of ``text.split()`` (whitespace split,
case-sensitive); "empty" means ``not text.strip()``.  Rates are fractions in
[0, 1] unless the name or docstring says percentage.  Undefined ratios (0/0)
are returned as ``None``, never NaN.  ``rouge_score`` is imported lazily, so
importing this module needs only numpy.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "words", "length_words", "repetition_rate", "distinct_n", "distinct_n_text",
    "aggregate_generation_metrics", "FailureTags", "failure_tags", "failure_rates",
    "rouge_scores", "mean_rouge", "expected_calibration_error", "FixCleanResult",
    "fix_clean", "macro_average", "macro_fix_clean", "corrupt_random_tokens",
    "MODES", "rep_rate", "mean_length", "generation_metrics", "summary_failure_tags", "generation_failure_tags",
    "rouge_aggregate",
]

MODES: tuple[str, ...] = ("default", "authors")
"""Scoring modes: ``default`` (correct) and ``authors`` (the authors' code, flaws included)."""


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
_ROUGE_SCORER: Any = None  # lazy cache: the only module-level state


def _to_1d(x: Any, dtype: Any, name: str) -> np.ndarray:
    """Convert a list / numpy array / torch tensor (any device, dtype) to a 1-D numpy array."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch
        x = x.detach().cpu().tolist()
    arr = np.asarray(x, dtype=dtype)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


# --------------------------------------------------------------------------- text statistics

def words(text: str) -> list[str]:
    """Whitespace words of ``text``: ``text.split()``."""
    return text.split()


def length_words(text: str) -> int:
    """Len = number of whitespace words, ``len(text.split())`` (0 for an empty text)."""
    return len(text.split())


def repetition_rate(text: str) -> float:
    """Rep = #{i : w_i == w_{i+1}} / (L - 1) over the L whitespace words; 0.0 when L < 2.

    Example: ``"a a b b b"`` has pairs (a,a) (a,b) (b,b) (b,b) -> 3/4.
    """
    w = text.split()
    if len(w) < 2:
        return 0.0
    return sum(a == b for a, b in zip(w, w[1:])) / (len(w) - 1)


def _ngrams(w: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]


def _check_texts(texts: Any, name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of strings, not a single str: {texts[:40]!r}")
    return list(texts)


def distinct_n(texts: Iterable[str], n: int = 2) -> float:
    """Corpus-level Distinct-n = |unique n-grams over all texts| / |n-grams over all texts|.

    n-grams are word n-grams taken within each text (never across texts).
    Returns 0.0 when there are no n-grams at all.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [g for t in _check_texts(texts) for g in _ngrams(t.split(), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def distinct_n_text(text: str, n: int = 2) -> float:
    """Per-text Distinct-n = |unique n-grams of text| / |n-grams of text|; 0.0 without n-grams."""
    return distinct_n([text], n)


def rep_rate(texts: Iterable[str]) -> float:
    """Corpus-level Rep (official-impl §5.4): over all texts pooled, #{adjacent identical whitespace-word pairs}
    / #{adjacent pairs}; pairs are taken within each text, never across texts. 0.0 when there are no pairs.

    Example: ``["a a b", "c c"]`` has pairs (a,a) (a,b) | (c,c) -> 2/3.
    """
    same = pairs = 0
    for t in _check_texts(texts):
        w = t.split()
        pairs += max(0, len(w) - 1)
        same += sum(a == b for a, b in zip(w, w[1:]))
    return same / pairs if pairs else 0.0


def mean_length(texts: Iterable[str], *, exclude_empty: bool = False) -> float | None:
    """Len: mean whitespace-word count; ``exclude_empty`` drops blank texts first (the authors). ``None`` if no text."""
    t = [x for x in _check_texts(texts) if not (exclude_empty and not x.strip())]
    return sum(len(x.split()) for x in t) / len(t) if t else None


def generation_metrics(texts: Sequence[str], *, mode: str = "default") -> dict[str, float | int | None]:
    """D2, D3 (corpus-level distinct-n), Rep (:func:`rep_rate`) and Len over a set of generations.

    ``default`` scores every text (an empty output counts Len 0 and contributes no n-grams or pairs);
    ``authors`` first drops empty outputs (official-impl §7.17: this flatters samplers that often emit nothing).
    Returns ``{"n", "n_empty", "n_scored", "d2", "d3", "rep", "len"}`` (fractions, not percentages; ``None``
    when nothing is scored).
    """
    _check_mode(mode)
    texts = _check_texts(texts)
    n_empty = sum(not t.strip() for t in texts)
    kept = [t for t in texts if t.strip()] if mode == "authors" else texts
    out: dict[str, float | int | None] = {"n": len(texts), "n_empty": n_empty, "n_scored": len(kept)}
    if not kept:
        return {**out, "d2": None, "d3": None, "rep": None, "len": None}
    return {**out, "d2": distinct_n(kept, 2), "d3": distinct_n(kept, 3), "rep": rep_rate(kept),
            "len": mean_length(kept)}


def aggregate_generation_metrics(
    texts: Sequence[str],
    nll_per_token: Sequence[Any] | None = None,
    *,
    exclude_empty: bool = False,
    per_text_mean: bool = False,
    n: int = 2,
) -> dict[str, float | int | None]:
    """Aggregate Rep, Distinct-n, Len and GenPPL over a set of generations.

    Returns ``{"n", "n_empty", "n_scored", "rep", "distinct_2", "len", "gen_ppl",
    "nll_tokens"}`` (the distinct key follows ``n``):

    * ``rep`` = mean over scored texts of :func:`repetition_rate`;
    * ``distinct_<n>`` = corpus-level :func:`distinct_n` over scored texts;
    * ``len`` = mean over scored texts of :func:`length_words`.

    Empty outputs: by default (``exclude_empty=False``) they are *included* --
    Len counts 0, Rep counts 0.0 -- so a sampler that often emits nothing is not
    flattered.  ``exclude_empty=True`` drops them from every metric, reproducing
    the authors' evaluation.  ``n_empty`` is always reported; ``n_scored`` is the
    number of texts averaged over.  Metrics over zero scored texts are ``None``.

    GenPPL (``nll_per_token`` given: one 1-D sequence of natural-log per-token
    NLLs per text, aligned with ``texts``):

    * default, token-weighted: ``exp(sum of all NLLs / total token count)``;
    * ``per_text_mean=True`` (authors): ``exp(mean over texts of mean NLL of text)``,
      skipping texts with zero scored tokens (their mean is undefined).

    ``gen_ppl`` is ``None`` when no NLLs are given or no token is scored.
    """
    texts = _check_texts(texts)
    if not texts:
        raise ValueError("texts is empty: nothing to aggregate")
    if nll_per_token is not None and len(nll_per_token) != len(texts):
        raise ValueError(f"nll_per_token has {len(nll_per_token)} entries but texts has {len(texts)}")
    is_empty = [not t.strip() for t in texts]
    keep = [i for i, e in enumerate(is_empty) if not (exclude_empty and e)]
    kept = [texts[i] for i in keep]
    out: dict[str, float | int | None] = {
        "n": len(texts), "n_empty": sum(is_empty), "n_scored": len(kept),
        "rep": float(np.mean([repetition_rate(t) for t in kept])) if kept else None,
        f"distinct_{n}": distinct_n(kept, n) if kept else None,
        "len": float(np.mean([length_words(t) for t in kept])) if kept else None,
        "gen_ppl": None, "nll_tokens": 0,
    }
    if nll_per_token is not None:
        nlls = [_to_1d(nll_per_token[i], np.float64, f"nll_per_token[{i}]") for i in keep]
        total_tokens = sum(a.size for a in nlls)
        out["nll_tokens"] = total_tokens
        if per_text_mean:
            means = [float(a.mean()) for a in nlls if a.size]
            out["gen_ppl"] = math.exp(sum(means) / len(means)) if means else None
        elif total_tokens:
            out["gen_ppl"] = math.exp(float(sum(a.sum() for a in nlls)) / total_tokens)
    return out


# --------------------------------------------------------------------------- failure tags

@dataclass(frozen=True)
class FailureTags:
    """Per-sample failure flags (``empty`` is exclusive: when set, all others are False)."""

    empty: bool = False
    premature_eos: bool = False
    repetition: bool = False
    degen_ending: bool = False

    def as_dict(self) -> dict[str, bool]:
        """The flags as ``{tag: bool}``."""
        return asdict(self)


FAILURE_TAG_NAMES: tuple[str, ...] = ("empty", "premature_eos", "repetition", "degen_ending")


def failure_tags(
    generated: str, reference: str | None = None, *, paper_thresholds: bool = False
) -> FailureTags:
    """Tag one generation with failure modes (W = #generated words, R = max(1, #reference words)).

    * ``empty``: ``not generated.strip()``; exclusive, no other tag is then set.
    * ``premature_eos``: code rule ``W < 15 or W < 0.4*R``; ``paper_thresholds``
      keeps only ``W < 0.4*R``.  Without a reference only the ``W < 15`` rule
      applies (so with ``paper_thresholds`` and no reference it never fires).
      ``W < 0.4*R`` is evaluated exactly as ``5*W < 2*R``.
    * ``repetition``: ``W >= 8`` and ``c_max / m > 0.15`` where m = number of word
      4-grams and c_max the count of the most frequent one (``>= 0.15`` with
      ``paper_thresholds``).  Note: with 8 or 9 words (m <= 6) any text fires.
    * ``degen_ending``: in the last 40 characters of ``generated.rstrip()``,
      count('.') > 8 or count(',') > 8 (counted separately; ``>= 8`` with
      ``paper_thresholds``), or ``"......."`` (7 consecutive dots) occurs anywhere
      in the text (kept in both modes).
    """
    if not generated.strip():
        return FailureTags(empty=True)
    w = generated.split()
    n_w = len(w)
    ref_w = max(1, len(reference.split())) if reference is not None else None
    short_rel = ref_w is not None and 5 * n_w < 2 * ref_w
    premature = short_rel if paper_thresholds else (n_w < 15 or short_rel)

    repetition = False
    if n_w >= 8:
        grams = _ngrams(w, 4)
        c_max = Counter(grams).most_common(1)[0][1]
        # c_max / m  >(=)  15 / 100, in exact integer arithmetic
        repetition = 100 * c_max >= 15 * len(grams) if paper_thresholds else 100 * c_max > 15 * len(grams)

    tail = generated.rstrip()[-40:]
    limit = 8 if paper_thresholds else 9  # ">= 8" vs "> 8"
    degen = tail.count(".") >= limit or tail.count(",") >= limit or "......." in generated
    return FailureTags(premature_eos=premature, repetition=repetition, degen_ending=degen)


def summary_failure_tags(text: str, mode: str = "default", *, reference: str | None = None) -> FailureTags:
    """Summary failure tags (official-impl §5.6) in one of two modes; pass the reference summary as
    ``reference=`` (without it ``premature_eos`` can only fire by the authors' ``W < 15`` rule).

    ``authors``: :func:`failure_tags` with the code's thresholds, exactly (``W < 15 or W < 0.4R``; 4-gram share
    strictly above 0.15 from 8 words on, which fires on *every* 8- or 9-word summary since one 4-gram out of
    5 or 6 is already > 0.15; more than 8 dots/commas in the last 40 characters).
    ``default``: the paper's thresholds (``W < 0.4R``; share >= 0.15; >= 8 dots/commas) and ``repetition``
    additionally needs the most frequent 4-gram to occur at least twice, so a short summary with no repeated
    4-gram is never tagged.
    """
    _check_mode(mode)
    if mode == "authors":
        # their tail is the last 40 characters of text.strip() (ours: of text.rstrip(); the counts agree, since
        # leading whitespace holds no '.' or ',')
        return failure_tags(text.strip(), reference, paper_thresholds=False)
    tags = failure_tags(text, reference, paper_thresholds=True)
    if tags.repetition:
        c_max = Counter(_ngrams(text.split(), 4)).most_common(1)[0][1]
        if c_max < 2:
            tags = FailureTags(premature_eos=tags.premature_eos, repetition=False, degen_ending=tags.degen_ending)
    return tags


def failure_rates(tags: Iterable[FailureTags | Mapping[str, bool]]) -> dict[str, float]:
    """Percentage of samples carrying each tag: ``100 * #{samples with tag} / #samples``."""
    rows = [t.as_dict() if isinstance(t, FailureTags) else dict(t) for t in tags]
    if not rows:
        raise ValueError("failure_rates needs at least one sample, got none")
    present = {k for r in rows for k in r}
    names = [k for k in FAILURE_TAG_NAMES if k in present] + sorted(present - set(FAILURE_TAG_NAMES))
    return {k: 100.0 * sum(bool(r.get(k, False)) for r in rows) / len(rows) for k in names}


# --------------------------------------------------------------------------- ROUGE

def _rouge_scorer() -> Any:
    global _ROUGE_SCORER
    if _ROUGE_SCORER is None:
        from rouge_score import rouge_scorer

        _ROUGE_SCORER = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    return _ROUGE_SCORER


def _rouge_pair(reference: str, generated: str, mode: str = "default") -> dict[str, float]:
    if not generated.strip():
        return {k: 0.0 for k in ROUGE_TYPES}
    s = _rouge_scorer().score(reference, generated)
    if mode == "authors":  # their per-sample records: F1 x 100 rounded to 2 decimals with Python's round
        return {k: round(float(s[k].fmeasure) * 100, 2) for k in ROUGE_TYPES}
    return {k: 100.0 * float(s[k].fmeasure) for k in ROUGE_TYPES}


def rouge_scores(a: Any, b: Any, *, mode: str = "default") -> Any:
    """ROUGE-1/2/L F1 x 100 (Google ``rouge_score``, Porter stemming, ``rougeL`` = sentence-level LCS, not
    ``rougeLsum``; called as ``score(target=reference, prediction=generated)``; an empty (blank) generation
    scores 0 on all three; the scorer's tokenizer keeps only lower-case [a-z0-9] tokens).

    Two call forms:

    * ``rouge_scores(preds, refs)`` with two equal-length sequences of strings -> one dict per pair
      (``preds`` = generations, ``refs`` = references);
    * ``rouge_scores(reference, generated)`` with two strings -> one dict (the original single-pair form;
      note the reversed order: reference first).

    ``mode="authors"``: each score is ``round(F1 * 100, 2)`` (the authors' per-sample records).
    """
    _check_mode(mode)
    if isinstance(a, str) and isinstance(b, str):
        return _rouge_pair(a, b, mode)
    if isinstance(a, str) or isinstance(b, str):
        raise TypeError("rouge_scores takes two strings (reference, generated) or two sequences (preds, refs)")
    preds, refs = list(a), list(b)
    if len(preds) != len(refs):
        raise ValueError(f"preds has {len(preds)} texts but refs has {len(refs)}")
    return [_rouge_pair(r, p, mode) for p, r in zip(preds, refs)]


def rouge_aggregate(rows: Iterable[Mapping[str, float]], mode: str = "default") -> dict[str, float]:
    """Mean of per-sample ROUGE rows (``{"rouge1", "rouge2", "rougeL"}`` x 100).

    ``default``: mean of the unrounded scores (the authors' run script). ``authors``: mean of the per-sample
    scores rounded to 2 decimals with Python's ``round`` (their merge script, which recomputes the means from
    the rounded per-sample records it merges — what produced the sharded paper numbers).
    """
    _check_mode(mode)
    rows = list(rows)
    if not rows:
        raise ValueError("rouge_aggregate needs at least one row, got none")
    f = (lambda x: round(float(x), 2)) if mode == "authors" else float
    return {k: sum(f(r[k]) for r in rows) / len(rows) for k in ROUGE_TYPES}


def mean_rouge(pairs: Iterable[tuple[str, str]]) -> dict[str, float]:
    """Mean over samples of :func:`rouge_scores`; ``pairs`` are ``(reference, generated)``."""
    rows = [_rouge_pair(ref, gen) for ref, gen in pairs]
    if not rows:
        raise ValueError("mean_rouge needs at least one (reference, generated) pair, got none")
    return {k: float(np.mean([r[k] for r in rows])) for k in ROUGE_TYPES}


# --------------------------------------------------------------------------- calibration

def expected_calibration_error(confidences: Any, correct: Any, n_bins: int = 15, *, mode: str = "default") -> float:
    """ECE = sum_b (n_b / N) * |acc_b - conf_b| over ``n_bins`` equal-width bins.

    Bin b covers [b/B, (b+1)/B) and the last bin is [1 - 1/B, 1]; acc_b is the
    fraction correct and conf_b the mean confidence in bin b; empty bins add 0.
    ``confidences`` in [0, 1] and ``correct`` (bool or 0/1) may be lists, numpy
    arrays or torch tensors of equal length N >= 1.

    ``mode="default"`` rejects a confidence outside [0, 1] (or NaN) and an
    empty set with a ValueError; ``mode="authors"`` reproduces their code: such
    a confidence falls in no bin but still counts in N (so it silently lowers
    the ECE), and an empty set gives 0.0 (every bin is empty).
    """
    _check_mode(mode)
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins}")
    conf = _to_1d(confidences, np.float64, "confidences")
    corr = _to_1d(correct, np.float64, "correct")
    if conf.size != corr.size:
        raise ValueError(f"confidences has {conf.size} values but correct has {corr.size}")
    if conf.size == 0 and mode == "authors":
        return 0.0  # their bin loop over an empty set adds nothing
    if conf.size == 0:
        raise ValueError("expected_calibration_error needs at least one sample, got none")
    if mode == "default" and not np.all((conf >= 0.0) & (conf <= 1.0)):  # also rejects NaN
        bad = conf[~((conf >= 0.0) & (conf <= 1.0))][0]
        raise ValueError(f"confidences must lie in [0, 1], got {bad}")
    if not np.all((corr == 0.0) | (corr == 1.0)):
        bad = corr[~((corr == 0.0) | (corr == 1.0))][0]
        raise ValueError(f"correct must be boolean / 0-1, got {bad}")
    edges = np.linspace(0.0, 1.0, int(n_bins) + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, int(n_bins) - 1)
    idx = np.where((conf >= 0.0) & (conf <= 1.0), idx, -1)  # out of range (authors mode): in N, in no bin
    ece = 0.0
    for b in range(int(n_bins)):
        sel = idx == b
        if sel.any():
            ece += sel.sum() / conf.size * abs(corr[sel].mean() - conf[sel].mean())
    return float(ece)


# --------------------------------------------------------------------------- error correction

@dataclass(frozen=True)
class FixCleanResult:
    """Fix / Clean of one text, with their denominators (``None`` means 0/0)."""

    fix: float | None
    clean: float | None
    n_corrupted: int
    n_uncorrupted: int


def fix_clean(original_ids: Any, corrupted_ids: Any, predicted_ids: Any, *, mode: str = "default") -> FixCleanResult:
    """Error-correction scores of one text (C = positions where corrupted != original).

    Fix = #{i in C : predicted_i == original_i} / |C|;
    Clean = #{i not in C : predicted_i == corrupted_i} / (n - |C|).
    ``default``: a ratio with a zero denominator is ``None`` (skipped by :func:`macro_average`).
    ``authors``: a text with no corrupted position scores Fix = 0.0 (Clean is computed as usual, over every
    position); a text with every position corrupted scores Clean = 1.0. Both then count in the macro average.
    """
    _check_mode(mode)
    o = _to_1d(original_ids, np.int64, "original_ids")
    c = _to_1d(corrupted_ids, np.int64, "corrupted_ids")
    p = _to_1d(predicted_ids, np.int64, "predicted_ids")
    if not (o.size == c.size == p.size):
        raise ValueError(
            f"length mismatch: original {o.size}, corrupted {c.size}, predicted {p.size}"
        )
    mask = c != o
    n_c, n_u = int(mask.sum()), int((~mask).sum())
    authors = mode == "authors"
    fix = float((p[mask] == o[mask]).sum()) / n_c if n_c else (0.0 if authors else None)
    clean = float((p[~mask] == c[~mask]).sum()) / n_u if n_u else (1.0 if authors else None)
    return FixCleanResult(fix=fix, clean=clean, n_corrupted=n_c, n_uncorrupted=n_u)


def macro_average(values: Iterable[float | None]) -> float | None:
    """Mean of the non-``None`` values (per-text scores -> macro average); ``None`` if none."""
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def macro_fix_clean(results: Iterable[FixCleanResult]) -> dict[str, float | None]:
    """Macro-averaged Fix and Clean over texts (texts with an undefined ratio are skipped)."""
    rs = list(results)
    return {"fix": macro_average(r.fix for r in rs), "clean": macro_average(r.clean for r in rs)}


def corrupt_random_tokens(
    ids: Any, rate: float, rng: np.random.Generator, low: int, high: int, *, exclude: Iterable[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Replace ``max(1, floor(n * rate))`` random positions by different random ids.

    Positions are drawn without replacement by ``rng.choice`` and returned
    sorted; for each (in ascending order) a replacement is drawn uniformly from
    [low, high) with ``rng.integers`` and re-drawn until it differs from the
    original id.  ``floor`` is taken of ``n * rate + 1e-9`` so that e.g.
    100 * 0.29 gives 29, not 28 (float round-off).  Returns
    ``(corrupted int64 array, positions int64 array)``; ``ids`` is not modified.
    Ids in ``exclude`` (e.g. special tokens) are re-drawn too; without excluded
    ids in range the draws are exactly those of the plain rule.
    """
    arr = _to_1d(ids, np.int64, "ids").copy()
    n = arr.size
    if n == 0:
        raise ValueError("ids is empty: nothing to corrupt")
    try:
        rate_f = float(rate)
    except (TypeError, ValueError):
        raise ValueError(f"rate must be a number in (0, 1], got {rate!r}") from None
    if not 0.0 < rate_f <= 1.0:  # also rejects NaN
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    if not high > low:
        raise ValueError(f"need low < high for the replacement range, got low={low}, high={high}")
    n_c = max(1, math.floor(n * rate_f + 1e-9))
    bad = {int(x) for x in exclude}
    positions = np.sort(rng.choice(n, size=n_c, replace=False)).astype(np.int64)
    for pos in positions:
        orig = int(arr[pos])
        if not any(v != orig and v not in bad for v in range(low, min(high, low + len(bad) + 2))):
            raise ValueError(f"range [{low}, {high}) has no id different from {orig} at position {pos}")
        new = orig
        while new == orig or new in bad:
            new = int(rng.integers(low, high))
        arr[pos] = new
    return arr, positions


from .genfailures import generation_failure_tags  # noqa: E402  (re-export; genfailures imports nothing from here)
