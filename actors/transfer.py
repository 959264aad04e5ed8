"""Values of any size across processes: streamed in parts, never one huge message.

What lives here: the serialized form of a value as *segments* (a protocol-5 pickle
stream followed by its out-of-band buffers), the sender's table of open streams
(:class:`StreamTable`), and the receiver's reader (:func:`receive`). No actor state;
the worker and the manager call these.

The rule: a value asked for across a process boundary whose recorded size is at least
``GetData.stream_over`` does not travel inside the ``DataReply``. The reply carries a
:class:`StreamInfo` instead (the stream's id and the sizes of its segments), and the
requester reads the value with ``ReadStream(stream, offset, length)`` asks of at most
:data:`PART_BYTES` each, :data:`WINDOW` of them in flight, into buffers it allocates
once it knows the sizes. So:

- the sender holds at most ``WINDOW`` parts beyond the value itself: the segments of a
  value in memory are views of its own buffers (numpy arrays, pandas blocks, ... pickle
  their data out of band, with no copy); a value with no out-of-band buffers (a large
  list, ``bytes``) is pickled once; a spilled value is read from its spill file part by
  part, never loaded;
- the receiver allocates each segment once and unpickles with the buffers in place (a
  numpy array uses its buffer without a further copy);
- every part is one ask with a timeout, so a sender that dies or stalls fails the read
  within that bound (the caller treats the value as missing and it is recomputed);
- a receiver with a memory limit refuses a value larger than it before reading a byte
  (:class:`~runtime.errors.ValueTooLarge`, naming the key, its size and the limit).

A stream ends when its last byte has been read, when the reader sends ``CloseStream``,
or after :data:`IDLE_SECONDS` without a read (a reader that died).

Files always travel as streams of the file's bytes (one segment; ``StreamInfo.file`` is
the holder's :class:`~runtime.files.File`, with its size and sha256), to a peer in this
process too: file outputs (``runtime/files.py``) and the checkpoint files a worker copies
from a peer (``actors/checkpoints.py``). :func:`fetch_file`, the one reader of both,
writes each part straight into a ``.part`` file at
its offset (the file is never whole in memory), checks each part's length and, at the
end, the file's sha256 (in a thread, not on the event loop), and renames it into place.
When a part cannot be had (the connection broke, the ask timed out) it keeps the bytes
written from the start up to the first gap and asks for a new stream from there, at most
:data:`RESUMES` times; past that it raises :class:`StreamBroken` with the ``.part`` file
left for the caller (which may resume from the next holder).
"""

from __future__ import annotations

import abc
import contextlib
import os
import pickle
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import anyio

from runtime import pickling, unpickling
from runtime.errors import CorralError, FileChecksumError, UnknownStream, ValueTooLarge
from runtime.files import File, digest
from runtime.messages import CloseStream, ReadStream, StreamPart

__all__ = [
    "IDLE_SECONDS",
    "PART_BYTES",
    "READ_TIMEOUT",
    "RESUMES",
    "STREAM_BYTES",
    "WINDOW",
    "BufferSegments",
    "FileSegments",
    "Relayed",
    "Segments",
    "StreamBroken",
    "StreamInfo",
    "StreamTable",
    "UnknownStream",
    "fetch_file",
    "receive",
    "receive_file",
    "serialize",
]

#: values whose recorded size is at least this travel as streams across processes
STREAM_BYTES = 32 * 2**20
#: bytes asked for in one ReadStream
PART_BYTES = 8 * 2**20
#: ReadStream asks in flight per stream
WINDOW = 4
#: an open stream nobody read for this long is closed (its reader died)
IDLE_SECONDS = 120.0
#: seconds a client waits for one part read through the manager (which waits at most
#: its ``gather_timeout``, 60 s by default, for the worker)
READ_TIMEOUT = 90.0
#: new streams a file fetch opens after a broken one, from the bytes it has
RESUMES = 3


