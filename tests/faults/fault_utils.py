"""Helpers of the fault-injection suite (docs/reliability.md): one test per fault, each run as a user would (the CLI
in-process, or a real subprocess), checking the exit code, the single `error:` line and that nothing the user had
changed.

Here: the toy training preset as CLI arguments and a subprocess runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

TOY = ROOT / "configs" / "toy.yaml"
CORPUS = ROOT / "configs" / "toy-corpus.txt"


def train_argv(out: Path, *overrides: str) -> list[str]:
    """`train` on the toy preset, shrunk to a few tenths of a second per step; later overrides win."""
    return ["train", "--config", str(TOY), f"output_dir={out}", f"data.files=[{CORPUS}]", "data.block_size=32",
            "per_device_batch_size=2", "eval_every=0", "log_every=1", "warmup_steps=1", "keep_last=null",
            *overrides, "-q"]


def run_cli(argv: list[str], *, timeout: float = 300, preexec_fn=None) -> subprocess.CompletedProcess:
    """`python -m dsl_llada ARGV` in a subprocess with this checkout's sources first on the path, one thread."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "dsl_llada", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, preexec_fn=preexec_fn, cwd=ROOT)
