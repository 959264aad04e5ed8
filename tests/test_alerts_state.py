"""The alert core on a virtual clock: rules parsed from data (typed errors with the closest
name), expressions over the /metrics names, states pending -> firing -> resolved, the
fields of the users' queue alert, and scale-out actions with their bounds and audit."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from prometheus_client.parser import text_string_to_metric_families

from actors.alerts_state import (
    DEFAULT_RULES,
    AlertRule,
    AlertState,
    Audit,
    Command,
    Evaluate,
    Notify,
    Refresh,
    RuleAdded,
    RuleRemoved,
    Samples,
    Scale,
    ScaleDone,
    ScaleOut,
    compares,
    parse_duration,
    parse_rule,
    parse_rules,
)
from actors.autoscaler_state import (
    AutoscalerState,
    BlockEnded,
    BlockStarted,
    BlockStartFailed,
    StartBlock,
    TargetSet,
)
from actors.providers import BlockSpec
from policies.scaling import PoolLimits
from runtime.errors import AlertConfigError
from runtime.messages import (
    AlertInfo,
    BlockMetrics,
    CategoryMetrics,
    FailureCount,
    MetricsReply,
    PoolMetrics,
    WorkerDiskMetrics,
)
from runtime.metrics import (
    SAMPLE_LABELS,
    ManagerCollector,
    RefusalCollector,
    SnapshotCollector,
    render,
    samples,
)

QUEUE = {
    "name": "QueueTime",
    "expr": "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 60",
    "for": "1m",
    "labels": {"team": "ci", "priority": "P2"},
    "annotations": {
        "summary": "pool {{ $labels.pool }}: {{ $value }} tasks wait",
        "dashboard": "http://manager:8786/",
    },
}


def rule(raw: dict[str, Any] | None = None, /, **changes: Any) -> AlertRule:
    d = dict(QUEUE if raw is None else raw)
    d.update(changes)
    return parse_rule(d, SAMPLE_LABELS)


def snap(
    pools: dict[str, dict[str, Any]] | None = None,
    blocks: dict[str, dict[str, Any]] | None = None,
    workers: int = 0,
) -> Samples:
    """Samples as the manager's /metrics would show them."""
    reply = MetricsReply(
        pools={p: PoolMetrics(**kw) for p, kw in (pools or {}).items()},
        blocks={p: BlockMetrics(**kw) for p, kw in (blocks or {}).items()},
        workers=workers,
    )
    return samples(reply)


def queue(depth: int, wait: float, pool: str = "cpu", running: int = 0, **blocks: Any) -> Samples:
    workers = {"idle": 0, "busy": 1, "draining": 0}
    b = {pool: blocks} if blocks else None
    p = {"queue_depth": depth, "oldest_wait": wait, "running": running, "workers": workers}
    return snap({pool: p}, b)


def notes(cmds: list[Command]) -> list[tuple[str, str, dict[str, str]]]:
    return [(c.alert.name, c.alert.state, c.alert.labels) for c in cmds if isinstance(c, Notify)]


def only(cmds: list[Command], kind: type) -> list[Any]:
    return [c for c in cmds if isinstance(c, kind)]


# ----------------------------------------------------------------------------- states


def test_pending_then_firing_after_for_with_the_queue_fields() -> None:
    st = AlertState([rule()])
    cmds = st.handle(Evaluate(1000.0, queue(3, 61.0)))
    (n,) = only(cmds, Notify)
    assert n.alert.state == "pending"
    assert n.alert.active_since == 1000.0 and n.alert.fired_at is None
    assert n.alert.labels == {"alertname": "QueueTime", "pool": "cpu", "team": "ci",
                              "priority": "P2"}  # fmt: skip
    assert n.alert.annotations == {"summary": "pool cpu: 3 tasks wait",
                                   "dashboard": "http://manager:8786/"}  # fmt: skip
    assert st.handle(Evaluate(1030.0, queue(7, 91.0))) == []
    assert st.handle(Evaluate(1059.9, queue(5, 120.9))) == []  # not yet 60 s
    (n,) = only(st.handle(Evaluate(1060.0, queue(4, 121.0))), Notify)
    assert n.alert.state == "firing" and n.alert.fired_at == 1060.0
    assert n.alert.value == 4
    assert n.alert.fields == {
        "max_queue_size": 7.0,
        "max_queue_time_mins": 2.0,
        "queue_size_threshold": 0.0,
        "queue_time_threshold": 1.0,
        "threshold_breached": 1.0,
    }
    # firing goes on: no notification, its current numbers for the resends
    (r,) = st.handle(Evaluate(4000.0, queue(2, 3720.0)))
    (info,) = st.alerts()
    assert r == Refresh(info)
    assert info.fields["max_queue_time_mins"] == 62.0
    assert info.fields["max_queue_size"] == 7.0
    assert st.handle(Evaluate(4005.0, queue(2, 3720.0))) == []  # nothing moved: quiet
    (n,) = only(st.handle(Evaluate(4010.0, queue(0, 0.0))), Notify)
    assert n.alert.state == "resolved" and n.alert.resolved_at == 4010.0
    assert n.alert.fields == {
        "max_queue_size": 7.0,
        "max_queue_time_mins": 62.0,
        "queue_size_threshold": 0.0,
        "queue_time_threshold": 1.0,
        "threshold_breached": 0.0,
    }


def test_a_firing_alert_s_new_numbers_go_to_the_notifiers_without_a_notification() -> None:
    """A user audit (sre, finding 1): every Alertmanager resend of a long incident, and
    the end at the manager's stop, showed the value and ``max_queue_time_mins`` the
    alert fired with, since the notifiers heard of an alert only when its state changed.
    After each evaluation a firing alert whose value, fields or annotations moved is a
    :class:`Refresh` with its current snapshot (not a notification); one that did not
    move, and a pending one, say nothing; its resolve is a :class:`Notify` alone."""
    st = AlertState([rule()])
    labels = {"alertname": "QueueTime", "pool": "cpu", "team": "ci", "priority": "P2"}

    def alert(state: Any, value: float, mins: float, size: float, **kw: Any) -> AlertInfo:
        fields = {"queue_size_threshold": 0.0, "queue_time_threshold": 1.0,
                  "threshold_breached": 1.0 if state != "resolved" else 0.0,
                  "max_queue_time_mins": mins, "max_queue_size": size}  # fmt: skip
        annotations = {"summary": f"pool cpu: {value:g} tasks wait",
                       "dashboard": "http://manager:8786/"}  # fmt: skip
        return AlertInfo("QueueTime", state, labels, annotations, value, 0.0, 60.0,
                         fields=fields, **kw)  # fmt: skip

    (n,) = st.handle(Evaluate(0.0, queue(3, 61.0)))
    assert isinstance(n, Notify) and n.alert.state == "pending"
    assert st.handle(Evaluate(30.0, queue(5, 91.0))) == []  # pending: it moved, unsaid
    assert st.handle(Evaluate(60.0, queue(12, 121.0))) == [Notify(alert("firing", 12, 2, 12))]
    assert st.handle(Evaluate(65.0, queue(12, 121.0))) == []  # nothing moved
    assert st.handle(Evaluate(120.0, queue(4, 181.0))) == [Refresh(alert("firing", 4, 3, 12))]
    assert st.handle(Evaluate(125.0, queue(4, 150.0))) == []  # under its max: no move
    assert st.handle(Evaluate(180.0, queue(9, 3725.0))) == [Refresh(alert("firing", 9, 62.1, 12))]
    resolved = alert("resolved", 9, 62.1, 12, resolved_at=190.0)
    assert st.handle(Evaluate(190.0, queue(0, 0.0))) == [Notify(resolved)]
    assert st.handle(Evaluate(200.0, queue(0, 0.0))) == []


def test_minutes_round_to_a_tenth() -> None:
    st = AlertState([rule(**{"for": 0})])
    st.handle(Evaluate(0.0, queue(1, 3725.0)))
    assert st.alerts()[0].fields["max_queue_time_mins"] == 62.1


