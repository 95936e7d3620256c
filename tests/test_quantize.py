"""int8 weight-only backbone quantization (torchao) and the weight-memory estimate of `convert --dry-run`."""

from __future__ import annotations

import builtins
import json

import pytest
import torch
from torch import nn

from dsl_llada.core.backbones.llada import LLaDAConfig
from dsl_llada.cli.main import main
from dsl_llada.config import SDEConfig
from dsl_llada.core.quantize import QuantizationUnavailable, memory_estimate, quantize_backbone
from dsl_llada.sampling import PromptBatch, sample_sde
from helpers import tiny_dsl, toy_backbone_folder

LLADA_8B = {"model_type": "llada", "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32,
            "vocab_size": 126464, "mlp_hidden_size": 12288, "weight_tying": False, "max_sequence_length": 4096,
            "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081}


def test_memory_estimate_of_llada_8b():
    cfg = LLaDAConfig.from_hf_dict(LLADA_8B)
    bf16 = memory_estimate(cfg, dtype="bfloat16")
    int8 = memory_estimate(cfg, dtype="bfloat16", quantize="int8")
    fp32 = memory_estimate(cfg, dtype="float32")
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 12288
    backbone = 32 * per_layer + 2 * 126464 * 4096 + (2 * 32 + 1) * 4096  # LLaDA-8B: 8.02 B parameters
    dsl = 126465 * 4096 + 4096 + 126465 + 1 + 126464 * 100
    assert bf16["parameters"] == backbone + dsl
    assert round(backbone / 1e9, 2) == 8.02
    assert bf16["backbone_linear_gib"] == pytest.approx((32 * per_layer + 126464 * 4096) * 2 / 1024 ** 3)
    assert fp32["backbone_linear_gib"] == pytest.approx(2 * bf16["backbone_linear_gib"])
    # int8: one byte per weight plus one fp32 scale per output row
    rows = 32 * (4 * 4096 + 3 * 12288 - 12288 + 4096) + 126464
    assert int8["backbone_linear_gib"] == pytest.approx((32 * per_layer + 126464 * 4096 + 4 * rows) / 1024 ** 3)
    assert 8.5 < int8["total_gib"] < 9.5 < 15.5 < bf16["total_gib"] < 16.5
    with pytest.raises(ValueError, match="quantize='int4' is not valid"):
        memory_estimate(cfg, quantize="int4")


def test_memory_estimate_matches_a_real_model():
    model = tiny_dsl(vocab=200, seed=0, noise_dim=16).to_compute_dtype(torch.bfloat16)
    real = sum(t.numel() * t.element_size() for t in model.full_state_dict().values())
    est = memory_estimate(model.backbone.cfg, noise_dim=16, dtype="bfloat16")
    assert est["total_gib"] * 1024 ** 3 == pytest.approx(real)
    assert est["parameters"] == sum(t.numel() for t in model.full_state_dict().values())


def test_convert_dry_run_prints_the_estimate_and_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "llada8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLADA_8B))
    assert main(["convert", str(folder), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8.55 B parameters" in out and "| bfloat16 + int8 backbone (--quantize int8) |" in out
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.json", "llada8b"]
    assert main(["convert", str(folder)]) == 2  # no output folder and no --dry-run
    assert "needs an OUTPUT folder" in capsys.readouterr().err
    (folder / "config.json").write_text(json.dumps({**LLADA_8B, "model_type": "llama"}))
    assert main(["convert", str(folder), "--dry-run"]) == 2
    assert "model_type='llama'" in capsys.readouterr().err


def test_quantize_refuses_unknown_modes_and_a_missing_torchao(monkeypatch):
    model = tiny_dsl(seed=0)
    with pytest.raises(ValueError, match=r"quantize='int4' is not valid; expected one of \['none', 'int8'\]"):
        quantize_backbone(model, "int4")
    assert quantize_backbone(model, "none") is model
    real_import = builtins.__import__

    def no_torchao(name, *args, **kw):
        if name.startswith("torchao"):
            raise ImportError("No module named 'torchao'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    with pytest.raises(QuantizationUnavailable, match=r"needs torchao \(pip install 'dsl-llada\[quantize\]'"):
        quantize_backbone(model, "int8")


def test_int8_quantizes_the_backbone_linears_only():
    pytest.importorskip("torchao")
    ref = tiny_dsl(seed=0, backbone_kw={"d_model": 64}, std=0.05)
    model = tiny_dsl(seed=0, backbone_kw={"d_model": 64}, std=0.05)
    quantize_backbone(model, "int8")
    linears = [m for m in model.backbone.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * 7 + 1 and all(type(m.weight).__name__ == "Int8Tensor" for m in linears)
    assert type(model.converter.backbone_embedding.weight) is nn.Parameter  # the converter is untouched
    assert type(model.backbone.input_embeddings().weight) is nn.Parameter
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        a, b = ref.logits_from_ids(ids), model.logits_from_ids(ids)
    assert not torch.equal(a, b)  # really quantized
    assert (a - b).abs().max() < 0.05 * a.abs().max()  # per-row int8: close to the fp32 logits
    out = sample_sde(model, PromptBatch.from_lists([[1, 2, 3]], model.special.pad_id),
                     SDEConfig(nfe=4, gen_length=6, top_m=8), generator=torch.Generator().manual_seed(0))
    assert out.ids.shape == (1, 6)


def test_generate_quantize_int8_is_recorded(tmp_path):
    pytest.importorskip("torchao")
    folder = toy_backbone_folder(tmp_path / "bb")
    common = ["generate", "--model", str(folder), "--prompt", "the whale", "--sampler", "remask", "--steps", "2",
              "--gen-length", "4", "-q", "--dtype", "float32"]
    assert main([*common, "--quantize", "int8", "--output", str(tmp_path / "q.jsonl")]) == 0
    assert main([*common, "--output", str(tmp_path / "p.jsonl")]) == 0
    q = json.loads((tmp_path / "q.jsonl.config.json").read_text())
    p = json.loads((tmp_path / "p.jsonl.config.json").read_text())
    assert q["quantize"] == "int8" and "quantize" not in p  # unquantized settings are as before (resumable)
    # resuming a quantized output without --quantize is refused (the settings differ)
    assert main([*common, "--output", str(tmp_path / "q.jsonl")]) == 2
