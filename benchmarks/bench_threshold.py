"""How many tokens does threshold decoding commit per forward pass, and how many samples per second is that?

LLaDA remasking with confidence-threshold parallel decoding (`RemaskConfig.threshold`: steps = gen_length, so each
step commits every masked position above the threshold and at least the most confident one; blocks of 32) against
fixed-step remasking at --fixed-steps, at each batch size, on a LLaDA-shaped model with random weights (default:
LLaDA-8B's shape in bf16 on a GPU, the `small` preset at 2 layers on a CPU). Per batch: median seconds per call of
--reps (interleaved) after one untimed warm-up, samples/s, seconds per forward, forward passes, tokens per
forward and each row's steps per block. On random weights the confidences are not a trained model's, so the
tokens per forward here describe this model only; the samples/s at a given number of forward passes is what carries over.

Usage (GPU):  PYTHONPATH=src python3 benchmarks/bench_threshold.py --json OUT/threshold.json
      (CPU):  PYTHONPATH=src python benchmarks/bench_threshold.py --batches 1 4 --json /tmp/threshold.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_gpu import build, prompts
from benchlib import interleave, parse_args, round_ratios, spread, write_json

from dsl_llada.config import RemaskConfig
from dsl_llada.sampling.remask import sample_remask

MAX_BATCH, MAX_LEN, MAX_REPS = 64, 2048, 20


def runs(model, pb, configs: dict[str, RemaskConfig], reps: int, device: str) -> dict:
    """Each config's run once untimed (warm-up, counted), then `reps` interleaved rounds (`benchlib.interleave`)."""
    def gens():
        return [torch.Generator().manual_seed(i) for i in range(pb.batch_size)]

    outs = {k: sample_remask(model.backbone, pb, c, generator=gens()) for k, c in configs.items()}
    times = interleave({k: (lambda c=c: sample_remask(model.backbone, pb, c, generator=gens()))
                        for k, c in configs.items()}, reps, device, warmup=False)
    res: dict = {}
    for k, c in configs.items():
        t, B, out = statistics.median(times[k]), pb.batch_size, outs[k]
        res[k] = {"times_s": times[k], "s_per_call": spread(times[k]), "s_per_sample": t / B, "samples_per_s": B / t,
                  "forward_passes": out.forward_passes, "s_per_forward": t / out.forward_passes,
                  "tokens_per_forward": c.gen_length / out.forward_passes,
                  "row_tokens_per_step": [c.gen_length / max(1, int(s.sum())) for s in out.steps_per_block],
                  "steps_per_block": out.steps_per_block.tolist()}
    res["speedup_vs_fixed"] = round_ratios(times, "fixed", "threshold")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default=None, choices=["small", "8b"], help="default: 8b on a GPU, small on a CPU")
    ap.add_argument("--layers", type=int, default=None, help="depth (default: 32 on a GPU, 2 on a CPU)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--fixed-steps", type=int, default=64, help="steps of the fixed-step remasking reference")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = parse_args(ap)
    gpu = a.device.startswith("cuda")
    a.preset = a.preset or ("8b" if gpu else "small")
    a.layers = a.layers or (32 if gpu else 2)
    for flag, v, lo, hi in (("--prompt", a.prompt, 1, MAX_LEN), ("--gen-length", a.gen_length, 32, MAX_LEN),
                            ("--reps", a.reps, 1, MAX_REPS), *(("--batches", b, 1, MAX_BATCH) for b in a.batches)):
        if not lo <= v <= hi:
            ap.error(f"{flag} {v} is out of range: it must be in [{lo}, {hi}]")
    if a.gen_length % 32:
        ap.error(f"--gen-length {a.gen_length} must be a multiple of the block length 32")
    thr = RemaskConfig(steps=a.gen_length, gen_length=a.gen_length, block_length=32, threshold=a.threshold)
    fixed = RemaskConfig(steps=a.fixed_steps, gen_length=a.gen_length, block_length=32)  # validates --fixed-steps
    dtype = torch.bfloat16 if gpu else torch.float32
    full = a.preset == "8b" and a.layers == 32
    scope = "LLaDA-8B shape" if full else f"REDUCED model ({a.preset} width, {a.layers} layers)"
    print(f"threshold decoding on {a.device}, {scope}, {dtype}", flush=True)
    model = build(a.preset, a.layers, a.device, dtype)
    res: dict = {}
    t0 = time.perf_counter()
    for b in a.batches:
        pb = prompts(model, b, a.prompt, a.device)
        res[str(b)] = runs(model, pb, {"threshold": thr, "fixed": fixed}, a.reps, a.device)
        th, fx = res[str(b)]["threshold"], res[str(b)]["fixed"]
        print(f"[{time.perf_counter() - t0:6.1f} s] batch {b}: threshold {a.threshold}: {th['forward_passes']} "
              f"forwards, {th['tokens_per_forward']:.1f} tokens/forward, {th['samples_per_s']:.2f} samples/s, "
              f"{1e3 * th['s_per_forward']:.1f} ms/forward; fixed {a.fixed_steps} steps: {fx['samples_per_s']:.2f} "
              f"samples/s, {1e3 * fx['s_per_forward']:.1f} ms/forward ({res[str(b)]['speedup_vs_fixed']['median']:.2f}x)",
              flush=True)
    write_json(a.json, {"scope": scope, "device_name": torch.cuda.get_device_name() if gpu else "cpu",
                        "dtype": str(dtype), "args": vars(a), "results": res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
