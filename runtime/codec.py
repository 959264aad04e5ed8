"""Wire codec: frames of typed messages <-> bytes (orjson header + raw binary buffers).

What lives here: the :class:`Frame` wire unit, ``encode``/``decode`` of frames and of
batches of frames, and the validation that turns malformed input into
:class:`runtime.errors.ProtocolError` naming the offending field. No I/O.
"""

from __future__ import annotations

import dataclasses

from runtime.messages import Message

__all__ = ["Frame"]


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One message on a connection, with its envelope fields.

    ``causal_id`` links the message to the stimulus that caused it; ``request_id`` is
    non-zero on an ask that expects a reply; ``reply_to`` is non-zero on that reply.
    """

    msg: Message
    causal_id: str = ""
    request_id: int = 0
    reply_to: int = 0
