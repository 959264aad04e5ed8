"""Tests of the scheduler's pure core (actors/scheduler_state.py).

No event loop, no threads, no clock: every test feeds events to
``SchedulerState.handle`` and checks the exact commands it returns. The autouse fixture
``make_state`` builds the states and runs ``validate()`` (the invariant check) on every
one of them when the test ends; the ``run`` helper also validates after each step.

Graphs are dicts of ``dask._task_spec.Task`` nodes built by :func:`graph` from a
``{key: [dependency keys]}`` table and turned into specs by ``build_specs``, exactly as
the client does.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from actors.registry import FilesDropped, FileTable
from actors.scheduler_state import (
    ACTIVE,
    TRANSITIONS,
    CancelOnWorker,
    CancelRequested,
    Command,
    DropData,
    Event,
    Execute,
    FileFact,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    InvalidTransition,
    KeyCancelled,
    KeyDone,
    KeyErred,
    KeysReleased,
    PolicyChanged,
    ReplicasMissing,
    SchedulerConfig,
    SchedulerState,
    TaskResult,
    TasksFinished,
    WorkerHeld,
    WorkerJoined,
    WorkerLeft,
)
from policies import REGISTRY, PolicyParamsError, RetryDecision
from policies.priority import GraphPriority
from runtime.errors import (
    CancelledError,
    DependencyFailed,
    MissingKeysError,
    TaskCrashedWorkers,
    UnknownPolicyError,
    WorkerLost,
)
from runtime.graph import Key, build_specs
from tests.helpers import (
    GB,
    MB,
    Factory,
    Loop,
    assigned,
    by_order,
    cancel,
    chain,
    event,
    facts,
    files_released,
    finish,
    finish_all,
    graph,
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
    submit,
    worker_of,
)

__all__ = ["make_state"]  # the autouse fixture, used by name

# ----------------------------------------------------------------------------- ready / assign


def test_independent_tasks_fill_each_workers_slots_and_the_rest_stay_queued(
    make_state: Factory,
) -> None:
    s = make_state(saturation=2.0)
    join(s, "w1", cores=2)  # 4 slots
    join(s, "w2", cores=1)  # 2 slots
    keys = [f"x-{i}" for i in range(10)]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)

    got = assigned(cmds)
    assert sorted(got) == ["w1", "w2"]
    assert len(got["w1"]) == 4 and len(got["w2"]) == 2
    sent = got["w1"] + got["w2"]
    assert len(set(sent)) == 6
    # The six best by priority went out; the other four wait in the queue.
    assert set(sent) == set(by_order(s, keys)[:6])
    assert s.count("processing") == 6 and s.count("queued") == 4
    assert s.workers["w1"].slots == 4 and s.workers["w2"].slots == 2
    assert not s.free
    for c in of(cmds, Execute):
        for t in c.tasks:
            assert t.node is s.tasks[t.key].spec.node
            assert t.category == "x" and t.deps == ()
    # The registry hears about an output only once it exists: none does yet.
    assert facts(cmds) == {}


def test_a_finished_task_frees_its_slot_for_the_next_queued_task(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    keys = ["x-0", "x-1", "x-2"]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    first, second, third = by_order(s, keys)
    assert assigned(cmds) == {"w1": [first]}

    cmds = finish(s, "w1", first, nbytes=7)
    assert of(cmds, KeyDone) == [KeyDone(cmds[0].stimulus_id, first, "w1", 7)]
    assert assigned(cmds) == {"w1": [second]}
    assert s.tasks[first].state == "memory" and s.tasks[third].state == "queued"

    assert assigned(finish(s, "w1", second)) == {"w1": [third]}
    cmds = finish(s, "w1", third)
    assert assigned(cmds) == {}
    assert states(s) == dict.fromkeys(keys, "memory")


def test_no_work_without_workers_then_work_when_one_joins(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    cmds = submit(s, {"a": [], "b": ["a"]}, ["b"])
    assert of(cmds, Execute) == []
    assert states(s) == {"a": "queued", "b": "waiting"}
    assert s.tasks["b"].waiting_on == 1
    assert facts(cmds) == {}  # nothing created yet: nothing for the registry

    cmds = join(s, "w1", cores=1)
    assert len(of(cmds, Execute)) == 1
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w1" and [t.key for t in ex.tasks] == ["a"]
    assert s.tasks["a"].worker == "w1" and s.tasks["a"].state == "processing"


def test_pool_tasks_only_go_to_workers_of_that_pool(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "cpu", cores=4)
    join(s, "gpu1", cores=2, pool="gpu")
    gkeys = [f"g-{i}" for i in range(4)]
    cmds = submit(s, dict.fromkeys(gkeys, ()), gkeys, pool="gpu")
    got = assigned(cmds)
    assert list(got) == ["gpu1"] and len(got["gpu1"]) == 2
    assert s.count("queued") == 2  # the cpu worker is free but not in the pool
    assert "cpu" in s.free

    # Tasks without a pool run anywhere, here on the free cpu worker.
    assert assigned(submit(s, {"p": []}, ["p"])) == {"cpu": ["p"]}

    cmds = join(s, "gpu2", cores=2, pool="gpu")
    assert sorted(assigned(cmds)["gpu2"]) == sorted(set(gkeys) - set(got["gpu1"]))
    assert s.count("queued") == 0


def test_a_task_needing_more_memory_than_any_worker_waits_for_a_bigger_one(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", cores=2, memory=GB)
    cmds = submit(
        s,
        {"big": [], "fat": [], "x": []},
        ["big", "fat", "x"],
        attrs={"big": {"resources": {"memory": 8 * GB}}, "fat": {"resources": {"cores": 4}}},
    )
    assert assigned(cmds) == {"small": ["x"]}  # the others do not fit; x still runs
    assert s.tasks["big"].state == "queued" and s.tasks["fat"].state == "queued"
    assert "small" in s.free  # a free slot, yet nothing it can run

    assert assigned(join(s, "medium", cores=2, memory=4 * GB)) == {}
    cmds = join(s, "huge", cores=8, memory=16 * GB)
    assert {w: sorted(ks) for w, ks in assigned(cmds).items()} == {"huge": ["big", "fat"]}


def test_ready_tasks_run_by_user_priority_then_submission_then_graph_order(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    first = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(first, ()), first)  # generation 1, priority 0
    submit(s, {"y": []}, ["y"])  # generation 2, priority 0
    submit(s, {"z": []}, ["z"], priority=5)  # generation 3, but urgent
    submit(s, {"low": []}, ["low"], priority=-1)  # generation 4, below everything
    expected = ["z", *by_order(s, first), "y", "low"]

    join(s, "w1")
    seen = [s.tasks[k].key for k in on(s, "w1")]
    for _ in range(len(expected) - 1):
        (key,) = on(s, "w1")
        nxt = assigned(finish(s, "w1", key))["w1"]
        seen.extend(nxt)
    assert seen == expected


def test_graph_order_finishes_a_branch_before_starting_the_next(make_state: Factory) -> None:
    # Two independent branches joined at the end: dask.order runs one branch to its
    # end before starting the other, and the scheduler follows it. (Memory-blind: with
    # the default memory policy the two roots, which feed the same consumer, would be
    # sent together; see test_scheduler_memory.py.)
    s = make_state(saturation=1.0, memory="blind")
    table = {"a-0": [], "a-1": ["a-0"], "b-0": [], "b-1": ["b-0"], "c": ["a-1", "b-1"]}
    submit(s, table, ["c"])
    join(s, "w1")
    seen = []
    while s.count("processing"):
        (key,) = on(s, "w1")
        seen.append(key)
        finish(s, "w1", key)
    assert seen == by_order(s, table)
    branch = [k[0] for k in seen[:2]]
    assert branch[0] == branch[1]  # both tasks of the first branch come first


def test_execute_tells_each_task_where_its_inputs_live(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    cmds = finish(s, "w1", "a", nbytes=123)
    (ex,) = of(cmds, Execute)
    (todo,) = ex.tasks
    assert todo.key == "b" and todo.deps == (("a", ("w1",)),) and todo.category == "b"
    assert facts(cmds)["a"] == FileFact("a", "created", 123, ("w1",), 1, False)


def test_a_worker_registering_again_keeps_its_work(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", cores=1)
    keys = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(keys, ()), keys)
    (running,) = on(s, "w1")
    cmds = join(s, "w1", cores=2)  # reconnected, now with more cores
    assert len(assigned(cmds)["w1"]) == 1
    assert running in on(s, "w1") and s.workers["w1"].slots == 2
    assert s.tasks[running].state == "processing"


# ----------------------------------------------------------------------------- finish


def test_dependents_become_ready_only_when_all_inputs_are_in_memory(make_state: Factory) -> None:
    s = make_state(saturation=2.0)
    join(s, "w1", cores=2)
    cmds = submit(s, {"a": [], "b": [], "c": ["a", "b"]}, ["c"])
    assert sorted(assigned(cmds)["w1"]) == ["a", "b"]
    assert s.tasks["c"].waiting_on == 2

    cmds = finish(s, "w1", "a")
    assert assigned(cmds) == {} and s.tasks["c"].state == "waiting"
    assert s.tasks["c"].waiting_on == 1
    assert of(cmds, KeyDone) == []  # a is not wanted

    cmds = finish(s, "w1", "b")
    assert assigned(cmds) == {"w1": ["c"]}
    cmds = finish(s, "w1", "c", nbytes=5)
    assert [(c.key, c.worker, c.nbytes) for c in of(cmds, KeyDone)] == [("c", "w1", 5)]


def test_key_done_is_sent_only_for_wanted_keys(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1", cores=4)
    submit(s, {"a": [], "b": ["a"], "c": ["a"]}, ["b", "c"])
    assert of(finish(s, "w1", "a"), KeyDone) == []
    cmds = finish_all(s, "w1", ["b", "c"], nbytes=9)
    assert sorted((c.key, c.worker, c.nbytes) for c in of(cmds, KeyDone)) == [
        ("b", "w1", 9),
        ("c", "w1", 9),
    ]
    # a lost its last consumer: the registry may drop it now.
    assert facts(cmds)["a"] == FileFact("a", "created", 100, ("w1",), 0, False)


def test_category_statistics_are_learned_from_results(make_state: Factory) -> None:
    s = make_state(saturation=4.0)
    join(s, "w1", cores=2)
    keys = ["load-0", "load-1", "load-2", "load-3"]
    submit(s, dict.fromkeys(keys, ()), keys)
    finish(s, "w1", "load-0", start=10.0, duration=1.0, nbytes=100, rss=5 * MB)
    finish(s, "w1", "load-1", start=11.0, duration=3.0, nbytes=300, rss=9 * MB)
    finish(s, "w1", "load-2", start=12.0, duration=2.0, nbytes=200, rss=7 * MB)
    finish(s, "w1", "load-3", "error", error=ValueError("bad input"))

    st_ = s.stats["load"]
    assert st_.count == 3
    assert st_.mean_duration == pytest.approx(2.0)
    assert st_.max_duration == pytest.approx(3.0)
    assert st_.total_nbytes == 600 and st_.mean_nbytes == pytest.approx(200)
    assert st_.peak_rss == 9 * MB
    assert st_.errors == 1 and st_.lost == 0
    assert [t.outcome for t in s.tasks["load-3"].tries] == ["error"]
    assert [(t.worker, t.start, t.stop) for t in s.tasks["load-1"].tries] == [("w1", 11.0, 14.0)]


def test_lost_tries_are_counted_per_category(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"job-0": []}, ["job-0"])
    leave(s, "w1", cause="oom")
    assert s.stats["job"].lost == 1 and s.stats["job"].count == 0


def test_short_tasks_get_a_backlog_beyond_their_slots_up_to_the_limit(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, backlog=0.05, max_per_core=10, unknown_duration=0.5)
    join(s, "w1", cores=2)
    ws = s.workers["w1"]
    assert (ws.slots, ws.limit) == (2, 20)
    keys = [f"tiny-{i}" for i in range(100)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert ws.n_processing == 2  # duration unknown: only the slots

    first = sorted(on(s, "w1"), key=str)
    finish(s, "w1", first[0], duration=0.001)
    assert ws.n_processing == 2  # the other unknown task still weighs 0.5 s
    finish(s, "w1", first[1], duration=0.001)
    # Now the category is known to be tiny: the worker gets a batch up to its limit.
    assert ws.n_processing == ws.limit == 20
    assert ws.occupancy == pytest.approx(20 * 0.001)
    assert s.count("queued") == 100 - 2 - 20

    # Each finished task is replaced at once while under the limit.
    cmds = finish(s, "w1", sorted(on(s, "w1"), key=str)[0], duration=0.001)
    assert len(assigned(cmds)["w1"]) == 1
    assert ws.n_processing == 20


def test_long_tasks_get_no_backlog(make_state: Factory) -> None:
    s = make_state(saturation=1.0, backlog=0.05, max_per_core=10)
    join(s, "w1", cores=2)
    keys = [f"slow-{i}" for i in range(10)]
    submit(s, dict.fromkeys(keys, ()), keys)
    for _ in range(4):
        finish(s, "w1", sorted(on(s, "w1"), key=str)[0], duration=2.0)
        assert s.workers["w1"].n_processing == 2


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
    assert [t.outcome for t in ts.tries] == ["error"] * 3
    assert s.stats["a"].errors == 3
    assert [e[2] for e in s.story("a") if e[1] == "retry"] == [
        "error; retry budget left",
        "error; retry budget left",
    ]


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
    assert ts.lost_tries == 1 and ts.behind
    (try_,) = ts.tries
    assert (try_.worker, try_.outcome, try_.cause) == (wa, "worker-lost", "preempted")
    assert wa not in s.workers and wa not in s.free
    assert of(cmds, KeyErred) == []


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


def test_output_held_only_by_a_lost_worker_is_released_when_not_needed(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", pool="p1")
    join(s, "w2", pool="p2")
    submit(s, {"a": [], "b": ["a"]}, ["b"], attrs={"a": {"pool": "p1"}, "b": {"pool": "p2"}})
    finish(s, "w1", "a")
    assert on(s, "w2") == {"b"}
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


def test_a_missing_input_puts_the_task_back_and_recomputes_the_input(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", pool="p1")
    join(s, "w2", pool="p2")
    submit(s, {"a": [], "b": ["a"]}, ["b"], attrs={"a": {"pool": "p1"}, "b": {"pool": "p2"}})
    finish(s, "w1", "a")
    assert on(s, "w2") == {"b"}
    # w1 lost a (disk wiped) before w2 could fetch it.
    cmds = finish(s, "w2", "b", "missing", missing=(("a", "w1"),))
    assert assigned(cmds) == {"w1": ["a"]}
    assert states(s) == {"a": "processing", "b": "waiting"}
    assert s.tasks["b"].tries == [] and s.tasks["b"].retries_left == 0  # not a try
    assert facts(cmds)["a"].replicas == ()

    cmds = finish(s, "w1", "a")
    assert assigned(cmds) == {"w2": ["b"]}
    assert of(cmds, Execute)[0].tasks[0].deps == (("a", ("w1",)),)


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


# ----------------------------------------------------------------------------- cancel


def test_cancelling_a_waiting_key_cancels_upstream_work_nothing_else_needs(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"], "c": []}, ["b", "c"], attrs={"c": {"priority": -1}})
    assert s.tasks["a"].worker == "w1" and s.tasks["c"].state == "queued"

    cmds = cancel(s, "b", reason="user hit ctrl-c")
    (kc,) = of(cmds, KeyCancelled)
    assert kc.key == "b" and "user hit ctrl-c" in kc.reason
    assert of(cmds, CancelOnWorker) == [CancelOnWorker(kc.stimulus_id, "w1", ("a",))]
    assert isinstance(s.tasks["b"].error, CancelledError)
    # a is cancelled too (nothing else needs it); not wanted, so no message for it.
    assert s.tasks["a"].state == "cancelled"
    assert s.tasks["a"].worker is None and "a" not in on(s, "w1")
    # Its slot went to c.
    assert assigned(cmds) == {"w1": ["c"]}

    cmds = cancel(s, "c")
    assert [c.key for c in of(cmds, KeyCancelled)] == ["c"]
    assert of(cmds, CancelOnWorker) == [CancelOnWorker(cmds[0].stimulus_id, "w1", ("c",))]


def test_cancelling_a_queued_key_sends_nothing_to_workers(make_state: Factory) -> None:
    s = make_state()
    submit(s, {"a": []}, ["a"])
    cmds = cancel(s, "a")
    assert [type(c) for c in cmds if not isinstance(c, FileFacts)] == [KeyCancelled]
    assert s.tasks["a"].state == "cancelled"
    assert assigned(join(s, "w1")) == {}


def test_cancelling_a_processing_key_cancels_its_dependents(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"], "c": ["b"]}, ["a", "c"])
    cmds = cancel(s, "a")
    assert sorted(c.key for c in of(cmds, KeyCancelled)) == ["a", "c"]
    assert [(c.worker, c.keys) for c in of(cmds, CancelOnWorker)] == [("w1", ("a",))]
    err = s.tasks["c"].error
    assert isinstance(err, CancelledError) and "'b' was cancelled" in str(err)
    assert s.tasks["c"].root is not None and s.tasks["c"].root[0] == "a"
    assert states(s) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    assert "w1" in s.free


def test_cancelling_keeps_upstream_work_another_task_needs(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"], "c": ["a"]}, ["b", "c"])
    cmds = cancel(s, "b")
    assert of(cmds, CancelOnWorker) == []
    assert s.tasks["a"].state == "processing" and s.tasks["a"].consumers == 1
    assert s.tasks["c"].state == "waiting"


def test_cancelling_finished_or_unknown_keys_does_nothing(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    assert cancel(s, "a", "nope") == []
    assert s.tasks["a"].state == "memory"


def test_a_late_result_of_a_cancelled_task_is_dropped(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": []}, ["a", "b"])
    cancel(s, "a", "b")
    cmds = finish(s, "w1", "a")  # it finished before the cancel reached the worker
    assert of(cmds, DropData) == [DropData(cmds[0].stimulus_id, "w1", ("a",))]
    assert of(cmds, KeyDone) == [] and s.tasks["a"].state == "cancelled"
    assert s.stats.get("a") is None
    # A late error or cancelled outcome has nothing to drop.
    assert finish(s, "w1", "b", "error", error=ValueError()) == []
    assert ("a", "stale", "result:ok") in [e[:3] for e in s.story("a")]


def test_results_from_an_unknown_worker_are_ignored(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    assert finish(s, "ghost", "a") == []
    assert s.tasks["a"].state == "processing"


def test_a_worker_reporting_cancelled_cancels_the_task(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    cmds = finish(s, "w1", "a", "cancelled")
    assert [c.key for c in of(cmds, KeyCancelled)] == ["b"]
    assert states(s) == {"a": "cancelled", "b": "cancelled"}


def test_cancelling_the_end_of_a_5000_task_chain(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    n = 5000
    last = f"c-{n - 1}"
    submit(s, chain("c", n), [last], check=False)
    cmds = cancel(s, last)
    assert [c.key for c in of(cmds, KeyCancelled)] == [last]
    assert [(c.worker, c.keys) for c in of(cmds, CancelOnWorker)] == [("w1", ("c-0",))]
    assert s.count("cancelled") == n  # the whole chain: nothing else needs it
    assert isinstance(s.tasks["c-0"].error, CancelledError)
    release(s, last)
    assert s.tasks == {}


# ----------------------------------------------------------------------------- release / forget


def test_releasing_a_finished_key_tells_the_registry_it_is_not_wanted(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a", nbytes=42)
    cmds = release(s, "a")
    assert cmds == [
        FileFacts(cmds[0].stimulus_id, (FileFact("a", "created", 42, ("w1",), 0, False),))
    ]
    assert s.tasks["a"].state == "memory"  # until the registry drops it

    cmds = files_released(s, "a")
    assert s.tasks == {}
    assert facts(cmds) == {"a": FileFact("a", "forgotten", 42, (), 0, False)}
    assert s.workers["w1"].has_what == set()


def test_a_key_wanted_twice_needs_two_releases(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    cmds = submit(s, {"a": []}, ["a"])
    assert of(cmds, Execute) == [] and s.tasks["a"].wanted == 2
    finish(s, "w1", "a")
    assert facts(release(s, "a"))["a"].wanted is True
    assert facts(release(s, "a"))["a"].wanted is False
    assert release(s, "a") == []  # one release too many is ignored


def test_releasing_a_whole_graph_forgets_every_task(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    loop = Loop(s)
    loop.run(event(WorkerJoined, worker="w1", cores=2, memory=GB))
    specs = specs_for(s, {"a": [], "b": ["a"], "c": ["b"], "d": ["b"]}, ["c", "d"])
    loop.run(event(GraphSubmitted, specs=specs, wanted=("c", "d")))
    loop.finish("w1", "a")
    loop.finish("w1", "b")
    assert loop.dropped == ["a"]  # b has both its consumers left
    loop.finish("w1", "c")
    loop.finish("w1", "d")
    assert loop.dropped == ["a", "b"]
    # Intermediates are released but kept for lineage.
    assert states(s) == {"a": "released", "b": "released", "c": "memory", "d": "memory"}
    assert loop.table.summary()["stored_bytes"] == {"w1": 200}

    cmds = loop.run(event(KeysReleased, keys=("c",)))
    assert sorted(states(s)) == ["a", "b", "d"]
    assert facts(cmds)["c"].state == "forgotten"
    cmds = loop.run(event(KeysReleased, keys=("d",)))
    assert s.tasks == {}
    assert sorted(k for k, f in facts(cmds).items() if f.state == "forgotten") == [
        "a",
        "b",
        "d",
    ]
    assert loop.table.files == {} and loop.table.summary()["stored_bytes"] == {"w1": 0}


def test_a_released_input_needed_by_a_new_submission_is_recomputed(make_state: Factory) -> None:
    s = make_state()
    loop = Loop(s)
    loop.run(event(WorkerJoined, worker="w1", cores=1, memory=GB))
    loop.run(event(GraphSubmitted, specs=specs_for(s, {"a": [], "b": ["a"]}, ["b"]), wanted=("b",)))
    loop.finish("w1", "a")
    loop.finish("w1", "b")
    assert states(s) == {"a": "released", "b": "memory"}

    specs = specs_for(s, {"c": ["a"]}, ["c"])
    assert list(specs) == ["c"]
    cmds = loop.run(event(GraphSubmitted, specs=specs, wanted=("c",)))
    assert assigned(cmds) == {"w1": ["a"]}
    assert states(s) == {"a": "processing", "b": "memory", "c": "waiting"}
    cmds = loop.finish("w1", "a")
    assert assigned(cmds) == {"w1": ["c"]}
    assert [e[1:3] for e in s.story("a")].count(("queued", "processing")) == 2


def test_a_release_racing_a_new_consumer_recomputes(make_state: Factory) -> None:
    # The registry drops a (nobody needed it) while a new task starts reading it.
    s = make_state(saturation=1.0)
    join(s, "w1", cores=2)
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a")
    finish(s, "w1", "b")  # FileFact: a has no consumers, registry will drop it
    cmds = submit(s, {"c": ["a"]}, ["c"])
    assert assigned(cmds) == {"w1": ["c"]}
    cmds = files_released(s, "a")  # the drop arrives after c was sent to w1
    assert s.tasks["a"].state == "processing"  # running again: c needs it
    cmds = finish(s, "w1", "c", "missing", missing=(("a", "w1"),))
    assert s.tasks["c"].state == "waiting"
    cmds = finish(s, "w1", "a")
    assert assigned(cmds) == {"w1": ["c"]}


def test_releasing_an_unfinished_key_cancels_it(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    cmds = release(s, "b")
    assert of(cmds, KeyCancelled) == []  # nobody wants it any more
    assert [(c.worker, c.keys) for c in of(cmds, CancelOnWorker)] == [("w1", ("a",))]
    assert s.tasks == {}


def test_releasing_an_erred_key_forgets_it(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a", "error", error=ValueError())
    release(s, "b")
    assert s.tasks == {}


# ----------------------------------------------------------------------------- resubmission


def test_resubmitting_an_erred_key_runs_it_again(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    table = {"a": [], "b": ["a"]}
    submit(s, table, ["b"], retries=1)
    finish(s, "w1", "a", "error", error=ValueError())
    finish(s, "w1", "a", "error", error=ValueError())
    assert states(s) == {"a": "erred", "b": "erred"}

    cmds = submit(s, table, ["b"], retries=1)
    assert assigned(cmds) == {"w1": ["a"]}
    assert of(cmds, KeyErred) == []
    assert states(s) == {"a": "processing", "b": "waiting"}
    assert s.tasks["a"].retries_left == 1  # a fresh budget
    assert s.tasks["a"].error is None and s.tasks["b"].error is None
    finish(s, "w1", "a")
    cmds = finish(s, "w1", "b")
    assert [c.key for c in of(cmds, KeyDone)] == ["b"]


def test_wanting_an_erred_key_without_its_spec_reports_the_error_again(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    boom = ValueError()
    finish(s, "w1", "a", "error", error=boom)
    cmds = run(s, event(GraphSubmitted, specs={}, wanted=("a",)))
    assert [(c.key, c.error) for c in of(cmds, KeyErred)] == [("a", boom)]


def test_resubmitting_a_cancelled_key_runs_it_again(make_state: Factory) -> None:
    s = make_state()
    submit(s, {"a": []}, ["a"])
    cancel(s, "a")
    submit(s, {"a": []}, ["a"])
    assert s.tasks["a"].state == "queued"
    assert assigned(join(s, "w1")) == {"w1": ["a"]}


def test_submitting_existing_keys_reuses_them(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    table = {"a": [], "b": ["a"]}
    submit(s, table, ["b"])
    a, b = s.tasks["a"], s.tasks["b"]
    cmds = submit(s, {**table, "c": ["a"]}, ["b", "c"])
    assert of(cmds, Execute) == []  # a is already running
    assert s.tasks["a"] is a and s.tasks["b"] is b and b.wanted == 2
    assert a.consumers == 2
    finish(s, "w1", "a")
    cmds = finish(s, "w1", sorted(on(s, "w1"))[0])
    cmds += finish(s, "w1", sorted(on(s, "w1"))[0])
    assert sorted(c.key for c in of(cmds, KeyDone)) == ["b", "c"]
    # Once done, asking again answers at once without running anything.
    cmds = submit(s, table, ["b"])
    assert [(c.key, c.worker) for c in of(cmds, KeyDone)] == [("b", "w1")]
    assert of(cmds, Execute) == []
    assert [e[1:3] for e in s.story("a")].count(("queued", "processing")) == 1


def test_a_new_task_depending_on_an_erred_key_fails_with_dependency_failed(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    boom = ValueError("boom")
    finish(s, "w1", "a", "error", error=boom)
    # A new task reading the erred future (it is not resubmitted with it).
    cmds = submit(s, {"b": ["a"]}, ["b"])
    (ke,) = of(cmds, KeyErred)
    assert ke.key == "b" and ke.root == "a" and ke.root_error is boom
    assert isinstance(ke.error, DependencyFailed)
    assert s.tasks["b"].state == "erred"


def test_wanting_a_key_whose_input_was_cancelled_reports_it_cancelled(
    make_state: Factory,
) -> None:
    s = make_state()
    table = {"a": [], "b": ["a"], "c": ["b"]}
    submit(s, table, ["c"])
    cmds = cancel(s, "a")
    assert [k.key for k in of(cmds, KeyCancelled)] == ["c"]
    assert states(s) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    # Ask for b (run again from its spec). Its input stays cancelled, so b cannot run;
    # the client must be told, or its future waits forever.
    specs = {"b": s.tasks["b"].spec}
    cmds = run(s, event(GraphSubmitted, specs=specs, wanted=("b",)))
    assert s.tasks["b"].state == "cancelled"
    assert [k.key for k in of(cmds, KeyCancelled)] == ["b"]


def test_a_new_task_whose_input_was_forgotten_meanwhile_errs(make_state: Factory) -> None:
    # The manager validated the graph while "a" still existed; the scheduler forgot it
    # before the submission arrived.
    s = make_state()
    join(s, "w1")
    specs = build_specs(graph({"b": ["a"]}), ["b"], known=lambda k: True)
    cmds = run(s, event(GraphSubmitted, specs=specs, wanted=("b",)))
    (ke,) = of(cmds, KeyErred)
    assert ke.key == "b" and ke.root == "b"
    assert isinstance(ke.error, MissingKeysError) and "'a'" in str(ke.error)
    assert of(cmds, Execute) == [] and s.tasks["b"].state == "erred"


def test_a_resubmitted_key_gets_a_fresh_budget_for_worker_losses(make_state: Factory) -> None:
    s = make_state(retry=REGISTRY.create("retry", "default", {"max_lost": 1}))
    submit(s, {"a": []}, ["a"])
    for w in ("w1", "w2"):
        join(s, w)
        leave(s, w)
    assert isinstance(s.tasks["a"].error, WorkerLost)

    submit(s, {"a": []}, ["a"])  # try again, e.g. after fixing the cluster
    join(s, "w3")
    cmds = leave(s, "w3")
    # One loss of the new run is within max_lost=1 and retried for free.
    assert of(cmds, KeyErred) == []
    assert s.tasks["a"].state == "queued"


# ----------------------------------------------------------------------------- lost lineage


def test_recomputing_a_lost_output_reruns_an_input_cancelled_as_unneeded(
    make_state: Factory,
) -> None:
    # Only infrastructure events, no user errors or cancels:
    # a on w1, b on w2; w1 dies so a is recomputed, but b finishes anyway (it had
    # fetched a) and the recompute of a is cancelled as unneeded. Then w2 dies: b is
    # wanted, must be recomputed, and needs a again.
    s = make_state(saturation=2.0, placement="round-robin")
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a")
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


# ----------------------------------------------------------------------------- policies


def test_placement_policy_change_moves_where_later_tasks_go(make_state: Factory) -> None:
    s = make_state(saturation=2.0)  # default placement: locality
    for w in ("w1", "w2", "w3"):
        join(s, w, cores=1, memory=8 * GB)  # room for the 4 GB input (memory admission)
    submit(s, {"big": []}, ["big"])
    wbig = worker_of(s, "big")
    finish(s, wbig, "big", nbytes=4 * GB)
    keys = ["use-0", "use-1"]
    cmds = submit(s, {k: ["big"] for k in keys}, keys)
    # Locality: both readers go where the 4 GB input already is.
    assert assigned(cmds) == {wbig: by_order(s, keys)}

    run(
        s,
        event(PolicyChanged, kind="placement", policy=REGISTRY.create("placement", "round-robin")),
    )
    assert s.policies["placement"].name == "round-robin"
    keys = ["more-0", "more-1", "more-2", "more-3"]
    cmds = submit(s, {k: ["big"] for k in keys}, keys)
    got = assigned(cmds)
    # Round-robin ignores the data: the free slots of every worker are used in turn.
    others = sorted({"w1", "w2", "w3"} - {wbig})
    assert sorted(got) == others and all(len(v) == 2 for v in got.values())
    assert any(e[2] == "placement:round-robin" for e in s.story("-"))


def test_least_loaded_placement_spreads_work(make_state: Factory) -> None:
    s = make_state(saturation=2.0, placement="least-loaded")
    join(s, "w1", cores=1)
    join(s, "w2", cores=1)
    keys = ["x-0", "x-1"]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    assert sorted(len(v) for v in assigned(cmds).values()) == [1, 1]


class Reversed:
    """A priority policy for tests: graph order backwards."""

    name = "reversed"

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        return (-task.order,)


def test_a_priority_policy_swap_reorders_the_queue(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    keys = [f"x-{i}" for i in range(5)]
    submit(s, dict.fromkeys(keys, ()), keys)
    run(s, event(PolicyChanged, kind="priority", policy=Reversed()))
    join(s, "w1")
    seen = list(on(s, "w1"))
    while len(seen) < len(keys):
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    assert seen == by_order(s, keys)[::-1]


def test_long_first_priority_starts_long_categories_first(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    submit(s, {"quick-99": [], "slow-99": []}, ["quick-99", "slow-99"])
    while s.count("processing"):
        (key,) = on(s, "w1")
        finish(s, "w1", key, duration=60.0 if key.startswith("slow") else 1.0)
    submit(s, {"block": []}, ["block"])  # keeps w1 busy while the queue fills
    quick = [f"quick-{i}" for i in range(3)]
    slow = [f"slow-{i}" for i in range(3)]
    submit(s, dict.fromkeys(quick, ()), quick)  # earlier submission: first by default
    submit(s, dict.fromkeys(slow, ()), slow)
    policy = REGISTRY.create("priority", "long-first")
    run(s, event(PolicyChanged, kind="priority", policy=policy))
    seen = ["block"]
    while len(seen) < 7:
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    assert seen[1:] == by_order(s, slow) + by_order(s, quick)


class Raising:
    name = "raising"

    def choose(self, task: Any, candidates: Any, stats: Any) -> Any:
        raise RuntimeError("placement bug")

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        raise RuntimeError("priority bug")

    def decide(self, task: Any, outcome: str, cause: str | None) -> RetryDecision:
        raise RuntimeError("retry bug")


class Elsewhere:
    """A placement policy that answers with a worker that is not a candidate."""

    name = "elsewhere"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def choose(self, task: Any, candidates: Any, stats: Any) -> Any:
        return self.answer


def test_a_placement_policy_that_raises_falls_back_and_is_counted(make_state: Factory) -> None:
    s = make_state(placement=Raising())
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"a": []}, ["a"])
    assert assigned(cmds) == {"w1": ["a"]}  # the first candidate
    assert s.policy_errors == 1
    assert any(e[1] == "policy-error" and "placement bug" in e[2] for e in s.story("a"))


@pytest.mark.parametrize("answer", ["nobody", "busy", 42, None])
def test_a_placement_policy_choosing_a_non_candidate_falls_back(
    make_state: Factory, answer: Any
) -> None:
    s = make_state(saturation=1.0)
    join(s, "busy")
    submit(s, {"x": []}, ["x"])
    assert on(s, "busy") == {"x"}
    join(s, "w1")
    pol = Elsewhere(s.workers["busy"] if answer == "busy" else answer)
    run(s, event(PolicyChanged, kind="placement", policy=pol))
    cmds = submit(s, {"a": []}, ["a"])
    assert assigned(cmds) == {"w1": ["a"]}
    assert s.policy_errors == 1
    assert any("not a candidate" in e[2] for e in s.story("a"))


def test_a_priority_policy_that_raises_falls_back_to_graph_order(make_state: Factory) -> None:
    s = make_state(saturation=1.0, priority=Raising())
    keys = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policy_errors == 3
    join(s, "w1")
    seen = list(on(s, "w1"))
    while len(seen) < 3:
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    assert seen == by_order(s, keys)
    ts = s.tasks["x-0"]
    assert ts.prio == GraphPriority().priority(ts, s.stats)


class Garbage:
    """Policies answering with values of the wrong type."""

    name = "garbage"

    def priority(self, task: Any, stats: Any) -> tuple[Any, ...]:
        return ("high", task.order)

    def decide(self, task: Any, outcome: str, cause: str | None) -> Any:
        return True


def test_a_priority_policy_answering_non_numbers_falls_back(make_state: Factory) -> None:
    s = make_state(saturation=1.0, priority=Garbage())
    keys = ["x-0", "x-1"]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policy_errors == 2
    assert any("not a tuple of numbers" in e[2] for e in s.story("x-0"))
    assert [s.tasks[k].prio for k in keys] == [
        GraphPriority().priority(s.tasks[k], s.stats) for k in keys
    ]


def test_a_retry_policy_answering_garbage_falls_back(make_state: Factory) -> None:
    s = make_state(retry=Garbage())
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    boom = ValueError()
    (ke,) = of(finish(s, "w1", "a", "error", error=boom), KeyErred)  # default: no budget
    assert ke.error is boom and s.policy_errors == 1
    assert any("not a RetryDecision" in e[2] for e in s.story("a"))


def test_a_retry_policy_that_raises_falls_back_to_the_default(make_state: Factory) -> None:
    s = make_state(retry=Raising())
    join(s, "w1")
    submit(s, {"a": [], "b": []}, ["a", "b"], retries=1)
    cmds = finish(s, "w1", "a", "error", error=ValueError())
    assert s.policy_errors == 1 and s.tasks["a"].retries_left == 0  # default: charged
    assert "a" in {k for ks in assigned(cmds).values() for k in ks}
    cmds = leave(s, "w1")
    assert s.policy_errors == 3  # a and b, lost with w1: free retries by default
    assert states(s) == {"a": "queued", "b": "queued"}


def test_unknown_policy_names_raise_unknown_policy_error() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        REGISTRY.create("placement", "telepathy")
    assert info.value.kind == "placement" and info.value.name == "telepathy"
    assert "locality" in info.value.available and "round-robin" in info.value.available
    assert "telepathy" in str(info.value)
    with pytest.raises(UnknownPolicyError):
        REGISTRY.create("mood", "happy")
    with pytest.raises(KeyError):  # it is a KeyError too
        REGISTRY.create("retry", "forever")
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("retry", "default", {"max_lost": -1})
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("placement", "locality", {"colour": "red"})
    assert REGISTRY.names("priority") == ["graph", "long-first"]


def test_a_policy_change_of_an_unknown_kind_is_refused(make_state: Factory) -> None:
    s = make_state()
    with pytest.raises(KeyError):
        s.handle(event(PolicyChanged, kind="mood", policy=Reversed()))


# ----------------------------------------------------------------------------- transitions, story


def test_an_invalid_transition_raises_with_the_story(make_state: Factory) -> None:
    s = make_state()
    cmds = submit(s, {"a": []}, ["a"])
    ts = s.tasks["a"]
    assert ("queued", "memory") not in TRANSITIONS
    with pytest.raises(InvalidTransition) as info:
        s._set(ts, "memory")
    err = info.value
    assert (err.key, err.start, err.finish) == ("a", "queued", "memory")
    assert err.story == [("a", "new", "queued", cmds[0].stimulus_id, err.story[0][4])]
    assert "queued -> memory" in str(err) and "report" in str(err)
    assert ts.state == "queued"  # nothing changed


def test_every_allowed_transition_starts_and_ends_in_a_known_state() -> None:
    known = {"new", "waiting", "queued", "processing", "memory", "released", "erred"}
    known |= {"cancelled"}
    assert {a for a, _ in TRANSITIONS} <= known and {b for _, b in TRANSITIONS} <= known
    assert all(b != "new" for _, b in TRANSITIONS)


def test_story_lists_a_tasks_transitions_with_their_stimulus_ids(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    sub = event(GraphSubmitted, specs=specs_for(s, {"a": [], "b": ["a"]}, ["b"]), wanted=("b",))
    run(s, sub)
    fin = event(TasksFinished, worker="w1", results=(result("a"),))
    run(s, fin)
    assert s.story("a") == [
        ("a", "new", "queued", sub.stimulus_id, sub.now),
        ("a", "queued", "processing", sub.stimulus_id, sub.now),
        ("a", "processing", "memory", fin.stimulus_id, fin.now),
    ]
    assert [e[1:4] for e in s.story("b")] == [
        ("new", "waiting", sub.stimulus_id),
        ("waiting", "queued", fin.stimulus_id),
        ("queued", "processing", fin.stimulus_id),
    ]
    assert len(s.story("a", "b")) == 6
    assert s.story("nope") == []


def test_handle_refuses_unknown_events(make_state: Factory) -> None:
    s = make_state()
    with pytest.raises(TypeError):
        s.handle(event(Event))


# ----------------------------------------------------------------------------- random workloads


class RandomWorkload(RuleBasedStateMachine):
    """Random graphs, workers that come and go, random outcomes, cancels and releases,
    with the registry core answering the FileFacts. ``validate()`` after every step;
    ``settle`` runs everything to the end and checks every wanted key's outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.state = SchedulerState(SchedulerConfig(saturation=1.0))
        self.table = FileTable()
        self.dropped: list[Key] = []  #: released by the registry, not yet told
        self.wants: Counter[Key] = Counter()  #: the test client's holds per key
        self.note: dict[Key, str] = {}  #: last done/erred/cancelled message per key
        self.n_graphs = 0
        self.n_workers = 0

    # -- plumbing ----------------------------------------------------------------------
    def handle(self, ev: Event) -> list[Command]:
        cmds = self.state.handle(ev)
        for c in cmds:
            if isinstance(c, FileFacts):
                for rc in self.table.handle(c.facts):
                    if isinstance(rc, FilesDropped):
                        self.dropped.extend(rc.keys)
            elif isinstance(c, KeyDone):
                assert self.state.tasks[c.key].state == "memory"
                assert c.worker in self.state.tasks[c.key].who_has
                self.note[c.key] = "memory"
            elif isinstance(c, KeyErred):
                self.note[c.key] = "erred"
                if c.root != c.key:
                    assert isinstance(c.error, DependencyFailed)
                    assert c.error.dependency == str(c.root)
            elif isinstance(c, KeyCancelled):
                self.note[c.key] = "cancelled"
            elif isinstance(c, Execute):
                for t in c.tasks:
                    assert self.state.tasks[t.key].worker == c.worker
        self.state.validate()
        return cmds

    def with_state(self, *names: str) -> list[Key]:
        return [k for k, ts in self.state.tasks.items() if ts.state in names]

    def pick(self, rnd: random.Random, items: Iterable[Any]) -> Any:
        pool = sorted(items, key=str)
        return rnd.choice(pool) if pool else None

    # -- rules -------------------------------------------------------------------------
    @rule(seed=st.integers(0, 2**32 - 1), size=st.integers(20, 60))
    def submit(self, seed: int, size: int) -> None:
        rnd = random.Random(seed)
        g = self.n_graphs
        self.n_graphs += 1
        existing = sorted(self.state.tasks, key=str)
        table: dict[Key, list[Key]] = {}
        for i in range(size):
            deps = rnd.sample(list(table), min(len(table), rnd.choice([0, 1, 1, 2, 3])))
            if existing and rnd.random() < 0.05:
                deps.append(rnd.choice(existing))  # a result of an earlier graph
            table[f"g{g}{'abc'[i % 3]}-{i}"] = deps
        keys = list(table)
        wanted = [k for k in keys if rnd.random() < 0.2] or [keys[-1]]
        specs = build_specs(
            graph(table),
            wanted,
            known=lambda k: k in self.state.tasks,
            retries=rnd.choice([0, 0, 1]),
        )
        # dask.order breaks ties by string hashes, which differ between processes; a
        # fixed order keeps the examples reproducible.
        position = {k: i for i, k in enumerate(table)}
        specs = {k: dataclasses.replace(v, order=position[k]) for k, v in specs.items()}
        self.handle(event(GraphSubmitted, specs=specs, wanted=tuple(wanted)))
        self.wants.update(wanted)

    @precondition(lambda m: m.with_state("erred", "cancelled"))
    @rule(seed=st.integers(0, 2**32 - 1))
    def resubmit_failed(self, seed: int) -> None:
        rnd = random.Random(seed)
        failed = [k for k, ts in self.state.tasks.items() if ts.state in ("erred", "cancelled")]
        key = self.pick(rnd, failed)
        if key is None:
            return
        spec = self.state.tasks[key].spec
        self.handle(event(GraphSubmitted, specs={key: spec}, wanted=(key,)))
        self.wants[key] += 1

    @rule(cores=st.integers(1, 3))
    def join(self, cores: int) -> None:
        if len(self.state.workers) >= 5:
            return
        wid = f"w{self.n_workers}"
        self.n_workers += 1
        self.handle(event(WorkerJoined, worker=wid, cores=cores, memory=GB))

    @precondition(lambda m: m.state.workers)
    @rule(seed=st.integers(0, 2**32 - 1), cause=st.sampled_from(["preempted", "oom", "crash"]))
    def leave(self, seed: int, cause: str) -> None:
        wid = self.pick(random.Random(seed), self.state.workers)
        if wid is not None:
            self.handle(event(WorkerLeft, worker=wid, cause=cause))

    @precondition(lambda m: m.state.workers)
    @rule(seed=st.integers(0, 2**32 - 1), cores=st.integers(1, 3))
    def churn(self, seed: int, cores: int) -> None:
        """One worker is preempted and a fresh one takes its place."""
        self.leave(seed, "preempted")
        self.join(cores)

    @precondition(lambda m: m.with_state("processing"))
    @rule(
        seed=st.integers(0, 2**32 - 1),
        outcome=st.sampled_from(["ok", "ok", "ok", "ok", "error", "timeout", "missing"]),
    )
    def finish(self, seed: int, outcome: str) -> None:
        rnd = random.Random(seed)
        busy = [ts for ts in self.state.tasks.values() if ts.state == "processing"]
        ts = self.pick(rnd, busy)
        if ts is None:
            return
        wid = ts.worker
        in_memory = [d for d in ts.deps if d.state == "memory"]
        fetched = tuple(d.key for d in in_memory if rnd.random() < 0.5 and wid not in d.who_has)
        if outcome == "missing":
            holders = [(d.key, w) for d in in_memory for w in sorted(d.who_has) if w != wid]
            if not holders:
                outcome = "ok"
            else:
                res = TaskResult(ts.key, "missing", missing=(rnd.choice(holders),))
                self.handle(event(TasksFinished, worker=wid, results=(res,)))
                return
        error = ValueError(f"boom {ts.key}") if outcome != "ok" else None
        start = rnd.random()
        res = TaskResult(
            ts.key,
            outcome,  # type: ignore[arg-type]
            start=start,
            stop=start + rnd.random(),
            nbytes=rnd.randrange(1, 1000),
            error=error,
            fetched=fetched if outcome == "ok" else (),
        )
        self.handle(event(TasksFinished, worker=wid, results=(res,)))

    @precondition(lambda m: m.state.workers and m.with_state("erred", "cancelled"))
    @rule(seed=st.integers(0, 2**32 - 1))
    def stale_result(self, seed: int) -> None:
        rnd = random.Random(seed)
        done = [k for k, ts in self.state.tasks.items() if ts.state in ("cancelled", "erred")]
        key = self.pick(rnd, done)
        wid = self.pick(rnd, self.state.workers)
        if key is None or wid is None:
            return
        res = TaskResult(key, "ok", nbytes=1)
        before = states(self.state)
        cmds = self.handle(event(TasksFinished, worker=wid, results=(res,)))
        assert [(c.worker, c.keys) for c in cmds if isinstance(c, DropData)] == [(wid, (key,))]
        assert states(self.state) == before

    @precondition(lambda m: m.with_state(*ACTIVE))
    @rule(seed=st.integers(0, 2**32 - 1))
    def cancel(self, seed: int) -> None:
        active = [k for k, ts in self.state.tasks.items() if ts.state in ACTIVE]
        key = self.pick(random.Random(seed), active)
        if key is not None:
            self.handle(event(CancelRequested, keys=(key,), reason="random"))

    @precondition(lambda m: any(m.wants.values()))
    @rule(seed=st.integers(0, 2**32 - 1))
    def release(self, seed: int) -> None:
        key = self.pick(random.Random(seed), [k for k, n in self.wants.items() if n])
        if key is not None:
            self.wants[key] -= 1
            self.handle(event(KeysReleased, keys=(key,)))

    @precondition(lambda m: m.dropped)
    @rule(n=st.integers(1, 5))
    def deliver_releases(self, n: int) -> None:
        keys, self.dropped = self.dropped[:n], self.dropped[n:]
        if keys:
            self.handle(event(FilesReleased, keys=tuple(keys)))

    @rule(name=st.sampled_from(["locality", "round-robin", "least-loaded"]))
    def placement(self, name: str) -> None:
        policy = REGISTRY.create("placement", name)
        self.handle(event(PolicyChanged, kind="placement", policy=policy))

    @rule()
    def settle(self) -> None:
        """All workers present, only ok outcomes: everything must come to an end."""
        if not self.state.workers:
            wid = f"w{self.n_workers}"
            self.n_workers += 1
            self.handle(event(WorkerJoined, worker=wid, cores=2, memory=GB))
        for _ in range(10_000):
            progressed = False
            if self.dropped:
                keys, self.dropped = tuple(self.dropped), []
                self.handle(event(FilesReleased, keys=keys))
                progressed = True
            for wid in sorted(self.state.workers):
                ws = self.state.workers.get(wid)
                if ws is None or not ws.processing:
                    continue
                results = tuple(
                    TaskResult(ts.key, "ok", start=0.0, stop=0.01, nbytes=10)
                    for ts in sorted(ws.processing, key=lambda t: str(t.key))
                )
                self.handle(event(TasksFinished, worker=wid, results=results))
                progressed = True
            if not progressed:
                break
        stuck = {
            (k, ts.state): [(d.key, d.state) for d in ts.deps if d.state != "memory"]
            for k, ts in self.state.tasks.items()
            if ts.state in ACTIVE
        }
        assert not stuck, ("stuck tasks and their missing inputs", stuck)
        for key, n in self.wants.items():
            if not n:
                continue
            ts = self.state.tasks.get(key)
            assert ts is not None, key
            assert ts.state in ("memory", "erred", "cancelled"), (ts, self.state.story(key))
            assert self.note.get(key) == ts.state, (ts, self.note.get(key))


