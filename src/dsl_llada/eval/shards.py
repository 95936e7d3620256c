"""Record files of an evaluation run: per-rank append-only shard files (one JSON line per finished work item,
flushed and fsynced), resume (a partial last line is ignored and cut off before appending), and the merge.

Run folder layout::

    RUN_DIR/eval_run.json        marker: package version, format, the full EvalConfig
    RUN_DIR/shards/rank-R.jsonl  records written by process R (any number of runs, any world size)
    RUN_DIR/records.jsonl        merged records (rank 0, after all ranks finished), in work-item order
    RUN_DIR/environment.jsonl    one environment record per run or resume (`dsl_llada.runtime.environment`), rank 0
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..artifacts import jsonl_log
from ..artifacts.atomic import atomic_write_text

MARKER = "eval_run.json"
FORMAT = "dsl-llada-eval-run/1"
RECORDS = "records.jsonl"
SHARDS = "shards"
ENVIRONMENTS = "environment.jsonl"


def append_environment(run_dir: Path, record: dict[str, Any], **extra: Any) -> None:
    """Append this run's (or resume's) environment record, with the end load average, as one JSON line."""
    from ..runtime.environment import finish_record

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
    """Complete JSON records of a JSONL file (`jsonl_log.read`, lenient): a final line without a newline (a write
    cut short) and unreadable lines (only a torn write can produce them) are skipped."""
    records, _ = jsonl_log.read(path, strict=False, accept=lambda r: isinstance(r, dict) and "key" in r)
    yield from records


def read_shards(run_dir: Path) -> dict[str, dict[str, Any]]:
    """key -> record over every shard file (first occurrence wins) and the merged file."""
    out: dict[str, dict[str, Any]] = {}
    paths = sorted((Path(run_dir) / SHARDS).glob("rank-*.jsonl")) if (Path(run_dir) / SHARDS).exists() else []
    for p in [*paths, Path(run_dir) / RECORDS]:
        for rec in iter_lines(p):
            out.setdefault(rec["key"], rec)
    return out


class ShardWriter:
    """Appends records to one rank's shard file through `jsonl_log.JsonlAppender`: each `write_many` is one write
    + flush + fsync of whole lines (all of the batch or none of it on a full disk); a partial last line left by a
    killed run is cut off when the writer opens."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._log = jsonl_log.JsonlAppender(self.path, sort_keys=True)

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        self._log.append(records)

    def close(self) -> None:
        self._log.close()


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
