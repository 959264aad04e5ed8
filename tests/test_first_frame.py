"""What a connection sends first, or does not (security audit, finding 8): a connection
that sends no Hello within the gateway's deadline is closed, told why, and counted and
logged through the listener's refusal log (before: held for the reconnect timeout, then
closed with code 1000 and nothing logged); a first message over a provisional
connection's limit is closed at once with 1009 and logged like one over aiohttp's limit
(before: a chunked one waited, unread, until the Hello deadline cut it off unlogged).

Real listeners on 127.0.0.1 (ports 46000-46999), raw aiohttp websockets with the read
token; every wait is on the peer's close."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import anyio
import pytest

import transport
from runtime.kernel import ActorSystem
from runtime.node import NO_HELLO, Gateway, start_control_plane
from tests.helpers import closed_by_peer, free_port_between, log_lines
from transport.refusals import RefusalLog
from transport.ws import SUBPROTOCOL, TOO_BIG, WebSocketListener

pytestmark = pytest.mark.anyio

TOKENS = {"secret-a": "admin", "secret-r": "read"}
READ = {"Authorization": "Bearer secret-r"}
MiB = 1 << 20
LIMIT = 8


@asynccontextmanager
async def _gateway(hello_timeout: float) -> AsyncIterator[WebSocketListener]:
    """A control plane's gateway, Hello deadline ``hello_timeout``, on a ws listener."""
    port = free_port_between(46000, 46999)
    async with ActorSystem() as system:
        plane = await start_control_plane(system, alerting=None)
        gateway = Gateway(plane, hello_timeout=hello_timeout)
        listener = await transport.listen(f"ws://127.0.0.1:{port}/", tokens=TOKENS)
        assert isinstance(listener, WebSocketListener)
        await system.start_service(listener.serve, gateway.handle)
        try:
            yield listener
        finally:
            await listener.aclose()


async def test_a_connection_without_a_hello_is_closed_at_the_deadline_and_logged() -> None:
    """Five read-token connections that never say Hello: each is closed (1008) with a
    reason naming the deadline; the listener counts them as ``no hello``; its refusal
    log gives the first a line and the rest a summary."""
    with anyio.fail_after(LIMIT), log_lines("corral.transport") as logs:
        async with _gateway(hello_timeout=0.3) as listener:
            listener.refusal_log = RefusalLog(first=1, interval=60.0)
            async with aiohttp.ClientSession() as session:
                sockets = [
                    await session.ws_connect(
                        listener.address, protocols=(SUBPROTOCOL,), headers=READ, heartbeat=None
                    )
                    for _ in range(5)
                ]
                closes = [await closed_by_peer(ws) for ws in sockets]
            why = "no Hello within 0.3 s of connecting (a Corral worker, client or console "
            assert closes == [(1008, why + "sends it at once)")] * 5
            assert listener.refused_by == {NO_HELLO: 5}
        lines = [ln for ln in logs.lines if "refused a websocket connection" in ln]
        assert len(lines) == 1, logs.lines
        assert "reason='no hello'" in lines[0] and "role='read'" in lines[0], lines
        assert logs.has("refused 5 connections in the last", "no hello 5 from 127.0.0.1")


async def test_a_too_big_first_message_is_closed_and_logged_whole_or_chunked() -> None:
    """Before any Hello, a read-token connection sends a 3 MiB message whole (over what
    aiohttp buffers: it closes it) or a 50 MiB one in chunks (over the provisional
    limit): both are closed with 1009 at once and logged alike, through the refusal
    log (one line each here, then a summary of the rest)."""
    chunk = struct.pack(">BQ", 2, 50 * MiB) + b"\xc7" + bytes(MiB - 1)
    whole = b"\xc7" + bytes(3 * MiB - 1)
    with anyio.fail_after(LIMIT), log_lines("corral.transport") as logs:
        async with _gateway(hello_timeout=60.0) as listener:
            listener.refusal_log = RefusalLog(first=1, interval=60.0)
            closes = []
            async with aiohttp.ClientSession() as session:
                for data in (whole, chunk, chunk, whole):
                    ws = await session.ws_connect(
                        listener.address, protocols=(SUBPROTOCOL,), headers=READ
                    )
                    with contextlib.suppress(ConnectionError):  # closed while it sends
                        await ws.send_bytes(data)
                    closes.append((await closed_by_peer(ws))[0])
                    await ws.close()
            assert closes == [1009] * 4
            assert listener.refused_by == {TOO_BIG: 4}
        lines = [ln for ln in logs.lines if "a message over its size limit (code 1009)" in ln]
        assert len(lines) == 1, logs.lines
        assert "role='read'" in lines[0], lines
        assert logs.has("refused 4 connections in the last", "message too big 4 from 127.0.0.1")
