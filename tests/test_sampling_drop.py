"""Rows leaving a running batch (`StepInfo.drop`): every sampler removes a dropped row from all of its per-row state
at the step boundary, the other rows get bitwise the tokens (and step logits) of an undropped run, and every model
call after the drop runs on the smaller batch (counted by a wrapped backbone, not by hooks)."""

from __future__ import annotations

import pytest
import torch
from helpers import MASK, BatchLog, tiny_dsl

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling.common import PromptBatch, StepInfo
from dsl_llada.sampling.dispatch import sample

PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]  # different lengths: left padding and an attention mask
SEEDS = [11, 12, 13]

CASES = {
    "sde": (SDEConfig(nfe=8, gen_length=8), 1),
    "block-sde": (SDEConfig(nfe=4, gen_length=8, block_length=4), 1),
    "block-sde-decode": (SDEConfig(nfe=4, gen_length=8, block_length=4), "decode0"),
    "block-sde-kv-prefix": (SDEConfig(nfe=4, gen_length=8, block_length=4, kv_cache="prefix"), 2),
    "remask": (RemaskConfig(steps=8, gen_length=8, block_length=4, temperature=0.7), 2),
    "remask-random-cfg": (RemaskConfig(steps=8, gen_length=8, remasking="random", cfg_scale=1.0, temperature=0.5), 3),
    "remask-kv-dual": (RemaskConfig(steps=8, gen_length=8, block_length=4, kv_cache="dual", temperature=0.7), 1),
    "remdm": (RemaskConfig(steps=8, gen_length=8, block_length=4, remdm=True, temperature=0.7), 2),
}


@pytest.fixture(scope="module")
def model():
    return tiny_dsl(seed=0).float()


def run(model, config, at=None, rows=(1,)):
    """Sample PROMPTS with one generator per row; `at` = the step (or 'decodeK': block K's decode call) after which
    `rows` are dropped. Returns (output, per original row the list of step logits, batch sizes before / after)."""
    batch = PromptBatch.from_lists(PROMPTS, pad_id=model.special.pad_id)
    gens = [torch.Generator().manual_seed(s) for s in SEEDS]
    seen: dict[int, list[torch.Tensor]] = {r: [] for r in range(len(PROMPTS))}
    mark: list[int] = []

    def callback(info: StepInfo) -> None:
        lo, hi = info.window
        # the positions the step read: those still masked before it (a discrete step's logits of columns that only
        # other rows still mask are not read, and a smaller batch may leave them zeros)
        read = ~info.committed[:, lo:hi]
        if info.newly_committed is not None:
            read |= info.newly_committed[:, lo:hi]
        for i, r in enumerate(info.rows):
            seen[r].append(info.logits[i][read[i]].clone())
        here = f"decode{info.extra.get('block')}" if info.decode else info.step
        if here == at:
            info.drop(*rows)
            mark.append(len(log.sizes))

    with BatchLog(model) as log:
        out = sample(model, batch, config, generator=gens, callback=callback)
    split = mark[0] if mark else len(log.sizes)
    return out, seen, log.sizes[:split], log.sizes[split:]


@pytest.mark.parametrize("case", list(CASES))
def test_a_dropped_row_leaves_and_the_others_keep_their_tokens(model, case):
    config, at = CASES[case]
    ref, ref_logits, before_ref, _ = run(model, config)
    out, logits, before, after = run(model, config, at=at)
    assert ref.dropped == [] and set(before_ref) == {3}
    assert out.dropped == [1]
    assert set(before) == {3} and after and set(after) == {2}  # every call after the drop has batch 2
    for r in (0, 2):
        assert torch.equal(out.ids[r], ref.ids[r]) and int(out.lengths[r]) == int(ref.lengths[r])
        assert len(logits[r]) == len(ref_logits[r])
        if isinstance(config, RemaskConfig) and not config.remdm:
            # plain remasking runs the output head on the block columns that *some* row still masks: a smaller
            # batch can shrink that set, and the head's matmul over fewer rows may round differently (~1e-6)
            assert all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(logits[r], ref_logits[r]))
        else:
            assert all(torch.equal(a, b) for a, b in zip(logits[r], ref_logits[r]))  # bitwise, every step
    assert out.ids[1].eq(MASK).all() and int(out.lengths[1]) == 0 and out.responses()[1] == []
    assert len(logits[1]) < len(ref_logits[1])  # the dropped row was seen up to its drop only
    assert not torch.equal(ref.ids[0], ref.ids[2])  # the rows differ: the equalities above say something


@pytest.mark.parametrize("case", ["sde", "remask"])
def test_without_a_drop_every_row_runs_to_the_end(model, case):
    config, _ = CASES[case]
    out, _, before, after = run(model, config, at=None)
    assert out.dropped == [] and after == [] and set(before) == {3}
    assert all(int(n) > 0 for n in out.lengths) and not out.ids.eq(MASK).all(dim=1).any()


@pytest.mark.parametrize("case", ["sde", "block-sde", "remask"])
def test_dropping_every_row_stops_the_run(model, case):
    config, _ = CASES[case]
    out, _, before, after = run(model, config, at=0, rows=(0, 1, 2))
    assert out.dropped == [0, 1, 2] and after == [] and out.ids.eq(MASK).all()
    assert out.lengths.tolist() == [0, 0, 0]


def test_two_drops_at_different_steps_map_to_original_rows(model):
    config = RemaskConfig(steps=8, gen_length=8, block_length=4, temperature=0.7)
    ref, ref_logits, _, _ = run(model, config)
    batch = PromptBatch.from_lists(PROMPTS, pad_id=model.special.pad_id)
    gens = [torch.Generator().manual_seed(s) for s in SEEDS]
    seen_rows = []

    def callback(info: StepInfo) -> None:
        seen_rows.append(info.rows)
        if info.step == 1:
            info.drop(0)
        if info.step == 4:
            info.drop(2)

    out = sample(model, batch, config, generator=gens, callback=callback)
    assert out.dropped == [0, 2] and torch.equal(out.ids[1], ref.ids[1])
    assert seen_rows[1] == (0, 1, 2) and seen_rows[2] == (1, 2) and seen_rows[5] == (1,)


def test_drop_names_a_row_of_the_batch():
    info = StepInfo(step=0, total_steps=1, tokens=torch.zeros(2, 3), rows=(0, 2))
    with pytest.raises(ValueError, match=r"row 1 is not in this step's batch \(rows \[0, 2\]\)"):
        info.drop(1)
    with pytest.raises(ValueError, match="does not support dropping rows"):
        StepInfo(step=0, total_steps=1, tokens=torch.zeros(2, 3)).drop(0)
    info.drop(2)
    assert info.dropping == {2}


@pytest.mark.parametrize("case", ["sde", "block-sde", "remask"])
def test_trajectories_keep_the_original_rows(model, case):
    config, at = CASES[case]

    def traj(drop: bool):
        batch = PromptBatch.from_lists(PROMPTS, pad_id=model.special.pad_id)
        gens = [torch.Generator().manual_seed(s) for s in SEEDS]

        def callback(info: StepInfo) -> None:
            if drop and not info.decode and info.step == at:
                info.drop(1)

        return sample(model, batch, config, generator=gens, callback=callback, return_trajectory=True).trajectory

    ref, got = traj(False), traj(True)
    assert len(got) == len(ref) and all(t.shape == (3, config.gen_length) for t in got)
    for k, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a[[0, 2]], b[[0, 2]])
        assert torch.equal(a[1], b[1]) if k <= at else bool(a[1].eq(MASK).all())
