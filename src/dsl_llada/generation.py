"""Text in, text out: load a model, tokenise prompts, run a sampler in batches, decode responses.

This is the library behind `dsl-llada generate`; the samplers themselves live in `dsl_llada.sampling`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .backbones import load_backbone
from .backbones.base import Backbone, CheckpointError
from .checkpoint import checkpoint_files
from .config import RemaskConfig, SDEConfig
from .model import DSLModel
from .sampling.common import PromptBatch, SampleOutput
from .sampling.dispatch import SAMPLERS, SamplerConfig, sample
from .utils import atomic_write_text, progress as progress_bar

log = logging.getLogger(__name__)

__all__ = ["SAMPLERS", "SamplerChoice", "encode_prompt", "generate", "load_model", "load_tokenizer", "read_prompts",
           "run_sampler", "sample_in_batches", "write_jsonl"]
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not valid; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu") -> DSLModel | Backbone:
    """A DSL checkpoint (has `noise_embed.weight`) loads as DSLModel; anything else as a bare backbone."""
    names = set(checkpoint_files(path))
    if "noise_embed.weight" in names:
        return DSLModel.from_pretrained(path, dtype=dtype, device=device).eval()
    return load_backbone(path, dtype=dtype, device=device).eval()


def load_tokenizer(path: str | Path):
    """A Hugging Face tokenizer from a local folder (never the hub; no remote code)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if (Path(path) / "tokenizer.json").exists():  # a fast tokenizer file: no need to read the model's config
            return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"could not load a tokenizer from {str(path)!r}: {e}") from None


def encode_prompt(tokenizer, text: str, *, chat_template: bool = True) -> list[int]:
    """Chat-template the prompt as one user turn (when the tokenizer has a template) and encode it without
    adding special tokens again (the template already holds BOS), as LLaDA-Instruct's evaluation."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class SamplerChoice:
    """A sampler's typed config: its type picks the sampler (`sampling.dispatch`) and `name` is derived from it."""

    config: SamplerConfig

    def __post_init__(self) -> None:
        if not isinstance(self.config, (SDEConfig, RemaskConfig)):
            raise TypeError(f"config of type {type(self.config).__name__} names no sampler; "
                            f"expected SDEConfig or RemaskConfig")

    @property
    def name(self) -> str:
        """'sde', 'block-sde', 'remask' or 'remdm' (one of SAMPLERS), as the config says."""
        return self.config.sampler_name


def run_sampler(model: DSLModel | Backbone, prompts: PromptBatch, choice: SamplerChoice | SamplerConfig, *,
                generator: torch.Generator | Sequence[torch.Generator] | None = None, progress: bool = False) -> SampleOutput:
    """Run one batch through the sampler that the config's type picks."""
    config = choice.config if isinstance(choice, SamplerChoice) else choice
    return sample(model, prompts, config, generator=generator, progress=progress)


def sample_in_batches(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]],
                      choice: SamplerChoice | SamplerConfig, *,
                      batch_size: int, seed_of: Callable[[int], int], progress: bool = False,
                      desc: str = "sample") -> Iterator[tuple[int, SampleOutput]]:
    """Encoded prompts in left-padded batches of `batch_size`; yields (index of the batch's first prompt, output).

    Prompt i has its own CPU generator seeded `seed_of(i)`, so its tokens depend neither on the batch size nor on
    the other prompts of its batch (`generate`: seed + i; the toy evaluation: its own formula).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    device = next(model.parameters()).device
    starts = range(0, len(prompt_ids), batch_size)
    for start in progress_bar(starts, total=len(starts), desc=desc, enabled=progress):
        chunk = prompt_ids[start : start + batch_size]
        batch = PromptBatch.from_lists(chunk, pad_id=model.special.pad_id, device=device)
        gens = [torch.Generator(device="cpu").manual_seed(seed_of(start + j)) for j in range(len(chunk))]
        yield start, run_sampler(model, batch, choice, generator=gens)


class NonFiniteLogitsError(ValueError):
    """The model's first forward pass of a sampler run produced NaN/inf logits (damaged or diverged weights)."""


@contextlib.contextmanager
def check_finite_first_forward(model: DSLModel | Backbone) -> Iterator[None]:
    """Inside the block, the first backbone forward pass is checked for non-finite logits (one `isfinite` over the
    last position, which left padding never covers); a NaN/inf raises NonFiniteLogitsError at once."""
    backbone = model.backbone if isinstance(model, DSLModel) else model
    handle = None

    def hook(_module, _inputs, output):
        handle.remove()
        logits = output[0] if isinstance(output, (tuple, list)) else output
        if torch.is_tensor(logits) and logits.dim() == 3 and not bool(torch.isfinite(logits[:, -1]).all()):
            raise NonFiniteLogitsError("the model's first forward pass produced non-finite (NaN/inf) logits: its "
                                       "weights are damaged or come from a diverged training run")

    handle = backbone.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def context_limit(model: DSLModel | Backbone) -> int | None:
    """Longest sequence (prompt + response) the model accepts; None when unbounded/unknown."""
    backbone = model.backbone if isinstance(model, DSLModel) else model
    return getattr(backbone, "max_length", None)


def check_prompt_texts(prompts: Sequence[str]) -> None:
    """Refuse empty (or whitespace-only) prompts up front, naming the first few."""
    empty = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if empty:
        which = f"prompt {empty[0]} is" if len(empty) == 1 else \
            f"prompts {', '.join(map(str, empty[:5]))}{' ...' if len(empty) > 5 else ''} are"
        raise ValueError(f"{which} empty (counting from 0 in the order given); every prompt needs some text")


