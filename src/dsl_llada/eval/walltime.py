"""Wall-time helpers of the walltime task (`eval/tasks/walltime.py`, which times each sample through the eval
runner): the fixed prompt subset, the peak-memory reading and the figure. Protocol (the paper's wall-time table;
official-impl §5.9):

Batch size 1, the model loaded once, one warm-up call per method, the device synchronised before and after every
sample, median and mean seconds per sample. Throughput counts *generated* tokens only (the response up to its
first EOS/EoT — never the prompt, never padding). Diffusion methods run through this project's samplers; the
autoregressive baselines through any local Hugging Face causal LM's greedy `generate` with `max_new_tokens` = the
generation length, KV cache on or off. Differences from the authors' script: their SDE timing stops before the
final decoding forward (ours includes it: it is part of producing text), and they used an NFE ≤ 16 schedule with
one extra step (ours times the schedule the evaluation uses).
"""

from __future__ import annotations

import resource
from typing import Any

import numpy as np
import torch

from ..utils import save_figure


def choose_prompts(n_rows: int, k: int, seed: int = 42) -> list[int]:
    """Row indices of the fixed prompt subset: numpy RandomState(seed).choice without replacement (as §5.9)."""
    if n_rows < 1:
        raise ValueError("the dataset has no rows to time")
    return sorted(int(i) for i in np.random.RandomState(seed).choice(n_rows, size=min(k, n_rows), replace=False))


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory so far: CUDA allocator peak on a GPU, the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def plot_walltime(summary: dict[str, dict[str, Any]], path) -> None:
    """Seconds per sample against NFE for each diffusion method, with AR baselines as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    families: dict[str, list[tuple[int, float]]] = {}
    n_ar = 0
    for name, s in summary.items():
        if s.get("nfe") is None:
            ax.axhline(s["median_s"], linestyle=("--", ":", "-.")[n_ar % 3], color=f"C{7 + n_ar % 3}", linewidth=1.2,
                       label=f"{name}")
            n_ar += 1
        else:
            families.setdefault(s.get("family", name), []).append((s["nfe"], s["median_s"]))
    for fam, pts in families.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=fam)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # AR baselines and few-step samplers differ by orders of magnitude
    ax.set_xlabel("NFE")
    ax.set_ylabel("seconds per sample (median)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
