"""`RemaskConfig.compile`: the remasking samplers' backbone through `torch.compile` (plumbing only: a real inductor
compile takes minutes on this CPU; the GPU figures are in docs/benchmarks/gpu.md), and `generate --output` files written
before the field existed still resume."""

from __future__ import annotations

import json

import pytest
import torch
from faults_helpers import GENERATE_SAMPLING, make_dsl_dir
from helpers import gen, tiny_backbone, tiny_dsl

import dsl_llada.core.backbones.base as base
from dsl_llada.cli.main import main
from dsl_llada.config import RemaskConfig
from dsl_llada.errors import ConfigError
from dsl_llada.artifacts.records import settings_diff
from dsl_llada.sampling.common import PromptBatch
from dsl_llada.sampling.remask import sample_remask

CFG = RemaskConfig(steps=4, gen_length=8, temperature=1.0)


@pytest.fixture
def compiles(monkeypatch):
    """torch.compile replaced by the identity, recording what it was given."""
    seen: list = []
    monkeypatch.setattr(base.torch, "compile", lambda m: seen.append(m) or m)
    return seen


@pytest.mark.parametrize("kind", ["backbone", "dsl"])
def test_compile_routes_the_backbone_through_torch_compile_once(compiles, kind):
    model = tiny_backbone(seed=3) if kind == "backbone" else tiny_dsl(seed=3)
    backbone = model if kind == "backbone" else model.backbone
    pb = PromptBatch.from_lists([[1, 2, 3], [4, 5]], model.special.pad_id)
    eager = sample_remask(model, pb, CFG, generator=[gen(0), gen(1)])
    assert compiles == []
    a = sample_remask(model, pb, CFG.replace(compile=True), generator=[gen(0), gen(1)])
    b = sample_remask(model, pb, CFG.replace(compile=True, remdm=True), generator=[gen(0), gen(1)])
    assert compiles == [backbone]  # compiled once, kept on the backbone, reused by the next run
    assert "_compiled_call" not in backbone.state_dict()
    assert torch.equal(a.ids, eager.ids) and a.forward_passes == eager.forward_passes == 4
    assert b.forward_passes == 4
    # the seed matters (the comparison above is not vacuous)
    assert not torch.equal(sample_remask(model, pb, CFG.replace(compile=True), generator=[gen(7), gen(8)]).ids,
                           eager.ids)


def test_compile_is_validated():
    with pytest.raises(ConfigError, match="compile='yes' must be true or false"):
        RemaskConfig(compile="yes")
    with pytest.raises(ConfigError, match="compile=True with kv_cache='dual' is not supported"):
        RemaskConfig(kv_cache="dual", compile=True)
    assert RemaskConfig().compile is False and RemaskConfig.from_dict({"compile": True}).compile is True


def test_compile_needs_a_backbone(compiles):
    class Bare:
        special = tiny_backbone().special

        def logits_from_ids(self, ids, attention_mask=None, *, positions=None):
            raise AssertionError("not reached")

    pb = PromptBatch.from_lists([[1, 2]], Bare.special.pad_id)
    with pytest.raises(ConfigError, match="compile=True needs a Backbone or a DSLModel"):
        sample_remask(Bare(), pb, CFG.replace(compile=True))
    assert compiles == []


def test_settings_diff_takes_an_absent_field_at_its_default_as_equal():
    old = {"sampler": "remask", "config": {"steps": 4}}
    defaults = {"config": {"steps": 64, "compile": False}}
    assert settings_diff(old, {"sampler": "remask", "config": {"steps": 4, "compile": False}}, defaults=defaults) == []
    assert settings_diff(old, {"sampler": "remask", "config": {"steps": 4, "compile": True}}, defaults=defaults) == \
        ['config.compile ("<absent>" -> true)']
    # without defaults (or for a field the old file has) every difference counts
    assert settings_diff(old, {"sampler": "remask", "config": {"steps": 4, "compile": False}}) == \
        ['config.compile ("<absent>" -> false)']
    assert settings_diff({"config": {"steps": 64}}, {"config": {"steps": 4}}, defaults=defaults) == \
        ["config.steps (64 -> 4)"]


def test_an_output_written_before_the_compile_field_resumes(tmp_path, capsys):
    model = make_dsl_dir(tmp_path / "m")
    out = tmp_path / "out.jsonl"
    gen_args = ["generate", "--model", str(model), "--prompt", "ocean", "--prompt", "river", *GENERATE_SAMPLING,
                "--output", str(out)]
    assert main(gen_args) == 0
    first = out.read_text()
    settings_path = tmp_path / "out.jsonl.config.json"
    stored = json.loads(settings_path.read_text())
    assert stored["config"]["compile"] is False
    del stored["config"]["compile"]  # as written by a version without the field
    settings_path.write_text(json.dumps(stored))
    capsys.readouterr()
    assert main(gen_args) == 0  # resumed: everything was done, nothing appended
    assert out.read_text() == first
    # a setting that does differ is still refused
    assert main([*gen_args, "--compile"]) == 2
    assert "config.compile" in capsys.readouterr().err
