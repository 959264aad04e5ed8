"""Prometheus metrics of a manager: the numbers of a :class:`MetricsReply` in the
exposition format, through ``prometheus_client``.

The pure cores keep the counters (``SchedulerState.pool_metrics``,
``AutoscalerState.block_metrics``); the manager answers a :class:`MetricsRequest` with
them. Here, at scrape time only, :class:`SnapshotCollector` turns one such snapshot into
metric families and :func:`render` into the text Prometheus reads: nothing runs on the
scheduler's hot path between scrapes.

Served by the manager's own listener (``GET /metrics``, with the read or admin token:
:func:`metrics_route`) and, with ``--metrics-listen HOST:PORT``, by a separate
unauthenticated HTTP server (:func:`serve_metrics`). docs/monitoring.md lists the
metrics.

Besides the snapshot, :class:`NotifierCollector` reads the alert monitor's Alertmanager
notifiers (``runtime/notify.py``, handed in by ``runtime/node.py``) at scrape time: the
``corral_notifications_*`` series, named after Prometheus' own
``prometheus_notifications_*``, which say whether alerts reach Alertmanager
(docs/monitoring.md, "Notifiers and Alertmanager"). Alert rules do not read them (they
are not in :data:`SAMPLE_LABELS`). :class:`ManagerCollector` shows the manager process's
own health (its loop's lag, its monitoring database's size, backlog and drops), beside
``prometheus_client``'s ``process_*`` series (``runtime/node.py`` adds both).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from actors.autoscaler_state import bounded_detail, brief_detail
from runtime.errors import ActorStopped, AskTimeout
from runtime.messages import (
    BlockMetrics,
    CategoryMetrics,
    FailureCount,
    MetricsReply,
    PolicyErrorCount,
    PoolMetrics,
    WorkerDiskMetrics,
)

__all__ = [
    "READ_ROLES",
    "SAMPLE_LABELS",
    "ManagerCollector",
    "NotifierCollector",
    "NotifierCounts",
    "RefusalCollector",
    "SnapshotCollector",
    "WriterCounts",
    "metrics_route",
    "notes",
    "render",
    "samples",
    "serve_metrics",
]

#: the token roles that may read ``/metrics`` on the manager's listener
READ_ROLES = frozenset({"read", "submit", "admin"})


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _summary(name: str, doc: str) -> Metric:
    return Metric(name, doc, "summary")


class SnapshotCollector(Collector):
    """A collector of one :class:`MetricsReply`: ``collect`` only reads it."""

    def __init__(self, snapshot: MetricsReply) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        pool = ["pool"]
        depth = _gauge("corral_queue_depth", "Ready tasks waiting for a worker.", pool)
        held_back = _gauge(
            "corral_queue_held_back",
            "Of the ready tasks, those held back after their inputs could not be fetched "
            "from a connected worker (a backoff).",
            pool,
        )
        retry_held = _gauge(
            "corral_retry_held",
            "Retries held for their backoff (the retry policy's delay): not ready, not "
            "in the queue depth.",
            pool,
        )
        oldest = _gauge(
            "corral_queue_oldest_wait_seconds",
            "How long the oldest ready task has waited (0: none waits).",
            pool,
        )
        on_worker = _gauge(
            "corral_worker_queue_oldest_seconds",
            "How long the oldest try sent to a worker and not known to execute has been "
            "there (queued behind others; 0: none). Not in corral_queue_depth.",
            pool,
        )
        longest = _gauge(
            "corral_task_longest_running_seconds",
            "How long the try executing longest has executed (as its worker said after "
            "0.5 s; 0: none).",
            pool,
        )
        wait = _summary(
            "corral_queue_wait_seconds",
            "Waits from ready to sent to a worker; quantiles over the latest 1000 waits.",
        )
        running = _gauge(
            "corral_tasks_running", "Tasks sent to the pool's workers, not finished.", pool
        )
        workers = _gauge(
            "corral_workers", "Workers by state (idle, busy, draining, away).", ["pool", "state"]
        )
        cores = _gauge(
            "corral_cores", "Cores of the pool's connected workers (not those away).", pool
        )
        cores_busy = _gauge(
            "corral_cores_busy",
            "Of those, the cores running tasks (one per task, draining workers too).",
            pool,
        )
        throttled = _gauge("corral_workers_throttled", "Workers past their throttle fence.", pool)
        past_limit = _gauge(
            "corral_workers_past_limit",
            "Workers whose tasks run in threads that went past their terminate fence.",
            pool,
        )
        rss = _gauge("corral_worker_rss_bytes", "RSS of the pool's workers, summed.", pool)
        limit = _gauge(
            "corral_worker_memory_limit_bytes",
            "Memory limits of the pool's connected workers (not those away), summed.",
            pool,
        )
        held = _gauge("corral_memory_bytes", "Task outputs held in workers' memory.", pool)
        spill = _gauge("corral_spill_bytes", "Task outputs spilled to disk now.", pool)
        spilled = _counter("corral_spilled_bytes", "Bytes ever spilled to disk.", pool)
        disk_stalled = _gauge(
            "corral_disk_stalled",
            "1 while every worker of the pool runs nothing and its ready tasks wait for disk.",
            pool,
        )
        disk_stalls = _counter("corral_disk_stalls", "Disk stalls the pool had.", pool)
        placement_stalled = _gauge(
            "corral_placement_stalled",
            "1 while the pool has ready tasks and an idle worker and placed nothing for "
            "stall_timeout (not for disk).",
            pool,
        )
        placement_stalls = _counter(
            "corral_placement_stalls", "Placement stalls the pool had.", pool
        )
        for name, m in sorted(snap.pools.items()):
            depth.add_metric([name], m.queue_depth)
            held_back.add_metric([name], m.held_back)
            retry_held.add_metric([name], m.retry_held)
            oldest.add_metric([name], m.oldest_wait)
            on_worker.add_metric([name], m.worker_queue_oldest)
            longest.add_metric([name], m.longest_running)
            for q, v in m.wait_quantiles.items():
                wait.add_sample(wait.name, {"pool": name, "quantile": q}, v)
            wait.add_sample(wait.name + "_count", {"pool": name}, m.waits)
            wait.add_sample(wait.name + "_sum", {"pool": name}, m.wait_sum)
            running.add_metric([name], m.running)
            for state, n in sorted(m.workers.items()):
                workers.add_metric([name, state], n)
            cores.add_metric([name], m.cores)
            cores_busy.add_metric([name], m.cores_busy)
            throttled.add_metric([name], m.throttled)
            past_limit.add_metric([name], m.workers_past_limit)
            rss.add_metric([name], m.rss_bytes)
            limit.add_metric([name], m.memory_limit_bytes)
            held.add_metric([name], m.memory_bytes)
            spill.add_metric([name], m.spilled_bytes)
            spilled.add_metric([name], m.spilled_total)
            disk_stalled.add_metric([name], m.disk_stalled)
            disk_stalls.add_metric([name], m.disk_stalls)
            placement_stalled.add_metric([name], m.placement_stalled)
            placement_stalls.add_metric([name], m.placement_stalls)
        yield from (depth, held_back, retry_held, oldest, on_worker, longest, wait, running)
        yield from (workers, cores)
        yield cores_busy
        yield from (throttled, past_limit, rss, limit, held)
        yield from (spill, spilled, disk_stalled, disk_stalls)
        yield from (placement_stalled, placement_stalls)

        cat = ["category"]
        duration = _summary(
            "corral_task_duration_seconds", "Durations of the tries that finished ok."
        )
        finished = _counter("corral_tasks_finished", "Tries that finished ok.", cat)
        out_bytes = _counter("corral_task_output_bytes", "Output bytes produced.", cat)
        in_bytes = _counter("corral_task_input_bytes", "Input bytes read.", cat)
        peak = _gauge("corral_task_peak_rss_bytes", "Highest worker RSS seen while one ran.", cat)
        for name, c in sorted(snap.categories.items()):
            duration.add_sample(duration.name + "_count", {"category": name}, c.finished)
            duration.add_sample(duration.name + "_sum", {"category": name}, c.duration_sum)
            finished.add_metric([name], c.finished)
            out_bytes.add_metric([name], c.output_bytes)
            in_bytes.add_metric([name], c.input_bytes)
            peak.add_metric([name], c.peak_rss)
        yield from (duration, finished, out_bytes, in_bytes, peak)

        failures = _counter(
            "corral_task_failures",
            "Tries that failed, by outcome and cause (exception type or why the worker went).",
            ["category", "outcome", "cause"],
        )
        for f in snap.failures:
            failures.add_metric([f.category, f.outcome, f.cause], f.n)
        yield failures
        yield from _policy_families(snap)

        tasks = _gauge("corral_tasks", "Tasks by state.", ["state"])
        for state, n in sorted(snap.tasks_by_state.items()):
            tasks.add_metric([state], n)
        yield tasks
        yield CounterMetricFamily(
            "corral_tasks_submitted", "Tasks submitted.", value=snap.tasks_created
        )
        yield GaugeMetricFamily(
            "corral_workers_connected", "Workers connected (not those away).", value=snap.workers
        )
        yield from _disk_families(snap)

        rep = snap.replicas
        yield CounterMetricFamily(
            "corral_replicas", "Temporary replicas of outputs made.", value=rep.made
        )
        yield CounterMetricFamily(
            "corral_replica_bytes", "Bytes copied to make replicas.", value=rep.copied_bytes
        )
        yield CounterMetricFamily(
            "corral_replicas_failed", "Replica copies that failed.", value=rep.failed
        )
        yield CounterMetricFamily(
            "corral_recomputes_avoided",
            "Outputs whose holder was lost and that only replicas kept (not computed again).",
            value=rep.recomputes_avoided,
        )
        yield GaugeMetricFamily(
            "corral_replicated_outputs", "Outputs that have replicas now.", value=rep.outputs
        )
        spec = CounterMetricFamily(
            "corral_speculative_copies",
            "Speculative copies of long tasks: started, and those that won, lost or failed.",
            labels=["result"],
        )
        for result in ("started", "won", "lost", "failed"):
            spec.add_metric([result], snap.speculative.get(result, 0))
        yield spec

        blocks = _gauge(
            "corral_blocks",
            "Worker blocks by state (requested: no answer from the provider yet).",
            ["pool", "state"],
        )
        pending = _gauge(
            "corral_blocks_pending_oldest_seconds",
            "Age of the oldest block not running yet, from its request (0: none).",
            pool,
        )
        target = _gauge("corral_blocks_target", "Blocks the user asked for.", pool)
        desired = _gauge("corral_blocks_desired", "Blocks the scaling policy wants.", pool)
        failed = _counter(
            "corral_blocks_failed",
            "Blocks that failed or ended unasked (crash, vanished; not preempted, walltime).",
            pool,
        )
        stuck = _counter(
            "corral_blocks_stuck",
            "Blocks not running by the pool's provisioning timeout, scaled in and replaced.",
            pool,
        )
        taken_back = _counter(
            "corral_blocks_taken_back",
            "Drained blocks taken back (their workers un-drained): by the autoscaler when "
            "the pool wanted blocks again, instead of new ones started (by=autoscaler), or "
            "by an operator's undrain (by=operator).",
            ["pool", "by"],
        )
        ends = _counter(
            "corral_block_ends",
            "Block ends and requeues by cause (preempted, walltime, drained, crash, ...).",
            ["pool", "cause"],
        )
        slots = _gauge("corral_pool_slots_per_block", "Tasks one block runs at once.", pool)
        per_block = _gauge("corral_pool_workers_per_block", "Workers in one block.", pool)
        most = _gauge("corral_pool_max_blocks", "The pool's max_blocks (0: not configured).", pool)
        suspended = _gauge(
            "corral_pool_suspended",
            "1 while the pool asks for no block until an operator resumes it.",
            pool,
        )
        submit = _gauge(
            "corral_pool_submit_failures",
            "The pool's failed block submissions in a row, refused or not answered (0 once "
            "one goes through).",
            pool,
        )
        for name, b in sorted(snap.blocks.items()):
            for state, n in sorted(b.states.items()):
                blocks.add_metric([name, state], n)
            pending.add_metric([name], b.oldest_pending)
            target.add_metric([name], b.target)
            desired.add_metric([name], b.desired)
            failed.add_metric([name], b.failed)
            stuck.add_metric([name], b.stuck)
            taken_back.add_metric([name, "autoscaler"], b.taken_back)
            taken_back.add_metric([name, "operator"], b.taken_back_by_operator)
            for cause, n in sorted(b.ends.items()):
                ends.add_metric([name, cause], n)
            slots.add_metric([name], b.slots_per_block)
            per_block.add_metric([name], b.workers_per_block)
            most.add_metric([name], b.max_blocks)
            suspended.add_metric([name], b.suspended)
            submit.add_metric([name], b.submit_failures)
        yield from (
            blocks,
            pending,
            target,
            desired,
            failed,
            stuck,
            taken_back,
            ends,
            slots,
            per_block,
            most,
            suspended,
            submit,
        )
        yield GaugeMetricFamily(
            "corral_autoscaler_busy",
            "1 when the autoscaler did not answer this scrape in time (blocks left out).",
            value=float(snap.autoscaler_busy),
        )


def _policy_families(snap: MetricsReply) -> tuple[Metric, ...]:
    """Per policy (labels ``kind``, ``policy``: its name), in force or with errors, its
    policy errors and, of them, its slow turns and spells."""
    labels = ["kind", "policy"]
    errors = _counter(
        "corral_policy_errors",
        "Policy errors: calls that raised or answered out of bounds (the fallback "
        "answered), and slow turns and spells.",
        labels,
    )
    slow = _counter(
        "corral_policy_slow",
        "Of the policy errors, the slow turns and spells (only your own scheduler "
        "policies are timed).",
        labels,
    )
    for c in snap.policy_errors:
        errors.add_metric([c.kind, c.policy], c.errors)
        slow.add_metric([c.kind, c.policy], c.slow)
    return errors, slow


def _disk_families(snap: MetricsReply) -> tuple[Metric, ...]:
    """Per connected worker (labels ``pool``, ``worker``): its disk limit, the bytes on
    it counted used and, for a worker with a limit, its disk left."""
    wk = ["pool", "worker"]
    limit = _gauge(
        "corral_worker_disk_bytes", "The worker's disk limit for outputs (0: not counted).", wk
    )
    used = _gauge(
        "corral_worker_disk_used_bytes",
        "Bytes on the worker's disk counted used: outputs, checkpoint files, copies under "
        "way (more when its file system has less free).",
        wk,
    )
    free = _gauge(
        "corral_worker_disk_free_bytes",
        "The worker's disk left for outputs as it last reported (workers with a limit).",
        wk,
    )
    for wid, d in sorted(snap.disks.items()):
        labels = [d.pool, wid]
        limit.add_metric(labels, d.disk)
        used.add_metric(labels, d.used)
        if d.free is not None:
            free.add_metric(labels, d.free)
    return limit, used, free


class NotifierCounts(Protocol):
    """What :class:`NotifierCollector` reads of a notifier: the counters of
    ``runtime.notify.AlertmanagerNotifier`` (not imported: the two modules are
    siblings of one layer)."""

    url: str
    posted: int
    errors: int
    dropped: int
    given_up: int
    refused: int
    queue_size: int

    def queue_length(self) -> int: ...


class NotifierCollector(Collector):
    """The ``corral_notifications_*`` series of the Alertmanager notifiers
    ``notifiers()`` gives (called at each scrape), labelled ``alertmanager`` (the URL
    posted to), as Prometheus' ``prometheus_notifications_*``: ``sent_total`` counts
    the alerts of every post tried, ``errors_total`` those of the posts that failed (so
    ``sent - errors`` were delivered), ``dropped_total`` the alerts lost (a full queue,
    given up after the last try, refused, left out)."""

    def __init__(self, notifiers: Callable[[], Iterable[NotifierCounts]]) -> None:
        self.notifiers = notifiers

    def collect(self) -> Iterator[Metric]:
        am = ["alertmanager"]
        sent = _counter(
            "corral_notifications_sent", "Alerts posted to Alertmanager, each try counted.", am
        )
        errors = _counter(
            "corral_notifications_errors",
            "Alerts in posts to Alertmanager that failed (no connection, timeout, HTTP error).",
            am,
        )
        dropped = _counter(
            "corral_notifications_dropped",
            "Alert notifications lost: dropped from a full queue, given up after the last "
            "try, refused by Alertmanager or left out.",
            am,
        )
        length = _gauge(
            "corral_notifications_queue_length",
            "Alert notifications not delivered yet: queued, or in a post being tried.",
            am,
        )
        capacity = _gauge(
            "corral_notifications_queue_capacity", "The most notifications queued.", am
        )
        for n in self.notifiers():
            sent.add_metric([n.url], n.posted)
            errors.add_metric([n.url], n.errors)
            dropped.add_metric([n.url], n.dropped + n.given_up + n.refused)
            length.add_metric([n.url], n.queue_length())
            capacity.add_metric([n.url], n.queue_size)
        yield from (sent, errors, dropped, length, capacity)


class RefusalCollector(Collector):
    """``corral_refused_connections_total``, labelled ``reason``: the requests the
    manager's listener refused before any frame, by why (``no token``, ``bad token``,
    ``closing``, ``cross-origin``, ...), and the connections it closed after the
    handshake (``no hello``, ``message too big``), from ``counts()`` (called at each scrape: the
    listener's ``refused_by``). Its log names the first few only (docs/transport.md)."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        refused = _counter(
            "corral_refused_connections",
            "Requests the manager's listener refused before any frame, and connections it "
            "closed for no Hello or a message too big, by reason.",
            ["reason"],
        )
        for reason, n in sorted(self.counts().items()):
            refused.add_metric([reason], n)
        yield refused


