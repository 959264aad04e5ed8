"""A client does not show the queue alert while its pool's blocks start.

A left-over audit problem: while a Slurm run's blocks waited in the batch queue, the
client's terminal showed ``alert firing ... CorralQueueTime``, though queuing while
blocks start is normal; and its "no worker to run the ready tasks" warning said to
start workers, though they were starting. The client now holds a ``CorralQueueTime``
that fires while every block of its pool is still starting (the manager's log and
Alertmanager still have it), shows it if it still fires ``QUEUE_GRACE`` seconds after a
block runs, and its no-worker hint names the blocks starting.

On real processes, a ``local`` pool's ``provision_delay`` stands in for the batch queue
(its block pending that long before its worker starts); the rule's thresholds are
seconds instead of minutes. The pure decision (:func:`runtime.client._queue_news`) is
fed looks and checked for what it shows.
"""

from __future__ import annotations

import logging
import operator
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.client import QUEUE_GRACE, _blocks_starting, _queue_news
from runtime.messages import AlertInfo, AutoscalerStatus
from tests.helpers import Cli, log_lines

LIMIT = 90

CONFIG = """
[pools.cpu]
provider = "local"
min_blocks = 0
init_blocks = 1
max_blocks = 1
provision_delay = 10

[alerting]
interval = 0.2

[[alerts]]
name = "CorralQueueTime"
expr = "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 1"
for = "1s"
labels = {team = "corral", priority = "P2"}
"""


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_client_does_not_show_the_queue_alert_while_its_blocks_start(
    tmp_path: Path,
) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    with (
        Cli(tmp_path / "home") as cli,
        anyio.fail_after(LIMIT),
        log_lines("corral.client", logging.WARNING) as log,
    ):
        proc, address = cli.manager("--config", str(config), "--no-monitoring")
        token = cli.tokens(address)["submit"]
        async with Cluster(address, token=token, manager_alerts=0.2) as cluster:
            assert await cluster.submit(operator.add, 1, 2) == 3  # once the block ran
            # the manager's own log has the alert: it fired while the block started
            cli.line_with(proc, "alert='CorralQueueTime'")
        (warning,) = log.lines  # the no-worker warning, naming the block starting
        assert "no worker to run the ready tasks" in warning
        assert "1 block(s) of pool 'cpu' are starting" in warning
        assert "start workers" not in warning


def _alert(state: str, pool: str = "cpu", since: float = 1.0) -> AlertInfo:
    return AlertInfo("CorralQueueTime", state, {"pool": pool}, active_since=since)  # type: ignore[arg-type]


def test_a_queue_alert_is_held_while_blocks_start_and_shown_if_it_outlasts_the_grace() -> None:
    firing, other = _alert("firing"), AlertInfo("CorralMemoryStalled", "firing", {"pool": "cpu"})
    # fires while pool cpu's blocks start: held; another alert is shown as it comes
    shown, held = _queue_news([firing, other], [firing, other], {}, {"cpu": 2}, now=10.0)
    assert shown == [other] and list(held.values()) == [(firing, None)]
    # a block runs: the grace starts; past it, still firing: shown, once
    shown, held = _queue_news([], [firing], held, {}, now=20.0)
    assert shown == [] and list(held.values()) == [(firing, 20.0)]
    shown, held = _queue_news([], [firing], held, {}, now=20.0 + QUEUE_GRACE)
    assert shown == [firing] and held == {}
    # its end, once shown, is news
    resolved = _alert("resolved")
    assert _queue_news([resolved], [resolved], held, {}, now=99.0) == ([resolved], {})
    # resolved while held: neither its firing nor its end is shown
    _, held = _queue_news([firing], [firing], {}, {"cpu": 1}, now=10.0)
    assert _queue_news([resolved], [resolved], held, {}, now=11.0) == ([], {})
    # a pool whose blocks run (none starting): shown at once
    assert _queue_news([firing], [firing], {}, {"gpu": 1}, now=10.0) == ([firing], {})


def test_the_pools_whose_blocks_all_start() -> None:
    auto = AutoscalerStatus(
        blocks={"b1": "pending", "b2": "held", "b3": "running", "b4": "pending"},
        block_pools={"b1": "cpu", "b2": "cpu", "b3": "gpu", "b4": "gpu"},
    )
    assert _blocks_starting(auto) == {"cpu": 2}  # gpu has one running; so any pool has
    auto.blocks["b3"] = "pending"
    assert _blocks_starting(auto) == {"cpu": 2, "gpu": 2, "*": 4}
    assert _blocks_starting(None) == {}
