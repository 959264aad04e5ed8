"""The room a producer keeps on a disk for its consumer's output (docs/files.md,
"Disks"): a preference, never a reason to wait for ever. Pure-core tests (events in,
exact commands out; the ``make_state`` fixture validates every state at the end), from
a user audit (astronomer's survey frames on 180 MiB disks):

- a lost output whose producer declared its size (``resources={"disk": ...}``) was
  never made again: its producer waited for its own output plus its consumer's room,
  which no idle worker had, while its own output fitted (finding 1);
- a long-lived manager expected every later output as large as the largest one it
  ever saw, and a producer's own estimate plus its consumer's room fitted no disk even
  empty: every new run on empty disks began with a 10 s disk stall (finding 2).
"""

from __future__ import annotations

from typing import Any

from actors.scheduler_events import KeyErred
from actors.scheduler_state import DECLARED_OUTPUT, SEEN_OUTPUT, SchedulerState
from policies.base import OUTPUT_WINDOW
from runtime.errors import TaskTooBigForDisk
from tests.helpers import (
    MB,
    Factory,
    assigned,
    files_released,
    finish,
    leave,
    make_state,
    of,
    submit,
)
from tests.test_disk_placement import disk, disk_used, join, tick, waits_for_disk, worker_of_key

__all__ = ["make_state"]  # the fixture, used by name


def lines(s: SchedulerState, key: str, text: str) -> list[str]:
    return [str(e[2]) for e in s.story(key) if text in str(e[2])]


def wrote(s: SchedulerState, key: str, nbytes: int) -> list[Any]:
    """``key``'s try ended ok on its worker with a file output of ``nbytes``."""
    return finish(s, worker_of_key(s, key), key, nbytes=nbytes, file=True)


def calibrated_then_lost(s: SchedulerState, size: int) -> None:
    """Three 10 MiB workers. calibrate-0 and calibrate-1 (kept: a client wants them)
    wrote 4 MiB each on w1 and w2; stage-2 (declared ``size``) and calibrate-2 ran on
    w3, stage-2 was let go, and w3 was killed: calibrate-2 is lost, stage-2 must run
    again, and w1 and w2 have 6 MiB free each."""
    for w in ("w1", "w2", "w3"):
        join(s, w, disk=10 * MB)
    cals = {"calibrate-0": [], "calibrate-1": []}
    cmds = submit(s, cals, list(cals), attrs={k: disk(4 * MB) for k in cals})
    assert sorted(assigned(cmds)) == ["w1", "w2"]
    wrote(s, "calibrate-0", 4 * MB)
    wrote(s, "calibrate-1", 4 * MB)
    assert {w for k in cals for w in s.tasks[k].who_has} == {"w1", "w2"}
    disk_used(s, "w1", 4 * MB)
    disk_used(s, "w2", 4 * MB)
    table = {"stage-2": [], "calibrate-2": ["stage-2"]}
    cmds = submit(s, table, ["calibrate-2"], attrs={"stage-2": disk(size)})
    assert assigned(cmds) == {"w3": ["stage-2"]}
    wrote(s, "stage-2", size)
    assert worker_of_key(s, "calibrate-2") == "w3"
    wrote(s, "calibrate-2", 4 * MB)
    files_released(s, "stage-2")  # let go: its reader is done
    assert s.tasks["stage-2"].state == "released"
    leave(s, "w3", cause="killed")
    assert s.tasks["stage-2"].state == "queued"