class WriterCounts(Protocol):
    """What :class:`ManagerCollector` reads of the monitoring database's writer:
    ``runtime.monitordb.MonitorWriter`` (not imported: a sibling of this layer)."""

    @property
    def path(self) -> os.PathLike[str]: ...
    @property
    def dropped(self) -> Mapping[str, int]: ...
    @property
    def pending(self) -> int: ...


def _file_bytes(path: os.PathLike[str]) -> int:
    """The bytes on disk of the SQLite file at ``path`` and of its ``-wal`` (one
    ``os.stat`` each; a file not there counts 0)."""
    total = 0
    for name in (os.fspath(path), os.fspath(path) + "-wal"):
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return total


class ManagerCollector(Collector):
    """The manager process's own health, read at each scrape: the lateness of its event
    loop (``loop_lag()``: the most seconds its ticker woke late lately) and, while it
    writes a monitoring database (``writer()`` not None), the database's bytes on disk,
    the rows queued for it and the rows dropped. (The process's RSS, CPU and open
    files are ``prometheus_client``'s ``process_*`` series, beside these.)"""

    def __init__(
        self, loop_lag: Callable[[], float], writer: Callable[[], WriterCounts | None]
    ) -> None:
        self.loop_lag = loop_lag
        self.writer = writer

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "corral_manager_loop_lag_seconds",
            "The most seconds the manager's event loop ran late in the last minute (a "
            "ticker every 0.1 s measures how late it wakes).",
            value=self.loop_lag(),
        )
        w = self.writer()
        if w is None:  # no monitoring database
            return
        yield GaugeMetricFamily(
            "corral_monitoring_db_bytes",
            "Bytes on disk of the monitoring database (the file and its -wal).",
            value=_file_bytes(w.path),
        )
        yield GaugeMetricFamily(
            "corral_monitoring_rows_pending",
            "Rows queued for the monitoring database, not written yet (its writer's backlog).",
            value=w.pending,
        )
        yield CounterMetricFamily(
            "corral_monitoring_rows_dropped",
            "Rows the monitoring database's writer dropped (a backlog past its bound, "
            "rows SQLite refused): runs.dropped_rows.",
            value=sum(dict(w.dropped).values()),  # (a copy: the writer's thread adds)
        )


