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
    Execute,
    KeyCancelled,
    KeyDone,
    RetireWorker,
    WorkerDraining,
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

    # w1's task finishes: w1 gets nothing new and is told to stop, exactly once; the
    # ready tasks wait for w2.
    cmds = finish(s, "w1", a)
    assert assigned(cmds) == {}
    assert retired(cmds) == ["w1"]
    assert of(cmds, KeyDone) == [KeyDone(cmds[0].stimulus_id, a, "w1", 100)]
    assert s.tasks[a].who_has == {"w1"}  # its output stays fetchable until it leaves
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
    assert retired(cmds) == ["w1"]
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


def test_a_retired_worker_serves_its_outputs_until_it_leaves(make: Any) -> None:
    s = make(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    assert on(s, "w1") == {"a"}
    assert drain(s, "w1") == []
    cmds = finish(s, "w1", "a")
    assert retired(cmds) == ["w1"] and assigned(cmds) == {}
    assert states(s) == {"a": "memory", "b": "queued"}

    cmds = join(s, "w2")
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w2" and [t.key for t in ex.tasks] == ["b"]
    assert ex.tasks[0].deps == (("a", ("w1",)),)  # fetched from the retired worker
    finish(s, "w2", "b")

    leave(s, "w1", cause="drained")
    assert "w1" not in s.workers and not s.draining
    assert s.tasks["a"].state == "released"  # nothing needs it any more


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
    assert retired(finish(s, "w1", running)) == ["w1"]


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
