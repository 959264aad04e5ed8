"""The placement watchdog (actors/scheduler_stall.py, docs/monitoring.md#placement-stalls):
a pool with ready tasks and an idle connected worker where nothing is placed or finishes
for ``stall_timeout`` seconds is told once, with why each idle worker takes nothing, and
told again when something is placed. Not told while tasks run and finish, without a
worker, nor for a pool whose tasks wait for disk (the disk watchdog's own message).

Pure-core tests: events with a virtual clock in, exact commands out (``make_state``
validates every state at the end); then one cluster in this process whose task asks for
more memory than its worker has, and the warning its manager logs."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from actors.scheduler_events import (
    DiskStallBegan,
    Execute,
    GraphSubmitted,
    KeyErred,
    PlacementStallBegan,
    PlacementStallEnded,
    ReplicasCopied,
    Replicate,
    RetireWorker,
    TasksFinished,
    WorkerAway,
    WorkerJoined,
    WorkerLeft,
    WorkerMemory,
)
from actors.scheduler_records import PLACEMENT_STALL_ADVICE, placement_stall_parts
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.console import jsonable
from runtime.dashboard import build_snapshot
from runtime.errors import MemoryStalled
from runtime.messages import (
    AlertsReply,
    MetricsReply,
    PlacementStallInfo,
    PoolMetrics,
    StatusReply,
)
from runtime.metrics import samples
from tests.helpers import (
    GB,
    Factory,
    assigned,
    make_state,
    of,
    result,
    run,
    specs_for,
    status_text,
    wait_until,
)
from tests.test_disk_placement import tick
from tests.test_disk_stall import stalled_pool

__all__ = ["make_state"]  # the fixture, used by name


def at(s: SchedulerState, now: float, cls: type[Any], /, **fields: Any) -> list[Any]:
    """Handle one event of ``cls`` at ``now`` (the virtual clock)."""
    return run(s, cls(stimulus_id=f"{cls.__name__}-{now}", now=now, **fields))


def join(s: SchedulerState, now: float, worker: str, cores: int = 1, memory: int = GB) -> None:
    at(s, now, WorkerJoined, worker=worker, cores=cores, memory=memory)


def submit(s: SchedulerState, now: float, keys: list[str], **attrs: Any) -> list[Any]:
    specs = specs_for(s, dict.fromkeys(keys, ()), keys, attrs=dict.fromkeys(keys, attrs))
    return at(s, now, GraphSubmitted, specs=specs, wanted=tuple(keys))


def done(s: SchedulerState, now: float, worker: str, key: str) -> list[Any]:
    return at(s, now, TasksFinished, worker=worker, results=(result(key),))


def test_a_task_no_worker_has_the_memory_for_is_told_once_after_the_timeout(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1", cores=2)
    submit(s, 100.0, ["big"], resources={"memory": 8 * GB}, pool="default")
    assert not of(tick(s, 109.9), PlacementStallBegan)  # not before stall_timeout (10 s)
    (began,) = of(tick(s, 110.0), PlacementStallBegan)
    assert began.stall == PlacementStallInfo(
        pool="default",
        since=100.0,
        queued=1,
        workers=("w1",),
        busy=0,
        idle=(("w1", "resources", f"'big' needs {8 * GB:,} B of memory (it has {GB:,} B)"),),
        head="'big'",
    )
    assert not of(tick(s, 115.0), PlacementStallBegan)  # once per stall
    assert not of(tick(s, 200.0), PlacementStallBegan)
    m = s.pool_metrics(200.0)["default"]
    assert (m["placement_stalled"], m["placement_stalls"]) == (1, 1)
    # A worker with the memory joins and takes it: the stall ends, told once, with
    # how long the pool placed nothing.
    cmds = join_and_get(s, 230.0, "huge", memory=16 * GB)
    assert assigned(cmds) == {"huge": ["big"]}
    (ended,) = of(cmds, PlacementStallEnded)
    assert ended.stall is began.stall and ended.lasted == 130.0
    assert not s.placement_stalls
    m = s.pool_metrics(231.0)["default"]
    assert (m["placement_stalled"], m["placement_stalls"]) == (0, 1)  # the count stays
    assert not of(done(s, 240.0, "huge", "big") + tick(s, 300.0), PlacementStallEnded)


def join_and_get(s: SchedulerState, now: float, worker: str, memory: int) -> list[Any]:
    return at(s, now, WorkerJoined, worker=worker, cores=1, memory=memory)


def test_each_idle_worker_says_why_it_takes_nothing(make_state: Factory) -> None:
    """``w1`` has the cores but is throttled (a root is a producer, held back there);
    ``w2`` is not throttled but has one core of the two the task asks for."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1", cores=2, memory=4 * GB)
    join(s, 2.0, "w2", cores=1, memory=4 * GB)
    at(s, 3.0, WorkerMemory, worker="w1", throttled=True, rss=3 * GB, throttle_at=2 * GB,
       limit=4 * GB)  # fmt: skip
    assert not assigned(submit(s, 50.0, ["root"], resources={"cores": 2}))
    (began,) = of(tick(s, 60.0), PlacementStallBegan)
    assert [(w, why) for w, why, _ in began.stall.idle] == [
        ("w1", "throttled"),
        ("w2", "resources"),
    ]
    assert began.stall.idle[0][2] == (
        f"its RSS passed its throttle fence ({2 * GB:,} B): producers are held back until "
        "its memory falls"
    )
    assert began.stall.idle[1][2] == "'root' needs 2 cores (it has 1)"
    parts = placement_stall_parts(began.stall)
    assert parts["workers"] == "w1, w2"
    assert parts["waiting"] == "1 ready tasks placed nowhere, the first 'root'"
    assert parts["advice"] == (
        f"throttled: {PLACEMENT_STALL_ADVICE['throttled']}; "
        f"resources: {PLACEMENT_STALL_ADVICE['resources']}"
    )
    # w1's memory falls: it takes the root, and the stall ends with it.
    cmds = at(s, 70.0, WorkerMemory, worker="w1", throttled=False, rss=GB, throttle_at=2 * GB,
              limit=4 * GB)  # fmt: skip
    assert assigned(cmds) == {"w1": ["root"]}
    ((ended,),) = [of(cmds, PlacementStallEnded)]
    assert ended.lasted == 20.0


