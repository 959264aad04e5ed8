"""The scheduler's figures of a worker's memory stay fresh while it crosses no fence.

``corral_memory_bytes``, ``status()["memory"]``, the monitoring database's
``resource_samples`` and the dashboard read a worker's latest ``WorkerMemoryReport``.
A worker used to send one only when it started or stopped throttling, spilled, its disk
use moved or a thread was abandoned: a worker holding 100 MB of outputs in memory, far
from every fence, showed 0 bytes held and the RSS of its last report. Now its memory
tick also reports when the bytes it holds in memory or its RSS moved
(:class:`actors.memory.ReportPacing`), at most once a second, and never per task.

The pacing is a pure rule, tested with exact times and figures; the worker actor is
tested with its RSS set by the test (``probe``) and a recorder for a scheduler; an
embedded cluster end to end, through the metrics, the status, the dashboard's snapshot
and the monitoring database. Every wait is bounded and gated on what was reported.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from dask._task_spec import Task

from actors.memory import REPORT_EVERY, REPORT_MIN_STEP, REPORT_SETTLE, ReportPacing
from actors.protocol import ToRun
from actors.scheduler import Scheduler
from actors.scheduler_events import GraphSubmitted, WorkerJoined, WorkerLeft
from actors.worker import Worker
from runtime import Cluster
from runtime.dashboard import build_snapshot
from runtime.errors import size_text
from runtime.kernel import ActorSystem, handles
from runtime.log import get_logger
from runtime.messages import (
    AlertsReply,
    ConfirmHolds,
    DropKeys,
    MetricsRequest,
    RunTasks,
    StatusReply,
    StatusRequest,
    WorkerHolds,
    WorkerMemoryReport,
)
from runtime.metrics import render
from tests.helpers import (
    FixedClock,
    PostedRef,
    SchedulerRecorder,
    log_lines,
    scraped,
    specs_for,
    wait_until,
)

MB = 2**20
GIB = 2**30


# ----------------------------------------------------------------------------- the rule


def test_a_move_of_a_step_is_reported_at_most_once_a_second() -> None:
    pacing = ReportPacing.of(1000 * MB, now=100.0, rss=200 * MB)
    assert pacing.step == 10 * MB  # a hundredth of the limit
    assert (pacing.at, pacing.memory_bytes, pacing.rss) == (100.0, 0, 200 * MB)
    # Nothing moved: never due, however long.
    assert not pacing.due(100.0 + 3600, 0, 200 * MB)
    # Outputs held: a step or more is a move, due once a second has passed.
    assert not pacing.due(100.5, 50 * MB, 200 * MB)
    assert pacing.due(100.0 + REPORT_EVERY, 50 * MB, 200 * MB)
    pacing.sent(101.0, 50 * MB, 200 * MB)
    assert not pacing.due(101.9, 0, 200 * MB)  # dropped, but a report went out just now
    assert pacing.due(102.0, 0, 200 * MB)
    # RSS alone: a move of a step up or down.
    pacing.sent(102.0, 0, 200 * MB)
    assert pacing.due(103.0, 0, 210 * MB) and pacing.due(103.0, 0, 190 * MB)
    assert not pacing.due(103.0, 0, 209 * MB)
    # A report sent for another reason (a spill, the disk) counts as the latest.
    pacing.sent(103.5, 0, 230 * MB)
    assert not pacing.due(104.0, 0, 230 * MB) and not pacing.due(105.0, 0, 235 * MB)


def test_a_change_smaller_than_a_step_is_reported_once_it_settled() -> None:
    pacing = ReportPacing.of(1000 * MB, now=0.0, rss=200 * MB)
    assert not pacing.due(REPORT_EVERY, 3 * MB, 200 * MB)  # less than a step: not yet
    assert not pacing.due(REPORT_SETTLE - 0.01, 3 * MB, 200 * MB)
    assert pacing.due(REPORT_SETTLE, 3 * MB, 200 * MB)  # exact within settle seconds
    pacing.sent(REPORT_SETTLE, 3 * MB, 200 * MB)
    # RSS jitter under a step is never reported (results carry RSS anyway).
    assert not pacing.due(REPORT_SETTLE + 3600, 3 * MB, 205 * MB)


def test_the_first_measured_rss_is_due_however_small_against_the_step() -> None:
    """A worker starts having told no RSS (0): the first one measured is due once a
    second passed, even far below a step (64 GiB: a step of 655 MB), then paced."""
    pacing = ReportPacing.of(64 * GIB, now=0.0, rss=0)
    assert not pacing.due(REPORT_EVERY, 0, 0)  # not measured yet: nothing to say
    assert not pacing.due(REPORT_EVERY - 0.01, 0, 67 * MB)
    assert pacing.due(REPORT_EVERY, 0, 67 * MB)
    pacing.sent(REPORT_EVERY, 0, 67 * MB)
    assert not pacing.due(3600.0, 0, 70 * MB)  # told: moves under a step wait


def test_the_step_is_at_least_a_mib() -> None:
    assert ReportPacing.of(10 * MB, 0.0, 0).step == REPORT_MIN_STEP == MB
    assert ReportPacing.of(64 * GIB, 0.0, 0).step == int(64 * GIB * 0.01)


# ----------------------------------------------------------------------------- a worker


def make(nbytes: int) -> bytes:
    return b"m" * nbytes


def run(key: str, func: Callable[..., Any], *args: Any) -> ToRun:
    return ToRun(key, Task(key, func, *args), key.split("-")[0], ())


async def first_report(
    tmp_path: Path, memory: int, **options: Any
) -> tuple[WorkerMemoryReport, SchedulerRecorder]:
    """The first memory report of an idle worker of ``memory`` bytes whose RSS is
    100 MB (``options``: more of its ``memory_options``), and the scheduler stand-in."""
    sched = SchedulerRecorder()
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=memory, probe=lambda: 100 * MB,
                memory_options={"spill_dir": str(tmp_path), "interval": 0.01, **options},
            )  # fmt: skip
            await system.spawn(w, "w1")
            await sched.until(lambda: bool(sched.reports))
    return sched.reports[0], sched


@pytest.mark.anyio
async def test_an_idle_worker_reports_its_rss_without_running_a_task(tmp_path: Path) -> None:
    """A worker that joined and runs nothing tells its RSS (100 MB of a 64 GiB limit,
    far below a step) within about a second. Before, the scheduler, the metrics and the
    dashboard showed RSS 0 until its first result came back (an audit saw 90 s of 0)."""
    report, sched = await first_report(tmp_path, 64 * GIB)
    assert report.rss == 100 * MB and not sched.done


@pytest.mark.anyio
async def test_a_worker_reports_outputs_held_and_rss_that_move_below_every_fence(
    tmp_path: Path,
) -> None:
    """1000 MB of memory, RSS at 100 MB: five outputs of 8 MB are held (no fence
    near), then RSS grows to 300 MB (below the throttle fence, 700 MB), then the
    outputs are dropped. Each move reaches the scheduler in a report, none of them
    throttled. Before, none of them did: no report was sent at all."""
    sched = SchedulerRecorder()
    rss = [100 * MB]
    keys = tuple(f"make-{i}" for i in range(5))
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=1000 * MB, probe=lambda: rss[0],
                memory_options={"spill_dir": str(tmp_path), "interval": 0.01},
            )  # fmt: skip
            ref = await system.spawn(w, "w1")
            ref.post(RunTasks(tuple(run(k, make, 8 * MB) for k in keys)))
            await sched.until(lambda: sched.done.keys() >= set(keys))
            held = w.data.memory_bytes
            assert held >= 40 * MB
            await sched.until(lambda: any(r.memory_bytes == held for r in sched.reports))
            rss[0] = 300 * MB
            await sched.until(lambda: sched.reports[-1].rss == 300 * MB)
            ref.post(DropKeys(keys))
            await sched.until(lambda: sched.reports[-1].memory_bytes == 0)
    assert not any(r.throttled or r.spilled_bytes for r in sched.reports)
    assert sched.reports[-1].limit == 1000 * MB and sched.reports[-1].rss == 300 * MB


@pytest.mark.anyio
@pytest.mark.parametrize(("terminate", "fence"), [(0.8, 800 * MB), (0.95, 950 * MB), (None, None)])
async def test_a_worker_reports_its_own_terminate_fence(
    tmp_path: Path, terminate: float | None, fence: int | None
) -> None:
    """A worker's memory report carries its terminate fence in bytes, where its
    ``memory_options`` put it (None: turned off), which a client compares its RSS with
    (review 1207b, finding 7: the client used the default fraction)."""
    report, _ = await first_report(tmp_path, 1000 * MB, terminate=terminate)
    assert report.terminate_at == fence


class HoldsRecorder(SchedulerRecorder):
    """The scheduler stand-in, also taking the worker's answer to ConfirmHolds."""

    @handles(WorkerHolds)
    def holds(self, msg: WorkerHolds) -> None:
        self.messages.append(msg)


