"""Picking what the report is of, in a database of several runs (``report RUN.db --list``,
``--run``, ``--since``/``--until``): the runs listed with their tasks and failures; the
report of one run, or of a window in one (a manager that served several clients one
after the other writes them all into one run), shows only what overlaps it in every
plot; an unknown run, a window outside the run, across runs or with no task in it, or a
time it cannot read is refused with a ``ReportRunError`` that says what is there.

The database is written by real embedded clusters, two starts on one file: run 1 runs
``first`` on one worker; run 2 runs ``second`` and a failing task on two workers, then
(after an idle stretch) ``third``, as a second client's graph would come."""

from __future__ import annotations

import datetime
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import MonitoringDBError, ReportRunError
from runtime.monitordb import MonitorWriter, open_db
from runtime.report import _absolute, _Run, build_report, list_runs

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 90
#: the idle stretch of run 2 between its two graphs, seconds: a window in it has no task
IDLE = 0.6


def first(x: int) -> int:
    return x + 1


def second(x: int) -> int:
    return x * 2


def third(x: int) -> int:
    return x * 3


def fails(x: int) -> int:
    raise KeyError(f"no such thing {x}")


@dataclass
class Runs:
    db: Path
    one: str  #: run 1's id
    two: str  #: run 2's id
    ended_one: float  #: when run 1 ended
    started_two: float  #: when run 2 started
    #: run 2's idle stretch: after the last of its first graph, before its second
    idle: tuple[float, float]


async def _record(db: Path) -> None:
    async with Cluster(workers=1, monitoring=db, monitoring_interval=0.1) as cluster:
        assert await cluster.gather(cluster.map(first, range(5))) == [1, 2, 3, 4, 5]
    async with Cluster(workers=2, monitoring=db, monitoring_interval=0.1) as cluster:
        assert await cluster.gather(cluster.map(second, range(7))) == [2 * i for i in range(7)]
        with pytest.raises(KeyError):
            await cluster.submit(fails, 1)
        # Not a wait for something to happen: the run's idle stretch between two
        # clients' graphs, which a window can then fall in.
        await anyio.sleep(IDLE)
        assert await cluster.gather(cluster.map(third, range(4))) == [3 * i for i in range(4)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    db = tmp_path_factory.mktemp("runs") / "monitoring.db"

    async def record() -> None:
        with anyio.fail_after(LIMIT):
            await _record(db)

    anyio.run(record)
    conn = sqlite3.connect(db)
    try:
        (one, ended_one), (two, started_two) = conn.execute(
            "SELECT run_id, CASE WHEN ended IS NULL THEN started ELSE ended END FROM runs "
            "ORDER BY started"
        ).fetchall()
        (started_two,) = conn.execute(
            "SELECT started FROM runs WHERE run_id = ?", (two,)
        ).fetchone()
        # the idle stretch: from the last end of the first graph's tasks and tries to the
        # first submission of the second's
        (busy,) = conn.execute(
            "SELECT MAX(at) FROM (SELECT MAX(finished) AS at FROM tasks WHERE run_id = ?1 AND "
            "key NOT LIKE 'third%' UNION ALL SELECT MAX(ended) FROM tries WHERE run_id = ?1 "
            "AND key NOT LIKE 'third%')", (two,),
        ).fetchone()  # fmt: skip
        (later,) = conn.execute(
            "SELECT MIN(submitted) FROM tasks WHERE run_id = ? AND key LIKE 'third%'", (two,)
        ).fetchone()
    finally:
        conn.close()
    assert busy < later, (busy, later)
    yield Runs(db, one, two, ended_one, started_two, (busy, later))


def _run(db: Path, **pick: str | None) -> _Run:
    conn = open_db(db)
    try:
        return _Run(conn, pick.pop("run_id", None), lambda line: None, **pick)
    finally:
        conn.close()


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "report", *args],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip


def _families(run: _Run) -> set[str]:
    """The functions whose tries the timeline draws (a key is ``name-token``)."""
    return {key.split("-")[0] for key, *_ in run.latest}


