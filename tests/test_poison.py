"""A poison task cannot take the fleet down (issue 9): a task that kills its worker
process (``os._exit`` in default thread execution) fails with TaskCrashedWorkers, naming
the workers it took, after at most ``max_crashes`` (3) workers were lost, and the
cluster goes on running other work. Each loss is seen as its process exits (the
autoscaler reports its block's worker), not after the gateway's reconnection grace.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import time
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import TaskCrashedWorkers
from runtime.node import serve_gateway
from tests.helpers import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
LIMIT = 90
#: the gateway's reconnection grace for a worker whose connection dropped
GRACE: float = inspect.signature(serve_gateway).parameters["reconnect_timeout"].default


def poison() -> None:
    os._exit(1)


async def test_a_task_that_kills_its_worker_fails_after_three_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as c:
            await c.wait_for_workers(2, timeout=60)
            start = time.monotonic()
            with pytest.raises(TaskCrashedWorkers) as err:
                await c.submit(poison)
            took = time.monotonic() - start
            # Three workers lost (and two replaced) in less than one grace period.
            assert took < GRACE, took
            crashes = err.value.crashes
            assert len(crashes) == 3 and len({w for w, _ in crashes}) == 3
            assert "poison" in str(err.value)
            # Each loss's log line names the task the worker was running.
            lost_lines = [r.getMessage() for r in caplog.records if "worker lost" in r.getMessage()]
            assert len(lost_lines) == 3, lost_lines
            key = err.value.key
            assert all(f"running=[{key!r}]" in m and "more=0" in m for m in lost_lines), lost_lines
            st = await c.status()
            lost = sum(cat["lost"] for cat in st["categories"].values())
            assert lost == 3, st["categories"]  # no more workers than that went down
            # the fleet is replaced and still runs work
            await c.wait_for_workers(1, timeout=60)
            assert await c.submit(sum, [1, 2, 3]) == 6
    print(f"poison task failed after {took:.1f} s")


def tiny(i: int) -> int:
    return i + 1


def hold(gate: str) -> int:
    """Run until ``gate`` exists (bounded: the worker is killed long before)."""
    deadline = time.monotonic() + LIMIT
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


async def test_a_task_queued_behind_one_running_survives_three_kills_of_its_worker(
    tmp_path: Path,
) -> None:
    """The physics audit's repro: one 1-core worker runs a long task and holds a fast
    one in its queue; it is killed (SIGKILL, as the OOM killer does) and replaced,
    three times. The long one, which the worker said executes each time, fails with
    TaskCrashedWorkers; the fast one, which never started, is not blamed and finishes
    (before, it failed too)."""
    with anyio.fail_after(LIMIT * 2):
        async with Cluster(processes=1, threads_per_worker=1) as c:
            await c.wait_for_workers(1, timeout=60)
            state = c.scheduler_state
            provider = c._plane.provider
            assert await c.gather(c.map(tiny, range(10))) == list(range(1, 11))  # fast
            h = c.submit(hold, str(tmp_path / "never"), pure=False)
            hs = await wait_until(lambda: state.tasks.get(h.key), "hold submitted", limit=60)
            await wait_until(lambda: hs.started is not None, "hold said executing", limit=60)
            t = c.submit(tiny, 1000)
            ts = await wait_until(lambda: state.tasks.get(t.key), "tiny submitted", limit=60)
            for _ in range(3):
                # Both on one worker, hold said executing there (its one thread: tiny
                # waits in its queue).
                await wait_until(
                    lambda: hs.started is not None and ts.worker == hs.worker is not None,
                    "hold executing and tiny queued on one worker",
                    limit=60,
                )
                wid = hs.worker
                pid = next(
                    p for b in provider.blocks.values() for w, p in provider.pids(b).items()
                    if w == wid
                )  # fmt: skip
                os.kill(pid, signal.SIGKILL)
                await wait_until(lambda w=wid: w not in state.workers, "the worker lost", limit=60)
            with pytest.raises(TaskCrashedWorkers):
                await h
            assert await t == 1001
            assert ts.crash_tries == 0 and ts.lost_tries == 3 and hs.crash_tries == 3
