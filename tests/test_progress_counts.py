"""The scheduler core's counts of a submission made for dask's callbacks
(``GraphSubmitted.progress``, ``SchedulerState.progress_of``: runtime/progress.py): fed
events, the answers are exact: how many tasks wait, are ready, run and ended, and the
keys that ended since the previous answer, each once."""

from __future__ import annotations

import pytest

from actors.scheduler_events import Execute, GraphSubmitted, TasksFinished
from actors.scheduler_state import MAX_PROGRESS_RUNS
from tests.helpers import Factory, event, finish, join, make_state, result, run, specs_for

pytestmark = pytest.mark.timeout(30)
__all__ = ["make_state"]  # the autouse fixture, used by name


def _submit(state, table, wanted, run_id, progress=True):  # type: ignore[no-untyped-def]
    specs = specs_for(state, table, wanted)
    ev = event(GraphSubmitted, specs=specs, wanted=tuple(wanted), run=run_id, progress=progress)
    return run(state, ev)


def test_counts_follow_the_tasks_and_each_ended_key_is_said_once(make_state: Factory) -> None:
    state = make_state()
    join(state, "w1", cores=1)
    cmds = _submit(state, {"a": [], "b": [], "c": ["a", "b"]}, ["c"], "run-1")
    sent = [t for c in cmds if isinstance(c, Execute) for t in c.tasks]
    assert state.progress_of("run-1") == {
        "total": 3, "finished": 0, "erred": 0, "waiting": 1, "ready": 3 - 1 - len(sent),
        "running": len(sent), "complete": True, "ended": [],
    }  # fmt: skip
    first = sent[0].key
    other = "b" if first == "a" else "a"
    finish(state, "w1", first)
    got = state.progress_of("run-1")
    assert (got["finished"], got["ended"]) == (1, [(first, "w1", "memory")])
    assert (got["waiting"], got["ready"], got["running"]) == (1, 0, 1)  # the other sent
    assert state.progress_of("run-1")["ended"] == []  # said once
    finish(state, "w1", other)
    finish(state, "w1", "c")
    got = state.progress_of("run-1", stop=True)
    assert got is not None
    assert (got["finished"], got["waiting"], got["ready"], got["running"]) == (3, 0, 0, 0)
    assert [k for k, _, _ in got["ended"]] == [other, "c"]
    assert state.progress_of("run-1") is None  # let go
    assert not state._tracked


def test_a_failure_counts_as_ended_and_erred(make_state: Factory) -> None:
    state = make_state()
    join(state, "w1", cores=1)
    _submit(state, {"a": [], "c": ["a"]}, ["c"], "run-1")
    run(
        state,
        event(TasksFinished, worker="w1", results=(result("a", "error", error=ValueError("x")),)),
    )
    got = state.progress_of("run-1")
    assert got is not None
    assert (got["finished"], got["erred"]) == (2, 2)  # a, and c for its input
    assert sorted((k, s) for k, _, s in got["ended"]) == [("a", "erred"), ("c", "erred")]


def test_tasks_known_done_count_as_finished_at_once(make_state: Factory) -> None:
    state = make_state()
    join(state, "w1", cores=1)
    _submit(state, {"a": []}, ["a"], "run-1", progress=False)
    finish(state, "w1", "a")
    assert state.progress_of("run-1") is None  # not counted: not asked for
    _submit(state, {"a": [], "d": ["a"]}, ["d"], "run-2")
    got = state.progress_of("run-2")
    assert got is not None
    assert (got["total"], got["finished"], got["ended"]) == (2, 1, [("a", "w1", "memory")])


def test_runs_never_asked_again_are_let_go_past_the_bound(make_state: Factory) -> None:
    state = make_state()
    for i in range(MAX_PROGRESS_RUNS + 1):
        _submit(state, {f"k{i}": []}, [f"k{i}"], f"run-{i}")
    assert len(state.progress) == MAX_PROGRESS_RUNS
    assert state.progress_of("run-0") is None  # the oldest
    assert state.progress_of(f"run-{MAX_PROGRESS_RUNS}") is not None
