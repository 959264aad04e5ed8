"""A worker process that is stopped says why: drained, walltime, preempted or shutdown.

The cause decides whether the user's retry budget is touched and how the pool's worker
lives are counted, so it is checked both as a pure function and end to end: a worker
process inside a (Slurm) job that gets SIGTERM while running a task reports
``preempted``; the task runs again on another worker with its ``retries=0`` budget
untouched, and its story says why.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.worker import STOP_SIGNALLED, note_stop_signal
from runtime import Cluster
from runtime.node import WALLTIME_MARGIN, leaving_cause
from tests.helpers import Cli, held_at_gate, nodes, wait_until
from tests.test_checkpoints import _lines
from tests.test_monitordb import _rows

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
    # A bad value is refused (before, "x" was silently 0: a walltime stop could read as
    # a preemption); run_worker checks it before it joins (test_signal_warning_env).
    with pytest.raises(ValueError, match="CORRAL_SIGNAL_WARNING='x' is not a number"):
        leaving_cause(None, 700.0, deadline, {**SLURM, "CORRAL_SIGNAL_WARNING": "x"})


def worker_in_a_job(cli: Cli, address: str, *flags: str) -> Any:
    """A worker process ``in-job`` with what the batch system sets inside a job."""
    cli.env.update(SLURM)
    try:
        return cli.worker(address, "--name", "in-job", *flags)
    finally:
        del cli.env["SLURM_JOB_ID"]


@pytest.mark.anyio
async def test_sigterm_inside_a_job_is_a_preemption_that_costs_no_retry(tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        in_job = worker_in_a_job(cli, address)
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


def gated_stepper(log: str, gate: str, steps: int) -> int:
    """``steps`` checkpointed steps, each noted in ``log`` with the process running it
    (as ``tests.test_checkpoints.stepper``), holding before step 3 until ``gate``
    exists (at most 60 s), adding a byte to ``gate + ".beat"`` every 0.1 s meanwhile."""
    import time

    from runtime import checkpoint, restore

    done = restore() or 0
    for i in range(done, steps):
        for _ in range(600 if i == 3 else 0):
            if os.path.exists(gate):
                break
            with open(gate + ".beat", "a") as f:
                f.write(".")
            time.sleep(0.1)
        with open(log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        checkpoint(i + 1)
    return sum(range(steps))


def _size(path: Path) -> int:
    return path.stat().st_size


@pytest.mark.anyio
async def test_sigterm_to_a_process_execution_job_s_whole_group_is_a_free_retry(
    tmp_path: Path,
) -> None:
    """Slurm's preemption (and scancel, and the kill at the walltime) signals every
    process of the job: the worker and its task processes get SIGTERM together. The
    task process does not die of it (the worker stops it itself), so the try is lost
    with its worker, free, and the next try resumes from its checkpoint."""
    log, gate, steps = tmp_path / "steps", tmp_path / "gate", 6
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        cli.env.update(SLURM)
        flags = ("--execution", "process", "--name", "in-job", "--spill-dir", str(tmp_path / "a"))
        in_job = cli.spawn(["setsid", sys.executable, "-m", "runtime", "worker", address, *flags])
        cli.line_with(in_job, "joined")
        del cli.env["SLURM_JOB_ID"]
        assert os.getpgid(in_job.pid) == in_job.pid  # a job of its own, as under Slurm
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            (fut,) = await c.submit_graph(
                {"sim": (gated_stepper, str(log), str(gate), steps)}, ["sim"], retries=0
            )
            beat = Path(f"{gate}.beat")
            await wait_until(beat.exists, "the task held at its gate", limit=LIMIT)
            cli.worker(address, "--name", "other", "--execution", "process",
                       "--spill-dir", str(tmp_path / "b"))  # fmt: skip
            await c.wait_for_workers(2)
            # Slurm's signals reach the job's processes in no set order. The task
            # process's first (the order the old code failed in): it lives on, its
            # heart beating, or it died and its try erred, before the worker's signal.
            beats = _size(beat)
            os.kill(_lines(log)[-1][1], signal.SIGTERM)

            async def survived_or_erred() -> bool:
                if _size(beat) >= beats + 3:
                    return True
                return any(e[2] == "erred" for e in await c.story("sim"))

            await wait_until(survived_or_erred, "the task process's fate", limit=LIMIT, step=0.05)
            os.killpg(in_job.pid, signal.SIGTERM)  # then the whole job: worker and task
            assert in_job.wait(LIMIT) == 0
            gate.touch()
            assert await fut == sum(range(steps))
            story = await c.story("sim")
            why = [entry[2] for entry in story if entry[1] == "retry"]
            assert len(why) == 1, "\n".join(map(str, story))
            # It resumes from a checkpoint: it keeps its place (docs/policies.md, retry).
            assert why[0].startswith("worker lost (preempted); free retry; its checkpoint "), why
            assert why[0].endswith("it keeps its place in the queue, not behind fresh work"), why
            assert [e for e in story if e[1] == "resume"], story
            assert not [e for e in story if e[2] == "erred"], story
            assert (await c.status())["checkpoints"]["resumed"] == 1
    done = [s for s, _ in _lines(log)]
    assert done == list(range(steps))  # resumed from its checkpoint: no step redone
    assert len({pid for _, pid in _lines(log)}) == 2  # two tries, two task processes


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


def tool_until_gate(pids: str, gate: str) -> str:
    """A bash_app-like task: runs a command-line tool (a shell waiting for ``gate``),
    having written the tool's pid and its worker's to ``pids``, and fails if the tool
    does (``check=True``)."""
    import subprocess

    tool = subprocess.Popen(["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.05; done'])
    with open(pids + ".part", "w") as f:
        f.write(f"{tool.pid} {os.getppid()}")
    os.replace(pids + ".part", pids)
    if tool.wait() != 0:
        raise subprocess.CalledProcessError(tool.returncode, tool.args)
    return "tool done"


@pytest.mark.anyio
async def test_a_tool_the_batch_system_s_sigterm_killed_is_a_free_retry_not_a_failure(
    tmp_path: Path,
) -> None:
    """A user audit (astro, on Slurm): a preemption's SIGTERM reaches every process of
    the job, the tool a task runs too, which dies of it at once; its task raised
    ``CalledProcessError`` ("died with SIGTERM") and the try was reported as the task's
    error before the worker's leave: a retry spent, or with ``retries=0`` the task
    failed. Now a try that ends in error after the worker's stop signal is lost with
    the worker: a free retry. Here the tool is signalled first, then its worker."""
    pids, gate = tmp_path / "pids", tmp_path / "gate"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        in_job = worker_in_a_job(cli, address, "--execution", "process")
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            (fut,) = await c.submit_graph(
                {"t": (tool_until_gate, str(pids), str(gate))}, ["t"], retries=0
            )
            await wait_until(pids.exists, limit=LIMIT)
            tool, worker = (int(n) for n in pids.read_text().split())
            assert worker == in_job.pid
            pids.unlink()
            cli.worker(address, "--name", "other")
            await c.wait_for_workers(2)
            os.kill(tool, signal.SIGTERM)  # as Slurm signals the job's processes
            os.kill(worker, signal.SIGTERM)
            await wait_until(lambda: pids.exists() or fut.done(), limit=LIMIT)
            assert not fut.done(), f"the task failed: {await fut.exception()!r}"
            # (it runs again, elsewhere)
            gate.touch()
            assert await fut == "tool done"
            story = await c.story("t")
            retries = [entry[2] for entry in story if entry[1] == "retry"]
            assert retries == ["worker lost (preempted); free retry"]
        assert in_job.wait(LIMIT) == 0


@pytest.mark.anyio
async def test_a_try_whose_tool_the_stop_signal_killed_is_recorded_as_having_run(
    tmp_path: Path,
) -> None:
    """The tries above, lost with their worker, ran until the signal: the scheduler is
    told so (the worker's ``Leaving`` lists them as executing, with their seconds),
    also those whose error came back before the worker said it leaves. Said nowhere,
    such a try read as one that never started (``ran`` 0 s: its row's ``started`` is its
    ``ended``): no walltime loss known (a task longer than its walltime was not told
    from one that started late), no run for the fallback move, 0 s in the report's
    'what preemption cost'. Three tools, each error racing the worker's leave: before
    the fix, one or more read as never started in most runs."""
    gate, db = tmp_path / "gate", tmp_path / "monitoring.db"
    pids = [tmp_path / f"pids-{i}" for i in range(3)]
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager("--monitoring", str(db), "--monitoring-interval", "0.2")
        in_job = worker_in_a_job(cli, address, "--cores", "3")
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            graph = {f"t{i}": (tool_until_gate, str(p), str(gate)) for i, p in enumerate(pids)}
            futs = await c.submit_graph(graph, list(graph), retries=0)
            await wait_until(lambda: all(p.exists() for p in pids), limit=LIMIT)
            tools = [int(p.read_text().split()[0]) for p in pids]
            cli.worker(address, "--name", "other", "--cores", "3")
            await c.wait_for_workers(2)
            killed = time.time()
            os.kill(in_job.pid, signal.SIGTERM)  # then its tools, as a job's processes are
            for tool in tools:
                os.kill(tool, signal.SIGTERM)
            assert in_job.wait(LIMIT) == 0
            gate.touch()
            assert [await f for f in futs] == ["tool done"] * 3
    rows = _rows(db, "SELECT key, started, ended FROM tries WHERE outcome = 'worker-lost'")
    assert len(rows) == 3, rows
    never = [(key, started, ended) for key, started, ended in rows if not started < killed]
    assert not never, f"read as never started (killed at {killed}): {never}"


def fails() -> None:
    raise ValueError("the task's own error")


@pytest.mark.anyio
async def test_a_worker_run_after_an_earlier_one_s_stop_signal_reports_its_task_errors() -> None:
    """A program that runs a worker in its own process (``run_worker``), stopped by a
    signal, then runs another: that worker got no stop signal and is not leaving, so a
    task's error is the task's (here it fails, ``retries=0``). The first run's signal
    was kept for the process's life: every error was dropped as the stop's, its try
    neither reported nor lost, and the task waited for ever."""
    note_stop_signal(signal.SIGTERM, None)  # what the earlier run's signal left behind
    try:
        with anyio.fail_after(LIMIT):
            async with nodes(1) as (address, _), Cluster(address) as c:
                await c.wait_for_workers(1)
                with pytest.raises(ValueError, match="the task's own error"):
                    await c.submit(fails, retries=0)
    finally:
        STOP_SIGNALLED.clear()
