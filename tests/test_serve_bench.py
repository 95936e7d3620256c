"""A small run of benchmarks/bench_serve.py: concurrent `openai` clients on loopback, every request answered, every
output equal to the library's for its seed, in all three modes (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dsl_llada.loading import load_model, load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_serve.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_serve"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_small_load_test(tmp_path):
    pytest.importorskip("openai", reason="the load test uses the official openai client (pip install openai)")
    bench = load_bench()
    path = bench.build_tiny_model(tmp_path / "tiny", d_model=32)
    model, tok = load_model(path), load_tokenizer(path)
    # discrete remasking: batched and single runs agree exactly here (the SDE on an untrained random model can flip
    # a near-tie token from batched-matmul rounding; see docs/serving.md)
    result = bench.run_bench(model, tok, clients=4, requests=2, max_batch=4, max_wait_ms=50, sampler="remask",
                             steps=8, gen_length=16, timeout_s=120)
    modes = result["modes"]
    assert [m["mode"] for m in modes] == ["batched (equal-length prompts, default)", "batched with --pad-batches",
                                          "--max-batch 1"]
    assert all(m["answered"] == "8/8" and m["equal_to_library"] == "8/8" for m in modes), modes
    assert modes[2]["mean_batch"] == 1 and modes[1]["mean_batch"] >= 1
    assert len(result["throughput_ratio"]) == 2 and all(r > 0 for r in result["throughput_ratio"])
    text = bench.markdown(result, command="python benchmarks/bench_serve.py", model_desc="tiny")
    assert text.count("| 8/8 | 8/8 |") == 3 and "Throughput ratio" in text
    with pytest.raises(ValueError, match="exceeds the bound"):
        bench.run_bench(model, tok, clients=100, requests=100)


def test_interleaved_rounds(tmp_path):
    pytest.importorskip("openai", reason="the load test uses the official openai client (pip install openai)")
    bench = load_bench()
    path = bench.build_tiny_model(tmp_path / "tiny", d_model=32)
    model, tok = load_model(path), load_tokenizer(path)
    result = bench.run_rounds(model, tok, rounds=2, clients=3, requests=1, sampler="remask", steps=4, gen_length=8)
    assert result["single_client_equal_to_library"] == "2/2"
    assert {k: len(v) for k, v in result["seconds"].items()} == {
        "generate": 2, "server, 1 client": 2, "sampler, batch 1": 2, "sampler, batch N": 2, "batched, N clients": 2,
        "--max-batch 1, N clients": 2}
    assert 1 <= result["mean_batch"] <= 3 and result["sampler_ceiling"]["min"] > 0
    assert result["latency_ratio"]["min"] <= result["latency_ratio"]["median"] <= result["latency_ratio"]["max"]
    text = bench.markdown_rounds(result, command="python benchmarks/bench_serve.py --rounds 2", model_desc="tiny")
    assert "Single-client latency / `generate`" in text and '"load_average_start"' in text
    assert "the ceiling of that ratio" in text
    with pytest.raises(ValueError, match="rounds=0"):
        bench.run_rounds(model, tok, rounds=0)
