"""Reading evaluation data files (JSONL or a JSON list of objects) into samples, with clear errors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from .eval_config import DatasetSpec


class DataError(ValueError):
    """A data file is missing, unreadable, lacks a field, or has no usable rows."""


@dataclass
class Sample:
    """One evaluation example."""

    id: str
    """Stable id: the row's id field (or its row number in the file)."""
    index: int
    """Row number in the file; sample i's generator is seeded seed + index."""
    prompt: str
    """The user turn (chat-templated later) or the raw prefix."""
    chat: bool = True
    """Apply the tokenizer's chat template (False for prefix continuation)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What scoring needs (reference, gold answer, ...); stored in the item's record."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All objects of a JSONL file (blank lines skipped) or of a JSON file holding a list of objects."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file {str(p)!r} does not exist (datasets are not shipped: point `path` at your copy)")
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}: not valid JSON: {e}") from None
        bad = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
        if bad:
            raise DataError(f"{p}: element {bad[0]} is not a JSON object")
        return rows
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{p}:{n}: expected a JSON object, got {type(obj).__name__}")
        rows.append(obj)
    return rows


@overload
def pick_field(ds: DatasetSpec, role: str, candidates: tuple[str, ...], rows: list[dict[str, Any]],
               required: Literal[True] = True) -> str: ...


@overload
def pick_field(ds: DatasetSpec, role: str, candidates: tuple[str, ...], rows: list[dict[str, Any]],
               required: bool) -> str | None: ...


def pick_field(ds: DatasetSpec, role: str, candidates: tuple[str, ...], rows: list[dict[str, Any]],
               required: bool = True) -> str | None:
    """The field that plays `role`: the dataset's override, else the first candidate present in the first row."""
    if role in ds.fields:
        name = ds.fields[role]
        if rows and name not in rows[0]:
            raise DataError(f"dataset {ds.name!r} ({ds.path}): field {name!r} (for {role!r}) is not in the rows; "
                            f"fields present: {sorted(rows[0])}")
        return name
    for c in candidates:
        if rows and c in rows[0]:
            return c
    if required:
        have = sorted(rows[0]) if rows else []
        raise DataError(f"dataset {ds.name!r} ({ds.path}): no {role!r} field; looked for {list(candidates)}, rows have "
                        f"{have} (set fields: {{{role}: NAME}})")
    return None


def sliced(ds: DatasetSpec, rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(row number, row) after `offset` and `limit`."""
    end = None if ds.limit is None else ds.offset + ds.limit
    return list(enumerate(rows))[ds.offset:end]


def row_id(ds: DatasetSpec, row: dict[str, Any], index: int, id_field: str | None) -> str:
    if id_field is not None and row.get(id_field) is not None:
        return str(row[id_field])
    return str(index)


def check_usable(ds: DatasetSpec, samples: list[Sample], total: int, why: str) -> list[Sample]:
    if not samples:
        raise DataError(f"dataset {ds.name!r} ({ds.path}) has no usable rows ({total} rows read, offset={ds.offset}, "
                        f"limit={ds.limit}; {why})")
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"dataset {ds.name!r} ({ds.path}): id {dup!r} occurs more than once; set fields: {{id: FIELD}} "
                        f"to a unique field")
    return samples


def infer_kind(ds: DatasetSpec, known: dict[str, tuple[str, ...]], task: str) -> str:
    """The protocol kind: the dataset's `kind`, else the first known kind whose aliases occur in its name or file."""
    if ds.kind is not None:
        if ds.kind not in known:
            raise DataError(f"dataset {ds.name!r}: kind={ds.kind!r} is not valid for task {task!r}; expected one of {list(known)}")
        return ds.kind
    hay = (ds.name + " " + Path(ds.path).name).lower()
    for kind, aliases in known.items():
        if any(a in hay for a in aliases):
            return kind
    raise DataError(f"dataset {ds.name!r}: cannot tell its kind from the name or file; set kind to one of {list(known)}")
