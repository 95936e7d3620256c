"""Seeded regression values for every sampler on a tiny seeded DSL model.

Values: the exact response tokens of a fixed run, the number of backbone forwards, and the sum of |logits| over
every backbone forward of the run (a fingerprint of all intermediate states the sampler reads, not only of the
argmax). A change that moves any seeded output fails here. The logit sum is compared with a small relative
tolerance (other CPUs may round fp32 matrix products differently); the tokens are exact.

History: first recorded at commit 3fab959 (a later sampler refactor left every value unchanged). Re-recorded
once since: (a) backbones now return logits only for the rows a sampler reads, so the
logit sums cover those rows; (b) the posterior mean became one `embedding_bag`, whose summation order moves ê by
about one ulp — the tokens of 6 of the 7 runs are unchanged, and the chaotic `sde-predictor-noise` run (first Heun
step 0.01 -> 7 with almost no noise, on a random tiny model) amplifies that ulp into other tokens. That run is so
sensitive that even the intra-op thread count changes it, so this module runs on one thread.

A value pinned here must come back on every CPU (`ATEN_CPU_CAPABILITY=default`, `=avx2`, AVX-512, arm64;
`.ci/run` runs this module a second time under `default`). A chaotic trajectory pins the CPU, not the algorithm, so
`sde-predictor-noise` is no longer pinned: it is a same-machine determinism test (run twice -> identical tokens and
logit sums; other seeds -> other tokens). The six pinned runs keep their recorded values unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling import PromptBatch, sample_block_sde, sample_remask, sample_remdm, sample_sde
from helpers import gen, perturb_converter, tiny_dsl

EOT = 61
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12]]
SEEDS = (11, 12, 13)

# Every option that a default may change later is spelled out, so the values pin the algorithm, not the defaults.
_SDE = dict(gen_length=8, top_m=8, schedule="sensitive", gamma_min=0.01, gamma_max=100.0, beta_scale=2.0,
            truncate_at_eos=True)
RUNS = {
    "sde": (sample_sde, SDEConfig(nfe=8, eta=0.1, predictor_noise=False, **_SDE)),
    "sde-predictor-noise": (sample_sde, SDEConfig(nfe=8, eta=0.1, predictor_noise=True, **_SDE)),
    "block-sde": (sample_block_sde, SDEConfig(nfe=4, eta=0.1, predictor_noise=False, block_length=4, **_SDE)),
    "remask": (sample_remask, RemaskConfig(steps=8, gen_length=8, temperature=0.0)),
    "remask-random-T1": (sample_remask, RemaskConfig(steps=8, gen_length=8, temperature=1.0, remasking="random")),
    "remask-blocks-cfg": (sample_remask, RemaskConfig(steps=8, gen_length=8, block_length=4, temperature=1.0,
                                                      cfg_scale=0.5, eos_inf=True)),
    "remdm": (sample_remdm, RemaskConfig(steps=8, gen_length=8, temperature=1.0, remdm_alpha_loop=0.5,
                                         remdm_t_on=0.9)),
}

EXPECTED: dict[str, dict] = json.loads((Path(__file__).parent / "data" / "sampling_regression.json").read_text())
"""Recorded on CPU, fp32, one thread, with `run` below (see the module docstring for their history); never
re-record them to make a change pass: a change here is a change of every seeded output."""

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return perturb_converter(tiny_dsl(seed=0, beta_init=1.3, backbone_kw={"eot_token_id": EOT}))


def run(model, name: str, seeds=SEEDS) -> dict:
    """One seeded run of sampler `name` (one generator per row) with every backbone forward's logits summed."""
    fn, cfg = RUNS[name]
    total = [0.0]

    def hook(module, args, out):
        total[0] += float(out.detach().double().abs().sum())

    handle = model.backbone.register_forward_hook(hook)
    try:
        out = fn(model, PromptBatch.from_lists(PROMPTS, model.special.pad_id), cfg, generator=[gen(s) for s in seeds])
    finally:
        handle.remove()
    return {"ids": out.ids.tolist(), "lengths": out.lengths.tolist(), "nfe": out.nfe,
            "forward_passes": out.forward_passes, "abs_logit_sum": total[0]}


CHAOTIC = ("sde-predictor-noise",)
"""Runs whose tokens move with one ulp of rounding (instruction set, thread count): determinism tests only."""


@pytest.mark.parametrize("name", sorted(set(RUNS) - set(CHAOTIC)))
def test_seeded_regression_values(model, name):
    got = run(model, name)
    want = EXPECTED[name]
    assert got["ids"] == want["ids"]
    assert got["lengths"] == want["lengths"]
    assert (got["nfe"], got["forward_passes"]) == (want["nfe"], want["forward_passes"])
    assert got["abs_logit_sum"] == pytest.approx(want["abs_logit_sum"], rel=1e-5)


@pytest.mark.parametrize("name", ["sde", "block-sde", "remask-random-T1", "remask-blocks-cfg", "remdm"])
def test_other_seeds_give_other_tokens(model, name):
    """The twin of the regression values: the generator is really used (other seeds, other tokens)."""
    assert run(model, name, seeds=(21, 22, 23))["ids"] != EXPECTED[name]["ids"]


@pytest.mark.parametrize("name", ["sde", "block-sde", "remdm"])
def test_default_generator_is_the_global_rng(model, name):
    """generator=None draws from torch's global RNG: the same global seed gives the same tokens, another seed others."""
    fn, cfg = RUNS[name]
    pb = PromptBatch.from_lists(PROMPTS, model.special.pad_id)

    def ids(seed):
        torch.manual_seed(seed)
        return fn(model, pb, cfg).ids

    a, b, other = ids(3), ids(3), ids(4)
    assert torch.equal(a, b)
    assert not torch.equal(a, other)


@pytest.mark.parametrize("name", CHAOTIC)
def test_chaotic_run_is_deterministic_on_one_machine(model, name):
    """A chaotic run is not pinned across CPUs, but on one machine and thread count the same seeds give the same
    bits: the tokens and the sum of every forward's logits repeat exactly; other seeds give other tokens."""
    first, second = run(model, name), run(model, name)
    assert first == second
    assert first["nfe"] == RUNS[name][1].nfe and len(first["ids"]) == len(PROMPTS)
    assert run(model, name, seeds=(21, 22, 23))["ids"] != first["ids"]


def test_no_chaotic_run_is_pinned():
    """The recorded file holds only well-conditioned runs; every pinned run has its recorded values."""
    assert not set(CHAOTIC) & set(EXPECTED)
    assert set(EXPECTED) == set(RUNS) - set(CHAOTIC)
