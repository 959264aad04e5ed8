"""Walltime: a worker with a deadline is drained before it, and a task is not started
where it would be cut short while another worker could take it.

The scheduler's pure core is fed joins with deadlines, finishes that teach it how long
a category's tasks take, and ticks, all at chosen times; then a real worker process
with ``--deadline`` registers and the scheduler sees that deadline.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from actors.autoscaler import drained_for_walltime, drained_since_joined
from actors.scheduler_events import (
    Command,
    Event,
    GraphSubmitted,
    KeysReleased,
    RetireWorker,
    TasksFinished,
    TasksRunning,
    Tick,
    WorkerDraining,
    WorkerJoined,
)
from actors.scheduler_state import SchedulerState
from tests.helpers import (
    Cli,
    Factory,
    assigned,
    held_at_gate,
    make_state,
    of,
    result,
    run,
    specs_for,
    wait_until,
)

__all__ = ["make_state"]

T0 = 2e6  # later than any time tests.helpers.event has handed out
LIMIT = 60


def at(state: SchedulerState, t: float, cls: type[Event], **fields: Any) -> list[Command]:
    return run(state, cls(stimulus_id=f"{cls.__name__}@{t}", now=T0 + t, **fields))


def join(
    s: SchedulerState, t: float, worker: str, deadline: float | None, pool: str = "default"
) -> list[Command]:
    when = None if deadline is None else T0 + deadline
    return at(s, t, WorkerJoined, worker=worker, cores=1, memory=2**30, deadline=when, pool=pool)


def submit(s: SchedulerState, t: float, *keys: str) -> list[Command]:
    specs = specs_for(s, {k: [] for k in keys}, list(keys))
    return at(s, t, GraphSubmitted, specs=specs, wanted=keys)


def learn(s: SchedulerState, t: float, worker: str, key: str, seconds: float) -> list[Command]:
    """``key`` (sent to ``worker``) took ``seconds``."""
    res = result(key, start=T0 + t - seconds, duration=seconds)
    return at(s, t, TasksFinished, worker=worker, results=(res,))


def test_a_worker_is_drained_its_longest_task_plus_grace_before_its_walltime(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, walltime_grace=60.0)
    join(s, 0, "w", deadline=1000)
    assert assigned(submit(s, 0, "long-1")) == {"w": ["long-1"]}
    learn(s, 300, "w", "long-1", 300)
    at(s, 301, KeysReleased, keys=("long-1",))  # the client has it: nothing to keep
    assert s.drain_margin(s.workers["w"]) == 360.0
    assert of(at(s, 630, Tick), RetireWorker) == []  # 370 s left: not yet
    assert not s.workers["w"].draining
    out = at(s, 641, Tick)  # 359 s left: drained, and retired at once (it is idle)
    assert of(out, RetireWorker) == [RetireWorker(f"Tick@{641}", "w", "walltime")]
    (why,) = [e[2] for e in s.story("w") if e[1] == "joined" and e[2].startswith("draining")]
    assert why == "draining:walltime in 359 s"


def test_the_scheduler_tells_its_walltime_drain_from_an_operators(make_state: Factory) -> None:
    """Both workers of a pool with a walltime drain: ``v`` because an operator drained
    it (``WorkerDraining``, the console's ``drain``), ``w`` because its walltime is
    near. The core marks only ``w``'s as the walltime's (the status's
    ``walltime_draining``), and their stories say which drain each was, so the
    autoscaler reports the end of ``v``'s block ``drained`` and ``w``'s ``walltime``."""
    s = make_state(drain_period=30.0)
    join(s, 0, "w", deadline=100)
    join(s, 0, "v", deadline=1000)
    at(s, 10, WorkerDraining, worker="v")
    at(s, 70, Tick)  # 30 s before w's walltime
    assert s.workers["v"].draining and s.workers["w"].draining
    assert (s.workers["v"].walltime_drain, s.workers["w"].walltime_drain) == (False, True)
    assert not drained_for_walltime(s.story("v")) and drained_since_joined(s.story("v"))
    assert drained_for_walltime(s.story("w")) and drained_since_joined(s.story("w"))
    assert drained_for_walltime(s.story("v", "w"))  # a block of both: its walltime came


def test_a_walltime_drain_retires_its_worker_with_cause_walltime(make_state: Factory) -> None:
    """The worker the core drained for its walltime is retired with cause ``walltime``
    (the Stop it gets, so the cause it leaves with); one an operator drained, with
    ``drained``."""
    s = make_state(drain_period=30.0)
    join(s, 0, "w", deadline=100)
    join(s, 0, "v", deadline=1000)
    out = at(s, 10, WorkerDraining, worker="v")
    assert of(out, RetireWorker) == [RetireWorker("WorkerDraining@10", "v", "drained")]
    out = at(s, 70, Tick)
    assert of(out, RetireWorker) == [RetireWorker("Tick@70", "w", "walltime")]


def test_a_try_that_will_not_end_by_its_worker_s_walltime_is_due_again_at_it(
    make_state: Factory,
) -> None:
    """A user audit (condo): a long task that checkpoints, on a one-block pool whose
    walltime is shorter than it, waited a block's whole provisioning delay after each
    walltime ('no worker to run the ready tasks' each time): the block drained for its
    walltime counts no more, but its running try was no task ready or due, so no
    replacement was asked for until the try was lost. The scheduler's next wave
    (``upcoming``, the autoscaler's lookahead) now has such a try due at the deadline;
    one expected to end before it is not."""
    s = make_state(saturation=1.0, drain_period=30.0)
    join(s, 0, "w", deadline=100)
    submit(s, 0, "done-1")
    learn(s, 10, "w", "done-1", 10)  # the category takes 10 s
    at(s, 11, KeysReleased, keys=("done-1",))
    assert assigned(submit(s, 20, "long-1")) == {"w": ["long-1"]}
    assert s.upcoming(T0 + 60) == {}  # not drained yet: it may end in time
    at(s, 70, Tick)  # 30 s before the walltime: drained, long-1 runs late (50 s of 0.5)
    assert s.workers["w"].walltime_drain
    assert s.upcoming(T0 + 70) == {"*": [30.0]}
    assert s.upcoming(T0 + 99) == {"*": [1.0]}
    assert s.upcoming(T0 + 120) == {"*": [0.0]}  # past it: due now
    # A try expected to end before the deadline is not due: it ends there.
    s2 = make_state(saturation=1.0, drain_period=30.0)
    join(s2, 0, "v", deadline=100)
    submit(s2, 0, "done-1")
    learn(s2, 10, "v", "done-1", 10)
    at(s2, 11, KeysReleased, keys=("done-1",))
    assert assigned(submit(s2, 65, "done-2")) == {"v": ["done-2"]}
    at(s2, 70, Tick)
    assert s2.workers["v"].walltime_drain and s2.upcoming(T0 + 70) == {}


def test_a_cut_try_of_no_pool_is_due_only_in_the_pools_whose_workers_could_run_it(
    make_state: Factory,
) -> None:
    """A try of no pool asking for 4 cores, cut by its 8-core worker's walltime, is due
    at the deadline in 'big' (8-core workers) alone: under ``"*"`` the autoscaler
    counted it in 'cpu' (1-core workers) too, which then had a block asked for ahead of
    the deadline that could never run the retry, and idled out."""
    s = make_state(
        saturation=1.0, drain_period=30.0, pools=("cpu", "big"), pool_cores={"cpu": 1, "big": 8}
    )
    at(s, 0, WorkerJoined, worker="w", cores=8, memory=2**30, deadline=T0 + 100, pool="big")
    specs = specs_for(s, {"done-1": []}, ["done-1"], attrs={"done-1": {"category": "long"}})
    at(s, 0, GraphSubmitted, specs=specs, wanted=("done-1",))
    learn(s, 10, "w", "done-1", 10)  # the category takes 10 s
    at(s, 11, KeysReleased, keys=("done-1",))
    attrs = {"long-1": {"category": "long", "resources": {"cores": 4}}}
    specs = specs_for(s, {"long-1": []}, ["long-1"], attrs=attrs)
    assert assigned(at(s, 20, GraphSubmitted, specs=specs, wanted=("long-1",))) == {"w": ["long-1"]}
    at(s, 70, Tick)  # 30 s before the walltime: drained, long-1 runs late
    assert s.workers["w"].walltime_drain
    assert s.upcoming(T0 + 70) == {"big": [30.0]}


def test_tries_waiting_in_a_walltime_drained_worker_s_queue_are_due_only_if_cut(
    make_state: Factory,
) -> None:
    """Short tries wait in the queue of a worker drained for its walltime (it holds
    ``saturation`` tries per core): measured from when they were sent, their wait
    read as running late, past twice their mean, so each was due at the deadline and
    a block was asked for work that ends half a minute before it. A try waiting for a
    core is due there only if its whole mean from now ends past the deadline."""
    s = make_state(saturation=4.0, drain_period=30.0)
    join(s, 0, "w", deadline=100)
    submit(s, 0, "done-1")
    learn(s, 1, "w", "done-1", 0.5)  # the category takes 0.5 s: short, so tries queue
    at(s, 2, KeysReleased, keys=("done-1",))
    keys = ("done-2", "done-3", "done-4", "done-5")
    assert assigned(submit(s, 69, *keys)) == {"w": list(keys)}  # one core: they queue
    learn(s, 69.5, "w", "done-2", 0.5)
    learn(s, 69.9, "w", "done-3", 0.4)
    at(s, 70, Tick)  # 30 s before the walltime: drained
    assert s.workers["w"].walltime_drain
    at(s, 70.2, TasksRunning, worker="w", started=(("done-4", 0, 0.2),))  # began at 70
    assert s.upcoming(T0 + 70.75) == {}  # done-4 ends at 70.5, done-5 half a second after
    # Still there just before the deadline: each is cut there (done-4 runs late).
    assert s.upcoming(T0 + 99.75) == {"*": [0.25, 0.25]}


def test_a_fixed_drain_period_wins(make_state: Factory) -> None:
    s = make_state(drain_period=30.0)
    join(s, 0, "w", deadline=100)
    at(s, 69, Tick)
    assert not s.workers["w"].draining
    at(s, 70, Tick)
    assert s.workers["w"].draining


def test_each_pool_drains_its_workers_by_its_own_drain_period(make_state: Factory) -> None:
    """A pool's drain_period is its own workers': another pool's larger one (owner's 900
    s, with a week of walltime) does not drain a 10-minute block the moment it starts.
    A pool that sets none gets the default margin, a minute (no task finished yet)."""
    s = make_state(drain_periods={"owner": 900.0})
    join(s, 0, "c", deadline=600, pool="ckpt-cancel")
    join(s, 0, "o", deadline=7 * 86400, pool="owner")
    assert (s.drain_margin(s.workers["c"]), s.drain_margin(s.workers["o"])) == (60.0, 900.0)
    at(s, 539, Tick)
    assert not s.workers["c"].draining
    at(s, 540, Tick)
    assert s.workers["c"].draining and not s.workers["o"].draining
    at(s, 7 * 86400 - 901, Tick)
    assert not s.workers["o"].draining
    at(s, 7 * 86400 - 900, Tick)
    assert s.workers["o"].draining


def test_the_default_margin_counts_the_tasks_of_the_workers_pool(make_state: Factory) -> None:
    """The default margin is a minute plus the longest task that ran in the worker's own
    pool: a 300 s task of another pool does not drain a 10-minute worker at 4 minutes."""
    s = make_state(saturation=1.0)
    join(s, 0, "l", deadline=None, pool="long")
    submit(s, 0, "long-1")
    learn(s, 300, "l", "long-1", 300)
    join(s, 301, "w", deadline=901, pool="short")
    at(s, 840, Tick)
    assert not s.workers["w"].draining
    at(s, 841, Tick)
    assert s.workers["w"].draining


def test_the_default_margin_is_at_most_half_the_walltime(make_state: Factory) -> None:
    """A minute of walltime and no drain_period: the default margin (a minute plus the
    longest task) would drain the worker as it joins; capped at half the time from its
    joining to its walltime, it works 30 s first."""
    s = make_state()
    join(s, 0, "w", deadline=60)
    at(s, 0.5, Tick)
    at(s, 29, Tick)
    assert not s.workers["w"].draining
    at(s, 30, Tick)
    assert s.workers["w"].draining
    (why,) = [e[2] for e in s.story("w") if e[2].startswith("draining")]
    assert why == "draining:walltime in 30 s"


def test_a_task_waits_for_a_worker_with_time_rather_than_be_cut_short(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, drain_period=1.0)
    join(s, 0, "b", deadline=None)
    submit(s, 0, "long-1")
    learn(s, 300, "b", "long-1", 300)  # long tasks take 300 s
    submit(s, 301, "long-2")  # b runs it
    join(s, 302, "a", deadline=400)  # 98 s left: too short for a long task
    out = submit(s, 303, "long-3")
    assert assigned(out) == {}  # waits for b
    out = learn(s, 600, "b", "long-2", 299)
    assert assigned(out) == {"b": ["long-3"]}


def test_when_no_worker_has_the_time_a_short_lived_one_still_runs_it(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, drain_period=1.0)
    join(s, 0, "a", deadline=10_000)
    submit(s, 0, "long-1")
    learn(s, 300, "a", "long-1", 300)
    join(s, 301, "short", deadline=400)
    submit(s, 302, "long-2")  # a, with time, takes it
    out = submit(s, 303, "long-3")
    assert assigned(out) == {}  # a will have time again once free
    s2 = make_state(saturation=1.0, drain_period=1.0)
    join(s2, 0, "x", deadline=350)
    submit(s2, 0, "long-1")
    learn(s2, 300, "x", "long-1", 300)  # x has 50 s left; no worker has more
    assert assigned(submit(s2, 301, "long-2")) == {"x": ["long-2"]}


@pytest.mark.anyio
async def test_a_worker_process_deadline_reaches_the_scheduler(tmp_path: Path) -> None:
    from runtime import Cluster

    deadline = time.time() + 3600
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        cli.env["CORRAL_DEADLINE"] = str(deadline)  # what a Slurm block's script exports
        cli.worker(address, "--name", "timed")
        del cli.env["CORRAL_DEADLINE"]
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            status = await c.status()
            (info,) = [w for w in status["workers"] if w.worker_id == "timed"]
            assert info.deadline == pytest.approx(deadline)


def family(pid: int) -> set[int]:
    """``pid`` and its descendants (the CLI may run the worker in a child)."""
    return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}


def pid_after_gate(gate: str, started: str) -> int:
    held_at_gate(gate, started)
    return os.getpid()


@pytest.mark.anyio
async def test_a_worker_near_its_walltime_finishes_its_task_and_leaves_cleanly(
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        # Drained once fewer than walltime_grace (60 s) plus the longest task are left,
        # but after half the time from its joining to its deadline at least: ~7 s here.
        timed = cli.worker(address, "--name", "timed", "--deadline", str(time.time() + 16))
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            graph = {"t": (pid_after_gate, str(gate), str(started))}
            (first,) = await c.submit_graph(graph, ["t"])
            await wait_until(started.exists, limit=LIMIT)
            other = cli.worker(address, "--name", "other")
            await c.wait_for_workers(2)

            async def drained() -> bool:
                story = await c.story("timed")
                return any(e[2].startswith("draining:walltime") for e in story)

            await wait_until(drained, "the walltime drain", limit=LIMIT, step=0.2)
            # The status says which drain it is: the scheduler's own, for the walltime.
            status = await c.status()
            assert (status["draining"], status["walltime_draining"]) == (["timed"], ["timed"])
            (second,) = await c.submit_graph({"u": (pid_after_gate, str(gate), "/dev/null")}, ["u"])
            in_timed, in_other = family(timed.pid), family(other.pid)
            gate.touch()
            assert await first in in_timed  # ran there once: finished, and its output
            # was copied to the other worker when it was retired, not computed again
            assert await second in in_other  # nothing new went to the drained worker
            assert timed.wait(LIMIT) == 0  # retired once idle: it exits cleanly

            async def left() -> list[str]:
                return [e[2] for e in await c.story("timed") if e[2].startswith("left:")]

            # It left for its walltime, as the scheduler drained it: not "drained".
            assert await wait_until(left, "its leave", limit=LIMIT, step=0.1) == ["left:walltime"]
