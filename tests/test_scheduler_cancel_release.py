"""Tests of the scheduler's pure core (actors/scheduler_state.py): cancelling, releasing
and forgetting keys, and submitting keys again.

No event loop, no threads, no clock: every test feeds events to
``SchedulerState.handle`` and checks the exact commands it returns. The autouse fixture
``make_state`` (tests/helpers.py) builds the states and runs ``validate()`` (the
invariant check) on every one of them when the test ends; the ``run`` helper also
validates after each step. Graphs come from :func:`tests.helpers.graph`, a
``{key: [dependency keys]}`` table turned into specs by ``build_specs`` as the client does.
"""

from __future__ import annotations

import collections

from actors.protocol import FileFact
from actors.scheduler_events import (
    CancelOnWorker,
    CancelRequested,
    CancelSpared,
    DropData,
    Execute,
    FileFacts,
    GraphSubmitted,
    KeyCancelled,
    KeyDone,
    KeyErred,
    KeysReleased,
    KeyTaken,
    TasksFinished,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_state import MAX_CLIENT_TURNS, MAX_LIVES, RECENT_TRIES
from actors.storage_state import DEPARTED_KEPT
from policies import REGISTRY
from runtime.errors import (
    CancelledError,
    DependencyFailed,
    MissingKeysError,
    WorkerLost,
)
from runtime.graph import Key, build_specs
from tests.helpers import (
    GB,
    Factory,
    Loop,
    assigned,
    cancel,
    chain,
    event,
    facts,
    files_released,
    finish,
    graph,
    join,
    leave,
    make_state,
    of,
    on,
    release,
    result,
    run,
    specs_for,
    states,
    submit,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


# ----------------------------------------------------------------------------- cancel


def test_a_task_sent_and_cancelled_in_one_event_is_neither_sent_nor_cancelled_there(
    make_state: Factory,
) -> None:
    """Found by the random-workload state machine: in one event a consumer was sent to
    the worker holding its input (it stays with its data) and then cancelled, its only
    reader having failed. The commands said CancelOnWorker first and Execute after (a
    worker's tasks go out at the end of the event), so the worker ran a cancelled task.
    Now a try not sent yet is taken back: no Execute of it, no cancel."""
    s = make_state()
    join(s, "w1", cores=2)
    submit(s, {"a-0": [], "b-0": [], "x-0": ["a-0"], "c-0": ["x-0", "b-0"]}, ["c-0"],
           retries=0)  # fmt: skip
    assert on(s, "w1") == {"a-0", "b-0"}
    results = (result("a-0"), result("b-0", "error", error=ValueError("boom")))
    cmds = run(s, event(TasksFinished, worker="w1", results=results))
    assert s.tasks["x-0"].state == "cancelled" and s.tasks["c-0"].state == "erred"
    sent = [t.key for c in of(cmds, Execute) for t in c.tasks]
    stopped = [k for c in of(cmds, CancelOnWorker) for k in c.keys]
    assert "x-0" not in sent and "x-0" not in stopped, cmds
    assert s.workers["w1"].tasks_sent == 2  # a-0 and b-0: x-0 was never sent


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
    # the try that ran on w1 is kept, cancelled (the monitoring database's tries row,
    # the dashboard's task stream); the tasks that never ran have none
    (rec,) = s.tasks["a"].tries
    assert (rec.worker, rec.outcome, rec.cause) == ("w1", "cancelled", "cancelled")
    assert s.tasks["b"].tries == [] and s.tasks["c"].tries == []


def test_a_running_task_nothing_needs_any_more_is_recorded_unneeded(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    cancel(s, "b")
    (rec,) = s.tasks["a"].tries
    assert (rec.worker, rec.outcome, rec.cause) == ("w1", "cancelled", "unneeded")


def test_cancelling_keeps_upstream_work_another_task_needs(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"], "c": ["a"]}, ["b", "c"])
    cmds = cancel(s, "b")
    assert of(cmds, CancelOnWorker) == []
    assert s.tasks["a"].state == "processing" and s.tasks["a"].consumers == 1
    assert s.tasks["c"].state == "waiting"


def test_a_cancel_spares_what_keys_other_clients_hold_need(make_state: Factory) -> None:
    """One client cancels ``a``; another client holds ``c``, which needs ``a`` through
    ``b``: ``a`` and ``b`` run on for it, and the answer says ``a`` was spared. The
    canceller's own branch (``d``, and ``e`` it wants) is cancelled where it leaves
    what runs on (as dask's ``Client.cancel`` without ``force``)."""
    s = make_state()
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"], "c": ["b"], "d": ["a"], "e": ["d"]}, ["a", "c", "e"])
    cmds = cancel(s, "a", spare=["c"])
    (spared,) = of(cmds, CancelSpared)
    assert spared.keys == ("a",)
    assert of(cmds, CancelOnWorker) == []  # a runs on
    (kc,) = of(cmds, KeyCancelled)
    assert kc.key == "e"
    assert states(s) == {
        "a": "processing", "b": "waiting", "c": "waiting", "d": "cancelled", "e": "cancelled",
    }  # fmt: skip
    # The same cancel with nothing held by others cancels it all, answering nothing.
    t = make_state()
    join(t, "w1")
    submit(t, {"a": [], "b": ["a"], "c": ["b"]}, ["a", "c"])
    cmds = cancel(t, "a", spare=["unrelated"])
    assert of(cmds, CancelSpared) == []
    assert sorted(c.key for c in of(cmds, KeyCancelled)) == ["a", "c"]
    assert [(c.worker, c.keys) for c in of(cmds, CancelOnWorker)] == [("w1", ("a",))]


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
    assert loop.table.files == {} and loop.table.summary()["stored_bytes"] == {}


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


def test_a_submission_of_keys_its_client_wanted_already_says_where_each_stands(
    make_state: Factory,
) -> None:
    """``echo``: the keys the submitting client wanted already. Once the graph is in,
    each gets a ``KeyTaken`` for that client, in order after everything said of it
    before: pending when it runs (run again after its cancel, or still running), else
    right after its ``KeyDone``/``KeyErred`` said again."""
    s = make_state(unknown_long=False)
    join(s, "w1")
    submit(s, {"a": [], "b": [], "c": []}, ["a", "b", "c"])
    finish(s, "w1", "b")
    boom = ValueError()
    finish(s, "w1", "c", "error", error=boom)
    cancel(s, "a")
    specs = specs_for(s, {"a": []}, ["a"])
    echo = ("a", "b", "c")
    cmds = run(s, event(GraphSubmitted, specs=specs, wanted=(), echo=echo, echo_to="cl"))
    assert s.tasks["a"].state == "processing"  # run again
    said = [(type(c).__name__, c.key) for c in cmds if type(c) in (KeyDone, KeyErred, KeyTaken)]
    assert said == [
        ("KeyTaken", "a"), ("KeyDone", "b"), ("KeyTaken", "b"), ("KeyErred", "c"),
        ("KeyTaken", "c"),
    ]  # fmt: skip
    assert [(c.pending, c.client) for c in of(cmds, KeyTaken)] == [
        (True, "cl"),
        (False, "cl"),
        (False, "cl"),
    ]
    assert [c.error for c in of(cmds, KeyErred)] == [boom]


def test_a_cancelled_try_reported_after_the_key_came_back_to_its_worker_is_stale(
    make_state: Factory,
) -> None:
    """Cancelled on its worker, the key is submitted again and sent to the same worker
    before the cancelled try's report is back: that report (``cancelled``, or an output
    from before the cancel) is the earlier try's, told apart by its ``attempt``, and
    neither ends the new try nor drops what it will make."""
    s = make_state()
    join(s, "w1")
    first = of(submit(s, {"a": []}, ["a"]), Execute)[0].tasks[0]
    cancel(s, "a")
    again = of(submit(s, {"a": []}, ["a"]), Execute)[0].tasks[0]
    assert (first.key, again.key) == ("a", "a") and again.attempt > first.attempt > 0
    assert finish(s, "w1", "a", "cancelled", attempt=first.attempt) == []
    assert finish(s, "w1", "a", "ok", attempt=first.attempt) == []  # kept: a will be
    assert s.tasks["a"].state == "processing" and s.tasks["a"].worker == "w1"
    assert ("a", "stale", "result:cancelled") in [e[:3] for e in s.story("a")]
    cmds = finish(s, "w1", "a", "ok", attempt=again.attempt)
    assert [(c.key, c.worker) for c in of(cmds, KeyDone)] == [("a", "w1")]
    # Its output there is the task's now: a late report of the earlier try drops nothing.
    assert finish(s, "w1", "a", "ok", attempt=first.attempt) == []
    assert s.tasks["a"].who_has == {"w1"}


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


# ------------------------------------------------------------------ nothing left behind

#: the core's histories that keep the latest of what they saw, each to its bound
#: (docs/deployment.md, "A manager shared for days"): the rest must not grow
_BOUNDED = {
    "story_log": "story_length",
    "recent_tries": "RECENT_TRIES",
    "lives[default]": "MAX_LIVES",
    "storage._departed": "DEPARTED_KEPT",
    "turns": "MAX_CLIENT_TURNS",
}


def _sizes(obj: object, prefix: str = "", depth: int = 0) -> dict[str, int]:
    """The length of every dict, list, set and deque in ``obj``'s attributes, and in
    those of the Corral objects among them (three levels down), by path."""
    out: dict[str, int] = {}
    names = getattr(obj, "__dict__", None) or {
        n: getattr(obj, n) for n in getattr(type(obj), "__slots__", ()) if hasattr(obj, n)
    }
    for name, value in names.items():
        if isinstance(value, (dict, list, set, collections.deque)):
            out[prefix + name] = len(value)
            if isinstance(value, dict):  # per pool, per kind: a few
                for k, v in value.items():
                    if isinstance(v, (dict, list, set, collections.deque)):
                        out[f"{prefix}{name}[{k}]"] = len(v)
        elif depth < 3 and type(value).__module__.split(".")[0] in ("actors", "policies"):
            out.update(_sizes(value, f"{prefix}{name}.", depth + 1))
    return out


def test_rounds_of_work_released_leave_the_core_as_they_found_it(make_state: Factory) -> None:
    """A manager runs for days. Each round here is a new client's run on a worker that
    replaces the last one: tasks that finish, fail, fail once and are retried, fail
    their dependent, and one cancelled while it runs, all released at the end. After
    every round each container of the core has the size it had after the first, exactly,
    but the bounded histories, which hold at most their bound (the story log at it)."""
    s = make_state(story_length=10)
    loop = Loop(s)
    loop.run(event(WorkerJoined, worker="w0", cores=4, memory=GB))
    first: dict[str, int] = {}
    for r in range(1, 25):
        loop.run(event(WorkerJoined, worker=f"w{r}", cores=4, memory=GB))
        table: dict[Key, list[Key]] = {f"inc-{r}-{i}": [] for i in range(8)}
        table |= {f"parse-{r}-{i}": [] for i in range(3)}
        table |= {f"sum-{r}": [f"inc-{r}-0", f"inc-{r}-1"], f"dep-{r}": [f"parse-{r}-1"]}
        table[f"slow-{r}"] = []
        specs = specs_for(s, table, list(table), attrs={f"parse-{r}-2": {"retries": 1}})
        loop.run(
            event(
                GraphSubmitted, specs=specs, wanted=tuple(table), run=f"run-{r}",
                echo_to=f"client-{r}",
            )
        )  # fmt: skip
        failing = {f"parse-{r}-1", f"parse-{r}-2"}  # the second fails once only
        while running := [
            (w, ts.key)
            for w, ws in s.workers.items()
            for ts in ws.processing
            if ts.key != f"slow-{r}"
        ]:
            for w, key in running:
                if key in failing:
                    if key == f"parse-{r}-2":
                        failing.discard(key)  # it fails once, its retry finishes
                    err = ValueError(f"bad row {key}")
                    loop.run(
                        event(TasksFinished, worker=w, results=(result(key, "error", error=err),))
                    )
                else:
                    loop.finish(w, key)
        assert s.tasks[f"dep-{r}"].state == "erred" and s.tasks[f"parse-{r}-2"].state == "memory"
        slow = s.tasks[f"slow-{r}"]
        assert slow.state == "processing" and slow.worker is not None
        loop.run(event(CancelRequested, keys=(slow.key,), reason="by test", spare=frozenset()))
        loop.run(event(TasksFinished, worker=slow.worker, results=(result(slow.key, "cancelled"),)))
        loop.run(event(KeysReleased, keys=tuple(table)))
        loop.run(event(WorkerLeft, worker=f"w{r - 1}", cause="preempted"))
        assert s.tasks == {}
        sizes = _sizes(s)
        bounded = {name: sizes.pop(name) for name in _BOUNDED}
        if r == 1:
            first = sizes
        assert sizes == first, f"round {r}"
        assert bounded["story_log"] == 10
        # 14 tries a round (dep- never runs; parse-2 twice): full by the 22nd
        assert bounded["recent_tries"] == min(r * 14, RECENT_TRIES)
        # one life, one departed worker and one client's turn more a round, to their bounds
        assert bounded["lives[default]"] == min(r, MAX_LIVES)
        assert bounded["storage._departed"] == min(r, DEPARTED_KEPT)
        assert bounded["turns"] == min(r, MAX_CLIENT_TURNS)
