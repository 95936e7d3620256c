"""Faults of the third reliability probe outside training: text that is not UTF-8, output paths that are not
plain files, a model path that is a file, a prompt line far longer than any context, more threads than CPUs, a
negative demo seed, and a `convert` killed or terminated while it writes the weights. Each is one `error:` line
(or one `warning:` line) and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_utils import ROOT
from faults_helpers import error_lines, refused

from dsl_llada.cli.main import main
from dsl_llada.runtime.environment import usable_cpus

GEN = ["--sampler", "remask", "--steps", "2", "--gen-length", "4", "-q", "--device", "cpu"]


# -- text that is not UTF-8 --------------------------------------------------------------------------------------------
def test_invalid_utf8_on_the_command_line_names_the_prompt(models, tmp_path, capsys):
    # $'x\xed\xa0\x80y' as Python receives it (each invalid byte a lone surrogate U+DC..)
    out = tmp_path / "o.jsonl"
    line = refused(capsys, ["generate", "--model", str(models[1]), "--prompt", "fine",
                            "--prompt", "x\udced\udca0\udc80y", "--output", str(out), *GEN])
    assert "prompt 1 " in line and "byte 0xED" in line and "not valid text" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_lone_surrogate_in_a_prompts_file_names_the_line_and_field(models, tmp_path, capsys, suffix):
    prompts = tmp_path / f"p{suffix}"
    if suffix == ".jsonl":
        prompts.write_text('{"prompt": "ok"}\n{"prompt": "x\\ud800y"}\n')
        where = f"{prompts}:2: field 'prompt'"
    else:
        prompts.write_text('["ok", "x\\ud800y"]')
        where = f"{prompts}: item 1: the string"
    for extra in ([], ["--output", str(tmp_path / "o.jsonl")]):
        line = refused(capsys, ["generate", "--model", str(models[1]), "--prompts-file", str(prompts), *extra, *GEN])
        assert where in line and "U+D800" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == [prompts.name]


# -- output and model paths --------------------------------------------------------------------------------------------
def test_an_output_that_is_a_device_is_refused_and_nothing_is_written_beside_it(models, capsys):
    side = Path("/dev/full.config.json")
    existed = side.exists()
    try:
        line = refused(capsys, ["generate", "--model", str(models[1]), "--prompt", "hi", "--output", "/dev/full",
                                *GEN])
        assert "'/dev/full' is not a regular file" in line
        assert side.exists() == existed
    finally:
        if side.exists() and not existed:
            side.unlink()


def test_a_model_path_that_is_a_file_says_so(models, capsys):
    line = refused(capsys, ["generate", "--model", str(models[1] / "config.json"), "--prompt", "hi", *GEN])
    assert "is a file, not a model folder" in line and str(models[1]) in line


# -- sizes and counts --------------------------------------------------------------------------------------------------
def test_a_prompt_line_far_longer_than_the_context_is_refused_before_tokenising(models, tmp_path, capsys,
                                                                                 monkeypatch):
    import dsl_llada.core.loading as loading

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "the ocean " * 300_000}) + "\n")  # 3 MB on one line
    encoded = []
    real = loading.encode_messages
    monkeypatch.setattr(loading, "encode_messages", lambda *a, **k: encoded.append(1) or real(*a, **k))
    line = refused(capsys, ["generate", "--model", str(models[1]), "--prompts-file", str(prompts), *GEN])
    assert "prompt 0 is too long: its 3,000,000 characters are at least" in line and "context of 64" in line
    assert encoded == []  # refused on the character count: the prompt was never tokenised


def test_more_threads_than_cpus_warns(models, capsys):
    capsys.readouterr()
    n = usable_cpus() + 1
    assert main(["generate", "--model", str(models[1]), "--prompt", "hi", "--threads", str(n), *GEN]) == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert warnings == [f"warning: --threads {n} is more than the {usable_cpus()} CPU(s) this process may use; the "
                        f"extra threads only compete for them (usually slower) — use --threads {usable_cpus()} or "
                        f"fewer"]
    capsys.readouterr()
    assert main(["generate", "--model", str(models[1]), "--prompt", "hi", "--threads", "1", *GEN]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_a_negative_demo_seed_names_the_flag(tmp_path, capsys):
    line = refused(capsys, ["demo", "--quick", "--seed", "-1", "--out", str(tmp_path / "d")])
    assert line.startswith("error: --seed -1 is out of range") and "2147483647" in line
    assert not (tmp_path / "d").exists()


# -- convert killed or terminated inside the weights write -------------------------------------------------------------
def _convert_dying_in_save(backbone: Path, out: Path, how: str) -> subprocess.CompletedProcess:
    """`convert` whose weights write is interrupted: `kill9` dies as safetensors leaves its half-written
    `.tmpXXXXXX` file in the temp folder; `term` receives SIGTERM while the write is in progress."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    code = ("import os, signal, sys\nfrom pathlib import Path\nimport dsl_llada.core.checkpoint as c\nreal = c._save\n"
            "def save(t, p):\n"
            f"    if {how == 'kill9'}:\n"
            "        (Path(p).parent / '.tmpAb12Cd').write_bytes(b'\\0' * 4096)\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    real(t, p)\n"
            "c._save = save\nfrom dsl_llada.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, "convert", str(backbone), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_convert_killed_in_the_weights_write_leaves_a_folder_the_next_run_removes(models, tmp_path, capsys):
    out = tmp_path / "dsl"
    r = _convert_dying_in_save(models[0], out, "kill9")
    assert r.returncode == -9
    (stale,) = [p for p in tmp_path.iterdir() if p.name.startswith(".dsl.") and p.name.endswith(".tmp")]
    assert (stale / ".tmpAb12Cd").is_file()
    capsys.readouterr()
    assert main(["convert", str(models[0]), str(out)]) == 0
    assert f"removed {str(stale)!r}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dsl"]


def test_sigterm_during_convert_removes_its_temp_folder(models, tmp_path):
    out = tmp_path / "dsl"
    r = _convert_dying_in_save(models[0], out, "term")
    assert r.returncode == 143, r.stderr
    assert error_lines(r.stderr) == ["error: terminated (SIGTERM); the output being written was removed, finished "
                                     "ones are kept"]
    assert list(tmp_path.iterdir()) == []  # no temp folder, no output, no lock file
