"""The ``ws://`` and ``wss://`` transports: frames over aiohttp websockets.

What lives here: :class:`WebSocketBackend` (registered for ``ws`` and ``wss`` by
:mod:`transport`), its :class:`WebSocketListener` and :class:`WebSocketConnection`, and
:class:`AuthenticationFailed`. It implements the contract of :mod:`transport.base`
(bounded, ordered, reliable frame streams) and passes the same conformance suite as
``inproc://``. See ``docs/transport.md`` for the options and the rules.

Wire format. Every websocket message is binary; its first byte says what it is:

* ``0xC7`` (:data:`runtime.codec.MAGIC`): **data**, exactly the bytes of
  :func:`runtime.codec.encode` (one frame) or :func:`runtime.codec.encode_batch` (many).
  Every frame in it cost the sender one credit.
* ``0x01`` **credit**: ``>BI`` -- the receiver consumed that many more frames.
* ``0x02`` **chunk**: ``>BQ`` (the total length of the message being reassembled) and
  a slice of it. A data message longer than the sender's ``chunk_size`` travels as
  chunks; the receiver keeps them until the total is reached and then decodes them as
  one data message (:class:`runtime.codec.Pieces`: no buffer of the whole). Data
  messages never interleave with the chunks of another (that keeps frames in order),
  but credits and error replies do.
* ``0x03`` **error**: ``0x03`` + codec bytes of ``ErrorReply`` frames that report bad
  input. They are delivered to ``receive()`` like other frames but cost no credit.
* ``0x04`` **credit + data**: a credit message (``>BI``, type byte 0x04) followed by a
  data message: credits ride on outgoing data when there is some.

Design. Each connection runs a *pump* (in aiohttp's request-handler task on the
listening side, in a task of its own on the connecting side) made of a reader and a
writer. The application never touches the socket:

* ``send``/``send_many`` encode at once (a bad frame fails at the sender with
  ``ProtocolError``), spend credits -- waiting without spinning while there are none --
  and queue the bytes; they return before the peer has the frame. The writer sends
  queued data as soon as it runs, except that within ``batch_window`` seconds of the
  previous data message it waits for the window to end and then sends everything
  queued as one ``encode_batch`` message (capped at ``chunk_size`` bytes).
* Flow control is end to end, in frames: a sender starts with ``max_buffer`` credits
  and spends one per frame; the receiver's ``receive()`` returns one per frame consumed,
  coalesced into credit messages that overtake queued data and chunks. So the peer
  never holds more than ``max_buffer`` of our frames unread, whatever the OS buffers.
* The reader decodes every message as it arrives. Anything malformed (text messages,
  unknown message types, anything ``decode_batch`` rejects, inconsistent chunks or
  credits) is counted in ``bad_frames``, answered with an ``ErrorReply`` error message
  and dropped; the connection stays open until ``max_bad_frames``, when it is closed
  with websocket code 1008 (policy violation). A message over ``max_message_bytes``
  (or the connection's lower limit) closes it with code 1009 (message too big), a close
  reason naming the limit, and a warning logged (on the listening side through the
  listener's refusal log: a few lines, then a summary). aiohttp refuses a websocket message
  over its ``max_msg_size`` and closes by itself, without a reason: our subclasses of
  its websocket classes give that close the reason.
* Credits are enforced on receive: the handshake carries each end's ``max_buffer``
  (``Corral-Max-Buffer``), and a peer that sends more frames than it has credits for
  is closed with code 1008. A batch larger than ``max_buffer`` is written in pieces as
  credits come back.
* Memory per connection is bounded by role: a connection whose token role is not in
  ``trusted_roles`` starts *provisional*, accepting messages of at most
  ``initial_max_message_bytes`` (a larger one waits unread; a larger *first* message,
  which the application cannot read to authorize the peer, closes it with 1009) until
  the application calls :meth:`WebSocketConnection.set_limits`; its reassembly buffers
  grow with what arrives and its unread data is bounded in bytes. See
  docs/transport.md, "Memory per connection".
* Slow HTTP clients: a connection must complete its upgrade request within
  ``handshake_timeout``; at most ``max_handshakes`` incomplete ones are kept (the oldest
  is closed for a new one).
* Closing flushes what was queued, sends a close frame and waits (up to
  ``close_timeout``) for the peer's, so no frame whose ``send`` returned is lost to a
  TCP reset. The peer's reader sees the close after every frame sent before it.

Authentication happens in the HTTP upgrade request, before any frame is read: the
client sends ``Authorization: Bearer <token>``; a listener made with ``tokens`` answers
401 (no token) or 403 (a token it does not know) and the client raises
:class:`AuthenticationFailed`. Tokens are compared by ``hmac.compare_digest`` of their
SHA-256 digests, against every configured token.
"""

from __future__ import annotations

import asyncio
import asyncio.constants
import contextlib
import errno
import functools
import hashlib
import hmac
import ipaddress
import math
import os
import re
import socket
import ssl
import struct
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import aiohttp
import anyio
import anyio.lowlevel
from aiohttp import WSMsgType, web

from runtime.codec import (
    MAGIC,
    MAX_FRAME_BYTES,
    Frame,
    Pieces,
    decode_batch,
    encode,
    encode_batch,
    reply_ids,
)
from runtime.errors import AuthenticationFailed, ProtocolError, TooManyFrames
from runtime.log import get_logger
from runtime.messages import CORRAL_VERSION, UNREADABLE_REPLY, ErrorReply
from transport import tls
from transport.base import (
    DEFAULT_MAX_BUFFER,
    AddressInUse,
    Backend,
    ConnectFailed,
    Connection,
    ConnectionClosed,
    Listener,
    invalid_address,
    timed_out,
)
from transport.refusals import RefusalLog, Refused, RefusedSummary

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_BATCH_WINDOW",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_INITIAL_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_BAD_FRAMES",
    "DEFAULT_MAX_HANDSHAKES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_TRUSTED_ROLES",
    "SUBPROTOCOL",
    "AuthenticationFailed",
    "WebSocketBackend",
    "WebSocketConnection",
    "WebSocketListener",
]

SCHEMES: Final = ("ws", "wss")

#: Seconds the writer holds data after a data message so that more sends join the next.
DEFAULT_BATCH_WINDOW = 0.0005
#: Data messages longer than this many bytes travel in chunks of at most this size.
DEFAULT_CHUNK_SIZE = 1 << 20
#: Largest data message (whole or reassembled) a receiver accepts.
DEFAULT_MAX_MESSAGE_BYTES = MAX_FRAME_BYTES
#: Bytes of encoded frames a connection may have queued to send (not yet on the socket)
#: before its next send waits: a peer that reads slowly, or not at all, holds at most
#: this much (plus the one frame being queued) in this process, not ``max_buffer`` frames.
DEFAULT_MAX_QUEUED_BYTES = 16 << 20
#: Malformed messages a receiver answers before it closes the connection (code 1008).
DEFAULT_MAX_BAD_FRAMES = 10
#: Seconds of silence after which a websocket ping is sent (no pong in half that: lost).
DEFAULT_HEARTBEAT = 30.0
#: Seconds a close may take to flush and to hear the peer's close frame.
DEFAULT_CLOSE_TIMEOUT = 5.0
#: Connections that completed the handshake but were not accepted yet.
DEFAULT_BACKLOG = 1024
#: A plain HTTP GET route of a listener (its ``http_routes`` option): called with the
#: caller's role (None on a listener without tokens), answers (status, body, content type).
HttpRoute = Callable[[str | None], Awaitable[tuple[int, bytes, str]]]
#: A browser route of a listener (its ``web_routes`` option): an aiohttp handler called
#: with the request and the caller's role once the request is authenticated; it answers
#: with any aiohttp response, a ``web.WebSocketResponse`` included (a live page's feed).
WebRoute = Callable[[web.Request, str | None], Awaitable[web.StreamResponse]]
#: The query parameter that carries a token to a browser route once (then a cookie does).
TOKEN_PARAM = "token"
#: Largest data message a connection whose role is not trusted accepts until the
#: application raises its limits with :meth:`WebSocketConnection.set_limits`.
DEFAULT_INITIAL_MAX_MESSAGE_BYTES = 64 * 1024
#: Roles whose connections start with the full limits (no ``set_limits`` needed).
DEFAULT_TRUSTED_ROLES: tuple[str, ...] = ("admin",)
#: Seconds a new TCP connection has to complete the HTTP upgrade (TLS included).
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
#: TCP connections that have not completed the HTTP upgrade yet; beyond it the oldest
#: of them is closed.
DEFAULT_MAX_HANDSHAKES = 64

#: Websocket subprotocol both ends must agree on.
SUBPROTOCOL = "corral.v1"
#: HTTP header of the upgrade request and response: the sender's ``max_buffer`` (the
#: frames it may have in flight), which the receiving end enforces.
WINDOW_HEADER = "Corral-Max-Buffer"

_T_DATA: Final = MAGIC
_T_CREDIT: Final = 0x01
_T_CHUNK: Final = 0x02
_T_ERROR: Final = 0x03
_T_CREDIT_DATA: Final = 0x04
_CREDIT = struct.Struct(">BI")
_CHUNK = struct.Struct(">BQ")
_ERROR_PREFIX: Final = bytes([_T_ERROR])
_MAX_CREDIT_GRANT = 2**32 - 1
_MIN_CHUNK_SIZE = 1024
#: Bounds on the HTTP upgrade request (aiohttp's request line/field and header count).
_MAX_HTTP_LINE = 8190
_MAX_HTTP_HEADERS = 64

#: Websocket close codes used here.
CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_POLICY_VIOLATION: Final = 1008
CLOSE_MESSAGE_TOO_BIG: Final = 1009

#: Every this many sends or receives on a connection, one yields to the event loop.
_CHECKPOINT_EVERY = 64

_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: safe in an HTTP header

_log = get_logger("corral.transport.ws")
_checkpoint = anyio.lowlevel.checkpoint
_now = anyio.current_time


# ----------------------------------------------------------------------------- options


