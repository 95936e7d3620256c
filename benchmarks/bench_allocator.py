"""What keeping large buffers between sampler calls buys: glibc's malloc thresholds as every dsl-llada command sets
them (`dsl_llada/allocator.py`) against glibc's own.

Each variant runs in a fresh process: `glibc default` (allocations above 32 MB get fresh pages from the kernel on every
call) and `kept` (`allocator.keep_large_buffers`, set before torch loads). Each times seeded DSL-SDE (NFE 16) and
LLaDA remasking (16 steps) on the LLaDA-shaped benchmark model (d 256, 4 layers, V 32,768, prompt 128 + 128 tokens,
fp32) at each of --batches, one warm-up call first. It reports the median time per sample, the minor page faults
per call, the peak resident memory and the resident memory left after the calls. The variants alternate for
--rounds rounds (the first variant alternating too), the ratios are taken within each round, and the two variants'
tokens are compared.

Usage:  python benchmarks/bench_allocator.py [--rounds 3] [--batches 1 8] [--json OUT] [--write]
        python benchmarks/bench_allocator.py --report OUT.json   (write the section from a saved run)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("glibc default", "kept")


def child(kept: bool, batches: list[int], threads: int) -> dict:
    """One process's measurement (kept: the CLI's setting, made before torch is imported)."""
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
    from dsl_llada.runtime import allocator

    if kept:
        allocator.keep_large_buffers({})
    import resource

    import torch
    from benchlib import llada_shaped, random_prompts

    from dsl_llada.config import RemaskConfig, SDEConfig
    from dsl_llada.runtime.environment import set_threads
    from dsl_llada.sampling.remask import sample_remask
    from dsl_llada.sampling.sde import sample_sde

    set_threads(threads)
    model = llada_shaped()
    out: dict = {"malloc": dict(allocator.applied) or None, "runs": {}}
    for b in batches:
        pb = random_prompts(model, b, 128)
        sde, remask = SDEConfig(nfe=16, gen_length=128), RemaskConfig(steps=16, gen_length=128)
        runs = {"SDE NFE 16": (sde.nfe, lambda: sample_sde(model, pb, sde, generator=torch.Generator().manual_seed(0))),
                "remasking 16 steps": (remask.steps, lambda: sample_remask(model, pb, remask))}
        for name, (calls, run) in runs.items():
            run()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = time.perf_counter()
            ids = run().ids
            seconds = time.perf_counter() - t
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            out["runs"][f"{name}, batch {b}"] = {
                "s_per_sample": seconds / b, "faults_per_call": faults / calls,
                "tokens": hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]}
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["rss_after_mib"] = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return out


def run_child(variant: str, a: argparse.Namespace) -> dict:
    from dsl_llada.runtime.allocator import USER_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in USER_VARIABLES}
    cmd = [sys.executable, __file__, "--child", variant, "--threads", str(a.threads), "--batches",
           *map(str, a.batches)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(res.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of both variants")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], choices=range(1, 33), metavar="1-32")
    ap.add_argument("--json", type=Path, default=None, help="also write the result (every round) to this file")
    ap.add_argument("--write", action="store_true", help="write the result to docs/benchmarks/")
    ap.add_argument("--report", type=Path, default=None,
                    help="measure nothing: write docs/benchmarks/'s section from a result saved with --json")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: the CPUs this process may use)")
    if "--child" in sys.argv:  # a measuring process: no benchlib (it imports torch) before the setting is made
        a = ap.parse_args()
        print(json.dumps(child(a.child == "kept", a.batches, a.threads)))
        return
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
    from benchlib import parse_args, run_environment

    a = parse_args(ap)
    if a.report is not None:
        write_markdown(json.loads(a.report.read_text()))
        return
    a.threads = a.threads or run_environment()["threads"]["intra_op"]
    rounds = []
    for r in range(a.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        rounds.append({v: run_child(v, a) for v in order})
        print(json.dumps({"round": r, **rounds[-1]}), flush=True)
    result = {"rounds": rounds, "batches": a.batches, "environment": run_environment(),
              "command": ("GOMP_SPINCOUNT=" + os.environ["GOMP_SPINCOUNT"] + " " if "GOMP_SPINCOUNT" in os.environ else "")
              + f"python benchmarks/bench_allocator.py --rounds {a.rounds} --batches "
                         f"{' '.join(map(str, a.batches))} --threads {a.threads}"}
    print(json.dumps(summary(result), indent=1))
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    if a.write:
        write_markdown(result)


def summary(result: dict) -> dict:
    """Per run: each variant's median time per sample and faults per call, and the within-round ratio kept/default."""
    rounds = result["rounds"]
    out = {}
    for run in rounds[0][VARIANTS[0]]["runs"]:
        t = {v: [r[v]["runs"][run]["s_per_sample"] for r in rounds] for v in VARIANTS}
        ratios = [k / d for k, d in zip(t["kept"], t["glibc default"])]
        out[run] = {"s_per_sample": {v: statistics.median(t[v]) for v in VARIANTS},
                    "faults_per_call": {v: statistics.median(r[v]["runs"][run]["faults_per_call"] for r in rounds)
                                        for v in VARIANTS},
                    "kept_over_default": {"median": statistics.median(ratios), "rounds": ratios},
                    "identical_tokens": all(r[v]["runs"][run]["tokens"] == rounds[0][VARIANTS[0]]["runs"][run]["tokens"]
                                            for r in rounds for v in VARIANTS)}
    out["memory_mib"] = {v: {key: statistics.median(r[v][key] for r in rounds) for key in ("peak_rss_mib", "rss_after_mib")}
                         for v in VARIANTS}
    out["malloc"] = {v: rounds[0][v]["malloc"] for v in VARIANTS}
    return out


