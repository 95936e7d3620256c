"""Discrete samplers (LLaDA remasking, ReMDM-conf-loop) on a tiny random LLaDA, CPU, seconds.

The tiny model is initialised with std 0.3 instead of the default 0.02: at 0.02 the logits are nearly flat and
greedy decoding emits one token everywhere, which would make the batch-vs-single and determinism checks vacuous.
"""

from __future__ import annotations

import pytest
import torch

from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import ConfigError, RemaskConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.sampling.common import PromptBatch, RowRNG
from dsl_llada.sampling.remask import sample_remask, sample_remdm, suppressed_steps, transfer_counts
from dsl_llada.sampling.remask_step import remask_step
from dsl_llada.sampling.remdm import in_loop_window, loop_time, remask_probabilities, sigma_max

EOT = 61  # tiny config: mask 63, eos 62 (also the pad id), eot 61


@pytest.fixture(scope="module")
def model() -> LLaDABackbone:
    m = LLaDABackbone(tiny_llada_config(vocab_size=64, d_model=32, n_layers=2, eot_token_id=EOT))
    m.init_weights(torch.Generator().manual_seed(0), std=0.3)
    return m.eval()


class Wrapped:
    """A model wrapper that records every forward call and optionally adds a logit bias per token (and position)."""

    def __init__(self, inner, bias: dict[int, float] | None = None, positions: slice | None = None):
        self.inner, self.bias, self.positions = inner, bias or {}, positions
        self.calls: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    @property
    def special(self):
        return self.inner.special

    @property
    def max_length(self):
        return self.inner.max_length

    def logits_from_ids(self, ids, attention_mask=None):
        self.calls.append((ids.clone(), None if attention_mask is None else attention_mask.clone()))
        logits = self.inner.logits_from_ids(ids, attention_mask).clone()
        sl = self.positions or slice(None)
        for tok, b in self.bias.items():
            logits[:, sl, tok] += b
        return logits


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]


def batch(model, prompts=PROMPTS) -> PromptBatch:
    return PromptBatch.from_lists(prompts, model.special.pad_id)


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


# -- schedule ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,S,expected", [
    (32, 4, [8, 8, 8, 8]), (10, 3, [4, 3, 3]), (13, 5, [3, 3, 3, 2, 2]), (5, 8, [1, 1, 1, 1, 1, 0, 0, 0]),
    (7, 7, [1] * 7), (0, 3, [0, 0, 0]), (256, 64, [4] * 64), (256, 60, [5] * 16 + [4] * 44), (1, 1, [1]),
])
def test_transfer_counts_match_llada_schedule(M, S, expected):
    assert transfer_counts(M, S) == expected
    assert sum(transfer_counts(M, S)) == M


def test_transfer_counts_rejects_bad_input():
    with pytest.raises(ValueError, match="steps=0"):
        transfer_counts(4, 0)


def test_commits_per_step_follow_schedule(model):
    seen = []
    cfg = RemaskConfig(steps=6, gen_length=20, block_length=10)  # 2 blocks x 3 steps, 10 masks -> [4, 3, 3]
    out = sample_remask(model, batch(model), cfg, callback=lambda s: seen.append(s.extra["n_committed"].tolist()))
    assert seen == [[c] * 3 for c in [4, 3, 3, 4, 3, 3]]
    assert out.nfe == 6 and out.forward_passes == 6


