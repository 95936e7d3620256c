"""Remasking at batch 8 vs batch 1 per sample, before/after the row-chunked logsumexp of the remasking step.

Issue 21 item 3: on CPU, batch 8 cost more per sample than batch 1 for remasking (profiled: the step's whole-tensor
logsumexp over (8, W, V) fp32 logits, whose ~67 MB temporaries the allocator maps fresh, page-faulting, every step).
`remask_step.row_logsumexp` does it over row chunks of <= 8 MiB, bit for bit the same values. This script times the
old whole-tensor call ("before", put back by patching the module) against the new one ("after"), interleaved per
round, on the small LLaDA-shaped model of bench_dtype.py at 2 layers (prompt 64 + response 64, 16 steps, fp32 and
bf16), wall and process CPU time per sample, and checks the tokens are identical.

Usage:  python benchmarks/bench_batch_remask.py --rounds 3 --json OUT.json [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

P, R = 64, 64


def main() -> None:
    import bench_dtype as bd
    from benchlib import parse_args, random_prompts, run_environment

    from dsl_llada.config import RemaskConfig
    from dsl_llada.sampling.remask import sample_remask

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, choices=range(1, 11), metavar="1-10")
    ap.add_argument("--json", default=None, help="write the results and the environment record here")
    a = parse_args(ap)  # --threads: default the usable CPUs (the run in docs used --threads 1)
    rs = importlib.import_module("dsl_llada.sampling.remask_step")
    new_fn = rs.row_logsumexp

    def old_fn(x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(x, dim=-1)

    models = {n: bd.build("small", dt, 2)[0] for n, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    res: dict[str, list] = {}
    ids: dict[str, list] = {}

    def run(model, batch: int, n: int, key: str) -> tuple[float, float]:
        pb = random_prompts(model, batch, P)
        w, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            out = sample_remask(model.backbone, pb, RemaskConfig(steps=16, gen_length=R),
                                generator=[torch.Generator().manual_seed(i) for i in range(batch)])
        ids.setdefault(key, []).append(out.ids.tolist())
        return (time.perf_counter() - w) / (n * batch), (time.process_time() - c) / (n * batch)

    with torch.no_grad():
        run(models["fp32"], 1, 1, "warm")
        for rnd in range(a.rounds):
            for name, m in models.items():
                for batch, n in ((1, 2), (8, 1)):
                    for variant, fn in (("before", old_fn), ("after", new_fn)):
                        rs.row_logsumexp = fn
                        key = f"{name} b{batch} {variant}"
                        res.setdefault(key, []).append(run(m, batch, n, key))
            rs.row_logsumexp = new_fn
            print("round", rnd, os.getloadavg(), flush=True)
    out = {}
    for k, v in res.items():
        out[k] = {"wall": statistics.median(x for x, _ in v), "cpu": statistics.median(y for _, y in v), "all": v}
        print(k, "wall %.3f cpu %.3f" % (out[k]["wall"], out[k]["cpu"]), [f"{x:.3f}/{y:.3f}" for x, y in v], flush=True)
    for name in models:
        for variant in ("before", "after"):
            b1, b8 = out[f"{name} b1 {variant}"], out[f"{name} b8 {variant}"]
            print(f"{name} {variant}: b8/b1 per sample wall {b8['wall'] / b1['wall']:.2f} cpu {b8['cpu'] / b1['cpu']:.2f}")
        for b in (1, 8):
            print(name, b, "identical tokens before/after:", ids[f"{name} b{b} before"] == ids[f"{name} b{b} after"])
    if a.json:
        Path(a.json).write_text(json.dumps({"results": out, "env": run_environment()}, default=str) + "\n")


if __name__ == "__main__":
    main()
