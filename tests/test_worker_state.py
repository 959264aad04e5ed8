"""Tests of the worker's pure core (actors/worker_state.py): events in, exact commands
out, and a Hypothesis state machine that drives random assignments, fetch answers,
finishes, memory samples, timers and cancels, checking the invariants after every step
and that every task handed over is reported exactly once.

No event loop, no threads, no clock: ``now`` is a number the test picks.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from actors.memory import SPILL_GRACE, MemoryConfig, floor_at_start
from actors.protocol import TaskResult, ToRun, past_limit_logged
from actors.worker_state import (
    EXIT_EVENT,
    FLOOR_EVENT,
    PAST_FENCE_IN_THREADS,
    SPARED_EVENT,
    CancelRequested,
    CancelRunning,
    Command,
    CopiesDone,
    CopiesRequested,
    DropRequested,
    Event,
    Exit,
    Fetch,
    Forget,
    InputsFetched,
    Kill,
    Log,
    MemorySampled,
    ReportDone,
    ReportMemory,
    ReportStarted,
    Sample,
    Spill,
    Spilled,
    StartTimer,
    Store,
    Submit,
    TasksAssigned,
    TasksFinished,
    ThreadsHeld,
    TimerFired,
    Trim,
    WorkerState,
)
from runtime.errors import (
    DiskFull,
    MemoryConfigError,
    TaskTimeout,
    ValueTooLarge,
    floor_warning,
)
from runtime.graph import Key, Task

MB = 1 << 20
LIMIT = 1000  # bytes: spill at 600, throttle at 700, terminate at 950


def noop() -> None:
    return None


def task(
    key: Key,
    deps: dict[Key, tuple[str, ...]] | None = None,
    *,
    producer: bool = False,
    sizes: tuple[int, ...] = (),
) -> ToRun:
    deps = deps or {}
    return ToRun(key, Task(key, noop), "cat", tuple(deps.items()), producer, sizes)


def state(nthreads: int = 1, **options: Any) -> WorkerState:
    killable = options.pop("killable", False)
    exits = options.pop("exits", False)
    cfg = MemoryConfig.of(LIMIT, options)
    return WorkerState("w", nthreads, cfg, killable=killable, exits=exits)


def feed(s: WorkerState, *events: Event) -> list[Command]:
    out = s.handle(*events)
    s.validate()
    return out


def ok(key: Key, nbytes: int = 10, value: Any = "v") -> tuple[TaskResult, Any]:
    return TaskResult(key, "ok", 1.0, 2.0, nbytes, 100, rss_before=90), value


def done(key: Key, nbytes: int = 10, **fields: Any) -> TaskResult:
    """The report of ``ok(key)``: its peak RSS is 0 (not sampled) unless given."""
    return TaskResult(key, "ok", 1.0, 2.0, nbytes, 100, rss_before=90, **fields)


def finish(s: WorkerState, key: Key, nbytes: int = 10) -> list[Command]:
    """Run ``key`` to its end, ok, with output ``v`` of ``nbytes``."""
    return feed(s, TasksFinished(0.0, (ok(key, nbytes),)))


# ----------------------------------------------------------------------------- running


def test_a_task_with_its_inputs_here_runs_and_its_output_is_stored() -> None:
    s = state()
    a = task("a")
    assert feed(s, TasksAssigned(0.0, (a,))) == [Submit(a)]
    assert finish(s, "a") == [Store("a", "v", 10), ReportDone((done("a"),)), Sample()]
    b = task("b", {"a": ("w",)})
    assert feed(s, TasksAssigned(1.0, (b,))) == [Submit(b)]
    assert s.held == {"a": 10} and s.tasks_run == 1


def test_a_task_sent_twice_is_run_once() -> None:
    s = state()
    a = task("a")
    assert feed(s, TasksAssigned(0.0, (a,)), TasksAssigned(0.0, (a,))) == [Submit(a)]


def test_an_error_is_reported_and_nothing_is_stored() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    boom = ValueError("boom")
    res = TaskResult("a", "error", 1.0, 2.0, 0, 100, boom)
    assert feed(s, TasksFinished(0.0, ((res, None),))) == [
        ReportDone((TaskResult("a", "error", 1.0, 2.0, 0, 100, boom),)),
        Sample(),
    ]
    assert s.held == {}


def test_a_try_whose_disk_filled_is_reported_disk_full_with_its_size() -> None:
    """The executor ended it ``disk-full`` (its task hit ENOSPC on the worker's disk,
    docs/files.md): reported as it came, the bytes written as ``nbytes`` and the error
    kept, nothing stored."""
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    full = OSError(28, "No space left on device")
    res = TaskResult("a", "disk-full", 1.0, 2.0, 3 * MB, 100, full, rss_before=90)
    assert feed(s, TasksFinished(3.0, ((res, None),))) == [
        ReportDone((TaskResult("a", "disk-full", 1.0, 2.0, 3 * MB, 100, full, rss_before=90),)),
        Sample(),
    ]
    assert s.held == {} and not s.active


# ----------------------------------------------------------------------------- fetching


def test_inputs_on_one_peer_come_in_one_request_each_key_once() -> None:
    s = state(nthreads=2)
    t1 = task("t1", {"x": ("p1",), "y": ("p1",)})
    t2 = task("t2", {"x": ("p1",)})
    assert feed(s, TasksAssigned(0.0, (t1, t2))) == [Fetch(1, "p1", ("x", "y"))]
    got = InputsFetched(1.0, 1, (("x", "X", 5), ("y", "Y", 6)))
    assert feed(s, got) == [Store("x", "X", 5), Submit(t2), Store("y", "Y", 6), Submit(t1)]


def test_a_key_the_first_holder_lacks_is_asked_of_the_next() -> None:
    s = state()
    t = task("t", {"x": ("p1", "p2")})
    assert feed(s, TasksAssigned(0.0, (t,))) == [Fetch(1, "p1", ("x",))]
    assert feed(s, InputsFetched(1.0, 1, missing=("x",))) == [Fetch(2, "p2", ("x",))]
    assert feed(s, InputsFetched(2.0, 2, (("x", "X", 5),))) == [Store("x", "X", 5), Submit(t)]


def test_a_peer_that_cannot_be_reached_is_passed_over_and_logged() -> None:
    s = state()
    t = task("t", {"x": ("p1", "p2")})
    feed(s, TasksAssigned(0.0, (t,)))
    assert feed(s, InputsFetched(1.0, 1, failed="gone")) == [
        Log("warning", "fetch failed", (("peer", "p1"), ("error", "gone"))),
        Fetch(2, "p2", ("x",)),
    ]


def test_when_no_holder_is_left_the_task_is_reported_missing() -> None:
    s = state()
    t = task("t", {"x": ("p1", "p2"), "y": ("p3",)})
    assert feed(s, TasksAssigned(0.0, (t,))) == [Fetch(1, "p1", ("x",)), Fetch(2, "p3", ("y",))]
    assert feed(s, InputsFetched(1.0, 2, (("y", "Y", 5),))) == [Store("y", "Y", 5)]
    assert feed(s, InputsFetched(1.0, 1, missing=("x",))) == [Fetch(3, "p2", ("x",))]
    missing = TaskResult(
        "t", "missing", missing=(("x", "p1"), ("x", "p2")), fetched=("y",),
        fetches=(("y", "p3", 5, 1.0),),  # sent at 0, got at 1
    )  # fmt: skip
    assert feed(s, InputsFetched(2.0, 3, missing=("x",))) == [ReportDone((missing,))]
    assert not s.active and not s.wants and s.held == {"y": 5}


def test_an_input_without_any_holder_fails_the_task_at_once() -> None:
    s = state()
    t = task("t", {"x": ()})
    missing = TaskResult("t", "missing", missing=(("x", ""),))
    assert feed(s, TasksAssigned(0.0, (t,))) == [ReportDone((missing,))]


def test_an_input_too_large_for_this_worker_fails_the_task_with_that_error() -> None:
    s = state()
    t = task("t", {"x": ("p1",)})
    feed(s, TasksAssigned(0.0, (t,)))
    error = ValueTooLarge("x", 2000, LIMIT, "worker 'w'")
    failed = TaskResult("t", "error", 3.0, 3.0, error=error)
    assert feed(s, InputsFetched(3.0, 1, refused=(("x", error),))) == [ReportDone((failed,))]


def test_a_file_input_the_disk_cannot_hold_fails_each_reader_with_its_own_disk_full() -> None:
    """The copy of file input ``x`` refused for want of disk: every task waiting for it
    ends ``disk-full`` with a DiskFull naming that task and ``x`` (the shell's names no
    task: it does not know the readers), not ``x``'s task as if it had written."""
    s = state()
    feed(s, TasksAssigned(0.0, (task("t1", {"x": ("p1",)}), task("t2", {"x": ("p1",)}))))
    error = DiskFull("", "w", 20 * 2**20, 2**20, 4 * 2**20, input="x")
    out = feed(s, InputsFetched(3.0, 1, refused=(("x", error),)))
    assert all(isinstance(cmd, ReportDone) for cmd in out)
    results = [r for cmd in out if isinstance(cmd, ReportDone) for r in cmd.results]
    assert [(r.key, r.outcome) for r in results] == [("t1", "disk-full"), ("t2", "disk-full")]
    for r in results:
        assert isinstance(r.error, DiskFull)
        assert (r.error.key, r.error.input, r.error.nbytes) == (r.key, "x", 20 * 2**20)
        assert str(r.error).startswith(f"task {r.key!r} could not fetch its input 'x'")
    assert not s.active and not s.wants


