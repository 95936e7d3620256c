"""`dsl-llada eval run` as a library call: `run_eval_command(EvalRunSettings(...))` runs (or resumes) an evaluation
into a run folder, prints the command's one-line JSON summary and returns its exit code:

    from dsl_llada.eval.eval_command import EvalRunSettings, run_eval_command
    from dsl_llada.eval.eval_config import load_eval_config
    run_eval_command(EvalRunSettings(load_eval_config("configs/eval/toy-generation.yaml"), out="runs/toy"))

The command line only parses its flags (and the config file with its overrides) into these settings
(`eval_cli.cmd_eval_run`); `runner.run_eval` is the evaluation itself.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

from .eval_config import EvalConfig

__all__ = ["EvalRunSettings", "run_eval_command"]


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

    def __post_init__(self) -> None:
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
                   report=s.report)
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
