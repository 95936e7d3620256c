"""Training objectives (DSL, MDM-CPT, XDLM) on a tiny random LLaDA, CPU, seconds.

Tiny config: V = 64, mask 63, eos 62 (= pad); noise dim 16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dsl_llada.train.objectives as objectives
from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import ConfigError, ConverterConfig, DSLConfig, SNRConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.train.objectives import (KEEP, MASKED, OBJECTIVES, RANDOM, ObjectiveConfig, ObjectiveOutput,
                                        check_finite, get_objective, mdm_corrupt, random_token_table, xdlm_corrupt,
                                        xdm_kl)

V, MASK, EOS = 64, 63, 62


def make_backbone(seed: int = 0) -> LLaDABackbone:
    bb = LLaDABackbone(tiny_llada_config(vocab_size=V, d_model=32, n_layers=2))
    bb.init_weights(torch.Generator().manual_seed(seed))
    return bb


def make_model(seed: int = 0, trainable_noise: bool = True) -> DSLModel:
    cc = ConverterConfig(noise_dim=16, trainable_noise_embed=trainable_noise)
    return DSLModel.convert(make_backbone(seed), DSLConfig(converter=cc))


def toy_ids(B: int = 4, L: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 60, (B, L), generator=torch.Generator().manual_seed(seed))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def model() -> DSLModel:
    return make_model()


VARIANTS = [("dsl", {}), ("mdm", {}), ("xdlm", {}), ("xdlm", {"xdlm_loss": "ce"})]


# -- common contract ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,opts", VARIANTS)
def test_finite_scalar_loss_and_grads(name, opts):
    m = make_model()
    out = get_objective(name, **opts)(m, {"input_ids": toy_ids()}, gen(3))
    assert isinstance(out, ObjectiveOutput)
    assert out.loss.dim() == 0 and out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert all(isinstance(v, float) for v in out.metrics.values())
    assert out.n_tokens > 0
    out.loss.backward()
    t = m.backbone.model.transformer
    for p in (t.ff_out.weight, t.blocks[0].q_proj.weight, t.blocks[-1].ff_out.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    if name == "dsl":
        c = m.converter
        for p in (c.beta, c.logit_bias, c.backbone_embedding.weight, m.noise_embed.weight):
            assert p.grad is not None and p.grad.abs().sum() > 0, p.shape
    else:  # the discrete path goes through wte, never the converter
        assert t.wte.weight.grad is not None and m.converter.beta.grad is None


def test_frozen_noise_embedding_gets_no_grad():
    m = make_model(trainable_noise=False)
    out = get_objective("dsl")(m, {"input_ids": toy_ids()}, gen(3))
    out.loss.backward()
    assert m.noise_embed.weight.grad is None
    assert m.converter.beta.grad is not None


@pytest.mark.parametrize("name,opts", VARIANTS)
def test_deterministic_given_generator(model, name, opts):
    obj = get_objective(name, **opts)
    batch = {"input_ids": toy_ids()}
    a, b, c = obj(model, batch, gen(5)), obj(model, batch, gen(5)), obj(model, batch, gen(6))
    assert torch.equal(a.loss, b.loss) and a.metrics == b.metrics and a.n_tokens == b.n_tokens
    assert not torch.equal(a.loss, c.loss)


def test_generator_none_uses_default(model):
    torch.manual_seed(0)
    a = get_objective("dsl")(model, {"input_ids": toy_ids()}, None)
    torch.manual_seed(0)
    b = get_objective("dsl")(model, {"input_ids": toy_ids()}, None)
    assert torch.equal(a.loss, b.loss)


def test_bad_objective_name_and_options():
    with pytest.raises(ValueError) as e:
        get_objective("ddpm")
    assert "'ddpm'" in str(e.value) and all(n in str(e.value) for n in OBJECTIVES)
    with pytest.raises(ConfigError, match="xdlm_k2"):
        get_objective("xdlm", xdlm_k2=0.1)
    with pytest.raises(ConfigError, match="xdlm_loss"):
        get_objective("xdlm", xdlm_loss="kl")
    with pytest.raises(ConfigError, match="k1"):
        get_objective("xdlm", xdlm_k1=0.0)
    get_objective("xdlm", xdlm_k1=0.0, xdlm_loss="ce")
    assert OBJECTIVES == ("dsl", "mdm", "xdlm")


def test_config_round_trip_and_options():
    cfg = ObjectiveConfig(snr=SNRConfig(distribution="lognormal"), mdm_eps=0.01, xdlm_loss="ce", mask_prompt=False)
    assert ObjectiveConfig.from_dict(cfg.to_dict()) == cfg
    obj = get_objective("dsl", snr={"distribution": "roar"}, mask_prompt=False)
    assert obj.config.snr == SNRConfig(distribution="roar") and obj.config.mask_prompt is False
    obj2 = get_objective("mdm", config=cfg.to_dict(), mdm_eps=0.2)
    assert obj2.config.mdm_eps == 0.2 and obj2.config.xdlm_loss == "ce"


def test_check_finite():
    check_finite(torch.tensor(1.5), 3)
    with pytest.raises(FloatingPointError) as e:
        check_finite(torch.tensor(float("nan")), 17, {"ce": 1.25, "beta": 0.5})
    msg = str(e.value)
    assert "step 17" in msg and "ce=1.25" in msg and "beta=0.5" in msg
    out = ObjectiveOutput(loss=torch.tensor(float("inf")), metrics={"acc": 0.5}, n_tokens=3)
    with pytest.raises(FloatingPointError, match=r"step 4.*acc=0.5"):
        check_finite(out, 4)


# -- DSL ---------------------------------------------------------------------------------------------------
def _record(monkeypatch, name):
    seen = []
    fn = getattr(objectives, name)

    def wrapper(*a, **k):
        r = fn(*a, **k)
        seen.append((a, k, r))
        return r

    monkeypatch.setattr(objectives, name, wrapper)
    return seen


def test_dsl_gamma_per_sequence_constant_along_length(model, monkeypatch):
    snrs = _record(monkeypatch, "sample_training_snr")
    states = _record(monkeypatch, "noisy_states")
    obj = get_objective("dsl", snr=SNRConfig(distribution="lognormal"))
    obj(model, {"input_ids": toy_ids(B=6, L=12)}, gen(0))
    gamma = snrs[0][2]
    assert gamma.shape == (6, 12)
    assert torch.equal(gamma, gamma[:, :1].expand_as(gamma)) and gamma[:, 0].unique().numel() == 6
    assert torch.equal(states[0][0][2], gamma)  # the same γ builds the states


def test_dsl_loss_equals_manual_computation(model):
    ids = toy_ids()
    out = get_objective("dsl")(model, {"input_ids": ids}, gen(9))
    g = gen(9)
    from dsl_llada.snr import sample_training_snr
    from dsl_llada.core.converter import noisy_states
    gamma = sample_training_snr(SNRConfig(), *ids.shape, g)
    z = noisy_states(model.unit_noise(), ids, gamma, g)
    logits = model.logits_from_states(ids, z)
    ce = F.cross_entropy(logits.float().reshape(-1, V), ids.reshape(-1), reduction="sum") / ids.numel()
    assert torch.allclose(out.loss, ce, rtol=1e-6, atol=1e-6)
    assert out.n_tokens == ids.numel()
    assert out.metrics["gamma_mean"] == pytest.approx(float(gamma.mean()), rel=1e-6)


def test_dsl_prompt_masking(monkeypatch):
    m = make_model()
    ids = toy_ids(B=3, L=10)
    pl = torch.tensor([0, 3, 6])
    prompt = torch.arange(10)[None] < pl[:, None]
    calls = []
    orig = m.logits_from_states

    def spy(ids_, z, state_mask=None, attention_mask=None, **kw):
        calls.append(state_mask)
        return orig(ids_, z, state_mask, attention_mask, **kw)

    monkeypatch.setattr(m, "logits_from_states", spy)
    inputs = []
    hook = m.backbone.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].detach()))
    out = get_objective("dsl")(m, {"input_ids": ids, "prompt_length": pl}, gen(2))
    hook.remove()
    assert torch.equal(calls[0], ~prompt)
    # prompt positions are fed their clean context embeddings
    clean = m.context_embed(ids).detach()
    assert torch.allclose(inputs[0][prompt], clean[prompt])
    assert not torch.allclose(inputs[0][~prompt], clean[~prompt])
    assert out.n_tokens == int((~prompt).sum()) == out.metrics["n_eligible"]
    # loss = mean CE over the response positions only (recomputed from the same draws)
    g = gen(2)
    from dsl_llada.snr import sample_training_snr
    from dsl_llada.core.converter import noisy_states
    gamma = sample_training_snr(SNRConfig(), 3, 10, g)
    z = noisy_states(m.unit_noise(), ids, gamma, g)
    logits = orig(ids, z, ~prompt)
    ce = F.cross_entropy(logits[~prompt].float(), ids[~prompt], reduction="mean")
    assert torch.allclose(out.loss, ce, rtol=1e-6, atol=1e-6)
    # mask_prompt=False: every position is a target and gets a noisy state
    calls.clear()
    out2 = get_objective("dsl", mask_prompt=False)(m, {"input_ids": ids, "prompt_length": pl}, gen(2))
    assert calls[0] is None and out2.n_tokens == ids.numel()


def test_dsl_attention_mask_excludes_padding(model):
    ids = toy_ids(B=2, L=8)
    am = torch.ones(2, 8, dtype=torch.long)
    am[1, 5:] = 0
    out = get_objective("dsl")(model, {"input_ids": ids, "attention_mask": am}, gen(0))
    assert out.n_tokens == 13 and torch.isfinite(out.loss)


def test_dsl_bucket_metrics(model):
    snr = SNRConfig(distribution="lognormal", lognormal_per_token=True, lognormal_mu=1.8, lognormal_sigma=1.5,
                    lognormal_clip=100.0)
    out = get_objective("dsl", snr=snr)(model, {"input_ids": toy_ids(B=8, L=32)}, gen(0))
    names = ["snr[0,2)", "snr[2,5)", "snr[5,10)", "snr[10,20)", "snr[20,100]"]
    for n in names:
        for k in ("n", "ce", "acc"):
            assert f"{n}/{k}" in out.metrics, (n, k)
    assert sum(out.metrics[f"{n}/n"] for n in names) == out.n_tokens
    for k in ("ce", "acc", "gamma_mean", "beta", "mask_bias", "loss"):
        assert k in out.metrics
    assert out.metrics["beta"] == pytest.approx(1.0)
    assert out.metrics["mask_bias"] == pytest.approx(math.log(V))
    assert out.metrics["ce"] == pytest.approx(out.metrics["loss"], rel=1e-6)


def test_dsl_rejects_bare_backbone():
    with pytest.raises(TypeError, match="DSLModel"):
        get_objective("dsl")(make_backbone(), {"input_ids": toy_ids()}, gen(0))


# -- MDM-CPT -----------------------------------------------------------------------------------------------
def test_mdm_corrupt_fraction_matches_p():
    ids = torch.zeros(4000, 64, dtype=torch.long)
    noisy, masked, p = mdm_corrupt(ids, MASK, 1e-3, gen(0))
    assert p.shape == (4000,) and float(p.min()) >= 1e-3 and float(p.max()) < 1
    assert torch.equal(noisy == MASK, masked)
    frac = masked.float().mean(1)
    # per sequence: masked count ~ Binomial(64, p); pooled over 4000 sequences the ratio is within 1%
    assert float(frac.sum() / p.sum()) == pytest.approx(1.0, abs=0.01)
    assert float(((frac - p) ** 2).mean()) < 0.01  # per-sequence agreement (Binomial variance <= 1/256)
    assert float(masked.float().mean()) == pytest.approx(0.5, abs=0.02)


def test_mdm_loss_hand_computation(model):
    ids = toy_ids(B=3, L=12)
    out = get_objective("mdm")(model, {"input_ids": ids}, gen(4))
    noisy, masked, p = mdm_corrupt(ids, MASK, 1e-3, gen(4))
    assert out.n_tokens == int(masked.sum()) > 0
    with torch.no_grad():
        logits = model.logits_from_ids(noisy).double()
    total = 0.0
    for b in range(3):
        for i in range(12):
            if masked[b, i]:
                total += -float(torch.log_softmax(logits[b, i], -1)[ids[b, i]]) / float(p[b])
    assert float(out.loss.detach()) == pytest.approx(total / ids.numel(), rel=1e-5)


def test_mdm_uses_model_mask_id_and_works_on_bare_backbone():
    bb = make_backbone()
    seen = []
    hook = bb.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    out = get_objective("mdm")(bb, {"input_ids": toy_ids()}, gen(1))
    hook.remove()
    assert torch.isfinite(out.loss)
    noisy, masked, _ = mdm_corrupt(toy_ids(), MASK, 1e-3, gen(1))
    assert torch.equal(seen[0], bb.embed(noisy))  # the embedded corrupted ids used the model's MASK id


def test_mdm_prompt_never_masked():
    ids = toy_ids(B=64, L=16)
    pl = torch.full((64,), 6)
    eligible = torch.arange(16)[None].expand(64, 16) >= 6
    noisy, masked, _ = mdm_corrupt(ids, MASK, 1e-3, gen(0), eligible)
    assert not bool(masked[:, :6].any()) and torch.equal(noisy[:, :6], ids[:, :6])
    out = get_objective("mdm")(make_model(), {"input_ids": ids, "prompt_length": pl}, gen(0))
    assert out.metrics["n_eligible"] == 64 * 10


# -- XDLM --------------------------------------------------------------------------------------------------
def test_xdlm_corruption_fractions():
    B, L, k1 = 6000, 32, 0.1
    ids = torch.randint(0, 60, (B, L), generator=gen(0))
    table = random_token_table(V, make_backbone().special, True)
    noisy, kind, alpha = xdlm_corrupt(ids, MASK, table, 1e-3, k1, gen(1))
    assert alpha.dtype == torch.float64 and float(alpha.min()) > 0 and float(alpha.max()) <= 1 - 1e-3 + 1e-12
    a = alpha[:, None]
    n = B * L
    keep, rand, msk = (kind == KEEP).double(), (kind == RANDOM).double(), (kind == MASKED).double()
    # pooled over sequences: observed vs expected counts given each sequence's α
    assert float(keep.sum() / (a * L).sum()) == pytest.approx(1, abs=0.01)
    assert float(rand.sum() / (k1 * (1 - a) * L).sum()) == pytest.approx(1, abs=0.03)
    assert float(msk.sum() / ((1 - k1) * (1 - a) * L).sum()) == pytest.approx(1, abs=0.01)
    assert float(keep.sum() + rand.sum() + msk.sum()) == n
    assert torch.equal(noisy[kind == KEEP], ids[kind == KEEP])
    assert bool((noisy[kind == MASKED] == MASK).all())
    r = noisy[kind == RANDOM]
    assert r.numel() > 1000
    specials = torch.tensor([MASK, EOS])
    assert not bool(torch.isin(r, specials).any())  # specials excluded by default
    # roughly uniform over the 62 allowed ids
    counts = torch.bincount(r, minlength=V)[:62].double()
    assert float(counts.min()) > 0.5 * float(counts.mean())


def test_xdlm_random_ids_can_hit_specials_when_not_excluded():
    table = random_token_table(V, make_backbone().special, False)
    assert table.numel() == V
    ids = torch.zeros(4000, 32, dtype=torch.long)
    noisy, kind, _ = xdlm_corrupt(ids, MASK, table, 1e-3, 0.5, gen(2))
    r = noisy[kind == RANDOM]
    assert bool((r == MASK).any()) and bool((r == EOS).any())


def test_random_table_excludes_all_named_specials():
    from dsl_llada.core.backbones.base import SpecialTokens
    sp = SpecialTokens(mask=10, eos=11, eot=12, pad=13, bos=14)
    t = random_token_table(20, sp, True)
    assert sorted(t.tolist()) == [i for i in range(20) if i not in (10, 11, 12, 13, 14)]


def test_xdlm_prompt_never_corrupted(model):
    ids = toy_ids(B=16, L=12)
    pl = torch.full((16,), 5)
    seen = []
    hook = model.backbone.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    out = get_objective("xdlm")(model, {"input_ids": ids, "prompt_length": pl}, gen(0))
    hook.remove()
    assert torch.equal(seen[0][:, :5], model.backbone.embed(ids[:, :5]))
    assert out.metrics["n_eligible"] == 16 * 7 and out.n_tokens == 16 * 7


def xdm_reference(p: np.ndarray, x: int, z: int, a: float, k1: float, mask_id: int) -> float:
    """XDM's closed-form KL (the XDLM control, paper Appendix "Experimental Details") written out directly in float64
    numpy, independently of `xdm_kl`."""
    v = p.shape[0]
    b = 1 - a
    zx, zm = float(z == x), float(z == mask_id)
    r = k1 + v * (1 - k1) * zm
    Fx = a * v * p[x] + b * k1
    Fz = a * v * p[z] + b * r
    Hx = a * v + b * k1
    Hz = a * v * zx + b * r
    rho = k1 / Hx if z == x else 1 / b
    partx = -np.mean(np.log(a * v * p + b * k1)) + np.log(b * k1) * (v - 1) / v + np.log(a * v + b * k1) / v
    return rho * (v * (zx - p[z]) / Fz - (np.log(Hz) - np.log(Fz)) / a + (np.log(Hx) - np.log(Fx))
                  + k1 * b * partx / a)


def test_xdm_kl_matches_written_formula():
    k1 = 0.1
    g = gen(0)
    logits = torch.randn(6, V, generator=g) * 2
    x = torch.tensor([3, 3, 7, 7, 20, 20])
    z = torch.tensor([3, MASK, 9, MASK, 20, 41])  # kept / masked / random replacement
    alpha = torch.tensor([0.7, 0.7, 0.3, 0.05, 0.95, 0.5], dtype=torch.float64)
    kl = xdm_kl(logits, x, z, alpha, MASK, k1)
    # p exactly as the function sees it: fp32 softmax with the MASK logit at the fp32 minimum
    lg = logits.clone()
    lg[:, MASK] = torch.finfo(torch.float32).min
    p = torch.softmax(lg, -1).double().numpy()
    for i in range(6):
        ref = xdm_reference(p[i], int(x[i]), int(z[i]), float(alpha[i]), k1, MASK)
        assert float(kl[i]) == pytest.approx(ref, rel=1e-5, abs=1e-6), i


def test_xdm_kl_zero_at_perfect_prediction_and_nonnegative():
    """Verified: KL = 0 when p = onehot(x) for kept, random and masked z; on random logits and α the values are
    >= 0 up to fp32 softmax rounding amplified by ρ = 1/β (|error| <= ~1e-3 at β = 1e-3)."""
    k1 = 0.1
    g = gen(1)
    N = 600
    x = torch.randint(0, 60, (N,), generator=g)
    kinds = torch.arange(N) % 3
    rnd = torch.randint(0, 60, (N,), generator=g)
    z = torch.where(kinds == 0, x, torch.where(kinds == 1, torch.full_like(x, MASK), rnd))
    alpha = torch.tensor([1e-6, 1e-3, 0.1, 0.5, 0.9, 0.999], dtype=torch.float64).repeat(N // 6)
    onehot = F.one_hot(x, V).float() * 60.0
    perfect = xdm_kl(onehot, x, z, alpha, MASK, k1)
    assert float(perfect.abs().max()) < 1e-3
    logits = torch.randn(N, V, generator=g) * 3
    kl = xdm_kl(logits, x, z, alpha, MASK, k1)
    assert bool(torch.isfinite(kl).all()) and float(kl.min()) > -1e-3
    assert float(kl.mean()) > 0.1


def test_xdm_kl_no_nan_at_extreme_times():
    """t = 0 (α = 1 − ε) and t = the largest fp32 draw below 1 (α ≈ 6e-8), values and gradients finite."""
    eps, k1 = 1e-3, 0.1
    t = torch.tensor([0.0, 1 - 2 ** -24], dtype=torch.float32).double()
    a = 1 - ((1 - eps) * t + eps)
    assert float(a[1]) > 0
    alpha = a.repeat_interleave(3)
    x = torch.tensor([5] * 6)
    z = torch.tensor([5, MASK, 9] * 2)
    for scale in (0.0, 1.0, 50.0):
        logits = (torch.randn(6, V, generator=gen(2)) * scale).requires_grad_(True)
        kl = xdm_kl(logits, x, z, alpha, MASK, k1)
        kl.sum().backward()
        assert bool(torch.isfinite(kl).all()) and bool(torch.isfinite(logits.grad).all()), scale


def test_xdlm_loss_finite_over_many_times(model):
    obj = get_objective("xdlm")
    for s in range(10):
        out = obj(model, {"input_ids": toy_ids(B=8, L=8, seed=s)}, gen(s))
        assert torch.isfinite(out.loss) and float(out.loss.detach()) > -1e-3
        fr = out.metrics["keep_frac"] + out.metrics["random_frac"] + out.metrics["mask_frac"]
        assert fr == pytest.approx(1.0)


def test_xdlm_loss_is_mean_of_xdm_kl(model):
    ids = toy_ids(B=3, L=10)
    sp = model.special
    out = get_objective("xdlm")(model, {"input_ids": ids}, gen(7))
    table = random_token_table(V, sp, True)
    noisy, kind, alpha = xdlm_corrupt(ids, MASK, table, 1e-3, 0.1, gen(7))
    logits = model.logits_from_ids(noisy)
    kl = xdm_kl(logits.reshape(-1, V), ids.reshape(-1), noisy.reshape(-1),
                alpha[:, None].expand(3, 10).reshape(-1), MASK, 0.1)
    assert float(out.loss.detach()) == pytest.approx(float(kl.detach().sum()) / 30, rel=1e-5)


def test_xdlm_ce_variant_hand_computation(model):
    ids = toy_ids(B=3, L=10)
    out = get_objective("xdlm", xdlm_loss="ce")(model, {"input_ids": ids}, gen(8))
    table = random_token_table(V, model.special, True)
    noisy, kind, alpha = xdlm_corrupt(ids, MASK, table, 1e-3, 0.1, gen(8))
    with torch.no_grad():
        logits = model.logits_from_ids(noisy).double()
    total = 0.0
    for b in range(3):
        for i in range(10):
            if kind[b, i] != KEEP:
                total += -float(torch.log_softmax(logits[b, i], -1)[ids[b, i]]) / (1 - float(alpha[b]))
    assert out.n_tokens == int((kind != KEEP).sum())
    assert float(out.loss.detach()) == pytest.approx(total / 30, rel=1e-5)
