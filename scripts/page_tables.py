"""The tables of the benchmark pages (docs/benchmarks/*.md), rendered from the results the benchmark scripts write.

Each registered table sits on its page between ``<!-- docs-table: NAME -->`` and ``<!-- /docs-table -->`` and is
rendered from one or more files in ``benchmarks/results/`` by the renderer for that results kind (the JSON of
``bench_gpu.py``, ``bench_walltime.py``, ``bench_threshold.py`` and so on). Rendering reads JSON only: no model
runs, no torch, so ``python scripts/docs_tables.py --check-pages`` takes well under a second.

A measurement table on a benchmark page that has no results file to render it from is listed in ``NOT_GENERATED``
with the reason; ``--lint`` names those and fails on a measurement table that is neither registered nor listed.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Results = Any
"""One results file as loaded: a JSON value, or for ``.jsonl`` the list of its lines' values."""


@dataclass(frozen=True)
class PageTable:
    name: str
    page: str
    """File under docs/benchmarks/."""
    results: tuple[str, ...]
    """Files under benchmarks/results/, passed to `render` in this order."""
    render: Callable[..., str]
    """Returns the table's Markdown (header, rule, rows) from the loaded results."""


@dataclass(frozen=True)
class NotGenerated:
    page: str
    section: str
    """The heading (without the leading #'s) of the section that holds the table(s)."""
    reason: str


def load(path: Path) -> Results:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def render(table: PageTable, results_dir: Path) -> str:
    return table.render(*(load(results_dir / f) for f in table.results)).rstrip("\n")


# ---------------------------------------------------------------------------------------------------- formatting


def md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _f(x: float | None, digits: int, scale: float = 1.0) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2 ** 30:.2f}"


def _range(xs: Sequence[float], digits: int, sep: str = "–") -> str:
    return f"{min(xs):.{digits}f}{sep}{max(xs):.{digits}f}"


