"""fp32 vs bf16 per denoiser call and per sample, split into backbone blocks, output head, converter and top-M
posterior mean, against the FLOP time of the same work at this machine's measured matmul peak.

Shapes:
  small  LLaDA-shaped d 256, 4 layers, 4 heads, V 32,768, prompt 128 + response 128 (the per-sample benchmarks' model);
         also whole samples (SDE NFE 16 and remasking 16 steps) at batch 1 and 8 with the identical-token fraction.
  real   LLaDA-8B's width and vocabulary (d 4096, 32 heads, MLP 12,288, V 126,464) at `--layers` (1-2) layers;
         per-call split and peak memory only (whole samples would take minutes per sample on 2 cores).

small: both models in one process, every measurement alternating between the dtypes, `--rounds` rounds; real: a
fresh process per (round, dtype) (one model in memory at a time: 3-7 GB), dtypes alternating. Medians over rounds
with the spread, and each run's environment record (with the load average).

Usage:  python benchmarks/bench_dtype.py speed --shape small [--rounds 3] [--threads 1] [--json F] [--write]
        python benchmarks/bench_dtype.py speed --shape real --layers 1 [--batches 1 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchlib import (call_flops, med_spread, median_time, peak_rss_mib, random_prompts, reset_peak_rss, write_section,
                      write_text)

ENTRY = Path(__file__).resolve().parents[1] / "bench_dtype.py"

SHAPES = {
    "small": dict(d_model=256, n_heads=4, n_layers=4, mlp_hidden_size=None, vocab=32768),
    "real": dict(d_model=4096, n_heads=32, n_layers=1, mlp_hidden_size=12288, vocab=126464),
}
PROMPT, RESPONSE, NOISE_DIM, TOP_M = 128, 128, 100, 512
PARTS = ("blocks", "head", "converter", "top_m_posterior", "call")


def build(shape: str, dtype: torch.dtype, layers: int | None):
    """A random LLaDA-architecture DSL model built directly in `dtype` (never an fp32 copy of a bf16 model's
    backbone: the parameters are allocated on the meta device, then materialised in `dtype`). Same seed, same
    values: the bf16 model's weights are the fp32 model's rounded to bf16."""
    from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
    from dsl_llada.config import ConverterConfig, DSLConfig
    from dsl_llada.core.model import DSLModel

    s = dict(SHAPES[shape])
    if layers:
        s["n_layers"] = layers
    cfg = tiny_llada_config(s["vocab"], d_model=s["d_model"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                            mlp_hidden_size=s["mlp_hidden_size"], max_sequence_length=4096)
    with torch.device("meta"):
        bb = LLaDABackbone(cfg)
    bb = bb.to(dtype).to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in bb.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                p.fill_(1.0)
            else:
                std = 0.5 if "ff_out" in name and p.shape[0] == s["vocab"] else 0.02
                for row in range(0, p.shape[0], 4096):  # drawn in fp32 slices (no full-size fp32 temporary), then
                    part = p[row: row + 4096]  # rounded into `dtype`: the bf16 model is the fp32 model rounded
                    part.copy_(torch.empty(part.shape).normal_(0.0, std, generator=g))
    bb.eval()
    model = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=NOISE_DIM), context_embedding="wte"))
    return model.eval(), s


def matmul_peak(dtype: torch.dtype, reps: int = 5) -> float:
    """GFLOP/s of a 256 x 4096 x 4096 matmul in `dtype` (median of `reps`)."""
    a = torch.randn(256, 4096).to(dtype)
    b = torch.randn(4096, 4096).to(dtype)
    return 2 * 256 * 4096 * 4096 / median_time(lambda: a @ b, reps) / 1e9


def flops(s: dict, batch: int) -> dict[str, float]:
    """FLOPs of one SDE denoiser call's needed work (`benchlib.call_flops`): blocks over prompt + response, the head
    on the response rows, the converter's slot logits (fp32 always) and value product, on `batch` sequences."""
    d = s["d_model"]
    f = s["mlp_hidden_size"] or int(-(-8 * d // 3 // 8) * 8)
    return call_flops(d_model=d, n_layers=s["n_layers"], mlp_hidden=f, vocab=s["vocab"], prompt=PROMPT,
                      response=RESPONSE, noise_dim=NOISE_DIM, batch=batch)


def _parts(model, s, dtype, batch, reps, peak, cfg, parts=PARTS) -> dict:
    """One denoiser call at gamma 5 split into its parts (median of `reps` each), with their FLOP times."""
    from dsl_llada.core.numerics import flush_denormals
    from dsl_llada.sampling.denoiser import Denoiser
    from dsl_llada.sampling.sde import inference_beta

    pb = random_prompts(model, batch, PROMPT)
    den = Denoiser.for_model(model, model.context_embed(pb.ids), beta=inference_beta(model, cfg), top_m=TOP_M)
    y = torch.nn.functional.normalize(torch.randn(batch, RESPONSE, NOISE_DIM,
                                                  generator=torch.Generator().manual_seed(0)), dim=-1)
    t = model.backbone.model.transformer
    cos, sin = model.backbone._rope(PROMPT + RESPONSE, torch.device("cpu"))
    gamma = 5.0
    with flush_denormals():  # as inside the samplers
        h = model.converter(gamma * y, den.noise_table, den.beta, workspace=den.workspace).to(dtype)
        x0 = torch.cat([den.context, h], 1)

        def blocks(x=x0):
            for blk in t.blocks:
                x = blk(x, cos, sin, None)
            return x

        xl = t.ln_f(blocks()[:, PROMPT:])
        logits = torch.nn.functional.linear(xl, t.ff_out.weight)
        fns = {"converter": lambda: model.converter(gamma * y, den.noise_table, den.beta, workspace=den.workspace),
               "blocks": blocks, "head": lambda: torch.nn.functional.linear(xl, t.ff_out.weight),
               "top_m_posterior": lambda: model.posterior_mean(logits, TOP_M, den.noise_table),
               "call": lambda: den(y, gamma)}
        sec = {k: median_time(f, reps) for k, f in fns.items() if k in parts}
    fl = flops(s, batch)
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    flop_time = {"blocks": fl["blocks"] / (peak[name] * 1e9), "head": fl["head"] / (peak[name] * 1e9),
                 "converter": fl["converter_slots"] / (peak["float32"] * 1e9)
                 + fl["converter_values"] / (peak[name] * 1e9)}
    flop_time["call"] = sum(flop_time.values())
    return {"seconds": sec, "flop_time_s": flop_time}


@torch.no_grad()
def _samples(model, batch: int) -> dict:
    from dsl_llada.config import RemaskConfig, SDEConfig
    from dsl_llada.sampling.remask import sample_remask
    from dsl_llada.sampling.sde import sample_sde

    pb = random_prompts(model, batch, PROMPT)
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(batch)]  # noqa: E731
    t0 = time.perf_counter()
    sde = sample_sde(model, pb, SDEConfig(nfe=16, gen_length=RESPONSE), generator=gens())
    t_sde = time.perf_counter() - t0
    t0 = time.perf_counter()
    rm = sample_remask(model.backbone, pb, RemaskConfig(steps=16, gen_length=RESPONSE), generator=gens())
    t_rm = time.perf_counter() - t0
    return {"sde_s_per_sample": t_sde / batch, "remask_s_per_sample": t_rm / batch, "sde_ids": sde.ids.tolist(),
            "remask_ids": rm.ids.tolist()}


@torch.no_grad()
def child(a) -> dict:
    """Build one model per dtype of `a.child_dtypes` in this process and measure them alternating, `a.rounds`
    rounds (each measurement of one dtype is followed by the same measurement of the next)."""
    from dsl_llada.config import SDEConfig
    from dsl_llada.runtime.environment import environment_record, finish_record

    torch.set_num_threads(a.threads)
    dtypes = {n: {"float32": torch.float32, "bfloat16": torch.bfloat16}[n] for n in a.child_dtypes}
    env = environment_record(device="cpu", dtype=" vs ".join(dtypes), seeds=[0])
    models, built = {}, {}
    for n, dt in dtypes.items():
        t0 = time.perf_counter()
        models[n], s = build(a.shape, dt, a.layers)
        built[n] = {"build_s": time.perf_counter() - t0,
                    "rss_after_build_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    cfg = SDEConfig(nfe=16, gen_length=RESPONSE)
    runs = []
    for r in range(a.rounds):
        peak = {"float32": matmul_peak(torch.float32), "bfloat16": matmul_peak(torch.bfloat16)}
        per = {n: {"dtype": n, "round": r, "shape": s, **built[n], "peak_gflops": peak, "parts": {}, "samples": {}}
               for n in dtypes}
        for batch in a.batches:
            for n, dt in dtypes.items():
                reset = reset_peak_rss()
                per[n]["parts"][str(batch)] = _parts(models[n], s, dt, batch, a.reps, peak, cfg, a.parts)
                if reset:  # the peak of this batch's calls alone (the model included), not of the build
                    per[n]["parts"][str(batch)]["peak_rss_mib"] = peak_rss_mib()
            if a.samples:
                for n in dtypes:
                    per[n]["samples"][str(batch)] = _samples(models[n], batch)
        for n in dtypes:
            per[n]["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            per[n]["env"] = finish_record(env)
            runs.append(per[n])
        print(f"round {r}: " + ", ".join(f"{n} b{a.batches[0]} {per[n]['parts'][str(a.batches[0])]['seconds']}" for n in dtypes)
              + f", load {per[n]['env']['load_average_end']}", file=sys.stderr)
    return {"runs": runs}


def parent(a) -> dict:
    """small: one process, both dtypes alternating inside it; real: a fresh process per (round, dtype) (one model
    in memory at a time), dtypes alternating."""
    def spawn(dtypes: list[str], rounds: int) -> list[dict]:
        cmd = [sys.executable, str(ENTRY), "speed", "--child", "--shape", a.shape, "--child-dtypes", *dtypes, "--threads",
               str(a.threads), "--reps", str(a.reps), "--rounds", str(rounds), "--batches", *map(str, a.batches)]
        cmd += (["--layers", str(a.layers)] if a.layers else []) + (["--samples"] if a.samples else [])
        cmd += ["--parts", *a.parts]
        res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"child {dtypes} failed (exit {res.returncode})")
        return json.loads(res.stdout.strip().splitlines()[-1])["runs"]

    runs: list[dict] = []
    if a.shape == "small":
        runs = spawn(a.dtypes, a.rounds)
    else:
        for r in range(a.rounds):
            for dt in a.dtypes:
                for run in spawn([dt], 1):
                    run["round"] = r
                    runs.append(run)
    return {"shape": a.shape, "layers": a.layers, "threads": a.threads, "batches": a.batches, "runs": runs}


def render(result: dict) -> str:
    runs = result["runs"]
    dts = sorted({r["dtype"] for r in runs}, reverse=True)  # float32 first
    by = {dt: [r for r in runs if r["dtype"] == dt] for dt in dts}
    env = runs[0]["env"]
    s = runs[0]["shape"]
    loads = [r["env"]["load_average_start"] for r in runs] + [r["env"]["load_average_end"] for r in runs]
    lines = [f"Command: `python benchmarks/bench_dtype.py speed --shape {result['shape']}"
             + (f" --layers {result['layers']}" if result["layers"] else "")
             + f" --threads {result['threads']} --rounds {len(by[dts[0]])} --batches {' '.join(map(str, result['batches']))}`"
             f"; d {s['d_model']}, {s['n_layers']} layer(s), {s['n_heads']} heads, V {s['vocab']}, prompt {PROMPT} + "
             f"response {RESPONSE}, SDE denoiser at gamma 5, top-M {TOP_M}. {env['cpu_model']} ({env['cpu_capability']}, "
             f"native bf16 {env['cpu_native_bf16']}), {result['threads']} thread(s), torch {env['libraries']['torch']}; "
             f"**shared machine**, 1-minute load {min(loads)}-{max(loads)} during the run. "
             + ("Both dtypes in one process, each measurement alternating between them"
                if result["shape"] == "small" else "Each (dtype, round) a fresh process, dtypes alternating")
             + f"; medians over {len(by[dts[0]])} rounds [min, max].", ""]
    peaks = {dt: med_spread([r["peak_gflops"][dt] for r in by[dt]]) for dt in dts}
    lines.append("Matmul peak (256 x 4096 x 4096): " + ", ".join(f"{dt} {p[0]:.0f} GFLOP/s [{p[1]:.0f}, {p[2]:.0f}]"
                                                                   for dt, p in peaks.items()) + ".")
    lines.append("")
    for b in result["batches"]:
        lines += [f"Batch {b}, one denoiser call (ms; FLOP time at the measured peak in brackets; ratio = measured / "
                  f"FLOP time):", "", "| part | " + " | ".join(f"{dt} ms | {dt} / FLOP time" for dt in dts)
                  + (" | fp32 / bf16 |" if len(dts) == 2 else " |"),
                  "|---|" + "---|---|" * len(dts) + ("---|" if len(dts) == 2 else "")]
        for part in PARTS:
            if part not in runs[0]["parts"][str(b)]["seconds"]:
                continue
            cells, meds = [], []
            for dt in dts:
                m = med_spread([r["parts"][str(b)]["seconds"][part] for r in by[dt]])
                meds.append(m[0])
                ft = statistics.median([r["parts"][str(b)]["flop_time_s"].get(part, 0.0) for r in by[dt]])
                ratio = f"{m[0] / ft:.2f} ({1000 * ft:.1f} ms)" if ft else "no FLOPs"
                cells.append(f"{1000 * m[0]:.1f} [{1000 * m[1]:.1f}, {1000 * m[2]:.1f}] | {ratio}")
            lines.append(f"| {part} | " + " | ".join(cells) + (f" | {meds[0] / meds[1]:.2f}x |" if len(dts) == 2 else " |"))
        lines.append("")
    for b in result["batches"]:
        if "peak_rss_mib" in runs[0]["parts"][str(b)]:
            lines.append(f"Peak RSS while the batch-{b} calls ran (model included; build transients excluded): " + ", ".join(
                f"{dt} {med_spread([r['parts'][str(b)]['peak_rss_mib'] for r in by[dt]])[0]:.0f} MiB" for dt in dts) + ".")
    lines.append(("Peak RSS of the process holding both models (MiB): " if result["shape"] == "small" else
                  "Peak RSS (MiB): ") + ", ".join(f"{dt} {med_spread([r['peak_rss_mib'] for r in by[dt]])[0]:.0f} (model "
                                                f"built: {med_spread([r['rss_after_build_mib'] for r in by[dt]])[0]:.0f})"
                                                for dt in dts) + ".")
    if runs[0].get("samples") and len(dts) == 2:
        lines += ["", "Whole samples (s per sample; SDE NFE 16 = 33 forwards, remasking 16 steps):", "",
                  "| sampler | batch | fp32 | bf16 | fp32 / bf16 | identical tokens bf16 vs fp32 |", "|---|---|---|---|---|---|"]
        for b in result["batches"]:
            for name in ("sde", "remask"):
                t = {dt: med_spread([r["samples"][str(b)][f"{name}_s_per_sample"] for r in by[dt]]) for dt in dts}
                ids32, ids16 = by["float32"][0]["samples"][str(b)][f"{name}_ids"], by["bfloat16"][0]["samples"][str(b)][f"{name}_ids"]
                same = sum(x == y for u, v in zip(ids32, ids16) for x, y in zip(u, v)) / sum(len(u) for u in ids32)
                lines.append(f"| {name} | {b} | {t['float32'][0]:.2f} [{t['float32'][1]:.2f}, {t['float32'][2]:.2f}] | "
                             f"{t['bfloat16'][0]:.2f} [{t['bfloat16'][1]:.2f}, {t['bfloat16'][2]:.2f}] | "
                             f"{t['float32'][0] / t['bfloat16'][0]:.2f}x | {100 * same:.2f} % |")
    return "\n".join(lines)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--layers", type=int, default=None, help="override the depth (real shape: 1-2)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="timed repeats per part (median)")
    ap.add_argument("--samples", action="store_true", help="also time whole samples (small shape)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="which parts to time")
    ap.add_argument("--json", default=None)
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks/")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-dtypes", nargs="+", default=["float32"], help=argparse.SUPPRESS)


def run(a: argparse.Namespace) -> None:
    if a.layers is not None and not 1 <= a.layers <= 32:
        raise SystemExit(f"--layers={a.layers} must be in 1..32")
    if a.child:
        print(json.dumps(child(a)))
        return
    result = parent(a)
    if a.json:
        write_text(a.json, json.dumps(result) + "\n")
    text = render(result)
    print(text)
    if a.write:
        title = ("fp32 vs bf16 on the LLaDA-shaped benchmark model" if a.shape == "small"
                 else "LLaDA-8B's real shapes at reduced depth")
        write_section(title, text)