def test_the_default_queue_rule_s_description_is_true_while_pending() -> None:
    """A user audit (sre, finding 6): while ``CorralQueueTime`` was pending its
    description said "... for more than a minute now", a minute before it fired. The
    text says what holds, and when the alert fires, the same in both states."""
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralQueueTime"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    said = "9 ready tasks of pool gpu; the oldest has waited over a minute (the alert fires "
    said += "once that has held for a minute). Why one waits: `tasks --state queued` in the "
    said += "console lists them, and `story KEY` says why (every core of its pool busy, blocks "
    said += "not running yet, the pool at its max_blocks, no worker with the cores or memory it "
    said += "asks for). To scale the pool out on this alert, copy the rule under another name "
    said += "with a scale_out action."
    (n,) = only(st.handle(Evaluate(0.0, queue(9, 61.0, pool="gpu"))), Notify)
    assert (n.alert.state, n.alert.annotations["description"]) == ("pending", said)
    (n,) = only(st.handle(Evaluate(60.0, queue(9, 121.0, pool="gpu"))), Notify)
    assert (n.alert.state, n.alert.annotations["description"]) == ("firing", said)


@pytest.mark.parametrize(
    ("threshold", "wait", "texts"),
    [
        (2, 2.5, ("0.033", "0.042")),  # was 0 and 0: "no threshold"
        (15, 24.0, ("0.25", "0.4")),  # was 0.2 (12 s) and 0.4
        (20, 57.6, ("0.33", "0.96")),  # was 0.3 (18 s) and 1
        (60, 3725.0, ("1", "62.1")),  # a minute and more: to a tenth, as before
        (90, 121.0, ("1.5", "2")),
    ],
)
def test_queue_times_under_a_minute_keep_two_significant_digits(
    threshold: int, wait: float, texts: tuple[str, str]
) -> None:
    """A user audit (sre, finding 4): queue-time fields were rounded to a tenth of a
    minute, so a ``> 2`` s rule said ``queue_time_threshold=0`` and ``> 15`` s said
    0.2. Below a minute they keep two significant digits; from a minute on, a tenth.
    The texts are what Alertmanager's annotations and the console's line show."""
    from runtime.console import alert_line, jsonable
    from runtime.notify import field_text

    expr = f"corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > {threshold}"
    st = AlertState([rule(expr=expr, **{"for": 0})])
    (n,) = only(st.handle(Evaluate(0.0, queue(1, wait))), Notify)
    fields = n.alert.fields
    got = (field_text(fields["queue_time_threshold"]), field_text(fields["max_queue_time_mins"]))
    assert got == texts
    line = alert_line(jsonable(n.alert))
    assert f"max_queue_time_mins={texts[1]} " in line
    assert f"queue_time_threshold={texts[0]} " in line


def test_pending_that_clears_is_dropped_without_notification() -> None:
    st = AlertState([rule()])
    assert notes(st.handle(Evaluate(0.0, queue(3, 61.0))))[0][1] == "pending"
    assert st.handle(Evaluate(30.0, queue(3, 10.0))) == []
    assert st.alerts() == []
    # holds again: a new pending alert, counted from now
    (n,) = only(st.handle(Evaluate(40.0, queue(3, 61.0))), Notify)
    assert n.alert.state == "pending" and n.alert.active_since == 40.0
    assert st.handle(Evaluate(99.0, queue(3, 61.0))) == []
    assert notes(st.handle(Evaluate(100.0, queue(3, 61.0))))[0][1] == "firing"


def test_for_zero_fires_at_once() -> None:
    st = AlertState([rule(**{"for": 0})])
    assert notes(st.handle(Evaluate(5.0, queue(1, 61.0)))) == [
        ("QueueTime", "firing", {"alertname": "QueueTime", "pool": "cpu", "team": "ci",
                                 "priority": "P2"}),
    ]  # fmt: skip


def test_keep_firing_for_holds_the_alert_after_the_condition_clears() -> None:
    st = AlertState([rule(**{"for": 0, "keep_firing_for": "30s"})])
    st.handle(Evaluate(0.0, queue(1, 61.0)))
    assert st.handle(Evaluate(10.0, queue(0, 0.0))) == []  # cleared at 10: keeps firing
    assert st.handle(Evaluate(35.0, queue(1, 61.0))) == []  # holds again: no new notification
    assert st.handle(Evaluate(40.0, queue(0, 0.0))) == []
    assert st.handle(Evaluate(64.9, queue(0, 0.0))) == []  # 29.9 s since it last held (35)
    (n,) = only(st.handle(Evaluate(65.0, queue(0, 0.0))), Notify)
    assert (n.alert.state, n.alert.resolved_at) == ("resolved", 65.0)


def test_resolved_stays_visible_then_is_forgotten() -> None:
    st = AlertState([rule(**{"for": 0})], resolved_for=600.0)
    st.handle(Evaluate(0.0, queue(1, 61.0)))
    st.handle(Evaluate(10.0, queue(0, 0.0)))
    assert [a.state for a in st.alerts()] == ["resolved"]
    st.handle(Evaluate(609.0, queue(0, 0.0)))
    assert [a.state for a in st.alerts()] == ["resolved"]
    st.handle(Evaluate(610.0, queue(0, 0.0)))
    assert st.alerts() == []


def test_a_resolved_alert_that_holds_again_starts_over() -> None:
    st = AlertState([rule(**{"for": 0})])
    st.handle(Evaluate(0.0, queue(9, 61.0)))
    st.handle(Evaluate(10.0, queue(0, 0.0)))
    (n,) = only(st.handle(Evaluate(20.0, queue(2, 70.0))), Notify)
    assert n.alert.state == "firing" and n.alert.active_since == 20.0
    assert n.alert.fields["max_queue_size"] == 2.0  # the new alert's own maximum
    assert n.alert.resolved_at is None


CI_QUEUE = {
    "name": "CIQueueTime",
    "expr": 'corral_queue_depth{pool="ci"} > 0 and '
    'corral_queue_oldest_wait_seconds{pool="ci"} > 10',
    "for": "15s",
}


def test_a_resolved_alert_stays_listed_while_its_labels_go_pending_again() -> None:
    """A user audit: CIQueueTime fired and resolved twice, then went pending and stopped
    holding before it fired; ``alert list`` no longer listed it, 4 minutes after it last
    fired (the resolved alert had been replaced by the pending one, then dropped with it).
    The resolved alert stays listed its 15 minutes: while a new one of its labels is
    pending, both (the resolved one first); once the new one fires, that one. The
    notifications are as before: the pending span that ends says nothing."""
    st = AlertState([rule(CI_QUEUE)])

    def at(t: float, depth: int, wait: float) -> list[tuple[str, str, float | None]]:
        cmds = st.handle(Evaluate(t, queue(depth, wait, pool="ci")))
        return [(c.alert.state, c.alert.name, c.alert.active_since) for c in only(cmds, Notify)]

    def listed() -> list[tuple[str, float | None, float | None, float | None]]:
        return [(a.state, a.active_since, a.fired_at, a.resolved_at) for a in st.alerts()]

    assert at(30.0, 2, 11.0) == [("pending", "CIQueueTime", 30.0)]
    assert at(45.0, 2, 26.0) == [("firing", "CIQueueTime", 30.0)]
    assert at(68.0, 0, 0.0) == [("resolved", "CIQueueTime", 30.0)]
    # holds again: the new alert pending, listed after the resolved one
    assert at(139.0, 1, 12.0) == [("pending", "CIQueueTime", 139.0)]
    assert listed() == [("resolved", 30.0, 45.0, 68.0), ("pending", 139.0, None, None)]
    # it fires: it is what those labels are now
    assert at(154.0, 1, 27.0) == [("firing", "CIQueueTime", 139.0)]
    assert listed() == [("firing", 139.0, 154.0, None)]
    assert at(168.0, 0, 0.0) == [("resolved", "CIQueueTime", 139.0)]
    # a third burst: pending, and it stops holding before it fires (no notification)
    assert at(306.0, 3, 11.0) == [("pending", "CIQueueTime", 306.0)]
    assert listed() == [("resolved", 139.0, 154.0, 168.0), ("pending", 306.0, None, None)]
    assert at(319.0, 0, 0.0) == []
    assert listed() == [("resolved", 139.0, 154.0, 168.0)]
    assert at(560.0, 0, 0.0) == []  # 4 minutes after it last fired: still listed
    assert listed() == [("resolved", 139.0, 154.0, 168.0)]
    assert at(1067.9, 0, 0.0) == []
    assert len(st.alerts()) == 1
    assert at(1068.0, 0, 0.0) == []  # its 15 minutes are over
    assert st.alerts() == []


def test_a_resolved_alert_kept_beside_a_pending_one_ends_on_time() -> None:
    """The resolved alert kept beside a pending one of its labels is forgotten at its
    own time; a pending one dropped with its rule leaves it listed."""
    st = AlertState([rule(CI_QUEUE)], resolved_for=100.0)
    st.handle(Evaluate(0.0, queue(1, 11.0, pool="ci")), Evaluate(15.0, queue(1, 26.0, pool="ci")))
    st.handle(Evaluate(20.0, queue(0, 0.0, pool="ci")))  # resolved at 20
    st.handle(Evaluate(110.0, queue(1, 11.0, pool="ci")))  # pending at 110
    assert [a.state for a in st.alerts()] == ["resolved", "pending"]
    assert st.handle(Evaluate(120.0, queue(1, 21.0, pool="ci"))) == []  # 100 s since 20
    assert [(a.state, a.active_since) for a in st.alerts()] == [("pending", 110.0)]

    st = AlertState([rule(CI_QUEUE)])
    st.handle(Evaluate(0.0, queue(1, 11.0, pool="ci")), Evaluate(15.0, queue(1, 26.0, pool="ci")))
    st.handle(Evaluate(20.0, queue(0, 0.0, pool="ci")), Evaluate(30.0, queue(1, 11.0, pool="ci")))
    assert st.handle(RuleRemoved("CIQueueTime", 31.0)) == []
    assert [(a.state, a.resolved_at) for a in st.alerts()] == [("resolved", 20.0)]


def test_one_alert_per_pool() -> None:
    st = AlertState([rule(**{"for": 0})])
    workers = {"idle": 0, "busy": 1, "draining": 0}
    s = snap({
        "cpu": {"queue_depth": 4, "oldest_wait": 100.0, "workers": workers},
        "gpu": {"queue_depth": 2, "oldest_wait": 30.0, "workers": workers},
        "big": {"queue_depth": 1, "oldest_wait": 900.0, "workers": workers},
    })  # fmt: skip
    cmds = st.handle(Evaluate(0.0, s))
    assert [(n[2]["pool"], n[1]) for n in notes(cmds)] == [("big", "firing"), ("cpu", "firing")]
    assert [a.labels["pool"] for a in st.alerts()] == ["big", "cpu"]
    s = snap({"cpu": {"queue_depth": 4, "oldest_wait": 160.0, "workers": workers}})
    assert [(n[2]["pool"], n[1]) for n in notes(st.handle(Evaluate(60.0, s)))] == [
        ("big", "resolved")
    ]


# ----------------------------------------------------------------------------- expressions


def no_workers() -> AlertRule:
    (r,) = [parse_rule(d, SAMPLE_LABELS) for d in DEFAULT_RULES if d["name"] == "CorralNoWorkers"]
    return r


def test_no_workers_says_when_the_pools_blocks_are_on_their_way() -> None:
    """A pool scaling from zero whose blocks take longer than two minutes to start (cloud
    machines, a batch queue) fires CorralNoWorkers while they are pending (an ops audit:
    blocks pending 150 s). Its description then says they are asked for, how many and
    for how long, and which alert tells when that is too long; without pending blocks,
    it ends after its first sentence."""
    from runtime.metrics import notes as block_notes

    st = AlertState([no_workers()])
    idle = {"idle": 0, "busy": 0, "draining": 0}
    pool = {"queue_depth": 2, "workers": idle}
    pending = MetricsReply(
        pools={"cloud": PoolMetrics(**pool)},
        blocks={"cloud": BlockMetrics(states={"pending": 2}, oldest_pending=150.4)},
    )
    st.handle(Evaluate(0.0, samples(pending), block_notes(pending)))
    (n,) = only(st.handle(Evaluate(120.0, samples(pending), block_notes(pending))), Notify)
    assert (n.alert.state, n.alert.annotations["description"]) == (
        "firing",
        "2 ready tasks of pool cloud and no worker to run them for two minutes. Its "
        "autoscaler has 2 block(s) asked for and not running yet, the oldest for 150 s: they "
        "join once their provider starts them (CorralProvisioningStuck fires past 10 "
        "minutes).",
    )
    # A block its batch system suspended is not one on its way: it is said apart.
    held = MetricsReply(
        pools={"cloud": PoolMetrics(**pool)},
        blocks={"cloud": BlockMetrics(states={"held": 1, "running": 1})},
    )
    assert block_notes(held)[("blocks_pending", (("pool", "cloud"),))] == (
        "1 block(s) of it are held by the batch system (suspended by a preemption, or on "
        "hold): their workers come back once it lets them run."
    )
    none = MetricsReply(
        pools={"cloud": PoolMetrics(**pool)}, blocks={"cloud": BlockMetrics(states={})}
    )
    assert block_notes(none) == {}
    st = AlertState([no_workers()])
    st.handle(Evaluate(0.0, samples(none), block_notes(none)))
    (n,) = only(st.handle(Evaluate(120.0, samples(none), block_notes(none))), Notify)
    assert n.alert.annotations["description"] == (
        "2 ready tasks of pool cloud and no worker to run them for two minutes."
    )


def test_and_or_sum_by_over_worker_states() -> None:
    st = AlertState([no_workers()])
    idle = {"idle": 0, "busy": 0, "draining": 0}
    busy = {"idle": 0, "busy": 2, "draining": 1}
    s = snap(
        {
            "cpu": {"queue_depth": 3, "workers": idle},
            "gpu": {"queue_depth": 5, "workers": busy},
            "mem": {"queue_depth": 0, "workers": idle},
            "*": {"queue_depth": 2},
        },
        workers=3,
    )
    st.handle(Evaluate(0.0, s))
    assert [(a.labels["pool"], a.state, a.value) for a in st.alerts()] == [("cpu", "pending", 3)]
    s = snap({"*": {"queue_depth": 2}, "cpu": {"queue_depth": 3, "workers": idle}}, workers=0)
    st.handle(Evaluate(10.0, s))
    assert [(a.labels["pool"], a.value) for a in st.alerts()] == [("*", 2), ("cpu", 3)]
    assert st.alerts()[0].fields == {
        "max_queue_size": 2.0,  # queue depth of "*"
        "queue_size_threshold": 0.0,
        "workers_threshold": 0.0,  # the left side did not hold for "*": no max_workers
        "max_workers_connected": 0.0,
        "workers_connected_threshold": 0.0,
        "threshold_breached": 1.0,
    }


def test_and_with_a_term_without_labels_applies_to_every_instance() -> None:
    r = rule(expr="corral_queue_depth >= 2 and corral_workers_connected < 1", **{"for": 0})
    st = AlertState([r])
    s = snap({"a": {"queue_depth": 2}, "b": {"queue_depth": 5}, "c": {"queue_depth": 1}})
    st.handle(Evaluate(0.0, s))
    assert [a.labels["pool"] for a in st.alerts()] == ["a", "b"]
    # label-less on the left: one instance per agreeing right one, with their labels
    r2 = rule(name="R2", expr="corral_workers_connected < 1 and corral_queue_depth >= 2",
              **{"for": 0})  # fmt: skip
    st = AlertState([r2])
    st.handle(Evaluate(0.0, s))
    assert [(a.labels.get("pool"), a.value) for a in st.alerts()] == [("a", 0), ("b", 0)]


def test_two_comparisons_of_one_metric_keep_their_own_fields() -> None:
    """``queue_depth > 5 and queue_depth < 100``: each bound has its threshold and its
    max field (before, both wrote one pair: the second threshold was lost)."""
    r = rule(expr="corral_queue_depth > 5 and corral_queue_depth < 100", **{"for": 0})
    st = AlertState([r])
    st.handle(Evaluate(0.0, snap({"a": {"queue_depth": 7}})))
    st.handle(Evaluate(10.0, snap({"a": {"queue_depth": 9}})))
    (a,) = st.alerts()
    assert a.fields == {
        "max_queue_size": 9.0,
        "queue_size_threshold": 5.0,
        "max_queue_size_2": 9.0,
        "queue_size_threshold_2": 100.0,
        "threshold_breached": 1.0,
    }


def test_matchers_sum_without_by_and_parentheses() -> None:
    expr = (
        'sum(corral_workers{state="busy"}) >= 3 and (corral_queue_depth{pool!="gpu"} > 5 '
        'or corral_queue_oldest_wait_seconds{pool="gpu"} > 100)'
    )
    st = AlertState([rule(expr=expr, **{"for": 0})])
    s = snap({
        "cpu": {"queue_depth": 6, "workers": {"busy": 2}},
        "gpu": {"queue_depth": 6, "oldest_wait": 50.0, "workers": {"busy": 1}},
        "io": {"queue_depth": 1, "oldest_wait": 500.0},
    })  # fmt: skip
    st.handle(Evaluate(0.0, s))
    assert [(a.labels["pool"], a.value) for a in st.alerts()] == [("cpu", 3)]
    s = snap({
        "cpu": {"queue_depth": 6, "workers": {"busy": 1}},
        "gpu": {"queue_depth": 6, "oldest_wait": 150.0, "workers": {"busy": 1}},
    })  # fmt: skip
    st.handle(Evaluate(1.0, s))
    assert [(a.labels["pool"], a.state) for a in st.alerts()] == [("cpu", "resolved")]


def test_or_keeps_both_sides_and_precedence_binds_and_tighter() -> None:
    # a or b and c == a or (b and c)
    r = rule(
        expr="corral_queue_depth > 10 or corral_queue_depth > 0 and corral_workers_connected == 0",
        **{"for": 0},
    )
    assert [c.threshold for c in compares(r.parsed)] == [10.0, 0.0, 0.0]
    st = AlertState([r])
    st.handle(Evaluate(0.0, snap({"a": {"queue_depth": 11}, "b": {"queue_depth": 1}},
                                 workers=1)))  # fmt: skip
    assert [a.labels["pool"] for a in st.alerts()] == ["a"]
    st.handle(Evaluate(1.0, snap({"a": {"queue_depth": 11}, "b": {"queue_depth": 1}})))
    assert [a.labels["pool"] for a in st.alerts()] == ["a", "b"]


def test_a_rule_on_a_worker_s_free_disk_fires_for_that_worker() -> None:
    """``corral_worker_disk_free_bytes`` (per worker, labels pool and worker) is a known
    metric: the audit's DiskLow rule is accepted, and fires after its ``for`` for the
    worker whose disk is low only. Before, the rule was refused (unknown metric)."""
    summary = "{{ $labels.worker }} has {{ $value }} bytes left"
    d = {"name": "DiskLow", "expr": "corral_worker_disk_free_bytes < 1000000", "for": "1m",
         "annotations": {"summary": summary}}  # fmt: skip
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])

    def disks(free: int) -> Samples:
        low = WorkerDiskMetrics("cpu", 1 << 30, (1 << 30) - free, free)
        ok = WorkerDiskMetrics("cpu", 1 << 30, 0, 1 << 30)
        return samples(MetricsReply(disks={"w1": low, "w2": ok}))

    labels = {"alertname": "DiskLow", "pool": "cpu", "worker": "w1"}
    assert notes(st.handle(Evaluate(0.0, disks(500_000)))) == [("DiskLow", "pending", labels)]
    (n,) = only(st.handle(Evaluate(61.0, disks(400_000))), Notify)
    assert (n.alert.state, n.alert.value) == ("firing", 400_000.0)
    assert (n.alert.labels["worker"], n.alert.labels["pool"]) == ("w1", "cpu")
    assert n.alert.annotations["summary"] == "w1 has 400000 bytes left"
    (n,) = only(st.handle(Evaluate(62.0, disks(5_000_000))), Notify)
    assert n.alert.state == "resolved"


