"""Tests of the ``ws://`` and ``wss://`` transports (:mod:`transport.ws`).

What lives here: the conformance suite run over websockets four ways (plain; with
authentication; over TLS with a self-signed certificate made here; with batching off
and small chunks), and websocket-specific tests: authentication in the handshake,
roles, batching, chunking with credits overtaking a large message, flow control
against the peer's buffer, bad input from raw aiohttp peers (error replies, counters,
the 1008 close), oversized messages, heartbeats, TLS failures, options and addresses.
Every test is bounded by ``anyio.fail_after``; waits are on events, never on sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pickle
import ssl
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.lowlevel
import orjson
import pytest
from aiohttp import WSMsgType, web

import transport
from runtime.codec import KIND_FRAME, MAGIC, VERSION, Frame, decode_batch, encode
from runtime.errors import CHECK_LISTENER, CorralError, ProtocolError
from runtime.messages import ErrorReply, Ping
from tests.helpers import ca_signed_pem, free_port_between, log_lines, self_signed_pem, wait_until
from tests.transport_conformance import TransportConformance, ping, token
from transport import (
    ConnectFailed,
    Connection,
    ConnectionClosed,
    InvalidAddress,
    Listener,
    TransportError,
)
from transport.tls import certificate_hint, refused_certificate
from transport.ws import (
    CUT_OFF_HINT,
    SUBPROTOCOL,
    AuthenticationFailed,
    WebSocketConnection,
    WebSocketListener,
)

pytestmark = pytest.mark.anyio

TIMEOUT = 20.0
#: How long something that must stay pending is given to (wrongly) happen, seconds.
PENDING_WINDOW = 0.2
TOKENS = {"secret-a": "admin", "secret-r": "read"}


# ----------------------------------------------------------------------------- TLS


def server_context(names: tuple[str, ...], *, expired: bool = False) -> ssl.SSLContext:
    """A listener's context serving a self-signed certificate for ``names``."""
    cert_pem, key_pem = self_signed_pem(names, expired=expired)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as tmp:
        cert_file, key_file = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def trusting(names: tuple[str, ...], *, expired: bool = False) -> ssl.SSLContext:
    """A client context that trusts the certificate of :func:`server_context`."""
    return ssl.create_default_context(cadata=self_signed_pem(names, expired=expired)[0].decode())


@functools.cache
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext, bytes]:
    """(server context, client context trusting it, certificate PEM), self-signed."""
    names = ("127.0.0.1", "localhost")
    return server_context(names), trusting(names), self_signed_pem(names)[0]


# ----------------------------------------------------------------------------- conformance


class TestWebSocketTransport(TransportConformance):
    """Plain ``ws://`` with the default options."""

    def fresh_address(self) -> str:
        return "ws://127.0.0.1:0/corral"

    async def test_counters_and_peer_addresses(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, listener):
                assert isinstance(client, WebSocketConnection)
                assert isinstance(server, WebSocketConnection)
                assert isinstance(listener, WebSocketListener)
                assert server.peer_address == client.local_address
                assert client.local_address.startswith("ws://127.0.0.1:")
                assert server.role is None and client.role is None
                await client.send(ping(1))
                assert token(await server.receive()) == 1
                assert (client.frames_sent, server.frames_received) == (1, 1)
                assert client.messages_sent == server.messages_received >= 1
                assert listener.connections == 1 and listener.refused == 0


class TestWebSocketAuthTransport(TransportConformance):
    """``ws://`` with a listener that requires a token, and a client that has one."""

    def fresh_address(self) -> str:
        return "ws://127.0.0.1:0/corral"

    def listen_options(self) -> dict[str, Any]:
        return {"tokens": TOKENS}

    def connect_options(self) -> dict[str, Any]:
        return {"token": "secret-r"}

    async def test_role_is_exposed(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                assert isinstance(server, WebSocketConnection)
                assert server.role == "read"
                assert getattr(client, "role", "missing") is None


class TestWebSocketTLSTransport(TransportConformance):
    """``wss://`` with a self-signed certificate the client trusts."""

    def fresh_address(self) -> str:
        return "wss://127.0.0.1:0/corral"

    def listen_options(self) -> dict[str, Any]:
        return {"ssl_context": tls_contexts()[0], "tokens": TOKENS}

    def connect_options(self) -> dict[str, Any]:
        return {"ssl_context": tls_contexts()[1], "token": "secret-a"}


class TestWebSocketUnbatchedSmallChunks(TransportConformance):
    """No batching window and 64 KiB chunks: the 8 MiB test goes in 128+ chunks."""

    def fresh_address(self) -> str:
        return "ws://127.0.0.1:0"

    def listen_options(self) -> dict[str, Any]:
        return {"batch_window": 0, "chunk_size": 64 << 10}

    def connect_options(self) -> dict[str, Any]:
        return {"batch_window": 0, "chunk_size": 64 << 10}


# ----------------------------------------------------------------------------- helpers


@contextlib.asynccontextmanager
async def ws_pair(
    listen_options: dict[str, Any] | None = None,
    connect_options: dict[str, Any] | None = None,
    address: str = "ws://127.0.0.1:0/corral",
) -> AsyncIterator[tuple[WebSocketConnection, WebSocketConnection, WebSocketListener]]:
    """(client end, server end, listener) over ws on loopback; all closed on exit."""
    async with await transport.listen(address, **(listen_options or {})) as listener:
        assert isinstance(listener, WebSocketListener)
        client = await transport.connect(listener.address, **(connect_options or {}))
        async with client, await listener.accept() as server:
            assert isinstance(client, WebSocketConnection)
            assert isinstance(server, WebSocketConnection)
            yield client, server, listener


@contextlib.asynccontextmanager
async def raw_client(
    address: str, headers: dict[str, str] | None = None
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A bare aiohttp websocket to ``address``: it sends whatever a test tells it to."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(address, protocols=(SUBPROTOCOL,), headers=headers) as ws,
    ):
        yield ws


@contextlib.asynccontextmanager
async def raw_pair(
    listener: Listener, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, WebSocketConnection]]:
    """(raw client websocket, accepted server end). The raw side closes first on exit:
    it does not read, so the server's close handshake would otherwise wait for it."""
    async with raw_client(listener.address, headers) as ws:
        server = await listener.accept()
        assert isinstance(server, WebSocketConnection)
        try:
            yield ws, server
        finally:
            await ws.close()
            await server.aclose()


def codec_bytes(header: dict[str, Any], tail: bytes = b"") -> bytes:
    """A single-frame codec message with an arbitrary (possibly invalid) header."""
    head = orjson.dumps(header)
    return struct.pack(">BBBBI", MAGIC, VERSION, KIND_FRAME, 0, len(head)) + head + tail


async def next_message(ws: aiohttp.ClientWebSocketResponse) -> tuple[int, bytes]:
    """The next message that is not a bare credit grant: (type byte, payload after it)."""
    while True:
        msg = await ws.receive()
        if msg.type is not WSMsgType.BINARY:
            return -1, b""
        data: bytes = msg.data
        if data[0] == 0x01:  # credit
            continue
        if data[0] == 0x04:  # credit + data
            return MAGIC, data[5:]
        if data[0] == MAGIC:
            return MAGIC, data
        return data[0], data[1:]


