"""Where alerts go: the notifiers of the alert monitor (``runtime/monitor.py``).

What lives here:

- :class:`Notifier`: what the monitor calls. ``notify(alert)`` takes one state change
  of an alert (pending, firing, resolved) and returns at once; a notifier that talks to
  the network does so in its own background task (``run``), never in the caller's.
- :class:`LogNotifier`: one structured log line per state change (``alert firing``,
  ``alert resolved``, ...), at WARNING for firing, else INFO.
- :class:`AlertmanagerNotifier`: Alertmanager's v2 API (``POST URL/api/v2/alerts``).
  Firing alerts are sent with ``endsAt`` a few resend periods ahead and sent again every
  ``resend`` seconds while they fire (as Prometheus does, so Alertmanager keeps them
  active and forgets them if Corral goes away); a resolved alert is sent once with
  ``endsAt`` its resolve time. Pending alerts are not sent. Posts go from a bounded
  queue (the oldest notifications are dropped, and counted, when it is full), with
  retries after exponential backoff with jitter, giving up on a batch after
  ``max_tries`` and logging it.
- :func:`alertmanager_payload`: one alert in Alertmanager's shape: labels (``alertname``,
  ``pool``, ``team``, ``priority``, ...), annotations (the rule's, the dashboard link and
  the alert's fields as text, e.g. ``max_queue_size="7"``), ``startsAt``, ``endsAt``,
  ``generatorURL``.

docs/monitoring.md ("Notifiers and Alertmanager") describes them for users.
"""

from __future__ import annotations

import collections
import datetime
import math
import random
import re
import time
from collections.abc import Iterable
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
    "field_text",
    "rfc3339",
]

_log = get_logger("corral", component="notify")


class Notifier(Protocol):
    """Takes alerts' state changes. ``notify`` must return at once (it runs in the
    monitor's evaluation); ``run`` is the notifier's background task, started by the
    monitor for as long as it lives (return at once when there is nothing to do)."""

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
    return {
        "alert": alert.name,
        **{k: v for k, v in alert.labels.items() if k != "alertname"},
        "value": round(alert.value, 3),
        **{k: round(v, 3) for k, v in alert.fields.items()},
        **{k: alert.annotations[k] for k in ("summary", "dashboard") if k in alert.annotations},
    }


class AlertChanges:
    """Which alerts changed state since the last look, for those that poll a manager's
    alerts (the console's ``alert watch``, a client in another process): an alert is
    known by its name and labels."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def changed(self, alerts: Iterable[AlertInfo]) -> list[AlertInfo]:
        """The alerts of ``alerts`` whose state is new since the last call."""
        out = []
        for a in alerts:
            key = (a.name, tuple(sorted(a.labels.items())))
            if self.seen.get(key) != a.state:
                self.seen[key] = a.state
                out.append(a)
        return out


class LogNotifier:
    """One log line per state change of an alert: ``alert firing`` (WARNING),
    ``alert pending`` and ``alert resolved`` (INFO), with its labels and fields, and
    its ``summary`` and ``dashboard`` annotations when it has them."""

    def __init__(self, logger: Any = None) -> None:
        self.log = logger if logger is not None else _log

    def notify(self, alert: AlertInfo) -> None:
        level = "warning" if alert.state == "firing" else "info"
        getattr(self.log, level)(f"alert {alert.state}", **_summary(alert))

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()


_LABEL = re.compile(r"[^A-Za-z0-9_]")


def alertmanager_payload(
    alert: AlertInfo, *, now: float, ends_in: float, generator_url: str = ""
) -> dict[str, Any]:
    """``alert`` as one element of Alertmanager's ``POST /api/v2/alerts`` body.

    Labels: the alert's (``alertname`` always), names made valid for Alertmanager.
    Annotations: the alert's, then its fields as text (``max_queue_size: "7"``) and
    ``value``. ``startsAt``: when it fired (else when it became active, else ``now``);
    ``endsAt``: its resolve time when resolved, else ``now + ends_in``."""
    labels = {_LABEL.sub("_", k): str(v) for k, v in alert.labels.items()}
    labels.setdefault("alertname", alert.name)
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


def _identity(alert: AlertInfo) -> tuple[tuple[str, str], ...]:
    """An alert instance as Alertmanager tells them apart: by its label set."""
    labels = dict(alert.labels)
    labels.setdefault("alertname", alert.name)
    return tuple(sorted(labels.items()))


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
    seconds (at most ``max_backoff``) times a random factor from 0.8 to 1.2, up to
    ``max_tries`` tries; then the batch is given up and logged (:attr:`given_up`): its
    firing alerts go again at the next resend as always, and so do its resolves, until
    Alertmanager would have resolved them by itself (``4 * resend`` after they were
    given up). Other HTTP errors (4xx: Alertmanager refused the alerts) are logged and
    not retried. ``timeout``: seconds for one post."""

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
        self.sent = 0  #: alerts Alertmanager accepted
        self.dropped = 0  #: notifications dropped from a full queue
        self.given_up = 0  #: alerts given up after max_tries failed posts
        self.failures: collections.deque[tuple[float, str]] = collections.deque(maxlen=100)
        """the latest failed posts: (monotonic time, why)"""

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

    def queued(self) -> list[AlertInfo]:
        """The notifications waiting to be sent, firing ones first, each oldest first."""
        return [*self._firing_q.values(), *self._resolved_q.values()]

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
                    try:
                        if not await self._send(session, batch):
                            self._owe(batch)  # given up after failed posts
                    except Exception as exc:  # the sender goes on: this batch is lost, said
                        self.given_up += len(batch)
                        _log.error("Alertmanager notifier: alerts not delivered",
                                   url=self.url, alerts=len(batch), error=repr(exc))  # fmt: skip

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

    async def _send(self, session: aiohttp.ClientSession, batch: list[AlertInfo]) -> bool:
        """Post ``batch``, retrying; False when it was given up. An alert that cannot
        be put in Alertmanager's shape is left out (logged, given up), not the batch."""
        for attempt in range(self.max_tries):
            now = time.time()
            body, kept = [], []
            for a in batch:
                try:
                    body.append(alertmanager_payload(
                        a, now=now, ends_in=4 * self.resend, generator_url=self.generator_url
                    ))  # fmt: skip
                except (ValueError, OverflowError, OSError, TypeError) as exc:
                    self.given_up += 1
                    self._owed.pop(_identity(a), None)
                    _log.error("Alertmanager notifier: an alert left out", alert=a.name,
                               labels=dict(a.labels), error=repr(exc))  # fmt: skip
                else:
                    kept.append(a)
            batch = kept
            if not batch:
                return True
            why = await self._post(session, body)
            if why is None or why.startswith("refused"):
                for alert in batch:
                    self._owed.pop(_identity(alert), None)
                if why is None:
                    self.sent += len(batch)
                else:  # not to be tried again
                    _log.error("Alertmanager refused alerts", url=self.url, why=why,
                               alerts=len(batch))  # fmt: skip
                return True
            self.failures.append((time.monotonic(), why))
            if attempt + 1 < self.max_tries:
                delay = min(self.max_backoff, self.backoff * 2**attempt)
                delay *= random.uniform(0.8, 1.2)
                _log.info("Alertmanager post failed; retrying", url=self.url, why=why,
                          retry_in=round(delay, 3), attempt=attempt + 1)  # fmt: skip
                await anyio.sleep(delay)
        self.given_up += len(batch)
        _log.error(
            "Alertmanager unreachable: alerts not delivered",
            url=self.url,
            alerts=len(batch),
            tries=self.max_tries,
            why=self.failures[-1][1] if self.failures else "",
        )
        return False

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
