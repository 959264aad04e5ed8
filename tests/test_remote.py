"""Actor references across a connection (runtime.remote), over inproc with the codec on.

The codec path matters: every frame is encoded to bytes and decoded again, as over a
websocket, so what passes here passes over ``ws://`` too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from runtime.errors import ActorStopped, AskTimeout, CorralError, ProtocolError
from runtime.kernel import Actor, ActorRef, ActorSystem, current_causal_id, handles
from runtime.messages import Message, Ping, Pong, message
from runtime.node import Link
from runtime.remote import (
    JsonReply,
    MessagesReply,
    Peer,
    PickledMsg,
    RemoteError,
    from_wire,
    to_wire,
)
from tests.helpers import wait_until
from transport import connect, listen

LIMIT = 10


@message("test.remote.Note", local=True)
class Note(Message):
    """Process-local: carries a live object."""

    obj: Any


@message("test.remote.Fail")
class Fail(Message):
    text: str


@message("test.remote.Hold")
class Hold(Message):
    pass


class Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle me")


@message("test.remote.FailOdd")
class FailOdd(Message):
    pass


class Server(Actor):
    def __init__(self) -> None:
        self.notes: list[Any] = []
        self.causal: list[str] = []
        self.got_note = anyio.Event()
        self.gate = anyio.Event()
        self.holding = anyio.Event()

    @handles(Ping)
    def ping(self, msg: Ping) -> Pong:
        self.causal.append(current_causal_id())
        return Pong(msg.token + 1)

    @handles(Note)
    def note(self, msg: Note) -> Any:
        self.notes.append(msg.obj)
        self.got_note.set()
        return {"echo": msg.obj}

    @handles(Fail)
    def fail(self, msg: Fail) -> None:
        raise LookupError(msg.text)

    @handles(FailOdd)
    def fail_odd(self, msg: FailOdd) -> None:
        raise Unpicklable("odd")

    @handles(Hold)
    async def hold(self, msg: Hold) -> None:
        self.holding.set()
        await self.gate.wait()


@asynccontextmanager
async def pair(
    allow_pickle: bool = True,
) -> AsyncIterator[tuple[Peer, Peer, Server, Callable[[], list[str]]]]:
    """A client peer and a server peer joined by inproc://?codec, the server serving."""
    closed: list[str] = []
    async with ActorSystem() as system, anyio.create_task_group() as tg:
        server = Server()
        ref: ActorRef[Any] = await system.spawn(server, "server")
        listener = await listen("inproc://", codec=True)
        accepted = anyio.Event()
        peers: dict[str, Peer] = {}

        async def handler(conn: Any) -> None:
            peer = Peer(
                conn,
                ref,
                name="client",
                allow_pickle=allow_pickle,
                on_close=lambda p: closed.append("server side"),
            )
            peers["server"] = peer
            accepted.set()
            await peer.run()

        await tg.start(listener.serve, handler)
        conn = await connect(listener.address)
        client = Peer(
            conn,
            None,
            name="server",
            allow_pickle=True,
            on_close=lambda p: closed.append("client side"),
        )
        await tg.start(client.run)
        await accepted.wait()
        yield client, peers["server"], server, lambda: closed
        await client.aclose()
        await listener.aclose()
        tg.cancel_scope.cancel()


def test_local_messages_are_pickled_and_wire_messages_are_not() -> None:
    assert to_wire(Ping(3)) == Ping(3)
    wrapped = to_wire(Note({1, 2}))
    assert isinstance(wrapped, PickledMsg) and wrapped.type_name == "test.remote.Note"
    assert from_wire(wrapped, allow_pickle=True) == Note({1, 2})
    with pytest.raises(ProtocolError, match="authenticated"):
        from_wire(wrapped, allow_pickle=False)
    forged = PickledMsg("test.remote.Note", to_wire(Note(1)).payload[:-3])  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match="could not unpickle"):
        from_wire(forged, allow_pickle=True)
    liar = PickledMsg("Ping", wrapped.payload)
    with pytest.raises(ProtocolError, match="claims to be Ping"):
        from_wire(liar, allow_pickle=True)


