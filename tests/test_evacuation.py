"""Data evacuation: a worker that is going (preempted, past its walltime, stopped)
copies the outputs that are still needed and held nowhere else to a surviving worker
before it leaves, so nothing is computed again.

The scheduler's core is fed events (which outputs go where, and that a copy made
before the loss keeps the output); then real worker processes: one inside a (Slurm)
job environment is SIGTERMed holding the only copy of a wanted output, and the output
is gathered from the other worker without its task running a second time. Two
workers preempted together (one the target of the other's plan, its Leaving a few ms
later): the core moves the copy to a survivor (exact commands), the leaving worker
carries out the plan's second part, and on worker processes the output ends on the
survivor. An output held by two workers stopped together (the original and a copy a
downstream task fetched, audit slurm D1) is copied once, by one of them, to the
survivor: exact commands in either order, for block siblings, with a draining holder,
and if the copying one goes without the copy; and on worker processes, no recovery.
A survivor takes a copy only with room for it: in its memory, or, if it spills, on its
disk with room in its memory for the copy to land (docs/memory.md#outputs-copied-off-
a-worker-that-goes): exact commands for each case, and a worker telling whether it
spills when it joins.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from actors.protocol import ToRun
from actors.scheduler_events import (
    ClusterStops,
    Evacuate,
    Execute,
    ReplicasCopied,
    Replicate,
    RetireWorker,
    WorkerDraining,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
    WorkerMemory,
)
from actors.worker import Leave, Worker
from runtime import Cluster
from runtime.console import ConsoleClient
from runtime.graph import Task
from runtime.kernel import Actor, ActorSystem, Later, handles
from runtime.messages import CopiesReply, CopyFrom, Evacuated, EvacuationPlan, Leaving, RunTasks
from tests.helpers import (
    Cli,
    Factory,
    SchedulerRecorder,
    event,
    finish,
    held_at_gate,
    join,
    make_state,
    of,
    run,
    submit,
    wait_until,
)

__all__ = ["make_state"]

LIMIT = 60  # seconds per test


def test_the_core_plans_copies_of_needed_outputs_held_only_by_the_leaving_worker(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "a", cores=2)
    submit(s, {"x": [], "y": [], "z": ["y"]}, ["x", "z"])
    assert {s.tasks["x"].worker, s.tasks["y"].worker} == {"a"}
    for key in ("x", "y"):  # both ran on a: y is needed by z, x is wanted
        finish(s, s.tasks[key].worker or "", key, nbytes=100 if key == "x" else 300)
    join(s, "b")
    join(s, "c")
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    ((plan,),) = [of(out, Evacuate)]
    # Largest first, each to the target that then holds the least.
    assert plan.worker == "a" and plan.moves == (("y", "b", 300), ("x", "c", 100))
    assert "a" not in s.free and s.workers["a"].draining
    # The copies are made; the worker goes: nothing is lost, nothing recomputed.
    out = run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=(("x", "c"),)))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {"c"}
    assert s.tasks["y"].state != "memory"  # its copy was not reported: computed again


def rss(s: Any, worker: str, nbytes: int) -> None:
    run(s, event(WorkerMemory, worker=worker, throttled=False, rss=nbytes,
                 throttle_at=700, limit=1000))  # fmt: skip


@pytest.mark.parametrize(("c_rss", "moves"), [(600, (("x", "c", 300),)), (750, ())])
def test_a_leaving_workers_output_goes_only_where_the_memory_left_takes_it(
    make_state: Factory, c_rss: int, moves: tuple[Any, ...]
) -> None:
    """Audit memory F2: a survivor's memory limit less its memory now (its RSS) must
    take the copy: b, the emptiest of outputs but at 800 of its 1000 bytes, takes none
    of 300; c at 600 does. With c at 750 no survivor has room: nothing is copied, and
    the output is computed again if needed, as a lost output is."""
    s = make_state(saturation=1.0)
    join(s, "a", memory=1000)
    submit(s, {"x": []}, ["x"])
    finish(s, "a", "x", nbytes=300)
    for w, used in (("b", 800), ("c", c_rss)):
        join(s, w, memory=1000)
        rss(s, w, used)
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", moves)]


def test_a_drained_workers_output_goes_only_where_the_memory_left_takes_it(
    make_state: Factory,
) -> None:
    """The same for the copies off a drained worker before it is retired: b, with the
    fewest outputs but its RSS at 800 of 1000, takes none of 300; c does."""
    s = make_state(saturation=1.0)
    join(s, "a", memory=1000)
    submit(s, {"x": []}, ["x"])
    finish(s, "a", "x", nbytes=300)
    for w, used in (("b", 800), ("c", 600)):
        join(s, w, memory=1000)
        rss(s, w, used)
    out = run(s, event(WorkerDraining, worker="a"))
    assert [(r.worker, r.source, r.keys) for r in of(out, Replicate)] == [("c", "a", (("x", 300),))]


def spiller(
    s: Any, worker: str, *, spills: bool, disk: int, rss: int, held: int, spill_refused: int = 0
) -> None:
    """``worker`` joins (its memory 1000 bytes, its throttle fence at 700, ``disk``
    bytes of disk; its spill fence on or not) and holds a wanted output of ``held``
    bytes, which it wrote to disk (its disk use says so) and is at ``rss`` of its
    memory; it says ``spill_refused`` spills found no disk room."""
    run(s, event(WorkerJoined, worker=worker, cores=1, memory=1000, disk=disk, spills=spills))
    key = f"held-{worker}"
    submit(s, {key: []}, [key])
    assert s.tasks[key].worker == worker, "the drained or leaving worker took no task"
    finish(s, worker, key, nbytes=held)
    run(s, event(WorkerMemory, worker=worker, throttled=rss >= 700, rss=rss, throttle_at=700,
                 limit=1000, disk_used=held, memory_bytes=0, spill_refused=spill_refused,
                 spill_dir="/spill"))  # fmt: skip


def made_on(s: Any, worker: str, key: str, pool: str = "default") -> None:
    """``worker`` joins (1000 bytes of memory) and makes ``key``'s 300-byte output."""
    join(s, worker, memory=1000, pool=pool)
    submit(s, {key: []}, [key], pool=pool)
    assert s.tasks[key].worker == worker
    finish(s, worker, key, nbytes=300)


