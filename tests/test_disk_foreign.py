"""A worker's disk shrunk by another program's files (the diskfull audit, findings 1,
3, 4 and 6; docs/files.md, "Waiting, and the error").

An astronomer's stacks (each reads four calibrated frames of 1 MiB) ran on workers
whose scratch file system another program had partly filled. The disk stall breaker
dropped an input of the very task that waited, made it again on the same worker, and
stalled again: a drop and a remake every ``stall_timeout``, no error, the client
waiting for ever. Now the breaker never drops what a waiting task reads, it gives up
(the waiting tasks fail with ``TaskTooBigForDisk`` and the stall's account) when it
would drop again what it made again with no task finished between, and the stall's
account names the other programs' files.

Pure-core tests (events in, exact commands out; ``make_state`` validates every state
at the end), with the worker simulated: it writes each output if it fits what its file
system has left, and reports its disk after every change.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from actors.scheduler_events import (
    DiskStallBegan,
    DropData,
    Execute,
    FilesReleased,
    GraphSubmitted,
    KeyErred,
    KeysReleased,
    TasksFinished,
    Tick,
    WorkerJoined,
    WorkerMemory,
)
from actors.scheduler_records import disk_stall_parts
from actors.scheduler_state import SchedulerState
from actors.worker_state import file_system_short
from runtime.errors import DiskFull, TaskTooBigForDisk
from runtime.messages import DiskStallInfo
from tests.helpers import MB, Factory, make_state, result, specs_for, submit
from tests.test_disk_breaker import _disk_full_three_times, wrote
from tests.test_disk_placement import join

__all__ = ["make_state"]  # the fixture, used by name

#: each category's output (bytes, file output) and duration in the simulated worker
OUTPUTS = {
    "c": (MB, True, 0.4),
    "x": (MB // 2, True, 1.0),
    "stack": (MB, True, 0.5),
}


class Worker:
    """One simulated worker ``w1`` with a ``disk`` limit, on a file system other
    programs' files take ``foreign`` bytes of: its outputs fit only in the rest."""

    def __init__(self, s: SchedulerState, disk: int, foreign: int) -> None:
        self.s, self.disk, self.foreign = s, disk, foreign
        self.now = 1.0
        self.running: list[Any] = []
        self.dropped: list[Any] = []  # the keys the scheduler had it drop
        self.erred: list[KeyErred] = []
        self.stalls: list[DiskStallInfo] = []

    def ev(self, cls: type[Any], **fields: Any) -> Any:
        self.now += 0.01
        return cls(stimulus_id=f"{cls.__name__}-{self.now:.2f}", now=self.now, **fields)

    def handle(self, *events: Any) -> None:
        cmds = self.s.handle(*events)
        self.s.validate()
        for c in cmds:
            if isinstance(c, Execute):
                self.running.extend(t.key for t in c.tasks)
            elif isinstance(c, DropData):
                self.dropped.extend(c.keys)
            elif isinstance(c, KeyErred):
                self.erred.append(c)
            elif isinstance(c, DiskStallBegan):
                self.stalls.append(c.stall)

    def own(self) -> int:
        """Bytes of file outputs on its disk, as the core knows them."""
        return sum(
            t.nbytes for t in self.s.tasks.values()
            if t.state == "memory" and t.file and "w1" in t.who_has
        )  # fmt: skip

    def report(self, new: int = 0) -> None:
        self.handle(
            self.ev(
                WorkerMemory, worker="w1", throttled=False, rss=0, throttle_at=0, limit=0,
                disk_used=self.own() + new + self.foreign, disk_foreign=self.foreign,
            )
        )  # fmt: skip

    def step(self) -> None:
        """Run what it was sent, one task at a time, each written if it fits the file
        system (else it ends disk-full); release what no one needs (the registry);
        report the disk."""
        while self.running:
            key = self.running.pop(0)
            nbytes, file, duration = OUTPUTS.get(self.s.tasks[key].spec.category, (100, False, 0.1))
            room = self.disk - self.foreign - self.own()
            if file and nbytes > room:
                err = DiskFull(
                    str(key), "w1", room, room, self.disk, partial=True,
                    filesystem="/scratch", fs_free=room,
                )  # fmt: skip
                res = result(key, "disk-full", nbytes=room, error=err, duration=duration)
            else:
                res = dataclasses.replace(result(key, nbytes=nbytes, duration=duration), file=file)
                # Its report (the new file on its disk) comes with the finish.
                self.report(nbytes if file else 0)
            self.handle(self.ev(TasksFinished, worker="w1", results=(res,)))
            gone = tuple(
                t.key for t in self.s.tasks.values()
                if t.state == "memory" and t.file and not t.wanted and not t.consumers
            )  # fmt: skip
            if gone:
                self.handle(self.ev(FilesReleased, keys=gone))
            self.report()

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.handle(Tick(stimulus_id=f"tick-{self.now:.2f}", now=self.now))


