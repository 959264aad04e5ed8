"""Storage over time (docs/files.md, "Storage over time"): the scheduler core counts each
worker's reported disk use, the outputs copied between workers (peer fetches, replica
copies, evacuations) and the outputs it recovered, and puts each transfer and recovery
on its monitoring feed. First the pure core, with exact values; then a real cluster of
worker processes whose monitoring database holds the rows and whose status sums them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors import worker_state as wsm
from actors.memory import MemoryConfig
from actors.protocol import TaskResult, ToRun
from actors.scheduler_events import ReplicasCopied, WorkerLeaving, WorkerLeft, WorkerMemory
from actors.scheduler_state import SchedulerState
from actors.storage_state import DEPARTED_KEPT, StorageLedger
from actors.worker_state import WorkerState
from policies import REGISTRY
from runtime.errors import MonitoringDBError
from runtime.graph import Task
from runtime.messages import StatusReply, StorageStatus, WorkerStorage
from runtime.monitordb import SCHEMA_VERSION, UPGRADED_VERSIONS, MonitorWriter, open_db
from runtime.report import SECTIONS, build_report
from tests.helpers import (
    GB,
    MB,
    Factory,
    event,
    files_released,
    finish,
    join,
    leave,
    load_bench,
    make_state,
    run,
    submit,
    worker_of,
)

__all__ = ["make_state"]

LIMIT = 100


def records(s: SchedulerState, kind: str) -> list[tuple[Any, ...]]:
    """The feed's records of ``kind`` so far (the feed is read from the start)."""
    entries, _, _ = s.feed_since(0, 10_000)
    return [r for _, recs in entries for r in recs if r[0] == kind]


def disk(s: SchedulerState, worker: str, used: int) -> None:
    run(s, event(WorkerMemory, worker=worker, throttled=False, rss=0, throttle_at=0, limit=0,
                 disk_used=used))  # fmt: skip


# ----------------------------------------------------------------------------- the core


def test_a_peer_fetch_is_a_transfer_from_the_holder(make_state: Factory) -> None:
    s = make_state(monitor=True, placement="least-loaded")
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": [], "b": [], "c": ["a", "b"]}, ["c"])
    wa, wb = worker_of(s, "a"), worker_of(s, "b")
    assert wa != wb
    finish(s, wa, "a", nbytes=100)
    finish(s, wb, "b", nbytes=300)
    here = worker_of(s, "c")
    (other, there) = ("a", wa) if here == wb else ("b", wb)
    size = 100 if other == "a" else 300
    # The worker kept the copy (fetched) and says where it came from and how long it took.
    finish(s, here, "c", fetched=(other,), fetches=((other, there, size, 0.25),), nbytes=7)
    assert records(s, "transfer") == [("transfer", other, "fetch", size, there, here, 0.25)]
    led = s.storage
    assert (dict(led.transfers), dict(led.transfer_bytes)) == ({"fetch": 1}, {"fetch": size})
    assert (dict(led.bytes_in), dict(led.bytes_out)) == ({here: size}, {there: size})


def test_a_worker_reports_each_copy_it_fetched_with_its_peer_and_time() -> None:
    """The worker's core: the inputs fetched for a task come back with its result, as
    ``(key, peer, nbytes, seconds)`` from the request to the answer, kept or not."""
    ws = WorkerState("w", 2, MemoryConfig.of(GB, {}))
    t = ToRun("t", Task("t", _noop), "t", (("x", ("p1",)), ("y", ("p2",))), False, ())
    assert ws.handle(wsm.TasksAssigned(1.0, (t,))) == [
        wsm.Fetch(1, "p1", ("x",)),
        wsm.Fetch(2, "p2", ("y",)),
    ]
    ws.handle(wsm.InputsFetched(1.5, 2, (("y", "Y", 4),)))
    ws.handle(wsm.InputsFetched(3.5, 1, (("x", "X", 5),)))
    out = ws.handle(wsm.TasksFinished(4.0, ((TaskResult("t", "ok", 3.5, 4.0, 9, 100), "v"),)))
    (report,) = [c for c in out if isinstance(c, wsm.ReportDone)]
    assert report.results[0].fetches == (("y", "p2", 4, 0.5), ("x", "p1", 5, 2.5))
    assert ws.fetch_log == {} and ws._sent_at == {}


def _noop() -> None:
    return None


