"""Answer extraction and scoring for GSM8K and MATH, in two modes.

``mode="default"`` (correct scoring):

* GSM8K: the *last* ``#### number`` of the reply, else the last "answer/result is|= number", else the last
  ``\\boxed{number}``, else the last number in the text. A number needs at least one digit (thousands
  separators and a leading sign / ``$`` are allowed). Prediction and gold are compared **as numbers** (exact
  rationals, so ``3.0 == 3`` and ``5.50 == 5.5``). A reply without a number is never correct.
* MATH: the last ``\\boxed{...}`` (or ``\\fbox{...}``) parsed with a brace-balanced scanner, else the
  "answer is ..." fallback up to the end of the sentence (a period followed by a space / the end, so
  ``3.14`` is kept whole), then a light LaTeX normalisation (see :func:`normalize_math`); two answers that
  both parse as plain numbers or simple fractions are compared as numbers. An empty answer (or an empty gold)
  is never correct.

``mode="authors"`` reproduces the authors' ``eval_reasoning.py`` exactly, flaws included (official-impl.md
§5.8): GSM8K takes the *first* ``####`` match of the pattern ``[+-]?[\\d,]+\\.?\\d*`` (a lone comma counts as a
number, so "Hello, world" extracts ""), commas removed; both sides go through the same string normalisation
(strip, lower-case, drop ``, $ %`` and spaces, strip trailing periods) and are compared as strings, so
``3.0 != 3`` and an empty prediction equals an empty gold. MATH uses a regex that tolerates one level of
nested braces (``\\boxed{\\frac{\\sqrt{3}}{2}}`` extracts nothing), for predictions and golds alike
(:func:`authors_last_boxed`), and an "answer is" fallback for predictions that stops at the first period
("answer is 3.14" gives "3"). Their GSM8K gold is the rest of the line after the first ``####``, stripped,
commas removed, and ``""`` when there is no ``####``.

Pure functions: no model, no I/O.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "MODES",
    "authors_last_boxed",
    "authors_normalize",
    "extract_gsm8k",
    "extract_math",
    "extract_math_gold",
    "gsm8k_correct",
    "gsm8k_gold",
    "last_boxed",
    "math_correct",
    "normalize_math",
    "parse_number",
]

MODES = ("default", "authors")


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


# --------------------------------------------------------------------------- authors' regexes (facts of their code)

_A_NUM = r"[+-]?[\d,]+\.?\d*"
_A_HASH = re.compile(r"####\s*(" + _A_NUM + ")")
_A_ANSWER_IS = re.compile(r"(?:answer|result)\s*(?:is|=)\s*\$?(" + _A_NUM + ")", re.IGNORECASE)
_A_ALL_NUMS = re.compile(_A_NUM)
_A_GOLD_HASH = re.compile(r"####\s*(.+)")
_A_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_A_MATH_FALLBACK = re.compile(r"(?:answer|result)\s*(?:is|=)\s*(.+?)(?:\.|$)", re.IGNORECASE)


def authors_normalize(s: str) -> str:
    """The authors' ``normalize_answer``: strip, lower-case, remove ``,`` ``$`` ``%`` and spaces, strip trailing '.'."""
    s = s.strip().lower()
    for ch in (",", "$", "%", " "):
        s = s.replace(ch, "")
    return s.rstrip(".")


# --------------------------------------------------------------------------- numbers (default mode)

# at least one digit; thousands groups "1,234,567" or plain digits; optional decimals; or ".5"
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# a number is a whole token: "2,5" (a comma that is not a thousands separator) is no number at all -- neither
# 25 nor 2.5 -- instead of the two numbers "2" and "5"; "1,2345" likewise
_NUM_END = r"(?!,?\d)"
_SIGNED_NUM = re.compile(r"(?<![\w.])(?<!\d,)(-?)\$?\s?(" + _NUM + r")" + _NUM_END)
_HASH = re.compile(r"####\s*\$?\s*(-?\$?\s?(?:" + _NUM + "))" + _NUM_END)
_ANSWER_IS = re.compile(r"(?:answer|result)\s*(?:is|=|:)\s*\$?\s*(-?\$?\s?(?:" + _NUM + "))" + _NUM_END,
                        re.IGNORECASE)
_FRACTION = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$|^(-?\d+)/(\d+)$")