def test_at_most_max_fetches_requests_are_in_flight() -> None:
    s = state()  # one thread: two fetches at a time
    tasks = [task(f"t{i}", {f"x{i}": (f"p{i}",)}) for i in range(3)]
    assert feed(s, TasksAssigned(0.0, tuple(tasks))) == [
        Fetch(1, "p0", ("x0",)),
        Fetch(2, "p1", ("x1",)),
    ]
    assert feed(s, InputsFetched(1.0, 1, (("x0", 0, 1),))) == [
        Store("x0", 0, 1),
        Submit(tasks[0]),
        Fetch(3, "p2", ("x2",)),
    ]


def test_inputs_of_a_task_cancelled_while_fetching_are_not_kept() -> None:
    s = state()
    t = task("t", {"x": ("p1",), "y": ("p2",)})
    feed(s, TasksAssigned(0.0, (t,)))
    assert feed(s, CancelRequested(1.0, ("t",))) == []
    assert feed(s, InputsFetched(2.0, 1, (("x", "X", 5),))) == []
    assert s.held == {} and not s.active and not s.wants


def test_a_large_copy_nothing_here_needs_is_dropped_a_small_one_kept() -> None:
    s = state()
    t = task("t", {"big": ("p1",), "small": ("p1",)})
    feed(s, TasksAssigned(0.0, (t,)))
    feed(s, InputsFetched(1.0, 1, (("big", "B", 2 * MB), ("small", "S", 10))))
    assert finish(s, "t") == [
        Forget(("big",)),
        Store("t", "v", 10),
        # Both copies were made (fetches, each 1 s), only the small one is kept (fetched).
        ReportDone(
            (
                done(
                    "t",
                    fetched=("small",),
                    fetches=(("big", "p1", 2 * MB, 1.0), ("small", "p1", 10, 1.0)),
                ),
            )
        ),
        Sample(),
    ]
    assert s.held == {"small": 10, "t": 10}


def test_a_large_copy_another_task_here_needs_is_kept() -> None:
    s = state(nthreads=2)
    t1 = task("t1", {"big": ("p1",)})
    t2 = task("t2", {"big": ("p1",), "z": ("p2",)})
    feed(s, TasksAssigned(0.0, (t1, t2)))
    feed(s, InputsFetched(1.0, 1, (("big", "B", 2 * MB),)))
    fetches = (("big", "p1", 2 * MB, 1.0),)
    assert finish(s, "t1")[1] == ReportDone((done("t1", fetched=("big",), fetches=fetches),))
    assert "big" in s.held


def test_copies_of_a_leaving_peers_outputs_are_fetched_and_kept() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("here"),)))
    finish(s, "here")
    ask = CopiesRequested(1.0, 7, (("x", ("gone",), 5), ("y", ("gone",), 6), ("here", (), 1)))
    assert feed(s, ask) == [Fetch(1, "gone", ("x", "y"))]
    got = InputsFetched(2.0, 1, (("x", "X", 5),), missing=("y",))
    assert feed(s, got) == [Store("x", "X", 5), CopiesDone(7, ("here", "x"))]
    assert s.held == {"here": 10, "x": 5} and not s.wants and not s.copies


def test_a_copy_and_a_task_share_one_fetch() -> None:
    s = state()
    t = task("t", {"x": ("p1",)})
    feed(s, TasksAssigned(0.0, (t,)))
    assert feed(s, CopiesRequested(0.5, 1, (("x", ("p1",), 5),))) == []  # asked already
    assert feed(s, CancelRequested(0.6, ("t",))) == []  # the copy still wants it
    assert feed(s, InputsFetched(1.0, 1, (("x", "X", 5),))) == [
        Store("x", "X", 5),
        CopiesDone(1, ("x",)),
    ]


# ----------------------------------------------------------------------------- memory


def test_a_throttled_worker_defers_producers_and_runs_them_when_memory_falls() -> None:
    s = state(first_delay=0.25)
    assert feed(s, MemorySampled(0.0, 800)) == [
        Trim(),  # idle, nothing to spill: give memory back first
        Spill(800 - 540),
        Log("info", "throttled", (("rss", 800),)),
        ReportMemory(),
    ]
    p = task("p", producer=True)
    c = task("c")
    assert feed(s, TasksAssigned(1.0, (p, c))) == [StartTimer(1.25), Submit(c)]
    # The timer fires while memory is still high: deferred again, twice as long.
    assert feed(s, TimerFired(1.25)) == [StartTimer(1.75)]
    # Memory fell: the producer goes at once, without waiting for its timer.
    assert feed(s, MemorySampled(1.5, 100)) == [
        Log("info", "unthrottled", (("rss", 100),)),
        ReportMemory(),
        Submit(p),
    ]


def test_an_idle_worker_over_the_resume_mark_holding_only_spilled_outputs_trims() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("x"),)))
    finish(s, "x")
    assert Trim() not in feed(s, MemorySampled(0.5, 650))  # x in memory: spilling acts
    feed(s, Spilled(0.6, ("x",)))
    assert feed(s, MemorySampled(0.7, 650)) == [Trim(), Spill(650 - 540, frozenset())]
    feed(s, TasksAssigned(20.0, (task("a"),)))  # a task runs: not idle
    assert Trim() not in feed(s, MemorySampled(20.1, 650))


