"""The monitoring database (runtime/monitordb.py): written by real clusters (embedded,
and a manager process with worker processes), read by other connections while the run
goes, intact after a manager's kill -9; its writer never blocks; bad files get a clear
error."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from actors.scheduler_events import (
    CancelRequested,
    Event,
    FilesReleased,
    GraphSubmitted,
    KeysReleased,
    TasksFinished,
    TasksRunning,
    Tick,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import MonitoringDBError
from runtime.messages import (
    AlertInfo,
    AlertsReply,
    AlertsRequest,
    AutoscalerStatus,
    BlockEndInfo,
    CategoryMetrics,
    MetricsReply,
    MetricsRequest,
    MonitorFeed,
    MonitorFeedReply,
    PoolMetrics,
)
from runtime.monitordb import (
    METRIC_HEARTBEAT,
    SCHEMA_VERSION,
    UPGRADED_VERSIONS,
    MonitorRecorder,
    MonitorWriter,
    default_path,
    open_db,
    prune,
)
from runtime.report import _alert_spans, _lives, _Run, build_report
from tests.helpers import (
    GB,
    Cli,
    Factory,
    chain,
    finish,
    free_port_between,
    join,
    make_state,
    only_running,
    result,
    specs_for,
    submit,
    wait_until,
)
from tests.test_report_sql import _run

__all__ = ["make_state"]

LIMIT = 90


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """``sql`` on a connection of its own (as another program reading the file)."""
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _count(db: Path, sql: str, *args: Any) -> int:
    try:
        return int(_rows(db, sql, *args)[0][0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def inc(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


# ----------------------------------------------------------------------------- embedded


def after_tries(x: int, db: str, n: int) -> int:
    """Return ``x + 1`` once ``db`` holds ``n`` tries (bounded: 30 s): the try of the
    task before it (its input) was written by a feed read while that input was still
    held, so each task but the last spans a feed read, on a machine loaded or not."""
    deadline = time.monotonic() + 30
    while _count(Path(db), "SELECT count(*) FROM tries") < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return x + 1


@pytest.mark.anyio
async def test_a_task_is_one_row_write_per_interval_however_many_feed_reads_it_spans(
    tmp_path: Path,
) -> None:
    # Triggers count every insert and update of a tasks row the recorder makes.
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE task_writes (key TEXT);"
        "CREATE TRIGGER task_ins AFTER INSERT ON tasks BEGIN "
        "INSERT INTO task_writes VALUES (new.key); END;"
        "CREATE TRIGGER task_upd AFTER UPDATE ON tasks BEGIN "
        "INSERT INTO task_writes VALUES (new.key); END;"
    )
    conn.close()
    dsk: dict[Hashable, Any] = {"nap-0": (after_tries, 0, str(db), 0)}
    dsk.update({f"nap-{i}": (after_tries, f"nap-{i - 1}", str(db), i) for i in range(1, 4)})
    with anyio.fail_after(LIMIT):
        # One full poll at the start, the next one after the run: the tasks' rows are
        # written once, when the cluster stops.
        async with Cluster(
            workers=1, monitoring=db, monitoring_interval=600, name="alice"
        ) as cluster:
            assert await cluster.compute(dsk, "nap-3") == 4
            # the tries are written at each feed read, while the run goes
            await wait_until(
                lambda: _count(db, "SELECT count(*) FROM tries") == 4, "4 tries", limit=30
            )
            assert _count(db, "SELECT count(*) FROM tasks") == 0
    assert sorted(r[0] for r in _rows(db, "SELECT key FROM task_writes")) == sorted(map(str, dsk))
    rows = _rows(db, "SELECT state, ready, started, finished, released, tries FROM tasks")
    assert len(rows) == 4
    # each output released once consumed (nap-3's once compute had it): the end state
    # and the release are in the one row write
    assert all(s == "released" and r <= st <= f <= rel and t == 1 for s, r, st, f, rel, t in rows)
    # who submitted them: the client's name
    assert _rows(db, "SELECT DISTINCT client FROM tasks") == [("alice",)]


@pytest.mark.anyio
async def test_an_embedded_cluster_writes_every_task_try_worker_block_and_sample(
    tmp_path: Path,
) -> None:
    db = tmp_path / "run" / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2, monitoring=db, monitoring_interval=0.2) as cluster:
            futures = cluster.map(inc, range(30))
            assert await cluster.gather(futures) == list(range(1, 31))
            bad = cluster.submit(boom, 7)
            with pytest.raises(ValueError, match="boom 7"):
                await bad
            # Readable by another connection while the cluster runs: every task shows up.
            await wait_until(
                lambda: _count(db, "SELECT count(*) FROM tasks WHERE finished IS NOT NULL") == 31,
                "31 finished tasks in the database",
                limit=30,
            )
            await wait_until(
                lambda: _count(db, "SELECT count(*) FROM metric_samples") > 0,
                "metric samples",
                limit=30,
            )
            keys = {str(f.key) for f in futures} | {str(bad.key)}
    (run_id, ended, dropped) = _rows(db, "SELECT run_id, ended, dropped_rows FROM runs")[0]
    assert ended is not None and dropped == 0
    tasks = {r[0]: r for r in _rows(db, "SELECT key, category, state, submitted, ready, "
                                    "started, finished, tries, worker FROM tasks")}  # fmt: skip
    assert set(tasks) == keys
    for key in keys:
        _, category, state, submitted, ready, started, finished, tries, worker = tasks[key]
        assert category == ("boom" if key.startswith("boom") else "inc")
        assert state == ("erred" if category == "boom" else "memory")
        assert submitted <= ready <= started <= finished and tries == 1
        assert worker in ("worker-1", "worker-2")
    tries = _rows(db, "SELECT key, try, outcome, error_type, error_message, started, ended, "
                  "output_bytes FROM tries")  # fmt: skip
    assert len(tries) == 31
    failed = [t for t in tries if t[2] != "ok"]
    assert failed == [(str(bad.key), 1, "error", "ValueError", "boom 7", *failed[0][5:7], None)]
    assert all(t[5] <= t[6] and t[7] > 0 for t in tries if t[2] == "ok")
    workers = _rows(db, "SELECT worker, pool, block, joined, left, cause FROM workers")
    assert sorted(w[0] for w in workers) == ["worker-1", "worker-2"]
    for _, pool, block, joined, left, cause in workers:  # ended with the cluster
        assert pool == "default" and block.startswith("block-") and joined < left
        assert cause == "shutdown"
    blocks = _rows(db, "SELECT block, state, cause FROM blocks ORDER BY time, block")
    history = {b: [s for bb, s, _ in blocks if bb == b] for b, _, _ in blocks}
    assert len(history) == 2 and all(h == ["running", "stopped"] for h in history.values())
    depth = _rows(db, "SELECT labels FROM metric_samples WHERE name = 'corral_queue_depth'")
    assert depth and all("pool" in json.loads(labels) for (labels,) in depth)
    assert _count(db, "SELECT count(*) FROM resource_samples WHERE rss > 0") > 0
    assert _count(db, "SELECT count(*) FROM gaps") == 0
    assert open_db(db).execute("SELECT count(*) FROM tasks").fetchone()[0] == 31
    assert run_id


@pytest.mark.anyio
async def test_a_locked_database_stalls_nothing_and_gets_the_rows_once_free(
    tmp_path: Path,
) -> None:
    """Another program holds the database locked while a graph runs: the graph runs on
    (the writer thread waits, not the scheduler), and once it lets go the rows land."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2, monitoring=db, monitoring_interval=0.1) as cluster:
            await wait_until(lambda: _count(db, "SELECT count(*) FROM runs") == 1, "the run row",
                             limit=30)  # fmt: skip
            locker = sqlite3.connect(db, isolation_level=None)
            locker.execute("BEGIN EXCLUSIVE")
            try:
                t0 = time.monotonic()
                futures = cluster.map(inc, range(200))
                assert len(await cluster.gather(futures)) == 200
                took = time.monotonic() - t0
                # the writer has met the lock at least once (the rows wait behind it)
                recorder = cluster._plane.recorder
                assert recorder is not None and recorder.writer is not None
                writer = recorder.writer
                await wait_until(lambda: writer.errors > 0, "the writer to meet the lock",
                                 limit=30)  # fmt: skip
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            assert took < 30
            await wait_until(
                lambda: _count(db, "SELECT count(*) FROM tries WHERE outcome = 'ok'") == 200,
                "the 200 tries once the lock is gone",
                limit=30,
            )


def test_the_writer_never_blocks_and_drops_metric_samples_first(tmp_path: Path) -> None:
    db = tmp_path / "monitoring.db"
    writer = MonitorWriter(db, max_rows=1_000)
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    slowest = 0.0
    metric = "INSERT INTO metric_samples VALUES (?,?,?,?,?)"
    gap = "INSERT INTO gaps VALUES (?,?,?,?)"
    try:
        for i in range(50):
            t = time.monotonic()
            writer.submit([
                ("metric", metric, [("r", float(i), "m", "{}", 1.0)] * 100),
                ("event", gap, [("r", float(i), "test", i)]),
            ])  # fmt: skip
            slowest = max(slowest, time.monotonic() - t)
        assert slowest < 0.5  # queued: never waiting out the 1 s busy timeout of the lock
        # at most max_rows wait, besides the batch the thread holds (stuck on the lock)
        assert writer.dropped["metric"] >= 5000 - 1_000 - 101 and writer.dropped["event"] == 0
        assert writer.pending <= 1_000
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    writer.close()
    assert _count(db, "SELECT count(*) FROM gaps") == 50  # every event kept
    assert _count(db, "SELECT count(*) FROM metric_samples") == 5000 - writer.dropped["metric"]


def test_past_its_room_for_events_the_writer_drops_the_oldest(tmp_path: Path) -> None:
    db = tmp_path / "monitoring.db"
    writer = MonitorWriter(db, max_rows=10)
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        for i in range(30):
            writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", [("r", i, "t", i)])])
        assert writer.dropped["event"] == 20
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    writer.close()
    assert [r[0] for r in _rows(db, "SELECT lost FROM gaps ORDER BY lost")] == list(range(20, 30))


# ----------------------------------------------------------------------------- the feed


def test_the_feed_keeps_what_its_reader_has_not_read_and_counts_what_it_lost() -> None:
    state = SchedulerState(SchedulerConfig(feed_length=30))
    join(state, "w1")
    assert state.feed_since(0, 10) == ([], 0, 0)  # nothing kept before a reader asks
    table = chain("a", 20)
    submit(state, table, list(table))  # entry 0: one entry for the whole graph
    entries, nxt, lost = state.feed_since(0, 100)
    assert (len(entries), nxt, lost) == (1, 1, 0)
    assert [r[2] for r in entries[0][1]] == ["waiting"] * 19 + ["queued", "processing"]
    assert entries[0][1][-1] == ("state", "a-0", "processing", "a", None, "w1", "")
    for _ in range(2):  # 4 records an entry: try, memory, next queued, next processing
        finish(state, "w1", only_running(state))
    entries, nxt, lost = state.feed_since(nxt, 1)  # a page of one; entry 0 is let go
    assert (len(entries), nxt, lost) == (1, 2, 0) and state.feed_held == 8
    assert [r[0] for r in entries[0][1]] == ["try", "state", "state", "state"]
    assert entries[0][1][0][:5] == ("try", "a-0", "a", "w1", 1)
    for _ in range(8):  # past 30 unread records: the oldest entries go
        finish(state, "w1", only_running(state))
    assert state.feed_held <= 30
    entries, nxt, lost = state.feed_since(nxt, 100)
    assert lost == 2 and len(entries) == 7 and nxt == 11
    assert state.feed_since(nxt, 100) == ([], 11, 0) and state.feed_held == 0


@pytest.mark.anyio
async def test_a_feed_that_overflowed_between_two_reads_leaves_a_gap_row(tmp_path: Path) -> None:
    """A feed far too small for a graph's burst: the recorder says how much it missed
    (``gaps``, ``runs.feed_lost``) and records what came after."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2, monitoring=db, monitoring_interval=0.1) as cluster:
            cluster.scheduler_state.config.feed_length = 10  # records held unread
            assert len(await cluster.gather(cluster.map(inc, range(100)))) == 100
            await wait_until(
                lambda: _count(db, "SELECT count(*) FROM gaps") > 0, "a gap row", limit=30
            )
            after = cluster.submit(inc, 1000)
            assert await after == 1001
            await wait_until(
                lambda: _count(db, "SELECT count(*) FROM tries WHERE key = ?", str(after.key)),
                "the try after the gap",
                limit=30,
            )
    lost = _rows(db, "SELECT sum(lost) FROM gaps")[0][0]
    assert lost > 0 and _rows(db, "SELECT feed_lost FROM runs") == [(lost,)]


# ----------------------------------------------------------------------------- a manager process


def pid_then_wait(mark: str, gate: str) -> int:
    """Write this process's id to ``mark``, then wait (bounded) for ``gate``."""
    Path(mark + ".tmp").write_text(str(os.getpid()))
    os.replace(mark + ".tmp", mark)
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