def parse_number(text: str | None) -> Fraction | None:
    """An exact rational for a plain number ("1,234.50", "-3", "$7", ".5", "3/4", "\\frac{3}{4}"), else None."""
    if text is None:
        return None
    s = text.strip().replace("\\$", "").replace("$", "").replace(" ", "").rstrip(".")
    s = s.replace("\\!", "").replace("{,}", ",")
    if not s:
        return None
    m = re.fullmatch(r"([+-]?)(" + _NUM + ")", s)
    if m:
        return Fraction(m.group(2).replace(",", "")) * (-1 if m.group(1) == "-" else 1)
    m = _FRACTION.match(s)
    if m:
        if m.group(2) is not None:
            num, den, neg = int(m.group(2)), int(m.group(3)), m.group(1) == "-"
        else:
            num, den, neg = int(m.group(4)), int(m.group(5)), False
        if den == 0:
            return None
        return Fraction(num, den) * (-1 if neg else 1)
    return None


def _clean_num(s: str) -> str:
    return s.replace("$", "").replace(" ", "").replace(",", "")


# --------------------------------------------------------------------------- GSM8K

def extract_gsm8k(text: str, mode: str = "default") -> str | None:
    """The predicted final answer of a GSM8K reply (commas removed).

    Default: last ``####`` number, else last "answer is" number, else last ``\\boxed{}`` number, else the last
    number; ``None`` when the reply holds no number. Authors: their three-step regex cascade with the *first*
    match of the first two steps, returning ``""`` (never ``None``) when nothing matches.
    """
    _check_mode(mode)
    if mode == "authors":
        for pat in (_A_HASH, _A_ANSWER_IS):
            m = pat.search(text)
            if m:
                return m.group(1).replace(",", "")
        nums = _A_ALL_NUMS.findall(text)
        return nums[-1].replace(",", "") if nums else ""
    for pat in (_HASH, _ANSWER_IS):
        hits = pat.findall(text)
        if hits:
            return _clean_num(hits[-1])
    boxed = [b for b in _all_boxed(text) if parse_number(b) is not None]
    if boxed:
        return _clean_num(boxed[-1].replace("\\$", ""))
    hits = _SIGNED_NUM.findall(text)
    if hits:
        sign, num = hits[-1]
        return sign + num.replace(",", "")
    return None


def gsm8k_gold(gold_text: str, mode: str = "default") -> str:
    """The gold answer.

    Default: the rest of the line after the first ``####`` when present (the dataset's ``answer`` field), else
    the whole string (an already-extracted ``gold_answer``); stripped, commas removed.
    Authors: the rest of the line after the first ``####`` (whitespace after the marker skipped), stripped,
    commas removed; ``""`` when there is no ``####`` (so a bare gold answer gives an empty gold).
    """
    _check_mode(mode)
    m = _A_GOLD_HASH.search(gold_text)
    if mode == "authors" and m is None:
        return ""
    s = m.group(1) if m else gold_text
    return s.strip().replace(",", "")


def gsm8k_correct(pred_text: str, gold_text: str, mode: str = "default") -> bool:
    """Whether a GSM8K reply is correct. Default: ``gold_text`` is either a bare answer ("2,125") or a full
    reference solution ending in ``#### answer``. Authors: ``gold_text`` is the gold answer as their data files
    hold it (``gold_answer``; take it out of a solution with ``gsm8k_gold(solution, "authors")``), compared
    after their normalisation."""
    _check_mode(mode)
    pred = extract_gsm8k(pred_text, mode)
    if mode == "authors":
        return authors_normalize(pred or "") == authors_normalize(gold_text)
    gold = gsm8k_gold(gold_text, mode)
    p, g = parse_number(pred), parse_number(gold)
    if p is None or g is None:
        return False
    return p == g


# --------------------------------------------------------------------------- MATH

