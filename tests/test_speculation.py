"""Speculative copies of long tasks (docs/files.md#speculative-copies).

First the scheduler's pure core, with exact commands: a copy is proposed only past its
category's p90 (by the policy's margin) and only while a worker idles; the first try or
copy to finish wins, the other is cancelled and its late output dropped; a copy that
fails, or whose worker is lost, leaves the first try running (and the other way round),
without a retry. Then the policies. Then an embedded cluster with a heavy-tailed task
whose first try is ten times slower: the copy finishes it, as its try records show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import (
    CancelOnWorker,
    CancelRequested,
    DropData,
    Event,
    Execute,
    GraphSubmitted,
    KeyDone,
    KeyErred,
    TasksFinished,
    TasksRunning,
    Tick,
    WorkerDraining,
    WorkerHeld,
    WorkerJoined,
    WorkerLeft,
    WorkerMemory,
)
from actors.scheduler_state import MAX_INPUTS_UNREACHABLE, SchedulerState
from policies import REGISTRY, PolicyParamsError
from runtime.graph import Key
from tests.helpers import Factory, make_state, of, result, specs_for

__all__ = ["make_state"]

T0 = 1_000_000.0  #: the core's clock in these tests (after any other test's events)
_n = iter(range(10**9))


def at(s: SchedulerState, cls: type[Event], now: float, **fields: Any) -> list[Any]:
    """Handle one event at ``now``; check the invariants."""
    cmds = s.handle(cls(stimulus_id=f"{cls.__name__}-{next(_n)}", now=now, **fields))
    s.validate()
    return cmds


def done(
    s: SchedulerState, worker: str, key: Key, now: float, outcome: str = "ok", **kw: Any
) -> list[Any]:
    """``key``'s try (or copy) on ``worker`` ended at ``now`` with ``outcome``."""
    res = result(key, outcome, start=now - kw.pop("duration", 1.0), duration=0.0, **kw)
    res.stop = now
    return at(s, TasksFinished, now, worker=worker, results=(res,))


def sent(cmds: list[Any]) -> list[tuple[str, Key]]:
    return [(c.worker, t.key) for c in of(cmds, Execute) for t in c.tasks]


def tries(s: SchedulerState, key: Key) -> list[tuple[str, str, str | None]]:
    return [(t.worker, t.outcome, t.cause) for t in s.tasks[key].tries]


def running(s: SchedulerState, worker: str, now: float, *started: tuple[Key, float]) -> list[Any]:
    """``worker`` says at ``now`` that these tries have executed so many seconds."""
    ran = tuple((k, s._attempt_on(s.tasks[k], worker), secs) for k, secs in started)
    return at(s, TasksRunning, now, worker=worker, started=ran)


def straggler(
    make_state: Factory, workers: int = 2, w1_memory: int = 2**30, **policy: Any
) -> SchedulerState:
    """Five ``t`` tasks finished on w1 in 1 s each (p90 1 s); ``t-5`` runs on w1 since
    T0 (as w1 says at T0 + 0.6); workers w2.. joined after it, idle, with 1 GiB each
    (w1: ``w1_memory``)."""
    spec = REGISTRY.create("speculation", "idle-tail", policy) if policy else None
    s = make_state(speculation=spec, long_task=float("inf"))
    at(s, WorkerJoined, T0 - 100, worker="w1", cores=1, memory=w1_memory)
    keys = [f"t-{i}" for i in range(5)]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    at(s, GraphSubmitted, T0 - 99, specs=specs, wanted=tuple(keys))
    now = T0 - 90
    while any(s.tasks[k].state == "processing" for k in keys):
        for k in keys:
            if s.tasks[k].state == "processing":
                now += 1
                done(s, "w1", k, now, duration=1.0)
    specs = specs_for(s, {"t-5": []}, ["t-5"])
    assert sent(at(s, GraphSubmitted, T0, specs=specs, wanted=("t-5",))) == [("w1", "t-5")]
    for i in range(2, workers + 1):
        assert at(s, WorkerJoined, T0 + 0.1, worker=f"w{i}", cores=1, memory=2**30) == []
    assert running(s, "w1", T0 + 0.6, ("t-5", 0.6)) == []
    assert s.tasks["t-5"].started == T0
    return s


