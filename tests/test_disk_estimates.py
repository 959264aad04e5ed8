"""What disk-aware placement may conclude from each kind of output size (the scheduler
core's disk part, actors/scheduler_disk.py; docs/files.md, "Disks"). Pure-core tests:
events in, exact commands and states out (the ``make_state`` fixture validates every
state).

A declared ``resources={"disk": ...}`` is what the user knows: it replaces the
category's estimate for that task, smaller or larger. Only firm needs refuse a task
with TaskTooBigForDisk: the known sizes of its inputs plus its declared output, or what
this very task was measured to write (a try of it that ended ``disk-full``). The
category's largest output and the guess are estimates: they steer placement, but a task
whose estimate no worker could hold is tried on the worker with the most free disk
instead of failing or waiting for ever. TaskTooBigForDisk says whether the task ran,
in one unit.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.scheduler_events import (
    Execute,
    KeyErred,
    WorkerDraining,
)
from actors.scheduler_state import (
    DECLARED_OUTPUT,
    GUESSED_OUTPUT,
    MEASURED_OUTPUT,
    SEEN_OUTPUT,
    SchedulerState,
)
from runtime.errors import DiskFull, TaskTooBigForDisk
from tests.helpers import MB, Factory, assigned, event, finish, make_state, of, on, run, submit
from tests.test_disk_placement import disk, disk_used, join, worker_of_key

__all__ = ["make_state"]  # the fixture, used by name

PAST_ESTIMATE = "no worker of its pool could hold its expected output"


def story_lines(s: SchedulerState, key: str, text: str) -> list[str]:
    return [str(e[2]) for e in s.story(key) if text in str(e[2])]


def disk_full(s: SchedulerState, worker: str, key: str, nbytes: int) -> list[Any]:
    err = DiskFull(key, worker, nbytes, s.workers[worker].disk, s.workers[worker].disk)
    return finish(s, worker, key, outcome="disk-full", nbytes=nbytes, error=err)


# ------------------------------------------------------- one oversized output (finding 1)


def test_one_oversized_output_fails_only_its_own_task(make_state: Factory) -> None:
    """Four loads on two 12 MiB disks; the first to run writes 20 MiB. Its category's
    largest output is then 20 MiB, which no disk can hold: an estimate, so the other
    loads are tried (on the worker with the most free disk), and only the oversized
    one, measured, fails."""
    s = make_state(saturation=1.0)
    join(s, "w1", disk=12 * MB)
    join(s, "w2", disk=12 * MB)
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(4)}
    cmds = submit(s, table, list(table))
    ((big_key,), (first,)) = assigned(cmds)["w1"], assigned(cmds)["w2"]
    (third, fourth) = sorted(set(table) - {big_key, first}, key=lambda k: s.tasks[k].prio)
    cmds = disk_full(s, "w1", big_key, 20 * MB)
    assert s._expected_output(s.tasks[third]) == (20 * MB, SEEN_OUTPUT)
    assert assigned(cmds) == {"w1": [third]}  # the fresh task first; the retry waits
    (line,) = story_lines(s, third, "past its disk estimate")
    assert line == (
        f"past its disk estimate on w1 (needs 20971520 B, 12582912 B free): {PAST_ESTIMATE}"
        " (20971520 B, the largest of its category's latest outputs), so it is tried where the "
        "most disk is free"
    )
    assert not of(cmds, KeyErred)
    # The other ends well: its worker takes the fourth past the estimate; then the
    # oversized one (its own measured 20 MiB, firm) fails: nothing could hold it.
    cmds = finish(s, "w2", first, nbytes=2 * MB)
    assert assigned(cmds) == {"w2": [fourth]}
    cmds = finish(s, "w1", third, nbytes=2 * MB)
    (erred,) = of(cmds, KeyErred)
    assert erred.key == big_key and isinstance(erred.error, TaskTooBigForDisk)
    e = erred.error
    assert (e.needed, e.largest, e.expected, e.source) == (
        20 * MB, 12 * MB, 20 * MB, MEASURED_OUTPUT,
    )  # fmt: skip
    assert "it ran once and ended disk-full on worker 'w1'" in str(e)
    finish(s, "w2", fourth, nbytes=2 * MB)
    states = {k: s.tasks[k].state for k in table}
    assert states == {**dict.fromkeys(table, "memory"), big_key: "erred"}


def test_declared_sizes_are_trusted_after_one_oversized_output(make_state: Factory) -> None:
    """The same, with the small loads declaring their 2 MiB, as the error advises: they
    are placed by what they declare, two at a time per disk, the oversized output
    nothwithstanding."""
    s = make_state(unknown_long=False, saturation=2.0)  # two slots per worker
    join(s, "w1", disk=12 * MB)
    join(s, "w2", disk=12 * MB)
    submit(s, {"load-0": []}, ["load-0"])
    disk_full(s, worker_of_key(s, "load-0"), "load-0", 20 * MB)
    assert s.tasks["load-0"].state == "erred"
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(1, 5)}
    cmds = submit(s, table, list(table), attrs={k: disk(2 * MB) for k in table})
    assert s._expected_output(s.tasks["load-1"]) == (2 * MB, DECLARED_OUTPUT)
    assert not of(cmds, KeyErred)
    assert sorted(len(keys) for keys in assigned(cmds).values()) == [2, 2]
    assert not [k for k in table if story_lines(s, k, "past its disk estimate")]


def test_an_old_maximum_from_an_earlier_run_fails_nothing(make_state: Factory) -> None:
    """A long-lived manager: a load wrote 100 MiB on a large worker, which no longer
    takes tasks (draining). New runs on 12 MiB disks: the category's old maximum is an
    estimate no disk holds; the new loads run, declared or not."""
    s = make_state(saturation=1.0)
    join(s, "large", disk=200 * MB)
    submit(s, {"load-99": []}, ["load-99"])
    finish(s, "large", "load-99", nbytes=100 * MB, file=True)
    run(s, event(WorkerDraining, worker="large"))
    join(s, "w1", disk=12 * MB)
    join(s, "w2", disk=12 * MB)
    cmds = submit(
        s, {"load-10": [], "load-11": []}, ["load-10", "load-11"], attrs={"load-11": disk(2 * MB)}
    )
    assert not of(cmds, KeyErred)
    assert sorted(k for keys in assigned(cmds).values() for k in keys) == ["load-10", "load-11"]
    assert story_lines(s, "load-10", PAST_ESTIMATE)
    assert not story_lines(s, "load-11", "past its disk estimate")  # declared: fits


def inputs_on_a_draining_worker(s: SchedulerState, **sizes: int) -> None:
    """Tasks ``sizes`` finish on worker ``h`` (no disk limit) with file outputs that large;
    ``h`` then drains: it keeps serving them, and a task reading them must fetch them."""
    join(s, "h", disk=0, cores=len(sizes))
    submit(s, {key: [] for key in sizes}, list(sizes))
    for key, nbytes in sizes.items():
        finish(s, "h", key, nbytes=nbytes, file=True)
    run(s, event(WorkerDraining, worker="h"))


def test_an_estimate_no_disk_holds_waits_only_for_room_for_the_inputs(
    make_state: Factory,
) -> None:
    """A task whose category's estimate fits no disk is tried where its inputs fit;
    where they do not fit now, it waits for room for them, not for the estimate."""
    s = make_state(saturation=1.0)
    inputs_on_a_draining_worker(s, **{"load-0": 50 * MB, "src": 4 * MB})
    join(s, "v", disk=12 * MB)
    disk_used(s, "v", 10 * MB)  # 2 MiB free: the 4 MiB input does not fit now
    cmds = submit(s, {"src": [], "load-1": ["src"]}, ["load-1"])
    assert s._expected_output(s.tasks["load-1"]) == (50 * MB, SEEN_OUTPUT)
    assert not of(cmds, Execute) and not of(cmds, KeyErred)
    assert s.tasks["load-1"].state == "queued"
    assert story_lines(s, "load-1", "waiting for disk") == [
        "waiting for disk: needs 4194304 B, best worker v has 2097152 B free"
    ]
    cmds = disk_used(s, "v", 6 * MB)  # room for the input: it is tried
    assert assigned(cmds) == {"v": ["load-1"]}
    assert story_lines(s, "load-1", PAST_ESTIMATE)


# ------------------------------------------------------------------ a guess (finding 2)


def test_a_guess_leaves_room_for_the_inputs_and_never_fails_a_task(
    make_state: Factory,
) -> None:
    """A task reading six inputs of 1.4 MB (two on each of three 10 MB disks) that
    nothing is known of: the guess is at most half of what the largest disk leaves
    beside its inputs, so it is placed at once."""
    s = make_state(saturation=1.0)
    for w in ("w1", "w2", "w3"):
        join(s, w, disk=10_000_000)
    loads = {f"load-{i}": [] for i in range(6)}
    submit(s, loads, list(loads))
    while running := {k for w in ("w1", "w2", "w3") for k in on(s, w)}:
        for key in sorted(running):
            finish(s, worker_of_key(s, key), key, nbytes=1_400_000, file=True)
    held = {w: sum(ts.nbytes for ts in s.workers[w].has_what) for w in ("w1", "w2", "w3")}
    assert held == dict.fromkeys(("w1", "w2", "w3"), 2_800_000)
    for w in held:
        disk_used(s, w, 2_800_000)
    cmds = submit(s, {**loads, "hist": list(loads)}, ["hist"])
    assert not of(cmds, KeyErred)
    assert [k for keys in assigned(cmds).values() for k in keys] == ["hist"]
    # (10 MB - 8.4 MB) / 2: 0.8 MB; 5.6 MB to fetch plus 0.8 MB fit 7.2 MB free.
    assert s._expected_output(s.tasks["hist"]) == (800_000, GUESSED_OUTPUT)


def test_the_inputs_alone_too_large_for_every_disk_fail_a_task_not_started(
    make_state: Factory,
) -> None:
    """The inputs' sizes are firm: a task that must fetch more than any disk holds
    fails, its output (a guess) not counted, and the error says it never started."""
    s = make_state(saturation=1.0)
    inputs_on_a_draining_worker(s, a=6 * MB, b=6 * MB)
    join(s, "w1", disk=10 * MB)
    join(s, "w2", disk=10 * MB)
    cmds = submit(s, {"a": [], "b": [], "both": ["a", "b"]}, ["both"])
    (erred,) = [c for c in of(cmds, KeyErred) if c.key == "both"]
    e = erred.error
    assert isinstance(e, TaskTooBigForDisk)
    assert (e.needed, e.largest) == (12 * MB, 10 * MB)
    assert (e.expected, e.source, e.tries) == (0, TaskTooBigForDisk.UNCOUNTED, 0)
    assert str(e).startswith(
        "task 'both' needs 12.0 MiB of disk for the inputs it must fetch alone (its output "
        "not counted: its size is only estimated), more than the largest disk of any worker "
        "can hold (10.0 MiB); it was not started."
    )


# -------------------------------------------------------------- the message (finding 3)


def test_the_error_says_whether_the_task_ran_in_one_unit() -> None:
    never = TaskTooBigForDisk("k", 2_000_000, 1_000_000, None, 1_000_000, DECLARED_OUTPUT)
    text = str(never)
    assert "bytes " not in text  # one unit: no "1.9 MiB ... (1,000,000 bytes)"
    assert text.startswith(
        "task 'k' needs 1.9 MiB of disk (an output of 1.0 MiB, declared with "
        'resources={"disk": ...}, plus 1.0 MiB of inputs it must fetch), more than the '
        "largest disk of any worker can hold (1.0 MiB); it was not started. "
    )
    assert text.endswith(
        'declare a smaller output with resources={"disk": bytes} if it is overestimated.'
    )
    ran = TaskTooBigForDisk(
        "k", 30 * MB, 20 * MB, "p", 30 * MB, MEASURED_OUTPUT, tries=3, outcome="disk-full",
        worker="w",
    )  # fmt: skip
    text = str(ran)
    assert "a worker in pool 'p' can hold (20.0 MiB); it ran 3 times, the latest ending " in text
    assert "disk-full on worker 'w'; it is not tried again." in text
    assert "declare" not in text  # measured: nothing to declare
    # Below a MiB: bytes throughout; sizes that would read the same: bytes throughout.
    small = str(TaskTooBigForDisk("k", 900_000, 500_000, None, 900_000, DECLARED_OUTPUT))
    assert "needs 900,000 bytes of disk (an output of 900,000 bytes," in small
    assert "(500,000 bytes)" in small
    close = str(TaskTooBigForDisk("k", 10 * MB + 1, 10 * MB, None, 10 * MB + 1, DECLARED_OUTPUT))
    assert "needs 10,485,761 bytes" in close and "(10,485,760 bytes)" in close
    tiny = str(TaskTooBigForDisk("k", 12 * MB, 10 * MB, None, 1000, DECLARED_OUTPUT))
    assert "(an output of less than 0.1 MiB," in tiny


@pytest.mark.parametrize("declared", [None, 2 * MB])
def test_a_refused_retry_says_it_ran_and_ended_disk_full(
    make_state: Factory, declared: int | None
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w", disk=12 * MB)
    submit(s, {"x": []}, ["x"], attrs={"x": disk(declared)} if declared else None)
    cmds = disk_full(s, "w", "x", 20 * MB)
    (erred,) = of(cmds, KeyErred)
    text = str(erred.error)
    assert "(an output of 20.0 MiB, measured: a try of this task wrote that much" in text
    assert "it ran once and ended disk-full on worker 'w'; it is not tried again." in text
    assert "not started" not in text
