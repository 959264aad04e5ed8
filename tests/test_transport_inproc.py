"""Tests of the ``inproc://`` transport and of the transport registry.

What lives here: the conformance suite run twice on inproc (frames as objects, and
``codec=True`` so every frame goes through runtime.codec), and inproc-specific tests
(fresh names, isolated hubs, options, backlog, fairness) and address dispatch tests.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any

import anyio
import pytest

import transport
from runtime.codec import Frame
from runtime.errors import CorralError
from runtime.messages import Ping
from tests.transport_conformance import TransportConformance, ping, token
from transport import (
    AddressInUse,
    Backend,
    ConnectFailed,
    Connection,
    ConnectionClosed,
    InProcBackend,
    InProcHub,
    InvalidAddress,
    Listener,
    TransportError,
)

pytestmark = pytest.mark.anyio


def fresh_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


class TestInProcTransport(TransportConformance):
    """Frames pass as the same objects."""

    def fresh_address(self) -> str:
        return f"inproc://{fresh_name()}"

    async def test_frames_are_passed_as_objects(self) -> None:
        with anyio.fail_after(5):
            async with self.pair() as (client, server, _):
                frame = ping(1)
                await client.send(frame)
                assert await server.receive() is frame


class TestInProcCodecTransport(TransportConformance):
    """``codec=True``: every frame is encoded on send and decoded on receive."""

    def fresh_address(self) -> str:
        return f"inproc://{fresh_name()}"

    def listen_options(self) -> dict[str, Any]:
        return {"codec": True}

    async def test_frames_are_round_tripped_through_the_codec(self) -> None:
        with anyio.fail_after(5):
            async with self.pair() as (client, server, _):
                frame = ping(1, causal_id="c")
                await client.send(frame)
                await client.send_many([ping(2), ping(3)])
                got = await server.receive()
                assert got == frame
                assert got is not frame
                assert got.msg is not frame.msg
                assert [token(await server.receive()) for _ in range(2)] == [2, 3]


# ----------------------------------------------------------------------------- inproc


async def test_empty_name_picks_fresh_names() -> None:
    with anyio.fail_after(5):
        async with (
            await transport.listen("inproc://") as a,
            await transport.listen("inproc://") as b,
        ):
            assert a.address != b.address
            assert a.address.startswith("inproc://") and len(a.address) > len("inproc://")
            async with await transport.connect(b.address) as client:
                assert client.peer_address == b.address
                async with await b.accept() as server:
                    await client.send(ping(1))
                    assert token(await server.receive()) == 1


async def test_hubs_are_isolated() -> None:
    one, two = InProcBackend(hub=InProcHub()), InProcBackend(hub=InProcHub())
    with anyio.fail_after(5):
        async with await one.listen("inproc://same") as l1, await two.listen("inproc://same") as l2:
            assert one.hub.names() == two.hub.names() == ["same"]
            with pytest.raises(ConnectFailed):
                await transport.connect("inproc://same")  # not in the default hub
            c1 = await one.connect("inproc://same", timeout=1)
            c2 = await two.connect("inproc://same", timeout=1)
            async with c1, c2, await l1.accept() as s1, await l2.accept() as s2:
                await c1.send(ping(1))
                await c2.send(ping(2))
                assert token(await s1.receive()) == 1
                assert token(await s2.receive()) == 2
        assert one.hub.names() == []


async def test_connect_with_missing_or_empty_name() -> None:
    with anyio.fail_after(5):
        with pytest.raises(ConnectFailed) as info:
            await transport.connect(f"inproc://{fresh_name()}", timeout=1)
        assert "nothing is listening" in str(info.value)
        with pytest.raises(InvalidAddress):
            await transport.connect("inproc://", timeout=1)


async def test_full_backlog_makes_connect_wait_then_fail() -> None:
    with anyio.fail_after(5):
        async with await transport.listen(f"inproc://{fresh_name()}", backlog=1) as listener:
            first = await transport.connect(listener.address)
            with pytest.raises(ConnectFailed) as info:
                await transport.connect(listener.address, timeout=0.05)
            assert "backlog" in info.value.reason
            outcome: list[Connection] = []

            async def second() -> None:
                outcome.append(await transport.connect(listener.address, timeout=5))

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                await anyio.wait_all_tasks_blocked()
                assert not outcome
                accepted = await listener.accept()  # makes room
            async with first, accepted, outcome[0], await listener.accept() as server:
                await outcome[0].send(ping(2))
                assert token(await server.receive()) == 2


async def test_listener_close_closes_unaccepted_connections() -> None:
    with anyio.fail_after(5):
        listener = await transport.listen("inproc://")
        async with await transport.connect(listener.address) as client:
            await listener.aclose()
            with pytest.raises(ConnectionClosed):
                await client.receive()
            with pytest.raises(ConnectionClosed):
                await client.send(ping(1))


async def test_options_are_validated() -> None:
    with anyio.fail_after(5):
        with pytest.raises(TypeError, match="unknown inproc listen option"):
            await transport.listen("inproc://", max_bufer=3)
        with pytest.raises(ValueError, match="max_buffer"):
            await transport.listen("inproc://", max_buffer=0)
        with pytest.raises(ValueError, match="codec"):
            await transport.listen("inproc://", codec="yes")
        with pytest.raises(ValueError, match="backlog"):
            await transport.listen("inproc://", backlog=True)
        async with await transport.listen("inproc://") as listener:
            with pytest.raises(TypeError, match="unknown inproc connect option"):
                await transport.connect(listener.address, codec=True)
            with pytest.raises(ValueError, match="timeout"):
                await transport.connect(listener.address, timeout=0)


async def test_default_max_buffer() -> None:
    with anyio.fail_after(5):
        async with (
            await transport.listen("inproc://") as listener,
            await transport.connect(listener.address) as client,
            await listener.accept() as server,
        ):
            assert client.max_buffer == server.max_buffer == transport.DEFAULT_MAX_BUFFER


async def test_fast_path_does_not_starve_other_tasks() -> None:
    """A loop whose sends and receives never block still lets other tasks run."""
    with anyio.fail_after(5):
        async with (
            await transport.listen("inproc://") as listener,
            await transport.connect(listener.address) as client,
            await listener.accept() as server,
        ):
            ran = anyio.Event()

            async def mark() -> None:
                ran.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(mark)
                for i in range(1000):
                    await client.send(ping(i))
                    await server.receive()
                    if ran.is_set():
                        break
                assert ran.is_set()
                assert i < 200


async def test_same_address_reusable_across_backends_after_close() -> None:
    name = fresh_name()
    with anyio.fail_after(5):
        listener = await transport.listen(f"inproc://{name}")
        with pytest.raises(AddressInUse):
            await transport.listen(f"inproc://{name}")
        await listener.aclose()
        async with await transport.listen(f"inproc://{name}") as again:
            assert again.address == f"inproc://{name}"


# ----------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize(
    "address",
    ["no-scheme", "", "inproc:/x", "://x", "inproc://bad name", "inproc://a#b", "inproc://a?b"],
)
async def test_malformed_addresses(address: str) -> None:
    with pytest.raises(InvalidAddress) as info:
        await transport.listen(address)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidAddress):
        await transport.connect(address)


async def test_unknown_scheme_names_known_schemes() -> None:
    with pytest.raises(InvalidAddress) as info:
        await transport.connect("nope://host:1")
    assert "inproc://" in str(info.value)
    assert "inproc" in info.value.schemes
    assert "inproc" in transport.registered_schemes()


async def test_register_backend_dispatches_by_scheme() -> None:
    calls: list[tuple[str, str, dict[str, Any]]] = []
    inner = InProcBackend(hub=InProcHub())

    class Recording(Backend):
        async def listen(self, uri: str, **options: Any) -> Listener:
            calls.append(("listen", uri, options))
            return await inner.listen("inproc://" + uri.partition("://")[2], **options)

        async def connect(
            self,
            uri: str,
            *,
            timeout: float,  # noqa: ASYNC109 (the interface takes it)
            **options: Any,
        ) -> Connection:
            calls.append(("connect", uri, {"timeout": timeout, **options}))
            return await inner.connect("inproc://" + uri.partition("://")[2], timeout=timeout)

    assert transport.register_backend("Test-Rec", Recording()) is None
    try:
        with anyio.fail_after(5):
            async with (
                await transport.listen("test-rec://x", max_buffer=8) as listener,
                await transport.connect("TEST-REC://x", timeout=2),
            ):
                pass
            assert listener.address == "inproc://x"
        assert calls == [
            ("listen", "test-rec://x", {"max_buffer": 8}),
            ("connect", "TEST-REC://x", {"timeout": 2}),
        ]
    finally:
        from transport import base

        base._BACKENDS.pop("test-rec", None)
    with pytest.raises(TypeError):
        transport.register_backend("x", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        transport.register_backend("1bad", Recording())


def test_errors_are_typed_and_pickle() -> None:
    errors: list[TransportError] = [
        ConnectionClosed("inproc://a", "closed by the peer inproc://a#1"),
        ConnectFailed("inproc://b", "nothing is listening on that inproc name"),
        AddressInUse("inproc://c"),
        InvalidAddress("x", "it has no scheme:// prefix", ["inproc"]),
    ]
    for err in errors:
        assert isinstance(err, CorralError)
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err)
        assert str(again) == str(err)
        assert again.fields == err.fields
    failed = errors[1]
    assert isinstance(failed, ConnectFailed)
    assert failed.address == "inproc://b"


def test_frame_helpers() -> None:
    assert ping(3) == Frame(Ping(3))
