"""The report (runtime/report.py): made from the database of a real run, one file that
opens offline with every plot; a clear error for a bad database; and the screenshot in
docs/ of the report of a real demo run, rendered by headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import MonitoringDBError
from runtime.monitordb import MonitorWriter, open_db
from runtime.report import (
    SECTIONS,
    _cdf,
    _Run,
    _timeline,
    build_report,
    format_runs,
    list_runs,
)
from tests.helpers import load_script, wait_until
from tests.test_monitordb import _doc_sql, _rows

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 90


def square(x: int) -> int:
    return x * x


def fails(x: int) -> int:
    raise KeyError(f"no such thing {x}")


def _screenshots() -> ModuleType:
    """docs/images/make_screenshots.py, the script that makes the picture in the docs."""
    module: ModuleType = load_script("docs/images/make_screenshots.py", "make_screenshots")
    return module


#: a tag that would load something from the network
EXTERNAL = re.compile(
    r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=\s*[\"']?(https?:)?//", re.I
)


@pytest.mark.anyio
async def test_the_report_of_a_real_run_is_one_offline_file_with_every_plot(
    tmp_path: Path,
) -> None:
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2, monitoring=db, monitoring_interval=0.1) as cluster:
            assert await cluster.gather(cluster.map(square, range(40))) == [
                i * i for i in range(40)
            ]
            with pytest.raises(KeyError):
                await cluster.submit(fails, 1)
    out = tmp_path / "out"
    out.mkdir()
    with anyio.fail_after(120):
        proc = await anyio.run_process(
            [sys.executable, "-m", "runtime", "report", str(db), "-o", str(out / "report.html")],
            check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )  # fmt: skip
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert "read 41 tasks" in stderr  # progress, stage by stage
    assert [p.name for p in out.iterdir()] == ["report.html"]  # one file
    page = (out / "report.html").read_text()
    assert EXTERNAL.search(page) is None
    assert page.count("Plotly.newPlot") == len(SECTIONS)
    assert "plotly.js v" in page  # the library itself, embedded
    for title in (*SECTIONS, "Summary"):
        assert title in page, title
    assert "KeyError" in page  # the failed try, by cause, in the summary
    assert ">41<" in page  # tasks


def test_a_report_of_a_database_with_no_run_or_an_unknown_run_says_so(tmp_path: Path) -> None:
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    with pytest.raises(MonitoringDBError, match="holds no run yet"):
        build_report(db)
    with pytest.raises(MonitoringDBError, match="no run 'abc'"):
        build_report(db, run_id="abc")


@pytest.mark.slow
def test_the_screenshot_in_the_docs_is_the_report_of_a_real_demo_run(tmp_path: Path) -> None:
    """The harness that takes docs/images/report.png: into ``tmp_path`` and, with env
    CORRAL_SCREENSHOTS=DIR (``CORRAL_SCREENSHOTS=docs/images``), also into DIR."""
    shots = _screenshots()
    browser = shots.chromium()
    if browser is None:
        why = f"Chromium is not installed: {shots.HOW}"
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI must run this test (.ci/run installs it)")
        pytest.skip(why)
    png = shots.main(tmp_path / "report.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == shots.SIZE
    assert len(data) > 50_000  # drawn plots, not a blank page
    wanted = os.environ.get("CORRAL_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(wanted) / png.name)


@pytest.mark.anyio
async def test_alerts_in_the_database_are_drawn_over_the_time_plots(tmp_path: Path) -> None:
    """Alert state changes as the recorder writes them (the alert monitor's answers)
    become spans on the alerts plot and bands over the time plots."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, monitoring=db, monitoring_interval=0.1) as cluster:
            assert await cluster.gather(cluster.map(square, range(5))) == [0, 1, 4, 9, 16]
    conn = open_db(db)
    (run_id, t0) = conn.execute("SELECT run_id, started FROM runs").fetchone()
    conn.close()
    writer = MonitorWriter(db)
    alert = "INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?,?)"
    labels = '{"alertname": "QueueTooLong", "pool": "cpu"}'
    writer.submit([("event", alert, [
        (run_id, t0 + 0.1, "QueueTooLong", "pending", labels, "{}", 7, t0 + 0.1, None, None, "{}"),
        (run_id, t0 + 0.2, "QueueTooLong", "firing", labels, "{}", 9, t0 + 0.1, t0 + 0.2, None,
         '{"max_queue_size": 9}'),
        (run_id, t0 + 0.3, "QueueTooLong", "resolved", labels, "{}", 0, None, t0 + 0.2, t0 + 0.3,
         "{}"),
    ])])  # fmt: skip
    writer.close()
    page = build_report(db)
    assert "Alerts (none in this run)" not in page
    assert "QueueTooLong firing" in page and "QueueTooLong pending" in page
    assert page.count("rgba(214,39,40,0.15)") >= 4  # the firing band on each time plot


@pytest.mark.anyio
async def test_workers_that_left_on_purpose_are_not_counted_lost(tmp_path: Path) -> None:
    """The summary's "ended unasked" counts worker lives that ended for any reason but
    on purpose: walltime, like drained and shutdown, is on purpose (before, a worker
    that reached its walltime counted as lost). A worker preempted, requeued under its
    id and then crashed is one worker lost twice."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, monitoring=db, monitoring_interval=0.1) as cluster:
            assert await cluster.gather(cluster.map(square, range(3))) == [0, 1, 4]
    conn = open_db(db)
    (run_id, t0) = conn.execute("SELECT run_id, started FROM runs").fetchone()
    conn.close()
    writer = MonitorWriter(db)
    worker = "INSERT INTO workers (run_id, worker, pool, cores, memory, joined, left, cause) "
    worker += "VALUES (?,?,?,?,?,?,?,?)"
    gone = ("walltime", "drained", "preempted", "crash")
    writer.submit([("event", worker, [
        (run_id, f"w-{cause}", "default", 1, 0, t0, t0 + 1.0, cause) for cause in gone
    ])])  # fmt: skip
    again = "INSERT INTO workers (run_id, worker, life, pool, joined, left, cause) "
    again += "VALUES (?,?,?,?,?,?,?)"
    writer.submit(
        [("event", again, [(run_id, "w-preempted", 2, "default", t0 + 2, t0 + 3, "crash")])]
    )
    writer.close()
    page = build_report(db)
    assert "<th>workers</th><td>5 (6 lives, 3 ended unasked)</td>" in page


def test_long_series_are_thinned_keeping_every_peak_and_dip() -> None:
    """A series of 100,000 points is drawn with at most MAX_POINTS (about), and its
    highest and lowest values, wherever they are, are among them."""
    from runtime.report import MAX_POINTS, _thin

    xs = [float(i) for i in range(100_000)]
    ys = [float((i * 7919) % 1000) for i in range(100_000)]
    ys[31_337], ys[77_777] = 5000.0, -5000.0  # one peak, one dip
    tx, ty = _thin(xs, ys)
    assert len(tx) == len(ty) <= MAX_POINTS
    assert tx == sorted(tx) and set(tx) <= set(xs)
    points = set(zip(tx, ty, strict=True))
    assert (31_337.0, 5000.0) in points and (77_777.0, -5000.0) in points
    assert _thin(xs[:10], ys[:10]) == (xs[:10], ys[:10])  # short: as it is


def test_only_firing_alert_spans_are_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending spans are shaded without a label: an annotation option without its text
    made plotly draw its placeholder, "new text", on each of them."""
    import plotly.graph_objects as go

    from runtime import report

    spans = [(1.0, 5.0, "pending", "Slow"), (5.0, 9.0, "firing", "Slow")]
    monkeypatch.setattr(report, "_alert_spans", lambda run: spans)
    fig = go.Figure()
    report._alert_bands(fig, None)  # type: ignore[arg-type]
    assert len(fig.layout.shapes) == 2
    assert [a.text for a in fig.layout.annotations] == ["Slow firing"]


def test_labels_of_alerts_that_fire_together_are_in_rows_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two alerts that fire within a second: their labels, both at the top left of
    their spans, were drawn over each other ("QueueSlow firingCIQueueTime firing").
    Each label is one row below the one before it, LABEL_ROWS rows in turn."""
    import plotly.graph_objects as go

    from runtime import report

    spans = [(0.0, 50.0, "pending", "QueueSlow"), (50.0, 90.0, "firing", "QueueSlow"),
             (50.4, 90.0, "firing", "CIQueueTime"), (51.0, 60.0, "firing", "NoWorkers"),
             (52.0, 60.0, "firing", "Stuck"), (70.0, 80.0, "firing", "Later")]  # fmt: skip
    monkeypatch.setattr(report, "_alert_spans", lambda run: spans)
    fig = go.Figure()
    report._alert_bands(fig, None)  # type: ignore[arg-type]
    rows = [(a.text, a.yshift) for a in fig.layout.annotations]
    assert rows == [
        ("QueueSlow firing", 0),
        ("CIQueueTime firing", -report.LABEL_ROW_PX),
        ("NoWorkers firing", -2 * report.LABEL_ROW_PX),
        ("Stuck firing", -3 * report.LABEL_ROW_PX),
        ("Later firing", 0),  # LABEL_ROWS rows, then the first again
    ]
    assert report.LABEL_ROWS == 4


@pytest.mark.anyio
async def test_every_time_plot_spans_the_run_from_its_start_to_its_end(tmp_path: Path) -> None:
    """The plots over time line up: each x axis goes from 0 to the run's end (the task
    timeline's began at the first try, 40 s into the audit's run, the others at 0).
    The summary names the tasks by what their state means."""
    from runtime import report

    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, monitoring=db, monitoring_interval=0.1) as cluster:
            assert await cluster.gather(cluster.map(square, range(5))) == [0, 1, 4, 9, 16]
    conn = open_db(db)
    try:
        run = _Run(conn, None, lambda _: None)
    finally:
        conn.close()
    assert run.end > 0 and run.latest
    end = max(run.end, 1.0)  # (a run shorter than a second: 1 s)
    over_time = (report._timeline, report._queues, report._fleet, report._memory,
                 report._alerts_figure, report._storage)  # fmt: skip
    for make in over_time:
        fig = make(run)
        ranges = [tuple(axis.range or ()) for axis in fig.select_xaxes()]
        assert ranges and set(ranges) == {(0, end)}, (make.__name__, ranges)
    run.states = {"memory": 3, "erred": 1}
    page = report._summary(run)
    assert "<th>tasks finished, output held (memory)</th><td>3</td>" in page
    assert "<th>tasks erred</th><td>1</td>" in page and "tasks memory" not in page


def _category_traces(fig: Any) -> list[tuple[str, int]]:
    return [(t.name, len(t.y)) for t in fig.data]


@pytest.mark.anyio
async def test_a_run_of_many_categories_draws_the_busiest_and_gathers_the_rest(
    tmp_path: Path,
) -> None:
    """60 categories: 20 of three tasks, 40 of one. The duration CDF draws a line for
    each of the 20 with the most successful tries and one dashed line for the 40 others'
    tries, and the timeline a colour for each of the 20 with the most tries drawn and
    grey for the others; each title says so. Before, each plot had 60 entries (1,860 in
    a survey's run, unreadable and heavy), and no title said how many there were."""
    db = tmp_path / "monitoring.db"
    graph: dict[str, Any] = {f"heavy{i:02d}-{j}": (square, j) for i in range(20) for j in range(3)}
    graph.update({f"light{i:02d}-0": (square, i) for i in range(40)})
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2, monitoring=db, monitoring_interval=0.1) as cluster:
            futures = await cluster.submit_graph(graph, list(graph))
            assert len(await cluster.gather(futures)) == 100
    conn = open_db(db)
    try:
        run = _Run(conn, None, lambda line: None)
    finally:
        conn.close()
    assert run.categories == 60 and run.tries == 100

    cdf = _cdf(run)
    heavy = [(f"heavy{i:02d} (3)", 3) for i in range(20)]
    assert _category_traces(cdf) == [*heavy, ("the other 40 categories (40)", 40)]
    assert cdf.data[-1].y[-1] == 1.0  # the others' 40 tries make one whole CDF
    note = "60 categories: the 20 with the most successful tries, the other 40 as one line"
    assert note in cdf.layout.title.text

    timeline = _timeline(run)
    colours = [(f"heavy{i:02d}", 3) for i in range(20)]
    assert _category_traces(timeline) == [*colours, ("the other 40 categories", 40)]
    note = "60 categories: the 20 with the most tries drawn in a colour each, the other 40 in"
    assert note in timeline.layout.title.text

    page = build_report(db)
    assert "the other 40 categories (40)" in page and '"name":"light' not in page


