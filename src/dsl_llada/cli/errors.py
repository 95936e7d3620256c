"""How a command ends on an error: bad input or an unusable file/disk is one `error: ...` line and exit code 2,
Ctrl-C 130, SIGTERM during an atomic write 143."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from ..runtime.termination import Terminated


_DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "not permitted",
                errno.EISDIR: "is a folder", errno.ENOTDIR: "a parent is not a folder",
                errno.EFBIG: "file size limit exceeded (ulimit -f)"}


def describe_os_error(e: OSError) -> str:
    """One line for an OSError from writing or reading a file: what happened, to which file, what to do."""
    where = f" {e.filename!r}" if e.filename else ""
    what = _DISK_ERRORS.get(e.errno or -1, e.strerror or str(e))
    full = "free some space or choose another output location (partial files were removed)"
    fix = {errno.ENOSPC: full, errno.EDQUOT: full,
           errno.EFBIG: "raise the file size limit or choose another output location (partial files were removed)"}.get(
        e.errno or -1, "check the path and its permissions")
    return f"{what}:{where}; {fix}"


def run_cli_command(func: Callable[[Any], int | None], args: Any, *, interrupted: str) -> int:
    """Run a CLI subcommand: bad input or an unusable file/disk becomes one `error: ...` line and exit code 2,
    Ctrl-C exit code 130, SIGTERM during an atomic write (`Terminated`) exit code 143."""
    import sys

    try:
        return int(func(args) or 0)
    except Terminated:
        print("error: terminated (SIGTERM); the output being written was removed, finished ones are kept",
              file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        return 2
