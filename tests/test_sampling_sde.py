"""Embedding-space SDE sampler (paper Algorithm 2, docs/provenance.md §3.1) and Block SDE on a tiny DSL model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dsl_llada.sampling.sde as sde_mod
from dsl_llada.core.backbones.base import position_index
from dsl_llada.config import ConfigError, SDEConfig
from dsl_llada.sampling import (PromptBatch, RowRNG, heun_solve, inference_beta, sample_block_sde, sample_sde,
                                stop_lengths)
from dsl_llada.sampling.denoiser import Denoiser
from dsl_llada.sampling.sde import decode_argmax
from dsl_llada.snr import snr_schedule
from helpers import EOS, MASK, gen, perturb_converter, tiny_dsl

EOT = 61
D = 16
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12]]


@pytest.fixture(scope="module")
def model():
    return perturb_converter(tiny_dsl(seed=0, beta_init=1.3, backbone_kw={"eot_token_id": EOT}))


def prompts(model, rows=PROMPTS) -> PromptBatch:
    return PromptBatch.from_lists(rows, model.special.pad_id)


def cfg(**kw) -> SDEConfig:
    base = dict(nfe=8, gen_length=8, top_m=8)
    base.update(kw)
    return SDEConfig(**base)


class Recorder:
    """Forward pre-hooks on the backbone (inputs_embeds) and the converter (z, E, beta); forward hook to bias logits."""

    def __init__(self, model, logit_bias: dict[tuple[int | None, int], float] | None = None):
        self.inputs: list[torch.Tensor] = []
        self.conv_args: list[tuple] = []
        self.handles = [model.backbone.register_forward_pre_hook(lambda m, a: self.inputs.append(a[0].clone())),
                        model.converter.register_forward_pre_hook(lambda m, a: self.conv_args.append(a))]
        if logit_bias:
            def bias(m, a, kw, out):
                out = out.clone()
                # `pos` is a position in the whole sequence; the output holds only the positions asked for
                where = position_index(kw.get("positions"), a[0].shape[1]).tolist()
                for (pos, tok), val in logit_bias.items():
                    if pos is None:
                        out[..., tok] += val
                    elif pos in where:
                        out[:, where.index(pos), tok] += val
                return out
            self.handles.append(model.backbone.register_forward_hook(bias, with_kwargs=True))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


# -- basic contract --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nfe", [2, 4, 8])
def test_output_shape_and_forward_accounting(model, nfe):
    pb = prompts(model)
    with Recorder(model) as rec:
        out = sample_sde(model, pb, cfg(nfe=nfe), generator=gen(0))
    S = nfe // 2
    assert out.ids.shape == (3, 8) and out.ids.dtype == torch.long
    assert out.nfe == 2 * S and out.forward_passes == 2 * S + 1 == len(rec.inputs)
    assert out.lengths.shape == (3,)
    assert out.config["sampler"] == "sde" and out.config["nfe"] == nfe
    assert out.trajectory is None


def test_prompt_context_is_clean_and_fixed(model):
    pb = prompts(model)
    P = pb.length
    ctx = model.context_embed(pb.ids)
    with Recorder(model) as rec:
        sample_sde(model, pb, cfg(), generator=gen(0))
    for x in rec.inputs:
        assert x.shape == (3, P + 8, 32)
        assert torch.equal(x[:, :P], ctx)
    # response inputs are converter(gamma_s * y): the first at gamma_0 = 0.01 is near the mask-like h(0)
    W = model.converter.backbone_embedding.weight.detach()
    h0 = 0.5 * W[:, -1] + 0.5 * W[:, :-1].mean(1) + model.converter.backbone_embedding.bias.detach()
    assert (rec.inputs[0][:, P:] - h0).norm(dim=-1).max() < 0.05 * h0.norm()


def test_wte_context_uses_backbone_embedding():
    m = perturb_converter(tiny_dsl(seed=0, context_embedding="wte"))
    pb = prompts(m)
    with Recorder(m) as rec:
        sample_sde(m, pb, cfg(nfe=2), generator=gen(0))
    wte = m.backbone.input_embeddings()(pb.ids)
    assert all(torch.equal(x[:, : pb.length], wte) for x in rec.inputs)


def test_converter_sees_gamma_times_y_and_inference_beta(model, monkeypatch):
    seen = {}
    real = sde_mod.heun_solve

    def spy(denoise, y, grid, **kw):
        seen["y0"], seen["grid"] = y.clone(), grid
        seen["y"] = real(denoise, y, grid, **kw)
        return seen["y"]

    monkeypatch.setattr(sde_mod, "heun_solve", spy)
    c = cfg()
    with Recorder(model) as rec:
        sample_sde(model, prompts(model), c, generator=gen(0))
    S = c.steps
    assert len(rec.conv_args) == 2 * S + 1
    grid = snr_schedule("sensitive", S)
    assert seen["grid"] == c.snr_grid == tuple(grid.tolist())  # the config's own grid, built once
    z0, E0, beta0 = rec.conv_args[0]
    assert torch.equal(z0, float(grid[0]) * seen["y0"])
    assert torch.allclose(seen["y0"].norm(dim=-1), torch.ones(3, 8), atol=1e-6)  # unit-norm init
    assert torch.equal(rec.conv_args[-1][0], float(grid[-1]) * seen["y"])  # final decode at gamma_S
    assert all(float(a[2]) == pytest.approx(2 * model.trained_beta) for a in rec.conv_args)
    assert torch.equal(E0, model.unit_noise())


def test_inference_beta(model):
    b = model.trained_beta
    assert b == pytest.approx(1.3, abs=0.2)  # perturbed around beta_init
    assert inference_beta(model, SDEConfig()) == pytest.approx(2 * b)
    assert inference_beta(model, SDEConfig(beta_scale=3.0)) == pytest.approx(3 * b)
    assert inference_beta(model, SDEConfig(beta_absolute=2.0)) == 2.0
    assert inference_beta(model, SDEConfig(beta_absolute=2.0, beta_scale=5.0)) == 2.0
    with Recorder(model) as rec:
        sample_sde(model, prompts(model), cfg(nfe=2, beta_absolute=0.7), generator=gen(0))
    assert {float(a[2]) for a in rec.conv_args} == {0.7}


def test_no_mask_in_output_even_when_mask_dominates(model):
    with Recorder(model, logit_bias={(None, MASK): 1e4}):
        out = sample_sde(model, prompts(model), cfg(), generator=gen(0))
        blk = sample_sde(model, prompts(model), cfg(block_length=4), generator=gen(0))
    assert not (out.ids == MASK).any() and not (blk.ids == MASK).any()
    logits = torch.zeros(2, 3, 64)
    logits[..., MASK] = 5.0
    logits[0, :, 7] = 1.0
    assert decode_argmax(logits, MASK)[0].tolist() == [7, 7, 7]
    assert logits[..., MASK].eq(5.0).all()  # decode_argmax does not modify its input


# -- determinism and randomness ------------------------------------------------------------------------------------------
def test_same_seed_same_tokens(model):
    pb = prompts(model)
    a = sample_sde(model, pb, cfg(), generator=gen(3))
    b = sample_sde(model, pb, cfg(), generator=gen(3))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.lengths, b.lengths)
    outs = {tuple(sample_sde(model, pb, cfg(), generator=gen(s)).ids.flatten().tolist()) for s in range(4)}
    assert len(outs) > 1  # the seed matters (eta = 0.1 at NFE 8 and a random init)


def _final_y(model, monkeypatch, c, generator):
    got = {}
    real = sde_mod.heun_solve

    def spy(denoise, y, grid, **kw):
        got["y0"] = y.clone()
        got["y"] = real(denoise, y, grid, **kw)
        return got["y"]

    monkeypatch.setattr(sde_mod, "heun_solve", spy)
    out = sample_sde(model, prompts(model), c, generator=generator)
    monkeypatch.setattr(sde_mod, "heun_solve", real)
    return got["y0"], got["y"], out


def test_eta_zero_is_deterministic_given_the_seed(model, monkeypatch):
    c = cfg(eta=0.0)
    y0a, ya, a = _final_y(model, monkeypatch, c, gen(5))
    y0b, yb, b = _final_y(model, monkeypatch, c, gen(5))  # a different generator object, same seed
    assert torch.equal(y0a, y0b) and torch.equal(ya, yb) and torch.equal(a.ids, b.ids)
    y0c, yc, _ = _final_y(model, monkeypatch, c, gen(6))  # only the seed changes: y0 (and so y) changes
    assert not torch.equal(y0a, y0c) and not torch.equal(ya, yc)


def test_eta_zero_trajectory_ignores_the_noise_stream(model):
    """With eta = 0 the Heun trajectory depends on y0 only: different generators for dW give identical results."""
    pb = prompts(model)
    denoise = Denoiser.for_model(model, model.context_embed(pb.ids), beta=2 * model.trained_beta, top_m=8,
                                 attention_mask=pb.full_attention_mask(8))
    y0 = F.normalize(torch.randn(3, 8, D, generator=gen(0)), dim=-1)
    grid = snr_schedule("sensitive", 4)
    with torch.no_grad():
        outs = [heun_solve(denoise, y0, grid, eta=0.0, predictor_noise=pn, rng=RowRNG(gen(s), 3))
                for s, pn in ((1, False), (2, False), (3, True))]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert denoise.forward_passes == 3 * 2 * 4  # three solves of 4 Heun steps, two evaluations each


def test_denoiser_is_the_algorithm_2_evaluation(model):
    """ê = top-M posterior mean over E of the backbone's logits on [context | converter(γy) | future] at the window."""
    pb = prompts(model)
    E, beta = model.unit_noise(), 1.7
    ctx, fut = model.context_embed(pb.ids), model.mask_embed(torch.full((3, 2), MASK))
    y = F.normalize(torch.randn(3, 4, D, generator=gen(0)), dim=-1)
    attn = torch.cat([pb.attention_mask, torch.ones(3, 6, dtype=torch.long)], 1)
    d = Denoiser.for_model(model, ctx, beta=beta, top_m=8, attention_mask=attn, future=fut)
    with torch.no_grad():
        e_hat, logits = d(y, 3.0)
        full = model.backbone(torch.cat([ctx, model.converter(3.0 * y, E, beta), fut], 1), attn)
    P = pb.length
    assert torch.equal(logits, full[:, P:P + 4])
    assert torch.equal(e_hat, model.posterior_mean(full[:, P:P + 4], 8, E))
    assert e_hat.shape == (3, 4, D) and d.forward_passes == 1
    nxt = d.with_context(ctx, future=None)  # a copy around another window shares the forward counter
    with torch.no_grad():
        assert nxt.logits(torch.cat([y, y[:, :2]], 1), 3.0).shape == (3, 6, 64)  # window = the 6 positions after ctx
    assert d.forward_passes == nxt.forward_passes == 2


