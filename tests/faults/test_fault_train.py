"""Training faults (numbered as in docs/reliability.md's fault-injection table): honest resume (1), one writer per run
folder (4), resuming an older checkpoint (5), a full disk during a checkpoint (8), damaged checkpoints with
resume='auto' and explicit resume (12, 16)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest
from fault_utils import run_cli, train_argv
from faults_helpers import error_lines, snapshot

from dsl_llada.cli.main import main


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def lrs(record: dict) -> dict[str, float]:
    return {k: v for k, v in record.items() if k.startswith("lr")}


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    """A finished 4-step toy run with checkpoints at 2 and 4 (copied per test)."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(train_argv(out, "max_steps=4", "save_every=2", "lr=2e-3", "converter_lr_mult=5.0")) == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# -- 1: a changed learning rate is applied, recorded, and never claimed without being used --------------------------
def test_resume_applies_a_changed_learning_rate_and_records_it(run4, tmp_path, capsys):
    out = copy_run(run4, tmp_path / "run")
    before = metrics(out)
    assert all(set(lrs(r).values()) <= {2e-3, 1e-2} for r in before)  # backbone 2e-3, converter 5 x 2e-3
    rc = main(train_argv(out, "max_steps=6", "save_every=2", "lr=1e-5", "converter_lr_mult=1.0"))
    assert rc == 0, capsys.readouterr().err
    after = metrics(out)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6]
    assert after[:4] == before
    for r in after[4:]:  # steps 5 and 6 ran with the new rates (warmup_steps=1: no ramp)
        assert set(lrs(r).values()) == {1e-5}, r
    assert json.loads((out / "train_config.json").read_text())["lr"] == 1e-5
    (event,) = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    assert event["step"] == 4 and event["effective_from_step"] == 5 and event["from"].endswith("checkpoint-4")
    assert event["changed"] == {"lr": {"old": 2e-3, "new": 1e-5}, "converter_lr_mult": {"old": 5.0, "new": 1.0}}


def test_resume_refuses_settings_that_cannot_change_and_changes_nothing(run4, tmp_path, capsys):
    out = copy_run(run4, tmp_path / "run")
    before = snapshot(out)
    capsys.readouterr()
    rc = main(train_argv(out, "max_steps=6", "seed=7", "data.block_size=16"))
    err = capsys.readouterr().err
    assert rc == 2
    (line,) = error_lines(err)
    assert "cannot change mid-run" in line and "seed (0 -> 7)" in line and "data" in line
    assert snapshot(out) == before


# -- 4: one writer per output_dir ---------------------------------------------------------------------------------------
def test_a_second_train_on_the_same_output_dir_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "run"
    import os
    import sys

    from fault_utils import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "dsl_llada", *train_argv(out, "max_steps=100000", "save_every=0")],
                             env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (out / "metrics.jsonl").exists(), "the first run never started"
        second = run_cli(train_argv(out, "max_steps=3", "seed=7"))
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2
    (line,) = error_lines(second.stderr)
    assert f"PID {first.pid}" in line and "another running process" in line
    cfg = json.loads((out / "train_config.json").read_text())
    assert cfg["seed"] == 0 and cfg["max_steps"] == 100000  # the refused run wrote nothing


# -- 5: an older checkpoint of the same run never damages the folder -----------------------------------------------------
def test_resuming_an_older_checkpoint_is_refused_branched_or_overwritten_explicitly(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_argv(out, "max_steps=8", "save_every=2")) == 0
    before = snapshot(out)
    capsys.readouterr()
    old = out / "checkpoint-2"
    assert main(train_argv(out, f"resume={old}", "max_steps=6", "keep_last=2", "save_every=2")) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "older than the newest checkpoint" in line and "checkpoint-8" in line
    assert snapshot(out) == before

    branch = tmp_path / "branch"  # a new run folder: the source run is only read
    assert main(train_argv(branch, f"resume={old}", "max_steps=6", "keep_last=2", "save_every=2")) == 0
    assert snapshot(out) == before
    assert sorted(p.name for p in branch.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]

    # --overwrite: later checkpoints discarded, the source kept although keep_last=2 would rotate it out
    assert main([*train_argv(out, f"resume={old}", "max_steps=6", "keep_last=2", "save_every=2"), "--overwrite"]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((out / "final" / "config.json").read_text())  # final/ is the step-6 model
    assert (out / "final" / "model.safetensors").read_bytes() == (out / "checkpoint-6" / "model.safetensors").read_bytes()
    assert snapshot(old) == {k.removeprefix("checkpoint-2/"): v for k, v in before.items() if k.startswith("checkpoint-2/")}


# -- 8: a full disk (here: a file-size limit) during a checkpoint ----------------------------------------------------------
def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(run4, tmp_path):
    out = copy_run(run4, tmp_path / "run")
    before = snapshot(out / "checkpoint-4")

    def limit():  # every file this process writes stops at 64 KiB (the model's weights are ~0.6 MB)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    r = run_cli(train_argv(out, "max_steps=6", "save_every=2"), preexec_fn=limit)
    assert r.returncode == 2, r.stderr
    (line,) = error_lines(r.stderr)
    assert line.startswith("error: file size limit exceeded") and "checkpoint-6" in line, line
    assert snapshot(out / "checkpoint-4") == before
    assert not list(out.glob(".checkpoint-*")) and not (out / "checkpoint-6").exists()
    rerun = run_cli(train_argv(out, "max_steps=6", "save_every=2"))  # space again: resumes from 4 and finishes
    assert rerun.returncode == 0, rerun.stderr
    assert (out / "checkpoint-6").is_dir()


# -- 12, 16: damaged checkpoints -------------------------------------------------------------------------------------------
def test_resume_auto_skips_a_damaged_newest_checkpoint_naming_it(run4, tmp_path, caplog):
    out = copy_run(run4, tmp_path / "run")
    opt = out / "checkpoint-4" / "trainer_state" / "optimizer.safetensors"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])
    assert main(train_argv(out, "max_steps=6", "save_every=2")) == 0
    err = caplog.text
    assert "skipping damaged checkpoint" in err and "checkpoint-4" in err and "optimizer.safetensors" in err
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in out.glob("*checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6",
                                                                 "damaged-checkpoint-4"]


