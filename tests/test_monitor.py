"""Training-time monitoring on a tiny random LLaDA (V = 64, noise dim 16), CPU, seconds."""

from __future__ import annotations

import math

import pytest
import torch

from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.train.monitor import (clean_eval, converter_stats, default_gamma_max, effective_rank, fixed_snr_eval,
                                     infill_eval, mean_abs_cos, monitor_all, nll_bound_curve, nll_upper_bound,
                                     noise_embedding_health)
from dsl_llada.train.objectives import get_objective

V = 64


def make_model() -> DSLModel:
    bb = LLaDABackbone(tiny_llada_config(vocab_size=V, d_model=32, n_layers=2))
    bb.init_weights(torch.Generator().manual_seed(0))
    return DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=16)))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def toy_batch() -> dict[str, torch.Tensor]:
    """A repetitive toy batch: each row an arithmetic progression mod 60 (no special ids)."""
    ids = (torch.arange(24)[None, :] * 7 + torch.arange(4)[:, None] * 3) % 60
    return {"input_ids": ids}


@pytest.fixture(scope="module")
def fresh() -> DSLModel:
    return make_model()


@pytest.fixture(scope="module")
def trained() -> DSLModel:
    """15 Adam steps of the DSL objective on the toy batch (deterministic)."""
    torch.manual_seed(0)
    m = make_model()
    obj = get_objective("dsl")
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    g = gen(1)
    for _ in range(15):
        out = obj(m, toy_batch(), g)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return m


def test_fixed_snr_keys_and_determinism(fresh):
    out = fixed_snr_eval(fresh, [toy_batch()], generator=gen(0))
    assert set(out) == {f"snr={g}/{k}" for g in (1, 5, 10, 20, 50) for k in ("ce", "acc")}
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())
    assert all(0 <= out[f"snr={g}/acc"] <= 1 for g in (1, 5, 10, 20, 50))
    assert out == fixed_snr_eval(fresh, [toy_batch()], generator=gen(0))
    custom = fixed_snr_eval(fresh, [toy_batch()], snrs=(2.5,), generator=gen(0))
    assert set(custom) == {"snr=2.5/ce", "snr=2.5/acc"}


def test_fixed_snr_accuracy_rises_with_snr_after_training(trained):
    out = fixed_snr_eval(trained, [toy_batch()], generator=gen(0))
    assert out["snr=50/acc"] >= out["snr=1/acc"] + 0.3
    assert out["snr=50/ce"] < out["snr=1/ce"]


def test_clean_and_infill(fresh):
    c = clean_eval(fresh, [toy_batch(), toy_batch()])
    assert set(c) == {"ce", "acc", "n_tokens"} and c["n_tokens"] == 2 * 96
    assert abs(c["ce"] - math.log(V)) < 0.5  # near-uniform random model
    i = infill_eval(fresh, [toy_batch()], mask_rate=0.5, generator=gen(0))
    assert set(i) == {"ce", "acc", "n_tokens", "mask_rate"} and 20 < i["n_tokens"] < 76
    assert i == infill_eval(fresh, [toy_batch()], mask_rate=0.5, generator=gen(0))
    full = infill_eval(fresh, [toy_batch()], mask_rate=1.0, generator=gen(0))
    assert full["n_tokens"] == 96
    with pytest.raises(ValueError, match="mask_rate"):
        infill_eval(fresh, [toy_batch()], mask_rate=0.0)


def test_prompt_and_padding_positions_are_not_evaluated(fresh):
    b = toy_batch()
    b["prompt_length"] = torch.tensor([0, 4, 8, 12])
    assert clean_eval(fresh, [b])["n_tokens"] == 96 - 24
    b["attention_mask"] = torch.ones(4, 24, dtype=torch.long)
    b["attention_mask"][0, 20:] = 0
    assert clean_eval(fresh, [b])["n_tokens"] == 96 - 24 - 4
    out = fixed_snr_eval(fresh, [b], snrs=(5,), generator=gen(0))
    assert math.isfinite(out["snr=5/ce"])


