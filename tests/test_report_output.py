"""Where the report goes (``report RUN.db -o PATH``): never over the database it reads
(nor its -wal, nor any SQLite file), live or not; a path it cannot write is refused
before the report is built, with what to do; a write that fails leaves the file it
would have replaced as it was, and nothing beside it."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.monitordb import MonitorWriter, open_db
from runtime.report import ReportOutputError, write_report
from tests.helpers import Cli

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


def _db(path: Path) -> Path:
    """A monitoring database with one small run (a task and its try)."""
    MonitorWriter(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO runs (run_id, started, ended) VALUES ('r', ?, ?)", (T0, T0 + 9))
        conn.execute(
            "INSERT INTO tasks (run_id, key, category, submitted, ready, started, finished, "
            "state) VALUES ('r', 'a', 'a', ?, ?, ?, ?, 'memory')",
            (T0, T0, T0 + 1, T0 + 2),
        )
        conn.execute(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome) VALUES ('r', 'a', 1, 'a', 'w1', ?, ?, ?, 'ok')",
            (T0 + 1, T0 + 1, T0 + 2),
        )
    conn.close()
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _report(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "report", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip


class _Progress:
    """The report's progress lines: any means it started reading the database."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def test_the_report_is_never_written_over_the_database_it_reads(tmp_path: Path) -> None:
    """``-o`` the database itself (as given, by another spelling, through a symlink),
    its ``-wal`` or another SQLite database: refused before anything is read, each
    file byte for byte as it was; the command line says the same and exits 1."""
    db = _db(tmp_path / "victim.db")
    other = _db(tmp_path / "other.db")
    (tmp_path / "link.html").symlink_to(db)
    before = {p: _sha(p) for p in (db, other)}
    cases = {
        str(db): "is the monitoring database being reported",
        f"{tmp_path}/./victim.db": "is the monitoring database being reported",
        str(tmp_path / "link.html"): "is the monitoring database being reported",
        f"{db}-wal": "-wal file of the monitoring database",
        str(other): "an SQLite database",
    }
    for out, why in cases.items():
        progress = _Progress()
        with pytest.raises(ReportOutputError, match=why) as caught:
            write_report(db, out, progress=progress)
        assert "give -o another path" in str(caught.value), out
        assert progress.lines == [], out  # refused before the report was built
    assert {p: _sha(p) for p in (db, other)} == before
    assert not Path(f"{db}-wal").exists()
    proc = _report("victim.db", "-o", "victim.db", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "ReportOutputError" in proc.stderr and "nothing was written" in proc.stderr
    assert {p: _sha(p) for p in (db, other)} == before
    open_db(db).close()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as c:
        yield c


def test_the_report_of_a_live_run_refuses_to_write_over_its_database(
    cli: Cli, tmp_path: Path
) -> None:
    """The audit's case: a manager writes ``live.db``; ``report live.db -o live.db``
    is refused, and the manager's record of its run is whole once it stops."""
    db = tmp_path / "live.db"
    manager = cli.start("manager", "--listen", "127.0.0.1:0", "--monitoring", str(db),
                        "--monitoring-interval", "0.1")  # fmt: skip
    cli.line_with(manager, "manager listening on")
    assert db.is_file()  # made before the manager says it listens
    proc = _report(str(db), "-o", str(db), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "is the monitoring database being reported" in proc.stderr
    proc = _report(str(db), "-o", f"{db}-wal", cwd=tmp_path)  # the live log, by name
    assert proc.returncode == 1 and "-wal file of the monitoring database" in proc.stderr
    cli.stop([manager])
    assert manager.returncode == 0
    conn = open_db(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT ended IS NOT NULL FROM runs").fetchall() == [(1,)]
    finally:
        conn.close()


def test_an_output_path_that_cannot_be_written_is_refused_before_the_report_is_built(
    tmp_path: Path,
) -> None:
    """A directory, a missing directory, a directory no file can be made in: each a
    ReportOutputError saying what to do, before the database is read (no progress),
    nothing made."""
    db = _db(tmp_path / "monitoring.db")
    adir = tmp_path / "adir"
    adir.mkdir()
    cases = {
        str(adir): re.escape(f"a directory: give -o a file in it, e.g. -o {adir / 'report.html'}"),
        str(tmp_path / "nosuchdir" / "r.html"): "no directory .*nosuchdir: make it first",
    }
    if Path("/proc/self").is_dir():  # a file system no file can be made in
        cases["/proc/x.html"] = r"cannot write in /proc \(.*\): give -o a path in a directory"
    for out, why in cases.items():
        progress = _Progress()
        with pytest.raises(ReportOutputError, match=why):
            write_report(db, out, progress=progress)
        assert progress.lines == [], out
    assert list(adir.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "monitoring.db"]
    proc = _report("monitoring.db", "-o", "nosuchdir/r.html", cwd=tmp_path)
    assert proc.returncode == 1
    assert "ReportOutputError" in proc.stderr and "mkdir -p" in proc.stderr
    assert "reading" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_write_that_fails_leaves_the_old_report_and_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills as the report is written (``fsync`` fails with ENOSPC): the
    report there before is as it was, with nothing beside it. A write that works
    replaces it at once, with its permissions."""
    db = _db(tmp_path / "monitoring.db")
    out = tmp_path / "out"
    out.mkdir()
    old = out / "report.html"
    old.write_text("the previous report\n")
    old.chmod(0o640)
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ReportOutputError, match=r"cannot write it \(No space left"):
        write_report(db, old)
    assert old.read_text() == "the previous report\n"
    assert [p.name for p in out.iterdir()] == ["report.html"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert write_report(db, old) == old
    assert old.read_text().startswith("<!DOCTYPE html>")
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert [p.name for p in out.iterdir()] == ["report.html"]
    new = out / "new.html"
    write_report(db, new)  # a new file: 0600, as the database it shows
    assert stat.S_IMODE(new.stat().st_mode) == 0o600


def test_a_new_report_is_0600_like_its_database_whatever_the_umask(tmp_path: Path) -> None:
    """``report DB -o report.html`` under umask 022 writes the report 0600, as the
    database (it holds the same keys, errors and tracebacks); it was 0644."""
    db = _db(tmp_path / "monitoring.db")
    umask = os.umask(0o022)
    try:
        proc = _report(str(db), "-o", "report.html", cwd=tmp_path)
    finally:
        os.umask(umask)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o600


def test_the_report_goes_to_stdout_through_a_pipe_and_appends_to_a_redirection(
    tmp_path: Path,
) -> None:
    """`-o /dev/stdout | ...`: /dev/stdout resolves to /proc/PID/fd/pipe:[N], no path,
    and the first version of the output checks refused it ("cannot write in
    /proc/PID/fd"); redirected with >> to a file, it replaced the file (renamed over
    it) instead of appending (a review found both). Both are written in place."""
    db = _db(tmp_path / "run.db")
    piped = _report(str(db), "-o", "/dev/stdout", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert "<html" in piped.stdout and piped.stdout.rstrip().endswith("</html>")
    out = tmp_path / "log.html"
    out.write_text("before\n")
    with out.open("a") as f:
        done = subprocess.run(
            [sys.executable, "-m", "runtime", "report", str(db), "-o", "/dev/stdout"],
            stdout=f, stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.startswith("before\n") and "<html" in text
