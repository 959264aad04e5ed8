"""A flood of reads from one connection slows that connection down, not the scheduler
(issue 9): 200 story asks from a console once stalled a 21-task run for about 10 s.
Reads (status, stories, task listings, policies) pass the gateway at READS_PER_SECOND
per connection after a burst of READ_BURST; the rest wait their turn. In process (the
gateway's count of paced reads is visible there) and with real manager and worker
processes and a read-only console over websockets."""

from __future__ import annotations

import operator
import time
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.console import ConsoleClient
from runtime.node import READ_BURST, READS_PER_SECOND
from tests.helpers import GATEWAYS, Cli, nodes

pytestmark = pytest.mark.anyio
FLOOD = 100  # past the burst: the last ones wait about 3 s for their turn
ROOT = Path(__file__).resolve().parents[1]


async def test_a_flood_of_reads_is_paced_and_a_run_goes_on_meanwhile() -> None:
    assert FLOOD > READ_BURST + 2 * READS_PER_SECOND
    with anyio.fail_after(60):
        async with (
            nodes(1) as (address, _),
            Cluster(address) as cluster,
            ConsoleClient(address) as console,
        ):
            await cluster.wait_for_workers(1)
            gateway = GATEWAYS[-1]
            answered = 0
            flood_done = anyio.Event()

            async def read() -> None:
                nonlocal answered
                assert await console.story("no-such-key") == []
                answered += 1

            async def flood() -> None:
                async with anyio.create_task_group() as tg:
                    for _ in range(FLOOD):
                        tg.start_soon(read)
                flood_done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(flood)
                futures = cluster.map(operator.add, range(21), range(21))
                assert await cluster.gather(futures) == [2 * i for i in range(21)]
                run_finished_first = not flood_done.is_set()
            assert run_finished_first, "the run waited for the console's flood"
            assert answered == FLOOD  # slowed, not refused
            assert FLOOD - READ_BURST - 5 <= gateway.paced_reads <= FLOOD


async def test_a_read_only_console_flooding_a_real_manager_is_paced(tmp_path: Path) -> None:
    """The issue's case with real processes: a manager and a worker through the CLI, a
    read-only console over websockets sending a flood of story asks, a client running a
    graph meanwhile. The flood cannot finish faster than its pace allows; the run does
    not wait for it."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(90):
        manager, address = await anyio.to_thread.run_sync(cli.manager)
        worker = await anyio.to_thread.run_sync(cli.worker, address, "--cores", "1")
        async with (
            Cluster(address) as cluster,
            ConsoleClient(address, read_only=True) as console,
        ):
            await cluster.wait_for_workers(1)
            flood_done = anyio.Event()

            async def flood() -> None:
                async with anyio.create_task_group() as tg:
                    for _ in range(FLOOD):
                        tg.start_soon(console.story, "no-such-key")
                flood_done.set()

            start_time = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(flood)
                futures = cluster.map(operator.add, range(21), range(21))
                assert await cluster.gather(futures) == [2 * i for i in range(21)]
                assert not flood_done.is_set(), "the run waited for the console's flood"
            took = time.monotonic() - start_time
            floor = (FLOOD - READ_BURST) / READS_PER_SECOND
            assert took >= floor * 0.95, f"a flood of {FLOOD} passed in {took:.1f} s"
        assert manager.poll() is None and worker.poll() is None
