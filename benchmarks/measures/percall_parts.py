"""One SDE denoiser call, part by part, before and after a change: interleaved rounds, one fresh process each.

Model: the LLaDA-shaped benchmark model (`benchlib.llada_shaped`: d_model 256, 4 layers, vocabulary 32,768, noise
dim 100), prompt 128 + response 128, batch 1, fp32, inside the samplers' denormal mode, --threads threads. Each part
is timed as the sampler runs it (the converter and the posterior mean with a per-run `Workspace`, the whole call
through `Denoiser`), the median of --reps calls at each SNR of the NFE-16 schedule, then the median over the SNRs.
"Needed work" = slot logits + dense πWᵀ + blocks + head on the response rows + the top-M weighted sum; the ratio is
the whole call's time over that work's FLOP time at the process's own best square-matmul rate, and each part's
time over its own work's FLOP time. One LLaDA remasking step (a 16-step run over the 128-token response / 16) is
timed in the same process against its needed work (blocks + head on the block's rows).

`--before REV` exports REV's `src/` (git archive) and runs the same measurement on it in alternate processes (before,
after, before, ...); each round also runs one seeded NFE-16 SDE sample per side to check that the tokens are
identical. The sparse converter (`converter_tolerance`) is reported for the current tree: kept slots per position,
exactly non-zero slots, and its time against the dense product at each SNR.

Usage:  python benchmarks/bench_percall.py parts --before 754fa11 --rounds 3 --threads 1 [--json OUT] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from benchlib import (ROOT, blocks_and_head_times, command_line, llada_shaped, matmul_peak_fp32, median_time,
                      run_environment, sde_call_inputs, sde_call_work, use_cpu_clock, write_json, write_section)

ENTRY = Path(__file__).resolve().parents[1] / "bench_percall.py"

PARTS = ("slot", "softmax", "values", "converter", "blocks", "head", "topm", "posterior", "call")
REMASK_STEPS = 16


def summary(sides: dict[str, list[dict]]) -> dict:
    """Per side: median (min, max over processes) of the SDE call's and the remasking step's ratio to FLOP time, and
    of each part's; and whether every process's seeded SDE and remasking tokens equal the first after-side's."""
    out: dict = {}
    ref = sides["after"][0]
    for side, runs in sides.items():
        def spread(xs: list[float]) -> dict[str, float]:
            return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
        out[side] = {"call_ratio": spread([r["ratio"] for r in runs]),
                     "remask_step_ratio": spread([r["remask_ratio"] for r in runs]),
                     "part_ratios": {k: spread([r["part_ratios"][k] for r in runs]) for k in runs[0]["part_ratios"]},
                     "sde_tokens_identical": all(r["tokens"] == ref["tokens"] for r in runs),
                     "remask_tokens_identical": all(r["remask_tokens"] == ref["remask_tokens"] for r in runs)}
    return out


