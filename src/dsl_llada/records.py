"""Append-only JSONL record files that survive kill -9 and resume: `generate --output` (and any long command
that produces one JSON record per work item).

Layout: ``OUT`` holds one JSON object per line, each with an integer ``index`` (the work item's position);
``OUT.config.json`` holds the settings that produced them, written atomically *before* the first record.

Guarantees:
- every finished batch is appended with one write, then flushed and fsynced: after kill -9 or Ctrl-C the file
  holds every finished record; at most the last line can be partial (a kill inside the write), and it is
  ignored and cut off cleanly on resume;
- a run appends its items in increasing ``index`` order and a resumed run skips the indices already present, so
  the file is always in index order; when a run completes, `finish` checks that it holds exactly one record per
  item (rewriting it sorted, atomically, should it ever be out of order);
- records are only appended to a file whose stored settings equal this run's (`RecordFile.open` names the
  fields that differ otherwise); a file without stored settings is not ours and is never appended to or
  replaced without ``overwrite``; nothing is truncated before `begin`, which the caller runs after validating
  everything else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from .outputs import OutputError, check_writable
from .utils import atomic_write_text

__all__ = ["RecordFile", "settings_diff"]

log = logging.getLogger(__name__)


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a regular file may take a short write when the disk fills up)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _lock(fd: int, path: Path) -> None:
    """An exclusive advisory lock for the run's lifetime, so two runs never append to one file (POSIX only)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputError(f"--output {str(path)!r} is being written by another running process; wait for it to "
                          f"finish (then rerun to resume) or choose another file") from None


def settings_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """'field (old -> new)' for every field that differs, nested dicts flattened with dots."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += settings_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k} ({json.dumps(a)} -> {json.dumps(b)})")
    return out


class RecordFile:
    """One output file of records keyed by ``index``, with its settings stored next to it."""

    def __init__(self, path: Path, settings: dict[str, Any], done: dict[int, dict[str, Any]], *, valid_bytes: int,
                 fresh: bool):
        self.path, self.settings, self.done = path, settings, done
        self.config_path = Path(str(path) + ".config.json")
        self._valid_bytes, self._fresh = valid_bytes, fresh
        self._fd: int | None = None
        self.written = 0
        """Records appended by this run."""

    # -- checking (no writes) -------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, settings: dict[str, Any], *, overwrite: bool = False,
             protect: tuple[str | Path, ...] = ()) -> "RecordFile":
        """Check `path` and read what is already done there. Writes nothing. Raises OutputError (a ValueError)."""
        path = Path(path)
        settings = json.loads(json.dumps(settings))  # the JSON form is what gets compared with the stored one
        for p in protect:
            if p is not None and path.exists() and Path(p).exists() and os.path.samefile(path, p):
                raise OutputError(f"--output {str(path)!r} is the input {str(p)!r}; choose another output file")
        if path.is_dir():
            raise OutputError(f"--output {str(path)!r} is a folder; give a file name such as {str(path / 'records.jsonl')!r}")
        check_writable(path.parent, what="--output folder")
        if path.exists() and not os.access(path, os.W_OK):
            raise OutputError(f"--output {str(path)!r} is not writable; choose another file")
        config_path = Path(str(path) + ".config.json")
        has_records = path.exists() and path.stat().st_size > 0
        if overwrite or not has_records:
            return cls(path, settings, {}, valid_bytes=0, fresh=True)
        if not config_path.is_file():
            raise OutputError(f"--output {str(path)!r} already exists and has no {config_path.name} (it was not "
                              f"written by dsl-llada generate); pass --overwrite to replace it, or choose another file")
        try:
            stored = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise OutputError(f"{str(config_path)!r} is unreadable ({e}); pass --overwrite to start {str(path)!r} "
                              f"again, or choose another file") from None
        diff = settings_diff(stored, settings) if isinstance(stored, dict) else ["(not a JSON object)"]
        if diff:
            raise OutputError(f"--output {str(path)!r} was made with different settings: {'; '.join(diff)}; "
                              f"rerun with the same settings to continue it, pass --overwrite to replace it, or "
                              f"choose another file")
        done, valid = cls._read(path)
        return cls(path, settings, done, valid_bytes=valid, fresh=False)

    @staticmethod
    def _read(path: Path) -> tuple[dict[int, dict[str, Any]], int]:
        """Records by index and the byte length of the complete lines (a partial last line is left out)."""
        data = path.read_bytes()
        valid = data.rfind(b"\n") + 1
        done: dict[int, dict[str, Any]] = {}
        for n, line in enumerate(data[:valid].split(b"\n")[:-1], start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise OutputError(f"{str(path)}:{n}: not a JSON record ({e}); fix or remove that line, or pass "
                                  f"--overwrite to start again") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("index"), int):
                raise OutputError(f"{str(path)}:{n}: a record needs an integer 'index'; fix or remove that line, or "
                                  f"pass --overwrite to start again")
            done[rec["index"]] = rec
        if valid < len(data):
            log.warning("%s: ignoring a partial last line (%d bytes, from an interrupted write)", path, len(data) - valid)
        return done, valid

    # -- writing --------------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Store the settings (atomically, before any record), cut a partial last line (or the whole file when
        starting afresh), and open the file for appending."""
        if self._fresh:
            atomic_write_text(self.config_path, json.dumps(self.settings, indent=2) + "\n")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # the umask applies
        try:
            _lock(fd, self.path)
            os.ftruncate(fd, self._valid_bytes)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records as JSON lines with one write, flushed and fsynced. On failure (a full disk) the file is
        cut back to its last complete record and the error re-raised naming the file."""
        if not records:
            return
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self.path}: append() before begin() (the record file is not open)")
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._valid_bytes)
            raise OSError(e.errno, e.strerror or str(e), str(self.path)) from None
        self._valid_bytes += len(data)
        for r in records:
            self.done[r["index"]] = r
        self.written += len(records)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def finish(self, n_items: int) -> None:
        """Close; check the file holds exactly indices 0..n-1 once each, in order (rewrite sorted if needed)."""
        self.close()
        done, _ = self._read(self.path)
        missing = sorted(set(range(n_items)) - set(done))
        if missing:
            raise OutputError(f"{str(self.path)!r} lacks records {missing[:5]} after the run; rerun the same command "
                              f"to complete it")
        order = [json.loads(line)["index"] for line in self.path.read_bytes().splitlines() if line.strip()]
        if order != list(range(n_items)):
            atomic_write_text(self.path, "".join(json.dumps(done[i], ensure_ascii=False) + "\n" for i in range(n_items)))
