"""The monitoring database: an SQLite file of what a run did, for SQL and the report.

What lives here: the schema (:data:`SCHEMA`, version :data:`SCHEMA_VERSION`),
:class:`MonitorWriter` (a writer thread: batches written in one transaction each, off
the event loop, in WAL mode), :class:`MonitorRecorder` (the actor in the manager's
process that pulls what happened every ``interval`` seconds and hands it to the
writer), :func:`default_path` (where a manager puts it by default) and
:func:`open_db` (opens one for reading, also one this user may only read, with a
:class:`~runtime.errors.MonitoringDBError` when it is not one or cannot be read where it
is). A writer looks at an existing file read-only first and refuses, leaving it as it
was, one that is not empty and not a monitoring database of a version it writes, and
one of an older version that a live process has open; it upgrades one of an older
version in place after keeping a copy of it as it was (:class:`Upgraded`).

Where the rows come from:

- every :data:`FEED_EVERY` seconds, sooner in a burst: the scheduler's monitoring feed
  (``MonitorFeed``: its core's numbered entries since the last read, task transitions,
  tries ended and the retries that followed them, workers joining and leaving), merged
  into one ``tasks`` row per task touched, and rows of ``tries`` (a retry: its try's
  ``retry`` and ``moved_to``) and ``workers``; a feed that overflowed between two
  reads leaves a row in ``gaps``;

and every ``interval``:

- each worker's latest memory and disk numbers: ``resource_samples``, a row per worker
  when they changed, and at least every :data:`METRIC_HEARTBEAT` seconds;
- the autoscaler's status: a row in ``blocks`` per block state change;
- the manager's ``MetricsReply`` (the numbers ``GET /metrics`` serves, under the same
  names): ``metric_samples``, a row per series when its value changed, and at least
  every :data:`METRIC_HEARTBEAT` seconds (a reader holds a series' last value); a gauge
  series gone from the snapshot gets a row of 0 (a counter's last row holds its total);
- the manager's ``AlertsReply``: a row in ``alerts`` per alert state change, at the
  time the alert gives it, and a row in ``actions`` per remediation audit entry (its
  ``actions``, numbered: each written once).

The writer never blocks its callers: :meth:`MonitorWriter.submit` queues the rows and
returns. Past ``max_rows`` rows waiting (a slow or locked disk), it drops metric
samples first, then resource samples, then the oldest events, and counts what it
dropped (``runs.dropped_rows``). docs/monitoring.md documents the schema.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import socket
import sqlite3
import sys
import threading
import time
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from runtime.client_ids import client_name
from runtime.errors import ActorStopped, AskTimeout, MonitoringDBError
from runtime.home import corral_home, private_dir
from runtime.kernel import Actor, ActorRef
from runtime.log import get_logger
from runtime.messages import (
    AlertInfo,
    AlertsReply,
    AlertsRequest,
    AutoscalerStatus,
    MetricsReply,
    MetricsRequest,
    MonitorFeed,
    MonitorFeedReply,
    StatusRequest,
)

if TYPE_CHECKING:
    from actors.scheduler_records import ErrorRecord

# The recorder's helpers from actors.scheduler and runtime.metrics (with aiohttp and
# dask, about a second under load) are imported where the recorder uses them, not
# here: the report and `report --list` read the file through open_db without them.

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "MonitorRecorder",
    "MonitorWriter",
    "Upgraded",
    "default_path",
    "give_up_all",
    "open_db",
    "prune",
    "prune_runs",
]

_log = get_logger("corral.monitoring")

#: 2: storage over time (disk columns, transfers, recoveries); 3: a row per worker life;
#: 4: ``tries.queued`` (when the task became ready for the try: its wait); 5: why tries
#: and tasks failed: ``tries.traceback``, ``tasks.released`` (an output released:
#: state ``released``), ``tasks.cause``, ``tasks.error`` and ``tasks.root`` (a task
#: that erred with no failed try of its own), and the failure causes of the metrics;
#: 6: the table ``actions`` (the alert monitor's remediation audit); 7: what followed a
#: failed try, ``tries.retry`` (``free``, ``charged``) and ``tries.moved_to`` (the pool its
#: retry was moved to), and ``tries.started`` of a try lost with a worker that said when
#: it began; 8: checkpoints, ``tries.resumed`` and ``tries.resumed_work`` (the
#: checkpoint a try started from, the seconds of work it held) and ``tries.unsaved``
#: (of a try lost with its worker, the work no surviving checkpoint held), and the
#: table ``checkpoints`` (each saved, each lost with every copy of it); 9:
#: ``tasks.client`` (the name of the client that submitted the task); 10: the table
#: ``moves`` (each waiting or queued task moved to another pool or priority)
#: 11: the table ``policies`` (each policy swap: who, when, to what, or why the
#: scheduler did it)
SCHEMA_VERSION = 11
#: older versions a writer upgrades to :data:`SCHEMA_VERSION` (see :func:`_upgrade`)
UPGRADED_VERSIONS = (2, 3, 4, 5, 6, 7, 8, 9, 10)
#: versions the report reads (the columns it asks for are in each; ``tries.queued``,
#: ``tries.traceback``, the columns of version 5 in ``tasks`` and the table ``actions``
#: only when there: see runtime/report.py)
READABLE_VERSIONS = frozenset({*UPGRADED_VERSIONS, SCHEMA_VERSION})

#: the columns of ``workers``: one row per worker life
_WORKERS = """
    run_id TEXT NOT NULL, worker TEXT NOT NULL, life INTEGER NOT NULL DEFAULT 1, pool TEXT,
    block TEXT, cores INTEGER, memory INTEGER, joined REAL, left REAL, cause TEXT,
    joins INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (run_id, worker, life)
"""
#: one statement per table; times are Unix seconds (REAL), sizes bytes
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started REAL NOT NULL, last_seen REAL, ended REAL,
    host TEXT, pid INTEGER, argv TEXT, python TEXT,
    feed_lost INTEGER NOT NULL DEFAULT 0, dropped_rows INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tasks (
    run_id TEXT NOT NULL, key TEXT NOT NULL, category TEXT, pool TEXT,
    submitted REAL, ready REAL, started REAL, finished REAL, state TEXT, worker TEXT,
    tries INTEGER NOT NULL DEFAULT 0, duration REAL, output_bytes INTEGER,
    released REAL, cause TEXT, error TEXT, root TEXT, client TEXT,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS tries (
    run_id TEXT NOT NULL, key TEXT NOT NULL, try INTEGER NOT NULL, category TEXT,
    worker TEXT, sent REAL, started REAL, ended REAL, outcome TEXT NOT NULL, cause TEXT,
    error_type TEXT, error_message TEXT, output_bytes INTEGER, queued REAL, traceback TEXT,
    retry TEXT, moved_to TEXT, resumed INTEGER, resumed_work REAL, unsaved REAL,
    PRIMARY KEY (run_id, key, try)
);
CREATE TABLE IF NOT EXISTS workers ({_WORKERS});
CREATE TABLE IF NOT EXISTS blocks (
    run_id TEXT NOT NULL, block TEXT NOT NULL, pool TEXT, state TEXT NOT NULL,
    time REAL NOT NULL, cause TEXT
);
CREATE TABLE IF NOT EXISTS resource_samples (
    run_id TEXT NOT NULL, time REAL NOT NULL, worker TEXT NOT NULL, rss INTEGER,
    memory_bytes INTEGER, spilled_bytes INTEGER, disk_free INTEGER, disk INTEGER
);
CREATE TABLE IF NOT EXISTS transfers (
    run_id TEXT NOT NULL, time REAL NOT NULL, key TEXT NOT NULL, kind TEXT NOT NULL,
    bytes INTEGER NOT NULL, source TEXT, target TEXT NOT NULL, duration REAL
);
CREATE TABLE IF NOT EXISTS recoveries (
    run_id TEXT NOT NULL, time REAL NOT NULL, key TEXT NOT NULL, category TEXT,
    worker TEXT NOT NULL, how TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metric_samples (
    run_id TEXT NOT NULL, time REAL NOT NULL, name TEXT NOT NULL, labels TEXT NOT NULL,
    value REAL
);
CREATE TABLE IF NOT EXISTS alerts (
    run_id TEXT NOT NULL, time REAL NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL,
    labels TEXT, annotations TEXT, value REAL, active_since REAL, fired_at REAL,
    resolved_at REAL, fields TEXT
);
CREATE TABLE IF NOT EXISTS gaps (
    run_id TEXT NOT NULL, time REAL NOT NULL, source TEXT NOT NULL, lost INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    run_id TEXT NOT NULL, time REAL NOT NULL, rule TEXT, labels TEXT, pool TEXT,
    action TEXT NOT NULL, from_target INTEGER, to_target INTEGER, why TEXT,
    line TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL, time REAL NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL,
    event TEXT NOT NULL, worker TEXT, work REAL
);
CREATE TABLE IF NOT EXISTS moves (
    run_id TEXT NOT NULL, time REAL NOT NULL, key TEXT NOT NULL, from_pool TEXT,
    to_pool TEXT, from_priority REAL, to_priority REAL
);
CREATE TABLE IF NOT EXISTS policies (
    run_id TEXT NOT NULL, time REAL NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    params TEXT, by TEXT, why TEXT
);
CREATE INDEX IF NOT EXISTS tries_worker ON tries (run_id, worker, started);
CREATE INDEX IF NOT EXISTS tasks_pool ON tasks (run_id, pool, ready);
CREATE INDEX IF NOT EXISTS blocks_time ON blocks (run_id, time);
CREATE INDEX IF NOT EXISTS blocks_block ON blocks (run_id, block, time);
CREATE INDEX IF NOT EXISTS resource_time ON resource_samples (run_id, time);
CREATE INDEX IF NOT EXISTS metric_name ON metric_samples (run_id, name, time);
CREATE INDEX IF NOT EXISTS transfers_time ON transfers (run_id, time);
CREATE INDEX IF NOT EXISTS recoveries_time ON recoveries (run_id, time);
"""

