"""GSM8K / MATH answer extraction and scoring in both modes (curated cases, hand-checked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsl_llada.eval import answers as A


def _data_dir() -> Path | None:
    for d in (Path(__file__).resolve().parents[2] / "shared" / "data", Path("/work/shared/data")):
        if (d / "gsm8k_100.jsonl").exists():
            return d
    return None


DATA = _data_dir()
needs_data = pytest.mark.skipif(DATA is None, reason="../shared/data (gsm8k_100.jsonl, math_100.jsonl) not found")


def _rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / name).read_text(encoding="utf-8").splitlines() if x.strip()]


# --------------------------------------------------------------------------- GSM8K

@pytest.mark.parametrize("text, default, authors", [
    ("Hello, world", None, ""),                         # authors: a lone comma is a 'number'
    ("So 3 + 4 = 7.\n#### 7", "7", "7"),
    ("#### 5\nthen later #### 6", "6", "5"),            # authors take the first ####
    ("The answer is 3.0", "3.0", "3.0"),
    ("answer is $1,600.", "1600", "1600."),             # authors keep the trailing '.', normalised away later
    ("She has -5 apples", "-5", "-5"),
    ("it costs 40,000 dollars", "40000", "40000"),
    ("total \\boxed{18} dollars, 3 days", "18", "3"),    # default reads a boxed number before the last number
    ("no numbers here", None, ""),
    ("The result = 12 and then 7", "12", "12"),
    ("2,5 apples", None, "25"),                         # a non-thousands comma: no number (neither 25 nor 5)
    ("I have 3 apples, 5 pears", "5", "5"),
    ("#### 2,5", None, "25"),
    ("then 1,2345 items", None, "12345"),
    ("+5 degrees", "5", "+5"),                          # default drops a leading '+'; authors keep it
])
def test_extract_gsm8k(text, default, authors):
    assert A.extract_gsm8k(text) == default
    assert A.extract_gsm8k(text, mode="authors") == authors


def test_gsm8k_correct_numbers_vs_strings():
    # numbers as numbers by default; strings for the authors
    assert A.gsm8k_correct("The answer is 3.0", "3") is True
    assert A.gsm8k_correct("The answer is 3.0", "3", mode="authors") is False
    assert A.gsm8k_correct("#### 5.50", "5.5") is True
    assert A.gsm8k_correct("#### 5.50", "5.5", mode="authors") is False
    # thousands separators and $ on either side
    assert A.gsm8k_correct("#### $2,125", "2,125") and A.gsm8k_correct("#### $2,125", "2,125", mode="authors")
    # an empty prediction equals an empty gold only for the authors
    assert A.gsm8k_correct("Hello, world", "", mode="authors") is True
    assert A.gsm8k_correct("Hello, world", "") is False
    assert A.gsm8k_correct("", "") is False
    # wrong is wrong in both modes
    assert not A.gsm8k_correct("#### 7", "8") and not A.gsm8k_correct("#### 7", "8", mode="authors")


def test_gsm8k_gold_from_full_solution():
    sol = "Janet has 3 + 4 = <<3+4=7>>7 eggs.\n#### 1,007"
    assert A.gsm8k_gold(sol) == "1007"
    # authors: the rest of the line after the first '####', stripped, commas removed; no '####': ""
    assert A.gsm8k_gold(sol, "authors") == "1007"
    assert A.gsm8k_gold("#### 5\n#### 6 ", "authors") == "5" and A.gsm8k_gold("#### 5\n#### 6 ") == "5"
    assert A.gsm8k_gold(" 1,234 ", "authors") == "" and A.gsm8k_gold(" 1,234 ") == "1234"
    assert A.gsm8k_gold("72 apples", "authors") == ""
    assert A.gsm8k_correct("#### 72", "72 apples", "authors") is False  # "72" != "72apples"
    assert A.gsm8k_correct("#### 1007", sol)
    assert A.gsm8k_correct("#### 1007", A.gsm8k_gold(sol, "authors"), mode="authors")


def test_bad_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        A.extract_gsm8k("1", mode="paper")
    with pytest.raises(ValueError, match="'x'"):
        A.math_correct("1", "1", mode="x")


@needs_data
def test_gsm8k_100_golds_score_themselves():
    rows = _rows("gsm8k_100.jsonl")
    assert len(rows) == 100
    for r in rows:
        g = r["gold_answer"]
        reply = f"Let me compute. Step 1: 2 + 2 = 4.\n#### {g}"
        assert A.gsm8k_correct(reply, g) and A.gsm8k_correct(reply, g, mode="authors")
    # the authors' string compare fails on a trailing .0 for every gold; default accepts all
    acc_d = sum(A.gsm8k_correct(f"The answer is {r['gold_answer'].replace(',', '')}.0", r["gold_answer"]) for r in rows)
    acc_a = sum(A.gsm8k_correct(f"The answer is {r['gold_answer'].replace(',', '')}.0", r["gold_answer"], "authors")
                for r in rows)
    assert (acc_d, acc_a) == (100, 0)


# --------------------------------------------------------------------------- MATH

def test_boxed_nesting():
    nested = r"so the value is \boxed{\frac{\sqrt{3}}{2}}."
    assert A.extract_math(nested) == r"\frac{\sqrt{3}}{2}"
    assert A.extract_math(nested, mode="authors") == ""            # one nesting level only
    assert A.extract_math(r"\boxed{\frac{1}{2}}", mode="authors") == r"\frac{1}{2}"
    assert A.extract_math(r"\boxed{1} and finally \boxed{ 5 }") == "5"
    assert A.last_boxed(r"\boxed{a \{ b \} c}") == r"a \{ b \} c"  # escaped braces do not count
    assert A.last_boxed(r"\boxed{unclosed") is None
    assert A.extract_math(r"\fbox{\dfrac{8}{3}}") == r"\dfrac{8}{3}"


def test_math_gold_two_levels_deep_is_empty_in_authors_mode():
    """The authors' gold uses the same one-level regex as their prediction: two brace levels give ""."""
    sol = r"Hence $\cos 30^\circ = \boxed{\frac{\sqrt{3}}{2}}$."
    assert A.extract_math_gold(sol) == r"\frac{\sqrt{3}}{2}"
    gold_a = A.extract_math_gold(sol, mode="authors")
    assert gold_a == ""
    # the nested answer extracts "" too, and "" == "": correct in authors mode -- as is a reply with no answer
    assert A.math_correct(r"\boxed{\frac{\sqrt{3}}{2}}", gold_a, mode="authors") is True
    assert A.math_correct("I give up", gold_a, mode="authors") is True
    assert A.math_correct(r"\boxed{\frac{\sqrt{3}}{2}}", A.extract_math_gold(sol)) is True
    assert A.math_correct("I give up", A.extract_math_gold(sol)) is False
    # authors: last regex match of \boxed{ only (no \fbox), one nesting level, "" when none matches
    assert A.authors_last_boxed(r"\boxed{1} then \boxed{ {2} }") == "{2}"
    assert A.authors_last_boxed(r"\fbox{3}") == "" and A.extract_math_gold(r"\fbox{3}") == "3"
    assert A.authors_last_boxed(r"\boxed{a \{ b") == ""
    assert A.authors_last_boxed(r"\boxed{a \{ b \} c}") == r"a \{ b \} c"
    assert A.extract_math_gold("no box", "authors") == "" and A.extract_math_gold("no box") is None


