"""Dynamic batching: requests with the same sampler settings run as one batched sampler call.

A bounded FIFO of pending jobs; one worker task takes the oldest job together with up to `max_batch - 1` queued jobs
with the same key and runs them on a single sampler thread. By default (`max_wait_ms=0`) it never waits: a lone
request starts at once, and requests that arrive while a batch runs form the next batch. One adaptive exception,
the *linger*: when a batch has just finished and fewer compatible jobs are queued than that batch's live jobs plus
those that waited during it, the clients it answered are likely to send their next request within milliseconds, so
the worker waits for them, at most `LINGER_FRACTION` of the next batch's estimated run time (capped at
`LINGER_MAX_S`); a lone client never waits (its own next request is all that batch expects). Without it, 16
clients looping on a server drift into alternating batches of 1 and 15. Each job carries its own seed, so its tokens
do not depend on its batch (the samplers draw from one generator per row).

Cancellation: a job whose client left or whose deadline passed is marked; the runner's step callback sees the mark
at the next step, answers that job at once and removes its row from the running batch (`StepInfo.drop`); its
neighbours go on with the tokens they would have had (their rows have their own generators), and a batch with no
live job left stops at that step. `run_batch` returns None for a dropped job.
`last_progress` is the monotonic time of the worker's last step, read by /health.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

STUCK_WAIT_S = 5.0
"""After the shutdown grace period and cancelling, how long close() waits for the running batch's next step."""

LINGER_FRACTION = 0.05
"""The linger's bound, relative to the estimated run time of the batch it waits to fill."""
LINGER_MAX_S = 0.05
"""The linger's absolute bound in seconds."""

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
    """One response to generate: prompt ids, seed, and the settings key that decides what it may be batched with."""

    key: Hashable
    prompt_ids: list[int]
    seed: int
    index: int = 0
    """Position of this job among its request's responses."""
    events: asyncio.Queue | None = None
    """Where per-step events go (streaming requests); None = no step events."""
    future: asyncio.Future | None = None
    cancelled: bool = False
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    loop: asyncio.AbstractEventLoop | None = None
    deadline: float | None = None
    """Monotonic time after which the job is cancelled with RequestTimeout (None = none)."""
    timeout_s: float | None = None
    """The request timeout the deadline came from (for the error message)."""
    top_logprobs: int | None = None
    """None = no logprobs; k >= 0 = each token's log-probability and its k most likely alternatives."""

    @property
    def submitted(self) -> asyncio.Future[Any]:
        """The future of a submitted job (its result, or the error its request gets)."""
        if self.future is None:
            raise RuntimeError("the job was not submitted (Batcher.submit)")
        return self.future

    def fail_threadsafe(self, error: BaseException) -> None:
        """From the sampler thread: stop this job and answer its request with `error` (its stream gets DONE)."""
        self.cancelled = True
        if self.loop is None:
            return

        def settle() -> None:
            if self.future is not None and not self.future.done():
                self.future.set_exception(error)
            if self.events is not None:
                self.events.put_nowait((self.index, DONE))

        self.loop.call_soon_threadsafe(settle)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def emit(self, event: Any) -> None:
        """Thread-safe: deliver a step event to the request's stream (dropped once the client is gone)."""
        if self.events is not None and not self.cancelled and self.loop is not None:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, event))


