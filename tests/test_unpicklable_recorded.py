"""A task whose output cannot be pickled is recorded as a failure (user audit failures,
finding 7): in thread execution (the default) the task ends ok and its output stays on
its worker, which finds it cannot pickle it only when a client gathers it through the
manager (or a task on another worker needs it). The client got a clear
``ResultNotPicklable``, but the dashboard, the monitoring database and the report said
the task succeeded; only the worker's log said otherwise. Process execution pickles the
result at the end of the try, so there it is the try's error already
(tests/test_task_error_size.py).

Now the worker tells the scheduler (``OutputUnpicklable``), and the core counts a failed
try of the task (outcome ``error``, cause ``ResultNotPicklable``): its failure group,
its story, the metrics and the feed, whose recorder turns the task's ok try into that
failure and gives the task its cause and error. Pure core and recorder, then one real
run (a manager process and a worker process on 127.0.0.1).
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from actors import scheduler_state
from actors.scheduler import _failure_groups
from actors.scheduler_events import OutputUnreadable
from runtime import Cluster
from runtime.errors import ResultNotPicklable
from runtime.messages import MetricsReply, MetricsRequest, MonitorFeedReply
from runtime.monitordb import _UNREADABLE, MonitorRecorder, _Rows
from tests.helpers import (
    Factory,
    event,
    finish,
    free_port_between,
    join,
    make_state,
    run,
    submit,
    wait_until,
)
from tests.test_monitordb import _rows
from tests.test_report_sql import _run

__all__ = ["make_state"]  # the fixture, used by name

REASON = "TypeError: cannot pickle '_thread.lock' object"
TO = "a client (through the manager)"
LIMIT = 60  # seconds for the real run (processes to start on a busy machine)


def open_conn() -> threading.Lock:
    return threading.Lock()  # stands for a DB connection or a file handle


def test_an_output_its_worker_cannot_pickle_is_the_task_s_failure(make_state: Factory) -> None:
    s = make_state(monitor=True)
    submit(s, {"conn-0": []}, ["conn-0"])
    join(s, "w1")
    finish(s, "w1", "conn-0")
    told = OutputUnreadable
    assert run(s, event(told, worker="w1", key="conn-0", reason=REASON, to=TO)) == []
    assert s.tasks["conn-0"].state == "memory"  # its output stays, usable there
    (group,) = _failure_groups(s, 0.0)
    assert (group.category, group.cause, group.n, group.tasks, group.erred) == (
        "conn", "ResultNotPicklable", 1, 1, 0,
    )  # fmt: skip
    assert (group.key, group.worker, group.outcome) == ("conn-0", "w1", "error")
    said = str(ResultNotPicklable("conn-0", REASON, "w1", TO))
    assert group.error == f"ResultNotPicklable: {said}"
    assert s.failure_counts() == {("conn", "error", "ResultNotPicklable"): 1}
    assert [e[1:3] for e in s.story("conn-0")][-1] == (
        "unreadable", "ResultNotPicklable: its output on w1 does not pickle",
    )  # fmt: skip
    # A second gather of it is the same failure: not counted again.
    run(s, event(told, worker="w1", key="conn-0", reason=REASON, to=TO))
    run(s, event(told, worker="w1", key="gone-0", reason=REASON, to=TO))  # not known: nothing
    assert s.failure_counts() == {("conn", "error", "ResultNotPicklable"): 1}

    entries, _, _ = s.feed_since(0, 1000)
    (unreadable,) = [r for _, rs in entries for r in rs if r[0] == "unreadable"]
    assert unreadable[:4] == ("unreadable", "conn-0", "conn", "w1")
    assert unreadable[4].summary == f"ResultNotPicklable: {said}"
    writer: Any = SimpleNamespace(path="x", ender=None)
    recorder = MonitorRecorder(writer, lambda: None, lambda: None, lambda: None)  # type: ignore[arg-type,return-value]
    rows = _Rows()
    recorder._events(rows, MonitorFeedReply(events=tuple(entries)))
    task = recorder._tasks["conn-0"]
    # (no cause: tasks.cause says why a task erred with no try of its own)
    assert (task[6], task[12], task[13]) == ("memory", None, f"ResultNotPicklable: {said}")
    ((_, _, (update,)),) = [op for op in rows.ops if op[1] is _UNREADABLE]
    assert update[:3] == ("ResultNotPicklable", "ResultNotPicklable", said)
    assert update[4:] == (recorder.run_id, "conn-0", "w1")


def test_an_unreadable_output_counts_once_when_the_failure_groups_are_full(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the failure groups are full (``MAX_FAILURE_GROUPS``, here 1 for 1,000) the
    failure is filed under ``(other)``; five gathers of the one output still count one
    failed try (before: five, the de-duplication looked the group up by its cause,
    review 1207b F5). Made anew, the output's next failure counts again."""
    monkeypatch.setattr(scheduler_state, "MAX_FAILURE_GROUPS", 1)
    s = make_state(monitor=True)
    join(s, "w1")
    submit(s, {"boom-0": []}, ["boom-0"], retries=0)
    finish(s, "w1", "boom-0", "error", error=ValueError("x"))  # fills the one group
    submit(s, {"conn-0": []}, ["conn-0"])
    finish(s, "w1", "conn-0")
    for _ in range(5):
        run(s, event(OutputUnreadable, worker="w1", key="conn-0", reason=REASON, to=TO))
    assert s.failure_counts()[("conn", "error", "ResultNotPicklable")] == 1
    other = s.failure_groups[("(other)", "(other)")]
    assert (other.n, other.tasks) == (1, 1)


@pytest.mark.anyio
async def test_a_gathered_output_that_does_not_pickle_is_a_failure_in_the_database(
    tmp_path: Path,
) -> None:
    """The audit's run: thread execution, one worker process, a task returning a lock."""
    db = tmp_path / "monitoring.db"
    port = free_port_between(63000, 63499)
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, port=port, monitoring=db, monitoring_interval=0.2) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            with pytest.raises(ResultNotPicklable) as info:
                await c.submit(open_conn, key="conn-0")
            assert info.value.key == "conn-0"  # the client's error, as before
            await wait_until(
                lambda: _rows(db, "SELECT 1 FROM tries WHERE outcome = 'error'"),
                "the try's failure in the database",
                limit=30,
            )
            metrics: MetricsReply = await c._manager.ask(MetricsRequest(details=True))
    groups = [(g.category, g.cause, g.outcome, g.key, g.n) for g in metrics.failure_groups]
    assert groups == [("conn", "ResultNotPicklable", "error", "conn-0", 1)]
    assert [(f.category, f.outcome, f.cause) for f in metrics.failures] == [
        ("conn", "error", "ResultNotPicklable")
    ]
    (row,) = _rows(db, "SELECT outcome, cause, error_type, error_message, worker FROM tries")
    assert row[:3] == ("error", "ResultNotPicklable", "ResultNotPicklable")
    row_worker = row[4]
    assert "'conn-0' cannot be pickled" in row[3] and "_thread.lock" in row[3]
    ((state, cause, error),) = _rows(db, "SELECT state, cause, error FROM tasks")
    assert state in ("memory", "released") and cause is None
    assert error.startswith("ResultNotPicklable: the output of task 'conn-0' cannot be pickled")
    # The report's "Why tasks failed": the try's group, once (not a task not run too).
    (group,) = _run(db).why_failed
    assert group[:6] == ("conn", "ResultNotPicklable", "error", 1, "conn-0", row_worker)
