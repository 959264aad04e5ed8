"""The report of a monitoring database: one HTML file with interactive plots.

What lives here: :func:`write_report` (``python -m runtime report RUN.db -o
report.html``) and :func:`build_report` (the HTML as text). The file is self-contained:
plotly's JavaScript is embedded once (``include_plotlyjs=True``), nothing is fetched,
so it opens offline. Each plot is in :data:`SECTIONS`, by title; docs/monitoring.md
says what each shows.

The numbers come from the database only (:func:`runtime.monitordb.open_db`): tries for
the timeline and the durations, the metric samples for the queues, the workers and
blocks tables for the fleet, the resource samples for memory and disk, the transfers
and recoveries tables for storage, the alerts table for the bands drawn over the time
plots.
"""

from __future__ import annotations

import html
import json
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from policies import ON_PURPOSE
from runtime.errors import MonitoringDBError
from runtime.monitordb import open_db

__all__ = ["MAX_BARS", "SECTIONS", "build_report", "write_report"]

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
#: points drawn per line at most: a longer series keeps each stretch's lowest and
#: highest value (peaks stay), a duration CDF evenly spaced quantiles
MAX_POINTS = 2_000
#: points drawn per plot of one line per worker at most (200 workers: 500 each)
FIGURE_POINTS = 100_000

_OUTCOME_COLOR = {"error": "#d62728", "oom": "#9467bd", "timeout": "#8c564b",
                  "worker-lost": "#000000"}  # fmt: skip
_ALERT_COLOR = {"firing": "rgba(214,39,40,0.15)", "pending": "rgba(255,165,0,0.12)"}

Progress = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


class _Run:
    """The rows of one run, times in seconds from its start."""

    def __init__(self, conn: sqlite3.Connection, run_id: str | None, progress: Progress) -> None:
        q = conn.execute
        if run_id is None:
            row = q("SELECT * FROM runs ORDER BY started DESC LIMIT 1").fetchone()
        else:
            row = q("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r[0] for r in q("SELECT run_id FROM runs ORDER BY started")]
            raise MonitoringDBError(
                "",
                f"no run {run_id!r} in it (runs: {', '.join(known) or 'none'})"
                if run_id
                else "it holds no run yet; the manager writes its first rows within seconds",
            )
        cols = [d[0] for d in q("SELECT * FROM runs LIMIT 0").description]
        self.info = dict(zip(cols, row, strict=True))
        self.id: str = self.info["run_id"]
        self.t0: float = self.info["started"]
        self.end: float = (self.info["ended"] or self.info["last_seen"] or self.t0) - self.t0
        rid = (self.id,)

        def rows(sql: str, what: str) -> list[tuple[Any, ...]]:
            t = time.monotonic()
            out = q(sql, rid).fetchall()
            progress(f"read {len(out)} {what} ({time.monotonic() - t:.1f} s)")
            return out

        self.tasks = rows(
            "SELECT key, category, pool, submitted, ready, started, finished, state, tries "
            "FROM tasks WHERE run_id = ?", "tasks",
        )  # fmt: skip
        self.tries = rows(
            "SELECT key, try, category, worker, sent, started, ended, outcome, cause, "
            "error_type FROM tries WHERE run_id = ? ORDER BY ended", "tries",
        )  # fmt: skip
        self.workers = rows(
            "SELECT worker, pool, block, joined, left, cause FROM workers WHERE run_id = ?",
            "workers",
        )
        self.blocks = rows(
            "SELECT block, pool, state, time, cause FROM blocks WHERE run_id = ? ORDER BY time",
            "block changes",
        )
        self.resources = rows(
            "SELECT time, worker, rss FROM resource_samples WHERE run_id = ? ORDER BY time",
            "resource samples",
        )
        self.disks = rows(
            "SELECT time, worker, spilled_bytes FROM resource_samples WHERE run_id = ? "
            "AND spilled_bytes IS NOT NULL ORDER BY time", "disk samples",
        )  # fmt: skip
        self.transfers = rows(
            "SELECT time, key, kind, bytes, source, target FROM transfers WHERE run_id = ? "
            "ORDER BY time", "transfers",
        )  # fmt: skip
        self.recoveries = rows(
            "SELECT time, key, worker, how FROM recoveries WHERE run_id = ? ORDER BY time",
            "recoveries",
        )
        self.metrics = rows(
            "SELECT time, name, labels, value FROM metric_samples WHERE run_id = ? AND name IN "
            "('corral_queue_depth', 'corral_queue_oldest_wait_seconds') ORDER BY time",
            "queue samples",
        )
        self.alerts = rows(
            "SELECT time, name, state, labels, value, active_since, fired_at, resolved_at "
            "FROM alerts WHERE run_id = ? ORDER BY time",
            "alert changes",
        )
        self.gaps = q("SELECT COALESCE(SUM(lost), 0) FROM gaps WHERE run_id = ?", rid).fetchone()[0]

    def t(self, at: float | None) -> float | None:
        return None if at is None else at - self.t0


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=title, height=height, template="plotly_white",
        margin={"l": 70, "r": 20, "t": 60, "b": 50}, legend={"orientation": "h", "y": -0.15},
    )  # fmt: skip
    return fig


