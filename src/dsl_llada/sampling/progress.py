"""Progress bars that can be silenced (tqdm, imported only when a bar is shown)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "", enabled: bool = True,
             leave: bool = False) -> Iterable[Any]:
    """A tqdm progress bar that can be silenced (returns the bare iterable when disabled)."""
    if not enabled:
        return iterable if iterable is not None else range(total or 0)
    from tqdm.auto import tqdm

    bar: Iterable[Any] = tqdm(iterable, total=total, desc=desc, leave=leave, dynamic_ncols=True)
    return bar
