"""One loaded copy per process of every scorer model (GenPPL causal LM, local judge, BERTScore encoder).

A scorer asks :func:`shared` for its model under a key that names everything the loaded object depends on
(folder, file, dtype, device); the first call runs the loader, later calls — the run's report, `eval report`
in the same process, a judge and a GenPPL scorer on the same model — get the same object back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger(__name__)

_LOADED: dict[Hashable, Any] = {}
_LOCK = threading.Lock()
LOADS: dict[str, int] = {}
"""How many times each kind of scorer model was actually loaded in this process (for tests and logs)."""


def shared(kind: str, key: Hashable, loader: Callable[[], Any]) -> Any:
    """The object loaded by ``loader()`` for ``(kind, key)``, loading it on the first request only. A loader
    that raises stores nothing."""
    full = (kind, key)
    with _LOCK:
        if full in _LOADED:
            return _LOADED[full]
    obj = loader()
    with _LOCK:
        _LOADED.setdefault(full, obj)
        LOADS[kind] = LOADS.get(kind, 0) + 1
        log.info("loaded %s scorer model %s (kept for this process)", kind, key)
        return _LOADED[full]


def release_all() -> None:
    """Forget every loaded scorer model (the next request loads again)."""
    with _LOCK:
        _LOADED.clear()
