"""`python scripts/docs_tables.py`: docs tables name their command and environment; cheap ones are re-made and
checked against the intervals the docs state."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_tables as D  # a checkout tool (scripts/), not part of the installed package

DOC_OK = """# T

### Measured

Command: `python benchmarks/x.py`

| a | b | c |
|---|---|---|
| r1 | 1.0 | 2 % |
| r2 | 3.5 | 4 % |

Environment: dsl-llada 0.1.0 (git abc), ...
"""


def test_lint_flags_a_number_table_without_command_or_environment(tmp_path):
    (tmp_path / "ok.md").write_text(DOC_OK)
    (tmp_path / "options.md").write_text("## Options\n\n| flag | meaning |\n|---|---|\n| --x | a thing |\n| --y | b |\n")
    assert D.lint(tmp_path) == []  # an options table is not a measurement
    (tmp_path / "bad.md").write_text(DOC_OK.replace("Command: `python benchmarks/x.py`", "")
                                     .replace("Environment: dsl-llada 0.1.0 (git abc), ...", ""))
    problems = D.lint(tmp_path)
    assert len(problems) == 1 and "bad.md:3: table without command and environment" in problems[0]


def test_every_docs_table_is_traced():
    assert D.lint() == []


def test_stated_values_parse_value_and_interval():
    text = "| label | PPL | Len |\n|---|---|---|\n| world, open | 5.27 [4.83, 5.70] | 10 |\n"
    assert D.stated_values(text) == {("world, open", "PPL"): (5.27, 4.83, 5.70)}


def _table(tmp_path, monkeypatch, value: float) -> D.Table:
    monkeypatch.setattr(D, "DOCS", tmp_path)
    (tmp_path / "r.md").write_text("<!-- docs-table: t -->\n| label | PPL |\n|---|---|\n| x | 5.27 [4.83, 5.70] |\n"
                                   "<!-- /docs-table -->\n")
    return D.Table("t", "r.md", "T", lambda: ("", {("x", "PPL"): value}))


def test_check_passes_inside_the_interval_and_fails_outside(tmp_path, monkeypatch):
    assert D.check_table(_table(tmp_path, monkeypatch, 5.704)) == []  # inside, up to the docs' rounding
    problems = D.check_table(_table(tmp_path, monkeypatch, 5.9))
    assert problems == ["t: x / PPL = 5.9 is outside the stated interval [4.83, 5.7]"]
    monkeypatch.setattr(D, "DOCS", tmp_path)
    assert "no block" in D.check_table(D.Table("u", "r.md", "U", lambda: ("", {})))[0]


def test_the_cheap_reference_table_comes_back_within_its_interval():
    assert D.check_table(D.TABLES["toy-reference"]) == []


@pytest.mark.slow
def test_the_untrained_model_table_comes_back_within_its_interval():
    assert D.check_table(D.TABLES["toy-untrained"]) == []


def test_cli_rejects_unknown_tables(capsys):
    assert D.main(["--write", "nope"]) == 2
    assert "unknown table(s) ['nope']" in capsys.readouterr().err


def test_cli_lints_a_given_docs_folder_and_refuses_a_missing_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(D, "DOCS", D.DOCS)  # restored after the test (main rebinds it)
    (tmp_path / "ok.md").write_text(DOC_OK)
    assert D.main(["--lint", "--docs", str(tmp_path)]) == 0
    assert D.main(["--lint", "--docs", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