# -- invariants ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg_scale", [0.0, 1.5])
def test_prompt_never_changes_and_forward_count(model, cfg_scale):
    w = Wrapped(model)
    pb = batch(model)
    cfg = RemaskConfig(steps=8, gen_length=16, block_length=8, cfg_scale=cfg_scale, temperature=0.7)
    out = sample_remask(w, pb, cfg, generator=torch.Generator().manual_seed(3))
    per_step = 2 if cfg_scale > 0 else 1
    assert out.forward_passes == len(w.calls) == per_step * 8 and out.nfe == 8
    P = pb.length
    expect_mask = torch.cat([pb.attention_mask, torch.ones(3, 16, dtype=torch.long)], 1)
    for n, (ids, attn) in enumerate(w.calls):
        assert torch.equal(attn, expect_mask)  # padding mask extended with ones, in both CFG copies
        if n % per_step == 0:
            assert torch.equal(ids[:, :P], pb.ids)
        else:  # unconditional copy: real prompt tokens -> MASK, padding kept
            real = pb.attention_mask.bool()
            assert (ids[:, :P][real] == model.special.mask).all()
            assert torch.equal(ids[:, :P][~real], pb.ids[~real])
    assert not (out.ids == model.special.mask).any()


def test_committed_tokens_never_change(model):
    out = sample_remask(model, batch(model), RemaskConfig(steps=8, gen_length=16, temperature=1.0),
                        generator=torch.Generator().manual_seed(5), return_trajectory=True)
    mask = model.special.mask
    traj = out.trajectory
    assert len(traj) == 8
    for a, b in zip(traj, traj[1:]):
        done = a != mask
        assert torch.equal(b[done], a[done])
    assert torch.equal(traj[-1], out.ids)


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_every_mask_resolved(model, remasking):
    for seed in range(5):
        out = sample_remask(model, batch(model), RemaskConfig(steps=5, gen_length=13, remasking=remasking,
                                                              temperature=1.0),
                            generator=torch.Generator().manual_seed(seed))
        assert not (out.ids == model.special.mask).any()


def test_semi_autoregressive_blocks(model):
    mask = model.special.mask
    out = sample_remask(model, batch(model), RemaskConfig(steps=9, gen_length=24, block_length=8),
                        return_trajectory=True)
    for step, snap in enumerate(out.trajectory):
        blk, i = divmod(step, 3)
        assert (snap[:, (blk + 1) * 8:] == mask).all()  # later blocks untouched
        assert not (snap[:, : blk * 8] == mask).any()  # earlier blocks complete
        if i == 2:
            assert not (snap[:, blk * 8:(blk + 1) * 8] == mask).any()  # block complete at its last step


# -- determinism and batching --------------------------------------------------------------------------------------

def test_same_seed_same_tokens(model):
    cfg = RemaskConfig(steps=8, gen_length=16, temperature=1.0, remasking="random")
    a = sample_remask(model, batch(model), cfg, generator=torch.Generator().manual_seed(7))
    b = sample_remask(model, batch(model), cfg, generator=torch.Generator().manual_seed(7))
    c = sample_remask(model, batch(model), cfg, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.ids, b.ids)
    assert not torch.equal(a.ids, c.ids)


class FixedLogits:
    """A duck-typed model (no nn.Module, no max_length) whose logits are the same row at every position."""

    def __init__(self, special, row: torch.Tensor):
        self.special, self.row = special, row

    def logits_from_ids(self, ids, attention_mask=None):
        return self.row.expand(ids.shape[0], ids.shape[1], -1).clone()


@pytest.mark.parametrize("T", [1.0, 0.5])
def test_gumbel_max_samples_softmax_over_temperature(model, T):
    V, n = 64, 4000
    special = model.special
    row = torch.full((V,), -30.0)
    row[:4] = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    fake = FixedLogits(special, row)
    pb = PromptBatch.from_lists([[1, 2]] * n, special.pad_id)
    out = sample_remask(fake, pb, RemaskConfig(steps=1, gen_length=1, temperature=T),
                        generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(out.ids[:, 0], minlength=V)[:4].double() / n
    target = torch.softmax(row[:4].double() / T, 0)
    assert torch.allclose(freq, target, atol=0.03), (freq, target)


def test_temperature_changes_tokens(model):
    greedy = sample_remask(model, batch(model), RemaskConfig(steps=8, gen_length=16))
    runs = [sample_remask(model, batch(model), RemaskConfig(steps=8, gen_length=16, temperature=1.0),
                          generator=torch.Generator().manual_seed(s)).ids for s in (1, 2)]
    assert not torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], greedy.ids)