class _Options:
    """Validated options shared by listen and connect."""

    __slots__ = (
        "batch_window",
        "chunk_size",
        "close_timeout",
        "heartbeat",
        "max_bad_frames",
        "max_buffer",
        "max_message_bytes",
        "max_queued_bytes",
        "ssl_context",
    )

    def __init__(
        self, scheme: str, what: str, options: dict[str, Any], extra: Sequence[str]
    ) -> None:
        known = (
            "max_buffer",
            "batch_window",
            "chunk_size",
            "max_message_bytes",
            "max_queued_bytes",
            "max_bad_frames",
            "heartbeat",
            "close_timeout",
            "ssl_context",
            *extra,
        )
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(
                f"unknown {scheme} {what} option(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        self.max_buffer = _int_option("max_buffer", options, DEFAULT_MAX_BUFFER, 1)
        self.batch_window = _seconds_option("batch_window", options, DEFAULT_BATCH_WINDOW)
        self.chunk_size = _int_option("chunk_size", options, DEFAULT_CHUNK_SIZE, _MIN_CHUNK_SIZE)
        self.max_message_bytes = _int_option(
            "max_message_bytes", options, DEFAULT_MAX_MESSAGE_BYTES, 1
        )
        self.max_queued_bytes = _int_option(
            "max_queued_bytes", options, DEFAULT_MAX_QUEUED_BYTES, _MIN_CHUNK_SIZE
        )
        self.max_bad_frames = _int_option("max_bad_frames", options, DEFAULT_MAX_BAD_FRAMES, 1)
        self.heartbeat: float | None = None
        if options.get("heartbeat", DEFAULT_HEARTBEAT) is not None:
            self.heartbeat = _seconds_option("heartbeat", options, DEFAULT_HEARTBEAT, positive=True)
        self.close_timeout = _seconds_option(
            "close_timeout", options, DEFAULT_CLOSE_TIMEOUT, positive=True
        )
        ctx = options.get("ssl_context")
        if ctx is not None and not isinstance(ctx, ssl.SSLContext):
            raise ValueError(f"ws option ssl_context must be an ssl.SSLContext, got {ctx!r}")
        if scheme == "ws" and ctx is not None:
            raise ValueError(
                "ssl_context was given for a ws:// address; use wss:// for TLS, or drop it"
            )
        if scheme == "wss" and ctx is None:  # from the environment (transport/tls.py)
            ctx = tls.server_context() if what == "listen" else tls.client_context()
        if scheme == "wss" and ctx is None and what == "listen":
            raise ValueError(
                "listening on wss:// needs a certificate: --tls-cert FILE (and --tls-key) "
                f"on the command line, ${tls.TLS_CERT_ENV} (and ${tls.TLS_KEY_ENV}), or "
                "ssl_context=<ssl.SSLContext with the server's certificate chain loaded> "
                "(see ssl.create_default_context(Purpose.CLIENT_AUTH))"
            )
        self.ssl_context: ssl.SSLContext | None = ctx


def _int_option(name: str, options: dict[str, Any], default: int, minimum: int) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"ws option {name} must be an int >= {minimum}, got {value!r}")
    return value


def _seconds_option(
    name: str, options: dict[str, Any], default: float, *, positive: bool = False
) -> float:
    value = options.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"ws option {name} must be a number of seconds {bound}, got {value!r}")
    return float(value)


class _ListenLimits:
    """Validated listen-only options that bound what strangers can hold."""

    __slots__ = (
        "handshake_timeout",
        "initial_max_message_bytes",
        "max_handshakes",
        "trusted_roles",
    )

    def __init__(self, options: dict[str, Any], max_message_bytes: int) -> None:
        self.handshake_timeout = _seconds_option(
            "handshake_timeout", options, DEFAULT_HANDSHAKE_TIMEOUT, positive=True
        )
        self.max_handshakes = _int_option("max_handshakes", options, DEFAULT_MAX_HANDSHAKES, 1)
        self.initial_max_message_bytes = min(
            _int_option(
                "initial_max_message_bytes", options, DEFAULT_INITIAL_MAX_MESSAGE_BYTES, 1024
            ),
            max_message_bytes,
        )
        roles = options.get("trusted_roles", DEFAULT_TRUSTED_ROLES)
        if isinstance(roles, str) or not all(isinstance(r, str) for r in roles):
            raise ValueError(
                f"ws option trusted_roles must be a collection of role names, got {roles!r}"
            )
        self.trusted_roles = frozenset(roles)


def _parse_window(text: str | None) -> int | None:
    """The peer's announced max_buffer (absent: the default); None if malformed."""
    if text is None:
        return DEFAULT_MAX_BUFFER
    text = text.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 10):
        return None
    value = int(text)
    return value if 1 <= value <= _MAX_CREDIT_GRANT else None


def _check_token(token: object, what: str) -> str:
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ValueError(
            f"{what} must be a non-empty str of visible ASCII characters (no spaces), "
            f"got {type(token).__name__}"
        )
    return token


#: what a listener's ``refused_by`` counts a connection closed for a message over its
#: limit (code 1009) under
TOO_BIG: Final = "message too big"
#: a refused handshake's status -> the reason its log line and summary give, and back
_REFUSAL_REASONS: Final = {401: "no token", 403: "bad token"}
_REFUSAL_STATUS: Final = {reason: status for status, reason in _REFUSAL_REASONS.items()}


