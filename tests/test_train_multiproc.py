"""Multi-process training on CPU: DDP (2 processes under `accelerate launch`) and FSDP2 (`fully_shard` under torchrun
with gloo), each compared with a 1-process run of the same global batch; DeepSpeed / accelerate-FSDP launches need
GPUs and are skipped on CPU.

What has to match for a 2-process run to equal a 1-process run with the doubled per-device batch:
- the global batch composition: blocks are dealt round-robin (block j to rank j % 2) and shuffling is off, so in every
  micro-batch rank 0 holds block 2i and rank 1 block 2i+1, exactly the two rows of the 1-process micro-batch i;
- the noise: the trainer seeds each process's objective generator with seed + rank, so a registered objective
  would corrupt the same sequence differently in the two layouts. The launch script therefore uses
  `ContentSeededObjective`, which seeds each sequence's noise from its own tokens and averages per-sequence losses;
- the reduction: DDP / FSDP average gradients over processes, the 1-process run averages the loss over its 2 rows,
  and accelerate divides by grad_accum in both, so gradients agree up to float summation order (hence a tolerance,
  not bit equality, against the 1-process run; across ranks the logged losses and DDP parameters are identical).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))

from train_common import ContentSeededObjective, corpus, letters, make_backbone_dir, multiproc_config, \
    param_checksum

from dsl_llada.core.backbones import load_backbone
from dsl_llada.core.model import DSLModel
from dsl_llada.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "ddp_train.py"
BIN = Path(sys.executable).parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory) -> Path:
    return make_backbone_dir(tmp_path_factory.mktemp("mp") / "backbone")


def accelerate_launch() -> list[str]:
    exe = BIN / "accelerate"
    return [str(exe), "launch"] if exe.exists() else [sys.executable, "-m", "accelerate.commands.launch"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], steps: int, timeout: int = 240, **env_vars: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STEPS": str(steps), "HF_HUB_OFFLINE": "1", **env_vars}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def read_ranks(out: Path, steps: int) -> list[dict]:
    return [json.loads((out / f"rank-{r}-{steps}.json").read_text()) for r in (0, 1)]


def single_process(objective: str, backbone: Path, out: Path, steps: int):
    cfg = multiproc_config(objective, backbone, out, world_size=1, steps=steps)
    return train(cfg, tokenizer=letters, texts=corpus(40), objective=ContentSeededObjective(objective))


def assert_close_models(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-5) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.allclose(sa[k].float(), sb[k].float(), atol=atol, rtol=1e-4), k


def test_ddp_two_processes_match_one_process_with_double_batch(backbone_dir, tmp_path):
    out = tmp_path / "ddp"
    cmd = accelerate_launch() + [
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(free_port()), str(SCRIPT), str(backbone_dir), str(out), "mdm"]
    launch(cmd, steps=5, ACCELERATE_USE_CPU="true")
    r0, r1 = read_ranks(out, 5)
    assert r0["losses"] == r1["losses"] and len(r0["losses"]) == 5
    assert r0["checksum"] == r1["checksum"], "DDP replicas diverged"
    assert r0["checksum"] == param_checksum(load_backbone(r0["final_model"])), "saved model != trained replicas"

    ref = single_process("mdm", backbone_dir, tmp_path / "single", 5)
    for step, loss in r0["losses"].items():
        assert loss == pytest.approx(ref.losses[int(step)], rel=1e-5, abs=1e-6), step
    assert_close_models(load_backbone(r0["final_model"]), ref.model)
    # monitoring runs through the DDP module on both processes; the noise-free clean CE sees the same 4 blocks
    assert r0["evals"]["5"]["eval/clean/ce"] == pytest.approx(ref.evals[5]["eval/clean/ce"], rel=1e-5)
    assert param_checksum(ref.model) == param_checksum(load_backbone(ref.final_model))
    assert param_checksum(ref.model) != r0["checksum"]  # float summation order differs: close, not bit-equal


def test_fsdp2_torchrun_matches_one_process_and_resumes(backbone_dir, tmp_path):
    """DSL objective (the converter's scalar beta stays replicated: fully_shard refuses 0-d parameters); 3 updates,
    then a second launch resumes from checkpoint-3 (full optimizer state broadcast from rank 0) to update 5."""
    out = tmp_path / "fsdp"
    torchrun = [str(BIN / "torchrun")] if (BIN / "torchrun").exists() else [sys.executable, "-m", "torch.distributed.run"]

    def cmd() -> list[str]:
        return torchrun + ["--nproc_per_node", "2", "--master_port", str(free_port()), str(SCRIPT), str(backbone_dir),
                           str(out), "dsl", "fsdp2"]

    launch(cmd(), steps=3)
    first = read_ranks(out, 3)
    assert first[0]["losses"] == first[1]["losses"] and len(first[0]["losses"]) == 3
    assert (out / "run" / "checkpoint-3" / "trainer_state" / "optimizer.safetensors").is_file()
    # the gathered shards are the same model on both processes, and the one saved at step 3
    assert first[0]["checksum"] == first[1]["checksum"]
    assert first[0]["checksum"] == param_checksum(DSLModel.from_pretrained(out / "run" / "checkpoint-3"))
    launch(cmd(), steps=5)
    second = read_ranks(out, 5)
    assert second[0]["losses"] == second[1]["losses"] and second[0]["start_step"] == 3
    assert sorted(map(int, second[0]["losses"])) == [4, 5]
    assert second[0]["checksum"] == second[1]["checksum"] != first[0]["checksum"]
    assert second[0]["checksum"] == param_checksum(DSLModel.from_pretrained(second[0]["final_model"]))

    ref = single_process("dsl", backbone_dir, tmp_path / "single", 5)
    losses = {**first[0]["losses"], **second[0]["losses"]}
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[int(step)], rel=1e-5, abs=1e-6), step
    assert_close_models(DSLModel.from_pretrained(second[0]["final_model"]), ref.model)
    # monitoring through the sharded root's forward (FSDP unshards the converter there) on every process
    ev = second[0]["evals"]["5"]
    assert ev == second[1]["evals"]["5"] and ev["eval/clean/ce"] == pytest.approx(ref.evals[5]["eval/clean/ce"], rel=1e-5)
    assert ev["eval/converter/beta"] == pytest.approx(ref.evals[5]["eval/converter/beta"], rel=1e-5)
    assert "eval/fixed_snr/snr=50/acc" in ev and "3" in first[0]["evals"]


# -- GPU-only launch paths (DeepSpeed ZeRO-2 and accelerate's FSDP config), skipped on CPU ------------------------
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("preset", ["deepspeed_zero2.yaml", "fsdp.yaml", "ddp.yaml"])
def test_gpu_launch_presets(backbone_dir, tmp_path, preset):  # pragma: no cover - GPU only
    if preset.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    out = tmp_path / preset.split(".")[0]
    cmd = accelerate_launch() + ["--config_file", str(ROOT / "configs" / preset), "--num_processes", "2",
           "--main_process_port", str(free_port()), str(SCRIPT), str(backbone_dir), str(out), "dsl"]
    launch(cmd, steps=5, timeout=600)
    r0, r1 = read_ranks(out, 5)
    assert r0["losses"] == r1["losses"]
    assert all(v == v and abs(v) < 1e4 for v in r0["losses"].values())
    shutil.rmtree(out, ignore_errors=True)


def test_accelerate_launch_dash_m_dsl_llada_train(tmp_path):
    """The documented entry point: `accelerate launch ... -m dsl_llada train --config PRESET key=value ...`, here with
    the toy preset on 2 CPU processes; world_size=2 makes the run refuse a silent 1-process launch."""
    out = tmp_path / "toy"
    cmd = accelerate_launch() + ["--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "-m", "dsl_llada", "train", "--config", "configs/toy.yaml", f"output_dir={out}", "world_size=2",
           "max_steps=2", "save_every=1", "eval_every=2", "data.block_size=32", "per_device_batch_size=2", "-q"]
    launch(cmd, steps=0, ACCELERATE_USE_CPU="true")
    assert (out / "checkpoint-2" / "trainer_state" / "rank-1.json").is_file()
    state = json.loads((out / "checkpoint-2" / "trainer_state" / "state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 2
    assert DSLModel.from_pretrained(out / "final").vocab_size == 258
