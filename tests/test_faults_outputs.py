"""Faults around output folders and files: convert/train/demo never delete what they did not write,
damaged weights and full disks end in one error line, files get the user's umask, the demo cache is verified.

Each test runs the command as a user would (`dsl_llada.cli.main`) and asserts the exit code, the single error
line, and that nothing the user had is gone.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from faults_helpers import error_lines, make_backbone_dir, snapshot
from safetensors import SafetensorError

import dsl_llada.core.checkpoint as checkpoint_mod
from dsl_llada.cli.main import main
from dsl_llada.core.model import DSLModel
from dsl_llada.artifacts.outputs import OutputError, is_own_artifact, prepare_output_dir
from dsl_llada.artifacts.atomic import atomic_write_text
from dsl_llada.artifacts.figures import save_figure

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return make_backbone_dir(tmp_path_factory.mktemp("faults-out") / "backbone")


def one_error(capsys) -> str:
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


# -- convert never deletes -------------------------------------------------------------------------------------------
def test_convert_refuses_a_folder_holding_the_source_and_user_files(backbone, tmp_path, capsys):
    p = tmp_path / "p"
    (p / "backbone").mkdir(parents=True)
    for f in backbone.iterdir():
        (p / "backbone" / f.name).write_bytes(f.read_bytes())
    (p / "notes").write_text("x\n")
    before = snapshot(p)
    for extra in ([], ["--overwrite"]):
        assert main(["convert", str(p / "backbone"), str(p), *extra]) == 2
        line = one_error(capsys)
        assert "contains the input" in line and str(p / "backbone") in line
        assert snapshot(p) == before  # the source and the user's notes are untouched


def test_convert_refuses_a_regular_file_even_with_overwrite(backbone, tmp_path, capsys):
    f = tmp_path / "model-out"
    f.write_text("my data\n")
    for extra in ([], ["--overwrite"]):
        assert main(["convert", str(backbone), str(f), *extra]) == 2
        assert "is not a folder" in one_error(capsys)
        assert f.read_text() == "my data\n"


def test_convert_refuses_a_foreign_folder_even_with_overwrite(backbone, tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text("{}")  # looks like a model folder, but holds a file we never write
    (d / "thesis.tex").write_text("chapter 1")
    before = snapshot(d)
    for extra in ([], ["--overwrite"]):
        assert main(["convert", str(backbone), str(d), *extra]) == 2
        line = one_error(capsys)
        assert "thesis.tex" in line and "not a checkpoint written by dsl-llada" in line
        assert snapshot(d) == before


def test_convert_replaces_its_own_checkpoint_only_with_overwrite(backbone, tmp_path, capsys):
    out = tmp_path / "dsl"
    assert main(["convert", str(backbone), str(out), "--noise-dim", "8", "--seed", "1"]) == 0
    capsys.readouterr()
    first = snapshot(out)
    assert main(["convert", str(backbone), str(out), "--noise-dim", "8", "--seed", "2"]) == 2
    assert "already holds a checkpoint; pass --overwrite" in one_error(capsys)
    assert snapshot(out) == first
    assert main(["convert", str(backbone), str(out), "--noise-dim", "8", "--seed", "2", "--overwrite"]) == 0
    assert snapshot(out)["model.safetensors"] != first["model.safetensors"]  # a different noise-embedding seed
    assert DSLModel.from_pretrained(out).config.converter.noise_seed == 2
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "temp folders left behind"


def test_convert_inside_the_source_needs_overwrite_and_never_touches_it(backbone, tmp_path, capsys):
    src = tmp_path / "bb"
    src.mkdir()
    for f in backbone.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    before = snapshot(src)
    assert main(["convert", str(src), str(src / "dsl"), "--noise-dim", "8"]) == 2
    assert "is inside the input" in one_error(capsys)
    assert snapshot(src) == before
    assert main(["convert", str(src), str(src / "dsl"), "--noise-dim", "8", "--overwrite"]) == 0
    assert {k: v for k, v in snapshot(src).items() if not k.startswith("dsl/")} == before


# -- full disk while writing a checkpoint ------------------------------------------------------------------------------
def test_convert_on_a_full_disk_cleans_up_and_keeps_the_previous_checkpoint(backbone, tmp_path, capsys, monkeypatch):
    out = tmp_path / "dsl"
    assert main(["convert", str(backbone), str(out), "--noise-dim", "8"]) == 0
    capsys.readouterr()
    before = snapshot(out)
    real_save = checkpoint_mod.save_file

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # a partial file, then the device is full (as safetensors reports it)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint_mod, "save_file", full_disk)
    assert main(["convert", str(backbone), str(out), "--noise-dim", "8", "--seed", "3", "--overwrite"]) == 2
    line = one_error(capsys)
    assert "no space left on the device" in line and "model.safetensors" in line
    assert snapshot(out) == before  # the previous checkpoint is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dsl"], "temp folder left behind"
    monkeypatch.setattr(checkpoint_mod, "save_file", real_save)


def test_atomic_write_on_a_full_disk_removes_its_temp_file(tmp_path, capsys, monkeypatch):
    target = tmp_path / "report.md"
    target.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as e:
        atomic_write_text(target, "new\n")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


# -- damaged weights -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["zero-byte", "truncated", "random"])
def test_damaged_safetensors_is_one_line_naming_the_file(backbone, tmp_path, capsys, damage):
    d = tmp_path / "broken"
    d.mkdir()
    for f in backbone.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    w = d / "model.safetensors"
    data = w.read_bytes()
    w.write_bytes({"zero-byte": b"", "truncated": data[: len(data) // 2],
                   "random": torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                           dtype=torch.uint8).numpy().tobytes()}[damage])
    assert main(["generate", "--model", str(d), "--prompt", "hi", "--sampler", "remask", "--steps", "2",
                 "--gen-length", "4", "-q"]) == 2
    line = one_error(capsys)
    assert str(w) in line and "truncated or damaged" in line
    assert main(["convert", str(d), str(tmp_path / "out")]) == 2
    assert str(w) in one_error(capsys) and not (tmp_path / "out").exists()


# -- file modes ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_outputs_follow_the_umask(backbone, tmp_path, capsys, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        out = tmp_path / "dsl"
        assert main(["convert", str(backbone), str(out), "--noise-dim", "8"]) == 0
        rec = tmp_path / "r.jsonl"
        assert main(["generate", "--model", str(out), "--prompt", "hi", "--sampler", "remask", "--steps", "2",
                     "--gen-length", "4", "-q", "--output", str(rec)]) == 0
        atomic_write_text(tmp_path / "plain.txt", "x")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        save_figure(plt.figure(figsize=(1, 1)), tmp_path / "plot.png")  # every report figure goes through it
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    files = [*out.iterdir(), rec, Path(str(rec) + ".config.json"), tmp_path / "plain.txt", tmp_path / "plot.png"]
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: oct(file_mode) for p in files}


# -- train and demo output folders -----------------------------------------------------------------------------------
def test_train_refuses_a_foreign_output_dir_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "home"
    out.mkdir()
    (out / "paper.pdf").write_text("%PDF")
    assert main(["train", "--config", "configs/toy.yaml", f"output_dir={out}", "max_steps=1", "-q"]) == 2
    line = one_error(capsys)
    assert "paper.pdf" in line and "not a training run" in line
    assert sorted(p.name for p in out.iterdir()) == ["paper.pdf"]


def test_prepare_output_dir_rules(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-5" / "trainer_state").mkdir(parents=True)
    (run / "train_config.json").write_text("{}")
    (run / "my-notes.txt").write_text("keep")
    # a training run is continued (reuse), even holding a note of the user's; never replaced
    assert prepare_output_dir(run, kind="training run", reuse=True) == run.absolute()
    assert not is_own_artifact(run, "training run")
    with pytest.raises(OutputError, match="not a checkpoint"):
        prepare_output_dir(run, overwrite=True, kind="checkpoint")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_output_dir(empty, kind="checkpoint") == empty.absolute()
    with pytest.raises(OutputError, match="is the input"):
        prepare_output_dir(empty, overwrite=True, sources=[empty])
    with pytest.raises(ValueError, match="registered artifact kind"):
        prepare_output_dir(empty, kind="nope")


def test_demo_out_unwritable_fails_before_any_training(capsys, monkeypatch):
    if not Path("/proc/self").is_dir():
        pytest.skip("needs a Linux /proc (an unwritable folder even for root)")
    import dsl_llada.toy.demo as demo_mod

    def no_training(*a, **k):
        raise AssertionError("training started before the output folder was checked")

    monkeypatch.setattr(demo_mod, "run_stage", no_training)
    assert main(["demo", "--quick", "--out", "/proc/dsl-llada-demo", "-q"]) == 2
    line = one_error(capsys)
    assert "'/proc/dsl-llada-demo'" in line and "not writable" in line


def test_demo_out_foreign_folder_is_refused(tmp_path, capsys, monkeypatch):
    import dsl_llada.toy.demo as demo_mod

    monkeypatch.setattr(demo_mod, "run_stage", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    d = tmp_path / "results"
    d.mkdir()
    (d / "config.json").write_text('{"mine": 1}')
    assert main(["demo", "--quick", "--out", str(d), "-q"]) == 2
    assert "not a demo written by dsl-llada" in one_error(capsys)
    assert (d / "config.json").read_text() == '{"mine": 1}'


# -- the demo cache is verified ----------------------------------------------------------------------------------------
def test_demo_cache_damage_is_detected_and_rebuilt(tmp_path, monkeypatch):
    import dsl_llada.toy.demo as demo_mod
    from dsl_llada.toy.demo import Demo, DemoConfig

    calls = []

    def fake_stage(model, tok, train, stage, **kw):  # stands in for minutes of training: perturb the weights
        calls.append(stage.objective)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        return [1.0, 0.5]

    monkeypatch.setattr(demo_mod, "run_stage", fake_stage)
    cfg = DemoConfig(n_train=8, d_model=16, n_layers=1, n_heads=2, noise_dim=8)
    echoed: list[str] = []
    demo = Demo(cfg, tmp_path / "demo", progress=False, echo=echoed.append)
    train = demo.corpora()[0]
    bb = demo.pretrained(train)
    assert calls == ["mdm"]
    cached = next((tmp_path / "demo" / "cache").iterdir())
    assert json.loads((cached / "checksums.json").read_text()).keys() >= {"model.safetensors", "config.json"}
    demo.pretrained(train)
    assert calls == ["mdm"] and "cached" in echoed[-1]  # a verified hit
    for damage in ("flip", "truncate"):
        w = cached / "model.safetensors"
        data = bytearray(w.read_bytes())
        if damage == "flip":
            data[-10] ^= 0x01  # one bit of one weight: loads fine, and would silently be used without the checksum
        else:
            data = data[: len(data) // 2]
        w.write_bytes(bytes(data))
        echoed.clear()
        rebuilt = demo.pretrained(train)
        assert calls[-1] == "mdm" and len(calls) == (2 if damage == "flip" else 3)
        warnings = [e for e in echoed if e.startswith("warning:")]
        assert len(warnings) == 1 and "model.safetensors does not match its checksum" in warnings[0]
        ref = bb.state_dict()
        assert all(torch.equal(v, ref[k]) for k, v in rebuilt.state_dict().items())  # the same stage, rebuilt
    assert demo_mod.verify_checksums(cached) is None
    n = len(calls)
    (cached / "checksums.json").unlink()  # a complete stage cached by a version without checksums: adopted
    demo.pretrained(train)
    assert len(calls) == n and any("predates checksums" in e for e in echoed)
    assert demo_mod.verify_checksums(cached) is None
    (cached / "checksums.json").unlink()
    (cached / "loss_curve.json").unlink()  # a stage interrupted before its last file: rebuilt
    echoed.clear()
    demo.pretrained(train)
    assert len(calls) == n + 1 and "no checksums.json" in echoed[0]
