"""The alert monitor: a thin actor over the pure alert core (``actors/alerts_state.py``).

What lives here:

- :class:`AlertingConfig`: the alerting settings of a cluster (rules as data, whether
  the default rules apply, the evaluation interval, the Alertmanager URL, the dashboard
  link), checked when made (:func:`alerting_config`, from a manager's TOML file's
  ``[alerting]`` and ``[[alerts]]`` tables or from ``Cluster(alerts=..., alertmanager=...)``).
- :class:`Monitor`: every ``interval`` seconds it takes a metrics snapshot (the
  manager's ``MetricsRequest``, bounded), flattens it (:func:`runtime.metrics.samples`),
  feeds ``Evaluate(now, samples)`` to the core and carries out its commands: ``Notify``
  goes to every notifier (``runtime/notify.py``: they never block), ``Refresh`` (a
  firing alert's current numbers) to each that has ``refresh``, ``Scale`` is a
  ``ScaleRequest`` to the autoscaler, or a ``RestoreRequest`` for a ``restore`` (asked
  in the background, bounded; its answer goes back to the core), ``Audit`` is a
  WARNING log line ``alert action`` kept (the latest 100) for the console, and as data
  (numbered ``AuditInfo``) for the monitoring database's recorder. It answers
  ``AlertsRequest`` and changes its rules live on ``AlertRuleAdd`` /
  ``AlertRuleRemove`` (a bad rule: ``AlertConfigError`` to the asker).
  Told the cluster stops (``ClusterStopping``, an orderly stop's first step) its alerts
  hold still (the core's ``Stopping``). When it stops (the manager's orderly stop) it
  warns of the rules changed live, which are not kept, and has each notifier end its
  firing alerts (bounded).
  As it starts, it asks the configured Alertmanager once whether it answers, in the
  background (``runtime.preflight.probe_alertmanager``, bounded; nothing waits for it):
  a WARNING naming the URL and what to do when it does not, an INFO when it does, so a
  wrong URL is known before the first alert fires.

A slow or stuck metrics fetch skips that evaluation; a notifier that cannot reach its
server retries in its own task. Nothing here waits without a bound in a handler.
docs/monitoring.md ("Configuring alerts", "Notifiers and Alertmanager", "Remediation
audit") describes it for users.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio

from actors.alerts_state import (
    DEFAULT_RULES,
    DUPLICATE_RULE,
    AlertRule,
    AlertState,
    Audit,
    Evaluate,
    Notify,
    Refresh,
    RuleAdded,
    RuleRemoved,
    Scale,
    ScaleDone,
    Stopping,
    parse_rule,
    parse_rules,
    pool_warnings,
)
from actors.pools import read_config
from runtime.errors import ActorStopped, AlertConfigError, Refusals, did_you_mean
from runtime.kernel import Actor, ActorRef, handles
from runtime.messages import (
    AlertInfo,
    AlertRuleAdd,
    AlertRuleRemove,
    AlertsReply,
    AlertsRequest,
    AuditInfo,
    ClusterStopping,
    Message,
    MetricsReply,
    RestoreRequest,
    ScaleRequest,
    WorkerArrived,
    message,
)
from runtime.metrics import SAMPLE_LABELS, notes, samples
from runtime.notify import AlertmanagerNotifier, LogNotifier, Notifier

__all__ = [
    "AUDIT_LINES",
    "DEFAULT_ALERTING",
    "AlertingConfig",
    "DashboardAt",
    "Monitor",
    "alerting_config",
    "load_alerting",
    "replaced_rule",
]

#: audit lines the monitor keeps for ``AlertsReply.audit``
AUDIT_LINES = 100

#: seconds at least between the start of an evaluation and one brought forward by a
#: worker's arrival (``WorkerArrived``)
ARRIVAL_GAP = 0.5

#: the keys of ``[alerting]``
#: a Prometheus label name
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ALERTING_KEYS = (
    "alertmanager", "interval", "default_rules", "dashboard_url", "resend", "external_labels",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class AlertingConfig:
    """A cluster's alerting. ``rules``: rule data (each as in a ``[[alerts]]`` table),
    checked; ``default_rules``: whether Corral's default rules apply too (a rule of
    yours with the same name replaces the default one); ``interval``: seconds between
    evaluations; ``alertmanager``: the base URL of an Alertmanager to send alerts to
    (None: none); ``dashboard_url``: the link put in each alert's ``dashboard``
    annotation (empty: the manager's own page, when it has an HTTP listener);
    ``resend``: seconds between sends of a firing alert to Alertmanager; ``pools``:
    the cluster's pools, which a rule's scale-out must name one of (None: not known)."""

    rules: tuple[Mapping[str, Any], ...] = ()
    default_rules: bool = True
    interval: float = 5.0
    alertmanager: str | None = None
    dashboard_url: str = ""
    resend: float = 60.0
    pools: tuple[str, ...] | None = None
    #: labels added to every alert sent to Alertmanager (as Prometheus's
    #: ``external_labels``), beside ``instance``; an alert's own label wins
    external_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def all_rules(self) -> list[AlertRule]:
        """The rules in force at start (the defaults, then these; one of these with a
        default rule's name replaces it), parsed: :class:`AlertConfigError` for a bad
        one."""
        by_name = self._defaults()
        for rule in parse_rules(list(self.rules), SAMPLE_LABELS, pools=self.pools):
            by_name[rule.name] = rule
        return list(by_name.values())

    def _defaults(self) -> dict[str, AlertRule]:
        """The default rules in force, by name (none with ``default_rules`` off)."""
        rules = parse_rules(DEFAULT_RULES, SAMPLE_LABELS) if self.default_rules else []
        return {rule.name: rule for rule in rules}

    def replaced_defaults(self) -> list[tuple[str, str]]:
        """For each of these rules named as a default rule (``default_rules`` on), which
        it replaces whole, what ``check --config`` says (a WARN): that it does, and
        what of the default's labels and annotations it drops (:func:`replaced_rule`),
        and what to do to keep both (another name). The manager itself says nothing of
        it: replacing a default is how its threshold is changed."""
        defaults = self._defaults()
        said = []
        for rule in parse_rules(list(self.rules), SAMPLE_LABELS, pools=self.pools):
            old = defaults.get(rule.name)
            if old is None:
                continue
            dropped = replaced_rule(old, rule)
            labels = ", ".join(f"{k}={v}" for k, v in dropped["dropped_labels"].items())
            annotations = ", ".join(dropped["dropped_annotations"])
            drops = [f"its {kind} {names}" for kind, names in (("labels", labels),
                     ("annotations", annotations)) if names]  # fmt: skip
            what = f"; yours drops {' and '.join(drops)}" if drops else (
                "; yours gives all its labels and annotations again")  # fmt: skip
            said.append((
                f"alert rule {rule.name!r} replaces the default rule {old.name!r}: the "
                f"default does not run, and nothing of it is kept{what}",
                f"To run both, give yours another name than {old.name!r}; to replace it, "
                "give again what you keep of it (its labels and annotations: "
                "docs/monitoring.md#default-rules)",
            ))  # fmt: skip
        return said

    def warnings(self) -> list[str]:
        """What may keep a rule from ever firing though it is valid (a ``pool="X"`` of
        no configured pool: :func:`~actors.alerts_state.pool_warnings`), a line each
        naming the rule: the manager logs them as it starts, ``check --config`` shows them."""
        return [
            f"alert rule {rule.name!r}: {text}"
            for rule in self.all_rules()
            for text in pool_warnings(rule, self.pools)
        ]


#: what a cluster gets unless told otherwise: the default rules, logged
DEFAULT_ALERTING = AlertingConfig()


#: the section of docs/monitoring.md on notifiers (the ``alertmanager`` setting)
_NOTIFIERS = "notifiers-and-alertmanager"


def _problem(key: str, text: str, source: str) -> AlertConfigError:
    return AlertConfigError("", f"alerting.{key}", text, source)


def alerting_config(
    settings: Mapping[str, Any] | None = None,
    rules: Sequence[Mapping[str, Any]] = (),
    *,
    alertmanager: str | None = None,
    source: str = "",
    pools: Sequence[str] | None = None,
    flag: str = "--alertmanager",
    refuse: Refusals | None = None,
) -> AlertingConfig:
    """Check and build an :class:`AlertingConfig` from an ``[alerting]`` table
    (``settings``) and ``[[alerts]]`` tables (``rules``); ``alertmanager`` (the
    manager's ``--alertmanager`` flag, named ``flag`` in an error) overrides the
    table's; ``pools``: the cluster's pools, when known (a rule's scale-out of another
    pool is refused). Raises :class:`~runtime.errors.AlertConfigError` naming the key
    and what is allowed; a ``refuse`` that keeps them keeps every problem instead (each
    unknown key and each bad value of ``settings``, each rule's problems: see
    :meth:`~runtime.errors.Refusals.per_key`), and the configuration returned leaves
    out what it refused (its defaults taken, the refused rules left out)."""
    refuse = refuse or Refusals()
    raw = dict(settings or {})
    keys = ", ".join(ALERTING_KEYS)
    refuse.unknown(raw, ALERTING_KEYS, lambda key: _problem(
        key, f"is unknown{did_you_mean(key, ALERTING_KEYS, '.', prefix='alerting.')} The "
        f"keys are: {keys}", source
    ))  # fmt: skip
    checked, _ = refuse.per_key(
        lambda fields: _settings(fields, alertmanager, source, flag),
        raw,
        lambda err: err.key.removeprefix("alerting."),
    )
    if not isinstance(rules, Sequence) or isinstance(rules, str | bytes):
        raise AlertConfigError("", "", f"must be a list of tables, got {rules!r}")
    return dataclasses.replace(
        checked or _settings({}, None, source, flag),
        rules=_rules(rules, pools, source, refuse),
        pools=None if pools is None else tuple(pools),
    )


def _settings(
    raw: Mapping[str, Any], alertmanager: str | None, source: str, flag: str
) -> AlertingConfig:
    """The ``[alerting]`` settings of :func:`alerting_config` (no rules yet): an
    :class:`~runtime.errors.AlertConfigError` for the first bad value."""
    interval = raw.get("interval", 5.0)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, int | float)
        or not math.isfinite(interval)
        or interval <= 0
    ):
        raise _problem("interval", f"must be a number of seconds > 0, got {interval!r}", source)
    resend = raw.get("resend", 60.0)
    if (
        isinstance(resend, bool)
        or not isinstance(resend, int | float)
        or not math.isfinite(resend)
        or not resend > 0
    ):
        raise _problem("resend", f"must be a number of seconds > 0, got {resend!r}", source)
    default_rules = raw.get("default_rules", True)
    if not isinstance(default_rules, bool):
        raise _problem("default_rules", f"must be true or false, got {default_rules!r}", source)
    url = alertmanager if alertmanager is not None else raw.get("alertmanager")
    base = f"must be Alertmanager's base URL, e.g. 'http://127.0.0.1:9093', got {url!r}"
    if url is not None and "/api/" in urlsplit(str(url)).path:
        base += ": leave out the API path (Corral posts to URL/api/v2/alerts)"
    elif isinstance(url, str) and url.startswith(("http://", "https://")):
        base = ""
    if url is not None and base:
        if alertmanager is not None:  # the caller's, not the file's
            raise AlertConfigError("", "", f"{flag} {base}", see=_NOTIFIERS)
        raise AlertConfigError("", "alerting.alertmanager", base, source, see=_NOTIFIERS)
    dashboard = raw.get("dashboard_url", "")
    if not isinstance(dashboard, str):
        raise _problem("dashboard_url", f"must be a URL as a string, got {dashboard!r}", source)
    external = raw.get("external_labels", {})
    if not isinstance(external, Mapping) or not all(
        isinstance(k, str) and _LABEL_NAME.fullmatch(k) and isinstance(v, str)
        for k, v in external.items()
    ):
        raise _problem(
            "external_labels",
            "must be a table of label names to strings, e.g. external_labels = "
            f'{{cluster = "hpc-east"}}, got {external!r}',
            source,
        )
    return AlertingConfig(
        default_rules=default_rules,
        interval=float(interval),
        alertmanager=url or None,
        dashboard_url=dashboard,
        resend=float(resend),
        external_labels=dict(external),
    )


def _rules(
    rules: Sequence[Mapping[str, Any]], pools: Sequence[str] | None, source: str, refuse: Refusals
) -> tuple[dict[str, Any], ...]:
    """The ``[[alerts]]`` rules of :func:`alerting_config`, every one checked now, not
    at start: the first problem raised, or, kept, each rule's problems (a rule with
    one is left out) and each name two rules share."""

    def sourced(err: AlertConfigError) -> AlertConfigError:
        return AlertConfigError(err.rule, err.key, err.problem, source, err.see) if source else err

    if not refuse.keep:
        try:
            parse_rules(rules, SAMPLE_LABELS, pools=pools)
        except AlertConfigError as err:
            raise sourced(err) from None
        return tuple(dict(r) for r in rules)
    kept: list[dict[str, Any]] = []
    for position, rule in enumerate(rules, 1):

        def check(fields: Mapping[str, Any], position: int = position) -> AlertRule:
            try:
                return parse_rule(fields, SAMPLE_LABELS, pools=pools, position=position)
            except AlertConfigError as err:
                raise sourced(err) from None

        if not isinstance(rule, Mapping):
            try:
                check(rule)
            except AlertConfigError as err:
                refuse(err)
            continue
        # A rule without its name or expr is not checked further (its other keys' words
        # need them).
        _, refused = refuse.per_key(check, rule, lambda err: err.key, final=("", "name", "expr"))
        if not refused:
            kept.append(dict(rule))
    names = [r.get("name") for r in rules if isinstance(r, Mapping)]
    for name in dict.fromkeys(n for n in names if isinstance(n, str) and names.count(n) > 1):
        refuse(sourced(AlertConfigError(name, "name", DUPLICATE_RULE)))
    return tuple(r for r in kept if names.count(r.get("name")) == 1)


def load_alerting(
    path: str | os.PathLike[str],
    *,
    alertmanager: str | None = None,
    refuse: Refusals | None = None,
) -> AlertingConfig:
    """The alerting of a manager's configuration file (its ``[alerting]`` table and
    ``[[alerts]]`` tables; the defaults without them), checked; ``alertmanager`` (the
    ``--alertmanager`` flag) overrides the file's; ``refuse`` as for
    :func:`alerting_config`."""
    data = read_config(path, refuse)
    rules = data.get("alerts", [])
    if not isinstance(rules, list):
        raise AlertConfigError(
            "", "alerts", f"rules go in [[alerts]] tables (a list), got {rules!r}", str(path)
        )
    settings = data.get("alerting", {})
    if not isinstance(settings, Mapping):
        raise AlertConfigError("", "alerting", "must be a table [alerting]", str(path))
    pools = data.get("pools")  # none: a manager that scales nothing (not checked)
    return alerting_config(
        settings, rules, alertmanager=alertmanager, source=str(path),
        pools=[str(p) for p in pools] if isinstance(pools, Mapping) else None, refuse=refuse,
    )  # fmt: skip


def replaced_rule(old: AlertRule, new: AlertRule) -> dict[str, Any]:
    """What a rule added in place of ``old`` (of the same name) leaves out of it: nothing
    of the old rule is kept implicitly, so its labels (``dropped_labels``, name -> value)
    and annotations (``dropped_annotations``, names) that ``new`` does not give are gone
    (a ``team`` label an Alertmanager route matches on, a ``summary``). ``rule``: the name
    replaced. The answer of :meth:`Monitor.add_rule` carries it as ``replaced``."""
    return {
        "rule": old.name,
        "dropped_labels": {k: v for k, v in old.labels.items() if k not in new.labels},
        "dropped_annotations": [k for k in old.annotations if k not in new.annotations],
    }


@message(local=True)
class DashboardAt(Message):
    """-> monitor: the dashboard's URL, once the manager's listener is up (used for
    alerts' ``dashboard`` annotation unless the configuration gives one)."""

    url: str


@message(local=True)
class _Sampled(Message):
    now: float
    samples: Any
    notes: Any = None


@message(local=True)
class _ScaleAnswered(Message):
    cmd: Any
    error: str


Fetch = Callable[[], Awaitable[MetricsReply]]


class Monitor(Actor):
    """Evaluates the alert rules on the cluster's metrics; see the module's doc.

    ``metrics``: gets one snapshot (bounded here by ``fetch_timeout``, default the
    interval, at least 1 s); ``autoscaler``: the autoscaler's reference, or None
    (a rule's scale action then fails, audited); ``notifiers``: default a
    :class:`~runtime.notify.LogNotifier`, plus an
    :class:`~runtime.notify.AlertmanagerNotifier` when the configuration names one.
    ``dashboard_wait``: at most this many seconds the first evaluation waits for the
    dashboard's URL (:class:`DashboardAt`, once the manager's listener is up) when the
    configuration names none, so that an alert that holds from the start carries its
    link from its first notification on (0: it does not wait; no dashboard comes).
    ``close_timeout``: seconds an orderly stop gives each notifier to end the firing
    alerts (:meth:`on_stop`). ``probe_timeout``: seconds the probe of the configured
    Alertmanager at start may take (:meth:`_probe_alertmanager`, in the background;
    None: ``runtime.preflight.ALERTMANAGER_TIMEOUT``)."""

    def __init__(
        self,
        metrics: Fetch,
        autoscaler: Callable[[], ActorRef[Any] | None],
        config: AlertingConfig | None = None,
        *,
        notifiers: Sequence[Notifier] | None = None,
        fetch_timeout: float | None = None,
        scale_timeout: float = 10.0,
        dashboard_wait: float = 0.0,
        close_timeout: float = 2.0,
        probe_timeout: float | None = None,
    ) -> None:
        self.config = config = config or AlertingConfig()
        self.probe_timeout = probe_timeout
        self.dashboard_wait = dashboard_wait
        self._dashboard_known: anyio.Event | None = None
        #: set by a worker's arrival (:class:`WorkerArrived`): the next evaluation is now
        self._arrived: anyio.Event | None = None
        self._metrics = metrics
        self._autoscaler = autoscaler
        self.interval = config.interval
        self.fetch_timeout = fetch_timeout or max(1.0, config.interval)
        self.scale_timeout = scale_timeout
        self.close_timeout = close_timeout
        self.state = AlertState(config.all_rules())
        if notifiers is None:
            notifiers = [LogNotifier()]
            if config.alertmanager:
                notifiers.append(
                    AlertmanagerNotifier(
                        config.alertmanager,
                        resend=config.resend,
                        external_labels=config.external_labels,
                    )
                )
        self.notifiers = list(notifiers)
        self.dashboard_url = config.dashboard_url
        self.audit: collections.deque[str] = collections.deque(maxlen=AUDIT_LINES)
        #: the same entries as data, numbered (``AlertsReply.actions``: the recorder
        #: writes them to the monitoring database's ``actions``)
        self.actions: collections.deque[AuditInfo] = collections.deque(maxlen=AUDIT_LINES)
        self.audited = 0  #: audit entries made (the latest one's ``seq``)
        self.evaluations = 0  #: evaluations done
        self.skipped = 0  #: evaluations skipped: no metrics in time
        self.failed = 0  #: evaluations that raised (logged; the next one runs as usual)

    async def on_start(self) -> None:
        for line in self.config.warnings():
            self.log.warning(line)
        self._dashboard_known = anyio.Event()
        self._arrived = anyio.Event()
        for notifier in self.notifiers:
            self.start_soon(notifier.run)
        if self.config.alertmanager:
            self.start_soon(self._probe_alertmanager, self.config.alertmanager)
        self.start_soon(self._sample)

    async def _probe_alertmanager(self, url: str) -> None:
        """Once, as the monitor starts, in its own task (nothing waits for it; at most
        ``probe_timeout`` seconds): whether the Alertmanager at ``url`` answers, logged
        (WARNING with what to do when it does not: its posts would fail only when an
        alert fires, during the incident)."""
        # imported here, not with this module: runtime.client imports this one, and an
        # embedded cluster's start imports runtime.preflight in a thread (its
        # _START_MODULES), so importing runtime.client does not
        from runtime.preflight import ALERTMANAGER_ADVICE, ALERTMANAGER_TIMEOUT, probe_alertmanager

        within = ALERTMANAGER_TIMEOUT if self.probe_timeout is None else self.probe_timeout
        answers, said = await probe_alertmanager(url, within)
        if answers:
            self.log.info("Alertmanager answers", url=url, answer=said)
        else:
            self.log.warning(
                "Alertmanager does not answer", url=url, why=said, advice=ALERTMANAGER_ADVICE
            )

    async def on_stop(self) -> None:
        """An orderly stop: say which rules the console changed (they are not kept),
        then end the firing alerts in Alertmanager (each notifier's ``close``, bounded:
        see :meth:`~runtime.notify.AlertmanagerNotifier.close`)."""
        changed = self.console_changes()
        if changed:
            self.log.warning(
                "alert rules changed from the console are lost at this stop", rules=changed,
                advice="put the rules to keep in the [[alerts]] of the manager's --config "
                "file; see docs/console.md#alert",
            )  # fmt: skip
        for notifier in self.notifiers:
            close = getattr(notifier, "close", None)
            if close is None:
                continue
            try:
                with anyio.move_on_after(self.close_timeout + 1.0):
                    await close(within=self.close_timeout)
            except Exception as exc:  # the stop goes on
                self.log.error("notifier failed to close", notifier=type(notifier).__name__,
                               error=repr(exc))  # fmt: skip

    def console_changes(self) -> list[str]:
        """The rules added, replaced or removed since the start (from the console), as
        ``added NAME``, ``replaced NAME``, ``removed NAME``."""
        at_start = {r.name: r.to_dict() for r in self.config.all_rules()}
        now = {name: r.to_dict() for name, r in self.state.rules.items()}
        out = [f"added {n}" for n in now if n not in at_start]
        out += [f"replaced {n}" for n in now if n in at_start and now[n] != at_start[n]]
        out += [f"removed {n}" for n in at_start if n not in now]
        return out

    async def _sample(self) -> None:
        """Every ``interval`` seconds: a snapshot (bounded), handed to the actor; the
        first once the dashboard's URL is known (at most ``dashboard_wait`` seconds)."""
        if self.dashboard_wait > 0 and not self.dashboard_url and self._dashboard_known:
            with anyio.move_on_after(self.dashboard_wait):
                await self._dashboard_known.wait()
        while True:
            started = time.monotonic()
            snap: MetricsReply | None = None
            with anyio.move_on_after(self.fetch_timeout):
                try:
                    snap = await self._metrics()
                except Exception as exc:  # the manager is stopping, or busy
                    self.log.info("alert evaluation skipped: no metrics", why=repr(exc))
            if self.ref.mailbox.closed:
                return
            try:
                if snap is None:
                    self.skipped += 1
                else:
                    self.ref.post(_Sampled(time.time(), samples(snap), notes(snap)))
            except ActorStopped:
                return
            except Exception as exc:  # a snapshot that cannot be read: the next one may
                self.skipped += 1
                self.log.error("alert evaluation skipped: bad metrics", error=repr(exc))
            await self._next_evaluation(started)

    async def _next_evaluation(self, started: float) -> None:
        """Wait until the next evaluation is due: ``interval`` seconds after the one
        that ``started``, or sooner when a worker arrived meanwhile (not sooner than
        :data:`ARRIVAL_GAP` after it, so a fleet joining at once costs a snapshot per
        gap, not one per worker)."""
        arrived = self._arrived
        if arrived is None:  # (not started: no arrival to wait for)
            await anyio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
            return
        with anyio.move_on_after(max(0.0, self.interval - (time.monotonic() - started))):
            await arrived.wait()
            await anyio.sleep(max(0.0, ARRIVAL_GAP - (time.monotonic() - started)))
        if arrived.is_set():
            self._arrived = anyio.Event()

    # -- the core's commands ---------------------------------------------------------

    def _run(self, *events: Any) -> None:
        for cmd in self.state.handle(*events):
            if isinstance(cmd, Notify):
                self._notify(cmd.alert)
            elif isinstance(cmd, Refresh):
                self._notify(cmd.alert, refresh=True)
            elif isinstance(cmd, Scale):
                self.start_soon(self._scale, cmd)
            elif isinstance(cmd, Audit):
                self._audit(cmd)
            else:  # pragma: no cover - a command this shell does not know
                raise TypeError(f"the monitor has no shell for {type(cmd).__name__}")

    def _notify(self, alert: AlertInfo, *, refresh: bool = False) -> None:
        """Hand ``alert`` to each notifier: a change of state (``notify``), or with
        ``refresh`` a firing alert's current snapshot (``refresh``, to those that have it)."""
        if self.dashboard_url and not alert.annotations.get("dashboard", "").strip():
            alert = dataclasses.replace(
                alert, annotations={**alert.annotations, "dashboard": self.dashboard_url}
            )
        for notifier in self.notifiers:
            take = getattr(notifier, "refresh", None) if refresh else notifier.notify
            if take is None:
                continue
            try:
                take(alert)
            except Exception as exc:  # one broken notifier must not stop the others
                self.log.error("notifier failed", notifier=type(notifier).__name__,
                               error=repr(exc))  # fmt: skip

    def _audit(self, cmd: Audit) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cmd.now))
        self.audit.append(f"{stamp} {cmd.line}")
        self.audited += 1
        self.actions.append(
            AuditInfo(
                self.audited, cmd.now, cmd.line, cmd.rule, dict(cmd.labels), cmd.pool,
                cmd.action, cmd.before, cmd.after, cmd.why,
            )
        )  # fmt: skip
        self.log.warning("alert action", audit=cmd.line)

    async def _scale(self, cmd: Scale) -> None:
        """Ask the autoscaler (bounded); how it went goes back to the core."""
        error = ""
        autoscaler = self._autoscaler()
        if autoscaler is None:
            error = "this cluster has no autoscaler"
        else:
            try:
                ask = RestoreRequest if cmd.restore else ScaleRequest
                await autoscaler.ask(ask(cmd.target, cmd.pool), timeout=self.scale_timeout)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(ActorStopped):
            self.ref.post(_ScaleAnswered(cmd, error))

    # -- handlers --------------------------------------------------------------------

    async def on_restart(self) -> None:
        """Keep the rules, alerts and helper tasks: a restart drops only the message
        whose handler failed."""

    @handles(_Sampled)
    def sampled(self, msg: _Sampled) -> None:
        self.evaluations += 1
        try:
            self._run(Evaluate(msg.now, msg.samples, msg.notes or {}))
        except Exception as exc:  # alerting must never take the cluster down
            self.failed += 1
            self.log.error("alert evaluation failed", error=repr(exc), exc_info=True)

    @handles(_ScaleAnswered)
    def scale_answered(self, msg: _ScaleAnswered) -> None:
        if not msg.error:
            self.log.info("alert action done", pool=msg.cmd.pool, target=msg.cmd.target)
        self._run(ScaleDone(msg.cmd.pool, not msg.error, msg.error, time.time(), msg.cmd.rule))

    @handles(WorkerArrived)
    def worker_arrived(self, msg: WorkerArrived) -> None:
        if self._arrived is not None:
            self._arrived.set()

    @handles(DashboardAt)
    def dashboard_at(self, msg: DashboardAt) -> None:
        if not self.config.dashboard_url:
            self.dashboard_url = msg.url
        if self._dashboard_known is not None:
            self._dashboard_known.set()

    @handles(ClusterStopping)
    def cluster_stopping(self, msg: ClusterStopping) -> None:
        """The cluster stops on purpose: its alerts hold still from now (the stop that
        follows neither resolves, fires nor scales); they end with the run."""
        self._run(Stopping(time.time()))

    @handles(AlertsRequest)
    def alerts(self, msg: AlertsRequest) -> AlertsReply:
        alerts = tuple(self.state.alerts())
        if self.dashboard_url:
            alerts = tuple(
                a
                if a.annotations.get("dashboard", "").strip()
                else dataclasses.replace(
                    a, annotations={**a.annotations, "dashboard": self.dashboard_url}
                )
                for a in alerts
            )
        rules = tuple(r.to_dict() for r in self.state.rules.values())
        return AlertsReply(alerts, rules, tuple(self.audit), tuple(self.actions))

    @handles(AlertRuleAdd)
    def add_rule(self, msg: AlertRuleAdd) -> dict[str, Any]:
        if not isinstance(msg.rule, Mapping):
            raise AlertConfigError("", "", f"a rule is a table of settings, got {msg.rule!r}")
        pools = self.config.pools
        if pools is None:  # not configured: the pools the autoscaler reports, if any
            pools = tuple(self.state.pools()) or None
        rule = parse_rule(dict(msg.rule), SAMPLE_LABELS, pools=pools)
        warnings = pool_warnings(rule, pools)
        old = self.state.rules.get(rule.name)
        replaced = None if old is None else replaced_rule(old, rule)
        self._run(RuleAdded(rule, replace=True, now=time.time()))
        # an operator's change: info, unless the rule may not do what it says
        (self.log.warning if warnings else self.log.info)(
            "alert rule added", rule=rule.name, expr=rule.expr,
            **({"warnings": warnings} if warnings else {}),
            **({"replaced": replaced} if replaced is not None else {}),
        )  # fmt: skip
        reply = rule.to_dict()
        if warnings:
            reply["warnings"] = warnings
        if replaced is not None:
            reply["replaced"] = replaced
        return reply

    @handles(AlertRuleRemove)
    def remove_rule(self, msg: AlertRuleRemove) -> list[str]:
        names = list(self.state.rules)
        if msg.name not in names:
            raise AlertConfigError(
                msg.name, "", f"there is no such rule; the rules are: {', '.join(names) or 'none'}"
            )
        self._run(RuleRemoved(msg.name, now=time.time()))
        self.log.info("alert rule removed", rule=msg.name)
        return list(self.state.rules)