def test_a_lost_output_is_made_again_without_its_consumers_room_when_nothing_runs(
    make_state: Factory,
) -> None:
    """The audit's hang: stage-2 declared 5 MiB; with its consumer's 4 MiB it needs 9,
    more than the 6 MiB free on either idle worker, and nothing stored can be dropped
    (a client holds both outputs). It waits, saying so; after ``stall_timeout`` of an
    idle pool the room for its consumer is let go (its own 5 MiB fits) and it runs, and
    so does its consumer after it (not the waiting for ever it was)."""
    s = make_state(saturation=1.0, unknown_long=False)
    calibrated_then_lost(s, 5 * MB)
    assert s._expected_output(s.tasks["stage-2"]) == (5 * MB, DECLARED_OUTPUT)
    assert waits_for_disk(s, "stage-2")[-1] == (
        "waiting for disk: needs 9437184 B, best worker w2 has 6291456 B free (of which "
        "4194304 B kept for its consumer's output)"
    )
    start = s._now
    assert not assigned(tick(s, start))
    assert not assigned(tick(s, start + 9.9))
    cmds = tick(s, start + 10.0)
    assert assigned(cmds) == {"w2": ["stage-2"]}
    assert lines(s, "stage-2", "without the room kept") == [
        "without the room kept for its consumer's output on w2 (needs 5242880 B, 6291456 B "
        "free): every worker of its pool ran nothing and no stored output could be "
        "dropped, so waiting would not make that room"
    ]
    cmds = wrote(s, "stage-2", 5 * MB)
    assert assigned(cmds) == {"w2": ["calibrate-2"]}
    wrote(s, "calibrate-2", 4 * MB)
    assert s.tasks["calibrate-2"].state == "memory"


def test_a_lost_output_whose_own_declared_size_fits_no_free_disk_fails_at_once(
    make_state: Factory,
) -> None:
    """The same with stage-2 declared 6 MiB and 5 MiB free on each idle worker: its own
    output fits neither and nothing can free more. Once the pool is found stuck, it
    fails with TaskTooBigForDisk (not a wait for ever), and so does its consumer."""
    s = make_state(saturation=1.0, unknown_long=False)
    calibrated_then_lost(s, 6 * MB)
    disk_used(s, "w1", 5 * MB)  # (spilled outputs: 5 MiB free)
    disk_used(s, "w2", 5 * MB)
    start = s._now
    tick(s, start)
    cmds = tick(s, start + 10.0)
    assert not assigned(cmds)
    assert s.tasks["stage-2"].state == "erred"
    cmds = tick(s, start + 10.1)  # (what failed in the watchdog spreads at the next event)
    assert [e.key for e in of(cmds, KeyErred)] == ["calibrate-2"]
    err = s.tasks["stage-2"].error
    assert isinstance(err, TaskTooBigForDisk) and err.stuck
    assert (err.needed, err.expected) == (6 * MB, 6 * MB)


# ------------------------------------------------------- a long-lived manager's estimates


def stage_and_calibrate(s: SchedulerState, first: int, sizes: list[int]) -> None:
    """Frames ``first``... of ``sizes`` go through stage (one at a time, on whichever
    worker takes it) and calibrate (the same size); their outputs are let go."""
    for i, size in enumerate(sizes, start=first):
        table = {f"stage-{i}": [], f"calibrate-{i}": [f"stage-{i}"]}
        submit(s, table, [f"calibrate-{i}"])
        wrote(s, f"stage-{i}", size)
        wrote(s, f"calibrate-{i}", size)
        s.tasks[f"calibrate-{i}"].wanted = False  # (the client let it go: see below)


def test_an_earlier_runs_largest_output_makes_no_run_on_empty_disks_wait(
    make_state: Factory,
) -> None:
    """The audit's 10 s stall: one frame of 15 MiB went through stage and calibrate on
    18 MiB disks. A new 2 MiB frame on empty disks: its stage expects 15 MiB (its
    category's latest largest) and keeps 15 MiB for its calibrate, 30 MiB that no disk
    holds even empty. The room is cut to what the largest disk leaves beside its own
    output: it runs at once, and no disk stall is declared."""
    s = make_state(saturation=1.0, unknown_long=False)
    join(s, "w1", disk=18 * MB)
    join(s, "w2", disk=18 * MB)
    cmds = submit(s, {"stage-0": [], "calibrate-0": ["stage-0"]}, ["calibrate-0"])
    wrote(s, "stage-0", 15 * MB)
    wrote(s, "calibrate-0", 15 * MB)
    cmds = submit(s, {"stage-1": [], "calibrate-1": ["stage-1"]}, ["calibrate-1"])
    assert s._expected_output(s.tasks["stage-1"]) == (15 * MB, SEEN_OUTPUT)
    assert sum(len(k) for k in assigned(cmds).values()) == 1
    assert not waits_for_disk(s, "stage-1")
    start = s._now
    tick(s, start)
    assert not s.disk_stalls and not s.disk_parked
    assert not assigned(tick(s, start + 10.0)) and not s.disk_stalls


