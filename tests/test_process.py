"""`dsl_llada.configure_process`: the CLI's process settings for library users, as one explicit call."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import warnings

import pytest
import torch

import dsl_llada
from dsl_llada.runtime import allocator
from dsl_llada.runtime.openmp import MAX_THREADS, SPIN_COUNT, VARIABLES
from dsl_llada.runtime.process import FIXED, WAITS, ProcessSettings, configure_process, openmp_started, wait_environment


@pytest.fixture
def clean_wait_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_call_is_on_the_package_and_importing_it_loads_no_torch():
    assert dsl_llada.configure_process is configure_process
    code = "import sys, dsl_llada\nprint('torch' in sys.modules, dsl_llada.runtime.process.openmp_started())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("choice, expected", [
    ("bounded", {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "0"}),
    ("passive", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None}),
    ("active", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None}),
])
def test_an_explicit_choice_replaces_every_wait_variable_the_environment_had(choice, expected):
    env = {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "7", "KMP_BLOCKTIME": "200"}
    assert wait_environment(choice, env) == expected
    assert env == {"PATH": "/bin", **FIXED[choice]}


def test_the_cli_choice_keeps_a_valid_user_setting_and_fills_in_the_spin_otherwise(capsys):
    mine = {"OMP_WAIT_POLICY": "passive"}
    assert wait_environment("cli", mine) == {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": None,
                                             "KMP_BLOCKTIME": None}
    empty: dict[str, str] = {}
    assert wait_environment("cli", empty)["GOMP_SPINCOUNT"] == str(SPIN_COUNT)
    assert empty == {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "0"}
    bad = {"GOMP_SPINCOUNT": "lots"}
    assert wait_environment("cli", bad) == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(SPIN_COUNT),
                                            "KMP_BLOCKTIME": "0"}
    assert "GOMP_SPINCOUNT='lots' is not a value OpenMP accepts" in capsys.readouterr().err


def test_unchanged_leaves_the_environment_alone():
    env = {"GOMP_SPINCOUNT": "5"}
    assert wait_environment("unchanged", env) == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "5",
                                                  "KMP_BLOCKTIME": None}
    assert env == {"GOMP_SPINCOUNT": "5"}
    assert set(WAITS) == {"cli", "bounded", "passive", "active", "unchanged"}


@pytest.mark.parametrize("kwargs, message", [
    ({"openmp_wait": "fast"},
     "openmp_wait must be one of 'cli', 'bounded', 'passive', 'active', 'unchanged', got 'fast'"),
    ({"openmp_wait": None}, "openmp_wait must be one of 'cli', 'bounded', 'passive', 'active', 'unchanged', got None"),
    ({"threads": 0}, f"threads must be an integer from 1 to {MAX_THREADS}, got 0"),
    ({"threads": MAX_THREADS + 1}, f"threads must be an integer from 1 to {MAX_THREADS}, got {MAX_THREADS + 1}"),
    ({"threads": True}, f"threads must be an integer from 1 to {MAX_THREADS}, got True"),
    ({"threads": "2"}, f"threads must be an integer from 1 to {MAX_THREADS}, got '2'"),
    ({"keep_large_buffers": "yes"}, "keep_large_buffers must be True or False, got 'yes'"),
])
def test_bad_values_are_named_and_nothing_is_changed(clean_wait_env, kwargs, message):
    threads = torch.get_num_threads()
    env = dict(os.environ)
    with pytest.raises(ValueError) as err:
        configure_process(**kwargs)
    assert str(err.value) == message
    assert dict(os.environ) == env and torch.get_num_threads() == threads


def test_after_torch_it_sets_threads_and_buffers_warns_and_leaves_the_wait_variables(clean_wait_env):
    assert openmp_started()  # this test process imported torch
    with pytest.warns(RuntimeWarning, match=r"came after OpenMP started .* before the first `import torch`"):
        s = configure_process(threads=1, openmp_wait="bounded")
    assert isinstance(s, ProcessSettings)
    assert (s.threads, torch.get_num_threads(), s.openmp_wait, s.openmp_applied) == (1, 1, "bounded", False)
    assert s.openmp_environment == {name: None for name in VARIABLES}
    assert not any(name in os.environ for name in VARIABLES)
    if platform.libc_ver()[0] == "glibc" and not any(v in os.environ for v in allocator.USER_VARIABLES):
        assert s.malloc == {"mmap_threshold": allocator.THRESHOLD, "trim_threshold": allocator.THRESHOLD}


def test_unchanged_after_torch_does_not_warn_and_buffers_can_be_left_alone(clean_wait_env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = configure_process(threads=2, openmp_wait="unchanged", keep_large_buffers=False)
    assert (s.threads, s.openmp_applied, s.malloc) == (2, True, {})


def _openmp_report(call: str) -> tuple[str, str]:
    """(what the call returned, what GNU OpenMP reported it read at start) in a fresh interpreter that calls
    `call` and then imports torch."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    code = (f"import sys, dsl_llada\ns = {call}\nassert 'torch' in sys.modules\nprint(repr(s))\n"
            "import torch\ntorch.ones(1 << 17).add_(1)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if "OPENMP DISPLAY ENVIRONMENT" not in out.stderr + out.stdout:
        pytest.skip("this torch build's OpenMP runtime does not report its settings (not GNU OpenMP)")
    return out.stdout, out.stderr + out.stdout


def test_called_first_the_bounded_spin_reaches_openmp():
    returned, shown = _openmp_report("dsl_llada.configure_process(threads=2)")
    assert f"GOMP_SPINCOUNT = '{SPIN_COUNT}'" in shown
    assert "openmp_applied=True" in returned and "threads=2" in returned


def test_called_first_a_passive_choice_reaches_openmp():
    returned, shown = _openmp_report("dsl_llada.configure_process(threads=1, openmp_wait='passive')")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in shown
    assert f"GOMP_SPINCOUNT = '{SPIN_COUNT}'" not in shown
    assert "openmp_applied=True" in returned and "threads=1" in returned
