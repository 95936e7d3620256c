"""`dsl-llada demo` as a library call: `run_demo(DemoSettings(...))` runs the toy world end to end (or its
sweep, or its cache frontier) into a report folder, as the command does:

    from dsl_llada.toy.demo_command import DemoSettings, run_demo
    run_demo(DemoSettings(out="demo-out", quick=True))

The command line only parses its flags into these settings (`cli.cmd_demo`); `toy/demo.py` holds the stages.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..eval.report import pivot
from .cache_frontier import FrontierConfig
from .demo import Demo, DemoConfig
from .frontier_report import recommendation_lines
from .run_files import COMPARISON_FILES, FRONTIER_FILES, SWEEP_FILES, remove_stale_stages
from .sweep import SweepConfig
from .verdicts import verdict_lines, verdicts

__all__ = ["DEMO_DTYPES", "DemoSettings", "run_demo"]

DEMO_DTYPES = ("auto", "float32", "bfloat16")
"""What `dtype` accepts (auto: bf16 where the CPU has native bf16, else float32)."""


@dataclass(frozen=True)
class DemoSettings:
    """One `demo` run: the report folder, the preset (quick or full, controls, from scratch), seeds and precision,
    and which job (the comparison, `sweep` or `cache_frontier`)."""

    out: str = "dsl-llada-demo"
    """Report folder (its cache/ is reused when the stages' configs are unchanged)."""
    quick: bool = False
    controls: bool = False
    """Also train the MDM-CPT and XDLM controls."""
    from_scratch: bool = False
    """Pretrain the masked DLM in this run instead of starting from the one shipped with the package."""
    seed: int = 0
    dtype: str = "float32"
    """Backbone dtype of the sampling and error-correction stages (`DEMO_DTYPES`; training is always fp32)."""
    seeds: int = 1
    """Sample every prompt with this many seeds (1-16)."""
    sweep: bool = False
    """Run the paper's SDE sensitivity sweep instead of the comparison (OUT/sweep/)."""
    cache_frontier: bool = False
    """Run the KV-cache quality-speed frontier instead of the comparison (OUT/cache_frontier/)."""
    sweep_prompts: int | None = None
    """Sweep: N open-ended + N/2 summarisation prompts (default 96; 8 with `quick`)."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DEMO_DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} is not valid; expected one of {list(DEMO_DTYPES)}")
        if self.sweep and self.cache_frontier:
            raise ValueError("--sweep and --cache-frontier are two runs; pass one")


def run_demo(settings: DemoSettings) -> int:
    """Run the demo (prints its tables and where the report is; the stages log); returns the exit code (0). Bad
    settings raise ValueError before anything is written.

    One demo per --out folder: the run holds `locks.output_lock` on it from before its first check to its end (a
    second demo on the folder is refused naming the first's PID). SIGTERM ends the run through the same clean-up
    as an error (exit code 143), so the lock and any half-written file are removed."""
    from ..core.loading import auto_dtype
    from ..artifacts.locks import output_lock
    from ..artifacts.outputs import prepare_output_dir
    from ..runtime.termination import terminate_raises

    s = settings
    dtype = str(auto_dtype("cpu")).removeprefix("torch.") if s.dtype == "auto" else s.dtype
    cfg = DemoConfig.preset(quick=s.quick, controls=s.controls, seed=s.seed, sample_seeds=s.seeds, dtype=dtype,
                            from_scratch=s.from_scratch)
    sweep = SweepConfig.preset(quick=s.quick, n_open=s.sweep_prompts, seed=s.seed) if s.sweep else None
    out = Path(s.out)
    with terminate_raises(), output_lock(out, what="--out folder"):
        prepare_output_dir(out, kind="demo", reuse=True, what="--out folder")  # before minutes of training
        for folder, names in ((out, COMPARISON_FILES), (out / "sweep", SWEEP_FILES),
                              (out / "cache_frontier", FRONTIER_FILES)):
            _remove_stale_stages(folder, names)
        demo = Demo(cfg, out, progress=s.progress)
        if s.cache_frontier:
            return _frontier(demo, FrontierConfig.preset(quick=s.quick, seed=s.seed), out)
        if sweep is not None:
            t0 = time.perf_counter()
            demo.sweep(sweep)
            print(f"sweep table: {out / 'sweep' / 'sweep.md'}  (plot: sweep.png, rows with configs: "
                  f"sweep.jsonl, outputs: samples.jsonl); {time.perf_counter() - t0:.0f} s")
            return 0
        return _comparison(demo, out)


def _remove_stale_stages(folder: Path, names: tuple[str, ...]) -> None:
    """Remove the file stages a killed demo left in `folder` (we hold the lock: no live demo owns them)."""
    removed, kept = remove_stale_stages(folder, names)
    for p in removed:
        print(f"note: removed {str(p)!r}, the unfinished files of an interrupted demo", file=sys.stderr)
    for p in kept:
        print(f"warning: {str(p)!r} looks like the unfinished files of an interrupted demo but holds other files; "
              f"left alone — remove it yourself", file=sys.stderr)


def _frontier(demo: Demo, fc: FrontierConfig, out: Path) -> int:
    t0 = time.perf_counter()
    rows = demo.cache_frontier(fc)
    for line in recommendation_lines(rows):
        print(line)
    print(f"cache frontier: {out / 'cache_frontier' / 'frontier.md'}  (plot: frontier.png, timed runs: "
          f"runs.jsonl, outputs: samples.jsonl); {time.perf_counter() - t0:.0f} s")
    return 0


def _comparison(demo: Demo, out: Path) -> int:
    result = demo.run()
    open_rows = [r for r in result["rows"] if r["task"] == "open"]
    print()
    print(pivot(open_rows, "ppl"))
    print()
    print("\n".join(verdict_lines(verdicts(result["rows"], result["records"]))))
    print()
    print(f"report: {out / 'report.md'}  (plot: nfe_curve.png, samples: results.jsonl)")
    print(f"total time: {result['timings']['total_s']:.0f} s")
    return 0
