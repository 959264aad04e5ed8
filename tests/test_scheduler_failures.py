"""Tests of the scheduler's pure core (actors/scheduler_state.py): failures (errors and
retries, lost workers and the outputs they held, lost lineage, poison tasks, workers
that rejoin).

No event loop, no threads, no clock: every test feeds events to
``SchedulerState.handle`` and checks the exact commands it returns. The autouse fixture
``make_state`` (tests/helpers.py) builds the states and runs ``validate()`` (the
invariant check) on every one of them when the test ends; the ``run`` helper also
validates after each step. Graphs come from :func:`tests.helpers.graph`, a
``{key: [dependency keys]}`` table turned into specs by ``build_specs`` as the client does.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest

from actors.protocol import FileFact
from actors.scheduler_events import (
    CancelRequested,
    Command,
    DropData,
    Event,
    Execute,
    FileFacts,
    GraphSubmitted,
    KeyDone,
    KeyErred,
    ReplicasMissing,
    StoppedWithCluster,
    Suspended,
    TasksFinished,
    TasksRunning,
    Tick,
    ValuesDelivered,
    WorkerAway,
    WorkerHeld,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_state import (
    INPUTS_BACKOFF,
    MAX_INPUTS_BACKOFF,
    MAX_INPUTS_UNREACHABLE,
    UNREACHED_AGAIN,
    SchedulerState,
)
from policies import REGISTRY, PolicyParamsError
from runtime.errors import (
    DependencyFailed,
    DiskFull,
    InputsUnreachable,
    TaskCrashedWorkers,
    WorkerLost,
)
from runtime.graph import Key
from tests.helpers import (
    GB,
    MB,
    Factory,
    Loop,
    assigned,
    by_order,
    chain,
    event,
    facts,
    finish,
    finish_all,
    join,
    leave,
    make_state,
    of,
    on,
    only_running,
    release,
    result,
    run,
    specs_for,
    states,
    status_text,
    submit,
    worker_of,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


# ----------------------------------------------------------------------------- fail


def test_an_error_with_the_default_retry_policy_errs_with_the_original_exception(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    boom = ValueError("boom")
    cmds = finish(s, "w1", "a", "error", error=boom)
    (ke,) = of(cmds, KeyErred)
    assert ke.key == "a" and ke.error is boom and ke.root == "a" and ke.root_error is boom
    ts = s.tasks["a"]
    assert ts.state == "erred" and ts.error is boom and ts.retries_left == 0
    assert [(t.worker, t.outcome) for t in ts.tries] == [("w1", "error")]
    assert of(cmds, Execute) == [] and "w1" in s.free


def test_a_timeout_without_an_exception_errs_with_a_runtime_error(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    (ke,) = of(finish(s, "w1", "a", "timeout"), KeyErred)
    assert isinstance(ke.error, RuntimeError) and "timeout" in str(ke.error)


def test_dependents_of_a_failed_task_fail_transitively_with_dependency_failed(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", cores=2)
    submit(s, {"a": [], "b": ["a"], "c": ["b"], "d": ["a"], "e": []}, ["c", "d", "e"])
    boom = KeyError("no such column")
    cmds = finish(s, "w1", "a", "error", error=boom)

    erred = {c.key: c for c in of(cmds, KeyErred)}
    assert sorted(erred) == ["c", "d"]  # b is not wanted: no message for it
    for key in ("c", "d"):
        err = erred[key].error
        assert isinstance(err, DependencyFailed)
        assert err.key == key and err.dependency == "a"
        assert err.__cause__ is boom
        assert erred[key].root == "a" and erred[key].root_error is boom
    assert isinstance(s.tasks["b"].error, DependencyFailed)
    assert {k: s.tasks[k].state for k in "abcde"} == {
        "a": "erred",
        "b": "erred",
        "c": "erred",
        "d": "erred",
        "e": "processing",
    }


def test_failure_of_a_5000_task_chain_does_not_recurse(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    n = 5000
    last = f"c-{n - 1}"
    submit(s, chain("c", n), [last], check=False)
    assert only_running(s) == "c-0"
    boom = OSError("disk full")
    cmds = finish(s, "w1", "c-0", "error", error=boom, check=False)
    (ke,) = of(cmds, KeyErred)
    assert ke.key == last and ke.root == "c-0" and ke.root_error is boom
    assert isinstance(ke.error, DependencyFailed) and ke.error.dependency == "c-0"
    assert s.count("erred") == n
    s.validate()
    # Releasing the one wanted key forgets the whole chain, again without recursion.
    cmds = release(s, last)
    assert s.tasks == {}
    # None of the chain ever produced an output, so the registry is told nothing.
    assert facts(cmds) == {}


def test_user_retries_are_spent_then_the_task_fails(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"], retries=2)
    ts = s.tasks["a"]
    for left in (1, 0):
        cmds = finish(s, "w1", "a", "error", error=ValueError(f"try {2 - left}"))
        assert of(cmds, KeyErred) == []
        assert assigned(cmds) == {"w1": ["a"]}
        assert ts.retries_left == left and ts.behind
    last = ValueError("try 3")
    (ke,) = of(finish(s, "w1", "a", "error", error=last), KeyErred)
    assert ke.error is last
    # The client's note on the exception: the worker and which try raised it.
    assert (ke.worker, ke.attempt, ke.attempts) == ("w1", 3, 3)
    assert [t.outcome for t in ts.tries] == ["error"] * 3
    assert s.stats["a"].errors == 3
    # Why, in its story: each retry's row and the erred note say what was raised.
    assert [e[1:3] for e in s.story("a") if e[1] in ("retry", "erred")] == [
        ("retry", "error; retry budget left (ValueError: try 1)"),
        ("retry", "error; retry budget left (ValueError: try 2)"),
        ("erred", "ValueError: try 3"),
    ]


def test_the_client_hears_which_worker_and_try_raised_and_dependents_hear_the_roots(
    make_state: Factory,
) -> None:
    """``KeyErred`` says where the try that raised the root's error ran, and which try
    of how many it was (the client's note on the exception, ``try 2 of 2``); a key
    submitted again after it failed counts its tries afresh."""
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": [], "b": ["a"]}, ["a", "b"], retries=1)
    first = worker_of(s, "a")
    finish(s, first, "a", "error", error=ValueError("once"))
    second = worker_of(s, "a")
    last = ValueError("twice")
    erred = {c.key: c for c in of(finish(s, second, "a", "error", error=last), KeyErred)}
    for key in ("a", "b"):  # b's error is a DependencyFailed; its root's try is a's
        ke = erred[key]
        assert (ke.root, ke.root_error, ke.worker, ke.attempt, ke.attempts) == (
            "a", last, second, 2, 2,
        ), key  # fmt: skip
    # Submitted again (no retries now): its one try is "try 1 of 1".
    submit(s, {"a": []}, ["a"])
    again = worker_of(s, "a")
    (ke,) = of(finish(s, again, "a", "error", error=last), KeyErred)
    assert (ke.worker, ke.attempt, ke.attempts) == (again, 1, 1)
    assert len(s.tasks["a"].tries) == 3  # (the story and the console count them all)


def test_a_retry_goes_behind_work_that_was_not_tried_yet(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    keys = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(keys, ()), keys, retries=1)
    order = by_order(s, keys)
    join(s, "w1")
    assert on(s, "w1") == {order[0]}
    cmds = finish(s, "w1", order[0], "error", error=ValueError())
    # The retried task would come first by graph order, but fresh work goes first.
    assert assigned(cmds) == {"w1": [order[1]]}
    assert assigned(finish(s, "w1", order[1])) == {"w1": [order[2]]}
    assert assigned(finish(s, "w1", order[2])) == {"w1": [order[0]]}


# ----------------------------------------------------------------------------- worker lost


def test_a_lost_worker_s_tasks_are_retried_elsewhere_for_free(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": [], "b": []}, ["a", "b"], retries=1)
    wa = s.tasks["a"].worker
    other = "w2" if wa == "w1" else "w1"
    finish(s, other, "b")

    cmds = leave(s, wa, cause="preempted")
    assert assigned(cmds) == {other: ["a"]}
    ts = s.tasks["a"]
    assert ts.retries_left == 1  # not charged
    # and its place kept (a preemption is its batch system's doing: docs/policies.md, retry)
    assert ts.lost_tries == 1 and not ts.behind
    (try_,) = ts.tries
    assert (try_.worker, try_.outcome, try_.cause) == (wa, "worker-lost", "preempted")
    assert wa not in s.workers and wa not in s.free
    assert of(cmds, KeyErred) == []


def _merge_waiting_for_load_0(make_state: Factory) -> tuple[SchedulerState, str, str]:
    """Two workers, ``least-loaded`` (no root is sent along with its partner, so each
    load starts on a worker of its own), ``merge-0`` reading ``skim-0`` and ``skim-1``:
    ``load-1`` and ``skim-1`` are done on w1 (skim-1 stored, 1 MB), which runs
    ``next-0``; ``load-0`` runs on w2. The state, w1 and w2."""
    s = make_state(saturation=1.0, placement="least-loaded")
    join(s, "w1")
    join(s, "w2")
    table: dict[Key, list[Key]] = {
        "load-0": [], "load-1": [], "skim-0": ["load-0"], "skim-1": ["load-1"],
        "merge-0": ["skim-0", "skim-1"], "next-0": [], "next-1": [],
    }  # fmt: skip
    submit(s, table, ["merge-0", "next-0", "next-1"])
    assert by_order(s, list(table)) == [
        "load-1", "skim-1", "load-0", "skim-0", "merge-0", "next-0", "next-1",
    ]  # fmt: skip
    w1, w2 = worker_of(s, "load-1"), worker_of(s, "load-0")
    assert assigned(finish(s, w1, "load-1", nbytes=MB)) == {w1: ["skim-1"]}
    assert assigned(finish(s, w1, "skim-1", nbytes=MB)) == {w1: ["next-0"]}
    return s, w1, w2


def test_a_lost_try_that_stored_outputs_wait_for_keeps_its_place(make_state: Factory) -> None:
    """The disk recovery audit (benchmarks/disk_recovery.py): a load lost with its
    worker went behind every fresh load of the run, so the merge waiting for it held
    its other inputs (skims) on the small disks to the end and every later merge
    stalled. A lost try that a task downstream waits for beside stored outputs is
    retried in its place, not behind fresh work. (``least-loaded``: no root is sent
    along with its partner, so each load starts on a worker of its own.)"""
    s, w1, w2 = _merge_waiting_for_load_0(make_state)
    # The worker running load-0 is lost: merge-0 waits for it beside skim-1, stored.
    assert assigned(leave(s, w2, cause="crash")) == {}
    assert s.tasks["load-0"].state == "queued" and not s.tasks["load-0"].behind
    assert [e[2] for e in s.story("load-0") if e[1] == "retry"] == [
        "worker lost (crash); free retry"
    ]
    # It runs next on the survivor, ahead of the fresh next-1, and so does its line.
    assert assigned(finish(s, w1, "next-0")) == {w1: ["load-0"]}
    assert assigned(finish(s, w1, "load-0", nbytes=MB)) == {w1: ["skim-0"]}
    assert assigned(finish(s, w1, "skim-0", nbytes=MB)) == {w1: ["merge-0"]}
    assert assigned(finish(s, w1, "merge-0")) == {w1: ["next-1"]}


def test_a_disk_full_retry_that_stored_outputs_wait_for_keeps_its_place(
    make_state: Factory,
) -> None:
    """The same for a try whose output did not fit on its worker's disk (the audit's
    second way to lose a load: ``load-31``'s disk-full retry ran last, 140 s later)."""
    s, _, w2 = _merge_waiting_for_load_0(make_state)
    err = DiskFull("load-0", w2, MB, 0, MB)
    cmds = finish(s, w2, "load-0", outcome="disk-full", nbytes=MB, error=err)
    assert [e[2] for e in s.story("load-0") if e[1] == "retry"] == [
        "output did not fit on disk; free retry"
    ]
    assert assigned(cmds) == {w2: ["load-0"]}  # not the fresh next-1
    assert not s.tasks["load-0"].behind


def test_a_lost_try_that_nothing_stored_waits_for_goes_behind_fresh_work(
    make_state: Factory,
) -> None:
    """The other side of the rule above: ``b``'s reader ``c`` reads nothing else, so
    nothing is held for it; lost with its worker, ``b`` goes behind fresh work."""
    s = make_state(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    table: dict[Key, list[Key]] = {"b": [], "c": ["b"], "x-0": [], "x-1": []}
    submit(s, table, ["c", "x-0", "x-1"])
    assert by_order(s, ["b", "x-0", "x-1"]) == ["b", "x-0", "x-1"]
    wb = worker_of(s, "b")
    other = "w2" if wb == "w1" else "w1"
    assert on(s, other) == {"x-0"}
    assert assigned(leave(s, wb, cause="crash")) == {}
    assert s.tasks["b"].behind
    assert assigned(finish(s, other, "x-0")) == {other: ["x-1"]}
    assert assigned(finish(s, other, "x-1")) == {other: ["b"]}


def test_each_try_says_when_its_task_became_ready_for_it(make_state: Factory) -> None:
    """``a`` is ready at 10 with no worker; c1 joins at 13 and is sent it (waited 3),
    then is preempted at 20: ``a`` is ready again, and c2, joining at 95, is sent it
    (waited 75); it fails at 96 and is retried on c2 at once (waited 0). ``b``, ready at
    96.5 behind it, is sent at 97 and cancelled at 98. Each try's record (and its
    monitoring feed record) says when its wait began: ``sent - queued`` is each wait,
    the ones after the lost worker and the error too."""
    s = make_state(saturation=1.0, monitor=True)
    n = iter(range(100))

    def at(now: float, cls: type[Event], **fields: Any) -> None:
        run(s, cls(stimulus_id=f"{cls.__name__}-{next(n)}", now=now, **fields))

    def done(now: float, key: str, outcome: str = "ok") -> None:
        res = result(key, outcome, start=now - 0.5, duration=0.5, error=None)
        at(now, TasksFinished, worker="c2", results=(res,))

    at(10.0, GraphSubmitted, specs=specs_for(s, {"a": []}, ["a"], retries=1), wanted=("a",))
    at(13.0, WorkerJoined, worker="c1", cores=1, memory=GB, pool="cpu")
    assert s.tasks["a"].worker == "c1"
    at(20.0, WorkerLeft, worker="c1", cause="preempted")
    assert s.tasks["a"].state == "queued"
    at(95.0, WorkerJoined, worker="c2", cores=1, memory=GB, pool="cpu")
    done(96.0, "a", "error")
    assert s.tasks["a"].worker == "c2"  # retried at once
    at(96.5, GraphSubmitted, specs=specs_for(s, {"b": []}, ["b"]), wanted=("b",))
    assert s.tasks["b"].state == "queued"
    done(97.0, "a")
    assert s.tasks["b"].worker == "c2"
    at(98.0, CancelRequested, keys=("b",))

    tries = [(t.worker, t.outcome, t.queued) for t in s.tasks["a"].tries + s.tasks["b"].tries]
    assert tries == [
        ("c1", "worker-lost", 10.0), ("c2", "error", 20.0), ("c2", "ok", 96.0),
        ("c2", "cancelled", 96.5),
    ]  # fmt: skip
    assert s.tasks["a"].tries[0].start == 13.0  # sent (the core's clock: its try was lost)
    entries, _, _ = s.feed_since(0, 1000)
    feed = [(r[1], r[5], r[12]) for _, records in entries for r in records if r[0] == "try"]
    # (key, sent, queued): the waits 3, 75, 0 and 0.5
    assert feed == [("a", 13.0, 10.0), ("a", 95.0, 20.0), ("a", 96.0, 96.0), ("b", 97.0, 96.5)]


def test_a_task_lost_too_often_fails_with_worker_lost(make_state: Factory) -> None:
    s = make_state(retry=REGISTRY.create("retry", "default", {"max_lost": 2}))
    submit(s, {"a": []}, ["a"])
    for i in range(2):
        join(s, f"w{i}")
        assert on(s, f"w{i}") == {"a"}
        cmds = leave(s, f"w{i}", cause="oom")
        assert of(cmds, KeyErred) == [] and s.tasks["a"].state == "queued"
    join(s, "w2")
    cmds = leave(s, "w2", cause="walltime")
    (ke,) = of(cmds, KeyErred)
    err = ke.error
    assert isinstance(err, WorkerLost)
    assert (err.key, err.worker, err.cause, err.tries) == ("a", "w2", "walltime", 3)
    assert ke.root == "a" and ke.root_error is err
    assert [t.outcome for t in s.tasks["a"].tries] == ["worker-lost"] * 3
    # the knob in force, and that turning it is the operator's (the admin token's)
    assert str(err) == (
        "task 'a' was lost with worker 'w2' (walltime) and will not be retried after 3 tries "
        "(the retry policy in force: 'default', with max_lost=2). Check the workers' logs and "
        "resources, or have the retry policy's limit for infrastructure losses raised (its "
        "max_lost, now 2: losses in a row that left no checkpoint of their try, so a long "
        "task that saves its progress with runtime.checkpoint goes on while each try saves "
        "some). The retry policy is the manager's, for all its clients, and "
        "setting it takes the admin token, the operator's (await cluster.set_policy('retry', "
        "'default', max_lost=20), or in the console policy set retry default max_lost=20): "
        "with the submit token, ask the operator."
    )


def test_a_loss_charged_to_a_spent_budget_says_to_give_retries_not_to_raise_max_lost(
    make_state: Factory,
) -> None:
    """With ``charge_lost=True`` (set live by an operator, say) a loss spends the task's
    ``retries=`` budget, and a task with none left fails at its first loss: the advice
    to raise ``max_lost`` (with ``set_policy``, which the submit token may not call) was
    wrong there; it names the budget and the policy in force (audit ops F3)."""
    s = make_state(retry=REGISTRY.create("retry", "default", {"max_lost": 2, "charge_lost": True}))
    submit(s, {"a": []}, ["a"])
    join(s, "w1")
    assert on(s, "w1") == {"a"}
    (ke,) = of(leave(s, "w1", cause="crash"), KeyErred)
    err = ke.error
    assert isinstance(err, WorkerLost)
    assert (err.policy, err.params, err.retries_left) == (
        "default",
        {"charge_lost": "True", "max_lost": "2"},
        0,
    )
    assert str(err) == (
        "task 'a' was lost with worker 'w1' (crash) and will not be retried after 1 try (the "
        "retry policy in force: 'default', with charge_lost=True, max_lost=2). Check the "
        "workers' logs and resources; that policy charges each loss to the task's own "
        "retries= budget (charge_lost=True), which was spent: submit the task with a larger "
        "one (retries=N to submit, map or compute, or dask.annotate(retries=N)), or ask the "
        "operator to turn charge_lost off. The retry policy is the manager's, for all its "
        "clients, and setting it takes the admin token, the operator's (await "
        "cluster.set_policy('retry', 'default', max_lost=2), or in the console policy set "
        "retry default max_lost=2): with the submit token, ask the operator."
    )


def test_never_retry_fails_a_lost_task_at_once(make_state: Factory) -> None:
    s = make_state(retry="never")
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    cmds = leave(s, "w1", cause="crash")
    assert sorted(c.key for c in of(cmds, KeyErred)) == ["b"]
    assert isinstance(s.tasks["a"].error, WorkerLost)


def test_output_held_only_by_a_lost_worker_is_recomputed_while_needed(
    make_state: Factory,
) -> None:
    # least-loaded: with locality, b would join its input on busy w1 (see
    # test_scheduler_memory.py); here it must wait in the queue.
    s = make_state(saturation=1.0, placement="least-loaded")
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a", nbytes=50)
    submit(s, {"x": []}, ["x"])  # keeps w1 busy
    assert on(s, "w1") == {"x"}
    cmds = submit(s, {"b": ["a"]}, ["b"])
    assert assigned(cmds) == {} and s.tasks["b"].state == "queued"

    cmds = leave(s, "w1")
    # a's only copy died with w1 and b still needs it: a runs again, b waits for it.
    assert states(s) == {"a": "queued", "x": "queued", "b": "waiting"}
    assert s.tasks["b"].waiting_on == 1
    assert facts(cmds)["a"] == FileFact("a", "pending", 50, (), 1, True)
    assert s.tasks["x"].lost_tries == 1 and s.tasks["a"].lost_tries == 0
    assert ("a", "memory", "lost") in [e[:3] for e in s.story("a")]

    cmds = join(s, "w2", cores=2)
    assert sorted(assigned(cmds)["w2"]) == ["a", "x"]
    cmds = finish(s, "w2", "a")
    assert [c.key for c in of(cmds, KeyDone)] == ["a"]
    assert assigned(cmds) == {"w2": ["b"]}


def _b_on_w2_needs_a_on_w1(make_state: Factory, **config: Any) -> SchedulerState:
    """a done on w1 (pool p1), b (pool p2, needs a) sent to w2."""
    s = make_state(saturation=1.0, **config)
    join(s, "w1", pool="p1")
    join(s, "w2", pool="p2")
    submit(s, {"a": [], "b": ["a"]}, ["b"], attrs={"a": {"pool": "p1"}, "b": {"pool": "p2"}})
    finish(s, "w1", "a")
    assert on(s, "w2") == {"b"}
    return s


def test_output_held_only_by_a_lost_worker_is_released_when_not_needed(
    make_state: Factory,
) -> None:
    s = _b_on_w2_needs_a_on_w1(make_state)
    finish(s, "w2", "b", fetched=("a",))
    assert s.tasks["a"].who_has == {"w1", "w2"}  # w2 copied a to run b

    cmds = leave(s, "w1")
    assert s.tasks["a"].state == "memory" and facts(cmds)["a"].replicas == ("w2",)

    cmds = leave(s, "w2")
    # b is wanted: it runs again, and so does a (lineage).
    assert states(s) == {"a": "queued", "b": "waiting"}
    join(s, "w3", pool="p1")
    join(s, "w4", pool="p2")
    finish(s, "w3", "a")
    cmds = finish(s, "w4", "b")
    assert [c.key for c in of(cmds, KeyDone)] == ["b"]

    # Not needed (b is done, a is not wanted): losing a releases it, kept for lineage.
    cmds = leave(s, "w3")
    assert states(s) == {"a": "released", "b": "memory"}
    assert facts(cmds)["a"] == FileFact("a", "released", 100, (), 0, False)
    assert of(cmds, Execute) == []


def test_an_unneeded_lost_output_without_dependents_is_forgotten(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    release(s, "a")  # the registry has not dropped it yet
    cmds = leave(s, "w1")
    assert s.tasks == {}
    assert facts(cmds)["a"].state == "forgotten"


def _given(make_state: Factory, *keys: Key) -> SchedulerState:
    """``keys`` (independent tasks, each wanted) done on w1, and a gather gave their
    values to the client (``ValuesDelivered``)."""
    s = make_state()
    join(s, "w1", cores=len(keys))
    submit(s, {k: [] for k in keys}, keys)
    finish_all(s, "w1", keys, nbytes=50)
    assert run(s, event(ValuesDelivered, keys=keys)) == []
    return s


def test_a_lost_output_its_client_was_given_is_made_again_only_once_gathered(
    make_state: Factory,
) -> None:
    # A user audit (slurmscale F1): the client printed a result, the block holding it
    # was preempted, and the task ran again (40 s) for a value nobody asked for again.
    s = _given(make_state, "a")
    cmds = leave(s, "w1")
    assert states(s) == {"a": "released"}  # kept for its future: not forgotten
    assert [type(c) for c in cmds] == [FileFacts]  # nothing runs, no client is told
    assert facts(cmds)["a"] == FileFact("a", "released", 50, (), 0, True)
    assert ("a", "released", "lost-after-gather: made again when needed") in [
        e[:3] for e in s.story("a")
    ]
    assert s.lost_held == {s.tasks["a"]: "w1"}
    assert assigned(join(s, "w2")) == {}  # a worker is free: still nothing runs
    assert s.storage.recoveries == {}

    # The client awaits it again: the manager's gather found its worker gone.
    cmds = run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False))
    assert assigned(cmds) == {"w2": ["a"]}
    assert facts(cmds)["a"] == FileFact("a", "pending", 50, (), 0, True)
    assert s.lost_held == {} and s.storage.recoveries == {"recomputed": 1}
    cmds = finish(s, "w2", "a", nbytes=50)
    assert [(c.key, c.worker) for c in of(cmds, KeyDone)] == [("a", "w2")]


def test_a_lost_output_its_client_was_given_is_made_again_for_a_task_reading_it(
    make_state: Factory,
) -> None:
    s = _given(make_state, "a")
    leave(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"b": ["a"]}, ["b"])  # a task submitted later reads it (dask's way)
    assert assigned(cmds) == {"w2": ["a"]}
    assert states(s) == {"a": "processing", "b": "waiting"}
    assert s.storage.recoveries == {"recomputed": 1}
    cmds = finish(s, "w2", "a")
    assert [c.key for c in of(cmds, KeyDone)] == ["a"] and assigned(cmds) == {"w2": ["b"]}


