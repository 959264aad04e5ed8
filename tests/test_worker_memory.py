"""The worker actor under memory pressure, in-process and gated on messages.

Memory is what the worker's ``probe`` says (a list the test sets), so the fences are
crossed exactly when the test says; everything else is real: the actor, its executor
threads, its spill store on disk (in ``tmp_path``)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import actors.executor
import actors.memory
from actors.protocol import ToRun
from actors.worker import Worker, WorkerStatus
from runtime.graph import Task, TaskRef
from runtime.kernel import ActorRef, ActorSystem
from runtime.messages import (
    DataReply,
    DropKeys,
    GetData,
    RunTasks,
    StatusRequest,
)
from tests.helpers import GATE, Gated, GatedLoad, SchedulerRecorder, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 30  # seconds per test
MB = 2**20
MEMORY = 1000 * MB


@asynccontextmanager
async def worker(
    tmp_path: Path, rss: list[int], **options: Any
) -> AsyncIterator[tuple[Worker, ActorRef[Any], SchedulerRecorder]]:
    sched = SchedulerRecorder()
    async with ActorSystem() as system:
        sref = await system.spawn(sched, "scheduler")
        w = Worker(
            "w1", sref, lambda _: None, memory=MEMORY, probe=lambda: rss[0],
            memory_options={"spill_dir": str(tmp_path), "interval": 0.01, **options},
        )  # fmt: skip
        wref = await system.spawn(w, "w1")
        yield w, wref, sched


def run(key: str, func: Callable[..., Any], *args: Any, producer: bool = False) -> ToRun:
    deps = tuple((a.key, ("w1",)) for a in args if isinstance(a, TaskRef))
    return ToRun(key, Task(key, func, *args), key.split("-")[0], deps, producer)


def load(n: int) -> np.ndarray:
    return np.ones(n // 8)


async def test_throttled_worker_defers_producers_runs_consumers_and_resumes(
    tmp_path: Path,
) -> None:
    rss = [100 * MB]
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss, spill=None) as (_, ref, sched):
            ref.post(RunTasks((run("load-0", load, MB, producer=True),)))
            await sched.until(lambda: "load-0" in sched.done)
            # Past the throttle fence (0.7): the worker says so...
            rss[0] = 800 * MB
            await sched.until(lambda: bool(sched.reports))
            report = sched.reports[-1]
            assert report.throttled and report.rss == 800 * MB
            assert report.throttle_at == 700 * MB and report.limit == MEMORY
            # ...defers a producer, yet runs a consumer at once.
            ref.post(RunTasks((run("load-1", load, MB, producer=True),)))
            ref.post(RunTasks((run("sum-0", np.sum, TaskRef("load-0")),)))
            await sched.until(lambda: "sum-0" in sched.done)
            assert "load-1" not in sched.done
            status: WorkerStatus = await ref.ask(StatusRequest())
            assert status.throttled and status.deferred == 1
            # Memory falls: the deferred producer runs at once, the throttle is lifted.
            rss[0] = 200 * MB
            await sched.until(lambda: "load-1" in sched.done)
            assert not sched.reports[-1].throttled
            assert sched.done["sum-0"].outcome == "ok"


async def test_past_the_spill_fence_outputs_go_to_disk_and_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 650 MB of RSS with 40 MB of outputs: the rest is past the spill target by itself,
    # where outputs made less than SPILL_GRACE ago stay (the next test); here they go.
    monkeypatch.setattr(actors.memory, "SPILL_GRACE", 0.0)
    rss = [100 * MB]
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss) as (w, ref, sched):
            keys = [f"load-{i}" for i in range(4)]
            ref.post(RunTasks(tuple(run(k, load, 10 * MB) for k in keys)))
            await sched.until(lambda: all(k in sched.done for k in keys))
            rss[0] = 650 * MB  # past spill (0.6): spill down to 0.54 -> at least 110 MB
            # (the spill writes in a thread: reports may show it part done meanwhile)
            await sched.until(lambda: any(r.spilled_bytes >= 40 * MB for r in sched.reports))
            assert w.data.n_spilled == 4  # 4 x 10 MB < 110 MB: everything went
            assert sorted(w.data.keys_on_disk()) == keys
            rss[0] = 100 * MB
            # A consumer reads a spilled input transparently; a peer gets another one.
            ref.post(RunTasks((run("sum-0", np.sum, TaskRef("load-0")),)))
            await sched.until(lambda: "sum-0" in sched.done)
            assert sched.done["sum-0"].outcome == "ok"
            assert w.data.on_disk("load-0")  # read for the task only: still on disk
            reply: DataReply = await ref.ask(GetData(("load-1",)))
            assert np.array_equal(reply.data["load-1"], np.ones(10 * MB // 8))
            status: WorkerStatus = await ref.ask(StatusRequest())
            assert 40 * MB <= status.spilled_total < 41 * MB  # each output spilled once
            assert status.spilled == 4  # nothing came back to memory, nor was written twice


async def test_past_the_spill_fence_by_memory_not_outputs_a_new_output_waits_for_its_consumer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # benchmarks/groupby_memory.py's shape: the worker is past its spill fence (600 MB)
    # with its outputs a small part of it (10 MB of 650). Each output used to be written
    # at the sample right after it was stored and read back by its consumer a moment
    # later (every stage's outputs spilled once: 7.4 GB per run for 1.4 GB of data).
    monkeypatch.setattr(actors.memory, "SPILL_GRACE", float(LIMIT))  # however slow the host
    rss = [650 * MB]
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss) as (w, ref, sched):
            ref.post(RunTasks((run("load-0", load, 10 * MB),)))
            await sched.until(lambda: "load-0" in sched.done)
            ref.post(RunTasks((run("sum-0", np.sum, TaskRef("load-0")),)))
            await sched.until(lambda: "sum-0" in sched.done)
            status: WorkerStatus = await ref.ask(StatusRequest())
            assert status.spilled_total == 0 and not w.data.on_disk("load-0")
            # An output nobody reads within the grace goes to disk, as before.
            ref.post(RunTasks((run("load-1", load, 10 * MB),)))
            await sched.until(lambda: "load-1" in sched.done)
            monkeypatch.setattr(actors.memory, "SPILL_GRACE", 0.0)
            await wait_until(lambda: w.data.on_disk("load-1"), "load-1 spilled", limit=LIMIT)


def gated_sum(started: threading.Event, go: threading.Event, x: np.ndarray) -> float:
    started.set()
    if not go.wait(LIMIT):
        raise TimeoutError("the test never released the gate")
    return float(x.sum())


async def test_a_spill_leaves_the_inputs_of_a_running_task_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writing them out frees nothing (the task holds them until it ends), and they are
    # often dropped once it has: the load-then-reduce runs spilled them for nothing.
    monkeypatch.setattr(actors.memory, "SPILL_GRACE", 0.0)  # as in the test before
    rss = [100 * MB]
    started, go = threading.Event(), threading.Event()
    try:
        with anyio.fail_after(LIMIT):
            async with worker(tmp_path, rss) as (w, ref, sched):
                keys = [f"load-{i}" for i in range(3)]
                ref.post(RunTasks(tuple(run(k, load, 10 * MB) for k in keys)))
                await sched.until(lambda: all(k in sched.done for k in keys))
                use = run("use-0", gated_sum, started, go, TaskRef("load-0"))
                ref.post(RunTasks((use,)))
                await anyio.to_thread.run_sync(started.wait, LIMIT)
                rss[0] = 650 * MB  # past spill (0.6): at least 110 MB, all it may move
                await sched.until(lambda: any(r.spilled_bytes >= 20 * MB for r in sched.reports))
                assert sorted(w.data.keys_on_disk()) == ["load-1", "load-2"]
                assert list(w.data.keys_in_memory()) == ["load-0"]
                go.set()
                await sched.until(lambda: "use-0" in sched.done)
                assert sched.done["use-0"].outcome == "ok"
    finally:
        go.set()


async def test_a_deferred_producer_can_be_cancelled(tmp_path: Path) -> None:
    from runtime.messages import CancelTasks

    rss = [100 * MB]
    ran = threading.Event()
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss, spill=None) as (w, ref, sched):
            # An output in memory (spilling off): what memory there is may be outputs,
            # so the worker stays throttled (an idle one holding nothing would not).
            ref.post(RunTasks((run("keep-0", load, MB),)))
            await sched.until(lambda: "keep-0" in sched.done)
            rss[0] = 900 * MB
            await sched.until(lambda: bool(sched.reports) and sched.reports[-1].throttled)
            ref.post(RunTasks((run("load-0", lambda: ran.set(), producer=True),)))
            await ref.ask(StatusRequest())  # the RunTasks was handled
            assert "load-0" in w.state.deferred
            ref.post(CancelTasks(("load-0",)))
            status: WorkerStatus = await ref.ask(StatusRequest())
            assert status.deferred == 0 and not w.governor.deferred
            rss[0] = 100 * MB
            await sched.until(lambda: not sched.reports[-1].throttled)
            await ref.ask(StatusRequest())
            assert not ran.is_set() and "load-0" not in sched.done


def test_bad_memory_options_fail_when_the_worker_is_made() -> None:
    from actors.memory import MemoryConfigError

    with pytest.raises(MemoryConfigError, match=r"unknown option.*trottle"):
        Worker("w", None, lambda _: None, memory=MEMORY, memory_options={"trottle": 0.5})  # type: ignore[arg-type]  # fmt: skip


async def test_a_large_copy_of_a_peers_output_is_dropped_once_used(tmp_path: Path) -> None:
    sched = SchedulerRecorder()
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            refs: dict[str, Any] = {}
            workers = {}
            for wid in ("w1", "w2"):
                w = Worker(
                    wid, sref, refs.get, memory=MEMORY,
                    memory_options={"spill_dir": str(tmp_path)},
                )  # fmt: skip
                workers[wid] = w
                refs[wid] = await system.spawn(w, wid)
            refs["w1"].post(RunTasks((run("big-0", load, 2 * MB), run("small-0", load, 800))))
            await sched.until(lambda: {"big-0", "small-0"} <= sched.done.keys())
            # w2 reads both from w1: the 2 MB copy goes once used, the small one stays.
            task = ToRun(
                "sum-0", Task("sum-0", _total, TaskRef("big-0"), TaskRef("small-0")), "sum",
                (("big-0", ("w1",)), ("small-0", ("w1",))), False, (2 * MB, 800),
            )  # fmt: skip
            refs["w2"].post(RunTasks((task,)))
            await sched.until(lambda: "sum-0" in sched.done)
            res = sched.done["sum-0"]
            assert res.outcome == "ok" and res.fetched == ("small-0",)
            assert "big-0" not in workers["w2"].data and "small-0" in workers["w2"].data
            assert "big-0" in workers["w1"].data  # the owner keeps its output


def _total(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.sum() + b.sum())


def _started_then_wait(started: threading.Event, release: threading.Event) -> bool:
    started.set()
    return release.wait(20)


async def test_rss_sampled_while_a_task_runs_is_its_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rss = [100 * MB]
    # The executor reads the RSS before and after the task itself: the same fake one
    # as the worker's samples. With this process's real one (above 800 MB late in a CI
    # run), the peak sampled was below the RSS after and rightly not reported.
    monkeypatch.setattr(actors.executor, "rss", lambda: rss[0])
    started, release = threading.Event(), threading.Event()
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss, spill=None) as (_, ref, sched):
            ref.post(RunTasks((run("work-0", _started_then_wait, started, release),)))
            # Running (its RSS before it was read at its start), not only handed over:
            # on a loaded machine its thread could start after the RSS below moved.
            assert await anyio.to_thread.run_sync(started.wait, 10)
            rss[0] = 800 * MB  # while it runs: the monitor's next sample sees it
            await sched.until(lambda: any(r.throttled for r in sched.reports))
            rss[0] = 100 * MB
            release.set()
            await sched.until(lambda: "work-0" in sched.done)
    res = sched.done["work-0"]
    assert res.outcome == "ok" and res.rss_peak == 800 * MB


def test_trim_gives_memory_back_and_is_a_collection_only_without_malloc_trim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import actors.worker as worker_mod

    assert worker_mod.trim_memory() is (worker_mod.MALLOC_TRIM is not None)
    monkeypatch.setattr(worker_mod, "MALLOC_TRIM", None)  # not glibc: gc.collect() only
    collected: list[int] = []
    monkeypatch.setattr(worker_mod.gc, "collect", lambda: collected.append(1) or 0)
    assert worker_mod.trim_memory() is False
    assert collected == [1]


async def test_an_idle_worker_whose_floor_is_past_the_resume_mark_takes_producers_again(
    tmp_path: Path,
) -> None:
    # The user audit's D1: RSS that is not outputs (libraries, allocator residue) kept an
    # idle worker holding nothing throttled for good; its next run stalled.
    rss = [800 * MB]  # spill and resume at 600 MB, throttle at 700 MB: throttled
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss) as (_, ref, sched):
            await sched.until(lambda: any(r.throttled for r in sched.reports))
            # Nothing to spill, a trim frees nothing: 800 MB is the worker's floor.
            ref.post(RunTasks((run("load-0", load, MB, producer=True),)))
            with anyio.fail_after(5):  # before: deferred for good
                await sched.until(
                    lambda: "load-0" in sched.done and not sched.reports[-1].throttled
                )
            report = sched.reports[-1]
            assert not report.throttled and report.floor == 800 * MB
            assert report.throttle_at == 900 * MB  # floor + 2 x 50 MB, under terminate


async def test_an_idle_worker_holding_back_a_producer_under_its_moved_marks_trims_and_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second dask groupby on 400 MiB workers (benchmarks/groupby_memory.py): a floor
    # measured high moved the marks to the terminate fence, the RSS sat under the moved
    # resume mark (no trim asked), and a shuffle producer that did not fit waited for
    # good: MemoryStalled. Here the memory a trim frees is what a collection would free.
    import actors.worker as worker_mod

    rss = [930 * MB]  # over the resume mark (600 MB): a trim, and 930 MB is the floor
    after_trim = [930 * MB]

    def trim() -> bool:
        rss[0] = after_trim[0]
        return True

    monkeypatch.setattr(worker_mod, "trim_memory", trim)
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss) as (_, ref, sched):
            await sched.until(lambda: any(r.floor == 930 * MB for r in sched.reports))
            # Marks at the terminate fence (950 MB): a load of unknown size runs, and
            # teaches its category's 30 MB output.
            ref.post(RunTasks((run("load-0", load, 30 * MB, producer=True),)))
            await sched.until(lambda: "load-0" in sched.done)
            after_trim[0] = 500 * MB  # what the next trim would give back
            # 930 + 30 MB passes the terminate fence: it waits, the worker idle under
            # its moved resume mark.
            ref.post(RunTasks((run("load-1", load, 30 * MB, producer=True),)))
            with anyio.fail_after(10):  # before: deferred until the scheduler's watchdog
                await sched.until(lambda: "load-1" in sched.done)
            assert sched.done["load-1"].outcome == "ok"
            await sched.until(lambda: sched.reports[-1].floor == 0)  # under the mark again


async def test_a_worker_whose_memory_at_start_is_past_its_resume_mark_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The user audit's D2: a process-execution worker on 400 MiB sat at its resume mark
    # before its first task, and nothing said so until a run failed.
    import logging

    from actors.worker import FLOOR_AT_START

    caplog.set_level(logging.WARNING, logger="corral")
    rss = [650 * MB]  # resume at 600 MB
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss, execution="process"):
            # Measured once its task processes are up, before any task ran.

            (line,) = await wait_until(
                lambda: [r.getMessage() for r in caplog.records if FLOOR_AT_START in r.getMessage()]
            )
            assert "650.0 MiB" in line and "resume mark 600.0 MiB" in line
            assert "fewer task processes" in line


def test_the_start_warning_says_the_floor_the_marks_and_what_to_do() -> None:
    from actors.memory import MemoryConfig, floor_at_start
    from runtime.errors import FLOOR_ADVICE

    cfg = MemoryConfig(400 * MB, execution="process")  # resume 240 MiB, throttle 280 MiB
    assert floor_at_start(cfg, 239 * MB) is None
    assert floor_at_start(cfg, 250 * MB) == (
        "memory that is not outputs is 250.0 MiB (the worker's floor: its RSS holding no "
        "output in memory and running no task: libraries, task processes, memory the "
        "allocator keeps), at or past its resume mark 240.0 MiB (throttle fence 280.0 MiB, "
        "limit 400.0 MiB), so spilling cannot bring it under that mark and outputs have "
        f"little room; {FLOOR_ADVICE}"
    )
    # A thread worker has no task processes; before any task ran, even past its limit,
    # no task kept anything yet: more memory, and what a floor that grows would mean.
    cfg = MemoryConfig(400 * MB)
    for rss, size in ((250 * MB, "250.0 MiB"), (450 * MB, "450.0 MiB")):
        assert floor_at_start(cfg, rss) == (
            f"memory that is not outputs is {size} (the worker's floor: its RSS holding no "
            "output in memory and running no task: libraries, memory the allocator keeps, "
            "what its tasks keep in globals or caches), at or past its resume mark 240.0 "
            "MiB (throttle fence 280.0 MiB, limit 400.0 MiB), so spilling cannot bring it "
            "under that mark and outputs have little room; give workers more memory "
            "(--memory, a pool's memory_per_worker). Its tasks run in threads of the "
            "worker's own process: if its floor grows as they run, a task keeps data in a "
            "module global or a cache; free it in the task, and restart those workers "
            "(drain them: the console's 'drain WORKER', or scale the pool in and out)"
        )


async def ticks(n: int) -> None:
    """Return once a ticker of its own on the event loop has ticked ``n`` times (10 ms
    apart): the loop ran meanwhile, whatever the caller's own flow does. The wait is a
    bounded poll of the ticker's count (``wait_until``), not a sleep."""
    count = [0]

    async def ticker() -> None:
        while True:
            await anyio.sleep(0.01)
            count[0] += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await wait_until(lambda: count[0] >= n, f"{n} ticks of the loop", limit=GATE)
        tg.cancel_scope.cancel()