def failed(pool_counts: dict[str, int]) -> Samples:
    return snap(blocks={p: {"failed": n} for p, n in pool_counts.items()})


def test_increase_over_the_samples_seen_with_counter_restarts() -> None:
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralBlocksFailing"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    assert st.handle(Evaluate(0.0, failed({"cpu": 5, "gpu": 0}))) == []  # a base, no growth
    assert st.handle(Evaluate(60.0, failed({"cpu": 6, "gpu": 1}))) == []
    (n,) = only(st.handle(Evaluate(120.0, failed({"cpu": 8, "gpu": 1}))), Notify)
    assert (n.alert.labels["pool"], n.alert.state, n.alert.value) == ("cpu", "firing", 3.0)
    assert n.alert.fields == {
        "max_blocks_failed_total_increase": 3.0,
        "blocks_failed_total_increase_threshold": 3.0,
        "threshold_breached": 1.0,
    }
    # the manager restarted: the counter starts over from 0; 8 -> 2 counts as 2 more
    (r,) = st.handle(Evaluate(180.0, failed({"cpu": 2, "gpu": 1})))
    assert r == Refresh(st.alerts()[0])
    assert st.alerts()[0].value == 5.0
    # 10 minutes on, only growth after 180 + ... counts: none since 660 - 600 = 60
    st.handle(Evaluate(660.0, failed({"cpu": 2, "gpu": 1})))
    assert st.alerts()[0].value == 4.0  # 6 -> 8 (at 120) and the restart to 2 (at 180)
    (n,) = only(st.handle(Evaluate(781.0, failed({"cpu": 2, "gpu": 1}))), Notify)
    assert n.alert.state == "resolved"


def test_the_series_seen_of_a_counter_no_rule_reads_are_let_go() -> None:
    """The series ``increase`` has seen are kept while a rule reads their counter (a
    series that went and comes back continues from its first sample back, not from 0),
    and let go with the last rule that reads it: before, they were kept for the life of
    the manager, one per pool, category and cause ever counted."""
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralBlocksFailing"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    st.handle(Evaluate(0.0, failed({"cpu": 1})))
    st.handle(Evaluate(60.0, failed({"cpu": 1, "gpu": 4})))  # a new series: 4 of growth
    st.handle(Evaluate(700.0, failed({})))  # both went, past the 10 minutes
    assert st._history == {}
    key = ("corral_blocks_failed_total", (("pool", "gpu"),))
    assert st._seen == {("corral_blocks_failed_total", (("pool", "cpu"),)), key}
    assert st.handle(Evaluate(760.0, failed({"gpu": 4}))) == []  # back: no growth
    assert st._history[key][-1][2] == 0.0
    st.handle(RuleRemoved("CorralBlocksFailing", 800.0))
    st.handle(Evaluate(820.0, failed({"cpu": 1, "gpu": 4})))
    assert (st._seen, st._history) == (set(), {})


def test_blocks_failing_says_why_the_latest_failed() -> None:
    """A user audit: CorralBlocksFailing said only that blocks of the pool keep failing;
    the reason (a worker_init that failed) was in a .err file nothing named. Its
    description now ends with the latest failed block, its first line (the .err path)
    and its last two (the stderr's tail), bounded."""
    from runtime.metrics import NOTE_CHARS
    from runtime.metrics import notes as block_notes

    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralBlocksFailing"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    why = (
        "audbi/block-3 ended failed (crash): Slurm job 42 FAILED (NonZeroExitCode); exit "
        "code 127; stderr (/run/block-3.err):\ncorral: block block-3\n"
        "/run/block-3.sh: line 12: module: command not found\n"
        "corral: worker_init failed (exit status 127): no worker started"
    )

    def reply(n: int, last: str) -> MetricsReply:
        return MetricsReply(blocks={"audbi": BlockMetrics(failed=n, last_failure=last),
                                    "cpu": BlockMetrics(failed=0)})  # fmt: skip

    first = reply(0, "")
    assert st.handle(Evaluate(0.0, samples(first), block_notes(first))) == []
    later = reply(3, why)
    (n,) = only(st.handle(Evaluate(60.0, samples(later), block_notes(later))), Notify)
    assert n.alert.annotations["description"] == (
        "3 blocks of pool audbi failed or ended unasked in the latest 10 minutes. The latest: "
        "audbi/block-3 ended failed (crash): Slurm job 42 FAILED (NonZeroExitCode); exit "
        "code 127; stderr (/run/block-3.err): / /run/block-3.sh: line 12: module: command "
        "not found / corral: worker_init failed (exit status 127): no worker started"
    )
    huge = reply(3, why + "x" * 10 * NOTE_CHARS)
    assert len(block_notes(huge)[("last_block_failure", (("pool", "audbi"),))]) <= NOTE_CHARS
    assert block_notes(first) == {}
    with pytest.raises(AlertConfigError, match="names the note 'last_block_failur'"):
        rule(annotations={"description": "{{ $notes.last_block_failur }}"})


def test_submissions_failing_fires_while_the_pool_backs_off_not_once_suspended() -> None:
    """A Slurm controller out of reach no longer suspends the pool (it goes on by
    itself once a submission goes through): CorralSubmissionsFailing tells meanwhile."""
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralSubmissionsFailing"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    assert st.handle(Evaluate(0.0, snap(blocks={"ckpt": {"submit_failures": 2}}))) == []
    (n,) = only(st.handle(Evaluate(5.0, snap(blocks={"ckpt": {"submit_failures": 3}}))), Notify)
    assert (n.alert.state, n.alert.labels["pool"]) == ("firing", "ckpt")
    assert "goes on by itself" in n.alert.annotations["description"]
    (n,) = only(st.handle(Evaluate(10.0, snap(blocks={"ckpt": {"submit_failures": 0}}))), Notify)
    assert n.alert.state == "resolved"
    suspended = {"submit_failures": 3, "suspended": 1}  # CorralPoolSuspended's, then
    assert st.handle(Evaluate(15.0, snap(blocks={"ckpt": suspended}))) == []


def test_blocks_replaced_at_their_provisioning_timeout_fire_the_stuck_rule() -> None:
    """A pool whose blocks never come up is replaced every provisioning_timeout: the
    oldest pending block is never old, so only the count of stuck blocks tells."""
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralBlocksStuck"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    stuck = lambda n: snap(blocks={"slow": {"stuck": n}})  # noqa: E731
    assert st.handle(Evaluate(0.0, stuck(0))) == []
    assert st.handle(Evaluate(360.0, stuck(1))) == []  # one: a slow start, say
    (n,) = only(st.handle(Evaluate(720.0, stuck(2))), Notify)
    assert (n.alert.state, n.alert.labels["pool"], n.alert.value) == ("firing", "slow", 2.0)
    assert "provisioning_timeout" in n.alert.annotations["description"]
    # They come up again: 30 minutes after the last one, it resolves.
    assert st.handle(Evaluate(1800.0, stuck(2))) == []
    (n,) = only(st.handle(Evaluate(2521.0, stuck(2))), Notify)
    assert n.alert.state == "resolved"


def test_a_suspended_pool_fires_at_once_and_says_what_to_do() -> None:
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralPoolSuspended"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    assert st.handle(Evaluate(0.0, snap(blocks={"ckpt": {}, "cpu": {}}))) == []
    (n,) = only(st.handle(Evaluate(15.0, snap(blocks={"ckpt": {"suspended": 1}}))), Notify)
    assert (n.alert.state, n.alert.labels["pool"], n.alert.labels["priority"]) == (
        "firing", "ckpt", "P2"
    )  # fmt: skip
    assert "resume ckpt" in n.alert.annotations["description"]
    (n,) = only(st.handle(Evaluate(30.0, snap(blocks={"ckpt": {"suspended": 0}}))), Notify)
    assert n.alert.state == "resolved"


def test_a_suspended_pool_alert_says_why() -> None:
    """A user audit: CorralPoolSuspended said to look in the console for the error;
    its description now ends with why the pool stopped asking, on one line, bounded."""
    from runtime.metrics import NOTE_CHARS
    from runtime.metrics import notes as block_notes

    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralPoolSuspended"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    why = "its blocks kept ending; the latest: ckpt/block-3 ended failed\nfirst\nmid\nlast"
    reply = MetricsReply(blocks={"ckpt": BlockMetrics(suspended=1, suspended_why=why)})
    (n,) = only(st.handle(Evaluate(0.0, samples(reply), block_notes(reply))), Notify)
    assert n.alert.annotations["description"].endswith(
        "(its status shows the latest error). Why: its blocks kept ending; the latest: "
        "ckpt/block-3 ended failed / mid / last"
    )
    huge = MetricsReply(blocks={"ckpt": BlockMetrics(suspended=1, suspended_why="x" * 5000)})
    assert len(block_notes(huge)[("suspended_why", (("pool", "ckpt"),))]) <= NOTE_CHARS


