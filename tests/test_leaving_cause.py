"""A worker process that is stopped says why: drained, walltime, preempted or shutdown.

The cause decides whether the user's retry budget is touched and how the pool's worker
lives are counted, so it is checked both as a pure function and end to end: a worker
process inside a (Slurm) job that gets SIGTERM while running a task reports
``preempted``; the task runs again on another worker with its ``retries=0`` budget
untouched, and its story says why.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.node import WALLTIME_MARGIN, leaving_cause
from tests.helpers import Cli, held_at_gate, wait_until

LIMIT = 60  # seconds per test
SLURM = {"SLURM_JOB_ID": "4242"}


def test_the_cause_of_leaving() -> None:
    deadline = 1000.0
    # Retired by the scheduler: the cause its Stop gives (its walltime drain's, walltime).
    assert leaving_cause("drained", 999.0, deadline, SLURM) == "drained"
    assert leaving_cause("walltime", 100.0, deadline, SLURM) == "walltime"
    assert leaving_cause("", 999.0, deadline, SLURM) == "drained"
    assert leaving_cause("crash", 999.0, deadline, SLURM) == "crash"  # its own core failed
    assert leaving_cause(None, deadline - WALLTIME_MARGIN, deadline, SLURM) == "walltime"
    assert leaving_cause(None, deadline + 5, deadline, {}) == "walltime"
    assert leaving_cause(None, deadline - WALLTIME_MARGIN - 1, deadline, SLURM) == "preempted"
    assert leaving_cause(None, 5.0, None, SLURM) == "preempted"
    assert leaving_cause(None, 5.0, None, {}) == "shutdown"
    # A Slurm pool's signal_warning (its script sets CORRAL_SIGNAL_WARNING): signalled
    # that long before the walltime, the stop is the walltime, not a preemption.
    warned = {**SLURM, "CORRAL_SIGNAL_WARNING": "300"}
    assert leaving_cause(None, 700.0, deadline, warned) == "walltime"
    assert leaving_cause(None, 700.0, deadline, SLURM) == "preempted"
    assert leaving_cause(None, deadline - 300 - WALLTIME_MARGIN - 1, deadline, warned) == (
        "preempted"
    )
    assert leaving_cause(None, 700.0, deadline, {**SLURM, "CORRAL_SIGNAL_WARNING": "x"}) == (
        "preempted"
    )


@pytest.mark.anyio
async def test_sigterm_inside_a_job_is_a_preemption_that_costs_no_retry(tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        cli.env.update(SLURM)  # what the batch system sets inside a job
        in_job = cli.worker(address, "--name", "in-job")
        del cli.env["SLURM_JOB_ID"]
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            (fut,) = await c.submit_graph(
                {"t": (held_at_gate, str(gate), str(started))}, ["t"], retries=0
            )
            await wait_until(started.exists, limit=LIMIT)
            started.unlink()
            cli.worker(address, "--name", "other")
            await c.wait_for_workers(2)
            in_job.send_signal(signal.SIGTERM)
            await wait_until(started.exists, limit=LIMIT)  # running again, elsewhere
            gate.touch()
            assert await fut == "opened"
            story = await c.story("t")
            retries = [entry[2] for entry in story if entry[1] == "retry"]
            assert retries == ["worker lost (preempted); free retry"]
        assert in_job.wait(LIMIT) == 0


@pytest.mark.anyio
async def test_status_shows_how_long_a_pools_workers_live(tmp_path: Path) -> None:
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        cli.env.update(SLURM)
        preempted = cli.worker(address, "--name", "p", "--pool", "ckpt")
        del cli.env["SLURM_JOB_ID"]
        cli.worker(address, "--name", "q", "--pool", "ckpt")
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            before = (await c.status())["survival"]["ckpt"]
            assert (before["lives"], before["deaths"], before["median"]) == (2, 0, None)
            preempted.send_signal(signal.SIGTERM)
            assert preempted.wait(LIMIT) == 0

            async def counted() -> Any:
                life = (await c.status())["survival"]["ckpt"]
                return life if life["deaths"] == 1 else None

            life = await wait_until(counted, "the preemption counted", limit=LIMIT, step=0.1)
            # One of two died young; neither lived an hour: that is not known.
            assert life["lives"] == 2 and life["median"] is not None
            assert life["median"] < 60 and life["survive_1h"] is None
