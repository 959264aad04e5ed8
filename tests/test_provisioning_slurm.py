"""Blocks that start pending, for real: a manager (``python -m runtime manager --config
FILE``) with a ``slurm`` pool on the one-node test cluster (``.ci/slurm up``).

- A block's job waits in the queue (PENDING), then runs: the autoscaler learns that it
  runs (``BlockRunning``), so once its workers have been idle ``max_idletime`` the
  ``demand`` strategy drains them and the job ends by itself (not cancelled).
- A block's job cannot start for an hour (``--begin``): past the pool's
  ``provisioning_timeout`` it is cancelled in Slurm and another is submitted in its
  place; the manager logs why, and the status lists the end as ``stuck``.
- A burst asks for more blocks while another job holds the rest of the node: they
  queue (PENDING); the running block finishes the burst; once nothing has wanted them
  for ``max_idletime`` they are cancelled in Slurm before they ever run (the other
  job still holds the node), and the running block stays (``min_blocks``).

Without a Slurm cluster that answers these tests skip (with ``CI=true`` they fail: CI
starts the cluster). They hold the cluster's test lock while they run. Every wait is
bounded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from tests.helpers import Cli, slurm_test_lock, wait_until
from tests.test_slurm import (
    NODE_CPUS,
    slurm_conf,  # noqa: F401  (the fixture: skip, or fail under CI)
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 120  # the job may wait for the node a little; a worker starts on it
CONF = (
    os.environ.get("CORRAL_SLURM_CONF")
    or os.environ.get("SLURM_CONF")
    or ("/tmp/corral-slurm/slurm.conf")
)


def slurm(*argv: str, check: bool = True) -> str:
    env = dict(os.environ, SLURM_CONF=CONF)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=check)
    return done.stdout


def squeue(*argv: str) -> str:
    return slurm("squeue", "-h", *argv, check=False)


@pytest.fixture
def cluster_lock(slurm_conf: str) -> Iterator[None]:  # noqa: F811 (the fixture)
    """Skip without a Slurm cluster that answers (fail under CI); hold its test lock."""
    with slurm_test_lock(slurm_conf):
        yield


def _manager(cli: Cli, tmp_path: Path, config: str) -> tuple[subprocess.Popen[str], str]:
    path = tmp_path / "corral.toml"
    path.write_text(config)
    work = tmp_path / "work"  # the manager's working directory: run files go here
    work.mkdir()
    cli.env["SLURM_CONF"] = CONF
    manager = cli.spawn(
        ["/bin/sh", "-c", 'cd "$0" && exec "$1" -m runtime manager --listen 127.0.0.1:0 '
         '--config "$2"', str(work), sys.executable, str(path)]
    )  # fmt: skip
    line = cli.line_with(manager, "manager listening on")
    return manager, line.split("manager listening on", 1)[1].strip()


async def _auto(cluster: Cluster) -> dict[str, Any]:
    auto: dict[str, Any] = (await cluster.status())["autoscaler"]
    return auto


async def test_a_block_that_started_pending_is_drained_once_idle(
    cluster_lock: None, tmp_path: Path
) -> None:
    config = """
[pools.q]
provider = "slurm"
partition = "ckpt"
min_blocks = 0
init_blocks = 1
max_blocks = 1
max_idletime = 3
provisioning_timeout = 100
walltime = "00:10:00"
"""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = _manager(cli, tmp_path, config)
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(1, timeout=LIMIT)
            job = squeue("-n", "corral-q-1", "-o", "%i").strip()
            assert job, "the block's job is not in squeue"
            assert await cluster.gather(cluster.map(lambda i: i + 1, range(5))) == [1, 2, 3, 4, 5]
            # Idle 3 s: drained (the core knows the block runs), its worker exits, the
            # job completes by itself and is not replaced (nothing is active).
            await wait_until(
                lambda: job not in squeue("-t", "PD,R,CG", "-o", "%i"), "the job to end", limit=60
            )

            async def ended() -> bool:
                return bool((await _auto(cluster))["ends"])

            await wait_until(ended, "the autoscaler to see the end", limit=30)
            auto = await _auto(cluster)
            # COMPLETED: it ended by itself, not cancelled.
            ends = [(e["block"], e["state"], e["cause"]) for e in auto["ends"]]
            assert ends == [("q/block-1", "completed", "drained")], auto["ends"]
            assert auto["blocks"] == {} and auto["budget_spent"] == 0
        cli.stop([manager])


async def test_a_block_pending_past_its_provisioning_timeout_is_replaced(
    cluster_lock: None, tmp_path: Path
) -> None:
    config = """
