"""Load test of `dsl-llada serve` on loopback: N concurrent clients using the official `openai` client.

For each mode (dynamic batching with --max-batch B, and --max-batch 1) a server runs on 127.0.0.1 (an ephemeral port,
in this process), every client sends its requests one after another, and we check that every request was answered
and that each output equals the library's own sample for the same prompt and seed (a batch of one). Reported: p50/p95
latency, requests/s and generated tokens/s per mode, and the throughput ratio batched / unbatched.

`--rounds R` runs the latency and batching comparison instead, interleaved over R rounds (each round measures every variant once,
so a load change on a shared machine hits all of them): a single client's request latency against the library's
`generate` path (encode + sampler + decode) on the same settings, and the throughput of 16 concurrent clients
against a `--max-batch 1` server; medians with the spread over the rounds, plus the environment record.

`--device cuda` puts the model (and so the `generate` path, the sampler timings and the served app) on the GPU; the
sampler is timed between `torch.cuda.synchronize()` calls there, and the GPU's name goes into the result.

Usage:  python benchmarks/bench_serve.py load [--model DIR] [--clients 8] [--requests 4] [--max-batch 8] [--write]
        python benchmarks/bench_serve.py load --rounds 3 [--clients 16] [--requests 2] [--device cuda]
                                              [--json OUT.json] [--markdown OUT.md] [--write]
Bounded: at most 2,000 requests per mode and --timeout-s seconds per mode; loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from benchlib import PAGES, command_line, environment_note, run_environment, sync, write_text

from dsl_llada.core.backbones import LLaDABackbone, tiny_llada_config
from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.config import ConverterConfig, DSLConfig, RemaskConfig, SDEConfig
from dsl_llada.core.loading import check_device, encode_prompt, load_model, load_tokenizer
from dsl_llada.core.model import DSLModel
from dsl_llada.sampling import PromptBatch
from dsl_llada.serve.app import create_app
from dsl_llada.serve.settings import ServerConfig
from dsl_llada.core.backbones.base import model_device
from dsl_llada.generate.generation import run_sampler
from dsl_llada.serve.runner import seeded_generator

HOST = "127.0.0.1"
MAX_REQUESTS = 2000
KEEP_ALIVE_S = 120
"""uvicorn's keep-alive for the benchmark's servers: its default (5 s) can close a pooled client connection between
rounds just as the client reuses it (a reset, counted as a failed request)."""
PROMPTS = ["write about the ocean .", "describe the forest .", "tell me about the city at night .",
           "write a story about a small fish .", "describe the river near the tall trees .", "hi"]


def build_tiny_model(path: Path, *, d_model: int = 64, n_layers: int = 2, seed: int = 0) -> Path:
    """A random LLaDA-shaped DSL model over the toy world's vocabulary, saved with the toy tokenizer."""
    from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids

    tok = build_tokenizer(ToyWorld(ToyWorldConfig(n_topics=2)))
    s = special_ids(tok)
    cfg = tiny_llada_config(len(tok), d_model=d_model, n_layers=n_layers, mask_token_id=s["mask"], eos_token_id=s["eos"],
                            eot_token_id=s["eot"], bos_token_id=s["bos"], max_sequence_length=256)
    bb = LLaDABackbone(cfg, SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"]))
    bb.init_weights(torch.Generator().manual_seed(seed), std=0.3)
    DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=16))).save_pretrained(path)
    tok.save_pretrained(str(path))
    return path


def device_info(model) -> dict:
    """Where the model runs: {"device": "cpu"}, or with CUDA also the GPU's name."""
    dev = model_device(model)
    info = {"device": str(dev)}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


def where(result: dict) -> str:
    """The report's words for a non-CPU device ("" on the CPU, so CPU reports read as before)."""
    if result.get("device", "cpu") == "cpu":
        return ""
    return f", model on {result['device']}" + (f" ({result['gpu']})" if result.get("gpu") else "")


