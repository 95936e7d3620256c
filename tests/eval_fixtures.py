"""Shared builders for the eval tests: a tiny BPE tokenizer trained at test time on the real evaluation texts, a
tiny LLaDA-architecture backbone and its DSL conversion saved as checkpoint folders, and tiny run configs.

Special ids of the tiny tokenizer (trained first, so they are the lowest ids): 0 <|endoftext|> (EOS/pad),
1 <|mdm_mask|>, 2 <|eot_id|>, 3 <|startoftext|>, 4/5 header markers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsl_llada.core.backbones import save_backbone
from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSLModel

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["<|endoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>"]
CHAT = ("{{ '<|startoftext|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>' "
        "+ m['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>' }}{% endif %}")


DATA_CANDIDATES = (ROOT.parent / "shared" / "data", Path("/work/shared/data"))
"""Where the project's evaluation data (JSONL files; the package ships none) is looked for: beside the checkout,
then the project machine's fixed location."""


def find_data(*names: str) -> Path | None:
    """The first data folder holding every file in `names`, or None."""
    return next((p for p in DATA_CANDIDATES if all((p / n).exists() for n in names)), None)


def data_dir() -> Path:
    """The evaluation data folder (with prompts_200.jsonl); skips the test when it is absent."""
    found = find_data("prompts_200.jsonl")
    if found is None:
        pytest.skip("the evaluation data folder (prompts_200.jsonl) is not present")
    return found


def train_tokenizer(folder: Path, vocab_size: int = 320):
    """A byte-level BPE trained on the WikiText texts and the prompts, saved with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    d = data_dir()
    texts = [json.loads(x)["text"] for x in (d / "wikitext_texts_100.jsonl").read_text().splitlines()]
    texts += [json.loads(x)["prompt"] for x in (d / "prompts_200.jsonl").read_text().splitlines()]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  mask_token="<|mdm_mask|>", bos_token="<|startoftext|>",
                                  additional_special_tokens=["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
                                  model_max_length=4096)
    tok.chat_template = CHAT
    tok.save_pretrained(folder)
    return tok


def make_models(root: Path, *, max_len: int = 2048, seed: int = 0) -> dict[str, Path]:
    """Write root/tok (tokenizer), root/llada (tiny backbone + tokenizer), root/dsl (its DSL conversion)."""
    tok = train_tokenizer(root / "tok")
    V = len(tok)
    import torch

    cfg = tiny_llada_config(V, d_model=32, n_layers=2, mask_token_id=1, eos_token_id=0, eot_token_id=2, bos_token_id=3,
                            max_sequence_length=max_len)
    bb = LLaDABackbone(cfg)
    bb.init_weights(torch.Generator().manual_seed(seed), std=0.3)
    bb.eval()
    save_backbone(bb, root / "llada")
    tok.save_pretrained(root / "llada")
    dsl = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=16))).eval()
    dsl.save_pretrained(root / "dsl")
    tok.save_pretrained(root / "dsl")
    return {"tok": root / "tok", "llada": root / "llada", "dsl": root / "dsl"}


def base_config(models: dict[str, Path], tasks: list[dict], *, methods: list[dict] | None = None, **kw) -> dict:
    """An EvalConfig dict over the tiny models."""
    methods = methods or [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"},
                          {"name": "LLaDA", "model": "llada", "preset": "llada"}]
    # fp32 pinned: the default 'auto' is bf16 on a CPU with native bf16 and fp32 elsewhere, and tests compare values
    return {"models": [{"name": "dsl", "path": str(models["dsl"]), "dtype": "float32"},
                       {"name": "llada", "path": str(models["llada"]), "dtype": "float32"}],
            "methods": methods, "tasks": tasks, "nfe": [4], "seeds": [42], "batch_size": 3, "device": "cpu", **kw}


def make_causal_lm(folder: Path, tok_folder: Path, seed: int = 0) -> Path:
    """A tiny random Llama causal LM over the test tokenizer (AR baseline and GenPPL scorer), saved with it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tok_folder))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                      bos_token_id=3, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def eval_models(tmp_path_factory) -> dict[str, Path]:
    """One set of tiny model folders for every eval test file (import this fixture into the test module)."""
    data_dir()
    root = tmp_path_factory.mktemp("eval-models")
    m = make_models(root)
    m["ar"] = make_causal_lm(root / "ar", m["tok"])
    return m
