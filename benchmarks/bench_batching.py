"""Does batching pay? One subcommand per measurement (`python benchmarks/bench_batching.py SUBCOMMAND --help` for its
options):

  sde         SDE samples/s at batch 1, 8, 32 (CPU or GPU, fp32 or bf16, optionally compiled)
  remask      remasking at batch 8 against batch 1 per sample (wall and CPU time), before and after the reused
              logits buffer and the one-sweep reductions, identical tokens
  likelihood  Monte Carlo log-likelihood requests/s, one mask pattern per forward against all batched

Usage:  python benchmarks/bench_batching.py remask --rounds 5 --threads 1 --json OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import run_subcommands
from measures import batching_likelihood, batching_remask, batching_sde

SUBCOMMANDS = {"sde": batching_sde, "remask": batching_remask, "likelihood": batching_likelihood}


def main(argv: list[str] | None = None) -> int:
    return run_subcommands(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
