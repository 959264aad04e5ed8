"""The report of a monitoring database: one HTML file with interactive plots.

What lives here: :func:`write_report` (``python -m runtime report RUN.db -o
report.html``) and :func:`build_report` (the HTML as text). The file is self-contained:
plotly's JavaScript is embedded once (``include_plotlyjs=True``), nothing is fetched,
so it opens offline. Each plot is in :data:`SECTIONS`, by title; docs/monitoring.md
says what each shows.

The numbers come from the database only (:func:`runtime.monitordb.open_db`): tries for
the timeline and the durations, the metric samples for the queues, the workers and
blocks tables for the fleet, the resource samples for memory and disk, the transfers
and recoveries tables for storage (the recoveries and the blocks' ends also in the
summary), the alerts table for the bands drawn over the time
plots, the failed tries and the tasks that erred without one for the table of failures
grouped as the live dashboard groups them ("Why tasks failed", after the summary), the
tries lost with their worker and retried free apart from them ("Tries lost with their
worker (free retries)", after it), and in the summary what preemption cost.
"""

from __future__ import annotations

import contextlib
import datetime
import heapq
import html
import importlib
import itertools
import json
import math
import os
import shlex
import sqlite3
import stat
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies import BENIGN_LOSSES, ON_PURPOSE
from runtime.errors import MonitoringDBError, ReportOutputError, ReportRunError
from runtime.messages import ANY_POOL, MAX_FAILURE_GROUPS_SHOWN
from runtime.monitordb import SQLITE_HEADER, open_db

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
else:

    class _Imported:
        """A module imported at the first use of one of its names: plotly (about a
        second under load), which ``report --list`` does not need, nor the reading."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> Any:
            return getattr(importlib.import_module(self._name), attr)

    go = _Imported("plotly.graph_objects")

    def make_subplots(*args: Any, **kwargs: Any) -> Any:
        return _Imported("plotly.subplots").make_subplots(*args, **kwargs)


# ReportOutputError and ReportRunError are runtime.errors's, exported here too, where
# write_report raises them
__all__ = [
    "ACTIONS_TITLE",
    "EACH_TRY_UP_TO",
    "FAILURES_TITLE",
    "MAX_BARS",
    "MAX_CATEGORIES",
    "MAX_TEXT_CATEGORIES",
    "SECTIONS",
    "ReportOutputError",
    "ReportRunError",
    "RunListing",
    "WorkerTime",
    "build_report",
    "format_runs",
    "list_runs",
    "write_report",
]

#: the report's plots, by title, in order
SECTIONS = (
    "Task timeline per worker",
    "Queue depth and wait per pool",
    "Workers and blocks",
    "Memory (RSS) per worker",
    "Task duration CDF per category",
    "Alerts",
    "Storage: disk per worker, transfers, recoveries",
)
MAX_BARS = 20_000  #: tries drawn on the timeline at most (the latest ones)
#: past this many tries in the run (or window), the timeline merges them: a worker's
#: successful tries of one category that ran less than a :data:`TIMELINE_BINS`-th of
#: the span drawn apart are one bar (:func:`_merge_bars`); failed tries stay a bar each
EACH_TRY_UP_TO = 5_000
TIMELINE_BINS = 2_000  #: about the pixels of a wide plot: closer bars do not show apart
#: categories drawn apart at most, on the duration CDF (those with the most successful
#: tries) and in the timeline's colours (those with the most tries drawn); the others
#: are gathered into one line, one colour, and the title says how many there are
MAX_CATEGORIES = 20
#: points drawn per line at most: a longer series keeps each stretch's lowest and
#: highest value (peaks stay), a duration CDF evenly spaced quantiles
MAX_POINTS = 2_000
#: points drawn per plot of one line per worker at most (200 workers: 500 each)
FIGURE_POINTS = 100_000

_OUTCOME_COLOR = {"error": "#d62728", "oom": "#9467bd", "timeout": "#8c564b",
                  "worker-lost": "#000000"}  # fmt: skip
_ALERT_COLOR = {"firing": "rgba(214,39,40,0.15)", "pending": "rgba(255,165,0,0.12)"}
#: rows of the firing spans' labels over the time plots: each label one row below the
#: one before it (in time), so labels of alerts that fired together do not overlap
LABEL_ROWS = 4
LABEL_ROW_PX = 14  #: the height of a row of labels, in pixels
#: the summary's name of a task state where the state's own name says little
_STATE_NAME = {
    "memory": "finished, output held (memory)",
    "released": "finished, output released since (released)",
}
#: the name of ``memory`` in a file of schema version 4 or older, which has no
#: ``tasks.released``: the release of an output was not recorded then
_OLD_MEMORY = "finished (memory: output held, or released since: this file does not say)"
#: the report's table of failure groups, after the summary
FAILURES_TITLE = "Why tasks failed"
FREE_TITLE = "Tries lost with their worker (free retries)"
#: the causes of a worker's loss counted as preemption in the report's "what preemption
#: cost": its batch job taken back, or its walltime reached
PREEMPTION = frozenset({"preempted", "walltime"})
#: the report's table of the alert actions (the remediation audit), after the alerts
ACTIONS_TITLE = "Alert actions"
MAX_ACTIONS = 500  #: alert actions listed and drawn at most (the latest ones)
#: the report's table of the policy swaps, after the alert actions
POLICIES_TITLE = "Policy swaps"
#: how the alerts plot marks each kind of alert action (``actions.action``)
_ACTION_MARK = {
    "scale-out": ("triangle-up", "#1f77b4"), "restore": ("triangle-down", "#2ca02c"),
    "no-scale-out": ("circle-open", "#7f7f7f"), "restore-left": ("square-open", "#7f7f7f"),
    "restore-later": ("square-open", "#ff7f0e"), "scale-failed": ("x", "#000000"),
}  # fmt: skip
#: the states of a block in the ``blocks`` table while it lives; the others are its
#: ends and requeues (``completed``, ``requeued``, ``stopped``, ...)
_BLOCK_LIVE = ("pending", "running", "requested", "held")

Progress = Callable[[str], None]
#: the span of a row of ``tasks``, ``tries`` and ``workers`` (start, end: empty while it
#: goes), for the rows that overlap a window (:meth:`_Run._during`)
_TASK_SPAN = ("COALESCE(submitted, ready, started, finished)", "finished")
_TRY_SPAN = ("COALESCE(sent, started, ended)", "ended")
_WORKER_SPAN = ("joined", '"left"')
#: the end of a row of ``workers w`` (its ``cause``), with a ``preempted`` life named by
#: its block's end instead when that end, the first of the block's ends and requeues
#: (its rows with a cause) at or after the life ended, is an operator's: ``cancelled``
#: (``scancel``) or ``requeued`` not by preemption (``scontrol requeue``). Slurm sends
#: SIGTERM for those as for a preemption, and a worker cannot tell them apart: its
#: block's end, read from Slurm, can (docs/monitoring.md's lives of every pool: the same
#: SQL). It reads the blocks' ends from ``ends``, :data:`_BLOCK_ENDS` (a query using it
#: starts with that ``WITH``).
_LIFE_END = (
    "COALESCE(CASE WHEN w.cause = 'preempted' THEN (SELECT CASE WHEN b.state IN "
    "('cancelled', 'requeued') AND b.cause <> 'preempted' THEN b.state END FROM ends b "
    'WHERE b.run_id = w.run_id AND b.block = w.block AND b.time >= w."left" '
    "ORDER BY b.time LIMIT 1) END, w.cause)"
)
#: the blocks' ends and requeues (their rows with a cause), made once per query: SQLite
#: indexes the made table by block (an automatic index), so finding each preempted
#: life's end is a look-up whether or not the file has the ``blocks_block`` index (a
#: file a writer of this version never opened has not; the report only reads). Read
#: through ``blocks_time`` alone, each life walked every later row of its run's blocks
#: (review 1207g F4: 154 s for 5,000 preempted lives among 100,000 block rows)
_BLOCK_ENDS = (
    "WITH ends AS MATERIALIZED (SELECT run_id, block, time, state, cause FROM blocks "
    "WHERE cause IS NOT NULL) "
)


def _quiet(text: str) -> None:
    pass


def _first(point: tuple[int, Any, Any]) -> int:
    return point[0]


def _second(row: tuple[Any, int]) -> int:
    return row[1]


def _most(counts: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """The :data:`MAX_CATEGORIES` ``(category, count)`` of ``counts`` with the highest
    counts (of equal counts, the first by name), in order of name: the categories a
    plot draws apart."""
    return sorted(heapq.nlargest(MAX_CATEGORIES, sorted(counts), key=_second))


def _median_wait(
    conn: sqlite3.Connection, table: str, since: str, until: str, rid: tuple[str], where: str = ""
) -> float | None:
    """The median of ``until - since`` over ``table``'s rows of the run (and ``where``,
    SQL after an ``AND``: the window's) that have both (None without one): the
    ready-to-sent wait of tries, or of tasks in an older file."""
    wait = f"{until} - {since}"
    (n,) = conn.execute(
        f"SELECT COUNT({wait}) FROM {table} WHERE run_id = ?{where}", rid
    ).fetchone()
    if not n:
        return None
    # (SQLite sorts all and the cursor skips to it faster than a LIMIT 1 OFFSET)
    ordered = conn.execute(
        f"SELECT {wait} AS wait FROM {table} WHERE run_id = ?{where} AND {since} IS NOT NULL "
        f"AND {until} IS NOT NULL ORDER BY wait", rid,
    )  # fmt: skip
    (median,) = _nth(ordered, n // 2)
    return float(median)


def _nth(rows: Iterator[tuple[Any, ...]], n: int) -> tuple[Any, ...]:
    """The row after the next ``n`` of ``rows``, those skipped at C speed."""
    return next(itertools.islice(rows, n, None))


def _quantiles(rows: Iterator[tuple[Any, ...]], n: int) -> tuple[list[float], list[float]]:
    """The CDF of the next ``n`` of ``rows``, ``(anything, value)`` in order of value:
    all of them up to :data:`MAX_POINTS`, else that many evenly spaced quantiles, the
    first and the last among them; only those are fetched, the rest skipped."""
    at = (
        range(n)
        if n <= MAX_POINTS
        else sorted({k * (n - 1) // (MAX_POINTS - 1) for k in range(MAX_POINTS)})
    )
    xs, ys = [], []
    done = 0  # of the n rows, read or skipped
    for i in at:
        xs.append(_nth(rows, i - done)[1])
        ys.append((i + 1) / n)
        done = i + 1
    if done < n:  # skip the rest of them
        _nth(rows, n - done - 1)
    return xs, ys


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The names of ``table``'s columns (a file of an older schema version lacks some)."""
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _table(conn: sqlite3.Connection, table: str, rid: tuple[str]) -> str:
    """``table``, or ``table NOT INDEXED`` when the run has a quarter of its rows or
    more: SQLite, which has no statistics, would look each row up through an index on
    ``run_id``, several times slower than reading the table in order."""
    (run,) = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", rid).fetchone()
    (rows,) = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return f"{table} NOT INDEXED" if 4 * run >= rows else table


