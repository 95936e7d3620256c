"""Training checkpoints: Hugging Face-style model folders plus a pickle-free `trainer_state/`.

Layout of ``output_dir/checkpoint-{step}/``::

    config.json, dsl_config.json, model*.safetensors   the model, exactly as DSLModel.save_pretrained / save_backbone
    tokenizer files                                    copied from the tokenizer folder when there is one
    trainer_state/
        state.json          step, world size, parameter-group names and sizes, tokens seen, format version
        train_config.json   the full TrainConfig
        environment.json    where it was written (`dsl_llada.runtime.environment`: versions, git commit, CPU/GPU, threads,
                            seeds, load average)
        optimizer.{json,safetensors}, scheduler.json   (rank 0; FSDP: gathered full state)
        rank-{r}.{json,safetensors}                    per process: RNG states (python, numpy, torch CPU/CUDA, the
                                                       objective's generator) and the data stream position
        deepspeed/          DeepSpeed runs only: the engine's own optimizer partitions (its format)

Nested state (optimizer/scheduler/RNG/data) is stored as a JSON skeleton + one safetensors file holding every
tensor, so nothing is ever unpickled. A checkpoint is written into ``.checkpoint-{step}.tmp`` by all ranks and
renamed into place by rank 0 after a barrier: a crash leaves either the previous checkpoint or the complete new one,
and only complete checkpoints (with ``trainer_state/state.json``) are ever resumed from.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..core.checkpoint import DEFAULT_MAX_SHARD_BYTES, INDEX_NAME, TOKENIZER_FILES, WEIGHTS_NAME, check_safetensors_header, \
    checkpoint_files, copy_tokenizer_files, save_tensors_file, write_safetensors
from ..core.backbones.base import Backbone
from ..runtime.environment import environment_record, finish_record
from ..errors import CheckpointError
from ..core.model import DSLModel
from ..artifacts.atomic import atomic_write_text

logger = logging.getLogger("dsl_llada.train")

__all__ = ["APPLIED_ON_RESUME", "BOOKKEEPING", "USED_AS_GIVEN", "apply_changed_settings", "check_checkpoint",
           "intact_checkpoints", "resume_changes",
           "FORMAT_VERSION", "TRAINER_STATE", "TOKENIZER_FILES", "RunParts", "RunProgress", "capture_rng",
           "checkpoint_dir", "commit_dir", "flatten_tree", "is_complete", "latest_checkpoint", "link_model_files",
           "list_checkpoints", "load_run", "load_tree", "restore_rng", "rotate_checkpoints", "save_run", "save_tree",
           "truncate_metrics", "unflatten_tree", "write_model_files"]

FORMAT_VERSION = 1
TRAINER_STATE = "trainer_state"
STATE_FILE = "state.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
MODEL_FILES_RE = re.compile(r"^(config\.json|dsl_config\.json|model.*\.safetensors(\.index\.json)?)$")


# -- pickle-free nested state ------------------------------------------------------------------------------------
def flatten_tree(obj: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split nested dicts/lists/tuples of tensors, numpy arrays and JSON scalars into (JSON skeleton, tensors)."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = x.detach().cpu().contiguous().clone()
            return {"__tensor__": key}
        if isinstance(x, np.ndarray):
            return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"__items__": [[enc(k), enc(v)] for k, v in x.items()]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"cannot store a {type(x).__name__} in a training checkpoint (only tensors, arrays, "
                        f"dicts, lists, tuples and JSON scalars)")

    return enc(obj), tensors


def unflatten_tree(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if isinstance(x, dict):
            if "__tensor__" in x:
                return tensors[x["__tensor__"]]
            if "__ndarray__" in x:
                return np.asarray(x["__ndarray__"], dtype=np.dtype(x["dtype"]))
            if "__tuple__" in x:
                return tuple(dec(v) for v in x["__tuple__"])
            if "__items__" in x:
                return {dec(k): dec(v) for k, v in x["__items__"]}
            return {k: dec(v) for k, v in x.items()}
        return x

    return dec(skeleton)


def save_tree(obj: Any, folder: str | Path, name: str) -> None:
    """`name.json` (skeleton) + `name.safetensors` (tensors, when any) in `folder`."""
    folder = Path(folder)
    skeleton, tensors = flatten_tree(obj)
    if tensors:
        save_tensors_file(tensors, folder / f"{name}.safetensors")
    atomic_write_text(folder / f"{name}.json", json.dumps(skeleton))


def load_tree(folder: str | Path, name: str) -> Any:
    folder = Path(folder)
    skeleton = json.loads((folder / f"{name}.json").read_text())
    st = folder / f"{name}.safetensors"
    tensors = load_file(str(st)) if st.exists() else {}
    return unflatten_tree(skeleton, tensors)


# -- RNG ---------------------------------------------------------------------------------------------------------
def capture_rng(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Python, numpy, torch (CPU and every CUDA device) global RNG states + the named generators' states."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    state["generators"] = {k: g.get_state() for k, g in (generators or {}).items()}
    return state


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    saved = state.get("generators", {})
    for k, g in (generators or {}).items():
        if k not in saved:
            raise KeyError(f"checkpoint has no state for the {k!r} generator (saved: {sorted(saved)})")
        g.set_state(saved[k])


# -- discovery and rotation ----------------------------------------------------------------------------------------
def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


def is_complete(folder: str | Path) -> bool:
    return (Path(folder) / TRAINER_STATE / STATE_FILE).is_file()


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in `output_dir`, oldest first."""
    out: list[tuple[int, Path]] = []
    root = Path(output_dir)
    if not root.is_dir():
        return out
    for p in root.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_dir() and is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def _check_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON ({e}); the checkpoint is damaged") from None


