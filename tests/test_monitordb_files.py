"""Files the monitoring database meets (runtime/monitordb.py): a database Corral does
not own (another program's, one of a newer schema) is refused as it is, byte for
byte, before anything is written to it; a database this user may only read (another
user's archived run) is reported, and one SQLite cannot read without writing beside
it says to copy it."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.errors import MonitoringDBError
from runtime.monitordb import SCHEMA_VERSION, MonitorWriter, open_db

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0
#: the unprivileged user a root test reads as (nobody)
NOBODY = 65534


def _state(db: Path) -> tuple[str, str, list[str], list[str]]:
    """What must not change: the file's bytes, its journal mode (read without a
    connection: its header, bytes 18-19), its tables, and the files beside it."""
    data = db.read_bytes()
    mode = "wal" if data[18:20] == b"\x02\x02" else "rollback"
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master"))
    finally:
        conn.close()
    beside = sorted(p.name for p in db.parent.iterdir())
    return hashlib.sha256(data).hexdigest(), mode, tables, beside


def _make(db: Path, script: str, *, wal: bool = False) -> Path:
    conn = sqlite3.connect(db)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(script)
    conn.close()  # the last connection: a WAL file's -wal and -shm go
    return db


def test_a_database_of_another_program_or_schema_is_refused_unchanged(tmp_path: Path) -> None:
    """The audit's files: another program's (its own ``users``; its own ``tasks``;
    one in WAL mode) and one of the next schema version, of a Corral to come (its own
    ``tasks`` columns). Each refused for what it is (not 'no such column'), its
    bytes, journal mode, tables and neighbours as they were: no Corral table, no WAL
    mode, no -wal/-shm. Before, each got 13 tables and WAL mode, and the next version
    the wrong reason."""
    users = "CREATE TABLE users (id INTEGER, name TEXT); INSERT INTO users VALUES (1, 'alice');"
    cases = {
        "foreign.db": (users, False, "another program \\(tables: users\\)"),
        "foreign_tasks.db": (
            "CREATE TABLE tasks (id INTEGER, title TEXT); INSERT INTO tasks VALUES (1, 'milk');",
            False,
            "another program \\(tables: tasks\\)",
        ),
        "foreign_wal.db": (users, True, "another program \\(tables: users\\)"),
        "future.db": (
            "CREATE TABLE schema_version (version INTEGER NOT NULL);"
            f"INSERT INTO schema_version VALUES ({SCHEMA_VERSION + 1});"
            "CREATE TABLE tasks (run_id TEXT, key TEXT, newcol TEXT);",
            False,
            f"it has schema version {SCHEMA_VERSION + 1}, this Corral writes {SCHEMA_VERSION}",
        ),
    }
    for name, (script, wal, why) in cases.items():
        here = tmp_path / name.removesuffix(".db")
        here.mkdir()
        db = _make(here / name, script, wal=wal)
        before = _state(db)
        with pytest.raises(MonitoringDBError, match=why) as caught:
            MonitorWriter(db)
        assert "give --monitoring" in str(caught.value), name
        assert _state(db) == before, name
    # Corral's own file of a newer version, in WAL mode: the same, and no -wal left
    newer = tmp_path / "newer"
    newer.mkdir()
    db = newer / "monitoring.db"
    MonitorWriter(db).close()
    _make(db, f"UPDATE schema_version SET version = {SCHEMA_VERSION + 1}")
    before = _state(db)
    assert before[1] == "wal" and before[3] == ["monitoring.db"]
    with pytest.raises(MonitoringDBError, match=f"schema version {SCHEMA_VERSION + 1}"):
        MonitorWriter(db)
    assert _state(db) == before


def test_an_empty_file_or_database_becomes_a_monitoring_database(tmp_path: Path) -> None:
    """What Corral may write into: a file of no bytes, an SQLite database with no
    table yet, its own database with a table a user added. Written, in WAL mode."""
    empty = tmp_path / "empty.db"
    empty.touch()
    bare = _make(tmp_path / "bare.db", "PRAGMA user_version = 7;")
    own = tmp_path / "own.db"
    MonitorWriter(own).close()
    _make(own, "CREATE TABLE my_notes (note TEXT);")
    for db in (empty, bare, own):
        MonitorWriter(db).close()
        assert _state(db)[1] == "wal", db
        conn = open_db(db)
        try:
            assert conn.execute("SELECT version FROM schema_version").fetchall() == [
                (SCHEMA_VERSION,)
            ]
        finally:
            conn.close()


# ----------------------------------------------------------------------------- read-only


@pytest.fixture
def another_user() -> Iterator[list[str]]:
    """The command prefix that runs a program as a user who cannot write what this
    one made: none when not root (the files' modes apply to this user), else setpriv
    to nobody (skipped without it, with how to get it; with ``CI=true`` a failure).
    As nobody, this Python and this checkout must be reachable: a directory on their
    way that others may not enter (CI's fresh venv and clone live in a ``mktemp -d``
    directory, mode 700) is opened to them (o+rx) for the test, and closed again."""
    if os.geteuid() != 0:
        yield []
        return
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        why = "root is never refused a write: this test needs setpriv (util-linux) to be nobody"
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI must run this test")
        pytest.skip(why)
    closed: dict[Path, int] = {}
    for start in (Path(sys.prefix), Path(sys.executable).parent, ROOT):
        for d in (start, *start.parents):
            mode = d.stat().st_mode
            if d not in closed and (mode & 0o005) != 0o005:
                closed[d] = stat.S_IMODE(mode)
    try:
        for d, mode in closed.items():
            d.chmod(mode | 0o005)
        yield [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    finally:
        for d, mode in closed.items():
            d.chmod(mode)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory under the system's temporary directory that another user can
    reach (pytest's own are private to this user); removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="corral-ro-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        for d, _, _ in os.walk(top):
            os.chmod(d, 0o755)
        shutil.rmtree(top)


def _run_db(db: Path) -> None:
    """A monitoring database of one finished run (a task, its try), closed: no -wal."""
    MonitorWriter(db).close()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO runs (run_id, started, ended) VALUES ('r', ?, ?)", (T0, T0 + 9))
        conn.execute(
            "INSERT INTO tasks (run_id, key, category, ready, started, finished, state) "
            "VALUES ('r', 'a', 'a', ?, ?, ?, 'memory')",
            (T0, T0 + 1, T0 + 2),
        )
        conn.execute(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome) VALUES ('r', 'a', 1, 'a', 'w1', ?, ?, ?, 'ok')",
            (T0 + 1, T0 + 1, T0 + 2),
        )
    conn.close()
    assert not Path(f"{db}-wal").exists()


def _report_as(user: list[str], db: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*user, sys.executable, "-m", "runtime", "report", str(db), "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=out.parent,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip


def test_a_read_only_run_is_reported_and_one_that_needs_a_write_says_copy_it(
    shared: Path, another_user: list[str]
) -> None:
    """Another user's archived run: the file mode 444 in a directory mode 555. A
    finished run (no -wal) is reported (before: 'not an SQLite database (attempt to
    write a readonly database)'), and nothing is left beside it. A run killed (its
    -wal left, no -shm: SQLite would have to make one to read the log) is refused,
    saying to copy it and its -wal, not that it is no database."""
    user = another_user
    out = shared / "out"
    out.mkdir()
    out.chmod(0o777)
    done = shared / "done"
    done.mkdir()
    _run_db(done / "monitoring.db")
    killed = shared / "killed"
    killed.mkdir()
    live = sqlite3.connect(shared / "live.db")  # a run's file and -wal, as kill -9 leaves
    live.execute("PRAGMA journal_mode = WAL")
    live.execute("PRAGMA wal_autocheckpoint = 0")
    live.execute("CREATE TABLE t (x)")
    live.commit()
    shutil.copyfile(shared / "live.db", killed / "monitoring.db")
    shutil.copyfile(shared / "live.db-wal", killed / "monitoring.db-wal")
    live.close()
    for d in (done, killed):
        for f in d.iterdir():
            f.chmod(0o444)
        d.chmod(0o555)
    before = sorted(p.name for p in done.iterdir())
    proc = _report_as(user, done / "monitoring.db", out / "done.html")
    assert proc.returncode == 0, proc.stderr
    assert "read 1 tasks" in proc.stderr
    assert (out / "done.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in done.iterdir()) == before
    proc = _report_as(user, killed / "monitoring.db", out / "killed.html")
    assert proc.returncode == 1
    assert "read-only for this user" in proc.stderr, proc.stderr
    assert "copy it (and its -wal) somewhere writable" in proc.stderr
    assert "not an SQLite database" not in proc.stderr
    assert not (out / "killed.html").exists()


def test_a_live_run_another_user_may_only_read_is_reported_with_its_latest_rows(
    shared: Path, another_user: list[str]
) -> None:
    """A run that goes on, in a directory the reader cannot write: its -wal and -shm
    are there (the writer's), and SQLite reads the log through them without writing.
    The report has the rows written so far, those still only in the -wal too."""
    user = another_user
    out = shared / "out"
    out.mkdir()
    out.chmod(0o777)
    run = shared / "run"
    run.mkdir()
    db = run / "monitoring.db"
    _run_db(db)
    db.chmod(0o644)  # its owner shares it: a new database is its owner's alone (0600)
    writer = sqlite3.connect(db, isolation_level=None)  # the manager's connection, open
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")  # the new rows stay in the -wal
        writer.execute(
            "INSERT INTO tasks (run_id, key, category, state) VALUES ('r', 'b', 'b', 'waiting')"
        )
        assert Path(f"{db}-wal").stat().st_size > 0 and Path(f"{db}-shm").exists()
        run.chmod(0o555)
        proc = _report_as(user, db, out / "live.html")
        assert proc.returncode == 0, proc.stderr
        assert "read 2 tasks" in proc.stderr
        writer.execute(
            "INSERT INTO tasks (run_id, key, category, state) VALUES ('r', 'c', 'c', 'waiting')"
        )  # the writer goes on
    finally:
        writer.close()
        run.chmod(0o755)
    conn = open_db(db)
    try:
        assert conn.execute("SELECT count(*) FROM tasks").fetchone() == (3,)
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_a_second_manager_starts_on_a_database_another_is_writing(tmp_path: Path) -> None:
    """Two managers may share one --monitoring path. The first version of the checks
    took the write lock at every start (to make the schema in one transaction), so a
    manager starting while the other was writing a batch was refused after a second
    ("locked by another process"; a review's repro). A database with the whole schema
    of this version needs nothing made: the start takes no lock."""
    path = tmp_path / "shared.db"
    MonitorWriter(path).close()  # the first manager made it
    busy = sqlite3.connect(path, isolation_level=None)
    try:
        busy.execute("BEGIN IMMEDIATE")  # the first manager, in the middle of a batch
        busy.execute("INSERT INTO runs (run_id, started) VALUES ('a', 0)")
        MonitorWriter(path).close()  # the second manager starts, at once
    finally:
        busy.execute("COMMIT")
        busy.close()
    conn = open_db(path)
    try:
        assert conn.execute("SELECT run_id FROM runs").fetchall() == [("a",)]
    finally:
        conn.close()