def test_the_expected_output_follows_the_latest_outputs_of_its_category(
    make_state: Factory,
) -> None:
    """The estimate is the largest of the category's latest ``OUTPUT_WINDOW`` outputs,
    not the largest ever: one 15 MiB frame stops counting after that many 1 MiB ones,
    and its producer's need (own output and consumer's room) follows."""
    s = make_state(saturation=1.0, unknown_long=False)
    join(s, "w1", disk=40 * MB)
    stage_and_calibrate(s, 0, [15 * MB])
    stage_and_calibrate(s, 1, [MB] * (OUTPUT_WINDOW - 1))
    submit(s, {"stage-99": [], "calibrate-99": ["stage-99"]}, ["calibrate-99"])
    ts = s.tasks["stage-99"]
    assert s._expected_output(ts) == (15 * MB, SEEN_OUTPUT)  # still among the latest
    wrote(s, "stage-99", MB)
    assert s._expected_output(ts) == (MB, SEEN_OUTPUT)  # 15 MiB left the window
    assert s.stats["stage"].max_nbytes == 15 * MB  # (the all-time largest, as told)
    assert s._expected_output(s.tasks["calibrate-99"])[0] == 15 * MB  # one fewer yet


def test_the_last_resort_lets_one_producer_go_at_a_time_not_while_one_runs(
    make_state: Factory,
) -> None:
    """Review 1207d F2: two lost producers (5 MiB declared each, a 4 MiB consumer each)
    and two idle workers with 6 MiB free. At ``stall_timeout`` the room for a consumer
    is let go for one producer only: its pool then runs something, so the other waits
    (its story does not say that every worker ran nothing)."""
    s = make_state(saturation=1.0, unknown_long=False)
    for w in ("w1", "w2", "w3"):
        join(s, w, disk=20 * MB)
    cals = {"calibrate-0": [], "calibrate-1": []}
    submit(s, cals, list(cals), attrs={k: disk(4 * MB) for k in cals})
    wrote(s, "calibrate-0", 4 * MB)
    wrote(s, "calibrate-1", 4 * MB)
    disk_used(s, "w1", 14 * MB)  # 6 MiB free each
    disk_used(s, "w2", 14 * MB)
    table = {"stage-2": [], "calibrate-2": ["stage-2"], "stage-3": [], "calibrate-3": ["stage-3"]}
    attrs = {"stage-2": disk(5 * MB), "stage-3": disk(5 * MB)}
    submit(s, table, ["calibrate-2", "calibrate-3"], attrs=attrs)
    for key in ("stage-2", "stage-3", "calibrate-2", "calibrate-3"):
        if s.tasks[key].state == "processing":  # (on w3, the roomy one)
            wrote(s, key, 4 * MB if key.startswith("calibrate") else 5 * MB)
    files_released(s, "stage-2")
    files_released(s, "stage-3")
    leave(s, "w3", cause="killed")
    assert s.tasks["stage-2"].state == s.tasks["stage-3"].state == "queued"
    assert s.tasks["calibrate-2"].state == s.tasks["calibrate-3"].state == "waiting"
    start = s._now
    assert not assigned(tick(s, start + 9.9))
    placed = assigned(tick(s, start + 10.0))
    assert len(placed) == 1 and sum(map(len, placed.values())) == 1, placed
    (first,) = (k for keys in placed.values() for k in keys)
    other = "stage-3" if first == "stage-2" else "stage-2"
    assert s.tasks[other].state == "queued"
    assert lines(s, other, "without the room kept") == []