def _over_time(fig: go.Figure, run: _Run, y: str, title: str) -> go.Figure:
    """A plot over the run's time: axes titled, alerts drawn, laid out."""
    fig.update_xaxes(title="seconds since the run started")
    fig.update_yaxes(title=y)
    _alert_bands(fig, run)
    return _layout(fig, title)


def _alert_bands(fig: go.Figure, run: _Run) -> None:
    """Firing (red) and pending (orange) spans of each alert, over the time plots."""
    for start, stop, state, name in _alert_spans(run):
        fig.add_vrect(
            x0=start, x1=stop, fillcolor=_ALERT_COLOR[state], line_width=0, layer="below",
            annotation_text=f"{name} {state}" if state == "firing" else None,
            annotation_position="top left",
        )  # fmt: skip


def _alert_spans(run: _Run) -> list[tuple[float, float, str, str]]:
    """(start, stop, state, name): pending then firing spans, from the state changes."""
    spans = []
    by_alert: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    for row in run.alerts:
        by_alert[(row[1], row[3])].append(row)
    for (name, _), changes in by_alert.items():
        for i, (at, _, state, *_rest) in enumerate(changes):
            if state not in _ALERT_COLOR:
                continue
            nxt = changes[i + 1][0] if i + 1 < len(changes) else run.t0 + run.end
            spans.append((at - run.t0, nxt - run.t0, state, name))
    return spans


def _timeline(run: _Run) -> go.Figure:
    tries = [r for r in run.tries if r[6] is not None][-MAX_BARS:]
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
                customdata=[[r[0], r[1], r[7], r[8] or r[9] or ""] for r in rs],
                hovertemplate="%{customdata[0]} try %{customdata[1]}<br>%{customdata[2]} "
                "%{customdata[3]}<br>from %{base:.2f} s for %{x:.3f} s<extra></extra>",
                **style,
            )
        )  # fmt: skip

    for cat in sorted(by_cat):
        bars(by_cat[cat], cat)
    for outcome in sorted({r[7] for r in failed}):
        color = _OUTCOME_COLOR.get(outcome, "#d62728")
        bars([r for r in failed if r[7] == outcome], f"failed: {outcome}",
             marker={"color": color, "pattern": {"shape": "x"}})  # fmt: skip
    fig.update_layout(barmode="overlay", bargap=0.3)
    fig.update_xaxes(title="seconds since the run started")
    fig.update_yaxes(title="worker", categoryorder="category ascending")
    _alert_bands(fig, run)
    n_workers = len({r[3] for r in tries})
    title = SECTIONS[0]
    if len(run.tries) > len(tries):
        title += f" (the latest {len(tries)} of {len(run.tries)} tries)"
    return _layout(fig, title, height=max(300, min(1200, 120 + 22 * n_workers)))


def _queues(run: _Run) -> go.Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("ready tasks", "oldest wait (s)"))  # fmt: skip
    series: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for at, name, labels, value in run.metrics:
        pool = json.loads(labels).get("pool", "?")
        xs, ys = series[(name, pool)]
        xs.append(at - run.t0)
        ys.append(value)
    for (name, pool), (xs, ys) in sorted(series.items()):
        xs, ys = _thin(xs, ys)
        row = 1 if name == "corral_queue_depth" else 2
        label = "any pool" if pool == "*" else pool
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name=f"{label}",
                       legendgroup=pool, showlegend=row == 1),
            row=row, col=1,
        )  # fmt: skip
    fig.update_xaxes(title="seconds since the run started", row=2, col=1)
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
        if state not in ("pending", "running", "requested", "held"):
            continue  # ends: a block that ended is no longer counted
        xs, ys = _steps(changes, run.end)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv",
                                 line={"dash": "dot"}, name=f"blocks {pool} {state}"))  # fmt: skip
    return _over_time(fig, run, "count", SECTIONS[2])


