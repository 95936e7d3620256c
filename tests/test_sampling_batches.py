"""The one batch runner (`sampling.batches`): context check before any sampling, a fixed batch grid with skips,
per-row seeds independent of the batch, row-by-row retry of a failing batch, errors that stop the run."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_dsl

import dsl_llada.sampling.batches as batches_mod
from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling.batches import run_batch, run_batches
from dsl_llada.sampling.dispatch import sample
from dsl_llada.sampling.common import PromptBatch

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [6], [7, 8, 9, 10, 11]]


@pytest.fixture(scope="module")
def model():
    return tiny_dsl(seed=0)


CONFIGS = [RemaskConfig(steps=4, gen_length=8), SDEConfig(nfe=4, gen_length=8)]


def rows_of(model, config, **kw):
    return [r for rows in run_batches(model, PROMPTS, config, seed_of=lambda i: 100 + i, **kw) for r in rows]


@pytest.mark.parametrize("config", CONFIGS, ids=["remask", "sde"])
def test_rows_follow_their_seed_whatever_the_batch(model, config):
    one = rows_of(model, config, batch_size=1)
    three = rows_of(model, config, batch_size=3)
    assert [r.index for r in one] == [r.index for r in three] == list(range(len(PROMPTS)))
    assert [r.seed for r in three] == [100 + i for i in range(len(PROMPTS))]
    assert [r.batch_size for r in three] == [3, 3, 3, 2, 2]
    if isinstance(config, RemaskConfig):  # discrete commits: equal on every CPU; the SDE's chaotic trajectory on a
        assert [r.response for r in one] == [r.response for r in three]  # random tiny model may differ by padding
    # a row equals the sampler called directly on that prompt with its seed (the same computation)
    direct = sample(model, PromptBatch.from_lists([PROMPTS[2]], model.special.pad_id), config,
                    generator=[torch.Generator().manual_seed(102)])
    assert one[2].response == direct.responses()[0] and one[2].ids == direct.ids[0].tolist()


def test_a_different_seed_gives_different_rows(model):
    config = RemaskConfig(steps=4, gen_length=8, temperature=1.0)
    a = [r.ids for r in rows_of(model, config, batch_size=2)]
    b = [r.ids for rows in run_batches(model, PROMPTS, config, batch_size=2, seed_of=lambda i: 7 + i) for r in rows]
    assert a != b


def test_skip_keeps_the_grid_of_an_uninterrupted_run(model):
    seen = []
    real = batches_mod.run_batch

    def spy(model_, prompt_ids, config, seeds, **kw):
        seen.append([s - 100 for s in seeds])
        return real(model_, prompt_ids, config, seeds, **kw)

    batches_mod.run_batch = spy
    try:
        got = rows_of(model, CONFIGS[0], batch_size=2, skip={0, 1, 3})
    finally:
        batches_mod.run_batch = real
    assert seen == [[2], [4]]  # batches [0, 2), [2, 4), [4, 5) minus the done rows; an empty batch is not run
    assert [r.index for r in got] == [2, 4]


def test_a_failing_batch_is_retried_row_by_row(model, monkeypatch):
    real = batches_mod.run_batch

    def fail_with_row_3(model_, prompt_ids, config, seeds, **kw):
        if 103 in seeds:
            raise RuntimeError("out of memory (simulated)")
        return real(model_, prompt_ids, config, seeds, **kw)

    monkeypatch.setattr(batches_mod, "run_batch", fail_with_row_3)
    got = rows_of(model, CONFIGS[0], batch_size=2)
    assert [r.error for r in got] == [None, None, None, "RuntimeError: out of memory (simulated)", None]
    assert [r.batch_size for r in got] == [2, 2, 1, 1, 1]  # row 2, its batch-mate, was retried alone
    monkeypatch.undo()
    assert [r.response for r in got if r.error is None] == \
        [r.response for r in rows_of(model, CONFIGS[0], batch_size=2) if r.index != 3]
    assert got[3].response is None and got[3].ids is None


def test_without_retry_and_for_bad_setup_the_error_propagates(model, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(batches_mod, "run_batch", boom)
    with pytest.raises(RuntimeError, match="boom"):
        rows_of(model, CONFIGS[0], batch_size=2, retry=False)

    def bad(*a, **k):
        raise ValueError("bad setup")

    monkeypatch.setattr(batches_mod, "run_batch", bad)
    with pytest.raises(ValueError, match="bad setup"):
        rows_of(model, CONFIGS[0], batch_size=2)


def test_context_is_checked_before_any_sampling(model, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("sampled before the context check")

    monkeypatch.setattr(batches_mod, "run_batch", refuse)
    context = model.backbone.max_length
    long = PROMPTS + [[5] * (context - 4)]
    with pytest.raises(ValueError, match=rf"prompt {len(PROMPTS)} is too long"):
        list(run_batches(model, long, RemaskConfig(steps=4, gen_length=8), batch_size=2, seed_of=lambda i: i))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_batch_size_must_be_a_positive_int(model, bad):
    with pytest.raises(ValueError, match=rf"batch_size={bad!r} must be an int >= 1"):
        list(run_batches(model, PROMPTS, CONFIGS[0], batch_size=bad, seed_of=lambda i: i))


def test_run_batch_guards_against_nan_weights(model):
    from dsl_llada.sampling.guards import NonFiniteLogitsError, NonFiniteStateError

    broken = tiny_dsl(seed=0)
    with torch.no_grad():
        for p in broken.backbone.parameters():
            p.mul_(float("nan"))
    with pytest.raises(NonFiniteLogitsError):
        run_batch(broken, PROMPTS[:2], CONFIGS[0], [1, 2])
    with pytest.raises(NonFiniteStateError, match="NaN at block step 0"):  # unguarded, the sampler's own check stops it
        run_batch(broken, PROMPTS[:2], CONFIGS[0], [1, 2], guard=False)
    with pytest.raises(NonFiniteLogitsError, match="weights are damaged"):  # the SDE's own first-pass check
        run_batch(broken, PROMPTS[:2], CONFIGS[1], [1, 2], guard=False)


def test_retry_rows_policy_eval_style_and_runner_style():
    """The one retry rule: eval records every Exception per row (ValueError included); the batch runner's fatal
    errors propagate; a batch of one is retried only with retry_single."""
    from dsl_llada.sampling.batches import retry_rows

    calls = []

    def call(items):
        calls.append(list(items))
        if 2 in items:
            raise ValueError(f"bad row in {items}")
        return [i * 10 for i in items]

    def failed(item, e, seconds):
        return f"{item}: {type(e).__name__}: {e}"

    assert retry_rows([1, 2, 3], call, failed) == [10, "2: ValueError: bad row in [2]", 30]
    assert calls == [[1, 2, 3], [1], [2], [3]]
    with pytest.raises(ValueError, match=r"bad row in \[1, 2, 3\]"):
        retry_rows([1, 2, 3], call, failed, fatal=(ValueError,))
    calls.clear()
    assert retry_rows([2], call, failed, retry_single=False) == ["2: ValueError: bad row in [2]"]
    assert calls == [[2]]
    calls.clear()
    assert retry_rows([2], call, failed) == ["2: ValueError: bad row in [2]"] and calls == [[2], [2]]
    assert retry_rows([1, 3], call, failed) == [10, 30]
