"""A monitoring database of an older schema version meets a newer Corral
(runtime/monitordb.py, upgrade audit): one a live process has open (an older Corral's
run writing into it) is refused as it is, and the manager stops before it listens;
one no process has open is copied as it was, then upgraded, and the manager says so
under its path. A manager that removed ended run directories (``--monitoring-keep``)
says how many."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime.errors import MonitoringDBError
from runtime.monitordb import SCHEMA_VERSION, MonitorWriter, Upgraded, open_db
from tests.helpers import Cli, free_port_between, log_lines
from tests.test_monitordb import TO_VERSION_4, _older, _rows

PORTS = (61000, 61999)
#: a version 4 file's rows, in five of its tables
ROWS_V4 = TO_VERSION_4 + (
    "INSERT INTO runs (run_id, started) VALUES ('r', 100.0); "
    "INSERT INTO tasks (run_id, key, category, finished, state, tries) "
    "VALUES ('r', 'a', 'a', 105, 'memory', 1), ('r', 'b', 'b', 106, 'erred', 1); "
    "INSERT INTO tries VALUES ('r', 'a', 1, 'a', 'w1', 104.0, 104.5, 105.0, 'ok', NULL, "
    "NULL, NULL, 8, 103.0); "
    "INSERT INTO workers (run_id, worker, joined) VALUES ('r', 'w1', 101.0); "
    "INSERT INTO metric_samples (run_id, time, name, labels, value) "
    "VALUES ('r', 102.0, 'm', '', 1.0), ('r', 103.0, 'm', '', 2.0);"
)
#: an older Corral's run: a connection writing into the file in WAL mode, kept open;
#: each line on its stdin a statement it runs, answered ``ok`` or the error
WRITER = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
    "c.execute('SELECT count(*) FROM runs').fetchall(); print('open', flush=True)\n"
    "for line in sys.stdin:\n"
    "    try:\n"
    "        c.execute(line); print('ok', flush=True)\n"
    "    except sqlite3.Error as exc:\n"
    "        print('error', exc, flush=True)\n"
)
#: a row of version 4's ``tries`` (14 columns), as an older Corral writes it
TRY_V4 = "INSERT INTO tries VALUES ('r','b',1,'b','w1',1.0,1.5,2.0,'error',NULL,'E','m',NULL,1.0)\n"


def _counts(db: Path) -> dict[str, int]:
    """The rows of each table of ``db``."""
    tables = [r[0] for r in _rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: _rows(db, f"SELECT count(*) FROM {t}")[0][0] for t in sorted(tables)}


def _columns(db: Path, table: str) -> list[str]:
    return [r[0] for r in _rows(db, f"SELECT name FROM pragma_table_info('{table}')")]


@contextmanager
def _old_run(db: Path) -> Iterator[subprocess.Popen[str]]:
    """An older Corral's run writing into ``db`` (another process: :data:`WRITER`)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db)], text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "open\n"
        yield proc
    finally:
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        proc.wait(10)


def _said(proc: subprocess.Popen[str], statement: str) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(statement)
    proc.stdin.flush()
    return proc.stdout.readline()


@pytest.mark.timeout(30)
def test_an_older_file_a_live_run_writes_into_is_refused_unchanged(tmp_path: Path) -> None:
    """F1: a newer Corral given the file an older one is still writing into upgraded its
    schema (4 to 11) under it: the old run's every later write failed ("table tries has
    20 columns but 14 values were supplied"), its rows lost. Now it is refused, saying
    why and what to do; nothing of the file changes and the old run writes on. Once
    that run is over, the file is upgraded."""
    db = tmp_path / "shared.db"
    _older(db, ROWS_V4)
    with _old_run(db) as old:
        with pytest.raises(MonitoringDBError) as refused:
            MonitorWriter(db)
        assert "it has schema version 4, and a live process has it open: an older Corral's " \
            "run is writing into it now" in str(refused.value)  # fmt: skip
        assert "stop it first, or give --monitoring another path" in str(refused.value)
        assert _rows(db, "SELECT version FROM schema_version") == [(4,)]
        assert not list(tmp_path.glob("shared.db.schema*"))
        assert _said(old, TRY_V4) == "ok\n"  # the old run's writes go on
    assert _counts(db)["tries"] == 2
    writer = MonitorWriter(db)  # that run over: upgraded
    writer.close()
    assert writer.upgraded == Upgraded(4, Path(f"{db}.schema4"))
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