async def kill_the_holder(
    cluster: Cluster,
    workers: list[subprocess.Popen[str]],
    tmp_path: Path,
    db: Path,
    while_away: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[subprocess.Popen[str], float]:
    """Run the task ``held`` (:func:`pid_then_wait`) on one of ``workers``, kill that
    worker with SIGKILL while it runs, let the task's retry on another finish, and wait
    until ``db`` has both tries; the worker killed and when (Unix seconds). The task is
    not retried before the manager's grace for the killed worker's rejoin is over:
    ``while_away`` (awaited with the killed process's pid right after the kill) sees
    the worker away."""
    mark, gate = tmp_path / "pid", tmp_path / "gate"
    held = cluster.submit(pid_then_wait, str(mark), str(gate), key="held")
    await wait_until(mark.exists, "the held task to start", limit=30)
    victim = next(w for w in workers if w.pid == int(mark.read_text()))
    mark.unlink()
    killed = time.time()
    victim.send_signal(signal.SIGKILL)  # it dies with the task in hand
    victim.wait(10)
    if while_away is not None:
        await while_away(victim.pid)
    await wait_until(mark.exists, "the held task to run again elsewhere", limit=40)
    gate.touch()
    assert await held != victim.pid
    # Read by this process while the manager runs.
    await wait_until(
        lambda: _count(db, "SELECT count(*) FROM tries WHERE key = 'held'") == 2,
        "both tries of the held task",
        limit=30,
    )
    return victim, killed


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as c:
        yield c


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_manager_process_records_a_lost_worker_and_survives_kill_9(
    cli: Cli, tmp_path: Path
) -> None:
    db = tmp_path / "runs" / "monitoring.db"
    manager = cli.start("manager", "--listen", "127.0.0.1:0", "--monitoring", str(db),
                        "--monitoring-interval", "0.3")  # fmt: skip
    assert str(db) in cli.line_with(manager, "monitoring database:")
    address = cli.line_with(manager, "manager listening on").split(" on ", 1)[1].strip()
    workers = [cli.worker(address, "--cores", "1") for _ in range(2)]
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(2)
            assert await cluster.gather(cluster.map(inc, range(10))) == list(range(1, 11))
            with pytest.raises(ValueError, match="boom 3"):
                await cluster.submit(boom, 3)
            await kill_the_holder(cluster, workers, tmp_path, db)
    lost = _rows(db, "SELECT worker, outcome, cause, started, ended FROM tries "
                 "WHERE key = 'held' ORDER BY try")  # fmt: skip
    assert [t[1] for t in lost] == ["worker-lost", "ok"]
    lost_worker, _, cause, started, ended = lost[0]
    assert cause == "crash" and started is None and ended is not None
    assert _rows(db, "SELECT cause FROM workers WHERE worker = ?", lost_worker) == [("crash",)]
    # What the dashboard said of the lost try (before, error_message was empty), and the
    # error's traceback from the worker process (before, none was kept).
    said = f"worker {lost_worker} was lost (crash) with 'held' sent to it"
    assert _rows(db, "SELECT error_type, error_message, traceback FROM tries "
                 "WHERE key = 'held' AND try = 1") == [(None, said, None)]  # fmt: skip
    ((outcome, error_type, cause, tb),) = _rows(
        db, "SELECT outcome, error_type, cause, traceback FROM tries WHERE category = 'boom'"
    )
    assert (outcome, error_type, cause) == ("error", "ValueError", "ValueError")
    assert "in boom" in tb and tb.rstrip().endswith("ValueError: boom 3")
    groups = _run(db).why_failed
    assert ("held", "crash", "worker-lost", 1, "held", lost_worker, said, "", 1, 0) in groups
    # kill -9 of the manager: what it wrote up to its last poll stays, and opens.
    # The client gone, the manager released what it held: no output is held, as the
    # metrics say (before, the 11 stayed 'memory').
    released = "SELECT count(*) FROM tasks WHERE state = 'released' AND released >= finished"
    await wait_until(
        lambda: _count(db, released) == 11,
        "the held task done, and every output released, in the database",
        limit=30,
    )
    manager.send_signal(signal.SIGKILL)
    manager.wait(10)
    conn = open_db(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM tasks").fetchone() == (12,)
        assert conn.execute("SELECT ended FROM runs").fetchone() == (None,)  # it crashed
    finally:
        conn.close()


def test_a_manager_writes_to_a_run_directory_by_default_and_not_with_no_monitoring(
    cli: Cli,
) -> None:
    manager = cli.start("manager", "--listen", "127.0.0.1:0")
    line = cli.line_with(manager, "monitoring database:")
    path = Path(line.split(":", 1)[1].strip())
    assert path.parent.parent == cli.home / "runs" and path.name == "monitoring.db"
    cli.line_with(manager, "manager listening on")
    # its owner's alone, as the tokens are (a user audit found 755 and 644: any user
    # of a login node read every task key and error the read token guards)
    for made, mode in ((cli.home / "runs", 0o700), (path.parent, 0o700), (path, 0o600)):
        assert made.stat().st_mode & 0o777 == mode, made
    cli.stop([manager])
    assert open_db(path).execute("SELECT ended FROM runs").fetchone()[0] is not None
    quiet = cli.start("manager", "--listen", "127.0.0.1:0", "--no-monitoring")
    cli.line_with(quiet, "manager listening on")
    cli.stop([quiet])
    assert len(list((cli.home / "runs").iterdir())) == 1


def test_a_new_database_and_its_directories_are_their_owners_alone(tmp_path: Path) -> None:
    """Whatever the umask: the directories made for it are 0700, the database and its
    WAL 0600; a directory that was there is left as it is."""
    db = tmp_path / "shared" / "runs" / "today" / "monitoring.db"
    before = tmp_path.stat().st_mode & 0o777
    old = os.umask(0o022)
    try:
        writer = MonitorWriter(db)
    finally:
        os.umask(old)
    try:
        sides = list(db.parent.glob("monitoring.db-*"))  # -wal, -shm while it is open
        assert sides
        for made in (db, *sides):
            assert made.stat().st_mode & 0o777 == 0o600, made
    finally:
        writer.close()
    for made in (tmp_path / "shared", tmp_path / "shared" / "runs", db.parent):
        assert made.stat().st_mode & 0o777 == 0o700, made
    assert tmp_path.stat().st_mode & 0o777 == before


# ----------------------------------------------------------------------------- bad input


def test_a_missing_or_foreign_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(MonitoringDBError, match="no such file"):
        open_db(tmp_path / "nope.db")
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database\n" * 100)
    with pytest.raises(MonitoringDBError, match="not an SQLite database"):
        open_db(text)
    locked = tmp_path / "locked.db"
    MonitorWriter(locked).close()
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(MonitoringDBError, match="locked by another process"):
            open_db(locked)
    finally:
        holder.close()
    open_db(locked).close()  # let go of: readable again
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(MonitoringDBError, match="not a Corral monitoring database"):
        open_db(other)
    newer = tmp_path / "newer.db"
    MonitorWriter(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(MonitoringDBError, match=f"schema version {SCHEMA_VERSION + 1}"):
        open_db(newer)
    with pytest.raises(MonitoringDBError, match="schema version"):
        MonitorWriter(newer)
    assert default_path(tmp_path).parent.parent == tmp_path


def test_the_report_command_says_what_is_wrong_with_a_bad_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "report", str(tmp_path / "nope.db")],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
    )  # fmt: skip
    assert proc.returncode == 1
    assert "no such file" in proc.stderr and "docs/monitoring.md" in proc.stderr


@pytest.mark.anyio
async def test_a_cluster_given_a_path_it_cannot_write_says_so_before_it_starts(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with anyio.fail_after(LIMIT), pytest.raises(MonitoringDBError, match="cannot create it"):
        async with Cluster(workers=1, monitoring=blocker / "monitoring.db"):
            pass  # pragma: no cover - it must not start
    with pytest.raises(ValueError, match="monitoring= is for an embedded cluster"):
        Cluster("ws://127.0.0.1:1", monitoring=tmp_path / "x.db")


# ----------------------------------------------------------------------------- the recorder
# A recorder fed by a scheduler core's own feed (its clock plus WALL for Unix time), with
# stand-ins for the manager and the autoscaler: what it writes for each case, exactly.

WALL = 1_700_000_000.0  #: added to the core's clock for Unix time
T0 = 1000.0  #: the core's clock in these tests
_n = iter(range(10**9))


class _Ref:
    """Stands for an actor: ``ask`` answers ``answer(msg)`` (None: no answer; an
    awaitable: what it gives, once it does)."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.answer = answer

    async def ask(self, msg: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        answer = self.answer(msg)
        return await answer if inspect.isawaitable(answer) else answer


def _recorder(
    db: Path,
    state: SchedulerState,
    *,
    manager: Callable[[Any], Any] = lambda msg: None,
    autoscaler: Callable[[Any], Any] = lambda msg: None,
    max_rows: int = 500_000,
    wall: float = WALL,
    workers: dict[str, tuple[int, int, int, int | None, int]] | None = None,
    run_row: bool = True,
) -> tuple[MonitorRecorder, MonitorWriter]:
    """A recorder of ``state``'s feed into a new database at ``db``, with its run row
    (``run_row``; else the one its ``on_start`` writes, as an actor's);
    ``wall``: Unix time less the core's clock; ``workers``: the workers' memory numbers
    the feed gives (read at each poll: a test changes them between polls)."""

    def feed(msg: Any) -> MonitorFeedReply | None:
        if not isinstance(msg, MonitorFeed):
            return None
        entries, nxt, lost = state.feed_since(msg.since, msg.limit)
        sampled = dict(workers or {})
        return MonitorFeedReply(tuple(entries), nxt, lost, wall, sampled, state.config.feed_length)

    writer = MonitorWriter(db, max_rows=max_rows)
    scheduler, boss, scaler = _Ref(feed), _Ref(manager), _Ref(autoscaler)
    recorder = MonitorRecorder(
        writer, lambda: cast(Any, scheduler), lambda: cast(Any, boss), lambda: cast(Any, scaler)
    )
    if run_row:
        run = (recorder.run_id, wall, wall, None, "host", 1, "[]", "3", 0, 0)
        writer.submit([("event", "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)", [run])])
    return recorder, writer


def _at(s: SchedulerState, cls: type[Event], now: float, **fields: Any) -> None:
    s.handle(cls(stimulus_id=f"{cls.__name__}-{next(_n)}", now=now, **fields))
    s.validate()


def _done(s: SchedulerState, worker: str, key: str, now: float, outcome: str = "ok",
          **kw: Any) -> None:  # fmt: skip
    """``key``'s try (or copy) on ``worker`` ran from ``now - 1`` to ``now``."""
    res = result(key, outcome, start=now - 1.0, **kw)
    _at(s, TasksFinished, now, worker=worker, results=(res,))


def _straggler(make_state: Factory) -> SchedulerState:
    """A monitored core: five ``t`` tasks done on w1 in 1 s each; ``t-5`` (pool
    ``default``) runs on w1 since T0 (w1 says so); w2 idles, so a tick past T0 + 2
    sends it a copy."""
    s = make_state(monitor=True)
    _at(s, WorkerJoined, T0 - 100, worker="w1", cores=1, memory=GB)
    keys = [f"t-{i}" for i in range(5)]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    _at(s, GraphSubmitted, T0 - 99, specs=specs, wanted=tuple(keys))
    now = T0 - 90
    while running := [k for k in keys if s.tasks[k].state == "processing"]:
        now += 1
        _done(s, "w1", running[0], now)
    specs = specs_for(s, {"t-5": []}, ["t-5"], attrs={"t-5": {"pool": "default"}})
    _at(s, GraphSubmitted, T0, specs=specs, wanted=("t-5",))
    _at(s, WorkerJoined, T0 + 0.1, worker="w2", cores=1, memory=GB)
    assert s.tasks["t-5"].worker == "w1"
    _at(s, TasksRunning, T0 + 0.6, worker="w1", started=(("t-5", 0, 0.6),))
    return s


@pytest.mark.anyio
async def test_a_key_or_error_with_a_lone_surrogate_is_written_escaped(
    tmp_path: Path, make_state: Factory
) -> None:
    """A task failing on a file whose name is not UTF-8 (``os.fsdecode`` makes its bad
    byte a lone surrogate, which SQLite cannot store): its rows are written, escaped."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    key = "load-\udcff"
    name = os.fsdecode(b"d-\xff")  # "d-\udcff"
    _at(s, WorkerJoined, 1.0, worker="w1", cores=1, memory=GB)
    _at(s, GraphSubmitted, 2.0, specs=specs_for(s, {key: []}, [key]), wanted=(key,))
    _done(s, "w1", key, 3.0, "error", error=FileNotFoundError(f"no file {name}"))
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT key, state FROM tasks") == [("load-\\udcff", "erred")]
    assert _rows(db, "SELECT key, error_type, error_message FROM tries") == [
        ("load-\\udcff", "FileNotFoundError", "no file d-\\udcff")
    ]
    assert not writer.dropped


@pytest.mark.anyio
async def test_a_row_sqlite_refuses_is_dropped_and_counted_and_the_rest_written(
    tmp_path: Path,
) -> None:
    db = tmp_path / "monitoring.db"
    writer = MonitorWriter(db)
    gap = "INSERT INTO gaps VALUES (?,?,?,?)"
    writer.submit([
        ("event", gap, [("r", 1.0, "a", 1), ("r", 2.0, "bad \udcff", 2), ("r", 3.0, "a", 3)]),
        ("metric", gap, [("r", 4.0, None, 4)]),  # source is NOT NULL
        ("event", gap, [("r", 5.0, "a", 5)]),
    ])  # fmt: skip
    with anyio.fail_after(LIMIT):
        await wait_until(lambda: writer.written == 3, "the 3 good rows", limit=30)
        writer.submit([("event", gap, [("r", 6.0, "a", 6)])])  # the writer goes on
        await wait_until(lambda: writer.written == 4, "the row after", limit=30)
    writer.close()
    assert [r[0] for r in _rows(db, "SELECT lost FROM gaps ORDER BY lost")] == [1, 3, 5, 6]
    assert writer.dropped == {"event": 1, "metric": 1}


async def _writer_meeting_a_lock(db: Path) -> tuple[MonitorWriter, sqlite3.Connection]:
    """A writer of ``db`` with 100 rows of ``gaps`` queued, which has met the write lock
    of the connection returned (in a transaction: COMMIT lets go)."""
    writer = MonitorWriter(db)
    locker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")
    rows = [("r", 1.0, "a", i) for i in range(100)]
    writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", rows)])
    await wait_until(lambda: writer.errors > 0, "the writer to meet the lock", limit=30)
    return writer, locker


@pytest.mark.anyio
async def test_close_retries_a_locked_database_until_its_timeout(tmp_path: Path) -> None:
    """The database is locked when the run ends, and let go 1.5 s later: close(10)
    writes what is queued."""
    db = tmp_path / "monitoring.db"
    writer, locker = await _writer_meeting_a_lock(db)
    free = threading.Timer(1.5, locker.execute, ("COMMIT",))
    free.start()
    t = time.monotonic()
    try:
        writer.close(timeout=10.0)  # blocks this loop: nothing else runs here
    finally:
        free.join(10)
        locker.close()
    assert time.monotonic() - t < 10.0
    assert _count(db, "SELECT count(*) FROM gaps") == 100 and writer.written == 100


def test_a_backlog_is_committed_piece_by_piece(tmp_path: Path) -> None:
    """450 rows queued at once with pieces of 100 (``max_rows`` 1,000): five
    transactions, not one (a scale audit saw a backlog of 200,000 rows go in one
    30-second transaction: nothing to read meanwhile, and lost whole if the process
    ended then)."""
    db = tmp_path / "monitoring.db"
    writer = MonitorWriter(db, max_rows=1_000)
    assert writer.chunk == 100
    rows = [("r", 1.0, "a", i) for i in range(450)]
    writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", rows)])
    writer.close(timeout=10.0)
    assert writer.written == 450 and writer.batches == 5
    assert _count(db, "SELECT count(*) FROM gaps") == 450


def _history(db: Path, old: float, new: float) -> None:
    """Rows of every kind :func:`prune` looks at: some at ``old``, some at ``new``,
    and a task not finished and a worker that has not left (no time of theirs)."""
    conn = open_db(db)
    with conn:
        conn.execute("INSERT INTO runs (run_id, started) VALUES ('r', ?)", (old,))
        conn.executemany(
            "INSERT INTO tasks (run_id, key, finished) VALUES ('r', ?, ?)",
            [("t-old", old), ("t-new", new), ("t-running", None)],
        )
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, sent, ended, outcome) VALUES ('r',?,1,?,?,?)",
            [
                ("t-old", old, old, "ok"),
                ("t-new", new, new, "ok"),
                ("t-running", old, None, "lost"),
            ],
        )
        conn.executemany(
            "INSERT INTO workers (run_id, worker, joined, left) VALUES ('r', ?, ?, ?)",
            [("w-gone", old, old), ("w-here", old, None)],
        )
        conn.executemany(
            "INSERT INTO metric_samples VALUES ('r', ?, 'corral_queue_depth', '{}', 1.0)",
            [(old,)] * 7 + [(new,)] * 2,
        )
        conn.executemany("INSERT INTO gaps VALUES ('r', ?, 'feed', 1)", [(old,), (new,)])
    conn.close()


def test_prune_deletes_what_is_older_than_the_history_kept(tmp_path: Path) -> None:
    """A manager that runs for days as a service: its database grew about 455 bytes per
    task for good (543 MB after 1.2 million tasks in a soak audit). Rows older than the
    history kept go, in pieces; what has no time yet (a task running, a worker that is
    still there) and the runs stay."""
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    now = time.time()
    _history(db, now - 7200, now - 60)
    conn = open_db(db)
    conn.isolation_level = None  # prune runs its own transactions, as the writer's does
    deleted = prune(conn, now - 3600, piece=3)
    assert deleted == {"tasks": 1, "tries": 2, "workers": 1, "metric_samples": 7, "gaps": 1}
    assert [r[0] for r in conn.execute("SELECT key FROM tasks ORDER BY key")] == [
        "t-new", "t-running",
    ]  # fmt: skip
    # a try with no end (lost with its worker) counts from when it was sent
    assert [r[0] for r in conn.execute("SELECT key FROM tries")] == ["t-new"]
    assert [r[0] for r in conn.execute("SELECT worker FROM workers")] == ["w-here"]
    assert _count(db, "SELECT count(*) FROM metric_samples") == 2
    assert _count(db, "SELECT count(*) FROM runs") == 1
    assert prune(conn, now - 3600) == {}  # nothing more
    conn.close()


def test_prune_stops_between_two_pieces_when_told(tmp_path: Path) -> None:
    """A writer closing stops its pruning there (it ran past close()'s timeout, and
    the rows still queued were dropped: a review found it)."""
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    now = time.time()
    _history(db, now - 7200, now - 60)
    conn = open_db(db)
    conn.isolation_level = None
    answers = iter([False, True])  # on with the first piece, then told to stop
    assert prune(conn, now - 3600, piece=3, stop=lambda: next(answers, True)) == {"tasks": 1}
    assert _count(db, "SELECT count(*) FROM metric_samples") == 9  # not reached
    conn.close()


def test_a_writer_keeping_an_hour_prunes_as_it_writes(tmp_path: Path) -> None:
    db = tmp_path / "monitoring.db"
    with pytest.raises(ValueError, match="keep must be a positive number of seconds"):
        MonitorWriter(db, keep=0)
    MonitorWriter(db).close()
    now = time.time()
    _history(db, now - 7200, now - 60)
    pruned = threading.Event()

    class Seen(MonitorWriter):
        def _prune(self) -> None:
            super()._prune()
            pruned.set()

    writer = Seen(db, keep=3600)
    writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", [("r", now, "feed", 2)])])
    assert pruned.wait(30)  # the first batch written, then the pruning
    writer.close(timeout=10.0)
    assert writer.pruned["metric_samples"] == 7 and writer.pruned["gaps"] == 1
    assert _count(db, "SELECT count(*) FROM gaps") == 2  # the new one and the one written
    assert _count(db, "SELECT count(*) FROM metric_samples") == 2


def test_a_pruning_truncates_the_write_ahead_log(tmp_path: Path) -> None:
    """After a pruning the writer folds the -wal into the file and cuts it to 0 bytes
    (an audit saw it grow from 7.8 to 18.1 MB with a pruning's deletes and stay so for
    the rest of the run); rows written afterwards are kept."""
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    now = time.time()
    _history(db, now - 7200, now - 60)
    conn = open_db(db)
    with conn:
        conn.executemany(
            "INSERT INTO metric_samples VALUES ('r', ?, 'corral_queue_depth', ?, 1.0)",
            [(now - 7200, f'{{"pool": "{i:0200d}"}}') for i in range(5000)],
        )
    conn.close()
    wal = Path(f"{db}-wal")
    sizes: list[int] = []
    pruned = threading.Event()

    class Seen(MonitorWriter):
        def _prune(self) -> None:
            super()._prune()  # on the writer's thread, between two batches
            sizes.append(wal.stat().st_size)
            pruned.set()

    writer = Seen(db, keep=3600)
    writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", [("r", now, "feed", 2)])])
    assert pruned.wait(30)
    writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", [("r", now, "feed", 3)])])
    writer.close(timeout=10.0)
    assert writer.pruned["metric_samples"] == 5007
    assert sizes == [0]
    assert _count(db, "SELECT count(*) FROM gaps") == 3


@pytest.mark.anyio
async def test_a_manager_keeping_an_hour_deletes_an_older_run_s_rows(tmp_path: Path) -> None:
    """``run_manager(monitoring_keep=...)`` (``--monitoring-keep``) reaches the writer: a
    manager given a database with rows two hours old deletes them once it writes."""
    from runtime.node import Tokens, run_manager

    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    now = time.time()
    _history(db, now - 7200, now - 60)
    listening = anyio.Event()

    def ready(addr: str, tokens: Tokens) -> None:
        listening.set()

    def old_samples() -> int:
        return _count(db, f"SELECT count(*) FROM metric_samples WHERE time < {now - 3600}")

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_manager(
                    "inproc://", ready=ready, monitoring=db, monitoring_interval=0.1,
                    monitoring_keep=3600,
                )
            )  # fmt: skip
            await listening.wait()
            await wait_until(lambda: old_samples() == 0, "the old rows deleted")
            tg.cancel_scope.cancel()
    assert _count(db, "SELECT count(*) FROM metric_samples WHERE time >= ?", now - 3600) >= 2


def test_pending_counts_the_rows_the_thread_is_writing(tmp_path: Path) -> None:
    """``pending`` (what a stopping recorder reports left) counts the rows the thread
    took to write, not only those still queued: it read 0 while 60,000 were being
    written (a review found it)."""
    entered, go = threading.Event(), threading.Event()

    class Held(MonitorWriter):
        def _write(self, batch: Any) -> int | None:
            entered.set()
            if not go.wait(30):
                raise TimeoutError("the test never let the writer go")
            return super()._write(batch)

    writer = Held(tmp_path / "monitoring.db", max_rows=1_000)
    rows = [("r", 1.0, "a", i) for i in range(450)]
    writer.submit([("event", "INSERT INTO gaps VALUES (?,?,?,?)", rows)])
    assert entered.wait(30)
    assert writer.pending == 450
    go.set()
    writer.close(timeout=10.0)
    assert writer.pending == 0 and writer.written == 450


@pytest.mark.anyio
async def test_close_gives_up_counts_what_it_drops_and_writes_its_final_rows(
    tmp_path: Path,
) -> None:
    """Locked past close()'s timeout: the queued rows are dropped and counted, and the
    final rows (made then: they see the count) are written once the lock goes."""
    db = tmp_path / "monitoring.db"
    writer, locker = await _writer_meeting_a_lock(db)

    def final() -> list[Any]:
        return [
            (
                "event",
                "INSERT INTO gaps VALUES (?,?,?,?)",
                [("end", 2.0, "b", sum(writer.dropped.values()))],
            )
        ]

    closing = threading.Thread(target=writer.close, args=(0.3, final))
    closing.start()
    try:
        await wait_until(lambda: writer.dropped, "close() to give up", limit=30)
    finally:
        locker.execute("COMMIT")  # the final rows wait for it (busy_timeout)
        closing.join(30)
        locker.close()
    assert not closing.is_alive()
    assert writer.dropped == {"event": 100}
    assert _rows(db, "SELECT run_id, lost FROM gaps") == [("end", 100)]


@pytest.mark.anyio
async def test_per_category_series_are_written_every_30_s_and_at_the_end(
    tmp_path: Path, make_state: Factory
) -> None:
    """The series with a ``category`` label (most of the rows: up to 500 categories, a
    few series each; a scale audit counted 3,056 series, about 490 KB per 2-second
    interval, about 0.9 GB an hour) are written once per CATEGORY_SAMPLES_EVERY, and by
    the last poll; the others at every poll."""
    db = tmp_path / "monitoring.db"
    asked = iter(range(10**6))

    def metrics(msg: Any) -> MetricsReply | None:
        if not isinstance(msg, MetricsRequest):
            return None
        n = next(asked)  # every series changes at every poll (an unchanged one is not
        return MetricsReply(  # written again: the test below)
            pools={"p": PoolMetrics(queue_depth=3 + n, oldest_wait=1.0)},
            categories={f"c{i}": CategoryMetrics(finished=i + n) for i in range(20)},
        )

    recorder, writer = _recorder(db, make_state(), manager=metrics)

    def counts() -> tuple[int, int]:
        q = "SELECT count(*) FROM metric_samples WHERE labels LIKE '%\"category\"%'"
        depth = "SELECT count(*) FROM metric_samples WHERE name = 'corral_queue_depth'"
        return _count(db, q), _count(db, depth)

    with anyio.fail_after(LIMIT):
        await recorder.poll()
        await wait_until(lambda: writer.pending == 0 and counts()[1] == 1, "the first poll")
        first = counts()[0]
        assert first >= 20  # every category, at least one series each
        await recorder.poll()  # within 30 s: the pools' series only
        await wait_until(lambda: writer.pending == 0 and counts()[1] == 2, "the second poll")
        assert counts()[0] == first
        await recorder.on_stop()  # its last poll writes them all
    assert counts() == (2 * first, 3)


@pytest.mark.anyio
async def test_an_unchanged_metric_series_is_written_once_per_heartbeat_and_the_report_holds_it(
    tmp_path: Path, make_state: Factory
) -> None:
    """A soak audit found an idle manager's database growing about 170 MB a day: every
    series written at every poll (2 s), unchanged. Now 50 polls of unchanged metrics
    write one row per series; a change writes a row of that series alone; an unchanged
    series is written again METRIC_HEARTBEAT after its last row, and at the end. The
    report of the run so far draws the queue depth held at its last value up to the
    run's last write, and the documented "latest value" query gives it."""
    db = tmp_path / "monitoring.db"
    depth = {"p": 4}

    def metrics(msg: Any) -> MetricsReply | None:
        if not isinstance(msg, MetricsRequest):
            return None
        return MetricsReply(pools={"p": PoolMetrics(queue_depth=depth["p"], oldest_wait=2.5)})

    recorder, writer = _recorder(db, make_state(), manager=metrics)

    def per_series() -> dict[tuple[str, str], int]:
        q = "SELECT name, labels, count(*) FROM metric_samples GROUP BY name, labels"
        return {(n, lb): c for n, lb, c in _rows(db, q)}

    async def polls(times: Iterator[float]) -> dict[tuple[str, str], int]:
        for t in times:
            await recorder.poll(now=WALL + t)
        await wait_until(lambda: writer.pending == 0, "the rows written")
        return per_series()

    with anyio.fail_after(LIMIT):
        first = await polls(iter(2.0 * i for i in range(50)))  # 98 s, nothing changes
        assert len(first) >= 5 and set(first.values()) == {1}, first
        depth["p"] = 7  # a change: that series' row, no other
        changed = await polls(iter([100.0, 102.0, 104.0]))
        depth_p = ("corral_queue_depth", '{"pool": "p"}')
        assert changed == {**first, depth_p: 2}
        # the run so far, read as a live run: the depth held at 7 up to its last write
        run = _run(db)
        line = run.queues[("corral_queue_depth", "p")]
        xs, ys = line.xs, line.ys
        assert (xs[-2:], ys) == ([100.0, 104.0], [4, 7, 7]), (xs, ys)
        assert run.queues[("corral_queue_oldest_wait_seconds", "p")].ys == [2.5, 2.5]
        latest = _rows(
            db,
            "SELECT value FROM metric_samples WHERE name = 'corral_queue_depth' "
            "AND json_extract(labels, '$.pool') = 'p' ORDER BY time DESC LIMIT 1",
        )
        assert latest == [(7.0,)]
        # 300 s after their last row, the unchanged series have one more; the depth,
        # written at 100 s, not yet
        beat = await polls(iter([METRIC_HEARTBEAT - 2.0, METRIC_HEARTBEAT]))
        assert beat == {**{k: n + 1 for k, n in changed.items()}, depth_p: 2}, beat
        await recorder.on_stop()  # the end: every series once more
    assert per_series() == {k: n + 1 for k, n in beat.items()}


@pytest.mark.anyio
async def test_a_gauge_series_gone_from_the_metrics_ends_with_a_0_and_a_counter_holds(
    tmp_path: Path, make_state: Factory
) -> None:
    """A user audit (parslmig, 4): the pool ``*`` (tasks submitted without ``pool=``)
    leaves ``/metrics`` once none of its tasks is queued, and its series got no last
    row: the documented "latest row" reading said "1 task queued" for ever after. Now a
    gauge series gone from a poll's snapshot gets a row of 0 at that poll (one already
    at 0 needs none), also at the run's last poll; a counter's (and a summary's) last
    row holds, the total it reached (a 0 would read as a reset to a rate query); a series
    that comes back is written at once. The cpu pool, there throughout, is untouched."""
    db = tmp_path / "monitoring.db"
    star = PoolMetrics(queue_depth=1, oldest_wait=2.0, spilled_total=5, waits=3, wait_sum=1.5,
                       wait_quantiles={"0.5": 0.2})  # fmt: skip
    back = dataclasses.replace(star, queue_depth=4, oldest_wait=3.0, spilled_total=7)
    cpu = PoolMetrics()
    snapshots = iter([{"*": star, "cpu": cpu}, {"cpu": cpu}, {"*": back, "cpu": cpu}, {"cpu": cpu}])

    def metrics(msg: Any) -> MetricsReply | None:
        if not isinstance(msg, MetricsRequest):
            return None
        return MetricsReply(pools=next(snapshots))

    recorder, writer = _recorder(db, make_state(), manager=metrics)
    with anyio.fail_after(LIMIT):
        for t in (0.0, 2.0, 4.0):
            await recorder.poll(now=WALL + t)
        await recorder.on_stop()  # its last poll: * gone again
    series: dict[tuple[str, str], list[tuple[float | str, float]]] = {}
    q = "SELECT name, json_extract(labels, '$.pool'), time, value FROM metric_samples"
    for name, pool, at, value in _rows(db, q + " ORDER BY rowid"):
        series.setdefault((name, pool), []).append((at - WALL if at < WALL + 10 else "end", value))
    assert series[("corral_queue_depth", "*")] == [(0.0, 1.0), (2.0, 0.0), (4.0, 4.0), ("end", 0.0)]
    assert series[("corral_queue_oldest_wait_seconds", "*")] == [
        (0.0, 2.0), (2.0, 0.0), (4.0, 3.0), ("end", 0.0)
    ]  # fmt: skip
    assert series[("corral_queue_held_back", "*")] == [(0.0, 0.0), (4.0, 0.0)]  # 0: said so
    assert series[("corral_spilled_bytes_total", "*")] == [(0.0, 5.0), (4.0, 7.0)]  # holds
    assert series[("corral_queue_wait_seconds_count", "*")] == [(0.0, 3.0), (4.0, 3.0)]
    assert series[("corral_queue_wait_seconds", "*")] == [(0.0, 0.2), (4.0, 0.2)]
    assert series[("corral_queue_depth", "cpu")] == [(0.0, 0.0), ("end", 0.0)]
    # the documented query's latest row for *: nothing queued
    latest = (
        "SELECT value FROM metric_samples WHERE name = 'corral_queue_depth' "
        "AND json_extract(labels, '$.pool') = '*' ORDER BY time DESC LIMIT 1"
    )
    assert _rows(db, latest) == [(0.0,)]
    assert writer.ended


@pytest.mark.anyio
async def test_an_idle_worker_s_memory_is_written_once_per_heartbeat(
    tmp_path: Path, make_state: Factory
) -> None:
    """An idle manager's database grew by about 3.8 MB a day per worker: a
    ``resource_samples`` row per worker every poll (2 s), the same numbers each time. Now
    a worker's row is written when its numbers change, METRIC_HEARTBEAT after its last
    row, at the end, and once more when it leaves (its numbers held to then)."""
    db = tmp_path / "monitoring.db"
    mib = 2**20
    workers = {"w1": (100 * mib, 0, 0, 5000 * mib, 0), "w2": (80 * mib, 0, 0, None, 0)}
    recorder, writer = _recorder(db, make_state(), workers=workers)

    def per_worker() -> dict[str, list[tuple[float, int]]]:
        q = "SELECT worker, time, rss FROM resource_samples ORDER BY worker, time"
        rows: dict[str, list[tuple[float, int]]] = {}
        for w, at, rss in _rows(db, q):
            rows.setdefault(w, []).append((at - WALL, rss // mib))
        return rows

    async def polls(*times: float) -> dict[str, list[tuple[float, int]]]:
        for t in times:
            await recorder.poll(now=WALL + t)
        await wait_until(lambda: writer.pending == 0, "the rows written")
        return per_worker()

    with anyio.fail_after(LIMIT):
        idle = await polls(*(2.0 * i for i in range(50)))  # 98 s, nothing changes
        assert idle == {"w1": [(0.0, 100)], "w2": [(0.0, 80)]}
        workers["w1"] = (120 * mib, 0, 0, 5000 * mib, 0)  # w1 ran a task
        grew = await polls(100.0, 102.0)
        assert grew == {"w1": [(0.0, 100), (100.0, 120)], "w2": [(0.0, 80)]}
        beat = await polls(METRIC_HEARTBEAT - 2.0, METRIC_HEARTBEAT)  # w2's heartbeat
        assert beat == {"w1": [(0.0, 100), (100.0, 120)], "w2": [(0.0, 80), (300.0, 80)]}
        del workers["w2"]  # w2 left: its numbers once more, at the poll that saw it gone
        left = await polls(310.0, 312.0)
        assert left["w2"] == [(0.0, 80), (300.0, 80), (310.0, 80)]
        await recorder.on_stop()  # the end: w1 once more
    assert [at for at, _ in per_worker()["w1"]][:2] == [0.0, 100.0]
    assert len(per_worker()["w1"]) == 3 and len(per_worker()["w2"]) == 3


@pytest.mark.anyio
async def test_a_task_that_failed_for_good_has_its_last_try_s_error_in_its_row(
    tmp_path: Path, make_state: Factory
) -> None:
    """A user audit (parslmig, 5): ``tasks.error`` was filled only for a task that did
    not run (its dependency failed); the task that failed itself had it empty, so
    ``SELECT key, error FROM tasks WHERE state = 'erred'`` gave blanks for the tasks
    that mattered. Now a task that fails for good has its last try's ``Type: message``
    there, also when its earlier try was in an earlier interval; a task that failed a
    try and then finished has none; one whose dependency failed says so, as before.
    ``cause`` stays the not-run cause (its failed tries have theirs)."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    _at(s, WorkerJoined, T0, worker="w1", cores=4, memory=GB)
    table: dict[str, list[str]] = {"a": [], "b": [], "d": [], "c": ["d"]}
    specs = specs_for(s, table, ["a", "b", "c"], attrs={"a": {"retries": 1}, "b": {"retries": 1}})
    _at(s, GraphSubmitted, T0 + 1, specs=specs, wanted=("a", "b", "c"))
    _done(s, "w1", "a", T0 + 2, "error", error=ValueError("first"))
    _done(s, "w1", "b", T0 + 2, "error", error=ConnectionError("gone"))
    with anyio.fail_after(LIMIT):
        await recorder.poll()  # a's retry goes on: no error in its row yet
        await wait_until(lambda: writer.pending == 0, "the first interval's rows")
        assert _rows(db, "SELECT key, state, error FROM tasks WHERE key = 'a'") == [
            ("a", "processing", None)
        ]
        _done(s, "w1", "a", T0 + 3, "error", error=OSError("second"))
        _done(s, "w1", "b", T0 + 3)
        _done(s, "w1", "d", T0 + 3, "error", error=KeyError("x"))
        await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT key, state, tries, cause, error, root FROM tasks ORDER BY key")
    assert rows == [
        ("a", "erred", 2, None, "OSError: second", None),
        ("b", "memory", 2, None, None, None),
        ("c", "erred", 0, "dependency-failed", "dependency 'd' failed: KeyError: 'x'", "d"),
        ("d", "erred", 1, None, "KeyError: 'x'", None),
    ]
    assert not recorder._failed  # (nothing kept of the tasks that ended)


@pytest.mark.anyio
async def test_the_errors_kept_for_tasks_not_ended_go_with_the_tasks_or_a_gap(
    tmp_path: Path, make_state: Factory
) -> None:
    """Review 1206e F9: the recorder keeps a task's failed try's error until the task
    ends (its row's error if it errs). A task whose end it never reads kept it for the
    run: a long-lived manager's dict grew. Its end lost in a feed overflow (a burst
    past ``feed_length`` between two reads): the gap empties it. Its output released:
    nothing is kept either (the scheduler says ``memory`` before, which did too)."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, feed_length=4)
    recorder, writer = _recorder(db, s)
    _at(s, WorkerJoined, T0, worker="w1", cores=4, memory=GB)
    specs = specs_for(s, {"a": []}, ["a"], attrs={"a": {"retries": 1}})
    _at(s, GraphSubmitted, T0 + 1, specs=specs, wanted=("a",))
    _done(s, "w1", "a", T0 + 2, "error", error=ValueError("first"))
    with anyio.fail_after(LIMIT):
        await recorder.poll()
        assert recorder._failed == {"a": "ValueError: first"}  # its retry runs
        _done(s, "w1", "a", T0 + 3)  # it ends (memory) ...
        many = [f"b-{i}" for i in range(8)]  # ... in a burst past what the feed holds
        _at(s, GraphSubmitted, T0 + 4, specs=specs_for(s, {k: [] for k in many}, many),
            wanted=tuple(many))  # fmt: skip
        for i, k in enumerate(many):
            _done(s, "w1", k, T0 + 5 + i)
        await recorder.poll()
        assert recorder.feed_lost > 0
        assert recorder._failed == {}
        # Released: a try failed, then the output went (what the feed says is fed here).
        reply = MonitorFeedReply(
            ((T0 + 20, [
                ("try", "c", "c", "w1", 1, T0 + 19, T0 + 19, T0 + 20, "error", None,
                 None, 0, T0 + 19, "error", None, None, None),
                ("state", "c", "released", "c", None, None, ""),
            ]),), recorder.seq + 1, 0, WALL, {}, 4,
        )  # fmt: skip
        recorder._scheduler = lambda: cast(Any, _Ref(lambda msg: reply))
        await recorder.poll()
        assert recorder._failed == {}
    writer.close()


@pytest.mark.anyio
async def test_a_try_the_scheduler_cancelled_is_recorded_in_unix_time(
    tmp_path: Path, make_state: Factory
) -> None:
    """``t-5``'s copy on w2 wins at T0 + 3: the first try, cancelled (superseded), was
    sent at T0, began executing then (as w1 said) and ended at T0 + 3, on the same
    clock as the others (Unix time), and waited from T0 (queued); the copy that won was
    sent at T0 + 2.1, and its row says so, with no wait (it did not queue)."""
    db = tmp_path / "monitoring.db"
    s = _straggler(make_state)
    recorder, writer = _recorder(db, s)
    _at(s, Tick, T0 + 2.1)
    assert set(s.copies[s.tasks["t-5"]]) == {"w2"}
    _done(s, "w2", "t-5", T0 + 3)
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    tries = _rows(db, "SELECT worker, outcome, cause, sent, started, ended, queued FROM tries "
                  "WHERE key = 't-5' ORDER BY try")  # fmt: skip
    assert tries == [
        ("w1", "cancelled", "superseded", WALL + T0, WALL + T0, WALL + T0 + 3, WALL + T0),
        # started, ended: result(); a copy did not wait: no queued
        ("w2", "ok", "speculative", WALL + T0 + 2.1, T0 + 2, T0 + 3, None),
    ]


@pytest.mark.anyio
async def test_a_first_try_a_speculative_copy_superseded_keeps_when_it_began(
    tmp_path: Path, make_state: Factory
) -> None:
    """Review 1207f F5: the first try that a winning copy superseded had no ``started``
    although its worker had said when it began, so its time (speculation's stragglers,
    the longest executions) was missing from the report's "h executing", the busy share
    and the docs' busiest-workers query. ``t-5`` began on w1 at T0; its copy on w2 wins
    at T0 + 3: w1's 3 s count, beside its five tries of 1 s."""
    db = tmp_path / "monitoring.db"
    s = _straggler(make_state)
    recorder, writer = _recorder(db, s)
    _at(s, Tick, T0 + 2.1)
    _done(s, "w2", "t-5", T0 + 3)
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT started, ended FROM tries WHERE key = 't-5' AND worker = 'w1'") == [
        (WALL + T0, WALL + T0 + 3)
    ]
    assert _rows(db, _doc_sql("The busiest workers")) == [("w1", 6, 8.0), ("w2", 1, 1.0)]


@pytest.mark.anyio
async def test_a_speculative_copy_cancelled_after_it_began_keeps_when_it_began(
    tmp_path: Path, make_state: Factory
) -> None:
    """Review 1207f F5: a copy cancelled while it executed (its first try won) had no
    ``started``, though its worker had said when it began. ``t-5``'s copy, sent to w2 at
    T0 + 2.1, began there at T0 + 2.2 (w2 says at T0 + 2.5 it has run 0.3 s); the first
    try ends ok on w1 at T0 + 4 and the copy is cancelled (superseded)."""
    db = tmp_path / "monitoring.db"
    s = _straggler(make_state)
    recorder, writer = _recorder(db, s)
    _at(s, Tick, T0 + 2.1)
    _at(s, TasksRunning, T0 + 2.5, worker="w2", started=(("t-5", 0, 0.3),))
    _done(s, "w1", "t-5", T0 + 4)
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    copy = "SELECT outcome, cause, started, ended FROM tries WHERE worker = 'w2'"
    assert _rows(db, copy) == [("cancelled", "superseded", WALL + T0 + 2.2, WALL + T0 + 4)]


@pytest.mark.anyio
async def test_a_try_cancelled_while_it_executed_keeps_when_it_began(
    tmp_path: Path, make_state: Factory
) -> None:
    """A user audit (analyst, 7): two tasks a user cancelled after they had run about
    7 s had no ``started`` (their worker had said they executed), so the docs' "busiest
    workers" query left their time out. Now a try cancelled while it executed keeps
    when its worker said it began; one its worker had not said it began has none."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    _at(s, WorkerJoined, T0, worker="w1", cores=2, memory=GB)
    specs = specs_for(s, {"slow-0": [], "slow-1": []}, ["slow-0", "slow-1"])
    _at(s, GraphSubmitted, T0 + 1, specs=specs, wanted=("slow-0", "slow-1"))
    assert {s.tasks[k].worker for k in ("slow-0", "slow-1")} == {"w1"}
    _at(s, TasksRunning, T0 + 1.5, worker="w1", started=(("slow-0", 0, 0.5),))
    _at(s, CancelRequested, T0 + 8, keys=("slow-0", "slow-1"))
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    tries = _rows(db, "SELECT key, outcome, cause, sent, started, ended FROM tries ORDER BY key")
    assert tries == [
        ("slow-0", "cancelled", "cancelled", WALL + T0 + 1, WALL + T0 + 1, WALL + T0 + 8),
        ("slow-1", "cancelled", "cancelled", WALL + T0 + 1, None, WALL + T0 + 8),
    ]
    assert _rows(db, _doc_sql("The busiest workers")) == [("w1", 1, 7.0)]


@pytest.mark.anyio
async def test_a_try_ending_alone_in_an_interval_keeps_its_tasks_state_and_pool(
    tmp_path: Path, make_state: Factory
) -> None:
    """``t-5``'s copy fails while its first try runs on: the interval holds the copy's
    try alone; the task stays ``processing`` in pool ``default``, then ends ``memory``."""
    db = tmp_path / "monitoring.db"
    s = _straggler(make_state)
    recorder, writer = _recorder(db, s)
    task = "SELECT state, pool, tries FROM tasks WHERE key = 't-5'"
    with anyio.fail_after(LIMIT):
        await recorder.poll()
        await wait_until(lambda: _rows(db, task) == [("processing", "default", 0)], "t-5 runs",
                         limit=30)  # fmt: skip
        _at(s, Tick, T0 + 2.1)
        _done(s, "w2", "t-5", T0 + 3, "error", error=RuntimeError("copy fails"))
        await recorder.poll()
        await wait_until(lambda: _count(db, "SELECT count(*) FROM tries") == 6, "the copy's try",
                         limit=30)  # fmt: skip
        assert _rows(db, task) == [("processing", "default", 1)]
        _done(s, "w1", "t-5", T0 + 4)
        await recorder.poll()
    writer.close()
    assert _rows(db, task) == [("memory", "default", 2)]


@pytest.mark.anyio
async def test_a_worker_its_block_names_before_it_joins_gets_the_block(
    tmp_path: Path, make_state: Factory
) -> None:
    """Process and Slurm workers: the autoscaler names a block's workers when the block
    starts, before they join; a worker named after it joined gets its block too."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    status = AutoscalerStatus(
        blocks={"block-1": "running", "block-2": "running"},
        block_pools={"block-1": "default", "block-2": "default"},
        block_workers={"block-1": ("w1",), "block-2": ()},
    )
    recorder, writer = _recorder(db, s, autoscaler=lambda msg: status)
    with anyio.fail_after(LIMIT):
        await recorder.poll()  # w1 not joined yet
        _at(s, WorkerJoined, 1.0, worker="w1", cores=1, memory=GB)
        _at(s, WorkerJoined, 1.0, worker="w2", cores=1, memory=GB)
        await recorder.poll()
        status.block_workers["block-2"] = ("w2",)  # w2 named after it joined
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT worker, block FROM workers ORDER BY worker") == [
        ("w1", "block-1"), ("w2", "block-2"),
    ]  # fmt: skip


@pytest.mark.anyio
async def test_a_key_computed_again_after_it_was_forgotten_adds_to_its_tries(
    tmp_path: Path, make_state: Factory
) -> None:
    """``a`` is computed, released (forgotten: the scheduler numbers its tries from 1
    again), submitted anew and computed again, and fails: its two tries are rows 1 and
    2 in the order they ended (before, the second replaced the first), and its task
    row counts 2 and says how it ended last."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    with anyio.fail_after(LIMIT):
        _at(s, WorkerJoined, T0, worker="w1", cores=1, memory=GB)
        _at(s, GraphSubmitted, T0, specs=specs_for(s, {"a": []}, ["a"]), wanted=("a",))
        _done(s, "w1", "a", T0 + 1)
        await recorder.poll()
        _at(s, KeysReleased, T0 + 2, keys=("a",))
        _at(s, FilesReleased, T0 + 2, keys=("a",))  # the registry drops its output
        assert "a" not in s.tasks
        _at(s, GraphSubmitted, T0 + 3, specs=specs_for(s, {"a": []}, ["a"]), wanted=("a",))
        _done(s, "w1", "a", T0 + 4, outcome="error")
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT try, outcome, ended FROM tries WHERE key = 'a' ORDER BY try") == [
        (1, "ok", T0 + 1), (2, "error", T0 + 4),
    ]  # fmt: skip
    assert _rows(db, "SELECT tries, state, finished FROM tasks WHERE key = 'a'") == [
        (2, "erred", WALL + T0 + 4)
    ]


@pytest.mark.anyio
async def test_a_worker_that_comes_back_under_its_id_gets_a_row_per_life(
    tmp_path: Path, make_state: Factory
) -> None:
    """A requeued Slurm block's worker joins again under its id after it was lost: its
    first life keeps its end and cause, the second is a row of its own; a reconnect
    within a life (a join with no leaving before it) is counted in that life's joins."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    with anyio.fail_after(LIMIT):
        _at(s, WorkerJoined, T0, worker="w1", cores=1, memory=GB)
        _at(s, WorkerJoined, T0 + 5, worker="w1", cores=1, memory=GB)  # a reconnect
        await recorder.poll()
        _at(s, WorkerLeft, T0 + 60, worker="w1", cause="preempted")
        await recorder.poll()
        _at(s, WorkerJoined, T0 + 300, worker="w1", cores=1, memory=GB)  # requeued
        _at(s, WorkerJoined, T0 + 300, worker="w2", cores=1, memory=GB)
        await recorder.poll()
        _at(s, WorkerLeft, T0 + 400, worker="w1", cause="walltime")
        await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT worker, life, joined, left, cause, joins FROM workers "
                 "ORDER BY worker, life")  # fmt: skip
    assert rows == [
        ("w1", 1, WALL + T0, WALL + T0 + 60, "preempted", 2),
        ("w1", 2, WALL + T0 + 300, WALL + T0 + 400, "walltime", 1),
        ("w2", 1, WALL + T0 + 300, None, None, 1),
    ]


def _doc_sql(question: str) -> str:
    """The first SQL block after ``question`` in docs/monitoring.md, as it is there."""
    text = (Path(__file__).parent.parent / "docs" / "monitoring.md").read_text()
    at = text.index(question)
    start = text.index("```sql\n", at) + len("```sql\n")
    return text[start : text.index("```", start)]


def _top_level(sql: str, words: tuple[str, ...]) -> int | None:
    """Where the first of ``words`` (SQL keywords) is in ``sql`` outside parentheses."""
    depth = 0
    for i, ch in enumerate(sql):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and sql[i].isspace():
            rest = " ".join(sql[i + 1 :].split()).upper()
            if rest.startswith(words):
                return i
    return None


@pytest.mark.anyio
async def test_every_documented_query_runs_and_keeps_to_the_latest_run_as_the_doc_says(
    tmp_path: Path,
) -> None:
    """Each query of docs/monitoring.md's "Questions in SQL" runs on the database of two
    short runs, as written and with the run filter the doc gives added as it says: after
    the query's ``WHERE`` (``AND run_id = ...``), or, in one without (disk use,
    recoveries, transfers), as ``WHERE run_id = ...`` before its ``GROUP BY`` or ``ORDER
    BY``. Before, the doc said to add ``AND run_id = ...`` to every query, which those
    four cannot take. Each block is one statement, run as it stands: Python's
    ``sqlite3`` refuses a block of two (three blocks held two before)."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        for _ in range(2):
            async with Cluster(workers=1, monitoring=db, monitoring_interval=0.1) as cluster:
                assert await cluster.gather(cluster.map(inc, range(3))) == [1, 2, 3]
    text = (Path(__file__).parent.parent / "docs" / "monitoring.md").read_text()
    section = text[text.index("### Questions in SQL") : text.index("## Report")]
    filters = re.findall(r"`((?:AND|WHERE) run_id = \(SELECT[^`]*\))`", " ".join(section.split()))
    assert sorted({f.split()[0] for f in filters}) == ["AND", "WHERE"], filters
    latest = filters[0].split(None, 1)[1]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(blocks) >= 10
    queries = [block.strip().removesuffix(";") for block in blocks]
    conn = sqlite3.connect(db)
    try:
        (run_id,) = conn.execute("SELECT run_id FROM runs ORDER BY started DESC LIMIT 1").fetchone()
        assert conn.execute(f"SELECT {latest.split(' = ', 1)[1]}").fetchone() == (run_id,)
        for block, q in zip(blocks, queries, strict=True):
            conn.execute(block).fetchall()  # as pasted: one statement
            end = _top_level(q, ("GROUP BY", "ORDER BY", "LIMIT"))
            end = len(q) if end is None else end
            where = _top_level(q, ("WHERE",))
            added = f" AND {latest}" if where is not None and where < end else f" WHERE {latest}"
            conn.execute(q[:end] + added + q[end:]).fetchall()
        every = "SELECT time, worker, spilled_bytes, disk_free FROM resource_samples"
        assert any(q.startswith(every) for q in queries)
        ours = conn.execute(every + f" WHERE {latest}").fetchall()
        assert 0 < len(ours) < len(conn.execute(every).fetchall())
    finally:
        conn.close()


@pytest.mark.anyio
async def test_the_documented_wait_query_counts_every_wait_in_the_pool_it_was_spent(
    tmp_path: Path, make_state: Factory
) -> None:
    """``a`` (pool cpu) is ready at T0, c1 joins and is sent it 3 s later, then is
    preempted: ``a`` is ready again and waits 75 s for c2. Its two tries' rows have
    ``sent - queued`` 3 and 75; the doc's query for pool cpu over the last hour counts
    both (and neither ``g``'s wait of 100 s in pool gpu nor ``old``'s of 50 s in cpu,
    sent more than an hour ago). The report's median wait is over the tries (75 s; over
    the tasks' first waits, 50 s). Before, the doc's query took the tasks' first ready
    and first sent: 1 wait of 3 s."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    t0 = T0 + 4000  # ``a`` and ``g`` from here; ``old`` from T0
    wall = float(int(time.time()) - int(t0) - 200)  # the run ended 100 s ago; exact sums
    recorder, writer = _recorder(db, s, wall=wall)
    cpu = {"pool": "cpu"}
    with anyio.fail_after(LIMIT):
        old = specs_for(s, {"old": []}, ["old"], attrs={"old": cpu})
        _at(s, GraphSubmitted, T0, specs=old, wanted=("old",))
        _at(s, WorkerJoined, T0 + 50, worker="c0", cores=1, memory=GB, pool="cpu")
        _done(s, "c0", "old", T0 + 51)
        _at(s, KeysReleased, T0 + 52, keys=("old",))
        _at(s, FilesReleased, T0 + 52, keys=("old",))
        _at(s, WorkerLeft, T0 + 600, worker="c0", cause="drained")
        specs = specs_for(s, {"a": [], "g": []}, ["a", "g"],
                          attrs={"a": cpu, "g": {"pool": "gpu"}})  # fmt: skip
        _at(s, GraphSubmitted, t0, specs=specs, wanted=("a", "g"))
        _at(s, WorkerJoined, t0 + 3, worker="c1", cores=1, memory=GB, pool="cpu")
        assert s.tasks["a"].worker == "c1"
        _at(s, WorkerLeft, t0 + 10, worker="c1", cause="preempted")
        _at(s, WorkerJoined, t0 + 85, worker="c2", cores=1, memory=GB, pool="cpu")
        _done(s, "c2", "a", t0 + 86)
        _at(s, WorkerJoined, t0 + 100, worker="g1", cores=1, memory=GB, pool="gpu")
        _done(s, "g1", "g", t0 + 101)
        await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT worker, outcome, sent - queued FROM tries WHERE key = 'a' "
                 "ORDER BY try")  # fmt: skip
    assert rows == [("c1", "worker-lost", 3.0), ("c2", "ok", 75.0)]
    others = _rows(db, "SELECT key, sent - queued FROM tries WHERE key != 'a' ORDER BY key")
    assert others == [("g", 100.0), ("old", 50.0)]
    sql = _doc_sql("How long did tasks wait in pool `cpu`")
    assert _rows(db, sql) == [(2, 39.0, 75.0, 1)]  # waits, mean, max, over a minute
    read = open_db(db)
    try:
        assert _Run(read, None, lambda line: None).median_wait == 75.0  # of 3, 50, 75, 100
    finally:
        read.close()


