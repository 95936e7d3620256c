"""The environment record: what it captures and that capturing it changes nothing."""

from __future__ import annotations

import json

import torch

from dsl_llada import __version__
from dsl_llada.environment import environment_record, finish_record, has_native_bf16, usable_cpus


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
