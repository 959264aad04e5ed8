"""The Alertmanager notifier through an outage (runtime/notify.py), against a stub
Alertmanager on 127.0.0.1 that answers 503 until told to take alerts:

- an alert that fires then resolves while Alertmanager is down arrives resolved only
  (each try sends the latest word on each alert: never firing after its resolve);
- the ``corral_notifications_*`` series of ``/metrics`` move with failures, deliveries
  and drops, and the first failure of an outage is a WARNING;
- two managers' alerts differ by their ``instance`` label, so one's resolve does not
  clear the other's alert (a real Alertmanager, as in tests/test_alertmanager.py);
- a firing alert's resends and its end at the manager's stop carry the numbers of the
  latest evaluation, not those it fired with.

Every wait is on an event or a condition, bounded by ``fail_after``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from actors.alerts_state import Evaluate
from runtime.log import get_logger
from runtime.messages import AlertInfo, MetricsReply, PoolMetrics
from runtime.metrics import NotifierCollector, render, samples
from runtime.monitor import AlertingConfig, Monitor
from runtime.notify import AlertmanagerNotifier, alertmanager_payload, rfc3339
from tests.helpers import Cli, free_port_between, http_get, start_alertmanager, wait_until

pytestmark = pytest.mark.anyio

LIMIT = 30  # seconds any test here may take

Handler = Callable[[web.Request], Awaitable[web.Response]]


@contextlib.asynccontextmanager
async def stub_alertmanager(handle: Handler, port: int = 0) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 (on ``port``; 0: any) whose ``POST /api/v2/alerts``
    is ``handle``: its base URL, while the block runs."""

    async def route(request: web.Request) -> web.Response:
        return await handle(request)

    app = web.Application()
    app.router.add_post("/api/v2/alerts", route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class Outage:
    """A stub Alertmanager's handler: 503 until :attr:`up` is set, then 200; it keeps
    each post as (status, body) and sets :attr:`failed` at the first 503, and the
    events of :meth:`next_post` at each post (before it answers)."""

    def __init__(self) -> None:
        self.up = anyio.Event()
        self.failed = anyio.Event()
        self.posts: list[tuple[int, list[dict[str, Any]]]] = []
        self._waiting: list[anyio.Event] = []

    def next_post(self) -> anyio.Event:
        """An event set when the next post comes (before it is answered)."""
        self._waiting.append(anyio.Event())
        return self._waiting[-1]

    async def __call__(self, request: web.Request) -> web.Response:
        body = await request.json()
        status = 200 if self.up.is_set() else 503
        self.posts.append((status, body))
        if status == 503:
            self.failed.set()
        waiting, self._waiting = self._waiting, []
        for event in waiting:
            event.set()
        return web.Response(status=status, text="down" if status == 503 else "")

    def accepted(self) -> list[list[dict[str, Any]]]:
        return [body for status, body in self.posts if status == 200]


def _series(*notifiers: AlertmanagerNotifier) -> dict[tuple[str, str], float]:
    """The ``corral_notifications_*`` samples ``/metrics`` shows for ``notifiers``:
    ``{(sample name, alertmanager label): value}``."""
    text = render(MetricsReply(), [NotifierCollector(lambda: notifiers)]).decode()
    return {
        (s.name, s.labels["alertmanager"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("corral_notifications_")
        for s in family.samples
    }


# ----------------------------------------------------------------------------- the outage


async def test_an_alert_that_fires_and_resolves_during_an_outage_arrives_resolved_only() -> None:
    """Alertmanager is down when an alert fires: its post fails and is retried. The
    alert resolves meanwhile; once Alertmanager is back it hears the resolve, and never
    the alert as firing (with an ``endsAt`` ahead: a page for an alert long over).
    Before, the retries resent the batch in flight as it was: the stale firing word
    went first, the resolve only after it."""
    stub = Outage()
    resolve_at = time.time() - 30
    done = anyio.Event()

    async def handle(request: web.Request) -> web.Response:
        reply = await stub(request)
        if stub.accepted() and any(a["endsAt"] == rfc3339(resolve_at) for a in stub.accepted()[-1]):
            done.set()
        return reply

    async with stub_alertmanager(handle) as url:
        notifier = AlertmanagerNotifier(url, backoff=0.02, max_backoff=0.1, max_tries=10_000)
        labels = {"alertname": "Late", "pool": "cpu"}
        firing = AlertInfo("Late", "firing", labels=labels, fired_at=resolve_at - 60)
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                notifier.notify(firing)
                await stub.failed.wait()  # its post failed: in flight, to be tried again
                notifier.notify(
                    dataclasses.replace(firing, state="resolved", resolved_at=resolve_at)
                )
                stub.up.set()
                await done.wait()  # Alertmanager took the resolve
                await wait_until(lambda: notifier.sent, "the notifier to hear it went through")
                tg.cancel_scope.cancel()
    assert stub.posts[0][0] == 503 and stub.posts[0][1][0]["startsAt"] == rfc3339(resolve_at - 60)
    # What Alertmanager took: the resolve, once; never the alert as firing.
    accepted = stub.accepted()
    assert [[a["endsAt"] for a in body] for body in accepted] == [[rfc3339(resolve_at)]], accepted
    ((alert,),) = accepted
    assert alert["labels"]["alertname"] == "Late"
    assert alert["startsAt"] == rfc3339(resolve_at - 60)
    assert alert["endsAt"] == rfc3339(resolve_at)  # in the past: resolved
    assert notifier.sent == 1 and notifier.given_up == 0 and not notifier.queued()
    assert not notifier.firing


async def test_a_word_that_comes_during_retries_replaces_the_one_in_flight() -> None:
    """While a firing alert's post fails, a newer firing word (new fields) replaces it
    in the next try; and a batch in flight does not send an alert as firing whose
    resolve was put off (a full queue of resolves): that resolve goes instead."""
    stub = Outage()
    async with stub_alertmanager(stub) as url:
        notifier = AlertmanagerNotifier(
            url, backoff=0.02, max_backoff=0.1, max_tries=10_000, queue_size=2
        )
        a = AlertInfo("A", "firing", labels={"alertname": "A"}, fired_at=1.0, fields={"n": 1.0})
        b = AlertInfo("B", "resolved", labels={"alertname": "B"}, fired_at=1.0, resolved_at=2.0)
        c = AlertInfo("C", "resolved", labels={"alertname": "C"}, fired_at=1.0, resolved_at=3.0)
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                notifier.notify(a)
                await stub.failed.wait()
                posted = stub.next_post()
                notifier.notify(dataclasses.replace(a, fields={"n": 2.0}))  # newer: n=2
                await posted.wait()  # the next try
                assert [x["annotations"]["n"] for x in stub.posts[-1][1]] == ["2"]
                # A resolves; the queue (size 2) fills with it and B's resolve, then C's
                # puts A's off to the resend: the try in flight sends it, not A firing.
                notifier.notify(dataclasses.replace(a, state="resolved", resolved_at=4.0))
                notifier.notify(b)
                notifier.notify(c)
                n = len(stub.posts)  # the tries from now on
                posted = stub.next_post()
                await posted.wait()
                stub.up.set()
                await wait_until(lambda: not notifier.queue_length(), "all delivered")
                tg.cancel_scope.cancel()
        after = [body for _, body in stub.posts[n:]]
        assert all(
            x["endsAt"] == rfc3339(4.0)
            for body in after
            for x in body
            if x["labels"]["alertname"] == "A"
        )
        delivered = {
            x["labels"]["alertname"]: x["endsAt"] for body in stub.accepted() for x in body
        }
        assert delivered == {"A": rfc3339(4.0), "B": rfc3339(2.0), "C": rfc3339(3.0)}
        assert not notifier._owed  # A's resolve, put off, was sent in the try


# ----------------------------------------------------------------------------- resends


async def _no_metrics() -> MetricsReply:
    raise AssertionError("this monitor is driven by hand")


async def test_resends_and_the_stop_carry_the_latest_evaluation_s_numbers() -> None:
    """A user audit (sre, finding 1): an alert firing for minutes was resent, and ended
    at the manager's stop, with ``value 12, max_queue_time_mins 0.4``, the numbers it
    fired with, while the queue had reached 136 s. The monitor (driven by hand) hands
    the notifier each evaluation's snapshot of a firing alert (``refresh``: no post of
    its own); the next resend and the stop's end carry it, as a receiver on
    127.0.0.1 sees."""
    stub = Outage()
    stub.up.set()
    rule = {
        "name": "ScarceQueue",
        "expr": 'corral_queue_depth{pool="gpu"} > 0 and '
        'corral_queue_oldest_wait_seconds{pool="gpu"} > 15',
        "labels": {"team": "ml"},
        "annotations": {"description": "{{ $value }} ready tasks of pool {{ $labels.pool }}"},
    }
    config = AlertingConfig(rules=(rule,), default_rules=False, dashboard_url="http://dash/")

    def gpu(depth: int, wait: float) -> Any:
        reply = MetricsReply(pools={"gpu": PoolMetrics(queue_depth=depth, oldest_wait=wait)})
        return samples(reply)

    def said(body: list[dict[str, Any]]) -> dict[str, str]:
        (alert,) = body
        notes = alert["annotations"]
        keys = ("value", "max_queue_size", "max_queue_time_mins", "description", "dashboard")
        return {k: notes[k] for k in keys if k in notes} | {
            k: notes[k] for k in ("ended_by", "threshold_breached") if k in notes
        }

    port = free_port_between(48500, 48999)
    async with stub_alertmanager(stub, port) as url:
        notifier = AlertmanagerNotifier(url, resend=0.2)
        monitor = Monitor(_no_metrics, lambda: None, config, notifiers=[notifier])
        monitor._log = get_logger("corral", actor="monitor")
        now = time.time()
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                posted = stub.next_post()
                monitor._run(Evaluate(now - 120, gpu(12, 24.0)))  # fires at once
                await posted.wait()
                assert said(stub.posts[-1][1]) == {
                    "value": "12", "max_queue_size": "12", "max_queue_time_mins": "0.4",
                    "description": "12 ready tasks of pool gpu", "dashboard": "http://dash/",
                    "threshold_breached": "1",
                }  # fmt: skip
                monitor._run(Evaluate(now - 60, gpu(4, 136.26)))
                assert notifier.queued() == []  # no post of its own
                # the next post may have been in flight already; the one after is a
                # resend made after the evaluation
                await stub.next_post().wait()
                await stub.next_post().wait()
                assert said(stub.posts[-1][1]) == {
                    "value": "4", "max_queue_size": "12", "max_queue_time_mins": "2.3",
                    "description": "4 ready tasks of pool gpu", "dashboard": "http://dash/",
                    "threshold_breached": "1",
                }  # fmt: skip
                monitor._run(Evaluate(now, gpu(5, 200.0)))
                tg.cancel_scope.cancel()
        await notifier.close(within=2.0)
        (end,) = stub.posts[-1][1]
        assert said([end]) == {
            "value": "5", "max_queue_size": "12", "max_queue_time_mins": "3.3",
            "description": "5 ready tasks of pool gpu", "dashboard": "http://dash/",
            "threshold_breached": "1", "ended_by": "manager stopped",
        }  # fmt: skip
        assert end["endsAt"] <= rfc3339(time.time())  # ended now: not ahead
        assert all(status == 200 for status, _ in stub.posts)


def test_a_refresh_replaces_the_firing_word_and_queues_nothing() -> None:
    """``refresh`` replaces a firing alert's stored snapshot, and its word still queued
    (in place); an alert the notifier does not know as firing (never heard of, or
    resolved) is left alone: nothing queued, nothing stored."""
    notifier = AlertmanagerNotifier("http://127.0.0.1:9")
    a = AlertInfo("A", "firing", labels={"alertname": "A"}, fired_at=1.0, value=1.0)
    b = AlertInfo("B", "firing", labels={"alertname": "B"}, fired_at=1.0)
    notifier.notify(a)
    notifier.notify(b)
    newer = dataclasses.replace(a, value=2.0)
    notifier.refresh(newer)
    assert notifier.queued() == [newer, b]  # A's word replaced where it was
    assert list(notifier.firing.values()) == [newer, b]
    notifier.refresh(AlertInfo("C", "firing", labels={"alertname": "C"}, fired_at=1.0))
    notifier.notify(dataclasses.replace(b, state="resolved", resolved_at=2.0))
    notifier.refresh(b)  # a late refresh of a resolved alert
    assert [(x.name, x.state) for x in notifier.queued()] == [("A", "firing"), ("B", "resolved")]
    assert list(notifier.firing.values()) == [newer]


# ----------------------------------------------------------------------------- the metrics


async def test_the_notification_series_move_with_failures_deliveries_and_drops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    stub = Outage()
    async with stub_alertmanager(stub) as url:
        notifier = AlertmanagerNotifier(url, backoff=0.02, max_backoff=0.1, max_tries=10_000)
        am = notifier.url  # the label: the URL posted to, as Prometheus'
        assert am == url + "/api/v2/alerts"
        assert _series(notifier) == {
            ("corral_notifications_sent_total", am): 0,
            ("corral_notifications_errors_total", am): 0,
            ("corral_notifications_dropped_total", am): 0,
            ("corral_notifications_queue_length", am): 0,
            ("corral_notifications_queue_capacity", am): 1000,
        }
        firing = AlertInfo("Late", "firing", labels={"alertname": "Late"}, fired_at=1.0)
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                notifier.notify(firing)
                await wait_until(
                    lambda: _series(notifier)[("corral_notifications_errors_total", am)] >= 2,
                    "two failed tries counted",
                )
                during = _series(notifier)
                assert during[("corral_notifications_queue_length", am)] == 1  # in flight
                assert during[("corral_notifications_sent_total", am)] >= 2
                assert during[("corral_notifications_dropped_total", am)] == 0
                stub.up.set()
                await wait_until(lambda: notifier.sent == 1, "the alert delivered")
                tg.cancel_scope.cancel()
        after = _series(notifier)
        tries = len(stub.posts)
        assert after[("corral_notifications_sent_total", am)] == tries  # each try counted
        assert after[("corral_notifications_errors_total", am)] == tries - 1  # all but the last
        assert after[("corral_notifications_queue_length", am)] == 0
        assert after[("corral_notifications_dropped_total", am)] == 0

        # The first failed try of the outage is a WARNING, the next ones INFO; the
        # first success after it a WARNING too.
        retries = [r for r in caplog.records if "Alertmanager post failed" in r.getMessage()]
        assert [r.levelno for r in retries] == [logging.WARNING] + [logging.INFO] * (tries - 2)
        back = [r for r in caplog.records if "Alertmanager reachable again" in r.getMessage()]
        assert [r.levelno for r in back] == [logging.WARNING]

        # Given up after its last try: dropped.
        gives_up = AlertmanagerNotifier(url, max_tries=1)
        stub.up = anyio.Event()  # down again
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                await tg.start(gives_up.run)
                gives_up.notify(firing)
                await wait_until(
                    lambda: _series(gives_up)[("corral_notifications_dropped_total", am)] == 1,
                    "the alert given up, counted as dropped",
                )
                tg.cancel_scope.cancel()
        assert _series(gives_up)[("corral_notifications_errors_total", am)] == 1

    # A full queue drops the oldest firing notification: counted.
    full = AlertmanagerNotifier("http://127.0.0.1:9", queue_size=1)
    full.notify(firing)
    full.notify(AlertInfo("Other", "firing", labels={"alertname": "Other"}, fired_at=1.0))
    got = _series(full)
    assert got[("corral_notifications_dropped_total", full.url)] == 1
    assert got[("corral_notifications_queue_length", full.url)] == 1
    assert got[("corral_notifications_queue_capacity", full.url)] == 1


# ----------------------------------------------------------------------------- two managers


async def test_two_managers_alerts_carry_their_own_instance_label() -> None:
    """The same rule fires in two managers that send to one Alertmanager: each alert
    carries its manager's ``instance``, so their label sets (Alertmanager's identity of
    an alert) differ. Before, they were the same alert there."""
    bodies: list[list[dict[str, Any]]] = []
    both = anyio.Event()

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) == 2:
            both.set()
        return web.Response(status=200)

    async with stub_alertmanager(handle) as url:
        a = AlertmanagerNotifier(url, instance="manager-a:8786")
        b = AlertmanagerNotifier(url, instance="manager-b:8786", external_labels={"env": "ci"})
        alert = AlertInfo(
            "Late", "firing", labels={"alertname": "Late", "pool": "cpu"}, fired_at=1.0
        )
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                await tg.start(a.run)
                await tg.start(b.run)
                a.notify(alert)
                b.notify(alert)
                await both.wait()
                tg.cancel_scope.cancel()
    label_sets = sorted((x["labels"] for body in bodies for x in body), key=json.dumps)
    assert label_sets == [
        {"alertname": "Late", "pool": "cpu", "instance": "manager-a:8786"},
        {"alertname": "Late", "pool": "cpu", "instance": "manager-b:8786", "env": "ci"},
    ]
    # An alert's own label wins over the manager's (as Prometheus' external labels).
    own = dataclasses.replace(alert, labels={**alert.labels, "instance": "db-1"})
    body = alertmanager_payload(own, now=2.0, ends_in=1.0, external_labels=a.labels())
    assert body["labels"]["instance"] == "db-1"


@pytest.mark.slow
async def test_one_managers_resolve_leaves_the_others_alert_firing(tmp_path: Path) -> None:
    """A real Alertmanager: managers A and B fire the same rule; A's resolve leaves B's
    alert active there."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(2 * LIMIT):
        url = await anyio.to_thread.run_sync(start_alertmanager, cli, tmp_path / "am")
        a = AlertmanagerNotifier(url, instance="manager-a:8786")
        b = AlertmanagerNotifier(url, instance="manager-b:8786")
        alert = AlertInfo("Shared", "firing", labels={"alertname": "Shared"}, fired_at=time.time())

        def active() -> list[str]:
            status, text = http_get(url + "/api/v2/alerts")
            assert status == 200, text
            return sorted(
                x["labels"].get("instance", "")
                for x in json.loads(text)
                if x["labels"]["alertname"] == "Shared"
            )

        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            await tg.start(b.run)
            a.notify(alert)
            b.notify(alert)
            await wait_until(lambda: _both_active(active), "both alerts active", step=0.1)
            a.notify(dataclasses.replace(alert, state="resolved", resolved_at=time.time()))
            await wait_until(lambda: a.sent == 2, "A's resolve delivered")
            (left,) = await wait_until(
                lambda: _unless(anyio.to_thread.run_sync(active), "manager-a:8786"),
                "A's alert resolved in Alertmanager",
                step=0.1,
            )
            assert left == ["manager-b:8786"]  # B's fires on
            tg.cancel_scope.cancel()


async def _both_active(active: Callable[[], list[str]]) -> bool:
    return await anyio.to_thread.run_sync(active) == ["manager-a:8786", "manager-b:8786"]


async def _unless(instances: Awaitable[list[str]], gone: str) -> tuple[list[str]] | None:
    """``(instances,)`` once ``gone`` is not among them (a tuple: true even when
    none is left), else None."""
    got = await instances
    return None if gone in got else (got,)


@pytest.mark.slow
async def test_a_manager_labels_its_alerts_and_exports_the_notification_series(
    tmp_path: Path,
) -> None:
    """A manager process: its alerts carry ``instance="HOST:PORT"`` of its listener,
    and its ``/metrics`` shows the failed and delivered posts."""
    stub = Outage()
    async with stub_alertmanager(stub) as url:
        config = tmp_path / "corral.toml"
        config.write_text(
            f'[alerting]\nalertmanager = "{url}"\ninterval = 0.1\ndefault_rules = false\n'
            '[[alerts]]\nname = "NobodyYet"\nexpr = "corral_workers_connected == 0"\n'
        )
        with Cli(tmp_path / "home") as cli, anyio.fail_after(2 * LIMIT):
            _, address = await anyio.to_thread.run_sync(cli.manager, "--config", str(config))
            metrics = address.replace("ws://", "http://", 1).rstrip("/") + "/metrics"
            token = cli.tokens(address)["read"]

            async def series() -> dict[str, float]:
                status, text = await anyio.to_thread.run_sync(http_get, metrics, token)
                assert status == 200, text
                return {
                    s.name: s.value
                    for f in text_string_to_metric_families(text)
                    if f.name.startswith("corral_notifications_")
                    for s in f.samples
                    if s.labels.get("alertmanager") == url + "/api/v2/alerts"
                }

            await stub.failed.wait()
            got = await wait_until(
                lambda: _when(
                    series(), lambda s: s.get("corral_notifications_errors_total", 0) >= 1
                ),
                "a failed post counted on /metrics",
                step=0.1,
            )
            assert got["corral_notifications_queue_length"] >= 1
            stub.up.set()
            got = await wait_until(
                lambda: _when(
                    series(),
                    lambda s: (
                        s["corral_notifications_sent_total"]
                        > s["corral_notifications_errors_total"]
                    ),
                ),
                "a delivered post counted on /metrics",
                step=0.1,
            )
            (alert,) = stub.accepted()[0]
            assert alert["labels"] == {
                "alertname": "NobodyYet",
                "instance": urlsplit(address).netloc,  # 127.0.0.1:PORT
            }


async def _when(
    value: Awaitable[dict[str, float]], condition: Callable[[dict[str, float]], bool]
) -> dict[str, float] | None:
    got = await value
    return got if condition(got) else None


async def test_the_log_says_an_alert_resolved_at_the_level_it_said_it_fired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At the manager's default level (WARNING) the log has an alert's firing line and
    its resolved line, not its pending one (before, resolved was INFO: an operator saw
    it fire and never resolve)."""
    from runtime.notify import LogNotifier

    caplog.set_level(logging.WARNING, logger="corral")
    pending = AlertInfo("NoWorkersYet", "pending", {"alertname": "NoWorkersYet"}, active_since=1.0)
    firing = dataclasses.replace(pending, state="firing", fired_at=2.0)
    resolved = dataclasses.replace(firing, state="resolved", resolved_at=3.0)
    log = LogNotifier()
    for alert in (pending, firing, resolved):
        log.notify(alert)
    lines = [(r.levelname, re.search("event='([^']*)'", r.getMessage())) for r in caplog.records]
    assert [(level, m and m[1]) for level, m in lines] == [
        ("WARNING", "alert firing"),
        ("WARNING", "alert resolved"),
    ]


async def test_a_poller_logs_an_alert_that_fired_and_resolved_between_two_looks() -> None:
    """``AlertChanges.news``, what a client of a manager logs as it polls: an alert it
    saw pending that has resolved by the next look fired in between, so it comes as
    firing, then as resolved (a log with a resolution whose firing it never showed
    would be a riddle); one seen firing resolves once; the first look shows only what
    fires; a pending alert is not news."""
    from runtime.notify import AlertChanges

    def alert(state: str, pool: str = "cpu", **times: float) -> AlertInfo:
        return AlertInfo("CorralNoWorkers", state, {"pool": pool}, **times)  # type: ignore[arg-type]

    changes = AlertChanges()
    old_end = alert("resolved", "gpu", fired_at=5.0, resolved_at=9.0)
    assert changes.news([alert("pending", active_since=10.0), old_end], first=True) == []
    gone = alert("resolved", active_since=10.0, fired_at=15.0, resolved_at=20.0)
    assert changes.news([gone, old_end], first=False) == [
        alert("firing", active_since=10.0, fired_at=15.0), gone,
    ]  # fmt: skip
    assert changes.news([gone, old_end], first=False) == []  # nothing new
    firing = alert("firing", active_since=30.0, fired_at=35.0)
    assert changes.news([firing], first=False) == [firing]
    again = alert("resolved", active_since=30.0, fired_at=35.0, resolved_at=40.0)
    assert changes.news([again], first=False) == [again]
    # the first look: what fires only
    assert AlertChanges().news([firing, old_end], first=True) == [firing]


def test_a_resolved_alert_beside_a_pending_one_of_its_labels_changes_nothing() -> None:
    """The alert monitor lists a resolved alert beside a new one of its labels while
    that one is pending: a poller sees the pending one come once, and nothing of the
    resolved one (which has not changed) at any look, nor when the pending one stops
    holding or fires."""
    from runtime.notify import AlertChanges

    labels = {"alertname": "CIQueueTime", "pool": "ci"}
    done = AlertInfo("CIQueueTime", "resolved", labels, active_since=30.0, fired_at=45.0,
                     resolved_at=68.0)  # fmt: skip
    again = AlertInfo("CIQueueTime", "pending", labels, active_since=139.0)
    fired = dataclasses.replace(again, state="firing", fired_at=154.0)
    watch, poll = AlertChanges(), AlertChanges()
    assert watch.changed([done]) == [done]
    assert poll.news([done], first=True) == []
    assert watch.changed([done, again]) == [again]
    assert poll.news([done, again], first=False) == []  # pending: not news
    assert watch.changed([done, again]) == []
    assert poll.news([done, again], first=False) == []
    assert watch.changed([done]) == []  # the pending one stopped holding
    assert poll.news([done], first=False) == []
    assert watch.changed([done, again]) == [again]  # (as if again: its own instance)
    assert poll.news([done, again], first=False) == []
    assert watch.changed([fired]) == [fired]  # it fires: the resolved one is not listed
    assert poll.news([fired], first=False) == [fired]
    assert len(watch.seen) == len(poll.seen) == 1  # only the latest look's alerts


def test_a_firing_alerts_log_line_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """A user audit: a client logged ``CorralBlocksFailing ... summary='Blocks of pool
    audbi keep failing'`` and nothing of why; the firing line carries the alert's
    description (for that rule, the latest failed block and its stderr's tail), the
    others only what the alert is."""
    from runtime.notify import LogNotifier

    caplog.set_level(logging.INFO, logger="corral")
    said = {"summary": "Blocks of pool audbi keep failing",
            "description": "The latest: module: command not found"}  # fmt: skip
    firing = AlertInfo("CorralBlocksFailing", "firing", {"pool": "audbi"}, said, fired_at=2.0)
    resolved = dataclasses.replace(firing, state="resolved", resolved_at=3.0)
    log = LogNotifier()
    for alert in (firing, resolved):
        log.notify(alert)
    fired, ended = (r.getMessage() for r in caplog.records)
    assert "description='The latest: module: command not found'" in fired
    assert "summary='Blocks of pool audbi keep failing'" in ended and "description" not in ended