@pytest.mark.anyio
async def test_the_documented_wait_query_gives_the_waits_of_the_metrics(
    tmp_path: Path, make_state: Factory
) -> None:
    """Tasks any pool may run (``*``) and one of pool small, with a worker of pool
    default and one of pool small (the audit's run): the doc's query gives, per pool, the
    count and sum of ``corral_queue_wait_seconds``. Before, the metrics counted the
    ``*`` tasks' waits under ``pool="*"`` (and none under default)."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, saturation=1.0)
    wall = float(int(time.time()) - int(T0) - 200)
    recorder, writer = _recorder(db, s, wall=wall)
    with anyio.fail_after(LIMIT):
        specs = specs_for(s, {"a": [], "b": [], "c": [], "s": []}, ["a", "b", "c", "s"],
                          attrs={"s": {"pool": "small"}})  # fmt: skip
        _at(s, GraphSubmitted, T0, specs=specs, wanted=("a", "b", "c", "s"))
        _at(s, WorkerJoined, T0 + 4, worker="d", cores=2, memory=GB, pool="default")
        _at(s, WorkerJoined, T0 + 7, worker="m", cores=2, memory=GB, pool="small")
        for t in [*s.workers["d"].processing, *s.workers["m"].processing]:
            _done(s, str(t.worker), str(t.key), T0 + 9)
        await recorder.poll()
    writer.close()
    metrics = s.pool_metrics(T0 + 10)
    sql = _doc_sql("How long did tasks wait in pool `cpu`")
    for pool, want in (("default", (2, 8.0)), ("small", (2, 14.0))):
        ((waits, mean, _, _),) = _rows(db, sql.replace("'cpu'", f"'{pool}'"))
        assert (waits, waits * mean) == want, pool
        assert (metrics[pool]["waits"], metrics[pool]["wait_sum"]) == want, pool
    assert metrics["*"]["waits"] == 0


@pytest.mark.anyio
async def test_the_documented_grouped_queries_count_a_rejoined_worker_once(
    tmp_path: Path, make_state: Factory
) -> None:
    """A user audit: the docs' waits were for one pool, and the natural ``GROUP BY pool,
    category`` over a join with ``workers`` (a row per worker life) counted the tries
    of a worker that rejoined once per life. c1 (pool cpu) runs load-0 and parse-0,
    leaves (preempted), comes back under its id and runs load-1; g1 (pool gpu) runs
    load-2 and, like c1's second life, is still alive at the run's latest write. The
    doc's grouped waits count each try once; its lives count the lives still alive up
    to ``runs.last_seen``."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, saturation=1.0)
    wall = float(int(time.time()) - int(T0) - 200)  # within the last hour; exact sums
    recorder, writer = _recorder(db, s, wall=wall)
    cpu, gpu = {"pool": "cpu"}, {"pool": "gpu"}
    with anyio.fail_after(LIMIT):
        first = specs_for(s, {"load-0": [], "parse-0": []}, ["load-0", "parse-0"],
                          attrs={"load-0": cpu, "parse-0": cpu})  # fmt: skip
        _at(s, GraphSubmitted, T0, specs=first, wanted=("load-0", "parse-0"))
        _at(s, WorkerJoined, T0 + 2, worker="c1", cores=1, memory=GB, pool="cpu")
        _done(s, "c1", "load-0", T0 + 3)  # waited 2 s
        _done(s, "c1", "parse-0", T0 + 4)  # waited 3 s
        _at(s, KeysReleased, T0 + 4, keys=("load-0", "parse-0"))  # not made again
        _at(s, FilesReleased, T0 + 4, keys=("load-0", "parse-0"))
        _at(s, WorkerLeft, T0 + 5, worker="c1", cause="preempted")
        later = specs_for(s, {"load-1": [], "load-2": []}, ["load-1", "load-2"],
                          attrs={"load-1": cpu, "load-2": gpu})  # fmt: skip
        _at(s, GraphSubmitted, T0 + 6, specs=later, wanted=("load-1", "load-2"))
        _at(s, WorkerJoined, T0 + 8, worker="g1", cores=1, memory=GB, pool="gpu")
        _done(s, "g1", "load-2", T0 + 9)  # waited 2 s
        _at(s, WorkerJoined, T0 + 10, worker="c1", cores=1, memory=GB, pool="cpu")
        _done(s, "c1", "load-1", T0 + 11)  # waited 4 s
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT worker, life FROM workers ORDER BY 1, 2") == [
        ("c1", 1), ("c1", 2), ("g1", 1)
    ]  # fmt: skip
    grouped = _doc_sql("The same waits per pool and category")
    assert _rows(db, grouped) == [
        ("cpu", "load", 2, 3.0, 4.0), ("cpu", "parse", 1, 3.0, 3.0), ("gpu", "load", 1, 2.0, 2.0)
    ]  # fmt: skip
    naive = (  # the audit's query: c1's tries twice
        "SELECT w.pool, t.category, count(*) FROM tries t JOIN workers w ON w.run_id = "
        "t.run_id AND w.worker = t.worker WHERE t.queued IS NOT NULL GROUP BY 1, 2"
    )  # fmt: skip
    assert _rows(db, naive) == [("cpu", "load", 4), ("cpu", "parse", 2), ("gpu", "load", 1)]
    ((seen,),) = _rows(db, "SELECT last_seen FROM runs")
    lives = {(pool, how): (n, round(mean * 60, 6))
             for pool, how, n, mean in _rows(db, _doc_sql("The lives of every pool"))}  # fmt: skip
    assert lives == {
        ("cpu", "preempted"): (1, 3.0),
        ("cpu", "alive"): (1, round(seen - (wall + T0 + 10), 6)),
        ("gpu", "alive"): (1, round(seen - (wall + T0 + 8), 6)),
    }
    # The report's tables of waits and of lives: the same numbers
    read = open_db(db)
    try:
        run = _Run(read, None, lambda line: None)
    finally:
        read.close()
    assert sorted(run.waits) == sorted(_rows(db, grouped))
    assert {(pool, how): (n, float(mean)) for pool, how, n, mean, *_ in _lives(run)} == {
        key: (n, round(life, 1)) for key, (n, life) in lives.items()
    }
    page = build_report(db)
    assert "<th>waits ready to sent: pool</th>" in page
    assert "<td>cpu</td><td>preempted</td><td>1</td><td>3.0</td><td>3.0</td><td>3.0</td>" in page


