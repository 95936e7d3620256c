"""The toy evaluation samples through generation.sample_in_batches with its own seed formula (seed * 100003 + i)."""

from __future__ import annotations

import pytest
import torch

from dsl_llada.config import SDEConfig
from dsl_llada.generation import run_sampler
from dsl_llada.model import DSLModel
from dsl_llada.sampling import PromptBatch
from dsl_llada.toy import ToyWorld, ToyWorldConfig
from dsl_llada.toy.evaluate import Method, sample_records
from dsl_llada.toy.tasks import make_split, render_prompt, response_words
from helpers import toy_backbone


@pytest.fixture(scope="module")
def toy():
    world = ToyWorld(ToyWorldConfig(n_topics=2))
    tok, bb = toy_backbone(world)
    return world, tok, {"dsl": DSLModel.convert(bb).eval()}


@pytest.mark.parametrize("seed", [0, 3])
def test_records_use_the_toy_seed_formula_and_the_shared_sampler_path(toy, seed):
    world, tok, models = toy
    examples = make_split(world, 3, "open", split="test")
    # 'Algorithm 2 as printed': on this random model the default (predictor noise) amplifies the ~1e-6 difference
    # between a batch of 2 and a batch of 1 into other tokens (see tests/test_serve.py)
    method = Method("DSL-SDE", "dsl", "sde", {"eta": 0.5, "predictor_noise": False})
    recs = sample_records(models, world, tok, examples, [method], [2], gen_length=8, batch_size=2, seed=seed)
    assert [r["seed"] for r in recs] == [seed * 100_003 + i for i in range(3)]
    choice = method.config(2, 8)
    assert choice == SDEConfig(nfe=2, gen_length=8, eta=0.5, predictor_noise=False)
    assert choice.sampler_name == "sde"
    for i, (ex, rec) in enumerate(zip(examples, recs)):  # prompt i alone with its own seed gives the same output
        ids = tok.encode(render_prompt(ex.prompt), add_special_tokens=False)
        out = run_sampler(models["dsl"], PromptBatch.from_lists([ids], models["dsl"].special.pad_id), choice,
                          generator=[torch.Generator().manual_seed(seed * 100_003 + i)])
        text = tok.decode(out.ids[0].tolist(), skip_special_tokens=False)
        assert rec["output"] == " ".join(response_words(text))
        assert rec["forward_passes"] == out.forward_passes == 3
