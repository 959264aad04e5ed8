"""A task longer than its pool's walltime fails with ``TaskLongerThanWalltime`` (or
moves to its pool's fallback) instead of being retried into the same wall, walltime
after walltime; a task cut short that started late in its worker's life keeps its free
retry.

The scheduler's pure core is fed joins with deadlines, the leaving worker's word of how
long each of its tasks had executed (``WorkerLeaving.executed``) and the walltime loss,
all at chosen times; then a real worker process with ``--deadline`` that gets SIGTERM
at its deadline (as a Slurm job's does) fails a task too long for it, and the manager
warns that the task ran into the walltime.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path

import anyio
import pytest

from actors.executor import BaseExecutor, Executor, ProcessExecutor
from actors.protocol import TaskResult, ToRun
from actors.scheduler_events import (
    Command,
    GraphSubmitted,
    KeyErred,
    KeysReleased,
    TaskCheckpointed,
    TasksFinished,
    Tick,
    WorkerLeaving,
    WorkerLeft,
)
from actors.scheduler_records import TaskState, TaskStateView
from actors.scheduler_state import SchedulerState
from policies import REGISTRY, WalltimeLoss
from runtime.errors import TaskLongerThanWalltime, WorkerLost
from runtime.graph import Task, TaskSpec
from tests.helpers import (
    Cli,
    Factory,
    assigned,
    held_at_gate,
    make_state,
    of,
    result,
    specs_for,
    wait_until,
)
from tests.test_walltime import T0, at
from tests.test_walltime import join as join_in

__all__ = ["make_state"]

LIMIT = 60
POOL = "audwt"


def join(
    s: SchedulerState, t: float, worker: str, deadline: float | None, pool: str = POOL
) -> list[Command]:
    return join_in(s, t, worker, deadline, pool)


def submit(s: SchedulerState, t: float, *keys: str, pool: str = POOL) -> list[Command]:
    specs = specs_for(s, {k: [] for k in keys}, list(keys), pool=pool)
    return at(s, t, GraphSubmitted, specs=specs, wanted=keys)


def walltime_end(
    s: SchedulerState, t: float, worker: str, executed: dict[str, float]
) -> list[Command]:
    """``worker`` reaches its walltime at ``t``: it says it is leaving, with the seconds
    each task it executes has executed, and goes."""
    at(
        s, t, WorkerLeaving, worker=worker, cause="walltime",
        executing=frozenset(executed), executed=tuple(executed.items()),
    )  # fmt: skip
    return at(s, t, WorkerLeft, worker=worker, cause="walltime")


def cut(
    s: SchedulerState, key: str, sent: float, ran: float, other: str, deadline: float | None
) -> list[Command]:
    """``key`` is sent at ``sent`` to ``w1`` (joined at 0, its walltime at 120 s), then
    worker ``other`` (with ``deadline``) joins, and ``w1`` reaches its walltime having
    executed ``key`` for ``ran`` seconds."""
    join(s, 0, "w1", deadline=120)
    assert assigned(submit(s, sent, key)) == {"w1": [key]}
    join(s, sent + 1, other, deadline=deadline)
    return walltime_end(s, 120, "w1", {key: ran})


def retries(s: SchedulerState, key: str) -> list[str]:
    return [e[2] for e in s.story(key) if e[1] == "retry"]


def test_a_task_that_had_its_workers_whole_life_fails_longer_than_walltime(
    make_state: Factory,
) -> None:
    """The user's audit: a 150 s task in a pool whose workers live 120 s, drained 30 s
    before. It ran its worker's whole life; the block that replaced it (joined at its
    drain) would cut it short again, so it fails at once, not after max_lost walltimes,
    with an error that names it, how long it ran, the walltime and drain, and what to
    do, not 'raise the retry policy's limit'."""
    s = make_state(drain_periods={POOL: 30.0}, saturation=1.0)
    join(s, 0, "audwt-1", deadline=120)
    assert assigned(submit(s, 0, "work")) == {"audwt-1": ["work"]}
    at(s, 90, Tick)
    assert s.workers["audwt-1"].walltime_drain
    join(s, 95, "audwt-2", deadline=215)  # the fresh block, asked for at the drain
    out = walltime_end(s, 120, "audwt-1", {"work": 119.5})
    assert assigned(out) == {}  # not sent into the same wall
    (ke,) = of(out, KeyErred)
    err = ke.error
    assert isinstance(err, TaskLongerThanWalltime) and isinstance(err, WorkerLost)
    assert (err.key, err.worker, err.cause, err.pool, err.tries) == (
        "work", "audwt-1", "walltime", POOL, 1,
    )  # fmt: skip
    assert (err.ran, err.walltime, err.drain) == (pytest.approx(119.5), 120.0, 30.0)
    assert str(err) == (
        "task 'work' ran 2 min on worker 'audwt-1' and was still running when the walltime "
        "of pool 'audwt' ended it: its workers live 2 min (drained 30 s before the "
        "end), and it had about all of that, so it is not retried into the same wall. "
        "Raise the pool's walltime, split the task into shorter ones, have it checkpoint "
        "(runtime.checkpoint) so that a retry resumes, or send it to a pool without a "
        "walltime (pool=, or the retry policy's fallback for this pool)."
    )
    assert "raise the retry policy's limit" not in str(err)
    assert s.tasks["work"].state == "erred" and retries(s, "work") == []
    assert ("processing", "walltime:ran 120 s of 120 s (drain 30 s)") in [
        (e[1], e[2]) for e in s.story("work")
    ]
    back = pickle.loads(pickle.dumps(err))  # it crosses to the client
    assert type(back) is TaskLongerThanWalltime and back.fields == err.fields


