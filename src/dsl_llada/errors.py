"""Error types shared across layers (kept here, at the bottom of the import graph, so that `config`, `snr`,
`checkpoint` and the backbones need not import each other)."""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and what would be valid."""


class CheckpointError(ValueError):
    """A checkpoint directory or its tensors do not match what the loader expects."""
