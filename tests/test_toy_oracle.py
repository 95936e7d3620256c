"""The toy world's exact oracle denoisers: forward-backward marginals against brute-force enumeration, a hand-computed
ambiguous case, the DSL and masked observations through the model interface, and the samplers run on the oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dsl_llada import toy
from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.core.converter import noisy_states
from dsl_llada.sampling import PromptBatch, sample_sde
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.toy import words as W
from dsl_llada.toy.oracle import ResponseChain, ToyOracle, oracle_dsl_model, posterior_marginals, response_machine
from dsl_llada.toy.world import _PL_DETS, _SG_DETS


def tiny_world(max_sentences: int = 2) -> toy.ToyWorld:
    """Enumerable sub-world: ocean only, whale/shark/fish, one verb of each kind, no adjectives or openers."""
    return toy.ToyWorld(toy.ToyWorldConfig(n_topics=1, nouns_per_topic=3, verbs_per_topic=1, adjectives_per_topic=0,
                                           general_adjectives=0, max_sentences=max_sentences, p_opener=0.0,
                                           min_doc_sentences=1, gen_length=24))


def special(world: toy.ToyWorld) -> SpecialTokens:
    s = world.special_ids()
    return SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"])


def brute_force(world: toy.ToyWorld, emissions: np.ndarray) -> np.ndarray:
    """p(x_t = w | evidence) by summing over every string of the topic's automaton, padded to L positions."""
    L, V = emissions.shape
    ids = world.special_ids()
    marg = np.zeros((L, V))
    for s, p in world.machine(0).enumerate().items():
        if len(s) + 1 > L:
            continue
        padded = list(s) + [ids["eot"]] + [ids["pad"]] * (L - len(s) - 1)
        weight = p * float(np.prod(emissions[np.arange(L), padded]))
        marg[np.arange(L), padded] += weight
    return marg / marg.sum(1, keepdims=True)


def test_marginals_equal_brute_force_enumeration():
    w = tiny_world()
    assert len(w.machine(0).enumerate()) > 1000  # every string of the sub-world, several hidden paths for "fish"
    L, V = w.config.gen_length, w.vocab_size
    rng = np.random.default_rng(0)
    em = rng.uniform(0.05, 1.0, size=(L, V)) ** 4  # informative but never decisive
    em[3] = 1.0  # no information (masked)
    em[1] = 0.0
    em[1, w.token_to_id["fish"]] = 1.0  # clean: "fish" (number left open)
    chain = ResponseChain.build(w.machine(0), w.special_ids()["pad"])
    got = posterior_marginals(chain, torch.from_numpy(em)[None])[0].numpy()
    want = brute_force(w, em)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert got[1, w.token_to_id["fish"]] == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(got.sum(1), 1.0, atol=1e-12)


def test_hand_computed_ambiguous_subject():
    """Masked observation 'the fish [MASK] .': the invariant noun leaves the number open, so the verb is singular
    with probability (1-p_pl)·P(the|sg) / ((1-p_pl)·P(the|sg) + p_pl·P(the|pl)) = 0.33 / 0.53, and intransitive
    (the '.' rules out an object), each of the topic's intransitive verbs equally likely."""
    world = toy.ToyWorld()
    tok = toy.build_tokenizer(world)
    oracle = ToyOracle(world, special(world))
    sp = world.special_ids()
    prompt = tok.encode(toy.render_prompt("write about the ocean ."), add_special_tokens=False)
    response = tok.encode("the fish", add_special_tokens=False) + [sp["mask"], tok.convert_tokens_to_ids(".")]
    response += [sp["mask"]] * (world.config.gen_length - len(response))
    ids = torch.tensor([prompt + response])
    probs = oracle.logits_from_ids(ids).softmax(-1)[0, len(prompt) + 2].double()
    c = world.config
    sg, pl = (1 - c.p_plural) * dict(_SG_DETS)["the"], c.p_plural * dict(_PL_DETS)["the"]
    iv = world.iverbs["ocean"]
    for singular, plural in iv:
        assert float(probs[tok.convert_tokens_to_ids(singular)]) == pytest.approx(sg / (sg + pl) / len(iv), abs=1e-6)
        assert float(probs[tok.convert_tokens_to_ids(plural)]) == pytest.approx(pl / (sg + pl) / len(iv), abs=1e-6)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)


