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


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], *,
                    example: str = "lr=1e-4 or data.block_size=64") -> dict[str, Any]:
    """Apply dotted `key=value` overrides to a nested config dict (a new dict is returned). Each part of a key names
    a section of a dict (a missing or null one is created) or an element of a list, by its `name` field or its index
    (`data.block_size=64`, `tasks.summarization.datasets.xsum.limit=10`, `methods.0.options.eta=0`). `example` is
    shown in the error for an item that is not `key=value`."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. {example})")
        key, _, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} has an empty key")
        node: Any = out
        for depth, p in enumerate(parts):
            slot: int | str
            if isinstance(node, list):
                slot = _list_slot(node, p, item)
            elif isinstance(node, dict):
                slot = p
                if depth < len(parts) - 1 and node.get(p) is None:
                    node[p] = {}
            else:
                raise ConfigError(f"override {item!r}: {parts[depth - 1]!r} is not a section or a list")
            if depth == len(parts) - 1:
                node[slot] = parse_override_value(raw.strip())
            else:
                node = node[slot]
    return out


def _list_slot(items: list[Any], part: str, item: str) -> int:
    """The index of the list element `part` names: the element whose `name` is `part`, else index `part`."""
    idx = next((i for i, x in enumerate(items) if isinstance(x, dict) and x.get("name") == part), None)
    if idx is None and part.isdigit() and int(part) < len(items):
        idx = int(part)
    if idx is None:
        raise ConfigError(f"override {item!r}: no list element named or numbered {part!r}")
    return idx
