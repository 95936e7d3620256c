"""Scoring probes on the toy demo's checkpoints: Fix/Clean on both input paths (and across converter SNR),
mask accuracy + ECE, context robustness, and the converter phase table.

Usage: python scripts/toy_scoring_figures.py DEMO_OUT [--quick]
DEMO_OUT is a `dsl-llada demo [--quick] --out DEMO_OUT` folder whose cache/ holds the trained checkpoints
(nothing is trained if the cache matches). Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dsl_llada.eval import fix_clean as C
from dsl_llada.eval import forward_probes as P
from dsl_llada.eval.report import markdown_table
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.evaluate import error_correction


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    demo = Demo(DemoConfig.preset(quick=a.quick), a.out, progress=False, echo=lambda *_: None)
    train, evals = demo.corpora()
    base = demo.pretrained(train).eval()
    dsl = demo.adapted(base, train, "dsl").eval()
    tok, n_words = demo.tok, len(demo.world.words)
    ev = evals[: demo.cfg.n_eval_open]
    texts = [e.response for e in ev if e.response.strip()]
    t0 = time.perf_counter()
    print("## Toy demo Fix/Clean table (dsl_llada.toy.evaluate.error_correction)\n")
    print(markdown_table(error_correction({"base": base, "dsl": dsl}, tok, ev, n_words=n_words, seed=42),
                         [("model", "model", ""), ("rate", "corrupted", ".0%"), ("fix", "Fix", ".1f"),
                          ("clean", "Clean", ".1f"), ("n_texts", "texts", "")]))
    rows = []
    for label, model, path, gamma in [("base", base, "discrete", None), ("dsl", dsl, "discrete", None),
                                      ("dsl", dsl, "converter", None)] + \
                                     [("dsl", dsl, "converter", g) for g in (5.0, 10.0, 25.0, 50.0, 100.0)]:
        for rate in (0.1, 0.3, 0.5):
            recs = C.fix_clean_records(model, tok, texts, rate=rate, path=path, gamma=gamma, seed=42,
                                       batch_size=16, id_range=(0, n_words))
            agg = C.aggregate_fix_clean(recs)
            rows.append({"model": label, "path": path, "gamma": "clean" if gamma is None else gamma, "rate": rate,
                         **{k: 100 * agg[k] for k in ("fix", "clean", "selective")}, "n": agg["n"]})
    print("\n## Fix/Clean by input path and converter SNR (batched)\n")
    print(markdown_table(rows, [("model", "model", ""), ("path", "path", ""), ("gamma", "SNR", ""),
                                ("rate", "corrupted", ".0%"), ("fix", "Fix %", ".1f"), ("clean", "Clean %", ".1f"),
                                ("selective", "Selective %", ".1f"), ("n", "texts", "")]))
    cal = []
    for label, model, path in (("base", base, "discrete"), ("dsl", dsl, "discrete"), ("dsl", dsl, "converter")):
        for r in (0.3, 0.5, 0.7):
            s = P.calibration_summary(P.mask_calibration_records(model, tok, texts, mask_rate=r, seed=42, path=path))
            cal.append({"model": label, "path": path, "rate": r, "acc": 100 * s["accuracy"], "ece": s["ece"],
                        "n": s["n_tokens"]})
    print("\n## Mask accuracy and ECE (15 bins)\n")
    print(markdown_table(cal, [("model", "model", ""), ("path", "path", ""), ("rate", "masked", ".0%"),
                               ("acc", "acc %", ".1f"), ("ece", "ECE", ".3f"), ("n", "tokens", "")]))
    rob = []
    for label, model in (("base", base), ("dsl", dsl)):
        for s in P.context_robustness_summary(P.context_robustness_records(model, tok, texts, seed=0, min_tokens=8,
                                                                            id_range=(0, n_words))):
            rob.append({"model": label, **s, "accuracy": 100 * s["accuracy"]})
    print("\n## Context robustness (30 % masked, c % of the context corrupted; micro accuracy)\n")
    print(markdown_table(rob, [("model", "model", ""), ("corrupt_pct", "c %", ""), ("accuracy", "acc %", ".1f"),
                               ("n_masked", "masked tokens", ""), ("n_texts", "texts", "")]))
    words = texts[0].split()[:2]
    ids = [tok.convert_tokens_to_ids(w) for w in words]
    phase = P.converter_phase_table(dsl, ids, snrs=(1, 5, 10, 25, 50), n_seeds=20, seed=0, tokenizer=tok)
    print(f"\n## Converter phase table (DSL toy model, trained beta {dsl.trained_beta:.2f}, 20 seeds)\n")
    print(markdown_table(phase, [("token", "token", ""), ("snr", "SNR", ".0f"), ("top1", "top-1", ""),
                                 ("top1_count", "top-1 seeds", ""), ("top1_distinct", "distinct top-1", ""),
                                 ("hit", "hit", ""), ("top2", "top-2", ""), ("top3", "top-3", ""),
                                 ("gold_cos", "gold cos", ".2f")]))
    print(f"\n(probes took {time.perf_counter() - t0:.0f} s on a contended 2-core CPU)")


if __name__ == "__main__":
    main()