@pytest.mark.parametrize("damage", ["truncated optimizer", "malformed rank-0.json"])
def test_an_explicitly_resumed_damaged_checkpoint_is_one_line(run4, tmp_path, capsys, damage):
    out = copy_run(run4, tmp_path / "run")
    ck = out / "checkpoint-4"
    path = {"truncated optimizer": ck / "trainer_state" / "optimizer.safetensors",
            "malformed rank-0.json": ck / "trainer_state" / "rank-0.json"}[damage]
    path.write_bytes(path.read_bytes()[:100])
    before = snapshot(out)
    capsys.readouterr()
    assert main(train_argv(tmp_path / "branch", f"resume={ck}", "max_steps=6")) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert str(path) in line, line
    assert snapshot(out) == before and not (tmp_path / "branch").exists()


# -- 8, 11: a run killed while saving leaves a temp folder; the next run (holding the lock) removes it ----------------------
def test_temp_folders_of_a_killed_save_are_removed_by_the_next_run(run4, tmp_path, caplog):
    out = copy_run(run4, tmp_path / "run")
    for name in (".checkpoint-99.tmp", ".final.tmp"):
        (out / name / "trainer_state").mkdir(parents=True)
        (out / name / "trainer_state" / "state.json").write_text("{")
    assert main(train_argv(out, "max_steps=5", "save_every=2")) == 0
    assert not (out / ".checkpoint-99.tmp").exists() and not (out / ".final.tmp").exists()
    assert "temp folder left by an interrupted save" in caplog.text


# -- third reliability probe: damaged per-process state, the damaged-checkpoint advice, linked run folders, inputs ---
def test_resume_auto_skips_a_checkpoint_whose_rng_state_cannot_be_restored(run4, tmp_path, caplog):
    out = copy_run(run4, tmp_path / "run")
    (out / "checkpoint-4" / "trainer_state" / "rank-0.json").write_text('{"rng": 1}')
    assert main(train_argv(out, "max_steps=6", "save_every=2")) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "skipping damaged checkpoint" in r.getMessage()]
    assert "checkpoint-4" in warning and "rank-0.json" in warning and "RNG" in warning
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert (out / "damaged-checkpoint-4").is_dir()


def test_the_damaged_training_checkpoint_warning_does_not_say_download_it(run4, tmp_path, caplog):
    out = copy_run(run4, tmp_path / "run")
    opt = out / "checkpoint-4" / "trainer_state" / "optimizer.safetensors"
    opt.write_bytes(opt.read_bytes()[:100])
    assert main(train_argv(out, "max_steps=5", "save_every=5")) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "skipping damaged checkpoint" in r.getMessage()]
    assert "download" not in warning and "training checkpoint is damaged" in warning


def test_a_linked_output_dir_of_a_finished_run_is_continued(run4, tmp_path, capsys):
    out = copy_run(run4, tmp_path / "run")
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    assert main(train_argv(link, "max_steps=5", "save_every=5")) == 0, capsys.readouterr().err
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5] and (out / "checkpoint-5").is_dir()
    assert link.is_symlink()


def test_a_fifo_in_data_files_is_named_as_such(tmp_path, capsys):
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    capsys.readouterr()
    assert main(train_argv(tmp_path / "run", "max_steps=1", f"data.files=[{fifo}]")) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert f"{str(fifo)!r} is not a regular file (a FIFO, device or socket)" in line
    assert not (tmp_path / "run").exists()


def test_a_missing_tokenizer_folder_is_no_such_folder(tmp_path, capsys):
    capsys.readouterr()
    assert main(train_argv(tmp_path / "run", "max_steps=1", "tokenizer=/nonexistent")) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: tokenizer='/nonexistent': no such folder") and "Repo id" not in line
    assert not (tmp_path / "run").exists()
