"""Server-sent events of a `stream: true` request: one `dsl_llada` extension chunk per denoising step of each
response (docs/serving.md, "Streamed denoising"), then the final text as ordinary deltas, the usage chunk when
asked, and [DONE]. Anything that fails after the stream began is one final error event."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .batcher import DONE, Job, RequestTimeout, ShuttingDown
from .runner import JobResult
from .schemas import SamplingFields, error_body
from .service import Service

log = logging.getLogger(__name__)


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


def event(body: Any) -> bytes:
    """One server-sent event holding `body` as JSON."""
    return f"data: {dumps(body)}\n\n".encode()


@dataclass
class Chunks:
    """The chunk bodies of one streamed response (chat deltas or completion texts)."""

    rid: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def choice(self, index: int, *, text: str = "", role: bool = False, finish: str | None = None,
               ext: dict[str, Any] | None = None, logprobs: Any = None) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
        body: dict[str, Any] = {"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                                "choices": [choice]}
        if ext is not None:
            body["dsl_llada"] = ext
        return event(body)

    def usage(self, usage: dict[str, int], ext: dict[str, Any]) -> bytes:
        return event({"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                      "choices": [], "usage": usage, "dsl_llada": ext})


def finished_results(jobs: list[Job]) -> list[JobResult] | BaseException:
    """Every job's result, or the error of the first that did not finish (cancelled: ShuttingDown)."""
    results: list[JobResult] = []
    for j in jobs:
        f = j.future
        if f is None or not f.done() or f.cancelled():
            return ShuttingDown("the request was cancelled")
        if f.exception() is not None:
            return f.exception() or ShuttingDown("the request was cancelled")
        results.append(f.result())
    return results


async def stream(svc: Service, req: SamplingFields, jobs: list[Job], sampling: tuple[str, Any, int],
                 events: asyncio.Queue[Any], chunks: Chunks) -> AsyncIterator[bytes]:
    """The events of one streamed request; `sampling` is (sampler name, config, seed)."""
    t0, status = time.monotonic(), 200
    try:
        if chunks.chat:
            for j in jobs:
                yield chunks.choice(j.index, role=True)
        remaining = len(jobs)
        while remaining:
            index, ev = await events.get()
            if ev is DONE:
                remaining -= 1
            else:
                yield chunks.choice(index, ext={"denoising": ev})
        results = finished_results(jobs)
        if isinstance(results, BaseException):
            status, err = failure_body(results)
            yield event(err)  # one final error event
            return
        for j, r in zip(jobs, results):
            text, reason, logprobs = await svc.off_loop(r.text_cost, svc.finish, req, r, chunks.chat)
            if text or logprobs is not None:
                yield chunks.choice(j.index, text=text, logprobs=logprobs)
            yield chunks.choice(j.index, finish=reason)
        if (req.stream_options or {}).get("include_usage"):
            yield chunks.usage(svc.usage(jobs, results), svc.extension(*sampling, results))
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
        yield event(error_body(f"internal error: {type(e).__name__}: {e}", "server_error"))
    finally:
        svc.metrics.request_done("/v1/chat/completions" if chunks.chat else "/v1/completions", status,
                                 time.monotonic() - t0)
