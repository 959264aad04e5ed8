"""The memory watchdog per pool (actors/scheduler_state.py, ``_watch_memory``): a pool
whose every worker is throttled, with tasks of the pool waiting and nothing that frees
memory able to run there, fails those tasks with ``MemoryStalled`` after
``stall_timeout``, naming the pool, while the other pools run on; tasks of no pool
(``"*"``) stall only when every worker is throttled, as before. A worker's refused
spills (no disk room) reach the scheduler in its memory report and are named in the
error (their status and console: tests/test_spill_refused.py).

The diskfull user audit's finding 2: a pool whose only worker was throttled (its
spills refused for want of disk) with 32 ready tasks hung silently while another
pool's workers idled; and its finding 5: a refused spill was seen only in the worker's
log. Pure-core tests with a virtual clock, exact commands out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from actors.scheduler_events import (
    CancelOnWorker,
    Execute,
    GraphSubmitted,
    KeyErred,
    PlacementStallBegan,
    TasksFinished,
    TasksRunning,
    WorkerAway,
    WorkerJoined,
    WorkerMemory,
)
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import MemoryStalled
from tests.helpers import (
    GB,
    MB,
    Factory,
    assigned,
    finish,
    join,
    make_state,
    of,
    on,
    result,
    run,
    specs_for,
    submit,
)
from tests.test_scheduler_memory import at, tick

__all__ = ["make_state"]  # the fixture, used by name

FRAMES = [f"frame-{i}" for i in range(6)]


def memory(s: SchedulerState, worker: str, now: float, *, throttled: bool = True,
           refused: int = 0, spill_dir: str = "") -> list[Any]:  # fmt: skip
    ev = WorkerMemory(
        stimulus_id=f"mem-{worker}-{now}", now=now, worker=worker, throttled=throttled,
        rss=int(0.75 * GB) if throttled else int(0.3 * GB), throttle_at=int(0.7 * GB),
        limit=GB, memory_bytes=300 * MB, spill_refused=refused, spill_dir=spill_dir,
    )  # fmt: skip
    return run(s, ev)


def spill_pool(make_state: Factory, pool: str | None = "spill") -> SchedulerState:
    """w1, w2 of pool default, idle; w4 of pool ``spill`` runs the frames (of ``pool``)
    one at a time: frame-0 done (300 MB held), frame-1 deferred there, 4 ready; then
    w4 is throttled at 100, its spills refused 3 times on /scratch3."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w2")
    join(s, "w4", pool="spill")
    submit(s, dict.fromkeys(FRAMES, ()), FRAMES, pool=pool)
    (first,) = on(s, "w4") if pool else on(s, "w1")
    finish(s, "w4" if pool else "w1", first, nbytes=300 * MB)
    memory(s, "w4", 100.0, refused=3, spill_dir="/scratch3")
    return s


