"""Monte Carlo log-likelihood throughput: requests/s with one mask pattern per forward (batch 1) against all
patterns of all requests batched, on a small LLaDA-shaped model; the ratio goes to docs/benchmarks.md.

Usage:  python benchmarks/bench_likelihood.py [--requests 16] [--mc-samples 32] [--repeats 3] [--write]
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import time
from pathlib import Path

import torch
from benchlib import environment_note, parse_args

from dsl_llada.backbones.llada import LLaDABackbone, LLaDAConfig
from dsl_llada.eval.likelihood import LikelihoodRequest, mc_loglikelihood

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- bench_likelihood -->"


def build(vocab: int = 4096) -> LLaDABackbone:
    cfg = LLaDAConfig(d_model=256, n_layers=4, n_heads=4, mlp_hidden_size=688, vocab_size=vocab,
                      max_sequence_length=512, mask_token_id=vocab - 1, eos_token_id=vocab - 2, pad_token_id=vocab - 2)
    bb = LLaDABackbone(cfg)
    bb.init_weights(torch.Generator().manual_seed(0))
    return bb.eval()


def requests(n: int, vocab: int) -> list[LikelihoodRequest]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ctx = torch.randint(0, vocab - 2, (48 + 8 * (i % 4),), generator=g).tolist()
        tgt = torch.randint(0, vocab - 2, (4 + i % 5,), generator=g).tolist()
        out.append(LikelihoodRequest(tuple(ctx), tuple(tgt)))
    return out


def write_section(text: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{MARK}\n{text.strip()}\n{MARK}\n"
    if MARK in doc:
        doc = re.sub(f"{re.escape(MARK)}.*?{re.escape(MARK)}\n", lambda _m: block, doc, flags=re.DOTALL)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block
    path.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--mc-samples", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64, help="rows per forward in the batched variant")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    a = parse_args(ap)
    model, V = build(), 4096
    reqs = requests(a.requests, V)
    times: dict[int, list[float]] = {1: [], a.batch: []}
    results = {}
    mc_loglikelihood(model, reqs[:2], mc_samples=2, batch_size=a.batch)  # warm-up
    for _ in range(a.repeats):  # interleave the two variants
        for bs in (1, a.batch):
            t0 = time.perf_counter()
            results[bs] = mc_loglikelihood(model, reqs, mc_samples=a.mc_samples, batch_size=bs)
            times[bs].append(time.perf_counter() - t0)
    diff = max(abs(x - y) for x, y in zip(results[1], results[a.batch]))
    rps = {bs: a.requests / statistics.median(t) for bs, t in times.items()}
    spread = {bs: f"{a.requests / max(t):.2f}–{a.requests / min(t):.2f}" for bs, t in times.items()}
    threads = torch.get_num_threads()
    text = f"""### Monte Carlo log-likelihood: batch 1 vs batched (cpu, float32, {threads} threads, torch {torch.__version__})

Command: `python benchmarks/bench_likelihood.py --write` (LLaDA-shaped d_model 256, 4 layers, V 4096;
{a.requests} requests, context 48–72 + target 4–8 tokens, {a.mc_samples} mask patterns each; median of {a.repeats}
interleaved runs, range in brackets; {platform.processor() or platform.machine()}).

| rows per forward | requests/s |
|---|---|
| 1 | {rps[1]:.2f} ({spread[1]}) |
| {a.batch} | {rps[a.batch]:.2f} ({spread[a.batch]}) |

Batched / batch 1: **{rps[a.batch] / rps[1]:.2f}×**, same estimates (max |Δ| = {diff:.1e} nats).

{environment_note()}
"""
    print(text)
    if a.write:
        write_section(text)


if __name__ == "__main__":
    main()