#: a version 2 file's workers, one row per worker id, become lives 1 (see _create)
_WORKERS_V2_TO_V3 = f"""
ALTER TABLE workers RENAME TO workers_v2;
CREATE TABLE workers ({_WORKERS});
INSERT INTO workers (run_id, worker, life, pool, block, cores, memory, joined, left, cause,
                     joins)
    SELECT run_id, worker, 1, pool, block, cores, memory, joined, left, cause, joins
    FROM workers_v2;
DROP TABLE workers_v2;
UPDATE schema_version SET version = 3;
"""
#: a version 3 file's tries get ``queued``, empty in the rows it has (see _upgrade)
_TRIES_V3_TO_V4 = """
ALTER TABLE tries ADD COLUMN queued REAL;
UPDATE schema_version SET version = 4;
"""
#: a version 4 file's tries get ``traceback``, its tasks ``released``, ``cause``,
#: ``error`` and ``root``, empty in the rows it has (see _upgrade)
_FAILURES_V4_TO_V5 = """
ALTER TABLE tries ADD COLUMN traceback TEXT;
ALTER TABLE tasks ADD COLUMN released REAL;
ALTER TABLE tasks ADD COLUMN cause TEXT;
ALTER TABLE tasks ADD COLUMN error TEXT;
ALTER TABLE tasks ADD COLUMN root TEXT;
UPDATE schema_version SET version = 5;
"""
#: a version 5 file gets the table ``actions`` (made by :data:`SCHEMA`, after the
#: upgrade, in the same transaction: see _create)
_ACTIONS_V5_TO_V6 = """
UPDATE schema_version SET version = 6;
"""
#: a version 6 file's tries get ``retry`` and ``moved_to``, empty in the rows it has
#: (see _upgrade)
_RETRIES_V6_TO_V7 = """
ALTER TABLE tries ADD COLUMN retry TEXT;
ALTER TABLE tries ADD COLUMN moved_to TEXT;
UPDATE schema_version SET version = 7;
"""
#: a version 7 file's tries get ``resumed``, ``resumed_work`` and ``unsaved``, empty in
#: the rows it has, and the table ``checkpoints`` (made by :data:`SCHEMA`: see _create)
_CHECKPOINTS_V7_TO_V8 = """
ALTER TABLE tries ADD COLUMN resumed INTEGER;
ALTER TABLE tries ADD COLUMN resumed_work REAL;
ALTER TABLE tries ADD COLUMN unsaved REAL;
UPDATE schema_version SET version = 8;
"""
#: a version 8 file's tasks get ``client``, empty in the rows it has (see _upgrade)
_CLIENT_V8_TO_V9 = """
ALTER TABLE tasks ADD COLUMN client TEXT;
UPDATE schema_version SET version = 9;
"""
#: a version 9 file gets the table ``moves`` (made by :data:`SCHEMA`, after the upgrade,
#: in the same transaction: see _create)
_MOVES_V9_TO_V10 = """
UPDATE schema_version SET version = 10;
"""
#: a version 10 file gets the table ``policies`` (made by :data:`SCHEMA`, after the
#: upgrade, in the same transaction: see _create)
_POLICIES_V10_TO_V11 = """
UPDATE schema_version SET version = 11;
"""
#: what upgrades a file of each older version to :data:`SCHEMA_VERSION`
_STEPS = (
    _WORKERS_V2_TO_V3,
    _TRIES_V3_TO_V4,
    _FAILURES_V4_TO_V5,
    _ACTIONS_V5_TO_V6,
    _RETRIES_V6_TO_V7,
    _CHECKPOINTS_V7_TO_V8,
    _CLIENT_V8_TO_V9,
    _MOVES_V9_TO_V10,
    _POLICIES_V10_TO_V11,
)  #: each version's step to the next, from version 2's on
_UPGRADES = {v: "".join(_STEPS[v - 2 :]) for v in UPGRADED_VERSIONS}
#: what an older database lacks, said when one is opened
_OLDER = (
    " (an older Corral wrote it: it has no disk columns in resource_samples and no "
    "transfers or recoveries tables)"
)

#: what the writer sheds first when it falls behind, in order
_SHED_ORDER = ("metric", "resource")

#: one operation: (kind, SQL, parameter rows); ``kind`` is metric, resource or event
Op = tuple[str, str, list[tuple[Any, ...]]]

#: rows an operation is queued in at most (a tenth of ``max_rows`` if less): past
#: ``max_rows``, the writer sheds what is over, not a whole graph's submission
CHUNK = 10_000
FINAL_GRACE = 5.0  #: seconds past close()'s timeout its final rows are tried for

#: ``keep``: the rows older than it are deleted, by this time of theirs; a row whose
#: time is NULL (a task not finished, a worker that has not left) stays. ``runs`` stay.
PRUNED = {
    "tasks": "finished", "tries": "COALESCE(ended, started, sent)", "workers": "left",
    "blocks": "time", "resource_samples": "time", "transfers": "time",
    "recoveries": "time", "metric_samples": "time", "alerts": "time", "gaps": "time",
    "actions": "time", "checkpoints": "time", "moves": "time",
    "policies": "time",
}  # fmt: skip
PRUNE_EVERY = 600.0  #: seconds between two prunings of a writer with ``keep``
PRUNE_PIECE = 50_000  #: rowids gone through per transaction (readers and the writer go between)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE``): committed, or rolled back if the
    block raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


def prune(
    conn: sqlite3.Connection,
    before: float,
    piece: int = PRUNE_PIECE,
    stop: Callable[[], bool] | None = None,
) -> Counter[str]:
    """Delete the rows of :data:`PRUNED` whose time is before ``before`` (Unix seconds);
    returns the rows deleted per table. Each table is gone through in ranges of
    ``piece`` rowids, one transaction each (nothing indexes these times, so a pruning
    reads every row once, in SQLite: 0.4-0.7 s for three million rows with none to
    delete on this project's test machine). ``stop()`` true between two ranges: it
    stops there (a writer closing)."""
    deleted: Counter[str] = Counter()
    for table, when in PRUNED.items():
        first, last = conn.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        if first is None:
            continue
        # the names are PRUNED's
        delete = f"DELETE FROM {table} WHERE rowid >= ? AND rowid < ? AND {when} < ?"
        for start in range(first, last + 1, piece):
            if stop is not None and stop():
                return +deleted
            with _immediate(conn):
                deleted[table] += conn.execute(delete, (start, start + piece, before)).rowcount
    return +deleted


def default_path(root: str | os.PathLike[str] | None = None) -> Path:
    """Where a manager process writes its database when not told:
    ``~/.corral/runs/<UTC time>-<id>/monitoring.db``. Instead of ``~/.corral/runs``:
    ``root``, else ``$CORRAL_RUNS_DIR``, else ``$CORRAL_HOME/runs``."""
    base = Path(root or os.environ.get("CORRAL_RUNS_DIR") or corral_home() / "runs")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return base / f"{stamp}-{uuid.uuid4().hex[:6]}" / "monitoring.db"


#: the files a run directory holds: its monitoring database, and SQLite's beside it
RUN_FILES = frozenset(f"monitoring.db{tail}" for tail in ("", "-wal", "-shm", "-journal"))
#: the name of a manager's run directory (:func:`default_path`'s)
_MANAGER_RUN = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def run_dirs(runs: Path, name: re.Pattern[str]) -> list[Path]:
    """The directories in ``runs`` whose name ``name`` matches in full and that hold
    nothing but a monitoring database (:data:`RUN_FILES`: one where a file was put, a
    report say, is not one), symlinks left out; sorted by name, which is by time."""
    found = []
    with contextlib.suppress(OSError):
        for entry in runs.iterdir():
            if entry.is_symlink() or not name.fullmatch(entry.name):
                continue
            try:
                if entry.is_dir() and {f.name for f in entry.iterdir()} <= RUN_FILES:
                    found.append(entry)
            except OSError:
                continue
    return sorted(found)


def remove_run_dir(run: Path) -> bool:
    """Remove a directory of :func:`run_dirs` (its files, then it); whether it went."""
    try:
        for name in RUN_FILES:
            (run / name).unlink(missing_ok=True)
        run.rmdir()
    except OSError:
        return False
    return True


def being_written(db: Path) -> bool:
    """Whether a live process has ``db`` open through SQLite (WAL mode): each open
    connection holds a shared lock on byte 128 of its ``-shm`` (SQLite's "dead man
    switch"), which an exclusive lock tried here then fails on. No ``-shm``: nobody;
    one left by a crashed process: not locked. One this user cannot lock: counted as
    written (never removed). The lock is let go at once. (POSIX locks are a process's:
    call it only on a database this process has not opened.)"""
    try:
        fd = os.open(f"{db}-shm", os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 128)
        return False
    finally:
        os.close(fd)


def prune_runs(current: Path, keep: float, now: float | None = None) -> list[Path]:
    """Remove the manager run directories beside ``current``'s (the database of this
    run, in a directory of :func:`default_path`) whose run is over and older than
    ``keep`` seconds: named as a manager's (a demo's, ``-demo``, are
    :func:`runtime.demo.prune_demo_runs`'), holding nothing but a monitoring database,
    none of its files written for ``keep`` seconds, and no process that has it open
    (:func:`being_written`: another live manager's is never removed, however quiet).
    Each one removed is logged (info); returns them."""
    now = time.time() if now is None else now
    removed = []
    for run in run_dirs(current.parent.parent, _MANAGER_RUN):
        if run == current.parent:
            continue
        try:
            last = max(f.stat().st_mtime for f in (run, *run.iterdir()))
        except OSError:
            continue
        if now - last <= keep or being_written(run / "monitoring.db"):
            continue
        if remove_run_dir(run):
            removed.append(run)
            _log.info(
                "monitoring database: an ended run older than the history kept removed",
                path=str(run), last_write=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(last)),
                keep_s=keep,
            )  # fmt: skip
    return removed


def _connect(path: str, *, uri: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, uri=uri)
    conn.execute("PRAGMA busy_timeout = 1000")
    return conn


#: the tables Corral makes (see :data:`SCHEMA`)
_TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))
#: the tables every version Corral writes or upgrades has
_CORE = frozenset({"schema_version", "runs", "tasks", "tries", "workers"})
#: the first bytes of every SQLite database file
SQLITE_HEADER = b"SQLite format 3\0"
#: what SQLite calls a file it may not write, or a -wal/-shm it may not make
_READ_ONLY_ERRORS = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")


