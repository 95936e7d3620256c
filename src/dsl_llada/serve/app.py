"""The OpenAI-compatible FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Each route is a plain function over the app's `Service` (`request.app.state.service`); requests become jobs for
the `Batcher` (continuous batching on the step-level engine); `stream: true` answers with server-sent events
(`stream.py`). Every error is an OpenAI-style JSON body; in a stream that already began, one final error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .batcher import Job, NeverFits, QueueFull, ShuttingDown
from .limits import Limits
from .middleware import Gate, _error
from .schemas import ChatRequest, CompletionRequest, RequestError, SamplingFields, validation_error_param
from ..core.backbones.base import FROM_MODEL, FromModel
from .service import Service
from .settings import ServerConfig
from .stream import Chunks, dumps, failure_body, stream

__all__ = ["create_app", "dumps", "failure_body"]

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25
"""How often a non-streaming request checks that its client is still connected."""


def create_app(model: Any, tokenizer: Any, *, model_name: str = "dsl-llada", server: ServerConfig | None = None,
               api_key: str | None = None, limits: Limits | None = None, allowed_hosts: set[str] | None = None,
               bind_host: str = "127.0.0.1", shutdown_grace_s: float | None = 30.0,
               environment: dict[str, Any] | None = None, context: int | None | FromModel = FROM_MODEL) -> FastAPI:
    """The serving app around an already loaded model (DSLModel or bare backbone) and its tokenizer.

    `server`: how the engine batches requests (default: `ServerConfig()`); `limits`: request bounds (default:
    derived from the model, `Limits.for_model`); `allowed_hosts`: Host header names accepted (None = no check; the
    CLI always passes `middleware.allowed_hosts(...)`); `shutdown_grace_s`: how long a shutdown waits for
    queued/running work before cancelling it; `environment`: the record /health shows; `context`: the model's
    longest prompt + response (default: read from the model; `open_serve_app` passes its `ModelHandle`'s).
    """
    svc = Service(model, tokenizer, model_name=model_name, server=server or ServerConfig(), api_key=api_key,
                  limits=limits, environment=environment, context=context)
    app = FastAPI(title="dsl-llada", lifespan=lifespan)
    app.state.service = svc
    app.state.shutdown_grace_s = shutdown_grace_s
    app.state.begin_shutdown = lambda: svc.begin_shutdown(shutdown_grace_s)
    app.add_middleware(Gate, service=svc, hosts=allowed_hosts, bind=bind_host)
    for error, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(error, handler)
    for path, endpoint, method in ROUTES:
        app.add_api_route(path, endpoint, methods=[method], response_model=None)
    return app


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the batcher's worker; on shutdown drain it (queued and running jobs get the grace period)."""
    svc = service_of(app)
    await svc.batcher.start()
    svc.loop = asyncio.get_running_loop()
    try:
        yield
    finally:
        log.info("draining %d queued and %d running jobs", svc.batcher.queue_length, len(svc.batcher.running))
        await svc.batcher.close(app.state.shutdown_grace_s)
        svc.text_pool.shutdown(wait=False, cancel_futures=True)


def service_of(app: FastAPI) -> Service:
    return cast(Service, app.state.service)


# -- routes ---------------------------------------------------------------------------------------------------------
async def health(request: Request) -> Response:
    status, body = service_of(request.app).health()
    return JSONResponse(body, status_code=status)


async def metrics(request: Request) -> Response:
    svc = service_of(request.app)
    text = svc.metrics.render(queue_length=svc.batcher.queue_length, running=len(svc.batcher.running),
                              batch_tokens=svc.engine.batch_tokens)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def models(request: Request) -> Response:
    svc = service_of(request.app)
    return JSONResponse({"object": "list", "data": [{"id": svc.model_name, "object": "model", "created": svc.created,
                                                     "owned_by": "dsl-llada"}]})


async def chat(req: ChatRequest, request: Request) -> Response:
    svc = service_of(request.app)
    svc.check_request(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
    size = sum(len(m.text()) for m in req.messages)
    prompts = [await svc.off_loop(size, svc.encode_chat, req)]
    top = (req.top_logprobs or 0) if req.logprobs else None
    return await respond(svc, req, request, prompts, "messages", req.max_completion_tokens or req.max_tokens,
                         chat=True, top=top)


async def completions(req: CompletionRequest, request: Request) -> Response:
    svc = service_of(request.app)
    svc.check_request(req)
    if req.echo:
        raise RequestError("echo is not supported", "echo", code="unsupported_field")
    p = req.prompt
    size = len(p) if isinstance(p, str) else sum(len(x) if isinstance(x, str) else 1 for x in p)
    prompts = await svc.off_loop(size, svc.encode_completion, req)
    return await respond(svc, req, request, prompts, "prompt", req.max_tokens, chat=False, top=req.logprobs)


ROUTES: list[tuple[str, Callable[..., Awaitable[Response]], str]] = [
    ("/health", health, "GET"), ("/metrics", metrics, "GET"), ("/v1/models", models, "GET"),
    ("/v1/chat/completions", chat, "POST"), ("/v1/completions", completions, "POST")]


# -- one request's jobs to its response -----------------------------------------------------------------------------
async def respond(svc: Service, req: SamplingFields, request: Request, prompts: list[list[int]], param: str,
                  max_tokens: int | None, *, chat: bool, top: int | None) -> Response:
    """Queue the request's jobs; stream their events, or wait for them and answer with every choice."""
    jobs, name, config, seed, events = svc.make_jobs(req, prompts, param, max_tokens, req.stream, top)
    svc.batcher.submit(jobs)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    if events is not None:
        chunks = Chunks(rid, svc.model_name, chat)
        return StreamingResponse(stream(svc, req, jobs, (name, config, seed), events, chunks),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        results = await wait_or_leave(svc, jobs, request)
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
    choices = []
    for j, r in zip(jobs, results):
        text, reason, logprobs = await svc.off_loop(r.text_cost, svc.finish, req, r, chat)
        choice: dict[str, Any] = {"index": j.index, "finish_reason": reason}
        if chat:
            choice.update({"message": {"role": "assistant", "content": text}, "logprobs": logprobs})
        else:
            choice.update({"text": text, "logprobs": logprobs})
        choices.append(choice)
    return JSONResponse({  # Starlette's JSONResponse is strict JSON too (allow_nan=False)
        "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
        "model": svc.model_name, "choices": choices, "usage": svc.usage(jobs, results),
        "dsl_llada": svc.extension(name, config, seed, results)})


async def wait_or_leave(svc: Service, jobs: list[Job], request: Request) -> list[Any] | None:
    """The jobs' results (an exception in place of a failed job's), or None when the client disconnected first
    (its jobs are then cancelled: queued ones leave the queue, running ones the batch at the next tick)."""
    futures = [j.submitted for j in jobs]
    while True:
        done, pending = await asyncio.wait(futures, timeout=DISCONNECT_POLL_S)
        if not pending:
            return [f.exception() or f.result() for f in futures]
        if await request.is_disconnected():
            for j in jobs:
                svc.batcher.cancel(j)
            svc.metrics.cancelled += len(jobs)
            return None


# -- errors ---------------------------------------------------------------------------------------------------------
async def on_invalid(request: Request, exc: Exception) -> Response:
    """A request body that does not parse or fails its schema: 400 naming the field."""
    errors = cast(RequestValidationError, exc).errors()
    err = errors[0]
    if err.get("type") == "json_invalid":
        return _error(400, f"the request body is not valid JSON: {err.get('msg')}", "invalid_request_error")
    param = validation_error_param(tuple(err.get("loc", ())))
    if param is None:
        return _error(400, f"invalid request body: {err.get('msg')}", "invalid_request_error")
    # a union field fails once per member: say what each member expected
    msgs = list(dict.fromkeys(str(e.get("msg")) for e in errors if validation_error_param(tuple(e.get("loc", ()))) == param))
    return _error(400, f"invalid value for {param!r}: {'; or: '.join(msgs)}", "invalid_request_error", param)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """An HTTP error raised before the route (e.g. a body that is not UTF-8): the OpenAI error body."""
    e = cast(StarletteHTTPException, exc)
    detail = e.detail if isinstance(e.detail, str) else json.dumps(e.detail)
    return _error(e.status_code, detail, "invalid_request_error", headers=getattr(e, "headers", None))


async def on_request_error(request: Request, exc: Exception) -> Response:
    e = cast(RequestError, exc)
    return JSONResponse(e.body(), status_code=e.status)


async def on_never_fits(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc), "invalid_request_error", code="request_too_large")


async def on_full(request: Request, exc: Exception) -> Response:
    return _error(429, str(exc), "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})


async def on_closing(request: Request, exc: Exception) -> Response:
    return _error(503, str(exc), "server_error", code="shutting_down")


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s", request.url.path)
    return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


ERROR_HANDLERS: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
    RequestValidationError: on_invalid, StarletteHTTPException: on_http_error, RequestError: on_request_error, NeverFits: on_never_fits,
    QueueFull: on_full, ShuttingDown: on_closing, Exception: on_unexpected}
