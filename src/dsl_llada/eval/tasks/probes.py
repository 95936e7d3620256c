"""Probes as a task (docs/provenance.md §5.2/§5.3), wrapping `dsl_llada.eval.forward_probes`: mask accuracy + ECE (15 bins)
at mask rates 30/50/70 % with a reliability diagram, and context robustness (30 % masked, c % of the context
corrupted, micro accuracy). One-forward task: items are keyed by model and text.

Options: mask_rates, corrupt_pcts, context (bool, default true), paths (['discrete'] | 'converter'),
use_token_ids, id_range, max_tokens (256), bins (15). The converter phase table is a library call
(`dsl_llada.eval.forward_probes.converter_phase_table`), not a per-text item.
"""

from __future__ import annotations

from typing import Any

from ..eval_config import DatasetSpec, ModelSpec
from ..samples import Sample, check_usable, pick_field, read_rows, row_id, sliced
from .task import SummaryContext, TaskSummary, usable_paths

OPTIONS = ("mask_rates", "corrupt_pcts", "context", "paths", "use_token_ids", "id_range", "max_tokens", "bins")


class ProbesTask:
    name = "probes"
    sampling = False

    def check_options(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"probes: unknown option(s) {unknown}; valid: {list(OPTIONS)}")
        for r in options.get("mask_rates", []):
            if not (isinstance(r, (int, float)) and 0 < r < 1):
                raise ValueError(f"probes: mask rate {r!r} must be a fraction in (0, 1), e.g. 0.3")
        for p in options.get("paths", []):
            if p not in ("discrete", "converter"):
                raise ValueError(f"probes: path {p!r} is not valid; expected 'discrete' or 'converter'")

    def samples(self, ds: DatasetSpec, options: dict[str, Any]) -> list[Sample]:
        rows = read_rows(ds.path)
        tf = pick_field(ds, "text", ("text",), rows)
        idf = pick_field(ds, "id", ("id",), rows, required=False)
        use_ids = bool(options.get("use_token_ids"))
        if use_ids:
            pick_field(ds, "tokens", ("tokens",), rows)
        out = []
        for i, row in sliced(ds, rows):
            if isinstance(row.get(tf), str) and row[tf].strip():
                info = {"text": row[tf], **({"tokens": row["tokens"]} if use_ids else {})}
                out.append(Sample(row_id(ds, row, i, idf), i, row[tf], False, info))
        return check_usable(ds, out, len(rows), f"rows need a non-empty {tf!r}")

    def variants(self, ds: DatasetSpec, options: dict[str, Any], model: ModelSpec) -> list[tuple[str, dict[str, Any]]]:
        extra = {k: options[k] for k in ("id_range", "max_tokens") if k in options}
        out = []
        for path in usable_paths(options, model):  # 'converter' only on DSL checkpoints
            out += [(f"mask{r:g}/{path}", {"probe": "mask", "rate": float(r), "path": path, **extra})
                    for r in options.get("mask_rates", [0.3, 0.5, 0.7])]
            if options.get("context", True):
                out.append((f"context/{path}", {"probe": "context", "path": path,
                                                "corrupt_pcts": list(options.get("corrupt_pcts", [0, 10, 20, 30, 50])),
                                                **extra}))
        return out

    def run_batch(self, loaded, samples: list[Sample], params: dict[str, Any], seed: int, mode: str
                  ) -> list[tuple[dict[str, Any] | None, str | None]]:
        from .. import forward_probes as P

        texts = [s.info.get("tokens") or s.info["text"] for s in samples]
        ids = [s.index for s in samples]
        max_tokens = params.get("max_tokens", 256)
        if params["probe"] == "mask":
            recs = P.mask_calibration_records(loaded.model, loaded.tokenizer, texts, mask_rate=params["rate"], seed=seed,
                                              batch_size=len(samples), text_ids=ids, path=params["path"],
                                              max_tokens=max_tokens, mode=mode)
            by = {r["text_id"]: {"n_masked": len(r["positions"]), "confidence": r["confidence"], "correct": r["correct"]}
                  for r in recs}
        else:
            idr = params.get("id_range")
            recs = P.context_robustness_records(loaded.model, loaded.tokenizer, texts, corrupt_pcts=params["corrupt_pcts"],
                                                seed=seed, batch_size=len(samples), text_ids=ids, path=params["path"],
                                                max_tokens=max_tokens, id_range=tuple(idr) if idr else None)
            by = {}
            for r in recs:
                by.setdefault(r["text_id"], {"levels": {}})["levels"][str(r["corrupt_pct"])] = [r["n_masked"], r["n_correct"]]
        return [(by.get(s.index, {"skipped": True}), None) for s in samples]

    def summarize(self, records: list[dict[str, Any]], ctx: SummaryContext) -> TaskSummary:
        from .. import forward_probes as P

        bins = int(ctx.task.options.get("bins", 15))
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault((r["dataset"], r["variant"], r["method"]), []).append(r)
        rows, figs = [], []
        cal = ["| dataset | variant | model | texts | masked tokens | accuracy % | ECE | mean confidence |",
               "|---|---|---|---|---|---|---|---|"]
        rob = ["| dataset | path | model | texts | " + " | ".join(f"c={c}%" for c in ctx.task.options.get(
            "corrupt_pcts", [0, 10, 20, 30, 50])) + " |", "|---|---|---|---|" + "---|" * len(ctx.task.options.get(
                "corrupt_pcts", [0, 10, 20, 30, 50]))]
        for (ds, variant, model), recs in groups.items():
            ms = [r["metrics"] for r in recs if r.get("error") is None and r.get("metrics") and not r["metrics"].get("skipped")]
            row: dict[str, Any] = {"dataset": ds, "variant": variant, "model": model, "method": model, "nfe": 0,
                                   "n": len(recs), "scored": len(ms), "errors": sum(r.get("error") is not None for r in recs)}
            if variant.startswith("mask") and ms:
                s = P.calibration_summary(ms, bins=bins, mode=ctx.mode)
                row.update({"accuracy": 100 * s["accuracy"], "ece": s["ece"], "mean_confidence": s["mean_confidence"],
                            "n_tokens": s["n_tokens"], "bins": s["bins"]})
                name = f"reliability_{ds}_{variant.replace('/', '_')}_{model}.png"
                p = P.reliability_diagram(s, ctx.figures_dir / name, title=f"{model} {ds} {variant}: acc "
                                          f"{100 * s['accuracy']:.1f}% ECE {s['ece']:.3f}")
                figs.append(str(p.relative_to(ctx.run_dir)))
                cal.append(f"| {ds} | {variant} | {model} | {len(ms)} | {s['n_tokens']} | {100 * s['accuracy']:.1f} | "
                           f"{s['ece']:.4f} | {s['mean_confidence']:.3f} |")
            elif variant.startswith("context") and ms:
                acc = {}
                for c in ms[0]["levels"]:
                    n = sum(m["levels"][c][0] for m in ms)
                    acc[c] = 100.0 * sum(m["levels"][c][1] for m in ms) / n if n else None
                row["accuracy_by_corruption"] = acc
                rob.append(f"| {ds} | {variant.split('/', 1)[1]} | {model} | {len(ms)} | " +
                           " | ".join("–" if v is None else f"{v:.1f}" for v in acc.values()) + " |")
            rows.append(row)
        md = ["Mask accuracy and calibration (micro over masked tokens; ECE with "
              f"{bins} equal-width bins, {ctx.mode} mode):", "", *cal, "", "Context robustness (30 % masked; "
              "accuracy % on masked positions, micro):", "", *rob]
        return TaskSummary(rows=rows, markdown="\n".join(md), figures=figs)
