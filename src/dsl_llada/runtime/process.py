"""The CLI's process settings for library users, as one explicit call: `dsl_llada.configure_process()`.

Every `dsl-llada` command sets three things before it samples: how OpenMP's idle threads wait (a bounded spin,
`openmp.py`), glibc's malloc thresholds (large buffers kept between calls, `allocator.py`) and the intra-op thread
count (`usable_cpus()`). A program that imports the library gets none of them unless it asks, and OpenMP's own
waiting (a 300,000-iteration spin) is what made the SDE sampler 15x slower beside busy neighbour processes where
the CLI's setting was 4x (docs/benchmarks/process-settings.md, *The library on a busy machine*).

OpenMP reads its wait settings once, when its runtime starts, which is when torch is first imported. So the call
that changes them has to come first::

    import dsl_llada
    dsl_llada.configure_process()      # before the first `import torch` (directly or through another package)
    import torch

Called later, it still sets the thread count and the malloc thresholds, leaves the environment's OpenMP settings
alone (they would no longer describe the running process) and warns. No torch import at module level here.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from . import allocator, openmp

Wait = Literal["cli", "bounded", "passive", "active", "unchanged"]
WAITS: tuple[str, ...] = get_args(Wait)
"""What `configure_process(openmp_wait=...)` takes:

- `cli`: what every `dsl-llada` command does: the bounded spin, unless the environment already sets one of
  `openmp.VARIABLES` to a value OpenMP accepts (then that is kept; a value it would reject is removed, with a warning).
- `bounded`: spin `openmp.SPIN_COUNT` iterations, then sleep (LLVM/Intel OpenMP: sleep at once), whatever the
  environment says.
- `passive`: sleep at once (`OMP_WAIT_POLICY=PASSIVE`).
- `active`: spin until the next parallel region (`OMP_WAIT_POLICY=ACTIVE`); fastest on an otherwise idle machine,
  the slowest beside busy neighbours.
- `unchanged`: leave OpenMP's wait settings as they are."""

FIXED: dict[str, dict[str, str]] = {
    "bounded": {"GOMP_SPINCOUNT": str(openmp.SPIN_COUNT), "KMP_BLOCKTIME": "0"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
}
"""The environment each explicit choice leaves (the other wait variables are removed, so nothing overrides it)."""

_RUNTIMES = re.compile(r"/lib(gomp|iomp5|omp)[-.\w]*\.so")
"""An OpenMP runtime's shared library in the process's memory map (GNU, Intel or LLVM OpenMP)."""


@dataclass(frozen=True)
class ProcessSettings:
    """What `configure_process` did."""

    threads: int
    """torch's intra-op thread count now."""
    openmp_wait: str
    """The wait choice asked for (one of `WAITS`)."""
    openmp_environment: dict[str, str | None] = field(default_factory=dict)
    """The wait variables (`openmp.VARIABLES`) in the environment after this call (None: unset): what OpenMP starts
    with when `openmp_applied`, else the environment as found (OpenMP may have started with other values)."""
    openmp_applied: bool = True
    """False when a wait choice came after OpenMP had started (the process keeps the settings OpenMP started with);
    True when it reached OpenMP, or when none was asked for (`unchanged`)."""
    malloc: dict[str, int] = field(default_factory=dict)
    """glibc's thresholds this call set (empty: not asked, not glibc, or the user's MALLOC_* variables stand)."""


def openmp_started() -> bool:
    """Whether an OpenMP runtime is already loaded in this process (torch loads it when first imported); from the
    process's memory map where there is one, else from whether torch is imported."""
    if "torch" in sys.modules:
        return True
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return _RUNTIMES.search(f.read()) is not None
    except OSError:
        return False


def wait_environment(choice: str, environ: MutableMapping[str, str]) -> dict[str, str | None]:
    """Apply the wait `choice` (one of `WAITS`) to `environ`; returns the wait variables it leaves there."""
    if choice == "cli":
        openmp.set_wait_defaults(environ)
    elif choice in FIXED:
        for name in openmp.VARIABLES:
            environ.pop(name, None)
        environ.update(FIXED[choice])
    return {name: environ.get(name) for name in openmp.VARIABLES}


def configure_process(*, threads: int | None = None, openmp_wait: Wait = "cli",
                      keep_large_buffers: bool = True) -> ProcessSettings:
    """Give this process the settings every `dsl-llada` command runs with.

    `openmp_wait`: how OpenMP's idle threads wait (`WAITS`; default: the CLI's choice). It reaches OpenMP only
    when this is called before torch is first imported; after that it changes nothing and warns once.
    `threads`: torch's intra-op thread count (default: the CPUs this process may use, as the CLI).
    `keep_large_buffers`: raise glibc's malloc thresholds so large buffers stay between sampler calls (as the CLI;
    the user's MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ stand).

    Raises ValueError, before changing anything, for a wait choice outside `WAITS`, a thread count that is not an
    integer from 1 to `openmp.MAX_THREADS`, or a `keep_large_buffers` that is not a bool.
    """
    if openmp_wait not in WAITS:
        raise ValueError(f"openmp_wait must be one of {', '.join(map(repr, WAITS))}, got {openmp_wait!r}")
    if threads is not None:
        openmp.check_threads(threads)
    if not isinstance(keep_large_buffers, bool):
        raise ValueError(f"keep_large_buffers must be True or False, got {keep_large_buffers!r}")
    started = openmp_started()
    if started or openmp_wait == "unchanged":
        env: dict[str, str | None] = {name: os.environ.get(name) for name in openmp.VARIABLES}
    else:
        env = wait_environment(openmp_wait, os.environ)
    if started and openmp_wait != "unchanged":
        warnings.warn(f"configure_process(openmp_wait={openmp_wait!r}) came after OpenMP started (torch was already "
                      "imported): the threads keep the wait settings they started with; call "
                      "dsl_llada.configure_process() before the first `import torch`, or start Python with "
                      f"GOMP_SPINCOUNT={openmp.SPIN_COUNT} in its environment", RuntimeWarning, stacklevel=2)
    malloc = allocator.keep_large_buffers(os.environ) if keep_large_buffers else {}
    from .environment import set_threads  # imports torch: after the wait settings are in place

    return ProcessSettings(threads=set_threads(threads), openmp_wait=openmp_wait, openmp_environment=env,
                           openmp_applied=not started or openmp_wait == "unchanged", malloc=malloc)
