"""Tokenizer files travel with every model folder: `convert` copies all of them (the chat template included), and
every checkpoint a training run writes (and its `final/`) loads in `generate` with the tokenizer it was trained on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import toy_backbone_folder

from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.core.checkpoint import TOKENIZER_FILES
from dsl_llada.cli.main import main
from dsl_llada.core.loading import encode_prompt, load_tokenizer
from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids
from dsl_llada.train.builtin_tokenizers import builtin_tokenizer
from dsl_llada.train.components import _byte_encode, _ids_encode
from dsl_llada.train.train_config import TrainConfig
from dsl_llada.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "write about the ocean ."
TEXTS = ["héllo wörld\n\n  two  spaces\tand a tab", "日本語 ✓ — emoji 🙂", "", " leading and trailing "]


@pytest.fixture(scope="module")
def toy_backbone_dir(tmp_path_factory):
    """A tiny random LLaDA over the toy world's vocabulary, saved with the world's tokenizer (and chat template)."""
    return toy_backbone_folder(tmp_path_factory.mktemp("tok") / "backbone")


def test_convert_keeps_every_tokenizer_file_and_the_prompt_ids(toy_backbone_dir, tmp_path, capsys):
    src_files = sorted(p.name for p in toy_backbone_dir.iterdir() if p.name in TOKENIZER_FILES)
    assert "chat_template.jinja" in src_files  # the file the old 4-name list dropped
    out = tmp_path / "dsl"
    assert main(["convert", str(toy_backbone_dir), str(out), "--noise-dim", "8"]) == 0
    for name in src_files:
        assert (out / name).read_bytes() == (toy_backbone_dir / name).read_bytes(), name

    before = encode_prompt(load_tokenizer(toy_backbone_dir), PROMPT)
    after = encode_prompt(load_tokenizer(out), PROMPT)
    raw = encode_prompt(load_tokenizer(out), PROMPT, chat_template=False)
    assert after == before
    assert len(after) > len(raw)  # the template was applied, not silently skipped

    # end to end: the converted model's discrete path is the backbone, so `generate` must give the same tokens
    capsys.readouterr()
    common = ["--prompt", PROMPT, "--sampler", "remask", "--steps", "4", "--gen-length", "8", "-q", "--dtype", "float32"]
    assert main(["generate", "--model", str(toy_backbone_dir), "--output", str(tmp_path / "a.jsonl"), *common]) == 0
    assert main(["generate", "--model", str(out), "--output", str(tmp_path / "b.jsonl"), *common]) == 0
    ids = [json.loads((tmp_path / f).read_text())["response_ids"] for f in ("a.jsonl", "b.jsonl")]
    assert ids[0] == ids[1]


def test_builtin_tokenizers_encode_like_the_trainers_encoders(tmp_path):
    special = SpecialTokens(mask=257, eos=256, pad=256)
    tok = builtin_tokenizer("bytes", 258, special)
    tok.save_pretrained(str(tmp_path / "bytes"))
    loaded = load_tokenizer(tmp_path / "bytes")
    for text in TEXTS:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == _byte_encode(text), text
        assert loaded.decode(ids) == text
    assert (loaded.eos_token_id, loaded.mask_token_id, loaded.pad_token_id) == (256, 257, 256)
    assert loaded.decode([104, 105, 256, 257], skip_special_tokens=True) == "hi"
    with pytest.raises(ValueError, match=r"special ids >= 256"):
        builtin_tokenizer("bytes", 64, SpecialTokens(mask=63, eos=62))

    ids_tok = builtin_tokenizer("ids", 64, SpecialTokens(mask=63, eos=62, eot=61))
    for text in ("1 2  30\n5", "0", "63 62 61 7"):
        assert ids_tok(text, add_special_tokens=False)["input_ids"] == _ids_encode(text)
    assert ids_tok.decode([1, 2, 62], skip_special_tokens=True) == "1 2"


def test_every_checkpoint_and_final_of_a_toy_train_run_has_the_tokenizer(tmp_path, capsys, monkeypatch, one_thread):
    monkeypatch.chdir(ROOT)  # the toy preset's corpus path is relative to the repository root
    out = tmp_path / "toy"
    assert main(["train", "--config", "configs/toy.yaml", f"output_dir={out}", "max_steps=4", "save_every=2",
                 "eval_every=0", "keep_last=null", "data.block_size=32", "per_device_batch_size=2", "-q"]) == 0
    folders = [out / "checkpoint-2", out / "checkpoint-4", out / "final"]
    for folder in folders:
        assert (folder / "tokenizer.json").is_file(), folder
        assert load_tokenizer(folder)(TEXTS[0], add_special_tokens=False)["input_ids"] == _byte_encode(TEXTS[0])
    capsys.readouterr()
    assert main(["generate", "--model", str(out / "final"), "--prompt", "the whale", "--sampler", "sde", "--nfe", "2",
                 "--gen-length", "8", "-q"]) == 0  # no --tokenizer needed
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["index"] == 0 and isinstance(rec["response"], str)


def test_a_tokenizer_object_is_saved_into_checkpoints(tmp_path, one_thread):
    world = ToyWorld(ToyWorldConfig(n_topics=2))
    tok = build_tokenizer(world)
    s = special_ids(tok)
    cfg = TrainConfig(objective="mdm", init_from="scratch", output_dir=str(tmp_path / "run"),
                      scratch_model={"vocab_size": world.vocab_size, "d_model": 16, "n_layers": 1, "n_heads": 2,
                                     "mask_token_id": s["mask"], "eos_token_id": s["eos"]},
                      data={"block_size": 16, "shuffle_buffer": 0, "repeat": True}, max_steps=1, save_every=1,
                      per_device_batch_size=2, eval_every=0, progress=False)
    texts = [" ".join(world.sample_response(0, np.random.default_rng(i))) for i in range(8)]
    train(cfg, tokenizer=tok, texts=texts)
    saved = load_tokenizer(tmp_path / "run" / "final")
    assert encode_prompt(saved, PROMPT) == encode_prompt(tok, PROMPT)
    assert (tmp_path / "run" / "checkpoint-1" / "chat_template.jinja").is_file()
