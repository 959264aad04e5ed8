"""The scheduler core's memory rules (actors/scheduler_state.py), fed events with an
injected clock: producers and consumers, root withholding, throttled workers, the
memory policy swapped at runtime, ``oom`` tries and the stall watchdog."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from actors.scheduler_events import (
    CancelOnWorker,
    CategoryForgotten,
    Execute,
    FileFacts,
    GraphSubmitted,
    KeyDone,
    KeyErred,
    PolicyChanged,
    TasksFinished,
    TasksRunning,
    Tick,
    WorkerDraining,
    WorkerFloor,
    WorkerJoined,
    WorkerLeft,
    WorkerMemory,
    WorkerPastLimit,
)
from actors.scheduler_state import SchedulerState
from policies import REGISTRY, RISE_WINDOW
from runtime.errors import (
    FLOOR_ADVICE,
    MemoryStalled,
    TaskOutOfMemory,
    TaskTooLarge,
    floor_warning,
)
from tests.helpers import (
    GB,
    MB,
    Factory,
    assigned,
    event,
    finish,
    finish_all,
    join,
    make_state,
    of,
    on,
    result,
    run,
    specs_for,
    submit,
)

__all__ = ["make_state"]  # the fixture, used by name


def throttle(s: SchedulerState, worker: str, on: bool = True, *, now: float | None = None) -> Any:
    ev = WorkerMemory(
        stimulus_id=f"mem-{worker}-{on}",
        now=now if now is not None else 0.0,
        worker=worker,
        throttled=on,
        rss=int(0.75 * GB) if on else int(0.3 * GB),
        throttle_at=int(0.7 * GB),
        limit=GB,
    )
    return run(s, ev)


def tick(s: SchedulerState, now: float) -> Any:
    return run(s, Tick(stimulus_id=f"tick-{now}", now=now))


def loads_and_sums(n: int) -> dict[str, list[str]]:
    """``load-i`` (roots) each read by ``sum-i``."""
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(n)}
    table.update({f"sum-{i}": [f"load-{i}"] for i in range(n)})
    return table


# ----------------------------------------------------------------------------- classes


def test_roots_are_producers_until_known_and_withheld_beyond_saturation(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, backlog=10.0, max_per_core=50)
    join(s, "w1", cores=2)
    keys = [f"load-{i}" for i in range(20)]
    submit(s, dict.fromkeys(keys, ()), keys)
    ws = s.workers["w1"]
    # Short or not, unknown roots are producers: only the slots, no backlog batch.
    assert ws.n_processing == ws.slots == 2 and ws.n_producers == 2
    # They turn out to make 50 MB each from nothing: still producers, still withheld.
    for key in sorted(on(s, "w1")):
        finish(s, "w1", key, duration=0.001, nbytes=50 * MB)
    assert s.classes["load"] is True
    assert ws.n_processing == 2


def test_a_category_with_tiny_outputs_flips_to_consumer_and_gets_batches(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, backlog=0.05, max_per_core=10)
    join(s, "w1", cores=2)
    keys = [f"tiny-{i}" for i in range(100)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.workers["w1"].n_processing == 2
    finish_all(s, "w1", sorted(on(s, "w1")), duration=0.001, nbytes=8)
    assert s.classes["tiny"] is False
    assert s.workers["w1"].n_processing == 20  # the backlog batch
    assert [e[2] for e in s.story_log if e[1] == "memory"] == ["tiny is a consumer"]


def test_a_non_root_category_that_turns_out_to_produce_is_requeued_as_producer(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    table: dict[str, list[str]] = {f"seed-{i}": [] for i in range(4)}
    table.update({f"grow-{i}": [f"seed-{i}"] for i in range(4)})
    submit(s, table, list(table))
    # Seeds are tiny roots: after the first two, consumers; all four run.
    for _ in range(2):
        for w in ("w1", "w2"):
            for key in sorted(on(s, w)):
                if key.startswith("seed"):
                    finish(s, w, key, nbytes=1000)
    assert s.classes["grow"] is False  # unknown non-roots are not producers
    grows = [ts for ts in s.tasks.values() if ts.key.startswith("grow")]
    running = [ts for ts in grows if ts.state == "processing"]
    assert len(running) == 2 and all(not ts.producer for ts in running)
    # One grow makes 100 MB out of 1000 bytes: the category flips; the queued ones move.
    ts = running[0]
    assert ts.worker is not None
    finish(s, ts.worker, ts.key, nbytes=100 * MB)
    assert s.classes["grow"] is True
    queued = [t for t in grows if t.state == "queued"]
    for t in queued:
        assert t.producer
        assert any(e[3] is t for e in s.queues[(None, True)])


class Traversals(list):  # type: ignore[type-arg]
    """A ready heap that counts the entries read by walking it (``for e in heap``);
    heapq's pushes and pops do not walk."""

    walked = 0

    def __iter__(self) -> Any:
        for entry in super().__iter__():
            Traversals.walked += 1
            yield entry


def test_a_class_flip_moves_its_own_tasks_without_walking_the_ready_heaps(
    make_state: Factory,
) -> None:
    # 2,000 ready roots of "big" and 3 of "tiny", all producers (unknown roots). One
    # tiny finishes with a tiny output: "tiny" flips to consumer. The flip must cost
    # tiny's tasks, not every ready task: a run in 5,000 categories flips 5,000 times.
    s = make_state(saturation=1.0, backlog=0.0)
    join(s, "w1")
    tiny = [f"tiny-{i}" for i in range(4)]
    big = [f"big-{i}" for i in range(2000)]
    submit(s, dict.fromkeys(tiny + big, ()), tiny + big)
    assert on(s, "w1") == {"tiny-0"}
    heap = s.queues[(None, True)]
    assert len(heap) == 2003
    s.queues[(None, True)] = Traversals(heap)
    Traversals.walked = 0
    finish(s, "w1", "tiny-0", nbytes=8, check=False)
    assert Traversals.walked == 0  # the old code walked all 2,003 entries
    s.validate()
    assert s.classes["tiny"] is False
    assert [e[2] for e in s.story_log if e[1] == "memory"] == ["tiny is a consumer"]
    # tiny's ready tasks are consumers now, in the consumer heap, in their order.
    assert on(s, "w1") == {"tiny-1"}
    consumers = {e[3].key for e in s.queues[(None, False)] if e[3].state == "queued"}
    assert consumers == {"tiny-2", "tiny-3"}
    assert all(s.tasks[k].producer and s.tasks[k].state == "queued" for k in big)


def test_a_category_flipping_back_and_forth_runs_each_ready_task_once(
    make_state: Factory,
) -> None:
    # A flip leaves stale entries in the heap it left; flipping back pushes the same
    # entry again. Every task still runs once, and the heaps stay consistent.
    answers = iter([False, True, False, True, True, False] + [False] * 20)

    class Fickle:
        """Roots are producers until known; then each finish asks the next answer."""

        name = "fickle"

        def producer(self, category: str, stats: Any, root: bool) -> bool:
            return root if stats is None or stats.count == 0 else next(answers)

        def yields(self, pressure: bool) -> bool:
            return pressure

    s = make_state(saturation=1.0, backlog=0.0, memory=Fickle())
    join(s, "w1", cores=2)
    keys = [f"flip-{i}" for i in range(12)]
    submit(s, dict.fromkeys(keys, ()), keys)
    started: list[str] = []
    while True:
        running = sorted(on(s, "w1"))
        if not running:
            break
        started += running
        for key in running:
            finish(s, "w1", key)
    assert sorted(started) == sorted(keys)  # each once
    flips = [e[2] for e in s.story_log if e[1] == "memory"]
    assert len(flips) >= 3, flips
    assert all(ts.state == "memory" for ts in s.tasks.values())
    assert not s.ready_entries


# ----------------------------------------------------------------------------- throttle


def test_a_throttled_worker_gets_consumers_but_no_producers(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, loads_and_sums(6), [f"sum-{i}" for i in range(6)])
    first = on(s, "w1") | on(s, "w2")
    assert len(first) == 2 and all(k.startswith("load") for k in first)
    throttle(s, "w1")
    assert s.pressure and s.throttled == {"w1"}
    w1_load = next(iter(on(s, "w1")))
    w2_load = next(iter(on(s, "w2")))
    # w2's load finishes: its sum is a consumer and may go anywhere; the next load must
    # not go to the throttled w1.
    cmds = finish(s, "w2", w2_load, nbytes=50 * MB)
    sent = assigned(cmds)
    assert all(k.startswith("sum") for k in sent.get("w1", []))
    # w1 still runs its (deferred) producer, yet it takes the consumer: deferred
    # producers must not keep consumers out.
    assert w1_load in on(s, "w1")
    assert any(k.startswith("sum") for k in on(s, "w1") | on(s, "w2"))
    # Unthrottled: producers may go to w1 again.
    throttle(s, "w1", on=False)
    assert not s.pressure


def test_under_pressure_consumers_go_before_producers_whatever_graph_order(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, loads_and_sums(4), [f"sum-{i}" for i in range(4)])
    loads = {w: next(iter(on(s, w))) for w in ("w1", "w2")}
    throttle(s, "w1")
    # w2 finishes its load: a load (producer) and a sum (consumer) are both ready for
    # w2's one slot; under pressure the sum wins even if the load is earlier in order.
    cmds = finish(s, "w2", loads["w2"], nbytes=50 * MB)
    assert [k for k in assigned(cmds).get("w2", []) if k.startswith("load")] == []
    # Without pressure graph order holds: the same situation on a fresh state sends
    # whatever dask.order puts first.
    s2 = make_state(saturation=1.0)
    join(s2, "w1")
    join(s2, "w2")
    submit(s2, loads_and_sums(4), [f"sum-{i}" for i in range(4)])
    first = {w: next(iter(on(s2, w))) for w in ("w1", "w2")}
    cmds = finish(s2, "w2", first["w2"], nbytes=50 * MB)
    (sent,) = assigned(cmds)["w2"]
    ready = [ts for ts in s2.tasks.values() if ts.state in ("queued", "processing")]
    best = min((ts for ts in ready if ts.worker in (None, "w2")), key=lambda t: t.prio)
    assert sent == best.key