class _Thinned:
    """The points :func:`_thin` keeps of a series of ``n`` points, taken one at a time in
    order (:meth:`add`), without holding the series: past ``most`` points, each of
    ``most // 2`` stretches keeps its lowest and its highest point (the first of equal
    ones), in time order. :attr:`xs` and :attr:`ys` are whole after :meth:`done`."""

    def __init__(self, n: int, most: int = MAX_POINTS) -> None:
        self.xs: list[Any] = []
        self.ys: list[Any] = []
        self._n = n
        self._all = n <= most
        self._stretches = max(most // 2, 1)
        self._k = -1  #: the stretch under way
        self._i = 0  #: points taken
        self._end = 0  #: the index the next stretch starts at
        #: the stretch's lowest and highest points so far, (index, x, y), and their y
        self._low: tuple[int, Any, Any] | None = None
        self._high: tuple[int, Any, Any] | None = None
        self._low_y: Any = None
        self._high_y: Any = None

    def add(self, x: Any, y: Any) -> None:
        if self._all:
            self.xs.append(x)
            self.ys.append(y)
            return
        i = self._i
        self._i = i + 1
        if i >= self._end:
            self._close()
            while i >= self._end:  # (a stretch of no point: none while n > most)
                self._k += 1
                self._end = (self._k + 1) * self._n // self._stretches
            self._low = self._high = (i, x, y)
            self._low_y = self._high_y = y
        elif y < self._low_y:
            self._low = (i, x, y)
            self._low_y = y
        elif y > self._high_y:
            self._high = (i, x, y)
            self._high_y = y

    def done(self) -> _Thinned:
        """The last stretch's points added; ``self``."""
        self._close()
        return self

    def _close(self) -> None:
        low, high = self._low, self._high
        if low is None or high is None:
            return
        for _, x, y in (low,) if low is high else sorted((low, high), key=_first):
            self.xs.append(x)
            self.ys.append(y)
        self._low = self._high = None


def _utc(at: float) -> str:
    """A Unix time as the report and ``--list`` show it (UTC, to the second)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def _runs(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every row of ``runs``, the first started first."""
    cursor = conn.execute("SELECT * FROM runs ORDER BY started")
    cols = [d[0] for d in cursor.description]
    return [dict(zip(cols, row, strict=True)) for row in cursor]


def _run_end(info: dict[str, Any]) -> float:
    """When a run ended, or its latest write while it goes (or after it crashed)."""
    return float(info["ended"] or info["last_seen"] or info["started"])


@dataclass
class WorkerTime:
    """A pool's worker time in a run (or a window of it), in seconds: ``alive``, its
    workers' lives times their cores (what a batch system bills: core-seconds paid
    for); ``executing``, its tries' time from when they began executing to their end
    (``tries.ended - started``, each try one core); of that, ``failed``, in the tries
    that failed (every outcome but ``ok`` and ``cancelled``, not the free retries after
    a benign loss: the report's "failed tries")."""

    alive: float = 0.0
    executing: float = 0.0
    failed: float = 0.0

    @property
    def busy(self) -> float | None:
        """``executing`` over ``alive`` (None: no worker time)."""
        return self.executing / self.alive if self.alive > 0 else None


def _overlapping(window: tuple[float, float] | None, start: str, stop: str | None = None) -> str:
    """SQL to follow a ``WHERE``'s condition (`` AND ...``), empty without a ``window``:
    the rows whose span, from ``start`` to ``stop`` (empty: it goes on), overlaps the
    window; without ``stop``, those whose time ``start`` is in it."""
    if window is None:
        return ""
    lo, hi = window  # (floats: written into the SQL as they are)
    if stop is None:
        return f" AND {start} BETWEEN {lo!r} AND {hi!r}"
    return f" AND {start} <= {hi!r} AND ({stop} IS NULL OR {stop} >= {lo!r})"


def _worker_time(
    conn: sqlite3.Connection, run_id: str | None = None, span: tuple[float, float] | None = None
) -> tuple[dict[str, dict[str, WorkerTime]], list[tuple[str, str, str, int, float]]]:
    """Worker time by run and pool (:class:`WorkerTime`), from the ``workers`` and
    ``tries`` tables, and the tries that did not end ok by run, outcome and what they
    are (``failed``, ``cancelled``, ``retried free``): how many, their seconds
    executing. ``run_id``: that run only; ``span`` (Unix seconds): only what falls in
    it, lives and tries cut to it, and only the tries that overlap it counted (as the
    report's "failed tries" counts them). A life still going counts to the run's end or
    its latest write; a worker of no ``cores`` (an older file) counts one."""
    runs = " AND run_id = ?" if run_id is not None else ""
    args = (run_id,) if run_id is not None else ()
    lo, hi = (repr(span[0]), repr(span[1])) if span is not None else ("joined", "1e18")
    end = 'COALESCE("left", (SELECT COALESCE(r.ended, r.last_seen, r.started) FROM runs r ' \
        "WHERE r.run_id = workers.run_id))"  # fmt: skip
    times: dict[str, dict[str, WorkerTime]] = defaultdict(lambda: defaultdict(WorkerTime))
    for rid, pool, alive in conn.execute(
        f"SELECT run_id, COALESCE(pool, '?'), SUM(MAX(0, MIN({end}, {hi}) - MAX(joined, {lo})) "
        f"* COALESCE(cores, 1)) FROM workers WHERE joined IS NOT NULL{runs} GROUP BY 1, 2",
        args,
    ):  # fmt: skip
        times[rid][pool].alive = alive or 0.0
    lo, hi = (repr(span[0]), repr(span[1])) if span is not None else ("started", "ended")
    kind = (
        f"CASE WHEN outcome = 'ok' THEN 'ok' WHEN outcome = 'cancelled' THEN 'cancelled' "
        f"WHEN {_free_lost(conn)} THEN 'retried free' ELSE 'failed' END"
    )
    lost: list[tuple[str, str, str, int, float]] = []
    for rid, pool, outcome, what, n, ran in conn.execute(
        "SELECT run_id, COALESCE((SELECT pool FROM workers w WHERE w.run_id = tries.run_id "
        "AND w.worker = tries.worker LIMIT 1), '?'), outcome, " + kind + ", COUNT(*), "
        f"SUM(MAX(0, MIN(ended, {hi}) - MAX(started, {lo}))) FROM tries WHERE started IS NOT "
        f"NULL AND ended IS NOT NULL{runs}{_overlapping(span, *_TRY_SPAN)} "
        "GROUP BY 1, 2, 3, 4 ORDER BY 6 DESC",
        args,
    ):  # fmt: skip
        t = times[rid][pool]
        t.executing += ran or 0.0
        if what == "failed":
            t.failed += ran or 0.0
        if what != "ok":
            lost.append((rid, outcome, what, n, ran or 0.0))
    return times, lost


def _hours(seconds: float) -> str:
    """Seconds as hours, to 4 significant digits (``0.0825``, ``168``)."""
    return f"{seconds / 3600:.4g}"


def _spans(runs: Iterable[dict[str, Any]]) -> str:
    """The runs as an error lists them: each id with its span (UTC)."""
    return (
        "; ".join(
            f"{r['run_id']} ({_utc(r['started'])} to {_utc(_run_end(r))}"
            + ("" if r["ended"] else ", not ended")
            + ")"
            for r in runs
        )
        or "none"
    )


#: what --since and --until take, for the errors that say so
_WHEN_FORMS = (
    "a UTC date and time as the report and --list show them (2026-12-05 14:00 or "
    "2026-12-05T14:00:30; an ISO time with an offset, +01:00, is taken as such), a UTC "
    "time of day, today (14:00:30), Unix seconds, +DURATION from the run's start "
    "(+90m, +1h30m, +600), or -DURATION before its end (-1h: its last hour; for a run "
    "still going, before its latest record)"
)


def _absolute(text: str, flag: str, now: float | None = None) -> float | None:
    """The Unix time ``text`` (``--since``/``--until``) names, or None for a time from
    the run's start or end (``+DURATION``, ``-DURATION``); :class:`ReportRunError` for
    anything else. A time
    of day alone (``15:49:30``) is of today, the date in UTC (or in its own offset's
    zone, ``15:49:30+01:00``) at ``now`` (Unix seconds; None: the clock)."""
    text = text.strip()
    if text.startswith(("+", "-")):
        return None
    with contextlib.suppress(ValueError):
        at = float(text)
        if at == at and abs(at) != float("inf"):  # (not NaN, not infinite)
            return at
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        try:
            of_day = datetime.time.fromisoformat(text)
        except ValueError:
            raise ReportRunError("", f"{flag} {text!r} is not a time: give {_WHEN_FORMS}") from None
        zone = of_day.tzinfo or datetime.UTC
        today = datetime.datetime.fromtimestamp(time.time() if now is None else now, zone)
        when = datetime.datetime.combine(today.date(), of_day.replace(tzinfo=None), zone)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _when(text: str, flag: str, t0: float, end: float) -> float:
    """The Unix time ``text`` names, ``+DURATION`` from ``t0``, the run's start, or
    ``-DURATION`` before ``end``, its end (its latest record)."""
    at = _absolute(text, flag)
    if at is not None:
        return at
    from actors.alerts_state import parse_duration, typed_duration  # (not for --list)

    sign = text.strip()[0]
    try:
        span = parse_duration(typed_duration(text.strip()[1:]))
    except ValueError as exc:
        raise ReportRunError("", f"{flag} {text!r}: {exc} after the {sign}") from None
    return t0 + span if sign == "+" else end - span


def _pick(
    conn: sqlite3.Connection, run_id: str | None, since: str | None, until: str | None
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """The run the report is of (its ``runs`` row) and its window ``(from, to)`` in
    Unix seconds (None: the whole run): ``run_id``; else the one run a window of
    times given as such overlaps; else the latest. :class:`ReportRunError` (its path
    empty, the caller's to fill) for no such run, a window outside the run or across
    several runs, or a time that cannot be read."""
    runs = _runs(conn)
    if not runs and run_id is None:
        raise ReportRunError(
            "", "it holds no run yet; the manager writes its first rows within seconds"
        )
    lo_at = None if since is None else _absolute(since, "--since")
    hi_at = None if until is None else _absolute(until, "--until")
    if run_id is not None:
        found = [r for r in runs if r["run_id"] == run_id]
        if not found:
            raise ReportRunError(
                "", f"no run {run_id!r} in it (runs: {_spans(runs)}): give one of them to "
                "--run (--list shows each with its tasks)",
            )  # fmt: skip
        info = found[0]
    elif lo_at is not None or hi_at is not None:
        lo = -math.inf if lo_at is None else lo_at
        hi = math.inf if hi_at is None else hi_at
        found = [r for r in runs if r["started"] <= hi and _run_end(r) >= lo]
        window = _window_text(since, until)
        if not found:
            raise ReportRunError(
                "", f"no run was recorded {window} (runs: {_spans(runs)}): give a window "
                "within one of them",
            )  # fmt: skip
        if len(found) > 1:
            raise ReportRunError(
                "", f"{len(found)} runs were recorded {window} ({_spans(found)}): a report "
                "is of one run, give it with --run RUN_ID",
            )  # fmt: skip
        info = found[0]
    else:
        info = max(runs, key=lambda r: r["started"])
    if since is None and until is None:
        return info, None
    t0, end = float(info["started"]), _run_end(info)
    lo = t0 if since is None else _when(since, "--since", t0, end)
    hi = end if until is None else _when(until, "--until", t0, end)
    if since is not None and until is not None and lo >= hi:
        raise ReportRunError(
            "",
            f"the window {_window_text(since, until)} is empty: --since must come "
            f"before --until ({_utc(lo)} is not before {_utc(hi)})",
        )
    if lo >= end or hi <= t0:
        raise ReportRunError(
            "",
            f"run {info['run_id']} was recorded from {_utc(t0)} to {_utc(end)} (UTC), "
            f"nothing of it {_window_text(since, until)}: give a window within it",
        )
    return info, (max(lo, t0), min(hi, end))


def _window_text(since: str | None, until: str | None) -> str:
    """``--since``/``--until`` as an error says them."""
    return " ".join(
        part for part in (
            f"from {since!r}" if since is not None else "",
            f"until {until!r}" if until is not None else "",
        ) if part
    )  # fmt: skip


@dataclass
class _MergedBars:
    """The timeline's bars of merged tries (:func:`_merge_bars`): per colour (a
    category drawn apart, or None: the others), each bar's worker, start, length
    (seconds from the run's start), tries and the seconds they ran (their lengths
    summed: more than the bar's length where they ran side by side)."""

    gap: float  #: tries of a worker and colour less than this far apart are one bar
    tries: int  #: the tries merged
    bars: dict[str | None, tuple[list[str], list[float], list[float], list[int], list[float]]]

    @property
    def count(self) -> int:
        """The bars drawn."""
        return sum(len(b[0]) for b in self.bars.values())


def _merge_bars(
    rows: Iterable[tuple[str, str, float, float]], shown: set[str], gap: float, t0: float
) -> _MergedBars:
    """The bars of ``rows`` (``worker, category, start, end``, in order of worker, then
    start): of each worker, the tries of one category in ``shown`` (the others' all
    together) that began less than ``gap`` seconds after the bar so far ended are one
    bar, from the first start to the latest end. As the rows stream past: what is held
    is a bar per colour of one worker."""
    merged = _MergedBars(gap, 0, {})
    held: dict[str | None, list[float]] = {}  # colour -> [start, end, tries, seconds]
    now: str | None = None

    def emit(worker: str | None, colour: str | None, bar: list[float]) -> None:
        start, end, n, ran = bar
        lists = merged.bars.setdefault(colour, ([], [], [], [], []))
        lists[0].append(worker or "")
        lists[1].append(start)
        lists[2].append(max(end - start, 1e-3))
        lists[3].append(int(n))
        lists[4].append(ran)

    for worker, cat, started, ended in rows:
        if worker != now:
            for colour, ended_bar in held.items():
                emit(now, colour, ended_bar)
            held.clear()
            now = worker
        merged.tries += 1
        colour = cat if cat in shown else None
        start = started - t0
        end = max(ended - t0, start)
        bar = held.get(colour)
        if bar is not None and start - bar[1] <= gap:
            bar[1] = max(bar[1], end)
            bar[2] += 1
            bar[3] += end - start
            continue
        if bar is not None:
            emit(now, colour, bar)
        held[colour] = [start, end, 1, end - start]
    for colour, last in held.items():
        emit(now, colour, last)
    return merged


class _Run:
    """What the report shows of one run, times in seconds from its start.

    Nothing is read whole: SQLite counts, groups and sorts (the task states, the failed
    tries by cause, the median wait, the duration quantiles of each category drawn and
    of the others together, the latest tries), and each series is thinned as its rows
    go by (:class:`_Thinned`), so memory does not grow with the number of tasks. The
    reads share one snapshot of the file, which a manager may be writing to meanwhile."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        run_id: str | None,
        progress: Progress,
        since: str | None = None,
        until: str | None = None,
    ) -> None:
        q = conn.execute
        self.info, self.window = _pick(conn, run_id, since, until)
        self.id: str = self.info["run_id"]
        self.t0: float = self.info["started"]
        #: seconds from the run's start to its end (or latest write): how long it was
        #: recorded for
        self.recorded = _run_end(self.info) - self.t0
        #: the span drawn, seconds from the run's start: the run, or the window
        lo, hi = self.window or (self.t0, self.t0 + self.recorded)
        self.start: float = lo - self.t0
        self.end: float = hi - self.t0
        rid = (self.id,)

        def rows(sql: str, what: str) -> list[tuple[Any, ...]]:
            t = time.monotonic()
            out = q(sql, rid).fetchall()
            progress(f"read {len(out)} {what} ({time.monotonic() - t:.1f} s)")
            return out

        def step(read: Callable[[sqlite3.Connection, tuple[str]], int], what: str) -> None:
            t = time.monotonic()
            n = read(conn, rid)
            progress(f"read {n} {what} ({time.monotonic() - t:.1f} s)")

        snapshot = not conn.in_transaction
        if snapshot:
            q("BEGIN")  # one read transaction: every count agrees with the rows read
        try:
            step(self._read_tasks, "tasks")
            step(self._read_tries, "tries")
            step(self._read_failures, "failure groups")
            step(self._read_lost, "tries lost with their worker")
            step(self._read_free, "groups of free retries")
            step(self._read_worker_time, "worker time")
            self.workers = rows(
                f"{_BLOCK_ENDS}SELECT worker, pool, block, joined, left, {_LIFE_END} "
                "FROM workers w "
                "WHERE run_id = ?" + self._during(*_WORKER_SPAN), "workers",
            )  # fmt: skip
            # (every change up to the window's end: the states blocks are in as it begins)
            self.blocks = rows(
                "SELECT block, pool, state, time, cause FROM blocks WHERE run_id = ?"
                f"{self._before()} ORDER BY time", "block changes",
            )  # fmt: skip
            step(self._read_resources, "resource samples")
            step(self._read_transfers, "transfers")
            self.recoveries = rows(
                "SELECT time, key, worker, how FROM recoveries WHERE run_id = ?"
                f"{self._during('time')} ORDER BY time", "recoveries",
            )  # fmt: skip
            # Finished outputs lost with a worker and made again: how many, and the
            # seconds of the ok try that made each again (its first after the recovery).
            self.remade: tuple[int, float] = rows(
                "SELECT COUNT(*), TOTAL((SELECT t.ended - COALESCE(t.started, t.sent) "
                "FROM tries t WHERE t.run_id = r.run_id AND t.key = r.key AND "
                "t.outcome = 'ok' AND COALESCE(t.started, t.sent) >= r.time "
                "ORDER BY t.started LIMIT 1)) FROM recoveries r WHERE r.run_id = ? AND "
                f"r.how = 'recomputed'{self._during('r.time')}", "outputs made again",
            )[0]  # fmt: skip
            step(self._read_queues, "queue samples")
            self.alerts = rows(
                "SELECT time, name, state, labels, value, active_since, fired_at, resolved_at "
                f"FROM alerts WHERE run_id = ?{self._before()} ORDER BY time", "alert changes",
            )  # fmt: skip
            step(self._read_actions, "alert actions")
            step(self._read_policies, "policy swaps")
            self.gaps = q(
                f"SELECT COALESCE(SUM(lost), 0) FROM gaps WHERE run_id = ?{self._during('time')}",
                rid,
            ).fetchone()[0]
            if self.window is not None and not self.tasks and not self.tries:
                lo, hi = self.window
                raise ReportRunError(
                    "", f"no task of run {self.id} was submitted or ran from {_utc(lo)} to "
                    f"{_utc(hi)} (UTC; the run: {_spans([self.info])}, {_tasks_span(conn, rid)})"
                    ": give a window in which it ran tasks, or leave out --since and --until",
                )  # fmt: skip
        finally:
            if snapshot:
                q("ROLLBACK")  # it only read

    def t(self, at: float | None) -> float | None:
        return None if at is None else at - self.t0

    def _during(self, start: str, stop: str | None = None) -> str:
        """SQL to follow a ``WHERE``'s condition (`` AND ...``), empty without a window:
        the rows whose span overlaps the window (:func:`_overlapping`)."""
        return _overlapping(self.window, start, stop)

    def _before(self, at: str = "time") -> str:
        """SQL (`` AND ...``): the rows up to the window's end (the changes before it too,
        whose state holds into it: blocks, alerts); empty without a window."""
        return "" if self.window is None else f" AND {at} <= {self.window[1]!r}"

    def _held(self, table: str, series: str, only: str = "") -> str:
        """SQL (`` AND ...``) for the samples of ``table``, empty without a window: those
        in the window and, of each series (``series``: the columns naming one; ``only``:
        SQL keeping some), the latest before it, whose value holds into it (a series
        has a row when it changes: one still at its value has none in the window)."""
        if self.window is None:
            return ""
        lo, hi = self.window
        run = "'" + self.id.replace("'", "''") + "'"  # (an SQL string, quoted)
        return (
            f" AND (time BETWEEN {lo!r} AND {hi!r} OR rowid IN (SELECT latest FROM (SELECT "
            f"rowid AS latest, MAX(time) FROM {table} WHERE run_id = {run} AND time < {lo!r}"
            f"{only} GROUP BY {series})))"
        )

    def in_window(self, at: float) -> bool:
        """Whether the Unix time ``at`` is in the window (any time without one)."""
        return self.window is None or self.window[0] <= at <= self.window[1]

    def _read_actions(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The alert actions (the ``actions`` table, schema version 6) in the window,
        the latest :data:`MAX_ACTIONS` of them, oldest first: ``actions`` is None for a
        file that has no such table (an older Corral wrote it), and ``actions_total``
        how many the window has."""
        self.actions: list[tuple[Any, ...]] | None = None
        self.actions_total = 0
        if not _columns(conn, "actions"):
            return 0
        where = f"FROM actions WHERE run_id = ?{self._during('time')}"
        (self.actions_total,) = conn.execute(f"SELECT COUNT(*) {where}", rid).fetchone()
        latest = conn.execute(
            "SELECT time, rule, labels, pool, action, from_target, to_target, why, line "
            f"{where} ORDER BY time DESC, rowid DESC LIMIT {MAX_ACTIONS}", rid,
        ).fetchall()  # fmt: skip
        self.actions = latest[::-1]
        return len(latest)

    def _read_policies(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The policy swaps (the ``policies`` table, schema version 10) in the window,
        the latest :data:`MAX_ACTIONS` of them, oldest first: None for a file that has no
        such table (an older Corral wrote it)."""
        self.policies: list[tuple[Any, ...]] | None = None
        if not _columns(conn, "policies"):
            return 0
        latest = conn.execute(
            "SELECT time, kind, name, params, by, why FROM policies WHERE run_id = ?"
            f"{self._during('time')} ORDER BY time DESC, rowid DESC LIMIT {MAX_ACTIONS}",
            rid,
        ).fetchall()
        self.policies = latest[::-1]
        return len(latest)

    def _read_tasks(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The summary's numbers of the tasks: how many in each state, the makespan
        (first submitted to last finished) and the median wait from ready to sent to a
        worker (what a task waited on its worker behind others is not in it): of the
        tries ended (each wait after a retry or a lost worker counts); in a run whose
        tries say no wait (an older Corral wrote it), of the tasks, from their first
        ready to their first sent."""
        tasks = _table(conn, "tasks", rid)
        # per state: how many, the first submitted, the last finished, how many waited
        groups = conn.execute(
            "SELECT COALESCE(NULLIF(state, ''), '?'), COUNT(*), MIN(submitted), MAX(finished), "
            f"COUNT(started - ready) FROM {tasks} WHERE run_id = ?{self._during(*_TASK_SPAN)} "
            "GROUP BY 1", rid,
        ).fetchall()  # fmt: skip
        self.states: dict[str, int] = {state: n for state, n, *_ in groups}
        #: whether the file says when outputs were released (schema version 5 on)
        self.releases = "released" in _columns(conn, "tasks")
        firsts = [first for _, _, first, _, _ in groups if first is not None]
        lasts = [last for _, _, _, last, _ in groups if last is not None]
        waits = sum(waited for *_, waited in groups)
        self.tasks: int = sum(self.states.values())
        self.makespan = max(lasts) - min(firsts) if firsts and lasts else 0.0
        self.median_wait: float | None = None
        #: waits per pool and category, the most first (at most
        #: MAX_FAILURE_GROUPS_SHOWN): (pool, category, waits, mean s, max s)
        self.waits: list[tuple[str, str, int, float, float]] = []
        #: per client (``tasks.client``): (client, tasks, erred, hours of their
        #: successful tries, within the window if there is one), the most hours first,
        #: at most MAX_FAILURE_GROUPS_SHOWN; ``clients`` how many there are (0: a file
        #: of schema version 8 or older)
        self.by_client: list[tuple[str, int, int, float]] = []
        self.clients = 0
        if "client" in _columns(conn, "tasks"):
            where = f"FROM {tasks} WHERE run_id = ?{self._during(*_TASK_SPAN)}"
            (self.clients,) = conn.execute(
                f"SELECT COUNT(DISTINCT COALESCE(client, '')) {where}", rid
            ).fetchone()
            ran = "duration"  # the successful try's, which ended at ``finished``
            if self.window is not None:  # its part in the window (as the worker time)
                lo, hi = self.window
                ran = f"MAX(0, MIN(finished, {hi!r}) - MAX(finished - duration, {lo!r}))"
            self.by_client = conn.execute(
                "SELECT COALESCE(NULLIF(client, ''), '?') AS who, COUNT(*), "
                f"CAST(TOTAL(state = 'erred') AS INTEGER), TOTAL({ran}) {where} GROUP BY who "
                "ORDER BY 4 DESC, 2 DESC, who LIMIT ?", (*rid, MAX_FAILURE_GROUPS_SHOWN),
            ).fetchall()  # fmt: skip
        if "queued" in _columns(conn, "tries"):
            self.waits = conn.execute(
                # the worker's pool from one of its lives: each try once (a worker that
                # rejoined has a row per life), as docs/monitoring.md's query
                "SELECT COALESCE((SELECT w.pool FROM workers w WHERE w.run_id = tries.run_id "
                "AND w.worker = tries.worker LIMIT 1), '?') AS pool, COALESCE(NULLIF(category, "
                "''), '?') AS cat, COUNT(*), AVG(sent - queued), MAX(sent - queued) FROM "
                f"{_table(conn, 'tries', rid)} WHERE run_id = ?{self._during(*_TRY_SPAN)} AND "
                "queued IS NOT NULL AND sent IS NOT NULL GROUP BY pool, cat "
                "ORDER BY 3 DESC, pool, cat LIMIT ?", (*rid, MAX_FAILURE_GROUPS_SHOWN),
            ).fetchall()  # fmt: skip
            self.median_wait = _median_wait(
                conn, _table(conn, "tries", rid), "queued", "sent", rid, self._during(*_TRY_SPAN)
            )
            if self.median_wait is not None:
                return self.tasks
        if waits:
            self.median_wait = _median_wait(
                conn, tasks, "ready", "started", rid, self._during(*_TASK_SPAN)
            )
        return self.tasks

    def _read_tries(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The tries: failed ones by outcome and cause, the latest :data:`MAX_BARS` ended
        ones for the timeline, and for the CDF the duration quantiles of each of the
        :data:`MAX_CATEGORIES` categories with the most successful tries, and of the
        others' tries together."""
        tries = _table(conn, "tries", rid)
        during = self._during(*_TRY_SPAN)
        #: SQL: true for a try lost with its worker and retried free (not a failure)
        self.free = _free_lost(conn)
        # by count, then in the order of their first try (by end; not ended: first)
        groups = conn.execute(
            "SELECT outcome, COALESCE(NULLIF(cause, ''), NULLIF(error_type, ''), ''), "
            f"{self.free}, COUNT(*) FROM {tries} WHERE run_id = ?{during} GROUP BY 1, 2, 3 "
            "ORDER BY 4 DESC, MAX(ended IS NULL) DESC, MIN(ended)", rid,
        ).fetchall()  # fmt: skip
        self.tries: int = sum(n for *_, n in groups)
        #: failed tries by outcome and cause (a free retry after a lost worker is not
        #: one, nor a cancelled try: as ``report --list`` and "Why tasks failed")
        self.failures = [
            (o, c, n) for o, c, free, n in groups if o not in ("ok", "cancelled") and not free
        ]
        #: cancelled tries by cause (``cancelled``: a user's; ``unneeded``, ...)
        self.cancelled = [(c, n) for o, c, _, n in groups if o == "cancelled"]
        #: tries lost with their worker and retried free, by cause
        self.free_lost = [(c, n) for o, c, free, n in groups if free]
        #: past EACH_TRY_UP_TO tries, the timeline's merged bars (_merge_bars) of the
        #: successful tries, and :attr:`latest` holds the failed ones only
        self.merged: _MergedBars | None = None
        merging = self.tries > EACH_TRY_UP_TO
        failed_only = " AND outcome != 'ok'"
        # the latest ended, by end; at one end (a worker's tries lost with it) by worker,
        # start and as written, as SQLite sorted them before (through index tries_worker)
        latest = conn.execute(
            "SELECT key, try, category, worker, sent, started, ended, outcome, cause, "
            f"error_type FROM {tries} WHERE run_id = ?{during} AND ended IS NOT NULL"
            f"{failed_only if merging else ''} ORDER BY "
            "ended DESC, worker DESC, started DESC, rowid DESC LIMIT ?", (*rid, MAX_BARS),
        ).fetchall()  # fmt: skip
        latest.reverse()
        self.latest = latest
        # Successful tries' durations by category: how many of each (the categories
        # with the most drawn apart, the others as one line), then those of the drawn
        # categories in order (category, duration), of which only the quantiles drawn
        # are fetched, then those of the others in order of duration.
        ok = (
            "SELECT COALESCE(NULLIF(category, ''), '?') AS cat, MAX(ended - started, 0.0) AS "
            f"duration FROM {tries} WHERE run_id = ?{during} AND outcome = 'ok' AND started IS "
            "NOT NULL AND ended IS NOT NULL"
        )  # fmt: skip
        counts = conn.execute(
            f"SELECT cat, COUNT(*) FROM ({ok}) GROUP BY cat ORDER BY cat", rid
        ).fetchall()  # a row per category
        self.categories = len(counts)  #: categories with a successful try
        ok_tries = sum(n for _, n in counts)
        shown = _most(counts)
        marks = ", ".join("?" * len(shown))
        names = tuple(cat for cat, _ in shown)
        self.durations: dict[str, tuple[int, list[float], list[float]]] = {}
        if shown:
            durations = conn.execute(
                f"SELECT cat, duration FROM ({ok}) WHERE cat IN ({marks}) ORDER BY cat, "
                "duration", (*rid, *names),
            )  # fmt: skip
            for cat, n in shown:
                self.durations[cat] = (n, *_quantiles(durations, n))
        #: the categories not drawn apart: how many, their successful tries, the CDF of
        #: those tries' durations (``None``: every category is drawn)
        self.others: tuple[int, int, list[float], list[float]] | None = None
        if self.categories > len(shown):
            n = ok_tries - sum(n for _, n in shown)
            durations = conn.execute(
                f"SELECT cat, duration FROM ({ok}) WHERE cat NOT IN ({marks}) ORDER BY "
                "duration", (*rid, *names),
            )  # fmt: skip
            self.others = (self.categories - len(shown), n, *_quantiles(durations, n))
        if merging:
            gap = max(self.end - self.start, 1.0) / TIMELINE_BINS
            self.merged = _merge_bars(
                conn.execute(
                    "SELECT worker, COALESCE(NULLIF(category, ''), '?'), COALESCE(started, "
                    f"sent), ended FROM {tries} WHERE run_id = ?{during} AND outcome = 'ok' AND "
                    "COALESCE(started, sent) IS NOT NULL AND ended IS NOT NULL ORDER BY worker, "
                    "COALESCE(started, sent)", rid,
                ),
                set(names), gap, self.t0,
            )  # fmt: skip
        return self.tries

    def _read_worker_time(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The worker time per pool (:func:`_worker_time`; in a window, cut to it), and
        the time in the tries that did not end ok, by outcome. Returns the pools."""
        times, lost = _worker_time(conn, self.id, self.window)
        #: pool -> its worker time (alive, executing, in failed tries)
        self.worker_time: dict[str, WorkerTime] = dict(sorted(times.get(self.id, {}).items()))
        #: (outcome, what it was: failed, cancelled or retried free, tries, seconds)
        merged: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        for _, outcome, what, n, ran in lost:
            merged[(outcome, what)][0] += n
            merged[(outcome, what)][1] += ran
        self.time_lost = sorted(
            ((o, w, int(n), ran) for (o, w), (n, ran) in merged.items()), key=lambda r: -r[3]
        )
        return len(self.worker_time)

    def _read_free(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The tries lost with their worker and retried free (:func:`_free_lost`), by
        category and cause: how many, of how many tasks, how many of those tasks
        finished, and the latest try's key and worker, the latest group first.
        Returns the groups."""
        tries = _table(conn, "tries", rid)
        done = "('memory', 'released')"
        #: (category, cause, tries, tasks, tasks finished, latest key, its worker)
        self.why_free: list[tuple[str, str, int, int, int, str, str]] = [
            (cat, cause, n, tasks, ok, key, worker or "")
            for cat, cause, n, tasks, ok, key, worker, _ in conn.execute(
                "SELECT cat, cause, COUNT(*), COUNT(DISTINCT key), COUNT(DISTINCT CASE WHEN "
                f"(SELECT state FROM tasks k WHERE k.run_id = f.run_id AND k.key = f.key) IN "
                f"{done} THEN key END), key, worker, MAX(at) FROM (SELECT run_id, key, "
                "worker, COALESCE(NULLIF(category, ''), '?') AS cat, cause, COALESCE(ended, "
                f"sent) AS at FROM {tries} WHERE run_id = ?{self._during(*_TRY_SPAN)} AND "
                f"{self.free}) AS f GROUP BY cat, cause ORDER BY MAX(at) DESC LIMIT ?",
                (*rid, MAX_FAILURE_GROUPS_SHOWN),
            )
        ]  # fmt: skip
        return len(self.why_free)

    def _read_lost(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """What the tries lost with their worker cost, by cause: how many, the seconds
        they had executed (of those whose worker said when they began), how many had
        no such time, and what followed (a free retry, a charged one, none: the task
        failed; a file of schema version 6 or older did not record it); the tasks the
        retry policy moved to another pool, by the pool they left and the one they
        went to. Returns the causes."""
        tries = _table(conn, "tries", rid)
        during = self._during(*_TRY_SPAN)
        #: the columns ``retry`` and ``moved_to`` are there (schema version 7)
        self.retries_known = "retry" in _columns(conn, "tries")
        followed = (
            "SUM(retry IS 'free'), SUM(retry IS 'charged'), SUM(retry IS NULL)"
            if self.retries_known else "NULL, NULL, NULL"
        )  # fmt: skip
        #: (cause, tries, seconds run, tries with no start, free, charged, not retried)
        self.lost: list[tuple[str, int, float, int, int | None, int | None, int | None]] = [
            (cause, n, ran or 0.0, unknown, free, charged, none)
            for cause, n, ran, unknown, free, charged, none in conn.execute(
                "SELECT COALESCE(NULLIF(cause, ''), 'unknown'), COUNT(*), "
                "SUM(MAX(ended - started, 0.0)), SUM(started IS NULL), "
                f"{followed} FROM {tries} WHERE run_id = ?{during} AND outcome = "
                "'worker-lost' GROUP BY 1 ORDER BY 2 DESC, 1", rid,
            )
        ]  # fmt: skip
        #: (pool left, pool gone to, tasks, tries moved)
        self.moves: list[tuple[str, str, int, int]] = []
        if self.retries_known:
            self.moves = conn.execute(
                "SELECT COALESCE((SELECT w.pool FROM workers w WHERE w.run_id = tries.run_id AND "
                "w.worker = tries.worker LIMIT 1), '?'), moved_to, COUNT(DISTINCT key), "
                f"COUNT(*) FROM {tries} WHERE run_id = ?{during} AND moved_to IS NOT NULL "
                "GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2", rid,
            ).fetchall()  # fmt: skip
        #: (pool left, pool gone to, tasks, moves) of the waiting or queued tasks moved
        #: by hand (``Cluster.move``, the console's ``move``: the table ``moves``, schema
        #: version 10; no pool: ``any pool``); None: the file has no such table
        self.hand_moves: list[tuple[str, str, int, int]] | None = None
        if _columns(conn, "moves"):
            self.hand_moves = conn.execute(
                "SELECT COALESCE(from_pool, 'any pool'), COALESCE(to_pool, 'any pool'), "
                f"COUNT(DISTINCT key), COUNT(*) FROM moves WHERE run_id = ?{self._during('time')} "
                "GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2", rid,
            ).fetchall()  # fmt: skip
        #: the columns ``unsaved``, ``resumed`` and the table ``checkpoints`` are there
        #: (schema version 8)
        self.checkpoints_known = "unsaved" in _columns(conn, "tries")
        #: preempted tries' work no surviving checkpoint held (:data:`PREEMPTION`),
        #: and checkpoints saved, tries resumed from one, checkpoints lost
        self.unsaved = 0.0
        self.checkpointed = (0, 0, 0)
        #: (category, tries, seconds) of the preempted tries (:data:`PREEMPTION`) of
        #: tasks that saved no checkpoint in the run: their retries ran from the start
        self.uncheckpointed: list[tuple[str, int, float]] = []
        if self.checkpoints_known:
            causes = ", ".join(f"'{c}'" for c in sorted(PREEMPTION))
            self.uncheckpointed = [
                (category, n, ran or 0.0)
                for category, n, ran in conn.execute(
                    "SELECT COALESCE(category, '?'), COUNT(*), "
                    "SUM(COALESCE(unsaved, MAX(ended - started, 0.0))) "
                    f"FROM {tries} WHERE run_id = ?{during} AND outcome = 'worker-lost' "
                    f"AND cause IN ({causes}) AND NOT EXISTS (SELECT 1 FROM checkpoints c "
                    "WHERE c.run_id = tries.run_id AND c.key = tries.key "
                    "AND c.event = 'saved') GROUP BY 1 ORDER BY 3 DESC, 1", rid,
                )
            ]  # fmt: skip
            ((unsaved, resumed),) = conn.execute(
                # (a row an older Corral wrote has no unsaved: all it ran counts)
                f"SELECT SUM(CASE WHEN outcome = 'worker-lost' AND cause IN ({causes}) "
                "THEN COALESCE(unsaved, MAX(ended - started, 0.0)) END), "
                "SUM(resumed IS NOT NULL) "
                f"FROM {tries} WHERE run_id = ?{during}", rid,
            ).fetchall()  # fmt: skip
            ((saved, lost),) = conn.execute(
                "SELECT SUM(event = 'saved'), SUM(event = 'lost') FROM checkpoints "
                f"WHERE run_id = ?{self._during('time')}", rid,
            ).fetchall()  # fmt: skip
            self.unsaved = unsaved or 0.0
            self.checkpointed = (saved or 0, resumed or 0, lost or 0)
        return len(self.lost)

    def _read_failures(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The failure groups, as the dashboard's "Why tasks fail" groups them: the
        failed tries (every outcome but ``ok`` and ``cancelled``) of one category and
        one cause (the cause the scheduler counted each under: the database's
        ``tries.cause``; in a file of schema version 4 or older, the error's type for a
        task that raised), and the tasks of one category that erred with no failed try
        of their own for one cause (``tasks.cause``: outcome ``not-run``). SQLite groups
        them, the latest try or task of each found by ``max()``; of the
        :data:`MAX_FAILURE_GROUPS_SHOWN` latest groups, their latest row is read (its
        key, worker, error and traceback; for a task not run, the traceback of the
        latest failed try of the task that failed first; for tries lost with their
        worker whose latest task then erred, that task's ``tasks.error``, the error its
        client got, such as ``TaskCrashedWorkers``). Returns the groups."""
        from actors.scheduler_records import NOT_RUN  # (its import: not for --list)

        tries = _table(conn, "tries", rid)
        tb = "traceback" if "traceback" in _columns(conn, "tries") else "NULL"
        verdicts = "error" in _columns(conn, "tasks")  # (schema version 5 on)
        # (SQLite takes the bare rowid from the row of the group's max(): its latest)
        # per group, of how many tasks its tries were and how many of those erred (the
        # state they ended in: the others finished after a retry, or were not done)
        erred = (
            "(SELECT state FROM tasks k WHERE k.run_id = tries.run_id AND k.key = tries.key) "
            "= 'erred'"
        )
        found: list[tuple[float, str, str, int, str, int, int, int]] = [
            (at if at is not None else -1.0, cat, why, n, "tries", row, tasks, bad)
            for cat, why, n, at, row, tasks, bad in conn.execute(
                "SELECT COALESCE(NULLIF(category, ''), '?'), COALESCE(NULLIF(cause, ''), "
                "NULLIF(error_type, ''), outcome), COUNT(*), MAX(ended), rowid, "
                f"COUNT(DISTINCT key), COUNT(DISTINCT CASE WHEN {erred} THEN key END) "
                f"FROM {tries} WHERE run_id = ?{self._during(*_TRY_SPAN)} AND outcome NOT IN "
                f"('ok', 'cancelled') AND NOT {self.free} "
                "GROUP BY 1, 2", rid,
            )
        ]  # fmt: skip
        if "cause" in _columns(conn, "tasks"):
            found += [  # tasks that erred with no try of their own: n tasks, n erred
                (at if at is not None else -1.0, cat, why, n, "tasks", row, n, n)
                for cat, why, n, at, row in conn.execute(
                    "SELECT COALESCE(NULLIF(category, ''), '?'), cause, COUNT(*), "
                    f"MAX(finished), rowid FROM {_table(conn, 'tasks', rid)} "
                    f"WHERE run_id = ?{self._during(*_TASK_SPAN)} AND cause IS NOT NULL "
                    "GROUP BY 1, 2", rid,
                )
            ]  # fmt: skip
        self.failure_groups = len(found)
        #: the latest groups, the latest first: (category, cause, outcome, count, key,
        #: worker, error, traceback, tasks, tasks that erred)
        self.why_failed: list[tuple[str, str, str, int, str, str, str, str, int, int]] = []
        latest = heapq.nlargest(MAX_FAILURE_GROUPS_SHOWN, found)
        for _, cat, why, n, table, row, tasks, bad in latest:
            if table == "tries":
                key, worker, outcome, etype, emsg, trace = conn.execute(
                    f"SELECT key, worker, outcome, error_type, error_message, {tb} FROM tries "
                    "WHERE rowid = ?", (row,),
                ).fetchone()  # fmt: skip
                error = f"{etype}: {emsg}" if etype and emsg else etype or emsg or ""
                if outcome == "worker-lost" and verdicts:  # its task erred after it: what
                    # its client got (TaskCrashedWorkers), not the loss
                    verdict = conn.execute(
                        "SELECT error FROM tasks WHERE run_id = ? AND key = ? AND state = "
                        "'erred'", (*rid, key),
                    ).fetchone()  # fmt: skip
                    error = verdict[0] if verdict is not None and verdict[0] else error
            else:
                key, error, root = conn.execute(
                    "SELECT key, error, root FROM tasks WHERE rowid = ?", (row,)
                ).fetchone()
                worker, outcome, trace = "", NOT_RUN, None
                if root is not None:
                    first = conn.execute(
                        f"SELECT {tb} FROM tries WHERE run_id = ? AND key = ? AND outcome "
                        "NOT IN ('ok', 'cancelled') ORDER BY try DESC LIMIT 1", (*rid, root),
                    ).fetchone()  # fmt: skip
                    trace = first[0] if first is not None else None
            self.why_failed.append(
                (cat, why, outcome, n, key, worker or "", error or "", trace or "", tasks, bad)
            )
        return self.failure_groups

    def _read_resources(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """Each worker's RSS (once reported: not 0) and bytes on disk over time, thinned
        to :func:`_per_line` points a line, in one pass over the samples (in a window,
        of the workers alive in it, from each one's value as it begins)."""
        run = "'" + self.id.replace("'", "''") + "'"
        alive = (
            f" AND worker IN (SELECT worker FROM workers WHERE run_id = {run}"
            f"{self._during(*_WORKER_SPAN)})"
        )
        held = self._held("resource_samples", "worker", alive)
        counts = conn.execute(
            "SELECT worker, SUM(rss IS NOT NULL AND rss != 0), COUNT(spilled_bytes), COUNT(*) "
            f"FROM resource_samples WHERE run_id = ?{held} GROUP BY worker", rid,
        ).fetchall()  # fmt: skip
        #: (worker, its disk limit, the most bytes on its disk in a sample), of the
        #: workers that reported their disk: the summary's disk table
        self.disk_peaks: list[tuple[str, int | None, int]] = conn.execute(
            "SELECT worker, MAX(disk), MAX(spilled_bytes) FROM resource_samples "
            f"WHERE run_id = ?{held} AND spilled_bytes IS NOT NULL GROUP BY worker "
            "ORDER BY worker", rid,
        ).fetchall()  # fmt: skip
        most = _per_line(sum(1 for _, n, _, _ in counts if n))
        rss = {w: _Thinned(n, most) for w, n, _, _ in counts if n}
        most = _per_line(sum(1 for _, _, n, _ in counts if n))
        disk = {w: _Thinned(n, most) for w, _, n, _ in counts if n}
        for at, worker, used, spilled in conn.execute(
            "SELECT time, worker, rss, spilled_bytes FROM resource_samples WHERE run_id = ?"
            f"{held} ORDER BY time", rid,
        ):  # fmt: skip
            if used:  # else not reported yet
                rss[worker].add(at - self.t0, used / 2**20)
            if spilled is not None:
                disk[worker].add(at - self.t0, spilled / 2**20)
        self.rss = {w: line.done() for w, line in rss.items()}
        self.disk = {w: line.done() for w, line in disk.items()}
        return sum(n for *_, n in counts)

    def _read_transfers(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """The bytes copied between workers so far (since the window began), per kind,
        over time (thinned)."""
        during = self._during("time")
        counts = conn.execute(
            f"SELECT kind, COUNT(*) FROM transfers WHERE run_id = ?{during} GROUP BY kind", rid
        ).fetchall()
        lines = {kind: _Thinned(n) for kind, n in counts}
        so_far = dict.fromkeys(lines, 0.0)
        for at, kind, nbytes in conn.execute(
            f"SELECT time, kind, bytes FROM transfers WHERE run_id = ?{during} ORDER BY time", rid
        ):
            so_far[kind] += nbytes / 2**20
            lines[kind].add(at - self.t0, so_far[kind])
        self.copied = {kind: line.done() for kind, line in lines.items()}
        # Copies off workers that left or drained (each output, at each worker's end,
        # again: short-lived blocks pass a fan-in's inputs on, block after block).
        copies, outputs, nbytes = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT key), TOTAL(bytes) FROM transfers "
            f"WHERE run_id = ? AND kind = 'evacuation'{during}", rid
        ).fetchone()  # fmt: skip
        self.evacuated: tuple[int, int, float] = (copies, outputs, nbytes)
        return sum(n for _, n in counts)

    def _read_queues(self, conn: sqlite3.Connection, rid: tuple[str]) -> int:
        """Ready tasks and the oldest wait per pool over time (thinned; in a window,
        from each series' value as it begins)."""
        names = "('corral_queue_depth', 'corral_queue_oldest_wait_seconds')"
        held = self._held("metric_samples", "name, labels", f" AND name IN {names}")
        pool_of: dict[str, str] = {}
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for name, labels, n in conn.execute(
            f"SELECT name, labels, COUNT(*) FROM metric_samples WHERE run_id = ?{held} AND "
            f"name IN {names} GROUP BY name, labels", rid,
        ):  # fmt: skip
            pool_of[labels] = json.loads(labels).get("pool", "?")
            counts[(name, pool_of[labels])] += n
        lines = {key: _Thinned(n) for key, n in counts.items()}
        for at, name, labels, value in conn.execute(
            f"SELECT time, name, labels, value FROM metric_samples WHERE run_id = ?{held} AND "
            f"name IN {names} ORDER BY time", rid,
        ):  # fmt: skip
            lines[(name, pool_of[labels])].add(at - self.t0, value)
        self.queues = {key: line.done() for key, line in lines.items()}
        for line in self.queues.values():  # a series has a row when it changes: its last
            if line.xs and line.xs[-1] < self.end:  # value holds to the run's last write
                line.xs.append(self.end)
                line.ys.append(line.ys[-1])
        return sum(counts.values())


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    top = 80 if "<br>" in title else 60  # room for a note under the title (_note)
    fig.update_layout(
        title=title, height=height, template="plotly_white",
        margin={"l": 70, "r": 20, "t": top, "b": 50}, legend={"orientation": "h", "y": -0.15},
    )  # fmt: skip
    return fig


def _time_axis(fig: go.Figure, run: _Run, **where: Any) -> None:
    """The x axis of a plot over the run's time: from its start to its end (or the
    window's), the same on every such plot, so they line up whatever the data (tries
    begin when the first worker has joined; the metric samples at the start)."""
    fig.update_xaxes(range=[run.start, max(run.end, run.start + 1.0)])
    fig.update_xaxes(title="seconds since the run started", **where)


def _over_time(fig: go.Figure, run: _Run, y: str, title: str) -> go.Figure:
    """A plot over the run's time: axes titled, alerts drawn, laid out."""
    _time_axis(fig, run)
    fig.update_yaxes(title=y)
    _alert_bands(fig, run)
    return _layout(fig, title)


def _alert_bands(fig: go.Figure, run: _Run) -> None:
    """Firing (red) and pending (orange) spans of each alert, over the time plots; the
    labels of the firing ones in LABEL_ROWS rows, in turn by start time. The shapes
    and labels ``fig.add_vrect`` would draw (over the plot of a figure of one, over
    each subplot that has a trace of one of subplots), added at once: add_vrect
    validates the figure's every shape again at each call, seconds for a few alerts
    over five plots."""
    spans = _alert_spans(run)
    if not spans:
        return
    firing = sorted((s for s in spans if s[2] == "firing"), key=lambda s: (s[0], s[3]))
    row_of = {span: i % LABEL_ROWS for i, span in enumerate(firing)}
    if [a.plotly_name for a in fig.select_xaxes()] == ["xaxis"]:  # one plot
        plots = [("x", "y")]
    else:  # subplots: those with a trace, in order
        plots = sorted(
            {(t.xaxis, t.yaxis) for t in fig.data},
            key=lambda p: (int(p[1][1:] or 1), int(p[0][1:] or 1)),
        )
    shapes: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    for span in spans:
        start, stop, state, name = span
        for x, y in plots:
            shapes.append({
                "type": "rect", "x0": start, "x1": stop, "xref": x, "y0": 0, "y1": 1,
                "yref": f"{y} domain", "fillcolor": _ALERT_COLOR[state], "line": {"width": 0},
                "layer": "below",
            })  # fmt: skip
            # A label on firing spans only (with add_vrect, any annotation option
            # without a text made plotly draw its placeholder, "new text").
            if state == "firing":
                labels.append({
                    "text": f"{name} {state}", "showarrow": False, "x": start,
                    "xanchor": "left", "xref": x, "y": 1, "yanchor": "top",
                    "yref": f"{y} domain", "yshift": -LABEL_ROW_PX * row_of[span],
                })  # fmt: skip
    fig.update_layout(
        shapes=[*fig.layout.shapes, *shapes], annotations=[*fig.layout.annotations, *labels]
    )


def _alert_time(row: tuple[Any, ...]) -> float:
    """When the alert of an ``alerts`` row changed to its state: its ``active_since``,
    ``fired_at`` or ``resolved_at`` (a file an older Corral wrote has the time of the
    poll that saw the change in ``time``, up to an interval later), else ``time``."""
    at, _, state, _, _, active_since, fired_at, resolved_at = row
    real = {"pending": active_since, "firing": fired_at, "resolved": resolved_at}.get(state)
    return float(at if real is None else real)


def _alert_spans(run: _Run) -> list[tuple[float, float, str, str]]:
    """(start, stop, state, name): pending then firing spans, from the state changes at
    the times the alert gives them; a firing alert whose pending no row has (an older
    Corral's poll missed it) is drawn pending from ``active_since`` to ``fired_at``."""
    spans = []
    by_alert: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    for row in run.alerts:
        by_alert[(row[1], row[3])].append(row)
    for (name, _), rows in by_alert.items():
        changes = sorted(((_alert_time(row), row[2], row[5]) for row in rows), key=lambda c: c[0])
        for i, (at, state, active_since) in enumerate(changes):
            if state not in _ALERT_COLOR:
                continue
            before = changes[i - 1][1:] if i else None
            late = state == "firing" and active_since is not None and active_since < at
            if late and before != ("pending", active_since):
                spans.append((active_since - run.t0, at - run.t0, "pending", name))
            nxt = changes[i + 1][0] if i + 1 < len(changes) else run.t0 + run.end
            spans.append((at - run.t0, nxt - run.t0, state, name))
    if run.window is None:
        return spans
    # in a window: the spans that overlap it, cut to it
    return [
        (max(start, run.start), min(stop, run.end), state, name)
        for start, stop, state, name in spans
        if stop >= run.start and start <= run.end
    ]


def _timeline(run: _Run) -> go.Figure:
    tries = run.latest
    fig = go.Figure()
    by_cat: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    failed: list[tuple[Any, ...]] = []
    for r in tries:
        (failed if r[7] != "ok" else by_cat[r[2] or "?"]).append(r)

    def bars(rs: list[tuple[Any, ...]], name: str, **style: Any) -> None:
        starts = [run.t(r[5] if r[5] is not None else r[4]) for r in rs]
        fig.add_trace(
            go.Bar(
                y=[r[3] for r in rs], base=starts,
                x=[max(r[6] - run.t0 - (s or 0.0), 1e-3) for r, s in zip(rs, starts, strict=True)],
                orientation="h", name=name,
                customdata=[[r[0], r[1], r[7], r[8] or r[9] or "", r[2] or "?"] for r in rs],
                hovertemplate="%{customdata[0]} try %{customdata[1]} (%{customdata[4]})<br>"
                "%{customdata[2]} %{customdata[3]}<br>from %{base:.2f} s for %{x:.3f} s"
                "<extra></extra>",
                **style,
            )
        )  # fmt: skip

    merged = run.merged
    if merged is not None:  # the successful tries merged (_merge_bars), failed ones below
        _merged_bars(fig, run, merged)
    # The categories with the most tries drawn in a colour each, the others in grey.
    shown = [cat for cat, _ in _most((cat, len(rs)) for cat, rs in by_cat.items())]
    for cat in shown:
        bars(by_cat[cat], cat)
    others = sorted(set(by_cat) - set(shown))
    if others:
        rest = [r for cat in others for r in by_cat[cat]]
        bars(rest, f"the other {len(others)} categories", marker={"color": "#aaaaaa"})
    for outcome in sorted({r[7] for r in failed}):
        color = _OUTCOME_COLOR.get(outcome, "#d62728")
        bars([r for r in failed if r[7] == outcome], f"failed: {outcome}",
             marker={"color": color, "pattern": {"shape": "x"}})  # fmt: skip
    # Merged, the tries of every category overlap in each batch: each trace a stripe
    # of its own in a worker's row ("group"), or the last drawn would hide the others.
    fig.update_layout(barmode="overlay" if merged is None else "group", bargap=0.3)
    _time_axis(fig, run)
    fig.update_yaxes(title="worker", categoryorder="category ascending")
    _alert_bands(fig, run)
    workers = {r[3] for r in tries}
    title = SECTIONS[0]
    if merged is not None:
        for lists in merged.bars.values():
            workers.update(lists[0])
        title += _note(
            f"{run.tries:,} tries, merged: of each worker, successful tries of a category "
            f"less than {merged.gap:.2g} s apart are one bar ({merged.tries:,} as "
            f"{merged.count:,}: the count under the pointer), a stripe per category; "
            + (
                f"failed tries a bar each (the latest {len(tries):,} of them)"
                if len(tries) >= MAX_BARS else "failed tries a bar each"
            )
            + (
                f"; {run.categories} categories: the {len(run.durations)} with the most "
                "successful tries in a colour each, the others in grey"
                if None in merged.bars else ""
            )
        )  # fmt: skip
    elif run.tries > len(tries):
        title += f" (the latest {len(tries)} of {run.tries} tries)"
    n_workers = len(workers)
    if others:
        title += _note(
            f"{len(by_cat)} categories: the {len(shown)} with the most tries drawn in a "
            f"colour each, the other {len(others)} in grey"
        )
    row = 22 if merged is None else max(22, 8 * len(fig.data))  # (a stripe per trace)
    return _layout(fig, title, height=max(300, min(1200, 120 + row * n_workers)))


def _merged_bars(fig: go.Figure, run: _Run, merged: _MergedBars) -> None:
    """The timeline's bars of merged successful tries (:func:`_merge_bars`): a trace
    per category drawn apart, the others in grey."""
    for colour, (ys, starts, widths, counts, ran) in sorted(
        merged.bars.items(), key=lambda item: (item[0] is None, item[0] or "")
    ):
        name = colour if colour is not None else (
            f"the other {run.categories - len(run.durations)} categories"
        )  # fmt: skip
        fig.add_trace(go.Bar(
            y=ys, base=starts, x=widths, orientation="h", name=name,
            customdata=list(zip(counts, ran, strict=True)),
            hovertemplate=f"%{{customdata[0]}} tries of {html.escape(name)}, "
            "%{customdata[1]:.2f} s run<br>from %{base:.2f} s for %{x:.2f} s<extra></extra>",
            **({} if colour is not None else {"marker": {"color": "#aaaaaa"}}),
        ))  # fmt: skip


def _queues(run: _Run) -> go.Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("ready tasks", "oldest wait (s)"))  # fmt: skip
    for (name, pool), line in sorted(run.queues.items()):
        row = 1 if name == "corral_queue_depth" else 2
        label = "any pool" if pool == ANY_POOL else pool
        fig.add_trace(
            go.Scatter(x=line.xs, y=line.ys, mode="lines", line_shape="hv", name=f"{label}",
                       legendgroup=pool, showlegend=row == 1),
            row=row, col=1,
        )  # fmt: skip
    _time_axis(fig, run, row=2, col=1)
    _alert_bands(fig, run)
    return _layout(fig, SECTIONS[1], height=520)


def _steps(changes: list[tuple[float, int]], end: float) -> tuple[list[float], list[int]]:
    """A count over time from (time, +1/-1) changes."""
    xs, ys, n = [0.0], [0], 0
    for at, d in sorted(changes):
        n += d
        xs.append(at)
        ys.append(n)
    xs.append(max(end, xs[-1]))
    ys.append(n)
    return xs, ys


def _fleet(run: _Run) -> go.Figure:
    fig = go.Figure()
    per_pool: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for _, pool, _, joined, left, _ in run.workers:
        if joined is not None:
            per_pool[pool].append((joined - run.t0, 1))
        if left is not None:
            per_pool[pool].append((left - run.t0, -1))
    for pool, changes in sorted(per_pool.items()):
        xs, ys = _steps(changes, run.end)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv",
                                 name=f"workers {pool}"))  # fmt: skip
    state_of: dict[str, str] = {}
    counts: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    pool_of: dict[str, str] = {}
    for block, pool, state, at, _ in run.blocks:
        pool_of[block] = pool
        prev = state_of.get(block)
        t = at - run.t0
        if prev is not None:
            counts[(pool, prev)].append((t, -1))
        counts[(pool, state)].append((t, 1))
        state_of[block] = state
    for (pool, state), changes in sorted(counts.items()):
        if state not in _BLOCK_LIVE:
            continue  # ends: a block that ended is no longer counted
        xs, ys = _steps(changes, run.end)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv",
                                 line={"dash": "dot"}, name=f"blocks {pool} {state}"))  # fmt: skip
    requeues: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for block, pool, state, at, cause in run.blocks:
        if state == "requeued" and run.in_window(at):
            requeues[pool].append((at - run.t0, f"{block} requeued ({cause or 'no cause'})"))
    for pool, marks in sorted(requeues.items()):
        fig.add_trace(go.Scatter(
            x=[t for t, _ in marks], y=[0] * len(marks), mode="markers",
            marker={"symbol": "triangle-down", "size": 10}, name=f"requeued {pool}",
            text=[why for _, why in marks], hovertemplate="%{text}<br>%{x:.1f} s<extra></extra>",
        ))  # fmt: skip
    return _over_time(fig, run, "count", SECTIONS[2])


def _memory(run: _Run) -> go.Figure:
    fig = go.Figure()
    for worker, line in sorted(run.rss.items()):
        fig.add_trace(go.Scatter(x=line.xs, y=line.ys, mode="lines", line_shape="hv",
                                 name=worker))  # fmt: skip
    return _over_time(fig, run, "RSS (MiB)", SECTIONS[3])


def _per_line(lines: int) -> int:
    """Points each of ``lines`` lines of one plot may have (``FIGURE_POINTS`` shared)."""
    return max(100, min(MAX_POINTS, FIGURE_POINTS // max(lines, 1)))


def _thin(
    xs: list[float], ys: list[float], most: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """``xs, ys`` with at most about ``most`` points: past that, each of ``most // 2``
    stretches keeps its lowest and its highest point, in time order, so a line drawn
    through them has every peak and dip of the whole series."""
    if len(xs) <= most:
        return xs, ys
    line = _Thinned(len(xs), most)
    for x, y in zip(xs, ys, strict=True):
        line.add(x, y)
    line.done()
    return line.xs, line.ys


def _cdf(run: _Run) -> go.Figure:
    fig = go.Figure()
    # evenly spaced quantiles, the first and the last among them (_Run._read_tries)
    for cat, (n, xs, ys) in sorted(run.durations.items()):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if n < 5 else "lines",
                                 line_shape="hv", name=f"{cat} ({n})"))  # fmt: skip
    title = SECTIONS[4]
    if run.others is not None:
        rest, n, xs, ys = run.others
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers" if n < 5 else "lines", line_shape="hv",
            line={"color": "#888888", "dash": "dash"}, name=f"the other {rest} categories ({n})",
        ))  # fmt: skip
        title += _note(
            f"{run.categories} categories: the {len(run.durations)} with the most successful "
            f"tries, the other {rest} as one line (dashed)"
        )
    elif not run.durations:
        title += " (no successful try in this run)"
    fig.update_xaxes(title="duration of a successful try (s)", type="log")
    fig.update_yaxes(title="fraction of tries", range=[0, 1.02])
    return _layout(fig, title)


