"""Text in, text out: run prompts through the batch runner (`sampling.batches`) and decode the responses.

This is the library behind `dsl-llada generate`; loading models, tokenizers and prompts is `dsl_llada.core.loading`, the
samplers themselves live in `dsl_llada.sampling`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..core.backbones.base import Backbone
from ..core.loading import check_prompt_texts, encode_prompt
from ..core.model import DSLModel
from ..sampling.batches import RowResult, engine_runs, run_batches, run_continuous
from ..sampling.common import PromptBatch, SampleOutput, StepCallback
from ..sampling.dispatch import SAMPLERS, SamplerConfig, sample
from ..sampling.guards import NonFiniteLogitsError
from ..artifacts.atomic import atomic_write_text

log = logging.getLogger(__name__)

__all__ = ["SAMPLERS", "NonFiniteLogitsError", "generate", "run_sampler", "write_jsonl"]


def run_sampler(model: DSLModel | Backbone, prompts: PromptBatch, config: SamplerConfig, *,
                generator: torch.Generator | Sequence[torch.Generator] | None = None, progress: bool = False,
                callback: StepCallback | None = None) -> SampleOutput:
    """Run one batch through the sampler that the config names (`callback(StepInfo)` after every step)."""
    return sample(model, prompts, config, generator=generator, progress=progress, callback=callback)


def generate(model: DSLModel | Backbone, tokenizer: Any, prompts: Sequence[str], config: SamplerConfig, *,
             batch_size: int = 8, seed: int = 42, chat_template: bool = True, progress: bool = True,
             on_record: Callable[[dict[str, Any]], None] | None = None, skip: Iterable[int] = (),
             on_batch: Callable[[list[dict[str, Any]]], None] | None = None,
             encoded: Sequence[Sequence[int]] | None = None, check_context: bool = True,
             continuous: bool = False, check_texts: bool = True) -> list[dict[str, Any]]:
    """Generate one response per prompt through the batch runner (`sampling.batches.run_batches`). Prompt i uses
    its own generator seeded `seed + i`, so results do not depend on the batch size or on the other prompts of its
    batch.

    Every prompt is validated before any sampling: it is text and not empty (`check_prompt_texts`) and it fits the
    context, each unless the caller checked it already (`check_texts=False`, `check_context=False`: a command
    checks both at its entry, so each runs once per prompt). Batches follow the fixed grid
    [0, batch_size), [batch_size, 2 batch_size), ...; prompts in `skip` (already done) are left out. `on_batch`
    receives each finished batch's records (in index order) before the next batch starts. A batch that raises a
    runtime error (not a ValueError, which means bad setup and stops the run) is retried prompt by prompt, and a
    prompt that still fails gets a record with an `error` field instead of a response. Non-finite logits on a
    sampler run's first forward pass raise NonFiniteLogitsError. Returns the records made by this call.

    With `continuous` (what `dsl-llada generate` does by default), the prompts run on the step-level engine
    (`sampling.batches.run_continuous`) with at most `batch_size` live rows: a finished row's place goes to the
    next prompt at once, `on_batch` receives the records that finish at each step (in index order; with a
    confidence threshold a later prompt can finish before an earlier one), and every prompt gets the tokens of the
    fixed-batch run (same seeds). A record's `nfe` and `forward_passes` are then its own (with a threshold, a fixed
    batch reports its slowest row's). A config the engine cannot run (a key/value cache, a model that is neither a
    DSLModel nor a Backbone) takes the fixed batches.
    """
    if check_texts:
        check_prompt_texts(prompts)
    if encoded is None:
        encoded = [encode_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    name = config.sampler_name

    def record(r: RowResult) -> dict[str, Any]:
        if r.error is not None:
            return {"index": r.index, "prompt": prompts[r.index], "error": r.error, "sampler": name, "seed": r.seed}
        ids, out = r.response, r.output
        assert ids is not None and out is not None  # a row without an error has its tokens
        rec = {"index": r.index, "prompt": prompts[r.index], "response": tokenizer.decode(ids, skip_special_tokens=True),
               "response_ids": ids, "length": len(ids), "sampler": name, "nfe": out.nfe,
               "forward_passes": out.forward_passes, "seed": r.seed}
        if getattr(config, "threshold", None) is not None and out.steps_per_block is not None:
            rec["steps_per_block"] = out.steps_per_block[r.row].tolist()  # this row's own (data-dependent) steps
        return rec

    records: list[dict[str, Any]] = []
    if continuous and engine_runs(model, config):
        runs = run_continuous(model, encoded, config, max_rows=batch_size, seed_of=lambda i: seed + i, skip=set(skip),
                              progress=progress, desc=f"generate ({name})", check_context=check_context)
    else:
        runs = run_batches(model, encoded, config, batch_size=batch_size, seed_of=lambda i: seed + i, skip=set(skip),
                           progress=progress, desc=f"generate ({name})", check_context=check_context)
    for rows in runs:
        batch_records = [record(r) for r in rows]
        if on_batch is not None:
            on_batch(batch_records)
        for rec in batch_records:
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
