"""Checkpoints: what a running task can call to save its progress and get it back.

A checkpoint is a file on the disk of the worker running the task, in that worker's
checkpoint directory, written by the task itself (in its thread, or in its task
process): first to a temporary name, then renamed into place, so a kill mid-write
leaves the previous checkpoint whole.

- ``checkpoint(obj)`` pickles ``obj`` into the task's next checkpoint file;
- ``checkpoint_file(path)`` copies a file the task wrote itself (its own state file)
  into the next checkpoint file;
- ``restore()`` unpickles the latest checkpoint (this try's, or an earlier try's on a
  worker that was lost), or returns None; ``restore_path()`` gives the local path of
  that file (for a task that saved it with ``checkpoint_file``), or None.

Before writing, the task asks its worker for room (``reserve``): a checkpoint that does
not fit the worker's disk left raises :class:`~runtime.errors.CheckpointError` with the
sizes, and the task can go on. Once the file is in place the worker is told
(``saved``); where the checkpoint goes from there (to the scheduler, to a peer's disk)
is the worker's business.

The executor sets the running task's context around the call (:func:`running`); this
module knows nothing of workers or messages. docs/files.md, "Checkpoints".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import os
import pickle
import shutil
from collections.abc import Callable
from typing import IO, Any

from runtime import unpickling
from runtime.errors import CheckpointError

__all__ = [
    "TaskContext",
    "checkpoint",
    "checkpoint_file",
    "checkpoint_name",
    "restore",
    "restore_path",
    "running",
]


def checkpoint_name(key: Any, seq: int) -> str:
    """The file name of checkpoint ``seq`` of task ``key`` (the same in every process)."""
    digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()[:20]
    return f"{digest}-{seq}.ckpt"


@dataclasses.dataclass(slots=True)
class TaskContext:
    """The checkpoint state of one running try.

    ``seq``/``path``: the latest checkpoint's number and its file on this worker (0 and
    None: none yet). ``dir``: where new checkpoint files go. ``reserve(key, seq,
    nbytes)`` asks for room for one (None: granted, else why not); ``saved(key, seq,
    path, nbytes)`` says it is in place (``path`` "": the write failed, the room is
    given back). ``dir`` None: this try cannot checkpoint (``why`` says why)."""

    key: Any
    seq: int = 0
    path: str | None = None
    dir: str | None = None
    reserve: Callable[[Any, int, int], str | None] | None = None
    saved: Callable[[Any, int, str, int], None] | None = None
    why: str = ""


_CURRENT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "corral_task", default=None
)


class _Running:
    """:func:`running`'s context manager: a class, not a generator (entered for every
    task a worker runs, it costs a third as much)."""

    __slots__ = ("ctx", "token")

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        self.token: contextvars.Token[TaskContext | None] | None = None

    def __enter__(self) -> TaskContext:
        self.token = _CURRENT.set(self.ctx)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        assert self.token is not None
        _CURRENT.reset(self.token)


def running(ctx: TaskContext) -> _Running:
    """Make ``ctx`` the running task's context for the code inside the block."""
    return _Running(ctx)


def in_task() -> bool:
    """Whether this code runs inside a task a Corral worker runs."""
    return _CURRENT.get() is not None


def _current(what: str) -> TaskContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise CheckpointError(
            f"{what} was called outside a running task: call it from inside a task "
            "function that a Corral worker runs."
        )
    return ctx


def _save(ctx: TaskContext, nbytes: int, write: Callable[[IO[bytes]], object]) -> int:
    """Reserve room, write the next checkpoint file atomically, tell the worker."""
    if ctx.dir is None or ctx.reserve is None or ctx.saved is None:
        raise CheckpointError(ctx.why or f"task {ctx.key!r} cannot save checkpoints here.")
    seq = ctx.seq + 1
    refusal = ctx.reserve(ctx.key, seq, nbytes)
    if refusal is not None:
        raise CheckpointError(refusal)
    final = os.path.join(ctx.dir, checkpoint_name(ctx.key, seq))
    tmp = final + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        ctx.saved(ctx.key, seq, "", nbytes)  # the room goes back
        raise CheckpointError(
            f"checkpoint {seq} of task {ctx.key!r} ({nbytes} bytes) could not be written to "
            f"{ctx.dir}: {exc}. The previous checkpoint stays; free disk space on the worker."
        ) from exc
    ctx.seq, ctx.path = seq, final
    ctx.saved(ctx.key, seq, final, nbytes)
    return seq


def checkpoint(obj: Any) -> int:
    """Save ``obj`` (pickled) as the running task's latest checkpoint; return its number
    (1, 2, ... over the task's tries). If the task's worker is lost, its next try starts
    with ``restore()`` returning ``obj`` (or a later checkpoint)."""
    ctx = _current("checkpoint()")
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _save(ctx, len(data), lambda f: f.write(data))


def checkpoint_file(path: str | os.PathLike[str]) -> int:
    """Save a copy of the file at ``path`` (the task's own state file) as the running
    task's latest checkpoint; return its number. A later try gets the copy back with
    ``restore_path()``. The file at ``path`` is left as it is."""
    ctx = _current("checkpoint_file()")
    try:
        src = open(path, "rb")  # noqa: SIM115 - closed below, after the size is known
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint_file({str(path)!r}) in task {ctx.key!r}: the file cannot be read "
            f"({exc}). Pass the path of the state file the task wrote."
        ) from exc
    with src:
        nbytes = os.fstat(src.fileno()).st_size
        return _save(ctx, nbytes, lambda f: shutil.copyfileobj(src, f, 2**20))


def restore_path() -> str | None:
    """The local path of the running task's latest checkpoint file, or None if it has
    none. Read it, never write it: the worker may copy or delete it."""
    return _current("restore_path()").path


def restore() -> Any:
    """The object of the running task's latest checkpoint, or None if it has none."""
    ctx = _current("restore()")
    if ctx.path is None:
        return None
    try:
        with open(ctx.path, "rb") as f:
            return unpickling.load(f)
    except Exception as exc:  # not a pickle: unpickling raises what the bytes lead to
        raise CheckpointError(
            f"the latest checkpoint of task {ctx.key!r} ({ctx.path}) cannot be unpickled "
            f"({type(exc).__name__}: {exc}): if the task saved it with checkpoint_file(), "
            "read it with restore_path()."
        ) from exc