async def error_reply(ws: aiohttp.ClientWebSocketResponse) -> ErrorReply:
    """The next message, which must be an error message holding one ErrorReply."""
    kind, payload = await next_message(ws)
    assert kind == 0x03, f"expected an error message, got type {kind}"
    [frame] = decode_batch(payload)
    assert isinstance(frame.msg, ErrorReply)
    assert frame.msg.kind == "ProtocolError"
    return frame.msg


async def data_frames(ws: aiohttp.ClientWebSocketResponse) -> list[Frame]:
    kind, payload = await next_message(ws)
    assert kind == MAGIC, f"expected a data message, got type {kind}"
    return decode_batch(payload)


async def assert_pending(ev: anyio.Event, what: str) -> None:
    with anyio.move_on_after(PENDING_WINDOW):
        await ev.wait()
    assert not ev.is_set(), what


# ----------------------------------------------------------------------------- auth


async def test_connect_without_token_is_refused_before_any_frame() -> None:
    with anyio.fail_after(TIMEOUT):
        async with await transport.listen("ws://127.0.0.1:0/c", tokens=TOKENS) as listener:
            assert isinstance(listener, WebSocketListener)
            with pytest.raises(AuthenticationFailed) as info:
                await transport.connect(listener.address)
            err = info.value
            assert isinstance(err, ConnectFailed) and isinstance(err, TransportError)
            assert err.status == 401
            assert err.address == listener.address
            assert "none was given" in err.reason
            assert "token=" in str(err)  # says what to do
            assert listener.refused == 1 and listener.connections == 0
            accepted = anyio.Event()

            async def accept() -> None:
                await listener.accept()
                accepted.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(accept)
                await assert_pending(accepted, "a refused handshake produced a connection")
                tg.cancel_scope.cancel()


async def test_connect_with_wrong_token_is_refused() -> None:
    with anyio.fail_after(TIMEOUT):
        async with await transport.listen("ws://127.0.0.1:0", tokens=TOKENS) as listener:
            assert isinstance(listener, WebSocketListener)
            with pytest.raises(AuthenticationFailed) as info:
                await transport.connect(listener.address, token="secret-x")
            assert info.value.status == 403
            assert "matches none" in info.value.reason
            assert listener.refused == 1 and listener.connections == 0
            # the right token still works on the same listener
            async with (
                await transport.connect(listener.address, token="secret-a") as client,
                await listener.accept() as server,
            ):
                assert getattr(server, "role", None) == "admin"
                await client.send(ping(1))
                assert token(await server.receive()) == 1


async def test_raw_handshakes_get_401_or_403_and_no_frame_is_read() -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0/c", tokens=TOKENS) as listener,
            aiohttp.ClientSession() as session,
        ):
            assert isinstance(listener, WebSocketListener)
            cases = [
                ({}, 401, 'realm="corral"'),
                ({"Authorization": "Basic c2VjcmV0LWE="}, 401, "invalid_request"),
                ({"Authorization": "Bearer"}, 401, "invalid_request"),
                ({"Authorization": "Bearer secret-b"}, 403, "invalid_token"),
                ({"Authorization": "Bearer secret-a2"}, 403, "invalid_token"),
            ]
            for headers, status, challenge in cases:
                with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                    await session.ws_connect(listener.address, headers=headers)
                assert info.value.status == status, headers
                assert info.value.headers is not None
                assert challenge in info.value.headers["WWW-Authenticate"]
            assert listener.refused == len(cases) and listener.connections == 0
            async with raw_pair(listener, {"Authorization": "Bearer secret-r"}) as (ws, server):
                assert getattr(server, "role", None) == "read"
                await ws.send_bytes(encode(ping(3)))
                assert token(await server.receive()) == 3


async def test_a_handshake_offering_only_another_version_is_refused_as_a_mismatch() -> None:
    """A client that offers websocket subprotocols, none of them ``corral.v1`` (a client
    of another version), is refused at the handshake with "version mismatch", naming
    what each side speaks; before, it was accepted and its frames failed one by one. A
    handshake offering none (a browser's page) or ``corral.v1`` among others is taken."""
    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0/c", tokens=TOKENS) as listener,
            aiohttp.ClientSession() as session,
        ):
            assert isinstance(listener, WebSocketListener)
            auth = {"Authorization": "Bearer secret-a"}
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await session.ws_connect(listener.address, protocols=("corral.v99",), headers=auth)
            assert info.value.status == 400
            assert (listener.refused, listener.connections) == (1, 0)
            async with session.get(
                listener.address.replace("ws://", "http://"),
                headers={
                    **auth, "Connection": "Upgrade", "Upgrade": "websocket",
                    "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Protocol": "corral.v99, corral.v100",
                },
            ) as response:  # fmt: skip
                assert response.status == 400
                assert (await response.text()).startswith(
                    "version mismatch: the client offers websocket subprotocol corral.v99, "
                    f"corral.v100; this listener speaks {SUBPROTOCOL} (Corral "
                )
            for protocols in ((), ("corral.v99", SUBPROTOCOL)):
                async with session.ws_connect(
                    listener.address, protocols=protocols, headers=auth
                ) as ws:
                    server = await listener.accept()
                    await ws.send_bytes(encode(ping(4)))
                    assert token(await server.receive()) == 4
                    await ws.close()
                    await server.aclose()


async def test_role_per_token_and_none_without_auth() -> None:
    with anyio.fail_after(TIMEOUT):
        async with await transport.listen("ws://127.0.0.1:0", tokens=TOKENS) as listener:
            for tok, role in TOKENS.items():
                async with (
                    await transport.connect(listener.address, token=tok),
                    await listener.accept() as server,
                ):
                    assert isinstance(server, WebSocketConnection)
                    assert server.role == role
        # a listener without tokens accepts anyone (a token sent anyway is ignored)
        async with ws_pair(connect_options={"token": "whatever"}) as (_, server, listener):
            assert not listener.auth_required
            assert server.role is None


def test_authentication_failed_pickles() -> None:
    err = AuthenticationFailed("ws://h:1", "the listener requires a token", 401)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is AuthenticationFailed
    assert isinstance(again, CorralError)
    assert (again.address, again.reason, again.status) == ("ws://h:1", err.reason, 401)
    assert str(again) == str(err)


# ----------------------------------------------------------------------------- batching


async def test_many_small_sends_go_out_in_few_messages() -> None:
    with anyio.fail_after(TIMEOUT):
        async with ws_pair() as (client, server, _):
            n = 1000
            for i in range(n):
                await client.send(ping(i))
            assert [token(await server.receive()) for _ in range(n)] == list(range(n))
            assert client.frames_sent == n
            assert client.messages_sent <= n // 10, client.messages_sent


@pytest.mark.parametrize("batch_window", [0.0, 5.0])
async def test_batch_window_gathers_sends_spread_over_loop_passes(batch_window: float) -> None:
    """Each send is followed by a yield to the event loop: without a window every send
    gets its own message; with one the writer goes on gathering while sends keep coming
    (it does not sleep for the window: the last message leaves once the sends stop)."""
    n = 50
    opts = {"batch_window": batch_window}
    with anyio.fail_after(TIMEOUT):
        async with ws_pair(connect_options=opts) as (client, server, _):
            for i in range(n):
                await client.send(ping(i))
                await anyio.lowlevel.checkpoint()
            assert [token(await server.receive()) for _ in range(n)] == list(range(n))
            if batch_window:
                assert client.messages_sent <= 3, client.messages_sent
            else:
                assert client.messages_sent >= n // 2, client.messages_sent


