"""The OpenAI-compatible FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Requests become jobs for the `Batcher` (dynamic batching); `stream: true` answers with server-sent events that
carry each denoising step under the extension key `dsl_llada` (docs/serving.md, "Streamed denoising"), then the
final text as ordinary deltas and [DONE]. Every error is an OpenAI-style JSON body; in a stream that already began,
one final error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .batcher import DONE, Job, NeverFits, QueueFull, RequestTimeout, ShuttingDown
from .limits import Limits
from .middleware import Gate, _error
from .runner import JobResult
from .schemas import ChatRequest, CompletionRequest, RequestError, SamplingFields, error_body, validation_error_param
from .service import Service
from .settings import ServerConfig

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25
"""How often a non-streaming request checks that its client is still connected."""


def failure_body(e: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, OpenAI error body) for a job that did not finish."""
    if isinstance(e, RequestTimeout):
        return 504, error_body(str(e), "timeout_error", code="request_timeout")
    if isinstance(e, ShuttingDown):
        return 503, error_body(str(e), "server_error", code="shutting_down")
    return 500, error_body(f"generation failed: {type(e).__name__}: {e}", "server_error")


def dumps(body: Any) -> str:
    """Strict JSON (a NaN or Infinity would be invalid JSON for every client: never send one)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False)


def create_app(model, tokenizer, *, model_name: str = "dsl-llada", max_batch: int = ServerConfig.max_batch,
               max_wait_ms: float = ServerConfig.max_wait_ms, max_queue: int = ServerConfig.max_queue,
               api_key: str | None = None, pad_batches: bool = ServerConfig.pad_batches,
               limits: Limits | None = None, allowed_hosts: set[str] | None = None, bind_host: str = "127.0.0.1",
               shutdown_grace_s: float | None = 30.0, environment: dict[str, Any] | None = None) -> FastAPI:
    """The serving app around an already loaded model (DSLModel or bare backbone) and its tokenizer; the batching
    settings' defaults are ServerConfig's.

    `limits`: request bounds (default: derived from the model, `Limits.for_model`); `allowed_hosts`: Host header
    names accepted (None = no check; the CLI always passes `middleware.allowed_hosts(...)`); `shutdown_grace_s`:
    how long a shutdown waits for queued/running work before cancelling it; `environment`: the record /health shows.
    """
    svc = Service(model, tokenizer, model_name=model_name, max_batch=max_batch, max_wait_ms=max_wait_ms,
                  max_queue=max_queue, api_key=api_key, pad_batches=pad_batches, limits=limits,
                  environment=environment)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await svc.batcher.start()
        svc.loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            log.info("draining %d queued and %d running jobs", svc.batcher.queue_length, len(svc.batcher.running))
            await svc.batcher.close(shutdown_grace_s)
            svc.text_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="dsl-llada", lifespan=lifespan)
    app.state.service = svc
    app.state.begin_shutdown = lambda: svc.begin_shutdown(shutdown_grace_s)
    app.add_middleware(Gate, service=svc, hosts=allowed_hosts, bind=bind_host)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        if err.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON: {err.get('msg')}", "invalid_request_error")
        param = validation_error_param(tuple(err.get("loc", ())))
        if param is None:
            return _error(400, f"invalid request body: {err.get('msg')}", "invalid_request_error")
        # a union field fails once per member: say what each member expected
        msgs = list(dict.fromkeys(str(e.get("msg")) for e in exc.errors()
                                  if validation_error_param(tuple(e.get("loc", ()))) == param))
        return _error(400, f"invalid value for {param!r}: {'; or: '.join(msgs)}", "invalid_request_error", param)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):  # e.g. a body that is not UTF-8
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return _error(exc.status_code, detail, "invalid_request_error", headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(NeverFits)
    async def on_never_fits(request: Request, exc: NeverFits):
        return _error(400, str(exc), "invalid_request_error", code="request_too_large")

    @app.exception_handler(QueueFull)
    async def on_full(request: Request, exc: QueueFull):
        return _error(429, str(exc), "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})

    @app.exception_handler(ShuttingDown)
    async def on_closing(request: Request, exc: ShuttingDown):
        return _error(503, str(exc), "server_error", code="shutting_down")

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.get("/health")
    async def health():
        status, body = svc.health()
        return JSONResponse(body, status_code=status)

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
    async def chat(req: ChatRequest, request: Request):
        svc.check_request(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
        size = sum(len(m.text()) for m in req.messages)
        prompts = [await svc.off_loop(size, svc.encode_chat, req)]
        top = (req.top_logprobs or 0) if req.logprobs else None
        return await _generate(req, request, prompts, "messages", req.max_completion_tokens or req.max_tokens,
                               chat=True, top=top)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        svc.check_request(req)
        if req.echo:
            raise RequestError("echo is not supported", "echo", code="unsupported_field")
        p = req.prompt
        size = len(p) if isinstance(p, str) else sum(len(x) if isinstance(x, str) else 1 for x in p)
        prompts = await svc.off_loop(size, svc.encode_completion, req)
        return await _generate(req, request, prompts, "prompt", req.max_tokens, chat=False, top=req.logprobs)

    async def _generate(req: SamplingFields, request: Request, prompts: list[list[int]], param: str,
                        max_tokens: int | None, *, chat: bool, top: int | None):
        jobs, name, config, seed, events = svc.make_jobs(req, prompts, param, max_tokens, req.stream, top)
        svc.batcher.submit(jobs)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if req.stream:
            return StreamingResponse(_stream(req, jobs, name, config, seed, events, rid, chat),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            results = await _wait_or_leave(jobs, request)
        except asyncio.CancelledError:
            for j in jobs:
                svc.batcher.cancel(j)
            raise
        if results is None:  # the client left: its jobs were cancelled; nobody reads this response
            return _error(499, "client closed the request", "invalid_request_error", code="client_closed")
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            status, body = failure_body(failed)
            return JSONResponse(body, status_code=status)
        finished = [await svc.off_loop(len(r.ids) * (1 + (r.logprobs is not None)), svc.finish, req, r, chat)
                    for r in results]
        choices = []
        for j, (text, reason, logprobs) in zip(jobs, finished):
            body: dict[str, Any] = {"index": j.index, "finish_reason": reason}
            if chat:
                body.update({"message": {"role": "assistant", "content": text}, "logprobs": logprobs})
            else:
                body.update({"text": text, "logprobs": logprobs})
            choices.append(body)
        return JSONResponse({  # Starlette's JSONResponse is strict JSON too (allow_nan=False)
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": svc.model_name, "choices": choices, "usage": svc.usage(jobs, results),
            "dsl_llada": svc.extension(name, config, seed, results)})

    async def _wait_or_leave(jobs: list[Job], request: Request) -> list[Any] | None:
        """The jobs' results (an exception in place of a failed job's), or None when the client disconnected
        first (its jobs are then cancelled: queued ones leave the queue, running ones their batch's next step)."""
        futures = [j.future for j in jobs]
        while True:
            done, pending = await asyncio.wait(futures, timeout=DISCONNECT_POLL_S)
            if not pending:
                return [f.exception() or f.result() for f in futures]
            if await request.is_disconnected():
                for j in jobs:
                    svc.batcher.cancel(j)
                svc.metrics.cancelled += len(jobs)
                return None

    async def _stream(req, jobs: list[Job], name, config, seed, events: asyncio.Queue, rid: str,
                      chat: bool) -> AsyncIterator[bytes]:
        t0 = time.monotonic()
        status = 200
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(index: int, *, text: str = "", role: bool = False, finish: str | None = None,
                  ext: dict | None = None, logprobs: Any = None, **top: Any) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish,
                                          "logprobs": logprobs}
            else:
                choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
            body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": svc.model_name,
                                    "choices": [choice], **top}
            if ext is not None:
                body["dsl_llada"] = ext
            return f"data: {dumps(body)}\n\n".encode()

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
                e = j.future.exception() if j.future.done() and not j.future.cancelled() else None
                if e is not None or not j.future.done() or j.future.cancelled():
                    status, err = failure_body(e or ShuttingDown("the request was cancelled"))
                    yield f"data: {dumps(err)}\n\n".encode()  # one final error event
                    return
                results.append(j.future.result())
            for j, r in zip(jobs, results):
                text, reason, logprobs = await svc.off_loop(len(r.ids) * (1 + (r.logprobs is not None)), svc.finish,
                                                            req, r, chat)
                if text or logprobs is not None:
                    yield chunk(j.index, text=text, logprobs=logprobs)
                yield chunk(j.index, finish=reason)
            if (req.stream_options or {}).get("include_usage"):
                body = {"id": rid, "object": obj, "created": created, "model": svc.model_name, "choices": [],
                        "usage": svc.usage(jobs, results), "dsl_llada": svc.extension(name, config, seed, results)}
                yield f"data: {dumps(body)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            status = 499  # client closed the connection: free its jobs, leave the rest of the batch alone
            for j in jobs:
                if not (j.future is not None and j.future.done()):
                    svc.metrics.cancelled += 1
                svc.batcher.cancel(j)
            raise
        except Exception as e:  # anything else after the stream began: one final error event
            status = 500
            log.exception("stream failed")
            yield f"data: {dumps(error_body(f'internal error: {type(e).__name__}: {e}', 'server_error'))}\n\n".encode()
        finally:
            svc.metrics.request_done("/v1/chat/completions" if chat else "/v1/completions", status, time.monotonic() - t0)

    return app