class StreamInfo(NamedTuple):
    """What a requester needs to read a streamed value.

    ``sizes``: the pickle stream's length, then each out-of-band buffer's. ``worker``:
    where the stream is open, when the reader asks through a relay (the manager)."""

    key: Any
    stream: int
    sizes: tuple[int, ...]
    worker: str = ""
    file: File | None = None  #: a file output's handle on its holder: its bytes stream


class Segments(abc.ABC):
    """A serialized value: ``sizes`` of its segments, and ``read`` of any byte range
    of their concatenation. ``close`` frees what it holds."""

    sizes: tuple[int, ...]

    @abc.abstractmethod
    def read(self, offset: int, length: int) -> bytes:
        """Bytes ``offset`` to ``offset + length`` of the concatenated segments."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free what it holds (views of the value, a file descriptor)."""

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def _spans(self, offset: int, length: int) -> list[tuple[int, int, int]]:
        """``(segment, start, stop)`` pieces of the range, in order."""
        if offset < 0 or length < 0 or offset + length > self.total:
            raise ValueError(f"range {offset}+{length} is outside the stream's {self.total} bytes")
        out = []
        base = 0
        end = offset + length
        for i, size in enumerate(self.sizes):
            lo, hi = max(offset, base), min(end, base + size)
            if lo < hi:
                out.append((i, lo - base, hi - base))
            base += size
            if base >= end:
                break
        return out


class BufferSegments(Segments):
    """Segments held in memory (views of the value's own buffers where it has them)."""

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.parts = [memoryview(p).cast("B") for p in parts]
        self.sizes = tuple(p.nbytes for p in self.parts)

    def read(self, offset: int, length: int) -> bytes:
        return b"".join(self.parts[i][lo:hi] for i, lo, hi in self._spans(offset, length))

    def close(self) -> None:
        for p in self.parts:
            p.release()
        self.parts = []


class FileSegments(Segments):
    """Segments at ``(offset, length)`` places of a file, read on demand.

    The file is opened at once and read through that descriptor, so a spill file
    removed meanwhile (its value loaded back or dropped) still reads whole."""

    def __init__(self, path: str, spans: Sequence[tuple[int, int]]) -> None:
        self.fd: int | None = os.open(path, os.O_RDONLY)
        self.path = path
        self.starts = [start for start, _ in spans]
        self.sizes = tuple(length for _, length in spans)

    def read(self, offset: int, length: int) -> bytes:
        if self.fd is None:
            raise ValueError(f"the stream of {self.path!r} is closed")
        out = []
        for i, lo, hi in self._spans(offset, length):
            want = hi - lo
            data = os.pread(self.fd, want, self.starts[i] + lo)
            if len(data) != want:
                raise EOFError(f"spill file {self.path!r} is truncated")
            out.append(data)
        return b"".join(out)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def serialize(value: Any) -> BufferSegments:
    """``value`` as a protocol-5 pickle (pickle, then cloudpickle) and the views of its
    out-of-band buffers. Raises what both picklers raised if neither can."""
    first: Exception | None = None
    for dumps in (pickle.dumps, pickling.cloudpickle_dumps):
        buffers: list[pickle.PickleBuffer] = []
        try:
            head = dumps(value, protocol=5, buffer_callback=buffers.append)
            raws = [b.raw() for b in buffers]
        except Exception as exc:
            first = first or exc
            continue
        return BufferSegments([head, *raws])
    assert first is not None
    raise first


class _Open:
    __slots__ = ("key", "segments", "served", "used")

    def __init__(self, key: Any, segments: Segments, now: float) -> None:
        self.key = key
        self.segments = segments
        self.served = 0
        self.used = now