def _dsl_inputs(w, tok, om, seed):
    """A prompt + a world response at per-position SNRs 0 (no information), finite, and clean (state_mask False)."""
    sp = w.special_ids()
    prompt = tok.encode(toy.render_prompt("write about the ocean ."), add_special_tokens=False)
    words = w.sample_response(0, np.random.default_rng(3))
    resp = tok.encode(" ".join(words), add_special_tokens=False) + [sp["eot"]]
    resp += [sp["pad"]] * (w.config.gen_length - len(resp))
    ids = torch.tensor([prompt + resp])
    L, P = len(resp), len(prompt)
    gamma = torch.zeros(1, P + L)
    gamma[0, P:] = torch.linspace(0.0, 6.0, L)
    state = torch.zeros(1, P + L, dtype=torch.bool)
    state[0, P:] = True
    state[0, P + 5] = False  # one clean response position
    z = noisy_states(om.unit_noise(), ids, gamma, torch.Generator().manual_seed(seed))
    return ids, z, state, P


def test_dsl_observation_through_the_model_interface_is_exact():
    """The oracle DSLModel, fed the noisy state exactly as the DSL objective forms it, returns the posterior whose
    emission is exp(<z, e_w>) (γ = 0: flat; clean: a delta)."""
    w = tiny_world()
    tok = toy.build_tokenizer(w)
    E = F.normalize(torch.randn(w.vocab_size, 16, generator=torch.Generator().manual_seed(1)), dim=-1)
    om = oracle_dsl_model(w, special(w), E)
    ids, z, state, P = _dsl_inputs(w, tok, om, seed=0)
    probs = om.logits_from_states(ids, z, state).softmax(-1)[0, P:].double().numpy()
    zr = z[0, P:].double()
    em = torch.exp(zr @ om.unit_noise().double().T - (zr @ om.unit_noise().double().T).amax(-1, keepdim=True)).numpy()
    em[:, w.special_ids()["mask"]] = 0.0
    em[5] = 0.0
    em[5, int(ids[0, P + 5])] = 1.0
    want = brute_force(w, em)
    np.testing.assert_allclose(probs, want, rtol=0, atol=2e-5)
    assert probs[0].max() < 0.99  # γ = 0 at the first position: only the prior speaks
    assert probs[5, int(ids[0, P + 5])] == pytest.approx(1.0, abs=1e-6)


def test_dsl_observation_seed_twin():
    w = tiny_world()
    tok = toy.build_tokenizer(w)
    om = oracle_dsl_model(w, special(w), F.normalize(torch.randn(w.vocab_size, 16), dim=-1))
    a = om.logits_from_states(*_dsl_inputs(w, tok, om, seed=0)[:3])
    b = om.logits_from_states(*_dsl_inputs(w, tok, om, seed=0)[:3])
    c = om.logits_from_states(*_dsl_inputs(w, tok, om, seed=1)[:3])
    assert torch.equal(a, b)
    assert not torch.allclose(a.softmax(-1), c.softmax(-1), atol=1e-3)


@pytest.fixture(scope="module")
def demo_world():
    w = toy.ToyWorld(toy.ToyWorldConfig(n_topics=2, max_sentences=2, gen_length=24))
    tok = toy.build_tokenizer(w)
    E = F.normalize(torch.randn(w.vocab_size, 32, generator=torch.Generator().manual_seed(0)), dim=-1)
    return w, tok, oracle_dsl_model(w, special(w), E)


def _prompts(w, tok, n_open=4, n_sum=2):
    exs = toy.make_split(w, n_open, "open", "test") + toy.make_split(w, n_sum, "summarize", "test")
    ids = [tok.encode(toy.render_prompt(e.prompt), add_special_tokens=False) for e in exs]
    return exs, PromptBatch.from_lists(ids, pad_id=w.special_ids()["pad"])


def _in_support(w, tok, exs, out):
    return [toy.score_response(w, tok.decode(out.ids[i, : int(out.lengths[i])]), exs[i])["in_support"]
            for i in range(len(exs))]


def test_one_token_per_step_remasking_on_the_oracle_never_leaves_the_support(demo_world):
    """Each committed token is the argmax of an exact conditional with positive mass, so one token per step stays in
    the support whatever the order (the factorisation error needs several tokens per step)."""
    w, tok, om = demo_world
    exs, batch = _prompts(w, tok)
    out = sample_remask(om.backbone, batch, RemaskConfig(steps=24, gen_length=24))
    assert all(_in_support(w, tok, exs, out))
    assert out.forward_passes == 24