@torch.no_grad()
def measure(reps: int, tolerance: float, cpu_clock: bool = False) -> dict:
    """Per-part medians (s) of the code on sys.path, FLOPs, peak, the sparse converter rows and seeded tokens;
    with `cpu_clock`, every time and the peak are the process's CPU time (1 thread: `benchlib.use_cpu_clock`)."""
    if cpu_clock:
        use_cpu_clock(torch.get_num_threads())
    from dsl_llada.core import converter as C
    from dsl_llada.config import RemaskConfig
    from dsl_llada.core.numerics import Workspace, flush_denormals
    from dsl_llada.sampling.denoiser import Denoiser
    from dsl_llada.sampling.remask import sample_remask
    from dsl_llada.sampling.sde import sample_sde

    torch.manual_seed(0)
    model = llada_shaped()
    conv, cfg = model.converter, model.backbone.cfg
    P = L = 128
    V, H, d, M = model.vocab_size, cfg.d_model, model.noise_dim, 512
    pb, E, sde_cfg, beta, grid, ids = sde_call_inputs(model, P, L)
    b_t = torch.tensor(beta)
    W, c = conv.backbone_embedding.weight, conv.backbone_embedding.bias
    n_slots = V + 1
    width = C.aligned_slots(n_slots, L) if hasattr(C, "aligned_slots") else n_slots
    slots = torch.empty(L, width)
    h_out = torch.empty(L, H)
    denoise = Denoiser.for_model(model, model.context_embed(pb.ids), beta=beta, top_m=M)
    times: dict[str, list[float]] = {k: [] for k in PARTS}
    sparse = []
    with flush_denormals():
        peak = matmul_peak_fp32(reps)
        for gamma in grid:
            y = (E[ids[0, P:]] + gamma ** -0.5 * torch.randn(L, d, generator=torch.Generator().manual_seed(4)))[None]
            z = gamma * y[0]
            ws = Workspace()
            conv(z, E, beta, workspace=ws)
            times["slot"].append(median_time(lambda: conv.slot_logits(z, E, b_t, slots), reps))
            times["softmax"].append(median_time(lambda: torch.softmax(slots, -1, out=slots), reps))
            conv.slot_logits(z, E, b_t, slots)
            pi = torch.softmax(slots, -1, out=slots)[:, :n_slots]
            times["values"].append(median_time(lambda: torch.addmm(c, pi, W.T, out=h_out), reps))
            times["converter"].append(median_time(lambda: conv(z, E, beta, workspace=ws), reps))
            logits = denoise.logits(y, gamma)
            flat = logits[0]
            times["topm"].append(median_time(lambda: C.top_m_values(flat, M), reps))
            times["posterior"].append(median_time(lambda: model.posterior_mean(logits, M, E, workspace=ws), reps))
            times["call"].append(median_time(lambda: denoise(y, gamma), reps))
            kept = (pi >= tolerance / n_slots).sum(-1)
            nonzero = (pi > 0).sum(-1)
            t_sparse = median_time(lambda: conv._sparse_values(pi, tolerance), reps)
            sparse.append({"gamma": gamma, "kept_mean": float(kept.float().mean()), "kept_max": int(kept.max()),
                           "nonzero_mean": float(nonzero.float().mean()), "nonzero_max": int(nonzero.max()),
                           "t_dense": times["values"][-1], "t_sparse": t_sparse})
        t_blocks, t_head, normed = blocks_and_head_times(model, ids, z, beta, E, P, reps)
        layouts = head_layouts(normed[0], model.backbone.model.transformer.ff_out.weight, reps)
        import time

        t0 = time.perf_counter()
        tokens = sample_sde(model, pb, sde_cfg, generator=torch.Generator().manual_seed(0)).ids
        t_sample = time.perf_counter() - t0
        t0 = time.perf_counter()
        sparse_tokens = sample_sde(model, pb, sde_cfg.replace(converter_tolerance=tolerance),
                                   generator=torch.Generator().manual_seed(0)).ids
        t_sparse_sample = time.perf_counter() - t0
        rm_cfg = RemaskConfig(steps=REMASK_STEPS, gen_length=L)
        rm_tokens = sample_remask(model, pb, rm_cfg).ids
        t_remask = median_time(lambda: sample_remask(model, pb, rm_cfg), reps) / REMASK_STEPS
    med = {k: statistics.median(v) for k, v in times.items() if v}
    med["blocks"], med["head"] = t_blocks, t_head
    fl = sde_call_work(model, P, L, M)
    needed = sum(fl.values())
    needed_rm = fl["blocks"] + fl["head"]
    med["remask_step"] = t_remask
    work = {"slot": fl["slot"], "values": fl["values"], "converter": fl["slot"] + fl["values"],
            "blocks": fl["blocks"], "head": fl["head"], "posterior": fl["posterior"], "call": needed,
            "remask_step": needed_rm}
    return {"times": med, "flops": fl, "needed_flops": needed, "needed_remask_flops": needed_rm, "peak_gflops": peak,
            "ratio": med["call"] / (needed / peak / 1e9), "remask_ratio": t_remask / (needed_rm / peak / 1e9),
            "part_ratios": {k: med[k] / (w / peak / 1e9) for k, w in work.items()},
            "remask_tokens": rm_tokens.tolist(), "sparse": sparse, "t_sample": t_sample,
            "tokens": tokens.tolist(), "t_sparse_sample": t_sparse_sample,
            "sparse_tokens_changed": int((sparse_tokens != tokens).sum()), "head_layouts": layouts,
            "environment": run_environment()}


def head_layouts(x: torch.Tensor, w: torch.Tensor, reps: int) -> dict[str, dict]:
    """The output head x Wᵀ (x: (L, H), W: (V, H) as stored) in other layouts: time (s) and bit-equality with
    `F.linear` (what the backbone runs)."""
    ref = F.linear(x, w)
    wt = w.t().contiguous()  # a one-time transposed copy: + the head's size in memory
    out = torch.empty_like(ref)
    variants = {"F.linear(x, W), W (V, H) as stored, one product": lambda: F.linear(x, w),
                "mm(x, Wᵀ) into a reused output": lambda: torch.mm(x, w.T, out=out),
                "mm(x, Wᵀ contiguous copy)": lambda: torch.mm(x, wt),
                "W xᵀ, logits transposed (V, L)": lambda: torch.mm(w, x.T)}
    try:  # the backbone's head: vocabulary chunks of the weight
        from dsl_llada.core.backbones.base import head_linear
        variants["head_linear: 4 MB vocabulary chunks of W (used)"] = lambda: head_linear(x, w)
    except ImportError:
        pass
    try:  # MKL's packed-weight GEMM (a private torch op; fp32 only; + the head's size in memory)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
        variants["MKL packed weight (torch.ops.mkl._mkl_linear)"] = \
            lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, x.shape[0])
    except (AttributeError, RuntimeError):
        pass
    res = {}
    for name, fn in variants.items():
        o = fn()
        o = o.T if o.shape != ref.shape else o
        res[name] = {"t": median_time(fn, reps), "bitwise": bool(torch.equal(o, ref))}
    return res