class StreamTable:
    """The sender's open streams. Not thread-safe: one actor's loop uses it."""

    def __init__(self) -> None:
        self.open: dict[int, _Open] = {}
        self._next = 1
        self.opened = 0  #: streams ever opened
        self.bytes_served = 0  #: bytes ever read out of them

    def __len__(self) -> int:
        return len(self.open)

    @property
    def in_memory(self) -> bool:
        """Whether an open stream serves a value from memory (views of its buffers):
        they stay in memory until the stream ends, whatever the store holds meanwhile (a
        value spilled or dropped while a reader reads it)."""
        return any(isinstance(st.segments, BufferSegments) for st in self.open.values())

    def start(self, key: Any, segments: Segments, now: float) -> StreamInfo:
        """Open a stream of ``segments``; the requester reads it by the returned info."""
        self.expire(now)
        sid = self._next
        self._next += 1
        self.open[sid] = _Open(key, segments, now)
        self.opened += 1
        return StreamInfo(key, sid, segments.sizes)

    def read(self, stream: int, offset: int, length: int, now: float) -> bytes:
        """Bytes ``offset`` to ``offset + length`` of ``stream``. The stream closes once
        as many bytes as it holds have been read (parts are read once each)."""
        st = self.open.get(stream)
        if st is None:
            raise UnknownStream(stream, IDLE_SECONDS)
        try:
            data = st.segments.read(offset, length)
        except Exception:
            self.close(stream)
            raise
        st.used = now
        st.served += len(data)
        self.bytes_served += len(data)
        if st.served >= st.segments.total:
            self.close(stream)
        return data

    def close(self, stream: int) -> None:
        st = self.open.pop(stream, None)
        if st is not None:
            st.segments.close()

    def expire(self, now: float) -> list[Any]:
        """Close streams unread for :data:`IDLE_SECONDS`; return their keys."""
        stale = [sid for sid, st in self.open.items() if now - st.used > IDLE_SECONDS]
        keys = [self.open[sid].key for sid in stale]
        for sid in stale:
            self.close(sid)
        return keys

    def close_all(self) -> None:
        for sid in list(self.open):
            self.close(sid)


class Relayed:
    """The streams a relay (the manager) passes on to their readers, by ``(worker,
    stream)``: each one's key, the bytes it has not passed on yet and when it last
    did, so that it knows when a reader has had a whole value. Parts are read once
    each, as the sender's :class:`StreamTable` counts them. A stream whose read fails
    or is closed is dropped (:meth:`end`); one nobody read for :data:`IDLE_SECONDS`
    (its reader died) too, when the next starts. Not thread-safe."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], list[Any]] = {}  #: [key, bytes left, used]

    def start(self, info: StreamInfo, now: float) -> tuple[Any, ...]:
        """``info`` (open on ``info.worker``) is for a reader to read through us:
        ``(key,)`` if it has no byte to read (the reader has the value already)."""
        stale = [k for k, (_, _, used) in self.open.items() if now - used > IDLE_SECONDS]
        for k in stale:
            del self.open[k]
        self.open[(info.worker, info.stream)] = [info.key, sum(info.sizes), now]
        return self.passed(info.worker, info.stream, 0, now)

    def passed(self, worker: str, stream: int, nbytes: int, now: float) -> tuple[Any, ...]:
        """``nbytes`` of the stream were passed on: ``(key,)`` once all of them were."""
        entry = self.open.get((worker, stream))
        if entry is None:
            return ()
        entry[1] -= nbytes
        entry[2] = now
        if entry[1] > 0:
            return ()
        del self.open[(worker, stream)]
        return (entry[0],)

    def end(self, worker: str, stream: int) -> None:
        """The stream's read failed or was given up: its reader has not the value."""
        self.open.pop((worker, stream), None)


AskPart = Callable[[ReadStream], Awaitable[StreamPart]]


