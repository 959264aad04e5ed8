"""A try that times out (or is cancelled) in thread execution cannot be stopped: its
thread is abandoned and a fresh one takes its slot, up to as many abandoned threads as
the worker has. Past that the thread *holds* its slot until the call returns; its try
is reported at once all the same (``TaskTimeout`` comes at the timeout), and the worker
reports the slot held (``WorkerMemoryReport.held``), so the scheduler core sends no
task for it: a retry goes to another worker, or waits in the scheduler, its story
saying why. A task with a timeout goes to a worker that can still stop it when it can.
(The audit's defect: 2 workers x 1 thread, ``timeout=2, retries=1`` of a 30 s hang
failed after 32 s, both tries on the same worker, the other idle.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from actors.scheduler_events import WorkerMemory
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import TaskTimeout
from tests.helpers import GB, Factory, assigned, event, finish, join, make_state, run, submit

__all__ = ["make_state"]  # the fixture, used by name

LIMIT = 60  # seconds the cluster test may take


def report(s: SchedulerState, worker: str, *, abandoned: int = 0, held: int = 0) -> Any:
    """``worker``'s memory report, with its abandoned and held threads."""
    return run(
        s,
        event(
            WorkerMemory, worker=worker, throttled=False, rss=GB // 10, throttle_at=GB // 2,
            limit=GB, abandoned=abandoned, held=held,
        ),
    )  # fmt: skip


def timed_out(key: str, worker: str) -> TaskTimeout:
    return TaskTimeout(key, worker, 2.0, 2.0)


# ----------------------------------------------------------------------------- the core


def test_a_slot_held_by_a_thread_that_could_not_be_stopped_gets_no_task(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    report(s, "w1", abandoned=1, held=1)  # its one thread is held
    assert assigned(submit(s, {"a": []}, ["a"])) == {"w2": ["a"]}
    assert assigned(submit(s, {"b": []}, ["b"])) == {}  # w2 busy, w1 held: b waits here
    assert s.tasks["b"].state == "queued"
    assert any(row[1] == "held" for row in s.story("w1"))
    # The held thread's call returned: its slot takes a task again.
    assert assigned(report(s, "w1", abandoned=1, held=0)) == {"w1": ["b"]}


def test_a_timed_out_try_is_retried_on_the_worker_that_can_still_stop_it(
    make_state: Factory,
) -> None:
    """The audit's scenario, on the core: w1 abandoned its one thread at the timeout
    (a fresh thread has the slot, but it could stop no other try); the retry goes to
    w2, not behind w1's limit."""
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    opts = {"a": {"timeout": 2.0, "retries": 1}}
    assert assigned(submit(s, {"a": []}, ["a"], attrs=opts)) == {"w1": ["a"]}
    report(s, "w1", abandoned=1)  # sent before the try's report
    cmds = finish(s, "w1", "a", "timeout", error=timed_out("a", "w1"))
    assert assigned(cmds) == {"w2": ["a"]}
    # A task without a timeout is not kept from w1's fresh thread.
    assert assigned(submit(s, {"b": []}, ["b"])) == {"w1": ["b"]}


def test_a_retry_whose_only_worker_is_held_waits_in_the_scheduler_and_says_why(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    opts = {"a": {"timeout": 2.0, "retries": 1}}
    assert assigned(submit(s, {"a": []}, ["a"], attrs=opts)) == {"w1": ["a"]}
    report(s, "w1", abandoned=1, held=1)  # the try could not be stopped
    cmds = finish(s, "w1", "a", "timeout", error=timed_out("a", "w1"))
    assert assigned(cmds) == {} and s.tasks["a"].state == "queued"
    (why,) = [row[2] for row in s.story("a") if row[1] == "held"]
    assert "could not be stopped on w1" in why and "waits here" in why
    assert assigned(report(s, "w1", abandoned=1, held=0)) == {"w1": ["a"]}


# ----------------------------------------------------------------------------- a cluster


def hang(release: threading.Event, seconds: float) -> None:
    """Hang until ``release`` is set, at most ``seconds``."""
    release.wait(seconds)


@pytest.mark.anyio
async def test_a_retried_hang_times_out_on_the_idle_worker_not_behind_the_stuck_one() -> None:
    """2 workers x 1 thread, a 20 s hang with ``timeout=1, retries=1``: the second try
    runs on the other worker and ``TaskTimeout`` comes after about 2 s, not when the
    hang ends. The hang is released at the end, so no thread outlives the test."""
    release = threading.Event()
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(workers=2, threads_per_worker=1) as c:
                await c.wait_for_workers(2, timeout=30)
                began = time.monotonic()
                f = c.submit(hang, release, 20.0, timeout=1, retries=1, pure=False)
                with pytest.raises(TaskTimeout):
                    await f
                took = time.monotonic() - began
                tries = c.scheduler_state.tasks[f.key].tries
                assert [t.outcome for t in tries] == ["timeout", "timeout"]
                assert len({t.worker for t in tries}) == 2, tries  # the idle worker ran one
                assert took < 8.0, f"TaskTimeout after {took:.1f} s"
                release.set()
    finally:
        release.set()
