"""One writer per output: an exclusive lock on an output (file or folder) that names its holder.

``with output_lock(path, what="output_dir"):`` takes an advisory ``flock`` on the lock file ``.NAME.lock`` next to
`path` (beside it, not inside, so a folder that is replaced atomically keeps its lock) before the command writes
anything. A second process on the same output gets an `OutputError` (one ``error:`` line, exit 2) naming the PID of
the process that holds it; the lock dies with its holder (kill -9 included), so a crashed run never blocks the next.
The lock file holds the holder's PID and is removed on release. POSIX only (elsewhere it does nothing).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .outputs import OutputError

__all__ = ["lock_path", "output_lock"]


def lock_path(path: str | Path) -> Path:
    """The lock file of output `path`: ``.NAME.lock`` in the same parent folder."""
    p = Path(os.path.abspath(path))
    return p.with_name(f".{p.name}.lock")


def _holder(lock: Path) -> str:
    try:
        text = lock.read_text().strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def output_lock(path: str | Path, *, what: str = "output") -> Iterator[Path]:
    """Hold the exclusive lock of `path` for the block (see the module docstring). Raises OutputError when another
    process holds it. Creates the parent folder of `path` if needed (removed again, when still empty, if the block
    raises: a refused command leaves nothing behind)."""
    try:
        import fcntl  # noqa: F401  (POSIX only)
    except ImportError:  # pragma: no cover - not POSIX
        yield lock_path(path)
        return
    lock = lock_path(path)
    created = []  # missing ancestors made for the lock file: removed again when the command fails
    p = lock.parent
    while not p.exists():
        created.append(p)
        p = p.parent
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = _acquire(lock, path, what)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield lock
    except BaseException:
        _release(fd, lock)
        _remove_empty(created)
        raise
    else:
        _release(fd, lock)


def _remove_empty(folders: list[Path]) -> None:
    for f in folders:  # deepest first
        with contextlib.suppress(OSError):
            f.rmdir()


def _release(fd: int, lock: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(lock)
    os.close(fd)


def _acquire(lock: Path, path: str | Path, what: str) -> int:
    import fcntl

    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{what} {str(path)!r} is being written by another running process (PID "
                              f"{_holder(lock)}, lock {str(lock)!r}); wait for it to finish or choose another "
                              f"{what}") from None
        # The file may have been removed (and recreated) by a holder releasing it between our open and flock:
        # only the lock on the file now at that path counts.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