@pytest.mark.parametrize("block", [0, 12])
def test_sde_runs_on_the_oracle_and_depends_on_the_seed(demo_world, block):
    w, tok, om = demo_world
    exs, batch = _prompts(w, tok)
    cfg = SDEConfig(nfe=8, gen_length=24, block_length=block, beta_scale=1.0, eta=1.0)
    a = sample_sde(om, batch, cfg, generator=[torch.Generator().manual_seed(i) for i in range(6)])
    b = sample_sde(om, batch, cfg, generator=[torch.Generator().manual_seed(i) for i in range(6)])
    c = sample_sde(om, batch, cfg, generator=[torch.Generator().manual_seed(100 + i) for i in range(6)])
    assert torch.equal(a.ids, b.ids)
    assert not torch.equal(a.ids, c.ids)
    assert sum(_in_support(w, tok, exs, a)) >= 4  # the exact localisation SDE stays (mostly) in the grammar


def test_unknown_prompt_is_named():
    w = tiny_world()
    with pytest.raises(ValueError, match="knows no task for the prompt 'tell me a joke'"):
        response_machine(w, "tell me a joke")
    oracle = ToyOracle(w, special(w))
    with pytest.raises(ValueError, match="assistant <|end_header_id|>"):
        oracle(torch.eye(w.vocab_size + 1)[None, :10])
    assert math.isclose(float(oracle.wte.weight.sum()), w.vocab_size)
    assert W.SUMMARY_PREFIX == "summarize :"


# ------------------------------------------------------------------ the Bayes floor


def _held_out(w, tok, n=6):
    from dsl_llada.toy.demo_train import sft_tensors

    exs = toy.make_split(w, n, "open", "valid") + toy.make_split(w, n // 2, "summarize", "valid")
    block = max(len(tok.encode(toy.render_prompt(e.prompt), add_special_tokens=False)) for e in exs) + w.config.gen_length
    return sft_tensors(tok, exs, w.config.gen_length, block)


def test_the_oracle_sits_on_its_own_floor_and_a_random_model_above_it(demo_world):
    from helpers import toy_backbone

    from dsl_llada.config import ConverterConfig, DSLConfig
    from dsl_llada.core.model import DSLModel
    from dsl_llada.toy.bayes_floor import dsl_curve, dsl_excess, mdm_curve

    w, tok, om = demo_world
    ids, plen = _held_out(w, tok)
    sp = special(w)
    for p in dsl_curve(om, w, sp, ids, plen, snrs=(0.5, 8.0)):
        assert p.excess == pytest.approx(0.0, abs=1e-5) and p.n == int((ids.shape[1] - plen).sum())
    _, bb = toy_backbone(w)
    model = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=32))).eval()
    pts = dsl_curve(model, w, sp, ids, plen, snrs=(0.5, 8.0))
    assert all(p.excess > 0.5 for p in pts)
    assert pts[1].oracle_ce < pts[0].oracle_ce  # more signal, lower floor
    mixed = dsl_excess(model, w, sp, ids, plen)
    assert mixed.excess > 0.5 and math.isnan(mixed.level)
    masked = mdm_curve(bb, w, sp, ids, plen, rates=(0.3, 1.0))
    assert all(p.excess > 0.5 for p in masked) and masked[0].oracle_ce < masked[1].oracle_ce
    assert mdm_curve(om.backbone, w, sp, ids, plen, rates=(0.5,))[0].excess == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("field,value,says", [("pretrained", "package", "pretrained='package' is not valid"),
                                              ("cpt_target_excess", -0.1, "cpt_target_excess=-0.1 must be"),
                                              ("cpt_check_every", 0, "cpt_check_every=0 must be"),
                                              ("n_heldout", 0, "n_heldout=0 must be")])
def test_demo_config_refuses_bad_oracle_settings(field, value, says):
    from dsl_llada.errors import ConfigError
    from dsl_llada.toy.demo import DemoConfig

    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("[", r"\[")):
        DemoConfig(**{field: value})
    assert DemoConfig(**{field: {"pretrained": "scratch", "cpt_target_excess": 0.0, "cpt_check_every": 1,
                                 "n_heldout": 1}[field]}).to_dict()[field] is not None