def test_no_stall_while_tasks_run_and_finish(make_state: Factory) -> None:
    """One worker runs a task at a time while the others wait their turn: each finish
    places the next, under stall_timeout apart, for longer than stall_timeout in all;
    then one long task on the only worker: the others wait for it, not a stall."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1")
    keys = [f"t-{i}" for i in range(6)]
    cmds = submit(s, 100.0, keys)
    now = 100.0
    for _ in range(5):
        (key,) = assigned(cmds)["w1"]
        now += 6.0
        cmds = done(s, now, "w1", key) + tick(s, now + 0.1)
        assert not of(cmds, PlacementStallBegan)
    assert s.queued_counts["*"] == 0  # the last one runs
    submit(s, now, ["x", "y"])  # queued behind t-5, which runs for long
    assert not of(tick(s, now + 100.0), PlacementStallBegan)  # busy, not stalled
    assert s.placement_since == {"*": now + 100.0}  # the clock starts again


def test_no_stall_without_a_worker(make_state: Factory) -> None:
    """Ready tasks and no worker: the no-worker alert's case, not a placement stall."""
    s = make_state()
    submit(s, 100.0, ["a", "b"])
    assert not of(tick(s, 200.0) + tick(s, 300.0), PlacementStallBegan)


def test_a_pool_stalled_for_disk_keeps_the_disk_message_alone(make_state: Factory) -> None:
    s, start = stalled_pool(make_state)
    cmds = [c for t in (5.0, 9.9, 10.0, 15.0, 25.0, 40.0) for c in tick(s, start + t)]
    assert of(cmds, DiskStallBegan)
    assert not of(cmds, PlacementStallBegan)
    assert not s.placement_stall_count


