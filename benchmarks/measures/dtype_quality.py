"""The paper's precision recipe on the toy world: the same trained checkpoints sampled with the backbone in fp32 and
in bf16 (converter softmax, posterior mean and SDE state fp32 in both), same prompts and seeds.

Reports per (method, NFE): exact perplexity under the world's true distribution and ROUGE-L (summarisation), each
with a bootstrap 95 % interval over prompts, the paired bf16 - fp32 difference with its interval, the fraction of
identical response tokens, and Fix/Clean of the error-correction probe; plus the toy model's time per sample at
batch 1 (fp32 and bf16 alternating). Needs the demo's cached checkpoints (run `python -m dsl_llada demo --quick
--out DIR` once); refuses to train.

Usage:  python benchmarks/bench_dtype.py quality --demo DIR [--n-open 96 --n-summarize 48 --nfe 16 64] [--json F] [--write]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import demo_checkpoints, write_section, write_text

from dsl_llada.runtime.environment import environment_record, finish_record
from dsl_llada.core.quantize import quantize_backbone
from dsl_llada.sampling.batches import run_batches
from dsl_llada.toy.demo import Demo, DemoConfig, cast_for_inference
from dsl_llada.toy.evaluate import PAPER_METHODS, error_correction, score_record
from dsl_llada.toy.tasks import render_prompt

METHODS = ("DSL-SDE", "DSL-SDE (eta=0)", "DSL-Remask", "LLaDA")


def bootstrap(values_a, values_b, stat, *, n: int = 2000, seed: int = 0):
    """Paired bootstrap over items: (stat(a), CI_a, stat(b), CI_b, stat(b) - stat(a), CI of the difference), 95 %."""
    rng = np.random.default_rng(seed)
    k = len(values_a)
    idx = rng.integers(0, k, size=(n, k))
    sa = np.array([stat([values_a[i] for i in row]) for row in idx])
    sb = np.array([stat([values_b[i] for i in row]) for row in idx])
    ci = lambda x: [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))]  # noqa: E731
    a, b = stat(values_a), stat(values_b)
    return {"fp32": a, "fp32_ci": ci(sa), "bf16": b, "bf16_ci": ci(sb), "diff": b - a, "diff_ci": ci(sb - sa)}


def ppl(recs) -> float:
    return math.exp(sum(r["nll_sum"] for r in recs) / max(1e-9, sum(r["n_tokens"] for r in recs)))


def rouge_l(recs) -> float:
    return float(np.mean([r["rouge"]["rougeL"] for r in recs]))  # already in %


def run_method(model, method, nfe, demo, evals, prompt_ids, batch_size):
    config = method.config(nfe, demo.gen_length)
    recs, ids = [None] * len(evals), [None] * len(evals)
    for rows in run_batches(model, prompt_ids, config, batch_size=batch_size, retry=False,
                            seed_of=lambda i: demo.cfg.seed * 100_003 + i):
        for r in rows:
            out, i = r.output, r.index
            keep_all = not out.config.get("truncate_at_eos", True)
            row = out.ids[r.row].tolist()
            ids[i] = row
            recs[i] = score_record(demo.world, evals[i], demo.tok.decode(row, skip_special_tokens=keep_all),
                                   method=method.name, nfe=nfe, seed=None, index=i, forward_passes=out.forward_passes)
    return recs, ids


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--demo", required=True, help="a `dsl-llada demo --quick --out DIR` folder (its cached checkpoints)")
    ap.add_argument("--n-open", type=int, default=96)
    ap.add_argument("--n-summarize", type=int, default=48)
    ap.add_argument("--nfe", type=int, nargs="+", default=[16])
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--timing-prompts", type=int, default=4, help="prompts timed at batch 1 per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", default="bf16", choices=["bf16", "int8", "int8-bf16"],
                    help="what is compared with fp32: the bf16 backbone, an int8 weight-only backbone (fp32 "
                         "activations), or both")
    ap.add_argument("--json", default=None, help="write the full result here")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks/")


def run(a: argparse.Namespace) -> None:
    demo = Demo(DemoConfig.preset(quick=True), Path(a.demo), progress=False, echo=lambda s: None)
    train, evals = demo.corpora(a.n_open, a.n_summarize)
    base, dsl = demo_checkpoints(demo, train, a.demo)

    def variant(m):
        m = copy.deepcopy(m)
        if a.variant in ("bf16", "int8-bf16"):
            m = cast_for_inference(m, torch.bfloat16)
        if a.variant in ("int8", "int8-bf16"):
            quantize_backbone(m, "int8")
        return m

    # "bfloat16" below is the variant under test (the key keeps the result format of the bf16 run)
    models = {"float32": {"base": base, "dsl": dsl}, "bfloat16": {k: variant(m) for k, m in {"base": base, "dsl": dsl}.items()}}
    env = environment_record(device="cpu", dtype=f"float32 vs {a.variant}", seeds=[demo.cfg.seed])
    prompt_ids = [demo.tok.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in evals]
    methods = [m for m in PAPER_METHODS if m.name in METHODS]
    rows = []
    for method in methods:
        for nfe in a.nfe:
            (r32, i32), (r16, i16) = (run_method(models[dt][method.model], method, nfe, demo, evals, prompt_ids,
                                                 a.batch_size) for dt in ("float32", "bfloat16"))
            same = sum(x == y for u, v in zip(i32, i16) for x, y in zip(u, v)) / sum(len(u) for u in i32)
            open_idx = [i for i, ex in enumerate(evals) if ex.task == "open"]
            sum_idx = [i for i, ex in enumerate(evals) if ex.task == "summarize"]
            row = {"method": method.name, "nfe": nfe, "identical_tokens": same,
                   "identical_samples": sum(u == v for u, v in zip(i32, i16)) / len(i32),
                   "ppl_open": bootstrap([r32[i] for i in open_idx], [r16[i] for i in open_idx], ppl),
                   "rougeL": bootstrap([r32[i] for i in sum_idx], [r16[i] for i in sum_idx], rouge_l)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    texts_n = min(len(evals), 32)
    fixclean = {dt: error_correction(models[dt], demo.tok, evals[:texts_n], n_words=len(demo.world.words), seed=42)
                for dt in models}
    # time per sample at batch 1 on the toy model, fp32 and bf16 alternating
    method = next(m for m in methods if m.name == "DSL-SDE")
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for _ in range(a.rounds):
        for dt in times:
            t = time.perf_counter()
            for _ in run_batches(models[dt]["dsl"], prompt_ids[: a.timing_prompts], method.config(16, demo.gen_length),
                                 batch_size=1, seed_of=lambda i: i, retry=False):
                pass
            times[dt].append((time.perf_counter() - t) / a.timing_prompts)
    result = {"env": finish_record(env), "variant": a.variant, "n_open": a.n_open, "n_summarize": a.n_summarize, "rows": rows,
              "fixclean": fixclean, "toy_seconds_per_sample_b1_nfe16": times,
              "toy_model": {"d_model": demo.cfg.d_model, "n_layers": demo.cfg.n_layers, "vocab": demo.world.vocab_size}}
    if a.json:
        write_text(a.json, json.dumps(result, indent=1) + "\n")
    text = render(result, a)
    print(text)
    if a.write:
        title = {"bf16": "bf16 vs fp32 on the toy world (quality)", "int8": "int8 weight-only vs fp32 on the toy world",
                 "int8-bf16": "int8 weight-only + bf16 vs fp32 on the toy world"}[a.variant]
        write_section(title, text)


def fmt(b, spec=".2f"):
    return (f"{b['fp32']:{spec}} [{b['fp32_ci'][0]:{spec}}, {b['fp32_ci'][1]:{spec}}] | {b['bf16']:{spec}} "
            f"[{b['bf16_ci'][0]:{spec}}, {b['bf16_ci'][1]:{spec}}] | {b['diff']:+{spec}} [{b['diff_ci'][0]:+{spec}}, "
            f"{b['diff_ci'][1]:+{spec}}]")


def render(result, a) -> str:
    env = result["env"]
    v = result["variant"]
    what = {"bf16": "bf16 backbone", "int8": "int8 weight-only backbone (fp32 activations)",
            "int8-bf16": "int8 weight-only backbone with bf16 activations"}[v]
    lines = [f"Command: `python benchmarks/bench_dtype.py quality --demo DIR --n-open {a.n_open} --n-summarize "
             f"{a.n_summarize} --variant {v} --nfe {' '.join(map(str, a.nfe))}` on the quick demo's checkpoints; {env['cpu_model']} "
             f"({env['cpu_capability']}, native bf16 {env['cpu_native_bf16']}), {env['threads']['intra_op']} threads, "
             f"torch {env['libraries']['torch']}, load {env['load_average_start']} -> {env['load_average_end']} "
             f"(shared machine). fp32 vs {what}; converter softmax, posterior mean and SDE state fp32 in both. "
             f"Bootstrap 95 % intervals over prompts (2000 paired resamples).", "",
             f"| method | NFE | PPL fp32 [CI] | PPL {v} [CI] | {v} - fp32 [CI] | ROUGE-L fp32 [CI] | ROUGE-L {v} [CI] "
             "| diff [CI] | identical tokens | identical samples |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['method']} | {r['nfe']} | {fmt(r['ppl_open'])} | {fmt(r['rougeL'], '.1f')} | "
                     f"{100 * r['identical_tokens']:.2f} % | {100 * r['identical_samples']:.1f} % |")
    lines += ["", f"Random-token error correction (Fix / Clean %, fp32 -> {v}):", "", "| model | corrupted | Fix | Clean |",
              "|---|---|---|---|"]
    for x, y in zip(result["fixclean"]["float32"], result["fixclean"]["bfloat16"]):
        lines.append(f"| {x['model']} | {x['rate']:.0%} | {x['fix']:.1f} -> {y['fix']:.1f} | "
                     f"{x['clean']:.1f} -> {y['clean']:.1f} |")
    t = result["toy_seconds_per_sample_b1_nfe16"]
    m32, m16 = statistics.median(t["float32"]), statistics.median(t["bfloat16"])
    tm = result["toy_model"]
    lines += ["", f"Toy model (d {tm['d_model']}, {tm['n_layers']} layers, V {tm['vocab']}) DSL-SDE NFE 16 at batch 1: "
              f"fp32 {1000 * m32:.1f} ms, {v} {1000 * m16:.1f} ms per sample (medians of {len(t['float32'])} alternating rounds; ratio "
              f"{m32 / m16:.2f}x). The toy model is too small for this to measure speed; see the "
              f"LLaDA-shaped sections."]
    return "\n".join(lines)
