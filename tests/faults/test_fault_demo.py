"""`demo --out` is as safe as every other command's output: one demo per folder (a lock that never outlives the
run), a report that never sits beside another run's results (a kill between two writes), and an output path
through a symbolic link loop refused in one line by every command that writes a folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from fault_utils import CORPUS, ROOT, TOY
from faults_helpers import error_lines, refused

import dsl_llada.toy.demo as demo_mod
import dsl_llada.toy.demo_command as demo_command
from dsl_llada.cli.main import main
from dsl_llada.artifacts.locks import lock_path, output_lock
from dsl_llada.artifacts.outputs import OutputError
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.run_files import COMPARISON_FILES, remove_stale_stages


# -- one demo per --out folder --------------------------------------------------------------------------------------
def test_a_second_demo_on_the_same_out_is_refused_naming_the_first(tmp_path, capsys, monkeypatch):
    def ran(demo, out):
        raise AssertionError("the second demo ran")

    monkeypatch.setattr(demo_command, "_comparison", ran)
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    holder = subprocess.Popen(  # a demo in progress, as far as the lock is concerned
        [sys.executable, "-c", "import time\nfrom dsl_llada.artifacts.locks import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)"],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = refused(capsys, ["demo", "--quick", "--out", str(out), "-q"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert line == (f"error: --out folder {str(out)!r} is being written by another running process (PID {holder.pid}, "
                    f"lock {str(lock_path(out))!r}); wait for it to finish or choose another --out folder")
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("ending, code", [("returns", 0), ("raises", None), ("ctrl-c", 130)])
def test_the_demo_holds_its_lock_for_the_run_and_never_after(tmp_path, capsys, monkeypatch, ending, code):
    out = tmp_path / "demo"
    seen = []

    def comparison(demo, folder):
        lock = lock_path(out)
        seen.append(lock.read_text().strip())  # held, with our PID, while the run works
        with pytest.raises(OutputError, match="is being written by another running process"):
            with output_lock(out, what="--out folder"):
                pass
        if ending == "raises":
            raise RuntimeError("a stage failed")
        if ending == "ctrl-c":
            raise KeyboardInterrupt
        return 0

    monkeypatch.setattr(demo_command, "_comparison", comparison)
    if code is None:
        with pytest.raises(RuntimeError, match="a stage failed"):
            main(["demo", "--quick", "--out", str(out), "-q"])
    else:
        assert main(["demo", "--quick", "--out", str(out), "-q"]) == code
    assert seen == [str(os.getpid())]
    assert not lock_path(out).exists()
    with output_lock(out, what="--out folder"):  # free again
        pass


def test_sigterm_ends_the_demo_and_its_lock(tmp_path):
    out = tmp_path / "demo"
    code = ("import sys, time\nimport dsl_llada.toy.demo_command as c\n"
            "def comparison(demo, out):\n    print('running', flush=True)\n    time.sleep(120)\n"
            "c._comparison = comparison\nfrom dsl_llada.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.Popen([sys.executable, "-c", code, "demo", "--quick", "--out", str(out), "-q"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "running"
        assert lock_path(out).read_text().strip() == str(p.pid)  # held while the run works
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert error_lines(err) == ["error: terminated (SIGTERM); the output being written was removed, finished ones "
                                "are kept"]
    assert not lock_path(out).exists()


# -- never a stale report: a kill between two writes ------------------------------------------------------------------
class Killed(BaseException):
    """Stands in for SIGKILL: raised instead of the n-th rename, caught by no `except Exception`."""


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    """A demo run on a micro configuration (training replaced by a weight nudge): what `Demo.write` is given."""
    mp = pytest.MonkeyPatch()

    def fake_stage(model, tok, train, stage, **kw):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        return [1.0, 0.5]

    mp.setattr(demo_mod, "run_stage", fake_stage)
    captured = {}

    def capture(self, records, rows, fixclean, models, floors=()):
        captured.update(records=records, rows=rows, fixclean=fixclean, models=models, floors=floors,
                        truth_rows=self.truth_rows)

    cfg = DemoConfig(n_train=8, d_model=16, n_layers=1, n_heads=2, noise_dim=8, n_eval_open=2, n_eval_summarize=1,
                     nfes=(4,), n_heldout=2, batch_size=4, cpt_target_excess=0.0, tv_documents=1, tv_samples=2)
    mp.setattr(Demo, "write", capture)
    try:
        Demo(cfg, tmp_path_factory.mktemp("micro") / "demo", progress=False, echo=lambda s: None).run()
    finally:
        mp.undo()
    return cfg, captured


def _runs(micro_run, out):
    """Two runs for one folder that differ in every file: A (float32) and B (bfloat16, one record and one
    Bayes-floor row fewer)."""
    cfg, c = micro_run
    a = (Demo(cfg, out, progress=False, echo=lambda s: None), dict(c))
    b = (Demo(cfg.replace(dtype="bfloat16"), out, progress=False, echo=lambda s: None),
         dict(c, records=c["records"][:-1], floors=c["floors"][:-1]))
    for demo, _ in (a, b):
        demo.truth_rows = c["truth_rows"]  # what the run measured for the world's own samples
    return a, b


def _write(run) -> None:
    demo, data = run
    demo.write(data["records"], data["rows"], data["fixclean"], data["models"], data["floors"])


def _results(data) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data["records"])


def _agrees(out, runs) -> None:
    """If OUT holds a report, every file of the set beside it is from the report's run."""
    if not (out / "report.md").exists():
        return
    text = (out / "report.md").read_text()
    demo, data = runs[1] if "in bfloat16" in text else runs[0]
    assert json.loads((out / "config.json").read_text())["demo"]["dtype"] == demo.cfg.dtype
    assert (out / "results.jsonl").read_text() == _results(data)
    floors = json.loads((out / "bayes_floor.json").read_text())
    assert [r["model"] for r in floors["rows"]] == [r["model"] for r in data["floors"]]
    assert (out / "nfe_curve.png").is_file() and (out / "excess_loss.png").is_file()
    assert f"Run `{demo.run_id}`" in text
    assert json.loads((out / "config.json").read_text())["run_id"] == floors["run_id"] == demo.run_id


