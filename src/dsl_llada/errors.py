"""Error types shared by the lowest layers (kept here so that `config` and `snr` need not import each other)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and what would be valid."""