def check_prompt_lengths(encoded: Sequence[Sequence[int]], *, context: int | None, gen_length: int) -> None:
    """Before any sampling: every encoded prompt + gen_length must fit the context; name the prompt and by how much
    it is too long."""
    if context is None:
        return
    too_long = [(i, len(e)) for i, e in enumerate(encoded) if len(e) + gen_length > context]
    if not too_long:
        return
    i, n = max(too_long, key=lambda t: t[1])
    others = f" ({len(too_long)} prompts are too long; this is the longest)" if len(too_long) > 1 else ""
    fix = f"shorten it by at least {n + gen_length - context} tokens"
    if n < context:
        fix += f", or reduce --gen-length to at most {context - n}"
    raise ValueError(f"prompt {i} is too long: {n} tokens as encoded (chat template included) + gen_length "
                     f"{gen_length} = {n + gen_length} tokens exceeds the model's context of {context} by "
                     f"{n + gen_length - context}{others}; {fix}")


def generate(model: DSLModel | Backbone, tokenizer, prompts: Sequence[str], choice: SamplerChoice, *,
             batch_size: int = 8, seed: int = 42, chat_template: bool = True, progress: bool = True,
             on_record: Callable[[dict[str, Any]], None] | None = None, skip: Iterable[int] = (),
             on_batch: Callable[[list[dict[str, Any]]], None] | None = None,
             encoded: Sequence[Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """Generate one response per prompt. Prompt i uses its own generator seeded `seed + i`, so results do not
    depend on the batch size or on the other prompts of its batch.

    Every prompt is validated before any sampling (non-empty, fits the context). Batches follow the fixed grid
    [0, batch_size), [batch_size, 2 batch_size), ...; prompts in `skip` (already done) are left out. `on_batch`
    receives each finished batch's records (in index order) before the next batch starts. A batch that raises a
    runtime error (not a ValueError, which means bad setup and stops the run) is retried prompt by prompt, and a
    prompt that still fails gets a record with an `error` field instead of a response. Non-finite logits on a
    sampler run's first forward pass raise NonFiniteLogitsError. Returns the records made by this call.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    check_prompt_texts(prompts)
    if encoded is None:
        encoded = [encode_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
        check_prompt_lengths(encoded, context=context_limit(model), gen_length=choice.config.gen_length)
    done = set(skip)
    special = model.special
    device = next(model.parameters()).device

    def run(idx: list[int]) -> list[dict[str, Any]]:
        batch = PromptBatch.from_lists([encoded[i] for i in idx], pad_id=special.pad_id, device=device)
        gens = [torch.Generator(device="cpu").manual_seed(seed + i) for i in idx]
        with check_finite_first_forward(model):
            out = run_sampler(model, batch, choice, generator=gens)
        return [{"index": i, "prompt": prompts[i], "response": tokenizer.decode(ids, skip_special_tokens=True),
                 "response_ids": ids, "length": len(ids), "sampler": choice.name, "nfe": out.nfe,
                 "forward_passes": out.forward_passes, "seed": seed + i} for i, ids in zip(idx, out.responses(), strict=True)]

    def failed(i: int, e: BaseException) -> dict[str, Any]:
        log.warning("prompt %d failed (%s: %s); recorded with its error, continuing", i, type(e).__name__, e)
        return {"index": i, "prompt": prompts[i], "error": f"{type(e).__name__}: {e}", "sampler": choice.name,
                "seed": seed + i}

    records: list[dict[str, Any]] = []
    starts = [s for s in range(0, len(prompts), batch_size) if any(i not in done for i in range(s, min(s + batch_size, len(prompts))))]
    for start in progress_bar(starts, total=len(starts), desc=f"generate ({choice.name})", enabled=progress):
        idx = [i for i in range(start, min(start + batch_size, len(prompts))) if i not in done]
        try:
            batch_records = run(idx)
        except (ValueError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 — a runtime failure of this batch: retry its prompts one by one
            if len(idx) == 1:
                batch_records = [failed(idx[0], e)]
            else:
                batch_records = []
                for i in idx:
                    try:
                        batch_records += run([i])
                    except (ValueError, KeyboardInterrupt):
                        raise
                    except Exception as e1:  # noqa: BLE001
                        batch_records.append(failed(i, e1))
        if on_batch is not None:
            on_batch(batch_records)
        for rec in batch_records:
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def _prompt_of(obj: Any, field: str, where: str) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict) and isinstance(obj.get(field), str):
        return obj[field]
    raise ValueError(f"{where}: expected a JSON object with a string field {field!r} (see --prompt-field)")


def read_prompts(path: str | Path, field: str = "prompt") -> list[str]:
    """Prompts from a file, by suffix: `.jsonl` (one JSON object per line with a string `field`, or a JSON
    string), `.json` (a JSON array of strings or of such objects), anything else plain text (one per line;
    blank lines skipped). Errors name the file and line."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--prompts-file {str(path)!r} is a folder; expected a .jsonl, .json or .txt file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompts-file {str(path)!r} is not UTF-8 text ({e}); expected .jsonl, .json or .txt") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); a .json prompts file "
                             f"holds one JSON array of strings or of objects with a {field!r} field") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json prompts file must hold a JSON array (of strings or of objects with a "
                             f"{field!r} field), got a {type(data).__name__}; or use .jsonl (one object per line) "
                             f"or .txt (one prompt per line)")
        return [_prompt_of(x, field, f"{path}: item {n}") for n, x in enumerate(data)]
    lines = text.splitlines()
    if path.suffix != ".jsonl":
        return [ln for ln in lines if ln.strip()]
    out = []
    for n, ln in enumerate(lines, start=1):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}, column {e.colno}); a .jsonl prompts file holds "
                             f"one JSON object per line") from None
        out.append(_prompt_of(obj, field, f"{path}:{n}"))
    return out


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