def test_an_idle_floor_past_the_resume_mark_is_a_warning_and_the_worker_resumes() -> None:
    s = state()  # resume at 600, throttle at 700; margin 50
    feed(s, TasksAssigned(0.0, (task("c"),)))
    assert Trim() not in feed(s, MemorySampled(0.1, 800))  # a task runs: throttled
    feed(s, TasksAssigned(0.2, (task("p", producer=True),)))
    assert s.deferred
    finish(s, "c")
    feed(s, Spilled(0.3, ("c",)))  # idle: nothing runs, nothing in memory
    assert feed(s, MemorySampled(1.0, 650))[0] == Trim()
    said = floor_warning(640, 600, 700, LIMIT, execution="thread", at_start=False)
    assert feed(s, MemorySampled(1.05, 640)) == [
        Log("warning", FLOOR_EVENT, (("floor", 640), ("resume", 690), ("throttle", 740),
                                     ("warning", said))),
        ReportMemory(),
        Spill(640 - 540),
        Log("info", "unthrottled", (("rss", 640),)),
        ReportMemory(),
        Submit(task("p", producer=True)),
    ]  # fmt: skip


def floor_said(execution: str, floor: int) -> str:
    """The warning a 400 MiB worker of ``execution`` logs when, idle after a task and
    holding nothing in memory, its floor is ``floor`` (resume 240 MiB, throttle 280 MiB)."""
    cfg = MemoryConfig.of(400 * MB, {"execution": execution})
    s = WorkerState("w", 1, cfg, killable=execution == "process")
    feed(s, TasksAssigned(0.0, (task("c"),)))
    finish(s, "c")
    feed(s, Spilled(0.3, ("c",)))  # idle: nothing runs, nothing in memory
    assert Trim() in feed(s, MemorySampled(1.0, floor + MB))
    (said,) = [
        c
        for c in feed(s, MemorySampled(1.05, floor))
        if isinstance(c, Log) and c.event == FLOOR_EVENT
    ]
    return str(dict(said.fields)["warning"])


#: how a floor past its resume mark begins: the floor, and what it is made of
FLOOR = (
    "memory that is not outputs is {} (the worker's floor: its RSS holding no output in "
    "memory and running no task: libraries, "
)


def test_a_thread_workers_floor_past_its_limit_is_said_to_be_a_leak_into_globals() -> None:
    """The memory audit: each task of a thread worker appended 15 MiB to a module-level
    list, its floor reached 525.1 MiB over its 400 MiB limit, and the warning blamed the
    libraries and task processes, advising fewer task processes or execution 'thread'
    (which it had). Past the limit on a thread worker it is a leak: it says so, and
    nothing of task processes."""
    assert floor_said("thread", int(525.1 * MB)) == (
        FLOOR.format("525.1 MiB") + "memory the allocator keeps, what its tasks keep in "
        "globals or caches), at or past its limit 400.0 MiB (resume mark 240.0 MiB, "
        "throttle fence 280.0 MiB). Its tasks run in threads of the worker's own process "
        "and libraries alone seldom take a worker past its limit: this is almost surely a "
        "task that keeps data in a module global or a cache (a module-level list it "
        "appends to, a cache without a bound), which stays after the task ends. Free it in "
        "the task or bound the cache, and restart those workers (drain them: the console's "
        "'drain WORKER', or scale the pool in and out); with execution 'process' "
        "(--execution process) a task process whose idle memory creeps up is replaced"
    )
    # Under its limit: what its start warning says (more memory, or a leak if it grows;
    # tests/test_worker_memory.py has its text), still nothing of task processes.
    under = floor_said("thread", 300 * MB)
    assert under == floor_at_start(MemoryConfig(400 * MB), 300 * MB)
    assert "task process" not in under and "almost surely" not in under


def test_a_process_workers_floor_names_its_task_processes() -> None:
    """A process worker's floor holds a copy of the libraries per task process: fewer of
    them, or threads, is the advice, past its limit or not."""
    for floor, size in ((int(525.1 * MB), "525.1 MiB"), (300 * MB, "300.0 MiB")):
        assert floor_said("process", floor) == (
            FLOOR.format(size) + "task processes, memory the allocator keeps), at or past "
            "its resume mark 240.0 MiB (throttle fence 280.0 MiB, limit 400.0 MiB), so "
            "spilling cannot bring it under that mark and outputs have little room; give "
            "workers more memory (--memory, a pool's memory_per_worker); with execution "
            "'process', run fewer task processes (fewer --cores) or execution 'thread' "
            "(each task process holds its own copy of the libraries)"
        )


def test_a_spill_spares_the_inputs_of_running_tasks_and_puts_waiting_ones_last() -> None:
    s = state()
    for key in ("x", "y", "z"):
        feed(s, TasksAssigned(0.0, (task(key),)))
        finish(s, key)
    a = task("a", {"x": ("w",)})
    b = task("b", {"y": ("w",), "x": ("w",)}, producer=True)
    feed(s, TasksAssigned(1.0, (a,)))  # runs: the executor holds x until it ends
    assert feed(s, MemorySampled(1.1, 800))[0] == Spill(800 - 540, frozenset({"x"}))
    feed(s, TasksAssigned(1.2, (b,)))  # throttled: deferred, y will be read soon
    assert s.deferred == {"b": b}
    cmds = feed(s, MemorySampled(1.3, 800))
    assert cmds[0] == Spill(800 - 540, frozenset({"x"}), frozenset({"y"}))


def test_an_output_just_made_is_not_spilled_before_its_consumer_reads_it() -> None:
    # The groupby benchmark's shape: 600 of 1000 (the spill fence) is past by memory
    # that is not outputs (interpreter, pandas, what the allocator keeps); each stage's
    # output (24 here) is read by the next task a moment after it is stored. The old
    # core asked to spill 660 - 540 = 120 at the sample right after the output was
    # stored: the store wrote it (all it had), and the consumer read it back from disk.
    s = state()
    feed(s, TasksAssigned(0.0, (task("part"),)))
    feed(s, TasksFinished(1.0, (ok("part", 24),)))
    assert feed(s, MemorySampled(1.01, 660, stored=24)) == [Spill(24, fresh=frozenset({"part"}))]
    consumer = task("str", {"part": ("w",)})
    assert feed(s, TasksAssigned(1.2, (consumer,))) == [Submit(consumer)]  # from memory
    assert "part" not in s.on_disk
    # Once it is the running task's input it is in use (never spilled) anyway; an output
    # nobody came for in SPILL_GRACE goes to disk as before.
    feed(s, TasksFinished(1.5, (ok("str", 24),)))
    feed(s, DropRequested(1.5, ("part",)))
    assert feed(s, MemorySampled(1.5 + SPILL_GRACE, 660, stored=24)) == [Spill(24)]


def test_a_deferred_producer_can_be_cancelled() -> None:
    s = state()
    feed(s, MemorySampled(0.0, 800))
    feed(s, TasksAssigned(1.0, (task("p", producer=True),)))
    assert feed(s, CancelRequested(1.01, ("p",))) == []
    assert not s.governor.deferred and not s.active


def test_a_task_with_spilled_inputs_waits_for_a_free_thread() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("x"),)))
    finish(s, "x")
    feed(s, Spilled(0.5, ("x",)))
    a, b = task("a"), task("b", {"x": ("w",)})
    assert feed(s, TasksAssigned(1.0, (a, b))) == [Submit(a)]  # b queued, x stays on disk
    assert s.queued == {"b": b}
    assert finish(s, "a")[-2:] == [Submit(b), Sample()]


