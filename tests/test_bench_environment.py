"""Every benchmark takes --threads and its results carry the environment record (benchmarks/benchlib.py)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import benchlib  # noqa: E402


def test_parse_args_adds_threads_sets_them_and_captures_the_record(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(sys, "argv", ["bench", "--threads", "1"])
        a = benchlib.parse_args(argparse.ArgumentParser())
        assert a.threads == 1 == torch.get_num_threads()
        env = benchlib.run_environment()
        assert env["threads"]["intra_op"] == 1 and "load_average_end" in env and env["cpu_capability"]
        assert benchlib.environment_note().startswith("Environment: dsl-llada ")
    finally:
        torch.set_num_threads(before)


def test_every_benchmark_script_goes_through_parse_args():
    for path in sorted(BENCH.glob("bench_*.py")):
        text = path.read_text()
        if path.name == "bench_threads.py":  # its children set the threads; the parent records the environment
            assert "bench_environment()" in text and "finish_record" in text
            continue
        assert "parse_args(ap)" in text and "ap.parse_args()" not in text, path.name
        assert re.search(r"environment_note\(\)|run_environment\(\)|write_section\(|write_json\(", text), path.name