def test_a_replica_copy_is_a_transfer_with_its_duration_and_a_loss_is_kept_by_it(
    make_state: Factory,
) -> None:
    s = make_state(monitor=True)
    join(s, "w1")
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"])
    join(s, "w2")
    finish(s, "w1", "long-0", duration=40.0, nbytes=5 * MB)  # asks w2 for a copy
    run(s, event(ReplicasCopied, worker="w2", asked=("long-0",), got=("long-0",)))
    # The event clock moves 1 s per event: the copy took 1 s.
    assert records(s, "transfer") == [("transfer", "long-0", "replica", 5 * MB, "w1", "w2", 1.0)]
    leave(s, "w1")
    assert records(s, "recovery") == [("recovery", "long-0", "long", "w1", "replica")]
    assert dict(s.storage.recoveries) == {"replica": 1}
    assert dict(s.storage.lost_by_worker) == {"w1": 1}
    assert s.storage.bytes_in["w2"] == 5 * MB and s.storage.bytes_out["w1"] == 5 * MB


def test_a_lost_output_without_a_replica_is_one_recompute_per_loss(make_state: Factory) -> None:
    s = make_state(
        unknown_long=False, monitor=True, replication=REGISTRY.create("replication", "none")
    )
    join(s, "w1")
    join(s, "w2")
    submit(s, {"load-0": [], "skim-0": ["load-0"], "skim-1": ["load-0"]}, ["skim-0", "skim-1"])
    w = worker_of(s, "load-0")
    finish(s, w, "load-0")
    leave(s, w)
    assert records(s, "recovery") == [("recovery", "load-0", "load", w, "recomputed")]
    w2 = worker_of(s, "load-0")
    finish(s, w2, "load-0")
    leave(s, w2)
    assert records(s, "recovery") == [
        ("recovery", "load-0", "load", w, "recomputed"),
        ("recovery", "load-0", "load", w2, "recomputed"),
    ]
    assert dict(s.storage.recoveries) == {"recomputed": 2}


def test_a_pruned_input_made_again_is_not_a_recovery(make_state: Factory) -> None:
    """b (wanted) is lost and made again, which makes its pruned input a again: one
    recovery, b's. An input still on the lost worker that b needs again is one too."""
    s = make_state(monitor=True)
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a")
    finish(s, "w1", "b")
    files_released(s, "a")  # the registry pruned a
    s.handle(event(WorkerLeft, worker="w1", cause="preempted"))
    assert records(s, "recovery") == [("recovery", "b", "b", "w1", "recomputed")]
    assert s.tasks["a"].state == "queued"  # made again, for b


def test_an_evacuation_is_a_transfer_timed_from_leaving_to_left(make_state: Factory) -> None:
    s = make_state(monitor=True, replication=REGISTRY.create("replication", "none"))
    join(s, "w1")
    submit(s, {"x-0": [], "use-0": ["x-0"]}, ["use-0"])
    finish(s, "w1", "x-0", nbytes=2 * MB)
    join(s, "w2")
    run(s, event(WorkerLeaving, worker="w1", cause="preempted"))
    join(s, "w3")  # one more event: 2 s from leaving to left
    run(s, event(WorkerLeft, worker="w1", cause="preempted", evacuated=(("x-0", "w2"),)))
    assert records(s, "transfer") == [("transfer", "x-0", "evacuation", 2 * MB, "w1", "w2", 2.0)]
    assert records(s, "recovery") == []  # evacuated: not lost


