"""Do the approximations cost quality, and what do they buy? One subcommand per measurement
(`python benchmarks/bench_approx.py SUBCOMMAND --help` for its options):

  kv-cache  approximate KV caching (dual / prefix, refresh every R calls) at the LLaDA-shaped size: seconds per
            sample and the share of tokens equal to the exact sampler's
  sparse    the sparse converter (`converter_tolerance`) on the demo's SDE samples: changed tokens, perplexity,
            time (needs a finished default demo's checkpoints)
  fp-drift  which floating-point differences (threads, CPU kernels, batch layout) reach the toy demo's results

Usage:  python benchmarks/bench_approx.py kv-cache --rounds 3 --json benchmarks/results/approx_kv_cache.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import run_subcommands
from measures import approx_fp_drift, approx_kv_cache, approx_sparse

SUBCOMMANDS = {"kv-cache": approx_kv_cache, "sparse": approx_sparse, "fp-drift": approx_fp_drift}


def main(argv: list[str] | None = None) -> int:
    return run_subcommands(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