def unreachable(counts: dict[str, int]) -> Samples:
    fails = tuple(FailureCount(c, "missing", "InputsUnreachable", n) for c, n in counts.items())
    return samples(MetricsReply(failures=fails))


def test_a_counter_that_appears_counts_from_zero() -> None:
    """Failure counters appear at their first count: the default rule fires on the
    first task that failed with InputsUnreachable, not on the second."""
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralInputsUnreachable"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    # there at the first evaluation: a base (how much of it is recent is unknown)
    assert st.handle(Evaluate(0.0, unreachable({"build": 4}))) == []
    (n,) = only(st.handle(Evaluate(5.0, unreachable({"build": 4, "test": 1}))), Notify)
    assert (n.alert.state, n.alert.value) == ("firing", 1.0)
    assert n.alert.labels == {"alertname": "CorralInputsUnreachable", "category": "test",
                              "cause": "InputsUnreachable", "outcome": "missing",
                              "team": "corral", "priority": "P2"}  # fmt: skip
    assert "--host" in n.alert.annotations["description"]
    description = n.alert.annotations["description"]
    assert "over wss://, each worker's certificate must name its --host" in description
    assert n.alert.annotations["summary"].startswith("Tasks of test fail")
    assert st.handle(Evaluate(10.0, unreachable({"build": 5, "test": 1})))[0].alert.labels[
        "category"] == "build"  # fmt: skip
    # a series that went and came back is not new: no base of 0 for it
    st.handle(Evaluate(700.0, unreachable({"build": 5})))
    assert [a.labels["category"] for a in st.alerts() if a.state == "firing"] == []
    st.handle(Evaluate(1400.0, unreachable({"build": 5})))  # test's history is gone
    assert not only(st.handle(Evaluate(1405.0, unreachable({"build": 5, "test": 1}))), Notify)
    # a rule added later takes the series it finds as they are
    late = AlertState()
    late.handle(Evaluate(0.0, unreachable({"build": 4})))
    late.handle(RuleAdded(parse_rule(d, SAMPLE_LABELS), now=5.0))
    assert late.handle(Evaluate(10.0, unreachable({"build": 4}))) == []
    (n,) = only(late.handle(Evaluate(15.0, unreachable({"build": 4, "x": 2}))), Notify)
    assert (n.alert.labels["category"], n.alert.value) == ("x", 2.0)


def test_increase_over_a_window_longer_than_its_points_stays_whole() -> None:
    """A 2 h window read every 5 s: 1,440 samples, more than the points kept per series.
    Close samples are merged, so the growth at the start still counts until the window
    has passed it, restarts included. Before, the oldest samples fell off the end: the
    alert resolved 37 minutes early."""
    r = parse_rule({"name": "Fail2h", "expr": "increase(corral_blocks_failed_total[2h]) >= 3"},
                   SAMPLE_LABELS)  # fmt: skip
    st = AlertState([r])
    st.handle(Evaluate(0.0, failed({"cpu": 0})))
    said = [(5, n.alert.state) for n in only(st.handle(Evaluate(5.0, failed({"cpu": 3}))), Notify)]
    for t in range(10, 7300, 5):
        # the manager restarted at 1 h: its counter starts over, at 1 from then on
        cmds = st.handle(Evaluate(float(t), failed({"cpu": 1 if t >= 3600 else 3})))
        said += [(t, n.alert.state) for n in only(cmds, Notify)]
        if t in (3595, 7200):
            assert st.alerts()[0].value == (3.0 if t == 3595 else 4.0)
    # 2 h after the 3 (to within one point's span, 7.2 s), not 37 minutes before
    assert said[0] == (5, "firing") and said[1:] == [(7210, "resolved")]
    points = st._history[("corral_blocks_failed_total", (("pool", "cpu"),))]
    assert len(points) <= 1000


def test_increase_keeps_bounded_history() -> None:
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralBlocksFailing"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS)])
    for t in range(0, 3600, 5):
        st.handle(Evaluate(float(t), failed({"cpu": t // 600})))
    points = st._history[("corral_blocks_failed_total", (("pool", "cpu"),))]
    assert len(points) == 121  # 600 s at one sample per 5 s, and the base
    st.handle(Evaluate(3600.0, failed({})))  # the series went
    st.handle(Evaluate(4300.0, failed({})))
    assert st._history == {}


# ----------------------------------------------------------------------------- actions


def scaler(**action: Any) -> AlertRule:
    return rule(**{"for": 0, "action": {"scale_out": action}})


def pool_blocks(target: int, running: int = 0, pending: int = 0, **kw: Any) -> dict[str, Any]:
    states = {k: v for k, v in (("running", running), ("pending", pending)) if v}
    return {"target": target, "states": states, **kw}


def test_scale_by_n_with_cooldown_and_level_triggered_repeat() -> None:
    st = AlertState([scaler(by=2, cooldown=300)])
    b = pool_blocks(2, running=2, max_blocks=10, slots_per_block=1, workers_per_block=1)
    cmds = st.handle(Evaluate(0.0, queue(7, 3720.0, **b)))
    assert only(cmds, Scale) == [
        Scale("cpu", 4, "QueueTime", "by 2: corral_queue_depth = 7 > 0 and "
              "corral_queue_oldest_wait_seconds = 3720 > 60"),
    ]  # fmt: skip
    (a,) = only(cmds, Audit)
    assert a.now == 0.0
    assert a.line == (
        "alert QueueTime{pool=cpu}: scale pool cpu out from 2 to 4 blocks (by 2: "
        "corral_queue_depth = 7 > 0 and corral_queue_oldest_wait_seconds = 3720 > 60)"
    )
    b = pool_blocks(4, running=2, pending=2, max_blocks=10)
    cmds = st.handle(Evaluate(10.0, queue(7, 3730.0, **b)))
    assert only(cmds, Scale) == []
    (a,) = only(cmds, Audit)
    assert a.line.startswith(
        "alert QueueTime{pool=cpu}: no scale-out of pool cpu: cooldown, scaled 10 s ago, "
        "waits 300 s ("
    )
    cmds = st.handle(Evaluate(20.0, queue(7, 3740.0, **b)))
    assert only(cmds, Audit) == []  # said once
    assert cmds == [Refresh(st.alerts()[0])]  # its wait grew: 62.3 minutes
    # the cooldown is over and the queue still waits: the next step
    cmds = st.handle(Evaluate(300.0, queue(6, 4000.0, **b)))
    assert [(s.pool, s.target) for s in only(cmds, Scale)] == [("cpu", 6)]
    assert [x.line for x in st.audit][-1].startswith(
        "alert QueueTime{pool=cpu}: scale pool cpu out from 4 to 6 blocks"
    )
    assert len(st.audit) == 3


@pytest.mark.parametrize(
    ("after", "cooldown", "said"),
    [(2.00211, 30, "scaled 2 s ago, waits 30 s"), (2.56, 7.5, "scaled 2.6 s ago, waits 7.5 s"),
     (12.6, 30, "scaled 13 s ago, waits 30 s"), (9.96, 90.4, "scaled 10 s ago, waits 90 s")],
)  # fmt: skip
def test_the_cooldown_audit_says_its_seconds_without_a_clock_s_digits(
    after: float, cooldown: float, said: str
) -> None:
    """A user audit: "cooldown, scaled 2.00211 s ago, waits 30 s". Durations in an audit
    line are whole seconds, with one decimal under 10 s."""
    st = AlertState([scaler(by=1, cooldown=cooldown, max_blocks=10)])
    st.handle(Evaluate(100.0, queue(7, 3720.0, **pool_blocks(2, running=2))))
    (a,) = only(st.handle(Evaluate(100.0 + after, queue(7, 3730.0, **pool_blocks(3)))), Audit)
    assert f"no scale-out of pool cpu: cooldown, {said} (" in a.line


def test_no_action_once_the_condition_stops_holding_even_while_still_firing() -> None:
    st = AlertState([rule(**{"for": 0, "keep_firing_for": 600,
                             "action": {"scale_out": {"by": 1, "cooldown": 0}}})])  # fmt: skip
    b = pool_blocks(1, running=1, max_blocks=10)
    assert len(only(st.handle(Evaluate(0.0, queue(1, 61.0, **b))), Scale)) == 1
    assert st.handle(Evaluate(10.0, queue(0, 0.0, **b))) == []
    assert st.alerts()[0].state == "firing"


def test_fit_asks_for_blocks_for_running_and_ready_tasks_capped_by_max_blocks() -> None:
    st = AlertState([scaler(fit=True)])
    # 3 running, 7 ready here and 2 any pool may run: ceil((3 + 9) / 2) = 6 blocks in all
    b = pool_blocks(2, running=1, pending=1, slots_per_block=2, max_blocks=20)
    s = {**queue(7, 100.0, running=3, **b), ("corral_queue_depth", (("pool", "*"),)): 2.0}
    cmds = st.handle(Evaluate(0.0, s))
    assert [(c.pool, c.target) for c in only(cmds, Scale)] == [("cpu", 6)]
    assert (
        "fit 3 running and 9 ready tasks at 2 per block, with 1 running and 1 pending "
        "blocks:" in only(cmds, Audit)[0].line
    )
    st = AlertState([scaler(fit=True)])
    b = pool_blocks(2, running=2, slots_per_block=2, max_blocks=5)
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, running=4, **b)))
    assert [(c.pool, c.target) for c in only(cmds, Scale)] == [("cpu", 5)]
    assert only(cmds, Audit)[0].line.startswith(
        "alert QueueTime{pool=cpu}: scale pool cpu out from 2 to 5 blocks (fit 4 running and "
        "7 ready tasks at 2 per block, with 2 running and 0 pending blocks, capped by the "
        "pool's max_blocks 5: "
    )


def test_fit_counts_pending_blocks_as_capacity_for_the_ready_tasks() -> None:
    # The strategy already asked a pending block per ready task: 4 running tasks on 4
    # blocks, 6 ready ones with 6 blocks pending. The old count asked 6 more (16).
    st = AlertState([scaler(fit=True)])
    b = pool_blocks(10, running=4, pending=6, slots_per_block=1, max_blocks=40)
    cmds = st.handle(Evaluate(0.0, queue(6, 100.0, running=4, **b)))
    assert only(cmds, Scale) == []
    assert "its target 10 already covers it (fit 4 running and 6 ready tasks" in (
        only(cmds, Audit)[0].line
    )
    # A target below the blocks there are (the strategy keeps idle ones): the pool's
    # work needs 10, the target is 3: raise it to 10, not to 16.
    st = AlertState([scaler(fit=True)])
    b = pool_blocks(3, running=4, pending=6, slots_per_block=1, max_blocks=40)
    cmds = st.handle(Evaluate(0.0, queue(6, 100.0, running=4, **b)))
    assert [(c.pool, c.target) for c in only(cmds, Scale)] == [("cpu", 10)]


def test_fit_asks_nothing_the_scaling_policy_wants_already() -> None:
    """Under ``demand`` the policy wants blocks for the queue already (its desired count
    follows it): a target there adds none, only a floor. Refused, audited once however
    the count moves; a refusal for the cap is said as the cap's."""
    st = AlertState([scaler(fit=True, max_blocks=50)])
    lines = []
    for i, depth in enumerate(range(10, 20)):
        b = pool_blocks(2, running=2, pending=depth - 2, desired=depth, max_blocks=50,
                        slots_per_block=1, workers_per_block=1)  # fmt: skip
        cmds = st.handle(Evaluate(float(i * 10), queue(depth, 100.0 + i * 10, **b)))
        assert only(cmds, Scale) == []
        lines += [a.line for a in only(cmds, Audit)]
    assert lines == [
        "alert QueueTime{pool=cpu}: no scale-out of pool cpu: its scaling policy wants 10 "
        "blocks already (fit 0 running and 10 ready tasks at 1 per block, with 2 running and "
        "8 pending blocks) (corral_queue_depth = 10 > 0 and corral_queue_oldest_wait_seconds "
        "= 100 > 60)"
    ]
    # the policy wants fewer than the work needs: the target is raised to what it needs
    b = pool_blocks(2, running=2, desired=2, max_blocks=50, slots_per_block=1)
    cmds = st.handle(Evaluate(400.0, queue(5, 500.0, **b)))
    assert [(c.pool, c.target) for c in only(cmds, Scale)] == [("cpu", 5)]
    # under `fixed` the policy wants the target: a cap at the target is the cap's refusal
    st = AlertState([scaler(fit=True, max_blocks=4)])
    b = pool_blocks(4, running=4, desired=4, max_blocks=20, slots_per_block=1)
    (a,) = only(st.handle(Evaluate(0.0, queue(10, 100.0, **b))), Audit)
    assert "no scale-out of pool cpu beyond 4 blocks: max_blocks 4" in a.line, a.line


def test_fit_does_nothing_when_the_target_covers_the_work() -> None:
    st = AlertState([scaler(fit=True)])
    # the target is 6: ceil((1 + 4) / 4) = 2 are enough, never below the target
    b = pool_blocks(6, running=1, pending=3, slots_per_block=4, max_blocks=9)
    cmds = st.handle(Evaluate(0.0, queue(4, 100.0, running=1, **b)))
    assert only(cmds, Scale) == []
    assert "its target 6 already covers it (fit 1 running and 4 ready tasks" in (
        only(cmds, Audit)[0].line
    )


def test_max_blocks_refuses_beyond_the_cap() -> None:
    st = AlertState([scaler(by=3, max_blocks=4)])
    b = pool_blocks(3, running=3, max_blocks=10)
    assert [c.target for c in only(st.handle(Evaluate(0.0, queue(7, 100.0, **b))), Scale)] == [4]
    st = AlertState([scaler(by=3, max_blocks=4)])
    b = pool_blocks(4, running=4, max_blocks=10)
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, **b)))
    assert only(cmds, Scale) == []
    assert only(cmds, Audit)[0].line.startswith(
        "alert QueueTime{pool=cpu}: no scale-out of pool cpu beyond 4 blocks: max_blocks 4 ("
    )
    # the smaller of the rule's and the pool's own max_blocks
    st = AlertState([scaler(by=3, max_blocks=8)])
    b = pool_blocks(3, running=3, max_blocks=5)
    assert [c.target for c in only(st.handle(Evaluate(0.0, queue(7, 100.0, **b))), Scale)] == [5]


