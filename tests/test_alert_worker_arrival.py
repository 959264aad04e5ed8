"""A worker's arrival is news to the alert monitor at once, on real processes.

A left-over audit problem: ``CorralNoWorkers`` was still pending seconds after a worker
joined (up to the evaluation ``interval``, 5 s by default: 3.7-4.0 s measured), so a
client looking at the alerts then was told its tasks had no worker. The scheduler now
tells the monitor of each worker that joins (``WorkerArrived``, process-local) and the
monitor evaluates at once. Here the interval is a minute, so every change the test
awaits can only come from those arrivals: a worker of pool ``cpu`` joining makes the
monitor see that pool ``gpu``'s ready task has no worker (pending), and one of pool
``gpu`` joining ends that. Each step is a bounded poll of the manager's alerts.
"""

from __future__ import annotations

import operator
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.messages import AlertsReply
from tests.helpers import Cli, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60  # well under the interval: no evaluation of its clock comes meanwhile


def _no_workers(reply: AlertsReply) -> list[str]:
    """The pools whose ``CorralNoWorkers`` alert is pending."""
    return [
        a.labels.get("pool", "")
        for a in reply.alerts
        if a.name == "CorralNoWorkers" and a.state == "pending"
    ]


async def test_no_workers_clears_as_a_worker_of_the_pool_joins(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text("[alerting]\ninterval = 600\n")
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager("--config", str(config), "--no-monitoring")
        token = cli.tokens(address)["submit"]
        async with Cluster(address, token=token, manager_alerts=None) as cluster:
            fut = cluster.submit(operator.add, 1, 2, pool="gpu")
            await cluster.status()  # (its batch went out before this answer came)
            assert _no_workers(await cluster.alerts()) == []  # the start's evaluation
            cli.worker(address, "--cores", "1", "--pool", "cpu")
            pools = await wait_until(
                lambda: _pending(cluster), "the arrival's evaluation", limit=LIMIT, step=0.1
            )
            assert pools == ["gpu"]
            cli.worker(address, "--cores", "1", "--pool", "gpu")
            await wait_until(lambda: _cleared(cluster), "the alert to clear", limit=LIMIT, step=0.1)
            assert await fut == 3


async def _pending(cluster: Cluster) -> list[str]:
    return _no_workers(await cluster.alerts())


async def _cleared(cluster: Cluster) -> bool:
    return not _no_workers(await cluster.alerts())
