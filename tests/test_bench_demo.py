"""bench_demo.py: its refusals (before any demo runs) and how it reads a demo's own record."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _bd():
    return importlib.import_module("bench_demo")


def _refusal(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        _bd().main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_non_empty_work_folder_is_refused_even_with_overwrite(tmp_path, capsys):
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "mine.txt").write_text("x")
    for extra in ([], ["--overwrite"]):
        assert _refusal(capsys, ["--variants", "quick", "--work", str(tmp_path), *extra]).endswith(
            f"error: --work {str(tmp_path)!r} is not empty; give a new or empty folder")
    assert (tmp_path / "quick" / "mine.txt").read_text() == "x"  # nothing a user made is deleted


def test_an_existing_json_a_repeated_variant_and_an_unknown_one_are_refused(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    work = str(tmp_path / "work")
    assert _refusal(capsys, ["--variants", "quick", "--work", work, "--json", str(out)]).endswith(
        f"error: --json {str(out)!r} exists; pass --overwrite to replace it")
    assert _refusal(capsys, ["--variants", "quick", "quick", "--work", work]).endswith(
        "error: --variants quick quick names a variant twice")
    assert "invalid choice: 'fast'" in _refusal(capsys, ["--variants", "fast", "--work", work])
    assert not (tmp_path / "work").exists()  # nothing is made before the arguments pass


def test_variants_run_the_demo_with_their_arguments_and_environment(tmp_path):
    bd = _bd()
    assert bd.demo_argv("quick", tmp_path)[1:] == ["-m", "dsl_llada", "demo", "--out", str(tmp_path), "--quick"]
    assert bd.demo_argv("avx2", tmp_path)[1:] == ["-m", "dsl_llada", "demo", "--out", str(tmp_path)]
    assert bd.VARIANTS["avx2"][1] == {"ATEN_CPU_CAPABILITY": "avx2"} and bd.VARIANTS["native"] == ([], {})


def test_read_demo_record_takes_the_demos_timings_and_environment(tmp_path):
    bd = _bd()
    (tmp_path / "config.json").write_text(json.dumps(
        {"timings_s": {"dsl_s": 131.987, "total_s": 220.4}, "environment": {"cpu_capability": "AVX2"}}))
    assert bd.read_demo_record(tmp_path) == {"timings_s": {"dsl_s": 131.99, "total_s": 220.4},
                                             "demo_environment": {"cpu_capability": "AVX2"}}
    with pytest.raises(RuntimeError, match="the demo wrote no .*config.json"):
        bd.read_demo_record(tmp_path / "missing")