SURVIVORS = [
    # b spills, its outputs on disk: the copy lands beside its RSS (350 + 300), and goes
    # to disk at its next sample; its outputs' 900 bytes (the old rule's) do not count
    pytest.param(True, 10_000, 350, True, id="spills-disk-room"),
    # it lands at b's throttle fence (400 + 300 = 700), not past it
    pytest.param(True, 10_000, 400, True, id="spills-lands-at-throttle-fence"),
    # it would land past b's throttle fence, at its terminate fence (650 + 300 = 950 of
    # 1000): refused (the limit was the bound: a worker killed there loses all it holds)
    pytest.param(True, 10_000, 650, False, id="spills-past-throttle-fence"),
    # the same worker with its spill fence off keeps the copy in memory: old rule
    pytest.param(False, 10_000, 500, False, id="spill-off"),
    # spilling, but no disk room for the copy: its 1000 bytes of disk hold its 900
    pytest.param(True, 1_000, 500, False, id="spills-no-disk-room"),
    # spilling with disk room, but the copy would not land: 800 + 300 > 1000
    pytest.param(True, 10_000, 800, False, id="spills-no-room-to-land"),
    # one byte past the throttle fence: 401 + 300 > 700
    pytest.param(True, 10_000, 401, False, id="spills-a-byte-past-throttle-fence"),
]


@pytest.mark.parametrize(("spills", "disk", "b_rss", "copied"), SURVIVORS)
def test_a_drained_workers_output_goes_to_a_survivor_that_spills_it(
    make_state: Factory, spills: bool, disk: int, b_rss: int, copied: bool
) -> None:
    """Review F7: a survivor that spills with disk room for the copy takes a drained
    worker's output when its memory has room for the copy to land (its RSS and the
    copy, under its throttle fence, 700), however many bytes of outputs it holds (here
    900 of its 1000, on disk): the old rule counted those as memory and kept the output
    on the drained worker. One whose spill fence is off, or whose disk has no room, or
    whose memory has no room for the copy to land under its throttle fence (review
    1207a: the bound was its limit), takes none: the drained worker keeps it."""
    s = make_state(saturation=1.0)
    spiller(s, "b", spills=spills, disk=disk, rss=b_rss, held=900)
    made_on(s, "a", "x")
    out = run(s, event(WorkerDraining, worker="a"))
    expected = [("b", "a", (("x", 300),))] if copied else []
    assert [(r.worker, r.source, r.keys) for r in of(out, Replicate)] == expected
    assert of(out, RetireWorker) == []  # kept until its copy lands (or for good)


@pytest.mark.parametrize(("spills", "disk", "b_rss", "copied"), SURVIVORS)
def test_a_leaving_workers_output_goes_to_a_survivor_that_spills_it(
    make_state: Factory, spills: bool, disk: int, b_rss: int, copied: bool
) -> None:
    """The same for a leaving worker's plan; an output no survivor takes is computed
    again once the worker goes."""
    s = make_state(saturation=1.0)
    spiller(s, "b", spills=spills, disk=disk, rss=b_rss, held=900)
    made_on(s, "a", "x")
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    moves = (("x", "b", 300),) if copied else ()
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", moves)]
    out = run(s, event(WorkerLeft, worker="a", cause="preempted",
                       evacuated=(("x", "b"),) if copied else ()))  # fmt: skip
    if copied:
        assert s.tasks["x"].who_has == {"b"} and of(out, Execute) == []
    else:  # computed again, on b
        assert [(e.worker, [t.key for t in e.tasks]) for e in of(out, Execute)] == [("b", ["x"])]


def test_copies_on_their_way_to_a_spilling_survivor_count_as_landing(
    make_state: Factory,
) -> None:
    """A copy lands whole in memory before the worker writes it to disk: the copies on
    their way to a spilling survivor count with its RSS. Two workers drained one after
    the other, each holding a 300-byte output (and at 900 of their 1000, so neither
    takes the other's): b at 350 of its 1000 takes the first; the second would land
    beside it (350 + 300 + 300), past b's throttle fence (700): it stays on its drained
    worker."""
    s = make_state(saturation=1.0)
    spiller(s, "b", spills=True, disk=10_000, rss=350, held=900)
    for w, key in (("a1", "x1"), ("a2", "x2")):
        made_on(s, w, key, pool=w)
        rss(s, w, 900)
    out = run(s, event(WorkerDraining, worker="a1"))
    assert [(r.worker, r.source, r.keys) for r in of(out, Replicate)] == [
        ("b", "a1", (("x1", 300),))
    ]
    out = run(s, event(WorkerDraining, worker="a2"))
    assert of(out, Replicate) == []


@pytest.mark.parametrize(("spills", "b_rss", "b_held"), [(True, 350, 900), (False, 500, 100)])
def test_copies_planned_onto_a_survivor_by_a_worker_that_left_before_count(
    make_state: Factory, spills: bool, b_rss: int, b_held: int
) -> None:
    """Review 1207a F2: two workers of different blocks leave one after the other, each
    holding a 300-byte needed output (and at 900 of their 1000, so neither takes the
    other's). Survivor b takes the first's copy (a spilling b at 350 of its 1000 lands
    it under its throttle fence, 700; one that does not spill, at 500 holding 100 bytes,
    has room in its memory); the second's would land beside that planned copy (350 +
    600 past the fence, 500 + 600 past the limit): no copy is planned, and x2 is
    computed again once a2 goes. Before, the first plan was not counted and both went
    to b (1100 of its 1000 in the case that does not spill)."""
    s = make_state(saturation=1.0)
    spiller(s, "b", spills=spills, disk=10_000, rss=b_rss, held=b_held)
    for w, key in (("a1", "x1"), ("a2", "x2")):
        made_on(s, w, key, pool=w)
        rss(s, w, 900)
    plans = []
    for w in ("a1", "a2"):
        out = run(s, event(WorkerLeaving, worker=w, cause="preempted"))
        plans += [(p.worker, p.moves) for p in of(out, Evacuate)]
    assert plans == [("a1", (("x1", "b", 300),)), ("a2", ())]
    assert s.evac_planned == {"b": {"x1": "a1"}}


@pytest.mark.parametrize(("stall_timeout", "copied"), [(10.0, False), (0.05, True)])
def test_a_survivor_whose_spills_were_refused_lately_takes_a_copy_by_the_memory_rule(
    make_state: Factory, stall_timeout: float, copied: bool
) -> None:
    """Review 1207a F3: a survivor that spills but said a spill of it found no disk room
    (spill_refused) keeps what it cannot write in memory: within ``10 *
    stall_timeout`` of that (the stall message's "lately") it takes a copy only by the
    memory rule (here none: it holds 900 of its 1000); once that is long past (a few
    events on the test's clock of one second each, past 0.5 s), by the spill rule."""
    s = make_state(saturation=1.0, stall_timeout=stall_timeout)
    spiller(s, "b", spills=True, disk=10_000, rss=350, held=900, spill_refused=3)
    made_on(s, "a", "x")
    out = run(s, event(WorkerDraining, worker="a"))
    expected = [("b", "a", (("x", 300),))] if copied else []
    assert [(r.worker, r.source, r.keys) for r in of(out, Replicate)] == expected