def producers_hold_every_slot(
    make_state: Factory, consumer: dict[str, Any] | None = None, known: bool = False
) -> SchedulerState:
    """One 1-core worker (2 slots), both held by loads (producers of a known, short
    category), and ``sum-0``, a consumer of a category with no finished try (long:
    ``unknown_long``; ``known``: one of its category finished, short), queued with its
    input in memory there, waiting for the core (``consumer``: changes to its spec)."""
    s = make_state(stall_timeout=5.0)
    join(s, "w1")
    warm: dict[str, list[str]] = {"load-w0": [], "load-w1": []}
    if known:
        warm["sum-w0"] = ["load-w0"]
    submit(s, warm, list(warm))
    while on(s, "w1"):
        finish_all(s, "w1", sorted(on(s, "w1")), duration=0.01, nbytes=50 * MB)
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(6)}
    table["sum-0"] = ["load-0"]
    wanted = ["sum-0", *(f"load-{i}" for i in range(1, 6))]
    submit(s, table, wanted, attrs={"sum-0": consumer} if consumer else None)
    while s.tasks["load-0"].state != "memory":
        key = "load-0" if "load-0" in on(s, "w1") else sorted(on(s, "w1"))[0]
        finish(s, "w1", key, duration=0.01, nbytes=50 * MB)
    ws = s.workers["w1"]
    assert len(ws.processing) == ws.n_producers == ws.slots == 2
    assert s.tasks["sum-0"].state == "queued"
    return s


def test_a_throttled_worker_whose_slots_hold_deferred_producers_takes_a_new_consumer(
    make_state: Factory,
) -> None:
    """A user audit's hang (dask's paused-worker deadlock): every slot of two throttled
    workers held by deferred producers, a ready ``sum-partial`` (inputs in memory, a
    category not finished yet: long, so it waits for a core free of tasks) was queued
    for good. Deferred producers hold no thread: the consumer is sent at once."""
    s = producers_hold_every_slot(make_state)
    cmds = throttle(s, "w1", now=100.0)
    assert [(c.worker, [t.key for t in c.tasks]) for c in of(cmds, Execute)] == [("w1", ["sum-0"])]
    assert [t.producer for t in of(cmds, Execute)[0].tasks] == [False]
    ws = s.workers["w1"]
    assert "sum-0" in on(s, "w1") and len(ws.processing) == 3 and ws.n_producers == 2
    # A consumer runs there: no stall while it does.
    assert of(tick(s, 200.0), KeyErred) == [] and not s.stalled_since


def test_producers_that_began_before_the_throttle_keep_their_cores_from_a_consumer(
    make_state: Factory,
) -> None:
    """Only deferred producers (not known to execute) are left out of a throttled
    worker's taken cores: one that began before the throttle holds its thread until it
    ends, so a long consumer (a category with no finished try) is not sent to wait
    behind it (a review of the audit's fix)."""
    s = producers_hold_every_slot(make_state)
    began = tuple((t.key, 0, 0.5) for t in sorted(s.workers["w1"].processing, key=str))
    run(s, event(TasksRunning, worker="w1", started=began))
    cmds = throttle(s, "w1", now=100.0)
    assert of(cmds, Execute) == []
    assert s.tasks["sum-0"].state == "queued"


def test_a_deferred_producer_that_starts_executing_takes_its_throttled_workers_core(
    make_state: Factory,
) -> None:
    """The same producer told executing after the throttle (it began, or began just
    before and its report came later): the worker, free while the producer was only
    deferred, is free no more (before, it stayed among the free workers, with its one
    core taken, until some other event looked at it again)."""
    s = make_state(saturation=1.0)
    join(s, "w1")
    keys = [f"load-{i}" for i in range(3)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert on(s, "w1") == {"load-0"} and "w1" not in s.free
    throttle(s, "w1", now=100.0)
    assert "w1" in s.free  # load-0 deferred there: on no thread
    assert run(s, TasksRunning("ran", 101.0, "w1", (("load-0", 0, 0.5),))) == []
    assert "w1" not in s.free


def test_memory_reports_from_unknown_workers_are_ignored_and_leaving_clears_throttle(
    make_state: Factory,
) -> None:
    s = make_state()
    throttle(s, "ghost")
    assert not s.pressure
    join(s, "w1")
    throttle(s, "w1")
    assert s.pressure
    run(s, event(WorkerLeft, worker="w1"))
    assert not s.pressure


def test_the_core_counts_each_workers_throttled_seconds_over_its_episodes(
    make_state: Factory,
) -> None:
    """What a client's throttle hint reads (StatusReply.throttled_seconds): per worker,
    its throttled time over every episode, the one under way counted to now; a worker
    never throttled is left out."""
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    assert s.throttled_seconds(5.0) == {}
    throttle(s, "w1", now=10.0)
    assert s.throttled_seconds(14.0) == {"w1": 4.0}
    throttle(s, "w1", False, now=16.0)
    throttle(s, "w1", now=20.0)
    throttle(s, "w1", now=21.0)  # (still throttled: no new episode)
    assert s.throttled_seconds(25.0) == {"w1": 11.0}
    throttle(s, "w1", False, now=30.0)
    assert s.throttled_seconds(99.0) == {"w1": 16.0}


def test_the_memory_policy_can_be_swapped_at_runtime(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0, backlog=10.0, max_per_core=50)
    join(s, "w1", cores=2)
    keys = [f"load-{i}" for i in range(30)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.workers["w1"].n_processing == 2
    run(s, event(PolicyChanged, kind="memory", policy=REGISTRY.create("memory", "blind")))
    # Blind: nothing is a producer; the roots get the backlog batch at once.
    assert s.workers["w1"].n_producers == 2  # the two sent before keep their mark
    assert s.workers["w1"].n_processing > 2
    assert s.classes == {"load": False}
    with pytest.raises(Exception, match="no-such"):
        REGISTRY.create("memory", "no-such")


def test_producer_thresholds_are_parameters_of_the_policy() -> None:
    from policies.base import CategoryStats

    p = REGISTRY.create("memory", "producers-yield", {"ratio": 4, "min_nbytes": 10})
    three_x = CategoryStats(count=1, total_nbytes=300, consumed_nbytes=100)
    assert not p.producer("x", three_x, False)
    assert p.producer("x", CategoryStats(count=1, total_nbytes=500, consumed_nbytes=100), False)
    assert not p.producer("x", CategoryStats(count=1, total_nbytes=5), True)  # too small
    assert p.producer("x", None, True) and not p.producer("x", None, False)
    with pytest.raises(Exception, match="ratio"):
        REGISTRY.create("memory", "producers-yield", {"ratio": 0})


# ----------------------------------------------------------------------------- oom


def test_an_oom_try_is_retried_once_on_a_larger_worker_then_fails_naming_every_try(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", memory=GB)
    assert assigned(submit(s, {"big-0": []}, ["big-0"])) == {"w1": ["big-0"]}
    join(s, "w2", memory=2 * GB)
    cmds = finish(s, "w1", "big-0", "oom", rss=int(0.96 * GB), rss_peak=int(0.98 * GB))
    assert s.stats["big"].peak_rss == int(0.98 * GB)  # what it reached before the kill
    ts = s.tasks["big-0"]
    # The free retry goes to the larger worker, though w1 (1 GiB) is free again.
    assert assigned(cmds) == {"w2": ["big-0"]} and ts.behind  # behind fresh work
    assert s.stats["big"].oom == 1 and s.stats["big"].errors == 0
    cmds = finish(s, "w2", "big-0", "oom", rss=int(1.9 * GB), rss_peak=int(1.95 * GB))
    (erred,) = of(cmds, KeyErred)
    assert assigned(cmds) == {}
    err = erred.error
    assert isinstance(err, TaskOutOfMemory)
    assert "1.90 GiB of its 2.00 GiB limit" in str(err)
    assert (
        "Killed for memory 2 times: on 'w1' (limit 1.00 GiB, peak 0.98 GiB), then on "
        "'w2' (limit 2.00 GiB, peak 1.95 GiB)." in str(err)
    )
    assert err.ooms == (("w1", GB, int(0.98 * GB)), ("w2", 2 * GB, int(1.95 * GB)))
    assert err.tries == 2 and not err.nowhere  # the policy's max_oom: not for want of room
    assert [t.outcome for t in s.tasks["big-0"].tries] == ["oom", "oom"]


def test_an_oom_try_is_not_retried_on_a_smaller_or_equal_worker_it_fails_at_once(
    make_state: Factory,
) -> None:
    """The user audit: a task killed at 0.95 GiB on a 1 GiB worker got its free retry
    on a 512 MiB one and failed there, although the scheduler knew its category's peak
    and that 1 GiB had failed. No worker takes tasks with more than 1 GiB and no pool
    can start one: it fails at once, naming the try, and nothing else is sent."""
    s = make_state()
    join(s, "w-cpu-1", cores=2, memory=GB, pool="cpu")
    join(s, "w-cpu-2", cores=1, memory=512 * MB, pool="cpu")
    join(s, "w-idle", cores=2, memory=2 * GB, pool="idle")  # another pool's: no help
    cmds = submit(s, {"hog-0": []}, ["hog-0"], pool="cpu")
    assert assigned(cmds) == {"w-cpu-1": ["hog-0"]}
    cmds = finish(s, "w-cpu-1", "hog-0", "oom", rss=int(0.95 * GB), rss_peak=1022287872)
    assert [type(c) for c in cmds] == [KeyErred]
    (erred,) = cmds
    err = erred.error
    assert isinstance(err, TaskOutOfMemory) and erred.root == "hog-0"
    assert (err.worker, err.limit, err.tries) == ("w-cpu-1", GB, 1)
    assert err.ooms == (("w-cpu-1", GB, 1022287872),)
    assert err.nowhere == (
        "a retry goes only to a worker with a memory limit above 1.00 GiB, and the largest "
        "worker of pool 'cpu' that takes tasks has 1.00 GiB"
    )
    assert (
        "(1 try). Killed for memory once: on 'w-cpu-1' (limit 1.00 GiB, peak 0.95 GiB)"
        ". Not retried: a retry goes only" in str(err)
    )
    assert s.tasks["hog-0"].state == "erred"
    assert [e[1:3] for e in s.story("hog-0")[-3:]] == [
        ("oom", "not retried: " + err.nowhere),
        ("processing", "erred"),
        ("erred", f"TaskOutOfMemory: {err}"[:197] + "..."),  # (its line, cut at 200)
    ]


def test_an_oom_try_that_shared_its_worker_is_retried_on_one_as_large(
    make_state: Factory,
) -> None:
    """A kill while other tasks ran on the same worker counted their memory too: the
    retry may go to a worker with the same limit (not a smaller one), where it may run
    with fewer beside it. A try that ran alone needs a larger one (the test above)."""
    s = make_state()
    join(s, "w1", cores=2, memory=GB)
    cmds = submit(s, {"hog-0": [], "other-0": []}, ["hog-0", "other-0"])
    assert assigned(cmds) == {"w1": ["hog-0", "other-0"]}
    join(s, "w-small", cores=2, memory=512 * MB)
    join(s, "w2", cores=2, memory=GB)
    cmds = finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB), rss_peak=int(0.97 * GB))
    assert s.tasks["hog-0"].oom_alone == (False,)  # other-0 ran beside it
    assert of(cmds, KeyErred) == []
    (target,) = assigned(cmds)  # to a worker of 1 GiB, never the 512 MiB one
    assert target in ("w1", "w2")
    assert s.tasks["hog-0"].oom_need == "of 1.00 GiB or more"


def test_an_oom_try_alone_whose_own_process_stayed_under_the_fence_is_retried_on_one_as_large(
    make_state: Factory,
) -> None:
    """The memprio audit's defect 5: with ``--execution process --cores 1`` every task
    runs alone, and a kill took the worker's whole RSS (its stored outputs, inputs being
    fetched) as the task's need: "Not retried: a retry goes only to a worker with a
    memory limit above 1.00 GiB" at the first kill. The worker reports the task
    process's own RSS with the kill: 300 MiB; with the worker's 600 MiB of outputs, the
    rest of its 0.96 GiB (its floor) is 83 MiB: 383 MiB, under the fence without the
    outputs, so a worker as large (w1) takes the retry, as many times as the retry
    policy's max_oom allows; the error then states the task's own figure."""
    s = make_state()
    join(s, "w1", memory=GB)
    assert assigned(submit(s, {"hog-0": []}, ["hog-0"])) == {"w1": ["hog-0"]}
    run(s, event(WorkerMemory, worker="w1", throttled=False, rss=int(0.75 * GB),
                 throttle_at=int(0.8 * GB), limit=GB, memory_bytes=600 * MB))  # fmt: skip
    cmds = finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB), rss_peak=int(0.97 * GB),
                  own_rss=300 * MB)  # fmt: skip
    ts = s.tasks["hog-0"]
    assert ts.oom_alone == (False,) and ts.oom_own == 300 * MB
    assert of(cmds, KeyErred) == [] and assigned(cmds) == {"w1": ["hog-0"]}
    assert ts.oom_need == "of 1.00 GiB or more"
    cmds = finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB), rss_peak=int(0.97 * GB),
                  own_rss=310 * MB)  # fmt: skip
    (erred,) = of(cmds, KeyErred)  # the default max_oom (1): one retry after a kill
    err = erred.error
    assert isinstance(err, TaskOutOfMemory) and err.own == 310 * MB and not err.nowhere
    assert (
        "the worker used 0.96 GiB of its 1.00 GiB limit while the task ran; the task's "
        "process and the programs it started, if any, used 0.30 GiB of it, past the "
        "terminate fence (2 tries)" in str(err)
    )


