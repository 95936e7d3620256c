"""Large buffers stay in the CLI process between sampler calls (glibc's malloc settings; no torch import here).

A sampler call allocates its big temporaries afresh: the logits (batch x rows x vocabulary floats, 128 MB at batch 8,
128 rows and V 32,768) and the converter's buffers. glibc serves every allocation above its mmap threshold (at most
32 MB by default) with fresh pages from the kernel and returns them on free, so each call page-faults its way
through the buffers again: about 40,000 faults per batch-8 SDE call on the benchmark model. With the thresholds raised
to `THRESHOLD` the freed memory is reused by the next call. On a 2-core host that made batch-8 SDE sampling 6 %
and batch-8 remasking 11 % faster per sample with identical tokens (no change at batch 1). The cost is memory: the
peak rose by 12 %, and the buffers stay with the process until it exits (docs/benchmarks/process-settings.md, *Large buffers between
calls*).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from collections.abc import Mapping

THRESHOLD = 1 << 30
"""Bytes: allocations up to this size come from (and freed memory up to this size stays in) the process heap."""

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's mallopt parameter numbers (malloc.h)."""

USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
"""glibc's own environment settings for the same thresholds; any of them set means the user's choice stands."""

applied: dict[str, int] = {}
"""What `keep_large_buffers` set in this process (empty when nothing was: not glibc, or the user's settings)."""

in_effect: dict[str, int | str | None] = {}
"""The thresholds this process runs with when the user set them through glibc's environment variables (the
number glibc reads; the text as given when it is not a number, None for the one left at glibc's default), with
`set_by` naming the variables; empty otherwise."""


def glibc_number(text: str) -> int | None:
    """The number glibc reads from a malloc environment setting: decimal, 0x hexadecimal or 0-prefixed octal
    (as C's strtoul with base 0), blanks around allowed; None when the text is not such a number."""
    t = text.strip()
    try:
        if t[:2].lower() == "0x":
            return int(t[2:], 16) if t[2:].isalnum() else None
        if len(t) > 1 and t.startswith("0"):
            return int(t[1:], 8)
        return int(t) if t.isdigit() else None
    except ValueError:
        return None


def keep_large_buffers(environ: Mapping[str, str]) -> dict[str, int]:
    """Raise glibc's mmap and trim thresholds to `THRESHOLD` unless the user set either through glibc's own
    environment variables (then `in_effect` records theirs) or the C library is not glibc. Returns (and records in
    `applied`) what was set."""
    if platform.libc_ver()[0] != "glibc":
        return {}
    given = [name for name in USER_VARIABLES if name in environ]
    if given:
        in_effect.clear()
        for key, variable in (("mmap_threshold", "MALLOC_MMAP_THRESHOLD_"), ("trim_threshold", "MALLOC_TRIM_THRESHOLD_")):
            text = environ.get(variable)
            in_effect[key] = None if text is None else glibc_number(text) if glibc_number(text) is not None else text
        in_effect["set_by"] = ", ".join(given)
        return {}
    name = ctypes.util.find_library("c")
    if name is None:
        return {}
    mallopt = ctypes.CDLL(name).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = {}
    for key, param in (("mmap_threshold", M_MMAP_THRESHOLD), ("trim_threshold", M_TRIM_THRESHOLD)):
        if mallopt(param, THRESHOLD) == 1:  # 1 = accepted
            done[key] = THRESHOLD
    applied.update(done)
    return done
