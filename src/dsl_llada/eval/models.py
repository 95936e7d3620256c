"""Loading the models of an evaluation and running one batch of prompts through a method.

Diffusion methods go through the project's batched samplers (`dsl_llada.sampling.batches.run_batch`) with one
generator per row; the autoregressive baseline is greedy `generate` of a Hugging Face causal LM.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError
from .eval_config import MethodSpec, ModelSpec

logger = logging.getLogger(__name__)


@dataclass
class Loaded:
    """A loaded model with its tokenizer."""

    spec: ModelSpec
    model: Any
    tokenizer: Any
    device: torch.device


def resolve_dtype(spec: ModelSpec, device: str) -> torch.dtype:
    from ..core.loading import resolve_dtype as dtype_of

    return dtype_of(spec.dtype, device)


def load_tokenizer_for(spec: ModelSpec):
    """The tokenizer of a model spec (its own folder unless `tokenizer` is set)."""
    path = spec.tokenizer or spec.path
    if not Path(path).is_dir():
        what = "tokenizer folder" if spec.tokenizer else "model folder"
        raise FileNotFoundError(f"model {spec.name!r}: {what} {path!r} does not exist")
    if spec.kind == "causal-lm" and spec.gguf_file and spec.tokenizer is None:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(path, gguf_file=spec.gguf_file, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ConfigError(f"model {spec.name!r}: could not read a tokenizer from {path}/{spec.gguf_file}: {e}") from None
    from ..core.loading import load_tokenizer

    return load_tokenizer(path)


def load(spec: ModelSpec, device: str) -> Loaded:
    """Load a model spec on `device` (fp32 on CPU, bf16 on CUDA unless the spec says otherwise)."""
    if not Path(spec.path).is_dir():
        raise FileNotFoundError(f"model {spec.name!r}: model folder {spec.path!r} does not exist")
    if spec.kind == "causal-lm":
        dtype = resolve_dtype(spec, device)
        tok = load_tokenizer_for(spec)
        from transformers import AutoModelForCausalLM

        kw = {"gguf_file": spec.gguf_file} if spec.gguf_file else {}
        try:
            model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=dtype, local_files_only=True,
                                                         trust_remote_code=False, **kw)
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"model {spec.name!r}: {spec.path} is not a loadable causal LM: {e}") from None
        model.to(torch.device(device))  # type: ignore[arg-type]  # transformers' decorated `to` hides its signature
        model.eval()
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return Loaded(spec, model, tok, torch.device(device))
    from ..core.loading import open_model

    handle = open_model(spec.source(device))
    return Loaded(spec, handle.model, handle.tokenizer, handle.device)


def check_method(loaded: Loaded, method: MethodSpec) -> None:
    """One clear error when a method cannot run on this model/tokenizer."""
    from ..core.model import DSLModel
    from .methods import needs_dsl

    if needs_dsl(method) and not isinstance(loaded.model, DSLModel):
        raise ConfigError(f"method {method.name!r} ({method.preset}) needs a DSL checkpoint (noise embedding + converter), "
                          f"but model {loaded.spec.name!r} ({loaded.spec.path}) is a bare backbone")
    if method.preset == "ar":
        return
    special = loaded.model.special
    vocab = len(loaded.tokenizer)
    for name in ("mask", "eos"):
        v = getattr(special, name)
        if v >= vocab:
            raise ConfigError(f"model {loaded.spec.name!r}: its {name} id {v} is not in the tokenizer "
                              f"({loaded.spec.tokenizer or loaded.spec.path}, {vocab} tokens); method {method.name!r} "
                              f"needs it — use the model's own tokenizer")


def encode(loaded: Loaded, prompt: str, chat: bool) -> list[int]:
    """Prompt ids as the model sees them (chat template as one user turn, or raw)."""
    from ..core.loading import encode_prompt

    return encode_prompt(loaded.tokenizer, prompt, chat_template=chat)


@dataclass
class BatchOutput:
    """Per-row response ids plus accounting for one sampler call."""

    responses: list[list[int]]
    nfe: int
    forward_passes: int


def run_batch(loaded: Loaded, method: MethodSpec, choice: Any, prompt_ids: Sequence[Sequence[int]],
              seeds: Sequence[int]) -> BatchOutput:
    """Run one batch. Row i uses a CPU generator seeded `seeds[i]` (results do not depend on the batch)."""
    if method.preset == "ar":
        return _run_ar(loaded, choice, prompt_ids)
    from ..sampling.batches import run_batch as run_sampler_batch

    config = getattr(choice, "config", choice)  # the sampler config (anything wrapping one: its .config)
    with torch.no_grad():
        out = run_sampler_batch(loaded.model, prompt_ids, config, [int(s) for s in seeds])
    return BatchOutput(out.responses(), int(out.nfe), int(out.forward_passes))


def _run_ar(loaded: Loaded, settings: dict[str, Any], prompt_ids: Sequence[Sequence[int]]) -> BatchOutput:
    tok, model = loaded.tokenizer, loaded.model
    pad = tok.pad_token_id
    P = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), P), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        attn[i, P - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(loaded.device), attention_mask=attn.to(loaded.device), do_sample=False,
                             max_new_tokens=settings["max_new_tokens"], pad_token_id=pad,
                             repetition_penalty=settings.get("repetition_penalty", 1.0),
                             use_cache=settings.get("use_cache", True))
    gen = out[:, P:].cpu()
    stops = {t for t in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)) if t is not None}
    flat: set[int] = set()
    for s in stops:
        flat |= set(s) if isinstance(s, (list, tuple)) else {int(s)}
    responses = []
    for row in gen.tolist():
        cut = next((j for j, t in enumerate(row) if t in flat or t == pad), len(row))
        responses.append(row[:cut])
    steps = gen.shape[1]
    return BatchOutput(responses, steps, steps)