def test_no_max_blocks_known_refuses() -> None:
    st = AlertState([scaler(by=1)])
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    assert only(cmds, Scale) == []
    assert "no max_blocks known; set scale_out.max_blocks" in only(cmds, Audit)[0].line


def test_cost_cap_in_worker_hours_per_hour() -> None:
    # 4 workers per block, at most 10 worker-hours per hour: 2 blocks
    st = AlertState([scaler(by=5, max_cost=10)])
    b = pool_blocks(1, running=1, max_blocks=50, workers_per_block=4)
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, **b)))
    assert [c.target for c in only(cmds, Scale)] == [2]
    assert "capped by cost cap 10 worker-hours per hour (4 workers per block)" in (
        only(cmds, Audit)[0].line
    )
    st = AlertState([scaler(by=5, max_cost=10)])
    b = pool_blocks(2, running=2, max_blocks=50, workers_per_block=4)
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, **b)))
    assert only(cmds, Scale) == []
    assert only(cmds, Audit)[0].line.startswith(
        "alert QueueTime{pool=cpu}: no scale-out of pool cpu beyond 2 blocks: cost cap 10 "
        "worker-hours per hour (4 workers per block) ("
    )


def test_cooldown_is_per_pool_across_rules() -> None:
    other = parse_rule({"name": "Deep", "expr": "corral_queue_depth > 5",
                        "action": {"scale_out": {"by": 1, "max_blocks": 9}}},
                       SAMPLE_LABELS)  # fmt: skip
    st = AlertState([scaler(by=1, max_blocks=9), other])
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    assert [(c.rule, c.target) for c in only(cmds, Scale)] == [("QueueTime", 2)]
    assert "Deep{pool=cpu}: no scale-out of pool cpu: cooldown" in only(cmds, Audit)[1].line


def test_an_alert_without_a_pool_needs_the_action_to_name_one() -> None:
    st = AlertState([scaler(by=1, max_blocks=9)])
    b = pool_blocks(1, running=1)
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0, pool="*", **b)))
    assert only(cmds, Scale) == []
    assert "names no pool; set scale_out.pool" in only(cmds, Audit)[0].line
    st = AlertState([scaler(by=1, max_blocks=9, pool="cpu")])
    s = {**queue(7, 100.0, pool="*"), **snap(blocks={"cpu": pool_blocks(1, running=1)})}
    cmds = st.handle(Evaluate(0.0, s))
    assert [(c.pool, c.target) for c in only(cmds, Scale)] == [("cpu", 2)]


def test_restore_sets_the_target_back_once_the_alert_resolved() -> None:
    st = AlertState([scaler(by=2, cooldown=60, max_blocks=9, restore=True)])
    b = pool_blocks(1, running=1)
    assert [c.target for c in only(st.handle(Evaluate(0.0, queue(7, 100.0, **b))), Scale)] == [3]
    b = pool_blocks(3, running=3)
    assert [c.target for c in only(st.handle(Evaluate(60.0, queue(7, 160.0, **b))), Scale)] == [5]
    b = pool_blocks(5, running=5)
    cmds = st.handle(Evaluate(70.0, queue(0, 0.0, **b)))
    assert only(cmds, Scale) == [
        Scale(
            "cpu",
            1,
            "QueueTime",
            "resolved: back to the target before the scale-out (5 -> 1)",
            restore=True,
        )
    ]
    assert only(cmds, Audit)[0].line == (
        "alert QueueTime{pool=cpu} resolved: back to the target before the scale-out (5 -> 1); "
        "blocks beyond it drain once idle, as the pool's scaling policy says"
    )
    # someone set the target meanwhile: it stays
    st = AlertState([scaler(by=2, cooldown=60, max_blocks=9, restore=True)])
    st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    cmds = st.handle(Evaluate(10.0, queue(0, 0.0, **pool_blocks(8, running=3))))
    assert only(cmds, Scale) == []
    assert only(cmds, Audit)[0].line == (
        "alert QueueTime{pool=cpu} resolved: pool cpu's target is 8, not the 3 its scale-out "
        "set: left as it is"
    )
    # with restore = false, the target stays where the action put it
    st = AlertState([scaler(by=2, max_blocks=9, restore=False)])
    st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    assert only(st.handle(Evaluate(10.0, queue(0, 0.0, **pool_blocks(3)))), Scale) == []


def test_restore_waits_for_a_known_target() -> None:
    """The alert resolves in a sample where the autoscaler did not answer (no target):
    nothing is set back then; at the next sample with the target, it is set back if it
    is still the scale-out's, and left if someone changed it. Before, the target was set
    back blind, over an operator's change."""
    st = AlertState([scaler(by=2, cooldown=60, max_blocks=9, restore=True)])
    st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    cmds = st.handle(Evaluate(10.0, queue(0, 0.0)))  # no blocks: the autoscaler was busy
    assert only(cmds, Scale) == []
    assert "target is unknown (no autoscaler answer)" in only(cmds, Audit)[0].line
    cmds = st.handle(Evaluate(15.0, queue(0, 0.0, **pool_blocks(8, running=3))))
    assert only(cmds, Scale) == []
    assert "pool cpu's target is 8, not the 3" in only(cmds, Audit)[0].line
    assert st.handle(Evaluate(20.0, queue(0, 0.0, **pool_blocks(8, running=3)))) == []
    # still the scale-out's target: set back then
    st = AlertState([scaler(by=2, cooldown=60, max_blocks=9, restore=True)])
    st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    st.handle(Evaluate(10.0, queue(0, 0.0)))
    cmds = st.handle(Evaluate(15.0, queue(0, 0.0, **pool_blocks(3, running=3))))
    assert [c.target for c in only(cmds, Scale)] == [1]
    # scaled out again before the target was known: that one restores to the first's start
    st = AlertState([scaler(by=2, cooldown=0, max_blocks=9, restore=True)])
    st.handle(Evaluate(0.0, queue(7, 100.0, **pool_blocks(1, running=1))))
    st.handle(Evaluate(10.0, queue(0, 0.0)))
    cmds = st.handle(Evaluate(15.0, queue(7, 100.0, **pool_blocks(3, running=3))))
    assert [c.target for c in only(cmds, Scale)] == [5]
    cmds = st.handle(Evaluate(20.0, queue(0, 0.0, **pool_blocks(5, running=5))))
    assert [c.target for c in only(cmds, Scale)] == [1]


def test_a_fit_refusal_is_audited_once_while_the_counts_move() -> None:
    st = AlertState([scaler(fit=True, cooldown=0, max_blocks=9)])
    b = pool_blocks(4, running=4, slots_per_block=2)
    lines = []
    for t, running in enumerate((4, 5, 6, 7, 6)):
        s = queue(1, 100.0, running=running, **b)
        lines += [c.line for c in only(st.handle(Evaluate(float(t), s)), Audit)]
    assert len(lines) == 1 and "its target 4 already covers it" in lines[0]
    b = pool_blocks(2, running=2, slots_per_block=2)  # the target changed: said again
    lines = [c.line for c in only(st.handle(Evaluate(9.0, queue(1, 100.0, running=1, **b))), Audit)]
    assert len(lines) == 1 and "its target 2 already covers it" in lines[0]


def test_unknown_blocks_refuse_and_a_failed_scale_is_audited() -> None:
    st = AlertState([scaler(by=1, max_blocks=9)])
    cmds = st.handle(Evaluate(0.0, queue(7, 100.0)))
    assert "its blocks are unknown (no autoscaler answer)" in only(cmds, Audit)[0].line
    (a,) = st.handle(ScaleDone("cpu", False, "there is no pool 'cpu'", 5.0))
    assert a == Audit(
        "scale-out of pool cpu failed: there is no pool 'cpu'", 5.0, pool="cpu",
        action="scale-failed", why="there is no pool 'cpu'",
    )  # fmt: skip
    assert st.handle(ScaleDone("cpu", True, "", 6.0)) == []


# ----------------------------------------------------------------------------- rules live


def test_rules_added_and_removed_live() -> None:
    st = AlertState()
    assert st.handle(Evaluate(0.0, queue(7, 100.0))) == []
    st.handle(RuleAdded(rule(**{"for": 0})))
    st.handle(RuleAdded(rule(name="Slow", **{"for": 600})))
    assert list(st.rules) == ["QueueTime", "Slow"]
    assert [n[:2] for n in notes(st.handle(Evaluate(1.0, queue(7, 100.0))))] == [
        ("QueueTime", "firing"), ("Slow", "pending"),
    ]  # fmt: skip
    with pytest.raises(AlertConfigError, match=r"'QueueTime'.*is a rule already"):
        st.handle(RuleAdded(rule()))
    cmds = st.handle(RuleRemoved("QueueTime", 2.0), RuleRemoved("Slow", 2.0))
    assert [n[:2] for n in notes(cmds)] == [("QueueTime", "resolved")]
    assert [(a.name, a.state, a.resolved_at) for a in st.alerts()] == [
        ("QueueTime", "resolved", 2.0)
    ]
    assert st.handle(Evaluate(3.0, queue(7, 100.0))) == []
    with pytest.raises(
        AlertConfigError, match="'QueueTim': there is no such rule \\(the rules: none\\)"
    ):
        st.handle(RuleRemoved("QueueTim"))


