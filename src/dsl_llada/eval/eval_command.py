"""`dsl-llada eval run` and `eval report` as library calls: `run_eval_command(EvalRunSettings(...))` runs (or
resumes) an evaluation into a run folder, `run_eval_report(EvalReportSettings(...))` writes a run folder's summary
and figures; each prints the command's one-line JSON summary and returns its exit code:

    from dsl_llada.eval.eval_command import EvalReportSettings, EvalRunSettings, run_eval_command, run_eval_report
    from dsl_llada.eval.eval_config import load_eval_config
    run_eval_command(EvalRunSettings(load_eval_config("configs/eval/toy-generation.yaml"), out="runs/toy"))
    run_eval_report(EvalReportSettings("runs/toy", mode="authors"))

The command line only parses its flags (and the config file with its overrides) into these settings
(`eval_cli.cmd_eval_run`, `eval_cli.cmd_eval_report`); `runner.run_eval` is the evaluation itself and
`summary.write_report` the report.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

from .eval_config import SCORING_MODES, EvalConfig

__all__ = ["EvalReportSettings", "EvalRunSettings", "run_eval_command", "run_eval_report"]


@dataclass(frozen=True)
class EvalRunSettings:
    """One `eval run`: the evaluation config, the run folder and what counts as success."""

    config: EvalConfig
    out: str
    """Run folder; the same folder resumes."""
    overwrite: bool = False
    """Write into a non-empty folder that holds no run, or replace a run with another config."""
    new_run: bool = False
    """The folder holds a run with another config: move its files to previous-<time>/ and start over."""
    report: bool = True
    """Write summary.json, summary.md and the figures at the end."""
    max_error_rate: float = 0.05
    """Largest share of a task's items that may error with exit code 0."""
    progress: bool = True
    batching: str = "continuous"
    """'continuous': the diffusion samplers' batches run on the step-level engine; 'fixed': one sampler call per
    batch (`runner.run_eval`). The records' tokens are the same."""

    def __post_init__(self) -> None:
        if self.batching not in ("continuous", "fixed"):
            raise ValueError(f"--batching {self.batching!r} is not one of continuous, fixed")
        if self.overwrite and self.new_run:
            raise ValueError("pass either --overwrite or --new-run, not both")
        if not (isinstance(self.max_error_rate, (int, float)) and math.isfinite(self.max_error_rate)
                and 0.0 <= self.max_error_rate <= 1.0):
            raise ValueError(f"--max-error-rate={self.max_error_rate} must be a fraction in [0, 1] (e.g. 0.05)")


def run_eval_command(settings: EvalRunSettings) -> int:
    """Run one evaluation; the main process prints a JSON summary line (and one error line per task with too many
    errored items). Returns 1 when a task's errored share exceeds `max_error_rate`, else 0."""
    from pathlib import Path

    from .runner import run_eval

    s = settings
    res = run_eval(s.config, Path(s.out), overwrite=s.overwrite, new_run=s.new_run, progress=s.progress,
                   report=s.report, batching=s.batching)
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        print(json.dumps({"run_dir": str(res.run_dir), "items": res.n_items, "run_now": res.n_run,
                          "errors_now": res.n_errors, "world_size": res.world_size,
                          "errors": {t: st["errors"] for t, st in res.error_stats.items()},
                          "summary": str(res.run_dir / "summary.md") if s.report else None}))
    failed = res.failed_tasks(s.max_error_rate)
    if not failed:
        return 0
    if main_rank:
        for t in failed:
            st = res.error_stats[t]
            print(f"error: task {t}: {st['errors']} of {st['n']} items errored ({100 * st['rate']:.1f} % > "
                  f"--max-error-rate {100 * s.max_error_rate:g} %); most common ({st['most_common_count']}x): "
                  f"{st['most_common']}", file=sys.stderr)
    return 1


@dataclass(frozen=True)
class EvalReportSettings:
    """One `eval report`: the run folder and the scoring mode of its summary."""

    run_dir: str
    """A folder written by `eval run`."""
    mode: str | None = None
    """Scoring mode of the summary: 'default' or 'authors' (None: the run's scoring_mode)."""

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in SCORING_MODES:
            raise ValueError(f"--mode {self.mode!r} is not valid; expected one of {list(SCORING_MODES)}")


def run_eval_report(settings: EvalReportSettings) -> int:
    """Write summary.json, summary.md and the figures of a run folder (from its records, nothing re-run) and print
    a one-line JSON summary: the summary's path, the record and error counts and the figures. Returns 0."""
    from pathlib import Path

    from .summary import write_report

    s = write_report(settings.run_dir, mode=settings.mode)
    print(json.dumps({"summary": str(Path(settings.run_dir) / "summary.md"), "records": s["n_records"],
                      "errors": s["n_errors"], "figures": [f for t in s["tasks"].values() for f in t.get("figures", [])]}))
    return 0