def test_random_workloads_keep_the_invariants_and_finish() -> None:
    run_state_machine_as_test(
        RandomWorkload,
        settings=settings(
            max_examples=300,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,  # the same examples on every run
            database=None,
            # Shrinking these graphs takes close to a minute; a failure prints its full
            # step list and the story of the stuck or wrong tasks instead.
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target),
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_categories_learn_bytes_consumed_and_rss_growth(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"load-1": [], "load-2": [], "sum-3": ["load-1", "load-2"]}, ["sum-3"])
    s.handle(
        TasksFinished(
            "f1", 1.0, "w1",
            (
                TaskResult("load-1", "ok", 0.0, 0.1, 1000, rss=5000, rss_before=4000),
                TaskResult("load-2", "ok", 0.1, 0.2, 3000, rss=8000, rss_before=5000),
            ),
        )
    )  # fmt: skip
    s.handle(
        TasksFinished(
            "f2", 2.0, "w1", (TaskResult("sum-3", "ok", 0.2, 0.3, 8, rss=7000, rss_before=8000),)
        )
    )
    load, total = s.stats["load"], s.stats["sum"]
    assert (load.total_nbytes, load.consumed_nbytes, load.max_rss_growth) == (4000, 0, 3000)
    assert (total.total_nbytes, total.consumed_nbytes, total.max_rss_growth) == (8, 4000, 0)
    assert load.production_ratio == float("inf")  # a root that makes data: a producer
    assert total.production_ratio == 8 / 4000  # a reduction: a consumer


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