class Batcher:
    """Groups compatible jobs and runs `run_batch(jobs) -> results` (one result per job) on one worker thread."""

    def __init__(self, run_batch: Callable[[Sequence[Job]], list[Any]], *, max_batch: int = 8, max_wait_ms: float = 0.0,
                 max_queue: int = 256, on_batch: Callable[[Sequence[Job], float, BaseException | None], None] | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms={max_wait_ms} must be >= 0")
        if max_queue < 1:
            raise ValueError(f"max_queue={max_queue} must be >= 1")
        self.run_batch, self.on_batch = run_batch, on_batch
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self.pending: deque[Job] = deque()
        self.running: list[Job] = []
        self.closing = False
        self.abandoned = False
        """True when close() had to leave a sampler thread that made no step (the process should exit hard)."""
        self.last_progress = time.monotonic()
        """Monotonic time of the worker's last step or batch start/end (what /health reports)."""
        self._linger: tuple[Hashable, int, float] | None = None
        """After a batch: (its key, how many compatible jobs the next batch expects, monotonic time to stop waiting)."""
        self.linger_waits = 0
        """How many times the worker lingered (waited for the clients of the batch that had just finished)."""
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._thread_init = same_torch_threads()  # the constructing thread's setting (start() may run elsewhere)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsl-llada-sampler",
                                            initializer=self._thread_init)
        self._task = asyncio.create_task(self._loop(), name="dsl-llada-batcher")

    async def drain(self, grace_s: float | None = None) -> None:
        """Stop accepting work and finish everything queued or running; after `grace_s` seconds (None = no limit)
        cancel what is left (queued jobs at once, running ones at their next step: their requests get 503)."""
        self.closing = True
        if self._wake is not None:
            self._wake.set()
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace_s)
        except asyncio.TimeoutError:
            log.warning("grace period of %gs over: cancelling %d queued and %d running jobs", grace_s,
                        len(self.pending), len(self.running))
            for job in list(self.pending) + list(self.running):
                self.cancel(job, ShuttingDown("the server shut down before this request finished"))
            try:  # a running batch stops at its next step; one that makes no step at all is left behind
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
        """Called by the runner at every step (any thread): the worker is alive."""
        self.last_progress = time.monotonic()

    # -- requests ----------------------------------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue all of a request's jobs, or none (QueueFull / ShuttingDown)."""
        if self.closing or self._wake is None:
            raise ShuttingDown("the server is shutting down and accepts no new requests")
        if len(jobs) > self.max_queue:
            raise NeverFits(f"the request needs {len(jobs)} generation jobs, more than the queue ever holds "
                            f"(max_queue={self.max_queue})")
        if len(self.pending) + len(jobs) > self.max_queue:
            raise QueueFull(f"the request queue is full ({len(self.pending)} waiting, max_queue={self.max_queue}); "
                            f"retry later")
        loop = asyncio.get_running_loop()
        for job in jobs:
            job.loop = loop
            job.future = loop.create_future()
            self.pending.append(job)
        self._wake.set()

    def cancel(self, job: Job, error: BaseException | None = None) -> None:
        """The client is gone (or the server closes): drop a waiting job from the queue; a running one stops
        receiving events and its row leaves the batch at the next step (the rest of its batch is not touched; a
        batch with no live job left stops). `error`: what the job's request gets (None = it is cancelled)."""
        job.cancelled = True
        try:
            self.pending.remove(job)
        except ValueError:
            pass
        if job.future is not None and not job.future.done():
            if error is None:
                job.future.cancel()
            else:
                job.future.set_exception(error)
                if job.events is not None:
                    job.events.put_nowait((job.index, DONE))

    @property
    def queue_length(self) -> int:
        return len(self.pending)

    # -- worker ------------------------------------------------------------------------------------------------------
    def _compatible(self, key: Hashable) -> list[Job]:
        return [j for j in self.pending if j.key == key][: self.max_batch]

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self.pending:
                if self.closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self.pending[0]
            await self._linger_for(head.key)
            await self._wait_until(lambda: len(self._compatible(head.key)) >= self.max_batch or self.closing
                                   or head not in self.pending, head.enqueued_at + self.max_wait)
            if not self.pending:
                continue
            head = self.pending[0]  # the old head may have been cancelled while we waited
            batch = self._compatible(head.key)
            for job in batch:
                self.pending.remove(job)
            await self._run(batch)

    async def _linger_for(self, key: Hashable) -> None:
        """Right after a batch of `key`: wait (bounded) until the jobs that batch expects are back (module doc)."""
        linger, self._linger = self._linger, None
        if linger is None or linger[0] != key:
            return
        _, want, until = linger
        if len(self._compatible(key)) < want and not self.closing:
            self.linger_waits += 1
        await self._wait_until(lambda: len(self._compatible(key)) >= want or self.closing, until)

    async def _wait_until(self, done: Callable[[], bool], until: float) -> None:
        """Sleep on the wake-up event until `done()` or the monotonic time `until`, whichever comes first."""
        assert self._wake is not None
        while not done():
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _expect_after(self, batch: list[Job], seconds: float) -> None:
        """Set the linger after `batch` (which ran `seconds`): its live jobs' clients and the jobs queued meanwhile."""
        live = sum(not j.cancelled for j in batch)
        queued = len(self._compatible(batch[0].key))
        want = min(self.max_batch, live + queued)
        if live == 0 or want <= queued:
            self._linger = None
            return
        estimate = seconds / len(batch) * want  # run time of the next batch, from this one's per-row time
        self._linger = (batch[0].key, want, time.monotonic() + min(LINGER_MAX_S, LINGER_FRACTION * estimate))

    async def _run(self, batch: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for job in batch:
            job.started_at = now
        self.running = batch
        self.last_progress = now
        error: BaseException | None = None
        results: list[Any] = []
        try:
            results = await loop.run_in_executor(self._executor, self.run_batch, batch)
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} jobs")
        except Exception as e:  # one failing batch fails its own requests only; the worker keeps serving
            log.exception("batch of %d failed", len(batch))
            error = e
        finally:
            self.running = []
            self.last_progress = time.monotonic()
        for i, job in enumerate(batch):
            if job.future is not None and not job.future.done():
                if error is None and job.cancelled and results[i] is None:  # dropped; its cancel did not settle it
                    job.future.set_exception(RuntimeError("the request was cancelled while its batch ran"))
                elif error is None:
                    job.future.set_result(results[i])
                else:
                    job.future.set_exception(error)
            if job.events is not None and not job.cancelled:
                job.events.put_nowait((job.index, DONE))
        if error is None:
            self._expect_after(batch, time.monotonic() - now)
        if self.on_batch is not None:
            self.on_batch(batch, time.monotonic() - now, error)