def test_answers_of_json_values_or_wire_messages_travel_typed() -> None:
    """What a console asks for comes back without a pickle; what JSON would change (a
    tuple, a non-str key, NaN, a lone surrogate, another type) is still pickled."""
    json_like = {"run": "run-1", "count": 2, "keys": ["a", "b"], "x": [1.5, None, True, b""]}
    assert to_wire(json_like) == JsonReply(json_like)
    assert to_wire([["k", "waiting", "processing", "c-1", "1.5"]]).value == [  # type: ignore[attr-defined]
        ["k", "waiting", "processing", "c-1", "1.5"]
    ]
    assert to_wire((Ping(1), Ping(2))) == MessagesReply((Ping(1), Ping(2)))
    assert to_wire(()) == MessagesReply(())
    for value in ({"k": (1, 2)}, {1: "a"}, [float("nan")], ["\ud800"], [2**64], {Ping(1)}):
        assert isinstance(to_wire(value), PickledMsg), value
    assert isinstance(to_wire((Ping(1), Note(2))), PickledMsg)  # a local message inside


@pytest.mark.anyio
async def test_ask_and_tell_across_the_connection() -> None:
    with anyio.fail_after(LIMIT):
        async with pair() as (client, _, server, _closed):
            assert await client.ref.ask(Ping(1), causal_id="cause-1") == Pong(2)
            assert server.causal == ["cause-1"]  # the causal id crossed with the message
            await client.ref.tell(Note([1, 2, 3]))
            await server.got_note.wait()
            assert server.notes == [[1, 2, 3]]
            # A local message asked: the reply (a dict) comes back pickled.
            assert await client.ref.ask(Note("x")) == {"echo": "x"}


@pytest.mark.anyio
async def test_posts_are_batched_in_order() -> None:
    with anyio.fail_after(LIMIT):
        async with pair() as (client, _, server, _closed):
            for i in range(200):
                client.ref.post(Note(i))
            assert await client.ref.ask(Ping(0)) == Pong(1)  # flushes the posts first
            assert server.notes == list(range(200))


@pytest.mark.anyio
async def test_a_remote_handler_error_raises_the_original_type() -> None:
    with anyio.fail_after(LIMIT):
        async with pair() as (client, _, _server, _closed):
            with pytest.raises(LookupError, match="nope"):
                await client.ref.ask(Fail("nope"))
            with pytest.raises(RemoteError, match="Unpicklable: odd"):
                await client.ref.ask(FailOdd())
            assert await client.ref.ask(Ping(5)) == Pong(6)  # still serving


@pytest.mark.anyio
async def test_pickles_are_refused_from_an_unauthenticated_peer() -> None:
    with anyio.fail_after(LIMIT):
        async with pair(allow_pickle=False) as (client, server_peer, server, _closed):
            with pytest.raises(RemoteError, match="authenticated"):
                await client.ref.ask(Note("secret"))
            assert server.notes == []  # nothing was unpickled or handled
            assert server_peer.bad_frames == 1
            assert await client.ref.ask(Ping(1)) == Pong(2)  # wire messages still work


@pytest.mark.anyio
async def test_closing_fails_pending_asks_and_stops_the_reference() -> None:
    with anyio.fail_after(LIMIT):
        async with pair() as (client, server_peer, server, closed):
            result: list[BaseException] = []

            async def waiter() -> None:
                try:
                    await client.ref.ask(Hold(), timeout=None)
                except BaseException as exc:
                    result.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await server.holding.wait()  # the server is inside the handler
                await server_peer.aclose()
            assert isinstance(result[0], ActorStopped)
            assert client.ref.stopped
            with pytest.raises(ActorStopped) as info:
                await client.ref.ask(Ping(1))
            # The connection closed, not the actor: the error says so (the chaos
            # audit's D4: "actor 'manager' has stopped" sent an on-call engineer to a
            # healthy manager after a paused worker's connection was closed).
            text = str(info.value)
            assert text.startswith("the connection to ") and " closed (" in text, text
            assert "has stopped" not in text and "may well be running" in text
            assert info.value.closed == client.why_closed()
            with pytest.raises(ActorStopped):
                client.ref.post(Ping(1))
            server.gate.set()
            assert sorted(closed()) == ["client side", "server side"]


@pytest.mark.anyio
async def test_ask_timeout_over_the_connection() -> None:
    with anyio.fail_after(LIMIT):
        async with pair() as (client, _, server, _closed):
            with pytest.raises(AskTimeout):
                await client.ref.ask(Hold(), timeout=0.05)
            server.gate.set()
            assert await client.ref.ask(Ping(1)) == Pong(2)