@dataclass
class ModeResult:
    label: str
    max_batch: int
    latencies: list[float]
    seconds: float
    tokens: int
    answered: int
    equal: int
    total: int
    mean_batch: float

    def row(self) -> dict:
        lat = sorted(self.latencies)
        p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))] if lat else float("nan")
        return {"mode": self.label, "max_batch": self.max_batch, "answered": f"{self.answered}/{self.total}",
                "equal_to_library": f"{self.equal}/{self.total}", "mean_batch": round(self.mean_batch, 2),
                "p50_s": round(statistics.median(lat), 3) if lat else None, "p95_s": round(p95, 3),
                "req_per_s": round(self.answered / self.seconds, 2), "tokens_per_s": round(self.tokens / self.seconds, 1)}


def sampler_config(sampler: str, steps: int, gen_length: int) -> tuple[dict, SDEConfig | RemaskConfig]:
    """The request fields that ask for `steps` NFE/steps of `sampler`, and the library config they resolve to."""
    if sampler in ("sde", "block-sde"):
        return {"nfe": steps}, SDEConfig(nfe=steps, gen_length=gen_length)
    return {"steps": steps}, RemaskConfig(steps=steps, gen_length=gen_length, remdm=sampler == "remdm")


def work_items(clients: int, requests: int) -> list[list[tuple[str, int]]]:
    """Per client, its (prompt, seed) pairs; seeds are unique across the run."""
    return [[(PROMPTS[(c * requests + r) % len(PROMPTS)], 1000 + c * requests + r) for r in range(requests)]
            for c in range(clients)]


def reference_texts(model, tok, items, sampler: str, config) -> dict[tuple[str, int], str]:
    """The library's text for each (prompt, seed): the sampler on a batch of one, generator seeded `seed`."""
    out = {}
    for prompt, seed in (x for client in items for x in client):
        batch = PromptBatch.from_lists([encode_prompt(tok, prompt)], pad_id=model.special.pad_id,
                                       device=model_device(model))
        res = run_sampler(model, batch, config, generator=[seeded_generator(seed)])
        out[(prompt, seed)] = tok.decode(res.responses()[0], skip_special_tokens=True)
    return out


def run_mode(model, tok, items, *, sampler: str, fields: dict, gen_length: int, max_batch: int, max_wait_ms: float,
             reference: dict, timeout_s: float, label: str = "") -> ModeResult:
    srv = Server(model, tok, max_batch=max_batch, timeout_s=timeout_s, max_wait_ms=max_wait_ms)
    latencies: list[float] = []
    texts: dict[tuple[str, int], str] = {}
    batch_sizes: list[int] = []
    tokens = 0
    lock = threading.Lock()
    deadline = time.monotonic() + timeout_s

    def one_client(pairs):
        nonlocal tokens
        for prompt, seed in pairs:
            if time.monotonic() > deadline:
                return
            t0 = time.perf_counter()
            r = srv.chat(prompt, seed, gen_length, {"sampler": sampler, **fields})
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                texts[(prompt, seed)] = r.choices[0].message.content
                tokens += r.usage.completion_tokens
                batch_sizes.extend((r.model_extra or {}).get("dsl_llada", {}).get("batch_sizes", []))

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(items)) as pool:
            list(pool.map(one_client, items))
    finally:
        seconds = time.perf_counter() - t0
        srv.close()
    total = sum(len(c) for c in items)
    equal = sum(texts.get(k) == v for k, v in reference.items())
    return ModeResult(label, max_batch, latencies, seconds, tokens, len(texts), equal, total,
                      statistics.mean(batch_sizes) if batch_sizes else 0.0)


