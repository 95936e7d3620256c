"""One writer per output: the one exclusive-lock primitive of the package, and the one that names its holder.

`flock_or_refuse(fd, refusal)` takes an advisory ``flock`` (exclusive, non-blocking) on an open file; when another
process (or another open of the file in this process) holds it, it raises `OutputError` with the message
``refusal(pid)`` builds from the holder's PID (read from Linux ``/proc/locks``; None when unknown). It is used two
ways:

- on the output file itself: `records.RecordFile.open` (``generate --output``) locks the file before it reads or
  writes anything, so a refused run changes nothing;
- on a lock file beside an output (`output_lock`, for output folders: ``train``'s ``output_dir``, ``convert``'s
  output, ``demo``'s ``--out``):
``with output_lock(path, what="output_dir"):`` takes an advisory ``flock`` on the lock file ``.NAME.lock`` next to
`path` (beside it, not inside, so a folder that is replaced atomically keeps its lock) before the command writes
anything. A second process on the same output gets an `OutputError` (one ``error:`` line, exit 2) naming the PID of
the process that holds it; the lock dies with its holder (kill -9 included), so a crashed run never blocks the next.
The lock file holds the holder's PID (the name given when ``/proc/locks`` does not) and is removed on release.

POSIX only (elsewhere both do nothing).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from .outputs import OutputError, resolve_output

__all__ = ["flock_or_refuse", "lock_holder", "lock_path", "output_lock"]


def lock_path(path: str | Path, *, what: str = "output") -> Path:
    """The lock file of output `path`: ``.NAME.lock`` in the same parent folder (of the folder a symbolic link
    names, so a run through the link and one through the folder take the same lock). A path through a symbolic link
    loop raises OutputError (`outputs.resolve_output`)."""
    p = Path(os.path.abspath(path))
    real = resolve_output(path, what=what)  # refuses a link loop anywhere on the way
    if p.is_symlink():
        p = real
    return p.with_name(f".{p.name}.lock")


def lock_holder(fd: int) -> int | None:
    """PID of the process holding a lock on the file open as `fd` (Linux /proc/locks), or None when unknown."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF" (a "->" marks a waiting lock)
                if "->" in parts or len(parts) < 6:
                    continue
                maj_min_ino = parts[5].split(":")
                if len(maj_min_ino) == 3 and int(maj_min_ino[2]) == st.st_ino and \
                        int(maj_min_ino[0], 16) == os.major(st.st_dev) and int(maj_min_ino[1], 16) == os.minor(st.st_dev):
                    return int(parts[4])
    except (OSError, ValueError):
        return None
    return None


def flock_or_refuse(fd: int, refusal: Callable[[int | None], str]) -> None:
    """Take an exclusive advisory lock on the open file `fd` without waiting. When it is held elsewhere, raise
    OutputError(refusal(pid)), `pid` the holder's (None when unknown). The lock lasts until `fd` is closed (or the
    process dies). Does nothing where ``fcntl`` is missing (not POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputError(refusal(lock_holder(fd))) from None


def _written_holder(lock: Path) -> str:
    """The PID a holder wrote into lock file `lock` ("unknown" when there is none)."""
    try:
        text = lock.read_text().strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def output_lock(path: str | Path, *, what: str = "output") -> Iterator[Path]:
    """Hold the exclusive lock of `path` for the block (see the module docstring). Raises OutputError when another
    process holds it, or when the lock file cannot be created (an unwritable place). Creates the parent folder of
    `path` if needed (removed again, when still empty, if the block
    raises: a refused command leaves nothing behind)."""
    try:
        import fcntl  # noqa: F401  (POSIX only)
    except ImportError:  # pragma: no cover - not POSIX
        yield lock_path(path)
        return
    lock = lock_path(path, what=what)
    created = []  # missing ancestors made for the lock file: removed again when the command fails
    p = lock.parent
    while not p.exists():
        created.append(p)
        p = p.parent
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(lock, path, what)
    except OSError as e:  # e.g. /proc/x or a read-only mount: the same refusal as `outputs.check_writable`'s
        _remove_empty(created)
        raise OutputError(f"{what} {str(path)!r} is not writable ({e.strerror or e} for its lock file {str(lock)!r}); "
                          f"choose a folder you can write to") from None
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
    def refusal(pid: int | None) -> str:
        holder = str(pid) if pid is not None else _written_holder(lock)
        return (f"{what} {str(path)!r} is being written by another running process (PID {holder}, lock "
                f"{str(lock)!r}); wait for it to finish or choose another {what}")

    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock_or_refuse(fd, refusal)
        except OutputError:
            os.close(fd)
            raise
        # The file may have been removed (and recreated) by a holder releasing it between our open and flock:
        # only the lock on the file now at that path counts.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
