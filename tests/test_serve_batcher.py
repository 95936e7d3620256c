"""The dynamic batcher on its own (no model, no HTTP): grouping by key, the queue bound, cancelling a waiting job,
a failing batch, draining on close. Deterministic: jobs are queued before the worker first runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dsl_llada.serve.batcher import DONE, Batcher, Job, QueueFull, ShuttingDown


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_jobs_are_grouped_by_key_in_fifo_order_up_to_max_batch():
    batches = []

    def run_batch(jobs):
        batches.append([(j.key, j.seed) for j in jobs])
        return [j.seed * 10 for j in jobs]

    async def main():
        b = Batcher(run_batch, max_batch=2, max_wait_ms=0, max_queue=8)
        await b.start()
        jobs = [Job(key=k, prompt_ids=[1], seed=i) for i, k in enumerate("ABAAB")]
        b.submit(jobs)
        out = await asyncio.gather(*(j.future for j in jobs))
        await b.close()
        return out

    assert run(main()) == [0, 10, 20, 30, 40]  # each job gets its own row's result
    assert batches == [[("A", 0), ("A", 2)], [("B", 1), ("B", 4)], [("A", 3)]]


def test_queue_bound_cancel_failure_and_drain():
    gate = threading.Event()
    seen = []

    def run_batch(jobs):
        gate.wait(10)
        seen.append([j.seed for j in jobs])
        if any(j.seed == 99 for j in jobs):
            raise RuntimeError("boom")
        return [j.seed for j in jobs]

    async def main():
        b = Batcher(run_batch, max_batch=1, max_wait_ms=0, max_queue=2)
        await b.start()
        first = Job(key="k", prompt_ids=[1], seed=1)
        b.submit([first])
        while not b.running:  # the worker took it: the queue is empty again
            await asyncio.sleep(0.001)
        waiting = Job(key="k", prompt_ids=[1], seed=2, events=asyncio.Queue())
        bad = Job(key="k", prompt_ids=[1], seed=99)
        b.submit([waiting, bad])
        with pytest.raises(QueueFull, match="max_queue=2"):
            b.submit([Job(key="k", prompt_ids=[1], seed=3)])
        b.cancel(waiting)  # a client that left while queued frees its slot at once
        assert b.queue_length == 1 and waiting.future.cancelled()
        last = Job(key="k", prompt_ids=[1], seed=4)
        b.submit([last])
        gate.set()
        close = asyncio.create_task(b.close())  # drains: everything queued still runs
        await asyncio.sleep(0)
        with pytest.raises(ShuttingDown):
            b.submit([Job(key="k", prompt_ids=[1], seed=5)])
        await close
        with pytest.raises(RuntimeError, match="boom"):
            bad.future.result()
        return first.future.result(), last.future.result()

    assert run(main()) == (1, 4)
    assert seen == [[1], [99], [4]]  # the cancelled job never ran; the failure did not stop the worker


def test_step_events_reach_only_live_streams():
    def run_batch(jobs):
        for j in jobs:
            j.emit({"step": 1})
        return [None] * len(jobs)

    async def main():
        b = Batcher(run_batch, max_batch=4, max_wait_ms=0, max_queue=4)
        await b.start()
        q: asyncio.Queue = asyncio.Queue()
        jobs = [Job(key="k", prompt_ids=[1], seed=i, index=i, events=q) for i in range(2)]
        b.submit(jobs)
        await asyncio.gather(*(j.future for j in jobs))
        await b.close()
        return [q.get_nowait() for _ in range(q.qsize())]

    events = run(main())
    assert sorted(events[:2], key=lambda e: e[0]) == [(0, {"step": 1}), (1, {"step": 1})]
    assert events[2:] == [(0, DONE), (1, DONE)]


@pytest.mark.parametrize("kw,msg", [({"max_batch": 0}, "max_batch=0"), ({"max_queue": 0}, "max_queue=0"),
                                    ({"max_wait_ms": -1}, "max_wait_ms=-1")])
def test_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Batcher(lambda jobs: [], **kw)


def _client_loop(b, key, seeds, delay_s=0.0):
    """A client sending its jobs one after another (the next one `delay_s` after the previous answer)."""
    async def go():
        out = []
        for s in seeds:
            job = Job(key=key, prompt_ids=[1], seed=s)
            b.submit([job])
            out.append(await job.future)
            await asyncio.sleep(delay_s)
        return out
    return go()


def test_a_lone_client_never_lingers():
    batches = []

    def run_batch(jobs):
        batches.append([j.seed for j in jobs])
        return [j.seed for j in jobs]

    async def main():
        b = Batcher(run_batch, max_batch=4, max_wait_ms=0, max_queue=8)
        await b.start()
        out = await _client_loop(b, "k", [1, 2, 3])
        await b.close()
        return out, b.linger_waits

    out, waits = run(main())
    assert out == [1, 2, 3] and batches == [[1], [2], [3]] and waits == 0


@pytest.mark.parametrize("linger", [True, False])
def test_after_a_batch_the_worker_lingers_for_its_clients(monkeypatch, linger):
    """Client A's request runs alone while B, C, D queue; A sends its next request 5 ms after its answer. With the
    linger, A's second request joins B, C, D (bound: 5 % of the next batch's estimated 4 x 0.2 s); without it (bound
    0), the worker starts B, C, D at once and A runs alone again."""
    import dsl_llada.serve.batcher as batcher_mod

    if not linger:
        monkeypatch.setattr(batcher_mod, "LINGER_MAX_S", 0.0)
    batches = []
    started = threading.Event()

    def run_batch(jobs):
        batches.append([j.seed for j in jobs])
        started.set()
        threading.Event().wait(0.2)
        return [j.seed for j in jobs]

    async def main():
        b = Batcher(run_batch, max_batch=4, max_wait_ms=0, max_queue=8)
        await b.start()
        first = asyncio.ensure_future(_client_loop(b, "k", [1, 2], delay_s=0.005))
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        others = [Job(key="k", prompt_ids=[1], seed=s) for s in (10, 11, 12)]
        b.submit(others)
        await asyncio.gather(first, *(j.future for j in others))
        await b.close()
        return b.linger_waits

    waits = run(main())
    if linger:
        assert batches == [[1], [10, 11, 12, 2]] and waits == 1
    else:
        assert batches == [[1], [10, 11, 12], [2]]


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