async def test_send_many_is_one_message() -> None:
    with anyio.fail_after(TIMEOUT):
        async with ws_pair() as (client, server, _):
            await client.send_many([ping(i) for i in range(100)])
            assert [token(await server.receive()) for _ in range(100)] == list(range(100))
            assert client.messages_sent == 1


async def test_send_returns_once_queued_not_when_delivered() -> None:
    """A send with credit returns without waiting for the peer (nor for the writer)."""
    with anyio.fail_after(TIMEOUT):
        async with ws_pair() as (client, server, _):
            for i in range(10):
                await client.send(ping(i))
            assert client.messages_sent == 0  # the writer has not even run yet
            assert [token(await server.receive()) for _ in range(10)] == list(range(10))


# ----------------------------------------------------------------------------- chunking


async def test_large_frame_travels_in_chunks_and_keeps_order() -> None:
    payload = os.urandom(8 << 20)
    chunk = 256 << 10
    opts = {"chunk_size": chunk}
    with anyio.fail_after(TIMEOUT):
        async with ws_pair(opts, opts) as (client, server, _):
            big = Frame(ErrorReply("Blob", "8 MiB", pickled=payload))
            size = len(encode(big))
            before = server.last_received
            await client.send(ping(1))
            await client.send(big)
            await client.send(ping(2))  # sent after: arrives after, as the contract says
            assert token(await server.receive()) == 1
            got = await server.receive()
            assert isinstance(got.msg, ErrorReply) and got.msg.pickled == payload
            assert token(await server.receive()) == 2
            expected_chunks = -(-size // chunk)
            assert client.chunks_sent == server.chunks_received == expected_chunks
            assert server.last_received > before  # every message, chunks too, moves it


async def test_credits_overtake_a_large_message() -> None:
    """Traffic the other way is not starved while an 8 MiB frame is on the wire.

    The server may have one frame unread at the client. It sends one, and its next send
    waits for the client to read it. The client, meanwhile, is sending 8 MiB to the
    server. The credit the client grants must travel between the chunks of that frame,
    so the server's blocked send finishes while most of the 8 MiB is still to come (if
    the credit queued behind the big frame, ``bytes_received`` would be past it).
    """
    payload = os.urandom(8 << 20)
    big = Frame(ErrorReply("Blob", "8 MiB", pickled=payload))
    size = len(encode(big))
    with anyio.fail_after(TIMEOUT):
        async with ws_pair({"max_buffer": 1}, {"chunk_size": 64 << 10, "batch_window": 0}) as (
            client,
            server,
            _,
        ):
            await server.send(ping(1))  # the server's only credit
            await client.send(big)  # queued; the writer sends it a chunk at a time
            unblocked_at: list[int] = []

            async def send_second() -> None:
                await server.send(ping(2))  # waits for the client's credit
                unblocked_at.append(server.bytes_received)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send_second)
                assert token(await client.receive()) == 1  # grants the credit
                assert token(await client.receive()) == 2  # so this one could come
            assert unblocked_at and unblocked_at[0] < size // 2, (unblocked_at, size)
            got = await server.receive()
            assert isinstance(got.msg, ErrorReply) and got.msg.pickled == payload
            assert client.chunks_sent == 128 + 1  # 8 MiB + header in 64 KiB chunks


# ----------------------------------------------------------------------------- flow control


async def test_unread_frames_never_exceed_max_buffer() -> None:
    """The receiver holds at most the sender's max_buffer frames, whatever the OS buffers."""
    n, limit = 2000, 8
    with anyio.fail_after(TIMEOUT):
        async with ws_pair(connect_options={"max_buffer": limit}) as (client, server, _):
            most = 0

            async def produce() -> None:
                for i in range(n):
                    await client.send(ping(i))

            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                for i in range(n):
                    most = max(most, server.unread)
                    assert token(await server.receive()) == i
                    if i % 100 == 0:  # let the sender fill the buffer up
                        await anyio.wait_all_tasks_blocked()
            assert 1 < most <= limit, most


# ----------------------------------------------------------------------------- bad input


BAD_MESSAGES = [
    ("garbage bytes", b"\x00\x11\x22 this is not corral", "unknown transport message type 0x00"),
    ("garbage after the magic byte", b"\xc7\x01garbage!", "frame kind"),
    ("truncated frame", encode(ping(1))[:-3], "truncated"),
    ("unknown message type", codec_bytes({"t": "NoSuchMessage", "f": {}}), "NoSuchMessage"),
    ("wrong field type", codec_bytes({"t": "Ping", "f": {"token": "seven"}}), "Ping.token"),
    # a message's own field named "n", like the batch's frame list: malformed, not a
    # flow-control violation (which closes with 1008 "more frames than credits")
    ("field n missing", codec_bytes({"t": "ScaleRequest", "f": {}}), "ScaleRequest.n: required"),
    (
        "field n of a wrong type",
        codec_bytes({"t": "ScaleRequest", "f": {"n": "x"}}),
        "ScaleRequest.n",
    ),
    ("empty binary message", b"", "empty message"),
    ("credit grant out of thin air", struct.pack(">BI", 1, 5), "credit grant of 5"),
    ("chunk without data", struct.pack(">BQ", 2, 100), "chunk message without data"),
    # a non-final chunk under the least chunk_size: kept, each would cost some hundred
    # bytes besides its one (a review of the receive path: 69 MiB held for 4 MiB sent)
    ("tiny chunk", struct.pack(">BQ", 2, 100_000) + b"\xc7", "chunks are at least 1024 bytes"),
]


@pytest.mark.parametrize(
    ("what", "data", "expected"), BAD_MESSAGES, ids=[c[0] for c in BAD_MESSAGES]
)
async def test_bad_message_gets_error_reply_and_connection_stays(
    what: str, data: bytes, expected: str
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0/c") as listener,
            raw_pair(listener) as (ws, server),
        ):
            assert isinstance(server, WebSocketConnection)
            await ws.send_bytes(data)
            reply = await error_reply(ws)
            assert expected in reply.text, reply.text
            assert "1 of at most 10" in reply.text
            assert server.bad_frames == 1
            assert not server.closed
            # the connection still works both ways
            await ws.send_bytes(encode(ping(7)))
            assert token(await server.receive()) == 7
            await server.send(ping(8))
            assert [token(f) for f in await data_frames(ws)] == [8]
            assert server.bad_frames == 1


async def test_text_message_gets_error_reply() -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0/c") as listener,
            raw_pair(listener) as (ws, server),
        ):
            assert isinstance(server, WebSocketConnection)
            await ws.send_str('{"t": "Ping", "f": {"token": 1}}')
            reply = await error_reply(ws)
            assert "text message" in reply.text
            assert server.bad_frames == 1
            await ws.send_bytes(encode(ping(2)))
            assert token(await server.receive()) == 2


