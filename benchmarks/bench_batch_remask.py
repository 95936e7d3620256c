"""Remasking at batch 8 vs batch 1 per sample, before/after the row-chunked logsumexp of the remasking step.

Issue 21 item 3: on CPU, batch 8 cost more per sample than batch 1 for remasking (profiled: the step's whole-tensor
logsumexp over (8, W, V) fp32 logits, whose ~67 MB temporaries the allocator maps fresh, page-faulting, every step).
`remask_step.row_logsumexp` does it over row chunks of <= 8 MiB, bit for bit the same values. This script times the
old whole-tensor call ("before", put back by patching the module) against the new one ("after"), interleaved per
round, on the small LLaDA-shaped model of bench_dtype.py at 2 layers (prompt 64 + response 64, 16 steps, fp32 and
bf16), wall and process CPU time per sample, 1 thread, and checks the tokens are identical.

Usage:  python benchmarks/bench_batch_remask.py ROUNDS OUT.json     (ROUNDS 1-10)
"""
import importlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dtype as bd
from benchlib import random_prompts

from dsl_llada.config import RemaskConfig
from dsl_llada.environment import environment_record, finish_record
from dsl_llada.sampling.remask import sample_remask

rs = importlib.import_module("dsl_llada.sampling.remask_step")
torch.set_num_threads(1)
if len(sys.argv) != 3 or not sys.argv[1].isdigit() or not 1 <= int(sys.argv[1]) <= 10:
    sys.exit("usage: bench_batch_remask.py ROUNDS(1-10) OUT.json")
env = environment_record()
P, R = 64, 64
new_fn = rs.row_logsumexp
def old_fn(x):
    return torch.logsumexp(x, dim=-1)

models = {n: bd.build("small", dt, 2)[0] for n, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
res, ids = {}, {}
def run(model, batch, n, key):
    pb = random_prompts(model, batch, P)
    w, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        out = sample_remask(model.backbone, pb, RemaskConfig(steps=16, gen_length=R),
                            generator=[torch.Generator().manual_seed(i) for i in range(batch)])
    ids.setdefault(key, []).append(out.ids.tolist())
    return (time.perf_counter() - w) / (n * batch), (time.process_time() - c) / (n * batch)
with torch.no_grad():
    run(models["fp32"], 1, 1, "warm")
    for rnd in range(int(sys.argv[1])):
        for name, m in models.items():
            for batch, n in ((1, 2), (8, 1)):
                for variant, fn in (("before", old_fn), ("after", new_fn)):
                    rs.row_logsumexp = fn
                    res.setdefault(f"{name} b{batch} {variant}", []).append(run(m, batch, n, f"{name} b{batch} {variant}"))
        print("round", rnd, os.getloadavg(), flush=True)
out = {}
for k, v in res.items():
    out[k] = {"wall": statistics.median(x for x, _ in v), "cpu": statistics.median(y for _, y in v), "all": v}
    print(k, "wall %.3f cpu %.3f" % (out[k]["wall"], out[k]["cpu"]), [f"{x:.3f}/{y:.3f}" for x, y in v], flush=True)
for name in models:
    for variant in ("before", "after"):
        a, b = out[f"{name} b1 {variant}"], out[f"{name} b8 {variant}"]
        print(f"{name} {variant}: b8/b1 per sample wall {b['wall']/a['wall']:.2f} cpu {b['cpu']/a['cpu']:.2f}")
    for b in (1, 8):
        print(name, b, "identical tokens before/after:", ids[f"{name} b{b} before"] == ids[f"{name} b{b} after"])
json.dump({"results": out, "env": finish_record(env)}, open(sys.argv[2], "w"), default=str)
