"""The OpenAI-compatible FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Requests become jobs for the `Batcher` (dynamic batching); `stream: true` answers with server-sent events that
carry each denoising step under the extension key `dsl_llada`, then the final text as ordinary deltas and [DONE].
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..environment import environment_record
from ..loading import encode_prompt
from ..model import DSLModel
from .batcher import DONE, Batcher, Job, QueueFull, ShuttingDown
from .prometheus import Metrics
from .runner import BatchRunner, JobResult, context_limit
from .schemas import (
    ChatRequest,
    CompletionRequest,
    RequestError,
    SamplingFields,
    build_sampling,
    error_body,
    validation_error_param,
)
from .settings import ServerConfig

log = logging.getLogger(__name__)


def _error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def _where(model) -> dict[str, Any]:
    p = next(iter(model.parameters()), None)
    return {"device": p.device, "dtype": p.dtype} if p is not None else {}


class Service:
    """Everything one request handler needs: model, tokenizer, batcher, metrics, settings."""

    def __init__(self, model, tokenizer, *, model_name: str, max_batch: int, max_wait_ms: float, max_queue: int,
                 api_key: str | None, pad_batches: bool = False):
        self.model, self.tokenizer, self.model_name, self.api_key = model, tokenizer, model_name, api_key
        self.pad_batches = pad_batches
        self.has_converter = isinstance(model, DSLModel)
        self.default_sampler = "sde" if self.has_converter else "remask"
        backbone = model.backbone if self.has_converter else model
        self.has_kv_cache = bool(getattr(backbone, "supports_kv_cache", False))
        self.context = context_limit(model)
        self.metrics = Metrics()
        self.batcher = Batcher(BatchRunner(model, tokenizer), max_batch=max_batch, max_wait_ms=max_wait_ms,
                               max_queue=max_queue, on_batch=self._on_batch)
        self.created = int(time.time())

    def _on_batch(self, jobs, seconds: float, error: BaseException | None) -> None:
        done = [j.future.result() for j in jobs if error is None and j.future is not None and j.future.done()
                and not j.future.cancelled()]
        self.metrics.batch_done(len(jobs), seconds, sum(len(r.ids) for r in done),
                                done[0].forward_passes if done else 0, error is not None)

    # -- request -> jobs ---------------------------------------------------------------------------------------------
    def check_model(self, req: SamplingFields) -> None:
        if req.model is not None and req.model != self.model_name:
            raise RequestError(f"model {req.model!r} is not served here; this server serves {self.model_name!r}",
                               "model", status=404, code="model_not_found")

    def encode_chat(self, req: ChatRequest) -> list[int]:
        msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("this model's tokenizer has no chat template; use /v1/completions", "messages")
        if len(msgs) == 1 and msgs[0]["role"] == "user":  # exactly the library's encoding of one prompt
            return encode_prompt(self.tokenizer, msgs[0]["content"], chat_template=True)
        text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_completion(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            p = [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[list-item]  (ids are checked against the vocabulary in make_jobs)
        if not p:
            raise RequestError("prompt is empty", "prompt")
        if req.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("chat_template=true but this model's tokenizer has no chat template", "chat_template")
        return [encode_prompt(self.tokenizer, s, chat_template=req.chat_template) for s in p]  # type: ignore[arg-type]

    def make_jobs(self, req: SamplingFields, prompts: list[list[int]], param: str, max_tokens: int | None,
                  stream: bool) -> tuple[list[Job], str, Any, int, asyncio.Queue | None]:
        name, config = build_sampling(req, default_sampler=self.default_sampler, has_converter=self.has_converter,
                                      max_tokens=max_tokens, has_kv_cache=self.has_kv_cache)
        for ids in prompts:
            if not ids:
                raise RequestError("the prompt encodes to no tokens", param)
            bad = [i for i in ids if not 0 <= i < self._vocab_size()]
            if bad:
                raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {self._vocab_size()})", param)
            if self.context is not None and len(ids) + config.gen_length > self.context:
                raise RequestError(f"the prompt is {len(ids)} tokens and gen_length is {config.gen_length}: "
                                   f"{len(ids) + config.gen_length} tokens exceed the model's context of {self.context}; "
                                   f"shorten the prompt or reduce max_tokens/gen_length", param,
                                   code="context_length_exceeded")
        seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
        events: asyncio.Queue | None = asyncio.Queue() if stream else None
        flat = [p for p in prompts for _ in range(req.n)]
        # Every row has its own generator, so its random draws are those of the request run alone. By default only
        # equal-length prompts share a batch (no padding; what remains is rounding that may change with the batch
        # shape). pad_batches also batches different lengths (left padding + attention mask): more batching, and
        # the masked attention rounds differently (~1e-5 in the logits). Either can flip a near-tie token.
        jobs = [Job(key=(name, config) if self.pad_batches else (name, config, len(ids)), prompt_ids=ids,
                    seed=seed + k, index=k, events=events) for k, ids in enumerate(flat)]
        return jobs, name, config, seed, events

    def _vocab_size(self) -> int:
        bb = self.model.backbone if self.has_converter else self.model
        return int(bb.vocab_size)

    def finish(self, req: SamplingFields, r: JobResult) -> tuple[str, str]:
        text = self.tokenizer.decode(r.ids, skip_special_tokens=True)
        reason = "stop" if len(r.ids) < r.gen_length else "length"
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        cuts = [text.find(s) for s in stops if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
        return text, reason

    def usage(self, jobs: list[Job], results: list[JobResult]) -> dict[str, int]:
        prompt = sum(len(j.prompt_ids) for j in jobs)
        completion = sum(len(r.ids) for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def extension(self, name: str, config, seed: int, results: list[JobResult]) -> dict[str, Any]:
        return {"sampler": name, "config": config.to_dict(), "seed": seed,
                "nfe": results[0].nfe if results else None,
                "forward_passes": results[0].forward_passes if results else None,
                "batch_sizes": [r.batch_size for r in results]}


class AuthAndCount:
    """ASGI middleware: the optional static API key (constant-time compare; /health is open) and per-endpoint
    request counts + latency of non-streamed responses (streams count themselves when they end)."""

    def __init__(self, app, service: Service):
        self.app, self.svc = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, svc = scope["path"], self.svc
        if svc.api_key is not None and path != "/health":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            given = headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), svc.api_key.encode()):
                svc.metrics.request_done(path, 401)
                response = _error(401, "missing or wrong API key (send the header 'Authorization: Bearer KEY')",
                                  "invalid_request_error", code="invalid_api_key")
                return await response(scope, receive, send)
        if not path.startswith("/v1/"):
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        state: dict[str, Any] = {}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["stream"] = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                      for k, v in message.get("headers", []))
            elif message["type"] == "http.response.body" and not message.get("more_body") and not state.get("stream"):
                timed = path in ("/v1/completions", "/v1/chat/completions")
                svc.metrics.request_done(path, state.get("status", 500), time.monotonic() - t0 if timed else None)
            await send(message)

        return await self.app(scope, receive, counting_send)


def create_app(model, tokenizer, *, model_name: str = "dsl-llada", max_batch: int = ServerConfig.max_batch,
               max_wait_ms: float = ServerConfig.max_wait_ms, max_queue: int = ServerConfig.max_queue,
               api_key: str | None = None, pad_batches: bool = ServerConfig.pad_batches) -> FastAPI:
    """The serving app around an already loaded model (DSLModel or bare backbone) and its tokenizer; the batching
    settings' defaults are ServerConfig's."""
    svc = Service(model, tokenizer, model_name=model_name, max_batch=max_batch, max_wait_ms=max_wait_ms,
                  max_queue=max_queue, api_key=api_key, pad_batches=pad_batches)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await svc.batcher.start()
        try:
            yield
        finally:
            log.info("draining %d queued and %d running jobs", svc.batcher.queue_length, len(svc.batcher.running))
            await svc.batcher.close()

    app = FastAPI(title="dsl-llada", lifespan=lifespan)
    app.state.service = svc
    app.add_middleware(AuthAndCount, service=svc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        if err.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON: {err.get('msg')}", "invalid_request_error")
        param = validation_error_param(tuple(err.get("loc", ())))
        if param is None:
            return _error(400, f"invalid request body: {err.get('msg')}", "invalid_request_error")
        return _error(400, f"invalid value for {param!r}: {err.get('msg')}", "invalid_request_error", param)

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(QueueFull)
    async def on_full(request: Request, exc: QueueFull):
        return _error(429, str(exc), "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})

    @app.exception_handler(ShuttingDown)
    async def on_closing(request: Request, exc: ShuttingDown):
        return _error(503, str(exc), "server_error", code="shutting_down")

    @app.get("/health")
    async def health():
        return {"status": "draining" if svc.batcher.closing else "ok", "model": svc.model_name,
                "queue_length": svc.batcher.queue_length, "running": len(svc.batcher.running),
                "environment": environment_record(**_where(svc.model))}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(svc.metrics.render(queue_length=svc.batcher.queue_length,
                                                    running=len(svc.batcher.running)),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": svc.model_name, "object": "model", "created": svc.created,
                                            "owned_by": "dsl-llada"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        svc.check_model(req)
        prompts = [svc.encode_chat(req)]
        return await _generate(req, prompts, "messages", req.max_completion_tokens or req.max_tokens, chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        svc.check_model(req)
        if req.echo:
            raise RequestError("echo is not supported", "echo")
        return await _generate(req, svc.encode_completion(req), "prompt", req.max_tokens, chat=False)

    async def _generate(req: SamplingFields, prompts: list[list[int]], param: str, max_tokens: int | None, *, chat: bool):
        jobs, name, config, seed, events = svc.make_jobs(req, prompts, param, max_tokens, req.stream)
        svc.batcher.submit(jobs)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if req.stream:
            return StreamingResponse(_stream(req, jobs, name, config, seed, events, rid, chat),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            results: list[JobResult] = list(await asyncio.gather(*(j.future for j in jobs)))
        except asyncio.CancelledError:
            for j in jobs:
                svc.batcher.cancel(j)
            raise
        except Exception as e:  # noqa: BLE001 - the batch failed; this request gets a 500, the server keeps serving
            return _error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
        choices = []
        for j, r in zip(jobs, results):
            text, reason = svc.finish(req, r)
            body = {"index": j.index, "finish_reason": reason}
            body.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text, "logprobs": None})
            choices.append(body)
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": svc.model_name, "choices": choices, "usage": svc.usage(jobs, results),
                "dsl_llada": svc.extension(name, config, seed, results)}

    async def _stream(req, jobs: list[Job], name, config, seed, events: asyncio.Queue, rid: str,
                      chat: bool) -> AsyncIterator[bytes]:
        t0 = time.monotonic()
        status = 200
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(index: int, *, text: str = "", role: bool = False, finish: str | None = None,
                  ext: dict | None = None, **top: Any) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
            body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": svc.model_name,
                                    "choices": [choice], **top}
            if ext is not None:
                body["dsl_llada"] = ext
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

        try:
            if chat:
                for j in jobs:
                    yield chunk(j.index, role=True)
            remaining = len(jobs)
            while remaining:
                index, ev = await events.get()
                if ev is DONE:
                    remaining -= 1
                    continue
                yield chunk(index, ext={"denoising": ev})
            results: list[JobResult] = []
            for j in jobs:
                try:
                    results.append(j.future.result())
                except Exception as e:  # noqa: BLE001
                    status = 500
                    err = error_body(f"generation failed: {type(e).__name__}: {e}", "server_error")
                    yield f"data: {json.dumps(err)}\n\n".encode()
                    return
            for j, r in zip(jobs, results):
                text, reason = svc.finish(req, r)
                if text:
                    yield chunk(j.index, text=text)
                yield chunk(j.index, finish=reason)
            if (req.stream_options or {}).get("include_usage"):
                body = {"id": rid, "object": obj, "created": created, "model": svc.model_name, "choices": [],
                        "usage": svc.usage(jobs, results), "dsl_llada": svc.extension(name, config, seed, results)}
                yield f"data: {json.dumps(body)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            status = 499  # client closed the connection: free its jobs, leave the rest of the batch alone
            for j in jobs:
                if not (j.future is not None and j.future.done()):
                    svc.metrics.cancelled += 1
                svc.batcher.cancel(j)
            raise
        finally:
            svc.metrics.request_done("/v1/chat/completions" if chat else "/v1/completions", status, time.monotonic() - t0)

    return app