def run_side(src: Path, a: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, str(ENTRY), "parts", "--measure", "--reps", str(a.reps), "--tolerance", str(a.tolerance),
           "--clock", a.clock] + ([] if a.threads is None else ["--threads", str(a.threads)])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the measurement on {src} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--before", help="git revision whose src/ is measured in alternate processes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="timed calls per part and SNR (median)")
    ap.add_argument("--tolerance", type=float, default=1e-6, help="sparse converter tolerance to report")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or the process's CPU time (with --threads 1; on a shared machine it leaves out "
                         "the time spent waiting for a core)")
    ap.add_argument("--json", default=None, help="write every process's result and this run's environment here")
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks/")


def run(a: argparse.Namespace) -> None:
    if a.rounds < 1 or a.reps < 1:
        a.parser.error(f"--rounds {a.rounds} and --reps {a.reps} must be at least 1")
    if a.clock == "cpu" and torch.get_num_threads() != 1:
        a.parser.error(f"--clock cpu needs --threads 1 (got {torch.get_num_threads()}): CPU time sums the threads' "
                       "times")
    if a.measure:
        print(json.dumps(measure(a.reps, a.tolerance, a.clock == "cpu")))
        return
    sides: dict[str, list[dict]] = {"after": []}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"after": ROOT / "src"}
        if a.before:
            rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.before], check=True,
                                 capture_output=True, text=True).stdout.strip()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            srcs = {"before": Path(tmp) / "src", **srcs}
            sides = {"before": [], "after": []}
        for r in range(a.rounds):
            for side, src in srcs.items():
                sides[side].append(run_side(src, a))
                last = sides[side][-1]
                print(f"round {r} {side}: call {1e3 * last['times']['call']:.1f} ms, {last['ratio']:.2f}x FLOP time; "
                      f"remasking step {1e3 * last['times']['remask_step']:.1f} ms, {last['remask_ratio']:.2f}x",
                      file=sys.stderr)
    result = {"sides": sides, "before": a.before, "tolerance": a.tolerance, "clock": a.clock, "summary": summary(sides),
              "environment": run_environment()}
    print(json.dumps(result, indent=1))
    write_json(a.json, {k: v for k, v in result.items() if k != "environment"})
    if a.write:
        write_markdown(result, command_line())


