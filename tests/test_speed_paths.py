"""Compute-only-what-is-used paths: logits at selected positions, the sparse converter, the posterior mean via
embedding_bag, hardware denormal flushing."""

from __future__ import annotations

import pytest
import torch

from dsl_llada.core.backbones.base import position_index, select_positions, with_positions
from dsl_llada.config import ConfigError, SDEConfig
from dsl_llada.core.converter import posterior_mean
from dsl_llada.core.numerics import denormals_flushed, flush_denormals
from dsl_llada.sampling import PromptBatch, sample_sde
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.config import RemaskConfig
from helpers import gen, perturb_converter, tiny_backbone, tiny_dsl

POSITIONS = [slice(3, None), slice(2, 7), torch.tensor([0, 4, 5, 9]), torch.tensor([9, 1])]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) < 1e-5
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("positions", POSITIONS)
def test_llada_logits_at_positions_equal_the_full_rows(positions):
    bb = tiny_backbone()
    ids = torch.randint(0, 60, (2, 10), generator=gen(1))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        for am in (None, mask):
            full = bb(bb.embed(ids), am)
            _close(bb(bb.embed(ids), am, positions=positions), select_positions(full, positions))


def test_head_runs_on_the_selected_rows_only():
    bb = tiny_backbone()
    seen = []
    h = bb.model.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    with torch.no_grad():
        bb(bb.embed(torch.zeros(1, 10, dtype=torch.long)), positions=slice(6, None))
        bb(bb.embed(torch.zeros(1, 10, dtype=torch.long)), positions=torch.tensor([1, 2, 3]))
        bb(bb.embed(torch.zeros(1, 10, dtype=torch.long)))
    h.remove()
    assert seen == [4, 3, 10]


def test_position_index_and_bad_positions():
    assert position_index(slice(3, None), 6).tolist() == [3, 4, 5]
    assert position_index(torch.tensor([-1, 0]), 6).tolist() == [5, 0]
    assert position_index(None, 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="positions must be None, a slice or a 1-D integer tensor"):
        select_positions(torch.zeros(1, 4, 2), torch.tensor([0.5]))


def test_with_positions_wraps_duck_typed_logit_functions():
    calls = []

    def plain(ids, attention_mask=None):
        calls.append(ids.shape)
        return torch.arange(ids.shape[1], dtype=torch.float32)[None, :, None].expand(1, -1, 3)

    f = with_positions(plain)
    out = f(torch.zeros(1, 6, dtype=torch.long), None, positions=slice(4, 6))
    assert out[0, :, 0].tolist() == [4.0, 5.0] and calls == [(1, 6)]
    bb = tiny_backbone()
    assert with_positions(bb.logits_from_ids) == bb.logits_from_ids  # takes positions itself


transformers = pytest.importorskip("transformers")


def _hf_models():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, RobertaConfig, RobertaForMaskedLM

    from dsl_llada.core.backbones.base import SpecialTokens
    from dsl_llada.core.backbones.hf import DreamBackbone, HFBackbone

    torch.manual_seed(0)
    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=64,
              max_position_embeddings=64)
    sp = SpecialTokens(mask=63, eos=62)
    return {"llama": HFBackbone(LlamaForCausalLM(LlamaConfig(**kw, num_key_value_heads=2)).eval(), sp),
            "roberta": HFBackbone(RobertaForMaskedLM(RobertaConfig(**kw, pad_token_id=1)).eval(), sp),
            "dream": DreamBackbone(Qwen2ForCausalLM(Qwen2Config(**kw, num_key_value_heads=2)).eval(), sp)}


@pytest.mark.parametrize("padded", [False, True])
def test_hf_and_dream_logits_at_positions_equal_the_full_rows(padded):
    ids = torch.randint(2, 60, (2, 10), generator=gen(3))
    mask = torch.ones(2, 10, dtype=torch.long)
    if padded:
        mask[1, :4] = 0
    for name, bb in _hf_models().items():
        with torch.no_grad():
            full = bb(bb.embed(ids), mask if padded else None)
            for pos in POSITIONS + [slice(0, 1), torch.tensor([4, 5])]:  # 4, 5: the first real tokens / its successor
                got = bb(bb.embed(ids), mask if padded else None, positions=pos)
                _close(got, select_positions(full, pos))


# -- samplers: positions change nothing ----------------------------------------------------------------------------
def _full_head(monkeypatch, bb):
    """Make the backbone ignore `positions` (head over every position, sliced afterwards)."""
    forward = type(bb).forward

    def full(self, e, attention_mask=None, *, positions=None):
        return select_positions(forward(self, e, attention_mask), positions)

    monkeypatch.setattr(type(bb), "forward", full)


