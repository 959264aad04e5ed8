"""A flood of reads from one connection slows that connection down, not the scheduler
(issue 9): 200 story asks from a console once stalled a 21-task run for about 10 s.
Reads (status, stories, task listings, policies) pass the gateway at READS_PER_SECOND
per connection after a burst of READ_BURST; the rest wait their turn. In process (the
gateway's count of paced reads is visible there) and with real manager and worker
processes and a read-only console over websockets."""

from __future__ import annotations

import operator
import struct
import time
from pathlib import Path

import aiohttp
import anyio
import psutil
import pytest

from runtime import Cluster
from runtime.codec import Frame, decode_batch, encode, encode_batch
from runtime.console import ConsoleClient
from runtime.messages import StatusRequest
from runtime.node import MAX_ASKS, READ_BURST, READS_PER_SECOND, Hello, Welcome
from tests.helpers import GATEWAYS, Cli, nodes, wait_until
from transport.ws import SUBPROTOCOL, WINDOW_HEADER

MAX_BUFFER = 1024  # the manager's credits toward a peer (its max_buffer)


async def _hello_answer(
    session: aiohttp.ClientSession, address: str, headers: dict[str, str], name: str
) -> type:
    """The type of the manager's answer to a console's Hello under ``name``."""
    async with session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers) as ws:
        await ws.send_bytes(encode(Frame(Hello("console", name))))
        while True:
            data = await ws.receive_bytes()
            if data[0] == 0x04:  # credit + data
                data = data[5:]
            if data[0] == 0xC7:
                return type(decode_batch(data)[0].msg)


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


async def test_a_console_that_floods_asks_is_stopped_at_its_sender(tmp_path: Path) -> None:
    """A read-token connection sends status asks as fast as the manager's credits let it
    and reads no answer (only the credits). The gateway serves at most MAX_ASKS of them
    at once and reads nothing more meanwhile, so the credits stop coming and the flood
    waits at its sender: 100,000 such asks once grew the manager from 80 to 560 MiB (a
    task each, waiting for its turn) and blocked its event loop for 7.5 s. A client's
    run goes on meanwhile; the flood's connection, once gone, frees its name at once."""
    window = 10.0  # seconds of flooding
    with Cli(tmp_path / "home") as cli, anyio.fail_after(90):
        manager, address = await anyio.to_thread.run_sync(cli.manager)
        await anyio.to_thread.run_sync(cli.worker, address, "--cores", "1")
        proc = psutil.Process(manager.pid)
        read = cli.tokens(address)["read"]
        headers = {"Authorization": f"Bearer {read}", WINDOW_HEADER: "1024"}
        async with aiohttp.ClientSession() as session, Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            before = proc.memory_info().rss
            ws = await session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers)
            await ws.send_bytes(encode(Frame(Hello("console", "flood"))))
            credit, sent = MAX_BUFFER - 1, 0
            with anyio.move_on_after(window):
                while True:
                    if credit:
                        n = min(credit, 500)
                        frames = [Frame(StatusRequest(), request_id=sent + i + 1) for i in range(n)]
                        await ws.send_bytes(encode_batch(frames))
                        credit, sent = credit - n, sent + n
                        continue
                    data = await ws.receive_bytes()  # answers dropped unread
                    if data[0] in (0x01, 0x04):  # a credit (+ data)
                        credit += struct.unpack(">I", data[1:5])[0]
                    # a run goes on meanwhile
            futures = cluster.map(operator.add, range(21), range(21))
            assert await cluster.gather(futures) == [2 * i for i in range(21)]
            growth = proc.memory_info().rss - before
            await ws.close()
            # Let through: what the credits allowed at first, MAX_ASKS, the transport's
            # bounded unread, and the pace's 20 a second. Unbounded, it took ~30,000.
            allowed = MAX_BUFFER + MAX_ASKS + READ_BURST + READS_PER_SECOND * window
            print(f"{sent} asks sent in {window:g} s; manager RSS +{growth / 2**20:.1f} MiB")
            assert sent < 2 * allowed, sent
            assert growth < 48 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB"

            # Its name is free again once the manager has seen the close (not after its
            # thousand buffered asks were served at the pace): a Hello under it is welcomed.
            async def welcomed() -> bool:
                return await _hello_answer(session, address, headers, "flood") is Welcome

            await wait_until(welcomed, "a Hello under the flood's name welcomed", limit=5, step=0.1)
        assert manager.poll() is None


async def test_a_worker_connection_past_max_asks_loses_no_ask_and_stays_joined(
    tmp_path: Path,
) -> None:
    """A worker-token connection has the MAX_ASKS bound (its asks: PeerQuery, answered
    from the gateway's table) without the read role's reply room. A worker that sends
    2,000 of them and reads nothing meanwhile (stalled) has MAX_ASKS served and the rest
    wait unread; once it reads again, every ask is answered exactly once and its tell
    after them is taken: nothing lost, the worker still joined. (It cannot deadlock: a
    worker posts its tells to the scheduler without waiting, so its reading never waits
    for the manager's.)"""
    from runtime.messages import WorkerHolds
    from runtime.node import PeerQuery, WorkerInfo
    from runtime.remote import to_wire
    from transport import connect

    n = 2000
    with Cli(tmp_path / "home") as cli, anyio.fail_after(90):
        manager, address = await anyio.to_thread.run_sync(cli.manager)
        token = cli.tokens(address)["worker"]
        info = WorkerInfo("ws://127.0.0.1:2", 1, 0)  # (an id: nothing listens there)
        conn = await connect(address, token=token)
        try:
            await conn.send(Frame(Hello("worker", info.worker_id, info)))
            assert type((await conn.receive()).msg) is Welcome
            for i in range(n):  # nothing read meanwhile
                await conn.send(Frame(PeerQuery(info.worker_id), request_id=i + 1))
            answered: dict[int, int] = {}
            while len(answered) < n:
                frame = await conn.receive()
                if frame.reply_to:
                    assert frame.msg == info, frame.msg
                    answered[frame.reply_to] = answered.get(frame.reply_to, 0) + 1
            assert sorted(answered) == list(range(1, n + 1))
            assert set(answered.values()) == {1}
            await conn.send(Frame(to_wire(WorkerHolds(info.worker_id, (), ()))))
            async with Cluster(address) as cluster:
                status = await cluster.status()
                assert info.worker_id in [w.worker_id for w in status["workers"]]
        finally:
            await conn.aclose()
        assert manager.poll() is None
