"""Where alerts go: the notifiers of the alert monitor (``runtime/monitor.py``).

What lives here:

- :class:`Notifier`: what the monitor calls. ``notify(alert)`` takes one state change
  of an alert (pending, firing, resolved) and returns at once; a notifier that talks to
  the network does so in its own background task (``run``), never in the caller's. One
  that sends firing alerts again has ``refresh(alert)`` too: a firing alert's current
  snapshot after an evaluation that changed its numbers or texts (no post of its own).
- :class:`LogNotifier`: one structured log line per state change (``alert firing``,
  ``alert resolved``, ...), at WARNING for firing and resolved, INFO for pending.
- :class:`AlertmanagerNotifier`: Alertmanager's v2 API (``POST URL/api/v2/alerts``).
  Firing alerts are sent with ``endsAt`` a few resend periods ahead and sent again every
  ``resend`` seconds while they fire (as Prometheus does, so Alertmanager keeps them
  active and forgets them if Corral goes away); a resolved alert is sent once with
  ``endsAt`` its resolve time. Pending alerts are not sent. An orderly stop (``close``,
  from the monitor's ``on_stop``) ends the firing alerts at once with
  ``ended_by="manager stopped"`` (one post, bounded: :func:`ended_by_stop`). Posts go
  from a bounded
  queue (the oldest notifications are dropped, and counted, when it is full), with
  retries after exponential backoff with jitter, giving up on a batch after
  ``max_tries`` and logging it. A resend, and the stop's end, carry each firing
  alert's latest snapshot (``refresh``: the value, fields and annotations of the latest
  evaluation), not those it fired with. Each try sends the latest word on each alert of its
  batch (a resolve that came while the post failed replaces the firing word: an alert
  is never sent as firing once its resolve is known). Every alert carries the
  notifier's ``instance`` label (the manager's ``host:port``), so the alerts of two
  managers stay apart in one Alertmanager. Its counters (``posted``, ``errors``,
  ``dropped``, ...) are the ``corral_notifications_*`` series of ``/metrics``
  (``runtime/metrics.py``).
- :func:`alertmanager_payload`: one alert in Alertmanager's shape: labels (``alertname``,
  ``pool``, ``team``, ``priority``, ..., then the external labels such as ``instance``),
  annotations (the rule's, the dashboard link and the alert's fields as text, e.g.
  ``max_queue_size="7"``), ``startsAt``, ``endsAt``, ``generatorURL``.

docs/monitoring.md ("Notifiers and Alertmanager") describes them for users.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import math
import os
import random
import re
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import aiohttp
import anyio
import anyio.abc

from runtime.log import get_logger
from runtime.messages import AlertInfo

__all__ = [
    "AlertChanges",
    "AlertmanagerNotifier",
    "LogNotifier",
    "Notifier",
    "alertmanager_payload",
    "default_instance",
    "ended_by_stop",
    "field_text",
    "rfc3339",
]

_log = get_logger("corral", component="notify")


class Notifier(Protocol):
    """Takes alerts' state changes. ``notify`` must return at once (it runs in the
    monitor's evaluation); ``run`` is the notifier's background task, started by the
    monitor for as long as it lives (return at once when there is nothing to do).
    Optional, called when present: ``refresh(alert)``, a firing alert's current
    snapshot after an evaluation (must return at once, and post nothing of its own:
    what a notifier sends again carries it), and ``close(within=...)`` at an orderly
    stop."""

    def notify(self, alert: AlertInfo) -> None: ...

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None: ...


def field_text(value: float) -> str:
    """A field's value as text: whole numbers without a decimal point (``7``, not
    ``7.0``), others with up to 6 significant digits."""
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return f"{value:.6g}"


def rfc3339(t: float) -> str:
    """Unix time ``t`` as RFC 3339 in UTC, e.g. ``2026-12-01T20:55:00.123Z``."""
    when = datetime.datetime.fromtimestamp(t, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _summary(alert: AlertInfo) -> dict[str, Any]:
    # a firing alert says why too (its description: e.g. the latest failed block's
    # stderr); its other changes, what it is
    said = ("summary", "description", "dashboard") if alert.state == "firing" else (
        "summary", "dashboard")  # fmt: skip
    return {
        "alert": alert.name,
        **{k: v for k, v in alert.labels.items() if k != "alertname"},
        "value": round(alert.value, 3),
        **{k: round(v, 3) for k, v in alert.fields.items()},
        **{k: alert.annotations[k] for k in said if k in alert.annotations},
    }


class AlertChanges:
    """Which alerts changed state since the last look, for those that poll a manager's
    alerts (the console's ``alert watch``, a client in another process): an alert is
    known by its name, labels and ``active_since`` (a resolved alert stays listed beside
    a new one of its labels while that one is pending). Only the alerts of the latest
    look are remembered."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, tuple[tuple[str, str], ...], float | None], str] = {}

    def changed(self, alerts: Iterable[AlertInfo]) -> list[AlertInfo]:
        """The alerts of ``alerts`` whose state is new since the last call."""
        return [a for _, a in self._changes(alerts)]

    def news(self, alerts: Iterable[AlertInfo], *, first: bool) -> list[AlertInfo]:
        """What one who polls logs of the changes (a client of a manager): alerts that
        fire, and alerts that resolve, except at the ``first`` look (an old end is not
        news). An alert that fired and resolved between two looks comes twice: as it
        fired (state ``firing``, no ``resolved_at``), then as it resolved, so no
        resolution is logged whose firing was not."""
        out = []
        for was, a in self._changes(alerts):
            if a.state == "resolved" and not first and was != "firing" and a.fired_at:
                out.append(dataclasses.replace(a, state="firing", resolved_at=None))
            if a.state == "firing" or (a.state == "resolved" and not first):
                out.append(a)
        return out

    def _changes(self, alerts: Iterable[AlertInfo]) -> list[tuple[str | None, AlertInfo]]:
        out = []
        seen, self.seen = self.seen, {}
        for a in alerts:
            key = (a.name, tuple(sorted(a.labels.items())), a.active_since)
            was = seen.get(key)
            self.seen[key] = a.state
            if was != a.state:
                out.append((was, a))
        return out


class LogNotifier:
    """One log line per state change of an alert: ``alert firing`` and ``alert
    resolved`` (WARNING: a log at the manager's default level shows an alert end as it
    showed it start; only a firing alert resolves), ``alert pending`` (INFO), with its
    labels and fields, and its ``summary`` and ``dashboard`` annotations when it has
    them (firing: its ``description`` too)."""

    def __init__(self, logger: Any = None) -> None:
        self.log = logger if logger is not None else _log

    def notify(self, alert: AlertInfo) -> None:
        level = "info" if alert.state == "pending" else "warning"
        getattr(self.log, level)(f"alert {alert.state}", **_summary(alert))

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()


_LABEL = re.compile(r"[^A-Za-z0-9_]")


def alertmanager_payload(
    alert: AlertInfo,
    *,
    now: float,
    ends_in: float,
    generator_url: str = "",
    external_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``alert`` as one element of Alertmanager's ``POST /api/v2/alerts`` body.

    Labels: the alert's (``alertname`` always), then ``external_labels`` (e.g. the
    manager's ``instance``) that the alert has not (its own win, as in Prometheus), names
    made valid for Alertmanager. Annotations: the alert's, then its fields as text
    (``max_queue_size: "7"``) and ``value``. ``startsAt``: when it fired (else when it
    became active, else ``now``); ``endsAt``: its resolve time when resolved, else
    ``now + ends_in``."""
    labels = {_LABEL.sub("_", k): str(v) for k, v in alert.labels.items()}
    labels.setdefault("alertname", alert.name)
    for k, v in (external_labels or {}).items():
        labels.setdefault(_LABEL.sub("_", k), str(v))
    annotations = {_LABEL.sub("_", k): str(v) for k, v in alert.annotations.items()}
    for name, value in alert.fields.items():
        annotations[_LABEL.sub("_", name)] = field_text(value)
    annotations.setdefault("value", field_text(alert.value))
    started = alert.fired_at or alert.active_since or now
    if alert.state == "resolved":
        ends = alert.resolved_at if alert.resolved_at is not None else now
    else:
        ends = now + ends_in
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": rfc3339(started),
        "endsAt": rfc3339(max(ends, started)),
    }
    url = generator_url or alert.annotations.get("dashboard", "")
    if url:
        body["generatorURL"] = url
    return body


#: the annotation of an alert ended because its manager stopped, and its text
STOPPED_ANNOTATION = "ended_by"
STOPPED_TEXT = "manager stopped"


def ended_by_stop(alert: AlertInfo, now: float) -> AlertInfo:
    """A firing ``alert`` ended at ``now`` because its manager stops on purpose: sent to
    Alertmanager as resolved (``endsAt`` now) with the annotation ``ended_by="manager
    stopped"``. Its fields stay as its last evaluation had them (``threshold_breached=1``
    when it still held): nobody evaluates it any more, so the condition is not known
    to have cleared; the annotation says why it ended instead."""
    annotations = {**alert.annotations, STOPPED_ANNOTATION: STOPPED_TEXT}
    return dataclasses.replace(alert, state="resolved", resolved_at=now, annotations=annotations)


def _identity(alert: AlertInfo) -> tuple[tuple[str, str], ...]:
    """An alert instance as Alertmanager tells them apart: by its label set."""
    labels = dict(alert.labels)
    labels.setdefault("alertname", alert.name)
    return tuple(sorted(labels.items()))


def default_instance() -> str:
    """The ``instance`` label of a notifier not told the manager's address (an
    in-process cluster, which has no listener): ``HOST/PID``."""
    return f"{socket.gethostname()}/{os.getpid()}"


class AlertmanagerNotifier:
    """Sends firing and resolved alerts to the Alertmanager at ``url`` (its base URL,
    e.g. ``http://127.0.0.1:9093``), from its own task (:meth:`run`).

    ``resend``: seconds between sends of an alert that keeps firing (its ``endsAt`` is
    ``4 * resend`` ahead, so Alertmanager resolves it by itself if Corral stops
    sending). ``queue_size``: notifications waiting to be sent at most; when it is
    full the oldest firing one goes (:attr:`dropped`; it is sent again at the next
    resend); with only resolves queued, a new firing one waits for the resend and a
    new resolve puts the oldest off to the resend. A failed post (no
    connection, a timeout, an HTTP 5xx or 429) is tried again after ``backoff * 2**n``
    seconds (at most ``max_backoff``), that times a random factor from 0.8 to 1.2, up to
    ``max_tries`` tries; then the batch is given up and logged (:attr:`given_up`): its
    firing alerts go again at the next resend as always, and so do its resolves, until
    Alertmanager would have resolved them by itself (``4 * resend`` after they were
    given up). Other HTTP errors (4xx: Alertmanager refused the alerts) are logged and
    not retried. ``timeout``: seconds for one post. Each try sends the latest word on
    each alert of its batch: a newer word that came while it failed replaces the one in
    flight, and an alert resolved since is never sent as firing. The first failed try of
    an outage is logged at WARNING (the next ones at INFO), and the first success after
    it too.

    ``instance``: the ``instance`` label every alert gets unless it has one (the
    manager's ``host:port``, set by ``runtime/node.py`` once its listener is up;
    default :func:`default_instance`), so that the alerts of several managers stay
    apart in one Alertmanager; ``external_labels``: more labels for every alert (they
    win over ``instance``; an alert's own labels win over both).

    Counters, read by ``/metrics`` (``corral_notifications_*``, ``runtime/metrics.py``):
    :attr:`posted`, :attr:`errors`, :attr:`sent`, :attr:`dropped`, :attr:`given_up`,
    :attr:`refused`; :meth:`queue_length`."""

    def __init__(
        self,
        url: str,
        *,
        resend: float = 60.0,
        queue_size: int = 1000,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_tries: int = 8,
        timeout: float = 10.0,
        generator_url: str = "",
        instance: str | None = None,
        external_labels: Mapping[str, str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"an Alertmanager URL starts with http:// or https://, got {url!r}")
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.resend = resend
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_tries = max_tries
        self.timeout = timeout
        self.generator_url = generator_url
        self.instance = instance if instance is not None else default_instance()
        self.external_labels = dict(external_labels or {})
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size!r}")
        self.queue_size = queue_size
        #: notifications waiting, by alert (label set), oldest first: firing ones and
        #: resolved ones apart, so a full queue drops a firing one first (sent again
        #: at the next resend) and keeps a resolve (said once)
        self._firing_q: dict[tuple[tuple[str, str], ...], AlertInfo] = {}
        self._resolved_q: dict[tuple[tuple[str, str], ...], AlertInfo] = {}
        #: resolves given up, sent again at each resend until their monotonic deadline
        self._owed: dict[tuple[tuple[str, str], ...], tuple[AlertInfo, float]] = {}
        self._wake: anyio.Event | None = None  #: made by run (it needs an event loop)
        #: firing alerts by label set: sent again every ``resend`` seconds
        self.firing: dict[tuple[tuple[str, str], ...], AlertInfo] = {}
        #: the batch being posted (retried), while it is: see _latest
        self._in_flight: list[AlertInfo] = []
        self.posted = 0  #: alerts in posts tried, each try counted (as Prometheus' sent)
        self.errors = 0  #: of those, the alerts in posts that failed (refused included)
        self.sent = 0  #: alerts Alertmanager accepted
        self.dropped = 0  #: notifications dropped from a full queue
        self.given_up = 0  #: alerts given up after max_tries failed posts (or left out)
        self.refused = 0  #: alerts Alertmanager refused (HTTP 4xx: not tried again)
        self.failures: collections.deque[tuple[float, str]] = collections.deque(maxlen=100)
        """the latest failed posts: (monotonic time, why)"""
        #: monotonic time of the first failed post of the current outage (None: none)
        self.failing_since: float | None = None

    # -- the caller's side: never waits --------------------------------------------------

    def notify(self, alert: AlertInfo) -> None:
        key = _identity(alert)
        if alert.state == "firing":
            self.firing[key] = alert
        elif alert.state == "resolved":
            self.firing.pop(key, None)
        else:
            return  # pending: Alertmanager hears of an alert once it fires
        self._owed.pop(key, None)  # a newer word on it
        self._put(alert)

    def refresh(self, alert: AlertInfo) -> None:
        """``alert`` still fires, with the numbers and texts of the latest evaluation:
        its resends, a retry of its firing word and the stop's end carry them from now
        on (a firing word queued is replaced in place). Nothing is queued: an alert this
        notifier does not know as firing is left alone."""
        key = _identity(alert)
        if alert.state != "firing" or key not in self.firing:
            return
        self.firing[key] = alert
        if key in self._firing_q:
            self._firing_q[key] = alert

    def queued(self) -> list[AlertInfo]:
        """The notifications waiting to be sent, firing ones first, each oldest first."""
        return [*self._firing_q.values(), *self._resolved_q.values()]

    def queue_length(self) -> int:
        """Notifications not delivered yet: those queued and those being posted."""
        return len(self._firing_q) + len(self._resolved_q) + len(self._in_flight)

    def labels(self) -> dict[str, str]:
        """The labels every alert gets unless it has them: ``instance``, then the
        external labels."""
        return {"instance": self.instance, **self.external_labels}

    def _put(self, alert: AlertInfo) -> None:
        """Queue ``alert`` in place of any queued word on the same alert (so a resolve
        never goes out before a stale firing); constant time whatever the queue holds."""
        key = _identity(alert)
        known = self._firing_q.pop(key, None) or self._resolved_q.pop(key, None)
        if known is None and len(self._firing_q) + len(self._resolved_q) >= self.queue_size:
            self.dropped += 1
            if self._firing_q:  # the oldest firing word goes: it is sent at the resend
                del self._firing_q[next(iter(self._firing_q))]
            elif alert.state != "resolved":
                return  # only resolves queued: this firing one waits for the resend
            else:  # the oldest resolve waits for the resend
                oldest = next(iter(self._resolved_q))
                self._owe([self._resolved_q.pop(oldest)])
        (self._resolved_q if alert.state == "resolved" else self._firing_q)[key] = alert
        if self._wake is not None:
            self._wake.set()

    # -- the sender ------------------------------------------------------------------

    async def close(self, *, within: float = 2.0) -> None:
        """The manager stops on purpose: end its alerts in Alertmanager now, in one post
        tried once, at most ``within`` seconds (a down Alertmanager does not hold up the
        stop; it then resolves them itself at their ``endsAt``, logged). Each firing
        alert goes as :func:`ended_by_stop`; resolves not delivered yet (queued or
        given up) go as they are. Called after :meth:`run` was cancelled."""
        now = time.time()
        ended = {k: ended_by_stop(a, now) for k, a in self.firing.items()}
        last = {**{k: a for k, (a, _) in self._owed.items()}, **self._resolved_q, **ended}
        self.firing.clear()
        self._firing_q.clear()
        self._resolved_q.clear()
        self._owed.clear()
        if not last:
            return
        labels = self.labels()
        body = []
        for alert in last.values():
            try:
                body.append(alertmanager_payload(alert, now=now, ends_in=0.0,
                    generator_url=self.generator_url, external_labels=labels))  # fmt: skip
            except (ValueError, OverflowError, OSError, TypeError):
                self.given_up += 1
        why: str | None = "timed out"
        self.posted += len(body)
        with anyio.move_on_after(within):
            client_timeout = aiohttp.ClientTimeout(total=within)
            async with aiohttp.ClientSession(timeout=client_timeout) as session:
                why = await self._post(session, body)
        if why is None:
            self.sent += len(body)
            _log.info("alerts ended in Alertmanager: the manager stops", url=self.url,
                      alerts=len(body), ended=len(ended))  # fmt: skip
        else:
            self.errors += len(body)
            self.given_up += len(body)
            _log.warning(
                "alerts not ended in Alertmanager at the stop; it resolves them by itself "
                "at their endsAt", url=self.url, alerts=len(body), why=why,
                within=round(4 * self.resend, 3),
            )  # fmt: skip

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Send what is queued until cancelled; every ``resend`` seconds queue the
        firing alerts again."""
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._wake = wake = anyio.Event()
            task_status.started()
            next_resend = time.monotonic() + self.resend
            while True:
                if not (self._firing_q or self._resolved_q):
                    with anyio.move_on_after(max(0.0, next_resend - time.monotonic())):
                        await wake.wait()
                if time.monotonic() >= next_resend:
                    next_resend = time.monotonic() + self.resend
                    for key, alert in list(self.firing.items()):
                        if key not in self._firing_q and key not in self._resolved_q:
                            self._put(alert)
                    self._pay_owed()
                self._wake = wake = anyio.Event()
                batch = self.queued()
                if batch:
                    self._firing_q.clear()
                    self._resolved_q.clear()
                    self._in_flight = batch
                    try:
                        self._owe(await self._send(session))  # given up after failed posts
                    except Exception as exc:  # the sender goes on: this batch is lost, said
                        self.given_up += len(self._in_flight)
                        _log.error("Alertmanager notifier: alerts not delivered", url=self.url,
                                   alerts=len(self._in_flight), error=repr(exc))  # fmt: skip
                    finally:
                        self._in_flight = []

    def _owe(self, batch: list[AlertInfo]) -> None:
        """Keep the resolves of a batch given up, to send at the next resends (a firing
        alert is sent again anyway while it fires)."""
        until = time.monotonic() + 4 * self.resend  # then Alertmanager resolved it
        for alert in batch:
            if alert.state == "resolved":
                key = _identity(alert)
                self._owed[key] = (alert, self._owed.get(key, (alert, until))[1])
        while len(self._owed) > self.queue_size:
            del self._owed[next(iter(self._owed))]

    def _pay_owed(self) -> None:
        """Queue the resolves owed, but those whose alert fires again (that word is
        newer) or whose time is up."""
        owed, self._owed = self._owed, {}
        now = time.monotonic()
        for key, (alert, until) in owed.items():
            if key not in self.firing and now < until:
                self._owed[key] = (alert, until)  # kept until sent: see _owe
                if key not in self._firing_q and key not in self._resolved_q:
                    self._put(alert)

    def _latest(self, batch: list[AlertInfo]) -> list[AlertInfo]:
        """``batch`` with the latest word on each of its alerts: a newer one queued
        since (taken from the queue), else the alert's firing word while it fires, else
        its resolve. An alert in flight as firing that resolved since is never sent as
        firing: its resolve goes instead (queued or owed), or nothing."""
        out = []
        for alert in batch:
            key = _identity(alert)
            newer = self._firing_q.pop(key, None) or self._resolved_q.pop(key, None)
            if newer is None:
                if key in self.firing:
                    newer = self.firing[key]
                elif alert.state == "resolved":
                    newer = alert
                elif key in self._owed:  # its resolve, put off to the resend
                    newer = self._owed[key][0]
                else:  # resolved since, and that word is gone (dropped): say nothing
                    continue
            out.append(newer)
        return out

    async def _send(self, session: aiohttp.ClientSession) -> list[AlertInfo]:
        """Post the batch in flight (``_in_flight``), retrying, each try with the latest
        word on each of its alerts; the alerts given up ([] when delivered, or refused).
        An alert that cannot be put in Alertmanager's shape is left out (logged, given
        up), not the batch."""
        batch = self._in_flight
        for attempt in range(self.max_tries):
            batch = self._in_flight = self._latest(batch)
            now = time.time()
            body, kept = [], []
            labels = self.labels()
            for a in batch:
                try:
                    body.append(alertmanager_payload(
                        a, now=now, ends_in=4 * self.resend, generator_url=self.generator_url,
                        external_labels=labels,
                    ))  # fmt: skip
                except (ValueError, OverflowError, OSError, TypeError) as exc:
                    self.given_up += 1
                    self._owed.pop(_identity(a), None)
                    _log.error("Alertmanager notifier: an alert left out", alert=a.name,
                               labels=dict(a.labels), error=repr(exc))  # fmt: skip
                else:
                    kept.append(a)
            batch = self._in_flight = kept
            if not batch:
                return []
            self.posted += len(batch)
            why = await self._post(session, body)
            if why is None or why.startswith("refused"):
                self._recovered()  # it answered
                for alert in batch:
                    self._owed.pop(_identity(alert), None)
                if why is None:
                    self.sent += len(batch)
                else:  # not to be tried again
                    self.errors += len(batch)
                    self.refused += len(batch)
                    _log.error("Alertmanager refused alerts", url=self.url, why=why,
                               alerts=len(batch))  # fmt: skip
                return []
            self.errors += len(batch)
            self.failures.append((time.monotonic(), why))
            first = self.failing_since is None
            if first:
                self.failing_since = time.monotonic()
            if attempt + 1 < self.max_tries:
                delay = min(self.max_backoff, self.backoff * 2**attempt)
                delay *= random.uniform(0.8, 1.2)
                # the first failure of an outage stands out; the retries after it are noise
                (_log.warning if first else _log.info)(
                    "Alertmanager post failed; retrying", url=self.url, why=why,
                    retry_in=round(delay, 3), attempt=attempt + 1, alerts=len(batch),
                )  # fmt: skip
                await anyio.sleep(delay)
        self.given_up += len(batch)
        _log.error(
            "Alertmanager unreachable: alerts not delivered",
            url=self.url,
            alerts=len(batch),
            tries=self.max_tries,
            why=self.failures[-1][1] if self.failures else "",
        )
        return batch

    def _recovered(self) -> None:
        """Alertmanager answered a post: an outage, if there was one, is over (said)."""
        if self.failing_since is not None:
            _log.warning("Alertmanager reachable again", url=self.url,
                         down_for=round(time.monotonic() - self.failing_since, 3))  # fmt: skip
            self.failing_since = None

    async def _post(self, session: aiohttp.ClientSession, body: list[dict[str, Any]]) -> str | None:
        """None when Alertmanager took the alerts; else why not (``refused ...``: do
        not try again)."""
        try:
            async with session.post(self.url, json=body) as resp:
                # Any bytes: a proxy's error page need not be UTF-8.
                text = (await resp.text(errors="replace"))[:200]
                if resp.status < 300:
                    return None
                if resp.status >= 500 or resp.status == 429:
                    return f"HTTP {resp.status}: {text}"
                return f"refused: HTTP {resp.status}: {text}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"
