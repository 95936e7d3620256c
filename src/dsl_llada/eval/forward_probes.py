"""Probes of a masked DLM / DSL model: mask accuracy + calibration (ECE, reliability diagram), context
robustness, and the converter phase table (docs/provenance.md §5.2, §5.3; paper App. "Converter Output Examples").

* Mask calibration (T3): per text, ``numpy.random.default_rng(seed + text_id)`` picks ``max(1, floor(n*r))``
  positions that are replaced by the model's MASK id; one forward; per masked position the confidence is the
  maximum softmax probability over the full vocabulary and ``correct`` is argmax == gold. Accuracy is micro-
  averaged over masked tokens; ECE uses 15 equal-width bins (last bin closed).
* Context robustness: 30 % of each text masked as above, then ``c`` % of the *remaining* (context) positions
  replaced by random ids (never the original, never a special id); micro accuracy on the masked positions.
  The masked positions are the same for every ``c`` (a paired comparison); the authors re-draw them per ``c``
  from a seed that depends on the text length.
* Converter phase table: for a token x and SNR gamma, ``n_seeds`` states z = gamma e_x + sqrt(gamma) eps go
  through the converter; we report the top-1 slot of the converter softmax (most frequent over seeds, the
  mask slot shown as ``[MASK]``), the number of seeds whose top-1 is x (``hit``), the top-2/3 slots of the
  seed-averaged softmax, and the mean cosine between the converter output and the clean embedding of x.

``path="discrete"`` (default, the authors' probes) reads ids through wte; ``path="converter"`` (DSL models)
reads context through the model's context embedding and masked positions as converter states at SNR 0.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import metrics as M
from .fix_clean import _encode, special_ids
from ..core.backbones.base import model_device as _device
from ..artifacts.figures import save_figure

__all__ = ["calibration_summary", "context_robustness_records", "context_robustness_summary",
           "converter_phase_table", "mask_calibration_records", "reliability_diagram"]


@torch.no_grad()
def _masked_logits(model: Any, ids: torch.Tensor, masked: torch.Tensor, att: torch.Tensor | None,
                   path: str) -> torch.Tensor:
    mask_id = model.special.mask
    inp = ids.masked_fill(masked, mask_id)
    if path == "discrete":
        return model.logits_from_ids(inp, att)
    if path != "converter" or not hasattr(model, "converter"):
        raise ValueError(f"path must be 'discrete' or (for DSL models) 'converter', got {path!r} for "
                         f"{type(model).__name__}")
    z = torch.zeros(int(masked.sum()), model.noise_dim, device=ids.device)
    return model.logits_from_states(inp, z, masked, att)


def _batches(model: Any, items: list[tuple[list[int], list[int]]], batch_size: int, path: str):
    """items: (ids, masked positions) -> yields (item index, probs-over-masked (N, V) fp32) in input order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dev = _device(model)
    pad = model.special.pad if isinstance(getattr(model.special, "pad", None), int) else 0
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    out: dict[int, torch.Tensor] = {}
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        L = max(len(items[i][0]) for i in idx)
        ids = torch.full((len(idx), L), pad, dtype=torch.long)
        att = torch.zeros(len(idx), L, dtype=torch.long)
        msk = torch.zeros(len(idx), L, dtype=torch.bool)
        for b, i in enumerate(idx):
            t, pos = items[i]
            ids[b, : len(t)] = torch.tensor(t, dtype=torch.long)
            att[b, : len(t)] = 1
            msk[b, pos] = True
        logits = _masked_logits(model, ids.to(dev), msk.to(dev), None if bool(att.all()) else att.to(dev), path)
        probs = torch.softmax(logits.float(), dim=-1).cpu()
        for b, i in enumerate(idx):
            out[i] = probs[b, items[i][1]]
    return [out[i] for i in range(len(items))]


def _mask_positions(n: int, rate: float, rng: np.random.Generator) -> list[int]:
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"mask_rate must be in (0, 1], got {rate}")
    k = max(1, math.floor(n * rate + 1e-9))
    return sorted(rng.choice(n, size=k, replace=False).tolist())


