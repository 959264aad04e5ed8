"""Wire codec: frames of typed messages <-> bytes (orjson header + raw binary buffers).

What lives here: the :class:`Frame` wire unit, ``encode``/``decode`` of frames and of
batches of frames, and the validation that turns malformed input into
:class:`runtime.errors.ProtocolError` naming the offending field. No I/O.

Wire format (all integers big-endian)::

    +-------+---------+------+----------+------------+--------------+-----------+
    | magic | version | kind | reserved | header len | header JSON  | buffers   |
    | u8    | u8      | u8   | u8 (=0)  | u32        | (orjson)     | raw bytes |
    +-------+---------+------+----------+------------+--------------+-----------+

``kind`` is :data:`KIND_FRAME` (one frame) or :data:`KIND_BATCH` (many frames sharing
one buffer table). The header of a single frame is::

    {"t": wire_name, "f": {field: value, ...},
     "c": causal_id, "q": request_id, "r": reply_to,    # omitted when "" / 0
     "b": [len0, len1, ...]}                           # omitted when no buffers

and the header of a batch is ``{"n": [frame, ...], "b": [...]}`` where each frame is
the object above without ``"b"``. The buffers follow the header back to back, and
together they must end exactly at the end of the data.

Inside the fields:

* every ``bytes`` value, wherever it is nested, is the reference ``{"__b": i}`` and its
  content is buffer ``i`` (raw, never base64);
* a nested message is ``{"t": wire_name, "f": {...}}``;
* tuples are JSON arrays (decoded back to tuples when the annotation says so);
* inside ``Any`` values (and in unions that mix ``dict[...]`` with ``bytes`` or
  messages) a dict whose JSON form could be mistaken for a reference is escaped as
  ``{"__d": {...}}``.

Validation: each message class gets, once, a table of per-field converters built from
its resolved annotations. They check values on encode (bad data fails at the sender; a
message whose fields are all plain ``str``/``int``/``bool``/``None`` of the declared
types goes out after one check of their types). On decode, msgspec does the checking
(``msgspec.convert(fields, type=cls)``, strict, which also fills in omitted defaults and
builds the dataclass and its nested messages) once the wire-only forms (buffer
references, the ``{"t", "f"}`` form of nested messages, escapes inside ``Any``) are
undone (a field of the base ``Message`` gets the decoded message itself); the few
annotations msgspec cannot type (a message class with registered subclasses, unions
msgspec refuses) are decoded by the converters. Bad data from a peer fails with a
:class:`ProtocolError` naming the type and field path, e.g. ``TaskRecord.tries: expected
int, got str`` (a dict key shows as ``[...]`` in msgspec's paths). Decoding arbitrary
bytes raises nothing but :class:`ProtocolError`. Floats must be finite (JSON has no NaN
or infinity); integers must fit in 64 bits (signed or unsigned); an int given for a
``float`` field becomes a float. ``Any`` values are JSON values plus ``bytes``; a tuple
inside them arrives as a list. Nesting is bounded by orjson (about 255 levels on encode,
1024 on decode) and by Python's recursion limit; deeper values raise
:class:`ProtocolError` too.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import operator
import re
import struct
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import msgspec
import msgspec.inspect
import orjson

from runtime.errors import FrameTooLarge, ProtocolError, TooManyFrames
from runtime.messages import CORRAL_VERSION, MESSAGE_TYPES, Message

__all__ = [
    "KIND_BATCH",
    "KIND_FRAME",
    "MAGIC",
    "MAX_FRAME_BYTES",
    "VERSION",
    "Frame",
    "Pieces",
    "decode",
    "decode_batch",
    "encode",
    "encode_batch",
]


class Frame(msgspec.Struct, frozen=True):
    """One message on a connection, with its envelope fields.

    ``causal_id`` links the message to the stimulus that caused it; ``request_id`` is
    non-zero on an ask that expects a reply; ``reply_to`` is non-zero on that reply.
    (A frozen msgspec struct: a connection makes one per message, and a struct is made
    several times faster than a frozen dataclass.)
    """

    msg: Message
    causal_id: str = ""
    request_id: int = 0
    reply_to: int = 0


class Pieces:
    """An encoded frame or batch received in pieces (a transport's chunks), kept as
    they came: :func:`decode_batch` (and :func:`decode`, :func:`reply_ids`) cut each
    buffer out of the pieces with one copy, where joining them first into one buffer
    and then cutting the buffers out of it would copy every byte twice (and make, and
    free, a buffer the size of the whole). ``append`` a piece as it comes (``bytes`` or
    a read-only view are kept as they are; a writable buffer, which its owner could
    change or reuse, is copied); ``len()`` is the bytes so far."""

    __slots__ = ("_parts", "_starts", "size")

    def __init__(self) -> None:
        self._parts: list[memoryview] = []
        self._starts: list[int] = []  # the offset of each piece in the whole
        self.size = 0

    def append(self, piece: bytes | memoryview) -> None:
        view = piece if type(piece) is memoryview else memoryview(piece)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if not len(view):
            return
        if not view.readonly:
            view = memoryview(bytes(view))
        self._parts.append(view)
        self._starts.append(self.size)
        self.size += len(view)

    def __len__(self) -> int:
        return self.size

    def cut(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of the whole (within it), as one new ``bytes``."""
        if end <= start:
            return b""
        parts, starts = self._parts, self._starts
        i = bisect.bisect_right(starts, start) - 1
        offset = starts[i]
        first = parts[i]
        if end - offset <= len(first):  # within one piece
            return bytes(first[start - offset : end - offset])
        out = [first[start - offset :]]
        i += 1
        while starts[i] + len(parts[i]) < end:
            out.append(parts[i])
            i += 1
        out.append(parts[i][: end - starts[i]])
        return b"".join(out)


#: First byte of every encoded frame or batch.
MAGIC = 0xC7
#: Format version; a decoder refuses any other.
VERSION = 1
#: ``kind`` byte of a single frame.
KIND_FRAME = 1
#: ``kind`` byte of a batch of frames.
KIND_BATCH = 2
#: Largest encoded frame or batch accepted by default (``max_bytes`` overrides it).
MAX_FRAME_BYTES = 256 * 1024 * 1024

_PREFIX = struct.Struct(">BBBBI")
_PREFIX_SIZE = _PREFIX.size
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_ENVELOPE_MAX = 2**64 - 1
_FRAME_KEYS = frozenset({"t", "f", "c", "q", "r", "b"})
_BATCH_FRAME_KEYS = frozenset({"t", "f", "c", "q", "r"})
_BATCH_KEYS = frozenset({"n", "b"})
_ENVELOPE_NAMES = {"c": "causal_id", "q": "request_id", "r": "reply_to"}

_SEND_ADVICE = (
    "Build the message with values of its declared field types (see runtime/messages.py)."
)
_RECV_ADVICE = (
    "The peer sent a malformed or incompatible frame; make sure both ends run the same "
    f"Corral version (this side runs Corral {CORRAL_VERSION})."
)

_Buffer = bytes | bytearray | memoryview
_Enc = Callable[[Any, list[_Buffer]], Any]
_Dec = Callable[[Any, list[bytes]], Any]


# ------------------------------------------------------------------------ public API


def encode(frame: Frame, *, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Encode one frame.

    Raises :class:`ProtocolError` if the message is not a registered wire message, is
    process-local, has a field value that does not match its annotation (the error
    names the field), or if the result would exceed ``max_bytes``.
    """
    bufs: list[_Buffer] = []
    header = _frame_header(frame, bufs)
    if bufs:
        header["b"] = [len(b) for b in bufs]
    return _assemble(KIND_FRAME, header, bufs, max_bytes)


def decode(
    data: bytes | bytearray | memoryview | Pieces, *, max_bytes: int = MAX_FRAME_BYTES
) -> Frame:
    """Decode one frame produced by :func:`encode`.

    Every problem (truncation, bad prefix, invalid JSON, unknown message type, missing,
    unknown or mistyped fields, input longer than ``max_bytes``) raises
    :class:`ProtocolError`; nothing else escapes. ``bytes`` fields are fresh ``bytes``
    objects copied once out of ``data``.
    """
    kind, header, bufs = _open(data, max_bytes)
    if kind != KIND_FRAME:
        raise ProtocolError(
            "the data holds a batch of frames, not a single frame; decode it with decode_batch()."
        )
    return _frame_from(header, bufs, _FRAME_KEYS, "")


def encode_batch(frames: Sequence[Frame], *, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Encode many frames into one transport message (all share one buffer table).

    Raises :class:`ProtocolError` as :func:`encode` does; the message says which frame
    of the batch was at fault.
    """
    bufs: list[_Buffer] = []
    entries = []
    for i, frame in enumerate(frames):
        try:
            entries.append(_frame_header(frame, bufs))
        except ProtocolError as exc:
            raise _in_batch(exc, i) from None
    header: dict[str, Any] = {"n": entries}
    if bufs:
        header["b"] = [len(b) for b in bufs]
    return _assemble(KIND_BATCH, header, bufs, max_bytes)


def decode_batch(
    data: bytes | bytearray | memoryview | Pieces,
    *,
    max_bytes: int = MAX_FRAME_BYTES,
    max_frames: int | None = None,
) -> list[Frame]:
    """Decode the output of :func:`encode_batch` into its frames, in order.

    A single frame (the output of :func:`encode`) is accepted too and gives a list of
    one. ``max_frames`` (None: no limit) bounds how many frames the data may hold: more
    raise :class:`ProtocolError` before any frame is built (a receiver passes the
    frames the sender may still have in flight). Raises only :class:`ProtocolError`,
    naming the faulty frame's index.
    """
    kind, header, bufs = _open(data, max_bytes)
    if max_frames is not None and max_frames < 1:
        raise _too_many_frames(1, max_frames)
    if kind == KIND_FRAME:
        return [_frame_from(header, bufs, _FRAME_KEYS, "")]
    if not header.keys() <= _BATCH_KEYS:
        raise _header_keys_error(header, _BATCH_KEYS, "batch header")
    entries = header.get("n")
    if type(entries) is not list:
        raise ProtocolError(
            f'batch header: "n" must be a list of frames, got {_describe(entries)}. ' + _RECV_ADVICE
        )
    if max_frames is not None and len(entries) > max_frames:
        raise _too_many_frames(len(entries), max_frames)
    return [
        _frame_from(e, bufs, _BATCH_FRAME_KEYS, f"batch frame {i}: ") for i, e in enumerate(entries)
    ]


def reply_ids(
    data: bytes | bytearray | memoryview | Pieces, *, max_bytes: int = MAX_FRAME_BYTES
) -> list[int]:
    """The ``reply_to`` ids of the frames in ``data``, read from its header alone, for
    data that :func:`decode_batch` refused: a receiver can then fail the asks waiting
    for those replies at once instead of leaving them to their timeouts. Best effort:
    ``[]`` when not even the header can be read."""
    try:
        kind, header, _ = _open(data, max_bytes)
        entries = [header] if kind == KIND_FRAME else header.get("n")
        if type(entries) is not list:
            return []
        return [
            r for e in entries if type(e) is dict and type(r := e.get("r")) is int and 0 < r < 2**63
        ]
    except Exception:  # the prefix or the header itself is broken: nothing to say
        return []


def _too_many_frames(n: int, max_frames: int) -> TooManyFrames:
    return TooManyFrames(
        f"the data holds {n} frame(s), over the limit of {max_frames} (max_frames): the "
        "sender spent more credits than it had. " + _RECV_ADVICE,
        frames=n,
        limit=max_frames,
    )


# ------------------------------------------------------------------ frame envelope


def _frame_header(frame: Frame, bufs: list[_Buffer]) -> dict[str, Any]:
    """The JSON header object of ``frame`` (without ``"b"``); appends its buffers."""
    if type(frame) is not Frame:
        raise ProtocolError(
            f"expected a Frame, got {_describe(frame)}; wrap the message as Frame(msg)."
        )
    msg = frame.msg
    codec = _CODECS.get(type(msg)) or _codec_for_value(msg)
    if codec.local:
        raise _local_error(codec)
    try:
        fields = codec.encode_fields(msg, bufs)
    except _Invalid as exc:
        raise exc.error(codec.wire, sending=True) from None
    except RecursionError:
        raise ProtocolError(
            f"{codec.wire}: a field value is nested too deeply (or contains itself). "
            + _SEND_ADVICE,
            type_name=codec.wire,
        ) from None
    header: dict[str, Any] = {"t": codec.wire, "f": fields}
    causal_id = frame.causal_id
    if type(causal_id) is not str:
        raise _envelope_error("causal_id", "str", causal_id, codec.wire)
    if causal_id:
        header["c"] = causal_id
    request_id = frame.request_id
    if type(request_id) is not int or not 0 <= request_id <= _ENVELOPE_MAX:
        raise _envelope_error("request_id", "int in 0..2**64-1", request_id, codec.wire)
    if request_id:
        header["q"] = request_id
    reply_to = frame.reply_to
    if type(reply_to) is not int or not 0 <= reply_to <= _ENVELOPE_MAX:
        raise _envelope_error("reply_to", "int in 0..2**64-1", reply_to, codec.wire)
    if reply_to:
        header["r"] = reply_to
    return header


def _envelope_error(name: str, expected: str, value: object, wire: str) -> ProtocolError:
    return ProtocolError(
        f"Frame.{name}: expected {expected}, got {_describe(value)} (message {wire}). "
        "Pass envelope fields of the declared types.",
        field=name,
        type_name=wire,
    )


def _assemble(kind: int, header: dict[str, Any], bufs: list[_Buffer], max_bytes: int) -> bytes:
    try:
        head = orjson.dumps(header)
    except orjson.JSONEncodeError as exc:
        raise _diagnose(header, exc) from None
    size = _PREFIX_SIZE + len(head)
    if bufs:
        size += sum(map(len, bufs))
    if size > max_bytes or len(head) >= 2**32:
        raise FrameTooLarge(
            f"the encoded {'batch' if kind == KIND_BATCH else 'frame'} would be {size} bytes, "
            f"over the limit of {max_bytes} bytes. Send large data in smaller pieces, "
            "or raise max_bytes on both ends.",
            size,
            max_bytes,
        )
    prefix = _PREFIX.pack(MAGIC, VERSION, kind, 0, len(head))
    if bufs:
        return b"".join((prefix, head, *bufs))
    return prefix + head


def _open(data: object, max_bytes: int) -> tuple[int, dict[str, Any], list[bytes]]:
    """Check the prefix, parse the header and cut out the buffers (each copied once)."""
    view: bytes | memoryview = b""
    pieces: Pieces | None = None
    if type(data) is Pieces:  # buffers are cut out of its pieces
        pieces = data
    elif type(data) is bytes:  # slices of it are bytes: no view needed
        view = data
    else:
        try:
            view = memoryview(data)  # type: ignore[arg-type]
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
        except (TypeError, ValueError):
            raise ProtocolError(
                f"expected bytes, bytearray or memoryview to decode, got {_describe(data)}."
            ) from None
    size = len(view) if pieces is None else pieces.size
    if size > max_bytes:
        raise ProtocolError(
            f"frame of {size} bytes is over the limit of {max_bytes} bytes; the peer must "
            "send smaller frames, or raise max_bytes on both ends."
        )
    if size < _PREFIX_SIZE:
        raise _truncated(f"{size} bytes is shorter than the {_PREFIX_SIZE}-byte prefix")
    prefix = view if pieces is None else pieces.cut(0, _PREFIX_SIZE)
    magic, version, kind, reserved, head_len = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise ProtocolError(
            f"not a Corral frame: first byte is 0x{magic:02x}, expected 0x{MAGIC:02x}. "
            "Check that the peer speaks the Corral wire protocol."
        )
    if version != VERSION:
        raise ProtocolError(
            f"unsupported wire format version {version} (this side speaks {VERSION}). "
            "Run the same Corral version on both ends."
        )
    if kind != KIND_FRAME and kind != KIND_BATCH:
        raise ProtocolError(f"unknown frame kind {kind}. " + _RECV_ADVICE)
    if reserved != 0:
        raise ProtocolError(f"reserved prefix byte is {reserved}, expected 0. " + _RECV_ADVICE)
    end = _PREFIX_SIZE + head_len
    if end > size:
        raise _truncated(f"header of {head_len} bytes does not fit in {size} bytes")
    try:
        header = orjson.loads(
            view[_PREFIX_SIZE:end] if pieces is None else pieces.cut(_PREFIX_SIZE, end)
        )
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"frame header is not valid JSON ({exc}). " + _RECV_ADVICE) from None
    if type(header) is not dict:
        raise ProtocolError(
            f"frame header must be a JSON object, got {_describe(header)}. " + _RECV_ADVICE
        )
    if "b" not in header:
        if end != size:
            raise _trailing(size - end)
        return kind, header, []
    lengths = header["b"]
    if type(lengths) is not list:
        raise ProtocolError(
            f'frame header: "b" must be a list of buffer lengths, got {_describe(lengths)}. '
            + _RECV_ADVICE
        )
    total = end
    for n in lengths:
        if type(n) is not int or n < 0:
            raise ProtocolError(
                f'frame header: buffer length {_describe(n)} in "b" is not a non-negative '
                "int. " + _RECV_ADVICE
            )
        total += n
    if total > size:
        raise _truncated(f"header and buffers need {total} bytes, got {size}")
    if total != size:
        raise _trailing(size - total)
    bufs = []
    offset = end
    for n in lengths:
        bufs.append(
            bytes(view[offset : offset + n]) if pieces is None else pieces.cut(offset, offset + n)
        )
        offset += n
    return kind, header, bufs


def _frame_from(obj: object, bufs: list[bytes], keys: frozenset[str], where: str) -> Frame:
    """Build a :class:`Frame` from one decoded header object."""
    if type(obj) is not dict:
        raise ProtocolError(
            f"{where}frame header must be a JSON object, got {_describe(obj)}. " + _RECV_ADVICE
        )
    name = obj.get("t")
    if type(name) is not str:
        raise ProtocolError(
            f'{where}frame header: "t" (the message type name) must be a str, got '
            f"{_describe(name)}. " + _RECV_ADVICE,
            field="t",
        )
    cls = MESSAGE_TYPES.get(name)
    if cls is None:
        raise ProtocolError(
            f"{where}unknown message type {name!r}. The peer may run a different Corral "
            "version, or the module defining it is not imported on this side.",
            type_name=name,
        )
    codec = _CODECS.get(cls) or _codec_for(cls)
    if codec.local:
        raise _local_error(codec, where, sending=False)
    if not obj.keys() <= keys:
        raise _header_keys_error(obj, keys, f"{where}frame header of {name}")
    if "f" not in obj:
        raise ProtocolError(
            f'{where}frame header of {name} has no "f" (the fields). ' + _RECV_ADVICE,
            field="f",
            type_name=name,
        )
    causal_id = obj.get("c", "")
    request_id = obj.get("q", 0)
    reply_to = obj.get("r", 0)
    if type(causal_id) is not str:
        raise _bad_envelope(where, name, "c", "str", causal_id)
    if type(request_id) is not int or not 0 <= request_id <= _ENVELOPE_MAX:
        raise _bad_envelope(where, name, "q", "int in 0..2**64-1", request_id)
    if type(reply_to) is not int or not 0 <= reply_to <= _ENVELOPE_MAX:
        raise _bad_envelope(where, name, "r", "int in 0..2**64-1", reply_to)
    try:
        msg = codec.decode_fields(obj["f"], bufs)
    except _Invalid as exc:
        raise exc.error(name, sending=False, prefix=where) from None
    except RecursionError:
        raise ProtocolError(
            f"{where}{name}: a field value is nested too deeply. " + _RECV_ADVICE,
            type_name=name,
        ) from None
    return Frame(msg, causal_id, request_id, reply_to)


def _bad_envelope(where: str, name: str, key: str, expected: str, value: object) -> ProtocolError:
    field = _ENVELOPE_NAMES[key]
    return ProtocolError(
        f'{where}frame header of {name}: "{key}" ({field}) must be {expected}, got '
        f"{_describe(value)}. " + _RECV_ADVICE,
        field=field,
        type_name=name,
    )


def _header_keys_error(obj: dict[str, Any], keys: frozenset[str], what: str) -> ProtocolError:
    extra = sorted(set(obj) - keys)
    return ProtocolError(
        f"{what} has unknown key(s) {', '.join(map(repr, extra))}; allowed are "
        f"{', '.join(map(repr, sorted(keys)))}. " + _RECV_ADVICE
    )


def _truncated(detail: str) -> ProtocolError:
    return ProtocolError(
        f"truncated frame: {detail}. The connection may have cut it short; " + _RECV_ADVICE
    )


def _trailing(extra: int) -> ProtocolError:
    return ProtocolError(f"frame has {extra} unexpected trailing byte(s). " + _RECV_ADVICE)


def _in_batch(exc: ProtocolError, index: int) -> ProtocolError:
    return ProtocolError(
        f"batch frame {index}: {exc.message}",
        field=getattr(exc, "field", ""),
        type_name=getattr(exc, "type_name", ""),
    )


def _local_error(codec: _ClassCodec, where: str = "", *, sending: bool = True) -> ProtocolError:
    what = (
        "cannot be encoded; deliver it only to actors in the same process, or declare a "
        "wire message without live objects"
        if sending
        else "cannot arrive from another process. " + _RECV_ADVICE
    )
    return ProtocolError(
        f"{where}{codec.wire} is a process-local message (local=True) and {what}.",
        type_name=codec.wire,
    )


def _diagnose(header: dict[str, Any], exc: Exception) -> ProtocolError:
    """Explain an orjson failure (a str that is not valid UTF-8, or too deep nesting)."""
    try:
        return _diagnose_frames(header, exc)
    except RecursionError:
        return ProtocolError(
            "the frame could not be serialised: a field value is nested too deeply. " + _SEND_ADVICE
        )


def _diagnose_frames(header: dict[str, Any], exc: Exception) -> ProtocolError:
    frames = header.get("n", [header])
    for i, entry in enumerate(frames):
        where = f"batch frame {i}: " if "n" in header else ""
        wire = entry["t"]
        found = _find_bad(entry["f"], True)
        if found is not None:
            path, problem = found
            field = path[1:] if path.startswith(".") else path
            return ProtocolError(
                f"{where}{wire}{path}: {problem}. " + _SEND_ADVICE, field=field, type_name=wire
            )
        if "c" in entry and _find_bad(entry["c"], False) is not None:
            return ProtocolError(
                f"{where}Frame.causal_id: {_BAD_STR}. Pass a valid causal id.",
                field="causal_id",
                type_name=wire,
            )
    return ProtocolError(
        f"the frame could not be serialised ({exc}); a field value is probably nested too "
        "deeply. " + _SEND_ADVICE
    )


_BAD_STR = "str is not valid UTF-8 (it contains a surrogate)"


def _find_bad(value: object, fields: bool) -> tuple[str, str] | None:
    """Path to the first str (or dict key) in ``value`` that is not valid UTF-8, or
    int that does not fit in 64 bits, and what is wrong with it."""
    t = type(value)
    if t is str:
        try:
            value.encode()  # type: ignore[attr-defined]
        except UnicodeEncodeError:
            return "", _BAD_STR
        return None
    if t is int:
        if _INT_MIN <= value <= _INT_MAX:  # type: ignore[operator]
            return None
        return "", f"int {value} does not fit in 64 bits (range -2**63..2**64-1)"
    if t is list or t is tuple:
        assert isinstance(value, list | tuple)
        for i, item in enumerate(value):
            sub = _find_bad(item, False)
            if sub is not None:
                return f"[{i}]{sub[0]}", sub[1]
        return None
    if t is dict:
        assert isinstance(value, dict)
        name = value.get("t")
        nested = value.keys() == {"t", "f"} and type(name) is str and name in MESSAGE_TYPES
        for key, item in value.items():
            seg = f".{key}" if fields else f"[{key!r}]"
            if _find_bad(key, False) is not None:
                return seg, _BAD_STR
            if nested:
                if key == "f":
                    return _find_bad(item, True)
                continue
            sub = _find_bad(item, False)
            if sub is not None:
                return seg + sub[0], sub[1]
    return None


# ------------------------------------------------------------------- converters


class _Invalid(Exception):
    """A value does not match its annotation. ``path`` is built innermost first."""

    def __init__(self, problem: str, path: list[str] | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = path or []

    def error(self, wire: str, *, sending: bool, prefix: str = "") -> ProtocolError:
        path = "".join(reversed(self.path))
        field = path[1:] if path.startswith(".") else path
        advice = _SEND_ADVICE if sending else _RECV_ADVICE
        return ProtocolError(
            f"{prefix}{wire}{path}: {self.problem}. {advice}", field=field, type_name=wire
        )


def _describe(value: object) -> str:
    """Short description of a value for error messages: its type and a clipped repr."""
    t = type(value)
    if value is None:
        return "None"
    if t is bytes or t is bytearray or t is memoryview:
        return f"{t.__name__} of length {len(value)}"  # type: ignore[arg-type]
    try:
        text = repr(value)
    except Exception:
        text = "<unprintable>"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{t.__name__} {text}"


def _mismatch(expected: str, value: object) -> _Invalid:
    return _Invalid(f"expected {expected}, got {_describe(value)}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Conv:
    """How one annotation is checked and converted.

    ``enc(value, bufs)`` returns the JSON form (appending bytes to ``bufs``);
    ``dec(json, bufs)`` returns the Python value. Both raise :class:`_Invalid`.
    ``py`` and ``js`` tell whether a Python value / JSON value is of this type's kind
    (used to pick the alternative of a union); ``kind`` is one of ``scalar``,
    ``bytes``, ``message``, ``dict``, ``list``, ``any``, ``none``. ``passes``: the
    types whose values are valid and encode unchanged (int: orjson refuses ints beyond
    64 bits, and :func:`_diagnose` names them).
    """

    expected: str
    enc: _Enc
    dec: _Dec
    py: Callable[[Any], bool]
    js: Callable[[Any], bool]
    kind: str
    passes: frozenset[type] = frozenset()


def _scalar(name: str, t: type, passes: frozenset[type] = frozenset()) -> _Conv:
    def check(v: Any, bufs: Any) -> Any:
        if type(v) is t:
            return v
        raise _mismatch(name, v)

    def claims(v: Any) -> bool:
        return type(v) is t

    return _Conv(name, check, check, claims, claims, "scalar", passes)


def _int_check(v: Any, bufs: Any) -> Any:
    if type(v) is int:
        if _INT_MIN <= v <= _INT_MAX:
            return v
        raise _Invalid(f"int {v} does not fit in 64 bits (range -2**63..2**64-1)")
    raise _mismatch("int", v)


def _float_enc(v: Any, bufs: Any) -> Any:
    t = type(v)
    if t is float:
        if v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
            return v
        raise _Invalid(f"float {v!r} is not finite; JSON has no NaN or infinity")
    if t is int:
        try:
            return float(v)
        except OverflowError:
            raise _Invalid(f"int {v} is too large for a float field") from None
    raise _mismatch("float", v)


def _float_dec(v: Any, bufs: Any) -> Any:
    t = type(v)
    if t is float:
        if math.isfinite(v):
            return v
        raise _Invalid(f"float {v!r} is not finite")
    if t is int:
        return float(v)
    raise _mismatch("float", v)


def _is_float_json(v: Any) -> bool:
    t = type(v)
    return t is float or t is int


def _none_check(v: Any, bufs: Any) -> Any:
    if v is None:
        return None
    raise _mismatch("None", v)


def _is_none(v: Any) -> bool:
    return v is None


def _bytes_enc(v: Any, bufs: list[_Buffer]) -> Any:
    t = type(v)
    if t is bytes or t is bytearray:
        bufs.append(v)
        return {"__b": len(bufs) - 1}
    if t is memoryview:
        if not v.c_contiguous:
            raise _Invalid("memoryview is not contiguous; pass bytes")
        bufs.append(v.cast("B") if v.ndim != 1 or v.itemsize != 1 else v)
        return {"__b": len(bufs) - 1}
    raise _mismatch("bytes", v)


def _bytes_dec(v: Any, bufs: list[bytes]) -> Any:
    if type(v) is dict and len(v) == 1 and "__b" in v:
        i = v["__b"]
        if type(i) is int:
            if 0 <= i < len(bufs):
                return bufs[i]
            raise _Invalid(
                f"buffer reference {i} is out of range (the frame has {len(bufs)} buffer(s))"
            )
    raise _mismatch('bytes (a {"__b": index} buffer reference)', v)


def _is_bytes_py(v: Any) -> bool:
    t = type(v)
    return t is bytes or t is bytearray or t is memoryview


def _is_bytes_json(v: Any) -> bool:
    return type(v) is dict and len(v) == 1 and "__b" in v


_JSON_VALUE = "a JSON value (None, bool, int, float, str, bytes, list or dict with str keys)"


def _any_enc(v: Any, bufs: list[_Buffer]) -> Any:
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        return _int_check(v, bufs)
    if t is float:
        return _float_enc(v, bufs)
    if t is list or t is tuple:
        return _map_items(_any_enc, v, bufs)
    if t is dict:
        _check_keys(v)
        obj = _map_values(_any_enc, v, bufs)
        if len(obj) == 1 and ("__b" in obj or "__d" in obj):
            return {"__d": obj}
        return obj
    if t is bytes or t is bytearray or t is memoryview:
        return _bytes_enc(v, bufs)
    raise _mismatch(_JSON_VALUE, v)


def _any_dec(v: Any, bufs: list[bytes]) -> Any:
    t = type(v)
    if t is list:
        return _map_items(_any_dec, v, bufs)
    if t is dict:
        if len(v) == 1:
            if "__b" in v:
                return _bytes_dec(v, bufs)
            if "__d" in v:
                v = v["__d"]
                if type(v) is not dict:
                    raise _mismatch('an object inside a {"__d": ...} escape', v)
        return _map_values(_any_dec, v, bufs)
    return v  # str, int, float, bool, None: orjson only produces valid ones


def _anything(v: Any) -> bool:
    return True


_NONE = _Conv("None", _none_check, _none_check, _is_none, _is_none, "none", frozenset({type(None)}))
_BOOL = _scalar("bool", bool, frozenset({bool}))
_STR = _scalar("str", str, frozenset({str}))
_INT = _Conv(
    "int",
    _int_check,
    _int_check,
    lambda v: type(v) is int,
    lambda v: type(v) is int,
    "scalar",
    frozenset({int}),
)
_FLOAT = _Conv("float", _float_enc, _float_dec, _is_float_json, _is_float_json, "scalar")
_BYTES = _Conv("bytes", _bytes_enc, _bytes_dec, _is_bytes_py, _is_bytes_json, "bytes")
_ANY = _Conv("Any", _any_enc, _any_dec, _anything, _anything, "any")
_SIMPLE: dict[object, _Conv] = {
    type(None): _NONE,
    None: _NONE,
    bool: _BOOL,
    int: _INT,
    float: _FLOAT,
    str: _STR,
    bytes: _BYTES,
    Any: _ANY,
}


class _Unsupported(Exception):
    """An annotation the codec cannot carry."""


def _conv(tp: Any) -> _Conv:
    """The converter of annotation ``tp`` (raises :class:`_Unsupported`)."""
    try:
        simple = _SIMPLE.get(tp)
    except TypeError:  # unhashable annotation object
        simple = None
    if simple is not None:
        return simple
    value = getattr(tp, "__value__", None)  # `type X = ...` aliases (Python 3.12+)
    if value is not None and not isinstance(tp, type):
        return _conv(value)
    if isinstance(tp, type) and issubclass(tp, Message):
        return _message_conv(tp)
    if tp is list:
        return _list_conv(_ANY)
    if tp is tuple:
        return _seq_conv(_ANY)
    if tp is dict:
        return _dict_conv(_ANY)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return _literal_conv(args)
    if origin is Union or origin is types.UnionType:
        return _union_conv(args)
    if origin is list and len(args) == 1:
        return _list_conv(_conv(args[0]))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _seq_conv(_conv(args[0]))
        return _fixed_tuple_conv([_conv(a) for a in args if a != ()])
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise _Unsupported(f"dict keys must be str, not {_type_name(args[0])}")
        return _dict_conv(_conv(args[1]))
    raise _Unsupported(f"{_type_name(tp)} is not a wire type")


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def _is_plain(conv: _Conv) -> bool:
    """Whether ``conv`` returns valid values unchanged (so containers can pass through)."""
    return conv.kind in ("scalar", "none") and conv is not _FLOAT


def _map_items(fn: Callable[[Any, Any], Any], v: Any, bufs: Any) -> list[Any]:
    """``[fn(x, bufs) for x in v]``, adding the index to the path of an error."""
    out = []
    i = 0
    try:
        for x in v:
            out.append(fn(x, bufs))
            i += 1
    except _Invalid as exc:
        exc.path.append(f"[{i}]")
        raise
    return out


def _check_items(fn: Callable[[Any, Any], Any], v: Any, bufs: Any) -> None:
    """Call ``fn`` on every item of ``v``, adding the index to the path of an error."""
    i = 0
    try:
        for x in v:
            fn(x, bufs)
            i += 1
    except _Invalid as exc:
        exc.path.append(f"[{i}]")
        raise


def _map_values(fn: Callable[[Any, Any], Any], v: dict[str, Any], bufs: Any) -> dict[str, Any]:
    """``{k: fn(x, bufs)}`` over ``v``, adding the key to the path of an error."""
    out = {}
    for key, x in v.items():
        try:
            out[key] = fn(x, bufs)
        except _Invalid as exc:
            exc.path.append(f"[{key!r}]")
            raise
    return out


def _check_keys(v: dict[Any, Any]) -> None:
    for key in v:
        if type(key) is not str:
            raise _Invalid(f"dict key {_describe(key)} is not a str")


def _list_conv(item: _Conv) -> _Conv:
    expected = f"list[{item.expected}]"
    ienc, idec = item.enc, item.dec
    plain = _is_plain(item)

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        if type(v) is not list:
            raise _mismatch(expected, v)
        if plain:
            _check_items(ienc, v, bufs)
            return v
        return _map_items(ienc, v, bufs)

    def dec(v: Any, bufs: list[bytes]) -> Any:
        if type(v) is not list:
            raise _mismatch(expected, v)
        if plain:  # orjson made a fresh list: keep it
            _check_items(idec, v, bufs)
            return v
        return _map_items(idec, v, bufs)

    return _Conv(expected, enc, dec, _is_list, _is_list, "list")


def _is_list(v: Any) -> bool:
    return type(v) is list


def _is_tuple(v: Any) -> bool:
    return type(v) is tuple


def _seq_conv(item: _Conv) -> _Conv:
    expected = f"tuple[{item.expected}, ...]"
    ienc, idec = item.enc, item.dec
    plain = _is_plain(item)

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        if type(v) is not tuple:
            raise _mismatch(expected, v)
        if plain:  # orjson writes tuples as arrays
            _check_items(ienc, v, bufs)
            return v
        return _map_items(ienc, v, bufs)

    def dec(v: Any, bufs: list[bytes]) -> Any:
        if type(v) is not list:
            raise _mismatch(expected, v)
        if plain:
            _check_items(idec, v, bufs)
            return tuple(v)
        return tuple(_map_items(idec, v, bufs))

    return _Conv(expected, enc, dec, _is_tuple, _is_list, "list")


def _fixed_tuple_conv(items: list[_Conv]) -> _Conv:
    expected = f"tuple[{', '.join(c.expected for c in items)}]" if items else "tuple[()]"
    n = len(items)
    encs = [c.enc for c in items]
    decs = [c.dec for c in items]

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        if type(v) is not tuple or len(v) != n:
            raise _mismatch(expected, v)
        out = []
        for i in range(n):
            try:
                out.append(encs[i](v[i], bufs))
            except _Invalid as exc:
                exc.path.append(f"[{i}]")
                raise
        return out

    def dec(v: Any, bufs: list[bytes]) -> Any:
        if type(v) is not list or len(v) != n:
            raise _mismatch(f"{expected} (a list of {n})", v)
        out = []
        for i in range(n):
            try:
                out.append(decs[i](v[i], bufs))
            except _Invalid as exc:
                exc.path.append(f"[{i}]")
                raise
        return tuple(out)

    return _Conv(expected, enc, dec, _is_tuple, _is_list, "list")


def _dict_conv(item: _Conv) -> _Conv:
    expected = f"dict[str, {item.expected}]"
    ienc, idec = item.enc, item.dec
    plain = _is_plain(item)

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        if type(v) is not dict:
            raise _mismatch(expected, v)
        _check_keys(v)
        if plain:
            for key, x in v.items():
                try:
                    ienc(x, bufs)
                except _Invalid as exc:
                    exc.path.append(f"[{key!r}]")
                    raise
            return v
        return _map_values(ienc, v, bufs)

    def dec(v: Any, bufs: list[bytes]) -> Any:
        if type(v) is not dict:
            raise _mismatch(expected, v)
        if plain:  # orjson made a fresh dict: keep it
            for key, x in v.items():
                try:
                    idec(x, bufs)
                except _Invalid as exc:
                    exc.path.append(f"[{key!r}]")
                    raise
            return v
        return _map_values(idec, v, bufs)

    return _Conv(expected, enc, dec, _is_dict, _is_dict, "dict")


def _is_dict(v: Any) -> bool:
    return type(v) is dict


def _literal_conv(values: tuple[Any, ...]) -> _Conv:
    for value in values:
        if type(value) not in (str, int, bool, type(None)):
            raise _Unsupported(f"Literal value {value!r} is not a str, int, bool or None")
    allowed = frozenset((type(v), v) for v in values)
    kinds = frozenset(type(v) for v in values)
    expected = "one of " + ", ".join(repr(v) for v in values)

    def check(v: Any, bufs: Any) -> Any:
        try:
            if (type(v), v) in allowed:
                return v
        except TypeError:  # unhashable
            pass
        raise _mismatch(expected, v)

    def claims(v: Any) -> bool:
        return type(v) in kinds

    return _Conv(expected, check, check, claims, claims, "scalar")


def _union_conv(args: tuple[Any, ...]) -> _Conv:
    if Any in args:
        return _ANY
    convs = [_conv(a) for a in args]
    # Prefer exact matches: an int goes to an ``int`` alternative before ``float``.
    convs.sort(key=lambda c: c is _FLOAT)
    expected = " | ".join(c.expected for c in convs)
    others = [c for c in convs if c is not _NONE]
    if len(others) == 1 and len(convs) == 2:
        return _optional_conv(others[0], expected)
    dict_like = [c for c in convs if c.kind == "dict"]
    escape = bool(dict_like) and any(c.kind in ("bytes", "message") for c in convs)

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        first: _Invalid | None = None
        for c in convs:
            if c.py(v):
                mark = len(bufs)
                try:
                    out = c.enc(v, bufs)
                except _Invalid as exc:
                    del bufs[mark:]
                    first = first or exc
                    continue
                if escape and c.kind == "dict":
                    return {"__d": out}
                return out
        raise first or _mismatch(expected, v)

    def dec(v: Any, bufs: list[bytes]) -> Any:
        candidates = convs
        if escape and type(v) is dict and len(v) == 1 and "__d" in v:
            v = v["__d"]
            candidates = dict_like
        elif escape:
            candidates = [c for c in convs if c.kind != "dict"]
        first: _Invalid | None = None
        for c in candidates:
            if c.js(v):
                try:
                    return c.dec(v, bufs)
                except _Invalid as exc:
                    first = first or exc
        raise first or _mismatch(expected, v)

    def py(v: Any) -> bool:
        return any(c.py(v) for c in convs)

    def js(v: Any) -> bool:
        return any(c.js(v) for c in convs)

    return _Conv(expected, enc, dec, py, js, "union")


def _optional_conv(inner: _Conv, expected: str) -> _Conv:
    ienc, idec = inner.enc, inner.dec
    prefix = f"expected {inner.expected}"

    def widen(exc: _Invalid) -> None:
        """Say ``expected X | None`` rather than ``expected X`` at this level."""
        if not exc.path and exc.problem.startswith(prefix):
            exc.problem = f"expected {expected}{exc.problem[len(prefix) :]}"

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        if v is None:
            return None
        try:
            return ienc(v, bufs)
        except _Invalid as exc:
            widen(exc)
            raise

    def dec(v: Any, bufs: list[bytes]) -> Any:
        if v is None:
            return None
        try:
            return idec(v, bufs)
        except _Invalid as exc:
            widen(exc)
            raise

    def py(v: Any) -> bool:
        return v is None or inner.py(v)

    def js(v: Any) -> bool:
        return v is None or inner.js(v)

    passes = inner.passes | {type(None)}
    return _Conv(expected, enc, dec, py, js, inner.kind, passes)


def _message_conv(cls: type[Message]) -> _Conv:
    expected = "a message" if cls is Message else f"{cls.__name__} message"

    def enc(v: Any, bufs: list[_Buffer]) -> Any:
        if not isinstance(v, cls):
            raise _mismatch(expected, v)
        codec = _CODECS.get(type(v)) or _codec_for_value(v)
        if codec.local:
            raise _Invalid(
                f"{codec.wire} is a process-local message (local=True) and cannot be encoded"
            )
        return {"t": codec.wire, "f": codec.encode_fields(v, bufs)}

    def dec(v: Any, bufs: list[bytes]) -> Any:
        if type(v) is not dict or len(v) != 2 or "f" not in v or type(v.get("t")) is not str:
            raise _mismatch(f'{expected} ({{"t": name, "f": {{...}}}})', v)
        name = v["t"]
        sub = MESSAGE_TYPES.get(name)
        if sub is None:
            raise _Invalid(f"unknown message type {name!r}")
        if not issubclass(sub, cls):
            raise _Invalid(f"expected {expected}, got {name} message")
        codec = _CODECS.get(sub) or _codec_for(sub)
        if codec.local:
            raise _Invalid(f"{name} is a process-local message and cannot arrive from a peer")
        return codec.decode_fields(v["f"], bufs)

    def py(v: Any) -> bool:
        return isinstance(v, cls)

    def js(v: Any) -> bool:
        if type(v) is not dict:
            return False
        name = v.get("t")
        sub = MESSAGE_TYPES.get(name) if type(name) is str else None
        return sub is not None and issubclass(sub, cls)

    return _Conv(expected, enc, dec, py, js, "message")


# ------------------------------------------------------------------ per-class codecs


class _ClassCodec:
    """Field table of one message class, and its encode/decode.

    ``encode_fields(msg, bufs)`` returns the JSON fields object of ``msg``, checking
    every value against its converter (scalars of the declared type pass unchanged);
    ``decode_fields(obj, bufs)`` rebuilds the message. Both raise :class:`_Invalid`
    (with the field path) on bad values.

    Decoding is msgspec's job (``msgspec.convert(fields, type=cls, strict=True)``
    checks every value, fills in omitted defaults and builds the dataclass) for every
    class whose annotations msgspec can take once the wire-only forms are undone: the
    fields that hold buffer references, nested messages (``{"t", "f"}``, unwrapped to
    their fields when the annotation names that exact class) or ``Any`` values are
    first rewritten by :func:`_prep` functions. A class msgspec cannot type (a union
    msgspec does not accept, a message class with registered subclasses) goes through
    :meth:`decode_slow`, the converters alone.
    """

    __slots__ = (
        "absent",
        "built",
        "cls",
        "decs",
        "encs",
        "get",
        "local",
        "n",
        "names",
        "order",
        "passing",
        "preps",
        "required",
        "wire",
    )

    def __init__(self, cls: type[Message]) -> None:
        self.cls = cls
        self.wire = cls.wire_name
        self.local = bool(cls.local)
        self.names: frozenset[str] = frozenset()
        self.decs: dict[str, _Dec] = {}
        self.encs: tuple[tuple[str, frozenset[type], _Enc], ...] = ()
        self.order: tuple[str, ...] = ()
        #: the field values of a message and its class, as a tuple
        self.get: Callable[[Any], tuple[Any, ...]] = _no_values
        #: tuples of the field values' types that all encode unchanged
        self.passing: frozenset[tuple[type, ...]] = frozenset()
        self.required: frozenset[str] = frozenset()
        self.n = 0
        #: per field needing it, the rewrite of its JSON value into msgspec's input;
        #: None: msgspec cannot type the class (decode_slow decodes it)
        self.preps: tuple[tuple[str, _Dec], ...] | None = None
        #: the fields a frame may lack that then read otherwise than their defaults
        #: (the class's ``absent_reads_as``), with that value in its wire form
        self.absent: tuple[tuple[str, Any], ...] = tuple(cls.absent_reads_as.items())
        self.built = False

    def build(self) -> None:
        cls = self.cls
        try:
            hints = typing.get_type_hints(cls)
        except Exception as exc:
            raise ProtocolError(
                f"{self.wire}: cannot resolve the field annotations ({exc!r}). Define every "
                "name used in them at module level.",
                type_name=self.wire,
            ) from None
        fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
        convs = []
        for f in fields:
            try:
                convs.append(_conv(hints[f.name]))
            except (_Unsupported, KeyError) as exc:
                raise ProtocolError(
                    f"{self.wire}.{f.name}: the annotation is not supported on the wire "
                    f"({exc}). Use None, bool, int, float, str, bytes, Any, tuple, list, "
                    "dict[str, X], unions, Literal or registered messages.",
                    field=f.name,
                    type_name=self.wire,
                ) from None
        self.names = frozenset(f.name for f in fields)
        self.decs = {f.name: c.dec for f, c in zip(fields, convs, strict=True)}
        self.encs = tuple((f.name, c.passes, c.enc) for f, c in zip(fields, convs, strict=True))
        self.order = tuple(f.name for f in fields)
        passes = [c.passes for c in convs]
        if fields:  # and the class last, so that one field gives a tuple too
            self.get = operator.attrgetter(*self.order, "__class__")
            passes.append(frozenset({type(cls)}))
        if math.prod(map(len, passes)) <= _MAX_PASSING:
            self.passing = frozenset(itertools.product(*passes))
        self.required = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        self.n = len(fields)
        try:
            msgspec.inspect.type_info(cls)
            preps = [(f.name, _prep(hints[f.name])) for f in fields]
        except (_NotTyped, TypeError):
            preps = None
        if preps is not None:
            self.preps = tuple((name, fn) for name, fn in preps if fn is not None)
        self.built = True

    def encode_fields(self, msg: Any, bufs: list[_Buffer]) -> dict[str, Any]:
        values = self.get(msg)
        passing = self.passing  # empty when some field always needs its converter
        if passing and tuple(map(type, values)) in passing:  # every value goes out as it is
            return dict(zip(self.order, values))  # noqa: B905 - stops before the class
        out = {}
        for (name, passes, enc), v in zip(self.encs, values):  # noqa: B905 - as above
            if type(v) not in passes:
                try:
                    v = enc(v, bufs)
                except _Invalid as exc:
                    exc.path.append("." + name)
                    raise
            out[name] = v
        return out

    def decode_fields(self, fields: Any, bufs: list[bytes]) -> Message:
        if self.absent and type(fields) is dict:  # what an older peer's frame lacks
            for name, value in self.absent:
                if name not in fields:
                    fields[name] = value
        preps = self.preps
        if preps is None:
            return self.decode_slow(fields, bufs)
        if preps or type(fields) is not dict or not fields.keys() <= self.names:
            fields = self.prepare(fields, bufs)
        try:
            msg: Message = msgspec.convert(fields, self.cls)  # strict (the default)
        except msgspec.ValidationError as exc:
            raise _from_msgspec(exc) from None
        return msg

    def prepare(self, fields: Any, bufs: list[bytes]) -> dict[str, Any]:
        """``fields`` (a JSON object of this class's fields, which it rewrites in
        place) as msgspec's input; only for a class msgspec can type."""
        if type(fields) is not dict or not fields.keys() <= self.names:
            self.check_keys(fields)
        for name, prep in self.preps or ():
            if name in fields:
                try:
                    fields[name] = prep(fields[name], bufs)
                except _Invalid as exc:
                    exc.path.append("." + name)
                    raise
        out: dict[str, Any] = fields
        return out

    def check_keys(self, fields: Any) -> None:
        """``fields`` is a JSON object with no field the class lacks."""
        if type(fields) is not dict:
            raise _mismatch(f"an object holding the fields of {self.wire}", fields)
        if not fields.keys() <= self.names:
            name = next(k for k in fields if k not in self.names)
            known = ", ".join(sorted(self.names)) or "none"
            raise _Invalid(f"unknown field (known: {known})", ["." + name])

    def decode_slow(self, fields: Any, bufs: list[bytes]) -> Message:
        """Decode with the converters alone (classes msgspec cannot type)."""
        self.check_keys(fields)
        decs = self.decs
        kwargs = {}
        for name, value in fields.items():
            try:
                kwargs[name] = decs[name](value, bufs)
            except _Invalid as exc:
                exc.path.append("." + name)
                raise
        if len(kwargs) != self.n and not self.required <= kwargs.keys():
            missing = sorted(self.required - kwargs.keys())
            raise _Invalid("required field is missing", ["." + missing[0]])
        try:
            return self.cls(**kwargs)
        except Exception as exc:
            raise _Invalid(f"{self.cls.__name__}(...) rejected the fields: {exc!r}") from None


class _NotTyped(Exception):
    """msgspec cannot type this annotation: the class is decoded by the converters."""


_MSGSPEC_ERROR = re.compile(r"^(.*?)(?: - at `\$([^`]*)`)?$", re.S)
_MISSING_FIELD = re.compile(r"^Object missing required field `(.*)`$", re.S)
_QUOTED = re.compile(r"`([^`]*)`")
_NULL = re.compile(r"\bnull\b")


#: the most combinations of field value types a class's fast encode path accepts
_MAX_PASSING = 64


def _no_values(msg: Any) -> tuple[Any, ...]:
    return ()


def _from_msgspec(exc: msgspec.ValidationError) -> _Invalid:
    """msgspec's ``Expected `int`, got `str` - at `$.a[0].b``` as an :class:`_Invalid`
    of path ``.a[0].b`` (msgspec shows a dict key as ``[...]``)."""
    match = _MSGSPEC_ERROR.match(str(exc))
    assert match is not None  # the pattern matches any text
    problem, path = match.group(1), match.group(2) or ""
    missing = _MISSING_FIELD.match(problem)
    if missing:
        problem, path = "required field is missing", f"{path}.{missing.group(1)}"
    else:
        problem = _QUOTED.sub(lambda m: _NULL.sub("None", m.group(1)), problem)
        problem = problem[:1].lower() + problem[1:]
    return _Invalid(problem, [path] if path else [])


def _prep(tp: Any) -> _Dec | None:
    """How a JSON value of annotation ``tp`` is rewritten into msgspec's input (bytes
    for buffer references, a nested message's fields for ``{"t", "f"}``, ``Any``
    values unescaped); None: it needs no rewriting. Raises :class:`_NotTyped`."""
    conv = _conv(tp)
    if conv.kind in ("scalar", "none"):
        return None
    if conv.kind in ("bytes", "any"):
        return conv.dec
    if isinstance(tp, type) and issubclass(tp, Message):
        return _message_prep(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item = _prep(args[0])
        return None if item is None else functools.partial(_prep_items, item)
    if origin is dict:
        item = _prep(args[1])
        return None if item is None else functools.partial(_prep_values, item)
    if origin is Union or origin is types.UnionType:
        preps = [_prep(a) for a in args if a is not type(None)]
        if all(p is None for p in preps):
            return None
        if len(preps) == 1 and len(args) == 2 and preps[0] is not None:  # X | None
            return functools.partial(_prep_optional, preps[0])
    raise _NotTyped(tp)  # fixed tuples and unions holding bytes, messages or Any


def _message_prep(cls: type[Message]) -> _Dec:
    if cls is Message:  # not a dataclass: msgspec takes any instance, made here
        return _message_conv(cls).dec
    if any(c is not cls and issubclass(c, cls) for c in MESSAGE_TYPES.values()):
        raise _NotTyped(cls)  # the class is named on the wire: msgspec cannot pick it
    codec = _CODECS.get(cls) or _codec_for(cls)
    if codec.local or (codec.built and codec.preps is None):
        raise _NotTyped(cls)
    expected = f"{cls.__name__} message"

    def prep(v: Any, bufs: list[bytes]) -> Any:
        if type(v) is not dict or len(v) != 2 or "f" not in v or type(v.get("t")) is not str:
            raise _mismatch(f'{expected} ({{"t": name, "f": {{...}}}})', v)
        if v["t"] != codec.wire:
            sub = MESSAGE_TYPES.get(v["t"])
            if sub is None:
                raise _Invalid(f"unknown message type {v['t']!r}")
            raise _Invalid(f"expected {expected}, got {v['t']} message")
        return codec.prepare(v["f"], bufs)

    return prep


def _prep_items(item: _Dec, v: Any, bufs: list[bytes]) -> Any:
    if type(v) is not list:
        return v  # msgspec reports it
    return _map_items(item, v, bufs)


def _prep_values(item: _Dec, v: Any, bufs: list[bytes]) -> Any:
    if type(v) is not dict:
        return v  # msgspec reports it
    return _map_values(item, v, bufs)


def _prep_optional(inner: _Dec, v: Any, bufs: list[bytes]) -> Any:
    return None if v is None else inner(v, bufs)


_CODECS: dict[type, _ClassCodec] = {}


def _codec_for(cls: type[Message]) -> _ClassCodec:
    """The (cached) codec of a registered message class."""
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _ClassCodec(cls)
        _CODECS[cls] = codec  # before building, so recursive message types terminate
        try:
            codec.build()
        except BaseException:
            del _CODECS[cls]
            raise
    return codec


def _codec_for_value(msg: object) -> _ClassCodec:
    """The codec of ``msg``'s class, after checking it is a registered message."""
    if not isinstance(msg, Message):
        raise ProtocolError(
            f"expected a Message, got {_describe(msg)}. Only @message classes go on the wire."
        )
    cls = type(msg)
    if MESSAGE_TYPES.get(cls.wire_name) is not cls:
        raise ProtocolError(
            f"{cls.__qualname__} is not a registered message; decorate it with @message().",
            type_name=cls.__qualname__,
        )
    return _codec_for(cls)
