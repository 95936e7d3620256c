"""Where the trained model's error enters the DSL-SDE on the toy world, from a finished demo's checkpoints.

Runs `dsl_llada.toy.diagnose` on the demo's held-out prompts with its DSL checkpoint and the exact oracle:

  kl         KL(oracle || model) per response position at every denoiser evaluation of DSL-SDE runs of the trained
             model, by SNR band and per evaluation, and the three decodes of the final state (model argmax, nearest
             noise embedding, oracle argmax) with where each one's first off-support token came from;
  swap       the trained model for the first k Heun steps and the oracle after, and the reverse, k = 0 .. S;
  tv         total-variation distance to the exact summary distribution, DSL-SDE and LLaDA remasking, trained and
             oracle denoisers, per NFE, with bootstrap interval and finite-sample floor;
  identical  how many outputs of each method of the demo's results.jsonl agree between two NFEs.

Usage: python scripts/toy_sde_diagnosis.py --demo-dir DIR [--out DIR/diagnosis] [--parts kl,swap,tv,identical]
       [--nfe 16] [--open N] [--tv-docs 8] [--tv-n 16] [--tv-nfes 4,8,16,32,64] [--threads T]
Writes OUT/diagnosis.json (everything) and OUT/diagnosis.md (the tables), with the environment record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dsl_llada.config import SDEConfig
from dsl_llada.runtime.environment import environment_record, finish_record
from dsl_llada.core.loading import load_model
from dsl_llada.core.model import DSLModel
import dsl_llada.toy.diagnose as D
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.oracle import oracle_models

PARTS = ("kl", "swap", "tv", "identical")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# DSL-SDE diagnosis of {result['demo_dir']}", ""]
    kl = result.get("kl")
    if kl:
        lines += [f"## KL(oracle || model) along the trained model's SDE trajectories (NFE {result['nfe']}, "
                  f"{kl['prompts']} open-ended prompts)", "",
                  "| SNR band | evaluations | KL / position | KL, oracle argmax a word | KL, oracle argmax the end | "
                  "argmax differs % |", "|---|---|---|---|---|---|"]
        for b in kl["bands"]:
            lo, hi = b["band"]
            lines.append(f"| [{lo:g}, {hi:g}) | {b['evaluations']} | {_fmt(b['kl'])} | {_fmt(b['kl_word'])} | "
                         f"{_fmt(b['kl_end'])} | {_fmt(None if b['disagree'] is None else 100 * b['disagree'], 1)} |")
        lines += ["", "| evaluation | step | phase | γ | KL / position | argmax differs % | mean ‖z‖ | training ‖z‖ | "
                  "model argmax = output % |", "|---|---|---|---|---|---|---|---|---|"]
        for e in kl["evaluations"]:
            lines.append(f"| {e['index']} | {e['step']} | {e['phase']} | {e['gamma']:.3g} | {_fmt(e['kl'])} | "
                         f"{100 * e['disagree']:.1f} | {e['state_norm']:.4g} | {e['training_norm']:.4g} | "
                         f"{100 * e['decided']:.1f} |")
        fd = kl["final_decodes"]
        lines += ["", "### The final decode (same final states)", "",
                  f"Model argmax agrees with the nearest noise embedding at {100 * fd['agreement_model_nearest']:.1f} % "
                  f"of positions, the oracle's argmax at {100 * fd['agreement_oracle_nearest']:.1f} %.", "",
                  "| decode | in support % | PPL | words | premature EOS % | off-support | first off token: state | "
                  "first off token: decode |", "|---|---|---|---|---|---|---|---|"]
        for name in ("model", "nearest", "oracle"):
            d = fd[name]
            r = d["rows"]["open"]
            lines.append(f"| {name} | {r['in_support']:.1f} | {r['ppl']:.2f} | {r['len']:.1f} | "
                         f"{r['premature_eos%']:.1f} | {d['off_support']} | {d['first_off_from_state']} | "
                         f"{d['first_off_from_decode']} |")
        lines.append("")
    swap = result.get("swap")
    if swap:
        lines += [f"## Swap runs (NFE {result['nfe']}; k = Heun steps by the first denoiser, the rest and the decode "
                  f"by the second; 'all' = the first throughout)", "",
                  "| order | k | in support % | PPL | words | premature EOS % |", "|---|---|---|---|---|---|"]
        for r in swap:
            if r["task"] == "open":
                lines.append(f"| {r['order']} | {r['k']} | {r['in_support']:.1f} | {r['ppl']:.2f} | {r['len']:.1f} | "
                             f"{r['premature_eos%']:.1f} |")
        lines.append("")
    tv = result.get("tv")
    if tv:
        lines += [f"## Total variation to the exact summary distribution ({tv['rows'][0]['documents']} documents, "
                  f"n = {tv['rows'][0]['n']} samples each; {tv['seconds']:.0f} s)", "",
                  "| method | denoiser | NFE | TV | 95 % interval | floor (n exact samples) |", "|---|---|---|---|---|---|"]
        for r in tv["rows"]:
            lines.append(f"| {r['method']} | {r['denoiser']} | {r['nfe']} | {r['tv']:.3f} | [{r['lo']:.3f}, "
                         f"{r['hi']:.3f}] | {r['floor']:.3f} |")
        lines.append("")
    same = result.get("identical")
    if same:
        lines += ["## Outputs identical between two NFEs (the demo's results.jsonl)", "",
                  "| method | task | NFE a | NFE b | identical |", "|---|---|---|---|---|"]
        for r in same:
            if r["identical"]:
                lines.append(f"| {r['method']} | {r['task']} | {r['nfe_a']} | {r['nfe_b']} | "
                             f"{r['identical']} / {r['n']} |")
        lines.append("")
    lines += [f"Command: `{result['command']}`", "", f"Environment: {json.dumps(result['environment'])}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo-dir", required=True, type=Path, help="a finished `dsl-llada demo --out DIR` folder")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default DEMO_DIR/diagnosis)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--nfe", type=int, default=16, help="NFE of the KL and swap runs (default 16)")
    ap.add_argument("--open", type=int, default=None, help="open-ended prompts (default: the demo's)")
    ap.add_argument("--swap-open", type=int, default=None, help="open-ended prompts of the swap runs (default --open)")
    ap.add_argument("--swap-ks", default=None, help="Heun steps k of the swap runs, e.g. 0,1,2,4,8,all (default all)")
    ap.add_argument("--tv-docs", type=int, default=8, help="summarisation documents of the TV table (default 8)")
    ap.add_argument("--tv-n", type=int, default=16, help="samples per document of the TV table (default 16)")
    ap.add_argument("--tv-nfes", default="4,8,16,32,64", help="NFEs of the TV table (default 4,8,16,32,64)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        print(f"error: --parts {args.parts!r} is not valid; expected a comma-separated subset of {list(PARTS)}",
              file=sys.stderr)
        return 2
    config_path = args.demo_dir / "config.json"
    dsl_dirs = sorted((args.demo_dir / "cache").glob("cpt-dsl-*"))
    if len(dsl_dirs) != 1:
        print(f"error: --demo-dir {str(args.demo_dir)!r} holds {len(dsl_dirs)} DSL checkpoints (cache/cpt-dsl-*); it "
              f"needs exactly one: run `dsl-llada demo --out DIR` into a fresh folder first", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # the demo writes config.json when it finishes; before that its checkpoint is the default demo's
    cfg = DemoConfig.from_dict(json.loads(config_path.read_text())["demo"]) if config_path.is_file() else DemoConfig()
    demo = Demo(cfg, args.demo_dir, progress=False, echo=lambda *a: None)
    train, evals = demo.corpora()
    base = demo.pretrained(train).eval()
    dsl = load_model(dsl_dirs[0], special=demo.special).eval()
    if not isinstance(dsl, DSLModel):
        print(f"error: {dsl_dirs[0]} is not a DSL checkpoint", file=sys.stderr)
        return 2
    models: dict[str, Any] = {"base": base, "dsl": dsl, **oracle_models(demo.world, demo.special, dsl)}
    oracle = models["oracle-dsl"]
    opens = [e for e in evals if e.task == "open"][: args.open]
    docs = [e for e in evals if e.task == "summarize"][: args.tv_docs]
    sde = SDEConfig(nfe=args.nfe, gen_length=demo.gen_length)
    out = args.out or args.demo_dir / "diagnosis"
    out.mkdir(parents=True, exist_ok=True)
    env = environment_record(device="cpu", dtype=torch.float32, seeds={"demo": cfg.seed})
    result: dict[str, Any] = {"demo_dir": str(args.demo_dir), "nfe": args.nfe,
                              "command": "python scripts/toy_sde_diagnosis.py " + " ".join(sys.argv[1:] if argv is None
                                                                                          else argv)}
    def save() -> None:  # after every part, so a long run's finished parts are kept
        (out / "diagnosis.json").write_text(json.dumps({**result, "environment": finish_record(env)},
                                                       indent=1) + "\n")

    if "identical" in parts:
        result["identical"] = D.identical_outputs(_records(args.demo_dir))
    if "kl" in parts:
        t = time.perf_counter()
        kl = D.trajectory_kl(dsl, oracle, demo.world, demo.tok, opens, sde, seed=cfg.seed, batch_size=cfg.batch_size)
        done = {(r["index"]): r["output"] for r in _records(args.demo_dir)
                if r["method"] == "DSL-SDE" and r["nfe"] == args.nfe and r["task"] == "open"}
        texts = [" ".join(_words(demo, ids)) for ids in kl.pop("outputs")]
        kl["same_as_demo"] = sum(done.get(i) == t for i, t in enumerate(texts)) if done else None
        kl["prompts"], kl["seconds"] = len(opens), time.perf_counter() - t
        result["kl"] = kl
        print(f"kl: {kl['seconds']:.0f} s", flush=True)
        save()
    if "swap" in parts:
        t = time.perf_counter()
        ks = None if args.swap_ks is None else [k if k == "all" else int(k) for k in args.swap_ks.split(",")]
        result["swap"] = D.swap_runs(dsl, oracle, demo.world, demo.tok, opens[: args.swap_open], sde, seed=cfg.seed,
                                     batch_size=cfg.batch_size, ks=ks)
        result["swap_seconds"] = time.perf_counter() - t
        print(f"swap: {result['swap_seconds']:.0f} s", flush=True)
        save()
    if "tv" in parts:
        t = time.perf_counter()
        rows = D.tv_rows(models, demo.world, demo.tok, docs, nfes=_ints(args.tv_nfes), n=args.tv_n, seed=cfg.seed,
                         batch_size=max(1, args.tv_docs * args.tv_n))
        result["tv"] = {"rows": rows, "seconds": time.perf_counter() - t}
        print(f"tv: {result['tv']['seconds']:.0f} s", flush=True)
        save()
    result["environment"] = finish_record(env)
    (out / "diagnosis.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "diagnosis.md").write_text(markdown(result))
    print(f"wrote {out / 'diagnosis.md'}")
    return 0


def _records(demo_dir: Path) -> list[dict[str, Any]]:
    path = demo_dir / "results.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _words(demo: Demo, ids: list[int]) -> list[str]:
    from dsl_llada.toy.tasks import response_words

    return response_words(demo.tok.decode(ids, skip_special_tokens=False))


if __name__ == "__main__":
    sys.exit(main())