Sample = tuple[str, tuple[tuple[str, str], ...]]


def samples(snapshot: MetricsReply) -> dict[Sample, float]:
    """``snapshot`` as flat samples, ``{(name, sorted (label, value) pairs): value}``,
    with the sample names ``/metrics`` shows (``_total`` of counters, ``_count`` and
    ``_sum`` of summaries): what alert rules (``actors/alerts_state.py``) read."""
    out: dict[Sample, float] = {}
    for family in SnapshotCollector(snapshot).collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


#: the most characters of a note (:func:`notes`) an alert's annotation shows
NOTE_CHARS = 1000


def notes(snapshot: MetricsReply) -> dict[Sample, str]:
    """The texts alert annotations may show beside the samples (``{{ $notes.NAME }}``,
    ``actors.alerts_state.NOTES``), by name and labels as samples are: per pool its
    latest block that failed or ended unasked, and why (``last_block_failure``: the
    first line of its detail and its last two), and while it asks for no block until
    resumed, why (``suspended_why``); its blocks asked for and not running yet, how
    many and the oldest's age (``blocks_pending``); each at most :data:`NOTE_CHARS`, on one line."""
    out: dict[Sample, str] = {}
    for pool, b in sorted(snapshot.blocks.items()):
        texts = (
            ("last_block_failure", b.last_failure),
            ("suspended_why", b.suspended_why),
            ("blocks_pending", _blocks_pending(b)),
        )
        for name, text in texts:
            if text:
                one_line = brief_detail(text).replace("\n", " / ")
                out[(name, (("pool", pool),))] = bounded_detail(one_line, NOTE_CHARS)
    return out


