"""Monte Carlo log-likelihood throughput: requests/s with one mask pattern per forward (batch 1) against all
patterns of all requests batched, on a small LLaDA-shaped model; the ratio goes to docs/benchmarks/.

Usage:  python benchmarks/bench_batching.py likelihood [--requests 16] [--mc-samples 32] [--repeats 3] [--write]
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch
from benchlib import command_line, environment_note, interleave, write_section

from dsl_llada.core.backbones.llada import LLaDABackbone, LLaDAConfig
from dsl_llada.eval.likelihood import LikelihoodRequest, mc_loglikelihood

TITLE = "Monte Carlo log-likelihood: batch 1 vs batched"


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


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--mc-samples", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64, help="rows per forward in the batched variant")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true")


def run(a: argparse.Namespace) -> None:
    model, V = build(), 4096
    reqs = requests(a.requests, V)
    results = {}
    mc_loglikelihood(model, reqs[:2], mc_samples=2, batch_size=a.batch)  # warm-up

    def variant(bs: int):
        return lambda: results.__setitem__(bs, mc_loglikelihood(model, reqs, mc_samples=a.mc_samples, batch_size=bs))

    times = interleave({1: variant(1), a.batch: variant(a.batch)}, a.repeats, warmup=False)
    diff = max(abs(x - y) for x, y in zip(results[1], results[a.batch]))
    rps = {bs: a.requests / statistics.median(t) for bs, t in times.items()}
    spread = {bs: f"{a.requests / max(t):.2f}–{a.requests / min(t):.2f}" for bs, t in times.items()}
    threads = torch.get_num_threads()
    text = f"""cpu, float32, {threads} threads, torch {torch.__version__}. Command: `{command_line()}` (LLaDA-shaped
d_model 256, 4 layers, V 4096; {a.requests} requests, context 48–72 + target 4–8 tokens, {a.mc_samples} mask patterns
each; median of {a.repeats} interleaved runs, range in brackets; {platform.processor() or platform.machine()}).

| rows per forward | requests/s |
|---|---|
| 1 | {rps[1]:.2f} ({spread[1]}) |
| {a.batch} | {rps[a.batch]:.2f} ({spread[a.batch]}) |

Batched / batch 1: **{rps[a.batch] / rps[1]:.2f}×**, same estimates (max |Δ| = {diff:.1e} nats).

{environment_note()}
"""
    print(f"### {TITLE}\n\n{text}")
    if a.write:
        write_section(TITLE, text)
