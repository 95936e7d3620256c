"""The commands as library calls: each `run_X(XSettings(...))` does the job of `dsl-llada X` without the command
line (a notebook's way in), with the command's checks and exit codes."""

from __future__ import annotations

import pytest
import torch
from eval_fixtures import eval_models  # noqa: F401  (session fixture)
from helpers import toy_backbone_folder

from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.convert_command import ConvertSettings, run_convert
from dsl_llada.errors import CheckpointError
from dsl_llada.model import DSLModel


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    return toy_backbone_folder(tmp_path_factory.mktemp("lib") / "backbone")


def _convert(backbone, out, seed: int) -> DSLModel:
    cfg = DSLConfig(converter=ConverterConfig(noise_dim=8, noise_seed=seed))
    assert run_convert(ConvertSettings(str(backbone), str(out), cfg)) == 0
    return DSLModel.from_pretrained(out)


def test_run_convert_writes_a_checkpoint_its_seed_decides(backbone_dir, tmp_path, capsys):
    a, b, c = (_convert(backbone_dir, tmp_path / name, seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert a.noise_dim == 8 and (tmp_path / "a" / "tokenizer.json").is_file()
    assert "wrote DSL checkpoint to" in capsys.readouterr().out
    assert torch.equal(a.noise_embed.weight, b.noise_embed.weight)  # same seed, same noise table
    assert not torch.equal(a.noise_embed.weight, c.noise_embed.weight)  # another seed, another table


def test_run_convert_refuses_a_dsl_checkpoint_and_bad_settings(backbone_dir, tmp_path, capsys):
    _convert(backbone_dir, tmp_path / "dsl", 0)
    with pytest.raises(CheckpointError, match="is already a DSL checkpoint"):
        run_convert(ConvertSettings(str(tmp_path / "dsl"), str(tmp_path / "again")))
    assert not (tmp_path / "again").exists()
    with pytest.raises(ValueError, match=r"dtype='fp8' is not valid; expected one of \['bf16'"):
        ConvertSettings(str(backbone_dir), str(tmp_path / "x"), dtype="fp8")
    with pytest.raises(ValueError, match="convert needs an OUTPUT folder"):
        run_convert(ConvertSettings(str(backbone_dir)))
    assert run_convert(ConvertSettings(str(backbone_dir), dry_run=True)) == 0
    assert "(nothing written)" in capsys.readouterr().out


# -- eval run ------------------------------------------------------------------------------------------------------
def _eval_settings(models, out, **kw):
    from eval_fixtures import base_config, data_dir

    from dsl_llada.eval.eval_command import EvalRunSettings
    from dsl_llada.eval.eval_config import EvalConfig

    task = {"name": "generation", "options": {}, "datasets": [
        {"name": "p", "path": str(data_dir() / "prompts_200.jsonl"), "kind": "prompts", "limit": 2, "gen_length": 8}]}
    return EvalRunSettings(EvalConfig.from_dict(base_config(models, [task])), str(out), progress=False, **kw)


def test_run_eval_command_runs_then_resumes(eval_models, tmp_path, capsys, one_thread):  # noqa: F811
    import json

    from dsl_llada.eval.eval_command import run_eval_command

    assert run_eval_command(_eval_settings(eval_models, tmp_path / "run", report=False)) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["items"] == first["run_now"] == 4 and first["errors_now"] == 0  # 2 prompts x 2 methods
    assert first["summary"] is None and (tmp_path / "run").is_dir()
    assert run_eval_command(_eval_settings(eval_models, tmp_path / "run", report=False)) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["items"] == 4 and again["run_now"] == 0  # every item was finished: nothing re-runs


def test_eval_run_settings_refuse_contradictions(eval_models, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="pass either --overwrite or --new-run, not both"):
        _eval_settings(eval_models, tmp_path / "r", overwrite=True, new_run=True)
    with pytest.raises(ValueError, match=r"--max-error-rate=1.5 must be a fraction in \[0, 1\]"):
        _eval_settings(eval_models, tmp_path / "r", max_error_rate=1.5)
    assert not (tmp_path / "r").exists()


# -- train ---------------------------------------------------------------------------------------------------------
def test_run_train_trains_and_prints_the_summary(tmp_path, capsys, monkeypatch):
    import json
    from pathlib import Path

    from dsl_llada.train.train_command import TrainSettings, run_train
    from dsl_llada.train.train_config import load_train_config

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the toy preset's corpus path is relative to the root
    out = tmp_path / "toy"
    config = load_train_config("configs/toy.yaml", [f"output_dir={out}", "max_steps=2", "save_every=2",
                                                    "eval_every=2", "data.block_size=32", "per_device_batch_size=2",
                                                    "progress=false"])
    assert run_train(TrainSettings(config)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["final_step"] == 2 and summary["stop_reason"] == "max_steps"
    assert summary["output_dir"] == str(out) and (out / "final" / "model.safetensors").is_file()
    assert DSLModel.from_pretrained(out / "final").vocab_size == 258