def test_predictor_noise_switch(model, monkeypatch):
    """Default = the authors' predictor noise; predictor_noise=False (Algorithm 2 as printed) changes y unless eta = 0."""
    _, y_default, _ = _final_y(model, monkeypatch, cfg(eta=0.1), gen(1))
    _, y_plain, _ = _final_y(model, monkeypatch, cfg(eta=0.1, predictor_noise=False), gen(1))
    _, y_pred, _ = _final_y(model, monkeypatch, cfg(eta=0.1, predictor_noise=True), gen(1))
    assert torch.equal(y_default, y_pred)
    assert not torch.allclose(y_plain, y_pred, atol=1e-4)
    _, y0_plain, a = _final_y(model, monkeypatch, cfg(eta=0.0, predictor_noise=False), gen(1))
    _, y0_pred, b = _final_y(model, monkeypatch, cfg(eta=0.0, predictor_noise=True), gen(1))
    assert torch.equal(y0_plain, y0_pred) and torch.equal(a.ids, b.ids)


# -- heun_solve against hand-written steps ----------------------------------------------------------------------------------
def _fixed_denoiser(c: torch.Tensor, calls: list):
    def denoise(y, gamma):
        calls.append((y.clone(), gamma))
        return c.expand_as(y).clone(), torch.zeros(*y.shape[:-1], 5)
    return denoise


