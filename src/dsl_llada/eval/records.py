"""Record files of an evaluation run: per-rank append-only shard files (one JSON line per finished work item,
flushed and fsynced), resume (a partial last line is ignored and cut off before appending), and the merge.

Run folder layout::

    RUN_DIR/eval_run.json        marker: package version, format, the full EvalConfig
    RUN_DIR/shards/rank-R.jsonl  records written by process R (any number of runs, any world size)
    RUN_DIR/records.jsonl        merged records (rank 0, after all ranks finished), in work-item order
    RUN_DIR/environment.jsonl    one environment record per run or resume (`dsl_llada.environment`), rank 0
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..utils import atomic_write_text

MARKER = "eval_run.json"
FORMAT = "dsl-llada-eval-run/1"
RECORDS = "records.jsonl"
SHARDS = "shards"
ENVIRONMENTS = "environment.jsonl"


def append_environment(run_dir: Path, record: dict[str, Any], **extra: Any) -> None:
    """Append this run's (or resume's) environment record, with the end load average, as one JSON line."""
    from ..environment import finish_record

    line = json.dumps({**finish_record(record), **extra}, sort_keys=True) + "\n"
    with open(Path(run_dir) / ENVIRONMENTS, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_environments(run_dir: Path) -> list[dict[str, Any]]:
    """The environment records of a run folder, oldest first (empty for runs that predate them; a torn last line,
    from a kill inside the append, is skipped)."""
    path = Path(run_dir) / ENVIRONMENTS
    out = []
    for line in (path.read_text(encoding="utf-8").splitlines() if path.exists() else []):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def shard_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / SHARDS / f"rank-{rank}.jsonl"


def iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Complete JSON records of a JSONL file; a final line without a newline (a write cut short) is skipped."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        data = f.read()
    for raw in data.split(b"\n")[:-1] if not data.endswith(b"\n") else data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # only a torn write can produce this (the tail of a disk-full append); never a finished item
        if isinstance(obj, dict) and "key" in obj:
            yield obj


def read_shards(run_dir: Path) -> dict[str, dict[str, Any]]:
    """key -> record over every shard file (first occurrence wins) and the merged file."""
    out: dict[str, dict[str, Any]] = {}
    paths = sorted((Path(run_dir) / SHARDS).glob("rank-*.jsonl")) if (Path(run_dir) / SHARDS).exists() else []
    for p in [*paths, Path(run_dir) / RECORDS]:
        for rec in iter_lines(p):
            out.setdefault(rec["key"], rec)
    return out


class ShardWriter:
    """Appends records to one rank's shard file; each `write_many` is one write() + flush + fsync."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cut_partial_tail()
        self.f = open(self.path, "ab")

    def _cut_partial_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
                f.flush()
                os.fsync(f.fileno())

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        buf = b"".join(json.dumps(r, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n" for r in records)
        if not buf:
            return
        start = self.f.tell()
        try:
            self.f.write(buf)
            self.f.flush()
            os.fsync(self.f.fileno())
        except OSError:
            # disk full (or similar): cut the file back to where this batch began, so the shard ends on a record
            # boundary and holds none of the batch (all or nothing); earlier records stay valid; then re-raise
            self.f.close()
            with open(self.path, "rb+") as f:
                f.truncate(start)
            self.f = open(self.path, "ab")
            raise

    def close(self) -> None:
        self.f.close()


def merge(run_dir: Path, order: list[str]) -> list[dict[str, Any]]:
    """Write RUN_DIR/records.jsonl: one record per key in `order` that has one (deduplicated), atomically."""
    have = read_shards(run_dir)
    recs = [have[k] for k in order if k in have]
    atomic_write_text(Path(run_dir) / RECORDS,
                      "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in recs))
    return recs


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The merged records of a finished run."""
    p = Path(run_dir) / RECORDS
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist: is {str(run_dir)!r} a finished `dsl-llada eval run` folder?")
    return list(iter_lines(p))
