"""Why tasks failed, in the monitoring database and its report, after the manager is
gone: each failed try's traceback (bounded, saying when it was cut), the cause the
metrics and the dashboard count it under, why a task that never ran erred (its
dependency failed), outputs released, and the report's "Why tasks failed" table,
grouped as the dashboard groups failures.

A user audit (a run of a manager and workers: tasks raising, an out-of-memory task, a
worker killed with kill -9, a task whose dependency failed) found the database had no
traceback, nothing at all for the task whose dependency failed, an empty
``error_message`` for the try lost with its worker, an empty ``cause`` for the
out-of-memory try (the metrics said ``oom``), and ``tasks.state = 'memory'`` for 25
tasks whose outputs were released (the metrics said 0 held).

A real run: a worker process (killable task processes, a memory limit) on loopback
websockets, every wait bounded. The worker lost with kill -9 is in
tests/test_monitordb.py (a manager process and its worker processes).
"""

from __future__ import annotations

import html
import subprocess
import sys
import traceback
from pathlib import Path

import anyio
import pytest

from actors.scheduler import MAX_TRACEBACK_TEXT
from runtime import Cluster
from runtime.dashboard import story_page
from runtime.errors import NOT_CAPTURED_NOTE, DependencyFailed, TaskOutOfMemory
from runtime.messages import MetricsReply, MetricsRequest
from runtime.report import FAILURES_TITLE, build_report
from tests.helpers import wait_until
from tests.test_memory_cluster import MEMORY, hog
from tests.test_monitordb import _doc_sql, _rows
from tests.test_report_sql import _run

pytestmark = pytest.mark.anyio
LIMIT = 120  # seconds for the run


# -- tasks (named, so that their frames can be told in a traceback)


def read_row(i: int) -> int:
    return parse_row(i)


def parse_row(i: int) -> int:
    raise ValueError(f"bad row {i}")


def layered(i: int) -> int:
    """Raises a chain of five errors, each with a long text: a traceback of more than
    MAX_TRACEBACK_TEXT characters."""
    try:
        try:
            try:
                try:
                    raise KeyError("a" * 1900)
                except KeyError as exc:
                    raise OSError("b" * 1900) from exc
            except OSError as exc:
                raise LookupError("c" * 1900) from exc
        except LookupError as exc:
            raise TypeError("d" * 1900) from exc
    except TypeError as exc:
        raise RuntimeError(f"layer {i} " + "e" * 1900) from exc


class TwoArgError(Exception):
    """A user audit's (monitor, defect 3): its ``__init__`` takes two arguments, its
    pickle gives one, so it does not load again: a ``RuntimeError`` stands for it."""

    def __init__(self, path: str, line: int) -> None:
        super().__init__(f"{path}:{line} is corrupt")


def read_file(line: int) -> int:
    raise TwoArgError("/data/run0.root", line)


def flaky_read(mark: str) -> str:
    """Fails its first try (no ``mark`` yet), then finishes."""
    if not Path(mark).exists():
        Path(mark).touch()
        raise ConnectionError("the server went away")
    return "read"


def total(x: int) -> int:
    return x


def square(x: int) -> int:
    return x * x


#: what the external tool of :func:`wcs_tool` writes to stderr before it exits 3: a
#: line, 3,000 characters of noise, then the line that says why
TOOL = (
    "import sys; sys.stderr.write('starting\\n' + 'x' * 3000 + "
    "'\\nERROR: bad WCS header in ccd3.fits\\n'); sys.exit(3)"
)


def wcs_tool(ccd: int) -> str:
    """A Parsl bash_app's step: an external tool run with ``check=True``."""
    done = subprocess.run([sys.executable, "-c", TOOL], check=True, capture_output=True)
    return done.stdout.decode()