def test_past_the_terminate_fence_the_largest_task_process_is_killed() -> None:
    """Its try is reported with the worker's RSS and its own process's (``own_rss``:
    what the scheduler weighs for a retry on a worker as large, the memprio audit's
    defect 5)."""
    s = state(nthreads=2, killable=True)
    feed(s, TasksAssigned(0.0, (task("a"), task("b"))))
    out = feed(s, MemorySampled(1.0, 960, (("a", 300), ("b", 500))))
    assert out[-1] == Kill("b", 960)
    oom = TaskResult("b", "oom", 1.0, 2.0, 0, 123)
    assert feed(s, TasksFinished(2.0, ((oom, None),)))[0] == ReportDone(
        (TaskResult("b", "oom", 1.0, 2.0, 0, 960, rss_peak=960, own_rss=500),)
    )


def test_a_killed_try_reports_the_highest_rss_from_its_kill_until_it_ends() -> None:
    """The user audit's D6 asked for the error's peak to include the RSS at the kill
    (it did: 'peak 0.47 GiB' for the kill at 502857728); a sample taken after the kill
    while the task process still ran, higher still, counts too, for the worker and for
    the task's own process."""
    s = state(killable=True, spill=None)
    feed(s, TasksAssigned(0.0, (task("b"),)))
    assert feed(s, MemorySampled(1.0, 960, (("b", 500),)))[-1] == Kill("b", 960)
    assert feed(s, MemorySampled(1.05, 990, (("b", 520),))) == []  # not gone yet: no kill
    feed(s, MemorySampled(1.1, 400))  # gone: lower samples change nothing
    oom = TaskResult("b", "oom", 1.0, 2.0, 0, 123)
    assert feed(s, TasksFinished(2.0, ((oom, None),)))[0] == ReportDone(
        (TaskResult("b", "oom", 1.0, 2.0, 0, 990, rss_peak=990, own_rss=520),)
    )


def test_a_task_process_that_did_not_grow_is_spared_and_said_once_per_climb() -> None:
    """Past the terminate fence with no running task's process grown since its task
    began (a dask ``barrier`` beside the worker process's own memory, a user audit),
    nothing is killed: the worker says so once, and again only after memory was back
    under the throttle fence; a task that grew is killed as before."""
    s = state(nthreads=2, killable=True, spill=None)
    feed(s, TasksAssigned(0.0, (task("a"), task("b"))))
    tasks, began = (("a", 300), ("b", 200)), (("a", 290), ("b", 195))
    spared = Log("warning", SPARED_EVENT, (("rss", 960), ("limit", LIMIT), ("grown", 10)))
    assert feed(s, MemorySampled(1.0, 960, tasks, began=began))[-1] == spared
    out = feed(s, MemorySampled(1.1, 960, tasks, began=began))
    assert not [c for c in out if isinstance(c, Log | Kill)]
    feed(s, MemorySampled(1.2, 650, tasks, began=began))  # back under the throttle fence
    assert feed(s, MemorySampled(1.3, 960, tasks, began=began))[-1] == spared
    grew = (("a", 300), ("b", 400))
    assert feed(s, MemorySampled(1.4, 970, grew, began=began))[-1] == Kill("b", 970)


def test_threads_past_the_terminate_fence_are_logged_once_at_info() -> None:
    """The scheduler warns of the crossing (its report's ``past_peak``) with the peak,
    the tasks and what to do; the worker's own line of it is at info."""
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    first = feed(s, MemorySampled(1.0, 960))
    assert Log("info", PAST_FENCE_IN_THREADS, (("rss", 960), ("limit", LIMIT))) in first
    assert not [c for c in first if isinstance(c, Log) and c.level == "warning"]
    assert not [c for c in feed(s, MemorySampled(1.1, 970)) if isinstance(c, Log)]


def test_threads_past_the_terminate_fence_are_logged_by_the_schedulers_rule() -> None:
    """A user audit's median printed about 30 long WARNING lines: each crossing twice,
    the worker's line at every climb from under the throttle fence, the scheduler's at
    the first report and at each doubling of the excess over the limit. The worker
    logs at info, and by that same rule (``actors.protocol.past_limit_logged``): a climb
    again from under the throttle fence to no higher peak is not logged, nor is a peak
    whose excess did not double; the scheduler is told each 5% step as before."""
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    peaks = []

    def logged(t: float, rss: int) -> int:
        out = feed(s, MemorySampled(t, rss))
        if not peaks or s.past_peak != peaks[-1]:
            peaks.append(s.past_peak)
        return len([c for c in out if isinstance(c, Log) and c.event == PAST_FENCE_IN_THREADS])

    samples = [(1.0, 960), (1.1, 940), (1.2, 970), (1.3, 800), (1.4, 955), (1.5, 699)]
    assert [logged(t, rss) for t, rss in samples] == [1, 0, 0, 0, 0, 0]
    assert logged(1.6, 951) == 0  # climbed again from under the throttle fence
    assert logged(1.7, 1050) == 0  # reported, 5% higher; the excess not doubled
    assert logged(1.8, 1090) == 0  # under 5% higher than the last report
    assert logged(1.9, 1100) == 1  # 100 over: twice the 5% step
    assert logged(2.0, 1150) == 0
    assert logged(2.1, 1200) == 1  # 200 over: twice 100
    assert peaks == [960, 1050, 1100, 1150, 1200]  # each reported to the scheduler
    said, logs = 0, []
    for peak in peaks:  # as the scheduler logs them (its WorkerPastLimit.log)
        if past_limit_logged(said, peak, LIMIT):
            said = peak
            logs.append(peak)
    assert logs == [960, 1100, 1200]  # its warnings: the worker's own lines, one for one


def test_a_producer_expects_the_output_its_category_made_here() -> None:
    """The worker's core tells the governor each producer's category and the output it
    left in memory: a released producer then counts its category's output."""
    s = state(spill=None)
    p0, p1, p2 = (task(k, producer=True) for k in ("p0", "p1", "p2"))
    assert feed(s, TasksAssigned(0.0, (p0,))) == [Submit(p0)]
    finish(s, "p0", nbytes=300)
    assert s.governor.outputs == {"cat": 300}
    feed(s, MemorySampled(0.5, 100))
    assert feed(s, TasksAssigned(1.0, (p1, p2)))[0] == Submit(p1)  # 100 + 300 + 300
    assert s.governor.producing == {"p1": 300} and set(s.deferred) == {"p2"}
    finish(s, "p1", nbytes=350)
    assert s.governor.outputs == {"cat": 350} and not s.governor.producing
    assert Submit(p2) in feed(s, MemorySampled(1.5, 300))  # 300 + 350 < 700


def test_rss_sampled_while_a_thread_task_runs_is_its_peak() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)), MemorySampled(0.5, 400, executing=("a",)))
    assert finish(s, "a")[1] == ReportDone((done("a", rss_peak=400),))


def test_rss_sampled_while_no_task_executes_is_no_ones_peak() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)), MemorySampled(0.5, 400))  # not started yet
    assert finish(s, "a")[1] == ReportDone((done("a"),))


def test_a_try_executing_a_while_is_said_to_have_started_once() -> None:
    """The scheduler counts a try's running time (for speculative copies) from its
    start here: each try executing ``STARTED_AFTER`` (0.5 s) or more is told once, a
    short one or one waiting in the executor's queue never."""
    s = state()
    a, b = dataclasses.replace(task("a"), attempt=7), dataclasses.replace(task("b"), attempt=8)
    feed(s, TasksAssigned(0.0, (a, b)))  # b waits behind a (one thread)
    assert feed(s, MemorySampled(0.3, 100, executed=(("a", 0.3),))) == []
    out = feed(s, MemorySampled(0.6, 100, executed=(("a", 0.6),)))
    assert [c for c in out if isinstance(c, ReportStarted)] == [ReportStarted((("a", 7, 0.6),))]
    assert not [c for c in feed(s, MemorySampled(0.7, 100, executed=(("a", 0.7),)))
                if isinstance(c, ReportStarted)]  # fmt: skip
    finish(s, "a")
    out = feed(s, MemorySampled(2.0, 100, executed=(("b", 0.9), ("gone", 5.0))))
    assert [c for c in out if isinstance(c, ReportStarted)] == [ReportStarted((("b", 8, 0.9),))]
    assert s.told_started == {"b": 8}
    finish(s, "b")
    feed(s, MemorySampled(3.0, 100, executed=(("x", 1.0),)))  # not here: nothing told
    assert s.told_started == {}


