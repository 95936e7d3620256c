"""SIGTERM during an atomic write: raised as `Terminated` so the writers remove their temp files (exit code 143)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class Terminated(SystemExit):
    """SIGTERM arrived while an atomic write was in progress (see `terminate_raises`); exit code 143."""


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Inside the block, SIGTERM raises `Terminated` in the main thread (so the `finally`/`except` clauses of the
    atomic writers remove their temp files) instead of ending the process on the spot. Only where SIGTERM has its
    default action (a server's own handler is left alone) and only in the main thread; a no-op elsewhere."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
