"""The commands as library calls: each `run_X(XSettings(...))` does the job of `dsl-llada X` without the command
line (a notebook's way in), with the command's checks and exit codes."""

from __future__ import annotations

import pytest
import torch
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