@pytest.mark.parametrize("block_length", [0, 4])
def test_sde_tokens_identical_with_and_without_restricted_head(monkeypatch, block_length):
    model = perturb_converter(tiny_dsl(seed=5, beta_init=1.3))
    pb = PromptBatch.from_lists([[1, 2, 3], [4, 5, 6, 7, 8]], model.special.pad_id)
    cfg = SDEConfig(nfe=8, gen_length=8, top_m=8, block_length=block_length)
    fast = [sample_sde(model, pb, cfg, generator=gen(s)).ids for s in (0, 1)]
    _full_head(monkeypatch, model.backbone)
    slow = [sample_sde(model, pb, cfg, generator=gen(s)).ids for s in (0, 1)]
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
    assert not torch.equal(fast[0], fast[1])  # different seeds, different tokens: the comparison is not vacuous


def test_remask_tokens_identical_with_and_without_restricted_head(monkeypatch):
    bb = tiny_backbone(seed=6)
    pb = PromptBatch.from_lists([[1, 2, 3], [4, 5, 6, 7, 8]], bb.special.pad_id)
    cfgs = [RemaskConfig(steps=8, gen_length=8, block_length=4), RemaskConfig(steps=4, gen_length=8, remdm=True,
                                                                               temperature=0.7),
            RemaskConfig(steps=4, gen_length=8, cfg_scale=1.5, temperature=0.5), RemaskConfig(steps=8, gen_length=8)]
    rows = []
    h = bb.model.transformer.ln_f.register_forward_pre_hook(lambda m, a: rows.append(a[0].shape[1]))
    fast = [sample_remask(bb, pb, c, generator=gen(0)).ids for c in cfgs]
    h.remove()
    assert min(rows) < 4 and max(rows) <= 8  # still-masked columns only, never the prompt
    _full_head(monkeypatch, bb)
    slow = [sample_remask(bb, pb, c, generator=gen(0)).ids for c in cfgs]
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


# -- posterior mean ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top_m", [0, 5, 63])
def test_posterior_mean_matches_the_gather_and_sum(top_m):
    g = gen(2)
    logits = torch.randn(3, 7, 64, generator=g) * 4
    E = torch.nn.functional.normalize(torch.randn(64, 16, generator=g), dim=-1)
    if top_m:
        v, i = logits.topk(top_m, -1)
        ref = torch.einsum("...m,...md->...d", torch.softmax(v, -1), E[i])
    else:
        ref = torch.softmax(logits, -1) @ E
    got = posterior_mean(logits, E, top_m, chunk=4)  # several chunks
    assert got.shape == (3, 7, 16) and float((got - ref).abs().max()) < 1e-6


