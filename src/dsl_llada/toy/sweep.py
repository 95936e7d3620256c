"""`dsl-llada demo --sweep`: the paper's SDE implementation-sensitivity sweep (appendix table "SDE implementation
sensitivity", and the NFE-vs-eta choice) measured exactly on the toy world with the demo's own checkpoints.

One factor at a time around the defaults (the paper's settings run with the authors' sampler): eta (0, the paper's
NFE table, 2x), noise placement (predictor = authors' / Algorithm 2 as printed), top-M, beta_inf (x1, x2, absolute
2.0), the SNR schedule (sensitive, paper-exact, uniform, gamma_min 3.0), the context embedding (converter / wte) and
EOS truncation, at each NFE. Writes OUT/sweep/: sweep.jsonl (one line per table row with its full sampler config,
appended as each run finishes; a rerun resumes), samples.jsonl (every output), sweep.md (the paper's table layout,
one table per NFE) and sweep.png.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigBase, ConfigError, SDEConfig, eta_for_nfe
from ..artifacts.fingerprints import sampling_key
from ..eval.report import markdown_table
from ..core.model import DSLModel
from ..sampling.sde import inference_beta
from ..artifacts import jsonl_log
from ..artifacts.atomic import atomic_write_text
from ..artifacts.figures import save_figure
from ..sampling.progress import progress as progress_bar
from .evaluate import aggregate, sample_records, score_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepSetting:
    """One row of the sweep table: which factor (group), its value (label), and how it departs from the defaults."""

    group: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)
    """SDEConfig overrides (on top of nfe and gen_length)."""
    eta_factor: float | None = None
    """eta = eta_factor x the paper's eta for the NFE (the row's eta then depends on the NFE)."""
    context_embedding: str = "converter"
    """The DSL model's clean-context path for this row ('converter' = the demo model's own, or 'wte')."""

    @property
    def is_default(self) -> bool:
        return not self.options and self.eta_factor is None and self.context_embedding == "converter"

    def sde_config(self, nfe: int, gen_length: int) -> SDEConfig:
        opts = dict(self.options)
        if self.eta_factor is not None:
            opts["eta"] = self.eta_factor * eta_for_nfe(nfe)
        return SDEConfig(nfe=nfe, gen_length=gen_length, **opts)


def _d(group: str, label: str) -> SweepSetting:
    return SweepSetting(group, label)


SWEEP_SETTINGS: tuple[SweepSetting, ...] = (
    SweepSetting("eta", "0 (deterministic)", {"eta": 0.0}),
    _d("eta", "paper table (default)"),
    SweepSetting("eta", "2 x paper table", eta_factor=2.0),
    _d("noise placement", "predictor + update (authors', default)"),
    SweepSetting("noise placement", "update only (Alg. 2 as printed)", {"predictor_noise": False}),
    SweepSetting("top-M", "4", {"top_m": 4}),
    SweepSetting("top-M", "16", {"top_m": 16}),
    SweepSetting("top-M", "64", {"top_m": 64}),
    _d("top-M", "512 (default; >= V: full softmax)"),
    SweepSetting("beta_inf", "1 x trained", {"beta_scale": 1.0}),
    _d("beta_inf", "2 x trained (default)"),
    SweepSetting("beta_inf", "absolute 2.0", {"beta_absolute": 2.0}),
    _d("schedule", "sensitive, gamma_min 0.01 (default)"),
    SweepSetting("schedule", "sensitive, gamma_min 3.0", {"gamma_min": 3.0}),
    SweepSetting("schedule", "paper-exact", {"schedule": "paper-exact"}),
    SweepSetting("schedule", "uniform", {"schedule": "uniform"}),
    _d("context", "converter W[:, c] (default)"),
    SweepSetting("context", "wte (authors' code)", context_embedding="wte"),
    _d("EOS truncation", "at first EOS/EoT (default)"),
    SweepSetting("EOS truncation", "none (authors' decode)", {"truncate_at_eos": False}),
)
SWEEP_GROUPS = tuple(dict.fromkeys(s.group for s in SWEEP_SETTINGS))


@dataclass(frozen=True)
class SweepConfig(ConfigBase):
    """What the sweep samples; stored in every row it writes."""

    nfes: tuple = (8, 16, 64)
    """NFE values (each even)."""
    n_open: int = 96
    """Held-out open-ended prompts (the demo's test split, first n)."""
    n_summarize: int = 48
    """Held-out summarisation prompts."""
    groups: tuple = SWEEP_GROUPS
    """Which factors to sweep (default: all)."""
    batch_size: int = 48
    seed: int = 0
    """Sampling seed (prompt i uses seed * 100003 + i, as the demo)."""

    def __post_init__(self) -> None:
        if not self.nfes or any(not isinstance(n, int) or n < 2 or n % 2 for n in self.nfes):
            raise ConfigError(f"nfes={list(self.nfes)!r} is not valid: each NFE must be an even int >= 2")
        if self.n_open < 1 or self.n_summarize < 0:
            raise ConfigError(f"need n_open >= 1 and n_summarize >= 0, got {self.n_open}, {self.n_summarize}")
        unknown = sorted(set(self.groups) - set(SWEEP_GROUPS))
        if unknown or not self.groups:
            raise ConfigError(f"groups={list(self.groups)!r} is not valid; choose from {list(SWEEP_GROUPS)}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size!r} must be >= 1")

    @classmethod
    def preset(cls, *, quick: bool, n_open: int | None = None, seed: int = 0) -> "SweepConfig":
        base = cls(n_open=8, n_summarize=4, seed=seed) if quick else cls(seed=seed)
        return base if n_open is None else base.replace(n_open=n_open, n_summarize=n_open // 2)

    def settings(self) -> list[SweepSetting]:
        return [s for s in SWEEP_SETTINGS if s.group in self.groups]


def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 (12 hex) of every parameter and buffer: identifies the checkpoint a row was measured on."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()[:12]


def with_context_embedding(model: DSLModel, mode: str) -> DSLModel:
    """The same weights read with another clean-context path (a shallow view; the original is untouched)."""
    if model.config.context_embedding == mode:
        return model
    view = copy.copy(model)
    view.config = model.config.replace(context_embedding=mode)
    return view


def _run_key(cfg: SDEConfig, context: str, model_id: str | dict, sweep: SweepConfig) -> str:
    key = {"sde": cfg.to_dict(), "context": context, "model": model_id, "n_open": sweep.n_open,
           "n_summarize": sweep.n_summarize, "seed": sweep.seed}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


OPEN_KEYS = ("ppl", "in_support", "len", "premature_eos%", "rep", "d2", "n")
SUM_KEYS = ("rouge1", "rouge2", "rougeL", "ppl", "in_support", "len", "n")


def task_metrics(rows: Sequence[dict[str, Any]], task: str, keys: Sequence[str]) -> dict[str, Any] | None:
    """The `keys` of the aggregate row of `task` (None when the run had no prompt of that task)."""
    found = [r for r in rows if r["task"] == task]
    return {k: found[0].get(k) for k in keys} if found else None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a resumable results file (none when it does not exist; an unreadable line, which
    only an interrupted append leaves, is skipped: that run is simply redone)."""
    return jsonl_log.read(path, strict=False)[0]


def append_rows(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Append one JSON line per record as one write (`jsonl_log.JsonlAppender`; these rows are re-computable, so
    no fsync). A partial last line left by an interrupted append is cut off first, so it cannot swallow the first
    new record."""
    with jsonl_log.JsonlAppender(path, fsync=False) as out:
        out.append(records)


def run_sweep(dsl: DSLModel, world, tokenizer, examples, out: Path, sweep: SweepConfig, *, gen_length: int,
              progress: bool = True, echo: Callable[[str], None] = log.info) -> list[dict[str, Any]]:
    """Sample and score every (setting, NFE) of `sweep`; returns the table rows (also appended to out/sweep.jsonl
    as each run finishes). Runs already in out/sweep.jsonl for the same model, config, prompts and seed are reused."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path, samples_path = out / "sweep.jsonl", out / "samples.jsonl"
    model_id = sampling_key(model_fingerprint(dsl), tokenizer)  # weights + tokenizer + sampling code
    models = {c: with_context_embedding(dsl, c) for c in ("converter", "wte")}
    plan = []  # (setting, nfe, config, run key) in table order
    for nfe in sweep.nfes:
        for s in sweep.settings():
            cfg = s.sde_config(nfe, gen_length)
            plan.append((s, nfe, cfg, _run_key(cfg, s.context_embedding, model_id, sweep)))
    existing = read_rows(rows_path)
    results = {r["run_key"]: r for r in existing}
    have = {(r["group"], r["setting"], r["nfe"], r["run_key"]) for r in existing}
    todo: dict[str, tuple[SweepSetting, int, SDEConfig]] = {}
    for s, nfe, cfg, key in plan:
        if key not in results:
            todo.setdefault(key, (s, nfe, cfg))
    echo(f"sweep: {len(plan)} table rows, {len(todo)} sampler runs to do ({len(set(k for *_, k in plan)) - len(todo)} "
         f"found in {rows_path}), {sweep.n_open} + {sweep.n_summarize} held-out prompts")

    def write_rows(key: str) -> None:
        new = [_row(s, nfe, cfg, results[key], model_id, sweep, models[s.context_embedding])
               for s, nfe, cfg, k in plan if k == key and (s.group, s.label, nfe, k) not in have]
        append_rows(rows_path, new)
        have.update((r["group"], r["setting"], r["nfe"], key) for r in new)

    for key, (s, nfe, cfg) in progress_bar(list(todo.items()), desc="sweep", enabled=progress):
        t = time.perf_counter()
        method = _FixedMethod(f"{s.group}: {s.label}", s.context_embedding, cfg)
        records = sample_records(models, world, tokenizer, examples, [method], [nfe], gen_length=gen_length,
                                 batch_size=sweep.batch_size, seed=sweep.seed)
        agg = aggregate(records)
        results[key] = {"run_key": key, "open": task_metrics(agg, "open", OPEN_KEYS),
                        "summarize": task_metrics(agg, "summarize", SUM_KEYS), "seconds": time.perf_counter() - t}
        append_rows(samples_path, [{"run_key": key, **r} for r in records])
        write_rows(key)
    for key in dict.fromkeys(k for *_, k in plan):  # table rows whose run is shared with a row written earlier
        write_rows(key)
    latest = {(r["group"], r["setting"], r["nfe"], r["run_key"]): r for r in read_rows(rows_path)}
    return [latest[(s.group, s.label, nfe, key)] for s, nfe, _, key in plan]


@dataclass(frozen=True)
class _FixedMethod:
    """A row of `sample_records` whose SDE config is fully given (the sweep resolves eta per NFE itself)."""

    name: str
    model: str
    cfg: SDEConfig

    def config(self, nfe: int, gen_length: int) -> SDEConfig:
        return self.cfg


def _row(s: SweepSetting, nfe: int, cfg: SDEConfig, result: dict[str, Any], model_id: dict[str, str], sweep: SweepConfig,
         model: DSLModel) -> dict[str, Any]:
    return {"group": s.group, "setting": s.label, "nfe": nfe, "is_default": s.is_default, "run_key": result["run_key"],
            "config": cfg.to_dict(), "context_embedding": s.context_embedding, "resolved_eta": cfg.resolved_eta(),
            "beta_inf": inference_beta(model, cfg), "model": model_id, "sweep": sweep.to_dict(),
            "open": result["open"], "summarize": result["summarize"], "seconds": result.get("seconds")}


def reference_rows(world, examples) -> dict[str, dict[str, Any] | None]:
    """The world's own samples for the same prompts, scored the same way (the table's reference line)."""
    truth = [score_record(world, ex, ex.response, method="world", nfe=0, seed=None, index=i, forward_passes=0)
             for i, ex in enumerate(examples)]
    agg = aggregate(truth)
    return {"open": task_metrics(agg, "open", OPEN_KEYS), "summarize": task_metrics(agg, "summarize", SUM_KEYS)}


COLUMNS = [("sweep", "Sweep", ""), ("setting", "Setting", ""), ("ppl", "PPL", ".1f"), ("in_support", "in-support %", ".0f"),
           ("len", "Len", ".1f"), ("premature_eos%", "premature EOS %", ".0f"), ("rep", "Rep %", ".1f"),
           ("d2", "D2 %", ".1f"), ("rouge1", "R-1", ".1f"), ("rouge2", "R-2", ".1f"), ("rougeL", "R-L", ".1f"),
           ("sum_ppl", "sum. PPL", ".2f")]


def _flat(r: dict[str, Any], first: bool) -> dict[str, Any]:
    o, s = r.get("open") or {}, r.get("summarize") or {}
    label = f"**{r['setting']}**" if r.get("is_default") else r["setting"]
    return {"sweep": r["group"] if first else "", "setting": label, **o, "rouge1": s.get("rouge1"),
            "rouge2": s.get("rouge2"), "rougeL": s.get("rougeL"), "sum_ppl": s.get("ppl")}


def render_sweep(rows: Sequence[dict[str, Any]], reference: dict[str, Any], sweep: SweepConfig) -> str:
    """The paper's table layout (Sweep | Setting | open-ended metrics | summarisation ROUGE), one table per NFE."""
    parts = ["# SDE implementation sensitivity on the toy world", "",
             f"One factor at a time around the defaults (bold: the paper's settings with the authors' sampler). "
             f"Open-ended: exact perplexity under the world, % of outputs inside its support, length in words, premature "
             f"EOS %, Rep % and Distinct-2 % over {sweep.n_open} held-out prompts; summarisation: ROUGE-1/2/L F1 and "
             f"exact perplexity over {sweep.n_summarize}. Seed {sweep.seed}. Every row's sampler config is in sweep.jsonl.", ""]
    ref = _flat({"group": "world", "setting": "own samples (reference)", "open": reference["open"],
                 "summarize": reference["summarize"]}, True)
    for nfe in sweep.nfes:
        table, last = [ref], None
        for r in rows:
            if r["nfe"] == nfe:
                table.append(_flat(r, r["group"] != last))
                last = r["group"]
        parts += [f"## NFE {nfe} (eta by the paper's table: {eta_for_nfe(nfe)})", "", markdown_table(table, COLUMNS), ""]
    parts += ["![sweep](sweep.png)", ""]
    return "\n".join(parts)


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """One column per factor: open-ended exact perplexity (top) and summarisation ROUGE-L (bottom) against NFE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r["group"] for r in rows))
    fig, axes = plt.subplots(2, len(groups), figsize=(3.3 * len(groups), 6.6), squeeze=False)
    for j, g in enumerate(groups):
        for label in dict.fromkeys(r["setting"] for r in rows if r["group"] == g):
            pts = sorted((r["nfe"], r) for r in rows if r["group"] == g and r["setting"] == label)
            style = {"linewidth": 2.6, "color": "black"} if pts[0][1]["is_default"] else {"linewidth": 1.4}
            for i, (task, key) in enumerate((("open", "ppl"), ("summarize", "rougeL"))):
                xy = [(n, (r[task] or {}).get(key)) for n, r in pts if (r[task] or {}).get(key) is not None]
                if xy:
                    axes[i][j].plot(*zip(*xy), marker="o", label=label, **style)
        axes[0][j].set_title(g, fontsize=10)
        axes[0][j].set_yscale("log")
        axes[0][j].legend(fontsize=6, frameon=False)
        for i in range(2):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].grid(alpha=0.3)
        axes[1][j].set_xlabel("NFE")
    axes[0][0].set_ylabel("open-ended exact PPL")
    axes[1][0].set_ylabel("summarisation ROUGE-L")
    fig.suptitle("Toy world: SDE sensitivity, one factor at a time (black = defaults)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def write_sweep(rows, reference, sweep: SweepConfig, out: Path) -> None:
    atomic_write_text(Path(out) / "sweep.md", render_sweep(rows, reference, sweep))
    plot_sweep(rows, Path(out) / "sweep.png")
