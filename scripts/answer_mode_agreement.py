"""Measure how often the `default` and `authors` answer-scoring modes disagree on the shipped GSM8K / MATH data.

Usage: python scripts/answer_mode_agreement.py [DATA_DIR]   (default: ../shared/data next to the repo)
Prints a Markdown table (the one in docs/evaluation.md, section "Scoring").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsl_llada.eval.answers import extract_math_gold, gsm8k_correct, math_correct


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def row(name: str, pairs: list[tuple[str, str]], fn) -> str:
    d = [fn(p, g, "default") for p, g in pairs]
    a = [fn(p, g, "authors") for p, g in pairs]
    dis = sum(x != y for x, y in zip(d, a))
    return (f"| {name} | {len(pairs)} | {100 * sum(d) / len(pairs):.1f} | {100 * sum(a) / len(pairs):.1f} | "
            f"{dis} ({100 * dis / len(pairs):.1f} %) |")


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data"
    gsm_test = load(data / "gsm8k_test.jsonl")
    gsm_full = load(data / "gsm8k_full.jsonl")
    gsm100 = load(data / "gsm8k_100.jsonl")
    m500 = load(data / "math500_test.jsonl")
    m100 = load(data / "math_100.jsonl")
    lines = ["| reply set (gold = the dataset's answer) | n | default acc % | authors acc % | disagreements |",
             "|---|---|---|---|---|"]
    # gold vs gold: the reference solution (ending in '#### N') as the reply
    lines.append(row("GSM8K test: reference solution as reply", [(r["answer"], f["gold_answer"])
                                                                for r, f in zip(gsm_test, gsm_full)], gsm8k_correct))
    lines.append(row("GSM8K test: bare gold answer as reply", [(f["gold_answer"], f["gold_answer"]) for f in gsm_full],
                     gsm8k_correct))
    lines.append(row("MATH-500: reference solution as reply", [(r["solution"], r["answer"]) for r in m500],
                     math_correct))
    lines.append(row("MATH-100: `\\boxed{gold}` as reply", [(f"\\boxed{{{r['gold_answer']}}}", r["gold_answer"])
                                                           for r in m100], math_correct))
    # synthetic replies on gsm8k_100 golds
    synth = {
        "GSM8K-100: 'The answer is {g}.0'": lambda g: f"Adding up, the answer is {g.replace(',', '')}.0",
        "GSM8K-100: '#### {g}' then a stray '#### 0'": lambda g: f"#### {g}\n#### 0",
        "GSM8K-100: '... so {g} dollars. Hello, world'": lambda g: f"So the total is {g} dollars. Hello, world",
        "GSM8K-100: no answer ('I do not know.')": lambda g: "I do not know.",
    }
    for name, make in synth.items():
        lines.append(row(name, [(make(r["gold_answer"]), r["gold_answer"]) for r in gsm100], gsm8k_correct))
    synth_m = {
        "MATH-100: 'The answer is {g}.' (no box)": lambda g: f"The answer is {g}.",
        "MATH-100: no answer ('I do not know.')": lambda g: "I do not know.",
    }
    for name, make in synth_m.items():
        lines.append(row(name, [(make(r["gold_answer"]), r["gold_answer"]) for r in m100], math_correct))
    print("\n".join(lines))
    # gold extraction from MATH-500 solutions
    empty_a = sum(extract_math_gold(r["solution"], "authors") == "" for r in m500)
    diff_a = sum(extract_math_gold(r["solution"], "authors") != r["answer"] for r in m500)
    diff_d = sum(extract_math_gold(r["solution"], "default") != r["answer"] for r in m500)
    no_answer_correct = sum(math_correct("I do not know.", extract_math_gold(r["solution"], "authors"), "authors")
                            for r in m500)
    print(f"\nMATH-500 gold extracted from `solution`: the authors' gold extraction (their one-level regex) is empty for "
          f"{empty_a}/500, differs from the "
          f"`answer` field for {diff_a}/500; balanced parser differs for {diff_d}/500; with the authors' golds a "
          f"reply with no answer scores correct on {no_answer_correct}/500.")


if __name__ == "__main__":
    main()
