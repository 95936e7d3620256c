"""DSLModel: conversion init, continuous/discrete paths, checkpoints (own layout and the released DSL-LLaDA layout)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import dsl_llada.core.model as model_mod
from dsl_llada.core.backbones import CheckpointError, save_backbone
from dsl_llada.core.checkpoint import INDEX_NAME, WEIGHTS_NAME, checkpoint_files
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSL_CONFIG_NAME, DSLModel
from helpers import EOS, MASK, V, gen, perturb_converter, tiny_backbone, tiny_dsl

H, D = 32, 16


def _ids(B: int = 2, L: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V - 2, (B, L), generator=gen(seed))


def _state_mask(B: int = 2, L: int = 9) -> torch.Tensor:
    m = torch.zeros(B, L, dtype=torch.bool)
    m[:, 4:] = True
    m[1, 2] = True
    return m


def _all_logits(model: DSLModel, seed: int = 3) -> dict[str, torch.Tensor]:
    ids = _ids()
    z = 5 * torch.randn(2, 9, model.noise_dim, generator=gen(seed))
    mask = _state_mask()
    with torch.no_grad():
        return {"states": model.logits_from_states(ids, z, mask), "all_states": model.logits_from_states(ids, z),
                "ids": model.logits_from_ids(ids)}


def _dir_snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- conversion -------------------------------------------------------------------------------------------------------
def test_convert_init_facts():
    bb = tiny_backbone(seed=2)
    wte = bb.input_embeddings().weight.detach().clone()
    m = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=D, beta_init=1.5)))
    W = m.converter.backbone_embedding.weight
    assert W.shape == (H, V + 1)
    assert torch.equal(W[:, :V], wte.T)
    assert torch.equal(W[:, V], wte[MASK])
    assert torch.count_nonzero(m.converter.backbone_embedding.bias) == 0
    assert m.converter.logit_bias[V].item() == pytest.approx(math.log(V), abs=1e-6)
    assert torch.count_nonzero(m.converter.logit_bias[:V]) == 0
    assert m.trained_beta == 1.5
    assert m.converter.beta.dtype == torch.float32 and m.converter.logit_bias.dtype == torch.float32
    assert m.noise_embed.weight.shape == (V, D)
    assert torch.allclose(m.noise_embed.weight.norm(dim=-1), torch.ones(V), atol=1e-6)
    assert torch.allclose(m.unit_noise(), m.noise_embed.weight, atol=1e-6)
    assert m.noise_embed.weight.requires_grad
    assert m.vocab_size == V and m.noise_dim == D and m.special.mask == MASK
    assert torch.equal(m.backbone.input_embeddings().weight, wte)  # the backbone itself is untouched


def test_noise_seed_controls_the_table():
    a = tiny_dsl(noise_seed=5)
    b = tiny_dsl(noise_seed=5)
    c = tiny_dsl(noise_seed=6)
    assert torch.equal(a.noise_embed.weight, b.noise_embed.weight)
    assert not torch.equal(a.noise_embed.weight, c.noise_embed.weight)
    # the table is seeded by noise_seed alone, not by the global RNG
    torch.manual_seed(123)
    d = tiny_dsl(noise_seed=5)
    assert torch.equal(a.noise_embed.weight, d.noise_embed.weight)


def test_convert_pca_and_frozen_noise():
    m = tiny_dsl(noise_init="pca", trainable_noise_embed=False)
    assert torch.allclose(m.noise_embed.weight.norm(dim=-1), torch.ones(V), atol=1e-5)
    assert not m.noise_embed.weight.requires_grad
    assert torch.equal(m.noise_embed.weight, tiny_dsl(noise_init="pca").noise_embed.weight)
    with pytest.raises(ValueError, match="exceeds the backbone hidden size"):
        tiny_dsl(noise_dim=H + 1, noise_init="pca")


def test_convert_bf16_backbone_keeps_beta_and_bias_fp32():
    bb = tiny_backbone().to(torch.bfloat16)
    m = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=D)))
    assert m.converter.backbone_embedding.weight.dtype == torch.bfloat16
    assert m.converter.beta.dtype == torch.float32 and m.converter.logit_bias.dtype == torch.float32
    assert m.noise_embed.weight.dtype == torch.float32
    out = _all_logits(m)
    assert all(torch.isfinite(v.float()).all() for v in out.values())


def test_dsl_state_dict_keys_per_layout():
    base = {"noise_embed.weight", "converter.logit_bias", "converter.backbone_embedding.weight", "converter.beta"}
    assert set(tiny_dsl().dsl_state_dict()) == base | {"converter.backbone_embedding.bias"}
    assert set(tiny_dsl(layout="paper").dsl_state_dict()) == base | {"converter.mask_key"}
    assert set(tiny_dsl(residual=True).dsl_state_dict()) == base | {
        "converter.backbone_embedding.bias", "converter.residual_proj.weight", "converter.residual_proj.bias"}
    full = tiny_dsl().full_state_dict()
    assert "model.transformer.wte.weight" in full and not any(k.startswith("backbone.") for k in full)


# -- paths ------------------------------------------------------------------------------------------------------------
def test_context_embedding_choice():
    ids = _ids()
    conv = perturb_converter(tiny_dsl(context_embedding="converter"))
    wte = perturb_converter(tiny_dsl(context_embedding="wte"))
    W, c = conv.converter.backbone_embedding.weight.detach(), conv.converter.backbone_embedding.bias.detach()
    with torch.no_grad():
        assert torch.equal(conv.context_embed(ids), W.T[ids] + c)
        assert torch.equal(wte.context_embed(ids), wte.backbone.input_embeddings().weight[ids])
        assert not torch.allclose(conv.context_embed(ids), wte.context_embed(ids))
        assert torch.equal(conv.embed_inputs(ids), conv.context_embed(ids))


@pytest.mark.parametrize("context", ["converter", "wte"])
def test_embed_inputs_mixes_states_and_context(context):
    m = perturb_converter(tiny_dsl(context_embedding=context))
    ids, mask = _ids(), _state_mask()
    z = 4 * torch.randn(2, 9, D, generator=gen(2))
    with torch.no_grad():
        h = m.embed_inputs(ids, z, mask)
        conv = m.converter(z, m.unit_noise())
        ctx = m.context_embed(ids)
        assert torch.allclose(h[mask], conv[mask], atol=1e-6)
        assert torch.equal(h[~mask], ctx[~mask])
        assert torch.equal(m.embed_inputs(ids, z[mask], mask), h)  # pre-gathered (N, d) states
        assert torch.allclose(m.embed_inputs(ids, z), conv, atol=1e-6)  # no mask: every position converted
        assert torch.allclose(m.embed_inputs(ids, z, mask, beta=3.0)[mask], m.converter(z, m.unit_noise(), 3.0)[mask],
                              atol=1e-6)
        assert torch.allclose(m.logits_from_states(ids, z, mask), m.backbone(h), atol=1e-6)
        assert torch.equal(m.logits_from_ids(ids), m.backbone(m.backbone.embed(ids)))


def test_posterior_mean_method_uses_unit_noise():
    m = tiny_dsl()
    with torch.no_grad():
        m.noise_embed.weight.mul_(3.0)
    logits = torch.randn(2, 4, V, generator=gen(0))
    expected = torch.softmax(logits, -1) @ F.normalize(m.noise_embed.weight.detach(), dim=-1)
    assert torch.allclose(m.posterior_mean(logits, top_m=0), expected, atol=1e-6)


# -- own checkpoint round trip ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"layout": "paper"}, {"residual": True, "trainable_noise_embed": False},
                                {"context_embedding": "wte"}], ids=["released", "paper", "residual", "wte"])
def test_save_load_round_trip(tmp_path, kw):
    m = perturb_converter(tiny_dsl(**kw))
    folder = m.save_pretrained(tmp_path / "ckpt", extra_files={"README.md": "hello\n"})
    names = {p.name for p in folder.iterdir()}
    assert names == {"config.json", DSL_CONFIG_NAME, WEIGHTS_NAME, "README.md"}
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llada"
    assert DSLConfig.load(folder / DSL_CONFIG_NAME) == m.config
    keys = set(checkpoint_files(folder))
    assert keys == set(m.full_state_dict())
    loaded = DSLModel.from_pretrained(folder).eval()
    assert loaded.config == m.config
    assert loaded.noise_embed.weight.requires_grad == m.config.converter.trainable_noise_embed
    for k, v in m.full_state_dict().items():
        assert torch.equal(loaded.full_state_dict()[k], v), k
    a, b = _all_logits(m), _all_logits(loaded)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sharded_save_round_trip(tmp_path):
    m = perturb_converter(tiny_dsl())
    folder = m.save_pretrained(tmp_path / "ckpt", max_shard_bytes=40_000)
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert (folder / INDEX_NAME).exists() and not (folder / WEIGHTS_NAME).exists()
    assert len(shards) >= 3 and all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    index = json.loads((folder / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(m.full_state_dict())
    loaded = DSLModel.from_pretrained(folder).eval()
    a, b = _all_logits(m), _all_logits(loaded)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_load_casts_to_bf16_but_keeps_fp32_scalars(tmp_path):
    m = perturb_converter(tiny_dsl())
    folder = m.save_pretrained(tmp_path / "ckpt")
    loaded = DSLModel.from_pretrained(folder, dtype=torch.bfloat16)
    assert loaded.backbone.input_embeddings().weight.dtype == torch.bfloat16
    assert loaded.converter.backbone_embedding.weight.dtype == torch.bfloat16
    assert loaded.converter.beta.dtype == torch.float32 and loaded.converter.logit_bias.dtype == torch.float32
    assert loaded.noise_embed.weight.dtype == torch.float32
    assert torch.equal(loaded.converter.logit_bias, m.converter.logit_bias.detach())
    out = _all_logits(loaded)
    ref = _all_logits(m)
    for k in out:
        assert out[k].dtype == torch.bfloat16 and torch.isfinite(out[k]).all()
        assert (out[k].float() - ref[k]).abs().mean() < 0.1, k


def test_save_overwrites_existing_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    tiny_dsl(seed=0).save_pretrained(folder, max_shard_bytes=40_000)
    m = perturb_converter(tiny_dsl(seed=1))
    m.save_pretrained(folder)  # single file now: stale shards and index must be gone
    assert {p.name for p in folder.iterdir()} == {"config.json", DSL_CONFIG_NAME, WEIGHTS_NAME}
    assert torch.equal(_all_logits(DSLModel.from_pretrained(folder).eval())["states"], _all_logits(m)["states"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    old = perturb_converter(tiny_dsl(seed=0))
    old.save_pretrained(folder)
    before = _dir_snapshot(folder)

    real = model_mod.write_safetensors

    def failing(state, target, **kw):
        real(dict(list(state.items())[:3]), target, **kw)  # a partial write, then the "disk full"
        raise OSError("disk full")

    monkeypatch.setattr(model_mod, "write_safetensors", failing)
    with pytest.raises(OSError, match="disk full"):
        tiny_dsl(seed=1).save_pretrained(folder)
    with pytest.raises(OSError, match="disk full"):
        tiny_dsl(seed=1).save_pretrained(tmp_path / "fresh")
    assert _dir_snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp / .old folder, no half 'fresh'
    monkeypatch.undo()
    assert torch.equal(_all_logits(DSLModel.from_pretrained(folder).eval())["states"], _all_logits(old)["states"])


def test_missing_and_unknown_keys_in_own_layout(tmp_path):
    m = tiny_dsl()
    folder = m.save_pretrained(tmp_path / "ckpt")
    state = {k: v.detach().clone().contiguous() for k, v in m.full_state_dict().items()}
    del state["converter.beta"]
    save_file(state, str(folder / WEIGHTS_NAME))
    with pytest.raises(CheckpointError, match=r"missing \['converter.beta'\]"):
        DSLModel.from_pretrained(folder)


# -- the released DSL-LLaDA layout --------------------------------------------------------------------------------------
def _llada_config_json(bb) -> dict:
    c = bb.cfg
    return {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": c.d_model, "n_layers": c.n_layers,
            "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "vocab_size": c.vocab_size,
            "embedding_size": c.embedding_size, "mlp_hidden_size": c.mlp_hidden_size, "mlp_ratio": 4,
            "weight_tying": False, "rope_theta": c.rope_theta, "max_sequence_length": c.max_sequence_length,
            "rms_norm_eps": c.rms_norm_eps, "include_bias": False, "include_qkv_bias": False, "block_type": "llama",
            "activation_type": "silu", "layer_norm_type": "rms", "rope": True, "alibi": False,
            "mask_token_id": MASK, "eos_token_id": EOS, "pad_token_id": EOS, "use_cache": False,
            "torch_dtype": "bfloat16"}


def _released_tensors(d: int = 12, seed: int = 0, residual: bool = False) -> tuple[dict[str, torch.Tensor], object]:
    bb = tiny_backbone(seed=seed)
    g = gen(seed + 100)
    E = F.normalize(torch.randn(V, d, generator=g), dim=-1)
    t = {k: v.detach().clone() for k, v in bb.state_dict().items()}
    t.update({
        "noise_embed.weight": E,
        "converter.embed.weight": E.clone(),  # the duplicate reference some checkpoints carry
        "converter.logit_bias": torch.cat([0.5 * torch.randn(V, generator=g), torch.tensor([math.log(V)])]),
        "converter.backbone_embedding.weight": 0.3 * torch.randn(H, V + 1, generator=g),
        "converter.backbone_embedding.bias": 0.01 * torch.randn(H, generator=g),
        "converter.beta": torch.tensor(1.7),
        "log_snr_max": torch.tensor(math.log(100.0)),
    })
    if residual:
        t["converter.residual_proj.weight"] = 0.05 * torch.randn(H, d, generator=g)
        t["converter.residual_proj.bias"] = 0.01 * torch.randn(H, generator=g)
    return t, bb


def _write_released(folder: Path, tensors: dict[str, torch.Tensor], bb) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(_llada_config_json(bb)))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    return folder


def _hand_logits(t: dict[str, torch.Tensor], bb, ids, z, mask, beta: float | None = None) -> torch.Tensor:
    """The released converter written out: pi = softmax(beta z E^T | 0 + b); h = W pi + c [+ W_r z_high + b_r];
    context = wte[ids] (authors' code)."""
    E = t["noise_embed.weight"].double()
    b = t["converter.logit_bias"].double()
    W, c = t["converter.backbone_embedding.weight"].double(), t["converter.backbone_embedding.bias"].double()
    beta = float(t["converter.beta"]) if beta is None else beta
    zs = z[mask].double()
    logits = torch.cat([beta * zs @ E.T, torch.zeros(len(zs), 1, dtype=torch.float64)], -1) + b
    pi = torch.softmax(logits, -1)
    hs = pi @ W.T + c
    if "converter.residual_proj.weight" in t:
        z_low = pi[:, :V] @ E
        u = z_low / (z_low.norm(dim=-1, keepdim=True) + 1e-8)
        z_high = zs - (zs * u).sum(-1, keepdim=True) * u
        hs = hs + z_high @ t["converter.residual_proj.weight"].double().T + t["converter.residual_proj.bias"].double()
    h = t["model.transformer.wte.weight"][ids].clone()
    h[mask] = hs.float()
    with torch.no_grad():
        return bb(h)


@pytest.mark.parametrize("residual", [False, True])
def test_released_layout_loads_with_inferred_config(tmp_path, residual):
    t, bb = _released_tensors(d=12, residual=residual)
    folder = _write_released(tmp_path / "released", t, bb)
    m = DSLModel.from_pretrained(folder, assume_released=True).eval()
    cc = m.config.converter
    assert m.config.context_embedding == "wte"
    assert (cc.noise_dim, cc.layout, cc.residual, cc.trainable_noise_embed) == (12, "released", residual, False)
    assert not (folder / DSL_CONFIG_NAME).exists()
    assert m.trained_beta == pytest.approx(1.7)
    assert m.special.mask == MASK and m.special.eos == EOS
    ids, mask = _ids(), _state_mask()
    z = 6 * torch.randn(2, 9, 12, generator=gen(5))
    with torch.no_grad():
        got = m.logits_from_states(ids, z, mask)
        got_beta = m.logits_from_states(ids, z, mask, beta=3.4)
        got_ids = m.logits_from_ids(ids)
    assert torch.allclose(got, _hand_logits(t, bb, ids, z, mask), atol=1e-4)
    assert torch.allclose(got_beta, _hand_logits(t, bb, ids, z, mask, beta=3.4), atol=1e-4)
    with torch.no_grad():
        assert torch.allclose(got_ids, bb(bb.embed(ids)), atol=1e-6)
    # and it saves in our layout (with dsl_config.json) and reloads identically
    again = DSLModel.from_pretrained(m.save_pretrained(tmp_path / "ours")).eval()
    with torch.no_grad():
        assert torch.equal(again.logits_from_states(ids, z, mask), got)


def test_released_layout_in_bf16(tmp_path):
    t, bb = _released_tensors()
    folder = _write_released(tmp_path / "released", {k: v.bfloat16() for k, v in t.items()}, bb)
    m = DSLModel.from_pretrained(folder, dtype=torch.bfloat16, assume_released=True)
    assert m.converter.beta.dtype == torch.float32
    assert m.trained_beta == float(torch.tensor(1.7).bfloat16())
    assert m.converter.backbone_embedding.weight.dtype == torch.bfloat16
    with torch.no_grad():
        out = m.logits_from_states(_ids(), 6 * torch.randn(2, 9, 12, generator=gen(5)), _state_mask())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_released_layout_unknown_dsl_key(tmp_path):
    t, bb = _released_tensors()
    t["converter.temperature"] = torch.tensor(1.0)
    with pytest.raises(CheckpointError, match="converter.temperature"):
        DSLModel.from_pretrained(_write_released(tmp_path / "r", t, bb), assume_released=True)


def test_released_layout_gated_residual_is_refused(tmp_path):
    t, bb = _released_tensors(residual=True)
    t["converter.gate_temp"], t["converter.gate_bias"] = torch.tensor(5.0), torch.tensor(2.0)
    with pytest.raises(CheckpointError, match="SNR-gated"):
        DSLModel.from_pretrained(_write_released(tmp_path / "r", t, bb), assume_released=True)


def test_released_layout_vocab_mismatch(tmp_path):
    t, bb = _released_tensors(d=12)
    t["noise_embed.weight"] = F.normalize(torch.randn(V + 1, 12, generator=gen(0)), dim=-1)
    with pytest.raises(CheckpointError, match=r"noise_embed.weight has shape \(65, 12\), expected \(64, 12\)"):
        DSLModel.from_pretrained(_write_released(tmp_path / "r", t, bb), assume_released=True)


def test_released_layout_value_matrix_mismatch(tmp_path):
    t, bb = _released_tensors(d=12)
    t["converter.backbone_embedding.weight"] = torch.zeros(H, V)
    with pytest.raises(CheckpointError, match=r"converter.backbone_embedding.weight has shape \(32, 64\)"):
        DSLModel.from_pretrained(_write_released(tmp_path / "r", t, bb), assume_released=True)


def test_folder_without_noise_embed_is_not_a_dsl_checkpoint(tmp_path):
    folder = save_backbone(tiny_backbone(), tmp_path / "plain")
    with pytest.raises(CheckpointError, match="noise_embed.weight"):
        DSLModel.from_pretrained(folder)
    with pytest.raises(CheckpointError, match="does not exist"):
        DSLModel.from_pretrained(tmp_path / "nowhere")