@asynccontextmanager
async def holding_big_0(
    tmp_path: Path, make: Callable[[int], Any]
) -> AsyncIterator[tuple[Worker, ActorRef[Any], SchedulerRecorder, list[int], Any]]:
    """A worker (RSS 100 MB, within ``LIMIT`` seconds) that ran ``make(1000)`` as
    ``big-0`` and holds its value: the worker, its reference, its scheduler, its RSS to
    set and the value."""
    rss = [100 * MB]
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, rss) as (w, ref, sched):
            ref.post(RunTasks((run("big-0", make, 1000),)))
            await sched.until(lambda: "big-0" in sched.done)
            yield w, ref, sched, rss, w.data.peek("big-0")


def make_gated(n: int) -> Gated:
    return Gated(b"x" * n)


async def test_a_spill_runs_off_the_event_loop_which_keeps_ticking_and_serving(
    tmp_path: Path,
) -> None:
    """The audit's 800 MB output took a worker's event loop for 5 s while it was
    spilled (no heartbeats went out). Now the value is pickled and written in a thread:
    while its pickling is held, a ticker on the loop ticks, a peer's fetch is served
    the value from memory, and the worker says a spill is under way (what a blocked
    loop's warning names); once let go, the value is on disk and reported spilled."""
    async with holding_big_0(tmp_path, make_gated) as (w, ref, sched, rss, value):
        rss[0] = 650 * MB  # past spill (0.6): the memory tick spills "big-0"
        try:
            await anyio.to_thread.run_sync(value.pickling.wait, GATE)
            await ticks(3)  # the loop runs while the spill pickles
            reply: DataReply = await ref.ask(GetData(("big-0",)))
            assert reply.data["big-0"] is value  # served from memory meanwhile
            assert w.spilling is not None and w.spill_during(w.spilling.began) is w.spilling
            assert not w.data.on_disk("big-0")
        finally:
            value.go.set()
        await sched.until(lambda: any(r.spilled_bytes for r in sched.reports))
        # (a memory report may say the value spilled before the spill's thread is back
        # on the loop to end it: a loaded machine's case)
        await wait_until(lambda: w.spilling is None, "the spill ended", limit=GATE)
        assert value.waited == [True]  # the gate was opened by the test, not timed out
        assert w.data.on_disk("big-0")
        assert w.spilled_last is not None and w.spilled_last.ended is not None
        rss[0] = 100 * MB
        reply = await ref.ask(GetData(("big-0",)))
        assert reply.data["big-0"] == b"x" * 1000  # read back from its file