def test_a_task_that_started_late_in_its_workers_life_gets_its_free_retry(
    make_state: Factory,
) -> None:
    """Two tries cut short by the walltime that did not have their worker's life: one
    sent at 0 that waited 80 s behind another task in the worker's queue (it executed
    40 s, though it was sent 120 s before), one sent 60 s into the worker's life. Each
    gets its free retry, on the fresh worker."""
    s = make_state(unknown_long=False, drain_periods={POOL: 30.0}, saturation=2.0)
    join(s, 0, "w1", deadline=120)
    assert assigned(submit(s, 0, "first", "queued")) == {"w1": ["first", "queued"]}
    at(s, 80, TasksFinished, worker="w1", results=(result("first", start=T0, duration=80),))
    at(s, 80, KeysReleased, keys=("first",))
    join(s, 95, "w2", deadline=215)
    out = walltime_end(s, 120, "w1", {"queued": 40.0})
    assert of(out, KeyErred) == [] and assigned(out) == {"w2": ["queued"]}
    assert retries(s, "queued") == ["worker lost (walltime); free retry"]

    s = make_state(unknown_long=False, drain_periods={POOL: 30.0}, saturation=1.0)
    out = cut(s, "late", sent=60, ran=60.0, other="w2", deadline=215)
    assert of(out, KeyErred) == [] and assigned(out) == {"w2": ["late"]}
    assert retries(s, "late") == ["worker lost (walltime); free retry"]


def test_a_worker_of_the_pool_without_a_walltime_could_give_it_longer(
    make_state: Factory,
) -> None:
    """Its worker's whole life, but another worker of its pool has no walltime: that
    one can run it to the end, so it is retried (there), free."""
    s = make_state(drain_periods={POOL: 30.0}, saturation=1.0)
    out = cut(s, "work", sent=0, ran=120.0, other="forever", deadline=None)
    assert of(out, KeyErred) == [] and assigned(out) == {"forever": ["work"]}
    assert retries(s, "work") == ["worker lost (walltime); free retry"]


def test_a_task_too_long_for_the_walltime_moves_to_the_fallback_pool(
    make_state: Factory,
) -> None:
    """With a fallback for its pool (the retry policy's ``fallback``), the task too long
    for the walltime moves there, free, instead of failing."""
    retry = REGISTRY.create("retry", "default", {"fallback": {POOL: "owner"}})
    s = make_state(retry=retry, drain_periods={POOL: 30.0}, saturation=1.0)
    join(s, 0, "w1", deadline=120)
    join(s, 0, "o1", deadline=None, pool="owner")
    assert assigned(submit(s, 0, "work")) == {"w1": ["work"]}
    join(s, 95, "w2", deadline=215)
    out = walltime_end(s, 120, "w1", {"work": 118.0})
    assert of(out, KeyErred) == [] and assigned(out) == {"o1": ["work"]}
    ts = s.tasks["work"]
    assert ts.spec.pool == "owner" and ts.retries_left == 0
    assert retries(s, "work") == [
        "lost to the walltime after running 118 s of the 120 s a worker of 'audwt' lives: "
        "longer than its walltime, moved to 'owner'"
    ]
    assert ("pool", "audwt->owner") in [(e[1], e[2]) for e in s.story("work")]


def test_a_task_that_left_a_checkpoint_resumes_rather_than_fail(make_state: Factory) -> None:
    """A task that saved a checkpoint (copied off its worker) resumes from it on the next
    worker: it is not judged too long for the walltime."""
    s = make_state(drain_periods={POOL: 30.0}, saturation=1.0)
    join(s, 0, "w1", deadline=120)
    join(s, 0, "w0", deadline=120, pool="other")  # holds the checkpoint's copy
    assert assigned(submit(s, 0, "work")) == {"w1": ["work"]}
    at(s, 50, TaskCheckpointed, worker="w1", key="work", seq=1, nbytes=10, data=b"x" * 10)
    join(s, 95, "w2", deadline=215)
    out = walltime_end(s, 120, "w1", {"work": 120.0})
    assert of(out, KeyErred) == [] and assigned(out) == {"w2": ["work"]}


