"""The frontier's points from its timed runs, without torch: which samplers and families there are, which row is a
sampler's exact reference, and one row per variant from `runs.jsonl` (median speed over the rounds, round 1's
quality, the speed-up and token agreement against the reference).

`cache_frontier.py` runs the variants and appends their runs; `frontier_report.py` renders the rows. Both import
these definitions from here, so the report (and the benchmark page rendered from a run's files) needs only the
run's JSON, never a model.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

SDE_SAMPLERS = ("Block SDE", "SDE")
SAMPLERS = (*SDE_SAMPLERS, "Block remasking", "Threshold remasking", "ReMDM")
FAMILIES = {"DSL model (any SDE)": SDE_SAMPLERS,
            "Masked DLM (any remasking)": ("Block remasking", "Threshold remasking", "ReMDM")}
"""The samplers each model family can run: a family's recommended point is its fastest row of any of them."""

REFERENCE_OF = {"Threshold remasking": "Block remasking", "ReMDM": "Block remasking"}
"""The sampler whose exact row a sampler's speed-up and token agreement are measured against (default: itself)."""


def is_exact(row: dict[str, Any]) -> bool:
    """A frontier row of an exact sampler: no cache, fp32 backbone, dense converter."""
    return row["mode"] == "off" and row.get("dtype", "float32") == "float32" and not row.get("tolerance")


def is_reference(row: dict[str, Any]) -> bool:
    """The exact row of a sampler at its default step count (the speed options are measured against it)."""
    return is_exact(row) and not row.get("steps") and row.get("threshold") is None


def frontier_rows(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per variant key (in `keys` order): round-1 quality, median seconds per sample over the rounds (and
    their range; at batch 1 too when timed), forward passes per sample, and the share of response tokens equal to
    (and the speed-up over) its reference: the sampler's exact fp32 variant at the default step count (threshold
    decoding and ReMDM: exact fixed-step block remasking; none for the oracle rows, whose time is not a speed).
    A key without a round-1 run is left out."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_key.setdefault(r["key"], []).append(r)
    rows = []
    for k in keys:
        rs = sorted(by_key.get(k, []), key=lambda r: r["round"])
        first = next((r for r in rs if r["round"] == 0), None)
        if first is None:
            continue
        times = [r["seconds_per_sample"] for r in rs]
        row = {"key": k} | {key: first[key] for key in ("sampler", "mode", "refresh", "label", "open", "summarize", "ids", "n")}
        row |= {key: first.get(key, default) for key, default in (
            ("dtype", "float32"), ("tolerance", 0.0), ("steps", 0), ("threshold", None), ("oracle", False),
            ("forward_passes", None), ("row_steps", None))}
        row["budget"] = first["config"].get("nfe", first["config"].get("steps"))  # NFE (SDE) or steps in force
        row |= {"seconds_per_sample": statistics.median(times), "seconds_min": min(times), "seconds_max": max(times),
                "rounds": len(times), "loads": [r["load_average"] for r in rs if r.get("load_average") is not None],
                "threads": sorted({r["threads"] for r in rs if "threads" in r})}
        b1 = [r["seconds_per_sample_b1"] for r in rs if "seconds_per_sample_b1" in r]
        if b1:
            row |= {"seconds_per_sample_b1": statistics.median(b1), "seconds_min_b1": min(b1),
                    "seconds_max_b1": max(b1)}
        rows.append(row)
    refs = {r["sampler"]: r for r in rows if is_reference(r) and not r["oracle"]}
    for r in rows:
        ref = None if r["oracle"] else refs.get(REFERENCE_OF.get(r["sampler"], r["sampler"]))
        if ref is None:
            r["same_tokens"] = r["speedup"] = None
            continue
        same = sum(x == y for a, b in zip(r["ids"], ref["ids"]) for x, y in zip(a, b))
        r["same_tokens"] = 100.0 * same / max(sum(len(b) for b in ref["ids"]), 1)
        r["speedup"] = ref["seconds_per_sample"] / r["seconds_per_sample"]
    return rows
