"""The server's batching settings as one config dataclass: `dsl-llada serve`'s flags are generated from it and
`create_app` takes one whole (default: `ServerConfig()`), so no default is written twice."""

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
    """How the server's engine batches requests (continuous batching: requests join the running batch at any step)."""

    max_batch: int = 8
    """Most requests (rows) in the running batch."""
    max_batch_tokens: int | None = None
    """Most batch tokens, prompt + response summed over the running rows (a classifier-free-guidance row counts
    twice); a request that would pass it waits for room (none: only max_batch caps the batch)."""
    max_wait_ms: float = 0.0
    """With no request running, how long the oldest request waits for others before the first step, in milliseconds
    (0: a lone request starts at once; requests that arrive while others run join them at the next step)."""
    max_queue: int = 256
    """Most requests waiting; more get HTTP 429."""

    def __post_init__(self) -> None:
        _check(isinstance(self.max_batch, int) and self.max_batch >= 1, f"max_batch={self.max_batch!r} must be >= 1")
        _check(self.max_batch_tokens is None or (isinstance(self.max_batch_tokens, int) and self.max_batch_tokens >= 1),
               f"max_batch_tokens={self.max_batch_tokens!r} must be >= 1 (or left out for no token cap)")
        _check(math.isfinite(self.max_wait_ms) and self.max_wait_ms >= 0, f"max_wait_ms={self.max_wait_ms!r} must be >= 0")
        _check(isinstance(self.max_queue, int) and self.max_queue >= 1, f"max_queue={self.max_queue!r} must be >= 1")