def test_a_pool_whose_only_worker_is_throttled_fails_its_tasks_while_others_idle(
    make_state: Factory,
) -> None:
    s = spill_pool(make_state)
    assert on(s, "w4") == {"frame-1"} and not on(s, "w1") and not on(s, "w2")
    assert s.queued_by_pool() == {"spill": 4}
    assert s.stalled_since == {"spill": 100.0}  # not "*": w1 and w2 are not throttled
    assert s.story_log[-1][:3] == ("-", "memory", "stall-suspected in pool spill")
    assert of(tick(s, 104.9), KeyErred) == []  # not yet
    cmds = tick(s, 105.0)
    # Exactly the pool's tasks still to run fail; the deferred try is taken back.
    erred = [(c.key, c.error) for c in of(cmds, KeyErred)]
    assert [type(c) for c in cmds] == [KeyErred] * 4 + [CancelOnWorker, KeyErred]
    assert [k for k, _ in erred] == ["frame-5", "frame-4", "frame-3", "frame-2", "frame-1"]
    assert cmds[4] == CancelOnWorker("tick-105.0", "w4", ("frame-1",))
    err = erred[0][1]
    assert isinstance(err, MemoryStalled) and all(e is err for _, e in erred)
    assert (err.pool, err.workers, err.waiting) == ("spill", 1, 5)
    assert err.holding == [("frame", 300 * MB, 1)]
    assert err.spill_refused == [("w4", "/scratch3", 3, 5.0)]
    text = str(err)
    assert text.startswith(
        "memory stalled for 5.0 s: every worker of pool 'spill' (1 worker) is over its "
        "memory throttle fence"
    )
    assert "The tasks of pool 'spill' still to run fail; the other pools run on." in text
    assert (
        "Spilling failed: no room on '/scratch3' (worker w4, 3 times, the latest 5 s ago). "
        "Give workers more memory, give spilling room (free space on that file system, a "
        "--spill-dir on a larger one, or a larger --disk)"
    ) in text
    assert "allow spilling" not in text
    assert not s.stalled_since and not on(s, "w4")
    assert ("-", "memory", "stalled in pool spill") in [r[:3] for r in s.story_log]
    # The other pool runs on: its tasks go to its idle workers at once.
    cmds = submit(s, {"calibrate": ()}, ["calibrate"], pool="default")
    assert assigned(cmds) == {"w1": ["calibrate"]}
    assert of(tick(s, 200.0), KeyErred) == []