def test_a_lost_output_its_client_was_given_is_made_again_when_submitted_again(
    make_state: Factory,
) -> None:
    s = _given(make_state, "a")
    leave(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"a": []}, ["a"])  # a persist or compute naming it
    assert assigned(cmds) == {"w2": ["a"]} and s.tasks["a"].wanted == 2


def test_a_lost_output_its_client_was_given_and_then_released_is_forgotten(
    make_state: Factory,
) -> None:
    s = _given(make_state, "a", "b")
    leave(s, "w1")
    join(s, "w2")
    cmds = release(s, "a")
    assert states(s) == {"b": "released"} and assigned(cmds) == {}
    assert facts(cmds)["a"].state == "forgotten" and list(s.lost_held) == [s.tasks["b"]]


def test_a_lost_output_a_client_was_not_given_yet_is_made_again_at_once(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", cores=2)
    submit(s, {"a": [], "b": []}, ["a", "b"])
    finish_all(s, "w1", ["a", "b"])
    run(s, event(ValuesDelivered, keys=("a",)))  # a was gathered, b not yet
    submit(s, {"a": []}, ["a"])  # then a second client came to want a
    leave(s, "w1")
    # Both will be asked for: both run again now, in parallel, not one by one as the
    # client reaches them.
    assert states(s) == {"a": "queued", "b": "queued"} and s.lost_held == {}
    assert s.storage.recoveries == {"recomputed": 2}


def test_a_gather_that_cannot_reach_a_holder_still_connected_keeps_its_copy(
    make_state: Factory,
) -> None:
    s = _given(make_state, "a")
    run(s, event(WorkerAway, worker="w1"))  # its connection dropped: within its grace
    cmds = run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False))
    assert cmds == [] and s.tasks["a"].who_has == {"w1"}
    # The gather waits for the next word on a: once w1 is lost, a runs again at once.
    leave(s, "w1")
    assert states(s) == {"a": "queued"}