def make_gated_load(n: int) -> GatedLoad:
    return GatedLoad(b"x" * n)


async def test_a_spilled_input_is_read_back_off_the_event_loop(tmp_path: Path) -> None:
    """A task whose input is spilled gets it read from its file in a thread: while the
    read is held, a ticker on the loop ticks; once let go, the task runs on it."""
    async with holding_big_0(tmp_path, make_gated_load) as (w, ref, sched, rss, value):
        rss[0] = 650 * MB  # past spill (0.6): "big-0" goes to disk
        await sched.until(lambda: any(r.spilled_bytes for r in sched.reports))
        assert w.data.on_disk("big-0")
        rss[0] = 100 * MB
        ref.post(RunTasks((run("len-0", len, TaskRef("big-0")),)))
        try:
            await anyio.to_thread.run_sync(value.loading.wait, GATE)
            await ticks(3)  # the loop runs while the input is read
            assert "len-0" not in sched.done
        finally:
            value.go.set()
        await sched.until(lambda: "len-0" in sched.done)
        assert value.waited == [True]  # the gate was opened by the test, not timed out
        assert sched.done["len-0"].outcome == "ok"
        assert w.data.on_disk("big-0")  # read for the task only: still on disk


def spill_files(directory: str) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".spill")]


async def test_a_spilled_output_dropped_is_deleted_unread(tmp_path: Path) -> None:
    """The audit's std run (process workers, 200 MB chunks): workers' event loops went
    8 s without a heartbeat, and the RSS they reported stayed 0.5 GiB high. A
    ``DropKeys`` of a spilled output went through ``MutableMapping.pop``, which read
    the whole file back into memory, on the event loop, only to drop it. Now its file
    is deleted unread: the value's unpickling (gated) never starts, and the worker
    answers at once with nothing of it left in memory or on disk."""
    async with holding_big_0(tmp_path, make_gated_load) as (w, ref, sched, rss, value):
        rss[0] = 650 * MB  # past spill (0.6): "big-0" goes to disk
        await sched.until(lambda: any(r.spilled_bytes for r in sched.reports))
        assert w.data.on_disk("big-0")
        spill_dir = w.data.directory
        assert spill_dir is not None and spill_files(spill_dir)
        rss[0] = 100 * MB
        try:
            ref.post(DropKeys(("big-0",)))
            status: WorkerStatus = await ref.ask(StatusRequest())  # after the drop
        finally:
            value.go.set()  # the old code's read back, if it started, ends now
        assert not value.loading.is_set()  # never read back
        assert "big-0" not in w.data and w.data.unspilled_total == 0
        assert status.stored == 0 and status.stored_bytes == 0 and status.spilled_bytes == 0
        await wait_until(  # deleted from a thread, not on the event loop
            lambda: not spill_files(spill_dir),
            "the spill file deleted",
            limit=LIMIT,
        )