@pytest.mark.parametrize("cfg", [
    RemaskConfig(steps=8, gen_length=16, block_length=8),
    RemaskConfig(steps=8, gen_length=16, block_length=8, temperature=1.0),
    RemaskConfig(steps=8, gen_length=16, temperature=0.8, remasking="random", cfg_scale=0.5),
    RemaskConfig(steps=8, gen_length=16, temperature=1.0, remdm=True, remdm_alpha_loop=0.5),
], ids=["greedy", "gumbel", "random-cfg", "remdm"])
def test_padded_batch_equals_one_by_one(model, cfg):
    seeds = [11, 12, 13]
    together = sample_remask(model, batch(model), cfg, generator=gens(seeds))
    assert len(set(map(tuple, together.ids.tolist()))) == 3  # rows differ: the check is not vacuous
    for row, (p, s) in enumerate(zip(PROMPTS, seeds)):
        alone = sample_remask(model, batch(model, [p]), cfg, generator=gens([s]))
        assert torch.equal(together.ids[row], alone.ids[0])
        assert together.lengths[row] == alone.lengths[0]


def test_dsl_model_discrete_path(model):
    dsl = DSLModel.convert(model).eval()
    cfg = RemaskConfig(steps=8, gen_length=16, temperature=1.0, remdm=True)
    a = sample_remask(dsl, batch(model), cfg, generator=torch.Generator().manual_seed(2))
    b = sample_remask(model, batch(model), cfg, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.ids, b.ids)
    with pytest.raises(ValueError, match="context of 256"):
        sample_remask(dsl, batch(model, [[1] * 250]), RemaskConfig(steps=8, gen_length=16))


# -- EOS handling and truncation ----------------------------------------------------------------------------------

def test_eos_inf_blocks_eos(model):
    eos = model.special.eos
    w = Wrapped(model, bias={eos: 8.0, EOT: 6.0})
    base = sample_remask(w, batch(model), RemaskConfig(steps=8, gen_length=16))
    assert (base.ids == eos).any()  # the bias makes EOS likely: the checks below are meaningful
    out = sample_remask(w, batch(model), RemaskConfig(steps=8, gen_length=16, eos_inf=True))
    assert not (out.ids == eos).any()
    assert (out.ids == EOT).any()  # EoT still allowed unless asked
    out = sample_remask(w, batch(model), RemaskConfig(steps=8, gen_length=16, eos_inf=True, eos_inf_include_eot=True))
    assert not (out.ids == eos).any() and not (out.ids == EOT).any()


def test_eos_suppress_ratio_first_steps_of_each_block(model):
    eos = model.special.eos
    w = Wrapped(model, bias={eos: 8.0, EOT: 8.0})
    cfg = RemaskConfig(steps=8, gen_length=16, block_length=8, eos_suppress_ratio=0.5)  # S_b 4 -> 2 steps banned
    assert suppressed_steps(0.5, 4) == 2 and suppressed_steps(0.3, 10) == 3 and suppressed_steps(1.0, 4) == 4
    out = sample_remask(w, batch(model), cfg, return_trajectory=True)
    prev = torch.full_like(out.ids, model.special.mask)
    for step, snap in enumerate(out.trajectory):
        new = (snap != prev)
        stop = (snap == eos) | (snap == EOT)
        if step % 4 < 2:
            assert not (new & stop).any(), f"EOS/EoT committed at suppressed step {step}"
        prev = snap
    assert ((out.ids == eos) | (out.ids == EOT)).any()  # allowed again after the suppressed steps


