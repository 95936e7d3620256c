"""The evaluation runner: config -> work items -> length-bucketed batches -> sharded, resumable JSONL records.

Work items are keyed (task, dataset, method, nfe, seed, sample id). Within one (task, dataset, method, nfe, seed)
group the prompts are sorted by token length and cut into batches of `batch_size`; the batch list is fixed by the
config alone, and batch j belongs to rank j % world_size. Sample i always uses a generator seeded seed + i, so
records do not depend on the number of processes, and a batch is always run whole (a resumed batch is re-run with
exactly its original rows; only its missing items are written), so a run killed at any moment and started again
with the same command gives exactly the records of an uninterrupted run.

By default (`batching='continuous'`) the diffusion samplers run a process's consecutive batches of one group on
the step-level engine (`sampling.batches.run_continuous`, as many live rows as the batch size): the batches are
fed whole and in plan order, a finished row's place goes to the next row at once, and each row's record is
written as it finishes. Rows that take the same number of steps (every sampler without a confidence threshold)
then run in exactly the fixed batches' arrangement; with a threshold the rows of later batches join mid-way, and
the discrete samplers' tokens are the same in any arrangement. The autoregressive baseline, one-forward tasks,
timed tasks (walltime) and key/value-cache configs run each batch as one call (`batching='fixed'` does so for all).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import ConfigError
from ..artifacts.outputs import resolve_output
from ..sampling.batches import retry_rows
from ..artifacts.atomic import atomic_write_text
from ..sampling.progress import progress as progress_bar
from . import shards as R
from .eval_config import EvalConfig, MethodSpec, config_diff
from .samples import Sample
from .tasks import get_task

logger = logging.getLogger(__name__)

OUR_FILES = (R.MARKER, R.RECORDS, R.SHARDS, "summary.json", "summary.md", "figures", "genppl_cache.jsonl",
             R.ENVIRONMENTS)


def item_key(task: str, dataset: str, method: str, nfe: int, seed: int, sample_id: str) -> str:
    return f"{task}|{dataset}|{method}|{nfe}|{seed}|{sample_id}"


@dataclass
class Batch:
    """Rows of one (task, dataset, method, nfe, seed) group that run in one sampler call."""

    task: str
    dataset: str
    method: MethodSpec | None
    """The sampling method (None for one-forward tasks: correction, probes)."""
    model: str
    label: str
    """The method slot of the keys: the method name, or the model name for one-forward tasks."""
    nfe: int
    seed: int
    gen_length: int
    choice: Any
    samples: list[Sample]
    keys: list[str] = field(default_factory=list)
    variant: str = ""
    """One-forward tasks: the variant label (e.g. 'rate0.3/discrete'); part of the key's dataset slot."""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """Every batch of the run in execution order, and every item key in record order."""

    batches: list[Batch]
    order: list[str]
    prompt_ids: dict[tuple[str, str, str, str], list[int]]
    """(task, dataset, model, sample id) -> encoded prompt."""


def build_plan(cfg: EvalConfig, tokenizers: dict[str, Any]) -> Plan:
    """Read every dataset, validate every (method, NFE, length) and lay out the batches. Raises before any model
    is loaded when data or settings are bad."""
    from .methods import sampler_for

    groups: list[tuple[int, int, Batch]] = []
    order: list[str] = []
    prompt_ids: dict[tuple[str, str, str, str], list[int]] = {}
    model_rank = {m.name: i for i, m in enumerate(cfg.models)}
    for ti, tspec in enumerate(cfg.tasks):
        task = get_task(tspec.name)
        task.check_options(tspec.options)
        for ds in tspec.datasets:
            samples = task.samples(ds, tspec.options)
            if not getattr(task, "sampling", True):
                _plan_forward_task(cfg, tspec, task, ds, samples, ti, model_rank, groups, order)
                continue
            L = task.gen_length(ds)
            for method in cfg.task_methods(tspec):
                tok = tokenizers[method.model]
                for s in samples:
                    k = (tspec.name, ds.name, method.model, s.id)
                    if k not in prompt_ids:
                        prompt_ids[k] = _encode(tok, s.prompt, s.chat and cfg.chat_template)
                for nfe in cfg.method_nfes(method):
                    choice = sampler_for(method, nfe, L)
                    for seed in cfg.seeds:
                        keys = [item_key(tspec.name, ds.name, method.name, nfe, seed, s.id) for s in samples]
                        order += keys
                        by_key = dict(zip(keys, samples))
                        ranked = sorted(keys, key=lambda k: (len(prompt_ids[(tspec.name, ds.name, method.model,
                                                                             by_key[k].id)]), by_key[k].index))
                        bs = getattr(task, "batch_size", None) or cfg.batch_size  # walltime: one per call
                        for b in range(0, len(ranked), bs):
                            chunk = ranked[b:b + bs]
                            groups.append((model_rank[method.model], ti, Batch(
                                tspec.name, ds.name, method, method.model, method.name, nfe, seed, L, choice,
                                [by_key[k] for k in chunk], chunk)))
    # one model at a time: batches of the same model run together (stable within a model)
    groups.sort(key=lambda g: g[0])
    return Plan([g[2] for g in groups], order, prompt_ids)


