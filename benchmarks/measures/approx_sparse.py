"""The sparse converter on the demo: do the toy world's SDE samples change when `converter_tolerance` is on?

Loads the default demo's cached checkpoints from OUT/cache (run `dsl-llada demo --out OUT` first; nothing is
trained here: a missing checkpoint is an error), samples the demo's three SDE rows (DSL-SDE, Alg. 2 as printed,
eta = 0) at every demo NFE over the 72 held-out prompts with the exact dense converter and with the sparse one, and
reports the share of changed tokens, the exact perplexity of both, and the sampling time of both. With --quick the
folder holds a `dsl-llada demo --quick` run instead (its fewer prompts and NFEs). The page's table is rendered from
the --json results (`python scripts/docs_tables.py --write-pages cpu-approx-sparse`).

Usage:  python benchmarks/bench_approx.py sparse --demo-dir OUT [--tolerance 1e-6] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchlib import demo_checkpoints, write_json

from dsl_llada.sampling.batches import run_batches
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.evaluate import PAPER_METHODS, aggregate, score_record
from dsl_llada.toy.tasks import render_prompt


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--demo-dir", required=True, help="the --out folder of a finished `dsl-llada demo` (default, or --quick with --quick)")
    ap.add_argument("--quick", action="store_true", help="the demo in --demo-dir is a --quick one")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--json", default=None, help="write the rows and this run's environment record here")


def run(a: argparse.Namespace) -> None:
    cfg = DemoConfig.preset(quick=a.quick)
    demo = Demo(cfg, Path(a.demo_dir), progress=False, echo=lambda s: None)
    train, evals = demo.corpora()
    _, dsl = demo_checkpoints(demo, train, a.demo_dir)
    prompt_ids = [demo.tok.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in evals]
    rows = []
    for method in [m for m in PAPER_METHODS if m.sampler == "sde"]:
        for nfe in cfg.nfes:
            exact_cfg = method.config(nfe, demo.gen_length)
            res = {}
            for tol in (0.0, a.tolerance):
                sc = exact_cfg.replace(converter_tolerance=tol)
                t = time.perf_counter()
                ids = []
                for batch in run_batches(dsl, prompt_ids, sc, batch_size=cfg.batch_size, retry=False,
                                         seed_of=lambda i: cfg.seed * 100_003 + i):
                    ids += [r.ids for r in batch]
                secs = time.perf_counter() - t
                recs = [score_record(demo.world, evals[i], demo.tok.decode(x, skip_special_tokens=False),
                                     method=method.name, nfe=nfe, seed=None, index=i, forward_passes=0)
                        for i, x in enumerate(ids)]
                ppl = next(r["ppl"] for r in aggregate(recs) if r["task"] == "open")
                res[tol] = (ids, secs, ppl)
            (e_ids, e_s, e_ppl), (s_ids, s_s, s_ppl) = res[0.0], res[a.tolerance]
            changed = sum(x != y for a_, b_ in zip(e_ids, s_ids) for x, y in zip(a_, b_))
            total = sum(len(x) for x in e_ids)
            rows.append({"method": method.name, "nfe": nfe, "changed_tokens": changed, "tokens": total,
                         "changed_samples": sum(a_ != b_ for a_, b_ in zip(e_ids, s_ids)), "samples": len(e_ids),
                         "ppl_exact": e_ppl, "ppl_sparse": s_ppl, "s_exact": e_s, "s_sparse": s_s})
            print(json.dumps(rows[-1]), flush=True)
    write_json(a.json, {"quick": a.quick, "tolerance": a.tolerance, "batch_size": cfg.batch_size,
                        "prompts": len(prompt_ids), "rows": rows})
