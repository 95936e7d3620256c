"""Fix/Clean error correction (dsl_llada.eval.fix_clean): hand-checked stubs, tiny seeded models, real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from eval_fixtures import find_data
from helpers import V, perturb_converter, tiny_backbone, tiny_dsl

from dsl_llada.eval import fix_clean as C


class _Special:
    mask, eos, eot, pad, bos = V - 1, V - 2, None, V - 2, None


class Stub(torch.nn.Module):
    """A 'model' whose prediction at every position is a fixed function of the input ids."""

    special = _Special()
    vocab_size = V

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.calls = 0

    def logits_from_ids(self, ids, attention_mask=None):
        self.calls += 1
        return torch.nn.functional.one_hot(self.fn(ids), V).float()


def _texts(n=6):
    return [[(7 * i + 3 * j) % 50 + 1 for j in range(8 + 3 * i)] for i in range(n)]


def test_copy_and_oracle_models_hand_values():
    texts = _texts()
    copy = C.fix_clean_records(Stub(lambda ids: ids), None, texts, rate=0.3, seed=0)
    assert all(r["fix"] == 0.0 and r["clean"] == 1.0 for r in copy)
    # counts: max(1, floor(n * 0.3)) corrupted positions per text
    assert [r["n_corrupted"] for r in copy] == [max(1, int(len(t) * 0.3 + 1e-9)) for t in texts]
    agg = C.aggregate_fix_clean(copy)
    assert agg["fix"] == 0.0 and agg["clean"] == 1.0 and agg["overcorrect"] == 0.0 and agg["selective"] == 0.0
    # an oracle that always outputs the original text fixes everything and keeps everything
    by_len = {len(t): torch.tensor(t) for t in texts}
    oracle = Stub(lambda ids: torch.stack([by_len[ids.shape[1]]] * ids.shape[0]))
    recs = C.fix_clean_records(oracle, None, texts, rate=0.5, seed=0, batch_size=1)
    assert all(r["fix"] == 1.0 and r["clean"] == 1.0 for r in recs)
    assert oracle.calls == len(texts)


def test_aggregate_hand_values():
    recs = [{"fix": 1.0, "clean": 1.0, "n_corrupted": 1, "n_tokens": 4},
            {"fix": 0.5, "clean": 0.5, "n_corrupted": 2, "n_tokens": 6},
            {"fix": None, "clean": 0.75, "n_corrupted": 0, "n_tokens": 4}]
    a = C.aggregate_fix_clean(recs)
    assert a["fix"] == pytest.approx(0.75) and a["clean"] == pytest.approx(0.75)
    assert a["overcorrect"] == pytest.approx(0.25) and a["selective"] == pytest.approx(0.5)
    assert (a["n"], a["n_corrupted"], a["n_tokens"]) == (3, 3, 14)
    with pytest.raises(ValueError):
        C.aggregate_fix_clean([])


def test_per_text_rng_subset_invariance_and_seed_twin():
    texts = _texts()
    full = C.random_token_cases(texts, None, rate=0.3, seed=5, id_range=(0, V), exclude={V - 1, V - 2})
    alone = C.random_token_cases([texts[3]], None, rate=0.3, seed=5, id_range=(0, V), text_ids=[3])
    assert alone[0].corrupted == full[3].corrupted          # a text's corruption ignores the other texts
    other = C.random_token_cases(texts, None, rate=0.3, seed=6, id_range=(0, V))
    assert any(a.corrupted != b.corrupted for a, b in zip(full, other))
    for c in full:
        assert all(x not in (V - 1, V - 2) for x in c.corrupted)   # specials never drawn


def test_batch_size_invariance_tiny_dsl():
    model = perturb_converter(tiny_dsl(seed=3))
    texts = _texts(7)
    for path, gamma in (("discrete", None), ("converter", None), ("converter", 8.0)):
        one = C.fix_clean_records(model, None, texts, rate=0.3, path=path, gamma=gamma, seed=1, batch_size=1)
        four = C.fix_clean_records(model, None, texts, rate=0.3, path=path, gamma=gamma, seed=1, batch_size=4)
        assert [r["predicted_ids"] for r in one] == [r["predicted_ids"] for r in four], (path, gamma)
        assert [r["text_id"] for r in one] == list(range(7))


def test_converter_path_semantics():
    model = perturb_converter(tiny_dsl(seed=4))
    texts = _texts(4)
    ids = torch.tensor([texts[0]])
    want = model.backbone(model.context_embed(ids)).argmax(-1)[0].tolist()
    rec = C.score_cases(model, [C.CorrectionCase(0, tuple(texts[0]), tuple(texts[0]))], path="converter")[0]
    assert rec["predicted_ids"] == want
    # a very high SNR reproduces the clean converter path; a moderate one depends on the noise seed
    clean = C.fix_clean_records(model, None, texts, rate=0.3, path="converter", seed=0)
    hi = C.fix_clean_records(model, None, texts, rate=0.3, path="converter", gamma=1e5, seed=0)
    assert [r["predicted_ids"] for r in hi] == [r["predicted_ids"] for r in clean]
    a = C.fix_clean_records(model, None, texts, rate=0.3, path="converter", gamma=3.0, seed=0)
    b = C.fix_clean_records(model, None, texts, rate=0.3, path="converter", gamma=3.0, seed=0)
    c = C.fix_clean_records(model, None, texts, rate=0.3, path="converter", gamma=3.0, seed=1)
    assert [r["predicted_ids"] for r in a] == [r["predicted_ids"] for r in b]
    same_corruption = [r["corrupted_ids"] for r in a] == [r["corrupted_ids"] for r in c]
    assert not same_corruption or [r["predicted_ids"] for r in a] != [r["predicted_ids"] for r in c]


def test_path_errors():
    bb = tiny_backbone()
    with pytest.raises(ValueError, match="path must be one of"):
        C.fix_clean_records(bb, None, _texts(1), rate=0.1, path="wte")
    with pytest.raises(ValueError, match="needs a DSL model"):
        C.fix_clean_records(bb, None, _texts(1), rate=0.1, path="converter")
    with pytest.raises(ValueError, match="gamma"):
        C.fix_clean_records(bb, None, _texts(1), rate=0.1, gamma=5.0)
    with pytest.raises(ValueError, match="id_range"):
        C.fix_clean_records(bb, None, _texts(1), rate=0.1, id_range=(0, V + 1))
    with pytest.raises(ValueError, match="original has 2 ids but corrupted has 1"):
        C.CorrectionCase(0, (1, 2), (1,))


class WordTok:
    """Whitespace tokenizer over a growing vocabulary (decode joins with spaces)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]