# ----------------------------------------------------------------------------- the core


def test_a_copy_goes_to_the_idle_worker_only_past_the_margin_over_p90(make_state: Factory) -> None:
    s = straggler(make_state)
    assert s.stats["t"].p90_duration == 1.0
    # The default margin: past max(1.5 x p90, p90 + 1 s) = 2 s of running.
    assert at(s, Tick, T0 + 1.9) == []
    out = at(s, Tick, T0 + 2.1)
    assert sent(out) == [("w2", "t-5")] and len(out) == 1
    assert s.speculative == {"started": 1, "won": 0, "lost": 0, "failed": 0}
    assert ("t-5", "processing", "speculative-copy:w2") in [e[:3] for e in s.story("t-5")]
    # At most one copy per task by default: more ticks send nothing.
    assert at(s, Tick, T0 + 10) == []
    assert s.tasks["t-5"].worker == "w1" and s.copies[s.tasks["t-5"]].keys() == {"w2"}


def test_a_try_waiting_in_its_workers_queue_is_never_copied(make_state: Factory) -> None:
    """The audit's D2: tries sent to a worker's two slots, one executing and one queued
    behind it, counted as running from when they were sent, so idle workers ran copies
    of queued tasks (a copy began before the original did). Running time counts from
    the start its worker reports. (Taking back tries queued behind others is off here:
    with it, t-6 would move to an idle worker, test_takeback.py.)"""
    s = make_state(
        unknown_long=False, long_task=float("inf"), saturation=2.0, takeback_after=float("inf")
    )
    at(s, WorkerJoined, T0 - 100, worker="w1", cores=1, memory=2**30)
    keys = [f"t-{i}" for i in range(7)]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    out = at(s, GraphSubmitted, T0 - 99, specs=specs, wanted=tuple(keys))
    now = T0 - 90
    for k in keys[:5]:  # p90 1 s
        now += 1
        out = done(s, "w1", k, now, duration=1.0)
    assert {t for w, t in sent(out)} <= {"t-5", "t-6"}
    assert {ts.key for ts in s.workers["w1"].processing} == {"t-5", "t-6"}
    for w in ("w2", "w3"):
        at(s, WorkerJoined, now + 0.1, worker=w, cores=1, memory=2**30)
    # Nothing said yet: neither is known to run, however long ago they were sent.
    assert at(s, Tick, T0 + 50) == []
    # w1 says t-5 has executed 0.6 s (t-6 waits behind it): only t-5 runs, since
    # T0 + 99.4, and it gets a copy once past 2 s of that; t-6 gets none, however
    # long it waits and however many workers idle.
    running(s, "w1", T0 + 100, ("t-5", 0.6))
    assert at(s, Tick, T0 + 101.3) == []
    assert sent(at(s, Tick, T0 + 101.5)) == [("w2", "t-5")]
    assert at(s, Tick, T0 + 500) == []
    assert s.tasks["t-6"].started is None and s.tasks["t-6"] not in s.copies
    # t-5 ends; t-6 starts, as w1 says 0.5 s later: its running time counts from then.
    done(s, "w1", "t-5", T0 + 501)
    running(s, "w1", T0 + 501.5, ("t-6", 0.5))
    assert s.tasks["t-6"].started == T0 + 501
    assert at(s, Tick, T0 + 502.9) == []
    # (to either idle worker: w2, whose copy just ended, is as idle as w3)
    assert sent(at(s, Tick, T0 + 503.1)) in ([("w2", "t-6")], [("w3", "t-6")])


def test_a_start_said_of_another_try_or_worker_counts_for_nothing(make_state: Factory) -> None:
    s = straggler(make_state)
    ts = s.tasks["t-5"]
    at(s, TasksRunning, T0 + 1, worker="w2", started=(("t-5", 0, 30.0),))  # not there
    at(s, TasksRunning, T0 + 1, worker="w1", started=(("t-5", ts.attempt + 7, 30.0),))
    at(s, TasksRunning, T0 + 1, worker="w9", started=(("t-5", 0, 30.0),))  # unknown
    at(s, TasksRunning, T0 + 1, worker="w1", started=(("nothing", 0, 30.0),))
    assert ts.started == T0  # as w1 said of this try
    # A start never goes before the try was sent (the clocks, the message's way).
    running(s, "w1", T0 + 1, ("t-5", 30.0))
    assert ts.started == T0 == ts.sent


