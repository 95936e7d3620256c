"""The step-level engine (`sampling.engine.Engine`): a row's tokens do not depend on its company (alone, in a fixed
batch, joined mid-way, next to other samplers) and equal the `sample_*` function's with the same generator; rows
leave after exactly their own number of ticks; the caps refuse what can never fit with one clear error."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_backbone, tiny_dsl

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.errors import ConfigError
from dsl_llada.sampling import PromptBatch, sample
from dsl_llada.sampling.denoiser import Denoiser, scale_states
from dsl_llada.sampling.engine import Engine

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
SAME_LENGTH = [[5, 6, 7], [8, 9, 4], [10, 11, 12]]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only spins on a busy CPU

SDE = {"sde": SDEConfig(nfe=6, gen_length=8), "block_sde": SDEConfig(nfe=4, gen_length=8, block_length=4)}
DISCRETE = {
    "low_confidence": RemaskConfig(steps=8, gen_length=8),
    "blocks_temperature": RemaskConfig(steps=8, gen_length=8, block_length=4, temperature=1.0),
    "eos_block": RemaskConfig(steps=8, gen_length=8, block_length=4, eos_suppress_ratio=0.5, truncate_at_eos=True),
    "threshold": RemaskConfig(steps=8, gen_length=8, block_length=4, threshold=0.3),
    "random": RemaskConfig(steps=4, gen_length=8, remasking="random"),
    "remdm": RemaskConfig(steps=8, gen_length=8, remdm=True, temperature=0.5),
    "cfg": RemaskConfig(steps=4, gen_length=8, cfg_scale=1.0),
}


@pytest.fixture(scope="module")
def model():
    return tiny_dsl(seed=0)


@pytest.fixture
def rowwise(model, monkeypatch):
    """The backbone run one row at a time without its padding: a batch-invariant backbone, so an SDE row's
    continuous trajectory cannot move by the rounding a batch shape or padding changes in the real kernels, and
    exact equality tests the engine's own bookkeeping (grids, Heun stages, draws, windows)."""
    bb = model.backbone
    forward = bb.forward

    def one_by_one(x, attention_mask=None, *, positions=None):
        rows = []
        for i in range(x.shape[0]):
            off = 0 if attention_mask is None else int((attention_mask[i] == 0).sum())
            full = forward(x[i: i + 1, off:], None)
            full = torch.cat([full.new_zeros((1, off, full.shape[-1])), full], dim=1)
            rows.append(full if positions is None else full[:, positions])
        return torch.cat(rows)

    monkeypatch.setattr(bb, "forward", one_by_one)
    return model


def g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def direct(model, prompt, config, seed):
    """Today's sampler function on the prompt alone with its own generator."""
    return sample(model, PromptBatch.from_lists([prompt], model.special.pad_id), config, generator=[g(seed)]).ids[0].tolist()


def by_tag(results):
    return [r.ids.tolist() for r in sorted(results, key=lambda r: r.tag)]


def arrangements(model, prompts, configs, seeds):
    """(alone, fixed batch, joined mid-way) ids through the engine, each in prompt order."""
    alone = []
    for i, (p, c, s) in enumerate(zip(prompts, configs, seeds)):
        e = Engine(model)
        e.submit(p, c, generator=g(s), tag=i)
        alone += list(e.run())
    e = Engine(model)
    for i, (p, c, s) in enumerate(zip(prompts, configs, seeds)):
        e.submit(p, c, generator=g(s), tag=i)
    fixed = list(e.run())
    e = Engine(model)
    joined = []
    for i, (p, c, s) in enumerate(zip(prompts, configs, seeds)):  # each joins two ticks after the previous one
        e.submit(p, c, generator=g(s), tag=i)
        joined += e.step() + e.step()
    joined += list(e.run())
    assert not [r.error for r in alone + fixed + joined if r.error]
    return by_tag(alone), by_tag(fixed), by_tag(joined)


@pytest.mark.parametrize("name", list(DISCRETE))
def test_a_discrete_row_ignores_its_company(model, name):
    config = DISCRETE[name]
    seeds = [100, 101, 102]
    want = [direct(model, p, config, s) for p, s in zip(PROMPTS, seeds)]
    alone, fixed, joined = arrangements(model, PROMPTS, [config] * 3, seeds)
    assert alone == fixed == joined == want  # mixed prompt lengths: left padding, real kernels, exact


