"""Puts `tests/` on the import path so the fault tests share `faults_helpers` with the older fault tests; the suite's
own helpers are in `fault_utils.py`."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
