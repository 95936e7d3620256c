"""Training checkpoints: Hugging Face-style model folders plus a pickle-free `trainer_state/`.

Layout of ``output_dir/checkpoint-{step}/``::

    config.json, dsl_config.json, model*.safetensors   the model, exactly as DSLModel.save_pretrained / save_backbone
    tokenizer files                                    copied from the tokenizer folder when there is one
    trainer_state/
        state.json          step, world size, parameter-group names and sizes, tokens seen, format version
        train_config.json   the full TrainConfig
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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..checkpoint import DEFAULT_MAX_SHARD_BYTES, INDEX_NAME, TOKENIZER_FILES, WEIGHTS_NAME, copy_tokenizer_files, \
    write_safetensors
from ..utils import atomic_write_text

logger = logging.getLogger("dsl_llada.train")

__all__ = ["FORMAT_VERSION", "TRAINER_STATE", "TOKENIZER_FILES", "capture_rng", "checkpoint_dir", "commit_dir",
           "flatten_tree", "is_complete", "latest_checkpoint", "link_model_files", "list_checkpoints", "load_run",
           "load_tree", "restore_rng", "rotate_checkpoints", "save_run", "save_tree", "truncate_metrics", "unflatten_tree",
           "write_model_files"]

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
        save_file(tensors, str(folder / f"{name}.safetensors"), metadata={"format": "pt"})
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
    out = []
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


def rotate_checkpoints(output_dir: str | Path, keep_last: int | None, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints (never `protect`). Returns the deleted folders."""
    if not keep_last:
        return []
    found = list_checkpoints(output_dir)
    doomed = [p for _, p in found[:-keep_last] if protect is None or p.resolve() != protect.resolve()]
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
# `run` is the Trainer (dsl_llada.train.trainer): it provides config, acc (Accelerator), output_dir, rank, world, main,
# wrapped (prepared module), unwrapped (ObjectiveModule), optimizer, scheduler, loader, generator, is_dsl, sharded, ds,
# group_info, tokenizer_dir, tokens_seen, last_checkpoint, last_saved_step.
MODEL_PREFIX = "model."  # parameter names inside ObjectiveModule


def save_run(run: Any, step: int) -> Path:
    """Write checkpoint-{step}: every process takes part (FSDP gathers to rank 0), rank 0 commits and rotates."""
    c, acc = run.config, run.acc
    final = checkpoint_dir(run.output_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    state_dir = tmp / TRAINER_STATE
    if run.main:
        shutil.rmtree(tmp, ignore_errors=True)
        state_dir.mkdir(parents=True)
    acc.wait_for_everyone()
    model = run.unwrapped.model
    optim_state = None
    if run.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
            get_optimizer_state_dict  # noqa: PLC0415

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(run.wrapped, options=opts)
        optim_state = get_optimizer_state_dict(run.wrapped, run.optimizer, options=opts)
        weights = {k.removeprefix(MODEL_PREFIX): v for k, v in full.items()}
        if run.is_dsl:
            weights = {k.removeprefix("backbone."): v for k, v in weights.items()}
    else:
        weights = (model.full_state_dict() if run.is_dsl else model.state_dict()) if run.main else {}
        if run.main and not run.ds:
            optim_state = run.optimizer.state_dict()
    if run.ds:
        run.wrapped.save_checkpoint(str(state_dir / "deepspeed"), tag="state", save_latest=False)
    if run.main:
        backbone = model.backbone if run.is_dsl else model
        write_model_files(tmp, config_json=backbone.config_dict(), state=weights,
                          dsl_config_json=model.config.to_json() if run.is_dsl else None,
                          tokenizer_dir=run.tokenizer_dir)
        if run.tokenizer_to_save is not None:  # file-less tokenizers ('bytes', 'ids') and tokenizer objects
            run.tokenizer_to_save.save_pretrained(str(tmp))
        if optim_state is not None:
            save_tree(optim_state, state_dir, "optimizer")
        (state_dir / "scheduler.json").write_text(json.dumps(run.scheduler.state_dict()))
        (state_dir / "train_config.json").write_text(c.to_json() + "\n")
        (state_dir / STATE_FILE).write_text(json.dumps({
            "format_version": FORMAT_VERSION, "step": step, "world_size": run.world, "objective": c.objective,
            "param_groups": run.group_info, "tokens_seen": run.tokens_seen, "sharded": run.sharded,
            "deepspeed": run.ds}, indent=2))
    save_tree({"rng": capture_rng({"objective": run.generator}), "data": run.loader.dataset.state_dict()},
              state_dir, f"rank-{run.rank}")
    acc.wait_for_everyone()
    if run.main:
        commit_dir(tmp, final)
        rotate_checkpoints(run.output_dir, c.keep_last, protect=final)
    acc.wait_for_everyone()
    run.last_checkpoint, run.last_saved_step = final, step
    return final


def load_run(run: Any, folder: Path) -> int:
    """Restore optimizer, scheduler, RNG, data position and counters from `folder` (the model weights were loaded
    from it already). Returns the checkpoint's step."""
    from ..config import ConfigError  # noqa: PLC0415

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
    old = json.loads((state_dir / "train_config.json").read_text())
    diff = sorted(k for k, v in run.config.to_dict().items() if old.get(k) != v and k not in ("resume", "max_steps"))
    if diff and run.main:
        logger.warning("resuming %s with changed settings: %s", folder, diff)
    if run.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # noqa: PLC0415

        osd = load_tree(state_dir, "optimizer") if run.main else {}
        set_optimizer_state_dict(run.wrapped, run.optimizer, osd,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    elif run.ds:
        run.wrapped.load_checkpoint(str(state_dir / "deepspeed"), tag="state", load_optimizer_states=True,
                                    load_lr_scheduler_states=False)
    else:
        run.optimizer.load_state_dict(load_tree(state_dir, "optimizer"))
    run.scheduler.load_state_dict(json.loads((state_dir / "scheduler.json").read_text()))
    mine = load_tree(state_dir, f"rank-{run.rank}")
    restore_rng(mine["rng"], {"objective": run.generator})
    run.loader.dataset.load_state_dict(mine["data"])
    run.tokens_seen = int(state.get("tokens_seen", 0))
    run.last_checkpoint, run.last_saved_step = folder, int(state["step"])
    return int(state["step"])


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