def test_align_pair_and_pair_cases():
    tok = WordTok()
    rows = [{"id": "a", "original": "the cat sat on the mat", "corrupted": "the dog sat on the mat"},
            {"id": "b", "original": "one two three", "corrupted": "one two two three"},     # length change
            {"id": "c", "original": "same text", "corrupted": "same text"}]
    cases, skipped = C.pair_cases(rows, tok)
    assert [c.case_id for c in cases] == ["a"] and skipped == ["b", "c"]
    assert sum(x != y for x, y in zip(cases[0].original, cases[0].corrupted)) == 1
    # authors: positional diff over the common prefix (here 3 tokens; 'three' vs 'two' differs at position 2)
    o, c = C.align_pair([1, 2, 3], [1, 2, 2, 3], mode="authors")
    assert (o, c) == ([1, 2, 3], [1, 2, 2])
    assert C.align_pair([1, 2, 3], [1, 2, 2, 3]) is None
    assert C.align_pair([1, 2, 3, 4], [1, 9, 8, 4]) == ([1, 2, 3, 4], [1, 9, 8, 4])
    with pytest.raises(KeyError, match="no field 'original'"):
        C.pair_cases([{"x": 1}], tok)


def _data() -> Path | None:
    return find_data("semantic_corruption_manual.jsonl")