def _one_run_db(path: Path, length: float) -> tuple[sqlite3.Connection, float]:
    """A monitoring database at ``path`` holding one run, ``run-1``, of ``length``
    seconds (and nothing else yet): a connection to it and the run's start."""
    MonitorWriter(path).close()  # the schema
    t0 = 1_700_000_000.0
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "INSERT INTO runs (run_id, started, ended, host, pid) VALUES (?,?,?,?,?)",
            ("run-1", t0, t0 + length, "host", 1),
        )
    return conn, t0


def _many_categories_db(path: Path, categories: int) -> Path:
    """A monitoring database of one run whose category ``c<i>`` has ``1 + i % 7``
    successful tries of known durations."""
    conn, t0 = _one_run_db(path, 3600.0)
    with conn:
        rows = [
            ("run-1", f"c{i}-{j}", 1, f"c{i}", f"w-{j % 4}", t0 + i * 0.1, t0 + i * 0.1,
             t0 + i * 0.1 + 0.01 * (i % 100 + j), "ok")
            for i in range(categories)
            for j in range(1 + i % 7)
        ]  # fmt: skip
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome) VALUES (?,?,?,?,?,?,?,?,?)",
            rows,
        )
    conn.close()
    return path


@pytest.mark.timeout(120)
def test_thousands_of_categories_make_a_report_of_bounded_size(tmp_path: Path) -> None:
    """3,000 categories: the CDF draws 21 lines (ties of count go to the first by name),
    the gathered line is the CDF of every other category's tries, and the page holds a
    line for none of the others."""
    from runtime.report import MAX_POINTS

    db = _many_categories_db(tmp_path / "monitoring.db", 3000)
    conn = open_db(db)
    try:
        run = _Run(conn, None, lambda line: None)
    finally:
        conn.close()
    assert run.categories == 3000
    # 7 tries: the categories i with i % 7 == 6; the first 20 by name
    busiest = sorted(f"c{i}" for i in range(3000) if i % 7 == 6)[:20]
    assert sorted(run.durations) == busiest
    assert run.others is not None
    rest, n, xs, ys = run.others
    durations = sorted(
        0.01 * (i % 100 + j)
        for i in range(3000)
        if f"c{i}" not in busiest
        for j in range(1 + i % 7)
    )
    assert (rest, n) == (2980, len(durations)) and n > MAX_POINTS
    at = sorted({k * (n - 1) // (MAX_POINTS - 1) for k in range(MAX_POINTS)})
    assert ys == [(i + 1) / n for i in at]
    assert xs == pytest.approx([durations[i] for i in at])
    page = build_report(db)
    # the busiest 20 on each plot (on the timeline too, of its tries), the others gathered
    assert page.count('"name":"c') == 40
    assert "the other 2980 categories" in page


@pytest.mark.timeout(60)
def test_the_report_shows_block_ends_requeues_and_outputs_recomputed(tmp_path: Path) -> None:
    """The cost of preemption: the summary counts the blocks' ends and requeues by state
    and cause, and the outputs lost with a worker by how they came back; the blocks
    plot marks each requeue (its block and cause under the pointer)."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 100.0)
    with conn:
        conn.executemany(
            "INSERT INTO blocks VALUES ('run-1',?,'ckpt',?,?,?)",
            [("block-1", "running", t0 + 1, None), ("block-2", "running", t0 + 1, None),
             ("block-1", "requeued", t0 + 10, "preempted"),
             ("block-2", "requeued", t0 + 12, "preempted"),
             ("block-1", "running", t0 + 20, None),
             ("block-1", "completed", t0 + 50, "walltime"),
             ("block-2", "stopped", t0 + 90, "shutdown")],
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO recoveries VALUES ('run-1',?,?,'sim','ckpt-1',?)",
            [(t0 + 10, "sim-a", "recomputed"), (t0 + 10, "sim-b", "recomputed"),
             (t0 + 12, "sim-c", "replica")],
        )  # fmt: skip
    conn.close()
    page = build_report(db)
    ends = page[page.index("block ends: state") : page.index("</table>", page.index("block ends"))]
    assert "<td>requeued</td><td>preempted</td><td>2</td>" in ends
    assert "<td>completed</td><td>walltime</td><td>1</td>" in ends
    assert "<td>stopped</td><td>shutdown</td><td>1</td>" in ends
    assert "running" not in ends
    lost = page[page.index("outputs lost with a worker") :]
    assert "<td>recomputed</td><td>2</td><td>1</td>" in lost
    assert "<td>replica</td><td>1</td><td>1</td>" in lost
    assert '"name":"requeued ckpt"' in page
    assert "block-2 requeued (preempted)" in page


def test_alert_bands_are_the_shapes_and_labels_add_vrect_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bands are added at once (add_vrect validated every shape again at each call:
    seconds for a few alerts over five plots), and are what add_vrect drew: over the
    plot of a figure of one, over each subplot with a trace of a figure of subplots,
    a label on each firing span in its row, after the subplots' titles."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from runtime import report

    spans = [(0.0, 50.0, "pending", "QueueSlow"), (50.0, 90.0, "firing", "QueueSlow"),
             (50.4, 90.0, "firing", "CIQueueTime"), (70.0, 80.0, "pending", "Later")]  # fmt: skip
    monkeypatch.setattr(report, "_alert_spans", lambda run: spans)

    def by_add_vrect(fig: Any) -> Any:  # the report's way before
        firing = sorted((s for s in spans if s[2] == "firing"), key=lambda s: (s[0], s[3]))
        row_of = {span: i % report.LABEL_ROWS for i, span in enumerate(firing)}
        for span in spans:
            start, stop, state, name = span
            label = {"annotation_text": f"{name} {state}", "annotation_position": "top left",
                     "annotation_yshift": -report.LABEL_ROW_PX * row_of[span]
                     } if state == "firing" else {}  # fmt: skip
            fig.add_vrect(x0=start, x1=stop, fillcolor=report._ALERT_COLOR[state],
                          line_width=0, layer="below", **label)  # fmt: skip
        return fig

    def figures() -> list[Any]:
        one = go.Figure()
        one.add_trace(go.Scatter(x=[1, 2], y=[1, 2]))
        empty = go.Figure()
        both = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("a", "b"))
        both.add_trace(go.Scatter(x=[1], y=[1]), row=1, col=1)
        both.add_trace(go.Scatter(x=[1], y=[2]), row=2, col=1)
        lower = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("a", "b"))
        lower.add_trace(go.Scatter(x=[1], y=[1]), row=2, col=1)
        none = make_subplots(rows=2, cols=1, shared_xaxes=True)
        return [one, empty, both, lower, none]

    news = figures()
    for old, new in zip(map(by_add_vrect, figures()), news, strict=True):
        report._alert_bands(new, None)  # type: ignore[arg-type]
        assert new.layout.shapes == old.layout.shapes
        assert new.layout.annotations == old.layout.annotations
    one, empty, both, lower, none = news
    assert len(one.layout.shapes) == len(empty.layout.shapes) == 4 and not none.layout.shapes
    assert [s.yref for s in both.layout.shapes[:2]] == ["y domain", "y2 domain"]
    assert [s.yref for s in lower.layout.shapes] == ["y2 domain"] * 4
    assert [a.text for a in both.layout.annotations] == [
        "a", "b", "QueueSlow firing", "QueueSlow firing", "CIQueueTime firing",
        "CIQueueTime firing",
    ]  # fmt: skip


def test_cancelled_tries_are_not_failed_tries_in_the_summary(tmp_path: Path) -> None:
    """A user audit (analyst, 4): a run whose two tries a user cancelled while they ran,
    nothing failed: ``report --list`` said 0 failed tries, the report's summary listed
    the two under "failed tries". Now the summary's failed tries are none, as the list
    says, and the cancelled tries have a table of their own, by cause."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 60.0)
    with conn:
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome, cause) VALUES ('run-1', ?, 1, ?, 'w1', ?, ?, ?, ?, ?)",
            [("slow-0", "slow", t0, None, t0 + 7, "cancelled", "cancelled"),
             ("slow-1", "slow", t0, None, t0 + 7, "cancelled", "cancelled"),
             ("ok-0", "ok", t0, t0, t0 + 1, "ok", None)],
        )  # fmt: skip
    conn.close()
    (listed,) = list_runs(db)
    assert listed.failed_tries == 0
    read = open_db(db)
    try:
        run = _Run(read, None, lambda line: None)
    finally:
        read.close()
    assert (run.failures, run.cancelled) == ([], [("cancelled", 2)])
    page = build_report(db)
    assert (
        "<th>failed tries: outcome</th><th>cause</th><th>n</th></tr><tr><td colspan=3>none" in page
    )
    cancelled = "<th>cancelled tries (not failures): cause</th><th>n</th></tr>"
    assert cancelled + "<tr><td>cancelled</td><td>2</td></tr></table>" in page


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def nap_and_fail(seconds: float) -> None:
    time.sleep(seconds)
    raise ValueError("bad row")


