"""Checks that run before the first item and before anything is written.

Every check reads only small files (model ``config.json``, tokenizer, safetensors headers, the data) — no
weights — so a bad run is refused in seconds with one line naming the value and what would be valid:

* the device exists (``device: cuda`` on a machine without CUDA);
* a multi-process launch really is one (``accelerate launch --num_processes N`` without ``--multi_gpu`` runs a
  single process; refused with the command to use);
* every model folder exists and has a config; a method that needs a DSL checkpoint gets one;
* the tokenizer holds the model's mask and EOS ids; the tokenizer's ids fit the model's vocabulary;
* token ids read from the data (``use_token_ids``) and every ``id_range`` fit the model's vocabulary;
* the longest encoded prompt + generation length fits the model's context;
* every named baseline is a method of the task; every optional scorer is importable (MAUVE, BERTScore).

The run folder's state is checked by ``runner.check_run_dir`` in the same pre-write phase.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def check_device(device: str | None) -> None:
    """``cuda``/``cuda:N`` needs a visible CUDA device; anything else must be a device torch knows."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device={device!r} is not a device name; use 'cpu' or 'cuda' (or leave it unset)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but this machine has no usable CUDA device "
                              f"(torch.cuda.is_available() is False); use device=cpu or leave device unset")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type not in ("cpu", "mps", "xpu"):
        raise ConfigError(f"device={device!r} is not supported here; use 'cpu' or 'cuda'")


def requested_processes(parent_cmdline: list[str] | None = None) -> int | None:
    """The ``--num_processes`` of the ``accelerate launch`` that started this process, if any (Linux: read from
    the parent's command line; None when not launched by accelerate or not readable)."""
    if parent_cmdline is None:
        if "ACCELERATE_MIXED_PRECISION" not in os.environ and "ACCELERATE_USE_CPU" not in os.environ:
            return None
        try:
            raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        except OSError:
            return None
        parent_cmdline = [x.decode("utf-8", "replace") for x in raw.split(b"\0") if x]
    args = parent_cmdline
    if not any(Path(a).name == "accelerate" or a.endswith("accelerate/commands/launch.py") for a in args[:3]) \
            or "launch" not in args:
        return None
    for i, a in enumerate(args):
        for flag in ("--num_processes", "--num-processes"):
            if a == flag and i + 1 < len(args):
                return _int(args[i + 1])
            if a.startswith(flag + "="):
                return _int(a.split("=", 1)[1])
    return None


def _int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def check_world(world_size: int, requested: int | None) -> None:
    """Refuse a launch that asked for several processes but runs as one (no distributed mode set up)."""
    if requested is not None and requested > 1 and world_size == 1:
        raise ConfigError(
            f"accelerate launch asked for --num_processes {requested} but the evaluation runs as 1 process (the "
            f"distributed mode was not set up, so each item would run once on rank 0 only); launch with "
            f"`accelerate launch --multi_gpu --num_processes {requested} -m dsl_llada eval run ...` "
            f"(on CPU: `ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes {requested} ...`)")


def model_facts(path: str | Path) -> dict[str, Any]:
    """Vocabulary size, context length and special ids from a model folder's ``config.json`` (None where the
    config does not say). Reads no weights."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        return {"vocab": None, "context": None, "mask": None, "eos": None}
    try:
        d = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{cfg_path}: unreadable model config ({e})") from None
    vocab = d.get("embedding_size") or d.get("vocab_size")
    context = d.get("max_sequence_length") or d.get("max_position_embeddings")

    def first(v: Any) -> int | None:
        if isinstance(v, list):
            v = v[0] if v else None
        return v if isinstance(v, int) else None

    return {"vocab": vocab if isinstance(vocab, int) else None, "context": context if isinstance(context, int) else None,
            "mask": first(d.get("mask_token_id")), "eos": first(d.get("eos_token_id"))}


def check_models(cfg, tokenizers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Folder, DSL-need and tokenizer/special-id checks per model; returns each model's facts."""
    from ..core.model import check_released_opt_in
    from .methods import needs_dsl
    from .tasks.task import is_dsl_folder

    used = {m.model for t in cfg.tasks for m in cfg.task_methods(t)}
    facts: dict[str, dict[str, Any]] = {}
    for spec in cfg.models:
        if spec.name not in used:
            continue
        if not Path(spec.path).is_dir():
            raise ConfigError(f"model {spec.name!r}: model folder {spec.path!r} does not exist")
        if spec.kind == "causal-lm":
            continue
        if not (Path(spec.path) / "config.json").is_file():
            raise ConfigError(f"model {spec.name!r}: {spec.path} has no config.json (not a model folder)")
        if is_dsl_folder(spec.path):
            check_released_opt_in(spec.path, spec.assume_released)
        f = facts[spec.name] = model_facts(spec.path)
        tok = tokenizers.get(spec.name)
        n_tok = len(tok) if tok is not None else None
        methods = [m for m in cfg.methods if m.model == spec.name and m.preset != "ar"]
        for m in methods:
            if needs_dsl(m) and not is_dsl_folder(spec.path):
                raise ConfigError(f"method {m.name!r} ({m.preset}) needs a DSL checkpoint (noise embedding + "
                                  f"converter), but model {spec.name!r} ({spec.path}) is a bare backbone")
        if n_tok is not None and methods:
            for name in ("mask", "eos"):
                v = f[name]
                if v is not None and v >= n_tok:
                    raise ConfigError(f"model {spec.name!r}: its {name} id {v} is not in the tokenizer "
                                      f"({spec.tokenizer or spec.path}, {n_tok} tokens); method {methods[0].name!r} "
                                      f"needs it — use the model's own tokenizer")
        if n_tok is not None and f["vocab"] is not None and n_tok > f["vocab"]:
            raise ConfigError(f"model {spec.name!r}: its tokenizer ({spec.tokenizer or spec.path}) has {n_tok} tokens "
                              f"but the model's vocabulary has {f['vocab']}; ids >= {f['vocab']} would fail — use the "
                              f"model's own tokenizer")
    return facts