def uncaptured_tool(stderr_file: str) -> None:
    """A bash_app converted without capturing the tool's output: its stderr goes where
    the task's goes, or (given a path) to that file, as Parsl's ``stderr=``."""
    script = "import sys; print('ERROR: bad WCS header', file=sys.stderr); sys.exit(4)"
    if not stderr_file:
        subprocess.run([sys.executable, "-c", script], check=True)
        return
    with open(stderr_file, "w") as err:
        subprocess.run([sys.executable, "-c", script], check=True, stderr=err)


async def test_a_tool_whose_stderr_was_not_captured_says_where_it_went(tmp_path: Path) -> None:
    """A user audit (parsl): a tool run without ``capture_output=True`` (its stderr in
    the worker's log, or in a file as Parsl's ``stderr=`` puts it) failed with
    ``returned non-zero exit status 4.`` alone, in the client and the database. Now
    its error says where its stderr went and to capture it, in both."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, monitoring=db, monitoring_interval=0.2) as c:
            for key, where in (("plain", ""), ("to-file", str(tmp_path / "tool.err"))):
                with pytest.raises(subprocess.CalledProcessError) as caught:
                    await c.submit(uncaptured_tool, where, key=key)
                assert caught.value.returncode == 4 and caught.value.stderr is None
                assert caught.value.__notes__[0] == NOT_CAPTURED_NOTE
                assert NOT_CAPTURED_NOTE in "".join(traceback.format_exception(caught.value))
            await wait_until(
                lambda: _rows(db, "SELECT count(*) FROM tasks WHERE state = 'erred'") == [(2,)],
                "the erred tasks in the database",
                limit=30,
            )
    assert (tmp_path / "tool.err").read_text() == "ERROR: bad WCS header\n"
    failed = _rows(db, _doc_sql("Which tasks failed for good"))
    assert sorted(key for key, *_ in failed) == ["plain", "to-file"]
    for _, _, _, cause, error, _ in failed:
        assert cause is None and error.startswith("CalledProcessError: Command '[")
        assert error.endswith(f"returned non-zero exit status 4.\n{NOT_CAPTURED_NOTE}")


async def test_a_run_s_failures_are_in_the_database_and_report_as_on_the_dashboard(
    tmp_path: Path,
) -> None:
    db = tmp_path / "monitoring.db"
    options = {"execution": "process", "spill": None}
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, memory_per_worker=MEMORY, memory_options=options,
                           monitoring=db, monitoring_interval=0.2) as c:  # fmt: skip
            await c.wait_for_workers(1, timeout=60)
            squares = c.map(square, range(6))
            assert await c.gather(squares) == [0, 1, 4, 9, 16, 25]
            for f in squares[:4]:  # their outputs released; the last two held (and flaky-0)
                f.release()
            bad = c.submit(read_row, 3, key="read-3")
            after = c.submit(total, bad, key="summary-0")
            deep = c.submit(layered, 1, key="layered-1")
            with pytest.raises(ValueError, match="bad row 3"):
                await bad
            with pytest.raises(DependencyFailed):
                await after
            with pytest.raises(RuntimeError, match="layer 1"):
                await deep
            with pytest.raises(RuntimeError, match=r"TwoArgError: /data/run0\.root:17 is corrupt"):
                await c.submit(read_file, 17, key="corrupt-17")
            with pytest.raises(TaskOutOfMemory):
                await c.submit(hog, MEMORY, key="hog-0")
            flaky = c.submit(flaky_read, str(tmp_path / "flaky-mark"), key="flaky-0", retries=1)
            assert await flaky == "read"  # after a failed try: its group says it finished
            await wait_until(
                lambda: _rows(db, "SELECT count(*) FROM tasks WHERE state = 'released'") == [(4,)],
                "the released outputs in the database",
                limit=30,
            )
            metrics: MetricsReply = await c._manager.ask(MetricsRequest(details=True))
            held = (await c.status())["tasks_by_state"].get("memory", 0)
    # 1. each failed try's traceback, its end kept; a long one cut, saying so
    (tb,) = _rows(db, "SELECT traceback FROM tries WHERE key = 'read-3'")[0]
    assert "in read_row" in tb and "in parse_row" in tb
    assert tb.rstrip().endswith("ValueError: bad row 3")
    (tb,) = _rows(db, "SELECT traceback FROM tries WHERE key = 'layered-1'")[0]
    assert tb.startswith("(traceback cut: its first ")
    assert tb.rstrip().endswith("e" * 100) and "in layered" in tb
    assert len(tb) < MAX_TRACEBACK_TEXT + 100
    # 2. the task that never ran says why: its dependency and that one's error
    why_not = _rows(db, "SELECT state, tries, cause, error, root FROM tasks WHERE key = ?",
                    "summary-0")  # fmt: skip
    reason = "dependency 'read-3' failed: ValueError: bad row 3"
    assert why_not == [("erred", 0, "dependency-failed", reason, "read-3")]
    # 4. the causes of the metrics, out of memory's ("oom") too
    causes = _rows(db, "SELECT category, outcome, cause, count(*) FROM tries "
                   "WHERE outcome != 'ok' GROUP BY 1, 2, 3 ORDER BY 1")  # fmt: skip
    assert causes == sorted((f.category, f.outcome, f.cause, f.n) for f in metrics.failures)
    ooms = sum(f.n for f in metrics.failures if f.category == "hog")  # (1 or 2 tries)
    assert ooms and [c for c in causes if c[0] == "hog"] == [("hog", "oom", "oom", ooms)]
    why = {r[:3]: r[3] for r in _rows(db, _doc_sql("Failures by cause"))}
    assert why[("hog", "oom", "oom")] == ooms
    assert why[("summary", "not-run", "dependency-failed")] == 1
    # 4b. an exception that could not travel back counts under its own type, not under
    # the RuntimeError that stands for it (it was RuntimeError in every count and group)
    (row,) = _rows(db, "SELECT outcome, cause, error_type, error_message FROM tries "
                   "WHERE key = 'corrupt-17'")  # fmt: skip
    assert row[:3] == ("error", "TwoArgError", "TwoArgError")
    assert "a RuntimeError stands for TwoArgError(" in row[3]
    assert ("corrupt", "error", "TwoArgError", 1) in causes
    # 5. released outputs are not counted held
    assert _rows(db, "SELECT count(*) FROM tasks WHERE state = 'memory'") == [(held,)]
    assert held == 3  # the last two squares and flaky-0
    released = _rows(db, "SELECT finished <= released FROM tasks WHERE state = 'released'")
    assert released == [(1,)] * 4
    # 6. the report's groups are the dashboard's: count, latest key and worker, error
    # and traceback
    run = _run(db)
    assert run.states["memory"] == 3 and run.states["released"] == 4
    # and of how many tasks, how many of which erred (the flaky one finished)
    dashboard = sorted(
        (g.category, g.cause, g.outcome, g.n, g.key, g.worker, g.error, g.traceback,
         g.tasks, g.erred)
        for g in metrics.failure_groups
    )  # fmt: skip
    assert sorted(run.why_failed) == dashboard
    assert {g[1] for g in dashboard} == {"ValueError", "RuntimeError", "TwoArgError", "oom",
                                          "dependency-failed", "ConnectionError"}  # fmt: skip
    assert {(g[0], g[3], g[8], g[9]) for g in dashboard} >= {
        ("flaky", 1, 1, 0), ("read", 1, 1, 1), ("hog", ooms, 1, 1), ("summary", 1, 1, 1),
        ("corrupt", 1, 1, 1),
    }  # fmt: skip
    page = build_report(db)
    start = page.index(f"<h2>{FAILURES_TITLE}</h2>")
    table = page[start : page.index("</table>", start)]
    assert table.count("<tr class=failure") == 6
    assert "data-cause='TwoArgError'" in table
    assert "data-cause='dependency-failed' data-outcome='not-run'" in table
    assert "1 task</td>" in table and f"{ooms} x</td><td>1</td><td>1</td>" in table
    assert (
        "data-category='flaky' data-cause='ConnectionError' data-outcome='error'><td "
        "class=count>1 x</td><td>1</td><td>0</td>" in table
    )
    assert "<details><summary>traceback</summary>" in table and "in parse_row" in table
    assert "finished, output held (memory)</th><td>3<" in page
    assert "finished, output released since (released)</th><td>4<" in page


async def test_an_external_tool_s_stderr_and_the_tasks_that_failed_for_good_are_recorded(
    tmp_path: Path,
) -> None:
    """A user audit (parslmig, 5): a task whose external tool failed
    (``CalledProcessError``) was recorded as ``Command '[...]' returned non-zero exit
    status 3.`` alone, the tool's stderr (why) nowhere but in the client's exception;
    and ``tasks.error`` was empty for a task that failed in its own tries. Now the
    client's exception carries a note with the end of the tool's stderr (its traceback
    prints it; that it travels from another process: tests/test_command_output.py),
    the dashboard's failure group, the try's row and the task's row end their text with
    it, and the documented "Which tasks failed for good" query lists the task with that
    reason and its dependent with the dependency's."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, monitoring=db, monitoring_interval=0.2) as c:
            bad = c.submit(wcs_tool, 3, key="wcs-3", retries=1)
            after = c.submit(total, bad, key="coadd-0")
            with pytest.raises(subprocess.CalledProcessError) as caught:
                await bad
            with pytest.raises(DependencyFailed):
                await after
            metrics: MetricsReply = await c._manager.ask(MetricsRequest(details=True))
            await wait_until(
                lambda: _rows(db, "SELECT count(*) FROM tasks WHERE state = 'erred'") == [(2,)],
                "the erred tasks in the database",
                limit=30,
            )
    err = caught.value
    assert err.returncode == 3 and err.stderr.endswith(b"ERROR: bad WCS header in ccd3.fits\n")
    tail = ("x" * 3000 + "\nERROR: bad WCS header in ccd3.fits")[-2000:]  # (its blanks cut)
    note = f"the command's stderr (its last 2000 characters):\n{tail}"
    assert err.__notes__[0] == note and len(err.__notes__) == 2
    # (then the client's, naming the task, its worker and the try that raised it)
    assert err.__notes__[1].startswith("(raised by task 'wcs-3' on worker '")
    assert err.__notes__[1].endswith("', try 2 of 2)")
    assert note in "".join(traceback.format_exception(err))
    said = f"{err}\n{note}"  # the error's text, then the note
    assert said.startswith("Command '[") and "returned non-zero exit status 3." in said
    # the dashboard's group, and each try's row
    (group,) = [g for g in metrics.failure_groups if g.key == "wcs-3"]
    assert (group.cause, group.n, group.error) == (
        "CalledProcessError",
        2,
        f"CalledProcessError: {said}",
    )
    assert group.traceback.rstrip().endswith(tail)
    story = story_page("wcs-3", [], [group])  # the task's story page shows its group's
    assert f"<pre class='error'>{html.escape(group.error)}</pre>" in story
    tries = _rows(db, "SELECT try, error_type, error_message FROM tries WHERE key = 'wcs-3'")
    assert tries == [(1, "CalledProcessError", said), (2, "CalledProcessError", said)]
    # the documented query: the tasks that failed for good, and why
    failed = _rows(db, _doc_sql("Which tasks failed for good"))
    assert sorted(failed) == [
        ("coadd-0", "coadd", 0, "dependency-failed",
         f"dependency 'wcs-3' failed: CalledProcessError: {said}", "wcs-3"),
        ("wcs-3", "wcs", 2, None, f"CalledProcessError: {said}", None),
    ]  # fmt: skip