def test_a_worker_that_does_not_say_how_long_its_tasks_ran_loses_none_to_this(
    make_state: Factory,
) -> None:
    """A loss to the walltime with no word of what executed how long (a worker that
    left without saying): a free retry, as before."""
    s = make_state(drain_periods={POOL: 30.0}, saturation=1.0)
    join(s, 0, "w1", deadline=120)
    assert assigned(submit(s, 0, "work")) == {"w1": ["work"]}
    join(s, 95, "w2", deadline=215)
    out = at(s, 120, WorkerLeft, worker="w1", cause="walltime")
    assert of(out, KeyErred) == [] and assigned(out) == {"w2": ["work"]}


def view(loss: WalltimeLoss | None, pool: str | None = POOL) -> TaskStateView:
    ts = TaskState(TaskSpec("k", None, (), "k", pool=pool), 0)  # type: ignore[arg-type]
    ts.lost_tries = 1
    return TaskStateView(ts, walltime_loss=loss)


@pytest.mark.parametrize(
    ("ran", "walltime", "drain", "whole"),
    [
        (90.0, 120.0, 30.0, True),  # started in the first drain period of its worker
        (89.0, 120.0, 30.0, False),  # started after it: a fresh worker may do
        (59.0, 120.0, 90.0, False),  # a drain longer than half: at least half the life
        (60.0, 120.0, 90.0, True),
    ],
)
def test_the_retry_policy_fails_a_whole_life_walltime_loss_only(
    ran: float, walltime: float, drain: float, whole: bool
) -> None:
    loss = WalltimeLoss(ran, walltime, drain, POOL)
    assert loss.whole_life is whole
    retry = REGISTRY.create("retry", "default")
    decision = retry.decide(view(loss), "worker-lost", "walltime")
    assert decision.retry is not whole
    # The same loss given another cause, or none known, is a free retry.
    assert retry.decide(view(loss), "worker-lost", "preempted").retry
    assert retry.decide(view(None), "worker-lost", "walltime").retry


def noop() -> None:
    return None


@pytest.mark.anyio
@pytest.mark.parametrize("mode", [Executor, ProcessExecutor], ids=["thread", "process"])
async def test_an_executor_says_how_long_each_executing_task_has_executed(
    tmp_path: Path, mode: type[Executor] | type[ProcessExecutor]
) -> None:
    """What a leaving worker says (``Leaving.executed``): the seconds each task it
    executes has executed, counted from its start, not from its arrival: the task
    queued behind it is not named."""
    done: list[TaskResult] = []
    ex: BaseExecutor = mode(1, "w1", lambda batch: done.extend(r for r, _ in batch))
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        assert ex.executing_for() == {}
        ex.submit(ToRun("held", Task("held", held_at_gate, str(gate), str(started)), "t", ()), {})
        ex.submit(ToRun("next", Task("next", noop), "t", ()), {})
        await wait_until(started.exists, limit=LIMIT)
        first = ex.executing_for()
        assert list(first) == ["held"] and first["held"] >= 0.0
        await wait_until(lambda: ex.executing_for()["held"] > first["held"], limit=LIMIT)
        gate.touch()
        await wait_until(lambda: len(done) == 2, limit=LIMIT)
        assert ex.executing_for() == {}
    finally:
        gate.touch()
        with anyio.fail_after(LIMIT):
            await anyio.to_thread.run_sync(ex.shutdown, True)


@pytest.mark.anyio
async def test_a_worker_process_signalled_at_its_deadline_fails_a_task_too_long(
    tmp_path: Path,
) -> None:
    """A real worker with a deadline 6 s out runs a task that never ends; at its
    deadline it gets SIGTERM (as Slurm signals a job at its time limit). It says what it
    executed as it leaves, the manager warns that the task ran into the walltime, and
    the client gets TaskLongerThanWalltime, at once (no second worker's walltime)."""
    from runtime import Cluster

    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = cli.manager()
        deadline = time.time() + 6
        timed = cli.worker(address, "--name", "timed", "--deadline", str(deadline))
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            (fut,) = await c.submit_graph({"t": (held_at_gate, str(gate), str(started))}, ["t"])
            await wait_until(started.exists, limit=LIMIT)
            await wait_until(lambda: time.time() > deadline, "the deadline", limit=LIMIT)
            os.kill(timed.pid, signal.SIGTERM)
            with pytest.raises(TaskLongerThanWalltime) as caught:
                await fut
            gate.touch()
            assert caught.value.worker == "timed" and caught.value.pool == "default"
            assert caught.value.ran >= caught.value.walltime / 2
            line = cli.line_with(manager, "tasks ran into the walltime", limit=LIMIT)
            assert "level='warning'" in line and "worker='timed'" in line
            assert "running=['t']" in line
