"""One-process GPU benchmark: the SDE at NFE 16 and LLaDA remasking at LLaDA-8B's real shape, batched,
with model FLOP utilisation (MFU) against the bf16 matmul peak measured in the same run; optionally int8.

Parts (each wrapped: a failure, e.g. an OOM at batch 32 or torchao missing, is printed and recorded, and the run
goes on to the next part and still writes the JSON):
  peak     an n x n x n matmul in the model dtype (3 warm-ups, 10 timed): the MFU denominator
  build    the preset's shape (default "8b": d 4096, 32 heads, MLP 12,288, V 126,464) at --layers depth, random
           weights drawn on the device in the model dtype (the head wider, std 0.5, so logits are peaked); the DSL
           converter as `DSLModel.convert` makes it (W in the model dtype, slot logits and softmax in fp32)
  batch B  one SDE denoiser call (converter + backbone + top-M posterior mean; averaged over the SNR grid), a whole
           SDE sample (NFE 16) and a whole remasking sample (16 steps): median of --reps after one warm-up; FLOPs of
           the work the code does (counted from the rows each part really processes) and MFU = FLOPs / (time x peak)
  int8     (--quantize int8) the backbone quantized with `quantize_backbone`: weight memory before/after, SDE call
           time at batch 1 and 8, identical tokens of one seeded NFE-16 sample against the model dtype's

Usage (GPU):  PYTHONPATH=src python3 benchmarks/bench_gpu.py --out DIR [--quantize int8] [--quick]
      (CPU):  PYTHONPATH=src python benchmarks/bench_gpu.py --device cpu --preset small --layers 1 --batches 1 2
              --reps 1 --prompt 16 --response 16 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
from benchlib import PRESETS, block_flops_per_token, call_flops, clock, parse_args, run_environment, sync

from dsl_llada.core.backbones.llada import LLaDABackbone, LLaDAConfig
from dsl_llada.config import ConverterConfig, DSLConfig, RemaskConfig, SDEConfig
from dsl_llada.runtime.environment import environment_footer
from dsl_llada.core.loading import check_device, resolve_dtype
from dsl_llada.core.model import DSLModel
from dsl_llada.core.numerics import flush_denormals
from dsl_llada.sampling.common import PromptBatch
from dsl_llada.sampling.denoiser import Denoiser
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.sampling.sde import inference_beta, sample_sde
from dsl_llada.snr import snr_schedule

NFE = 16
NOISE_DIM = 100
DATASHEET_TFLOPS = {"H100": 989.0, "H200": 989.0}
"""Dense bf16 tensor-core TFLOP/s of the SXM parts (NVIDIA datasheets), printed for reference only."""
MAX_BATCH, MAX_LEN, MAX_REPS, MAX_PEAK_N = 256, 4096, 50, 16384


def say(msg: str) -> None:
    print(msg, flush=True)


def timings(fn, device: str, reps: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    sync(device)
    return [clock(fn, device) for _ in range(reps)]


def matmul_peak(device: str, dtype: torch.dtype, n: int, warmup: int = 3, reps: int = 10) -> dict:
    """FLOP/s of an n x n x n matmul in `dtype` on `device`: median of `reps` after `warmup` (sync + perf_counter)."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    ts = timings(lambda: a @ b, device, reps, warmup)
    t = statistics.median(ts)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "times_s": ts, "median_s": t,
            "flops": 2.0 * n ** 3, "flops_per_s": 2.0 * n ** 3 / t}


def datasheet(gpu_name: str | None) -> float | None:
    for key, tflops in DATASHEET_TFLOPS.items():
        if gpu_name and key in gpu_name:
            return tflops
    return None