def test_heun_closed_form_with_constant_denoiser():
    """e_hat = c: per step a = y - c scales by 1 - D/(2 g0) - D (1 - D/g0) / (2 g1) (Heun on dy/dg = (c - y)/g)."""
    c = torch.tensor([0.6, -0.8, 0.0], dtype=torch.float64)
    y0 = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)
    grid = torch.tensor([0.5, 1.0, 3.0, 10.0], dtype=torch.float64)
    calls, steps = [], []
    y = heun_solve(_fixed_denoiser(c, calls), y0, grid, eta=0.0, predictor_noise=False, rng=RowRNG(gen(0), 1),
                   on_step=lambda s, g, logits: steps.append((s, g, logits.shape)))
    factor = 1.0
    for g0, g1 in zip(grid[:-1].tolist(), grid[1:].tolist()):
        d = g1 - g0
        factor *= 1 - d / (2 * g0) - d * (1 - d / g0) / (2 * g1)
    assert torch.allclose(y, c + (y0 - c) * factor, atol=1e-12)
    assert [g for _, g in calls] == [0.5, 1.0, 1.0, 3.0, 3.0, 10.0]  # predictor at g_s, corrector at g_{s+1}
    assert steps == [(0, 1.0, (1, 2, 5)), (1, 3.0, (1, 2, 5)), (2, 10.0, (1, 2, 5))]


