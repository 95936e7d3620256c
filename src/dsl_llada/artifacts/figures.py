"""Figures saved as PNG atomically (temp file, rename), the figure closed afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .atomic import atomic_file


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically (temp file, rename; the umask's mode) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_file(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return path