def build(preset: str, layers: int, device: str, dtype: torch.dtype, seed: int = 0) -> DSLModel:
    """The preset's LLaDA shape at `layers` depth, allocated on the meta device and materialised on `device` in
    `dtype` (no fp32 copy, no CPU generator over the backbone), N(0, 0.02) weights drawn there, head std 0.5."""
    p = dict(PRESETS[preset], n_layers=layers)
    V = p["vocab_size"]
    cfg = LLaDAConfig(**p, max_sequence_length=MAX_LEN, mask_token_id=V - 1, eos_token_id=V - 2, pad_token_id=V - 2)
    with torch.device("meta"):
        bb = LLaDABackbone(cfg)
    bb = bb.to(dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    bb.init_weights(g, std=0.02)  # drawn on the GPU itself (an 8B CPU draw would take minutes)
    with torch.no_grad():  # a wider head, as benchlib.llada_shaped: peaked logits like a trained model's
        bb.model.transformer.ff_out.weight.normal_(0.0, 0.5, generator=g)
    bb.eval()
    return DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=NOISE_DIM))).eval()


def prompts(model: DSLModel, batch: int, length: int, device: str) -> PromptBatch:
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, model.vocab_size - 3, (batch, length), generator=g).tolist()
    return PromptBatch.from_lists(rows, pad_id=model.special.pad_id, device=device)


@contextlib.contextmanager
def counting(model: DSLModel):
    """Count the work the code really does while inside: backbone forwards and the token rows through its blocks
    (with each forward's sequence length), rows through the output head, converter rows and posterior-mean rows.
    Patches instance attributes of this model only (restored on exit). The counting forward runs eagerly
    (`torch.compiler.disable`): inside a `torch.compile`d backbone its Python counters would make every call a
    recompile (the --compile run on the H200 hit dynamo's recompile limit in its untimed counted run)."""
    bb = model.backbone
    c = {"forwards": 0, "block_rows": [], "head_rows": 0, "converter_rows": 0, "posterior_rows": 0}
    fwd, logits, conv, post = bb.forward, bb._logits, model.converter.forward, model.posterior_mean

    @torch.compiler.disable
    def forward(x, *a, **k):
        c["forwards"] += 1
        c["block_rows"].append((x.shape[0] * x.shape[1], x.shape[1]))
        return fwd(x, *a, **k)

    def head(x, positions):
        out = logits(x, positions)
        c["head_rows"] += out.shape[0] * out.shape[1]
        return out

    def converter(z, *a, **k):
        c["converter_rows"] += z.numel() // z.shape[-1]
        return conv(z, *a, **k)

    def posterior(lg, *a, **k):
        c["posterior_rows"] += lg.numel() // lg.shape[-1]
        return post(lg, *a, **k)

    bb.forward, bb._logits, model.converter.forward, model.posterior_mean = forward, head, converter, posterior
    try:
        yield c
    finally:
        for obj, name in ((bb, "forward"), (bb, "_logits"), (model.converter, "forward"), (model, "posterior_mean")):
            vars(obj).pop(name, None)


def shape_of(model: DSLModel) -> dict:
    cfg = model.backbone.cfg
    return {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
            "mlp_hidden": cfg.ffn_hidden, "vocab": model.vocab_size, "noise_dim": model.noise_dim}


def counted_flops(s: dict, c: dict, top_m: int) -> dict[str, float]:
    """FLOPs of the work counted by `counting` (blocks per forward at its own length, head rows, converter rows,
    posterior rows), with the same per-row costs as `benchlib.call_flops`."""
    one = call_flops(d_model=s["d_model"], n_layers=s["n_layers"], mlp_hidden=s["mlp_hidden"], vocab=s["vocab"],
                     prompt=0, response=1, noise_dim=s["noise_dim"], batch=1, top_m=top_m)  # one row of each
    kv = s["n_kv_heads"] * s["d_model"] // s["n_heads"]
    blocks = 0.0
    for rows, length in c["block_rows"]:
        blocks += rows * s["n_layers"] * block_flops_per_token(s["d_model"], s["mlp_hidden"], length, kv)
    out = {"blocks": blocks, "head": c["head_rows"] * one["head"],
           "converter_slots": c["converter_rows"] * one["converter_slots"],
           "converter_values": c["converter_rows"] * one["converter_values"],
           "top_m_posterior": c["posterior_rows"] * one["top_m_posterior"]}
    out["total"] = sum(out.values())
    return out


def memory_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def memory_peak(device: str) -> int | None:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else None


