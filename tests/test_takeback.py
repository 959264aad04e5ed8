"""Tries queued on a worker behind tries that hold all its threads are taken back.

The longrun audit: a hung task (and its speculative copy) held a worker's only thread
while tasks of another client's batch were queued behind it there for 7 minutes, though
another worker had free cores. The pure core takes such tries back on its clock
(``SchedulerConfig.takeback_after``), cancels them on the first worker and places them
again; exact commands are asserted.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.scheduler_events import (
    CancelOnWorker,
    Event,
    Execute,
    FilesReleased,
    GraphSubmitted,
    KeysReleased,
    TasksFinished,
    TasksRunning,
    Tick,
    WorkerJoined,
    WorkerMemory,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from runtime.graph import Key
from tests.helpers import Factory, make_state, of, result, specs_for

__all__ = ["make_state"]

T0 = 1_000_000.0
_n = iter(range(10**9))


def at(s: SchedulerState, cls: type[Event], now: float, **fields: Any) -> list[Any]:
    cmds = s.handle(cls(stimulus_id=f"{cls.__name__}-{next(_n)}", now=now, **fields))
    s.validate()
    return cmds


def sent(cmds: list[Any]) -> list[tuple[str, Key]]:
    return [(c.worker, t.key) for c in of(cmds, Execute) for t in c.tasks]


def cancelled(cmds: list[Any]) -> list[tuple[str, Key]]:
    return [(c.worker, k) for c in of(cmds, CancelOnWorker) for k in c.keys]


def hung_on_w1(make_state: Factory, **config: Any) -> SchedulerState:
    """w1 (one core, two slots) got t-0 and t-1 at T0 and says at T0 + 1 that t-0
    executes; t-1 waits behind it. w2 (one core) joins idle at T0 + 2."""
    s = make_state(speculation="off", unknown_long=False, long_task=float("inf"), **config)
    at(s, WorkerJoined, T0 - 1, worker="w1", cores=1, memory=2**30)
    keys = ["t-0", "t-1"]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    out = at(s, GraphSubmitted, T0, specs=specs, wanted=tuple(keys))
    assert sent(out) == [("w1", "t-0"), ("w1", "t-1")]
    attempt = s._attempt_on(s.tasks["t-0"], "w1")
    assert at(s, TasksRunning, T0 + 1, worker="w1", started=(("t-0", attempt, 1.0),)) == []
    assert at(s, WorkerJoined, T0 + 2, worker="w2", cores=1, memory=2**30) == []
    return s


def test_a_try_queued_behind_a_hung_one_moves_to_a_free_worker(make_state: Factory) -> None:
    s = hung_on_w1(make_state)
    assert at(s, Tick, T0 + 9.9) == []  # waited under takeback_after (10 s)
    out = at(s, Tick, T0 + 10.1)
    assert cancelled(out) == [("w1", "t-1")] and sent(out) == [("w2", "t-1")]
    assert [(t.worker, t.outcome, t.cause) for t in s.tasks["t-1"].tries] == [
        ("w1", "cancelled", "moved")
    ]
    assert ("t-1", "processing", "taken-back:w1") in [e[:3] for e in s.story("t-1")]
    # w1's thread is held by t-0: nothing new is queued behind it ...
    specs = specs_for(s, {"u-0": []}, ["u-0"])
    assert sent(at(s, GraphSubmitted, T0 + 11, specs=specs, wanted=("u-0",))) == [("w2", "u-0")]
    specs = specs_for(s, {"u-1": []}, ["u-1"])
    assert sent(at(s, GraphSubmitted, T0 + 12, specs=specs, wanted=("u-1",))) == []
    # ... not on the late report of the taken-back try (stale: t-1 runs on w2) ...
    res = result("t-1", "cancelled", start=T0 + 12, duration=0.0)
    assert sent(at(s, TasksFinished, T0 + 12.5, worker="w1", results=(res,))) == []
    assert s.tasks["t-1"].worker == "w2"
    # ... but once the try holding its thread ends.
    res = result("t-0", "ok", start=T0, duration=13.0)
    assert sent(at(s, TasksFinished, T0 + 13, worker="w1", results=(res,))) == [("w1", "u-1")]


def test_nothing_moves_while_the_worker_may_be_running_it(make_state: Factory) -> None:
    """Without a report that other tries fill its threads, the waiting try may be
    executing (begun under 0.5 s ago): it stays, however long ago it was sent."""
    s = make_state(speculation="off", unknown_long=False, long_task=float("inf"))
    at(s, WorkerJoined, T0 - 1, worker="w1", cores=1, memory=2**30)
    specs = specs_for(s, {"t-0": [], "t-1": []}, ["t-0", "t-1"])
    at(s, GraphSubmitted, T0, specs=specs, wanted=("t-0", "t-1"))
    at(s, WorkerJoined, T0 + 2, worker="w2", cores=1, memory=2**30)
    assert at(s, Tick, T0 + 100) == []


def test_no_other_free_worker_or_takeback_off_means_no_move(make_state: Factory) -> None:
    s = hung_on_w1(make_state, takeback_after=float("inf"))
    assert at(s, Tick, T0 + 1000) == []
    s = hung_on_w1(make_state)
    keys = ["u-0", "u-1"]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    out = at(s, GraphSubmitted, T0 + 3, specs=specs, wanted=tuple(keys))
    assert sent(out) == [("w2", "u-0"), ("w2", "u-1")]
    assert at(s, Tick, T0 + 50) == []  # w2's slots are full: it is not free


def test_every_try_waiting_goes_back_to_the_queue_while_another_worker_is_free(
    make_state: Factory,
) -> None:
    """Moved only as fast as the other worker had a core free of tasks, tries still
    waited up to 43 s behind a hang (the audit's reproduction, with the first version):
    all of them go back to the ready queue, and from there to the first slot free."""
    s = hung_on_w1(make_state, saturation=4.0)  # w1: 4 slots, t-0 and t-1 on it
    keys = ["v-0", "v-1"]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    assert sent(at(s, GraphSubmitted, T0 + 2.5, specs=specs, wanted=tuple(keys))) == [
        ("w2", "v-0"),
        ("w2", "v-1"),
    ]
    keys = ["x-0", "x-1", "x-2"]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    out = at(s, GraphSubmitted, T0 + 2.6, specs=specs, wanted=tuple(keys))
    on_w1 = sorted(t for w, t in sent(out) if w == "w1")
    assert len(on_w1) == 2 and len(sent(out)) == 3
    # At T0 + 12.7 w2 (4 slots, 3 tasks) is free: every try waiting 10 s on w1 moves,
    # and the first by priority takes w2's free slot.
    out = at(s, Tick, T0 + 12.7)
    assert sorted(cancelled(out)) == [("w1", k) for k in ["t-1", *on_w1]]
    assert sent(out) == [("w2", "t-1")]
    assert s.count("queued") == 2 and not s.workers["w1"].waiting


def test_producers_deferred_on_a_throttled_worker_move_to_a_free_one(
    make_state: Factory,
) -> None:
    """A worker holding a client's 500 MB output, spilling off, kept a producer deferred
    for ever (it did not fit under its fences), throttled, while its peer idled: the
    memory watchdog needs every worker of the pool throttled, so nothing failed either.
    Producers waiting on a throttled worker for ``takeback_after`` go back to the queue
    while a worker that is not throttled is free, and from there to it."""
    s = make_state(
        speculation="off", unknown_long=False, long_task=float("inf"), stall_timeout=1000.0
    )  # the memory watchdog would fail them while every worker is throttled
    at(s, WorkerJoined, T0 - 1, worker="w1", cores=1, memory=2**30)
    keys = ["p-0", "p-1"]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    assert sent(at(s, GraphSubmitted, T0, specs=specs, wanted=tuple(keys))) == [
        ("w1", "p-0"),
        ("w1", "p-1"),
    ]
    assert s.tasks["p-0"].producer  # no deps, nothing known yet: a loader
    memory = {"rss": 600 * 2**20, "throttle_at": 700 * 2**20, "limit": 2**30}
    at(s, WorkerMemory, T0 + 0.5, worker="w1", throttled=True, **memory)
    assert at(s, Tick, T0 + 30) == []  # no other worker: they wait (the watchdog's case)
    at(s, WorkerJoined, T0 + 31, worker="w2", cores=1, memory=2**30)
    at(s, WorkerMemory, T0 + 31, worker="w2", throttled=True, **memory)
    assert at(s, Tick, T0 + 32) == []  # the free worker is throttled too: no move
    at(s, WorkerMemory, T0 + 33, worker="w2", throttled=False, **memory)
    out = at(s, Tick, T0 + 34)
    assert sorted(cancelled(out)) == [("w1", "p-0"), ("w1", "p-1")]
    assert sent(out) == [("w2", "p-0"), ("w2", "p-1")]
    assert [(t.worker, t.outcome, t.cause) for t in s.tasks["p-0"].tries] == [
        ("w1", "cancelled", "moved")
    ]
    assert ("p-0", "processing", "taken-back:w1 (throttled)") in [e[:3] for e in s.story("p-0")]


def test_a_producer_executing_on_a_throttled_worker_stays(make_state: Factory) -> None:
    """Only producers that have not begun move: one the worker said executes stays."""
    s = make_state(speculation="off", unknown_long=False, long_task=float("inf"))
    at(s, WorkerJoined, T0 - 1, worker="w1", cores=2, memory=2**30)
    specs = specs_for(s, {"p-0": [], "p-1": []}, ["p-0", "p-1"])
    assert len(sent(at(s, GraphSubmitted, T0, specs=specs, wanted=("p-0", "p-1")))) == 2
    attempt = s._attempt_on(s.tasks["p-0"], "w1")
    at(s, TasksRunning, T0 + 1, worker="w1", started=(("p-0", attempt, 1.0),))
    memory = {"rss": 600 * 2**20, "throttle_at": 700 * 2**20, "limit": 2**30}
    at(s, WorkerMemory, T0 + 1, worker="w1", throttled=True, **memory)
    at(s, WorkerJoined, T0 + 2, worker="w2", cores=1, memory=2**30)
    out = at(s, Tick, T0 + 60)
    assert cancelled(out) == [("w1", "p-1")] and sent(out) == [("w2", "p-1")]
    assert s.tasks["p-0"].worker == "w1"


def test_takeback_after_is_checked() -> None:
    with pytest.raises(ValueError, match="takeback_after"):
        SchedulerConfig(takeback_after=-1.0)


def test_the_pool_metrics_show_the_try_waiting_on_a_worker_and_the_longest_running(
    make_state: Factory,
) -> None:
    """Tries queued on a worker are not in the queue depth: the audit's stall showed
    queue depth 0 and oldest wait 0 for 7 minutes. The core says how long the oldest
    try not known to execute has been on its worker, and how long the longest one
    executing has run, from its workers' own records (no task gone through)."""
    s = hung_on_w1(make_state, takeback_after=float("inf"))
    m = s.pool_metrics(T0 + 400)["default"]
    assert m["queue_depth"] == 0 and m["oldest_wait"] == 0.0
    assert m["worker_queue_oldest"] == 400.0  # t-1, sent at T0
    assert m["longest_running"] == 400.0  # t-0, executing since T0 (1 s said at T0 + 1)
    res = result("t-0", "ok", start=T0, duration=400.5)
    at(s, TasksFinished, T0 + 400.5, worker="w1", results=(res,))
    m = s.pool_metrics(T0 + 401)["default"]
    assert m["longest_running"] == 0.0 and m["worker_queue_oldest"] == 401.0


def test_the_metrics_and_the_default_rule_for_a_try_stuck_on_its_worker() -> None:
    from actors.alerts_state import DEFAULT_RULES
    from runtime.messages import MetricsReply, PoolMetrics
    from runtime.metrics import render

    snap = MetricsReply(pools={"p": PoolMetrics(worker_queue_oldest=420.0, longest_running=9.5)})
    text = render(snap).decode()
    assert 'corral_worker_queue_oldest_seconds{pool="p"} 420.0' in text
    assert 'corral_task_longest_running_seconds{pool="p"} 9.5' in text
    rule = {r["name"]: r for r in DEFAULT_RULES}["CorralTaskStuckOnWorker"]
    assert rule["expr"] == "corral_worker_queue_oldest_seconds > 300"


#: a worker's memory report while it holds outputs, spilling off (throttled or not)
HOLDING = {"rss": 600 * 2**20, "throttle_at": 700 * 2**20, "limit": 2**30}


def deferred_on_w1_then_taken_to_w2(s: SchedulerState) -> dict[str, int]:
    """The producer p-0 goes to w1 (joined) at T0; w2 joins, w1 throttles (``HOLDING``)
    with p-0 deferred, and at T0 + 11 p-0 is taken back to w2; returns ``HOLDING``."""
    specs = specs_for(s, {"p-0": []}, ["p-0"])
    assert sent(at(s, GraphSubmitted, T0, specs=specs, wanted=("p-0",))) == [("w1", "p-0")]
    at(s, WorkerJoined, T0 + 0.1, worker="w2", cores=1, memory=2**30)
    at(s, WorkerMemory, T0 + 0.5, worker="w1", throttled=True, **HOLDING)
    out = at(s, Tick, T0 + 11)
    assert cancelled(out) == [("w1", "p-0")] and sent(out) == [("w2", "p-0")]
    return HOLDING


def test_a_producer_no_worker_has_room_for_is_not_bounced_between_them(
    make_state: Factory,
) -> None:
    """Spilling off, two workers each holding outputs: a producer that fits neither is
    deferred on w1 (throttled) and taken back to w2, which throttles in turn while w1,
    its deferred producer gone, stops throttling. Before, it went back to w1 at the
    next ``takeback_after``, and so on every 10 s for ever, with no error. A producer
    is taken back from a throttled worker only while a free worker that is not
    throttled never deferred it: at most once per worker; then it waits where it is,
    and its story says why and what to do."""
    s = make_state(
        speculation="off", unknown_long=False, long_task=float("inf"), stall_timeout=1000.0
    )
    at(s, WorkerJoined, T0 - 1, worker="w1", cores=1, memory=2**30)
    memory = deferred_on_w1_then_taken_to_w2(s)
    moves = 1
    for i in range(1, 6):  # w2 defers it in turn; w1 has nothing deferred any more
        t = T0 + 11 + 20 * i
        at(s, WorkerMemory, t - 9, worker=s.tasks["p-0"].worker, throttled=True, **memory)
        other = "w1" if s.tasks["p-0"].worker == "w2" else "w2"
        at(s, WorkerMemory, t - 9, worker=other, throttled=False, **memory)
        moves += len(cancelled(at(s, Tick, t)))
    assert moves == 1  # before: 6, one every takeback_after
    ts = s.tasks["p-0"]
    assert ts.worker == "w2" and ts.state == "processing"
    (why,) = [e[2] for e in s.story("p-0") if "not taken back" in e[2]]
    assert why == (
        "deferred on w2 (throttled), not taken back again: every free worker of its "
        "pool deferred it before (w1), its expected output fitting under none of their "
        "memory fences beside what they hold; it waits for memory to fall there, or for "
        "one of them to let outputs go. To go on: release the results you no longer "
        "need, turn spilling on, or give the "
        "workers more memory (memory_per_worker, --memory)"
    )


def test_a_kept_producer_goes_to_a_worker_that_let_outputs_go_since_it_deferred_it(
    make_state: Factory,
) -> None:
    """Spilling off: w1 holds a's 500 MB output and defers the producer p-0, which is
    taken back to w2; w2 defers it in turn, and it is kept there (w1 deferred it
    before). Then the client lets a go: w1 holds nothing, and p-0 fits there now. Before,
    w1 stayed among the workers that deferred it for good, so p-0 waited on w2 for ever
    (w2's memory never falling), w1 idle and no error (the memory watchdog needs every
    worker throttled). A worker that holds fewer bytes of outputs than when it deferred
    the producer may take it again."""
    s = make_state(
        speculation="off", unknown_long=False, long_task=float("inf"), stall_timeout=1000.0
    )
    at(s, WorkerJoined, T0 - 2, worker="w1", cores=1, memory=2**30)
    specs = specs_for(s, {"a": []}, ["a"])
    assert sent(at(s, GraphSubmitted, T0 - 1.5, specs=specs, wanted=("a",))) == [("w1", "a")]
    res = result("a", nbytes=500 * 2**20, attempt=s._attempt_on(s.tasks["a"], "w1"))
    at(s, TasksFinished, T0 - 1, worker="w1", results=(res,))
    assert s.held_bytes["w1"] == 500 * 2**20
    memory = deferred_on_w1_then_taken_to_w2(s)
    at(s, WorkerMemory, T0 + 12, worker="w2", throttled=True, **memory)
    at(s, WorkerMemory, T0 + 12, worker="w1", throttled=False, **memory)
    assert at(s, Tick, T0 + 31) == []  # kept on w2: w1 deferred it, holding as much
    assert [e[2] for e in s.story("p-0") if "not taken back" in e[2]] != []
    at(s, KeysReleased, T0 + 32, keys=("a",))
    at(s, FilesReleased, T0 + 32.5, keys=("a",))
    assert s.held_bytes.get("w1", 0) == 0
    out = at(s, Tick, T0 + 33)
    assert cancelled(out) == [("w2", "p-0")] and sent(out) == [("w1", "p-0")]