[pools.late]
provider = "slurm"
partition = "ckpt"
min_blocks = 1
init_blocks = 1
max_blocks = 1
provisioning_timeout = 3
walltime = "00:10:00"
scheduler_options = "#SBATCH --begin=now+3600"
"""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = _manager(cli, tmp_path, config)
        line = cli.line_with(manager, "provisioning timeout", limit=60)
        assert "late/block-1" in line, line
        async with Cluster(address) as cluster:

            async def replaced() -> bool:
                auto = await _auto(cluster)
                ends = {e["block"] for e in auto["ends"]}
                return "late/block-1" in ends and any(b != "late/block-1" for b in auto["blocks"])

            await wait_until(replaced, "block-1 replaced", limit=60)
            auto = await _auto(cluster)
            end = next(e for e in auto["ends"] if e["block"] == "late/block-1")
            assert (end["cause"], end["charged"]) == ("stuck", False), end
            assert auto["budget_spent"] == 0 and auto["gave_up"] == []
            # block-1's job is gone from the queue; its replacement waits there.
            assert squeue("-n", "corral-late-1", "-t", "PD,R", "-o", "%i").strip() == ""
            assert squeue("-n", "corral-late-2", "-t", "PD", "-o", "%i").strip()
        cli.stop([manager])
        await wait_until(
            lambda: squeue("-n", "corral-late-2", "-t", "PD,R", "-o", "%i").strip() == "",
            "the replacement cancelled with the manager",
            limit=30,
        )


async def test_blocks_queued_for_a_burst_that_is_gone_are_cancelled_before_they_run(
    cluster_lock: None, tmp_path: Path
) -> None:
    config = """
[pools.pend]
provider = "slurm"
partition = "ckpt"
min_blocks = 1
init_blocks = 1
max_blocks = 3
workers_per_node = 1
cores_per_worker = 1
max_idletime = 5
walltime = "00:10:00"
"""
    filler = f"corral-test-filler-{os.getpid()}"
    try:
        with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
            manager, address = _manager(cli, tmp_path, config)
            async with Cluster(address) as cluster:
                await cluster.wait_for_workers(1, timeout=LIMIT)
                # Another job takes every other CPU of the node: new blocks must queue.
                slurm("sbatch", "-p", "ckpt", f"-n{NODE_CPUS - 1}", f"--job-name={filler}",
                      "-o", "/dev/null", "--wrap", "sleep 300")  # fmt: skip
                await wait_until(
                    lambda: squeue("-n", filler, "-t", "R", "-o", "%i").strip() != "",
                    "the other job to run",
                    limit=30,
                )

                def queued() -> str:
                    return squeue("-n", "corral-pend-2,corral-pend-3", "-t", "PD", "-o", "%j")

                futures = cluster.map(_slow, range(6))
                # 6 active tasks: 2 more blocks asked for; they wait for the node.
                await wait_until(
                    lambda: sorted(queued().split()) == ["corral-pend-2", "corral-pend-3"],
                    "blocks 2 and 3 queued",
                    limit=30,
                )
                assert await cluster.gather(futures) == list(range(6))  # on block-1
                # Nothing wants them for max_idletime (5 s): cancelled in Slurm.
                await wait_until(
                    lambda: squeue("-n", "corral-pend-2,corral-pend-3", "-o", "%i").strip() == "",
                    "the queued blocks cancelled",
                    limit=60,
                )
                # They never ran: the other job still holds the node.
                assert squeue("-n", filler, "-t", "R", "-o", "%i").strip()
                auto = await _auto(cluster)
                ends = sorted((e["block"], e["cause"], e["charged"]) for e in auto["ends"])
                assert ends == [
                    ("pend/block-2", "drained", False),
                    ("pend/block-3", "drained", False),
                ], auto["ends"]
                assert list(auto["blocks"]) == ["pend/block-1"] and auto["budget_spent"] == 0
                status = await cluster.status()
                assert [w.worker_id for w in status["workers"]] == ["pend-1"]
            cli.stop([manager])
    finally:
        slurm("scancel", f"--name={filler}", check=False)


def _slow(i: int) -> int:
    import time

    time.sleep(1)
    return i