@pytest.mark.parametrize(("spill", "spills"), [(0.6, True), (None, False)])
def test_a_worker_says_whether_it_spills_when_it_registers(
    tmp_path: Path, spill: float | None, spills: bool
) -> None:
    options = {"spill_dir": str(tmp_path), "spill": spill}
    w = Worker("w", None, lambda _: None, memory=2**30, memory_options=options)  # type: ignore[arg-type]
    try:
        assert w.info.spills is spills
    finally:
        w.data.close()


@pytest.mark.anyio
@pytest.mark.parametrize(("spill", "spills"), [(0.6, True), (None, False)])
async def test_the_scheduler_learns_whether_a_joining_worker_spills(
    spill: float | None, spills: bool
) -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, memory_options={"spill": spill}) as c:
            await c.wait_for_workers(1)
            (ws,) = c._scheduler_actor.state.workers.values()
            assert ws.spills is spills


def mebibyte(i: int) -> Any:
    return np.full(2**17, float(i))


@pytest.mark.anyio
@pytest.mark.slow
async def test_closing_a_cluster_copies_no_output_between_its_worker_processes() -> None:
    """Audit memory F2 on worker processes: outputs a client still holds, on both
    workers, when the ``async with`` block is left. The workers stop one after the
    other; none copies an output to the other, nor is one computed again there."""
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2, port=52010, memory_per_worker="400MiB") as c:
            await c.wait_for_workers(2)  # (round robin over both: not before the 2nd joins)
            await c.set_policy("placement", "round-robin")
            futures = c.map(mebibyte, range(4))
            await c.gather(futures)
            sched = c._scheduler_actor
            ran = {f.key: [e[2] for e in sched.state.story(f.key) if str(e[2]).startswith(
                "runs-on:")] for f in futures}  # fmt: skip
            assert {w for on in ran.values() for w in on} == {"runs-on:worker-1",
                                                               "runs-on:worker-2"}  # fmt: skip
    for f in futures:  # the stories are whole: every worker left and the cluster stopped
        story = [str(e[2]) for e in sched.state.story(f.key)]
        assert [e for e in story if "evacuat" in e] == [], story
        assert [e for e in story if e.startswith("runs-on:")] == ran[f.key], story
    assert sched.state.storage.transfers["evacuation"] == 0


def produce(log: str, n: int) -> Any:
    with open(log, "a") as f:
        f.write("ran\n")
    return np.arange(n, dtype=np.float64)


def total(x: Any) -> float:
    return float(x.sum())


@pytest.mark.anyio
@pytest.mark.parametrize("signals", [1, 2])
async def test_a_preempted_workers_needed_output_survives_on_another(
    tmp_path: Path, signals: int
) -> None:
    """With ``signals=2`` the worker gets a second SIGTERM once it is leaving, as in a
    Slurm job: the batch system signals every process of the job, and the job script's
    trap passes the signal on. The second one must not end the copy half-way."""
    log = tmp_path / "runs"
    n = 2**20 if signals == 1 else 2**23  # 8 MiB; 64 MiB: the copy outlasts the signal
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        cli.env["SLURM_JOB_ID"] = "4242"  # what the batch system sets inside a job
        in_job = cli.worker(address, "--name", "in-job", "--log-level", "info")
        del cli.env["SLURM_JOB_ID"]
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            (x,) = await c.submit_graph({"x": (produce, str(log), n)}, ["x"])
            await x.wait()
            cli.worker(address, "--name", "other")
            await c.wait_for_workers(2)
            in_job.send_signal(signal.SIGTERM)
            if signals == 2:
                cli.line_with(in_job, "leaving")  # the first signal was taken
                in_job.send_signal(signal.SIGTERM)
            assert in_job.wait(LIMIT) == 0
            (y,) = await c.submit_graph({"y": (total, "x")}, ["y"])
            assert await y == float(np.arange(n).sum())
            value = await x
            assert value.shape == (n,) and value[-1] == n - 1
        assert log.read_text() == "ran\n"  # computed once: the copy was used


