"""Mixed traffic against the server: open-loop Poisson arrivals of requests with mixed prompt lengths and mixed
samplers (DSL-SDE and LLaDA remasking, short and long), the server of this tree (continuous batching on the
step-level engine) against the server of an earlier revision (`--before REV`: its `src/` exported with git archive).

Each server runs as `python -m dsl_llada serve` in its own process on a loopback port with the same flags
(`--max-batch`, `--threads`); the client sends every request as a stream at its scheduled arrival time whatever
the server is doing (open loop) and measures, per request, the latency to the final event and the time to its first
denoising step event. Per server and arrival rate: throughput (requests and response tokens per second, from the
first arrival to the last answer), p50/p95 latency (of all requests, and of the short ones alone) and time to first
step. Rates are run in turn, and for each rate
the two servers alternate which goes first; the load average is recorded before and after every run.

Usage:  python benchmarks/bench_serve_mixed.py --before 9d90ceb --rates 1 2 4 --requests 24 --threads 1 --write
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import command_line, parse_args, write_json, write_section
from measures.serve_load import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
"""Where --write puts serve_mixed_nfe{LONG}.json."""
PROMPTS = ["hi", "write about the ocean .", "describe the river near the tall trees and the small fish .",
           "tell me about the city at night , the streets , the lights and the people who walk there late ."]
"""Prompts of four different token lengths."""


def kinds(long_nfe: int) -> list[tuple[str, dict, int, float]]:
    """(label, sampler fields, response tokens, share of the requests): mostly short interactive requests of both
    sampler families (DSL-SDE NFE 8, remasking 8 steps), and one in ten a long one (DSL-SDE NFE `long_nfe`,
    remasking `long_nfe / 2` steps)."""
    return [("sde NFE 8", {"sampler": "sde", "nfe": 8}, 16, 0.45),
            (f"sde NFE {long_nfe}", {"sampler": "sde", "nfe": long_nfe}, 32, 0.05),
            ("remask 8 steps", {"sampler": "remask", "steps": 8, "temperature": 0.7}, 16, 0.45),
            (f"remask {long_nfe // 2} steps", {"sampler": "remask", "steps": long_nfe // 2, "temperature": 0.7}, 32,
             0.05)]


def workload(rate: float, n: int, seed: int, mix: list) -> list[dict]:
    """`n` requests with exponential inter-arrival gaps of mean 1/rate; each a random prompt and kind."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        label, fields, gen, _ = rng.choices(mix, weights=[k[3] for k in mix])[0]
        out.append({"at": t, "prompt": PROMPTS[rng.randrange(len(PROMPTS))], "kind": label, "fields": fields,
                    "max_tokens": gen, "seed": 1000 + i})
    return out


