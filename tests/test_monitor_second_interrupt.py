"""A second Ctrl-C while a stopping manager's monitoring database catches up: the
writer drops what is queued (counted in ``runs.dropped_rows``), writes the run's end and
the process exits 130; a third Ctrl-C, or a give-up that takes too long, exits at once
(runtime/node.py ``_until_signalled``, runtime/monitordb.py ``MonitorWriter.give_up``);
the same for the demo's embedded cluster (``give_up_all``).
Real processes, real signals; a real SQLite lock held by the test keeps the backlog."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Cli

LIMIT = 60


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as c:
        yield c


def _wait_for(db: Path, sql: str, what: str, limit: float = 30) -> sqlite3.Connection:
    """A connection to ``db`` once ``sql`` returns a non-zero count (bounded)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
            if conn.execute(sql).fetchone()[0]:
                return conn
            conn.close()
        except sqlite3.Error:
            pass  # not created yet
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {db} within {limit} s")
        time.sleep(0.05)


def _interrupted_twice(cli: Cli, proc: subprocess.Popen[str], locker: sqlite3.Connection) -> int:
    """With the database's write lock held by ``locker``: Ctrl-C, then, once the writer
    says how many rows are left, Ctrl-C again; those rows, dropped (nothing was written
    meanwhile: the lock holds). The lock then goes, so that the run's end (tried for
    5 s) gets in. Returns how many rows were left."""
    try:
        # A busy writer takes the lock back between its pieces: wait longer than the
        # default 5 s for a turn (SQLite's busy handler does not queue the waiters).
        locker.execute(f"PRAGMA busy_timeout = {LIMIT * 1000}")
        locker.execute("BEGIN IMMEDIATE")
        proc.send_signal(signal.SIGINT)
        line = cli.line_with(proc, "rows_left=", limit=LIMIT)
        left = int(re.search(r"rows_left=(\d+)", line).group(1))  # type: ignore[union-attr]
        assert left > 0
        proc.send_signal(signal.SIGINT)
        line = cli.line_with(proc, "dropped on an interrupt", limit=LIMIT)
        assert f"rows={left}" in line
        locker.execute("COMMIT")
        return left
    finally:
        if locker.in_transaction:
            locker.execute("ROLLBACK")
        locker.close()


def _run_end(db: Path) -> tuple[float | None, int, int]:
    """The run's ``ended`` and ``dropped_rows``, and how many workers never left."""
    conn = sqlite3.connect(db)
    try:
        ended, dropped = conn.execute("SELECT ended, dropped_rows FROM runs").fetchone()
        (open_workers,) = conn.execute("SELECT count(*) FROM workers WHERE left IS NULL").fetchone()
        return ended, dropped, open_workers
    finally:
        conn.close()


@pytest.mark.slow
def test_a_second_interrupt_drops_the_backlog_counted_and_writes_the_runs_end(
    cli: Cli, tmp_path: Path
) -> None:
    """The database is locked by another connection as the manager stops, so its
    writer's rows stay queued; Ctrl-C again once it says how many are left: they are
    dropped and counted, the run's end (and its worker's) is written once the lock
    goes, and the process exits 130. (Before: os._exit at once, runs.ended NULL.)"""
    db = tmp_path / "monitoring.db"
    manager = cli.start("manager", "--listen", "127.0.0.1:0", "--monitoring", str(db),
                        "--monitoring-interval", "0.3")  # fmt: skip
    address = cli.line_with(manager, "manager listening on").split(" on ", 1)[1].strip()
    cli.worker(address, "--cores", "1")
    # The run's row and its worker's are in: from now on, hold the write lock.
    locker = _wait_for(db, "SELECT count(*) FROM workers", "worker row")
    left = _interrupted_twice(cli, manager, locker)
    assert manager.wait(LIMIT) == 130
    ended, dropped, open_workers = _run_end(db)
    assert ended is not None and dropped == left and open_workers == 0