def _note(text: str) -> str:
    """A second, smaller line of a plot's title."""
    return f"<br><sup>{html.escape(text)}</sup>"


def _alerts_figure(run: _Run) -> go.Figure:
    fig = go.Figure()
    spans = _alert_spans(run)
    for start, stop, state, name in spans:
        fig.add_trace(go.Scatter(
            x=[start, stop], y=[name, name], mode="lines+markers", name=f"{name} {state}",
            line={"width": 12, "color": "#d62728" if state == "firing" else "orange"},
            showlegend=False, hovertemplate=f"{name} {state}<br>%{{x:.1f}} s<extra></extra>",
        ))  # fmt: skip
    resolved = [
        (_alert_time(r) - run.t0, r[1])
        for r in run.alerts
        if r[2] == "resolved" and run.in_window(_alert_time(r))
    ]
    if resolved:
        fig.add_trace(go.Scatter(x=[t for t, _ in resolved], y=[n for _, n in resolved],
                                 mode="markers", marker={"symbol": "x", "size": 10,
                                 "color": "green"}, name="resolved"))  # fmt: skip
    actions = run.actions or []
    for kind, (symbol, color) in _ACTION_MARK.items():
        mine = [a for a in actions if a[4] == kind]
        if mine:
            fig.add_trace(go.Scatter(
                x=[a[0] - run.t0 for a in mine], y=[a[1] or "(no rule)" for a in mine],
                mode="markers", marker={"symbol": symbol, "size": 11, "color": color},
                name=f"action: {kind}", text=[a[8] for a in mine],
                hovertemplate="%{text}<br>%{x:.1f} s<extra></extra>",
            ))  # fmt: skip
    _time_axis(fig, run)
    title = SECTIONS[5] + ("" if spans or resolved or actions else " (none in this run)")
    rows = {s[3] for s in spans} | {a[1] or "(no rule)" for a in actions}
    return _layout(fig, title, height=260 + 30 * len(rows))