def test_a_copy_that_becomes_the_try_keeps_its_own_start(make_state: Factory) -> None:
    s = straggler(make_state, workers=3)
    assert sent(at(s, Tick, T0 + 3)) == [("w2", "t-5")]
    running(s, "w2", T0 + 3.6, ("t-5", 0.5))  # the copy executes since T0 + 3.1
    done(s, "w1", "t-5", T0 + 4, "error", error=ValueError("bad node"))
    ts = s.tasks["t-5"]
    assert ts.worker == "w2" and ts.started == T0 + 3.1
    assert not s.copy_started
    # It runs past the margin from its own start: a copy on idle w1 or w3 then.
    assert at(s, Tick, T0 + 5.0) == []
    assert [k for _, k in sent(at(s, Tick, T0 + 5.2))] == ["t-5"]


def test_no_copy_while_no_worker_idles(make_state: Factory) -> None:
    s = straggler(make_state)
    specs = specs_for(s, {"u-0": []}, ["u-0"])
    assert sent(at(s, GraphSubmitted, T0 + 0.2, specs=specs, wanted=("u-0",))) == [("w2", "u-0")]
    assert at(s, Tick, T0 + 50) == []  # w2 runs u-0: it does not idle
    out = done(s, "w2", "u-0", T0 + 51)
    assert sent(out) == []  # finishing does not start a copy; the next tick does
    assert sent(at(s, Tick, T0 + 52)) == [("w2", "t-5")]


def test_too_few_finished_tries_or_policy_off_means_no_copy(make_state: Factory) -> None:
    s = straggler(make_state, min_finished=6)
    assert at(s, Tick, T0 + 100) == []
    s = make_state(speculation="off")
    at(s, WorkerJoined, T0, worker="w1", cores=1, memory=2**30)
    assert not s.speculates  # the shell sends no ticks for it


def test_the_copy_wins_the_first_try_is_cancelled_and_its_late_output_dropped(
    make_state: Factory,
) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = done(s, "w2", "t-5", T0 + 4.5)
    assert of(out, CancelOnWorker) == [CancelOnWorker(out[0].stimulus_id, "w1", ("t-5",))]
    assert [(c.key, c.worker) for c in of(out, KeyDone)] == [("t-5", "w2")]
    assert s.tasks["t-5"].state == "memory" and s.tasks["t-5"].who_has == {"w2"}
    assert tries(s, "t-5") == [("w1", "cancelled", "superseded"), ("w2", "ok", "speculative")]
    assert s.speculative == {"started": 1, "won": 1, "lost": 0, "failed": 0}
    # The first try's output arrives anyway (its cancel came too late): dropped.
    late = done(s, "w1", "t-5", T0 + 20)
    assert [(c.worker, c.keys) for c in of(late, DropData)] == [("w1", ("t-5",))]
    assert s.tasks["t-5"].who_has == {"w2"}


def test_the_first_try_wins_the_copy_is_cancelled(make_state: Factory) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = done(s, "w1", "t-5", T0 + 3.5)
    assert [(c.worker, c.keys) for c in of(out, CancelOnWorker)] == [("w2", ("t-5",))]
    assert tries(s, "t-5") == [("w2", "cancelled", "superseded"), ("w1", "ok", None)]
    assert s.speculative == {"started": 1, "won": 0, "lost": 1, "failed": 0}
    late = done(s, "w2", "t-5", T0 + 4)  # the copy's output, had it finished: dropped
    assert [(c.worker, c.keys) for c in of(late, DropData)] == [("w2", ("t-5",))]
    assert not s.workers["w2"].copies and "w2" in s.free


def test_a_failed_copy_does_not_fail_the_task(make_state: Factory) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = done(s, "w2", "t-5", T0 + 3.5, "error", error=ValueError("flaky host"))
    assert sent(out) == [] and of(out, CancelOnWorker) == []
    ts = s.tasks["t-5"]
    assert ts.state == "processing" and ts.worker == "w1" and ts not in s.copies
    assert tries(s, "t-5") == [("w2", "error", "speculative")]
    assert ts.retries_left == 0 and s.speculative["failed"] == 1
    done(s, "w1", "t-5", T0 + 4)
    assert ts.state == "memory"


