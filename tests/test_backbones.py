"""Native LLaDA backbone: forward math against a plain reference, padding, HF-folder loading, errors, dispatch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dsl_llada.core.backbones import (
    CheckpointError, LLaDABackbone, LLaDAConfig, SpecialTokens, load_backbone, tiny_llada_config)
from dsl_llada.core.checkpoint import checkpoint_files, write_safetensors

V = 64
MASK, EOS, BOS, EOT = 63, 62, 61, 60
TOL = 1e-5


def _model(seed: int = 0, **kw) -> LLaDABackbone:
    cfg = tiny_llada_config(V, **kw)
    m = LLaDABackbone(cfg)
    m.init_weights(torch.Generator().manual_seed(seed), std=0.2)
    with torch.no_grad():  # non-unit norm weights so the ×weight step is exercised
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


# -- an independent reference forward, written from docs/provenance.md §8.2 ---------------------------------------------
def _ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.to(torch.float32)
    y = x32 / torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)  # eps inside the sqrt
    return y.to(x.dtype) * w  # cast back, THEN scale


def _ref_rope(t: torch.Tensor, theta: float) -> torch.Tensor:
    """t: (B, h, L, hd). Rotate-half over the full head dim, computed in fp32."""
    L, hd = t.shape[-2], t.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    pos = torch.arange(L, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    t32 = t.to(torch.float32)
    half = hd // 2
    rot = torch.cat([-t32[..., half:], t32[..., :half]], dim=-1)
    return (t32 * cos + rot * sin).to(t.dtype)


def reference_llada_logits(sd: dict[str, torch.Tensor], cfg: LLaDAConfig, x: torch.Tensor,
                           keep: torch.Tensor | None = None) -> torch.Tensor:
    p = "model.transformer."
    B, L, d = x.shape
    nh, nkv = cfg.n_heads, cfg.n_kv_heads
    hd = d // nh
    eps = cfg.rms_norm_eps
    bias = torch.zeros(B, 1, L, L)
    if keep is not None:
        bias = bias.masked_fill(~keep.bool()[:, None, None, :], torch.finfo(torch.float32).min)
    for i in range(cfg.n_layers):
        b = f"{p}blocks.{i}."
        h = _ref_rms(x, sd[b + "attn_norm.weight"], eps)
        q = (h @ sd[b + "q_proj.weight"].T).reshape(B, L, nh, hd).permute(0, 2, 1, 3)
        k = (h @ sd[b + "k_proj.weight"].T).reshape(B, L, nkv, hd).permute(0, 2, 1, 3)
        v = (h @ sd[b + "v_proj.weight"].T).reshape(B, L, nkv, hd).permute(0, 2, 1, 3)
        q, k = _ref_rope(q, cfg.rope_theta), _ref_rope(k, cfg.rope_theta)
        group = nh // nkv  # each kv head serves `group` consecutive query heads
        k = torch.stack([k[:, j // group] for j in range(nh)], dim=1)
        v = torch.stack([v[:, j // group] for j in range(nh)], dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias  # bidirectional: no causal term
        a = torch.softmax(scores, dim=-1) @ v
        x = x + a.permute(0, 2, 1, 3).reshape(B, L, d) @ sd[b + "attn_out.weight"].T
        h = _ref_rms(x, sd[b + "ff_norm.weight"], eps)
        gate = h @ sd[b + "ff_proj.weight"].T
        up = h @ sd[b + "up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ sd[b + "ff_out.weight"].T  # SiLU on ff_proj
    x = _ref_rms(x, sd[p + "ln_f.weight"], eps)
    return x @ sd[p + "ff_out.weight"].T  # untied head


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_llada_matches_reference_forward(n_kv_heads):
    m = _model(n_kv_heads=n_kv_heads, n_heads=4, rope_theta=500000.0)
    sd = {k: v.detach() for k, v in m.state_dict().items()}
    ids = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = m(m.embed(ids))
        ref = reference_llada_logits(sd, m.cfg, sd["model.transformer.wte.weight"][ids])
    assert out.shape == (2, 11, V) and out.dtype == torch.float32
    assert float((out - ref).abs().max()) < TOL
    # logits are aligned to positions and attention is bidirectional: a later token moves an earlier logit
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 1) % V
    with torch.no_grad():
        assert float((m(m.embed(ids2))[:, 0] - out[:, 0]).abs().max()) > 1e-4


def test_llada_reference_with_padding_mask():
    m = _model(n_kv_heads=2)
    sd = {k: v.detach() for k, v in m.state_dict().items()}
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(4))
    keep = torch.ones(2, 9, dtype=torch.long)
    keep[0, :3] = 0
    with torch.no_grad():
        out = m(m.embed(ids), keep)
        ref = reference_llada_logits(sd, m.cfg, sd["model.transformer.wte.weight"][ids], keep)
    assert float((out - ref).abs().max()) < TOL


def test_llada_left_padding_matches_unpadded():
    m = _model(n_kv_heads=2)
    ids = torch.randint(0, 60, (1, 8), generator=torch.Generator().manual_seed(5))
    n_pad = 5
    padded = torch.cat([torch.full((1, n_pad), EOS), ids], dim=1)
    keep = torch.cat([torch.zeros(1, n_pad, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], dim=1)
    # batch a padded row with a full-length row: the full row is unaffected by its neighbour's padding
    other = torch.randint(0, 60, (1, 8 + n_pad), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = m(m.embed(ids))
        ref_other = m(m.embed(other))
        out = m(m.embed(torch.cat([padded, other])), torch.cat([keep, torch.ones_like(keep)]))
        ones = m(m.embed(ids), torch.ones_like(ids))
    assert float((out[0, n_pad:] - ref[0]).abs().max()) < TOL
    assert float((out[1] - ref_other[0]).abs().max()) < TOL
    assert torch.equal(ones, ref)


# -- HF-style LLaDA folders ------------------------------------------------------------------------------------
def _llada_config_json(cfg: LLaDAConfig, **overrides) -> dict:
    """config.json with every field name of the real LLaDA-8B-Instruct file (docs/provenance.md §8.1)."""
    d = {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": cfg.d_model,
        "embedding_dropout": 0.0, "embedding_size": cfg.embedding_size, "eos_token_id": EOS,
        "flash_attention": False, "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None,
        "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
        "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": MASK,
        "max_sequence_length": cfg.max_sequence_length, "mlp_hidden_size": cfg.mlp_hidden_size, "mlp_ratio": 4,
        "model_type": "llada", "multi_query_attention": None, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
        "n_layers": cfg.n_layers, "pad_token_id": EOS, "precision": "amp_bf16", "residual_dropout": 0.0,
        "rms_norm_eps": cfg.rms_norm_eps, "rope": True, "rope_full_precision": True, "rope_theta": cfg.rope_theta,
        "scale_logits": False, "torch_dtype": "bfloat16", "transformers_version": "4.46.2", "use_cache": False,
        "vocab_size": cfg.vocab_size, "weight_tying": False,
    }
    d.update(overrides)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()


def _tokenizer_config(folder: Path) -> None:
    dec = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                    "special": True}
           for i, t in {BOS: "<|startoftext|>", EOS: "<|endoftext|>", EOT: "<|eot_id|>", MASK: "<|mdm_mask|>"}.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": dec, "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
         "pad_token": "<|endoftext|>", "add_bos_token": False, "add_eos_token": False}))


def _write_folder(folder: Path, m: LLaDABackbone, *, state: dict | None = None, tokenizer: bool = True,
                  max_shard_bytes: int = 40_000, **cfg_overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_llada_config_json(m.cfg, **cfg_overrides), indent=2))
    write_safetensors(m.state_dict() if state is None else state, folder, max_shard_bytes=max_shard_bytes)
    if tokenizer:
        _tokenizer_config(folder)
    return folder


def test_load_sharded_hf_folder_gives_identical_logits(tmp_path):
    m = _model(n_kv_heads=2)
    folder = _write_folder(tmp_path / "llada", m)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((folder / s).exists() for s in shards)
    assert all(k.startswith("model.transformer.") for k in index["weight_map"])

    loaded = load_backbone(folder)
    assert type(loaded) is LLaDABackbone
    assert set(loaded.state_dict()) == set(checkpoint_files(folder)) == set(m.state_dict())
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(loaded(loaded.embed(ids)), m(m.embed(ids)))
    # special ids: mask/eos/pad from config.json, eot (and bos) completed from tokenizer_config.json
    assert loaded.special == SpecialTokens(mask=MASK, eos=EOS, eot=EOT, pad=EOS, bos=BOS)
    assert loaded.special.stop_ids() == (EOS, EOT)


def test_load_casts_dtype_and_explicit_special_wins(tmp_path):
    m = _model()
    folder = _write_folder(tmp_path / "llada", m, tokenizer=False)
    loaded = LLaDABackbone.from_pretrained(folder, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    assert loaded.special.eot is None  # no tokenizer_config.json: no EoT
    sp = SpecialTokens(mask=MASK, eos=EOS, eot=EOT)
    assert load_backbone(folder, special=sp).special is sp


def test_config_dict_round_trips(tmp_path):
    m = _model(n_kv_heads=1)
    folder = tmp_path / "rt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(m.config_dict()))
    write_safetensors(m.state_dict(), folder)
    loaded = load_backbone(folder)
    assert loaded.cfg == m.cfg
    ids = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert torch.equal(loaded(loaded.embed(ids)), m(m.embed(ids)))


# -- bad inputs: one clear error naming the problem ---------------------------------------------------------------
def test_unknown_key_is_named(tmp_path):
    m = _model()
    state = {**m.state_dict(), "model.transformer.blocks.0.rogue.weight": torch.zeros(2)}
    folder = _write_folder(tmp_path / "x", m, state=state)
    with pytest.raises(CheckpointError, match=r"unknown key\(s\).*model\.transformer\.blocks\.0\.rogue\.weight"):
        load_backbone(folder)
    # the same key is fine when the caller says that prefix belongs to someone else
    assert isinstance(load_backbone(folder, extra_keys_ok=("model.transformer.blocks.0.rogue",)), LLaDABackbone)


def test_missing_key_is_named(tmp_path):
    m = _model()
    state = {k: v for k, v in m.state_dict().items() if k != "model.transformer.ln_f.weight"}
    folder = _write_folder(tmp_path / "x", m, state=state)
    with pytest.raises(CheckpointError, match=r"missing key\(s\).*model\.transformer\.ln_f\.weight"):
        load_backbone(folder)


def test_wrong_shape_is_named(tmp_path):
    m = _model()
    state = dict(m.state_dict())
    state["model.transformer.blocks.1.k_proj.weight"] = torch.zeros(5, m.cfg.d_model)
    folder = _write_folder(tmp_path / "x", m, state=state)
    with pytest.raises(CheckpointError, match=r"model\.transformer\.blocks\.1\.k_proj\.weight has shape \(5, 32\)"):
        load_backbone(folder)


def test_config_without_mask_token_id(tmp_path):
    folder = _write_folder(tmp_path / "x", _model(), mask_token_id=_DROP)
    with pytest.raises(CheckpointError, match="mask_token_id"):
        load_backbone(folder)


@pytest.mark.parametrize("override, match", [
    ({"alibi": True}, "alibi=True is not supported"),
    ({"block_type": "sequential"}, "block_type='sequential' is not supported"),
    ({"layer_norm_type": "default"}, "layer_norm_type"),
    ({"d_model": _DROP}, "d_model"),
])
def test_unsupported_or_incomplete_config(tmp_path, override, match):
    folder = _write_folder(tmp_path / "x", _model(), **override)
    with pytest.raises(CheckpointError, match=match):
        load_backbone(folder)


def test_pickle_only_folder_mentions_safetensors(tmp_path):
    m = _model()
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_llada_config_json(m.cfg)))
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_backbone(folder)


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_backbone(tmp_path / "nowhere")


def test_max_length_is_the_configured_context():
    assert _model(max_sequence_length=16).max_length == 16


def test_special_token_validation():
    with pytest.raises(ValueError, match="pad id"):
        SpecialTokens(mask=5, eos=4, pad=5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        LLaDABackbone(tiny_llada_config(V, mask_token_id=V + 3))


# -- dispatch ---------------------------------------------------------------------------------------------------
def test_load_backbone_dispatches_on_model_type(tmp_path):
    folder = _write_folder(tmp_path / "llada", _model())
    assert type(load_backbone(folder)) is LLaDABackbone
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"model_type": "no-such-model-type"}))
    write_safetensors({"w": torch.zeros(1)}, odd)
    with pytest.raises(CheckpointError, match="no-such-model-type"):
        load_backbone(odd)


def test_model_type_mismatch_is_refused(tmp_path):
    folder = _write_folder(tmp_path / "x", _model(), model_type="Dream")
    with pytest.raises(CheckpointError, match="expected 'llada'"):
        LLaDABackbone.from_pretrained(folder)


def test_output_embeddings_is_the_untied_head_or_wte():
    from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config

    untied = LLaDABackbone(tiny_llada_config(64))
    assert untied.output_embeddings() is untied.model.transformer.ff_out
    cfg = tiny_llada_config(64)
    cfg.weight_tying = True
    tied = LLaDABackbone(cfg)
    assert tied.output_embeddings() is tied.input_embeddings()