def _actions_table(run: _Run) -> str:
    """The table of the alert actions (the remediation audit: scale-outs, refusals,
    targets set back, scales that failed), oldest first, below the alerts plot."""
    e = html.escape
    head = f"<h2>{e(ACTIONS_TITLE)}</h2>"
    if run.actions is None:
        return head + (
            "<p>This file does not record alert actions (an older Corral wrote it: they "
            "went to its log only).</p>"
        )
    if not run.actions:
        return head + "<p>No alert action was taken or refused.</p>"
    note = (
        f"The latest {len(run.actions)} of {run.actions_total}. "
        if run.actions_total > len(run.actions) else ""
    )  # fmt: skip
    rows = []
    for at, rule, labels, pool, action, before, after, why, _ in run.actions:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(json.loads(labels or "{}").items()))
        alert = f"{rule or '-'}{{{shown}}}" if shown else rule or "-"
        target = (
            f"{before} \u2192 {after}" if before is not None and after is not None
            else "-" if before is None else str(before)
        )  # fmt: skip
        rows.append(
            f"<tr class=action data-action='{e(action)}'><td>{e(_utc(at))}</td>"
            f"<td>{at - run.t0:.1f}</td><td>{e(alert)}</td><td>{e(pool or '-')}</td>"
            f"<td>{e(action)}</td><td>{e(target)}</td><td>{e(why or '')}</td></tr>"
        )
    return (
        f"{head}<p>{e(note)}What each alert's scale-out action did or refused, and why "
        "(the monitoring database's <code>actions</code>; target: the pool's blocks "
        "before and after).</p><table class=actions><tr><th>time (UTC)</th><th>s</th>"
        "<th>alert</th><th>pool</th><th>action</th><th>target</th><th>why</th></tr>"
        + "".join(rows) + "</table>"
    )  # fmt: skip


