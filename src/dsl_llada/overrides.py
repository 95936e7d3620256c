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
    """Apply dotted `key=value` overrides to a nested config dict (a new dict is returned). A missing section is
    created; a list element is addressed by its `name` or its index (e.g. `lr=1e-4`, `data.block_size=64`,
    `tasks.summarization.datasets.xsum.limit=10`, `methods.0.options.eta=0`)."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. lr=1e-4 or data.block_size=64)")
        key, _, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} has an empty key")
        node: Any = out
        for depth, p in enumerate(parts[:-1]):
            node = _child(node, p, item, parts[depth - 1] if depth else None)
        _set(node, parts[-1], parse_override_value(raw.strip()), item, parts[-2] if len(parts) > 1 else None)
    return out


def _index(node: list[Any], part: str, item: str) -> int:
    """The element of a config list named `part` (its `name` field), else numbered `part`."""
    idx = next((i for i, x in enumerate(node) if isinstance(x, dict) and x.get("name") == part), None)
    if idx is None and part.isdigit() and int(part) < len(node):
        idx = int(part)
    if idx is None:
        raise ConfigError(f"override {item!r}: no list element named or numbered {part!r}")
    return idx


def _child(node: Any, part: str, item: str, parent: str | None) -> Any:
    """The section or list element `part` of `node` (a missing section is created empty)."""
    if isinstance(node, list):
        return node[_index(node, part, item)]
    if not isinstance(node, dict):
        raise ConfigError(f"override {item!r}: {parent!r} is not a nested config section or a list")
    if node.get(part) is None:
        node[part] = {}
    return node[part]


def _set(node: Any, part: str, value: Any, item: str, parent: str | None) -> None:
    if isinstance(node, list):
        node[_index(node, part, item)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ConfigError(f"override {item!r}: {parent!r} is not a nested config section or a list")