@pytest.mark.anyio
async def test_a_preempted_life_is_named_by_its_block_s_end_when_an_operator_ended_it(
    tmp_path: Path, make_state: Factory
) -> None:
    """A user audit: an operator's ``scancel`` and ``scontrol requeue`` send SIGTERM as a
    preemption does, so their workers leave ``preempted``, and the report's worker lives
    read ``scav preempted 3`` for one preemption, while the block ends said
    ``cancelled unknown`` and ``requeued unknown``. Now the lives name those ends: w1's
    block is requeued by a preemption (w1 back as a new life, alive), w2's by an
    operator (``requeued``; its next life, preempted for real, stays ``preempted``: the
    first end after it left is its own), w3's is cancelled (``cancelled``), and w4's end
    is not known yet (``preempted``). The workers table keeps the worker's word, and the
    docs' query of the lives agrees with the report's."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    blocks = {f"b{i}": "running" for i in range(1, 5)}
    status = AutoscalerStatus(
        blocks=blocks, block_pools=dict.fromkeys(blocks, "scav"),
        block_workers={f"b{i}": (f"w{i}",) for i in range(1, 5)},
    )  # fmt: skip
    recorder, writer = _recorder(db, s, autoscaler=lambda msg: status)

    def end(block: str, state: str, cause: str, at: float, run: int = 1) -> BlockEndInfo:
        return BlockEndInfo(block, "scav", state, cause, state != "requeued", WALL + at, run)

    with anyio.fail_after(LIMIT):
        await recorder.poll()  # the blocks name their workers
        for i in range(1, 5):
            _at(s, WorkerJoined, T0 + i, worker=f"w{i}", cores=1, memory=GB, pool="scav")
        for i in range(1, 5):  # SIGTERM: each leaves preempted
            _at(s, WorkerLeft, T0 + 10 + i, worker=f"w{i}", cause="preempted")
        await recorder.poll()
        status = dataclasses.replace(status, ends=(
            end("b1", "requeued", "preempted", T0 + 15), end("b2", "requeued", "unknown", T0 + 16),
            end("b3", "cancelled", "unknown", T0 + 17),
        ))  # fmt: skip
        await recorder.poll()
        _at(s, WorkerJoined, T0 + 30, worker="w1", cores=1, memory=GB, pool="scav")
        _at(s, WorkerJoined, T0 + 30, worker="w2", cores=1, memory=GB, pool="scav")
        _at(s, WorkerLeft, T0 + 40, worker="w2", cause="preempted")
        status = dataclasses.replace(
            status, ends=(*status.ends, end("b2", "requeued", "preempted", T0 + 45, 2))
        )
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT cause, count(*) FROM workers WHERE cause IS NOT NULL "
                     "GROUP BY cause") == [("preempted", 5)]  # fmt: skip
    lives = {how: n for _, how, n, *_ in _rows(db, _doc_sql("The lives of every pool"))}
    assert lives == {"preempted": 3, "requeued": 1, "cancelled": 1, "alive": 1}
    read = open_db(db)
    try:
        run = _Run(read, None, lambda line: None)
    finally:
        read.close()
    assert {(pool, how): n for pool, how, n, *_ in _lives(run)} == {
        ("scav", how): n for how, n in lives.items()
    }
    page = build_report(db)
    assert "<td>scav</td><td>cancelled</td><td>1</td><td>10.0</td>" in page
    assert "<td>scav</td><td>requeued</td><td>1</td><td>10.0</td>" in page
    assert "<th>workers</th><td>4 (6 lives, 5 ended unasked)</td>" in page  # as before


#: makes a new database one of schema version 8, as an older Corral wrote it
TO_VERSION_8 = "ALTER TABLE tasks DROP COLUMN client; UPDATE schema_version SET version = 8; "
#: makes a new database one of schema version 7, as an older Corral wrote it
TO_VERSION_7 = TO_VERSION_8 + (
    "DROP TABLE checkpoints; ALTER TABLE tries DROP COLUMN resumed; "
    "ALTER TABLE tries DROP COLUMN resumed_work; ALTER TABLE tries DROP COLUMN unsaved; "
    "UPDATE schema_version SET version = 7; "
)
#: makes a new database one of schema version 4, as an older Corral wrote it
TO_VERSION_4 = TO_VERSION_7 + (
    "DROP TABLE actions; ALTER TABLE tries DROP COLUMN retry; "
    "ALTER TABLE tries DROP COLUMN moved_to; "
    "ALTER TABLE tries DROP COLUMN traceback; ALTER TABLE tasks DROP COLUMN released; "
    "ALTER TABLE tasks DROP COLUMN cause; ALTER TABLE tasks DROP COLUMN error; "
    "ALTER TABLE tasks DROP COLUMN root; UPDATE schema_version SET version = 4; "
)


def _older(db: Path, script: str) -> None:
    """A database at ``db`` made as this Corral makes one, then changed by ``script``
    (into one of an older schema version, with its rows)."""
    MonitorWriter(db).close()
    old = sqlite3.connect(db)
    old.executescript(script)
    old.close()


def test_a_version_4_file_gets_the_failure_columns_and_is_still_read(tmp_path: Path) -> None:
    """A file of schema version 4 (no traceback, no release, no reason for a task that
    did not run): the report reads it as it is, saying its ``memory`` count may hold
    outputs released since, its failure groups without traceback; a manager writing
    into it adds the columns, empty in the rows it had (one transaction), and the
    report then names ``memory`` as held."""
    db = tmp_path / "monitoring.db"
    _older(
        db,
        TO_VERSION_4 + "INSERT INTO runs (run_id, started) VALUES ('r', 100.0); "
        "INSERT INTO tasks (run_id, key, category, finished, state, tries) "
        "VALUES ('r', 'a', 'a', 105, 'memory', 1), ('r', 'b', 'b', 106, 'erred', 1); "
        "INSERT INTO tries VALUES ('r', 'a', 1, 'a', 'w1', 104.0, 104.5, 105.0, 'ok', NULL, "
        "NULL, NULL, 8, 103.0), ('r', 'b', 1, 'b', 'w1', 104.0, 104.5, 106.0, 'error', "
        "NULL, 'ValueError', 'bad row', NULL, 103.0);",
    )  # fmt: skip
    before = _run(db, "r")
    assert not before.releases and before.states == {"memory": 1, "erred": 1}
    assert before.why_failed == [("b", "ValueError", "error", 1, "b", "w1", "ValueError: bad row",
                                  "", 1, 1)]  # fmt: skip
    assert "finished (memory: output held, or released since: this file does not say)" in (
        build_report(db, run_id="r")
    )
    MonitorWriter(db).close()
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(db, "SELECT key, state, released, cause, error, root FROM tasks ORDER BY key") == [
        ("a", "memory", None, None, None, None), ("b", "erred", None, None, None, None)
    ]  # fmt: skip
    assert _rows(db, "SELECT key, queued, traceback FROM tries ORDER BY key") == [
        ("a", 103.0, None),
        ("b", 103.0, None),
    ]
    after = _run(db, "r")
    assert after.releases and after.why_failed == before.why_failed
    assert "finished, output held (memory)</th><td>1<" in build_report(db, run_id="r")


def test_a_version_8_file_gets_the_tasks_client_column_and_is_still_read(tmp_path: Path) -> None:
    """A file of schema version 8 (no ``tasks.client``): the report reads it; a manager
    writing into it adds the column, empty in the rows it had."""
    db = tmp_path / "monitoring.db"
    _older(
        db,
        TO_VERSION_8 + "INSERT INTO runs (run_id, started) VALUES ('r', 100.0); "
        "INSERT INTO tasks (run_id, key, category, finished, state, tries) "
        "VALUES ('r', 'a', 'a', 105, 'memory', 1);",
    )
    assert "<html" in build_report(db, run_id="r").lower()
    MonitorWriter(db).close()
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(db, "SELECT key, state, client FROM tasks") == [("a", "memory", None)]


def test_a_version_3_file_gets_the_tries_waits_column_and_is_still_read(tmp_path: Path) -> None:
    """A file of schema version 3 (no ``tries.queued``): the report reads it as it is,
    its median wait from the tasks (first ready to first sent); a manager writing into
    it adds the column, empty in the rows it had, and the report still takes that run's
    waits from its tasks."""
    db = tmp_path / "monitoring.db"
    _older(
        db,
        TO_VERSION_4 + "ALTER TABLE tries DROP COLUMN queued; "
        "UPDATE schema_version SET version = 3; "
        "INSERT INTO runs (run_id, started) VALUES ('r', 100.0); "
        "INSERT INTO tasks (run_id, key, ready, started, state) "
        "VALUES ('r', 'a', 101, 104, 'memory'); "
        "INSERT INTO tries VALUES ('r', 'a', 1, 'a', 'w1', 104.0, 104.5, 105.0, 'ok', NULL, "
        "NULL, NULL, 8);",
    )  # fmt: skip
    assert _run(db, "r").median_wait == 3.0
    MonitorWriter(db).close()
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(db, "SELECT try, sent, queued, output_bytes FROM tries") == [(1, 104.0, None, 8)]
    assert _run(db, "r").median_wait == 3.0


def test_a_version_2_file_is_upgraded_to_a_row_per_life_and_still_read(tmp_path: Path) -> None:
    """A file an older Corral wrote (schema version 2, a row per worker id): the report
    reads it as it is; a manager writing into it first makes each row a first life (and
    adds ``tries.queued``, version 4)."""
    db = tmp_path / "monitoring.db"
    _older(
        db,
        TO_VERSION_4 + "ALTER TABLE tries DROP COLUMN queued; "
        "DROP TABLE workers; CREATE TABLE workers (run_id TEXT NOT NULL, worker TEXT NOT NULL, "
        "pool TEXT, block TEXT, cores INTEGER, memory INTEGER, joined REAL, left REAL, "
        "cause TEXT, joins INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (run_id, worker)); "
        "INSERT INTO workers VALUES ('r', 'w1', 'cpu', 'b1', 2, 10, 1.0, 9.0, 'crash', 3); "
        "UPDATE schema_version SET version = 2;",
    )  # fmt: skip
    read = open_db(db)
    assert read.execute("SELECT worker, joined, left FROM workers").fetchall() == [("w1", 1.0, 9.0)]
    read.close()
    MonitorWriter(db).close()
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(db, "SELECT * FROM workers") == [
        ("r", "w1", 1, "cpu", "b1", 2, 10, 1.0, 9.0, "crash", 3)
    ]
    assert _rows(db, "SELECT name FROM pragma_table_info('tries') WHERE name = 'queued'") == [
        ("queued",)
    ]
    assert _rows(db, "SELECT count(*) FROM actions") == [(0,)]  # (version 6)


@pytest.mark.anyio
async def test_a_pending_alert_that_stops_holding_ends_in_the_table_and_the_report(
    tmp_path: Path, make_state: Factory
) -> None:
    """``Busy`` goes pending, then stops holding before it fires (the alert monitor
    forgets it); ``Slow`` fires, resolves and is forgotten later: ``Busy`` gets a row
    ``inactive`` at the poll that found it gone, ``Slow`` none (its firing and resolve
    have theirs, at their times), and the report's pending span ends there."""
    db = tmp_path / "monitoring.db"
    alerts: list[AlertInfo] = []
    reply = lambda msg: AlertsReply(tuple(alerts)) if isinstance(msg, AlertsRequest) else None  # noqa: E731
    recorder, writer = _recorder(db, make_state(monitor=True), manager=reply)
    busy = AlertInfo("Busy", "pending", {"alertname": "Busy"}, value=1.0, active_since=WALL)
    slow = AlertInfo("Slow", "resolved", {"alertname": "Slow"}, fired_at=WALL, resolved_at=WALL + 1)
    with anyio.fail_after(LIMIT):
        alerts[:] = [busy, slow]
        await recorder.poll()
        await recorder.poll()  # no change: no rows
        alerts[:] = []
        await recorder.poll()
        await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT time, name, state, value, active_since FROM alerts ORDER BY rowid")
    gone = rows[-1][0]
    assert rows == [
        (WALL, "Busy", "pending", 1.0, WALL),
        (WALL, "Slow", "firing", None, None),
        (WALL + 1, "Slow", "resolved", 0.0, None),
        (gone, "Busy", "inactive", None, WALL),
    ]
    assert gone > WALL
    # the report draws Busy pending until then (not to the end of the run)
    conn = open_db(db)
    try:
        conn.execute("UPDATE runs SET started = ?, ended = ?", (WALL - 1, gone + 100))
        spans = _alert_spans(_Run(conn, None, lambda line: None))
    finally:
        conn.close()
    assert sorted(spans) == [
        (1.0, 2.0, "firing", "Slow"),
        (1.0, gone - WALL + 1.0, "pending", "Busy"),
    ]


