"""Continuous batching: one worker thread runs the step-level engine (`sampling.engine.Engine`), and requests join
its running batch at the next tick.

A bounded FIFO of pending jobs feeds the engine. At every tick boundary the worker moves the queued jobs into the
engine in arrival order (the engine admits them first in, first out while its `max_rows` and batch-token caps
hold), drops the rows of jobs that were cancelled or passed their deadline, and runs one tick: one batched forward
over every live row, whatever its sampler, settings or prompt length. A row leaves the batch when its response is
done, and its request is answered at once; the other rows go on. So a short request sent while a long one runs
starts at the next tick and finishes on its own schedule instead of waiting for the long one.

Each job carries its own seed and gets its own generator, so its tokens are those of the request run alone (up to
the rounding a different batch shape or padding can change in some kernels; docs/serving.md, *Batching*).

`max_wait_ms`: when the engine is idle, the oldest request waits up to this long for others before the first tick
(0: never). Requests the engine cannot run (approximate key/value caching, `kv_cache` other than 'off') run as
before, as one fixed-batch sampler call of up to `max_batch` jobs with the same settings and prompt length
(`runner.BatchRunner`), on the same worker thread at their turn in the FIFO; the engine's rows pause meanwhile.

Cancellation: a job whose client left or whose deadline passed is marked; the worker removes its row from the
engine at the next tick boundary (`Engine.cancel`), and its neighbours go on with the tokens they would have had.
`last_progress` is the monotonic time of the worker's last tick, read by /health.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..sampling.engine import Engine, EngineResult
    from .logprobs import LogprobRecorder
    from .prometheus import Metrics

log = logging.getLogger(__name__)

STUCK_WAIT_S = 5.0
"""After the shutdown grace period and cancelling, how long close() waits for the worker's next tick."""

DONE = object()
"""Put on a job's event queue after its final result (or error) is set."""


def same_torch_threads() -> Callable[[], None]:
    """An initializer giving a new thread the caller's torch intra-op thread count. OpenMP keeps that setting per
    thread, so a worker thread would otherwise use every core, and parallel reductions split differently round
    differently: the same request would not give bitwise the tokens of the library run in the caller's thread."""
    import torch

    n = torch.get_num_threads()
    return lambda: torch.set_num_threads(n)


class QueueFull(RuntimeError):
    """The bounded queue has no room for the request (HTTP 429)."""


class ShuttingDown(RuntimeError):
    """The server is draining and accepts no new work (HTTP 503)."""


class NeverFits(ValueError):
    """A request with more jobs than the queue can ever hold (HTTP 400: retrying cannot help)."""


class RequestTimeout(RuntimeError):
    """The job passed its deadline (HTTP 504)."""


@dataclass(eq=False)
class Job:
    """One response to generate: prompt ids, seed, sampler config, and the key that decides which jobs may share a
    fixed-batch call (the engine itself needs no key: any jobs share its ticks)."""

    key: Hashable
    prompt_ids: list[int]
    seed: int
    index: int = 0
    """Position of this job among its request's responses."""
    config: Any = None
    """The sampler config (SDEConfig / RemaskConfig)."""
    events: asyncio.Queue | None = None
    """Where per-step events go (streaming requests); None = no step events."""
    future: asyncio.Future | None = None
    cancelled: bool = False
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    """Monotonic time the job's first tick (or its fixed-batch call) ended."""
    loop: asyncio.AbstractEventLoop | None = None
    deadline: float | None = None
    """Monotonic time after which the job is cancelled with RequestTimeout (None = none)."""
    timeout_s: float | None = None
    """The request timeout the deadline came from (for the error message)."""
    top_logprobs: int | None = None
    """None = no logprobs; k >= 0 = each token's log-probability and its k most likely alternatives."""
    request_id: int | None = None
    """The engine's id for this job's row (None before it is handed to the engine)."""
    peak_rows: int = 0
    """The most rows that shared a tick with this job (itself included): its `batch_sizes` entry."""
    recorder: LogprobRecorder | None = None
    """The job's logprob recorder (engine rows that asked for logprobs)."""

    @property
    def fixed_batch(self) -> bool:
        """True for jobs the engine refuses (approximate key/value caching): they run as a fixed-batch call."""
        return getattr(self.config, "kv_cache", "off") != "off"

    @property
    def submitted(self) -> asyncio.Future[Any]:
        """The future of a submitted job (its result, or the error its request gets)."""
        if self.future is None:
            raise RuntimeError("the job was not submitted (Batcher.submit)")
        return self.future

    def _settle(self, *, result: Any = None, error: BaseException | None = None, done_event: bool = True) -> None:
        """From any thread: set the job's result or error on its loop, then put DONE on its stream."""
        if self.loop is None:
            return

        def settle() -> None:
            if self.future is not None and not self.future.done():
                if error is None:
                    self.future.set_result(result)
                else:
                    self.future.set_exception(error)
            if self.events is not None and done_event:
                self.events.put_nowait((self.index, DONE))

        self.loop.call_soon_threadsafe(settle)

    def fail_threadsafe(self, error: BaseException) -> None:
        """From the worker thread: stop this job and answer its request with `error` (its stream gets DONE)."""
        self.cancelled = True
        self._settle(error=error)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def emit(self, event: Any) -> None:
        """Thread-safe: deliver a step event to the request's stream (dropped once the client is gone)."""
        if self.events is not None and not self.cancelled and self.loop is not None:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, event))


