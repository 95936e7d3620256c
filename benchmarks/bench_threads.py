"""How OpenMP's threads should wait on a shared CPU: the default thread count (`usable_cpus()`) against one thread,
with CPU-bound neighbour processes running (`--neighbours N`; 0 is the idle case), under OpenMP's own wait policy
(unset), spin waiting (ACTIVE), passive waiting (PASSIVE) and bounded spinning (GOMP_SPINCOUNT; the CLI sets 1000,
`dsl_llada/openmp.py`).

Each variant runs in a fresh process (OpenMP reads its wait settings once, when the runtime starts), timing `--reps`
seeded SDE sampling calls after one warm-up call on a random LLaDA-shaped model: `toy` is the demo's size (V 313,
d 128, batch 48), `bench` the benchmark model of bench_vs_authors.py at batch 1 and NFE 64 (V 32,768, d 256,
prompt 128 + 128 tokens); the variants are interleaved round by round and the medians and per-round ratios of one
run are reported.

Usage:  python benchmarks/bench_threads.py [--rounds 3] [--neighbours 1] [--shape toy|small|bench] [--json OUT] [--write]
        python benchmarks/bench_threads.py --report OUT.json   (write docs/benchmarks/'s section from a saved run)
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
SHAPES = {"toy": dict(vocab=313, d_model=128, n_layers=4, n_heads=4, noise_dim=64, batch=48, prompt=24, gen=32, nfe=16),
          "small": dict(vocab=4096, d_model=512, n_layers=8, n_heads=8, noise_dim=64, batch=8, prompt=64, gen=64,
                        nfe=8),
          # the LLaDA-shaped benchmark model of bench_vs_authors.py at the long-NFE setting (batch 1, NFE 64)
          "bench": dict(vocab=32768, d_model=256, n_layers=4, n_heads=4, noise_dim=100, batch=1, prompt=128, gen=128,
                        nfe=64)}


def child(shape: str, threads: int | None, reps: int) -> dict:
    import torch

    from benchlib import llada_shaped, random_prompts
    from dsl_llada.config import SDEConfig
    from dsl_llada.runtime.environment import set_threads
    from dsl_llada.sampling import sample_sde

    n = set_threads(threads)
    s = SHAPES[shape]
    model = llada_shaped(vocab=s["vocab"], d_model=s["d_model"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                         noise_dim=s["noise_dim"])
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
    "default, GOMP_SPINCOUNT=300": (None, {"GOMP_SPINCOUNT": "300"}),
    "default, GOMP_SPINCOUNT=1000": (None, {"GOMP_SPINCOUNT": "1000"}),
    "default, GOMP_SPINCOUNT=3000": (None, {"GOMP_SPINCOUNT": "3000"}),
}
"""GOMP_SPINCOUNT (GNU OpenMP, which the Linux torch wheels use) bounds how long a waiting thread spins before it
sleeps; with OMP_WAIT_POLICY unset it applies as given."""
SPIN = "default, OMP_WAIT_POLICY=ACTIVE"
PASSIVE = "default, OMP_WAIT_POLICY=PASSIVE"


def run_variant(name: str, shape: str, reps: int) -> dict:
    threads, extra = VARIANTS[name]
    from dsl_llada.runtime.openmp import VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in (*VARIABLES, "OMP_NUM_THREADS")}
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
    ap.add_argument("--json", type=Path, default=None, help="also write the result (with every round) to this file")
    ap.add_argument("--report", type=Path, default=None,
                    help="measure nothing: write docs/benchmarks/'s section from a result saved with --json")
    ap.add_argument("--write", action="store_true", help="write the result to docs/benchmarks/")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.shape, a.threads, a.reps)))
        return
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
    if a.report is not None:
        write_markdown(json.loads(a.report.read_text()))
        return
    result = measure(a)
    print(json.dumps(result, indent=2))
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    if a.write:
        write_markdown(result)


def measure(a: argparse.Namespace) -> dict:
    """Every variant once per round, each in a fresh process, with `a.neighbours` CPU-bound processes running."""
    from benchlib import bench_environment, med_spread
    from dsl_llada.runtime.environment import finish_record

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

    def against(t: list[float], ref: list[float]) -> tuple[float, list[float]]:
        """Per-round ratios to a reference variant (the figure to trust on a shared machine) and their median."""
        rounds = [x / o for x, o in zip(t, ref)]
        return statistics.median(rounds), rounds

    rows = []
    for n, t in times.items():
        row = {"variant": n, "threads": threads[n], "median_s": med_spread(t)[0], "min_s": med_spread(t)[1],
               "max_s": med_spread(t)[2], "times_s": t}
        for key, ref in (("vs_one_thread", "one thread"), ("vs_spin", SPIN), ("vs_passive", PASSIVE)):
            row[key], row[f"{key}_rounds"] = against(t, times[ref])
        rows.append(row)
    return {"shape": a.shape, **SHAPES[a.shape], "neighbours": a.neighbours, "rounds": a.rounds, "reps": a.reps,
            "rows": rows, "environment": env, "command": command_line(a)}


def command_line(a: argparse.Namespace) -> str:
    extra = f" --json {a.json}" if a.json is not None else ""
    return (f"python benchmarks/bench_threads.py --shape {a.shape} --rounds {a.rounds} --reps {a.reps} "
            f"--neighbours {a.neighbours}{extra} --write")


def write_markdown(r: dict) -> None:
    from benchlib import write_section

    n = r["neighbours"]
    note = f" {r['note']}" if r.get("note") else ""
    lines = [f"Command: `{r['command']}`{note}. Seeded SDE sampling (NFE {r['nfe']}, batch {r['batch']}, prompt "
             f"{r['prompt']} + {r['gen']} generated tokens) on a random LLaDA-shaped model (V {r['vocab']}, d "
             f"{r['d_model']}, {r['n_layers']} layers), {n} CPU-bound neighbour process(es) running; each variant a "
             f"fresh process, variants interleaved, median of {r['rounds']} rounds (each the median of {r['reps']} "
             f"calls after a warm-up call).", "",
             "| variant | intra-op threads | median s per call | spread | vs one thread, same round (median; "
             "each round) | vs spin waiting (ACTIVE), same round | vs passive waiting (PASSIVE), same round |",
             "|---|---|---|---|---|---|---|"]

    def ratio(row: dict, key: str) -> str:
        return f"{row[key]:.2f}x ({', '.join(f'{x:.2f}' for x in row[key + '_rounds'])})"

    lines += [f"| {row['variant']} | {row['threads']} | {row['median_s']:.3f} | {row['min_s']:.3f}–{row['max_s']:.3f} | "
              f"{ratio(row, 'vs_one_thread')} | {ratio(row, 'vs_spin')} | {ratio(row, 'vs_passive')} |"
              for row in r["rows"]]
    lines += ["", f"Environment: {env_line(r['environment'])}."]
    title = (f"OpenMP waiting with {n} busy neighbour(s) ({r['shape']})" if n else
             f"OpenMP waiting on an idle machine ({r['shape']})")
    write_section(title, "\n".join(lines))


def env_line(env: dict) -> str:
    return (f"{env['cpu_model']} ({env['cpu_capability']}), {env['usable_cpus']} usable CPUs, torch "
            f"{env['libraries']['torch']}, dsl-llada {env['dsl_llada']} at "
            f"{(env.get('git') or {}).get('commit', 'no checkout')[:9]}, load average "
            f"{env['load_average_start']} -> {env.get('load_average_end')} (machine shared with other jobs)")


if __name__ == "__main__":
    main()
