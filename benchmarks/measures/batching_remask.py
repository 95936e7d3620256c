"""Remasking at batch 8 vs batch 1 per sample, before/after the reused logits buffer and the one-sweep reductions.

On CPU, batch 8 used to cost more per sample than batch 1 for remasking. Profiled causes, all from the
(8, W, V) fp32 block logits (67 MB at W 64, V 32k) being allocated fresh every step, above the allocator's mmap
threshold, so every step maps new pages and page-faults: the step's whole-tensor logsumexp (fixed first, by
`remask_step.row_logsumexp` over row chunks), then `positions.block_logits`' fresh zeros + scatter + bf16 -> fp32
copy, and two whole-tensor passes (argmax, logsumexp) over logits far larger than the cache. Now the block logits
go into one `positions.LogitsBuffer` reused across steps (copy-on-keep for callbacks), written column run by
column run, and the greedy step's argmax and logsumexp run in one sweep over cache-sized row chunks
(`remask_step.row_argmax_logsumexp`). It times the previous path ("before": a fresh tensor per step,
two whole-tensor reductions, put back by patching the modules) against the current one ("after"), interleaved
per round, on the small LLaDA-shaped model of `bench_dtype.py speed` at 2 layers (prompt 64 + response 64, 16 steps,
fp32 and bf16), wall and process CPU time per sample, and checks the tokens are identical.

Usage:  python benchmarks/bench_batching.py remask --rounds 3 --json OUT.json [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import time

import torch
from benchlib import random_prompts, run_environment, write_text

from dsl_llada.config import RemaskConfig
from dsl_llada.sampling.remask import sample_remask

P, R = 64, 64


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3, choices=range(1, 11), metavar="1-10")
    ap.add_argument("--json", default=None, help="write the results and the environment record here")
    # --threads: default the usable CPUs (the run in docs used --threads 1)


def run(a: argparse.Namespace) -> None:
    from measures.dtype_speed import build

    rs = importlib.import_module("dsl_llada.sampling.remask_step")
    rm = importlib.import_module("dsl_llada.sampling.remask")
    new_fns = (rm.block_logits, rs.row_argmax_logsumexp)

    def fresh_block_logits(*args, **kw):  # the previous path: a fresh (B, W, V) tensor every step
        return new_fns[0](*args, **{**kw, "buffer": None})

    def two_passes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # argmax, then the chunked logsumexp
        return x.argmax(dim=-1), rs.row_logsumexp(x)

    old_fns = (fresh_block_logits, two_passes)

    models = {n: build("small", dt, 2)[0] for n, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    res: dict[str, list] = {}
    ids: dict[str, list] = {}

    def timed(model, batch: int, n: int, key: str) -> tuple[float, float]:
        pb = random_prompts(model, batch, P)
        w, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            out = sample_remask(model.backbone, pb, RemaskConfig(steps=16, gen_length=R),
                                generator=[torch.Generator().manual_seed(i) for i in range(batch)])
        ids.setdefault(key, []).append(out.ids.tolist())
        return (time.perf_counter() - w) / (n * batch), (time.process_time() - c) / (n * batch)

    with torch.no_grad():
        timed(models["fp32"], 1, 1, "warm")
        for rnd in range(a.rounds):
            for name, m in models.items():
                for batch, n in ((1, 2), (8, 1)):
                    for variant, fns in (("before", old_fns), ("after", new_fns)):
                        rm.block_logits, rs.row_argmax_logsumexp = fns
                        key = f"{name} b{batch} {variant}"
                        res.setdefault(key, []).append(timed(m, batch, n, key))
            rm.block_logits, rs.row_argmax_logsumexp = new_fns
            print("round", rnd, os.getloadavg(), flush=True)
    out = {}
    for k, v in res.items():
        out[k] = {"wall": statistics.median(x for x, _ in v), "cpu": statistics.median(y for _, y in v), "all": v}
        print(k, "wall %.3f cpu %.3f" % (out[k]["wall"], out[k]["cpu"]), [f"{x:.3f}/{y:.3f}" for x, y in v], flush=True)
    for name in models:
        for variant in ("before", "after"):
            b1, b8 = out[f"{name} b1 {variant}"], out[f"{name} b8 {variant}"]
            print(f"{name} {variant}: b8/b1 per sample wall {b8['wall'] / b1['wall']:.2f} cpu {b8['cpu'] / b1['cpu']:.2f}")
        for b in (1, 8):
            print(name, b, "identical tokens before/after:", ids[f"{name} b{b} before"] == ids[f"{name} b{b} after"])
    if a.json:
        write_text(a.json, json.dumps({"results": out, "env": run_environment()}, default=str) + "\n")