@pytest.mark.parametrize("predictor_noise", [False, True])
def test_heun_stochastic_step_matches_hand_computation(predictor_noise):
    c = torch.tensor([0.2, 0.4, -0.4, 0.8])
    y0 = F.normalize(torch.randn(2, 3, 4, generator=gen(9)), dim=-1)
    grid = torch.tensor([0.01, 7.0, 20.0], dtype=torch.float64)
    eta = 0.3
    calls = []
    y = heun_solve(_fixed_denoiser(c, calls), y0, grid, eta=eta, predictor_noise=predictor_noise,
                   rng=RowRNG(gen(4), 2))
    # the same draws by hand: one dW = sqrt(|D|) xi per step, from the same generator, reused in the corrector
    g = gen(4)
    ref = y0.clone()
    for s in range(2):
        g0, g1 = float(grid[s]), float(grid[s + 1])
        d = g1 - g0
        dW = torch.randn(ref.shape, generator=g) * d ** 0.5
        v0 = (c - ref) / g0
        y_e = ref + d * v0 + ((eta / g0) * dW if predictor_noise else 0)
        assert torch.allclose(calls[2 * s + 1][0], y_e, atol=1e-5)
        v1 = (c - y_e) / g1
        ref = ref + 0.5 * d * (v0 + v1) + 0.5 * (eta / g0 + eta / g1) * dW
    assert torch.allclose(y, ref, atol=1e-4)


def test_heun_predictor_noise_irrelevant_at_eta_zero():
    c = torch.tensor([1.0, 0.0])
    y0 = torch.tensor([[[0.0, 1.0]]])
    grid = torch.tensor([0.1, 1.0, 5.0], dtype=torch.float64)
    a = heun_solve(_fixed_denoiser(c, []), y0, grid, eta=0.0, predictor_noise=False, rng=RowRNG(gen(0), 1))
    b = heun_solve(_fixed_denoiser(c, []), y0, grid, eta=0.0, predictor_noise=True, rng=RowRNG(gen(1), 1))
    assert torch.equal(a, b)


# -- batching ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_length", [0, 4])
def test_batch_of_padded_prompts_equals_one_by_one(model, block_length):
    """Per-row generators make each row's draws independent of the batch (compare token ids; fp32 padding/RoPE
    differences are ~1e-6 and do not flip an argmax for these seeds). Run with Algorithm 2 as printed: the random
    std-0.3 test model is chaotic along the SDE path (at eta = 0, and with predictor noise, a 1e-6 RoPE difference
    from left padding grows to ~0.1 in y over 4 steps and flips tokens), while the printed sampler's large first-step
    noise happens to keep these seeds stable. Where the noise goes does not change how it is drawn."""
    c = cfg(block_length=block_length, predictor_noise=False)
    seeds = [11, 12, 13]
    batch = sample_sde(model, prompts(model), c, generator=[gen(s) for s in seeds])
    for i, (row, s) in enumerate(zip(PROMPTS, seeds)):
        one = sample_sde(model, prompts(model, [row]), c, generator=[gen(s)])
        assert torch.equal(batch.ids[i], one.ids[0]), i
        single = sample_sde(model, prompts(model, [row]), c, generator=gen(s))  # a plain generator, batch of 1
        assert torch.equal(single.ids, one.ids)
    with pytest.raises(ValueError, match="2 generators for a batch of 3"):
        sample_sde(model, prompts(model), c, generator=[gen(0), gen(1)])


