"""Roofline of one SDE denoiser call and one remasking step: FLOPs, time and fraction of the measured fp32 matmul
peak of each component, and the whole call against the FLOP time of the work it needs.

Model: the LLaDA-shaped benchmark model (`benchlib.llada_shaped`: d_model 256, 4 layers, vocabulary 32,768, noise
dim 100), prompt 128 + response 128, batch 1, fp32, inside the samplers' denormal mode. Component times are medians
of --reps calls at the SNRs of the NFE-16 schedule (the converter's cost depends on how peaked its softmax is).

Also reports the sparse converter (SDEConfig.converter_tolerance): kept slots per position, max |Δh| against the
dense converter and its time at each SNR, and whether an NFE-16 SDE run gives the same tokens with it.

Usage:  python benchmarks/bench_percall.py roofline [--reps 7] [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from benchlib import (blocks_and_head_times, command_line, llada_shaped, machine_line, matmul_peak_fp32, median_time,
                      run_environment, sde_call_inputs, sde_call_work, write_section)

from dsl_llada.config import RemaskConfig
from dsl_llada.core.converter import top_m_values
from dsl_llada.core.numerics import flush_denormals
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.sampling.sde import sample_sde


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tolerance", type=float, default=1e-6, help="sparse converter tolerance to report")
    ap.add_argument("--write", action="store_true")


@torch.no_grad()
def run(a: argparse.Namespace) -> None:
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
    if a.write:
        write_markdown(r, command_line())


def write_markdown(r: dict, command: str) -> None:
    peak, fl, t = r["peak_gflops"], r["flops"], r["times_s"]

    def row(name: str, flops: float | None, secs: float, note: str = "") -> str:
        if flops is None:
            return f"| {name} | – | {1e3 * secs:.2f} | – | – | {note} |"
        gfs = flops / secs / 1e9
        return f"| {name} | {flops / 1e9:.3f} | {1e3 * secs:.2f} | {gfs:.1f} | {100 * gfs / peak:.0f} % | {note} |"

    head = "| component | GFLOP | ms | GFLOP/s | of peak | note |\n|---|---|---|---|---|---|"
    sde = [head,
           row("converter: slot logits βzKᵀ+b", fl["slot"], t["slot"], "one addmm, cached K"),
           row("converter: softmax over V+1", None, t["softmax"], "elementwise"),
           row("converter: πWᵀ+c (dense)", fl["values"], t["values"]),
           row("converter, whole", fl["slot"] + fl["values"], t["converter"]),
           row("backbone blocks (256 positions)", fl["blocks"], r["t_blocks"]),
           row("output head + final norm (128 response rows)", fl["head"], r["t_head"]),
           row("(head over all 256 rows, as the authors)", fl["head_all"], r["t_head_all"], "not run by the samplers"),
           row("posterior mean: top-512 (torch.topk, before)", None, t["posterior_topk"], "selection, no FLOPs"),
           row("posterior mean: top-512 (top_m_values)", None, t["posterior_topm"], "same tokens, sampled threshold"),
           row("posterior mean: embedding_bag", fl["posterior_bag"], t["posterior_bag"]),
           row("posterior mean, whole", fl["posterior_bag"], t["posterior"]),
           row("**whole SDE call**", r["needed_sde_flops"], t["call"],
               f"{r['sde_call_vs_flop_time']:.2f}× the FLOP time of the needed work")]
    rm = [head,
          row("forward: blocks + head on the current block", r["needed_rm_flops"], r["t_remask_forward"]),
          row("**whole remasking step** (16-step run / 16)", r["needed_rm_flops"], r["t_remask_step"],
              f"{r['remask_step_vs_flop_time']:.2f}× the FLOP time of the needed work")]
    sp = ["| SNR γ | kept slots, mean (max) of 32,769 | max abs Δh (max abs h) | dense πWᵀ ms | sparse ms |",
          "|---|---|---|---|---|"]
    for s in r["sparse"]:
        sp.append(f"| {s['gamma']:.2f} | {s['kept_mean']:.1f} ({s['kept_max']}) | {s['max_abs_dh']:.2e} "
                  f"({s['max_abs_h']:.2f}) | {s['t_dense_ms']:.2f} | {s['t_sparse_ms']:.2f} |")
    body = "\n".join([
        f"Command: `{command}` ({r['machine']}). Measured fp32 matmul peak (best `torch.mm`, n ≤ 2048): "
        f"**{peak:.1f} GFLOP/s**.", "",
        "One SDE denoiser call (prompt 128 + response 128, batch 1, LLaDA-shaped d_model 256 / 4 layers / V 32,768 / "
        "d 100); times are medians over the NFE-16 schedule's SNRs. \"Needed work\" = slot logits + dense πWᵀ + "
        "blocks + head on the response + the top-M weighted sum; the goal is a whole call within 1.5× of its FLOP "
        "time at the measured peak.", "", *sde, "", "One LLaDA remasking step (16 steps, one 128-token block):", "",
        *rm, "",
        f"Sparse converter at tolerance {r['tolerance']:g} (`SDEConfig.converter_tolerance`; off by default) at the "
        "same states:", "", *sp, "",
        f"NFE-16 SDE run on this model with vs without the sparse converter: "
        f"{'identical tokens' if r['sparse_same_tokens'] else str(r['sparse_tokens_changed']) + ' of 128 tokens differ'}."])
    write_section("Roofline: one SDE call and one remasking step", body)
