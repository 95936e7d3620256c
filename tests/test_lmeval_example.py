"""The lm-eval worked example of docs/evaluation.md, executed as written: the builder script, the `dsl-llada lm-eval`
command (its printed table must equal the documented output) and the Python `simple_evaluate(model="dsl-llada")`
snippet."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from eval_fixtures import data_dir

lm_eval = pytest.importorskip("lm_eval")

from dsl_llada.cli.main import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "evaluation.md"


def _block(marker: str) -> str:
    """The fenced code block right after `<!-- lmeval-example:MARKER -->` in the docs."""
    m = re.search(r"<!-- lmeval-example:" + marker + r" -->\n```\w*\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/evaluation.md has no lmeval-example:{marker} block"
    return m.group(1)


def _table(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("|")]


def test_documented_lm_eval_example_runs_and_prints_the_documented_table(tmp_path, capsys, one_thread, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    DATA = data_dir()
    lines = [x for x in _block("commands").splitlines() if x.strip() and not x.startswith("export ")]
    assert len(lines) == 2 and lines[0].startswith("python scripts/lmeval_tiny_example.py")
    out = tmp_path / "lmeval-tiny"
    build_args = shlex.split(lines[0].replace("/tmp/lmeval-tiny", str(out)).replace("DATA_DIR", str(DATA)))
    spec = importlib.util.spec_from_file_location("lmeval_tiny_example", ROOT / build_args[1])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    paths = script.build(build_args[2], build_args[4])
    assert paths["model"].is_dir() and (paths["tasks"] / "gsm_local.yaml").is_file()
    cmd = shlex.split(lines[1].replace("/tmp/lmeval-tiny", str(out)))
    assert cmd[0] == "dsl-llada"
    capsys.readouterr()
    assert main(cmd[1:]) == 0
    printed = capsys.readouterr().out
    assert _table(printed) == _table(_block("output"))
    res = json.loads((out / "results.json").read_text())["results"]["gsm_local"]
    assert res["exact_match,none"] == 0.0

    snippet = _block("python").replace("/tmp/lmeval-tiny", str(out))
    ns: dict = {}
    exec(compile(snippet, "docs/evaluation.md:lmeval-example:python", "exec"), ns)
    assert ns["res"]["results"]["gsm_local"]["exact_match,none"] == res["exact_match,none"]
    assert ns["res"]["n-samples"]["gsm_local"]["effective"] == 4