def test_an_earlier_gathers_word_does_not_keep_an_unreached_output_from_running_again(
    make_state: Factory,
) -> None:
    # Review 1207e F1: a gather gave a's value (its word is sent up to a quarter second
    # later); w1's connection dropped; a second gather could not reach it, so the
    # manager forgot its word on a and that client waits for the next one. The first
    # gather's word, come late, must not make a "given": w1 lost, a runs again at once.
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish_all(s, "w1", ["a"], nbytes=50)
    run(s, event(WorkerAway, worker="w1"))
    assert run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False)) == []
    assert run(s, event(ValuesDelivered, keys=("a",))) == []  # the earlier gather's word
    assert not s.tasks["a"].delivered
    join(s, "w2")
    cmds = leave(s, "w1")
    assert assigned(cmds) == {"w2": ["a"]} and s.lost_held == {}
    assert s.storage.recoveries == {"recomputed": 1}
    cmds = finish(s, "w2", "a", nbytes=50)
    assert [(c.key, c.worker) for c in of(cmds, KeyDone)] == [("a", "w2")]
    assert s.unreached == {}


def test_an_output_a_gather_could_not_reach_is_told_again_when_its_holder_rejoins(
    make_state: Factory,
) -> None:
    # Review 1207e F2: the gather's client waits for the scheduler's next word on a;
    # w1 comes back within its grace holding it: that word is where a is.
    s = _given(make_state, "a")
    run(s, event(WorkerAway, worker="w1"))
    assert run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False)) == []
    cmds = join(s, "w1")  # back within its grace
    assert of(cmds, KeyDone) == []  # (not before it says what it holds)
    cmds = held(s, "w1", a=50)
    assert [(c.key, c.worker, c.nbytes) for c in of(cmds, KeyDone)] == [("a", "w1", 50)]
    assert s.unreached == {} and states(s) == {"a": "memory"}
    # Told once: a later rejoin says nothing more.
    run(s, event(WorkerAway, worker="w1"))
    join(s, "w1")
    assert of(held(s, "w1", a=50), KeyDone) == []


