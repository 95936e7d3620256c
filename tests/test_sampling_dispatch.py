"""The config names its sampler (`sampler_name`, a row of the registry) and `sample` runs that row's function."""

from __future__ import annotations

import pytest
import torch

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.generate.generation import SAMPLERS, run_sampler
from dsl_llada.sampling import PromptBatch, sample, sample_block_sde, sample_remask, sample_sde
from helpers import gen, tiny_dsl

CASES = [  # (config, name, the sampler it must equal)
    (SDEConfig(nfe=2, gen_length=4, top_m=8), "sde", sample_sde),
    (SDEConfig(nfe=2, gen_length=4, top_m=8, block_length=2), "block-sde", sample_block_sde),
    (RemaskConfig(steps=2, gen_length=4, temperature=1.0), "remask", sample_remask),
    (RemaskConfig(steps=2, gen_length=4, temperature=1.0, remdm=True, remdm_t_on=0.9), "remdm", sample_remask),
]


@pytest.fixture(scope="module")
def model():
    return tiny_dsl(seed=0)


@pytest.mark.parametrize(("config", "name", "direct"), CASES, ids=[c[1] for c in CASES])
def test_config_type_picks_the_sampler_and_names_it(model, config, name, direct):
    pb = PromptBatch.from_lists([[1, 2], [3]], model.special.pad_id)
    out = sample(model, pb, config, generator=[gen(1), gen(2)])
    ref = direct(model, pb, config, generator=[gen(1), gen(2)])
    assert torch.equal(out.ids, ref.ids) and out.forward_passes == ref.forward_passes
    assert config.sampler_name == name == out.config["sampler"]
    assert torch.equal(run_sampler(model, pb, config, generator=[gen(1), gen(2)]).ids, out.ids)
    assert name in SAMPLERS


def test_a_remdm_config_cannot_be_labelled_remask():
    """A record's sampler name is derived from its config, never given next to it."""
    assert RemaskConfig(remdm=True).sampler_name == "remdm" and RemaskConfig().sampler_name == "remask"


def test_bad_model_or_config_type(model):
    pb = PromptBatch.from_lists([[1, 2]], model.special.pad_id)
    with pytest.raises(ValueError, match="'block-sde' needs a DSL checkpoint"):
        sample(model.backbone, pb, SDEConfig(nfe=2, gen_length=4, block_length=2))
    with pytest.raises(TypeError, match="dict names no sampler"):
        sample(model, pb, {"nfe": 2})  # type: ignore[arg-type]