def run_bench(model, tok, *, clients: int = 8, requests: int = 4, max_batch: int = 8, max_wait_ms: float = 0.0,
              sampler: str = "sde", steps: int = 16, gen_length: int = 32, timeout_s: float = 300.0) -> dict:
    if clients * requests > MAX_REQUESTS:
        raise ValueError(f"clients x requests = {clients * requests} exceeds the bound of {MAX_REQUESTS}")
    fields, config = sampler_config(sampler, steps, gen_length)
    items = work_items(clients, requests)
    reference = reference_texts(model, tok, items, sampler, config)
    plan = [("batched (default)", max_batch), ("--max-batch 1", 1)]
    modes = [run_mode(model, tok, items, sampler=sampler, fields=fields, gen_length=gen_length, max_batch=b,
                      max_wait_ms=max_wait_ms, reference=reference, timeout_s=timeout_s, label=label)
             for label, b in plan]
    single = modes[-1]

    def tput(m: ModeResult) -> float:
        return m.answered / m.seconds

    return {"modes": [m.row() for m in modes], **device_info(model), "clients": clients, "requests_per_client": requests,
            "sampler": sampler, "steps": steps, "gen_length": gen_length, "max_wait_ms": max_wait_ms,
            "throughput_ratio": [round(tput(m) / tput(single), 2) for m in modes[:-1]],
            "p50_ratio": [round(statistics.median(single.latencies) / statistics.median(m.latencies), 2)
                          for m in modes[:-1]]}


