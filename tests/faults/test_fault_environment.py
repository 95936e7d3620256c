"""The environment record says what is in effect (docs/reliability.md, fault table): an OpenMP wait setting the
runtime would reject is replaced by the CLI's own (one warning, both values recorded), and a user's glibc malloc
threshold is recorded as the number glibc reads."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from dsl_llada.runtime import allocator, openmp

# the CLI's import (which makes the settings), then one parallel region, then the record
_SCRIPT = ("import json, sys, dsl_llada.cli.main\nimport torch\ntorch.set_num_threads(2)\ntorch.ones(1 << 17).add_(1)\n"
           "from dsl_llada.runtime.environment import environment_record\nrec = environment_record()\n"
           "print(json.dumps({'threads': rec['threads'], 'malloc': rec['malloc']}))\n")


def _cli_process(**extra: str) -> tuple[dict, str]:
    """(threads and malloc of the environment record, stderr) of a process that imported the CLI with `extra` set."""
    env = {k: v for k, v in os.environ.items() if k not in openmp.VARIABLES + allocator.USER_VARIABLES}
    env.update(extra, OMP_DISPLAY_ENV="VERBOSE")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _shown(stderr: str, name: str) -> str | None:
    """What GNU OpenMP says it runs with for `name` (OMP_DISPLAY_ENV), or None when it does not report it."""
    for line in stderr.splitlines():
        if line.strip().startswith(f"{name} = "):
            return line.split("=", 1)[1].strip().strip("'")
    return None


@pytest.mark.parametrize("name, value", [("GOMP_SPINCOUNT", "banana"), ("OMP_WAIT_POLICY", "banana"),
                                         ("KMP_BLOCKTIME", "-3")])
def test_a_wait_setting_openmp_rejects_is_replaced_by_the_clis_and_both_are_recorded(name, value):
    record, err = _cli_process(**{name: value})
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert warnings == [f"warning: {name}={value!r} is not a value OpenMP accepts ({openmp.ACCEPTED[name][1]}); it is "
                        f"ignored and GOMP_SPINCOUNT={openmp.SPIN_COUNT}, KMP_BLOCKTIME=0 applies instead"]
    threads = record["threads"]
    assert threads["openmp_ignored"] == {name: value}
    assert threads["gomp_spincount"] == str(openmp.SPIN_COUNT) and threads["kmp_blocktime"] == "0"
    assert threads["omp_wait_policy"] is None
    if "OPENMP DISPLAY ENVIRONMENT" in err:  # GNU OpenMP runs with the CLI's spin count, not its own fallback
        assert _shown(err, "GOMP_SPINCOUNT") == str(openmp.SPIN_COUNT)
        assert "Invalid value for environment variable" not in err


def test_an_accepted_wait_setting_is_kept_and_recorded_as_given():
    record, err = _cli_process(GOMP_SPINCOUNT=" 20k ")
    assert not [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert record["threads"]["gomp_spincount"] == " 20k " and record["threads"]["openmp_ignored"] is None
    if "OPENMP DISPLAY ENVIRONMENT" in err:
        assert _shown(err, "GOMP_SPINCOUNT") == "20000"


def test_an_invalid_setting_beside_a_valid_one_leaves_the_valid_one_in_charge(monkeypatch, capsys):
    monkeypatch.setattr(openmp, "ignored", {})
    env = {"GOMP_SPINCOUNT": "banana", "OMP_WAIT_POLICY": "passive"}
    assert openmp.set_wait_defaults(env) == {}
    assert env == {"OMP_WAIT_POLICY": "passive"} and openmp.ignored == {"GOMP_SPINCOUNT": "banana"}
    assert capsys.readouterr().err.endswith("it is ignored and your other setting OMP_WAIT_POLICY=passive applies "
                                            "instead\n")


@pytest.mark.parametrize("name, good, bad", [
    ("GOMP_SPINCOUNT", ["0", "1000", " 10k ", "2M", "3 g", "1T", "+5", "infinite", "INFINITY", str(2**64 - 1)],
     ["", " ", "banana", "-5", "1.5", "10kk", "k", "10 x", "infinite!", str(2**64)]),
    ("OMP_WAIT_POLICY", ["active", "PASSIVE", " Passive "], ["", "spin", "activ", "PASSIVE x"]),
    ("KMP_BLOCKTIME", ["0", "200", "1.5", "2s", "5ms", "10 us", "1e3", "infinite", "Infinity"],
     ["", "-1", "fast", "1.5.2", "5 weeks", "10x"]),
])
def test_the_accepted_values_follow_each_runtime(name, good, bad):
    assert [v for v in good if not openmp.accepts(name, v)] == []
    assert [v for v in bad if openmp.accepts(name, v)] == []


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings only")
@pytest.mark.parametrize("value, number", [("65536", 65536), ("0x10000", 65536), ("0200000", 65536)])
def test_a_users_malloc_threshold_is_recorded_as_the_number_glibc_reads(value, number):
    record, _ = _cli_process(MALLOC_MMAP_THRESHOLD_=value)
    assert record["malloc"] == {"mmap_threshold": number, "trim_threshold": None, "set_by": "MALLOC_MMAP_THRESHOLD_"}


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings only")
def test_both_malloc_thresholds_set_by_the_user_are_recorded(monkeypatch):
    monkeypatch.setattr(allocator, "in_effect", {})
    assert allocator.keep_large_buffers({"MALLOC_TRIM_THRESHOLD_": "4096", "MALLOC_MMAP_THRESHOLD_": "lots"}) == {}
    assert allocator.in_effect == {"mmap_threshold": "lots", "trim_threshold": 4096,
                                   "set_by": "MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_"}
