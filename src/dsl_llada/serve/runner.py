"""Jobs to the library's samplers and back (no sampling code here: `dsl_llada.sampling` does it): `EngineRows` hands
a job to the step-level engine as one row (seeded generator, step callback for its stream and logprobs) and turns
the row's result into the job's answer; `BatchRunner` runs the jobs the engine refuses as one fixed-batch sampler
call."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..core.backbones.base import model_device
from ..generate.generation import run_sampler
from ..sampling import PromptBatch, StepInfo
from ..sampling.engine import Engine, EngineResult
from ..sampling.guards import FiniteLogitsGuard
from ..sampling.observers import chain_callbacks
from .batcher import Job, RequestTimeout, RowAdapter
from .logprobs import LogprobRecorder, TokenLogprob

log = logging.getLogger(__name__)


def seeded_generator(seed: int) -> torch.Generator:
    """The CPU generator a request with `seed` gets (as `generation.generate` seeds prompt i with seed + i)."""
    return torch.Generator(device="cpu").manual_seed(seed)


@dataclass
class JobResult:
    """One row of a finished batch."""

    ids: list[int]
    """Response ids after EOS truncation."""
    gen_length: int
    nfe: int
    forward_passes: int
    batch_size: int
    """The most rows that ran together while this one ran (itself included)."""
    logprobs: list[TokenLogprob] | None = None
    """Per response token (after truncation): its log-probability under the sampler's final distribution and the
    top alternatives (only when the request asked for logprobs)."""

    @property
    def text_cost(self) -> int:
        """The size of turning this result into text (tokens to decode, twice with logprobs): what decides whether
        that runs off the event loop (`Service.off_loop`)."""
        return len(self.ids) * (1 + (self.logprobs is not None))


def step_event(info: StepInfo, row: int, tokenizer) -> dict[str, Any]:
    """The stream's per-step extension payload for one row (docs/serving.md, "Streamed denoising"): step/total,
    SNR (SDE) or diffusion time (discrete), the current ids and decoded text (special tokens kept, so the [MASK]s
    of the discrete samplers show), which positions are committed (final) at this step, and the sampler's scalar
    extras."""
    ids = info.tokens[row].tolist()
    ev: dict[str, Any] = {"step": info.step + 1, "total_steps": info.total_steps,
                          "text": tokenizer.decode(ids, skip_special_tokens=False), "token_ids": ids}
    if info.gamma is not None:
        ev["snr"] = float(info.gamma)
    if info.time is not None:
        ev["time"] = float(info.time)
    if info.committed is not None:
        ev["committed"] = [int(c) for c in info.committed[row].tolist()]
    for k, v in info.extra.items():
        if isinstance(v, torch.Tensor):
            v = v[row].item() if v.dim() else v.item()
        if isinstance(v, (int, float, bool)):
            ev[k] = v
    return ev


class EngineRows(RowAdapter):
    """A job as one engine row: its seeded generator, and a step callback that checks the NaN guard, records
    logprobs when the job asked for them and streams step events (`step_event`); the row's result as a JobResult.
    Cancellation and deadlines are the worker's (it removes the row at a tick boundary)."""

    def __init__(self, model, tokenizer):
        self.tokenizer = tokenizer
        self.mask_id = model.special.mask

    def submit(self, engine: Engine, job: Job) -> int:
        recorder = None
        if job.top_logprobs is not None:
            recorder = job.recorder = LogprobRecorder(1, job.config.gen_length, job.top_logprobs, self.mask_id)
        tokenizer = self.tokenizer

        def on_step(info: StepInfo) -> None:
            if recorder is not None:
                recorder(info)
            if info.decode:
                return  # the SDE's decode call is not a step of the stream
            if job.events is not None and not job.cancelled:
                job.emit(step_event(info, 0, tokenizer))

        return engine.submit(job.prompt_ids, job.config, generator=seeded_generator(job.seed),
                             callback=chain_callbacks(FiniteLogitsGuard(), on_step), tag=job,
                             context_checked=True)  # by Service.make_jobs

    def result(self, job: Job, result: EngineResult) -> JobResult:
        ids = result.response
        lp = None
        if job.recorder is not None and job.top_logprobs is not None:
            lp = job.recorder.row(0, len(ids), job.top_logprobs, ids)
        return JobResult(ids=ids, gen_length=job.config.gen_length, nfe=result.nfe,
                         forward_passes=result.forward_passes, batch_size=job.peak_rows, logprobs=lp)


class BatchRunner:
    """`run(jobs)`: one fixed-batch sampler call for jobs sharing the key (sampler name, config, prompt length):
    the server runs the jobs the step-level engine refuses (approximate key/value caching) this way.

    Its step callback (the samplers' observer protocol) checks the NaN guard, reports progress, removes the rows
    of jobs that were cancelled or passed their deadline from the running batch (`StepInfo.drop`: the sampler
    continues with the others, which keep their tokens; with no row left it stops), streams step events and records
    logprobs when a job asked for them. The results of dropped jobs are None."""

    def __init__(self, model, tokenizer, progress: Callable[[], None] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.pad_id = model.special.pad_id
        self.mask_id = model.special.mask
        self.device = model_device(model)
        self.progress = progress

    def __call__(self, jobs: Sequence[Job]) -> list[JobResult | None]:
        name, config = cast(tuple[Any, ...], jobs[0].key)[:2]  # (sampler, config[, prompt length])
        prompts = PromptBatch.from_lists([j.prompt_ids for j in jobs], pad_id=self.pad_id, device=self.device,
                                         context_checked=True)  # by Service.make_jobs
        gens = [seeded_generator(j.seed) for j in jobs]
        top = max((j.top_logprobs for j in jobs if j.top_logprobs is not None), default=None)
        recorder = LogprobRecorder(len(jobs), config.gen_length, top, self.mask_id) if top is not None else None

        def on_step(info: StepInfo) -> None:
            if self.progress is not None:
                self.progress()
            now = time.monotonic()
            rows = info.rows if info.rows is not None else range(len(jobs))
            for job_index in rows:
                job = jobs[job_index]
                if not job.cancelled and job.expired(now):
                    job.fail_threadsafe(RequestTimeout(f"the request passed its deadline of {job.timeout_s:g}s "
                                                       f"(--request-timeout-s) and was cancelled"))
            gone = [r for r in rows if jobs[r].cancelled]
            if gone:  # these rows leave the batch after this step; their neighbours go on unchanged
                info.drop(*gone)
            if recorder is not None:
                recorder(info)
            if info.decode:
                return  # the SDE's decode call is not a step of the stream
            for row, job_index in enumerate(rows):
                job = jobs[job_index]
                if job.events is not None and not job.cancelled:
                    job.emit(step_event(info, row, self.tokenizer))

        with torch.no_grad():
            out = run_sampler(self.model, prompts, config, generator=gens,
                              callback=chain_callbacks(FiniteLogitsGuard(), on_step))
        if out.dropped:
            log.info("%d of %d rows left their batch before it ended (cancelled or past their deadline)",
                     len(out.dropped), len(jobs))
        results: list[JobResult | None] = []
        dropped = set(out.dropped)
        for row, (job, ids) in enumerate(zip(jobs, out.responses())):
            if row in dropped:
                results.append(None)
                continue
            lp = recorder.row(row, len(ids), job.top_logprobs, ids) if recorder is not None and job.top_logprobs is not None \
                else None
            results.append(JobResult(ids=ids, gen_length=config.gen_length, nfe=out.nfe,
                                     forward_passes=out.forward_passes, batch_size=len(jobs), logprobs=lp))
        return results