def test_the_copy_runs_on_when_the_first_tries_worker_is_lost(make_state: Factory) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = at(s, WorkerLeft, T0 + 3.5, worker="w1", cause="crash")
    # No retry: the copy on w2 is the try now (t-0, whose output was on w1, is remade
    # first: the lost outputs in the order they were asked for).
    assert sent(out) == [("w2", "t-0")]
    ts = s.tasks["t-5"]
    assert ts.state == "processing" and ts.worker == "w2" and ts not in s.copies
    assert tries(s, "t-5") == [("w1", "worker-lost", "crash")]
    out = done(s, "w2", "t-5", T0 + 5)
    assert [(c.key, c.worker) for c in of(out, KeyDone)] == [("t-5", "w2")]


def test_a_preempted_try_whose_copy_runs_on_is_a_free_loss_not_a_failure(
    make_state: Factory,
) -> None:
    """Preempted with a copy running on, the first try cost nothing (no retry, nothing
    charged): the dashboard's free groups have it, not its failure groups, and the
    monitoring feed records it as a free retry (the report's section of free losses);
    it was in the failure groups, with no retry record (the report's failures)."""
    s = straggler(lambda **kw: make_state(monitor=True, **kw))
    at(s, Tick, T0 + 3)
    at(s, WorkerLeft, T0 + 3.5, worker="w1", cause="preempted")
    ts = s.tasks["t-5"]
    assert ts.state == "processing" and ts.worker == "w2" and ts not in s.copies
    assert set(s.free_groups) == {("t", "preempted")} and s.failure_groups == {}
    records = [r for _, batch in s.feed for r in batch if r[0] == "retry"]
    assert records == [("retry", "t-5", False, None, None)]
    done(s, "w2", "t-5", T0 + 5)
    assert ts.state == "memory" and set(s.free_groups) == {("t", "preempted")}


def test_the_first_try_runs_on_when_the_copys_worker_is_lost(make_state: Factory) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = at(s, WorkerLeft, T0 + 3.5, worker="w2", cause="crash")
    assert sent(out) == [] and s.tasks["t-5"].worker == "w1"
    assert tries(s, "t-5") == [("w2", "worker-lost", "crash")]
    assert s.tasks["t-5"].lost_tries == 0 and s.speculative["failed"] == 1


def test_the_copy_runs_on_when_the_first_try_fails(make_state: Factory) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = done(s, "w1", "t-5", T0 + 3.5, "error", error=ValueError("bad node"))
    assert sent(out) == [] and s.tasks["t-5"].worker == "w2"
    assert s.tasks["t-5"].state == "processing"
    done(s, "w2", "t-5", T0 + 5)
    assert tries(s, "t-5") == [("w1", "error", None), ("w2", "ok", None)]
    assert s.tasks["t-5"].state == "memory"


def test_the_copy_runs_on_when_the_first_try_gives_up_on_its_inputs(
    make_state: Factory,
) -> None:
    """The first try cannot get an input from a holder still connected, the time that
    makes it give up (InputsUnreachable): a copy that runs elsewhere becomes the try
    instead, and nothing fails."""
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    ts = s.tasks["t-5"]  # as after four such reports, the first of them long ago
    ts.unreachable, ts.unreachable_since = MAX_INPUTS_UNREACHABLE - 1, T0 - 1000.0
    out = done(s, "w1", "t-5", T0 + 3.5, "missing", missing=(("t-0", "w1"),))
    assert of(out, KeyErred) == [] and s.tasks["t-5"].state == "processing"
    assert s.tasks["t-5"].worker == "w2"
    done(s, "w2", "t-5", T0 + 5)
    assert s.tasks["t-5"].state == "memory"


