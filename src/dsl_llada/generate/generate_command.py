"""`dsl-llada generate` as a library call: `run_generate(GenerateSettings(...))` does what the command does (read
the prompts, open the model, sample, append the records to `output`, resume it), so a notebook runs the same job:

    from dsl_llada.generate.generate_command import GenerateSettings, run_generate
    from dsl_llada.core.model_source import ModelSource
    from dsl_llada.config import SDEConfig
    run_generate(GenerateSettings(ModelSource(path="ckpt"), SDEConfig(nfe=64), prompts=("Hello",)))

The command line only parses its flags into these settings (`cli.cmd_generate`).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.loading import ModelHandle, check_prompt_chars, check_prompt_lengths, check_prompt_texts, encode_prompt, \
    open_model, read_prompts, resolve
from ..core.model_source import ModelSource
from ..artifacts.records import RecordFile
from ..sampling.dispatch import SamplerConfig
from ..runtime.termination import Terminated, terminate_raises

__all__ = ["BATCHING", "GenerateSettings", "print_record", "run_generate"]

BATCHING = ("continuous", "fixed")
"""The values of `GenerateSettings.batching` (`--batching`)."""


@dataclass(frozen=True)
class GenerateSettings:
    """One `generate` job: the model, the sampler config, the prompts and where the records go."""

    source: ModelSource
    config: SamplerConfig
    prompts: tuple[str, ...] = ()
    """Prompt texts (the prompts of `prompts_file` follow them)."""
    prompts_file: str | None = None
    """A .jsonl, .json or .txt prompts file (`loading.read_prompts`)."""
    prompt_field: str = "prompt"
    seed: int = 42
    """Prompt i samples with seed + i."""
    batch_size: int = 8
    """Rows sampled together: the engine's live rows (continuous), or the size of each fixed batch."""
    batching: str = "continuous"
    """'continuous': the step-level engine, where the next prompt takes a finished row's place at once, so the batch
    stays full; 'fixed': batches [0, batch_size), [batch_size, 2 batch_size), ... each run to its end. Both give
    every prompt the same tokens (same seeds). Configs the engine does not run (kv_cache other than 'off') take the
    fixed batches either way."""
    chat_template: bool = True
    allow_special_tokens: bool = False
    output: str | None = None
    """Append each finished prompt's record to this JSONL file (settings in OUTPUT.config.json); resumed when it
    exists with the same settings."""
    resume: bool = False
    overwrite: bool = False
    max_error_rate: float = 0.0
    """Largest fraction of failed prompts that still counts as success (exit code 0)."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(f"--batching {self.batching!r} is not one of {', '.join(BATCHING)} (continuous: the "
                             f"step-level engine keeps the batch full; fixed: fixed batches run to their end)")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"--batch-size {self.batch_size!r} must be an integer >= 1")
        if not (isinstance(self.max_error_rate, (int, float)) and math.isfinite(self.max_error_rate)
                and 0.0 <= self.max_error_rate <= 1.0):
            raise ValueError(f"--max-error-rate {self.max_error_rate!r} must be a fraction in [0, 1] (0 = every "
                             f"prompt must succeed)")
        if self.resume and not self.output:
            raise ValueError("--resume needs --output FILE (the records file to continue)")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other; pass one")


def print_record(record: dict[str, Any]) -> None:
    """The command's stdout: one JSON line per prompt (its index and response, or its error)."""
    shown = {"error": record["error"]} if "error" in record else {"response": record["response"]}
    print(json.dumps({"index": record["index"], **shown}, ensure_ascii=False), flush=True)


def _prompts(s: GenerateSettings) -> list[str]:
    prompts = list(s.prompts)
    if s.prompts_file:
        prompts += read_prompts(s.prompts_file, s.prompt_field)
    if not prompts:
        raise ValueError("no prompts: pass --prompt TEXT (repeatable) or --prompts-file FILE (.jsonl, .json or .txt)")
    check_prompt_texts(prompts)
    if not 0 <= s.seed <= 2**63 - 1 - len(prompts):  # prompt i uses seed + i, a signed 64-bit generator seed
        raise ValueError(f"--seed {s.seed} is out of range: it must be in [0, {2**63 - 1 - len(prompts)}] "
                         f"(prompt i uses seed + i, a 64-bit generator seed)")
    return prompts


def _record_settings(s: GenerateSettings, source: ModelSource, prompts: list[str]) -> dict[str, Any]:
    """What decides the records (stored as OUTPUT.config.json; a resumed run must match it)."""
    digest = hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode("utf-8")).hexdigest()
    return {"model": str(Path(str(source.path)).resolve()), "tokenizer": str(Path(str(source.tokenizer_path)).resolve()),
            "sampler": s.config.sampler_name, "config": s.config.to_dict(), "seed": s.seed,
            "chat_template": s.chat_template, "dtype": source.dtype, "device": str(source.device).split(":")[0],
            "prompts": {"count": len(prompts), "sha256": digest},
            # recorded only when set, so outputs written before these settings existed still resume
            **({"allow_special_tokens": True} if s.allow_special_tokens else {}),
            **({"assume_released": True} if source.assume_released else {}),
            **({"quantize": source.quantize} if source.quantize != "none" else {})}


