"""The live dashboard of a manager: one self-contained HTML page (``GET /``) fed over a
websocket (``GET /dashboard/ws``) with a JSON snapshot every second, and a read-only
story page per task (``GET /dashboard/story?key=...``).

Served by the manager's own listener (its ``web_routes``, see ``transport/ws.py``) to
the read and admin tokens. A browser cannot send an Authorization header, so the
printed URL carries the read token once (``/?token=...``); the listener moves it into
an HttpOnly, SameSite=Lax cookie and sends the browser back to ``/`` without it
(docs/monitoring.md, "Live dashboard").

One :class:`DashboardFeed` per manager builds the snapshot at most once per interval,
from the same answers as ``/metrics`` (:class:`MetricsReply`), the status
(:class:`StatusReply`) and the alerts (:class:`AlertsReply`), and sends the same text to
every page that is open; with no page open it asks the scheduler for the queue depth
only (its counters, once per interval), so that it always holds the last two minutes of
the queue depth (:attr:`DashboardFeed.depths`), which a page gets when it connects.
:func:`build_snapshot` is a plain function of those three answers.
"""

from __future__ import annotations

import contextlib
import html
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
from aiohttp import WSMsgType, web

from actors.scheduler_records import DEPENDENCY_FAILED, NOT_RUN
from policies import values_text
from runtime.errors import ActorStopped, AskTimeout
from runtime.messages import (
    ANY_POOL,
    AlertsReply,
    FailureGroupInfo,
    MetricsReply,
    StatusReply,
    WorkerDiskMetrics,
    WorkerMemoryReport,
)
from runtime.metrics import READ_ROLES

__all__ = [
    "DASHBOARD_PATH",
    "FEED_PATH",
    "STORY_PATH",
    "DashboardFeed",
    "Sources",
    "build_snapshot",
    "dashboard_routes",
    "dashboard_url",
]

DASHBOARD_PATH = "/"  #: the page
FEED_PATH = "/dashboard/ws"  #: its live feed (a websocket)
STORY_PATH = "/dashboard/story"  #: a task's story (``?key=...``)
INTERVAL = 1.0  #: seconds between snapshots
SEND_TIMEOUT = 5.0  #: a page that takes longer to take a snapshot is closed
MAX_STREAM = 300  #: tries in the task stream
MAX_AUDIT = 20  #: latest audit lines of the alert monitor shown
HISTORY = 120.0  #: seconds of queue depth samples the feed keeps for the page's line
MAX_DEPTHS = 1000  #: and at most this many samples, whatever the interval
#: dashboard pages open at once: each holds a connection (a file descriptor) of the
#: manager for as long as it is open, so a read-token holder opening a thousand ran a
#: manager under the usual 1024-file limit out of them (``accept``: Too many open
#: files). Past it a page is refused with 503 until one closes.
MAX_PAGES = 64
#: a failure group's fields sent to the open pages only when they changed since the
#: snapshot before (a new latest failure): its error and traceback, up to 8,000
#: characters each, were most of every message while nothing failed (245 KB a second
#: per page for 60 groups of deep tracebacks); the page keeps them
GROUP_TEXTS = ("error", "traceback")


def dashboard_url(address: str, token: str) -> str:
    """The URL to open: the manager's ``ws://host:port`` as ``http://host:port/?token=``
    (``token`` "": the page without one, which opens in a browser that opened the
    URL with its token once)."""
    parts = urlsplit(address)
    scheme = "https" if parts.scheme == "wss" else "http"
    query = f"?token={quote(token)}" if token else ""
    return f"{scheme}://{parts.netloc}{DASHBOARD_PATH}{query}"


# ----------------------------------------------------------------------------- snapshot


def _pool_label(name: str) -> str:
    """A pool's name on the page: ``*`` holds the tasks submitted without ``pool=``."""
    return "any pool (no pool=)" if name == ANY_POOL else name


def _worker(
    info: Any,
    running: int,
    report: WorkerMemoryReport | None,
    status: StatusReply,
    disk: WorkerDiskMetrics | None = None,
) -> dict[str, Any]:
    rss = report.rss if report is not None else status.rss.get(info.worker_id, 0)
    on_disk, files = (report.spilled_bytes, report.file_bytes) if report else (0, 0)
    return {
        "id": info.worker_id, "pool": info.pool, "cores": info.cores, "running": running,
        "host": info.host,  # its machine ("": an older worker, not told)
        "accelerator": info.accelerator,  # the device it is pinned to ("": none)
        "rss": rss, "limit": report.limit if report is not None else info.memory,
        "throttle_at": report.throttle_at if report is not None else 0,
        "memory_bytes": report.memory_bytes if report is not None else 0,
        "spilled_bytes": on_disk - files,  # spill files only
        "file_bytes": files,  # file outputs held
        "spilled_total": report.spilled_total if report is not None else 0,
        **_disk(info, report, disk),
        "throttled": info.worker_id in status.throttled,
        "draining": info.worker_id in status.draining,
    }  # fmt: skip


def _disk(
    info: Any, report: WorkerMemoryReport | None, disk: WorkerDiskMetrics | None
) -> dict[str, Any]:
    """A worker's disk as the page shows it: ``disk_used`` (every byte on it: outputs,
    checkpoint files, copies under way) and ``disk_limit`` (None: not counted, ``--disk
    off``). From the scheduler's figures (``disk``, the ``corral_worker_disk_*``
    metrics): a worker without ``--disk`` on a file system it shares with others has
    its share, as placement counts it, not the whole file system its report measures.
    Without those, from its report (used plus free); before its first report, its
    ``--disk`` and nothing used."""
    if disk is not None:
        limit = disk.disk or (None if disk.free is None else disk.used + disk.free)
        return {"disk_used": disk.used, "disk_free": disk.free, "disk_limit": limit}
    if report is None:
        return {"disk_used": 0, "disk_free": info.disk or None, "disk_limit": info.disk or None}
    free = report.disk_free
    limit = None if free is None else report.disk_used + free
    return {"disk_used": report.disk_used, "disk_free": free, "disk_limit": limit}


def described(name: str, params: Mapping[str, Any] | None) -> str:
    """A policy as the page shows it: its name, and the parameters it was given (their
    values, ``policies.param_values``)."""
    return f"{name} ({values_text(params)})" if params else name