async def _naps_and_a_failure(db: Path, naps: list[float], fail: float, **kw: Any) -> None:
    """A real run recorded in ``db``: a cluster of two workers (``kw``: more options)
    that runs ``nap`` for each of ``naps``, then a task that naps ``fail`` seconds and
    fails, twice (``retries=1``)."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2, monitoring=db, monitoring_interval=0.1, **kw) as cluster:
            assert await cluster.gather(cluster.map(nap, naps)) == naps
            with pytest.raises(ValueError):
                await cluster.submit(nap_and_fail, fail, retries=1)
            # (the run's last rows are written a poll later: its end may not wait for them)
            await wait_until(
                lambda: _rows(db, "SELECT count(*) FROM tasks WHERE state = 'erred'") == [(1,)],
                "the erred task in the database",
                limit=30,
            )


@pytest.mark.anyio
async def test_the_worker_time_paid_for_busy_and_lost_to_failed_tries_per_pool(
    tmp_path: Path,
) -> None:
    """A user audit (analyst, 1): no figure said how much of the worker time paid for
    was spent executing, nor how much went into tries that failed. A real run (two
    workers of two cores, tasks that sleep, one that fails twice): the summary gives,
    per pool, the core-hours alive (each life times its cores), the hours executing
    (``ended - started`` of the tries), the busy share and the hours in failed tries,
    and ``report --list`` the run's core-hours alive and busy share, each equal to what
    the rows give in plain Python."""
    db = tmp_path / "monitoring.db"
    await _naps_and_a_failure(db, [0.2, 0.3, 0.4, 0.5], 0.25, threads_per_worker=2)
    conn = sqlite3.connect(db)
    try:
        (end,) = conn.execute("SELECT ended FROM runs").fetchone()
        lives = conn.execute("SELECT pool, cores, joined, left FROM workers").fetchall()
        tries = conn.execute(
            "SELECT outcome, started, ended FROM tries WHERE started IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    assert {(pool, cores) for pool, cores, *_ in lives} == {("default", 2)} and len(lives) == 2
    alive = sum(cores * ((left or end) - joined) for _, cores, joined, left in lives)
    executing = sum(stop - start for _, start, stop in tries)
    failed = sum(stop - start for outcome, start, stop in tries if outcome == "error")
    # (a speculative copy of a nap, or a try taken back and placed again, may add a try
    # on a loaded machine: the figures are then those of the rows still)
    outcomes = Counter(o for o, *_ in tries)
    assert outcomes["error"] == 2 and outcomes["ok"] >= 4, outcomes
    assert executing >= 1.4 + 0.5 and failed >= 0.5 and alive > executing
    read = open_db(db)
    try:
        run = _Run(read, None, lambda line: None)
    finally:
        read.close()
    (pool,) = run.worker_time.items()
    assert pool[0] == "default"
    got = pool[1]
    assert (got.alive, got.executing, got.failed) == pytest.approx((alive, executing, failed))
    assert ("error", "failed", 2, pytest.approx(failed)) in run.time_lost
    assert {what for _, what, *_ in run.time_lost} <= {"failed", "cancelled"}
    page = build_report(db)
    busy = f"{executing / alive:.0%}"
    row = (f"<tr><td>default</td><td>{alive / 3600:.4g}</td><td>{executing / 3600:.4g}</td>"
           f"<td>{busy}</td><td>{failed / 3600:.4g}</td></tr>")  # fmt: skip
    assert row in page
    (listed,) = list_runs(db)
    assert (listed.worker_time.alive, listed.worker_time.executing) == pytest.approx(
        (alive, executing)
    )
    # docs/monitoring.md's queries give the same figures
    assert _rows(db, _doc_sql("Worker time paid for and busy")) == [
        ("default", pytest.approx(alive))
    ]
    by_outcome = _rows(db, _doc_sql("the seconds executing per pool and outcome"))
    assert {(p, o): n for p, o, n, _ in by_outcome} == {
        ("default", o): n for o, n in outcomes.items()
    }
    assert sum(s for *_, s in by_outcome) == pytest.approx(executing, abs=0.051 * len(outcomes))
    # its columns, after "workers": core-h alive, busy
    cells = format_runs([listed]).splitlines()[1].split()
    assert cells[11:13] == [f"{alive / 3600:.4g}", busy], cells


@pytest.mark.anyio
async def test_report_text_prints_the_summary_and_the_durations_per_category(
    tmp_path: Path,
) -> None:
    """A user audit (analyst, 2): the report was a 5 MB HTML file only, with no table
    of durations per category. ``report --text`` prints the summary's tables and a
    table per category of the successful tries' count, mean, 95th percentile, longest
    and total duration, and the failed tries, to stdout, and writes no file. A real
    run: four naps and a task that fails twice; the figures are those of the rows."""
    db = tmp_path / "monitoring.db"
    await _naps_and_a_failure(db, [0.1, 0.2, 0.3, 0.4], 0.05)
    with anyio.fail_after(60):
        proc = await anyio.run_process(
            [sys.executable, "-m", "runtime", "report", str(db), "--text"], check=False,
            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path,
        )  # fmt: skip
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".html")]  # no HTML written
    (run_id,) = _rows(db, "SELECT run_id FROM runs")[0]
    assert out.startswith(f"Corral run {run_id} (from {db})\n\nrun ")
    lines = out.splitlines()
    assert [ln.split() for ln in lines if ln.startswith("tasks erred")] == [["tasks", "erred", "1"]]
    failed = lines.index(next(ln for ln in lines if ln.startswith("failed tries: outcome")))
    assert lines[failed + 1].split() == ["error", "ValueError", "2"]
    assert "worker time: pool" in out and "what preemption cost" in out
    # the durations of the successful tries, as the rows give them
    durations = sorted(
        d for (d,) in _rows(db, "SELECT ended - started FROM tries WHERE outcome = 'ok'")
    )
    # (4, or more when a speculative copy of a nap finished: the rows say)
    n = len(durations)
    assert n >= 4
    table = lines.index(next(ln for ln in lines if ln.startswith("durations of successful")))
    nap_row, fail_row = lines[table + 1].split(), lines[table + 2].split()
    p95 = durations[(95 * n + 99) // 100 - 1]  # the nearest rank
    assert nap_row == ["nap", str(n), f"{sum(durations) / n:.3f}", f"{p95:.3f}",
                       f"{durations[-1]:.3f}", f"{sum(durations) / 3600:.4g}", "0"]  # fmt: skip
    assert fail_row == ["nap_and_fail", "0", "-", "-", "-", "0", "2"]


def test_the_text_report_s_95th_percentile_is_the_nearest_rank(tmp_path: Path) -> None:
    """20 successful tries of 1 to 20 s: mean 10.5, 95th percentile 19 (the 19th of 20,
    nearest rank), longest 20; a category's failed try counted beside; the tries of
    another run left out."""
    conn, t0 = _one_run_db(tmp_path / "monitoring.db", 100.0)
    with conn:
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome) VALUES (?, ?, 1, 'fit', 'w', ?, ?, ?, ?)",
            [("run-1", f"fit-{i}", t0, t0, t0 + i, "ok") for i in range(1, 21)]
            + [("run-1", "fit-bad", t0, t0, t0 + 500, "error"),
               ("other", "fit-x", t0, t0, t0 + 900, "ok")],
        )  # fmt: skip
    conn.close()
    text = build_report(tmp_path / "monitoring.db", run_id="run-1", text=True)
    lines = text.splitlines()
    table = lines.index(next(ln for ln in lines if ln.startswith("durations of successful")))
    assert lines[table + 1].split() == ["fit", "20", "10.500", "19.000", "20.000", "0.05833", "1"]
    assert lines[table + 2 :] == []


def test_the_summary_says_the_most_each_worker_had_on_disk_of_its_limit(tmp_path: Path) -> None:
    """The physics audit: a run sized to its workers' disks (intermediates pruned as
    their readers finish) had its disks' use only as a plot of the HTML report; the
    text report said nothing of disks. The summary now gives each worker's disk limit
    and the most its samples had on disk, of that limit; a worker whose disk is not
    counted says so; another run's samples and the samples before a worker reported its
    disk are left out."""
    conn, t0 = _one_run_db(tmp_path / "monitoring.db", 100.0)
    mib = 2**20
    with conn:
        conn.executemany(
            "INSERT INTO resource_samples (run_id, time, worker, rss, spilled_bytes, disk) "
            "VALUES (?, ?, ?, 1, ?, ?)",
            [("run-1", t0 + 1, "w1", None, None), ("run-1", t0 + 2, "w1", 30 * mib, 40 * mib),
             ("run-1", t0 + 3, "w1", 10 * mib, 40 * mib), ("run-1", t0 + 2, "w2", 5 * mib, 0),
             ("other", t0 + 2, "w1", 400 * mib, 40 * mib)],
        )  # fmt: skip
    conn.close()
    lines = build_report(tmp_path / "monitoring.db", run_id="run-1", text=True).splitlines()
    table = lines.index(next(ln for ln in lines if ln.startswith("bytes on disk: worker")))
    assert [ln.split() for ln in lines[table + 1 : table + 3]] == [
        ["w1", "40.0", "30.0", "75%"],
        ["w2", "0.0", "5.0", "not", "counted"],
    ]


def test_the_summary_says_how_many_tasks_and_how_much_time_each_client_had(
    tmp_path: Path,
) -> None:
    """The scale audit: the operator of a manager shared by many clients had "who used
    how much" only as SQL (``tasks.client``). The summary gives each client's tasks,
    those that erred and the hours of their successful tries, the most hours first;
    tasks of no client count as ``?``; another run's tasks are left out; past 50
    clients, the 50 with the most time, saying of how many."""
    conn, t0 = _one_run_db(tmp_path / "monitoring.db", 100.0)
    rows = [("run-1", "a-1", "alice", "memory", 30.0), ("run-1", "a-2", "alice", "erred", None),
            ("run-1", "b-1", "bob", "released", 90.0), ("run-1", "n-1", None, "memory", 1.0),
            ("other", "x-1", "bob", "memory", 5000.0)]  # fmt: skip
    rows += [("run-1", f"m-{i}", f"many{i:02}", "memory", 0.5) for i in range(49)]
    with conn:
        conn.executemany(
            "INSERT INTO tasks (run_id, key, client, state, duration, submitted, finished) "
            f"VALUES (?, ?, ?, ?, ?, {t0}, {t0 + 1})",
            rows,
        )
    conn.close()
    lines = build_report(tmp_path / "monitoring.db", run_id="run-1", text=True).splitlines()
    table = lines.index(next(ln for ln in lines if ln.startswith("tasks per client")))
    assert lines[table].split(":")[0] == "tasks per client (the 50 with the most time, of 52)"
    assert [ln.split() for ln in lines[table + 1 : table + 5]] == [
        ["bob", "1", "0", "0.025"],
        ["alice", "2", "1", "0.008333"],
        ["?", "1", "0", "0.0002778"],
        ["many00", "1", "0", "0.0001389"],
    ]
    assert lines[table + 51] == ""  # 50 rows
    assert lines[table + 50].split()[0] == "many46" and "many47" not in "\n".join(lines)


def test_each_client_s_hours_are_cut_to_the_window(tmp_path: Path) -> None:
    """An audit: with ``--since``/``--until``, the other figures count what falls in the
    window, but "tasks per client" gave each client the whole of its successful tries'
    time (a try of an hour over a ten-minute window: an hour). Now the hours are those
    of the tries' time within the window; tasks outside it are left out, as before."""
    conn, t0 = _one_run_db(tmp_path / "monitoring.db", 3600.0)
    with conn:
        conn.executemany(
            "INSERT INTO tasks (run_id, key, client, state, submitted, started, finished, "
            "duration) VALUES ('run-1', ?, ?, 'memory', ?, ?, ?, ?)",
            [("long", "alice", t0, t0, t0 + 3600, 3600.0),  # 600 s of it in the window
             ("late", "bob", t0, t0 + 2100, t0 + 3000, 900.0),  # 300 s in it
             ("early", "carol", t0, t0, t0 + 100, 100.0)],  # none: left out
        )  # fmt: skip
    conn.close()
    db = tmp_path / "monitoring.db"
    lines = build_report(db, run_id="run-1", since="+1800", until="+2400", text=True).splitlines()
    table = lines.index(next(ln for ln in lines if ln.startswith("tasks per client")))
    assert [ln.split() for ln in lines[table + 1 : table + 4]] == [
        ["alice", "1", "0", "0.1667"],
        ["bob", "1", "0", "0.08333"],
        [],
    ]
    whole = build_report(db, run_id="run-1", text=True).splitlines()  # no window: all of it
    table = whole.index(next(ln for ln in whole if ln.startswith("tasks per client")))
    assert [ln.split()[-1] for ln in whole[table + 1 : table + 4]] == ["1", "0.25", "0.02778"]