@pytest.mark.parametrize("name", list(SDE))
def test_an_sde_row_alone_and_in_a_fixed_batch_is_todays_sampler(model, name):
    config = SDE[name]
    e = Engine(model)
    e.submit(SAME_LENGTH[0], config, generator=g(5))
    assert [r.ids.tolist() for r in e.run()] == [direct(model, SAME_LENGTH[0], config, 5)]
    # a fixed batch is exactly today's call on the same batch (the same shapes, so the same rounding)
    today = sample(model, PromptBatch.from_lists(SAME_LENGTH, model.special.pad_id), config,
                   generator=[g(5 + i) for i in range(3)]).ids.tolist()
    e = Engine(model)
    for i, p in enumerate(SAME_LENGTH):
        e.submit(p, config, generator=g(5 + i), tag=i)
    assert by_tag(e.run()) == today


@pytest.mark.parametrize("name", list(SDE))
def test_an_sde_row_ignores_its_company_on_a_batch_invariant_backbone(rowwise, name):
    config = SDE[name]
    seeds = [100, 101, 102]
    want = [direct(rowwise, p, config, s) for p, s in zip(PROMPTS, seeds)]
    alone, fixed, joined = arrangements(rowwise, PROMPTS, [config] * 3, seeds)
    assert alone == fixed == joined == want


def test_mixed_samplers_and_lengths_share_one_forward_per_tick(rowwise):
    configs = [SDE["sde"], RemaskConfig(steps=4, gen_length=4, temperature=1.0), DISCRETE["cfg"], SDE["block_sde"]]
    prompts = PROMPTS + [[7, 7]]
    seeds = [1, 2, 3, 4]
    want = [direct(rowwise, p, c, s) for p, c, s in zip(prompts, configs, seeds)]
    alone, fixed, joined = arrangements(rowwise, prompts, configs, seeds)
    assert alone == fixed == joined == want
    e = Engine(rowwise)
    for p, c, s in zip(prompts, configs, seeds):
        e.submit(p, c, generator=g(s))
    results = list(e.run())
    # all kinds in one forward per tick; the longest row is the Block SDE one: 2 windows x (2 S + 1), S = 2
    assert e.forward_passes == e.ticks == max(r.ticks for r in results) == 10


@pytest.mark.parametrize("config", [SDE["sde"], DISCRETE["blocks_temperature"]], ids=["sde", "remask"])
def test_a_different_seed_gives_different_ids(model, config):
    e = Engine(model)
    for i, seed in enumerate([100, 200]):
        e.submit(PROMPTS[0], config, generator=g(seed), tag=i)
    a, b = by_tag(e.run())
    assert a != b
    assert a == direct(model, PROMPTS[0], config, 100)


def test_rows_leave_after_exactly_their_own_ticks(model):
    sde, blk = SDEConfig(nfe=8, gen_length=8), SDEConfig(nfe=4, gen_length=8, block_length=4)
    remask, cfg = RemaskConfig(steps=4, gen_length=8), RemaskConfig(steps=2, gen_length=8, cfg_scale=1.0)
    thr = DISCRETE["threshold"]
    e = Engine(model)
    ids = {e.submit(PROMPTS[0], c, generator=g(i), tag=name): name
           for i, (name, c) in enumerate({"sde": sde, "blk": blk, "remask": remask, "cfg": cfg, "thr": thr}.items())}
    finished_at: dict[str, int] = {}
    live = []
    while len(e):
        for r in e.step():
            finished_at[r.tag] = e.ticks
            assert r.ticks == e.ticks and r.error is None
            if r.tag == "thr":
                assert r.forward_passes == r.nfe == sum(r.steps_per_block) <= thr.steps
        live.append(e.live)
    assert sorted(ids.values()) == sorted(finished_at)
    # SDE at NFE 2S: 2S + 1 forwards; Block SDE: per window; remasking: its steps (CFG: two sequences per tick)
    assert finished_at["sde"] == 9 and finished_at["blk"] == 2 * (4 + 1)
    assert finished_at["remask"] == 4 and finished_at["cfg"] == 2
    results = {}
    e = Engine(model)
    for name, c in {"sde": sde, "cfg": cfg}.items():
        e.submit(PROMPTS[0], c, generator=g(0), tag=name)
    for r in e.run():
        results[r.tag] = r
    assert (results["sde"].forward_passes, results["sde"].nfe) == (9, 8)
    assert (results["cfg"].forward_passes, results["cfg"].nfe, results["cfg"].ticks) == (4, 2, 2)
    assert live[0] == 5 and live[-1] == 0 and live == sorted(live, reverse=True)