def build_snapshot(
    metrics: MetricsReply, status: StatusReply, alerts: AlertsReply, now: float
) -> dict[str, Any]:
    """What the page shows, as JSON-ready data, from one answer of each kind (``now``:
    the wall-clock time of the snapshot)."""
    workers = [
        _worker(
            w,
            status.processing.get(w.worker_id, 0),
            status.memory.get(w.worker_id),
            status,
            metrics.disks.get(w.worker_id),
        )
        for w in sorted(status.workers, key=lambda w: (w.pool, w.worker_id))
    ]
    names = set(metrics.pools) | set(metrics.blocks) | {w["pool"] for w in workers}
    # ready tasks of no pool (submitted without pool=): counted once, in "*" ("any
    # pool"), as /metrics counts them; each pool's row says how many its workers may
    # take beside its own (the scale audit: a pool read "0 queued" over 27k of them)
    anywhere = metrics.pools[ANY_POOL].queue_depth if ANY_POOL in metrics.pools else 0
    pools = []
    for name in sorted(names, key=lambda n: (n == ANY_POOL, n)):
        m = metrics.pools.get(name)
        b = metrics.blocks.get(name)
        mine = [w for w in workers if w["pool"] == name]
        states = dict(b.states) if b is not None else {}
        q = m.wait_quantiles if m is not None else {}
        pools.append(
            {
                "name": name,
                "label": _pool_label(name),
                "queue_depth": m.queue_depth if m is not None else 0,
                "any_pool_queued": anywhere if name != ANY_POOL else 0,
                "held_back": m.held_back if m is not None else 0,
                "retry_held": m.retry_held if m is not None else 0,
                "oldest_wait": m.oldest_wait if m is not None else 0.0,
                "wait_p50": q.get("0.5"),
                "wait_p90": q.get("0.9"),
                "waits": m.waits if m is not None else 0,
                "running": m.running if m is not None else 0,
                "workers": dict(m.workers) if m is not None else {},
                "throttled": m.throttled if m is not None else 0,
                "disk_stalled": m.disk_stalled if m is not None else 0,
                "placement_stalled": m.placement_stalled if m is not None else 0,
                # /metrics' corral_cores and corral_cores_busy: the same numbers
                "cores": m.cores if m is not None else 0,
                "cores_busy": m.cores_busy if m is not None else 0,
                "memory_limit": sum(w["limit"] for w in mine),
                # the machines its workers run on (those that told theirs)
                "hosts": len({w["host"] for w in mine if w["host"]}),
                "rss": sum(w["rss"] for w in mine),
                "spilled_bytes": m.spilled_bytes if m is not None else 0,
                "blocks": states,
                "blocks_pending": sum(n for s, n in states.items() if s != "running"),
                "oldest_pending": b.oldest_pending if b is not None else 0.0,
                "target": b.target if b is not None else None,
                "desired": b.desired if b is not None else None,
            }
        )
    policies = {k: described(v, status.policy_params.get(k)) for k, v in status.policies.items()}
    if status.autoscaler is not None and status.autoscaler.policy:
        policies["scaling"] = described(status.autoscaler.policy, status.autoscaler.policy_params)
    stream = [t.to_fields() for t in metrics.recent_tries[-MAX_STREAM:]]
    return {
        "time": now,
        "tasks_by_state": dict(metrics.tasks_by_state),
        "tasks_created": metrics.tasks_created,
        "queue_depth": sum(p["queue_depth"] for p in pools),
        "pools": pools,
        "workers": workers,
        "stream": stream,
        "failures": [g.to_fields() for g in metrics.failure_groups],
        "failure_groups": metrics.failure_groups_total,
        "free": [g.to_fields() for g in metrics.free_groups],
        "free_groups": metrics.free_groups_total,
        "alerts": [a.to_fields() for a in alerts.alerts],
        "alert_rules": len(alerts.rules),
        "audit": list(alerts.audit[-MAX_AUDIT:]),
        "policies": policies,
        # the scheduler's policies' errors and the autoscaler's scaling policy's
        "policy_errors": status.policy_errors
        + (status.autoscaler.policy_errors if status.autoscaler is not None else 0),
        "autoscaler_busy": metrics.autoscaler_busy or status.autoscaler_busy,
        "warnings": list(status.warnings),
    }


# ----------------------------------------------------------------------------- the feed


@dataclass(frozen=True)
class Sources:
    """How the feed asks the manager: one coroutine function per answer."""

    metrics: Callable[[], Awaitable[MetricsReply]]
    status: Callable[[], Awaitable[StatusReply]]
    alerts: Callable[[], Awaitable[AlertsReply]]
    story: Callable[[str], Awaitable[list[list[str]]]]
    #: the total queue depth alone, asked once per interval while no page is open
    #: (None: the feed samples it only in the snapshots it builds)
    depth: Callable[[], Awaitable[int]] | None = None


