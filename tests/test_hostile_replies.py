"""A connection that asks for large answers and does not take them holds a bounded
amount of the manager's memory. A read-token socket asking for 10,000-row task
listings (~1 MB encoded, ~7 MB of objects each) once grew a manager from 119 to
770 MiB in 23 s: up to 64 answers waited to be sent, and a socket that read nothing
could have 1024 encoded answers queued in the transport.

Now a websocket connection queues at most ``max_queued_bytes`` to send (then its sends
wait), a peer that reads nothing of a full queue for its liveness timeout is closed
saying so, and a read-token connection's asks are served only while it has room for
their answers (Peer's ``reply_room``), one computed at a time. Unit tests of the bound
(ws end, Peer over inproc and ws), and the audit's case against real processes."""

from __future__ import annotations

import operator
import struct
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import psutil
import pytest

import transport
from runtime import Cluster
from runtime.codec import Frame, decode_batch, encode, encode_batch
from runtime.messages import ErrorReply, Ping, TasksQuery
from runtime.node import Hello
from runtime.remote import Peer
from tests.helpers import Cli, wait_until
from transport.ws import SUBPROTOCOL, WINDOW_HEADER, WebSocketConnection, WebSocketListener

pytestmark = pytest.mark.anyio

#: How long something that must stay pending is given to (wrongly) happen, seconds.
PENDING_WINDOW = 0.3
BOUND = 256 * 1024
PAYLOAD = 64 * 1024


def big(i: int = 0) -> Frame:
    """A frame of about PAYLOAD bytes."""
    return Frame(ErrorReply("Big", str(i) + "x" * PAYLOAD))


async def test_a_send_waits_while_the_bytes_queued_are_at_the_bound() -> None:
    """A peer that reads nothing: sends go on until the socket's buffers and then
    ``max_queued_bytes`` are full, then wait (credits are left: the bound is in bytes);
    once the peer reads, the waiting send goes and nothing was lost."""
    with anyio.fail_after(30):
        async with (
            await transport.listen("ws://127.0.0.1:0", max_queued_bytes=BOUND) as listener,
            aiohttp.ClientSession() as session,
            session.ws_connect(listener.address, protocols=(SUBPROTOCOL,)) as ws,
        ):
            assert isinstance(listener, WebSocketListener)
            server = await listener.accept()
            assert isinstance(server, WebSocketConnection)
            sent = 0
            blocked = False

            async def fill() -> None:
                nonlocal sent, blocked
                while True:
                    blocked = not server.send_room
                    await server.send(big(sent))
                    sent += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(fill)
                # the socket's buffers full, then the queue: nothing written for a while
                await wait_until(lambda: server.send_stalled > PENDING_WINDOW, "a full queue")
                assert blocked and server.send_room == 0
                assert BOUND <= server.queued_bytes < BOUND + 2 * PAYLOAD
                assert sent < server.max_buffer  # credits left: the bytes stopped it
                waiting = sent  # the index of the send that waits
                got: list[int] = []
                while len(got) <= waiting:  # the peer reads: the waiting send goes
                    data = await ws.receive_bytes()
                    if data[0] == 0x04:  # credit + data
                        data = data[5:]
                    if data[0] == 0xC7:
                        got += [int(f.msg.text.rstrip("x")) for f in decode_batch(data)]
                tg.cancel_scope.cancel()
            assert got[: waiting + 1] == list(range(waiting + 1))  # in order, none lost
            assert server.send_stalled == 0
            await server.aclose()