async def test_too_many_bad_messages_close_with_1008_and_listener_goes_on() -> None:
    bad = [b"\x00junk", encode(ping(1))[:5], codec_bytes({"t": "Ping", "f": {"token": []}})]
    with anyio.fail_after(TIMEOUT):
        async with await transport.listen("ws://127.0.0.1:0/c", max_bad_frames=3) as listener:
            async with raw_pair(listener) as (ws, server):
                assert isinstance(server, WebSocketConnection)
                await ws.send_bytes(encode(ping(1)))  # a good frame first
                for i, data in enumerate(bad, 1):
                    await ws.send_bytes(data)
                    reply = await error_reply(ws)
                    assert f"{i} of at most 3" in reply.text
                msg = await ws.receive()
                assert msg.type is WSMsgType.CLOSE
                assert msg.data == 1008
                assert "policy violation" in (msg.extra or "")
                assert server.bad_frames == 3
                assert server.closed
                assert token(await server.receive()) == 1  # what came before is kept
                with pytest.raises(ConnectionClosed) as info:
                    await server.receive()
                assert "3 malformed messages" in info.value.reason
                assert "1008" in info.value.reason
                with pytest.raises(ConnectionClosed):
                    await server.send(ping(2))
            # the listener serves other connections as before
            async with (
                await transport.connect(listener.address) as client,
                await listener.accept() as other,
            ):
                await client.send(ping(5))
                assert token(await other.receive()) == 5


async def test_oversized_message_is_refused_with_1009() -> None:
    """A message over the limit closes the connection with 1009 and a close reason that
    names the limit, and the listening side logs it (peer, role, limit)."""
    limit = 4096
    with anyio.fail_after(TIMEOUT), log_lines("corral.transport.ws") as logged:
        async with await transport.listen(
            "ws://127.0.0.1:0/c", max_message_bytes=limit
        ) as listener:
            # a whole message over the limit: aiohttp refuses it
            async with raw_pair(listener) as (ws, server):
                await ws.send_bytes(encode(Frame(ErrorReply("Blob", "x", b"x" * 2 * limit))))
                msg = await ws.receive()
                assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1009)
                assert msg.extra == "message too big: over max_message_bytes=4096"
                with pytest.raises(ConnectionClosed) as info:
                    await server.receive()
                assert "max_message_bytes=4096" in info.value.reason
            peer = server.peer_address
            assert logged.has("a message over its size limit", peer, "max_message_bytes=4096")
            # chunks announcing more than the limit
            async with raw_pair(listener) as (ws, server):
                await ws.send_bytes(struct.pack(">BQ", 2, 10 * limit) + b"\xc7" * 100)
                msg = await ws.receive()
                assert (msg.type, msg.data) == (WSMsgType.CLOSE, 1009)
                assert msg.extra == "message too big: over max_message_bytes=4096"
                with pytest.raises(ConnectionClosed) as info:
                    await server.receive()
                assert "announced" in info.value.reason
            peer = server.peer_address
            assert logged.has("a message over its size limit", peer, str(10 * limit))
            # a Corral client learns why the peer closed
            async with (
                await transport.connect(listener.address) as client,
                await listener.accept(),
            ):
                await client.send(Frame(ErrorReply("Blob", "x", b"x" * 2 * limit)))
                with pytest.raises(ConnectionClosed) as info:
                    await client.receive()
                assert "1009" in info.value.reason


async def test_an_oversized_message_names_the_limit_of_its_role() -> None:
    """Over a listener with tokens, one websocket message over the limit of the
    connection's role (a read token: one chunk's worth; admin: max_message_bytes) is
    closed with 1009, a reason naming that limit, and a warning naming the role."""
    # small limits, so that the whole message is sent before the listener closes
    limit, small = 8192, 1024
    cases = [("secret-r", "read", 4 * small, f"this connection's limit of {small} bytes "
              f"(max_message_bytes={limit})"),
             ("secret-a", "admin", 2 * limit, f"max_message_bytes={limit}")]  # fmt: skip
    with anyio.fail_after(TIMEOUT), log_lines("corral.transport.ws") as logged:
        async with await transport.listen(
            "ws://127.0.0.1:0/c", tokens=TOKENS, max_message_bytes=limit,
            chunk_size=small, initial_max_message_bytes=small,
        ) as listener:  # fmt: skip
            for secret, role, size, what in cases:
                headers = {"Authorization": f"Bearer {secret}"}
                async with raw_pair(listener, headers) as (ws, server):
                    await ws.send_bytes(b"\xc7" * size)
                    msg = await ws.receive()
                    assert (msg.type, msg.data, msg.extra) == (
                        WSMsgType.CLOSE, 1009, f"message too big: over {what}"
                    )  # fmt: skip
                    with pytest.raises(ConnectionClosed) as info:
                        await server.receive()
                    assert what in info.value.reason
                line = logged.with_("a message over its size limit", server.peer_address)
                assert line is not None and f"role='{role}'" in line and what in line, line


async def test_sender_refuses_a_frame_over_its_own_max_message_bytes() -> None:
    with anyio.fail_after(TIMEOUT):
        async with ws_pair(connect_options={"max_message_bytes": 4096}) as (client, server, _):
            with pytest.raises(ProtocolError, match="over the limit"):
                await client.send(Frame(ErrorReply("Blob", "x", b"x" * 8192)))
            with pytest.raises(ProtocolError):
                await client.send(Frame(object()))  # type: ignore[arg-type]
            await client.send(ping(1))  # still open, nothing was queued
            assert token(await server.receive()) == 1


async def test_client_end_rejects_bad_input_too() -> None:
    """A raw server sends garbage to a Corral client: the client answers and carries on;
    an error message reaches the client's receive() and costs no credit."""
    from_client: list[tuple[int, bytes]] = []
    done = anyio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,))
        await ws.prepare(request)
        await ws.send_bytes(b"\x42 nonsense")
        async for msg in ws:
            if msg.type is WSMsgType.BINARY:
                from_client.append((msg.data[0], msg.data[1:]))
                if msg.data[0] == 0x03:  # the client's error reply: now send good frames
                    await ws.send_bytes(encode(ping(5)))
                    await ws.send_bytes(b"\x03" + encode(Frame(ErrorReply("Oops", "from server"))))
                elif msg.data[0] in (0x01, 0x04):  # a credit for the one frame
                    done.set()
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        with anyio.fail_after(TIMEOUT):
            async with await transport.connect(f"ws://127.0.0.1:{port}") as client:
                assert isinstance(client, WebSocketConnection)
                assert token(await client.receive()) == 5
                oops = await client.receive()
                assert isinstance(oops.msg, ErrorReply) and oops.msg.kind == "Oops"
                assert client.bad_frames == 1
                await done.wait()
        kinds = [k for k, _ in from_client]
        assert kinds[0] == 0x03
        [reply] = decode_batch(from_client[0][1])
        assert isinstance(reply.msg, ErrorReply) and "0x42" in reply.msg.text
        credits = [struct.unpack(">I", d[:4])[0] for k, d in from_client if k in (0x01, 0x04)]
        assert credits == [1]  # for ping(5) only, not for the error message
    finally:
        await runner.cleanup()


# ----------------------------------------------------------------------------- closing


async def test_listener_close_closes_unaccepted_connections() -> None:
    with anyio.fail_after(TIMEOUT):
        listener = await transport.listen("ws://127.0.0.1:0")
        async with await transport.connect(listener.address) as client:
            await listener.aclose()
            with pytest.raises(ConnectionClosed) as info:
                await client.receive()
            assert "1001" in info.value.reason
            with pytest.raises(ConnectionClosed):
                await client.send(ping(1))


async def test_peer_close_reason_and_close_reason_property() -> None:
    with anyio.fail_after(TIMEOUT):
        async with ws_pair() as (client, server, _):
            assert client.close_reason is None
            await server.aclose()
            with pytest.raises(ConnectionClosed) as info:
                await client.receive()
            assert "closed by the peer" in info.value.reason
            assert client.close_reason == info.value.reason
            assert server.close_reason == "closed by this side"