def test_replacing_a_rule_keeps_its_alerts_under_the_new_rule() -> None:
    """``alert add`` of a rule that exists (an annotation changed, a threshold) tells
    nobody its firing alert resolved while the queue is still there: the alert goes
    on under the new rule, and resolves when the new expression no longer holds."""
    st = AlertState([rule(**{"for": 0})])
    st.handle(Evaluate(0.0, queue(7, 100.0)))
    new = rule(**{"for": 60, "annotations": {"summary": "{{ $value }} wait"}})
    assert st.handle(RuleAdded(new, replace=True, now=5.0)) == []
    assert st.rules["QueueTime"].for_ == 60.0
    (a,) = st.alerts()
    assert (a.state, a.fired_at, a.annotations) == ("firing", 0.0, {"summary": "7 wait"})
    # no notification; the new annotations go to the notifiers for the resends
    assert st.handle(Evaluate(6.0, queue(7, 100.0))) == [Refresh(a)]
    cmds = st.handle(RuleAdded(rule(expr="corral_queue_depth > 10"), replace=True, now=7.0))
    assert cmds == []
    assert [n[:2] for n in notes(st.handle(Evaluate(8.0, queue(7, 100.0))))] == [
        ("QueueTime", "resolved")
    ]


def test_replacing_a_rule_with_other_labels_resolves_its_alerts_and_starts_over() -> None:
    st = AlertState([rule(**{"for": 0})])
    st.handle(Evaluate(0.0, queue(7, 100.0)))
    other = rule(**{"for": 60, "labels": {"team": "ci", "priority": "P1"}})
    cmds = st.handle(RuleAdded(other, replace=True, now=5.0))
    assert [n[:2] for n in notes(cmds)] == [("QueueTime", "resolved")]
    assert [n[:2] for n in notes(st.handle(Evaluate(6.0, queue(7, 100.0))))] == [
        ("QueueTime", "pending")
    ]


def test_a_replaced_rules_resolved_alert_stays_listed_beside_the_new_one() -> None:
    """``alert add`` of a rule of the same name with other labels: the old alert
    (resolved) stays listed for ``resolved_for``, as a removed rule's does, beside the
    new rule's (before, the new alert took its place at once)."""
    st = AlertState([rule(**{"for": 0})], resolved_for=900.0)
    st.handle(Evaluate(0.0, queue(7, 100.0)))
    ops = rule(**{"for": 0, "labels": {"team": "ops"}})
    st.handle(RuleAdded(ops, replace=True, now=5.0))
    assert notes(st.handle(Evaluate(6.0, queue(7, 100.0)))) == [
        ("QueueTime", "firing", {"alertname": "QueueTime", "pool": "cpu", "team": "ops"})
    ]
    listed = [(a.state, a.labels.get("team"), a.resolved_at) for a in st.alerts()]
    assert sorted(listed, key=str) == [("firing", "ops", None), ("resolved", "ci", 5.0)]
    st.handle(Evaluate(905.0, queue(7, 100.0)))  # 900 s after it resolved: forgotten
    assert [(a.state, a.labels.get("team")) for a in st.alerts()] == [("firing", "ops")]
    # replaced back: the ci alert starts over (one alert of those labels listed)
    st.handle(RuleAdded(rule(**{"for": 0}), replace=True, now=906.0))
    st.handle(Evaluate(907.0, queue(7, 100.0)))
    listed = [(a.state, a.labels.get("team")) for a in st.alerts()]
    assert sorted(listed) == [("firing", "ci"), ("resolved", "ops")]


def test_replacing_a_scaling_rule_neither_restores_nor_restarts_its_cooldown() -> None:
    st = AlertState([scaler(by=2, cooldown=60, max_blocks=9, restore=True)])
    b = pool_blocks(1, running=1)
    assert [c.target for c in only(st.handle(Evaluate(0.0, queue(7, 100.0, **b))), Scale)] == [3]
    again = scaler(by=2, cooldown=60, max_blocks=9, restore=True)
    assert st.handle(RuleAdded(again, replace=True, now=5.0)) == []  # no restore to 1
    b = pool_blocks(3, running=3)
    assert [c.target for c in only(st.handle(Evaluate(60.0, queue(7, 160.0, **b))), Scale)] == [5]
    cmds = st.handle(Evaluate(70.0, queue(0, 0.0, **pool_blocks(5, running=5))))
    assert [(c.target, c.reason[:8]) for c in only(cmds, Scale)] == [(1, "resolved")]


def test_removing_an_unknown_rule_says_which_there_are() -> None:
    with pytest.raises(
        AlertConfigError,
        match="there is no such rule \\(the rules: QueueTim\\); did you mean 'QueueTim'",
    ):
        AlertState([rule(name="QueueTim")]).handle(RuleRemoved("QueueTime"))


def test_handle_refuses_what_it_does_not_know() -> None:
    with pytest.raises(TypeError, match="cannot handle"):
        AlertState().handle(object())  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- parsing


def test_rules_round_trip_through_their_data() -> None:
    rules = parse_rules(DEFAULT_RULES, SAMPLE_LABELS)
    rules.append(
        scaler(fit=True, pool="cpu", cooldown="10m", max_blocks=8, max_cost=12.5, restore=False)
    )
    rules.append(scaler(by=2))
    for r in rules:
        assert parse_rule(r.to_dict(), SAMPLE_LABELS) == r
    assert rules[-2].to_dict()["action"] == {
        "scale_out": {"fit": True, "pool": "cpu", "cooldown": 600.0, "max_blocks": 8,
                      "max_cost": 12.5, "restore": False},
    }  # fmt: skip
    assert rules[-1].action == ScaleOut(by=2) and rules[-1].action.restore  # the default
    assert rules[0].to_dict() == {
        "name": "CorralQueueTime",
        "expr": DEFAULT_RULES[0]["expr"],
        "for": 60.0,
        "keep_firing_for": 0.0,
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": DEFAULT_RULES[0]["annotations"],
    }


def test_rules_keyed_by_name_and_duplicates() -> None:
    rules = parse_rules({"Deep": {"expr": "corral_queue_depth > 5"}}, SAMPLE_LABELS)
    assert [r.name for r in rules] == ["Deep"]
    with pytest.raises(AlertConfigError, match="'Deep': key 'name' is used by two rules"):
        parse_rules([{"name": "Deep", "expr": "corral_queue_depth > 5"}] * 2, SAMPLE_LABELS)
    with pytest.raises(AlertConfigError, match="must be a list of tables"):
        parse_rules("corral_queue_depth > 5", SAMPLE_LABELS)  # type: ignore[arg-type]


def test_durations() -> None:
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration(90) == 90.0
    for bad in ("5 minutes", -1, True, "m", float("inf")):
        with pytest.raises(ValueError, match="duration like '5m'"):
            parse_duration(bad)


