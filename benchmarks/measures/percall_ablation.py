"""What the two exact changes to the SDE call after the roofline buy: the top-M selection (`top_m_values` instead of
`torch.topk` over the vocabulary) and the converter's reused slot buffer (`numerics.Workspace` instead of a fresh
(L, V+1) tensor per call, whose first write costs a page fault per 4 KiB). Each is switched off in turn
(monkeypatched back to the previous code) on the same model, prompt and noise; tokens must stay identical.

Model: LLaDA-shaped, d_model 256, 4 layers, vocabulary 32,768, noise dim 100, prompt 128 + response 128, batch 1,
SDE NFE 16, fp32. Runs are interleaved (rotating order), medians of --rounds; minor page faults per run from
getrusage.

Usage:  python benchmarks/bench_percall.py ablation [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics

import torch
from benchlib import interleave, llada_shaped, machine_line, random_prompts, run_environment, write_json

from dsl_llada.core import converter as conv_mod
from dsl_llada.core import numerics
from dsl_llada.config import SDEConfig
from dsl_llada.sampling.sde import sample_sde


@contextlib.contextmanager
def plain_topk():
    saved = conv_mod.top_m_values
    conv_mod.top_m_values = lambda x, m: x.topk(m, dim=-1)
    try:
        yield
    finally:
        conv_mod.top_m_values = saved


@contextlib.contextmanager
def fresh_buffers():
    saved = numerics.Workspace.get
    numerics.Workspace.get = lambda self, name, shape, dtype, device: torch.empty(shape, dtype=dtype, device=device)
    try:
        yield
    finally:
        numerics.Workspace.get = saved


VARIANTS = {
    "both (current)": contextlib.nullcontext,
    "torch.topk instead of top_m_values": plain_topk,
    "fresh slot buffer per call": fresh_buffers,
    "neither (before)": lambda: _both(plain_topk(), fresh_buffers()),
}


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results and this run's environment record here")


def run(a: argparse.Namespace) -> None:
    if a.rounds < 1:
        a.parser.error(f"--rounds {a.rounds} must be at least 1")
    model = llada_shaped()
    prompts = random_prompts(model, 1, 128)
    cfg = SDEConfig(nfe=16, gen_length=128)
    names = list(VARIANTS)
    faults: dict[str, list[int]] = {n: [] for n in names}
    ids = {}

    def variant(name: str):
        def call() -> None:
            with VARIANTS[name]():
                r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                ids[name] = sample_sde(model, prompts, cfg, generator=torch.Generator().manual_seed(0)).ids
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
        return call

    times = interleave({n: variant(n) for n in names}, a.rounds)  # one untimed warm-up call of each first
    faults = {n: f[1:] for n, f in faults.items()}  # the timed rounds only
    same = all(torch.equal(ids[n], ids[names[0]]) for n in names)
    if not same:
        raise SystemExit("tokens differ between variants: " + json.dumps({n: ids[n][0, :8].tolist() for n in names}))
    base = statistics.median(times["neither (before)"])
    rows = []
    for n in names:
        m = statistics.median(times[n])
        rows.append({"variant": n, "median_s": m, "min_s": min(times[n]), "max_s": max(times[n]),
                     "faults": int(statistics.median(faults[n])), "speedup_vs_before": base / m,
                     "times_s": times[n], "faults_rounds": faults[n]})
    result = {"machine": machine_line(), "rounds": a.rounds, "nfe": cfg.nfe, "rows": rows, "identical_tokens": same}
    print(json.dumps({**result, "environment": run_environment()}, indent=2))
    write_json(a.json, result)
