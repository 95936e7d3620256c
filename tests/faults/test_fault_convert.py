"""`convert` faults (11 in docs/reliability.md's fault-injection table): one writer per output folder, and the temp
folder a killed convert leaves behind is found and removed by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fault_utils import ROOT, run_cli
from faults_helpers import error_lines, make_backbone_dir

from dsl_llada.cli.main import main
from dsl_llada.artifacts.locks import lock_path


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return make_backbone_dir(tmp_path_factory.mktemp("models") / "backbone")


def test_a_second_convert_to_the_same_folder_is_refused_naming_the_first(backbone, tmp_path):
    out = tmp_path / "dsl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    holder = subprocess.Popen(  # a convert in progress, as far as the lock is concerned
        [sys.executable, "-c", "import sys, time\nfrom dsl_llada.artifacts.locks import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)"],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = run_cli(["convert", str(backbone), str(out)])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert r.returncode == 2, r.stderr
    (line,) = error_lines(r.stderr)
    assert f"PID {holder.pid}" in line and "another running process" in line
    assert not out.exists()
    # the holder died (kill -9): its lock died with it, and the next convert runs
    assert run_cli(["convert", str(backbone), str(out)]).returncode == 0
    assert (out / "dsl_config.json").is_file() and not lock_path(out).exists()


def test_the_temp_folder_of_a_killed_convert_is_removed_by_the_next_run(backbone, tmp_path, capsys):
    out = tmp_path / "dsl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # a convert killed inside its atomic save: stop it once its temp folder holds the weights being written
    code = ("import os, sys\nimport dsl_llada.core.checkpoint as c\nreal = c._save\n"
            "def save(t, p):\n    real(t, p)\n    os.kill(os.getpid(), 9)\nc._save = save\n"
            "from dsl_llada.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "convert", str(backbone), str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -9
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".dsl.") and p.name.endswith(".tmp")]
    assert len(stale) == 1 and (stale[0] / "model.safetensors").is_file() and not out.exists()
    capsys.readouterr()
    assert main(["convert", str(backbone), str(out)]) == 0
    assert f"removed {str(stale[0])!r}" in capsys.readouterr().err
    assert not stale[0].exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dsl"]


def test_a_stale_looking_folder_holding_other_files_is_named_not_removed(backbone, tmp_path, capsys):
    out = tmp_path / "dsl"
    odd = tmp_path / ".dsl.abcd1234.tmp"
    odd.mkdir()
    (odd / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["convert", str(backbone), str(out)]) == 0
    assert "left alone" in capsys.readouterr().err and (odd / "notes.txt").read_text() == "mine"


def test_lock_waits_for_nothing_and_leaves_nothing(tmp_path):
    from dsl_llada.artifacts.locks import output_lock
    from dsl_llada.artifacts.outputs import OutputError

    with output_lock(tmp_path / "x") as lock:
        assert lock.read_text().strip() == str(os.getpid())
        t = time.time()
        pid = os.fork()
        if pid == 0:  # another process: refused at once, naming us
            try:
                with output_lock(tmp_path / "x"):
                    os._exit(1)
            except OutputError as e:
                os._exit(0 if f"PID {os.getppid()}" in str(e) else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and time.time() - t < 30
    assert not lock.exists()