def _plan_forward_task(cfg: EvalConfig, tspec, task, ds, samples: list[Sample], ti: int, model_rank: dict[str, int],
                       groups: list, order: list[str]) -> None:
    """Items of a one-forward task: per model (those of the task's methods, each once) x variant x seed x text."""
    models = list(dict.fromkeys(m.model for m in cfg.task_methods(tspec) if cfg.model(m.model).kind == "diffusion"))
    if not models:
        raise ConfigError(f"task {tspec.name!r} needs a diffusion model; its methods use only causal LMs")
    for model in models:
        for label, params in task.variants(ds, tspec.options, cfg.model(model)):
            dslot = f"{ds.name}/{label}"
            for seed in cfg.seeds:
                keys = [item_key(tspec.name, dslot, model, 0, seed, s.id) for s in samples]
                order += keys
                for b in range(0, len(samples), cfg.batch_size):
                    groups.append((model_rank[model], ti, Batch(tspec.name, ds.name, None, model, model, 0, seed, 0, None,
                                                                samples[b:b + cfg.batch_size], keys[b:b + cfg.batch_size],
                                                                label, params)))


def _encode(tok, text: str, chat: bool) -> list[int]:
    from ..core.loading import encode_prompt

    return encode_prompt(tok, text, chat_template=chat)


# --------------------------------------------------------------------------- run folder


def check_run_dir(run_dir: Path, cfg: EvalConfig, *, overwrite: bool = False, new_run: bool = False) -> None:
    """The output folder's state, checked without writing anything: refuse a path that is a file, a folder
    holding something else, or a run with another config (unless --overwrite / --new-run), or a parent that
    cannot be written."""
    run_dir = Path(run_dir)
    resolve_output(run_dir, what="--out folder")  # refuses a path through a symbolic link loop
    marker = run_dir / R.MARKER
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output path {str(run_dir)!r} exists and is not a folder")
    if marker.exists():
        try:
            old = json.loads(marker.read_text())["config"]
        except (json.JSONDecodeError, KeyError):
            old = None
        diff = config_diff(old, cfg.to_dict()) if old is not None else ["(unreadable eval_run.json)"]
        if diff and not (new_run or overwrite):
            raise ConfigError(f"{run_dir} holds an evaluation run with a different config (differing: "
                              f"{', '.join(diff[:12])}{' ...' if len(diff) > 12 else ''}); run the same config to "
                              f"resume, pass --new-run to move the old records aside and start over, or use another --out")
    elif run_dir.exists() and any(run_dir.iterdir()) and not overwrite:
        raise ValueError(f"output folder {str(run_dir)!r} is not empty and holds no dsl-llada evaluation run; "
                         f"choose another --out, or pass --overwrite to write into it")
    parent = next((q for q in [run_dir, *run_dir.parents] if q.exists()), None)
    if parent is None or not os.access(parent, os.W_OK):
        raise ValueError(f"cannot create the output folder {str(run_dir)!r}: {str(parent)!r} is not writable")


