"""`dsl-llada train` as a library call: `run_train(TrainSettings(config))` trains into `config.output_dir` under its
lock, prints the command's one-line JSON summary (main process) and returns its exit code:

    from dsl_llada.train.train_command import TrainSettings, run_train
    from dsl_llada.train.train_config import load_train_config
    run_train(TrainSettings(load_train_config("configs/toy.yaml", ["max_steps=20", "output_dir=runs/toy"])))

The command line only parses its flags (the preset and its overrides) into these settings (`train_cli.cmd_train`);
`trainer.train` is the training itself.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train_config import TrainConfig

__all__ = ["TrainSettings", "os_rank", "run_train"]


@dataclass(frozen=True)
class TrainSettings:
    """One `train` run: the resolved training config and whether an older resume may discard later checkpoints."""

    config: TrainConfig
    overwrite: bool = False
    """resume=CHECKPOINT older than output_dir's newest checkpoint: discard the later checkpoints (else refused)."""


def os_rank() -> int:
    """This process's rank under a multi-process launcher (the RANK environment variable; 0 alone)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def run_train(settings: TrainSettings) -> int:
    """Train, print a one-line JSON summary (main process). Returns the exit code: 0 done, 3 diverged (the last
    good checkpoint is kept), 143 stopped by SIGTERM (the last complete checkpoint is kept, the lock released); a bad
    config, data or an output_dir in use raises before training."""
    import contextlib

    from ..artifacts.locks import output_lock
    from ..artifacts.outputs import prepare_output_dir
    from ..runtime.termination import Terminated, terminate_raises
    from .trainer import TrainingDiverged, train

    config = settings.config
    # One writer per run folder: the main process holds the lock for the whole run, before anything is written.
    lock = output_lock(config.output_dir, what="output_dir") if os_rank() == 0 else contextlib.nullcontext()
    with lock:
        prepare_output_dir(config.output_dir, kind="training run", reuse=True, what="output_dir")
        try:
            with terminate_raises():  # SIGTERM stops the run like Ctrl-C; a checkpoint being saved is removed
                result = train(config, overwrite=settings.overwrite)
        except TrainingDiverged as e:
            print(f"error: {e}", file=sys.stderr)
            return 3
        except Terminated:
            print(stopped_by_sigterm(config.output_dir), file=sys.stderr)
            return 143

    if os.environ.get("RANK", "0") == "0":
        last = result.losses[result.final_step] if result.final_step in result.losses else None
        print(json.dumps({"output_dir": str(result.output_dir), "final_step": result.final_step,
                          "stop_reason": result.stop_reason, "loss": last,
                          "last_checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
                          "final_model": str(result.final_model) if result.final_model else None}))
    return 0


def stopped_by_sigterm(output_dir: str) -> str:
    """The line `train` ends with when SIGTERM stops it: the checkpoint a rerun resumes from, if any."""
    from .checkpointing import list_checkpoints

    kept = list_checkpoints(output_dir)
    if not kept:
        return (f"stopped by SIGTERM before the first checkpoint: nothing in {output_dir} to resume from; rerun the "
                f"same command to start again")
    step, folder = kept[-1]
    return (f"stopped by SIGTERM: {len(kept)} checkpoint(s) kept in {output_dir}, the last {folder.name} (step {step}); "
            f"rerun the same command to resume from it")
