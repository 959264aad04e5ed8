"""Data evacuation: a worker that is going (preempted, past its walltime, stopped)
copies the outputs that are still needed and held nowhere else to a surviving worker
before it leaves, so nothing is computed again.

The scheduler's core is fed events (which outputs go where, and that a copy made
before the loss keeps the output); then real worker processes: one inside a (Slurm)
job environment is SIGTERMed holding the only copy of a wanted output, and the output
is gathered from the other worker without its task running a second time.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from actors.protocol import ToRun
from actors.scheduler_events import Evacuate, WorkerJoined, WorkerLeaving, WorkerLeft
from actors.worker import Leave, Worker
from runtime.graph import Task
from runtime.kernel import ActorSystem, handles
from runtime.messages import Evacuated, EvacuationPlan, Leaving, RunTasks
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
    from runtime import Cluster

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
    # b and c go (another pool's block of the same name is no sibling: c is a target).
    run(s, event(WorkerLeft, worker="b", cause="preempted"))
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    ((plan,),) = [of(out, Evacuate)]
    assert plan.moves == (("x", "c", 100),)
    run(s, event(WorkerLeft, worker="c", cause="preempted"))
    # Only the sibling is left: no plan (x is computed again if a goes), as with none.
    out = run(s, event(WorkerLeaving, worker="a", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("a", ())]
    out = run(s, event(WorkerLeft, worker="a", cause="preempted"))
    assert s.tasks["x"].state != "memory" and s.tasks["x"].who_has == set()


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
