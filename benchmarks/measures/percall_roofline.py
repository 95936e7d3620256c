"""Roofline of one SDE denoiser call and one remasking step: FLOPs, time and fraction of the measured fp32 matmul
peak of each component, and the whole call against the FLOP time of the work it needs.

Model: the LLaDA-shaped benchmark model (`benchlib.llada_shaped`: d_model 256, 4 layers, vocabulary 32,768, noise
dim 100), prompt 128 + response 128, batch 1, fp32, inside the samplers' denormal mode. Component times are medians
of --reps calls at the SNRs of the NFE-16 schedule (the converter's cost depends on how peaked its softmax is).

Also reports the sparse converter (SDEConfig.converter_tolerance): kept slots per position, max |Δh| against the
dense converter and its time at each SNR, and whether an NFE-16 SDE run gives the same tokens with it.

Usage:  python benchmarks/bench_percall.py roofline [--reps 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from benchlib import (blocks_and_head_times, llada_shaped, machine_line, matmul_peak_fp32, median_time, run_environment,
                      sde_call_inputs, sde_call_work, write_json)

from dsl_llada.config import RemaskConfig
from dsl_llada.core.converter import top_m_values
from dsl_llada.core.numerics import flush_denormals
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.sampling.sde import sample_sde


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tolerance", type=float, default=1e-6, help="sparse converter tolerance to report")
    ap.add_argument("--json", default=None, help="write the results and this run's environment record here")


@torch.no_grad()
def run(a: argparse.Namespace) -> None:
    if a.reps < 1:
        a.parser.error(f"--reps {a.reps} must be at least 1")
    torch.manual_seed(0)
    model = llada_shaped()
    bb, conv, cfg = model.backbone, model.converter, model.backbone.cfg
    P = L = 128
    T, V, H, d, M = P + L, model.vocab_size, cfg.d_model, model.noise_dim, 512
    pb, E, sde_cfg, beta, grid, ids = sde_call_inputs(model, P, L)
    state_mask = torch.zeros(1, T, dtype=torch.bool)
    state_mask[:, P:] = True
    W, c = conv.backbone_embedding.weight, conv.backbone_embedding.bias
    head_w = bb.model.transformer.ff_out.weight
    b_t = torch.tensor(beta)
    resp = slice(P, None)

    with flush_denormals():
        peak = matmul_peak_fp32(a.reps)
        times: dict[str, list[float]] = {k: [] for k in ("slot", "softmax", "values", "converter", "sparse_values",
                                                          "posterior_topk", "posterior_topm", "posterior_bag", "posterior",
                                                          "call")}
        sparse_rows = []
        for gamma in grid:
            z = gamma * E[ids[0, P:]] + gamma ** 0.5 * torch.randn(L, d, generator=torch.Generator().manual_seed(4))
            slot = conv.slot_logits(z, E, b_t)
            pi = torch.softmax(slot, -1)
            times["slot"].append(median_time(lambda: conv.slot_logits(z, E, b_t), a.reps))
            times["softmax"].append(median_time(lambda: torch.softmax(slot, -1), a.reps))
            times["values"].append(median_time(lambda: F.linear(pi, W, c), a.reps))
            times["converter"].append(median_time(lambda: conv(z, E, beta), a.reps))
            times["sparse_values"].append(median_time(lambda: conv._sparse_values(pi, a.tolerance), a.reps))
            dense, sparse = conv(z, E, beta), conv(z, E, beta, tolerance=a.tolerance)
            kept = (pi >= a.tolerance / pi.shape[-1]).sum(-1).float()
            sparse_rows.append({"gamma": gamma, "kept_mean": float(kept.mean()), "kept_max": int(kept.max()),
                                "max_abs_dh": float((dense - sparse).abs().max()),
                                "max_abs_h": float(dense.abs().max()), "t_dense_ms": 1e3 * times["values"][-1],
                                "t_sparse_ms": 1e3 * times["sparse_values"][-1]})
            logits = model.logits_from_states(ids, z, state_mask, beta=beta, E=E, positions=resp)
            flat = logits[0]
            vals, idx = flat.topk(M, -1)
            p = torch.softmax(vals, -1)
            times["posterior_topk"].append(median_time(lambda: flat.topk(M, -1), a.reps))
            times["posterior_topm"].append(median_time(lambda: top_m_values(flat, M), a.reps))
            times["posterior_bag"].append(median_time(
                lambda: F.embedding_bag(idx, E, mode="sum", per_sample_weights=p), a.reps))
            times["posterior"].append(median_time(lambda: model.posterior_mean(logits, M, E), a.reps))
            times["call"].append(median_time(lambda: model.posterior_mean(model.logits_from_states(
                ids, z, state_mask, beta=beta, E=E, positions=resp), M, E), a.reps))
        t_blocks, t_head, _ = blocks_and_head_times(model, ids, z, beta, E, P, a.reps)
        ln_f = bb.model.transformer.ln_f
        t_head_all = median_time(lambda: F.linear(ln_f(torch.randn(1, T, H)), head_w), a.reps)
        rm_steps = 16
        t_rm = median_time(lambda: sample_remask(model, pb, RemaskConfig(steps=rm_steps, gen_length=L)), 3) / rm_steps
        t_rm_forward = median_time(lambda: model.logits_from_ids(ids, positions=resp), a.reps)

    med = {k: statistics.median(v) for k, v in times.items()}
    fl = sde_call_work(model, P, L, M)
    fl = {**fl, "head_all": 2 * T * H * V, "posterior_bag": fl.pop("posterior")}
    needed_sde = fl["slot"] + fl["values"] + fl["blocks"] + fl["head"] + fl["posterior_bag"]
    needed_rm = fl["blocks"] + fl["head"]
    sde_out = {}
    for tol in (0.0, a.tolerance):
        sde_out[tol] = sample_sde(model, pb, sde_cfg.replace(converter_tolerance=tol),
                                  generator=torch.Generator().manual_seed(0)).ids
    r = {"machine": machine_line(), "peak_gflops": peak, "flops": fl, "times_s": med,
         "t_blocks": t_blocks, "t_head": t_head, "t_head_all": t_head_all, "t_remask_step": t_rm,
         "t_remask_forward": t_rm_forward, "needed_sde_flops": needed_sde, "needed_rm_flops": needed_rm,
         "sde_call_vs_flop_time": med["call"] / (needed_sde / peak / 1e9),
         "remask_step_vs_flop_time": t_rm / (needed_rm / peak / 1e9),
         "sparse": sparse_rows, "tolerance": a.tolerance,
         "sparse_same_tokens": bool(torch.equal(sde_out[0.0], sde_out[a.tolerance])),
         "sparse_tokens_changed": int((sde_out[0.0] != sde_out[a.tolerance]).sum())}
    print(json.dumps({**r, "environment": run_environment()}, indent=2))
    write_json(a.json, {**r, "reps": a.reps})

