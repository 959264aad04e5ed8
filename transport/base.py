"""The one transport interface, its errors, and dispatch of addresses to backends.

What lives here: the abstract :class:`Connection` and :class:`Listener` every backend
implements, the :class:`Backend` interface, the registry of backends by URI scheme
(:func:`register_backend`), the top-level :func:`listen` and :func:`connect` that pick
a backend from an address such as ``inproc://name`` or ``ws://host:port/path``; the
typed transport errors live in :mod:`runtime.errors` and are re-exported here. No
backend lives here (see :mod:`transport.inproc`).

The unit of transfer is a :class:`runtime.codec.Frame`. Every connection is a pair of
ordered, reliable, bounded frame streams, one per direction:

* ``send`` waits (without spinning) while the peer has ``max_buffer`` of this
  connection's frames unread; that is the backpressure every backend provides.
* Closing either end ends both directions. Frames already sent are still delivered:
  the side that did not close can ``receive`` them, after which ``receive`` raises
  :class:`ConnectionClosed`; ``send`` raises :class:`ConnectionClosed` at once.
"""

from __future__ import annotations

import abc
import contextlib
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from runtime.codec import Frame
from runtime.errors import (
    CHECK_LISTENER,
    AddressInUse,
    ConnectFailed,
    ConnectionClosed,
    InvalidAddress,
    TransportError,
)

__all__ = [
    "CONNECT_TIMEOUT_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_BUFFER",
    "AddressInUse",
    "Backend",
    "ConnectFailed",
    "Connection",
    "ConnectionClosed",
    "Handler",
    "InvalidAddress",
    "Listener",
    "TransportError",
    "backend_for",
    "connect",
    "connect_timeout",
    "invalid_address",
    "listen",
    "register_backend",
    "registered_schemes",
    "split_address",
    "timed_out",
]

#: Frames a connection may have in flight (sent, not yet read by the peer) before
#: ``send`` waits. Backends take it as the ``max_buffer`` option of listen/connect.
DEFAULT_MAX_BUFFER = 1024

#: Seconds :func:`connect` waits for a connection before raising :class:`ConnectFailed`,
#: unless its caller or :data:`CONNECT_TIMEOUT_ENV` says otherwise.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: The environment variable that sets :func:`connect`'s default timeout (seconds), for
#: every process that connects: workers, consoles, clients.
CONNECT_TIMEOUT_ENV = "CORRAL_CONNECT_TIMEOUT"