def mask_calibration_records(model: Any, tokenizer: Any, texts: Sequence[str | Sequence[int]], *, mask_rate: float,
                             seed: int = 42, batch_size: int = 8, text_ids: Sequence[int] | None = None,
                             path: str = "discrete", max_tokens: int | None = None,
                             mode: str = "default") -> list[dict[str, Any]]:
    """One record per non-empty text: masked ``positions``, ``gold``, ``pred``, ``confidence`` (max softmax
    probability) and ``correct`` per masked position, plus ``text_id``, ``mask_rate``, ``n_tokens``."""
    ids_list = [_encode(tokenizer, t, max_tokens) for t in texts]
    tids = list(range(len(ids_list))) if text_ids is None else [int(x) for x in text_ids]
    if len(tids) != len(ids_list):
        raise ValueError(f"text_ids has {len(tids)} entries but texts has {len(ids_list)}")
    keep = [(tid, ids) for tid, ids in zip(tids, ids_list) if ids]
    if mode == "authors":  # RandomState(seed + id).choice(n, max(1, int(n * r))) (docs/provenance.md §5.3)
        from .authors import mask_positions

        items = [(ids, sorted(mask_positions(len(ids), mask_rate, seed + tid))) for tid, ids in keep]
    else:
        items = [(ids, _mask_positions(len(ids), mask_rate, np.random.default_rng(seed + tid))) for tid, ids in keep]
    recs = []
    for (tid, ids), (_, pos), p in zip(keep, items, _batches(model, items, batch_size, path)):
        conf, pred = p.max(-1)
        gold = [ids[i] for i in pos]
        recs.append({"text_id": tid, "mask_rate": mask_rate, "path": path, "n_tokens": len(ids), "positions": pos,
                     "gold": gold, "pred": pred.tolist(), "confidence": conf.tolist(),
                     "correct": [int(a == b) for a, b in zip(pred.tolist(), gold)]})
    return recs


def calibration_summary(records: Sequence[Mapping[str, Any]], bins: int = 15, mode: str = "default") -> dict[str, Any]:
    """Micro accuracy, ECE (``bins`` equal-width bins; :func:`metrics.expected_calibration_error` in ``mode``)
    and the per-bin table ``[{lo, hi, count, acc, conf}]`` for the reliability diagram."""
    conf = np.array([c for r in records for c in r["confidence"]], dtype=np.float64)
    corr = np.array([c for r in records for c in r["correct"]], dtype=np.float64)
    if conf.size == 0:
        raise ValueError("calibration_summary needs at least one masked position, got none")
    if mode == "default":
        conf = np.clip(conf, 0.0, 1.0)  # fp32 softmax can overshoot 1 by an ulp
    ece = M.expected_calibration_error(conf, corr, n_bins=bins, mode=mode)
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, bins - 1)
    table = []
    for b in range(bins):
        sel = (idx == b) & (conf >= 0) & (conf <= 1)
        n = int(sel.sum())
        table.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "count": n,
                      "acc": float(corr[sel].mean()) if n else None, "conf": float(conf[sel].mean()) if n else None})
    return {"n_tokens": int(conf.size), "accuracy": float(corr.mean()), "mean_confidence": float(conf.mean()),
            "ece": ece, "bins": table, "mode": mode}