def check_plan(cfg, plan, facts: dict[str, dict[str, Any]]) -> None:
    """Data ids and id ranges within the vocabulary; prompt + generation within the context."""
    longest: dict[tuple[str, str, str], tuple[int, str, int]] = {}
    for b in plan.batches:
        f = facts.get(b.model)
        if f is None:
            continue
        V = f["vocab"]
        if b.method is None:  # one-forward tasks: ids from the data and replacement-id ranges
            if V is None:
                continue
            idr = (b.params or {}).get("id_range")
            if idr is not None and not (0 <= int(idr[0]) < int(idr[1]) <= V):
                raise ConfigError(f"task {b.task!r} ({b.dataset}): id_range {list(idr)} does not fit model "
                                  f"{b.model!r}, whose vocabulary has {V} ids; use a range within [0, {V})")
            for s in b.samples:
                toks = s.info.get("tokens")
                if toks:
                    top = max(int(x) for x in toks)
                    if top >= V or min(int(x) for x in toks) < 0:
                        raise ConfigError(f"task {b.task!r} ({b.dataset}, sample {s.id!r}): token id {top} in the "
                                          f"data is outside model {b.model!r}'s vocabulary of {V} ids; these ids were "
                                          f"made for another tokenizer — drop use_token_ids (re-tokenise the text) or "
                                          f"use the model they belong to")
            continue
        if b.method.preset == "ar":
            continue
        for s in b.samples:
            n = len(plan.prompt_ids[(b.task, b.dataset, b.model, s.id)])
            k = (b.task, b.dataset, b.model)
            if k not in longest or n + b.gen_length > longest[k][0]:
                longest[k] = (n + b.gen_length, s.id, n)
    for (task, ds, model), (total, sid, n) in longest.items():
        ctx = facts[model]["context"]
        if ctx is not None and total > ctx:
            raise ConfigError(f"task {task!r} ({ds}): prompt {sid!r} has {n} tokens as encoded + gen_length "
                              f"{total - n} = {total}, more than model {model!r}'s context of {ctx}; shorten the "
                              f"data or lower the dataset's gen_length to at most {ctx - n}")


def check_task_options(cfg) -> None:
    """Named baselines exist; optional scorers can be imported."""
    names = {m.name for m in cfg.methods}
    for t in cfg.tasks:
        o = t.options
        if t.name == "summarization":
            base = o.get("baseline")
            if base is not None and base not in {m.name for m in cfg.task_methods(t)}:
                raise ConfigError(f"summarization option baseline={base!r} is not one of this task's methods "
                                  f"{sorted(m.name for m in cfg.task_methods(t))}")
            if o.get("bertscore") and importlib.util.find_spec("bert_score") is None:
                raise ConfigError("summarization option bertscore needs the package 'bert-score' "
                                  "(pip install bert-score), which is not installed")
        if t.name == "generation" and o.get("mauve") and importlib.util.find_spec("mauve") is None:
            raise ConfigError("generation option mauve: true needs the package 'mauve-text' (pip install mauve-text), "
                              "which is not installed; set mauve: false to run without it")
        for n in t.methods or ():
            if n not in names:
                raise ConfigError(f"task {t.name!r}: method {n!r} is not one of {sorted(names)}")
