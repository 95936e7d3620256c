"""The toy evaluation samples through generation.sample_in_batches with its own seed formula (seed * 100003 + i)."""

from __future__ import annotations

import pytest
import torch

from dsl_llada.config import SDEConfig
from dsl_llada.generate.generation import run_sampler
from dsl_llada.core.model import DSLModel
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


def test_seed_free_samplers_are_the_greedy_remasking_rows():
    from dsl_llada.toy.evaluate import ORACLE_METHODS, PAPER_METHODS, seed_free
    free = {m.name for m in PAPER_METHODS + ORACLE_METHODS if seed_free(m.config(16, 32))}
    assert free == {"LLaDA", "LLaDA+EOS", "LLaDA+EOS+Block", "DSL-Remask", "Oracle LLaDA"}  # not ReMDM, no SDE
    assert not seed_free(Method("t", "base", "remask", {"temperature": 0.5}).config(4, 8))
    assert not seed_free(Method("r", "base", "remask", {"remasking": "random"}).config(4, 8))


@pytest.mark.parametrize("seed", [0, 5])
def test_a_seed_free_sampler_samples_a_repeated_prompt_once_with_the_same_records(toy, seed, monkeypatch):
    """Examples 3 and 4 repeat examples 0 and 1, and a second sampling seed repeats them all: only the 3 distinct
    prompts are sampled, and every record equals that of the prompt run alone with its own seed."""
    from dsl_llada.sampling import batches
    world, tok, models = toy
    base = make_split(world, 3, "open", split="test")
    assert len({ex.prompt for ex in base}) == 3
    examples = base + base[:2]
    method = Method("LLaDA", "dsl", "remask")
    sampled: list[int] = []
    run_batch = batches.run_batch
    monkeypatch.setattr(batches, "run_batch", lambda model, ids, *a, **k: sampled.append(len(ids)) or run_batch(model, ids, *a, **k))
    reuse: dict = {}
    first = sample_records(models, world, tok, examples, [method], [4], gen_length=8, batch_size=4, seed=seed, reuse=reuse)
    again = sample_records(models, world, tok, examples, [method], [4], gen_length=8, batch_size=4, seed=seed,
                           sample_seed=1, reuse=reuse)
    assert sampled == [3]  # the grid [0, 4) less position 3, then [4, 5) empty; nothing under the second seed
    assert len(reuse) == 3
    assert [r["seed"] for r in first] == [seed * 100_003 + i for i in range(5)]
    assert [r["seed"] for r in again] == [seed * 100_003 + 1_000_003 + i for i in range(5)]
    assert [r["output"] for r in first[3:]] == [r["output"] for r in first[:2]]
    assert [{**r, "seed": 0, "sample_seed": 0} for r in again] == [{**r, "seed": 0, "sample_seed": 0} for r in first]
    config = method.config(4, 8)
    for i, (ex, rec) in enumerate(zip(examples, first)):  # each prompt alone, with its own seed: the same text
        ids = tok.encode(render_prompt(ex.prompt), add_special_tokens=False)
        out = run_sampler(models["dsl"], PromptBatch.from_lists([ids], models["dsl"].special.pad_id), config,
                          generator=[torch.Generator().manual_seed(seed * 100_003 + 77 * i)])
        assert rec["output"] == " ".join(response_words(tok.decode(out.ids[0].tolist(), skip_special_tokens=False)))
        assert rec["forward_passes"] == out.forward_passes == 4


def test_a_seeded_sampler_samples_every_row(toy, monkeypatch):
    from dsl_llada.sampling import batches
    world, tok, models = toy
    examples = make_split(world, 2, "open", split="test")
    examples = examples + examples
    sampled: list[int] = []
    run_batch = batches.run_batch
    monkeypatch.setattr(batches, "run_batch", lambda model, ids, *a, **k: sampled.append(len(ids)) or run_batch(model, ids, *a, **k))
    method = Method("ReMDM", "dsl", "remask", {"remdm": True})
    reuse: dict = {}
    sample_records(models, world, tok, examples, [method], [4], gen_length=8, batch_size=4, reuse=reuse)
    assert sampled == [4] and reuse == {}