class DashboardFeed:
    """Builds one snapshot per interval while some page is open and sends it to all of
    them: the cost does not grow with the pages (``builds`` counts snapshots built).
    While no page is open it asks only the queue depth (``sources.depth``), once per
    interval; either way it keeps the last :data:`HISTORY` seconds of the total queue
    depth (``depths``), which a page gets in its first snapshot (``depth_history``)."""

    def __init__(
        self,
        sources: Sources,
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.time,
        max_pages: int = MAX_PAGES,
    ) -> None:
        self.sources = sources
        self.max_pages = max_pages  #: pages open at once (:data:`MAX_PAGES`)
        self._opening = 0  #: pages whose websocket handshake is being answered
        self.interval = interval
        self.clock = clock
        self.pages: set[web.WebSocketResponse] = set()
        self.builds = 0
        self.errors = 0  #: snapshots that could not be built (the manager did not answer)
        self.latest: str | None = None  #: the latest snapshot as sent
        self._latest: dict[str, Any] | None = None  #: and as built
        self._fresh: set[web.WebSocketResponse] = set()  #: pages that have no snapshot yet
        #: the number of the latest try (``RecentTry.n``) the open pages were sent (None:
        #: none yet; the next snapshot goes whole)
        self._stream_upto: int | None = None
        #: each failure group's GROUP_TEXTS as the open pages were last sent them (None:
        #: none yet; the next snapshot goes whole)
        self._texts_sent: dict[str, tuple[str, ...]] | None = None
        #: (time, total queue depth) of the last HISTORY seconds, oldest first
        self.depths: deque[tuple[float, int]] = deque(maxlen=MAX_DEPTHS)
        self._opened = anyio.Event()

    async def snapshot(self) -> dict[str, Any]:
        """Ask the manager once for each answer and build the snapshot."""
        got: dict[str, Any] = {}

        async def one(name: str, ask: Callable[[], Awaitable[Any]]) -> None:
            got[name] = await ask()

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "metrics", self.sources.metrics)
            tg.start_soon(one, "status", self.sources.status)
            tg.start_soon(one, "alerts", self.sources.alerts)
        self.builds += 1
        snap = build_snapshot(got["metrics"], got["status"], got["alerts"], self.clock())
        snap["seq"] = self.builds  # the same number on every page: built once for all
        self.record_depth(snap["time"], snap["queue_depth"])
        return snap

    def _new_tries_only(self, snap: dict[str, Any]) -> dict[str, Any]:
        """``snap`` as the open pages get it: after the first, its ``stream`` holds only
        the tries that ended since the previous snapshot's (``stream_new``), which the
        page adds to those it keeps (the last :data:`MAX_STREAM`): the whole stream
        every second was 99% of each message, 48 KB/s per open page under load. A page
        that opens gets the whole stream (:meth:`_with_history`)."""
        stream = snap["stream"]
        upto = self._stream_upto
        if stream:
            self._stream_upto = stream[-1]["n"]
        if upto is None or (stream and stream[-1]["n"] < upto):  # (a scheduler anew)
            return snap
        return {**snap, "stream": [t for t in stream if t["n"] > upto], "stream_new": True}

    def _new_texts_only(self, snap: dict[str, Any]) -> dict[str, Any]:
        """``snap`` as the open pages get it: after the first, a failure group whose
        error and traceback (:data:`GROUP_TEXTS`) are those the previous snapshot had
        comes without them, marked ``same``; the page takes them from the one before.
        A page that opens gets them all (:meth:`_with_history`)."""

        def texts(group: dict[str, Any]) -> tuple[str, ...]:
            return tuple(group[f] for f in GROUP_TEXTS)

        def name(group: dict[str, Any]) -> str:
            return json.dumps([group["category"], group["cause"], group["outcome"]])

        sent = self._texts_sent
        self._texts_sent = {name(g): texts(g) for g in snap["failures"]}
        if sent is None:
            return snap
        failures = [
            {**{k: v for k, v in g.items() if k not in GROUP_TEXTS}, "same": True}
            if sent.get(name(g)) == texts(g)
            else g
            for g in snap["failures"]
        ]
        return {**snap, "failures": failures}

    def _with_history(self, snap: dict[str, Any]) -> str:
        """A page's first snapshot: with the queue depth of the last HISTORY seconds."""
        history = [[at, depth] for at, depth in self.depths]
        return json.dumps({**snap, "depth_history": history}, separators=(",", ":"))

    def record_depth(self, at: float, depth: int) -> None:
        """Keep one sample of the total queue depth; forget those older than HISTORY."""
        self.depths.append((at, depth))
        while self.depths[0][0] < at - HISTORY:
            self.depths.popleft()

    async def _sample_depths(self) -> None:
        """With no page open: one queue depth sample per interval until a page opens."""
        ask = self.sources.depth
        while not self._opened.is_set():
            if ask is not None:
                with contextlib.suppress(Exception):  # stopping or busy: a gap in the line
                    self.record_depth(self.clock(), await ask())
                with anyio.move_on_after(self.interval):
                    await self._opened.wait()
            else:
                await self._opened.wait()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The feed's loop (a service of the manager's actor system)."""
        task_status.started()
        while True:
            if not self.pages:
                self.latest = self._latest = None  # stale by the time a page opens
                self._stream_upto = None
                self._texts_sent = None
                self._opened = anyio.Event()
                await self._sample_depths()
            first: str | None = None
            fresh: set[web.WebSocketResponse] = set()
            try:
                self._latest = snap = await self.snapshot()
                since = self._new_texts_only(self._new_tries_only(snap))
                text = json.dumps(since, separators=(",", ":"))
            except Exception as exc:  # the manager is stopping or busy: say so, go on
                self.errors += 1
                self._latest = None
                while isinstance(exc, ExceptionGroup) and exc.exceptions:  # the asks' group
                    exc = exc.exceptions[0]
                text = json.dumps({"error": f"no snapshot: {type(exc).__name__}: {exc}"})
            else:
                fresh, self._fresh = self._fresh, set()
                if fresh:
                    first = self._with_history(snap)
            self.latest = text
            async with anyio.create_task_group() as tg:
                for page in list(self.pages):
                    tg.start_soon(self._send, page, first if first and page in fresh else text)
            await anyio.sleep(self.interval)

    async def close(self) -> None:
        """Close every open page's feed (the manager stops; the pages try again)."""
        pages, self.pages = list(self.pages), set()
        for page in pages:
            with anyio.move_on_after(1.0):
                await page.close(code=1001, message=b"the manager is stopping")

    async def _send(self, page: web.WebSocketResponse, text: str) -> None:
        with anyio.move_on_after(SEND_TIMEOUT) as scope:
            try:
                await page.send_str(text)
            except (ConnectionError, RuntimeError):
                self.pages.discard(page)
        if scope.cancelled_caught:  # a page that does not read does not hold the others
            self.pages.discard(page)
            await page.close(message=b"too slow")

    async def serve_page(self, request: web.Request) -> web.StreamResponse:
        """One open page: it gets the latest snapshot at once (else the next one), with
        the queue depth of the last HISTORY seconds, then every new snapshot."""
        if len(self.pages) + self._opening >= self.max_pages:
            return web.Response(
                status=503,
                text=f"{self.max_pages} dashboard pages are open, the most this manager "
                "serves at once: close one (or use GET /metrics) and reload\n",
            )
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=4096)
        self._opening += 1  # counted while its handshake is answered
        try:
            await ws.prepare(request)
        finally:
            self._opening -= 1
        latest, text = self._latest, self.latest
        if latest is None:
            self._fresh.add(ws)
        self.pages.add(ws)
        self._opened.set()
        try:
            if latest is not None:
                await ws.send_str(self._with_history(latest))
            elif text is not None:  # why there is no snapshot
                await ws.send_str(text)
            async for msg in ws:  # the page sends nothing; this sees its close
                if msg.type == WSMsgType.ERROR:
                    break
        finally:
            self.pages.discard(ws)
            self._fresh.discard(ws)
        return ws