@pytest.mark.anyio
async def test_a_resolved_alert_listed_beside_a_pending_one_of_its_labels(
    tmp_path: Path, make_state: Factory
) -> None:
    """The alert monitor lists a resolved alert beside a new one of its labels while
    that one is pending (a user audit: CIQueueTime resolved, went pending again and
    stopped holding): each keeps its own rows, none written twice; the pending one that
    stops holding ends ``inactive``, the resolved one is forgotten without a row."""
    db = tmp_path / "monitoring.db"
    alerts: list[AlertInfo] = []
    reply = lambda msg: AlertsReply(tuple(alerts)) if isinstance(msg, AlertsRequest) else None  # noqa: E731
    recorder, writer = _recorder(db, make_state(monitor=True), manager=reply)
    labels = {"alertname": "CIQueueTime", "pool": "ci"}
    done = AlertInfo("CIQueueTime", "resolved", labels, value=38.0, active_since=WALL,
                     fired_at=WALL + 15, resolved_at=WALL + 38)  # fmt: skip
    again = AlertInfo("CIQueueTime", "pending", labels, value=2.0, active_since=WALL + 100)
    with anyio.fail_after(LIMIT):
        for listed in ([done], [done, again], [done, again], [done], [done], []):
            alerts[:] = listed
            await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT time, state, active_since FROM alerts ORDER BY rowid")
    gone = rows[-1][0]
    assert rows == [
        (WALL, "pending", WALL),
        (WALL + 15, "firing", WALL),
        (WALL + 38, "resolved", WALL),
        (WALL + 100, "pending", WALL + 100),
        (gone, "inactive", WALL + 100),
    ]


