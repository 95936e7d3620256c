"""Evaluation-runner overhead, reported as a ratio (the table of docs/benchmarks/cpu-sampling.md is rendered from the
--json results: `python scripts/docs_tables.py --write-pages cpu-eval-overhead`).

efficiency = pure sampler time / eval time (wall clock, and CPU time of the process, which a machine shared with
other jobs disturbs far less), for the same work items (same prompts, same batches, same
per-row generators): the pure side encodes the prompts and calls the batch runner's `run_batch` batch by batch; the eval side is
`run_eval` on a fresh folder (data reading, planning, tokenisation, batching, record building and the fsynced
JSONL appends, merge; report off). Both include loading the model folders once. One untimed round of each side
runs first, so neither pays the process's one-time costs. Target >= 0.95.

Model: a LLaDA-architecture model (d=128, 4 layers) with a DSL converter over the toy world's word-level
tokenizer; prompts: configs/eval/toy-data/toy_open.jsonl (16) x 2 seeds; gen 64; DSL-SDE and LLaDA remasking at NFE 16;
batch 16.

Usage:  python benchmarks/bench_eval.py [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchlib import parse_args, run_environment, write_json

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "configs" / "eval" / "toy-data" / "toy_open.jsonl"


def build(root: Path) -> dict[str, Path]:
    from dsl_llada.core.backbones import save_backbone
    from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
    from dsl_llada.config import ConverterConfig, DSLConfig
    from dsl_llada.core.model import DSLModel
    from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids

    world = ToyWorld(ToyWorldConfig(seed=0, n_topics=4, max_sentences=3, gen_length=32))
    tok = build_tokenizer(world)
    sp = special_ids(tok)
    cfg = tiny_llada_config(len(tok), d_model=128, n_layers=4, n_heads=4, mask_token_id=sp["mask"], eos_token_id=sp["eos"],
                            eot_token_id=sp["eot"], bos_token_id=sp["bos"], max_sequence_length=512)
    bb = LLaDABackbone(cfg)
    bb.init_weights(torch.Generator().manual_seed(0), std=0.3)
    save_backbone(bb.eval(), root / "mdm")
    tok.save_pretrained(root / "mdm")
    DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=32))).save_pretrained(root / "dsl")
    tok.save_pretrained(root / "dsl")
    return {"dsl": root / "dsl", "mdm": root / "mdm"}


def config(models: dict[str, Path]):
    from dsl_llada.eval.eval_config import EvalConfig

    return EvalConfig.from_dict({
        "models": [{"name": "dsl", "path": str(models["dsl"])}, {"name": "mdm", "path": str(models["mdm"])}],
        "methods": [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"}, {"name": "LLaDA", "model": "mdm", "preset": "llada"}],
        "tasks": [{"name": "generation", "datasets": [{"name": "toy_open", "path": str(DATA), "kind": "prompts", "gen_length": 64}]}],
        "nfe": [16], "seeds": [0, 1], "batch_size": 16, "device": "cpu"})


def pure_sampler(cfg) -> tuple[float, float]:
    """The same batches as the runner's plan, straight through the sampler (model load included)."""
    from dsl_llada.eval import models as M
    from dsl_llada.eval.runner import build_plan
    from dsl_llada.sampling.batches import run_batch

    t0, c0 = time.perf_counter(), time.process_time()
    toks = {m.name: M.load_tokenizer_for(m) for m in cfg.models}
    plan = build_plan(cfg, toks)
    loaded = {m.name: M.load(m, "cpu") for m in cfg.models}
    for b in plan.batches:
        lm = loaded[b.model]
        ids = [plan.prompt_ids[(b.task, b.dataset, b.model, s.id)] for s in b.samples]
        with torch.no_grad():
            run_batch(lm.model, ids, getattr(b.choice, "config", b.choice), [b.seed + s.index for s in b.samples])
    return time.perf_counter() - t0, time.process_time() - c0


def eval_run(cfg, out: Path) -> tuple[float, float]:
    from dsl_llada.eval.runner import run_eval

    t0, c0 = time.perf_counter(), time.process_time()
    run_eval(cfg, out, progress=False, report=False)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating pure/eval rounds; medians are reported")
    ap.add_argument("--json", default=None, help="write every round's times and this run's environment record here")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier on a busy CPU)")
    a = parse_args(ap)
    if a.rounds < 1:
        print(f"error: --rounds {a.rounds} is not valid; give 1 or more", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = config(build(root / "models"))
        pure_sampler(cfg)  # one untimed round first: the process's one-time costs (first calls, imports) in neither
        eval_run(cfg, root / "warmup")
        pure, ev = [], []
        for i in range(a.rounds):
            pure.append(pure_sampler(cfg))
            ev.append(eval_run(cfg, root / f"run{i}"))
        with open(root / "run0" / "records.jsonl") as f:
            n_items = sum(1 for _ in f)
    pw, ew = statistics.median(x[0] for x in pure), statistics.median(x[0] for x in ev)
    pc, ec = statistics.median(x[1] for x in pure), statistics.median(x[1] for x in ev)
    res = {"items": n_items, "rounds": a.rounds, "threads": a.threads,
           "wall": {"sampler_s": pw, "eval_s": ew, "efficiency": pw / ew},
           "cpu": {"sampler_s": pc, "eval_s": ec, "efficiency": pc / ec},
           "per_round": [{"sampler_wall_s": p[0], "eval_wall_s": e[0], "sampler_cpu_s": p[1], "eval_cpu_s": e[1]}
                         for p, e in zip(pure, ev)]}
    print(json.dumps({**res, "environment": run_environment()}))
    write_json(a.json, res)
    return 0 if pc / ec >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
