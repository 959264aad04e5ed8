"""A ``slurm`` pool from a configuration file, for real: ``python -m runtime manager
--config FILE`` submits the pool's block as a batch job on the one-node test cluster
(``.ci/slurm up``), its two workers join the manager under the ids the block records,
a graph runs on them, and stopping the manager cancels the job.

Without a Slurm cluster that answers this test skips (with ``CI=true`` it fails: CI
starts the cluster). Like tests/test_slurm.py it holds the cluster's test lock while it
runs. Every wait is bounded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from tests.helpers import Cli, slurm_test_lock, wait_until
from tests.test_slurm import slurm_conf  # noqa: F401  (the fixture: skip, or fail under CI)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 120  # the job may wait for the node a little; two workers start on it
CONF = (
    os.environ.get("CORRAL_SLURM_CONF")
    or os.environ.get("SLURM_CONF")
    or ("/tmp/corral-slurm/slurm.conf")
)

CONFIG = """
[pools.cfg]
provider = "slurm"
partition = "ckpt"
init_blocks = 1
max_blocks = 1
workers_per_node = 2
cores_per_worker = 1
walltime = "00:10:00"
worker_init = "echo corral-pool-test-init >&2"
"""


def squeue(*argv: str) -> str:
    env = dict(os.environ, SLURM_CONF=CONF)
    done = subprocess.run(
        ["squeue", "-h", *argv], env=env, capture_output=True, text=True, timeout=30
    )
    return done.stdout


@pytest.fixture
def cluster_lock(slurm_conf: str) -> Iterator[None]:  # noqa: F811 (the fixture)
    """Skip without a Slurm cluster that answers (fail under CI); hold its test lock."""
    with slurm_test_lock(slurm_conf):
        yield


async def test_a_slurm_pool_from_the_config_file_runs_a_graph(
    cluster_lock: None, tmp_path: Path
) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    work = tmp_path / "work"  # the manager's working directory: run files go here
    work.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        cli.env["SLURM_CONF"] = CONF
        manager = cli.spawn(
            ["/bin/sh", "-c", 'cd "$0" && exec "$1" -m runtime manager --listen 127.0.0.1:0 '
             '--config "$2"', str(work), sys.executable, str(config)]
        )  # fmt: skip
        line = cli.line_with(manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(2, timeout=LIMIT)
            status = await cluster.status()
            assert sorted(w.worker_id for w in status["workers"]) == ["cfg-1.0", "cfg-1.1"]
            assert {w.pool for w in status["workers"]} == {"cfg"}
            assert list(status["autoscaler"]["blocks"]) == ["cfg/block-1"]
            futures = cluster.map(lambda i: i * i, range(20))
            assert await cluster.gather(futures) == [i * i for i in range(20)]
            # The script is kept, with the pool's Slurm options.
            (script,) = work.glob("corral-slurm/run-*/cfg/block-1.sh")
            text = script.read_text()
            for line in ("#SBATCH --partition=ckpt", "#SBATCH --time=00:10:00",
                         "echo corral-pool-test-init >&2", "--pool cfg"):  # fmt: skip
                assert line in text, (line, text)
            job = squeue("-n", "corral-cfg-1", "-o", "%i").strip()
            assert job, "the block's job is not in squeue"
        cli.stop([manager])
        assert manager.returncode == 0
        # Stopping the manager cancelled the job.
        await wait_until(
            lambda: job not in squeue("-t", "PD,R,CG", "-o", "%i"), "job ended", limit=30
        )