def test_truncation_at_first_stop(model):
    eos = model.special.eos
    L = 16
    w = Wrapped(model, bias={eos: 10.0}, positions=slice(-4, None))  # EOS only wins in the last 4 positions
    out = sample_remask(w, batch(model), RemaskConfig(steps=8, gen_length=L))
    for row, n in zip(out.ids.tolist(), out.lengths.tolist()):
        stops = [j for j, t in enumerate(row) if t in (eos, EOT)]
        assert n == (stops[0] if stops else L)
        assert n <= L - 4
    assert [len(r) for r in out.responses()] == out.lengths.tolist()
    full = sample_remask(w, batch(model), RemaskConfig(steps=8, gen_length=L, truncate_at_eos=False))
    assert full.lengths.tolist() == [L] * 3 and torch.equal(full.ids, out.ids)


# -- ReMDM --------------------------------------------------------------------------------------------------------

def test_remdm_window_and_sigma():
    assert [in_loop_window(loop_time(i, 8), 0.55, 0.05) for i in range(8)] == [False] * 4 + [True] * 4
    assert not in_loop_window(loop_time(19, 20), 0.55, 0.05)  # t = 0.05 exactly: t_off excluded
    assert in_loop_window(loop_time(9, 20), 0.55, 0.05)  # t = 0.55 exactly: t_on included
    assert sigma_max(0.9) == pytest.approx(1 / 9) and sigma_max(0.5) == 1.0 and sigma_max(0.2) == 1.0
    conf = torch.tensor([[0.9, 0.2, 0.5, 0.1], [0.3, 0.3, 0.3, 0.3]], dtype=torch.float64)
    committed = torch.tensor([[True, True, False, True], [False, False, False, False]])
    eta = remask_probabilities(conf, committed, 0.1)
    u = torch.tensor([0.1, 0.8, 0.9], dtype=torch.float64)
    assert torch.allclose(eta[0, [0, 1, 3]], 0.1 * torch.softmax(u, 0)) and eta[0, 2] == 0
    assert (eta[1] == 0).all()


def test_remask_confidence_modes():
    from dsl_llada.sampling.remdm import remask_confidence
    probs = torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]], dtype=torch.float64)
    committed_tokens = torch.tensor([[1, 2]])
    proposal = torch.tensor([[0, 1]])
    masked = torch.tensor([[False, False]])
    ours = remask_confidence(probs, committed_tokens, proposal, masked, "committed")
    authors = remask_confidence(probs, committed_tokens, proposal, masked, "argmax")
    assert ours.tolist() == [[0.2, 0.3]] and authors.tolist() == [[0.7, 0.6]]


def _remdm_run(model, seed, **kw):
    events = []
    cfg = RemaskConfig(steps=8, gen_length=16, temperature=1.0, remdm_alpha_loop=0.5, remdm_t_on=0.9, **kw)
    out = sample_remdm(model, batch(model), cfg, generator=torch.Generator().manual_seed(seed),
                       callback=lambda s: events.append(s.extra))
    return out, events


def test_remdm_resolves_every_mask_and_masks_never_accumulate(model):
    total_remasks = 0
    sched = transfer_counts(16, 8)
    for seed in range(20):
        out, events = _remdm_run(model, seed)
        assert out.config["sampler"] == "remdm" and out.nfe == 8 and out.forward_passes == 8
        assert not (out.ids == model.special.mask).any()
        for i, e in enumerate(events):
            assert e["n_masked"].tolist() == [16 - sum(sched[: i + 1])] * 3  # quota fix: same count as LLaDA
            assert e["in_loop"] == (i >= 1)  # t_on 0.9: t = 1 - i/8 <= 0.9 from i = 1
        total_remasks += sum(int(e["n_remasked"].sum()) for e in events)
    assert total_remasks > 20  # remasking certainly happened