def test_an_output_a_gather_could_not_reach_is_told_again_if_its_holder_rejoined_first(
    make_state: Factory,
) -> None:
    # The gather found w1 gone (its connection dropped) and reports it; before its
    # DataMissing comes, w1 rejoins and says it holds a: nothing was unreached then.
    # The DataMissing then finds w1 connected, as it would if the drop's word were
    # still on its way: no word at once; a Tick past UNREACHED_AGAIN tells it again.
    s = _given(make_state, "a")
    run(s, event(WorkerAway, worker="w1"))
    join(s, "w1")  # back within its grace
    assert of(held(s, "w1", a=50), KeyDone) == []  # (no gather waits on a yet)
    missing = event(ReplicasMissing, worker="w1", keys=("a",), reached=False)
    assert run(s, missing) == [] and list(s.unreached) == [s.tasks["a"]]
    soon = missing.now + UNREACHED_AGAIN / 2  # (the drop's word may still be on its way)
    assert run(s, Tick(stimulus_id="tick-1", now=soon)) == []
    cmds = run(s, Tick(stimulus_id="tick-2", now=missing.now + UNREACHED_AGAIN))
    assert [(c.key, c.worker, c.nbytes) for c in cmds] == [("a", "w1", 50)]
    assert all(type(c) is KeyDone for c in cmds) and s.unreached == {}
    # Told once: the next Tick says nothing more.
    assert run(s, Tick(stimulus_id="tick-3", now=missing.now + 2 * UNREACHED_AGAIN)) == []


def test_an_output_a_gather_could_not_reach_is_not_told_again_while_its_holder_is_away(
    make_state: Factory,
) -> None:
    s = _given(make_state, "a")
    missing = event(ReplicasMissing, worker="w1", keys=("a",), reached=False)
    assert run(s, missing) == []  # before the drop's word (WorkerAway) came
    run(s, event(WorkerAway, worker="w1"))
    assert run(s, Tick(stimulus_id="tick-1", now=missing.now + 10 * UNREACHED_AGAIN)) == []
    assert list(s.unreached) == [s.tasks["a"]]