@pytest.mark.anyio
async def test_alert_changes_between_two_polls_have_their_rows_at_their_times(
    tmp_path: Path, make_state: Factory
) -> None:
    """``Burst`` goes pending and fires between two polls, then resolves before the
    next: its three rows are at the times the alert gives (before, the poll saw it
    firing and wrote only that, and the resolve, each at the poll's time, so the table
    and the report had no pending span). ``Now`` fires at once (``for = 0``): no
    pending row. The report draws the pending span from 0.5 s to 2 s."""
    db = tmp_path / "monitoring.db"
    alerts: list[AlertInfo] = []
    reply = lambda msg: AlertsReply(tuple(alerts)) if isinstance(msg, AlertsRequest) else None  # noqa: E731
    recorder, writer = _recorder(db, make_state(monitor=True), manager=reply)
    burst = AlertInfo("Burst", "firing", {"alertname": "Burst"}, value=3.0,
                      active_since=WALL + 0.5, fired_at=WALL + 2)  # fmt: skip
    now = AlertInfo("Now", "firing", {"alertname": "Now"}, value=1.0, active_since=WALL + 1,
                    fired_at=WALL + 1)  # fmt: skip
    with anyio.fail_after(LIMIT):
        await recorder.poll()
        alerts[:] = [burst, now]
        await recorder.poll()
        alerts[:] = [dataclasses.replace(burst, state="resolved", resolved_at=WALL + 3), now]
        await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT time, name, state, value, fired_at, resolved_at FROM alerts "
                     "ORDER BY time, name")  # fmt: skip
    assert rows == [
        (WALL + 0.5, "Burst", "pending", None, None, None),
        (WALL + 1, "Now", "firing", 1.0, WALL + 1, None),
        (WALL + 2, "Burst", "firing", 3.0, WALL + 2, None),
        (WALL + 3, "Burst", "resolved", 3.0, WALL + 2, WALL + 3),
    ]
    conn = open_db(db)
    try:
        conn.execute("UPDATE runs SET started = ?, ended = ?", (WALL, WALL + 10))
        spans = _alert_spans(_Run(conn, None, lambda line: None))
    finally:
        conn.close()
    assert sorted(spans) == [
        (0.5, 2.0, "pending", "Burst"),
        (1.0, 10.0, "firing", "Now"),
        (2.0, 3.0, "firing", "Burst"),
    ]


