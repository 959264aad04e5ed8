"""Draining a worker in the scheduler's pure core (actors/scheduler_state.py).

No event loop: every test feeds events to ``SchedulerState.handle`` and checks the exact
commands. ``WorkerDraining(worker)`` takes the worker out of placement at once; one
``RetireWorker(worker)`` comes out when it runs nothing any more; it stays known (its
outputs can still be fetched) until ``WorkerLeft``. Every state is validated after each
step (``run``) and again when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from actors.scheduler_events import (
    CancelOnWorker,
    Command,
    Evacuate,
    Execute,
    KeyCancelled,
    KeyDone,
    ReplicasCopied,
    Replicate,
    RetireWorker,
    TasksFinished,
    WorkerDraining,
    WorkerLeaving,
    WorkerUndrained,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from tests.helpers import (
    assigned,
    cancel,
    event,
    finish,
    join,
    leave,
    of,
    on,
    release,
    result,
    run,
    states,
    submit,
)


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[SchedulerState] = []

    def factory(**config: Any) -> SchedulerState:
        state = SchedulerState(SchedulerConfig(**config))
        made.append(state)
        return state

    yield factory
    for state in made:
        state.validate()


def drain(state: SchedulerState, worker: str) -> list[Command]:
    return run(state, event(WorkerDraining, worker=worker))


def retired(cmds: list[Command]) -> list[str]:
    return [c.worker for c in of(cmds, RetireWorker)]


def test_draining_an_idle_worker_retires_it_at_once(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    cmds = drain(s, "w1")
    assert cmds == [RetireWorker(cmds[0].stimulus_id, "w1")]
    assert "w1" not in s.free and "w2" in s.free
    assert s.workers["w1"].draining and s.workers["w1"].retired
    assert not s.draining  # retired: nothing left to watch


def test_a_draining_worker_gets_no_new_tasks_and_is_retired_once_idle(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    keys = [f"x-{i}" for i in range(6)]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    (a,) = assigned(cmds)["w1"]
    (b,) = assigned(cmds)["w2"]

    cmds = drain(s, "w1")
    assert cmds == []  # still runs `a`: no retirement, no new work anywhere
    assert s.draining == {"w1"} and "w1" not in s.free

    # w2's task finishes: the next ready one goes to w2, never to the draining w1.
    cmds = finish(s, "w2", b)
    assert set(assigned(cmds)) == {"w2"} and retired(cmds) == []
    (c,) = assigned(cmds)["w2"]

    # w1's task finishes: w1 gets nothing new; the ready tasks wait for w2. Its
    # output, which the client wants and only w1 holds, is copied to w2 first.
    cmds = finish(s, "w1", a)
    sid = cmds[0].stimulus_id
    assert assigned(cmds) == {}
    assert retired(cmds) == []
    assert of(cmds, KeyDone) == [KeyDone(sid, a, "w1", 100)]
    assert of(cmds, Replicate) == [Replicate(sid, "w2", "w1", ((a, 100),))]
    assert s.tasks[a].who_has == {"w1"}  # its output stays fetchable until it leaves
    # Copied: w1 is told to stop, exactly once.
    cmds = run(s, event(ReplicasCopied, worker="w2", asked=(a,), got=(a,)))
    assert retired(cmds) == ["w1"] and s.tasks[a].who_has == {"w1", "w2"}
    cmds = finish(s, "w2", c)
    assert set(assigned(cmds)) == {"w2"} and retired(cmds) == []
    assert s.count("queued") == 2


def test_draining_twice_or_an_unknown_worker_changes_nothing(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"x": []}, ["x"])
    assert drain(s, "w1") == []
    assert drain(s, "w1") == []
    assert drain(s, "nobody") == []
    cmds = finish(s, "w1", "x")
    # The client holds x, which only w1 holds, and no other worker could take it.
    assert retired(cmds) == [] and of(cmds, Replicate) == []
    assert retired(release(s, "x")) == ["w1"]  # let go: nothing keeps w1
    assert drain(s, "w1") == []  # retired already: no second RetireWorker


def test_a_task_cancelled_on_a_draining_worker_lets_it_retire(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"x": []}, ["x"])
    drain(s, "w1")
    cmds = cancel(s, "x", reason="stop it")
    sid = cmds[0].stimulus_id
    assert of(cmds, CancelOnWorker) == [CancelOnWorker(sid, "w1", ("x",))]
    assert of(cmds, KeyCancelled) == [KeyCancelled(sid, "x", "stop it")]
    assert retired(cmds) == ["w1"]
    # Retired after the cancel went out: the worker hears of both, in that order.
    kinds = [type(c) for c in cmds if isinstance(c, CancelOnWorker | RetireWorker)]
    assert kinds == [CancelOnWorker, RetireWorker]


def test_work_waits_while_every_worker_drains_and_goes_to_a_new_one(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    drain(s, "w1")
    cmds = submit(s, {"x": [], "y": ["x"]}, ["y"])
    assert of(cmds, Execute) == [] and states(s) == {"x": "queued", "y": "waiting"}
    cmds = join(s, "w2")
    assert assigned(cmds) == {"w2": ["x"]}


def test_a_draining_worker_keeps_an_output_a_task_needs_until_it_is_read(make: Any) -> None:
    """The only holder of an output a waiting task needs is not retired while no other
    worker could take a copy: scale-in never strands work (the task would have to
    compute it again)."""
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    assert on(s, "w1") == {"a"}
    assert drain(s, "w1") == []
    cmds = finish(s, "w1", "a")
    assert retired(cmds) == [] and assigned(cmds) == {}
    assert states(s) == {"a": "memory", "b": "queued"}

    cmds = join(s, "w2")
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w2" and [t.key for t in ex.tasks] == ["b"]
    assert ex.tasks[0].deps == (("a", ("w1",)),)  # fetched from the draining worker
    # and a copy of it on w2, so w1 can go
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, "w2", "w1", (("a", 100),))]
    cmds = finish(s, "w2", "b")
    assert retired(cmds) == ["w1"]  # read: nothing needs it any more

    leave(s, "w1", cause="drained")
    assert "w1" not in s.workers and not s.draining


def test_a_retired_worker_serves_its_outputs_until_it_leaves(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": []}, ["a"])
    (holder,) = [w for w in ("w1", "w2") if on(s, w)]
    other = "w2" if holder == "w1" else "w1"
    drain(s, holder)
    cmds = finish(s, holder, "a")
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, other, holder, (("a", 100),))]
    cmds = run(s, event(ReplicasCopied, worker=other, asked=("a",), got=("a",)))
    assert retired(cmds) == [holder]
    assert s.tasks["a"].who_has == {holder, other}  # still fetchable from it until it leaves
    leave(s, holder, cause="drained")
    assert s.tasks["a"].who_has == {other} and s.tasks["a"].state == "memory"


def test_a_retired_worker_that_registers_again_is_told_again(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    assert retired(drain(s, "w1")) == ["w1"]
    cmds = join(s, "w1")  # reconnected: the Stop may have been lost with the old link
    assert cmds == [RetireWorker(cmds[0].stimulus_id, "w1")]
    assert "w1" not in s.free and s.workers["w1"].retired


def test_a_draining_worker_that_registers_again_stays_draining(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"x": [], "y": []}, ["x", "y"])
    (running,) = on(s, "w1")
    assert drain(s, "w1") == []
    cmds = join(s, "w1", cores=4)  # more cores now, but draining: still nothing new
    assert cmds == [] and on(s, "w1") == {running}
    assert retired(finish(s, "w1", running)) == []  # the client holds its output
    assert retired(release(s, running)) == ["w1"]


def test_validate_catches_a_draining_worker_in_free(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"x": []}, ["x"])
    drain(s, "w1")
    ws = s.workers["w1"]
    s.free["w1"] = ws  # a bug: a draining worker offered for placement
    with pytest.raises(AssertionError):
        s.validate()
    del s.free["w1"]
    s.validate()


def copied(s: SchedulerState, worker: str, key: str) -> list[Command]:
    return run(s, event(ReplicasCopied, worker=worker, asked=(key,), got=(key,)))


def test_scaling_a_pool_to_zero_keeps_one_holder_of_a_held_result(make: Any) -> None:
    """Both workers drained one after the other while the client holds ``a``: the one
    that holds nothing is retired, the holder keeps ``a`` (its copy to the other lands
    on a retired worker, which does not count as staying)."""
    s = make(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": []}, ["a"])
    (holder,) = [w for w in ("w1", "w2") if on(s, w)]
    other = "w2" if holder == "w1" else "w1"
    finish(s, holder, "a")
    cmds = drain(s, holder)
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, other, holder, (("a", 100),))]
    assert retired(drain(s, other)) == [other]
    assert retired(copied(s, other, "a")) == []
    assert s.workers[holder].keeping == {s.tasks["a"]} and not s.workers[holder].retired
    assert retired(release(s, "a")) == [holder]


def test_of_two_drained_holders_of_a_held_result_one_keeps_it(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    join(s, "w2")
    copied(s, "w2", "a")  # a replica, as a replication policy makes
    assert s.tasks["a"].who_has == {"w1", "w2"}
    assert retired(drain(s, "w2")) == ["w2"]  # w1 stays with it
    cmds = drain(s, "w1")  # w2 was retired: it does not count
    assert retired(cmds) == [] and s.workers["w1"].keeping == {s.tasks["a"]}
    # Both drained while busy, so both drain at once when idle: one of them (the lower
    # id) keeps it, not both.
    t = make(saturation=1.0)
    join(t, "w1")
    submit(t, {"a": []}, ["a"])
    finish(t, "w1", "a")
    join(t, "w2")
    copied(t, "w2", "a")
    cmds = submit(t, {"x": [], "y": []}, ["x", "y"])
    where = {k: w for w, keys in assigned(cmds).items() for k in keys}
    drain(t, "w1")
    drain(t, "w2")
    run(t, event(TasksFinished, worker=where["x"], results=(result("x"),)),
        event(TasksFinished, worker=where["y"], results=(result("y"),)))  # fmt: skip
    assert t.workers["w1"].keeping == {
        t.tasks["a"],
        t.tasks[next(k for k, w in where.items() if w == "w1")],
    }
    assert t.tasks["a"] not in t.workers["w2"].keeping


def test_an_output_a_drained_worker_comes_to_hold_alone_is_kept_too(make: Any) -> None:
    """w1 drains keeping ``a``; ``b`` is on w2 too. w2 is preempted: now w1 alone holds
    ``b``, which it keeps as well; it is retired once both are copied to a new worker."""
    s = make(saturation=1.0)
    join(s, "w1", cores=2)
    submit(s, {"a": [], "b": []}, ["a", "b"])
    finish(s, "w1", "a")
    finish(s, "w1", "b")
    join(s, "w2")
    copied(s, "w2", "b")
    cmds = drain(s, "w1")
    assert [r.keys for r in of(cmds, Replicate)] == [(("a", 100),)]
    leave(s, "w2", cause="preempted")  # its copy of a was being made: it failed with it
    assert s.workers["w1"].keeping == {s.tasks["a"], s.tasks["b"]}
    cmds = join(s, "w3")
    assert sorted(r.keys for r in of(cmds, Replicate)) == [(("a", 100),), (("b", 100),)]
    assert retired(copied(s, "w3", "a")) == []
    assert retired(copied(s, "w3", "b")) == ["w1"]


def test_a_drained_worker_that_leaves_does_not_plan_a_copy_under_way_again(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    join(s, "w2")
    assert of(drain(s, "w1"), Replicate)  # a -> w2, under way
    cmds = run(s, event(WorkerLeaving, worker="w1", cause="walltime"))
    assert of(cmds, Evacuate) == [Evacuate(cmds[0].stimulus_id, "w1", ())]


# ----------------------------------------------------------------------------- taken back


def undrain(state: SchedulerState, worker: str) -> list[Command]:
    return run(state, event(WorkerUndrained, worker=worker))


def test_two_drained_holders_of_held_results_taken_back_run_the_queued_work(make: Any) -> None:
    """A user audit's shape, in the core: a pool's two workers are drained while busy
    (a scale-out's ``restore``); their outputs are held by the client and no worker
    stays to take a copy, so once idle they keep them and are not retired. New work
    waits. The autoscaler takes them back (``WorkerUndrained``): the queued tasks go to
    them at once, and they are never retired."""
    s = make(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"a0": [], "a1": []}, ["a0", "a1"])
    where = {k: w for w, keys in assigned(cmds).items() for k in keys}
    assert drain(s, "w1") == [] and drain(s, "w2") == []
    finish(s, where["a0"], "a0")
    cmds = finish(s, where["a1"], "a1")
    assert retired(cmds) == [] and of(cmds, Replicate) == []  # no survivor to copy to
    assert s.workers["w1"].keeping and s.workers["w2"].keeping
    cmds = submit(s, {"b0": [], "b1": []}, ["b0", "b1"])
    assert assigned(cmds) == {} and s.count("queued") == 2  # refused: they drain

    cmds = undrain(s, "w1")
    sid = cmds[0].stimulus_id
    # w1 takes the first queued task; w2, still drained, copies what it keeps to w1,
    # which stays now.
    kept = "a0" if where["a0"] == "w2" else "a1"
    assert [(type(c), c.worker) for c in cmds] == [(Replicate, "w1"), (Execute, "w1")]
    assert of(cmds, Replicate) == [Replicate(sid, "w1", "w2", ((kept, 100),))]
    assert assigned(cmds) == {"w1": ["b0"]}
    assert not s.workers["w1"].draining and s.draining == {"w2"}
    assert ("w1", "draining", "undrained", sid) == s.story("w1")[-1][:4]
    # Taken back too before that copy landed: it stays, and takes the other task.
    cmds = undrain(s, "w2")
    assert assigned(cmds) == {"w2": ["b1"]} and retired(cmds) == []
    assert not s.draining and s.count("queued") == 0
    assert retired(copied(s, "w1", kept)) == []


def test_an_undrained_worker_lets_another_drained_keeper_copy_its_outputs_and_go(
    make: Any,
) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"a0": [], "a1": []}, ["a0", "a1"])
    where = {k: w for w, keys in assigned(cmds).items() for k in keys}
    drain(s, "w1")
    drain(s, "w2")
    finish(s, where["a0"], "a0")
    finish(s, where["a1"], "a1")
    cmds = undrain(s, "w1")
    sid = cmds[0].stimulus_id
    kept = where["a0"] if where["a0"] == "w2" else where["a1"]
    key = "a0" if kept == where["a0"] else "a1"
    assert of(cmds, Replicate) == [Replicate(sid, "w1", "w2", ((key, 100),))]
    assert retired(copied(s, "w1", key)) == ["w2"]


def test_a_worker_going_for_good_is_not_taken_back(make: Any) -> None:
    """Retired (told to stop), leaving on its own, drained for its walltime or its
    pool's tasks_per_worker, or not draining: ``WorkerUndrained`` changes nothing, and
    ``undrain_refusal`` says why."""
    s = make(saturation=1.0, tasks_per_worker={"spent": 1})
    join(s, "idle")
    assert retired(drain(s, "idle")) == ["idle"]  # idle, nothing held: retired at once
    join(s, "free")
    join(s, "spent", pool="spent")
    submit(s, {"x": []}, ["x"], pool="spent")
    join(s, "going")
    run(s, event(WorkerLeaving, worker="going", cause="preempted"))
    refusals = {w: s.undrain_refusal(s.workers[w]) for w in ("idle", "free", "spent", "going")}
    assert refusals == {
        "idle": "it was retired (told to stop)",
        "free": "it is not draining",
        "spent": "it was sent its pool's tasks_per_worker tries",
        "going": "it is leaving on its own",
    }
    for w in refusals:
        assert undrain(s, w) == []
    assert s.workers["idle"].retired and s.workers["spent"].draining
    assert s.workers["going"].leaving and not s.workers["free"].draining
    assert undrain(s, "nobody") == []
