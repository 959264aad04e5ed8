"""The records that travel between actors: tasks to run, how tries ended, output facts.

What lives here:

- :class:`ToRun`: one task for a worker (scheduler -> worker, in ``RunTasks``).
- :class:`TaskResult`: how one try ended on a worker (worker -> scheduler, in
  ``TasksDone``).
- :class:`FileFact`: what the registry needs about one output (scheduler -> registry,
  in ``FileFactsMsg``).
- :func:`past_limit_logged`: when a thread worker past its terminate fence is logged,
  one rule for the worker's own line and the scheduler's warning of its reports.

They live apart from the actors that make and read them, so that each side imports
this module and not the other side's: the worker and its executor need no scheduler
core to read a task, nor the registry to read a fact. The scheduler core's events and
commands carry them (``TasksFinished``, ``Execute``, ``FileFacts``, in
``actors/scheduler_events.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

from runtime.graph import GraphNode, Key, PickledNode

__all__ = ["PAST_PEAK_LOG_STEP", "FileFact", "TaskResult", "ToRun", "past_limit_logged"]


@dataclasses.dataclass(slots=True)  # per task: not frozen (3x cheaper); never mutated
class ToRun:
    """One task for a worker: its node and, per dependency, the workers holding it."""

    key: Key
    node: GraphNode | PickledNode
    category: str
    deps: tuple[tuple[Key, tuple[str, ...]], ...]
    producer: bool = False  #: a memory producer: a throttled worker defers it
    dep_nbytes: tuple[int, ...] = ()  #: size of each dependency, as ``deps``
    #: the checkpoint an earlier try left to start from, or None: ``(seq, data,
    #: holder, nbytes)``, its bytes when the scheduler holds them (``holder`` ""), else
    #: None and the worker whose disk has the file (maybe the one it is sent to)
    checkpoint: tuple[int, bytes | None, str, int] | None = None
    #: the scheduler's number for this try, unique in its run (0: not numbered); the
    #: try's :class:`TaskResult` says it back, so a report of an earlier try of the key
    #: (cancelled, then sent to the same worker again) is not taken for this one's
    attempt: int = 0
    #: seconds this try may execute on the worker (``timeout=``; None: no limit): past
    #: it the worker stops it and reports ``timeout`` (:class:`runtime.errors.TaskTimeout`)
    timeout: float | None = None

    def with_pickled_node(self) -> ToRun:
        if isinstance(self.node, PickledNode):
            return self
        node = PickledNode.of(self.key, self.node)
        return dataclasses.replace(self, node=node)


# Per task: not frozen (3x cheaper); mutated once only, when ``attempt`` is stamped.
@dataclasses.dataclass(slots=True)
class TaskResult:
    """How one try ended on a worker.

    ``rss_before``/``rss`` are the worker's RSS right before and right after the task.
    ``outcome`` is ``ok``, ``error``, ``timeout``, ``cancelled``, ``oom`` (killed past
    the worker's terminate fence), ``disk-full`` (its output did not fit on the
    worker's disk: ``nbytes`` is the output's size, which was not kept) or ``missing`` (an input
    could not be fetched: ``missing`` lists ``(key, worker)`` pairs that did not have it;
    the task did not start). ``fetched`` are inputs the worker copied from peers and
    still holds; ``fetches`` every input it copied from a peer for this task, kept or
    not: ``(key, peer, nbytes, seconds)`` (the request's round trip, as the worker saw it).
    """

    key: Key
    outcome: Literal["ok", "error", "timeout", "cancelled", "missing", "oom", "disk-full"]
    start: float = 0.0
    stop: float = 0.0
    nbytes: int = 0
    rss: int = 0
    error: BaseException | None = None
    missing: tuple[tuple[Key, str], ...] = ()
    fetched: tuple[Key, ...] = ()
    rss_before: int = 0
    rss_peak: int = 0  #: highest RSS sampled while it ran (0: not measured)
    fetches: tuple[tuple[Key, str, int, float], ...] = ()
    #: the output is a file output (``runtime/files.py``): ``nbytes`` on the worker's
    #: disk, none in its memory
    file: bool = False
    #: the :class:`ToRun`'s ``attempt``, stamped by the worker's core when it reports
    #: the try (0: not numbered)
    attempt: int = 0
    #: a try killed for memory (``oom``) in a task process: the highest RSS of that
    #: process while the task ran, the task's own memory without the worker's (its
    #: stored outputs, inputs on their way); 0: not known (thread execution)
    own_rss: int = 0
    #: a ``cancelled`` try of an ``async def`` task in thread execution whose coroutine
    #: was cancelled on its event loop: it stops at its next await, where a thread
    #: alone could only be given up (a timed-out one's ``TaskTimeout`` says so)
    stopping: bool = False


class FileFact(NamedTuple):
    """Everything the registry needs about one output, as of now.

    A named tuple: several are made per finished task, and a tuple is the cheapest
    immutable record to build."""

    key: Key
    state: Literal["pending", "created", "released", "forgotten"]
    nbytes: int
    replicas: tuple[str, ...]
    consumers: int
    wanted: bool
    file: bool = False  #: a file output (``runtime/files.py``): ``nbytes`` on disk


#: a thread worker past its terminate fence is logged again once its excess over its
#: limit doubled, from at least this fraction of its limit (:func:`past_limit_logged`;
#: the worker reports each ``actors.worker_state.PAST_PEAK_STEP`` climb, 5% too)
PAST_PEAK_LOG_STEP = 0.05


def past_limit_logged(logged: int, peak: int, limit: int) -> bool:
    """Whether a thread worker of memory ``limit`` past its terminate fence, whose RSS
    reached the new high ``peak``, is logged again (the worker's own line at info, the
    scheduler's at warning: one rule for both), ``logged`` being the peak it was
    last logged at (0: never): the first time, then each time its excess over the limit
    at least doubles (from at least ``PAST_PEAK_LOG_STEP`` of the limit), so a task growing
    far past it is logged a handful of times, not at every 5% (its warning in
    ``status()["warnings"]`` follows every peak)."""
    if not logged:
        return True
    step = PAST_PEAK_LOG_STEP * limit
    return peak - limit >= 2 * max(logged - limit, step)