@pytest.mark.anyio
async def test_a_worker_asked_what_it_holds_reports_its_memory(tmp_path: Path) -> None:
    """The scheduler asks each worker that registers what it holds. A worker whose
    memory does not move sends no report of its own, so the scheduler knew its RSS only
    from its first task's result: a requeued block's idle worker showed 0 in the status,
    the dashboard and the monitoring database. It answers with its memory too."""
    sched = HoldsRecorder()
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=1000 * MB, probe=lambda: 100 * MB,
                memory_options={"spill_dir": str(tmp_path), "interval": 0.01},
            )  # fmt: skip
            ref = await system.spawn(w, "w1")
            await wait_until(lambda: w.state.governor.rss == 100 * MB, "a memory sample")
            ref.post(ConfirmHolds())
            await sched.until(lambda: any(isinstance(m, WorkerHolds) for m in sched.messages))
            with anyio.fail_after(5):  # sent with the answer; a still worker sends no other
                await sched.until(lambda: any(r.rss == 100 * MB for r in sched.reports))


# ----------------------------------------------------------------------------- a cluster


def big(i: int) -> bytes:
    return b"y" * 20_000_000


def _sampled(db: Path, worker: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
        row = con.execute(
            "SELECT memory_bytes FROM resource_samples WHERE worker = ? ORDER BY time DESC LIMIT 1",
            (worker,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.anyio
async def test_outputs_held_in_memory_show_in_metrics_status_dashboard_and_database(
    tmp_path: Path,
) -> None:
    """The audit's run: one worker process with 1 GiB holds five outputs of 20 MB,
    far below its fences. ``corral_memory_bytes``, ``status()["memory"]``, the
    dashboard's worker and ``resource_samples`` all show the 100 MB, and the RSS the
    scheduler shows is the worker's current one. Before, all of them read 0."""
    db = tmp_path / "monitoring.db"
    held = 5 * 20_000_000
    with anyio.fail_after(60):
        # A worker process: an in-process worker's RSS is the test process's, which the
        # tests before may have left past this worker's spill fence (its outputs would
        # be spilled, not held).
        async with Cluster(
            processes=1, memory_per_worker=GIB, monitoring=db, monitoring_interval=0.2
        ) as c:
            futures = [c.submit(big, i) for i in range(5)]
            await c.wait_for_workers(1)
            for f in futures:
                await f
            (wid,) = c.scheduler_state.workers

            async def memory_bytes() -> float:
                text = render(await c._manager.ask(MetricsRequest())).decode()
                return scraped(text, "corral_memory_bytes").get("default", 0.0)

            await wait_until(lambda: _at_least(memory_bytes, held), "corral_memory_bytes", limit=20)
            status: StatusReply = await c._manager.ask(StatusRequest())
            report = status.memory[wid]
            assert report.memory_bytes >= held and not report.throttled
            assert report.rss > held  # the worker holds them: its RSS counts them
            snap = build_snapshot(
                await c._manager.ask(MetricsRequest(details=True)), status, AlertsReply(), 0.0
            )
            (shown,) = snap["workers"]
            assert shown["memory_bytes"] == report.memory_bytes
            assert shown["rss"] == report.rss
            await wait_until(lambda: _sampled(db, wid) >= held, "resource_samples", limit=20)
            del futures


async def _at_least(value: Callable[[], Any], least: float) -> bool:
    return bool(await value() >= least)


def nap(i: int) -> int:
    time.sleep(0.3)
    return i


def _whole_rss(proc: psutil.Process) -> int:
    """The RSS of a worker process with its task processes, as psutil reads it."""
    return int(sum(p.memory_info().rss for p in (proc, *proc.children(recursive=True))))


def _samples(db: Path, worker: str) -> list[tuple[float, int]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
        q = "SELECT time, rss FROM resource_samples WHERE worker = ? ORDER BY time"
        return [(float(t), int(r)) for t, r in con.execute(q, (worker,))]


def _at(rows: list[tuple[float, int]], when: float) -> int:
    """The database's RSS of a worker at ``when``: its latest row at or before it."""
    return next((rss for t, rss in reversed(rows) if t <= when), 0)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_process_worker_s_rss_is_the_worker_with_its_task_processes(
    tmp_path: Path,
) -> None:
    """User audit (monitor, defect 2): a worker with ``execution: process`` and 2 task
    processes (about 164 MiB in all) showed one task process's RSS (about 44 MiB) after
    each batch of results in ``status()["rss"]``, ``corral_worker_rss_bytes`` and the
    database's ``resource_samples``, the whole between. Now, after each of 5 rounds of
    4 tasks, the status says what psutil reads of the worker and its task processes,
    and every sample the database holds from the first round to the last does too
    (within 25%: the figures move a little while they are read)."""
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(100):
        async with Cluster(
            processes=1, threads_per_worker=2, memory_per_worker=GIB,
            memory_options={"execution": "process"}, monitoring=db, monitoring_interval=0.2,
        ) as c:  # fmt: skip
            await c.wait_for_workers(1)
            (info,) = (await c.status())["workers"]
            proc, wid = psutil.Process(info.pid), info.worker_id
            truths: list[int] = []
            shown: list[int] = []
            start = end = 0.0
            for n in range(5):
                assert await c.gather(c.map(nap, range(4), pure=False)) == list(range(4))
                shown.append((await c.status())["rss"][wid])
                truths.append(_whole_rss(proc))
                assert abs(shown[-1] - truths[-1]) <= 0.25 * truths[-1], (shown, truths)
                end = time.time()
                if not n:  # from here, the database must have the whole
                    await wait_until(
                        lambda: _at(_samples(db, wid), time.time()) > 0.75 * truths[0],
                        "a resource sample of the worker with its task processes",
                        limit=20,
                    )
                    start = time.time()
    low, high = 0.75 * min(truths), 1.25 * max(truths)
    rows = _samples(db, wid)
    window = [_at(rows, start)] + [rss for t, rss in rows if start < t <= end]
    assert all(low <= rss <= high for rss in window), ([r >> 20 for r in window], truths)


@pytest.mark.anyio
async def test_a_thread_worker_far_past_its_limit_is_a_warning_in_the_status(
    tmp_path: Path,
) -> None:
    """User audit (memprio, defect 2): one task took a 1 GiB thread worker to 3.1 GiB
    and only the worker's log said so. Now its memory reports carry the highest RSS past
    its terminate fence (``past_peak``), and the scheduler shows a warning in
    ``status()["warnings"]`` naming the worker, its limit, that peak, the category of
    the task it ran and what to do; it ends when the worker leaves. The worker actor
    runs a task while its RSS (set by the test) is at 3.1 GiB; the reports it sent go
    to a scheduler shell."""
    import threading

    sched = SchedulerRecorder()
    rss = [100 * MB]
    release = threading.Event()
    peak = int(3.1 * GIB)
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=GIB, probe=lambda: rss[0],
                memory_options={"spill_dir": str(tmp_path), "interval": 0.01},
            )  # fmt: skip
            ref = await system.spawn(w, "w1")
            ref.post(RunTasks((run("chunk-0", release.wait, 30),)))
            rss[0] = peak
            await sched.until(lambda: any(r.past_peak == peak for r in sched.reports))
            rss[0] = 100 * MB
            release.set()
            await sched.until(lambda: "chunk-0" in sched.done)
    reports = [r for r in sched.reports if r.past_peak]
    assert reports[0].past_peak >= int(0.95 * GIB) and reports[-1].past_peak == peak

    s = Scheduler(lambda: PostedRef(), lambda: PostedRef())  # type: ignore[arg-type, return-value]
    s.clock = FixedClock()  # type: ignore[assignment]
    s._log = get_logger("corral", actor="scheduler")
    s.workers["w1"] = PostedRef()  # type: ignore[assignment]
    s._handle(WorkerJoined("j", 1.0, worker="w1", cores=2, memory=GIB))
    specs = specs_for(s.state, {"chunk-0": []}, ["chunk-0"])
    s._handle(GraphSubmitted("g", 2.0, specs=specs, wanted=("chunk-0",)))
    assert s.state.tasks["chunk-0"].worker == "w1"
    assert not s.status(StatusRequest())["warnings"]
    for report in reports:
        s.worker_memory(report)
    (warning,) = s.status(StatusRequest())["warnings"]
    assert warning.startswith(
        "worker w1: its RSS reached 3.10 GiB, 310% of its memory limit of 1.00 GiB"
    )
    assert "tasks of chunk;" in warning and "execution 'process'" in warning, warning
    assert s.metrics(MetricsRequest())["pools"]["default"].workers_past_limit == 1
    s._handle(WorkerLeft("l", 3.0, worker="w1", cause="drained"))
    s.worker_memory(reports[-1])  # (a late report of a worker gone: ignored)
    assert not s.status(StatusRequest())["warnings"]
    pools = s.metrics(MetricsRequest())["pools"].values()
    assert sum(p.workers_past_limit for p in pools) == 0


def _shell() -> Scheduler:
    """A scheduler shell with worker ``w1`` (1 GiB) joined, its clock fixed."""
    s = Scheduler(lambda: PostedRef(), lambda: PostedRef())  # type: ignore[arg-type, return-value]
    s.clock = FixedClock()  # type: ignore[assignment]
    s._log = get_logger("corral", actor="scheduler")
    s.workers["w1"] = PostedRef()  # type: ignore[assignment]
    s._handle(WorkerJoined("j", 1.0, worker="w1", cores=2, memory=GIB))
    return s


@pytest.mark.anyio
async def test_a_floor_past_the_resume_mark_is_a_warning_in_the_status(tmp_path: Path) -> None:
    """User audit (daskmig, finding 2): the floor's warning, 'memory that is not outputs
    is 491.6 MiB ...', went only to the worker's own log; status()["warnings"] did not
    have it, and the run failed 15 s later. A worker actor idle at 0.9 of its limit (its
    RSS set by the test) measures that floor and reports it with its warning; a
    scheduler shell fed its reports shows it, until a report says it is under the mark."""
    sched = SchedulerRecorder()
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=GIB, probe=lambda: int(0.9 * GIB),
                memory_options={"spill_dir": str(tmp_path), "interval": 0.01},
            )  # fmt: skip
            await system.spawn(w, "w1")
            await sched.until(lambda: any(r.floor for r in sched.reports))
    report = next(r for r in sched.reports if r.floor)
    assert report.floor == int(0.9 * GIB)
    assert report.floor_warning.startswith("memory that is not outputs is 0.90 GiB")
    s = _shell()
    assert not s.status(StatusRequest())["warnings"]
    s.worker_memory(report)
    assert s.status(StatusRequest())["warnings"] == (f"worker w1: {report.floor_warning}",)
    s.worker_memory(dataclasses.replace(report, floor=0, floor_warning=""))
    assert not s.status(StatusRequest())["warnings"]


def test_a_thread_worker_climbing_past_its_limit_is_logged_at_each_doubling() -> None:
    """User audit (daskmig, finding 6): 35 WARNINGs in 3.5 s for one task growing to
    1.5 GiB on a 600 MiB worker, one per 5% report. The shell's status follows every
    report; its log, the first crossing and each doubling of the excess."""
    s = _shell()
    specs = specs_for(s.state, {"hog-0": []}, ["hog-0"])
    s._handle(GraphSubmitted("g", 2.0, specs=specs, wanted=("hog-0",)))
    limit = 600 * MB
    with log_lines("corral", logging.WARNING) as log:
        for peak in range(612 * MB, 1580 * MB, 30 * MB):
            s.worker_memory(WorkerMemoryReport("w1", True, peak, 420 * MB, limit, past_peak=peak))
            (warning,) = s.status(StatusRequest())["warnings"]
            assert warning.startswith(f"worker w1: its RSS reached {size_text(peak)}")
    lines = [ln for ln in log.lines if "worker past its memory limit" in ln]
    peaks = [int(ln.split("peak=")[1].split()[0]) // MB for ln in lines]
    assert peaks == [612, 672, 762, 942, 1302]