def write_markdown(result: dict) -> None:
    from benchlib import write_section

    from dsl_llada.runtime.environment import environment_footer

    s = summary(result)
    lines = [f"Command: `{result['command']} --write`. Each variant in a fresh process, the two alternating for "
             f"{len(result['rounds'])} rounds; one warm-up call, then one timed call per sampler and batch; ratios "
             "within each round. LLaDA-shaped benchmark model (d 256, 4 layers, V 32,768, noise dim 100), prompt "
             "128 + 128 tokens, fp32. `kept` = glibc's mmap and trim thresholds raised to "
             f"{max((s['malloc']['kept'] or {'-': 0}).values()):,} bytes (what every `dsl-llada` command sets); "
             "`glibc default` = its own thresholds.", "",
             "| run | s per sample, glibc default | s per sample, kept | kept / default (median; each round) | "
             "page faults per call, default → kept | identical tokens |", "|---|---|---|---|---|---|"]
    for run, row in s.items():
        if run in ("memory_mib", "malloc"):
            continue
        t, f, k = row["s_per_sample"], row["faults_per_call"], row["kept_over_default"]
        lines.append(f"| {run} | {t['glibc default']:.3f} | {t['kept']:.3f} | **{k['median']:.2f}x** "
                     f"({', '.join(f'{x:.2f}' for x in k['rounds'])}) | {f['glibc default']:,.0f} → {f['kept']:,.0f} | "
                     f"{'yes' if row['identical_tokens'] else 'no'} |")
    m = s["memory_mib"]
    lines += ["", f"Memory (MiB, median over rounds): peak resident {m['glibc default']['peak_rss_mib']:.0f} (default) "
                  f"against {m['kept']['peak_rss_mib']:.0f} (kept); resident after the calls "
                  f"{m['glibc default']['rss_after_mib']:.0f} against {m['kept']['rss_after_mib']:.0f}: the kept "
                  "buffers stay with the process until it exits.", "",
              "Reading: at batch 8 the logits (128 MB) and the converter's buffers are above glibc's own mmap threshold, "
              "so every call faulted them in afresh; kept, no call after the first faults, and the per-sample time "
              "falls by the share that paging took. At batch 1 the buffers are below that threshold and glibc reuses "
              "them either way (the differences there are within the round-to-round spread).", "",
              environment_footer(result["environment"])]
    write_section("Large buffers between calls", "\n".join(lines))


if __name__ == "__main__":
    main()