class RowAdapter:
    """How a job becomes an engine row and an engine result a job's answer (runner.EngineRows implements it)."""

    def submit(self, engine: Engine, job: Job) -> int:
        """Hand `job` to `engine` (its prompt, config, seeded generator and step callback); the engine's id."""
        raise NotImplementedError

    def result(self, job: Job, result: EngineResult) -> Any:
        raise NotImplementedError


class Batcher:
    """Feeds jobs to `engine` on one worker thread (continuous batching; module doc). `rows` turns jobs into engine
    rows and results into answers; `fixed_batch(jobs) -> results` runs the jobs the engine refuses."""

    def __init__(self, engine: Engine, rows: RowAdapter, *, fixed_batch: Callable[[Sequence[Job]], list[Any]],
                 max_wait_ms: float = 0.0, max_queue: int = 256, metrics: Metrics | None = None):
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms={max_wait_ms} must be >= 0")
        if max_queue < 1:
            raise ValueError(f"max_queue={max_queue} must be >= 1")
        self.engine, self.rows, self.fixed_batch, self.metrics = engine, rows, fixed_batch, metrics
        self.max_batch = engine.max_rows
        self.max_wait, self.max_queue = max_wait_ms / 1000.0, max_queue
        self.pending: deque[Job] = deque()
        """Jobs not yet handed to the engine (or to a fixed-batch call)."""
        self.running: list[Job] = []
        """Jobs whose rows are in the engine's running batch (or in the fixed-batch call now running)."""
        self.busy = False
        """True while a tick or a fixed-batch call runs (what /health's stuck check looks at)."""
        self.closing = False
        self.abandoned = False
        """True when close() had to leave a worker thread that made no tick (the process should exit hard)."""
        self.last_progress = time.monotonic()
        """Monotonic time of the worker's last tick or fixed-batch step (what /health reports)."""
        self._order: list[Job] = []
        """Jobs handed to the engine and not finished, in the order they were handed (its admission order)."""
        self._cv = threading.Condition()
        self._task: asyncio.Future | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._thread_init = same_torch_threads()  # the constructing thread's setting (start() may run elsewhere)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsl-llada-sampler",
                                            initializer=self._thread_init)
        self._task = asyncio.get_running_loop().run_in_executor(self._executor, self._work)

    async def drain(self, grace_s: float | None = None) -> None:
        """Stop accepting work and finish everything queued or running; after `grace_s` seconds (None = no limit)
        cancel what is left (queued jobs at once, running ones at the next tick: their requests get 503)."""
        with self._cv:
            self.closing = True
            self._cv.notify_all()
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace_s)
        except asyncio.TimeoutError:
            log.warning("grace period of %gs over: cancelling %d queued and %d running jobs", grace_s,
                        self.queue_length, len(self.running))
            for job in list(self.pending) + list(self._order) + list(self.running):
                self.cancel(job, ShuttingDown("the server shut down before this request finished"))
            try:  # the worker stops at its next tick; one that makes no tick at all is left behind
                await asyncio.wait_for(asyncio.shield(self._task), STUCK_WAIT_S)
            except asyncio.TimeoutError:
                log.error("the sampler thread made no step for %gs after cancelling; leaving it behind",
                          STUCK_WAIT_S)
                self.abandoned = True

    async def close(self, grace_s: float | None = None) -> None:
        """`drain(grace_s)`, then stop the worker thread."""
        await self.drain(grace_s)
        if self._executor is not None:
            self._executor.shutdown(wait=not self.abandoned, cancel_futures=True)

    def progress(self) -> None:
        """Called at every step (any thread): the worker is alive."""
        self.last_progress = time.monotonic()

    # -- requests (event loop) ---------------------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue all of a request's jobs, or none (QueueFull / ShuttingDown)."""
        if self.closing or self._task is None:
            raise ShuttingDown("the server is shutting down and accepts no new requests")
        if len(jobs) > self.max_queue:
            raise NeverFits(f"the request needs {len(jobs)} generation jobs, more than the queue ever holds "
                            f"(max_queue={self.max_queue})")
        queued = self.queue_length
        if queued + len(jobs) > self.max_queue:
            raise QueueFull(f"the request queue is full ({queued} waiting, max_queue={self.max_queue}); retry later")
        loop = asyncio.get_running_loop()
        for job in jobs:
            job.loop = loop
            job.future = loop.create_future()
        with self._cv:
            self.pending.extend(jobs)
            self._cv.notify_all()

    def cancel(self, job: Job, error: BaseException | None = None) -> None:
        """The client is gone (or the server closes): drop a waiting job from the queue; a running one stops
        receiving events and its row leaves the batch at the next tick (the other rows are not touched).
        `error`: what the job's request gets (None = it is cancelled)."""
        job.cancelled = True
        with self._cv:
            try:
                self.pending.remove(job)
            except ValueError:
                pass
            self._cv.notify_all()
        if job.future is not None and not job.future.done():
            if error is None:
                job.future.cancel()
            else:
                job.future.set_exception(error)
                if job.events is not None:
                    job.events.put_nowait((job.index, DONE))

    @property
    def queue_length(self) -> int:
        """Jobs waiting for a row: queued here, or handed to the engine and not admitted yet."""
        return len(self.pending) + self.engine.pending

    # -- worker thread -----------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cv:
                while not self.pending and not self._order:
                    if self.closing:
                        return
                    self._cv.wait()
                self._wait_for_company()
                batch = self._hand_over()
            self.busy = True
            try:
                if batch:
                    self._run_fixed(batch)
                    continue
                self._sweep()
                if len(self.engine):
                    self._tick()
            except Exception:  # the worker never dies: log, and the next iteration goes on
                log.exception("the serving worker failed outside a tick")
            finally:
                self.busy = False
                self.running = self._order[: self.engine.live]

    def _wait_for_company(self) -> None:
        """With the engine idle, let the oldest job wait up to `max_wait` for others (called holding the lock)."""
        if self.max_wait <= 0 or self._order or not self.pending:
            return
        until = self.pending[0].enqueued_at + self.max_wait
        while len(self.pending) < self.max_batch and not self.closing:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self._cv.wait(remaining)

    def _hand_over(self) -> list[Job]:
        """Move queued jobs into the engine in FIFO order (called holding the lock). When a job the engine refuses
        reaches the head, return it with up to `max_batch - 1` queued jobs of its key: that fixed batch runs now."""
        while self.pending:
            head = self.pending[0]
            if head.fixed_batch:
                batch = [j for j in self.pending if j.fixed_batch and j.key == head.key][: self.max_batch]
                for j in batch:
                    self.pending.remove(j)
                return batch
            self.pending.popleft()
            try:
                head.request_id = self.rows.submit(self.engine, head)
            except Exception as e:  # noqa: BLE001  (this request cannot run; the others go on)
                head.fail_threadsafe(e)
                continue
            self._order.append(head)
        return []

    def _sweep(self) -> None:
        """Remove the rows of cancelled jobs and of jobs past their deadline from the engine."""
        now = time.monotonic()
        for job in list(self._order):
            if not job.cancelled and job.expired(now):
                job.fail_threadsafe(RequestTimeout(f"the request passed its deadline of {job.timeout_s:g}s "
                                                   f"(--request-timeout-s) and was cancelled"))
            if job.cancelled:
                assert job.request_id is not None
                self.engine.cancel(job.request_id)
                self._order.remove(job)
                job._settle(error=RuntimeError("the request was cancelled while it ran"), done_event=False)

    def _tick(self) -> None:
        t0 = time.monotonic()
        forwards = self.engine.forward_passes
        try:
            results = self.engine.step()
        except Exception as e:  # the shared forward failed: its rows' requests fail, the worker keeps serving
            log.exception("a tick of %d rows failed", self.engine.live)
            if self.metrics is not None:
                self.metrics.tick_done(0, time.monotonic() - t0, self.engine.forward_passes - forwards, failed=True)
            for job in self._order[: self.engine.live]:
                assert job.request_id is not None
                self.engine.cancel(job.request_id)
                self._order.remove(job)
                job.fail_threadsafe(e)
            self.last_progress = time.monotonic()
            return
        now = self.last_progress = time.monotonic()
        for r in results:  # a request whose set-up failed at admission never had a row
            if r.ticks == 0:
                self._order.remove(r.tag)
        ran = self.engine.live + sum(r.ticks > 0 for r in results)
        for job in self._order[:ran]:  # admission is first in, first out: these shared this tick
            job.peak_rows = max(job.peak_rows, ran)
            if job.started_at is None:
                job.started_at = now
                if self.metrics is not None:
                    self.metrics.first_step_after(now - job.enqueued_at)
        if self.metrics is not None:
            self.metrics.tick_done(ran, now - t0, self.engine.forward_passes - forwards, failed=False)
        for r in results:
            job = r.tag
            if r.ticks > 0:
                self._order.remove(job)
            self._answer(job, r, now)

    def _answer(self, job: Job, r: EngineResult, now: float) -> None:
        if r.error is not None:
            job.fail_threadsafe(r.exception or RuntimeError(r.error))
            return
        if r.dropped:  # its step callback dropped it (the job was cancelled meanwhile)
            job._settle(error=RuntimeError("the request was cancelled while it ran"), done_event=False)
            return
        value = self.rows.result(job, r)
        if self.metrics is not None:
            self.metrics.row_done(len(r.response), now - (job.started_at or now))
        job._settle(result=value, done_event=not job.cancelled)

    def _run_fixed(self, batch: list[Job]) -> None:
        """One fixed-batch call for jobs the engine refuses (module doc)."""
        now = time.monotonic()
        for job in batch:
            job.started_at, job.peak_rows = now, len(batch)
            if self.metrics is not None:
                self.metrics.first_step_after(now - job.enqueued_at)
        self.running = self._order[: self.engine.live] + batch
        self.last_progress = now
        error: BaseException | None = None
        results: list[Any] = []
        try:
            results = self.fixed_batch(batch)
            if len(results) != len(batch):
                raise RuntimeError(f"the fixed-batch call returned {len(results)} results for {len(batch)} jobs")
        except Exception as e:  # one failing batch fails its own requests only; the worker keeps serving
            log.exception("batch of %d failed", len(batch))
            error = e
        seconds = time.monotonic() - now
        self.last_progress = time.monotonic()
        if self.metrics is not None:  # before the answers: a client reading /metrics next sees this call
            done = [r for r in results if r is not None]
            self.metrics.batch_done(len(batch), seconds, sum(len(r.ids) for r in done),
                                    done[0].forward_passes if done else 0, error is not None)
        for i, job in enumerate(batch):
            if error is not None:
                job._settle(error=error, done_event=not job.cancelled)
            elif results[i] is None:  # dropped: cancelled or past its deadline while the batch ran
                job._settle(error=RuntimeError("the request was cancelled while its batch ran"), done_event=False)
            else:
                job._settle(result=results[i], done_event=not job.cancelled)