def _policies_table(run: _Run) -> str:
    """The table of the policy swaps (who set which policy when, or why the scheduler
    replaced a slow one), oldest first, after the alert actions; nothing when the run
    had none."""
    e = html.escape
    if not run.policies:
        return ""
    rows = []
    for at, kind, name, params, by, why in run.policies:
        given = ", ".join(f"{k}={v!r}" for k, v in sorted(json.loads(params or "{}").items()))
        rows.append(
            f"<tr class=policy><td>{e(_utc(at))}</td><td>{at - run.t0:.1f}</td>"
            f"<td>{e(kind)}</td><td>{e(name)}</td><td>{e(given)}</td>"
            f"<td>{e(by or '')}</td><td>{e(why or '')}</td></tr>"
        )
    return (
        f"<h2>{e(POLICIES_TITLE)}</h2><p>Each policy set while the run went (the "
        "monitoring database's <code>policies</code>): the tasks after a swap ran under "
        "the new policy.</p><table class=policies><tr><th>time (UTC)</th><th>s</th>"
        "<th>kind</th><th>policy</th><th>parameters</th><th>by</th><th>why</th></tr>"
        + "".join(rows) + "</table>"
    )  # fmt: skip


#: a table of the summary: its head, its rows, and its HTML class ("": none; _NOTE: no
#: table but a line, its head's one cell)
_Table = tuple[tuple[str, ...], list[tuple[Any, ...]], str]
_NOTE = "note"


