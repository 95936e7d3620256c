"""Approximate KV caching at the LLaDA-shaped benchmark size: seconds per sample of Block SDE and block remasking with
`kv_cache` off / dual / prefix at refresh R in {2, 4, never}, and the share of tokens equal to the exact sampler's.

The toy world (`dsl-llada demo --cache-frontier`) measures quality exactly; this measures what the cache saves when
the forward is a larger share of the work (d_model 256, 4 layers, V 32,768; random weights, so the token agreement
says how far the approximation moves a trajectory, not whether the text is good).

Model: LLaDA-shaped (benchlib.llada_shaped), prompt 128 + response 128 in 4 blocks of 32, batch 1, fp32; Block SDE
NFE 8 per block, block remasking 32 steps. Variants interleaved (rotating order), medians of --rounds. The page's
table is rendered from the --json results (`python scripts/docs_tables.py --write-pages cpu-approx-kv-cache`).

Usage:  python benchmarks/bench_approx.py kv-cache [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
from benchlib import interleave, llada_shaped, random_prompts, run_environment, write_json

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling.dispatch import sample

VARIANTS = [("off", 1), ("dual", 2), ("dual", 4), ("dual", 0), ("prefix", 0)]


def label(mode: str, refresh: int) -> str:
    return "exact" if mode == "off" else f"{mode}, R={'never' if refresh == 0 else refresh}"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds after one untimed call of each variant")
    ap.add_argument("--json", default=None, help="write the rows, every round's times and this run's environment here")


def run(a: argparse.Namespace) -> None:
    if a.rounds < 1:
        print(f"error: --rounds {a.rounds} is not valid; give 1 or more", file=sys.stderr)
        raise SystemExit(2)
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
                     "max_s": max(times[(s, m, r)]), "times_s": times[(s, m, r)], "speedup": exact / med,
                     "same_tokens": same})
    print(json.dumps({"rows": rows, "environment": run_environment()}, indent=2))
    write_json(a.json, {"rounds": a.rounds, "prompt": 128, "response": 128, "block": 32, "batch": 1, "rows": rows})