class ServerProcess:
    """`python -m dsl_llada serve` with PYTHONPATH=`src` on a free loopback port, until `close()`."""

    def __init__(self, src: Path, model: Path, *, max_batch: int, threads: int):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, "-m", "dsl_llada", "serve", "--model", str(model), "--port",
                                      str(self.port), "--max-batch", str(max_batch), "--threads", str(threads)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        import httpx

        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                self.close()
                raise RuntimeError(f"the server from {src} did not start")
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def one_request(base: str, req: dict, t_start: float, out: list[dict], lock: threading.Lock) -> None:
    import httpx

    delay = t_start + req["at"] - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    sent = time.perf_counter()
    first = None
    tokens, ok = 0, False
    body = {"messages": [{"role": "user", "content": req["prompt"]}], "stream": True,
            "max_tokens": req["max_tokens"], "seed": req["seed"], "stream_options": {"include_usage": True},
            **req["fields"]}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                ok = True
                break
            ev = json.loads(line[len("data: "):])
            if first is None and "denoising" in (ev.get("dsl_llada") or {}):
                first = time.perf_counter()
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    done = time.perf_counter()
    with lock:
        out.append({"kind": req["kind"], "sent": sent - t_start, "latency": done - sent,
                    "first_step": (first - sent) if first is not None else None, "tokens": tokens, "ok": ok,
                    "done": done - t_start})


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_load(base: str, reqs: list[dict], mix: list) -> dict:
    lock = threading.Lock()
    out: list[dict] = []
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter() + 0.2
    threads = [threading.Thread(target=one_request, args=(base, r, t_start, out, lock)) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in out if r["ok"]]
    span = max(r["done"] for r in ok) - min(r["sent"] for r in ok)
    lat = [r["latency"] for r in ok]
    short = [r["latency"] for r in ok if r["kind"] in (mix[0][0], mix[2][0])]
    ttfs = [r["first_step"] for r in ok if r["first_step"] is not None]
    by_kind = {k: round(statistics.median([r["latency"] for r in ok if r["kind"] == k]), 3)
               for k, *_ in mix if any(r["kind"] == k for r in ok)}
    return {"answered": f"{len(ok)}/{len(reqs)}", "req_per_s": round(len(ok) / span, 3),
            "tokens_per_s": round(sum(r["tokens"] for r in ok) / span, 1),
            "p50_s": round(pct(lat, 0.5), 3), "p95_s": round(pct(lat, 0.95), 3),
            "short_p50_s": round(pct(short, 0.5), 3), "short_p95_s": round(pct(short, 0.95), 3),
            "ttfs_p50_s": round(pct(ttfs, 0.5), 3), "ttfs_p95_s": round(pct(ttfs, 0.95), 3),
            "p50_by_kind_s": by_kind, "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def export_src(rev: str, dest: Path) -> Path:
    """REV's `src/` under `dest` (git archive), for running the server as it was."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def markdown(result: dict) -> str:
    mix = kinds(result["long_nfe"])
    lines = [f"Open-loop Poisson arrivals, {result['requests']} requests per rate, each one of "
             f"{len(PROMPTS)} prompt lengths at random and one of: " + ", ".join(f"{k} ({g} tokens, {w:.0%})" for k, _, g, w in mix)
             + f". Model: {result['model']}; `--max-batch {result['max_batch']}`, {result['threads']} torch thread(s) "
             f"per server. *before* = `{result['before']}` (batches only equal settings and prompt lengths; a "
             f"request cannot join a running batch), *engine* = this tree. Interleaved per rate.", "",
             "| rate (req/s) | server | answered | req/s | tokens/s | p50 s | p95 s | short p50 s | short p95 s | "
             "first step p50 s | first step p95 s | load avg before/after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rate, sides in result["rates"].items():
        for name in ("before", "engine"):
            m = sides[name]
            lines.append(f"| {rate} | {name} | {m['answered']} | {m['req_per_s']} | {m['tokens_per_s']} | {m['p50_s']} "
                         f"| {m['p95_s']} | {m['short_p50_s']} | {m['short_p95_s']} | {m['ttfs_p50_s']} "
                         f"| {m['ttfs_p95_s']} | {m['load_before']} / {m['load_after']} |")
    lines += ["", "| rate (req/s) | p95 latency before / engine | short requests' p95 before / engine | first step p95 "
              "before / engine | throughput engine / before |", "|---|---|---|---|---|"]
    for rate, sides in result["rates"].items():
        b, e = sides["before"], sides["engine"]
        lines.append(f"| {rate} | {b['p95_s'] / e['p95_s']:.2f}x | {b['short_p95_s'] / e['short_p95_s']:.2f}x | "
                     f"{b['ttfs_p95_s'] / e['ttfs_p95_s']:.2f}x | {e['req_per_s'] / b['req_per_s']:.2f}x |")
    lines += ["", f"Command: `{result['command']}`"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision whose server is the baseline")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: a random DSL model over the toy "
                                                  "world's vocabulary, built here with --d-model / --layers)")
    ap.add_argument("--d-model", type=int, default=64, help="width of the built model (default 64)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the built model (default 2)")
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="arrival rates, requests/s")
    ap.add_argument("--requests", type=int, default=24, help="requests per rate and server")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--long-nfe", type=int, default=256, help="NFE of the long DSL-SDE requests (the long remasking "
                                                              "ones take half as many steps; default 256)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help=f"write the result here (--write: {RESULTS.relative_to(ROOT)}/serve_mixed_nfeN.json)")
    ap.add_argument("--write", action="store_true", help="write the JSON and the section of docs/benchmarks/serving.md")
    a = parse_args(ap, threads_default=1, argv=argv)
    if a.requests < 2 or any(r <= 0 for r in a.rates):
        ap.error("--requests must be >= 2 and every rate > 0")
    if a.long_nfe < 4 or a.long_nfe % 4:
        ap.error(f"--long-nfe {a.long_nfe}: must be a multiple of 4, at least 4")
    mix = kinds(a.long_nfe)
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        model = Path(a.model) if a.model else build_tiny_model(tmpdir / "tiny", d_model=a.d_model, n_layers=a.layers)
        before_src = export_src(a.before, tmpdir / "before")
        sides = {"before": before_src, "engine": ROOT / "src"}
        built = f"random DSL model (d={a.d_model}, {a.layers} layers, toy vocabulary)"
        result: dict = {"before": a.before, "model": a.model or built,
                        "requests": a.requests, "long_nfe": a.long_nfe, "max_batch": a.max_batch, "threads": a.threads,
                        "kinds": [{"kind": k, "fields": f, "max_tokens": g, "share": w} for k, f, g, w in mix],
                        "rates": {}, "command": command_line()}
        for i, rate in enumerate(a.rates):
            reqs = workload(rate, a.requests, a.seed + i, mix)
            order = ["before", "engine"] if i % 2 == 0 else ["engine", "before"]
            result["rates"][f"{rate:g}"] = {}
            for name in order:
                srv = ServerProcess(sides[name], model, max_batch=a.max_batch, threads=a.threads)
                try:
                    run_load(srv.base, reqs[:2], mix)  # warm-up: the first request of a fresh process pays its set-up
                    m = run_load(srv.base, reqs, mix)
                finally:
                    srv.close()
                result["rates"][f"{rate:g}"][name] = m
                print(f"rate {rate:g}/s {name}: {m}", flush=True)
            result["rates"][f"{rate:g}"] = {k: result["rates"][f"{rate:g}"][k] for k in ("before", "engine")}
        shutil.rmtree(tmpdir / "before", ignore_errors=True)
    print(markdown(result))
    write_json(a.json or (RESULTS / f"serve_mixed_nfe{a.long_nfe}.json" if a.write else None), result)
    if a.write:
        write_section(f"Mixed traffic: continuous batching against fixed batches (long requests NFE {a.long_nfe})",
                      markdown(result), page="serving.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