def test_draining_or_cancelling_ends_the_copies(make_state: Factory) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = at(s, WorkerDraining, T0 + 4, worker="w2")
    assert [(c.worker, c.keys) for c in of(out, CancelOnWorker)] == [("w2", ("t-5",))]
    assert tries(s, "t-5") == [("w2", "cancelled", "drained")]
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    out = at(s, CancelRequested, T0 + 4, keys=("t-5",))
    cancelled = sorted((c.worker, c.keys) for c in of(out, CancelOnWorker))
    assert cancelled == [("w1", ("t-5",)), ("w2", ("t-5",))]
    assert s.tasks["t-5"].state == "cancelled" and not s.copies


def test_a_copy_lost_with_a_dropped_connection_ends_and_the_first_try_runs_on(
    make_state: Factory,
) -> None:
    s = straggler(make_state)
    at(s, Tick, T0 + 3)
    at(s, WorkerJoined, T0 + 4, worker="w2", cores=1, memory=2**30)  # a new connection
    out = at(s, WorkerHeld, T0 + 4.1, worker="w2", active=frozenset(), held=())
    assert sent(out) == [] and s.tasks["t-5"].worker == "w1" and not s.copies
    assert tries(s, "t-5") == [("w2", "cancelled", "lost-in-transit")]
    assert s.speculative["failed"] == 1
    assert sent(at(s, Tick, T0 + 5)) == [("w2", "t-5")]  # idle again: a new copy


def test_one_copy_per_task_with_more_idle_workers_unless_max_copies(make_state: Factory) -> None:
    s = straggler(make_state, workers=3)
    assert sent(at(s, Tick, T0 + 3)) == [("w2", "t-5")]
    s = straggler(make_state, workers=3, max_copies=2)
    assert sorted(sent(at(s, Tick, T0 + 3))) == [("w2", "t-5"), ("w3", "t-5")]
    out = done(s, "w3", "t-5", T0 + 4)
    cancelled = sorted((c.worker, c.keys) for c in of(out, CancelOnWorker))
    assert cancelled == [("w1", ("t-5",)), ("w2", ("t-5",))]
    assert s.speculative == {"started": 2, "won": 1, "lost": 1, "failed": 0}


MiB = 2**20


def memory(
    s: SchedulerState,
    worker: str,
    now: float,
    rss: int,
    throttled: bool = False,
    terminate_at: int | None = None,
) -> None:
    """``worker`` reports its memory at ``now``: ``rss``, throttled or not, and its
    terminate fence (None: not told)."""
    limit = s.workers[worker].memory
    at(s, WorkerMemory, now, worker=worker, throttled=throttled, rss=rss,
       throttle_at=int(limit * 0.8), limit=limit, terminate_at=terminate_at)  # fmt: skip


def no_copy_said(s: SchedulerState, key: Key) -> list[str]:
    return [e[2] for e in s.story(key) if str(e[2]).startswith("no speculative copy")]


def test_no_copy_of_a_straggler_whose_worker_is_past_its_terminate_fence(
    make_state: Factory,
) -> None:
    """The memprio audit's defect 1: a 3.2 GB chunk on a 1 GiB worker, far past its
    fences, got a speculative copy on another 1 GiB worker (its category's p90 came
    from small chunks), and both went to 6 GiB. A try is slow there because of its
    worker's memory: it gets no copy while its worker is past its terminate fence or
    throttled, whatever the policy proposes, and its story says so once."""
    s = straggler(make_state)
    memory(s, "w1", T0 + 1.0, 1000 * MiB, throttled=True)  # past 0.95 x 1024 MiB
    assert at(s, Tick, T0 + 2.1) == []
    assert at(s, Tick, T0 + 3.1) == []
    assert s.speculative["started"] == 0 and s.tasks["t-5"] not in s.copies
    assert no_copy_said(s, "t-5") == [
        "no speculative copy: its worker 'w1' is past its terminate fence "
        "(1000 MiB of its 1024 MiB limit)"
    ]
    # Under the terminate fence but still throttled: no copy either (said once more).
    memory(s, "w1", T0 + 4.0, 900 * MiB, throttled=True)
    assert at(s, Tick, T0 + 4.1) == [] and at(s, Tick, T0 + 5.1) == []
    assert no_copy_said(s, "t-5")[1:] == [
        "no speculative copy: its worker 'w1' is throttled (900 MiB of its 1024 MiB limit)"
    ]
    # Its memory came down: the straggler is slow for another reason, and gets a copy.
    memory(s, "w1", T0 + 6.0, 300 * MiB)
    assert sent(at(s, Tick, T0 + 6.1)) == [("w2", "t-5")]
    assert s.speculative["started"] == 1


