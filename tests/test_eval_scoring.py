"""Hand-computed checks for the evaluation-suite additions to dsl_llada.eval.metrics (modes, corpus stats,
summary / generation failure tags, ROUGE lists and aggregates, ECE in authors mode)."""

from __future__ import annotations

import pytest

from dsl_llada.eval import metrics as M
from dsl_llada.eval.genfailures import generation_failure_stats


def test_rep_rate_pooled():
    # pairs (a,a) (a,b) | (c,c) -> 2 identical of 3; never across the text boundary (b,c)
    assert M.rep_rate(["a a b", "c c"]) == pytest.approx(2 / 3)
    assert M.rep_rate(["a b", "b c"]) == 0.0        # a cross-boundary pair (b, b) would have made it 1/3
    assert M.rep_rate(["a", ""]) == 0.0 and M.rep_rate([]) == 0.0
    # pooled is not the mean of per-text rates: ("a a" -> 1/1, "b c d e f" -> 0/4) pooled 1/5, mean 1/2
    assert M.rep_rate(["a a", "b c d e f"]) == pytest.approx(0.2)


def test_generation_metrics_modes():
    texts = ["a b a b", "", "c a b"]
    d = M.generation_metrics(texts)
    # bigrams ab ba ab | ca ab -> 3 unique / 5 ; trigrams aba bab | cab -> 3/3 ; no identical pairs ; Len (4+0+3)/3
    assert d == {"n": 3, "n_empty": 1, "n_scored": 3, "d2": pytest.approx(0.6), "d3": pytest.approx(1.0),
                 "rep": 0.0, "len": pytest.approx(7 / 3)}
    a = M.generation_metrics(texts, mode="authors")
    assert a["n_scored"] == 2 and a["len"] == pytest.approx(3.5) and a["d2"] == pytest.approx(0.6)
    assert M.generation_metrics(["", " "], mode="authors")["len"] is None
    assert M.mean_length(["a b", ""]) == 1.0 and M.mean_length(["a b", ""], exclude_empty=True) == 2.0
    with pytest.raises(ValueError, match="mode must be one of"):
        M.generation_metrics(texts, mode="paper")


