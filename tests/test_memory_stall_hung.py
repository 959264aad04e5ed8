"""The memory watchdog's bound for hung tries (actors/scheduler_state.py,
``_memory_moves``, ``_stalls_with``, ``_fail_stalled``; docs/memory.md, "A task that
runs is not a stall, up to its bound"): what counts as waiting behind a try past its
bound, and what a stall declared then fails.

Review 1207c: "*" counted every active task of the cluster as waiting, a reserved
pool's and a pool's with no worker yet, so a hung try alone was failed, and a queued
task of a pool whose worker was still starting with it (F1); a consumer queued on a
worker whose other thread a stopped try held counted as running (F2); a pool's stall
discounted a hung try of no pool on its worker but neither failed nor named it (F3);
a hung try's own waiting dependent made "*" fail, a pool never (F4). One rule now, for
a pool and for "*" alike: what waits is a task the stall fails that is ready or sent to
the stalled workers and not executing, never one waiting for its inputs. Pure-core
tests with a virtual clock, exact commands out."""

from __future__ import annotations

from typing import Any

from actors.scheduler_events import (
    CancelOnWorker,
    FileFacts,
    GraphSubmitted,
    KeyErred,
    TasksFinished,
    TasksRunning,
    WorkerJoined,
    WorkerMemory,
)
from actors.scheduler_state import SchedulerState
from runtime.errors import MemoryStalled
from tests.helpers import GB, MB, Factory, make_state, of, on, result, run, specs_for
from tests.test_scheduler_memory import at, tick

__all__ = ["make_state"]  # the fixture, used by name


def throttle(s: SchedulerState, worker: str, now: float, held: int = 0) -> list[Any]:
    return run(s, WorkerMemory(
        stimulus_id=f"mem-{worker}-{now}", now=now, worker=worker, throttled=True,
        rss=int(0.75 * GB), throttle_at=int(0.7 * GB), limit=GB, held=held,
    ))  # fmt: skip


def hung_on_w1(s: SchedulerState, table: dict[str, list[str]] | None = None, **spec: Any) -> None:
    """w1 (one core, pool cpu) runs ``steady`` (of no pool unless ``spec`` says), which
    began at 98.5 and never ends, ``table``'s other tasks still to run; w1 is throttled
    at 100. Its bound is 150 s (30 ``stall_timeout``s of 5 s): past it at 248.5."""
    run(s, at(1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="cpu"))
    table = table or {"steady": []}
    specs = specs_for(s, table, list(table), **spec)
    run(s, at(2.0, GraphSubmitted, specs=specs, wanted=tuple(table)))
    assert on(s, "w1") == {"steady"}
    run(s, TasksRunning("ran", 99.0, "w1", (("steady", 0, 0.5),)))
    assert throttle(s, "w1", 100.0) == []


def test_a_hung_try_alone_is_no_stall_beside_a_reserved_pools_task(
    make_state: Factory,
) -> None:
    """A reserved pool's task, running on its own worker, is not among what the throttled
    any-pool workers could run: the hung try is alone there, and nothing fails nor is
    suspected (F1; "The 0 producer tasks still to run" failed ``steady``)."""
    s = make_state(saturation=1.0, stall_timeout=5.0, reserved_pools=frozenset({"gpu"}))
    run(s, at(1.5, WorkerJoined, worker="g1", cores=1, memory=GB, pool="gpu"))
    specs = specs_for(s, {"render": []}, ["render"], pool="gpu")
    run(s, at(1.8, GraphSubmitted, specs=specs, wanted=("render",)))
    assert on(s, "g1") == {"render"}
    hung_on_w1(s)
    for now in (249.0, 260.0, 1000.0):
        assert tick(s, now) == [] and not s.stalled_since
    assert s._memory_moves("*") == "nothing to run"
    assert (s.tasks["steady"].state, s.tasks["render"].state) == ("processing", "processing")


