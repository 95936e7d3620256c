"""The one batch runner: a list of encoded prompts through a sampler config, in left-padded batches.

Every caller that samples many prompts goes through `run_batches` (`generate`, the evaluation suite, the toy
world's evaluation, sweep and cache frontier, the benchmarks); the server batches requests itself
(`serve/runner.py`). What it does, in this order:

1. the context check: every prompt + `gen_length` must fit the model, checked for all prompts before any sampling
   (`loading.check_prompt_lengths`, which names the longest offender);
2. batches on a fixed grid [0, B), [B, 2B), ... of prompt positions, leaving out the positions in `skip` (already
   done): so a resumed run makes exactly the batches of an uninterrupted one, minus the finished rows;
3. per-row seeds: row i samples with its own CPU generator seeded `seed_of(i)`, so its tokens depend neither on
   the batch size nor on its batch-mates;
4. the NaN guard (`guards.FiniteLogitsGuard`, a step callback) on every sampler call (optional);
5. row-by-row retry: with `retry`, a batch that raises a runtime error (not a ValueError, which means bad setup,
   nor a KeyboardInterrupt, which both stop the run) is run again one row at a time, and a row that still fails
   comes back with its `error` instead of tokens; without `retry` the error propagates. The retry itself is
   `retry_rows`, which the evaluation runner also uses for its batches (`eval/runner.py`): eval runs rows that
   are not sampler calls (the autoregressive baseline, one-forward tasks) and records every exception per row,
   ValueError included, so it shares the retry rule, not `run_batches` itself;
6. progress: one bar over the batches (`progress`, `desc`).

It yields one list of `RowResult` per batch, in position order, before the next batch starts, so a caller can
append the batch to its records at once.

`run_continuous` is the same contract on the step-level engine (`sampling.engine.Engine`): instead of fixed batches
that shrink as rows finish, the next prompt joins the running batch as soon as a row leaves, and the rows that
finish at a tick are yielded at once (in position order). Seeds, the context check, the guard and `skip` are as
above, and each row's tokens are those `run_batches` gives it alone (docs/samplers.md, "Step-level engine").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from ..core.backbones.base import Backbone, context_limit, model_device
from ..core.loading import check_prompt_lengths
from ..core.model import DSLModel
from .progress import progress as progress_bar
from .common import PromptBatch, SampleOutput
from .dispatch import SamplerConfig, sample
from .engine import Engine, EngineResult
from .guards import FiniteLogitsGuard

__all__ = ["RowResult", "retry_rows", "run_batch", "run_batches", "run_continuous"]

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Row = TypeVar("Row")


def retry_rows(items: Sequence[Item], call: Callable[[list[Item]], list[Row]],
               failed: Callable[[Item, Exception, float], Row], *, fatal: tuple[type[Exception], ...] = (),
               retry_single: bool = True, what: str = "") -> list[Row]:
    """`call(items)` (one row per item); when it raises an Exception that is not one of `fatal`, run the items
    again one at a time, and give `failed(item, error, seconds)` for each item whose call still raises (a `fatal`
    error, and anything not an Exception such as KeyboardInterrupt, propagates). `what` names the batch in the
    log line. With `retry_single=False` a batch of one item is not run twice: its first error is its row's
    (seconds 0.0)."""
    try:
        return call(list(items))
    except fatal:
        raise
    except Exception as e:  # noqa: BLE001  (a runtime failure of this batch: retry its rows one by one)
        if len(items) == 1 and not retry_single:
            return [failed(items[0], e, 0.0)]
        log.warning("batch of %d %s raised %s: %s; running its rows one by one", len(items), what, type(e).__name__, e)
    rows: list[Row] = []
    for item in items:
        t1 = time.perf_counter()
        try:
            rows += call([item])
        except fatal:
            raise
        except Exception as e1:  # noqa: BLE001
            rows.append(failed(item, e1, time.perf_counter() - t1))
    return rows


@dataclass
class RowResult:
    """One prompt's outcome: its tokens (or its error) and the accounting of the sampler call that made it."""

    index: int
    """Position of the prompt in the list given to `run_batches`."""
    seed: int
    """The seed of the row's generator (`seed_of(index)`)."""
    output: SampleOutput | None
    """The whole call's output (shared by the rows of one call); None when the row failed."""
    row: int
    """The row's position inside `output`."""
    error: str | None
    """'ExceptionType: message' when the row failed (after its retry alone), else None."""
    seconds: float
    """Wall time of the call that made this row, divided by its number of rows."""
    batch_seconds: float
    """Wall time of that call."""
    batch_size: int
    """Rows in that call (1 for a retried row)."""

    @property
    def ids(self) -> list[int] | None:
        """The row's full response ids (every position, before EOS truncation)."""
        return None if self.output is None else self.output.ids[self.row].tolist()

    @property
    def response(self) -> list[int] | None:
        """The row's response ids truncated at EOS as the config says (`SampleOutput.responses`)."""
        if self.output is None:
            return None
        return self.output.ids[self.row, : int(self.output.lengths[self.row])].tolist()


