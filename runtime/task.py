"""Checkpoints: what a running task can call to save its progress and get it back.

``checkpoint(obj)`` pickles ``obj`` and makes it the task's latest checkpoint: the
worker sends it to the scheduler, which keeps the latest one per running task (off the
worker, so losing the worker does not lose it). ``restore()`` returns the object of the
latest checkpoint the task saved, in this try or an earlier one (a try on a worker that
was lost), or None. The scheduler drops a task's checkpoint when the task ends.

The executor sets the running task's context around the call (:func:`running`); this
module knows nothing of workers or messages. docs/files.md, "Checkpoints".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import pickle
from collections.abc import Callable, Iterator
from typing import Any

from runtime.errors import CheckpointError

__all__ = ["MAX_CHECKPOINT", "TaskContext", "checkpoint", "restore", "running"]

#: The largest pickled checkpoint, in bytes: it travels to the scheduler in one message.
MAX_CHECKPOINT = 16 * 2**20


@dataclasses.dataclass(slots=True)
class TaskContext:
    """The checkpoint state of one running try: the latest checkpoint (``seq``, its
    pickled bytes; ``seq`` 0 and None: none yet) and where a new one goes,
    ``save(key, seq, data)``. None: the mode cannot send one (``why`` says why)."""

    key: Any
    seq: int
    data: bytes | None
    save: Callable[[Any, int, bytes], None] | None
    why: str = ""


_CURRENT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "corral_task", default=None
)


@contextlib.contextmanager
def running(ctx: TaskContext) -> Iterator[TaskContext]:
    """Make ``ctx`` the running task's context for the code inside the block."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def _current(what: str) -> TaskContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise CheckpointError(
            f"{what} was called outside a running task: call it from inside a task "
            "function that a Corral worker runs."
        )
    return ctx


def checkpoint(obj: Any) -> int:
    """Save ``obj`` as the running task's latest checkpoint; return its number (1, 2,
    ... over the task's tries). If the task's worker is lost, its next try starts with
    ``restore()`` returning ``obj`` (or a later checkpoint)."""
    ctx = _current("checkpoint()")
    if ctx.save is None:
        raise CheckpointError(ctx.why)
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_CHECKPOINT:
        raise CheckpointError(
            f"checkpoint of task {ctx.key!r} is {len(data)} bytes pickled, more than the "
            f"{MAX_CHECKPOINT} a checkpoint can hold: save less (the progress made, not "
            "the data), or write the large part to shared storage and checkpoint its path."
        )
    ctx.seq += 1
    ctx.data = data
    ctx.save(ctx.key, ctx.seq, data)
    return ctx.seq


def restore() -> Any:
    """The object of the running task's latest checkpoint, or None if it has none."""
    ctx = _current("restore()")
    return None if ctx.data is None else pickle.loads(ctx.data)
