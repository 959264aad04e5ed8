"""A disk stall made visible (docs/files.md#disks, docs/monitoring.md): the scheduler
core's account of a pool its disk watchdog finds stalled (its workers, what fills their
disks, what waits), told once when it begins and once when it ends; the metrics
``corral_disk_stalled`` and ``corral_disk_stalls_total``; the default rule
``CorralDiskStalled`` on the alert core's virtual clock; the console's status line; and
one run on worker processes whose small disks stall.

Pure-core tests: events in, exact commands and states out (``make_state`` validates
every state at the end)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any

import anyio
import pytest

from actors.alerts_state import DEFAULT_RULES, AlertState, Evaluate, Notify, parse_rule
from actors.scheduler_events import DiskStallBegan, DiskStallEnded, KeyErred, TasksFinished
from actors.scheduler_records import disk_stall_parts
from actors.scheduler_state import SchedulerState
from runtime import Cluster, File, output_path
from runtime.console import jsonable
from runtime.errors import DiskFull, TaskTooBigForDisk
from runtime.messages import DiskStallInfo, MetricsReply, PoolMetrics, StatusReply
from runtime.metrics import SAMPLE_LABELS, samples
from tests.helpers import (
    MB,
    Factory,
    assigned,
    event,
    finish,
    make_state,
    of,
    result,
    run,
    status_text,
    submit,
    wait_until,
)
from tests.test_disk_placement import disk, disk_used, join, tick

__all__ = ["make_state"]  # the fixture, used by name


def stalled_pool(make_state: Factory) -> tuple[SchedulerState, float]:
    """Two workers whose disks hold file outputs and spills; ``c``, which reads two of
    the outputs, waits for disk and the pool runs nothing (the disk watchdog's test,
    tests/test_disk_placement.py, with file outputs). Returns the state and when the
    wait began."""
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1", disk=40 * MB)
    join(s, "w2", disk=40 * MB)
    small = {"a": disk(MB), "b": disk(MB)}
    submit(s, {"a": [], "b": [], "c": ["a", "b"]}, ["c"], attrs=small)
    disk_used(s, "w1", 28 * MB)  # spilled outputs of earlier work, and a's file
    disk_used(s, "w2", 30 * MB)
    # a's output is a file output (a worker's result with file=True), b's is not.
    file_result = dataclasses.replace(result("a", nbytes=4 * MB), file=True)
    run(s, event(TasksFinished, worker="w1", results=(file_result,)))
    finish(s, "w1", "b", nbytes=4 * MB)
    assert s.tasks["c"].state == "queued"
    return s, s._now


def test_a_disk_stall_is_told_once_with_its_account_and_once_when_it_ends(
    make_state: Factory,
) -> None:
    s, start = stalled_pool(make_state)
    assert not of(tick(s, start + 9.9), DiskStallBegan)  # suspected, not declared
    assert s.pool_metrics(start + 9.9)["*"]["disk_stalled"] == 0
    cmds = tick(s, start + 10.0)
    (began,) = of(cmds, DiskStallBegan)
    assert began.stall == DiskStallInfo(
        pool="*",
        since=start + 10.0,
        workers=("w1", "w2"),
        disk_used=58 * MB,
        disk=80 * MB,
        holding=(("a", 4 * MB, 1),),  # a's file on w1; b's output is in memory or spilled
        waiting=(("c", 1),),
        queued=1,
    )
    assert assigned(cmds) == {"w1": ["c"]}  # the watchdog's own move, as before
    m = s.pool_metrics(start + 11.0)["*"]
    assert (m["disk_stalled"], m["disk_stalls"]) == (1, 1)
    assert list(s.disk_stalls) == [None]
    # c runs: no task waits for disk any more, and the watchdog lets go at its next
    # look; the stall ends, told once.
    cmds = tick(s, start + 20.0)
    (ended,) = of(cmds, DiskStallEnded)
    assert ended.stall is began.stall and ended.lasted == 10.0
    assert not of(finish(s, "w1", "c", nbytes=MB), DiskStallEnded)
    assert ("-", "disk", "stall in pool any ended") in [e[:3] for e in s.story("-")]
    m = s.pool_metrics(s._now)["*"]
    assert (m["disk_stalled"], m["disk_stalls"]) == (0, 1)  # the count stays
    assert not s.disk_stalls


def test_disk_full_tries_and_failures_are_counted(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w", disk=100 * MB)
    submit(s, {"write": []}, ["write"])
    for n in range(3):
        err = DiskFull("write", "w", 10 * MB, 5 * MB, 100 * MB)
        cmds = finish(s, "w", "write", outcome="disk-full", nbytes=10 * MB, error=err)
        assert (s.disk_full_tries, s.disk_full_failed) == (n + 1, 1 if n == 2 else 0)
    assert of(cmds, KeyErred)


def test_the_account_reads_as_the_log_and_the_console_show_it() -> None:
    stall = DiskStallInfo(
        pool="*", since=5.0, workers=("w1", "w2"), disk_used=36 * MB, disk=36 * MB,
        holding=(("load", 27 * MB, 9), ("skim", 2 * MB, 2)), waiting=(("skim", 120),
        ("merge", 16)), queued=136, stalled_for=42.0,
    )  # fmt: skip
    parts = disk_stall_parts(stall)
    assert parts["workers"] == "w1, w2"
    assert parts["disk"] == "36.0 MiB used of 36.0 MiB"
    assert parts["holding"] == (
        "file outputs: load 27.0 MiB in 9, skim 2.0 MiB in 2; 7.0 MiB spilled outputs, "
        "checkpoint files and copies under way"
    )
    assert parts["waiting"] == "136 ready tasks wait for disk (skim 120, merge 16)"
    full_of_files = dataclasses.replace(stall, disk_used=29 * MB)
    assert disk_stall_parts(full_of_files)["holding"].endswith(
        "; no spilled outputs, checkpoint files and copies under way"
    )
    assert "larger --disk" in parts["advice"] and "consumers-first" in parts["advice"]
    reply = StatusReply(disk_stalls=(stall,), disk_full_tries=7, disk_full_failed=1)
    text = " ".join(status_text(reply.to_dict()).split())  # (rich wraps long lines)
    assert (
        "disk stalled in pool any for 42 s: workers w1, w2 ran nothing, 36.0 MiB used of "
        "36.0 MiB; file outputs: load 27.0 MiB in 9" in text
    )
    assert "136 ready tasks wait for disk (skim 120, merge 16). Give the workers" in text
    assert (
        "disk full: 7 tries ended disk-full (retried where they fit, up to the retry "
        "policy's max_disk_full), 1 task(s) failed with DiskFull" in text
    )
    # Without a stall or a disk-full try, nothing is said.
    quiet = status_text(StatusReply().to_dict())
    assert "disk stalled" not in quiet and "disk full" not in quiet


# ----------------------------------------------------------------------------- metric and rule


def metrics(stalled: int, stalls: int) -> Any:
    return samples(
        MetricsReply(pools={"cpu": PoolMetrics(disk_stalled=stalled, disk_stalls=stalls)})
    )


def test_the_metrics_show_the_stall_per_pool() -> None:
    got = metrics(1, 2)
    assert got[("corral_disk_stalled", (("pool", "cpu"),))] == 1
    assert got[("corral_disk_stalls_total", (("pool", "cpu"),))] == 2


def disk_rule() -> AlertState:
    (raw,) = [d for d in DEFAULT_RULES if d["name"] == "CorralDiskStalled"]
    return AlertState([parse_rule(raw, SAMPLE_LABELS)])


def test_the_default_rule_fires_after_a_minute_of_stall_and_says_what_to_do() -> None:
    st = disk_rule()
    assert st.handle(Evaluate(0.0, metrics(0, 0))) == []
    st.handle(Evaluate(10.0, metrics(1, 1)))
    assert [(a.state, a.labels["pool"]) for a in st.alerts()] == [("pending", "cpu")]
    assert st.handle(Evaluate(69.9, metrics(1, 1))) == []  # not a minute yet
    (n,) = [c for c in st.handle(Evaluate(70.0, metrics(1, 1))) if isinstance(c, Notify)]
    assert n.alert.state == "firing" and n.alert.labels["priority"] == "P3"
    description = n.alert.annotations["description"]
    assert "pool cpu" in description and "larger --disk" in description
    (n,) = [c for c in st.handle(Evaluate(80.0, metrics(0, 1))) if isinstance(c, Notify)]
    assert n.alert.state == "resolved"


def test_the_default_rule_fires_on_stalls_that_keep_coming_back() -> None:
    """Stalls that each end before a minute (a task fits again, then the disks fill
    again) fire it too, on the third within 15 minutes."""
    st = disk_rule()
    st.handle(Evaluate(0.0, metrics(0, 0)))
    for t, stalls in ((100.0, 1), (200.0, 2)):
        st.handle(Evaluate(t, metrics(1, stalls)))
        st.handle(Evaluate(t + 20.0, metrics(0, stalls)))
    assert all(a.state != "firing" for a in st.alerts())
    st.handle(Evaluate(300.0, metrics(1, 3)))
    st.handle(Evaluate(320.0, metrics(0, 3)))  # ended, but three in 15 minutes
    (n,) = [c for c in st.handle(Evaluate(360.0, metrics(0, 3))) if isinstance(c, Notify)]
    assert n.alert.state == "firing"


# ----------------------------------------------------------------------------- end to end

KIB = 1024
#: a load's file output: two fit a 12 MiB disk (12,288 KiB) with 288 KiB to spare
LOAD = 6000 * KIB
#: a skim's file output (1000 KiB), declared as 1 MiB: more than a full disk has spare
SKIM = MB


def load(i: int) -> File:
    """A 6000 KiB file output."""
    path = output_path(f"events-{i}.bin")
    block = hashlib.sha256(str(i).encode()).digest() * 2000  # 62.5 KiB
    with open(path, "wb") as f:
        for _ in range(LOAD // len(block)):
            f.write(block)
    return File(path)


def skim(events: str) -> File:
    """A file output of a sixth of its load's (1000 KiB)."""
    path = output_path("skim.bin")
    with open(events, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read()[::6])
    return File(path)


