"""The training loop on Hugging Face accelerate: one code path for 1 process, DDP, FSDP2 and DeepSpeed ZeRO-2.

``train(config) -> TrainResult``. Per optimizer update: fetch ``grad_accum`` micro-batches per process (the data
stream is rank-sharded by `make_dataloader`; it is *not* passed through ``accelerator.prepare``, which would re-shard
and prefetch and so break the exact resume position), run the objective inside the prepared module's ``forward``
(so DDP / FSDP / DeepSpeed hooks fire), backward with accumulation, refuse non-finite losses or gradient norms on
every rank together, clip the global norm, step AdamW and the warmup schedule, log, monitor, checkpoint.
What differs between engines (accelerate's DDP, FSDP2, DeepSpeed) lives in one back-end object (`backends.py`).

Determinism: every random draw of the objective comes from one ``torch.Generator`` per process seeded with
``seed + rank`` and saved in checkpoints, so a resumed CPU run reproduces the uninterrupted run's losses bit for bit.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.backbones.base import Backbone
from ..config import ConfigError
from ..core.model import DSLModel
from ..artifacts.atomic import atomic_write_text
from . import checkpointing as ckpt
from . import monitor
from .backends import Backend, make_backend
from .components import ObjectiveModule, backbone_of, enable_gradient_checkpointing, flat_config, floor_evaluator, \
    load_training_model, make_accelerator, resolve_tokenizer, tokenizer_for_checkpoints
from .train_config import SCRATCH, TrainConfig
from .data import make_dataloader
from .metrics_log import METRICS_FILE, LogWindow, append_record
from .objectives import ObjectiveOutput, check_finite, get_objective
from .optim import apply_freezing, build_optimizer, converter_parameters, param_groups

logger = logging.getLogger("dsl_llada.train")

__all__ = ["METRICS_FILE", "ObjectiveModule", "TrainResult", "Trainer", "TrainingDiverged", "load_training_model", "train"]

PREFIX = ckpt.MODEL_PREFIX  # parameter names inside ObjectiveModule
HISTORY_FILE = "history.jsonl"
"""One line per resume of the run: the checkpoint, its step, the changed settings and the step they apply from."""


class TrainingDiverged(FloatingPointError):
    """A non-finite loss or gradient norm stopped training; nothing was saved for that step."""

    def __init__(self, message: str, step: int, last_checkpoint: Path | None):
        super().__init__(message)
        self.step, self.last_checkpoint = step, last_checkpoint


@dataclass
class TrainResult:
    """What a run did."""

    output_dir: Path
    start_step: int
    """Updates already done when this call started (0, or the resumed checkpoint's step)."""
    final_step: int
    stop_reason: str
    """'max_steps', 'data_exhausted' (the stream ended; data.repeat=false) or 'already_done'."""
    losses: dict[int, float] = field(default_factory=dict)
    """Loss of every update run by this call (mean over micro-batches and processes)."""
    evals: dict[int, dict[str, float]] = field(default_factory=dict)
    last_checkpoint: Path | None = None
    final_model: Path | None = None
    metrics_file: Path | None = None
    world_size: int = 1
    model: DSLModel | Backbone | None = field(default=None, repr=False)
    """The trained model (unwrapped; sharded parameters under FSDP)."""


# -- the trainer ----------------------------------------------------------------------------------------------------
class Trainer:
    """One run. Prefer the `train()` function; the class exists so the pieces can be tested and reused.

    Programmatic extras: `model` (a module instead of `config.init_from`), `tokenizer` (object or str -> ids
    callable, instead of `config.tokenizer`), `texts` (in-memory documents instead of data.source/files),
    `objective` (a custom callable `(model, batch, generator) -> ObjectiveOutput`), `on_step(step, record)` (called on
    every process after every update, after any checkpoint of that step).
    """

    def __init__(self, config: TrainConfig, *, model: nn.Module | None = None, tokenizer: Any = None,
                 texts: Iterable[Any] | None = None, objective: Callable[..., ObjectiveOutput] | None = None,
                 on_step: Callable[[int, dict], None] | None = None, overwrite: bool = False):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.config, self._model_arg, self._tokenizer_arg = config, model, tokenizer
        self._texts = None if texts is None else list(texts)
        self._objective_arg, self.on_step = objective, on_step
        self.output_dir = Path(config.output_dir)
        self.overwrite = overwrite
        """Resuming from a checkpoint older than output_dir's newest discards the later ones (else refused)."""

    # ---------------------------------------------------------------------------------------------- setup
    def _resume_point(self) -> Path | None:
        """The checkpoint to resume from, checked before anything is loaded: intact (`resume='auto'` skips damaged
        ones, naming them), not older than the run's newest unless `overwrite`, and its settings compatible
        (`checkpointing.resume_changes`)."""
        c = self.config
        self.branch_discards: list[Path] = []
        self.damaged_aside: list[Path] = []
        self.resume_changed: dict = {}
        if c.resume == "auto":
            good, bad = ckpt.intact_checkpoints(self.output_dir)
            newest_ok = good[-1][0] if good else -1
            for p, why in bad:
                step = int(p.name.rsplit("-", 1)[1])
                if step > newest_ok:
                    logger.warning("skipping damaged checkpoint %s: %s", p, why)
            if not good:
                if bad:
                    raise ConfigError(f"resume='auto': every checkpoint in output_dir={str(self.output_dir)!r} is "
                                      f"damaged (newest: {bad[-1][1]}); resume from a copy, or start a new run")
                return None
            # A damaged checkpoint newer than the resumed one must not pass for the run's newest later on (nor
            # make rotation delete intact ones): it is renamed aside, never deleted.
            self.damaged_aside = [p for p, _ in bad if int(p.name.rsplit("-", 1)[1]) > newest_ok]
            return self._checked(good[-1][1])
        if c.resume:
            p = Path(c.resume)
            if not ckpt.is_complete(p):
                raise FileNotFoundError(f"resume={c.resume!r} is not a complete training checkpoint (no "
                                        f"{ckpt.TRAINER_STATE}/{ckpt.STATE_FILE})")
            step = ckpt.check_checkpoint(p)["step"]
            later = [q for s, q in ckpt.list_checkpoints(self.output_dir) if s > step]
            if later and not self.overwrite:
                raise ConfigError(f"resume={c.resume!r} (step {step}) is older than the newest checkpoint of "
                                  f"output_dir={str(self.output_dir)!r} ({later[-1].name}); continuing there would "
                                  f"replace or delete checkpoints {', '.join(q.name for q in later)} — set output_dir "
                                  f"to a new folder to branch from step {step} (the checkpoint is only read), or pass "
                                  f"--overwrite to discard the later checkpoints")
            self.branch_discards = later
            return self._checked(p)
        found = ckpt.list_checkpoints(self.output_dir)
        if found:
            raise ConfigError(f"output_dir={str(self.output_dir)!r} already holds checkpoints (newest: {found[-1][1].name}); "
                              f"set resume='auto' to continue that run, or choose another output_dir")
        return None

    def _checked(self, folder: Path) -> Path:
        self.resume_changed = ckpt.resume_changes(folder, self.config)
        return folder

    def _setup(self) -> None:
        c = self.config
        self.acc, mp = make_accelerator(c, self.output_dir)
        acc = self.acc
        self.rank, self.world, self.main = acc.process_index, acc.num_processes, acc.is_main_process
        self.device = acc.device
        from accelerate.utils import set_seed

        set_seed(c.seed)
        self.resume_from = self._resume_point()
        model = self._load_model()
        tok = self._setup_data()

        # objective, wrapper, back-end (sharding / preparation), optimiser
        objective = self._objective_arg or get_objective(c.objective, config=c.objective_options)
        wrapper = ObjectiveModule(model, objective)
        self.backend: Backend = make_backend(acc, c, mp)
        self.backend.shard(wrapper)
        groups = param_groups(wrapper, c, prefix=PREFIX)
        self.group_info = [{"name": g["name"], "n_params": sum(p.numel() for p in g["params"]), "n_tensors": len(g["params"])}
                           for g in groups]
        self.backend.prepare(wrapper, *build_optimizer(groups, c))
        self.module: ObjectiveModule = self.backend.module
        if c.converter_lr_mode == "grad_hook" and self.is_dsl:
            conv_params = converter_parameters(self.module, PREFIX)
            if conv_params:
                self.backend.attach_converter_multiplier(conv_params, c.converter_lr_mult)
        self.trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.generator = torch.Generator(device=self.device).manual_seed(c.seed + self.rank)
        self.parts = ckpt.RunParts(
            config=c, acc=acc, backend=self.backend, output_dir=self.output_dir, rank=self.rank, world=self.world,
            model=self.module.model, is_dsl=self.is_dsl, dataset=self.loader.dataset, generator=self.generator,
            group_info=self.group_info, tokenizer_dir=self.tokenizer_dir,
            tokenizer_to_save=tokenizer_for_checkpoints(c, tok, self.tokenizer_dir, self.special, self.vocab_size)
            if self.main else None,
            protect=(self.resume_from,) if self.resume_from is not None and c.resume != "auto" else ())

    def _load_model(self) -> DSLModel | Backbone:
        """The model to train (from the resume checkpoint, the `model` argument or `init_from`), frozen as configured."""
        c = self.config
        if self.resume_from is None and self._model_arg is None and not c.init_from:
            raise ConfigError("init_from is required: a backbone folder (e.g. LLaDA-8B-Instruct), a DSL checkpoint "
                              "folder, or 'scratch' (with scratch_model)")
        source = self.resume_from if self.resume_from is not None else self._model_arg
        model = load_training_model(c, source)
        self.is_dsl = isinstance(model, DSLModel)
        backbone = backbone_of(model)
        self.special = backbone.special
        self.vocab_size = backbone.vocab_size
        ctx = backbone.max_length
        if ctx is not None and c.data.block_size > ctx:
            raise ConfigError(f"data.block_size={c.data.block_size} exceeds the model's context of {ctx} tokens; "
                              f"use data.block_size <= {ctx}")
        self.frozen = apply_freezing(model, c)
        if c.gradient_checkpointing:
            enable_gradient_checkpointing(backbone)
        model.train()
        return model

    def _setup_data(self) -> Any:
        """The tokenizer (returned) and this process's share of the data stream (`self.loader`)."""
        c = self.config
        init_dir = Path(c.init_from) if c.init_from and c.init_from != SCRATCH and Path(c.init_from).is_dir() else None
        tok, self.tokenizer_dir = (self._tokenizer_arg, None) if self._tokenizer_arg is not None else \
            resolve_tokenizer(c, init_dir or self.resume_from)
        self.loader = make_dataloader(c.data, tok, batch_size=c.per_device_batch_size, rank=self.rank,
                                      world_size=self.world, texts=self._texts, eos_id=self.special.eos)
        self.floor = floor_evaluator(c)
        self._eval_batches: list[dict[str, torch.Tensor]] | None = None
        self._tok = tok
        return tok

    # ---------------------------------------------------------------------------------------------- helpers
    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or max) small float lists over processes (float64; identity with one process)."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.tolist()

    def _fetch(self, it) -> list[dict[str, torch.Tensor]] | None:
        """grad_accum micro-batches, or None when the stream ended on any process; a data error on any process
        stops every process (so none waits forever in a collective)."""
        micro, status, err = [], 0.0, None
        try:
            for _ in range(self.config.grad_accum):
                micro.append(next(it))
                self._check_ids(micro[-1])
        except StopIteration:
            status = 1.0
        except Exception as e:  # noqa: BLE001  (re-raised below, on every rank)
            status, err = 2.0, e
        worst = self._all_reduce([status], "max")[0]
        if worst >= 2:
            if err is not None:
                raise err
            raise RuntimeError("data loading failed on another process (see its error)")
        return None if worst >= 1 else micro

    def _check_ids(self, batch: dict[str, torch.Tensor]) -> None:
        ids = batch["input_ids"]
        hi = int(ids.max()) if ids.numel() else 0
        if hi >= self.vocab_size or (ids.numel() and int(ids.min()) < 0):
            raise ValueError(f"token id {hi} is outside the model's vocabulary [0, {self.vocab_size}): the tokenizer "
                             f"does not match the model")

    def _eval_data(self) -> list[dict[str, torch.Tensor]]:
        if self._eval_batches is None:
            c = self.config
            dcfg = c.data.replace(shuffle_buffer=0, repeat=False,
                                  subset="validation" if c.data.validation_every is not None else c.data.subset)
            loader = make_dataloader(dcfg, self._tok, batch_size=c.per_device_batch_size,
                                     rank=self.rank, world_size=self.world, texts=self._texts, eos_id=self.special.eos)
            out = []
            try:
                for b in loader:
                    out.append(b)
                    if len(out) >= c.eval_batches:
                        break
            except ValueError as e:
                logger.warning("monitoring disabled: %s", e)
            self._eval_batches = out
        return self._eval_batches

    def _evaluate(self) -> dict[str, float]:
        """`monitor.monitor_all` on the evaluation batches, run inside the wrapped module's forward (so DDP / FSDP /
        DeepSpeed see every use of the parameters) and averaged over processes (token counts left out)."""
        c = self.config
        batches = self._eval_data()
        if self._all_reduce([0.0 if batches else 1.0], "max")[0] >= 1:  # some process has nothing to evaluate
            return {}
        gen = torch.Generator(device=self.device).manual_seed(c.seed + 1_000_003 + self.rank)
        snrs = tuple(c.eval_snrs)

        def run(model: DSLModel | Backbone) -> dict[str, float]:
            return {k: v for k, v in monitor.monitor_all(model, batches, gen, snrs=snrs).items()
                    if not k.endswith(("/n_tokens", "/mask_rate"))}

        with torch.no_grad():
            local = self.backend.wrapped(fn=run)
        keys = sorted(local)
        vals = self._all_reduce([float(local[k]) for k in keys])
        return {f"eval/{k}": v / self.world for k, v in zip(keys, vals)}

    def _diverged(self, step: int, what: str) -> TrainingDiverged:
        where = (f"the last good checkpoint is {self.last_checkpoint} (step {self.last_saved_step}); resume from it "
                 f"(resume='auto') with a lower lr or max_grad_norm" if self.last_checkpoint is not None else
                 "no checkpoint was written yet (save_every)")
        update = ("DeepSpeed had already applied this update in memory" if self.backend.update_applied_before_norm
                  else "the optimizer did not update")
        return TrainingDiverged(f"training stopped at step {step}: {what}. Nothing was saved for this step and "
                                f"{update}; {where}", step, self.last_checkpoint)

    # ---------------------------------------------------------------------------------------------- the loop
    def train(self) -> TrainResult:
        self._setup()
        c = self.config
        start = self._begin()
        result = TrainResult(self.output_dir, start, start, "already_done", world_size=self.world,
                             metrics_file=self.output_dir / METRICS_FILE)
        bar = self._progress_bar(start)
        self.t_start = time.perf_counter()
        step = start
        it = iter(self.loader)
        try:
            while step < c.max_steps:
                micro = self._fetch(it)
                if micro is None:
                    result.stop_reason = "data_exhausted"
                    if self.main:
                        logger.warning("the data stream ended after step %d (data.repeat=false); stopping early", step)
                    break
                step += 1
                loss, grad_norm, lrs = self._update(step, micro)
                result.losses[step] = loss
                record = self._report(step, grad_norm, lrs, result)
                if c.save_every and step % c.save_every == 0:
                    self._save(step)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4f}", lr=f"{self.backend.optimizer.param_groups[0]['lr']:.2e}")
                if self.on_step is not None:
                    self.on_step(step, record)
                if record:
                    self.window.restart_clock()
            else:
                result.stop_reason = "max_steps" if step > start else "already_done"
            self._finish(step, result)
        finally:
            if bar is not None:
                bar.close()
            self.backend.close()
            if self.acc.log_with:
                self.acc.end_training()
        result.final_step, result.last_checkpoint = step, self.last_checkpoint
        result.model = self.module.model
        return result

    def _begin(self) -> int:
        """Restore the resume checkpoint's state (or start at 0), prepare the output folder and trackers. Returns
        the first step's predecessor."""
        c = self.config
        self.tokens_seen, self.last_checkpoint, self.last_saved_step = 0, None, -1
        self.window = LogWindow()
        start = 0
        if self.resume_from is not None:
            progress = ckpt.load_run(self.parts, self.resume_from)
            start, self.tokens_seen = progress.step, progress.tokens_seen
            if progress.log_window is not None:
                self.window.load_state_dict(progress.log_window)
            self.last_checkpoint, self.last_saved_step = self.resume_from, start
        if self.main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for p in sorted(self.output_dir.glob(".checkpoint-*.tmp")) + sorted(self.output_dir.glob(".checkpoint-*.old")) \
                    + sorted(self.output_dir.glob(".final.*")):
                if p.is_dir() and not p.is_symlink():  # left by a run killed while saving (this run holds the lock)
                    logger.warning("removing %s, a temp folder left by an interrupted save", p)
                    shutil.rmtree(p)
            for p in self.branch_discards:  # --overwrite: the checkpoints after the one this run branches from
                logger.warning("removing %s (--overwrite: newer than the checkpoint this run resumes from)", p)
                shutil.rmtree(p)
            for p in self.damaged_aside:
                aside, n = p.with_name(f"damaged-{p.name}"), 1
                while aside.exists():
                    n += 1
                    aside = p.with_name(f"damaged-{p.name}.{n}")
                logger.warning("renaming the damaged %s to %s (kept for inspection; never resumed from)", p, aside.name)
                os.replace(p, aside)
            if start:
                ckpt.truncate_metrics(self.output_dir / METRICS_FILE, start)
                self._record_resume(start)
            else:
                (self.output_dir / METRICS_FILE).unlink(missing_ok=True)
            atomic_write_text(self.output_dir / "train_config.json", c.to_json() + "\n")
            logger.info("training %s (%s) for %d updates from step %d on %d process(es) [%s]: global batch %d x %d "
                        "tokens; groups %s; frozen %s%s", c.objective, type(self.module.model).__name__, c.max_steps,
                        start, self.world, self.backend.name, c.global_batch(self.world), c.data.block_size,
                        [(g["name"], g["n_params"]) for g in self.group_info], self.frozen,
                        f"; resumed from {self.resume_from}" if self.resume_from else "")
        if self.acc.log_with and self.main:
            self.acc.init_trackers(c.project_name, config=flat_config(c.to_dict()))
        return start

    def _record_resume(self, start: int) -> None:
        """Log the resume and append it to the run's history (`history.jsonl`) with the settings it changed and the
        first update that uses them, so `train_config.json` (this run's settings) never claims a value not used."""
        changed = {k: {"old": a, "new": b} for k, (a, b) in sorted(self.resume_changed.items())}
        if changed:
            logger.warning("resuming from %s at step %d with changed settings, applied from step %d: %s",
                           self.resume_from, start, start + 1,
                           "; ".join(f"{k} {v['old']} -> {v['new']}" for k, v in changed.items()))
        append_record(self.output_dir / HISTORY_FILE, {"event": "resume", "from": str(self.resume_from),
                                                       "step": start, "effective_from_step": start + 1,
                                                       "changed": changed})

    def _progress_bar(self, start: int):
        c = self.config
        if not (c.progress and self.main and start < c.max_steps):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=c.max_steps, initial=start, desc=f"train {c.objective}", dynamic_ncols=True)

    def _update(self, step: int, micro: list[dict[str, torch.Tensor]]) -> tuple[float, float | None, dict[str, float]]:
        """One optimizer update over `micro`: forward/backward, the finite checks on every process, clip, step.
        Returns (mean loss over micro-batches and processes, gradient norm, the learning rates it used)."""
        loss_sum, bad, tokens, where = 0.0, 0.0, 0.0, ""
        for i, batch in enumerate(micro):
            batch = {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
            loss_t, metrics, _ = self.backend.forward_backward(batch, self.generator, last=i == len(micro) - 1)
            loss = float(loss_t.detach())
            tokens += float(batch["input_ids"].numel())
            try:
                check_finite(loss, step, metrics)
            except FloatingPointError as e:
                bad += 1
                where = where or f"{e} (process {self.rank}, micro-batch {i + 1}/{len(micro)})"
            else:
                loss_sum += loss
                self.window.add_metrics(metrics)
        loss_sum, n_micro, bad_all, tokens = self._all_reduce([loss_sum, float(len(micro)), bad, tokens])
        if bad_all:
            raise self._diverged(step, where or "non-finite loss on another process")
        grad_norm = self.backend.clip(self.trainable, self.config.max_grad_norm)
        self._check_grad_norm(step, grad_norm)
        optimizer = self.backend.optimizer
        used_lr = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
        optimizer.step()
        self.backend.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if grad_norm is None:
            grad_norm = self.backend.grad_norm_after_step()
            self._check_grad_norm(step, grad_norm)
        loss_mean = loss_sum / n_micro
        self.tokens_seen += int(tokens)
        self.window.add_update(loss_mean, tokens)
        return loss_mean, grad_norm, used_lr

    def _check_grad_norm(self, step: int, grad_norm: float | None) -> None:
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise self._diverged(step, f"non-finite gradient norm {grad_norm}")

    def _report(self, step: int, grad_norm: float | None, lrs: dict[str, float], result: TrainResult) -> dict[str, Any]:
        """The metrics record of `step` (empty when nothing is due): logged window, evaluation; written by rank 0."""
        c = self.config
        record: dict[str, Any] = {}
        last = step == c.max_steps
        if step % c.log_every == 0 or last:
            record = self.window.record(step, grad_norm, lrs, self.tokens_seen, self.t_start)
        if c.eval_every and (step % c.eval_every == 0 or last):
            ev = self._evaluate()
            result.evals[step] = ev
            record.update(ev, step=step)
        if self.floor is not None and self.floor.due(step, last):
            floor = self.floor.run(self.backend.wrapped, step, self.main)
            result.evals.setdefault(step, {}).update(floor)
            record.update(floor, step=step)
        if record and self.main:
            append_record(self.output_dir / METRICS_FILE, record)
            if self.acc.log_with:
                self.acc.log({k: v for k, v in record.items() if k != "step"}, step=step)
        return record

    def _save(self, step: int) -> None:
        progress = ckpt.RunProgress(step=step, tokens_seen=self.tokens_seen, log_window=self.window.state_dict())
        self.last_checkpoint, self.last_saved_step = ckpt.save_run(self.parts, progress), step

    def _finish(self, step: int, result: TrainResult) -> None:
        """The last checkpoint (unless this step was just saved) and the `final/` model folder."""
        c = self.config
        if step > self.last_saved_step and step > 0:
            self._save(step)
        if c.save_final and self.main and self.last_checkpoint is not None:
            result.final_model = ckpt.link_model_files(self.last_checkpoint, self.output_dir / "final")
        self.acc.wait_for_everyone()
        if c.save_final and result.final_model is None and self.last_checkpoint is not None:
            result.final_model = self.output_dir / "final"


def train(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """Run (or resume) training as configured; see `Trainer` for the keyword extras. Returns a `TrainResult`."""
    return Trainer(config, **kwargs).train()
