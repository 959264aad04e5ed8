"""Disk-aware placement in the scheduler core (actors/scheduler_disk.py) and the
``consumers-first`` priority (policies/priority.py). Pure-core tests: events in, exact
commands and states out (the ``make_state`` fixture validates every state at the end).

The rule (docs/files.md, "Disks"): a worker that advertises a disk gets a task only if
its free disk (limit, less what it reported on disk, less what the core reserved for
the tasks it sent there and that have not finished) holds the inputs the task must fetch
there plus its expected output: what a try of this very task wrote that did not fit, or
a declared ``resources={"disk": ...}``, else the largest of its category's latest outputs,
else a guess. A task that only lacks disk waits, saying so in its story; one no worker
could ever hold fails with TaskTooBigForDisk; a try whose output did not fit anyway ends
``disk-full`` and is retried where it fits. (What estimates may and may not decide:
tests/test_disk_estimates.py.)
"""

from __future__ import annotations

from typing import Any

from actors.protocol import TaskResult
from actors.scheduler_events import (
    Execute,
    KeyErred,
    TasksFinished,
    Tick,
    WorkerDraining,
    WorkerJoined,
    WorkerMemory,
)
from actors.scheduler_state import (
    DECLARED_OUTPUT,
    GUESSED_OUTPUT,
    MEASURED_AT_LEAST,
    MEASURED_OUTPUT,
    MEMORY_OUTPUT,
    SEEN_OUTPUT,
    SchedulerState,
)
from runtime.errors import DiskFull, TaskTooBigForDisk
from tests.helpers import (
    MB,
    Factory,
    assigned,
    event,
    finish,
    make_state,
    of,
    on,
    run,
    submit,
)

__all__ = ["make_state"]  # the fixture, used by name


def join(s: SchedulerState, worker: str, disk: int, cores: int = 1, **kw: Any) -> list[Any]:
    return run(s, event(WorkerJoined, worker=worker, cores=cores, memory=0, disk=disk, **kw))


def disk_used(s: SchedulerState, worker: str, used: int) -> list[Any]:
    """``worker``'s memory report, saying it holds ``used`` bytes on disk."""
    ev = event(
        WorkerMemory, worker=worker, throttled=False, rss=0, throttle_at=0, limit=0,
        disk_used=used,
    )  # fmt: skip
    return run(s, ev)


def disk(nbytes: int) -> dict[str, Any]:
    """Spec changes declaring an output of ``nbytes``."""
    return {"resources": {"disk": float(nbytes)}}


def worker_of_key(s: SchedulerState, key: str) -> str:
    worker = s.tasks[key].worker
    assert worker is not None, (key, s.tasks[key].state)
    return worker


def tick(s: SchedulerState, now: float) -> list[Any]:
    return run(s, Tick(stimulus_id=f"tick-{now}", now=now))


def waits_for_disk(s: SchedulerState, key: str) -> list[str]:
    return [e[2] for e in s.story(key) if str(e[2]).startswith("waiting for disk")]


# ----------------------------------------------------------------------------- placement


def test_a_nearly_full_disk_gets_no_task_that_would_overflow_it(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "full", disk=100 * MB)
    join(s, "roomy", disk=100 * MB)
    disk_used(s, "full", 95 * MB)  # 5 MiB left
    table: dict[str, list[str]] = {f"out-{i}": [] for i in range(4)}
    cmds = submit(s, table, list(table), attrs={k: disk(10 * MB) for k in table})
    # One goes to the worker with room; the others wait for it, never to "full".
    assert list(assigned(cmds)) == ["roomy"]
    assert not on(s, "full")
    waiting = [k for k in table if s.tasks[k].state == "queued"]
    assert len(waiting) == 3
    for key in waiting:
        assert waits_for_disk(s, key) == [
            "waiting for disk: needs 10485760 B, best worker full has 5242880 B free"
        ]
    # However many finish there, "full" never gets one.
    for _ in range(4):
        (key,) = on(s, "roomy")
        cmds = finish(s, "roomy", key, nbytes=MB)
        assert "full" not in assigned(cmds)
    assert all(s.tasks[k].state == "memory" for k in table)