def test_a_kill_between_any_two_writes_never_leaves_a_report_beside_another_runs_results(micro_run, tmp_path,
                                                                                         monkeypatch):
    out = tmp_path / "demo"
    runs = _runs(micro_run, out)
    real_replace = os.replace
    kills = 0
    while True:
        for f in (out.iterdir() if out.exists() else []):  # start each round from run A's complete set
            if f.is_file():
                f.unlink()
        (out / "cache").mkdir(parents=True, exist_ok=True)
        (out / "notes.txt").write_text("mine")
        _write(runs[0])
        _agrees(out, runs)
        calls = 0

        def replace(src, dst, _kill_at=kills):
            nonlocal calls
            calls += 1
            if calls > _kill_at:
                raise Killed
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        try:
            _write(runs[1])
            finished = True
        except Killed:
            finished = False
        finally:
            monkeypatch.setattr(os, "replace", real_replace)
        _agrees(out, runs)
        assert (out / "notes.txt").read_text() == "mine" and (out / "cache").is_dir()
        if finished:
            break
        kills += 1
    assert kills >= 6  # every rename of the run's six files was a kill point
    assert "in bfloat16" in (out / "report.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted([*COMPARISON_FILES, "notes.txt", "cache"])


def test_files_of_the_previous_run_that_this_run_does_not_write_are_removed(micro_run, tmp_path):
    out = tmp_path / "demo"
    a, b = _runs(micro_run, out)
    _write(a)
    b[1]["floors"] = []  # this run measures no Bayes floor
    _write(b)
    assert not (out / "bayes_floor.json").exists() and not (out / "excess_loss.png").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["files"] == ["config.json", "nfe_curve.png", "report.md", "results.jsonl"]
    # a file of those names that no run of ours listed (a config.json without "files") is left alone
    (out / "bayes_floor.json").write_text("{}")
    del cfg["files"]
    (out / "config.json").write_text(json.dumps(cfg))
    _write(b)
    assert (out / "bayes_floor.json").read_text() == "{}"


def test_the_files_a_killed_demo_left_unfinished_are_removed_by_the_next_run(micro_run, tmp_path, capsys,
                                                                             monkeypatch):
    out = tmp_path / "demo"
    a, _ = _runs(micro_run, out)
    monkeypatch.setattr("shutil.rmtree", lambda *a, **k: None)  # as after SIGKILL: no clean-up runs
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(Killed()))
    with pytest.raises(Killed):
        _write(a)
    monkeypatch.undo()
    (stage,) = [p for p in out.iterdir() if p.name.startswith(".run.")]
    odd = out / ".run.abcd1234.tmp"
    odd.mkdir()
    (odd / "mine.txt").write_text("mine")
    assert remove_stale_stages(out, COMPARISON_FILES) == ([stage], [odd])
    assert not stage.exists() and (odd / "mine.txt").read_text() == "mine"


# -- an output path through a symbolic link loop ---------------------------------------------------------------------
def _eval_config(tmp_path, models) -> str:
    cfg = {"models": [{"name": "dsl", "path": str(models[1]), "dtype": "float32"}],
           "methods": [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"}],
           "tasks": [{"name": "generation", "datasets": [{"name": "p", "kind": "prompts", "gen_length": 8, "limit": 2,
                                                          "path": str(ROOT / "configs/eval/toy-data/toy_open.jsonl")}]}],
           "nfe": [4], "seeds": [0], "batch_size": 2, "device": "cpu"}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("command", ["demo", "train", "convert", "eval run"])
@pytest.mark.parametrize("where", ["the folder", "a parent"])
def test_an_output_path_through_a_symbolic_link_loop_is_one_line(tmp_path, capsys, models, monkeypatch, command,
                                                                 where):
    monkeypatch.setattr(demo_command, "_comparison", lambda demo, out: 0)  # the demo must be refused before it runs
    loop = tmp_path / "loop"
    loop.symlink_to("loop")  # loop -> loop
    out = loop if where == "the folder" else loop / "run"
    what = {"demo": "--out folder", "train": "output_dir", "convert": "output folder", "eval run": "--out folder"}
    argv = {"demo": lambda: ["demo", "--quick", "--out", str(out), "-q"],
            "train": lambda: ["train", "--config", str(TOY), f"output_dir={out}", f"data.files=[{CORPUS}]",
                              "max_steps=1", "-q"],
            "convert": lambda: ["convert", str(models[0]), str(out)],
            "eval run": lambda: ["eval", "run", "--config", _eval_config(tmp_path, models), "--out", str(out), "-q"]}
    line = refused(capsys, argv[command]())
    assert line == (f"error: {what[command]} {str(out)!r} goes through a symbolic link loop (a link that leads back "
                    f"to itself), so no folder can be made there; remove the link or choose another path")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["loop", "eval.json"] if command == "eval run"
                                                                else ["loop"])