def _token_digest(token: str) -> bytes:
    """The digest tokens are compared by. A token from a request may hold any code point:
    aiohttp decodes header bytes that are not UTF-8 as lone surrogates, which
    ``surrogatepass`` encodes (such a token matches none: tokens are visible ASCII)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


# ----------------------------------------------------------------------------- addresses


def _parse(uri: str, *, listening: bool) -> tuple[str, str, int, str]:
    """``ws://host:port/path`` -> (scheme, host, port, path); :class:`InvalidAddress` if bad."""
    if not isinstance(uri, str):
        raise invalid_address(repr(uri), "the address must be a str")
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise invalid_address(uri, "the websocket backend serves ws:// and wss:// only")
    hostport, slash, path = rest.partition("/")
    path = slash + path
    if any(c in rest for c in "?#@ \t\r\n\\"):
        raise invalid_address(
            uri, "a ws address is scheme://host:port[/path] without user, query or fragment"
        )
    if hostport.startswith("["):
        host, bracket, port_text = hostport[1:].partition("]")
        if not bracket or not port_text.startswith(":"):
            raise invalid_address(uri, "an IPv6 address needs the form [addr]:port")
        port_text = port_text[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise invalid_address(uri, f"{host!r} is not an IPv6 address") from None
    else:
        host, colon, port_text = hostport.rpartition(":")
        if not colon or ":" in host:
            raise invalid_address(uri, "a ws address needs an explicit :port (0 picks a free one)")
    if not host:
        raise invalid_address(uri, "a ws address needs a host, such as 127.0.0.1")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise invalid_address(uri, f"port {port_text!r} is not a number in 0..65535")
    port = int(port_text)
    if port == 0 and not listening:
        raise invalid_address(uri, "connect needs the real port (only listen picks one with :0)")
    return scheme, host, port, path


def _format(scheme: str, host: str, port: int, path: str) -> str:
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{path}"


def _sockaddr(scheme: str, info: object) -> str:
    if isinstance(info, tuple) and len(info) >= 2:
        return _format(scheme, str(info[0]), int(info[1]), "")
    return f"{scheme}://unknown"


# ----------------------------------------------------------------------------- connection


class _Free:
    """A received frame that cost the peer no credit (an error reply)."""

    __slots__ = ("frame",)

    def __init__(self, frame: Frame) -> None:
        self.frame = frame


class _Out:
    """A queued send: its encoded bytes, its frames (for merging into one batch, or
    sending a batch larger than the credits in pieces) and their ``count``; ``size``,
    the bytes it counts toward ``max_queued_bytes`` until it leaves the queue. A single
    frame of over half a chunk keeps no frames (``()``): it never merges, and its
    objects (a 1 MB listing is ~7 MB of them) are not held while it waits."""

    __slots__ = ("count", "data", "frames", "size")

    def __init__(
        self, data: bytes, frames: Sequence[Frame], size: int | None = None, count: int = 0
    ) -> None:
        self.data = data
        self.frames = frames
        self.count = count or len(frames)
        self.size = len(data) if size is None else size


def _queued(data: bytes, frames: Sequence[Frame], chunk_size: int) -> _Out:
    """The queue entry for ``frames`` encoded as ``data`` (see :class:`_Out`)."""
    if len(frames) == 1 and len(data) > chunk_size // 2:
        return _Out(data, (), count=1)
    return _Out(data, frames)


class WebSocketConnection(Connection):
    """One end of a websocket connection; see :class:`transport.base.Connection`.

    Besides the interface it exposes ``role`` (the role of the token the peer presented,
    on the listening side of an authenticated listener; else None), its options, and
    counters: ``messages_sent``/``messages_received`` (websocket messages of every
    kind), ``frames_sent``/``frames_received``, ``bytes_sent``/``bytes_received``,
    ``chunks_sent``/``chunks_received``, ``credits_sent`` (credit messages) and
    ``bad_frames`` (malformed messages received); and ``last_received``/``last_sent``,
    the ``anyio.current_time()`` of the last websocket message of any kind received or
    sent. Chunks count, so while a large frame is on the wire ``last_received`` keeps
    moving although no whole frame arrives: liveness checks should look at it.
    """

    # Counters are plain attributes (documented above) so tests and metrics can read them.
    messages_sent: int
    messages_received: int
    frames_sent: int
    frames_received: int
    bytes_sent: int
    bytes_received: int
    chunks_sent: int
    chunks_received: int
    credits_sent: int
    bad_frames: int
    last_received: float
    last_sent: float

    def __init__(
        self,
        ws: Any,
        *,
        local_address: str,
        peer_address: str,
        options: _Options,
        role: str | None = None,
        session: aiohttp.ClientSession | None = None,
        peer_window: int = DEFAULT_MAX_BUFFER,
        initial_limit: int | None = None,
        message_limit: int | None = None,
    ) -> None:
        self.local_address = local_address
        self.peer_address = peer_address
        self.role = role
        self.max_buffer = options.max_buffer
        self.batch_window = options.batch_window
        self.chunk_size = options.chunk_size
        self.max_message_bytes = options.max_message_bytes
        # Receive limits. A trusted connection accepts messages up to max_message_bytes
        # at once. One that is not (``initial_limit`` given: a role not trusted by the
        # listener) starts *provisional* at ``initial_limit``: a larger message waits,
        # unread, until the application calls set_limits (or the connection closes),
        # and its unread data is bounded in bytes (see _budget_full).
        self.trusted = initial_limit is None
        self.receive_limit = (
            options.max_message_bytes
            if initial_limit is None
            else min(initial_limit, options.max_message_bytes)
        )
        self._provisional = not self.trusted
        self._unread_bytes = 0  # wire bytes of the frames in the inbox (untrusted only)
        self._costs: deque[list[int]] | None = None if self.trusted else deque()
        self._resume: anyio.Event | None = None  # the reader waits for room or limits
        #: The peer's max_buffer (from the handshake): frames it may have in flight.
        self.peer_window = peer_window
        self._peer_in_flight = 0  # frames received and not yet credited back
        self.max_bad_frames = options.max_bad_frames
        self.close_timeout = options.close_timeout
        self._ws = ws  # aiohttp WebSocketResponse or ClientWebSocketResponse
        # The most one websocket message may carry (aiohttp refuses a larger one before
        # we see it, and closes with 1009: ``too_big_reason`` is that close's reason).
        self.message_limit = options.max_message_bytes if message_limit is None else message_limit
        if isinstance(ws, _ServerWebSocket | _ClientWebSocket):
            ws.too_big_reason = f"message too big: over {self._limit_text(self.message_limit)}"
        self._session = session
        #: the listening side's note of a refusal of this connection: (reason, its own
        #: log line) -> counted among the listener's refusals, the line logged if the
        #: listener's refusal log gives it one (None, connecting side: logged as is)
        self._on_refusal: Callable[[str, Callable[[], None]], None] | None = None
        # sending
        self._credit = options.max_buffer  # frames we may still send before the peer reads
        # Frames the writer may still put on the wire: a batch larger than max_buffer
        # is queued whole (``_credit`` goes negative) and written in pieces as the
        # peer's credits come back, so the peer never has more than max_buffer in flight.
        self._wire_credit = options.max_buffer
        self._pending: deque[_Out] = deque()  # queued data, credits already spent
        self._room: anyio.Event | None = None  # a sender waits for credit
        self._queued = 0  # frames ever queued (the writer watches it grow while gathering)
        #: bytes queued to send (data not yet on the socket); at max_queued_bytes a send waits
        self.max_queued_bytes = options.max_queued_bytes
        self._queued_bytes = 0
        self._over_since: float | None = None  # since when queued bytes are at the bound
        # receiving
        self._inbox: deque[Frame | _Free] = deque()
        self._readable: anyio.Event | None = None  # a receiver waits for a frame
        self._grant = 0  # frames consumed and not yet credited back
        self._asm: Pieces | None = None  # chunked message being reassembled
        self._asm_total = 0
        # writer
        self._wake: anyio.Event | None = None  # the writer waits for work
        self._control: deque[bytes] = deque()  # error replies; they overtake data
        self._big: memoryview | None = None  # data message being sent in chunks
        self._big_head = b""
        self._big_offset = 0
        # state
        self._send_reason: str | None = None  # why sending is over (None: open)
        self._recv_reason: str | None = None  # why no more frames will arrive
        self._close_request: tuple[int, str] | None = None  # close frame we will send
        self._closed_here = False
        self._dead = False  # the socket is finished: nothing more is read or written
        self._write_scope: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._ops = 0
        self._task: asyncio.Task[None] | None = None  # the pump, on the connecting side
        self.messages_sent = self.messages_received = 0
        self.frames_sent = self.frames_received = 0
        self.bytes_sent = self.bytes_received = 0
        self.chunks_sent = self.chunks_received = 0
        self.credits_sent = 0
        self.bad_frames = 0
        self.last_received = self.last_sent = _now()

    @property
    def closed(self) -> bool:
        return self._send_reason is not None

    @property
    def unread(self) -> int:
        """Frames received and not yet taken by :meth:`receive` (at most the peer's
        ``max_buffer``, plus error replies)."""
        return len(self._inbox)

    @property
    def close_reason(self) -> str | None:
        """Why the connection ended (None while it is open)."""
        return self._recv_reason

    @property
    def unread_bytes(self) -> int:
        """Wire bytes of the frames received and not yet taken (counted on connections
        that are not trusted; 0 on trusted ones)."""
        return self._unread_bytes

    def set_limits(self, *, max_message_bytes: int | None = None) -> None:
        """Set what this connection accepts from the peer, once the application has
        authorized it (e.g. after a valid Hello): the largest data message, whole or
        reassembled from chunks (None, or anything larger: the connection's
        ``max_message_bytes``, its ceiling). A connection whose role the listener does
        not trust starts with the listener's ``initial_max_message_bytes`` and holds a
        larger message unread until this is called; after it, a larger message closes
        the connection (code 1009). On a connection that is not trusted, unread data
        stays bounded in bytes by the limit set here (see docs/transport.md, "Memory
        per connection").
        """
        ceiling = self.max_message_bytes
        limit = ceiling if max_message_bytes is None else max_message_bytes
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_message_bytes must be an int >= 1, got {max_message_bytes!r}")
        self.receive_limit = min(limit, ceiling)
        self._provisional = False
        self._wake_reader()

    def note_refusal(self, reason: str) -> None:
        """The application refused this connection for ``reason`` (no Hello in time,
        say) and closes it: the listener counts it among its refusals
        (``refused_by[reason]``) and logs it through its refusal log, a few lines and
        then a summary, like a refused handshake."""
        self._refusal(reason, "refused a websocket connection after its handshake", reason=reason)

    def _refusal(self, counted_as: str, event: str, **fields: Any) -> None:
        """This side closes the connection (counted as ``counted_as``): the warning
        ``event`` (with ``fields``), through the listener's refusal log on the
        listening side."""

        def line() -> None:
            _log.warning(
                event, local=self.local_address, peer=self.peer_address, role=self.role, **fields
            )

        if self._on_refusal is None:
            line()
        else:
            self._on_refusal(counted_as, line)

    # -- sending ------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        if self._ops >= _CHECKPOINT_EVERY:
            self._ops = 0
            await _checkpoint()
        self._ops += 1
        if self._send_reason is not None:
            raise self._send_error()
        data = encode(frame, max_bytes=self.max_message_bytes)
        if self._credit < 1 or self._queued_bytes >= self.max_queued_bytes:
            await self._wait_for_room(1)
        self._credit -= 1
        self._queued += 1
        self._pending.append(_queued(data, (frame,), self.chunk_size))
        self._hold(len(data))
        ev = self._wake
        if ev is not None:
            self._wake = None
            ev.set()

    async def send_many(self, frames: Sequence[Frame]) -> None:
        if self._ops >= _CHECKPOINT_EVERY:
            self._ops = 0
            await _checkpoint()
        self._ops += 1
        if self._send_reason is not None:
            raise self._send_error()
        n = len(frames)
        if n == 0:
            return
        frames = tuple(frames)
        data = encode_batch(frames, max_bytes=self.max_message_bytes)
        if not self._fits(n):
            await self._wait_for_room(n)
        self._credit -= n
        self._queued += n
        self._pending.append(_queued(data, frames, self.chunk_size))
        self._hold(len(data))
        self._wake_writer()

    @property
    def send_room(self) -> int:
        """Frames a send may queue now without waiting: the credits left, none while
        ``max_queued_bytes`` are queued (or once closed)."""
        if self._send_reason is not None or self._queued_bytes >= self.max_queued_bytes:
            return 0
        return max(self._credit, 0)

    @property
    def queued_bytes(self) -> int:
        """Bytes queued to send, not yet on the socket (a send waits at ``max_queued_bytes``)."""
        return self._queued_bytes

    @property
    def send_stalled(self) -> float:
        """Seconds the queue has been at ``max_queued_bytes`` with nothing written to
        the socket meanwhile (0: it is under the bound, or data goes out): a peer that
        reads nothing."""
        since = self._over_since
        if since is None:
            return 0.0
        return _now() - max(since, self.last_sent)

    async def wait_send_room(self, frames: int) -> None:
        """Wait until ``frames`` may be sent without waiting (``send_room``, or every
        credit back for more than ``max_buffer``); return at once if closed."""
        with contextlib.suppress(ConnectionClosed):
            await self._wait_for_room(frames)

    def _fits(self, n: int) -> bool:
        # A batch larger than max_buffer waits for an empty peer buffer, then goes whole.
        # Bytes: under the bound, one more message may go (of any size a frame may be).
        return (
            self._credit >= n or self._credit >= self.max_buffer
        ) and self._queued_bytes < self.max_queued_bytes

    async def _wait_for_room(self, n: int) -> None:
        while not self._fits(n):
            if self._send_reason is not None:
                raise self._send_error()
            ev = self._room
            if ev is None:
                ev = self._room = anyio.Event()
            await ev.wait()
        if self._send_reason is not None:
            raise self._send_error()

    def _hold(self, size: int) -> None:
        """``size`` more bytes are queued to send."""
        self._queued_bytes += size
        if self._over_since is None and self._queued_bytes >= self.max_queued_bytes:
            self._over_since = _now()

    def _release(self, size: int) -> None:
        """``size`` queued bytes went to the socket (or were dropped): a sender waiting
        for the queue to go under ``max_queued_bytes`` may go on."""
        self._queued_bytes = max(self._queued_bytes - size, 0)
        if self._queued_bytes < self.max_queued_bytes:
            self._over_since = None
            ev = self._room
            if ev is not None:
                self._room = None
                ev.set()

    def _send_error(self) -> ConnectionClosed:
        return ConnectionClosed(self.local_address, self._send_reason or "closed")

    # -- receiving ----------------------------------------------------------------

    async def receive(self) -> Frame:
        if self._ops >= _CHECKPOINT_EVERY:
            self._ops = 0
            await _checkpoint()
        self._ops += 1
        inbox = self._inbox
        while not inbox:
            if self._recv_reason is not None:
                raise ConnectionClosed(self.local_address, self._recv_reason)
            ev = self._readable
            if ev is None:
                ev = self._readable = anyio.Event()
            await ev.wait()
        item = inbox.popleft()
        if self._costs is not None:
            self._spend()
        if type(item) is _Free:
            return item.frame
        self._grant += 1
        if self._wake is not None:
            self._wake_writer()
        return item  # type: ignore[return-value]

    def _spend(self) -> None:
        """One unread frame was taken: release its message's bytes with its last frame."""
        costs = self._costs
        assert costs is not None
        cost = costs[0]
        cost[0] -= 1
        if cost[0] <= 0:
            costs.popleft()
            self._unread_bytes -= cost[1]
            if self._resume is not None and not self._budget_full():
                self._wake_reader()

    def _budget_full(self) -> bool:
        """On a connection that is not trusted the reader reads nothing more while the
        unread frames came in at least ``receive_limit`` wire bytes: unread data stays
        under twice the limit, whatever the peer sends."""
        return self._costs is not None and self._unread_bytes >= self.receive_limit

    def _wake_reader(self) -> None:
        ev = self._resume
        if ev is not None:
            self._resume = None
            ev.set()

    async def _reader_wait(self, ready: Callable[[], bool]) -> bool:
        """Wait (reading nothing) until ``ready()``; False if the connection ended."""
        while not ready():
            if self._dead or self._closed_here:
                return False
            ev = self._resume
            if ev is None:
                ev = self._resume = anyio.Event()
            await ev.wait()
        return not self._dead

    # -- closing ------------------------------------------------------------------

    async def aclose(self, reason: str = "", *, going_away: bool = False) -> None:
        """Close; with ``reason`` the close is code 1008 (policy violation) carrying the
        reason's first 123 bytes, which the peer's ``close_reason`` shows; with
        ``going_away`` too (this side stops on purpose), code 1001 (going away)."""
        if not self._closed_here:
            self._closed_here = True
            self._inbox.clear()  # never read now; the peer learns of the close instead
            self._grant = 0
            if self._costs is not None:
                self._costs.clear()
                self._unread_bytes = 0
            ours = f"closed by this side: {reason}" if reason else "closed by this side"
            if self._recv_reason is None:
                self._recv_reason = ours
            if reason:
                text = reason.encode()[:123].decode(errors="ignore")
                code = CLOSE_GOING_AWAY if going_away else CLOSE_POLICY_VIOLATION
                self._request_close(code, text, ours)
            else:
                self._request_close(CLOSE_NORMAL, "closed by the peer", ours)
        await self._done.wait()

    def _request_close(self, code: int, message: str, reason: str) -> None:
        """Stop sending; the pump flushes what was queued and closes with ``code``."""
        if self._send_reason is None:
            self._send_reason = reason
        if self._close_request is None and not self._dead:
            self._close_request = (code, message)
            if self._write_scope is not None:
                self._write_scope.deadline = _now() + self.close_timeout
        self._wake_all()

    def _end(self, reason: str) -> None:
        """The socket is finished: fail senders, let receivers drain and then fail."""
        self._dead = True
        if self._write_scope is not None:
            self._write_scope.cancel()  # nothing more can be written
        if self._send_reason is None:
            self._send_reason = reason
        if self._recv_reason is None:
            self._recv_reason = reason
        self._pending.clear()
        self._control.clear()
        self._big = None
        self._queued_bytes = 0
        self._over_since = None
        self._wake_all()

    def _wake_all(self) -> None:
        for ev in (self._room, self._readable, self._wake, self._resume):
            if ev is not None:
                ev.set()
        self._room = self._readable = self._wake = self._resume = None

    def _wake_writer(self) -> None:
        ev = self._wake
        if ev is not None:
            self._wake = None
            ev.set()

    # -- the pump -------------------------------------------------------------------

    def _start(self) -> None:
        """Run the pump in a task of its own (connecting side)."""
        self._task = asyncio.get_running_loop().create_task(
            self._pump(), name=f"corral ws pump {self.local_address} -> {self.peer_address}"
        )

    async def _pump(self) -> None:
        """Read and write until the connection ends; then close the socket."""
        ws = self._ws
        reading = anyio.CancelScope()
        reader_done = anyio.Event()

        async def read() -> None:
            try:
                with reading:
                    await self._read_loop()
            finally:
                reader_done.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                with anyio.CancelScope() as scope:
                    self._write_scope = scope
                    if self._close_request is not None:
                        scope.deadline = _now() + self.close_timeout
                    await self._write_loop()
                self._write_scope = None
                request = self._close_request
                if request is not None and not self._dead and not ws.closed:
                    await self._close_handshake(request, reading, reader_done)
                reading.cancel()
        except Exception as exc:  # a bug, or aiohttp raising something unexpected
            _log.warning("websocket connection failed", local=self.local_address, error=repr(exc))
            self._end(f"the connection failed ({type(exc).__name__}: {exc})")
        finally:
            with anyio.CancelScope(shield=True):
                if not ws.closed:
                    with anyio.move_on_after(self.close_timeout):
                        await ws.close(code=CLOSE_GOING_AWAY, message=b"")
                if self._session is not None:
                    await self._session.close()
            self._end(self._send_reason or "closed")
            self._done.set()

    async def _close_handshake(
        self, request: tuple[int, str], reading: anyio.CancelScope, reader_done: anyio.Event
    ) -> None:
        """Send our close frame and wait (up to ``close_timeout``) for the peer's.

        Only then is the TCP connection closed, so it is not reset while the peer still
        reads what we sent. aiohttp's two ends need different handling: the listening
        side's ``close()`` waits for the peer's close frame only if no ``receive()`` is
        pending, so the reader is stopped first; the connecting side's ``close()`` stops
        a pending ``receive()`` itself (the reader sees CLOSING and returns), and would
        skip the wait if that ``receive()`` had been cancelled instead.
        """
        ws = self._ws
        with anyio.move_on_after(self.close_timeout):
            if isinstance(ws, web.WebSocketResponse):
                reading.cancel()
                await reader_done.wait()
            await ws.close(code=request[0], message=request[1].encode()[:120])

    async def _write_loop(self) -> None:
        ws = self._ws
        try:
            while not self._dead:
                if self._control:
                    await self._send_bytes(ws, self._control.popleft())
                elif self._big is not None:
                    if self._grant and self._send_reason is None:
                        await self._send_credit(ws)  # between chunks: the peer may wait
                    else:
                        await self._send_chunk(ws)
                elif self._pending and self._wire_credit > 0:
                    if self.batch_window and self._close_request is None:
                        await self._gather()
                    batch = self._take_batch()
                    if len(batch) == 1 and len(batch[0]) > self.chunk_size:
                        # Sent a chunk at a time; later data waits until the last chunk
                        # is out, credits and error replies go in between.
                        if self._grant and self._send_reason is None:
                            await self._send_credit(ws)
                        self._big = memoryview(batch[0])
                        self._hold(len(batch[0]))  # released a chunk at a time
                        self._big_head = _CHUNK.pack(_T_CHUNK, len(batch[0]))
                        self._big_offset = 0
                        await self._send_chunk(ws)
                    else:
                        for data in batch:
                            if self._grant and self._send_reason is None:
                                n = self._take_grant()
                                data = b"".join((_CREDIT.pack(_T_CREDIT_DATA, n), data))
                            await self._send_bytes(ws, data)
                elif self._grant and self._send_reason is None:
                    await self._send_credit(ws)
                elif self._close_request is not None and not self._pending:
                    return  # everything queued went out
                else:
                    ev = self._wake = anyio.Event()
                    await ev.wait()
        except Exception as exc:  # the socket broke under us
            if not self._dead:
                self._end(f"the connection to {self.peer_address} was lost ({exc})")

    async def _gather(self) -> None:
        """Let sends join the next message while they keep coming, up to ``batch_window``.

        The writer yields to the event loop (no timer: the loop's timers are only as fine
        as a millisecond) and goes on gathering while every pass queued more frames.
        """
        deadline = _now() + self.batch_window
        seen = self._queued
        while True:
            await _checkpoint()
            if self._queued == seen or self._close_request is not None or self._dead:
                return
            if self._credit <= 0 or _now() >= deadline:
                return
            seen = self._queued

    def _take_grant(self) -> int:
        n = min(self._grant, _MAX_CREDIT_GRANT)
        self._grant -= n
        self._peer_in_flight -= n
        return n

    async def _send_credit(self, ws: Any) -> None:
        await self._send_bytes(ws, _CREDIT.pack(_T_CREDIT, self._take_grant()))
        self.credits_sent += 1

    def _take_batch(self) -> list[bytes]:
        """The next data message(s) to send: queued sends merged up to ``chunk_size``
        and up to the frames the peer has room for (``_wire_credit`` > 0)."""
        pending = self._pending
        credit = self._wire_credit
        first = pending[0]
        n = first.count
        if n > credit:
            # A batch larger than max_buffer: send what the peer has room for, keep the
            # rest at the head of the queue (encoded when it goes).
            head = first.frames[:credit]
            pending[0] = _Out(b"", first.frames[credit:], first.size)  # counted till it goes
            self._wire_credit = 0
            self.frames_sent += credit
            return [encode_batch(head)]
        pending.popleft()
        self._release(first.size)
        if not first.data:  # the rest of a split batch
            first = _Out(encode_batch(first.frames), first.frames)
        credit -= n
        self.frames_sent += n
        if not pending or len(first.data) >= self.chunk_size:
            self._wire_credit = credit
            return [first.data]
        items = [first]
        size = len(first.data)
        limit = self.chunk_size
        while (
            pending
            and pending[0].data
            and size + len(pending[0].data) <= limit
            and pending[0].frames
            and first.frames
            and pending[0].count <= credit
        ):
            item = pending.popleft()
            self._release(item.size)
            items.append(item)
            size += len(item.data)
            credit -= item.count
            self.frames_sent += item.count
        self._wire_credit = credit
        if len(items) == 1:
            return [first.data]
        try:
            return [encode_batch([f for item in items for f in item.frames])]
        except ProtocolError:
            # Only possible if a message was mutated after send(): ship what was checked.
            return [item.data for item in items]

    async def _send_chunk(self, ws: Any) -> None:
        big = self._big
        assert big is not None
        start = self._big_offset
        end = min(start + self.chunk_size, len(big))
        self._big_offset = end
        if end >= len(big):
            self._big = None
        await self._send_bytes(ws, b"".join((self._big_head, big[start:end])))
        self._release(end - start)
        self.chunks_sent += 1
        await _checkpoint()  # let the application and the reader run between chunks

    async def _send_bytes(self, ws: Any, data: bytes) -> None:
        await ws.send_bytes(data)
        self.last_sent = _now()
        self.messages_sent += 1
        self.bytes_sent += len(data)

    # -- reading ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        ws = self._ws
        while True:
            if self._budget_full() and not await self._reader_wait(self._budget_room):
                return
            msg = await ws.receive()
            kind = msg.type
            if kind is WSMsgType.BINARY:
                data = msg.data
                self.last_received = _now()
                self.messages_received += 1
                self.bytes_received += len(data)
                announced = self._announced(data) if self._provisional else 0
                if announced > self.receive_limit:
                    if not self.frames_received:
                        # The application authorizes a connection by what it sent
                        # first (a Hello): a first message it may not read yet can
                        # never be read.
                        self._too_big(announced)
                        return
                    if not await self._reader_wait(self._limits_set):
                        return
                if not self._on_message(data):
                    return
            elif kind is WSMsgType.TEXT:
                self.last_received = _now()
                self.messages_received += 1
                if not self._bad("a text message; Corral sends binary messages only"):
                    return
            elif kind is WSMsgType.CLOSE:
                self._end(self._peer_closed_reason(msg.data, msg.extra))
                return
            elif kind is WSMsgType.ERROR:
                self._end(self._error_reason(msg.data))
                return
            elif kind is WSMsgType.CLOSED or kind is WSMsgType.CLOSING:
                if self._close_request is None:  # else: our own close() stopped the reader
                    self._end(f"the connection to {self.peer_address} was lost (no close frame)")
                return
            # PING and PONG are answered by aiohttp (autoping)

    def _peer_closed_reason(self, code: object, text: object) -> str:
        reason = f"closed by the peer {self.peer_address}"
        if code != CLOSE_NORMAL:
            reason += f" (websocket close code {code}"
            reason += f": {text})" if text else ")"
        return reason

    def _error_reason(self, exc: object) -> str:
        code = getattr(exc, "code", None)
        if code == CLOSE_MESSAGE_TOO_BIG:
            self._log_too_big(self.message_limit, None)
            return (
                f"closed by this side: the peer {self.peer_address} sent a message over "
                f"{self._limit_text(self.message_limit)} (websocket close code 1009, "
                "message too big)"
            )
        if isinstance(exc, TimeoutError):  # aiohttp's heartbeat: no pong in time
            return (
                f"the peer {self.peer_address} did not answer the heartbeat ping in time "
                f"({exc}); it is gone or its event loop is blocked"
            )
        return f"the connection to {self.peer_address} was lost ({exc})"

    def _budget_room(self) -> bool:
        return not self._budget_full()

    def _limits_set(self) -> bool:
        return not self._provisional

    def _announced(self, data: bytes) -> int:
        """The size of the data message ``data`` starts (0 if it starts none)."""
        if not data:
            return 0
        kind = data[0]
        if kind == _T_DATA:
            return len(data)
        if kind == _T_CREDIT_DATA:
            return len(data) - _CREDIT.size
        if kind == _T_CHUNK and self._asm is None and len(data) > _CHUNK.size:
            return int(_CHUNK.unpack_from(data)[1])
        return 0

    def _on_message(self, data: bytes) -> bool:
        """Handle one binary message; False once the connection must close."""
        if not data:
            return self._bad("an empty message")
        kind = data[0]
        if kind == _T_DATA:
            if self._asm is not None:
                self._asm = None
                return self._bad("a data message arrived in the middle of a chunked one")
            if len(data) > self.receive_limit:
                self._too_big(len(data))
                return False
            return self._deliver(data, credited=True)
        if kind == _T_CREDIT:
            if len(data) != _CREDIT.size:
                return self._bad(f"a credit message of {len(data)} bytes (expected {_CREDIT.size})")
            problem = self._apply_credit(data)
            return True if problem is None else self._bad(problem)
        if kind == _T_CREDIT_DATA:
            if len(data) <= _CREDIT.size or data[_CREDIT.size] != _T_DATA:
                return self._bad("a credit-and-data message without data after the credit")
            problem = self._apply_credit(data)
            if problem is not None:
                return self._bad(problem)
            if self._asm is not None:
                self._asm = None
                return self._bad("a data message arrived in the middle of a chunked one")
            if len(data) - _CREDIT.size > self.receive_limit:
                self._too_big(len(data) - _CREDIT.size)
                return False
            return self._deliver(memoryview(data)[_CREDIT.size :], credited=True)
        if kind == _T_CHUNK:
            return self._on_chunk(data)
        if kind == _T_ERROR:
            return self._deliver(memoryview(data)[1:], credited=False)
        return self._bad(
            f"unknown transport message type 0x{kind:02x} (expected data 0x{_T_DATA:02x}, "
            f"credit 0x{_T_CREDIT:02x}, chunk 0x{_T_CHUNK:02x}, error 0x{_T_ERROR:02x} or "
            f"credit + data 0x{_T_CREDIT_DATA:02x})"
        )

    def _deliver(self, data: bytes | memoryview | Pieces, *, credited: bool) -> bool:
        room = self.peer_window - self._peer_in_flight if credited else None
        try:
            frames = decode_batch(data, max_bytes=self.receive_limit, max_frames=room)
        except TooManyFrames as exc:  # more frames than credits: flow control broken
            self._over_credit(exc.message)
            return False
        except ProtocolError as exc:  # a malformed message (a field "n" of its own too)
            self._fail_replies(data, exc.message)
            return self._bad(exc.message, reply=credited)
        except Exception as exc:  # decode_batch promises ProtocolError; be safe anyway
            return self._bad(f"undecodable message ({type(exc).__name__}: {exc})", reply=credited)
        if self._closed_here:
            return True  # closed by the application: nobody will read them
        n = len(frames)
        self.frames_received += n
        if credited:
            self._peer_in_flight += n
            self._inbox.extend(frames)
        else:
            self._inbox.extend(_Free(f) for f in frames)
        if self._costs is not None:
            size = len(data)
            self._costs.append([n, size])
            self._unread_bytes += size
        ev = self._readable
        if ev is not None:
            self._readable = None
            ev.set()
        return True

    def _fail_replies(self, data: bytes | memoryview | Pieces, problem: str) -> None:
        """Replies in refused data: their asks on this side fail now, with the problem,
        instead of waiting out their timeouts (an ask's reply that cannot be read)."""
        ids = reply_ids(data, max_bytes=self.receive_limit)
        if not ids or self._closed_here:
            return
        text = f"the reply could not be read: {problem}"
        error = ErrorReply(UNREADABLE_REPLY, text)
        self._inbox.extend(_Free(Frame(error, reply_to=r)) for r in ids)
        ev = self._readable
        if ev is not None:
            self._readable = None
            ev.set()

    def _apply_credit(self, data: bytes) -> str | None:
        """Take the credit grant at the start of ``data``; the problem if it is invalid."""
        _, n = _CREDIT.unpack_from(data)
        room = self.max_buffer - self._wire_credit
        if not 0 < n <= room:
            return f"a credit grant of {n} frames, but only {room} of our frames were unread"
        self._credit += n
        self._wire_credit += n
        ev = self._room
        if ev is not None:
            self._room = None
            ev.set()
        if self._pending:  # a large batch may wait for these to go on
            self._wake_writer()
        return None

    def _over_credit(self, problem: str) -> None:
        """The peer sent more frames than it had credits for: close (code 1008)."""
        self.bad_frames += 1
        reason = (
            f"closed by this side: the peer {self.peer_address} sent more frames than its "
            f"credits allow (it may have at most max_buffer={self.peer_window} unread, "
            f"{self._peer_in_flight} were): {problem} (websocket close code 1008)"
        )
        _log.warning("peer exceeded its credits", peer=self.peer_address, problem=problem[:200])
        self._recv_reason = self._recv_reason or reason
        self._request_close(
            CLOSE_POLICY_VIOLATION,
            f"policy violation: more frames than credits (max_buffer={self.peer_window})",
            reason,
        )

    def _on_chunk(self, data: bytes) -> bool:
        if len(data) <= _CHUNK.size:
            self._asm = None
            return self._bad("a chunk message without data")
        _, total = _CHUNK.unpack_from(data)
        asm = self._asm
        if asm is None:
            if total > self.receive_limit:
                self._too_big(total)
                return False
            # The chunks are kept as they came, and decoded as they are: the codec
            # copies each buffer of the message out of them once (no buffer of the
            # whole made, zero-filled, filled and copied again). What it holds is what
            # the peer really sent, never what it announced.
            asm = self._asm = Pieces()
            self._asm_total = total
        elif total != self._asm_total:
            self._asm = None
            return self._bad(
                f"a chunk of a {total}-byte message while a {self._asm_total}-byte one was "
                "being reassembled"
            )
        piece = memoryview(data)[_CHUNK.size :]
        end = asm.size + len(piece)
        if end > total:
            self._asm = None
            return self._bad(f"chunks longer than the announced total of {total} bytes")
        if end < total and len(piece) < _MIN_CHUNK_SIZE:
            # Each chunk kept costs some hundred bytes besides its data: tiny ones would
            # make a connection hold many times what its peer sent. A sender's chunks
            # are its chunk_size (at least this) but the last.
            self._asm = None
            return self._bad(
                f"a chunk of {len(piece)} bytes before the last of its message: chunks are "
                f"at least {_MIN_CHUNK_SIZE} bytes (the least chunk_size) but the last"
            )
        asm.append(piece)
        self.chunks_received += 1
        if end < total:
            return True
        self._asm = None
        if asm.cut(0, 1)[0] != _T_DATA:
            return self._bad("a chunked message that is not a data message")
        return self._deliver(asm, credited=True)

    def _limit_text(self, limit: int) -> str:
        """The receive limit ``limit`` in words: which setting it is, and its value."""
        if limit == self.max_message_bytes:
            return f"max_message_bytes={limit}"
        return (
            f"this connection's limit of {limit} bytes (max_message_bytes={self.max_message_bytes})"
        )

    def _log_too_big(self, limit: int, size: int | None) -> None:
        self._refusal(
            TOO_BIG,
            "closed a websocket connection: a message over its size limit (code 1009)",
            limit=self._limit_text(limit),
            **({} if size is None else {"size": size}),
        )

    def _too_big(self, size: int) -> None:
        self.bad_frames += 1
        what = self._limit_text(self.receive_limit)
        self._log_too_big(self.receive_limit, size)
        reason = (
            f"closed by this side: the peer {self.peer_address} announced a {size}-byte message, "
            f"over {what} (websocket close code 1009)"
        )
        self._recv_reason = self._recv_reason or reason
        self._request_close(CLOSE_MESSAGE_TOO_BIG, f"message too big: over {what}", reason)

    def _bad(self, problem: str, *, reply: bool = True) -> bool:
        """Count a malformed message, answer it, and close after ``max_bad_frames``."""
        self.bad_frames += 1
        n = self.bad_frames
        limit = self.max_bad_frames
        _log.warning(
            "dropped a malformed websocket message",
            local=self.local_address,
            peer=self.peer_address,
            count=n,
            problem=problem[:200],
        )
        if reply and self._send_reason is None:
            text = (
                f"malformed message dropped ({n} of at most {limit} before the connection "
                f"is closed): {problem}"
            )
            answer = encode(Frame(ErrorReply("ProtocolError", text)))
            self._control.append(_ERROR_PREFIX + answer)
            self._wake_writer()
        if n < limit:
            return True
        reason = (
            f"closed by this side: the peer {self.peer_address} sent {n} malformed messages "
            "(websocket close code 1008, policy violation)"
        )
        self._recv_reason = self._recv_reason or reason
        self._request_close(
            CLOSE_POLICY_VIOLATION, f"policy violation: {n} malformed messages", reason
        )
        return False


# ----------------------------------------------------------------------------- aiohttp


def _close_text(ws: _ServerWebSocket | _ClientWebSocket, code: int, message: bytes) -> bytes:
    """The close text to send: aiohttp closes by itself, with no text, on a message over
    its ``max_msg_size``; that close gets ``ws.too_big_reason`` (at most 123 bytes)."""
    if code == CLOSE_MESSAGE_TOO_BIG and not message:
        return ws.too_big_reason.encode()[:123]
    return message


class _ServerWebSocket(web.WebSocketResponse):
    """aiohttp's server websocket, whose close on a message too big says why."""

    too_big_reason = ""

    async def close(
        self, *, code: int = CLOSE_NORMAL, message: bytes = b"", drain: bool = True
    ) -> bool:
        message = _close_text(self, code, message)
        return await super().close(code=code, message=message, drain=drain)


class _ClientWebSocket(aiohttp.ClientWebSocketResponse):
    """aiohttp's client websocket, whose close on a message too big says why."""

    too_big_reason = ""

    async def close(self, *, code: int = CLOSE_NORMAL, message: bytes = b"") -> bool:
        return await super().close(code=code, message=_close_text(self, code, message))


# ----------------------------------------------------------------------------- listener


class WebSocketListener(Listener):
    """Listens on ``ws://host:port[/path]`` (or ``wss://``) with an aiohttp web server.

    Counters: ``connections`` (handshakes completed) and ``refused`` (handshakes
    refused: authentication, backlog full, closing, not a websocket request; and
    connections closed after it, for a message over their limit or by the application,
    :meth:`WebSocketConnection.note_refusal`), ``refused_by`` (the same by reason).
    """

    def set_tokens(self, tokens: Mapping[str, str]) -> None:
        """Accept ``tokens`` (token -> role) from now on, in place of the others (a
        listener made without tokens takes none: it stays open)."""
        if self.auth_required:
            for token in tokens:
                _check_token(token, "every token in tokens")
            self._tokens: list[tuple[bytes, str]] = [
                (_token_digest(t), role) for t, role in tokens.items()
            ]

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        path: str,
        *,
        options: _Options,
        tokens: Mapping[str, str] | None,
        backlog: int,
        guard: _ListenLimits,
        http_routes: Mapping[str, HttpRoute] | None = None,
        web_routes: Mapping[str, WebRoute] | None = None,
    ) -> None:
        self.scheme = scheme
        self.http_routes = dict(http_routes or {})
        self.web_routes = dict(web_routes or {})
        #: connections of web route requests being answered (closed with the listener)
        self._browsing: set[Any] = set()
        self.host = host
        self.path = path
        self.port = port  #: the port listened on (known once started)
        self.address = _format(scheme, host, port, path)
        self.options = options
        self.max_buffer = options.max_buffer
        self.backlog = backlog
        self.auth_required = tokens is not None
        self._tokens = []
        if tokens is not None:
            self.set_tokens(tokens)
        self.guard = guard
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._upgrading: set[Any] = set()  # aiohttp handlers whose request is complete
        self._pending: deque[WebSocketConnection] = deque()
        self._live: set[WebSocketConnection] = set()
        self._arrived: anyio.Event | None = None
        self._closed = False
        self.connections = 0
        self.refused = 0
        #: refused requests by reason (no token, bad token, closing, cross-origin, ...)
        self.refused_by: Counter[str] = Counter()
        self.evicted = 0
        #: which refused handshakes get a log line (the rest: a summary a minute)
        self.refusal_log = RefusalLog()
        self._refusal_flush: asyncio.TimerHandle | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def handshaking(self) -> int:
        """TCP connections that have not sent a complete HTTP upgrade request yet."""
        return len(self._waiting())

    def _waiting(self) -> list[Any]:
        runner = self._runner
        server = runner.server if runner is not None else None
        if server is None:
            return []
        upgrading = self._upgrading
        return [h for h in server.connections if h.transport is not None and h not in upgrading]

    def _admit(self) -> None:
        """A TCP connection arrives: beyond ``max_handshakes`` connections that have not
        completed their HTTP request, close the oldest of them (a slow or idle client
        cannot hold the door for others; a real handshake takes milliseconds)."""
        waiting = self._waiting()
        excess = len(waiting) + 1 - self.guard.max_handshakes
        for handler in waiting[: max(excess, 0)]:
            self.evicted += 1
            handler.force_close()
        if excess > 0:
            _log.warning(
                "too many connections without a complete HTTP request; closed the oldest",
                address=self.address,
                closed=excess,
                limit=self.guard.max_handshakes,
            )

    async def _start(self, port: int) -> None:
        app = web.Application()
        app.router.add_get(self.path or "/", self._handle)
        for route in self.http_routes:
            app.router.add_get(route, self._plain)
        for route in self.web_routes:
            if route != (self.path or "/"):  # else _handle tells the two apart
                app.router.add_get(route, self._web)
        # aiohttp's keep-alive timer starts when a connection is made and closes it if no
        # complete request arrived by then: the header read timeout (slow or idle
        # clients). A websocket, once upgraded, is not subject to it.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.guard.handshake_timeout,
            max_line_size=_MAX_HTTP_LINE,
            max_field_size=_MAX_HTTP_LINE,
            max_headers=_MAX_HTTP_HEADERS,
        )
        await runner.setup()
        bind = "127.0.0.1" if self.host == "localhost" else self.host
        site = _GuardedSite(
            runner,
            bind,
            port,
            ssl_context=self.options.ssl_context,
            backlog=512,
            admit=self._admit,
            ssl_handshake_timeout=self.guard.handshake_timeout,
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(self.address) from None
            raise invalid_address(
                self.address, f"cannot listen there ({exc.strerror or exc})"
            ) from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        self.port = port
        if port == 0:
            self.port = int(runner.addresses[0][1])
            self.address = _format(self.scheme, self.host, self.port, self.path)

    async def accept(self) -> Connection:
        while not self._pending:
            if self._closed:
                raise ConnectionClosed(self.address, "the listener was closed")
            ev = self._arrived
            if ev is None:
                ev = self._arrived = anyio.Event()
            await ev.wait()
        return self._pending.popleft()

    def _refused_later(self, peer: str, reason: str, line: Callable[[], None]) -> None:
        """A connection from ``peer`` was closed after its handshake for ``reason`` (a
        message over its limit; the application's refusal, e.g. no Hello in time):
        counted among the refusals, logged by ``line`` if :attr:`refusal_log` says so."""
        self.refused += 1
        self.refused_by[reason] += 1
        self._log_refusals(self.refusal_log.refused(_now(), peer, reason), line)

    def _log_refusals(
        self, lines: Sequence[Refused | RefusedSummary], own: Callable[[], None] | None = None
    ) -> None:
        """Log what :attr:`refusal_log` said to (a refusal's own line: ``own``, else a
        refused handshake's), and wake at its next summary's time."""
        for line in lines:
            if isinstance(line, Refused) and own is not None:
                own()
            elif isinstance(line, Refused):
                _log.warning(
                    "refused a websocket handshake",
                    address=self.address,
                    peer=line.peer,
                    status=_REFUSAL_STATUS[line.reason],
                    reason=line.reason,
                )
            else:
                _log.warning(
                    line.text(),
                    address=self.address,
                    not_logged_one_by_one=line.unlogged,
                )
        due = self.refusal_log.due
        if due is not None and self._refusal_flush is None and not self._closed:
            self._refusal_flush = asyncio.get_running_loop().call_later(
                max(due - _now(), 0.0), self._flush_refusals
            )

    def _flush_refusals(self, *, closing: bool = False) -> None:
        self._refusal_flush = None
        self._log_refusals(self.refusal_log.flush(_now(), closing=closing))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._refusal_flush is not None:
            self._refusal_flush.cancel()
        self._flush_refusals(closing=True)
        ev = self._arrived
        if ev is not None:
            self._arrived = None
            ev.set()
        while self._pending:
            conn = self._pending.popleft()
            conn._request_close(
                CLOSE_GOING_AWAY,
                "the listener was closed before accepting this connection",
                "closed by this side: the listener was closed before accepting it",
            )
        site, runner = self._site, self._runner
        self._site = None
        if site is not None:
            await site.stop()  # frees the port; established connections go on
        for transport in list(self._browsing):  # a web route's websocket ends with it
            transport.close()
        if runner is not None and not self._live:
            self._runner = None
            await runner.cleanup()

    def _refuse(
        self, status: int, text: str, challenge: str = "", *, reason: str = ""
    ) -> web.Response:
        """A refusal to send (``reason``: what :attr:`refused_by` counts it under; by
        default the token's, for a 401 or a 403)."""
        self.refused += 1
        self.refused_by[reason or _REFUSAL_REASONS[status]] += 1
        headers = {"WWW-Authenticate": challenge} if challenge else None
        response = web.Response(status=status, text=text + "\n", headers=headers)
        response.force_close()
        return response

    @property
    def cookie_name(self) -> str:
        """The cookie that carries a browser's token: one per port (cookies are not)."""
        return f"corral_token_{self.port}"

    def _role_of(self, token: str) -> str | None:
        digest = _token_digest(token)
        role: str | None = None
        for known, known_role in self._tokens:  # no early exit: same time for every token
            if hmac.compare_digest(known, digest):
                role = known_role
        return role

    def _authenticate(
        self, request: web.Request, *, browser: bool = False
    ) -> tuple[str | None, web.Response | None]:
        """(role, None) if the request may connect, else (None, refusal). A ``browser``
        route also takes the token from ``?token=`` or from the listener's cookie."""
        if not self.auth_required:
            return None, None
        header = request.headers.get("Authorization", "")
        if not header and browser:
            token = request.query.get(TOKEN_PARAM) or request.cookies.get(self.cookie_name, "")
            if not token:
                return None, self._refuse(
                    401,
                    "this page needs a token of this Corral manager: open the URL the "
                    f"manager printed at its start (it ends in ?{TOKEN_PARAM}=...), or send "
                    "'Authorization: Bearer <token>'",
                    'Bearer realm="corral"',
                )
        else:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if not header:
                return None, self._refuse(
                    401,
                    "this Corral listener requires a token: send 'Authorization: Bearer <token>'",
                    'Bearer realm="corral"',
                )
            if scheme.lower() != "bearer" or not token:
                return None, self._refuse(
                    401,
                    "malformed Authorization header: expected 'Bearer <token>'",
                    'Bearer realm="corral", error="invalid_request"',
                )
        role = self._role_of(token)
        if role is None:
            hint = (
                " (did the manager restart with new tokens?): open the URL the manager "
                "printed at its start"
                if browser
                else ""
            )
            return None, self._refuse(
                403,
                "the token is not valid for this Corral listener" + hint,
                'Bearer realm="corral", error="invalid_token"',
            )
        return role, None

    async def _web(self, request: web.Request) -> web.StreamResponse:
        """A request to one of ``web_routes`` (for browsers): refused across origins (a
        page of another site or port may not use this browser's cookie), authenticated
        by header, ``?token=`` or cookie. A token in the URL is moved into an HttpOnly,
        SameSite=Lax cookie and the browser sent back to the URL without it (Lax: a link
        to the page followed from another site, an alert's dashboard link in a chat or a
        mail, opens it; that site's own requests, frames and websockets get no cookie)."""
        if self._closed:
            return self._refuse(503, "this Corral listener is closing", reason="closing")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            return self._refuse(
                403, f"cross-origin request from {origin} refused", reason="cross-origin"
            )
        role, refusal = self._authenticate(request, browser=True)
        if refusal is not None:
            return refusal
        token = request.query.get(TOKEN_PARAM)
        if token and self.auth_required:
            rest = [(k, v) for k, v in request.query.items() if k != TOKEN_PARAM]
            moved = web.Response(
                status=303, headers={"Location": str(request.rel_url.with_query(rest))}
            )
            moved.set_cookie(
                self.cookie_name, token, path="/", httponly=True, samesite="Lax",
                secure=self.scheme == "wss",
            )  # fmt: skip
            return moved
        transport = request.transport
        if transport is not None:
            self._browsing.add(transport)
        try:
            with self._complete(request):  # an open dashboard page is no slowloris
                return await self.web_routes[request.path](request, role)
        finally:
            self._browsing.discard(transport)

    async def _plain(self, request: web.Request) -> web.StreamResponse:
        """A plain HTTP GET of one of ``http_routes``, authenticated like a handshake
        (401 without a token, 403 with one it does not know); the route's answer then
        says what the token's role may see."""
        if self._closed:
            return self._refuse(503, "this Corral listener is closing", reason="closing")
        role, refusal = self._authenticate(request)
        if refusal is not None:
            return refusal
        route = self.http_routes[request.path]
        with self._complete(request):
            status, body, content_type = await route(role)
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    @contextlib.contextmanager
    def _complete(self, request: web.Request) -> Iterator[None]:
        """While ``request`` is served, its connection sent a complete HTTP request: it
        does not count among the handshakes ``max_handshakes`` bounds (a slow or idle
        client's), so an open dashboard page or a slow scrape is never closed for one."""
        handler = request.protocol
        self._upgrading.add(handler)
        try:
            yield
        finally:
            self._upgrading.discard(handler)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path in self.web_routes and not _is_upgrade(request):
            return await self._web(request)  # a page at the websocket's own path
        with self._complete(request):
            return await self._serve(request)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        if self._closed:
            return self._refuse(503, "this Corral listener is closing", reason="closing")
        role, refusal = self._authenticate(request)
        if refusal is not None:
            reason = _REFUSAL_REASONS[refusal.status]
            self._log_refusals(self.refusal_log.refused(_now(), request.remote or "?", reason))
            return refusal
        offered = _offered_subprotocols(request)
        if offered and SUBPROTOCOL not in offered:  # a client of another version
            _log.warning(
                "refused a websocket handshake: version mismatch",
                address=self.address,
                peer=request.remote,
                offered=", ".join(offered),
            )
            return self._refuse(
                400,
                f"version mismatch: the client offers websocket subprotocol "
                f"{', '.join(offered)}; this listener speaks {SUBPROTOCOL} (Corral "
                f"{CORRAL_VERSION}). Run the same Corral version on both ends.",
                reason="version mismatch",
            )
        if len(self._pending) >= self.backlog:
            return self._refuse(
                503,
                "this Corral listener's backlog is full (nobody accepts)",
                reason="backlog full",
            )
        window = _parse_window(request.headers.get(WINDOW_HEADER))
        if window is None:
            return self._refuse(
                400,
                f"malformed {WINDOW_HEADER} header: expected an int in 1..{_MAX_CREDIT_GRANT}",
                reason="bad request",
            )
        options = self.options
        trusted = not self.auth_required or role in self.guard.trusted_roles
        initial = None if trusted else self.guard.initial_max_message_bytes
        # aiohttp buffers one websocket message before we see it. A peer that is not
        # trusted gets no more than one chunk's worth there: larger messages must come
        # in chunks, which we reassemble under its (provisional) limit.
        ws_limit = options.max_message_bytes
        if not trusted:
            ws_limit = min(ws_limit, max(options.chunk_size, self.guard.initial_max_message_bytes))
        ws = _ServerWebSocket(
            timeout=options.close_timeout,
            autoclose=True,
            autoping=True,
            heartbeat=options.heartbeat,
            protocols=(SUBPROTOCOL,),
            compress=False,
            max_msg_size=ws_limit + _CHUNK.size + 1,  # aiohttp refuses a message of this size
        )
        if not ws.can_prepare(request).ok:
            return self._refuse(
                400, "this is a Corral websocket endpoint: connect with ws://", reason="bad request"
            )
        ws.headers[WINDOW_HEADER] = str(options.max_buffer)
        try:
            await ws.prepare(request)
        except ConnectionError as exc:  # aiohttp would log its traceback
            # The client closed before its answer was written (gave up waiting for a
            # listener whose process was paused, say): one line, not a traceback.
            _log.info(
                "websocket handshake abandoned: the client closed its connection first",
                address=self.address, peer=request.remote, error=str(exc),
            )  # fmt: skip
            return web.Response(status=400)  # (not sent: aiohttp ignores its failure)
        transport = request.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        conn = WebSocketConnection(
            ws,
            local_address=self.address,
            peer_address=_sockaddr(self.scheme, peer),
            options=options,
            role=role,
            peer_window=window,
            initial_limit=initial,
            message_limit=ws_limit,
        )
        conn._on_refusal = functools.partial(self._refused_later, request.remote or "?")
        self.connections += 1
        self._live.add(conn)
        if self._closed:  # closed while the handshake was under way
            conn._request_close(
                CLOSE_GOING_AWAY,
                "the listener was closed before accepting this connection",
                "closed by this side: the listener was closed before accepting it",
            )
        else:
            self._pending.append(conn)
            ev = self._arrived
            if ev is not None:
                self._arrived = None
                ev.set()
        try:
            await conn._pump()
        finally:
            self._live.discard(conn)
        return ws


def _offered_subprotocols(request: web.Request) -> list[str]:
    """The websocket subprotocols a handshake offers (``Sec-WebSocket-Protocol``, comma
    separated, in one header or several): Corral's clients offer :data:`SUBPROTOCOL`,
    a browser's page none."""
    return [
        p.strip()
        for header in request.headers.getall("Sec-WebSocket-Protocol", ())
        for p in header.split(",")
        if p.strip()
    ]


def _is_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


class _GuardedSite(web.TCPSite):
    """aiohttp's TCPSite, with a hook run as each TCP connection arrives (before its
    protocol exists) and a bound on the TLS handshake."""

    __slots__ = ("_admit", "_ssl_handshake_timeout")

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        admit: Callable[[], None],
        ssl_handshake_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._admit = admit
        self._ssl_handshake_timeout = ssl_handshake_timeout

    async def start(self) -> None:
        # As TCPSite.start, with a protocol factory that admits each connection first.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        admit = self._admit

        def factory() -> Any:
            admit()
            return server()

        ssl_context = self._ssl_context
        self._server = await asyncio.get_running_loop().create_server(
            factory,
            self._host,
            self._port,
            ssl=ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._ssl_handshake_timeout if ssl_context else None,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


# ----------------------------------------------------------------------------- backend


class WebSocketBackend(Backend):
    """The ``ws://host:port[/path]`` and ``wss://`` backend (aiohttp websockets).

    ``listen`` options: ``max_buffer``, ``batch_window``, ``chunk_size``,
    ``max_message_bytes``, ``max_bad_frames``, ``heartbeat``, ``close_timeout``,
    ``ssl_context`` (required for wss://), ``tokens`` (token -> role; None: no
    authentication), ``trusted_roles``, ``initial_max_message_bytes``,
    ``handshake_timeout``, ``max_handshakes``, ``backlog`` and ``http_routes`` (path ->
    :data:`HttpRoute`: plain HTTP GETs served besides the websocket, authenticated as
    handshakes are) and ``web_routes`` (path -> :data:`WebRoute`: routes for browsers,
    websockets included, that also take the token from ``?token=`` once, then from a
    cookie). ``connect`` takes the first eight, plus ``token``. See
    ``docs/transport.md``.
    """

    async def listen(self, uri: str, **options: Any) -> WebSocketListener:
        scheme, host, port, path = _parse(uri, listening=True)
        tokens = options.pop("tokens", None)
        http_routes = options.pop("http_routes", None)
        web_routes = options.pop("web_routes", None)
        backlog = options.pop("backlog", DEFAULT_BACKLOG)
        names = _ListenLimits.__slots__
        limits = {k: options.pop(k) for k in names if k in options}
        opts = _Options(
            scheme, "listen", options, ("tokens", "backlog", "http_routes", "web_routes", *names)
        )
        guard = _ListenLimits(limits, opts.max_message_bytes)
        if isinstance(backlog, bool) or not isinstance(backlog, int) or backlog < 1:
            raise ValueError(f"ws option backlog must be an int >= 1, got {backlog!r}")
        if tokens is not None:
            if not isinstance(tokens, Mapping):
                raise ValueError(
                    "ws option tokens must be a mapping of token -> role (or None for no "
                    f"authentication), got {type(tokens).__name__}"
                )
            for token, role in tokens.items():
                _check_token(token, "every token in tokens")
                if not isinstance(role, str):
                    raise ValueError(f"the role of a token must be a str, got {role!r}")
            tokens = dict(tokens)
        listener = WebSocketListener(
            scheme, host, port, path, options=opts, tokens=tokens, backlog=backlog, guard=guard,
            http_routes=http_routes, web_routes=web_routes,
        )  # fmt: skip
        await listener._start(port)
        return listener

    async def connect(
        self,
        uri: str,
        *,
        timeout: float,  # noqa: ASYNC109 (the interface takes it)
        **options: Any,
    ) -> WebSocketConnection:
        scheme, host, port, path = _parse(uri, listening=False)
        token = options.pop("token", None)
        opts = _Options(scheme, "connect", options, ("token",))
        headers: dict[str, str] = {WINDOW_HEADER: str(opts.max_buffer)}
        if token is not None:
            headers["Authorization"] = f"Bearer {_check_token(token, 'token')}"
        url = _format(scheme, host, port, path or "/")
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=timeout),
            trust_env=False,
            ws_response_class=_ClientWebSocket,
        )
        ws: Any = None
        try:
            with anyio.move_on_after(timeout):
                ws = await session.ws_connect(
                    url,
                    protocols=(SUBPROTOCOL,),
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=opts.close_timeout),
                    autoclose=True,
                    autoping=True,
                    heartbeat=opts.heartbeat,
                    headers=headers,
                    ssl=(opts.ssl_context or True) if scheme == "wss" else False,
                    compress=0,
                    max_msg_size=opts.max_message_bytes + _CHUNK.size + 1,
                )
            if ws is None:
                raise timed_out(uri, "no websocket connection", timeout)
            if ws.protocol != SUBPROTOCOL:
                await ws.close()
                raise ConnectFailed(
                    uri,
                    f"the server there is not a Corral listener (it did not accept the "
                    f"{SUBPROTOCOL!r} websocket subprotocol)",
                )
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await session.close()
            if isinstance(exc, aiohttp.ClientError | OSError):
                raise _connect_error(uri, exc, token is not None, host, timeout) from None
            raise
        # The listener's max_buffer (absent from a listener that is not Corral's: the
        # default). aiohttp keeps the handshake response only as a private attribute.
        response = getattr(ws, "_response", None)
        announced = response.headers.get(WINDOW_HEADER) if response is not None else None
        window = _parse_window(announced)
        if window is None:
            await ws.close()
            with anyio.CancelScope(shield=True):
                await session.close()
            raise ConnectFailed(uri, f"the listener sent a malformed {WINDOW_HEADER} header")
        conn = WebSocketConnection(
            ws,
            local_address=_sockaddr(scheme, ws.get_extra_info("sockname")),
            peer_address=uri,
            options=opts,
            session=session,
            peer_window=window,
        )
        conn._start()
        return conn