def _blocks_pending(b: BlockMetrics) -> str:
    """A pool's blocks asked for and not running yet, and those its batch system holds
    (suspended by a preemption, or on hold), as sentences ("" with neither)."""
    n = b.states.get("requested", 0) + b.states.get("pending", 0)
    held = b.states.get("held", 0)
    out = []
    if n and b.oldest_pending > 0:
        out.append(
            f"Its autoscaler has {n} block(s) asked for and not running yet, the oldest for "
            f"{b.oldest_pending:.0f} s: they join once their provider starts them "
            "(CorralProvisioningStuck fires past 10 minutes)."
        )
    if held:
        out.append(
            f"{held} block(s) of it are held by the batch system (suspended by a "
            "preemption, or on hold): their workers come back once it lets them run."
        )
    return " ".join(out)


def _every_sample() -> dict[str, frozenset[str]]:
    """Each sample name ``/metrics`` may show, with its labels: from a snapshot that
    has one of everything (tests/test_alerts_state.py checks it misses no family)."""
    snap = MetricsReply(
        pools={"p": PoolMetrics(wait_quantiles={"0.5": 0.0}, workers={"idle": 0})},
        categories={"c": CategoryMetrics()},
        failures=(FailureCount("c", "error", "E", 1),),
        tasks_by_state={"ready": 1},
        blocks={"p": BlockMetrics(states={"running": 1}, ends={"preempted": 1})},
        disks={"w": WorkerDiskMetrics("p", free=0)},
        policy_errors=(PolicyErrorCount("priority", "graph", 0),),
    )
    labels: dict[str, set[str]] = {}
    for name, pairs in samples(snap):
        labels.setdefault(name, set()).update(k for k, _ in pairs)
    return {name: frozenset(ls) for name, ls in labels.items()}