@pytest.mark.parametrize("closer", ["client", "server"])
async def test_close_delivers_all_sent_while_the_peer_is_still_sending(closer: str) -> None:
    """One side sends frames (large ones too) and closes at once, while the other is
    still sending to it: the close handshake keeps the TCP connection from being reset
    under the frames in flight, so every one of them is received before ConnectionClosed.
    """
    blob = os.urandom(300_000)
    with anyio.fail_after(TIMEOUT):
        async with ws_pair({"chunk_size": 64 << 10}, {"chunk_size": 64 << 10}) as (
            client,
            server,
            _,
        ):
            ends = {"client": client, "server": server}
            sender = ends[closer]
            receiver = ends["server" if closer == "client" else "client"]
            stop = anyio.Event()

            async def chatter() -> None:  # the receiver talks back until it learns of the close
                i = 0
                with contextlib.suppress(ConnectionClosed):
                    while not stop.is_set():
                        await receiver.send(ping(i))
                        i += 1

            got: list[Frame] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(chatter)
                for i in range(300):
                    await sender.send(ping(i))
                    if i % 50 == 0:
                        await sender.send(Frame(ErrorReply("Blob", str(i), pickled=blob)))
                await sender.aclose()
                with pytest.raises(ConnectionClosed) as info:
                    while True:
                        got.append(await receiver.receive())
                stop.set()
            assert "closed by the peer" in info.value.reason
            assert [token(f) for f in got if isinstance(f.msg, Ping)] == list(range(300))
            blobs = [f.msg for f in got if isinstance(f.msg, ErrorReply)]
            assert len(blobs) == 6 and all(b.pickled == blob for b in blobs)


async def test_heartbeat_detects_a_silent_peer() -> None:
    """A peer that never answers pings is dropped after heartbeat * 1.5 seconds."""
    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0", heartbeat=0.1) as listener,
            aiohttp.ClientSession() as session,
            session.ws_connect(listener.address, protocols=(SUBPROTOCOL,), autoping=False),
            await listener.accept() as server,
        ):
            with pytest.raises(ConnectionClosed) as info:
                await server.receive()  # nobody reads the pings on the raw side
            assert "heartbeat" in info.value.reason


async def test_heartbeat_pings_a_quiet_connection_and_pongs_keep_it() -> None:
    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0", heartbeat=0.2) as listener,
            aiohttp.ClientSession() as session,
            session.ws_connect(listener.address, protocols=(SUBPROTOCOL,), autoping=False) as ws,
            await listener.accept() as server,
        ):
            for _ in range(3):  # no traffic: the listening side pings, the raw side answers
                msg = await ws.receive()
                assert msg.type is WSMsgType.PING
                await ws.pong(msg.data)
            assert not server.closed
            await ws.send_bytes(encode(ping(1)))
            assert token(await server.receive()) == 1
            await ws.close()


# ----------------------------------------------------------------------------- TLS


@contextlib.contextmanager
def failed_tls_handshakes_expected() -> Iterator[None]:
    """In asyncio debug mode the loop reports every failed server-side TLS handshake to
    its exception handler (which the anyio test runner turns into a failure); here they
    are the point of the test."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), ssl.SSLError | ConnectionResetError):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        yield
    finally:
        loop.set_exception_handler(previous)


async def test_wss_needs_a_trusted_certificate() -> None:
    server_ctx, client_ctx, _ = tls_contexts()
    with anyio.fail_after(TIMEOUT), failed_tls_handshakes_expected():
        async with await transport.listen("wss://127.0.0.1:0", ssl_context=server_ctx) as listener:
            assert listener.address.startswith("wss://127.0.0.1:")
            with pytest.raises(ConnectFailed) as info:
                await transport.connect(listener.address)  # system CAs only
            assert "TLS" in info.value.reason
            plain = listener.address.replace("wss://", "ws://")
            with pytest.raises(ConnectFailed):
                await transport.connect(plain)  # no TLS against a TLS port
            async with (
                await transport.connect(listener.address, ssl_context=client_ctx) as client,
                await listener.accept() as server,
            ):
                await client.send(ping(1))
                assert token(await server.receive()) == 1


@pytest.mark.parametrize(
    ("served", "trusted", "advice"),
    [
        pytest.param(
            server_context(("127.0.0.1",)), trusting(("localhost",)),
            "give the CA certificate that signed it (for a self-signed certificate, the "
            "certificate itself) in CORRAL_TLS_CA=FILE (a manager, worker or console: "
            "--tls-ca FILE",
            id="wrong CA",
        ),
        pytest.param(
            server_context(("127.0.0.1",)), None,
            "without it only the system's CAs are trusted", id="no CA",
        ),
        pytest.param(
            server_context(("127.0.0.1",), expired=True), trusting(("127.0.0.1",), expired=True),
            "its certificate is outside its validity dates", id="expired",
        ),
        pytest.param(
            server_context(("127.0.0.2",)), trusting(("127.0.0.2",)),
            "its certificate does not name '127.0.0.1', the host dialled: its subjectAltName "
            "(SAN) must carry it", id="not naming the host",
        ),
    ],
)  # fmt: skip
async def test_a_refused_certificate_says_what_to_do(
    served: ssl.SSLContext,
    trusted: ssl.SSLContext | None,
    advice: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listener is there and answers TLS, but the client refuses its certificate: the
    error says what to do about it (the CA, the dates, the names), not to check that a
    listener runs."""
    monkeypatch.delenv("CORRAL_TLS_CA", raising=False)
    options = {} if trusted is None else {"ssl_context": trusted}
    with anyio.fail_after(TIMEOUT), failed_tls_handshakes_expected():
        async with await transport.listen("wss://127.0.0.1:0", ssl_context=served) as listener:
            with pytest.raises(ConnectFailed) as info:
                await transport.connect(listener.address, **options)
    text = str(info.value)
    assert "this side did not accept the server's certificate" in info.value.reason
    assert advice in text
    assert "The listener is there" in text and "docs/security.md#tls" in text
    assert CHECK_LISTENER not in text


def test_a_certificate_is_checked_as_a_connection_would_without_a_socket() -> None:
    """``tls.refused_certificate``: what a worker checks its own certificate with as it
    starts (dialled at its --host, verified with its CAs), by an in-memory handshake."""
    ok = server_context(("127.0.0.1", "localhost"))
    assert refused_certificate(ok, trusting(("127.0.0.1", "localhost")), "127.0.0.1") is None
    assert refused_certificate(ok, trusting(("127.0.0.1", "localhost")), "localhost") is None
    cases = [
        (ok, trusting(("127.0.0.1", "localhost")), "127.0.0.2", "its certificate does not name"),
        (ok, trusting(("localhost",)), "127.0.0.1", "in CORRAL_TLS_CA=FILE"),
        (server_context(("127.0.0.1",), expired=True), trusting(("127.0.0.1",), expired=True),
         "127.0.0.1", "outside its validity dates"),
    ]  # fmt: skip
    for served, client, host, advice in cases:
        refused = refused_certificate(served, client, host)
        assert refused is not None, host
        assert advice in certificate_hint(refused.verify_code, host)


