"""Faults 2, 3 and 7 of docs/reliability.md's fault-injection table for `generate`: one writer per output (the lock
comes before anything is read or written, a refused run changes nothing, its settings file included, and names the
holder's PID); errored prompts are not done (a rerun retries them), the run ends with a summary and exits 1 when more
prompts failed than --max-error-rate allows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults_helpers import GENERATE_SAMPLING, error_lines, generate_prompts, make_dsl_dir, write_prompts_jsonl

import dsl_llada.sampling.batches as batches_mod
from dsl_llada.cli.main import build_parser, main
from dsl_llada.artifacts.records import RecordFile
from dsl_llada.sampling.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
N = 6
PROMPTS = generate_prompts(N)
SAMPLING = GENERATE_SAMPLING


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_dsl_dir(tmp_path_factory.mktemp("faults-runs"))


@pytest.fixture(scope="module")
def prompts_file(model):
    return write_prompts_jsonl(model.parent / "prompts.jsonl", PROMPTS)


def args(model, prompts_file, out, *extra):
    return ["generate", "--model", str(model), "--prompts-file", str(prompts_file), "--batch-size", "2", *SAMPLING,
            "--output", str(out), *extra]


@pytest.fixture(scope="module")
def reference(model, prompts_file):
    out = model.parent / "reference.jsonl"
    assert main(args(model, prompts_file, out)) == 0
    return out.read_text()


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.parent.iterdir() if p.name.startswith(out.name)}


def failing(monkeypatch, bad: set[int]) -> None:
    """Every forward that includes a prompt of `bad` raises a runtime error (an OOM, a broken layer): an engine
    tick with such a row live, or a fixed batch's sampler run holding one."""
    real = batches_mod.run_batch
    real_forward = Engine._forward

    def wrapped(model_, prompt_ids, config, seeds, **kw):
        if {s - 42 for s in seeds} & bad:
            raise RuntimeError("simulated failure")
        return real(model_, prompt_ids, config, seeds, **kw)

    def forward(self, rows, seqs):
        if {int(r.tag) for r in rows} & bad:
            raise RuntimeError("simulated failure")
        return real_forward(self, rows, seqs)

    monkeypatch.setattr(batches_mod, "run_batch", wrapped)
    monkeypatch.setattr(Engine, "_forward", forward)


@pytest.fixture
def holder(tmp_path):
    """Start a separate process that holds the exclusive lock of a file (as a running generate does)."""
    procs = []

    def start(path: Path) -> subprocess.Popen:
        code = ("import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
                "print('locked', flush=True); time.sleep(60)")
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for p in procs:
        p.kill()
        p.wait()


# -- item 2: a refused run changes nothing -------------------------------------------------------------------
def test_refused_overwrite_changes_nothing_and_names_the_holder(model, prompts_file, reference, tmp_path, capsys,
                                                                 holder):
    pytest.importorskip("fcntl")
    out = tmp_path / "ow.jsonl"
    assert main(args(model, prompts_file, out)) == 0
    before = snapshot(out)
    proc = holder(out)
    capsys.readouterr()
    assert main(args(model, prompts_file, out, "--seed", "7", "--overwrite")) == 2
    found = error_lines(capsys.readouterr().err)
    assert found == [f"error: --output {str(out)!r} is being written by process {proc.pid}; wait for it to finish "
                     f"(then rerun to resume) or choose another file"]
    assert snapshot(out) == before  # the settings file still says seed 42, the records are untouched
    assert json.loads(Path(str(out) + ".config.json").read_text())["seed"] == 42


def test_refused_different_settings_and_failed_setup_leave_no_file_behind(model, prompts_file, tmp_path, capsys):
    out = tmp_path / "new.jsonl"
    long_prompt = "ocean " * 200
    assert main(["generate", "--model", str(model), "--prompt", long_prompt, *SAMPLING, "--output", str(out)]) == 2
    assert "too long" in error_lines(capsys.readouterr().err)[0]
    assert list(tmp_path.iterdir()) == []  # the lock's empty file is removed with the refusal


# -- item 7: a second identical run never cuts back the first's file ------------------------------------------
def test_second_identical_run_while_the_first_holds_the_file_is_refused(model, prompts_file, reference, tmp_path,
                                                                       capsys, holder):
    pytest.importorskip("fcntl")
    out = tmp_path / "o.jsonl"
    assert main(args(model, prompts_file, out)) == 0
    proc = holder(out)
    capsys.readouterr()
    assert main(args(model, prompts_file, out)) == 2
    assert f"being written by process {proc.pid}" in error_lines(capsys.readouterr().err)[0]
    assert out.read_text() == reference