def test_a_throttled_pool_with_a_consumer_running_or_ready_is_not_stalled(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w4", pool="spill")
    table = {"load-0": [], "load-1": [], "sum-0": ["load-0"], "sum-1": ["load-1"]}
    submit(s, table, ["sum-0", "sum-1"], pool="spill")
    finish(s, "w4", "load-0", nbytes=300 * MB)  # sum-0, a consumer, goes to w4
    assert on(s, "w4") == {"sum-0"}
    memory(s, "w4", 100.0)
    assert of(tick(s, 200.0), KeyErred) == [] and not s.stalled_since  # a consumer runs
    run(s, TasksFinished("done", 201.0, "w4", (result("sum-0"),)))
    # load-1, a producer, is not sent to a throttled worker: nothing frees memory there.
    assert not on(s, "w4") and s.queued_by_pool() == {"spill": 1}
    assert s.stalled_since == {"spill": 201.0}
    assert of(tick(s, 205.9), KeyErred) == []
    errors = of(tick(s, 206.0), KeyErred)
    assert [e.key for e in errors] == ["sum-1"]  # the wanted key; load-1 failed too
    assert (s.tasks["load-1"].state, s.tasks["sum-1"].state) == ("erred", "erred")
    assert isinstance(errors[0].error, MemoryStalled)


def test_a_pool_whose_worker_executes_a_try_is_not_stalled_until_it_ends(
    make_state: Factory,
) -> None:
    """frame-1 began on w4 before it was throttled (it executes, holding memory there):
    the pool is not stalled while it does (it ends, or is killed, and frees memory);
    once it ends the pool's clock starts, and the frames still to run fail at
    ``stall_timeout``, none of them running (the failures audit's finding 1)."""
    s = spill_pool(make_state)
    assert s.stalled_since == {"spill": 100.0}
    assert run(s, TasksRunning("ran", 101.0, "w4", (("frame-1", 0, 0.5),))) == []
    assert not s.stalled_since
    assert tick(s, 200.0) == [] and not s.stalled_since
    run(s, TasksFinished("done", 201.0, "w4", (result("frame-1", nbytes=300 * MB),)))
    assert not on(s, "w4") and s.stalled_since == {"spill": 201.0}
    assert tick(s, 205.9) == []
    cmds = tick(s, 206.0)
    assert [type(c) for c in cmds] == [KeyErred] * 4
    assert [c.key for c in cmds] == ["frame-5", "frame-4", "frame-3", "frame-2"]
    err = cmds[0].error
    assert isinstance(err, MemoryStalled) and (err.pool, err.waiting) == ("spill", 4)
    assert err.holding == [("frame", 600 * MB, 2)]


def test_a_pool_whose_only_try_executes_past_its_bound_is_stalled(
    make_state: Factory,
) -> None:
    """frame-1 began on w4 and never ends (no ``timeout=``): it holds the pool off the
    watchdog for 30 ``stall_timeout``s (150 s), then the pool's clock starts and its
    tasks fail, frame-1 among them, named apart (the review's finding 6)."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    run(s, at(1.0, WorkerJoined, worker="w1", cores=1, memory=GB, pool="default"))
    run(s, at(1.0, WorkerJoined, worker="w4", cores=1, memory=GB, pool="spill"))
    specs = specs_for(s, dict.fromkeys(FRAMES, ()), FRAMES, pool="spill")
    run(s, at(2.0, GraphSubmitted, specs=specs, wanted=tuple(FRAMES)))
    done = result("frame-0", nbytes=300 * MB)
    run(s, at(90.0, TasksFinished, worker="w4", results=(done,)))
    memory(s, "w4", 100.0)
    assert on(s, "w4") == {"frame-1"} and s.stalled_since == {"spill": 100.0}
    run(s, TasksRunning("ran", 101.0, "w4", (("frame-1", 0, 0.5),)))
    assert tick(s, 250.5) == [] and not s.stalled_since  # 150 s executed: within
    assert tick(s, 251.0) == [] and s.stalled_since == {"spill": 251.0}
    assert tick(s, 255.9) == []
    cmds = tick(s, 256.0)
    assert [type(c) for c in cmds] == [KeyErred] * 4 + [CancelOnWorker, KeyErred]
    assert [c.key for c in of(cmds, KeyErred)] == [
        "frame-5", "frame-4", "frame-3", "frame-2", "frame-1",
    ]  # fmt: skip
    assert cmds[4] == CancelOnWorker("tick-256.0", "w4", ("frame-1",))
    err = cmds[0].error
    assert isinstance(err, MemoryStalled) and (err.pool, err.waiting) == ("spill", 4)
    assert err.executing == [("frame-1", "w4", 155.5, 150.0)]
    assert not s.stalled_since and not on(s, "w4")


def test_tasks_of_any_pool_stall_only_when_every_worker_is_throttled(
    make_state: Factory,
) -> None:
    """Tasks of no pool may run on any worker: a throttled pool does not stall them
    while another pool's worker is not throttled (as before); every worker throttled,
    every task still to run fails."""
    s = spill_pool(make_state, pool=None)
    memory(s, "w1", 100.0)
    assert not s.stalled_since
    assert of(tick(s, 200.0), KeyErred) == []
    memory(s, "w2", 200.0)
    assert s.stalled_since == {"*": 200.0}  # pool default and spill run no task of theirs
    errors = of(tick(s, 205.0), KeyErred)
    assert {e.key for e in errors} == {k for k in FRAMES if s.tasks[k].state == "erred"}
    err = errors[0].error
    assert isinstance(err, MemoryStalled) and err.pool is None and err.workers == 3
    assert str(err).startswith("memory stalled for 5.0 s: every worker is over its memory")
    assert "the other pools run on" not in str(err)
    assert not s.stalled_since


def test_a_reserved_pools_worker_does_not_hold_off_the_stall_of_tasks_of_no_pool(
    make_state: Factory,
) -> None:
    """A worker of a reserved pool (``any_pool_tasks = false``) never runs a task of no
    pool, so it does not keep their watchdog off: the only worker that may run them
    throttled, they fail with ``MemoryStalled`` (before: the idle gpu worker kept
    ``"*"`` off and they waited for ever, review 1207b F1); the reserved pool's own
    task runs on and is not failed."""
    s = make_state(saturation=1.0, stall_timeout=5.0, reserved_pools=frozenset({"gpu"}))
    join(s, "w1", pool="cpu")
    join(s, "g1", pool="gpu")
    submit(s, {"render": ()}, ["render"], pool="gpu")
    submit(s, dict.fromkeys(FRAMES, ()), FRAMES)
    assert on(s, "g1") == {"render"}
    (first,) = on(s, "w1")
    finish(s, "w1", first, nbytes=300 * MB)
    memory(s, "w1", 100.0)
    assert s.stalled_since == {"*": 100.0}
    errors = of(tick(s, 105.0), KeyErred)
    assert {e.key for e in errors} == set(FRAMES) - {first}
    err = errors[0].error
    assert isinstance(err, MemoryStalled) and err.pool is None and err.workers == 1
    assert s.tasks["render"].state == "processing"


def test_the_placement_watchdog_leaves_a_pool_throttled_for_memory_to_memory_stalled(
    make_state: Factory,
) -> None:
    """The pool's only worker is throttled and idle, its ready tasks wait, and another
    pool's worker is not throttled: MemoryStalled at stall_timeout, no placement stall
    (before, the placement watchdog deferred only when every worker was throttled)."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w4", pool="spill")
    submit(s, dict.fromkeys(FRAMES, ()), FRAMES, pool="spill")
    memory(s, "w4", 1000.0)  # frame-0 runs there, deferred
    done = TasksFinished("done", 1001.0, "w4", (result("frame-0", nbytes=300 * MB),))
    run(s, done)  # w4 idle, frame-1 .. frame-5 wait
    assert not on(s, "w4") and s.stalled_since == {"spill": 1001.0}
    cmds = tick(s, 1005.0) + tick(s, 1006.0) + tick(s, 1011.0)
    assert not of(cmds, PlacementStallBegan) and not s.placement_stall_count
    assert {e.key for e in of(cmds, KeyErred)} == set(FRAMES[1:])
    assert not of(cmds, Execute)