def stacks(s: SchedulerState, w: Worker) -> None:
    """Two stacks of four frames each (``c-0`` ... ``c-7``, 1 MiB files), both read by
    ``coadd``; and ``x-0``, a half-MiB file read (two steps past ``coadd``) by ``y``,
    the key the client wants. Neither stack nor x-0 is wanted by a client."""
    # A first stack, made and released: the frames' and stacks' sizes are known.
    first: dict[Any, list[Any]] = {"c-90": [], "stack-9": ["c-90"], "x-9": []}
    w.handle(
        w.ev(
            GraphSubmitted, specs=specs_for(s, first, ["stack-9", "x-9"]), wanted=("stack-9", "x-9")
        )
    )
    w.step()
    w.handle(w.ev(KeysReleased, keys=("stack-9", "x-9")))
    w.step()
    table: dict[Any, list[Any]] = {f"c-{i}": [] for i in range(8)}
    table["stack-0"] = [f"c-{i}" for i in range(4)]
    table["stack-1"] = [f"c-{i}" for i in range(4, 8)]
    table["coadd"] = ["stack-0", "stack-1"]
    table["z"] = ["coadd"]
    table["x-0"] = []
    table["y"] = ["x-0", "z"]
    specs = specs_for(s, table, ["y"])
    w.handle(w.ev(GraphSubmitted, specs=specs, wanted=("y",)))


