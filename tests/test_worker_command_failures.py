"""The worker actor when one of its core's commands fails: the task it concerned ends
its try, reported to the scheduler, instead of counting as running for ever.

In-process and gated on messages (the worker's helpers of tests/test_worker_memory.py):
the actor, its executor threads and its store are real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.graph import TaskRef
from runtime.messages import RunTasks
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
