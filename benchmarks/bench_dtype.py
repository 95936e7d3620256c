"""fp32, bf16 or int8? One subcommand per measurement (`python benchmarks/bench_dtype.py SUBCOMMAND --help` for its
options):

  speed    fp32 against bf16 per denoiser call and per sample, split into blocks, head, converter and top-M
           posterior mean, against the FLOP time of the same work at the measured matmul peak; LLaDA-8B's real
           widths at reduced depth (`--shape real`)
  quality  the toy world's quality with the backbone in bf16 (or int8 weight-only) against fp32: perplexity,
           ROUGE-L and error correction with bootstrap intervals, identical tokens (needs a quick demo's checkpoints)

Usage:  python benchmarks/bench_dtype.py speed --shape small --threads 1 --rounds 3 --batches 1 8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import run_subcommands
from measures import dtype_quality, dtype_speed

SUBCOMMANDS = {"speed": dtype_speed, "quality": dtype_quality}


def main(argv: list[str] | None = None) -> int:
    return run_subcommands(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