@asynccontextmanager
async def two_in_jobs_and_a_survivor(
    tmp_path: Path,
) -> AsyncIterator[tuple[Cli, str, dict[str, Any], Cluster]]:
    """A manager; workers a and b (pools ``pa``, ``pb``), each its own block inside a
    (Slurm) job; c (pool ``pc``, block-c), the survivor; all within ``LIMIT`` seconds
    and stopped on the way out. The processes, the manager's address, the processes of
    a and b, and a client once the three joined."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        address, going = _start_two_in_jobs_and_a_survivor(cli)
        async with Cluster(address) as c:
            await c.wait_for_workers(3)
            yield cli, address, going, c


def _start_two_in_jobs_and_a_survivor(cli: Cli) -> tuple[str, dict[str, Any]]:
    _, address = cli.manager()
    cli.env["SLURM_JOB_ID"] = "4242"  # what the batch system sets inside a job
    going = {}
    for name in ("a", "b"):
        cli.env["CORRAL_BLOCK_ID"] = f"block-{name}"
        going[name] = cli.worker(
            address, "--name", name, "--pool", f"p{name}", "--log-level", "info"
        )
    del cli.env["SLURM_JOB_ID"]
    cli.env["CORRAL_BLOCK_ID"] = "block-c"
    cli.worker(address, "--name", "c", "--pool", "pc")
    return address, going


def stop_a_then_b(cli: Cli, going: dict[str, Any], address: str) -> None:
    """One job stops a and b together, a first: b's SIGTERM once a's Leaving is on its
    way; both exit. Then d joins a's pool, where a's outputs would run again."""
    going["a"].send_signal(signal.SIGTERM)
    cli.line_with(going["a"], "leaving")
    going["b"].send_signal(signal.SIGTERM)
    assert going["a"].wait(LIMIT) == 0 and going["b"].wait(LIMIT) == 0
    cli.worker(address, "--name", "d", "--pool", "pa")


@pytest.mark.anyio
async def test_two_workers_preempted_together_leave_the_needed_output_on_the_survivor(
    tmp_path: Path,
) -> None:
    """Audit D2 on worker processes: a and b (each its own block, inside a job) are sent
    SIGTERM together, a first; a holds the only copy of a wanted output, and its plan
    names b (c, the survivor, holds more). b's Leaving comes while that copy is made:
    the output must end on c and be used from there, never computed again."""
    log = tmp_path / "runs"
    n = 2**23  # 64 MiB: the copy to b outlasts b's signal
    async with two_in_jobs_and_a_survivor(tmp_path) as (cli, address, going, c):
        (x,) = await c.submit_graph({"x": (produce, str(log), n)}, ["x"], pool="pa")
        (w,) = await c.submit_graph({"w": (produce, str(tmp_path / "w"), 2 * n)}, ["w"], pool="pc")
        await x.wait()
        await w.wait()
        stop_a_then_b(cli, going, address)
        (y,) = await c.submit_graph({"y": (total, "x")}, ["y"], pool="pc")
        assert await y == float(np.arange(n).sum())
    # computed once: the copy on c was used (read once the processes stopped)
    assert log.read_text() == "ran\n"


def joined(s: Any, worker: str, block: str, pool: str = "default") -> None:
    run(s, event(WorkerJoined, worker=worker, cores=1, memory=2**30, pool=pool, block=block))


def test_the_core_plans_no_copy_onto_a_worker_of_the_leaving_workers_block(
    make_state: Factory,
) -> None:
    """A preempted block's workers all get SIGTERM at once: a sibling whose own Leaving
    is not here yet is going too, so it takes none of the outputs (it would lose them)."""
    s = make_state(saturation=1.0)
    joined(s, "a", "block-1")
    submit(s, {"x": []}, ["x"])  # wanted by a client
    finish(s, "a", "x", nbytes=100)
    joined(s, "a2", "block-1")  # a's sibling: first by id among the emptiest
    joined(s, "b", "block-2")
    joined(s, "c", "block-1", pool="other")  # another pool's block-1: another block
    assert s.workers["a2"].block == "block-1" and s.workers["b"].block == "block-2"
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    ((plan,),) = [of(out, Evacuate)]
    assert plan.worker == "a" and plan.moves == (("x", "b", 100),)
    # b and c go (another pool's block of the same name is no sibling: c is a target;
    # the copy planned onto b goes there when b is lost, more of a's plan).
    out = run(s, event(WorkerLeft, worker="b", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "c", 100),))]
    out = run(s, event(WorkerLeft, worker="c", cause="preempted"))
    assert of(out, Evacuate) == []  # (not onto a2, a's sibling)
    # Only the sibling is left: no plan (x is computed again if a goes), as with none.
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", ())]
    out = run(s, event(WorkerLeft, worker="a", cause="preempted"))
    assert s.tasks["x"].state != "memory" and s.tasks["x"].who_has == set()


def copies(out: Any) -> list[tuple[str, str, Any]]:
    """The copies the core asks for: ``(target, source, keys)``."""
    return [(r.worker, r.source, r.keys) for r in of(out, Replicate)]


def two_blocks_preempted(s: Any) -> None:
    """Four blocks of one worker each; ``x`` (wanted) on ``a``, ``y`` (read by ``z``)
    on ``b``. One preemption takes blocks 1 and 3: ``a`` says it leaves first, its plan
    sends ``x`` to ``c`` (the emptiest), and ``c``'s own Leaving comes a few ms later,
    while that copy is on its way."""
    joined(s, "a", "block-1")
    joined(s, "b", "block-2")
    submit(s, {"x": [], "y": [], "z": ["y"]}, ["x", "z"])
    assert (s.tasks["x"].worker, s.tasks["y"].worker) == ("a", "b")
    finish(s, "a", "x", nbytes=100)
    finish(s, "b", "y", nbytes=300)
    joined(s, "c", "block-3")
    joined(s, "d", "block-4")
    assert (s.tasks["x"].who_has, s.tasks["y"].who_has) == ({"a"}, {"b"})
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "c", 100),))]
    out = run(s, event(WorkerLeaving, worker="c", cause="preempted"))
    # More of a's plan: a, which holds x until it goes, copies it to d, the survivor:
    # not to c (leaving), nor to b (it holds more). c has nothing of its own to copy.
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [
        ("a", (("x", "d", 100),)),
        ("c", ()),
    ]
    assert copies(out) == []


def test_a_copy_planned_onto_a_worker_that_then_says_it_leaves_goes_to_a_survivor(
    make_state: Factory,
) -> None:
    """Audit D2: two blocks preempted by one job; the first worker's plan chose the
    other, whose Leaving came 36 ms later: its copies went with it and were computed
    again though other workers survived."""
    s = make_state(saturation=1.0)
    two_blocks_preempted(s)
    # No later plan chooses c, which said it leaves: b's y goes to d.
    out = run(s, event(WorkerLeaving, worker="b", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("b", (("y", "d", 300),))]
    # a made both copies (c's too, before c went); then a and c go: x stays on d.
    evacuated = (("x", "c"), ("x", "d"))
    out = run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=evacuated))
    assert copies(out) == [] and s.tasks["x"].who_has == {"c", "d"}
    out = run(s, event(WorkerLeft, worker="c", cause="preempted"))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {"d"}
    assert of(out, Execute) == [] and s.storage.recoveries == {}


def test_a_copy_that_landed_on_a_leaving_worker_is_passed_on(make_state: Factory) -> None:
    """The source had made its copies and gone before more of its plan came (the
    target's Leaving came late), so only the planned copy to the leaving target landed:
    once the source says so, that copy is passed on to a survivor before the target
    goes."""
    s = make_state(saturation=1.0)
    two_blocks_preempted(s)
    out = run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=(("x", "c"),)))
    assert copies(out) == [("d", "c", (("x", 100),))]
    run(s, event(ReplicasCopied, worker="d", asked=("x",), got=("x",)))
    out = run(s, event(WorkerLeft, worker="c", cause="preempted"))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {"d"}
    assert of(out, Execute) == [] and s.storage.recoveries == {}


class LeavingRecorder(SchedulerRecorder):
    """Stands for the scheduler: records each Leaving and answers it with an empty
    plan (nothing to copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.leaving: list[Leaving] = []
        self.worker: Any = None  #: the worker's reference, once spawned

    @handles(Leaving)
    def on_leaving(self, msg: Leaving) -> None:
        self.leaving.append(msg)
        self.worker.post(EvacuationPlan(()))

    @handles(Evacuated)
    def on_evacuated(self, msg: Evacuated) -> None:
        self.messages.append(msg)


@pytest.mark.anyio
async def test_a_leaving_worker_says_which_of_its_tasks_execute(tmp_path: Path) -> None:
    """One thread: ``busy`` runs, ``behind`` waits in the executor's queue. The Leaving
    names only ``busy``: the scheduler counts ``behind`` as never started."""
    gate, started = tmp_path / "gate", tmp_path / "started"
    sched = LeavingRecorder()
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker("w1", sref, lambda _: None, memory_options={"spill_dir": str(tmp_path)})
            sched.worker = await system.spawn(w, "w1")
            busy = Task("busy", held_at_gate, str(gate), str(started))
            behind = Task("behind", total, np.ones(3))
            sched.worker.post(
                RunTasks((ToRun("busy", busy, "busy", ()), ToRun("behind", behind, "behind", ())))
            )
            await wait_until(started.exists, "busy to start")
            assert await sched.worker.ask(Leave("preempted")) == ()
            (msg,) = sched.leaving
            assert (msg.worker_id, msg.cause, msg.executing) == ("w1", "preempted", ("busy",))
            gate.touch()
            await sched.until(lambda: {"busy", "behind"} <= set(sched.done))


class Target(Actor):
    """Stands for a worker an evacuation copies to: records each CopyFrom and answers
    that it holds the keys, once ``release`` is set."""

    def __init__(self, release: anyio.Event) -> None:
        self.release = release
        self.asked: list[CopyFrom] = []
        self.changed = anyio.Event()

    @handles(CopyFrom)
    def copy_from(self, msg: CopyFrom) -> Later:
        self.asked.append(msg)
        self.changed.set()

        async def answer() -> CopiesReply:
            await self.release.wait()
            return CopiesReply(tuple(key for key, _ in msg.keys))

        return Later(answer())


class FirstPlan(LeavingRecorder):
    """Answers the Leaving with ``x`` to ``t1``."""

    @handles(Leaving)
    def on_leaving(self, msg: Leaving) -> None:
        self.leaving.append(msg)
        self.worker.post(EvacuationPlan((("x", "t1", 10),)))

    @handles(Evacuated)
    def on_evacuated(self, msg: Evacuated) -> None:
        self.messages.append(msg)
        self._wake()


@pytest.mark.anyio
async def test_more_of_the_plan_while_the_copies_are_made_is_copied_too(tmp_path: Path) -> None:
    """t1, the first plan's target, said it leaves while x was being copied to it: the
    scheduler sends more of the plan (x to t2). The leaving worker starts that copy and
    waits for it as well before it says what it copied (it used to drop it)."""
    sched = FirstPlan()
    slow, now = anyio.Event(), anyio.Event()
    now.set()
    t1, t2 = Target(slow), Target(now)
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            refs = {"t1": await system.spawn(t1, "t1"), "t2": await system.spawn(t2, "t2")}
            w = Worker("w1", sref, refs.get, memory_options={"spill_dir": str(tmp_path)})
            sched.worker = await system.spawn(w, "w1")
            copied: list[Any] = []

            async def leave() -> None:
                copied.append(await sched.worker.ask(Leave("preempted"), timeout=LIMIT))

            async with anyio.create_task_group() as tg:
                tg.start_soon(leave)
                await t1.changed.wait()  # the copy to t1 is under way
                sched.worker.post(EvacuationPlan((("x", "t2", 10),)))
                await t2.changed.wait()
                assert [m.keys for m in t2.asked] == [(("x", 10),)]
                slow.set()
            assert sorted(copied[0]) == [("x", "t1"), ("x", "t2")]
            await sched.until(lambda: any(isinstance(m, Evacuated) for m in sched.messages))
            (ev,) = [m for m in sched.messages if isinstance(m, Evacuated)]
            assert sorted(ev.moves) == [("x", "t1"), ("x", "t2")]


def held_on_two(s: Any) -> None:
    """Audit slurm D1's shape: ``x`` (wanted by a client) ran on ``a`` (block-1) and
    ``z``, on ``b`` (block-2), fetched a copy of it; ``c`` (block-3) survives."""
    for name, block in (("a", "block-1"), ("b", "block-2"), ("c", "block-3")):
        joined(s, name, block, pool=f"p{name}")
    submit(s, {"x": [], "z": ["x"]}, ["x", "z"], attrs={"z": {"pool": "pb"}, "x": {"pool": "pa"}})
    finish(s, "a", "x", nbytes=100)
    assert s.tasks["z"].worker == "b"
    finish(s, "b", "z", nbytes=10, fetched=("x",))
    assert s.tasks["x"].who_has == {"a", "b"}


@pytest.mark.parametrize("first", ["a", "b"])
def test_an_output_on_two_workers_that_leave_together_is_copied_once_to_the_survivor(
    make_state: Factory, first: str
) -> None:
    """Audit slurm D1: one job preempts both holders of ``x`` (the original and a
    fetched copy), one Leaving a few ms after the other. The first still counts the
    other as a holder that stays; the second counts none (the first leaves), and copies
    it, its own output or a fetched copy alike: exactly one copy, to the survivor, and
    nothing is computed again."""
    s = make_state(saturation=1.0)
    held_on_two(s)
    second = "b" if first == "a" else "a"
    out = run(s, event(WorkerLeaving, worker=first, cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [
        (first, (("z", "c", 10),) if first == "b" else ())
    ]
    out = run(s, event(WorkerLeaving, worker=second, cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [
        (second, (("x", "c", 100),) if first == "b" else (("x", "c", 100), ("z", "c", 10)))
    ]
    assert copies(out) == []
    evacuated = {"a": (), "b": (("z", "c"),)}
    evacuated[second] += (("x", "c"),)
    run(s, event(WorkerLeft, worker=first, cause="preempted", evacuated=evacuated[first]))
    out = run(s, event(WorkerLeft, worker=second, cause="preempted", evacuated=evacuated[second]))
    assert s.tasks["x"].who_has == {"c"} and s.tasks["z"].who_has == {"c"}
    assert of(out, Execute) == [] and s.storage.recoveries == {}
    assert s.storage.transfers["evacuation"] == 2  # x once, z once


def test_an_output_on_a_leaving_worker_and_its_block_sibling_is_copied_by_one(
    make_state: Factory,
) -> None:
    """Both holders of ``x`` are of one block: the first to say it leaves copies it (its
    sibling goes too, though its Leaving is not here yet), the second does not copy it
    again. If the first goes without the copy, the second is asked for it."""
    s = make_state(saturation=1.0)
    joined(s, "a", "block-1", pool="p")
    joined(s, "b", "block-1", pool="p")
    joined(s, "c", "block-2", pool="q")
    submit(s, {"x": [], "p": []}, ["x", "p"])
    assert (s.tasks["x"].worker, s.tasks["p"].worker) == ("a", "b")
    finish(s, "a", "x", nbytes=100)
    submit(s, {"q": []}, ["q"], attrs={"q": {"pool": "p"}})  # keeps a busy: z, next, runs on b
    finish(s, "b", "p", nbytes=1000)
    submit(s, {"z": ["x"]}, ["z"], attrs={"z": {"pool": "p"}})
    assert s.tasks["z"].worker == "b"
    finish(s, "b", "z", nbytes=10, fetched=("x",))
    assert s.tasks["x"].who_has == {"a", "b"}
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "c", 100),))]
    out = run(s, event(WorkerLeaving, worker="b", cause="preempted"))
    moves = (("p", "c", 1000), ("z", "c", 10))  # its own: x is a's to copy
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("b", moves)]
    # a goes without its copy of x: b, which holds x still, is asked for it.
    out = run(s, event(WorkerLeft, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("b", (("x", "c", 100),))]
    evacuated = (("p", "c"), ("z", "c"), ("x", "c"))
    out = run(s, event(WorkerLeft, worker="b", cause="preempted", evacuated=evacuated))
    assert s.tasks["x"].who_has == {"c"} and s.storage.recoveries == {}
    assert s.storage.transfers["evacuation"] == 3


@pytest.mark.parametrize("copied", [True, False])
def test_an_output_on_a_leaving_and_a_draining_worker_is_copied_once(
    make_state: Factory, copied: bool
) -> None:
    """A draining holder keeps no copy for good (it is retired once it runs nothing):
    the leaving holder copies ``x`` at once, and the draining one, idle, waits for that
    copy instead of making a second one. If the leaving one goes without it, the
    draining one copies ``x`` itself before it is retired: nothing is lost."""
    s = make_state(saturation=1.0)
    held_on_two(s)
    submit(s, {"q": []}, ["q"], attrs={"q": {"pool": "pb"}})  # b is busy while it drains
    assert s.tasks["q"].worker == "b"
    run(s, event(WorkerDraining, worker="b"))
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "c", 100),))]
    out = finish(s, "b", "q", nbytes=10)  # b runs nothing: x stays till a copied it
    assert copies(out) == [("c", "b", (("q", 10),)), ("c", "b", (("z", 10),))]
    run(s, event(ReplicasCopied, worker="c", asked=("q",), got=("q",)))
    out = run(s, event(ReplicasCopied, worker="c", asked=("z",), got=("z",)))
    assert of(out, RetireWorker) == []
    evacuated = (("x", "c"),) if copied else ()
    out = run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=evacuated))
    if not copied:  # asked of b now, which holds it
        assert copies(out) == [("c", "b", (("x", 100),))] and of(out, RetireWorker) == []
        out = run(s, event(ReplicasCopied, worker="c", asked=("x",), got=("x",)))
    assert [r.worker for r in of(out, RetireWorker)] == ["b"]
    run(s, event(WorkerLeft, worker="b", cause="drained"))
    assert s.tasks["x"].who_has == {"c"} and s.storage.recoveries == {}
    assert s.storage.transfers["evacuation"] == 3  # q, z and x: each once