def test_the_lock_is_taken_before_the_file_is_read(model, prompts_file, reference, tmp_path):
    """The reproducer's race: the second run read the first's half-written file (24 of 40 lines), the first
    finished, the second then cut the file back to what it had read. Now the reading happens under the lock, so
    while one RecordFile is open a second open is refused before it reads anything."""
    pytest.importorskip("fcntl")
    out = tmp_path / "o.jsonl"
    out.write_text("".join(reference.splitlines(keepends=True)[:2]))
    Path(str(out) + ".config.json").write_text(Path(str(model.parent / "reference.jsonl") + ".config.json").read_text())
    settings = json.loads(Path(str(out) + ".config.json").read_text())
    first = RecordFile.open(out, settings)
    try:
        first.begin()
        first.append([json.loads(x) for x in reference.splitlines()[2:]])  # the first run finishes its records
        with pytest.raises(ValueError, match=f"being written by process {os.getpid()}"):
            RecordFile.open(out, settings)
        first.finish(N)
    finally:
        first.close()
    assert out.read_text() == reference


def test_two_real_runs_at_once_end_with_the_complete_file(model, tmp_path):
    """Two identical `generate` processes started together: one writes, the other is refused (exit 2) or, if it
    starts after the first finished, finds everything done; the file ends complete either way."""
    p = tmp_path / "many.txt"
    p.write_text("".join(f"write about the ocean {'and the forest ' * (i % 4)}.\n" for i in range(200)))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "dsl_llada", "generate", "--model", str(model), "--prompts-file", str(p),
           "--batch-size", "1", *SAMPLING, "--output", str(out)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and out.stat().st_size > 0):
        time.sleep(0.005)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    first.communicate(timeout=300)
    assert first.returncode == 0
    assert (second.returncode, "being written by process" in second.stderr) == (2, True) or \
        (second.returncode, "200 of 200 prompts already done" in second.stderr) == (0, True), second.stderr
    assert [json.loads(x)["index"] for x in out.read_text().splitlines()] == list(range(200))


# -- item 3: failures are counted, reported and retried --------------------------------------------------------
def test_failed_prompts_exit_1_and_a_rerun_retries_only_them(model, prompts_file, reference, tmp_path, capsys,
                                                             monkeypatch):
    out = tmp_path / "o.jsonl"
    failing(monkeypatch, {1, 4})
    assert main(args(model, prompts_file, out)) == 1
    err = capsys.readouterr().err
    assert f"done: 4 of {N} prompts generated, 2 failed in {out}" in err
    assert f"error: 2 of {N} prompts failed (33.3%), more than --max-error-rate 0 allows" in err
    assert [("error" in json.loads(x)) for x in out.read_text().splitlines()] == [i in (1, 4) for i in range(N)]
    monkeypatch.undo()
    ran = []
    real = Engine._forward

    def counting(self, rows, seqs):
        ran.append(sorted(int(r.tag) for r in rows))
        return real(self, rows, seqs)

    monkeypatch.setattr(Engine, "_forward", counting)
    assert main(args(model, prompts_file, out)) == 0
    err = capsys.readouterr().err
    assert f"resuming {out}: 4 of {N} prompts already done; retrying 2 that failed before" in err
    assert f"done: {N} of {N} prompts generated" in err
    assert ran == [[1, 4]] * 4  # only the two failed prompts run, together (4 steps)
    assert out.read_text() == reference  # sorted, one record per prompt, the error records replaced


def test_every_prompt_failing_is_not_success(model, prompts_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o.jsonl"
    failing(monkeypatch, set(range(N)))
    assert main(args(model, prompts_file, out)) == 1
    assert main(args(model, prompts_file, out)) == 1  # nothing counts as done: all retried, all failed again
    err = capsys.readouterr().err
    assert f"retrying {N} that failed before" in err
    assert main(["generate", "--model", str(model), "--prompt", "hi", *SAMPLING]) == 1  # without --output too


@pytest.mark.parametrize("rate, rc", [("0.2", 1), ("0.34", 0), ("1", 0)])
def test_max_error_rate_tolerates_a_share(model, prompts_file, tmp_path, capsys, monkeypatch, rate, rc):
    failing(monkeypatch, {0, 5})
    assert main(args(model, prompts_file, tmp_path / "o.jsonl", "--max-error-rate", rate)) == rc


@pytest.mark.parametrize("bad", ["-0.1", "1.5", "nan"])
def test_max_error_rate_out_of_range_is_refused(model, prompts_file, tmp_path, capsys, bad):
    out = tmp_path / "o.jsonl"
    assert main(args(model, prompts_file, out, "--max-error-rate", bad)) == 2
    assert f"--max-error-rate {float(bad)!r} must be a fraction in [0, 1]" in error_lines(capsys.readouterr().err)[0]
    assert not out.exists()


def test_help_lists_max_error_rate():
    sub = build_parser()._subparsers._group_actions[0].choices["generate"]
    text = sub.format_help()
    assert "--max-error-rate FRACTION" in text and "--overwrite" in text and "--resume" in text