def test_a_worker_past_the_terminate_fence_it_told_gets_no_copy(make_state: Factory) -> None:
    """The core took every worker's terminate fence as 0.95 of its limit, whatever its
    ``memory_options`` said: w1, told to terminate at 0.8 and at 0.85 of its limit (not
    throttled as far as the core knows), got a copy of its straggler. Its own fence, as
    it reports it (``terminate_at``), is the one the core tests; a report without it
    falls back to 0.95."""
    s = straggler(make_state)
    limit = s.workers["w1"].memory
    memory(s, "w1", T0 + 1.0, int(0.85 * limit), terminate_at=int(0.8 * limit))
    assert at(s, Tick, T0 + 2.1) == []
    assert at(s, Tick, T0 + 3.1) == []
    assert s.speculative["started"] == 0 and s.tasks["t-5"] not in s.copies
    assert no_copy_said(s, "t-5") == [
        "no speculative copy: its worker 'w1' is past its terminate fence "
        "(870 MiB of its 1024 MiB limit)"
    ]
    # The same RSS, its fence not told: under 0.95 of its limit, and a copy goes.
    memory(s, "w1", T0 + 4.0, int(0.85 * limit))
    assert sent(at(s, Tick, T0 + 4.1)) == [("w2", "t-5")]


def test_the_same_straggler_on_a_healthy_worker_gets_its_copy(make_state: Factory) -> None:
    s = straggler(make_state)
    memory(s, "w1", T0 + 1.0, 300 * MiB)  # under its throttle fence
    assert sent(at(s, Tick, T0 + 2.1)) == [("w2", "t-5")]
    assert no_copy_said(s, "t-5") == []


def test_no_copy_on_a_worker_whose_limit_is_below_the_rise_the_try_has_shown(
    make_state: Factory,
) -> None:
    """t-5 runs alone on w1 (8 GiB, far from its fences) and has raised w1's RSS by
    3 GiB since it began: a copy would not fit in w2's 1 GiB; w3, with 4 GiB, gets it."""
    s = straggler(make_state, w1_memory=8 * 2**30)
    assert s.tasks["t-5"].rss_began == 0
    memory(s, "w1", T0 + 0.7, 100 * MiB)
    assert running(s, "w1", T0 + 0.8, ("t-5", 0.8)) == []  # said again: from 100 MiB
    assert s.tasks["t-5"].rss_began == 100 * MiB
    memory(s, "w1", T0 + 1.5, 100 * MiB + 3 * 2**30)
    assert at(s, Tick, T0 + 2.1) == [] and at(s, Tick, T0 + 3.1) == []
    assert no_copy_said(s, "t-5") == [
        "no speculative copy: it raised its worker's RSS by 3072 MiB so far, more than "
        "the memory limit of any idle worker that could take it"
    ]
    at(s, WorkerJoined, T0 + 3.5, worker="w3", cores=1, memory=4 * 2**30)
    assert sent(at(s, Tick, T0 + 4.1)) == [("w3", "t-5")]


# ----------------------------------------------------------------------------- policies


def test_policy_parameters_are_checked() -> None:
    with pytest.raises(PolicyParamsError, match="factor"):
        REGISTRY.create("speculation", "idle-tail", {"factor": 0.5})
    with pytest.raises(PolicyParamsError, match="max_copies"):
        REGISTRY.create("speculation", "idle-tail", {"max_copies": -1})
    with pytest.raises(PolicyParamsError, match="min_excess"):
        REGISTRY.create("speculation", "idle-tail", {"min_excess": float("nan")})
    assert REGISTRY.names("speculation") == ["idle-tail", "off"]


def test_the_counters_are_a_prometheus_counter_by_result() -> None:
    from runtime.messages import MetricsReply
    from runtime.metrics import samples

    got = samples(MetricsReply(speculative={"started": 3, "won": 2, "lost": 1, "failed": 0}))
    counts = {
        dict(labels)["result"]: n
        for (name, labels), n in got.items()
        if name == "corral_speculative_copies_total"
    }
    assert counts == {"started": 3, "won": 2, "lost": 1, "failed": 0}