def test_a_hung_try_alone_fails_no_task_of_a_pool_with_no_worker_yet(
    make_state: Factory,
) -> None:
    """``render`` waits for a gpu worker (its block starting), not for w1's memory: with
    the hung try it is no stall, and it stays queued (F1; both failed)."""
    s = make_state(saturation=1.0, stall_timeout=5.0, pools=("cpu", "gpu"))
    hung_on_w1(s)
    specs = specs_for(s, {"render": []}, ["render"], pool="gpu")
    run(s, at(100.5, GraphSubmitted, specs=specs, wanted=("render",)))
    assert s.tasks["render"].state == "queued"
    for now in (249.0, 260.0, 1000.0):
        assert tick(s, now) == [] and not s.stalled_since
    assert (s.tasks["steady"].state, s.tasks["render"].state) == ("processing", "queued")


def test_a_stall_of_any_pool_fails_no_task_of_a_pool_with_no_worker(
    make_state: Factory,
) -> None:
    """With something of w1's to run (``wait``, deferred behind the hung try), "*" is
    stalled: it fails ``wait`` and the hung try, named, and leaves ``render`` queued for
    its pool's worker (F1)."""
    s = make_state(saturation=1.0, stall_timeout=5.0, pools=("cpu", "gpu"))
    hung_on_w1(s, {"steady": [], "wait": []})
    specs = specs_for(s, {"render": []}, ["render"], pool="gpu")
    run(s, at(100.5, GraphSubmitted, specs=specs, wanted=("render",)))
    assert tick(s, 248.5) == [] and not s.stalled_since
    assert tick(s, 249.0) == [] and s.stalled_since == {"*": 249.0}
    cmds = tick(s, 254.0)
    assert [type(c) for c in cmds] == [KeyErred, CancelOnWorker, KeyErred]
    assert [c.key for c in of(cmds, KeyErred)] == ["wait", "steady"]
    assert cmds[1] == CancelOnWorker("tick-254.0", "w1", ("steady",))
    err = cmds[0].error
    assert isinstance(err, MemoryStalled) and (err.pool, err.waiting) == (None, 1)
    assert err.executing == [("steady", "w1", 155.5, 150.0)]
    assert s.tasks["render"].state == "queued" and not s.stalled_since


def test_a_consumer_behind_a_hung_try_and_a_held_thread_is_no_progress(
    make_state: Factory,
) -> None:
    """Two cores on w1: load-1 hangs on one, a stopped try holds the other
    (``WorkerMemory.held``). ``sum-0``, sent there, can never start: past load-1's bound
    the stall fires (F2; "a consumer runs" for ever)."""
    s = make_state(stall_timeout=5.0, unknown_long=False)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=2, memory=GB, pool="default"))
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(6)}
    table["sum-0"] = ["load-0"]
    run(s, at(2.0, GraphSubmitted, specs=specs_for(s, table, list(table)), wanted=tuple(table)))
    done = result("load-0", duration=0.1, nbytes=300 * MB)
    run(s, at(90.0, TasksFinished, worker="w1", results=(done,)))
    assert on(s, "w1") == {"load-1", "load-2", "load-3", "sum-0"}
    run(s, TasksRunning("ran", 99.0, "w1", (("load-1", 0, 0.5),)))
    assert throttle(s, "w1", 100.0, held=1) == []
    for now in (200.0, 248.5):  # load-1 executes within its bound
        assert tick(s, now) == [] and not s.stalled_since
    assert tick(s, 249.0) == [] and s.stalled_since == {"*": 249.0}
    cmds = tick(s, 254.0)
    assert [(type(c), getattr(c, "key", None)) for c in cmds] == [
        (CancelOnWorker, None), (KeyErred, "sum-0"), (KeyErred, "load-5"),
        (KeyErred, "load-4"), (CancelOnWorker, None), (KeyErred, "load-3"),
        (CancelOnWorker, None), (KeyErred, "load-2"), (CancelOnWorker, None),
        (KeyErred, "load-1"), (FileFacts, None),
    ]  # fmt: skip
    assert [c.keys for c in of(cmds, CancelOnWorker)] == [
        ("sum-0",), ("load-3",), ("load-2",), ("load-1",),
    ]  # fmt: skip
    err = cmds[1].error
    assert isinstance(err, MemoryStalled) and (err.waiting, err.stalled_for) == (4, 5.0)
    assert err.executing == [("load-1", "w1", 155.5, 150.0)]
    assert not on(s, "w1") and not s.stalled_since


