"""Large buffers stay in the CLI process between sampler calls (`dsl_llada/allocator.py`)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from dsl_llada.runtime import allocator

GLIBC = platform.libc_ver()[0] == "glibc"

# A backbone forward at batch 8 whose logits (8 x 128 x 32,768 floats) and softmax are 128 MB each, five times: the
# minor page faults of the last three calls say whether the freed buffers were reused (none) or handed back to the
# kernel and faulted in afresh (~65,000 pages a call).
_SCRIPT = """
import json, resource, sys
if sys.argv[1] == "cli":
    import dsl_llada.cli.main
import torch
from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.runtime.environment import environment_record
torch.set_num_threads(1)
bb = LLaDABackbone(tiny_llada_config(32768, d_model=32, n_layers=1, n_heads=2)).eval()
x = torch.randn(8, 128, 32, generator=torch.Generator().manual_seed(0))
faults = []
with torch.no_grad():
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        logits = bb(x)
        p = logits.softmax(-1)
        del logits, p
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": sum(faults[2:]), "malloc": environment_record()["malloc"]}))
"""


def _forward_faults(mode: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in allocator.USER_VARIABLES}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc thresholds only")
def test_the_cli_keeps_a_freed_large_buffer_for_the_next_one():
    plain, cli = _forward_faults("plain"), _forward_faults("cli")
    if plain["faults"] < 30_000:
        pytest.skip(f"this C library reuses large buffers by itself ({plain['faults']} faults without the setting)")
    assert cli["faults"] < 3_000 < 30_000 < plain["faults"]
    assert cli["malloc"] == {"mmap_threshold": allocator.THRESHOLD, "trim_threshold": allocator.THRESHOLD}
    assert plain["malloc"] is None  # a library user who imports torch directly keeps glibc's defaults


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc thresholds only")
def test_glibcs_own_setting_wins():
    shown = _forward_faults("cli", MALLOC_MMAP_THRESHOLD_="65536")
    assert shown["malloc"] == {"mmap_threshold": 65536, "trim_threshold": None, "set_by": "MALLOC_MMAP_THRESHOLD_"}


@pytest.mark.parametrize("name", allocator.USER_VARIABLES)
def test_a_user_threshold_means_nothing_is_set(name):
    assert allocator.keep_large_buffers({name: "1048576"}) == {}
