"""Atomic writes with ordinary permissions: a file or a model folder appears whole or not at all (temp file or
folder next to the target, renamed onto it), and the temp folders a killed writer leaves behind."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..runtime.termination import terminate_raises


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (/proc), else via a quick set/reset."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode an ordinary tool gives a new file (0644 under the usual umask 022)."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """Mode an ordinary tool gives a new folder (0755 under the usual umask 022)."""
    return 0o777 & ~current_umask()


def _name_path(e: OSError, path: Path) -> OSError:
    """The same OSError with `path` as its filename (low-level writes on a descriptor carry none)."""
    if e.filename is None:
        return OSError(e.errno, e.strerror or str(e), str(path))
    return e


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temp path next to `path` for a writer that wants a file name (savefig, save_file); on success it is
    given the umask's mode and renamed onto `path`; on any error (a full disk included) it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise _name_path(e, path) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same folder (fsynced) and an atomic rename; mode from umask."""
    path = Path(path)
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` via a temp file in the same folder and an atomic rename; mode from umask."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temp folder next to `path`; on success it replaces `path`.

    `path` may be missing, an empty folder, or a model folder this package wrote (`outputs.is_own_artifact(path,
    "model")`); anything else raises OutputError before any work, so no user folder is ever deleted here.
    A crash, a full disk, Ctrl-C or SIGTERM inside the block leaves `path` untouched and removes the temp folder
    (SIGTERM then raises `Terminated`, after the safetensors write in progress has finished).
    """
    from .outputs import OutputError, is_own_artifact, unknown_entries

    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir() or path.is_symlink():
            raise OutputError(f"{str(path)!r} exists and is not a folder; it is left alone — remove it or choose "
                              f"another path")
        if any(path.iterdir()) and not is_own_artifact(path, "model"):
            raise OutputError(f"{str(path)!r} holds files dsl-llada did not write ({', '.join(unknown_entries(path, 'model')[:3])}); "
                              f"it is left alone — choose a new or empty folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    with terminate_raises():
        yield from _fill_and_rename(path)


def _fill_and_rename(path: Path) -> Iterator[Path]:
    """The body of `atomic_directory`: a temp folder next to `path`, renamed onto it after the caller's block."""
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, dir_mode())  # mkdtemp makes 0700; a checkpoint should be readable like any other folder
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _name_path(e, path) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stale_temp_folders(path: str | Path) -> list[Path]:
    """Temp folders `atomic_directory(path)` leaves next to `path` when its process dies (kill -9, power loss):
    ``.NAME.XXXXXXXX.tmp`` and ``.NAME.old``. Only meaningful while the caller holds `path`'s lock
    (`dsl_llada.artifacts.locks.output_lock`): then no live writer owns them."""
    path = Path(os.path.abspath(path))
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.([A-Za-z0-9_]{{8}}\.tmp|old)$")
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.iterdir() if pattern.match(p.name) and p.is_dir() and not p.is_symlink())


_SAFETENSORS_PARTIAL = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")
"""The temp file safetensors (0.5+) writes a weights file into before renaming it: what a writer killed inside
`save_file` leaves in its temp folder."""


def remove_stale_temp_folders(path: str | Path) -> tuple[list[Path], list[Path]]:
    """Remove the `stale_temp_folders` of `path` that hold only model files (what `atomic_directory` writes,
    including a half-written weights file under safetensors' temp name). Returns (removed, kept): a folder holding
    anything else or another folder is left alone and returned in kept."""
    from .outputs import _MODEL_ALLOWED

    removed, kept = [], []
    for p in stale_temp_folders(path):
        entries = list(p.iterdir())
        if all(e.is_file() and not e.is_symlink() and (_MODEL_ALLOWED.match(e.name) or _SAFETENSORS_PARTIAL.match(e.name))
               for e in entries):
            shutil.rmtree(p)
            removed.append(p)
        else:
            kept.append(p)
    return removed, kept