def check_checkpoint(folder: str | Path) -> dict:
    """Read every small file of a training checkpoint and check every safetensors header (sizes included) without
    loading tensors; raise CheckpointError naming the first damaged file. Returns the parsed state.json."""
    folder = Path(folder)
    sd = folder / TRAINER_STATE
    state = _check_json(sd / STATE_FILE, "trainer state")
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or not isinstance(
            state.get("world_size"), int) or not isinstance(state.get("param_groups"), list):
        raise CheckpointError(f"trainer state {str(sd / STATE_FILE)!r} lacks an integer 'step' / 'world_size' or "
                              f"the 'param_groups' list; the checkpoint is damaged")
    for name in ("train_config.json", "scheduler.json"):
        if not isinstance(_check_json(sd / name, "trainer state"), dict):
            raise CheckpointError(f"trainer state {str(sd / name)!r} must hold a JSON object; the checkpoint is damaged")
    if not state.get("deepspeed"):
        _check_json(sd / "optimizer.json", "optimizer state")
    for st in sorted(sd.glob("*.safetensors")):
        check_safetensors_header(st, advice=_DAMAGED)
    for r in range(state["world_size"]):
        _check_json(sd / f"rank-{r}.json", "per-process state")
        _check_rank_state(sd, r)
    _check_json(folder / "config.json", "model config")
    for path in sorted(set(checkpoint_files(folder).values())):
        check_safetensors_header(path, advice=_DAMAGED)
    return state


_DAMAGED = "the training checkpoint is damaged; resume from an earlier one"


def _check_rank_state(sd: Path, rank: int) -> None:
    """The per-process state must restore: its RNG states are tried on throwaway generators (the global ones are
    left alone) and its data position must be a JSON object."""
    path = sd / f"rank-{rank}.json"
    try:
        tree = load_tree(sd, f"rank-{rank}")
        rng = tree["rng"]
        random.Random().setstate(rng["python"])
        np.random.RandomState().set_state(rng["numpy"])
        torch.Generator().set_state(rng["torch"])
        if not isinstance(rng.get("generators", {}), dict) or not isinstance(tree["data"], dict):
            raise TypeError("'generators' and 'data' must be JSON objects")
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError, OSError, SafetensorError) as e:
        raise CheckpointError(f"per-process state {str(path)!r} does not hold restorable RNG states and data position "
                              f"({type(e).__name__}: {e}); {_DAMAGED}") from None