def test_disk_use_and_its_peak_per_worker(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    for used in (10, 50, 20):
        disk(s, "w1", used)
    disk(s, "w2", 5)
    assert s.storage.disk_used == {"w1": 20, "w2": 5}
    assert s.storage.disk_peak == {"w1": 50, "w2": 5}
    leave(s, "w1")
    assert s.storage.disk_used == {"w2": 5} and s.storage.disk_peak["w1"] == 50
    join(s, "w1")  # a new worker under the old name: its own peak, not the old one's
    assert "w1" not in s.storage.disk_peak
    disk(s, "w1", 7)
    join(s, "w1")  # the same worker registering again (a reconnect) keeps its peak
    assert s.storage.disk_peak["w1"] == 7


def test_the_latest_workers_to_leave_are_kept_and_older_ones_let_go() -> None:
    # A manager that runs for days: workers come and go by thousands under new names.
    led = StorageLedger()
    n = DEPARTED_KEPT + 5
    for i in range(n):
        w = f"w{i}"
        led.joined(w)
        led.disk(w, 10)
        led.transfer("fetch", "k", 3, "w-src", w, None)
        led.recovery("k", "c", w, "recomputed")
        led.forget(w)
    kept = {f"w{i}" for i in range(5, n)}
    assert set(led.disk_peak) == kept and set(led.lost_by_worker) == kept
    assert set(led.bytes_in) == kept and dict(led.bytes_out) == {"w-src": 3 * n}
    assert led.transfers["fetch"] == n and led.recoveries["recomputed"] == n  # all of them
    led.joined("w7")  # a name back, a new life: no longer among those that left
    assert "w7" not in led.disk_peak and "w7" in led.bytes_in
    led.forget("w0")
    led.forget("w200")  # 101 left now: the first to leave goes, not w7, which is back
    assert "w5" not in led.bytes_in and "w6" in led.bytes_in and "w7" in led.bytes_in


def test_without_a_reader_nothing_goes_on_the_feed_but_the_counts_are_kept(
    make_state: Factory,
) -> None:
    s = make_state(replication=REGISTRY.create("replication", "none"))
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a")
    leave(s, "w1")
    assert not s.feed and dict(s.storage.recoveries) == {"recomputed": 1}


def test_the_ledger_alone() -> None:
    led = StorageLedger()
    led.copy_sent("k", "w2", "w1", 10.0)
    assert led.copy_ended("k", "w2", 12.5) == ("w1", 2.5)
    assert led.copy_ended("k", "w2", 13.0) == ("", None)  # asked once
    assert led.left_after("w1", 5.0) is None
    led.leaving("w1", 3.0)
    led.leaving("w1", 4.0)  # the first time counts
    assert led.left_after("w1", 5.0) == 2.0
    assert led.transfer("fetch", "k", 9, "", "w3", None) == ("transfer", "k", "fetch", 9, "", "w3",
                                                             None)  # fmt: skip
    assert dict(led.bytes_out) == {} and dict(led.bytes_in) == {"w3": 9}


def test_the_status_dict_has_storage_per_worker() -> None:
    storage = StorageStatus({"fetch": 2}, {"fetch": 30}, {"replica": 1},
                            {"w1": WorkerStorage(disk=100, disk_used=10, bytes_in=30)})  # fmt: skip
    out = StatusReply(storage=storage).to_dict()["storage"]
    assert out["transfers"] == {"fetch": 2} and out["recoveries"] == {"replica": 1}
    assert out["workers"]["w1"]["disk"] == 100 and out["workers"]["w1"]["bytes_in"] == 30


# ----------------------------------------------------------------------------- database


def test_a_database_of_version_1_is_refused_saying_what_it_lacks(tmp_path: Path) -> None:
    """Version 1 came before storage over time; version 2 is upgraded (test_monitordb)."""
    old = tmp_path / "old.db"
    MonitorWriter(old).close()
    conn = sqlite3.connect(old)
    conn.execute("UPDATE schema_version SET version = 1")
    conn.commit()
    conn.close()
    with pytest.raises(
        MonitoringDBError, match=r"older Corral wrote it.*no transfers or recoveries"
    ):
        open_db(old)
    with pytest.raises(MonitoringDBError, match="give --monitoring another path"):
        MonitorWriter(old)
    # (version 1 is refused, every version from 2 on is upgraded to the current one)
    assert 1 not in UPGRADED_VERSIONS and tuple(range(2, SCHEMA_VERSION)) == UPGRADED_VERSIONS


# ----------------------------------------------------------------------------- processes


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.mark.anyio
async def test_worker_processes_record_disk_transfers_and_recoveries(tmp_path: Path) -> None:
    """Three worker processes that spill every output; replicas of every output; one
    worker killed with SIGKILL mid-run. The run is right, and the database has the disk
    samples, the replica copies and the recoveries that status() counts."""
    bench = load_bench("files")
    db = tmp_path / "monitoring.db"
    wf = bench.Workflow(datasets=4, files=5, seed=3, load_s=0.05, skim_s=0.02, nbytes=64 * 1024)
    with anyio.fail_after(LIMIT):
        res = await bench.run_workflow(
            wf, workers=3, prune_depth=1, replicas=True, monitoring=db, kill_after=wf.n_files // 2
        )
    assert res.correct and res.killed
    storage = res.status["storage"]
    assert storage["transfers"].get("replica", 0) > 0
    copies = _rows(db, "SELECT key, bytes, source, target, duration FROM transfers "
                   "WHERE kind = 'replica'")  # fmt: skip
    assert len(copies) >= storage["transfers"]["replica"]  # more may come at the end
    assert all(b > 0 and s != t and d is not None and d >= 0 for _, b, s, t, d in copies)
    # The workers stopped with the cluster leave too (cause shutdown), after status():
    # the rows of the worker killed are the ones status() counted.
    recoveries = _rows(db, f"SELECT key, how FROM recoveries WHERE worker = '{res.killed}'")
    assert sum(storage["recoveries"].values()) == len(recoveries) > 0
    peak = _rows(db, "SELECT max(spilled_bytes), max(disk) FROM resource_samples")[0]
    assert peak[0] > 0 and peak[1] > 0
    assert max(w["disk_peak"] for w in storage["workers"].values()) >= peak[0]
    page = build_report(db)  # the report's storage plot: disks, copies, recoveries
    assert SECTIONS[-1] in page and "disk worker-1" in page
    assert "copied MiB: replica" in page and "recovered: " in page
