"""The training loop on Hugging Face accelerate: one code path for 1 process, DDP, FSDP2 and DeepSpeed ZeRO-2.

``train(config) -> TrainResult``. Per optimizer update: fetch ``grad_accum`` micro-batches per process (the data
stream is rank-sharded by `make_dataloader`; it is *not* passed through ``accelerator.prepare``, which would re-shard
and prefetch and so break the exact resume position), run the objective inside the prepared module's ``forward``
(so DDP / FSDP / DeepSpeed hooks fire), backward with accumulation, refuse non-finite losses or gradient norms on
every rank together, clip the global norm, step AdamW and the warmup schedule, log, monitor, checkpoint.

Determinism: every random draw of the objective comes from one ``torch.Generator`` per process seeded with
``seed + rank`` and saved in checkpoints, so a resumed CPU run reproduces the uninterrupted run's losses bit for bit.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ConfigError
from ..model import DSLModel
from ..utils import atomic_write_text
from . import checkpointing as ckpt
from . import monitor
from .components import ObjectiveModule, backbone_of, configure_deepspeed, enable_gradient_checkpointing, \
    flat_config, load_training_model, make_accelerator, resolve_tokenizer, shard_fsdp2, tokenizer_for_checkpoints
from .config import SCRATCH, TrainConfig
from .data import make_dataloader
from .objectives import ObjectiveOutput, check_finite, get_objective
from .optim import apply_freezing, build_optimizer, clip_grad_norm_sharded, converter_parameters, param_groups, \
    register_converter_grad_hooks, scale_converter_grads

logger = logging.getLogger("dsl_llada.train")

__all__ = ["METRICS_FILE", "ObjectiveModule", "TrainResult", "Trainer", "TrainingDiverged", "load_training_model", "train"]

METRICS_FILE = "metrics.jsonl"
PREFIX = ckpt.MODEL_PREFIX  # parameter names inside ObjectiveModule


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
    model: nn.Module | None = field(default=None, repr=False)
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
                 on_step: Callable[[int, dict], None] | None = None):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.config, self._model_arg, self._tokenizer_arg = config, model, tokenizer
        self._texts = None if texts is None else list(texts)
        self._objective_arg, self.on_step = objective, on_step
        self.output_dir = Path(config.output_dir)

    # ---------------------------------------------------------------------------------------------- setup
    def _resume_point(self) -> Path | None:
        c = self.config
        if c.resume == "auto":
            return ckpt.latest_checkpoint(self.output_dir)
        if c.resume:
            p = Path(c.resume)
            if not ckpt.is_complete(p):
                raise FileNotFoundError(f"resume={c.resume!r} is not a complete training checkpoint (no "
                                        f"{ckpt.TRAINER_STATE}/{ckpt.STATE_FILE})")
            return p
        found = ckpt.list_checkpoints(self.output_dir)
        if found:
            raise ConfigError(f"output_dir={str(self.output_dir)!r} already holds checkpoints (newest: {found[-1][1].name}); "
                              f"set resume='auto' to continue that run, or choose another output_dir")
        return None

    def _setup(self) -> None:
        c = self.config
        self.acc, self.mp = make_accelerator(c, self.output_dir)
        acc = self.acc
        self.rank, self.world, self.main = acc.process_index, acc.num_processes, acc.is_main_process
        self.device = acc.device
        from accelerate.utils import DistributedType, set_seed  # noqa: PLC0415

        set_seed(c.seed)
        self.resume_from = self._resume_point()
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

        # tokenizer and data
        init_dir = Path(c.init_from) if c.init_from and c.init_from != SCRATCH and Path(c.init_from).is_dir() else None
        if self._tokenizer_arg is not None:
            tok, self.tokenizer_dir = self._tokenizer_arg, None
        else:
            tok, self.tokenizer_dir = resolve_tokenizer(c, init_dir or self.resume_from)
        self.tokenizer_to_save = tokenizer_for_checkpoints(c, tok, self.tokenizer_dir, self.special, self.vocab_size) \
            if self.main else None
        self.loader = make_dataloader(c.data, tok, batch_size=c.per_device_batch_size, rank=self.rank,
                                      world_size=self.world, texts=self._texts, eos_id=self.special.eos)
        self._eval_batches: list[dict[str, torch.Tensor]] | None = None
        self._tok = tok

        # objective, wrapper, sharding/preparation, optimiser
        objective = self._objective_arg or get_objective(c.objective, config=c.objective_options)
        wrapper = ObjectiveModule(model, objective)
        self.ds = acc.distributed_type == DistributedType.DEEPSPEED
        self.sharded = c.sharding == "fsdp2" or acc.distributed_type == DistributedType.FSDP
        self.ignored: list[nn.Parameter] = []
        if self.sharded:
            self.ignored = shard_fsdp2(wrapper, self.device, self.mp, getattr(acc.state, "fsdp_plugin", None))
        groups = param_groups(wrapper, c, prefix=PREFIX)
        self.group_info = [{"name": g["name"], "n_params": sum(p.numel() for p in g["params"]), "n_tensors": len(g["params"])}
                           for g in groups]
        optimizer, scheduler = build_optimizer(groups, c)
        if self.sharded:
            self.wrapped, self.optimizer, self.scheduler = wrapper, optimizer, scheduler
        else:
            if self.ds:
                configure_deepspeed(acc, c)
            self.wrapped, self.optimizer, self.scheduler = acc.prepare(wrapper, optimizer, scheduler)
        self.unwrapped: ObjectiveModule = wrapper if self.sharded else acc.unwrap_model(self.wrapped)
        self.conv_params = converter_parameters(self.unwrapped, PREFIX) if self.is_dsl else []
        self.hooks = []
        if c.converter_lr_mode == "grad_hook" and self.conv_params and not self.sharded:
            self.hooks = register_converter_grad_hooks(self.conv_params, c.converter_lr_mult)
        self.trainable = [p for p in self.unwrapped.parameters() if p.requires_grad]
        self.generator = torch.Generator(device=self.device).manual_seed(c.seed + self.rank)

    # ---------------------------------------------------------------------------------------------- helpers
    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or max) small float lists over processes (float64; identity with one process)."""
        if self.world == 1:
            return values
        import torch.distributed as dist  # noqa: PLC0415

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
        c = self.config
        batches = self._eval_data()
        if self._all_reduce([0.0 if batches else 1.0], "max")[0] >= 1:  # some process has nothing to evaluate
            return {}
        gen = torch.Generator(device=self.device).manual_seed(c.seed + 1_000_003 + self.rank)
        is_dsl, snrs, vocab = self.is_dsl, tuple(c.eval_snrs), self.vocab_size

        def run(model: nn.Module) -> dict[str, float]:
            out: dict[str, float] = {}
            out.update({f"clean/{k}": v for k, v in monitor.clean_eval(model, batches).items() if k != "n_tokens"})
            out.update({f"infill/{k}": v for k, v in monitor.infill_eval(model, batches, generator=gen).items()
                        if k not in ("n_tokens", "mask_rate")})
            if is_dsl:
                out.update({f"fixed_snr/{k}": v for k, v in monitor.fixed_snr_eval(model, batches, snrs, gen).items()})
                out.update({f"converter/{k}": v for k, v in monitor.converter_stats(model).items()})
                out.update({f"embed/{k}": v for k, v in
                            monitor.noise_embedding_health(model, n=min(1000, vocab), generator=gen).items()})
            return out

        with torch.no_grad():
            local = self.wrapped(fn=run)
        keys = sorted(local)
        vals = self._all_reduce([float(local[k]) for k in keys])
        return {f"eval/{k}": v / self.world for k, v in zip(keys, vals)}

    # ---------------------------------------------------------------------------------------------- loop
    def _micro_step(self, batch: dict[str, torch.Tensor], last: bool) -> tuple[float, dict[str, float], int]:
        batch = {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
        if self.sharded:
            self.wrapped.set_requires_gradient_sync(last)
            loss, metrics, n = self.wrapped(batch, self.generator)
            (loss / self.config.grad_accum).backward()
        else:
            with self.acc.accumulate(self.wrapped):
                loss, metrics, n = self.wrapped(batch, self.generator)
                self.acc.backward(loss)
        return float(loss.detach()), metrics, int(n)

    def _clip(self) -> float | None:
        c = self.config
        if self.sharded:
            if self.ignored and self.world > 1:
                import torch.distributed as dist  # noqa: PLC0415

                for p in self.ignored:
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                        p.grad.div_(self.world)
            if c.converter_lr_mode == "grad_hook" and self.conv_params:
                scale_converter_grads(self.conv_params, c.converter_lr_mult)
            return clip_grad_norm_sharded(self.trainable, c.max_grad_norm)
        if self.ds:
            return None  # DeepSpeed clips inside its step (gradient_clipping in its config)
        norm = self.acc.clip_grad_norm_(self.trainable, c.max_grad_norm if c.max_grad_norm else float("inf"))
        return None if norm is None else float(norm)

    def _diverged(self, step: int, what: str) -> TrainingDiverged:
        where = (f"the last good checkpoint is {self.last_checkpoint} (step {self.last_saved_step}); resume from it "
                 f"(resume='auto') with a lower lr or max_grad_norm" if self.last_checkpoint is not None else
                 "no checkpoint was written yet (save_every)")
        update = ("DeepSpeed had already applied this update in memory" if self.ds else
                  "the optimizer did not update")
        return TrainingDiverged(f"training stopped at step {step}: {what}. Nothing was saved for this step and "
                                f"{update}; {where}", step, self.last_checkpoint)

    def train(self) -> TrainResult:
        self._setup()
        c, acc = self.config, self.acc
        self.tokens_seen, self.last_checkpoint, self.last_saved_step = 0, None, -1
        start = ckpt.load_run(self, self.resume_from) if self.resume_from is not None else 0
        if self.main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            if start:
                ckpt.truncate_metrics(self.output_dir / METRICS_FILE, start)
            else:
                (self.output_dir / METRICS_FILE).unlink(missing_ok=True)
            atomic_write_text(self.output_dir / "train_config.json", c.to_json() + "\n")
            logger.info("training %s (%s) for %d updates from step %d on %d process(es): global batch %d x %d tokens; "
                        "groups %s; frozen %s%s", c.objective, type(self.unwrapped.model).__name__, c.max_steps, start,
                        self.world, c.global_batch(self.world), c.data.block_size,
                        [(g["name"], g["n_params"]) for g in self.group_info], self.frozen,
                        f"; resumed from {self.resume_from}" if self.resume_from else "")
        if acc.log_with and self.main:
            acc.init_trackers(c.project_name, config=flat_config(c.to_dict()))
        result = TrainResult(self.output_dir, start, start, "already_done", world_size=self.world,
                             metrics_file=self.output_dir / METRICS_FILE)
        bar = None
        if c.progress and self.main and start < c.max_steps:
            from tqdm.auto import tqdm  # noqa: PLC0415

            bar = tqdm(total=c.max_steps, initial=start, desc=f"train {c.objective}", dynamic_ncols=True)
        step, window = start, {"loss": [], "tokens": 0.0, "t0": time.perf_counter(), "metrics": {}}
        t_start = time.perf_counter()
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
                loss_sum, bad, tokens, where = 0.0, 0.0, 0.0, ""
                for i, batch in enumerate(micro):
                    loss, metrics, _ = self._micro_step(batch, i == len(micro) - 1)
                    tokens += float(batch["input_ids"].numel())
                    try:
                        check_finite(loss, step, metrics)
                    except FloatingPointError as e:
                        bad += 1
                        where = where or f"{e} (process {self.rank}, micro-batch {i + 1}/{len(micro)})"
                    else:
                        loss_sum += loss
                        for k, v in metrics.items():
                            window["metrics"].setdefault(k, []).append(v)
                loss_sum, n_micro, bad_all, tokens = self._all_reduce([loss_sum, float(len(micro)), bad, tokens])
                if bad_all:
                    raise self._diverged(step, where or "non-finite loss on another process")
                grad_norm = self._clip()
                if grad_norm is not None and not math.isfinite(grad_norm):
                    raise self._diverged(step, f"non-finite gradient norm {grad_norm}")
                used_lr = {g.get("name", str(i)): g["lr"] for i, g in enumerate(self.optimizer.param_groups)}
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                if self.ds and grad_norm is None:
                    gn = self.wrapped.get_global_grad_norm()
                    grad_norm = None if gn is None else float(gn)
                    if grad_norm is not None and not math.isfinite(grad_norm):
                        raise self._diverged(step, f"non-finite gradient norm {grad_norm}")
                loss_mean = loss_sum / n_micro
                self.tokens_seen += int(tokens)
                result.losses[step] = loss_mean
                window["loss"].append(loss_mean)
                window["tokens"] += tokens
                record: dict[str, Any] = {}
                last = step == c.max_steps
                if step % c.log_every == 0 or last:
                    record = self._log_record(step, window, grad_norm, used_lr, t_start)
                if c.eval_every and (step % c.eval_every == 0 or last):
                    ev = self._evaluate()
                    result.evals[step] = ev
                    record.update(ev)
                    record["step"] = step
                if record and self.main:
                    with open(self.output_dir / METRICS_FILE, "a", encoding="utf-8") as f:
                        f.write(json.dumps(record) + "\n")
                    if acc.log_with:
                        acc.log({k: v for k, v in record.items() if k != "step"}, step=step)
                if c.save_every and step % c.save_every == 0:
                    ckpt.save_run(self, step)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss_mean:.4f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}")
                if self.on_step is not None:
                    self.on_step(step, record)
                if record:  # throughput windows exclude monitoring and checkpoint time
                    window["t0"] = time.perf_counter()
            else:
                result.stop_reason = "max_steps" if step > start else "already_done"
            if step > self.last_saved_step and step > 0:
                ckpt.save_run(self, step)
            if c.save_final and self.main and self.last_checkpoint is not None:
                result.final_model = ckpt.link_model_files(self.last_checkpoint, self.output_dir / "final")
            acc.wait_for_everyone()
            if c.save_final and result.final_model is None and self.last_checkpoint is not None:
                result.final_model = self.output_dir / "final"
        finally:
            if bar is not None:
                bar.close()
            for h in self.hooks:
                h.remove()
            if acc.log_with:
                acc.end_training()
        result.final_step, result.last_checkpoint = step, self.last_checkpoint
        result.model = self.unwrapped.model
        return result

    def _log_record(self, step: int, window: dict, grad_norm: float | None, lrs: dict[str, float],
                    t_start: float) -> dict[str, Any]:
        now = time.perf_counter()
        dt = max(now - window["t0"], 1e-9)
        rec: dict[str, Any] = {"step": step, "loss": sum(window["loss"]) / len(window["loss"]),
                               "grad_norm": grad_norm, "tokens_per_s": window["tokens"] / dt,
                               "tokens": self.tokens_seen, "elapsed_s": now - t_start}
        rec.update({f"lr/{k}": v for k, v in lrs.items()})  # the LR this update used
        for k, vs in sorted(window["metrics"].items()):
            rec[f"train/{k}"] = sum(vs) / len(vs)
        window.update(loss=[], tokens=0.0, t0=now, metrics={})
        return rec


def train(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """Run (or resume) training as configured; see `Trainer` for the keyword extras. Returns a `TrainResult`."""
    return Trainer(config, **kwargs).train()
