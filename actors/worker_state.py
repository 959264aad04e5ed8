"""The worker's pure core: which tasks fetch, wait, run, and what memory needs.

What lives here: the events the worker's shell (``actors/worker.py``) feeds, the
commands it carries out, and :class:`WorkerState` with its one mutator
``handle(*events) -> list[Command]``. No clock, no threads, no I/O: every event carries
``now`` (the wall clock, seconds), values pass through as opaque objects, and a timer is
a command. The memory governor (``actors/memory.py``) is a sub-core the state calls.

A task handed to this worker is in exactly one place:

- ``fetching``: some inputs are on peers; each missing input is fetched once, however
  many tasks need it, in requests of at most ``GET_DATA_BYTES`` to one peer, at most
  ``max_fetches`` requests in flight. A peer that lacks a key, or cannot be reached, is
  not asked again for it: the next holder is. When no holder is left, the tasks needing
  it are reported ``missing`` (they did not start) so the scheduler recomputes it.
- ``deferred``: its inputs are here; it produces memory and the worker is throttled,
  so the governor holds it back for a growing interval.
- ``queued``: its inputs are here, some spilled to disk, and no thread is free: the
  inputs are loaded only when one is, not for every queued task at once.
- ``running``: handed to the executor: executing, or waiting in its queue for a thread
  (the scheduler sends up to ``saturation`` tasks per thread). Which ones execute, the
  executor knows: each memory sample names them (:class:`MemorySampled`).

A running task with a ``timeout`` has a deadline in ``deadlines``: until a sample shows
it executing, the earliest it could end (handed over, or not executing at the latest
sample, plus its timeout); once one does, when it began (the sample's ``now`` less the
seconds it had executed) plus its timeout. The one timer (:class:`StartTimer`) is armed
for the earliest deadline. At a deadline the core asks for a sample if it has not seen
the try begin, or stops it as a cancel does (:class:`CancelRunning`) and, when its try
comes back ``cancelled``, reports it ``timeout`` with a
:class:`~runtime.errors.TaskTimeout` (a try that came back ``ok`` or with its own error
meanwhile is reported as it ended).

A finished task's output is stored; copies of peers' outputs it read are kept while
small or still needed here, and a large one nothing here needs is dropped at once (its
owner still has it). Every try ends in exactly one :class:`TaskResult`, built once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal

from actors import memory as mem
from actors.protocol import TaskResult, ToRun, past_limit_logged
from runtime.errors import DiskFull, TaskTimeout
from runtime.graph import Key
from runtime.messages import get_data_batches

__all__ = [
    "ALONE_EVENT",
    "EXIT_EVENT",
    "FLOOR_EVENT",
    "KEEP_REPLICA_BYTES",
    "RUN_THREADS",
    "RUN_WAITING",
    "STARTED_AFTER",
    "CancelRequested",
    "CancelRunning",
    "Command",
    "CopiesDone",
    "CopiesRequested",
    "DropRequested",
    "Event",
    "Exit",
    "Fetch",
    "Forget",
    "InputsFetched",
    "Kill",
    "Log",
    "MemorySampled",
    "ReportDone",
    "ReportMemory",
    "ReportStarted",
    "RunSlots",
    "Sample",
    "Spill",
    "Spilled",
    "StartTimer",
    "Store",
    "Submit",
    "TasksAssigned",
    "TasksFinished",
    "ThreadsHeld",
    "TimerFired",
    "Trim",
    "WorkerState",
]

#: a copy of a peer's output at least this large is dropped once nothing here needs it
KEEP_REPLICA_BYTES = 1 << 20

#: the warning a worker logs when its floor (memory that is not outputs) is at or past its
#: resume mark, with the marks it goes by instead
#: (docs/memory.md#the-floor-memory-that-is-not-outputs)
FLOOR_EVENT = "memory that is not outputs keeps the worker past its resume mark; marks moved up"
#: the warning a worker in process execution logs, once per climb past its terminate
#: fence, when no running task's process grew (:class:`actors.memory.Spared`)
EXIT_EVENT = (
    "past the exit mark with tasks in threads, which cannot be killed: the worker stops "
    "itself, charging the task whose RSS rose most (oom), and its other tasks run elsewhere"
)
SPARED_EVENT = (
    "past the terminate fence, but no running task's process grew since its task began: "
    "the memory is the worker process's (outputs, inputs and copies on their way), and "
    "killing a task would free none of it; none is killed"
)
#: the warning a worker logs when it starts, alone and idle, a producer whose expected
#: output does not fit under its terminate fence (:class:`actors.memory.Alone`)
ALONE_EVENT = (
    "a producer expected to pass the terminate fence starts alone: the worker is idle "
    "and nothing it holds can be freed to make room"
)

#: seconds a try executes before the scheduler is told it started (:class:`ReportStarted`):
#: short tasks owe no message; a speculative copy needs a longer run than this
STARTED_AFTER = 0.5

# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    now: float  #: wall-clock seconds


@dataclasses.dataclass(frozen=True, slots=True)
class TasksAssigned(Event):
    """The scheduler hands these tasks to this worker."""

    tasks: tuple[ToRun, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class InputsFetched(Event):
    """The answer to :class:`Fetch` ``fetch``: the ``(key, value, nbytes)`` copies got,
    the keys the peer does not hold, the keys refused with an error (a value this worker
    can never hold; a file output its disk has no room for, ``DiskFull``: the tasks
    waiting for it end ``disk-full``), and ``failed``: why the rest did not come (peer
    gone, timeout)."""

    fetch: int
    got: tuple[tuple[Key, Any, int], ...] = ()
    missing: tuple[Key, ...] = ()
    refused: tuple[tuple[Key, BaseException], ...] = ()
    failed: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class CopiesRequested(Event):
    """Keep copies of these outputs of a peer that is leaving (data evacuation):
    ``(key, holders, nbytes)`` each; answer with :class:`CopiesDone` ``request``."""

    request: int
    keys: tuple[tuple[Key, tuple[str, ...], int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TasksFinished(Event):
    """Tries the executor ended, with each ``ok`` try's output (else None)."""

    results: tuple[tuple[TaskResult, Any], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class MemorySampled(Event):
    """The worker's RSS (with its task processes), read at one moment, and the tasks
    executing at that moment (started by the executor, not ended: not those handed over
    and waiting in its queue). ``tasks``: ``(key, RSS)`` of each one executing in a
    process of its own (the ones that can be killed); ``executing``: the keys executing
    in the worker's threads, each of which ran at ``rss``.

    A sample is an observation, like ``now``: the shell reads who executes from the
    executor along with the RSS, so the core attributes it without knowing about
    threads, and no event is owed per task start (none on the hot path).
    ``executed``: ``(key, seconds it has executed)`` of every task executing, in a
    thread or a process (the executor's ``executing_for``). ``stored``: the bytes of
    outputs the store holds in memory, read with the RSS (None: not known; the governor
    then counts all of the RSS over the spill fence as outputs)."""

    rss: int
    tasks: tuple[tuple[Key, int], ...] = ()
    executing: tuple[Key, ...] = ()
    executed: tuple[tuple[Key, float], ...] = ()
    stored: int | None = None
    #: ``(key, RSS)`` of the process of each of ``tasks`` when its task began
    began: tuple[tuple[Key, int], ...] = ()
    #: a spill that asked for bytes is under way: the value it writes stays in memory
    #: until its file is complete, whatever the store holds (one dropped meanwhile too)
    spilling: bool = False
    #: a stream serves a value from memory to a peer or a client: its buffers stay in
    #: memory until the reader has read it, whatever the store holds (one spilled or
    #: dropped meanwhile too)
    serving: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class TimerFired(Event):
    """The timer of the latest :class:`StartTimer` fired."""


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadsHeld(Event):
    """How many of the executor's threads hold their slot with a try that was stopped
    but could not be (thread execution, past its abandoned threads: the executor's
    ``held``): its try was reported, but the thread takes no task until the call
    returns. The shell feeds it whenever the count changes."""

    threads: int


@dataclasses.dataclass(frozen=True, slots=True)
class CancelRequested(Event):
    """The scheduler cancels these tasks (no report is owed for one that never ran)."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class DropRequested(Event):
    """The scheduler releases these outputs (or this worker's copies of them)."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Spilled(Event):
    """These outputs moved to disk (the shell carried out a :class:`Spill`)."""

    keys: tuple[Key, ...]


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Fetch(Command):
    """Ask peer ``peer`` for ``keys``; answer with :class:`InputsFetched` ``fetch``."""

    fetch: int
    peer: str
    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Submit(Command):
    """Hand ``task`` to the executor with its inputs (read from disk where spilled)."""

    task: ToRun


@dataclasses.dataclass(frozen=True, slots=True)
class CancelRunning(Command):
    """Cancel a task the executor has: its try comes back ``cancelled``."""

    key: Key


@dataclasses.dataclass(frozen=True, slots=True)
class Kill(Command):
    """Kill running task ``key`` (past the terminate fence); its try ends ``oom``."""

    key: Key
    rss: int


@dataclasses.dataclass(frozen=True, slots=True)
class Exit(Command):
    """Stop this worker process now: in thread execution its RSS reached the ``exit``
    memory option (``rss``), and running task ``key``, charged with it (its try was
    reported ``oom``), cannot be killed in its thread. The tasks still running here are
    lost with the worker and run elsewhere."""

    key: Key
    rss: int


@dataclasses.dataclass(frozen=True, slots=True)
class Store(Command):
    """Keep ``value`` as output ``key`` (an output made here, or a peer's copy)."""

    key: Key
    value: Any
    nbytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Forget(Command):
    """Delete these outputs (those not held are ignored)."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Spill(Command):
    """Move at least ``nbytes`` of outputs to disk, least recently used first; answer
    with :class:`Spilled`. Not ``in_use``: inputs of tasks handed to the executor, which
    holds them until the task ends (writing them frees no memory); nor ``fresh``: outputs
    made in the last ``SPILL_GRACE`` seconds, which the governor keeps while the memory
    over the fence is not outputs (:class:`actors.memory.Spill`); ``read_soon`` last:
    inputs of tasks waiting here (each would be read back from disk)."""

    nbytes: int
    in_use: frozenset[Key] = frozenset()
    read_soon: frozenset[Key] = frozenset()
    fresh: frozenset[Key] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class ReportDone(Command):
    """Tell the scheduler these tries ended."""

    results: tuple[TaskResult, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ReportStarted(Command):
    """Tell the scheduler these tries have executed for ``STARTED_AFTER`` seconds or
    more: ``(key, attempt, seconds executed)``, once per try. The scheduler counts a
    try's running time from its start here, not from when it was sent (speculative
    copies are made of tries that run long, never of ones waiting in this queue)."""

    started: tuple[tuple[Key, int, float], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class CopiesDone(Command):
    """Copy request ``request`` is settled: ``got`` are held here now (the rest could
    not be had)."""

    request: int
    got: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ReportMemory(Command):
    """Tell the scheduler the worker's memory state (throttled, RSS, spilled)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Trim(Command):
    """Give freed memory back to the OS (``gc.collect()``, glibc's ``malloc_trim``):
    idle over the resume mark with nothing left to spill (the governor's
    :class:`~actors.memory.Trim`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sample(Command):
    """Read memory now and answer with :class:`MemorySampled`."""


@dataclasses.dataclass(frozen=True, slots=True)
class StartTimer(Command):
    """Send :class:`TimerFired` at ``at`` (replaces a later timer)."""

    at: float


@dataclasses.dataclass(frozen=True, slots=True)
class Log(Command):
    level: str
    event: str
    fields: tuple[tuple[str, Any], ...] = ()


# ----------------------------------------------------------------------------- core


@dataclasses.dataclass(slots=True)
class _Want:
    """An input being fetched for the tasks in ``waiters`` (in the order they came)."""

    nbytes: int
    holders: tuple[str, ...]
    tried: list[str]  #: holders asked that did not deliver it
    waiters: dict[Key, None]
    fetch: int = 0  #: the request it is in; 0 while queued
    copies: dict[int, None] = dataclasses.field(default_factory=dict)  #: copy requests


@dataclasses.dataclass(slots=True)
class _Copies:
    """A copy request: the keys not settled yet, and those got."""

    lacking: set[Key]
    got: list[Key]


@dataclasses.dataclass(slots=True)
class _Fetching:
    task: ToRun
    lacking: set[Key]


#: a worker past its terminate fence with tasks in threads tells the scheduler its RSS
#: again each time it climbs this fraction of its limit higher (a bounded number of
#: reports however far it goes)
PAST_PEAK_STEP = 0.05
#: what a worker logs (info) when memory passes its terminate fence with its tasks in
#: threads; the scheduler's warning of it says the peak, the tasks and what to do
PAST_FENCE_IN_THREADS = (
    "past the terminate fence, but tasks run in threads and cannot be killed; run workers "
    "with execution 'process' to have the fence kill tasks"
)


class WorkerState:
    """One worker's tasks, inputs and memory decisions."""

    def __init__(
        self,
        worker_id: str,
        nthreads: int,
        memory: mem.MemoryConfig,
        *,
        killable: bool = False,
        exits: bool = False,
        max_fetches: int | None = None,
    ) -> None:
        if nthreads < 1:
            raise ValueError(f"a worker needs at least one thread, got {nthreads}")
        self.worker_id = worker_id
        self.nthreads = nthreads
        self.killable = killable  #: tasks run in processes the terminate fence can kill
        #: a worker process of its own, which may stop itself (the ``exit`` memory
        #: option, thread execution); an in-process worker may not end its program
        self.exits = exits
        #: it stopped itself past its exit mark (:class:`Exit`): no event is taken since
        self.exiting = False
        #: task executing in a thread -> the RSS of the sample before the first that saw
        #: it execute (what it allocated before that sample is its own rise)
        self._base: dict[Key, int] = {}
        self._last_rss: int | None = None  #: the RSS of the latest sample, in thread execution
        self.max_fetches = max(2, 2 * nthreads) if max_fetches is None else max_fetches
        self.governor = mem.MemoryGovernor(memory)
        self.fetching: dict[Key, _Fetching] = {}
        self.deferred: dict[Key, ToRun] = {}
        self.queued: dict[Key, ToRun] = {}
        self.running: dict[Key, ToRun] = {}
        self.held: dict[Key, int] = {}  #: outputs here -> their bytes
        self.on_disk: set[Key] = set()  #: the held ones spilled to disk
        self.copied: dict[Key, list[Key]] = {}  #: task -> peers' outputs copied for it
        #: task -> the copies made for it: (key, peer, nbytes, seconds) (TaskResult.fetches)
        self.fetch_log: dict[Key, list[tuple[Key, str, int, float]]] = {}
        self._sent_at: dict[int, float] = {}  #: fetch request -> when it was sent
        self._now = 0.0  #: the time of the event being handled
        self.cancelled: set[Key] = set()  #: running tasks cancelled, their try not back
        #: cancelled running tasks sent here again before their try came back: each
        #: starts (as its newer try) once the cancelled one is back
        self.reasked: dict[Key, ToRun] = {}
        self.wants: dict[Key, _Want] = {}
        self.copies: dict[int, _Copies] = {}  #: copy requests not settled
        self.to_fetch: dict[str, list[Key]] = {}  #: peer -> wanted keys to ask it for
        self.in_flight: dict[int, tuple[str, tuple[Key, ...]]] = {}
        self.timer: float | None = None  #: when the armed timer fires
        self.tasks_run = 0
        self._fetch_ids = 0
        #: killed task -> the worker's highest RSS from the kill's sample until it ended
        self._killed_at: dict[Key, int] = {}
        #: of those, the RSS of each one's own task process when it was killed
        self._killed_own: dict[Key, int] = {}
        #: running task -> highest RSS sampled while it executed (kept when it is killed)
        self._peaks: dict[Key, int] = {}
        self._over_terminate = False
        #: the highest RSS sampled past the terminate fence with tasks in threads (not
        #: killable): reported to the scheduler (``WorkerMemoryReport.past_peak``), which
        #: warns in its status; 0: never past it
        self.past_peak = 0
        #: of those, the one it last logged (:func:`actors.protocol.past_limit_logged`)
        self._past_logged = 0
        #: running task -> the attempt the scheduler was told has started (ReportStarted)
        self.told_started: dict[Key, int] = {}
        #: running task with a timeout -> when to look at it next (see the module's doc)
        self.deadlines: dict[Key, float] = {}
        self.began: dict[Key, float] = {}  #: of those, when a sample saw each begin
        #: running tasks stopped past their timeout -> seconds each had executed
        self.timed_out: dict[Key, float] = {}
        #: threads held by a stopped try that could not be stopped (:class:`ThreadsHeld`)
        self.threads_held = 0

    # -- the one mutator ---------------------------------------------------------------

    def handle(self, *events: Event) -> list[Command]:
        out: list[Command] = []
        if self.exiting:  # the process is stopping: nothing more is started or told
            return out
        for ev in events:
            self._now = ev.now
            if isinstance(ev, TasksFinished):
                self._finished(ev, out)
            elif isinstance(ev, TasksAssigned):
                for task in ev.tasks:
                    self._assigned(task, ev.now, out)
            elif isinstance(ev, MemorySampled):
                self._sampled(ev, out)
            elif isinstance(ev, InputsFetched):
                self._fetched(ev, out)
            elif isinstance(ev, CopiesRequested):
                self._copies_requested(ev, out)
            elif isinstance(ev, TimerFired):
                self.timer = None
                self._govern(self.governor.handle(mem.Tick(ev.now)), ev.now, out)
            elif isinstance(ev, CancelRequested):
                for key in ev.keys:
                    self._cancel(key, ev.now, out)
            elif isinstance(ev, DropRequested):
                self._drop_requested(ev.keys, out)
            elif isinstance(ev, Spilled):
                self.on_disk.update(k for k in ev.keys if k in self.held)
            elif isinstance(ev, ThreadsHeld):
                self._threads_held(ev.threads, out)
            else:
                raise TypeError(f"WorkerState cannot handle {type(ev).__name__}")
        if self.deadlines:
            self._watch(out)
        self._pump(out)
        return out

    # -- queries -----------------------------------------------------------------------

    @property
    def threads(self) -> int:
        """Threads free to run tasks: all but those a stopped try holds."""
        return self.nthreads - self.threads_held

    @property
    def active(self) -> tuple[Key, ...]:
        """Every task handed here whose try has not been reported."""
        return (*self.fetching, *self.deferred, *self.queued, *self.running)

    def validate(self) -> None:
        """Check the invariants (tests call it after every step)."""
        places: list[dict[Key, Any]] = [self.fetching, self.deferred, self.queued, self.running]
        seen: set[Key] = set()
        for place in places:
            assert not seen & place.keys(), f"a task in two places: {seen & place.keys()}"
            seen |= place.keys()
        assert self.cancelled <= self.running.keys(), "cancelled but not running"
        assert self.reasked.keys() <= self.cancelled, "sent again but not cancelled"
        assert self.on_disk <= self.held.keys(), "on disk but not held"
        assert set(self.deferred) == set(self.governor.deferred), "deferred != governor's"
        producing = self.governor.producing.keys()
        assert producing <= self.running.keys() | self.queued.keys(), "producing, not started"
        assert not self.queued or len(self.running) >= self.threads, "queued, thread free"
        assert self._peaks.keys() <= self.running.keys(), "a peak of a task not running"
        assert self.deadlines.keys() <= self.running.keys() - self.cancelled, "deadline"
        assert self.began.keys() <= self.deadlines.keys(), "began, without a deadline"
        assert self.timed_out.keys() <= self.cancelled, "timed out, not being stopped"
        for key in self.deadlines:
            assert self.running[key].timeout is not None, f"{key!r} has no timeout"
        assert len(self.in_flight) <= self.max_fetches, "too many fetches in flight"
        for waiting in (*self.deferred.values(), *self.queued.values()):
            for dk, _ in waiting.deps:  # a task waiting here is handed over with its inputs
                assert dk in self.held, f"{waiting.key!r} waits without {dk!r}"
        for key, f in self.fetching.items():
            assert f.lacking, f"{key!r} fetching nothing"
            for dk, _ in f.task.deps:
                assert dk in self.held or dk in f.lacking, f"{key!r} lost {dk!r}"
            for dk in f.lacking:
                assert key in self.wants[dk].waiters, f"{key!r} not waiting for {dk!r}"
                assert dk not in self.held, f"{dk!r} held yet lacking"
        for r, c in self.copies.items():
            assert c.lacking, f"copy request {r} settled but open"
            for dk in c.lacking:
                assert r in self.wants[dk].copies, f"copy request {r} not waiting for {dk!r}"
        queued = {k: p for p, ks in self.to_fetch.items() for k in ks}
        assert sum(map(len, self.to_fetch.values())) == len(queued), "queued twice"
        for dk, want in self.wants.items():
            assert want.waiters or want.copies, f"{dk!r} wanted by nobody"
            for t in want.waiters:
                assert dk in self.fetching[t].lacking
            for r in want.copies:
                assert dk in self.copies[r].lacking
            if want.fetch:  # asked (a request for an earlier want of it may be in flight)
                peer, keys = self.in_flight[want.fetch]
                assert dk in keys and dk not in queued, f"{dk!r} not asked"
            else:
                peer = queued[dk]
            assert peer in want.holders and peer not in want.tried, f"{dk!r} asked of {peer}"

    # -- tasks -------------------------------------------------------------------------

    def _assigned(self, task: ToRun, now: float, out: list[Command]) -> None:
        key = task.key
        running = self.running
        if key in running and key in self.cancelled:
            # Its cancelled try has not come back: this try starts once it has (one try
            # of a key at a time here; the scheduler tells the two apart by ``attempt``).
            self.reasked[key] = task
            return
        place = (
            running if key in running
            else self.queued if key in self.queued
            else self.deferred if key in self.deferred
            else None
        )  # fmt: skip
        if place is not None:  # sent twice (a rejoin): here already, as its newest try
            place[key] = dataclasses.replace(place[key], attempt=task.attempt)
            return
        f = self.fetching.get(key)
        if f is not None:
            f.task = dataclasses.replace(f.task, attempt=task.attempt)
            return
        if not task.deps and not task.dep_nbytes:  # nothing to fetch (the common case)
            self._ready(task, now, out)
            return
        held = self.held
        lacking: set[Key] = set()
        sizes = task.dep_nbytes or (0,) * len(task.deps)
        for (dk, holders), nbytes in zip(task.deps, sizes, strict=True):
            if dk in held or dk in lacking:
                continue
            want = self.wants.get(dk)
            if want is None:
                holders = tuple(h for h in holders if h != self.worker_id)
                if not holders:
                    self._abandon(key, lacking, out)
                    missing = ((dk, ""),)
                    result = TaskResult(key, "missing", missing=missing, attempt=task.attempt)
                    out.append(ReportDone((result,)))
                    return
                want = self.wants[dk] = _Want(nbytes, holders, [], {})
                self.to_fetch.setdefault(holders[0], []).append(dk)
            want.waiters[key] = None
            lacking.add(dk)
        if lacking:
            self.fetching[key] = _Fetching(task, lacking)
        else:
            self._ready(task, now, out)

    def _ready(self, task: ToRun, now: float, out: list[Command]) -> None:
        """Its inputs are here: run it, unless the governor defers it (a producer while
        the worker is throttled, or whose expected output does not fit)."""
        if not task.producer:
            self._run(task, out)
            return
        self.deferred[task.key] = task
        ready = mem.Ready(now, task.key, True, task.category)
        self._govern(self.governor.handle(ready), now, out)

    def _run(self, task: ToRun, out: list[Command]) -> None:
        on_disk = self.on_disk
        if self.queued or (
            on_disk
            and len(self.running) >= self.threads
            and any(dk in on_disk for dk, _ in task.deps)
        ):
            # Its inputs are on disk: load them only when a thread is free for it, not
            # for every task queued ahead in the executor at once.
            self.queued[task.key] = task
            self._start_queued(out)
            return
        self._submit(task, out)

    def _start_queued(self, out: list[Command]) -> None:
        queued, running = self.queued, self.running
        while queued and len(running) < self.threads:
            self._submit(queued.pop(next(iter(queued))), out)

    def _submit(self, task: ToRun, out: list[Command]) -> None:
        """Hand ``task`` to the executor; with a timeout, look at it again when it
        could end at the earliest (it begins executing now or later)."""
        self.running[task.key] = task
        out.append(Submit(task))
        if task.timeout is not None:
            self.deadlines[task.key] = self._now + task.timeout

    def _finished(self, ev: TasksFinished, out: list[Command]) -> None:
        results = []
        killed, cancelled, on_disk = self.governor.killed, self.cancelled, self.on_disk
        running, held, peaks, copies = self.running, self.held, self._peaks, self.copied
        self.tasks_run += len(ev.results)
        deadlines = self.deadlines
        for res, value in ev.results:
            key = res.key
            task = running.pop(key, None)
            if task is not None and task.attempt:
                res.attempt = task.attempt
            if deadlines and key in deadlines:
                del deadlines[key]
                self.began.pop(key, None)
            outcome = res.outcome
            # Its output (held in memory): what its category's next ones expect, if a
            # producer; an output just made, which the governor keeps from spilling for
            # a moment while the memory over the fence is not outputs.
            held_bytes = res.nbytes if outcome == "ok" and not res.file else 0
            self.governor.handle(mem.Finished(ev.now, key, held_bytes))
            peak = peaks.pop(key, 0) if peaks else 0
            if (
                outcome == "ok"
                and peak <= res.rss
                and not (copies and key in copies)
                and not (cancelled and key in cancelled)
                and not (killed and key in killed)
            ):
                # The common case: the executor's result is the report, as it is.
                held[key] = res.nbytes
                if on_disk:
                    on_disk.discard(key)
                out.append(Store(key, value, res.nbytes))
                results.append(res)
                continue
            killed_rss = self._killed_at.pop(key, None)
            # Its own process's peak (the peaks of tasks in processes are their own).
            own = max(peak, self._killed_own.pop(key, 0)) if killed_rss is not None else 0
            rss = killed_rss if outcome == "oom" and killed_rss is not None else res.rss
            copied = copies.pop(key, None)
            fetched = self._keep_copies(copied, out) if copied else res.fetched
            timeout_error = None
            if key in self.cancelled:
                self.cancelled.discard(key)
                ran = self.timed_out.pop(key, None) if self.timed_out else None
                if ran is not None:  # stopped past its timeout
                    if outcome == "cancelled" and task is not None and task.timeout:
                        outcome = "timeout"
                        timeout_error = TaskTimeout(
                            key,
                            self.worker_id,
                            task.timeout,
                            ran,
                            stopped=self.killable,
                            coroutine=res.stopping,  # cancelled on its loop (thread execution)
                        )
                    # else it ended by itself (or was killed for memory) first: as it ended
                elif outcome != "error":
                    outcome, value = "cancelled", None
                again = self.reasked.pop(key, None)
                if again is not None:
                    self._assigned(again, ev.now, out)
            if outcome == "ok":
                held[key] = res.nbytes
                self.on_disk.discard(key)
                out.append(Store(key, value, res.nbytes))
            # A disk-full try reports the size its output turned out to be (and why).
            nbytes = res.nbytes if outcome in ("ok", "disk-full") else 0
            error = res.error if outcome in ("error", "disk-full") else timeout_error
            results.append(
                TaskResult(
                    key,
                    outcome,
                    res.start,
                    res.stop,
                    nbytes,
                    rss,
                    error,
                    missing=res.missing,
                    fetched=fetched,
                    rss_before=res.rss_before,
                    rss_peak=max(peak, rss) if peak else 0,
                    fetches=tuple(self.fetch_log.pop(key, ())),
                    file=res.file and outcome == "ok",
                    attempt=res.attempt,
                    own_rss=own if outcome == "oom" else 0,
                )
            )
        if results:
            out.append(ReportDone(tuple(results)))
        self._start_queued(out)
        out.append(Sample())

    def _keep_copies(self, copied: list[Key], out: list[Command]) -> tuple[Key, ...]:
        """Copies of peers' outputs a finished task read: the small ones, and those
        another task here still needs, are kept (and reported as replicas); a large one
        nothing here needs is dropped at once. Its owner still has it, and a second
        copy would only take memory (or disk, once spilled) until the run ends."""
        held = self.held
        copied = [k for k in copied if k in held]
        large = [k for k in copied if held[k] >= KEEP_REPLICA_BYTES]
        if not large:
            return tuple(copied)
        needed = {
            dk
            for place in (self.running, self.deferred, self.queued)
            for t in place.values()
            for dk, _ in t.deps
        }
        needed.update(dk for f in self.fetching.values() for dk, _ in f.task.deps)
        drop = tuple(k for k in large if k not in needed)
        if drop:
            self._drop(drop, out)
        return tuple(k for k in copied if k not in drop)

    def _cancel(self, key: Key, now: float, out: list[Command]) -> None:
        f = self.fetching.pop(key, None)
        if f is not None:
            self._abandon(key, f.lacking, out)
            self.copied.pop(key, None)
            self.fetch_log.pop(key, None)
        elif self.deferred.pop(key, None) is not None or self.queued.pop(key, None) is not None:
            self.governor.handle(mem.Finished(now, key))  # deferred, or released and queued
        elif self.reasked.pop(key, None) is not None:
            pass  # its newer try never started: nothing to report; the older runs out
        elif key in self.timed_out:
            del self.timed_out[key]  # being stopped for its timeout: now a cancel's
        elif key in self.running and key not in self.cancelled:
            self._stop(key, out)

    def _stop(self, key: Key, out: list[Command]) -> None:
        """Stop running task ``key``: process mode kills its process; thread mode hands
        the slot to a fresh thread. Either way the try comes back ``cancelled`` and the
        slot is free."""
        self.cancelled.add(key)
        if self.deadlines.pop(key, None) is not None:
            self.began.pop(key, None)
        out.append(CancelRunning(key))

    def _threads_held(self, threads: int, out: list[Command]) -> None:
        """``threads`` of the executor's threads are held by tries that could not be
        stopped: the scheduler is told (it counts their slots busy, and places no task
        for them), and what is queued here starts only on the others."""
        if threads == self.threads_held:
            return
        self.threads_held = threads
        out.append(ReportMemory())
        self._start_queued(out)

    def _watch(self, out: list[Command]) -> None:
        """The tries past their deadline: stopped if a sample saw them begin that long
        ago, else a sample is asked for (it says whether, and since when, they execute);
        the timer armed for the next deadline."""
        now, deadlines, began = self._now, self.deadlines, self.began
        due = [k for k, at in deadlines.items() if at <= now]
        sample = False
        for key in due:
            timeout = self.running[key].timeout
            assert timeout is not None
            start = began.get(key)
            if start is None:  # not seen executing yet: look again when a sample says
                deadlines[key] = now + timeout
                sample = True
                continue
            ran = now - start
            self._stop(key, out)
            self.timed_out[key] = ran
            out.append(
                Log("warning", "task timed out", (("key", str(key)), ("timeout", timeout),
                                                  ("ran", round(ran, 3))))
            )  # fmt: skip
        if sample:
            out.append(Sample())
        if deadlines:
            self._arm(min(deadlines.values()), out)

    def _drop_requested(self, keys: tuple[Key, ...], out: list[Command]) -> None:
        """The scheduler releases these outputs here. One that a task waiting here
        (fetching its other inputs, deferred or queued) reads stays until that task is
        handed over: it was held when the task came, so nothing fetches it for the
        task, and the task would start without it. The scheduler sends such a drop when
        it takes the output for junk: a try it cancelled that had ended ``ok`` here
        meanwhile (a speculative copy won), whose dependent it sent here just before.
        The output becomes that task's copy, as if fetched for it: the task's report
        names it (``fetched``: the scheduler counts the replica, or drops it again) or,
        a large one nothing here needs any more, it is dropped when the task ends."""
        dropping = {k for k in keys if k in self.held}
        readers: dict[Key, Key] = {}  #: output dropped -> the first waiting task reading it
        if dropping:
            for place in (self.fetching, self.deferred, self.queued):
                for key, t in place.items():
                    deps = t.task.deps if isinstance(t, _Fetching) else t.deps
                    for dk, _ in deps:
                        if dk in dropping:
                            readers.setdefault(dk, key)
        for k, reader in readers.items():
            copied = self.copied.setdefault(reader, [])
            if k not in copied:
                copied.append(k)
        rest = tuple(k for k in keys if k not in readers) if readers else keys
        if rest:
            self._drop(rest, out)

    def _drop(self, keys: Iterable[Key], out: list[Command]) -> None:
        held, on_disk = self.held, self.on_disk
        for key in keys:
            held.pop(key, None)
            on_disk.discard(key)
        out.append(Forget(tuple(keys)))

    # -- fetching ----------------------------------------------------------------------

    def _pump(self, out: list[Command]) -> None:
        """Send queued fetches, a request per peer and batch, up to ``max_fetches``."""
        to_fetch, wants = self.to_fetch, self.wants
        while to_fetch and len(self.in_flight) < self.max_fetches:
            peer = next(iter(to_fetch))
            keys = to_fetch[peer]
            batch = get_data_batches([(k, wants[k].nbytes) for k in keys])[0]
            rest = keys[len(batch) :]
            if rest:
                to_fetch[peer] = rest
            else:
                del to_fetch[peer]
            self._fetch_ids += 1
            fid = self._fetch_ids
            for k in batch:
                wants[k].fetch = fid
            self.in_flight[fid] = (peer, batch)
            self._sent_at[fid] = self._now
            out.append(Fetch(fid, peer, batch))

    def _fetched(self, ev: InputsFetched, out: list[Command]) -> None:
        request = self.in_flight.pop(ev.fetch, None)
        sent = self._sent_at.pop(ev.fetch, ev.now)
        if request is None:
            return
        peer, keys = request
        wants = self.wants
        answered: set[Key] = set()
        for key, value, nbytes in ev.got:
            answered.add(key)
            want = wants.get(key)
            if want is None or want.fetch != ev.fetch:
                continue  # nobody here needs it any more
            del wants[key]
            self.held[key] = nbytes
            out.append(Store(key, value, nbytes))
            self._settle_copies(key, want, True, out)
            first = True
            for t in want.waiters:
                f = self.fetching[t]
                f.lacking.discard(key)
                if first:  # one task owns the copy: its end decides whether it stays
                    self.copied.setdefault(t, []).append(key)
                    took = max(ev.now - sent, 0.0)
                    self.fetch_log.setdefault(t, []).append((key, peer, nbytes, took))
                    first = False
                if not f.lacking:
                    del self.fetching[t]
                    self._ready(f.task, ev.now, out)
        for key, error in ev.refused:
            answered.add(key)
            want = wants.get(key)
            if want is None or want.fetch != ev.fetch:
                continue
            self._give_up(key, want, ev.now, out, error=error)
        for key in keys:
            if key in answered:
                continue
            want = wants.get(key)
            if want is None or want.fetch != ev.fetch:
                continue
            want.tried.append(peer)
            untried = [h for h in want.holders if h not in want.tried]
            if untried:  # ask the next holder
                want.fetch = 0
                self.to_fetch.setdefault(untried[0], []).append(key)
                continue
            gone = tuple((key, h) for h in want.tried)
            self._give_up(key, want, ev.now, out, missing=gone)
        if ev.failed:
            out.append(Log("warning", "fetch failed", (("peer", peer), ("error", ev.failed))))

    def _give_up(
        self,
        key: Key,
        want: _Want,
        now: float,
        out: list[Command],
        *,
        error: BaseException | None = None,
        missing: tuple[tuple[Key, str], ...] = (),
    ) -> None:
        """``key`` cannot be had: the tasks waiting for it fail, copy requests settle
        without it."""
        del self.wants[key]
        for t in list(want.waiters):
            failed = error
            if isinstance(error, DiskFull) and error.input:  # the copy's: each reader's
                failed = error.reading(str(t))
            self._fail(t, now, out, error=failed, missing=missing)
        self._settle_copies(key, want, False, out)

    def _settle_copies(self, key: Key, want: _Want, got: bool, out: list[Command]) -> None:
        for r in want.copies:
            c = self.copies[r]
            c.lacking.discard(key)
            if got:
                c.got.append(key)
            if not c.lacking:
                del self.copies[r]
                out.append(CopiesDone(r, tuple(k for k in c.got if k in self.held)))

    def _copies_requested(self, ev: CopiesRequested, out: list[Command]) -> None:
        lacking: set[Key] = set()
        got = []
        for key, holders, nbytes in ev.keys:
            if key in self.held:
                got.append(key)
                continue
            if key in lacking:
                continue
            want = self.wants.get(key)
            if want is None:
                holders = tuple(h for h in holders if h != self.worker_id)
                if not holders:
                    continue
                want = self.wants[key] = _Want(nbytes, holders, [], {})
                self.to_fetch.setdefault(holders[0], []).append(key)
            want.copies[ev.request] = None
            lacking.add(key)
        if lacking:
            self.copies[ev.request] = _Copies(lacking, got)
        else:
            out.append(CopiesDone(ev.request, tuple(got)))

    def _fail(
        self,
        key: Key,
        now: float,
        out: list[Command],
        *,
        error: BaseException | None = None,
        missing: tuple[tuple[Key, str], ...] = (),
    ) -> None:
        """A fetching task cannot run: report it (``error``, else ``missing``)."""
        f = self.fetching.pop(key)
        attempt = f.task.attempt
        self._abandon(key, f.lacking, out)
        copied = self.copied.pop(key, None)
        fetched = tuple(k for k in copied if k in self.held) if copied else ()
        fetches = tuple(self.fetch_log.pop(key, ()))
        if error is not None:  # an input file this worker's disk cannot hold: disk-full
            outcome: Literal["error", "disk-full"] = (
                "disk-full" if isinstance(error, DiskFull) else "error"
            )
            result = TaskResult(
                key, outcome, now, now, error=error, fetched=fetched, fetches=fetches
            )
        else:
            result = TaskResult(key, "missing", missing=missing, fetched=fetched, fetches=fetches)
        result.attempt = attempt
        out.append(ReportDone((result,)))

    def _abandon(self, key: Key, lacking: Iterable[Key], out: list[Command]) -> None:
        """Task ``key`` no longer waits for ``lacking``: a key nobody else waits for
        is not fetched (a request in flight for it is let go; its copy not kept)."""
        wants = self.wants
        for dk in lacking:
            want = wants.get(dk)
            if want is None:
                continue
            want.waiters.pop(key, None)
            if want.waiters or want.copies:
                continue
            del wants[dk]
            if not want.fetch:
                peer = next(h for h in want.holders if h not in want.tried)
                keys = self.to_fetch[peer]
                keys.remove(dk)
                if not keys:
                    del self.to_fetch[peer]

    # -- memory ------------------------------------------------------------------------

    def _sampled(self, ev: MemorySampled, out: list[Command]) -> None:
        # Each task's peak: the highest RSS sampled while it executed. Only the tasks
        # the sample names were executing when it was read; those handed over but
        # waiting in the executor's queue (``running`` holds up to ``saturation`` tasks
        # per thread) were not, so it is not theirs. A key no longer running here (its
        # try came back meanwhile) gets nothing: peaks are popped when a try ends.
        peaks, running = self._peaks, self.running
        for k, r in ev.tasks:  # each task's own process
            if r > peaks.get(k, 0) and k in running:
                peaks[k] = r
        rss = ev.rss
        for k in ev.executing:  # tasks in the worker's threads: the process's RSS
            if rss > peaks.get(k, 0) and k in running:
                peaks[k] = rss
        killed_at = self._killed_at
        for k, at in killed_at.items():  # killed, not ended yet: still its try's
            if rss > at and k in running:
                killed_at[k] = rss
        if ev.executed:
            self._tell_started(ev.executed, out)
        if self.deadlines:
            self._began(ev, running)
        cfg = self.governor.config
        if not self.killable and self._exit(ev, cfg, out):
            return
        over = cfg.terminate is not None and ev.rss >= cfg.at(cfg.terminate)
        if over and not self.killable and ev.rss >= self.past_peak + PAST_PEAK_STEP * cfg.limit:
            self.past_peak = ev.rss  # the scheduler is told, each step higher
            out.append(ReportMemory())
            # Logged at info, by the rule the scheduler's warning of the same report
            # follows (the first crossing, then each doubling of the excess over the
            # limit): a user audit's median printed each crossing twice, the worker's
            # line at every climb from under the throttle fence, about 30 in all.
            if past_limit_logged(self._past_logged, ev.rss, cfg.limit):
                self._past_logged = ev.rss
                out.append(
                    Log("info", PAST_FENCE_IN_THREADS, (("rss", ev.rss), ("limit", cfg.limit)))
                )
        if ev.rss < cfg.at(cfg.throttle):
            self._over_terminate = False
        # Idle: no task here and every output held on disk (on_disk is a subset of held),
        # no input coming from a peer (its bytes are in memory before the store holds
        # them), and no spill writing a value: a value dropped while its file is written
        # (its run released) is still in memory, and a floor measured then is that value
        # (a chaos audit: an 800 MB output read as a floor of 0.85 GiB, marks moved up);
        # nor a stream serving a value from memory: a value spilled while a reader reads
        # it stays until the read ends (a user audit's 1.5 GB output, spilled while the
        # client gathered it, read as a floor of 1.56 GiB, blamed on a module global).
        idle = (
            not running
            and not self.queued
            and not self.fetching
            and len(self.on_disk) == len(self.held)
            and not ev.spilling
            and not ev.serving
        )
        cmds = self.governor.handle(
            mem.Sampled(ev.now, ev.rss, ev.tasks, idle, ev.stored, ev.began)
        )
        if self.governor.deferred:
            cmds += self.governor.handle(mem.Tick(ev.now))
        self._govern(cmds, ev.now, out)

    def _exit(self, ev: MemorySampled, cfg: mem.MemoryConfig, out: list[Command]) -> bool:
        """In thread execution: past the ``exit`` mark with a task executing, charge the
        executing task whose RSS rose most since the sample before the first that saw
        it execute (the newest of those within the governor's margin of the most) with
        an ``oom`` try and stop the worker (:class:`Exit`), as a nanny would; True then.
        A thread cannot be killed, and a task that grows on would take the machine.
        When none rose by the governor's margin, what holds the worker past the mark is
        not a task's (a value a stream serves after its spill, one a spill writes,
        outputs): none is charged and the worker stays, as the terminate fence spares a
        task process that did not grow (:class:`actors.memory.Spared`)."""
        base, running = self._base, self.running
        for k in [k for k in base if k not in running]:
            del base[k]
        before = ev.rss if self._last_rss is None else self._last_rss
        self._last_rss = ev.rss
        for k in ev.executing:
            base.setdefault(k, before)
        bound = cfg.exit_at
        executing = [k for k in ev.executing if k in running]
        if bound is None or not self.exits or ev.rss < bound or not executing:
            return False
        margin = self.governor.margin
        top = max(ev.rss - base[k] for k in executing)
        if top < margin:
            return False
        # Of those that rose within the margin of the most (ran through all the growth
        # but its noise), the newest: the growth began when it began. The oldest, whose
        # rise counts the RSS noise of the time it ran alone, would be charged for a hog
        # started beside it (a sleeper charged, the hog retried free: measured).
        seen = {k: i for i, k in enumerate(base)}  # (in the order first seen)
        near = [k for k in executing if ev.rss - base[k] >= max(top - margin, margin)]
        key = max(near, key=seen.__getitem__)
        seconds = dict(ev.executed).get(key, 0.0)
        result = TaskResult(
            key,
            "oom",
            ev.now - seconds,
            ev.now,
            rss=ev.rss,
            rss_before=base[key],
            rss_peak=max(self._peaks.get(key, 0), ev.rss),
            attempt=running[key].attempt,
        )
        fields = (("key", key), ("rss", ev.rss), ("exit_at", bound), ("limit", cfg.limit),
                  ("rise", ev.rss - base[key]), ("lost", len(running) - 1))  # fmt: skip
        out += [Log("error", EXIT_EVENT, fields), ReportDone((result,)), Exit(key, ev.rss)]
        self.exiting = True
        return True

    def _tell_started(self, executed: tuple[tuple[Key, float], ...], out: list[Command]) -> None:
        """Tell the scheduler, once per try, of each one executing for ``STARTED_AFTER``
        seconds or more (the tries that ended are forgotten here)."""
        running, told = self.running, self.told_started
        for k in [k for k in told if k not in running]:
            del told[k]
        started = []
        for k, seconds in executed:
            task = running.get(k)
            if task is not None and seconds >= STARTED_AFTER and told.get(k) != task.attempt:
                told[k] = task.attempt
                started.append((k, task.attempt, seconds))
        if started:
            out.append(ReportStarted(tuple(started)))

    def _began(self, ev: MemorySampled, running: dict[Key, ToRun]) -> None:
        """A sample's word on the tries with a timeout: one it shows executing began
        ``seconds`` before it (its deadline is then that plus its timeout); one it does
        not show has not begun (it can end no earlier than its timeout from now)."""
        deadlines, began = self.deadlines, self.began
        executed = dict(ev.executed)
        for key in deadlines:
            if key in began:
                continue
            timeout = running[key].timeout
            assert timeout is not None
            seconds = executed.get(key)
            if seconds is None:
                deadlines[key] = max(deadlines[key], ev.now + timeout)
            else:
                began[key] = ev.now - seconds
                deadlines[key] = began[key] + timeout

    def _govern(self, cmds: list[mem.Command], now: float, out: list[Command]) -> None:
        """Carry the governor's commands into this core's."""
        for cmd in cmds:
            if isinstance(cmd, mem.Run):
                task = self.deferred.pop(cmd.key, None)
                if task is not None:
                    self._run(task, out)
            elif isinstance(cmd, mem.Defer):
                self._arm(cmd.until, out)
            elif isinstance(cmd, mem.Throttled):
                event = "throttled" if cmd.on else "unthrottled"
                out.append(Log("info", event, (("rss", cmd.rss),)))
                out.append(ReportMemory())
            elif isinstance(cmd, mem.Spill):
                waiting = (*self.deferred.values(), *self.queued.values())
                waiting += tuple(f.task for f in self.fetching.values())
                in_use = _inputs(self.running.values())
                read_soon = _inputs(waiting) - in_use - cmd.keep
                out.append(Spill(cmd.nbytes, in_use, read_soon, cmd.keep))
            elif isinstance(cmd, mem.Trim):
                out.append(Trim())
            elif isinstance(cmd, mem.Floor):
                warning = self.governor.floor_text()
                fields = (("floor", cmd.floor), ("resume", cmd.resume),
                          ("throttle", cmd.throttle), ("warning", warning))  # fmt: skip
                out.append(Log("warning", FLOOR_EVENT, fields))
                out.append(ReportMemory())
            elif isinstance(cmd, mem.Kill) and cmd.key in self.running:
                self._killed_at[cmd.key] = cmd.rss
                self._killed_own[cmd.key] = cmd.own
                out.append(Kill(cmd.key, cmd.rss))
            elif isinstance(cmd, mem.Alone):
                alone: tuple[tuple[str, Any], ...] = (
                    ("key", cmd.key), ("expected", cmd.expected), ("rss", cmd.rss),
                    ("limit", self.governor.config.limit),
                )  # fmt: skip
                out.append(Log("warning", ALONE_EVENT, alone))
            elif isinstance(cmd, mem.Spared) and not self._over_terminate:
                self._over_terminate = True  # once per climb past it, as for threads
                spared = (("rss", cmd.rss), ("limit", cmd.limit), ("grown", cmd.grown))
                out.append(Log("warning", SPARED_EVENT, spared))

    def _arm(self, at: float, out: list[Command]) -> None:
        """One timer: the earliest deferral's."""
        if self.timer is not None and self.timer <= at:
            return
        self.timer = at
        out.append(StartTimer(at))


def _inputs(tasks: Iterable[ToRun]) -> frozenset[Key]:
    """The keys ``tasks`` read."""
    return frozenset(dk for task in tasks for dk, _ in task.deps)


#: the file system holding a worker's spill directory is named in its DiskFull (a larger
#: --disk cannot help) only when it has less free than the worker's limit leaves by more
#: than this share of the limit, or this many bytes per file the worker keeps there,
#: whichever is more: below that, the gap is the file system's own rounding (tmpfs
#: and most file systems give each file whole pages or blocks: a 1,048,704-byte file
#: takes 1,052,672 bytes), not another program's files (docs/files.md)
FS_SHORT_SHARE = 0.01
FS_SHORT_PER_FILE = 4096


def file_system_short(room: int | None, fs: int | None, limit: int, files: int) -> bool:
    """Whether the file system, not the worker's limit, is what had no room for a
    write or a copy (its DiskFull names it then): ``room`` is the disk left under
    the limit ``limit`` (None: no limit, ``--disk off``: the file system is all there
    is), ``fs`` what the file system has free less the worker's margin (None: it went
    away), ``files`` how many files the worker keeps on it. Only a shortfall beyond
    ``FS_SHORT_SHARE`` of the limit or ``FS_SHORT_PER_FILE`` per file counts."""
    if fs is None:
        return False
    if room is None:
        return True
    return room - fs > max(limit * FS_SHORT_SHARE, FS_SHORT_PER_FILE * files)


# ------------------------------------------------------------------------ Cluster.run

#: ``Cluster.run``'s calls a worker runs at once (threads of their own): a call that
#: never returns keeps its thread, and the ones past this many wait, so hung calls
#: cannot take the threads of the worker's own work.
RUN_THREADS = 4
#: ``Cluster.run``'s calls a worker keeps waiting for a run thread, at most: past this
#: many it refuses a call at once (:class:`~runtime.errors.RunQueueFull`), not run.
RUN_WAITING = 8

RunVerdict = Literal["run", "wait", "refuse"]


@dataclasses.dataclass
class RunSlots:
    """Which of ``Cluster.run``'s calls on one worker run (at most ``threads`` at once,
    each in a thread of its own), which wait for a thread (at most ``most_waiting``, in
    the order they came, each until its deadline: then it is dropped, never run), and
    which are refused. Calls are the shell's ids; time (``now``, a deadline) is given:
    seconds of the shell's monotonic clock."""

    threads: int = RUN_THREADS
    most_waiting: int = RUN_WAITING
    running: set[int] = dataclasses.field(default_factory=set)
    #: the calls waiting for a thread, in the order they came: their deadlines
    waiting: dict[int, float] = dataclasses.field(default_factory=dict)

    def arrive(self, call: int, deadline: float) -> RunVerdict:
        """``call`` came, to start by ``deadline``: ``"run"`` (it has a thread: start it),
        ``"wait"`` (for one, until ``deadline``) or ``"refuse"`` (too many wait)."""
        if len(self.running) < self.threads:
            self.running.add(call)
            return "run"
        if len(self.waiting) >= self.most_waiting:
            return "refuse"
        self.waiting[call] = deadline
        return "wait"

    def ended(self, call: int, now: float) -> tuple[int | None, tuple[int, ...]]:
        """``call`` returned: its thread goes to the first waiting call whose deadline
        has not come (returned first: start it); the waiting calls before it whose
        deadline has come are dropped (returned second)."""
        self.running.discard(call)
        dropped: list[int] = []
        while self.waiting and len(self.running) < self.threads:
            first, deadline = next(iter(self.waiting.items()))
            del self.waiting[first]
            if now < deadline:
                self.running.add(first)
                return first, tuple(dropped)
            dropped.append(first)
        return None, tuple(dropped)

    def expired(self, call: int) -> bool:
        """``call``'s deadline came (or its asker went) before it had a thread: True if
        it was still waiting (now dropped, never to run), False if it runs or ran."""
        return self.waiting.pop(call, None) is not None
