"""A task moved to another pool or priority (``Cluster.move``, the console's ``move``)
is written to the monitoring database at the move: a row of ``moves`` (its key, when,
from and to which pool and priority) and its ``tasks`` row's pool at once, not at its
next state change; the report's summary counts them (docs/monitoring.md, Monitoring
database, The report)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from actors.scheduler_events import GraphSubmitted, TasksMoved, WorkerJoined
from runtime.monitordb import SCHEMA_VERSION, MonitorWriter
from runtime.report import _lost_cost
from tests.helpers import GB, Factory, make_state, specs_for
from tests.test_monitordb import LIMIT, WALL, _at, _older, _recorder, _rows
from tests.test_report_sql import _run

__all__ = ["make_state"]


@pytest.mark.anyio
async def test_a_queued_task_moved_is_written_with_its_pools_priorities_and_time(
    tmp_path: Path, make_state: Factory
) -> None:
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, saturation=1.0)
    recorder, writer = _recorder(db, s)
    _at(s, WorkerJoined, 1.0, worker="g1", cores=1, memory=GB, pool="gpu")
    _at(s, WorkerJoined, 1.1, worker="c1", cores=1, memory=GB, pool="cpu")
    pools = {"train": "gpu", "hold": "cpu", "e1": "gpu", "e2": "gpu"}
    table: dict[str, list[str]] = {k: [] for k in pools}
    specs = specs_for(s, table, list(pools), attrs={k: {"pool": p} for k, p in pools.items()})
    _at(s, GraphSubmitted, 2.0, specs=specs, wanted=tuple(pools))
    assert {k: s.tasks[k].state for k in pools} == {
        "train": "processing", "hold": "processing", "e1": "queued", "e2": "queued",
    }  # fmt: skip
    with anyio.fail_after(LIMIT):
        await recorder.poll()  # e1's row: queued in gpu
        _at(s, TasksMoved, 5.0, keys=("e1",), pool="cpu", priority=2)  # c1 is busy: queued
        _at(s, TasksMoved, 6.0, keys=("e2",), priority=-3)
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT key, time, from_pool, to_pool, from_priority, to_priority "
                     "FROM moves ORDER BY time") == [
        ("e1", WALL + 5.0, "gpu", "cpu", 0.0, 2.0),
        ("e2", WALL + 6.0, "gpu", "gpu", 0.0, -3.0),
    ]  # fmt: skip
    assert _rows(db, "SELECT key, pool, state FROM tasks WHERE key LIKE 'e%' ORDER BY key") == [
        ("e1", "cpu", "queued"),  # its pool now, though it has not run
        ("e2", "gpu", "queued"),
    ]
    run = _run(db)  # the report's summary counts them, by the pools left and gone to
    assert run.hand_moves == [("gpu", "cpu", 1, 1), ("gpu", "gpu", 1, 1)]
    html = _lost_cost(run)
    assert "tasks moved by hand (Cluster.move, the console&#x27;s move): from" in html
    assert "<td>gpu</td><td>cpu</td><td>1</td><td>1</td>" in html


def test_a_version_9_file_gets_the_moves_table_and_is_still_read(tmp_path: Path) -> None:
    """A file of schema version 9 (no ``moves``): the report reads it as it is; a
    manager writing into it makes the table, and the file is of this version."""
    db = tmp_path / "monitoring.db"
    _older(
        db,
        "DROP TABLE moves; UPDATE schema_version SET version = 9; "
        "INSERT INTO runs (run_id, started) VALUES ('r', 100.0); "
        "INSERT INTO tasks (run_id, key, pool, state) VALUES ('r', 'a', 'gpu', 'queued');",
    )
    said = "this file does not record tasks moved by hand (schema version 9 or older)"
    assert said in _lost_cost(_run(db, "r"))
    MonitorWriter(db).close()
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(db, "SELECT count(*) FROM moves") == [(0,)]
    assert _rows(db, "SELECT key, pool FROM tasks") == [("a", "gpu")]
