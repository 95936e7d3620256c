"""benchmarks/bench_walltime.py, bench_threshold.py and bench_train.py at tiny CPU shapes: their JSON's structure,
the committed prompt lengths against the data, parameter and FLOP counts by hand, option checks (no timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from eval_fixtures import data_dir

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import bench_train  # noqa: E402
import bench_walltime  # noqa: E402

from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config  # noqa: E402


def run(script: str, args, tmp_path, check=True):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{BENCH}", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(BENCH / script), "--threads", "1", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300, check=check)


def test_committed_prompt_lengths_are_those_of_the_data():
    committed = json.loads((BENCH / "prompt_lengths.json").read_text())
    assert bench_walltime.prompt_lengths(data_dir()) == committed
    xsum = committed["datasets"]["xsum"]
    assert xsum["gen_length"] == 128 and len(xsum["prompt_tokens"]) == 20
    assert all(t == -(-w * 13 // 10) + 10 for w, t in zip(xsum["words"], xsum["prompt_tokens"], strict=True))
    assert [d["gen_length"] for d in committed["datasets"].values()] == [128, 256, 256, 256]


def test_train_parameter_and_flop_counts_by_hand():
    s = bench_train.TINY
    model = LLaDABackbone(tiny_llada_config(s["vocab_size"], d_model=s["d_model"], n_layers=s["n_layers"],
                                            n_heads=s["n_heads"], mlp_hidden_size=s["mlp_hidden_size"]))
    assert bench_train.parameters(s)["total"] == sum(p.numel() for p in model.parameters())
    d, F_, V, L, T, N = 64, 176, 1024, 2, 64, 32
    block = 2 * (4 * d * d + 3 * d * F_ + 2 * T * d)
    assert bench_train.train_flops_per_token(s) == 3 * (L * block + 2 * d * V + 2 * N * (V + 1) + 2 * (V + 1) * d)
    assert bench_train.parameters(bench_train.FULL)["total"] == pytest.approx(1.34e9, rel=0.01)


def test_walltime_threshold_and_train_run_at_a_tiny_shape(tmp_path):
    run("bench_walltime.py", ["--device", "cpu", "--layers", "1", "--datasets", "xsum", "--nfe", "2", "--samples", "1",
                              "--threshold-samples", "1", "--batch", "2", "--batched-nfe", "2", "--json", "w.json"],
        tmp_path)
    w = json.loads((tmp_path / "w.json").read_text())
    assert not w["full_shape"] and w["scope"].startswith("REDUCED") and w["results"]["skipped"] == []
    assert len(w["results"]["eager"]["xsum"]["2"]) == 1 and w["results"]["batched"]["xsum"]["batch"] == 2
    assert 4 <= w["results"]["threshold"]["xsum"]["forward_passes"][0] <= 128  # blocks of 32 .. one token per step
    assert w["paper_h100_sde_s"]["8"] == {"xsum": 0.76, "cnndm": 1.32, "pubmed": 2.21, "arxiv": 2.24}
    assert "| xsum | 221 | 128 | 2 |" in w["table"]

    run("bench_threshold.py", ["--device", "cpu", "--layers", "1", "--batches", "2", "--prompt", "8", "--gen-length",
                               "32", "--fixed-steps", "8", "--reps", "1", "--json", "t.json"], tmp_path)
    t = json.loads((tmp_path / "t.json").read_text())["results"]["2"]
    assert t["fixed"]["forward_passes"] == 8 and len(t["threshold"]["steps_per_block"]) == 2
    assert t["threshold"]["tokens_per_forward"] == 32 / t["threshold"]["forward_passes"]

    run("bench_train.py", ["--tiny", "--steps", "4", "--json", "r.json"], tmp_path)
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["steps"] == 4 and r["device"] == "cpu" and len(r["losses"]) == 4 and r["tokens_per_s"] > 0
    assert r["mfu"] == pytest.approx(r["train_flops_per_token"] * r["tokens_per_s"] / (r["matmul_peak_tflops"] * 1e12))


@pytest.mark.parametrize("script,args,fragment", [
    ("bench_walltime.py", ["--samples", "50"], "--samples 50 is out of range: it must be in [1, 20]"),
    ("bench_walltime.py", ["--nfe", "7"], "NFE 7 is not valid: the Heun SDE needs an even NFE"),
    ("bench_walltime.py", ["--write-lengths", "x.json"], "--write-lengths needs --data-dir"),
    ("bench_walltime.py", ["--write-lengths", str(BENCH / "prompt_lengths.json"), "--data-dir", "."],
     "prompt_lengths.json exists: pass --overwrite to replace it"),
    ("bench_threshold.py", ["--gen-length", "48"], "--gen-length 48 must be a multiple of the block length 32"),
    ("bench_train.py", ["--tiny", "--steps", "0"], "--steps 0 is out of range: it must be in [1, 2000]"),
])
def test_bad_options_are_one_clear_error(script, args, fragment, tmp_path):
    r = run(script, ["--device", "cpu", *args] if script != "bench_train.py" else args, tmp_path, check=False)
    assert r.returncode == 2 and fragment in r.stderr