async def receive_parts(
    ask: AskPart,
    info: StreamInfo,
    *,
    limit: int = 0,
    where: str = "",
    part_bytes: int = PART_BYTES,
    window: int = WINDOW,
) -> list[bytearray | memoryview]:
    """Read the whole stream ``info`` into one writable buffer per segment
    (:func:`runtime.unpickling.buffer`: a large one's pages untouched until written).

    ``ask`` sends one ReadStream and returns its StreamPart (bounded in time by the
    caller's ask timeout). With ``limit``, a stream longer than it raises
    :class:`ValueTooLarge` before anything is read or allocated."""
    total = sum(info.sizes)
    if limit and total > limit:
        raise ValueTooLarge(str(info.key), total, limit, where or "the receiver")
    bufs = [unpickling.buffer(n) for n in info.sizes]  # untouched: no GIL-held zeroing
    views = [memoryview(b) for b in bufs]
    starts = []
    base = 0
    for n in info.sizes:
        starts.append(base)
        base += n
    ranges = [(off, min(part_bytes, total - off)) for off in range(0, total, part_bytes)]
    slots = anyio.Semaphore(window)

    def place(offset: int, data: bytes) -> None:
        end = offset + len(data)
        for i, start in enumerate(starts):
            lo, hi = max(offset, start), min(end, start + info.sizes[i])
            if lo < hi:
                views[i][lo - start : hi - start] = memoryview(data)[lo - offset : hi - offset]

    errors: list[Exception] = []

    async def one(offset: int, length: int, scope: anyio.CancelScope) -> None:
        try:
            async with slots:
                part = await ask(ReadStream(info.stream, offset, length, info.worker))
            _check_part(info, offset, length, part)
            place(offset, part.data)
        except Exception as exc:  # the first failure ends the read; it is raised below
            errors.append(exc)
            scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            for offset, length in ranges:
                tg.start_soon(one, offset, length, tg.cancel_scope)
    finally:
        for v in views:
            v.release()
    if errors:
        raise errors[0]
    return bufs


def _check_part(info: StreamInfo, offset: int, length: int, part: StreamPart) -> None:
    """A part of ``length`` bytes asked at ``offset`` must come back that long."""
    if len(part.data) != length:
        raise CorralError(
            f"stream {info.stream} of {info.key!r}: asked {length} bytes at {offset}, "
            f"got {len(part.data)}",
            key=str(info.key),
        )


def loads(parts: Sequence[bytes | bytearray | memoryview]) -> Any:
    """The value of a stream read by :func:`receive_parts` (or of ``BufferSegments``)."""
    return unpickling.loads(parts[0], parts[1:])


async def receive(
    ask: AskPart,
    info: StreamInfo,
    *,
    limit: int = 0,
    where: str = "",
    close: Callable[[CloseStream], None] | None = None,
) -> Any:
    """Read and unpickle the streamed value ``info``. On failure the sender is told to
    close the stream (``close``, best effort) and the error propagates."""
    try:
        parts = await receive_parts(ask, info, limit=limit, where=where)
    except BaseException:
        if close is not None:
            with contextlib.suppress(Exception):  # best effort: the sender expires it anyway
                close(CloseStream(info.stream, info.worker))
        raise
    return loads(parts)


class StreamBroken(Exception):
    """A file stream stopped before its end (``error`` says why); the bytes from the
    start to ``prefix`` are in the ``.part`` file ``part``."""

    def __init__(self, key: Any, prefix: int, part: str, error: BaseException) -> None:
        super().__init__(f"stream of {key!r} broke at byte {prefix}: {error!r}")
        self.key = key
        self.prefix = prefix
        self.part = part
        self.error = error