# ----------------------------------------------------------------------------- timeouts


def timed(key: Key, timeout: float, attempt: int = 1) -> ToRun:
    return dataclasses.replace(task(key), timeout=timeout, attempt=attempt)


def stopped(key: Key, at: float) -> TasksFinished:
    """The executor's report of a try stopped (as a cancel stops one) at ``at``."""
    return TasksFinished(at, ((TaskResult(key, "cancelled", at, at), None),))


def test_a_try_past_its_timeout_is_stopped_and_reported_timeout() -> None:
    """Its time counts from when a sample saw it begin (not from when it was handed
    over); the one timer goes off at the earliest deadline; past it the try is stopped
    as a cancel stops one and reported ``timeout`` with a TaskTimeout."""
    s = state()
    a = timed("a", 2.0, attempt=4)
    # handed over at 10: it cannot end before 12
    assert feed(s, TasksAssigned(10.0, (a,))) == [Submit(a), StartTimer(12.0)]
    # a sample at 10.5 sees it executing for 0.25 s: it began at 10.25, ends at 12.25
    assert feed(s, MemorySampled(10.5, 100, executing=("a",), executed=(("a", 0.25),))) == []
    assert s.deadlines == {"a": 12.25} and s.began == {"a": 10.25}
    assert feed(s, TimerFired(12.0)) == [StartTimer(12.25)]
    assert feed(s, TimerFired(12.25)) == [
        CancelRunning("a"),
        Log("warning", "task timed out", (("key", "a"), ("timeout", 2.0), ("ran", 2.0))),
    ]
    assert feed(s, CancelRequested(12.3, ())) == [] and s.deadlines == {}
    (report, sample) = feed(s, stopped("a", 12.4))
    assert sample == Sample() and isinstance(report, ReportDone)
    (res,) = report.results
    assert (res.key, res.outcome, res.attempt, res.nbytes) == ("a", "timeout", 4, 0)
    assert isinstance(res.error, TaskTimeout)
    assert (res.error.key, res.error.worker, res.error.timeout, res.error.ran) == (
        "a", "w", 2.0, 2.0,
    )  # fmt: skip
    assert "timeout of 2 s" in str(res.error) and "raise its timeout=" in str(res.error)
    assert s.active == () and s.timed_out == {} and s.cancelled == set()


def test_a_timed_out_coroutine_cancelled_on_its_loop_is_reported_stopped() -> None:
    """A thread worker's (not killable) ``async def`` task past its timeout: the
    executor cancelled its coroutine on its event loop (``stopping``), so its
    TaskTimeout says it was stopped, and how; a sync task's try is only given up."""
    for stopping in (True, False):
        s = state()
        feed(s, TasksAssigned(0.0, (timed("a", 1.0),)))
        feed(s, MemorySampled(0.1, 100, executing=("a",), executed=(("a", 0.1),)))
        assert feed(s, TimerFired(1.1))[0] == CancelRunning("a")
        end = TaskResult("a", "cancelled", 1.2, 1.2, stopping=stopping)
        (report, _) = feed(s, TasksFinished(1.2, ((end, None),)))
        (res,) = report.results
        assert res.outcome == "timeout" and isinstance(res.error, TaskTimeout)
        assert (res.error.stopped, res.error.coroutine) == (stopping, stopping)
        text = str(res.error)
        assert ("asyncio.CancelledError raised at the await" in text) is stopping
        assert ("given up there, but not stopped" in text) is not stopping


def test_a_stopped_try_whose_thread_is_held_is_reported_and_its_slot_told_busy() -> None:
    """The executor could not give up the thread of a try stopped at its timeout (as
    many abandoned as the worker has): it reports the try at once all the same, and
    the shell feeds ``ThreadsHeld``; the core tells the scheduler (a memory report,
    ``held``) and counts that thread out, until it is back."""
    s = state()
    feed(s, TasksAssigned(0.0, (timed("a", 1.0),)))
    feed(s, MemorySampled(0.1, 100, executing=("a",), executed=(("a", 0.1),)))
    assert feed(s, TimerFired(1.1))[0] == CancelRunning("a")
    assert feed(s, ThreadsHeld(1.1, 1)) == [ReportMemory()]
    assert (s.threads_held, s.threads) == (1, 0)
    assert feed(s, ThreadsHeld(1.1, 1)) == []  # no change, nothing to tell
    (report, _) = feed(s, stopped("a", 1.1))
    assert [r.outcome for r in report.results] == ["timeout"]
    assert feed(s, ThreadsHeld(9.0, 0)) == [ReportMemory()] and s.threads == 1


def test_a_try_waiting_in_the_executors_queue_is_not_timed_until_it_begins() -> None:
    """Handed over behind another, it waits in the executor's queue: a sample that
    does not show it executing moves its deadline on; at a deadline whose try no
    sample saw begin, a sample is asked for first."""
    s = state()
    a, b = timed("a", 1.0), timed("b", 1.0)
    assert feed(s, TasksAssigned(0.0, (a, b))) == [Submit(a), Submit(b), StartTimer(1.0)]
    feed(s, MemorySampled(0.5, 100, executing=("a",), executed=(("a", 0.5),)))
    assert s.deadlines == {"a": 1.0, "b": 1.5}
    assert feed(s, TimerFired(1.0)) == [
        CancelRunning("a"),
        Log("warning", "task timed out", (("key", "a"), ("timeout", 1.0), ("ran", 1.0))),
        StartTimer(1.5),
    ]
    assert [r.outcome for r in feed(s, stopped("a", 1.0))[0].results] == ["timeout"]
    # b began after the latest sample: at 1.5 the core asks whether it executes
    assert feed(s, TimerFired(1.5)) == [Sample(), StartTimer(2.5)]
    assert feed(s, MemorySampled(1.5, 100, executing=("b",), executed=(("b", 0.25),))) == [
        StartTimer(2.25)
    ]
    out = feed(s, TimerFired(2.25))
    assert out[0] == CancelRunning("b") and s.timed_out == {"b": 1.0}


def test_a_try_that_ends_in_time_or_first_is_reported_as_it_ended() -> None:
    """Ended before its deadline: nothing is stopped (the timer going off later does
    nothing). Ended by itself while being stopped: as it ended. Cancelled by the
    scheduler while being stopped: ``cancelled``, as any cancel."""
    s = state(nthreads=3)
    a, b, c = timed("a", 1.0), timed("b", 1.0), timed("c", 1.0)
    feed(s, TasksAssigned(0.0, (a, b, c)))
    feed(s, MemorySampled(0.1, 100, executing=("a", "b", "c"),
                          executed=(("a", 0.1), ("b", 0.1), ("c", 0.1))))  # fmt: skip
    assert finish(s, "a") == [Store("a", "v", 10), ReportDone((done("a", attempt=1),)), Sample()]
    out = feed(s, TimerFired(1.0))
    assert {c.key for c in out if isinstance(c, CancelRunning)} == {"b", "c"}
    assert feed(s, CancelRequested(1.1, ("c",))) == []  # being stopped already
    ended = ReportDone((done("b", attempt=1, rss_peak=100),))
    assert finish(s, "b")[:2] == [Store("b", "v", 10), ended]
    (report, _) = feed(s, stopped("c", 1.2))
    assert [(r.outcome, r.error) for r in report.results] == [("cancelled", None)]
    assert s.active == () and s.deadlines == s.began == s.timed_out == {}


