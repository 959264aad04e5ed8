"""A cluster's stop and the monitoring database: what the scheduler's feed holds when the
stop begins reaches the database before the run is marked ended.

A helper saw an embedded ``Cluster(..., monitoring=...)`` whose task failed twice
(``retries=1``) end its run with the task ``processing`` in ``tasks`` and no row in
``tries`` for its second failed try (3 runs in 25): the recorder's loop had read the
feed (the try, the task erred) in a full poll, which the stop cancelled while it asked
the manager for its metrics, and the rows it had made went with it; the last poll then
found the feed read. A recorder here is fed by a scheduler core's own feed, with
stand-ins for the manager and the autoscaler (tests/test_monitordb.py), every wait
gated on what the recorder does, none on time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from actors.scheduler_events import GraphSubmitted, WorkerJoined
from runtime import monitordb
from runtime.kernel import ActorSystem
from runtime.messages import MetricsRequest, MonitorFeed
from tests.helpers import GB, Factory, make_state, specs_for
from tests.test_monitordb import T0, _at, _done, _recorder, _Ref, _rows

__all__ = ["make_state"]

pytestmark = pytest.mark.anyio
LIMIT = 30


async def test_a_stop_that_cuts_the_loops_poll_writes_what_it_read(
    tmp_path: Path, make_state: Factory
) -> None:
    """The try failed the second time and the task erred are in the feed; the recorder's
    loop reads them in a full poll and waits for the manager's metrics when the stop
    comes: the task ends ``erred`` with both tries, and the run is marked ended."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    armed, held = False, anyio.Event()

    async def hold() -> None:
        held.set()
        await anyio.sleep_forever()

    def manager(msg: Any) -> Any:  # the loop's first poll waits here, the last does not
        return hold() if armed and isinstance(msg, MetricsRequest) and not held.is_set() else None

    recorder, writer = _recorder(db, s, manager=manager, run_row=False)
    _at(s, WorkerJoined, T0, worker="w1", cores=1, memory=GB)
    specs = specs_for(s, {"a": []}, ["a"], attrs={"a": {"retries": 1}})
    _at(s, GraphSubmitted, T0 + 1, specs=specs, wanted=("a",))
    _done(s, "w1", "a", T0 + 2, "error", error=ValueError("first"))
    with anyio.fail_after(LIMIT):
        await recorder.poll()  # the first try, the task sent again: written
        _done(s, "w1", "a", T0 + 3, "error", error=ValueError("second"))
        assert s.tasks["a"].state == "erred"
        armed = True
        async with ActorSystem() as system:
            ref = await system.spawn(recorder, "monitoring")
            await held.wait()  # its loop read the feed, and waits for the metrics
            await system.shutdown([ref])
    assert writer.wait(0)  # (closed by the recorder's stop)
    assert _rows(db, "SELECT state, tries, error FROM tasks WHERE key = 'a'") == [
        ("erred", 2, "ValueError: second")
    ]
    assert _rows(db, "SELECT try, error_message FROM tries WHERE key = 'a' ORDER BY try") == [
        (1, "first"),
        (2, "second"),
    ]
    assert _rows(db, "SELECT ended IS NOT NULL, dropped_rows FROM runs") == [(1, 0)]


async def test_the_last_poll_reads_the_whole_feed(tmp_path: Path, make_state: Factory) -> None:
    """More of the feed is unread when the stop begins than a poll's 10 pages: the last
    poll reads it all, so every task's end is in the database."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    recorder.page = 2
    _at(s, WorkerJoined, T0, worker="w1", cores=1, memory=GB)
    keys = [f"t-{i}" for i in range(30)]
    _at(s, GraphSubmitted, T0 + 1, specs=specs_for(s, {k: [] for k in keys}, keys),
        wanted=tuple(keys))  # fmt: skip
    for i, k in enumerate(keys):  # one at a time: an entry each
        _done(s, "w1", k, T0 + 2 + i)
    with anyio.fail_after(LIMIT):
        await recorder.on_stop()
    assert writer.wait(0)  # (closed by the recorder's stop)
    assert _rows(db, "SELECT state, count(*) FROM tasks GROUP BY state") == [("memory", 30)]
    assert _rows(db, "SELECT count(*) FROM tries WHERE outcome = 'ok'") == [(30,)]
    assert _rows(db, "SELECT ended IS NOT NULL, feed_lost FROM runs") == [(1, 0)]
    assert recorder.seq == s.feed_since(recorder.seq, 1)[1]  # nothing left to read


async def test_a_last_poll_past_its_bound_is_logged_and_what_it_read_written(
    tmp_path: Path,
    make_state: Factory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The scheduler answers the last poll's first page and not its second: past
    LAST_POLL_TIMEOUT the poll is cut, a warning says so, the first page's rows are
    written (the task's try and its end) and the run is marked ended."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    recorder.page = 3
    _at(s, WorkerJoined, T0, worker="w1", cores=1, memory=GB)
    _at(s, GraphSubmitted, T0 + 1, specs=specs_for(s, {"a": []}, ["a"]), wanted=("a",))
    _done(s, "w1", "a", T0 + 2, "error", error=ValueError("bad"))
    _at(s, GraphSubmitted, T0 + 3, specs=specs_for(s, {"b": []}, ["b"]), wanted=("b",))
    feed = recorder._scheduler()
    asked = 0

    def scheduler(msg: Any) -> Any:
        nonlocal asked
        asked += 1
        assert isinstance(msg, MonitorFeed)
        return feed.ask(msg) if asked == 1 else anyio.sleep_forever()

    recorder._scheduler = lambda: cast(Any, _Ref(scheduler))
    monkeypatch.setattr(monitordb, "LAST_POLL_TIMEOUT", 0.2)
    with anyio.fail_after(LIMIT), caplog.at_level(logging.WARNING, logger="corral"):
        await recorder.on_stop()
    assert asked == 2 and writer.wait(0)
    assert "the run's last poll was cut" in caplog.text
    assert _rows(db, "SELECT key, state FROM tasks") == [("a", "erred")]
    assert _rows(db, "SELECT key, error_message FROM tries") == [("a", "bad")]
    assert _rows(db, "SELECT ended IS NOT NULL FROM runs") == [(1,)]
