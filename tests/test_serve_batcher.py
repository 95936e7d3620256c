"""The serving worker on its own (no model, no HTTP): a scripted engine where a job's row needs `prompt_ids[0]`
ticks. Rows join at tick boundaries in FIFO order under the row cap and leave when done; the queue bound; cancelling
a waiting job; a failing tick; step events; draining on close."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import pytest

from dsl_llada.serve.batcher import DONE, Batcher, Job, QueueFull, RowAdapter, ShuttingDown


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


@dataclass
class Result:
    tag: Any
    ticks: int
    error: str | None = None
    exception: BaseException | None = None
    dropped: bool = False


class ScriptedEngine:
    """The engine's interface: submit / cancel / step / live / pending; a row finishes after its ticks. `gate`
    (when set) must be open for a tick to run; a live job with seed 99 makes the tick raise."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.forward_passes = 0
        self.ticks = 0
        self.batch_tokens = 0
        self.log: list[list[int]] = []
        self.gate: threading.Event | None = None
        self._pending: deque[list[Any]] = deque()
        self._live: list[list[Any]] = []
        self._ids = 0

    def submit(self, job: Job, callback) -> int:
        self._ids += 1
        self._pending.append([self._ids, job, job.prompt_ids[0], 0, callback])
        return self._ids

    def cancel(self, request_id: int) -> None:
        for q in (self._pending, self._live):
            for row in list(q):
                if row[0] == request_id:
                    q.remove(row)

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def __len__(self) -> int:
        return len(self._live) + len(self._pending)

    def step(self) -> list[Result]:
        while self._pending and len(self._live) < self.max_rows:
            self._live.append(self._pending.popleft())
        if self.gate is not None:
            self.gate.wait(10)
        if any(row[1].seed == 99 for row in self._live):
            raise RuntimeError("boom")
        self.ticks += 1
        self.forward_passes += 1
        self.log.append([row[1].seed for row in self._live])
        done = []
        for row in list(self._live):
            row[3] += 1
            row[4]({"step": row[3]})
            if row[3] == row[2]:
                self._live.remove(row)
                done.append(Result(row[1], row[3]))
        return done


class Rows(RowAdapter):
    def submit(self, engine, job: Job) -> int:
        return engine.submit(job, job.emit)

    def result(self, job: Job, result) -> Any:
        return (job.seed * 10, job.peak_rows)


def make(max_rows: int, **kw) -> tuple[Batcher, ScriptedEngine]:
    engine = ScriptedEngine(max_rows)
    fixed = kw.pop("fixed_batch", lambda jobs: [(j.seed, len(jobs)) for j in jobs])
    return Batcher(engine, Rows(), fixed_batch=fixed, **kw), engine  # type: ignore[arg-type]


def test_rows_join_at_tick_boundaries_in_fifo_order_and_leave_when_done():
    """A needs 5 ticks, B 2, C 3, with room for 2 rows: C takes B's place at the tick after B finished."""
    async def main():
        b, engine = make(2)
        await b.start()
        jobs = [Job(key="k", prompt_ids=[n], seed=s) for n, s in ((5, 1), (2, 2), (3, 3))]
        b.submit(jobs)
        finished: list[int] = []
        for f in asyncio.as_completed([j.submitted for j in jobs]):
            finished.append((await f)[0])
        await b.close()
        return engine.log, finished, [j.submitted.result() for j in jobs]

    log, finished, results = run(main())
    assert log == [[1, 2], [1, 2], [1, 3], [1, 3], [1, 3]]
    assert finished[0] == 20 and sorted(finished) == [10, 20, 30]
    assert results == [(10, 2), (20, 2), (30, 2)]  # each job's answer and the most rows it shared a tick with


def test_queue_bound_cancel_failure_and_drain():
    async def main():
        b, engine = make(1, max_queue=2)
        engine.gate = threading.Event()
        await b.start()
        first = Job(key="k", prompt_ids=[1], seed=1)
        b.submit([first])
        while not b.busy:  # the worker runs its first tick (held at the gate): the queue is empty again
            await asyncio.sleep(0.001)
        waiting = Job(key="k", prompt_ids=[1], seed=2, events=asyncio.Queue())
        bad = Job(key="k", prompt_ids=[1], seed=99)
        b.submit([waiting, bad])
        with pytest.raises(QueueFull, match="max_queue=2"):
            b.submit([Job(key="k", prompt_ids=[1], seed=3)])
        b.cancel(waiting)  # a client that left while queued frees its slot at once
        assert b.queue_length == 1 and waiting.submitted.cancelled()
        last = Job(key="k", prompt_ids=[2], seed=4)
        b.submit([last])
        engine.gate.set()
        close = asyncio.create_task(b.close())  # drains: everything queued still runs
        await asyncio.sleep(0)
        with pytest.raises(ShuttingDown):
            b.submit([Job(key="k", prompt_ids=[1], seed=5)])
        await close
        with pytest.raises(RuntimeError, match="boom"):
            bad.submitted.result()
        return first.submitted.result(), last.submitted.result(), engine.log

    first, last, log = run(main())
    assert first == (10, 1) and last == (40, 1)
    assert log == [[1], [4], [4]]  # the cancelled job never ran; the failed tick did not stop the worker


def test_step_events_reach_only_live_streams():
    async def main():
        b, _ = make(4)
        await b.start()
        q: asyncio.Queue = asyncio.Queue()
        jobs = [Job(key="k", prompt_ids=[2], seed=i, index=i, events=q) for i in range(2)]
        b.submit(jobs)
        await asyncio.gather(*(j.submitted for j in jobs))
        await b.close()
        return [q.get_nowait() for _ in range(q.qsize())]

    events = run(main())
    assert sorted(events[:4], key=lambda e: (e[0], e[1]["step"])) == [
        (0, {"step": 1}), (0, {"step": 2}), (1, {"step": 1}), (1, {"step": 2})]
    assert events[4:] == [(0, DONE), (1, DONE)]


def test_fixed_batch_jobs_run_at_their_turn_with_their_own_key():
    """Jobs the engine refuses (kv_cache) run as fixed-batch calls of the same key, at their place in the FIFO."""
    calls: list[list[int]] = []

    def fixed(jobs):
        calls.append([j.seed for j in jobs])
        return [(j.seed, len(jobs)) for j in jobs]

    @dataclass(frozen=True)
    class Cached:
        kv_cache: str = "dual"

    async def main():
        b, engine = make(4, fixed_batch=fixed)
        await b.start()
        jobs = [Job(key=k, prompt_ids=[1], seed=s, config=Cached() if k != "e" else None)
                for k, s in (("a", 1), ("e", 2), ("b", 3), ("a", 4))]
        b.submit(jobs)
        out = await asyncio.gather(*(j.submitted for j in jobs))
        await b.close()
        return out, engine.log

    out, log = run(main())
    assert calls == [[1, 4], [3]] and log == [[2]]
    assert out == [(1, 2), (20, 1), (3, 1), (4, 2)]


@pytest.mark.parametrize("kw,msg", [({"max_queue": 0}, "max_queue=0"), ({"max_wait_ms": -1}, "max_wait_ms=-1")])
def test_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        make(1, **kw)


def test_serve_freezes_the_startup_objects_out_of_the_collector():
    import gc

    from dsl_llada.serve.server import freeze_startup_objects

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 1000  # every object alive now (this test session's modules at least)
    finally:
        gc.unfreeze()