#: errnos of a connection the other end reset or closed under us: it had taken it, so
#: something listens there
_CUT_OFF: Final = frozenset({errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE})
#: why a listener cuts off a connection in its handshake (a missing listener refuses it)
CUT_OFF_HINT: Final = (
    "Something listens there (it took the TCP connection): a Corral listener closes "
    "connections in their handshake when it is overloaded, e.g. by many half-open "
    "connections (its log then says 'too many connections without a complete HTTP "
    "request; closed the oldest'); an SSH tunnel (ssh -L) or a proxy does it when its far "
    "side cannot reach the listener: check that the manager runs there, at the host and "
    "port the tunnel forwards to (ssh prints 'open failed'). Retrying may help."
)


#: why a listener takes a connection and does not answer its TLS handshake
TLS_STALLED_HINT: Final = (
    "Something listens there (it took the TCP connection) but does not answer: a manager "
    "whose process is stopped (SIGSTOP, a suspended job) or whose event loop is blocked, "
    "or a network that drops packets once connected. A longer connect timeout does not "
    "lengthen a TLS handshake past this limit; retrying does wait on."
)


def _cut_off(uri: str, code: int) -> ConnectFailed:
    return ConnectFailed(
        uri,
        f"the listener closed the connection during the websocket handshake ({os.strerror(code)})",
        CUT_OFF_HINT,
    )