@pytest.mark.anyio
async def test_an_output_fetched_onto_a_second_worker_survives_both_stopping_together(
    tmp_path: Path,
) -> None:
    """Audit slurm D1 on worker processes: ``x`` ran on a, and ``y`` on b fetched a copy
    of it; one job stops a and b (each its own block) together, a first. When a says it
    leaves, b still counts as a holder that stays (a copies only ``w``, its own, large:
    it is still at it when b says it leaves); when b says it leaves, no holder of ``x``
    stays, so b copies its fetched copy to c. Nothing is computed again (no recovery,
    ``x`` ran once although d, of a's pool, could run it again), and ``x`` is read from c."""
    log = tmp_path / "runs"
    n = 2**15  # 256 KiB: b keeps the copy it fetched (a small one)
    async with two_in_jobs_and_a_survivor(tmp_path) as (cli, address, going, c):
        (x,) = await c.submit_graph({"x": (produce, str(log), n)}, ["x"], pool="pa")
        (w,) = await c.submit_graph({"w": (produce, str(tmp_path / "w"), 2**23)}, ["w"], pool="pa")
        (y,) = await c.submit_graph({"y": (total, "x")}, ["y"], pool="pb")
        await w.wait()
        assert await y == float(np.arange(n).sum())  # b holds a copy of x now
        stop_a_then_b(cli, going, address)

        async def a_and_b_gone() -> Any:
            status = await c.status()
            return {v.worker_id for v in status["workers"]} == {"c", "d"} and status

        storage = (await wait_until(a_and_b_gone, "a and b gone", step=0.05))["storage"]
        assert storage["recoveries"] == {}
        assert storage["transfers"]["evacuation"] == 3  # w, x, y: each once
        (z,) = await c.submit_graph({"z": (total, "x")}, ["z"], pool="pc")
        assert await z == float(np.arange(n).sum())
        value = await x
        assert value.shape == (n,) and value[-1] == n - 1
    # computed once: the copy on c was used (read once the processes stopped)
    assert log.read_text() == "ran\n"


