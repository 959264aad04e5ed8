"""A worker of a manager's own pool that goes silent while its process lives on (here
SIGSTOP, as a hung process or a node cut off would) is lost to the scheduler, and then
its block, which the provider still says runs, is stopped (its stopped process killed)
and replaced: the pool runs tasks again at its ``max_blocks``. Before, the block kept
its place in ``max_blocks`` for ever, with the stopped process, and the pool's tasks
waited with no worker (an ops audit). A block of two workers one of which is stopped
is lost in part: its other worker drains (finishes what it runs), then the block is
stopped and replaced; before, it ran on one worker until its walltime. Real
processes: a manager with a ``local`` pool of ``max_blocks = 1``; the waits are its
log lines, bounded."""

from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from tests.helpers import Cli, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 180  # the worker's loss (about 20 s here), then the 60 s lost_grace

CONFIG = """
[pools.ci]
provider = "local"
min_blocks = 1
init_blocks = 1
max_blocks = 1
cores_per_worker = 1
provision_delay = 2      # its blocks start after the manager says it listens
"""


def inc(x: int) -> int:
    return x + 1


def _pids(line: str) -> dict[str, int]:
    pids: dict[str, int] = ast.literal_eval(line.split("pids=", 1)[1].split("}", 1)[0] + "}")
    return pids


def _pid(line: str) -> int:
    (pid,) = _pids(line).values()
    return int(pid)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_a_block_whose_worker_is_stopped_is_stopped_and_replaced(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    with Cli(tmp_path / "home") as cli:
        proc, address = cli.manager(
            "--config", str(config), "--log-level", "info", "--worker-timeout", "6",
            "--reconnect-timeout", "6",
        )  # fmt: skip
        pid = _pid(cli.line_with(proc, "event='block started'", limit=60))
        try:
            with anyio.fail_after(LIMIT):
                async with Cluster(address) as cluster:
                    await cluster.wait_for_workers(1, timeout=60)
                    assert await cluster.submit(inc, 1, pool="ci") == 2
                    os.kill(pid, signal.SIGSTOP)
                    lost = await anyio.to_thread.run_sync(
                        lambda: cli.line_with(proc, "block lost", limit=LIMIT)
                    )
                    assert "block='ci/block-1'" in lost and "workers=['ci-1']" in lost, lost
                    started = await anyio.to_thread.run_sync(
                        lambda: cli.line_with(proc, "event='block started'", limit=60)
                    )
                    assert "block='ci/block-2'" in started, started
                    await wait_until(lambda: _gone(pid), "the stopped worker killed", step=0.1)
                    # The pool, at its max_blocks 1, runs tasks again.
                    assert await cluster.submit(inc, 2, pool="ci") == 3
                    st = await cluster.status()
                    ends = st["autoscaler"]["ends"]
                    (end,) = [e for e in ends if e["block"] == "ci/block-1"]
                    assert (end["cause"], end["charged"]) == ("lost", True), end
        finally:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


async def test_a_block_one_of_whose_two_workers_is_stopped_is_drained_then_replaced(
    tmp_path: Path,
) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG + "workers_per_node = 2\nlost_grace = 5\n")
    with Cli(tmp_path / "home") as cli:
        proc, address = cli.manager(
            "--config", str(config), "--log-level", "info", "--worker-timeout", "6",
            "--reconnect-timeout", "6",
        )  # fmt: skip
        pids = _pids(cli.line_with(proc, "event='block started'", limit=60))
        try:
            with anyio.fail_after(LIMIT):
                async with Cluster(address) as cluster:
                    await cluster.wait_for_workers(2, timeout=60)
                    assert sorted(pids) == ["ci-1.0", "ci-1.1"], pids
                    assert await cluster.submit(inc, 1, pool="ci") == 2
                    stopped, other = pids["ci-1.1"], pids["ci-1.0"]
                    os.kill(stopped, signal.SIGSTOP)
                    lost = await anyio.to_thread.run_sync(
                        lambda: cli.line_with(proc, "block lost in part", limit=LIMIT)
                    )
                    assert "block='ci/block-1'" in lost and "workers=['ci-1.1']" in lost, lost
                    started = await anyio.to_thread.run_sync(
                        lambda: cli.line_with(proc, "event='block started'", limit=60)
                    )
                    assert "block='ci/block-2'" in started, started
                    # Its other worker drained and left; then the block was stopped.
                    await wait_until(lambda: _gone(other), "the other worker gone", step=0.1)
                    await wait_until(lambda: _gone(stopped), "the stopped worker killed", step=0.1)
                    assert await cluster.submit(inc, 2, pool="ci") == 3
                    st = await cluster.status()
                    (end,) = [e for e in st["autoscaler"]["ends"] if e["block"] == "ci/block-1"]
                    assert (end["cause"], end["charged"]) == ("lost", True), end
        finally:
            for pid in pids.values():
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
