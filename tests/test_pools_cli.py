"""``python -m runtime manager --config FILE``: the manager starts the workers of a
``local`` pool itself, as real processes, keeps them within the pool's limits and runs
a graph on them; a bad file is refused before anything listens.

The pool starts 2 blocks (``init_blocks``), each one worker process that joins under the
id its block records (``local-1``, ``local-2``); tasks mark the worker they run on. Once
the graph is done both are idle; after ``max_idletime`` one is drained (``min_blocks``
is 1) and ends by itself, and no try was lost. Waits are bounded polls of the manager's
status or of files, within ``LIMIT``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import psutil
import pytest

from runtime import Cluster
from tests.helpers import ROOT, Cli, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 90  # two worker processes start, run, one is drained, all stop
GATE = 30.0

CONFIG = """
[pools.local]
provider = "local"
min_blocks = 1
init_blocks = 2
max_blocks = 2
cores_per_worker = 1
max_idletime = 2
"""


def both_marked(i: int, marks: str) -> int:
    """Mark this task's worker (and its pid), then wait (bounded) until tasks ran on
    two workers: both blocks really run tasks."""
    Path(marks, os.environ["CORRAL_WORKER_ID"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + GATE
    while len(os.listdir(marks)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return i * i


def add(x: int, y: int) -> int:
    return x + y


async def test_a_manager_with_a_local_pool_runs_a_graph_and_drains_the_idle_block(
    tmp_path: Path,
) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    marks = tmp_path / "marks"
    marks.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = cli.manager("--config", str(config))
        async with Cluster(address) as cluster:
            futures = cluster.map(both_marked, range(6), marks=str(marks))
            assert await cluster.gather(futures) == [i * i for i in range(6)]
            assert sorted(p.name for p in marks.iterdir()) == ["local-1", "local-2"]
            dsk = {"a": 1, "b": (add, "a", 10), "c": (add, "b", "a")}
            assert await cluster.compute(dsk, "c") == 12
            status = await cluster.status()
            auto = status["autoscaler"]
            assert (auto["policy"], auto["targets"]) == ("demand", {"local": 1})
            assert {w.pool for w in status["workers"]} == {"local"}

            async def drained_to_one() -> bool:
                auto = (await cluster.status())["autoscaler"]
                return len(auto["blocks"]) == 1 and auto["ended"] == 1 and not auto["retiring"]

            await wait_until(drained_to_one, "one idle block drained", limit=30, step=0.2)
            status = await cluster.status()
            assert [w.worker_id for w in status["workers"]] in (["local-1"], ["local-2"])
            # Drained, not lost: no try of any task was lost with its worker.
            assert all(c["lost"] == 0 for c in status["categories"].values())
            assert status["autoscaler"]["gave_up"] == []
        pids = [int(p.read_text()) for p in marks.iterdir()]
        cli.stop([manager])
        assert manager.returncode == 0
        # A clean stop: its workers leave before it stops listening, so neither side
        # logs a lost connection (warnings that would page whoever watches the log).
        said = "".join(cli.rest(manager))
        assert "worker connection dropped" not in said, said
        assert "lost the manager" not in said, said
        # The manager's worker processes do not outlive it.
        await wait_until(
            lambda: not any(psutil.pid_exists(p) for p in pids), "workers gone", limit=20
        )


def test_a_bad_config_is_refused_before_the_manager_listens(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text('[pools.ckpt]\nprovider = "slurm"\nmax_block = 3\n')
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "manager", "--listen", "127.0.0.1:0",
         "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=dict(os.environ, CORRAL_HOME=str(tmp_path / "home")),
    )  # fmt: skip
    assert done.returncode == 1
    assert "manager listening" not in done.stdout
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("error: ") and "pool 'ckpt' in " in err and "key 'max_block'" in err
    assert "did you mean 'max_blocks'?" in err


async def test_a_cluster_with_pools_runs_them_as_worker_processes(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    pools = {"cpu": {"init_blocks": 2, "max_blocks": 2, "cores_per_worker": 2}}
    with anyio.fail_after(LIMIT):
        async with Cluster(pools=pools, processes=True) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            state = cluster.scheduler_state
            assert {w: (ws.pool, ws.cores) for w, ws in state.workers.items()} == {
                "cpu-1": ("cpu", 2), "cpu-2": ("cpu", 2),
            }  # fmt: skip
            futures = cluster.map(both_marked, range(4), marks=str(marks))
            assert await cluster.gather(futures) == [0, 1, 4, 9]
            pids = {int(p.read_text()) for p in marks.iterdir()}
            assert len(pids) == 2 and os.getpid() not in pids  # two processes, not this one
            assert (await cluster.status())["autoscaler"]["policy"] == "demand"
        await wait_until(
            lambda: not any(psutil.pid_exists(p) for p in pids), "workers gone", limit=20
        )