def test_answer_is_fallback():
    assert A.extract_math("The answer is 3.14.") == "3.14"
    assert A.extract_math("The answer is 3.14.", mode="authors") == "3"
    assert A.math_correct("The answer is 3.14.", "3.14") is True
    assert A.math_correct("The answer is 3.14.", "3.14", mode="authors") is False
    assert A.extract_math("The answer is $\\frac{1}{2}$. Done") == "\\frac{1}{2}"
    assert A.extract_math("nothing to see") is None
    assert A.extract_math("nothing to see", mode="authors") == ""


@pytest.mark.parametrize("pred, gold", [
    (r"\boxed{\dfrac{8}{3}}", r"\frac83"),
    (r"\boxed{7.5}", r"\$7.50"),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"\boxed{90}", r"90^\circ"),
    (r"\boxed{Tuesday}", r"\text{Tuesday}"),
    (r"\boxed{5}", "x=5"),
    (r"\boxed{\sqrt{5}}", r"\sqrt5"),
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{10000}", "10,000"),
])
def test_math_default_normalisation_accepts(pred, gold):
    assert A.math_correct(pred, gold) is True


@pytest.mark.parametrize("pred, gold", [
    (r"\boxed{\frac{8}{5}}", r"\frac83"),
    (r"\boxed{3}", r"\sqrt3"),
    (r"\boxed{(3,2)}", r"(2,3)"),
])
def test_math_default_rejects(pred, gold):
    assert A.math_correct(pred, gold) is False


def test_parse_number():
    from fractions import Fraction
    assert A.parse_number("1,234.50") == Fraction(246900, 200)
    assert A.parse_number(r"-\frac{3}{4}") == Fraction(-3, 4)
    assert A.parse_number("3/4") == Fraction(3, 4)
    assert A.parse_number("1/0") is None and A.parse_number("abc") is None and A.parse_number("") is None


@needs_data
def test_math_100_golds_score_themselves():
    rows = _rows("math_100.jsonl")
    assert len(rows) == 100
    for r in rows:
        reply = f"We simplify step by step. Therefore the answer is $\\boxed{{{r['gold_answer']}}}$."
        assert A.math_correct(reply, r["gold_answer"]), r["gold_answer"]
    # the authors' "answer is" fallback cuts decimals such as 27.2 and '\$7.50' at the first period
    unboxed = [r for r in rows if not A.math_correct(f"The answer is {r['gold_answer']}.", r["gold_answer"], "authors")]
    assert sorted(r["gold_answer"] for r in unboxed) == ["27.2", "\\$7.50"]
