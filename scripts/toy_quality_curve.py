"""Trained DSL-SDE quality against the DSL stage's excess loss over the Bayes floor, on the demo's world.

`run` trains the demo's DSL stage (its world, corpora, architecture, objective and seed; from the shipped base or
another backbone folder) and, at each evaluation point, records the held-out excess loss over the exact oracle (γ
from the training mix, and on an SNR grid) and the exact open-ended quality of DSL-SDE (the paper's defaults) and of
remasking on the same DSL model (`DSL-Remask`) at NFE 16 on the demo's 48 held-out prompts. Every point is appended
to the output JSONL. `plot` draws in-support %, words and premature EOS % against the excess for every variant in
one or more such files, with the exact oracle's SDE and the world as references, and prints the table.

    python scripts/toy_quality_curve.py run --name demo --points 250,500,750,1000,1250,1500 --out curve.jsonl
    python scripts/toy_quality_curve.py run --name ema --ema 0.995 --points 750,1250 --out curve.jsonl
    python scripts/toy_quality_curve.py plot curve.jsonl --png curve.png
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.toy.bayes_floor import dsl_curve, dsl_excess
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.demo_train import run_stage
from dsl_llada.toy.evaluate import Method, aggregate, sample_records

METHODS = (Method("DSL-SDE", "dsl", "sde"), Method("DSL-Remask", "dsl", "remask"))
SNRS = (0.3, 1.0, 3.0, 7.0, 16.0, 32.0, 74.0)
KEEP = ("method", "task", "nfe", "ppl", "ppl_ci", "in_support", "in_support_ci", "len", "premature_eos%")
ORACLE_SDE = {"in_support": 100.0, "len": 12.23, "premature_eos%": 4.2}
"""Oracle DSL-SDE at NFE 16 on the same 48 prompts (the default demo's report); the world's own samples: 11.8 words."""
WORLD_WORDS = 11.8


def _setup():
    demo = Demo(DemoConfig(), Path("unused"), progress=False, echo=lambda *x: None)
    train, evals = demo.corpora()
    return demo, train, [e for e in evals if e.task == "open"]


def _base(demo, train, folder: str | None):
    """The demo's own pretrained model (the shipped one for its configuration), or a backbone folder."""
    if folder is None:
        return demo.pretrained(train)
    from dsl_llada.core.loading import load_model
    return load_model(Path(folder), special=demo.special)


def _evaluate(demo, evals, model, name: str, step: int, t0: float, args) -> dict:
    ids, plen = demo.heldout()
    rec = {"name": name, "step": step, "train_s": time.time() - t0, "args": vars(args),
           "excess": dsl_excess(model, demo.world, demo.special, ids, plen, seed=0).excess,
           "curve": {str(p.level): round(p.excess, 4) for p in dsl_curve(model, demo.world, demo.special, ids, plen,
                                                                          snrs=SNRS)}}
    recs = sample_records({"dsl": model}, demo.world, demo.tok, evals, METHODS, (16,), gen_length=demo.gen_length,
                          batch_size=len(evals))
    rec["rows"] = [{k: r[k] for k in KEEP if k in r} for r in aggregate(recs)]
    return rec


def run(args) -> int:
    torch.set_num_threads(args.threads)
    demo, train, evals = _setup()
    model = DSLModel.convert(_base(demo, train, args.base),
                             DSLConfig(converter=ConverterConfig(noise_dim=demo.cfg.noise_dim, beta_init=1.0,
                                                                 noise_seed=demo.cfg.seed)))
    stage = demo.cfg.cpt.replace(steps=max(args.points))
    ema = copy.deepcopy(model) if args.ema else None
    t0 = time.time()

    def average(step: int, m: torch.nn.Module) -> None:
        if ema is not None:
            with torch.no_grad():
                d = min(args.ema, step / (9 + step))
                for pe, pm in zip(ema.parameters(), m.parameters()):
                    pe.mul_(d).add_(pm.detach(), alpha=1 - d)

    def evaluate(step: int, m: torch.nn.Module) -> bool:
        if step in args.points:
            target = ema.eval() if ema is not None else m
            rec = _evaluate(demo, evals, target, args.name, step, t0, args)
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps({k: rec[k] for k in ("name", "step", "excess")}), flush=True)
        return False

    # the demo's DSL stage itself (`run_stage`, seed + 1): the same draws, the same model at every update
    run_stage(model, demo.tok, train, stage, seed=demo.cfg.seed + 1, block_size=demo._block(train),
              gen_length=demo.gen_length, progress=False, check=evaluate, check_every=math.gcd(*args.points),
              on_update=average)
    return 0