# -- truncation ----------------------------------------------------------------------------------------------------------------
def test_stop_lengths_on_known_tensors():
    ids = torch.tensor([[1, 2, EOS, 3, EOS], [1, 2, 3, 4, 5], [EOT, 1, 1, 1, 1], [1, EOT, EOS, 1, 1]])
    assert stop_lengths(ids, (EOS, EOT)).tolist() == [2, 5, 0, 1]
    assert stop_lengths(ids, (EOS,)).tolist() == [2, 5, 5, 2]
    assert stop_lengths(ids, ()).tolist() == [5, 5, 5, 5]


@pytest.mark.parametrize("block_length", [0, 4])
def test_sampler_truncates_at_first_stop(model, block_length):
    pb = prompts(model)
    P = pb.length
    bias = {(P + 5, EOS): 1e4, (P + 3, EOT): 1e4}  # forces EOT at response position 3, EOS at 5
    with Recorder(model, logit_bias=bias):
        out = sample_sde(model, pb, cfg(block_length=block_length), generator=gen(0))
        keep = sample_sde(model, pb, cfg(block_length=block_length, truncate_at_eos=False), generator=gen(0))
    assert (out.ids[:, 3] == EOT).all() and (out.ids[:, 5] == EOS).all()
    assert out.lengths.tolist() == stop_lengths(out.ids, model.special.stop_ids()).tolist()
    assert (out.lengths <= 3).all()
    assert all(len(r) == n for r, n in zip(out.responses(), out.lengths.tolist()))
    assert keep.lengths.tolist() == [8, 8, 8] and torch.equal(keep.ids, out.ids)


# -- configuration errors ---------------------------------------------------------------------------------------------------------
def test_odd_nfe_is_a_config_error():
    with pytest.raises(ConfigError, match="even"):
        SDEConfig(nfe=5)


@pytest.mark.parametrize("block_length", [0, 4])
def test_prompt_plus_response_too_long(block_length):
    m = tiny_dsl(backbone_kw={"max_sequence_length": 16})
    pb = PromptBatch.from_lists([[1, 2, 3, 4, 5, 6]], m.special.pad_id)
    with pytest.raises(ValueError, match=r"prompt length 6 \+ gen_length 12 = 18 tokens exceeds the model's context of 16"):
        sample_sde(m, pb, cfg(gen_length=12, block_length=block_length), generator=gen(0))
    assert sample_sde(m, pb, cfg(gen_length=8), generator=gen(0)).ids.shape == (1, 8)  # 14 tokens fit


# -- trajectory and callback ---------------------------------------------------------------------------------------------------
def test_trajectory_and_callback(model):
    c = cfg(nfe=8)
    infos = []
    out = sample_sde(model, prompts(model), c, generator=gen(0), callback=infos.append, return_trajectory=True)
    decode = infos.pop()  # the decode call after the last solver step: the final tokens, all committed
    assert decode.decode and torch.equal(decode.tokens.cpu(), out.ids) and bool(decode.committed.all())
    assert not any(i.decode or i.committed.any() for i in infos) and decode.window == (0, 8)
    S = c.steps
    grid = snr_schedule("sensitive", S)
    assert len(out.trajectory) == S and all(t.shape == (3, 8) for t in out.trajectory)
    assert all(not (t == MASK).any() for t in out.trajectory)
    assert [i.step for i in infos] == list(range(S)) and {i.total_steps for i in infos} == {S}
    assert [i.gamma for i in infos] == grid[1:].tolist()
    assert all(a < b for a, b in zip([i.gamma for i in infos], [i.gamma for i in infos][1:]))
    assert all(torch.equal(i.tokens.cpu(), t) for i, t in zip(infos, out.trajectory))
    # a callback does not change the result
    assert torch.equal(sample_sde(model, prompts(model), c, generator=gen(0)).ids, out.ids)


def test_callback_with_paper_exact_schedule_ends_at_gamma_max(model):
    infos = []
    sample_sde(model, prompts(model), cfg(nfe=4, schedule="paper-exact"), generator=gen(0), callback=infos.append)
    assert [i.gamma for i in infos if not i.decode] == [7.0, 100.0]


