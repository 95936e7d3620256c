"""How fast is serving, and does it hold up? One subcommand per measurement
(`python benchmarks/bench_serve.py SUBCOMMAND --help` for its options):

  load    `dsl-llada serve` under concurrent `openai` clients on loopback: latency, throughput, batched against
          `--max-batch 1`, every output checked against the library's (`--rounds R`: the interleaved single-client
          latency / N-client throughput comparison)
  safety  whether one bad request can take the server down (oversized values, bodies and hosts, a client that
          leaves, SIGTERM mid-request); exit 0 when every check passes

Usage:  python benchmarks/bench_serve.py load --rounds 3 --clients 16 --requests 2 --write
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import run_subcommands
from measures import serve_load, serve_safety

SUBCOMMANDS = {"load": serve_load, "safety": serve_safety}


def main(argv: list[str] | None = None) -> int:
    return run_subcommands(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