def test_a_kill_says_how_much_of_the_workers_rss_was_its_floor_when_that_is_large(
    make_state: Factory,
) -> None:
    """A user audit's median on 400 MiB workers in process execution: the worker used
    389.9 MiB, the task's own process 171.8 MiB, and the error told them to make chunks
    smaller, while 218 MiB was the worker's floor (its own process with numpy and dask,
    its other task process). The message says so, with the floor's share, and leads
    with the floor's advice; a floor under FLOOR_SHARE of the RSS is not mentioned."""
    s = make_state()
    join(s, "w1", memory=400 * MB)
    key = "('rechunk-merge-7640d880ec3f3085d25aac4c833e3828', 1, 1, 1)"
    submit(s, {key: []}, [key])
    run(s, event(WorkerMemory, worker="w1", throttled=True, rss=300 * MB,
                 throttle_at=280 * MB, limit=400 * MB, memory_bytes=20 * MB))  # fmt: skip
    cmds = finish(s, "w1", key, "oom", rss=410 * MB, rss_peak=410 * MB, own_rss=172 * MB)
    (erred,) = of(cmds, KeyErred)  # alone, its own 172 + the rest 218 past the fence
    err = erred.error
    assert isinstance(err, TaskOutOfMemory) and err.rest == 218 * MB and err.nowhere
    text = str(err)
    assert (
        "the worker used 410.0 MiB of its 400.0 MiB limit while the task ran; the task's "
        "process and the programs it started, if any, used 172.0 MiB of it, and 218.0 MiB "
        "(53%) was the worker's floor, "
        "neither that process nor outputs in memory (the worker's own process with its "
        "libraries, its other task processes, copies on their way), past the terminate "
        "fence (1 try)." in text
    ), text
    assert f"With a floor that large, smaller chunks shrink only the rest: {FLOOR_ADVICE}; " in (
        text
    )
    assert "array.chunk-size" in text  # the rechunk's own hint stays
    small = str(TaskOutOfMemory("hog-0", "w", 390 * MB, 400 * MB, 1, own=300 * MB, rest=90 * MB))
    assert "floor" not in small and small.endswith("raise the terminate fraction.")


def test_an_oom_try_alone_that_needs_the_fence_without_the_outputs_needs_a_larger_worker(
    make_state: Factory,
) -> None:
    """Its own process at 0.80 GiB, and the worker's 0.17 GiB beside it not outputs (it
    holds none): an emptier worker as large would kill it again."""
    s = make_state()
    join(s, "w1", memory=GB)
    submit(s, {"hog-0": []}, ["hog-0"])
    cmds = finish(s, "w1", "hog-0", "oom", rss=int(0.97 * GB), rss_peak=int(0.97 * GB),
                  own_rss=int(0.8 * GB))  # fmt: skip
    (erred,) = of(cmds, KeyErred)
    err = erred.error
    assert isinstance(err, TaskOutOfMemory) and s.tasks["hog-0"].oom_alone == (True,)
    assert err.nowhere.startswith("a retry goes only to a worker with a memory limit above")
    assert (
        "; the task's process and the programs it started, if any, used 0.80 GiB of it, "
        "past the terminate" in str(err)
    )


def test_an_oom_retry_waits_for_a_busy_larger_worker_and_runs_there(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB)
    join(s, "large", memory=2 * GB)
    submit(s, {"busy-0": []}, ["busy-0"], attrs={"busy-0": {"resources": {"memory": 1.5 * GB}}})
    assert on(s, "large") == {"busy-0"}
    cmds = submit(s, {"hog-0": []}, ["hog-0"])
    assert assigned(cmds) == {"small": ["hog-0"]}
    cmds = finish(s, "small", "hog-0", "oom", rss=int(0.96 * GB), rss_peak=int(0.97 * GB))
    assert of(cmds, Execute) == [] and of(cmds, KeyErred) == []  # small is free: not there
    assert s.tasks["hog-0"].state == "queued" and "small" in s.free
    assert s.story("hog-0")[-1][1:3] == (
        "queued",
        "waiting for a worker with a memory limit above 1.00 GiB: killed for memory on "
        "'small' (1.00 GiB), it runs again only on a larger one",
    )
    cmds = submit(s, {"inc-0": []}, ["inc-0"])  # fresh work still runs on small
    assert assigned(cmds) == {"small": ["inc-0"]}
    cmds = finish(s, "large", "busy-0")
    assert assigned(cmds) == {"large": ["hog-0"]}
    finish(s, "large", "hog-0")
    assert s.tasks["hog-0"].state == "memory"


def test_an_oom_retry_waits_for_a_pool_that_can_start_a_larger_worker(
    make_state: Factory,
) -> None:
    """A configured pool whose workers have more (memory_per_worker) may get a block
    from the autoscaler: the retry waits for it, and runs on its worker."""
    s = make_state(pool_memory={"cpu": GB, "big": 8 * GB})
    join(s, "w1", memory=GB, pool="cpu")
    submit(s, {"hog-0": []}, ["hog-0"])
    cmds = finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB))
    assert cmds == [] and s.tasks["hog-0"].state == "queued"
    cmds = join(s, "w2", memory=8 * GB, pool="big")
    assert assigned(cmds) == {"w2": ["hog-0"]}


def test_an_oom_retry_of_a_pool_whose_workers_have_no_more_fails_at_once(
    make_state: Factory,
) -> None:
    s = make_state(pool_memory={"cpu": GB, "big": 8 * GB})
    join(s, "w1", memory=GB, pool="cpu")
    submit(s, {"hog-0": []}, ["hog-0"], pool="cpu")
    (erred,) = of(finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB)), KeyErred)
    assert erred.error.nowhere == (
        "a retry goes only to a worker with a memory limit above 1.00 GiB, and the largest "
        "worker of pool 'cpu' that takes tasks has 1.00 GiB, and no pool is configured to "
        "start larger workers"
    )


def test_an_oom_retry_fails_when_the_only_larger_worker_leaves(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB)
    join(s, "large", memory=2 * GB)
    submit(s, {"busy-0": []}, ["busy-0"], attrs={"busy-0": {"resources": {"memory": 1.5 * GB}}})
    submit(s, {"hog-0": []}, ["hog-0"])
    finish(s, "small", "hog-0", "oom", rss=int(0.96 * GB))
    assert s.tasks["hog-0"].state == "queued"
    cmds = run(s, event(WorkerDraining, worker="large"))
    (erred,) = of(cmds, KeyErred)
    assert erred.key == "hog-0" and isinstance(erred.error, TaskOutOfMemory)
    assert "the largest worker that takes tasks has 1.00 GiB" in erred.error.nowhere
    assert assigned(cmds) == {}


def test_an_oom_task_recomputed_after_the_larger_worker_left_fails_rather_than_waits(
    make_state: Factory,
) -> None:
    """Found by the random-workload state machine: a task killed for memory on a 1 GiB
    worker ran on a 2 GiB one; that worker left with its output, still needed, so the
    task ran again with only 1 GiB workers left. It waited for ever for a larger worker
    (queued, its story saying so, nothing to start one). Now it fails with
    TaskOutOfMemory saying why, as a retry does when the larger worker leaves."""
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB)
    join(s, "large", memory=2 * GB)
    submit(s, {"busy-0": []}, ["busy-0"], attrs={"busy-0": {"resources": {"memory": 1.5 * GB}}})
    submit(s, {"hog-0": [], "use-0": ["hog-0"]}, ["use-0"])
    assert on(s, "small") == {"hog-0"}
    finish(s, "small", "hog-0", "oom", rss=int(0.96 * GB))
    finish(s, "large", "busy-0")
    assert on(s, "large") == {"hog-0"}
    finish(s, "large", "hog-0")
    assert on(s, "large") == {"use-0"}  # with its input
    cmds = run(s, event(WorkerLeft, worker="large"))  # hog-0's only copy with it
    (erred,) = of(cmds, KeyErred)  # the key asked for, failed by hog-0's error
    assert (erred.key, erred.root) == ("use-0", "hog-0")
    err = s.tasks["hog-0"].error
    assert isinstance(err, TaskOutOfMemory) and "TaskOutOfMemory" in str(erred.error)
    assert "the largest worker that takes tasks has 1.00 GiB" in err.nowhere
    assert s.tasks["hog-0"].state == "erred" and assigned(cmds) == {}