def test_every_worker_throttled_is_the_memory_watchdogs_case(make_state: Factory) -> None:
    """Every worker throttled with only producers to run: the run fails with
    MemoryStalled at stall_timeout, told there; no placement stall besides."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1")
    at(s, 2.0, WorkerMemory, worker="w1", throttled=True, rss=3 * GB, throttle_at=2 * GB,
       limit=4 * GB)  # fmt: skip
    submit(s, 50.0, ["root"])
    cmds = tick(s, 55.0) + tick(s, 60.0) + tick(s, 61.0)
    assert not of(cmds, PlacementStallBegan)
    (erred,) = of(cmds, KeyErred)
    assert isinstance(erred.error, MemoryStalled)


def test_a_throttled_idle_worker_beside_a_busy_one_is_backpressure_not_a_stall(
    make_state: Factory,
) -> None:
    """``w1`` is throttled (its producers held back) while ``w2`` runs a long task: the
    roots wait for ``w2`` to finish or for ``w1``'s memory to fall, for as long as that
    takes; not a stall. The clock starts again each ``stall_timeout``."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1")
    join(s, 2.0, "w2")
    at(s, 3.0, WorkerMemory, worker="w1", throttled=True, rss=3 * GB, throttle_at=2 * GB,
       limit=4 * GB)  # fmt: skip
    assert assigned(submit(s, 50.0, ["long"])) == {"w2": ["long"]}
    assert not assigned(submit(s, 51.0, ["r1", "r2"]))
    cmds = [c for t in (60.0, 61.0, 71.0, 100.0, 200.0) for c in tick(s, t)]
    assert not of(cmds, PlacementStallBegan)
    assert not s.placement_stalls and not s.placement_stall_count
    assert s.placement_since == {"*": 200.0}


def test_a_task_only_the_busy_worker_has_the_memory_for_waits_for_it(
    make_state: Factory,
) -> None:
    """A heterogeneous pool: ``big`` needs the memory only ``w1`` has, and ``w1`` runs
    a long task; ``w2`` is idle and too small. ``big`` waits for ``w1``: not a stall."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1", memory=8 * GB)
    join(s, 2.0, "w2", memory=GB)
    assert assigned(submit(s, 50.0, ["long"])) == {"w1": ["long"]}
    assert not assigned(submit(s, 51.0, ["big"], resources={"memory": 4 * GB}))
    cmds = [c for t in (61.0, 62.0, 100.0, 200.0) for c in tick(s, t)]
    assert not of(cmds, PlacementStallBegan)
    # w1 finishes: big goes there.
    assert assigned(done(s, 210.0, "w1", "long")) == {"w1": ["big"]}


def test_a_task_no_worker_of_the_pool_has_the_cores_for_is_a_stall_beside_a_busy_one(
    make_state: Factory,
) -> None:
    """``w1`` runs a long task, ``w2`` is idle; ``wide`` asks for 4 cores, which no
    worker of the pool has: no finish will place it, a stall."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1")
    join(s, 2.0, "w2")
    assert assigned(submit(s, 50.0, ["long"])) == {"w1": ["long"]}
    assert not assigned(submit(s, 51.0, ["wide"], resources={"cores": 4}))
    assert not of(tick(s, 60.9), PlacementStallBegan)
    (began,) = of(tick(s, 61.0), PlacementStallBegan)
    assert began.stall == PlacementStallInfo(
        pool="*",
        since=51.0,
        queued=1,
        workers=("w1", "w2"),
        busy=1,
        idle=(("w2", "resources", "'wide' needs 4 cores (it has 1)"),),
        head="'wide'",
    )


