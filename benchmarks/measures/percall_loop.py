"""The sampling loop against its model calls, on the `small` preset (d 512, 8 layers, V 4,096) by default:

(a) loop efficiency = (model calls x time of one model call measured alone) / whole sampling time, and the in-run
    share (the part of one run's own wall time spent inside its model calls), at each --nfe, --rounds times
    (a model call = one denoiser evaluation, converter + backbone + top-M posterior mean, for the SDE; one
    backbone forward for remasking);
(b) SDE samples/s at each of --batches, at the first --nfe;
(c) converter peak memory at V = 126,464, L = 2048 with and without token chunking (peak RSS of a fresh process).

Usage:  python benchmarks/bench_percall.py loop [--nfe 16 64] [--rounds 3] [--batches 1 4 16] [--json OUT]
        python benchmarks/bench_percall.py loop --preset 8b --device cuda --dtype bfloat16 --nfe 32 --rounds 1 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchlib import (PRESETS, median_time, random_prompts, reset_peak_rss, run_environment, status_kib,
                      write_json)

from dsl_llada.core.backbones.llada import LLaDABackbone, LLaDAConfig
from dsl_llada.config import ConverterConfig, DSLConfig, RemaskConfig, SDEConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.core.numerics import flush_denormals
from dsl_llada.sampling.common import PromptBatch
from dsl_llada.sampling.denoiser import Denoiser
from dsl_llada.sampling.sde import inference_beta, sample_sde
from dsl_llada.snr import snr_schedule

BENCH = Path(__file__).resolve().parents[1]


def build_model(preset: str, device: str, dtype: torch.dtype, noise_dim: int = 100) -> DSLModel:
    p = PRESETS[preset]
    V = p["vocab_size"]
    cfg = LLaDAConfig(**p, max_sequence_length=4096, mask_token_id=V - 1, eos_token_id=V - 2, pad_token_id=V - 2)
    with torch.device(device):
        bb = LLaDABackbone(cfg)
    bb.init_weights(torch.Generator(device=device).manual_seed(0) if device == "cpu" else None)
    bb = bb.to(dtype)
    model = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=noise_dim)))
    return model.eval()


@torch.no_grad()
def loop_efficiency(model: DSLModel, device: str, gen_length: int, prompt_len: int, nfe: int, repeats: int) -> dict:
    pb = random_prompts(model, 1, prompt_len, device=device)
    ids = torch.cat([pb.ids, torch.full((1, gen_length), model.special.mask, device=device)], 1)
    sde_cfg = SDEConfig(nfe=nfe, gen_length=gen_length)
    denoise = Denoiser.for_model(model, model.context_embed(pb.ids), beta=inference_beta(model, sde_cfg),
                                 top_m=sde_cfg.top_m)
    y = torch.nn.functional.normalize(torch.randn(1, gen_length, model.noise_dim, device=device), dim=-1)

    # One SDE model call = one evaluation of the sampler's own denoiser: converter -> backbone (logits of the
    # response only) -> top-M posterior mean. Its cost depends a little on gamma (how peaked the converter softmax
    # is), so average it over the SNR grid.
    grid = snr_schedule(sde_cfg.schedule, sde_cfg.steps).tolist()
    with flush_denormals():  # as inside the samplers
        t_dsl = sum(median_time(lambda g=g: denoise(y, g), repeats, device) for g in grid) / len(grid)
        t_bb = median_time(lambda: model.logits_from_ids(ids, positions=slice(prompt_len, None)), repeats, device)

    out = {}
    # medians, not minima, throughout: the sampler's calls are not all best-case either, so min-vs-total would
    # understate the loop's efficiency
    t_sde = median_time(lambda: out.__setitem__("sde", sample_sde(model, pb, sde_cfg,
                                                                  generator=torch.Generator().manual_seed(0))),
                        repeats, device)
    calls = out["sde"].forward_passes
    res = {"sde": {"calls": calls, "t_call_s": t_dsl, "t_total_s": t_sde, "efficiency": calls * t_dsl / t_sde}}
    try:
        from dsl_llada.sampling.remask import sample_remask
    except ImportError:
        return res
    rm_cfg = RemaskConfig(steps=nfe, gen_length=gen_length)
    t_rm = median_time(lambda: out.__setitem__("rm", sample_remask(model.backbone, pb, rm_cfg)), repeats, device)
    calls = out["rm"].forward_passes
    res["remask"] = {"calls": calls, "t_call_s": t_bb, "t_total_s": t_rm, "efficiency": calls * t_bb / t_rm}
    in_run = in_run_efficiency(model, pb, sde_cfg, rm_cfg, repeats)
    for name in res:
        res[name]["in_run"] = in_run[name]
    return res


def in_run_efficiency(model: DSLModel, pb: PromptBatch, sde_cfg: SDEConfig, rm_cfg: RemaskConfig,
                      repeats: int) -> dict[str, float]:
    """Share of a sampler run's own wall time spent inside its model calls, timed in the same run (no drift
    between separately timed calls and runs on a noisy machine). SDE model call = `Denoiser.logits` (converter +
    backbone) + the top-M posterior mean; remasking = the counted backbone forward. Median over `repeats` runs."""
    from dsl_llada.sampling.common import ForwardCounter
    from dsl_llada.sampling.remask import sample_remask

    spent = [0.0]

    def timing(fn):
        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        return wrapped

    def share(run, patches) -> float:
        saved = [(obj, name, getattr(obj, name)) for obj, name in patches]
        for obj, name, fn in saved:
            setattr(obj, name, timing(fn))
        try:
            shares = []
            for _ in range(repeats):
                spent[0] = 0.0
                t = time.perf_counter()
                run()
                shares.append(spent[0] / (time.perf_counter() - t))
            return statistics.median(shares)
        finally:
            for obj, name, fn in saved:
                setattr(obj, name, fn)

    return {"sde": share(lambda: sample_sde(model, pb, sde_cfg, generator=torch.Generator().manual_seed(0)),
                         [(Denoiser, "logits"), (DSLModel, "posterior_mean")]),
            "remask": share(lambda: sample_remask(model.backbone, pb, rm_cfg), [(ForwardCounter, "__call__")])}


@torch.no_grad()
def throughput(model: DSLModel, device: str, gen_length: int, prompt_len: int, nfe: int, batches: list[int]) -> dict:
    res = {}
    for b in batches:
        pb = random_prompts(model, b, prompt_len, device=device)
        cfg = SDEConfig(nfe=nfe, gen_length=gen_length)
        gens = [torch.Generator().manual_seed(i) for i in range(b)]
        t = median_time(lambda: sample_sde(model, pb, cfg, generator=gens), 1, device)
        res[b] = {"seconds": t, "samples_per_s": b / t}
    return res


def _converter_peak_child(chunk: int, L: int, V: int, H: int) -> None:
    from dsl_llada.core.converter import Converter

    conv = Converter(ConverterConfig(noise_dim=100, token_chunk=chunk), V, H)
    E = torch.nn.functional.normalize(torch.randn(V, 100), dim=-1)
    z = torch.randn(L, 100) * 10
    if not reset_peak_rss():  # the peak-RSS mark (VmHWM) set to the current RSS
        raise RuntimeError("the peak RSS cannot be reset here (needs Linux /proc/self/clear_refs)")
    base = status_kib("VmRSS")
    with torch.no_grad():
        conv(z, E)
    peak = status_kib("VmHWM")
    print(json.dumps({"base_kib": base, "peak_kib": peak, "growth_kib": peak - base}))


def converter_memory(L: int = 2048, V: int = 126464, H: int = 64) -> dict:
    """Peak RSS growth of one converter call in a fresh process (H kept small so W is only V*H*4 bytes)."""
    res = {}
    for chunk in (0, 256):
        code = ("import sys; sys.path.insert(0, %r); from measures.percall_loop import _converter_peak_child; "
                "_converter_peak_child(%d, %d, %d, %d)") % (str(BENCH), chunk, L, V, H)
        # Each variant in its own process, so one's peak cannot hide the other's.
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        res["unchunked" if chunk == 0 else f"chunk{chunk}"] = json.loads(out.stdout.strip().splitlines()[-1])
    res["pi_bytes_unchunked_MiB"] = L * (V + 1) * 4 / 2**20
    res["pi_bytes_chunk256_MiB"] = 256 * (V + 1) * 4 / 2**20
    return res


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--quick", action="store_true",
                    help="prompt 16 + response 64, NFE 16, batches 1 and 4, 3 calls per median")
    ap.add_argument("--nfe", type=int, nargs="+", default=None, choices=range(2, 257, 2), metavar="{2,4,...,256}",
                    help="NFEs of the SDE runs and steps of the remasking runs, each measured in turn (default 16 64; "
                         "16 with --quick); the samples/s table runs at the first")
    ap.add_argument("--rounds", type=int, default=3,
                    help="times the loop efficiency of each NFE is measured (median and range reported)")
    ap.add_argument("--batches", type=int, nargs="+", default=None, choices=range(1, 65), metavar="1-64",
                    help="SDE batch sizes of the samples/s table (default 1 4 16; 1 4 with --quick)")
    ap.add_argument("--json", default=None, help="write the results and this run's environment record here")


def run(a: argparse.Namespace) -> None:
    if a.rounds < 1:
        a.parser.error(f"--rounds {a.rounds} must be at least 1")
    torch.manual_seed(0)
    dtype = torch.float32 if a.dtype == "float32" else torch.bfloat16
    model = build_model(a.preset, a.device, dtype)
    gen, prompt = (64, 16) if a.quick else (128, 32)
    nfes = a.nfe or ([16] if a.quick else [16, 64])
    batches = a.batches or ([1, 4] if a.quick else [1, 4, 16])
    repeats = 3 if a.quick else 5
    eff = {}
    for nfe in nfes:
        rounds = [loop_efficiency(model, a.device, gen, prompt, nfe, repeats) for _ in range(a.rounds)]
        eff[str(nfe)] = {name: summarise_rounds([r[name] for r in rounds]) for name in rounds[0]}
        print(f"NFE {nfe}: " + json.dumps({k: {"efficiency": [round(x, 3) for x in v["efficiency_rounds"]]}
                                           for k, v in eff[str(nfe)].items()}), file=sys.stderr)
    thr = throughput(model, a.device, gen, prompt, nfes[0], batches)
    mem = converter_memory() if a.device == "cpu" else {}
    result = {"preset": a.preset, "device": a.device, "dtype": a.dtype, "gen_length": gen, "prompt_length": prompt,
              "nfes": nfes, "rounds": a.rounds, "repeats": repeats, "model": model_shape(model),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
              "loop_efficiency": eff, "throughput_nfe": nfes[0], "throughput": thr, "converter_memory": mem}
    print(json.dumps({**result, "environment": run_environment()}, indent=2))
    write_json(a.json, result)


def summarise_rounds(rounds: list[dict]) -> dict:
    """One sampler's rounds as the medians of its times and ratios, with the ratios of every round kept."""
    return {"calls": rounds[0]["calls"],
            "t_call_s": statistics.median(r["t_call_s"] for r in rounds),
            "t_total_s": statistics.median(r["t_total_s"] for r in rounds),
            "efficiency": statistics.median(r["efficiency"] for r in rounds),
            "in_run": statistics.median(r["in_run"] for r in rounds),
            "efficiency_rounds": [r["efficiency"] for r in rounds], "in_run_rounds": [r["in_run"] for r in rounds]}


def model_shape(model: DSLModel) -> dict:
    cfg = model.backbone.cfg
    return {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "vocab_size": model.vocab_size,
            "noise_dim": model.noise_dim}