class Answers:
    """A target that answers every ask with ``size`` bytes and counts them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.asked = 0

    async def ask(self, msg: Any, **_: Any) -> Any:
        self.asked += 1
        return "x" * self.size

    async def tell(self, msg: Any, **_: Any) -> None:
        pass


async def test_asks_are_served_only_while_their_answers_have_room() -> None:
    """``reply_room``: over a connection whose peer may have 4 frames unread, an asker
    that sends 10 asks and takes no answer gets 4 answers computed, not 10; taking them
    lets the rest be served, all answered."""
    with anyio.fail_after(30):
        async with await transport.listen("inproc://", max_buffer=4) as listener:
            asker = await transport.connect(listener.address)
            conn = await listener.accept()
            target = Answers(100)
            peer = Peer(conn, target, name="asker", allow_pickle=False, max_asks=64,
                        reply_room=True)  # fmt: skip
            async with anyio.create_task_group() as tg:
                await tg.start(peer.run)
                for rid in range(1, 11):
                    await asker.send(Frame(Ping(), request_id=rid))  # any wire message will do
                await wait_until(lambda: conn.send_room == 0, "4 answers sent", limit=10)
                with anyio.move_on_after(PENDING_WINDOW):
                    await wait_until(lambda: target.asked > 4)
                assert target.asked == 4
                answered = {(await asker.receive()).reply_to for _ in range(10)}
                assert answered == set(range(1, 11))
                assert target.asked == 10
                await asker.aclose()


async def test_a_peer_that_reads_nothing_is_closed_after_the_timeout() -> None:
    """A raw websocket peer keeps sending (pings: not silent) and reads nothing while
    this side has more than ``max_queued_bytes`` queued for it: after ``timeout`` the
    connection is closed, and the reason says the peer read nothing."""
    with anyio.fail_after(30):
        async with (
            await transport.listen("ws://127.0.0.1:0", max_queued_bytes=BOUND) as listener,
            aiohttp.ClientSession() as session,
            session.ws_connect(listener.address, protocols=(SUBPROTOCOL,)) as ws,
        ):
            conn = await listener.accept()
            peer = Peer(conn, None, name="sink", allow_pickle=False, heartbeat=0.2, timeout=1.0)
            ended = anyio.Event()

            async def run() -> None:
                await peer.run()
                ended.set()

            async def keep_talking() -> None:
                while True:
                    await ws.send_bytes(encode(Frame(Ping())))
                    await anyio.sleep(0.05)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                tg.start_soon(keep_talking)
                for i in range(200):
                    peer.ref.post(ErrorReply("Big", str(i) + "x" * PAYLOAD))
                await ended.wait()
                tg.cancel_scope.cancel()
            assert "read nothing" in peer.closed_reason, peer.closed_reason
            assert "no message" not in peer.closed_reason  # not closed as silent


# ----------------------------------------------------------------------------- real processes

TASKS = 10_000
WINDOW = 10.0  # seconds of each flood


async def _flood(
    session: aiohttp.ClientSession, address: str, token: str, *, read: bool
) -> tuple[int, int]:
    """A read-token console asking for TASKS-row listings for WINDOW seconds, as fast
    as the manager's credits allow, never returning a credit (never taking an
    answer). ``read``: it reads the socket (for the credits; the answers dropped);
    else it reads nothing at all. Returns (asks sent, answers that reached it)."""
    headers = {"Authorization": f"Bearer {token}", WINDOW_HEADER: "1024"}
    ws = await session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers)
    await ws.send_bytes(encode(Frame(Hello("console", f"flood-{read}"))))
    credit, sent, answers = 1024 - 1, 0, 0
    with anyio.move_on_after(WINDOW):
        while True:
            if credit:
                n = min(credit, 500)
                ask = TasksQuery(limit=TASKS)
                frames = [Frame(ask, request_id=sent + i + 1) for i in range(n)]
                await ws.send_bytes(encode_batch(frames))
                credit, sent = credit - n, sent + n
            elif not read:
                await anyio.sleep_forever()
            else:
                data = await ws.receive_bytes()  # answers dropped unread
                if data[0] in (0x01, 0x04):  # a credit (+ data)
                    credit += struct.unpack(">I", data[1:5])[0]
                answers += data[0] in (0x04, 0xC7, 0x02)
    await ws.close()
    return sent, answers


async def test_a_console_that_takes_no_answers_holds_little_of_the_manager(
    tmp_path: Path,
) -> None:
    """The audit's case with a real manager and worker: 10,000 finished tasks held by a
    client, and a read-token socket asking for 10,000-row listings: one that reads the
    socket but returns no credit, then one that reads nothing at all. Each could grow
    the manager by hundreds of MiB (64 answers of ~8 MB waiting to be sent; 1024
    encoded answers queued); now the growth stays small, a client's run goes on
    meanwhile, and the manager serves normal reads after."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(240):
        manager, address = await anyio.to_thread.run_sync(cli.manager, "--no-monitoring")
        await anyio.to_thread.run_sync(cli.worker, address, "--cores", "1")
        proc = psutil.Process(manager.pid)
        read = cli.tokens(address)["read"]
        async with aiohttp.ClientSession() as session, Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            held = cluster.map(operator.add, range(TASKS), range(TASKS))
            await cluster.gather(held)
            before = proc.memory_info().rss
            peak = before
            for reads in (True, False):
                async with anyio.create_task_group() as tg:

                    async def watch() -> None:
                        nonlocal peak
                        while True:
                            peak = max(peak, proc.memory_info().rss)
                            await anyio.sleep(0.1)

                    tg.start_soon(watch)
                    sent, answers = await _flood(session, address, read, read=reads)
                    futures = cluster.map(operator.add, range(21), range(21))
                    assert await cluster.gather(futures) == [2 * i for i in range(21)]
                    tg.cancel_scope.cancel()
                growth = (peak - before) / 2**20
                print(f"reads={reads}: {sent} asks, {answers} answers; peak +{growth:.0f} MiB")
                assert growth < 96, f"the manager grew {growth:.0f} MiB"
            status = await cluster.status()
            assert status is not None
        assert manager.poll() is None