def test_the_console_status_counts_the_copies() -> None:
    from runtime.messages import StatusReply
    from tests.helpers import status_text as text

    assert "speculative" not in text(StatusReply().to_dict())
    st = StatusReply(speculative={"started": 2, "won": 1, "lost": 1, "failed": 0}).to_dict()
    assert "speculative copies: 2 started, 1 won, 1 lost, 0 failed" in text(st)


# ----------------------------------------------------------------------------- a cluster


def _tail(i: int, marks: str) -> int:
    """Takes 0.3 s, but ``tail-5``'s first try (before its marker file exists) is a
    straggler: it runs until the task is done elsewhere (another try wrote ``done``) and
    2 s more, at most 62 s: far longer than ten times the others."""
    import os
    import time

    first = os.path.join(marks, "first-try")
    finished = os.path.join(marks, "done")
    straggles = i == 5 and not os.path.exists(first)
    if straggles:
        open(first, "w").close()
    deadline = time.monotonic() + (60.0 if straggles else 0.3)
    while time.monotonic() < deadline and not (straggles and os.path.exists(finished)):
        time.sleep(0.02)
    if straggles:  # the copy wrote done as it ended: its result comes to the scheduler
        time.sleep(2.0)  # first (a CI run once had this try's ok arrive before it)
    if i == 5 and not straggles:
        open(finished, "w").close()
    return i


@pytest.mark.anyio
async def test_a_heavy_tailed_task_is_finished_by_its_copy(tmp_path: Path) -> None:
    from runtime import Cluster

    marks = str(tmp_path)
    with anyio.fail_after(60):
        async with Cluster(workers=2) as c:
            await c.wait_for_workers(2)
            state = c.scheduler_state
            warm = [c.submit(_tail, i, marks, key=f"tail-{i}") for i in range(5)]
            assert await c.gather(warm) == list(range(5))
            assert state.stats["tail"].count == 5
            # Its first try straggles; once it has run past the margin over the p90 of
            # the category (about 0.3 s: past 1.3 s), the idle worker gets a copy.
            assert await c.submit(_tail, 5, marks, key="tail-5") == 5
            tries = [(t.worker, t.outcome, t.cause) for t in state.tasks["tail-5"].tries]
            (first, _, _), (copy, _, _) = tries
            assert first != copy
            assert tries == [(first, "cancelled", "superseded"), (copy, "ok", "speculative")]
            story = [e[2] for e in await c.story("tail-5")]
            assert f"speculative-copy:{copy}" in story and f"superseded:{first}" in story
            assert state.tasks["tail-5"].who_has == {copy}
            spec = (await c.status())["speculative"]
            assert spec == {"started": 1, "won": 1, "lost": 0, "failed": 0}
            assert (tmp_path / "done").exists()


def test_no_task_queues_behind_a_copy_that_holds_a_workers_only_core(
    make_state: Factory,
) -> None:
    """The audit's stall: a hung task's copy took a one-core worker's only slot, then 33
    tasks of another client's batch were queued there behind it for 7 minutes while a
    worker with free cores ran other work. A copy (of a straggler: it may run as long
    again, or hang) takes its whole core: nothing is sent to wait behind it."""
    s = straggler(make_state)
    assert sent(at(s, Tick, T0 + 2.1)) == [("w2", "t-5")]
    at(s, WorkerJoined, T0 + 3, worker="w3", cores=2, memory=2**30)
    keys = [f"t-{i}" for i in range(6, 30)]
    specs = specs_for(s, {k: [] for k in keys}, keys)
    out = at(s, GraphSubmitted, T0 + 4, specs=specs, wanted=tuple(keys))
    to = {w for w, _ in sent(out)}
    assert "w3" in to and "w2" not in to
    assert not s.workers["w2"].processing and "w2" not in s.free
    # The first try wins: the copy is cancelled and w2 takes queued work again.
    out = done(s, "w1", "t-5", T0 + 5)
    assert "w2" in {w for w, _ in sent(out)}
