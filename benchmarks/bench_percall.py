"""Where does the time of one sampler call go? One subcommand per measurement
(`python benchmarks/bench_percall.py SUBCOMMAND --help` for its options):

  parts     one SDE denoiser call part by part (converter, blocks, head, top-M, whole call), before and after a
            change, each side in fresh processes, alternating; the sparse converter and the head's layouts
  roofline  each part of one SDE call and one remasking step against the FLOP time of its work at the measured
            matmul peak; the sparse converter's kept slots and error
  ablation  what the exact top-M selection and the reused slot buffer buy (each switched off in turn, same tokens)
  loop      loop efficiency: a whole sampling run against the sum of its model calls at each NFE; samples/s at
            batch 1-16; the converter's peak memory with and without token chunks

Usage:  python benchmarks/bench_percall.py roofline --reps 3 --json benchmarks/results/percall_roofline.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import run_subcommands
from measures import percall_ablation, percall_loop, percall_parts, percall_roofline

SUBCOMMANDS = {"parts": percall_parts, "roofline": percall_roofline, "ablation": percall_ablation,
               "loop": percall_loop}


def main(argv: list[str] | None = None) -> int:
    return run_subcommands(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