def _med(xs: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _each(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def with_environment(render_fn: Callable[..., str]) -> Callable[..., str]:
    """`render_fn`'s Markdown followed by the environment line of the first results file."""
    def rendered(*rs: Results) -> str:
        return render_fn(*rs).rstrip("\n") + "\n\n" + environment_line(rs[0].get("environment"))
    rendered.__doc__ = render_fn.__doc__
    return rendered


# ------------------------------------------------------------------------------------------- bench_gpu.py (GPU)


def gpu_batches(r: Results) -> str:
    """`bench_gpu.py --json`: per batch, the SDE call, whole SDE and remasking samples, MFU and peak memory."""
    rows = []
    for b, x in r["batches"].items():
        call, sde, rm = x.get("call", {}), x.get("sde", {}), x.get("remask", {})
        rows.append([b, _f(call.get("ms_per_call"), 1), _f(call.get("flops_done", {}).get("total"), 1, 1e-9),
                     _pct(call.get("mfu")), _f(sde.get("s_per_sample"), 3), _f(sde.get("samples_per_s"), 2),
                     _f(sde.get("tokens_per_s"), 0), _pct(sde.get("mfu")), _f(rm.get("s_per_sample"), 3),
                     _f(rm.get("tokens_per_s"), 0), _pct(rm.get("mfu")), _gib(x.get("peak_memory_bytes"))])
    return md(["batch", "SDE call ms", "call GFLOP", "call MFU", "SDE s/sample", "SDE samples/s", "SDE tokens/s",
               "SDE MFU", "remask s/sample", "remask tokens/s", "remask MFU", "peak GiB"], rows)


# ----------------------------------------------------------------------------------------- bench_walltime.py

_DATASETS = {"xsum": "XSum", "cnndm": "CNN/DM", "pubmed": "PubMed", "arxiv": "arXiv"}


def walltime_long(r: Results) -> str:
    """`bench_walltime.py --json`: one row per dataset and NFE (the script's own table, kept in its `table`)."""
    return str(r["table"])


def walltime_by_dataset(r: Results) -> str:
    """`bench_walltime.py --json`: one row per dataset, SDE median (min–max over prompts) at each NFE, the paper's
    H100 times, and threshold-decoded remasking with its forward passes. The prompt length and generation length of
    each dataset are read from the script's own table (the JSON holds them only there)."""
    long_rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in str(r["table"]).splitlines()[2:]]
    nfes = [str(n) for n in r["args"]["nfe"]]
    rows = []
    for ds in r["args"]["datasets"]:
        mine = [x for x in long_rows if x[0] == ds]
        sde = []
        for n in nfes:
            t = r["results"]["eager"].get(ds, {}).get(n, [])
            sde.append(f"{statistics.median(t):.2f} ({_range(t, 2)})" if t else "—")
        paper = " / ".join(f"{r['paper_h100_sde_s'][n][ds]:.2f}" for n in nfes)
        th = r["results"]["threshold"].get(ds, {})
        thr = (f"{statistics.median(th['s']):.2f} ({statistics.median(th['forward_passes']):.0f})"
               if th.get("s") else "—")
        rows.append([_DATASETS.get(ds, ds), mine[0][1], mine[0][2], *sde, paper, thr])
    return md(["dataset", "prompt tokens (median)", "gen", *(f"SDE NFE {nfes[0]}", *(f"NFE {n}" for n in nfes[1:])),
               f"paper H100, NFE {' / '.join(nfes)}", "threshold remasking (forwards)"], rows)


# ---------------------------------------------------------------------------------------- bench_threshold.py


def threshold_gpu(r: Results) -> str:
    """`bench_threshold.py --json`: threshold decoding against fixed steps, samples/s and the per-round speed-up."""
    fixed_steps = r["args"]["fixed_steps"]
    rows = []
    for b, x in r["results"].items():
        th, fx, sp = x["threshold"], x["fixed"], x["speedup_vs_fixed"]
        rows.append([b, str(th["forward_passes"]), f"{th['tokens_per_forward']:.1f}", f"{th['samples_per_s']:.2f}",
                     f"{fx['samples_per_s']:.2f}", f"**{sp['median']:.2f}×** ({_range([sp['min'], sp['max']], 2)})"])
    return md(["batch", "threshold: forwards", "tokens per forward", "samples/s", f"fixed {fixed_steps} steps: samples/s",
               "speed-up (median, min–max)"], rows)


def _secs(x: dict[str, float], digits: int) -> str:
    return f"{x['median']:.{digits}f} ({x['min']:.{digits}f}–{x['max']:.{digits}f})"


def _decimals(x: float, significant: int) -> int:
    """Decimals that show `x` to `significant` figures (0.360, 3.73, 29.1 at three)."""
    return max(0, significant - 1 - math.floor(math.log10(abs(x)))) if x else significant - 1


def threshold_cpu(r: Results) -> str:
    """`bench_threshold.py --json`: passes, steps per block of each row, and the time per call of both samplers
    (three significant figures), and the per-round ratio fixed / threshold (two)."""
    fixed_steps = r["args"]["fixed_steps"]
    rows = []
    for b, x in r["results"].items():
        th, fx, sp = x["threshold"], x["fixed"], x["speedup_vs_fixed"]
        d = _decimals(sp["median"], 2)
        rows.append([b, str(th["forward_passes"]), ", ".join(str(s) for s in th["steps_per_block"]),
                     f"{th['tokens_per_forward']:.1f}", _secs(th["s_per_call"], _decimals(th["s_per_call"]["median"], 3)),
                     _secs(fx["s_per_call"], _decimals(fx["s_per_call"]["median"], 3)),
                     f"**{sp['median']:.{d}f}×** ({_range([sp['min'], sp['max']], d)})"])
    return md(["batch", "threshold: forward passes", "steps per block, per row", "tokens per forward",
               "s per call, median (min–max)", f"fixed {fixed_steps} steps: s per call", "fixed / threshold, per round"],
              rows)


# ------------------------------------------------------------------------------------- bench_percall.py loop


def loop_efficiency(r: Results) -> str:
    """`bench_percall.py loop --json`: each sampler's calls, one call alone, the whole run, and the loop's share; with
    several NFEs (`nfes`) one row per NFE and sampler, the ratios as median (min–max over the rounds)."""
    if "nfes" not in r:  # one NFE, one round
        rows = [[name, str(x["calls"]), f"{1000 * x['t_call_s']:.1f}", f"{1000 * x['t_total_s']:.1f}",
                 f"{x['efficiency']:.3f}", f"{x['in_run']:.3f}"] for name, x in r["loop_efficiency"].items()]
        return md(["sampler", "model calls", "one call alone (ms)", "whole sampling (ms)", "loop efficiency",
                   "in-run share in model calls"], rows)
    names = {"sde": "SDE", "remask": "remasking"}
    rows = []
    for nfe, by_sampler in r["loop_efficiency"].items():
        for name, x in by_sampler.items():
            rows.append([nfe, names.get(name, name), str(x["calls"]), f"{1000 * x['t_call_s']:.1f}",
                         f"{1000 * x['t_total_s']:.1f}",
                         f"{x['efficiency']:.3f} ({_range(x['efficiency_rounds'], 3)})",
                         f"{x['in_run']:.3f} ({_range(x['in_run_rounds'], 3)})"])
    return md(["NFE / steps", "sampler", "model calls", "one call alone (ms)", "whole sampling (ms)",
               f"loop efficiency (min–max over {r['rounds']} rounds)", "in-run share in model calls (min–max)"], rows)


def loop_throughput(r: Results) -> str:
    """`bench_percall.py loop --json`: SDE seconds per batch and samples per second at each batch size."""
    rows = [[b, f"{x['seconds']:.2f}", f"{x['samples_per_s']:.2f}"] for b, x in r["throughput"].items()]
    nfe = f", NFE {r['throughput_nfe']}" if "throughput_nfe" in r else ""
    return md(["batch", f"seconds per batch (SDE{nfe})", "samples/s"], rows)


def loop_converter_memory(r: Results) -> str:
    """`bench_percall.py loop --json` on a CPU: the converter's peak RSS growth with and without token chunks, the
    size of one (L, V+1) fp32 buffer, and the ratio of the two peaks."""
    m = r["converter_memory"]
    rows = [["unchunked", f"{m['unchunked']['growth_kib'] / 1024:.0f}", f"{m['pi_bytes_unchunked_MiB']:.0f}"],
            ["256-token chunks", f"{m['chunk256']['growth_kib'] / 1024:.0f}", f"{m['pi_bytes_chunk256_MiB']:.0f}"]]
    cut = m["unchunked"]["growth_kib"] / max(1, m["chunk256"]["growth_kib"])
    return (md(["variant", "RSS growth during the call (MiB)", "one (L, V+1) fp32 buffer (MiB)"], rows)
            + f"\n\nChunking cuts the converter's peak by **{cut:.1f}×**.")


# ------------------------------------------------------------------------------------ bench_percall.py roofline

_ROOFLINE_SDE = [("slot", "converter: slot logits βzKᵀ+b", "slot", "one addmm, cached K"),
                 ("softmax", "converter: softmax over V+1", None, "elementwise"),
                 ("values", "converter: πWᵀ+c (dense)", "values", ""),
                 ("converter", "converter, whole", "converter", ""),
                 ("t_blocks", "backbone blocks (256 positions)", "blocks", ""),
                 ("t_head", "output head + final norm (128 response rows)", "head", ""),
                 ("t_head_all", "(head over all 256 rows, as the authors)", "head_all", "not run by the samplers"),
                 ("posterior_topk", "posterior mean: top-512 (torch.topk)", None, "selection, no FLOPs"),
                 ("posterior_topm", "posterior mean: top-512 (top_m_values)", None, "same tokens, sampled threshold"),
                 ("posterior_bag", "posterior mean: embedding_bag", "posterior_bag", ""),
                 ("posterior", "posterior mean, whole", "posterior_bag", ""),
                 ("call", "**whole SDE call**", "needed_sde", "")]


def _roofline_row(label: str, flops: float | None, secs: float, peak_gflops: float, note: str) -> list[str]:
    if flops is None:
        return [label, "–", f"{1e3 * secs:.2f}", "–", "–", note]
    gfs = flops / secs / 1e9
    return [label, f"{flops / 1e9:.3f}", f"{1e3 * secs:.2f}", f"{gfs:.1f}", f"{100 * gfs / peak_gflops:.0f} %", note]


_ROOFLINE_HEADER = ["component", "GFLOP", "ms", "GFLOP/s", "of peak", "note"]


def roofline_sde(r: Results) -> str:
    """`bench_percall.py roofline --json`: each part of one SDE call (median over the schedule's SNRs) with its
    FLOPs, rate and share of the measured matmul peak; the whole call against the FLOP time of its needed work."""
    peak, fl = r["peak_gflops"], {**r["flops"], "converter": r["flops"]["slot"] + r["flops"]["values"],
                                  "needed_sde": r["needed_sde_flops"]}
    rows = []
    for key, label, work, note in _ROOFLINE_SDE:
        secs = r[key] if key.startswith("t_") else r["times_s"][key]
        if key == "call":
            note = f"{r['sde_call_vs_flop_time']:.2f}× the FLOP time of the needed work"
        rows.append(_roofline_row(label, fl[work] if work else None, secs, peak, note))
    return (md(_ROOFLINE_HEADER, rows) + f"\n\nMeasured fp32 matmul peak (best square `torch.mm`, n ≤ 2048, fastest of "
            f"{r['reps']} per size): **{peak:.1f} GFLOP/s**; whole SDE call **{r['sde_call_vs_flop_time']:.2f}×** the FLOP "
            f"time of its needed work, one remasking step **{r['remask_step_vs_flop_time']:.2f}×**.")


def roofline_remask(r: Results) -> str:
    """`bench_percall.py roofline --json`: one remasking step's forward and the whole step (a 16-step run / 16)."""
    peak, work = r["peak_gflops"], r["needed_rm_flops"]
    rows = [_roofline_row("forward: blocks + head on the current block", work, r["t_remask_forward"], peak, ""),
            _roofline_row("**whole remasking step** (16-step run / 16)", work, r["t_remask_step"], peak,
                          f"{r['remask_step_vs_flop_time']:.2f}× the FLOP time of the needed work")]
    return md(_ROOFLINE_HEADER, rows)


def roofline_sparse(r: Results) -> str:
    """`bench_percall.py roofline --json`: the sparse converter's kept slots, error and time at each SNR, and whether
    an NFE-16 SDE run keeps its tokens with it."""
    rows = [[f"{s['gamma']:.2f}", f"{s['kept_mean']:.1f} ({s['kept_max']})",
             f"{s['max_abs_dh']:.2e} ({s['max_abs_h']:.2f})", f"{s['t_dense_ms']:.2f}", f"{s['t_sparse_ms']:.2f}"]
            for s in r["sparse"]]
    same = ("identical tokens" if r["sparse_same_tokens"]
            else f"{r['sparse_tokens_changed']} tokens differ")
    return (md(["SNR γ", f"kept slots at tolerance {r['tolerance']:g}, mean (max)", "max abs Δh (max abs h)",
                "dense πWᵀ ms", "sparse ms"], rows)
            + f"\n\nNFE-16 SDE run with vs without the sparse converter: {same}.")


# ------------------------------------------------------------------------------------ bench_percall.py ablation


def percall_ablation(r: Results) -> str:
    """`bench_percall.py ablation --json`: each variant's NFE-16 SDE run time, minor page faults and speed-up
    against the variant with neither change."""
    rows = [[x["variant"], f"{x['median_s']:.3f} ({x['min_s']:.3f}–{x['max_s']:.3f})", f"{x['faults']:,}",
             f"{x['speedup_vs_before']:.2f}×"] for x in r["rows"]]
    return (md(["variant", "median s (min–max)", "minor page faults per run", "speed-up vs neither"], rows)
            + f"\n\nTokens identical in every variant: {'yes' if r['identical_tokens'] else 'no'}.")


# ------------------------------------------------------------------------------------- bench_vs_authors.py


def vs_authors(*rs: Results) -> str:
    """`bench_vs_authors.py --json` (one file per NFE): ours against the restatement, per sample, per round; the
    SDE rows first."""
    rows = []
    for key in ("sde", "remask", "remask_b8"):
        for r in (r for r in rs if key in r):
            x = r[key]
            what = (f"SDE, NFE {r['nfe']}" if key == "sde" else f"remasking, {r['nfe']} steps") + f", batch {x['batch']}"
            if x["batch"] > 1:
                what += " (per sample)"
            rows.append([what, f"{x['ours_median_s']:.3f}", f"{x['authors_median_s']:.3f}",
                         f"**{x['speedup']:.2f}×** ({_range(x['round_speedups'], 2)})",
                         "yes" if x["identical_tokens"] else "no (below)"])
    return md(["setting", "ours, s per sample (median)", "restatement, s per sample",
               "speed-up (median, range over rounds)", "identical tokens"], rows)


def vs_authors_recommended(r: Results) -> str:
    """`bench_vs_authors.py --recommended --json`: every variant's time per sample and the per-round ratios."""
    rows = []
    for v, t in r["per_sample_s"].items():
        m = _med(t)
        cells = [v, f"{m[0]:.3f} ({m[1]:.3f}–{m[2]:.3f})"]
        for ref in ("authors fp32 b1", "authors bf16 b1"):
            x = r["ratios"].get(f"{ref} / {v}")
            cells.append("–" if x is None else f"**{x['median']:.2f}×** ({x['min']:.2f}–{x['max']:.2f})")
        rows.append(cells)
    return md([f"variant (SDE NFE {r['nfe']})", "s per sample, median (min–max)", "authors fp32 b1 / this (range)",
               "authors bf16 b1 / this (range)"], rows)


# ---------------------------------------------------------------------------------- bench_percall.py parts

_PARTS = [("slot", "converter: slot logits βzKᵀ+b"), ("softmax", "converter: softmax over V+1"),
          ("values", "converter: πWᵀ+c (dense)"), ("converter", "converter, whole (as the sampler: reused buffer)"),
          ("blocks", "backbone blocks (256 positions)"), ("head", "output head + final norm (128 response rows)"),
          ("topm", "top-512 selection (`top_m_values`)"), ("posterior", "posterior mean, whole"),
          ("call", "**whole SDE call** (`Denoiser`)"), ("remask_step", "**one remasking step** (16-step run / 16)")]


def percall_parts(r: Results) -> str:
    """`bench_percall.py parts --json`: each part's time per side (median and range over processes), its FLOPs,
    and the after side's median time against FLOP time at the after side's median matmul peak."""
    after = r["sides"]["after"]
    flops = dict(after[0]["flops"], converter=sum(after[0]["flops"][k] for k in ("slot", "values")),
                 call=after[0]["needed_flops"], remask_step=after[0]["needed_remask_flops"])
    peak = 1e9 * statistics.median(p["peak_gflops"] for p in after)
    rows = []
    for key, label in _PARTS:
        cells = [label, f"{flops[key] / 1e9:.3f}" if key in flops else "–"]
        for side in ("before", "after"):
            m = _med([1000 * p["times"][key] for p in r["sides"][side]])
            cells.append(f"{m[0]:.2f} ({m[1]:.2f}–{m[2]:.2f})")
        t = statistics.median(p["times"][key] for p in after)
        cells += ([f"{100 * flops[key] / t / peak:.0f} %", f"{t / (flops[key] / peak):.2f}×"] if key in flops
                  else ["–", "–"])
        rows.append(cells)
    return md(["component", "GFLOP", "before: ms (min–max)", "after: ms (min–max)", "after: of peak",
               "after: × FLOP time"], rows)


# ------------------------------------------------------------------------------------ bench_batching.py remask


def batch_remask(r: Results) -> str:
    """`bench_batching.py remask --json`: seconds per sample (wall / CPU) per dtype and side, and batch 8 / 1."""
    res = r["results"]
    cols = [(dt, side) for dt in ("fp32", "bf16") for side in ("before", "after")]

    def ratio_cpu(dt: str, side: str) -> str:
        b1, b8 = res[f"{dt} b1 {side}"]["all"], res[f"{dt} b8 {side}"]["all"]
        m = _med([x[1] / y[1] for x, y in zip(b8, b1)])
        cell = f"{m[0]:.2f} ({m[1]:.2f}–{m[2]:.2f})"
        return f"**{cell}**" if side == "after" else cell

    rows = [[f"batch {b}", *(f"{res[f'{dt} b{b} {s}']['wall']:.3f} / {res[f'{dt} b{b} {s}']['cpu']:.3f}" for dt, s in cols)]
            for b in (1, 8)]
    rows.append(["batch 8 / batch 1, CPU (per-round median, min–max)", *(ratio_cpu(dt, s) for dt, s in cols)])
    rows.append(["batch 8 / batch 1, wall (of the medians)",
                 *(f"{res[f'{dt} b8 {s}']['wall'] / res[f'{dt} b1 {s}']['wall']:.2f}" for dt, s in cols)])
    return md(["remasking, s per sample (wall / CPU)", *(f"{dt} {s}" for dt, s in cols)], rows)


# ----------------------------------------------------------------------------------------- bench_threads.py


def threads(r: Results) -> str:
    """`bench_threads.py --json`: each OpenMP variant's time per call and its ratios to three references, per round."""
    def ratio(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.2f}x ({_each(row[key + '_rounds'])})"

    rows = [[row["variant"], str(row["threads"]), f"{row['median_s']:.3f}", f"{row['min_s']:.3f}–{row['max_s']:.3f}",
             ratio(row, "vs_one_thread"), ratio(row, "vs_spin"), ratio(row, "vs_passive")] for row in r["rows"]]
    return md(["variant", "intra-op threads", "median s per call", "spread",
               "vs one thread, same round (median; each round)", "vs spin waiting (ACTIVE), same round",
               "vs passive waiting (PASSIVE), same round"], rows)


def threads_summary(*rs: Results) -> str:
    """Several `bench_threads.py --json` runs side by side: the bounded spin, ACTIVE and one thread against
    passive waiting (median and range of the per-round ratios)."""
    labels = {"bench": "bench (SDE NFE {nfe}, batch {batch})", "toy": "toy (the demo's shape, batch {batch})"}
    rows, seen = [], set()
    for r in rs:
        by = {row["variant"]: row for row in r["rows"]}

        def cell(variant: str, bold: bool = False) -> str:
            x = by[variant]
            head = f"{x['vs_passive']:.2f}x"
            return (f"**{head}**" if bold else head) + f" ({_range(x['vs_passive_rounds'], 2)})"

        shape = labels[r["shape"]].format(**r) if r["shape"] not in seen else r["shape"]
        seen.add(r["shape"])
        idle = r["neighbours"] == 0
        rows.append([shape, str(r["neighbours"]), cell("default, GOMP_SPINCOUNT=1000", bold=idle),
                     cell("default, OMP_WAIT_POLICY=ACTIVE"), f"{by['one thread']['vs_passive']:.2f}x"])
    return md(["shape", "neighbours", "bounded spin (1,000) vs passive", "spin (ACTIVE) vs passive",
               "one thread vs passive"], rows)


# --------------------------------------------------------------------------------------- bench_allocator.py

_ALLOCATOR = ("glibc default", "kept")


def allocator(r: Results) -> str:
    """`bench_allocator.py --json`: per run, each variant's median time per sample, the per-round ratio kept /
    default, the page faults per call and whether the tokens agree."""
    rounds = r["rounds"]
    rows = []
    for run in rounds[0][_ALLOCATOR[0]]["runs"]:
        t = {v: [x[v]["runs"][run]["s_per_sample"] for x in rounds] for v in _ALLOCATOR}
        f = {v: statistics.median(x[v]["runs"][run]["faults_per_call"] for x in rounds) for v in _ALLOCATOR}
        ratios = [k / d for k, d in zip(t["kept"], t["glibc default"])]
        same = all(x[v]["runs"][run]["tokens"] == rounds[0][_ALLOCATOR[0]]["runs"][run]["tokens"]
                   for x in rounds for v in _ALLOCATOR)
        rows.append([run, f"{statistics.median(t['glibc default']):.3f}", f"{statistics.median(t['kept']):.3f}",
                     f"**{statistics.median(ratios):.2f}x** ({_each(ratios)})",
                     f"{f['glibc default']:,.0f} → {f['kept']:,.0f}", "yes" if same else "no"])
    return md(["run", "s per sample, glibc default", "s per sample, kept", "kept / default (median; each round)",
               "page faults per call, default → kept", "identical tokens"], rows)


# ----------------------------------------------------------------------------------- bench_dtype.py quality


def _ci(b: dict[str, Any], spec: str) -> str:
    return (f"{b['fp32']:{spec}} [{b['fp32_ci'][0]:{spec}}, {b['fp32_ci'][1]:{spec}}] | {b['bf16']:{spec}} "
            f"[{b['bf16_ci'][0]:{spec}}, {b['bf16_ci'][1]:{spec}}] | {b['diff']:+{spec}} [{b['diff_ci'][0]:+{spec}}, "
            f"{b['diff_ci'][1]:+{spec}}]")


def dtype_quality(r: Results) -> str:
    """`bench_dtype.py quality --json`: exact PPL and ROUGE-L, fp32 against the variant, with paired intervals."""
    v = r.get("variant", "bf16")
    rows = [[x["method"], str(x["nfe"]), *_ci(x["ppl_open"], ".2f").split(" | "), *_ci(x["rougeL"], ".1f").split(" | "),
             _pct(x["identical_tokens"], 2), _pct(x["identical_samples"])] for x in r["rows"]]
    return md(["method", "NFE", "PPL fp32 [CI]", f"PPL {v} [CI]", f"{v} - fp32 [CI]", "ROUGE-L fp32 [CI]",
               f"ROUGE-L {v} [CI]", "diff [CI]", "identical tokens", "identical samples"], rows)


def dtype_fixclean(r: Results) -> str:
    """`bench_dtype.py quality --json`: random-token error correction (Fix / Clean %), fp32 -> the variant."""
    rows = [[x["model"], f"{x['rate']:.0%}", f"{x['fix']:.1f} -> {y['fix']:.1f}", f"{x['clean']:.1f} -> {y['clean']:.1f}"]
            for x, y in zip(r["fixclean"]["float32"], r["fixclean"]["bfloat16"])]
    return md(["model", "corrupted", "Fix", "Clean"], rows)


# ------------------------------------------------------------------------------------- bench_dtype.py speed

_DTYPE_PARTS = ("blocks", "head", "converter", "top_m_posterior", "call")


def _by_dtype(r: Results) -> dict[str, list[dict[str, Any]]]:
    dts = sorted({x["dtype"] for x in r["runs"]}, reverse=True)  # float32 first
    return {dt: [x for x in r["runs"] if x["dtype"] == dt] for dt in dts}


def dtype_speed_parts(batch: int) -> Callable[[Results], str]:
    """`bench_dtype.py speed --json`: one denoiser call part by part at `batch`, per dtype, against FLOP time."""
    def render_parts(r: Results) -> str:
        by = _by_dtype(r)
        dts = list(by)
        first = r["runs"][0]["parts"][str(batch)]["seconds"]
        rows = []
        for part in (p for p in _DTYPE_PARTS if p in first):
            cells, meds = [part], []
            for dt in dts:
                m = _med([x["parts"][str(batch)]["seconds"][part] for x in by[dt]])
                meds.append(m[0])
                ft = statistics.median([x["parts"][str(batch)]["flop_time_s"].get(part, 0.0) for x in by[dt]])
                cells += [f"{1000 * m[0]:.1f} [{1000 * m[1]:.1f}, {1000 * m[2]:.1f}]",
                          f"{m[0] / ft:.2f} ({1000 * ft:.1f} ms)" if ft else "no FLOPs"]
            if len(dts) == 2:
                cells.append(f"{meds[0] / meds[1]:.2f}x")
            rows.append(cells)
        header = ["part", *(h for dt in dts for h in (f"{dt} ms", f"{dt} / FLOP time"))]
        return md(header + (["fp32 / bf16"] if len(dts) == 2 else []), rows)
    return render_parts


def dtype_speed_samples(r: Results) -> str:
    """`bench_dtype.py speed --samples --json`: whole samples per sampler and batch, fp32 against bf16."""
    by = _by_dtype(r)
    rows = []
    for b in r["batches"]:
        for name in ("sde", "remask"):
            t = {dt: _med([x["samples"][str(b)][f"{name}_s_per_sample"] for x in by[dt]]) for dt in by}
            a, c = by["float32"][0]["samples"][str(b)][f"{name}_ids"], by["bfloat16"][0]["samples"][str(b)][f"{name}_ids"]
            same = sum(x == y for u, w in zip(a, c) for x, y in zip(u, w)) / sum(len(u) for u in a)
            f32, b16 = t["float32"], t["bfloat16"]
            rows.append([name, str(b), f"{f32[0]:.2f} [{f32[1]:.2f}, {f32[2]:.2f}]",
                         f"{b16[0]:.2f} [{b16[1]:.2f}, {b16[2]:.2f}]", f"{f32[0] / b16[0]:.2f}x", _pct(same, 2)])
    return md(["sampler", "batch", "fp32", "bf16", "fp32 / bf16", "identical tokens bf16 vs fp32"], rows)


# -------------------------------------------------------------------------------------- bench_serve.py load

_SERVE_VARIANTS = ("generate", "server, 1 client", "sampler, batch 1", "sampler, batch N", "batched, N clients",
                   "--max-batch 1, N clients")


def serve_rounds(r: Results) -> str:
    """`bench_serve.py load --json`: each variant's seconds over the interleaved rounds."""
    sec = r["result"]["seconds"]
    order = [k for k in _SERVE_VARIANTS if k in sec] + [k for k in sec if k not in _SERVE_VARIANTS]
    rows = [[k, *(f"{x:.4f}" for x in _med(sec[k]))] for k in order]
    return md(["variant", "median s", "min s", "max s"], rows)


def environment_line(env: dict[str, Any] | None) -> str:
    """One line from a run's environment record: version and commit, Python and torch, the CPU (or GPU), threads and
    the 1-minute load average at the start and end of the run."""
    if not env:
        return "Environment: not recorded."
    git = env.get("git") or {}
    commit = f"git {git['commit'][:9]}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit") else "no checkout"
    where = env.get("gpu") or f"{env.get('cpu_model')} ({env.get('cpu_capability')})"
    threads = (env.get("threads") or {}).get("intra_op")
    load = f"{env.get('load_average_start')}" + (f" -> {env['load_average_end']}" if "load_average_end" in env else "")
    return (f"Environment: dsl-llada {env.get('dsl_llada')} ({commit}), Python {env.get('python')}, torch "
            f"{(env.get('libraries') or {}).get('torch')}; {env.get('device')} on {where}, {threads} intra-op "
            f"thread(s) of {env.get('usable_cpus')} usable CPUs; 1-minute load {load}.")


