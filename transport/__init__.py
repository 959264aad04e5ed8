"""Corral's transports: ordered, bounded streams of frames between processes and tasks.

What lives here: the public API, re-exported from :mod:`transport.base`, and the
registration of the built-in backends (``inproc://`` from :mod:`transport.inproc`,
``ws://`` and ``wss://`` from :mod:`transport.ws`).

    async with await transport.listen("inproc://scheduler") as listener:
        conn = await transport.connect(listener.address, timeout=5)
        await conn.send(Frame(Ping(1)))
"""

from transport.base import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_BUFFER,
    AddressInUse,
    Backend,
    ConnectFailed,
    Connection,
    ConnectionClosed,
    Handler,
    InvalidAddress,
    Listener,
    TransportError,
    connect,
    listen,
    register_backend,
    registered_schemes,
)
from transport.inproc import InProcBackend, InProcHub
from transport.ws import AuthenticationFailed, WebSocketBackend

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_BUFFER",
    "AddressInUse",
    "AuthenticationFailed",
    "Backend",
    "ConnectFailed",
    "Connection",
    "ConnectionClosed",
    "Handler",
    "InProcBackend",
    "InProcHub",
    "InvalidAddress",
    "Listener",
    "TransportError",
    "WebSocketBackend",
    "connect",
    "listen",
    "register_backend",
    "registered_schemes",
]

register_backend("inproc", InProcBackend())
register_backend("ws", WebSocketBackend())
register_backend("wss", WebSocketBackend())
