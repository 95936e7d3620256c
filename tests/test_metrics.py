"""Hand-computed checks for dsl_llada.eval.metrics."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_SRC = Path(__file__).resolve().parents[1] / "src"
try:
    import dsl_llada  # noqa: F401
except ImportError:  # package not installed into the venv: run from the source tree
    sys.path.insert(0, str(_SRC))

from dsl_llada.eval import metrics as M  # noqa: E402


def uniq(n: int, prefix: str = "w") -> str:
    """n distinct words: w0 w1 ... (no punctuation)."""
    return " ".join(f"{prefix}{i}" for i in range(n))


# --------------------------------------------------------------------------- text statistics

def test_repetition_rate():
    # pairs (a,a)=same (a,b) (b,b)=same (b,b)=same -> 3/4
    assert M.repetition_rate("a a b b b") == pytest.approx(0.75)
    assert M.repetition_rate("a b c") == 0.0
    assert M.repetition_rate("a") == 0.0
    assert M.repetition_rate("") == 0.0
    # case-sensitive, whitespace forms: (A,a) differ, (a,a.) differ
    assert M.repetition_rate("A a a.") == 0.0


def test_length_words():
    assert M.length_words("  hello   world\n again ") == 3
    assert M.length_words("") == 0


def test_distinct_n_corpus_level_and_no_cross_boundary():
    # text1 "a b a b": ab ba ab ; text2 "c a b": ca ab -> 5 bigrams, unique {ab, ba, ca} = 3
    # (a cross-boundary bigram (b, c) would have made it 4/6)
    assert M.distinct_n(["a b a b", "c a b"], n=2) == pytest.approx(3 / 5)
    assert M.distinct_n_text("a b a b") == pytest.approx(2 / 3)
    assert M.distinct_n(["a b c"], n=1) == 1.0
    assert M.distinct_n(["a", ""], n=2) == 0.0
    assert M.distinct_n([], n=2) == 0.0
    with pytest.raises(TypeError):
        M.distinct_n("a b a b")
    with pytest.raises(ValueError, match="n must be >= 1"):
        M.distinct_n(["a"], n=0)


def test_aggregate_includes_empties_by_default():
    texts = ["a a b", "", "x y z w"]
    # Rep: 1/2, 0, 0 ; Len: 3, 0, 4 ; bigrams aa ab xy yz zw all unique
    out = M.aggregate_generation_metrics(texts)
    assert out["n"] == 3 and out["n_empty"] == 1 and out["n_scored"] == 3
    assert out["rep"] == pytest.approx(0.5 / 3)
    assert out["len"] == pytest.approx(7 / 3)
    assert out["distinct_2"] == pytest.approx(1.0)
    assert out["gen_ppl"] is None

    ex = M.aggregate_generation_metrics(texts, exclude_empty=True)
    assert ex["n_empty"] == 1 and ex["n_scored"] == 2
    assert ex["rep"] == pytest.approx(0.25)
    assert ex["len"] == pytest.approx(3.5)


def test_aggregate_gen_ppl():
    texts = ["a a b", "", "x y z w"]
    nll = [[1.0, 2.0, 3.0], [], np.array([1.0])]
    # token-weighted: (6 + 1) / 4 tokens ; per-text: mean(2, 1) = 1.5 (empty text has no tokens)
    out = M.aggregate_generation_metrics(texts, nll)
    assert out["gen_ppl"] == pytest.approx(math.exp(7 / 4)) and out["nll_tokens"] == 4
    out = M.aggregate_generation_metrics(texts, nll, per_text_mean=True)
    assert out["gen_ppl"] == pytest.approx(math.exp(1.5))
    # an empty output that was scored (e.g. its EOS): included by default, dropped when excluded
    nll2 = [[1.0, 2.0, 3.0], [4.0], [1.0]]
    assert M.aggregate_generation_metrics(texts, nll2)["gen_ppl"] == pytest.approx(math.exp(11 / 5))
    ex = M.aggregate_generation_metrics(texts, nll2, exclude_empty=True)
    assert ex["gen_ppl"] == pytest.approx(math.exp(7 / 4))
    with pytest.raises(ValueError, match="nll_per_token has 2"):
        M.aggregate_generation_metrics(texts, nll2[:2])


def test_aggregate_all_empty_excluded_and_no_texts():
    out = M.aggregate_generation_metrics(["", " "], [[], []], exclude_empty=True)
    assert out["n_scored"] == 0 and out["rep"] is None and out["len"] is None
    assert out["distinct_2"] is None and out["gen_ppl"] is None
    with pytest.raises(ValueError):
        M.aggregate_generation_metrics([])


# --------------------------------------------------------------------------- failure tags

def test_empty_is_exclusive():
    t = M.failure_tags("   \n", reference=uniq(50))
    assert t == M.FailureTags(empty=True)
    assert t.as_dict() == {"empty": True, "premature_eos": False, "repetition": False, "degen_ending": False}


def test_premature_eos_without_reference():
    assert M.failure_tags(uniq(14)).premature_eos is True  # 14 < 15
    assert M.failure_tags(uniq(15)).premature_eos is False
    # paper rule needs a reference: never fires without one
    assert M.failure_tags(uniq(14), paper_thresholds=True).premature_eos is False


def test_premature_eos_with_reference():
    ref = uniq(50, "r")  # 0.4 * 50 = 20
    for paper in (False, True):
        assert M.failure_tags(uniq(19), ref, paper_thresholds=paper).premature_eos is True
        assert M.failure_tags(uniq(20), ref, paper_thresholds=paper).premature_eos is False
    ref20 = uniq(20, "r")  # 0.4 * 20 = 8 -> 14 words is long enough for the paper rule
    assert M.failure_tags(uniq(14), ref20).premature_eos is True  # code: 14 < 15
    assert M.failure_tags(uniq(14), ref20, paper_thresholds=True).premature_eos is False
    # empty reference: ref_w = max(1, 0) = 1
    assert M.failure_tags(uniq(15), "").premature_eos is False


def _rep_text(n_words: int) -> str:
    # "a b c d" three times, separated by distinct x-words, padded with distinct u-words:
    # 4-gram "a b c d" occurs 3 times, every other 4-gram once.
    head = "a b c d x1 a b c d x2 a b c d".split()  # 14 words
    return " ".join(head + [f"u{i}" for i in range(n_words - len(head))])


def test_repetition_threshold():
    # 23 words -> 20 4-grams, max count 3 -> 3/20 = 0.15 exactly: code (>) no, paper (>=) yes
    assert M.failure_tags(_rep_text(23)).repetition is False
    assert M.failure_tags(_rep_text(23), paper_thresholds=True).repetition is True
    # 22 words -> 19 4-grams -> 3/19 = 0.158 > 0.15: both fire
    assert M.failure_tags(_rep_text(22)).repetition is True
    assert M.failure_tags(_rep_text(22), paper_thresholds=True).repetition is True
    # fewer than 8 words never fires, 8 identical words fire (5 identical 4-grams / 5)
    assert M.failure_tags("a a a a a a a").repetition is False
    assert M.failure_tags("a a a a a a a a").repetition is True
    # distinct words: 10 words -> 1/7 = 0.143 no; 9 words -> 1/6 = 0.167 fires (rule quirk)
    assert M.failure_tags(uniq(10)).repetition is False
    assert M.failure_tags(uniq(10), paper_thresholds=True).repetition is False
    assert M.failure_tags(uniq(9)).repetition is True


def test_degen_ending_counts():
    pad = "word " * 20
    # exactly 8 dots in the last 40 chars (no 7-dot run): code (> 8) no, paper (>= 8) yes
    assert M.failure_tags(pad + "a." * 8).degen_ending is False
    assert M.failure_tags(pad + "a." * 8, paper_thresholds=True).degen_ending is True
    assert M.failure_tags(pad + "a." * 9).degen_ending is True
    assert M.failure_tags(pad + "a," * 8).degen_ending is False
    assert M.failure_tags(pad + "a," * 8, paper_thresholds=True).degen_ending is True
    assert M.failure_tags(pad + "a," * 9).degen_ending is True
    # counted separately: 7 dots + 7 commas fire in neither mode
    mixed = pad + "a.a," * 7
    assert M.failure_tags(mixed).degen_ending is False
    assert M.failure_tags(mixed, paper_thresholds=True).degen_ending is False
    # punctuation before the last 40 characters is not counted
    assert M.failure_tags("x." * 9 + "y" * 40).degen_ending is False
    # trailing whitespace is ignored
    assert M.failure_tags(pad + "a." * 9 + "  \n").degen_ending is True


def test_degen_ending_dot_run():
    assert M.failure_tags("start ....... " + "word " * 30).degen_ending is True  # 7-dot run
    assert M.failure_tags("start ...... " + "word " * 30).degen_ending is False  # 6 dots
    assert M.failure_tags("start ....... " + "word " * 30, paper_thresholds=True).degen_ending is True


def test_failure_rates():
    tags = [
        M.FailureTags(empty=True),
        M.FailureTags(premature_eos=True, repetition=True),
        {"empty": False, "premature_eos": False, "repetition": False, "degen_ending": True},
        M.FailureTags(),
    ]
    assert M.failure_rates(tags) == {
        "empty": 25.0, "premature_eos": 25.0, "repetition": 25.0, "degen_ending": 25.0,
    }
    assert M.failure_rates([M.FailureTags()])["empty"] == 0.0
    with pytest.raises(ValueError):
        M.failure_rates([])


# --------------------------------------------------------------------------- ROUGE

def test_rouge_identical_disjoint_partial():
    same = M.rouge_scores("the cat sat on the mat", "the cat sat on the mat")
    assert same == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0})
    assert M.rouge_scores("the cat", "dogs run fast") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    # ref "the cat sat", gen "the cat": unigram P = 2/2, R = 2/3 -> F = 0.8 ;
    # bigram P = 1/1, R = 1/2 -> F = 2/3 ; LCS = 2 -> same as rouge1
    part = M.rouge_scores("the cat sat", "the cat")
    assert part["rouge1"] == pytest.approx(80.0)
    assert part["rouge2"] == pytest.approx(200 / 3)
    assert part["rougeL"] == pytest.approx(80.0)
    assert M.rouge_scores("the cat sat", "  ") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}


def test_mean_rouge():
    out = M.mean_rouge([("the cat", "the cat"), ("the cat", "dogs run")])
    assert out == pytest.approx({"rouge1": 50.0, "rouge2": 50.0, "rougeL": 50.0})
    with pytest.raises(ValueError):
        M.mean_rouge([])


def test_import_does_not_need_rouge_score():
    code = "import sys, dsl_llada.eval.metrics; print('rouge_score' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_SRC), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert res.stdout.strip() == "False"


# --------------------------------------------------------------------------- calibration

def test_ece_hand_example():
    # 2 bins: [0, .5) holds 0.2 (wrong), 0.4 (right): acc .5, conf .3 -> 2/4 * .2 = .1
    #         [.5, 1] holds 0.6, 0.9 (both right): acc 1, conf .75 -> 2/4 * .25 = .125
    conf, corr = [0.2, 0.4, 0.6, 0.9], [0, 1, 1, 1]
    assert M.expected_calibration_error(conf, corr, n_bins=2) == pytest.approx(0.225)
    assert M.expected_calibration_error(np.array(conf), np.array(corr, bool), n_bins=2) == pytest.approx(0.225)


def test_ece_bin_edges():
    # 0.5 belongs to the upper bin, 1.0 to the last (closed) bin: one bin, acc .5, conf .75 -> .25
    # (if 0.5 were in the lower bin it would be .5*.5 + .5*1 = .75)
    assert M.expected_calibration_error([0.5, 1.0], [1, 0], n_bins=2) == pytest.approx(0.25)
    assert M.expected_calibration_error([0.0], [0], n_bins=15) == 0.0


def test_ece_perfectly_calibrated():
    conf = [0.25] * 4 + [0.75] * 4
    corr = [1, 0, 0, 0] + [1, 1, 1, 0]
    assert M.expected_calibration_error(conf, corr) == pytest.approx(0.0, abs=1e-12)


def test_ece_torch_input():
    torch = pytest.importorskip("torch")
    conf = torch.tensor([0.2, 0.4, 0.6, 0.9], requires_grad=True)
    corr = torch.tensor([False, True, True, True])
    assert M.expected_calibration_error(conf, corr, n_bins=2) == pytest.approx(0.225)


def test_ece_validation():
    with pytest.raises(ValueError, match="n_bins"):
        M.expected_calibration_error([0.5], [1], n_bins=0)
    with pytest.raises(ValueError, match="2 values but correct has 1"):
        M.expected_calibration_error([0.5, 0.6], [1])
    with pytest.raises(ValueError, match="1.5"):
        M.expected_calibration_error([1.5], [1])
    with pytest.raises(ValueError, match="correct"):
        M.expected_calibration_error([0.5], [2])
    with pytest.raises(ValueError):
        M.expected_calibration_error([], [])


# --------------------------------------------------------------------------- error correction

def test_fix_clean_hand_example():
    orig = [1, 2, 3, 4, 5]
    corr = [1, 9, 3, 8, 5]  # corrupted positions 1 and 3
    pred = [1, 2, 3, 7, 6]  # fixes pos 1 (2 == 2), misses pos 3 (7 != 4); keeps 0, 2, breaks 4
    r = M.fix_clean(orig, corr, pred)
    assert r.fix == pytest.approx(1 / 2) and r.clean == pytest.approx(2 / 3)
    assert (r.n_corrupted, r.n_uncorrupted) == (2, 3)
    none = M.fix_clean(np.array([1, 2]), [1, 2], [1, 0])  # nothing corrupted
    assert none.fix is None and none.clean == pytest.approx(0.5)
    with pytest.raises(ValueError, match="length mismatch"):
        M.fix_clean([1, 2], [1], [1, 2])


def test_macro_average():
    assert M.macro_average([0.5, None, 1.0]) == pytest.approx(0.75)
    assert M.macro_average([None]) is None
    rs = [M.fix_clean([1, 2], [9, 2], [1, 2]), M.fix_clean([1, 2], [1, 2], [1, 0])]
    # fix: (1.0, None) -> 1.0 ; clean: (1.0, 0.5) -> 0.75
    assert M.macro_fix_clean(rs) == {"fix": pytest.approx(1.0), "clean": pytest.approx(0.75)}


def test_corrupt_random_tokens():
    ids = list(range(100, 200))
    corrupted, pos = M.corrupt_random_tokens(ids, 0.29, np.random.default_rng(0), 100, 103)
    assert len(pos) == 29 == len(set(pos.tolist()))  # floor(100 * 0.29) = 29 despite float round-off
    assert np.all(np.diff(pos) > 0)
    orig = np.array(ids)
    assert np.all(corrupted[pos] != orig[pos])
    assert np.all((corrupted[pos] >= 100) & (corrupted[pos] < 103))
    keep = np.setdiff1d(np.arange(100), pos)
    assert np.array_equal(corrupted[keep], orig[keep])
    assert ids == list(range(100, 200))  # input untouched
    # determinism
    again = M.corrupt_random_tokens(ids, 0.29, np.random.default_rng(0), 100, 103)
    assert np.array_equal(again[0], corrupted) and np.array_equal(again[1], pos)
    # at least one position is corrupted
    c, p = M.corrupt_random_tokens([5] * 10, 0.01, np.random.default_rng(1), 0, 2)
    assert len(p) == 1 and c[p[0]] != 5
    c, p = M.corrupt_random_tokens([7, 7, 7], 1.0, np.random.default_rng(2), 6, 8)
    assert p.tolist() == [0, 1, 2] and c.tolist() == [6, 6, 6]


def test_corrupt_random_tokens_validation():
    rng = np.random.default_rng(0)
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="rate"):
            M.corrupt_random_tokens([1, 2, 3], bad, rng, 0, 10)
    with pytest.raises(ValueError, match="low < high"):
        M.corrupt_random_tokens([1, 2, 3], 0.5, rng, 10, 10)
    with pytest.raises(ValueError, match="no id different"):
        M.corrupt_random_tokens([4], 1.0, rng, 4, 5)
    with pytest.raises(ValueError, match="empty"):
        M.corrupt_random_tokens([], 0.5, rng, 0, 10)