@pytest.mark.slow
def test_a_second_interrupt_to_the_demo_drops_the_backlog_counted_and_writes_the_runs_end(
    cli: Cli, tmp_path: Path
) -> None:
    """The same with an embedded cluster (``python -m runtime``): the first Ctrl-C stops
    the cluster, whose writer catches up in its thread; the second leaves the event loop
    (KeyboardInterrupt) and ``give_up_all`` drops the rest, counted, and writes the
    run's end. (Before: it printed "interrupted" and then waited without a word for
    the writer, up to its 60 s; a third Ctrl-C then lost the rows and the run's end.)"""
    db = tmp_path / "demo.db"
    demo = cli.start("demo", "--datasets", "4", "--chunks", "3000", "--events", "500",
                     "--monitoring", str(db), "--no-progress")  # fmt: skip
    locker = _wait_for(db, "SELECT count(*) FROM tries", "try row", limit=LIMIT)
    left = _interrupted_twice(cli, demo, locker)
    assert f"monitoring rows dropped: {left:,}" in cli.line_with(demo, "interrupted")
    assert demo.wait(LIMIT) == 130
    ended, dropped, _ = _run_end(db)
    assert ended is not None and dropped == left


#: ``_until_signalled`` with a ``give_up`` that never returns (or, with "none", one
#: with nothing to give up), its bound set by the first argument
_LOOP = """
import sys, anyio
from runtime import node
from runtime.log import configure

configure("INFO")
node.GIVE_UP_TIMEOUT = float(sys.argv[1])

async def on_signal():
    print("first signal", flush=True)

async def give_up():
    print("giving up", flush=True)
    if sys.argv[2] == "none":
        return None
    await anyio.sleep_forever()

async def main():
    async with anyio.create_task_group() as tg:
        await tg.start(node._until_signalled, on_signal, give_up)
        print("ready", flush=True)

anyio.run(main)
"""


@pytest.mark.parametrize(
    ("bound", "give_up", "third", "says"),
    [
        (600.0, "hangs", True, "another interrupt: exiting now"),
        (0.5, "hangs", False, "giving up took too long"),
        (600.0, "none", False, "exiting now, without a graceful stop"),
    ],
    ids=["third-interrupt", "bound", "nothing-to-give-up"],
)
def test_the_second_interrupt_never_hangs(
    cli: Cli, bound: float, give_up: str, third: bool, says: str
) -> None:
    """A give-up that does not end: a third Ctrl-C, or its bound, exits 130; with
    nothing to give up, the second Ctrl-C exits 130 at once."""
    proc = cli.spawn([sys.executable, "-c", _LOOP, str(bound), give_up])
    cli.line_with(proc, "ready")
    proc.send_signal(signal.SIGINT)
    cli.line_with(proc, "first signal")
    proc.send_signal(signal.SIGINT)
    cli.line_with(proc, "giving up")
    if third:
        proc.send_signal(signal.SIGINT)
    cli.line_with(proc, says, limit=LIMIT)
    assert proc.wait(LIMIT) == 130


def test_give_up_before_close_drops_the_queue_counted_and_writes_the_final_rows(
    tmp_path: Path,
) -> None:
    """A second Ctrl-C may come before the recorder closes its writer (during its last
    poll): give_up(final) alone drops what is queued, counted, and writes ``final``
    (made then: it sees the count), tried while the lock lasts (up to 5 s)."""
    from runtime.monitordb import MonitorWriter

    db = tmp_path / "monitoring.db"
    writer = MonitorWriter(db)
    locker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    try:
        locker.execute("BEGIN IMMEDIATE")
        gap = "INSERT INTO gaps VALUES (?,?,?,?)"
        writer.submit([("event", gap, [("r", 1.0, "a", i) for i in range(100)])])
        deadline = time.monotonic() + LIMIT
        while writer.errors == 0:  # the writer has met the lock
            assert time.monotonic() < deadline, "the writer never met the lock"
            time.sleep(0.01)

        def final() -> list[tuple[str, str, list[tuple[object, ...]]]]:
            return [("event", gap, [("end", 2.0, "b", sum(writer.dropped.values()))])]

        assert writer.give_up(final)
        while not writer.dropped:
            assert time.monotonic() < deadline, "the writer never gave up"
            time.sleep(0.01)
        locker.execute("COMMIT")
        assert writer.wait(LIMIT)
    finally:
        if locker.in_transaction:
            locker.execute("ROLLBACK")
        locker.close()
    assert writer.dropped == {"event": 100} and writer.written == 0 and writer.ended
    assert not writer.give_up()  # stopped: nothing left to give up
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT run_id, lost FROM gaps").fetchall() == [("end", 100)]
    finally:
        conn.close()
