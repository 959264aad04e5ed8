"""An embedded cluster with no worker says why its tasks wait, as a client of a manager.

A bad-input audit: ``Cluster(workers=0)`` and ``Cluster(processes=0)`` (documented:
nothing runs until ``await cluster.scale(n)``) took a task and waited for ever with
nothing logged, where a client of a manager process logs "no worker to run the ready
tasks" at its next look at the manager's alerts. The embedded cluster now looks at its
own manager's alerts the same way (``manager_alerts`` seconds) and logs the same
warning, naming ``scale``; gated on the log line, then on the task's value.
"""

from __future__ import annotations

import logging
import operator

import anyio
import pytest

from runtime import Cluster
from tests.helpers import free_port, log_lines, wait_until

LIMIT = 10.0
QUICK = {"manager_alerts": 0.1, "alerting": {"interval": 0.1}}


@pytest.mark.anyio
@pytest.mark.parametrize("sizing", [{"workers": 0}, {"processes": 0, "port": 0}])
async def test_an_embedded_cluster_without_workers_warns_that_its_tasks_wait(
    sizing: dict[str, int],
) -> None:
    with anyio.fail_after(LIMIT), log_lines("corral.client", logging.WARNING) as log:
        if "port" in sizing:  # a gateway on a port free now
            sizing = {**sizing, "port": free_port()}
        async with Cluster(**sizing, **QUICK) as cluster:  # type: ignore[arg-type]
            fut = cluster.submit(operator.add, 1, 2)
            line = await wait_until(
                lambda: log.with_("no worker to run the ready tasks"), "the warning"
            )
            assert "manager='this process'" in line and "ready=1" in line
            assert "this cluster has none there: `await cluster.scale(n)` starts n" in line
            assert "start workers, or replacements" not in line
            assert len(log.lines) == 1  # once an episode, and no alert logged twice
            await cluster.scale(1)
            assert await fut == 3
