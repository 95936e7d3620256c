"""A demo run's files replace the previous run's as one set, so a report never sits beside another run's results.

    with staged_files(out, COMPARISON_FILES, report="report.md") as stage:
        ...  # write this run's files into `stage`

`stage` is a hidden folder inside the output folder (``OUT/.run.XXXXXXXX.tmp``, so the moves below are renames on
one file system). When the block ends without an error, its files are moved into the output folder in an order that
keeps the report honest at every instant:

1. the previous report is removed (from here until step 4 the folder holds no report at all);
2. files of the set that the previous run wrote (its ``config.json`` lists them under ``"files"``) and this run did
   not write are removed; nothing outside the set's names is ever touched;
3. this run's other files are moved in;
4. this run's report is moved in last.

A kill at any moment therefore leaves the previous run's complete set (before step 1), no report (steps 1-4), or this
run's complete set: a report is only ever beside the results, configuration and figures it was written from. An
error or Ctrl-C in the block (or in the moves) removes the stage; the output folder then holds no report or the
previous one. A stage left behind by a killed run is removed by the next run (`remove_stale_stages`) when it holds
only files of the set (or their temp files); a look-alike holding anything else is named and left alone.

Each run also gets a `run_id` (`new_run_id`), which the demo writes into its ``config.json``, ``bayes_floor.json``
and ``report.md``: the files of one run name the same id.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from ..artifacts.atomic import dir_mode

__all__ = ["COMPARISON_FILES", "FRONTIER_FILES", "MANIFEST", "SWEEP_FILES", "claimed_files", "new_run_id",
           "remove_stale_stages", "staged_files"]

MANIFEST = "config.json"
"""The file of a set that lists the set's files (key ``"files"``) and its ``"run_id"``."""
COMPARISON_FILES = ("report.md", "results.jsonl", "config.json", "nfe_curve.png", "bayes_floor.json",
                    "excess_loss.png")
"""What `dsl-llada demo` writes into OUT (the last two only when the oracle measurements run)."""
SWEEP_FILES = ("sweep.md", "sweep.png", "config.json")
"""What `demo --sweep` rewrites in OUT/sweep/ at its end (its rows, sweep.jsonl and samples.jsonl, are appended as
each run finishes and kept across runs: a rerun resumes them)."""
FRONTIER_FILES = ("frontier.md", "frontier.png", "config.json")
"""What `demo --cache-frontier` rewrites in OUT/cache_frontier/ at its end (runs.jsonl and samples.jsonl are
appended as each run finishes and kept across runs)."""

_STAGE = re.compile(r"^\.run\.[A-Za-z0-9_]{8}\.tmp$")


def new_run_id() -> str:
    """A fresh run id: the UTC start time and 6 random hex digits, e.g. ``20261201T101500Z-3fa2c1``."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def claimed_files(folder: Path, names: Sequence[str]) -> set[str]:
    """The files of `names` that the run whose ``config.json`` is in `folder` says it wrote (none when there is no
    readable config.json, or when it predates the ``"files"`` list)."""
    try:
        listed = json.loads((folder / MANIFEST).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(listed, list):
        return set()
    return {n for n in listed if isinstance(n, str) and n in names}


def _ours(entry: Path, names: Sequence[str]) -> bool:
    """A file of the set, or the temp file an atomic write of one leaves when it is killed."""
    if not entry.is_file() or entry.is_symlink():
        return False
    return entry.name in names or any(re.fullmatch(rf"\.{re.escape(n)}\.[A-Za-z0-9_]+\.tmp", entry.name) for n in names)


def remove_stale_stages(folder: Path, names: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """Remove the stages a killed run left in `folder` (call it while holding the output folder's lock: then no
    live run owns them). Returns (removed, kept): a look-alike holding anything else is kept."""
    removed: list[Path] = []
    kept: list[Path] = []
    if not folder.is_dir():
        return removed, kept
    for p in sorted(folder.iterdir()):
        if not _STAGE.match(p.name) or not p.is_dir() or p.is_symlink():
            continue
        if all(_ours(e, names) for e in p.iterdir()):
            shutil.rmtree(p)
            removed.append(p)
        else:
            kept.append(p)
    return removed, kept


@contextlib.contextmanager
def staged_files(folder: str | Path, names: Sequence[str], *, report: str) -> Iterator[Path]:
    """Yield a stage for this run's files (only names in `names`; `report` among them); on success move them into
    `folder` as the module docstring describes. On any error the stage is removed."""
    folder = Path(folder)
    if report not in names:
        raise ValueError(f"report={report!r} is not one of the set's files {list(names)}")
    folder.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=".run.", suffix=".tmp"))
    os.chmod(stage, dir_mode())
    try:
        yield stage
        written = {e.name for e in stage.iterdir()}
        if not written <= set(names):
            raise ValueError(f"the run wrote {sorted(written - set(names))} beside its files; expected only "
                             f"{list(names)}")
        if report not in written:
            raise ValueError(f"the run wrote no {report} into its stage")
        dropped = claimed_files(folder, names) - written  # read before anything of the previous run is removed
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / report)
        for name in sorted(dropped - {report}):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / name)
        for name in sorted(written - {report}):
            os.replace(stage / name, folder / name)
        os.replace(stage / report, folder / report)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