def _all_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces (unbalanced tails are skipped)."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            c = text[i]
            if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2  # escaped brace \{ \} does not count
                continue
            depth += (c == "{") - (c == "}")
            i += 1
        if depth == 0:
            out.append(text[m.end():i - 1])
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last brace-balanced ``\\boxed{}`` (or ``\\fbox{}``), stripped; ``None`` when there is none."""
    b = _all_boxed(text)
    return b[-1].strip() if b else None


_FALLBACK = re.compile(r"(?:answer|result)\s*(?:is|=|:)\s*(.+?)(?:\.(?=\s|$)|\n|$)", re.IGNORECASE)


def extract_math(text: str, mode: str = "default") -> str | None:
    """The predicted final answer of a MATH reply.

    Default: last balanced ``\\boxed{}``, else the last "answer is X" up to the end of the sentence (``$``
    stripped); ``None`` when neither exists. Authors: last match of their one-nesting-level regex, else the
    first "answer is" match cut at the first period; ``""`` when nothing matches.
    """
    _check_mode(mode)
    if mode == "authors":
        hits = _A_BOXED.findall(text)
        if hits:
            return hits[-1].strip()
        m = _A_MATH_FALLBACK.search(text)
        return m.group(1).strip() if m else ""
    b = last_boxed(text)
    if b is not None:
        return b
    hits = _FALLBACK.findall(text)
    if hits:
        ans = hits[-1].strip().strip("$").strip()
        return ans or None
    return None


def authors_last_boxed(solution: str) -> str:
    """The authors' gold extraction for MATH: the same one-nesting-level ``\\boxed{...}`` regex as their
    prediction, last match, stripped; ``""`` when none matches (so ``\\boxed{\\frac{\\sqrt{2}}{2}}``, two
    levels deep, gives ``""``)."""
    hits = _A_BOXED.findall(solution)
    return hits[-1].strip() if hits else ""


def extract_math_gold(solution: str, mode: str = "default") -> str | None:
    """The gold answer of a MATH solution: default: the last boxed expression with balanced braces (also
    ``\\fbox``, escaped braces skipped), ``None`` when there is none; authors: :func:`authors_last_boxed`
    (one nesting level, ``""`` when none matches)."""
    _check_mode(mode)
    if mode == "authors":
        return authors_last_boxed(solution)
    return last_boxed(solution)


def _strip_text_macros(s: str) -> str:
    """``\\text{abc}`` / ``\\textbf{}`` / ``\\mbox{}`` / ``\\mathrm{}`` -> ``abc`` (balanced, repeated)."""
    pat = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf)\s*\{")
    while True:
        m = pat.search(s)
        if not m:
            return s
        depth, i = 1, m.end()
        while i < len(s) and depth:
            depth += (s[i] == "{") - (s[i] == "}")
            i += 1
        if depth:
            return s
        s = s[:m.start()] + s[m.end():i - 1] + s[i:]


def normalize_math(ans: str) -> str:
    """Light LaTeX normalisation of a MATH answer (for string comparison).

    Removes ``$``, ``\\$``, ``\\left``/``\\right``, spacing macros (``\\! \\, \\; \\:`` ``\\quad``), ``\\text{}``-like
    wrappers (keeping their content), degrees (``^\\circ``, ``^{\\circ}``), percent signs, all whitespace and a
    trailing period; ``\\dfrac``/``\\tfrac`` -> ``\\frac``; braces single-character ``\\frac``/``\\sqrt`` arguments
    (``\\frac83`` -> ``\\frac{8}{3}``, ``\\sqrt5`` -> ``\\sqrt{5}``); drops a leading ``x=`` style single-variable
    left-hand side; lower-cases; removes thousands separators in plain integers ("1,000" -> "1000").
    """
    s = ans.strip()
    s = _strip_text_macros(s)
    s = s.replace("\\$", "").replace("$", "")
    for macro in ("\\left", "\\right", "\\displaystyle"):
        s = s.replace(macro, "")
    s = re.sub(r"\\[!,;:]|\\quad|\\qquad|~", "", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    m = re.fullmatch(r"[a-zA-Z]=(.+)", s)
    if m:
        s = m.group(1)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s.lower()


def math_correct(pred_text: str, gold_answer: str, mode: str = "default") -> bool:
    """Whether a MATH reply is correct against an already-extracted gold answer (e.g. ``math_100``'s
    ``gold_answer`` or MATH-500's ``answer``). Authors: normalised string equality (so an empty extraction
    matches an empty gold). Default: equal normalised strings, or equal values when both are plain numbers or
    simple fractions; an empty prediction or gold is never correct."""
    _check_mode(mode)
    pred = extract_math(pred_text, mode)
    if mode == "authors":
        return authors_normalize(pred or "") == authors_normalize(gold_answer)
    if pred is None:
        return False
    p, g = normalize_math(pred), normalize_math(gold_answer)
    if not p or not g:
        return False
    if p == g:
        return True
    pn, gn = parse_number(p), parse_number(g)
    return pn is not None and gn is not None and pn == gn
