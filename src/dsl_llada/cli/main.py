"""`dsl-llada` command line: thin wrappers over library functions (no algorithmic code here)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from ..runtime.allocator import keep_large_buffers
from ..runtime.openmp import set_wait_defaults

# OpenMP reads how its threads wait once, when torch loads it, so it is set here, before any torch import: a bounded
# spin, then sleep (`openmp.py`). Large buffers are kept between sampler calls instead of page-faulting in afresh
# (`allocator.py`). An explicit setting in the environment wins over either.
set_wait_defaults(os.environ)
keep_large_buffers(os.environ)

from .. import __version__  # noqa: E402
from .errors import run_cli_command  # noqa: E402

if TYPE_CHECKING:
    from ..config import DSLConfig
    from ..sampling.dispatch import SamplerConfig


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    """`--sampler` and one flag per field of the samplers' configs, all from the registry."""
    from .flags import add_config_args
    from ..sampling.registry import REGISTRY, SAMPLERS, sampler_help

    classes: dict[type, list[str]] = {}
    for spec in REGISTRY.values():
        classes.setdefault(spec.config_class, []).append(spec.name)
    fixed = sorted({k for spec in REGISTRY.values() for k in spec.fixed})
    g = p.add_argument_group("sampler", "--sampler picks the config: " + "; ".join(
        f"{' / '.join(names)} take{'s' if len(names) == 1 else ''} {cls.__name__}'s fields" for cls, names in classes.items())
        + "; a flag of another config is an error")
    g.add_argument("--sampler", default=SAMPLERS[0], choices=SAMPLERS, help=f"{sampler_help()} (default: {SAMPLERS[0]})")
    add_config_args(g, *((cls, "/".join(names)) for cls, names in classes.items()), exclude=fixed,
                    negative_aliases={"truncate_at_eos": "--no-truncate"})


def _add_convert_args(p: argparse.ArgumentParser) -> None:
    """`convert`'s model flags, one per field of ConverterConfig and DSLConfig (defaults are the dataclasses')."""
    from .flags import add_config_args
    from ..config import ConverterConfig, DSLConfig

    g = p.add_argument_group("DSL model", "the converter and noise embedding of the new checkpoint (dsl_config.json)")
    add_config_args(g, (ConverterConfig, "converter"), negative_aliases={"trainable_noise_embed": "--frozen-noise-embed"},
                    aliases={"noise_seed": "--seed"})
    add_config_args(g, (DSLConfig, "model"), exclude=("converter", "backbone_type"))


def _sampler_config(a: argparse.Namespace) -> SamplerConfig:
    """The config of `--sampler` and its flags, through the registry's parser (errors name the flag)."""
    from .flags import flag_name, given_config_fields
    from ..sampling.registry import REGISTRY, SamplerSettingError, get_spec, sampler_config

    spec = get_spec(a.sampler)
    given = given_config_fields(spec.config_class, a, others={s.config_class for s in REGISTRY.values()})
    try:
        return sampler_config(a.sampler, given)
    except SamplerSettingError as e:
        raise SamplerSettingError(f"{flag_name(e.field)}: {e}" if e.field else str(e), e.field) from None


def cmd_generate(a: argparse.Namespace) -> int:
    """Parse the flags into GenerateSettings and run the library's `run_generate`."""
    from ..generate.generate_command import GenerateSettings, run_generate
    from .flags import model_source_from_args

    settings = GenerateSettings(
        source=model_source_from_args(a), config=_sampler_config(a), prompts=tuple(a.prompt or ()),
        prompts_file=a.prompts_file, prompt_field=a.prompt_field, seed=a.seed, batch_size=a.batch_size,
        batching=a.batching, chat_template=not a.no_chat_template, allow_special_tokens=a.allow_special_tokens, output=a.output,
        resume=a.resume, overwrite=a.overwrite, max_error_rate=a.max_error_rate, progress=not a.quiet)
    return run_generate(settings)


def _convert_config(a: argparse.Namespace) -> DSLConfig:
    """The DSL config of `convert`: ConverterConfig's and DSLConfig's flags (generated from the dataclasses)."""
    from .flags import config_from_args, given_fields
    from ..config import ConverterConfig, DSLConfig

    return DSLConfig(converter=config_from_args(ConverterConfig, a), **given_fields(DSLConfig, a))


