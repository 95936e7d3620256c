"""`dsl-llada eval run` as real processes: killed with SIGKILL mid-run and started again gives exactly the
records of an uninterrupted run; two processes under `accelerate launch` give exactly the 1-process records."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.shards import read_records
from dsl_llada.eval.runner import run_eval

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TIMING = ("seconds", "batch_seconds", "batch_size")
pytestmark = pytest.mark.usefixtures("one_thread")


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}


def strip(recs):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, eval_models):  # noqa: F811
    d = data_dir()
    root = tmp_path_factory.mktemp("eval-mp")
    models = eval_models
    tasks = [{"name": "generation", "datasets": [{"name": "prompts", "path": str(d / "prompts_200.jsonl"), "limit": 4,
                                                  "gen_length": 8}]},
             {"name": "reasoning", "datasets": [{"name": "gsm8k", "path": str(d / "gsm8k_100.jsonl"), "limit": 4,
                                                 "gen_length": 8}]}]
    cfg = base_config(models, tasks, batch_size=2)
    path = root / "cfg.json"
    path.write_text(json.dumps(cfg))
    ref = root / "ref"
    run_eval(EvalConfig.from_dict(cfg), ref, progress=False, report=False)
    return path, strip(read_records(ref)), root


def test_kill_9_then_resume(setup):
    path, ref, root = setup
    out = root / "killed"
    cmd = [sys.executable, "-m", "dsl_llada", "eval", "run", "--config", str(path), "--out", str(out), "-q", "--no-report"]
    proc = subprocess.Popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    shard = out / "shards" / "rank-0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if shard.exists() and shard.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = shard.read_bytes().count(b"\n")
    assert 3 <= done_before < len(ref)
    res = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["run_now"] == len(ref) - done_before  # finished items were not re-run
    assert strip(read_records(out)) == ref


def test_two_processes_equal_one(setup):
    path, ref, root = setup
    out = root / "two"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = BIN / "accelerate"
    launch = [str(exe), "launch"] if exe.exists() else [sys.executable, "-m", "accelerate.commands.launch"]
    cmd = launch + ["--multi_gpu", "--num_processes", "2", "--main_process_port", str(port), "-m", "dsl_llada",
                    "eval", "run", "--config", str(path), "--out", str(out), "-q", "--no-report"]
    res = subprocess.run(cmd, env={**env(), "ACCELERATE_USE_CPU": "true"}, cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0, res.stderr[-4000:]
    line = json.loads([x for x in res.stdout.splitlines() if x.startswith("{")][-1])
    assert line["world_size"] == 2 and line["items"] == len(ref)
    n0 = (out / "shards" / "rank-0.jsonl").read_bytes().count(b"\n")
    n1 = (out / "shards" / "rank-1.jsonl").read_bytes().count(b"\n")
    assert n0 > 0 and n1 > 0 and n0 + n1 == len(ref)
    assert strip(read_records(out)) == ref