def test_a_task_without_a_timeout_is_never_timed() -> None:
    s = state()
    assert feed(s, TasksAssigned(0.0, (task("a"),))) == [Submit(task("a"))]
    feed(s, MemorySampled(1e6, 100, executing=("a",), executed=(("a", 1e6),)))
    assert s.deadlines == {} and s.timer is None


# ----------------------------------------------------------------------------- cancel, drop


def test_a_cancelled_running_task_is_reported_cancelled_whatever_it_returned() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    assert feed(s, CancelRequested(1.0, ("a",))) == [CancelRunning("a")]
    assert feed(s, CancelRequested(1.0, ("a",))) == []  # asked once
    assert finish(s, "a") == [
        ReportDone((TaskResult("a", "cancelled", 1.0, 2.0, 0, 100, rss_before=90),)),
        Sample(),
    ]
    assert s.held == {}


def test_a_task_sent_again_before_its_cancelled_try_is_back_runs_after_it() -> None:
    """One try of a key at a time: the newer starts once the cancelled one is back, and
    each report names its own try (``attempt``)."""
    s = state(nthreads=2)
    first = ToRun("a", Task("a", noop), "cat", (), attempt=1)
    again = ToRun("a", Task("a", noop), "cat", (), attempt=2)
    feed(s, TasksAssigned(0.0, (first,)))
    assert feed(s, CancelRequested(1.0, ("a",))) == [CancelRunning("a")]
    assert feed(s, TasksAssigned(1.5, (again,))) == []
    assert finish(s, "a") == [
        Submit(again),
        ReportDone((TaskResult("a", "cancelled", 1.0, 2.0, 0, 100, rss_before=90, attempt=1),)),
        Sample(),
    ]
    assert finish(s, "a") == [Store("a", "v", 10), ReportDone((done("a", attempt=2),)), Sample()]


def test_a_task_sent_again_then_cancelled_again_never_starts() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (ToRun("a", Task("a", noop), "cat", (), attempt=1),)))
    feed(s, CancelRequested(1.0, ("a",)))
    feed(s, TasksAssigned(1.5, (ToRun("a", Task("a", noop), "cat", (), attempt=2),)))
    assert feed(s, CancelRequested(2.0, ("a",))) == []  # the newer had not started
    cmds = finish(s, "a")
    assert [type(c) for c in cmds] == [ReportDone, Sample]
    assert cmds[0].results[0].attempt == 1 and s.active == ()


def test_a_task_sent_twice_reports_its_newest_attempt() -> None:
    """A rejoin may send a task the worker runs already: its report is the newest's."""
    s = state()
    feed(s, TasksAssigned(0.0, (ToRun("a", Task("a", noop), "cat", (), attempt=1),)))
    assert feed(s, TasksAssigned(1.0, (ToRun("a", Task("a", noop), "cat", (), attempt=3),))) == []
    assert finish(s, "a")[1] == ReportDone((done("a", attempt=3),))


def test_dropped_outputs_are_forgotten() -> None:
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    finish(s, "a")
    feed(s, Spilled(1.0, ("a",)))
    assert feed(s, DropRequested(2.0, ("a", "other"))) == [Forget(("a", "other"))]
    assert s.held == {} and s.on_disk == set()


def test_a_stale_output_dropped_while_its_reader_waits_here_is_kept_for_it() -> None:
    """The audit's hang (docs/files.md, Speculative copies): ``c``'s try here ends ok
    as its speculative copy elsewhere wins. The scheduler cancels this try, sends ``s``
    (which reads ``c`` and ``x``) here, then gets this try's ok and drops its output as
    junk, while ``s`` still fetches ``x``. ``s`` must start with ``c``, not without it
    (the shell's read of ``c`` failed, and ``s`` waited for ever)."""
    s = state()
    c = ToRun("c", Task("c", noop), "cat", (), attempt=1)
    feed(s, TasksAssigned(0.0, (c,)))
    finish(s, "c")  # ok, before the cancel came
    assert feed(s, CancelRequested(1.0, ("c",))) == []  # its try is back: nothing to stop
    reader = task("s", {"c": ("p1",), "x": ("p2",)})
    assert feed(s, TasksAssigned(1.0, (reader,))) == [Fetch(1, "p2", ("x",))]  # c is here
    assert feed(s, DropRequested(1.1, ("c",))) == []  # s reads it: kept
    assert s.held == {"c": 10}
    assert feed(s, InputsFetched(1.5, 1, (("x", "vx", 5),))) == [
        Store("x", "vx", 5),
        Submit(reader),
    ]
    cmds = finish(s, "s")
    # Its report names both copies: the scheduler learns c is held here after all.
    assert cmds[1] == ReportDone((done("s", fetched=("c", "x"), fetches=(("x", "p2", 5, 0.5),)),))


def test_a_dropped_output_a_queued_task_reads_is_kept_until_it_runs() -> None:
    """Deferred and queued tasks too start with every input held."""
    s = state()
    feed(s, TasksAssigned(0.0, (task("a"),)))
    finish(s, "a")
    feed(s, Spilled(0.5, ("a",)))
    feed(s, TasksAssigned(1.0, (task("busy"),)))
    reader = task("r", {"a": ("w",)})
    assert feed(s, TasksAssigned(1.0, (reader,))) == []  # queued: its input is on disk
    assert feed(s, DropRequested(1.1, ("a", "other"))) == [Forget(("other",))]
    assert finish(s, "busy")[2] == Submit(reader)
    assert s.held["a"] == 10


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot handle Event"):
        state().handle(Event(0.0))


# ----------------------------------------------------------------------------- machine

PEERS = ("p1", "p2", "p3")


