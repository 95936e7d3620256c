"""How many sampled tokens survive a change of thread count, instruction set or batch size (docs/reproducibility.md).

    # one run: sample the quick demo's held-out prompts with three samplers, save the token ids
    ATEN_CPU_CAPABILITY=avx2 python scripts/token_agreement.py run --demo-dir DEMO --threads 1 --out a.json
    # compare two runs: fraction of identical tokens and of identical responses, per sampler
    python scripts/token_agreement.py compare a.json b.json
    # training: the quick demo's pretraining for N steps under this process's instruction set and threads
    ATEN_CPU_CAPABILITY=avx2 python scripts/token_agreement.py train --steps 100 --out w-avx2.safetensors
    python scripts/token_agreement.py compare-weights w-native.safetensors w-avx2.safetensors

DEMO is the --out folder of a finished `dsl-llada demo --quick` (its cache/ holds the checkpoints). Seeds are per
prompt (the toy evaluation's), so batch size alone never changes a row's random draws; what differs between runs is
only floating-point rounding (kernel choice, summation order) and whatever it flips downstream.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run(demo_dir: Path, threads: int, batch_size: int, nfe: int, out: Path, n_open: int | None = None) -> None:
    import torch

    from dsl_llada.core.backbones import load_backbone
    from dsl_llada.runtime.environment import environment_record, finish_record, set_threads
    from dsl_llada.sampling.batches import run_batches
    from dsl_llada.core.model import DSLModel
    from dsl_llada.toy.demo import Demo, DemoConfig
    from dsl_llada.toy.evaluate import Method
    from dsl_llada.toy.tasks import render_prompt

    set_threads(threads)
    env = environment_record(device="cpu", dtype=torch.float32, seeds={"toy_evaluation": 0})
    demo = Demo(DemoConfig.preset(quick=True), demo_dir, progress=False, echo=lambda *_: None)
    _, evals = demo.corpora(n_open, None if n_open is None else n_open // 2)
    cache = demo_dir / "cache"
    base = load_backbone(next(cache.glob("pretrained-mdm-*")), special=demo.special).eval()
    dsl = DSLModel.from_pretrained(next(cache.glob("cpt-dsl-*"))).eval()
    prompts = [demo.tok.encode(render_prompt(e.prompt), add_special_tokens=False) for e in evals]
    methods = [Method("DSL-SDE", "dsl", "sde"), Method("DSL-SDE (eta=0)", "dsl", "sde", {"eta": 0.0}),
               Method("LLaDA", "base", "remask")]
    ids: dict[str, list[list[int]]] = {}
    with torch.no_grad():
        for m in methods:
            model = dsl if m.model == "dsl" else base
            by_index: dict[int, list[int]] = {}
            for batch in run_batches(model, prompts, m.config(nfe, demo.gen_length), batch_size=batch_size,
                                     seed_of=lambda i: i, retry=False):
                by_index.update({r.index: list(r.ids) for r in batch})
            ids[m.name] = [by_index[i] for i in range(len(prompts))]
    out.write_text(json.dumps({"threads": threads, "batch_size": batch_size, "nfe": nfe, "prompts": len(prompts), "ids": ids,
                               "environment": finish_record(env)}) + "\n")


def train(steps: int, threads: int, out: Path) -> None:
    from safetensors.torch import save_file

    from dsl_llada.runtime.environment import set_threads
    from dsl_llada.toy.demo import Demo, DemoConfig

    set_threads(threads)
    cfg = DemoConfig.preset(quick=True)
    demo = Demo(cfg.replace(pretrain=cfg.pretrain.replace(steps=steps)), out.parent, progress=False,
                echo=lambda *_: None)
    train_set, _ = demo.corpora()
    from dsl_llada.toy.demo_train import run_stage

    bb = demo._fresh_backbone()
    curve = run_stage(bb, demo.tok, train_set, demo.cfg.pretrain, seed=cfg.seed, block_size=demo._block(train_set),
                      gen_length=demo.gen_length, progress=False)
    save_file({k: v.contiguous() for k, v in bb.state_dict().items()}, str(out),
              metadata={"final_loss": repr(curve[-1])})


def compare_weights(a: Path, b: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        diffs = {k: float((fa.get_tensor(k) - fb.get_tensor(k)).abs().max()) for k in fa.keys()}
        scale = max(float(fa.get_tensor(k).abs().max()) for k in fa.keys())
        loss = (fa.metadata()["final_loss"], fb.metadata()["final_loss"])
    return {"max_abs_diff": max(diffs.values()), "identical_tensors": sum(v == 0 for v in diffs.values()),
            "tensors": len(diffs), "max_abs_weight": scale, "final_loss": loss}


def compare(a: dict, b: dict) -> dict:
    res = {}
    for name in a["ids"]:
        x, y = a["ids"][name], b["ids"][name]
        same_tok = sum(p == q for rx, ry in zip(x, y) for p, q in zip(rx, ry))
        total = sum(len(r) for r in x)
        res[name] = {"identical_tokens": same_tok / total, "identical_responses": sum(rx == ry for rx, ry in zip(x, y)) / len(x),
                     "responses": len(x)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--demo-dir", required=True, type=Path)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--batch-size", type=int, default=24)
    r.add_argument("--nfe", type=int, default=16)
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--prompts", type=int, default=None, metavar="N",
                   help="N open-ended + N/2 summarisation prompts (default: the quick demo's 16 + 8)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=100)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--out", required=True, type=Path)
    w = sub.add_parser("compare-weights")
    w.add_argument("a", type=Path)
    w.add_argument("b", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.demo_dir, a.threads, a.batch_size, a.nfe, a.out, a.prompts)
    elif a.cmd == "train":
        train(a.steps, a.threads, a.out)
    elif a.cmd == "compare-weights":
        print(json.dumps(compare_weights(a.a, a.b), indent=1))
    else:
        print(json.dumps(compare(json.loads(a.a.read_text()), json.loads(a.b.read_text())), indent=1))


if __name__ == "__main__":
    sys.exit(main())