def test_a_foreign_shortfall_ends_with_the_stalls_account_not_a_drop_loop(
    make_state: Factory,
) -> None:
    """The audit's loop in small. An 8 MiB disk of which other programs' files take
    2.5 MiB: a stack's four frames and its output (5 MiB) fit, but not with the other
    stack's output and x-0 beside them. The stall breaker used to drop a frame of the
    waiting stack (the cheapest output to make again), make it again on the same
    worker and stall again, every stall_timeout, for ever. Now it drops no input of a
    waiting task, and within a few stall periods the waiting stack fails with
    TaskTooBigForDisk, whose message names the other programs' files."""
    s = make_state(saturation=1.0, memory="blind")
    w = Worker(s, disk=8 * MB, foreign=5 * MB // 2)
    w.handle(w.ev(WorkerJoined, worker="w1", cores=1, memory=0, disk=8 * MB))
    w.report()
    stacks(s, w)
    periods = 0
    while not w.erred and periods < 12:
        w.step()
        w.tick(s.config.stall_timeout)
        periods += 1
    # Never a frame the waiting stack reads (before: 'c-0', every period, for ever);
    # x-0 once, and when its remake took the room back, no more.
    assert w.dropped == ["x-0"]
    assert w.erred, f"no error after {periods} stall periods"
    assert periods == 3
    (erred,) = w.erred
    assert erred.key == "y"
    err = erred.root_error
    assert isinstance(err, TaskTooBigForDisk) and err.stuck
    assert err.foreign == 5 * MB // 2
    assert "other files on the file system (not Corral's)" in str(err)
    assert "a larger --disk cannot help" in str(err)
    assert "Start workers with a larger --disk" not in str(err)
    # The stall's account told the other programs' files apart, and advised no --disk.
    assert w.stalls
    parts = disk_stall_parts(w.stalls[0])
    assert parts["holding"].endswith("; 2.5 MiB other files on the file system (not Corral's)")
    assert "larger --disk cannot help" in parts["advice"]


# ---------------------------------------------------------------- DiskFull's account


def _futures_kept(s: SchedulerState) -> Any:
    """The dask.distributed habit: every stage's futures kept (raws, calibrated frames,
    the stack). Both raws are read already (their calibrations ran): only the client's
    futures hold them. The stack's output then does not fit its 6 MiB disk, three
    tries running; its error (``KeyErred``)."""
    join(s, "w1", disk=6 * MB)
    table = {"raw-1": [], "raw-2": [], "cal-1": ["raw-1"], "cal-2": ["raw-2"]}
    table["stack"] = ["cal-1", "cal-2"]
    submit(s, table, list(table))
    while s.tasks["stack"].state != "processing":
        (ts,) = s.workers["w1"].processing
        wrote(s, "w1", ts.key, MB)
    return _disk_full_three_times(s, "stack", MB, 0)


def test_disk_full_of_outputs_only_futures_hold_says_to_release_them(
    make_state: Factory,
) -> None:
    """The raws fill the disk only because the client's futures hold them: DiskFull
    says so and advises releasing them first (before: every output was "waiting for
    its consumers", and only consumers-first was advised, which does not help)."""
    s = make_state(saturation=1.0, memory="blind")
    error = _futures_kept(s)
    assert isinstance(error, DiskFull)
    assert error.filled_by == (("cal", 2 * MB, 2), ("raw", 2 * MB, 2))
    assert error.held_by == (("raw", 2 * MB, 2),)
    assert str(error) == (
        "task 'stack' wrote an output of 1.0 MiB on worker 'w1', which had 0 bytes of "
        "disk left of its 6.0 MiB limit: the disk was full of other tasks' outputs (cal: "
        "2 outputs, 2.0 MiB; raw: 2 outputs, 2.0 MiB); 2 of them (raw: 2 outputs, "
        "2.0 MiB) are held by your futures, the others wait for their consumers, not too "
        "small for this output; the partial file was removed. Release the futures you no "
        "longer need (del the lists of earlier stages once the next is submitted) so "
        'Corral can drop them, run consumers before new producers (set_policy("priority", '
        '"consumers-first")), give the tasks that gather many outputs fewer inputs each '
        "(a smaller fan-in), or start workers with a larger --disk (disk_per_worker)."
    )


def test_disk_full_does_not_advise_consumers_first_when_in_force(make_state: Factory) -> None:
    s = make_state(saturation=1.0, memory="blind", priority="consumers-first")
    error = _futures_kept(s)
    assert isinstance(error, DiskFull) and error.consumers_first
    assert "consumers-first" not in str(error)
    assert str(error).endswith(
        "Release the futures you no longer need (del the lists of earlier stages once the "
        "next is submitted) so Corral can drop them, give the tasks that gather many "
        "outputs fewer inputs each (a smaller fan-in), or start workers with a larger "
        "--disk (disk_per_worker)."
    )


# ---------------------------------------------------------------- the worker's DiskFull


def test_the_file_system_is_named_only_past_its_rounding() -> None:
    """A worker names its file system in DiskFull (a larger --disk cannot help) only
    when it has less free than the limit leaves by more than max(1% of the limit,
    4 KiB per file kept): the audit's worker without --disk on an 18 MiB tmpfs had
    978,944 bytes left under its limit and 3,968 bytes less on the file system per
    1,048,704-byte file (tmpfs pages), and was told to resize its scratch."""
    limit, room, files = 18 * MB, 978_944, 5
    assert not file_system_short(room, room - 3_968 * files, limit, files)
    assert not file_system_short(room, room, limit, files)
    # Another program's 15 MiB file on a 20 MiB file system: named, --disk or not.
    assert file_system_short(5 * MB, 1_060_864, 12 * MB, files)
    # The tolerance: 1% of a 100 MiB limit (more than 4 KiB for each of 10 files).
    assert not file_system_short(5 * MB, 5 * MB - MB, 100 * MB, 10)
    assert file_system_short(5 * MB, 5 * MB - MB - 1, 100 * MB, 10)
    # ... or 4 KiB per file, when that is more (1,000 files on a 100 MiB limit).
    assert not file_system_short(5 * MB, 5 * MB - 4096 * 1000, 100 * MB, 1000)
    # No limit (--disk off): the file system is all there is; gone: not named.
    assert file_system_short(None, MB, 0, 0)
    assert not file_system_short(MB, None, 12 * MB, 0)


def test_a_worker_without_disk_is_told_its_disk_measured_at_start() -> None:
    err = DiskFull(
        "stack-2", "w3", MB, 978_944, 18 * MB, input="calibrate-10",
        filesystem="/scratch3", fs_free=3_040_000, measured=True,
    )  # fmt: skip
    assert "less than its disk (measured at start) of 18.0 MiB leaves" in str(err)
    assert "--disk of" not in str(err)
    given = DiskFull(
        "stack-2", "w3", MB, 978_944, 18 * MB, input="calibrate-10",
        filesystem="/scratch3", fs_free=3_040_000,
    )  # fmt: skip
    assert "less than its --disk of 18.0 MiB leaves" in str(given)
    ran_out = DiskFull("t", "w3", MB, 0, 18 * MB, partial=True, filesystem="/s", measured=True)
    assert "ran out of space before its disk (measured at start) of 18.0 MiB" in str(ran_out)


def test_a_tasks_own_enospc_is_told_as_filling_the_file_system(make_state: Factory) -> None:
    """A try whose own writes hit ENOSPC (the worker's DiskFull, ``partial``) is told in
    the story as what it was, not as an output that did not fit."""
    s = make_state(saturation=1.0)
    join(s, "w1", disk=12 * MB)
    submit(s, {"resample-1": []}, ["resample-1"])
    err = DiskFull("resample-1", "w1", 4 * MB, 0, 12 * MB, partial=True, filesystem="/s")
    res = result("resample-1", "disk-full", nbytes=4 * MB + 1, error=err)
    w = Worker(s, 12 * MB, 0)
    w.handle(w.ev(TasksFinished, worker="w1", results=(res,)))
    assert [e[2] for e in s.story("resample-1") if e[1] == "retry"] == [
        "the task's writes filled the file system on w1 (ENOSPC); free retry"
    ]


def test_the_stall_account_names_other_programs_files() -> None:
    stall = DiskStallInfo(
        pool="*", since=0.0, workers=("u1", "u2"), disk_used=20 * MB, disk=24 * MB,
        holding=(("stack", 7 * MB, 7), ("calibrate", 4 * MB, 4)), foreign=15 * MB // 2,
    )  # fmt: skip
    parts = disk_stall_parts(stall)
    assert parts["holding"] == (
        "file outputs: stack 7.0 MiB in 7, calibrate 4.0 MiB in 4; 1.5 MiB spilled "
        "outputs, checkpoint files and copies under way; 7.5 MiB other files on the file "
        "system (not Corral's)"
    )
    assert "larger --disk cannot help" in parts["advice"]
    assert "Give the workers a larger --disk" not in parts["advice"]
