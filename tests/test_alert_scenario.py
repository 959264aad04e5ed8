"""The users' story end to end, on real processes: CI jobs queue on an autoscaled pool
whose blocks take a while to come (a provisioning delay), and nobody knows.

A manager process runs a ``local`` pool (one worker per block, its blocks pending
``provision_delay`` seconds before their process starts, ``parallelism = 0`` so its own
scaling policy keeps one block however long the queue) and a queue-time rule with a
scale-out action, sending to a real Alertmanager. A burst of jobs arrives. The rule goes
pending, then fires with the queue alert's fields; Alertmanager receives it; its action
scales the pool out (an audit line says who, what and why); the new blocks drain the
queue; the alert resolves, and Alertmanager hears of that too; the action restores the
pool's target (no raised floor, and its cost, left behind).

Every step is awaited as an event (bounded polls of the manager's ``AlertsRequest``, its
status and Alertmanager's API), never a sleep followed by an assertion. The thresholds
are seconds instead of the default rule's minutes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.console import ConsoleClient
from tests.helpers import Cli, http_get, start_alertmanager, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 120  # seconds for the whole story
JOBS = 12  # the burst
JOB_SECONDS = 1.0  # each job's run time
DELAY = 1.5  # the pool's provisioning delay (seconds a block stays pending)

CONFIG = """
[pools.ci]
provider = "local"
min_blocks = 0
init_blocks = 1
max_blocks = 3
parallelism = 0          # its own policy: one block while there is work, however much
max_idletime = 300
provision_delay = {delay}

[alerting]
interval = 0.2
alertmanager = "{alertmanager}"
default_rules = false

[[alerts]]
name = "CorralQueueTime"
expr = "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 1"
for = "1s"
labels = {{team = "ci", priority = "P2"}}
annotations = {{summary = "CI jobs of pool {{{{ $labels.pool }}}} wait for a runner"}}
action = {{scale_out = {{fit = true, cooldown = "1m", restore = true}}}}
"""


def job(i: int, seconds: float) -> int:
    """A CI job: runs ``seconds`` in a worker process."""
    time.sleep(seconds)
    return i


def _am_alerts(url: str) -> list[dict[str, Any]]:
    status, body = http_get(url + "/api/v2/alerts")
    assert status == 200, body
    return [a for a in json.loads(body) if a["labels"].get("alertname") == "CorralQueueTime"]


async def test_a_burst_on_a_slow_pool_alerts_scales_out_drains_and_resolves(
    tmp_path: Path,
) -> None:
    with Cli(tmp_path / "home") as cli:
        am = start_alertmanager(cli, tmp_path / "am")
        config = tmp_path / "corral.toml"
        config.write_text(CONFIG.format(delay=DELAY, alertmanager=am))
        proc, address = cli.manager("--config", str(config))
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as cluster, ConsoleClient(address) as console:
                seen: set[str] = set()

                async def alert(state: str) -> Any:
                    reply = await console.alerts()
                    mine = [a for a in reply.alerts if a.name == "CorralQueueTime"]
                    seen.update(a.state for a in mine)
                    return next((a for a in mine if a.state == state), None)

                # The pool's first block: pending DELAY seconds, then its worker joins.
                await cluster.wait_for_workers(1, timeout=60)
                assert (await cluster.status())["autoscaler"]["targets"] == {"ci": 0}

                graph: dict[Hashable, Any] = {
                    f"job-{i}": (job, i, JOB_SECONDS) for i in range(JOBS)
                }
                futures = await cluster.submit_graph(graph, list(graph), pool="ci")

                firing = await wait_until(lambda: alert("firing"), "the alert to fire", step=0.1)
                assert firing.labels == {
                    "alertname": "CorralQueueTime", "pool": "ci", "team": "ci", "priority": "P2"
                }  # fmt: skip
                # It was pending first: it fired once the condition had held for 1 s.
                assert firing.active_since is not None and firing.fired_at is not None
                assert firing.fired_at - firing.active_since >= 1.0
                fields = firing.fields
                assert fields["threshold_breached"] == 1
                assert fields["queue_size_threshold"] == 0
                assert fields["queue_time_threshold"] == 0.017  # 1 s, in minutes
                assert fields["max_queue_size"] >= 1
                assert "max_queue_time_mins" in fields  # minutes (two digits under one)
                http = address.replace("ws://", "http://", 1).rstrip("/") + "/"
                assert firing.annotations["dashboard"] == http
                assert firing.annotations["summary"] == "CI jobs of pool ci wait for a runner"

                # Alertmanager has it, with the fields as annotations.
                (received,) = await wait_until(
                    lambda: anyio.to_thread.run_sync(_am_alerts, am),
                    "the firing alert in Alertmanager",
                    step=0.1,
                )
                assert received["labels"]["pool"] == "ci"
                assert received["labels"]["priority"] == "P2"
                notes = received["annotations"]
                assert notes["threshold_breached"] == "1"
                assert {"max_queue_size", "max_queue_time_mins", "queue_size_threshold",
                        "queue_time_threshold"} <= set(notes)  # fmt: skip
                assert received["generatorURL"] == http

                # Its action scales the pool out to fit the queue, within max_blocks:
                # an audit line in the answer and in the manager's log.
                audit = await wait_until(
                    lambda: _audited(console), "the scale-out audit line", step=0.1
                )
                assert "scale pool ci out from 0 to 3 blocks" in audit, audit  # its target was 0
                assert "with 1 running" in audit and "capped by the pool's max_blocks 3" in audit
                assert "CorralQueueTime" in audit
                cli.line_with(proc, "event='alert firing'", limit=10)  # the log notifier
                cli.line_with(proc, "event='alert action'", limit=10)
                st = await cluster.status()
                assert st["autoscaler"]["targets"] == {"ci": 3}
                # The new blocks are pending for the provisioning delay, then run.
                await wait_until(lambda: _workers(cluster, 3), "three workers in pool ci", step=0.1)

                # The queue drains: every job done.
                assert sorted([await f for f in futures]) == list(range(JOBS))

                resolved = await wait_until(
                    lambda: alert("resolved"), "the alert to resolve", step=0.1
                )
                assert resolved.fields["threshold_breached"] == 0
                assert resolved.resolved_at is not None
                assert resolved.resolved_at >= firing.fired_at
                # ...and Alertmanager holds it as resolved: no longer active.
                await wait_until(
                    lambda: anyio.to_thread.run_sync(lambda: not _am_alerts(am)),
                    "Alertmanager to hear the alert resolved",
                    step=0.1,
                )
                assert {"firing", "resolved"} <= seen
                # restore: the pool's target goes back to what it was (its extra blocks
                # then drain once idle, as its scaling policy says), audited too.
                await wait_until(lambda: _target(cluster, 0), "the target restored to 0", step=0.1)
                audit = "\n".join((await console.alerts()).audit)
                assert "back to the target before the scale-out (3 -> 0)" in audit, audit


async def _audited(console: ConsoleClient) -> str:
    return "\n".join(line for line in (await console.alerts()).audit if "scale pool" in line)


async def _target(cluster: Cluster, n: int) -> bool:
    st = await cluster.status()
    return bool(st["autoscaler"]["targets"] == {"ci": n})


async def _workers(cluster: Cluster, n: int) -> bool:
    st = await cluster.status()
    return sum(1 for w in st["workers"] if w.pool == "ci") >= n