def prepare_run_dir(run_dir: Path, cfg: EvalConfig, *, overwrite: bool = False, new_run: bool = False) -> None:
    """Refuse a folder holding something else or a run with another config; write the marker. Rank 0 only."""
    run_dir = Path(run_dir)
    marker = run_dir / R.MARKER
    new = cfg.to_dict()
    inputs = run_inputs(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output path {str(run_dir)!r} exists and is not a folder")
    if marker.exists():
        try:
            stored = json.loads(marker.read_text())
            old = stored["config"]
        except (json.JSONDecodeError, KeyError):
            stored, old = {}, None
        diff = config_diff(old, new) if old is not None else ["(unreadable eval_run.json)"]
        if old is not None and "inputs" in stored:  # runs made before inputs were recorded resume on the config
            diff += [f"inputs.{k}" for k in sorted(set(stored["inputs"]) | set(inputs))
                     if stored["inputs"].get(k) != inputs.get(k)]
        if diff:
            if new_run:
                stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
                dest = run_dir / f"previous-{stamp}"
                dest.mkdir()
                for name in OUR_FILES:
                    if (run_dir / name).exists():
                        os.replace(run_dir / name, dest / name)
                logger.info("moved the previous run's files to %s", dest)
            elif overwrite:
                _remove_ours(run_dir)
            else:
                raise ConfigError(f"{run_dir} holds an evaluation run with a different config (differing: "
                                  f"{', '.join(diff[:12])}{' ...' if len(diff) > 12 else ''}); run the same config to "
                                  f"resume, pass --new-run to move the old records aside and start over, or use another --out")
    elif run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise ValueError(f"output folder {str(run_dir)!r} is not empty and holds no dsl-llada evaluation run; "
                             f"choose another --out, or pass --overwrite to write into it")
        _remove_ours(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps({"format": R.FORMAT, "version": __version__, "config": new,
                                          "inputs": inputs}, indent=2, sort_keys=True) + "\n")


def run_inputs(cfg: EvalConfig) -> dict[str, Any]:
    """What the run's records depend on besides its config: each model's weights and tokenizer (content hashes, so
    a retrained checkpoint at the same path is not resumed into) and the sampling code."""
    from ..artifacts.fingerprints import code_fingerprint, folder_fingerprints

    out: dict[str, Any] = {m.name: folder_fingerprints(m.path, m.tokenizer) for m in cfg.models
                           if Path(m.path).is_dir()}
    out["code"] = code_fingerprint()
    return out


def _remove_ours(run_dir: Path) -> None:
    for name in OUR_FILES:
        p = run_dir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


# --------------------------------------------------------------------------- execution


@dataclass
class RunResult:
    run_dir: Path
    n_items: int
    n_run: int
    """Items run by this command, over every rank."""
    n_errors: int
    """Of those, items that errored, over every rank."""
    world_size: int
    error_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per task over the whole run folder: {n, errors, rate, most_common, most_common_count}."""

    def failed_tasks(self, max_error_rate: float) -> list[str]:
        """Tasks whose share of errored items exceeds `max_error_rate` (a fraction)."""
        return [t for t, st in self.error_stats.items() if st["rate"] > max_error_rate]


def _state():
    """accelerate's process state (one process without a launcher; gloo on CPU, NCCL on GPUs under one)."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


BATCHING = ("continuous", "fixed")
"""How `run_eval` runs the sampled tasks' batches (`batching`)."""


def run_eval(cfg: EvalConfig, run_dir: str | Path, *, overwrite: bool = False, new_run: bool = False,
             progress: bool = True, report: bool = True, batching: str = "continuous") -> RunResult:
    """Run (or resume) an evaluation into `run_dir`. Works as one process or under `accelerate launch`.

    `batching='continuous'` runs the diffusion samplers' batches on the step-level engine (a group's batches in
    one engine run, the next row taking a finished row's place); 'fixed' runs each batch as one sampler call.
    The records' tokens are the same either way; the autoregressive baseline, one-forward tasks, timed tasks and
    key/value-cache configs always run fixed batches."""
    if batching not in BATCHING:
        raise ValueError(f"batching={batching!r} is not one of {', '.join(BATCHING)}")
    from . import models as M
    from . import preflight as P

    run_dir = Path(run_dir)
    P.check_device(cfg.device)
    state = _state()
    rank, world = state.process_index, state.num_processes
    P.check_world(world, P.requested_processes())
    device = _device(cfg, state)
    # every check on every rank before touching the folder (all ranks fail alike); nothing is written until here
    P.check_task_options(cfg)
    tokenizers = {m.name: M.load_tokenizer_for(m) for m in cfg.models
                  if any(meth.model == m.name for t in cfg.tasks for meth in cfg.task_methods(t))}
    facts = P.check_models(cfg, tokenizers)
    plan = build_plan(cfg, tokenizers)
    P.check_plan(cfg, plan, facts)
    err: Exception | None = None
    if state.is_main_process:  # the folder is checked and written by rank 0 only (no race with --new-run's move)
        try:
            check_run_dir(run_dir, cfg, overwrite=overwrite, new_run=new_run)
            prepare_run_dir(run_dir, cfg, overwrite=overwrite, new_run=new_run)
        except Exception as e:  # noqa: BLE001  (re-raised on every rank below, after the barrier)
            err = e
    state.wait_for_everyone()
    if err is not None:
        raise err
    if not (run_dir / R.MARKER).exists() or config_diff(json.loads((run_dir / R.MARKER).read_text())["config"], cfg.to_dict()):
        raise ConfigError(f"{run_dir}: the run folder was not prepared for this config (another rank failed?)")
    from ..runtime.environment import environment_record

    environment = environment_record(device=device, seeds=list(cfg.seeds))  # each model's dtype is in the config
    done = set(R.read_shards(run_dir))
    mine = [b for j, b in enumerate(plan.batches) if j % world == rank and any(k not in done for k in b.keys)]
    writer = R.ShardWriter(R.shard_path(run_dir, rank))
    n_run = n_err = 0
    warmed: set[tuple[str, str, int]] = set()
    try:
        for unit, loaded in _units(_with_models(mine, cfg, device, progress and rank == 0), batching):
            config = _engine_config(unit[0], loaded) if batching == "continuous" else None
            runs = (_run_continuous(unit, loaded, plan, cfg, config) if config is not None
                    else (_run_one(b, loaded, plan, cfg, warmed) for b in unit))
            for recs in runs:
                todo = [r for r in recs if r["key"] not in done]
                writer.write_many(todo)
                n_run += len(todo)
                n_err += sum(r["error"] is not None for r in todo)
    finally:
        writer.close()
    state.wait_for_everyone()
    if state.is_main_process:
        R.append_environment(run_dir, environment, world_size=world, n_run=n_run)
        merged = R.merge(run_dir, plan.order)
        missing = len(plan.order) - len(merged)
        if missing:
            raise RuntimeError(f"{missing} work items have no record after the run (a rank died?); run the same command "
                               f"again to finish them")
        if report:
            from .summary import write_report

            write_report(run_dir)
    state.wait_for_everyone()
    if world > 1:  # the counts of every rank, not rank 0's
        import torch
        import torch.distributed as dist

        t = torch.tensor([n_run, n_err], dtype=torch.long, device=device if device.startswith("cuda") else "cpu")
        dist.all_reduce(t)
        n_run, n_err = (int(x) for x in t.tolist())
    from .summary import error_stats

    return RunResult(run_dir, len(plan.order), n_run, n_err, world, error_stats(R.read_records(run_dir)))


def _device(cfg: EvalConfig, state) -> str:
    if cfg.device is None:
        return str(state.device)
    if cfg.device == "cuda" and state.device.type == "cuda":
        return str(state.device)  # one GPU per rank
    return cfg.device


def _units(batches: Iterator[tuple[Batch, Any]], batching: str) -> Iterator[tuple[list[Batch], Any]]:
    """Consecutive batches of one (task, dataset, method, nfe, seed) group on one loaded model, together (one
    engine run with `batching='continuous'`); each batch alone with 'fixed'."""
    unit: list[Batch] = []
    current = None
    for b, loaded in batches:
        if unit and (batching == "fixed" or loaded is not current or _group(b) != _group(unit[0])):
            yield unit, current
            unit = []
        unit.append(b)
        current = loaded
    if unit:
        yield unit, current


def _with_models(batches: list[Batch], cfg: EvalConfig, device: str, progress: bool) -> Iterator[tuple[Batch, Any]]:
    """Yield (batch, loaded model), loading each model once (batches arrive grouped by model)."""
    from . import models as M

    current = None
    checked: set[str] = set()
    bar = progress_bar(batches, total=len(batches), desc="eval batches", enabled=progress)
    for b in bar:
        name = b.model
        if current is None or current.spec.name != name:
            if current is not None:
                current = None  # drop the previous model before loading the next (no gc.collect: it costs ~0.7 s)
                if device.startswith("cuda"):
                    import torch

                    torch.cuda.empty_cache()
            logger.info("loading model %r on %s", name, device)
            current = M.load(cfg.model(name), device)
        if b.method is not None and b.method.name not in checked:
            M.check_method(current, b.method)
            checked.add(b.method.name)
        yield b, current


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _run_one(b: Batch, loaded, plan: Plan, cfg: EvalConfig,
             warmed: set[tuple[str, str, int]] | None = None) -> list[dict[str, Any]]:
    """Run one batch whole; when the batch raises (any Exception, ValueError included), run its rows one by one
    and record each row's error (`sampling.batches.retry_rows`).
    Tasks with `warmup` (walltime) get one untimed call per (model, method, NFE) first and record peak memory."""
    from . import models as M

    task = get_task(b.task)
    if b.method is None:
        return _run_forward(b, loaded, task, cfg)
    ids = [plan.prompt_ids[(b.task, b.dataset, b.model, s.id)] for s in b.samples]
    seeds = [b.seed + s.index for s in b.samples]
    timing = getattr(task, "warmup", False)
    if timing and warmed is not None and (b.model, b.method.name, b.nfe) not in warmed:
        warmed.add((b.model, b.method.name, b.nfe))
        try:
            M.run_batch(loaded, b.method, b.choice, ids, seeds)
        except Exception:  # noqa: BLE001  (the timed call below records the error)
            pass
    method = b.method

    def call(rows: list[int]) -> list[tuple[Any, ...]]:
        _sync(loaded.device)
        t0 = time.perf_counter()
        out = M.run_batch(loaded, method, b.choice, [ids[r] for r in rows], [seeds[r] for r in rows])
        _sync(loaded.device)
        dt = time.perf_counter() - t0
        return [(resp, out.nfe, out.forward_passes, dt / len(rows), dt, len(rows), None) for resp in out.responses]

    def failed(_row: int, e: Exception, d: float) -> tuple[Any, ...]:
        return (None, None, None, d, d, 1, f"{type(e).__name__}: {e}")

    outs = retry_rows(range(len(ids)), call, failed, what=f"({b.task}, {b.dataset}, {b.method.name}, nfe {b.nfe})")
    recs = []
    for s, key, p_ids, out in zip(b.samples, b.keys, ids, outs):
        recs.append(_record(b, s, key, p_ids, out, loaded, task, cfg))
        if timing:
            from .tasks.walltime import peak_memory_mib

            recs[-1]["peak_mem_mib"] = peak_memory_mib(loaded.device)
    return recs


def _record(b: Batch, s: Sample, key: str, p_ids: list[int], out: tuple[Any, ...], loaded, task,
            cfg: EvalConfig) -> dict[str, Any]:
    """One sampled item's record from its row (response ids, nfe, forward passes, seconds, batch seconds, batch
    size, error): the decoded text and the task's metrics of it."""
    resp, nfe, fwd, sec, bsec, bsz, error = out
    text = "" if resp is None else loaded.tokenizer.decode(resp, skip_special_tokens=True)
    metrics = None
    if error is None:
        try:
            metrics = task.item_metrics(s.info, text, cfg.scoring_mode)
        except Exception as e:  # noqa: BLE001
            error = f"metrics: {type(e).__name__}: {e}"
    return {"key": key, "task": b.task, "dataset": b.dataset, "method": b.label, "model": b.model, "nfe": b.nfe,
            "seed": b.seed, "sample_id": s.id, "index": s.index,
            "gen_length": b.gen_length, "prompt_tokens": len(p_ids), "text": text, "ids": resp,
            "n_tokens": None if resp is None else len(resp), "nfe_sampler": nfe, "forward_passes": fwd,
            "seconds": sec, "batch_seconds": bsec, "batch_size": bsz, "error": error, "metrics": metrics,
            "info": s.info}


def _engine_config(b: Batch, loaded) -> Any | None:
    """The sampler config of `b` when its rows can run on the step-level engine, else None: a diffusion sampler
    (not the autoregressive baseline, not a one-forward task) without a key/value cache, on a DSLModel or Backbone,
    and not a timed task (walltime times each fixed call)."""
    from ..sampling.batches import engine_runs

    if b.method is None or b.method.preset == "ar" or getattr(get_task(b.task), "warmup", False):
        return None
    config = getattr(b.choice, "config", b.choice)
    return config if engine_runs(loaded.model, config) else None


def _group(b: Batch) -> tuple[Any, ...]:
    return (b.task, b.dataset, b.label, b.model, b.nfe, b.seed)


def _run_continuous(batches: list[Batch], loaded, plan: Plan, cfg: EvalConfig, config: Any
                    ) -> Iterator[list[dict[str, Any]]]:
    """The rows of consecutive batches of one (task, dataset, method, nfe, seed) group on the step-level engine,
    with as many live rows as the largest batch: the next row takes a finished row's place at once. Yields the
    records of the rows that finish at each tick. Every batch is run whole, in plan order, as on the fixed batches
    (so a resumed run makes the arrangement of an uninterrupted one); a row's exception, of any type, becomes its
    record's error (a shared forward that raises is run again row by row)."""
    from ..sampling.batches import run_continuous

    task = get_task(batches[0].task)
    rows = [(b, s, key) for b in batches for s, key in zip(b.samples, b.keys)]
    ids = [plan.prompt_ids[(b.task, b.dataset, b.model, s.id)] for b, s, _ in rows]
    seeds = [b.seed + s.index for b, s, _ in rows]
    width = max(len(b.samples) for b in batches)
    for done in run_continuous(loaded.model, ids, config, max_rows=width, seed_of=lambda i: seeds[i],
                               check_context=False, fatal=()):
        recs = []
        for r in done:
            b, s, key = rows[r.index]
            out = r.output
            if out is None:
                row: tuple[Any, ...] = (None, None, None, r.seconds, r.batch_seconds, r.batch_size, r.error)
            else:
                row = (r.response, int(out.nfe), int(out.forward_passes), r.seconds, r.batch_seconds, r.batch_size,
                       None)
            recs.append(_record(b, s, key, ids[r.index], row, loaded, task, cfg))
        yield recs


def _run_forward(b: Batch, loaded, task, cfg: EvalConfig) -> list[dict[str, Any]]:
    """One-forward tasks: the task scores the batch; a raising batch is retried row by row."""
    def call(rows: list[Sample]) -> list[tuple[Any, ...]]:
        t0 = time.perf_counter()
        outs = task.run_batch(loaded, rows, b.params, b.seed, cfg.scoring_mode)
        dt = time.perf_counter() - t0
        return [(m, e, dt / len(rows), dt, len(rows)) for m, e in outs]

    def failed(_s: Sample, e: Exception, d: float) -> tuple[Any, ...]:
        return (None, f"{type(e).__name__}: {e}", d, d, 1)

    timed = retry_rows(b.samples, call, failed, what=f"({b.task}, {b.dataset}/{b.variant})")
    return [{"key": key, "task": b.task, "dataset": b.dataset, "variant": b.variant, "method": b.label, "model": b.model,
             "nfe": 0, "seed": b.seed, "sample_id": s.id, "index": s.index, "params": b.params, "text": "", "ids": None,
             "n_tokens": None, "forward_passes": None if err else 1, "seconds": sec, "batch_seconds": bsec,
             "batch_size": bsz, "error": err, "metrics": m, "info": s.info}
            for s, key, (m, err, sec, bsec, bsz) in zip(b.samples, b.keys, timed)]
