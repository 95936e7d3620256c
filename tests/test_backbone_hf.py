"""Generic transformers backbones (HFBackbone) and Dream-v0 (DreamBackbone) on tiny random models, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import (  # noqa: E402
    LlamaConfig, LlamaForCausalLM, ModernBertConfig, ModernBertForMaskedLM, Qwen2Config, Qwen2ForCausalLM,
    RobertaConfig, RobertaForMaskedLM)

from dsl_llada.core.backbones import CheckpointError, SpecialTokens, load_backbone  # noqa: E402
from dsl_llada.core.backbones.hf import (  # noqa: E402
    DreamBackbone, HFBackbone, bidirectional_additive_mask, load_hf_backbone)
from dsl_llada.core.checkpoint import checkpoint_files, read_tensors, write_safetensors  # noqa: E402

V, H = 64, 32
MASK, EOS = 63, 62
TOL = 1e-5


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial weights everywhere (biases and norms too), so every tensor matters to the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "LayerNorm.weight" in name or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def _llama_config(**kw) -> LlamaConfig:
    base = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=V, max_position_embeddings=128, eos_token_id=EOS, bos_token_id=1, pad_token_id=None)
    base.update(kw)
    return LlamaConfig(**base)


def _qwen2_config(**kw) -> Qwen2Config:
    base = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=V, max_position_embeddings=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS)
    base.update(kw)
    return Qwen2Config(**base)


def _save(model: torch.nn.Module, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))  # transformers 5.x writes safetensors only
    assert (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists()
    return folder


def _bidirectional_reference(model: torch.nn.Module, e: torch.Tensor) -> torch.Tensor:
    """The raw transformers model, fully bidirectional through an explicit all-zeros 4-D mask."""
    B, L, _ = e.shape
    with torch.no_grad():
        return model(inputs_embeds=e, attention_mask=torch.zeros(B, 1, L, L), use_cache=False).logits


def _ids(B: int = 2, L: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, 60, (B, L), generator=torch.Generator().manual_seed(seed))


def _later_token_changes_earlier(bb, ids: torch.Tensor) -> float:
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 7) % 60 + 2
    with torch.no_grad():
        a, b = bb(bb.embed(ids)), bb(bb.embed(ids2))
    return float((a[:, 0] - b[:, 0]).abs().max())


def _padding_gap(bb, n_pad: int = 3, pad_id: int = EOS) -> float:
    ids = _ids(1, 8)
    padded = torch.cat([torch.full((1, n_pad), pad_id), ids], dim=1)
    mask = torch.cat([torch.zeros(1, n_pad, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        ref = bb(bb.embed(ids))
        out = bb(bb.embed(padded), mask)
        # an all-ones mask is the same as no mask
        ones = bb(bb.embed(ids), torch.ones_like(ids))
    assert float((ones - ref).abs().max()) < TOL
    return float((out[:, n_pad:] - ref).abs().max())


# -- decoder LMs made bidirectional ---------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decoder_lm_loads_bidirectional_and_matches_reference(tmp_path, family):
    cfg = _llama_config() if family == "llama" else _qwen2_config()
    cls = LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM
    torch.manual_seed(0)
    ref_model = _randomise(cls(cfg))
    folder = _save(ref_model, tmp_path / family)

    bb = load_backbone(folder, special=SpecialTokens(mask=MASK, eos=EOS))
    assert type(bb) is HFBackbone and bb.kind == "causal"
    assert bb.vocab_size == V and bb.hidden_size == H and bb.max_length == 128
    assert bb.config.is_causal is False
    # keys are exactly the checkpoint's keys (unprefixed)
    assert set(bb.state_dict()) == set(checkpoint_files(folder))
    assert {n for n, _ in bb.named_parameters()} == set(checkpoint_files(folder))

    ids = _ids()
    with torch.no_grad():
        out = bb(bb.embed(ids))
    ref = _bidirectional_reference(ref_model, ref_model.get_input_embeddings()(ids))
    assert out.shape == (2, 10, V)
    assert float((out - ref).abs().max()) < TOL

    # bidirectional: a LATER token changes the logits at an EARLIER position ...
    assert _later_token_changes_earlier(bb, ids) > 1e-4
    # ... which the stock causal model does not do (so the check above means something)
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 7) % 60 + 2
    with torch.no_grad():
        emb = ref_model.get_input_embeddings()
        c1 = cls(cfg).eval()
        c1.load_state_dict(ref_model.state_dict())
        a, b = c1(inputs_embeds=emb(ids)).logits, c1(inputs_embeds=emb(ids2)).logits
    assert float((a[:, 0] - b[:, 0]).abs().max()) == 0.0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decoder_lm_left_padding_invariance(tmp_path, family):
    cfg = _llama_config() if family == "llama" else _qwen2_config()
    cls = LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM
    torch.manual_seed(0)
    folder = _save(_randomise(cls(cfg)), tmp_path / family)
    bb = load_hf_backbone(folder, special=SpecialTokens(mask=MASK, eos=EOS))
    assert _padding_gap(bb) < TOL


def test_decoder_lm_without_mask_id_needs_explicit_special(tmp_path):
    folder = _save(_randomise(LlamaForCausalLM(_llama_config())), tmp_path / "llama")
    with pytest.raises(CheckpointError, match=r"no mask token id.*pass special=SpecialTokens"):
        load_backbone(folder)


def test_tied_embeddings_load_and_state_dict_matches_checkpoint(tmp_path):
    torch.manual_seed(0)
    ref_model = _randomise(LlamaForCausalLM(_llama_config(tie_word_embeddings=True)))
    ref_model.tie_weights()
    folder = _save(ref_model, tmp_path / "tied")
    assert "lm_head.weight" not in checkpoint_files(folder)
    bb = load_backbone(folder, special=SpecialTokens(mask=MASK, eos=EOS))
    assert set(bb.state_dict()) == set(checkpoint_files(folder))
    assert bb.lm_head.weight is bb.input_embeddings().weight
    ids = _ids()
    with torch.no_grad():
        out = bb(bb.embed(ids))
    ref = _bidirectional_reference(ref_model, ref_model.get_input_embeddings()(ids))
    assert float((out - ref).abs().max()) < TOL


def test_backbone_round_trip_keeps_keys_logits_and_mask_id(tmp_path):
    """What DSLModel.save_pretrained writes (config_dict + state_dict) loads back to the same backbone."""
    torch.manual_seed(0)
    folder = _save(_randomise(Qwen2ForCausalLM(_qwen2_config())), tmp_path / "src")
    bb = load_backbone(folder, special=SpecialTokens(mask=MASK, eos=EOS))
    out_dir = tmp_path / "dst"
    out_dir.mkdir()
    (out_dir / "config.json").write_text(json.dumps(bb.config_dict()))
    write_safetensors(bb.state_dict(), out_dir, max_shard_bytes=20_000)
    assert (out_dir / "model.safetensors.index.json").exists()
    bb2 = load_backbone(out_dir)  # the mask id now travels in config.json
    assert bb2.special.mask == MASK and bb2.special.eos == EOS
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(bb(bb.embed(ids)), bb2(bb2.embed(ids)))


def test_unknown_and_missing_keys_are_reported(tmp_path):
    folder = _save(_randomise(LlamaForCausalLM(_llama_config())), tmp_path / "m")
    sp = SpecialTokens(mask=MASK, eos=EOS)
    state = read_tensors(folder)

    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "config.json").write_text((folder / "config.json").read_text())
    write_safetensors({**state, "noise_embed.weight": torch.zeros(V, 4), "stray.tensor": torch.zeros(1)}, extra)
    with pytest.raises(CheckpointError, match="stray.tensor"):
        load_backbone(extra, special=sp)
    bb = load_backbone(extra, special=sp, extra_keys_ok=("noise_embed.", "stray."))
    assert "noise_embed.weight" not in bb.state_dict()

    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "config.json").write_text((folder / "config.json").read_text())
    write_safetensors({k: v for k, v in state.items() if k != "model.norm.weight"}, missing)
    with pytest.raises(CheckpointError, match=r"missing key\(s\).*model\.norm\.weight"):
        load_backbone(missing, special=sp)

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((folder / "config.json").read_text())
    write_safetensors({**state, "model.norm.weight": torch.ones(H + 1)}, bad)
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight has shape \(33,\)"):
        load_backbone(bad, special=sp)


def test_pickle_only_folder_is_refused(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    _llama_config().save_pretrained(str(folder))
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_backbone(folder, special=SpecialTokens(mask=MASK, eos=EOS))


def test_additive_mask_shape_and_values():
    m = bidirectional_additive_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]), 2, 3, torch.float32, torch.device("cpu"))
    assert m.shape == (2, 1, 3, 3)
    neg = torch.finfo(torch.float32).min
    assert torch.equal(m[0, 0], torch.tensor([[neg, 0.0, 0.0]] * 3))
    assert torch.equal(m[1], torch.zeros(1, 3, 3))
    assert torch.equal(bidirectional_additive_mask(None, 2, 3, torch.float32, torch.device("cpu")), torch.zeros(2, 1, 3, 3))
    with pytest.raises(ValueError, match="attention_mask"):
        bidirectional_additive_mask(torch.ones(2, 4), 2, 3, torch.float32, torch.device("cpu"))


# -- masked LMs ---------------------------------------------------------------------------------------
def _write_tokenizer_config(folder: Path, tokens: dict[int, str], **roles: str) -> None:
    dec = {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                    "single_word": False} for i, t in tokens.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": dec, **roles}))


def test_roberta_masked_lm(tmp_path):
    cfg = RobertaConfig(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=V,
                        max_position_embeddings=40, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    ref_model = _randomise(RobertaForMaskedLM(cfg))
    folder = _save(ref_model, tmp_path / "roberta")
    _write_tokenizer_config(folder, {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>", MASK: "<mask>"},
                            mask_token="<mask>", pad_token="<pad>", eos_token="</s>", bos_token="<s>")
    bb = load_backbone(folder)
    assert type(bb) is HFBackbone and bb.kind == "masked"
    assert bb.special.mask == MASK and bb.special.eos == 2 and bb.special.pad == 1 and bb.special.bos == 0
    assert set(bb.state_dict()) == set(checkpoint_files(folder))
    assert bb.max_length == 40 - 2  # fairseq positions start at pad_token_id + 1
    assert not bb.training  # dropout off after loading

    ids = _ids()
    with torch.no_grad():
        out = bb(bb.embed(ids))
        ref = ref_model(inputs_embeds=ref_model.get_input_embeddings()(ids)).logits
    assert float((out - ref).abs().max()) < TOL
    assert _later_token_changes_earlier(bb, ids) > 1e-4
    assert _padding_gap(bb, pad_id=1) < TOL


def test_modernbert_masked_lm(tmp_path):
    cfg = ModernBertConfig(hidden_size=H, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                           vocab_size=V, max_position_embeddings=64, pad_token_id=0, mask_token_id=MASK,
                           bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2,
                           local_attention=4)
    torch.manual_seed(0)
    ref_model = _randomise(ModernBertForMaskedLM(cfg))
    folder = _save(ref_model, tmp_path / "modernbert")
    bb = load_backbone(folder)
    assert bb.kind == "masked" and bb.special.mask == MASK and bb.special.eos == 2
    assert set(bb.state_dict()) == set(checkpoint_files(folder))
    ids = _ids(2, 12)
    with torch.no_grad():
        out = bb(bb.embed(ids))
        ref = ref_model(inputs_embeds=ref_model.get_input_embeddings()(ids)).logits
    assert float((out - ref).abs().max()) < TOL  # local-window layers keep their window (no 4-D mask override)
    assert _later_token_changes_earlier(bb, ids) > 1e-4
    assert _padding_gap(bb, pad_id=0) < TOL


# -- Dream ---------------------------------------------------------------------------------------------
DREAM_MASK, DREAM_EOS = 63, 60


def _dream_folder(tmp_path: Path, *, tie: bool = False, **overrides) -> tuple[Path, Qwen2ForCausalLM, Qwen2Config]:
    """A tiny Dream-v0 folder: Dream's config.json field names, Dream's key names, sharded safetensors."""
    fields = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=V, max_position_embeddings=256, rope_theta=1_000_000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=tie)
    qcfg = Qwen2Config(**fields)
    torch.manual_seed(0)
    raw = _randomise(Qwen2ForCausalLM(qcfg))
    raw.config.is_causal = False  # the raw reference: bidirectional, no shift
    dream_cfg = {"architectures": ["DreamModel"], "model_type": "Dream",
                 "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
                 **fields, "hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False,
                 "sliding_window": None, "max_window_layers": 2, "use_mrope": False, "rope_scaling": None,
                 "use_cache": True, "initializer_range": 0.02, "mask_token_id": DREAM_MASK,
                 "pad_token_id": DREAM_EOS, "bos_token_id": DREAM_EOS, "eos_token_id": DREAM_EOS,
                 "torch_dtype": "bfloat16", "transformers_version": "4.46.2"}
    dream_cfg.update(overrides)
    folder = tmp_path / "dream"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dream_cfg))
    state = {k: v for k, v in raw.state_dict().items() if not (tie and k == "lm_head.weight")}
    write_safetensors(state, folder, max_shard_bytes=30_000)
    _write_tokenizer_config(folder, {DREAM_EOS: "<|endoftext|>", 61: "<|im_start|>", 62: "<|im_end|>",
                                     DREAM_MASK: "<|mask|>"}, eos_token="<|endoftext|>", mask_token="<|mask|>")
    return folder, raw, qcfg


def test_dream_keys_and_special_tokens(tmp_path):
    folder, raw, _ = _dream_folder(tmp_path)
    assert "model.layers.0.self_attn.k_proj.bias" in checkpoint_files(folder)
    assert (folder / "model.safetensors.index.json").exists()
    bb = load_backbone(folder)
    assert type(bb) is DreamBackbone and bb.family == "dream"
    assert set(bb.state_dict()) == set(checkpoint_files(folder)) == set(raw.state_dict())
    assert bb.special == SpecialTokens(mask=DREAM_MASK, eos=DREAM_EOS, eot=62, pad=DREAM_EOS, bos=DREAM_EOS)
    assert bb.config.rope_parameters["rope_theta"] == 1_000_000.0
    assert bb.config.num_key_value_heads == 2
    assert bb.config_dict()["model_type"] == "Dream"
    assert bb.max_length == 256


def test_dream_undoes_the_logit_shift(tmp_path):
    folder, raw, _ = _dream_folder(tmp_path)
    bb = load_backbone(folder)
    ids = _ids(2, 9)
    with torch.no_grad():
        out = bb(bb.embed(ids))
        e = raw.get_input_embeddings()(ids)
        r = raw(inputs_embeds=e, use_cache=False).logits  # is_causal=False, no shift
        causal = Qwen2ForCausalLM(raw.config.__class__(**{**raw.config.to_dict(), "is_causal": True})).eval()
        causal.load_state_dict(raw.state_dict())
        rc = causal(inputs_embeds=e, use_cache=False).logits
    assert float((r - rc).abs().max()) > 1e-4  # the raw reference really is bidirectional
    assert float((out[:, 1:] - r[:, :-1]).abs().max()) < TOL  # position i = raw position i-1
    assert float((out[:, 0] - r[:, 0]).abs().max()) < TOL
    assert _later_token_changes_earlier(bb, ids) > 1e-4


def test_dream_left_padding_uses_shifted_positions(tmp_path):
    folder, _, _ = _dream_folder(tmp_path)
    bb = load_backbone(folder)
    assert _padding_gap(bb, n_pad=4, pad_id=DREAM_EOS) < TOL


def test_dream_tied_and_round_trip(tmp_path):
    folder, raw, _ = _dream_folder(tmp_path, tie=True)
    bb = DreamBackbone.from_pretrained(folder)
    assert "lm_head.weight" not in bb.state_dict()
    out_dir = tmp_path / "again"
    out_dir.mkdir()
    (out_dir / "config.json").write_text(json.dumps(bb.config_dict()))
    write_safetensors(bb.state_dict(), out_dir)
    bb2 = load_backbone(out_dir)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(bb(bb.embed(ids)), bb2(bb2.embed(ids)))


def test_dream_in_memory_from_qwen2():
    qcfg = _qwen2_config()
    model = _randomise(Qwen2ForCausalLM(qcfg))
    bb = DreamBackbone(model, SpecialTokens(mask=MASK, eos=EOS))
    assert set(bb.state_dict()) == set(model.state_dict())
    d = bb.config_dict()
    assert d["model_type"] == "Dream" and d["mask_token_id"] == MASK and d["rope_theta"] == 1_000_000.0


@pytest.mark.parametrize("override, match", [
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"use_mrope": True}, "use_mrope"),
    ({"mask_token_id": None}, "mask_token_id"),
])
def test_dream_bad_config(tmp_path, override, match):
    folder, _, _ = _dream_folder(tmp_path, **override)
    with pytest.raises(CheckpointError, match=match):
        load_backbone(folder)


def test_dream_missing_field(tmp_path):
    folder, _, _ = _dream_folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="num_hidden_layers"):
        load_backbone(folder)


def test_dsl_config_records_the_backbone_family_and_refuses_another(tmp_path):
    from dsl_llada.config import ConverterConfig, DSLConfig
    from dsl_llada.core.model import DSLModel

    folder, _, _ = _dream_folder(tmp_path)
    dream = load_backbone(folder)
    model = DSLModel.convert(dream, DSLConfig(converter=ConverterConfig(noise_dim=8)))
    assert model.config.backbone_type == "dream"  # not the LLaDA default of old
    model.save_pretrained(tmp_path / "dsl")
    assert json.loads((tmp_path / "dsl" / "dsl_config.json").read_text())["backbone_type"] == "dream"
    assert DSLModel.from_pretrained(tmp_path / "dsl").config == model.config
    with pytest.raises(CheckpointError, match=r"made for a 'llada' backbone but this backbone is 'dream'"):
        DSLModel.convert(dream, DSLConfig(converter=ConverterConfig(noise_dim=8), backbone_type="llada"))