#: how OpenSSL reports a server that answered a TLS hello with something else (a plain
#: HTTP listener answers ``400 Bad Request``, in plain text)
_NOT_TLS = "WRONG_VERSION_NUMBER"


def _verify_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind an aiohttp TLS error, if it is one."""
    for inner in (getattr(exc, "certificate_error", None), getattr(exc, "os_error", None)):
        if isinstance(inner, ssl.SSLCertVerificationError):
            return inner
    return None


def _connect_error(
    uri: str, exc: BaseException, had_token: bool, host: str, timeout: float
) -> ConnectFailed:
    plain = uri.startswith("ws://")
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        status = exc.status
        if status == 401:
            if had_token:
                why = "the listener did not accept the Authorization header (HTTP 401)"
            else:
                why = "the listener requires a token and none was given (HTTP 401)"
            return AuthenticationFailed(uri, why, 401)
        if status == 403:
            return AuthenticationFailed(
                uri, "the listener refused the token: it matches none of its tokens (HTTP 403)", 403
            )
        if status == 404:
            return ConnectFailed(uri, "nothing listens on that path (HTTP 404)")
        if status == 503:
            return ConnectFailed(uri, "the listener is closing or its backlog is full (HTTP 503)")
        return ConnectFailed(uri, f"the websocket handshake failed (HTTP {status}: {exc.message})")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        if getattr(getattr(exc, "os_error", None), "reason", None) == _NOT_TLS:
            return ConnectFailed(
                uri,
                f"the TLS handshake failed: the server answered in plain text, not TLS "
                f"([SSL: {_NOT_TLS}]), as a plain ws:// listener answers a TLS hello",
                f"If it is a plain ws:// listener (a manager whose --listen is not wss://), "
                f"connect with {'ws' + uri.removeprefix('wss')}; for TLS, start it with "
                "wss:// and a certificate (--tls-cert, docs/security.md#tls).",
            )
        verify = _verify_error(exc)
        if verify is not None:
            return ConnectFailed(
                uri,
                f"the TLS handshake failed: this side did not accept the server's certificate "
                f"({verify.verify_message or verify})",
                tls.certificate_hint(verify.verify_code, host),
            )
        return ConnectFailed(
            uri,
            f"the TLS handshake failed ({exc})",
            "Check that a wss:// listener runs at that address with a certificate (its "
            "--tls-cert) and that this side's TLS settings accept it (docs/security.md#tls).",
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, socket.gaierror):
            return ConnectFailed(
                uri,
                f"the host name {host!r} could not be resolved ({exc.strerror or exc})",
                "Check the host's name (and this machine's DNS), or give its IP address.",
            )
        # The errno's own words ("Connection refused"), not asyncio's "Connect call
        # failed ('127.0.0.1', PORT)", which repeats the address and says nothing more
        code = exc.os_error.errno
        why = os.strerror(code) if code else exc.strerror or str(exc)
        if code in _CUT_OFF:  # (in the TLS handshake)
            return _cut_off(uri, code)
        if code is None and isinstance(exc.os_error, ConnectionAbortedError):
            # asyncio's own limit on a TLS handshake (SSL_HANDSHAKE_TIMEOUT, 60 s), which
            # a longer connect timeout does not lift: the listener took the TCP
            # connection and never answered the TLS hello (a manager stopped or its loop
            # blocked), this side gave up; nothing closed it (review of the multi audit)
            return ConnectFailed(
                uri,
                f"the listener took the TCP connection but did not answer the TLS handshake "
                f"within {asyncio.constants.SSL_HANDSHAKE_TIMEOUT:g} s (asyncio's limit on a "
                "TLS handshake)",
                TLS_STALLED_HINT,
            )
        if code is None and isinstance(exc.os_error, ConnectionError):
            # The TCP connection was taken, then closed before TLS could start (asyncio's
            # "Connection lost", no errno): an SSH tunnel whose far end is refused does
            # that, not "nothing accepted" (multi audit, finding 1)
            return ConnectFailed(
                uri, "the listener closed the connection during the TLS handshake", CUT_OFF_HINT
            )
        return ConnectFailed(uri, f"nothing accepted the connection ({why})")
    if isinstance(exc, aiohttp.ServerTimeoutError):  # aiohttp's connect timeout
        return timed_out(uri, "no websocket connection", timeout)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        why = "the server closed the connection without answering the websocket handshake"
        if not plain:
            return ConnectFailed(uri, why, CUT_OFF_HINT)
        return ConnectFailed(
            uri,
            why,
            f"A wss:// (TLS) listener does that to a plain ws:// request: if it is one, "
            f"connect with {'wss' + uri.removeprefix('ws')} (trusting its certificate: "
            f"--tls-ca or CORRAL_TLS_CA). {CUT_OFF_HINT}",
        )
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno in _CUT_OFF:
        return _cut_off(uri, exc.errno)
    return ConnectFailed(uri, f"{type(exc).__name__}: {exc}")
