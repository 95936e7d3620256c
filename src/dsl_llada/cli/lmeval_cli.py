"""`dsl-llada lm-eval --model-dir DIR --tasks …`: run lm-evaluation-harness tasks on a DSL or MDM checkpoint.
Argument parsing only: the run is the library's `lmeval_command.run_lm_eval`."""

from __future__ import annotations

import argparse


def add_lmeval_parser(sub) -> argparse.ArgumentParser:
    from .flags import add_model_source_args
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
    """Parse the flags into LmEvalSettings and run the library's `run_lm_eval`."""
    from .flags import model_source_from_args
    from ..eval.lmeval_command import LmEvalSettings, run_lm_eval

    fields = {}
    for item in a.sampler_arg:
        if "=" not in item:
            raise ValueError(f"--sampler-arg {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        fields[k.strip()] = v.strip()
    tasks = tuple(t.strip() for t in a.tasks.split(",") if t.strip())
    if not tasks:
        raise ValueError(f"--tasks {a.tasks!r} names no task; give comma-separated lm-eval task names")
    return run_lm_eval(LmEvalSettings(
        source=model_source_from_args(a), tasks=tasks, include_path=a.include_path, limit=a.limit,
        num_fewshot=a.num_fewshot, sampler=a.sampler, sampler_fields=fields, batch_size=a.batch_size,
        mc_samples=a.mc_samples, mc_batch_size=a.mc_batch_size, seed=a.seed, chat_template=not a.no_chat_template,
        output=a.output))
