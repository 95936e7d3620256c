"""How the CLI's OpenMP threads wait between parallel regions (set before torch loads OpenMP; no torch import here).

A sampler call runs hundreds of short parallel regions (norms, RoPE, small GEMMs). Between them a worker thread
either spins (quick to wake, but it holds a core that a neighbour process may need) or sleeps (the core is free,
but each wake-up costs tens of microseconds). On a 2-core host, letting a thread spin `SPIN_COUNT` times before it
sleeps made SDE sampling 11-13 % faster than sleeping at once on an idle machine. Beside a busy neighbour it was
4-18 % slower, where OpenMP's own default was up to 5.6x slower than one thread (docs/benchmarks/process-settings.md, *OpenMP
waiting: what the CLI sets*).
"""

from __future__ import annotations

from collections.abc import MutableMapping

SPIN_COUNT = 1000
"""GNU OpenMP's `GOMP_SPINCOUNT`: busy-wait iterations before a waiting thread sleeps (the Linux torch wheels use
GNU OpenMP). Its own default is 300,000 when no wait policy is set, which made two threads 5.6x slower than one
beside a busy neighbour."""

VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""The settings that decide waiting; any of them set by the user means theirs is kept as given."""


def set_wait_defaults(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Bounded spinning for GNU OpenMP (`GOMP_SPINCOUNT`) and immediate sleeping for LLVM/Intel OpenMP
    (`KMP_BLOCKTIME=0`, the passive policy there: a bounded spin was not measured with it), unless the user set any
    of `VARIABLES`. Returns what was set (empty when the user's settings stand)."""
    if any(name in environ for name in VARIABLES):
        return {}
    chosen = {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "0"}
    environ.update(chosen)
    return chosen