def intact_checkpoints(output_dir: str | Path) -> tuple[list[tuple[int, Path]], list[tuple[Path, str]]]:
    """(intact complete checkpoints oldest first, [(damaged checkpoint, why)])."""
    good, bad = [], []
    for step, p in list_checkpoints(output_dir):
        try:
            check_checkpoint(p)
        except (CheckpointError, OSError) as e:
            bad.append((p, str(e)))
        else:
            good.append((step, p))
    return good, bad


# -- what a resumed run may change -----------------------------------------------------------------------------------
APPLIED_ON_RESUME = ("lr", "converter_lr_mult", "warmup_steps", "weight_decay", "betas", "eps")
"""Settings restored from the checkpoint's optimizer/scheduler state that a resumed run re-applies when they
changed (`apply_changed_settings`), from the first update after the checkpoint."""
USED_AS_GIVEN = ("max_grad_norm", "mixed_precision", "gradient_checkpointing", "ddp_find_unused_parameters")
"""Settings read afresh every update or at setup (never restored), so a change takes effect by itself."""
BOOKKEEPING = ("resume", "max_steps", "output_dir", "save_every", "keep_last", "save_final", "log_every", "eval_every",
               "eval_batches", "eval_snrs", "eval_bayes_floor", "logging", "project_name", "progress", "world_size")
"""How long, where and how often to save, log and evaluate: free to change."""


def resume_changes(folder: Path, config: Any) -> dict[str, tuple[Any, Any]]:
    """The settings a run resumed from `folder` changes, {name: (old, new)}; ConfigError (before any loading)
    listing every changed setting that cannot change mid-run (model, objective, data, seed, ...)."""
    from ..config import ConfigError

    old = _check_json(folder / TRAINER_STATE / "train_config.json", "trainer state")
    new = json.loads(config.to_json())
    # A setting the checkpoint's version did not record yet cannot be compared (it had its default then).
    changed = {k: (old[k], v) for k, v in new.items() if k in old and old[k] != v and k not in BOOKKEEPING}
    fixed = sorted(k for k in changed if k not in APPLIED_ON_RESUME + USED_AS_GIVEN)
    if fixed:
        shown = "; ".join(f"{k} ({json.dumps(changed[k][0])} -> {json.dumps(changed[k][1])})" for k in fixed)
        raise ConfigError(f"cannot resume {str(folder)!r} with changed settings that cannot change mid-run: {shown}; "
                          f"set them back, or start a new run (resume=null, a new output_dir)")
    return changed