def _summary_head(run: _Run) -> list[tuple[str, Any]]:
    """The summary's first table, as ``(name, value)`` rows."""
    # Lost unasked: left for any reason but on purpose (drained, walltime, shutdown),
    # per life (a worker requeued under its id may be lost again).
    lost = sum(1 for w in run.workers if w[5] is not None and w[5] not in ON_PURPOSE)
    workers = len({w[0] for w in run.workers})
    names = _STATE_NAME if run.releases else {**_STATE_NAME, "memory": _OLD_MEMORY}
    info = run.info
    return [
        ("run", run.id),
        ("host / pid", f"{info['host']} / {info['pid']}"),
        ("started (UTC)", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.t0))),
        ("recorded for", f"{run.recorded:.1f} s" + ("" if info["ended"] else " (still "
            "running, or it stopped without closing the database)")),
        *([("window (UTC)", _window_row(run))] if run.window else []),
        ("tasks", run.tasks),
        *((f"tasks {names.get(s, s)}", n) for s, n in sorted(run.states.items())),
        ("tries", run.tries),
        ("makespan (first submitted to last finished)", f"{run.makespan:.2f} s"),
        ("median wait ready to sent to a worker",
            "-" if run.median_wait is None else f"{run.median_wait:.3f} s"),
        ("workers", f"{workers} ({len(run.workers)} lives, {lost} ended unasked)"),
        ("blocks", _blocks(run)),
        ("monitoring: feed events lost, rows dropped", f"{run.gaps}, {info['dropped_rows']}"),
    ]  # fmt: skip


def _summary_tables(run: _Run) -> list[_Table]:
    """The summary's tables after its first, in order: the HTML report's and the text
    report's."""
    return [
        (("failed tries: outcome", "cause", "n"), run.failures, ""),
        (("cancelled tries (not failures): cause", "n"), run.cancelled, ""),
        (("worker time: pool", "core-h alive", "h executing", "busy", "h in failed tries"),
         _worker_time_rows(run), ""),
        (("time in tries not ended ok: outcome", "what", "tries", "h executing"),
         [(o, w, n, _hours(ran)) for o, w, n, ran in run.time_lost], ""),
        (("tries lost with their worker, retried free: cause", "n"), run.free_lost, ""),
        (("tasks per client" + _first_of(len(run.by_client), run.clients) + ": client",
          "tasks", "erred", "h in successful tries"),
         [(c, n, erred, _hours(ran)) for c, n, erred, ran in run.by_client], ""),
        (("waits ready to sent: pool", "category", "waits", "mean s", "max s"),
         [(p, c, n, f"{mean:.3f}", f"{most:.3f}") for p, c, n, mean, most in run.waits], ""),
        (("worker lives: pool", "ended", "lives", "mean s", "shortest s", "longest s"),
         _lives(run), ""),
        (("block ends: state", "cause", "n"), _block_ends(run), ""),
        *_lost_cost_tables(run),
        (("outputs lost with a worker: how they came back", "outputs", "workers"),
         _recoveries(run), ""),
        (("bytes on disk: worker", "limit MiB", "most MiB (sampled)", "of its limit"),
         _disk_peaks(run), ""),
    ]  # fmt: skip


def _first_of(shown: int, total: int) -> str:
    """A table's note when it shows the first ``shown`` rows of ``total``."""
    return f" (the {shown} with the most time, of {total})" if total > shown else ""


def _disk_peaks(run: _Run) -> list[tuple[Any, ...]]:
    """Each worker's disk limit and the most its samples had on disk (spilled outputs,
    file outputs): how close a run came to filling its workers' disks. Sampled every
    monitoring interval, so a peak between two samples is not seen."""
    rows = []
    for worker, limit, most in run.disk_peaks:
        share = f"{most / limit:.0%}" if limit else "not counted"
        rows.append((worker, f"{(limit or 0) / 2**20:.1f}", f"{most / 2**20:.1f}", share))
    return rows


def _summary(run: _Run) -> str:
    e = html.escape
    head = "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in _summary_head(run))
    return (
        "<h2>Summary</h2><div class=tables><table>" + head + "</table>"
        + "".join(_html_table(*t) for t in _summary_tables(run))
        + "</div>"
    )  # fmt: skip


def _html_table(head: tuple[str, ...], rows: list[tuple[Any, ...]], cls: str) -> str:
    """A table of the summary (:data:`_Table`) in HTML: a line for a :data:`_NOTE`."""
    return f"<p>{html.escape(head[0])}</p>" if cls == _NOTE else _counts(head, rows, cls)


def _lost_cost(run: _Run) -> str:
    """What tries lost with their worker cost (:func:`_lost_cost_tables`), in HTML."""
    return "".join(_html_table(*t) for t in _lost_cost_tables(run))


def _free_lost(conn: sqlite3.Connection) -> str:
    """SQL (over ``tries``): true for a try lost with its worker for a cause that says
    nothing of its task (:data:`~policies.BENIGN_LOSSES`: preempted, walltime, drained,
    ...) and retried free: not a failure. A file of schema version 6 or older does not
    say what followed a try: there, such a try that a later try of its task followed."""
    causes = ", ".join(f"'{c}'" for c in sorted(BENIGN_LOSSES))
    if "retry" in _columns(conn, "tries"):
        followed = "retry IS 'free'"
    else:
        followed = (
            "EXISTS (SELECT 1 FROM tries later WHERE later.run_id = tries.run_id AND "
            "later.key = tries.key AND later.try > tries.try)"
        )
    return f"(outcome IS 'worker-lost' AND cause IN ({causes}) AND {followed})"


def uncheckpointed_hint(rows: Sequence[tuple[str, int, float]]) -> str:
    """What the report says of preempted tries whose tasks saved no checkpoint (by
    category: tries, seconds lost), and how to make such a task resume instead."""
    each = "; ".join(f"{category}: {n} tr{'y' if n == 1 else 'ies'}, {ran:.1f} s"
                     for category, n, ran in rows)  # fmt: skip
    return (
        f"tasks that saved no checkpoint ran again from the start: {each}. A task that "
        "saves its progress with checkpoint(obj) or checkpoint_file(path) and reads it "
        "back with restore() or restore_path() resumes from it after a preemption "
        "(docs/files.md#checkpoints)"
    )