class WorkerMachine(RuleBasedStateMachine):
    """Random traffic against one worker core; every task handed over must be reported
    exactly once (or be cancelled before it ran), and only with its inputs held."""

    def __init__(self) -> None:
        super().__init__()
        self.s = WorkerState("w", 2, MemoryConfig.of(LIMIT), killable=True)
        self.now = 0.0
        self.n = 0
        self.assigned: set[Key] = set()
        self.reported: Counter[Key] = Counter()
        self.cancelled: set[Key] = set()
        self.values: dict[Key, Any] = {}
        self.copy_requests: set[int] = set()
        self.copies_done: Counter[int] = Counter()

    def step(self, *events: Event) -> list[Command]:
        out = self.s.handle(*events)
        self.s.validate()
        for cmd in out:
            if isinstance(cmd, ReportDone):
                for res in cmd.results:
                    assert res.key in self.assigned, f"{res.key!r} reported, never assigned"
                    self.reported[res.key] += 1
                    assert self.reported[res.key] == 1, f"{res.key!r} reported twice"
            elif isinstance(cmd, Submit):
                for dk, _ in cmd.task.deps:
                    assert dk in self.s.held, f"{cmd.task.key!r} submitted without {dk!r}"
            elif isinstance(cmd, Fetch):
                for k in cmd.keys:
                    assert k not in self.s.held, f"{k!r} fetched though held"
            elif isinstance(cmd, Store):
                self.values[cmd.key] = cmd.value
            elif isinstance(cmd, CopiesDone):
                assert cmd.request in self.copy_requests, f"unknown copy request {cmd.request}"
                self.copies_done[cmd.request] += 1
                assert self.copies_done[cmd.request] == 1, f"{cmd.request} settled twice"
                for k in cmd.got:
                    assert k in self.s.held, f"copy {k!r} reported, not held"
        return out

    def tick(self) -> float:
        self.now += 0.01
        return self.now

    @rule(
        data=st.data(),
        n=st.integers(1, 3),
    )
    def assign(self, data: st.DataObject, n: int) -> None:
        tasks = []
        held = sorted(self.s.held, key=str)
        for _ in range(n):
            self.n += 1
            key = f"t{self.n}"
            deps: dict[Key, tuple[str, ...]] = {}
            for _ in range(data.draw(st.integers(0, 3))):
                local: bool = data.draw(st.booleans())
                if held and local:
                    deps[data.draw(st.sampled_from(held))] = ("w",)
                else:
                    r = f"r{data.draw(st.integers(0, 5))}"
                    deps[r] = tuple(data.draw(st.lists(st.sampled_from(PEERS), unique=True)))
            producer = data.draw(st.booleans())
            sizes = tuple(data.draw(st.sampled_from([1, 2 * MB])) for _ in deps)
            t = task(key, deps, producer=producer, sizes=sizes)
            timeout = data.draw(st.sampled_from([None, None, 0.02, 0.1]))
            tasks.append(dataclasses.replace(t, timeout=timeout))
            self.assigned.add(key)
        self.step(TasksAssigned(self.tick(), tuple(tasks)))

    @rule(data=st.data())
    def copy(self, data: st.DataObject) -> None:
        self.n += 1
        keys = tuple(
            (f"r{i}", tuple(data.draw(st.lists(st.sampled_from(PEERS), unique=True))), 1)
            for i in sorted(data.draw(st.sets(st.integers(0, 5), max_size=3)))
        )
        self.copy_requests.add(self.n)
        self.step(CopiesRequested(self.tick(), self.n, keys))

    @precondition(lambda self: self.s.in_flight)
    @rule(data=st.data())
    def answer_fetch(self, data: st.DataObject) -> None:
        fid = data.draw(st.sampled_from(sorted(self.s.in_flight)))
        _, keys = self.s.in_flight[fid]
        if data.draw(st.integers(0, 5)) == 0:
            self.step(InputsFetched(self.tick(), fid, failed="gone"))
            return
        got, missing, refused = [], [], []
        for k in keys:
            fate = data.draw(st.sampled_from(["got", "got", "got", "missing", "refused"]))
            if fate == "got":
                got.append((k, f"value of {k}", data.draw(st.sampled_from([1, 2 * MB]))))
            elif fate == "missing":
                missing.append(k)
            else:
                refused.append((k, ValueTooLarge(str(k), 2000, LIMIT, "worker 'w'")))
        self.step(InputsFetched(self.tick(), fid, tuple(got), tuple(missing), tuple(refused)))

    @precondition(lambda self: self.s.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.s.running, key=str)))
        fate = data.draw(st.integers(0, 4))
        if key in self.s.cancelled and fate >= 2:  # stopped (cancelled, or timed out)
            res, value = TaskResult(key, "cancelled", 1.0, 2.0), None
        elif fate:
            res, value = TaskResult(key, "ok", 1.0, 2.0, 10, 100), "v"
        else:
            res, value = TaskResult(key, "oom", 1.0, 2.0, 0, 100), None
        self.step(TasksFinished(self.tick(), ((res, value),)))

    @rule(rss=st.integers(0, LIMIT), data=st.data())
    def sample(self, rss: int, data: st.DataObject) -> None:
        running = sorted(self.s.running, key=str)
        tasks = tuple((k, rss // 2) for k in running)
        # Some of them executing in threads (the rest waiting in the executor's queue),
        # and a key whose try came back meanwhile.
        executing = tuple(data.draw(st.lists(st.sampled_from([*running, "gone"]), unique=True)))
        executed = tuple((k, data.draw(st.sampled_from([0.0, 0.01, 0.05]))) for k in executing)
        self.step(MemorySampled(self.tick(), rss, tasks, executing, executed))

    @precondition(lambda self: self.s.timer is not None)
    @rule()
    def timer(self) -> None:
        assert self.s.timer is not None
        self.now = max(self.now, self.s.timer)
        self.step(TimerFired(self.now))

    @precondition(lambda self: self.s.active)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.s.active, key=str)))
        if key not in self.s.running:
            self.cancelled.add(key)  # never ran: no report owed
        self.step(CancelRequested(self.tick(), (key,)))

    @precondition(lambda self: self.s.held)
    @rule(data=st.data())
    def spill_or_drop(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.s.held, key=str)))
        # A drop may name an input of a task here (the scheduler's junk: a cancelled
        # try's output), which the worker keeps for that task (validate checks).
        if data.draw(st.booleans()):
            self.step(Spilled(self.tick(), (key,)))
        else:
            self.step(DropRequested(self.tick(), (key,)))

    @invariant()
    def every_task_is_somewhere(self) -> None:
        active = set(self.s.active)
        for key in self.assigned:
            places = (key in active) + (self.reported[key] == 1) + (key in self.cancelled)
            assert places == 1, f"{key!r}: active {key in active}, {self.reported[key]} reports"

    def teardown(self) -> None:
        """Let everything finish: fetches succeed, memory is low, tasks end ok."""
        for _ in range(1000):
            s = self.s
            if not s.active and not s.copies:
                break
            if s.in_flight:
                fid = min(s.in_flight)
                _, keys = s.in_flight[fid]
                self.step(InputsFetched(self.tick(), fid, tuple((k, k, 1) for k in keys)))
            elif s.running:
                key = next(iter(s.running))
                self.step(TasksFinished(self.tick(), ((TaskResult(key, "ok", 1.0, 2.0), 1),)))
            else:
                self.step(MemorySampled(self.tick(), 0))
        assert not self.s.active, f"stuck: {self.s.active}"
        assert set(self.copies_done) == self.copy_requests, "a copy request never settled"