def apply_changed_settings(backend: Any, config: Any, fresh: list[dict], changed: dict[str, tuple[Any, Any]]) -> None:
    """Re-apply the `APPLIED_ON_RESUME` settings the checkpoint's optimizer/scheduler state just overwrote:
    `fresh` holds each parameter group's base lr, weight decay, betas and eps as this run's config builds them."""
    if not any(k in APPLIED_ON_RESUME for k in changed):
        return  # nothing to do: the restored state is bit-identical to the uninterrupted run's
    opt, sched = backend.optimizer, backend.scheduler
    sched = getattr(sched, "scheduler", sched)  # accelerate's wrapper around the torch LambdaLR
    if len(fresh) != len(opt.param_groups):
        raise RuntimeError("optimizer parameter groups changed while resuming")
    from .optim import lr_lambda

    sched.lr_lambdas = [lr_lambda(config.warmup_steps) for _ in opt.param_groups]
    sched.base_lrs = [g["initial_lr"] for g in fresh]
    for group, f, base, lam in zip(opt.param_groups, fresh, sched.base_lrs, sched.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * lam(sched.last_epoch)
        for k in ("weight_decay", "betas", "eps"):
            group[k] = f[k]
    sched._last_lr = [g["lr"] for g in opt.param_groups]


def rotate_checkpoints(output_dir: str | Path, keep_last: int | None, protect: Path | None | list = None) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints (never those in `protect`: one path or a list).
    Returns the deleted folders."""
    if not keep_last:
        return []
    found = list_checkpoints(output_dir)
    kept = {Path(p).resolve() for p in ([] if protect is None else protect if isinstance(protect, list) else [protect])}
    doomed = [p for _, p in found[:-keep_last] if p.resolve() not in kept]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def commit_dir(tmp: Path, final: Path) -> None:
    """Rename a finished temp folder into place, replacing an existing `final` (rank 0 only)."""
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


# -- model files -----------------------------------------------------------------------------------------------------
def write_model_files(folder: str | Path, *, config_json: dict, state: dict[str, torch.Tensor],
                      dsl_config_json: str | None = None, tokenizer_dir: str | Path | None = None,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
    """The same files as DSLModel.save_pretrained / save_backbone, written into an existing (temp) folder."""
    folder = Path(folder)
    (folder / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True, default=str) + "\n")
    if dsl_config_json is not None:
        (folder / "dsl_config.json").write_text(dsl_config_json + "\n")
    write_safetensors(state, folder, max_shard_bytes=max_shard_bytes)
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, folder)


def link_model_files(src: str | Path, dst: str | Path) -> Path:
    """Atomically make `dst` a model-only copy of checkpoint `src` (hard links where the filesystem allows)."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for p in sorted(src.iterdir()):
            if not p.is_file() or not (MODEL_FILES_RE.match(p.name) or p.name in TOKENIZER_FILES):
                continue
            try:
                os.link(p, tmp / p.name)
            except OSError:
                shutil.copy2(p, tmp / p.name)
        if not ((tmp / WEIGHTS_NAME).exists() or (tmp / INDEX_NAME).exists()):
            raise FileNotFoundError(f"{src} holds no model weights to publish as {dst}")
        commit_dir(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


# -- a run's full state ------------------------------------------------------------------------------------------------
MODEL_PREFIX = "model."  # parameter names inside ObjectiveModule


@dataclass
class RunParts:
    """What writing and restoring a run's checkpoints needs; the trainer builds it once per run."""

    config: Any
    """The run's TrainConfig."""
    acc: Any
    """The accelerate Accelerator (barriers)."""
    backend: Any
    """The engine back-end (`dsl_llada.train.backends.Backend`): model weights and optimizer state."""
    output_dir: Path
    rank: int
    world: int
    model: DSLModel | Backbone
    """The model being trained, unwrapped (a DSLModel or a bare backbone; sharded parameters under FSDP2)."""
    is_dsl: bool
    """`model` is a DSLModel (saved with dsl_config.json and the converter) rather than a bare backbone."""
    dataset: Any
    """The data stream (`state_dict` / `load_state_dict` give its exact position)."""
    generator: torch.Generator
    """The objective's generator on this process."""
    group_info: list[dict]
    """Name, tensor and parameter counts of every optimizer parameter group (checked on resume)."""
    tokenizer_dir: Path | None = None
    """Folder whose tokenizer files are copied into every checkpoint."""
    tokenizer_to_save: Any = None
    """Otherwise a tokenizer object whose `save_pretrained` files go into every checkpoint."""
    protect: tuple[Path, ...] = ()
    """Checkpoints rotation never deletes (an explicit resume source)."""

    @property
    def main(self) -> bool:
        return self.rank == 0


@dataclass
class RunProgress:
    """The counters a checkpoint stores besides model, optimizer, scheduler, RNG and data position."""

    step: int
    tokens_seen: int = 0
    log_window: dict | None = None
    """This process's `LogWindow.state_dict()` (None in checkpoints written before it was saved)."""
    changed: dict | None = None
    """On resume: the settings this run changed, {name: (old, new)}, applied from the next update."""


def save_run(run: RunParts, progress: RunProgress) -> Path:
    """Write checkpoint-{step}: every process takes part (FSDP gathers to rank 0), rank 0 commits and rotates."""
    c, acc, step = run.config, run.acc, progress.step
    final = checkpoint_dir(run.output_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    state_dir = tmp / TRAINER_STATE
    if run.main:
        shutil.rmtree(tmp, ignore_errors=True)
        state_dir.mkdir(parents=True)
    acc.wait_for_everyone()
    try:
        _write_run(run, progress, tmp, state_dir)
    except BaseException as e:
        # A full disk (or any error) while writing: the temp folder goes, the previous checkpoints stay intact.
        if run.main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(final)) from None
        raise
    acc.wait_for_everyone()
    if run.main:
        commit_dir(tmp, final)
        rotate_checkpoints(run.output_dir, c.keep_last, protect=[final, *run.protect])
    acc.wait_for_everyone()
    return final


def _write_run(run: RunParts, progress: RunProgress, tmp: Path, state_dir: Path) -> None:
    c, step = run.config, progress.step
    weights = run.backend.model_weights(run.model, run.is_dsl, run.main)
    run.backend.save_optimizer(state_dir, run.main)
    if run.main:
        model = run.model
        backbone = model.backbone if isinstance(model, DSLModel) else model
        write_model_files(tmp, config_json=backbone.config_dict(), state=weights,
                          dsl_config_json=model.config.to_json() if isinstance(model, DSLModel) else None,
                          tokenizer_dir=run.tokenizer_dir)
        if run.tokenizer_to_save is not None:  # file-less tokenizers ('bytes', 'ids') and tokenizer objects
            run.tokenizer_to_save.save_pretrained(str(tmp))
        (state_dir / "scheduler.json").write_text(json.dumps(run.backend.scheduler.state_dict()))
        (state_dir / "train_config.json").write_text(c.to_json() + "\n")
        param = next(iter(run.model.parameters()), None)
        env = environment_record(device=param.device if param is not None else None,
                                 dtype=param.dtype if param is not None else None,
                                 seeds={"seed": getattr(c, "seed", None), "world_size": run.world})
        (state_dir / "environment.json").write_text(json.dumps(finish_record(env), indent=2) + "\n")
        name = run.backend.name
        (state_dir / STATE_FILE).write_text(json.dumps({
            "format_version": FORMAT_VERSION, "step": step, "world_size": run.world, "objective": c.objective,
            "param_groups": run.group_info, "tokens_seen": progress.tokens_seen, "backend": name,
            "sharded": name == "fsdp2", "deepspeed": name == "deepspeed"}, indent=2))
    save_tree({"rng": capture_rng({"objective": run.generator}), "data": run.dataset.state_dict(),
               "log_window": progress.log_window}, state_dir, f"rank-{run.rank}")


def load_run(run: RunParts, folder: Path) -> RunProgress:
    """Restore optimizer, scheduler, RNG and data position from `folder` (the model weights were loaded from it
    already). Returns the checkpoint's step and counters."""
    from ..config import ConfigError

    state_dir = folder / TRAINER_STATE
    state = json.loads((state_dir / STATE_FILE).read_text())
    if state.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{folder}: trainer state format {state.get('format_version')!r} is not supported")
    if state["world_size"] != run.world:
        raise ConfigError(f"{folder} was written by {state['world_size']} process(es) but this run has {run.world}; "
                          f"exact resume needs the same number of processes (data shards and per-rank RNG)")
    saved = [(g["name"], g["n_tensors"], g["n_params"]) for g in state["param_groups"]]
    now = [(g["name"], g["n_tensors"], g["n_params"]) for g in run.group_info]
    if saved != now:
        raise ConfigError(f"{folder}: optimizer parameter groups differ from this run (saved {saved}, now {now}); keep "
                          f"the freeze_* options and converter_lr_mode of the original run")
    changed = resume_changes(folder, run.config)
    opt = run.backend.optimizer
    fresh = [{k: g.get(k) for k in ("initial_lr", "weight_decay", "betas", "eps")} for g in opt.param_groups]
    run.backend.load_optimizer(state_dir, run.main)
    run.backend.scheduler.load_state_dict(json.loads((state_dir / "scheduler.json").read_text()))
    apply_changed_settings(run.backend, run.config, fresh, changed)
    mine = load_tree(state_dir, f"rank-{run.rank}")
    restore_rng(mine["rng"], {"objective": run.generator})
    run.dataset.load_state_dict(mine["data"])
    return RunProgress(step=int(state["step"]), tokens_seen=int(state.get("tokens_seen", 0)),
                       log_window=mine.get("log_window"), changed=changed)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines after `step` (a resumed run re-runs the steps after its checkpoint)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue
    atomic_write_text(path, "".join(x + "\n" for x in keep))