# ----------------------------------------------------------------------------- RSS rise


def burst_known(s: SchedulerState, worker: str, rise: int, rss: int = 100 * MB) -> None:
    """One ``burst`` task ran on ``worker`` alone: its RSS rose by ``rise`` while it ran
    (a peak sample) and fell back once it freed the burst; it returned 8 bytes."""
    submit(s, {"burst-0": []}, ["burst-0"])
    assert assigned_keys(s, "burst-0") == worker
    finish(s, worker, "burst-0", nbytes=8, rss_before=rss, rss_peak=rss + rise, rss=rss + MB)
    assert s.stats["burst"].max_rss_growth == rise  # the peak's rise, not after - before


def assigned_keys(s: SchedulerState, key: str) -> str | None:
    ts = s.tasks[key]
    return ts.worker if ts.state == "processing" else None


def test_a_burst_task_goes_to_a_worker_running_none_beside_it(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1", cores=2, memory=GB)
    burst_known(s, "w1", 600 * MB)
    join(s, "w2", cores=2, memory=GB)
    cmds = submit(
        s, {"burst-1": [], "burst-2": [], "burst-3": []}, ["burst-1", "burst-2", "burst-3"]
    )
    placed = assigned(cmds)
    assert sorted(placed) == ["w1", "w2"] and all(len(keys) == 1 for keys in placed.values())
    assert s.tasks["burst-3"].state == "queued"


def test_a_burst_task_waits_while_one_runs_on_its_worker_and_starts_when_it_ends(
    make_state: Factory,
) -> None:
    # The user audit's case: bursts of 400 MB on a 400 MiB worker with two threads. Held
    # bursts start one at a time, and hold back no task of another category.
    s = make_state()
    join(s, "w1", cores=2, memory=400 * 2**20)
    burst_known(s, "w1", 400 * MB)
    keys = [f"burst-{i}" for i in range(1, 6)]
    table: dict[str, list[str]] = {key: [] for key in keys}
    table["other-1"] = []  # behind the bursts in graph order, of no known rise
    cmds = submit(s, table, [*keys, "other-1"])
    assert assigned(cmds) == {"w1": ["burst-1", "other-1"]}
    held = [k for k in keys if s.tasks[k].state == "queued"]
    assert held == keys[1:]
    assert {e[0] for e in s.story_log if e[1] == "admission"} == set(held)
    finish(s, "w1", "other-1", nbytes=8)
    for i, key in enumerate(keys[:-1]):
        cmds = finish(s, "w1", key, nbytes=8, rss_before=100 * MB, rss_peak=500 * MB, rss=100 * MB)
        assert assigned(cmds) == {"w1": [keys[i + 1]]}


def test_tasks_of_an_unknown_or_small_rise_are_not_held(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1", cores=2, memory=400 * 2**20)
    # No try of "blob" has finished: its rise is not known, nothing changes.
    cmds = submit(s, {"blob-1": [], "blob-2": []}, ["blob-1", "blob-2"])
    assert assigned(cmds) == {"w1": ["blob-1", "blob-2"]}
    finish_all(s, "w1", ["blob-1", "blob-2"], nbytes=8)
    # Known to rise by 50 MB: two fit beside each other under the fence.
    submit(s, {"small-0": []}, ["small-0"])
    finish(s, "w1", "small-0", nbytes=8, rss_before=100 * MB, rss_peak=150 * MB, rss=100 * MB)
    cmds = submit(s, {"small-1": [], "small-2": []}, ["small-1", "small-2"])
    assert assigned(cmds) == {"w1": ["small-1", "small-2"]}


def test_a_task_rising_past_the_limit_still_starts_alone(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1", cores=2, memory=400 * 2**20)
    burst_known(s, "w1", 2 * GB)  # larger than the limit: the terminate fence deals with it
    cmds = submit(s, {"burst-1": []}, ["burst-1"])
    assert assigned(cmds) == {"w1": ["burst-1"]}


def test_one_outlier_rise_stops_holding_its_category_after_a_window_of_small_tries(
    make_state: Factory,
) -> None:
    # The user audit's case: one 3.2 GB chunk taught category "random" a 6.4 GB rise, and
    # every later small chunk ran one per worker for the manager's life. The admission
    # figure is the largest rise of the latest RISE_WINDOW tries: it holds while the
    # outlier is among them, and lets go once RISE_WINDOW small ones have ended.
    s = make_state()
    join(s, "w1", cores=2, memory=GB)
    burst_known(s, "w1", 2 * GB)
    for i in range(1, RISE_WINDOW):
        submit(s, {f"burst-{i}": [], f"burst-x{i}": []}, [f"burst-{i}", f"burst-x{i}"])
        assert s.tasks[f"burst-x{i}"].state == "queued"  # one at a time: 2 GB counted
        finish(s, "w1", f"burst-{i}", nbytes=8, rss_before=100 * MB, rss_peak=150 * MB)
        assert s.tasks[f"burst-x{i}"].state == "processing"
        finish(s, "w1", f"burst-x{i}", nbytes=8)  # no rise measured: not in the window
    st = s.stats["burst"]
    assert (st.rss_rise, st.max_rss_growth, s.max_rise) == (2 * GB, 2 * GB, 2 * GB)
    submit(s, {"burst-16": []}, ["burst-16"])
    finish(s, "w1", "burst-16", nbytes=8, rss_before=100 * MB, rss_peak=150 * MB)
    # RISE_WINDOW small tries since: admitted at the small figure, two at once.
    assert (st.rss_rise, st.max_rss_growth, s.max_rise) == (50 * MB, 2 * GB, 50 * MB)
    cmds = submit(s, {"burst-17": [], "burst-18": []}, ["burst-17", "burst-18"])
    assert assigned(cmds) == {"w1": ["burst-17", "burst-18"]}


def test_a_category_whose_tries_all_rise_stays_held_by_its_rise(make_state: Factory) -> None:
    # What admission protects is kept: tries that really rise by 600 MB each keep the
    # category's figure at 600 MB however many end, one at a time on a 1 GB worker.
    s = make_state()
    join(s, "w1", cores=2, memory=GB)
    burst_known(s, "w1", 600 * MB)
    for i in range(1, 2 * RISE_WINDOW):
        cmds = submit(s, {f"burst-{i}": [], f"burst-x{i}": []}, [f"burst-{i}", f"burst-x{i}"])
        assert assigned(cmds) == {"w1": [f"burst-{i}"]}
        cmds = finish(s, "w1", f"burst-{i}", nbytes=8, rss_before=100 * MB, rss_peak=700 * MB)
        assert assigned(cmds) == {"w1": [f"burst-x{i}"]}
        finish(s, "w1", f"burst-x{i}", nbytes=8, rss_before=100 * MB, rss_peak=700 * MB)
    assert s.stats["burst"].rss_rise == 600 * MB


def test_an_operator_forgets_a_category_and_its_tasks_are_placed_as_new(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", cores=2, memory=GB)
    burst_known(s, "w1", 2 * GB)
    st = s.stats["burst"]
    run(s, event(CategoryForgotten, category="nothing-like-it"))  # unknown: let be
    assert (st.count, st.rss_rise, s.max_rise) == (1, 2 * GB, 2 * GB)
    run(s, event(CategoryForgotten, category="burst"))
    assert (st.count, st.rss_rise, st.max_rss_growth, s.max_rise) == (0, 0, 0, 0)
    assert s._stat_views["burst"].max_rss_growth == 0  # policies' views stay live
    assert s.story_log[-1][:3] == ("-", "category-forgotten", "burst")
    cmds = submit(s, {"burst-1": [], "burst-2": []}, ["burst-1", "burst-2"])
    assert assigned(cmds) == {"w1": ["burst-1", "burst-2"]}


def test_a_thread_worker_far_past_its_limit_is_logged_at_each_doubling_not_each_step(
    make_state: Factory,
) -> None:
    """The user audit: one task growing to 1.5 GiB on a 600 MiB thread worker logged
    35 warnings in 3.5 s, one per 5% of the limit the worker reports. Each new peak
    still comes out (status()["warnings"] stays current), but the shell logs it only
    at the first crossing and then each time the excess over the limit doubled (from at
    least 5% of the limit)."""
    s = make_state()
    join(s, "w1", cores=2, memory=600 * MB)
    submit(s, {"hog-0": []}, ["hog-0"])
    said = []
    for peak in range(612 * MB, 1580 * MB, 30 * MB):  # the worker's reports, 5% apart
        ev = event(WorkerMemory, worker="w1", throttled=True, rss=peak,
                   throttle_at=420 * MB, limit=600 * MB, past_peak=peak)  # fmt: skip
        said += [c for c in run(s, ev) if isinstance(c, WorkerPastLimit)]
    assert [c.peak for c in said] == list(range(612 * MB, 1580 * MB, 30 * MB))
    assert [c.peak // MB for c in said if c.log] == [612, 672, 762, 942, 1302]


def test_a_thread_worker_past_its_fence_is_said_at_each_new_peak_and_ends_when_it_leaves(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", cores=2, memory=GB)
    submit(s, {"chunk-0": [], "sum-0": []}, ["chunk-0", "sum-0"])

    def report(peak: int, rss: int) -> list[Any]:
        ev = event(WorkerMemory, worker="w1", throttled=True, rss=rss,
                   throttle_at=int(0.7 * GB), limit=GB, past_peak=peak)  # fmt: skip
        return [c for c in run(s, ev) if isinstance(c, WorkerPastLimit)]

    assert report(0, 980 * MB) == []  # past the fence of a process worker: it kills
    (said,) = report(980 * MB, 980 * MB)
    assert said == WorkerPastLimit(said.stimulus_id, "w1", GB, 980 * MB, ("chunk", "sum"))
    assert report(980 * MB, 500 * MB) == []  # the same peak: said already
    (said,) = report(3 * GB, 3 * GB)
    assert (said.peak, said.categories) == (3 * GB, ("chunk", "sum"))
    cmds = run(s, event(WorkerLeft, worker="w1", cause="drained"))
    assert [c for c in cmds if isinstance(c, WorkerPastLimit)] == [
        WorkerPastLimit(cmds[0].stimulus_id, "w1", GB, 0)
    ]


# ----------------------------------------------------------------------------- watchdog


def stalled_state(make_state: Factory, n: int = 6) -> SchedulerState:
    """Two throttled workers, each running (deferring) one load; the rest queued."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w2")
    keys = [f"load-{i}" for i in range(n)]
    submit(s, dict.fromkeys(keys, ()), keys)
    for w in ("w1", "w2"):
        finish(s, w, next(iter(on(s, w))), nbytes=300 * MB)
    throttle(s, "w1", now=100.0)
    throttle(s, "w2", now=100.0)
    return s


def test_the_watchdog_fails_a_stalled_run_with_a_clear_error(make_state: Factory) -> None:
    s = stalled_state(make_state)
    assert s.stalled_since == {"*": 100.0}
    assert of(tick(s, 104.9), KeyErred) == []  # not yet
    cmds = tick(s, 105.0)
    errors = of(cmds, KeyErred)
    done = {k for k, ts in s.tasks.items() if ts.state == "memory"}
    assert len(done) == 2
    assert {e.key for e in errors} == {f"load-{i}" for i in range(6)} - done
    err = errors[0].error
    assert isinstance(err, MemoryStalled)
    text = str(err)
    assert "'load' 0.59 GiB in 2 outputs" in text  # what holds memory
    assert "The 4 producer tasks still to run need about 1.17 GiB" in text
    assert "0.00 GiB is left under the throttle fences" in text
    assert err.holding == [("load", 600 * MB, 2)]
    assert "release futures you no longer need" in text
    # Nothing is left running; the deferred tries were cancelled on the workers.
    assert not s.workers["w1"].processing and not s.workers["w2"].processing
    assert not s.stalled_since


def test_a_stall_counts_each_waiting_producer_as_large_as_its_layers_outputs(
    make_state: Factory,
) -> None:
    """The memprio audit's defect 7: 85 chunks of 128 MB still to make were said to
    need "about 6.25 GiB": the estimate was the category's mean output over the
    manager's life, and dask's arrays share the category "random" (earlier fused
    reductions of 336 bytes pulled it down). Each chunk is as large as its layer's
    (its array's) chunks made so far: 85 x 128 MB is 10.13 GiB."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w2")
    earlier = [("random-mean_chunk-820175be", i) for i in range(40)]
    submit(s, dict.fromkeys(earlier, ()), earlier)
    while any(s.tasks[k].state == "processing" for k in earlier):
        for w in ("w1", "w2"):
            for k in list(on(s, w)):
                finish(s, w, k, nbytes=336)
    assert s.stats["random"].count == 40
    chunks = [("random-19c3d3f1", i) for i in range(100)]
    submit(s, dict.fromkeys(chunks, ()), chunks)
    made = 0
    while made < 15:
        for w in ("w1", "w2"):
            for k in list(on(s, w)):
                if made < 15:
                    finish(s, w, k, nbytes=128_000_000)
                    made += 1
    throttle(s, "w1", now=100.0)
    throttle(s, "w2", now=100.0)
    errors = of(tick(s, 105.0), KeyErred)
    assert len(errors) == 85
    err = errors[0].error
    assert isinstance(err, MemoryStalled)
    assert err.holding == [("random", 15 * 128_000_000 + 40 * 336, 55)]
    assert err.needed == 85 * 128_000_000
    assert "The 85 producer tasks still to run need about 10.13 GiB" in str(err)


def test_a_stall_with_no_output_held_says_something_else_takes_the_memory() -> None:
    """Workers over their fence while holding no output (a task's global cache, memory
    the process kept): releasing futures or spilling cannot help; restarting can."""
    text = str(MemoryStalled([], needed=0, available=0, waiting=1, stalled_for=10.0))
    assert "Outputs held (in memory or spilled to disk): none" in text
    assert "No output is in their memory: something else takes it" in text
    assert "Restart those workers" in text and "release futures" not in text


def test_a_stall_whose_outputs_are_a_small_part_of_the_rss_says_so() -> None:
    """Outputs of 80 MiB held by workers at 500 MiB RSS: releasing futures would not
    be enough; the message says what the rest may be, and an unknown need is not
    printed as 0.0 MiB. Under a GiB, in MiB (0.08 GiB and 0.49 GiB said little)."""
    err = MemoryStalled(
        [("load", 80 * MB, 4)], needed=0, available=0, waiting=3, stalled_for=10.0,
        rss=500 * MB,
    )  # fmt: skip
    text = str(err)
    assert "need an amount not known yet" in text and "need about" not in text
    assert "release futures you no longer need" in text
    assert "cannot be pickled cannot be spilled" in text
    held = "The outputs held, spilled ones included, are 80.0 MiB"
    assert f"{held} against the workers' 500.0 MiB RSS" in text
    assert "something else takes it" in text and err.rss == 500 * MB
    # Outputs that make most of the RSS: no such note.
    text = str(MemoryStalled([("load", 400 * MB, 4)], 0, 0, 3, 10.0, rss=500 * MB))
    assert "something else takes it" not in text


def test_a_stall_with_every_output_spilled_says_the_rest_is_the_workers_floor() -> None:
    """The user audit's D2: spilling was on and had moved every output to disk, yet the
    advice was to allow spilling; the RSS left is memory that is not outputs."""
    err = MemoryStalled(
        [("random_sample", 230 * MB, 15)], needed=1210 * MB, available=220 * MB, waiting=81,
        stalled_for=10.9, rss=514 * MB, in_memory=0, limit=400 * MB,
    )  # fmt: skip
    text = str(err)
    assert "allow spilling" not in text and "release futures" not in text
    assert "'random_sample' 230.0 MiB in 15 outputs" in text
    assert "need about 1.18 GiB; 220.0 MiB is left under the throttle fences" in text
    assert (
        "None of those outputs is in the workers' memory (all of them are spilled to "
        "disk): their 514.0 MiB of RSS is memory that is not outputs (their floor: "
        "libraries, task processes, memory the allocator keeps), which no spilling "
        f"lowers. {FLOOR_ADVICE[0].upper()}{FLOOR_ADVICE[1:]}."
    ) in text
    assert err.in_memory == 0 and err.limit == 400 * MB
    # Outputs in memory (or not told): the advice to spill and release stays.
    for in_memory in (None, 10 * MB):
        text = str(MemoryStalled([("load", 400 * MB, 4)], 0, 0, 3, 10.0, 500 * MB, in_memory))
        assert "allow spilling to disk" in text and "not outputs" not in text


def test_the_watchdog_tells_a_stall_whose_outputs_are_all_spilled(make_state: Factory) -> None:
    s = stalled_state(make_state)
    for w in ("w1", "w2"):  # the workers say every output they hold is on disk
        run(s, WorkerMemory(stimulus_id=f"m-{w}", now=100.0, worker=w, throttled=True,
                            rss=int(0.75 * GB), throttle_at=int(0.7 * GB), limit=GB,
                            memory_bytes=0))  # fmt: skip
    err = of(tick(s, 105.0), KeyErred)[0].error
    assert isinstance(err, MemoryStalled) and err.in_memory == 0
    assert "None of those outputs is in the workers' memory" in str(err)
    assert "allow spilling" not in str(err)


def test_a_kill_past_the_limit_is_told_with_the_worker_rss_at_the_kill_as_its_peak(
    make_state: Factory,
) -> None:
    """The user audit's D6: its worker log said rss=502857728 for a kill on a 400 MiB
    worker; the error says that RSS, as the worker used and as the try's peak, though
    the task's own process peaked lower."""
    s = make_state()
    join(s, "w2", memory=400 * MB)
    submit(s, {"burst-5": []}, ["burst-5"])
    cmds = finish(s, "w2", "burst-5", "oom", rss=502857728, rss_peak=502857728)
    (erred,) = of(cmds, KeyErred)  # no larger worker to retry it on
    text = str(erred.error)
    assert "the worker used 479.6 MiB of its 400.0 MiB limit" in text
    assert "on 'w2' (limit 400.0 MiB, peak 479.6 MiB)" in text


def test_a_kill_on_a_worker_under_a_gib_is_told_in_mib() -> None:
    """The user audit's D6: 'used 0.39 GiB of its 0.39 GiB limit' on a 400 MiB worker."""
    text = str(
        TaskOutOfMemory("t", "w2", 485978112, 400 * MB, 2,
                        ooms=(("w2", 400 * MB, 398 * MB), ("w2", 400 * MB, 485978112)))
    )  # fmt: skip
    assert "the worker used 463.5 MiB of its 400.0 MiB limit" in text
    assert (
        "(limit 400.0 MiB, peak 398.0 MiB), then on 'w2' (limit 400.0 MiB, peak 463.5 MiB)" in text
    )


def test_a_kill_of_a_task_dask_made_says_how_to_control_it() -> None:
    """A user audit's TaskOutOfMemory told them to make the chunks of
    'repartitiontofewer' smaller, a task their code never made: dask's groupby made it
    (its split_out under the input's partitions joins them first). The message says
    what the task is and what sets its size; a key of the user's own says nothing more."""
    key = "('repartitiontofewer-550d88e32c91fbdf17f4d435bc0d55e2', 1)"
    text = str(TaskOutOfMemory(key, "w2", 485978112, 500 * MB, 2))
    assert text.endswith(
        "raise the terminate fraction. ('repartitiontofewer' is the dask operation this "
        "task belongs to: where your code does not call it, dask made it from your "
        "collection; it joins several partitions into one, for a step that has fewer "
        "output partitions than input ones (a groupby or shuffle whose split_out is under "
        "the input's npartitions, repartition(npartitions=...)): ask for more output "
        "partitions, e.g. groupby(...).agg(..., split_out=N) with N the input's "
        "npartitions.)"
    )
    other = str(TaskOutOfMemory("('getitem-7ec2a708cf2600d0ab11b81e5862c00a', 3)", "w", 1, 2, 1))
    assert "'getitem' is the dask operation" in other and "split_out for a dask" in other
    assert str(TaskOutOfMemory("hog-0", "w", 1, 2, 1)).endswith("terminate fraction.")


def test_a_kill_of_a_rechunk_task_names_the_array_chunk_size() -> None:
    """A user audit's median of a cube (40 MiB time chunks rechunked into 12.5 MiB space
    chunks) was killed in 'rechunk-merge' and told to make its chunks smaller; the
    112 MiB chunks came from dask's rechunk planner, bounded by array.chunk-size, which
    set to 32 MiB made it fit. Both rechunk steps name that setting, and so does a
    TaskTooLarge of one."""
    token = "7640d880ec3f3085d25aac4c833e3828"
    for name in ("rechunk-merge", "rechunk-split"):
        key = f"('{name}-{token}', 1, 1, 1)"
        text = str(TaskOutOfMemory(key, "worker-2", 409 * MB, 400 * MB, 1))
        assert text.endswith(
            f"raise the terminate fraction. ({name!r} is the dask operation this task "
            "belongs to: where your code does not call it, dask made it from your "
            "collection; it cuts (split) or joins (merge) chunks for a rechunk, and dask's "
            "rechunk plans intermediate chunks up to array.chunk-size (128 MiB by "
            "default), whatever the sizes of the chunks it reads and writes: "
            "dask.config.set({'array.chunk-size': '32MiB'}) before building the array.)"
        ), text
        large = str(TaskTooLarge(key, 500 * MB, 400 * MB, None))
        assert "dask.config.set({'array.chunk-size': '32MiB'})" in large, large


def test_the_dask_hint_is_for_a_dask_collections_keys_only() -> None:
    """A user audit's ``c.submit(hog, 1500)`` (key ``'hog-<token>'``, the user's own
    function) was told "'hog' is the dask operation this task belongs to". The hint is
    for a chunk or partition of a dask collection, ``('name-<token>', i, ...)``."""
    token = "7ec2a708cf2600d0ab11b81e5862c00a"
    for key in (f"hog-{token}", f"('hog-{token}',)", f"finalize-{token}", "('hog', 1)"):
        text = str(TaskOutOfMemory(key, "w", 700 * MB, 600 * MB, 2))
        assert "dask operation" not in text and text.endswith("terminate fraction."), key
    for key in (f"('var-{token}', 6, 7)", f"('getitem-{token}', 0)"):
        text = str(TaskOutOfMemory(key, "w", 700 * MB, 600 * MB, 2))
        assert "is the dask operation this task belongs to" in text, key


def test_a_kill_for_memory_is_told_in_one_unit(make_state: Factory) -> None:
    """The user audit's message said "limit 600.0 MiB" and "a memory limit above 0.59
    GiB" side by side: the reason it was not retried is in the unit of the rest."""
    s = make_state()
    join(s, "w1", cores=1, memory=600 * MB)
    submit(s, {"hog-0": []}, ["hog-0"])
    (erred,) = of(finish(s, "w1", "hog-0", "oom", rss=610 * MB, rss_peak=620 * MB), KeyErred)
    text = str(erred.error)
    assert erred.error.nowhere == (
        "a retry goes only to a worker with a memory limit above 620.0 MiB, and the largest "
        "worker that takes tasks has 600.0 MiB"
    )
    assert "GiB" not in text and "on 'w1' (limit 600.0 MiB, peak 620.0 MiB)" in text
    # a peak past a GiB on the same worker: GiB for every size, the limit too
    s = make_state()
    join(s, "w1", cores=1, memory=600 * MB)
    submit(s, {"hog-0": []}, ["hog-0"])
    (erred,) = of(finish(s, "w1", "hog-0", "oom", rss=GB, rss_peak=GB), KeyErred)
    text = str(erred.error)
    assert "MiB" not in text and "the worker used 1.00 GiB of its 0.59 GiB limit" in text
    assert (
        "a memory limit above 1.00 GiB, and the largest worker that takes tasks has 0.59 GiB"
        in text
    )


def floor_report(s: SchedulerState, worker: str, floor: int, limit: int = 600 * MB) -> list[Any]:
    """A memory report of ``worker`` with its floor at (``floor``) or under (0) its
    resume mark, as its core says it (the configured marks of ``limit``)."""
    marks = (int(0.6 * limit), int(0.7 * limit), limit)
    text = floor_warning(floor, *marks, execution="process", at_start=False) if floor else ""
    ev = event(WorkerMemory, worker=worker, throttled=False, rss=floor or 100 * MB,
               throttle_at=int(0.7 * limit), limit=limit, floor=floor,
               floor_warning=text)  # fmt: skip
    return [c for c in run(s, ev) if isinstance(c, WorkerFloor)]


def test_a_floor_past_the_resume_mark_is_shown_while_it_holds(make_state: Factory) -> None:
    """The user audit: 'memory that is not outputs is 491.6 MiB ...' went only to the
    worker's own log; status()["warnings"] held the cores warning alone. Each change of
    a worker's reported floor comes out for the shell to show, until it falls under
    the mark or the worker leaves."""
    s = make_state()
    join(s, "w1", cores=2, memory=600 * MB)
    floor = 515477504  # the audit's: 491.6 MiB
    (said,) = floor_report(s, "w1", floor)
    assert said == WorkerFloor(said.stimulus_id, "w1", floor, floor_warning(
        floor, int(0.6 * 600 * MB), int(0.7 * 600 * MB), 600 * MB, execution="process",
        at_start=False))  # fmt: skip
    assert said.warning.startswith("memory that is not outputs is 491.6 MiB")
    assert floor_report(s, "w1", floor) == []  # the same floor: said already
    (said,) = floor_report(s, "w1", 0)
    assert (said.floor, said.warning) == (0, "")
    floor_report(s, "w1", floor)
    cmds = run(s, event(WorkerLeft, worker="w1", cause="drained"))
    assert [c for c in cmds if isinstance(c, WorkerFloor)] == [
        WorkerFloor(cmds[0].stimulus_id, "w1", 0)
    ]


def test_a_kill_on_a_worker_at_its_floor_blames_the_floor_not_the_chunks(
    make_state: Factory,
) -> None:
    """The user audit: 2 x 600 MiB workers with 2 task processes each; a task whose own
    process used 35.6 MiB was killed, and the message said "make the task's chunks
    smaller", while the workers' floor, 491.6 MiB, was past their resume mark (only
    their own logs said so). With the killed worker's floor past its mark, the message
    leads with it and its remedy; without, it blames the task's size as before."""
    s = make_state()
    join(s, "w1", cores=2, memory=600 * MB)
    floor_report(s, "w1", 515477504)
    key = "('var-4244c0ffee4244c0ffee4244c0ffee42', 6, 7)"
    submit(s, {key: []}, [key])
    cmds = finish(s, "w1", key, "oom", rss=634912768, rss_peak=634912768, own_rss=37329305)
    (erred,) = of(cmds, KeyErred)
    err = erred.error
    assert isinstance(err, TaskOutOfMemory) and err.floor == 515477504
    text = str(err)
    assert text.startswith(
        f"task {key!r} was killed for memory on worker 'w1': the worker used 605.5 MiB of "
        "its 600.0 MiB limit while the task ran; the task's process and the programs it "
        "started, if any, used 35.6 MiB of it, past the terminate fence (1 try). Memory "
        "that is not outputs was 491.6 MiB of "
        "that worker's 600.0 MiB (its floor: libraries, task processes, memory the "
        "allocator keeps), at or past its resume mark: the worker was nearly full before "
        f"the task began, and smaller chunks will not help; {FLOOR_ADVICE}. Killed for "
        "memory once: "
    )
    assert "chunks smaller" not in text and "dask operation" not in text
    # the same kill on a worker whose floor is under its mark: the task's size
    s = make_state()
    join(s, "w1", cores=2, memory=600 * MB)
    floor_report(s, "w1", 0)
    submit(s, {key: []}, [key])
    cmds = finish(s, "w1", key, "oom", rss=634912768, rss_peak=634912768, own_rss=600 * MB)
    (erred,) = of(cmds, KeyErred)
    text = str(erred.error)
    assert erred.error.floor == 0 and "Memory that is not outputs" not in text
    assert "make the task's chunks smaller" in text and "'var' is the dask operation" in text


def test_progress_restarts_the_watchdogs_clock(make_state: Factory) -> None:
    s = stalled_state(make_state)
    tick(s, 103.0)
    # A deferred load finishes after all (memory fell a little): progress.
    key = next(iter(on(s, "w1")))
    run(s, event_at(finish_event(s, "w1", key), 104.0))
    assert s.stalled_since == {"*": 104.0}  # still stalled, clock restarted
    assert of(tick(s, 108.9), KeyErred) == []
    assert of(tick(s, 109.0), KeyErred)


def test_no_stall_while_a_consumer_runs_or_a_worker_is_not_throttled(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, loads_and_sums(3), [f"sum-{i}" for i in range(3)])
    throttle(s, "w1", now=0.0)
    assert of(tick(s, 100.0), KeyErred) == []  # w2 is not throttled
    throttle(s, "w2", now=100.0)
    load = next(iter(on(s, "w2")))
    run(s, event_at(finish_event(s, "w2", load), 101.0))  # its sum is a consumer
    assert any(not ts.producer for ts in s.workers["w2"].processing | s.workers["w1"].processing)
    assert of(tick(s, 200.0), KeyErred) == []
    assert not s.stalled_since


def test_a_consumer_no_slot_is_open_for_is_a_stall_not_progress(make_state: Factory) -> None:
    """The audit's hang once more, the consumer kept out for another reason (it needs 2
    cores; the worker has 1): every slot of the throttled worker is held by deferred
    producers, so the ready consumer cannot be placed. The watchdog counted it as "a
    consumer can still be placed" at every tick and never fired; now it declares the
    stall after ``stall_timeout``."""
    s = producers_hold_every_slot(make_state, {"resources": {"cores": 2}})
    assert of(throttle(s, "w1", now=100.0), Execute) == []
    assert s.stalled_since == {"*": 100.0}
    assert of(tick(s, 104.9), KeyErred) == []
    errors = of(tick(s, 105.0), KeyErred)
    assert {e.key for e in errors} == {"sum-0", *(f"load-{i}" for i in range(1, 6))} - {
        k for k, ts in s.tasks.items() if ts.state == "memory"
    }
    assert errors and all(isinstance(e.error, MemoryStalled) for e in errors)


def test_a_new_consumer_whose_core_a_deferred_producer_holds_is_a_stall(
    make_state: Factory,
) -> None:
    """One slot open (one deferred producer left), but the consumer, of a category with
    no finished try, goes only to a core free of tasks, and the producer holds the
    core: it cannot be placed there either, and the stall is declared."""
    s = producers_hold_every_slot(make_state, {"resources": {"cores": 2}})
    throttle(s, "w1", now=100.0)
    key = sorted(on(s, "w1"))[0]
    run(s, event_at(finish_event(s, "w1", key), 101.0))  # progress: the clock restarts
    assert len(s.workers["w1"].processing) == 1  # no producer goes to a throttled worker
    assert of(tick(s, 105.9), KeyErred) == [] and s.stalled_since == {"*": 101.0}
    errors = of(tick(s, 106.0), KeyErred)
    assert "sum-0" in {e.key for e in errors}
    assert all(isinstance(e.error, MemoryStalled) for e in errors)


def test_a_consumer_with_a_slot_open_for_it_still_counts_as_progress(
    make_state: Factory,
) -> None:
    """The same with the consumer's category known to be short: it may take the open
    slot, and the clock does not run."""
    s = producers_hold_every_slot(make_state, {"resources": {"cores": 2}}, known=True)
    throttle(s, "w1", now=100.0)
    key = sorted(on(s, "w1"))[0]
    run(s, event_at(finish_event(s, "w1", key), 101.0))
    assert len(s.workers["w1"].processing) == 1
    assert of(tick(s, 200.0), KeyErred) == [] and not s.stalled_since


def test_a_try_that_executes_is_not_stalled_by_its_own_memory(make_state: Factory) -> None:
    """The failures audit's finding 1: one task holding most of its thread worker's
    memory (under the limit) throttles the worker; it is the only task. Before, it
    failed with ``MemoryStalled`` after ``stall_timeout`` while it ran, counted among
    the "producer tasks still to run". A try that executes ends (and frees its memory)
    or is killed (the terminate fence, its ``timeout=``): no stall while one does."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    submit(s, {"steady": []}, ["steady"])
    assert on(s, "w1") == {"steady"} and s.tasks["steady"].producer
    run(s, TasksRunning("ran", 99.0, "w1", (("steady", 0, 0.5),)))
    assert throttle(s, "w1", now=100.0) == [] and not s.stalled_since
    assert tick(s, 200.0) == [] and not s.stalled_since
    cmds = run(s, TasksFinished("done", 201.0, "w1", (result("steady", nbytes=250 * MB),)))
    assert [type(c) for c in cmds] == [KeyDone, FileFacts]
    assert s.tasks["steady"].state == "memory" and not s.stalled_since


def test_a_stall_still_fires_once_the_try_that_executed_ends(make_state: Factory) -> None:
    """The deadlock the watchdog is for outlives a try that executed: it ends, its
    output held, the worker stays throttled and the producers left wait there for
    ever. The clock starts when it ends, and they fail ``stall_timeout`` later, the
    deferred try taken back, none of them counted as run (none executed)."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    keys = [f"load-{i}" for i in range(4)]
    submit(s, dict.fromkeys(keys, ()), keys)
    (first,) = on(s, "w1")
    run(s, TasksRunning("ran", 99.0, "w1", ((first, 0, 0.5),)))
    throttle(s, "w1", now=100.0)
    assert of(tick(s, 200.0), KeyErred) == [] and not s.stalled_since
    cmds = run(s, TasksFinished("done", 201.0, "w1", (result(first, nbytes=300 * MB),)))
    assert of(cmds, Execute) == []  # no producer goes to a throttled worker
    assert s.stalled_since == {"*": 201.0}
    assert tick(s, 205.9) == []
    cmds = tick(s, 206.0)
    left = sorted(set(keys) - {first})
    assert [type(c) for c in cmds] == [KeyErred] * 3
    assert sorted(c.key for c in cmds) == left
    err = cmds[0].error
    assert isinstance(err, MemoryStalled) and all(c.error is err for c in cmds)
    assert (err.waiting, err.stalled_for, err.holding) == (3, 5.0, [("load", 300 * MB, 1)])
    assert "The 3 producer tasks still to run" in str(err)
    assert s.tasks[first].state == "memory" and not s.stalled_since


def at(now: float, cls: type[Any], **fields: Any) -> Any:
    """An event at ``now`` (the helpers' ``event`` takes its time from a counter shared
    by every test, which exact times must not depend on)."""
    return cls(stimulus_id=f"{cls.__name__}-{now}", now=now, **fields)


def hung_state(
    make_state: Factory, *, duration: float = 1.0, **attrs: float
) -> tuple[SchedulerState, str]:
    """w1 ran load-0 (``duration`` s, 300 MB held); load-1 began executing there at
    98.5 (with ``attrs``, such as its ``timeout=``) and never ends; w1 is throttled at
    100 with load-2..4 still to run. The review's finding 6: a hung try with no
    ``timeout=`` held its pool off the watchdog for ever."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="default"))
    keys = [f"load-{i}" for i in range(5)]
    specs = specs_for(s, dict.fromkeys(keys, ()), keys, attrs={"load-1": attrs})
    run(s, at(2.0, GraphSubmitted, specs=specs, wanted=tuple(keys)))
    assert on(s, "w1") == {"load-0"}
    done = result("load-0", duration=duration, nbytes=300 * MB)
    run(s, at(90.0, TasksFinished, worker="w1", results=(done,)))
    assert on(s, "w1") == {"load-1"}
    run(s, TasksRunning("ran", 99.0, "w1", (("load-1", 0, 0.5),)))
    assert throttle(s, "w1", now=100.0) == [] and not s.stalled_since
    return s, "load-1"


def stall_fires(s: SchedulerState, hung: str, at: float, executed: float, bound: float) -> None:
    """Nothing left executing within its bound, the stall suspected ``at``: the tasks
    still to run and the hung try fail ``stall_timeout`` (5 s) later, exactly."""
    assert tick(s, at) == [] and s.stalled_since == {"*": at}
    assert s.story_log[-1][:3] == ("-", "memory", "stall-suspected in pool any")
    assert tick(s, at + 4.9) == []
    now = at + 5.0
    cmds = tick(s, now)
    assert [type(c) for c in cmds] == [KeyErred] * 3 + [CancelOnWorker, KeyErred]
    assert [c.key for c in of(cmds, KeyErred)] == ["load-4", "load-3", "load-2", hung]
    assert cmds[3] == CancelOnWorker(f"tick-{now}", "w1", (hung,))
    err = cmds[0].error
    assert isinstance(err, MemoryStalled) and all(c.error is err for c in of(cmds, KeyErred))
    assert (err.waiting, err.stalled_for, err.holding) == (3, 5.0, [("load", 300 * MB, 1)])
    assert err.executing == [(hung, "w1", executed, bound)]
    text = str(err)
    assert "The 3 producer tasks still to run need about " in text
    assert (
        "the throttle fences. 1 try executed longer than the watchdog waits for a try, "
        f"which may never end, and fails too: {hung!r} on worker w1 ({executed:.0f} s, "
        f"its bound {bound:.0f} s). A task that runs longer than its bound needs a "
        "timeout= at least as long (the bound grows to it). "
    ) in text
    assert s.tasks[hung].state == "erred" and not on(s, "w1") and not s.stalled_since


def test_a_try_executing_past_its_bound_no_longer_holds_the_watchdog_off(
    make_state: Factory,
) -> None:
    """A try with no ``timeout=`` of a category with no long try counts as progress
    for 30 ``stall_timeout``s (150 s here); past that it may hang for ever, and the
    throttled run is stalled as it would be without it: the hung try fails with the
    tasks still to run, named apart from them (``executing``)."""
    s, hung = hung_state(make_state)
    assert tick(s, 200.0) == [] and not s.stalled_since
    assert tick(s, 248.5) == [] and not s.stalled_since  # 150 s executed: within
    stall_fires(s, hung, 249.0, executed=155.5, bound=150.0)


@pytest.mark.parametrize(
    ("given", "bound"),
    [({"timeout": 400.0}, 400.0), ({"duration": 400.0}, 800.0)],
    ids=["its-timeout", "its-category-ran-400s"],
)
def test_a_try_known_to_run_long_holds_the_watchdog_off_until_its_own_bound(
    make_state: Factory, given: dict[str, float], bound: float
) -> None:
    """A try's bound is the longest of 30 ``stall_timeout``s, its ``timeout=`` (its
    worker stops it then) and twice its category's longest ok try (load-0 ran 400 s: a
    try of it executing 400 s or more is expected, not hung). Within it, no stall
    however long the pool stays throttled, past 30 ``stall_timeout``s too."""
    s, hung = hung_state(make_state, **given)
    assert s.stats["load"].max_duration == given.get("duration", 1.0)
    for now in (249.0, 300.0, 98.5 + bound):
        assert tick(s, now) == [] and not s.stalled_since
    stall_fires(s, hung, 99.0 + bound, executed=bound + 5.5, bound=bound)


def test_a_try_past_its_bound_with_nothing_else_to_run_is_no_stall(
    make_state: Factory,
) -> None:
    """A hung try alone in its throttled pool keeps no other task from running: no
    memory stall (its ``timeout=``, or the ``CorralTaskRunningLong`` alert, is for it)."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="default"))
    specs = specs_for(s, {"steady": []}, ["steady"])
    run(s, at(2.0, GraphSubmitted, specs=specs, wanted=("steady",)))
    run(s, TasksRunning("ran", 99.0, "w1", (("steady", 0, 0.5),)))
    throttle(s, "w1", now=100.0)
    for now in (249.0, 1000.0, 10_000.0):
        assert tick(s, now) == [] and not s.stalled_since
    assert s.tasks["steady"].state == "processing"


def test_a_try_within_its_bound_beside_a_hung_one_holds_the_watchdog_off(
    make_state: Factory,
) -> None:
    """Only a pool whose every executing try is past its bound is stalled: a try that
    began later, within its own, still counts as progress until it passes it."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=2, memory=GB, pool="default"))
    keys = [f"load-{i}" for i in range(4)]
    specs = specs_for(s, dict.fromkeys(keys, ()), keys)
    run(s, at(2.0, GraphSubmitted, specs=specs, wanted=tuple(keys)))
    assert on(s, "w1") == {"load-0", "load-1"}
    run(s, TasksRunning("ran", 99.0, "w1", (("load-0", 0, 0.5),)))
    throttle(s, "w1", now=100.0)
    run(s, TasksRunning("ran-late", 200.0, "w1", (("load-1", 0, 0.5),)))
    for now in (249.0, 349.5):  # load-0 is past 150 s, load-1 within (until 349.5)
        assert tick(s, now) == [] and not s.stalled_since
    assert tick(s, 350.0) == [] and s.stalled_since == {"*": 350.0}
    cmds = tick(s, 355.0)
    assert [type(c) for c in cmds] == [KeyErred] * 2 + [CancelOnWorker, KeyErred] * 2
    assert [c.key for c in of(cmds, KeyErred)] == ["load-3", "load-2", "load-1", "load-0"]
    assert (cmds[2].keys, cmds[4].keys) == (("load-1",), ("load-0",))
    err = cmds[0].error
    assert err.executing == [("load-1", "w1", 155.5, 150.0), ("load-0", "w1", 256.5, 150.0)]
    assert err.waiting == 2 and not on(s, "w1")


def test_a_consumer_queued_behind_a_hung_try_is_no_progress(make_state: Factory) -> None:
    """Two slots on one core: sum-0 (a consumer) is sent to w1 and waits there behind
    load-1, which executes on its only thread and never ends. Past load-1's bound the
    consumer cannot run either: the stall fires, and both fail with the loads left."""
    s = make_state(stall_timeout=5.0, unknown_long=False)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="default"))
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(4)}
    table["sum-0"] = ["load-0"]
    run(s, at(2.0, GraphSubmitted, specs=specs_for(s, table, list(table)), wanted=tuple(table)))
    assert on(s, "w1") == {"load-0", "load-1"}
    done = result("load-0", duration=0.1, nbytes=300 * MB)
    run(s, at(90.0, TasksFinished, worker="w1", results=(done,)))
    assert on(s, "w1") == {"load-1", "sum-0"} and not s.tasks["sum-0"].producer
    run(s, TasksRunning("ran", 99.0, "w1", (("load-1", 0, 0.5),)))
    throttle(s, "w1", now=100.0)
    for now in (200.0, 248.5):  # load-1 executes within its bound
        assert tick(s, now) == [] and not s.stalled_since
    assert tick(s, 249.0) == [] and s.stalled_since == {"*": 249.0}
    cmds = tick(s, 254.0)
    assert [type(c) for c in cmds] == [
        CancelOnWorker, KeyErred, KeyErred, KeyErred, CancelOnWorker, KeyErred, FileFacts,
    ]  # fmt: skip
    assert [c.key for c in of(cmds, KeyErred)] == ["sum-0", "load-3", "load-2", "load-1"]
    assert (cmds[0].keys, cmds[4].keys) == (("sum-0",), ("load-1",))
    err = cmds[1].error
    assert isinstance(err, MemoryStalled) and (err.waiting, err.stalled_for) == (2, 5.0)
    assert err.executing == [("load-1", "w1", 155.5, 150.0)]
    assert not on(s, "w1") and not s.stalled_since


def test_held_results_alone_are_not_a_stall(make_state: Factory) -> None:
    # The persist case once it is done: memory is full of wanted results, nothing runs.
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    submit(s, {"load-0": []}, ["load-0"])
    finish(s, "w1", "load-0", nbytes=900 * MB)
    throttle(s, "w1", now=0.0)
    assert of(tick(s, 100.0), KeyErred) == [] and not s.stalled_since


# ----------------------------------------------------------------------------- helpers


def finish_event(s: SchedulerState, worker: str, key: Any) -> Any:
    return TasksFinished(
        stimulus_id="fin", now=0.0, worker=worker, results=(result(key, nbytes=300 * MB),)
    )


def event_at(ev: Any, now: float) -> Any:
    return dataclasses.replace(ev, now=now)


# ----------------------------------------------------------------------------- locality


def pairs(n: int) -> dict[str, list[str]]:
    """``x-{2i}`` and ``x-{2i+1}`` (roots) both feed ``add-i``, as ``x[i, j]`` and
    ``x[j, i]`` feed a chunk of ``x + x.T``."""
    table: dict[str, list[str]] = {f"x-{i}": [] for i in range(2 * n)}
    table.update({f"add-{i}": [f"x-{2 * i}", f"x-{2 * i + 1}"] for i in range(n)})
    return table


def test_roots_feeding_the_same_consumer_go_to_the_same_worker(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, pairs(4), [f"add-{i}" for i in range(4)])
    sent = assigned(cmds)
    # Each worker got one root for its slot and that root's partner with it.
    for w in ("w1", "w2"):
        a, b = sorted(sent[w])
        assert s.tasks[a].dependents == s.tasks[b].dependents
    # The consumer then runs where both inputs are: nothing has to move.
    for w in ("w1", "w2"):
        cmds = finish_all(s, w, sorted(on(s, w)), nbytes=32 * MB)
        (add,) = [k for k in assigned(cmds).get(w, []) if k.startswith("add")]
        assert all(w in d.who_has for d in s.tasks[add].deps)


def test_independent_roots_are_not_paired(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    keys = [f"x-{i}" for i in range(4)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.workers["w1"].n_processing == 1


def test_a_consumer_with_all_its_inputs_on_a_busy_worker_runs_there(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")  # one slot
    submit(s, {"a": []}, ["a"])
    # z outranks everything (user priority); b waits for a.
    submit(s, {"b": ["a"], "z": []}, ["b", "z"], attrs={"z": {"priority": 10}})
    assert s.tasks["z"].state == "queued" and s.tasks["b"].state == "waiting"
    cmds = finish(s, "w1", "a", nbytes=32 * MB)
    # a's slot would go to z by priority, and b would wait; but b's input is on w1:
    # b runs there at once (past the slot), z waits for the next free slot.
    assert assigned(cmds) == {"w1": ["b"]}
    assert s.tasks["z"].state == "queued"
    finish(s, "w1", "b")
    assert s.tasks["z"].worker == "w1"


def test_placement_policies_that_ignore_data_turn_both_off(make_state: Factory) -> None:
    s = make_state(saturation=1.0, placement="round-robin")
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, pairs(2), ["add-0", "add-1"])
    assert sorted(len(v) for v in assigned(cmds).values()) == [1, 1]


def test_a_queued_consumer_joins_its_big_input_on_a_busy_worker(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1")
    submit(s, {"a": [], "c": []}, ["a", "c"])
    while on(s, "w1"):
        key = min(on(s, "w1"))
        finish(s, "w1", key, nbytes=32 * MB if key == "a" else 100)
    submit(s, {"x": []}, ["x"])  # keeps w1's one slot busy
    join(s, "w2")  # idle
    # b's 32 MB input is on busy w1: b goes there (past the slot), not to idle w2.
    cmds = submit(s, {"b": ["a"]}, ["b"])
    assert assigned(cmds) == {"w1": ["b"]}
    # d's input is 100 bytes: moving it is cheaper than waiting, d goes to idle w2.
    cmds = submit(s, {"d": ["c"]}, ["d"])
    assert assigned(cmds) == {"w2": ["d"]}


def test_consumers_queue_on_the_worker_holding_their_big_inputs(make_state: Factory) -> None:
    # The persist-then-sum case: every chunk is on w1 (32 MB each), w2 is idle. Moving
    # a chunk costs more (64 ms at the policy's 500 MB/s) than waiting behind a few
    # short tasks, so the sums queue on w1, past twice its slots; nothing moves.
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1")
    chunks = [f"chunk-{i}" for i in range(5)]
    submit(s, dict.fromkeys(chunks, ()), chunks)
    while on(s, "w1"):
        finish_all(s, "w1", sorted(on(s, "w1")), nbytes=32 * MB)
    join(s, "w2")
    sums = {f"sum-{i}": [f"chunk-{i}"] for i in range(5)}
    cmds = submit(s, sums, list(sums))
    assert sorted(assigned(cmds)["w1"]) == sorted(sums)
    assert s.workers["w1"].n_processing == 5 > 2 * s.workers["w1"].slots


def test_an_oom_retry_fails_when_its_pool_has_no_worker_and_starts_none_larger(
    make_state: Factory,
) -> None:
    """Its worker drained while it ran: no worker of its pool takes tasks, and the
    pool's configured workers have no more than the one it was killed on."""
    s = make_state(pool_memory={"cpu": GB})
    join(s, "w1", memory=GB, pool="cpu")
    submit(s, {"hog-0": []}, ["hog-0"], pool="cpu")
    run(s, event(WorkerDraining, worker="w1"))
    (erred,) = of(finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB)), KeyErred)
    assert erred.error.nowhere == (
        "a retry goes only to a worker with a memory limit above 1.00 GiB, and pool 'cpu' has "
        "no worker that takes tasks (its workers have 1.00 GiB), and no pool is configured to "
        "start larger workers"
    )


def test_a_task_failed_for_memory_and_submitted_again_starts_afresh(make_state: Factory) -> None:
    """Submitted again (the user gave it smaller chunks, or freed memory), it may run
    on a worker of the same limit: the kills stay in its tries and story."""
    s = make_state()
    join(s, "w1", memory=GB)
    submit(s, {"hog-0": []}, ["hog-0"])
    assert [type(c) for c in finish(s, "w1", "hog-0", "oom", rss=int(0.96 * GB))] == [KeyErred]
    cmds = submit(s, {"hog-0": []}, ["hog-0"])
    assert assigned(cmds) == {"w1": ["hog-0"]}
    assert s.tasks["hog-0"].ooms == () and s.tasks["hog-0"].oom_tries == 1


def test_a_kill_in_process_execution_names_the_inputs_held_twice(make_state: Factory) -> None:
    """A user audit's chain of 350 MB arrays on 1 GiB process workers: each step's
    input was the worker's stored output and its task process's copy, and the step was
    killed with 0.53 GiB its own, the error silent on the copy. It names the inputs
    (a quarter of the limit or more) and what helps; smaller inputs are not named."""
    s = make_state()
    join(s, "w1", memory=GB)
    submit(s, {"load": [], "step": ["load"]}, ["step"])
    assert assigned(finish(s, "w1", "load", nbytes=350 * MB)) == {"w1": ["step"]}
    cmds = finish(s, "w1", "step", "oom", rss=int(0.96 * GB), rss_peak=int(0.96 * GB),
                  own_rss=540 * MB)  # fmt: skip
    (erred,) = of(cmds, KeyErred)
    err = erred.error
    assert isinstance(err, TaskOutOfMemory) and err.copied == 350 * MB
    assert (
        "Its inputs, 0.34 GiB, were in the task process as a copy of the worker's own: "
        "process execution copies a task's inputs into its task process, so the worker "
        "holds them twice while it runs. For inputs this large run the workers with "
        "execution 'thread', or make them file outputs (docs/files.md)" in str(err)
    )
    small = TaskOutOfMemory("k", "w1", GB, GB, 1, own=500 * MB, copied=GB // 4 - 1)
    assert "as a copy of the worker's own" not in str(small)
    assert "as a copy" not in str(TaskOutOfMemory("k", "w1", GB, GB, 1, copied=GB))  # own?


def test_a_thread_workers_exit_says_who_replaces_it() -> None:
    """A worker started by hand (``python -m runtime worker``) that stops itself past its
    exit mark exits with status 0, as a drained one, and nothing starts another (a
    256 MiB worker with exit 1.5 and a hog: ``exit status 0``, the manager left with no
    worker): the error said "another takes its place" of every such worker."""
    err = str(TaskOutOfMemory("k", "w1", 3 * GB // 2, GB, 1, exited=True))
    assert "past its exit mark" in err and "another takes its place" not in err
    assert (
        "the worker stopped itself (a pool or Cluster(processes=N) starts another in its "
        "place; a worker started by hand is not replaced)" in err
    )
