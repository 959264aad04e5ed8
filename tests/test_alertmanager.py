"""Alerts leave Corral for a real Alertmanager (Debian package ``prometheus-alertmanager``,
started on 127.0.0.1 by the tests; they skip without it and fail in CI): a firing alert
arrives with its labels, its fields as annotations and the dashboard link, then
resolves; the notifier retries with a growing backoff while Alertmanager is down and
delivers once it is up; a server that never answers does not hold up the monitor.

Also the payload's shape and the alerting configuration's checks, without a server."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import AlertConfigError
from runtime.messages import AlertInfo
from runtime.monitor import Monitor, alerting_config, load_alerting
from runtime.notify import (
    AlertmanagerNotifier,
    alertmanager_payload,
    default_instance,
    rfc3339,
)
from tests.helpers import ROOT, Cli, free_port, http_get, start_alertmanager, wait_until

pytestmark = pytest.mark.anyio

LIMIT = 60  # seconds any test here may take

#: the rule of these tests: any ready task fires it (at once)
QUEUED = {
    "name": "CorralQueueNonEmpty",
    "expr": "corral_queue_depth > 0",
    "labels": {"team": "ci", "priority": "P2"},
    "annotations": {"summary": "tasks of {{ $labels.pool }} wait"},
}


def _active(url: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager holds as active."""
    status, body = http_get(url + "/api/v2/alerts")
    assert status == 200, body
    alerts: list[dict[str, Any]] = json.loads(body)
    return alerts


def _named(url: str, name: str) -> list[dict[str, Any]]:
    return [a for a in _active(url) if a["labels"].get("alertname") == name]


# ----------------------------------------------------------------------------- the payload


def test_the_payload_has_alertmanagers_shape() -> None:
    firing = AlertInfo(
        "CorralQueueTime", "firing",
        labels={"alertname": "CorralQueueTime", "pool": "ci", "team": "ci", "priority": "P2"},
        annotations={"summary": "wait", "dashboard": "http://m:8786/"},
        value=7.0, active_since=1000.0, fired_at=1060.0,
        fields={"max_queue_size": 7.0, "max_queue_time_mins": 62.0, "queue_size_threshold": 0.0,
                "queue_time_threshold": 1.0, "threshold_breached": 1.0},
    )  # fmt: skip
    body = alertmanager_payload(firing, now=2000.0, ends_in=240.0)
    assert body["labels"] == {
        "alertname": "CorralQueueTime", "pool": "ci", "team": "ci", "priority": "P2"
    }  # fmt: skip
    assert body["annotations"] == {
        "summary": "wait", "dashboard": "http://m:8786/", "max_queue_size": "7",
        "max_queue_time_mins": "62", "queue_size_threshold": "0", "queue_time_threshold": "1",
        "threshold_breached": "1", "value": "7",
    }  # fmt: skip
    assert body["startsAt"] == rfc3339(1060.0) == "1970-01-01T00:17:40.000Z"
    assert body["endsAt"] == rfc3339(2240.0)  # ahead while it fires: resent before then
    assert body["generatorURL"] == "http://m:8786/"

    resolved = AlertInfo(
        "CorralQueueTime", "resolved", labels=firing.labels, fired_at=1060.0,
        resolved_at=1500.0, fields={"threshold_breached": 0.0, "max_queue_size": 7.5},
    )  # fmt: skip
    body = alertmanager_payload(resolved, now=2000.0, ends_in=240.0, generator_url="http://d/")
    assert body["endsAt"] == rfc3339(1500.0)  # the resolve time: in the past
    assert body["annotations"]["threshold_breached"] == "0"
    assert body["annotations"]["max_queue_size"] == "7.5"
    assert body["generatorURL"] == "http://d/"


