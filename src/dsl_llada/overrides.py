"""Command-line `key=value` overrides of a config mapping (`dsl-llada train ... lr=1e-4`, `dsl-llada eval run ...
nfe=[16,64]`): the value parser and the dotted-key application both commands share (the core owns them, so the
trainer and the evaluation suite stay siblings)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError

__all__ = ["apply_overrides", "parse_override_value"]


def parse_override_value(text: str) -> Any:
    """'1e-4' -> 1e-4, 'true' -> True, 'null' -> None, '[0.9, 0.95]' -> list, anything else -> the string.

    JSON first (so '1e-4' is a float, unlike YAML 1.1), then YAML (so unquoted words and 'yes'/'no' work).
    """
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    import yaml

    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return text if isinstance(v, (dict, list)) and not text.strip().startswith(("{", "[")) else v


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply dotted `key=value` overrides to a nested config dict (a new dict is returned)."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. lr=1e-4 or data.block_size=64)")
        key, _, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} has an empty key")
        node: Any = out
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a nested config section")
            node = node[p]
        node[parts[-1]] = parse_override_value(raw.strip())
    return out