def test_the_report_draws_alerts_at_their_own_times_from_an_older_file(tmp_path: Path) -> None:
    """Rows an older Corral wrote, at the time of the poll that saw each change (up to
    an interval late, the pending missed): the report draws the pending span from
    ``active_since`` to ``fired_at`` and the firing one to ``resolved_at``."""
    db = tmp_path / "monitoring.db"
    writer = MonitorWriter(db)
    writer.close()
    conn = open_db(db)
    try:
        conn.execute("INSERT INTO runs (run_id, started, ended) VALUES ('r', ?, ?)",
                     (WALL, WALL + 10))  # fmt: skip
        labels = '{"alertname": "Burst"}'
        changes = ((WALL + 2.8, "firing", None), (WALL + 4.1, "resolved", WALL + 3))
        for at, state, resolved in changes:
            conn.execute("INSERT INTO alerts VALUES ('r',?,'Burst',?,?,'{}',1.0,?,?,?,'{}')",
                         (at, state, labels, WALL + 0.5, WALL + 2, resolved))  # fmt: skip
        spans = _alert_spans(_Run(conn, "r", lambda line: None))
    finally:
        conn.close()
    assert spans == [(0.5, 2.0, "pending", "Burst"), (2.0, 3.0, "firing", "Burst")]


@pytest.mark.anyio
async def test_a_graph_larger_than_max_rows_loses_only_what_is_over(
    tmp_path: Path, make_state: Factory
) -> None:
    """A graph of 1,500 tasks submitted at once, to a writer that keeps 1,000 rows
    waiting: the oldest rows over the limit go, the rest are written."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s, max_rows=1_000)
    _at(s, WorkerJoined, 1.0, worker="w1", cores=1, memory=GB)
    keys = [f"t-{i}" for i in range(1500)]
    _at(s, GraphSubmitted, 2.0, specs=specs_for(s, {k: [] for k in keys}, keys),
        wanted=tuple(keys))  # fmt: skip
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    # Queued: the run's row, w1's, the tasks' (in pieces of writer.chunk), the run's
    # update; past 1,000, the oldest pieces go until 1,000 rows at most are left.
    kept = _count(db, "SELECT count(*) FROM tasks")
    assert 800 <= kept < 1_000  # the newest, less at most a piece (a tenth of max_rows)
    assert writer.dropped == {"event": 1503 - writer.written}


@pytest.mark.anyio
async def test_a_block_that_ends_between_two_polls_has_its_rows(
    tmp_path: Path, make_state: Factory
) -> None:
    """Between two polls, block-2 is asked for and fails, and block-1 is requeued by a
    preemption: both ends are written with their time and cause, from the autoscaler's
    list of ends, once each. Before, only the states seen at polls were: block-2 left
    no row and block-1 went from running to pending with no cause."""
    db = tmp_path / "monitoring.db"
    status = AutoscalerStatus(blocks={"block-1": "running"}, block_pools={"block-1": "cpu"})
    recorder, writer = _recorder(db, make_state(monitor=True), autoscaler=lambda msg: status)
    with anyio.fail_after(LIMIT):
        await recorder.poll()
        status = AutoscalerStatus(
            blocks={"block-1": "pending"}, block_pools={"block-1": "cpu"},
            incarnations={"block-1": 2},
            ends=(BlockEndInfo("block-2", "cpu", "failed", "crash", True, WALL + 0.5),
                  BlockEndInfo("block-1", "cpu", "requeued", "preempted", False, WALL + 1.0, 1)),
        )  # fmt: skip
        await recorder.poll()
        await recorder.poll()  # the same ends: no rows again
        # ... nor when their times are worked out again, a microsecond off (they are
        # Unix times the autoscaler computes anew from its clock at each answer)
        status = dataclasses.replace(
            status, ends=tuple(dataclasses.replace(e, at=e.at + 1e-6) for e in status.ends)
        )
        await recorder.poll()
    writer.close()
    rows = _rows(db, "SELECT block, state, time - ?, cause FROM blocks ORDER BY time", WALL)
    assert [r for r in rows if r[1] in ("failed", "requeued")] == [
        ("block-2", "failed", 0.5, "crash"),
        ("block-1", "requeued", 1.0, "preempted"),
    ]
    assert sorted(r[1] for r in rows if r[0] == "block-1") == ["pending", "requeued", "running"]


def test_docs_say_the_schema_version_written_and_upgraded() -> None:
    """docs/monitoring.md's "a schema version this Corral writes (N) or upgrades (...)"
    is the runtime's SCHEMA_VERSION and UPGRADED_VERSIONS (it said 7 when 8 was written),
    and so is the version its schema section gives, whose history has a line for it."""
    text = " ".join((Path(__file__).parent.parent / "docs" / "monitoring.md").read_text().split())
    upgraded = ", ".join(str(v) for v in UPGRADED_VERSIONS)
    assert f"Corral writes ({SCHEMA_VERSION}) or upgrades ({upgraded})" in text
    # and its schema section (a user audit, parslmig 9: it said 8, and its history
    # stopped at 8)
    assert f"`schema_version` holds the version ({SCHEMA_VERSION});" in text
    assert f"Version {SCHEMA_VERSION} added" in text


def test_a_manager_keeping_a_day_removes_the_ended_run_directories_older_than_that(
    tmp_path: Path,
) -> None:
    """Each start of a manager makes a run directory; --monitoring-keep pruned only
    its own file, so a service restarted by systemd left one database per start for
    ever (longrun audit). Started with --monitoring-keep 1d, a manager removes, beside
    its own, the manager run directories whose files were last written more than a
    day ago and that no process has open, and logs each: an ended one and a crashed
    one (an unlocked -shm) go; a run another live process has open (its -shm locked,
    as a quiet manager's) stays, however old its files, and so do a recent run, a
    demo's, one holding a report, and anything not named as a run."""
    home = tmp_path / "home"
    runs = home / "runs"
    old = time.time() - 2 * 86400

    def run(name: str, *extra: str) -> Path:
        (runs / name).mkdir(parents=True)
        MonitorWriter(runs / name / "monitoring.db").close()
        for f in extra:
            (runs / name / f).write_bytes(b"")
        return runs / name

    def age(d: Path) -> None:
        for f in (*d.iterdir(), d):
            os.utime(f, (old, old))

    ended = run("20261201-000000-aaaaaa")
    crashed = run("20261201-000001-cccccc", "monitoring.db-shm", "monitoring.db-wal")
    recent = run("20261201-000002-dddddd")
    demo = run("20261201-000003-eeeeee-demo")
    reported = run("20261201-000004-ffffff", "report.html")
    other = run("not-a-run")
    live = run("20261201-000005-bbbbbb")
    holder = (  # a live writer that writes nothing more once open (a quiet manager)
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
        "c.execute('SELECT count(*) FROM runs').fetchall(); print('open', flush=True); "
        "time.sleep(120)"
    )
    with Cli(home) as cli:
        a = cli.spawn([sys.executable, "-c", holder, str(live / "monitoring.db")])
        cli.line_with(a, "open")
        assert (live / "monitoring.db-shm").exists()
        for d in (ended, crashed, demo, reported, other, live):
            age(d)
        b = cli.start(
            "--log-level", "info", "manager",
            "--listen", f"127.0.0.1:{free_port_between(44000, 44999)}", "--monitoring-keep", "1d",
        )  # fmt: skip
        seen: list[str] = []
        own = Path(cli.line_with(b, "monitoring database:", seen=seen).split(": ", 1)[1].strip())
        cli.line_with(b, "manager listening on", seen=seen)  # (the removal comes before it)
        left = sorted(p.name for p in runs.iterdir())
        assert own.parent.parent == runs and own.parent.name in left
    removed = [ln for ln in seen if "an ended run older than the history kept removed" in ln]
    assert sorted(Path(ln.split("path='", 1)[1].split("'", 1)[0]) for ln in removed) == [
        ended, crashed,
    ]  # fmt: skip
    assert set(left) == {p.name for p in (recent, demo, reported, other, live)} | {own.parent.name}
