"""The scheduler core's counts of a submission made for dask's callbacks
(``GraphSubmitted.progress``; ``ProgressAsked`` answered by a ``ProgressAnswer``:
runtime/progress.py): fed events, the answers are exact: how many tasks wait, are ready,
run and ended, and the keys that ended since the previous answer, each once."""

from __future__ import annotations

from typing import Any

import pytest

from actors.scheduler_events import (
    Execute,
    GraphSubmitted,
    ProgressAnswer,
    ProgressAsked,
    TasksFinished,
)
from actors.scheduler_state import MAX_PROGRESS_RUNS
from tests.helpers import Factory, event, finish, join, make_state, result, run, specs_for

pytestmark = pytest.mark.timeout(30)
__all__ = ["make_state"]  # the autouse fixture, used by name


def _submit(state, table, wanted, run_id, progress=True):  # type: ignore[no-untyped-def]
    specs = specs_for(state, table, wanted)
    ev = event(GraphSubmitted, specs=specs, wanted=tuple(wanted), run=run_id, progress=progress)
    return run(state, ev)


def _asked(state, run_id, stop=False) -> Any:  # type: ignore[no-untyped-def]
    """The core's answer to a ``ProgressAsked``: its one command, a ProgressAnswer."""
    ev = event(ProgressAsked, run=run_id, stop=stop)
    (answer,) = run(state, ev)
    assert answer == ProgressAnswer(ev.stimulus_id, run_id, answer.counts)
    return answer.counts


def test_counts_follow_the_tasks_and_each_ended_key_is_said_once(make_state: Factory) -> None:
    state = make_state()
    join(state, "w1", cores=1)
    cmds = _submit(state, {"a": [], "b": [], "c": ["a", "b"]}, ["c"], "run-1")
    sent = [t for c in cmds if isinstance(c, Execute) for t in c.tasks]
    assert _asked(state, "run-1") == {
        "total": 3, "finished": 0, "erred": 0, "waiting": 1, "ready": 3 - 1 - len(sent),
        "running": len(sent), "complete": True, "ended": [],
    }  # fmt: skip
    first = sent[0].key
    other = "b" if first == "a" else "a"
    finish(state, "w1", first)
    got = _asked(state, "run-1")
    assert (got["finished"], got["ended"]) == (1, [(first, "w1", "memory")])
    assert (got["waiting"], got["ready"], got["running"]) == (1, 0, 1)  # the other sent
    assert _asked(state, "run-1")["ended"] == []  # said once
    finish(state, "w1", other)
    finish(state, "w1", "c")
    got = _asked(state, "run-1", stop=True)
    assert got is not None
    assert (got["finished"], got["waiting"], got["ready"], got["running"]) == (3, 0, 0, 0)
    assert [k for k, _, _ in got["ended"]] == [other, "c"]
    assert _asked(state, "run-1") is None  # let go
    assert not state._tracked


def test_a_failure_counts_as_ended_and_erred(make_state: Factory) -> None:
    state = make_state()
    join(state, "w1", cores=1)
    _submit(state, {"a": [], "c": ["a"]}, ["c"], "run-1")
    run(
        state,
        event(TasksFinished, worker="w1", results=(result("a", "error", error=ValueError("x")),)),
    )
    got = _asked(state, "run-1")
    assert got is not None
    assert (got["finished"], got["erred"]) == (2, 2)  # a, and c for its input
    assert sorted((k, s) for k, _, s in got["ended"]) == [("a", "erred"), ("c", "erred")]


def test_tasks_known_done_count_as_finished_at_once(make_state: Factory) -> None:
    state = make_state()
    join(state, "w1", cores=1)
    _submit(state, {"a": []}, ["a"], "run-1", progress=False)
    finish(state, "w1", "a")
    assert _asked(state, "run-1") is None  # not counted: not asked for
    _submit(state, {"a": [], "d": ["a"]}, ["d"], "run-2")
    got = _asked(state, "run-2")
    assert got is not None
    assert (got["total"], got["finished"], got["ended"]) == (2, 1, [("a", "w1", "memory")])


def test_runs_never_asked_again_are_let_go_past_the_bound(make_state: Factory) -> None:
    state = make_state()
    for i in range(MAX_PROGRESS_RUNS + 1):
        _submit(state, {f"k{i}": []}, [f"k{i}"], f"run-{i}")
    assert len(state.progress) == MAX_PROGRESS_RUNS
    assert _asked(state, "run-0") is None  # the oldest
    assert _asked(state, f"run-{MAX_PROGRESS_RUNS}") is not None


def test_runs_whose_tasks_all_ended_are_let_go_first(make_state: Factory) -> None:
    """Past the bound, the run let go is the oldest whose tasks all ended and were all
    handed over (only its client's last ask is missing), then the oldest whose tasks
    all ended, and only then the oldest: a compute still running keeps its counts while
    finished ones can go (its bar does not stop short)."""
    state = make_state()
    join(state, "w1", cores=1)
    _submit(state, {"a": []}, ["a"], "a-run", progress=False)
    finish(state, "w1", "a")
    _submit(state, {"z": []}, ["z"], "run-0")  # under way, the oldest
    _submit(state, {"a": []}, ["a"], "run-1")  # ended at once, not handed over yet
    _submit(state, {"a": []}, ["a"], "run-2")  # ended at once ...
    assert [k for k, _, _ in _asked(state, "run-2")["ended"]] == ["a"]  # ... handed over
    for i in range(3, MAX_PROGRESS_RUNS):  # under way (one core: they queue)
        _submit(state, {f"k{i}": []}, [f"k{i}"], f"run-{i}")
    assert len(state.progress) == MAX_PROGRESS_RUNS
    lets_go = {MAX_PROGRESS_RUNS: "run-2", MAX_PROGRESS_RUNS + 1: "run-1"}
    lets_go[MAX_PROGRESS_RUNS + 2] = "run-0"  # none ended: the oldest
    for i, gone in lets_go.items():
        _submit(state, {f"k{i}": []}, [f"k{i}"], f"run-{i}")
        assert len(state.progress) == MAX_PROGRESS_RUNS
        assert gone not in state.progress, (i, gone)
        assert _asked(state, gone) is None
    assert _asked(state, "run-3")["total"] == 1  # the runs under way are all counted
