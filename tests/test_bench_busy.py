"""bench_busy.py: the ratios and token checks it derives from its rounds, the section it writes from a saved result
(`--report`), and its options, without measuring."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _run(r: int, phase: str, scale: float, tokens: str = "aa") -> dict:
    base = {"sde": 1.0, "authors_sde": 2.0, "remask": 0.5, "authors_remask": 1.5}
    variants = {}
    for v, slow in (("openmp-default", 4.0 if phase == "loaded" else 1.0), ("configure-process", 1.0)):
        f = scale * (slow if phase == "loaded" else 1.0) * (3.0 if phase == "loaded" else 1.0)
        variants[v] = {"s": {k: t * f for k, t in base.items()}, "identical": {"sde": True, "remask": True},
                       "tokens": {"sde": tokens, "remask": "bb"}}
    return {"round": r, "phase": phase, "load_before": 1.0 + r, "load_after": 2.0 + r, "variants": variants}


def _result(tokens_round_1: str = "aa") -> dict:
    bb = importlib.import_module("bench_busy")
    runs = [_run(0, "idle", 1.0), _run(0, "loaded", 1.0), _run(1, "loaded", 2.0, tokens_round_1), _run(1, "idle", 2.0)]
    return bb.summarise({"nfe": 16, "rounds": 2, "threads": 2, "neighbours": 4, "neighbour_kind": "python loop",
                         "usable_cpus": 2, "variants": ["openmp-default", "configure-process"],
                         "children": {"openmp-default": {"threads": 2}, "configure-process": {"threads": 2}},
                         "runs": runs})


def test_ratios_are_loaded_over_idle_within_each_round():
    r = _result()
    # configure-process: loaded = 3x idle in both rounds; openmp-default: 12x
    assert r["table"]["configure-process"]["sde"]["ratio_rounds"] == [3.0, 3.0]
    assert r["table"]["openmp-default"]["authors_remask"]["ratio"] == 12.0
    assert r["table"]["openmp-default"]["sde"]["idle_s"] == [1.0, 2.0]  # in round order, whatever the phase order
    assert r["table"]["configure-process"]["remask"]["loaded_median_s"] == (1.5 + 3.0) / 2
    assert r["load_range"] == [1.0, 3.0]
    assert r["identical_to_restatement"] and r["same_tokens_everywhere"]


def test_tokens_that_change_between_phases_are_caught():
    r = _result(tokens_round_1="cc")
    assert r["identical_to_restatement"] and not r["same_tokens_everywhere"]


def test_report_writes_one_section_on_the_process_settings_page(monkeypatch):
    bb = importlib.import_module("bench_busy")
    import benchlib

    written: dict[str, tuple[str, str]] = {}
    monkeypatch.setattr(benchlib, "write_section", lambda title, body, page: written.update({title: (body, page)}))
    r = {**_result(), "command": "python benchmarks/bench_busy.py --rounds 2 --write", "environment": None}
    bb.write_markdown(r)
    body, page = written["The library on a busy machine, NFE 16: openmp-default, configure-process, 2 rounds"]
    assert page == "process-settings.md"
    assert body.startswith("Command: `python benchmarks/bench_busy.py --rounds 2 --write`. 4 neighbour processes")
    assert "| openmp-default | 2 | SDE NFE 16, library | 1.500 | 18.000 | **12.00x** (12.00–12.00) |" in body
    assert "| configure-process | 2 | remasking 16 steps, restatement | 2.250 | 6.750 | **3.00x** (3.00–3.00) |" in body
    assert "in every call: yes; the same in every variant and phase: yes" in body
    assert body.count("\n| ") == 1 + 8  # the header and 2 variants x 4 samplers


def test_help_lists_the_variants_and_a_bad_count_is_one_error_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    script = str(ROOT / "benchmarks" / "bench_busy.py")
    out = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    for option in ("--rounds", "--nfe", "--neighbours", "--variants", "--json", "--report", "--write", "--threads"):
        assert option in out.stdout
    assert "{openmp-default,configure-process,passive,wait-unchanged,one-thread}" in out.stdout
    bad = subprocess.run([sys.executable, script, "--rounds", "0", "--threads", "1"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].endswith("error: --rounds must be at least 1, got 0")
