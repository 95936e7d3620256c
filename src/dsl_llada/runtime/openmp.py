"""How the CLI's OpenMP threads wait between parallel regions (set before torch loads OpenMP; no torch import here).

A sampler call runs hundreds of short parallel regions (norms, RoPE, small GEMMs). Between them a worker thread
either spins (quick to wake, but it holds a core that a neighbour process may need) or sleeps (the core is free,
but each wake-up costs tens of microseconds). On a 2-core host, letting a thread spin `SPIN_COUNT` times before it
sleeps made SDE sampling 11-13 % faster than sleeping at once on an idle machine. Beside a busy neighbour it was
4-18 % slower, where OpenMP's own default was up to 5.6x slower than one thread (docs/benchmarks/process-settings.md, *OpenMP
waiting: what the CLI sets*).
"""

from __future__ import annotations

import re
import sys
from collections.abc import MutableMapping

MAX_THREADS = 1024
"""Upper bound of an intra-op thread count (`--threads`, `configure_process(threads=...)`): more than this is a typo,
not a machine."""

SPIN_COUNT = 1000
"""GNU OpenMP's `GOMP_SPINCOUNT`: busy-wait iterations before a waiting thread sleeps (the Linux torch wheels use
GNU OpenMP). Its own default is 300,000 when no wait policy is set, which made two threads 5.6x slower than one
beside a busy neighbour."""

VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""The settings that decide waiting; any of them set by the user to a value OpenMP accepts means theirs is kept as
given."""

ACCEPTED = {
    # GNU OpenMP: a count with an optional k/M/G/T (powers of 1000) suffix, or infinite/infinity; blanks around
    "GOMP_SPINCOUNT": (re.compile(r"\s*(\+?\d+\s*[kmgt]?|infinite|infinity)\s*", re.IGNORECASE),
                       "a non-negative integer, optionally with a k, M, G or T suffix, or 'infinite'"),
    "OMP_WAIT_POLICY": (re.compile(r"\s*(active|passive)\s*", re.IGNORECASE), "ACTIVE or PASSIVE (any case)"),
    # LLVM/Intel OpenMP: a number, milliseconds unless a unit follows (s, m, h, d; newer releases also ms, us),
    # or infinit... ; what any release takes is kept
    "KMP_BLOCKTIME": (re.compile(r"\s*(\+?(\d+\.?\d*|\.\d+)([e][+-]?\d+)?\s*(ms|us|[smhd])?|infinit\w*)\s*",
                                 re.IGNORECASE),
                      "a non-negative number of milliseconds, optionally with a unit (ms, us, s, m, h or d), or "
                      "'infinite'"),
}
"""What each runtime accepts for each setting, and the same in words. A value outside it is rejected by the OpenMP
runtime, which then falls back to its own default (for GNU OpenMP: a 300,000-iteration spin)."""

ignored: dict[str, str] = {}
"""The user's settings `set_wait_defaults` found invalid and removed in this process (name: value as given);
recorded in every environment record beside the values in effect."""


def check_threads(n: object) -> None:
    """Raise ValueError naming `n` unless it is an integer from 1 to `MAX_THREADS` (a bool is not a count)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be an integer from 1 to {MAX_THREADS}, got {n!r}")


def accepts(name: str, value: str) -> bool:
    """Whether the OpenMP runtime reading `name` takes `value` (a spin count too large for 64 bits is rejected
    too)."""
    pattern, _ = ACCEPTED[name]
    if pattern.fullmatch(value) is None:
        return False
    digits = re.sub(r"\D", "", value) if name == "GOMP_SPINCOUNT" else ""
    return not digits or int(digits) < 1 << 64


def set_wait_defaults(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Bounded spinning for GNU OpenMP (`GOMP_SPINCOUNT`) and immediate sleeping for LLVM/Intel OpenMP
    (`KMP_BLOCKTIME=0`, the passive policy there: a bounded spin was not measured with it), unless the user set any
    of `VARIABLES` to a value the runtime accepts. A value it would reject is removed (recorded in `ignored`, with one
    warning on stderr), so the CLI's settings apply instead of the runtime's fallback. Returns what was set (empty
    when the user's settings stand)."""
    bad = {name: environ[name] for name in VARIABLES if name in environ and not accepts(name, environ[name])}
    for name in bad:
        del environ[name]
    ignored.update(bad)
    chosen: dict[str, str] = {}
    if not any(name in environ for name in VARIABLES):
        chosen = {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "0"}
        environ.update(chosen)
    if bad:
        given = "; ".join(f"{name}={value!r} is not a value OpenMP accepts ({ACCEPTED[name][1]})"
                          for name, value in bad.items())
        instead = (", ".join(f"{k}={v}" for k, v in chosen.items()) if chosen else
                   "your other setting " + ", ".join(f"{k}={environ[k]}" for k in VARIABLES if k in environ))
        print(f"warning: {given}; it is ignored and {instead} applies instead", file=sys.stderr)
    return chosen