def test_the_latest_word_on_an_alert_replaces_a_queued_one() -> None:
    notifier = AlertmanagerNotifier("http://127.0.0.1:9", queue_size=2)
    labels = {"alertname": "A", "pool": "p"}
    firing = AlertInfo("A", "firing", labels=labels, fired_at=1.0)
    notifier.notify(AlertInfo("A", "pending", labels=labels))  # not sent: pending
    notifier.notify(firing)
    notifier.notify(dataclasses.replace(firing, state="resolved", resolved_at=2.0))
    assert [a.state for a in notifier.queued()] == ["resolved"]  # never after a stale firing
    assert notifier.firing == {}
    for pool in ("q", "r", "s"):  # a full queue drops its oldest firing one, counted
        notifier.notify(AlertInfo("A", "firing", labels={**labels, "pool": pool}))
    # The resolve stays (said once); the firing ones dropped go again at the next
    # resend (notifier.firing keeps them).
    assert [(a.labels["pool"], a.state) for a in notifier.queued()] == [
        ("s", "firing"),
        ("p", "resolved"),
    ]
    assert notifier.dropped == 2 and sorted(k[-1][1] for k in notifier.firing) == ["q", "r", "s"]
    # Only resolves queued: a new firing word waits for the resend (it fires: it is
    # in notifier.firing); a new resolve puts the oldest off to the resend, not lost.
    only = AlertmanagerNotifier("http://127.0.0.1:9", queue_size=2)
    for pool in ("q", "r"):
        only.notify(AlertInfo("A", "resolved", labels={**labels, "pool": pool}))
    only.notify(AlertInfo("A", "firing", labels={**labels, "pool": "t"}))
    assert [a.labels["pool"] for a in only.queued()] == ["q", "r"] and only.dropped == 1
    assert [k[-1][1] for k in only.firing] == ["t"]
    only.notify(AlertInfo("A", "resolved", labels={**labels, "pool": "s"}))
    assert [a.labels["pool"] for a in only.queued()] == ["r", "s"] and only.dropped == 2
    assert [a.labels["pool"] for a, _ in only._owed.values()] == ["q"]
    with pytest.raises(ValueError, match="queue_size"):
        AlertmanagerNotifier("http://127.0.0.1:9", queue_size=0)


def test_alerting_settings_are_checked() -> None:
    with pytest.raises(AlertConfigError, match="interval"):
        alerting_config({"interval": 0})
    with pytest.raises(AlertConfigError, match="resend"):
        alerting_config({"resend": float("inf")})  # its alerts would end at no time
    with pytest.raises(
        AlertConfigError, match=r"is unknown; did you mean 'alerting\.alertmanager'\? The keys"
    ):
        alerting_config({"alertmanger": "http://x"})
    with pytest.raises(AlertConfigError, match=r"is unknown; did you mean 'alerting\.interval'"):
        alerting_config({"intervall": 5})
    with pytest.raises(AlertConfigError, match="base URL"):
        alerting_config(alertmanager="127.0.0.1:9093")
    with pytest.raises(AlertConfigError, match="leave out the API path"):  # 404 at each post
        alerting_config({"alertmanager": "http://127.0.0.1:9093/api/v2/alerts"})
    assert alerting_config(alertmanager="http://host:9093/am/").alertmanager  # a prefix is ok
    with pytest.raises(AlertConfigError, match="expr"):
        alerting_config(rules=[{"name": "x", "expr": "corral_queue_dept > 0"}])
    with pytest.raises(AlertConfigError):
        Cluster(workers=0, alerts=[{"name": "x"}])
    with pytest.raises(ValueError, match="http"):
        AlertmanagerNotifier("localhost:9093")
    config = alerting_config({"default_rules": False}, [QUEUED], alertmanager="http://a:9093")
    assert [r.name for r in config.all_rules()] == ["CorralQueueNonEmpty"]
    assert config.alertmanager == "http://a:9093"
    defaults = [r.name for r in alerting_config().all_rules()]
    assert "CorralQueueTime" in defaults and "CorralNoWorkers" in defaults


