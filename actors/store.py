"""A worker's spillable store: task outputs in memory, least recently used ones on disk.

What lives here: :class:`SpillStore`, a mutable mapping from task key to output that the
worker can ask to move bytes to disk (``spill(nbytes)``) and that reads spilled values
back transparently. Deciding *when* to spill is the memory governor's job
(``actors/memory.py``); this module only moves bytes and keeps the books.

The rules:

- Never lose a value. A value is written to a temporary file, renamed into place with
  ``os.replace``, and only then is the in-memory reference dropped. A write that fails
  (``OSError``, e.g. ``ENOSPC``) or would pass ``disk_limit`` removes its partial file,
  leaves the value in memory, sets :attr:`SpillStore.disk_full` and stops the spill.
  A spilled value whose file cannot be read back raises and stays on disk.
- Least recently used first. Storing or reading a value makes it the most recently
  used; ``get_raw`` (serving a peer) and ``nbytes`` do not change recency. The caller
  may name values to keep in memory and values to move last (:meth:`SpillStore.spill_keys`).
- Values that cannot be pickled (pickle protocol 5, then cloudpickle) stay in memory;
  each is logged once and skipped by later spills until it is overwritten or deleted.
- Sizes are the *recorded* sizes (``nbytes=`` as given, else ``sizeof``, else 0):
  ``memory_bytes``, ``spilled_total``, ``unspilled_total`` and the amount ``spill``
  moves count them. ``disk_bytes`` and ``disk_limit`` count real file bytes.
- Zero-copy where cheap: out-of-band pickle buffers (numpy arrays, ...) are written
  straight from the object's memory, and read back with ``readinto`` into writable
  buffers (:func:`runtime.unpickling.buffer`: pages untouched, not zeroed holding the
  GIL) that the unpickled value uses without a further copy.
- Not thread-safe: the worker uses a store from its event-loop thread only. What
  may run on another thread is the writing of one spill file
  (:meth:`SpillStore.spill_keys_off_loop`: the value stays in memory, served, until its
  file is in place) and the reading of an opened one (:func:`load_opened`).
- File outputs (``runtime/files.py``) are *file entries*: a file already on disk in the
  store's directory (its sandbox), kept as it is (:meth:`SpillStore.put_file`). Their
  bytes count in ``disk_bytes`` (one disk budget with the spilled values), never in
  ``memory_bytes``; they are never spilled nor loaded: reading the key gives its
  :class:`~runtime.files.File` handle, a peer reads the file's bytes from its segments,
  and deleting the key deletes the file.
- The store's directory (its *sandbox*, ``corral-spill-*``) proves its owner is alive:
  the store holds an advisory lock (``flock``) on the sandbox's ``.owner`` file for as
  long as it keeps the directory, and the kernel releases it when the process dies, by
  SIGKILL too. A store making its sandbox first sweeps its siblings (:func:`sweep_orphans`):
  a ``corral-spill-*`` directory whose lock nobody holds is an orphan (its worker was
  killed) and is removed. The ``.owner`` file is locked before it gets its name, so a
  sandbox being made is never taken for an orphan. A store removing its own sandbox
  renames it first (nothing lands in it while it goes) and unlinks ``.owner`` last, so
  what it cannot remove is an orphan for the next sweep (:func:`_remove_sandbox`).

Spill file format (little-endian)::

    header   magic b"CRSP" | version u16 | reserved u16 | n_buffers u32 | pickle_len u64
    pickle   pickle_len bytes: the protocol-5 pickle stream (buffers out of band)
    table    n_buffers x u64: the length of each out-of-band buffer
    buffers  each buffer's bytes, in the order the pickle stream refers to them

The pickle stream is written straight into the file (no in-memory copy of it), so the
buffer lengths, known only after pickling, follow it rather than sit in the header.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import math
import os
import pickle
import re
import shutil
import struct
import tempfile
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Iterator, MutableMapping
from types import TracebackType
from typing import Any, BinaryIO, Self, TypeVar

import anyio
import anyio.to_thread
import cloudpickle
from dask.sizeof import sizeof as _dask_sizeof

from actors.transfer import FileSegments, Segments, serialize
from runtime import unpickling
from runtime.files import File
from runtime.graph import Key
from runtime.log import get_logger

__all__ = ["SpillStore", "Unpicklable", "sweep_orphans"]

_log = get_logger("corral.store", component="store")
_T = TypeVar("_T")

_MAGIC = b"CRSP"
_VERSION = 1
_HEADER = struct.Struct("<4sHHIQ")  # magic, version, reserved, n_buffers, pickle_len
_LENGTH = struct.Struct("<Q")


class _NoRoom(Exception):
    """Internal: the file being written would pass the store's ``disk_limit``."""


class _Dropped(Exception):
    """Internal: the value being written was deleted or replaced in the store (or the
    store closed) meanwhile: the file is of nothing, and writing the rest of it would
    keep the value in memory that long (a chaos audit: an 800 MB output dropped while a
    30-40 s spill wrote it stayed in the worker's RSS until the write ended)."""


