"""Error types shared across layers (kept here, at the bottom of the import graph, so no module needs a cycle)."""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint directory or its tensors do not match what the loader expects."""
