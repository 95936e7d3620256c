"""What `dsl-llada demo` costs: the whole command and its stages, each variant in a fresh process and folder.

Variants (each runs `python -m dsl_llada demo --out WORK/VARIANT` in a new process, into a folder that does not exist
yet, so no stage is reused from a cache):

  native  the default demo, with the CPU's own kernel path
  avx2    the default demo with `ATEN_CPU_CAPABILITY=avx2` in the child's environment (torch's AVX2 kernels on a
          CPU that has more)
  quick   `demo --quick` (fewer prompts and NFEs)

The whole process is timed here; the stages are the demo's own timings (`timings_s` in its `config.json`: the DSL
adaptation, sampling and scoring, the Bayes floor, the TV distances and `total_s`), kept with the child's environment
record from the same file. Variants run one after another, in the order given.

Usage:  python benchmarks/bench_demo.py --variants native avx2 quick --work /tmp/demo-bench
                                        --json benchmarks/results/demo_runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import command_line, write_text

VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "native": ([], {}),
    "avx2": ([], {"ATEN_CPU_CAPABILITY": "avx2"}),
    "quick": (["--quick"], {}),
}
"""name -> (extra `demo` arguments, variables set in the child's environment)."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["native", "avx2", "quick"], choices=list(VARIANTS),
                    help="which demo runs to time, in this order (default: all three)")
    ap.add_argument("--work", required=True, metavar="DIR",
                    help="a new or empty folder (never emptied by this script); each variant's demo writes into "
                         "DIR/VARIANT")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the result with its environment record here")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="most seconds one demo run may take")
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse (exit 2, one message) what would fail or mislead only after minutes of demo runs."""
    if len(set(a.variants)) != len(a.variants):
        ap.error(f"--variants {' '.join(a.variants)} names a variant twice")
    work = Path(a.work)
    if work.exists() and not work.is_dir():
        ap.error(f"--work {a.work!r} is a file; give a folder")
    if work.is_dir() and any(work.iterdir()):  # a timing needs fresh demo folders; nothing here is deleted
        ap.error(f"--work {a.work!r} is not empty; give a new or empty folder")
    if a.json is not None:
        if Path(a.json).is_dir():
            ap.error(f"--json {a.json!r} is a folder; give a file path")
        if Path(a.json).exists() and not a.overwrite:
            ap.error(f"--json {a.json!r} exists; pass --overwrite to replace it")
    if not a.timeout_s > 0:
        ap.error(f"--timeout-s {a.timeout_s!r} must be > 0")


def demo_argv(name: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "dsl_llada", "demo", "--out", str(out), *VARIANTS[name][0]]


def read_demo_record(out: Path) -> dict[str, Any]:
    """The demo's own stage timings and environment record, from the `config.json` it wrote into `out`."""
    path = out / "config.json"
    if not path.is_file():
        raise RuntimeError(f"the demo wrote no {path}")
    config = json.loads(path.read_text())
    return {"timings_s": {k: round(float(v), 2) for k, v in config["timings_s"].items()},
            "demo_environment": config.get("environment")}


def run_variant(name: str, work: Path, timeout_s: float) -> dict[str, Any]:
    """Run one variant's demo in a fresh process and folder; its wall time, stage timings and environment."""
    out = work / name  # new: --work was empty
    argv = demo_argv(name, out)
    env = {**os.environ, **VARIANTS[name][1]}
    log = work / f"{name}.log"
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"variant {name}: the demo exited with {rc}; its output is in {log}")
    return {"demo_args": argv[3:], "child_env": VARIANTS[name][1], "wall_s": round(wall, 2), **read_demo_record(out)}


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    check_args(ap, a)
    from dsl_llada.runtime.environment import environment_record, finish_record

    environment = environment_record()  # its load average at the start; finish_record adds the end's
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in a.variants:
        print(f"{name}: {' '.join(demo_argv(name, work / name)[1:])}", file=sys.stderr, flush=True)
        runs[name] = run_variant(name, work, a.timeout_s)
        print(f"{name}: {runs[name]['wall_s']:.1f} s (demo total {runs[name]['timings_s'].get('total_s')} s)",
              file=sys.stderr, flush=True)
    record = {"command": command_line(), "variants": a.variants, "runs": runs, "environment": finish_record(environment)}
    text = json.dumps(record, indent=1, sort_keys=True, default=str) + "\n"
    if a.json is not None:
        write_text(a.json, text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