#: a spill file is written this many bytes at a time at most, the value's place in the
#: store checked between two (:class:`_Dropped`)
WRITE_CHUNK = 8 * 2**20


class _WriteFailed(Exception):
    """Internal: writing a spill file failed with ``error`` (an ``OSError``)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class Unpicklable(TypeError):
    """Neither pickle nor cloudpickle could serialize a value: it can be neither
    spilled nor sent to another process. ``reason``: what pickling it raised, as text
    (``TypeError: cannot pickle '_thread.lock' object``). A ``TypeError``, as what
    pickling such a value raises mostly is."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @classmethod
    def of(cls, error: BaseException) -> Unpicklable:
        return cls(f"{type(error).__name__}: {error}")


class _Sink:
    """A write-only file wrapper that counts bytes and refuses to pass ``budget``.

    Errors from the file become :class:`_WriteFailed`, so that an ``OSError`` raised
    while pickling is told apart from one raised by the disk.
    """

    __slots__ = ("budget", "file", "gone", "written")

    def __init__(
        self, file: BinaryIO, budget: int | None, gone: Callable[[], bool] | None = None
    ) -> None:
        self.file = file
        self.budget = budget
        self.gone = gone  #: whether the value was dropped meanwhile (:class:`_Dropped`)
        self.written = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        if self.budget is not None and self.written + n > self.budget:
            raise _NoRoom
        try:
            for at in range(0, n, WRITE_CHUNK):
                if self.gone is not None and self.gone():
                    raise _Dropped
                self.file.write(view[at : at + WRITE_CHUNK])
        except OSError as exc:
            raise _WriteFailed(exc) from exc
        finally:
            view.release()
        self.written += n
        return n


def _dump_into(
    file: BinaryIO, value: Any, budget: int | None, gone: Callable[[], bool] | None = None
) -> int:
    """Write ``value`` to ``file`` in the spill format; return the bytes written.

    Raises :class:`Unpicklable`, :class:`_NoRoom`, :class:`_WriteFailed` or (once
    ``gone()`` says so, checked every ``WRITE_CHUNK`` bytes) :class:`_Dropped`; the file
    then holds garbage and the caller removes it.
    """
    sink = _Sink(file, budget, gone)
    raws: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> None:
        raws.append(buf.raw())  # BufferError if not contiguous: treated as unpicklable

    first_error: Exception | None = None
    for pickler in (pickle.Pickler, cloudpickle.Pickler):
        file.seek(0)
        file.truncate()
        sink.written = 0
        raws.clear()
        sink.write(bytes(_HEADER.size))
        try:
            pickler(sink, protocol=5, buffer_callback=keep).dump(value)
        except (_NoRoom, _WriteFailed, _Dropped):
            raise
        except Exception as exc:
            if first_error is None:
                first_error = exc
            continue
        break
    else:
        assert first_error is not None
        raise Unpicklable.of(first_error)
    pickle_len = sink.written - _HEADER.size
    sink.write(b"".join(_LENGTH.pack(m.nbytes) for m in raws))
    for m in raws:
        sink.write(m)
        m.release()
    try:
        file.seek(0)
        file.write(_HEADER.pack(_MAGIC, _VERSION, 0, len(raws), pickle_len))
    except OSError as exc:
        raise _WriteFailed(exc) from exc
    return sink.written


def _read_header(file: BinaryIO) -> tuple[int, int]:
    """Check a spill file's header; return ``(n_buffers, pickle_len)``."""
    head = file.read(_HEADER.size)
    if len(head) != _HEADER.size:
        raise EOFError(f"spill file {file.name!r} is truncated")
    magic, version, _, n_buffers, pickle_len = _HEADER.unpack(head)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"{file.name!r} is not a version-{_VERSION} Corral spill file")
    return n_buffers, pickle_len


def _load_from(path: str) -> Any:
    """Read a value back from a spill file, its buffers into writable buffers
    (:func:`runtime.unpickling.buffer`)."""
    return load_opened(open(path, "rb"))


def load_opened(file: io.BufferedReader) -> Any:
    """Read a value back from its spill file, opened (:meth:`SpillStore.open_spilled`),
    and close it. Touches nothing of the store's: safe on any thread."""
    path = file.name
    with file:
        n_buffers, pickle_len = _read_header(file)
        buffers: list[bytearray | memoryview] = []
        if n_buffers:
            file.seek(_HEADER.size + pickle_len)
            table = file.read(_LENGTH.size * n_buffers)
            if len(table) != _LENGTH.size * n_buffers:
                raise EOFError(f"spill file {path!r} is truncated")
            for (length,) in _LENGTH.iter_unpack(table):
                buf = unpickling.buffer(length)  # untouched: no GIL-held zeroing
                view = memoryview(buf)
                got = 0
                while got < length:
                    n = file.readinto(view[got:])
                    if not n:
                        raise EOFError(f"spill file {path!r} is truncated")
                    got += n
                view.release()
                buffers.append(buf)
            file.seek(_HEADER.size)
        # Unpickle straight from the file (frame by frame): no copy of the whole stream.
        return unpickling.load(file, buffers)