E = "corral_queue_depth > 0"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "r", "expr": E, "fro": 60},
         "alert rule 'r': key 'fro' is unknown; did you mean 'for'? The keys are: name, expr"),
        ({"name": "r", "expr": E, "for": "5 minutes"},
         "key 'for' must be a number of seconds or a duration like '5m' (units ms, s, m, h, "
         "d), got '5 minutes'"),
        ({"name": "r", "expr": E, "keep_firing_for": -3},
         "key 'keep_firing_for' must be a number of seconds >= 0"),
        ({"name": "r"}, "key 'expr' must be a text, got None"),
        ({"expr": E}, "the alerting configuration: key 'name' is missing from the rule (expr "),
        ({"name": "a b", "expr": E}, "key 'name' a rule's name is letters"),
        ({"name": "r", "expr": E, "labels": {"team": 3}}, "key 'labels.team' must be a text"),
        ({"name": "r", "expr": E, "labels": ["team"]}, "key 'labels' must be a table of texts"),
        ({"name": "r", "expr": E, "labels": {"alertname": "x"}},
         "key 'labels.alertname' is the rule's name"),
        # every pool's alert would carry pool="ci": one alert instead of one per pool
        ({"name": "r", "expr": E, "labels": {"pool": "ci"}},
         "key 'labels.pool' is a label of the series the rule matches: each value of it is "
         "an alert of its own, which this label would make one; name it otherwise (e.g. "
         "'pool_group')"),
        ({"name": "r", "expr": f"{E} and corral_workers > 0",
          "labels": {"state": "x"}}, "key 'labels.state'"),
        ({"name": "r", "expr": E, "annotations": {"bad key": "x"}},
         "key 'annotations' names are letters"),
        ({"name": "r", "expr": "corral_queue_dept > 0"},
         "key 'expr' names an unknown metric 'corral_queue_dept'; did you mean "
         "'corral_queue_depth'?"),
        ({"name": "r", "expr": "corral_spilled_bytes > 0"},
         "unknown metric 'corral_spilled_bytes'; did you mean 'corral_spilled_bytes_total'? (a "
         "counter's samples end in _total)"),
        ({"name": "r", "expr": "nothing_like_it > 0"},
         "unknown metric 'nothing_like_it'; docs/monitoring.md lists them"),
        ({"name": "r", "expr": 'corral_queue_depth{pol="a"} > 0'},
         "metric 'corral_queue_depth' has no label 'pol'; did you mean 'pool'?"),
        ({"name": "r", "expr": "sum by (stat) (corral_workers) > 0"},
         "metric 'corral_workers' has no label 'stat'; did you mean 'state'?"),
        ({"name": "r", "expr": "corral_queue_depth > 0 and"},
         "expected a metric name at character 26, got the end"),
        ({"name": "r", "expr": "corral_queue_depth >"}, "expected a number after '>'"),
        ({"name": "r", "expr": "corral_queue_depth 0"}, "expected a comparison"),
        ({"name": "r", "expr": "(corral_queue_depth > 0"}, "expected ')' at character 23"),
        ({"name": "r", "expr": "corral_queue_depth > 0 x"}, "unexpected 'x' at character 23"),
        ({"name": "r", "expr": 'corral_queue_depth{pool=cpu} > 0'},
         "expected a quoted value at character 24"),
        ({"name": "r", "expr": 'corral_queue_depth{pool=~"c"} > 0'},
         "expected '=' or '!=' after 'pool'"),
        ({"name": "r", "expr": "increase(corral_blocks_failed_total[10]) > 0"},
         "expected a duration like '10m'"),
        ({"name": "r", "expr": "corral_queue_depth > 0 # comment"}, "cannot read '# comment'"),
        ({"name": "r", "expr": "  "}, "key 'expr' is empty"),
        ({"name": "r", "expr": E, "action": {"scale_in": {}}},
         "key 'action.scale_in' is unknown; did you mean 'action.scale_out'?"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "max_block": 3}}},
         "key 'action.scale_out.max_block' is unknown; "
         "did you mean 'action.scale_out.max_blocks'?"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "fit": True}}},
         "needs exactly one of 'by = N'"),
        ({"name": "r", "expr": E, "action": {"scale_out": {}}}, "needs exactly one of"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 0}}},
         "key 'action.scale_out.by' must be a whole number >= 1, got 0"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"fit": "yes"}}},
         "key 'action.scale_out.fit' must be true or false"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "restore": 1}}},
         "key 'action.scale_out.restore' must be true or false, got 1"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "max_cost": -1}}},
         "key 'action.scale_out.max_cost' must be worker-hours per hour > 0, got -1"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "max_blocks": 1.5}}},
         "key 'action.scale_out.max_blocks' must be a whole number >= 1"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "cooldown": "soon"}}},
         "key 'action.scale_out.cooldown' must be a number of seconds"),
        ({"name": "r", "expr": E, "action": {"scale_out": {"by": 1, "pool": ""}}},
         "key 'action.scale_out.pool' must be a pool's name"),
        ({"name": "r", "expr": E, "action": "scale_out"}, "key 'action' must be"),
    ],
)  # fmt: skip
def test_bad_rules_are_refused_with_what_to_do(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(AlertConfigError) as info:
        parse_rule(raw, SAMPLE_LABELS)
    assert message in str(info.value)
    assert str(info.value).endswith("See docs/monitoring.md#alert-rules.")
    assert isinstance(info.value, ValueError)


def test_a_rule_built_directly_checks_its_syntax() -> None:
    assert AlertRule("x", "corral_queue_depth > 1").for_ == 0.0
    bads: list[dict[str, Any]] = [{}, {"by": 1, "fit": True}, {"by": 0}]
    for bad in bads:
        with pytest.raises(ValueError, match="scale_out needs by >= 1 or fit"):
            ScaleOut(**bad)
    with pytest.raises(AlertConfigError, match="'x': key 'expr' expected a number"):
        AlertRule("x", "corral_queue_depth > y")


@pytest.mark.parametrize(
    ("threshold", "problem"),
    [
        # beyond a float's range: float() reads these as infinity
        ("1e400", "after '>' at character 62 must be a finite number, got '1e400', which "
                  "reads as inf"),
        ("-1e400", "after '>' at character 62 must be a finite number, got '-1e400', which "
                   "reads as -inf"),
        ("+1e309", "got '+1e309', which reads as inf"),
        # the words float() reads as inf and nan
        ("nan", "after '>' at character 62 must be a finite number, got 'nan'"),
        ("NaN", "got 'NaN'"),
        ("inf", "got 'inf'"),
        ("-inf", "after '>' at character 62 must be a finite number, got '-inf'"),
        ("+Infinity", "got '+Infinity'"),
    ],
    ids=lambda v: v if " " not in v else "",
)  # fmt: skip
def test_a_threshold_that_is_not_a_finite_number_is_refused(threshold: str, problem: str) -> None:
    expr = f"corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > {threshold}"
    raw = {"name": "Endless", "expr": expr}
    # a rule as data (a dict, a table of a TOML file keyed by name or in a list),
    # and one built directly: the same typed error, naming the rule and the value
    attempts: list[Any] = [
        lambda: parse_rule(raw, SAMPLE_LABELS),
        lambda: parse_rules([raw], SAMPLE_LABELS),
        lambda: parse_rules({"Endless": {"expr": expr}}, SAMPLE_LABELS),
        lambda: AlertRule("Endless", expr),
    ]
    for attempt in attempts:
        with pytest.raises(AlertConfigError) as info:
            attempt()
        err = info.value
        assert (err.rule, err.key) == ("Endless", "expr")
        assert str(err).startswith("alert rule 'Endless': key 'expr' the threshold ")
        assert problem in str(err)
        assert str(err).endswith(
            "; give a number such as 0, 60 or 1.5e3. See docs/monitoring.md#alert-rules."
        )
    # the largest finite float is a threshold like any other
    big = parse_rule({"name": "Big", "expr": "corral_queue_depth > 1e308"}, SAMPLE_LABELS)
    assert [c.threshold for c in compares(big.parsed)] == [1e308]


# ----------------------------------------------------------------------------- metric names


def test_the_sample_names_cover_every_metric_family() -> None:
    names = set(SAMPLE_LABELS)
    for family in SnapshotCollector(MetricsReply()).collect():
        suffixes = {"counter": ["_total"], "summary": ["_count", "_sum"]}.get(family.type, [""])
        for suffix in suffixes:
            assert family.name + suffix in names, family.name


def test_default_rules_name_only_metrics_a_real_manager_exports() -> None:
    # the autoscaler's core gives the block numbers, as the manager asks it
    auto = AutoscalerState()
    limits = PoolLimits(max_blocks=4, init_blocks=1, slots_per_block=6)
    cmds = auto.handle(TargetSet(0.0, "cpu", 2, BlockSpec(workers=3, threads=2), limits))
    first, second = (c.request for c in cmds if isinstance(c, StartBlock))
    auto.handle(BlockStarted(1.0, first, "b1", ("w1",), "running"))
    auto.handle(BlockStartFailed(2.0, second, "exec failed"))  # not the batch system's
    auto.handle(BlockEnded(3.0, "b1", "failed"))
    blocks = auto.block_metrics(4.0, {})
    assert blocks["cpu"]["failed"] == 2
    assert (blocks["cpu"]["slots_per_block"], blocks["cpu"]["workers_per_block"],
            blocks["cpu"]["max_blocks"]) == (6, 3, 4)  # fmt: skip
    reply = MetricsReply(
        pools={"cpu": PoolMetrics(queue_depth=1, workers={"idle": 0, "busy": 0, "draining": 0})},
        blocks={p: BlockMetrics(**m) for p, m in blocks.items()},
        # as the scheduler counts a task that failed with InputsUnreachable
        # (tests/test_scheduler_failures.py)
        failures=(FailureCount("c", "missing", "InputsUnreachable", 1),),
    )
    got = samples(reply)
    cpu = (("pool", "cpu"),)
    assert got[("corral_blocks_failed_total", cpu)] == 2.0
    assert got[("corral_pool_slots_per_block", cpu)] == 6.0
    assert got[("corral_pool_workers_per_block", cpu)] == 3.0
    assert got[("corral_pool_max_blocks", cpu)] == 4.0
    exported = {name for name, _ in got}
    for r in parse_rules(DEFAULT_RULES, SAMPLE_LABELS):
        for c in compares(r.parsed):
            v: Any = c.vector
            while not hasattr(v, "name") and not hasattr(v, "selector"):
                v = v.inner
            name = v.selector.name if hasattr(v, "selector") else v.name
            assert name in exported, (r.name, name)
    # an unconfigured pool: its size from the block spec, no max_blocks
    auto = AutoscalerState()
    auto.handle(TargetSet(0.0, "p", 1, BlockSpec(workers=2, threads=4)))
    m = auto.block_metrics(1.0, {})["p"]
    assert (m["slots_per_block"], m["workers_per_block"], m["max_blocks"]) == (8, 2, 0)


def test_the_docs_list_the_default_rules_as_they_are() -> None:
    text = (Path(__file__).parent.parent / "docs" / "monitoring.md").read_text()
    rows = re.findall(r"^\| `(Corral\w+)` \| `(.+?)` \| (\w+) \| (P\d) \|", text, re.M)
    assert [(n, e) for n, e, _, _ in rows] == [(d["name"], d["expr"]) for d in DEFAULT_RULES]
    for (_, _, for_, priority), d in zip(rows, DEFAULT_RULES, strict=True):
        assert parse_duration(for_ if for_ != "0" else 0) == parse_duration(d.get("for", 0))
        assert priority == d["labels"]["priority"]


def test_a_busy_autoscaler_leaves_the_block_alerts_as_they_are() -> None:
    (d,) = [d for d in DEFAULT_RULES if d["name"] == "CorralProvisioningStuck"]
    st = AlertState([parse_rule(d, SAMPLE_LABELS), rule(**{"for": 0})])
    stuck = snap(blocks={"cpu": {"states": {"pending": 1}, "oldest_pending": 700.0}})
    st.handle(Evaluate(0.0, stuck))
    assert notes(st.handle(Evaluate(60.0, stuck)))[0][:2] == ("CorralProvisioningStuck", "firing")
    busy = samples(MetricsReply(pools={"cpu": PoolMetrics(queue_depth=1, oldest_wait=70.0)},
                                autoscaler_busy=True))  # fmt: skip
    assert ("corral_blocks_pending_oldest_seconds", (("pool", "cpu"),)) not in busy
    # the block rule keeps its state; the queue rule, whose metrics are there, goes on
    assert notes(st.handle(Evaluate(70.0, busy)))[0][:2] == ("QueueTime", "firing")
    assert [(a.name, a.state) for a in st.alerts()] == [
        ("CorralProvisioningStuck", "firing"), ("QueueTime", "firing"),
    ]  # fmt: skip
    assert notes(st.handle(Evaluate(80.0, stuck)))[0][:2] == ("QueueTime", "resolved")
    assert [(a.name, a.state) for a in st.alerts()] == [
        ("CorralProvisioningStuck", "firing"), ("QueueTime", "resolved"),
    ]  # fmt: skip
    # an answer without the stuck block resolves it
    cmds = st.handle(Evaluate(90.0, snap(blocks={"cpu": {"states": {"running": 1}}})))
    assert notes(cmds)[0][:2] == ("CorralProvisioningStuck", "resolved")


def test_the_docs_list_every_metric_by_its_sample_name() -> None:
    text = (Path(__file__).parent.parent / "docs" / "monitoring.md").read_text()
    listed = set(re.findall(r"^\| `(corral_\w+)` \| (?:gauge|counter|summary) \|", text, re.M))
    writer = SimpleNamespace(path=Path("no such file"), dropped={}, pending=0)
    collectors = (
        SnapshotCollector(MetricsReply()),
        RefusalCollector(dict),
        ManagerCollector(lambda: 0.0, lambda: writer),
    )
    families = {
        f.name + ("_total" if f.type == "counter" else "") for c in collectors for f in c.collect()
    }
    assert listed == families


def test_values_in_annotations_read_well() -> None:
    r = rule(expr="corral_queue_oldest_wait_seconds > 0.5", annotations={"v": "{{ $value }}"})
    st = AlertState([r])
    for wait, shown in ((61.25, "61.25"), (3720.0, "3720"), (float("inf"), "inf")):
        st.handle(Evaluate(0.0, queue(1, wait)))
        assert st.alerts()[0].annotations == {"v": shown}


# ----------------------------------------------------------------------------- the story


class _Pool:
    """A pool on a virtual clock: blocks of 2 slots that run 60 s per task and take
    ``delay`` seconds from request to running; tasks wait in one queue."""

    def __init__(self, blocks: int, tasks: int, delay: float) -> None:
        self.delay = delay
        self.ready_at = [0.0] * blocks  # when each block runs
        self.queued = [0.0] * tasks  # when each waiting task became ready
        self.running: list[float] = []  # when each running task ends
        self.done = 0

    def step(self, now: float) -> None:
        self.done += sum(1 for end in self.running if end <= now)
        self.running = [end for end in self.running if end > now]
        slots = 2 * sum(1 for t in self.ready_at if t <= now)
        while self.queued and len(self.running) < slots:
            self.queued.pop(0)
            self.running.append(now + 60.0)

    def samples(self, now: float) -> Samples:
        up = sum(1 for t in self.ready_at if t <= now)
        states = {"running": up, "pending": len(self.ready_at) - up}
        return snap(
            {"cpu": {"queue_depth": len(self.queued),
                     "oldest_wait": now - self.queued[0] if self.queued else 0.0,
                     "running": len(self.running),
                     "workers": {"idle": 0, "busy": up, "draining": 0}}},
            {"cpu": {"target": len(self.ready_at), "states": states, "slots_per_block": 2,
                     "max_blocks": 6, "workers_per_block": 1}},
        )  # fmt: skip


def test_a_burst_fires_the_queue_alert_scales_out_within_bounds_and_resolves() -> None:
    raw = dict(DEFAULT_RULES[0])
    raw["action"] = {"scale_out": {"fit": True, "cooldown": "2m", "restore": False}}
    st = AlertState([parse_rule(raw, SAMPLE_LABELS)])
    pool = _Pool(blocks=1, tasks=20, delay=120.0)
    seen: list[tuple[float, str]] = []
    scales: list[tuple[float, int]] = []
    fired: dict[str, float] = {}
    for step in range(0, 200):
        now = step * 10.0
        pool.step(now)
        for c in st.handle(Evaluate(now, pool.samples(now))):
            if isinstance(c, Notify):
                seen.append((now, c.alert.state))
                if c.alert.state == "firing":
                    fired = dict(c.alert.fields)
            elif isinstance(c, Scale):
                scales.append((now, c.target))
                pool.ready_at += [now + pool.delay] * (c.target - len(pool.ready_at))
        if pool.done == 20 and seen[-1][1] == "resolved":
            break
    # the oldest task waited over 60 s at 70: pending; a minute on, firing
    assert seen == [(70.0, "pending"), (130.0, "firing"), (seen[-1][0], "resolved")]
    # at 130, 4 tasks ran, 2 run, 14 wait (120 s + 10 s): ceil((2 + 14) / 2) = 8 blocks
    # wanted, 6 allowed; the new blocks run at 250 and the queue drains
    assert scales == [(130.0, 6)]
    assert fired == {
        "max_queue_size": 16.0,  # at 70: 20 - 2 done - 2 running
        "max_queue_time_mins": 2.2,  # 130 s at 130
        "queue_size_threshold": 0.0,
        "queue_time_threshold": 1.0,
        "threshold_breached": 1.0,
    }
    assert [a.line for a in st.audit] == [
        "alert CorralQueueTime{pool=cpu}: scale pool cpu out from 1 to 6 blocks (fit 2 "
        "running and 14 ready tasks at 2 per block, with 1 running and 0 pending blocks, "
        "capped by the pool's max_blocks 6: corral_queue_depth = 14 > 0 and "
        "corral_queue_oldest_wait_seconds = 130 > 60)",
        "alert CorralQueueTime{pool=cpu}: no scale-out of pool cpu: cooldown, scaled 10 s "
        "ago, waits 120 s (corral_queue_depth = 14 > 0 and corral_queue_oldest_wait_seconds "
        "= 140 > 60)",
    ]
    assert seen[-1][0] == 250.0  # the 6 blocks run at 250 and take the whole queue


# ----------------------------------------------------------------------------- properties


_SELECTOR = hs.builds(
    lambda name, matcher: name + matcher,
    hs.sampled_from(["corral_queue_depth", "corral_tasks_running", "corral_workers_throttled"]),
    hs.sampled_from(["", '{pool="cpu"}', '{pool!="*"}', '{pool="a",pool!="b",}']),
)
_VECTOR = hs.one_of(
    _SELECTOR,
    hs.builds("sum by (pool) ({})".format, _SELECTOR),
    hs.builds("sum({})".format, _SELECTOR),
    hs.just('sum by (pool, state) (corral_workers{state="busy"})'),
    hs.just("increase(corral_blocks_failed_total[5m])"),
)
_COMPARE = hs.builds(
    "{} {} {}".format,
    _VECTOR,
    hs.sampled_from([">", ">=", "<", "<=", "==", "!="]),
    hs.sampled_from(["0", "1.5", "-2", "1e3", ".5"]),
)
_EXPR = hs.recursive(
    _COMPARE,
    lambda inner: hs.one_of(
        hs.builds("{} and {}".format, inner, inner),
        hs.builds("{} or {}".format, inner, inner),
        hs.builds("({})".format, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(_EXPR, hs.data())
def test_expressions_parse_and_any_cut_is_refused_with_a_config_error(
    text: str, data: hs.DataObject
) -> None:
    r = parse_rule({"name": "r", "expr": text}, SAMPLE_LABELS)
    assert parse_rule(r.to_dict(), SAMPLE_LABELS) == r
    AlertState([r]).handle(Evaluate(0.0, queue(3, 100.0)))
    # the text cut anywhere, or with one character dropped: a rule or a refusal
    i = data.draw(hs.integers(0, len(text) - 1))
    for broken in (text[:i], text[:i] + text[i + 1 :]):
        try:
            parse_rule({"name": "r", "expr": broken}, SAMPLE_LABELS)
        except AlertConfigError as err:
            assert err.key == "expr"


_STEP = hs.tuples(
    hs.integers(0, 30),  # queue depth
    hs.sampled_from([0.0, 30.0, 90.0, 4000.0]),  # oldest wait
    hs.integers(0, 3),  # blocks pending
    hs.integers(1, 60),  # seconds to the next evaluation
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=hs.lists(_STEP, min_size=1, max_size=40),
    fit=hs.booleans(),
    max_blocks=hs.integers(1, 12),
    max_cost=hs.sampled_from([None, 6.0, 13.5]),
    keep=hs.sampled_from([0.0, 45.0]),
)
def test_alerts_move_by_the_rules_and_actions_stay_bounded(
    steps: list[tuple[int, float, int, int]],
    fit: bool,
    max_blocks: int,
    max_cost: float | None,
    keep: float,
) -> None:
    action: dict[str, Any] = {"fit": True} if fit else {"by": 2}
    action.update(cooldown=100, max_blocks=max_blocks, restore=False)
    if max_cost is not None:
        action["max_cost"] = max_cost
    st = AlertState([rule(**{"keep_firing_for": keep, "action": {"scale_out": action}})])
    target, now, state = 1, 0.0, "inactive"
    last_scale: float | None = None
    resolved_at: float | None = None  # the resolved alert listed, until one fires again
    allowed = {  # the notifications each state may be followed by
        "inactive": {"pending"},
        "pending": {"firing"},  # a pending alert that clears is dropped quietly
        "firing": {"resolved"},
        "resolved": {"pending"},
    }
    for depth, wait, pending, gap in steps:
        now += gap
        running = max(target - pending, 0)
        b = pool_blocks(target, running=running, pending=target - running, slots_per_block=3,
                        max_blocks=10, workers_per_block=2)  # fmt: skip
        holds = depth > 0 and wait > 60
        for c in st.handle(Evaluate(now, queue(depth, wait, **b))):
            if isinstance(c, Notify):
                assert c.alert.state in allowed[state], (state, c.alert.state)
                state = c.alert.state
                assert c.alert.fields["threshold_breached"] == (state != "resolved")
                if state == "resolved":
                    resolved_at = c.alert.resolved_at
                elif state == "firing":
                    resolved_at = None
            elif isinstance(c, Scale):
                assert holds and state == "firing"
                assert target < c.target <= min(max_blocks, 10)
                if max_cost is not None:
                    assert c.target * 2 <= max_cost
                assert last_scale is None or now - last_scale >= 100
                last_scale, target = now, c.target
        if state == "pending" and not holds:
            state = "inactive"
        if resolved_at is not None and now - resolved_at >= 900:  # forgotten
            resolved_at = None
            state = "inactive" if state == "resolved" else state
        alerts = st.alerts()
        if state in ("inactive", "resolved") and holds:
            raise AssertionError("the condition holds but no alert is pending or firing")
        # a resolved alert stays listed its 15 minutes, before a pending one of its labels
        kept = ["resolved"] if resolved_at is not None and state != "resolved" else []
        assert [a.state for a in alerts] == kept + ([] if state == "inactive" else [state])


def test_the_error_crosses_processes_with_its_fields() -> None:
    err = AlertConfigError("r", "for", "must be a number", "alerts.toml")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is AlertConfigError and str(back) == str(err)
    assert (back.rule, back.key, back.problem, back.source) == (
        "r", "for", "must be a number", "alerts.toml"
    )  # fmt: skip
    assert str(err) == (
        "alert rule 'r' in alerts.toml: key 'for' must be a number. See "
        "docs/monitoring.md#alert-rules."
    )


def test_samples_are_what_the_metrics_page_shows() -> None:
    reply = MetricsReply(
        pools={"cpu": PoolMetrics(queue_depth=7, oldest_wait=62.5, wait_quantiles={"0.9": 3.0},
                                  waits=4, wait_sum=9.5, workers={"idle": 1, "busy": 2})},
        categories={"inc": CategoryMetrics(4, 2.5, 400, 10, 99)},
        failures=(FailureCount("inc", "error", "ValueError", 2),),
        tasks_by_state={"queued": 7},
        tasks_created=11,
        workers=3,
        blocks={"cpu": BlockMetrics({"running": 2}, 0.0, 2, 2, 4, 8, 2, 1)},
    )  # fmt: skip
    shown = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(render(reply).decode())
        for s in family.samples
    }
    assert samples(reply) == shown


# ----------------------------------------------------------------------------- a throttled run


def default_rules(*names: str) -> list[AlertRule]:
    return [parse_rule(d, SAMPLE_LABELS) for d in DEFAULT_RULES if d["name"] in names]


def test_a_throttled_run_whose_tasks_flow_pages_for_memory_not_for_the_queue() -> None:
    """User audit (memprio, defect 8), decided in docs/monitoring.md (`CorralQueueTime`
    during a throttled run): the memory policy holds producers back for seconds at a
    time (the audit: 0.04-4 s), so ready tasks that flow past throttled, busy workers do
    not fire the queue alert, however long the run; `CorralMemoryStalled` (P3) says
    memory is the reason after five minutes. A backlog older than a minute fires the
    queue alert, throttled or not (memory is capacity: another worker would run it),
    and so does a queue with no worker at all. Ten minutes on a virtual clock, one
    evaluation every 5 s."""
    rules = default_rules("CorralQueueTime", "CorralMemoryStalled", "CorralNoWorkers")
    busy = {"idle": 0, "busy": 3, "draining": 0}

    def run(wait: Callable[[float], float], workers: dict[str, int], connected: int) -> list[Any]:
        st = AlertState(rules)
        for t in range(0, 601, 5):
            pools = {
                "*": {"queue_depth": 18, "oldest_wait": wait(t)},
                "default": {"throttled": 3, "workers": workers, "cores": 6, "cores_busy": 6},
            }
            st.handle(Evaluate(float(t), snap(pools, workers=connected)))
        return sorted((a.name, a.labels["pool"], a.state) for a in st.alerts())

    flowing = run(lambda t: t % 8, busy, 3)  # producers wait at most 8 s, then run
    assert flowing == [("CorralMemoryStalled", "default", "firing")]
    backlog = run(lambda t: float(t), busy, 3)  # the oldest ready task never starts
    assert ("CorralQueueTime", "*", "firing") in backlog
    none = {"idle": 0, "busy": 0, "draining": 0}
    nobody = run(lambda t: float(t), none, 0)
    assert ("CorralNoWorkers", "*", "firing") in nobody and (
        "CorralQueueTime",
        "*",
        "firing",
    ) in nobody


def test_the_stuck_and_stalled_rules_name_blocks_kept_for_outputs() -> None:
    """Audit checkpoint, finding 1: a tasks_per_worker pool's blocks kept up for the
    outputs a fan-in reads hold the partition while its new blocks stay pending and its
    ready tasks wait. The provisioning and the placement rules name them as the cause
    and what helps."""
    rules = {d["name"]: d for d in DEFAULT_RULES}
    st = AlertState(
        [parse_rule(rules[n], SAMPLE_LABELS)
         for n in ("CorralProvisioningStuck", "CorralPlacementStalled")]
    )  # fmt: skip
    stuck = snap(
        pools={"ckpt": {"queue_depth": 2, "placement_stalled": 1}},
        blocks={"ckpt": {"states": {"pending": 2}, "oldest_pending": 700.0}},
    )
    st.handle(Evaluate(0.0, stuck))
    told = {n.alert.name: n.alert for n in only(st.handle(Evaluate(60.0, stuck)), Notify)}
    assert told["CorralProvisioningStuck"].annotations["description"] == (
        "The oldest block of pool ckpt not running yet was requested 700 s ago: check the "
        "batch system's queue. With tasks_per_worker, blocks kept up for outputs a waiting "
        "task reads (a placement stall of the pool whose idle workers are kept, "
        "CorralPlacementStalled) may hold the room it waits for: release the results you "
        "no longer need, or set a max_blocks the partition can run beside them."
    )
    assert (
        told["CorralPlacementStalled"]
        .annotations["description"]
        .endswith(
            "for kept (blocks of a tasks_per_worker pool kept up for outputs a waiting task "
            "reads, which may hold the room its pending blocks wait for), release the results "
            "you no longer need, set a max_blocks the partition can run beside them, or cancel "
            "a kept block (its outputs are computed again)."
        )
    )


def test_a_task_running_over_an_hour_fires_the_running_long_rule() -> None:
    """User audit (failures, 6): a hung task with no ``timeout=`` got no signal
    anywhere, though ``corral_task_longest_running_seconds`` grew. The default
    ``CorralTaskRunningLong`` goes pending past an hour and fires five minutes later,
    naming the pool; a try that ends before then says nothing. A virtual clock, one
    evaluation a minute."""
    (r,) = default_rules("CorralTaskRunningLong")

    def run(longest: Callable[[float], float]) -> list[Notify]:
        st, told = AlertState([r]), []
        for t in range(0, 2 * 3600, 60):
            pools = {"default": {"longest_running": longest(float(t)), "running": 1}}
            told += only(st.handle(Evaluate(float(t), snap(pools))), Notify)
        return told

    hung = run(lambda t: t)  # began at 0, never ends
    states = [(n.alert.state, n.alert.labels["pool"], n.alert.active_since) for n in hung]
    assert states == [("pending", "default", 3660.0), ("firing", "default", 3660.0)]
    fired = hung[1].alert
    assert fired.annotations["summary"] == "A task of pool default has run over an hour"
    assert "3960 s" in fired.annotations["description"]
    assert "timeout=" in fired.annotations["description"]
    ended = run(lambda t: t if t < 3720 else 0.0)  # ended within the `for`
    assert "firing" not in [n.alert.state for n in ended]