def test_remdm_authors_quota_leaves_masks(model):
    leftover = 0
    for seed in range(10):
        out, events = _remdm_run(model, seed, remdm_authors_quota=True, remdm_confidence="argmax")
        n_remasked = sum(e["n_remasked"] for e in events)
        n_left = (out.ids == model.special.mask).sum(dim=1)
        assert torch.equal(n_left, n_remasked)  # every remask event leaves one MASK behind (authors' flaw)
        leftover += int(n_left.sum())
    assert leftover > 0


def test_remdm_same_seed_same_tokens(model):
    a, _ = _remdm_run(model, 4)
    b, _ = _remdm_run(model, 4)
    assert torch.equal(a.ids, b.ids)
    other, _ = _remdm_run(model, 5)
    assert not torch.equal(a.ids, other.ids)  # the generator is used


# -- the pure step ---------------------------------------------------------------------------------------------------

def _step_inputs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 10, generator=g)
    logits[..., 9] = float("-inf")  # id 9 plays [MASK]
    block = torch.tensor([[9, 9, 3, 9, 9, 9], [1, 2, 9, 9, 4, 9]])
    return logits, block


def test_remask_step_low_confidence_commits_the_quota_and_changes_no_input():
    logits, block = _step_inputs()
    before = (logits.clone(), block.clone())
    cfg = RemaskConfig(steps=4, gen_length=6)
    st = remask_step(logits, block, torch.tensor([2, 1]), block_step=0, steps_per_block=4, config=cfg, mask_id=9,
                     rng=RowRNG(None, 2))
    assert torch.equal(logits, before[0]) and torch.equal(block, before[1])  # pure: inputs untouched
    assert torch.equal(st.proposal, logits.argmax(-1))  # temperature 0: the argmax
    assert st.committed.sum(1).tolist() == [2, 1] and not (st.committed & (block != 9)).any()
    assert torch.equal(st.tokens, torch.where(st.committed, st.proposal, block))
    assert st.t == 1.0 and not st.in_loop and not st.remasked.any()
    # the committed positions are the most confident masked ones under softmax(logits)
    conf = torch.softmax(logits, -1).gather(-1, st.proposal[..., None])[..., 0].masked_fill(block != 9, -1.0)
    for r in range(2):
        assert set(st.committed[r].nonzero().flatten().tolist()) == set(conf[r].topk(int(st.committed[r].sum())).indices.tolist())
    last = remask_step(logits, block, torch.tensor([0, 0]), block_step=3, steps_per_block=4, config=cfg, mask_id=9,
                       rng=RowRNG(None, 2))
    assert not (last.tokens == 9).any()  # the block's last step resolves every remaining mask


def test_confidence_is_the_float64_softmax_not_an_fp32_logsumexp_rounding():
    """Two masked positions whose confidences differ by 4.3e-7 in float64: at logits near 36 a log-sum-exp rounded
    to float32 (ulp 3.8e-6 there) gives both the same value, and the tie went to the lower position. The step must
    commit the position LLaDA's float64 softmax ranks first (its top-k over softmax(logits.double()))."""
    logits = torch.full((1, 2, 8), float("-inf"))  # id 7 plays [MASK]; every other id but 0, 1, 2 banned
    logits[0, :, 0] = 36.0
    logits[0, 0, 1] = 30.870037078857422  # exactly representable in float32, as is the next one
    logits[0, 1, 2] = 30.869962692260742
    p64 = torch.softmax(logits.double(), -1)[0, :, 0]
    assert 4.3e-7 < float(p64[1] - p64[0]) < 4.4e-7  # position 1 is the more confident one
    lse32 = torch.logsumexp(logits, -1).double()
    assert float(lse32[0, 0]) == float(lse32[0, 1])  # the rounding this test guards against: a tie at 36 + 2^-18 k
    cfg = RemaskConfig(steps=2, gen_length=2)
    st = remask_step(logits, torch.tensor([[7, 7]]), torch.tensor([1]), block_step=0, steps_per_block=2, config=cfg,
                     mask_id=7, rng=RowRNG(None, 1))
    assert st.committed.tolist() == [[False, True]]
    assert st.tokens.tolist() == [[7, 0]]


