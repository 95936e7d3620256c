"""Uncertainty of a reported number: percentile bootstrap intervals over items, with a fixed seed.

Every metric the reports give is a ratio of per-item sums (a mean is sum(value) / sum(1); perplexity is
exp(sum(nll) / sum(tokens))), so one routine covers them: resample the items with replacement, recompute the
ratio, take the 2.5 and 97.5 percentiles. Items are clusters when a prompt was sampled with several seeds: its
samples stay together (the prompts, not the samples, are what another run would draw anew). The resampling seed
is fixed, so a report's intervals are a function of its records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["ALPHA", "BOOTSTRAP_SEED", "PERMUTATIONS", "RESAMPLES", "bootstrap_ratio", "format_interval",
           "holm_adjust", "paired_permutation_test", "seed_spread", "separated", "verdict_from_test"]

BOOTSTRAP_SEED = 20_260_518
"""Seed of the resampling (fixed: the same records always give the same interval)."""
RESAMPLES = 1000
MAX_RESAMPLES = 100_000


def bootstrap_ratio(num: Sequence[float], den: Sequence[float] | None = None, *, transform: Callable[[float], float] | None = None,
                    level: float = 0.95, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """95 % (by default) percentile interval of transform(sum(num) / sum(den)) over item resamples.

    `num[i]`, `den[i]` are item i's sums (den defaults to 1 per item: a mean). `transform` maps the ratio
    (np.exp for perplexity from NLL). One item gives a zero-width interval at its value; no items raises."""
    x = np.asarray(num, dtype=np.float64)
    d = np.ones_like(x) if den is None else np.asarray(den, dtype=np.float64)
    if x.ndim != 1 or x.shape != d.shape or x.size == 0:
        raise ValueError(f"bootstrap needs two equally long, non-empty 1-D sequences (got {x.shape} and {d.shape})")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ValueError(f"resamples must be an integer from 1 to {MAX_RESAMPLES}, got {resamples!r}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = x[idx].sum(axis=1) / d[idx].sum(axis=1)
    if transform is not None:
        stats = transform(stats)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.nanpercentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


PERMUTATIONS = 10_000
ALPHA = 0.05


def paired_permutation_test(a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]], *,
                            permutations: int = PERMUTATIONS, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """(observed difference, two-sided p) of sum(a_num) / sum(a_den) - sum(b_num) / sum(b_den) when item i of `a`
    and item i of `b` are two methods on the same prompt.

    Under the null hypothesis that the two methods are exchangeable on every prompt, swapping the labels within any
    pair leaves the distribution unchanged; the p-value is the share of random swaps (fixed seed) whose difference
    is at least as far from 0 as the observed one, counting the observed assignment itself. Unlike a percentile
    bootstrap, it stays valid when an effect rests on a few rare events (a handful of samples with a repeated word
    against none): four such prompts give p = 0.125, not a verdict."""
    (an, ad), (bn, bd) = (tuple(np.asarray(v, dtype=np.float64) for v in pair) for pair in (a, b))
    if not (an.ndim == 1 and an.size and an.shape == ad.shape == bn.shape == bd.shape):
        raise ValueError(f"a paired test needs four equally long, non-empty 1-D sequences (got {an.shape}, "
                         f"{ad.shape}, {bn.shape}, {bd.shape})")
    if not 1 <= permutations <= MAX_RESAMPLES:
        raise ValueError(f"permutations must be an integer from 1 to {MAX_RESAMPLES}, got {permutations!r}")
    observed = float(an.sum() / ad.sum() - bn.sum() / bd.sum())
    swap = np.random.default_rng(seed).integers(0, 2, size=(permutations, an.size)).astype(bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = (np.where(swap, bn, an).sum(axis=1) / np.where(swap, bd, ad).sum(axis=1)
                - np.where(swap, an, bn).sum(axis=1) / np.where(swap, ad, bd).sum(axis=1))
    as_far = np.abs(diff) >= abs(observed) * (1.0 - 1e-9) - 1e-12  # ties (e.g. a swap of equal pairs) count
    return observed, float((1 + np.count_nonzero(as_far)) / (permutations + 1))


def holm_adjust(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of m tests, in the given order: the i-th smallest p times
    (m - i + 1), made non-decreasing along the sorted order and capped at 1. Rejecting where the adjusted p is
    below alpha keeps the chance of any false rejection in the family at most alpha, whatever the tests'
    dependence (Holm 1979)."""
    values = [float(p) for p in ps]
    if any(not 0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie in [0, 1], got {values}")
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: values[j])):
        running = max(running, min(1.0, (m - rank) * values[i]))
        adjusted[i] = running
    return adjusted


def verdict_from_test(difference: float, p: float, *, lower_is_better: bool, alpha: float = ALPHA) -> str:
    """The verdict on 'a is better than b' from a paired test of a - b: 'reproduced' when p < alpha and the
    difference is on the better side, 'contradicted' when p < alpha on the worse side, 'inconclusive' otherwise."""
    if not p < alpha or difference == 0.0:
        return "inconclusive"
    return "reproduced" if (difference < 0.0) == lower_is_better else "contradicted"


def separated(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """True when two intervals do not overlap (neither is missing)."""
    if a is None or b is None:
        return False
    return a[1] < b[0] or b[1] < a[0]


def format_interval(value: float | None, interval: tuple[float, float] | None, spec: str = ".2f") -> str:
    """'12.34 [11.02, 13.90]' ('–' for a missing value; no brackets without an interval)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if interval is None:
        return format(value, spec)
    return f"{format(value, spec)} [{format(interval[0], spec)}, {format(interval[1], spec)}]"


def seed_spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Spread of one metric across sampling seeds: {"n", "min", "max", "sd"} over the values that exist (a metric
    can be undefined for a seed, e.g. GenPPL when every output was empty). `sd` is the sample standard deviation
    (n - 1 in the denominator), None below two values; min/max are None without any value."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return {"n": 0, "min": None, "max": None, "sd": None}
    sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    return {"n": len(vals), "min": min(vals), "max": max(vals), "sd": sd}