def cmd_convert(a: argparse.Namespace) -> int:
    """Parse the flags into ConvertSettings and run the library's `run_convert`."""
    from ..core.convert_command import ConvertSettings, run_convert

    return run_convert(ConvertSettings(backbone=a.backbone, output=a.output, config=_convert_config(a), dtype=a.dtype,
                                       overwrite=a.overwrite, allow_download=a.allow_download, dry_run=a.dry_run))


def cmd_demo(a: argparse.Namespace) -> int:
    """Parse the flags into DemoSettings and run the library's `run_demo`."""
    from ..toy.demo_command import DemoSettings, run_demo

    return run_demo(DemoSettings(out=a.out, quick=a.quick, controls=a.controls, from_scratch=a.from_scratch,
                                 seed=a.seed, dtype=a.dtype, seeds=a.seeds, sweep=a.sweep,
                                 cache_frontier=a.cache_frontier, sweep_prompts=a.sweep_prompts,
                                 progress=not a.quiet))


def _cmd_train(a: argparse.Namespace) -> int:
    """`dsl-llada train`: the toy world registered as the source of `data.toy_world` / `eval_bayes_floor`, then the
    training command."""
    from ..toy.training import register
    from .train_cli import cmd_train

    register()
    return cmd_train(a)


COMPUTING = ("generate", "convert", "demo", "train", "eval run", "serve", "ray-serve", "ui", "lm-eval")
"""Commands that run a model: each takes `--threads N` (set by `main` before the command runs)."""


def _threads(text: str) -> int:
    from ..runtime.environment import MAX_THREADS

    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"--threads must be an integer from 1 to {MAX_THREADS}, got {text!r}")
    return n