def test_a_listeners_own_certificate_is_checked_for_its_dates_and_its_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tls.own_certificate_verifier``: what a manager checks its own certificate with
    as it listens. Its dates always; its chain against CORRAL_TLS_CA when set, else the
    certificate is its own anchor; no name (its clients may dial it by any it carries),
    so a certificate for other names passes (multi audit, finding 2)."""
    from transport.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, own_certificate_verifier

    def files(name: str, names: tuple[str, ...], *, expired: bool = False) -> Path:
        cert_pem, key_pem = self_signed_pem(names, expired=expired)
        (tmp_path / f"{name}.pem").write_bytes(cert_pem + key_pem)
        return tmp_path / f"{name}.pem"

    monkeypatch.delenv(TLS_KEY_ENV, raising=False)
    monkeypatch.delenv(TLS_CA_ENV, raising=False)
    monkeypatch.delenv(TLS_CERT_ENV, raising=False)
    assert own_certificate_verifier() is None  # nothing served from a file
    other = files("other", ("127.0.0.2",))  # (self_signed_pem is cached by names)
    verdicts = {}
    for name, names, expired, ca in [
        ("ok", ("127.0.0.1",), False, None),
        ("elsewhere", ("manager.example.org",), False, None),
        ("expired", ("127.0.0.1",), True, None),
        ("other-ca", ("127.0.0.1",), False, other),
    ]:
        cert = files(name, names, expired=expired)
        monkeypatch.setenv(TLS_CERT_ENV, str(cert))
        if ca is not None:
            monkeypatch.setenv(TLS_CA_ENV, str(ca))
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served.load_cert_chain(cert)
        verifier = own_certificate_verifier()
        assert verifier is not None
        refused = refused_certificate(served, verifier, None)
        verdicts[name] = None if refused is None else refused.verify_message
    assert verdicts == {
        "ok": None,
        "elsewhere": None,
        "expired": "certificate has expired",
        "other-ca": "self-signed certificate",
    }


def test_a_listeners_own_certificate_is_checked_as_a_client_of_its_tls_ca_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a CA file (--tls-ca), a manager verifies its certificate's chain as its
    workers and consoles given that file do: a leaf whose CA file holds only the
    intermediate that signed it, not the root, is refused by them (Python before 3.13:
    ``unable to get issuer certificate``), and the manager said nothing, since its own
    check took a partial chain (for a certificate that is its own anchor, with no CA
    file). Both give the same verdict; the root in the CA file passes both."""
    from transport.tls import (
        TLS_CA_ENV,
        TLS_CERT_ENV,
        TLS_KEY_ENV,
        client_context,
        own_certificate_verifier,
    )

    root = self_signed_pem(("corral-root.example",))
    inter = ca_signed_pem(("corral-intermediate.example",), root)
    leaf = ca_signed_pem(("127.0.0.1",), inter)
    (tmp_path / "leaf.pem").write_bytes(leaf[0] + inter[0] + leaf[1])  # (its chain)
    (tmp_path / "intermediate.pem").write_bytes(inter[0])
    (tmp_path / "root.pem").write_bytes(root[0])
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(tmp_path / "leaf.pem")
    monkeypatch.delenv(TLS_KEY_ENV, raising=False)
    monkeypatch.setenv(TLS_CERT_ENV, str(tmp_path / "leaf.pem"))
    verdicts = {}
    for ca in ("intermediate.pem", "root.pem"):
        monkeypatch.setenv(TLS_CA_ENV, str(tmp_path / ca))
        verifier, client = own_certificate_verifier(), client_context()
        assert verifier is not None and client is not None
        own = refused_certificate(served, verifier, None)
        theirs = refused_certificate(served, client, "127.0.0.1")
        verdicts[ca] = tuple(None if r is None else r.verify_message for r in (own, theirs))
    assert verdicts["intermediate.pem"][0] == verdicts["intermediate.pem"][1], verdicts
    assert verdicts["root.pem"] == (None, None), verdicts


def test_a_manager_serving_an_ssl_context_from_code_is_not_checked_against_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager listening with an ``ssl_context`` from code (``run_manager(
    listen_options={"ssl_context": ...})``) serves that context's certificate, whose
    files it does not know: it checks nothing. With ``CORRAL_TLS_CERT`` also set in its
    environment (another certificate), it verified the certificate it served against
    that one and warned falsely that every client would refuse it (``self-signed
    certificate``). Its own certificate from the environment, expired, still warns."""
    from runtime.node import _check_served_certificate
    from transport.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

    def pem_file(name: str, names: tuple[str, ...], *, expired: bool = False) -> Path:
        cert_pem, key_pem = self_signed_pem(names, expired=expired)
        (tmp_path / name).write_bytes(cert_pem + key_pem)
        return tmp_path / name

    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(pem_file("served.pem", ("127.0.0.1",)))
    monkeypatch.delenv(TLS_KEY_ENV, raising=False)
    monkeypatch.delenv(TLS_CA_ENV, raising=False)
    said = "would refuse this manager's certificate"
    with log_lines("corral.node", logging.WARNING) as logged:
        monkeypatch.setenv(TLS_CERT_ENV, str(pem_file("env.pem", ("127.0.0.3",))))
        _check_served_certificate(None, {"ssl_context": served})
        from_code = list(logged.lines)
        monkeypatch.setenv(TLS_CERT_ENV, str(pem_file("old.pem", ("127.0.0.1",), expired=True)))
        _check_served_certificate(None, {})
    assert not from_code, from_code
    assert logged.has(said, "certificate has expired"), logged.lines


# ----------------------------------------------------------------------------- options


async def test_options_are_validated() -> None:
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(TypeError, match="unknown ws listen option"):
            await transport.listen("ws://127.0.0.1:0", max_bufer=3)
        with pytest.raises(ValueError, match="max_buffer"):
            await transport.listen("ws://127.0.0.1:0", max_buffer=0)
        with pytest.raises(ValueError, match="batch_window"):
            await transport.listen("ws://127.0.0.1:0", batch_window=-1)
        with pytest.raises(ValueError, match="chunk_size"):
            await transport.listen("ws://127.0.0.1:0", chunk_size=10)
        with pytest.raises(ValueError, match="tokens"):
            await transport.listen("ws://127.0.0.1:0", tokens=["secret"])
        with pytest.raises(ValueError, match="visible ASCII"):
            await transport.listen("ws://127.0.0.1:0", tokens={"has space": "admin"})
        with pytest.raises(ValueError, match="wss://"):
            await transport.listen("ws://127.0.0.1:0", ssl_context=tls_contexts()[0])
        with pytest.raises(ValueError, match="ssl_context"):
            await transport.listen("wss://127.0.0.1:0")
        with pytest.raises(ValueError, match="heartbeat"):
            await transport.listen("ws://127.0.0.1:0", heartbeat=0)
        async with await transport.listen("ws://127.0.0.1:0", heartbeat=None) as listener:
            with pytest.raises(TypeError, match="unknown ws connect option"):
                await transport.connect(listener.address, tokens=TOKENS)
            with pytest.raises(ValueError, match="token"):
                await transport.connect(listener.address, token="")


@pytest.mark.parametrize(
    "address",
    [
        "ws://127.0.0.1",
        "ws://:80",
        "ws://127.0.0.1:99999",
        "ws://127.0.0.1:x",
        "ws://127.0.0.1:80/a?b=c",
        "ws://127.0.0.1:80/a#b",
        "ws://user@127.0.0.1:80",
        "ws://[::1/x",
        "ws://[nothost]:80",
    ],
)
async def test_malformed_addresses(address: str) -> None:
    with pytest.raises(InvalidAddress):
        await transport.listen(address)
    with pytest.raises(InvalidAddress):
        await transport.connect(address)


async def test_connect_needs_a_real_port() -> None:
    with pytest.raises(InvalidAddress, match="real port"):
        await transport.connect("ws://127.0.0.1:0")


async def test_wrong_path_and_non_corral_servers_fail_to_connect() -> None:
    async def plain_ws(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()  # speaks no Corral subprotocol
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    with anyio.fail_after(TIMEOUT):
        async with await transport.listen("ws://127.0.0.1:0/corral") as listener:
            with pytest.raises(ConnectFailed, match="404"):
                await transport.connect(listener.address.replace("/corral", "/other"))
        app = web.Application()
        app.router.add_get("/", plain_ws)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = runner.addresses[0][1]
            with pytest.raises(ConnectFailed, match="not a Corral listener"):
                await transport.connect(f"ws://127.0.0.1:{port}/")
        finally:
            await runner.cleanup()


async def test_localhost_and_ipv6_addresses() -> None:
    with anyio.fail_after(TIMEOUT):
        async with ws_pair(address="ws://localhost:0/x") as (client, server, listener):
            assert listener.address.startswith("ws://localhost:")
            await client.send(ping(1))
            assert token(await server.receive()) == 1
        try:
            ipv6 = await transport.listen("ws://[::1]:0")
        except (InvalidAddress, OSError):
            pytest.skip("no IPv6 loopback here")
        async with ipv6, await transport.connect(ipv6.address) as client:
            assert ipv6.address.startswith("ws://[::1]:")
            async with await ipv6.accept() as server:
                await client.send(ping(2))
                assert token(await server.receive()) == 2


async def test_generic_interface_types() -> None:
    """What transport.listen/connect return for ws:// is the generic interface."""
    with anyio.fail_after(TIMEOUT):
        async with ws_pair() as (client, server, listener):
            assert isinstance(listener, Listener)
            assert isinstance(client, Connection) and isinstance(server, Connection)
            assert "ws" in transport.registered_schemes()
            assert "wss" in transport.registered_schemes()


