"""bench_threads.py: its options, and the section it writes from a saved result (`--report`), without measuring."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _result() -> dict:
    times = {"default": [2.0, 2.2], "one thread": [4.0, 4.0], "default, OMP_WAIT_POLICY=PASSIVE": [3.0, 2.75],
             "default, OMP_WAIT_POLICY=ACTIVE": [2.0, 2.0], "default, GOMP_SPINCOUNT=1000": [2.1, 2.2]}
    rows = []
    for name, t in times.items():
        row = {"variant": name, "threads": 1 if name == "one thread" else 2, "median_s": sum(t) / 2, "min_s": min(t),
               "max_s": max(t), "times_s": t}
        for key, ref in (("vs_one_thread", "one thread"), ("vs_spin", "default, OMP_WAIT_POLICY=ACTIVE"),
                         ("vs_passive", "default, OMP_WAIT_POLICY=PASSIVE")):
            row[f"{key}_rounds"] = [x / o for x, o in zip(t, times[ref])]
            row[key] = sum(row[f"{key}_rounds"]) / 2
        rows.append(row)
    env = {"cpu_model": "Test CPU", "cpu_capability": "AVX2", "usable_cpus": 2, "libraries": {"torch": "2.x"},
           "dsl_llada": "0.1.0", "git": {"commit": "0123456789abcdef"}, "load_average_start": 0.5,
           "load_average_end": 0.7}
    return {"shape": "bench", "vocab": 32768, "d_model": 256, "n_layers": 4, "batch": 1, "prompt": 128, "gen": 128,
            "nfe": 64, "neighbours": 1, "rounds": 2, "reps": 2, "rows": rows, "environment": env,
            "command": "python benchmarks/bench_threads.py --shape bench --rounds 2 --reps 2 --neighbours 1 --write"}


def test_report_writes_the_saved_result_as_one_section(monkeypatch):
    bt = importlib.import_module("bench_threads")
    import benchlib

    written = {}
    monkeypatch.setattr(benchlib, "write_section", lambda title, body: written.update({title: body}))
    bt.write_markdown(_result())
    assert list(written) == ["OpenMP waiting with 1 busy neighbour(s) (bench)"]
    body = written["OpenMP waiting with 1 busy neighbour(s) (bench)"]
    assert body.startswith("Command: `python benchmarks/bench_threads.py --shape bench --rounds 2")
    assert "NFE 64, batch 1, prompt 128 + 128 generated tokens" in body
    # passive took 3.0 and 2.75 s, the bounded spin 2.1 and 2.2: per-round ratios 0.70 and 0.80
    assert "| default, GOMP_SPINCOUNT=1000 | 2 | 2.150 | 2.100–2.200 | 0.54x (0.53, 0.55) | 1.08x (1.05, 1.10) | " \
           "0.75x (0.70, 0.80) |" in body
    assert "Test CPU (AVX2), 2 usable CPUs" in body
    idle = {**_result(), "neighbours": 0}
    bt.write_markdown(idle)
    assert "OpenMP waiting on an idle machine (bench)" in written


def test_help_lists_the_shapes_and_the_report_option():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_threads.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for option in ("--shape", "--neighbours", "--rounds", "--reps", "--json", "--report", "--write"):
        assert option in out.stdout
    assert "{bench,small,toy}" in out.stdout


def test_every_variant_names_its_environment():
    bt = importlib.import_module("bench_threads")
    assert bt.VARIANTS[bt.PASSIVE][1] == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert bt.VARIANTS["default, GOMP_SPINCOUNT=1000"][1] == {"GOMP_SPINCOUNT": "1000"}
    assert json.loads(json.dumps(bt.SHAPES["bench"]))["nfe"] == 64


def test_allocator_benchmark_report_and_help(monkeypatch):
    """bench_allocator.py: its options, and the section it writes from a saved result (ratios within rounds)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_allocator.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for option in ("--rounds", "--batches", "--json", "--report", "--write", "--threads"):
        assert option in out.stdout
    ba = importlib.import_module("bench_allocator")
    import benchlib

    def side(s: float, faults: float, tokens: str, malloc) -> dict:
        return {"malloc": malloc, "peak_rss_mib": 900.0, "rss_after_mib": 500.0,
                "runs": {"SDE NFE 16, batch 8": {"s_per_sample": s, "faults_per_call": faults, "tokens": tokens}}}

    kept = {"mmap_threshold": 1 << 30, "trim_threshold": 1 << 30}
    rounds = [{"glibc default": side(1.0, 40000, "a", None), "kept": side(0.9, 0, "a", kept)},
              {"glibc default": side(2.0, 40000, "a", None), "kept": side(1.6, 0, "b", kept)}]
    env = {"dsl_llada": "0.1.0", "python": "3.11", "libraries": {"torch": "2.x"}, "device": "cpu",
           "cpu_model": "Test CPU", "cpu_capability": "AVX2", "usable_cpus": 2, "threads": {"intra_op": 2}}
    result = {"rounds": rounds, "batches": [8], "environment": env,
              "command": "python benchmarks/bench_allocator.py --rounds 2 --batches 8 --threads 2"}
    written = {}
    monkeypatch.setattr(benchlib, "write_section", lambda title, body: written.update({title: body}))
    ba.write_markdown(result)
    body = written["Large buffers between calls"]
    # per-round ratios 0.90 and 0.80, median 0.85; the second round's tokens differ
    assert "| SDE NFE 16, batch 8 | 1.500 | 1.250 | **0.85x** (0.90, 0.80) | 40,000 → 0 | no |" in body
    assert "raised to 1,073,741,824 bytes" in body