def write_markdown(r: dict, command: str) -> None:
    sides = r["sides"]
    names = list(sides)

    def med(side: str, key: str) -> float:
        return statistics.median(run["times"][key] for run in sides[side])

    def spread(side: str, key: str) -> str:
        xs = [1e3 * run["times"][key] for run in sides[side]]
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"

    after = sides["after"]
    fl = after[0]["flops"]
    peak = statistics.median(run["peak_gflops"] for run in after)
    rows = [("converter: slot logits βzKᵀ+b", "slot", fl["slot"]), ("converter: softmax over V+1", "softmax", None),
            ("converter: πWᵀ+c (dense)", "values", fl["values"]),
            ("converter, whole (as the sampler: reused buffer)", "converter", fl["slot"] + fl["values"]),
            ("backbone blocks (256 positions)", "blocks", fl["blocks"]),
            ("output head + final norm (128 response rows)", "head", fl["head"]),
            ("top-512 selection (`top_m_values`)", "topm", None),
            ("posterior mean, whole", "posterior", fl["posterior"]),
            ("**whole SDE call** (`Denoiser`)", "call", after[0]["needed_flops"]),
            (f"**one remasking step** ({REMASK_STEPS}-step run / {REMASK_STEPS})", "remask_step",
             after[0]["needed_remask_flops"])]
    head = ("| component | GFLOP | " + " | ".join(f"{n}: ms (min–max)" for n in names)
            + " | after: of peak | after: × FLOP time |")
    lines = [head, "|---|---|" + "---|" * len(names) + "---|---|"]
    for label, key, flops in rows:
        pct = f"{100 * flops / med('after', key) / 1e9 / peak:.0f} %" if flops else "–"
        times = f"{med('after', key) / (flops / peak / 1e9):.2f}×" if flops else "–"
        lines.append(f"| {label} | {flops / 1e9:.3f} | " if flops else f"| {label} | – | ")
        lines[-1] += " | ".join(spread(n, key) for n in names) + f" | {pct} | {times} |"
    ratio = {n: [run["ratio"] for run in sides[n]] for n in names}
    ratio_line = "; ".join(f"{n} **{statistics.median(v):.2f}×** ({min(v):.2f}–{max(v):.2f})"
                           for n, v in ratio.items())
    rm_ratio = {n: [run["remask_ratio"] for run in sides[n]] for n in names}
    rm_line = "; ".join(f"{n} **{statistics.median(v):.2f}×** ({min(v):.2f}–{max(v):.2f})"
                        for n, v in rm_ratio.items())
    rm_same = all(b["remask_tokens"] == a_["remask_tokens"] for b, a_ in zip(sides.get("before", after), after))
    same = all(b["tokens"] == a_["tokens"] for b, a_ in zip(sides.get("before", after), after))
    sample = "; ".join(f"{n} {statistics.median(run['t_sample'] for run in sides[n]):.2f} s" for n in names)
    before = sides.get("before")
    sp = ["| SNR γ | kept slots at tol, mean (max) | exactly non-zero slots, mean (max) | dense πWᵀ ms | sparse ms"
          + (" | sparse ms, before |" if before else " |"), "|---|---|---|---|---|" + ("---|" if before else "")]
    for i, s in enumerate(after[-1]["sparse"]):
        sp.append(f"| {s['gamma']:.2f} | {s['kept_mean']:.1f} ({s['kept_max']}) | {s['nonzero_mean']:.1f} "
                  f"({s['nonzero_max']}) | {1e3 * s['t_dense']:.2f} | {1e3 * s['t_sparse']:.2f} |"
                  + (f" {1e3 * before[-1]['sparse'][i]['t_sparse']:.2f} |" if before else ""))
    loads = [run["environment"].get("load_average_start") for n in names for run in sides[n]]
    body = "\n".join([
        f"Command: `{command}`", "",
        f"Each side in its own process, sides alternating ({len(after)} rounds; before = `{r['before']}`, after = this "
        f"tree); 1-minute load average at the start of each process: {', '.join(str(x) for x in loads)} (a shared "
        "2-core machine: the ratios within a round are the figures to trust).", "",
        "One SDE denoiser call (prompt 128 + response 128, batch 1, LLaDA-shaped d_model 256 / 4 layers / V 32,768 / "
        "d 100, fp32): per-part medians over the rounds of each side's median over the NFE-16 schedule's SNRs, "
        + ("in process CPU time at 1 thread (the matmul peak too; time spent waiting for a core left out). "
           if r.get("clock") == "cpu" else "in wall time. ") +
        f"Measured fp32 matmul peak (after side, median): **{peak:.1f} GFLOP/s**.", "", *lines, "",
        f"Whole call over the FLOP time of its needed work: {ratio_line} (target 1.5×). Seeded NFE-16 SDE sample "
        f"per side: {sample}; tokens before and after: {'identical' if same else 'DIFFERENT'}.", "",
        f"One remasking step over the FLOP time of its needed work (blocks + head on the block): {rm_line} (target "
        f"1.5×); {REMASK_STEPS}-step remasking tokens before and after: {'identical' if rm_same else 'DIFFERENT'}.",
        "",
        f"Sparse converter at tolerance {r['tolerance']:g} on the after side "
        "(`SDEConfig.converter_tolerance`, off by default), at the same states:", "", *sp, "",
        f"Seeded NFE-16 SDE sample with the sparse converter (after side): "
        f"{statistics.median(run['t_sparse_sample'] for run in after):.2f} s against "
        f"{statistics.median(run['t_sample'] for run in after):.2f} s dense; tokens changed against dense: "
        f"{max(run['sparse_tokens_changed'] for run in after)} of {len(after[0]['tokens'][0])}.", "",
        "Output head layouts (after side, the same 128 × 256 normed rows and the (32,768, 256) head weight):", "",
        "| layout | ms (min–max over rounds) | bit-identical to `F.linear` |", "|---|---|---|",
        *[f"| {name} | " + (lambda xs: f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})")(
            [1e3 * run["head_layouts"][name]["t"] for run in after]) + f" | {'yes' if v['bitwise'] else 'no'} |"
          for name, v in after[-1]["head_layouts"].items()]])
    write_section("One SDE call, part by part: before and after", body)
