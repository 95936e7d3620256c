"""Small shared helpers: atomic file writes, logging setup, progress bars."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("dsl_llada")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temp folder next to `path`; on success it replaces `path` (any old content is removed).

    A crash or Ctrl-C inside the block leaves `path` untouched and removes the temp folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint should be readable like any other folder
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def progress(iterable=None, *, total: int | None = None, desc: str = "", enabled: bool = True, leave: bool = False):
    """A tqdm progress bar that can be silenced (returns the bare iterable when disabled)."""
    if not enabled:
        return iterable if iterable is not None else range(total or 0)
    from tqdm.auto import tqdm  # noqa: PLC0415  (only when a bar is shown)

    return tqdm(iterable, total=total, desc=desc, leave=leave, dynamic_ncols=True)


def run_cli_command(func, args, *, interrupted: str) -> int:
    """Run a CLI subcommand: bad input becomes one `error: ...` line and exit code 2, Ctrl-C exit code 130."""
    import sys  # noqa: PLC0415

    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