# ----------------------------------------------------------------------------- routes


def _forbidden(role: str | None) -> web.Response | None:
    if role is not None and role not in READ_ROLES:
        return web.Response(status=403, text="this token may not read the dashboard\n")
    return None


def dashboard_routes(feed: DashboardFeed) -> dict[str, Any]:
    """The ``web_routes`` of the manager's listener: the page, its feed, the stories."""

    async def page(request: web.Request, role: str | None) -> web.StreamResponse:
        return _forbidden(role) or web.Response(
            text=PAGE,
            content_type="text/html",
            headers={
                "Cache-Control": "no-store",
                "Content-Security-Policy": _CSP,
                "Referrer-Policy": "no-referrer",
                "X-Content-Type-Options": "nosniff",
            },
        )

    async def live(request: web.Request, role: str | None) -> web.StreamResponse:
        return _forbidden(role) or await feed.serve_page(request)

    async def story(request: web.Request, role: str | None) -> web.StreamResponse:
        refused = _forbidden(role)
        if refused is not None:
            return refused
        key = request.query.get("key", "")
        if not key:
            return web.Response(status=400, text="say which task: /dashboard/story?key=KEY\n")
        try:
            rows = await feed.sources.story(key)
            metrics = await feed.sources.metrics()
        except (AskTimeout, ActorStopped) as exc:  # busy or stopping: try again later
            return web.Response(status=503, text=f"the manager did not answer: {exc}\n")
        groups = [g for g in metrics.failure_groups if g.key == key]
        return web.Response(
            text=story_page(key, rows, groups),
            content_type="text/html",
            headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP},
        )

    return {DASHBOARD_PATH: page, FEED_PATH: live, STORY_PATH: story}


def story_page(key: str, rows: list[list[str]], groups: list[FailureGroupInfo]) -> str:
    """A task's story as a small HTML page: its transitions (time from the first), and
    the error of its latest failed try if it is the latest of a failure group."""
    e = html.escape
    t0 = float(rows[0][4]) if rows else 0.0
    body = [f"<h1>Story of <code id='story-key'>{e(key)}</code></h1>"]
    if not rows:
        body.append(
            "<p id='story-empty'>No transitions kept for this key: it is unknown, or its "
            "story was forgotten (the scheduler keeps the latest transitions only).</p>"
        )
    else:
        body.append("<table id='story'><tr><th>+s</th><th>from</th><th>to</th><th>why</th></tr>")
        for row in rows:
            _, start, finish, stimulus, at = (str(x) for x in row)
            try:
                rel = f"{float(at) - t0:.3f}"
            except ValueError:
                rel = e(at)
            body.append(
                f"<tr><td>{rel}</td><td>{e(start)}</td><td>{e(finish)}</td>"
                f"<td><code>{e(stimulus)}</code></td></tr>"
            )
        body.append("</table>")
    for g in groups:
        if g.outcome == NOT_RUN:  # erred with no failed try: no worker, tasks not tries
            tasks = "task" if g.n == 1 else "tasks"
            why = (
                "a task it depends on failed"
                if g.cause == DEPENDENCY_FAILED
                else "the scheduler found it cannot run"
            )
            body.append(
                f"<h2>Latest of {e(g.category)} / {e(g.cause)} ({g.n} {tasks} not run)</h2>"
                f"<p>not run: {why}, {g.ago:.0f} s ago</p>"
            )
        else:
            body.append(
                f"<h2>Latest failure of {e(g.category)} / {e(g.cause)} ({g.n} tries of "
                f"{g.tasks} task{'s' if g.tasks != 1 else ''}, {g.erred} erred)</h2>"
                f"<p>on worker <code>{e(g.worker)}</code>, {e(g.outcome)}, {g.ago:.0f} s ago</p>"
            )
        body.append(f"<pre class='error'>{e(g.error)}</pre><pre class='tb'>{e(g.traceback)}</pre>")
    body.append(f"<p><a href='{DASHBOARD_PATH}'>back to the dashboard</a></p>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Story of "
        f"{e(key)}</title><style>{_STORY_CSS}</style></head><body>"
        + "".join(body)
        + "</body></html>"
    )


#: The pages load nothing from elsewhere: inline style and script, the feed on this host.
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)