def run_generate(settings: GenerateSettings, *, echo: Callable[[dict[str, Any]], None] | None = print_record) -> int:
    """Run one generate job; returns the command's exit code (0; 1 when more prompts failed than
    `max_error_rate` allows; 130 when interrupted by Ctrl-C, 143 by SIGTERM). Bad settings raise ValueError before anything is written.
    `echo` sees every record as its prompt finishes (default: printed as a JSON line)."""
    prompts = _prompts(settings)
    resolved = resolve(settings.source)
    source = resolved.source
    out = None
    if settings.output:  # locked and checked before the model is loaded: nothing is written yet
        from ..runtime.environment import environment_record

        # an output written before a sampler field existed resumes while that field is at its default
        out = RecordFile.open(settings.output, _record_settings(settings, source, prompts), overwrite=settings.overwrite,
                              defaults={"config": type(settings.config)().to_dict()},
                              protect=(settings.prompts_file,) if settings.prompts_file else (),
                              environment=environment_record(device=source.device, dtype=source.dtype,
                                                             seeds={"seed": settings.seed, "prompt_i": "seed + i"}))
    try:
        with terminate_raises():  # SIGTERM stops the run like Ctrl-C: every finished record stays, the lock goes
            handle = open_model(resolved, chat_template=settings.chat_template)
            return _run(settings, handle, prompts, out, echo)
    except Terminated:
        if out is not None:
            out.close()
            print(f"stopped by SIGTERM: {len(out.finished)} of {len(prompts)} records kept in {settings.output} "
                  f"(every finished prompt); rerun the same command to resume", file=sys.stderr)
        else:
            print("stopped by SIGTERM: without --output nothing was saved (the records printed above are all there "
                  "is)", file=sys.stderr)
        return 143
    finally:
        if out is not None:
            out.close()


def _run(s: GenerateSettings, handle: ModelHandle, prompts: list[str], out: RecordFile | None,
         echo: Callable[[dict[str, Any]], None] | None) -> int:
    from .generation import NonFiniteLogitsError, generate

    check_prompt_chars(prompts, handle.tokenizer, context=handle.context, gen_length=s.config.gen_length)
    encoded = [encode_prompt(handle.tokenizer, p, chat_template=s.chat_template,
                             allow_special_tokens=s.allow_special_tokens) for p in prompts]
    check_prompt_lengths(encoded, context=handle.context, gen_length=s.config.gen_length)  # once, before sampling

    def show(batch: list[dict[str, Any]]) -> None:
        if out is not None:
            out.append(batch)
        if echo is not None:
            for r in batch:
                echo(r)

    skip: set[int] = set()
    if out is not None:
        out.begin()
        skip = out.finished
        retry = len(out.done) - len(skip)
        if out.done:
            print(f"resuming {s.output}: {len(skip)} of {len(prompts)} prompts already done"
                  + (f"; retrying {retry} that failed before" if retry else ""), file=sys.stderr)
    try:
        records = generate(handle.model, handle.tokenizer, prompts, s.config, batch_size=s.batch_size, seed=s.seed,
                           chat_template=s.chat_template, progress=s.progress, encoded=encoded, skip=skip,
                           on_batch=show, check_context=False, check_texts=False,
                           continuous=s.batching == "continuous")
    except KeyboardInterrupt:
        if out is not None:
            out.close()
            print(f"interrupted; {len(out.finished)} of {len(prompts)} records are saved in {s.output} (every "
                  f"finished prompt); run the same command again to continue", file=sys.stderr)
        else:
            print("interrupted; without --output nothing was saved (the records printed above are all there is)",
                  file=sys.stderr)
        return 130
    except NonFiniteLogitsError as e:
        raise ValueError(f"model {str(handle.source.path)!r}: non-finite numbers: {e}; check its model.safetensors "
                         f"(re-convert, or use an earlier checkpoint)") from None
    if out is not None:
        out.finish(len(prompts))
        records = [out.done[i] for i in range(len(prompts))]
    return summarize(records, len(prompts), s.max_error_rate, s.output)


def summarize(records: list[dict[str, Any]], n: int, max_error_rate: float, output: str | None) -> int:
    """One summary line on stderr; 1 when the share of failed prompts exceeds `max_error_rate`, else 0."""
    failed = [r for r in records if "error" in r]
    where = f" in {output}" if output else ""
    if not failed:
        print(f"done: {n} of {n} prompts generated{where}", file=sys.stderr)
        return 0
    first = failed[0]
    print(f"done: {n - len(failed)} of {n} prompts generated, {len(failed)} failed{where} (their records carry an "
          f"'error' field; first: prompt {first['index']}: {first['error']}); rerun the same command to retry them",
          file=sys.stderr)
    if len(failed) > max_error_rate * n:
        print(f"error: {len(failed)} of {n} prompts failed ({len(failed) / n:.1%}), more than --max-error-rate "
              f"{max_error_rate:g} allows", file=sys.stderr)
        return 1
    return 0