def _dumps_inband(value: Any) -> bytes:
    """A protocol-5 pickle of ``value`` with every buffer in band (pickle, then cloudpickle)."""
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:
        data: bytes = cloudpickle.dumps(value, protocol=5)
        return data


# -- the sandbox and its lock ------------------------------------------------------------

_PREFIX = "corral-spill-"  #: every sandbox's name starts so
#: a sandbox's name in full: what ``tempfile.mkdtemp`` makes with that prefix
_NAME = re.compile(re.escape(_PREFIX) + r"[a-z0-9_]{8}")
_OWNER = ".owner"  #: the lock file in a sandbox, locked (flock) by its live store
#: a sandbox without a lock file (made by an older Corral, or by a store killed while
#: making it) is an orphan once nothing at its top level has changed for this long
LOCKLESS_AGE = 600.0
#: most seconds one sweep spends; what is left waits for the next sweep
SWEEP_SECONDS = 10.0


def _make_sandbox(parent: str | None) -> tuple[str, int]:
    """A new sandbox in ``parent`` and the descriptor that holds its lock.

    The lock file is made under a temporary name, locked, and only then renamed
    ``.owner``: no other store ever finds a ``.owner`` that is not locked yet.
    """
    path = tempfile.mkdtemp(prefix=_PREFIX, dir=parent)
    tmp = os.path.join(path, _OWNER + ".new")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # empty: the lock is all it says
            os.rename(tmp, os.path.join(path, _OWNER))
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path, fd


def _remove_sandbox(path: str, fd: int) -> None:
    """Remove a store's own sandbox, then let go of its lock.

    It is first renamed, to a new sandbox name beside it: no path in it resolves any
    more, so a task still running in a thread (threads cannot be killed) that asks for
    an output path, hands in its file output or writes a checkpoint then gets an error
    and puts nothing there, and what is in the sandbox is all there is to remove. The
    lock file goes last: what cannot be removed keeps it, and once the lock is let go
    the next store's sweep takes that as a killed worker's (:func:`sweep_orphans`)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            path = _renamed(path)
            _remove_within(path, math.inf, [0], top=True)
    except OSError as exc:
        _log.warning(
            "cannot remove all of the sandbox; the next store made beside it sweeps the rest",
            path=path,
            error=repr(exc),
        )
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _renamed(path: str) -> str:
    """Rename the sandbox ``path`` to a fresh sandbox name beside it; the new path (or
    ``path`` if it cannot be renamed)."""
    try:
        new = tempfile.mkdtemp(prefix=_PREFIX, dir=os.path.dirname(path))
    except OSError:
        return path
    try:
        os.rename(path, new)  # over the empty directory just made
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(new)
        if not os.path.lexists(path):
            raise
        return path
    return new


class _OutOfTime(Exception):
    """Internal: the sweep's time is up."""


