"""Values of any size across processes (actors/transfer.py): segments, the sender's
stream table, the reader, the spill store's segments, and a reply too large for a frame.

The end-to-end cases with real processes are in tests/test_transfer_processes.py.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from actors.store import SpillStore
from actors.transfer import (
    IDLE_SECONDS,
    BufferSegments,
    FileSegments,
    Relayed,
    StreamInfo,
    StreamTable,
    UnknownStream,
    loads,
    receive,
    serialize,
)
from runtime.errors import AskTimeout, FrameTooLarge, ValueTooLarge
from runtime.kernel import Actor, ActorRef, ActorSystem, handles
from runtime.messages import CloseStream, Message, ReadStream, StreamPart, message
from runtime.remote import Peer
from transport import connect, listen

pytestmark = pytest.mark.anyio
LIMIT = 20  # seconds per test


def table_ask(table: StreamTable, seen: list[ReadStream]) -> Callable[[ReadStream], Any]:
    """A reader's ``ask`` served straight from ``table`` (what a worker's handler does)."""

    async def ask(msg: ReadStream) -> StreamPart:
        seen.append(msg)
        await anyio.lowlevel.checkpoint()  # let the other parts in flight interleave
        return StreamPart(table.read(msg.stream, msg.offset, msg.length, now=1.0))

    return ask


# ------------------------------------------------------------------ segments and table


def test_a_numpy_array_serializes_as_views_of_its_own_memory() -> None:
    x = np.arange(1_000_000, dtype=np.float64)
    seg = serialize(x)
    assert len(seg.sizes) == 2  # the pickle stream, then the array's buffer
    assert seg.sizes[1] == x.nbytes and seg.sizes[0] < 1000
    assert np.shares_memory(np.frombuffer(seg.parts[1], dtype=np.float64), x)
    np.testing.assert_array_equal(loads([seg.read(0, seg.sizes[0]), seg.parts[1]]), x)


def test_reads_may_cross_segment_boundaries() -> None:
    seg = BufferSegments([b"abc", b"", b"defgh", b"ij"])
    assert seg.total == 10
    assert seg.read(0, 10) == b"abcdefghij"
    assert seg.read(2, 5) == b"cdefg"
    assert seg.read(8, 2) == b"ij"
    assert seg.read(10, 0) == b""
    with pytest.raises(ValueError, match="outside the stream's 10 bytes"):
        seg.read(8, 3)


def test_a_stream_closes_once_read_to_its_end() -> None:
    table = StreamTable()
    info = table.start("k", BufferSegments([b"0123456789"]), now=0.0)
    assert info == StreamInfo("k", info.stream, (10,))
    assert table.read(info.stream, 5, 5, now=1.0) == b"56789"
    assert len(table) == 1
    assert table.read(info.stream, 0, 5, now=1.0) == b"01234"
    assert len(table) == 0 and table.bytes_served == 10
    with pytest.raises(UnknownStream, match=f"stream {info.stream} is not open here"):
        table.read(info.stream, 0, 1, now=1.0)


def test_a_stream_nobody_reads_expires() -> None:
    table = StreamTable()
    old = table.start("old", BufferSegments([b"x" * 10]), now=0.0)
    table.read(old.stream, 0, 1, now=5.0)  # a read keeps it alive
    assert table.expire(now=5.0 + IDLE_SECONDS) == []
    assert table.expire(now=5.1 + IDLE_SECONDS) == ["old"]
    assert len(table) == 0
    # and opening a stream sweeps the idle ones too
    table.start("a", BufferSegments([b"x"]), now=0.0)
    table.start("b", BufferSegments([b"x"]), now=IDLE_SECONDS + 1)
    assert [st.key for st in table.open.values()] == ["b"]


def test_the_table_says_whether_a_stream_holds_a_value_in_memory(tmp_path: Path) -> None:
    """A stream of a value in memory holds views of its buffers until it ends, a stream
    of a spill file holds none: the worker's floor is not measured while one of the
    first kind is open (a value spilled while a reader reads it is still in memory)."""
    table = StreamTable()
    spill = tmp_path / "spilled"
    spill.write_bytes(b"y" * 10)
    on_disk = table.start("y", FileSegments(str(spill), [(0, 10)]), now=0.0)
    assert not table.in_memory
    in_memory = table.start("x", serialize(np.ones(1000)), now=0.0)
    assert table.in_memory
    table.read(in_memory.stream, 0, sum(in_memory.sizes), now=1.0)  # read to its end
    assert not table.in_memory and len(table) == 1
    table.close(on_disk.stream)
    assert len(table) == 0


async def test_a_read_reassembles_the_value_in_parts_with_a_window() -> None:
    x = np.random.default_rng(0).random((700, 1000))  # 5.6 MB
    table = StreamTable()
    info = table.start("x", serialize(x), now=0.0)
    seen: list[ReadStream] = []
    with anyio.fail_after(LIMIT):
        got = await receive(table_ask(table, seen), info)
    np.testing.assert_array_equal(got, x)
    assert got.flags.writeable  # the buffer it received, used in place
    total = sum(info.sizes)
    assert sum(m.length for m in seen) == total
    assert len(table) == 0  # read to its end: closed


async def test_parts_are_at_most_part_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors import transfer

    table = StreamTable()
    value = bytes(range(256)) * 40  # in band: the pickle stream is the whole value
    info = table.start("v", serialize(value), now=0.0)
    seen: list[ReadStream] = []
    parts = await transfer.receive_parts(table_ask(table, seen), info, part_bytes=1000, window=3)
    assert loads(parts) == value
    assert max(m.length for m in seen) == 1000
    assert sorted(m.offset for m in seen) == list(range(0, sum(info.sizes), 1000))


async def test_a_large_stream_s_buffers_are_not_zeroed_before_its_parts_come() -> None:
    """The audit's std run (process workers of 1 GiB, 200 MB chunks): a worker's event
    loop went 8 s without a heartbeat. The reader allocated each segment with
    ``bytearray(n)``, which zeroes 200 MB page by page on the event loop, holding the
    GIL. Now a large segment's buffer is memory no page of which is touched until its
    parts are written in: while the first part is held back, the process's RSS has not
    grown by the stream's 128 MiB."""
    from actors import transfer
    from actors.executor import rss

    x = np.ones(128 * 2**20 // 8)
    table = StreamTable()
    info = table.start("x", serialize(x), now=0.0)
    asked, go = anyio.Event(), anyio.Event()
    grown: list[int] = []

    async def ask(msg: ReadStream) -> StreamPart:
        asked.set()
        await go.wait()  # every part held back until the RSS is read
        return StreamPart(table.read(msg.stream, msg.offset, msg.length, now=1.0))

    before = rss()
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                got = await receive(ask, info)
                assert got.shape == x.shape and got.sum() == x.size and got.flags.writeable

            tg.start_soon(read)
            await asked.wait()  # the buffers are allocated; no part has come yet
            grown.append(rss() - before)
            go.set()
    assert grown[0] < 32 * 2**20, f"the buffers took {grown[0] / 2**20:.0f} MiB untouched"
    assert sum(info.sizes) > transfer.PART_BYTES  # parts, not one ask


async def test_a_value_over_the_receivers_limit_is_refused_before_any_read() -> None:
    table = StreamTable()
    info = table.start(("x", 1), serialize(np.zeros(1000)), now=0.0)
    seen: list[ReadStream] = []
    closed: list[CloseStream] = []
    with pytest.raises(ValueTooLarge) as err:
        await receive(
            table_ask(table, seen), info, limit=4000, where="worker 'w' (its memory limit)",
            close=closed.append,
        )  # fmt: skip
    assert seen == []
    assert err.value.key == "('x', 1)" and err.value.limit == 4000
    assert err.value.nbytes == sum(info.sizes) > 8000
    assert "worker 'w' (its memory limit)" in str(err.value)
    assert closed == [CloseStream(info.stream)]  # the sender frees it at once


async def test_a_failed_part_fails_the_read_with_that_error_and_closes_the_stream() -> None:
    table = StreamTable()
    info = table.start("x", serialize(np.zeros(2_000_000)), now=0.0)  # 16 MB: two parts
    calls = 0

    async def flaky(msg: ReadStream) -> StreamPart:
        nonlocal calls
        calls += 1
        if msg.offset > 0:
            raise AskTimeout("worker", "ReadStream", 1.0)
        return StreamPart(table.read(msg.stream, msg.offset, msg.length, now=1.0))

    closed: list[CloseStream] = []
    from actors import transfer

    with anyio.fail_after(LIMIT), pytest.raises(AskTimeout):  # the error itself, no group
        await transfer.receive(flaky, info, close=closed.append)
    assert closed == [CloseStream(info.stream)]


# ----------------------------------------------------------------------- spill store


def test_a_spilled_value_streams_from_its_file_without_loading(tmp_path: Path) -> None:
    store = SpillStore(str(tmp_path))
    x = np.arange(300_000, dtype=np.int64)
    store.put("x", x)
    store["small"] = {"a": [1, 2, 3]}  # no out-of-band buffers
    assert store.spill(10**9) > 0 and store.on_disk("x") and store.on_disk("small")
    seg = store.segments("x")
    assert seg.sizes[1] == x.nbytes
    data = seg.read(0, seg.total)
    head, buf = data[: seg.sizes[0]], bytearray(data[seg.sizes[0] :])
    np.testing.assert_array_equal(pickle.loads(head, buffers=[buf]), x)
    assert store.on_disk("x")  # still spilled: nothing was loaded
    small = store.segments("small")
    assert loads([small.read(0, small.total)]) == {"a": [1, 2, 3]}
    # the file may go (the value is dropped) while a stream still reads it
    del store["x"]
    assert seg.read(seg.sizes[0], 8) == x[:1].tobytes()
    seg.close()
    small.close()
    store.close()


# ------------------------------------------------------- a reply too large for a frame


@message("test.transfer.GiveBytes", local=True)
class GiveBytes(Message):
    n: int


class Giver(Actor):
    @handles(GiveBytes)
    def give(self, msg: GiveBytes) -> bytes:
        return b"x" * msg.n


async def test_a_reply_too_large_for_a_frame_is_an_error_at_once_not_a_silent_wait() -> None:
    async with ActorSystem() as system, anyio.create_task_group() as tg:
        ref: ActorRef[Any] = await system.spawn(Giver(), "giver")
        listener = await listen("ws://127.0.0.1:0", max_message_bytes=64 * 1024)

        async def serve(conn: Any) -> None:
            await Peer(conn, ref, name="client", allow_pickle=True).run()

        await tg.start(listener.serve, serve)
        conn = await connect(listener.address, max_message_bytes=64 * 1024)
        client = Peer(conn, None, name="server", allow_pickle=True)
        await tg.start(client.run)
        with anyio.fail_after(LIMIT):
            assert await client.ref.ask(GiveBytes(1000), timeout=None) == b"x" * 1000
            with pytest.raises(FrameTooLarge) as err:
                await client.ref.ask(GiveBytes(200_000), timeout=None)  # no timeout: no hang
            assert err.value.limit == 64 * 1024 and err.value.size > 200_000
            assert await client.ref.ask(GiveBytes(10), timeout=None) == b"x" * 10  # still open
        await client.aclose()
        await listener.aclose()
        tg.cancel_scope.cancel()


def test_a_relay_gives_a_value_once_every_byte_of_its_stream_was_passed_on() -> None:
    relayed = Relayed()
    assert relayed.start(StreamInfo("x", 1, (10, 6), "w1"), now=0.0) == ()
    assert relayed.start(StreamInfo("e", 2, (0,), "w1"), now=0.0) == ("e",)  # nothing to read
    assert relayed.passed("w1", 1, 6, now=1.0) == ()
    assert relayed.passed("w1", 1, 10, now=2.0) == ("x",)
    assert relayed.passed("w1", 1, 10, now=3.0) == ()  # (ended: said once)
    relayed.start(StreamInfo("y", 3, (10,), "w2"), now=3.0)
    relayed.end("w2", 3)  # its read failed, or its reader closed it
    assert relayed.passed("w2", 3, 10, now=4.0) == ()
    relayed.start(StreamInfo("z", 4, (10,), "w2"), now=4.0)  # its reader died unread:
    relayed.start(StreamInfo("v", 5, (10,), "w2"), now=5.0 + IDLE_SECONDS)  # dropped
    assert list(relayed.open) == [("w2", 5)]