async def test_a_reply_that_cannot_be_read_fails_its_ask_at_once() -> None:
    """A reply the codec refuses (here: a field this side does not know, as between two
    versions) reaches the reader as a ProtocolError reply to the same ask, so the asker
    hears of it now instead of waiting out its timeout; other data is not invented."""
    from runtime.remote import _error_from

    with anyio.fail_after(TIMEOUT):
        async with (
            await transport.listen("ws://127.0.0.1:0/c") as listener,
            raw_pair(listener) as (ws, server),
        ):
            assert isinstance(server, WebSocketConnection)
            await ws.send_bytes(codec_bytes({"t": "Ping", "f": {"bogus": 1}, "r": 5}))
            frame = await server.receive()
            assert frame.reply_to == 5 and isinstance(frame.msg, ErrorReply)
            error = _error_from(frame.msg, allow_pickle=False)
            assert isinstance(error, ProtocolError)
            assert "the reply could not be read" in str(error) and "bogus" in str(error)
            # A malformed message that answers no ask gives the reader nothing.
            await ws.send_bytes(codec_bytes({"t": "Ping", "f": {"bogus": 1}}))
            await ws.send_bytes(encode(ping(9)))
            assert token(await server.receive()) == 9
            assert server.bad_frames == 2


# ----------------------------------------------------------------------------- connect errors


async def test_an_unknown_host_is_said_to_be_unresolved_not_refused() -> None:
    with anyio.fail_after(TIMEOUT), pytest.raises(ConnectFailed) as info:
        await transport.connect("ws://no-such-corral-host.invalid:8786")
    text = str(info.value)
    assert "the host name 'no-such-corral-host.invalid' could not be resolved (" in text, text
    assert "Check the host's name (and this machine's DNS), or give its IP address." in text
    assert "nothing accepted" not in text and "connect timeout" not in text, text


async def test_every_invalid_address_names_the_same_known_schemes() -> None:
    """One list, the registered schemes, whichever backend (or none) refused the
    address, listening or connecting, and the manager's --listen check too."""
    from runtime.node import _check_listen_address

    known = "known schemes: " + ", ".join(f"{s}://" for s in transport.registered_schemes())
    assert "inproc://" in known and "wss://" in known
    listens = ["http://127.0.0.1:1", "ws://127.0.0.1", "ws://[::1:1", "inproc://bad name"]
    connects = ["no-scheme", "ws://127.0.0.1:0", "inproc://", "wss://user@127.0.0.1:1"]
    texts: list[str] = []
    with anyio.fail_after(TIMEOUT):
        for address in listens:
            with pytest.raises(InvalidAddress) as info:
                await transport.listen(address)
            texts.append(str(info.value))
            if not address.startswith("inproc"):  # (it checks websocket addresses only)
                with pytest.raises(InvalidAddress) as info:
                    _check_listen_address(address)
                texts.append(str(info.value))
        for address in connects:
            with pytest.raises(InvalidAddress) as info:
                await transport.connect(address)
            texts.append(str(info.value))
    for text in texts:
        assert text.endswith(f"; {known}."), text


async def test_tls_against_a_plain_listener_and_back_says_which_scheme_to_use() -> None:
    """A wss:// client of a plain ws:// listener: the listener answers its TLS hello in
    plain text (HTTP 400), which OpenSSL reports as a wrong version number; a ws://
    client of a wss:// listener: the listener closes without an answer."""
    server_ctx, client_ctx, _ = tls_contexts()
    with anyio.fail_after(TIMEOUT), failed_tls_handshakes_expected():
        async with await transport.listen("ws://127.0.0.1:0") as plain:
            tls_uri = plain.address.replace("ws://", "wss://")
            with pytest.raises(ConnectFailed) as info:
                await transport.connect(tls_uri, ssl_context=client_ctx)
        text = str(info.value)
        assert "the server answered in plain text, not TLS ([SSL: WRONG_VERSION_NUMBER])" in text
        assert f"connect with {plain.address};" in text, text
        async with await transport.listen("wss://127.0.0.1:0", ssl_context=server_ctx) as tls:
            plain_uri = tls.address.replace("wss://", "ws://")
            with pytest.raises(ConnectFailed) as info:
                await transport.connect(plain_uri)
        text = str(info.value)
        assert "closed the connection without answering the websocket handshake" in text
        assert (
            f"A wss:// (TLS) listener does that to a plain ws:// request: if it is one, "
            f"connect with {tls.address}" in text
        ), text


