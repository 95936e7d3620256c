"""Text in, text out: load a model, tokenise prompts, run a sampler in batches, decode responses.

This is the library behind `dsl-llada generate`; the samplers themselves live in `dsl_llada.sampling`.
"""

from __future__ import annotations

import json
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
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: PLC0415

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


def generate(model: DSLModel | Backbone, tokenizer, prompts: Sequence[str], choice: SamplerChoice, *,
             batch_size: int = 8, seed: int = 42, chat_template: bool = True, progress: bool = True,
             on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Generate one response per prompt. Prompt i uses its own generator seeded `seed + i`, so results do not
    depend on the batch size or on the other prompts of its batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    encoded = [encode_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    records: list[dict[str, Any]] = []
    for start, out in sample_in_batches(model, encoded, choice, batch_size=batch_size, seed_of=lambda i: seed + i,
                                        progress=progress, desc=f"generate ({choice.name})"):
        for j, ids in enumerate(out.responses()):
            i = start + j
            rec = {"index": i, "prompt": prompts[i], "response": tokenizer.decode(ids, skip_special_tokens=True),
                   "response_ids": ids, "length": len(ids), "sampler": choice.name, "nfe": out.nfe,
                   "forward_passes": out.forward_passes, "seed": seed + i}
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def read_prompts(path: str | Path, field: str = "prompt") -> list[str]:
    """Prompts from a JSONL file (one object per line with a `field` string) or a plain text file (one per line)."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix != ".jsonl":
        return [ln for ln in lines if ln.strip()]
    out = []
    for n, ln in enumerate(lines, start=1):
        if not ln.strip():
            continue
        obj = json.loads(ln)
        if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
            raise ValueError(f"{path}:{n}: expected a JSON object with a string field {field!r}")
        out.append(obj[field])
    return out


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
