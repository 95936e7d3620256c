"""Batched SDE throughput (samples/s at batch 1, 8, 32) on the LLaDA-shaped benchmark model; GPU-ready.

On a GPU run it as `--device cuda --dtype bfloat16` (bf16 backbone and converter values, fp32 converter softmax)
and optionally `--compile` (SDEConfig.compile: torch.compile of the denoiser's backbone; the first batch then
includes compilation, so a warm-up batch is run first). On a 2-core CPU samples/s is flat in the batch size.

Usage:  python benchmarks/bench_batching.py sde [--batches 1 8 32] [--device cpu] [--dtype float32] [--compile] [--write]
"""

from __future__ import annotations

import argparse
import json

import torch
from benchlib import clock, command_line, llada_shaped, machine_line, random_prompts, write_section

from dsl_llada.config import SDEConfig
from dsl_llada.sampling.sde import sample_sde


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--nfe", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--tolerance", type=float, default=0.0, help="sparse converter tolerance (0 = exact)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--write", action="store_true")


def run(a: argparse.Namespace) -> None:
    dtype = torch.float32 if a.dtype == "float32" else torch.bfloat16
    model = llada_shaped(device=a.device)
    model.backbone.to(dtype)
    model.converter.backbone_embedding.to(dtype)
    cfg = SDEConfig(nfe=a.nfe, gen_length=a.gen, compile=a.compile, converter_tolerance=a.tolerance)
    res = {"machine": machine_line(), "device": a.device, "dtype": a.dtype, "compile": a.compile, "nfe": a.nfe,
           "tolerance": a.tolerance, "batches": {}}
    sample_sde(model, random_prompts(model, 1, a.prompt, device=a.device), cfg.replace(nfe=2),
               generator=torch.Generator().manual_seed(0))  # warm-up (and compilation)
    for b in a.batches:
        pb = random_prompts(model, b, a.prompt, device=a.device)
        gens = [torch.Generator().manual_seed(i) for i in range(b)]
        t = clock(lambda: sample_sde(model, pb, cfg, generator=gens), a.device)
        res["batches"][b] = {"seconds": t, "samples_per_s": b / t}
        print(json.dumps({b: res["batches"][b]}), flush=True)
    if a.write:
        rows = ["| batch | seconds per batch | samples/s |", "|---|---|---|"]
        rows += [f"| {b} | {e['seconds']:.2f} | {e['samples_per_s']:.3f} |" for b, e in res["batches"].items()]
        cmd = command_line()
        write_section(f"Batched SDE throughput ({a.device}, {a.dtype}{', compiled' if a.compile else ''})", "\n".join([
            f"Command: `{cmd}` ({res['machine']}). LLaDA-shaped model (d_model 256, 4 layers, V 32,768), prompt "
            f"{a.prompt} + response {a.gen}, NFE {a.nfe}, one generator per row.", "", *rows]))
