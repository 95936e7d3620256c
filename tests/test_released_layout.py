"""The released DSL-LLaDA layout (a DSL checkpoint folder without dsl_config.json) opens through every entry point
with the one opt-in, `assume_released`, and is refused without it with the same message everywhere: `generate`,
`serve`, `ui`, an evaluation's model entry, the lm-eval adapter and the library (`open_model`)."""

from __future__ import annotations

import json
import shutil

import pytest
from faults_helpers import error_lines, make_dsl_dir

from dsl_llada.cli.main import main
from dsl_llada.core.loading import open_model
from dsl_llada.core.model import DSLModel, check_released_opt_in
from dsl_llada.core.model_source import ModelSource

REFUSAL = "is a DSL checkpoint without dsl_config.json"
OPT_INS = ("--assume-released", "'assume_released: true'", "assume_released=true", "assume_released=True")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(a DSL checkpoint, the same folder in the released layout: without dsl_config.json)."""
    root = tmp_path_factory.mktemp("released")
    dsl = make_dsl_dir(root)
    released = root / "released"
    shutil.copytree(dsl, released)
    (released / "dsl_config.json").unlink()
    return dsl, released


def the_refusal(folder) -> str:
    with pytest.raises(ValueError) as e:
        check_released_opt_in(folder, False)
    return str(e.value)


def test_the_refusal_names_every_spelling_of_the_opt_in(folders):
    text = the_refusal(folders[1])
    assert REFUSAL in text and all(o in text for o in OPT_INS), text
    check_released_opt_in(folders[1], True)  # opted in: no refusal
    check_released_opt_in(folders[0], False)  # a checkpoint with its config needs none


def test_library(folders):
    with pytest.raises(ValueError) as e:
        open_model(ModelSource(path=str(folders[1]), device="cpu", dtype="float32"))
    assert str(e.value) == the_refusal(folders[1])
    handle = open_model(ModelSource(path=str(folders[1]), device="cpu", dtype="float32", assume_released=True))
    assert isinstance(handle.model, DSLModel) and handle.model.config.context_embedding == "wte"
    assert not handle.model.noise_embed.weight.requires_grad  # the released layout's frozen noise embedding


def test_generate(folders, capsys):
    argv = ["generate", "--model", str(folders[1]), "--prompt", "the ocean", "--sampler", "sde", "--nfe", "2",
            "--gen-length", "4", "-q", "--device", "cpu", "--dtype", "float32"]
    assert main(argv) == 2
    assert error_lines(capsys.readouterr().err) == [f"error: {the_refusal(folders[1])}"]
    assert main([*argv, "--assume-released"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["index"] == 0


@pytest.mark.parametrize("command", ["serve", "ui"])
def test_serve_and_ui(folders, capsys, monkeypatch, command):
    """Refused by the command (exit 2 before anything is served); with the flag, the command serves the released
    DSL model (the HTTP server itself is replaced by a recorder here)."""
    from dsl_llada.serve import server, ui

    served: list = []
    monkeypatch.setattr(server, "run_uvicorn", lambda app, *a, **k: served.append(app) or 0)
    monkeypatch.setattr(server, "freeze_startup_objects", lambda: None)
    monkeypatch.setattr(ui, "build_app", lambda model, tok, **k: model)  # ui: the model it would show
    base = [command, "--model", str(folders[1]), "--device", "cpu", "--dtype", "float32", "--port", "0"]
    assert main(base) == 2
    assert error_lines(capsys.readouterr().err) == [f"error: {the_refusal(folders[1])}"]
    assert not served
    assert main([*base, "--assume-released"]) == 0
    (app,) = served
    model = app if command == "ui" else app.state.service.model
    assert isinstance(model, DSLModel) and model.config.context_embedding == "wte"


def test_eval(folders, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the ocean", "a river")))
    cfg = {"models": [{"name": "rel", "path": str(folders[1]), "dtype": "float32"}],
           "methods": [{"name": "DSL-SDE", "model": "rel", "preset": "dsl-sde"}],
           "tasks": [{"name": "generation", "datasets": [{"name": "p", "path": str(prompts), "kind": "prompts",
                                                          "gen_length": 4}]}],
           "nfe": [2], "seeds": [1], "batch_size": 2, "device": "cpu"}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    run = ["eval", "run", "--config", str(path), "--out", str(tmp_path / "run"), "-q"]
    assert main(run) == 2
    assert error_lines(capsys.readouterr().err) == [f"error: {the_refusal(folders[1])}"]
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    assert main([*run, "models.rel.assume_released=true"]) == 0, capsys.readouterr().err
    records = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["error"] is None for r in records)


def test_lm_eval(folders):
    pytest.importorskip("lm_eval")
    from dsl_llada.eval.lmeval import DSLLadaLM

    args = f"model_dir={folders[1]},sampler=remask,steps=2,gen_length=4,device=cpu,dtype=float32"
    with pytest.raises(ValueError) as e:
        DSLLadaLM.create_from_arg_string(args)
    assert str(e.value) == the_refusal(folders[1])
    lm = DSLLadaLM.create_from_arg_string(args + ",assume_released=true")
    assert isinstance(lm.model, DSLModel) and lm.model.config.context_embedding == "wte"
    with pytest.raises(ValueError, match="model_args assume_released='maybe' must be true or false"):
        DSLLadaLM.create_from_arg_string(args + ",assume_released=maybe")
