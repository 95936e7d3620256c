"""Where a number was made: one environment record for every artifact (results, checkpoints, benchmark files,
the server's `/health`).

`environment_record()` captures the package version and git commit (when run from a checkout, with a dirty flag),
the versions of the libraries that change numbers, the device and dtype, the CPU model and the instruction set
torch dispatches to, the GPU when one is used, thread counts, determinism flags, seeds and the 1-minute load
average. `finish_record()` adds the load average at the end of a run. Nothing here changes any setting except
`set_threads()`, the one place a command sets its intra-op thread count (`--threads N`; default `usable_cpus()`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from . import allocator, openmp
from .openmp import MAX_THREADS, check_threads
from ..version import __version__

__all__ = ["MAX_THREADS", "cpu_flags", "cpu_model", "default_threads", "environment_footer", "environment_record",
           "finish_record", "git_state",
           "has_native_bf16", "load_average", "set_threads", "usable_cpus"]

_LIBRARIES = ("torch", "transformers", "numpy", "accelerate", "safetensors", "tokenizers")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (Linux); empty elsewhere."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    return info


def cpu_model() -> str:
    """The CPU's marketing name ('AMD EPYC ...', 'Intel(R) Xeon(R) ...'), or the platform's processor string."""
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel reports them (x86 'flags', arm 'Features'); empty when unknown."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """True when the CPU computes bf16 matmuls natively (Intel AMX-BF16, AVX512-BF16, or arm's bf16 extension);
    on an AVX2-only CPU bf16 is emulated and ~400x slower than fp32. Decided from the flags, never the vendor."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, further capped by a cgroup v2 CPU quota when one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) // int(period))))
    return max(1, n)


def default_threads() -> int:
    """The intra-op thread default: the CPUs this process may use (`usable_cpus()`; torch's own default counts the
    machine's cores instead), except when a launcher (accelerate, torchrun, a test harness) has already fixed the
    count with OMP_NUM_THREADS: then the count torch took from it, so launched processes share the CPUs."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    return usable_cpus()


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op thread count for this process to `n`, or to `default_threads()` when `n` is None;
    returns the count set. The count is then part of every `environment_record()`. Raises ValueError for anything
    but an integer in 1..MAX_THREADS; warns (stderr) above `usable_cpus()`."""
    if n is None:
        n = default_threads()
    check_threads(n)
    cpus = usable_cpus()
    if n > cpus:
        import sys

        print(f"warning: --threads {n} is more than the {cpus} CPU(s) this process may use; the extra threads only "
              f"compete for them (usually slower) — use --threads {cpus} or fewer", file=sys.stderr)
    torch.set_num_threads(n)
    return n


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def git_state(path: str | Path | None = None) -> dict[str, Any] | None:
    """{'commit', 'dirty'} of the git checkout holding `path` (default: this package's source, read once per
    process: the code a process runs is the code it started with), or None when the package is not run from a
    checkout (an installed wheel) or git is missing."""
    if path is None:
        own = _own_git_state()
        return dict(own) if own is not None else None
    return _git_state(Path(path))


@functools.lru_cache(maxsize=1)
def _own_git_state() -> dict[str, Any] | None:
    return _git_state(Path(__file__).resolve().parent)


def _git_state(where: Path) -> dict[str, Any] | None:
    try:
        top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        if not (Path(top) / "src" / "dsl_llada").is_dir():  # some other repository around an installed package
            return None
        commit = subprocess.run(["git", "-C", top, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", top, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def _device_info(device: str | torch.device | None) -> dict[str, Any]:
    dev = torch.device(device) if device is not None else torch.device("cpu")
    out: dict[str, Any] = {"device": str(dev)}
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        out["gpu"] = torch.cuda.get_device_name(index)
        out["cuda"] = torch.version.cuda
    return out


def environment_record(*, device: str | torch.device | None = None, dtype: torch.dtype | str | None = None,
                       seeds: Any = None) -> dict[str, Any]:
    """A JSON-ready record of everything that can change a number this process makes (see the module docstring).
    `device`, `dtype` and `seeds` are what the caller runs with; the rest is read from the process."""
    rec: dict[str, Any] = {
        "dsl_llada": __version__,
        "git": git_state(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "libraries": {name: _version(name) for name in _LIBRARIES},
        **_device_info(device),
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_native_bf16": has_native_bf16(),
        "usable_cpus": usable_cpus(),
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                    "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"), "kmp_blocktime": os.environ.get("KMP_BLOCKTIME"),
                    "openmp_ignored": dict(openmp.ignored) or None},
        "malloc": dict(allocator.applied) or dict(allocator.in_effect) or None,
        "deterministic": {"algorithms": torch.are_deterministic_algorithms_enabled(),
                          "cudnn": bool(torch.backends.cudnn.deterministic)},
        "seeds": seeds,
        "load_average_start": load_average(),
    }
    return rec


def finish_record(record: dict[str, Any]) -> dict[str, Any]:
    """The same record with the 1-minute load average at the end of the run added (a copy; the input is unchanged)."""
    return {**record, "load_average_end": load_average()}


def environment_footer(record: dict[str, Any] | None) -> str:
    """A one-line summary of an environment record for the foot of a report page (the full record is in the
    run's JSON); says so when a run predates the record."""
    if not record:
        return "Environment: not recorded (the run predates the environment record)."
    git = record.get("git") or {}
    commit = f"git {git['commit'][:9]}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit") else "no checkout"
    libs = record.get("libraries") or {}
    threads = record.get("threads") or {}
    where = record.get("gpu") or f"{record.get('cpu_model')} ({record.get('cpu_capability')})"
    load = f"load {record.get('load_average_start')}"
    if "load_average_end" in record:
        load += f" -> {record['load_average_end']}"
    return (f"Environment: dsl-llada {record.get('dsl_llada')} ({commit}), Python {record.get('python')}, torch "
            f"{libs.get('torch')}, transformers {libs.get('transformers')}; {record.get('device')}"
            f"{' ' + record['dtype'] if record.get('dtype') else ''} on {where}, {threads.get('intra_op')} intra-op threads of "
            f"{record.get('usable_cpus')} usable CPUs; seeds {json.dumps(record.get('seeds'))}; {load}.")
