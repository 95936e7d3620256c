"""Wall time per sample (the paper's wall-time table; protocol: official-impl §5.9).

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
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..utils import save_figure


def choose_prompts(n_rows: int, k: int, seed: int = 42) -> list[int]:
    """Row indices of the fixed prompt subset: numpy RandomState(seed).choice without replacement (as §5.9)."""
    if n_rows < 1:
        raise ValueError("the dataset has no rows to time")
    return sorted(int(i) for i in np.random.RandomState(seed).choice(n_rows, size=min(k, n_rows), replace=False))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory so far: CUDA allocator peak on a GPU, the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


@dataclass
class Timing:
    seconds: float
    gen_tokens: int
    nfe: int | None = None
    forward_passes: int | None = None
    text: str = ""


def time_diffusion_sample(model, tokenizer, prompt: str, choice, *, seed: int, chat_template: bool = True) -> Timing:
    """One timed sample through this project's samplers (batch size 1)."""
    from ..loading import encode_prompt
    from ..sampling.batches import run_batch

    device = next(model.parameters()).device
    ids = encode_prompt(tokenizer, prompt, chat_template=chat_template)
    _sync(device)
    t0 = time.perf_counter()
    out = run_batch(model, [ids], getattr(choice, "config", choice), [seed])
    _sync(device)
    dt = time.perf_counter() - t0
    resp = out.responses()[0]
    return Timing(dt, len(resp), out.nfe, out.forward_passes, tokenizer.decode(resp, skip_special_tokens=True))


class ARModel:
    """A local Hugging Face causal LM for the autoregressive baselines (greedy, chat template when present)."""

    def __init__(self, folder: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 gguf_file: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kw: dict[str, Any] = {"local_files_only": True}
        if gguf_file:
            kw["gguf_file"] = gguf_file
        try:
            self.tok = AutoTokenizer.from_pretrained(folder, **kw)
            self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kw).to(device).eval()
        except (OSError, ValueError) as e:
            raise ValueError(f"{folder}: not a local causal LM that transformers can load ({e})") from None
        self.name, self.device = folder, torch.device(device)

    def time_sample(self, prompt: str, gen_length: int, *, use_cache: bool, max_prompt: int = 8192) -> Timing:
        if getattr(self.tok, "chat_template", None):
            enc = self.tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
        else:
            enc = self.tok(prompt, return_tensors="pt")
        enc = {k: v[:, -max_prompt:].to(self.device) for k, v in enc.items()}
        eos = self.tok.eos_token_id
        _sync(self.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=gen_length, do_sample=False, use_cache=use_cache,
                                      pad_token_id=self.tok.pad_token_id if self.tok.pad_token_id is not None else eos)
        _sync(self.device)
        dt = time.perf_counter() - t0
        new = out[0, enc["input_ids"].shape[1]:].tolist()
        if eos is not None and eos in new:
            new = new[:new.index(eos)]
        return Timing(dt, len(new), None, len(new) + 1, self.tok.decode(new, skip_special_tokens=True))


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median/mean seconds per sample and generated tokens per second (total generated / total seconds)."""
    secs = [r["seconds"] for r in rows]
    toks = sum(r["gen_tokens"] for r in rows)
    return {"n": len(rows), "median_s": statistics.median(secs), "mean_s": statistics.fmean(secs),
            "gen_tokens_per_s": toks / sum(secs) if sum(secs) > 0 else 0.0,
            "mean_gen_tokens": toks / len(rows), "nfe": rows[0].get("nfe"), "forward_passes":
            statistics.fmean(r["forward_passes"] for r in rows if r.get("forward_passes") is not None)
            if any(r.get("forward_passes") is not None for r in rows) else None,
            "peak_mem_mib": max(r.get("peak_mem_mib", 0.0) for r in rows)}


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
