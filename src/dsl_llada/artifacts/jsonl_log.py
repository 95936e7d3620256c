"""The one resumable JSONL record writer: every long command that produces one JSON line per finished item
(`generate --output`, eval shards, judge runs, the toy sweep and cache frontier) appends and resumes through here.

Rules (the same everywhere):

- **whole lines**: a batch of records is encoded first and written with one `write` loop; a failure during the
  write (a full disk, a file-size limit) cuts the file back to where the batch began, so the file always ends on a
  record boundary and holds all of a batch or none of it; the error is re-raised naming the file;
- **fsync policy**: `fsync=True` (default) flushes and fsyncs after each batch, so a finished batch survives a
  power cut; `fsync=False` only writes (the OS flushes), for cheap re-computable rows;
- **repair a broken last line**: a line without its newline can only be the tail of an interrupted write; `read`
  ignores it and `JsonlAppender(..., repair=True)` cuts it off before appending, so it never swallows the next
  record;
- **skip done keys**: `read` returns the complete records; `done_keys(records, key)` maps each record's key to its
  latest record, for a resumed run to skip. Unreadable complete lines are an error naming file and line
  (`strict=True`) or skipped with a warning (`strict=False`, for files whose lines are re-computable).

Locking (one writer per file) is the caller's: `records.RecordFile` (generate) locks its output; the eval runner
gives each rank its own shard file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["JsonlAppender", "done_keys", "encode_lines", "read"]

log = logging.getLogger(__name__)


def encode_lines(records: Iterable[dict[str, Any]], *, sort_keys: bool = False) -> bytes:
    """UTF-8 JSON lines (non-ASCII kept), one per record."""
    return b"".join(json.dumps(r, ensure_ascii=False, sort_keys=sort_keys).encode("utf-8") + b"\n" for r in records)


def read(path: str | Path, *, strict: bool = True,
         accept: Callable[[Any], bool] = lambda r: isinstance(r, dict)) -> tuple[list[dict[str, Any]], int]:
    """(complete records in file order, byte length of the complete lines). A missing file is empty. A last line
    without a newline (an interrupted write) is left out. A complete line that is not JSON, or that `accept`
    refuses, raises ValueError naming file and line with `strict`, else it is skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    valid = data.rfind(b"\n") + 1
    out: list[dict[str, Any]] = []
    for n, line in enumerate(data[:valid].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if strict:
                raise ValueError(f"{path}:{n}: not a JSON record ({e}); fix or remove that line") from None
            log.warning("%s:%d: skipping an unreadable line", path, n)
            continue
        if not accept(rec):
            if strict:
                raise ValueError(f"{path}:{n}: not a record of this file")
            log.warning("%s:%d: skipping a line that is not a record of this file", path, n)
            continue
        out.append(rec)
    if valid < len(data):
        log.warning("%s: ignoring a partial last line (%d bytes, from an interrupted write)", path, len(data) - valid)
    return out, valid


def done_keys(records: Iterable[dict[str, Any]], key: str | Callable[[dict[str, Any]], Any]) -> dict[Any, dict[str, Any]]:
    """key -> the latest record with that key (a retried item's new record replaces its earlier one)."""
    get = key if callable(key) else (lambda r: r[key])
    return {get(r): r for r in records}


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a regular file may take a short write when the disk fills up)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class JsonlAppender:
    """Appends whole batches of records to one JSONL file (see the module docstring for the rules).

    Open on a path (`JsonlAppender(path)`; the parent folder is created) or on an already open, already locked
    descriptor (`JsonlAppender(path, fd=fd)`, which the appender does not close). `valid_bytes`: where the
    complete records end when known (from `read`); otherwise it is found by reading the file's tail.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True, repair: bool = True, sort_keys: bool = False,
                 fd: int | None = None, valid_bytes: int | None = None):
        self.path, self.fsync, self.sort_keys = Path(path), fsync, sort_keys
        self._owns = fd is None
        if fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # the umask applies
        self._fd: int | None = fd
        try:
            self.end = self._complete_end() if valid_bytes is None else valid_bytes
            if repair and os.fstat(fd).st_size > self.end:
                log.warning("%s: cutting a partial last line (from an interrupted write)", self.path)
                os.ftruncate(fd, self.end)
                if fsync:
                    os.fsync(fd)
        except BaseException:
            self.close()
            raise

    def _complete_end(self) -> int:
        """Byte length of the file's complete lines, reading back from its end in chunks."""
        size = os.fstat(self._open_fd()).st_size
        with open(self.path, "rb") as f:
            pos = size
            while pos > 0:
                step = min(65536, pos)
                f.seek(pos - step)
                chunk = f.read(step)
                i = chunk.rfind(b"\n")
                if i >= 0:
                    return pos - step + i + 1
                pos -= step
        return 0

    def truncate(self, size: int = 0) -> None:
        """Cut the file to `size` bytes (0 = start afresh; the caller has decided to replace what is there)."""
        fd = self._open_fd()
        os.ftruncate(fd, size)
        if self.fsync:
            os.fsync(fd)
        self.end = size

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: used after close")
        return self._fd

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Append the records as whole lines with one write (flushed, and fsynced per the policy); returns the
        bytes written. On failure the file is cut back to where this batch began and the error re-raised as an
        OSError naming the file. An interruption (Ctrl-C, SIGTERM) keeps a batch whose write finished (`end` counts
        it) and cuts back one that did not."""
        data = encode_lines(records, sort_keys=self.sort_keys)
        if not data:
            return 0
        if self._fd is None:
            raise ValueError(f"{self.path}: append after close")
        written = False
        try:
            _write_all(self._fd, data)
            written = True
            if self.fsync:
                os.fsync(self._fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.end)
            raise OSError(e.errno, e.strerror or str(e), str(self.path)) from None
        except BaseException:  # Ctrl-C or SIGTERM: a whole batch stays (the kernel has it), a partial one goes
            if written:
                self.end += len(data)
            else:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.end)
            raise
        self.end += len(data)
        return len(data)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self._owns:
                os.close(fd)

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
