"""What the two exact changes to the SDE call after the roofline buy: the top-M selection (`top_m_values` instead of
`torch.topk` over the vocabulary) and the converter's reused slot buffer (`numerics.Workspace` instead of a fresh
(L, V+1) tensor per call, whose first write costs a page fault per 4 KiB). Each is switched off in turn
(monkeypatched back to the previous code) on the same model, prompt and noise; tokens must stay identical.

Model: LLaDA-shaped, d_model 256, 4 layers, vocabulary 32,768, noise dim 100, prompt 128 + response 128, batch 1,
SDE NFE 16, fp32. Runs are interleaved (rotating order), medians of --rounds; minor page faults per run from
getrusage.

Usage:  python benchmarks/bench_sde_ablation.py [--rounds 5] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import llada_shaped, machine_line, random_prompts, write_section, parse_args, run_environment

from dsl_llada import converter as conv_mod
from dsl_llada import numerics
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    a = parse_args(ap)
    model = llada_shaped()
    prompts = random_prompts(model, 1, 128)
    cfg = SDEConfig(nfe=16, gen_length=128)

    def run(name: str):
        with VARIANTS[name]():
            r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = time.perf_counter()
            out = sample_sde(model, prompts, cfg, generator=torch.Generator().manual_seed(0))
            t = time.perf_counter() - t
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
        return t, faults, out.ids

    names = list(VARIANTS)
    for n in names:
        run(n)  # warm-up
    times = {n: [] for n in names}
    faults = {n: [] for n in names}
    ids = {}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t, f, i = run(n)
            times[n].append(t)
            faults[n].append(f)
            ids[n] = i
    same = all(torch.equal(ids[n], ids[names[0]]) for n in names)
    if not same:
        raise SystemExit("tokens differ between variants: " + json.dumps({n: ids[n][0, :8].tolist() for n in names}))
    base = statistics.median(times["neither (before)"])
    rows = []
    for n in names:
        m = statistics.median(times[n])
        rows.append({"variant": n, "median_s": m, "min_s": min(times[n]), "max_s": max(times[n]),
                     "faults": int(statistics.median(faults[n])), "speedup_vs_before": base / m})
    print(json.dumps({"machine": machine_line(), "rows": rows, "identical_tokens": same,
                      "environment": run_environment()}, indent=2))
    if a.write:
        lines = ["Command: `python " + " ".join(["benchmarks/bench_sde_ablation.py"] + sys.argv[1:]).replace(" --write", "")
                 + " --write`", "",
                 f"{machine_line()}. SDE NFE 16, LLaDA-shaped model (d_model 256, 4 layers, V 32,768), prompt 128 + response 128, batch 1; "
                 f"{a.rounds} interleaved rounds; identical tokens in every variant.", "",
                 "| variant | median s (min–max) | minor page faults per run | speed-up vs before |", "|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['variant']} | {r['median_s']:.3f} ({r['min_s']:.3f}–{r['max_s']:.3f}) | "
                         f"{r['faults']:,} | {r['speedup_vs_before']:.2f}× |")
        write_section("SDE call: what the exact top-M selection and the reused slot buffer buy", "\n".join(lines))


if __name__ == "__main__":
    main()