async def receive_file(
    ask: AskPart,
    info: StreamInfo,
    part: str,
    *,
    offset: int = 0,
    part_bytes: int = PART_BYTES,
    window: int = WINDOW,
) -> None:
    """Write bytes ``offset`` to the end of the one-segment stream ``info`` into the
    file ``part`` at the same offsets (the bytes before ``offset`` are there already).
    At most ``window`` parts of ``part_bytes`` are in flight, and each is written as it
    comes. A part that cannot be had, or comes back of the wrong length, raises
    :class:`StreamBroken` with the bytes written from the start without a gap."""
    total = sum(info.sizes)
    done: dict[int, int] = {}  #: offset -> length, of the parts written
    errors: list[BaseException] = []
    slots = anyio.Semaphore(window)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)

    async def one(at: int, length: int, scope: anyio.CancelScope) -> None:
        try:
            async with slots:
                got = await ask(ReadStream(info.stream, at, length, info.worker))
                _check_part(info, at, length, got)
                data = got.data
                del got
                with anyio.CancelScope(shield=True):  # a part received is kept
                    await anyio.to_thread.run_sync(_pwrite_all, fd, data, at)
                done[at] = length
        except Exception as exc:  # the first failure ends this stream; resumed below
            errors.append(exc)
            scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            for at in range(offset, total, part_bytes):
                tg.start_soon(one, at, min(part_bytes, total - at), tg.cancel_scope)
    finally:
        os.close(fd)
    if errors:
        prefix = offset
        while prefix in done:
            prefix += done[prefix]
        raise StreamBroken(info.key, prefix, part, errors[0])


def _pwrite_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


Reopen = Callable[[int], Awaitable[StreamInfo | None]]


async def fetch_file(
    ask: AskPart,
    info: StreamInfo,
    dest: str,
    *,
    reopen: Reopen,
    part: str = "",
    offset: int = 0,
    resumes: int = RESUMES,
    close: Callable[[CloseStream], None] | None = None,
    holder: str = "",
    part_bytes: int = PART_BYTES,
    window: int = WINDOW,
) -> File:
    """Copy the file streamed by ``info`` (a file output, or a checkpoint file) to the
    path ``dest``; its handle there.

    ``part``/``offset``: a ``.part`` file holding the file's first ``offset`` bytes
    already (an earlier fetch that broke), else ``dest + ".part"`` is made. After a broken
    stream, ``reopen(offset)`` opens a new one of the same file (None: the holder has
    it no more), at most ``resumes`` times; then :class:`StreamBroken` is raised with
    the ``.part`` file kept. A copy whose sha256 is not the holder's raises
    :class:`~runtime.errors.FileChecksumError`, the ``.part`` file removed; any other
    error removes it too. ``close`` tells a holder a stream is given up (best effort)."""
    meta = info.file
    if meta is None or meta.size is None or meta.checksum is None:
        raise ValueError(f"stream {info.stream} of {info.key!r} is not a measured file")
    part = part or dest + ".part"
    tries = 0
    try:
        while True:
            try:
                await receive_file(
                    ask, info, part, offset=offset, part_bytes=part_bytes, window=window
                )
                break
            except StreamBroken as exc:
                offset = exc.prefix
                if close is not None:
                    with contextlib.suppress(Exception):
                        close(CloseStream(info.stream, info.worker))
                tries += 1
                if tries > resumes:
                    raise
                try:
                    again = await reopen(offset)
                except Exception as error:  # the holder cannot be reached: the next one
                    raise StreamBroken(info.key, offset, part, error) from error
                if again is None:
                    raise StreamBroken(
                        info.key, offset, part, LookupError("the holder has it no more")
                    ) from exc
                if again.file != meta:  # not the same file: start again
                    raise StreamBroken(
                        info.key, 0, part, LookupError("the holder's file changed")
                    ) from exc
                info = again
        if close is not None:  # a stream read from its middle (or empty) stays open
            with contextlib.suppress(Exception):
                close(CloseStream(info.stream, info.worker))
        size, checksum = await anyio.to_thread.run_sync(digest, part)
        if size != meta.size or checksum != meta.checksum:
            got = checksum if size == meta.size else f"{checksum} ({size} bytes, not {meta.size})"
            raise FileChecksumError(str(info.key), holder or info.worker, meta.checksum, got)
        os.replace(part, dest)
    except StreamBroken as exc:
        if exc.prefix == 0:
            with contextlib.suppress(OSError):
                os.unlink(part)
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return File(dest, meta.name, meta.size, meta.checksum)