def test_remask_step_remdm_remasks_inside_the_window_only():
    logits, block = _step_inputs()
    cfg = RemaskConfig(steps=4, gen_length=6, remdm=True, remdm_alpha_loop=0.1, remdm_t_on=0.9, remdm_t_off=0.1)
    outside = remask_step(logits, block, torch.tensor([1, 1]), block_step=0, steps_per_block=4, config=cfg,
                          mask_id=9, rng=RowRNG(torch.Generator().manual_seed(0), 2))
    assert not outside.in_loop and not outside.remasked.any()
    hits = 0
    for seed in range(20):
        st = remask_step(logits, block, torch.tensor([1, 1]), block_step=1, steps_per_block=4, config=cfg,
                         mask_id=9, rng=RowRNG(torch.Generator().manual_seed(seed), 2))
        assert st.in_loop and st.t == 0.75
        assert not (st.remasked & (block == 9)).any()  # only committed tokens are re-masked
        # quota fix: re-masked positions are re-revealed in the same step, so masks never accumulate
        assert torch.equal((st.tokens == 9).sum(1), (block == 9).sum(1) - 1)
        hits += int(st.remasked.sum())
    assert hits > 0


# -- bad input ----------------------------------------------------------------------------------------------------

def test_config_errors_name_values():
    with pytest.raises(ConfigError, match=r"steps=5.*number of blocks 2"):
        RemaskConfig(steps=5, gen_length=16, block_length=8)
    with pytest.raises(ConfigError, match=r"gen_length=16.*block_length=6"):
        RemaskConfig(steps=8, gen_length=16, block_length=6)
    with pytest.raises(ConfigError, match="remdm_confidence"):
        RemaskConfig(remdm_confidence="max")


def test_prompt_too_long(model):
    with pytest.raises(ValueError, match=r"prompt length 250 \+ gen_length 16 = 266.*context of 256"):
        sample_remask(model, batch(model, [[1] * 250]), RemaskConfig(steps=8, gen_length=16))


def test_silent_and_config_round_trip(model, capsys):
    cfg = RemaskConfig(steps=4, gen_length=8)
    out = sample_remask(model, batch(model), cfg, progress=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    shown = sample_remask(model, batch(model), cfg, progress=True)  # the bar goes to stderr, tokens unchanged
    assert torch.equal(shown.ids, out.ids)
    d = dict(out.config)
    assert d.pop("sampler") == "remask" and RemaskConfig.from_dict(d) == cfg


@pytest.mark.parametrize("shape,chunk_rows", [((3, 7, 50), 4), ((2, 5, 33), 1), ((1, 3, 64), 8)])
def test_row_logsumexp_chunks_rows_and_equals_logsumexp_bit_for_bit(monkeypatch, shape, chunk_rows):
    """The remasking step's float64 logsumexp runs over row chunks (bounded temporaries at batch 8); every row's
    value is the whole-tensor float64 logsumexp's, bit for bit, also with banned (-inf) ids and a NaN row."""
    import importlib

    rs = importlib.import_module("dsl_llada.sampling.remask_step")
    monkeypatch.setattr(rs, "LSE_CHUNK_BYTES", chunk_rows * shape[-1] * 8)  # float64 rows
    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[-1])) * 5
    x[..., 2] = float("-inf")
    x[0, 1, 4] = float("nan")
    calls = []
    real = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = rs.row_logsumexp(x)
    n_rows = shape[0] * shape[1]
    assert len(calls) == (1 if n_rows <= chunk_rows else -(-n_rows // chunk_rows))
    want = real(x.double(), dim=-1)
    assert got.dtype == torch.float64
    assert got.shape == want.shape and torch.equal(got.isnan(), want.isnan()) and bool(got[0, 1].isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
