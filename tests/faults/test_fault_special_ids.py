"""A tokenizer from another model whose special ids contradict the model's: the 3-topic toy world's tokenizer
(144 tokens, mask 143, eos 139) given with `--tokenizer` to the shipped 4-topic model (mask 176, eos 172). Its
prompt ids and the model's stop ids mean different tokens, so generation ran, exited 0 and wrote an empty response
as a valid record. `loading.open_model`, which every entry point opens models through, now refuses at load with one
line naming both ids (exit 2), before anything is sampled or written. A tokenizer whose special ids all match is
accepted, also when the model's embedding table has rows past the tokenizer's last token (LLaDA's and Dream's
padding)."""

from __future__ import annotations

import json

import pytest
import torch
from faults_helpers import GENERATE_SAMPLING, error_lines
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dsl_llada.core.backbones import LLaDABackbone, save_backbone, tiny_llada_config
from dsl_llada.cli.main import main
from dsl_llada.errors import CheckpointError
from dsl_llada.core.loading import open_model
from dsl_llada.core.model_source import ModelSource
from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids
from dsl_llada.toy.tokenizer import special_tokens
from dsl_llada.toy import words as W
from dsl_llada.toy.shipped import shipped_dir

WORLD3 = ToyWorld(ToyWorldConfig(n_topics=3))
WORLD4 = ToyWorld(ToyWorldConfig(n_topics=4))  # the shipped model's world


def word_level(vocab: dict[str, int], **named: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `vocab` whose special-token roles are exactly `named` (e.g. eos_token=...)."""
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=W.UNK))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=W.UNK, **named)


def save(tok: PreTrainedTokenizerFast, folder) -> str:
    tok.save_pretrained(str(folder))
    return str(folder)


def source(tokenizer: str, model: str | None = None) -> ModelSource:
    return ModelSource(path=model or str(shipped_dir()), tokenizer=tokenizer, device="cpu", dtype="float32")


def test_the_shipped_model_names_the_four_topic_ids():
    cfg = json.loads((shipped_dir() / "config.json").read_text())
    assert (cfg["mask_token_id"], cfg["eos_token_id"], cfg["eot_token_id"], cfg["pad_token_id"]) == (176, 172, 173, 172)
    assert (WORLD3.vocab_size, special_ids(build_tokenizer(WORLD3))["mask"]) == (144, 143)


def test_generate_refuses_another_worlds_tokenizer_and_writes_nothing(tmp_path, capsys):
    tok = save(build_tokenizer(WORLD3), tmp_path / "tok3")
    out = tmp_path / "out.jsonl"
    rc = main(["generate", "--model", str(shipped_dir()), "--tokenizer", tok, "--prompt", "tell me about the ocean",
               "--device", "cpu", "--output", str(out), *GENERATE_SAMPLING])
    err = capsys.readouterr()
    assert rc == 2 and err.out == ""
    (line,) = error_lines(err.err)
    assert line.startswith(f"error: the tokenizer in {tok!r} does not match the model in "), line
    for role, theirs, ours in (("mask", 143, 176), ("eos", 139, 172), ("end-of-turn", 140, 173), ("pad", 139, 172)):
        assert f"tokenizer {role} id {theirs} != model {role} id {ours}" in line, line
    assert line.endswith("use the model's own tokenizer (--tokenizer)"), line
    assert not out.exists() and not (tmp_path / "out.jsonl.config.json").exists()


def test_generate_accepts_the_models_own_tokenizer(tmp_path, capsys):
    tok = save(build_tokenizer(WORLD4), tmp_path / "tok4")
    out = tmp_path / "out.jsonl"
    rc = main(["generate", "--model", str(shipped_dir()), "--tokenizer", tok, "--prompt", "tell me about the ocean",
               "--device", "cpu", "--output", str(out), *GENERATE_SAMPLING])
    assert rc == 0, capsys.readouterr().err
    (record,) = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert record["index"] == 0 and record["prompt"] == "tell me about the ocean"


def swapped(vocab: dict[str, int], a: str, b: str) -> dict[str, int]:
    out = dict(vocab)
    out[a], out[b] = vocab[b], vocab[a]
    return out


ROLES = {"mask_token": W.MASK, "eos_token": W.EOS, "pad_token": W.EOS}


@pytest.mark.parametrize(("role", "tokenizer", "theirs", "ours"), [
    ("eos", lambda: word_level(dict(WORLD4.token_to_id), **{**ROLES, "eos_token": W.BOS}), 171, 172),
    ("pad", lambda: word_level(dict(WORLD4.token_to_id), **{**ROLES, "pad_token": W.UNK}), 170, 172),
    ("mask", lambda: word_level(dict(WORLD4.token_to_id), **{**ROLES, "mask_token": W.END_HEADER}), 175, 176),
    ("end-of-turn", lambda: word_level(swapped(WORLD4.token_to_id, W.EOT, W.START_HEADER), **ROLES), 174, 173),
], ids=["eos", "pad", "mask", "eot"])
def test_open_model_refuses_each_role_that_disagrees(tmp_path, role, tokenizer, theirs, ours):
    tok = save(tokenizer(), tmp_path / "tok")
    with pytest.raises(CheckpointError) as e:
        open_model(source(tok))
    message = str(e.value)
    assert f"tokenizer {role} id {theirs} != model {role} id {ours}" in message, message
    assert message.count("!=") == 1, message  # only the role that differs is named


def test_open_model_refuses_a_tokenizer_that_lacks_the_models_special_ids(tmp_path):
    """A tokenizer that names no special token cannot disagree by role, but one too small to hold the model's
    special ids is certainly not the model's."""
    words = {w: i for w, i in WORLD3.token_to_id.items() if w not in W.SPECIAL_TOKENS or w == W.UNK}
    tok = save(word_level(words), tmp_path / "tok")
    with pytest.raises(CheckpointError) as e:
        open_model(source(tok))
    assert (f"the model's mask id 176, eos id 172, end-of-turn id 173, pad id 172 are not tokens of the tokenizer "
            f"({len(words)} tokens)") in str(e.value), str(e.value)


def test_a_model_padded_past_its_tokenizer_is_accepted(tmp_path):
    """LLaDA-8B has 126,464 embedding rows for a smaller tokenizer, Dream 152,064: padding rows are legitimate."""
    tok = build_tokenizer(WORLD4)
    s = special_ids(tok)
    cfg = tiny_llada_config(WORLD4.vocab_size + 15, mask_token_id=s["mask"], eos_token_id=s["eos"],
                            eot_token_id=s["eot"], bos_token_id=s["bos"], max_sequence_length=64)
    bb = LLaDABackbone(cfg, special_tokens(tok))
    bb.init_weights(torch.Generator().manual_seed(0), std=0.3)
    save_backbone(bb, tmp_path / "padded")
    tok.save_pretrained(str(tmp_path / "padded"))
    handle = open_model(source(str(tmp_path / "padded"), model=str(tmp_path / "padded")))
    assert (len(handle.tokenizer), handle.model.vocab_size) == (177, 192)
    assert handle.special == special_tokens(tok)


def test_the_shipped_model_opens_with_its_own_worlds_tokenizer(tmp_path):
    handle = open_model(source(save(build_tokenizer(WORLD4), tmp_path / "tok4")))
    assert (handle.special.mask, handle.special.eos, handle.special.eot) == (176, 172, 173)
