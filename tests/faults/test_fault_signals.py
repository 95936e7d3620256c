"""SIGTERM to `train` and `generate` (docs/reliability.md, fault table): the process stops as with Ctrl-C, says in
one line what was kept, exits 143 and leaves no lock file; rerunning the same command resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fault_utils import ROOT, train_argv
from faults_helpers import GENERATE_SAMPLING, error_lines, generate_prompts, write_prompts_jsonl


def _start(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "dsl_llada", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + 240
    while not ready():
        assert proc.poll() is None, f"the command ended before {what}: {proc.stderr.read() if proc.stderr else ''}"
        assert time.monotonic() < deadline, f"no {what} within 240 s"
        time.sleep(0.01)


def _terminate(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_sigterm_to_generate_keeps_every_finished_record_says_so_and_resumes(models, tmp_path):
    _, dsl = models
    prompts = write_prompts_jsonl(tmp_path / "p.jsonl", generate_prompts(40))
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--model", str(dsl), "--prompts-file", str(prompts), "--output", str(out), "--batch-size", "1",
            "--device", "cpu", *GENERATE_SAMPLING]
    proc = _start(argv)
    _wait_for(proc, lambda: out.exists() and out.read_text().count("\n") >= 1, "first record")
    rc, err = _terminate(proc)
    kept = out.read_text().splitlines()
    assert rc == 143, err
    (line,) = error_lines(err)
    assert line == (f"stopped by SIGTERM: {len(kept)} of 40 records kept in {out} (every finished prompt); rerun the "
                    f"same command to resume")
    assert 1 <= len(kept) < 40 and [json.loads(x)["index"] for x in kept] == list(range(len(kept)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.jsonl.config.json", "p.jsonl"]  # no lock
    again = subprocess.run([sys.executable, "-m", "dsl_llada", *argv], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert f"resuming {out}: {len(kept)} of 40 prompts already done" in again.stderr
    assert [json.loads(x)["index"] for x in out.read_text().splitlines()] == list(range(40))


def test_sigterm_to_generate_without_output_says_nothing_was_saved(models, tmp_path):
    _, dsl = models
    prompts = write_prompts_jsonl(tmp_path / "p.jsonl", generate_prompts(400))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dsl_llada", "generate", "--model", str(dsl), "--prompts-file",
                             str(prompts), "--batch-size", "1", "--device", "cpu", *GENERATE_SAMPLING], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert json.loads(proc.stdout.readline())["index"] == 0  # the first record is out
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert error_lines(err) == ["stopped by SIGTERM: without --output nothing was saved (the records printed above "
                                "are all there is)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_sigterm_to_train_keeps_the_last_checkpoint_says_which_and_releases_the_lock(tmp_path):
    out = tmp_path / "run"
    argv = train_argv(out, "max_steps=400", "save_every=2")
    proc = _start(argv)
    _wait_for(proc, lambda: (out / "checkpoint-2" / "trainer_state").is_dir() and
              any((out / "checkpoint-2" / "trainer_state").iterdir()), "first checkpoint")
    rc, err = _terminate(proc)
    assert rc == 143, err
    (line,) = error_lines(err)
    ckpts = sorted((int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")))
    last = ckpts[-1]
    assert line == (f"stopped by SIGTERM: {len(ckpts)} checkpoint(s) kept in {out}, the last checkpoint-{last} (step "
                    f"{last}); rerun the same command to resume from it")
    assert ckpts == list(range(2, last + 1, 2)) and last < 400  # every one complete, none half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no .run.lock beside it
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp folder of a save


def test_sigterm_to_train_before_its_first_checkpoint_says_there_is_nothing_to_resume(tmp_path):
    out = tmp_path / "run"
    proc = _start(train_argv(out, "max_steps=400", "save_every=1000"))
    _wait_for(proc, lambda: (out / "train_config.json").is_file(), "the run folder")
    rc, err = _terminate(proc)
    assert rc == 143, err
    assert error_lines(err) == [f"stopped by SIGTERM before the first checkpoint: nothing in {out} to resume from; "
                                f"rerun the same command to start again"]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["run"]