def serve_rounds_summary(r: Results) -> str:
    """`bench_serve.py load --rounds R --json`: the variants' seconds, then the per-round ratios (single-client latency
    over `generate`, N-client throughput batched over `--max-batch 1`, the sampler's own batch-N speed-up), the mean
    batch, the single-client equality check and the environment line."""
    res = r["result"]
    lr, tr, ce = res["latency_ratio"], res["throughput_ratio"], res["sampler_ceiling"]
    n = res["clients"]
    summary = (f"Over {res['rounds']} round(s): single-client latency / `generate` **{lr['median']:.3f}x** "
               f"({lr['min']:.3f}–{lr['max']:.3f}); throughput batched / `--max-batch 1` at {n} clients "
               f"**{tr['median']:.2f}x** ({tr['min']:.2f}–{tr['max']:.2f}; mean batch {res['mean_batch']:g}); the "
               f"sampler's own batch-{n} speed-up, N x t(batch 1) / t(batch N), **{ce['median']:.2f}x** "
               f"({ce['min']:.2f}–{ce['max']:.2f}). Single-client outputs equal to the library: "
               f"{res['single_client_equal_to_library']}.")
    return "\n\n".join([serve_rounds(r), summary, environment_line(r.get("environment"))])


# -------------------------------------------------------------------------- bench_serve_mixed.py, probe