def test_an_output_a_gather_could_not_reach_is_told_at_once_on_a_connected_holder(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", pool="p1")
    join(s, "w2", pool="p2")
    submit(s, {"a": [], "b": ["a"]}, ["a", "b"], attrs={"a": {"pool": "p1"}, "b": {"pool": "p2"}})
    finish(s, "w1", "a", nbytes=50)
    run(s, event(WorkerAway, worker="w1"))
    assert run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False)) == []
    # w2 copies a from w1 (peers still reach it) to run b: the word is where it is now.
    cmds = finish(s, "w2", "b", fetched=("a",))
    assert [(c.key, c.worker) for c in of(cmds, KeyDone)] == [("a", "w2"), ("b", "w2")]
    assert s.unreached == {}
    # A gather that cannot reach w1 again is told of w2's copy at once.
    cmds = run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False))
    assert [(c.key, c.worker, c.nbytes) for c in of(cmds, KeyDone)] == [("a", "w2", 50)]
    assert s.unreached == {} and s.tasks["a"].who_has == {"w1", "w2"}


def test_an_output_a_gather_could_not_reach_no_client_wants_is_let_go(
    make_state: Factory,
) -> None:
    s = _given(make_state, "a")
    run(s, event(WorkerAway, worker="w1"))
    run(s, event(ReplicasMissing, worker="w1", keys=("a",), reached=False))
    release(s, "a")  # (in memory until the registry drops it)
    assert s.unreached == {} and not s.tasks["a"].wanted


def test_a_missing_input_puts_the_task_back_and_recomputes_the_input(
    make_state: Factory,
) -> None:
    s = _b_on_w2_needs_a_on_w1(make_state)
    # w1 lost a (disk wiped) before w2 could fetch it.
    cmds = finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
    assert assigned(cmds) == {"w1": ["a"]}
    assert states(s) == {"a": "processing", "b": "waiting"}
    assert s.tasks["b"].tries == [] and s.tasks["b"].retries_left == 0  # not a try
    assert facts(cmds)["a"].replicas == ()
    # w1 is still here: whatever it has of a (a copy it could not hand over) is dropped,
    # not left on it untracked.
    assert [(c.worker, c.keys) for c in of(cmds, DropData)] == [("w1", ("a",))]

    cmds = finish(s, "w1", "a")
    assert assigned(cmds) == {"w2": ["b"]}
    assert of(cmds, Execute)[0].tasks[0].deps == (("a", ("w1",)),)


def _held_back(s: SchedulerState) -> int:
    """b went back after a try that could not have a from w1, and a is in memory again:
    tick (a second per event) until b is on w2 once more, checking that it is not
    placed before its hold is over; the ticks it took."""
    b = s.tasks["b"]
    until = b.held_until
    ticks = 0
    while on(s, "w2") != {"b"}:
        assert b.state == "queued" and s._now < until, (b, s._now, until)
        run(s, event(Tick))
        ticks += 1
    assert s._now >= until
    return ticks


def test_inputs_a_connected_holder_never_hands_over_fail_the_task(make_state: Factory) -> None:
    """w2 cannot get a from w1 (say, it cannot reach w1), though both stay connected: a
    is made again and b sent back each time, held back from its second try on for
    INPUTS_BACKOFF seconds doubled per try (at most MAX_INPUTS_BACKOFF), until it has
    failed that way at least MAX_INPUTS_UNREACHABLE times in a row and for
    unreachable_for seconds (here 30; the test clock moves a second per event); then b
    fails with InputsUnreachable instead of going round for ever, and a is not made
    again for nobody."""
    s = _b_on_w2_needs_a_on_w1(make_state, unreachable_for=30.0)
    assert MAX_INPUTS_UNREACHABLE == 5
    assert (INPUTS_BACKOFF, MAX_INPUTS_BACKOFF) == (0.5, 10.0)
    first = None
    holds = []
    for _ in range(50):
        cmds = finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
        first = s._now if first is None else first
        if of(cmds, KeyErred):
            break
        b = s.tasks["b"]
        holds.append(b.held_until - s._now if b.held_until else 0.0)
        assert not (b.unreachable >= 5 and s._now - first >= 30.0)  # not given up early
        assert assigned(cmds) == {"w1": ["a"]} and states(s) == {"a": "processing", "b": "waiting"}
        finish(s, "w1", "a")
        _held_back(s)
    assert holds == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    (erred,) = of(cmds, KeyErred)
    err = erred.error
    assert erred.key == "b" and isinstance(err, InputsUnreachable)
    assert (err.key, err.worker, err.inputs) == ("b", "w2", (("a", "w1"),))
    assert err.times == 8 and err.seconds == s._now - first >= 30.0
    assert (
        f"could not get its inputs on worker 'w2' ('a' from 'w1') {err.times} times in a row "
        f"over {err.seconds:.0f} s" in str(err)
    )
    # What to check, TLS included: a worker's certificate that does not name its --host.
    assert "each worker's --host" in str(err)
    assert "over wss://, each worker's certificate must name its --host" in str(err)
    assert assigned(cmds) == {}  # a is not made again: nothing needs it now
    assert s.tasks["b"].state == "erred"
    # Counted and grouped with the other failures (metrics, the dashboard's "why").
    assert s.failures["b"][("missing", "InputsUnreachable")] == 1
    group = s.failure_groups[("b", "InputsUnreachable")]
    assert (group.n, group.key, group.worker, group.outcome) == (1, "b", "w2", "missing")
    assert group.error is not None and group.error.summary.startswith("InputsUnreachable: ")
    assert [(c.worker, c.keys) for c in of(cmds, DropData)] == [("w1", ("a",))]
    assert s.held == [] or all(e[2].state != "queued" for e in s.held)


def test_a_holder_that_hands_over_within_unreachable_for_fails_nothing(
    make_state: Factory,
) -> None:
    """Eight failures in a row (a killed worker whose connection the manager still
    holds for its reconnect window, say), well within the default 120 s: b waits,
    backing off, and runs once the input can be had."""
    s = _b_on_w2_needs_a_on_w1(make_state)
    for _ in range(8):
        cmds = finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
        assert of(cmds, KeyErred) == []
        finish(s, "w1", "a")
        _held_back(s)
    assert s.tasks["b"].unreachable == 8
    finish(s, "w2", "b")
    assert states(s) == {"a": "memory", "b": "memory"}


def test_a_task_backing_off_goes_at_once_when_a_worker_leaves(make_state: Factory) -> None:
    """b, held back 8 s after its sixth try in a row that could not have a from w1,
    goes back to the queue at once when w1 leaves (the holder that would not hand over
    is gone: a is made on w3), not when its hold is over; so does a held task when a
    worker that held nothing of it leaves. A hold is no longer than
    MAX_INPUTS_BACKOFF."""
    s = _b_on_w2_needs_a_on_w1(make_state)
    for _ in range(6):
        finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
        finish(s, "w1", "a")
        if s.tasks["b"].unreachable < 6:
            _held_back(s)
    b = s.tasks["b"]
    assert b.state == "queued" and b.held_until - s._now == 8.0 - 1.0
    assert [e[2] for e in s.held] == [b] and on(s, "w2") == set()
    assert s.count("queued") == 1  # still counted as ready in the queue metrics
    assert s.held_back() == {"p2": 1} and s.pool_metrics(s._now)["p2"]["held_back"] == 1
    text = status_text({"queues": s.queued_by_pool(), "held_back": 1})
    assert "1 ready (1 held back: inputs unreachable)" in text
    join(s, "w3", pool="p1")
    cmds = leave(s, "w1")
    assert b.held_until == 0.0 and assigned(cmds) == {"w3": ["a"]}
    assert states(s) == {"a": "processing", "b": "waiting"}
    cmds = finish(s, "w3", "a")
    assert assigned(cmds) == {"w2": ["b"]}  # no tick needed

    # Another worker leaving frees the held tasks too (it may have been the one).
    cmds = finish(s, "w2", "b", "missing", missing=(("a", "w3"),))
    assert b.unreachable == 7 and assigned(cmds) == {"w3": ["a"]}
    finish(s, "w3", "a")
    assert b.state == "queued" and b.held_until - s._now == 10.0 - 1.0
    join(s, "w4", pool="p1")
    leave(s, "w4")
    assert b.held_until == 0.0 and on(s, "w2") == {"b"}
    assert s.held_back() == {} and s.pool_metrics(s._now)["p2"]["held_back"] == 0


