"""Text in, text out: run a sampler over encoded prompts in batches and decode the responses.

This is the library behind `dsl-llada generate`; loading models, tokenizers and prompts is `dsl_llada.loading`, the
samplers themselves live in `dsl_llada.sampling`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .backbones.base import Backbone
from .loading import check_prompt_lengths, check_prompt_texts, context_limit, encode_prompt
from .model import DSLModel
from .sampling.common import PromptBatch, SampleOutput, StepCallback
from .sampling.dispatch import SAMPLERS, SamplerConfig, sample
from .sampling.guards import FiniteLogitsGuard, NonFiniteLogitsError
from .utils import atomic_write_text, progress as progress_bar

log = logging.getLogger(__name__)

__all__ = ["SAMPLERS", "NonFiniteLogitsError", "generate", "run_sampler", "sample_in_batches", "write_jsonl"]
def run_sampler(model: DSLModel | Backbone, prompts: PromptBatch, config: SamplerConfig, *,
                generator: torch.Generator | Sequence[torch.Generator] | None = None, progress: bool = False,
                callback: StepCallback | None = None) -> SampleOutput:
    """Run one batch through the sampler that the config names (`callback`: the samplers' step observer)."""
    return sample(model, prompts, config, generator=generator, progress=progress, callback=callback)


def sample_in_batches(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]],
                      config: SamplerConfig, *,
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
        yield start, run_sampler(model, batch, config, generator=gens)


def generate(model: DSLModel | Backbone, tokenizer, prompts: Sequence[str], config: SamplerConfig, *,
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
        check_prompt_lengths(encoded, context=context_limit(model), gen_length=config.gen_length)
    done = set(skip)
    special = model.special
    device = next(model.parameters()).device

    def run(idx: list[int]) -> list[dict[str, Any]]:
        batch = PromptBatch.from_lists([encoded[i] for i in idx], pad_id=special.pad_id, device=device)
        gens = [torch.Generator(device="cpu").manual_seed(seed + i) for i in idx]
        out = run_sampler(model, batch, config, generator=gens, callback=FiniteLogitsGuard())
        return [{"index": i, "prompt": prompts[i], "response": tokenizer.decode(ids, skip_special_tokens=True),
                 "response_ids": ids, "length": len(ids), "sampler": config.sampler_name, "nfe": out.nfe,
                 "forward_passes": out.forward_passes, "seed": seed + i} for i, ids in zip(idx, out.responses(), strict=True)]

    def failed(i: int, e: BaseException) -> dict[str, Any]:
        log.warning("prompt %d failed (%s: %s); recorded with its error, continuing", i, type(e).__name__, e)
        return {"index": i, "prompt": prompts[i], "error": f"{type(e).__name__}: {e}", "sampler": config.sampler_name,
                "seed": seed + i}

    records: list[dict[str, Any]] = []
    starts = [s for s in range(0, len(prompts), batch_size) if any(i not in done for i in range(s, min(s + batch_size, len(prompts))))]
    for start in progress_bar(starts, total=len(starts), desc=f"generate ({config.sampler_name})", enabled=progress):
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


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
