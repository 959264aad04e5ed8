"""The worker actor when one of its core's commands fails, or a cancel crosses a try's
result: the task it concerned ends its try, reported to the scheduler, instead of
counting as running for ever, and a key's next try runs.

In-process and gated on messages (the worker's helpers of tests/test_worker_memory.py):
the actor, its executor threads and its store are real."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.graph import TaskRef
from runtime.messages import CancelTasks, RunTasks, StatusRequest
from tests.test_worker_memory import LIMIT, MB, run, worker

pytestmark = pytest.mark.anyio


def one() -> int:
    return 1


def plus_one(x: int) -> int:
    return x + 1


async def test_a_task_whose_input_is_gone_from_the_store_is_reported_missing(
    tmp_path: Path,
) -> None:
    """The audit's hang: the core counted an input as held that the store no longer had
    (dropped as a cancelled try's junk while its reader waited). Reading it failed the
    message's handler, and the reader stayed "running" for ever, never started."""
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, [100 * MB]) as (w, ref, sched):
            ref.post(RunTasks((run("a", one),)))
            await sched.until(lambda: "a" in sched.done)
            del w.data["a"]  # behind the core's back
            ref.post(RunTasks((run("b", plus_one, TaskRef("a")),)))
            await sched.until(lambda: "b" in sched.done)
            res = sched.done["b"]
            assert res.outcome == "missing" and res.missing == (("a", "w1"),)
            assert "b" not in w.state.active  # its slot is free: the next task runs
            ref.post(RunTasks((run("c", one),)))
            await sched.until(lambda: "c" in sched.done)
            assert sched.done["c"].outcome == "ok"


async def test_a_task_the_executor_refuses_fails_with_the_executor_s_error(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, [100 * MB]) as (w, ref, sched):
            await sched.until(lambda: w.executor is not None)
            assert w.executor is not None

            def refuse(task: Any, inputs: Any) -> None:
                raise RuntimeError("no room in the executor")

            w.executor.submit = refuse  # type: ignore[method-assign]
            ref.post(RunTasks((run("a", one),)))
            await sched.until(lambda: "a" in sched.done)
            res = sched.done["a"]
            assert res.outcome == "error" and isinstance(res.error, RuntimeError)
            assert not w.state.active


def gated(started: threading.Event, go: threading.Event) -> int:
    started.set()
    go.wait(LIMIT)
    return 2


async def test_a_cancel_that_crosses_its_try_s_result_does_not_cancel_the_next_try(
    tmp_path: Path,
) -> None:
    """The race under the audit's hang: a speculative copy elsewhere wins just as this
    worker's try ends ok, so the scheduler's cancel reaches the worker after the
    executor delivered the try. The executor must not keep that cancel for the key's
    next try here (it came back ``cancelled`` without running)."""
    started, go = threading.Event(), threading.Event()
    with anyio.fail_after(LIMIT):
        async with worker(tmp_path, [100 * MB]) as (w, ref, sched):
            held: list[Any] = []
            arrived = anyio.Event()

            def hold(batch: list[Any]) -> None:  # the results wait here
                held.extend(batch)
                arrived.set()

            await sched.until(lambda: w.executor is not None)
            ex = w.executor
            assert ex is not None
            deliver = ex._deliver
            ex._deliver = hold
            ref.post(RunTasks((dataclasses.replace(run("a", gated, started, go), attempt=1),)))
            await anyio.to_thread.run_sync(started.wait, LIMIT)
            go.set()
            await arrived.wait()  # delivered by the executor; the worker has not seen it
            ref.post(CancelTasks(("a",)))
            await ref.ask(StatusRequest())  # the cancel was handled
            deliver(held)  # then the try comes back
            await sched.until(lambda: "a" in sched.done)
            assert sched.done["a"].outcome == "cancelled"
            ex._deliver = deliver
            ref.post(RunTasks((dataclasses.replace(run("a", gated, started, go), attempt=2),)))
            await sched.until(lambda: sched.done["a"].attempt == 2)
            assert sched.done["a"].outcome == "ok"
