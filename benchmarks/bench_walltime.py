"""How long does one summary take at LLaDA-8B's size? The paper's wall-time protocol at its shapes, random weights.

Per dataset (XSum, CNN/DM, PubMed, arXiv) the prompts have the lengths of the paper's timing subset and the
responses its generation lengths (XSum 128, the others 256); the model is LLaDA-8B's shape (d 4096, 32 layers,
MLP 12,288, V 126,464) with random weights, so only the time means anything. Parts, each timed per sample after
one untimed warm-up call, the parts interleaved prompt by prompt:

  eager     DSL-SDE at NFE 8 / 16 / 32 / 64, batch 1 (the paper's setting)
  compiled  the same through `torch.compile` (SDEConfig.compile) on --compiled-datasets at --compiled-nfe
  batched   --batch prompts of a dataset in one call (left-padded), seconds per sample = call time / batch
  threshold LLaDA remasking with confidence-threshold parallel decoding (steps = gen_length, blocks of 32,
            --threshold), batch 1: seconds per sample, forward passes and tokens per forward. On random weights
            the confidences are not a trained model's, so the passes it takes say little about a real model's.

The table prints the median seconds per sample beside the paper's single-H100 table (its SDE timing stops before
the final decoding forward; ours includes it). On a CPU the default is a reduced model (`small` width, 2 layers,
2 prompts per dataset) and the output says so; on a GPU the full 32-layer model in bf16.

Prompt lengths come from `benchmarks/prompt_lengths.json` (committed; no data needed at run time). `--data-dir`
with `--write-lengths FILE` rebuilds that file from the summarisation files (`summ_*.jsonl`): LLaDA's tokenizer is not
available offline, so a prompt's length in tokens is estimated as ceil(words x 1.3) + 10 chat-template tokens
(words = whitespace-split words of the prompt after truncating the source to 1,500 words, as the paper's data).

Usage (GPU):  PYTHONPATH=src python3 benchmarks/bench_walltime.py --json OUT/walltime.json
      (CPU):  PYTHONPATH=src python benchmarks/bench_walltime.py --nfe 8 16 --json /tmp/walltime.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from bench_gpu import build
from benchlib import ROOT, clock, parse_args, write_json

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.sampling.common import PromptBatch
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.sampling.sde import sample_sde

LENGTHS = ROOT / "benchmarks" / "prompt_lengths.json"
DATASETS = {"xsum": ("summ_xsum.jsonl", 128), "cnndm": ("summ_cnndm.jsonl", 256),
            "pubmed": ("summ_pubmed.jsonl", 256), "arxiv": ("summ_arxiv.jsonl", 256)}
"""name -> (file under --data-dir, the paper's generation length)."""
PAPER_H100_SDE = {8: (0.76, 1.32, 2.21, 2.24), 16: (1.38, 2.38, 3.97, 4.02), 32: (2.44, 4.22, 7.07, 7.14),
                  64: (4.87, 8.44, 14.14, 14.27)}
"""The paper's wall-time table: median seconds per sample of DSL-SDE on one H100, XSum / CNN/DM / PubMed / arXiv."""
TOKENS_PER_WORD, TEMPLATE_TOKENS, SOURCE_WORDS, SUBSET = 1.3, 10, 1500, 20
MAX_SAMPLES, MAX_BATCH, MAX_NFE = 20, 64, 256


def prompt_lengths(data_dir: Path) -> dict:
    """The estimated prompt lengths (tokens) of each dataset's timing subset: RandomState(42) choice of 20 rows."""
    out: dict = {"derivation": f"tokens = ceil(words x {TOKENS_PER_WORD}) + {TEMPLATE_TOKENS} chat-template tokens; "
                               f"words = whitespace-split words of the prompt (instruction + source truncated to "
                               f"{SOURCE_WORDS} words); LLaDA's tokenizer is not available offline, so the ratio "
                               f"is an assumption typical of English BPE vocabularies of 100k+ entries, not a "
                               f"measurement. Rows: numpy RandomState(42).choice(n_rows, {SUBSET}, replace=False).",
                 "datasets": {}}
    for name, (fname, gen) in DATASETS.items():
        path = data_dir / fname
        if not path.is_file():
            raise SystemExit(f"error: {path} not found: --data-dir must hold {', '.join(f for f, _ in DATASETS.values())}")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        chosen = sorted(int(i) for i in np.random.RandomState(42).choice(len(rows), SUBSET, replace=False))
        words = [_words(rows[i]["prompt"]) for i in chosen]
        out["datasets"][name] = {"file": fname, "rows": len(rows), "gen_length": gen, "chosen_rows": chosen,
                                 "words": words,
                                 "prompt_tokens": [math.ceil(w * TOKENS_PER_WORD) + TEMPLATE_TOKENS for w in words]}
    return out


def _words(prompt: str) -> int:
    head, _, source = prompt.partition("\n\n")
    return len(head.split()) + min(len(source.split()), SOURCE_WORDS)


def prompts(model: DSLModel, lengths: list[int], device: str, seed: int) -> PromptBatch:
    """Random token ids of the given lengths (left-padded into one batch); the content does not matter here."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, model.vocab_size - 3, (n,), generator=g).tolist() for n in lengths]
    return PromptBatch.from_lists(rows, pad_id=model.special.pad_id, device=device)


def timed(fn, device: str) -> tuple[float, object]:
    box: list = []
    t = clock(lambda: box.append(fn()), device)
    return t, box[0]


class Plan:
    """Runs measurements until the time budget is spent; later ones are recorded as skipped."""

    def __init__(self, budget_s: float):
        self.t0, self.budget, self.skipped = time.perf_counter(), budget_s, []

    def ok(self, what: str) -> bool:
        if time.perf_counter() - self.t0 < self.budget:
            return True
        self.skipped.append(what)
        return False


def sde(model, pb, nfe, gen, device, compile=False):
    cfg = SDEConfig(nfe=nfe, gen_length=gen, compile=compile)
    gens = [torch.Generator().manual_seed(i) for i in range(pb.batch_size)]
    return timed(lambda: sample_sde(model, pb, cfg, generator=gens), device)


def threshold(model, pb, gen, tau, device):
    cfg = RemaskConfig(steps=gen, gen_length=gen, block_length=min(32, gen), threshold=tau)
    gens = [torch.Generator().manual_seed(i) for i in range(pb.batch_size)]
    return timed(lambda: sample_remask(model.backbone, pb, cfg, generator=gens), device)


def measure(model: DSLModel, lengths: dict, a, device: str, save=None) -> dict:
    """Every part's per-sample seconds, interleaved prompt by prompt; `save(results)` after each dataset (a run
    stopped from outside keeps the datasets already done)."""
    plan = Plan(a.budget_s)
    res: dict = {"eager": {}, "compiled": {}, "batched": {}, "threshold": {}}
    warm = prompts(model, [lengths[a.datasets[0]]["prompt_tokens"][0]], device, 0)
    sde(model, warm, min(a.nfe), 16, device)  # one untimed warm-up call of each path
    threshold(model, warm, 16, a.threshold, device)
    for name in a.datasets:
        d = lengths[name]
        gen, lens = d["gen_length"], d["prompt_tokens"][: a.samples]
        e = res["eager"].setdefault(name, {str(n): [] for n in a.nfe})
        th = res["threshold"].setdefault(name, {"s": [], "forward_passes": []})
        for i, n_tok in enumerate(lens):
            pb = prompts(model, [n_tok], device, i)
            for nfe in a.nfe:
                if plan.ok(f"eager {name} nfe {nfe} prompt {i}"):
                    e[str(nfe)].append(sde(model, pb, nfe, gen, device)[0])
            if a.threshold_samples > i and plan.ok(f"threshold {name} prompt {i}"):
                t, out = threshold(model, pb, gen, a.threshold, device)
                th["s"].append(t)
                th["forward_passes"].append(out.forward_passes)
        if name in a.compiled_datasets and plan.ok(f"compile {name}"):
            c = res["compiled"].setdefault(name, {str(n): [] for n in a.compiled_nfe})
            first = time.perf_counter()
            sde(model, prompts(model, [lens[0]], device, 0), min(a.compiled_nfe), gen, device, compile=True)
            c["first_call_s"] = time.perf_counter() - first  # compiles
            for i, n_tok in enumerate(lens):
                for nfe in a.compiled_nfe:
                    if plan.ok(f"compiled {name} nfe {nfe} prompt {i}"):
                        c[str(nfe)].append(sde(model, prompts(model, [n_tok], device, i), nfe, gen, device,
                                               compile=True)[0])
        if a.batch > 1:
            pb = prompts(model, [lens[i % len(lens)] for i in range(a.batch)], device, 0)
            b = res["batched"].setdefault(name, {"batch": a.batch, "padded_length": pb.length})
            for nfe in a.batched_nfe:
                if plan.ok(f"batched {name} nfe {nfe}"):
                    b[str(nfe)] = sde(model, pb, nfe, gen, device)[0] / a.batch
        say(f"[{time.perf_counter() - plan.t0:6.1f} s] {name} done")
        res["skipped"] = plan.skipped
        if save is not None:
            save(res)
    return res


def say(msg: str) -> None:
    print(msg, flush=True)


def _med(xs) -> float | None:
    return statistics.median(xs) if xs else None


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _range(xs: list[float]) -> str:
    """Median (min–max) of per-sample seconds; the median alone for one sample."""
    if len(xs) < 2:
        return _s(_med(xs))
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def table(res: dict, lengths: dict, a) -> str:
    """Markdown: per dataset and NFE the median seconds per sample of each part beside the paper's H100 figure."""
    names = list(DATASETS)
    head = ("| dataset | prompt tokens (median) | gen | NFE | SDE eager b1 s | compiled b1 s | batched s/sample | "
            "paper H100 s | threshold remask s | forwards (tokens/forward) |")
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    for name in a.datasets:
        d = lengths[name]
        th = res["threshold"].get(name, {})
        fw = _med(th.get("forward_passes", []))
        for j, nfe in enumerate(a.nfe):
            paper = PAPER_H100_SDE.get(nfe, (None,) * 4)[names.index(name)]
            b = res["batched"].get(name, {}).get(str(nfe))
            rows.append(f"| {name} | {statistics.median(d['prompt_tokens'][: a.samples]):.0f} | {d['gen_length']} | {nfe} "
                        f"| {_range(res['eager'].get(name, {}).get(str(nfe), []))} "
                        f"| {_s(_med(res['compiled'].get(name, {}).get(str(nfe), [])))} | {_s(b)} | {_s(paper)} "
                        + (f"| {_s(_med(th.get('s', [])))} | {fw:.0f} ({d['gen_length'] / fw:.1f}) |"
                           if j == 0 and fw else "| | |"))
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default=None, choices=["small", "8b"], help="default: 8b on a GPU, small on a CPU")
    ap.add_argument("--layers", type=int, default=None, help="depth (default: 32 on a GPU, 2 on a CPU)")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--nfe", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--samples", type=int, default=None, help="prompts per dataset (default 5 GPU, 2 CPU; at most 20)")
    ap.add_argument("--threshold", type=float, default=0.9, help="confidence threshold of the remasking part")
    ap.add_argument("--threshold-samples", type=int, default=2, help="prompts per dataset for the threshold part")
    ap.add_argument("--compiled-datasets", nargs="*", default=None, help="default: xsum on a GPU, none on a CPU")
    ap.add_argument("--compiled-nfe", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--batch", type=int, default=8, help="batch of the batched part (1 = skip it)")
    ap.add_argument("--batched-nfe", type=int, nargs="+", default=[16])
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting measurements after this many seconds")
    ap.add_argument("--lengths", default=str(LENGTHS), help="prompt-length file (default benchmarks/prompt_lengths.json)")
    ap.add_argument("--data-dir", default=None, help="with --write-lengths: the folder holding summ_*.jsonl")
    ap.add_argument("--write-lengths", default=None, help="rebuild the prompt-length file from --data-dir and exit")
    ap.add_argument("--overwrite", action="store_true", help="let --write-lengths replace an existing file")
    ap.add_argument("--json", default=None, help="write the results here (JSON)")
    a = parse_args(ap)
    if a.write_lengths:
        if not a.data_dir:
            ap.error("--write-lengths needs --data-dir (the folder holding the summ_*.jsonl files)")
        if Path(a.write_lengths).exists() and not a.overwrite:
            ap.error(f"{a.write_lengths} exists: pass --overwrite to replace it")
        Path(a.write_lengths).write_text(json.dumps(prompt_lengths(Path(a.data_dir)), indent=1) + "\n")
        say(f"wrote {a.write_lengths}")
        return 0
    gpu = a.device.startswith("cuda")
    a.preset = a.preset or ("8b" if gpu else "small")
    a.layers = a.layers or (32 if gpu else 2)
    a.samples = a.samples or (5 if gpu else 2)
    a.compiled_datasets = ["xsum"] if a.compiled_datasets is None and gpu else (a.compiled_datasets or [])
    for flag, v, lo, hi in (("--samples", a.samples, 1, MAX_SAMPLES), ("--batch", a.batch, 1, MAX_BATCH),
                            ("--layers", a.layers, 1, 64), ("--threshold-samples", a.threshold_samples, 0, MAX_SAMPLES)):
        if not lo <= v <= hi:
            ap.error(f"{flag} {v} is out of range: it must be in [{lo}, {hi}]")
    for n in [*a.nfe, *a.compiled_nfe, *a.batched_nfe]:
        if not (2 <= n <= MAX_NFE and n % 2 == 0):
            ap.error(f"NFE {n} is not valid: the Heun SDE needs an even NFE in [2, {MAX_NFE}]")
    if not 0 <= a.threshold <= 1:
        ap.error(f"--threshold {a.threshold} is out of range: it must be in [0, 1]")
    lengths = json.loads(Path(a.lengths).read_text())["datasets"]
    dtype = torch.bfloat16 if gpu else torch.float32
    full = a.preset == "8b" and a.layers == 32
    scope = "full LLaDA-8B shape" if full else f"REDUCED model ({a.preset} width, {a.layers} layers): not the paper's shape"
    say(f"wall time on {a.device} ({torch.cuda.get_device_name() if gpu else 'cpu'}), {scope}, {dtype}")
    t0 = time.perf_counter()
    model = build(a.preset, a.layers, a.device, dtype)
    say(f"built in {time.perf_counter() - t0:.1f} s")
    def save(res: dict, done: bool = False) -> None:
        write_json(a.json, {"scope": scope, "full_shape": full, "device": a.device, "complete": done,
                            "device_name": torch.cuda.get_device_name() if gpu else "cpu", "dtype": str(dtype),
                            "preset": a.preset, "layers": a.layers, "args": vars(a),
                            "paper_h100_sde_s": {str(k): dict(zip(DATASETS, v, strict=True))
                                                 for k, v in PAPER_H100_SDE.items()},
                            "results": res, "table": table(res, lengths, a)})

    res = measure(model, lengths, a, a.device, save)
    say(table(res, lengths, a))
    if res["skipped"]:
        say(f"skipped (time budget): {len(res['skipped'])} measurements, first: {res['skipped'][0]}")
    save(res, done=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
