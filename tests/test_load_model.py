"""`loading.load_model`, the one function every entry point loads weights with: through the handle `open_model`
(commands, convert's backbone, the toy demo's cached stages and shipped model), or directly for the trainer's
starting point, whose tokenizer is a setting of its own."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_dsl

from dsl_llada.core.backbones import save_backbone
from dsl_llada.core.backbones.base import Backbone, SpecialTokens
from dsl_llada.errors import CheckpointError
from dsl_llada.core.loading import load_model, open_model
from dsl_llada.core.model_source import ModelSource
from dsl_llada.core.model import DSLModel
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


def test_the_handle_opens_a_backbone_alone_with_the_callers_ids_and_an_optional_tokenizer(folders):
    root, dsl = folders
    source = ModelSource(path=str(root / "dsl"), device="cpu", dtype="float32")
    with pytest.raises(CheckpointError, match=r"no tokenizer in .*dsl'"):  # the folders hold no tokenizer files
        open_model(source)
    whole = open_model(source, tokenizer_optional=True)
    assert whole.tokenizer is None and isinstance(whole.model, DSLModel) and whole.dtype == torch.float32
    mine = SpecialTokens(mask=63, eos=60, eot=None, pad=59, bos=None)
    alone = open_model(source, backbone_only=True, special=mine, tokenizer_optional=True)
    assert isinstance(alone.model, Backbone) and not isinstance(alone.model, DSLModel)
    assert alone.special == alone.model.special == mine
    assert all(torch.equal(v, dsl.backbone.state_dict()[k]) for k, v in alone.model.state_dict().items())
