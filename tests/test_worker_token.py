"""A worker's token is none of its tasks' business (security audit: a submit-token
holder read the admin token in a thread-mode task, ``os.environ["CORRAL_TOKEN"]`` or
``subprocess.run(["env"])``, and could take over the manager).

A worker takes ``CORRAL_TOKEN`` out of its own environment once, at its start, and keeps
it in memory for its rejoins (:func:`runtime.node.take_env_token`): a task run in the
worker's process (thread execution, the default) does not see it, nor does a program
the task starts. Real processes on 127.0.0.1, ports 41500-41999 only."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from tests.helpers import Cli, free_port_between

LIMIT = 60
PORTS = (41500, 41999)  #: the ports these tests may use
PORT_RANGE = f"{PORTS[0]}-{PORTS[1]}"
run = anyio.to_thread.run_sync


def seen_token() -> tuple[str | None, list[str]]:
    """What a task sees of ``CORRAL_TOKEN``: its own ``os.environ``, and the lines of
    ``env`` run as a program it starts."""
    shell = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    return os.environ.get("CORRAL_TOKEN"), [
        line for line in shell.splitlines() if line.startswith("CORRAL_TOKEN")
    ]


def manager(cli: Cli, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """A manager on a free port of :data:`PORTS`; it and its address."""
    port = free_port_between(*PORTS)
    proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", *flags)
    line = cli.line_with(proc, "manager listening on")
    return proc, line.split("manager listening on", 1)[1].strip()


@pytest.mark.anyio
async def test_a_thread_task_and_its_programs_do_not_see_the_worker_s_token(
    tmp_path: Path,
) -> None:
    """A worker given the admin token as ``CORRAL_TOKEN`` (as the manager's own pools
    give it), on a machine with no token file to find (``CORRAL_HOME`` elsewhere): it
    joins with that token, and its thread-mode task finds no ``CORRAL_TOKEN`` in
    ``os.environ`` nor in what ``env`` prints. Before, both showed the admin token."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await run(manager, cli)
        admin = cli.tokens(address)["admin"]
        cli.env = dict(cli.env, CORRAL_HOME=str(elsewhere), CORRAL_TOKEN=admin)
        worker = await run(
            cli.worker, address, "--name", "w", "--port-range", PORT_RANGE, "--execution", "thread"
        )
        async with Cluster(address, token=admin, manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1)
            env, shell = await cluster.submit(seen_token)
        assert env is None, "the task read the worker's token in os.environ"
        assert shell == [], "a program the task started inherited the worker's token"
        assert worker.poll() is None
