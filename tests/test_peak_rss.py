"""A category's ``peak_rss``: the highest RSS of the worker sampled while one of its
tasks *executed*, not while it waited in the executor's queue behind another.

The scheduler hands a worker ``saturation`` (2) tasks per thread: one executes, the
other waits. A sample is the peak of the tasks executing when it was read (the
executor names them), so a task that allocates while another waits gets its peak, and
the one that waits does not get the other's.

The core is driven with events and exact numbers; the end-to-end test runs a real
worker process (thread execution, one thread) over loopback, with a task that allocates
and holds its memory until the test opens a gate file. Every wait is on an event or a
polled condition inside ``anyio.fail_after``, never sleep-then-assert.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.executor import Executor
from actors.memory import MemoryConfig
from actors.protocol import TaskResult, ToRun
from actors.worker_state import (
    MemorySampled,
    ReportDone,
    Submit,
    TasksAssigned,
    TasksFinished,
    WorkerState,
)
from runtime import Cluster
from runtime.graph import Key, Task
from runtime.messages import MetricsRequest
from runtime.metrics import render
from tests.helpers import held_at_gate, wait_until

pytestmark = pytest.mark.anyio

MiB = 2**20
LIMIT = 90  # seconds per end-to-end test (a worker process starts in a few)
BOUND = 15  # seconds per wait on an executor


def noop() -> None:
    return None


def to_run(key: Key, category: str) -> ToRun:
    return ToRun(key, Task(key, noop), category, ())


def category_peaks(results: tuple[TaskResult, ...], categories: dict[Key, str]) -> dict[str, int]:
    """A category's peak as the scheduler folds it: its tries' RSS after and peak."""
    peaks: dict[str, int] = {}
    for res in results:
        cat = categories[res.key]
        peaks[cat] = max(peaks.get(cat, 0), res.rss, res.rss_peak)
    return peaks


# ----------------------------------------------------------------------------- the core


def test_a_sample_is_the_peak_of_the_tasks_executing_not_of_those_waiting() -> None:
    """One thread, two tasks handed over (saturation 2): the samples taken while ``hog``
    executes are its peak, none of them ``nap``'s, which executed before it."""
    s = WorkerState("w", 1, MemoryConfig.of(4096 * MiB))
    nap, hog = to_run("nap-0", "nap"), to_run("hog-0", "hog")
    assert s.handle(TasksAssigned(0.0, (nap, hog))) == [Submit(nap), Submit(hog)]
    s.validate()
    s.handle(
        MemorySampled(0.05, 80 * MiB, executing=("nap-0",)),  # nap executes; hog waits
        MemorySampled(0.10, 78 * MiB),  # between the two: nobody's
        MemorySampled(0.15, 300 * MiB, executing=("hog-0",)),  # hog allocates...
        MemorySampled(0.20, 676 * MiB, executing=("hog-0",)),  # ...to its peak
        MemorySampled(0.25, 500 * MiB, executing=("hog-0",)),  # and lets some go
    )
    s.validate()
    # The thread ran them back to back: both results come in one batch, after hog's end
    # (its memory freed: the RSS right after it is back down).
    out = s.handle(
        TasksFinished(
            3.0,
            (
                (TaskResult("nap-0", "ok", 0.0, 0.06, 28, 76 * MiB, rss_before=75 * MiB), 0),
                (TaskResult("hog-0", "ok", 0.06, 3.0, 28, 76 * MiB, rss_before=76 * MiB), 1),
            ),
        )
    )
    s.validate()
    (report,) = [c for c in out if isinstance(c, ReportDone)]
    by_key = {r.key: r for r in report.results}
    assert by_key["nap-0"].rss_peak == 80 * MiB
    assert by_key["hog-0"].rss_peak == 676 * MiB
    categories: dict[Key, str] = {"nap-0": "nap", "hog-0": "hog"}
    assert category_peaks(report.results, categories) == {"nap": 80 * MiB, "hog": 676 * MiB}


def test_a_task_waiting_behind_another_gets_no_peak_until_it_executes() -> None:
    """Queued first, ``load``s keep the thread; ``hog`` waits, then executes alone."""
    s = WorkerState("w", 1, MemoryConfig.of(4096 * MiB))
    load, hog = to_run("load-0", "load"), to_run("hog-0", "hog")
    s.handle(TasksAssigned(0.0, (load, hog)))
    s.handle(MemorySampled(0.05, 90 * MiB, executing=("load-0",)))
    out = s.handle(
        TasksFinished(0.1, ((TaskResult("load-0", "ok", 0.0, 0.1, 8, 74 * MiB), 0),)),
        MemorySampled(0.2, 671 * MiB, executing=("hog-0",)),
        TasksFinished(3.0, ((TaskResult("hog-0", "ok", 0.1, 3.0, 8, 74 * MiB), 0),)),
    )
    s.validate()
    reports = [r for c in out if isinstance(c, ReportDone) for r in c.results]
    assert [(r.key, r.rss_peak) for r in reports] == [
        ("load-0", 90 * MiB),
        ("hog-0", 671 * MiB),
    ]


