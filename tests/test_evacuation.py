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

from actors.scheduler_events import Evacuate, WorkerLeaving, WorkerLeft
from tests.helpers import Cli, Factory, event, finish, join, make_state, of, run, submit

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
