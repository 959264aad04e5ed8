"""File outputs: a task output that is a file on its worker's disk, not a Python object.

A task asks for a path in its worker's *sandbox* with :func:`output_path`, writes its
file there and returns :class:`File` of that path. When the task returns, the worker
(in the task's own thread or task process, never on its event loop) measures the file's
size and sha256 and moves it among the outputs it keeps on disk; the task's output is
then the :class:`File` handle, with its name, size, checksum and the path where the
worker keeps it. A task that reads such an output gets a handle whose ``path`` is on
its own worker (copied there, if it was made elsewhere).

The executor runs every task inside :func:`task_outputs` (its sandbox and this try's
directory, removed when the try ends) and calls :meth:`TaskOutputs.finish` on what the
task returned; this module knows nothing of workers or messages. docs/files.md,
"File outputs".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import itertools
import os
import shutil
import tempfile
import time
import uuid
from typing import IO, Any

from runtime.errors import FileOutputError

__all__ = [
    "File",
    "TaskOutputs",
    "digest",
    "discard_output",
    "output_path",
    "remove_tries",
    "task_outputs",
]

#: bytes read at a time when a file's checksum is computed
_READ = 2**20


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class File:
    """A file output: ``File(path)`` returned by a task makes the file at ``path`` (in
    its worker's sandbox: see :func:`output_path`) the task's output.

    The worker fills in the rest: ``size`` (bytes) and ``checksum`` (sha256, hex) once
    the task returned, and ``path`` is where the file is kept on the worker that holds
    it (a task reading it gets the path on its own worker). ``name`` is the file's name
    (the last part of the path the task wrote, unless given). A ``File`` is a path-like
    object: ``open(f)``, ``f.open()``, ``os.fspath(f)`` and libraries that take paths
    accept it."""

    path: str
    name: str = ""
    size: int | None = None  #: bytes, once the worker measured it
    checksum: str | None = None  #: sha256 of its bytes (hex), once measured

    def __post_init__(self) -> None:
        path = os.fspath(self.path)
        if not isinstance(path, str) or not path:
            raise FileOutputError(f"File({self.path!r}): the path must be a non-empty str.")
        object.__setattr__(self, "path", path)
        if not self.name:
            object.__setattr__(self, "name", os.path.basename(path))
        if not _plain(self.name):
            raise FileOutputError(
                f"File({path!r}, name={self.name!r}): the name must be a plain file name "
                "(no directory part, not empty), such as 'events.root'."
            )

    def __fspath__(self) -> str:
        return self.path

    def open(self, mode: str = "rb", **kwargs: Any) -> IO[Any]:
        """``open(self.path, mode, **kwargs)``: read it (a task must not change it)."""
        return open(self.path, mode, **kwargs)


def _plain(name: Any) -> bool:
    """Whether ``name`` is a plain file name: no directory part, not empty."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and os.sep not in name
        and "\0" not in name
    )


