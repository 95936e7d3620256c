"""How the CLI's OpenMP threads wait: a bounded spin unless the user chose otherwise (`dsl_llada/openmp.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dsl_llada.runtime.openmp import SPIN_COUNT, VARIABLES, set_wait_defaults


def test_defaults_are_a_bounded_spin_for_gnu_openmp_and_sleep_for_llvm_openmp():
    env = {"PATH": "/bin"}
    chosen = set_wait_defaults(env)
    assert chosen == {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "0"}
    assert env == {"PATH": "/bin", **chosen}
    assert "OMP_WAIT_POLICY" not in env  # a policy would override the spin count (PASSIVE = no spin at all)


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "ACTIVE"), ("OMP_WAIT_POLICY", "PASSIVE"),
                                         ("GOMP_SPINCOUNT", "5"), ("KMP_BLOCKTIME", "200")])
def test_any_user_setting_is_kept_as_given(name, value):
    env = {name: value}
    assert set_wait_defaults(env) == {}
    assert env == {name: value}
    assert name in VARIABLES


def _openmp_display(extra: dict[str, str]) -> str:
    """What GNU OpenMP reports it read at start (OMP_DISPLAY_ENV) when torch loads after `dsl_llada.cli.main`."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(extra, OMP_DISPLAY_ENV="VERBOSE")
    code = ("import sys, dsl_llada.cli.main\nassert 'torch' not in sys.modules, 'torch loaded before the wait settings'\n"
            "import torch\ntorch.set_num_threads(2)\ntorch.ones(1 << 17).add_(1)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if "OPENMP DISPLAY ENVIRONMENT" not in out.stderr + out.stdout:
        pytest.skip("this torch build's OpenMP runtime does not report its settings (not GNU OpenMP)")
    return out.stderr + out.stdout


def test_the_cli_import_sets_the_spin_count_before_openmp_starts():
    shown = _openmp_display({})
    assert f"GOMP_SPINCOUNT = '{SPIN_COUNT}'" in shown


def test_a_user_wait_policy_reaches_openmp_unchanged():
    shown = _openmp_display({"OMP_WAIT_POLICY": "ACTIVE"})
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in shown
    assert f"GOMP_SPINCOUNT = '{SPIN_COUNT}'" not in shown