def _uri(path: Path, **params: str) -> str:
    """``path`` as an SQLite URI (``file:///...``, its ``?`` and ``#`` escaped)."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{Path(os.path.abspath(path)).as_uri()}?{query}"


def _no_wal(path: Path) -> bool:
    """Whether no process can be writing ``path`` through a write-ahead log, so that
    its main file is all of it: no ``-wal`` file, or an empty one with no ``-shm``
    (every connection makes them and the last one to close deletes them)."""
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    try:
        return wal.stat().st_size == 0 and not shm.exists()
    except FileNotFoundError:
        return True


def _is_wal(path: Path) -> bool:
    """Whether ``path``'s header says WAL mode (file format bytes 18-19 are 2)."""
    try:
        with path.open("rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return head.startswith(SQLITE_HEADER) and head[18:20] == b"\x02\x02"


def _peek(path: Path) -> sqlite3.Connection:
    """A read-only connection to ``path`` that changes nothing: not the file, and no
    ``-wal``/``-shm`` left behind (a read-only connection makes them for a WAL
    database and cannot delete them: with none there, no one writes it, and the
    main file is read as it is)."""
    if _is_wal(path) and _no_wal(path):
        return _connect(_uri(path, mode="ro", immutable="1"), uri=True)
    return _connect(_uri(path, mode="ro"), uri=True)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


#: the indexes Corral makes (see :data:`SCHEMA`)
_INDEXES = frozenset(re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", SCHEMA))
#: seconds a manager waits, as it starts, for another's write to the same file to end
CREATE_WAIT = 30.0


def _current(conn: sqlite3.Connection) -> bool:
    """Whether the database ``conn`` reads has this version's whole schema (nothing to
    create or upgrade). Reads only."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    if not (names >= _TABLES | _INDEXES):
        return False
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return row is not None and row[0] == SCHEMA_VERSION


def _check_writable(conn: sqlite3.Connection, path: Path) -> None:
    """Raise :class:`~runtime.errors.MonitoringDBError` unless Corral may write into
    the database ``conn`` reads: an empty one, or a monitoring database of a schema
    version it writes or upgrades. Reads only."""
    tables = _tables(conn)
    if not tables:
        return
    if "schema_version" in tables and "tasks" in tables:
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        if row is None and tables <= _TABLES:
            return  # made by a Corral stopped before it wrote its version
        if row is not None and isinstance(row[0], int):
            if row[0] in (*UPGRADED_VERSIONS, SCHEMA_VERSION) and tables >= _CORE:
                return
            if row[0] not in (*UPGRADED_VERSIONS, SCHEMA_VERSION):
                raise MonitoringDBError(
                    str(path),
                    f"it has schema version {row[0]}, this Corral writes {SCHEMA_VERSION}"
                    f"{_OLDER if row[0] < SCHEMA_VERSION else ''}: give --monitoring another "
                    "path",
                )
    others = sorted(tables - _TABLES) or sorted(tables)
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    raise MonitoringDBError(
        str(path),
        f"an SQLite database of another program (tables: {shown}), not a Corral monitoring "
        "database; it was left as it is: give --monitoring a new path (or the database of "
        "an earlier Corral run)",
    )


class Upgraded(NamedTuple):
    """An older file :func:`_create` upgraded in place to :data:`SCHEMA_VERSION`."""

    was: int  #: the schema version it had
    copy: Path  #: the file as it was (:func:`_keep_copy`), which that version's Corral reads


def _version(conn: sqlite3.Connection) -> int | None:
    """The schema version of the database ``conn`` reads (None: no version yet)."""
    if "schema_version" not in _tables(conn):
        return None
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return row[0] if row is not None and isinstance(row[0], int) else None


def _refuse_live_upgrade(path: Path, was: int) -> None:
    """Raise :class:`~runtime.errors.MonitoringDBError` when a live process has
    ``path``, of the older schema version ``was``, open (:func:`being_written`): an
    older Corral's run writing into it would have every later write refused once the
    file is upgraded under it (its tables get columns its statements do not fill)."""
    if being_written(path):
        raise MonitoringDBError(
            str(path),
            f"it has schema version {was}, and a live process has it open: an older "
            f"Corral's run is writing into it now (or a program reads it). Upgrading it to "
            f"version {SCHEMA_VERSION} under that run would make the run's writes fail: "
            "stop it first, or give --monitoring another path",
        )


def _keep_copy(path: Path, was: int) -> Path:
    """Copy the database ``path`` (in the transaction that upgrades it, before it
    changes anything) with SQLite's backup API to ``PATH.schemaN`` (``N``: ``was``), or, that
    name taken (a copy kept before), ``PATH.schemaN.2``, ``.3``...: no file is
    overwritten. The copy is its owner's alone, as the database. Returns its path;
    :class:`~runtime.errors.MonitoringDBError` (the upgrade not made) when it cannot be
    written."""
    for n in itertools.count(1):
        copy = Path(f"{path}.schema{was}{'' if n == 1 else f'.{n}'}")
        try:
            os.close(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            continue
        except OSError as exc:
            raise MonitoringDBError(str(path), _no_copy(was, exc)) from exc
        break
    try:  # read through another connection: SQLite's backup refuses ``conn``, which
        # holds the write lock (no other writer comes between: the copy is as upgraded)
        src, dest = _connect(str(path)), sqlite3.connect(copy)
        try:
            src.backup(dest)
        finally:
            src.close()
            dest.close()
    except (OSError, sqlite3.Error) as exc:
        copy.unlink(missing_ok=True)
        raise MonitoringDBError(str(path), _no_copy(was, exc)) from exc
    return copy


def _no_copy(was: int, exc: BaseException) -> str:
    return (
        f"schema version {was}: this Corral upgrades it to version {SCHEMA_VERSION} in place "
        f"after keeping a copy of it as it is beside it, and that copy cannot be written "
        f"({exc}); it was left as it is: make room there, or give --monitoring another path"
    )


def _create(path: Path) -> Upgraded | None:
    """Create (or reopen) ``path`` with the schema, in WAL mode. An existing file is
    looked at first, read-only: one that is not empty and not a monitoring database
    of a version Corral writes is refused unchanged (no table, no WAL mode); one of an
    older version that a live process has open (an older Corral's run writing into
    it) is refused unchanged (:func:`_refuse_live_upgrade`). One of an older version is
    copied as it is (:func:`_keep_copy`) and upgraded (:func:`_upgrade`): returns
    what was done (None: nothing upgraded)."""
    try:
        private_dir(path.parent)
    except OSError as exc:
        raise MonitoringDBError(str(path), f"cannot create it: {exc}") from exc
    if path.is_dir():
        raise MonitoringDBError(
            str(path), f"a directory: give --monitoring a file, e.g. {path / 'monitoring.db'}"
        )
    try:  # a new database is its owner's alone (SQLite gives its -wal, -shm the same)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise MonitoringDBError(str(path), f"cannot create it: {exc}") from exc
    was = None
    try:
        if path.exists() and path.stat().st_size > 0:
            peek = _peek(path)
            try:
                _check_writable(peek, path)
                if _is_wal(path) and _current(peek):
                    return None  # nothing to make: no write lock to wait for (another
                    # manager writing into it, sharing the path, goes on)
                was = _version(peek)
            finally:
                peek.close()
    except sqlite3.DatabaseError as exc:
        raise MonitoringDBError(str(path), _why_not(exc, "Corral can write")) from exc
    except OSError as exc:
        raise MonitoringDBError(str(path), f"cannot read it: {exc}") from exc
    if was in _UPGRADES:  # (with no connection of this process open on it: being_written)
        _refuse_live_upgrade(path, was)
    upgraded = None
    try:
        conn = _connect(str(path))
    except (OSError, sqlite3.Error) as exc:
        raise MonitoringDBError(str(path), f"cannot create it: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(CREATE_WAIT * 1000)}")  # a writer's batch
        conn.execute("BEGIN IMMEDIATE")
        try:
            _check_writable(conn, path)  # again, in the transaction that changes it
            was = _version(conn)
            if was in _UPGRADES:  # (another manager may have upgraded it meanwhile)
                upgraded = Upgraded(was, _keep_copy(path, was))
                _upgrade(conn)
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version SELECT ? WHERE NOT EXISTS "
                "(SELECT 1 FROM schema_version)",
                (SCHEMA_VERSION,),
            )
        except BaseException:
            if conn.in_transaction:  # (SQLite ends it itself on some errors)
                conn.execute("ROLLBACK")
            if upgraded is not None:  # the file stays as it was: no copy of it needed
                upgraded.copy.unlink(missing_ok=True)
            raise
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode = WAL")
    except sqlite3.DatabaseError as exc:
        raise MonitoringDBError(str(path), _why_not(exc, "Corral can write")) from exc
    finally:
        conn.close()
    if upgraded is not None:
        _log.warning(
            f"monitoring database: upgraded in place from schema version {upgraded.was} to "
            f"{SCHEMA_VERSION} (worker lives, try waits, tracebacks, released outputs, why "
            "tasks that did not run erred, alert actions, retries, checkpoints, clients, task "
            "moves, policy swaps); the file as it was is kept beside it: an older Corral "
            "reads that copy, not this file",
            path=str(path), copy=str(upgraded.copy),
        )  # fmt: skip
    return upgraded


def _why_not(exc: sqlite3.DatabaseError, what: str = "") -> str:
    """Why a database could not be used: locked by another process (busy past the
    connection's timeout), read-only for this user, or not an SQLite database at all."""
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return (
            f"locked by another process ({exc}): a program holds it locked (an exclusive "
            "transaction or locking_mode); try again once it lets go, or read a copy"
        )
    if str(getattr(exc, "sqlite_errorname", "")).startswith(_READ_ONLY_ERRORS):
        if what:  # to write
            return (
                f"read-only for this user ({exc}): give --monitoring a path in a directory "
                "you can write"
            )
        return (
            f"read-only for this user ({exc}), and SQLite must write beside it to read its "
            "-wal file (left by a run that goes on or was killed): copy it (and its -wal) "
            "somewhere writable and report the copy"
        )
    return f"not an SQLite database{' ' + what if what else ''} ({exc})"


def _upgrade(conn: sqlite3.Connection) -> None:
    """A file of version 2 to 10 becomes version 11, in the caller's transaction:
    from 2 (a row per worker id) its workers' rows become their first lives (version
    3); from 3, its tries get the column ``queued``, empty in the rows they have (their
    waits were not recorded: the report takes those runs' waits from ``tasks``); from
    4, its tries get ``traceback`` and its tasks ``released``, ``cause``, ``error`` and
    ``root``, empty in the rows they have (not recorded: the report says so); from 5,
    it gets the table ``actions`` (the caller makes it with the schema), with no row
    for its runs (their audit went to the log only); from 6, its tries get ``retry``
    and ``moved_to``, empty in the rows they have (not recorded: the report says so);
    from 7, its tries get ``resumed``, ``resumed_work`` and ``unsaved``, empty in the
    rows they have (not recorded: the report says so), and the table ``checkpoints``
    (the caller makes it with the schema), with no row for its runs; from 8, its
    tasks get ``client``, empty in the rows they have; from 9, it gets the table
    ``moves`` (the caller makes it with the schema), with no row for its runs (their
    moves were in the tasks' stories only); from 10, it gets the table ``policies`` (the
    caller makes it with the schema), with no row for its runs."""
    was = _version(conn)
    if was not in _UPGRADES:
        return
    for statement in _UPGRADES[was].split(";"):
        if statement.strip():
            conn.execute(statement)


def _open_reading(p: Path) -> tuple[sqlite3.Connection, set[str]]:
    """A connection to ``p`` and the names in its schema. As any SQLite program
    would, read-write when this user may write it (a reader then shares the run's
    ``-shm``, live or not), else read-only. A WAL database in a directory this user
    cannot write, with no ``-wal``/``-shm`` to share (its run is over: the last
    connection deletes them), is opened ``immutable``: SQLite then reads the main file
    as it is, which holds everything. With a ``-wal`` SQLite cannot read there (one
    is left by a run killed, or one that goes on, and ``immutable`` would not read it),
    :func:`_why_not` says to copy both."""

    def names(conn: sqlite3.Connection) -> set[str]:
        try:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        except BaseException:
            conn.close()
            raise

    try:
        conn = _connect(str(p))
        return conn, names(conn)
    except sqlite3.DatabaseError as exc:
        name = str(getattr(exc, "sqlite_errorname", ""))
        if not (name.startswith(_READ_ONLY_ERRORS) and _no_wal(p)):
            raise
    conn = _connect(_uri(p, mode="ro", immutable="1"), uri=True)
    return conn, names(conn)


def open_db(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open a monitoring database for reading (also while its run goes on, and one
    this user may only read: see :func:`_open_reading`). Raises
    :class:`~runtime.errors.MonitoringDBError` for a missing file, one that is not an
    SQLite database or not a monitoring database, another schema version, or one that
    cannot be read where it is."""
    p = Path(path)
    if not p.is_file():
        raise MonitoringDBError(
            str(p), "no such file; a manager prints where it writes its database at start"
        )
    if not os.access(p, os.R_OK):
        raise MonitoringDBError(
            str(p), "this user may not read it: ask its owner for a copy, or run as them"
        )
    try:
        conn, tables = _open_reading(p)
    except sqlite3.DatabaseError as exc:
        raise MonitoringDBError(str(p), _why_not(exc)) from exc
    try:
        if "schema_version" not in tables or "tasks" not in tables:
            raise MonitoringDBError(str(p), "an SQLite file, but not a Corral monitoring database")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        if row is None or row[0] not in READABLE_VERSIONS:
            have = "none" if row is None else row[0]
            older = _OLDER if row is not None and row[0] < SCHEMA_VERSION else ""
            raise MonitoringDBError(
                str(p),
                f"schema version {have}, this Corral reads version {SCHEMA_VERSION}{older}: "
                "use the Corral version that wrote it",
            )
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise MonitoringDBError(str(p), _why_not(exc)) from exc
    except BaseException:
        conn.close()
        raise
    return conn


class MonitorWriter:
    """Writes batches of rows to ``path`` from a thread of its own.

    :meth:`submit` only queues (never blocks, never touches the disk), in pieces of at
    most ``chunk`` rows; the thread writes what is queued in transactions of about
    ``chunk`` rows (a backlog is committed piece by piece, so readers see it come in
    and a process that ends loses at most the transaction under way), then waits for
    more. While more than ``max_rows`` rows wait, the oldest metric samples
    are dropped first, then resource samples, then the oldest events, each counted in
    ``dropped`` (by kind). A database that is locked, slow or full keeps its batches
    queued and is retried every ``retry`` seconds. A row SQLite refuses (text it
    cannot encode, a value it cannot store) is dropped and counted in ``dropped``; the
    rest of its batch is written. :meth:`close` writes what is left and stops the
    thread; what it cannot write by its deadline is dropped, counted in ``dropped``,
    and its ``final`` rows (the run's end, with that count) are written anyway.
    :meth:`give_up` (a second interrupt) moves that deadline to now.

    ``keep`` (seconds; None: for good): a service that runs for days keeps that much
    history. Every :data:`PRUNE_EVERY` seconds, between batches, the thread deletes the
    rows older than that (:func:`prune`), counted in ``pruned`` (by table); the file
    stops growing, SQLite reusing the freed pages.

    A file of an older schema version is upgraded in place as it is opened, after a
    copy of it is kept beside it (``upgraded``); one a live process has open (an older
    Corral's run writing into it) is refused (:func:`_create`)."""

    def __init__(
        self, path: str | os.PathLike[str], *, max_rows: int = 500_000, keep: float | None = None
    ) -> None:
        if keep is not None and not keep > 0:
            raise ValueError(f"keep must be a positive number of seconds, got {keep!r}")
        self.path = Path(path)
        #: the older file upgraded in place as it was opened, and the copy of it kept
        #: (None: none upgraded)
        self.upgraded = _create(self.path)
        self.max_rows = max_rows
        self.keep = keep
        self.pruned: Counter[str] = Counter()  #: rows deleted as older than ``keep``
        self._prune_due = 0.0  #: monotonic time of the next pruning (at the first batch)
        self.chunk = max(1, min(CHUNK, max_rows // 10))
        self.retry = 0.2
        self.dropped: Counter[str] = Counter()  #: rows dropped, by kind
        self.written = 0  #: rows written
        self.batches = 0  #: transactions committed
        self.errors = 0  #: failed attempts (locked, disk errors)
        self._pending: deque[Op] = deque()
        self._rows = 0  #: rows in _pending
        self._in_hand = 0  #: rows the thread took out of _pending and has not written yet
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")  #: monotonic time close() stops writing at
        self._given_up = False  #: give_up() moved the deadline to its call
        self.ended = False  #: the final rows are written
        #: close()'s last rows, made once the rest is written or dropped
        self._final: Callable[[], Iterable[Op]] | None = None
        self._conn = _connect(str(self.path))
        self._conn.execute("PRAGMA synchronous = NORMAL")
        #: makes the run's end, for :meth:`give_up` without one (set by its recorder)
        self.ender: Callable[[], Callable[[], Iterable[Op]]] | None = None
        self._thread = threading.Thread(target=self._run, name="corral-monitordb", daemon=True)
        self._thread.start()
        _WRITERS.add(self)

    @property
    def pending(self) -> int:
        """Rows queued, not written yet (also those the thread has taken to write)."""
        return self._rows + self._in_hand

    def submit(self, ops: Iterable[Op]) -> None:
        """Queue ``ops`` (``(kind, sql, rows)``); never blocks."""
        with self._cond:
            if self._closing:
                return
            chunk = self.chunk
            for kind, sql, rows in ops:
                for i in range(0, len(rows), chunk):
                    part = rows if len(rows) <= chunk else rows[i : i + chunk]
                    self._pending.append((kind, sql, part))
                    self._rows += len(part)
            if self._rows > self.max_rows:
                self._shed()
            self._cond.notify()

    def _shed(self) -> None:
        """Drop queued rows until at most ``max_rows`` wait: metric samples, then
        resource samples, then the oldest events."""
        for kind in (*_SHED_ORDER, None):
            kept: deque[Op] = deque()
            for op in self._pending:
                if self._rows > self.max_rows and (kind is None or op[0] == kind):
                    self.dropped[op[0]] += len(op[2])
                    self._rows -= len(op[2])
                else:
                    kept.append(op)
            self._pending = kept
            if self._rows <= self.max_rows:
                return

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending and self._closing:
                    break
                batch, self._pending = self._pending, deque()
                self._in_hand, self._rows = self._rows, 0
            failed = False
            while batch:  # a backlog goes in pieces of about ``chunk`` rows
                piece: deque[Op] = deque()
                k = 0
                while batch and k < self.chunk:
                    op = batch.popleft()
                    piece.append(op)
                    k += len(op[2])
                written = self._write(piece)
                if written is None:
                    failed = True
                    batch.extendleft(reversed(piece))
                    break
                self.written += written
                self.batches += 1
                self._in_hand -= k
                if (
                    self.keep is not None
                    and not self._closing
                    and time.monotonic() >= self._prune_due
                ):
                    self._prune()
                if self._closing and time.monotonic() >= self._deadline:
                    break
            with self._cond:  # keep the rest, ahead of what came meanwhile
                self._in_hand = 0
                if batch:
                    self._pending.extendleft(reversed(batch))
                    self._rows += sum(len(op[2]) for op in batch)
                    if self._rows > self.max_rows:
                        self._shed()
                given_up = self._closing and time.monotonic() >= self._deadline
                left: deque[Op] = deque()
                if given_up:
                    left, self._pending, self._rows = self._pending, deque(), 0
                    for kind, _, rows in left:
                        self.dropped[kind] += len(rows)
            if given_up:
                if left:
                    _log.warning(
                        "monitoring database: rows not written, dropped on an interrupt "
                        "(counted in runs.dropped_rows)"
                        if self._given_up
                        else "monitoring database: rows not written before close() gave up "
                        "(counted in runs.dropped_rows)",
                        path=str(self.path), rows=sum(len(op[2]) for op in left),
                    )  # fmt: skip
                break
            if failed:
                time.sleep(self.retry)
        final = self._final
        if final is not None:  # retried a little: the database may be the trouble
            last = deque(final())
            while not self.ended:
                self.ended = self._write(last) is not None
                if self.ended or time.monotonic() >= self._deadline + FINAL_GRACE:
                    break
                time.sleep(self.retry)
            if not self.ended:
                _log.warning(
                    "monitoring database: the run's end not written (runs.ended stays "
                    "empty): the database stayed locked or failing",
                    path=str(self.path), tried_s=FINAL_GRACE,
                )  # fmt: skip
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def _write(self, batch: deque[Op]) -> int | None:
        """Write ``batch`` in one transaction; returns the rows written, or None when
        the database did not take it (locked, full, broken: the caller keeps it). A
        batch with rows SQLite refuses is written again row by row, without them."""
        try:
            return self._transaction(batch, row_by_row=False)
        except Exception as exc:
            if not _refused_row(exc):
                self._failed(exc)
                return None
        try:
            return self._transaction(batch, row_by_row=True)
        except Exception as exc:
            self._failed(exc)
            return None

    def _transaction(self, batch: deque[Op], *, row_by_row: bool) -> int:
        """``batch`` in one transaction; ``row_by_row``: rows SQLite refuses are left
        out and counted in ``dropped``. Returns the rows written."""
        conn = self._conn
        refused: Counter[str] = Counter()
        reason = ""
        written = 0
        with _immediate(conn):
            for kind, sql, rows in batch:
                if not row_by_row:
                    conn.executemany(sql, rows)
                    written += len(rows)
                    continue
                for row in rows:
                    try:
                        conn.execute(sql, row)
                    except Exception as exc:
                        if not _refused_row(exc):
                            raise
                        refused[kind] += 1
                        reason = reason or f"{type(exc).__name__}: {exc}"
                    else:
                        written += 1
        if refused:
            self.dropped.update(refused)
            _log.warning(
                "monitoring database: rows it cannot store dropped", path=str(self.path),
                rows=sum(refused.values()), error=reason,
            )  # fmt: skip
        return written

    def _prune(self) -> None:
        """Delete the rows older than ``keep`` (in the writer's thread, between batches);
        a failure (the database locked a while) is retried at the next pruning."""
        assert self.keep is not None
        self._prune_due = time.monotonic() + PRUNE_EVERY
        try:
            deleted = prune(self._conn, time.time() - self.keep, stop=lambda: self._closing)
        except Exception as exc:
            self._failed(exc)
            return
        self.pruned.update(deleted)
        if deleted:
            _log.info(
                "monitoring database: rows older than the history kept deleted",
                path=str(self.path), keep_s=self.keep, rows=dict(deleted),
            )  # fmt: skip
        self._truncate_wal()

    def _truncate_wal(self) -> None:
        """Fold the write-ahead log into the file and cut it to 0 bytes (a pruning's
        deletes had grown it, 18 MB in an audit, and SQLite's own checkpoints reuse a
        ``-wal`` but never shrink it). A reader in the middle of the log leaves it as
        it is (SQLite says busy, after ``busy_timeout``): the next pruning tries again."""
        try:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            self._failed(exc)
            return
        if busy:
            _log.debug("monitoring database: -wal not truncated (a reader)", path=str(self.path))

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 100 == 0:
            _log.warning("monitoring database: write failed", path=str(self.path), error=str(exc))

    def close(self, timeout: float = 10.0, final: Callable[[], Iterable[Op]] | None = None) -> None:
        """Write what is queued (retried until the database lets it) for at most
        ``timeout`` seconds; drop and count what is left then; write ``final()``'s rows
        (made then, so they may read ``dropped``); stop."""
        with self._cond:
            if not self._closing:  # (else give_up() came first: its deadline holds)
                self._deadline = time.monotonic() + timeout
                self._final = final
                self._closing = True
            self._cond.notify()
            left = max(0.0, self._deadline - time.monotonic())
        self._thread.join(left + FINAL_GRACE + 2.0)  # (+ the final rows' tries)

    def give_up(self, final: Callable[[], Iterable[Op]] | None = None) -> bool:
        """Stop writing what is queued, at once (a second interrupt while :meth:`close`
        catches up): the thread ends the piece under way (a locked database holds it
        up to its 1 s busy timeout), drops what is left, counted in ``dropped``, writes
        the final rows (``close()``'s, else ``final``'s) as :meth:`close` does, tried
        for :data:`FINAL_GRACE` seconds, and stops. Never blocks: :meth:`wait` for it.
        Returns False if the thread had already stopped (nothing to give up)."""
        with self._cond:
            if not self._thread.is_alive():
                return False
            if not self._closing:
                self._final = final if final is not None or self.ender is None else self.ender()
                self._closing = True
            self._deadline = min(self._deadline, time.monotonic())
            self._given_up = True
            self._cond.notify()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the thread to stop (after :meth:`close` or
        :meth:`give_up`); returns whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


#: every writer made in this process, while it lives (:func:`give_up_all`)
_WRITERS: weakref.WeakSet[MonitorWriter] = weakref.WeakSet()


def give_up_all(timeout: float = 10.0) -> int | None:
    """Every monitoring writer of this process still writing gives up (a second Ctrl-C
    after an embedded cluster's event loop is gone: ``KeyboardInterrupt`` out of
    ``anyio.run`` while a writer catches up in its thread; a manager process's second
    Ctrl-C, from its signal loop): its queued rows dropped,
    counted in ``runs.dropped_rows``, and the run's end written. Waits at most
    ``timeout`` seconds in all; returns the rows they dropped, None when none was
    writing. ``python -m runtime`` calls it on an interrupt; a script that embeds a
    cluster with monitoring may call it in its own ``except KeyboardInterrupt``."""
    writers = []
    for w in list(_WRITERS):
        left = w.pending
        if w.give_up():  # (the run's end: its ender's)
            writers.append(w)
            _log.warning(
                "monitoring database: second interrupt: dropping the rows still queued "
                "and writing the run's end (another interrupt ends the process at once)",
                path=str(w.path), rows_left=left,
            )  # fmt: skip
    if not writers:
        return None
    deadline = time.monotonic() + timeout
    for w in writers:
        w.wait(max(0.0, deadline - time.monotonic()))
    return sum(sum(w.dropped.values()) for w in writers)


def _refused_row(exc: Exception) -> bool:
    """Whether ``exc`` is about a row (text UTF-8 cannot encode, a value SQLite cannot
    store, a constraint), not about the database (locked, full, read-only, corrupt)."""
    return not isinstance(exc, sqlite3.OperationalError) and type(exc) is not sqlite3.DatabaseError


# ----------------------------------------------------------------------------- recording

#: one row per task and poll, merged with what the table has: first times stay, the
#: latest worker and state win (a row of a try alone has none: the table's stay), an
#: end state stays until the task ends again or its output is released (``released``),
#: tries add up (over a key computed again); an end clears the release and the
#: not-run columns (``cause``, ``error``, ``root``) its own row does not set
_TASK = (
    "INSERT INTO tasks (run_id, key, category, pool, submitted, ready, started, finished, "
    "state, worker, tries, duration, output_bytes, released, cause, error, root, client) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (run_id, key) DO UPDATE SET "
    "client = COALESCE(client, excluded.client), "
    "category = COALESCE(excluded.category, category), pool = COALESCE(excluded.pool, pool), "
    "submitted = COALESCE(submitted, excluded.submitted), "
    "ready = COALESCE(ready, excluded.ready), started = COALESCE(started, excluded.started), "
    "worker = COALESCE(excluded.worker, worker), tries = tries + excluded.tries, "
    "duration = COALESCE(excluded.duration, duration), "
    "output_bytes = COALESCE(excluded.output_bytes, output_bytes), "
    "state = CASE WHEN excluded.finished IS NOT NULL OR finished IS NULL "
    "OR excluded.released IS NOT NULL THEN COALESCE(excluded.state, state) ELSE state END, "
    "released = CASE WHEN excluded.finished IS NOT NULL THEN excluded.released "
    "ELSE COALESCE(excluded.released, released) END, "
    "cause = CASE WHEN excluded.finished IS NOT NULL THEN excluded.cause "
    "ELSE COALESCE(excluded.cause, cause) END, "
    "error = CASE WHEN excluded.finished IS NOT NULL THEN excluded.error "
    "ELSE COALESCE(excluded.error, error) END, "
    "root = CASE WHEN excluded.finished IS NOT NULL THEN excluded.root "
    "ELSE COALESCE(excluded.root, root) END, "
    "finished = COALESCE(excluded.finished, finished)"
)
#: a try is numbered after the key's tries in the table: a key computed again after it
#: was forgotten (submitted anew, its tries counted from 1 again) adds to its tries
_TRY = (
    "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, outcome, "
    "cause, error_type, error_message, output_bytes, queued, traceback, resumed, "
    "resumed_work, unsaved) "
    "VALUES (?1, ?2, (SELECT COALESCE(MAX(try), 0) + 1 FROM tries "
    "WHERE run_id = ?1 AND key = ?2), ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
    "?15, ?16, ?17)"
)
#: a try that ended ok whose output its worker could not pickle for a client or
#: another worker (ResultNotPicklable): its latest ok try there becomes a failure
_UNREADABLE = (
    "UPDATE tries SET outcome = 'error', cause = ?1, error_type = ?2, error_message = ?3, "
    "traceback = ?4 WHERE run_id = ?5 AND key = ?6 AND try = (SELECT MAX(try) FROM tries "
    "WHERE run_id = ?5 AND key = ?6 AND worker = ?7 AND outcome = 'ok')"
)
#: a worker's life begins (its first join, or one after it left: a requeued block's
#: worker comes back under its id), or it joins again within one (a reconnect)
_WORKER_JOINED = (
    "INSERT INTO workers (run_id, worker, life, pool, block, cores, memory, joined) "
    "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (run_id, worker, life) DO UPDATE SET "
    "joins = joins + 1, block = COALESCE(excluded.block, block)"
)
_WORKER_LEFT = "UPDATE workers SET left = ?, cause = ? WHERE run_id = ? AND worker = ? AND life = ?"
_RUN_END_WORKERS = (
    "UPDATE workers SET left = ?, cause = 'shutdown' WHERE run_id = ? AND left IS NULL"
)
#: its life under way, if any (else its next joined row carries the block)
_WORKER_BLOCK = "UPDATE workers SET block = ? WHERE run_id = ? AND worker = ? AND left IS NULL"
_BLOCK = "INSERT INTO blocks VALUES (?,?,?,?,?,?)"
_RESOURCE = "INSERT INTO resource_samples VALUES (?,?,?,?,?,?,?,?)"
_TRANSFER = "INSERT INTO transfers VALUES (?,?,?,?,?,?,?,?)"
_RECOVERY = "INSERT INTO recoveries VALUES (?,?,?,?,?,?)"
_METRIC = "INSERT INTO metric_samples VALUES (?,?,?,?,?)"
#: how a series' labels (JSON, its keys sorted) say it has a ``category`` label
_CATEGORY_LABEL = '"category": '
_ALERT = "INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?,?)"
#: an alert's states in the order it goes through them
_ALERT_STATES = ("pending", "firing", "resolved")
_GAP = "INSERT INTO gaps VALUES (?,?,?,?)"
_ACTION = "INSERT INTO actions VALUES (?,?,?,?,?,?,?,?,?,?)"
#: what followed the key's latest try: a free or charged retry, maybe in another pool
_RETRY = (
    "UPDATE tries SET retry = ?, moved_to = ? WHERE run_id = ?3 AND key = ?4 AND try = "
    "(SELECT MAX(try) FROM tries WHERE run_id = ?3 AND key = ?4)"
)
_CHECKPOINT = "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)"
_MOVE = "INSERT INTO moves VALUES (?, ?, ?, ?, ?, ?, ?)"
_POLICY = "INSERT INTO policies VALUES (?, ?, ?, ?, ?, ?, ?)"
_RUN_SEEN = "UPDATE runs SET last_seen = ?, feed_lost = ?, dropped_rows = ? WHERE run_id = ?"

#: seconds a stopping recorder gives its writer to write what the run queued (a fast
#: run of 200,000 tasks may leave some 100,000 rows); what is left then is dropped and
#: counted in runs.dropped_rows
CLOSE_TIMEOUT = 60.0
PROGRESS_EVERY = 5.0  #: seconds between two log lines of a stopping writer's progress
#: seconds between two writes of the metric series that have a ``category`` label
CATEGORY_SAMPLES_EVERY = 30.0
#: seconds: a metric series gets a row when its value changed since its last row, and at
#: least this often when it did not (and at the run's end), so "its value at time t" is
#: the latest row at or before t, never more than this old (an idle manager's series
#: are then about 12 rows an hour each, not 1,800)
METRIC_HEARTBEAT = 300.0
MIN_FEED_WAIT = 0.05  #: seconds: the feed is read at most this often
#: seconds a stopping recorder's last poll may take: it reads the scheduler's feed to its
#: end (every page), then the rest; past this it is cut (logged), and what it read is
#: written all the same, before the run's end
LAST_POLL_TIMEOUT = 5.0
FEED_EVERY = 0.25  #: seconds: the feed is read at least this often (an empty read is cheap)
_TERMINAL = frozenset({"memory", "erred", "cancelled"})
#: try outcomes that are no failure of the task's
_NOT_FAILED = frozenset({"ok", "cancelled"})
#: try outcomes the scheduler records on its own clock (``sent`` to when it knew),
#: not the worker's: a try lost with its worker, a copy or try it cancelled
_CORE_CLOCK = frozenset({"worker-lost", "cancelled"})


def _safe(text: str) -> str:
    """``text``, with what UTF-8 cannot encode escaped: a lone surrogate (what
    ``os.fsdecode`` makes of a file name's undecodable byte) becomes ``\\udcff``."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _text(error: ErrorRecord | None) -> tuple[str | None, str | None, str | None]:
    """A failed try's error (as the scheduler's feed gives it, made when the try
    failed): its type's name, its text (its first ``MAX_ERROR_CHARS``) and its
    traceback as the dashboard shows it (:func:`traceback_text`: its last
    ``MAX_TRACEBACK_TEXT`` characters, saying so when it is cut)."""
    if error is None:
        return None, None, None
    name, text, _, _ = error.chain[-1]
    from actors.scheduler import traceback_text

    return _safe(name), _safe(text), _safe(traceback_text(error))


class _Rows:
    """Rows of one poll, grouped into operations in the order they came."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, kind: str, sql: str, row: tuple[Any, ...]) -> None:
        ops = self.ops
        if ops and ops[-1][1] is sql:
            ops[-1][2].append(row)
        else:
            ops.append((kind, sql, [row]))


class MonitorRecorder(Actor):
    """Pulls what happened every ``interval`` seconds and has ``writer`` store it (and
    closes the writer when it stops).

    ``scheduler``, ``manager``, ``autoscaler``: how to reach them (the autoscaler may
    be absent, or start later). The polls run in a helper task: nothing here runs on
    another actor's turn, and the disk is the writer thread's."""

    #: a shutdown waits this long for it: its last poll, then its writer's backlog
    stop_timeout = 5.0 + CLOSE_TIMEOUT + 10.0

    def __init__(
        self,
        writer: MonitorWriter,
        scheduler: Callable[[], ActorRef[Any]],
        manager: Callable[[], ActorRef[Any]],
        autoscaler: Callable[[], ActorRef[Any] | None],
        *,
        interval: float = 2.0,
        page: int = 20_000,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"the monitoring interval must be positive, got {interval}")
        self.path = writer.path
        self._scheduler = scheduler
        self._manager = manager
        self._autoscaler = autoscaler
        self.interval = interval
        self.page = page
        self.run_id = uuid.uuid4().hex[:12]
        self.writer: MonitorWriter | None = writer
        writer.ender = lambda: self._end(writer)  # (give_up_all, the loop gone)
        self.seq = 0  #: the next feed event to ask for
        self._categories_due = 0.0  #: when the per-category series are written next
        #: (name, labels) -> (value, time) of each metric series' latest row
        self._metric_rows: dict[tuple[str, str], tuple[float, float]] = {}
        #: of those, the series of gauges (a gauge gone from the snapshot gets a row of 0)
        self._metric_gauges: set[tuple[str, str]] = set()
        #: worker -> its last resource_samples row's numbers and time
        self._resource_rows: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._stopping = False  #: on_stop's last poll (writes every series)
        self.feed_lost = 0  #: feed events gone before they were read
        self.polls = 0
        self._blocks: dict[str, tuple[str, str]] = {}  #: block -> (pool, state)
        self._worker_block: dict[str, str] = {}
        #: worker -> its latest life's number, and whether that life goes on
        self._lives: dict[str, tuple[int, bool]] = {}
        #: the autoscaler's ends written: (pool, block, incarnation, state)
        self._ends: set[tuple[str, str, int, str]] = set()
        #: (name, labels, active_since) -> (state, active_since, fired_at, resolved_at),
        #: the alert (a resolved one is listed beside a new one of its labels that is
        #: pending: active_since tells them apart)
        self._alerts: dict[tuple[str, str, float | None], tuple[tuple[Any, ...], AlertInfo]]
        self._alerts = {}
        self._audited = 0  #: the ``seq`` of the latest audit entry written (AuditInfo)
        #: key -> the columns of _TASK after it (category, pool, submitted, ready,
        #: started, finished, state, worker, tries, duration, output_bytes, released,
        #: cause, error, root, client): what the feed said of each task since the last full
        #: poll, written then as one row
        self._tasks: dict[str, list[Any]] = {}
        #: key -> ``Type: message`` of its latest failed try, while it has not ended:
        #: its ``tasks.error`` if it errs next (it failed for good); emptied when feed
        #: entries were lost (their tasks' ends with them)
        self._failed: dict[Any, str] = {}
        self._lock = anyio.Lock()

    async def on_restart(self) -> None:
        self.start_soon(self._loop)  # the same writer and run: only the polls restart

    async def on_start(self) -> None:
        assert self.writer is not None, "a recorder starts once"
        now = time.time()
        row = (self.run_id, now, now, None, socket.gethostname(), os.getpid(),
               json.dumps(sys.argv), sys.version.split()[0], 0, 0)  # fmt: skip
        self.writer.submit([("event", "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)", [row])])
        _log.info("monitoring database", path=str(self.path), run_id=self.run_id)
        self.start_soon(self._loop)

    async def _loop(self) -> None:
        """A full poll every ``interval``; the feed alone every :data:`FEED_EVERY`
        seconds, and sooner while it moves fast: again before a quarter of its ring
        could fill at the rate just seen (a burst of a graph's tasks at once)."""
        last_full = -float("inf")
        fed_at = self.clock.now()
        while True:
            t = self.clock.now()
            full = t - last_full >= self.interval
            if full:
                last_full = t
            try:
                read, capacity = await self.poll(full=full)
            except Exception as exc:  # a bug here must not stop the cluster: say it, go on
                self.log.error("monitoring poll failed", error=repr(exc))
                read = capacity = 0
            wait = min(self.interval - (self.clock.now() - last_full), FEED_EVERY)
            if read and capacity:
                rate = read / max(t - fed_at, 1e-3)
                wait = min(wait, capacity / 4 / rate)
            fed_at = t
            await self.clock.sleep(max(wait, MIN_FEED_WAIT))

    async def on_stop(self) -> None:
        writer = self.writer
        if writer is None:
            return
        self._stopping = True
        with anyio.move_on_after(LAST_POLL_TIMEOUT) as bound:
            await self.poll(drain=True)
        if bound.cancelled_caught:
            _log.warning(
                "monitoring database: the run's last poll was cut; the scheduler's feed "
                "entries read are written, any after them are not",
                path=str(writer.path), seconds=LAST_POLL_TIMEOUT, feed_read_to=self.seq,
            )  # fmt: skip
        final = self._end(writer)  # (unused if give_up_all() came first: its end holds)
        self.writer = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._tell_progress, writer)
            await anyio.to_thread.run_sync(writer.close, CLOSE_TIMEOUT, final)
            tg.cancel_scope.cancel()

    def _end(self, writer: MonitorWriter) -> Callable[[], list[Op]]:
        """The run's end, written last by ``writer``: what is still open ends with the
        run (workers and blocks the cluster stops, and the alerts firing, which the
        alert monitor's stop ends: a row ``resolved`` each, as its notifiers say it,
        :func:`~runtime.notify.ended_by_stop`). Written once what is queued is written
        or, past CLOSE_TIMEOUT or on a second interrupt, dropped and counted
        (runs.dropped_rows), so a run always shows how it ended."""
        from runtime.notify import ended_by_stop

        now, run, feed_lost = time.time(), self.run_id, self.feed_lost
        rows = _Rows()
        self._flush_tasks(rows)  # (what the feed said of tasks since the last full poll)
        rows.add("event", _RUN_END_WORKERS, (now, run))
        for bid, (pool, _) in self._blocks.items():
            rows.add("event", _BLOCK, (run, bid, pool, "stopped", now, "shutdown"))
        for (_, labels, _), ((state, *_), alert) in self._alerts.items():
            if state == "firing":
                ended = ended_by_stop(alert, now)
                rows.add("event", _ALERT, self._alert_row(now, ended, ended.state, labels))
        rows.add("event", "UPDATE runs SET ended = ? WHERE run_id = ?", (now, run))

        def final() -> list[Op]:  # (in the writer's thread, once it is done)
            dropped = sum(writer.dropped.values())
            return [*rows.ops, ("event", _RUN_SEEN, [(now, feed_lost, dropped, run)])]

        return final

    async def _tell_progress(self, writer: MonitorWriter) -> None:
        """While a stopping recorder's writer catches up: how many rows are left, every
        few seconds (a long wait says what it waits for)."""
        start = time.monotonic()
        while True:
            await anyio.sleep(PROGRESS_EVERY)
            _log.warning(
                "monitoring database: writing what the run queued before stopping (a "
                "second interrupt drops these rows, counted, and ends the run at once)",
                path=str(writer.path), rows_left=writer.pending, written=writer.written,
                gives_up_in_s=round(CLOSE_TIMEOUT - (time.monotonic() - start)),
            )  # fmt: skip

    async def poll(
        self, *, full: bool = True, now: float | None = None, drain: bool = False
    ) -> tuple[int, int]:
        """One round: the feed and, if ``full``, the workers' memory, the blocks, the
        metrics, the alerts; then hand the rows to the writer. Returns the feed events
        read and the size of the feed's ring. ``now``: the Unix time of its rows (a
        test's; by default the time now); ``drain``: read the feed to its end, however
        many pages (the run's last poll), not at most 10.

        A poll cut short (the cluster's stop cancels the loop's, or the last poll's bound
        cuts it) still hands the writer the rows it made: the feed entries it read are
        read for good (the next poll asks for those after them)."""
        writer = self.writer
        if writer is None:
            return 0, 0
        async with self._lock:
            rows = _Rows()
            now = time.time() if now is None else now
            try:
                read, capacity = await self._feed(rows, now, full, drain)
                if full:
                    self._flush_tasks(rows)
                    await self._poll_blocks(rows, now)
                    await self._poll_metrics(rows, now)
                    await self._poll_alerts(rows, now)
                    dropped = sum(writer.dropped.values())
                    rows.add("event", _RUN_SEEN, (now, self.feed_lost, dropped, self.run_id))
            finally:
                writer.submit(rows.ops)
            self.polls += 1
            return read, capacity

    async def _ask(self, ref: ActorRef[Any] | None, msg: Any, timeout: float = 5.0) -> Any:  # noqa: ASYNC109
        if ref is None:
            return None
        try:
            return await ref.ask(msg, timeout=timeout)
        except (ActorStopped, AskTimeout):
            return None

    async def _feed(
        self, rows: _Rows, now: float, samples: bool, drain: bool = False
    ) -> tuple[int, int]:
        last = None
        read = 0
        # pages: at most 10, what is left waits for the next poll; all when draining
        for _ in itertools.count() if drain else range(10):
            reply = await self._ask(self._scheduler(), MonitorFeed(self.seq, self.page))
            if not isinstance(reply, MonitorFeedReply):
                break
            last = reply
            if reply.lost:
                self.feed_lost += reply.lost
                # The lost entries may have ended tasks with a failed try: their errors
                # would be kept for the run (a task that errs after this has none).
                self._failed.clear()
                rows.add("event", _GAP, (self.run_id, now, "scheduler", reply.lost))
                _log.warning("monitoring: feed entries lost between polls", lost=reply.lost)
            self.seq = reply.next
            read += self._events(rows, reply)
            if len(reply.events) < self.page:
                break
        if last is None:
            return 0, 0
        if samples:
            # A worker's row only when its numbers changed, or at the heartbeat: an
            # idle worker's memory and disk stay the same for hours.
            kept = self._resource_rows
            for wid in kept.keys() - last.workers.keys():
                # Left: its last numbers once more, so its lines run to its end.
                sample, at = kept.pop(wid)
                if at < now:
                    rows.add("resource", _RESOURCE, (self.run_id, now, wid, *sample))
            for wid, sample in last.workers.items():
                if self._due(kept, wid, tuple(sample), now):
                    rows.add("resource", _RESOURCE, (self.run_id, now, wid, *sample))
        return read, last.capacity

    def _due(self, written: dict[Any, tuple[Any, float]], key: Any, value: Any, now: float) -> bool:
        """Whether a series' ``value`` gets a row now, and if so, notes it in
        ``written`` (key -> its last row's value and time): when it changed since its
        last row (NaN equals NaN), or that row is :data:`METRIC_HEARTBEAT` old, or the
        run ends."""
        last = written.get(key)
        if (
            last is not None
            and not self._stopping
            and now - last[1] < METRIC_HEARTBEAT
            and (last[0] == value or (last[0] != last[0] and value != value))
        ):
            return False
        written[key] = (value, now)
        return True

    def _flush_tasks(self, rows: _Rows) -> None:
        """One ``tasks`` row per task touched since the last full poll."""
        run, tasks = self.run_id, self._tasks
        if tasks:
            self._tasks = {}
            rows.ops.append(("event", _TASK, [(run, k, *t) for k, t in tasks.items()]))

    def _events(self, rows: _Rows, reply: MonitorFeedReply) -> int:
        """Rows for the feed's entries (one per try ended, worker, ...; what it says
        of tasks is merged into ``_tasks``, written at the next full poll: a task that
        changes state several times in an interval is one row write, not one a feed
        read); returns the records read."""
        from actors.scheduler_records import lost_worker_text, not_run_text

        run, wall = self.run_id, reply.wall
        n = 0
        tasks = self._tasks

        def task(k: str, category: str, at: float) -> list[Any]:
            t = tasks.get(k)
            if t is None:
                t = [_safe(category), None, at, None, None, None, None, None, 0, None, None,
                     None, None, None, None, None]  # fmt: skip
                tasks[k] = t
            return t

        for now, records in reply.events:
            at = now + wall
            n += len(records)
            for rec in records:
                kind = rec[0]
                if kind == "state":
                    _, key, finish, category, pool, worker, client = rec
                    t = task(_safe(str(key)), category, at)
                    t[1] = pool
                    if t[15] is None and client:
                        t[15] = _safe(client_name(client))
                    if finish in _TERMINAL:
                        t[5], t[6], t[11] = at, finish, None  # (its output held again)
                        failed = self._failed.pop(key, None)
                        if finish != "erred":  # (a not-run row comes before its erred)
                            t[12] = t[13] = t[14] = None
                        elif failed is not None:  # it failed for good: its last try's
                            t[12], t[13], t[14] = None, failed, None
                    elif finish == "released":  # its output released: nothing needs it
                        t[6], t[11] = finish, at
                        self._failed.pop(key, None)  # (it may be forgotten next)
                    elif finish in ("waiting", "queued", "processing"):
                        if t[5] is None and t[11] is None:
                            t[6] = finish
                        if finish == "queued" and t[3] is None:
                            t[3] = at
                        elif finish == "processing":
                            t[4] = at if t[4] is None else t[4]
                            t[7] = worker
                elif kind == "try":
                    (_, key, category, worker, _, sent, start, stop, outcome, cause, error,
                     nbytes, queued, failure, resumed, resumed_work, unsaved) = rec  # fmt: skip
                    k = _safe(str(key))
                    t = task(k, category, at)
                    if outcome in _CORE_CLOCK:  # the core's clock: sent, began, ended
                        start = None if start is None else start + wall
                        # A worker lost after its connection dropped: ended at the drop.
                        stop = stop + wall if outcome == "worker-lost" else at
                    ok = outcome == "ok"
                    etype, emsg, tb = _text(error)
                    if error is None and outcome == "worker-lost":  # as the dashboard says
                        emsg = _safe(lost_worker_text(worker, cause, key))
                    why = failure or cause  # a failed try's: the metrics' and the groups'
                    rows.add(
                        "event", _TRY,
                        (run, k, _safe(category), worker, sent + wall, start, stop, outcome,
                         _safe(why) if why else None, etype, emsg, nbytes if ok else None,
                         None if queued is None else queued + wall, tb, resumed, resumed_work,
                         unsaved),
                    )  # fmt: skip
                    t[8] += 1  # tries ended in this interval: added to the row's
                    if outcome not in _NOT_FAILED:  # the task's error, if it errs next
                        self._failed[key] = (
                            f"{etype}: {emsg}" if etype and emsg else etype or emsg or outcome
                        )
                    if ok and start is not None:
                        t[9], t[10] = max(stop - start, 0.0), nbytes
                elif kind == "unreadable":  # its ok try's output could not leave it
                    _, key, category, worker, record = rec
                    k = _safe(str(key))
                    t = task(k, category, at)
                    etype, emsg, tb = _text(record)
                    # (no tasks.cause: that is why a task that erred with no try of
                    # its own did; the try's row carries the cause)
                    t[13] = f"{etype}: {emsg}"
                    rows.add("event", _UNREADABLE, (etype, etype, emsg, tb, run, k, worker))
                elif kind == "verdict":  # the scheduler's, after the try: its client's
                    _, key, record = rec
                    etype, emsg, _ = _text(record)
                    self._failed[key] = f"{etype}: {emsg}"
                elif kind == "retry":  # after its try's row
                    _, key, charged, _, moved = rec
                    rows.add("event", _RETRY, ("charged" if charged else "free",
                                               moved, run, _safe(str(key))))  # fmt: skip
                elif kind == "not-run":  # erred with no failed try of its own
                    _, key, category, cause, record, dependency, root = rec
                    t = task(_safe(str(key)), category, at)
                    self._failed.pop(key, None)  # (erring for this reason, not its try's)
                    t[12] = _safe(cause)
                    t[13] = _safe(not_run_text(record, dependency, root))
                    t[14] = None if root is None else _safe(str(root))
                elif kind == "joined":
                    _, wid, pool, cores, memory = rec
                    block = self._worker_block.get(wid)  # when its block said it first
                    life, going = self._lives.get(wid, (0, False))
                    life += not going  # a join within a life going on: a reconnect
                    self._lives[wid] = (life, True)
                    rows.add("event", _WORKER_JOINED,
                             (run, wid, life, pool, block, cores, memory, at))  # fmt: skip
                elif kind == "left":  # when it ended: its connection's drop, if it had
                    _, wid, cause, ended = rec
                    life, _ = self._lives.get(wid, (1, True))
                    self._lives[wid] = (life, False)
                    rows.add("event", _WORKER_LEFT, (ended + wall, cause, run, wid, life))
                elif kind == "transfer":
                    _, key, what, nbytes, source, target, took = rec
                    rows.add("event", _TRANSFER, (run, at, _safe(str(key)), what, nbytes,
                                                  source or None, target, took))  # fmt: skip
                elif kind == "moved":  # to another pool or priority, waiting or queued
                    _, key, category, was, pool, before, priority = rec
                    k = _safe(str(key))
                    task(k, category, at)[1] = pool  # its pool now, not at its next state
                    rows.add("event", _MOVE, (run, at, k, was, pool, before, priority))
                elif kind == "checkpoint":  # saved, or lost with every copy of it
                    _, key, seq, event, worker, work = rec
                    rows.add("event", _CHECKPOINT, (run, at, _safe(str(key)), seq, event,
                                                    worker, work))  # fmt: skip
                elif kind == "policy":  # a swap: asked for (by), or the scheduler's (why)
                    _, pkind, name, params, by, why = rec
                    rows.add("event", _POLICY, (run, at, pkind, name, params, by or None,
                                                why or None))  # fmt: skip
                elif kind == "recovery":
                    _, key, category, worker, how = rec
                    rows.add("event", _RECOVERY, (run, at, _safe(str(key)), _safe(category),
                                                  worker, how))  # fmt: skip
        return n

    async def _poll_blocks(self, rows: _Rows, now: float) -> None:
        status = await self._ask(self._autoscaler(), StatusRequest(), timeout=2.0)
        if not isinstance(status, AutoscalerStatus):
            return
        run = self.run_id
        # Every end the autoscaler lists, once: one between two polls (a block asked
        # for and failed, a requeue) has its row too, with its time and cause. Known by
        # which run of which block ended how, not by its time: the autoscaler gives its
        # ends in Unix time worked out anew at each answer, a microsecond apart.
        written, self._ends = self._ends, set()
        for e in status.ends:
            key = (e.pool, e.block, e.incarnation, e.state)
            self._ends.add(key)  # the list only drops its oldest: this set stays small
            if key not in written:
                rows.add("event", _BLOCK, (run, e.block, e.pool, e.state, e.at, e.cause))
        ended = {e.block for e in status.ends if e.state != "requeued"}
        for bid, state in status.blocks.items():
            pool = status.block_pools.get(bid, "")
            if self._blocks.get(bid) != (pool, state):
                self._blocks[bid] = (pool, state)
                rows.add("event", _BLOCK, (run, bid, pool, state, now, None))
            for wid in status.block_workers.get(bid, ()):
                if self._worker_block.get(wid) != bid:  # a worker not joined yet gets it
                    self._worker_block[wid] = bid  # with its joined row
                    rows.add("event", _WORKER_BLOCK, (bid, run, wid))
        for bid in [b for b in self._blocks if b not in status.blocks]:
            pool, _ = self._blocks.pop(bid)
            if bid not in ended:  # gone with no end listed (it rolled off the list)
                rows.add("event", _BLOCK, (run, bid, pool, "ended", now, None))

    async def _poll_metrics(self, rows: _Rows, now: float) -> None:
        from runtime.metrics import SnapshotCollector

        reply = await self._ask(self._manager(), MetricsRequest())
        if not isinstance(reply, MetricsReply):
            return
        run = self.run_id
        # Series per category (up to 500 categories, a few series each: most of the
        # rows) are written every CATEGORY_SAMPLES_EVERY seconds, and at the end; series
        # per worker (its disk) not at all: resource_samples has them; the others every
        # interval. Of those, a series gets a row only when its value changed since its
        # last row, or that row is METRIC_HEARTBEAT old, or the run ends: an idle
        # manager's unchanged series are not written anew every interval.
        categories = now >= self._categories_due or self._stopping
        if categories:
            self._categories_due = now + CATEGORY_SAMPLES_EVERY
        written, gauges = self._metric_rows, self._metric_gauges
        seen: set[tuple[str, str]] = set()
        for family in SnapshotCollector(reply).collect():
            gauge = family.type == "gauge"
            for s in family.samples:
                if "worker" in s.labels or (not categories and "category" in s.labels):
                    continue
                labels = json.dumps(s.labels, sort_keys=True)
                key = (s.name, labels)
                seen.add(key)
                if self._due(written, key, s.value, now):
                    rows.add("metric", _METRIC, (run, now, s.name, labels, s.value))
                    if gauge:
                        gauges.add(key)
        # A series gone from the snapshot (the pool `*` once no task without a pool is
        # queued, a category forgotten): a gauge gets a row of 0, as /metrics now shows
        # nothing there, so the latest row does not hold its last value for ever; a
        # counter, summary or histogram series keeps its last row, the total it reached
        # (a 0 would read as a reset to rate queries). Either is forgotten: if it comes
        # back, its next value is written as a change.
        for key in [k for k in written if k not in seen]:
            if categories or _CATEGORY_LABEL not in key[1]:  # (else not read this poll)
                value, _ = written.pop(key)
                if key in gauges:
                    gauges.discard(key)
                    if value != 0:  # (one that ended at 0 has said so)
                        rows.add("metric", _METRIC, (run, now, key[0], key[1], 0.0))

    async def _poll_alerts(self, rows: _Rows, now: float) -> None:
        """A row per alert state change, at the time the alert gives it (``active_since``,
        ``fired_at``, ``resolved_at``): a change between two polls, a pending span shorter
        than an interval, has its row too. An alert gone from the reply while pending (it
        stopped holding before it fired) gets a row ``inactive``, at this poll's time."""
        reply = await self._ask(self._manager(), AlertsRequest())
        if not isinstance(reply, AlertsReply):
            return
        known, self._alerts = self._alerts, {}
        for a in reply.alerts:
            labels = json.dumps(a.labels, sort_keys=True)
            seen = (a.state, a.active_since, a.fired_at, a.resolved_at)
            key = (a.name, labels, a.active_since)
            last = known.pop(key, None)
            self._alerts[key] = (seen, a)
            if last is not None and last[0] == seen:
                continue
            # The states it went through since the last poll: all of them for an alert
            # not seen before.
            was = last[0][0] if last is not None else None
            start = _ALERT_STATES.index(was) + 1 if was in _ALERT_STATES else 0
            states = _ALERT_STATES[start : _ALERT_STATES.index(a.state) + 1] or (a.state,)
            for state in states:
                at = {"pending": a.active_since, "firing": a.fired_at}.get(state, a.resolved_at)
                if state == "pending" and a.fired_at is not None and a.fired_at == at:
                    continue  # fired at once (for = 0): never pending
                if at is not None or state == a.state:
                    at = now if at is None else at
                    rows.add("event", _ALERT, self._alert_row(at, a, state, labels))
        for key, ((state, *_), a) in known.items():  # gone; a resolved one is forgotten
            if state != "resolved":
                rows.add("event", _ALERT, self._alert_row(now, a, "inactive", key[1]))
        self._actions(rows, reply, now)

    def _actions(self, rows: _Rows, reply: AlertsReply, now: float) -> None:
        """A row in ``actions`` per remediation audit entry not written yet (by its
        ``seq``); entries the monitor let go of before a poll read them (more than it
        keeps in one interval) leave a row in ``gaps``, source ``audit``."""
        new = [a for a in reply.actions if a.seq > self._audited]
        if not new:
            return
        missed = new[0].seq - self._audited - 1
        if missed > 0:
            rows.add("event", _GAP, (self.run_id, now, "audit", missed))
            _log.warning("monitoring: alert audit entries lost between polls", lost=missed)
        self._audited = new[-1].seq
        for a in new:
            labels = json.dumps(a.labels, sort_keys=True) if a.labels else None
            rows.add("event", _ACTION, (
                self.run_id, a.time, a.rule or None, labels, a.pool or None, a.action,
                a.before, a.after, _safe(a.why) or None, _safe(a.line),
            ))  # fmt: skip

    def _alert_row(self, at: float, a: AlertInfo, state: str, labels: str) -> tuple[Any, ...]:
        value = a.value if state == a.state else None
        # a row of a state the alert has left (written late) has none of the later times
        fired = None if state == "pending" else a.fired_at
        resolved = a.resolved_at if state in ("resolved", "inactive") else None
        return (self.run_id, at, a.name, state, labels,
                json.dumps(a.annotations, sort_keys=True), value, a.active_since, fired,
                resolved, json.dumps(a.fields, sort_keys=True))  # fmt: skip