@pytest.mark.anyio
async def test_worker_processes_with_small_disks_stall_and_the_status_and_log_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three worker processes with 12 MiB disks stall, whatever the order of the
    scheduler's sets (PYTHONHASHSEED): six loads of 6000 KiB file outputs, held by the
    client until all are done, can only lie two on each disk, which leaves 288 KiB free
    on each; then a skim of each load, declaring 1 MiB of output, fits no disk, and
    the pool runs nothing. The watchdog declares the stall after ``stall_timeout``
    (2 s here): the status names it and the scheduler warns once per stall; the stall
    breaker then drops a load to make room (made again for its skim), and every skim
    ends well. Gated on the status and the futures, bounded."""
    caplog.set_level(logging.INFO, logger="corral")
    with anyio.fail_after(120):
        async with Cluster(
            processes=3, threads_per_worker=1, disk_per_worker="12MiB", stall_timeout=2.0
        ) as c:
            loads = c.map(load, range(6))
            for f in loads:
                await f.wait()
            assert [f.status for f in loads] == ["finished"] * 6
            skims = c.map(skim, loads, resources={"disk": SKIM})
            del loads, f  # only the skims read them now: the breaker may drop one

            async def stalled() -> Any:
                st = await c.status()
                return st if st["disk_stalls"] or st["disk_stalls_total"] else None

            status = jsonable(await wait_until(stalled, "a disk stall in the status", step=0.1))
            for f in skims:
                await f.wait()
            assert [f.status for f in skims] == ["finished"] * 6
            after = jsonable(await c.status())
    assert status["disk_stalls_total"] == {"*": 1}
    assert after["disk_stalls"] == [] and after["disk_dropped"] >= 1
    text = " ".join(status_text(status).split())
    assert "disk stalls so far: pool any" in text
    for stall in status["disk_stalls"]:  # (the breaker may end it as soon as it is told)
        assert stall["pool"] == "*" and len(stall["workers"]) == 3
        assert stall["disk_used"] == 6 * LOAD and stall["waiting"] == [["skim", 6]]
        assert "disk stalled in pool any for" in text and "Give the workers" in text
    warned = [r for r in caplog.records if "disk stall in pool any:" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "6 ready tasks wait for disk (skim 6)" in warned[0].getMessage()


def big_file() -> File:
    path = output_path("big.bin")
    with open(path, "wb") as f:
        f.write(b"x" * (5 * MB))
    return File(path)


@pytest.mark.anyio
async def test_a_file_output_that_does_not_fit_is_told_at_info_with_what_comes_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's line is no warning: the scheduler handles the try (a free retry
    where it fits; a task that cannot fit fails with an error that says what to give),
    and the line says so."""
    caplog.set_level(logging.INFO, logger="corral")
    with anyio.fail_after(60):
        async with Cluster(workers=1, disk_per_worker="4MiB") as c:
            with pytest.raises(TaskTooBigForDisk):
                await c.submit(big_file)
    (line,) = [r for r in caplog.records if "file output did not fit on disk" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert "the scheduler retries it on a worker with the room" in line.getMessage()
