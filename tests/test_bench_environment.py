"""Every benchmark takes --threads and its results carry the environment record (benchmarks/benchlib.py); the
scripts that answer one question with several measurements reach each through a subcommand with its options."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import benchlib  # noqa: E402

# script -> subcommand -> the options it must take (those of the measurement it runs)
SUBCOMMANDS = {
    "bench_percall": {
        "parts": ["--before", "--rounds", "--reps", "--tolerance", "--clock", "--json", "--write", "--measure"],
        "roofline": ["--reps", "--tolerance", "--json"],
        "ablation": ["--rounds", "--json"],
        "loop": ["--preset", "--device", "--dtype", "--quick", "--nfe", "--rounds", "--batches", "--json"]},
    "bench_batching": {
        "sde": ["--batches", "--device", "--dtype", "--nfe", "--prompt", "--gen", "--tolerance", "--compile", "--write"],
        "remask": ["--rounds", "--json"],
        "likelihood": ["--requests", "--mc-samples", "--batch", "--repeats", "--write"]},
    "bench_dtype": {
        "speed": ["--shape", "--layers", "--dtypes", "--batches", "--rounds", "--reps", "--samples", "--parts", "--json",
                  "--write", "--child", "--child-dtypes"],
        "quality": ["--demo", "--n-open", "--n-summarize", "--nfe", "--batch-size", "--timing-prompts", "--rounds",
                    "--variant", "--json", "--write"]},
    "bench_approx": {
        "kv-cache": ["--rounds", "--json"],
        "sparse": ["--demo-dir", "--quick", "--tolerance", "--json"],
        "fp-drift": ["--steps", "--save", "--compare", "--demo-dir", "--quick"]},
    "bench_serve": {
        "load": ["--model", "--d-model", "--layers", "--device", "--clients", "--requests", "--max-batch", "--max-wait-ms",
                 "--sampler", "--steps", "--gen-length", "--timeout-s", "--model-desc", "--write", "--json", "--markdown",
                 "--overwrite", "--no-gc-freeze", "--rounds"],
        "safety": ["--grace-s"]},
}


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          timeout=120)


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
    records = r"environment_note\(\)|run_environment\(\)|write_section\(|write_json\(|environment_record\("
    for path in sorted(BENCH.glob("bench_*.py")):
        text = path.read_text()
        if path.name == "bench_threads.py":  # its children set the threads; the parent records the environment
            assert "bench_environment()" in text and "finish_record" in text
            continue
        if path.name == "bench_demo.py":  # its children are `dsl-llada demo` processes, each with its own record
            assert "environment_record()" in text and "finish_record" in text
            continue
        # their children measure before torch loads; the parent records the run
        if path.name in ("bench_allocator.py", "bench_busy.py"):
            assert "parse_args(ap)" in text and "run_environment()" in text and "ap.parse_args()" in text
            continue
        if path.stem in SUBCOMMANDS:  # benchlib.run_subcommands: parse_args over the subcommands' parsers
            assert "run_subcommands(__doc__, SUBCOMMANDS, argv)" in text, path.name
            continue
        assert re.search(r"\bparse_args\(ap[,)]", text) and "ap.parse_args()" not in text, path.name
        assert re.search(records, text), path.name
    modules = sorted(p for p in (BENCH / "measures").glob("*.py") if p.name != "__init__.py")
    used = {m.__name__ for script in SUBCOMMANDS for m in importlib.import_module(script).SUBCOMMANDS.values()}
    assert {f"measures.{p.stem}" for p in modules} == used  # each module is one script's subcommand
    for path in modules:
        text = path.read_text()
        assert "def add_args(ap" in text and "def run(a" in text and "parse_args(" not in text, path.name
        assert re.search(records, text), path.name


@pytest.mark.parametrize("script", sorted(SUBCOMMANDS))
def test_each_question_script_has_a_subcommand_per_measurement_with_its_options(script):
    mod = importlib.import_module(script)
    ap = benchlib.subcommand_parser(mod.__doc__, mod.SUBCOMMANDS)
    assert list(mod.SUBCOMMANDS) == list(SUBCOMMANDS[script])
    top = ap.format_help()
    subparsers = next(x for x in ap._actions if isinstance(x, argparse._SubParsersAction)).choices
    assert list(subparsers) == list(SUBCOMMANDS[script])
    for name, options in SUBCOMMANDS[script].items():
        assert re.search(rf"^\s+{re.escape(name)}\s+\S", top, re.M), (script, name)  # listed with its help line
        sub = subparsers[name]
        assert sub.get_default("run") is mod.SUBCOMMANDS[name].run and sub.get_default("parser") is sub
        for opt in [*options, "--threads"]:
            assert opt in sub._option_string_actions, (script, name, opt)
        usage = sub.format_help()
        assert f" {name} [-h]" in usage and "--threads THREADS" in usage, (script, name)


def test_parse_args_sets_the_threads_of_a_subcommand(monkeypatch):
    before = torch.get_num_threads()
    try:
        import bench_approx

        ap = benchlib.subcommand_parser(bench_approx.__doc__, bench_approx.SUBCOMMANDS)
        a = benchlib.parse_args(ap, argv=["kv-cache", "--rounds", "2", "--threads", "1"])
        assert (a.command, a.rounds, a.threads) == ("kv-cache", 2, 1) and torch.get_num_threads() == 1
        assert benchlib.run_environment()["threads"]["intra_op"] == 1
        assert "--threads" not in ap._option_string_actions  # on each subcommand, not before it
    finally:
        torch.set_num_threads(before)


def test_a_subcommand_runs_through_its_script(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(torch.tensor([1.0, 2.0]), a)
    torch.save(torch.tensor([1.0, 2.5]), b)
    r = run_script("bench_approx.py", "fp-drift", "--threads", "1", "--compare", str(a), str(b))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["identical"] is False and out["max_abs"] == 0.5
    assert out["environment"]["threads"]["intra_op"] == 1
    r = run_script("bench_approx.py", "fp-drift", "--threads", "1", "--compare", str(a), str(a))
    assert json.loads(r.stdout)["identical"] is True and json.loads(r.stdout)["max_abs"] == 0.0
    for args, message in ((["quant"], "invalid choice: 'quant'"), ([], "the following arguments are required")):
        r = run_script("bench_approx.py", *args)
        assert r.returncode == 2 and message in r.stderr, args


def test_a_demo_folder_without_checkpoints_is_one_clear_error_and_nothing_is_trained(tmp_path):
    demo = tmp_path / "no-demo"
    r = run_script("bench_approx.py", "sparse", "--threads", "1", "--demo-dir", str(demo))
    assert r.returncode == 2 and "error: no cached cpt-dsl stage under" in r.stderr, r.stderr
    assert f"run `dsl-llada demo --out {demo}` first" in r.stderr
    assert not (demo / "cache").exists() or not any((demo / "cache").iterdir())  # no stage was trained


def test_a_rewritten_section_keeps_its_rendered_tables_registered():
    old = ("### T\n\nText.\n\n<!-- docs-table: t-one -->\n| a | b |\n|---|---|\n| x | 1 |\n<!-- /docs-table -->\n\n"
           "<!-- docs-table: t-gone -->\n| c | d |\n|---|---|\n| y | 2 |\n<!-- /docs-table -->\n")
    new = "### T\n\nNew text.\n\n| a | b |\n|---|---|\n| x | 3 |\n| z | 4 |\n\nAfter.\n"
    assert benchlib.keep_table_blocks(old, new) == (
        "### T\n\nNew text.\n\n<!-- docs-table: t-one -->\n| a | b |\n|---|---|\n| x | 3 |\n| z | 4 |\n"
        "<!-- /docs-table -->\n\nAfter.\n")
    assert benchlib.keep_table_blocks(old, "### T\n\nNo table.\n") == "### T\n\nNo table.\n"


def test_the_convert_memory_benchmark_writes_the_dry_runs_estimate_of_llada_8b(tmp_path):
    from dsl_llada.core.backbones.llada import LLaDAConfig
    from dsl_llada.core.quantize import memory_estimate

    out = tmp_path / "res" / "convert_memory_llada8b.json"
    r = run_script("bench_convert_memory.py", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    cfg = LLaDAConfig(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464,
                      weight_tying=False)
    assert res["rows"] == [memory_estimate(cfg, noise_dim=100, dtype=dt, quantize=q)
                           for dt, q in (("float32", "none"), ("bfloat16", "none"), ("bfloat16", "int8"))]
    assert (res["model"], res["parameters"], res["noise_dim"]) == ("LLaDA-8B-Instruct", 8546358786, 100)
    assert res["environment"]["threads"]["intra_op"] == 1 and res["command"].startswith("bench_convert_memory.py")
    # another config.json and noise dimension: the same function's figures for that shape
    (tmp_path / "config.json").write_text(json.dumps({"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 100}))
    r = run_script("bench_convert_memory.py", "--config", str(tmp_path / "config.json"), "--noise-dim", "8")
    small = json.loads(r.stdout)
    assert small["noise_dim"] == 8 and small["rows"][1] == memory_estimate(
        LLaDAConfig(d_model=64, n_layers=2, n_heads=4, vocab_size=100), noise_dim=8, dtype="bfloat16")


def test_the_convert_memory_benchmark_refuses_bad_input_in_one_line(tmp_path):
    r = run_script("bench_convert_memory.py", "--noise-dim", "0")
    assert r.returncode == 2 and r.stderr.strip() == "error: --noise-dim 0 is not valid; give 1 or more"
    (tmp_path / "config.json").write_text(json.dumps({"d_model": 64, "n_layers": 2}))
    r = run_script("bench_convert_memory.py", "--config", str(tmp_path / "config.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "lacks required LLaDA field(s) ['n_heads', 'vocab_size']" in r.stderr


@pytest.mark.parametrize(("script", "args"), [("bench_eval.py", ["--rounds", "0"]),
                                              ("bench_approx.py", ["kv-cache", "--rounds", "0"])])
def test_zero_rounds_is_one_clear_error(script, args):
    r = run_script(script, *args, "--threads", "1")
    assert r.returncode == 2 and r.stderr.strip() == "error: --rounds 0 is not valid; give 1 or more"