def _memory(run: _Run) -> go.Figure:
    fig = go.Figure()
    per: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for at, worker, rss in run.resources:
        if not rss:
            continue  # not reported yet
        xs, ys = per[worker]
        xs.append(at - run.t0)
        ys.append((rss or 0) / 2**20)
    most = _per_line(len(per))
    for worker, (xs, ys) in sorted(per.items()):
        xs, ys = _thin(xs, ys, most)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=worker))
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
    n = len(xs)
    if n <= most:
        return xs, ys
    stretches = max(most // 2, 1)
    out_x: list[float] = []
    out_y: list[float] = []
    for k in range(stretches):
        lo, hi = k * n // stretches, (k + 1) * n // stretches
        if lo >= hi:
            continue
        part = range(lo, hi)
        low = min(part, key=ys.__getitem__)
        high = max(part, key=ys.__getitem__)
        for i in sorted({low, high}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


def _cdf(run: _Run) -> go.Figure:
    fig = go.Figure()
    per: dict[str, list[float]] = defaultdict(list)
    for r in run.tries:
        if r[7] == "ok" and r[5] is not None and r[6] is not None:
            per[r[2] or "?"].append(max(r[6] - r[5], 0.0))
    for cat, ds in sorted(per.items()):
        ds.sort()
        n = len(ds)
        at = (
            range(n)
            if n <= MAX_POINTS
            else sorted({k * (n - 1) // (MAX_POINTS - 1) for k in range(MAX_POINTS)})
        )  # evenly spaced quantiles, the first and the last among them
        fig.add_trace(go.Scatter(x=[ds[i] for i in at], y=[(i + 1) / n for i in at],
                                 mode="lines+markers" if n < 5 else "lines",
                                 line_shape="hv", name=f"{cat} ({n})"))  # fmt: skip
    fig.update_xaxes(title="duration of a successful try (s)", type="log")
    fig.update_yaxes(title="fraction of tries", range=[0, 1.02])
    return _layout(fig, SECTIONS[4])


def _alerts_figure(run: _Run) -> go.Figure:
    fig = go.Figure()
    spans = _alert_spans(run)
    for start, stop, state, name in spans:
        fig.add_trace(go.Scatter(
            x=[start, stop], y=[name, name], mode="lines+markers", name=f"{name} {state}",
            line={"width": 12, "color": "#d62728" if state == "firing" else "orange"},
            showlegend=False, hovertemplate=f"{name} {state}<br>%{{x:.1f}} s<extra></extra>",
        ))  # fmt: skip
    resolved = [(r[0] - run.t0, r[1]) for r in run.alerts if r[2] == "resolved"]
    if resolved:
        fig.add_trace(go.Scatter(x=[t for t, _ in resolved], y=[n for _, n in resolved],
                                 mode="markers", marker={"symbol": "x", "size": 10,
                                 "color": "green"}, name="resolved"))  # fmt: skip
    fig.update_xaxes(title="seconds since the run started", range=[0, max(run.end, 1.0)])
    title = SECTIONS[5] + ("" if spans or resolved else " (none in this run)")
    return _layout(fig, title, height=260 + 30 * len({s[3] for s in spans}))


def _summary(run: _Run) -> str:
    states: dict[str, int] = defaultdict(int)
    for t in run.tasks:
        states[t[7] or "?"] += 1
    failures: dict[tuple[str, str], int] = defaultdict(int)
    for r in run.tries:
        if r[7] != "ok":
            failures[(r[7], r[8] or r[9] or "")] += 1
    starts = [t[3] for t in run.tasks if t[3] is not None]
    ends = [t[6] for t in run.tasks if t[6] is not None]
    makespan = max(ends) - min(starts) if starts and ends else 0.0
    waits = sorted(t[5] - t[4] for t in run.tasks if t[4] is not None and t[5] is not None)
    # Lost unasked: left for any reason but on purpose (drained, walltime, shutdown).
    lost = sum(1 for w in run.workers if w[5] is not None and w[5] not in ON_PURPOSE)

    def row(k: str, v: Any) -> str:
        return f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"

    info = run.info
    head = [
        row("run", run.id),
        row("host / pid", f"{info['host']} / {info['pid']}"),
        row("started (UTC)", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.t0))),
        row("recorded for", f"{run.end:.1f} s" + ("" if info["ended"] else " (still running, or "
            "it stopped without closing the database)")),
        row("tasks", len(run.tasks)),
        *(row(f"tasks {s}", n) for s, n in sorted(states.items())),
        row("tries", len(run.tries)),
        row("makespan (first submitted to last finished)", f"{makespan:.2f} s"),
        row("median wait ready to running", f"{waits[len(waits) // 2]:.3f} s" if waits else "-"),
        row("workers (lost unasked)", f"{len(run.workers)} ({lost})"),
        row("blocks", len({b[0] for b in run.blocks})),
        row("monitoring: feed events lost, rows dropped", f"{run.gaps}, {info['dropped_rows']}"),
    ]  # fmt: skip
    fail = (
        "".join(
            f"<tr><td>{html.escape(o)}</td><td>{html.escape(c)}</td><td>{n}</td></tr>"
            for (o, c), n in sorted(failures.items(), key=lambda kv: -kv[1])
        )
        or "<tr><td colspan=3>none</td></tr>"
    )
    return (
        "<h2>Summary</h2><div class=tables><table>" + "".join(head) + "</table>"
        "<table><tr><th>failed tries: outcome</th><th>cause</th><th>n</th></tr>"
        + fail + "</table></div>"
    )  # fmt: skip


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { margin-bottom: 0.2em; }
.tables { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
table { border-collapse: collapse; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f5f5f5; font-weight: 600; }
"""


def _storage(run: _Run) -> go.Figure:
    """Bytes on each worker's disk over time; below, the bytes copied between workers
    so far per kind, and each recovery as a marker (its key and worker on hover)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("bytes on disk", "transfers and recoveries"))  # fmt: skip
    per: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for at, worker, used in run.disks:
        xs, ys = per[worker]
        xs.append(at - run.t0)
        ys.append(used / 2**20)
    most = _per_line(len(per))
    for worker, (xs, ys) in sorted(per.items()):
        xs, ys = _thin(xs, ys, most)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"disk {worker}"), row=1, col=1)
    kinds: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for at, _, kind, nbytes, _, _ in run.transfers:
        xs, ys = kinds[kind]
        xs.append(at - run.t0)
        ys.append((ys[-1] if ys else 0.0) + nbytes / 2**20)
    for kind, (xs, ys) in sorted(kinds.items()):
        xs, ys = _thin(xs, ys)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv",
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
    fig.update_xaxes(title="seconds since the run started", row=2, col=1)
    _alert_bands(fig, run)
    return _layout(fig, SECTIONS[6], height=560)