def digest(path: str) -> tuple[int, str]:
    """``(size, sha256 hex)`` of the file at ``path``, read a MiB at a time."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(_READ)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


@dataclasses.dataclass(slots=True)
class TaskOutputs:
    """The file outputs of one running try: the worker's ``sandbox`` (where it keeps
    its outputs on disk) and this try's own directory in it, made by the first
    :func:`output_path` call."""

    sandbox: str | None
    key: Any
    directory: str | None = None
    #: when the try began (ns since the epoch): a file modified since is the try's own
    started: int = dataclasses.field(default_factory=time.time_ns)
    _token: contextvars.Token[TaskOutputs | None] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    # The context manager of :func:`task_outputs`: methods, not a generator (entered for
    # every task a worker runs, it costs about half as much).

    def __enter__(self) -> TaskOutputs:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _CURRENT.reset(self._token)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def path(self, name: str) -> str:
        if not _plain(name):
            raise FileOutputError(
                f"output_path({name!r}): give a plain file name (no directory part, not "
                "empty), such as 'events.root'."
            )
        if self.sandbox is None:
            raise FileOutputError(
                f"task {self.key!r} runs where file outputs have no sandbox (an executor "
                "made without one): run it on a Corral worker."
            )
        if self.directory is None:
            parent = os.path.join(self.sandbox, "out")
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parent)  # in the sandbox, never making it again
                # named by the process, so that what a killed one left can be found
                self.directory = tempfile.mkdtemp(prefix=f"try-{os.getpid()}-", dir=parent)
            except FileNotFoundError:
                raise self._no_sandbox() from None
        elif not os.path.isdir(self.directory):  # its sandbox went meanwhile
            raise self._no_sandbox()
        return os.path.join(self.directory, name)

    def _no_sandbox(self) -> FileOutputError:
        return FileOutputError(
            f"task {self.key!r} has no sandbox any more ({self.sandbox}): its worker "
            "stopped while it ran. Its next try runs on another worker."
        )

    def finish(self, value: Any) -> Any:
        """What the task returned, with a :class:`File` made the worker's: checked to
        be a regular file in the sandbox, moved among the outputs if this try wrote it
        (in its directory, or elsewhere in the sandbox and modified since the try
        began), else copied (an input's file returned unchanged: a copy of its own, so
        that what is written at that path later does not change this output), measured.
        Raises :class:`FileOutputError` for a path outside the sandbox, and for a File
        of this try's directory inside a list, tuple or dict (its file would be removed
        with the directory, leaving the value pointing at nothing)."""
        if not isinstance(value, File):
            if self.directory is not None and type(value) in (list, tuple, dict):
                self._no_files_inside(value)
            return value
        sandbox = None if self.sandbox is None else os.path.realpath(self.sandbox)
        real = os.path.realpath(value.path)
        if sandbox is None or not real.startswith(sandbox + os.sep):
            raise FileOutputError(
                f"task {self.key!r} returned File({value.path!r}), which is outside its "
                f"worker's sandbox ({self.sandbox}): write the file at output_path(name) "
                "and return File of that path. To hand over a file on shared storage, "
                "return its path as a str instead."
            )
        if not os.path.isdir(sandbox):  # its worker stopped meanwhile
            raise self._no_sandbox()
        if not os.path.isfile(real):
            raise FileOutputError(
                f"task {self.key!r} returned File({value.path!r}), which is not a regular "
                "file (missing, or a directory): write the file before returning it."
            )
        dest = os.path.join(sandbox, f"{uuid.uuid4().hex[:12]}-{value.name}")
        mine = self.directory is not None and real.startswith(
            os.path.realpath(self.directory) + os.sep
        )
        if mine or os.stat(real).st_mtime_ns >= self.started:
            os.replace(real, dest)
        else:
            shutil.copyfile(real, dest)
        try:
            size, checksum = digest(dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(dest)
            raise
        return File(dest, value.name, size, checksum)

    def _no_files_inside(self, value: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> None:
        """FileOutputError if one of the first :data:`SCANNED` items of ``value`` (a
        dict's values) is a File of this try's directory."""
        assert self.directory is not None
        mine = os.path.realpath(self.directory) + os.sep
        items = value.values() if isinstance(value, dict) else value
        for item in itertools.islice(items, SCANNED):
            if isinstance(item, File) and os.path.realpath(item.path).startswith(mine):
                kind = type(value).__name__
                raise FileOutputError(
                    f"task {self.key!r} returned a {kind} holding File({item.path!r}): only "
                    "a File returned as the task's value is kept (one file per task); the "
                    "files of a File inside a list or a dict are removed when the try "
                    "ends. Return each file from a task of its own (one task per file, "
                    "e.g. cluster.map over the names), or write to shared storage and "
                    "return the paths as str."
                )


_CURRENT: contextvars.ContextVar[TaskOutputs | None] = contextvars.ContextVar(
    "corral_outputs", default=None
)


def task_outputs(sandbox: str | None, key: Any) -> TaskOutputs:
    """Run the code inside as task ``key``'s try, its file outputs in ``sandbox``; the
    try's directory (what the task wrote and did not return) is removed at the end."""
    return TaskOutputs(sandbox, key)


def remove_tries(sandbox: str, pid: int) -> None:
    """Remove the try directories that process ``pid`` left in ``sandbox`` (a task
    process killed mid-task never reaches the end of :func:`task_outputs`)."""
    parent = os.path.join(sandbox, "out")
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if name.startswith(f"try-{pid}-"):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


#: items of a returned list, tuple or dict that :meth:`TaskOutputs.finish` looks at for
#: a File (a bound: a value of millions of items costs no more than this)
SCANNED = 10_000


def output_path(name: str) -> str:
    """A path in the worker's sandbox for this try's file ``name``, to write and return
    as ``File(path)``. Only inside a running task; the same name in one try gives the
    same path. What the try writes there and does not return is removed when it ends."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise FileOutputError(
            "output_path() was called outside a running task: call it from inside a task "
            "function that a Corral worker runs."
        )
    return ctx.path(name)


def discard_output(value: Any) -> None:
    """Remove the file of a finished try's :class:`File` that nobody will keep (its try
    was cancelled); anything else is left alone."""
    if isinstance(value, File):
        with contextlib.suppress(OSError):
            os.unlink(value.path)