def test_steps_a_block_cannot_use_change_no_token(toy):
    """Greedy remasking with more steps per block than positions commits one position per step and then only runs
    the model: its tokens are those of the config with one step per position. With a temperature the idle steps
    still draw, so the next block's draws differ: that config is left as it is."""
    from dsl_llada.config import RemaskConfig
    from dsl_llada.sampling.remask import fewest_equivalent_steps
    world, tok, models = toy
    long = RemaskConfig(steps=16, gen_length=8, block_length=4)
    assert fewest_equivalent_steps(long) == long.replace(steps=8)
    assert fewest_equivalent_steps(long.replace(steps=8)) == long.replace(steps=8)
    for unchanged in (long.replace(remdm=True), long.replace(threshold=0.9), long.replace(eos_suppress_ratio=0.5),
                      long.replace(temperature=0.7), long.replace(remasking="random")):
        assert fewest_equivalent_steps(unchanged) == unchanged
    ids = [tok.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in make_split(world, 3, "open", "test")]
    batch = PromptBatch.from_lists(ids, models["dsl"].special.pad_id)
    outs = [run_sampler(models["dsl"], batch, c, generator=[torch.Generator().manual_seed(9 + i) for i in range(3)])
            for c in (long, long.replace(steps=8))]
    assert torch.equal(outs[0].ids, outs[1].ids) and (outs[0].forward_passes, outs[1].forward_passes) == (16, 8)
    hot = [run_sampler(models["dsl"], batch, c.replace(temperature=0.7), generator=[torch.Generator().manual_seed(9)
                                                                                   for _ in range(3)])
           for c in (long, long.replace(steps=8))]
    assert torch.equal(hot[0].ids[:, :4], hot[1].ids[:, :4]) and not torch.equal(hot[0].ids, hot[1].ids)


def test_a_seed_free_run_at_more_steps_than_positions_reuses_the_shorter_run(toy, monkeypatch):
    from dsl_llada.sampling import batches
    world, tok, models = toy
    examples = make_split(world, 3, "open", split="test")
    sampled: list[int] = []
    run_batch = batches.run_batch
    monkeypatch.setattr(batches, "run_batch", lambda model, ids, *a, **k: sampled.append(len(ids)) or run_batch(model, ids, *a, **k))
    method = Method("LLaDA+EOS", "dsl", "remask", {"eos_inf": True})
    reuse: dict = {}
    both = sample_records(models, world, tok, examples, [method], [8, 16], gen_length=8, batch_size=4, reuse=reuse)
    assert sampled == [3]  # NFE 16 on 8 positions writes what NFE 8 wrote
    steps: list[int] = []
    monkeypatch.setattr(batches, "run_batch", lambda model, ids, config, *a, **k: steps.append(config.steps)
                        or run_batch(model, ids, config, *a, **k))
    alone = sample_records(models, world, tok, examples, [method], [16], gen_length=8, batch_size=4)
    assert steps == [8]  # NFE 16 alone runs as NFE 8, the 8 steps that commit nothing left out
    assert both[3:] == alone and [r["forward_passes"] for r in both] == [8] * 3 + [16] * 3
    config = method.config(16, 8)
    for ex, rec in zip(examples, alone):  # the full 16 steps, each prompt alone: the same text
        ids = tok.encode(render_prompt(ex.prompt), add_special_tokens=False)
        out = run_sampler(models["dsl"], PromptBatch.from_lists([ids], models["dsl"].special.pad_id), config)
        assert rec["output"] == " ".join(response_words(tok.decode(out.ids[0].tolist(), skip_special_tokens=False)))
        assert rec["forward_passes"] == out.forward_passes == 16