_STORY_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;background:#f6f7f9;color:#1c2430}
table{border-collapse:collapse;background:#fff}
td,th{padding:3px 8px;border-bottom:1px solid #e3e6ea;text-align:left}
pre{background:#fff;border:1px solid #e3e6ea;padding:8px;overflow:auto}
.error{color:#b3261e;font-weight:600}
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Corral dashboard</title>
<style>
:root{--bg:#f4f6f8;--card:#fff;--ink:#1c2430;--mute:#66707c;--line:#e1e5ea;--ok:#2e7d32;
--err:#c62828;--warn:#ef6c00;--busy:#1565c0;--idle:#9fb3c8;--pend:#8e24aa}
*{box-sizing:border-box}body{margin:0;font:13px/1.4 system-ui,-apple-system,sans-serif;
background:var(--bg);color:var(--ink)}
header{display:flex;gap:16px;align-items:baseline;padding:10px 16px;background:#1c2430;color:#fff}
header h1{font-size:17px;margin:0}header .mute{color:#aeb7c2}
#conn{padding:1px 8px;border-radius:9px;background:#555}#conn.live{background:var(--ok)}
#conn.down{background:var(--err)}#conn.stale{background:var(--warn)}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:12px;padding:12px}
section{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:10px 12px;
min-width:0;overflow-x:auto}section h2{font-size:14px;margin:0 0 8px}section.wide{grid-column:1/-1}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:3px 6px;
border-bottom:1px solid var(--line);white-space:nowrap}th{color:var(--mute);font-weight:500}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.big{font-size:20px;font-weight:600}.mute{color:var(--mute)}.empty{color:var(--mute);
font-style:italic}
.badge{display:inline-block;padding:0 7px;border-radius:9px;color:#fff;font-size:12px}
.alert{margin:2px 0 10px}
.firing{background:var(--err)}.pending{background:var(--warn)}.resolved{background:var(--ok)}
.warning{border-left:4px solid var(--warn);padding:4px 8px;margin:6px 0;background:#fff6ec}
#down{margin:12px 12px 0}
.failure{border-left:4px solid var(--err);padding:4px 8px;margin:6px 0;background:#fdf3f3}
.failure .err{font-family:ui-monospace,monospace;color:var(--err);white-space:pre-wrap;
word-break:break-word}
pre{white-space:pre-wrap;word-break:break-word;font-size:11px;background:#fafafa;
border:1px solid var(--line);padding:6px;max-height:220px;overflow:auto}
svg text{font:10px system-ui,sans-serif;fill:var(--mute)}
a{color:var(--busy)}
</style></head>
<body>
<header><h1>Corral</h1><span id="conn" title="no snapshot yet">connecting</span>
<span id="summary" class="mute"></span><span id="when" class="mute"></span></header>
<p id="down" class="warning" hidden></p>
<main>
<section><h2>Pools and queues <span class="mute">queue depth
<b id="queue-depth-total" title="no snapshot yet">&ndash;</b></span></h2>
<div id="pools"></div><svg id="depth-spark" width="100%" height="46"></svg></section>
<section><h2>Alerts</h2><div id="alerts"></div></section>
<section class="wide"><h2>Capacity <span class="mute">(per pool: available, busy,
pending)</span></h2><div id="capacity"></div></section>
<section class="wide"><h2>Why tasks fail</h2><div id="failures"></div></section>
<section class="wide"><h2>Tries lost with their worker <span class="mute">(free
retries: preempted, walltime, drained, ...; not failures)</span></h2><div id="free">
</div></section>
<section class="wide"><h2>Workers</h2><div id="workers"></div></section>
<section class="wide"><h2>Task stream <span class="mute">(tries that ended in the last
minute, per worker)</span></h2><div id="stream"></div></section>
<section><h2>Policies in force</h2><div id="policies"></div></section>
</main>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
function h(tag, attrs, ...kids) {
  const el = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4))
                                    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") el.textContent = v; else el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
function put(id, ...kids) {
  document.getElementById(id).replaceChildren(...kids.flat().filter(k => k !== null));
}
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
function secs(s) {
  if (s === null || s === undefined) return "-";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function empty(text) { return h("p", {class: "empty", text}); }
function bar(used, total, opts) {
  // a horizontal bar: used of total (a fence mark at opts.fence), width 160
  const w = 160, f = total > 0 ? Math.min(used / total, 1) : 0;
  const svg = h("svg:svg", {width: w, height: 12, class: opts.cls || "bar"});
  svg.append(h("svg:rect", {x: 0, y: 1, width: w, height: 10, fill: "#e8ecf0", rx: 2}));
  svg.append(h("svg:rect", {x: 0, y: 1, width: (w * f).toFixed(1), height: 10, rx: 2,
                            fill: opts.color || "var(--busy)"}));
  if (opts.fence && total > 0) {
    const x = (w * Math.min(opts.fence / total, 1)).toFixed(1);
    svg.append(h("svg:line", {x1: x, x2: x, y1: 0, y2: 12, stroke: "var(--warn)",
                              "stroke-width": 2}));
  }
  return svg;
}
const HISTORY = 120;  // seconds of queue depth on the line
const MAX_STREAM = 300;  // tries in the task stream (the feed's MAX_STREAM)
let tries = [];  // the stream's tries, each with the time it ended
function addTries(s) {
  // a snapshot's stream is whole (the first) or the tries new since the last (stream_new)
  const got = s.stream.map(t => ({...t, ended: s.time - t.ago}));
  tries = (s.stream_new ? tries.concat(got) : got).slice(-MAX_STREAM);
  s.stream = tries.map(t => ({...t, ago: s.time - t.ended}));
}
let groupTexts = new Map();  // failure group -> its error and traceback
function addTexts(s) {
  // a group's error and traceback come when they change: "same", the ones it had before
  const name = g => JSON.stringify([g.category, g.cause, g.outcome]);
  for (const g of s.failures) {
    if (g.same) Object.assign(g, groupTexts.get(name(g)) || {error: "", traceback: ""});
  }
  groupTexts = new Map(s.failures.map(g => [name(g), {error: g.error, traceback: g.traceback}]));
}
let depthHistory = [];  // [time, depth]: the feed's history, then the snapshots
function addDepths(samples) {
  const seen = new Set(depthHistory.map(p => p[0]));
  depthHistory.push(...samples.filter(p => !seen.has(p[0])));
  depthHistory.sort((a, b) => a[0] - b[0]);
  const end = depthHistory.length ? depthHistory[depthHistory.length - 1][0] : 0;
  depthHistory = depthHistory.filter(p => p[0] >= end - HISTORY);
  sparkline(document.getElementById("depth-spark"), depthHistory);
}
function sparkline(svg, samples) {
  svg.replaceChildren();
  const w = svg.clientWidth || 400, hgt = 46;
  const top = Math.max(0, ...samples.map(p => p[1])), max = Math.max(1, top);
  const end = samples.length ? samples[samples.length - 1][0] : 0;
  const pts = samples.map(([t, v]) =>
    (w * (1 - (end - t) / HISTORY)).toFixed(1) + "," +
    (hgt - 4 - ((hgt - 12) * v) / max).toFixed(1));
  svg.setAttribute("data-max", top);
  svg.append(h("svg:polyline", {points: pts.join(" "), fill: "none",
                                stroke: "var(--busy)", "stroke-width": 1.5}));
  svg.append(h("svg:text", {x: 2, y: 10, text: "queue depth, last 2 min (max " + top + ")"}));
}
function renderPools(s) {
  if (!s.pools.length) return put("pools", empty("no pool yet: no worker and no task"));
  put("pools", h("table", {},
    h("tr", {}, h("th", {text: "pool"}), h("th", {class: "num", text: "queue"}),
      h("th", {class: "num", text: "oldest wait"}), h("th", {class: "num", text: "wait p50"}),
      h("th", {class: "num", text: "wait p90"}),
      h("th", {class: "num", text: "on workers",
               title: "tasks sent to the pool's workers: running, or ready to start next"})),
    s.pools.map(p => h("tr", {class: "pool", "data-pool": p.name},
      h("td", p.name === "*" ? {text: p.label,
        title: "ready tasks submitted without pool=: the workers of any pool may run " +
               "them; counted here once, not in each pool's queue"} : {text: p.label}),
      h("td", {class: "num big queue-depth", "data-value": p.queue_depth}, String(p.queue_depth),
        p.held_back ? h("span", {class: "held-back", text: " (" + p.held_back + " held back)",
          title: "ready tasks held back for a while: their inputs could not be fetched " +
                 "from a worker still connected (workers that cannot reach each other?)"})
          : "",
        p.retry_held ? h("span", {class: "retry-held",
                                  text: " (+" + p.retry_held + " held for retry)",
          title: "retries held for their backoff (the retry policy's delay): not ready yet, " +
                 "not counted in the queue"})
          : "",
        p.any_pool_queued ? h("span", {class: "any-pool",
                                       text: " (+" + p.any_pool_queued + " of any pool)",
          title: "ready tasks submitted without pool=, which this pool's workers may run " +
                 "too: counted in the 'any pool' row and the total, not in this figure"})
          : ""),
      h("td", {class: "num", text: secs(p.oldest_wait)}),
      h("td", {class: "num", text: secs(p.wait_p50)}),
      h("td", {class: "num", text: secs(p.wait_p90)}),
      h("td", {class: "num", text: p.running})))));
}
function renderCapacity(s) {
  const pools = s.pools.filter(p => p.name !== "*");
  if (!pools.length) return put("capacity", empty("no workers and no blocks"));
  const warned = (s.warnings || []).map(w => h("p", {class: "warning", text: "\u26a0 " + w}));
  put("capacity", h("div", {}, ...warned, h("table", {},
    h("tr", {}, h("th", {text: "pool"}), h("th", {text: "CPUs busy / total"}),
      h("th", {text: "memory RSS / limit"}), h("th", {text: "workers"}),
      h("th", {text: "blocks"})),
    pools.map(p => {
      const w = p.workers || {};
      const blocks = Object.entries(p.blocks).map(([k, v]) => v + " " + k).join(", ") || "-";
      return h("tr", {class: "capacity", "data-pool": p.name},
        h("td", {text: p.label}),
        h("td", {}, bar(p.cores_busy, p.cores, {}), " " + p.cores_busy + " / " + p.cores),
        h("td", {}, bar(p.rss, p.memory_limit, {color: "var(--pend)"}),
          " " + bytes(p.rss) + " / " + (p.memory_limit ? bytes(p.memory_limit) : "no limit")),
        h("td", {text: (p.hosts ? p.hosts + (p.hosts === 1 ? " host: " : " hosts: ") : "") +
          (w.idle || 0) + " idle, " + (w.busy || 0) + " busy" +
          (w.draining ? ", " + w.draining + " draining" : "") +
          (w.away ? ", " + w.away + " away (connection dropped, held for its rejoin)" : "") +
          (p.throttled ? ", " + p.throttled + " throttled" : "") +
          (p.disk_stalled ? ", disk stalled: tasks wait for disk" : "") +
          (p.placement_stalled ? ", placement stalled: ready tasks placed nowhere" +
            " (status says why)" : "")}),
        h("td", {text: blocks + (p.blocks_pending ? " (the oldest asked for " +
          secs(p.oldest_pending) + " ago)" : "") +
          (p.target !== null ? "; target " + p.target : "") +
          (p.desired !== null && p.desired !== p.target ? ", policy wants " + p.desired : "")}));
    }))));
}
function renderWorkers(s) {
  if (!s.workers.length) return put("workers", empty("no worker has joined"));
  put("workers", h("table", {},
    h("tr", {}, h("th", {text: "worker"}), h("th", {text: "pool"}),
      h("th", {text: "host", title: "its machine: host name / part of its machine-id, " +
                                    "and the accelerator it is pinned to"}),
      h("th", {class: "num", text: "tasks / cores",
               title: "tasks it has in hand (running, or ready to start next) / its cores"}),
      h("th", {text: "memory (RSS vs limit)"}),
      h("th", {text: "disk (used vs limit)",
               title: "every byte on its disk (outputs, checkpoint files, copies under " +
                      "way) vs used plus free: its --disk, or less if its file system " +
                      "has less free"}),
      h("th", {class: "num", text: "in memory"}), h("th", {class: "num", text: "spilled"}),
      h("th", {class: "num", text: "file outputs"}),
      h("th", {text: "state"})),
    s.workers.map(w => h("tr", {class: "worker", "data-worker": w.id},
      h("td", {text: w.id}), h("td", {text: w.pool}),
      h("td", {text: (w.host || "-") +
                     (w.accelerator ? " (accelerator " + w.accelerator + ")" : "")}),
      h("td", {class: "num", text: w.running + " / " + w.cores}),
      h("td", {}, bar(w.rss, w.limit, {fence: w.throttle_at,
        color: w.throttled ? "var(--err)" : "var(--ok)"}),
        " " + bytes(w.rss) + (w.limit ? " / " + bytes(w.limit) : "")),
      h("td", {class: "disk", "data-used": w.disk_used, "data-limit": w.disk_limit},
        w.disk_limit === null ? null : bar(w.disk_used, w.disk_limit,
          {cls: "bar disk-bar", color: w.disk_free === 0 ? "var(--err)" : "var(--pend)"}),
        " " + bytes(w.disk_used) +
          (w.disk_limit === null ? " (not counted)" : " / " + bytes(w.disk_limit))),
      h("td", {class: "num", text: bytes(w.memory_bytes)}),
      h("td", {class: "num", text: bytes(w.spilled_bytes)}),
      h("td", {class: "num", text: bytes(w.file_bytes)}),
      h("td", {text: w.throttled ? "throttled" : w.draining ? "draining" :
                     w.running ? "busy" : "idle"})))));
}
const COLORS = {ok: "var(--ok)", error: "var(--err)", oom: "var(--pend)",
                "worker-lost": "var(--warn)", timeout: "var(--warn)"};
function renderStream(s) {
  const recent = s.stream.filter(t => t.ago < 60);
  if (!recent.length) return put("stream", empty("no try ended in the last 60 s"));
  const workers = [...new Set(recent.map(t => t.worker))].sort();
  const left = 170, w = Math.max(document.getElementById("stream").clientWidth, 500) - 4;
  const row = 16, hgt = workers.length * row + 18, span = w - left;
  // the window: the last 60 s, or less while fewer seconds have tries (10 s steps); when
  // the latest MAX_STREAM tries all ended within the minute (older ones were not kept),
  // the seconds they cover: a longer axis drew their workers idle before them
  const capped = recent.length >= MAX_STREAM;
  const covered = Math.max(...recent.map(t => t.ago), 0.1);
  const win = capped ? covered : Math.min(60, 10 * Math.ceil(
    Math.max(...recent.map(t => t.ago + t.duration), 1) / 10));
  const mark = v => capped ? Number(v.toPrecision(2)) : v;
  const x = ago => left + span * (1 - Math.min(ago, win) / win);
  const svg = h("svg:svg", {width: w, height: hgt});
  workers.forEach((name, i) => svg.append(h("svg:text", {x: 0, y: i * row + 12,
    text: name.length > 28 ? "…" + name.slice(-27) : name})));
  for (const t of recent) {
    const i = workers.indexOf(t.worker), x1 = x(t.ago + t.duration), x2 = x(t.ago);
    const r = h("svg:rect", {x: x1.toFixed(1), y: i * row + 2,
      width: Math.max(x2 - x1, 2).toFixed(1), height: row - 4,
      fill: COLORS[t.outcome] || "var(--mute)", class: "try", "data-outcome": t.outcome});
    r.append(h("svg:title", {text: t.key + " (" + t.outcome + ", " + secs(t.duration) + ")"}));
    svg.append(r);
  }
  for (const s2 of [1, 0.75, 0.5, 0.25, 0].map(f => f * win)) svg.append(h("svg:text",
    {x: (x(s2) - (s2 ? 10 : 20)).toFixed(1), y: hgt - 2,
     text: s2 ? "-" + mark(s2) + " s" : "now"}));
  put("stream", capped ? h("p", {class: "mute", id: "stream-capped", text: "the latest " +
    MAX_STREAM + " tries only, which ended in the last " + secs(covered) + ": more end " +
    "than the stream keeps (the pools' figures count them all)"}) : null, svg);
}
const opened = new Map();  // name -> scrollTop of each <details> opened: kept across snapshots
function kept(name, summary, body) {
  // a <details> (a traceback, the alert actions) that stays open, scrolled where it was,
  // across snapshots once opened, until closed: each snapshot draws the panels anew, which
  // closed it within the second (one click showed a traceback for a moment)
  const el = h("details", {"data-name": name}, h("summary", {text: summary}), body);
  el.addEventListener("toggle", () => {
    if (!el.open) opened.delete(name); else if (!opened.has(name)) opened.set(name, 0);
  });
  body.addEventListener("scroll", () => { if (el.open) opened.set(name, body.scrollTop); });
  if (opened.has(name)) {
    el.open = true;
    const top = opened.get(name);
    queueMicrotask(() => { body.scrollTop = top; });  // once render has put it in the page
  }
  return el;
}
function storyLink(key) {
  return h("a", {class: "story-link", href: "/dashboard/story?key=" + encodeURIComponent(key),
                 text: key});
}
function mostRecent(shown, total) {  // the note over a list of the latest groups
  return total > shown ? h("p", {class: "mute", text: "the " + shown + " most recent of " +
    total + " groups"}) : null;
}
function renderFailures(s) {
  if (!s.failures.length) return put("failures", empty("no task has failed"));
  put("failures", mostRecent(s.failures.length, s.failure_groups),
    s.failures.map(g => h("div", {class: "failure", "data-category": g.category,
      "data-cause": g.cause, "data-outcome": g.outcome},
    g.outcome === "not-run"  // tasks that erred with no failed try of their own
      ? h("div", {}, h("b", {class: "count", text: g.n + (g.n === 1 ? " task" : " tasks"),
          title: "tasks that erred without a failed try of their own: a task they " +
                 "depend on failed, or the scheduler found they cannot run (tasks, " +
                 "not tries: they are not in the failure counts)"}), " ",
          h("b", {text: g.category}), " · " + g.cause + " (not run) · latest ",
          storyLink(g.key), ", " + secs(g.ago) + " ago")
      : h("div", {}, h("b", {class: "count", text: g.n + " x", title: "failed tries"}), " ",
          h("span", {class: "tasks", text: "(" + g.tasks + (g.tasks === 1 ? " task, " :
            " tasks, ") + g.erred + " erred) ", title: "the tasks of these tries, and how " +
            "many of them erred in the end (the others finished after a retry, or are " +
            "still on their way)"}),
          h("b", {text: g.category}), " · " + g.cause + " (" + g.outcome + ") · latest ",
          storyLink(g.key), " on " + g.worker + ", " + secs(g.ago) + " ago"),
    h("div", {class: "err", text: g.error}),
    g.traceback ? kept("traceback " + JSON.stringify([g.category, g.cause]), "traceback",
                       h("pre", {class: "tb", text: g.traceback})) : null)));
}
function renderFree(s) {
  if (!s.free.length) return put("free", empty("no try lost with its worker for a " +
    "reason that says nothing of the task (preempted, walltime, drained, ...) and retried " +
    "free (one lost to a crash is a suspect: under Why tasks fail)"));
  put("free", mostRecent(s.free.length, s.free_groups),
    s.free.map(g => h("div", {class: "free", "data-category": g.category,
      "data-cause": g.cause},
      h("b", {class: "count", text: g.n + " x", title: "tries lost with their worker and " +
        "retried without spending the task's retry budget"}), " ",
      h("b", {text: g.category}), " · " + g.cause + " · latest ", storyLink(g.key),
      " on " + g.worker + ", " + secs(g.ago) + " ago")));
}
function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : null; }
function link(v) {
  return /^(https?:\\/\\/|\\/)/.test(v) ? h("a", {href: v, text: v}) : v;
}
function renderAlerts(s) {
  const note = h("p", {class: "mute", text: s.alert_rules + " rule(s)"});
  if (!s.alerts.length) return put("alerts", empty("no alert pending or firing"), note);
  const order = {firing: 0, pending: 1, resolved: 2};
  const alerts = [...s.alerts].sort((a, b) => order[a.state] - order[b.state]);
  put("alerts", alerts.map(a => h("div", {class: "alert", "data-state": a.state,
      "data-name": a.name},
    h("div", {}, h("span", {class: "badge " + a.state, text: a.state.toUpperCase()}), " ",
      h("b", {text: a.name}), " ",
      h("span", {class: "mute", text: Object.entries(a.labels).filter(([k]) => k !== "alertname")
        .map(([k, v]) => k + "=" + v).join(", ")})),
    Object.keys(a.fields).length ? h("div", {class: "mute", text: Object.entries(a.fields)
      .map(([k, v]) => k + "=" + v).join(", ")}) : null,
    Object.entries(a.annotations).map(([k, v]) => h("div", {}, k + ": ", link(v))),
    h("div", {class: "mute", text: [a.active_since && "active since " + when(a.active_since),
      a.fired_at && "fired " + when(a.fired_at),
      a.resolved_at && "resolved " + when(a.resolved_at)].filter(Boolean).join(" · ")}))),
    note, s.audit.length ? kept("actions", "actions", h("pre", {text: s.audit.join("\\n")}))
      : null);
}
function renderPolicies(s) {
  const rows = Object.entries(s.policies);
  if (!rows.length) return put("policies", empty("default policies"));
  put("policies", h("table", {}, rows.map(([k, v]) => h("tr", {class: "policy"},
    h("th", {text: k}), h("td", {text: v})))),
    s.policy_errors ? h("p", {class: "mute", text: s.policy_errors + " policy error(s)"}) : null);
}
function render(s) {
  if (s.error) { document.getElementById("when").textContent = s.error; return; }
  const total = document.getElementById("queue-depth-total");
  total.textContent = s.queue_depth; total.dataset.value = s.queue_depth;
  addDepths([...(s.depth_history || []), [s.time, s.queue_depth]]);
  const states = Object.entries(s.tasks_by_state).filter(([, n]) => n)
    .map(([k, n]) => n + " " + k).join(", ");
  document.getElementById("summary").textContent =
    s.tasks_created + " tasks submitted" + (states ? " (" + states + ")" : "") + ", " +
    s.workers.length + " workers";
  document.getElementById("when").textContent = "updated " + when(s.time);
  addTries(s); addTexts(s);
  renderPools(s); renderCapacity(s); renderWorkers(s); renderStream(s);
  renderFailures(s); renderFree(s); renderAlerts(s); renderPolicies(s);
  document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
  // live once a snapshot is shown, not when the socket opens: until then the page has
  // no figure to show (a dash), and a screenshot or a slow link must not read a 0
  const conn = document.getElementById("conn");
  conn.textContent = "live"; conn.className = "live"; conn.title = total.title = "";
  lastSnapshot = performance.now();
}
const STALE = 5000;  // ms without a snapshot (one a second) on an open feed: not live
let lastSnapshot = 0;  // performance.now() of the latest snapshot drawn (0: none yet)
setInterval(() => {
  // the feed open but silent: the manager is stopped or its event loop blocked (an
  // embedded cluster's runs in the program's own loop: a notebook cell that blocks it)
  const conn = document.getElementById("conn"), idle = performance.now() - lastSnapshot;
  if (!lastSnapshot || conn.className === "down" || idle < STALE) return;
  conn.textContent = "no update for " + Math.round(idle / 1000) + " s"; conn.className = "stale";
  conn.title = "the figures shown are those of the last snapshot: the manager sends one a " +
    "second and has sent none since; it is busy, stopped, or its event loop is blocked " +
    "(an embedded cluster's manager runs in your program's event loop: a notebook cell " +
    "that blocks it, time.sleep or long local work, stops it meanwhile)";
}, 1000);
function down(why, text) {
  // why the feed is down, said above the panels (data-down: "token", "unreachable")
  const el = document.getElementById("down");
  el.hidden = !why; el.textContent = text || "";
  if (why) document.body.dataset.down = why; else delete document.body.dataset.down;
}
async function whyDown() {
  // a WebSocket does not say why its handshake failed: ask the page itself (HEAD /)
  const here = location.host;
  try {
    const r = await fetch("/", {method: "HEAD", cache: "no-store", credentials: "same-origin"});
    if (r.status === 401 || r.status === 403) {
      down("token", "\u26a0 " + here + " refuses this page's token: the manager or " +
        "cluster there started again, with new tokens. Open the URL it printed at its " +
        "start (an embedded cluster's: cluster.dashboard_link) once, in any tab; this " +
        "page then reconnects by itself.");
    } else {
      down(null);  // it answers: the feed closed for another reason (stopping, too slow)
    }
  } catch (e) {
    down("unreachable", "\u26a0 nothing answers at " + here + ": the manager or cluster " +
      "stopped (or the network is down); this page keeps trying. A cluster started " +
      "again listens on another port unless it was given port=: open its " +
      "cluster.dashboard_link.");
  }
}
let backoff = 500;
function connect() {
  const conn = document.getElementById("conn");
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") +
                           location.host + "/dashboard/ws");
  // "live" at the first snapshot (render); the handshake passed: reachable, token taken
  ws.onopen = () => { backoff = 500; down(null); };
  ws.onmessage = ev => render(JSON.parse(ev.data));
  ws.onclose = async () => {
    conn.textContent = "reconnecting"; conn.className = "down";
    conn.title = "the last snapshot is shown until a new one comes";
    await whyDown();
    setTimeout(connect, backoff); backoff = Math.min(backoff * 2, 10000);
  };
}
connect();
</script></body></html>
"""
