"""The join probe: a long DSL-SDE request, and 1 s later a short one with another prompt length. On a server that
batches only equal settings and prompt lengths the short request waits for the whole long one; on the step-level
engine it joins the running batch at the next tick and leaves when done.

Per round and server (this tree's, and `--before REV`'s `src/` exported with git archive, each as `python -m
dsl_llada serve` on a loopback port with the same flags): the short request alone, then the long one and the short
one 1 s after it. Reports each latency's median and range over the rounds, the two servers alternating which goes
first, and the load average around each round.

Usage:  python benchmarks/bench_serve_probe.py --before 63699a6 --rounds 3 --threads 2 --write
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_mixed import ServerProcess, export_src
from benchlib import command_line, parse_args, write_json, write_section
from measures.serve_load import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LONG_PROMPT = "tell me about the city at night , the streets , the lights and the people who walk there late ."
SHORT_PROMPT = "hi"


def request(base: str, prompt: str, nfe: int, max_tokens: int, out: dict, name: str) -> None:
    import httpx

    t = time.perf_counter()
    r = httpx.post(f"{base}/v1/chat/completions", timeout=600,
                   json={"messages": [{"role": "user", "content": prompt}], "nfe": nfe, "max_tokens": max_tokens,
                         "seed": 1})
    out[name] = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"{name}: HTTP {r.status_code}: {r.text[:200]}")


def one_round(base: str, a) -> dict:
    out: dict = {"load_before": round(os.getloadavg()[0], 2)}
    request(base, SHORT_PROMPT, a.short_nfe, a.short_tokens, out, "short_alone_s")
    long = threading.Thread(target=request, args=(base, LONG_PROMPT, a.long_nfe, a.long_tokens, out, "long_s"))
    long.start()
    time.sleep(a.gap)
    short = threading.Thread(target=request, args=(base, SHORT_PROMPT, a.short_nfe, a.short_tokens, out, "short_s"))
    short.start()
    long.join()
    short.join()
    out["load_after"] = round(os.getloadavg()[0], 2)
    return out


def summary(rounds: list[dict], key: str) -> dict:
    xs = [r[key] for r in rounds]
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def markdown(result: dict) -> str:
    lines = [f"A long DSL-SDE request (NFE {result['long_nfe']}, {result['long_tokens']} tokens), and {result['gap']:g} s "
             f"later a short one (NFE {result['short_nfe']}, {result['short_tokens']} tokens) with another prompt "
             f"length. Model: {result['model']}; {result['threads']} torch thread(s) per server; {result['rounds']} "
             f"rounds, servers interleaved; median [min, max] seconds. *before* = `{result['before']}`, *engine* = "
             f"this tree.", "",
             "| server | short alone | short, sent beside the long one | long | short / long |", "|---|---|---|---|---|"]
    for name in ("before", "engine"):
        s = result["servers"][name]
        cell = {k: f"{s[k]['median']} [{s[k]['min']}, {s[k]['max']}]" for k in ("short_alone_s", "short_s", "long_s")}
        lines.append(f"| {name} | {cell['short_alone_s']} | {cell['short_s']} | {cell['long_s']} | "
                     f"{s['short_s']['median'] / s['long_s']['median']:.2f} |")
    loads = [r[k] for s in result["servers"].values() for r in s["rounds"] for k in ("load_before", "load_after")]
    lines += ["", f"Load average {min(loads):g}–{max(loads):g}. Command: `{result['command']}`"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision whose server is the baseline")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: a random DSL model of the demo's "
                                                  "shape, d 128, 4 layers, over the toy world's vocabulary)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-nfe", type=int, default=1024)
    ap.add_argument("--long-tokens", type=int, default=64)
    ap.add_argument("--short-nfe", type=int, default=8)
    ap.add_argument("--short-tokens", type=int, default=32)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between the long and the short request")
    ap.add_argument("--json", default=None, help=f"write the result here (--write: {RESULTS.relative_to(ROOT)}/serve_probe.json)")
    ap.add_argument("--write", action="store_true", help="write the JSON and the section of docs/benchmarks/serving.md")
    a = parse_args(ap, threads_default=2, argv=argv)
    if not 1 <= a.rounds <= 20 or not 0 < a.gap <= 60:
        ap.error("--rounds must be 1-20 and --gap in (0, 60]")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(a.model) if a.model else build_tiny_model(Path(tmp) / "model", d_model=128, n_layers=4)
        sides = {"before": export_src(a.before, Path(tmp) / "before"), "engine": ROOT / "src"}
        rounds: dict[str, list[dict]] = {"before": [], "engine": []}
        for i in range(a.rounds):
            for name in (["before", "engine"] if i % 2 == 0 else ["engine", "before"]):
                srv = ServerProcess(sides[name], model, max_batch=8, threads=a.threads)
                try:
                    one_round(srv.base, a)  # warm-up: a fresh process's first requests pay its set-up
                    rounds[name].append(one_round(srv.base, a))
                finally:
                    srv.close()
                print(f"round {i} {name}: {rounds[name][-1]}", flush=True)
    result = {"before": a.before, "model": a.model or "random DSL model (d 128, 4 layers, toy vocabulary)",
              "rounds": a.rounds, "long_nfe": a.long_nfe, "long_tokens": a.long_tokens, "short_nfe": a.short_nfe,
              "short_tokens": a.short_tokens, "gap": a.gap, "threads": a.threads, "command": command_line(),
              "servers": {name: {"rounds": rs, **{k: summary(rs, k) for k in ("short_alone_s", "short_s", "long_s")}}
                          for name, rs in rounds.items()}}
    print(markdown(result))
    write_json(a.json or (RESULTS / "serve_probe.json" if a.write else None), result)
    if a.write:
        write_section("The join probe: a short request sent while a long one runs", markdown(result), page="serving.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
