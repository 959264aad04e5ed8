"""What a connection sends first, or does not (security audit, finding 8): a connection
that sends no Hello within the gateway's deadline is closed, told why, and counted and
logged through the listener's refusal log (before: held for the reconnect timeout, then
closed with code 1000 and nothing logged).

Real listeners on 127.0.0.1 (ports 46000-46999), raw aiohttp websockets with the read
token; every wait is on the peer's close."""

from __future__ import annotations

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
from transport.ws import SUBPROTOCOL, WebSocketListener

pytestmark = pytest.mark.anyio

TOKENS = {"secret-a": "admin", "secret-r": "read"}
READ = {"Authorization": "Bearer secret-r"}
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