@pytest.mark.timeout(30)
def test_an_older_file_is_copied_as_it_was_then_upgraded(tmp_path: Path) -> None:
    """F2: the upgrade was silent (an info log) and one-way: the older Corral could not
    read its own history any more. Now the file as it was is copied first (SQLite's
    backup) to ``PATH.schemaN``: the older version, its tables, columns and rows; the
    upgrade is logged as a warning naming the copy. A copy of that name is never
    overwritten: the next one is ``PATH.schemaN.2``."""
    db = tmp_path / "lab.db"
    _older(db, ROWS_V4)
    before, tries_before = _counts(db), _columns(db, "tries")
    with log_lines("corral.monitoring", logging.WARNING) as seen:
        writer = MonitorWriter(db)
        writer.close()
    copy = Path(f"{db}.schema4")
    assert writer.upgraded == Upgraded(4, copy)
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(copy, "SELECT version FROM schema_version") == [(4,)]
    assert _counts(copy) == before and before["metric_samples"] == 2 and before["tasks"] == 2
    assert _columns(copy, "tries") == tries_before != _columns(db, "tries")
    assert oct(copy.stat().st_mode & 0o777) == oct(0o600)
    assert seen.has("upgraded in place from schema version 4", str(copy)), seen.lines
    conn = open_db(copy)  # (and a Corral that reads version 4 reads it)
    conn.close()
    # the file restored from the copy and upgraded again: the first copy stays as it is
    held = hashlib.sha256(copy.read_bytes()).hexdigest()
    db.unlink()
    db.write_bytes(copy.read_bytes())
    again = MonitorWriter(db)
    again.close()
    assert again.upgraded == Upgraded(4, Path(f"{db}.schema4.2"))
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == held
    assert _counts(Path(f"{db}.schema4.2")) == before
    current = MonitorWriter(db)  # nothing to upgrade: no copy
    current.close()
    assert current.upgraded is None
    assert sorted(p.name for p in tmp_path.glob("lab.db.schema*")) == [
        "lab.db.schema4", "lab.db.schema4.2"
    ]  # fmt: skip


@pytest.mark.timeout(60)
def test_a_manager_stops_before_it_listens_on_a_file_an_older_run_writes(tmp_path: Path) -> None:
    """F1 through the command line: a manager given a file of version 4 that an older
    Corral's run writes into stops with exit 1 before it listens, saying why and what
    to do; the file stays as it was."""
    db = tmp_path / "lab.db"
    _older(db, ROWS_V4)
    with Cli(tmp_path / "home") as cli, _old_run(db):
        refused = cli.start(
            "manager", "--listen", f"127.0.0.1:{free_port_between(*PORTS)}",
            "--monitoring", str(db),
        )  # fmt: skip
        out = "".join(cli.rest(refused, limit=30))
        assert refused.wait(10) == 1, out
    assert f"error: MonitoringDBError: monitoring database {db}: it has schema version 4" in out
    assert "stop it first, or give --monitoring another path" in out
    assert "manager listening on" not in out and "monitoring database:" not in out
    assert _rows(db, "SELECT version FROM schema_version") == [(4,)]
    assert not list(tmp_path.glob("lab.db.schema*"))


@pytest.mark.timeout(60)
def test_a_manager_says_under_its_database_that_it_upgraded_it(tmp_path: Path) -> None:
    """F2 through the command line: a manager that upgrades a file of version 4 says so
    under its path, naming the copy of the file as it was."""
    db = tmp_path / "lab.db"
    _older(db, ROWS_V4)
    with Cli(tmp_path / "home") as cli:
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{free_port_between(*PORTS)}",
            "--monitoring", str(db),
        )  # fmt: skip
        seen: list[str] = []
        cli.line_with(manager, "manager listening on", seen=seen)
        cli.stop([manager])
    at = seen.index(f"monitoring database: {db}\n")
    assert seen[at + 1] == (
        f"  upgraded from schema 4 to {SCHEMA_VERSION}; the file as it was: {db}.schema4 (an "
        "older Corral reads that copy)\n"
    )
    assert seen[at + 2].startswith("  report: ")
    assert _rows(Path(f"{db}.schema4"), "SELECT version FROM schema_version") == [(4,)]


@pytest.mark.timeout(60)
def test_a_manager_says_how_many_ended_run_directories_it_removed(tmp_path: Path) -> None:
    """F7: ``--monitoring-keep`` removed older run directories (an older Corral's demo
    runs too) and said so at info only. Now the start output says how many, beside the
    history kept."""
    home = tmp_path / "home"
    runs = home / "runs"
    old = time.time() - 3600
    for name in ("20261201-000000-aaaaaa", "20261201-000001-bbbbbb"):
        (runs / name).mkdir(parents=True)
        MonitorWriter(runs / name / "monitoring.db").close()
        for f in (*(runs / name).iterdir(), runs / name):
            os.utime(f, (old, old))
    with Cli(home) as cli:
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{free_port_between(*PORTS)}",
            "--monitoring-keep", "1s",
        )  # fmt: skip
        seen: list[str] = []
        cli.line_with(manager, "manager listening on", seen=seen)
        cli.stop([manager])
    kept = next(i for i, ln in enumerate(seen) if ln.startswith("  history kept: 1s"))
    assert seen[kept + 1] == f"  removed 2 ended run directories older than 1s under {runs}\n"
    assert len(list(runs.iterdir())) == 1  # its own
