"""Hostile peers against the websocket transport (issue 9): memory per connection stays
bounded whatever a peer announces or sends, credits are enforced on receive, and slow
or idle HTTP clients cannot hold the listener.

The RSS tests run a real manager process (``python -m runtime manager``) and attack it
with raw aiohttp websockets that present the read-only token; the others use an
in-process listener. Every test is bounded; waits are on events (a close seen by the
peer), with bounded polls only for what has no event (another process's RSS)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
import psutil
import pytest
from aiohttp import WSMsgType

import transport
from runtime import Cluster
from runtime.codec import Frame, decode_batch, encode, encode_batch
from runtime.messages import ErrorReply, Ping, StatusRequest
from runtime.node import Hello
from tests.helpers import Cli, closed_by_peer, wait_until
from transport.ws import SUBPROTOCOL, WINDOW_HEADER, WebSocketConnection, WebSocketListener

pytestmark = pytest.mark.anyio

LIMIT = 60
PY = sys.executable
MiB = 1 << 20
#: Growth of the manager's RSS allowed for the hostile connections of a test: well
#: under what one announced 256 MiB message used to cost, above the stated per-
#: connection bound times the connections (docs/transport.md, "Memory per connection").
RSS_BOUND = 48 * MiB


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as c:
        yield c


@pytest.fixture
def env(cli: Cli) -> dict[str, str]:
    return cli.env


@pytest.fixture
def manager(cli: Cli) -> tuple[str, subprocess.Popen[str], dict[str, str]]:
    """A manager process and one worker: (address, manager process, its tokens)."""
    proc, address = cli.manager()
    cli.worker(address, "--cores", "1")
    return address, proc, cli.tokens(address)


def _rss(proc: subprocess.Popen[str]) -> int:
    return int(psutil.Process(proc.pid).memory_info().rss)


async def _normal_run(address: str, env: dict[str, str]) -> None:
    """A client joins, runs a task on the worker and gets the right answer."""
    os.environ["CORRAL_HOME"] = env["CORRAL_HOME"]  # this process finds the token file
    async with Cluster(address) as cluster:
        await cluster.wait_for_workers(1)
        assert await cluster.submit(sum, [1, 2, 3]) == 6


async def _reply(ws: aiohttp.ClientWebSocketResponse, request_id: int) -> Frame:
    """The frame the peer sends in reply to ``request_id`` (others are dropped)."""
    while True:
        msg = await ws.receive()
        assert msg.type is WSMsgType.BINARY, msg
        data = msg.data
        if data[0] == 0x04:  # credit + data
            data = data[5:]
        if data[0] != 0xC7:
            continue
        for frame in decode_batch(data):
            if frame.reply_to == request_id:
                return frame


def _chunk(total: int, piece: bytes) -> bytes:
    return struct.pack(">BQ", 2, total) + piece


# ----------------------------------------------------------------------------- RSS


async def test_chunk_announcements_before_hello_allocate_nothing_large(
    manager: tuple[str, subprocess.Popen[str], dict[str, str]], env: dict[str, str]
) -> None:
    """Eight read-token connections each announce a 256 MiB message before any Hello
    (which used to allocate 256 MiB each at once) and send its first 1 MiB: the
    manager's RSS grows by far less than one such allocation; it closes them (a first
    message over the provisional limit: 1009) and then serves a normal run."""
    address, proc, tokens = manager
    headers = {"Authorization": f"Bearer {tokens['read']}"}
    n = 8
    with anyio.fail_after(LIMIT):
        before = _rss(proc)
        peak = before
        closes: list[tuple[int | None, str]] = []
        async with aiohttp.ClientSession() as session:
            sockets = [
                await session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers)
                for _ in range(n)
            ]
            first = bytes([0xC7]) + os.urandom(MiB - 1)
            for ws in sockets:
                await ws.send_bytes(_chunk(256 * MiB, first))
            done = anyio.Event()

            async def watch(ws: aiohttp.ClientWebSocketResponse) -> None:
                closes.append(await closed_by_peer(ws))
                if len(closes) == n:
                    done.set()

            async with anyio.create_task_group() as tg:
                for ws in sockets:
                    tg.start_soon(watch, ws)
                # No event says when another process allocates: poll its RSS (bounded)
                # until it has closed every connection.
                while not done.is_set():
                    peak = max(peak, _rss(proc))
                    with anyio.move_on_after(0.05):
                        await done.wait()
            for ws in sockets:
                await ws.close()
        growth = peak - before
        print(
            f"manager RSS {before / MiB:.1f} MiB -> peak {peak / MiB:.1f} MiB (+{growth / MiB:.1f})"
        )
        assert growth < RSS_BOUND, f"RSS grew by {growth / MiB:.1f} MiB"
        assert len(closes) == n
        assert proc.poll() is None, "the manager died"
        await _normal_run(address, env)


async def test_a_console_batch_over_its_credits_is_refused_without_growing(
    manager: tuple[str, subprocess.Popen[str], dict[str, str]], env: dict[str, str]
) -> None:
    """A read-only console says Hello, then sends batches of tiny frames: one holding
    more frames than its credits (1500 > max_buffer) closes the connection with code 1008
    and a reason naming the credits; a hundred consoles sending 40 KiB batches of
    Pings (the x21 expansion that took a 33 MiB batch to 782 MB) leave RSS bounded."""
    address, proc, tokens = manager
    headers = {"Authorization": f"Bearer {tokens['read']}", WINDOW_HEADER: "1024"}
    with anyio.fail_after(LIMIT):
        before = _rss(proc)
        peak = before
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers)
            await ws.send_bytes(encode(Frame(Hello("console", "hostile-console"))))
            over = encode_batch([Frame(Ping(i)) for i in range(1500)])
            assert len(over) < 64 << 10  # under the limit of a console before its Hello
            await ws.send_bytes(over)
            code, reason = await closed_by_peer(ws)
            await ws.close()
            assert code == 1008, (code, reason)
            assert "credits" in reason, reason

            # Many consoles, each with a batch that fits its credits, then an ask: the
            # manager handles a connection's frames in order, so the reply says the batch
            # before it was read.
            batch = encode_batch([Frame(Ping(i)) for i in range(1000)])
            assert len(batch) < 64 << 10
            consoles = []
            for i in range(100):
                c = await session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers)
                await c.send_bytes(encode(Frame(Hello("console", f"console-{i}"))))
                await c.send_bytes(batch)
                await c.send_bytes(encode(Frame(StatusRequest(), request_id=1)))
                consoles.append(c)
                peak = max(peak, _rss(proc))
            for c in consoles:
                await _reply(c, 1)
                peak = max(peak, _rss(proc))
            for c in consoles:
                await c.close()
        growth = peak - before
        print(
            f"manager RSS {before / MiB:.1f} MiB -> peak {peak / MiB:.1f} MiB (+{growth / MiB:.1f})"
        )
        assert growth < RSS_BOUND, f"RSS grew by {growth / MiB:.1f} MiB"
        assert proc.poll() is None, "the manager died"
        await _normal_run(address, env)


# ----------------------------------------------------------------------------- in process


async def _listener(**options: Any) -> WebSocketListener:
    listener = await transport.listen("ws://127.0.0.1:0/h", **options)
    assert isinstance(listener, WebSocketListener)
    return listener


async def test_frames_beyond_the_announced_credits_close_the_connection() -> None:
    """A peer that announced max_buffer=4 and sends a fifth frame while the receiver has
    read none is closed with 1008; the four are still delivered."""
    with anyio.fail_after(LIMIT):
        async with await _listener() as listener, aiohttp.ClientSession() as session:
            ws = await session.ws_connect(
                listener.address, protocols=(SUBPROTOCOL,), headers={WINDOW_HEADER: "4"}
            )
            server = await listener.accept()
            assert isinstance(server, WebSocketConnection)
            assert server.peer_window == 4
            for i in range(5):
                await ws.send_bytes(encode(Frame(Ping(i))))
            code, reason = await closed_by_peer(ws)
            await ws.close()
            assert code == 1008 and "credits" in reason, (code, reason)
            got = [(await server.receive()).msg for _ in range(4)]
            assert got == [Ping(i) for i in range(4)]
            with pytest.raises(transport.ConnectionClosed, match="credits"):
                await server.receive()
            await server.aclose()


async def test_a_batch_larger_than_the_credits_closes_before_it_is_decoded() -> None:
    with anyio.fail_after(LIMIT):
        async with await _listener() as listener, aiohttp.ClientSession() as session:
            ws = await session.ws_connect(
                listener.address, protocols=(SUBPROTOCOL,), headers={WINDOW_HEADER: "16"}
            )
            server = await listener.accept()
            await ws.send_bytes(encode_batch([Frame(Ping(i)) for i in range(17)]))
            code, reason = await closed_by_peer(ws)
            await ws.close()
            assert code == 1008 and "max_buffer=16" in reason, (code, reason)
            assert isinstance(server, WebSocketConnection) and server.frames_received == 0
            await server.aclose()


async def test_a_batch_larger_than_max_buffer_is_sent_in_pieces_within_the_credits() -> None:
    """Legitimate traffic never trips the check: a send_many of 10x max_buffer arrives
    whole and in order, in messages of at most max_buffer frames."""
    with anyio.fail_after(LIMIT):
        async with await _listener(max_buffer=8) as listener:
            client = await transport.connect(listener.address, max_buffer=8)
            async with client, await listener.accept() as server:
                await client.send_many([Frame(Ping(i)) for i in range(80)])
                got = [(await server.receive()).msg for _ in range(80)]
                assert got == [Ping(i) for i in range(80)]
                assert isinstance(client, WebSocketConnection)
                assert client.messages_sent >= 10  # at most 8 frames per message
                assert isinstance(server, WebSocketConnection) and server.bad_frames == 0


async def test_an_untrusted_connection_holds_a_large_message_until_its_limits_are_raised() -> None:
    """A read-role connection starts at initial_max_message_bytes: a larger message (in
    chunks) is neither refused nor reassembled until the application calls
    set_limits; afterwards it is delivered, and one above the new limit closes (1009)."""
    tokens = {"a": "admin", "r": "read"}
    with anyio.fail_after(LIMIT):
        async with await _listener(tokens=tokens, chunk_size=64 << 10) as listener:
            client = await transport.connect(listener.address, token="r", chunk_size=64 << 10)
            async with client, await listener.accept() as server:
                assert isinstance(server, WebSocketConnection)
                assert not server.trusted and server.receive_limit == 64 << 10
                big = Frame(ErrorReply("Blob", "big", b"x" * (512 << 10)))
                await client.send(Frame(Ping(0)))
                await client.send(big)
                assert (await server.receive()).msg == Ping(0)
                with anyio.move_on_after(0.2):  # nothing more may arrive before set_limits
                    await server.receive()
                    raise AssertionError("a message over the provisional limit arrived")
                assert server.chunks_received == 0
                server.set_limits(max_message_bytes=1 << 20)
                assert (await server.receive()) == big
                await client.send(Frame(ErrorReply("Blob", "too big", b"x" * (2 << 20))))
                with pytest.raises(transport.ConnectionClosed, match="1009"):
                    await server.receive()


async def test_trusted_roles_start_with_the_full_limit() -> None:
    tokens = {"a": "admin", "r": "read"}
    with anyio.fail_after(LIMIT):
        async with await _listener(tokens=tokens) as listener:
            client = await transport.connect(listener.address, token="a")
            async with client, await listener.accept() as server:
                assert isinstance(server, WebSocketConnection)
                assert server.trusted and server.receive_limit == server.max_message_bytes
                big = Frame(ErrorReply("Blob", "big", b"x" * (4 << 20)))
                await client.send(big)
                assert await server.receive() == big


# ----------------------------------------------------------------------------- slowloris


async def _half_sent_requests(port: int, n: int, path: bytes) -> list[anyio.abc.SocketStream]:
    """``n`` TCP connections to ``port``, each having sent half an HTTP request."""
    streams = []
    for _ in range(n):
        s = await anyio.connect_tcp("127.0.0.1", port)
        await s.send(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: webs")
        streams.append(s)
    return streams


async def _closed_after(streams: list[anyio.abc.SocketStream], started: float) -> list[float]:
    """Wait until the peer has closed every stream; when each closed, since ``started``."""
    closed_at: list[float] = []

    async def until_closed(s: anyio.abc.SocketStream) -> None:
        try:
            while await s.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            pass
        closed_at.append(anyio.current_time() - started)
        await s.aclose()

    async with anyio.create_task_group() as tg:
        for s in streams:
            tg.start_soon(until_closed, s)
    return closed_at


async def test_half_sent_http_requests_are_closed_and_a_client_still_connects() -> None:
    """200 TCP connections that send half an HTTP request: beyond max_handshakes the
    oldest are closed at once, the rest at handshake_timeout; a real client connects
    and exchanges frames meanwhile."""
    n, timeout, cap = 200, 1.0, 32
    with anyio.fail_after(LIMIT):
        async with await _listener(handshake_timeout=timeout, max_handshakes=cap) as listener:
            port = int(urlsplit(listener.address).port or 0)
            started = anyio.current_time()
            streams = await _half_sent_requests(port, n, b"/h")
            client = await transport.connect(listener.address, timeout=5)
            async with client, await listener.accept() as server:
                await client.send(Frame(Ping(7)))
                assert (await server.receive()).msg == Ping(7)
                await server.send(Frame(Ping(8)))
                assert (await client.receive()).msg == Ping(8)
            closed_at = await _closed_after(streams, started)
            assert len(closed_at) == n
            assert max(closed_at) < timeout + 5, max(closed_at)
            assert listener.evicted >= n - cap
            assert listener.handshaking == 0


@pytest.mark.slow
async def test_a_real_manager_closes_half_sent_requests_and_keeps_serving(
    manager: tuple[str, subprocess.Popen[str], dict[str, str]], env: dict[str, str]
) -> None:
    """The issue's slowloris case against a manager process with its defaults: 200 half
    sent HTTP requests, no token needed, once held for 60 s or more. Now each is closed
    by the manager within its 10 s handshake timeout (the oldest at once, past 64
    half-open), and a client runs a graph meanwhile."""
    address, proc, _ = manager
    port = int(urlsplit(address).port or 0)
    n, handshake_timeout = 200, 10.0
    with anyio.fail_after(LIMIT):
        started = anyio.current_time()
        streams = await _half_sent_requests(port, n, b"/")
        await _normal_run(address, env)  # served while the half-open ones wait
        closed_at = await _closed_after(streams, started)
    assert len(closed_at) == n
    assert max(closed_at) < handshake_timeout + 5, max(closed_at)
    assert proc.poll() is None


async def test_pages_being_served_are_not_counted_as_unfinished_handshakes() -> None:
    """Three requests to a browser route that stay open (a dashboard page's feed) with
    ``max_handshakes`` 2: they sent complete requests, so new connections (a client)
    close none of them. Before, only the gateway's own upgrades were counted as
    complete: each new connection closed the oldest open page."""
    from aiohttp import web

    release = anyio.Event()
    serving: list[int] = []

    async def page(request: web.Request, role: str) -> web.StreamResponse:
        serving.append(1)
        await release.wait()
        return web.Response(text="done")

    with anyio.fail_after(LIMIT):
        async with await _listener(max_handshakes=2, web_routes={"/page": page}) as listener:
            port = int(urlsplit(listener.address).port or 0)
            url = f"http://127.0.0.1:{port}/page"
            async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
                answers: list[int] = []

                async def get() -> None:
                    async with session.get(url) as resp:
                        answers.append(resp.status)

                for _ in range(3):
                    tg.start_soon(get)
                await wait_until(lambda: len(serving) == 3, "three pages served", limit=LIMIT)
                assert listener.handshaking == 0
                client = await transport.connect(listener.address, timeout=5)
                async with client, await listener.accept() as server:
                    await client.send(Frame(Ping(1)))
                    assert (await server.receive()).msg == Ping(1)
                assert listener.evicted == 0
                release.set()
            assert answers == [200, 200, 200]
