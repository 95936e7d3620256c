"""toy.diagnose: the paired model answers each SDE evaluation with the right denoiser and reproduces either one's own
run, KL of the oracle against itself is 0, total variation against the exact distribution sits on its finite-sample
floor for exact samples, first off-support positions, the nearest-embedding decode and identical-output counts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from helpers import toy_backbone

from dsl_llada import toy
from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.config import ConverterConfig, DSLConfig, SDEConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.sampling.batches import run_batch
from dsl_llada.toy import diagnose as D
from dsl_llada.toy.oracle import oracle_dsl_model, response_machine
from dsl_llada.toy.tasks import summary_machine

NFE = 6  # S = 3 Heun steps: 7 evaluations per run


def _special(w: toy.ToyWorld) -> SpecialTokens:
    s = w.special_ids()
    return SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"])


@pytest.fixture(scope="module")
def setup():
    w = toy.ToyWorld(toy.ToyWorldConfig(n_topics=2, max_sentences=2, gen_length=24))
    tok, bb = toy_backbone(w)
    model = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=32, beta_init=1.0))).eval()
    oracle = oracle_dsl_model(w, _special(w), model.unit_noise().detach())
    exs = toy.make_split(w, 4, "open", "test")
    prompts = [tok.encode(toy.render_prompt(e.prompt), add_special_tokens=False) for e in exs]
    return w, tok, model, oracle, exs, prompts


def _config() -> SDEConfig:
    return SDEConfig(nfe=NFE, gen_length=24)


def test_evaluation_gammas_follow_the_heun_calls():
    cfg = _config()
    g = D.evaluation_gammas(cfg)
    assert len(g) == 2 * cfg.steps + 1 == 7
    assert g[0] == pytest.approx(0.01) and g[1] == g[2] == pytest.approx(7.0)  # the sensitive schedule's first step
    assert g[-1] == g[-2] == pytest.approx(74.0)  # NFE <= 16 ends at 74; the decode reads the last SNR again
    assert g[3] == g[4] == pytest.approx(7.0 * (74.0 / 7.0) ** 0.5)  # the middle segment, log-uniform
    assert [D.band_of(x) for x in g] == [0, 2, 2, 2, 2, 3, 3]


@pytest.mark.parametrize("k", [0, 1, 3])
def test_a_switching_pair_calls_the_right_denoiser_at_the_right_evaluation(setup, k):
    w, tok, model, oracle, exs, prompts = setup
    seen: list[tuple[int, int, float]] = []
    cfg = _config()
    pair = D.PairedDSLModel(model, oracle, cfg, drive=D.switch_after(2 * k),
                            observer=lambda ev: seen.append((ev.index, ev.driver, ev.gamma)))
    for _ in range(2):  # two whole runs: the count restarts at each
        run_batch(pair, prompts, cfg, [0, 1, 2, 3])
    assert [s[0] for s in seen] == list(range(7)) * 2
    assert [s[1] for s in seen] == ([0] * (2 * k) + [1] * (7 - 2 * k)) * 2
    assert [s[2] for s in seen] == D.evaluation_gammas(cfg) * 2


def test_a_pair_driven_by_one_model_is_that_models_own_run(setup):
    w, tok, model, oracle, exs, prompts = setup
    cfg = _config()
    for driver, alone in ((0, model), (1, oracle)):
        for seeds in ([0, 1, 2, 3], [10, 11, 12, 13]):
            pair = D.PairedDSLModel(model, oracle, cfg, drive=lambda j, d=driver: d)
            assert torch.equal(run_batch(pair, prompts, cfg, seeds).ids, run_batch(alone, prompts, cfg, seeds).ids)
    a = run_batch(D.PairedDSLModel(model, oracle, cfg, drive=D.switch_after(2)), prompts, cfg, [0, 1, 2, 3]).ids
    b = run_batch(D.PairedDSLModel(model, oracle, cfg, drive=D.switch_after(2)), prompts, cfg, [5, 6, 7, 8]).ids
    assert not torch.equal(a, b)


def test_a_pair_refuses_what_it_cannot_run(setup):
    w, tok, model, oracle, exs, prompts = setup
    with pytest.raises(ValueError, match="block_length=12"):
        D.PairedDSLModel(model, oracle, SDEConfig(nfe=NFE, gen_length=24, block_length=12), drive=lambda j: 0)
    other = oracle_dsl_model(w, _special(w), torch.nn.functional.normalize(torch.randn(w.vocab_size, 32), dim=-1))
    with pytest.raises(ValueError, match="share one noise table"):
        D.PairedDSLModel(model, other, _config(), drive=lambda j: 0)
    pair = D.PairedDSLModel(model, oracle, _config(), drive=lambda j: 2)
    with pytest.raises(ValueError, match="must return 0 or 1, got 2 for evaluation 0"):
        run_batch(pair, prompts, _config(), [0, 1, 2, 3])


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_of_the_oracle_against_itself_is_zero(setup, seed):
    w, tok, model, oracle, exs, prompts = setup
    r = D.trajectory_kl(oracle, oracle, w, tok, exs, _config(), seed=seed, batch_size=3)
    assert len(r["evaluations"]) == 7
    for e in r["evaluations"]:
        assert e["kl"] == pytest.approx(0.0, abs=1e-9) and e["disagree"] == 0.0
    assert r["evaluations"][-1]["decided"] == 1.0  # the decode is the output
    assert sum(b["positions"] for b in r["bands"]) == 7 * 4 * 24
    assert r["bands"][1]["evaluations"] == 0 and r["bands"][1]["kl"] is None  # nothing between 1 and 7
    fd = r["final_decodes"]
    assert fd["model"]["rows"] == fd["oracle"]["rows"]
    assert fd["model"]["rows"]["open"]["n"] == 4


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_of_a_random_model_is_positive_and_its_decode_is_the_output(setup, seed):
    w, tok, model, oracle, exs, prompts = setup
    r = D.trajectory_kl(model, oracle, w, tok, exs, _config(), seed=seed, batch_size=4)
    assert all(e["kl"] > 0.01 for e in r["evaluations"][1:])
    outputs = run_batch(model, prompts, _config(), [seed * 100_003 + i for i in range(4)]).ids
    assert r["outputs"] == outputs.tolist()
    fd = r["final_decodes"]
    for name in ("model", "nearest"):
        d = fd[name]
        assert d["first_off_from_state"] + d["first_off_from_decode"] == d["off_support"]
    assert fd["nearest"]["first_off_from_decode"] == 0  # the nearest decode is the state's own reading


def test_swap_rows_cover_every_k_in_both_orders(setup):
    w, tok, model, oracle, exs, prompts = setup
    rows = D.swap_runs(model, oracle, w, tok, exs, _config(), batch_size=4)
    assert [(r["order"], r["k"], r["model_evaluations"]) for r in rows] == \
        [("model then oracle", k, n) for k, n in ((0, 0), (1, 2), (2, 4), (3, 6), ("all", 7))] + \
        [("oracle then model", k, n) for k, n in ((0, 7), (1, 5), (2, 3), (3, 1), ("all", 0))]
    by = {(r["order"], r["k"]): r for r in rows}
    assert by[("model then oracle", 0)]["ppl"] == by[("oracle then model", "all")]["ppl"]  # both are the oracle
    assert by[("oracle then model", 0)]["ppl"] == by[("model then oracle", "all")]["ppl"]  # both are the model
    assert by[("model then oracle", 0)]["in_support"] > by[("model then oracle", "all")]["in_support"]


def test_first_off_support_positions():
    w = toy.ToyWorld()
    ex = toy.make_split(w, 1, "summarize", "test")[0]
    m = summary_machine(w, ex.document)
    ref = w.ids_for_scoring(ex.reference.split())
    assert D.first_off_support(m, ref) is None
    assert D.first_off_support(m, ref[:2]) == 2  # 'the MAIN' cannot end there
    bad = list(ref)
    bad[1] = w.token_to_id["and"]
    assert D.first_off_support(m, bad) == 1
    assert D.first_off_support(m, []) == 0
    assert D.first_off_support(response_machine(w, ex.prompt), ref) is None


def test_nearest_decode_reads_the_state_and_never_emits_mask():
    E = torch.nn.functional.normalize(torch.randn(10, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    state = torch.stack([5 * E[3], 0.1 * E[7], 40 * E[9]])[None]
    assert D.nearest_decode(state, E, mask_id=5).tolist() == [[3, 7, 9]]
    assert D.nearest_decode((5 * E[5])[None, None], E, mask_id=5).item() != 5


def test_total_variation_hand_cases():
    exact = {(1,): 0.5, (2,): 0.5}
    assert D.total_variation(Counter({(1,): 1, (2,): 1}), exact) == 0.0
    assert D.total_variation(Counter({(1,): 2}), exact) == pytest.approx(0.5)
    assert D.total_variation(Counter({(1,): 1, (3, 3): 1}), exact) == pytest.approx(0.5)  # off-support mass counts
    assert D.total_variation(Counter({(9,): 4}), exact) == 1.0
    with pytest.raises(ValueError, match="at least one sample"):
        D.total_variation(Counter(), exact)
    r = D.tv_from_outputs([[(1,), (2,)]], [exact], floor_reps=20_000)
    assert r["tv"] == 0.0 and r["n"] == 2 and r["documents"] == 1
    assert r["floor"] == pytest.approx(0.25, abs=0.01)  # two exact draws: TV 0.5 when they agree (prob 1/2), else 0


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_samples_sit_on_the_floor(seed):
    """n exact samples per document: the plug-in TV is the floor's own value up to sampling error, and the bootstrap
    interval holds the floor."""
    w = toy.ToyWorld()
    docs = toy.make_split(w, 12, "summarize", "test")
    exacts = [D.exact_distribution(w, d) for d in docs]
    for e in exacts:
        assert sum(e.values()) == pytest.approx(1.0, abs=1e-12) and len(e) > 1
    rng = np.random.default_rng(seed)
    n = 16
    outputs = []
    for e in exacts:
        keys = list(e)
        p = np.array([e[k] for k in keys])
        outputs.append([keys[i] for i in rng.choice(len(keys), size=n, p=p / p.sum())])
    r = D.tv_from_outputs(outputs, exacts, seed=seed)
    assert r["lo"] <= r["floor"] <= r["hi"]
    assert r["tv"] == pytest.approx(r["floor"], abs=0.08)
    off = [[(0,)] * n for _ in exacts]  # every sample off the support
    assert D.tv_from_outputs(off, exacts, seed=seed)["tv"] == 1.0


def test_tv_rows_run_both_samplers_on_the_oracles():
    w = toy.ToyWorld(toy.ToyWorldConfig(n_topics=2, max_sentences=2, gen_length=24))
    tok = toy.build_tokenizer(w)
    sp = _special(w)
    E = torch.nn.functional.normalize(torch.randn(w.vocab_size, 32, generator=torch.Generator().manual_seed(0)), -1)
    models = {"oracle-dsl": oracle_dsl_model(w, sp, E), "oracle": toy.oracle.ToyOracle(w, sp).eval()}
    docs = toy.make_split(w, 2, "summarize", "test")
    rows = D.tv_rows(models, w, tok, docs, nfes=(4,), n=4, batch_size=8)
    assert [(r["method"], r["denoiser"], r["nfe"], r["n"], r["documents"]) for r in rows] == \
        [("DSL-SDE", "oracle", 4, 4, 2), ("LLaDA", "oracle", 4, 4, 2)]
    assert all(0.0 <= r["lo"] <= r["tv"] <= 1.0 and 0.0 < r["floor"] < 1.0 for r in rows)
    with pytest.raises(ValueError, match="needs summarisation examples"):
        D.tv_rows(models, w, tok, toy.make_split(w, 1, "open", "test"))


def test_identical_outputs_counts_matching_prompts():
    recs = [{"method": "A", "task": "open", "nfe": nfe, "index": i, "output": out}
            for nfe, outs in ((4, ["x", "y", "z"]), (8, ["x", "y", "q"]), (16, ["p", "q", "r"])) for i, out in
            enumerate(outs)]
    rows = D.identical_outputs(recs)
    assert [(r["nfe_a"], r["nfe_b"], r["identical"], r["n"]) for r in rows] == [(4, 8, 2, 3), (4, 16, 0, 3),
                                                                                (8, 16, 0, 3)]


def test_swap_runs_refuse_a_k_outside_the_grid(setup):
    w, tok, model, oracle, exs, prompts = setup
    with pytest.raises(ValueError, match=r"ks=\[0, 4\] is not valid: each k must be an integer from 0 to 3 or 'all'"):
        D.swap_runs(model, oracle, w, tok, exs, _config(), ks=[0, 4])