def test_inputs_lost_with_their_holder_do_not_count_as_unreachable(make_state: Factory) -> None:
    """Only holders still connected count: a holder that left takes its outputs with it,
    which is a worker loss (made again, as often as it happens), and starts the count
    over."""
    s = _b_on_w2_needs_a_on_w1(make_state)
    finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
    assert s.tasks["b"].unreachable == 1
    finish(s, "w1", "a")
    join(s, "w3", pool="p1")
    leave(s, "w1")  # a is lost with w1: made again on w3
    finish(s, "w3", "a")
    assert on(s, "w2") == {"b"}
    finish(s, "w2", "b", "missing", missing=(("a", "w1"),))  # from the holder that left
    assert s.tasks["b"].unreachable == 0 and s.tasks["b"].state != "erred"


def test_a_missing_replica_with_another_copy_left_just_retries(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", pool="p1")
    join(s, "w2", cores=2, pool="p2")
    submit(
        s,
        {"a": [], "b": ["a"], "c": ["a"]},
        ["b", "c"],
        attrs={"a": {"pool": "p1"}, "b": {"pool": "p2"}, "c": {"pool": "p2"}},
    )
    finish(s, "w1", "a")
    assert on(s, "w2") == {"b", "c"}
    finish(s, "w2", "c", fetched=("a",))
    assert s.tasks["a"].who_has == {"w1", "w2"}
    cmds = finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
    # w2 still has a copy: no recompute, b goes straight back to w2.
    assert s.tasks["a"].state == "memory" and s.tasks["a"].who_has == {"w2"}
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w2" and [(t.key, t.deps) for t in ex.tasks] == [("b", (("a", ("w2",)),))]
    assert facts(cmds)["a"].replicas == ("w2",)
    assert [(c.worker, c.keys) for c in of(cmds, DropData)] == [("w1", ("a",))]


def test_fetched_inputs_become_replicas(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", pool="p1")
    join(s, "w2", pool="p2")
    submit(
        s,
        {"a": [], "b": ["a"], "c": ["a"]},
        ["b", "c"],
        attrs={"a": {"pool": "p1"}, "b": {"pool": "p2"}},
    )
    finish(s, "w1", "a")
    cmds = finish(s, "w2", "b", fetched=("a",))
    assert facts(cmds)["a"].replicas in (("w1", "w2"), ("w2", "w1"))
    assert s.tasks["a"] in s.workers["w2"].has_what
    # Losing w1 no longer loses a.
    cmds = leave(s, "w1")
    assert s.tasks["a"].state == "memory" and s.tasks["a"].who_has == {"w2"}


# ----------------------------------------------------------------------------- lost lineage


def test_recomputing_a_lost_output_reruns_an_input_cancelled_as_unneeded(
    make_state: Factory,
) -> None:
    # Only infrastructure events, no user errors or cancels:
    # a on w1, b on w2; w1 dies so a is recomputed, but b finishes anyway (it had
    # fetched a) and the recompute of a is cancelled as unneeded. Then w2 dies: b is
    # wanted, must be recomputed, and needs a again.
    s = make_state(unknown_long=False, saturation=2.0, placement="round-robin")
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a", duration=0.1)  # short: a may queue on w2 beside b
    assert s.tasks["b"].worker == "w2"
    leave(s, "w1")
    assert s.tasks["a"].state == "processing"  # recomputing on w2
    cmds = finish(s, "w2", "b", fetched=("a",))
    assert [c.key for c in of(cmds, KeyDone)] == ["b"]
    join(s, "w3")
    leave(s, "w2")
    # b must make progress: a runs again (on w3), then b.
    assert s.tasks["b"].state == "waiting"
    assert s.tasks["a"].state in ("queued", "processing"), s.story("a", "b")
    finish(s, "w3", "a")
    cmds = finish(s, "w3", "b")
    assert [c.key for c in of(cmds, KeyDone)] == ["b"]


def test_recomputing_a_lost_output_whose_input_has_since_erred_fails_it(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    loop = Loop(s)
    loop.run(event(WorkerJoined, worker="w1", cores=1, memory=GB))
    loop.run(event(GraphSubmitted, specs=specs_for(s, {"a": [], "b": ["a"]}, ["b"]), wanted=("b",)))
    loop.finish("w1", "a")
    loop.finish("w1", "b")
    assert states(s) == {"a": "released", "b": "memory"}
    # A new task needs a again; this time a fails.
    loop.run(event(GraphSubmitted, specs=specs_for(s, {"c": ["a"]}, ["c"]), wanted=("c",)))
    boom = ValueError("flaky source")
    loop.finish("w1", "a", outcome="error", error=boom)
    assert states(s) == {"a": "erred", "b": "memory", "c": "erred"}
    # Now b's only copy is lost. b cannot be recomputed: it must fail, not hang.
    cmds = loop.run(event(WorkerLeft, worker="w1", cause="crash"))
    erred = {c.key: c for c in of(cmds, KeyErred)}
    assert "b" in erred, s.story("a", "b")
    assert erred["b"].root == "a" and erred["b"].root_error is boom
    assert isinstance(erred["b"].error, DependencyFailed)
    assert s.tasks["b"].state == "erred"


# ----------------------------------------------------------------------------- poison tasks


def test_a_task_running_on_three_workers_that_crashed_is_a_suspect(make_state: Factory) -> None:
    s = make_state()
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    causes = ["connection lost", "exit code 1", "crash"]
    for i, cause in enumerate(causes):
        join(s, f"w{i}")
        assert on(s, f"w{i}") == {"a"}
        cmds = leave(s, f"w{i}", cause=cause)
        if i < 2:
            assert of(cmds, KeyErred) == [] and s.tasks["a"].state == "queued"
    (ke,) = of(cmds, KeyErred)  # b, the wanted key, fails with a as its root
    err = s.tasks["a"].error
    assert isinstance(err, TaskCrashedWorkers) and isinstance(err, WorkerLost)
    assert err.crashes == [("w0", "connection lost"), ("w1", "exit code 1"), ("w2", "crash")]
    assert "'w1' (exit code 1)" in str(err) and "execution 'process'" in str(err)
    assert ke.key == "b" and ke.root == "a" and ke.root_error is err
    assert s.tasks["a"].crash_tries == 3
    assert "holds Python's GIL" not in str(err)  # some died: not a silent worker's hint
    silent = TaskCrashedWorkers("a", [("w0", "unknown"), ("w1", "unknown")])
    assert "holds Python's GIL for long" in str(silent) and "--worker-timeout" in str(silent)
    assert "Cluster(worker_timeout=SECONDS)" in str(silent)


def test_a_poison_task_s_verdict_is_what_the_dashboard_and_the_database_say(
    make_state: Factory,
) -> None:
    """User audit (failures, 9): the client got TaskCrashedWorkers, but the monitoring
    database's tasks.error and the dashboard's group said only the last try's 'worker
    w2 was lost (crash)'. The core's feed says the verdict (before the erred
    transition), the group of the last try shows it, and the recorder writes it as the
    task's error; a worker restarted under its name is named once, with its lives."""
    from actors.scheduler import _failure_groups
    from runtime.messages import MonitorFeedReply
    from runtime.monitordb import MonitorRecorder, _Rows

    s = make_state(monitor=True)
    submit(s, {"segv": []}, ["segv"])
    for wid in ("w1", "w2", "w2"):
        join(s, wid)
        cmds = leave(s, wid, cause="crash")
    (ke,) = of(cmds, KeyErred)
    assert isinstance(ke.error, TaskCrashedWorkers)
    said = str(ke.error)
    assert "on 3 workers that ended unexpectedly (each life of a worker restarted" in said
    assert "'w1' (crash); 'w2' (crash, 2 times: 2 lives of it)." in said
    entries, _, _ = s.feed_since(0, 1000)
    feed = [r for _, rs in entries for r in rs if r[1] == "segv"]
    records = [r for r in feed if r[0] != "state" or r[2] == "erred"]
    assert [r[0] for r in records][-3:] == ["try", "verdict", "state"]
    assert records[-2][2].summary == f"TaskCrashedWorkers: {said}"
    (group,) = [g for g in _failure_groups(s, 0.0) if g.cause == "crash"]
    assert (group.key, group.worker, group.n, group.erred) == ("segv", "w2", 3, 1)
    assert group.error == f"TaskCrashedWorkers: {said}"

    writer: Any = SimpleNamespace(path="x", ender=None)
    recorder = MonitorRecorder(writer, lambda: None, lambda: None, lambda: None)  # type: ignore[arg-type,return-value]
    recorder._events(_Rows(), MonitorFeedReply(events=tuple(entries)))
    row = recorder._tasks["segv"]
    assert (row[6], row[13]) == ("erred", f"TaskCrashedWorkers: {said}")


def test_drained_preempted_and_walltime_losses_make_no_suspect(make_state: Factory) -> None:
    s = make_state()
    submit(s, {"a": []}, ["a"])
    for i, cause in enumerate(["drained", "preempted", "walltime", "crash", "preempted"]):
        join(s, f"w{i}")
        assert of(leave(s, f"w{i}", cause=cause), KeyErred) == []
    ts = s.tasks["a"]
    assert ts.state == "queued" and ts.lost_tries == 5 and ts.crash_tries == 1


def started(state: SchedulerState, worker: str, *keys: Key) -> list[Command]:
    """``worker`` says these tries have executed 0.6 s (``TasksRunning``)."""
    said = tuple((k, 0, 0.6) for k in keys)
    return run(state, event(TasksRunning, worker=worker, started=said))


def hold_and_tiny(state: SchedulerState, worker: str, cores: int = 1) -> None:
    """``worker`` joins and finishes a fast ``tiny``; then a ``hold`` and a ``tiny``
    come, and it gets both (a fast category: up to 2 tasks per core)."""
    join(state, worker, cores=cores)
    submit(state, {"tiny-0": []}, ["tiny-0"])
    finish(state, worker, "tiny-0", duration=0.001)
    release(state, "tiny-0")  # not made again when the worker is lost
    submit(state, {"hold": [], "tiny-1": []}, ["hold", "tiny-1"])
    assert on(state, worker) == {"hold", "tiny-1"}


def test_a_try_queued_behind_one_that_fills_its_worker_is_not_charged_its_crash(
    make_state: Factory,
) -> None:
    # The physics audit: a 1-core worker runs a long task and holds a fast one in its
    # queue; it is killed from outside (kill -9) three times. Before, both were
    # "running" on 3 crashed workers and the fast one, which never started, failed the
    # run with TaskCrashedWorkers.
    s = make_state()
    hold_and_tiny(s, "w0")
    for i in range(3):
        if i:
            join(s, f"w{i}")
            assert on(s, f"w{i}") == {"hold", "tiny-1"}
        started(s, f"w{i}", "hold")  # its one thread executes hold: tiny waits
        cmds = leave(s, f"w{i}", cause="crash")
    tiny, hold = s.tasks["tiny-1"], s.tasks["hold"]
    assert tiny.state == "queued" and tiny.crash_tries == 0 and tiny.lost_tries == 3
    assert [t.ran for t in tiny.tries] == [0.0] * 3
    assert [e[2] for e in s.story("tiny-1") if e[1] == "retry"] == [
        "worker lost (crash); free retry"
    ] * 3
    (ke,) = of(cmds, KeyErred)  # hold executed each time: the suspect
    assert ke.key == "hold" and isinstance(ke.error, TaskCrashedWorkers)
    assert hold.crash_tries == 3 and [t.ran for t in hold.tries] == [None] * 3
    assert "or may have been" in str(ke.error) and "max_lost=20" in str(ke.error)
    assert assigned(join(s, "w3")) == {"w3": ["tiny-1"]}


def test_a_crash_counts_against_every_try_while_threads_were_free(make_state: Factory) -> None:
    # A worker that said fewer tries execute than it has threads: any other may have
    # begun (under 0.5 s ago) and killed it. And one that never said: nothing is known.
    s = make_state(retry=REGISTRY.create("retry", "default", {"max_lost": 2}))
    hold_and_tiny(s, "w0", cores=2)
    started(s, "w0", "hold")
    leave(s, "w0", cause="crash")
    join(s, "w1")
    assert on(s, "w1") == {"hold", "tiny-1"}
    leave(s, "w1", cause="crash")  # it said nothing
    tiny = s.tasks["tiny-1"]
    assert tiny.crash_tries == 2 and s.tasks["hold"].crash_tries == 2
    assert [t.ran for t in tiny.tries] == [None, None]
    # A third loss, queued: past max_lost it fails as lost, not as the suspect of a
    # crash it had no part in.
    join(s, "w2")
    started(s, "w2", "hold")
    cmds = leave(s, "w2", cause="crash")
    err = tiny.error
    assert tiny.state == "erred" and tiny.lost_tries == 3 and tiny.crash_tries == 2
    assert isinstance(err, WorkerLost) and not isinstance(err, TaskCrashedWorkers)
    assert "max_lost" in str(err)
    assert {k.key for k in of(cmds, KeyErred)} == {"hold", "tiny-1"}
    assert isinstance(s.tasks["hold"].error, TaskCrashedWorkers)


def test_max_crashes_is_a_retry_policy_parameter(make_state: Factory) -> None:
    s = make_state(retry=REGISTRY.create("retry", "default", {"max_crashes": 1}))
    submit(s, {"a": []}, ["a"])
    join(s, "w1")
    (ke,) = of(leave(s, "w1", cause="crash"), KeyErred)
    assert isinstance(ke.error, WorkerLost) and not isinstance(ke.error, TaskCrashedWorkers)
    assert ke.error.cause == "crash"  # one crash: nothing to compare it with
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("retry", "default", {"max_crashes": 0})


# ----------------------------------------------------------------------------- suspension


def join_block(state: SchedulerState, block: str, n: int = 2) -> list[str]:
    """``n`` one-core workers of ``block`` join: their ids, ``block.0`` ..."""
    wids = [f"{block}.{i}" for i in range(n)]
    for wid in wids:
        run(state, event(WorkerJoined, worker=wid, cores=1, memory=GB, block=block))
    return wids


def suspend(state: SchedulerState, wids: Iterable[str], suspended: bool = True) -> Any:
    return run(state, event(Suspended, workers=tuple(wids), suspended=suspended))


def test_a_suspended_block_s_workers_take_no_task_and_their_silence_is_a_free_loss(
    make_state: Factory,
) -> None:
    # The audit's repro: a block suspended long enough that its workers are lost
    # (silent: ``unknown``). Before, the task went to the suspended sibling, was lost
    # again at once, and three such losses failed it with TaskCrashedWorkers.
    s = make_state()
    submit(s, {"a": []}, ["a"])
    for block in ("ckpt-2", "ckpt-3", "ckpt-4"):
        wids = join_block(s, block)
        (lost,) = (w for w in wids if on(s, w) == {"a"})
        (sibling,) = (w for w in wids if w != lost)
        assert suspend(s, wids) == []  # nothing moves: what they run goes on later
        assert s.free.keys().isdisjoint(wids)
        cmds = leave(s, lost, cause="unknown")  # silent past the manager's grace
        assert assigned(cmds) == {}  # not onto the suspended sibling
        assert s.tasks["a"].state == "queued"
        cmds = leave(s, sibling, cause="unknown")
        assert assigned(cmds) == {} and of(cmds, KeyErred) == []
    ts = s.tasks["a"]
    assert ts.state == "queued" and ts.crash_tries == 0
    assert [t.cause for t in ts.tries] == ["suspended"] * 3
    assert [e[2] for e in s.story("a") if e[1] == "retry"] == [
        "worker lost (suspended); free retry"
    ] * 3
    assert [e[2] for e in s.story("ckpt-2.0") if e[1] == "joined"] == [
        "suspended",
        "left:suspended",
    ]
    assert assigned(join(s, "owner-1")) == {"owner-1": ["a"]}


def test_a_resumed_block_s_workers_take_tasks_again_and_other_losses_keep_their_cause(
    make_state: Factory,
) -> None:
    s = make_state()
    wids = join_block(s, "ckpt-1")
    suspend(s, wids)
    assert assigned(submit(s, {"a": []}, ["a"])) == {}  # queued: no worker takes it
    # Back within the manager's grace, a worker rejoins as usual: still suspended
    # until the batch system says the block runs again.
    run(s, event(WorkerJoined, worker=wids[0], cores=1, memory=GB, block="ckpt-1"))
    assert s.workers[wids[0]].suspended and s.tasks["a"].state == "queued"
    assert assigned(suspend(s, wids, suspended=False)) == {wids[0]: ["a"]}
    assert s.lost_cause(wids[0], "unknown") == "unknown"  # resumed: silence is a loss
    suspend(s, wids)
    assert s.lost_cause(wids[0], "crash") == "crash"  # only silence is the suspension's
    assert s.lost_cause(wids[0], "unknown") == "suspended"
    assert s.lost_cause("nobody", "unknown") == "unknown"


def test_workers_stopped_with_the_cluster_leave_as_shutdown_not_preempted(
    make_state: Factory,
) -> None:
    """The manager stops: the autoscaler stops the blocks (scancel), and a worker
    inside a Slurm job reads its stop signal as a preemption. Told first
    (``StoppedWithCluster``), the scheduler records its end ``shutdown``: its try's
    cause, its story, and its pool's survival (a life not ended unasked). A worker of
    another block, preempted meanwhile, stays ``preempted``; one retired on purpose
    keeps its own cause."""
    s = make_state()
    submit(s, {"a": []}, ["a"])
    stopped, other = join_block(s, "ckpt-1", n=1), join_block(s, "ckpt-2", n=1)
    (running,) = (w for w in stopped + other if on(s, w) == {"a"})
    assert run(s, event(StoppedWithCluster, workers=(*stopped, "not-joined"))) == []
    assert s.lost_cause(stopped[0], "drained") == "drained"
    leave(s, stopped[0], cause="preempted")
    leave(s, other[0], cause="preempted")
    assert ("ckpt-1.0", "joined", "left:shutdown") in lines_of(s, "ckpt-1.0")
    assert ("ckpt-2.0", "joined", "left:preempted") in lines_of(s, "ckpt-2.0")
    causes = {stopped[0]: "shutdown", other[0]: "preempted"}
    assert s.tasks["a"].tries[0].cause == causes[running]  # the first loss: its worker's
    assert sorted(unasked for _, unasked in s.lives["default"]) == [False, True]


def lines_of(s: SchedulerState, worker: str) -> list[tuple[Any, ...]]:
    return [e[:3] for e in s.story(worker)]


# ----------------------------------------------------------------------------- rejoining


def held(state: SchedulerState, worker: str, active: Iterable[Key] = (), **sizes: int) -> Any:
    return run(
        state,
        event(WorkerHeld, worker=worker, active=frozenset(active), held=tuple(sizes.items())),
    )


def test_a_task_sent_before_a_rejoin_that_never_arrived_is_sent_again(
    make_state: Factory,
) -> None:
    s = make_state(unknown_long=False, saturation=2.0)
    join(s, "w1")
    submit(s, {"a": [], "b": []}, ["a", "b"])
    assert on(s, "w1") == {"a", "b"}
    join(s, "w1")  # rejoined over a new connection: a and b may have been lost
    cmds = held(s, "w1", active=["b"])  # a never reached it
    assert assigned(cmds) == {"w1": ["a"]}  # sent again (to the one worker there is)
    assert s.tasks["a"].tries == [] and s.tasks["a"].lost_tries == 0  # nothing ran: free
    assert ("a", "processing", "lost-in-transit") in [e[:3] for e in s.story("a")]
    assert on(s, "w1") == {"a", "b"}


def test_a_result_lost_with_the_connection_is_taken_from_what_the_worker_holds(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    join(s, "w1")
    cmds = held(s, "w1", a=123)  # a finished; its TasksDone was lost
    assert s.tasks["a"].state == "memory" and s.tasks["a"].nbytes == 123
    assert s.tasks["a"].who_has == {"w1"}
    assert assigned(cmds) == {"w1": ["b"]}


def test_tasks_sent_after_the_rejoin_are_not_second_guessed(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    join(s, "w1")  # rejoined before anything was sent
    submit(s, {"a": []}, ["a"])  # sent over the new connection
    cmds = held(s, "w1")  # its snapshot was taken before a arrived
    assert cmds == [] and on(s, "w1") == {"a"}


def test_outputs_whose_drop_was_lost_are_dropped_again(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    join(s, "w1")
    cmds = held(s, "w1", a=100, gone=5)
    (drop,) = of(cmds, DropData)
    assert drop.worker == "w1" and drop.keys == ("gone",)
    assert s.tasks["a"].who_has == {"w1"}


def test_an_output_a_gather_did_not_find_is_made_again(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    assert s.tasks["a"].state == "memory"
    cmds = run(s, event(ReplicasMissing, worker="w1", keys=("a", "unknown")))
    assert s.tasks["a"].who_has == set() and assigned(cmds) == {"w1": ["a"]}
    finish(s, "w1", "a")
    assert s.tasks["a"].state == "memory"


def test_a_worker_declared_lost_that_joins_as_new_drops_outputs_made_again(
    make_state: Factory,
) -> None:
    """w1 is declared lost holding a, b and c, and joins again as a new worker with
    them still on its disk: a is in memory on w2 by then (w1's copy becomes a replica),
    b is being made again on w2 and c was released (both dropped on w1); d, which w1
    runs now, is left alone."""
    s = make_state(saturation=1.0)
    join(s, "w1")
    for key in ("a", "b", "c"):
        submit(s, {key: []}, [key])
        finish(s, "w1", key)
    release(s, "c")  # its DropData to w1 is lost with the connection
    join(s, "w2")
    leave(s, "w1", "crash")
    assert on(s, "w2") == {"a"} and s.tasks["b"].state == "queued"
    finish(s, "w2", "a")
    assert on(s, "w2") == {"b"}
    join(s, "w1")  # as new: the scheduler forgot it
    submit(s, {"d": []}, ["d"])
    assert on(s, "w1") == {"d"}
    cmds = held(s, "w1", active=["d"], a=100, b=100, c=100)
    assert [(c.worker, c.keys) for c in of(cmds, DropData)] == [("w1", ("b", "c"))]
    assert s.tasks["a"].who_has == {"w1", "w2"}
    assert on(s, "w1") == {"d"} and on(s, "w2") == {"b"}
