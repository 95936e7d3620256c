"""`dsl-llada lm-eval --model-dir DIR --tasks …`: run lm-evaluation-harness tasks on a DSL or MDM checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_lmeval_parser(sub) -> argparse.ArgumentParser:
    from ..model_source import add_model_source_args
    from ..sampling.registry import SAMPLERS, sampler_help

    p = sub.add_parser("lm-eval", help="run lm-evaluation-harness tasks through this project's samplers",
                       description="Runs lm-eval's simple_evaluate with the 'dsl-llada' model. Multi-GPU: "
                                   "accelerate launch -m dsl_llada lm-eval …")
    add_model_source_args(p, aliases={"path": "--model-dir"})
    p.add_argument("--tasks", required=True, help="comma-separated task names")
    p.add_argument("--include-path", default=None, help="folder of local task YAML files")
    p.add_argument("--limit", type=float, default=None, help="examples per task (int) or fraction")
    p.add_argument("--num-fewshot", type=int, default=None)
    p.add_argument("--sampler", default=SAMPLERS[0], choices=SAMPLERS,
                   help=f"sampler for generate_until: {sampler_help()} (default {SAMPLERS[0]})")
    p.add_argument("--sampler-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a sampler config field, e.g. nfe=64 gen_length=256 block_length=32 (repeatable)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per sampler call (default 8)")
    p.add_argument("--mc-samples", type=int, default=128, help="Monte Carlo mask patterns per likelihood (default 128)")
    p.add_argument("--mc-batch-size", type=int, default=32, help="rows per likelihood forward (default 32)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-chat-template", action="store_true", help="feed prompts raw")
    p.add_argument("--output", default=None, help="write lm-eval's results JSON here (atomically)")
    p.set_defaults(func=cmd_lmeval)
    return p


def cmd_lmeval(a: argparse.Namespace) -> int:
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import make_table
    except ImportError:
        raise ValueError("lm-eval is not installed: pip install 'dsl-llada[lmeval]'") from None
    from ..loading import resolve_source
    from ..model_source import model_source_from_args
    from ..utils import atomic_write_text
    from .lmeval import DSLLadaLM

    src = resolve_source(model_source_from_args(a))
    if a.include_path and not Path(a.include_path).is_dir():
        raise ValueError(f"--include-path {a.include_path!r} is not a folder")
    fields = {}
    for item in a.sampler_arg:
        if "=" not in item:
            raise ValueError(f"--sampler-arg {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        fields[k.strip()] = v.strip()
    lm = DSLLadaLM(str(src.path), tokenizer=src.tokenizer, device=str(src.device), dtype=src.dtype,
                   quantize=src.quantize, assume_released=src.assume_released, sampler=a.sampler,
                   batch_size=a.batch_size, mc_samples=a.mc_samples, mc_batch_size=a.mc_batch_size, seed=a.seed,
                   chat_template=not a.no_chat_template, **fields)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    tm = None
    if a.include_path:  # indexing lm-eval's thousands of built-in task files is slow: skip it when not needed
        tm = TaskManager(include_path=a.include_path, include_defaults=False)
        if any(t not in tm.all_tasks for t in tasks):
            tm = None
    tm = tm or TaskManager(include_path=a.include_path)
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {unknown}; give local YAML tasks with --include-path")
    limit = int(a.limit) if a.limit is not None and a.limit >= 1 else a.limit
    results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, limit=limit,
                                      num_fewshot=a.num_fewshot, random_seed=a.seed, numpy_random_seed=a.seed,
                                      torch_random_seed=a.seed, fewshot_random_seed=a.seed)
    if results is None:  # non-zero ranks under accelerate
        return 0
    print(make_table(results))
    if a.output:
        atomic_write_text(a.output, json.dumps({k: results[k] for k in ("results", "configs", "versions", "n-samples")
                                                if k in results}, indent=2, default=str))
    return 0