#: every sample name ``/metrics`` may show -> its labels (the names alert rules may use)
SAMPLE_LABELS: Mapping[str, frozenset[str]] = _every_sample()


def render(snapshot: MetricsReply, extra: Sequence[Collector] = ()) -> bytes:
    """``snapshot``, then the ``extra`` collectors' series (:class:`NotifierCollector`),
    in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)


Fetch = Callable[[], Awaitable[MetricsReply]]

#: The answer when the manager cannot give its numbers in time: Prometheus records the
#: scrape as failed (``up == 0``) and shows this text as the target's ``lastError``.
UNAVAILABLE = (
    b"corral: the scheduler did not answer in time (busy, or stopping); "
    b"this scrape has no numbers, the next one will try again\n"
)


async def _scrape(fetch: Fetch, extra: Sequence[Collector] = ()) -> tuple[int, bytes, str]:
    try:
        return 200, render(await fetch(), extra), CONTENT_TYPE_LATEST
    except (AskTimeout, ActorStopped):
        return 503, UNAVAILABLE, "text/plain"


def metrics_route(
    fetch: Fetch, extra: Sequence[Collector] = ()
) -> Callable[[str | None], Awaitable[tuple[int, bytes, str]]]:
    """The ``/metrics`` route of the manager's listener (its ``http_routes``): the
    read and admin tokens may read it (the listener refuses requests without a known
    token before this runs). ``extra``: collectors shown after the snapshot's."""

    async def route(role: str | None) -> tuple[int, bytes, str]:
        if role is not None and role not in READ_ROLES:
            return 403, b"this token may not read the metrics\n", "text/plain"
        return await _scrape(fetch, extra)

    return route


async def serve_metrics(
    host: str, port: int, fetch: Fetch, extra: Sequence[Collector] = ()
) -> tuple[web.AppRunner, int]:
    """Serve ``GET /metrics`` without authentication on ``host:port`` (port 0: any free
    one), with the ``extra`` collectors' series too. Returns the runner (``await
    runner.cleanup()`` stops it) and the port."""

    async def handle(request: web.Request) -> web.Response:
        status, body, content_type = await _scrape(fetch, extra)
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0]
    return runner, int(bound[1])