def test_worker_state_machine() -> None:
    run_state_machine_as_test(
        WorkerMachine,
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_no_floor_is_measured_while_a_spill_writes_or_an_input_comes() -> None:
    """The chaos audit's D2: an output dropped while its spill file was written left
    the worker holding nothing, and the RSS the write still held (the value) was taken
    for its floor, a warning to buy memory and marks moved up; so were the bytes of an
    input on its way from a peer. Such a sample is not idle: no trim, no floor."""
    s = state()
    feed(s, TasksAssigned(0.0, (task("x"),)))
    finish(s, "x", nbytes=500)
    feed(s, DropRequested(0.5, ("x",)))  # while a spill writes it
    assert Trim() not in feed(s, MemorySampled(0.6, 650, spilling=True))
    assert Trim() not in feed(s, MemorySampled(3.0, 650, spilling=True))
    assert feed(s, MemorySampled(3.1, 650))[0] == Trim()  # written: idle again
    s = state()
    assert feed(s, TasksAssigned(0.0, (task("t", {"y": ("p1",)}),))) == [Fetch(1, "p1", ("y",))]
    assert Trim() not in feed(s, MemorySampled(0.6, 650))  # y comes: not idle
    assert Trim() not in feed(s, MemorySampled(3.0, 650))
    # A user audit: a 1.5 GB output spilled while the client gathered it from memory;
    # the stream's views kept it there, and its RSS was taken for a floor of 1.56 GiB.
    s = state()
    feed(s, TasksAssigned(0.0, (task("x"),)))
    finish(s, "x", nbytes=500)
    feed(s, Spilled(0.5, ("x",)))  # on disk now, its stream still reading it from memory
    assert Trim() not in feed(s, MemorySampled(0.6, 650, serving=True))
    assert Trim() not in feed(s, MemorySampled(3.0, 650, serving=True))
    assert feed(s, MemorySampled(3.1, 650))[0] == Trim()  # read: idle again


# ----------------------------------------------------------------------------- exit


def test_a_thread_worker_past_its_exit_mark_charges_the_task_that_grew_and_stops() -> None:
    """A user audit's memory hog grew a thread worker to 14.7 GB against its 1 GiB
    limit: a thread cannot be killed. With the ``exit`` option a worker process stops
    itself there, as dask's nanny restarts a worker: the executing task whose RSS rose
    most since the sample before the first that saw it execute ends ``oom`` (the
    scheduler's retry rules
    and ``TaskOutOfMemory`` follow), the others are lost with the worker, and nothing
    is taken or told after."""
    s = state(nthreads=2, exit=1.5, exits=True)
    a, b = task("a"), task("b")
    assert feed(s, TasksAssigned(0.0, (a, b))) == [Submit(a), Submit(b)]
    feed(s, MemorySampled(0.1, 300, executing=("a",), executed=(("a", 0.1),)))
    feed(s, MemorySampled(0.15, 800, executing=("a",), executed=(("a", 0.15),)))  # a grew
    feed(s, MemorySampled(0.2, 900, executing=("a", "b"), executed=(("a", 0.2), ("b", 0.1))))
    # past the limit (1000) and the terminate fence, under the exit mark (1500): runs on
    out = feed(s, MemorySampled(0.3, 1400, executing=("a", "b"), executed=(("a", 0.3), ("b", 0.2))))
    assert not [c for c in out if isinstance(c, Exit | ReportDone)] and not s.exiting
    sample = MemorySampled(0.5, 1600, executing=("a", "b"), executed=(("a", 0.5), ("b", 0.4)))
    out = feed(s, sample)
    charged = TaskResult("a", "oom", 0.0, 0.5, rss=1600, rss_before=300, rss_peak=1600)
    assert out[-2:] == [ReportDone((charged,)), Exit("a", 1600)]  # a rose 1300, b 800
    assert out[-3] == Log("error", EXIT_EVENT, (("key", "a"), ("rss", 1600), ("exit_at", 1500),
                         ("limit", LIMIT), ("rise", 1300), ("lost", 1)))  # fmt: skip
    assert s.exiting
    assert feed(s, TasksFinished(0.6, (ok("a"), ok("b")))) == []  # stopping: nothing more
    assert feed(s, TasksAssigned(0.7, (task("c"),))) == []


def test_no_worker_stops_itself_without_the_option_a_process_of_its_own_or_a_task() -> None:
    """Without ``exit`` a thread worker runs past its limit, as before; an in-process
    worker (``exits`` False) never ends its program; in ``process`` execution the
    terminate fence kills the task instead; and memory with no task executing (outputs,
    copies) is not a task's to be charged with."""
    past = MemorySampled(0.5, 1600, executing=("a",), executed=(("a", 0.5),))
    for s in (state(exits=True), state(exit=1.5), state(exit=1.5, exits=True, killable=True)):
        feed(s, TasksAssigned(0.0, (task("a"),)))
        feed(s, MemorySampled(0.1, 300, executing=("a",), executed=(("a", 0.1),)))
        out = feed(s, past)
        assert not [c for c in out if isinstance(c, Exit)] and not s.exiting
    s = state(exit=1.5, exits=True)
    feed(s, TasksAssigned(0.0, (task("a"),)))
    assert not [c for c in feed(s, MemorySampled(0.5, 1600)) if isinstance(c, Exit)]
    with pytest.raises(MemoryConfigError, match=r"exit must be above terminate \(0.95\)"):
        MemoryConfig.of(LIMIT, {"exit": 0.9})
    assert MemoryConfig.of(LIMIT, {"exit": 2.0}).exit_at == 2 * LIMIT


def test_a_worker_past_its_exit_mark_by_memory_no_task_grew_does_not_stop() -> None:
    """Past the exit mark with memory that is no executing task's (a value a stream
    serves after its spill: the user audit's 1.5 GB output read from a 1 GiB worker,
    whose RSS was 1.56 GiB, past an exit mark of 1.5 GiB), a task that starts there and
    grows by less than the governor's margin is not charged, and the worker does not
    stop (it charged that task, alone: retried only on a larger worker, and lost its
    outputs). A task that allocates past the mark before any sample saw it execute is
    charged with what it allocated since the sample before."""
    s = state(exit=1.5, exits=True)
    feed(s, TasksAssigned(0.0, (task("x"),)))
    finish(s, "x", nbytes=1500)
    feed(s, Spilled(0.5, ("x",)), MemorySampled(0.6, 1560, serving=True))
    feed(s, TasksAssigned(0.7, (task("a"),)))
    for t, rss in ((0.8, 1570), (0.9, 1580)):
        out = feed(s, MemorySampled(t, rss, executing=("a",), executed=(("a", t - 0.7),),
                                    serving=True))  # fmt: skip
        assert not [c for c in out if isinstance(c, Exit | ReportDone)] and not s.exiting
    s = state(exit=1.5, exits=True)
    feed(s, TasksAssigned(0.0, (task("hog"),)), MemorySampled(0.05, 300))
    out = feed(s, MemorySampled(0.1, 1600, executing=("hog",), executed=(("hog", 0.05),)))
    assert out[-1] == Exit("hog", 1600)
    (done,) = [c for c in out if isinstance(c, ReportDone)]
    assert done.results[0].outcome == "oom" and done.results[0].rss_before == 300


def test_an_exit_mark_that_is_not_finite_is_refused() -> None:
    """``exit = inf`` (TOML's, or JSON's Infinity on --memory-options) passed every check
    and made each worker's core fail at its first memory sample (OverflowError: the
    mark in bytes), its tasks run elsewhere and its worker gone."""
    with pytest.raises(
        MemoryConfigError, match=r"exit must be above terminate \(0.95\) and finite"
    ):
        MemoryConfig.of(LIMIT, {"exit": math.inf})


def test_a_hog_started_beside_a_running_task_is_the_one_charged_at_the_exit_mark() -> None:
    """Measured on a 256 MiB worker of 2 threads with exit 1.5: a task sleeping 20 s,
    then a hog started beside it. The sleeper's rise since it began counted the hog's
    growth and the RSS noise of the second it ran alone, so it was charged (``oom``,
    retried only where it fits) and the hog was retried free. Of the tasks that rose
    within the governor's margin of the most, the newest is charged: the growth began
    when it began. One that rose well past the others is charged however old."""
    s = state(nthreads=2, exit=1.5, exits=True)
    feed(s, TasksAssigned(0.0, (task("sleeper"), task("hog"))))
    feed(s, MemorySampled(0.1, 300, executing=("sleeper",), executed=(("sleeper", 0.1),)))
    feed(s, MemorySampled(0.2, 302, executing=("sleeper",), executed=(("sleeper", 0.2),)))
    both = ("sleeper", "hog")
    feed(s, MemorySampled(0.3, 340, executing=both, executed=(("sleeper", 0.3), ("hog", 0.05))))
    out = feed(s, MemorySampled(0.9, 1600, executing=both,
                                executed=(("sleeper", 0.9), ("hog", 0.65))))  # fmt: skip
    assert out[-1] == Exit("hog", 1600)
    (done,) = [c for c in out if isinstance(c, ReportDone)]
    assert [(r.key, r.outcome, r.rss_before) for r in done.results] == [("hog", "oom", 302)]
