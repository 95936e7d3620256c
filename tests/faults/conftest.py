"""Puts `tests/` on the import path so the fault tests share `faults_helpers` with the older fault tests; the suite's
own helpers are in `fault_utils.py`. `models`: a tiny backbone folder and its converted DSL checkpoint (per module)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(backbone folder, DSL checkpoint folder) made with `dsl-llada convert`."""
    from faults_helpers import make_backbone_dir

    from dsl_llada.cli.main import main

    root = tmp_path_factory.mktemp("models")
    backbone = make_backbone_dir(root / "backbone")
    assert main(["convert", str(backbone), str(root / "dsl"), "--noise-dim", "8"]) == 0
    return backbone, root / "dsl"
