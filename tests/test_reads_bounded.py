"""Cheap reads that stay cheap (issue 9): story and task listings are capped and paged,
a story query finds keys by hash instead of printing the whole log, and status reads
counters the core keeps instead of scanning every task. The scheduler actor's query
handlers are called directly on a core fed with events."""

from __future__ import annotations

from typing import Any

import pytest

from actors.protocol import TaskResult
from actors.scheduler import Scheduler
from actors.scheduler_events import GraphSubmitted, TasksFinished, WorkerJoined
from runtime.graph import Task, build_specs
from runtime.messages import MAX_LISTING, MAX_STORY_KEYS, StatusRequest, StoryQuery, TasksQuery


def _fn(*args: Any) -> None:
    return None


def scheduler_with(n: int) -> Scheduler:
    """A scheduler whose core ran ``n`` tuple-keyed tasks and ``n`` string-keyed ones."""
    s = Scheduler(lambda: None, lambda: None)  # type: ignore[arg-type, return-value]
    graph: dict[Any, Any] = {("x", i): Task(("x", i), _fn) for i in range(n)}
    graph.update({f"s-{i}": Task(f"s-{i}", _fn) for i in range(n)})
    specs = build_specs(graph, list(graph))
    core = s.state
    core.handle(WorkerJoined("j", 0.0, "w1", 1, 2**30, "default"))
    core.handle(GraphSubmitted("g", 1.0, specs, tuple(graph)))
    while core.count("processing"):
        done = [TaskResult(ts.key, "ok", 0.0, 1.0, 8) for ts in core.workers["w1"].processing]
        core.handle(TasksFinished("f", 2.0, "w1", tuple(done)))
    return s


def test_a_story_query_finds_tuple_keys_string_keys_and_workers_by_their_text() -> None:
    s = scheduler_with(50)
    rows = s.story_query(StoryQuery(("('x', 3)", "s-7", "w1")))
    keys = {r[0] for r in rows}
    assert keys == {"('x', 3)", "s-7", "w1"}
    assert [r[1:3] for r in rows if r[0] == "('x', 3)"][-1] == ["processing", "memory"]
    assert (
        s.story_query(StoryQuery(("('x', 3)",), limit=1))
        == [r for r in rows if r[0] == "('x', 3)"][-1:]
    )
    assert s.story_query(StoryQuery(("nothing", "((((", "'unclosed"))) == []


def test_story_queries_are_capped() -> None:
    s = scheduler_with(5)
    with pytest.raises(ValueError, match=f"at most {MAX_STORY_KEYS} keys"):
        s.story_query(StoryQuery(tuple(str(i) for i in range(MAX_STORY_KEYS + 1))))
    for bad in (0, MAX_LISTING + 1):
        with pytest.raises(ValueError, match=f"limit must be 1 to {MAX_LISTING}"):
            s.story_query(StoryQuery(("s-1",), limit=bad))


class Unprintable:
    """A key part that may be hashed and compared but never printed."""

    def __repr__(self) -> str:
        raise AssertionError("a story query printed an entry it did not ask for")


def test_a_story_query_does_not_print_the_whole_log() -> None:
    """Entries are matched by hash: printing every entry of a 100,000-entry log cost
    50-100 ms a query, and a few hundred queries stalled the scheduler."""
    s = scheduler_with(100)
    s.state.story_log.extend([(("bomb", Unprintable()), "queued", "processing", "x", 1.0)] * 1000)
    rows = s.story_query(StoryQuery(("('x', 3)", "s-7")))
    assert {r[0] for r in rows} == {"('x', 3)", "s-7"}


def test_task_listings_are_pages() -> None:
    s = scheduler_with(30)
    first = s.tasks_query(TasksQuery("memory", None, 25))
    rest = s.tasks_query(TasksQuery("memory", None, 25, offset=25))
    assert len(first) == 25 and len(rest) == 25
    assert not {r.key for r in first} & {r.key for r in rest}
    assert len(s.tasks_query(TasksQuery("memory", None, 0, offset=50))) == 10  # 0: a page
    with pytest.raises(ValueError, match=f"limit must be 0 to {MAX_LISTING}"):
        s.tasks_query(TasksQuery(limit=MAX_LISTING + 1))
    with pytest.raises(ValueError, match="offset must be >= 0"):
        s.tasks_query(TasksQuery(offset=-1))


def test_status_reads_counters_kept_by_the_core() -> None:
    s = scheduler_with(40)
    status = s.status(StatusRequest())
    assert status["tasks_by_state"] == {"memory": 80}
    assert status["queued"] == 0 and status["queues"] == {}
    s.state.validate()  # the counters agree with the tasks