# ----------------------------------------------------------------------------- the executor


async def test_the_thread_executor_names_the_task_executing_not_the_one_queued(
    tmp_path: Path,
) -> None:
    done: list[TaskResult] = []
    ex = Executor(1, "w1", lambda batch: done.extend(r for r, _ in batch))
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        assert ex.executing() == ()
        ex.submit(ToRun("held", Task("held", held_at_gate, str(gate), str(started)), "t", ()), {})
        ex.submit(ToRun("next", Task("next", noop), "t", ()), {})
        await wait_until(started.exists, limit=BOUND)
        assert ex.executing() == ("held",)  # "next" waits in the queue
        gate.touch()
        await wait_until(lambda: len(done) == 2, limit=BOUND)
        assert ex.executing() == ()
    finally:
        gate.touch()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)


async def test_a_key_started_again_after_a_cancel_is_executing_while_the_old_try_ends(
    tmp_path: Path,
) -> None:
    """A cancelled try's thread is abandoned and the key may start again on a fresh
    thread before the old try ends: its end must not unname the newer try."""
    done: list[TaskResult] = []
    ex = Executor(1, "w1", lambda batch: done.extend(r for r, _ in batch))
    old_gate, old_started = tmp_path / "old-gate", tmp_path / "old-started"
    new_gate, new_started = tmp_path / "new-gate", tmp_path / "new-started"
    try:
        ex.submit(ToRun("k", Task("k", held_at_gate, str(old_gate), str(old_started)), "t", ()), {})
        await wait_until(old_started.exists, limit=BOUND)
        ex.cancel("k")  # reported cancelled at once; its thread is abandoned
        await wait_until(lambda: done, limit=BOUND)
        ex.submit(ToRun("k", Task("k", held_at_gate, str(new_gate), str(new_started)), "t", ()), {})
        await wait_until(new_started.exists, limit=BOUND)
        old_gate.touch()
        await wait_until(lambda: ex.abandoned == 0, limit=BOUND)  # the old try ended
        assert ex.executing() == ("k",)
        new_gate.touch()
        await wait_until(lambda: len(done) == 2, limit=BOUND)
        assert [r.outcome for r in done] == ["cancelled", "ok"]
        assert ex.executing() == ()
    finally:
        old_gate.touch()
        new_gate.touch()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)


# ----------------------------------------------------------------------------- end to end

ALLOC = 300 * MiB
#: the worker's limit: its throttle fence (0.7 of it, 308 MiB) is above the allocation,
#: so a worker seen throttled was sampled at more than ``ALLOC`` (a worker process alone
#: holds about 100 MiB, so the allocation takes it past the fence)
MEMORY = 440 * MiB


def nap() -> int:
    return 0


def hog(nbytes: int, allocated: str, gate: str) -> int:
    """Allocate ``nbytes`` (every page touched), say so, hold them until the gate
    opens, then let them go: the RSS right after the task is back down."""
    block = np.ones(nbytes // 8)
    Path(allocated).touch()
    deadline = time.monotonic() + LIMIT
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    del block
    return nbytes


async def test_a_task_handed_over_with_another_gets_its_peak(tmp_path: Path) -> None:
    """The auditor's repro: one thread, ``nap`` and ``hog`` handed over together (the
    worker holds two tasks for its one thread). ``hog``'s category peak is at least
    what it allocated; ``nap``, which never executed while that memory was held, is not
    credited with it."""
    allocated, gate = tmp_path / "allocated", tmp_path / "gate"
    options = {"spill": None, "terminate": None}
    graph: dict[Key, Any] = {
        "nap-0": (nap,),
        "hog-0": (hog, ALLOC, str(allocated), str(gate)),
    }
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(
                processes=1, threads_per_worker=1, memory_per_worker=MEMORY,
                memory_options=options,
            ) as c:  # fmt: skip
                await c.wait_for_workers(1, timeout=60)
                futures = await c.submit_graph(graph, list(graph))  # one batch: both go
                await wait_until(allocated.exists)

                async def throttled() -> bool:
                    return bool((await c.status())["throttled"])

                # A sample past the throttle fence (above ALLOC) while hog holds it.
                await wait_until(throttled, step=0.05)
                gate.touch()
                assert [await f for f in futures] == [0, ALLOC]
                st = await c.status()
                text = render(await c._manager.ask(MetricsRequest())).decode()
    finally:
        gate.touch()
    cats = st["categories"]
    assert cats["hog"]["peak_rss"] >= ALLOC, cats
    assert cats["nap"]["peak_rss"] < ALLOC, cats
    gauge = {
        s.labels["category"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "corral_task_peak_rss_bytes"
        for s in fam.samples
    }
    assert gauge["hog"] == cats["hog"]["peak_rss"]
