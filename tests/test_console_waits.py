"""``story KEY`` of a ready task says why it waits now, against a real manager process
with a ``local`` pool (``max_blocks = 1``, its block pending ``provision_delay``
seconds): first its block is not running yet and no worker is connected; then its one
worker runs a task and the pool is at its ``max_blocks``. Before, the story of such a
task was one row, ``new -> queued``, and the operator had to piece the why together
from ``status`` (whose pools table said ``target blocks 0``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.console import ConsoleClient, _blocks_text, _pool_blocks, why_waiting
from tests.helpers import Cli, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 90

CONFIG = """
[pools.ci]
provider = "local"
min_blocks = 0
init_blocks = 0
max_blocks = 1
cores_per_worker = 1
provision_delay = 4
"""


def hold(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


async def _waits(console: ConsoleClient, key: str, *parts: str) -> str | None:
    text = await console.run_command(f"story {key}")
    flat = " ".join(text.split())
    return flat if all(p in flat for p in parts) else None


async def test_the_story_of_a_ready_task_says_why_it_waits(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager("--config", str(config))
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as cluster, ConsoleClient(address) as console:
                futures = [
                    cluster.submit(hold, i, 30.0, key=f"hold-{i}", pool="ci") for i in range(3)
                ]
                await wait_until(lambda: _queued(console, 3), "three ready tasks", step=0.1)
                # The pool's block is pending: no worker yet.
                said = await wait_until(
                    lambda: _waits(console, "hold-2", "No worker of pool ci is connected",
                                   "0 running and 1 not running yet (ci/block-1)"),
                    "the story to say the block is not running yet", step=0.1,
                )  # fmt: skip
                assert "why it waits now: it is ready" in said
                assert "ready task(s) of pool ci" in said
                # Its worker joins and runs one task: the pool is at its max_blocks.
                said = await wait_until(
                    lambda: _waits(console, "hold-2", "1 of them running tasks: it waits",
                                   "Pool ci is at its max_blocks (1 blocks"),
                    "the story to say the pool is at max_blocks", step=0.1,
                )  # fmt: skip
                assert "raise max_blocks in [pools.ci]" in said
                # The status's pools table says the same: one block of its max_blocks 1.
                status = await console.run_command("status")
                row = next(line for line in status.splitlines() if line.startswith("│ ci "))
                assert row.split("│")[7].strip() == "1 of 1", row
                data = json.loads(await console.run_command("story hold-2 --json"))
                assert any("at its max_blocks" in s for s in data["waits"])
                # A task that runs has no such section.
                running = await wait_until(lambda: _running(console), "a running task", step=0.1)
                text = await console.run_command(f"story {running}")
                assert "why it waits now" not in text
                for f in futures:
                    f.cancel()


async def _queued(console: ConsoleClient, n: int) -> bool:
    return len(await console.tasks("queued")) >= n


async def _running(console: ConsoleClient) -> str | None:
    rows = await console.tasks("processing")
    return rows[0].key if rows else None


def test_a_task_whose_pool_is_not_known_is_sent_to_the_status() -> None:
    (line,) = why_waiting({}, None)
    assert "its pool is not known" in line and "`status`" in line


def test_a_pool_without_workers_or_configuration_says_to_join_it() -> None:
    st = {"queues": {"gpux": 2}, "queue_oldest_wait": {"gpux": 12.5}, "workers": []}
    assert why_waiting(st, "gpux") == [
        "it is ready (its inputs are computed) and sent to no worker yet, one of 2 ready "
        "task(s) of pool gpux (the oldest waited 12.50 s).",
        "No worker of pool gpux is connected.",
        "No pool gpux is configured: it runs once a worker joins with --pool gpux.",
    ]


def _status_with_blocks(states: dict[str, str]) -> dict[str, object]:
    return {
        "queues": {"ci": 1},
        "queue_oldest_wait": {"ci": 70.0},
        "workers": [],
        "config": {"pools.ci": {"max_blocks": {"value": "3", "source": "file"}}},
        "autoscaler": {
            "blocks": states,
            "block_pools": dict.fromkeys(states, "ci"),
            "desired": {"ci": 3},
        },
    }


def test_held_blocks_are_not_starting_and_ended_ones_are_not_counted() -> None:
    """A block the batch system holds (suspended by a preemption, or on hold) is not
    'starting', and a block whose end is being decided (listed with its end state)
    is neither running nor starting: before, every block not running was '+N
    starting', so a suspended pool read as one on its way."""
    st = _status_with_blocks(
        {"b-1": "running", "b-2": "pending", "b-3": "held", "b-4": "completed"}
    )
    assert _pool_blocks(st, "ci") == (["b-1"], ["b-2"], ["b-3"], 3)
    assert _blocks_text(_pool_blocks(st, "ci")) == "1 +1 starting +1 held of 3"
    held = _status_with_blocks({"b-3": "held", "b-4": "preempted"})
    assert _blocks_text(_pool_blocks(held, "ci")) == "0 +1 held of 3"
    assert why_waiting(held, "ci")[-1] == (
        "Blocks of pool ci: 0 running and 0 not running yet and 1 held by the batch "
        "system (b-3): it may run once the batch system lets them run again (`blocks` "
        "shows why each is held)."
    )