def _lost_cost_tables(run: _Run) -> list[_Table]:
    """What tries lost with their worker cost (:meth:`_Run._read_lost`), by cause: a
    line of totals for preemption (:data:`PREEMPTION`), a table per cause, the tasks
    the retry policy moved to another pool, and those moved by hand."""
    pre = [r for r in run.lost if r[0] in PREEMPTION]
    known = run.retries_known
    line = f"{sum(r[1] for r in pre)} tries lost, {sum(r[2] for r in pre):.1f} s of work lost"
    if run.checkpoints_known:  # what no checkpoint that survived held
        line += f", {run.unsaved:.1f} s net of checkpoints"
    if any(r[3] for r in pre):
        line += f" ({sum(r[3] for r in pre)} with no start recorded: not counted)"
    if known:
        line += (
            f", {sum(r[4] or 0 for r in pre)} free retries, {sum(r[5] or 0 for r in pre)} "
            f"charged, {sum(r[6] or 0 for r in pre)} not retried"
        )
        moved = sum(m[2] for m in run.moves)
        line += f", {moved} task{'s' if moved != 1 else ''} moved" + "".join(
            f" {src}->{to} {n}" for src, to, n, _ in run.moves
        )
    else:
        line += " (this file does not record retries or moves: schema version 6 or older)"
    if run.checkpoints_known:
        saved, resumed, lost = run.checkpointed
        line += f"; checkpoints: {saved} saved, {resumed} tries resumed from one, {lost} lost"
    else:
        line += "; this file does not record checkpoints (schema version 7 or older)"
    n, remade = run.remade  # (lost with a worker of any cause: recoveries say none)
    line += f"; finished outputs lost with a worker and made again: {n}, {remade:.1f} s run again"
    copies, outputs, nbytes = run.evacuated
    line += (
        f"; outputs copied off workers that left or drained: {copies} copies of {outputs} "
        f"outputs, {nbytes / 2**20:.2f} MiB"
    )
    lines = [(line,)]
    if run.uncheckpointed:
        lines.append((uncheckpointed_hint(run.uncheckpointed),))
    rows = [
        (cause, n, f"{ran:.1f}", unknown, *(("-",) * 3 if not known else (free, charged, none)))
        for cause, n, ran, unknown, free, charged, none in run.lost
    ]
    hand = (
        (("tasks moved by hand (Cluster.move, the console's move): from", "to", "tasks",
          "moves"), list(run.hand_moves), "")
        if run.hand_moves is not None
        else (("this file does not record tasks moved by hand (schema version 9 or older)",),
              [], _NOTE)
    )  # fmt: skip
    return [
        ((f"what preemption cost ({', '.join(sorted(PREEMPTION))})",), lines, "preemption"),
        (("tries lost with their worker: cause", "tries", "seconds run", "no start recorded",
          "free retries", "charged retries", "not retried"), rows, ""),
        (("tasks moved to another pool: from", "to", "tasks", "tries"), list(run.moves), ""),
        hand,
    ]  # fmt: skip


def _window_row(run: _Run) -> str:
    """The summary's line of the window: its times and what is counted in it."""
    return (
        f"{_utc(run.t0 + run.start)} to {_utc(run.t0 + run.end)}, seconds {run.start:.1f} to "
        f"{run.end:.1f} of the run: the tasks, tries and worker lives that overlap it, the "
        "samples, transfers and block ends in it"
    )


def _blocks(run: _Run) -> int:
    """How many blocks the run had (in a window: that lived in it, a row in it or
    alive as it began)."""
    if run.window is None:
        return len({b[0] for b in run.blocks})
    state: dict[str, str] = {}  # (the rows in order of time)
    seen: set[str] = set()
    for block, _, now, at, _ in run.blocks:
        if at < run.window[0]:
            state[block] = now
        else:
            seen.add(block)
    return len(seen | {b for b, now in state.items() if now in _BLOCK_LIVE})


def _counts(head: tuple[str, ...], rows: Iterable[tuple[Any, ...]], cls: str = "") -> str:
    """A table of the summary: ``head``, then ``rows`` (or a row saying none); ``cls``:
    its HTML class."""
    e = html.escape
    cells = (
        "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in rows)
        or f"<tr><td colspan={len(head)}>none</td></tr>"
    )
    table = f"<table class={cls}>" if cls else "<table>"
    return table + "<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + cells + "</table>"


def _block_ends(run: _Run) -> list[tuple[str, str, int]]:
    """The run's block ends and requeues (in the window) by state and cause, the most
    first (a row with no cause says ``-``)."""
    n: dict[tuple[str, str], int] = defaultdict(int)
    for _, _, state, at, cause in run.blocks:
        if state not in _BLOCK_LIVE and run.in_window(at):
            n[(state, cause or "-")] += 1
    return [(state, cause, k) for (state, cause), k in sorted(n.items(), key=lambda r: -r[1])]


def _worker_time_rows(run: _Run) -> list[tuple[str, str, str, str, str]]:
    """The worker time per pool (:attr:`_Run.worker_time`) as the summary shows it, in
    hours, with the busy share (executing over alive)."""
    return [
        (pool, _hours(t.alive), _hours(t.executing),
         "-" if t.busy is None else f"{t.busy:.0%}", _hours(t.failed))
        for pool, t in run.worker_time.items()
    ]  # fmt: skip


def _lives(run: _Run) -> list[tuple[str, str, int, str, str, str]]:
    """The workers' lives (in the window) per pool and how they ended (``alive``: not
    yet, counted to the run's end or its latest write; a ``preempted`` one whose block
    an operator cancelled or requeued: ``cancelled``, ``requeued``, :data:`_LIFE_END`),
    the most first: how many, and
    their mean, shortest and longest length in seconds (whole lives, not cut to the
    window), as docs/monitoring.md's query counts them."""
    end = _run_end(run.info)
    spans: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _, pool, _, joined, left, cause in run.workers:
        how = "alive" if left is None else cause or "?"
        spans[(pool or "?", how)].append((end if left is None else left) - joined)
    return [
        (pool, how, len(s), f"{sum(s) / len(s):.1f}", f"{min(s):.1f}", f"{max(s):.1f}")
        for (pool, how), s in sorted(spans.items(), key=lambda r: (r[0][0], -len(r[1])))
    ]


def _recoveries(run: _Run) -> list[tuple[str, int, int]]:
    """Outputs still needed that were lost with their worker, by how they came back
    (``recomputed``: their task ran again; ``replica``: a replica kept them): how many,
    and from how many workers."""
    keys: dict[str, int] = defaultdict(int)
    workers: dict[str, set[str]] = defaultdict(set)
    for _, _, worker, how in run.recoveries:
        keys[how] += 1
        workers[how].add(worker)
    return [(how, n, len(workers[how])) for how, n in sorted(keys.items(), key=lambda r: -r[1])]


def _why_free(run: _Run) -> str:
    """The table of tries lost with their worker and retried free
    (:meth:`_Run._read_free`), by category and cause, the latest first: not failures
    (their tasks ran again, their budget untouched)."""
    e = html.escape
    head = f"<h2>{e(FREE_TITLE)}</h2>"
    benign = e(", ".join(sorted(BENIGN_LOSSES)))
    # the tries lost for a cause that may be the task's and yet retried free (a crash,
    # a lost connection): suspects, so under the failures, said here too (a user audit
    # read "No try was ... retried free" beside "crash | 1 | ... | free retries 1")
    suspects = [(cause, free) for cause, _, _, _, free, _, _ in run.lost
                if free and cause not in BENIGN_LOSSES]  # fmt: skip
    also = (
        f"<p class=suspects>Tries lost with their worker for a cause that may be the "
        f"task's, retried free too ({e(', '.join(f'{c}: {n}' for c, n in suspects))}), "
        f"are suspects: they are under {e(FAILURES_TITLE)}.</p>"
        if suspects else ""
    )  # fmt: skip
    if not run.why_free:
        return (
            f"{head}<p>No try was lost with its worker for a reason that says nothing of "
            f"the task ({benign}) and retried free.</p>{also}"
        )
    rows = "".join(
        f"<tr class=free data-category='{e(cat)}' data-cause='{e(cause)}'><td class=count>"
        f"{n} x</td><td>{e(cat)}</td><td>{e(cause)}</td><td>{tasks}</td><td>{ok}</td>"
        f"<td>{e(key)}</td><td>{e(worker)}</td></tr>"
        for cat, cause, n, tasks, ok, key, worker in run.why_free
    )
    return (
        f"{head}<p>Tries whose worker went for a reason that says nothing of the task "
        f"({benign}) and that were retried without spending "
        "the task's retry budget: not failures. A try that spent it, or after which its "
        f"task failed, is under {e(FAILURES_TITLE)}.</p>{also}<table class=free><tr>"
        "<th>lost</th><th>category</th><th>cause</th><th>tasks</th><th>tasks finished</th>"
        "<th>latest key</th><th>worker</th></tr>" + rows + "</table>"
    )  # fmt: skip


def _why_failed(run: _Run) -> str:
    """The table of failure groups (:meth:`_Run._read_failures`), the latest first, as
    the dashboard's "Why tasks fail" shows them: how many failed tries (tasks, for
    those not run), the category, cause and outcome, the latest key and its worker, its
    error and, collapsed, its traceback."""
    from actors.scheduler_records import NOT_RUN

    e = html.escape
    head = f"<h2>{e(FAILURES_TITLE)}</h2>"
    if not run.why_failed:
        return head + "<p>No task failed.</p>"
    shown = len(run.why_failed)
    note = (
        f"the {shown} most recent of {run.failure_groups} groups; "
        if run.failure_groups > shown else ""
    )  # fmt: skip
    rows = []
    for cat, cause, outcome, n, key, worker, error, trace, tasks, erred in run.why_failed:
        count = f"{n} task{'s' if n != 1 else ''}" if outcome == NOT_RUN else f"{n} x"
        tb = (
            f"<details><summary>traceback</summary><pre class=tb>{e(trace)}</pre></details>"
            if trace else ""
        )  # fmt: skip
        rows.append(
            f"<tr class=failure data-category='{e(cat)}' data-cause='{e(cause)}' "
            f"data-outcome='{e(outcome)}'><td class=count>{e(count)}</td><td>{tasks}</td>"
            f"<td>{erred}</td><td>{e(cat)}</td>"
            f"<td>{e(cause)} ({e(outcome)})</td><td>{e(key)}</td><td>{e(worker)}</td>"
            f"<td><div class=err>{e(error)}</div>{tb}</td></tr>"
        )
    return (
        f"{head}<p>{e(note)}failed tries grouped by category and cause, as the live "
        "dashboard groups them, the group whose latest failure is the most recent first, "
        "with the tasks those tries were of and how many of those tasks erred in the end "
        "(the others finished after a retry, or were not done); tasks that erred without "
        "a failed try of their own (a dependency failed) are counted in tasks, outcome "
        "not-run.</p><table class=failures><tr><th>failed</th><th>tasks</th><th>erred</th>"
        "<th>category</th><th>cause (outcome)</th><th>latest key</th><th>worker</th>"
        "<th>error</th></tr>" + "".join(rows) + "</table>"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { margin-bottom: 0.2em; }
.tables { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
table { border-collapse: collapse; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f5f5f5; font-weight: 600; }
.err { font-family: ui-monospace, monospace; color: #b00; white-space: pre-wrap;
       word-break: break-word; }
pre.tb { white-space: pre-wrap; word-break: break-word; font-size: 12px; max-height: 300px;
         overflow: auto; background: #fafafa; border: 1px solid #ddd; padding: 6px; }
"""


def _storage(run: _Run) -> go.Figure:
    """Bytes on each worker's disk over time; below, the bytes copied between workers
    so far per kind, and each recovery as a marker (its key and worker on hover)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("bytes on disk", "transfers and recoveries"))  # fmt: skip
    for worker, line in sorted(run.disk.items()):
        fig.add_trace(go.Scatter(x=line.xs, y=line.ys, mode="lines", line_shape="hv",
                                 name=f"disk {worker}"), row=1, col=1)  # fmt: skip
    for kind, line in sorted(run.copied.items()):
        fig.add_trace(go.Scatter(x=line.xs, y=line.ys, mode="lines", line_shape="hv",
                                 name=f"copied MiB: {kind}"), row=2, col=1)  # fmt: skip
    for how, symbol in (("recomputed", "x"), ("replica", "circle-open")):
        rs = [r for r in run.recoveries if r[3] == how]
        if rs:
            fig.add_trace(go.Scatter(
                x=[r[0] - run.t0 for r in rs], y=[0.0] * len(rs), mode="markers",
                marker={"symbol": symbol, "size": 10}, name=f"recovered: {how}",
                text=[f"{r[1]} (lost with {r[2]})" for r in rs],
            ), row=2, col=1)  # fmt: skip
    fig.update_yaxes(title="MiB", row=1, col=1)
    fig.update_yaxes(title="MiB copied", row=2, col=1)
    _time_axis(fig, run, row=2, col=1)
    _alert_bands(fig, run)
    return _layout(fig, SECTIONS[6], height=560)


def _tasks_span(conn: sqlite3.Connection, rid: tuple[str]) -> str:
    """When the run's tasks were submitted and finished, as an error says it."""
    first, last = conn.execute(
        "SELECT MIN(submitted), MAX(COALESCE(finished, submitted)) FROM tasks WHERE run_id = ?",
        rid,
    ).fetchone()
    if first is None:
        return "no task"
    return f"its tasks from {_utc(first)} to {_utc(last)}"


def _read_run(
    db: str | os.PathLike[str],
    run_id: str | None,
    since: str | None,
    until: str | None,
    progress: Progress,
    also: Callable[[sqlite3.Connection, _Run], list[tuple[Any, ...]]] | None = None,
) -> tuple[_Run, list[tuple[Any, ...]]]:
    """The run of ``db`` a report is of (see :func:`build_report`), and what ``also``
    reads of it on the same connection (empty without)."""
    conn = open_db(db)
    try:
        try:
            run = _Run(conn, run_id, progress, since, until)
        except MonitoringDBError as exc:
            raise type(exc)(str(db), exc.problem) from None
        return run, also(conn, run) if also is not None else []
    finally:
        conn.close()


def _title(run: _Run) -> str:
    """A report's title: the run, and its window."""
    title = f"Corral run {run.id}"
    if run.window is not None:
        title += f", {_utc(run.window[0])} to {_utc(run.window[1])} UTC"
    return title


def _text_report(db: str | os.PathLike[str], run: _Run, categories: list[tuple[Any, ...]]) -> str:
    """The report of ``run`` (of ``db``) as plain text (``report --text``): the
    summary's tables, then the durations of the successful tries per category
    (:func:`_category_durations`). No plot."""
    head = _summary_head(run)
    width = max(len(k) for k, _ in head)
    parts = [f"{_title(run)} (from {db})", "\n".join(f"{k.ljust(width)}  {v}" for k, v in head)]
    parts += [
        h[0] if cls == _NOTE else _text_table(h, rows) for h, rows, cls in _summary_tables(run)
    ]
    shown = categories[:MAX_TEXT_CATEGORIES]
    note = (
        f" (the {MAX_TEXT_CATEGORIES} with the most time)" if len(categories) > len(shown) else ""
    )
    parts.append(
        _text_table(
            (f"durations of successful tries{note}: category", "tries ok", "mean s", "p95 s",
             "max s", "total h", "failed tries"), shown,
        )
    )  # fmt: skip
    return "\n\n".join(parts) + "\n"


def build_report(
    db: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    since: str | None = None,
    until: str | None = None,
    progress: Progress = _quiet,
    text: bool = False,
) -> str:
    """The report of ``db`` as one HTML document: of its latest run, or ``run_id``, or
    the one run recorded between ``since`` and ``until``; of the whole run, or of what
    overlaps that window (``--since``/``--until``: a UTC date and time, Unix seconds,
    or ``+DURATION`` from the run's start). :class:`ReportRunError` when it names no
    run, several, or nothing. ``text``: as plain text instead (``report --text``), its
    summary and the durations per category, no plot."""
    if text:
        return _text_report(db, *_read_run(db, run_id, since, until, progress, _category_durations))
    run, _ = _read_run(db, run_id, since, until, progress)
    parts = []
    first = True
    for make in (_timeline, _queues, _fleet, _memory, _cdf, _alerts_figure, _storage):
        progress(f"plotting: {make.__name__.strip('_')}")
        fig = make(run)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first,
                                 config={"displaylogo": False}))  # fmt: skip
        if make is _alerts_figure:
            parts.append(_actions_table(run))
            parts.append(_policies_table(run))
        first = False
    title = _title(run)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p>From {html.escape(str(db))}. Times are seconds since the run started; shaded: "
        "alerts pending (orange) and firing (red).</p>"
        + _summary(run) + _why_failed(run) + _why_free(run) + "".join(parts) + "</body></html>"
    )  # fmt: skip