def test_a_config_file_gives_rules_and_settings(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text(
        '[alerting]\nalertmanager = "http://127.0.0.1:9093"\ninterval = 2\n'
        'dashboard_url = "http://dash/"\n\n'
        '[[alerts]]\nname = "CorralQueueTime"\n'
        'expr = "corral_queue_oldest_wait_seconds > 60"\nfor = "5m"\n'
        'labels = {team = "ci", priority = "P1"}\n'
        'action = {scale_out = {fit = true, cooldown = "2m"}}\n'
    )
    config = load_alerting(path)
    assert config.interval == 2.0 and config.dashboard_url == "http://dash/"
    rules = {r.name: r for r in config.all_rules()}
    assert rules["CorralQueueTime"].for_ == 300.0  # the file's replaces the default rule
    assert rules["CorralQueueTime"].action is not None
    assert load_alerting(path, alertmanager="http://other:1").alertmanager == "http://other:1"
    path.write_text('[[alerts]]\nname = "x"\nexpr = "corral_queue_depth > 0"\nfo = "1m"\n')
    typo = r"corral.toml: key 'fo' is unknown; did you mean 'for'\?"
    with pytest.raises(AlertConfigError, match=typo):
        load_alerting(path)


def test_external_labels_from_the_config_reach_every_alert_sent(tmp_path: Path) -> None:
    """`[alerting] external_labels` (as Prometheus's): checked as label names to
    strings, and carried by each alert the monitor's Alertmanager notifier posts,
    beside `instance`; an alert's own label of the same name wins."""
    for bad in ({"bad-name": "x"}, {"cluster": 1}, "cluster=x"):
        with pytest.raises(AlertConfigError, match=r"external_labels.*table of label names"):
            alerting_config({"external_labels": bad})
    path = tmp_path / "corral.toml"
    path.write_text(
        '[alerting]\nalertmanager = "http://127.0.0.1:9"\n'
        'external_labels = {cluster = "hpc-east", team = "ops"}\n'
    )
    config = load_alerting(path)
    assert config.external_labels == {"cluster": "hpc-east", "team": "ops"}
    monitor = Monitor(lambda: None, lambda: None, config)  # type: ignore[arg-type,return-value]
    (notifier,) = [n for n in monitor.notifiers if isinstance(n, AlertmanagerNotifier)]
    assert notifier.external_labels == {"cluster": "hpc-east", "team": "ops"}
    notifier.instance = "m:1"
    alert = AlertInfo(
        "QueueTime", "firing", labels={"alertname": "QueueTime", "pool": "cpu", "team": "ci"},
        fired_at=100.0,
    )  # fmt: skip
    labels = notifier.labels()
    posted = alertmanager_payload(alert, now=160.0, ends_in=240.0, external_labels=labels)
    assert posted["labels"] == {
        "alertname": "QueueTime", "pool": "cpu", "team": "ci", "instance": "m:1",
        "cluster": "hpc-east",
    }  # fmt: skip


def test_a_config_file_with_a_threshold_beyond_a_float_is_refused(tmp_path: Path) -> None:
    # TOML keeps the expression as text; 1e400 in it would read as infinity
    path = tmp_path / "corral.toml"
    for threshold, reads in (("1e400", ", which reads as inf"), ("nan", "")):
        path.write_text(
            f'[[alerts]]\nname = "Endless"\nexpr = "corral_queue_depth > {threshold}"\n'
        )
        with pytest.raises(AlertConfigError) as info:
            load_alerting(path)
        assert (info.value.rule, info.value.key, info.value.source) == (
            "Endless", "expr", str(path)
        )  # fmt: skip
        assert str(info.value) == (
            f"alert rule 'Endless' in {path}: key 'expr' the threshold after '>' at character "
            f"21 must be a finite number, got {threshold!r}{reads}; give a number such as 0, "
            "60 or 1.5e3. See docs/monitoring.md#alert-rules."
        )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["manager", "check"])