# -- sparse converter ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tol", [1e-6, 1e-3])
def test_sparse_converter_is_within_its_mass_bound(tol):
    model = perturb_converter(tiny_dsl(1024, seed=7, noise_dim=16, backbone_kw={"d_model": 64}))
    conv, E = model.converter, model.unit_noise()
    ids = torch.randint(0, 1000, (64,), generator=gen(8))
    W = conv.backbone_embedding.weight
    bound = 2 * tol * float(W.detach().abs().max())  # |h - h~| <= 2 * dropped mass * max |W|
    used_sparse = False
    with torch.no_grad():
        for gamma in (0.0, 3.0, 30.0, 100.0):
            z = gamma * E[ids] + gamma ** 0.5 * torch.randn(64, 16, generator=gen(9))
            dense = conv(z, E, 2.0)
            sparse = conv(z, E, 2.0, tolerance=tol)
            assert float((dense - sparse).abs().max()) <= bound
            pi = torch.softmax(conv.slot_logits(z, E, torch.tensor(2.0)), -1)
            used_sparse |= bool(((pi >= tol / pi.shape[-1]).sum(-1) <= pi.shape[-1] // 32).any())
            if gamma == 0.0:  # a flat softmax keeps too many slots: the dense product, bit for bit
                assert torch.equal(dense, sparse)
    assert used_sparse


def test_sparse_converter_refuses_gradients_and_bad_tolerance():
    model = tiny_dsl()
    z = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(ValueError, match="inference path"):
        model.converter(z, model.unit_noise(), tolerance=1e-6)
    with pytest.raises(ValueError, match="tolerance=1.5"):
        model.converter(z.detach(), model.unit_noise(), tolerance=1.5)
    with pytest.raises(ConfigError, match="converter_tolerance=-0.1"):
        SDEConfig(converter_tolerance=-0.1)
    c = SDEConfig(converter_tolerance=1e-6)
    assert SDEConfig.from_dict(c.to_dict()) == c


# -- denormals -----------------------------------------------------------------------------------------------------
def _subnormal() -> float:
    return float(torch.tensor([torch.finfo(torch.float32).tiny]) / 4)


def test_flush_denormals_context_restores_the_mode():
    assert _subnormal() > 0 and not denormals_flushed()
    with flush_denormals() as on:
        if not on:
            pytest.skip("this CPU has no flush-to-zero mode")
        assert _subnormal() == 0.0 and denormals_flushed()
        with flush_denormals():
            assert _subnormal() == 0.0
        assert _subnormal() == 0.0 and denormals_flushed()  # the inner exit restores the outer mode
    assert _subnormal() > 0 and not denormals_flushed()
    with flush_denormals(enabled=False) as on:
        assert not on and _subnormal() > 0


def test_samplers_leave_the_denormal_mode_as_they_found_it():
    model = tiny_dsl()
    pb = PromptBatch.from_lists([[1, 2]], model.special.pad_id)
    sample_sde(model, pb, SDEConfig(nfe=2, gen_length=4, top_m=4), generator=gen(0))
    sample_remask(model, pb, RemaskConfig(steps=2, gen_length=4))
    assert _subnormal() > 0


# -- GPU readiness, exercised on CPU -------------------------------------------------------------------------------
def test_compile_switch_routes_the_backbone_through_torch_compile(monkeypatch):
    """Plumbing only: a real inductor compile takes minutes on this CPU (it ran once by hand: identical tokens)."""
    import dsl_llada.core.backbones.base as base

    seen = []
    monkeypatch.setattr(base.torch, "compile", lambda m: seen.append(m) or m)
    model = tiny_dsl(seed=8)
    pb = PromptBatch.from_lists([[1, 2, 3]], model.special.pad_id)
    cfg = SDEConfig(nfe=4, gen_length=6, top_m=8)
    a = sample_sde(model, pb, cfg.replace(compile=True), generator=gen(0))
    sample_sde(model, pb, cfg.replace(compile=True), generator=gen(0))
    assert seen == [model.backbone]  # compiled once, reused
    assert "_compiled_call" not in model.backbone.state_dict() and not any("_compiled" in k for k in model.state_dict())
    assert torch.equal(a.ids, sample_sde(model, pb, cfg, generator=gen(0)).ids)
    with pytest.raises(ConfigError, match="compile='yes'"):
        SDEConfig(compile="yes")


@pytest.mark.parametrize("tol", [0.0, 1e-6])
def test_bf16_backbone_with_fp32_converter_softmax(tol):
    model = perturb_converter(tiny_dsl(seed=9))
    model.backbone.to(torch.bfloat16)
    model.converter.backbone_embedding.to(torch.bfloat16)
    slot_dtypes = []
    orig = model.converter.slot_logits
    model.converter.slot_logits = lambda *a, **kw: (lambda out: slot_dtypes.append(out.dtype) or out)(orig(*a, **kw))
    pb = PromptBatch.from_lists([[1, 2, 3], [4, 5]], model.special.pad_id)
    out = sample_sde(model, pb, SDEConfig(nfe=4, gen_length=6, top_m=8, converter_tolerance=tol), generator=gen(0))
    assert out.ids.shape == (2, 6) and out.forward_passes == 5
    assert ((out.ids >= 0) & (out.ids < model.vocab_size) & (out.ids != model.special.mask)).all()
    assert slot_dtypes and set(slot_dtypes) == {torch.float32}


def _rows(seed: int, rows: int, n: int, scale: float) -> torch.Tensor:
    return torch.randn(rows, n, generator=gen(seed)) * scale


@pytest.mark.parametrize("case", ["gaussian", "wide", "ties", "half -inf", "one row", "sorted ids"])
def test_top_m_values_selects_exactly_the_topk(case):
    from dsl_llada.core.converter import top_m_values

    m = 64
    x = {"gaussian": _rows(1, 32, 8192, 1.0), "wide": _rows(2, 7, 20000, 30.0),
         "ties": _rows(3, 16, 8192, 4.0).round(),  # many exact ties
         "half -inf": _rows(4, 16, 8192, 1.0).index_fill(1, torch.arange(0, 8192, 2), float("-inf")),
         "one row": _rows(5, 1, 4096, 2.0),
         # values increasing with the token id: the strided sample sees only every 8th of the top block
         "sorted ids": torch.arange(8192.0).repeat(4, 1) + _rows(6, 4, 8192, 0.01)}[case]
    ref_v, ref_i = x.topk(m, dim=-1)
    v, i = top_m_values(x, m)
    assert torch.equal(v, ref_v)  # the same values in the same (descending) order
    assert torch.equal(x.gather(1, i), v)  # indices point at them
    assert all(len(set(r.tolist())) == m for r in i)  # m distinct tokens
    if case != "ties":
        assert torch.equal(i, ref_i)


def test_top_m_values_falls_back_to_topk(monkeypatch):
    """A NaN, short rows and flat rows take torch.topk itself (counted through a wrapper)."""
    from dsl_llada.core import converter

    calls = []
    real = torch.Tensor.topk

    def counting(self, k, *a, **kw):
        calls.append((tuple(self.shape), k))
        return real(self, k, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "topk", counting)
    x = _rows(7, 4, 8192, 1.0)
    x[2, 100] = float("nan")
    v, i = converter.top_m_values(x, 64)
    assert calls[-1] == ((4, 8192), 64)  # the whole rows: the NaN row leaves too few candidates
    assert torch.equal(i[[0, 1, 3]], real(x, 64, dim=-1)[1][[0, 1, 3]])
    calls.clear()
    converter.top_m_values(_rows(8, 4, 512, 1.0), 64)  # rows shorter than 16 m: plain topk
    assert calls == [((4, 512), 64)]
    calls.clear()
    converter.top_m_values(torch.zeros(3, 8192), 64)  # flat rows: every value is a candidate
    assert calls[-1] == ((3, 8192), 64)


def test_workspace_reuses_its_buffer_and_the_converter_output_is_unchanged():
    from dsl_llada.core.numerics import Workspace

    ws = Workspace()
    a = ws.get("x", (4, 10), torch.float32, torch.device("cpu"))
    assert ws.get("x", (4, 10), torch.float32, torch.device("cpu")).data_ptr() == a.data_ptr()
    assert ws.get("x", (5, 10), torch.float32, torch.device("cpu")).shape == (5, 10)
    assert ws.get("x", (5, 10), torch.float64, torch.device("cpu")).dtype == torch.float64
    model = perturb_converter(tiny_dsl())
    E = model.unit_noise()
    with torch.no_grad():
        for gamma in (0.01, 7.0, 74.0):
            z = gamma * torch.randn(2, 7, 16, generator=gen(2))
            assert torch.equal(model.converter(z, E, 2.0, workspace=ws), model.converter(z, E, 2.0))


@pytest.mark.parametrize("layout", ["released", "paper"])
def test_aligned_slot_buffer_gives_bit_identical_converter_output(layout):
    """From SLOT_ALIGN_MIN_ROWS rows the inference slot buffer's rows are padded to a multiple of SLOT_ALIGN floats
    (-inf logits, probability 0): every value of π and h equals the unpadded computation's bit for bit."""
    from dsl_llada.core.converter import SLOT_ALIGN, SLOT_ALIGN_MIN_ROWS, aligned_slots
    from dsl_llada.core.numerics import Workspace

    model = perturb_converter(tiny_dsl(layout=layout))
    conv, E = model.converter, model.unit_noise()
    n_slots = E.shape[0] + 1
    assert n_slots % SLOT_ALIGN and aligned_slots(n_slots, SLOT_ALIGN_MIN_ROWS) % SLOT_ALIGN == 0
    assert aligned_slots(n_slots, SLOT_ALIGN_MIN_ROWS - 1) == n_slots
    if layout == "paper":
        with torch.no_grad():
            conv.mask_key.copy_(torch.randn(conv.mask_key.shape, generator=gen(5)))
    W, c = conv.backbone_embedding.weight, conv.backbone_embedding.bias
    K = torch.cat([E, (conv.mask_key if layout == "paper" else torch.zeros(E.shape[1]))[None]]).detach()
    ws = Workspace()
    with torch.no_grad():
        for rows in (SLOT_ALIGN_MIN_ROWS, 40, 128):
            for gamma in (0.01, 7.0, 74.0):
                z = gamma * torch.randn(rows, E.shape[1], generator=gen(rows))
                logits = torch.addmm(conv.logit_bias, z, K.T, alpha=2.0)  # the unpadded computation
                pi = torch.softmax(logits, -1)
                h_ref = torch.addmm(c, pi, W.T) if c is not None else pi @ W.T
                assert torch.equal(conv.slot_logits(z, E, torch.tensor(2.0)), logits)
                assert torch.equal(conv(z, E, 2.0, workspace=ws), h_ref)
                assert torch.equal(conv(z, E, 2.0), h_ref)
                buf = ws.get("converter.slots", (rows, aligned_slots(n_slots, rows)), torch.float32, z.device)
                assert buf.stride(0) % SLOT_ALIGN == 0 and buf.shape[1] > n_slots
                assert torch.equal(buf[:, :n_slots], pi) and (buf[:, n_slots:] == 0).all()


def test_top_m_values_needs_no_full_topk(monkeypatch):
    """Peaked rows are served from the candidates: torch.topk runs on the sample's group maxima, the picked groups
    and the candidate block only, never on a whole row or the whole sample, and the result is topk's."""
    from dsl_llada.core import converter

    calls = []
    real = torch.Tensor.topk

    def counting(self, k, *a, **kw):
        calls.append(tuple(self.shape))
        return real(self, k, *a, **kw)

    x = _rows(12, 6, 32768, 3.0)
    ref = real(x, 512, dim=-1)
    monkeypatch.setattr(torch.Tensor, "topk", counting)
    v, i = converter.top_m_values(x, 512)
    k_sub, g = -(-3 * 512 // (2 * converter.TOP_M_STRIDE)), converter.TOP_M_GROUP
    assert calls[:2] == [(6, 32768 // converter.TOP_M_STRIDE // g), (6, k_sub * g)] and len(calls) == 3
    assert calls[2][1] < 32768 // converter.TOP_M_STRIDE  # the candidate block: fewer values than the sample
    assert torch.equal(v, ref.values) and torch.equal(x.gather(1, i), v)  # (this x has one exact tie)
    assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(i, ref.indices))


def _sparse_reference(conv, pi: torch.Tensor, tol: float) -> torch.Tensor:
    """The sparse converter's values row by row: dense rows F.linear, sparse rows their renormalised kept slots."""
    import torch.nn.functional as F
    from dsl_llada.core.converter import SPARSE_MAX_FRACTION

    lin = conv.backbone_embedding
    keep = pi >= tol / pi.shape[-1]
    counts = keep.sum(-1)
    sparse = counts <= max(1, pi.shape[-1] // SPARSE_MAX_FRACTION)
    h = F.linear(pi, lin.weight, lin.bias)
    for i in sparse.nonzero().squeeze(1).tolist():
        col = keep[i].nonzero().squeeze(1)
        w = pi[i, col]
        w = w / torch.zeros(1).index_add_(0, torch.zeros_like(col), w)
        h[i] = F.embedding_bag(col, lin.weight.T.contiguous(), torch.tensor([0]), mode="sum",
                               per_sample_weights=w)[0] + lin.bias
    return h


@pytest.mark.parametrize("mix", ["flat", "peaked", "mixed"])
def test_sparse_values_equal_the_row_by_row_reference(mix):
    """Flat, peaked and mixed rows: the batched sparse path (one embedding_bag, dense rows together) gives every
    sparse row's h bit for bit as computed alone (each bag is summed alone, in slot order). Dense rows go through
    one GEMM over the dense rows only, against the reference's GEMM over all rows: with more than one thread the
    GEMM's blocking (hence its summation order) depends on the row count, so they are compared within the bound of
    two fp32 summation orders of V+1 terms, 2 (V+1) u sum_j pi_j |W_ij| (u = 2^-24), and exactly with one thread."""
    model = perturb_converter(tiny_dsl(vocab=4000))
    conv = model.converter
    scale = {"flat": torch.full((12, 1), 0.5), "peaked": torch.full((12, 1), 40.0),
             "mixed": torch.tensor([0.5, 40.0, 8.0, 200.0] * 3)[:, None]}[mix]
    pi = torch.softmax(scale * torch.randn(12, 4001, generator=gen(3)), -1)
    with torch.no_grad():
        got, ref = conv._sparse_values(pi, 1e-6), _sparse_reference(conv, pi, 1e-6)
        W = conv.backbone_embedding.weight
        bound = 2 * pi.shape[-1] * 2.0**-24 * (pi @ W.abs().T + conv.backbone_embedding.bias.abs())
    from dsl_llada.core.converter import SPARSE_MAX_FRACTION
    sparse = (pi >= 1e-6 / pi.shape[-1]).sum(-1) <= max(1, pi.shape[-1] // SPARSE_MAX_FRACTION)
    assert {"flat": 0, "peaked": 12, "mixed": 6}[mix] == int(sparse.sum())  # each case exercises what it names
    assert torch.equal(got[sparse], ref[sparse])
    assert ((got - ref).abs() <= bound)[~sparse].all()
    if torch.get_num_threads() == 1:
        assert torch.equal(got, ref)


@pytest.mark.parametrize("case", ["gaussian", "bf16 ties", "integer ties", "capped", "nan", "many nan", "-inf rows",
                                  "short tail", "few groups"])
def test_sample_kth_largest_equals_topk_of_the_strided_sample(case):
    """The k-th largest of the strided sample, found from the top-k groups, is exactly the value a topk over the
    whole sample gives, with ties, NaNs (ranked above every number), -inf rows and a padded last group."""
    from dsl_llada.core.converter import sample_kth_largest

    n, k = {"short tail": (20001, 96), "few groups": (4096, 96)}.get(case, (32768, 96))
    x = _rows(20, 9, n, 2.0)
    if case == "bf16 ties":
        x = x.bfloat16().float()
    elif case == "integer ties":
        x = x.round()
    elif case == "capped":  # hundreds of sample values tie at the top
        x = x.clamp(max=0.5)
    elif case == "nan":
        x[2, 8 * 100] = float("nan")
    elif case == "many nan":  # more NaNs in a row's sample than k: the k-th largest is NaN
        x[3, : 8 * 200: 8] = float("nan")
    elif case == "-inf rows":
        x[4] = float("-inf")
        x[5, ::2] = float("-inf")
    ref = x[:, ::8].topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    got = sample_kth_largest(x, 8, k)
    assert got.shape == (9, 1)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.nan_to_num(), ref.nan_to_num())
    if case == "many nan":
        assert bool(got[3].isnan()) and not bool(got[0].isnan())


@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
def test_flat_nonzero_equals_nonzero(density):
    from dsl_llada.core.converter import flat_nonzero

    mask = torch.rand(37, 1024, generator=gen(21)) < density
    assert torch.equal(flat_nonzero(mask), mask.view(-1).nonzero().squeeze(1))
    odd = mask[:, :1021]  # not a whole number of 32-bit words: plain nonzero, same answer
    assert torch.equal(flat_nonzero(odd), odd.reshape(-1).nonzero().squeeze(1))


@pytest.mark.parametrize("rows, H, V", [(16, 256, 32768), (33, 64, 50000), (128, 256, 32768), (3, 8, 9000),
                                        (129, 128, 4099), (256, 1024, 8192)])
def test_head_linear_equals_f_linear_bit_for_bit(rows, H, V):
    """The output head in vocabulary chunks gives F.linear's logits bit for bit (shapes below the chunking
    thresholds take F.linear itself); 3-D inputs keep their leading shape."""
    import torch.nn.functional as F

    from dsl_llada.core.backbones.base import HEAD_CHUNK_BYTES, head_linear

    w = torch.randn(V, H, generator=gen(30)) * 0.5
    x = torch.randn(1, rows, H, generator=gen(31))
    with torch.no_grad():
        got = head_linear(x, w)
    assert got.shape == (1, rows, V) and torch.equal(got, F.linear(x, w))
    assert torch.equal(head_linear(x[0], w), F.linear(x[0], w))
    chunked = rows >= 16 and H <= 1024 and V * H * 4 > HEAD_CHUNK_BYTES
    assert chunked == ((rows, H, V) in [(16, 256, 32768), (33, 64, 50000), (128, 256, 32768), (256, 1024, 8192)])


def test_head_linear_keeps_autograd_and_other_dtypes_on_f_linear(monkeypatch):
    """Under autograd and outside fp32 the head is one F.linear (counted); at inference in fp32 it is chunked."""
    from dsl_llada.core.backbones import base

    calls = []
    real = base.F.linear
    monkeypatch.setattr(base.F, "linear", lambda *a: calls.append(a[0].dtype) or real(*a))
    w = torch.randn(32768, 64, generator=gen(32), requires_grad=True)
    x = torch.randn(20, 64, generator=gen(33))
    base.head_linear(x, w).sum().backward()  # gradients flow through F.linear
    assert calls == [torch.float32] and w.grad is not None
    with torch.no_grad():
        base.head_linear(x.bfloat16(), w.detach().bfloat16())
        assert calls == [torch.float32, torch.bfloat16]
        base.head_linear(x, w.detach())
    assert len(calls) == 2