#: the first bytes of an SQLite write-ahead log (``-wal``), either byte order
_WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")


def _temp_name(target: Path) -> Path:
    return target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"


def _output(db: str | os.PathLike[str], out: str | os.PathLike[str]) -> tuple[Path, bool]:
    """Where the report of ``db`` goes for ``-o out``: the file (symlinks followed) and
    whether it is written in place (an existing file that is not a regular one, such
    as ``/dev/stdout``) rather than made beside it and renamed over it. Raises
    :class:`ReportOutputError` for a directory, a directory that is missing or cannot
    be written in, the database itself (or its ``-wal``, ``-shm``, ``-journal``), any
    other SQLite database or log, and a file this user may not write."""
    given = str(out)
    # A special file as given (/dev/stdout, a pipe, a terminal; its link resolves to
    # /proc/PID/fd/pipe:[N], which is no path): written in place, through the path
    # given, as a shell redirection (>>) of /dev/stdout to a file expects too.
    with contextlib.suppress(OSError):
        mode = os.stat(out).st_mode
        if given.startswith(("/dev/", "/proc/")) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return Path(given), True
    target = Path(os.path.realpath(out))

    def refuse(problem: str) -> ReportOutputError:
        return ReportOutputError(given, problem)

    if target.is_dir():
        raise refuse(f"a directory: give -o a file in it, e.g. -o {Path(out) / 'report.html'}")
    base = os.path.realpath(db)
    for part in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            if str(target) == base + part or os.path.samefile(target, f"{db}{part}"):
                raise refuse(
                    f"it is the {f'{part} file of the ' if part else ''}monitoring database "
                    "being reported, which the report would replace (the run's record lost): "
                    "give -o another path, e.g. -o report.html"
                )
    if target.exists():
        try:
            with target.open("rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise refuse(
                f"it exists and cannot be read to see what it is ({exc.strerror or exc}): "
                "give -o another path"
            ) from exc
        if head.startswith(SQLITE_HEADER) or head[:4] in _WAL_MAGIC:
            what = "an SQLite database" if head.startswith(SQLITE_HEADER) else "an SQLite log"
            raise refuse(
                f"{what} (a monitoring database?), which the report would replace: give -o "
                "another path, e.g. -o report.html, or delete the file first if it should go"
            )
        if not os.access(target, os.W_OK):
            raise refuse("it exists and this user may not write it: give -o another path")
    parent = target.parent
    if not parent.is_dir():
        raise refuse(
            f"no directory {parent}: make it first (mkdir -p {parent}) or give -o a path in "
            "a directory that exists"
        )
    probe = _temp_name(target)  # a file made and removed: can one be made there at all?
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise refuse(
            f"cannot write in {parent} ({exc.strerror or exc}): give -o a path in a directory "
            "you can write"
        ) from exc
    return target, False


#: -o paths that are this process's standard output or error: written to the stream
_STD_STREAMS = {
    "/dev/stdout": "stdout", "/dev/fd/1": "stdout", "/proc/self/fd/1": "stdout",
    "/dev/stderr": "stderr", "/dev/fd/2": "stderr", "/proc/self/fd/2": "stderr",
}  # fmt: skip


def _write(given: str | os.PathLike[str], target: Path, in_place: bool, text: str) -> None:
    """``text`` into ``target``: into a new file beside it, then renamed over it (a
    failure or a kill leaves ``target`` as it was, never half a report), keeping the
    permissions of the file it replaces, 0600 for a new file (the database's, whose
    keys, errors and tracebacks it shows); in place when ``in_place``."""
    data = text.encode("utf-8")
    if in_place:
        try:
            stream = _STD_STREAMS.get(str(given))
            if stream is not None:  # this process's own stdout or stderr, as it is open
                out = getattr(sys, stream).buffer  # (reopened, a file it goes to would be
                out.write(data)  # truncated: a `>>` redirection appends)
                out.flush()
                return
            with target.open("wb") as f:
                f.write(data)
        except OSError as exc:
            raise ReportOutputError(str(given), f"cannot write it ({exc})") from exc
        return
    tmp = _temp_name(target)
    try:
        # 0600, as the database it comes from (its keys, errors and tracebacks)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ReportOutputError(
                str(given), f"cannot write it ({exc.strerror or exc}): give -o another path"
            ) from exc
        raise


#: the text report's table of durations shows at most this many categories (the most
#: time first)
MAX_TEXT_CATEGORIES = 50


def _category_durations(conn: sqlite3.Connection, run: _Run) -> list[tuple[Any, ...]]:
    """Per category (in the run, or its window), the most time first: its successful
    tries, their mean, 95th percentile (nearest rank), longest and total (hours)
    durations, and its failed tries (as the summary counts them); at most
    :data:`MAX_TEXT_CATEGORIES` + 1 rows."""
    during = run._during(*_TRY_SPAN)
    cat = "COALESCE(NULLIF(category, ''), '?')"
    ok = conn.execute(
        f"WITH ok AS (SELECT {cat} AS cat, MAX(ended - started, 0.0) AS d FROM tries WHERE "
        f"run_id = ?{during} AND outcome = 'ok' AND started IS NOT NULL AND ended IS NOT "
        "NULL), ranked AS (SELECT cat, d, ROW_NUMBER() OVER (PARTITION BY cat ORDER BY d) AS "
        "i, COUNT(*) OVER (PARTITION BY cat) AS n FROM ok) SELECT cat, n, AVG(d), MAX(CASE "
        "WHEN i = (95 * n + 99) / 100 THEN d END), MAX(d), SUM(d) FROM ranked GROUP BY cat, n "
        "ORDER BY SUM(d) DESC, cat LIMIT ?", (run.id, MAX_TEXT_CATEGORIES + 1),
    ).fetchall()  # fmt: skip
    failed = dict(conn.execute(
        f"SELECT {cat}, COUNT(*) FROM tries WHERE run_id = ?{during} AND outcome NOT IN "
        f"('ok', 'cancelled') AND NOT {_free_lost(conn)} GROUP BY 1", (run.id,),
    ).fetchall())  # fmt: skip
    rows: list[tuple[Any, ...]] = [
        (c, n, f"{mean:.3f}", f"{p95:.3f}", f"{most:.3f}", _hours(total), failed.pop(c, 0))
        for c, n, mean, p95, most, total in ok
    ]
    if len(rows) <= MAX_TEXT_CATEGORIES:  # those whose every try failed
        rows += [(c, 0, "-", "-", "-", "0", n) for c, n in sorted(failed.items())]
    return rows


def _text_table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A table of the text report: ``head``, then ``rows`` (or a line saying none),
    columns lined up."""
    lines = [head, *(tuple(str(v) for v in r) for r in rows)]
    widths = [max(len(line[i]) for line in lines if i < len(line)) for i in range(len(head))]
    out = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)).rstrip()
        for line in lines
    ]
    return "\n".join(out if rows else [*out, "none"])


def write_report(
    db: str | os.PathLike[str],
    out: str | os.PathLike[str] = "report.html",
    *,
    run_id: str | None = None,
    since: str | None = None,
    until: str | None = None,
    progress: Progress = _quiet,
) -> Path:
    """Write the report of ``db`` to ``out``; return its path. ``out`` is checked
    before the report is built (:class:`ReportOutputError`: see :func:`_output`),
    and again before it is replaced, which is done at once (a new file renamed over
    it)."""
    _output(db, out)
    text = build_report(db, run_id=run_id, since=since, until=until, progress=progress)
    target, in_place = _output(db, out)  # again: it may have changed while reading
    _write(out, target, in_place, text)
    return Path(out)


@dataclass(frozen=True)
class RunListing:
    """A run of a monitoring database as ``report --list`` shows it: its id, what
    started it (``host``, ``pid``, ``command``: the command line of the manager or of
    the program that embedded the cluster), when (Unix seconds; ``ended`` None: still
    running, or it crashed, ``last_seen`` its latest write), its tasks, those that
    erred, its failed tries (every outcome but ``ok`` and ``cancelled``), workers and
    their time (:class:`WorkerTime`: ``alive``, core-seconds of their lives, and
    ``executing``, seconds of its tries' execution, over every pool)."""

    run_id: str
    host: str
    pid: int | None
    command: str
    started: float
    ended: float | None
    last_seen: float | None
    tasks: int
    erred: int
    failed_tries: int
    workers: int
    worker_time: WorkerTime = field(default_factory=WorkerTime)

    @property
    def duration(self) -> float:
        """Seconds from its start to its end, or to its latest write."""
        return (self.ended or self.last_seen or self.started) - self.started


def list_runs(db: str | os.PathLike[str]) -> list[RunListing]:
    """Every run of the monitoring database ``db``, the first started first."""
    conn = open_db(db)
    try:
        conn.execute("BEGIN")  # one snapshot: the counts agree with the runs
        runs = _runs(conn)
        tasks = {r: (n, erred) for r, n, erred in conn.execute(
            "SELECT run_id, COUNT(*), SUM(state = 'erred') FROM tasks GROUP BY run_id"
        )}  # fmt: skip
        failed = dict(conn.execute(
            "SELECT run_id, COUNT(*) FROM tries WHERE outcome NOT IN ('ok', 'cancelled') "
            f"AND NOT {_free_lost(conn)} GROUP BY run_id"
        ).fetchall())  # fmt: skip
        workers = dict(
            conn.execute("SELECT run_id, COUNT(DISTINCT worker) FROM workers GROUP BY run_id")
        )
        times, _ = _worker_time(conn)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    listed = []
    for r in runs:
        n, erred = tasks.get(r["run_id"], (0, 0))
        one = RunListing(
            run_id=r["run_id"], host=r["host"] or "", pid=r["pid"], command=_command(r["argv"]),
            started=r["started"], ended=r["ended"], last_seen=r["last_seen"], tasks=n,
            erred=erred or 0, failed_tries=failed.get(r["run_id"], 0),
            workers=workers.get(r["run_id"], 0),
            worker_time=WorkerTime(
                sum(t.alive for t in times.get(r["run_id"], {}).values()),
                sum(t.executing for t in times.get(r["run_id"], {}).values()),
                sum(t.failed for t in times.get(r["run_id"], {}).values()),
            ),
        )  # fmt: skip
        listed.append(one)
    return listed


def _command(argv: str | None) -> str:
    """A run's command line (``runs.argv``, JSON) as a shell would take it."""
    try:
        words = json.loads(argv or "[]")
    except ValueError:
        return str(argv)
    if not isinstance(words, list):
        return str(argv)
    return shlex.join(str(w) for w in words)


def format_runs(runs: list[RunListing]) -> str:
    """The table ``report --list`` prints: a line per run, times in UTC."""
    head = ("run", "started (UTC)", "ended (UTC)", "duration", "tasks", "erred",
            "failed tries", "workers", "core-h alive", "busy", "host/pid", "command")  # fmt: skip
    lines = [head]
    for r in runs:
        end = _utc(r.ended) if r.ended else "- (running or crashed)"
        busy = r.worker_time.busy
        lines.append((
            r.run_id, _utc(r.started), end, f"{r.duration:.1f} s", str(r.tasks), str(r.erred),
            str(r.failed_tries), str(r.workers), _hours(r.worker_time.alive),
            "-" if busy is None else f"{busy:.0%}", f"{r.host}/{r.pid}", r.command,
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    table = "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1]
        for line in lines
    )
    if not runs:
        table += "\n(no run yet: a manager or cluster writes its run's first rows within seconds)"
    return table
