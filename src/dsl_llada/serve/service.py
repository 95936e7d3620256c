"""What one request handler needs: model, tokenizer, limits, the engine's batcher, metrics, and the request -> jobs -> response
steps (encoding, checks, results to OpenAI choices). Tokenization and detokenization of anything but small texts
run on a small thread pool, never on the event loop (`encode_*` / `finish` are called through `off_loop`)."""

from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from ..config import RemaskConfig
from ..core.loading import encode_messages, encode_prompt
from ..core.model import DSLModel
from ..sampling.engine import Engine
from .batcher import Batcher, Job
from .limits import Limits, check_prompts, check_raw_sizes, check_request_fields, check_sampling_limits, default_max_tokens
from .logprobs import TokenLogprob
from .prometheus import Metrics
from ..core.backbones.base import FROM_MODEL, FromModel, context_limit
from .runner import BatchRunner, EngineRows, JobResult
from .settings import ServerConfig
from .schemas import ChatRequest, CompletionRequest, RequestError, SamplingFields, build_sampling


OFF_LOOP_MIN = 4096
"""Characters (encoding) or tokens (decoding) above which a text step leaves the event loop (well under 1 ms below)."""


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


class Service:
    """Everything one request handler needs: model, tokenizer, limits, batcher, metrics, settings."""

    def __init__(self, model, tokenizer, *, model_name: str, server: ServerConfig, api_key: str | None,
                 limits: Limits | None = None, environment: dict[str, Any] | None = None,
                 context: int | None | FromModel = FROM_MODEL):
        self.model, self.tokenizer, self.model_name, self.api_key = model, tokenizer, model_name, api_key
        self.server = server
        self.max_batch_tokens = server.max_batch_tokens
        self.has_converter = isinstance(model, DSLModel)
        self.default_sampler = "sde" if self.has_converter else "remask"
        backbone = model.backbone if self.has_converter else model
        self.has_kv_cache = bool(getattr(backbone, "supports_kv_cache", False))
        self.vocab_size = int(backbone.vocab_size)
        self.context = context_limit(model) if context is FROM_MODEL else context
        self.limits = limits or Limits.for_model(self.context, parameter_count(model))
        if environment is None:
            from ..runtime.environment import environment_record

            param = next(model.parameters())
            environment = environment_record(device=param.device, dtype=param.dtype)
        self.environment = environment
        self.metrics = Metrics()
        self.engine = Engine(model, max_rows=server.max_batch, max_tokens=server.max_batch_tokens, context=self.context)
        self.batcher = Batcher(self.engine, EngineRows(model, tokenizer),
                               fixed_batch=BatchRunner(model, tokenizer, progress=lambda: self.batcher.progress()),
                               max_wait_ms=server.max_wait_ms, max_queue=server.max_queue, metrics=self.metrics)
        self.text_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dsl-llada-text")
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Future | None = None

    def begin_shutdown(self, grace_s: float | None) -> None:
        """From a signal handler (any thread): start draining now, so requests still running when the grace period
        ends get a 503 (the HTTP server cancels its connections only after that)."""
        if self.loop is None or self.loop.is_closed():
            return

        def start() -> None:
            if self._drain is None:
                self._drain = asyncio.ensure_future(self.batcher.drain(grace_s))

        self.loop.call_soon_threadsafe(start)

    async def off_loop(self, size: int, fn, *args):
        """Run a text step (tokenize, template, detokenize) of `size` characters/tokens on the text pool when it is
        big enough to delay other clients (> OFF_LOOP_MIN); a small one runs inline (two thread hand-offs would
        cost a lone client more than the work itself)."""
        if size <= OFF_LOOP_MIN:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.text_pool, fn, *args)

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): 503 when rows are running and the worker has made no tick for longer than the
        longest allowed request (stuck), or while draining."""
        stalled = time.monotonic() - self.batcher.last_progress
        stuck = self.batcher.busy and stalled > self.limits.request_timeout_s
        status = "stuck" if stuck else ("draining" if self.batcher.closing else "ok")
        body = {"status": status, "model": self.model_name, "queue_length": self.batcher.queue_length,
                "running": len(self.batcher.running), "last_progress_s_ago": round(stalled, 3),
                "last_progress_unix": round(time.time() - stalled, 3), "limits": self.limits.__dict__,
                "environment": self.environment}
        return (503 if status != "ok" else 200), body

    # -- checks before anything is queued ----------------------------------------------------------------------------
    def check_request(self, req: SamplingFields) -> None:
        if req.model is not None and req.model != self.model_name:
            raise RequestError(f"model {req.model!r} is not served here; this server serves {self.model_name!r}",
                               "model", status=404, code="model_not_found")
        check_request_fields(req.model_extra or {})
        if req.top_p is not None and req.top_p != 1:
            raise RequestError(f"top_p={req.top_p} is not supported (these samplers do no nucleus truncation); "
                               f"leave it out or send 1", "top_p", code="unsupported_field")
        check_raw_sizes(req, self.limits)

    # -- request -> prompt ids (run off the loop) ---------------------------------------------------------------------
    def encode_chat(self, req: ChatRequest) -> list[int]:
        """The messages with the tokenizer's chat template; contents are text (a special-token spelling inside a
        message, e.g. a forged role marker, is never a control token)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("this model's tokenizer has no chat template; use /v1/completions", "messages")
        msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
        return encode_messages(self.tokenizer, msgs, chat_template=True)

    def encode_completion(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            p = [p]
        if p and all(isinstance(x, int) for x in p):
            return [[cast(int, x) for x in p]]  # token ids (checked against the vocabulary in make_jobs)
        if not p:
            raise RequestError("prompt is empty", "prompt")
        if len(p) > self.limits.max_prompts:
            raise RequestError(f"{len(p)} prompts exceed this server's limit of {self.limits.max_prompts} per request",
                               "prompt", code="limit_exceeded")
        if req.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("chat_template=true but this model's tokenizer has no chat template", "chat_template")
        return [encode_prompt(self.tokenizer, cast(str, s), chat_template=req.chat_template) for s in p]

    # -- prompt ids -> jobs -----------------------------------------------------------------------------------------
    def make_jobs(self, req: SamplingFields, prompts: list[list[int]], param: str, max_tokens: int | None,
                  stream: bool, top_logprobs: int | None = None) -> tuple[list[Job], str, Any, int, asyncio.Queue | None]:
        check_prompts(prompts, req.n, self.limits, param)
        name = req.sampler or self.default_sampler
        if max_tokens is None and req.max_tokens is None and req.gen_length is None:
            max_tokens = default_max_tokens(name, prompts, self.context, req.block_length)
        name, config = build_sampling(req, default_sampler=self.default_sampler, has_converter=self.has_converter,
                                      max_tokens=max_tokens, has_kv_cache=self.has_kv_cache)
        check_sampling_limits(name, config, self.limits, param_steps="nfe" if req.steps is None else "steps")
        for ids in prompts:
            if not ids:
                raise RequestError("the prompt encodes to no tokens", param)
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})", param)
            if self.context is not None and len(ids) + config.gen_length > self.context:
                raise RequestError(f"the prompt is {len(ids)} tokens and gen_length is {config.gen_length}: "
                                   f"{len(ids) + config.gen_length} tokens exceed the model's context of {self.context}; "
                                   f"shorten the prompt or reduce max_tokens/gen_length", param,
                                   code="context_length_exceeded")
            pair = len(ids) + config.gen_length
            tokens = pair * (2 if isinstance(config, RemaskConfig) and config.cfg_scale > 0 else 1)
            if self.max_batch_tokens is not None and config.kv_cache == "off" and tokens > self.max_batch_tokens:
                twice = " (twice for cfg_scale > 0)" if tokens > pair else ""
                raise RequestError(f"the prompt is {len(ids)} tokens and gen_length is {config.gen_length}: {tokens} "
                                   f"batch tokens{twice} can never fit this server's max_batch_tokens="
                                   f"{self.max_batch_tokens} (--max-batch-tokens); shorten the prompt or reduce "
                                   f"max_tokens/gen_length",
                                   param, code="request_too_large")
        seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
        events: asyncio.Queue | None = asyncio.Queue() if stream else None
        flat = [p for p in prompts for _ in range(req.n)]
        deadline = time.monotonic() + self.limits.request_timeout_s
        # Every row has its own generator (seed + k), so its random draws are those of the request run alone; what
        # can differ is rounding that changes with the batch shape and padding (docs/serving.md, *Batching*). The key
        # groups the fixed-batch calls of the jobs the engine refuses (same sampler, settings and prompt length).
        jobs = [Job(key=(name, config, len(ids)), prompt_ids=ids, config=config,
                    seed=seed + k, index=k, events=events, deadline=deadline,
                    timeout_s=self.limits.request_timeout_s, top_logprobs=top_logprobs)
                for k, ids in enumerate(flat)]
        return jobs, name, config, seed, events

    # -- results -> response (run off the loop) -----------------------------------------------------------------------
    def finish(self, req: SamplingFields, r: JobResult, chat: bool) -> tuple[str, str, Any]:
        """(text, finish_reason, logprobs in the endpoint's OpenAI format or None) of one result."""
        text = self.tokenizer.decode(r.ids, skip_special_tokens=True)
        reason = "stop" if len(r.ids) < r.gen_length else "length"
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        cuts = [text.find(s) for s in stops if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
        logprobs = None
        if r.logprobs is not None:
            kept = self._tokens_within(r.logprobs, len(text))
            logprobs = self._chat_logprobs(kept) if chat else self._completion_logprobs(kept)
        return text, reason, logprobs

    def _tokens_within(self, lps: list[TokenLogprob], n_chars: int) -> list[TokenLogprob]:
        """The tokens whose decoded prefix fits in the (stop-cut) text."""
        if not lps:
            return lps
        full = self.tokenizer.decode([t.token_id for t in lps], skip_special_tokens=True)
        if len(full) <= n_chars:
            return lps
        lo, hi = 0, len(lps)  # the decoded prefix only grows: the longest prefix that fits, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self.tokenizer.decode([t.token_id for t in lps[:mid]], skip_special_tokens=True)) <= n_chars:
                lo = mid
            else:
                hi = mid - 1
        return lps[:lo]

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _chat_logprobs(self, lps: list[TokenLogprob]) -> dict[str, Any]:
        def entry(tid: int, lp: float) -> dict[str, Any]:
            s = self._token_text(tid)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}
        return {"content": [{**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}
                            for t in lps]}

    def _completion_logprobs(self, lps: list[TokenLogprob]) -> dict[str, Any]:
        tokens = [self._token_text(t.token_id) for t in lps]
        offsets, at = [], 0
        for s in tokens:
            offsets.append(at)
            at += len(s)
        return {"tokens": tokens, "token_logprobs": [t.logprob for t in lps],
                "top_logprobs": [{self._token_text(i): v for i, v in t.top} for t in lps], "text_offset": offsets}

    def usage(self, jobs: list[Job], results: list[JobResult]) -> dict[str, int]:
        prompt = sum(len(j.prompt_ids) for j in jobs)
        completion = sum(len(r.ids) for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def extension(self, name: str, config, seed: int, results: list[JobResult]) -> dict[str, Any]:
        return {"sampler": name, "config": config.to_dict(), "seed": seed,
                "nfe": results[0].nfe if results else None,
                "forward_passes": results[0].forward_passes if results else None,
                "batch_sizes": [r.batch_size for r in results]}
