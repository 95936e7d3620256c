"""The demo's Bayes-floor section: each checkpoint's cross-entropy against the exact oracle's on held-out
conversations (`bayes_floor`), as rows, a Markdown table and a plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..core.backbones.base import Backbone, SpecialTokens
from ..core.model import DSLModel
from .bayes_floor import DSL_SNRS, MASK_RATES, dsl_curve, dsl_excess, mdm_curve
from .demo_train import longest_prompt, sft_tensors
from .tasks import make_split
from .world import ToyWorld

__all__ = ["LABELS", "excess_table", "floor_rows", "held_out", "plot_excess"]

LABELS = {"base": "pretrained MDM", "dsl": "DSL", "mdm": "MDM-CPT", "xdlm": "XDLM"}
"""Report names of the demo's checkpoints."""


def held_out(world: ToyWorld, tokenizer, n_per_task: int, gen_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SFT tensors of `n_per_task` open-ended + `n_per_task` summarisation conversations of the 'valid' split (never
    trained on, never sampled in the report), padded to their longest prompt + `gen_length`."""
    exs = make_split(world, n_per_task, "open", "valid") + make_split(world, n_per_task, "summarize", "valid")
    return sft_tensors(tokenizer, exs, gen_length, longest_prompt(tokenizer, exs) + gen_length)


def floor_rows(models: Mapping[str, DSLModel | Backbone], world: ToyWorld, special: SpecialTokens, ids: torch.Tensor,
               prompt_length: torch.Tensor, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (checkpoint, corruption level): 'dsl' rows for DSL models on the SNR grid plus one 'dsl-train'
    row (γ from the training distribution), 'mdm' rows for discrete models on the mask-rate grid."""
    rows: list[dict[str, Any]] = []
    for name, model in models.items():
        label = LABELS.get(name, name)
        if isinstance(model, DSLModel):
            for p in dsl_curve(model, world, special, ids, prompt_length, DSL_SNRS, seed):
                rows.append({"model": label, "kind": "dsl", **p.as_dict()})
            rows.append({"model": label, "kind": "dsl-train", **dsl_excess(model, world, special, ids, prompt_length,
                                                                          seed=seed).as_dict()})
        else:
            for p in mdm_curve(model, world, special, ids, prompt_length, MASK_RATES, seed):
                rows.append({"model": label, "kind": "mdm", **p.as_dict()})
    return rows


def excess_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: model / oracle cross-entropy and the excess per checkpoint and level (nats per scored position)."""
    head = ["| model | observation | level | model CE | Bayes floor (oracle CE) | excess |", "|---|---|---|---|---|---|"]
    what = {"dsl": "DSL, SNR γ", "dsl-train": "DSL, γ ~ training mix", "mdm": "masked, rate"}
    body = [f"| {r['model']} | {what[r['kind']]} | {'' if r['kind'] == 'dsl-train' else format(r['level'], 'g')} | "
            f"{r['model_ce']:.3f} | {r['oracle_ce']:.3f} | {r['excess']:.3f} |" for r in rows]
    return "\n".join(head + body)


def plot_excess(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Two panels: cross-entropy against SNR (DSL) and against mask rate (masked), each checkpoint beside the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..artifacts.figures import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, kind, xlabel in ((axes[0], "dsl", "SNR γ (per sequence)"), (axes[1], "mdm", "mask rate")):
        models = list(dict.fromkeys(r["model"] for r in rows if r["kind"] == kind))
        for m in models:
            rs = [r for r in rows if r["kind"] == kind and r["model"] == m]
            ax.plot([r["level"] for r in rs], [r["model_ce"] for r in rs], marker="o", label=m)
        if models:
            rs = [r for r in rows if r["kind"] == kind and r["model"] == models[0]]
            ax.plot([r["level"] for r in rs], [r["oracle_ce"] for r in rs], "k--", marker="x", label="Bayes floor (oracle)")
            ax.legend(fontsize=8)
        if kind == "dsl":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("cross-entropy (nats / position)")
    fig.suptitle("Held-out loss against the exact Bayes floor")
    fig.tight_layout()
    return save_figure(fig, path)