def test_with_every_other_worker_draining_a_leaving_workers_output_goes_to_a_drained_one(
    make_state: Factory,
) -> None:
    """Audit fleet: a preempted block's worker held outputs its client had not gathered
    yet while the only other workers drained before their walltime; with no worker
    taking new work its plan copied nothing, and 15 finished tasks ran again. A drained
    worker that stays a while keeps the copy (its drain holds an output only it holds):
    it is not retired while the plan's copies come, keeps the output once they land,
    and copies it on to a worker that joins, then retires; nothing runs again. A
    drained worker that already holds the output needs no copy."""
    s = make_state(saturation=1.0)
    made_on(s, "a", "x", pool="pre")
    join(s, "b", memory=1000, pool="reg")
    submit(s, {"y": []}, ["y"], pool="reg")
    assert s.tasks["y"].worker == "b"  # (a drained worker that runs nothing is retired)
    run(s, event(WorkerDraining, worker="b"))
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "b", 300),))]
    assert of(out, RetireWorker) == []  # the copy is on its way to b
    out = run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=(("x", "b"),)))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {"b"}
    assert of(out, Execute) == [] and of(out, RetireWorker) == [] and s.storage.recoveries == {}
    out = finish(s, "b", "y", nbytes=10)
    assert of(out, RetireWorker) == []  # it keeps x: no worker takes it yet
    out = join(s, "c", memory=1000, pool="reg")
    kept = ("x", "y")  # (y: b's own output, wanted too)
    assert [(t, src, tuple(k for k, _ in keys)) for t, src, keys in copies(out)] == [
        ("c", "b", (k,)) for k in kept
    ]
    out = run(s, event(ReplicasCopied, worker="c", asked=kept, got=kept))
    assert [r.worker for r in of(out, RetireWorker)] == ["b"]
    assert s.tasks["x"].who_has >= {"c"} and s.storage.recoveries == {}


