"""Every client wait is tied to the manager's liveness (issue 9): with a real manager
process and a worker process, a client whose manager is killed or stops answering gets
ManagerLost on every pending future within the documented bound, never a silent wait.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import ManagerLost
from runtime.node import DEAD_AFTER, HEARTBEAT
from tests.helpers import Cli, held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with Cli(tmp_path / "home") as cli:
        mgr, address = cli.manager()
        cli.worker(address, "--cores", "1")
        yield address, mgr


@pytest.mark.parametrize("how", ["kill -9", "SIGSTOP"])
async def test_pending_futures_fail_with_manager_lost_within_the_bound(
    manager: tuple[str, subprocess.Popen[str]], tmp_path: Path, how: str
) -> None:
    address, mgr = manager
    mark = tmp_path / "started"
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            running = c.submit(held_at_gate, str(tmp_path / "never"), str(mark))
            queued = c.submit(held_at_gate, str(tmp_path / "never-either"), str(mark))
            # One of the two runs, the other waits behind it. Another process's progress
            # shows only in the filesystem: a bounded poll.
            await wait_until(mark.exists, "a task to start", limit=30)
            mgr.send_signal(signal.SIGKILL if how == "kill -9" else signal.SIGSTOP)
            start = time.monotonic()
            for fut in (running, queued):
                with pytest.raises(ManagerLost) as err:
                    await fut
                assert err.value.address == address
            took = time.monotonic() - start
            # A closed connection is seen at once; a silent manager after DEAD_AFTER
            # seconds without a message (checked every HEARTBEAT / 2).
            bound = 5.0 if how == "kill -9" else DEAD_AFTER + HEARTBEAT + 5.0
            assert took < bound, f"{how}: ManagerLost after {took:.1f} s"
            print(f"\n{how}: ManagerLost on both futures after {took:.2f} s")
            with pytest.raises(ManagerLost):
                await c.status()
            with pytest.raises(ManagerLost):
                await c.submit(sum, [1, 2])
