"""A worker that rejoins a manager that does not know it drops its previous work.

A multimachine audit (finding 2): after a manager restart (``kill -9``, then started
again with the same flags), a worker with ``--connect-retry`` rejoined and was
registered as a new, idle worker, but its task process of the lost run ran on to its
end: the new manager's status showed the worker with nothing running, and the next
task waited behind the orphan. Now a worker given a new secret at its rejoin (the
manager has no record of it: it restarted, or gave the worker up) cancels every task
in hand, killing task processes, and drops its outputs before it takes new work.
Real processes and sockets on 127.0.0.1, ports from 65000-65535."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from runtime import Cluster
from tests.helpers import Cli, free_port_between, wait_until

LO, HI = 65000, 65535  # the range given to these tests (ports end at 65535)

#: A client of the first manager: one task that says its process id, then sleeps long.
ORPHAN = """
import sys, anyio
from runtime import Cluster

def slow(marker):
    import os, time
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    time.sleep(120)

async def main():
    async with Cluster(sys.argv[1], manager_alerts=None) as c:
        await c.gather([c.submit(slow, sys.argv[2])])

anyio.run(main)
"""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_worker_rejoining_a_restarted_manager_drops_the_lost_runs_tasks(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "orphan.pid"
    port = free_port_between(LO, HI)
    address = f"ws://127.0.0.1:{port}"
    flags = ("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--keep-tokens")
    with Cli(tmp_path) as cli:
        first = cli.start(*flags)
        cli.line_with(first, "manager listening on")
        worker = cli.start(
            "worker", address, "--execution", "process", "--cores", "1", "--name", "w",
            "--connect-retry", "60", "--port", str(free_port_between(LO, HI)),
        )  # fmt: skip
        cli.line_with(worker, "joined")
        cli.spawn([sys.executable, "-c", ORPHAN, address, str(marker)])

        async def started() -> int:
            await wait_until(marker.exists, "the task began", limit=60)
            return int(marker.read_text())

        pid = anyio.run(started)
        assert _alive(pid)
        first.kill()  # a crash: no goodbye
        first.wait(10)
        second = cli.start(*flags)
        cli.line_with(second, "manager listening on")
        line = cli.line_with(worker, "joined a manager that does not know this worker")
        assert "tasks=1" in line and "running=1" in line, line

        async def after() -> list[int]:
            await wait_until(lambda: not _alive(pid), "its task process ended", limit=30)
            with anyio.fail_after(30):  # the orphan would hold the one core for 120 s
                async with Cluster(address, manager_alerts=None) as c:
                    return await c.gather(c.map(abs, [-1, -2]))  # type: ignore[no-any-return]

        assert anyio.run(after) == [1, 2]
        assert worker.poll() is None and second.poll() is None
        assert os.path.exists(marker)
