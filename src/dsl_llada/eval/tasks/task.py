"""What a task is to the runner: samples from a dataset, a response length, per-item metrics, and a summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

from ..eval_config import DatasetSpec, EvalConfig, TaskSpec
from ..samples import Sample


@dataclass
class SummaryContext:
    """What a task's summary may use besides its records."""

    config: EvalConfig
    task: TaskSpec
    run_dir: Path
    mode: str
    figures_dir: Path


@dataclass
class TaskSummary:
    """Aggregated rows (one per dataset x method x NFE), Markdown tables and figure paths."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    markdown: str = ""
    figures: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class SamplingTask:
    """A task whose work items are prompts answered by a sampler; subclasses define the protocol."""

    name = ""
    seed_metrics: dict[str, str] = {}
    """Row metrics whose per-seed values and spread across seeds `eval report` gives (metric -> format spec)."""

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        raise NotImplementedError

    def gen_length(self, ds: DatasetSpec) -> int:
        raise NotImplementedError

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise one clear error for a bad task option (e.g. a scorer folder that is missing)."""
        if options:
            raise ValueError(f"task {self.name!r} takes no options, got {sorted(options)}")

    def item_metrics(self, sample_info: dict[str, Any], text: str, mode: str) -> dict[str, Any]:
        raise NotImplementedError

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        raise NotImplementedError


def group_records(records: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """(dataset, method, nfe) -> records (all seeds), in record order."""
    out: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault((r["dataset"], r["method"], int(r["nfe"])), []).append(r)
    return out


def base_row(dataset: str, method: str, nfe: int, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts every summary row carries: samples, errored samples, valid (non-empty, no error) outputs, seconds."""
    ok = [r for r in recs if r.get("error") is None]
    return {"dataset": dataset, "method": method, "nfe": nfe, "n": len(recs), "errors": len(recs) - len(ok),
            "valid": sum(1 for r in ok if r.get("text", "").strip()),
            "forward_passes": max((r.get("forward_passes") or 0 for r in ok), default=None),
            "seconds_per_sample": (sum(r.get("seconds", 0.0) for r in ok) / len(ok)) if ok else None,
            "gen_tokens": (sum(r.get("n_tokens", 0) for r in ok) / len(ok)) if ok else None}


def seed_values(recs: list[dict[str, Any]],
                values: Callable[[list[dict[str, Any]]], dict[str, float | None]]) -> dict[str, Any]:
    """The seeds of a summary row's records, and with two or more: each metric recomputed on each seed's records
    alone (`values`, the same aggregate as the row's) and its spread across seeds (`dsl_llada.stats.seed_spread`).

    Returns {"seeds": [...]} and, for >= 2 seeds, "per_seed" (metric -> values in seed order) and "seed_spread"
    (metric -> {"n", "min", "max", "sd"})."""
    from ...stats import seed_spread

    seeds = sorted({int(r["seed"]) for r in recs})
    out: dict[str, Any] = {"seeds": seeds}
    if len(seeds) < 2:
        return out
    per = [values([r for r in recs if int(r["seed"]) == s]) for s in seeds]
    out["per_seed"] = {k: [p[k] for p in per] for k in per[0]}
    out["seed_spread"] = {k: seed_spread(v) for k, v in out["per_seed"].items()}
    return out


def is_dsl_folder(path: str) -> bool:
    """Whether a model folder is a DSL checkpoint (has the noise embedding), without loading it."""
    from ...core.loading import is_dsl_checkpoint

    try:
        return is_dsl_checkpoint(path)
    except (OSError, ValueError):
        return False


def usable_paths(options: dict[str, Any], model) -> list[str]:
    """The `paths` option, without 'converter' for a model that has no converter (a bare backbone)."""
    paths = list(options.get("paths", ["discrete"]))
    return [p for p in paths if p != "converter" or is_dsl_folder(model.path)]
