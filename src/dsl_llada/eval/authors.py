"""Protocol steps of the authors' evaluation code that need their own random draws or helpers (``mode="authors"``).

Each function reproduces one step described in ``docs/provenance.md`` §5 (facts, not code, were carried over);
``docs/evaluation.md`` lists which section each comes from and where the facts leave a choice open, and
``docs/provenance.md`` §9 the steps that still differ from the authors' code.

* :func:`corrupt_random_tokens` — random-token corruption of §5.1 with ``numpy.random.RandomState(seed)``: one
  ``choice(n, n_c, replace=False)`` for the positions (``n_c = max(1, int(n * rate))``), then, position by
  position *in the order drawn*, scalar ``randint(low, high)`` re-drawn while it equals the original id.
* :func:`mask_positions` — the masked positions of §5.3: ``RandomState(seed).choice(n, max(1, int(n * rate)),
  replace=False)``.
* :func:`token_diff_positions` — the realistic-correction alignment of §5.1: ``difflib.SequenceMatcher(None,
  original, corrupted)`` (default arguments, so ``autojunk`` on) and the positions of every equal-length
  ``replace`` opcode; other opcodes add no position.
* :func:`realistic_fix_clean` — Fix / Clean of one realistic case scored at those positions.
* :func:`rouge1_delta` — the per-sample ROUGE-1 difference of §5.6 on the 2-dp rounded per-sample scores.

Pure functions over id lists; no model.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["corrupt_random_tokens", "mask_positions", "realistic_fix_clean", "rouge1_delta", "token_diff_positions"]

ID_RANGE = (100, 126000)
"""The authors' replacement-id range for LLaDA ids, [low, high)."""


def _count(n: int, rate: float) -> int:
    """``max(1, int(n * rate))`` — Python's truncation of the float product (e.g. 70 * 0.7 = 48.99… -> 48)."""
    return max(1, int(n * rate))


def corrupt_random_tokens(ids: Sequence[int], rate: float, seed: int, *, low: int = ID_RANGE[0],
                          high: int = ID_RANGE[1]) -> tuple[list[int], list[int]]:
    """(corrupted ids, positions in the order drawn) for one text; ``seed`` is the text's full seed (the authors
    use 42 + text id). ``ids`` is not modified."""
    ids = [int(x) for x in ids]
    n = len(ids)
    if n == 0:
        raise ValueError("ids is empty: nothing to corrupt")
    if not 0.0 < float(rate) <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    if not high - low >= 2:
        raise ValueError(f"need at least two ids in [low, high), got low={low}, high={high}")
    rng = np.random.RandomState(seed)
    positions = [int(p) for p in rng.choice(n, _count(n, float(rate)), replace=False)]
    out = list(ids)
    for p in positions:
        new = int(rng.randint(low, high))
        while new == ids[p]:
            new = int(rng.randint(low, high))
        out[p] = new
    return out, positions


def mask_positions(n: int, rate: float, seed: int) -> list[int]:
    """The masked positions of one text (in the order drawn): ``RandomState(seed).choice(n, max(1, int(n*rate)),
    replace=False)``; ``seed`` is the text's full seed (42 + text id)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 < float(rate) <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    return [int(p) for p in np.random.RandomState(seed).choice(n, _count(n, float(rate)), replace=False)]


def token_diff_positions(original: Sequence[int], corrupted: Sequence[int]) -> list[tuple[int, int]]:
    """``[(position in corrupted, original id)]`` for every token of an equal-length ``replace`` opcode of
    ``difflib.SequenceMatcher(None, original, corrupted).get_opcodes()``, in order. Inserted, deleted and
    unequal-length replaced tokens give no position."""
    o, c = list(original), list(corrupted)
    out: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, o, c).get_opcodes():
        if tag == "replace" and i2 - i1 == j2 - j1:
            out += [(j1 + k, int(o[i1 + k])) for k in range(i2 - i1)]
    return out


def realistic_fix_clean(original: Sequence[int], corrupted: Sequence[int], predicted: Sequence[int]
                        ) -> dict[str, Any]:
    """Fix / Clean of one realistic-correction case: the model read ``corrupted`` and predicted ``predicted``
    (same length). Fix = share of :func:`token_diff_positions` predicted as their original id; Clean = share of
    the other positions of ``corrupted`` predicted as their input id. A case with no position scores Fix 0.0 and
    Clean 1.0 (as :func:`dsl_llada.eval.metrics.fix_clean` in authors mode); Clean is ``None`` when every
    position is a corruption."""
    c, p = [int(x) for x in corrupted], [int(x) for x in predicted]
    if len(c) != len(p):
        raise ValueError(f"corrupted has {len(c)} ids but predicted has {len(p)}")
    diffs = token_diff_positions(original, c)
    if not diffs:
        return {"fix": 0.0, "clean": 1.0, "n_corrupted": 0, "n_uncorrupted": len(c), "positions": []}
    pos = {j for j, _ in diffs}
    fixed = sum(p[j] == o for j, o in diffs)
    rest = [j for j in range(len(c)) if j not in pos]
    clean = sum(p[j] == c[j] for j in rest) / len(rest) if rest else None
    return {"fix": fixed / len(diffs), "clean": clean, "n_corrupted": len(diffs), "n_uncorrupted": len(rest),
            "positions": [j for j, _ in diffs]}


def rouge1_delta(value: float, baseline: float, mode: str = "default") -> float:
    """The per-sample ROUGE-1 delta used for the §5.6 buckets: default on the unrounded scores; authors on the
    scores as their records hold them, ``round(x, 2)`` each, subtracted in floating point."""
    if mode == "authors":
        return round(float(value), 2) - round(float(baseline), 2)
    if mode != "default":
        raise ValueError(f"mode must be one of ('default', 'authors'), got {mode!r}")
    return float(value) - float(baseline)