def test_a_leaving_workers_output_a_drained_worker_holds_too_is_not_copied_to_it(
    make_state: Factory,
) -> None:
    """The output is on the leaving worker and on the drained one (a task of it read
    it): the drained one keeps it, no copy goes."""
    s = make_state(saturation=1.0)
    made_on(s, "a", "x", pool="pre")
    join(s, "b", cores=2, memory=1000, pool="reg")
    submit(s, {"z": ["x"], "y": []}, ["z", "y"], pool="reg")
    assert (s.tasks["z"].worker, s.tasks["y"].worker) == ("b", "b")
    finish(s, "b", "z", fetched=("x",))
    assert s.tasks["x"].who_has == {"a", "b"}
    run(s, event(WorkerDraining, worker="b"))  # y runs on
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", ())]


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_preempted_workers_output_waits_on_a_drained_worker_for_the_next(
    tmp_path: Path,
) -> None:
    """Audit fleet on worker processes: the only other worker drains (an operator's
    drain here; a walltime in the audit) and runs a task when the worker holding the
    client's output ``x`` is preempted. The drained worker takes the copy and keeps it
    after its task; once a worker joins (the preempted pool's replacement), ``x`` is
    copied there and the drained one exits. ``x`` was computed once (before: again, on
    the worker that joined)."""
    log, gate, started = tmp_path / "runs", tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        cli.env["SLURM_JOB_ID"] = "4242"  # what the batch system sets inside a job
        in_job = cli.worker(address, "--name", "in-job", "--pool", "pre")
        del cli.env["SLURM_JOB_ID"]
        async with Cluster(address) as c, ConsoleClient(address) as console:
            await c.wait_for_workers(1)
            x = c.submit(produce, str(log), 2**20, pool="pre", pure=False)
            await x.wait()
            other = cli.worker(address, "--name", "other", "--pool", "reg")
            held = c.submit(held_at_gate, str(gate), str(started), pool="reg", pure=False)
            await wait_until(started.exists, "the task on the other worker started")
            await console.drain("other")
            in_job.send_signal(signal.SIGTERM)
            assert in_job.wait(LIMIT) == 0
            gate.touch()
            assert await held == "opened"
            cli.worker(address, "--name", "next", "--pool", "pre")  # its replacement
            assert other.wait(LIMIT) == 0  # retired once x was copied to next
            value = await x
            assert value.shape == (2**20,) and value[-1] == 2**20 - 1
        assert log.read_text() == "ran\n"  # computed once: the copies were used


def test_a_keeper_that_ends_its_last_task_while_copies_come_is_kept_and_consistent(
    make_state: Factory,
) -> None:
    """The drained keeper finishes its last task before the leaving worker says which
    copies it made: it runs nothing, keeps nothing yet, and is not retired (copies
    come to it), a state the invariants allow (before, ``validate`` failed on it:
    'draining but not retired'); once the copy lands it keeps it, and retires once
    the output goes to a worker that joins."""
    s = make_state(saturation=1.0)
    made_on(s, "a", "x", pool="pre")
    join(s, "b", memory=1000, pool="reg")
    submit(s, {"y": []}, ["y"], pool="reg")
    run(s, event(WorkerDraining, worker="b"))
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "b", 300),))]
    out = finish(s, "b", "y", nbytes=10)
    assert of(out, RetireWorker) == [] and not s.workers["b"].retired
    out = run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=(("x", "b"),)))
    assert s.tasks["x"].who_has == {"b"} and of(out, RetireWorker) == []
    assert s.workers["b"].keeping == {s.tasks["x"], s.tasks["y"]}
    out = join(s, "c", memory=1000, pool="reg")
    kept = ("x", "y")
    assert [(t, src) for t, src, _ in copies(out)] == [("c", "b"), ("c", "b")]
    out = run(s, event(ReplicasCopied, worker="c", asked=kept, got=kept))
    assert [r.worker for r in of(out, RetireWorker)] == ["b"]
    assert s.storage.recoveries == {}


def block_and_two_regulars(s: Any, b_cores: int) -> None:
    """``a`` of block ``B1`` (pool ``pre``) makes ``x`` (300 bytes, wanted); ``b``
    (``b_cores``) and ``c`` of pool ``reg`` join; ``a`` runs ``w`` when ``a2``, of
    ``B1`` too, joins (so the next task of ``pre`` runs on ``a2``)."""
    joined(s, "a", "B1", pool="pre")
    submit(s, {"x": []}, ["x"], pool="pre")
    finish(s, "a", "x", nbytes=300)
    join(s, "b", cores=b_cores, memory=1000, pool="reg")
    join(s, "c", memory=1000, pool="reg")
    submit(s, {"w": []}, ["w"], pool="pre")  # (a is busy: z runs on a2)
    joined(s, "a2", "B1", pool="pre")