def test_drained_preempted_and_walltime_losses_make_no_suspect(make_state: Factory) -> None:
    s = make_state()
    submit(s, {"a": []}, ["a"])
    for i, cause in enumerate(["drained", "preempted", "walltime", "crash", "preempted"]):
        join(s, f"w{i}")
        assert of(leave(s, f"w{i}", cause=cause), KeyErred) == []
    ts = s.tasks["a"]
    assert ts.state == "queued" and ts.lost_tries == 5 and ts.crash_tries == 1


def test_max_crashes_is_a_retry_policy_parameter(make_state: Factory) -> None:
    s = make_state(retry=REGISTRY.create("retry", "default", {"max_crashes": 1}))
    submit(s, {"a": []}, ["a"])
    join(s, "w1")
    (ke,) = of(leave(s, "w1", cause="crash"), KeyErred)
    assert isinstance(ke.error, WorkerLost) and not isinstance(ke.error, TaskCrashedWorkers)
    assert ke.error.cause == "crash"  # one crash: nothing to compare it with
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("retry", "default", {"max_crashes": 0})


# ----------------------------------------------------------------------------- rejoining


def held(state: SchedulerState, worker: str, active: Iterable[Key] = (), **sizes: int) -> Any:
    return run(
        state,
        event(WorkerHeld, worker=worker, active=frozenset(active), held=tuple(sizes.items())),
    )


def test_a_task_sent_before_a_rejoin_that_never_arrived_is_sent_again(
    make_state: Factory,
) -> None:
    s = make_state(saturation=2.0)
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
