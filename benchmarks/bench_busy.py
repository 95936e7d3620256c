"""Speed that survives a busy machine: the library's samplers and the restatement of the authors' per-call work,
idle and beside busy neighbour processes, in a program that calls `dsl_llada.configure_process()` and in one that
does not.

Neighbour load: `--neighbours N` processes (default: 2 x the CPUs this process may use), each a tight integer loop
in Python (a linear congruential generator: one core's worth of CPU, almost no memory traffic), started by this
script before each loaded phase and stopped after it; their count and kind are in the result.

Variants, each one child process that lives through the whole run (OpenMP reads its wait settings once, when torch
loads it); `--variants` picks them:
  openmp-default     imports the library and torch and sets the thread count, nothing else: OpenMP's own waiting
                     (GNU OpenMP: a 300,000-iteration spin before a thread sleeps), what a library user got before
  configure-process  `dsl_llada.configure_process(threads=...)` before torch is imported: the CLI's settings
  passive            `dsl_llada.configure_process(threads=..., openmp_wait="passive")`
  wait-unchanged     `dsl_llada.configure_process(threads=..., openmp_wait="unchanged")`: everything but the waiting
  one-thread         `dsl_llada.configure_process(threads=1, openmp_wait="unchanged")`
Each child times, in rotating order: DSL-SDE at NFE `--nfe` and LLaDA remasking at `--nfe` steps (the library's
`sample_sde` / `sample_remask`), and the restatements of the authors' per-call work for both (bench_vs_authors.py),
batch 1, LLaDA-shaped model (d 256, 4 layers, V 32,768, noise dim 100), prompt 128 + 128 tokens, fp32, after one
untimed call of each. A round is an idle phase and a loaded phase (their order alternates by round); in each phase
every variant runs once (order rotating). The figure per sampler and variant is loaded / idle time within each
round, median and range over the rounds, with the 1-minute load average before and after each phase.

Tokens: each child checks that the library's tokens equal the restatement's, and this script that every variant
and phase gives the same tokens; it exits 1 otherwise.

Usage:  python benchmarks/bench_busy.py [--rounds 3] [--nfe 16] [--neighbours N] [--threads T] [--json OUT] [--write]
        python benchmarks/bench_busy.py --report OUT.json   (write docs/benchmarks/'s section from a saved run)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> configure_process keyword arguments (None: the call is not made)
    "openmp-default": None,
    "configure-process": {},
    "passive": {"openmp_wait": "passive"},
    "wait-unchanged": {"openmp_wait": "unchanged"},
    "one-thread": {"openmp_wait": "unchanged", "threads": 1},
}
SAMPLERS = ("sde", "authors_sde", "remask", "authors_remask")
"""The timed calls; each library sampler beside its restatement (`REFERENCE`)."""
REFERENCE = {"sde": "authors_sde", "remask": "authors_remask"}
HOG = ("import os\nparent = os.getppid()\nx = 1\nwhile os.getppid() == parent:\n    for _ in range(100000):\n"
       "        x = (x * 1103515245 + 12345) & 0xFFFFFFFF\n")
"""One neighbour: a tight integer loop (pure CPU) that ends when this script does."""
TITLE = "The library on a busy machine"


# -- the child: one variant, measured on request -------------------------------------------------------------------
def child(variant: str, threads: int | None, nfe: int) -> None:
    """Apply the variant's settings (before torch loads), build the model, time every sampler once per `run` line
    read from stdin, and answer each with one JSON line."""
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
    import dsl_llada

    kwargs = VARIANTS[variant]
    settings = None if kwargs is None else dsl_llada.configure_process(**{"threads": threads, **kwargs})
    import torch
    from bench_vs_authors import authors_remask, authors_sde
    from benchlib import llada_shaped, random_prompts

    from dsl_llada.config import RemaskConfig, SDEConfig
    from dsl_llada.runtime.environment import set_threads
    from dsl_llada.runtime.openmp import VARIABLES
    from dsl_llada.sampling.remask import sample_remask
    from dsl_llada.sampling.sde import sample_sde

    if settings is None:
        set_threads(threads)
    model = llada_shaped()
    pb = random_prompts(model, 1, 128)
    sde_cfg = SDEConfig(nfe=nfe, gen_length=128, predictor_noise=True)
    rm_cfg = RemaskConfig(steps=nfe, gen_length=128)
    calls = {"sde": lambda: sample_sde(model, pb, sde_cfg, generator=torch.Generator().manual_seed(0)).ids,
             "authors_sde": lambda: authors_sde(model, pb.ids, sde_cfg, torch.Generator().manual_seed(0)),
             "remask": lambda: sample_remask(model, pb, rm_cfg).ids,
             "authors_remask": lambda: authors_remask(model.backbone, pb.ids, rm_cfg)}
    with torch.no_grad():
        for fn in calls.values():
            fn()
    print(json.dumps({"ready": True, "threads": torch.get_num_threads(),
                      "openmp": {k: os.environ.get(k) for k in VARIABLES},
                      "malloc": None if settings is None else settings.malloc}), flush=True)
    turn = 0
    for line in sys.stdin:
        if line.strip() != "run":
            break
        times: dict[str, float] = {}
        ids: dict[str, torch.Tensor] = {}
        for name in SAMPLERS[turn % len(SAMPLERS):] + SAMPLERS[:turn % len(SAMPLERS)]:
            t = time.perf_counter()
            with torch.no_grad():
                ids[name] = calls[name]()
            times[name] = time.perf_counter() - t
        turn += 1
        print(json.dumps({"s": times, "identical": {k: torch.equal(ids[k], ids[ref]) for k, ref in REFERENCE.items()},
                          "tokens": {k: hashlib.sha256(ids[k].cpu().numpy().tobytes()).hexdigest()[:16]
                                     for k in REFERENCE}}), flush=True)


# -- the parent ----------------------------------------------------------------------------------------------------
class Child:
    """One variant's process, kept between phases."""

    def __init__(self, variant: str, threads: int, nfe: int) -> None:
        from dsl_llada.runtime.openmp import VARIABLES

        env = {k: v for k, v in os.environ.items() if k not in (*VARIABLES, "OMP_NUM_THREADS")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", variant, "--threads", str(threads),
                                      "--nfe", str(nfe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.info = self._answer()

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a child process ended early (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self, *, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        elif self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def start_neighbours(n: int) -> list[subprocess.Popen]:
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    time.sleep(1.0)  # let the scheduler spread them before the timing starts
    return hogs


def stop_neighbours(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait()


def measure(a: argparse.Namespace) -> dict:
    from dsl_llada.runtime.environment import load_average, usable_cpus

    neighbours = a.neighbours if a.neighbours is not None else 2 * usable_cpus()
    threads = a.threads if a.threads is not None else usable_cpus()
    children: dict[str, Child] = {}
    finished = False
    try:
        for v in a.variants:
            children[v] = Child(v, threads, a.nfe)
        runs: list[dict] = []
        for r in range(a.rounds):
            for phase in (("idle", "loaded") if r % 2 == 0 else ("loaded", "idle")):
                before = load_average()
                hogs = start_neighbours(neighbours) if phase == "loaded" else []
                try:
                    order = a.variants[r % len(a.variants):] + a.variants[:r % len(a.variants)]
                    out = {v: children[v].run() for v in order}
                finally:
                    stop_neighbours(hogs)
                runs.append({"round": r, "phase": phase, "load_before": before, "load_after": load_average(),
                             "variants": out})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        finished = True
    finally:
        for c in children.values():
            c.close(kill=not finished)
    return summarise({"nfe": a.nfe, "rounds": a.rounds, "threads": threads, "neighbours": neighbours,
                      "neighbour_kind": "python integer loop (linear congruential generator), one process each",
                      "usable_cpus": usable_cpus(), "variants": a.variants,
                      "children": {v: c.info for v, c in children.items()}, "runs": runs})


def summarise(result: dict) -> dict:
    """Per variant and sampler: idle and loaded medians (with range) and the loaded / idle ratio within each round;
    the token checks."""
    table: dict[str, dict[str, dict]] = {}
    for v in result["variants"]:
        table[v] = {}
        for s in SAMPLERS:
            t = {p: [run["variants"][v]["s"][s] for run in sorted((x for x in result["runs"] if x["phase"] == p),
                                                                  key=lambda x: x["round"])]
                 for p in ("idle", "loaded")}
            ratios = [lo / i for lo, i in zip(t["loaded"], t["idle"], strict=True)]
            table[v][s] = {"idle_s": t["idle"], "loaded_s": t["loaded"], "ratio_rounds": ratios,
                           "ratio": statistics.median(ratios), "idle_median_s": statistics.median(t["idle"]),
                           "loaded_median_s": statistics.median(t["loaded"])}
    tokens = {s: {run["variants"][v]["tokens"][s] for run in result["runs"] for v in result["variants"]}
              for s in REFERENCE}
    identical = all(all(x["identical"].values()) for run in result["runs"] for x in run["variants"].values())
    loads = [x for run in result["runs"] for x in (run["load_before"], run["load_after"]) if x is not None]
    return {**result, "table": table, "identical_to_restatement": identical,
            "same_tokens_everywhere": all(len(h) == 1 for h in tokens.values()),
            "load_range": [min(loads), max(loads)] if loads else None}


def write_markdown(r: dict) -> None:
    from benchlib import write_section
    from dsl_llada.runtime.environment import environment_footer

    label = {"sde": f"SDE NFE {r['nfe']}, library", "authors_sde": f"SDE NFE {r['nfe']}, restatement",
             "remask": f"remasking {r['nfe']} steps, library", "authors_remask": f"remasking {r['nfe']} steps, restatement"}
    lines = [f"Command: `{r['command']}`. {r['neighbours']} neighbour processes ({r['neighbour_kind']}) on "
             f"{r['usable_cpus']} usable CPUs during each loaded phase; batch 1, prompt 128 + 128 tokens, fp32, "
             "LLaDA-shaped model (d 256, 4 layers, V 32,768). "
             f"{r['rounds']} rounds, each an idle and a loaded phase (order alternating), every variant in each phase "
             "(order rotating); each variant is one process for the whole run. Ratio = loaded / idle time of the same "
             "round, median (range).", "",
             "| variant | threads | sampler | idle s, median | loaded s, median | loaded / idle (range) |",
             "|---|---|---|---|---|---|"]
    for v in r["variants"]:
        for s in SAMPLERS:
            e = r["table"][v][s]
            lines.append(f"| {v} | {r['children'][v]['threads']} | {label[s]} | {e['idle_median_s']:.3f} | "
                         f"{e['loaded_median_s']:.3f} | "
                         f"**{e['ratio']:.2f}x** ({min(e['ratio_rounds']):.2f}–{max(e['ratio_rounds']):.2f}) |")
    lo, hi = r["load_range"] or (None, None)
    lines += ["", f"Tokens: the library's equal the restatement's in every call: "
              f"{'yes' if r['identical_to_restatement'] else '**no**'}; the same in every variant and phase: "
              f"{'yes' if r['same_tokens_everywhere'] else '**no**'}. 1-minute load average over the phases: {lo}–{hi} "
              "(the host is shared with other jobs).", "",
              environment_footer(r.get("environment"))]
    write_section(section_title(r), "\n".join(lines), page="process-settings.md")


def section_title(r: dict) -> str:
    """One section per NFE, variant set and number of rounds."""
    return f"{TITLE}, NFE {r['nfe']}: {', '.join(r['variants'])}, {r['rounds']} rounds"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=sorted(VARIANTS), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each an idle and a loaded phase (default 3)")
    ap.add_argument("--nfe", type=int, default=16, help="SDE NFE and remasking steps (default 16)")
    ap.add_argument("--neighbours", type=int, default=None,
                    help="busy neighbour processes in the loaded phases (default: 2 x the usable CPUs)")
    ap.add_argument("--variants", nargs="+", default=["openmp-default", "configure-process"], choices=list(VARIANTS),
                    help="which process settings to compare (default: openmp-default configure-process)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result (every round) to this file")
    ap.add_argument("--report", type=Path, default=None,
                    help="measure nothing: write docs/benchmarks/'s section from a result saved with --json")
    ap.add_argument("--write", action="store_true", help="write the result into docs/benchmarks/process-settings.md")
    if "--child" in sys.argv:  # a child parses before torch loads (benchlib's parse_args imports it)
        ap.add_argument("--threads", type=int, default=None)
        c = ap.parse_args()
        child(c.child, c.threads, c.nfe)
        return
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
    from benchlib import command_line, parse_args, run_environment, write_text

    a = parse_args(ap)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped (SIGTERM)"))  # so the neighbours and children stop
    if a.report is not None:
        write_markdown(json.loads(a.report.read_text()))
        return
    for name, value, low in (("--rounds", a.rounds, 1), ("--nfe", a.nfe, 2), ("--neighbours", a.neighbours, 0)):
        if value is not None and value < low:
            ap.error(f"{name} must be at least {low}, got {value}")
    result = measure(a)
    result = {**result, "command": command_line(), "environment": run_environment()}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if a.json is not None:
        write_text(a.json, json.dumps(result, indent=1) + "\n")
    if a.write:
        write_markdown(result)
    if not (result["identical_to_restatement"] and result["same_tokens_everywhere"]):
        sys.exit("tokens differ: between the library and the restatement, or between variants or phases")


if __name__ == "__main__":
    main()