def add_threads_args(parser: argparse.ArgumentParser, names: tuple[str, ...] = COMPUTING, prefix: str = "") -> None:
    """Give every computing (sub)command `--threads N` (default: the CPUs this process may use, recorded)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                full = f"{prefix}{name}"
                if full in names and "--threads" not in sp._option_string_actions:
                    sp.add_argument("--threads", type=_threads, default=None, metavar="N",
                                    help="torch intra-op threads (default: the CPUs this process may use, from its "
                                         "affinity and cgroup quota); recorded in the run's environment record")
                add_threads_args(sp, names, prefix=f"{full} ")


def _add_generate_parser(sub: Any) -> None:
    """`generate`: the model flags (ModelSource), prompts, output and the sampler flags."""
    from .flags import add_model_source_args
    from ..generate.generate_command import BATCHING

    g = sub.add_parser("generate", help="sample responses from a DSL checkpoint or a backbone")
    add_model_source_args(g)
    g.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    g.add_argument("--prompts-file", default=None, help="JSONL file with one prompt per line (or .txt)")
    g.add_argument("--prompt-field", default="prompt", help="JSONL field holding the prompt (default 'prompt')")
    g.add_argument("--no-chat-template", action="store_true", help="encode prompts raw (prefix continuation)")
    g.add_argument("--allow-special-tokens", action="store_true",
                   help="let special-token spellings in prompts (e.g. <|mask|>, <|endoftext|>) become control tokens "
                        "(default: they are encoded as the text they are)")
    g.add_argument("--batch-size", type=int, default=8,
                   help="prompts sampled together (default 8): the live rows of the engine, or each fixed batch")
    g.add_argument("--batching", default="continuous", choices=BATCHING,
                   help="continuous (default): the step-level engine, the next prompt takes a finished row's place "
                        "at once so the batch stays full; fixed: batches of --batch-size prompts, each run to its end. "
                        "Same tokens either way; --kv-cache other than off always runs fixed batches")
    g.add_argument("--seed", type=int, default=42, help="prompt i uses seed + i")
    g.add_argument("--output", default=None,
                   help="append each finished prompt's record to this JSONL file (settings in OUTPUT.config.json); "
                        "an existing output made with the same settings is resumed")
    gx = g.add_mutually_exclusive_group()
    gx.add_argument("--resume", action="store_true",
                    help="continue --output, skipping prompts already done (the default when it exists with the "
                         "same settings; refused when the settings differ)")
    gx.add_argument("--overwrite", action="store_true", help="replace an existing --output instead of resuming it")
    g.add_argument("--max-error-rate", type=float, default=0.0, metavar="FRACTION",
                   help="exit 0 even though up to this fraction of the prompts failed (default 0: any failed prompt "
                        "makes the exit code 1; failed prompts are retried by the next run)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_sampler_args(g)
    g.set_defaults(func=cmd_generate)


def _add_convert_parser(sub: Any) -> None:
    """`convert`: a backbone folder to a fresh DSL checkpoint."""
    c = sub.add_parser("convert", help="make a fresh DSL checkpoint from a backbone folder")
    c.add_argument("backbone", help="backbone checkpoint folder (e.g. LLaDA-8B-Instruct)")
    c.add_argument("output", nargs="?", default=None,
                   help="output folder (new or empty; never the backbone folder or one containing it)")
    c.add_argument("--dry-run", action="store_true",
                   help="write nothing: print the weight memory the DSL model would need (fp32, bf16, bf16 + int8 "
                        "backbone) from the backbone's config.json alone")
    c.add_argument("--overwrite", action="store_true",
                   help="replace a previous DSL checkpoint at OUTPUT (a folder holding anything else is never deleted)")
    c.add_argument("--allow-download", action="store_true", help="allow fetching the backbone from the Hugging Face hub")
    c.add_argument("--dtype", default="float32", help="dtype the backbone is loaded and the checkpoint saved in")
    _add_convert_args(c)
    c.set_defaults(func=cmd_convert)


def _add_demo_parser(sub: Any) -> None:
    """`demo`: the toy world end to end (and its sweep / cache frontier)."""
    d = sub.add_parser("demo", help="the whole pipeline on the embedded toy world (CPU, minutes)")
    d.add_argument("--quick", action="store_true", help="a ~2-minute version")
    d.add_argument("--out", default="dsl-llada-demo", help="report folder (default ./dsl-llada-demo)")
    d.add_argument("--controls", action="store_true", help="also train the MDM-CPT and XDLM controls")
    d.add_argument("--from-scratch", action="store_true",
                   help="pretrain the masked DLM in this run instead of starting from the one shipped with the package "
                        "(same recipe; ~15 min more on a 2-core CPU)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"],
                   help="backbone dtype of the sampling and error-correction stages (training is always fp32; default "
                        "float32, which the documented tables use; auto: bf16 where the CPU has native bf16)")
    d.add_argument("--seeds", type=int, default=1, metavar="K",
                   help="sample every prompt with K seeds (1-16): pooled tables, intervals over prompts, and the "
                        "spread of perplexity across seeds (default 1)")
    what = d.add_mutually_exclusive_group()
    what.add_argument("--sweep", action="store_true", help="run the paper's SDE sensitivity sweep on the demo's checkpoints "
                   "(trained or cached) instead of the demo's comparison; writes OUT/sweep/")
    what.add_argument("--cache-frontier", action="store_true",
                   help="the quality-speed frontier on the demo's checkpoints: KV caching (prefix/dual, refresh R in "
                        "1, 2, 4, never), a bf16 backbone and the sparse converter, alone and combined, for Block SDE, "
                        "whole-response SDE and block remasking: exact PPL, in-support %%, ROUGE-L (95 %% intervals) "
                        "and token agreement vs samples per second, and the recommended point (the fastest within "
                        "exact fp32's intervals); writes OUT/cache_frontier/")
    d.add_argument("--sweep-prompts", type=int, default=None, metavar="N",
                   help="sweep: N open-ended + N/2 summarisation prompts (default 96; 8 with --quick)")
    d.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsl-llada", description="DSL-LLaDA: continuous-noise adaptation of masked diffusion LMs")
    p.add_argument("--version", action="version", version=f"dsl-llada {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    _add_generate_parser(sub)
    _add_convert_parser(sub)
    _add_demo_parser(sub)

    try:
        from .train_cli import add_train_parser
    except ImportError:
        pass
    else:
        add_train_parser(sub).set_defaults(func=_cmd_train)
    from .eval_cli import add_eval_parser

    add_eval_parser(sub)
    from .serve_cli import add_serve_parser

    add_serve_parser(sub)
    from .lmeval_cli import add_lmeval_parser

    add_lmeval_parser(sub)
    add_threads_args(p)
    return p


INTERRUPTED = "interrupted; finished artifacts are kept, partial ones were not written"
"""What Ctrl-C prints (a command may set its own: `interrupted` in its parser's defaults)."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if hasattr(args, "threads"):
        from ..runtime.environment import set_threads

        set_threads(args.threads)
    return run_cli_command(args.func, args, interrupted=getattr(args, "interrupted", INTERRUPTED))


if __name__ == "__main__":
    sys.exit(main())
