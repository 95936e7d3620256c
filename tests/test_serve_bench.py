"""A small run of `benchmarks/bench_serve.py load`: concurrent `openai` clients on loopback, every request answered,
every output equal to the library's for its seed, in all three modes (no timing is asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dsl_llada.core.loading import load_model, load_tokenizer

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import bench_serve  # noqa: E402
from benchlib import subcommand_parser  # noqa: E402
from measures import serve_load  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def load_bench():
    """The `load` subcommand's module (`benchmarks/measures/serve_load.py`)."""
    return serve_load


def load_parser(argv: list[str]):
    """The script's parser (`bench_serve.py`) on `argv`: the subcommand's own parser and the parsed arguments."""
    a = subcommand_parser(bench_serve.__doc__, bench_serve.SUBCOMMANDS).parse_args(argv)
    return a.parser, a


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
    assert [m["mode"] for m in modes] == ["batched (default)", "--max-batch 1"]
    assert all(m["answered"] == "8/8" and m["equal_to_library"] == "8/8" for m in modes), modes
    assert modes[1]["mean_batch"] == 1 and modes[0]["mean_batch"] >= 1
    assert len(result["throughput_ratio"]) == 1 and all(r > 0 for r in result["throughput_ratio"])
    text = bench.markdown(result, command="python benchmarks/bench_serve.py load", model_desc="tiny")
    assert text.count("| 8/8 | 8/8 |") == 2 and "Throughput ratio" in text
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
    text = bench.markdown_rounds(result, command="python benchmarks/bench_serve.py load --rounds 2", model_desc="tiny")
    assert "Single-client latency / `generate`" in text and '"load_average_start"' in text
    assert "the ceiling of that ratio" in text
    with pytest.raises(ValueError, match="rounds=0"):
        bench.run_rounds(model, tok, rounds=0)
    assert result["device"] == "cpu" and "gpu" not in result and "model on" not in text
    on_gpu = bench.markdown_rounds({**result, "device": "cuda:0", "gpu": "Some GPU"}, command="c", model_desc="tiny")
    assert "in one process, model on cuda:0 (Some GPU), " in on_gpu


def test_options_and_their_checks(tmp_path, capsys):
    bench = load_bench()
    ap, a = load_parser(["load"])
    help_text = ap.format_help()
    for opt in ("--device {cpu,cuda}", "--json PATH", "--markdown PATH", "--overwrite", "--rounds", "--write",
                "--threads THREADS"):
        assert opt in help_text, opt
    assert (a.device, a.json, a.markdown, a.overwrite, a.threads) == ("cpu", None, None, False, 1)
    bench.check_args(ap, a)  # the defaults pass
    taken = tmp_path / "r.json"
    taken.write_text("{}")
    for argv, message in ((["--json", str(taken)], f"--json '{taken}' exists; pass --overwrite"),
                          (["--markdown", str(tmp_path)], f"--markdown '{tmp_path}' is a folder"),
                          (["--json", str(tmp_path / "x"), "--markdown", str(tmp_path / "x")], "are the same file")):
        with pytest.raises(SystemExit) as e:
            bench.check_args(*load_parser(["load", *argv]))
        assert e.value.code == 2 and message in capsys.readouterr().err, argv
    bench.check_args(*load_parser(["load", "--json", str(taken), "--overwrite"]))
    with pytest.raises(SystemExit) as e:
        load_parser(["load", "--device", "tpu"])
    assert e.value.code == 2 and "invalid choice: 'tpu'" in capsys.readouterr().err
    _, safety = load_parser(["safety", "--grace-s", "3"])
    assert safety.grace_s == 3.0 and safety.run.__module__ == "measures.serve_safety"
    with pytest.raises(SystemExit) as e:
        load_parser(["stress"])
    assert e.value.code == 2 and "invalid choice: 'stress'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_one_clear_error_before_any_work(tmp_path, monkeypatch, capsys):
    bench = load_bench()
    monkeypatch.setattr(bench, "build_tiny_model", lambda *a, **k: pytest.fail("the model was built"))
    monkeypatch.setattr(sys, "argv", ["bench_serve.py", "load", "--device", "cuda", "--json", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit) as e:
        bench_serve.main()
    assert e.value.code == 2
    assert "--device 'cuda': no CUDA GPU is available on this machine; use --device cpu" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_main_writes_json_and_markdown(tmp_path, monkeypatch, capsys):
    pytest.importorskip("openai", reason="the load test uses the official openai client (pip install openai)")
    out = tmp_path / "out"  # created by the run
    monkeypatch.setattr(sys, "argv", [
        "bench_serve.py", "load", "--device", "cpu", "--d-model", "32", "--rounds", "1", "--clients", "2", "--requests", "1",
        "--sampler", "remask", "--steps", "2", "--gen-length", "8", "--no-gc-freeze", "--json", str(out / "r.json"),
        "--markdown", str(out / "r.md")])
    assert bench_serve.main() == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert 'round 1/1: {"generate": ' in captured.err  # each round's timings as it ends
    record = json.loads((out / "r.json").read_text())
    assert set(record) == {"command", "model", "result", "environment"}
    assert record["result"]["device"] == "cpu" and record["environment"]["device"] == "cpu"
    assert record["result"]["rounds"] == 1 and record["result"]["single_client_equal_to_library"] == "1/1"
    assert "load_average_end" in record["environment"]
    assert record["command"].startswith("python benchmarks/bench_serve.py load --device cpu --d-model 32")
    md = (out / "r.md").read_text()
    assert md.strip() in printed and md.startswith("\n### Serving: single-client latency and 2-client throughput")
    assert md.rstrip().endswith("(machine shared with other jobs unless stated)")
    assert sorted(p.name for p in out.iterdir()) == ["r.json", "r.md"]