def serve_mixed_rows(r: Results) -> str:
    """`bench_serve_mixed.py --json`: per arrival rate and server, throughput, latency percentiles and load."""
    rows = [[rate, name, m["answered"], str(m["req_per_s"]), str(m["tokens_per_s"]), str(m["p50_s"]), str(m["p95_s"]),
             str(m["short_p50_s"]), str(m["short_p95_s"]), str(m["ttfs_p50_s"]), str(m["ttfs_p95_s"]),
             f"{m['load_before']} / {m['load_after']}"]
            for rate, sides in r["rates"].items() for name in ("before", "engine") for m in (sides[name],)]
    return md(["rate (req/s)", "server", "answered", "req/s", "tokens/s", "p50 s", "p95 s", "short p50 s",
               "short p95 s", "first step p50 s", "first step p95 s", "load avg before/after"], rows)


def serve_mixed_ratios(r: Results) -> str:
    """`bench_serve_mixed.py --json`: per arrival rate, the fixed-batch server's latencies over the engine's."""
    rows = [[rate, f"{b['p95_s'] / e['p95_s']:.2f}x", f"{b['short_p95_s'] / e['short_p95_s']:.2f}x",
             f"{b['ttfs_p95_s'] / e['ttfs_p95_s']:.2f}x", f"{e['req_per_s'] / b['req_per_s']:.2f}x"]
            for rate, sides in r["rates"].items() for b, e in ((sides["before"], sides["engine"]),)]
    return md(["rate (req/s)", "p95 latency before / engine", "short requests' p95 before / engine",
               "first step p95 before / engine", "throughput engine / before"], rows)


