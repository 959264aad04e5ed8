"""Unpickling that is safe when several threads of a process unpickle at once.

What lives here: :func:`loads` and :func:`load`, the one way Corral's processes
unpickle (a worker's event loop reading peers' messages and fetched data, its executor
threads loading a task's function and inputs, the threads that read task processes'
results, the store reading a spilled value, a task restoring its checkpoint, the
client reading results), :func:`guarded`, which they share,
:func:`missing_global`, which names what a failed unpickle could not import,
:func:`needs_module`, which finds, without loading it, what a pickle loads from a module, and
:func:`buffer`, the writable buffer an out-of-band part is read into before it is
unpickled.

Why: unpickling imports the modules of the classes and functions it meets. Python
locks each module while it runs, but when two threads import, for the first time, two
modules of one package that import each other (numpy 2 does, and so may any library),
each thread holds one module and waits for the other; Python breaks that deadlock by
handing one of them the other's module half run, and the import fails with
``ImportError: cannot import name ... from partially initialized module ... (most
likely due to a circular import)``, in both threads.

How: an unpickle first runs without any lock. If it is about to import a module that
is not loaded yet (a finder first on ``sys.meta_path`` sees it, before the module's
code runs, and stops that unpickle), it runs again under one process-wide lock, so
that only one unpickle at a time imports. An unpickle that needs no new module, the
steady state once a process has loaded its libraries, never takes the lock, so the
event loop does not wait for a task whose loading imports a slow library. The lock
is held while loading only, never while a task runs; an import a task makes itself
while it runs is the task's own, as in any threaded Python program.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import pickletools
import sys
import threading
from collections.abc import Callable, Iterable
from importlib.machinery import ModuleSpec
from typing import IO, Any, TypeVar

__all__ = ["buffer", "guarded", "load", "loads", "missing_global", "needs_module"]

T = TypeVar("T")

#: held by the one unpickle at a time that imports (reentrant: an unpickle may nest)
_LOCK = threading.RLock()


class _State(threading.local):
    """Per thread: in an unlocked unpickle (``watching``), whether it met a new import
    (``imported``), how deep in locked unpickles (``locked``)."""

    watching = False
    imported = False
    locked = 0


_STATE = _State()


class _NewImport(BaseException):
    """Stops an unlocked unpickle at its first import of a module not loaded yet (a
    BaseException, so that a library's ``except Exception`` lets it through)."""


class _ImportWatch:
    """The finder first on ``sys.meta_path``: Python asks it about every module not yet
    in ``sys.modules``; in a thread running an unlocked unpickle it stops that import
    before the module's code runs. It finds nothing itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if _STATE.watching:
            _STATE.imported = True
            raise _NewImport(name)
        return None


_WATCH = _ImportWatch()


def _watch_first() -> None:
    """Put the watch first on ``sys.meta_path`` (again, if a finder went before it).
    A new list replaces it, never changed in place: an import running meanwhile in
    another thread goes on over the list it started with, skipping no finder. Without
    the lock, which this must never wait for."""
    meta_path = sys.meta_path
    if not meta_path or meta_path[0] is not _WATCH:
        sys.meta_path = [_WATCH, *(f for f in meta_path if f is not _WATCH)]


def guarded(load: Callable[[], T]) -> T:
    """``load()`` (an unpickle, which may run twice: it must start over each time),
    under the process-wide lock if it imports a module not loaded yet."""
    state = _STATE
    if state.watching or state.locked:
        return load()  # nested in an unpickle: that one decides
    _watch_first()
    state.watching, state.imported = True, False
    try:
        value = load()
    except BaseException:
        if not state.imported:
            raise
    else:
        if not state.imported:
            return value
        # The import was stopped yet load() returned: some code swallowed the stop
        # and may have taken another path; the value is dropped and loaded again.
    finally:
        state.watching = False
    with _LOCK:
        state.locked += 1
        try:
            return load()
        finally:
            state.locked -= 1


def loads(data: bytes | bytearray | memoryview, buffers: Iterable[Any] = ()) -> Any:
    """``pickle.loads(data, buffers=buffers)``, safe against other threads' imports."""
    kept = buffers if isinstance(buffers, list | tuple) else list(buffers)
    return guarded(lambda: pickle.loads(data, buffers=kept))


def load(file: IO[bytes], buffers: Iterable[Any] = ()) -> Any:
    """The object pickled in ``file`` from its current position (``pickle.load``), safe
    against other threads' imports. ``file`` must be seekable."""
    start = file.tell()
    kept = list(buffers)

    def again() -> Any:
        file.seek(start)
        return pickle.Unpickler(file, buffers=kept).load()

    return guarded(again)


class _Recording(pickle.Unpickler):
    """An unpickler that keeps the global whose lookup raised (``failed``)."""

    failed: tuple[str, str] | None = None

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except Exception:
            if self.failed is None:
                self.failed = (module, name)
            raise


def missing_global(
    error: BaseException, data: bytes | bytearray | memoryview
) -> tuple[str, str] | None:
    """After ``loads(data)`` raised ``error``: if a module could not be imported (a
    ``ModuleNotFoundError``), ``(what, module)``: the global whose lookup needed it
    (``"labops.double"``; ``""`` when it was not a lookup: cloudpickle importing a
    module by name) and the module not found (``"labops"``); else None. It loads
    ``data`` again, recording (under the lock, as an unpickle that imports): only after
    a failure, so a load that succeeds pays nothing for it."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    recording = _Recording(io.BytesIO(data))
    with _LOCK, contextlib.suppress(Exception):
        recording.load()
    failed = recording.failed
    return ("" if failed is None else f"{failed[0]}.{failed[1]}"), error.name


#: the global cloudpickle loads a module by (its argument, the module's name) with
_SUBIMPORT = ("cloudpickle.cloudpickle", "subimport")
#: the opcodes that push nothing: the strings of a global may come on either side of one
_NO_PUSH = frozenset({"FRAME", "PROTO", "STOP", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"})


def needs_module(data: bytes, module: str) -> str | None:
    """What loading the pickle ``data`` loads from ``module`` or a module inside it:
    the first such global (``"labops.double"``), or ``""`` when cloudpickle imports the
    module itself by name (a function pickled by value that calls ``labops.double``);
    None if it loads nothing of it. A process where ``module`` is not importable cannot
    load ``data`` then. Read, not loaded: nothing is imported or made."""

    def inside(name: object) -> bool:
        return isinstance(name, str) and (name == module or name.startswith(module + "."))

    memo: dict[int, object] = {}
    before: object = None  # the values the last two opcodes pushed (None: not a str)
    last: object = None
    importer = False  # the last push was cloudpickle's subimport: the name comes next
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in _NO_PUSH:
            if name == "MEMOIZE":
                memo[len(memo)] = last
            elif name.endswith("PUT"):
                memo[int(arg)] = last  # type: ignore[arg-type]
            continue
        value: object = None
        pair: tuple[object, object] | None = None
        if name in ("GLOBAL", "INST"):
            module_of, _, attr = str(arg).partition(" ")
            pair = (module_of, attr)
        elif name == "STACK_GLOBAL":
            pair = (before, last)
        elif name.endswith("GET"):
            value = memo.get(int(arg))  # type: ignore[arg-type]
        elif isinstance(arg, str):
            value = arg
        if pair is not None and inside(pair[0]):
            return f"{pair[0]}.{pair[1]}"
        if importer and inside(value):
            return ""
        if pair == _SUBIMPORT:
            # Memoized as itself: cloudpickle fetches it again (a ``BINGET``) for each
            # further module a function pickled by value uses, which imports too.
            value = _SUBIMPORT
        importer = value == _SUBIMPORT
        before, last = last, value
    return None


#: parts at least this large are read into :func:`buffer`'s untouched memory; smaller
#: ones into a ``bytearray`` (zeroing them costs nothing worth saving)
UNTOUCHED_OVER = 2**20


def buffer(n: int) -> bytearray | memoryview:
    """A writable buffer of ``n`` bytes to read a part of a pickle (an out-of-band
    buffer: a numpy array's data) into before unpickling it, which uses it in place.

    ``bytearray(n)`` zeroes its memory, page by page, holding Python's GIL: 200 MiB took
    0.4 s on a loaded machine and several seconds on a busier one, during which no
    other thread of the process ran, the worker's event loop included (no heartbeat, no
    memory report). From 1 MiB on the buffer is an uninitialised numpy array's memory
    instead: allocated without touching a page, its pages fill as the read (which
    releases the GIL) copies bytes in."""
    if n < UNTOUCHED_OVER:
        return bytearray(n)
    import numpy  # a dependency; loaded by then wherever a part this large comes

    return numpy.empty(n, dtype=numpy.uint8).data
