"""`dsl-llada eval run|report`: argument parsing only (the runner lives in dsl_llada.eval.runner).

    dsl-llada eval run --config configs/eval/toy-generation.yaml --out runs/toy-gen
    accelerate launch -m dsl_llada eval run --config configs/eval/paper-summarization.yaml --out runs/summ
    dsl-llada eval report runs/summ
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..eval.eval_config import SCORING_MODES

EPILOG = """\
overrides are dotted EvalConfig keys; list elements by name or index, e.g.
  batch_size=4 nfe=[8,16] seeds=[42,123] scoring_mode=authors device=cpu
  tasks.summarization.datasets.xsum.limit=20 methods.DSL-SDE.options.eta=0 models.dsl.path=/models/dsl

resume: run the same command again (finished items are kept and never re-run).
multi-process: accelerate launch [--multi_gpu --num_processes N] -m dsl_llada eval run --config ... --out ...
exit codes: 0 done, 1 more than --max-error-rate of a task's items errored, 2 bad configuration, data,
  model or output folder (checked before anything is written)
"""


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Register `eval` (with `run` and `report`) on the main `dsl-llada` CLI's subparsers."""
    p = subparsers.add_parser("eval", help="run the paper's evaluations (sharded, resumable) and write reports",
                              description="Evaluate models with the paper's protocols: generation, summarization, "
                                          "reasoning, correction, probes.")
    sub = p.add_subparsers(dest="eval_command", required=True)
    r = sub.add_parser("run", help="run or resume an evaluation", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--config", "-c", required=True, metavar="FILE", help="evaluation preset (YAML/JSON EvalConfig), "
                                                                          "e.g. configs/eval/toy-generation.yaml")
    r.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted EvalConfig overrides (see below)")
    r.add_argument("--out", "-o", default=None, metavar="DIR",
                   help="run folder (default: eval-runs/<config name>); the same folder resumes")
    r.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty folder that holds no run, or replace a run with another config")
    r.add_argument("--new-run", action="store_true",
                   help="the folder holds a run with another config: move its files to previous-<time>/ and start over")
    r.add_argument("--no-report", action="store_true", help="do not write summary.json/summary.md/figures at the end")
    r.add_argument("--max-error-rate", type=float, default=0.05, metavar="FRACTION",
                   help="exit 1 (naming the most common error) when more than this share of a task's items errored "
                        "(default 0.05 = 5%%); the records and the report are kept")
    r.add_argument("--batching", default="continuous", choices=("continuous", "fixed"),
                   help="continuous (default): each (task, dataset, method, NFE, seed) group's batches run on the "
                        "step-level engine, the next prompt taking a finished row's place; fixed: one sampler call per "
                        "batch. Same tokens either way; the AR baseline, one-forward and timed tasks and --kv-cache "
                        "configs always run fixed batches")
    r.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_eval_run)
    s = sub.add_parser("report", help="summary.json, summary.md and figures of a run folder")
    s.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `dsl-llada eval run`")
    s.add_argument("--mode", choices=list(SCORING_MODES), default=None,
                   help="scoring mode of the summary (default: the run's scoring_mode)")
    s.set_defaults(func=cmd_eval_report)
    from .judge_cli import add_judge_parser

    add_judge_parser(sub)
    return p


def cmd_eval_run(a: argparse.Namespace) -> int:
    """Parse the flags and the config into EvalRunSettings and run the library's `run_eval_command`."""
    from ..eval.eval_command import EvalRunSettings, run_eval_command
    from ..eval.eval_config import load_eval_config

    cfg = load_eval_config(a.config, a.overrides)
    if a.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        return 0
    out = a.out if a.out else str(Path("eval-runs") / Path(a.config).stem)
    return run_eval_command(EvalRunSettings(cfg, out, overwrite=a.overwrite, new_run=a.new_run, report=not a.no_report,
                                            max_error_rate=a.max_error_rate, progress=not a.quiet,
                                            batching=a.batching))


def cmd_eval_report(a: argparse.Namespace) -> int:
    """Parse the flags into EvalReportSettings and run the library's `run_eval_report`."""
    from ..eval.eval_command import EvalReportSettings, run_eval_report

    return run_eval_report(EvalReportSettings(a.run_dir, mode=a.mode))