def serve_probe(r: Results) -> str:
    """`bench_serve_probe.py --json`: the short request alone and beside the long one, and the long one."""
    def cell(x: dict[str, float]) -> str:
        return f"{x['median']} [{x['min']}, {x['max']}]"
    rows = [[name, cell(s["short_alone_s"]), cell(s["short_s"]), cell(s["long_s"]),
             f"{s['short_s']['median'] / s['long_s']['median']:.2f}"]
            for name in ("before", "engine") for s in (r["servers"][name],)]
    return md(["server", "short alone", "short, sent beside the long one", "long", "short / long"], rows)


# ------------------------------------------------------------------------------------------- bench_busy.py

_BUSY_SAMPLERS = ("sde", "authors_sde", "remask", "authors_remask")


def busy_rounds(r: Results) -> str:
    """`bench_busy.py --json`: per process-settings variant and sampler, idle and loaded medians and their ratio."""
    label = {"sde": f"SDE NFE {r['nfe']}, library", "authors_sde": f"SDE NFE {r['nfe']}, restatement",
             "remask": f"remasking {r['nfe']} steps, library",
             "authors_remask": f"remasking {r['nfe']} steps, restatement"}
    rows = [[v, str(r["children"][v]["threads"]), label[s], f"{e['idle_median_s']:.3f}", f"{e['loaded_median_s']:.3f}",
             f"**{e['ratio']:.2f}x** ({min(e['ratio_rounds']):.2f}–{max(e['ratio_rounds']):.2f})"]
            for v in r["variants"] for s in _BUSY_SAMPLERS for e in (r["table"][v][s],)]
    return md(["variant", "threads", "sampler", "idle s, median", "loaded s, median", "loaded / idle (range)"], rows)


