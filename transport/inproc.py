"""The ``inproc://NAME`` transport: connections between tasks of one event loop.

What lives here: :class:`InProcHub` (the name -> listener table), :class:`InProcBackend`
(registered for ``inproc://``), and its :class:`InProcListener` and
:class:`InProcConnection`. It implements the contract of :mod:`transport.base`.

Design. A connection is two one-way pipes (:class:`_Pipe`), one per direction. A pipe
is a ``deque`` of frames, a count of unread frames, the sender's ``max_buffer`` limit,
a closed flag, and at most two :class:`anyio.Event` objects that exist only while some
task waits: ``readable`` (a receiver waits for a frame) and ``writable`` (a sender waits
for room). The fast path is a plain append or popleft plus a check of the waiter slot;
an Event is made only by a task that must wait and is set and dropped by the task that
unblocks it, so nothing spins and a cancelled wait loses nothing. A send with room and a
receive with data return without yielding, except that every ``_CHECKPOINT_EVERY``-th
operation on a connection is an ``anyio.lowlevel.checkpoint()`` (taken before the frame
moves, so a cancellation there loses nothing) so that a loop that never blocks cannot
starve the event loop.

Frames travel as the same objects by default (no copy, no encoding). A listener made
with ``codec=True`` makes both directions of its connections carry bytes: ``send``
encodes with :func:`runtime.codec.encode` (``send_many`` with ``encode_batch``) and
``receive`` decodes, so the codec path can be tested without sockets.

Options: ``listen(uri, max_buffer=1024, codec=False, backlog=1024)`` and
``connect(uri, timeout=..., max_buffer=1024)``; ``max_buffer`` bounds the frames that
the connection's own sends may have unread at the peer. ``backlog`` bounds connections
that arrived but were not accepted yet; a connect finding it full waits up to its
timeout for room.
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, cast

import anyio
import anyio.lowlevel

from runtime.codec import Frame
from transport.base import (
    DEFAULT_MAX_BUFFER,
    AddressInUse,
    Backend,
    ConnectFailed,
    Connection,
    ConnectionClosed,
    Listener,
    invalid_address,
    split_address,
    timed_out,
)

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_HUB",
    "InProcBackend",
    "InProcConnection",
    "InProcHub",
    "InProcListener",
]

SCHEME = "inproc"

#: Connections that may wait for ``accept`` before ``connect`` waits.
DEFAULT_BACKLOG = 1024

#: Every this many fast-path operations a connection yields to the event loop once.
_CHECKPOINT_EVERY = 64

_NAME = re.compile(r"[A-Za-z0-9_.~:/@+-]*")

_checkpoint = anyio.lowlevel.checkpoint


class _Codec(Protocol):
    """The part of :mod:`runtime.codec` the ``codec=True`` mode calls."""

    def encode(self, frame: Frame, /) -> bytes: ...
    def decode(self, data: bytes, /) -> Frame: ...
    def encode_batch(self, frames: Sequence[Frame], /) -> bytes: ...
    def decode_batch(self, data: bytes, /) -> Sequence[Frame]: ...


def _load_codec() -> _Codec:
    # Looked up when a codec connection is made and its functions at call time, so
    # this module imports whatever state runtime.codec is in.
    return cast(_Codec, importlib.import_module("runtime.codec"))


class _Batch:
    """``send_many`` output in codec mode: one encoded blob holding ``count`` frames."""

    __slots__ = ("count", "data")

    def __init__(self, data: bytes, count: int) -> None:
        self.data = data
        self.count = count


class _Pipe:
    """One direction of a connection. See the module docstring."""

    __slots__ = (
        "closed",
        "codec",
        "count",
        "fast",
        "items",
        "limit",
        "readable",
        "writable",
    )

    def __init__(self, limit: int, codec: _Codec | None) -> None:
        # Frames (plain mode); bytes, _Batch, or decoded Frames (codec mode).
        self.items: deque[Any] = deque()
        self.count = 0  # unread frames (a _Batch counts as its frames)
        self.limit = limit
        self.codec = codec
        self.closed = False
        self.fast = codec is None  # plain mode and open: send may take the fast path
        self.readable: anyio.Event | None = None
        self.writable: anyio.Event | None = None

    def close(self) -> None:
        """No more frames go in; wake every waiter so it sees that."""
        self.closed = True
        self.fast = False
        self.wake()

    def wake(self) -> None:
        ev = self.readable
        if ev is not None:
            self.readable = None
            ev.set()
        ev = self.writable
        if ev is not None:
            self.writable = None
            ev.set()


class InProcConnection(Connection):
    """One end of an in-process connection; see :class:`transport.base.Connection`."""

    __slots__ = (
        "_closed_here",
        "_in",
        "_ops",
        "_out",
        "local_address",
        "max_buffer",
        "peer_address",
    )

    def __init__(self, local_address: str, peer_address: str, out: _Pipe, inp: _Pipe) -> None:
        self.local_address = local_address
        self.peer_address = peer_address
        self.max_buffer = out.limit
        self._out = out
        self._in = inp
        self._ops = 0
        self._closed_here = False

    @property
    def closed(self) -> bool:
        return self._out.closed

    @property
    def codec(self) -> bool:
        """True if frames are encoded on send and decoded on receive."""
        return self._out.codec is not None

    def _closed_error(self) -> ConnectionClosed:
        if self._closed_here:
            reason = "closed by this side"
        else:
            reason = f"closed by the peer {self.peer_address}"
        return ConnectionClosed(self.local_address, reason)

    # -- sending ------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        if self._ops >= _CHECKPOINT_EVERY:
            self._ops = 0
            await _checkpoint()
        self._ops += 1
        out = self._out
        if out.fast and out.count < out.limit:
            out.items.append(frame)
            out.count += 1
            ev = out.readable
            if ev is not None:
                out.readable = None
                ev.set()
            return
        await self._send_slow((frame,), False)

    async def send_many(self, frames: Sequence[Frame]) -> None:
        if self._ops >= _CHECKPOINT_EVERY:
            self._ops = 0
            await _checkpoint()
        self._ops += 1
        out = self._out
        n = len(frames)
        if out.fast and n > 0 and out.count + n <= out.limit:
            out.items.extend(frames)
            out.count += n
            ev = out.readable
            if ev is not None:
                out.readable = None
                ev.set()
            return
        if n == 0:
            if out.closed:
                raise self._closed_error()
            return
        await self._send_slow(frames, True)

    async def _send_slow(self, frames: Sequence[Frame], batch: bool) -> None:
        out = self._out
        if out.closed:
            raise self._closed_error()
        n = len(frames)
        item: Any = None
        if out.codec is not None:  # encode first: a bad frame fails whether or not there is room
            if batch:
                item = _Batch(out.codec.encode_batch(frames), n)
            else:
                item = out.codec.encode(frames[0])
        # Wait for room for the whole batch; a batch larger than the limit waits for an
        # empty buffer (it is then buffered whole, overshooting the limit once).
        while not (out.count == 0 or out.count + n <= out.limit):
            ev = out.writable
            if ev is None:
                ev = out.writable = anyio.Event()
            await ev.wait()
            if out.closed:
                raise self._closed_error()
        if out.closed:
            raise self._closed_error()
        if item is not None:
            out.items.append(item)
        elif batch:
            out.items.extend(frames)
        else:
            out.items.append(frames[0])
        out.count += n
        ev = out.readable
        if ev is not None:
            out.readable = None
            ev.set()

    @property
    def send_room(self) -> int:
        out = self._out
        return 0 if out.closed else max(out.limit - out.count, 0)

    async def wait_send_room(self, frames: int) -> None:
        out = self._out
        while not (out.closed or out.count == 0 or out.count + frames <= out.limit):
            ev = out.writable
            if ev is None:
                ev = out.writable = anyio.Event()
            await ev.wait()

    # -- receiving ----------------------------------------------------------------

    async def receive(self) -> Frame:
        if self._ops >= _CHECKPOINT_EVERY:
            self._ops = 0
            await _checkpoint()
        self._ops += 1
        inp = self._in
        if inp.count and inp.codec is None:
            frame: Frame = inp.items.popleft()
            inp.count -= 1
            ev = inp.writable
            if ev is not None:
                inp.writable = None
                ev.set()
            return frame
        return await self._receive_slow()

    async def _receive_slow(self) -> Frame:
        inp = self._in
        while not inp.count:
            if inp.closed:
                raise self._closed_error()
            ev = inp.readable
            if ev is None:
                ev = inp.readable = anyio.Event()
            await ev.wait()
        codec = inp.codec
        item = inp.items.popleft()
        if codec is not None and type(item) is _Batch:
            try:
                frames = codec.decode_batch(item.data)
                if len(frames) != item.count:
                    raise RuntimeError(
                        f"runtime.codec.decode_batch returned {len(frames)} frames for a "
                        f"batch of {item.count}"
                    )
            except BaseException:
                inp.count -= item.count
                self._wake_writer()
                raise
            inp.items.extendleft(reversed(frames[1:]))  # decoded; received one by one
            frame = frames[0]
        elif codec is not None and type(item) is bytes:
            inp.count -= 1
            self._wake_writer()
            return codec.decode(item)
        else:
            frame = item
        inp.count -= 1
        self._wake_writer()
        return frame

    def _wake_writer(self) -> None:
        inp = self._in
        ev = inp.writable
        if ev is not None:
            inp.writable = None
            ev.set()

    # -- closing ------------------------------------------------------------------

    async def aclose(self, reason: str = "", *, going_away: bool = False) -> None:
        self.close(reason)

    def close(self, reason: str = "") -> None:
        """Synchronous :meth:`aclose` (idempotent). In-process pipes carry no close
        reason: ``reason`` is not passed on (Corral's peers say why in a frame first)."""
        if self._closed_here:
            return
        self._closed_here = True
        self._out.close()
        self._in.close()
        self._in.items.clear()  # we will never read them; the peer's sends now fail
        self._in.count = 0


def _connection_pair(
    server_address: str,
    client_address: str,
    *,
    server_max_buffer: int,
    client_max_buffer: int,
    codec: bool,
) -> tuple[InProcConnection, InProcConnection]:
    """A connected (server end, client end) pair."""
    codec_module = _load_codec() if codec else None
    to_server = _Pipe(client_max_buffer, codec_module)
    to_client = _Pipe(server_max_buffer, codec_module)
    server = InProcConnection(server_address, client_address, to_client, to_server)
    client = InProcConnection(client_address, server_address, to_server, to_client)
    return server, client


class InProcListener(Listener):
    """Listens on ``inproc://NAME`` in one :class:`InProcHub`."""

    def __init__(
        self, hub: InProcHub, name: str, *, max_buffer: int, codec: bool, backlog: int
    ) -> None:
        self.address = f"{SCHEME}://{name}"
        self.name = name
        self.max_buffer = max_buffer
        self.codec = codec
        self.backlog = backlog
        self._hub = hub
        self._pending: deque[InProcConnection] = deque()
        self._arrived: anyio.Event | None = None  # an accept waits for a connection
        self._room: anyio.Event | None = None  # a connect waits for backlog room
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def accept(self) -> Connection:
        while not self._pending:
            if self._closed:
                raise ConnectionClosed(self.address, "the listener was closed")
            ev = self._arrived
            if ev is None:
                ev = self._arrived = anyio.Event()
            await ev.wait()
        conn = self._pending.popleft()
        ev = self._room
        if ev is not None:
            self._room = None
            ev.set()
        return conn

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Synchronous :meth:`aclose` (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._hub._remove(self)
        while self._pending:
            self._pending.popleft().close()
        for ev in (self._arrived, self._room):
            if ev is not None:
                ev.set()
        self._arrived = self._room = None

    def _enqueue(self, conn: InProcConnection) -> None:
        self._pending.append(conn)
        ev = self._arrived
        if ev is not None:
            self._arrived = None
            ev.set()

    async def _wait_for_room(self) -> None:
        ev = self._room
        if ev is None:
            ev = self._room = anyio.Event()
        await ev.wait()


class InProcHub:
    """The table of ``inproc`` names to listeners.

    The backend registered for ``inproc://`` uses :data:`DEFAULT_HUB`; make an
    :class:`InProcBackend` with its own hub for an isolated namespace.
    """

    def __init__(self) -> None:
        self._listeners: dict[str, InProcListener] = {}
        self._fresh = itertools.count(1)
        self._clients = itertools.count(1)

    def names(self) -> list[str]:
        """The names listened on now, sorted."""
        return sorted(self._listeners)

    def lookup(self, name: str) -> InProcListener | None:
        """The listener on ``name``, if any."""
        return self._listeners.get(name)

    def _fresh_name(self) -> str:
        while True:
            name = f"anon-{next(self._fresh)}"
            if name not in self._listeners:
                return name

    def _add(self, name: str, **options: Any) -> InProcListener:
        if not name:
            name = self._fresh_name()
        elif name in self._listeners:
            raise AddressInUse(f"{SCHEME}://{name}")
        listener = InProcListener(self, name, **options)
        self._listeners[name] = listener
        return listener

    def _remove(self, listener: InProcListener) -> None:
        if self._listeners.get(listener.name) is listener:
            del self._listeners[listener.name]

    def _client_address(self, name: str) -> str:
        return f"{SCHEME}://{name}#{next(self._clients)}"


#: The hub behind the ``inproc://`` backend registered by :mod:`transport`.
DEFAULT_HUB = InProcHub()


def _parse(uri: str) -> str:
    scheme, name = split_address(uri)
    if scheme != SCHEME:
        raise invalid_address(uri, f"the inproc backend serves {SCHEME}:// only")
    if not _NAME.fullmatch(name):
        raise invalid_address(
            uri, "an inproc name may hold only letters, digits and _ . ~ : / @ + -"
        )
    return name


def _positive_int(option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"inproc option {option} must be an int >= 1, got {value!r}")
    return value


def _check_options(what: str, options: dict[str, Any], known: Sequence[str]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(
            f"unknown inproc {what} option(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )


class InProcBackend(Backend):
    """The ``inproc://NAME`` backend over one :class:`InProcHub` (default: :data:`DEFAULT_HUB`).

    ``listen("inproc://")`` (empty name) picks a fresh name; ``listener.address`` tells it.
    """

    def __init__(self, hub: InProcHub | None = None) -> None:
        self.hub = DEFAULT_HUB if hub is None else hub

    async def listen(self, uri: str, **options: Any) -> InProcListener:
        """Listen on ``uri``. Options: ``max_buffer``, ``codec`` (bool), ``backlog``."""
        _check_options("listen", options, ("max_buffer", "codec", "backlog"))
        name = _parse(uri)
        max_buffer = _positive_int("max_buffer", options.get("max_buffer", DEFAULT_MAX_BUFFER))
        backlog = _positive_int("backlog", options.get("backlog", DEFAULT_BACKLOG))
        codec = options.get("codec", False)
        if not isinstance(codec, bool):
            raise ValueError(f"inproc option codec must be a bool, got {codec!r}")
        if codec:
            _load_codec()  # fail here, not on the first connect, if it cannot be imported
        return self.hub._add(name, max_buffer=max_buffer, codec=codec, backlog=backlog)

    async def connect(
        self,
        uri: str,
        *,
        timeout: float,  # noqa: ASYNC109 (the interface takes it)
        **options: Any,
    ) -> InProcConnection:
        """Connect to the listener on ``uri``. Option: ``max_buffer``.

        Fails at once if nothing listens on the name; waits up to ``timeout`` seconds
        only while the listener's backlog is full.
        """
        _check_options("connect", options, ("max_buffer",))
        name = _parse(uri)
        max_buffer = _positive_int("max_buffer", options.get("max_buffer", DEFAULT_MAX_BUFFER))
        if not name:
            raise invalid_address(uri, "connect needs a name (only listen picks one)")
        hub = self.hub
        with anyio.move_on_after(timeout):
            while True:
                listener = hub.lookup(name)
                if listener is None:
                    raise ConnectFailed(uri, "nothing is listening on that inproc name")
                if len(listener._pending) < listener.backlog:
                    break
                await listener._wait_for_room()
            server, client = _connection_pair(
                listener.address,
                hub._client_address(name),
                server_max_buffer=listener.max_buffer,
                client_max_buffer=max_buffer,
                codec=listener.codec,
            )
            listener._enqueue(server)
            return client
        raise timed_out(uri, "no room in the listener's backlog (nobody accepts)", timeout)