def test_a_pools_stall_fails_and_names_the_hung_try_of_no_pool_that_held_it(
    make_state: Factory,
) -> None:
    """``stray`` (of no pool) hangs on w1, the only worker of pool cpu; w2 (pool other)
    is not throttled, so "*" is not stalled. cpu's loads wait: its stall fires past the
    bound, and fails ``stray`` with them, named in ``executing`` and cancelled on w1
    (F3; the error blamed "something else" and ``stray`` ran on)."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="cpu"))
    run(s, at(2.0, GraphSubmitted, specs=specs_for(s, {"stray": []}, ["stray"]),
              wanted=("stray",)))  # fmt: skip
    run(s, TasksRunning("ran", 99.0, "w1", (("stray", 0, 0.5),)))
    run(s, at(99.5, WorkerJoined, worker="w2", cores=1, memory=GB, pool="other"))
    keys = [f"load-{i}" for i in range(3)]
    specs = specs_for(s, dict.fromkeys(keys, ()), keys, pool="cpu")
    run(s, at(99.7, GraphSubmitted, specs=specs, wanted=tuple(keys)))
    assert on(s, "w1") == {"stray"} and not on(s, "w2")
    assert throttle(s, "w1", 100.0) == []
    assert tick(s, 248.5) == [] and not s.stalled_since
    assert tick(s, 249.0) == [] and s.stalled_since == {"cpu": 249.0}
    cmds = tick(s, 254.0)
    assert [type(c) for c in cmds] == [KeyErred] * 3 + [CancelOnWorker, KeyErred]
    assert [c.key for c in of(cmds, KeyErred)] == ["load-2", "load-1", "load-0", "stray"]
    assert cmds[3] == CancelOnWorker("tick-254.0", "w1", ("stray",))
    err = cmds[0].error
    assert isinstance(err, MemoryStalled) and (err.pool, err.waiting) == ("cpu", 3)
    assert err.executing == [("stray", "w1", 155.5, 150.0)]
    assert (
        "No output is in their memory: the try past its bound named above may hold it, or "
        "something else does (a task that keeps data in a global"
    ) in str(err)
    assert s.tasks["stray"].state == "erred" and not on(s, "w1")


def test_a_hung_try_with_its_own_waiting_dependent_is_no_stall_in_a_pool_or_not(
    make_state: Factory,
) -> None:
    """``after`` waits for the hung ``steady`` alone, not for memory: no stall, neither
    for tasks of no pool ("*") nor for pool cpu's (F4; "*" failed ``after``, cpu none:
    one rule for both now)."""
    for pool in (None, "cpu"):
        s = make_state(saturation=1.0, stall_timeout=5.0)
        spec = {} if pool is None else {"pool": pool}
        hung_on_w1(s, {"steady": [], "after": ["steady"]}, **spec)
        if pool is not None:  # "*" not stalled: a worker of pool other is not throttled
            run(s, at(100.5, WorkerJoined, worker="w2", cores=1, memory=GB, pool="other"))
        for now in (249.0, 260.0, 1000.0):
            assert tick(s, now) == [] and not s.stalled_since, pool
        assert s._memory_moves(pool or "*").startswith("nothing"), pool
        assert (s.tasks["steady"].state, s.tasks["after"].state) == ("processing", "waiting")
