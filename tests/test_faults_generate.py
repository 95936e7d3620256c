"""Faults around `dsl-llada generate`: everything is validated before sampling, each finished record is
on disk at once, kill -9 / Ctrl-C / a full disk lose nothing finished, a resumed run ends with exactly the records of
an uninterrupted one, and bad input is one clear line (exit 2). The faults are injected on the step-level engine
(the default, `--batching continuous`) and, where the two differ, on the fixed batches (`--batching fixed`)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults_helpers import (CONTEXT, GENERATE_SAMPLING, error_lines, generate_prompts, make_dsl_dir,
                            write_prompts_jsonl)

import dsl_llada.artifacts.jsonl_log as jsonl_log_mod
import dsl_llada.sampling.batches as batches_mod
from dsl_llada.cli.main import main
from dsl_llada.artifacts.records import RecordFile
from dsl_llada.sampling.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
N = 12
PROMPTS = generate_prompts(N)
SAMPLING = GENERATE_SAMPLING


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_dsl_dir(tmp_path_factory.mktemp("faults-gen"))


@pytest.fixture(scope="module")
def prompts_file(model):
    return write_prompts_jsonl(model.parent / "prompts.jsonl", PROMPTS)


def args(model, prompts_file, out, *extra, batch=3):
    return ["generate", "--model", str(model), "--prompts-file", str(prompts_file), "--batch-size", str(batch),
            *SAMPLING, "--output", str(out), *extra]


@pytest.fixture(scope="module")
def reference(model, prompts_file):
    """The records of an uninterrupted run."""
    out = model.parent / "reference.jsonl"
    assert main(args(model, prompts_file, out)) == 0
    return out.read_text()


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def before_each_batch(monkeypatch, check) -> None:
    """Fixed batches: call `check(prompt indices)` before each sampler run of `generate` (it may raise to simulate a
    fault)."""
    real = batches_mod.run_batch

    def wrapped(model_, prompt_ids, config, seeds, **kw):
        check([s - 42 for s in seeds])
        return real(model_, prompt_ids, config, seeds, **kw)

    monkeypatch.setattr(batches_mod, "run_batch", wrapped)


def before_each_tick(monkeypatch, check) -> None:
    """The engine: call `check(prompt indices of the live rows)` before each tick's batched forward of `generate`
    (it may raise to simulate a fault of the shared forward, such as running out of memory)."""
    real = Engine._forward

    def wrapped(self, rows, seqs):
        check(sorted(int(r.tag) for r in rows))
        return real(self, rows, seqs)

    monkeypatch.setattr(Engine, "_forward", wrapped)


def batches_seen(ticks: list[list[int]]) -> list[list[int]]:
    """The live-row sets of consecutive ticks, each run of equal sets once."""
    return [t for j, t in enumerate(ticks) if j == 0 or t != ticks[j - 1]]


def interrupted_then_resumed(monkeypatch, owner, name, fault, argv, *, rc, reference, n_kept, capsys) -> str:
    """Run `argv` with `owner.name` replaced by `fault(real)`: it must exit `rc` with the first `n_kept` records
    of `reference` on disk; then rerun unpatched, which must end with exactly `reference`. Returns the stderr."""
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, fault(real))
    assert main(argv) == rc
    err = capsys.readouterr().err
    out = Path(argv[argv.index("--output") + 1])
    assert out.read_text() == "".join(reference.splitlines(keepends=True)[:n_kept])
    monkeypatch.setattr(owner, name, real)
    assert main(argv) == 0
    assert out.read_text() == reference
    return err


def one_error(capsys) -> str:
    found = error_lines(capsys.readouterr().err)
    assert len(found) == 1, found
    assert found[0].startswith("error: ")
    return found[0]


def test_reference_run_is_complete_and_ordered(reference):
    recs = [json.loads(x) for x in reference.splitlines()]
    assert [r["index"] for r in recs] == list(range(N))
    assert [r["prompt"] for r in recs] == PROMPTS and all("response_ids" in r and "error" not in r for r in recs)


# -- validated before any sampling -------------------------------------------------------------------------------------
@pytest.fixture
def no_sampling(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("sampling started before validation finished")

    monkeypatch.setattr(batches_mod, "run_batch", refuse)
    monkeypatch.setattr(Engine, "step", refuse)


def test_output_that_is_a_folder_or_unwritable_fails_before_sampling(model, prompts_file, tmp_path, capsys, no_sampling):
    assert main(args(model, prompts_file, tmp_path)) == 2
    assert "is a folder" in one_error(capsys)
    if Path("/proc/self").is_dir():
        assert main(args(model, prompts_file, "/proc/records.jsonl")) == 2
        assert "not writable" in one_error(capsys)


def test_one_overlong_prompt_at_the_end_fails_before_sampling(model, tmp_path, capsys, no_sampling):
    long = "ocean " * CONTEXT
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in [*PROMPTS, long]))
    out = tmp_path / "o.jsonl"
    assert main(args(model, p, out)) == 2
    line = one_error(capsys)
    assert f"prompt {N} is too long" in line and "exceeds the model's context of 64 by" in line
    assert "-" not in line.split("by", 1)[1].split(";")[0]  # 'by how much' is a positive count
    assert not out.exists()


@pytest.mark.parametrize("position", [0, 4])
def test_empty_prompt_is_refused_up_front_wherever_it_is(model, tmp_path, capsys, no_sampling, position):
    prompts = ["a b"] * 6
    prompts[position] = "  "
    argv = ["generate", "--model", str(model), "--batch-size", "2", *SAMPLING]
    for t in prompts:
        argv += ["--prompt", t]
    assert main(argv) == 2
    assert f"prompt {position} is empty" in one_error(capsys)


def test_malformed_jsonl_names_the_file_and_line(model, tmp_path, capsys, no_sampling):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "a"}\n{"prompt": \n{"prompt": "c"}\n')
    assert main(["generate", "--model", str(model), "--prompts-file", str(p), *SAMPLING]) == 2
    assert f"{p}:2: not valid JSON" in one_error(capsys)


def test_json_prompts_file_array_accepted_object_refused(model, tmp_path, capsys):
    arr = tmp_path / "p.json"
    arr.write_text(json.dumps(["write about the ocean .", {"prompt": "describe the forest ."}]))
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--model", str(model), "--prompts-file", str(arr), *SAMPLING, "--output", str(out)]) == 0
    assert [r["prompt"] for r in lines(out)] == ["write about the ocean .", "describe the forest ."]
    assert capsys.readouterr().err.splitlines()[-1] == f"done: 2 of 2 prompts generated in {out}"
    obj = tmp_path / "q.json"
    obj.write_text(json.dumps({"prompt": "x"}))
    assert main(["generate", "--model", str(model), "--prompts-file", str(obj), *SAMPLING]) == 2
    line = one_error(capsys)
    assert "must hold a JSON array" in line and ".jsonl" in line and ".txt" in line


def test_output_is_never_the_prompts_file(model, prompts_file, capsys, no_sampling):
    before = prompts_file.read_text()
    assert main(args(model, prompts_file, prompts_file, "--overwrite")) == 2
    assert "is the input" in one_error(capsys)
    assert prompts_file.read_text() == before


# -- an existing output is resumed, never silently replaced ------------------------------------------------------------
def test_different_settings_are_refused_naming_the_fields(model, prompts_file, reference, tmp_path, capsys, no_sampling):
    out = tmp_path / "o.jsonl"
    out.write_text(reference)
    Path(str(out) + ".config.json").write_text(Path(str(model.parent / "reference.jsonl") + ".config.json").read_text())
    argv = args(model, prompts_file, out)
    argv[argv.index("--steps") + 1] = "8"
    assert main([*argv, "--seed", "7"]) == 2
    line = one_error(capsys)
    assert "config.steps (4 -> 8)" in line and "seed (42 -> 7)" in line
    assert out.read_text() == reference


def test_a_foreign_output_needs_overwrite(model, prompts_file, reference, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o.jsonl"
    out.write_text("my own notes\n")
    assert main(args(model, prompts_file, out)) == 2
    assert "--overwrite" in one_error(capsys) and out.read_text() == "my own notes\n"
    assert main(args(model, prompts_file, out, "--overwrite")) == 0
    assert out.read_text() == reference


def test_resume_skips_finished_prompts_and_matches_an_uninterrupted_run(model, prompts_file, reference, tmp_path,
                                                                         monkeypatch, capsys):
    out = tmp_path / "o.jsonl"
    ref_lines = reference.splitlines(keepends=True)
    out.write_text("".join(ref_lines[:4]) + ref_lines[4][:25])  # 4 records, then a write cut off by kill -9
    Path(str(out) + ".config.json").write_text(Path(str(model.parent / "reference.jsonl") + ".config.json").read_text())
    seen: list[list[int]] = []
    before_each_tick(monkeypatch, seen.append)
    assert main(args(model, prompts_file, out, "--resume")) == 0
    assert len(seen) == 12  # 8 prompts of 4 steps, 3 rows at a time: ceil(8 / 3) x 4 ticks
    assert batches_seen(seen) == [[4, 5, 6], [7, 8, 9], [10, 11]]  # what was done is skipped, the batch kept full
    assert out.read_text() == reference  # the partial line is gone, the records are exactly the reference's
    assert "4 of 12 prompts already done" in capsys.readouterr().err


def test_resume_on_fixed_batches_runs_the_batch_grid_minus_what_was_done(model, prompts_file, reference, tmp_path,
                                                                          monkeypatch, capsys):
    out = tmp_path / "o.jsonl"
    out.write_text("".join(reference.splitlines(keepends=True)[:4]))
    Path(str(out) + ".config.json").write_text(Path(str(model.parent / "reference.jsonl") + ".config.json").read_text())
    seen: list[list[int]] = []
    before_each_batch(monkeypatch, seen.append)
    assert main(args(model, prompts_file, out, "--resume", "--batching", "fixed")) == 0
    assert seen == [[4, 5], [6, 7, 8], [9, 10, 11]]  # the fixed batch grid, minus what was done
    assert out.read_text() == reference  # the same tokens as the engine's
    assert "4 of 12 prompts already done" in capsys.readouterr().err


# -- interruptions and failures lose nothing finished -------------------------------------------------------------------
def test_kill_9_mid_run_then_resume_gives_the_uninterrupted_records(model, tmp_path, one_thread):
    n = 150
    p = tmp_path / "many.txt"
    p.write_text("".join(f"write about the ocean {'and the forest ' * (i % 4)}.\n" for i in range(n)))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def cmd(out):
        return [sys.executable, "-m", "dsl_llada", "generate", "--model", str(model), "--prompts-file", str(p),
                "--batch-size", "1", *SAMPLING, "--output", str(out)]

    killed = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(cmd(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if killed.exists() and killed.read_bytes().count(b"\n") >= 3:
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    kept = killed.read_bytes()
    n_kept = kept.count(b"\n")
    assert 3 <= n_kept < n
    done = [json.loads(x) for x in kept.split(b"\n")[:n_kept]]
    assert [r["index"] for r in done] == list(range(n_kept))  # every finished record survived, in order
    resumed = subprocess.run(cmd(killed), env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{n_kept} of {n} prompts already done" in resumed.stderr
    fresh = tmp_path / "fresh.jsonl"  # the uninterrupted run (in this process, one thread like the subprocesses)
    assert main(cmd(fresh)[3:]) == 0
    assert killed.read_text() == fresh.read_text()
    assert [json.loads(x)["index"] for x in fresh.read_text().splitlines()] == list(range(n))


@pytest.mark.parametrize("batching", ["continuous", "fixed"])
def test_ctrl_c_keeps_finished_records_and_says_so(model, prompts_file, reference, tmp_path, monkeypatch, capsys,
                                                    batching):
    # Ctrl-C as the third batch starts: on the engine its first tick (3 rows of 4 steps: tick 9), else its run
    owner, name, nth = (Engine, "step", 9) if batching == "continuous" else (batches_mod, "run_batch", 3)

    def interrupt_nth(real):
        calls = []

        def run(*a, **k):
            calls.append(1)
            if len(calls) == nth:
                raise KeyboardInterrupt
            return real(*a, **k)
        return run

    out = tmp_path / "o.jsonl"
    err = interrupted_then_resumed(monkeypatch, owner, name, interrupt_nth,
                                   args(model, prompts_file, out, "--batching", batching), rc=130, reference=reference,
                                   n_kept=6, capsys=capsys)
    assert f"6 of {N} records are saved in {out} (every finished prompt)" in err


def test_full_disk_while_appending_keeps_finished_records(model, prompts_file, reference, tmp_path, monkeypatch, capsys):
    def fill_up_on_second_batch(real):
        writes = []

        def write(fd, data):
            writes.append(len(data))
            if len(writes) == 2:
                os.write(fd, data[: len(data) // 2])  # half a batch reaches the disk, then it is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd, data)
        return write

    out = tmp_path / "o.jsonl"
    err = interrupted_then_resumed(monkeypatch, jsonl_log_mod, "_write_all", fill_up_on_second_batch,
                                   args(model, prompts_file, out), rc=2, reference=reference, n_kept=3, capsys=capsys)
    found = error_lines(err)
    assert len(found) == 1 and "no space left on the device" in found[0] and str(out) in found[0]


@pytest.mark.parametrize("batching", ["continuous", "fixed"])
def test_a_failing_prompt_is_recorded_and_the_run_goes_on(model, prompts_file, reference, tmp_path, monkeypatch, capsys,
                                                          batching):
    out = tmp_path / "o.jsonl"
    seen: list[list[int]] = []

    def oom_on_prompt_4(indices):
        seen.append(indices)
        if 4 in indices:
            raise RuntimeError("CUDA out of memory (simulated)")

    (before_each_tick if batching == "continuous" else before_each_batch)(monkeypatch, oom_on_prompt_4)
    argv = args(model, prompts_file, out, "--max-error-rate", "0.1", "--batching", batching)
    assert main(argv) == 0  # 1 of 12 failed: tolerated
    if batching == "continuous":  # the tick that failed is run again row by row: 3 and 5 finish alone, 4 fails alone
        assert batches_seen(seen) == [[0, 1, 2], [3, 4, 5], [3], [4], [5], [6, 7, 8], [9, 10, 11]]
    assert "11 of 12 prompts generated, 1 failed" in capsys.readouterr().err
    got, want = lines(out), [json.loads(x) for x in reference.splitlines()]
    assert [r["index"] for r in got] == list(range(N))
    assert got[4] == {"index": 4, "prompt": PROMPTS[4], "error": "RuntimeError: CUDA out of memory (simulated)",
                      "sampler": "remask", "seed": 46}
    assert got[:4] + got[5:] == want[:4] + want[5:]  # its batch-mates were retried alone, with the same results


def test_nan_weights_fail_clearly_naming_the_model(model, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nan-model"
    bad.mkdir()
    for f in model.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    t = load_file(str(bad / "model.safetensors"))
    save_file({k: v * float("nan") if v.is_floating_point() else v for k, v in t.items()}, str(bad / "model.safetensors"))
    out = tmp_path / "o.jsonl"
    for sampler in (["--sampler", "remask", "--steps", "2"], ["--sampler", "sde", "--nfe", "2"]):
        assert main(["generate", "--model", str(bad), "--prompt", "hi", "--gen-length", "4", "-q", *sampler,
                     "--output", str(out), "--overwrite"]) == 2
        line = one_error(capsys)
        assert str(bad) in line and "non-finite" in line
        assert out.read_text() == ""


def test_two_runs_never_append_to_one_output(model, prompts_file, reference, tmp_path, capsys):
    fcntl = pytest.importorskip("fcntl")
    out = tmp_path / "o.jsonl"
    out.write_text(reference.splitlines(keepends=True)[0])
    Path(str(out) + ".config.json").write_text(Path(str(model.parent / "reference.jsonl") + ".config.json").read_text())
    with open(out, "a") as other:  # another generate run holds the file
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(args(model, prompts_file, out)) == 2
        assert f"being written by process {os.getpid()}" in one_error(capsys)
    assert out.read_text() == reference.splitlines(keepends=True)[0]



def test_rows_that_finish_early_hand_their_place_to_the_next_prompt(model, prompts_file, tmp_path, monkeypatch):
    """With a confidence threshold each prompt takes its own number of steps: on the engine a finished row's place
    goes to the next prompt at the next tick (the batch stays full while prompts are left), records are appended as
    rows finish, and the finished file (sorted by index) holds the fixed batches' tokens; its NFE counts are each
    prompt's own."""
    fixed = tmp_path / "fixed.jsonl"
    assert main(args(model, prompts_file, fixed, "--threshold", "0.2", "--batching", "fixed")) == 0
    seen: list[list[int]] = []
    appended: list[int] = []
    before_each_tick(monkeypatch, seen.append)
    real_append = RecordFile.append

    def append(self, records):
        appended.extend(r["index"] for r in records)
        return real_append(self, records)

    monkeypatch.setattr(RecordFile, "append", append)
    out = tmp_path / "engine.jsonl"
    assert main(args(model, prompts_file, out, "--threshold", "0.2")) == 0
    counts = ("nfe", "forward_passes")  # the engine's are the row's own steps, a fixed batch's its slowest row's
    assert [{k: v for k, v in r.items() if k not in counts} for r in lines(out)] == \
        [{k: v for k, v in r.items() if k not in counts} for r in lines(fixed)]
    assert all(r["nfe"] == r["forward_passes"] == sum(r["steps_per_block"]) for r in lines(out))
    steps = {r["index"]: sum(r["steps_per_block"]) for r in lines(out)}
    assert len(set(steps.values())) > 1  # the prompts took different numbers of steps
    assert len(seen) < sum(max(steps[i] for i in range(s, s + 3)) for s in range(0, N, 3))  # fewer ticks than fixed
    ran = dict.fromkeys(range(N), 0)
    for tick in seen:  # every tick runs 3 rows while 3 or more prompts are unfinished, each row for its own steps
        assert len(tick) == min(3, sum(ran[i] < steps[i] for i in range(N))), (tick, ran)
        for i in tick:
            ran[i] += 1
    assert ran == steps
    assert sorted(appended) == list(range(N)) and appended != list(range(N))  # appended as rows finished
