"""The environment record: what it captures and that capturing it changes nothing."""

from __future__ import annotations

import json

import pytest

import torch

from dsl_llada import __version__
from dsl_llada.runtime.environment import environment_record, finish_record, has_native_bf16, usable_cpus


def test_record_names_versions_cpu_threads_and_seeds():
    threads = torch.get_num_threads()
    rec = environment_record(device="cpu", dtype=torch.bfloat16, seeds=[3, 4])
    json.dumps(rec)  # JSON-ready
    assert rec["dsl_llada"] == __version__
    assert rec["libraries"]["torch"] == torch.__version__
    assert rec["dtype"] == "bfloat16" and rec["device"] == "cpu" and rec["seeds"] == [3, 4]
    assert rec["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert rec["threads"]["intra_op"] == threads == torch.get_num_threads()  # read, not changed
    assert 1 <= rec["usable_cpus"] == usable_cpus()
    assert "gpu" not in rec


def test_finish_adds_the_end_load_and_leaves_the_start_record_alone():
    rec = environment_record()
    done = finish_record(rec)
    assert "load_average_end" in done and "load_average_end" not in rec
    assert {k: v for k, v in done.items() if k != "load_average_end"} == rec


def test_native_bf16_follows_the_flags_not_the_vendor():
    assert has_native_bf16(frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert has_native_bf16(frozenset({"amx_bf16", "amx_tile"}))
    assert not has_native_bf16(frozenset({"avx2", "fma", "avx512f"}))
    assert not has_native_bf16(frozenset())


def test_set_threads_sets_returns_and_bounds_the_count(monkeypatch):
    from dsl_llada.runtime.environment import MAX_THREADS, default_threads, set_threads

    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 == torch.get_num_threads() == environment_record()["threads"]["intra_op"]
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert default_threads() == usable_cpus()
        assert set_threads(None) == usable_cpus() == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a launcher fixed it: keep the count torch runs with
        torch.set_num_threads(1)
        assert default_threads() == 1
        for bad in (0, -1, MAX_THREADS + 1, True, "2", 1.5):
            with pytest.raises(ValueError, match="threads must be an integer"):
                set_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_footer_names_code_cpu_threads_and_load():
    from dsl_llada.runtime.environment import environment_footer

    rec = finish_record(environment_record(device="cpu", dtype=torch.float32, seeds=[7]))
    line = environment_footer(rec)
    assert line.startswith("Environment: dsl-llada ") and rec["cpu_capability"] in line
    assert f"{rec['threads']['intra_op']} intra-op threads of {rec['usable_cpus']} usable CPUs" in line
    assert "seeds [7]" in line and "float32" in line and "->" in line
    assert "predates" in environment_footer(None)


def test_every_computing_command_takes_threads_and_main_sets_it(capsys):
    from dsl_llada.cli.main import COMPUTING, build_parser, main

    parser = build_parser()
    for cmd in COMPUTING:
        with pytest.raises(SystemExit):
            parser.parse_args([*cmd.split(), "--help"])
        assert "--threads N" in capsys.readouterr().out, cmd
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["generate", "--model", "m", "--threads", "0"])
    assert e.value.code == 2 and "--threads must be an integer from 1 to 1024, got '0'" in capsys.readouterr().err
    before = torch.get_num_threads()
    try:
        # the count is set before the command runs (this one then fails at once: no prompt)
        assert main(["generate", "--model", "/nonexistent-model", "--threads", "1"]) == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_record_file_stores_each_runs_environment_without_comparing_it(tmp_path):
    from dsl_llada.artifacts.records import RecordFile

    out = tmp_path / "out.jsonl"
    settings = {"sampler": "sde", "seed": 1}
    first = RecordFile.open(out, settings, environment={"run": 1, "load_average_start": 0.5})
    first.begin()
    first.append([{"index": 0}])
    first.close()
    stored = json.loads((tmp_path / "out.jsonl.config.json").read_text())
    assert stored == {**settings, "environment": {"run": 1, "load_average_start": 0.5}}
    again = RecordFile.open(out, settings, environment={"run": 2, "load_average_start": 9.0})  # not a setting
    assert set(again.done) == {0}
    again.begin()
    again.append([{"index": 1}])
    again.finish(2)
    stored = json.loads((tmp_path / "out.jsonl.config.json").read_text())
    assert stored["environment"] == {"run": 1, "load_average_start": 0.5}
    assert [e["run"] for e in stored["resumed_environments"]] == [2]
    assert "load_average_end" in stored["resumed_environments"][0]
    assert {k: v for k, v in stored.items() if "environment" not in k} == settings
