"""Why the toy demo's numbers move between machines: which float differences reach its results (docs/toy-world.md).

Prints JSON with
  * threads:  max |param diff| after STEPS toy pretraining steps with 1 vs 2 intra-op threads (same process);
  * kernel:   the parameters after STEPS steps are saved to --save; run the script twice, once plainly and once with
              `ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2`, then `--compare A B` reports the difference
              (another CPU kernel path, as on another machine);
  * batch:    with a demo's cached DSL checkpoint (--demo-dir, made by `dsl-llada demo [--quick] --out DIR`), how many
              NFE-16 SDE outputs are identical when sampled in one batch and one prompt at a time.

Usage:  python benchmarks/bench_approx.py fp-drift --save /tmp/p.pt [--steps 20] [--demo-dir DIR --quick]
        python benchmarks/bench_approx.py fp-drift --compare /tmp/p.pt /tmp/p_avx2.pt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from benchlib import demo_checkpoints, run_environment

from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.demo_train import TrainStage, run_stage
from dsl_llada.toy.evaluate import Method, aggregate, sample_records


def train_params(demo: Demo, train, steps: int, threads: int) -> torch.Tensor:
    torch.set_num_threads(threads)
    bb = demo._fresh_backbone()
    stage = TrainStage(objective="mdm", steps=steps, lr=2e-3, warmup=min(5, steps), stratified_t=True)
    run_stage(bb, demo.tok, train, stage, seed=0, block_size=demo._block(train), gen_length=demo.gen_length,
              progress=False, desc="drift")
    return torch.cat([p.detach().flatten() for p in bb.parameters()])


def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {"identical": bool(torch.equal(a, b)), "max_abs": float(d.max()), "relative": float(d.norm() / a.norm())}


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save", default=None, help="save the 1-thread parameters here (for --compare)")
    ap.add_argument("--compare", nargs=2, default=None, metavar=("A", "B"))
    ap.add_argument("--demo-dir", default=None, help="a demo output folder whose cache holds the DSL checkpoint")
    ap.add_argument("--quick", action="store_true", help="the demo in --demo-dir is a --quick one")


def run(a: argparse.Namespace) -> None:
    if a.compare:
        pair = [torch.load(path, weights_only=True) for path in a.compare]
        print(json.dumps({**diff(*pair), "environment": run_environment()}, indent=1))
        return
    demo = Demo(DemoConfig.preset(quick=a.quick), Path(a.demo_dir or "unused-demo-dir"), progress=False,
                echo=lambda s: None)
    train, evals = demo.corpora()
    one = train_params(demo, train, a.steps, 1)
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "steps": a.steps,
           "threads_1_vs_2": diff(one, train_params(demo, train, a.steps, 2))}
    torch.set_num_threads(1)
    if a.save:
        torch.save(one, a.save)
    if a.demo_dir:
        _, dsl = demo_checkpoints(demo, train, a.demo_dir)
        ev = [e for e in evals if e.task == "open"]
        for name, opts in (("DSL-SDE", {}), ("eta=0", {"eta": 0.0}), ("printed", {"predictor_noise": False})):
            m = Method(name, "dsl", "sde", opts)
            runs = [sample_records({"dsl": dsl}, demo.world, demo.tok, ev, [m], [16], gen_length=demo.gen_length,
                                   batch_size=bs) for bs in (48, 1)]
            out[f"batch48_vs_1/{name}"] = {"identical": sum(x["output"] == y["output"] for x, y in zip(*runs)),
                                           "n": len(runs[0]), "ppl": [aggregate(r)[0]["ppl"] for r in runs]}
    print(json.dumps({**out, "environment": run_environment()}, indent=1))