def test_an_output_a_keeper_holds_or_has_coming_is_not_copied_to_keepers_again(
    make_state: Factory,
) -> None:
    """With no worker taking new work, an output is copied once to the drained
    keepers: two workers of a preempted block each hold x; the first to say it leaves
    copies it to keeper b, the second copies only what it alone holds (before, x went
    to b twice within the grace). And an output a keeper holds already goes to no
    other keeper (before, with two keepers, to the other one)."""
    s = make_state(saturation=1.0)
    block_and_two_regulars(s, b_cores=2)
    submit(s, {"z": ["x"], "v": []}, ["z", "v"], pool="pre")
    assert (s.tasks["z"].worker, s.tasks["w"].worker) == ("a2", "a")
    finish(s, "a2", "z", fetched=("x",), nbytes=100)
    submit(s, {"u": ["z"], "t": [], "y": []}, ["u", "t", "y"], pool="reg")
    assert {k: s.tasks[k].worker for k in "uty"} == {"u": "b", "t": "c", "y": "b"}
    finish(s, "b", "u", fetched=("z",))  # b read z: holds it too, and runs on
    assert s.tasks["z"].who_has == {"a2", "b"}
    for w in ("b", "c"):
        run(s, event(WorkerDraining, worker=w))
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    [plan] = of(out, Evacuate)
    assert [(key, target) for key, target, _ in plan.moves] in ([("x", "b")], [("x", "c")])
    out = run(s, event(WorkerLeaving, worker="a2", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a2", ())]


def keepers_b_and_c(s: Any) -> None:
    """``b`` and ``c`` (pool ``reg``) each run a task and drain: no worker takes new
    work, and they are the keepers."""
    submit(s, {"y": [], "t": []}, ["y", "t"], pool="reg")
    assert {s.tasks["y"].worker, s.tasks["t"].worker} == {"b", "c"}
    for w in ("b", "c"):
        run(s, event(WorkerDraining, worker=w))


def test_a_leaving_worker_s_outputs_go_to_the_keeper_that_lives_longest(
    make_state: Factory,
) -> None:
    """An audit: with no worker taking new work, a preempted worker's outputs went to
    the keeper that would then hold the fewest bytes (the lowest id among equals),
    though that keeper's walltime ended in minutes and another's in hours: the copy was
    lost again with it, and computed again. The keepers whose walltime ends last (none:
    last of all) take them now."""
    s = make_state(saturation=1.0)
    made_on(s, "a", "x", pool="pre")
    now = s._now
    run(s, event(WorkerJoined, worker="b", cores=1, memory=1000, pool="reg", deadline=now + 600))
    run(s, event(WorkerJoined, worker="c", cores=1, memory=1000, pool="reg", deadline=now + 9e4))
    keepers_b_and_c(s)
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", "c", 300),))]


def test_keepers_of_one_walltime_share_a_leaving_worker_s_outputs(
    make_state: Factory,
) -> None:
    """A review: keepers whose walltime ends at the same time (one block's workers, or
    blocks started together) do not have equal deadlines on the scheduler's clock: each
    is its walltime read at its own join, a few microseconds to seconds apart. The
    choice of the keeper that lives longest took the one whose deadline was the
    largest by those microseconds alone, and every output of a leaving worker went to
    it (until it had no room), none to the others: a copy goes to the keeper that will
    then hold the fewest bytes among those whose walltime ends within a minute of the
    last (:data:`actors.scheduler_state.KEEPERS_ALIKE`)."""
    s = make_state(saturation=1.0)
    made_on(s, "a", "x", pool="pre")
    submit(s, {"x2": []}, ["x2"], pool="pre")
    finish(s, "a", "x2", nbytes=300)
    now = s._now
    for worker, jitter in (("b", 0.0), ("c", 0.5)):  # one walltime, read at two joins
        ends = now + 9e4 + jitter
        run(s, event(WorkerJoined, worker=worker, cores=1, memory=1000, pool="reg", deadline=ends))
    keepers_b_and_c(s)
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    [plan] = of(out, Evacuate)
    assert sorted(target for _, target, _ in plan.moves) == ["b", "c"], plan.moves


def test_a_copy_planned_onto_a_worker_that_dies_goes_to_another_one(
    make_state: Factory,
) -> None:
    """The keeper a preempted worker copies x to is killed at its walltime (no Leaving
    of its own) while the copy is on its way: the leaving worker, which still holds x,
    copies it to the other keeper (more of its plan), and x is not computed again
    (before: no new plan, x lost with the preempted worker and run again)."""
    s = make_state(saturation=1.0)
    made_on(s, "a", "x", pool="pre")
    join(s, "b", memory=1000, pool="reg")
    join(s, "c", memory=1000, pool="reg")
    keepers_b_and_c(s)
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    [plan] = of(out, Evacuate)
    [(_, first, _)] = plan.moves
    other = ({"b", "c"} - {first}).pop()
    out = run(s, event(WorkerLeft, worker=first, cause="walltime"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", (("x", other, 300),))]
    run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=(("x", other),)))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {other}
    assert s.storage.recoveries == {}


def test_an_output_left_only_on_leaving_workers_by_a_lost_worker_is_copied_on(
    make_state: Factory,
) -> None:
    """``x`` is held by ``a`` and ``b``, both preempted: ``b`` copies it to a survivor
    (``a`` leaves it to that copy) and goes; that survivor is then killed at its
    walltime (no Leaving of its own) while ``a``, which still holds ``x``, is in its
    grace: ``a`` copies ``x`` to the other survivor, and ``x`` is not computed again
    (before: no new plan, ``x`` lost with ``a`` and run again)."""
    s = make_state(saturation=1.0)
    held_on_two(s)
    joined(s, "d", "block-4", pool="pd")
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", ())]
    out = run(s, event(WorkerLeaving, worker="b", cause="preempted"))
    [plan] = of(out, Evacuate)
    made = tuple((key, target) for key, target, _ in plan.moves)
    [first] = {target for key, target in made if key == "x"}
    other = ({"c", "d"} - {first}).pop()
    run(s, event(WorkerLeft, worker="b", cause="preempted", evacuated=made))
    x_copied_on_when_its_copy_is_lost(s, "a", first, other, 100)


def test_an_output_a_keeper_lost_held_with_leaving_workers_only_goes_to_another(
    make_state: Factory,
) -> None:
    """With no worker taking new work: ``x`` is held by ``a`` and ``a2`` of a
    preempted block; ``a`` copies it to keeper ``first`` (``a2`` leaves it to that
    copy: ``_on_keepers``), and goes; ``first`` is then killed at its walltime while
    ``a2`` is in its grace: ``a2`` copies ``x`` to the other keeper (before: ``x`` lost
    with ``a2`` and computed again)."""
    s = make_state(saturation=1.0)
    block_and_two_regulars(s, b_cores=1)
    submit(s, {"z": ["x"]}, ["z"], pool="pre")
    assert (s.tasks["z"].worker, s.tasks["w"].worker) == ("a2", "a")
    finish(s, "a2", "z", fetched=("x",), nbytes=100)
    keepers_b_and_c(s)
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    [plan] = of(out, Evacuate)
    [(key, first, _)] = plan.moves
    assert key == "x"
    other = ({"b", "c"} - {first}).pop()
    out = run(s, event(WorkerLeaving, worker="a2", cause="preempted"))
    assert [(p.worker, [k for k, _, _ in p.moves]) for p in of(out, Evacuate)] == [("a2", ["z"])]
    run(s, event(WorkerLeft, worker="a", cause="preempted", evacuated=(("x", first),)))
    x_copied_on_when_its_copy_is_lost(s, "a2", first, other, 300)


def x_copied_on_when_its_copy_is_lost(
    s: Any, holder: str, first: str, other: str, nbytes: int
) -> None:
    """``x`` is held by leaving ``holder`` and by ``first``, where a copy landed;
    ``first`` is killed at its walltime (no Leaving of its own): ``holder`` copies ``x``
    to ``other``, and ``x`` is not computed again (before: no new plan, ``x`` lost
    with ``holder`` and run again)."""
    assert s.tasks["x"].who_has == {holder, first}
    out = run(s, event(WorkerLeft, worker=first, cause="walltime"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [(holder, (("x", other, nbytes),))]
    run(s, event(WorkerLeft, worker=holder, cause="preempted", evacuated=(("x", other),)))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {other}
    assert s.storage.recoveries.get("x") is None


@pytest.mark.parametrize("lost", ["target", "source"])
def test_once_the_cluster_stops_no_more_of_a_plan_is_asked(make_state: Factory, lost: str) -> None:
    """The run ended (``ClusterStops``) while two holders of ``x`` leave, one with a
    planned copy of it: nothing reads ``x`` any more, so neither the loss of that
    copy's target nor its source going without it asks the other holder for a copy
    (before: more of its plan, a copy made within its grace for nothing)."""
    s = make_state(saturation=1.0)
    held_on_two(s)
    joined(s, "d", "block-4", pool="pd")
    run(s, event(WorkerLeaving, worker="b", cause="preempted"))
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    [plan] = of(out, Evacuate)
    [(key, target, _)] = plan.moves
    assert key == "x"
    run(s, event(ClusterStops))
    gone = target if lost == "target" else "a"
    out = run(s, event(WorkerLeft, worker=gone, cause="walltime"))
    assert of(out, Evacuate) == [] and copies(out) == []