def memory_now(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def sde_call(model: DSLModel, pb: PromptBatch, a, device: str, peak: float | None, compile: bool = False) -> dict:
    """One SDE denoiser call (the sampler's own `Denoiser`), averaged over the NFE-16 SNR grid's values; with
    `compile`, the backbone through `torch.compile` (SDEConfig.compile; compiled in the untimed first call)."""
    cfg = SDEConfig(nfe=NFE, gen_length=a.response)
    den = Denoiser.for_model(model, model.context_embed(pb.ids), beta=inference_beta(model, cfg), top_m=cfg.top_m,
                             compile=compile)
    B, R = pb.batch_size, a.response
    y = torch.nn.functional.normalize(torch.randn(B, R, model.noise_dim, generator=torch.Generator().manual_seed(0)),
                                      dim=-1).to(device)
    grid = snr_schedule(cfg.schedule, cfg.steps).tolist()
    gammas = [grid[i] for i in sorted({0, len(grid) // 2, len(grid) - 1})]  # low, middle, high SNR
    with flush_denormals(), torch.no_grad():
        with counting(model) as c:
            den(y, gammas[0])
        per = {g: statistics.median(timings(lambda g=g: den(y, g), device, a.reps)) for g in gammas}
    t = statistics.mean(per.values())
    s = shape_of(model)
    done = counted_flops(s, c, cfg.top_m)
    needed = call_flops(d_model=s["d_model"], n_layers=s["n_layers"], mlp_hidden=s["mlp_hidden"], vocab=s["vocab"],
                        prompt=a.prompt, response=R, noise_dim=s["noise_dim"], batch=B, top_m=cfg.top_m)
    return {"ms_per_call": 1e3 * t, "ms_per_call_by_gamma": {f"{g:g}": 1e3 * v for g, v in per.items()},
            "counted": {k: v for k, v in c.items() if k != "block_rows"}, "flops_done": done,
            "flops_needed": needed, "mfu": done["total"] / (t * peak) if peak else None}


def whole(kind: str, model: DSLModel, pb: PromptBatch, a, device: str, peak: float | None,
          compile: bool = False) -> dict:
    """A whole SDE (NFE 16) or remasking (16 steps) sample of the batch, seeded per row; median of --reps. The
    result keeps the sampled ids (`ids`, a list per row) for token comparisons."""
    B = pb.batch_size
    if kind == "sde":
        cfg = SDEConfig(nfe=NFE, gen_length=a.response, compile=compile)

        def run():
            return sample_sde(model, pb, cfg, generator=[torch.Generator().manual_seed(i) for i in range(B)])
        top_m = cfg.top_m
    else:
        rcfg = RemaskConfig(steps=NFE, gen_length=a.response, compile=compile)

        def run():
            return sample_remask(model.backbone, pb, rcfg, generator=[torch.Generator().manual_seed(i) for i in range(B)])
        top_m = 0
    with counting(model) as c:  # the warm-up run, counted
        out = run()
    ts = timings(run, device, a.reps, warmup=0)
    t = statistics.median(ts)
    s = shape_of(model)
    fl = counted_flops(s, c, top_m)
    res = {"s_per_batch": t, "times_s": ts, "s_per_sample": t / B, "samples_per_s": B / t,
           "tokens_per_s": B * a.response / t, "forward_passes": out.forward_passes,
           "counted": {k: v for k, v in c.items() if k != "block_rows"}, "flops_done": fl,
           "mfu": fl["total"] / (t * peak) if peak else None, "ids": out.ids.tolist()}
    if kind == "remask":
        # needed: the head on each row's still-masked positions (response/NFE committed per step); done: on every
        # column still masked in some row of the batch (the union: more than needed when rows commit differently)
        res["head_rows_needed"] = B * sum(a.response - i * (a.response // NFE) for i in range(NFE))
        res["flops_needed_total"] = fl["total"] - fl["head"] + res["head_rows_needed"] * 2.0 * s["d_model"] * s["vocab"]
    return res


class Run:
    """Collects the parts' results and errors; `part(name)` prints a progress line and records a failure."""

    def __init__(self, result: dict):
        self.result = result
        self.t0 = time.perf_counter()

    @contextlib.contextmanager
    def part(self, name: str):
        say(f"[{time.perf_counter() - self.t0:7.1f} s] {name} ...")
        oom = False
        try:
            yield
            say(f"[{time.perf_counter() - self.t0:7.1f} s] {name} done")
        except Exception as e:  # noqa: BLE001 -- every part's failure is reported, the run goes on
            msg = f"{type(e).__name__}: {e}"
            say(f"[{time.perf_counter() - self.t0:7.1f} s] {name} FAILED: {msg}")
            traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
            self.result["errors"].append({"part": name, "error": msg})
            oom = isinstance(e, torch.OutOfMemoryError)
        if oom:  # outside the except block: the traceback's frames (holding the tensors) are released by now
            gc.collect()
            torch.cuda.empty_cache()


def quantized(model: DSLModel, a, device: str, dtype: torch.dtype, run: Run) -> dict:
    """int8 weight-only backbone (`quantize_backbone`): weight memory before/after, SDE call time at batch 1 and 8,
    identical tokens of one seeded NFE-16 sample against the unquantized model's."""
    from dsl_llada.core.quantize import quantize_backbone

    pb = prompts(model, 1, a.prompt, device)
    cfg = SDEConfig(nfe=NFE, gen_length=a.response)
    ref = sample_sde(model, pb, cfg, generator=torch.Generator().manual_seed(0)).ids
    x = model.context_embed(torch.cat([pb.ids, torch.full((1, a.response), model.special.mask, device=device)], 1))
    ref_logits = model.backbone(x, positions=slice(a.prompt, None))
    before = memory_now(device)
    quantize_backbone(model, "int8")  # in place: the last part of the run
    res: dict = {"weight_bytes_before": before, "weight_bytes_after": memory_now(device), "calls": {}}
    for b in [x for x in (1, 8) if x <= max(a.batches)] or [1]:
        with run.part(f"int8 SDE call, batch {b}"):
            res["calls"][str(b)] = {"ms_per_call": sde_call(model, prompts(model, b, a.prompt, device), a, device,
                                                            None)["ms_per_call"]}
    ids = sample_sde(model, pb, cfg, generator=torch.Generator().manual_seed(0)).ids
    res["identical_tokens"] = float((ids == ref).float().mean())
    # one forward of the same input: on random weights a whole SDE sample amplifies any change, this does not
    logits = model.backbone(x, positions=slice(a.prompt, None))
    res["same_argmax_one_forward"] = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
    return res


def compiled_runs(model: DSLModel, a, device: str, peak: float | None, eager: dict, run: Run) -> dict:
    """The backbone through `torch.compile` (SDEConfig.compile, RemaskConfig.compile) at each batch of
    --compile-batches: compile time (the first call), the SDE call, a whole NFE-16 SDE sample and a whole 16-step
    remasking sample against the eager figures of the same run, and the fraction of each sample's tokens equal to
    eager's (fused kernels round differently: not bit-identical)."""
    res: dict = {}
    for b in a.compile_batches:
        with run.part(f"compiled backbone, batch {b}"):
            pb = prompts(model, b, a.prompt, device)
            t0 = time.perf_counter()
            sde_call(model, pb, SimpleNamespace(**{**vars(a), "reps": 1}), device, None, compile=True)  # compiles
            first = time.perf_counter() - t0
            call = sde_call(model, pb, a, device, peak, compile=True)
            sde = whole("sde", model, pb, a, device, peak, compile=True)
            t0 = time.perf_counter()
            whole("remask", model, pb, SimpleNamespace(**{**vars(a), "reps": 1}), device, None, compile=True)
            first_rm = time.perf_counter() - t0  # compiles (a second compile once the head's column count varies)
            rm = whole("remask", model, pb, a, device, peak, compile=True)
            ref = eager.get(str(b), {})

            def same(kind: str, got: dict) -> float | None:
                return float((torch.tensor(got["ids"]) == torch.tensor(ref[kind]["ids"])).float().mean()) \
                    if kind in ref else None

            def speedup(kind: str, key: str, got: dict) -> float | None:
                return ref[kind][key] / got[key] if kind in ref else None

            res[str(b)] = {"first_call_s": first, "call": call, "sde": sde, "identical_tokens_vs_eager": same("sde", sde),
                           "call_speedup": speedup("call", "ms_per_call", call),
                           "sde_speedup": speedup("sde", "s_per_sample", sde),
                           "remask_first_run_s": first_rm, "remask": rm, "remask_speedup": speedup("remask", "s_per_sample", rm),
                           "remask_identical_tokens_vs_eager": same("remask", rm)}
            r = res[str(b)]
            say(f"  first call {first:.1f} s; {call['ms_per_call']:.2f} ms/call, {sde['s_per_sample']:.3f} s/sample; "
                f"remask first run {first_rm:.1f} s, {rm['s_per_sample']:.3f} s/sample"
                + (f"; vs eager: SDE {r['call_speedup']:.2f}x per call, {r['sde_speedup']:.2f}x per sample, remask "
                   f"{r['remask_speedup']:.2f}x per sample" if None not in (r["call_speedup"], r["sde_speedup"],
                                                                       r["remask_speedup"]) else ""))
    return res


def markdown(r: dict, command: str) -> str:
    m, pk = r.get("model", {}), r.get("peak", {})
    dev = r["environment"].get("gpu") or r["environment"].get("cpu_model")
    lines = [f"### GPU: SDE NFE {NFE} and remasking at the {r['config']['preset']} shape, batched, with MFU ({dev})",
             "", environment_footer(r["environment"]), "", f"Command: `{command}`", ""]
    if m:
        lines.append(f"Shape: d {m['d_model']}, {m['n_layers']} layers, {m['n_heads']} heads, MLP {m['mlp_hidden']}, "
                     f"V {m['vocab']}; {r['config']['dtype']} backbone, fp32 converter softmax; prompt "
                     f"{r['config']['prompt']} + response {r['config']['response']}; weights "
                     f"{_gib(m.get('weight_bytes'))} GiB, built in {m['build_s']:.1f} s.")
    if pk:
        sheet = pk.get("datasheet_tflops")
        lines.append(f"Matmul peak measured in this run ({pk['n']}^3 {pk['dtype']}): {pk['flops_per_s'] / 1e12:.1f} "
                     f"TFLOP/s" + (f" (datasheet dense bf16: {sheet:.0f} TFLOP/s)" if sheet else "")
                     + "; MFU = counted FLOPs / (time x measured peak).")
    lines += ["", "| batch | SDE call ms | call GFLOP | call MFU | SDE s/sample | SDE samples/s | SDE tokens/s | "
              "SDE MFU | remask s/sample | remask tokens/s | remask MFU | peak GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for b, x in r["batches"].items():
        call, sde, rm = x.get("call", {}), x.get("sde", {}), x.get("remask", {})
        lines.append("| " + " | ".join([
            b, _f(call.get("ms_per_call"), 1), _f(call.get("flops_done", {}).get("total"), 1, 1e-9),
            _pct(call.get("mfu")), _f(sde.get("s_per_sample"), 3), _f(sde.get("samples_per_s"), 2),
            _f(sde.get("tokens_per_s"), 0), _pct(sde.get("mfu")), _f(rm.get("s_per_sample"), 3),
            _f(rm.get("tokens_per_s"), 0), _pct(rm.get("mfu")), _gib(x.get("peak_memory_bytes"))]) + " |")
    for b, c in r.get("compiled", {}).items():
        same = c.get("identical_tokens_vs_eager")
        lines += ["", f"torch.compile'd backbone (`SDEConfig.compile`), batch {b}: first call (compiling) "
                      f"{c['first_call_s']:.1f} s; SDE call {c['call']['ms_per_call']:.1f} ms ({_pct(c['call'].get('mfu'))} "
                      f"MFU, {_f(c.get('call_speedup'), 2)}x eager); whole sample {c['sde']['s_per_sample']:.3f} s "
                      f"({_f(c.get('sde_speedup'), 2)}x eager); tokens equal to eager's: {_pct(same)}."]
        if "remask" in c:
            lines += ["", f"torch.compile'd backbone (`RemaskConfig.compile`), batch {b}: first run (compiling) "
                          f"{c['remask_first_run_s']:.1f} s; whole 16-step remasking sample {c['remask']['s_per_sample']:.3f} s "
                          f"({_f(c.get('remask_speedup'), 2)}x eager); tokens equal to eager's: "
                          f"{_pct(c.get('remask_identical_tokens_vs_eager'))}."]
    q = r.get("quantize")
    if q and "skipped" in q:
        lines += ["", f"int8: skipped ({q['skipped']})."]
    elif q:
        calls = ", ".join(f"batch {b} {v['ms_per_call']:.1f} ms" for b, v in q.get("calls", {}).items())
        lines += ["", f"int8 weight-only backbone: weights {_gib(q.get('weight_bytes_before'))} -> "
                      f"{_gib(q.get('weight_bytes_after'))} GiB; SDE call {calls}; identical tokens of one seeded "
                      f"NFE-{NFE} sample vs {r['config']['dtype']}: {100 * q.get('identical_tokens', float('nan')):.1f} % (same "
                      f"argmax in one forward: {100 * q.get('same_argmax_one_forward', float('nan')):.1f} %)."]
    if r["errors"]:
        lines += ["", "Failed parts: " + "; ".join(f"{e['part']}: {e['error']}" for e in r["errors"]) + "."]
    lines += ["", "Reading: (left to the lead)"]
    return "\n".join(lines) + "\n"


def _f(x, digits: int, scale: float = 1.0) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _gib(x) -> str:
    return "-" if x is None else f"{x / 2 ** 30:.2f}"


def bounded(ap, name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        ap.error(f"{name}={value} must be in {lo}..{hi}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="backbone dtype (auto: bf16 on a GPU or a CPU with native bf16, else fp32)")
    ap.add_argument("--preset", default="8b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="depth (default: the preset's; 8b = 32)")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default 1 8 32)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--reps", type=int, default=None, help="timed repeats after one warm-up (default 3)")
    ap.add_argument("--peak-n", type=int, default=None, help="matmul size of the peak (default 8192 GPU, 1024 CPU)")
    ap.add_argument("--quantize", default="none", choices=["none", "int8"], help="also time an int8 backbone")
    ap.add_argument("--compile", action="store_true",
                    help="also time the SDE with the backbone through torch.compile (SDEConfig.compile)")
    ap.add_argument("--compile-batches", type=int, nargs="+", default=[1],
                    help="batch sizes for --compile (each compiles once; default 1)")
    ap.add_argument("--quick", action="store_true", help="batches 1 8, 1 rep, 8 layers unless given")
    ap.add_argument("--out", default=None, help="folder for bench_gpu.json and bench_gpu.md (created)")
    ap.add_argument("--json", default=None, help="results file (default OUT/bench_gpu.json)")
    ap.add_argument("--markdown", default=None, help="markdown section file (default OUT/bench_gpu.md)")
    a = parse_args(ap)
    try:
        a.device = check_device(a.device)
    except ValueError as e:
        ap.error(str(e))
    a.batches = a.batches or ([1, 8] if a.quick else [1, 8, 32])
    a.reps = a.reps or (1 if a.quick else 3)
    a.layers = a.layers or (min(8, PRESETS[a.preset]["n_layers"]) if a.quick else PRESETS[a.preset]["n_layers"])
    a.peak_n = a.peak_n or (8192 if a.device.startswith("cuda") else 1024)
    for b in a.batches:
        bounded(ap, "--batches", b, 1, MAX_BATCH)
    for b in a.compile_batches:
        bounded(ap, "--compile-batches", b, 1, MAX_BATCH)
    bounded(ap, "--layers", a.layers, 1, 64)
    bounded(ap, "--prompt", a.prompt, 1, MAX_LEN // 2)
    bounded(ap, "--response", a.response, NFE, MAX_LEN // 2)
    bounded(ap, "--reps", a.reps, 1, MAX_REPS)
    bounded(ap, "--peak-n", a.peak_n, 64, MAX_PEAK_N)
    if a.response % NFE:
        ap.error(f"--response={a.response} must be a multiple of {NFE} (remasking commits response/{NFE} per step)")
    out = Path(a.out) if a.out else None
    json_path = Path(a.json) if a.json else (out / "bench_gpu.json" if out else None)
    md_path = Path(a.markdown) if a.markdown else (out / "bench_gpu.md" if out else None)
    if json_path is None:
        ap.error("give --out DIR (or --json PATH): the results must be written somewhere")
    for p in (json_path, md_path):
        if p is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
    dtype = resolve_dtype(a.dtype, a.device)
    a.dtype = str(dtype).removeprefix("torch.")
    command = " ".join(["python3", "benchmarks/bench_gpu.py", *sys.argv[1:]])
    result: dict = {"config": {**vars(a), "float32_matmul_precision": torch.get_float32_matmul_precision()},
                    "command": command, "errors": [], "batches": {}}
    run = Run(result)
    env = run_environment()
    say(f"device {a.device} ({env.get('gpu') or env.get('cpu_model')}), CUDA {env.get('cuda')}, torch "
        f"{torch.__version__}, dtype {a.dtype}, preset {a.preset} x {a.layers} layers, batches {a.batches}")

    peak = None
    with run.part(f"matmul peak {a.peak_n}^3 {a.dtype}"):
        result["peak"] = matmul_peak(a.device, dtype, a.peak_n)
        result["peak"]["datasheet_tflops"] = datasheet(env.get("gpu"))
        peak = result["peak"]["flops_per_s"]
        say(f"  measured {peak / 1e12:.2f} TFLOP/s" + (f" (datasheet dense bf16 {result['peak']['datasheet_tflops']:.0f})"
                                                        if result["peak"]["datasheet_tflops"] else ""))
    model = None
    with run.part(f"build {a.preset} x {a.layers} layers on {a.device}"):
        memory_reset(a.device)
        t0 = time.perf_counter()
        model = build(a.preset, a.layers, a.device, dtype)
        sync(a.device)
        result["model"] = {**shape_of(model), "build_s": time.perf_counter() - t0, "weight_bytes": memory_now(a.device)}
        say(f"  built in {result['model']['build_s']:.1f} s, weights {_gib(result['model']['weight_bytes'])} GiB")
    if model is not None:
        for b in a.batches:
            res: dict = {}
            result["batches"][str(b)] = res
            memory_reset(a.device)
            pb = prompts(model, b, a.prompt, a.device)
            for name, fn in (("call", lambda: sde_call(model, pb, a, a.device, peak)),
                             ("sde", lambda: whole("sde", model, pb, a, a.device, peak)),
                             ("remask", lambda: whole("remask", model, pb, a, a.device, peak))):
                with run.part(f"batch {b}: {name}"):
                    with torch.no_grad():
                        res[name] = fn()
                    x = res[name]
                    say("  " + (f"{x['ms_per_call']:.2f} ms/call" if name == "call" else
                                f"{x['s_per_sample']:.3f} s/sample, {x['tokens_per_s']:.0f} tokens/s")
                        + (f", MFU {100 * x['mfu']:.1f} %" if x.get("mfu") is not None else ""))
            res["peak_memory_bytes"] = memory_peak(a.device)
        if a.compile:
            result["compiled"] = compiled_runs(model, a, a.device, peak, result["batches"], run)
        if a.quantize == "int8":
            with run.part("int8 weight-only backbone"):
                try:
                    import dsl_llada.core.quantize as q

                    q._int8_config()
                except q.QuantizationUnavailable as e:
                    result["quantize"] = {"skipped": str(e)}
                    say(f"  int8 skipped: {e}")
                else:
                    with torch.no_grad():
                        result["quantize"] = quantized(model, a, a.device, dtype, run)
    result["environment"] = {**run_environment(), "dtype": a.dtype, "seeds": {"weights": 0, "prompts": 1,
                                                                             "sample_rows": "row i: seed i"}}
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result, command)
    print(text, flush=True)
    if md_path is not None:
        md_path.write_text(text)
    say(f"wrote {json_path}" + (f" and {md_path}" if md_path else "") + f"; {len(result['errors'])} part(s) failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