def test_the_row_cap_admits_the_next_request_when_a_row_finishes(model):
    short, long = RemaskConfig(steps=2, gen_length=4), RemaskConfig(steps=6, gen_length=8)
    e = Engine(model, max_rows=2)
    for i, c in enumerate([short, long, short]):
        e.submit(PROMPTS[i], c, generator=g(i), tag=i)
    assert (e.live, e.pending) == (0, 3)
    assert e.step() == [] and (e.live, e.pending) == (2, 1)
    done = e.step()
    assert [r.tag for r in done] == [0] and (e.live, e.pending) == (1, 1)
    e.step()  # the third joins at this tick
    assert (e.live, e.pending) == (2, 0)
    rest = list(e.run())
    assert [r.tag for r in rest] == [2, 1] and e.ticks == 6
    assert rest[0].ids.tolist() == direct(model, PROMPTS[2], short, 2)


def test_the_token_cap_holds_and_refuses_what_never_fits(model):
    c = RemaskConfig(steps=2, gen_length=8)
    e = Engine(model, max_tokens=24)
    e.submit(PROMPTS[0], c)  # 11 tokens
    e.submit(PROMPTS[1], c)  # 10
    e.submit(PROMPTS[2], c)  # 13: waits until one leaves
    e.step()
    assert (e.live, e.pending, e.batch_tokens) == (2, 1, 21)
    with pytest.raises(ValueError, match=r"^request of 26 batch tokens \(prompt 5 \+ gen_length 8, twice for "
                                         r"cfg_scale > 0\) can never fit the engine's max_tokens=24; raise max_tokens"):
        e.submit(PROMPTS[2], c.replace(cfg_scale=1.0))
    assert len(list(e.run())) == 3


def test_bad_requests_and_settings_get_one_clear_error(model):
    e = Engine(model)
    small = tiny_dsl(seed=0, backbone_kw={"max_sequence_length": 16})
    with pytest.raises(ValueError, match=r"^prompt length 5 \+ gen_length 16 = 21 tokens exceeds the model's context "
                                         r"of 16; shorten the prompt or reduce gen_length to at most 11$"):
        Engine(small).submit(PROMPTS[2], RemaskConfig(steps=4, gen_length=16))
    with pytest.raises(ConfigError, match="kv_cache='dual': the step-level engine runs kv_cache='off' only"):
        e.submit(PROMPTS[0], RemaskConfig(steps=4, gen_length=8, kv_cache="dual"))
    with pytest.raises(ValueError, match="needs a DSL checkpoint"):
        Engine(tiny_backbone()).submit(PROMPTS[0], SDE["sde"])
    with pytest.raises(ValueError, match=r"^a prompt must be a non-empty list of token ids"):
        e.submit([], SDE["sde"])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=rf"^max_rows={bad!r} must be an int >= 1$"):
            Engine(model, max_rows=bad)
    with pytest.raises(ValueError, match=r"^max_tokens=0 must be an int >= 1, or None for no token cap$"):
        Engine(model, max_tokens=0)
    assert len(e) == 0  # nothing refused was queued


def test_a_bare_backbone_runs_the_discrete_samplers(model):
    bb = tiny_backbone()
    config = DISCRETE["blocks_temperature"]
    e = Engine(bb)
    e.submit(PROMPTS[1], config, generator=g(3))
    assert [r.ids.tolist() for r in e.run()] == [direct(bb, PROMPTS[1], config, 3)]


@pytest.mark.parametrize("config", [SDE["block_sde"], DISCRETE["blocks_temperature"]], ids=["block_sde", "remask"])
def test_callbacks_see_each_step_and_may_drop_their_row(model, config):
    seen = []
    today: list = []
    sample(model, PromptBatch.from_lists([PROMPTS[0]], model.special.pad_id), config, generator=[g(1)],
           callback=lambda i: today.append((i.step, i.decode, i.window, i.tokens.tolist())))

    def dropper(info):
        if info.step == 1 and not info.decode:
            info.drop(0)

    e = Engine(model)
    e.submit(PROMPTS[0], config, generator=g(1), callback=lambda i: seen.append((i.step, i.decode, i.window,
                                                                                   i.tokens.tolist())), tag="seen")
    e.submit(PROMPTS[1], config, generator=g(2), callback=dropper, tag="dropped")
    results = {r.tag: r for r in e.run()}
    assert seen == today  # the same steps, windows and tokens as today's callback
    gone = results["dropped"]
    assert gone.dropped and gone.length == 0 and gone.ticks == (4 if isinstance(config, SDEConfig) else 2)  # step 1: SDE ticks 3 and 4
    assert not results["seen"].dropped