def connect_timeout() -> float:
    """:func:`connect`'s default timeout: ``$CORRAL_CONNECT_TIMEOUT`` seconds if set, else
    :data:`DEFAULT_CONNECT_TIMEOUT`; a :class:`ValueError` saying so for a bad value."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{CONNECT_TIMEOUT_ENV}={text!r} is not a number of seconds > 0: set it to one "
            f"(such as 30), or unset it for the default {DEFAULT_CONNECT_TIMEOUT:g} s"
        )
    return value


def timed_out(uri: str, what: str, timeout: float) -> ConnectFailed:
    """The :class:`ConnectFailed` of a connection not made within ``timeout`` seconds:
    it says how to give it longer."""
    return ConnectFailed(
        uri,
        f"{what} within {timeout:g} s",
        f"{CHECK_LISTENER.removesuffix('.')}, or give the connection longer: "
        f"{CONNECT_TIMEOUT_ENV}=SECONDS in the environment of the worker, console or client "
        f"(default {DEFAULT_CONNECT_TIMEOUT:g}), or transport.connect(..., timeout=SECONDS).",
    )


# ----------------------------------------------------------------------------- interface


class Connection(abc.ABC):
    """One end of an ordered, reliable, bounded, bidirectional stream of frames.

    Contract for every backend:

    * ``send`` / ``send_many`` deliver frames in call order. They wait (without
      spinning) while the peer has ``max_buffer`` frames of ours unread. A send that
      is cancelled while waiting for room delivers nothing. After either side has
      closed they raise :class:`ConnectionClosed`.
    * ``send_many`` ships its frames as one batch: contiguously and in order. A batch
      waits for room for all of its frames (one larger than ``max_buffer`` waits for
      an empty buffer) and is then buffered whole.
    * ``receive`` returns the next frame, waiting for one. Once the peer has closed
      and everything it sent was received, it raises :class:`ConnectionClosed`; so
      does it after this side closed. Cancelling a waiting ``receive`` loses nothing.
    * ``async for frame in conn`` receives until the connection closes, then ends.
    * ``aclose`` is idempotent and wakes every task waiting on the connection.
    * ``async with conn:`` closes it on exit.
    """

    #: The address of this end (for a listener-accepted end, the listener's address).
    local_address: str
    #: The address of the other end (for a connecting end, the address it connected to).
    peer_address: str
    #: Frames this end may have unread at the peer before ``send`` waits.
    max_buffer: int

    @abc.abstractmethod
    async def send(self, frame: Frame) -> None:
        """Send one frame; wait while the peer has ``max_buffer`` frames unread."""

    @abc.abstractmethod
    async def send_many(self, frames: Sequence[Frame]) -> None:
        """Send ``frames`` as one contiguous, ordered batch (no-op if empty)."""

    @abc.abstractmethod
    async def receive(self) -> Frame:
        """The next frame; :class:`ConnectionClosed` once closed and drained."""

    @abc.abstractmethod
    async def aclose(self, reason: str = "", *, going_away: bool = False) -> None:
        """Close both directions. Idempotent; the peer can still drain what we sent.
        ``reason``: why, for the peer (its ``close_reason`` says it); empty for a
        normal close. ``going_away``: this side stops on purpose (a deliberate
        shutdown), which ``reason`` is not a complaint about the peer: a websocket
        closes with code 1001 (going away) instead of 1008 (policy violation)."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once either side has closed (sending is over; frames may remain to read)."""

    @property
    def send_room(self) -> int:
        """Frames a send may queue now without waiting (its credits; none while a
        backend that bounds the bytes it queues, ``ws://``, is at that bound)."""
        return self.max_buffer

    async def wait_send_room(self, frames: int) -> None:  # noqa: B027
        """Wait until ``frames`` may be sent without waiting (for more than
        ``max_buffer``: an empty buffer); return at once once closed."""

    @property
    def send_stalled(self) -> float:
        """Seconds this end's queue has been at its bound in bytes with nothing
        written meanwhile: a peer that reads nothing (0 for a backend without one)."""
        return 0.0

    def set_limits(self, *, max_message_bytes: int | None = None) -> None:  # noqa: B027
        """Raise what this connection accepts from its peer, once the application has
        authorized the peer (e.g. after a valid Hello): the largest message in bytes
        (None: the connection's own ``max_message_bytes``). A backend whose peers may
        be strangers (``ws://``) starts connections of untrusted roles with small limits
        until this is called; others have nothing to raise and ignore it.
        """

    def note_refusal(self, reason: str) -> None:  # noqa: B027
        """The application refuses this connection for ``reason`` (its Hello did not
        come in time, say) and will close it: a backend whose listener counts and logs
        refusals (``ws://``) counts it among them and logs it through its rate limit;
        others ignore it."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Frame:
        try:
            return await self.receive()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.local_address} -> {self.peer_address} {state}>"


#: A connection handler for :meth:`Listener.serve`.
Handler = Callable[[Connection], Awaitable[None]]


class Listener(abc.ABC):
    """Accepts connections on one address until closed.

    Closing a listener makes later connects to its address fail and frees the address;
    connections it already produced keep working. Connections that arrived but were
    not accepted yet are closed.
    """

    #: The address actually listened on (a fresh name or port filled in).
    address: str

    @abc.abstractmethod
    async def accept(self) -> Connection:
        """Wait for the next connection; :class:`ConnectionClosed` once the listener closed."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop listening. Idempotent; established connections are not affected."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""

    def set_tokens(self, tokens: Mapping[str, str]) -> None:  # noqa: B027
        """Take ``tokens`` (token -> role) from now on, in place of those it was made
        with (the manager restarted with new ones, say); connections already made stay.
        A backend without tokens ignores it."""

    async def serve(
        self,
        handler: Handler,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections and run ``handler(conn)`` for each in a task group.

        Use as ``await tg.start(listener.serve, handler)``: it reports started once it
        accepts. Each connection is closed when its handler returns. A handler ending in
        :class:`ConnectionClosed` just ends its connection; any other exception
        propagates out of ``serve`` and cancels the other handlers (catch errors in the
        handler if the server should outlive them). ``serve`` returns once the listener
        is closed and every handler has finished. It does not close the listener.
        """
        async with anyio.create_task_group() as tg:
            task_status.started()
            while True:
                try:
                    conn = await self.accept()
                except ConnectionClosed:
                    break
                tg.start_soon(_run_handler, handler, conn)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "listening"
        return f"<{type(self).__name__} {self.address} {state}>"


async def _run_handler(handler: Handler, conn: Connection) -> None:
    async with conn:
        with contextlib.suppress(ConnectionClosed):
            await handler(conn)


class Backend(abc.ABC):
    """Makes listeners and connections for the addresses of one or more URI schemes.

    Backends validate their own options and raise ``TypeError`` for unknown ones. Every
    backend accepts ``max_buffer`` (a positive int) on both ``listen`` and ``connect``.
    """

    @abc.abstractmethod
    async def listen(self, uri: str, **options: Any) -> Listener:
        """Listen on ``uri``; :class:`AddressInUse` or :class:`InvalidAddress` on failure."""

    @abc.abstractmethod
    async def connect(
        self,
        uri: str,
        *,
        timeout: float,  # noqa: ASYNC109 (the interface takes it)
        **options: Any,
    ) -> Connection:
        """Connect to ``uri`` within ``timeout`` seconds, else :class:`ConnectFailed`."""


# ----------------------------------------------------------------------------- dispatch

_BACKENDS: dict[str, Backend] = {}
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def register_backend(scheme: str, backend: Backend) -> Backend | None:
    """Route addresses ``scheme://...`` to ``backend``; returns the backend it replaced."""
    scheme = scheme.lower()
    if not _SCHEME.fullmatch(scheme):
        raise ValueError(f"invalid URI scheme {scheme!r}: use letters, digits, '+', '-', '.'")
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a transport.Backend, not {type(backend).__name__}")
    previous = _BACKENDS.get(scheme)
    _BACKENDS[scheme] = backend
    return previous


def registered_schemes() -> list[str]:
    """The URI schemes that have a backend, sorted."""
    return sorted(_BACKENDS)


def invalid_address(uri: str, reason: str) -> InvalidAddress:
    """The :class:`InvalidAddress` for ``uri``: every backend's says the same known
    schemes, those registered (:func:`registered_schemes`)."""
    return InvalidAddress(uri, reason, registered_schemes())


def split_address(uri: str) -> tuple[str, str]:
    """``"scheme://rest"`` -> ``("scheme", "rest")``; :class:`InvalidAddress` if malformed."""
    if not isinstance(uri, str):
        raise invalid_address(repr(uri), "the address must be a str")
    scheme, sep, rest = uri.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme.lower()):
        raise invalid_address(uri, "it has no scheme:// prefix")
    return scheme.lower(), rest


def backend_for(uri: str) -> Backend:
    """The backend registered for the scheme of ``uri``; :class:`InvalidAddress` if none."""
    scheme, _ = split_address(uri)
    try:
        return _BACKENDS[scheme]
    except KeyError:
        raise invalid_address(uri, f"no transport backend for scheme {scheme!r}") from None


async def listen(uri: str, **options: Any) -> Listener:
    """Listen on ``uri`` with the backend of its scheme; see :class:`Listener`.

    ``options`` go to the backend (every backend knows ``max_buffer``).
    """
    return await backend_for(uri).listen(uri, **options)


async def connect(
    uri: str,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the interface takes it)
    **options: Any,
) -> Connection:
    """Connect to ``uri`` with the backend of its scheme; see :class:`Connection`.

    Raises :class:`ConnectFailed` if no connection is made within ``timeout`` seconds
    (None: :func:`connect_timeout`; at once if nothing listens there). ``options`` go to
    the backend.
    """
    if timeout is None:
        timeout = connect_timeout()
    if not timeout > 0:
        raise ValueError(f"connect timeout must be > 0 seconds, got {timeout!r}")
    return await backend_for(uri).connect(uri, timeout=timeout, **options)
