"""The training log: `metrics.jsonl` records and the running window they average over.

A record is written every `log_every` updates (and at the last one): the mean loss and `train/*` metrics of the
updates since the previous record, the gradient norm and learning rates of the current update, throughput. The
window's running sums are part of every checkpoint (`LogWindow.state_dict`), so a run killed between two records
and resumed logs exactly the values of an uninterrupted run (wall-clock fields aside).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

__all__ = ["METRICS_FILE", "LogWindow", "append_record"]

METRICS_FILE = "metrics.jsonl"


class LogWindow:
    """Running sums of the updates since the last logged record (this process's own `train/*` metrics)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.tokens = 0.0
        self.metrics: dict[str, list[float]] = {}
        self.t0 = time.perf_counter()

    def add_metrics(self, metrics: dict[str, float]) -> None:
        """One micro-batch's objective metrics."""
        for k, v in metrics.items():
            self.metrics.setdefault(k, []).append(v)

    def add_update(self, loss: float, tokens: float) -> None:
        """One update's mean loss (over micro-batches and processes) and the tokens it consumed (all processes)."""
        self.losses.append(loss)
        self.tokens += tokens

    def restart_clock(self) -> None:
        """Throughput windows exclude monitoring and checkpoint time."""
        self.t0 = time.perf_counter()

    def record(self, step: int, grad_norm: float | None, lrs: dict[str, float], tokens_seen: int,
               t_start: float) -> dict[str, Any]:
        """The record of `step` (means over the window), then an empty window."""
        now = time.perf_counter()
        dt = max(now - self.t0, 1e-9)
        rec: dict[str, Any] = {"step": step, "loss": sum(self.losses) / len(self.losses), "grad_norm": grad_norm,
                               "tokens_per_s": self.tokens / dt, "tokens": tokens_seen, "elapsed_s": now - t_start}
        rec.update({f"lr/{k}": v for k, v in lrs.items()})  # the LR this update used
        for k, vs in sorted(self.metrics.items()):
            rec[f"train/{k}"] = sum(vs) / len(vs)
        self.losses, self.tokens, self.metrics, self.t0 = [], 0.0, {}, now
        return rec

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "tokens": self.tokens,
                "metrics": {k: list(v) for k, v in self.metrics.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = [float(v) for v in state["losses"]]
        self.tokens = float(state["tokens"])
        self.metrics = {k: list(v) for k, v in state["metrics"].items()}
        self.t0 = time.perf_counter()


def append_record(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
