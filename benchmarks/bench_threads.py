"""The intra-op thread default on a shared CPU: the default count (`usable_cpus()`) against one thread, with one
CPU-bound neighbour process running (or none: `--neighbours 0`, the idle case), under OpenMP's own wait policy
(unset), spin waiting (ACTIVE) and passive waiting (PASSIVE, what the CLI sets).

Each variant runs in a fresh process (OpenMP reads OMP_WAIT_POLICY once, when the runtime starts), timing `--reps`
seeded SDE sampling calls on a demo-shaped model (the toy world's vocabulary and size) after one warm-up call; the
variants are interleaved round by round and the medians and ratios of one run are reported.

Usage:  python benchmarks/bench_threads.py [--rounds 3] [--neighbours 1] [--shape toy|small] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"toy": dict(vocab=313, d_model=128, n_layers=4, n_heads=4, batch=48, prompt=24, gen=32, nfe=16),
          "small": dict(vocab=4096, d_model=512, n_layers=8, n_heads=8, batch=8, prompt=64, gen=64, nfe=8)}


def child(shape: str, threads: int | None, reps: int) -> dict:
    import torch

    from benchlib import llada_shaped, random_prompts
    from dsl_llada.config import SDEConfig
    from dsl_llada.environment import set_threads
    from dsl_llada.sampling import sample_sde

    n = set_threads(threads)
    s = SHAPES[shape]
    model = llada_shaped(vocab=s["vocab"], d_model=s["d_model"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                         noise_dim=64)
    pb = random_prompts(model, s["batch"], s["prompt"])
    cfg = SDEConfig(nfe=s["nfe"], gen_length=s["gen"])

    def once(seed: int) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            sample_sde(model, pb, cfg, generator=torch.Generator().manual_seed(seed))
        return time.perf_counter() - t

    once(0)
    times = [once(i + 1) for i in range(reps)]
    return {"threads": n, "median_s": statistics.median(times)}


VARIANTS = {  # name -> (threads or None for the default, extra environment)
    "default": (None, {}),
    "one thread": (1, {}),
    "default, OMP_WAIT_POLICY=PASSIVE": (None, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "default, OMP_WAIT_POLICY=ACTIVE": (None, {"OMP_WAIT_POLICY": "ACTIVE"}),
}
SPIN = "default, OMP_WAIT_POLICY=ACTIVE"


def run_variant(name: str, shape: str, reps: int) -> dict:
    threads, extra = VARIANTS[name]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--child", "--shape", shape, "--reps", str(reps)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="toy", choices=sorted(SHAPES))
    ap.add_argument("--reps", type=int, default=5, help="timed calls per process (median reported)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of all variants")
    ap.add_argument("--neighbours", type=int, default=1, help="CPU-bound neighbour processes during the timings")
    ap.add_argument("--write", action="store_true", help="write the result to docs/benchmarks.md")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.shape, a.threads, a.reps)))
        return
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
    from benchlib import bench_environment, med_spread, write_section
    from dsl_llada.environment import finish_record

    env = bench_environment()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.neighbours)]
    try:
        times: dict[str, list[float]] = {n: [] for n in VARIANTS}
        threads: dict[str, int] = {}
        for r in range(a.rounds):
            for name in VARIANTS:
                res = run_variant(name, a.shape, a.reps)
                times[name].append(res["median_s"])
                threads[name] = res["threads"]
                print(json.dumps({"round": r, "variant": name, **res}), flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    env = finish_record(env)
    one, spin = times["one thread"], times[SPIN]
    rows = [{"variant": n, "threads": threads[n], "median_s": med_spread(t)[0], "min_s": med_spread(t)[1],
             "max_s": med_spread(t)[2],  # the ratio to one thread within each round (the figure to trust), median
             "vs_one_thread": statistics.median(x / o for x, o in zip(t, one)),
             "vs_one_thread_rounds": [x / o for x, o in zip(t, one)],
             "vs_spin": statistics.median(x / o for x, o in zip(t, spin)),  # the same against spin waiting
             "vs_spin_rounds": [x / o for x, o in zip(t, spin)]} for n, t in times.items()]
    result = {"shape": a.shape, **SHAPES[a.shape], "neighbours": a.neighbours, "rounds": a.rounds, "reps": a.reps,
              "rows": rows, "environment": env}
    print(json.dumps(result, indent=2))
    if a.write:
        s = SHAPES[a.shape]
        lines = [f"Command: `python benchmarks/bench_threads.py --shape {a.shape} --rounds {a.rounds} --reps {a.reps} "
                 f"--neighbours {a.neighbours} --write`. Seeded SDE sampling (NFE {s['nfe']}, batch {s['batch']}, "
                 f"{s['gen']} generated tokens) on a random demo-shaped model (V {s['vocab']}, d {s['d_model']}, "
                 f"{s['n_layers']} layers), {a.neighbours} CPU-bound neighbour process(es) running; each variant a "
                 f"fresh process, variants interleaved, median of {a.rounds} rounds (each the median of {a.reps} "
                 f"calls).", "",
                 "| variant | intra-op threads | median s per call | spread | vs one thread, same round (median; "
                 "each round) | vs spin waiting (ACTIVE), same round (median; each round) |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['threads']} | {r['median_s']:.3f} | {r['min_s']:.3f}–{r['max_s']:.3f} | "
                  f"{r['vs_one_thread']:.2f}x ({', '.join(f'{x:.2f}' for x in r['vs_one_thread_rounds'])}) | "
                  f"{r['vs_spin']:.2f}x ({', '.join(f'{x:.2f}' for x in r['vs_spin_rounds'])}) |"
                  for r in rows]
        lines += ["", f"Environment: {env_line(env)}."]
        title = f"Thread default under contention ({a.shape})" if a.neighbours else \
            f"Passive OpenMP waiting on an idle machine ({a.shape})"
        write_section(title, "\n".join(lines))


def env_line(env: dict) -> str:
    return (f"{env['cpu_model']} ({env['cpu_capability']}), {env['usable_cpus']} usable CPUs, torch "
            f"{env['libraries']['torch']}, dsl-llada {env['dsl_llada']} at "
            f"{(env.get('git') or {}).get('commit', 'no checkout')[:9]}, load average "
            f"{env['load_average_start']} -> {env.get('load_average_end')} (machine shared with other jobs)")


if __name__ == "__main__":
    main()
