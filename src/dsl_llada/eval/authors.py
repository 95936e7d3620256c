"""Protocol steps of the authors' evaluation code that need their own random draws or helpers (``mode="authors"``).

Each function reproduces one step described in ``official-impl.md`` §5 (facts, not code, were carried over);
``docs/evaluation.md`` lists which reference section each comes from and where the reference is ambiguous.

* :func:`corrupt_random_tokens` — random-token corruption of §5.1 with ``numpy.random.RandomState(seed)``: one
  ``choice(n, n_c, replace=False)`` for the positions (``n_c = max(1, int(n * rate))``), sorted ascending, then,
  position by position *in ascending order*, scalar ``randint(low, high)`` re-drawn while it equals the original
  id; the positions returned are the sorted list.
* :func:`mask_positions` — the masked positions of §5.3: ``RandomState(seed).choice(n, max(1, int(n * rate)),
  replace=False)``.
* :func:`realistic_alignment` — the realistic-correction alignment of §5.1: ``difflib.SequenceMatcher(None,
  original, corrupted, autojunk=False)``; corrupt pairs = every token of an equal-length ``replace`` opcode,
  clean pairs = every token of an ``equal`` opcode, and the number of other (skipped) opcodes. Tokens of
  inserts, deletes and unequal-length replaces are in neither set.
* :func:`token_diff_positions` — the corrupt pairs of that alignment as ``(position in corrupted, original id)``.
* :func:`realistic_fix_clean` — Fix / Clean of one realistic case: Fix over the corrupt pairs, Clean over the
  clean pairs, with the per-text rules of :func:`dsl_llada.eval.metrics.fix_clean` in authors mode (no corrupt
  pair: Fix 0.0; no clean pair: Clean 1.0).
* :func:`rouge1_delta` — the per-sample ROUGE-1 difference of §5.6 on the 2-dp rounded per-sample scores.

Pure functions over id lists; no model.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Alignment", "corrupt_random_tokens", "mask_positions", "realistic_alignment", "realistic_fix_clean",
           "rouge1_delta", "token_diff_positions"]

ID_RANGE = (100, 126000)
"""The authors' replacement-id range for LLaDA ids, [low, high)."""


def _count(n: int, rate: float) -> int:
    """``max(1, int(n * rate))`` — Python's truncation of the float product (e.g. 70 * 0.7 = 48.99… -> 48)."""
    return max(1, int(n * rate))


def corrupt_random_tokens(ids: Sequence[int], rate: float, seed: int, *, low: int = ID_RANGE[0],
                          high: int = ID_RANGE[1]) -> tuple[list[int], list[int]]:
    """(corrupted ids, positions sorted ascending) for one text; ``seed`` is the text's full seed (the authors
    use 42 + text id). The replacement ids are drawn in ascending position order. ``ids`` is not modified."""
    ids = [int(x) for x in ids]
    n = len(ids)
    if n == 0:
        raise ValueError("ids is empty: nothing to corrupt")
    if not 0.0 < float(rate) <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    if not high - low >= 2:
        raise ValueError(f"need at least two ids in [low, high), got low={low}, high={high}")
    rng = np.random.RandomState(seed)
    positions = sorted(int(p) for p in rng.choice(n, _count(n, float(rate)), replace=False))
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


@dataclass(frozen=True)
class Alignment:
    """The realistic-correction alignment of one (original, corrupted) pair of id lists."""

    corrupt: list[tuple[int, int]]
    """``(position in original, position in corrupted)`` for every token of an equal-length ``replace`` op."""
    clean: list[tuple[int, int]]
    """``(position in original, position in corrupted)`` for every token of an ``equal`` op."""
    skipped_ops: int
    """How many opcodes are neither (insert, delete, unequal-length replace)."""


def realistic_alignment(original: Sequence[int], corrupted: Sequence[int]) -> Alignment:
    """The opcodes of ``difflib.SequenceMatcher(None, original, corrupted, autojunk=False)`` split into corrupt
    pairs, clean pairs and skipped ops (see :class:`Alignment`)."""
    o, c = [int(x) for x in original], [int(x) for x in corrupted]
    corrupt: list[tuple[int, int]] = []
    clean: list[tuple[int, int]] = []
    skipped = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, o, c, autojunk=False).get_opcodes():
        if tag == "equal":
            clean += [(i1 + k, j1 + k) for k in range(i2 - i1)]
        elif tag == "replace" and i2 - i1 == j2 - j1:
            corrupt += [(i1 + k, j1 + k) for k in range(i2 - i1)]
        else:
            skipped += 1
    return Alignment(corrupt, clean, skipped)


def token_diff_positions(original: Sequence[int], corrupted: Sequence[int]) -> list[tuple[int, int]]:
    """``[(position in corrupted, original id)]`` for every corrupt pair of :func:`realistic_alignment`, in
    order. Inserted, deleted and unequal-length replaced tokens give no position."""
    o = [int(x) for x in original]
    return [(j, o[i]) for i, j in realistic_alignment(original, corrupted).corrupt]


def realistic_fix_clean(original: Sequence[int], corrupted: Sequence[int], predicted: Sequence[int]
                        ) -> dict[str, Any]:
    """Fix / Clean of one realistic-correction case: the model read ``corrupted`` and predicted ``predicted``
    (same length). Fix = share of the corrupt pairs of :func:`realistic_alignment` predicted as their original
    id (0.0 when there is none); Clean = share of the clean pairs predicted as their (unchanged) input id (1.0
    when there is none). Tokens of other opcodes count toward neither."""
    o, c, p = [int(x) for x in original], [int(x) for x in corrupted], [int(x) for x in predicted]
    if len(c) != len(p):
        raise ValueError(f"corrupted has {len(c)} ids but predicted has {len(p)}")
    al = realistic_alignment(o, c)
    fixed = sum(p[j] == o[i] for i, j in al.corrupt)
    kept = sum(p[j] == c[j] for _, j in al.clean)
    return {"fix": fixed / len(al.corrupt) if al.corrupt else 0.0,
            "clean": kept / len(al.clean) if al.clean else 1.0,
            "n_corrupted": len(al.corrupt), "n_uncorrupted": len(al.clean), "skipped_ops": al.skipped_ops,
            "positions": [j for _, j in al.corrupt]}


def rouge1_delta(value: float, baseline: float, mode: str = "default") -> float:
    """The per-sample ROUGE-1 delta used for the §5.6 buckets: default on the unrounded scores; authors on the
    scores as their records hold them, ``round(x, 2)`` each, subtracted in floating point."""
    if mode == "authors":
        return round(float(value), 2) - round(float(baseline), 2)
    if mode != "default":
        raise ValueError(f"mode must be one of ('default', 'authors'), got {mode!r}")
    return float(value) - float(baseline)
