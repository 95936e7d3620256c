"""`loading.load_model`, the one function every entry point loads weights with (through `open_model`, or directly
for the toy demo's cached stages, the shipped toy model, convert's backbone and the trainer's starting point)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_dsl

from dsl_llada.backbones import save_backbone
from dsl_llada.backbones.base import Backbone, SpecialTokens
from dsl_llada.loading import load_model
from dsl_llada.model import DSLModel
from dsl_llada.train.components import load_training_model
from dsl_llada.train.train_config import TrainConfig


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    dsl = tiny_dsl(noise_dim=8)
    dsl.save_pretrained(root / "dsl")
    save_backbone(dsl.backbone, root / "bb")
    return root, dsl


def test_a_dsl_checkpoint_loads_whole_or_as_its_backbone(folders):
    root, dsl = folders
    whole = load_model(root / "dsl")
    assert isinstance(whole, DSLModel) and not whole.training
    assert torch.equal(whole.noise_embed.weight, dsl.noise_embed.weight)
    alone = load_model(root / "dsl", backbone_only=True)
    assert isinstance(alone, Backbone) and not isinstance(alone, DSLModel)
    assert alone.state_dict().keys() == dsl.backbone.state_dict().keys()
    assert all(torch.equal(v, dsl.backbone.state_dict()[k]) for k, v in alone.state_dict().items())
    assert isinstance(load_model(root / "bb", backbone_only=True), Backbone)


def test_the_callers_special_ids_win_over_the_folders(folders):
    root, dsl = folders
    assert load_model(root / "bb").special == dsl.special  # read from config.json
    mine = SpecialTokens(mask=63, eos=60, eot=None, pad=59, bos=None)
    for path in (root / "bb", root / "dsl"):
        assert load_model(path, special=mine).special == mine


def test_the_trainers_controls_start_from_a_dsl_checkpoints_backbone(folders):
    root, dsl = folders
    control = load_training_model(TrainConfig(init_from=str(root / "dsl"), objective="mdm"))
    assert isinstance(control, Backbone) and not isinstance(control, DSLModel)
    model = load_training_model(TrainConfig(init_from=str(root / "dsl"), objective="dsl"))
    assert isinstance(model, DSLModel) and torch.equal(model.noise_embed.weight, dsl.noise_embed.weight)
