"""Tests for the training data pipeline (dsl_llada.train.data / .sft). Hub-free and fast."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dsl_llada.train.data import DataConfig, TokenBlockDataset, collate_blocks, make_dataloader

SPECIALS = ["[UNK]", "[EOS]", "[BOS]", "user", "assistant", "system", ":"]
VOCAB = {w: i for i, w in enumerate(SPECIALS + [f"w{i}" for i in range(300)])}
EOS = VOCAB["[EOS]"]
OFF = len(SPECIALS)  # id of "w0"
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")


def make_tokenizer(chat_template: bool = False) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="[EOS]", unk_token="[UNK]", bos_token="[BOS]")
    if chat_template:
        tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def doc(*nums: int) -> str:
    return " ".join(f"w{n}" for n in nums)


def ids(*nums: int) -> list[int]:
    return [n + OFF for n in nums]


def blocks(ds, n=None) -> list[list[int]]:
    it = iter(ds)
    out = []
    for s in it if n is None else (next(it) for _ in range(n)):
        out.append(s["input_ids"].tolist())
    return out


def cfg(**kw) -> DataConfig:
    kw.setdefault("shuffle_buffer", 0)
    kw.setdefault("block_size", 4)
    return DataConfig(**kw)


def random_docs(n=60, seed=0, max_len=23) -> list[str]:
    rng = np.random.default_rng(seed)
    return [doc(*rng.integers(0, 300, size=int(rng.integers(1, max_len)))) for _ in range(n)]


# ----------------------------------------------------------------------------- packing
def test_exact_packing_with_eos_separator(tok):
    ds = TokenBlockDataset(cfg(), tok, texts=[doc(0, 1, 2), doc(3, 4), doc(5, 6, 7, 8)])
    out = list(ds)
    assert [s["input_ids"].dtype for s in out] == [torch.long] * 3
    assert blocks(ds) == [ids(0, 1, 2) + [EOS], ids(3, 4) + [EOS] + ids(5), ids(6, 7, 8) + [EOS]]
    assert set(out[0]) == {"input_ids"}


def test_no_separator_mode_and_remainder(tok):
    texts = [doc(0, 1, 2), doc(3, 4), doc(5, 6, 7, 8)]
    ds = TokenBlockDataset(cfg(insert_eos_separator=False), tok, texts=texts)
    assert blocks(ds) == [ids(0, 1, 2, 3), ids(4, 5, 6, 7)]  # trailing w8 dropped
    ds = TokenBlockDataset(cfg(insert_eos_separator=False, drop_remainder=False), tok, texts=texts)
    assert blocks(ds) == [ids(0, 1, 2, 3), ids(4, 5, 6, 7), ids(8) + [EOS] * 3]


def test_remainder_carries_over_documents(tok):
    # Five 3-token documents, block 4: per-document grouping would drop everything;
    # carrying the remainder gives 15 // 4 = 3 blocks straddling documents.
    texts = [doc(3 * k, 3 * k + 1, 3 * k + 2) for k in range(5)]
    ds = TokenBlockDataset(cfg(insert_eos_separator=False), tok, texts=texts)
    assert blocks(ds) == [ids(0, 1, 2, 3), ids(4, 5, 6, 7), ids(8, 9, 10, 11)]
    long = TokenBlockDataset(cfg(drop_remainder=False), tok, texts=[doc(*range(10))])  # doc spanning blocks
    assert blocks(long) == [ids(0, 1, 2, 3), ids(4, 5, 6, 7), ids(8, 9) + [EOS, EOS]]


def test_empty_documents_are_skipped_and_no_special_tokens_added(tok):
    ds = TokenBlockDataset(cfg(), tok, texts=["", doc(0, 1), "   \n ", {"text": doc(2)}, {"text": None}])
    assert blocks(ds) == [ids(0, 1) + [EOS] + ids(2)]  # no BOS anywhere, no double EOS


def test_callable_and_raw_tokenizers_with_explicit_eos(tok):
    texts = [doc(0, 1, 2), doc(3, 4)]
    expect = [ids(0, 1, 2) + [EOS], ids(3, 4) + [EOS] * 2]
    fn = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    c = cfg(drop_remainder=False)
    assert blocks(TokenBlockDataset(c, fn, texts=texts, eos_id=EOS)) == expect
    assert blocks(TokenBlockDataset(c, tok.backend_tokenizer, texts=texts, eos_id=EOS)) == expect


# ----------------------------------------------------------------------------- local files
def test_txt_jsonl_files(tok, tmp_path):
    (tmp_path / "a.txt").write_text(f"{doc(0, 1)}\n{doc(2)}\n\n\n{doc(3)}\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": doc(4, 5)}) + "\n\n" + json.dumps({"body": doc(6)}) + "\n")
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")]
    ds = TokenBlockDataset(cfg(files=files, text_field="body", drop_remainder=False), tok)
    # paragraphs: "w0 w1\nw2" and "w3"; then two jsonl records
    assert blocks(ds) == [ids(0, 1, 2) + [EOS], ids(3) + [EOS] + ids(4, 5), [EOS] + ids(6) + [EOS, EOS]]
    whole = TokenBlockDataset(cfg(files=[str(tmp_path / "*.txt")], txt_documents="file", drop_remainder=False), tok)
    assert blocks(whole) == [ids(0, 1, 2, 3), [EOS] * 4]


def test_parquet_file(tok, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [doc(0, 1, 2), doc(3, 4)]}), path)
    assert blocks(TokenBlockDataset(cfg(files=[str(path)]), tok)) == [ids(0, 1, 2) + [EOS]]


def test_missing_optional_packages_give_install_hint(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    ds = TokenBlockDataset(cfg(source="HuggingFaceFW/fineweb-edu", dataset_config="sample-10BT"), tok)
    with pytest.raises(ImportError, match="pip install datasets"):
        next(iter(ds))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "x.parquet").write_bytes(b"")
    with pytest.raises(ImportError, match="pip install pyarrow"):
        next(iter(TokenBlockDataset(cfg(files=[str(tmp_path / "x.parquet")]), tok)))


def test_hf_source_uses_streaming_load_dataset(tok, monkeypatch):
    import types

    calls = []

    def load_dataset(path, name=None, *, split, streaming):
        calls.append((path, name, split, streaming))
        return iter([{"text": doc(0, 1, 2), "id": 0}, {"text": doc(3, 4, 5), "id": 1}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    c = cfg(source="HuggingFaceFW/fineweb-edu", dataset_config="sample-10BT")
    assert blocks(TokenBlockDataset(c, tok)) == [ids(0, 1, 2) + [EOS], ids(3, 4, 5) + [EOS]]
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)]


# ----------------------------------------------------------------------------- sharding / shuffle
@pytest.mark.parametrize("shuffle", [0, 5])
def test_rank_sharding_disjoint_and_covering(tok, shuffle):
    texts = random_docs(80)
    full = blocks(TokenBlockDataset(cfg(block_size=8), tok, texts=texts))
    assert len(full) > 30
    world = 3
    per_rank = [blocks(TokenBlockDataset(cfg(block_size=8, shuffle_buffer=shuffle, seed=1), tok, texts=texts,
                                         rank=r, world_size=world)) for r in range(world)]
    if shuffle == 0:
        for r in range(world):
            assert per_rank[r] == full[r::world]
    seen = [tuple(b) for rb in per_rank for b in rb]
    assert sorted(seen) == sorted(tuple(b) for b in full)  # covering, and disjoint (no duplicates)
    assert len(set(seen)) == len(seen) == len(full)


def test_shuffle_deterministic_per_seed(tok):
    texts = random_docs(80)
    base = blocks(TokenBlockDataset(cfg(block_size=8), tok, texts=texts))
    a = blocks(TokenBlockDataset(cfg(block_size=8, shuffle_buffer=6, seed=7), tok, texts=texts))
    a2 = blocks(TokenBlockDataset(cfg(block_size=8, shuffle_buffer=6, seed=7), tok, texts=texts))
    b = blocks(TokenBlockDataset(cfg(block_size=8, shuffle_buffer=6, seed=8), tok, texts=texts))
    assert a == a2 and a != b and a != base
    assert sorted(map(tuple, a)) == sorted(map(tuple, base)) == sorted(map(tuple, b))


def test_repeat_reshuffles_each_epoch_and_iter_restarts(tok):
    texts = random_docs(30)
    ds = TokenBlockDataset(cfg(block_size=8, shuffle_buffer=4, repeat=True), tok, texts=texts)
    n = len(blocks(TokenBlockDataset(cfg(block_size=8), tok, texts=texts)))
    two = blocks(ds, 2 * n)
    assert sorted(map(tuple, two[:n])) == sorted(map(tuple, two[n:])) and two[:n] != two[n:]
    assert blocks(ds, 5) == two[:5]  # a new iteration (no pending resume) starts over


def test_validation_holdout_partitions_documents(tok):
    texts = [doc(k) for k in range(10)]
    c = dict(block_size=2, insert_eos_separator=False, validation_every=4)
    train = blocks(TokenBlockDataset(cfg(**c), tok, texts=texts))
    val = blocks(TokenBlockDataset(cfg(subset="validation", **c), tok, texts=texts))
    assert val == [ids(0, 4)]  # docs 0, 4, 8 held out (8 is the dropped remainder)
    assert train == [ids(1, 2), ids(3, 5), ids(6, 7)]


# ----------------------------------------------------------------------------- resume
def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("n", [0, 1, 3, 9, 17, 30, 45, 52])
@pytest.mark.parametrize("shuffle,repeat", [(0, False), (8, False), (8, True)])
def test_resume_is_exact(tok, n, shuffle, repeat):
    # 49 blocks per epoch on this rank: n=45 resumes while draining the shuffle buffer,
    # n=52 resumes in the second epoch (repeat) or at the very end (no repeat).
    texts = random_docs(40, seed=3, max_len=40)  # some documents span several blocks
    c = cfg(block_size=8, shuffle_buffer=shuffle, seed=5, repeat=repeat)
    total = 80 if repeat else None
    full = blocks(TokenBlockDataset(c, tok, texts=texts, rank=1, world_size=2), total)
    assert len(full) >= 49
    n = min(n, len(full))
    first = TokenBlockDataset(c, tok, texts=texts, rank=1, world_size=2)
    assert blocks(first, n) == full[:n]
    state = _roundtrip(first.state_dict())
    fresh = TokenBlockDataset(c, tok, texts=list(texts), rank=1, world_size=2)
    fresh.load_state_dict(state)
    rest = blocks(fresh) if not repeat else blocks(fresh, 80 - n)
    assert rest == full[n:]


def test_resume_through_dataloader(tok):
    texts = random_docs(60, seed=4)
    c = cfg(block_size=8, shuffle_buffer=5)
    ref = [b["input_ids"] for b in make_dataloader(c, tok, batch_size=3, texts=texts)]
    loader = make_dataloader(c, tok, batch_size=3, texts=texts)
    it = iter(loader)
    for k in range(4):
        assert torch.equal(next(it)["input_ids"], ref[k])
    state = loader.dataset.state_dict()
    loader2 = make_dataloader(c, tok, batch_size=3, texts=texts)
    loader2.dataset.load_state_dict(state)
    rest = [b["input_ids"] for b in loader2]
    assert len(rest) == len(ref) - 4 and all(torch.equal(a, b) for a, b in zip(rest, ref[4:]))
    assert ref[0].shape == (3, 8) and ref[0].dtype == torch.long


def test_resume_rejects_changed_settings(tok):
    texts = random_docs(10)
    state = TokenBlockDataset(cfg(block_size=8, seed=1), tok, texts=texts).state_dict()
    other = TokenBlockDataset(cfg(block_size=8, seed=2), tok, texts=texts, rank=1, world_size=2)
    with pytest.raises(ValueError, match=r"seed: saved 1, now 2.*rank: saved 0, now 1"):
        other.load_state_dict(state)


# ----------------------------------------------------------------------------- SFT
def test_sft_padding_and_prompt_length():
    tok = make_tokenizer(chat_template=True)
    recs = [{"prompt": doc(1, 2), "response": doc(3)},
            {"messages": [{"role": "system", "content": doc(9)}, {"role": "user", "content": doc(4)},
                          {"role": "assistant", "content": doc(5, 6)}]}]
    c = cfg(format="sft", block_size=12)
    loader = make_dataloader(c, tok, batch_size=2, texts=recs)
    (batch,) = list(loader)
    u, a, s, col = VOCAB["user"], VOCAB["assistant"], VOCAB["system"], VOCAB[":"]
    p0 = [u, col] + ids(1, 2) + [a, col]
    p1 = [s, col] + ids(9) + [u, col] + ids(4) + [a, col]
    assert batch["prompt_length"].tolist() == [len(p0), len(p1)]
    assert batch["input_ids"].tolist() == [p0 + ids(3) + [EOS] * (12 - len(p0) - 1),
                                           p1 + ids(5, 6) + [EOS] * (12 - len(p1) - 2)]


def test_sft_render_override_overflow_and_truncate(tmp_path):
    tok = make_tokenizer(chat_template=False)
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"prompt": doc(1), "response": doc(*range(10, 20))}) + "\n")
    render = lambda msgs: " ".join(m["content"] for m in msgs)  # noqa: E731
    with pytest.raises(ValueError, match=r"response has 10 tokens but block_size=8 minus prompt 1 .* room for 6"):
        list(TokenBlockDataset(cfg(format="sft", block_size=8, files=[str(path)]), tok, render_prompt=render))
    ds = TokenBlockDataset(cfg(format="sft", block_size=8, files=[str(path)], sft_overflow="truncate"), tok,
                           render_prompt=render)
    (s,) = list(ds)
    assert s["input_ids"].tolist() == ids(1) + ids(10, 11, 12, 13, 14, 15) + [EOS] and s["prompt_length"] == 1
    with pytest.raises(ValueError, match="no chat_template; pass render_prompt"):
        list(TokenBlockDataset(cfg(format="sft", files=[str(path)]), tok))
    with pytest.raises(ValueError, match="prompt has 2 tokens but block_size=3"):
        list(TokenBlockDataset(cfg(format="sft", block_size=3), tok, texts=[{"prompt": doc(1, 2), "response": "w3"}],
                               render_prompt=render))
    with pytest.raises(ValueError, match=r"texts\[0\].*'prompt' and 'response'"):
        list(TokenBlockDataset(cfg(format="sft"), tok, texts=[{"question": "w1"}], render_prompt=render))


def test_sft_sharding_and_resume():
    tok = make_tokenizer(chat_template=True)
    recs = [{"prompt": doc(k), "response": doc(k + 1, k + 2)} for k in range(20)]
    c = cfg(format="sft", block_size=10, shuffle_buffer=4)
    full = [(s["input_ids"].tolist(), s["prompt_length"]) for s in TokenBlockDataset(c, tok, texts=recs, rank=0,
                                                                                     world_size=2)]
    assert len(full) == 10 and {tuple(x) for x, _ in full} == {
        tuple(s["input_ids"].tolist()) for s in TokenBlockDataset(cfg(format="sft", block_size=10), tok,
                                                                  texts=recs[::2])}
    ds = TokenBlockDataset(c, tok, texts=recs, rank=0, world_size=2)
    it = iter(ds)
    [next(it) for _ in range(3)]
    again = TokenBlockDataset(c, tok, texts=recs, rank=0, world_size=2)
    again.load_state_dict(_roundtrip(ds.state_dict()))
    assert [(s["input_ids"].tolist(), s["prompt_length"]) for s in again] == full[3:]
    assert collate_blocks([{"input_ids": torch.zeros(4, dtype=torch.long), "prompt_length": 2}])[
        "prompt_length"].tolist() == [2]


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw,match", [
    (dict(block_size=1), r"block_size must be an int >= 2, got 1"),
    (dict(block_size=4096, max_context=2048), r"block_size=4096 exceeds max_context=2048"),
    (dict(format="chat"), r"format='chat' is not valid; expected one of \['text', 'sft'\]"),
    (dict(files=["data.csv"]), r"unsupported file type '.csv' for 'data.csv'; valid: \['.txt', '.jsonl', '.parquet'\]"),
    (dict(files=["a.txt"], source="x/y"), r"either source='x/y'.*or files"),
    (dict(subset="validation"), r"needs validation_every"),
    (dict(shuffle_buffer=-1), r"shuffle_buffer must be an int >= 0, got -1"),
    (dict(format="sft", files=["a.txt"]), r"format='sft' needs structured records"),
])
def test_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_config_roundtrip_and_unknown_keys():
    c = DataConfig(files=["a.jsonl"], block_size=16, validation_every=100)
    assert DataConfig.from_dict(c.to_dict()) == c
    assert DataConfig().block_size == 2048 and DataConfig().shuffle_buffer == 10_000
    with pytest.raises(ValueError, match=r"unknown DataConfig field\(s\) \['blocksize'\]"):
        DataConfig.from_dict({"blocksize": 3})


def test_empty_dataset_errors(tok, tmp_path):
    with pytest.raises(ValueError, match=r"dataset produced no tokens: texts= \(2 records\)"):
        list(TokenBlockDataset(cfg(), tok, texts=["", "  \n"]))
    with pytest.raises(ValueError, match=r"rank 2 of world_size=3 received no blocks.*gave 2 block\(s\)"):
        list(TokenBlockDataset(cfg(), tok, texts=[doc(*range(9))], rank=2, world_size=3))
    (tmp_path / "e.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="dataset produced no tokens"):
        list(TokenBlockDataset(cfg(files=[str(tmp_path / "e.txt")], repeat=True), tok))
    with pytest.raises(ValueError, match="dataset produced no examples"):
        list(TokenBlockDataset(cfg(format="sft"), tok, texts=[], render_prompt=str))


def test_source_and_tokenizer_errors(tok, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "w1"}) + "\n" + json.dumps({"content": "w2"}) + "\n")
    with pytest.raises(ValueError, match=rf"{path} line 2: missing text field 'text' \(keys present: \['content'\]\)"):
        list(TokenBlockDataset(cfg(files=[str(path)]), tok))
    path.write_text('{"text": "w1"\n')
    with pytest.raises(ValueError, match=rf"{path} line 1: invalid JSON"):
        list(TokenBlockDataset(cfg(files=[str(path)]), tok))
    with pytest.raises(FileNotFoundError, match="no such file"):
        TokenBlockDataset(cfg(files=[str(tmp_path / "nope.txt")]), tok)
    with pytest.raises(ValueError, match="give exactly one data source.*got none"):
        TokenBlockDataset(cfg(), tok)
    no_eos = lambda s: [1, 2]  # noqa: E731
    with pytest.raises(ValueError, match="no EOS id.*insert_eos_separator=True needs one"):
        TokenBlockDataset(cfg(), no_eos, texts=["x"])
    assert blocks(TokenBlockDataset(cfg(block_size=2, insert_eos_separator=False), no_eos, texts=["x"])) == [[1, 2]]
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\] for world_size=2, got 2"):
        TokenBlockDataset(cfg(), tok, texts=["w1"], rank=2, world_size=2)
    with pytest.raises(TypeError, match="tokenizer must be"):
        TokenBlockDataset(cfg(), object(), texts=["w1"])
    with pytest.raises(ValueError, match="num_workers must be 0"):
        make_dataloader(cfg(), tok, batch_size=2, texts=["w1"], num_workers=2)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        make_dataloader(cfg(), tok, batch_size=0, texts=["w1"])