def test_a_bad_rule_in_the_file_stops_the_manager_and_check_before_anything(
    tmp_path: Path, command: str
) -> None:
    path = tmp_path / "corral.toml"
    path.write_text(
        '[pools.here]\nprovider = "local"\n\n'
        '[[alerts]]\nname = "Late"\nexpr = "corral_queue_oldest_wait > 60"\n'
    )
    env = dict(os.environ, CORRAL_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    flags = ["--listen", "127.0.0.1:0"] if command == "manager" else ["--no-probe"]
    done = subprocess.run(
        [sys.executable, "-m", "runtime", command, "--config", str(path), *flags],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stderr if command == "manager" else done.stdout  # check: a FAIL of its table
    if command == "check":
        said = next(line for line in said.splitlines() if line.startswith("FAIL"))
        assert said.split()[:3] == ["FAIL", "*", "alerting"], said
    assert "alert rule 'Late' in " in said, said
    assert "did you mean 'corral_queue_oldest_wait_seconds'?" in said
    assert "manager listening" not in done.stdout + done.stderr


# ----------------------------------------------------------------------------- a real Alertmanager


@pytest.mark.slow
async def test_a_firing_alert_reaches_alertmanager_then_resolves(tmp_path: Path) -> None:
    with Cli(tmp_path / "home") as cli:
        url = start_alertmanager(cli, tmp_path / "am")
        with anyio.fail_after(LIMIT):
            async with Cluster(
                workers=0, alerts=[QUEUED], alertmanager=url,
                alerting={"interval": 0.1, "default_rules": False,
                          "dashboard_url": "http://dash.example/"},
            ) as cluster:  # fmt: skip
                fut = cluster.submit(sum, [1, 2], pure=False)  # no worker: it waits
                arrived = await wait_until(
                    lambda: anyio.to_thread.run_sync(_named, url, "CorralQueueNonEmpty"),
                    "the firing alert in Alertmanager",
                    step=0.1,
                )
                (alert,) = arrived
                assert alert["labels"] == {
                    "alertname": "CorralQueueNonEmpty", "pool": "*", "team": "ci",
                    "priority": "P2", "instance": default_instance(),  # an in-process cluster
                }  # fmt: skip
                notes = alert["annotations"]
                assert notes["summary"] == "tasks of * wait"
                assert notes["max_queue_size"] == "1"
                assert notes["queue_size_threshold"] == "0"
                assert notes["threshold_breached"] == "1"
                assert notes["dashboard"] == "http://dash.example/"
                assert alert["generatorURL"] == "http://dash.example/"
                assert alert["status"]["state"] == "active"

                await cluster.scale(1)  # a worker runs the task: the queue empties
                assert await fut == 3
                await wait_until(
                    lambda: anyio.to_thread.run_sync(
                        lambda: not _named(url, "CorralQueueNonEmpty")
                    ),
                    "Alertmanager to hold the alert as resolved (no longer active)",
                    step=0.1,
                )
                reply = await cluster.alerts()
                assert [a.state for a in reply.alerts] == ["resolved"]
                monitor = cluster._plane.monitor
                (notifier,) = [n for n in monitor.notifiers if isinstance(n, AlertmanagerNotifier)]
                assert notifier.sent == 2 and notifier.given_up == 0  # firing, resolved


@pytest.mark.slow
async def test_an_alert_that_holds_from_the_start_carries_the_managers_page(
    tmp_path: Path,
) -> None:
    """A manager process whose rule holds at its first evaluation (no worker yet, no
    ``for``) and whose configuration names no dashboard: the alert's first post links
    to the manager's own page, which its listener serves (before, the first evaluation
    could come before the listener was up, and the alert went without its link). Then
    stopped on purpose, it ends the alert in Alertmanager."""
    with Cli(tmp_path / "home") as cli:
        url = start_alertmanager(cli, tmp_path / "am")
        config = tmp_path / "corral.toml"
        config.write_text(
            f'[alerting]\nalertmanager = "{url}"\ninterval = 0.1\ndefault_rules = false\n'
            '[[alerts]]\nname = "NobodyYet"\nexpr = "corral_workers_connected == 0"\n'
        )  # fmt: skip
        manager, address = cli.manager("--config", str(config))
        page = address.replace("ws://", "http://", 1).rstrip("/") + "/"
        with anyio.fail_after(LIMIT):
            (alert,) = await wait_until(
                lambda: anyio.to_thread.run_sync(_named, url, "NobodyYet"),
                "the firing alert in Alertmanager",
                step=0.1,
            )
        assert alert["annotations"]["dashboard"] == page
        assert alert["generatorURL"] == page
        # SIGTERM: an orderly stop ends the alert in Alertmanager as the manager exits
        # (before, it stayed active there for 4 resends, 4 minutes)
        await anyio.to_thread.run_sync(cli.stop, [manager])
        assert manager.returncode == 0
        assert not await anyio.to_thread.run_sync(_named, url, "NobodyYet")


@pytest.mark.slow
async def test_the_notifier_backs_off_while_alertmanager_is_down(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    notifier = AlertmanagerNotifier(url, backoff=0.1, max_backoff=5.0, max_tries=30)
    alert = AlertInfo(
        "CorralLate", "firing", labels={"alertname": "CorralLate", "pool": "p"},
        fired_at=time.time(), fields={"max_queue_size": 3.0},
    )  # fmt: skip
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run)
            notifier.notify(alert)  # returns at once; nothing listens on the port yet
            await wait_until(lambda: len(notifier.failures) >= 4, "four failed posts")
            times = [t for t, _ in notifier.failures]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            # 0.1 s x 2^n, times 0.8..1.2: each wait longer than the one before
            assert all(b > a for a, b in itertools.pairwise(gaps)), gaps
            assert all("Connect" in why for _, why in notifier.failures), notifier.failures
            assert notifier.sent == 0
            await anyio.to_thread.run_sync(start_alertmanager, cli, tmp_path / "am", port)
            (got,) = await wait_until(
                lambda: anyio.to_thread.run_sync(_named, url, "CorralLate"),
                "the alert delivered once Alertmanager is up",
                step=0.1,
            )
            assert got["annotations"]["max_queue_size"] == "3"
            assert notifier.sent == 1 and notifier.given_up == 0
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def stub_alertmanager(handle: Any) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 whose ``POST /api/v2/alerts`` is ``handle``: its
    base URL, while the block runs."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/api/v2/alerts", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _accepting(bodies: list[Any]) -> Any:
    """A stub Alertmanager's handler that accepts every post and keeps its body."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.Response(status=200)

    return handle


@pytest.mark.slow
async def test_a_reply_that_is_not_utf8_is_a_failure_and_the_sender_goes_on() -> None:
    """A proxy in front of Alertmanager answers 502 with a Latin-1 page: that try
    failed (retried), and the sender goes on and delivers once Alertmanager is back.
    Before, decoding the page raised out of the sender, which stopped for good."""
    from aiohttp import web

    bodies: list[Any] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) < 3:
            page = "Passerelle indisponible, réessayez".encode("latin-1")
            return web.Response(status=502, body=page, headers={"Content-Type": "text/html"})
        return web.Response(status=200)

    async with stub_alertmanager(handle) as url:
        with anyio.fail_after(LIMIT):
            notifier = AlertmanagerNotifier(url, backoff=0.05)
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                labels = {"alertname": "R", "pool": "cpu"}
                notifier.notify(AlertInfo("R", "firing", labels=labels, fired_at=1.0))
                await wait_until(lambda: notifier.sent == 1, "the alert delivered")
                assert [why[:8] for _, why in notifier.failures] == ["HTTP 502"] * 2
                assert "r\ufffdessayez" in notifier.failures[0][1]  # replaced, not raised
                resolved = AlertInfo("R", "resolved", labels=labels, fired_at=1.0, resolved_at=2.0)
                notifier.notify(resolved)
                await wait_until(lambda: notifier.sent == 2, "the resolve delivered")
                assert len(bodies) == 4 and bodies[-1][0]["endsAt"] == rfc3339(2.0)
                tg.cancel_scope.cancel()


async def test_a_resolve_given_up_is_sent_again_at_the_next_resend() -> None:
    """Alertmanager is down while an alert fires and resolves: both posts are given up.
    Once it is back, the next resend delivers the resolve, so the alert does not stay
    firing there until its endsAt. Before, a resolve given up was never sent again."""
    from aiohttp import web

    bodies: list[Any] = []
    up = anyio.Event()

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.Response(status=200 if up.is_set() else 503)

    async with stub_alertmanager(handle) as url:
        with anyio.fail_after(LIMIT):
            notifier = AlertmanagerNotifier(url, resend=0.5, max_tries=1)
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                labels = {"alertname": "R", "pool": "cpu"}
                firing = AlertInfo("R", "firing", labels=labels, fired_at=1.0)
                notifier.notify(firing)
                await wait_until(lambda: notifier.given_up == 1, "the firing given up")
                notifier.notify(dataclasses.replace(firing, state="resolved", resolved_at=2.0))
                await wait_until(lambda: notifier.given_up == 2, "the resolve given up")
                up.set()
                await wait_until(lambda: notifier.sent == 1, "the resolve delivered")
                assert bodies[-1] == [bodies[1][0]]  # the same resolve, sent again
                assert bodies[-1][0]["endsAt"] == rfc3339(2.0)
                tg.cancel_scope.cancel()


async def test_an_alert_that_cannot_be_sent_is_left_out_not_its_batch() -> None:
    """A resolve whose time cannot be written (year 3e12) is left out of the post,
    counted and logged; the other alerts of the batch are delivered, and it is not
    tried again at the resends. Before, the whole batch was lost with it."""
    bodies: list[Any] = []
    async with stub_alertmanager(_accepting(bodies)) as url:
        with anyio.fail_after(LIMIT):
            notifier = AlertmanagerNotifier(url, resend=0.2)
            bad = AlertInfo("B", "resolved", labels={"alertname": "B"}, resolved_at=1e20)
            good = AlertInfo("G", "firing", labels={"alertname": "G"}, fired_at=1.0)
            notifier.notify(bad)
            notifier.notify(good)
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                await wait_until(lambda: notifier.sent >= 3, "the good alert and 2 resends")
                tg.cancel_scope.cancel()
            assert notifier.given_up == 1
            assert {a["labels"]["alertname"] for body in bodies for a in body} == {"G"}


async def test_an_alertmanager_that_never_answers_does_not_hold_up_the_monitor() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with anyio.fail_after(LIMIT):
            async with Cluster(
                workers=0, alerts=[QUEUED], alertmanager=url,
                alerting={"interval": 0.1, "default_rules": False},
            ) as cluster:  # fmt: skip
                fut = cluster.submit(sum, [1, 2], pure=False)  # no worker: the alert fires
                monitor = cluster._plane.monitor
                (notifier,) = [n for n in monitor.notifiers if isinstance(n, AlertmanagerNotifier)]
                await wait_until(lambda: notifier.firing, "the alert to fire")
                start = monitor.evaluations
                # Its post hangs (a 10 s timeout) while evaluations and answers go on.
                while monitor.evaluations < start + 20:
                    with anyio.fail_after(1.0):
                        reply = await cluster.alerts()
                    assert [a.state for a in reply.alerts] == ["firing"]
                    await anyio.sleep(0.05)
                assert notifier.sent == 0 and not notifier.failures
                assert not fut.done()


@pytest.mark.slow
async def test_a_firing_alert_is_sent_again_until_it_resolves(tmp_path: Path) -> None:
    alert = AlertInfo(
        "CorralStill", "firing", labels={"alertname": "CorralStill", "pool": "p"},
        fired_at=time.time(),
    )  # fmt: skip
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        url = await anyio.to_thread.run_sync(start_alertmanager, cli, tmp_path / "am")
        notifier = AlertmanagerNotifier(url, resend=0.3)
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run)
            notifier.notify(alert)
            await wait_until(lambda: notifier.sent >= 3, "two resends of the firing alert")
            (held,) = await anyio.to_thread.run_sync(_named, url, "CorralStill")
            assert held["status"]["state"] == "active"  # endsAt 4 resends ahead
            notifier.notify(dataclasses.replace(alert, state="resolved", resolved_at=time.time()))
            sent = notifier.sent
            await wait_until(lambda: notifier.sent > sent, "the resolve sent")
            assert not notifier.firing  # no more resends
            await wait_until(
                lambda: anyio.to_thread.run_sync(lambda: not _named(url, "CorralStill")),
                "Alertmanager to hold it resolved",
                step=0.1,
            )
            tg.cancel_scope.cancel()


# ----------------------------------------------------------------------------- an orderly stop


async def test_an_orderly_stop_ends_the_firing_alerts_saying_why() -> None:
    """A manager stopped on purpose ends its firing alerts in Alertmanager at once
    (``endsAt`` the stop), with ``ended_by="manager stopped"`` and the fields of the last
    evaluation (``threshold_breached=1``: the condition was not seen to clear). Before,
    they stayed active until their ``endsAt`` (4 resends), then resolved with nothing
    saying why."""
    bodies: list[Any] = []
    async with stub_alertmanager(_accepting(bodies)) as url:
        with anyio.fail_after(LIMIT):
            async with Cluster(
                workers=0, alerts=[QUEUED], alertmanager=url,
                alerting={"interval": 0.1, "default_rules": False, "resend": 60},
            ) as cluster:  # fmt: skip
                fut = cluster.submit(sum, [1, 2], pure=False)  # no worker: the alert fires
                monitor = cluster._plane.monitor
                (notifier,) = [n for n in monitor.notifiers if isinstance(n, AlertmanagerNotifier)]
                await wait_until(lambda: notifier.sent == 1, "the firing alert delivered")
                assert not fut.done()
                before = time.time()
            (last,) = bodies[-1]
            assert len(bodies) == 2
    assert last["labels"]["alertname"] == "CorralQueueNonEmpty"
    assert last["annotations"]["ended_by"] == "manager stopped"
    assert last["annotations"]["threshold_breached"] == "1"
    assert rfc3339(before) <= last["endsAt"] <= rfc3339(time.time())
    assert notifier.sent == 2 and not notifier.firing


async def test_a_stop_does_not_wait_long_for_an_alertmanager_that_never_answers() -> None:
    """The last post of a stop is bounded (``close_timeout``, 2 s by default), not the
    10 s of a post nor its retries: an Alertmanager that never answers does not hold up
    the stop; it is logged and counted."""
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        notifier = AlertmanagerNotifier(f"http://127.0.0.1:{silent.getsockname()[1]}")
        notifier.notify(AlertInfo("R", "firing", labels={"alertname": "R"}, fired_at=1.0))
        with anyio.fail_after(LIMIT):
            started = time.monotonic()
            await notifier.close(within=0.5)
            took = time.monotonic() - started
        assert took < 5.0  # bounded by 0.5 s (+ the event loop's slack), not 10 s
        assert notifier.given_up == 1 and notifier.sent == 0 and not notifier.firing
