"""Approximate KV caching at the LLaDA-shaped benchmark size: seconds per sample of Block SDE and block remasking with
`kv_cache` off / dual / prefix at refresh R in {2, 4, never}, and the share of tokens equal to the exact sampler's.

The toy world (`dsl-llada demo --cache-frontier`) measures quality exactly; this measures what the cache saves when
the forward is a larger share of the work (d_model 256, 4 layers, V 32,768; random weights, so the token agreement
says how far the approximation moves a trajectory, not whether the text is good).

Model: LLaDA-shaped (benchlib.llada_shaped), prompt 128 + response 128 in 4 blocks of 32, batch 1, fp32; Block SDE
NFE 8 per block, block remasking 32 steps. Variants interleaved (rotating order), medians of --rounds.

Usage:  python benchmarks/bench_approx.py kv-cache [--rounds 3] [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from benchlib import command_line, interleave, llada_shaped, machine_line, random_prompts, run_environment, write_section

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling.dispatch import sample

VARIANTS = [("off", 1), ("dual", 2), ("dual", 4), ("dual", 0), ("prefix", 0)]


def label(mode: str, refresh: int) -> str:
    return "exact" if mode == "off" else f"{mode}, R={'never' if refresh == 0 else refresh}"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write", action="store_true")


def run(a: argparse.Namespace) -> None:
    model = llada_shaped()
    prompts = random_prompts(model, 1, 128)
    samplers = {"Block SDE (NFE 8 per block)": SDEConfig(nfe=8, gen_length=128, block_length=32),
                "block remasking (32 steps)": RemaskConfig(steps=32, gen_length=128, block_length=32)}
    plan = [(s, m, r) for s in samplers for m, r in VARIANTS]
    ids = {}

    def variant(s: str, m: str, r: int):
        cfg = samplers[s].replace(kv_cache=m, cache_refresh=r)
        return lambda: ids.__setitem__((s, m, r), sample(model, prompts, cfg,
                                                         generator=torch.Generator().manual_seed(0)).ids)

    times = interleave({p: variant(*p) for p in plan}, a.rounds)  # one untimed warm-up call of each first
    rows = []
    for s, m, r in plan:
        exact = statistics.median(times[(s, "off", 1)])
        med = statistics.median(times[(s, m, r)])
        same = float((ids[(s, m, r)] == ids[(s, "off", 1)]).float().mean()) * 100
        rows.append({"sampler": s, "cache": label(m, r), "median_s": med, "min_s": min(times[(s, m, r)]),
                     "max_s": max(times[(s, m, r)]), "speedup": exact / med, "same_tokens": same})
    print(json.dumps({"rows": rows, "environment": run_environment()}, indent=2))
    if a.write:
        lines = [f"Command: `{command_line()}` ({machine_line()}).", "",
                 "LLaDA-shaped model (d_model 256, 4 layers, V 32,768, random weights), prompt 128 + response 128 in "
                 f"4 blocks of 32, batch 1, fp32; {a.rounds} interleaved rounds.", "",
                 "| sampler | cache | s per sample, median (min–max) | speed-up | tokens equal to exact % |",
                 "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['sampler']} | {r['cache']} | {r['median_s']:.3f} ({r['min_s']:.3f}–{r['max_s']:.3f}) | "
                         f"{r['speedup']:.2f}× | {r['same_tokens']:.1f} |")
        write_section("Approximate KV caching at the LLaDA-shaped size", "\n".join(lines))
