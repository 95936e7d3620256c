"""Append-only JSONL record files that survive kill -9 and resume: `generate --output` (and any long command
that produces one JSON record per work item).

Layout: ``OUT`` holds one JSON object per line, each with an integer ``index`` (the work item's position);
``OUT.config.json`` holds the settings that produced them, written atomically *before* the first record, and the
environment record of the run that started the file (``environment``) and of each run that resumed it
(``resumed_environments``); those two are not settings: they never decide whether a run may resume.

Guarantees:
- each `append` (the records that finished together) is one write, then flushed and fsynced: after kill -9 or
  Ctrl-C the file holds every finished record; at most the last line can be partial (a kill inside the write),
  and it is ignored and cut off cleanly on resume;
- a run appends its items as they finish (in increasing ``index`` order unless items finish out of order, as
  rows of the step-level engine with data-dependent step counts do) and a resumed run skips the indices already
  finished; a record with an ``error`` is not finished: a resumed run retries it and appends its new record, and
  the latest record of an index wins; when a run completes, `finish` checks that it holds one record per item
  (rewriting it sorted, atomically, when it is out of order or holds superseded error records);
- one writer per file: `open` takes an exclusive lock on the file itself (`locks.flock_or_refuse`) before it reads
  or writes anything (a second run is refused naming the holder's PID, and changes nothing, its settings file
  included), and keeps it to the end;
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import jsonl_log
from .locks import flock_or_refuse
from .outputs import OutputError, check_writable
from .atomic import atomic_write_text

__all__ = ["RecordFile", "settings_diff"]

log = logging.getLogger(__name__)


def _refusal(path: Path) -> Callable[[int | None], str]:
    def message(pid: int | None) -> str:
        holder = f"process {pid}" if pid is not None else "another running process"
        return (f"--output {str(path)!r} is being written by {holder}; wait for it to finish (then rerun to resume) "
                f"or choose another file")
    return message


ENVIRONMENT_KEYS = ("environment", "resumed_environments")
"""Keys of OUT.config.json that describe where records were made, not how: left out of the settings comparison."""


def settings_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "",
                  defaults: dict[str, Any] | None = None) -> list[str]:
    """'field (old -> new)' for every field that differs, nested dicts flattened with dots. `defaults` (nested
    like the settings): a field absent from `old` whose new value is its default is no difference (a field added
    to a config since `old` was written, at the value that reproduces the old behaviour)."""
    out = []
    defaults = defaults or {}
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            sub = defaults.get(k)
            out += settings_diff(a, b, f"{prefix}{k}.", sub if isinstance(sub, dict) else None)
        elif k not in old and k in defaults and not isinstance(b, dict) and b == defaults[k]:
            continue
        elif a != b:
            out.append(f"{prefix}{k} ({json.dumps(a)} -> {json.dumps(b)})")
    return out


class RecordFile:
    """One output file of records keyed by ``index``, with its settings stored next to it."""

    def __init__(self, path: Path, settings: dict[str, Any], done: dict[int, dict[str, Any]], *, valid_bytes: int,
                 fresh: bool, environment: dict[str, Any] | None = None, stored: dict[str, Any] | None = None):
        self.path, self.settings, self.done = path, settings, done
        self.environment = environment
        """This run's environment record (stored in OUT.config.json; None stores none)."""
        self._stored = stored or {}
        self.config_path = Path(str(path) + ".config.json")
        self._valid_bytes, self._fresh = valid_bytes, fresh
        self._fd: int | None = None
        self._created = False
        self._begun = False
        self._log: jsonl_log.JsonlAppender | None = None
        self.written = 0
        """Records appended by this run."""

    # -- checking (no writes) -------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, settings: dict[str, Any], *, overwrite: bool = False,
             protect: tuple[str | Path, ...] = (), environment: dict[str, Any] | None = None,
             defaults: dict[str, Any] | None = None) -> "RecordFile":
        """Check `path`, take its exclusive lock (creating it empty when missing) and read what is already done
        there under the lock. Writes nothing else; on a refusal the lock is released and a file this call created
        is removed. Raises OutputError (a ValueError). Call `close` (or `finish`) when done. `defaults`: see
        `settings_diff` (settings a stored file may lack, at these values, and still be resumed)."""
        path = Path(path)
        settings = json.loads(json.dumps(settings))  # the JSON form is what gets compared with the stored one
        # where records were made is not a setting (a caller passing a stored config.json back gives these too)
        settings = {k: v for k, v in settings.items() if k not in ENVIRONMENT_KEYS}
        defaults = json.loads(json.dumps(defaults or {}))  # compared in the same JSON form
        for p in protect:
            if p is not None and path.exists() and Path(p).exists() and os.path.samefile(path, p):
                raise OutputError(f"--output {str(path)!r} is the input {str(p)!r}; choose another output file")
        if path.is_dir():
            raise OutputError(f"--output {str(path)!r} is a folder; give a file name such as {str(path / 'records.jsonl')!r}")
        if path.exists() and not path.is_file():  # a device (/dev/full), FIFO or socket: records need a plain file
            raise OutputError(f"--output {str(path)!r} is not a regular file (a device, FIFO or socket); records and "
                              f"{path.name}.config.json are written as plain files — give a file name in a folder")
        check_writable(path.parent, what="--output folder")
        if path.exists() and not os.access(path, os.W_OK):
            raise OutputError(f"--output {str(path)!r} is not writable; choose another file")
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # the umask applies
        locked = False
        try:
            flock_or_refuse(fd, _refusal(path))  # before reading or writing anything: a refused run changes nothing
            locked = True
            rf = cls._open_locked(path, settings, overwrite=overwrite, environment=environment, defaults=defaults)
        except BaseException:
            # the file this call created, still empty and ours (locked: no other run adopted it meanwhile) goes
            if created and locked:
                with contextlib.suppress(OSError):
                    if os.fstat(fd).st_size == 0:
                        path.unlink()
            os.close(fd)
            raise
        rf._fd, rf._created = fd, created
        return rf

    @classmethod
    def _open_locked(cls, path: Path, settings: dict[str, Any], *, overwrite: bool,
                     environment: dict[str, Any] | None = None,
                     defaults: dict[str, Any] | None = None) -> "RecordFile":
        config_path = Path(str(path) + ".config.json")
        has_records = path.stat().st_size > 0
        if overwrite or not has_records:
            return cls(path, settings, {}, valid_bytes=0, fresh=True, environment=environment)
        if not config_path.is_file():
            raise OutputError(f"--output {str(path)!r} already exists and has no {config_path.name} (it was not "
                              f"written by dsl-llada generate); pass --overwrite to replace it, or choose another file")
        try:
            stored = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise OutputError(f"{str(config_path)!r} is unreadable ({e}); pass --overwrite to start {str(path)!r} "
                              f"again, or choose another file") from None
        diff = (settings_diff({k: v for k, v in stored.items() if k not in ENVIRONMENT_KEYS}, settings,
                              defaults=defaults)
                if isinstance(stored, dict) else ["(not a JSON object)"])
        if diff:
            raise OutputError(f"--output {str(path)!r} was made with different settings: {'; '.join(diff)}; "
                              f"rerun with the same settings to continue it, pass --overwrite to replace it, or "
                              f"choose another file")
        done, valid = cls._read(path)
        return cls(path, settings, done, valid_bytes=valid, fresh=False, environment=environment, stored=stored)

    @staticmethod
    def _read(path: Path) -> tuple[dict[int, dict[str, Any]], int]:
        """Latest record by index and the byte length of the complete lines (a partial last line is left out)."""
        try:
            records, valid = jsonl_log.read(path, accept=lambda r: isinstance(r, dict) and isinstance(r.get("index"), int)
                                            and not isinstance(r.get("index"), bool))
        except ValueError as e:
            raise OutputError(f"{e} (each line is one JSON record with an integer 'index'); or pass --overwrite to "
                              f"start again") from None
        return jsonl_log.done_keys(records, "index"), valid

    # -- writing --------------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Store the settings (atomically, before any record), cut a partial last line (or the whole file when
        starting afresh); the file is already open for appending under this run's lock (`open`)."""
        if self._fd is None:
            raise RuntimeError("RecordFile.begin after close")
        if self._fresh or self.environment is not None:
            self._write_config()
        self._log = jsonl_log.JsonlAppender(self.path, fd=self._fd, valid_bytes=self._valid_bytes, repair=False)
        self._log.truncate(self._valid_bytes)  # a partial last line, or everything when starting afresh
        self._begun = True

    @property
    def finished(self) -> set[int]:
        """Indices whose latest record has no `error`: the ones a resumed run skips (a failed prompt is retried)."""
        return {i for i, r in self.done.items() if "error" not in r}

    def _write_config(self) -> None:
        """OUT.config.json: the settings plus the environment records (the first run's, then each resume's)."""
        doc = dict(self.settings)
        if self._fresh:
            if self.environment is not None:
                doc["environment"] = self.environment
        else:
            for k in ENVIRONMENT_KEYS:
                if k in self._stored:
                    doc[k] = self._stored[k]
            if self.environment is not None:
                doc["resumed_environments"] = [*doc.get("resumed_environments", []), self.environment]
        atomic_write_text(self.config_path, json.dumps(doc, indent=2) + "\n")
        self._stored, self._fresh = doc, False

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records as whole JSON lines with one write, flushed and fsynced (`jsonl_log.JsonlAppender`). On
        failure (a full disk) the file is cut back to its last complete record and the error re-raised naming the
        file."""
        if not records:
            return
        if self._log is None:
            raise ValueError(f"{self.path}: append() before begin() (the record file is not open)")
        before = self._log.end
        try:
            self._log.append(records)
        finally:  # also when Ctrl-C or SIGTERM arrives during the fsync: a batch in the file is counted as done
            if self._log.end > before:
                for r in records:
                    self.done[r["index"]] = r
                self.written += len(records)

    def close(self) -> None:
        """Release the lock; a file `open` created that never began (a refused or failed setup) is removed."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self._created and not self._begun:
                with contextlib.suppress(OSError):
                    if os.fstat(fd).st_size == 0:
                        self.path.unlink()
            os.close(fd)

    def finish(self, n_items: int) -> None:
        """Check, still under the lock, that the file holds every index 0..n-1 (the latest record of an index wins:
        a retried prompt's new record replaces its error); rewrite it sorted with one record per index, atomically,
        when it is not already so; then close."""
        try:
            if self.environment is not None and "load_average_end" not in self.environment:
                from ..runtime.environment import finish_record

                self.environment = finish_record(self.environment)
                key = "resumed_environments" if "resumed_environments" in self._stored else "environment"
                doc = dict(self._stored)
                doc[key] = [*doc[key][:-1], self.environment] if key == "resumed_environments" else self.environment
                atomic_write_text(self.config_path, json.dumps(doc, indent=2) + "\n")
                self._stored = doc
            done, _ = self._read(self.path)
            missing = sorted(set(range(n_items)) - set(done))
            if missing:
                raise OutputError(f"{str(self.path)!r} lacks records {missing[:5]} after the run; rerun the same "
                                  f"command to complete it")
            order = [json.loads(line)["index"] for line in self.path.read_bytes().splitlines() if line.strip()]
            if order != list(range(n_items)):
                atomic_write_text(self.path, "".join(json.dumps(done[i], ensure_ascii=False) + "\n"
                                                     for i in range(n_items)))
            self.done = done
        finally:
            self.close()