_BUSY_SETTING = {"openmp-default": "OpenMP's own", "configure-process": "`configure_process()`",
                 "passive": "`configure_process(openmp_wait=\"passive\")`",
                 "wait-unchanged": "`configure_process(openmp_wait=\"unchanged\")`",
                 "one-thread": "`configure_process(threads=1, openmp_wait=\"unchanged\")`"}


def busy_summary(*rs: Results) -> str:
    """Several `bench_busy.py --json` runs in one table: per run and variant, loaded / idle of each sampler (median
    and range over rounds; the library's bold where the CLI's settings apply); for a run with both OpenMP's own
    waiting and `configure_process()`, their idle and loaded medians side by side."""
    rows = []
    for r in rs:
        for v in r["variants"]:
            def cell(s: str, v: str = v) -> str:
                e = r["table"][v][s]
                ratio = f"{e['ratio']:.2f}x"
                if v == "configure-process" and not s.startswith("authors_"):
                    ratio = f"**{ratio}**"
                return f"{ratio} ({min(e['ratio_rounds']):.2f}–{max(e['ratio_rounds']):.2f})"
            rows.append([f"{_BUSY_SETTING.get(v, v)}, NFE {r['nfe']}, {r['rounds']} rounds: loaded / idle",
                         *(cell(s) for s in _BUSY_SAMPLERS)])
        if "openmp-default" in r["variants"] and "configure-process" in r["variants"]:
            for phase in ("idle", "loaded"):
                rows.append([f"NFE {r['nfe']}, {phase} phase: OpenMP's own → `configure_process()`, s",
                             *(f"{r['table']['openmp-default'][s][f'{phase}_median_s']:.3f} → "
                               f"{r['table']['configure-process'][s][f'{phase}_median_s']:.3f}" for s in _BUSY_SAMPLERS)])
    return md(["comparison", "SDE, library", "SDE, restatement", "remasking, library", "remasking, restatement"], rows)


# ------------------------------------------------------------------------------------------------ bench_demo.py

_DEMO_STAGES = {"pretrain_s": "pretraining the masked DLM (MDM)", "dsl_s": "DSL adaptation of the base",
                "mdm_s": "MDM continued-pretraining control", "xdlm_s": "XDLM control",
                "sampling_s": "sampling + scoring", "bayes_floor_s": "Bayes-floor table", "tv_s": "TV distances",
                "total_s": "demo total (`total_s`)"}
_DEMO_VARIANTS = {"native": "default demo", "avx2": "default, `ATEN_CPU_CAPABILITY=avx2`", "quick": "`--quick`"}


def demo_runs(r: Results) -> str:
    """`bench_demo.py --json`: per stage (the demo's own `timings_s`) and for the whole process, each variant's
    seconds; under it, the kernel path each run recorded and the environment line."""
    runs = {v: r["runs"][v] for v in r["variants"]}
    keys = [k for k in _DEMO_STAGES if any(k in x["timings_s"] for x in runs.values())]
    keys += sorted({k for x in runs.values() for k in x["timings_s"]} - set(keys))
    rows = [[_DEMO_STAGES.get(k, k), *(_f(x["timings_s"].get(k), 0) for x in runs.values())] for k in keys]
    rows.append(["whole command (the process)", *(_f(x["wall_s"], 0) for x in runs.values())])
    table = md(["stage, seconds", *(_DEMO_VARIANTS.get(v, v) for v in runs)], rows)
    paths = ", ".join(f"{_DEMO_VARIANTS.get(v, v)} {(x.get('demo_environment') or {}).get('cpu_capability', '?')}"
                      for v, x in runs.items())
    return "\n\n".join([table, f"Kernel path each run recorded (`cpu_capability`): {paths}.",
                         environment_line(r.get("environment"))])


def cache_frontier(runs: Results, config: Results) -> str:
    """`dsl-llada demo --cache-frontier`: the demo's own report, `OUT/cache_frontier/frontier.md` (the library's
    `frontier_report.render_run` from the run's runs.jsonl and config.json: settings, the table, the recommended
    points, the per-level picks), then the environment line of the run's config.json."""
    from dsl_llada.toy.frontier_report import render_run  # torch-free: the report reads the runs' JSON only

    return render_run(runs, config).rstrip("\n") + "\n\n" + environment_line(config.get("environment"))
# ------------------------------------------------------------------- bench_approx.py, bench_eval.py, memory


def approx_kv_cache(r: Results) -> str:
    """`bench_approx.py kv-cache --json`: per sampler and cache setting, seconds per sample (median, range over the
    rounds), the speed-up over the exact sampler's median and the share of tokens equal to the exact sampler's."""
    rows = [[x["sampler"], x["cache"], f"{x['median_s']:.3f} ({x['min_s']:.3f}–{x['max_s']:.3f})",
             f"{x['speedup']:.2f}×", f"{x['same_tokens']:.1f}"] for x in r["rows"]]
    return md(["sampler", "cache", "s per sample, median (min–max)", "speed-up", "tokens equal to exact %"], rows) + (
        f"\n\n{r['rounds']} interleaved round(s). " + environment_line(r.get("environment")))


def approx_sparse(r: Results) -> str:
    """`bench_approx.py sparse --json`: per SDE row of the demo and NFE, the samples and tokens the sparse converter
    changed, the open-task perplexity exact → sparse and the seconds of both."""
    rows = [[x["method"], str(x["nfe"]), f"{x['changed_samples']}/{x['samples']}", f"{x['changed_tokens']}/{x['tokens']}",
             f"{x['ppl_exact']:.2f} → {x['ppl_sparse']:.2f}", f"{x['s_exact']:.2f} / {x['s_sparse']:.2f}"]
            for x in r["rows"]]
    changed = sum(x["changed_tokens"] for x in r["rows"])
    total = sum(x["tokens"] for x in r["rows"])
    return md(["method", "NFE", "samples changed", "tokens changed", "open PPL exact → sparse", "s exact / sparse"],
              rows) + (f"\n\n{'A --quick' if r['quick'] else 'The default'} demo, {r['prompts']} held-out prompts, batch "
                       f"{r['batch_size']}, tolerance {r['tolerance']:g}: {changed} of {total} tokens changed in all. "
                       + environment_line(r.get("environment")))


def eval_overhead(r: Results) -> str:
    """`bench_eval.py --json`: per clock, the pure sampler's and `run_eval`'s seconds (medians over the rounds), the
    efficiency sampler / eval of those medians, and each round's own efficiency."""
    rows = []
    for clock, key in (("process CPU time", "cpu"), ("wall", "wall")):
        pure = [x[f"sampler_{key}_s"] for x in r["per_round"]]
        ev = [x[f"eval_{key}_s"] for x in r["per_round"]]
        ps, es = statistics.median(pure), statistics.median(ev)
        rows.append([clock, f"{ps:.2f}", f"{es:.2f}", f"**{ps / es:.3f}**",
                     ", ".join(f"{a / b:.3f}" for a, b in zip(pure, ev))])
    return md(["clock", "pure sampler s (median)", "`run_eval` s (median)", "efficiency = sampler / eval",
               "each round"], rows) + (
        f"\n\n{r['items']} generation items, {r['rounds']} alternating round(s), {r['threads']} thread(s). "
        + environment_line(r.get("environment")))


