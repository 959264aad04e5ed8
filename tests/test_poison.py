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
import time

import anyio
import pytest

from runtime import Cluster
from runtime.errors import TaskCrashedWorkers
from runtime.node import serve_gateway

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
