"""The server's batching settings as one config dataclass: `dsl-llada serve`'s flags are generated from it and
`create_app` takes its defaults from it, so no default is written twice."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ConfigBase, _check

__all__ = ["RAY_INSTALL", "REPLICA_HEADER", "SERVE_PORT", "UI_PORT", "ServerConfig"]

SERVE_PORT = 8000
"""`dsl-llada serve`'s default TCP port."""
UI_PORT = 7860
"""`dsl-llada ui`'s default TCP port."""
RAY_INSTALL = 'pip install "dsl-llada[ray]"'
"""How to install what `dsl-llada ray-serve` needs (Ray Serve)."""
REPLICA_HEADER = "x-dsl-llada-replica"
"""Under Ray Serve, the response header naming the replica that answered (its Ray Serve replica id)."""


@dataclass(frozen=True)
class ServerConfig(ConfigBase):
    """How the server batches requests into sampler calls."""

    max_batch: int = 8
    """Most requests in one sampler call."""
    max_wait_ms: float = 0.0
    """Longest the oldest request waits for others to batch with, in milliseconds (0: a lone request starts at once;
    requests that arrive while a batch runs form the next batch)."""
    max_queue: int = 256
    """Most requests waiting; more get HTTP 429."""
    pad_batches: bool = False
    """Also batch prompts of different lengths (left padding + attention mask): more batching, but the masked
    attention rounds differently (default: only equal-length prompts share a batch, the closest to each request run
    alone)."""

    def __post_init__(self) -> None:
        _check(isinstance(self.max_batch, int) and self.max_batch >= 1, f"max_batch={self.max_batch!r} must be >= 1")
        _check(math.isfinite(self.max_wait_ms) and self.max_wait_ms >= 0, f"max_wait_ms={self.max_wait_ms!r} must be >= 0")
        _check(isinstance(self.max_queue, int) and self.max_queue >= 1, f"max_queue={self.max_queue!r} must be >= 1")