# -- block SDE -------------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gen_length, block, nfe", [(8, 4, 4), (12, 4, 2), (8, 8, 8), (8, 2, 4)])
def test_block_sde_forward_count(model, gen_length, block, nfe):
    c = cfg(gen_length=gen_length, block_length=block, nfe=nfe)
    with Recorder(model) as rec:
        out = sample_block_sde(model, prompts(model), c, generator=gen(0))
    S, n_blocks = nfe // 2, gen_length // block
    assert out.ids.shape == (3, gen_length)
    assert out.forward_passes == n_blocks * (2 * S + 1) == len(rec.inputs)
    assert out.nfe == n_blocks * 2 * S
    assert not (out.ids == MASK).any()


def test_sample_sde_dispatches_to_block_and_one_block_equals_plain(model):
    pb = prompts(model)
    plain = sample_sde(model, pb, cfg(), generator=gen(4))
    one_block = sample_sde(model, pb, cfg(block_length=8), generator=gen(4))
    assert torch.equal(plain.ids, one_block.ids)
    assert plain.forward_passes == one_block.forward_passes == 9


def test_block_sde_context_committed_and_future_mask(model):
    pb = prompts(model)
    P, blk = pb.length, 4
    c = cfg(gen_length=8, block_length=blk, nfe=4)
    S = c.steps
    with Recorder(model) as rec:
        out = sample_block_sde(model, pb, c, generator=gen(2))
    ctx = model.context_embed(pb.ids)
    # future positions: the converter's trained mask slot W[:, V] (+ c), not the [MASK] token's column
    mask_h = model.mask_embed(torch.full((3, blk), MASK))
    assert torch.allclose(mask_h[0, 0], model.converter.backbone_embedding.weight[:, -1]
                          + model.converter.backbone_embedding.bias)
    committed = model.context_embed(out.ids[:, :blk])
    per_block = 2 * S + 1
    for j, x in enumerate(rec.inputs):
        assert torch.equal(x[:, :P], ctx)
        if j < per_block:  # block 0 running: the second block is future [MASK]
            assert torch.equal(x[:, P + blk:], mask_h)
        else:  # block 1 running: block 0 is committed as clean tokens
            assert torch.equal(x[:, P: P + blk], committed)


def test_block_sde_trajectory_and_callback(model):
    c = cfg(gen_length=8, block_length=4, nfe=4)
    infos = []
    out = sample_block_sde(model, prompts(model), c, generator=gen(0), callback=infos.append, return_trajectory=True)
    decodes = [i for i in infos if i.decode]
    infos = [i for i in infos if not i.decode]
    assert [d.window for d in decodes] == [(0, 4), (4, 8)] and torch.equal(decodes[-1].tokens.cpu(), out.ids)
    assert [d.newly_committed[0].tolist() for d in decodes] == [[True] * 4 + [False] * 4, [False] * 4 + [True] * 4]
    S = c.steps
    grid = snr_schedule("sensitive", S)[1:].tolist()
    assert len(out.trajectory) == 2 * S and len(infos) == 2 * S
    assert [i.step for i in infos] == list(range(2 * S)) and {i.total_steps for i in infos} == {2 * S}
    assert [i.extra["block"] for i in infos] == [0] * S + [1] * S
    assert [i.gamma for i in infos] == grid + grid
    assert all((t[:, 4:] == MASK).all() for t in out.trajectory[:S])  # future block still [MASK] in snapshots
    assert all(torch.equal(t[:, :4], out.ids[:, :4]) for t in out.trajectory[S:])  # committed block fixed


def test_block_sde_same_seed_same_tokens(model):
    c = cfg(gen_length=8, block_length=4)
    a = sample_block_sde(model, prompts(model), c, generator=gen(8))
    b = sample_block_sde(model, prompts(model), c, generator=gen(8))
    assert torch.equal(a.ids, b.ids)
    other = sample_block_sde(model, prompts(model), c, generator=gen(9))
    assert not torch.equal(a.ids, other.ids)  # the generator is used


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_generators_drive_a_cuda_model_identically(model):
    """Prompt i's generator lives on the CPU (as `dsl-llada generate` makes them); the run works and, up to fp
    differences between devices, gives the CPU run's tokens."""
    c = cfg(gen_length=8, nfe=4)
    cpu = sample_sde(model, prompts(model), c, generator=[gen(i) for i in range(3)])
    cuda = sample_sde(model.to("cuda"), prompts(model), c, generator=[gen(i) for i in range(3)])
    model.to("cpu")
    assert cuda.forward_passes == cpu.forward_passes == 5
    assert (cpu.ids == cuda.ids).float().mean() >= 0.9