def test_a_failing_row_ends_alone_and_cancel_removes_a_row(model):
    def boom(info):
        raise RuntimeError("callback failed")

    e = Engine(model)
    a = e.submit(PROMPTS[0], SDE["sde"], generator=g(0), callback=boom)
    b = e.submit(PROMPTS[1], SDE["sde"], generator=g(1))
    c = e.submit(PROMPTS[2], SDE["sde"], generator=g(2))
    first = e.step() + e.step()  # the callback runs after the first step's corrector tick
    assert [(r.request_id, r.error) for r in first] == [(a, "RuntimeError: callback failed")]
    cancelled = e.cancel(c)
    assert cancelled is not None and cancelled.dropped and e.cancel(c) is None
    queued = e.submit(PROMPTS[2], SDE["sde"])
    gone = e.cancel(queued)
    assert gone is not None and gone.dropped and (gone.ticks, gone.forward_passes, gone.length) == (0, 0, 0)
    rest = list(e.run())
    assert [r.request_id for r in rest] == [b] and rest[0].ids.tolist() == direct(model, PROMPTS[1], SDE["sde"], 1)


def test_a_per_row_gamma_gives_each_row_its_single_gamma_result(model):
    y = torch.nn.functional.normalize(torch.randn(3, 4, model.noise_dim, generator=g(0)), dim=-1)
    gammas = [0.7, 3.0, 40.0]
    per_row = scale_states(y, torch.tensor(gammas, dtype=torch.float64))
    for i, gm in enumerate(gammas):
        assert torch.equal(per_row[i], scale_states(y[i: i + 1], gm)[0])
    ctx = model.context_embed(torch.tensor([SAME_LENGTH[0]] * 3))
    d = Denoiser.for_model(model, ctx, beta=4.0, top_m=8)
    same = d.logits(y, torch.tensor([3.0] * 3))
    assert torch.equal(same, d.logits(y, 3.0))  # one SNR as a tensor: bit for bit the float's result
    with pytest.raises(ValueError, match=r"^a per-row gamma must be a \(B,\) tensor with B = 3 rows, got shape \(2,\)$"):
        scale_states(y, torch.tensor([1.0, 2.0]))


BATCH_PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [6], [7, 8, 9, 10, 11]]


@pytest.mark.parametrize("config", [DISCRETE["threshold"], RemaskConfig(steps=4, gen_length=8, temperature=1.0)],
                         ids=["threshold", "temperature"])
def test_run_continuous_gives_the_fixed_batches_tokens_and_honours_skip(model, config):
    from dsl_llada.sampling.batches import run_batches, run_continuous

    fixed = {r.index: r.ids for rows in run_batches(model, BATCH_PROMPTS, config, batch_size=2,
                                                    seed_of=lambda i: 100 + i) for r in rows}
    ticks = list(run_continuous(model, BATCH_PROMPTS, config, max_rows=2, seed_of=lambda i: 100 + i))
    rows = [r for tick in ticks for r in tick]
    assert sorted(r.index for r in rows) == list(range(5)) and all(r.error is None for r in rows)
    assert {r.index: r.ids for r in rows} == fixed
    assert all([r.index for r in tick] == sorted(r.index for r in tick) for tick in ticks)
    assert [r.seed for r in sorted(rows, key=lambda r: r.index)] == [100, 101, 102, 103, 104]
    resumed = [r.index for tick in run_continuous(model, BATCH_PROMPTS, config, max_rows=2,
                                                  seed_of=lambda i: 100 + i, skip={1, 3}) for r in tick]
    assert sorted(resumed) == [0, 2, 4]


def test_generate_continuous_records_equal_the_fixed_batch_records(model):
    from dsl_llada.generate.generation import generate

    class Decoder:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    texts = [f"prompt {i}" for i in range(len(BATCH_PROMPTS))]
    config = RemaskConfig(steps=4, gen_length=8, temperature=1.0)
    kw = dict(batch_size=2, seed=7, progress=False, encoded=BATCH_PROMPTS)
    fixed = generate(model, Decoder(), texts, config, **kw)
    finished: list[list[int]] = []
    cont = generate(model, Decoder(), texts, config, continuous=True, skip={4},
                    on_batch=lambda recs: finished.append([r["index"] for r in recs]), **kw)
    assert sorted(cont, key=lambda r: r["index"]) == fixed[:4]
    assert sorted(i for tick in finished for i in tick) == [0, 1, 2, 3]