def convert_memory(r: Results) -> str:
    """`bench_convert_memory.py --json`: `convert --dry-run`'s weight memory table (GiB) and the parameter count."""
    rows = [[x["dtype"] + (" + int8 backbone (--quantize int8)" if x["quantize"] == "int8" else ""),
             f"{x['backbone_linear_gib']:.2f}", f"{x['backbone_other_gib']:.2f}", f"{x['dsl_converter_and_noise_gib']:.2f}",
             f"{x['total_gib']:.2f}"] for x in r["rows"]]
    return md(["weights", "backbone linear GiB", "embedding + norms GiB", "converter + noise table GiB", "total GiB"],
              rows) + (f"\n\n{r['model']}: d_model {r['d_model']}, {r['n_layers']} layers, vocabulary "
                       f"{r['vocab_size']:,}, noise dim {r['noise_dim']}: {r['parameters'] / 1e9:.2f} B parameters.")


# ------------------------------------------------------------------------------------------------- registry

TABLES = {t.name: t for t in (
    # cpu-sampling.md
    PageTable("cpu-percall-parts", "cpu-sampling.md", ("percall_parts_cpu1.json",), percall_parts),
    PageTable("cpu-vs-authors", "cpu-sampling.md", ("vs_authors_nfe16_cpu1.json", "vs_authors_nfe64_cpu1.json"),
              vs_authors),
    PageTable("cpu-vs-authors-recommended", "cpu-sampling.md", ("vs_authors_recommended.json",),
              vs_authors_recommended),
    PageTable("cpu-batch-remask", "cpu-sampling.md", ("batch_remask_buffer.json",), batch_remask),
    PageTable("cpu-walltime", "cpu-sampling.md", ("walltime_cpu_reduced.json",), walltime_long),
    PageTable("cpu-threshold", "cpu-sampling.md", ("threshold_cpu_reduced.json",), threshold_cpu),
    PageTable("cpu-approx-sparse", "cpu-sampling.md", ("approx_sparse_demo.json",), approx_sparse),
    PageTable("cpu-approx-kv-cache", "cpu-sampling.md", ("approx_kv_cache.json",), approx_kv_cache),
    PageTable("cpu-eval-overhead", "cpu-sampling.md", ("eval_overhead.json",), eval_overhead),
    PageTable("cpu-percall-loop", "cpu-sampling.md", ("percall_loop.json",), with_environment(loop_efficiency)),
    PageTable("cpu-percall-loop-batches", "cpu-sampling.md", ("percall_loop.json",), loop_throughput),
    PageTable("cpu-percall-loop-memory", "cpu-sampling.md", ("percall_loop.json",), loop_converter_memory),
    PageTable("cpu-roofline-sde", "cpu-sampling.md", ("percall_roofline.json",), with_environment(roofline_sde)),
    PageTable("cpu-roofline-remask", "cpu-sampling.md", ("percall_roofline.json",), roofline_remask),
    PageTable("cpu-roofline-sparse", "cpu-sampling.md", ("percall_roofline.json",), roofline_sparse),
    PageTable("cpu-percall-ablation", "cpu-sampling.md", ("percall_ablation.json",), with_environment(percall_ablation)),
    PageTable("cpu-vs-authors-2t", "cpu-sampling.md", ("vs_authors_nfe16_2t.json",), with_environment(vs_authors)),
    # gpu.md
    PageTable("gpu-walltime", "gpu.md", ("walltime_h200.json",), walltime_by_dataset),
    PageTable("gpu-threshold", "gpu.md", ("threshold_h200.json",), threshold_gpu),
    PageTable("gpu-batched", "gpu.md", ("gpu_h200_8b.json",), gpu_batches),
    PageTable("gpu-loop", "gpu.md", ("sampling_8b_h200_bf16.json",), loop_efficiency),
    PageTable("gpu-loop-batches", "gpu.md", ("sampling_8b_h200_bf16.json",), loop_throughput),
    PageTable("gpu-compile", "gpu.md", ("gpu_h200_8b_compile.json",), gpu_batches),
    PageTable("gpu-compile-b1", "gpu.md", ("gpu_h200_8b_compile_b1.json",), gpu_batches),
    PageTable("gpu-compile-b8", "gpu.md", ("gpu_h200_8b_compile_b8.json",), gpu_batches),
    # precision-memory.md
    PageTable("bf16-quality", "precision-memory.md", ("bf16_quality.json",), dtype_quality),
    PageTable("bf16-fixclean", "precision-memory.md", ("bf16_quality.json",), dtype_fixclean),
    PageTable("int8-quality", "precision-memory.md", ("int8_quality.json",), dtype_quality),
    PageTable("int8-fixclean", "precision-memory.md", ("int8_quality.json",), dtype_fixclean),
    PageTable("real-shape-b1", "precision-memory.md", ("real_shape_b1.json",), dtype_speed_parts(1)),
    PageTable("real-shape-b8-batch1", "precision-memory.md", ("real_shape_b8_bf16.json",), dtype_speed_parts(1)),
    PageTable("real-shape-b8-batch8", "precision-memory.md", ("real_shape_b8_bf16.json",), dtype_speed_parts(8)),
    PageTable("small-shape-batch1", "precision-memory.md", ("small_shape_fp32_vs_bf16.json",), dtype_speed_parts(1)),
    PageTable("small-shape-batch8", "precision-memory.md", ("small_shape_fp32_vs_bf16.json",), dtype_speed_parts(8)),
    PageTable("small-shape-samples", "precision-memory.md", ("small_shape_fp32_vs_bf16.json",), dtype_speed_samples),
    PageTable("convert-memory-llada8b", "precision-memory.md", ("convert_memory_llada8b.json",), convert_memory),
    # process-settings.md
    PageTable("threads-summary", "process-settings.md", ("threads_bench_idle.json", "threads_bench_busy.json",
                                                          "threads_toy_idle.json", "threads_toy_busy.json"),
              threads_summary),
    PageTable("threads-bench-idle", "process-settings.md", ("threads_bench_idle.json",), threads),
    PageTable("threads-bench-busy", "process-settings.md", ("threads_bench_busy.json",), threads),
    PageTable("threads-toy-idle", "process-settings.md", ("threads_toy_idle.json",), threads),
    PageTable("threads-toy-busy", "process-settings.md", ("threads_toy_busy.json",), threads),
    PageTable("allocator", "process-settings.md", ("allocator.json",), allocator),
    PageTable("busy-nfe16", "process-settings.md", ("busy_nfe16.json",), busy_rounds),
    PageTable("busy-nfe16-r5", "process-settings.md", ("busy_nfe16_r5.json",), busy_rounds),
    PageTable("busy-nfe4", "process-settings.md", ("busy_nfe4_default.json",), busy_rounds),
    PageTable("busy-summary", "process-settings.md", ("busy_nfe16.json", "busy_nfe16_r5.json",
                                                       "busy_nfe4_default.json"), busy_summary),
    # toy-frontier.md
    PageTable("demo-runs", "toy-frontier.md", ("demo_runs.json",), demo_runs),
    PageTable("cache-frontier", "toy-frontier.md", ("cache_frontier_cpu.jsonl", "cache_frontier_cpu_config.json"),
              cache_frontier),
    # serving.md
    PageTable("serve-cpu-d64", "serving.md", ("serve_cpu_d64.json",), serve_rounds_summary),
    PageTable("serve-cpu-d128", "serving.md", ("serve_cpu_d128.json",), serve_rounds_summary),
    PageTable("serve-h200-d64", "serving.md", ("serve_h200_d64.json",), serve_rounds),
    PageTable("serve-h200-d512", "serving.md", ("serve_h200_d512.json",), serve_rounds),
    PageTable("serve-mixed-nfe256", "serving.md", ("serve_mixed_nfe256.json",), serve_mixed_rows),
    PageTable("serve-mixed-nfe256-ratios", "serving.md", ("serve_mixed_nfe256.json",), serve_mixed_ratios),
    PageTable("serve-mixed-nfe1024", "serving.md", ("serve_mixed_nfe1024.json",), serve_mixed_rows),
    PageTable("serve-mixed-nfe1024-ratios", "serving.md", ("serve_mixed_nfe1024.json",), serve_mixed_ratios),
    PageTable("serve-probe", "serving.md", ("serve_probe.json",), serve_probe),
)}