@pytest.fixture(scope="module")
def wordpiece():
    from transformers import AutoTokenizer

    from dsl_llada.eval.scorers.bertscore import BERTScoreError, local_minilm_dir

    try:
        return AutoTokenizer.from_pretrained(local_minilm_dir())
    except BERTScoreError as e:
        pytest.skip(str(e))


@pytest.mark.skipif(_data() is None, reason="the evaluation data folder is not present")
def test_real_pair_files_with_a_real_tokenizer(wordpiece):
    d = _data()
    manual = [json.loads(x) for x in (d / "semantic_corruption_manual.jsonl").read_text().splitlines() if x]
    cases, skipped = C.pair_cases(manual, wordpiece, original_key="original_text", corrupted_key="corrupted_text")
    assert len(cases) + len(skipped) == 84 and len(cases) >= 60
    assert all(any(a != b for a, b in zip(c.original, c.corrupted)) for c in cases)
    assert {c.meta["corruption_type"] for c in cases} <= {"number_swap", "antonym", "same_category",
                                                           "semantic_neighbor"}
    bench = [json.loads(x) for x in (d / "correction_benchmark_50.jsonl").read_text().splitlines() if x]
    bcases, bskipped = C.pair_cases(bench, wordpiece)
    assert len(bcases) + len(bskipped) == 50 and len(bcases) >= 20


@pytest.mark.skipif(_data() is None, reason="the evaluation data folder is not present")
def test_noisy_edit_cases(wordpiece):
    d = _data()
    texts = [json.loads(x)["text"] for x in (d / "wikitext_texts_100.jsonl").read_text().splitlines()[:10] if x]
    cases = C.noisy_edit_cases(texts, wordpiece, seed=0, max_edits=2)
    assert len(cases) >= 8
    for c in cases:
        diff = [i for i, (a, b) in enumerate(zip(c.original, c.corrupted)) if a != b]
        assert diff == c.meta["positions"] and 1 <= len(diff) <= 2
        for i in diff:  # the edited token is a different single alphabetic-ish token
            assert len(wordpiece.decode([c.original[i]]).strip()) >= 4
    again = C.noisy_edit_cases(texts, wordpiece, seed=0, max_edits=2)
    assert [c.corrupted for c in again] == [c.corrupted for c in cases]
    twin = C.noisy_edit_cases(texts, wordpiece, seed=1, max_edits=2)
    assert [c.corrupted for c in twin] != [c.corrupted for c in cases]


class _CharTok:
    """Each character is one id (ord); enough to tokenise sentence pairs for the realistic-correction scorer."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 50 + 1 for c in text]


def test_realistic_records_score_at_token_diff_positions():
    """Authors' realistic correction: difflib positions of equal-length replacements, also when lengths differ."""
    from dsl_llada.eval.authors import realistic_fix_clean

    oracle = Stub(lambda ids: ids)  # copies its input: fixes nothing, keeps everything
    rows = [{"id": 0, "original": "the cat sat", "corrupted": "the cot sat"},      # one replacement
            {"id": 1, "original": "a dog", "corrupted": "a dogs"},                  # an insertion only
            {"id": 2, "original": "same", "corrupted": "same"}]
    recs = C.realistic_records(oracle, _CharTok(), rows, batch_size=2)
    assert [r["case_id"] for r in recs] == [0, 1, 2]
    assert (recs[0]["fix"], recs[0]["clean"], recs[0]["n_corrupted"], recs[0]["positions"]) == (0.0, 1.0, 1, [5])
    assert (recs[1]["fix"], recs[1]["clean"], recs[1]["n_corrupted"]) == (0.0, 1.0, 0)  # nothing to fix: 0 / 1
    tok = _CharTok()
    want = realistic_fix_clean(tok.encode("the cat sat"), tok.encode("the cot sat"), tok.encode("the cot sat"))
    assert {k: recs[0][k] for k in want} == want
    fixer = Stub(lambda ids: torch.where(ids == tok.encode("o")[0], tok.encode("a")[0], ids))  # o -> a everywhere
    r = C.realistic_records(fixer, tok, rows[:1])[0]
    assert (r["fix"], r["clean"]) == (1.0, 1.0)