@pytest.mark.timeout(10)
def test_the_file_errors_say_their_file_and_problem_and_travel_whole() -> None:
    """TokenFileError, MonitoringDBError, ReportRunError and ReportOutputError: one
    constructor (``path``, ``problem``) each puts in its own text; each is a ValueError,
    keeps both fields and pickles whole (an error of the manager reaches a console)."""
    import pickle

    from runtime.errors import ReportOutputError, ReportRunError, TokenFileError

    texts = {
        TokenFileError: "token file /t: {x}",
        MonitoringDBError: "monitoring database /t: {x} (see docs/monitoring.md#monitoring-"
        "database)",
        ReportRunError: "monitoring database /t: {x} (see docs/monitoring.md#report)",
        ReportOutputError: "report output /t: {x}; nothing was written (see docs/monitoring."
        "md#report)",
    }
    for cls, text in texts.items():
        err = cls("/t", problem="{x}")  # (braces in a problem stay as they are)
        back = pickle.loads(pickle.dumps(err))
        for e in (err, back):
            assert type(e) is cls and isinstance(e, ValueError)
            assert (str(e), e.path, e.problem) == (text, "/t", "{x}")
    assert isinstance(ReportRunError("/t", "p"), MonitoringDBError)


@pytest.mark.timeout(10)
def test_the_key_errors_say_their_text_unquoted() -> None:
    """The errors that are KeyErrors too (a missing key, an unknown policy or category)
    say their message as it is: KeyError's str() would quote it (CorralError's comes
    first in their MRO, once for all of them)."""
    from runtime.errors import MissingKeysError, UnknownCategory, UnknownPolicyError

    for err in (
        MissingKeysError(["k"], requested=True),
        UnknownPolicyError("priority", "nope", ["fifo"]),
        UnknownCategory("nope", ["inc"]),
    ):
        assert isinstance(err, KeyError)
        assert str(err) == err.message and not str(err).startswith(("'", '"')), str(err)