def run_batch(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]], config: SamplerConfig,
              seeds: Sequence[int], *, guard: bool = True, progress: bool = False,
              context_checked: bool = False) -> SampleOutput:
    """One left-padded batch through the sampler the config's type picks; row j uses a CPU generator seeded
    `seeds[j]`. With `guard`, non-finite logits at the first step raise NonFiniteLogitsError (any kv_cache mode).
    `context_checked`: the caller checked the prompts against the context already (`PromptBatch.context_checked`)."""
    device = model_device(model)
    batch = PromptBatch.from_lists(prompt_ids, pad_id=model.special.pad_id, device=device,
                                   context_checked=context_checked)
    gens = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
    return sample(model, batch, config, generator=gens, progress=progress,
                  callback=FiniteLogitsGuard() if guard else None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_batches(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]], config: SamplerConfig, *,
                batch_size: int, seed_of: Callable[[int], int], skip: Collection[int] = (), retry: bool = True,
                guard: bool = True, check_context: bool = True, progress: bool = False,
                desc: str = "sample") -> Iterator[list[RowResult]]:
    """Run `prompt_ids` through `config` in batches (see the module docstring); yields each batch's rows."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 1")
    n = len(prompt_ids)
    if check_context:
        check_prompt_lengths(prompt_ids, context=context_limit(model), gen_length=config.gen_length)
    done = set(skip)
    device = model_device(model)
    grid = [[i for i in range(s, min(s + batch_size, n)) if i not in done] for s in range(0, n, batch_size)]
    grid = [idx for idx in grid if idx]

    def call(idx: list[int]) -> list[RowResult]:
        seeds = [seed_of(i) for i in idx]
        _sync(device)
        t0 = time.perf_counter()
        out = run_batch(model, [prompt_ids[i] for i in idx], config, seeds, guard=guard, context_checked=True)
        _sync(device)
        dt = time.perf_counter() - t0
        return [RowResult(i, s, out, j, None, dt / len(idx), dt, len(idx)) for j, (i, s) in enumerate(zip(idx, seeds))]

    def failed(i: int, e: Exception, dt: float) -> RowResult:
        log.warning("prompt %d failed (%s: %s); recorded with its error, continuing", i, type(e).__name__, e)
        return RowResult(i, seed_of(i), None, 0, f"{type(e).__name__}: {e}", dt, dt, 1)

    for idx in progress_bar(grid, total=len(grid), desc=desc, enabled=progress):
        if not retry:
            yield call(idx)
            continue
        yield retry_rows(idx, call, failed, fatal=(ValueError,), retry_single=False,
                         what=f"prompts ({idx[0]}..{idx[-1]})")


def engine_runs(model: object, config: SamplerConfig) -> bool:
    """Whether `run_continuous` can run `config` on `model`: a DSLModel or Backbone, without a key/value cache."""
    return isinstance(model, (DSLModel, Backbone)) and getattr(config, "kv_cache", "off") == "off"


def run_continuous(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]], config: SamplerConfig, *,
                   max_rows: int, seed_of: Callable[[int], int], skip: Collection[int] = (), retry: bool = True,
                   guard: bool = True, check_context: bool = True, progress: bool = False,
                   desc: str = "sample", fatal: tuple[type[Exception], ...] = (ValueError,)
                   ) -> Iterator[list[RowResult]]:
    """Run `prompt_ids` through `config` on the step-level engine with at most `max_rows` live rows; yields the
    rows that finish at each tick (see the module docstring).

    A row's `output` is its batch-of-one SampleOutput; `seconds` its share of the ticks it was live for (each
    tick's time divided by the rows live at it), `batch_seconds` the time of those ticks, `batch_size` the rows
    live at its last tick. A row whose own computation raises is recorded with its `error`, unless the exception
    is one of `fatal` (default ValueError: bad setup, non-finite weights), which stops the run; a
    KeyboardInterrupt always does. With `retry`, a tick whose shared forward raises any other exception runs each
    row live at that tick again alone, from its start (a row that still fails gets its error); without `retry`
    the error propagates. (The evaluation runner passes `fatal=()`: it records every exception per row.)"""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows={max_rows!r} must be an int >= 1")
    if check_context:
        check_prompt_lengths(prompt_ids, context=context_limit(model), gen_length=config.gen_length)
    done = set(skip)
    todo = [i for i in range(len(prompt_ids)) if i not in done]
    device = model_device(model)
    engine = Engine(model, max_rows=max_rows)

    def submit(e: Engine, i: int) -> None:
        e.submit(prompt_ids[i], config, generator=torch.Generator(device="cpu").manual_seed(int(seed_of(i))),
                 callback=FiniteLogitsGuard() if guard else None, tag=i, context_checked=True)

    for i in todo:
        submit(engine, i)
    share: dict[int, float] = {}
    spent: dict[int, float] = {}

    def row(r: EngineResult, live: int) -> RowResult:
        i = int(r.tag)
        if r.exception is not None and isinstance(r.exception, fatal):
            raise r.exception
        if r.error is not None:
            log.warning("prompt %d failed (%s); recorded with its error, continuing", i, r.error)
            return RowResult(i, seed_of(i), None, 0, r.error, share.pop(i, 0.0), spent.pop(i, 0.0), live)
        return RowResult(i, seed_of(i), r.output(), 0, None, share.pop(i, 0.0), spent.pop(i, 0.0), live)

    bar = progress_bar(range(len(todo)), total=len(todo), desc=desc, enabled=progress)
    finished = iter(bar)
    while len(engine):
        _sync(device)
        t0 = time.perf_counter()
        try:
            results = engine.step()
        except fatal:
            raise
        except Exception as e:  # the shared forward failed: its rows run again one by one
            if not retry:
                raise
            stuck = [engine.cancel(rid) for rid, _ in engine.live_requests]
            log.warning("a tick of %d rows raised %s: %s; running its rows one by one", len(stuck), type(e).__name__, e)
            # rows admitted at this tick left the queue: they are among the live ones cancelled above
            alone_rows: list[RowResult] = []
            for res in stuck:
                assert res is not None
                i = int(res.tag)
                solo = Engine(model, max_rows=1)
                submit(solo, i)
                t1 = time.perf_counter()
                try:
                    got = [row(x, 1) for x in solo.run()]
                except fatal:
                    raise
                except Exception as e1:  # noqa: BLE001
                    log.warning("prompt %d failed (%s: %s); recorded with its error, continuing", i,
                                type(e1).__name__, e1)
                    dt = time.perf_counter() - t1
                    got = [RowResult(i, seed_of(i), None, 0, f"{type(e1).__name__}: {e1}", dt, dt, 1)]
                alone_rows += got
            for _ in alone_rows:
                next(finished, None)
            yield sorted(alone_rows, key=lambda r: r.index)
            continue
        _sync(device)
        dt = time.perf_counter() - t0
        live = engine.live + len(results)
        for _, tag in engine.live_requests:
            i = int(tag)
            share[i] = share.get(i, 0.0) + dt / live
            spent[i] = spent.get(i, 0.0) + dt
        for x in results:
            i = int(x.tag)
            share[i] = share.get(i, 0.0) + dt / live
            spent[i] = spent.get(i, 0.0) + dt
        if results:
            rows = sorted((row(x, live) for x in results), key=lambda r: r.index)
            for _ in rows:
                next(finished, None)
            yield rows