def build_report(
    db: str | os.PathLike[str], *, run_id: str | None = None, progress: Progress = _quiet
) -> str:
    """The report of ``db`` (its latest run, or ``run_id``) as one HTML document."""
    conn = open_db(db)
    try:
        try:
            run = _Run(conn, run_id, progress)
        except MonitoringDBError as exc:
            raise MonitoringDBError(str(db), exc.problem) from None
    finally:
        conn.close()
    parts = []
    first = True
    for make in (_timeline, _queues, _fleet, _memory, _cdf, _alerts_figure, _storage):
        progress(f"plotting: {make.__name__.strip('_')}")
        fig = make(run)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first,
                                 config={"displaylogo": False}))  # fmt: skip
        first = False
    title = f"Corral run {run.id}"
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p>From {html.escape(str(db))}. Times are seconds since the run started; shaded: "
        "alerts pending (orange) and firing (red).</p>"
        + _summary(run) + "".join(parts) + "</body></html>"
    )  # fmt: skip


def write_report(
    db: str | os.PathLike[str],
    out: str | os.PathLike[str] = "report.html",
    *,
    run_id: str | None = None,
    progress: Progress = _quiet,
) -> Path:
    """Write the report of ``db`` to ``out``; return its path."""
    text = build_report(db, run_id=run_id, progress=progress)
    path = Path(out)
    path.write_text(text, encoding="utf-8")
    return path