def test_converter_stats(fresh):
    s = converter_stats(fresh)
    assert s["beta"] == pytest.approx(1.0)
    assert s["mask_bias"] == pytest.approx(math.log(V))
    assert s["noise_row_norm_mean"] == pytest.approx(1.0, abs=1e-5)


def test_noise_embedding_health(fresh):
    h = noise_embedding_health(fresh, n=1000, generator=gen(0))
    assert set(h) == {"noise/mean_abs_cos", "value/mean_abs_cos", "noise/eff_rank", "value/eff_rank"}
    # 64 random unit vectors in 16 dims: E|cos| ≈ sqrt(2 / (π d)) ≈ 0.2
    assert 0.1 < h["noise/mean_abs_cos"] < 0.3
    assert 0 < h["value/mean_abs_cos"] < 1
    assert 1 <= h["noise/eff_rank"] <= 16 and 1 <= h["value/eff_rank"] <= 32
    # the helpers on known inputs
    assert mean_abs_cos(torch.eye(5)) == pytest.approx(0.0)
    assert mean_abs_cos(torch.ones(4, 3)) == pytest.approx(1.0)
    assert effective_rank(torch.eye(7)) == pytest.approx(7.0, rel=1e-5)
    assert effective_rank(torch.ones(6, 4)) == pytest.approx(1.0, rel=1e-5)


def test_nll_upper_bound(fresh, trained):
    assert default_gamma_max(V) == pytest.approx(30 * math.log(V) / math.log(27))
    for m in (fresh, trained):
        out = nll_upper_bound(m, [toy_batch()], n_points=8, generator=gen(0))
        assert {"nll_bound", "nll_bound_snr", "nll_ce_bits", "nll_integral", "ce_bits_at_0", "gamma_max"} <= set(out)
        assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())
        assert 0 < out["nll_bound"] <= out["ce_bits_at_0"] + 1e-9
        assert out["nll_bound"] == pytest.approx(out["nll_ce_bits"] + out["nll_integral"])
    curve = nll_bound_curve(trained, [toy_batch()], n_points=8, gamma_max=40.0, generator=gen(0))
    assert [c["snr"] for c in curve] == [0.0] + [5.0 * k for k in range(1, 9)]
    integ = [c["integral"] for c in curve]
    assert integ[0] == 0 and all(b >= a for a, b in zip(integ, integ[1:]))
    # trapezoid by hand
    assert integ[1] == pytest.approx(0.5 * 5.0 * (curve[0]["integrand"] + curve[1]["integrand"]))
    # at γ = 0 every state is 0 for any ε, so the prior CE does not depend on the generator
    assert curve[0]["ce_bits"] == pytest.approx(nll_bound_curve(trained, [toy_batch()], 1, 40.0, gen(5))[0]["ce_bits"])
    # the trained model reconstructs far better at high SNR than the prior
    assert curve[-1]["ce_bits"] < curve[0]["ce_bits"] - 1
    with_curve = nll_upper_bound(trained, [toy_batch()], n_points=8, gamma_max=40.0, generator=gen(0),
                                 return_curve=True)
    assert len(with_curve["curve"]) == 9


def test_eval_mode_restored_and_no_grad(fresh):
    fresh.train()
    fresh.noise_embed.eval()  # a sub-module deliberately in eval mode stays so
    out = monitor_all(fresh, [toy_batch()], gen(0), nll=True)
    assert fresh.training and fresh.converter.training and not fresh.noise_embed.training
    assert all(p.grad is None for p in fresh.parameters())
    prefixes = {k.split("/")[0] for k in out}
    assert prefixes == {"clean", "infill", "fixed_snr", "converter", "embed", "nll"}
    assert all(isinstance(v, float) for v in out.values())
    fresh.eval()


def test_monitor_all_on_bare_backbone():
    bb = LLaDABackbone(tiny_llada_config(vocab_size=V, d_model=32, n_layers=2))
    bb.init_weights(gen(0))
    out = monitor_all(bb, [toy_batch()], gen(0))
    assert {k.split("/")[0] for k in out} == {"clean", "infill"}
    with pytest.raises(TypeError, match="DSLModel"):
        fixed_snr_eval(bb, [toy_batch()])
