"""Where the demo's off-grammar SDE text comes from: excess loss over the Bayes floor and demo quality against the
training recipe (pretraining steps, DSL steps, SNR distribution, learning rate, the MDM-CPT control at equal steps).

Trains the demo's models (its world, corpora, architecture and objectives) and, at each evaluation point, records:
the excess loss over the exact oracle (DSL: averaged over the training SNR distribution and on an SNR grid; MDM:
on a mask-rate grid), and the open-ended / summarisation quality of DSL-SDE at the paper's defaults (DSL models) or
LLaDA remasking (MDM models) at NFE 8, 16 and 64, scored exactly. Phase 1 pretrains the masked DLM (checkpoints
saved); phase 2 runs the variants in parallel worker processes (a GPU runs several tiny models at once). Every
finished point is appended to OUT/study.jsonl; a global deadline stops the training loops (what was reached is
recorded).

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python scripts/toy_recipe_study.py --out DIR --device cuda --budget 300
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from dsl_llada.core.backbones import load_backbone, save_backbone
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.toy import make_split
from dsl_llada.toy.bayes_floor import dsl_curve, dsl_excess, mdm_curve
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.demo_train import run_stage, sft_tensors
from dsl_llada.toy.evaluate import Method, aggregate, sample_records

VARIANTS = {
    # name: (objective, base checkpoint, stage overrides, evaluation points)
    "dsl-current": ("dsl", "base-3000", {}, (1000,)),
    "dsl-long": ("dsl", "base-final", {}, (1000, 2000, 4000, 8000)),
    "dsl-pertoken": ("dsl", "base-final", {"snr_per_token": True}, (1000, 2000, 4000)),
    "dsl-lr2x": ("dsl", "base-final", {"lr": 1e-3}, (1000, 2000, 4000)),
    "mdm-cpt": ("mdm", "base-final", {}, (1000, 4000)),
}
SDE = Method("DSL-SDE", "dsl", "sde")
LLADA = Method("LLaDA", "base", "remask")
NFES = (8, 16, 64)
CURVE_SNRS = (0.5, 2.0, 8.0, 32.0)


def log(out: Path, rec: dict) -> None:
    with open(out / "study.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k not in ("rows", "curve")}), flush=True)


def setup(device: str):
    demo = Demo(DemoConfig(), Path("/tmp/unused"), progress=False, echo=lambda *a: None)
    train, evals = demo.corpora()
    held = make_split(demo.world, 64, "open", "valid") + make_split(demo.world, 64, "summarize", "valid")
    block = demo._block(train + held)
    ids, plen = sft_tensors(demo.tok, held, demo.gen_length, block)
    return demo, train, evals, ids, plen, block


def evaluate(demo, evals, ids, plen, model, kind: str, device: str) -> dict:
    t = time.perf_counter()
    rec: dict = {}
    if kind == "dsl":
        rec["excess_train_snr"] = dsl_excess(model.cpu(), demo.world, demo.special, ids, plen).as_dict()
        rec["curve"] = [p.as_dict() for p in dsl_curve(model, demo.world, demo.special, ids, plen, snrs=CURVE_SNRS)]
        models, methods = {"dsl": model.to(device)}, [SDE]
    else:
        rec["curve"] = [p.as_dict() for p in mdm_curve(model.cpu(), demo.world, demo.special, ids, plen)]
        models, methods = {"base": model.to(device)}, [LLADA]
    records = sample_records(models, demo.world, demo.tok, evals, methods, NFES, gen_length=demo.gen_length,
                             batch_size=72)
    rec["rows"] = [{k: v for k, v in r.items() if k in ("method", "task", "nfe", "ppl", "ppl_ci", "in_support",
                                                         "in_support_ci", "len", "rougeL", "rougeL_ci", "rep")}
                   for r in aggregate(records)]
    rec["eval_s"] = time.perf_counter() - t
    return rec


def pretrain(args, out: Path) -> None:
    demo, train, evals, ids, plen, block = setup(args.device)
    bb = demo._fresh_backbone().to(args.device)
    stage = demo.cfg.pretrain.replace(steps=args.pretrain_steps)
    t0 = time.perf_counter()

    def check(step: int, model) -> bool:
        late = time.time() > args.deadline
        if step == 3000 or step == args.pretrain_steps or late:
            names = ["base-3000"] if step == 3000 else ["base-final"] + [] if (out / "base-3000").exists() \
                else ["base-final", "base-3000"]
            for name in names:
                save_backbone(model.cpu(), out / name)
            rec = evaluate(demo, evals, ids, plen, model, "mdm", args.device)
            model.to(args.device)
            log(out, {"variant": "pretrain", "step": step, "train_s": time.perf_counter() - t0, **rec})
        return late

    run_stage(bb, demo.tok, train, stage, seed=demo.cfg.seed, block_size=block, gen_length=demo.gen_length,
              progress=False, check=check, check_every=min(500, args.pretrain_steps))


def worker(args, out: Path) -> None:
    objective, base_name, overrides, points = VARIANTS[args.variant]
    points = tuple(max(1, p // args.scale) for p in points)
    demo, train, evals, ids, plen, block = setup(args.device)
    base = load_backbone(out / base_name, special=demo.special)
    if objective == "dsl":
        model = DSLModel.convert(base, DSLConfig(converter=ConverterConfig(noise_dim=demo.cfg.noise_dim, beta_init=1.0,
                                                                           noise_seed=demo.cfg.seed)))
    else:
        model = base
    model = model.to(args.device)
    stage = demo.cfg.cpt.replace(objective=objective, steps=max(points), **overrides)
    t0 = time.perf_counter()

    def check(step: int, m) -> bool:
        if step in points:
            rec = evaluate(demo, evals, ids, plen, m, objective, args.device)
            m.to(args.device)
            log(out, {"variant": args.variant, "step": step, "train_s": time.perf_counter() - t0, **rec})
        return time.time() > args.deadline

    run_stage(model, demo.tok, train, stage, seed=demo.cfg.seed + 1, block_size=block, gen_length=demo.gen_length,
              progress=False, check=check, check_every=min(points))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for the whole study (training stops then)")
    ap.add_argument("--pretrain-steps", type=int, default=6000)
    ap.add_argument("--scale", type=int, default=1, help="divide every step count by this (a quick check of the script)")
    ap.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per process (the oracle and scoring run there)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.variant:
        worker(args, out)
        return 0
    start = time.time()
    args.deadline = start + args.budget * 0.4
    pretrain(args, out)
    common = ["--out", str(out), "--device", args.device, "--deadline", str(start + args.budget), "--scale",
              str(args.scale), "--threads", str(args.threads)]
    procs = [subprocess.Popen([sys.executable, __file__, *common, "--variant", v]) for v in VARIANTS]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
