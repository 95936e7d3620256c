"""Known outputs of every `authors`-mode metric, each derived by hand from the definitions in
docs/provenance.md §5 (the section is named in each test). docs/evaluation.md ("Authors mode: what comes from where")
lists the same sources and the points where the reference is silent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsl_llada.eval import answers as A
from dsl_llada.eval import authors as AU
from dsl_llada.eval import metrics as M
from dsl_llada.eval.fix_clean import random_token_cases
from dsl_llada.eval.judge import AXES, Pair, Sample, build_messages, parse_reply


# --------------------------------------------------------------------------- §5.8 GSM8K / MATH

@pytest.mark.parametrize("reply, gold, pred, correct", [
    ("#### 5\n#### 6", "5", "5", True),                  # first '####'
    ("The answer is $1,600.", "1600", "1600.", True),    # trailing '.' stripped by the normaliser
    ("so 12 then 7", "7", "7", True),                    # last number
    ("The answer is 3.0", "3", "3.0", False),            # strings, not numbers
    ("Hello, world", "", "", True),                      # a lone ',' is a number; "" == ""
    ("+5 degrees", "5", "+5", False),                    # the sign is kept
    ("2,5 apples", "25", "25", True),                    # commas removed
])
def test_gsm8k_authors(reply, gold, pred, correct):
    assert A.extract_gsm8k(reply, "authors") == pred
    assert A.gsm8k_correct(reply, gold, "authors") is correct


def test_gsm8k_default_differences_pinned():
    assert A.extract_gsm8k("2,5 apples") is None and not A.gsm8k_correct("2,5 apples", "25")  # the bug: was "5"
    assert A.extract_gsm8k("+5 degrees") == "5" and A.gsm8k_correct("+5 degrees", "5")
    assert A.gsm8k_correct("The answer is 3.0", "3")


def test_gsm8k_gold_authors():
    # §5.8: the rest of the line after the first '####', stripped, commas removed; "" without the marker
    assert A.gsm8k_gold("She sold 48/2 = 24 clips.\n#### 1,200", "authors") == "1200"
    assert A.gsm8k_gold("#### 5\n#### 6", "authors") == "5"
    assert A.gsm8k_gold("steps\n####   72  \nmore text", "authors") == "72"
    assert A.gsm8k_gold("1,200", "authors") == "" and A.gsm8k_gold("no marker at all", "authors") == ""
    assert A.gsm8k_gold("1,200") == "1200"                                        # default: the bare answer
    assert A.gsm8k_correct("#### 1200", A.gsm8k_gold("x\n#### 1,200", "authors"), "authors")


def test_math_gold_authors_is_the_one_level_regex():
    # §5.8: the prediction's one-level regex, last match, "" when none matches
    assert A.extract_math_gold(r"so \boxed{1} then \boxed{\frac{1}{2}}.", "authors") == r"\frac{1}{2}"
    assert A.extract_math_gold(r"so \boxed{\frac{\sqrt{2}}{2}}", "authors") == ""   # two levels: empty gold
    assert A.extract_math_gold(r"\boxed{ 7 } and \boxed{\frac{\sqrt{2}}{2}}", "authors") == "7"  # last *match*
    assert A.extract_math_gold("no box here", "authors") == ""
    assert A.extract_math_gold(r"so \boxed{\frac{\sqrt{2}}{2}}") == r"\frac{\sqrt{2}}{2}"  # default: balanced


def test_math_authors():
    assert A.extract_math(r"\boxed{1} and \boxed{\frac{1}{2}}", "authors") == r"\frac{1}{2}"
    assert A.extract_math(r"\boxed{\frac{\sqrt{3}}{2}}", "authors") == ""            # one nesting level
    assert A.extract_math("The answer is 3.14. Yes", "authors") == "3"               # cut at the first '.'
    # the pattern's lazy (.+?) cannot cross a newline and '$' is the end of the text: no '.' before the newline
    assert A.extract_math("The answer is x+1\nwhich", "authors") == ""
    assert A.extract_math("The answer is x+1\nwhich.", "authors") == ""
    assert A.extract_math("The answer is x+1", "authors") == "x+1"
    assert A.extract_math("The answer is x+1\nwhich") == "x+1"                      # default stops at it
    assert A.math_correct(r"\boxed{ 1/2 }", "1/2", "authors")
    assert not A.math_correct(r"\boxed{0.5}", "1/2", "authors") and A.math_correct(r"\boxed{0.5}", "1/2")


# --------------------------------------------------------------------------- §5.5 ROUGE

def test_rouge_per_sample_rounded_and_merge_mean():
    # "the cat sat" vs reference "the cat sat on the mat": R1 P=1, R=1/2 -> F=2/3 -> 66.67 rounded
    r = M.rouge_scores("the cat sat on the mat", "the cat sat", mode="authors")
    assert r["rouge1"] == 66.67 and r["rougeL"] == 66.67
    # R2: bigrams (the cat)(cat sat) of 2 vs 5 -> P=1, R=2/5 -> F=4/7 = 57.142857 -> 57.14
    assert r["rouge2"] == 57.14
    assert M.rouge_scores("the cat sat on the mat", "the cat sat")["rouge1"] == pytest.approx(200 / 3)
    assert M.rouge_scores("ref words", "   ", mode="authors") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    # the shard merge: mean of the 2-dp rounded per-sample values (round(10.005, 2) == 10.01 in binary floats)
    rows = [{"rouge1": 10.005, "rouge2": 0.004, "rougeL": 1.0}, {"rouge1": 0.0, "rouge2": 0.004, "rougeL": 2.0}]
    a = M.rouge_aggregate(rows, mode="authors")
    assert a == {"rouge1": 10.01 / 2, "rouge2": 0.0, "rougeL": 1.5}
    assert M.rouge_aggregate(rows)["rouge2"] == pytest.approx(0.004)


# --------------------------------------------------------------------------- §5.6 failure tags and delta buckets

def test_summary_tags_authors():
    t = M.summary_failure_tags
    eight = "one two three four five six seven eight"
    assert t(eight, "authors", reference=eight).as_dict() == {
        "empty": False, "premature_eos": True, "repetition": True, "degen_ending": False}  # W<15; 1/5 > 0.15
    assert not t(eight, "default", reference=eight).repetition and not t(eight, "default", reference=eight).premature_eos
    assert t("  \n ", "authors").empty
    long = " ".join(f"w{i}" for i in range(20))
    assert t(long + " " + "." * 9, "authors").degen_ending            # 9 dots in the last 40 characters
    assert not t(long + " " + ". " * 8, "authors").degen_ending       # 8 is not > 8
    assert t(long + " " + ". " * 8, "default").degen_ending           # the paper's >= 8
    assert t(long + " " + ". " * 9 + "   \n  ", "authors").degen_ending  # trailing whitespace is stripped first
    assert t("x ....... " + long, "authors").degen_ending             # seven dots anywhere
    assert t(long, "authors", reference=" ".join(["r"] * 51)).premature_eos  # 20 < 0.4 * 51
    assert not t(long, "authors", reference=" ".join(["r"] * 50)).premature_eos


@pytest.mark.parametrize("value, base, default_bucket, authors_bucket", [
    (30.996, 30.0, "tie", "win"),          # 0.996 vs round(30.996, 2) - 30.0 = 1.0
    (29.004, 30.0, "tie", "loss"),         # -0.996 vs 29.0 - 30.0 = -1.0
    (35.004, 30.0, "big win", "big win"),
    (25.004, 30.0, "loss", "big loss"),    # -4.996 vs 25.0 - 30.0 = -5.0
])
def test_delta_buckets_on_rounded_values(value, base, default_bucket, authors_bucket):
    from dsl_llada.eval.tasks.summarization import delta_bucket

    assert delta_bucket(AU.rouge1_delta(value, base)) == default_bucket
    assert delta_bucket(AU.rouge1_delta(value, base, "authors")) == authors_bucket
    assert [delta_bucket(x) for x in (5, 4.99, 1, 0.99, -0.99, -1, -4.99, -5)] == \
        ["big win", "win", "win", "tie", "tie", "loss", "loss", "big loss"]


# --------------------------------------------------------------------------- §5.4 D2 / D3 / Rep / Len

def test_generation_metrics_authors_drop_empties():
    texts = ["a b a b", "", "c c"]
    a = M.generation_metrics(texts, mode="authors")
    # bigrams (a b)(b a)(a b)(c c): 3 unique of 4; trigrams (a b a)(b a b): 2 of 2; pairs ab ba ab cc: 1 of 4
    assert (a["d2"], a["d3"], a["rep"], a["len"], a["n_scored"]) == (0.75, 1.0, 0.25, 3.0, 2)
    d = M.generation_metrics(texts)
    assert (d["d2"], d["rep"], d["len"], d["n_scored"]) == (0.75, 0.25, 2.0, 3)


# --------------------------------------------------------------------------- §5.1 Fix / Clean, corruption, token diff

def test_fix_clean_authors_zero_corrupted_and_macro():
    # §5.1 (eval_corruption_single): no corrupted position -> Fix 0.0, Clean computed normally (2 of 3)
    r = M.fix_clean([1, 2, 3], [1, 2, 3], [1, 2, 9], mode="authors")
    assert (r.fix, r.clean) == (0.0, 2 / 3)
    assert M.fix_clean([1, 2, 3], [1, 2, 3], [9, 9, 9], mode="authors").clean == 0.0
    d = M.fix_clean([1, 2, 3], [1, 2, 3], [1, 2, 9])
    assert (d.fix, d.clean) == (None, 2 / 3)                      # default: 0/0 is undefined, skipped
    full = M.fix_clean([1, 2], [5, 6], [1, 0], mode="authors")
    assert (full.fix, full.clean) == (0.5, 1.0)                   # every position corrupted: Clean 1.0
    assert M.fix_clean([1, 2], [5, 6], [1, 0]).clean is None
    t1 = M.fix_clean([1, 2, 3, 4], [1, 9, 3, 4], [1, 2, 3, 0], mode="authors")
    assert (t1.fix, t1.clean) == (1.0, 2 / 3)
    assert M.macro_fix_clean([t1, r]) == {"fix": 0.5, "clean": 2 / 3}
    assert M.macro_fix_clean([t1, d]) == {"fix": 1.0, "clean": 2 / 3}
    assert M.macro_fix_clean([t1, full]) == {"fix": 0.75, "clean": (2 / 3 + 1.0) / 2}


def test_random_corruption_randomstate_sorted_draw_order():
    ids = list(range(1000, 1010))
    rs = np.random.RandomState(42)
    drawn = [int(x) for x in rs.choice(10, 3, replace=False)]
    assert drawn == [8, 1, 5]                                     # choice's order...
    repl = [int(rs.randint(100, 126000)) for _ in range(3)]
    assert repl == [82486, 37294, 87598]
    # ...sorted ascending, and the replacements drawn in that ascending order: 1 <- 82486, 5 <- 37294, 8 <- 87598
    got, pos = AU.corrupt_random_tokens(ids, 0.3, 42)
    assert pos == [1, 5, 8]
    assert got == [1000, 82486, 1002, 1003, 1004, 37294, 1006, 1007, 87598, 1009]
    other, pos43 = AU.corrupt_random_tokens(ids, 0.3, 43)         # different seed, different corruption
    assert pos43 == [3, 6, 9] and other != got
    # re-drawn while equal to the original: ids 5..6 only, originals 6 and 8 (8 is never drawn)
    assert AU.corrupt_random_tokens([5, 6, 7, 8], 0.5, 42, low=5, high=7) == ([5, 5, 7, 6], [1, 3])
    # int(n * rate): 100 * 0.29 = 28.999... -> 28 positions (default mode: 29)
    assert len(AU.corrupt_random_tokens(list(range(100)), 0.29, 1, low=200, high=300)[1]) == 28
    dflt, _ = M.corrupt_random_tokens(list(range(100)), 0.29, np.random.default_rng(1), 200, 300)
    assert sum(a != b for a, b in zip(dflt, range(100))) == 29


def test_random_token_cases_use_seed_plus_text_id():
    texts = [list(range(1000, 1010)), list(range(2000, 2020))]
    cases = random_token_cases(texts, None, rate=0.3, seed=42, id_range=(100, 126000), text_ids=[0, 7], mode="authors")
    assert list(cases[0].corrupted) == AU.corrupt_random_tokens(texts[0], 0.3, 42)[0]
    assert list(cases[1].corrupted) == AU.corrupt_random_tokens(texts[1], 0.3, 49)[0]
    assert cases[0].meta["positions"] == [1, 5, 8]


def test_mask_positions_int_count():
    assert len(AU.mask_positions(90, 0.7, 42)) == 62               # int(62.99999) (default floor(n r + 1e-9): 63)
    assert len(AU.mask_positions(70, 0.7, 42)) == 49
    assert AU.mask_positions(10, 0.3, 45) == [int(x) for x in np.random.RandomState(45).choice(10, 3, replace=False)]
    assert AU.mask_positions(10, 0.3, 45) != AU.mask_positions(10, 0.3, 46)


def test_token_diff_positions_and_realistic_scores():
    assert AU.token_diff_positions([1, 2, 3, 4, 5], [1, 9, 3, 4, 5]) == [(1, 2)]
    assert AU.token_diff_positions([1, 2, 3, 4], [1, 7, 8, 3, 4]) == []          # unequal replace: no position
    # replace 2,3 -> 8,9 (equal length) then an inserted 0: positions 1, 2 of the corrupted sequence
    assert AU.token_diff_positions([1, 2, 3, 4, 5, 6], [1, 8, 9, 4, 0, 5, 6]) == [(1, 2), (2, 3)]
    assert AU.token_diff_positions([1, 2, 3], [1, 2, 3]) == []
    al = AU.realistic_alignment([1, 2, 3, 4, 5, 6], [1, 8, 9, 4, 0, 5, 6])
    assert al.corrupt == [(1, 1), (2, 2)] and al.clean == [(0, 0), (3, 3), (4, 5), (5, 6)] and al.skipped_ops == 1
    r = AU.realistic_fix_clean([1, 2, 3, 4, 5, 6], [1, 8, 9, 4, 0, 5, 6], [1, 2, 0, 4, 0, 0, 6])
    # fix: pos 1 -> 2 ok, pos 2 -> 3 wrong = 1/2; clean = equal-op tokens only (0, 3, 5, 6 of the corrupted
    # sequence; the inserted 0 at 4 counts toward neither): 1, 4 ok, 5 -> 0 wrong, 6 ok = 3/4
    assert (r["fix"], r["clean"], r["n_corrupted"], r["n_uncorrupted"], r["skipped_ops"]) == (0.5, 0.75, 2, 4, 1)
    # no corrupt pair (an unequal-length replace only): Fix 0.0; Clean over the equal ops 0, 3, 4: 2 of 3
    none = AU.realistic_fix_clean([1, 2, 3, 4], [1, 7, 8, 3, 4], [1, 0, 0, 3, 0])
    assert (none["fix"], none["clean"], none["n_uncorrupted"]) == (0.0, 2 / 3, 3)
    same = AU.realistic_fix_clean([1, 2], [1, 2], [0, 2])
    assert (same["fix"], same["clean"]) == (0.0, 0.5)
    every = AU.realistic_fix_clean([1, 2], [3, 4], [1, 4])         # no clean pair: Clean 1.0
    assert (every["fix"], every["clean"]) == (0.5, 1.0)


def test_realistic_alignment_has_autojunk_off():
    # 211 ids, the popular id 7 would be junk with autojunk on (the whole sequence one 211-token replace);
    # with it off: one replaced token, then 210 equal ones
    o, c = [1] + [7] * 210, [2] + [7] * 210
    al = AU.realistic_alignment(o, c)
    assert al.corrupt == [(0, 0)] and al.clean == [(k, k) for k in range(1, 211)] and al.skipped_ops == 0
    r = AU.realistic_fix_clean(o, c, [1] + [7] * 209 + [0])
    assert (r["fix"], r["clean"], r["n_corrupted"]) == (1.0, 209 / 210, 1)


# --------------------------------------------------------------------------- §5.3 ECE

def test_ece_authors_known_values_and_empty_set():
    # 0.95, 0.95 in the last bin (acc 0.5): 2/3 * 0.45; 0.05 in bin 0 (acc 0): 1/3 * 0.05
    assert M.expected_calibration_error([0.95, 0.95, 0.05], [1, 0, 0], 15, mode="authors") == pytest.approx(
        2 / 3 * 0.45 + 1 / 3 * 0.05)
    assert M.expected_calibration_error([1.0], [1], 15, mode="authors") == 0.0        # 1.0 is in the closed last bin
    assert M.expected_calibration_error([1.2, 0.5], [1, 1], 15, mode="authors") == pytest.approx(0.5 * 0.5)
    assert M.expected_calibration_error([], [], 15, mode="authors") == 0.0
    with pytest.raises(ValueError, match="at least one sample"):
        M.expected_calibration_error([], [], 15)


# --------------------------------------------------------------------------- §5.7 judge prompt and parsing

def test_judge_prompt_template_is_filled_literally():
    sys_p, user = "Return JSON like {\"overall\": \"A\"}.", "REF: {reference}\nA: {candidate_a}\nB: {candidate_b}\n{x}"
    a, b = Sample("1", "first run {candidate_b}", "the ref"), Sample("1", "second run", "the ref")
    msgs = build_messages(Pair("1", False, a, b), system_prompt=sys_p, user_template=user)
    assert msgs == [{"role": "system", "content": sys_p},
                    {"role": "user", "content": "REF: the ref\nA: first run {candidate_b}\nB: second run\n{x}"}]
    swapped = build_messages(Pair("1", True, a, b), system_prompt=sys_p, user_template=user)[1]["content"]
    assert swapped == "REF: the ref\nA: second run\nB: first run {candidate_b}\n{x}"


def test_judge_parse_authors_known_outputs():
    scores = dict(zip(AXES, (4, 3, 9, "x")))
    obj = {"a": scores, "b": {}, "overall": "tie"}
    text = "Sure:\n" + json.dumps(obj) + "\nthanks"
    assert parse_reply(text, "authors") == obj                            # §5.7: as decoded, nothing added
    assert "rationale" not in parse_reply(text, "authors")
    assert parse_reply(text) is None                                       # ours validates the scores
    assert parse_reply(text.replace('"tie"', '"Tie"'), "authors") is None  # §5.7: overall exactly "A", "B" or "tie"
    assert parse_reply('{"overall": "A"} {"overall": "B"}', "authors") is None  # greedy span is not one object
    assert parse_reply('x {"overall": "B", "a": {"factuality": 2}} y', "authors") == {
        "overall": "B", "a": {"factuality": 2}}


def test_reasoning_task_scores_each_mode_with_its_own_gold():
    """MATH golds taken from `solution`: each mode extracts its own; GSM8K golds with '####' likewise."""
    import json as _json

    from eval_fixtures import data_dir

    from dsl_llada.eval.eval_config import DatasetSpec
    from dsl_llada.eval.tasks.reasoning import ReasoningTask

    d = data_dir()
    task = ReasoningTask()
    ds = DatasetSpec(name="math500", path=str(d / "math500_test.jsonl"), kind="math", fields={"gold": "solution"})
    samples = task.samples(ds, {})
    answers = [_json.loads(x)["answer"] for x in (d / "math500_test.jsonl").read_text().splitlines() if x.strip()]
    assert len(samples) == 500
    assert sum(s.info["gold"] == a for s, a in zip(samples, answers)) == 500          # default: balanced
    # §5.8: the one-level regex gives an empty gold for the 5 golds with two brace levels
    assert sum(s.info["gold_authors"] == a for s, a in zip(samples, answers)) == 495
    deep = [s for s in samples if s.info["gold_authors"] == ""]
    assert len(deep) == 5
    assert all(A.extract_math("\\boxed{" + s.info["gold"] + "}", "authors") == "" for s in deep)
    for s in deep:
        m = task.item_metrics(s.info, "so \\boxed{" + s.info["gold"] + "}", "authors")
        assert m["correct"] is True and m["correct_authors"] is True      # "" == "": the authors score it correct
        assert task.item_metrics(s.info, "I do not know.", "authors")["correct_authors"] is True
    gsm = DatasetSpec(name="gsm8k", path=str(d / "gsm8k_test.jsonl"), kind="gsm8k", limit=3)
    rows = [_json.loads(x) for x in (d / "gsm8k_test.jsonl").read_text().splitlines()[:3]]
    for s, row in zip(task.samples(gsm, {}), rows):
        gold = row["answer"].split("####")[1].strip().replace(",", "")
        assert s.info["gold_authors"] == gold                        # extracted from the official `answer`
        m = task.item_metrics(s.info, f"#### {gold}", "authors")
        assert m["correct"] and m["correct_authors"]