class Server:
    """An in-process server on an ephemeral loopback port, with an `openai` client; `app_options` go to
    the server's `ServerConfig` (max_wait_ms, max_batch_tokens)."""

    def __init__(self, model, tok, *, max_batch: int, timeout_s: float, **app_options):
        import openai
        import uvicorn

        server = ServerConfig(max_batch=max_batch, max_queue=MAX_REQUESTS, **app_options)
        app = create_app(model, tok, model_name="bench", server=server)
        self.server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=0, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.client = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="unused", max_retries=0,
                                    timeout=timeout_s)

    def ask(self, prompt: str, seed: int, gen_length: int, fields: dict) -> str:
        return self.ask_batch(prompt, seed, gen_length, fields)[0]

    def chat(self, prompt: str, seed: int, gen_length: int, fields: dict):
        """One chat completion: the user turn `prompt`, `gen_length` tokens, `seed`, the DSL `fields`."""
        return self.client.chat.completions.create(model="bench", messages=[{"role": "user", "content": prompt}],
                                                   max_tokens=gen_length, seed=seed, extra_body=fields)

    def ask_batch(self, prompt: str, seed: int, gen_length: int, fields: dict) -> tuple[str, int]:
        """(text, the size of the batch the request ran in)."""
        r = self.chat(prompt, seed, gen_length, fields)
        return r.choices[0].message.content, (r.model_extra or {}).get("dsl_llada", {}).get("batch_sizes", [0])[0]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def run_rounds(model, tok, *, rounds: int = 3, clients: int = 16, requests: int = 2, sampler: str = "sde",
               steps: int = 16, gen_length: int = 32, timeout_s: float = 600.0,
               progress: Callable[[int, dict[str, float]], None] | None = None) -> dict:
    """The interleaved comparison of the module docstring; every output is also checked against the library.
    `progress(round, {variant: seconds})` is called after each round (a run cut short still shows its rounds).

    Each round also times the sampler itself (`run_sampler`, no server) on one request at batch 1 and on a batch of
    `clients` rows: N x t(1) / t(N) is what batching can gain at most (the *ceiling* of the throughput ratio: no
    server policy can beat the sampler's own batched speed-up)."""
    if rounds < 1 or clients * requests > MAX_REQUESTS:
        raise ValueError(f"rounds={rounds} must be >= 1 and clients x requests <= {MAX_REQUESTS}")
    fields, config = sampler_config(sampler, steps, gen_length)
    fields = {"sampler": sampler, **fields}
    prompt = PROMPTS[0]  # one prompt length: every request may share a batch (per-row seeds keep outputs apart)
    device = model_device(model)

    def library(seed: int) -> str:
        ids = encode_prompt(tok, prompt)
        res = run_sampler(model, PromptBatch.from_lists([ids], pad_id=model.special.pad_id, device=device), config,
                          generator=[seeded_generator(seed)])
        return tok.decode(res.responses()[0], skip_special_tokens=True)

    def sampler_alone(seed: int, rows: int) -> None:
        ids = encode_prompt(tok, prompt)
        run_sampler(model, PromptBatch.from_lists([ids] * rows, pad_id=model.special.pad_id, device=device), config,
                    generator=[seeded_generator(seed + j) for j in range(rows)])
        sync(str(device))  # the GPU's queued work is part of the sampler's time

    batched = Server(model, tok, max_batch=clients, timeout_s=timeout_s)
    single = Server(model, tok, max_batch=1, timeout_s=timeout_s)
    times: dict[str, list[float]] = {"generate": [], "server, 1 client": [], "sampler, batch 1": [],
                                     "sampler, batch N": [], "batched, N clients": [], "--max-batch 1, N clients": []}
    batch_sizes: list[int] = []
    mismatches = 0
    if device.type == "cuda":  # CUDA's lazy start-up (context, kernels, allocator) is not round 1's cost
        library(0)
        sampler_alone(0, clients)
    try:
        for r in range(rounds):
            seed = 10_000 * (r + 1)
            sync(str(device))
            t0 = time.perf_counter()
            want = library(seed)
            times["generate"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = batched.ask(prompt, seed, gen_length, fields)
            times["server, 1 client"].append(time.perf_counter() - t0)
            mismatches += got != want
            for label, rows in (("sampler, batch 1", 1), ("sampler, batch N", clients)):
                sync(str(device))
                t0 = time.perf_counter()
                sampler_alone(seed, rows)
                times[label].append(time.perf_counter() - t0)
            for label, srv in (("batched, N clients", batched), ("--max-batch 1, N clients", single)):
                seeds = [[seed + 1 + c * requests + k for k in range(requests)] for c in range(clients)]

                def one(client_seeds, srv=srv):
                    return [srv.ask_batch(prompt, s, gen_length, fields)[1] for s in client_seeds]

                t0 = time.perf_counter()
                with ThreadPoolExecutor(clients) as pool:
                    sizes = [b for client in pool.map(one, seeds) for b in client]
                times[label].append(time.perf_counter() - t0)
                if srv is batched:
                    batch_sizes += sizes
            if progress is not None:
                progress(r + 1, {k: v[-1] for k, v in times.items()})
    finally:
        batched.close()
        single.close()

    def med(xs):
        return statistics.median(xs)

    lat_ratio = [s / g for s, g in zip(times["server, 1 client"], times["generate"])]
    tput_ratio = [m / b for b, m in zip(times["batched, N clients"], times["--max-batch 1, N clients"])]
    ceiling = [clients * one / many for one, many in zip(times["sampler, batch 1"], times["sampler, batch N"])]
    return {"rounds": rounds, **device_info(model), "clients": clients, "requests_per_client": requests,
            "sampler": sampler, "steps": steps,
            "gen_length": gen_length, "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
            "latency_ratio": {"median": round(med(lat_ratio), 4), "min": round(min(lat_ratio), 4),
                              "max": round(max(lat_ratio), 4)},
            "throughput_ratio": {"median": round(med(tput_ratio), 3), "min": round(min(tput_ratio), 3),
                                 "max": round(max(tput_ratio), 3)},
            "sampler_ceiling": {"median": round(med(ceiling), 3), "min": round(min(ceiling), 3),
                                "max": round(max(ceiling), 3)},
            "mean_batch": round(statistics.mean(batch_sizes), 2) if batch_sizes else 0.0,
            "single_client_equal_to_library": f"{rounds - mismatches}/{rounds}"}


def markdown_rounds(result: dict, *, command: str, model_desc: str) -> str:
    from dsl_llada.runtime.environment import environment_record

    env = environment_record(device=result.get("device", "cpu"), dtype="float32")
    n = result["clients"] * result["requests_per_client"]
    lines = ["", f"### Serving: single-client latency and {result['clients']}-client throughput "
                 f"({time.strftime('%Y-%m-%d')})", "", f"Command: `{command}`", "",
             f"Model: {model_desc}; sampler {result['sampler']}, {result['steps']} NFE/steps, "
             f"{result['gen_length']} tokens; {result['rounds']} interleaved rounds (each round: `generate` path, one "
             f"request to the server, the sampler alone at batch 1 and at batch {result['clients']}, {n} requests from "
             f"{result['clients']} concurrent clients to the batching server (--max-batch {result['clients']}, no "
             f"batch wait), the same to a `--max-batch 1` server); server and "
             f"clients in one process{where(result)}, {torch.get_num_threads()} torch thread(s), load average "
             f"{os.getloadavg()[0]:.1f} at the end (**a shared machine: the ratios measured within "
             f"each round are the figures to trust**).", "",
             "| variant | median s | min s | max s |", "|---|---|---|---|"]
    for k, v in result["seconds"].items():
        lines.append(f"| {k} | {statistics.median(v):.4f} | {min(v):.4f} | {max(v):.4f} |")
    lr, tr, ce = result["latency_ratio"], result["throughput_ratio"], result["sampler_ceiling"]
    lines += ["", f"Single-client latency / `generate`: **{lr['median']:.3f}x** (range {lr['min']:.3f}–{lr['max']:.3f}; "
                  f"target within 1.05x); throughput batched / `--max-batch 1` at {result['clients']} clients: "
                  f"**{tr['median']:.2f}x** (range {tr['min']:.2f}–{tr['max']:.2f}; target >= 2.5x; mean batch "
                  f"{result['mean_batch']:g}). The sampler's own batch-{result['clients']} speed-up (N x t(batch 1) / "
                  f"t(batch N), the ceiling of that ratio): **{ce['median']:.2f}x** (range {ce['min']:.2f}–"
                  f"{ce['max']:.2f}). Single-client outputs equal to the library: "
                  f"{result['single_client_equal_to_library']}.", "",
              "<details><summary>environment record</summary>", "", "```json",
              json.dumps(env, indent=1, sort_keys=True, default=str), "```", "", "</details>", ""]
    return "\n".join(lines)


def markdown(result: dict, *, command: str, model_desc: str) -> str:
    load = os.getloadavg()
    lines = ["", f"### Serving: dynamic batching vs `--max-batch 1` ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `{command}`", "",
             f"Model: {model_desc}; {result['clients']} concurrent `openai` clients x {result['requests_per_client']} "
             f"requests each, sampler {result['sampler']} with {result['steps']} NFE/steps, {result['gen_length']} "
             f"tokens, `--max-wait-ms {result['max_wait_ms']:g}`; server and clients in one process on "
             f"{platform.machine()} with {os.cpu_count()} CPU cores and {torch.get_num_threads()} torch thread(s)"
             f"{where(result)}, "
             f"load average {load[0]:.1f} when it finished"
             + (" (**the machine was contended: absolute figures are not representative, the ratio is more "
                "meaningful**)" if load[0] > (os.cpu_count() or 1) else "") + ".", "",
             "| mode | answered | equal to library | mean batch | p50 latency (s) | p95 latency (s) | requests/s | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for m in result["modes"]:
        lines.append(f"| {m['mode']} | {m['answered']} | {m['equal_to_library']} | {m['mean_batch']} | {m['p50_s']} "
                     f"| {m['p95_s']} | {m['req_per_s']} | {m['tokens_per_s']} |")
    (t_batched,), (l_batched,) = result["throughput_ratio"], result["p50_ratio"]
    lines += ["", (f"Throughput ratio batched / `--max-batch 1`: **{t_batched}x**; p50 latency ratio `--max-batch 1` / "
              f"batched: {l_batched}x."), ""]
    return "\n".join(lines)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="checkpoint folder (default: a tiny random DSL model, d=64, 2 layers)")
    ap.add_argument("--d-model", type=int, default=64, help="width of the built random model (without --model)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the built random model (without --model)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the model, the sampler timings and the served app run (default cpu)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=0.0, help="the server default: no batch wait")
    ap.add_argument("--sampler", default="sde", choices=["sde", "remask", "remdm"])
    ap.add_argument("--steps", type=int, default=16, help="NFE (sde) or steps (remask/remdm)")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per-mode time bound")
    ap.add_argument("--model-desc", default=None, help="how to name --model in the report (default: its path)")
    ap.add_argument("--write", action="store_true", help="append the result to docs/benchmarks/serving.md")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the result with its environment record as JSON to PATH")
    ap.add_argument("--markdown", default=None, metavar="PATH", help="also write the markdown section to PATH")
    ap.add_argument("--overwrite", action="store_true", help="replace existing --json / --markdown files")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave the startup objects to the garbage collector (`dsl-llada serve` freezes them)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="run the interleaved single-client / N-client comparison over this many rounds instead")


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse (exit 2, one message) what would fail only after the model is built: a device this machine lacks,
    output files that exist (without --overwrite) or are folders."""
    try:
        check_device(a.device)
    except ValueError as e:
        ap.error(str(e))
    for opt, path in (("--json", a.json), ("--markdown", a.markdown)):
        if path is None:
            continue
        if Path(path).is_dir():
            ap.error(f"{opt} {path!r} is a folder; give a file path")
        if Path(path).exists() and not a.overwrite:
            ap.error(f"{opt} {path!r} exists; pass --overwrite to replace it")
    if a.json is not None and a.markdown is not None and Path(a.json).resolve() == Path(a.markdown).resolve():
        ap.error(f"--json and --markdown are the same file {a.json!r}")


def run(a: argparse.Namespace) -> int:
    check_args(a.parser, a)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.model) if a.model else build_tiny_model(Path(tmp) / "tiny", d_model=a.d_model, n_layers=a.layers)
        model, tok = load_model(path, device=a.device), load_tokenizer(path)
        if not a.no_gc_freeze:
            from dsl_llada.serve.server import freeze_startup_objects

            freeze_startup_objects()  # as `dsl-llada serve` does once the model is loaded
        desc = (a.model_desc or f"`{path}`" if a.model else f"tiny random DSL model (LLaDA-shaped, d={a.d_model}, "
                f"{a.layers} layers, toy vocabulary of {len(tok)} tokens)")
        if a.rounds is not None:
            def progress(r: int, seconds: dict[str, float]) -> None:
                print(f"round {r}/{a.rounds}: " + json.dumps({k: round(v, 4) for k, v in seconds.items()}),
                      file=sys.stderr, flush=True)

            result = run_rounds(model, tok, rounds=a.rounds, clients=a.clients, requests=a.requests,
                                sampler=a.sampler, steps=a.steps, gen_length=a.gen_length, timeout_s=a.timeout_s,
                                progress=progress)
        else:
            result = run_bench(model, tok, clients=a.clients, requests=a.requests, max_batch=a.max_batch,
                               max_wait_ms=a.max_wait_ms, sampler=a.sampler, steps=a.steps, gen_length=a.gen_length,
                               timeout_s=a.timeout_s)

    command = command_line()
    text = (markdown_rounds if a.rounds is not None else markdown)(result, command=command, model_desc=desc)
    text = text.rstrip("\n") + "\n\n" + environment_note() + "\n"
    print(text)
    if a.json is not None:
        record = {"command": command, "model": desc, "result": result, "environment": run_environment()}
        write_text(a.json, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    if a.markdown is not None:
        write_text(a.markdown, text)
    if a.write:
        with open(PAGES / "serving.md", "a", encoding="utf-8") as f:
            f.write(text)
    return 0