@pytest.mark.anyio
async def test_a_silent_peer_is_declared_dead_and_closed() -> None:
    with anyio.fail_after(LIMIT):
        listener = await listen("inproc://", codec=True)
        closed = anyio.Event()
        reasons: list[str] = []
        async with anyio.create_task_group() as tg:

            async def handler(conn: Any) -> None:
                peer = Peer(
                    conn, None, name="silent", allow_pickle=False, heartbeat=0.05, timeout=0.2,
                    on_close=lambda p: (reasons.append(p.closed_reason), closed.set()),
                )  # fmt: skip
                await peer.run()

            await tg.start(listener.serve, handler)
            conn = await connect(listener.address)  # connects, then never says a word
            pings = 0
            with anyio.move_on_after(5):
                async for frame in conn:  # the server's heartbeats arrive meanwhile
                    assert isinstance(frame.msg, Ping)
                    pings += 1
            await closed.wait()
            assert pings >= 1
            assert "dead peer" in reasons[0]
            await listener.aclose()
            tg.cancel_scope.cancel()


# ----------------------------------------------------------------------------- links


async def _ask_into(link: Link, got: list[Any]) -> None:
    """Ask ``Ping(1)`` on ``link``; append the answer, or the CorralError raised."""
    try:
        got.append(await link.ask(Ping(1), timeout=LIMIT))
    except CorralError as exc:
        got.append(exc)


@pytest.mark.anyio
async def test_an_ask_on_a_link_whose_connection_drops_meanwhile_waits_for_the_next() -> None:
    """The scheduler's reference to a remote worker (``runtime.node.Link``), which
    outlives reconnections. An ask under way when the connection drops (``detach``, a
    worker killed, say) must not fail with a bare AssertionError: it goes on the
    connection it found, or waits for the next, or fails with ActorStopped once the
    link is given up (``close``)."""
    with anyio.fail_after(LIMIT):
        async with pair() as (client, _, _server, _closed):
            link = Link("worker")
            link.attach(client)
            got: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(_ask_into, link, got)
                await anyio.lowlevel.checkpoint()  # the ask has started and yielded once
                link.detach()  # the connection drops right then
            assert got == [Pong(2)]
            # Not connected: an ask waits, and goes on the next connection.
            async with anyio.create_task_group() as tg:
                tg.start_soon(_ask_into, link, got)
                for _ in range(5):
                    await anyio.lowlevel.checkpoint()
                assert got == [Pong(2)]  # still waiting
                link.attach(client)
            assert got == [Pong(2), Pong(2)]
            # Given up while an ask waits: it fails as a stopped actor's would.
            link.detach()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_ask_into, link, got)
                await anyio.lowlevel.checkpoint()
                link.close()
            assert isinstance(got[-1], ActorStopped)
            with pytest.raises(ActorStopped):
                await link.tell(Ping(1))


@pytest.mark.anyio
async def test_a_message_for_a_stopped_actor_is_a_warning_unless_this_side_is_stopping() -> None:
    """A tell for an actor that stopped is dropped: a warning when nothing stops on
    purpose (a real loss), a debug record once the side's owner said it is stopping (a
    client closing: the other side's messages that cross the close are expected)."""
    seen: list[logging.LogRecord] = []

    class Records(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "dropped a message for a stopped actor" in record.getMessage():
                seen.append(record)

    logger = logging.getLogger("corral")  # (put back after the test by conftest.py)
    logger.addHandler(Records(logging.DEBUG))
    logger.setLevel(logging.DEBUG)
    with anyio.fail_after(LIMIT):
        async with pair() as (client, server_peer, _, _):
            assert isinstance(server_peer.target, ActorRef)
            server_peer.target.stop()
            await server_peer.target.wait_stopped()
            await client.ref.tell(Hold())  # (a Ping alone is a heartbeat)
            await wait_until(lambda: len(seen) == 1, "the first drop")
            server_peer.stopping = True
            await client.ref.tell(Hold())
            await wait_until(lambda: len(seen) == 2, "the second drop")
    assert [r.levelno for r in seen] == [logging.WARNING, logging.DEBUG]
