"""Text in, text out: load a model, tokenise prompts, run a sampler in batches, decode responses.

This is the library behind `dsl-llada generate`; the samplers themselves live in `dsl_llada.sampling`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
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
from .utils import atomic_write_text, progress as progress_bar

SAMPLERS = ("sde", "block-sde", "remask", "remdm")
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
    """Which sampler and its typed config."""

    name: str
    config: SDEConfig | RemaskConfig

    def __post_init__(self) -> None:
        if self.name not in SAMPLERS:
            raise ValueError(f"sampler={self.name!r} is not valid; expected one of {list(SAMPLERS)}")


def run_sampler(model: DSLModel | Backbone, prompts: PromptBatch, choice: SamplerChoice, *,
                generator: torch.Generator | Sequence[torch.Generator] | None = None, progress: bool = False) -> SampleOutput:
    """Dispatch one batch to the chosen sampler."""
    if choice.name in ("sde", "block-sde"):
        if not isinstance(model, DSLModel):
            raise ValueError(f"sampler {choice.name!r} needs a DSL checkpoint (with noise_embed/converter); this model "
                             f"is a bare backbone — use 'remask'/'remdm' or convert it first")
        from .sampling.sde import sample_sde  # noqa: PLC0415

        return sample_sde(model, prompts, choice.config, generator=generator, progress=progress)
    from .sampling.remask import sample_remask  # noqa: PLC0415

    return sample_remask(model, prompts, choice.config, generator=generator, progress=progress)


def generate(model: DSLModel | Backbone, tokenizer, prompts: Sequence[str], choice: SamplerChoice, *,
             batch_size: int = 8, seed: int = 42, chat_template: bool = True, progress: bool = True,
             on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Generate one response per prompt. Prompt i uses its own generator seeded `seed + i`, so results do not
    depend on the batch size or on the other prompts of its batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    special = model.special
    device = next(model.parameters()).device
    encoded = [encode_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    records: list[dict[str, Any]] = []
    starts = range(0, len(prompts), batch_size)
    for start in progress_bar(starts, total=len(starts), desc=f"generate ({choice.name})", enabled=progress):
        chunk = encoded[start : start + batch_size]
        batch = PromptBatch.from_lists(chunk, pad_id=special.pad_id, device=device)
        gens = [torch.Generator(device="cpu").manual_seed(seed + start + j) for j in range(len(chunk))]
        out = run_sampler(model, batch, choice, generator=gens)
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