def _rows(paths):
    for p in paths:
        for line in Path(p).read_text().splitlines():
            rec = json.loads(line)
            for row in rec.get("rows", []):
                if row.get("task", "open") == "open":
                    yield rec, row.get("method", "DSL-SDE"), row


def plot(args) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = list(_rows(args.files))
    print("| variant | DSL updates | excess (training mix) | excess at γ 3 / 7 / 32 | method | in support % | words | "
          "premature EOS % |")
    print("|---|---|---|---|---|---|---|---|")
    for rec, method, row in sorted(data, key=lambda t: (t[0].get("variant", t[0]["name"]), t[0]["step"], t[1])):
        c = rec["curve"]
        bands = " / ".join(f"{c[k]:.3f}" for k in ("3.0", "7.0", "32.0") if k in c) or "—"
        print(f"| {rec.get('variant', rec['name'])} | {rec['step']:,} | {rec['excess']:.3f} | {bands} | {method} | "
              f"{row['in_support']:.0f} | {row['len']:.1f} | {row['premature_eos%']:.0f} |")
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.6))
    for ax, key, label in zip(axes, ("in_support", "len", "premature_eos%"), ("in support %", "words", "premature EOS %")):
        for method, marker in (("DSL-SDE", "o"), ("DSL-Remask", "s")):
            pts = sorted((rec["excess"], row[key], rec.get("variant", rec["name"])) for rec, m, row in data if m == method)
            for variant in sorted({p[2] for p in pts}):
                xs = [p[0] for p in pts if p[2] == variant]
                ys = [p[1] for p in pts if p[2] == variant]
                ax.plot(xs, ys, marker=marker, linestyle="-" if method == "DSL-SDE" else ":",
                        label=f"{method}, {variant}")
        ax.axhline(ORACLE_SDE[key], color="k", linestyle="--", linewidth=1, label="oracle DSL-SDE")
        if key == "len":
            ax.axhline(WORLD_WORDS, color="grey", linestyle=":", linewidth=1, label="world")
        ax.set_xlabel("held-out excess loss over the Bayes floor (nats / position)")
        ax.set_ylabel(label)
        ax.invert_xaxis()
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle("Trained DSL model, NFE 16, 48 open-ended prompts: quality against excess loss")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the demo's DSL stage and evaluate it at --points")
    r.add_argument("--name", required=True)
    r.add_argument("--points", type=lambda s: sorted({int(x) for x in s.split(",")}), required=True,
                   help="comma-separated update counts to evaluate at (the last is the stage length)")
    r.add_argument("--base", default=None, help="a backbone folder (default: the shipped pretrained model)")
    r.add_argument("--ema", type=float, default=0.0, help="evaluate an exponential moving average of the weights")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", required=True)
    p = sub.add_parser("plot", help="draw and tabulate one or more result files")
    p.add_argument("files", nargs="+")
    p.add_argument("--png", required=True)
    args = ap.parse_args()
    if args.cmd == "run" and (not args.points or args.points[0] < 1 or args.points[-1] > 20_000):
        ap.error(f"--points must be update counts from 1 to 20000, got {args.points}")
    return run(args) if args.cmd == "run" else plot(args)


if __name__ == "__main__":
    sys.exit(main())