async def test_an_output_dropped_while_its_spill_file_is_written_is_not_taken_for_a_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chaos audit's D2: an 800 MB output was being spilled when its run was released;
    # the drop left the worker holding nothing, so its samples read as idle, and the RSS
    # the spill's thread still held (the value it writes) was measured as its floor:
    # "memory that is not outputs ... 0.85 GiB; marks moved up", a warning to buy
    # memory. A sample while a spill writes is not idle: no trim, no floor.
    import actors.store as store_mod
    import actors.worker as worker_mod

    write = threading.Event()
    writing = threading.Event()  # the spill's thread has begun the write
    real_write = store_mod._write_job

    def held_write(job: Any) -> Any:
        writing.set()
        write.wait(LIMIT)
        return real_write(job)

    trims: list[int] = []

    def trim() -> bool:
        trims.append(rss[0])
        return True

    monkeypatch.setattr(store_mod, "_write_job", held_write)
    monkeypatch.setattr(worker_mod, "trim_memory", trim)
    rss = [100 * MB]
    samples = [0]

    def probe() -> int:
        samples[0] += 1
        return rss[0]

    try:
        with anyio.fail_after(LIMIT):
            async with worker(tmp_path, rss) as (w, ref, sched):
                w.probe = probe
                ref.post(RunTasks((run("big-0", load, 8 * MB, producer=True),)))
                await sched.until(lambda: "big-0" in sched.done)
                rss[0] = 700 * MB  # past the spill fence (600 MB): the output is written
                # the drop must come while the file is written, not before its thread
                # began (a spill not yet begun is dropped with the value: then the
                # worker is idle and a trim is right)
                await wait_until(writing.is_set)
                assert w.spilling is not None and w.spilling.nbytes > 0
                ref.post(DropKeys(("big-0",)))  # its run released while it is written
                await wait_until(lambda: not w.data.memory_bytes and not w.state.held)
                seen = samples[0]
                await wait_until(lambda: samples[0] >= seen + 20)  # 20 samples of 10 ms
                assert trims == [] and all(not r.floor for r in sched.reports)
                write.set()  # the file is written; the value leaves memory with it
                rss[0] = 80 * MB
                await wait_until(lambda: w.spilling is None)
                seen = samples[0]
                await wait_until(lambda: samples[0] >= seen + 5)
                assert all(not r.floor for r in sched.reports)
    finally:
        write.set()