def test_a_worker_leaving_or_unthrottled_ends_its_pools_suspicion(make_state: Factory) -> None:
    s = spill_pool(make_state)
    memory(s, "w4", 102.0, throttled=False)
    assert not s.stalled_since and s.throttled_in == {}
    memory(s, "w4", 103.0)
    assert s.stalled_since == {"spill": 103.0} and s.throttled_in == {"spill": 1}
    join(s, "w5", pool="spill")  # a worker of the pool joins: it takes the frames
    assert not s.stalled_since and s.pool_members["spill"].keys() == {"w4", "w5"}
    assert of(tick(s, 200.0), KeyErred) == []


def load40(i: int) -> Any:
    """A 40 MiB producer."""
    return np.full(40 * 2**20 // 8, float(i))


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_pool_whose_spills_find_no_room_fails_while_the_other_pool_idles(
    tmp_path: Path,
) -> None:
    """The audit's run, on worker processes: pool "spill" has one 400 MiB worker whose
    disk (100 MiB) holds two of its 40 MiB outputs, pool "default" one idle worker. Its loads
    throttle it, its spills are refused, and the loads fail with MemoryStalled naming
    the pool and the refused spills (before: no error, the client waited for ever).
    Bounded by fail_after; ports in this test's range."""
    pools = {
        "default": {"min_blocks": 1, "worker_port_range": "43110-43119"},
        "spill": {
            "min_blocks": 1, "memory_per_worker": "400MiB", "disk_per_worker": "100MiB",
            "spill_dir": str(tmp_path), "worker_port_range": "43120-43129",
        },
    }  # fmt: skip
    with anyio.fail_after(90):
        async with Cluster(pools=pools, processes=True, port=43100, stall_timeout=2.0) as c:
            await c.wait_for_workers(2, timeout=60)
            futures = [c.submit(load40, i, key=f"load-{i}", pool="spill") for i in range(30)]
            assert c._client_actor.waiting_pools() == {"spill"}  # what its throttle hint counts
            with pytest.raises(MemoryStalled) as info:
                for future in futures:
                    await future
            st = await c.status()
            assert await c.submit(sum, [1, 2], pool="default") == 3  # the other runs on
    err = info.value
    assert err.pool == "spill" and err.workers == 1
    ((worker, where, times, _),) = err.spill_refused
    assert worker.startswith("spill-") and where == str(tmp_path) and times >= 1
    assert f"Spilling failed: no room on {str(tmp_path)!r} (worker {worker}" in str(err)
    (warning,) = [w for w in st["warnings"] if "spill refused" in w]
    assert warning.startswith(f"worker {worker}: spill refused: no disk room on ")


def done(s: SchedulerState, worker: str, key: str, now: float) -> list[Any]:
    """``key``'s try on ``worker`` ended ok at ``now`` (300 MB out)."""
    return run(s, TasksFinished(f"done-{key}", now, worker, (result(key, nbytes=300 * MB),)))


def load_proc(make_state: Factory, busy: bool = False) -> SchedulerState:
    """Pool ``load`` (wl, 1 core) makes load-i, pool ``proc`` (wp, 1 core) runs
    proc-i(load-i), each longer than stall_timeout: load-0 and load-1 done on wl,
    proc-0 runs on wp and proc-1 waits for it, load-2 runs on wl; then wl is throttled
    at 100 with load-3 to go (the review's finding 1). With ``busy``, wp runs ``other``
    first, which reads nothing of pool load, and proc-0 waits too."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "wl", pool="load")
    join(s, "wp", pool="proc")
    if busy:
        submit(s, {"seed": [], "other": ["seed"]}, ["other"], pool="proc")
        done(s, "wp", "seed", 5.0)
    table: dict[str, list[str]] = {f"load-{i}": [] for i in range(4)}
    table.update({f"proc-{i}": [f"load-{i}"] for i in range(4)})
    attrs = {k: {"pool": k.split("-")[0]} for k in table}
    submit(s, table, [f"proc-{i}" for i in range(4)], attrs=attrs)
    done(s, "wl", "load-0", 10.0)
    done(s, "wl", "load-1", 20.0)
    assert (on(s, "wl"), on(s, "wp")) == ({"load-2"}, {"other" if busy else "proc-0"})
    assert s.queued_by_pool() == {"load": 1, "proc": 1 + busy}
    memory(s, "wl", 100.0)
    assert s.stalled_since == {"load": 100.0}  # the clock runs: only a producer runs there
    return s


def test_a_pool_whose_outputs_a_consumer_in_another_pool_reads_is_not_stalled(
    make_state: Factory,
) -> None:
    """A healthy pipeline across pools: the throttled pool's memory is freed by the
    other pool's consumers, which read its outputs. At stall_timeout the clock starts
    again instead of failing the pool (before: MemoryStalled at 105, load-2 killed
    while it ran and proc-2, proc-3 failed with it)."""
    s = load_proc(make_state)
    cmds = tick(s, 105.0) + tick(s, 110.0) + tick(s, 117.0)
    assert of(cmds, KeyErred) == [] and not of(cmds, CancelOnWorker)
    assert s.stalled_since == {"load": 117.0}  # restarted at 105, 110, 117: proc-0 runs
    cmds = done(s, "wp", "proc-0", 118.0)  # load-0 is released on wl; proc-1 reads load-1
    assert assigned(cmds) == {"wp": ["proc-1"]}
    assert of(tick(s, 130.0), KeyErred) == [] and s.stalled_since == {"load": 130.0}
    memory(s, "wl", 131.0, throttled=False)  # memory came down: the pipeline goes on
    assert not s.stalled_since
    done(s, "wl", "load-2", 132.0)
    done(s, "wp", "proc-1", 133.0)
    done(s, "wl", "load-3", 134.0)
    done(s, "wp", "proc-2", 135.0)
    done(s, "wp", "proc-3", 136.0)
    assert {k: ts.state for k, ts in s.tasks.items() if k.startswith("proc")} == dict.fromkeys(
        ["proc-0", "proc-1", "proc-2", "proc-3"], "memory"
    )


def test_a_ready_consumer_in_another_pool_that_reads_the_pools_outputs_holds_it_too(
    make_state: Factory,
) -> None:
    """wp runs ``other``, which reads nothing of pool load; proc-0 and proc-1, ready in
    pool proc behind it, read load-0 and load-1 on wl: they will free them, so pool
    load is not stalled."""
    s = load_proc(make_state, busy=True)
    cmds = tick(s, 105.0) + tick(s, 106.0)
    assert of(cmds, KeyErred) == [] and s.stalled_since == {"load": 105.0}
    assert assigned(done(s, "wp", "other", 107.0)) == {"wp": ["proc-0"]}


def test_a_consumer_elsewhere_that_reads_nothing_of_the_pool_does_not_hold_it(
    make_state: Factory,
) -> None:
    """The audit case with pool default busy: its consumer reads nothing held on pool
    spill's worker, so pool spill still fails at stall_timeout."""
    s = make_state(saturation=1.0, stall_timeout=5.0)
    join(s, "w1")
    join(s, "w4", pool="spill")
    submit(s, {"a": (), "b": ("a",)}, ["b"], pool="default")
    done(s, "w1", "a", 10.0)
    assert on(s, "w1") == {"b"}  # a consumer runs in pool default, reading "a" on w1
    submit(s, dict.fromkeys(FRAMES, ()), FRAMES, pool="spill")
    done(s, "w4", "frame-0", 20.0)  # frame-1 runs on w4, 4 wait
    memory(s, "w4", 100.0)
    assert s.stalled_since == {"spill": 100.0}
    erred = of(tick(s, 105.0), KeyErred)
    assert {e.key for e in erred} == set(FRAMES[1:])
    assert on(s, "w1") == {"b"}  # pool default runs on


def test_a_pool_whose_worker_is_away_is_not_stalled_during_its_grace(
    make_state: Factory,
) -> None:
    """Its only worker's connection dropped: held for its rejoin, it cannot say it is
    no longer throttled. Not a stall while it is away (before: MemoryStalled at 105,
    the running try the grace keeps taken back); back, the clock starts again."""
    s = spill_pool(make_state)
    run(s, WorkerAway("away", 101.0, "w4"))
    assert not s.stalled_since
    assert of(tick(s, 106.0) + tick(s, 160.0), KeyErred) == [] and not s.stalled_since
    assert on(s, "w4") == {"frame-1"}
    run(s, WorkerJoined("back", 161.0, "w4", cores=1, memory=GB, pool="spill"))
    assert s.stalled_since == {"spill": 161.0}  # still throttled, nothing said otherwise
    assert of(tick(s, 165.9), KeyErred) == []
    assert {e.key for e in of(tick(s, 166.0), KeyErred)} == set(FRAMES[1:])


def test_memory_stalled_names_only_recent_spill_refusals(make_state: Factory) -> None:
    """A spill refused long ago (more than 10 x stall_timeout before the stall, here 50
    s) is not blamed: the message asks to allow spilling, not to give it room."""
    s = spill_pool(make_state)  # refused at 100
    memory(s, "w4", 101.0, throttled=False, refused=3, spill_dir="/scratch3")
    memory(s, "w4", 146.0, refused=3, spill_dir="/scratch3")
    (err,) = {e.error for e in of(tick(s, 151.0), KeyErred)}
    assert isinstance(err, MemoryStalled) and err.spill_refused == []
    assert "Spilling failed" not in str(err) and "allow spilling to disk" in str(err)
    s = spill_pool(make_state)
    memory(s, "w4", 101.0, throttled=False, refused=3, spill_dir="/scratch3")
    memory(s, "w4", 144.0, refused=3, spill_dir="/scratch3")
    (err,) = {e.error for e in of(tick(s, 149.0), KeyErred)}  # 49 s: named
    assert err.spill_refused == [("w4", "/scratch3", 3, 49.0)]
