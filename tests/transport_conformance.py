"""Conformance suite for transport backends (the contract of :mod:`transport.base`).

What lives here: :class:`TransportConformance`, a test class without addresses of its
own. A backend's test module subclasses it under a ``Test...`` name and implements
:meth:`TransportConformance.fresh_address`; it may override :meth:`listen_options`,
:meth:`connect_options`, :meth:`dead_address` and ``connect_timeout``::

    class TestWebSocketTransport(TransportConformance):
        def fresh_address(self) -> str:
            return "ws://127.0.0.1:0/corral"

Tests connect to ``listener.address`` (the real address), never to the address they
listened on, so a fresh address may leave the port or name to the backend. Every test
is bounded by ``anyio.fail_after``; nothing polls with sleeps: waits are on events,
and "still pending" is asserted after a short bounded wait for the completion event.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import anyio
import pytest

import transport
from runtime.codec import Frame
from runtime.messages import ErrorReply, Ping, Pong
from transport import (
    AddressInUse,
    ConnectFailed,
    Connection,
    ConnectionClosed,
    Listener,
)

#: Upper bound of one test, seconds (the global pytest-timeout is the backstop).
TIMEOUT = 20.0
#: How long a send that must stay blocked is given to (wrongly) complete, seconds.
PENDING_WINDOW = 0.2


def ping(i: int, **envelope: Any) -> Frame:
    return Frame(Ping(i), **envelope)


def token(frame: Frame) -> int:
    assert isinstance(frame.msg, Ping | Pong), frame
    return frame.msg.token


@pytest.mark.anyio
class TransportConformance:
    """Behaviour every transport backend must show. Subclass; see the module docstring."""

    #: ``timeout`` passed to ``transport.connect``; connects must finish well within it.
    connect_timeout: ClassVar[float] = 5.0

    # -- hooks for subclasses ---------------------------------------------------------

    def fresh_address(self) -> str:
        """An address to listen on that nothing else uses (port 0 / empty name is fine)."""
        raise NotImplementedError("a TransportConformance subclass must define fresh_address()")

    def listen_options(self) -> dict[str, Any]:
        """Extra options for every ``transport.listen`` of the suite."""
        return {}

    def connect_options(self) -> dict[str, Any]:
        """Extra options for every ``transport.connect`` of the suite."""
        return {}

    async def dead_address(self) -> str:
        """An address nothing listens on: by default, that of a listener that was closed."""
        async with await self.listen() as listener:
            address = listener.address
        return address

    # -- helpers ------------------------------------------------------------------------

    async def listen(self, address: str | None = None, **options: Any) -> Listener:
        opts = {**self.listen_options(), **options}
        return await transport.listen(address or self.fresh_address(), **opts)

    async def connect(self, address: str, **options: Any) -> Connection:
        opts = {**self.connect_options(), **options}
        return await transport.connect(address, timeout=self.connect_timeout, **opts)

    @contextlib.asynccontextmanager
    async def pair(
        self,
        listen_options: dict[str, Any] | None = None,
        connect_options: dict[str, Any] | None = None,
    ) -> AsyncIterator[tuple[Connection, Connection, Listener]]:
        """(client end, server end, listener); all closed on exit."""
        async with await self.listen(**(listen_options or {})) as listener:
            accepted: list[Connection] = []

            async def accept() -> None:
                server = await listener.accept()
                server.set_limits()  # as an application does once it trusts the peer
                accepted.append(server)

            async with anyio.create_task_group() as tg:
                tg.start_soon(accept)
                client = await self.connect(listener.address, **(connect_options or {}))
            async with client, accepted[0] as server:
                yield client, server, listener

    # -- basics -------------------------------------------------------------------------

    async def test_round_trip(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                frame = ping(7, causal_id="cause-1")
                await client.send(frame)
                got = await server.receive()
                assert got == frame
                assert type(got.msg) is Ping

    async def test_addresses(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, listener):
                assert listener.address.startswith(self.fresh_address().split("://")[0] + "://")
                assert client.peer_address == listener.address
                assert server.local_address == listener.address
                assert client.local_address
                assert server.peer_address
                assert not client.closed
                assert not server.closed
                assert not listener.closed

    async def test_request_reply_both_directions(self) -> None:
        """Both ends ask and answer at once; envelopes (causal, request, reply) survive."""
        n = 200  # requests + replies per direction stay below the default max_buffer, so
        # readers that reply inline cannot block each other.

        async def side(conn: Connection, name: str, replies: dict[int, Frame]) -> None:
            async def answer() -> None:
                async for frame in conn:
                    if frame.request_id:
                        assert frame.causal_id == f"from-{frame.request_id % 2}"
                        reply = Frame(
                            Pong(token(frame)), causal_id=frame.causal_id, reply_to=frame.request_id
                        )
                        await conn.send(reply)
                    else:
                        assert frame.reply_to
                        replies[frame.reply_to] = frame
                        if len(replies) == n:
                            done[name].set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer)
                parity = 0 if name == "client" else 1
                for i in range(n):
                    rid = 2 * i + parity + 2  # never 0; parity says who asked
                    await conn.send(ping(i * 10, causal_id=f"from-{rid % 2}", request_id=rid))
                await done["client"].wait()
                await done["server"].wait()
                tg.cancel_scope.cancel()

        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                done = {"client": anyio.Event(), "server": anyio.Event()}
                client_replies: dict[int, Frame] = {}
                server_replies: dict[int, Frame] = {}
                async with anyio.create_task_group() as tg:
                    tg.start_soon(side, client, "client", client_replies)
                    tg.start_soon(side, server, "server", server_replies)
            for parity, replies in ((0, client_replies), (1, server_replies)):
                assert sorted(replies) == [2 * i + parity + 2 for i in range(n)]
                for rid, frame in replies.items():
                    assert type(frame.msg) is Pong
                    assert frame.msg.token == (rid - parity - 2) // 2 * 10
                    assert frame.causal_id == f"from-{rid % 2}"
                    assert frame.request_id == 0

    async def test_order_of_10000_frames_both_directions(self) -> None:
        n = 10_000

        async def send_all(conn: Connection) -> None:
            for i in range(n):
                await conn.send(ping(i))

        async def receive_all(conn: Connection, got: list[int]) -> None:
            for _ in range(n):
                got.append(token(await conn.receive()))

        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                at_server: list[int] = []
                at_client: list[int] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_all, client)
                    tg.start_soon(send_all, server)
                    tg.start_soon(receive_all, server, at_server)
                    tg.start_soon(receive_all, client, at_client)
        assert at_server == list(range(n))
        assert at_client == list(range(n))

    async def test_send_many_keeps_order(self) -> None:
        """Batches interleave with single sends in call order; a batch may exceed max_buffer."""
        with anyio.fail_after(TIMEOUT):
            async with self.pair(connect_options={"max_buffer": 64}) as (client, server, _):
                got: list[int] = []

                async def receive_all() -> None:
                    for _ in range(1000):
                        got.append(token(await server.receive()))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(receive_all)
                    await client.send(ping(0))
                    await client.send_many([ping(i) for i in range(1, 100)])
                    await client.send_many([])
                    await client.send(ping(100))
                    await client.send_many([ping(i) for i in range(101, 300)])  # > max_buffer
                    await client.send_many(tuple(ping(i) for i in range(300, 1000)))
                assert got == list(range(1000))

    async def test_send_many_batches_are_contiguous(self) -> None:
        """Two tasks sending batches at once: each batch arrives whole and in order."""
        batches, size = 50, 10
        with anyio.fail_after(TIMEOUT):
            async with self.pair(connect_options={"max_buffer": 16}) as (client, server, _):

                async def sender(who: str) -> None:
                    for b in range(batches):
                        await client.send_many(
                            [ping(b * size + i, causal_id=who) for i in range(size)]
                        )

                got: list[Frame] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender, "a")
                    tg.start_soon(sender, "b")
                    for _ in range(2 * batches * size):
                        got.append(await server.receive())
        seen: dict[str, list[int]] = {"a": [], "b": []}
        for start in range(0, len(got), size):
            chunk = got[start : start + size]
            who = chunk[0].causal_id
            assert all(f.causal_id == who for f in chunk), "a batch was split"
            seen[who].extend(token(f) for f in chunk)
        assert seen == {"a": list(range(batches * size)), "b": list(range(batches * size))}

    async def test_many_concurrent_connections(self) -> None:
        clients, frames = 50, 20

        async def echo(conn: Connection) -> None:
            async for frame in conn:
                await conn.send(frame)

        async def client(listener: Listener, c: int) -> None:
            async with await self.connect(listener.address) as conn:
                for i in range(frames):
                    await conn.send(ping(i, causal_id=f"client-{c}"))
                for i in range(frames):
                    frame = await conn.receive()
                    assert (frame.causal_id, token(frame)) == (f"client-{c}", i)

        with anyio.fail_after(TIMEOUT):
            async with await self.listen() as listener, anyio.create_task_group() as server_tg:
                await server_tg.start(listener.serve, echo)
                async with anyio.create_task_group() as tg:
                    for c in range(clients):
                        tg.start_soon(client, listener, c)
                await listener.aclose()  # serve returns once the handlers have ended

    async def test_large_binary_payload(self) -> None:
        payload = os.urandom(8 << 20)
        frame = Frame(ErrorReply("Blob", "8 MiB of pickled bytes", pickled=payload), "big")
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                await client.send(frame)
                got = await server.receive()
                assert got == frame
                await server.send(got)
                back = await client.receive()
        assert isinstance(back.msg, ErrorReply)
        assert back.msg.pickled == payload
        assert back.causal_id == "big"

    # -- closing ------------------------------------------------------------------------

    async def test_peer_close_drains_then_raises(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                for i in range(3):
                    await client.send(ping(i))
                await client.aclose()
                assert client.closed
                assert [token(await server.receive()) for _ in range(3)] == [0, 1, 2]
                with pytest.raises(ConnectionClosed):
                    await server.receive()
                with pytest.raises(ConnectionClosed):  # stays closed
                    await server.receive()
                assert server.closed

    async def test_send_after_close_raises(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                await client.aclose()
                await client.aclose()  # idempotent
                with pytest.raises(ConnectionClosed):
                    await client.send(ping(1))
                with pytest.raises(ConnectionClosed):
                    await client.send_many([ping(2), ping(3)])
                with pytest.raises(ConnectionClosed):
                    await client.receive()
                # The peer learns of the close on receive; from then on its sends fail too.
                with pytest.raises(ConnectionClosed):
                    await server.receive()
                with pytest.raises(ConnectionClosed):
                    await server.send(ping(4))
                with pytest.raises(ConnectionClosed):
                    await server.send_many([ping(5)])

    async def test_async_for_ends_on_peer_close(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                for i in range(5):
                    await client.send(ping(i))
                await client.aclose()
                assert [token(f) async for f in server] == [0, 1, 2, 3, 4]

    async def test_blocked_receive_woken_by_peer_close(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                outcome: list[BaseException] = []

                async def receive() -> None:
                    try:
                        await server.receive()
                    except ConnectionClosed as exc:
                        outcome.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(receive)
                    await anyio.wait_all_tasks_blocked()
                    await client.aclose()
                assert len(outcome) == 1

    async def test_blocked_receive_woken_by_local_close(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, _, _):
                outcome: list[BaseException] = []

                async def receive() -> None:
                    try:
                        await client.receive()
                    except ConnectionClosed as exc:
                        outcome.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(receive)
                    await anyio.wait_all_tasks_blocked()
                    await client.aclose()
                assert len(outcome) == 1

    async def test_blocked_send_woken_by_peer_close(self) -> None:
        opts = {"max_buffer": 4}
        with anyio.fail_after(TIMEOUT):
            async with self.pair(opts, opts) as (client, server, _):
                for i in range(4):
                    await client.send(ping(i))
                outcome: list[BaseException] = []

                async def send() -> None:
                    try:
                        await client.send(ping(4))
                    except ConnectionClosed as exc:
                        outcome.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(send)
                    await anyio.wait_all_tasks_blocked()
                    await server.aclose()
                assert len(outcome) == 1

    # -- connecting and listening --------------------------------------------------------

    async def test_connect_to_nothing_fails_fast(self) -> None:
        address = await self.dead_address()
        with anyio.fail_after(self.connect_timeout + 1):
            with pytest.raises(ConnectFailed) as info:
                await self.connect(address)
        assert info.value.address == address
        assert info.value.reason

    async def test_listen_on_address_in_use(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with await self.listen() as listener:
                with pytest.raises(AddressInUse) as info:
                    await self.listen(listener.address)
                assert info.value.address == listener.address
                # the first listener is unharmed
                async with (
                    await self.connect(listener.address) as client,
                    await listener.accept() as server,
                ):
                    await client.send(ping(1))
                    assert token(await server.receive()) == 1

    async def test_closed_listener_frees_its_address(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with await self.listen() as first:
                address = first.address
            async with await self.listen(address) as second:
                assert second.address == address

    async def test_listener_close_stops_connects_not_connections(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, listener):
                await listener.aclose()
                await listener.aclose()  # idempotent
                assert listener.closed
                with pytest.raises(ConnectFailed):
                    await self.connect(listener.address)
                with pytest.raises(ConnectionClosed):
                    await listener.accept()
                await client.send(ping(1))
                assert token(await server.receive()) == 1
                await server.send(ping(2))
                assert token(await client.receive()) == 2

    async def test_blocked_accept_woken_by_listener_close(self) -> None:
        with anyio.fail_after(TIMEOUT):
            listener = await self.listen()
            outcome: list[BaseException] = []

            async def accept() -> None:
                try:
                    await listener.accept()
                except ConnectionClosed as exc:
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(accept)
                await anyio.wait_all_tasks_blocked()
                await listener.aclose()
            assert len(outcome) == 1

    async def test_serve_closes_connection_after_handler_and_ends_with_listener(self) -> None:
        async def handler(conn: Connection) -> None:
            frame = await conn.receive()
            await conn.send(Frame(Pong(token(frame)), reply_to=frame.request_id))

        with anyio.fail_after(TIMEOUT):
            async with await self.listen() as listener, anyio.create_task_group() as tg:
                await tg.start(listener.serve, handler)
                async with await self.connect(listener.address) as client:
                    await client.send(ping(5, request_id=1))
                    reply = await client.receive()
                    assert (type(reply.msg), reply.reply_to) == (Pong, 1)
                    with pytest.raises(ConnectionClosed):  # the handler returned
                        await client.receive()
                await listener.aclose()  # serve returns: the task group can end

    # -- backpressure and cancellation --------------------------------------------------

    async def _assert_send_blocks_until_read(
        self, sender: Connection, receiver: Connection, max_buffer: int
    ) -> None:
        for i in range(max_buffer):  # these fit: they must not wait for the reader
            await sender.send(ping(i))
        sent = anyio.Event()

        async def send_one_more() -> None:
            await sender.send(ping(max_buffer))
            sent.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_one_more)
            with anyio.move_on_after(PENDING_WINDOW):
                await sent.wait()
            assert not sent.is_set(), "send finished although the peer had max_buffer unread"
            assert token(await receiver.receive()) == 0
            await sent.wait()  # one frame read: room for the blocked one
        for i in range(1, max_buffer + 1):
            assert token(await receiver.receive()) == i

    async def test_backpressure_blocks_send_until_peer_reads(self) -> None:
        opts = {"max_buffer": 4}
        with anyio.fail_after(TIMEOUT):
            async with self.pair(opts, opts) as (client, server, _):
                assert client.max_buffer == server.max_buffer == 4
                await self._assert_send_blocks_until_read(client, server, 4)
                await self._assert_send_blocks_until_read(server, client, 4)

    async def test_send_many_waits_for_room_for_whole_batch(self) -> None:
        opts = {"max_buffer": 4}
        with anyio.fail_after(TIMEOUT):
            async with self.pair(opts, opts) as (client, server, _):
                await client.send_many([ping(0), ping(1), ping(2)])
                sent = anyio.Event()

                async def send_batch(frames: list[Frame]) -> None:
                    await client.send_many(frames)
                    sent.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_batch, [ping(3), ping(4)])  # 3 unread + 2 > 4
                    with anyio.move_on_after(PENDING_WINDOW):
                        await sent.wait()
                    assert not sent.is_set(), "batch sent without room for all of it"
                    assert token(await server.receive()) == 0
                    await sent.wait()
                assert [token(await server.receive()) for _ in range(4)] == [1, 2, 3, 4]
                # a batch larger than max_buffer goes once the buffer is empty
                await client.send_many([ping(i) for i in range(5, 15)])
                assert [token(await server.receive()) for _ in range(10)] == list(range(5, 15))

    async def test_cancelled_receive_leaves_connection_usable(self) -> None:
        with anyio.fail_after(TIMEOUT):
            async with self.pair() as (client, server, _):
                for attempt in range(3):
                    with anyio.move_on_after(0.02 * (attempt + 1)) as scope:
                        await server.receive()
                    assert scope.cancelled_caught
                async with anyio.create_task_group() as tg:  # cancelled by its group
                    tg.start_soon(server.receive)
                    await anyio.wait_all_tasks_blocked()
                    tg.cancel_scope.cancel()
                await client.send(ping(1))
                await client.send(ping(2))
                assert token(await server.receive()) == 1
                assert token(await server.receive()) == 2
                await server.send(ping(3))
                assert token(await client.receive()) == 3

    async def test_cancelled_blocked_send_delivers_nothing(self) -> None:
        opts = {"max_buffer": 4}
        with anyio.fail_after(TIMEOUT):
            async with self.pair(opts, opts) as (client, server, _):
                for i in range(4):
                    await client.send(ping(i))
                with anyio.move_on_after(PENDING_WINDOW) as scope:
                    await client.send(ping(99))
                assert scope.cancelled_caught
                await client.send_many([])  # still open
                assert [token(await server.receive()) for _ in range(4)] == [0, 1, 2, 3]
                await client.send(ping(4))
                assert token(await server.receive()) == 4