@pytest.mark.timeout(150)
def test_the_runs_are_listed_with_their_tasks_failures_and_workers(
    runs: Runs, tmp_path: Path
) -> None:
    listed = list_runs(runs.db)
    assert [r.run_id for r in listed] == [runs.one, runs.two]
    one, two = listed
    assert (one.tasks, one.erred, one.failed_tries, one.workers) == (5, 0, 0, 1)
    assert (two.tasks, two.erred, two.failed_tries, two.workers) == (12, 1, 1, 2)
    assert one.ended is not None and two.ended is not None
    assert two.duration >= IDLE
    proc = _report(str(runs.db), "--list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["run", "started", "(UTC)"]
    assert [line.split()[0] for line in lines[1:]] == [runs.one, runs.two]
    # tasks, erred, failed tries and workers of run 2, in their columns
    assert lines[2].split()[7:11] == ["12", "1", "1", "2"]  # (after "0.7 s")

    # a database with no run yet says so
    MonitorWriter(tmp_path / "empty.db").close()
    proc = _report(str(tmp_path / "empty.db"), "--list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == [
        "(no run yet: a manager or cluster writes its run's first rows within seconds)"
    ]


@pytest.mark.timeout(60)
def test_the_report_of_one_run_shows_only_its_tasks_and_workers(runs: Runs) -> None:
    # picked by its id, or by a window of times that only it overlaps
    by_id = _run(runs.db, run_id=runs.one)
    by_time = _run(runs.db, since=str(runs.ended_one - 3600), until=str(runs.ended_one))
    for run in (by_id, by_time):
        assert run.id == runs.one
        assert run.tasks == 5 and run.tries == 5
        assert _families(run) == {"first"}
        assert {w[0] for w in run.workers} == {"worker-1"}
        assert set(run.durations) == {"first"}
        assert run.why_failed == []
    # the default: the latest run, whole
    latest = _run(runs.db)
    assert latest.id == runs.two and latest.window is None
    assert _families(latest) == {"second", "fails", "third"}
    assert len(latest.workers) == 2


@pytest.mark.timeout(60)
def test_a_window_shows_what_overlaps_it_in_every_plot(runs: Runs, tmp_path: Path) -> None:
    """Run 2 from its idle stretch on: the second client's graph alone (``third``), not
    the first's tasks, tries, failures or durations; every time plot spans the window."""
    since = str(sum(runs.idle) / 2)
    run = _run(runs.db, run_id=runs.two, since=since)
    assert run.window is not None and run.window[0] == float(since)
    assert run.tasks == 4 and run.tries == 4
    # all four finished; the map's futures were let go after the gather, and whether
    # the database saw that release before the run ended (the stop ends the run first)
    # is a race: released or still in memory, never anything else
    assert run.states in ({"memory": 4}, {"released": 4}), run.states
    assert _families(run) == {"third"}
    assert set(run.durations) == {"third"} and run.others is None
    assert run.why_failed == [] and run.failures == []
    assert {w[0] for w in run.workers} == {"worker-1", "worker-2"}
    assert run.start == pytest.approx(float(since) - runs.started_two)
    # a sample before the window holds into it: no point of a line is after its end,
    # and none but the one held before its start
    for line in (*run.rss.values(), *run.queues.values(), *run.disk.values()):
        assert all(x <= run.end + 1e-9 for x in line.xs)
        assert sum(x < run.start for x in line.xs) <= 1
    assert run.queues, "the queue samples of run 2 in the window"
    # the file: the same from the command line, every plot's x axis over the window
    out = tmp_path / "report.html"
    proc = _report(str(runs.db), "--run", runs.two, "--since", since, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "read 4 tasks" in proc.stderr
    page = out.read_text()
    keys = set(re.findall(r"\b(first|second|fails|third)-[0-9a-f]{32}\b", page))
    assert keys == {"third"}
    assert "KeyError" not in page
    assert f'"range":[{run.start!r},' in page.replace(" ", "")
    # the whole of run 2, as before: both graphs and the failure
    whole = _run(runs.db, run_id=runs.two)
    assert whole.tasks == 12 and _families(whole) == {"second", "fails", "third"}
    assert whole.start == 0.0


@pytest.mark.timeout(60)
def test_the_last_stretch_of_a_run_counts_back_from_its_end(runs: Runs, tmp_path: Path) -> None:
    """``--since=-DURATION`` and ``--last DURATION``: the run's last stretch (an operator
    of a manager that runs for days asks of its last hour); ``--since -1h`` was argparse's
    "expected one argument", and there was no form of it."""
    mid = sum(runs.idle) / 2
    info = next(r for r in list_runs(runs.db) if r.run_id == runs.two)
    assert info.ended is not None
    end = info.ended
    back = f"{end - mid:.3f}s"
    run = _run(runs.db, run_id=runs.two, since=f"-{back}")
    assert run.window == pytest.approx((end - float(back[:-1]), end))
    assert run.tasks == 4 and _families(run) == {"third"}  # as from its idle stretch on
    out = tmp_path / "report.html"
    for args in (("--last", back), (f"--since=-{back}",)):
        proc = _report(str(runs.db), "--run", runs.two, *args, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "read 4 tasks" in proc.stderr
    proc = _report(str(runs.db), "--last", "1h", "--since", "+1m", "-o", str(out))
    assert proc.returncode == 1
    assert "--last 1h is --since=-1h: give one of --last and --since" in proc.stderr
    with pytest.raises(ReportRunError, match=r"--until '-5 parsecs': .* after the -"):
        build_report(runs.db, until="-5 parsecs")


def _at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(
    ("text", "now", "means"),
    [
        # today's date in UTC, the report's zone
        ("15:49:30", "2026-12-05T10:00:00+00:00", "2026-12-05T15:49:30+00:00"),
        ("15:49", "2026-12-05T23:59:59+00:00", "2026-12-05T15:49:00+00:00"),
        ("T15:49:30.250", "2026-12-05T00:00:00+00:00", "2026-12-05T15:49:30.250+00:00"),
        # with an offset: today's date there (already the 6th at +01:00)
        ("00:15+01:00", "2026-12-05T23:30:00+00:00", "2026-12-06T00:15:00+01:00"),
    ],
)
def test_a_time_of_day_alone_is_of_today(text: str, now: str, means: str) -> None:
    assert _absolute(text, "--since", now=_at(now)) == _at(means)


@pytest.mark.parametrize("bad", ["yesterday", "15:61", "25:00", "15:49:30 pm", "noon", "1549x"])
def test_what_is_no_time_of_day_is_still_refused(bad: str) -> None:
    with pytest.raises(ReportRunError, match=f"--until {bad!r} is not a time: give .*time of day"):
        _absolute(bad, "--until", now=_at("2026-12-05T10:00:00+00:00"))


@pytest.mark.timeout(60)
def test_a_window_from_a_time_of_day_on_the_command_line(runs: Runs, tmp_path: Path) -> None:
    """``--since HH:MM:SS.ffffff``: the same window as the Unix seconds it names today."""
    mid = sum(runs.idle) / 2
    at = datetime.datetime.fromtimestamp(mid, datetime.UTC)
    if at.date() != datetime.datetime.now(datetime.UTC).date():
        pytest.skip("the runs were recorded before midnight UTC: their time of day is not today")
    out = tmp_path / "report.html"
    since = at.strftime("%H:%M:%S.%f")
    proc = _report(str(runs.db), "--run", runs.two, "--since", since, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "read 4 tasks" in proc.stderr
    proc = _report(str(runs.db), "--run", runs.two, "--since", "15:61", "-o", str(out))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ReportRunError: "), proc.stderr
    assert "--since '15:61' is not a time: give " in proc.stderr


@pytest.mark.timeout(60)
def test_what_names_no_run_or_nothing_is_refused_saying_what_is_there(
    runs: Runs, tmp_path: Path
) -> None:
    with pytest.raises(ReportRunError, match="no run 'nope' in it") as unknown:
        build_report(runs.db, run_id="nope")
    assert runs.one in str(unknown.value) and runs.two in str(unknown.value)
    assert isinstance(unknown.value, MonitoringDBError)  # as it was, for those catching it
    assert unknown.value.path == str(runs.db)
    with pytest.raises(ReportRunError, match=r"2 runs were recorded .* --run"):
        build_report(runs.db, since=str(runs.ended_one - 3600))
    with pytest.raises(ReportRunError, match="no run was recorded"):
        build_report(runs.db, since="2000-01-01 00:00", until="2000-01-02T00:00")
    with pytest.raises(ReportRunError, match=f"run {runs.one} was recorded from .* nothing"):
        build_report(runs.db, run_id=runs.one, since=str(runs.started_two + 3600))
    lo, hi = runs.idle
    quiet = (str(lo + (hi - lo) / 4), str(hi - (hi - lo) / 4))
    with pytest.raises(ReportRunError, match=f"no task of run {runs.two} was submitted or ran"):
        build_report(runs.db, run_id=runs.two, since=quiet[0], until=quiet[1])
    with pytest.raises(ReportRunError, match="--since 'yesterday' is not a time"):
        build_report(runs.db, since="yesterday")
    with pytest.raises(ReportRunError, match="--until '\\+5 parsecs'"):
        build_report(runs.db, until="+5 parsecs")
    with pytest.raises(ReportRunError, match="must come before --until"):
        build_report(runs.db, run_id=runs.two, since="+10m", until="+1m")
    # on the command line: one line, status 1, nothing written
    out = tmp_path / "report.html"
    proc = _report(str(runs.db), "--run", "nope", "-o", str(out))
    assert proc.returncode == 1 and not out.exists()
    assert proc.stderr.startswith("error: ") and f"no run 'nope' in it (runs: {runs.one} (" in (
        proc.stderr
    )
    proc = _report(str(runs.db), "--list", "--run", runs.one)
    assert proc.returncode == 1 and "--list lists every run" in proc.stderr, proc.stderr
    proc = _report(str(runs.db), "--list", "--text")
    assert proc.returncode == 1 and "leave out --text, or --list" in proc.stderr, proc.stderr


@pytest.mark.timeout(60)
def test_listing_the_runs_imports_neither_plotly_nor_the_worker(runs: Runs) -> None:
    """`report --list` reads a few counts: it used to import plotly (for the plots it
    does not draw), the worker (for the demo's help) and, through the monitoring
    database's module, the recorder's metrics server and the scheduler: 12 s under
    load in the longrun audit, for a table of runs."""
    probe = (
        "import sys\n"
        "from runtime.__main__ import main\n"
        f"code = main(['report', {str(runs.db)!r}, '--list'])\n"
        "heavy = ('plotly', 'actors.worker', 'runtime.metrics', 'aiohttp', 'dask', "
        "'actors.scheduler', 'runtime.graph')\n"
        "print('IMPORTED', code, sorted(m for m in heavy if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=50,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert runs.one in proc.stdout and runs.two in proc.stdout
    assert proc.stdout.splitlines()[-1] == "IMPORTED 0 []"