async def test_a_connection_cut_off_in_its_handshake_says_the_listener_closed_it() -> None:
    """A listener that takes the TCP connection and then resets it (as a manager shedding
    half-open connections does to the oldest) or closes it before answering the upgrade:
    the error says the listener closed it during the handshake and that retrying may
    help, not to check that a listener runs (security audit, finding 4). A port where
    nothing listens still says so."""
    import socket

    async def cut_off(reset: bool, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()  # part of the upgrade request
            if reset:  # SO_LINGER 0: close() sends RST
                sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    port = free_port_between(46000, 46999)
    uri = f"ws://127.0.0.1:{port}/"
    texts = {}
    with anyio.fail_after(5):
        for reset in (True, False):
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
            async with listener, anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, functools.partial(cut_off, reset))
                with pytest.raises(ConnectFailed) as info:
                    await transport.connect(uri, timeout=3)
                texts[reset] = str(info.value)
                tg.cancel_scope.cancel()
        with pytest.raises(ConnectFailed) as info:  # nothing listens now
            await transport.connect(uri, timeout=3)
    assert texts[True] == (
        f"could not connect to {uri}: the listener closed the connection during the websocket "
        f"handshake (Connection reset by peer). {CUT_OFF_HINT}"
    )
    assert "overloaded, e.g. by many half-open connections" in CUT_OFF_HINT
    assert "Retrying may help." in CUT_OFF_HINT
    assert texts[False].startswith(
        f"could not connect to {uri}: the server closed the connection without answering the "
        "websocket handshake. A wss:// (TLS) listener does that"
    ) and texts[False].endswith(CUT_OFF_HINT), texts[False]  # fmt: skip
    for text in texts.values():
        assert CHECK_LISTENER not in text, text
    assert str(info.value) == (
        f"could not connect to {uri}: nothing accepted the connection (Connection refused). "
        f"{CHECK_LISTENER}"
    )


async def _wss_connect_refused_by(
    handler: Callable[[anyio.abc.SocketStream], Awaitable[None]], connect_timeout: float
) -> tuple[str, str]:
    """The address and the ``ConnectFailed`` text of a wss:// connect to a TCP listener
    whose connections ``handler`` serves (no TLS, no HTTP), given ``connect_timeout``."""
    _, client_ctx, _ = tls_contexts()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    uri = f"wss://127.0.0.1:{port}/"
    with anyio.fail_after(TIMEOUT):
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handler)
            with pytest.raises(ConnectFailed) as info:
                await transport.connect(uri, timeout=connect_timeout, ssl_context=client_ctx)
            tg.cancel_scope.cancel()
    return uri, str(info.value)


async def test_a_wss_connection_closed_before_tls_says_so_and_names_a_tunnel() -> None:
    """A wss:// connect to a port that takes the TCP connection and closes it before
    the TLS handshake, as an SSH tunnel (ssh -L) does whose far end is refused (the
    manager down): the error says the listener closed it during the TLS handshake and
    names the tunnel, not "nothing accepted the connection (Cannot connect to host ...
    ssl:<ssl.SSLContext object at 0x...> [None])" (multi audit, finding 1)."""

    async def close_at_once(stream: anyio.abc.SocketStream) -> None:
        await stream.aclose()

    uri, text = await _wss_connect_refused_by(close_at_once, 5)
    assert text == (
        f"could not connect to {uri}: the listener closed the connection during the TLS "
        f"handshake. {CUT_OFF_HINT}"
    )
    assert "an SSH tunnel (ssh -L) or a proxy does it when its far side cannot reach" in (
        CUT_OFF_HINT
    )
    assert "SSLContext object" not in text


async def test_a_wss_listener_that_never_answers_tls_says_so_not_that_it_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wss:// connect to a port that takes the TCP connection and never answers the
    TLS hello (a manager stopped with SIGSTOP: its kernel accepts, its process does not
    read), with a connect timeout longer than asyncio's own limit on a TLS handshake
    (60 s; a worker waiting for a stalled manager tries for 300 s): asyncio aborts it,
    and the error said "the listener closed the connection during the TLS handshake"
    with the SSH tunnel's hint. It says that the listener did not answer within that
    limit. Scaled down: a limit of 1 s."""
    import asyncio.constants

    monkeypatch.setattr(asyncio.constants, "SSL_HANDSHAKE_TIMEOUT", 1.0)
    held: list[anyio.abc.SocketStream] = []

    async def never_answer(stream: anyio.abc.SocketStream) -> None:
        held.append(stream)
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    uri, text = await _wss_connect_refused_by(never_answer, TIMEOUT)
    assert held  # it took the TCP connection
    assert text.startswith(
        f"could not connect to {uri}: the listener took the TCP connection but did not "
        f"answer the TLS handshake within 1 s (asyncio's limit on a TLS handshake). "
    ), text
    assert "a manager whose process is stopped (SIGSTOP, a suspended job)" in text
    assert "A longer connect timeout does not lengthen a TLS handshake" in text
    assert "closed" not in text and "SSH tunnel" not in text, text


async def test_a_connect_timeout_says_how_to_give_it_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port that takes the TCP connection but never answers the upgrade: the timeout
    is CORRAL_CONNECT_TIMEOUT's, and the error names it."""
    import socket

    monkeypatch.setenv("CORRAL_CONNECT_TIMEOUT", "0.3")
    with socket.socket() as mute, anyio.fail_after(5):  # the default (10 s) would not do
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)  # never accepted: the kernel completes the TCP handshake only
        uri = f"ws://127.0.0.1:{mute.getsockname()[1]}"
        with pytest.raises(ConnectFailed) as info:
            await transport.connect(uri)
    text = str(info.value)
    assert "no websocket connection within 0.3 s" in text, text
    assert (
        "CORRAL_CONNECT_TIMEOUT=SECONDS in the environment of the worker, console or "
        "client (default 10), or transport.connect(..., timeout=SECONDS)." in text
    ), text
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        port = refusing.getsockname()[1]  # bound, not listening: refused
        with anyio.fail_after(5), pytest.raises(ConnectFailed) as info:
            await transport.connect(f"ws://127.0.0.1:{port}")
    assert "nothing accepted the connection (Connection refused)" in str(info.value)
    assert "CORRAL_CONNECT_TIMEOUT" not in str(info.value)  # no timeout: no such advice
    monkeypatch.setenv("CORRAL_CONNECT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CORRAL_CONNECT_TIMEOUT='soon' is not a number"):
        await transport.connect(uri)


async def test_a_wss_worker_without_a_certificate_says_the_manager_may_not_be_tls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime.node import run_worker

    monkeypatch.delenv("CORRAL_TLS_CERT", raising=False)
    with anyio.fail_after(TIMEOUT), pytest.raises(ValueError) as info:
        await run_worker("wss://127.0.0.1:8786", token="0" * 64)
    text = str(info.value)
    assert "this worker joins wss://127.0.0.1:8786 over TLS, so it serves its peers" in text
    assert (
        "If that manager is not TLS (it printed `manager listening on ws://...`), join "
        "it with ws://127.0.0.1:8786" in text
    ), text


async def test_a_handshake_its_client_abandoned_is_one_log_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client sends its handshake and closes before the listener answers (as workers
    whose connects timed out while the manager was paused did): the listener logs one
    line, and aiohttp no traceback ('Error handling request ... Cannot write to closing
    transport'). The request and the close reach the listener together: they are made
    with blocking calls while its event loop (this one) cannot run."""
    import socket
    from urllib.parse import urlsplit

    from transport.ws import WINDOW_HEADER

    with anyio.fail_after(TIMEOUT), log_lines("corral.transport") as logs:
        async with await transport.listen("ws://127.0.0.1:0/c", tokens=TOKENS) as listener:
            url = urlsplit(listener.address)
            request = (
                f"GET /c HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n"
                f"Authorization: Bearer secret-a\r\n{WINDOW_HEADER}: 64\r\n\r\n"
            ).encode()
            with socket.create_connection((url.hostname, url.port)) as sock:
                sock.sendall(request)
                sock.shutdown(socket.SHUT_WR)  # blocking, all of it: the loop is held
                await wait_until(lambda: logs.has("websocket handshake abandoned"), "its line")
    assert not [r for r in caplog.records if "Error handling request" in r.getMessage()]