def reliability_diagram(summary: Mapping[str, Any], path: str | os.PathLike, *, title: str = "") -> Path:
    """Reliability diagram (accuracy vs confidence per bin, bar width = bin, with the diagonal) as a PNG,
    written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    bins = [b for b in summary["bins"] if b["count"]]
    ax.bar([b["lo"] for b in bins], [b["acc"] for b in bins], width=[b["hi"] - b["lo"] for b in bins],
           align="edge", edgecolor="black", alpha=0.75, label="accuracy")
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.plot([b["conf"] for b in bins], [b["acc"] for b in bins], "o", color="tab:red", ms=3, label="bin mean conf")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(title or f"acc {100 * summary['accuracy']:.1f}%  ECE {summary['ece']:.3f}  (n={summary['n_tokens']})",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return save_figure(fig, path)


def context_robustness_records(model: Any, tokenizer: Any, texts: Sequence[str | Sequence[int]], *,
                               corrupt_pcts: Sequence[int] = (0, 10, 20, 30, 50), mask_rate: float = 0.3,
                               seed: int = 0, batch_size: int = 8, id_range: tuple[int, int] | None = None,
                               min_tokens: int = 20, max_tokens: int | None = 256,
                               text_ids: Sequence[int] | None = None, path: str = "discrete") -> list[dict[str, Any]]:
    """One record per (text, c): ``n_masked`` and ``n_correct`` on the masked positions when c % of the context
    is replaced by random ids from ``id_range`` (default the whole vocabulary; specials excluded). Texts shorter
    than ``min_tokens`` are skipped (authors: 20); texts are cut to ``max_tokens`` (authors: 256)."""
    V = int(model.vocab_size)
    low, high = id_range if id_range is not None else (0, V)
    if not 0 <= low < high <= V:
        raise ValueError(f"id_range must satisfy 0 <= low < high <= vocab size {V}, got {(low, high)}")
    for c in corrupt_pcts:
        if not 0 <= c <= 100:
            raise ValueError(f"corrupt_pcts must be percentages in [0, 100], got {c}")
    bad = special_ids(model)
    ids_list = [_encode(tokenizer, t, max_tokens) for t in texts]
    tids = list(range(len(ids_list))) if text_ids is None else [int(x) for x in text_ids]
    items, meta = [], []
    for tid, ids in zip(tids, ids_list):
        if len(ids) < min_tokens:
            continue
        pos = _mask_positions(len(ids), mask_rate, np.random.default_rng(seed + tid))
        ctx = [i for i in range(len(ids)) if i not in set(pos)]
        for c in corrupt_pcts:
            rng = np.random.default_rng([seed, tid, int(c)])
            n_c = math.floor(len(ctx) * c / 100 + 1e-9)
            chosen = sorted(rng.choice(len(ctx), size=n_c, replace=False).tolist()) if n_c else []
            cur = list(ids)
            for k in chosen:
                i = ctx[k]
                new = cur[i]
                while new == ids[i] or new in bad:
                    new = int(rng.integers(low, high))
                cur[i] = new
            items.append((cur, pos))
            meta.append((tid, int(c), [ids[i] for i in pos], n_c))
    recs = []
    for (tid, c, gold, n_c), p in zip(meta, _batches(model, items, batch_size, path)):
        pred = p.argmax(-1).tolist()
        recs.append({"text_id": tid, "corrupt_pct": c, "n_corrupted_context": n_c, "n_masked": len(gold),
                     "n_correct": sum(int(a == b) for a, b in zip(pred, gold)), "path": path})
    return recs


def context_robustness_summary(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Micro accuracy on masked positions per corruption level: ``[{corrupt_pct, n_texts, n_masked, accuracy}]``."""
    by: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(int(r["corrupt_pct"]), []).append(r)
    return [{"corrupt_pct": c, "n_texts": len(rs), "n_masked": sum(r["n_masked"] for r in rs),
             "accuracy": sum(r["n_correct"] for r in rs) / max(1, sum(r["n_masked"] for r in rs))}
            for c, rs in sorted(by.items())]


@torch.no_grad()
def converter_phase_table(model: Any, token_ids: Sequence[int], *, snrs: Sequence[float] = (1, 10, 25, 40, 50),
                          n_seeds: int = 20, seed: int = 0, beta: float | None = None,
                          tokenizer: Any = None) -> list[dict[str, Any]]:
    """The paper's converter table: one row per (token, SNR); see the module docstring for the columns.
    ``beta`` overrides the trained converter sharpness (e.g. the inference beta_inf)."""
    if not hasattr(model, "converter"):
        raise ValueError(f"converter_phase_table needs a DSL model with a converter, got {type(model).__name__}")
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
    from ..core.converter import noisy_states

    V = model.vocab_size
    dev = _device(model)
    E = model.unit_noise()
    b = model.converter.beta if beta is None else torch.tensor(float(beta), device=dev)

    def label(slot: int) -> str:
        if slot == V:
            return "[MASK]"
        return tokenizer.decode([slot]) if tokenizer is not None else str(slot)

    rows = []
    for tok in token_ids:
        if not 0 <= int(tok) < V:
            raise ValueError(f"token id {tok} is outside the vocabulary [0, {V})")
        clean = model.converter.clean_embedding(torch.tensor([int(tok)], device=dev)).float()[0]
        for g in snrs:
            gen = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + int(tok) * 1_009 + round(1000 * g))
            ids = torch.full((n_seeds,), int(tok), dtype=torch.long, device=dev)
            z = noisy_states(E, ids, float(g), gen)
            pi = torch.softmax(model.converter.slot_logits(z, E, b), dim=-1)
            h = model.converter(z, E, None if beta is None else b).float()
            top1 = pi.argmax(-1).tolist()
            cnt = Counter(top1)
            mode_slot, mode_n = cnt.most_common(1)[0]
            avg_top = pi.mean(0).topk(3).indices.tolist()
            cos = torch.nn.functional.cosine_similarity(h, clean[None], dim=-1).mean().item()
            rows.append({"token_id": int(tok), "token": label(int(tok)), "snr": float(g),
                         "top1": label(mode_slot), "top1_count": mode_n, "top1_distinct": len(cnt),
                         "hit": cnt.get(int(tok), 0), "mask_top1": cnt.get(V, 0),
                         "top2": label(avg_top[1]), "top3": label(avg_top[2]), "gold_cos": cos, "n_seeds": n_seeds})
    return rows
