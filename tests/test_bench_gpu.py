"""benchmarks/bench_gpu.py at a tiny CPU configuration: the JSON's structure, FLOP counts derived by hand for a
known shape, MFU = FLOPs / (time x measured peak), and its option checks (no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import benchlib  # noqa: E402

TINY = ["--device", "cpu", "--dtype", "float32", "--preset", "small", "--layers", "1", "--batches", "1", "2",
        "--reps", "1", "--prompt", "16", "--response", "16", "--threads", "1", "--peak-n", "256"]

# preset "small" at 1 layer: d 512, MLP 1376, V 4096, noise dim 100, top-M 512; prompt 16 + response 16 (T = 32)
D, F, V, N, M, P, R = 512, 1376, 4096, 100, 512, 16, 16
T = P + R
BLOCK_PER_TOKEN = 2 * (4 * D * D + 3 * D * F + 2 * T * D)  # q, k, v, out + gate, up, down + scores, values
HEAD_ROW, SLOTS_ROW, VALUES_ROW, POST_ROW = 2 * D * V, 2 * N * (V + 1), 2 * (V + 1) * D, 2 * M * N


def run(args, tmp_path, check=True):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(BENCH / "bench_gpu.py"), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300, check=check)


def test_call_flops_by_hand():
    f = benchlib.call_flops(d_model=D, n_layers=1, mlp_hidden=F, vocab=V, prompt=P, response=R, noise_dim=N,
                            batch=2, top_m=M)
    assert BLOCK_PER_TOKEN == 6_389_760
    assert f["blocks"] == 2 * T * BLOCK_PER_TOKEN == 408_944_640
    assert f["head"] == 2 * R * HEAD_ROW == 134_217_728
    assert f["converter_slots"] == 2 * R * SLOTS_ROW == 26_220_800
    assert f["converter_values"] == 2 * R * VALUES_ROW == 134_250_496
    assert f["top_m_posterior"] == 2 * R * POST_ROW == 3_276_800
    assert f["total"] == sum(v for k, v in f.items() if k != "total")
    # grouped-query attention: k and v project to n_kv_heads x head_dim only
    assert benchlib.block_flops_per_token(D, F, T, D // 4) == 2 * (2 * D * D + 2 * D * D // 4 + 3 * D * F + 2 * T * D)


def test_tiny_cpu_run(tmp_path):
    out = tmp_path / "out"
    res = run(TINY + ["--out", str(out), "--quantize", "int8"], tmp_path)
    assert "matmul peak 256^3 float32 done" in res.stdout and "0 part(s) failed" in res.stdout
    r = json.loads((out / "bench_gpu.json").read_text())
    md = (out / "bench_gpu.md").read_text()
    assert md.startswith("### GPU: SDE NFE 16") and "Environment: " in md and "Command: `" in md
    assert md.count("\n| 1 |") == 1 and md.count("\n| 2 |") == 1
    assert r["errors"] == [] and set(r["batches"]) == {"1", "2"}
    assert r["environment"]["dtype"] == "float32" and r["environment"]["threads"]["intra_op"] == 1
    pk = r["peak"]
    assert pk["n"] == 256 and len(pk["times_s"]) == 10 and pk["flops"] == 2 * 256 ** 3
    assert pk["flops_per_s"] == pytest.approx(pk["flops"] / pk["median_s"]) and pk["datasheet_tflops"] is None
    peak = pk["flops_per_s"]
    assert r["model"] == {**r["model"], "d_model": D, "n_layers": 1, "mlp_hidden": F, "vocab": V, "noise_dim": N}
    for b in (1, 2):
        x = r["batches"][str(b)]
        call = x["call"]
        # the denoiser runs the blocks over prompt + response and the head on the response rows only: done = needed
        assert call["counted"] == {"forwards": 1, "head_rows": b * R, "converter_rows": b * R, "posterior_rows": b * R}
        expect = {"blocks": b * T * BLOCK_PER_TOKEN, "head": b * R * HEAD_ROW, "converter_slots": b * R * SLOTS_ROW,
                  "converter_values": b * R * VALUES_ROW, "top_m_posterior": b * R * POST_ROW}
        expect["total"] = sum(expect.values())
        assert call["flops_done"] == expect == call["flops_needed"]
        assert call["mfu"] == pytest.approx(expect["total"] / (call["ms_per_call"] / 1e3 * peak))
        sde = x["sde"]
        n = sde["forward_passes"]
        assert sde["counted"]["forwards"] == n > 16 and sde["counted"]["head_rows"] == n * b * R
        posts = sde["counted"]["posterior_rows"]
        assert posts == (n - 1) * b * R  # the final decode reads logits without a posterior mean
        assert sde["flops_done"]["total"] == n * (expect["total"] - expect["top_m_posterior"]) + posts * POST_ROW
        assert sde["mfu"] == pytest.approx(sde["flops_done"]["total"] / (sde["s_per_batch"] * peak))
        assert sde["s_per_sample"] == pytest.approx(sde["s_per_batch"] / b)
        assert sde["tokens_per_s"] == pytest.approx(b * R / sde["s_per_batch"])
        rm = x["remask"]
        assert rm["forward_passes"] == rm["counted"]["forwards"] == 16 and rm["counted"]["converter_rows"] == 0
        assert rm["head_rows_needed"] == b * sum(range(1, R + 1))  # one token per row committed per step
        assert rm["counted"]["head_rows"] >= rm["head_rows_needed"]
        assert rm["flops_done"]["blocks"] == 16 * b * T * BLOCK_PER_TOKEN
        assert rm["flops_done"]["head"] == rm["counted"]["head_rows"] * HEAD_ROW
        assert rm["mfu"] == pytest.approx(rm["flops_done"]["total"] / (rm["s_per_batch"] * peak))
        assert x["peak_memory_bytes"] is None  # CPU: no CUDA allocator statistics
    assert r["batches"]["1"]["remask"]["counted"]["head_rows"] == sum(range(1, R + 1))
    q = r["quantize"]
    try:
        import torchao  # noqa: F401
    except ImportError:
        assert "torchao" in q["skipped"] and "int8: skipped" in md
    else:  # batch 1 only (8 exceeds the largest batch run); CPU: no allocator statistics for the weights
        assert set(q["calls"]) == {"1"} and q["calls"]["1"]["ms_per_call"] > 0 and q["weight_bytes_after"] is None
        assert 0 <= q["identical_tokens"] <= 1 and 0 <= q["same_argmax_one_forward"] <= 1
        assert "int8 weight-only backbone: weights" in md


def test_options_and_bad_input(tmp_path):
    help_text = run(["--help"], tmp_path).stdout
    for opt in ("--device", "--dtype", "--preset", "--layers", "--batches", "--prompt", "--response", "--reps",
                "--peak-n", "--quantize", "--quick", "--out", "--json", "--markdown", "--threads", "--compile",
                "--compile-batches"):
        assert opt in help_text, opt
    for args, msg in ((["--batches", "0"], "--batches=0 must be in 1..256"),
                      (["--response", "20"], "--response=20 must be a multiple of 16"),
                      (["--layers", "99"], "--layers=99 must be in 1..64"),
                      (["--compile-batches", "0"], "--compile-batches=0 must be in 1..256"),
                      ([], "give --out DIR")):
        res = run(["--device", "cpu", *args], tmp_path, check=False)
        assert res.returncode == 2 and msg in res.stderr, (args, res.stderr)
    assert not list(tmp_path.iterdir())  # nothing written before the checks pass


def test_compiled_part_compares_with_eager_of_the_same_run(monkeypatch):
    """--compile's part, plumbing only (a real inductor compile takes minutes on this CPU): torch.compile replaced
    by the identity, so the compiled figures must come from the compiled route (compiled once, reused) and its
    tokens equal eager's exactly; the speed-ups are eager / compiled of the same run."""
    from types import SimpleNamespace

    import torch

    import bench_gpu
    import dsl_llada.core.backbones.base as base

    seen = []
    monkeypatch.setattr(base.torch, "compile", lambda m: seen.append(m) or m)
    torch.set_num_threads(1)
    model = bench_gpu.build("small", 1, "cpu", torch.float32)
    a = SimpleNamespace(prompt=P, response=R, reps=1, compile_batches=[1])
    pb = bench_gpu.prompts(model, 1, P, "cpu")
    with torch.no_grad():
        eager = {"1": {"call": bench_gpu.sde_call(model, pb, a, "cpu", None),
                       "sde": bench_gpu.whole("sde", model, pb, a, "cpu", None),
                       "remask": bench_gpu.whole("remask", model, pb, a, "cpu", None)}}
        assert seen == []
        result = {"errors": []}
        res = bench_gpu.compiled_runs(model, a, "cpu", None, eager, bench_gpu.Run(result))
    assert result["errors"] == [] and seen == [model.backbone]
    c = res["1"]
    assert c["identical_tokens_vs_eager"] == 1.0 and c["first_call_s"] > 0
    assert c["call_speedup"] == pytest.approx(eager["1"]["call"]["ms_per_call"] / c["call"]["ms_per_call"])
    assert c["sde_speedup"] == pytest.approx(eager["1"]["sde"]["s_per_sample"] / c["sde"]["s_per_sample"])
    assert c["sde"]["ids"] == eager["1"]["sde"]["ids"] and len(c["sde"]["ids"][0]) == R
    assert c["remask_identical_tokens_vs_eager"] == 1.0 and c["remask"]["forward_passes"] == 16
    assert c["remask_speedup"] == pytest.approx(eager["1"]["remask"]["s_per_sample"] / c["remask"]["s_per_sample"])
    md = bench_gpu.markdown({"config": {"preset": "small", "dtype": "float32"}, "environment": {}, "errors": [],
                             "batches": {}, "compiled": res}, "cmd")
    assert "torch.compile'd backbone (`SDEConfig.compile`), batch 1" in md and "tokens equal to eager's: 100.0 %" in md
    assert "torch.compile'd backbone (`RemaskConfig.compile`), batch 1" in md
