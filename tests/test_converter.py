"""Noise embedding, softmax converter, noisy states and the posterior-mean denoiser (docs/provenance.md §1)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dsl_llada.config import ConverterConfig
from dsl_llada.core.converter import Converter, NoiseEmbedding, noisy_states, posterior_mean
from helpers import gen

V, H, D = 64, 32, 16
MASK = V - 1


def make_wte(seed: int = 0, vocab: int = V, hidden: int = H) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=gen(seed))


def make_E(seed: int = 0, vocab: int = V, dim: int = D) -> torch.Tensor:
    ne = NoiseEmbedding(vocab, dim)
    ne.init_random(gen(seed))
    return ne.unit()


def make_converter(seed: int = 0, vocab: int = V, hidden: int = H, **cfg) -> Converter:
    cc = ConverterConfig(noise_dim=cfg.pop("noise_dim", D), **cfg)
    conv = Converter(cc, vocab, hidden)
    conv.init_from_backbone(make_wte(seed, vocab, hidden), MASK if vocab == V else vocab - 1)
    return conv


def ref_pi(z: torch.Tensor, E: torch.Tensor, beta: float, bias: torch.Tensor, mask_key: torch.Tensor | None = None):
    """softmax over [beta z E^T, beta z . k_mask] + b, written independently in float64."""
    z, E = z.double(), E.double()
    tok = beta * z @ E.T
    mask = torch.zeros_like(tok[..., :1]) if mask_key is None else beta * (z @ mask_key.double())[..., None]
    return torch.softmax(torch.cat([tok, mask], -1) + bias.double(), -1)


# -- init and the mask-like start ------------------------------------------------------------------------------------
def test_init_from_backbone_layout():
    wte = make_wte(3)
    conv = Converter(ConverterConfig(noise_dim=D, beta_init=2.5), V, H)
    conv.init_from_backbone(wte, MASK)
    W = conv.backbone_embedding.weight
    assert W.shape == (H, V + 1)
    assert torch.equal(W[:, :V], wte.T) and torch.equal(W[:, V], wte[MASK])
    assert torch.equal(conv.backbone_embedding.bias, torch.zeros(H))
    assert conv.logit_bias[V].item() == pytest.approx(math.log(V), abs=1e-6)
    assert torch.count_nonzero(conv.logit_bias[:V]) == 0
    assert conv.beta.item() == 2.5
    assert conv.mask_key is None and conv.residual_proj is None


def test_init_rejects_wrong_vocab():
    conv = Converter(ConverterConfig(noise_dim=D), V, H)
    with pytest.raises(ValueError, match="vocab_size=64"):
        conv.init_from_backbone(make_wte(0, vocab=V + 1), MASK)


def test_torch_default_value_bias_bound():
    conv = make_converter(value_bias_init="torch_default")
    c = conv.backbone_embedding.bias
    bound = 1 / math.sqrt(V + 1)
    assert c.abs().max() <= bound and c.abs().max() > 0.3 * bound


@pytest.mark.parametrize("value_bias_init", ["zeros", "torch_default"])
def test_zero_state_is_mask_like(value_bias_init):
    """gamma = 0: token logits 0, mask logit ln V => pi_mask = V / (V + V) = 1/2, every token 1/(2V)."""
    conv = make_converter(value_bias_init=value_bias_init)
    E = make_E()
    z = torch.zeros(5, D)
    pi = torch.softmax(conv.slot_logits(z, E, conv.beta), -1)
    assert torch.allclose(pi[:, V], torch.full((5,), 0.5), atol=1e-6)
    assert torch.allclose(pi[:, :V], torch.full((5, V), 1 / (2 * V)), atol=1e-7)
    W, c = conv.backbone_embedding.weight.detach(), conv.backbone_embedding.bias.detach()
    expected = 0.5 * W[:, V] + 0.5 * W[:, :V].mean(1) + c
    h = conv(z, E)
    assert h.shape == (5, H)
    assert torch.allclose(h, expected.expand(5, H), atol=1e-5)


def test_large_gamma_gold_token_dominates():
    """gamma = 500, beta 1, d = 100, V = 64: the gold token takes > 99% of the mass and h ~ W[:, gold]."""
    d = 100
    conv = make_converter(noise_dim=d, beta_init=1.0)
    E = make_E(1, dim=d)
    ids = torch.arange(V - 1).repeat(4)  # every non-mask token, several draws each
    z = noisy_states(E, ids, 500.0, generator=gen(2))
    pi = torch.softmax(conv.slot_logits(z, E, conv.beta), -1)
    p_gold = pi.gather(1, ids[:, None])[:, 0]
    assert (p_gold > 0.99).float().mean() >= 0.95
    assert p_gold.min() > 0.9
    h = conv(z, E)
    W = conv.backbone_embedding.weight.detach()
    gold_cols = W[:, ids].T
    rel = (h - gold_cols).norm(dim=-1) / gold_cols.norm(dim=-1)
    assert rel.median() < 0.01
    # ... and the nearest value column is the gold one for every position.
    assert torch.equal(torch.cdist(h, W[:, :V].T).argmin(-1), ids)


def test_forward_matches_reference_formula_and_beta_override():
    conv = make_converter(value_bias_init="torch_default")
    with torch.no_grad():
        conv.logit_bias.add_(0.3 * torch.randn(V + 1, generator=gen(5)))
        conv.beta.fill_(1.7)
    E = make_E(2)
    z = 3.0 * torch.randn(2, 7, D, generator=gen(4))
    W, c = conv.backbone_embedding.weight.detach().double(), conv.backbone_embedding.bias.detach().double()
    for beta, expect_beta in ((None, 1.7), (3.4, 3.4), (torch.tensor(0.5), 0.5)):
        pi = ref_pi(z, E, expect_beta, conv.logit_bias.detach())
        expected = (pi @ W.T + c).float()
        h = conv(z, E, beta)
        assert h.shape == (2, 7, H) and h.dtype == torch.float32
        assert torch.allclose(h, expected, atol=1e-5)


def test_clean_embedding_is_value_column_plus_bias():
    conv = make_converter(value_bias_init="torch_default")
    ids = torch.tensor([[0, 5, MASK], [62, 1, 1]])
    W, c = conv.backbone_embedding.weight.detach(), conv.backbone_embedding.bias.detach()
    assert torch.equal(conv.clean_embedding(ids), W[:, ids].permute(1, 2, 0) + c)


# -- chunking, checkpointing, precision -------------------------------------------------------------------------------
def _twin(conv: Converter, **changes) -> Converter:
    other = Converter(ConverterConfig(**{**conv.cfg.to_dict(), **changes}), conv.vocab_size,
                      conv.backbone_embedding.out_features)
    keep = set(other.state_dict())
    other.load_state_dict({k: v for k, v in conv.state_dict().items() if k in keep})
    return other


@pytest.mark.parametrize("residual", [False, True])
def test_chunked_equals_unchunked(residual):
    a = make_converter(token_chunk=3, residual=residual)
    b = _twin(a, token_chunk=0)
    E = make_E()
    z = 4 * torch.randn(2, 11, D, generator=gen(1))  # 22 tokens: 7 full chunks + a partial one
    with torch.no_grad():
        ha, hb = a(z, E), b(z, E)
    assert torch.allclose(ha, hb, atol=1e-6)
    assert a(torch.zeros(0, D), E).shape == (0, H)  # empty input


@pytest.mark.parametrize("residual", [False, True])
def test_gradients_equal_with_and_without_chunk_checkpointing(residual):
    a = make_converter(token_chunk=4, checkpoint_chunks=True, residual=residual, value_bias_init="torch_default")
    b = _twin(a, checkpoint_chunks=False, token_chunk=0)
    ne = NoiseEmbedding(V, D)
    ne.init_random(gen(0))
    w_target = torch.randn(2, 9, H, generator=gen(7))
    grads = []
    for conv in (a, b):
        conv.zero_grad()
        ne.weight.grad = None
        z = (3 * torch.randn(2, 9, D, generator=gen(3))).requires_grad_(True)
        loss = (conv(z, ne.unit()) * w_target).sum()
        loss.backward()
        g = {n: p.grad.clone() for n, p in conv.named_parameters()}
        g["z"], g["E"] = z.grad.clone(), ne.weight.grad.clone()
        grads.append(g)
    assert set(grads[0]) == set(grads[1])
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-5), k
        assert grads[0][k].abs().sum() > 0, k


def test_checkpointing_used_only_under_autograd(monkeypatch):
    import dsl_llada.core.converter as conv_mod

    calls = []
    real = conv_mod.checkpoint
    monkeypatch.setattr(conv_mod, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    conv = make_converter(token_chunk=4)
    E = make_E()
    z = torch.randn(10, D)
    with torch.no_grad():
        conv(z, E)
    assert calls == []
    conv(z, E)
    assert len(calls) == 3


def test_bf16_value_matrix_keeps_fp32_softmax():
    conv = make_converter(value_bias_init="torch_default")
    ref = _twin(conv)
    conv.backbone_embedding.to(torch.bfloat16)
    E = make_E()
    z = 50 * torch.randn(6, D, generator=gen(1))
    logits = conv.slot_logits(z.bfloat16(), E.bfloat16(), conv.beta.bfloat16())
    assert logits.dtype == torch.float32
    with torch.no_grad():
        h = conv(z, E)
        h_ref = ref(z, E)
    assert h.dtype == torch.bfloat16 and torch.isfinite(h).all()
    assert torch.allclose(h.float(), h_ref, atol=0.05, rtol=0.02)


def test_softmax_stays_fp32_under_bf16_autocast():
    conv = make_converter()
    E = make_E()
    z = 30 * torch.randn(8, D, generator=gen(2))
    seen = []
    conv.slot_logits = (lambda f: (lambda *a: seen.append(f(*a).dtype) or f(*a)))(conv.slot_logits)
    with torch.no_grad():
        h_ref = conv(z, E)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = conv(z, E)
    assert seen == [torch.float32, torch.float32]
    assert torch.isfinite(h).all()
    assert torch.allclose(h.float(), h_ref, atol=0.05, rtol=0.02)


# -- layouts -----------------------------------------------------------------------------------------------------------
def test_paper_layout_has_mask_key_and_no_value_bias():
    conv = make_converter(layout="paper")
    keys = set(conv.state_dict())
    assert keys == {"logit_bias", "backbone_embedding.weight", "beta", "mask_key"}
    assert conv.backbone_embedding.bias is None
    assert conv.mask_key.shape == (D,) and conv.mask_key.requires_grad
    assert torch.count_nonzero(conv.mask_key) == 0
    released = make_converter()
    assert set(released.state_dict()) == {"logit_bias", "backbone_embedding.weight", "backbone_embedding.bias", "beta"}
    # identical start: zero mask key == the released fixed zero row, and zero value bias
    E = make_E()
    z = 2 * torch.randn(5, D, generator=gen(1))
    with torch.no_grad():
        assert torch.allclose(conv(z, E), released(z, E), atol=1e-6)
    # a learned mask key makes the mask logit depend on z
    with torch.no_grad():
        conv.mask_key.copy_(torch.randn(D, generator=gen(9)))
    lg = conv.slot_logits(z, E, conv.beta)
    assert torch.allclose(lg[:, V], conv.beta * (z @ conv.mask_key) + math.log(V), atol=1e-5)
    pi = ref_pi(z, E, 1.0, conv.logit_bias.detach(), conv.mask_key.detach())
    with torch.no_grad():
        assert torch.allclose(conv(z, E), (pi @ conv.backbone_embedding.weight.double().T).float(), atol=1e-5)


def test_bf16_noise_table_is_upcast():
    """z, E, beta, b all enter the softmax in fp32 (docs/provenance.md §1.2), whatever dtype E is passed in."""
    conv = make_converter(residual=True)
    E = make_E()
    z = 3 * torch.randn(5, D, generator=gen(1))
    with torch.no_grad():
        a, b = conv(z, E), conv(z, E.bfloat16())
    assert a.dtype == b.dtype == torch.float32
    assert torch.allclose(a, b, atol=0.05)


def test_residual_path_adds_projected_high_component():
    conv = make_converter(residual=True)
    base = _twin(conv, residual=False)
    assert conv.residual_proj.weight.shape == (H, D)
    assert torch.count_nonzero(conv.residual_proj.bias) == 0 and 0 < conv.residual_proj.weight.std() < 0.02
    with torch.no_grad():
        conv.residual_proj.bias.copy_(torch.randn(H, generator=gen(4)))
    E = make_E()
    z = 3 * torch.randn(7, D, generator=gen(5))
    pi = ref_pi(z, E, 1.0, conv.logit_bias.detach())
    z_low = pi[:, :V] @ E.double()
    u = z_low / (z_low.norm(dim=-1, keepdim=True) + 1e-8)
    z_high = z.double() - (z.double() * u).sum(-1, keepdim=True) * u
    cos = (z_high * z_low).sum(-1) / (z_high.norm(dim=-1) * z_low.norm(dim=-1))
    assert cos.abs().max() < 1e-5  # z_high is orthogonal to z_low (up to the 1e-8 in u's normalisation)
    Wr, br = conv.residual_proj.weight.detach().double(), conv.residual_proj.bias.detach().double()
    with torch.no_grad():
        diff = conv(z, E) - base(z, E)
    assert torch.allclose(diff, (z_high @ Wr.T + br).float(), atol=1e-5)


# -- noise embedding --------------------------------------------------------------------------------------------------
def test_random_init_unit_rows_and_seeded():
    a, b, c = NoiseEmbedding(V, D), NoiseEmbedding(V, D), NoiseEmbedding(V, D)
    a.init_random(gen(42))
    b.init_random(gen(42))
    c.init_random(gen(43))
    assert torch.allclose(a.weight.norm(dim=-1), torch.ones(V), atol=1e-6)
    assert torch.equal(a.weight, b.weight) and not torch.equal(a.weight, c.weight)


def test_unit_renormalises_a_scaled_weight():
    ne = NoiseEmbedding(V, D)
    ne.init_random(gen(0))
    direction = ne.weight.detach().clone()
    with torch.no_grad():
        ne.weight.mul_(torch.linspace(0.1, 10.0, V)[:, None])
    E = ne.unit()
    assert E.dtype == torch.float32
    assert torch.allclose(E.norm(dim=-1), torch.ones(V), atol=1e-6)
    assert torch.allclose(E, direction, atol=1e-6)
    ne.to(torch.bfloat16)
    assert ne.unit().dtype == torch.float32


def test_trainable_flag():
    assert NoiseEmbedding(V, D).weight.requires_grad
    assert not NoiseEmbedding(V, D, trainable=False).weight.requires_grad


def test_pca_init_unit_rows_deterministic_and_correct():
    wte = make_wte(1)
    a, b = NoiseEmbedding(V, 8), NoiseEmbedding(V, 8)
    a.init_pca(wte)
    b.init_pca(wte.clone())
    assert torch.equal(a.weight, b.weight)
    assert torch.allclose(a.weight.norm(dim=-1), torch.ones(V), atol=1e-5)
    # Independent computation via SVD; the Gram matrix E E^T does not depend on the eigenvectors' signs.
    x = wte.double() - wte.double().mean(0)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    ref = F.normalize(x @ vh[:8].T, dim=-1)
    assert torch.allclose(a.weight.double() @ a.weight.double().T, ref @ ref.T, atol=1e-5)
    with pytest.raises(ValueError, match="noise_dim=40 exceeds"):
        NoiseEmbedding(V, 40).init_pca(wte)


# -- noisy states ---------------------------------------------------------------------------------------------------------
def test_noisy_states_shapes_and_gamma_broadcast():
    E = make_E()
    ids = torch.randint(0, V, (3, 5), generator=gen(1))
    for gamma in (2.0, torch.tensor(2.0), torch.tensor([1.0, 2.0, 3.0]), torch.rand(3, 5, generator=gen(2))):
        z = noisy_states(E, ids, gamma, generator=gen(0))
        assert z.shape == (3, 5, D) and z.dtype == torch.float32
    # gamma = 0 gives exactly zero; a huge gamma gives ~ gamma e_x (per sequence and per token)
    g_seq = torch.tensor([0.0, 1e8, 0.0])
    z = noisy_states(E, ids, g_seq, generator=gen(0))
    assert torch.count_nonzero(z[0]) == 0 and torch.count_nonzero(z[2]) == 0
    assert torch.allclose(z[1] / 1e8, E[ids[1]], atol=1e-3)
    g_tok = torch.zeros(3, 5)
    g_tok[1, 2] = 1e8
    z = noisy_states(E, ids, g_tok, generator=gen(0))
    assert torch.count_nonzero(z.abs().sum(-1)) == 1
    assert torch.allclose(z[1, 2] / 1e8, E[ids[1, 2]], atol=1e-3)


def test_noisy_states_moments():
    E = make_E()
    n, gamma = 40000, 4.0
    ids = torch.full((n,), 7)
    z = noisy_states(E, ids, gamma, generator=gen(11))
    assert torch.allclose(z.mean(0), gamma * E[7], atol=0.06)
    assert torch.allclose(z.var(0), torch.full((D,), gamma), rtol=0.06)
    # per-token gamma: each position has its own scale
    g = torch.tensor([[0.5, 9.0]]).expand(n, 2)
    z2 = noisy_states(E, torch.full((n, 2), 3), g, generator=gen(12))
    assert torch.allclose(z2.mean(0), g[0][:, None] * E[3], atol=0.1)
    assert torch.allclose(z2.var(0), g[0][:, None].expand(2, D), rtol=0.06)


def test_noisy_states_seeded_and_bf16_table():
    E = make_E()
    ids = torch.randint(0, V, (2, 4), generator=gen(1))
    assert torch.equal(noisy_states(E, ids, 3.0, generator=gen(5)), noisy_states(E, ids, 3.0, generator=gen(5)))
    assert not torch.equal(noisy_states(E, ids, 3.0, generator=gen(5)), noisy_states(E, ids, 3.0, generator=gen(6)))
    assert noisy_states(E.bfloat16(), ids, 3.0, generator=gen(5)).dtype == torch.float32


def test_noisy_states_flat_ids_with_per_token_gamma():
    """ids (N,) with gamma (N,) is per token: (N, d), not an (N, N, d) broadcast."""
    E = make_E()
    ids = torch.tensor([3, 4, 5])
    z = noisy_states(E, ids, torch.tensor([0.0, 1e8, 0.0]), generator=gen(0))
    assert z.shape == (3, D)
    assert torch.count_nonzero(z[0]) == 0 and torch.count_nonzero(z[2]) == 0
    assert torch.allclose(z[1] / 1e8, E[4], atol=1e-3)


@pytest.mark.parametrize("gamma, match", [
    (torch.ones(3), "per-sequence gamma has 3 entries for a batch of 2"),
    (torch.ones(2, 5), r"per-token gamma shape \(2, 5\) does not match ids shape \(2, 4\)"),
    (torch.ones(2, 1), r"per-token gamma shape \(2, 1\)"),
    (torch.ones(2, 4, 1), r"per-token gamma shape \(2, 4, 1\)"),
])
def test_noisy_states_shape_errors(gamma, match):
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        noisy_states(make_E(), ids, gamma)


# -- posterior mean -------------------------------------------------------------------------------------------------------
def test_posterior_mean_full_topm_and_argmax():
    E = make_E()
    logits = 3 * torch.randn(2, 5, V, generator=gen(1))
    full = torch.softmax(logits.double(), -1) @ E.double()
    for m in (0, V, V + 10):
        out = posterior_mean(logits, E, top_m=m)
        assert out.shape == (2, 5, D) and out.dtype == torch.float32
        assert torch.allclose(out.double(), full, atol=1e-6)
    assert torch.equal(posterior_mean(logits, E, top_m=1), E[logits.argmax(-1)])


def test_posterior_mean_top_m_renormalises():
    E = make_E()
    logits = 2 * torch.randn(9, V, generator=gen(2))
    m = 5
    vals, idx = logits.topk(m, -1)
    p = torch.softmax(vals.double(), -1)
    expected = (p[..., None] * E.double()[idx]).sum(1)
    assert torch.allclose(posterior_mean(logits, E, top_m=m).double(), expected, atol=1e-6)
    # chunking does not change the result
    assert torch.allclose(posterior_mean(logits, E, top_m=m, chunk=2), posterior_mean(logits, E, top_m=m), atol=1e-7)


@pytest.mark.parametrize("m", [0, 1, 3, 64])
def test_posterior_mean_rows_are_convex_combinations(m):
    E = make_E()
    logits = 5 * torch.randn(50, V, generator=gen(3))
    out = posterior_mean(logits.bfloat16(), E, top_m=m)
    assert out.dtype == torch.float32
    assert (out.norm(dim=-1) <= 1 + 1e-5).all()


def test_posterior_mean_class_mismatch():
    with pytest.raises(ValueError, match="65 classes but the noise embedding has 64 rows"):
        posterior_mean(torch.zeros(2, V + 1), make_E())