def test_a_stall_ends_when_its_only_idle_worker_leaves(make_state: Factory) -> None:
    """A pool without a connected worker is not a placement stall: the stall declared
    while ``w1`` was there ends when it leaves (status and metric with it)."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1")
    submit(s, 100.0, ["big"], resources={"memory": 8 * GB}, pool="default")
    (began,) = of(tick(s, 110.0), PlacementStallBegan)
    cmds = at(s, 120.0, WorkerLeft, worker="w1", cause="drained")
    (ended,) = of(cmds, PlacementStallEnded)
    assert ended.stall is began.stall and ended.lasted == 20.0
    assert not s.placement_stalls
    m = s.pool_metrics(121.0)["default"]
    assert (m["placement_stalled"], m["placement_stalls"]) == (0, 1)
    cmds = [c for t in (130.0, 200.0, 300.0) for c in tick(s, t)]
    assert not of(cmds, PlacementStallBegan) and not of(cmds, PlacementStallEnded)
    assert "stall in pool default ended: no idle connected worker" in [e[2] for e in s.story("-")]


def test_a_stall_ends_when_its_only_idle_worker_goes_away_and_is_told_again_on_its_rejoin(
    make_state: Factory,
) -> None:
    """``w1``'s connection drops (its id held for a rejoin): no connected worker, the
    stall ends; it rejoins idle and nothing moved for ``stall_timeout``: a new stall."""
    s = make_state(saturation=1.0)
    join(s, 1.0, "w1")
    submit(s, 100.0, ["big"], resources={"memory": 8 * GB}, pool="default")
    assert of(tick(s, 110.0), PlacementStallBegan)
    (ended,) = of(at(s, 112.0, WorkerAway, worker="w1"), PlacementStallEnded)
    assert ended.lasted == 12.0
    assert not of(tick(s, 150.0), PlacementStallBegan)
    join(s, 155.0, "w1")  # the clock started again at 150, when it found none
    assert not of(tick(s, 159.9), PlacementStallBegan)
    (began,) = of(tick(s, 160.0), PlacementStallBegan)
    assert began.stall.since == 150.0 and s.placement_stall_count["default"] == 2


def test_the_stall_names_the_first_5_workers_and_counts_the_others() -> None:
    stall = PlacementStallInfo(
        pool="*", since=5.0, queued=1, workers=tuple(f"w{i}" for i in range(1, 9)), busy=0,
        idle=tuple((f"w{i}", "refused", "kept off") for i in range(1, 9)), head="'t'",
    )  # fmt: skip
    parts = placement_stall_parts(stall)
    assert parts["workers"] == "w1, w2, w3, w4, w5, 3 more"
    assert parts["idle"] == (
        "w1 refused: kept off; w2 refused: kept off; w3 refused: kept off; "
        "w4 refused: kept off; w5 refused: kept off; 3 more idle workers"
    )


def test_a_placement_stall_reads_in_the_status_and_the_console() -> None:
    stall = PlacementStallInfo(
        pool="gpu", since=5.0, queued=3, workers=("w1", "w2"), busy=1,
        idle=(("w2", "full", "its slots count as taken"),), head="'train-1'",
        stalled_for=42.0,
    )  # fmt: skip
    st = jsonable(StatusReply(placement_stalls=(stall,), placement_stalls_total={"gpu": 2}))
    text = status_text(st)
    assert (
        "placement stalled in pool gpu for 42 s: 3 ready tasks placed nowhere, the first "
        "'train-1'; workers w1, w2, 1 running tasks; idle w2 full: its slots count as taken."
    ) in " ".join(text.split())
    assert "placement stalls so far: pool gpu 2" in text


def test_the_metrics_and_the_dashboard_show_the_stall_per_pool() -> None:
    reply = MetricsReply(pools={"cpu": PoolMetrics(placement_stalled=1, placement_stalls=2)})
    got = samples(reply)
    assert got[("corral_placement_stalled", (("pool", "cpu"),))] == 1
    assert got[("corral_placement_stalls_total", (("pool", "cpu"),))] == 2
    (pool,) = build_snapshot(reply, StatusReply(), AlertsReply(), now=1.0)["pools"]
    assert pool["placement_stalled"] == 1  # the page says so in the pool's row


@pytest.mark.anyio
async def test_a_cluster_warns_of_a_task_whose_cores_no_worker_has(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In-process cluster with one configured pool of one 1-core worker: a task of no
    pool (not checked against a pool's shape at submit) asking for 4 cores waits, and
    the scheduler warns once, with the worker, the reason and what to do; the status
    and the console show it. Gated on the status, bounded."""
    caplog.set_level(logging.INFO, logger="corral")
    pools = {"cpu": {"min_blocks": 1, "max_blocks": 1, "cores_per_worker": 1}}
    with anyio.fail_after(20):
        async with Cluster(pools=pools, stall_timeout=0.3) as cluster:
            await cluster.wait_for_workers(1)
            fut = cluster.submit(sum, [1, 2], resources={"cores": 4}, key="wide")

            async def stalled() -> Any:
                st = await cluster.status()
                return st if st["placement_stalls"] else None

            st = jsonable(await wait_until(stalled, "a placement stall in the status", step=0.05))
            fut.cancel()
    (stall,) = st["placement_stalls"]
    assert (stall["pool"], stall["queued"], stall["head"]) == ("*", 1, "'wide'")
    ((worker, reason, detail),) = stall["idle"]
    assert (reason, detail) == ("resources", "'wide' needs 4 cores (it has 1)")
    assert st["placement_stalls_total"] == {"*": 1}
    assert f"idle {worker} resources: 'wide' needs 4 cores" in " ".join(status_text(st).split())
    warned = [r for r in caplog.records if "placement stall in pool any:" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    line = warned[0].getMessage()
    assert "1 ready tasks and an idle worker, and nothing placed or finished for 0.3 s" in line
    assert f"{worker} resources: 'wide' needs 4 cores (it has 1)" in line
    assert PLACEMENT_STALL_ADVICE["resources"] in line


def test_a_block_kept_for_its_output_is_told_as_kept_never_to_undrain(
    make_state: Factory,
) -> None:
    """tasks_per_worker 1 and a fan-in (audit checkpoint, findings 1 and 2): w1 ran a2
    and stays only for it, since b reads it; a1 waits for a fresh block that does not
    come (the batch system has no room). The stall names w1 ``kept``, and its advice
    says what helps; never ``undrain``, which refuses such a worker."""
    s = make_state(tasks_per_worker={"fresh": 1})
    at(s, 1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="fresh",
       block="fresh/block-1")  # fmt: skip
    specs = specs_for(
        s, {"a1": (), "a2": (), "b": ("a1", "a2")}, ["b"],
        attrs={k: {"pool": "fresh"} for k in ("a1", "a2", "b")},
    )  # fmt: skip
    assert assigned(at(s, 2.0, GraphSubmitted, specs=specs, wanted=("b",))) == {"w1": ["a2"]}
    done(s, 5.0, "w1", "a2")
    assert s.undrain_refusal(s.workers["w1"]) == "it was sent its pool's tasks_per_worker tries"
    assert not of(tick(s, 14.9), PlacementStallBegan)
    (began,) = of(tick(s, 15.0), PlacementStallBegan)
    stall = began.stall
    assert (stall.pool, stall.since, stall.queued, stall.workers, stall.head) == (
        "fresh", 5.0, 1, ("w1",), "'a1'",
    )  # fmt: skip
    assert stall.idle == (
        (
            "w1",
            "kept",
            "it was sent its pool's tasks_per_worker tasks and stays only for 1 output(s) "
            "still needed (a waiting task reads them or a client holds them)",
        ),
    )
    advice = placement_stall_parts(began.stall)["advice"]
    assert advice == (
        "kept: these blocks keep outputs a waiting task needs, and hold their share of "
        "the batch system while they do (undrain cannot take them back; two or more "
        "gather their outputs up to checkpoint_inline_bytes on one, and the others end): "
        "release the results the client no longer needs, set a max_blocks the partition can really "
        "run at once beside the kept blocks, or cancel a kept block (Slurm: scancel): "
        "its outputs are computed again"
    )
    assert "undrain WORKER" not in advice


def fan_in_on_fresh_blocks(s: SchedulerState, workers: list[str]) -> dict[str, list[str]]:
    """Pool ``fresh`` (tasks_per_worker 1) with ``workers`` joined, one block each, and
    a1, a2, a3 -> b submitted at 2.0: what each worker was sent."""
    for n, w in enumerate(workers, 1):
        at(s, float(n) / 10, WorkerJoined, worker=w, cores=1, memory=GB, pool="fresh",
           block=f"fresh/block-{n}")  # fmt: skip
    keys = ("a1", "a2", "a3", "b")
    specs = specs_for(
        s, {"a1": (), "a2": (), "a3": (), "b": ("a1", "a2", "a3")}, ["b"],
        attrs={k: {"pool": "fresh"} for k in keys},
    )  # fmt: skip
    return assigned(at(s, 2.0, GraphSubmitted, specs=specs, wanted=("b",)))


def test_kept_blocks_of_a_stalled_pool_gather_their_small_outputs_on_one_and_end(
    make_state: Factory,
) -> None:
    """Audit checkpoint, finding 1: two one-task blocks ran a producer each and are
    kept for b, a fan-in; the third waits for a fresh block the partition cannot start while
    they hold it. Once the pool stalls (``stall_timeout``), w2's small output is copied
    to w1 (the kept worker of the lowest id), w2 is retired (its block ends: room for
    a fresh one), and w1 keeps both. The fresh worker runs the third, the next one b,
    reading the first two from w1; then w1 is retired too. Nothing is computed twice."""
    s = make_state(tasks_per_worker={"fresh": 1})
    sent = fan_in_on_fresh_blocks(s, ["w1", "w2"])
    (x,), (y,) = sent["w1"], sent["w2"]
    (z,) = {"a1", "a2", "a3"} - {x, y}
    done(s, 5.0, "w1", x)
    done(s, 5.0, "w2", y)
    cmds = tick(s, 15.0)
    (began,) = of(cmds, PlacementStallBegan)
    assert [why for _, why, _ in began.stall.idle] == ["kept", "kept"]
    assert cmds[1:] == [Replicate(cmds[0].stimulus_id, "w1", "w2", ((y, 100),))]
    assert ("w2", "draining", "kept outputs gathered on w1 (its pool stalled): its block "
            "may end") in [e[:3] for e in s.story("w2")]  # fmt: skip
    assert not of(tick(s, 16.0), Replicate)  # once per stall
    cmds = at(s, 17.0, ReplicasCopied, worker="w1", asked=(y,), got=(y,))
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w2", "drained")]
    assert s.workers["w1"].keeping == {s.tasks[x], s.tasks[y]}
    at(s, 18.0, WorkerLeft, worker="w2")
    (run3,) = of(at(s, 30.0, WorkerJoined, worker="w3", cores=1, memory=GB, pool="fresh",
                    block="fresh/block-3"), Execute)  # fmt: skip
    assert [t.key for t in run3.tasks] == [z]
    done(s, 31.0, "w3", z)
    (run4,) = of(at(s, 40.0, WorkerJoined, worker="w4", cores=1, memory=GB, pool="fresh",
                    block="fresh/block-4"), Execute)  # fmt: skip
    assert [(t.key, dict(t.deps)) for t in run4.tasks] == [
        ("b", {x: ("w1",), y: ("w1",), z: ("w3",)})
    ]
    cmds = done(s, 41.0, "w4", "b")
    assert sorted(c.worker for c in of(cmds, RetireWorker)) == ["w1", "w3"]
    assert [len(s.tasks[k].tries) for k in ("a1", "a2", "a3", "b")] == [1, 1, 1, 1]


def test_a_kept_output_past_the_inline_bound_stays_where_it_is(make_state: Factory) -> None:
    """Only small outputs (``checkpoint_inline_bytes``) are gathered: a kept worker
    holding a larger one stays, and the stall's advice says what helps."""
    s = make_state(tasks_per_worker={"fresh": 1}, checkpoint_inline_bytes=1000)
    sent = fan_in_on_fresh_blocks(s, ["w1", "w2"])
    at(s, 5.0, TasksFinished, worker="w1", results=(result(sent["w1"][0]),))
    at(s, 5.0, TasksFinished, worker="w2", results=(result(sent["w2"][0], nbytes=1001),))
    cmds = tick(s, 15.0)
    assert [type(c) for c in cmds] == [PlacementStallBegan]