def uniq(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_summary_failure_tags_short_summary_quirk():
    # 8 or 9 distinct words: one 4-gram of 5 (or 6) is > 0.15 -> the authors' code tags repetition
    for n in (8, 9):
        assert M.summary_failure_tags(uniq(n), mode="authors").repetition is True
        assert M.summary_failure_tags(uniq(n)).repetition is False
    assert M.summary_failure_tags(uniq(10), mode="authors").repetition is False  # 1/7 < 0.15
    # a real repeat still fires by default: "a b c d a b c d" -> abcd twice of 5 4-grams
    assert M.summary_failure_tags("a b c d a b c d").repetition is True
    assert M.summary_failure_tags("x " * 8).repetition is True


def test_summary_failure_tags_thresholds_by_mode():
    ref = uniq(20)  # 0.4 * 20 = 8 words
    # 10 words: authors' extra "< 15 words" rule fires, the paper's 40 % rule does not
    assert M.summary_failure_tags(uniq(10), "authors", reference=ref).premature_eos is True
    assert M.summary_failure_tags(uniq(10), reference=ref).premature_eos is False
    pad = "word " * 20
    assert M.summary_failure_tags(pad + "a." * 8).degen_ending is True          # paper: >= 8
    assert M.summary_failure_tags(pad + "a." * 8, mode="authors").degen_ending is False  # code: > 8
    assert M.summary_failure_tags("  ", "authors", reference=ref) == M.FailureTags(empty=True)
    assert M.summary_failure_tags("  ", reference=ref) == M.FailureTags(empty=True)
    with pytest.raises(ValueError, match="mode must be one of"):
        M.summary_failure_tags(uniq(10), ref)  # the reference is keyword-only: a positional one is a bad mode


def test_generation_failure_tags_hand_example():
    t = M.generation_failure_tags("the the the cat.")
    # 4 words: short; ends with '.'; run of 3; TTR 2/4 = 0.5; one 4-gram -> rep_4 0
    assert t == {"short": True, "incomplete": False, "word_repeat": True, "ngram_repeat": False,
                 "sentence_repeat": False, "degenerate_pattern": False, "low_diversity": False, "severe": True}
    st = generation_failure_stats("the the the cat.")
    # severity = 100 * (0.10*1 + 0.15*min(1, 5*3/4) + 0.20*0 + 0.15*0 + 0.20*5*(1/16) + 0.20*(1-0.5)) = 41.25
    assert st["severity"] == pytest.approx(41.25)
    assert st["consec_repeat_ratio"] == pytest.approx(0.75) and st["dot_ratio"] == pytest.approx(1 / 16)


def test_generation_failure_tags_sentences_and_empty():
    st = generation_failure_stats("Go home. Go home. Go home.")
    assert st["max_sent_repeat_count"] == 3
    assert st["exact_sent_repeat_ratio"] == pytest.approx(2 / 3) and st["near_sent_repeat_ratio"] == pytest.approx(2 / 3)
    assert M.generation_failure_tags("Go home. Go home. Go home.")["sentence_repeat"] is True
    e = M.generation_failure_tags("")
    assert e["short"] and e["incomplete"] and e["degenerate_pattern"] and e["low_diversity"]
    clean = " ".join(f"word{i}" for i in range(25)) + "."
    assert not any(M.generation_failure_tags(clean).values())
    assert M.generation_failure_tags(clean + " " + "," * 21)["degenerate_pattern"] is True  # run of 22 > 20
    rates = M.failure_rates([M.generation_failure_tags(clean), e])
    assert rates["short"] == 50.0 and rates["word_repeat"] == 0.0 and "empty" not in rates


def test_rouge_scores_list_form():
    preds = ["the cat", "dogs run fast", "  "]
    refs = ["the cat sat", "the cat", "anything"]
    rows = M.rouge_scores(preds, refs)
    assert rows[0]["rouge1"] == pytest.approx(80.0) and rows[0]["rouge2"] == pytest.approx(200 / 3)
    assert rows[1] == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    assert rows[2] == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}  # empty output = 0
    # the single-pair form (reference, generated) still works
    assert M.rouge_scores("the cat sat", "the cat")["rouge1"] == pytest.approx(80.0)
    with pytest.raises(ValueError, match="preds has 1 texts but refs has 2"):
        M.rouge_scores(["a"], ["a", "b"])
    with pytest.raises(TypeError):
        M.rouge_scores(["a"], "a")


def test_rouge_aggregate_modes():
    rows = [{"rouge1": 33.333333, "rouge2": 1.004, "rougeL": 10.0},
            {"rouge1": 66.666666, "rouge2": 1.004, "rougeL": 20.0}]
    d = M.rouge_aggregate(rows)
    a = M.rouge_aggregate(rows, mode="authors")
    assert d["rouge1"] == pytest.approx(49.9999995, abs=1e-9) and a["rouge1"] == pytest.approx(50.0, abs=1e-12)
    assert d["rouge2"] == pytest.approx(1.004) and a["rouge2"] == pytest.approx(1.0)
    assert d["rougeL"] == a["rougeL"] == pytest.approx(15.0)
    with pytest.raises(ValueError):
        M.rouge_aggregate([])


def test_ece_authors_mode_out_of_range():
    conf, corr = [0.2, 0.4, 0.6, 0.9, 1.5], [0, 1, 1, 1, 1]
    # bins as in the 4-sample example (0.1 + 0.125 with N = 4), but N = 5: 2/5*.2 + 2/5*.25 = 0.18
    assert M.expected_calibration_error(conf, corr, n_bins=2, mode="authors") == pytest.approx(0.18)
    with pytest.raises(ValueError, match="1.5"):
        M.expected_calibration_error(conf, corr, n_bins=2)
    # in range both modes agree
    assert M.expected_calibration_error(conf[:4], corr[:4], n_bins=2, mode="authors") == pytest.approx(0.225)
    assert M.expected_calibration_error([-0.5, 0.5], [1, 1], n_bins=2, mode="authors") == pytest.approx(0.25)