NOT_GENERATED: tuple[NotGenerated, ...] = ()
"""Sections whose tables no results file can render, each with the reason (none now: every table on the pages is
rendered from `benchmarks/results/`)."""


def lint_pages(docs: Path, is_measurement: Callable[[list[str]], bool]) -> tuple[list[str], list[str]]:
    """(problems, notes): a measurement table on a benchmark page that is neither a registered block nor in a
    section listed in NOT_GENERATED is a problem, and so is a NOT_GENERATED entry whose section is gone; each
    listed section is a note. A docs folder without benchmark pages has neither."""
    if not (docs / "benchmarks").is_dir():
        return [], []
    listed = {(n.page, n.section): n for n in NOT_GENERATED}
    problems, used = [], set()
    for page, line, heading in unregistered_tables(docs, is_measurement):
        if (page, heading) in listed:
            used.add((page, heading))
        else:
            problems.append(f"docs/benchmarks/{page}:{line}: measurement table not generated from benchmarks/results/ "
                            f"and not listed as not generated (section {heading!r})")
    for key in sorted(set(listed) - used):
        problems.append(f"docs/benchmarks/{key[0]}: section {key[1]!r} is listed as not generated but holds no "
                        "measurement table outside a block")
    notes = [f"not generated: docs/benchmarks/{n.page}, {n.section!r}: {n.reason}" for n in NOT_GENERATED]
    return problems, notes


# ------------------------------------------------------------------------------------ blocks on the pages


def block_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- docs-table: {re.escape(name)} -->\n(.*?)<!-- /docs-table -->", re.S)


def _replace(doc: str, table: PageTable, text: str) -> str | None:
    """`doc` with the table's block holding `text`; None when the page has no block for it."""
    pattern = block_re(table.name)
    if pattern.search(doc) is None:
        return None
    return pattern.sub(lambda _: f"<!-- docs-table: {table.name} -->\n{text}\n<!-- /docs-table -->", doc, count=1)


def check_pages(docs: Path, results_dir: Path) -> list[str]:
    """Re-render every registered table from its results and compare it with its block; the first difference of
    each table is named (page, table, line)."""
    problems = []
    for t in TABLES.values():
        page = docs / "benchmarks" / t.page
        m = block_re(t.name).search(page.read_text()) if page.exists() else None
        if m is None:
            problems.append(f"docs/benchmarks/{t.page}: no block for table {t.name!r}")
            continue
        missing = [f for f in t.results if not (results_dir / f).is_file()]
        if missing:
            problems.append(f"docs/benchmarks/{t.page}: table {t.name!r}: no results file "
                            f"{', '.join('benchmarks/results/' + f for f in missing)} (run its benchmark with --json)")
            continue
        new, old = render(t, results_dir).splitlines(), m.group(1).rstrip("\n").splitlines()
        diff = _first_difference(old, new)
        if diff is not None:
            problems.append(f"docs/benchmarks/{t.page}: table {t.name!r} differs from "
                            f"{', '.join('benchmarks/results/' + f for f in t.results)}: {diff} (run --write-pages)")
    return problems


def _first_difference(old: list[str], new: list[str]) -> str | None:
    """Where two renderings of a table first differ: the row and, within it, the first differing cell."""
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in old[:1]]
    header = cells[0] if cells else []
    for i in range(max(len(old), len(new))):
        a, b = (old[i] if i < len(old) else None), (new[i] if i < len(new) else None)
        if a == b:
            continue
        if a is None or b is None:
            return f"line {i + 1}: page {a!r}, results {b!r}"
        ca, cb = ([c.strip() for c in x.strip().strip("|").split("|")] for x in (a, b))
        j = next((j for j, (x, y) in enumerate(zip(ca, cb)) if x != y), min(len(ca), len(cb)))
        column = header[j] if j < len(header) else f"column {j + 1}"
        return (f"line {i + 1} (row {ca[0]!r}), {column!r}: page {ca[j] if j < len(ca) else None!r}, "
                f"results {cb[j] if j < len(cb) else None!r}")
    return None


def write_pages(docs: Path, results_dir: Path, names: Sequence[str] | None = None) -> list[str]:
    """Replace the registered tables' blocks with their rendering; returns the names whose block changed."""
    from dsl_llada.artifacts.atomic import atomic_write_text

    changed = []
    for page in sorted({t.page for t in TABLES.values()}):
        path = docs / "benchmarks" / page
        doc = original = path.read_text()
        for t in (t for t in TABLES.values() if t.page == page and (names is None or t.name in names)):
            new = _replace(doc, t, render(t, results_dir))
            if new is None:
                raise ValueError(f"docs/benchmarks/{page} has no block for table {t.name!r}")
            if new != doc:
                changed.append(t.name)
            doc = new
        if doc != original:
            atomic_write_text(path, doc)
    return changed


def unregistered_tables(docs: Path, is_measurement: Callable[[list[str]], bool]) -> list[tuple[str, int, str]]:
    """(page, line, section heading) of every measurement table on a benchmark page outside a registered block."""
    out = []
    for path in sorted((docs / "benchmarks").glob("*.md")):
        lines = path.read_text().splitlines()
        heading, inside, i = "", False, 0
        while i < len(lines):
            ln = lines[i]
            if ln.startswith("#"):
                heading = ln.lstrip("#").strip()
            elif ln.startswith("<!-- docs-table:"):
                inside = True
            elif ln.startswith("<!-- /docs-table"):
                inside = False
            elif ln.startswith("|") and not inside:
                j = i
                while j < len(lines) and lines[j].startswith("|"):
                    j += 1
                if is_measurement(lines[i:j]):
                    out.append((path.name, i + 1, heading))
                i = j
                continue
            i += 1
    return out