def _remove_within(path: str, deadline: float, freed: list[int], top: bool = False) -> None:
    """Remove the directory ``path`` and all in it, adding the file bytes to
    ``freed[0]``; never follows a symbolic link (a link is removed, not what it points
    to). Raises :class:`_OutOfTime` past ``deadline`` (monotonic), leaving the rest; at
    the top, the lock file goes last so that an unfinished orphan is still one."""
    entries: list[os.DirEntry[str]] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(path) as it:
        entries = list(it)
    if top:
        entries.sort(key=lambda e: e.name == _OWNER)
    for entry in entries:
        if time.monotonic() > deadline:
            raise _OutOfTime
        if entry.is_dir(follow_symlinks=False):
            _remove_within(entry.path, deadline, freed)
            continue
        with contextlib.suppress(FileNotFoundError):
            size = entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
            freed[0] += size
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def _quiet_since(path: str) -> float:
    """The newest modification time of ``path`` and of what is at its top level;
    infinite if sandboxes are in it (a directory of sandboxes, not one)."""
    newest = os.lstat(path).st_mtime
    with os.scandir(path) as it:
        for entry in it:
            if entry.name.startswith(_PREFIX):
                return float("inf")
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def _is_orphan(path: str, lockless_age: float) -> tuple[bool, int | None]:
    """Whether the sandbox ``path`` is an orphan, and if so the descriptor holding its
    lock (None when it has no lock file); the caller closes it."""
    try:
        fd = os.open(
            os.path.join(path, _OWNER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        )
    except FileNotFoundError:
        # No lock file: an older Corral's sandbox, or one being made (or removed) now.
        try:
            return time.time() - _quiet_since(path) > lockless_age, None
        except FileNotFoundError:
            return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False, None  # its owner is alive
    except BaseException:
        os.close(fd)
        raise
    return True, fd


def sweep_orphans(
    parent: str,
    *,
    keep: str | None = None,
    lockless_age: float = LOCKLESS_AGE,
    seconds: float = SWEEP_SECONDS,
) -> tuple[int, int]:
    """Remove the orphaned sandboxes in ``parent``; return how many and their file bytes.

    An orphan is a ``corral-spill-XXXXXXXX`` directory (as ``tempfile.mkdtemp`` names
    it) of this user (never a symbolic link; never ``keep``) whose ``.owner`` lock nobody
    holds (its store's process died), or one with no ``.owner`` file where nothing at
    its top level changed for ``lockless_age`` seconds (and no sandbox is inside).
    Nothing is followed out of a sandbox. Errors are logged and skipped; after
    ``seconds`` the sweep stops (the next one goes on). Logs what it removed at info.
    """
    deadline = time.monotonic() + seconds
    count = freed = 0
    try:
        with os.scandir(parent) as it:
            entries = [e for e in it if _NAME.fullmatch(e.name) and e.path != keep]
    except OSError as exc:
        _log.warning("cannot look for orphaned sandboxes", parent=parent, error=repr(exc))
        return 0, 0
    uid = os.getuid()
    for entry in entries:
        if time.monotonic() > deadline:
            _log.warning("sweeping orphaned sandboxes: out of time", parent=parent)
            break
        fd: int | None = None
        done = [0]
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            orphan, fd = _is_orphan(entry.path, lockless_age)
            if orphan:
                _remove_within(entry.path, deadline, done, top=True)
                count += 1
        except _OutOfTime:
            _log.warning("sweeping orphaned sandboxes: out of time", parent=parent)
            break
        except Exception as exc:
            _log.warning("cannot sweep a sandbox", path=entry.path, error=repr(exc))
        finally:
            freed += done[0]
            if fd is not None:
                os.close(fd)
    if count or freed:
        _log.info("swept orphaned sandboxes", parent=parent, sandboxes=count, bytes=freed)
    return count, freed


class _Job:
    """One value's spill file to write: :meth:`SpillStore._begin` makes it on the
    store's thread, :func:`_write_job` writes it on any thread, and
    :meth:`SpillStore._finish` takes it back on the store's thread."""

    __slots__ = ("budget", "directory", "done", "final", "generation", "gone", "key", "value")

    def __init__(
        self,
        key: Key,
        value: Any,
        directory: str | OSError,
        seq: int,
        budget: int | None,
        generation: int,
        gone: Callable[[], bool] | None = None,
    ) -> None:
        self.key = key
        self.value = value
        #: whether the value was deleted or replaced in its store meanwhile (read on the
        #: writing thread: a stale answer costs one more WRITE_CHUNK)
        self.gone = gone
        self.directory = directory  #: the sandbox, or why it could not be made
        name = f"{seq:08d}.spill"
        self.final = "" if isinstance(directory, OSError) else os.path.join(directory, name)
        self.budget = budget
        self.generation = generation
        self.done = False  #: the value is on disk now (set by ``_finish``)


def _write_job(job: _Job) -> int | BaseException:
    """Write ``job``'s value to a temporary file and rename it into place; return its
    bytes, or what went wrong (:class:`Unpicklable`, :class:`_NoRoom`,
    :class:`_WriteFailed`, :class:`_Dropped`, an ``OSError``), the partial file removed.
    Touches nothing but the file, and reads (``job.gone``) whether the value is still
    its key's: safe on a thread other than the store's."""
    if isinstance(job.directory, OSError):
        return job.directory
    tmp: str | None = job.final[: -len(".spill")] + ".tmp"
    try:
        assert tmp is not None
        with open(tmp, "w+b") as file:
            file_bytes = _dump_into(file, job.value, job.budget, job.gone)
        os.replace(tmp, job.final)
        tmp = None
        return file_bytes
    except (Unpicklable, _NoRoom, _WriteFailed, _Dropped, OSError) as exc:
        return exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _unlink_off_loop(path: str) -> None:
    """Delete spill file ``path``: on an event loop, from a thread of its default
    executor (unlinking a 200 MB file just written took the worker's event loop for
    over a second on a loaded machine); with none running, here. A spill file's name
    is used once, so its deletion may come late; the disk counts it gone at once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _unlink_quietly(path)
        return
    loop.run_in_executor(None, _unlink_quietly, path)


class _OnDisk:
    """Where a spilled value lives and how many bytes its file takes."""

    __slots__ = ("file_bytes", "path")

    def __init__(self, path: str, file_bytes: int) -> None:
        self.path = path
        self.file_bytes = file_bytes


class SpillStore(MutableMapping[Key, Any]):
    """Task outputs by key, in memory or spilled to disk, least recently used first.

    ``store[key] = value`` / :meth:`put` keep ``value`` in memory as the most recently
    used. ``store[key]`` returns it, reading a spilled value back into memory (and
    deleting its file) first. :meth:`spill` moves least recently used values to disk.
    ``in``, ``len``, iteration and ``del`` cover memory and disk alike; ``values()``
    and ``items()`` read every spilled value back, as ``store[key]`` does.

    ``directory``: where spill files go. ``None``: a fresh
    ``tempfile.mkdtemp(prefix="corral-spill-")``; otherwise a unique subdirectory made
    inside ``directory`` (several workers may share it). Either is created on the first
    spill (or :meth:`sandbox`), locked while the store keeps it, and removed by
    :meth:`close` (or when the store is garbage-collected); making it removes the
    orphaned sandboxes beside it (:func:`sweep_orphans`).
    ``disk_limit``: most bytes of spill files at any time; 0 means no limit.
    ``sizeof``: the size recorded for a value stored without ``nbytes``.

    Not thread-safe: use a store from one thread (the worker's event loop) only.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        disk_limit: int = 0,
        sizeof: Callable[[Any], int] = _dask_sizeof,
    ) -> None:
        if disk_limit < 0:
            raise ValueError(f"disk_limit must be >= 0, not {disk_limit}")
        self.parent: str | None = None if directory is None else os.fspath(directory)
        self.disk_limit = disk_limit
        self.sizeof = sizeof
        self._memory: OrderedDict[Key, Any] = OrderedDict()  #: least recently used first
        self._disk: dict[Key, _OnDisk] = {}
        self._files: dict[Key, File] = {}  #: file outputs kept here as files
        self._sizes: dict[Key, int] = {}  #: recorded size of every key, memory or disk
        #: in-memory keys that failed to pickle -> what pickling raised (as text)
        self._unpicklable: dict[Key, str] = {}
        self._dir: str | None = None
        self._finalizer: weakref.finalize[[str, int], SpillStore] | None = None
        self._seq = 0
        self._generation = 0  #: one more at each close: a spill under way ends as of nothing
        self._memory_bytes = 0
        self._disk_bytes = 0
        self._file_bytes = 0  #: the part of _disk_bytes that is file outputs
        self.spilled_total = 0  #: recorded bytes ever written to disk
        self.unspilled_total = 0  #: recorded bytes ever read back into memory
        self.spill_count = 0  #: values ever written to disk
        self.disk_full = False  #: the last write was refused for room, none freed since
        #: spills (:meth:`spill_keys`, :meth:`spill_keys_off_loop`) stopped because a
        #: write was refused for room, and why the latest was (``disk_limit``, an
        #: ``OSError``): the worker reports them (``WorkerMemoryReport.spill_refused``)
        self.spill_refused = 0
        self.spill_refused_why = ""

    # -- the mapping ---------------------------------------------------------------

    def put(self, key: Key, value: Any, nbytes: int | None = None) -> None:
        """Store ``value`` in memory as the most recently used; replace any old copy.

        ``nbytes`` is the size to record, trusted as given; if None it is
        ``sizeof(value)``, or 0 when ``sizeof`` raises.
        """
        if nbytes is None:
            try:
                nbytes = max(0, int(self.sizeof(value)))
            except Exception:
                nbytes = 0
        elif nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, not {nbytes}")
        if key in self._sizes:
            self._discard(key)
        self._memory[key] = value
        self._sizes[key] = nbytes
        self._memory_bytes += nbytes

    def put_file(self, key: Key, file: File) -> None:
        """Keep the file output ``file`` (a measured :class:`~runtime.files.File`
        whose file is in this store's directory already) as ``key``; replace any old
        copy. Its size counts on disk from now on, within ``disk_limit`` or not: the
        caller checked the room before the file was made or copied here."""
        if file.size is None:
            raise ValueError(f"file output {key!r} has not been measured: {file!r}")
        if key in self._sizes:
            self._discard(key)
        self._files[key] = file
        self._sizes[key] = file.size
        self._disk_bytes += file.size
        self._file_bytes += file.size

    def is_file(self, key: Key) -> bool:
        """Whether ``key`` is a file output (a file entry)."""
        return key in self._files

    def __setitem__(self, key: Key, value: Any) -> None:
        self.put(key, value)

    def __getitem__(self, key: Key) -> Any:
        memory = self._memory
        if key in memory:
            memory.move_to_end(key)
            return memory[key]
        if key in self._files:
            return self._files[key]
        where = self._disk[key]  # KeyError if missing altogether
        value = _load_from(where.path)  # raises (and keeps the file) if unreadable
        self._remove_file(key)
        size = self._sizes[key]
        memory[key] = value
        self._memory_bytes += size
        self.unspilled_total += size
        return value

    def peek(self, key: Key) -> Any:
        """The value of ``key`` without changing recency or placement: a spilled value
        is loaded from its file for the caller and stays on disk (for a peer's fetch)."""
        if key in self._memory:
            return self._memory[key]
        if key in self._files:
            return self._files[key]
        return _load_from(self._disk[key].path)

    def open_spilled(self, key: Key) -> io.BufferedReader:
        """The spill file of ``key`` (spilled), open, to read with :func:`load_opened`
        on another thread: it stays readable if the key is deleted meanwhile (its file
        unlinked). Neither recency nor placement changes, as :meth:`peek`."""
        return open(self._disk[key].path, "rb")

    def __delitem__(self, key: Key) -> None:
        if key not in self._sizes:
            raise KeyError(key)
        self._discard(key)

    def discard(self, key: Key) -> bool:
        """Forget ``key`` wherever it is, its file deleted unread; False if it is not
        here. Not ``pop``: :class:`MutableMapping`'s reads a spilled value back into
        memory (all of its bytes, on the caller's thread) only to drop it."""
        if key not in self._sizes:
            return False
        self._discard(key)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def disk_files(self) -> int:
        """How many files it keeps on disk: spilled outputs and file outputs."""
        return len(self._disk) + len(self._files)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._sizes)

    def __repr__(self) -> str:
        return (
            f"<SpillStore {len(self._memory)} in memory ({self._memory_bytes} B), "
            f"{len(self._disk)} spilled, {len(self._files)} files ({self._disk_bytes} B on disk)>"
        )

    def on_disk(self, key: Key) -> bool:
        """Whether ``key`` is spilled (reading it loads it back into memory)."""
        return key in self._disk

    def nbytes(self, key: Key) -> int:
        """The recorded size of ``key`` (in memory or on disk); KeyError if absent."""
        return self._sizes[key]

    def get_raw(self, key: Key) -> bytes:
        """A protocol-5 pickle of ``key``'s value, buffers in band, to send to a peer.

        Neither recency nor placement changes. A value in memory is pickled (pickle,
        then cloudpickle; :class:`Unpicklable` if both fail, and the store remembers it:
        :meth:`unpicklable_error`). For a spilled value without out-of-band
        buffers the pickle stream in its file is that pickle already and is returned as
        read, without unpickling. A spilled value with buffers (numpy, ...) is loaded
        from its file into a temporary object and pickled again in band; it stays on
        disk and the store's counters do not change.
        """
        if key in self._memory:
            return self._pickled(key, _dumps_inband)
        if key in self._files:  # the handle, not the file's bytes
            return _dumps_inband(self._files[key])
        where = self._disk[key]  # KeyError if missing altogether
        with open(where.path, "rb") as file:
            n_buffers, pickle_len = _read_header(file)
            if not n_buffers:
                data = file.read(pickle_len)
                if len(data) != pickle_len:
                    raise EOFError(f"spill file {where.path!r} is truncated")
                return data
        return _dumps_inband(_load_from(where.path))

    def segments(self, key: Key) -> Segments:
        """``key``'s value serialized for a stream to a peer (``actors/transfer.py``):
        the pickle stream and its out-of-band buffers. A value in memory is pickled with
        its buffers as views of its own memory (no copy for numpy and the like); a
        spilled value's segments are read from its file as they are asked for, never
        loaded. Neither recency nor placement changes. A value in memory that does not
        pickle: :class:`Unpicklable`, as :meth:`get_raw`."""
        if key in self._memory:
            return self._pickled(key, serialize)
        if key in self._files:  # a file output: its bytes, one segment
            f = self._files[key]
            return FileSegments(f.path, [(0, self._sizes[key])])
        where = self._disk[key]  # KeyError if missing altogether
        with open(where.path, "rb") as file:
            n_buffers, pickle_len = _read_header(file)
            file.seek(_HEADER.size + pickle_len)
            table = file.read(_LENGTH.size * n_buffers)
            if len(table) != _LENGTH.size * n_buffers:
                raise EOFError(f"spill file {where.path!r} is truncated")
        spans = [(_HEADER.size, pickle_len)]
        offset = _HEADER.size + pickle_len + len(table)
        for (length,) in _LENGTH.iter_unpack(table):
            spans.append((offset, length))
            offset += length
        return FileSegments(where.path, spans)

    def _pickled(self, key: Key, dumps: Callable[[Any], _T]) -> _T:
        """``dumps`` of ``key``'s value in memory; :class:`Unpicklable` if it raises
        (remembered: spilling skips the key, and :meth:`unpicklable_error` says why)."""
        known = self._unpicklable.get(key)
        if known is not None:
            raise Unpicklable(known)
        try:
            return dumps(self._memory[key])
        except MemoryError:  # not the value's fault: no memory for its pickle now
            raise
        except Exception as exc:
            error = Unpicklable.of(exc)
            self._unpicklable[key] = error.reason
            raise error from None

    def unpicklable_error(self, key: Key) -> str | None:
        """What pickling ``key``'s value raised, if the store has tried and failed
        (to spill it or to serialize it for another process); else None."""
        return self._unpicklable.get(key)

    def keys_in_memory(self) -> Iterator[Key]:
        """Keys held in memory, least recently used first."""
        return iter(self._memory)

    def keys_on_disk(self) -> Iterator[Key]:
        """Keys spilled to disk, in the order they were spilled."""
        return iter(self._disk)

    # -- counters ------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        """Sum of the recorded sizes of the values held in memory."""
        return self._memory_bytes

    @property
    def disk_bytes(self) -> int:
        """Bytes on disk now: the spill files and the file outputs."""
        return self._disk_bytes

    @property
    def n_files(self) -> int:
        """Number of file outputs held now."""
        return len(self._files)

    @property
    def file_bytes(self) -> int:
        """Bytes of the file outputs held now (part of ``disk_bytes``): kept as they
        come and go, since every report of the worker reads it (summed over the files
        at each read, a worker holding 100,000 file outputs spent some 10 ms of its
        event loop on each report: one per task that made a file)."""
        return self._file_bytes

    @property
    def n_spilled(self) -> int:
        """Number of keys on disk now."""
        return len(self._disk)

    @property
    def unpicklable(self) -> int:
        """Number of keys in memory that could not be pickled (spill skips them)."""
        return len(self._unpicklable)

    @property
    def directory(self) -> str | None:
        """The spill directory, once the first spill has made it."""
        return self._dir

    # -- spilling ------------------------------------------------------------------

    def spill(self, nbytes: int) -> int:
        """Move least recently used values to disk until ``nbytes`` have moved.

        Returns the recorded bytes moved, which is less than ``nbytes`` if nothing more
        can move: every value left in memory is unpicklable, or a write was refused for
        room (``disk_limit`` or an ``OSError``; :attr:`disk_full` is then True).
        """
        return sum(self.nbytes(key) for key in self.spill_keys(nbytes))

    def write(self, key: Key, value: Any, nbytes: int | None = None) -> bool:
        """Store ``value`` straight on disk, as a task output written there. Returns
        False, storing nothing and leaving no partial file, if it does not fit under
        ``disk_limit`` or the disk refuses it; True once it is stored (on disk, or in
        memory if it cannot be pickled)."""
        self.put(key, value, nbytes)
        if self._spill_one(key) is None:
            self._discard(key)
            return False
        return True

    def spill_keys(
        self, nbytes: int, keep: Container[Key] = (), last: Collection[Key] = ()
    ) -> list[Key]:
        """As :meth:`spill`, returning the keys moved (least recently used first). The
        values of ``keep`` stay in memory; those of ``last`` move only once every
        other value that can has moved."""
        moved: list[Key] = []
        total = 0
        for key in self._order(nbytes, keep, last):
            if key in self._unpicklable:
                continue
            outcome = self._spill_one(key)
            if outcome is None:
                self.spill_refused += 1
                break
            if key not in self._memory:  # on disk now (an unpicklable one stays)
                moved.append(key)
            total += outcome
            if total >= nbytes:
                break
        return moved

    def _order(self, nbytes: int, keep: Container[Key], last: Collection[Key]) -> list[Key]:
        """The keys a spill of ``nbytes`` tries, in order (none for ``nbytes`` <= 0)."""
        if nbytes <= 0:
            return []
        memory = self._memory
        order = [k for k in memory if k not in keep and k not in last]
        if last:
            order += [k for k in memory if k in last and k not in keep]
        return order

    def _spill_one(self, key: Key) -> int | None:
        """Write one value to disk. Returns its recorded size, 0 if it stays in memory
        because it is unpicklable, or None if there is no room (stop spilling)."""
        job = self._begin(key)
        return self._finish(job, _write_job(job))

    async def spill_keys_off_loop(
        self,
        nbytes: int,
        keep: Container[Key] = (),
        last: Collection[Key] = (),
        limiter: anyio.CapacityLimiter | None = None,
    ) -> list[Key]:
        """As :meth:`spill_keys`, with each value's pickling and file write in a worker
        thread (``limiter``: at most that many at once), so the event loop goes on
        meanwhile (heartbeats, fetches). Each value stays in memory, readable and
        served as it is, until its file is complete and in place; a value deleted or
        replaced while its file is written is left as it is now, its write stopped at
        the next ``WRITE_CHUNK`` (:class:`_Dropped`) and that file removed. The caller
        runs one of these at a time."""
        moved: list[Key] = []
        total = 0
        for key in self._order(nbytes, keep, last):
            if key not in self._memory or key in self._unpicklable:  # gone meanwhile
                continue
            job = self._begin(key)
            outcome = self._finish(
                job, await anyio.to_thread.run_sync(_write_job, job, limiter=limiter)
            )
            if outcome is None:
                self.spill_refused += 1
                break
            if job.done:
                moved.append(key)
            total += outcome
            if total >= nbytes:
                break
        return moved

    def _begin(self, key: Key) -> _Job:
        """The spill file of ``key``'s value (in memory), to write with :func:`_write_job`
        (on any thread: it touches nothing of the store's) and then :meth:`_finish`."""
        budget = None if not self.disk_limit else self.disk_limit - self._disk_bytes
        try:
            directory: str | OSError = self._ensure_directory()
        except OSError as exc:
            directory = exc
        self._seq += 1
        value, generation, memory = self._memory[key], self._generation, self._memory

        def gone() -> bool:
            return memory.get(key) is not value or self._generation != generation

        return _Job(key, value, directory, self._seq, budget, generation, gone)

    def _finish(self, job: _Job, outcome: int | BaseException) -> int | None:
        """Account for the file :func:`_write_job` wrote (``outcome``: its bytes) or
        did not (what it raised): the value leaves memory only once its file is in
        place, and only if it is still the value of its key in this store."""
        key = job.key
        if job.generation != self._generation:  # closed meanwhile: its files went
            if isinstance(outcome, int):
                with contextlib.suppress(OSError):
                    os.unlink(job.final)
            return 0
        if isinstance(outcome, BaseException):
            if isinstance(outcome, _Dropped):
                return 0  # its partial file went: the value leaves memory with the job
            if isinstance(outcome, Unpicklable):
                if self._memory.get(key) is job.value:
                    self._unpicklable[key] = outcome.reason
                _log.warning(
                    "value cannot be pickled; it stays in memory",
                    key=key,
                    type=type(job.value).__name__,
                    error=outcome.reason,
                )
                return 0
            if isinstance(outcome, _NoRoom):
                self._refused(key, f"disk_limit {self.disk_limit} B reached")
                return None
            if isinstance(outcome, (_WriteFailed, OSError)):
                error = outcome.error if isinstance(outcome, _WriteFailed) else outcome
                self._refused(key, repr(error))
                return None
            raise outcome
        file_bytes = outcome
        if self._memory.get(key) is not job.value:
            # Deleted or replaced while the file was written: the
            # value of the key now is what counts; the file is of nothing.
            with contextlib.suppress(OSError):
                os.unlink(job.final)
            return 0
        if self.disk_limit and self._disk_bytes + file_bytes > self.disk_limit:
            with contextlib.suppress(OSError):  # others took the room meanwhile
                os.unlink(job.final)
            self._refused(key, f"disk_limit {self.disk_limit} B reached")
            return None
        # The file is complete and in place: only now drop the in-memory reference.
        del self._memory[key]
        size = self._sizes[key]
        self._memory_bytes -= size
        self._disk[key] = _OnDisk(job.final, file_bytes)
        self._disk_bytes += file_bytes
        self.spilled_total += size
        self.spill_count += 1
        self.disk_full = False
        job.done = True
        return size

    def _refused(self, key: Key, reason: str) -> None:
        if not self.disk_full:
            _log.warning("spilling stopped: no room on disk", key=key, reason=reason)
        self.disk_full = True
        self.spill_refused_why = reason

    def sandbox(self) -> str:
        """The store's directory, made now if it is not yet: where tasks write their
        file outputs (``runtime/files.py``) and where the store keeps them."""
        return self._ensure_directory()

    def _ensure_directory(self) -> str:
        if self._dir is None:
            if self.parent is not None:
                os.makedirs(self.parent, exist_ok=True)
            path, fd = _make_sandbox(self.parent)
            self._dir = path
            self._finalizer = weakref.finalize(self, _remove_sandbox, path, fd)
            sweep_orphans(os.path.dirname(path), keep=path)
        return self._dir

    # -- removal -------------------------------------------------------------------

    def _discard(self, key: Key) -> None:
        """Forget ``key`` (present) wherever it is; delete its file if spilled."""
        size = self._sizes.pop(key)
        if key in self._memory:
            del self._memory[key]
            self._memory_bytes -= size
            self._unpicklable.pop(key, None)
        elif key in self._files:
            file = self._files.pop(key)
            self._disk_bytes -= size
            self._file_bytes -= size
            self.disk_full = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file.path)
        else:
            self._remove_file(key)

    def _remove_file(self, key: Key) -> None:
        where = self._disk.pop(key)
        self._disk_bytes -= where.file_bytes
        self.disk_full = False
        _unlink_off_loop(where.path)

    def close(self) -> None:
        """Forget every value and delete every spill file and the spill directory.

        Idempotent. The counters of totals are kept; the store may be used again (a
        new directory is made on the next spill).
        """
        self._generation += 1
        self._memory.clear()
        self._disk.clear()
        self._files.clear()
        self._sizes.clear()
        self._unpicklable.clear()
        self._memory_bytes = 0
        self._disk_bytes = 0
        self._file_bytes = 0
        self.disk_full = False
        if self._finalizer is not None:
            self._finalizer()  # rmtree, then unlock; once
            self._finalizer = None
        self._dir = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