def test_the_inputs_to_fetch_count_and_the_task_waits_until_room_frees(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", disk=40 * MB)
    join(s, "w2", disk=40 * MB)
    submit(s, {"a": [], "c": ["a"]}, ["c"], attrs={"a": {"pool": "default"}, "c": disk(8 * MB)})
    worker = s.tasks["a"].worker
    assert worker is not None
    other = "w2" if worker == "w1" else "w1"
    run(s, event(WorkerDraining, worker=worker))  # c cannot stay with its input
    disk_used(s, other, 28 * MB)  # 12 MiB free: the 8 MiB output fits, not with the input
    cmds = finish(s, worker, "a", nbytes=8 * MB, file=True)
    assert not of(cmds, Execute)
    assert s.tasks["c"].state == "queued"
    assert waits_for_disk(s, "c") == [
        f"waiting for disk: needs 16777216 B, best worker {other} has 12582912 B free"
    ]
    # The worker frees disk (a spilled output dropped): now both fit, and c runs there.
    cmds = disk_used(s, other, 24 * MB)
    assert assigned(cmds) == {other: ["c"]}
    # What c will take is reserved until it finishes.
    assert s.workers[other].disk_reserved == 16 * MB
    finish(s, other, "c", nbytes=8 * MB)
    assert s.workers[other].disk_reserved == 0


def test_only_what_lands_on_the_disk_counts_a_small_in_memory_output_does_not(
    make_state: Factory,
) -> None:
    """A user audit: a merge waited a full stall_timeout because its worker was 32 B
    short: its four 20 MiB skims (file outputs) to fetch plus its int result, which
    stays in memory. A task's need is the file inputs it must copy to the disk plus its
    output only if its category writes file outputs: a merge whose disk has exactly the
    room for its file inputs runs at once, and an input in memory costs no disk."""
    s = make_state(saturation=1.0)
    skims = {f"skim-{i}": 20 * MB for i in range(4)}
    roots: dict[str, list[str]] = {key: [] for key in [*skims, "count-0"]}
    join(s, "h", disk=0, cores=5)
    submit(s, roots, list(roots))
    for key, nbytes in skims.items():
        finish(s, "h", key, nbytes=nbytes, file=True)
    finish(s, "h", "count-0", nbytes=2 * MB)  # an input in memory
    run(s, event(WorkerDraining, worker="h"))  # serves them; the merges must fetch
    join(s, "v", disk=100 * MB)
    submit(s, {"merge-0": list(skims)}, ["merge-0"])
    finish(s, "v", "merge-0", nbytes=32)  # merges return a small int, in memory
    assert s._expected_output(s.tasks["merge-0"]) == (0, MEMORY_OUTPUT)
    disk_used(s, "v", 20 * MB)  # 80 MiB free: exactly the four skims to fetch
    cmds = submit(s, {**roots, "merge-1": list(roots)}, ["merge-1"])
    assert assigned(cmds) == {"v": ["merge-1"]}
    assert not waits_for_disk(s, "merge-1")
    assert s.tasks["merge-1"].disk_need == 80 * MB
    # A category that writes file outputs counts its largest one as before.
    finish(s, "v", "merge-1", nbytes=32)
    submit(s, {"skim-9": []}, ["skim-9"])
    assert s._expected_output(s.tasks["skim-9"]) == (20 * MB, SEEN_OUTPUT)


def test_what_was_sent_is_reserved_until_it_finishes(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=2.0)  # two slots
    join(s, "w", disk=10 * MB)
    cmds = submit(s, {"x": [], "y": []}, ["x", "y"], attrs={"x": disk(6 * MB), "y": disk(6 * MB)})
    # Both would fit alone; together they would overflow the disk: one waits.
    ((first,),) = assigned(cmds).values()
    second = "y" if first == "x" else "x"
    assert s.tasks[second].state == "queued"
    assert waits_for_disk(s, second) == [
        "waiting for disk: needs 6291456 B, best worker w has 4194304 B free"
    ]
    cmds = finish(s, "w", first, nbytes=MB)
    assert assigned(cmds) == {"w": [second]}


def test_a_declared_size_replaces_the_category_estimate_smaller_or_larger(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w", disk=100 * MB)
    submit(s, {"load-1": []}, ["load-1"], attrs={"load-1": disk(MB)})
    finish(s, "w", "load-1", nbytes=30 * MB, file=True)
    disk_used(s, "w", 75 * MB)  # 25 MiB free: a declared 1 MiB fits, 30 MiB does not
    # Declared smaller than the category's largest output: what the user knows counts.
    cmds = submit(s, {"load-2": []}, ["load-2"], attrs={"load-2": disk(MB)})
    assert s._expected_output(s.tasks["load-2"]) == (MB, DECLARED_OUTPUT)
    assert assigned(cmds) == {"w": ["load-2"]}
    finish(s, "w", "load-2", nbytes=MB)
    table = {"load-3": [], "load-4": []}
    submit(s, table, list(table), attrs={"load-4": disk(40 * MB)})
    assert s._expected_output(s.tasks["load-3"]) == (30 * MB, SEEN_OUTPUT)  # undeclared
    assert s._expected_output(s.tasks["load-4"]) == (40 * MB, DECLARED_OUTPUT)  # larger
    # Both could be held by w's disk: they wait for room.
    assert s.tasks["load-3"].state == s.tasks["load-4"].state == "queued"
    assert waits_for_disk(s, "load-3") == [
        "waiting for disk: needs 31457280 B, best worker w has 26214400 B free"
    ]


def test_a_guess_is_at_most_half_the_largest_disk_and_never_fails_a_task(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", disk=4 * MB)
    cmds = submit(s, {"unknown": []}, ["unknown"])
    # No statistics and nothing declared: a 16 MiB guess would fit nowhere; half the
    # largest disk (2 MiB) fits the empty worker.
    assert s._expected_output(s.tasks["unknown"]) == (2 * MB, GUESSED_OUTPUT)
    assert assigned(cmds) == {"small": ["unknown"]}


def test_workers_without_a_disk_limit_take_anything(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "any", disk=0)
    cmds = submit(s, {"huge": []}, ["huge"], attrs={"huge": disk(10**15)})
    assert assigned(cmds) == {"any": ["huge"]}


# ----------------------------------------------------------------------------- refusal


def test_a_task_no_worker_could_ever_hold_fails_with_the_sizes(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", disk=20 * MB)
    join(s, "w2", disk=30 * MB)
    cmds = submit(s, {"big": [], "after": ["big"]}, ["after"], attrs={"big": disk(50 * MB)})
    assert not of(cmds, Execute)
    (err,) = [c for c in of(cmds, KeyErred) if c.key == "after"]
    assert err.root == "big"
    big = s.tasks["big"]
    assert big.state == "erred"
    assert isinstance(big.error, TaskTooBigForDisk)
    e = big.error
    assert (e.needed, e.largest, e.pool, e.expected) == (50 * MB, 30 * MB, None, 50 * MB)
    assert e.source == 'declared with resources={"disk": ...}'
    text = str(e)
    assert "'big' needs 50.0 MiB of disk" in text and "(30.0 MiB)" in text
    assert "--disk" in text and "resources=" in text


def test_file_inputs_a_worker_holds_count_on_its_disk_when_no_worker_could_hold_them(
    make_state: Factory,
) -> None:
    """Ten 5 MiB file outputs on two 40 MiB disks, then a task reading all ten. Each
    worker holds some of them on its disk, and they stay there while the task waits:
    on either worker the ten need 50 MiB. It fails at once with TaskTooBigForDisk
    saying so, instead of waiting, then going past its estimate to a worker with 20
    MiB free for the 30 MiB it must fetch there (the file inputs it held counted as
    if its disk could be emptied)."""
    s = make_state(unknown_long=False, long_task=float("inf"), saturation=1.0)
    join(s, "wa", disk=40 * MB)
    join(s, "wb", disk=40 * MB)
    cals = {f"cal-{i}": [] for i in range(10)}
    submit(s, {**cals, "stack": list(cals)}, ["stack"], attrs={k: disk(5 * MB) for k in cals})
    used = {"wa": 0, "wb": 0}
    while running := [(w, k) for w in used for k in on(s, w)]:
        for w, key in running:
            used[w] += 5 * MB
            disk_used(s, w, used[w])
            res = TaskResult(key, "ok", 0.0, 1.0, 5 * MB, file=True)
            run(s, event(TasksFinished, worker=w, results=(res,)))
    assert sorted(used.values()) == [20 * MB, 30 * MB]  # the placement of the ten
    stack = s.tasks["stack"]
    assert stack.state == "erred" and not stack.tries
    err = stack.error
    assert isinstance(err, TaskTooBigForDisk)
    # (50 MiB on either: told on the one holding the most, 30 MiB)
    assert (err.needed, err.largest, err.expected, err.held) == (50 * MB, 40 * MB, 0, 30 * MB)
    assert err.source == TaskTooBigForDisk.UNCOUNTED
    assert str(err).startswith(
        "task 'stack' needs 50.0 MiB of disk for its inputs alone (20.0 MiB to fetch there "
        "plus 30.0 MiB of its file inputs already on that worker's disk; its output not "
        "counted"
    )
    assert "split the task so that it reads fewer inputs" in str(err)
    assert not assigned(tick(s, s._now + 60.0))  # the watchdog sends it nowhere


def test_a_busy_worker_with_room_is_waited_for_not_failed(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", disk=5 * MB)
    join(s, "big", disk=50 * MB)
    submit(s, {"first": []}, ["first"], attrs={"first": {**disk(40 * MB)}})
    assert on(s, "big") == {"first"}
    cmds = submit(s, {"second": []}, ["second"], attrs={"second": disk(40 * MB)})
    # "small" is free but can never hold it; "big" can, once its first task is done.
    assert not of(cmds, Execute) and not of(cmds, KeyErred)
    assert s.tasks["second"].state == "queued"
    cmds = finish(s, "big", "first", nbytes=MB)
    assert assigned(cmds) == {"big": ["second"]}


# ----------------------------------------------------------------------------- disk-full


def test_a_disk_full_try_is_recorded_and_retried_where_the_output_fits(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "tight", disk=20 * MB, pool="p")
    submit(s, {"write": []}, ["write"], attrs={"write": disk(MB)})
    assert on(s, "tight") == {"write"}
    join(s, "roomy", disk=200 * MB, pool="p")
    err = DiskFull("write", "tight", 30 * MB, 19 * MB, 20 * MB)
    cmds = finish(s, "tight", "write", outcome="disk-full", nbytes=30 * MB, error=err)
    ts = s.tasks["write"]
    (tried,) = ts.tries
    assert (tried.worker, tried.outcome, tried.cause) == ("tight", "disk-full", "disk-full")
    assert s.failures["write"][("disk-full", "disk-full")] == 1
    stat = s.stats["write"]
    assert (stat.disk_full, stat.max_nbytes, stat.errors) == (1, 30 * MB, 0)
    # Free, and only where 30 MiB fit.
    assert assigned(cmds) == {"roomy": ["write"]}
    assert ts.retries_left == 0 and ts.disk_full_tries == 1


def test_a_disk_full_try_with_nowhere_bigger_fails_with_the_sizes(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "tight", disk=20 * MB)
    submit(s, {"write": []}, ["write"], attrs={"write": disk(MB)})
    err = DiskFull("write", "tight", 30 * MB, 19 * MB, 20 * MB)
    cmds = finish(s, "tight", "write", outcome="disk-full", nbytes=30 * MB, error=err)
    (erred,) = of(cmds, KeyErred)
    assert isinstance(erred.error, TaskTooBigForDisk)
    assert (erred.error.needed, erred.error.largest) == (30 * MB, 20 * MB)
    # What this very task wrote: firm. The error says it ran, in one unit.
    assert erred.error.source == MEASURED_OUTPUT
    assert (erred.error.tries, erred.error.outcome, erred.error.worker) == (1, "disk-full", "tight")
    assert str(erred.error).startswith(
        "task 'write' needs 30.0 MiB of disk (an output of 30.0 MiB, measured: a try of this "
        "task wrote that much and ended disk-full), more than the largest disk of any worker "
        "can hold (20.0 MiB); it ran once and ended disk-full on worker 'tight'; it is not "
        "tried again."
    )


def test_a_try_the_file_system_stopped_measures_at_least_what_it_wrote(
    make_state: Factory,
) -> None:
    """A try that filled the file system (ENOSPC: the worker's DiskFull is ``partial``)
    wrote 20 MiB of a 40 MiB output before it stopped: the task needs at least that,
    and TaskTooBigForDisk says so ("needs at least", "an output of at least"), naming
    where the figure comes from; before, it said the task needs 20 MiB, as if that
    were the output's size. A later try that writes its whole output is exact again."""
    s = make_state(saturation=1.0)
    join(s, "tight", disk=18 * MB)
    submit(s, {"write": []}, ["write"], attrs={"write": disk(MB)})
    err = DiskFull("write", "tight", 20 * MB, 0, 18 * MB, partial=True, filesystem="/s")
    cmds = finish(s, "tight", "write", outcome="disk-full", nbytes=20 * MB + 1, error=err)
    (erred,) = of(cmds, KeyErred)
    e = erred.error
    assert isinstance(e, TaskTooBigForDisk)
    assert (e.needed, e.expected, e.source) == (20 * MB + 1, 20 * MB + 1, MEASURED_AT_LEAST)
    assert str(e).startswith(
        "task 'write' needs at least 20.0 MiB of disk (an output of at least 20.0 MiB, "
        "measured: a try of this task wrote that much before the file system filled and "
        "ended disk-full), more than the largest disk of any worker can hold (18.0 MiB)"
    )
    # The same measure from a whole output (not cut short) is exact; a smaller cut
    # one does not make it a lower bound again.
    t = make_state(saturation=1.0)
    join(t, "w", disk=100 * MB)
    submit(t, {"write": []}, ["write"], attrs={"write": disk(MB)})
    ts = t.tasks["write"]
    for nbytes, partial, expected in (
        (20 * MB, True, (20 * MB, MEASURED_AT_LEAST)),
        (20 * MB, False, (20 * MB, MEASURED_OUTPUT)),
        (10 * MB, True, (20 * MB, MEASURED_OUTPUT)),
    ):
        err = DiskFull("write", "w", nbytes, 0, 100 * MB, partial=partial)
        finish(t, "w", "write", outcome="disk-full", nbytes=nbytes, error=err)
        assert t._expected_output(ts) == expected, (nbytes, partial)


def test_disk_full_tries_are_retried_a_bounded_number_of_times(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w", disk=100 * MB)
    submit(s, {"write": []}, ["write"])
    for n in range(3):
        err = DiskFull("write", "w", 10 * MB, 5 * MB, 100 * MB)
        cmds = finish(s, "w", "write", outcome="disk-full", nbytes=10 * MB, error=err)
        if n < 2:
            assert assigned(cmds) == {"w": ["write"]}
    (erred,) = of(cmds, KeyErred)
    assert erred.error is err  # the worker's own: it names the room it had
    assert "had 5.0 MiB of disk left of its 100.0 MiB limit" in str(err)


# ----------------------------------------------------------------------------- consumers first


def order_run(make_state: Factory, priority: str) -> list[str]:
    """On one single-slot worker: roots ``a`` (5 MiB), ``b`` (1 MiB) and ``r0``..``r2``
    are submitted, ``a`` and ``b`` first (user priority); once ``a`` is done, ``big``
    (reads a) and ``small`` (reads b) come in a second submission. The order in which
    the rest are sent once ``b`` is done."""
    s = make_state(saturation=1.0, priority=priority, placement="least-loaded")
    join(s, "w", disk=0)
    roots = {"a": [], "b": [], "r0": [], "r1": [], "r2": []}
    submit(s, roots, list(roots), attrs={"a": {"priority": 2.0}, "b": {"priority": 1.0}})
    assert on(s, "w") == {"a"}
    finish(s, "w", "a", nbytes=5 * MB)
    submit(s, {"big": ["a"], "small": ["b"]}, ["big", "small"])
    assert on(s, "w") == {"b"}
    finish(s, "w", "b", nbytes=MB)
    sent: list[str] = []
    while running := sorted(on(s, "w")):
        (key,) = running
        sent.append(str(key))
        finish(s, "w", key, nbytes=100)
    return sent


def test_consumers_first_runs_the_largest_consumers_before_roots(make_state: Factory) -> None:
    sent = order_run(make_state, "consumers-first")
    assert sent[:2] == ["big", "small"] and sorted(sent[2:]) == ["r0", "r1", "r2"]
    # The default runs them there too, for another reason: they continue a and b, so
    # they take a's and b's generation and rank by their own graph order among the
    # roots submitted with those (docs/policies.md#priority); before, FIFO between
    # submissions ran the roots first.
    sent = order_run(make_state, "graph")
    assert sent == ["big", "small", "r0", "r1", "r2"]


# ----------------------------------------------------------------------------- locality


def consumer_of_a(make_state: Factory, used_on_holder: int) -> dict[str, list[str]]:
    """``a`` (8 MiB) finishes on ``w1`` (pool ``p1``, which also has ``long`` waiting);
    ``c`` reads it and is declared at 40 MiB. Where ``c`` is sent, when ``w1`` holds
    ``used_on_holder`` bytes on its 100 MiB disk and ``w2`` (pool ``p2``) nothing."""
    s = make_state(saturation=1.0)  # the default placement, which keeps data local
    join(s, "w1", disk=100 * MB, pool="p1")
    join(s, "w2", disk=100 * MB, pool="p2")
    submit(
        s,
        {"a": [], "long": [], "c": ["a"]},
        ["c", "long"],
        attrs={"a": {"pool": "p1", "priority": 1.0}, "long": {"pool": "p1"}, "c": disk(40 * MB)},
    )
    assert on(s, "w1") == {"a"}
    disk_used(s, "w1", used_on_holder)
    return assigned(finish(s, "w1", "a", nbytes=8 * MB))


def test_a_consumer_stays_with_its_data_only_where_its_output_fits(make_state: Factory) -> None:
    # With room, c stays on w1 with its input as soon as a is done (its slot goes to c).
    assert consumer_of_a(make_state, 0) == {"w1": ["c"]}
    # 30 MiB free on w1, less than c's 40: c fetches its input to w2 (8 + 40 MiB fit
    # there), and w1's slot goes to long.
    assert consumer_of_a(make_state, 70 * MB) == {"w1": ["long"], "w2": ["c"]}


def test_a_root_is_not_paired_onto_a_worker_without_the_disk(make_state: Factory) -> None:
    table = {"x-0": [], "x-1": [], "both": ["x-0", "x-1"]}
    attrs = {"x-0": disk(40 * MB), "x-1": disk(40 * MB)}
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w", disk=100 * MB)
    # One slot, two roots feeding one task: the second goes along, one past the slot.
    assert sorted(assigned(submit(s, table, ["both"], attrs=attrs))["w"]) == ["x-0", "x-1"]
    t = make_state(unknown_long=False, saturation=1.0)
    join(t, "w", disk=100 * MB)
    disk_used(t, "w", 30 * MB)  # 70 MiB free: one 40 MiB output fits, not two
    ((first,),) = assigned(submit(t, table, ["both"], attrs=attrs)).values()
    second = "x-1" if first == "x-0" else "x-0"
    assert t.tasks[second].state == "queued"


# ----------------------------------------------------------------------------- the disk watchdog


def test_tasks_waiting_for_disk_in_an_idle_pool_go_past_their_estimate(
    make_state: Factory,
) -> None:
    """Every worker of the pool runs nothing and a ready task waits for disk: no task
    will run to free any (inputs are pruned, spilled outputs read back, only as tasks
    run). After ``stall_timeout`` seconds of that, an idle worker takes it past its
    disk estimate, the one with the most disk left after it, and its story says why.
    Before that, it waits."""
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1", disk=40 * MB)
    join(s, "w2", disk=40 * MB)
    disk_used(s, "w1", 28 * MB)  # spilled outputs of earlier work: 12 MiB free
    disk_used(s, "w2", 30 * MB)  # 10 MiB free
    small = {"a": disk(MB), "b": disk(MB)}
    submit(s, {"a": [], "b": [], "c": ["a", "b"]}, ["c"], attrs=small)
    assert {worker_of_key(s, "a"), worker_of_key(s, "b")} == {"w1"}  # b is a's partner
    for key in ("a", "b"):
        finish(s, "w1", key, nbytes=4 * MB)
    # c's output, guessed 16 MiB, fits neither disk: it waits, and the pool runs nothing.
    assert s.tasks["c"].state == "queued"
    assert waits_for_disk(s, "c") == [
        "waiting for disk: needs 16777216 B, best worker w1 has 12582912 B free"
    ]
    start = s._now
    assert s.disk_stalled_since == {None: start}  # (tasks of no pool in particular)
    assert not assigned(tick(s, start + 9.9))  # not yet
    cmds = tick(s, start + 10.0)
    # w1 holds both inputs: 12 - 16 MiB left there, against 10 - 8 - 16 on w2.
    assert assigned(cmds) == {"w1": ["c"]}
    (line,) = [e[2] for e in s.story("c") if "past its disk estimate" in str(e[2])]
    assert line == (
        "past its disk estimate on w1 (needs 16777216 B, 12582912 B free): every "
        "worker of its pool ran nothing, so waiting would not make room; its run frees "
        "8388608 B of inputs there"
    )
    assert s.disk_override == {None}
    # It ends, no task waits for disk any more: the watchdog lets go.
    finish(s, "w1", "c", nbytes=MB)
    assert s.tasks["c"].state == "memory"
    assert not s.disk_override and not s.disk_stalled_since and not s.disk_parked


def test_producers_after_a_task_waiting_for_disk_do_not_take_its_room(
    make_state: Factory,
) -> None:
    """A consumer waits for disk on the worker that holds its input; roots submitted
    after it (producers: they add to disks and free nothing) would fit in that room,
    and taking it would leave the consumer, whose run prunes its input, waiting for
    ever (loaders filling the disks their skims need). They do not: they go where no
    task waits for the disk, or wait; the consumer's story says what it needs, theirs
    what they wait for. Once it has gone, they take the room."""
    s = make_state(saturation=1.0)
    join(s, "w1", disk=10 * MB)
    join(s, "w2", disk=10 * MB)
    submit(s, {"a": [], "long": [], "c": ["a"]}, ["c", "long"], attrs={"c": disk(5 * MB)})
    assert {worker_of_key(s, "a"), worker_of_key(s, "long")} == {"w1", "w2"}
    holder = worker_of_key(s, "a")
    busy = "w2" if holder == "w1" else "w1"
    disk_used(s, holder, 6 * MB)  # a's output and earlier spills: 4 MiB free
    finish(s, holder, "a", nbytes=2 * MB)
    assert s.tasks["c"].state == "queued"
    assert waits_for_disk(s, "c") == [
        f"waiting for disk: needs 5242880 B, best worker {holder} has 4194304 B free"
    ]
    roots = {f"r{i}": [] for i in range(3)}
    cmds = submit(s, roots, list(roots), attrs={k: disk(MB) for k in roots})
    assert not of(cmds, Execute)  # 1 MiB fits in holder's 4, but c waits for them
    for key in roots:
        assert s.tasks[key].state == "queued"
        assert waits_for_disk(s, key) == [
            f"waiting for disk: {holder}'s free disk is kept for 'c', which comes "
            "first and waits for it"
        ]
    # The busy worker frees up: c fits there (its input to fetch and its output), and
    # with no task waiting for disk, the roots take the room on both.
    cmds = finish(s, busy, "long", nbytes=100)
    sent = assigned(cmds)
    assert sent[busy] == ["c"] and sorted(sent) == sorted([busy, holder])
    (first,) = sent[holder]
    finish(s, busy, "c", nbytes=MB)
    finish(s, holder, first, nbytes=MB)
    assert {s.tasks[k].state for k in roots if k != first} == {"processing"}


def test_a_task_running_in_the_pool_keeps_the_others_waiting_for_disk(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", disk=40 * MB)
    join(s, "w2", disk=40 * MB)
    disk_used(s, "w1", 30 * MB)
    disk_used(s, "w2", 30 * MB)
    small = {"a": disk(MB), "long": disk(MB)}
    submit(s, {"a": [], "long": [], "c": ["a"]}, ["c", "long"], attrs=small)
    finish(s, worker_of_key(s, "a"), "a", nbytes=4 * MB)  # c is ready; "long" runs
    assert s.tasks["c"].state == "queued" and s.tasks["long"].state == "processing"
    start = s._now
    for dt in (10.0, 60.0, 600.0):  # "long" may free disk when it ends: c waits
        assert not assigned(tick(s, start + dt))
    assert s.tasks["c"].state == "queued" and not s.disk_override


def test_a_measured_output_is_never_forced_onto_a_disk_known_too_small(
    make_state: Factory,
) -> None:
    """A user audit: a loader (it frees nothing) measured by a try that ended
    ``disk-full`` at 50 MiB was sent twice more, after a stall each time, to the one
    worker with 45 MiB free, its file system smaller than its ``--disk``. A firm need
    is never tried where it does not fit: the task waits while something in its pool
    runs (that may free disk), and once the pool is stuck with nothing to drop, what
    is free now is all there will be: it fails with TaskTooBigForDisk, after one try."""
    s = make_state(saturation=1.0)
    join(s, "w", disk=300 * MB)
    join(s, "v", disk=300 * MB)
    disk_used(s, "w", 255 * MB)  # 45 MiB free: other programs fill its file system
    disk_used(s, "v", 260 * MB)  # 40 MiB free
    submit(s, {"busy": []}, ["busy"], attrs={"busy": disk(30 * MB)})
    assert worker_of_key(s, "busy") == "w"
    cmds = submit(s, {"load-0": []}, ["load-0"], attrs={"load-0": disk(MB)})
    assert assigned(cmds) == {"v": ["load-0"]}
    err = DiskFull("load-0", "v", 50 * MB, 40 * MB, 300 * MB)
    finish(s, "v", "load-0", outcome="disk-full", nbytes=50 * MB, error=err)
    assert s._expected_output(s.tasks["load-0"]) == (50 * MB, MEASURED_OUTPUT)
    # While "busy" runs on w, it waits: w may free disk; no stall is declared.
    start = s._now
    for now in (start + 10.0, start + 20.0, start + 40.0):
        assert not assigned(tick(s, now))
    assert s.tasks["load-0"].state == "queued"
    cmds = finish(s, "w", "busy", nbytes=MB)  # w's disk: 45 MiB free again
    assert s.tasks["load-0"].state == "queued"
    # The pool runs nothing now; the watchdog finds nothing to free or drop: the task is
    # never sent past its measured need, it fails (not after two more disk-full tries).
    for now in (start + 50.0, start + 60.0, start + 70.0, start + 80.0):
        cmds = tick(s, now)
        assert not assigned(cmds)
    ts = s.tasks["load-0"]
    assert ts.state == "erred" and len(ts.tries) == 1
    assert not any("past its disk estimate" in str(e[2]) for e in s.story("load-0"))
    e = ts.error
    assert isinstance(e, TaskTooBigForDisk)
    assert (e.needed, e.largest, e.expected, e.source) == (
        50 * MB, 45 * MB, 50 * MB, MEASURED_OUTPUT,
    )  # fmt: skip
    assert "it ran once and ended disk-full on worker 'v'" in str(e)
    # 45 MiB is the disk free now on w, not a limit: the message says which it is.
    assert e.stuck and e.on == "w"
    assert (
        "more than the 45.0 MiB free now on worker 'w', the worker it comes closest to "
        "fitting on, with nothing running on its pool's workers that could free more"
    ) in str(e)
    assert "more than the largest disk" not in str(e)


def stuck_on_kept_outputs(s: SchedulerState) -> tuple[str, str]:
    """Two 10 MiB workers each hold a 4 MiB output a client keeps (cal-0, cal-1);
    load-2 wrote 4 MiB on one of them (``here``, 2 MiB free left), and its reader
    calib-2 tried there, wrote 4 MiB and ended disk-full. Nothing runs, nothing can be
    dropped: calib-2 fails, stuck. Returns ``here`` and the other worker."""
    join(s, "w1", disk=10 * MB)
    join(s, "w2", disk=10 * MB)
    cals = {"cal-0": [], "cal-1": []}
    submit(s, cals, list(cals), attrs={k: disk(4 * MB) for k in cals})
    for key in cals:
        finish(s, worker_of_key(s, key), key, nbytes=4 * MB, file=True)
    disk_used(s, "w1", 4 * MB)
    disk_used(s, "w2", 4 * MB)
    submit(s, {"load-2": [], "calib-2": ["load-2"]}, ["calib-2"], attrs={"load-2": disk(MB)})
    here = worker_of_key(s, "load-2")
    finish(s, here, "load-2", nbytes=4 * MB, file=True)
    disk_used(s, here, 8 * MB)  # 2 MiB free; 6 MiB on the other
    assert worker_of_key(s, "calib-2") == here
    err = DiskFull("calib-2", here, 4 * MB, 2 * MB, 10 * MB)
    finish(s, here, "calib-2", outcome="disk-full", nbytes=4 * MB, error=err)
    start = s._now
    for now in (start, start + 10.0, start + 20.0):
        tick(s, now)
    return here, ({"w1", "w2"} - {here}).pop()


def test_a_stuck_task_is_told_its_need_and_the_free_disk_of_one_worker(
    make_state: Factory,
) -> None:
    """A user audit: "needs 38.1 MiB ... more than the most disk free now on any worker
    (61.9 MiB)": the need was counted on the worker holding the task's input, the free
    disk on the other, where it would need its input fetched too. The error names one
    worker, the one the task comes closest to fitting on, with its need and free disk
    there."""
    s = make_state(saturation=1.0)
    here, there = stuck_on_kept_outputs(s)
    e = s.tasks["calib-2"].error
    assert isinstance(e, TaskTooBigForDisk) and e.stuck
    # 4 MiB where its input is (2 MiB free), or 8 MiB on the other (6 MiB free): the
    # same 2 MiB short, the smaller need first.
    assert (e.needed, e.largest, e.on, e.held) == (4 * MB, 2 * MB, here, 0)
    assert str(e).startswith(
        "task 'calib-2' needs 4.0 MiB of disk (an output of 4.0 MiB, measured: a try of "
        "this task wrote that much and ended disk-full), more than the 2.0 MiB free now on "
        f"worker {here!r}, the worker it comes closest to fitting on, with nothing running "
        "on its pool's workers that could free more"
    )
    assert there not in str(e).split(";")[0]


def test_a_stuck_task_is_told_how_many_outputs_only_your_futures_hold(
    make_state: Factory,
) -> None:
    """A user audit kept every stage's futures (12 x 25 MiB frames): the disks filled
    with outputs only those futures held, and the error said "nothing stored there that
    can be made again elsewhere", pointing away from the fix. It says how many outputs
    only the futures hold, by category, and to release them first (docs/files.md)."""
    s = make_state(saturation=1.0)
    stuck_on_kept_outputs(s)
    e = s.tasks["calib-2"].error
    assert isinstance(e, TaskTooBigForDisk) and e.stuck
    assert e.held_by == (("cal", 8 * MB, 2),)
    text = str(e)
    assert (
        "with nothing running on its pool's workers that could free more; 2 outputs on "
        "their disks are held only by your futures (cal: 2 outputs, 8.0 MiB); it ran once"
    ) in text
    assert "nothing stored there that can be made again" not in text
    assert text.endswith(
        "Release the futures you no longer need (del the lists of earlier stages once the "
        "next is submitted) so Corral can drop their outputs, start workers with a larger "
        "--disk (disk_per_worker), or split the task's output into smaller chunks."
    )


def test_an_input_the_worker_holds_is_not_told_as_one_to_fetch(make_state: Factory) -> None:
    """A user audit: "needs 200.0 MiB of disk (an output of 100.0 MiB, measured ...,
    plus 100.0 MiB of inputs it must fetch)" for a task that ran on the worker holding
    its input. Its need is the same on either worker (input and output); it is told on
    the one holding its input: the input is on that worker's disk already."""
    s = make_state(saturation=1.0)
    join(s, "w1", disk=6 * MB)
    join(s, "w2", disk=6 * MB)
    submit(s, {"raw-0": [], "cal-0": ["raw-0"]}, ["cal-0"], attrs={"raw-0": disk(MB)})
    here = worker_of_key(s, "raw-0")
    finish(s, here, "raw-0", nbytes=4 * MB, file=True)
    disk_used(s, here, 4 * MB)
    assert worker_of_key(s, "cal-0") == here
    err = DiskFull("cal-0", here, 4 * MB, 2 * MB, 6 * MB)
    finish(s, here, "cal-0", outcome="disk-full", nbytes=4 * MB, error=err)
    e = s.tasks["cal-0"].error
    assert isinstance(e, TaskTooBigForDisk) and not e.stuck
    assert (e.needed, e.largest, e.held) == (8 * MB, 6 * MB, 4 * MB)
    assert str(e).startswith(
        "task 'cal-0' needs 8.0 MiB of disk (an output of 4.0 MiB, measured: a try of this "
        "task wrote that much and ended disk-full, plus 4.0 MiB of its file inputs already "
        "on that worker's disk), more than the largest disk of any worker can hold (6.0 MiB)"
    )
    assert "inputs it must fetch" not in str(e)
