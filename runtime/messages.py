"""Typed messages exchanged between actors, clients and processes.

What lives here: the ``Message`` base, the registry of message types by wire name, the
catalogue of messages that cross an actor or process boundary, and the few constants and
helpers their fields' values follow (the pool key :data:`ANY_POOL`: :func:`pool_key`).

Rules:

1. A message is a frozen, slotted dataclass registered with :func:`message`. Its fields
   use only wire types: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
   ``tuple[X, ...]``, ``list[X]``, ``dict[str, X]``, ``X | None``, ``Literal[...]`` and
   other registered messages. ``bytes`` fields carry pickled payloads (functions,
   results); the codec ships them as raw binary frames, never base64.
2. Every message travels inside an envelope that carries its causal id (see
   :mod:`runtime.kernel`), so messages themselves do not repeat it.
3. Messages that only ever travel inside one process (for example ones carrying live
   Python objects) are marked ``local=True``; the codec refuses them with a clear error.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar, cast, dataclass_transform

__all__ = [
    "MESSAGE_TYPES",
    "Message",
    "message",
]


class Message:
    """Base class of every message type.

    Subclasses are declared with :func:`message`, which makes them frozen, slotted
    dataclasses and registers them under their wire name (the class name unless given).
    """

    __slots__ = ()
    wire_name: ClassVar[str] = ""
    local: ClassVar[bool] = False
    #: what a field reads as when a decoded frame lacks it, where that differs from its
    #: default: the value an older peer, whose code did not have the field, means
    #: (``Hello.protocol``: 0, a peer from before protocol versions). The default stays
    #: what this side's code builds the message with.
    absent_reads_as: ClassVar[Mapping[str, Any]] = {}

    def to_fields(self) -> dict[str, Any]:
        """The message's fields as a shallow dict (nested messages stay objects)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


#: Every registered message type by wire name. Filled at import time by ``@message``.
MESSAGE_TYPES: dict[str, type[Message]] = {}

M = TypeVar("M", bound=type[Message])


@dataclass_transform(frozen_default=True)
def message(name: str | None = None, *, local: bool = False) -> Callable[[M], M]:
    """Class decorator: make ``cls`` a frozen slotted dataclass and register it.

    ``local=True`` marks a message that may carry live objects and never crosses a
    process boundary.
    """

    def wrap(cls: M) -> M:
        dc = cast(M, dataclasses.dataclass(frozen=True, slots=True)(cls))
        wire = name or cls.__name__
        if wire in MESSAGE_TYPES and MESSAGE_TYPES[wire].__qualname__ != dc.__qualname__:
            raise TypeError(f"message wire name {wire!r} is already registered")
        dc.wire_name = wire
        dc.local = local
        MESSAGE_TYPES[wire] = dc
        return dc

    return wrap


# --------------------------------------------------------------------------------------
# The catalogue. Inputs are named ...Request / ...Event, outputs ...Reply / ...Msg.
# --------------------------------------------------------------------------------------

Outcome = Literal["ok", "error", "worker-lost", "cancelled", "timeout", "oom", "disk-full"]
LostCause = Literal["preempted", "suspended", "oom", "crash", "drained", "walltime", "unknown"]


@message()
class Ping(Message):
    """The heartbeat between connected processes (runtime/remote.py): one-way, its
    arrival is all it says."""

    token: int = 0


@message()
class Pong(Message):
    """Not sent by Corral itself: its heartbeats are one-way :class:`Ping` messages."""

    token: int = 0


#: The Corral release this code is: ``runtime.__version__``, and the package's version
#: (pyproject.toml reads it here: ``[tool.setuptools.dynamic]``; keep it a literal
#: string, which setuptools reads without importing this module). Defined here, at the
#: base, so the codec can name it in its advice about an incompatible peer: a refusal
#: then says which version the refusing side runs.
CORRAL_VERSION = "0.1.0"

#: The version of the protocol between a manager and its workers, clients and consoles,
#: sent in every ``Hello`` (``Hello.protocol``). A manager serves only peers of its own
#: version: it refuses any other at its Hello (a ``Refused`` frame carrying
#: :class:`ProtocolMismatch`, which a peer of any Corral version reads), before a worker
#: is registered or a client submits anything (docs/deployment.md, Upgrading Corral).
#: Bump it by one in the commit that changes what crosses between those processes in a
#: way the other side's code cannot read, or would misread: a field added to, removed
#: from, renamed or retyped in a message that crosses (runtime/messages.py, the Hello,
#: Welcome and ``Refused`` frames, the typed replies; the codec refuses a field it does
#: not know), a message type an older peer could be sent, a field whose meaning
#: changes, or an attribute of a process-local message that crosses pickled (a client's
#: ``SubmitGraphRequest``, a worker's ``RunTasks``). The first frames themselves must
#: stay readable by every version: ``Hello`` only gains fields with defaults (an older
#: manager refuses a field it does not know, which a newer worker reports as "upgrade
#: the manager first"), and ``Refused`` never changes. 0: a peer from before protocol
#: versions (its Hello has no ``protocol``).
#: Defined here, at the base, beside :data:`CORRAL_VERSION`, so that ``check``'s probe
#: (runtime/preflight.py) compares it; ``runtime.node.PROTOCOL_VERSION`` is the same.
#: tests/test_protocol_version.py fingerprints the messages' catalogue: a change to it
#: fails there until it is recorded, under a raised version or (a change no older peer
#: can notice, a process-local message that never crosses) under the same one.
PROTOCOL_VERSION = 3


#: The ``kind`` of the :class:`ErrorReply` a transport hands its reader in place of a
#: reply it could not decode (transport/ws.py): the ask fails with ``ProtocolError`` at
#: once instead of waiting out its timeout.
UNREADABLE_REPLY = "UnreadableReply"


@message()
class ErrorReply(Message):
    """A request could not be served. ``kind`` names the exception type."""

    kind: str
    text: str
    pickled: bytes | None = None


@message()
class Stop(Message):
    """Ask an actor or process to stop gracefully."""

    reason: str = ""


@message()
class SetPolicyRequest(Message):
    """Swap the policy of ``kind`` (priority, placement, retry, ...) at runtime.
    ``by``: who asks (a client's id, its name and a random tail, or a console's; "":
    not said), for the manager's log and the scheduler's story: the policy stays in force
    for every later client."""

    kind: str
    name: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    by: str = ""


@message()
class PolicyInfo(Message):
    """A policy in force: its kind, name, the names one may switch to, the parameters
    it was made with (``policies.param_values``: each as its value, what ``set_policy``
    takes back, one that is not plain data as its repr; empty for its defaults), and per
    name one may switch to its parameters with their defaults
    (``PolicyRegistry.defaults``: each default's repr, ``(required)`` for none)."""

    kind: str
    name: str
    available: tuple[str, ...] = ()
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    defaults: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)


@message()
class WorkerInfo(Message):
    """What a worker offers; sent when it registers and in status replies."""

    worker_id: str
    cores: int
    memory: int
    disk: int = 0
    pool: str = "default"
    address: str = ""
    deadline: float = 0.0  #: when its walltime ends, seconds since the epoch (0: never)
    #: the block it belongs to (``CORRAL_BLOCK_ID``, set by the provider that started
    #: it; "": unknown): the workers of a block go together, so none of them takes a
    #: leaving sibling's outputs
    block: str = ""
    #: the machine it runs on: its host name and, where the system has one, a piece of
    #: /etc/machine-id (or of the boot id), since every worker's ``address`` may be
    #: 127.0.0.1 ("": an older worker, not told; docs/memory.md#workers-sharing-a-machine)
    host: str = ""
    host_memory: int = 0  #: that machine's total memory, bytes (0: not told)
    #: its process id: workers in one process (``Cluster(workers=N)``) share its RSS,
    #: so their limits count once on their host (0: not told)
    pid: int = 0
    #: the file system its outputs go to: the ``st_dev`` of its disk directory (the
    #: spill directory; 0: not told, an older worker) and that file system's free bytes
    #: when it joined, so that workers sharing one are told of it
    #: (docs/files.md#workers-sharing-a-file-system)
    disk_device: int = 0
    disk_fs_free: int = 0
    #: its ``disk`` is the free-space default (no ``--disk``): the scheduler divides
    #: that file system's free space among the workers on it that took the default,
    #: and places within this worker's share (docs/files.md#workers-sharing-a-file-system)
    disk_auto: bool = False
    #: the CPUs of its machine it may use (``os.sched_getaffinity``, else
    #: ``os.cpu_count()``; 0: not told, an older worker): the ``cores`` of one machine's
    #: workers are added up against it, a warning past it (docs/deployment.md)
    host_cpus: int = 0
    #: its spill fence is on: it writes outputs to disk past it, so an output copied off
    #: a leaving or drained worker needs room in its memory only to land
    #: (docs/memory.md#outputs-copied-off-a-worker-that-goes; False: off, or not told)
    spills: bool = False
    #: where it runs its tasks: ``"thread"`` (threads of its own process) or
    #: ``"process"`` (task processes it starts: a crash ends the task's process, not
    #: the worker), its ``MemoryConfig.execution`` ("thread" also for an older worker,
    #: not told)
    execution: str = "thread"
    #: the accelerator it is pinned to: its ``CUDA_VISIBLE_DEVICES`` when it started,
    #: else the first of ``actors.providers.ACCELERATOR_VARIABLES`` set ("": none, or
    #: not told; a pool's ``accelerators``, the worker's ``--accelerator``)
    accelerator: str = ""


@message()
class WorkerMemoryReport(Message):
    """Worker -> scheduler: its memory and disk state, sent when it starts or stops
    throttling, when its bytes on disk change (a spill, a write, a drop) or its disk's
    free space moves, and when a cancelled task's thread was abandoned or holds its
    slot (``held``). ``throttle_at``, ``limit`` and ``terminate_at`` are bytes."""

    worker_id: str
    throttled: bool
    rss: int
    throttle_at: int
    limit: int
    memory_bytes: int = 0  #: outputs held in memory
    spilled_bytes: int = 0  #: outputs on disk now (spill files and file outputs)
    spilled_total: int = 0  #: bytes ever spilled
    abandoned: int = 0  #: threads still running a cancelled task (thread execution)
    #: disk left for outputs: its ``--disk`` limit less ``disk_used``, or less if the
    #: file system holding them has less free (None: not measured)
    disk_free: int | None = None
    #: every byte on its disk: ``spilled_bytes``, checkpoint files (and room reserved
    #: for one being written or copied) and the file copies under way
    disk_used: int = 0
    #: the worker's floor (its RSS idle after a trim, holding no output in memory) when it
    #: is at or past its resume mark, which moved up over it
    #: (docs/memory.md#the-floor-memory-that-is-not-outputs), with ``throttle_at`` the
    #: fence it throttles at now; 0: the configured marks hold
    floor: int = 0
    #: of ``spilled_bytes``, the bytes of the file outputs it holds (the rest are spill
    #: files)
    file_bytes: int = 0
    #: the highest RSS it sampled past its terminate fence while its tasks run in
    #: threads, which that fence cannot kill (0: never past it, or ``process``
    #: execution): the scheduler warns of it in ``status()["warnings"]``
    past_peak: int = 0
    #: threads holding their slot with a try that was stopped (timed out or cancelled)
    #: but could not be, as many being abandoned already as it has threads (thread
    #: execution): the scheduler counts these slots busy until the calls return
    held: int = 0
    #: with ``floor``, the warning the worker logged of it (what to do; "": none), which
    #: the scheduler shows in ``status()["warnings"]``
    floor_warning: str = ""
    #: spills stopped because its disk had no room (its --disk limit, or the file system
    #: full: ENOSPC) since it started, when the latest was (seconds since the epoch),
    #: why (the limit, or the OSError) and its spill directory: the scheduler shows it in
    #: ``status()["warnings"]`` and names it in ``MemoryStalled``
    spill_refused: int = 0
    spill_refused_at: float = 0.0
    spill_refused_why: str = ""
    spill_dir: str = ""
    #: its terminate fence, bytes (``terminate`` of its ``memory_options`` times
    #: ``limit``); None: turned off (``terminate = "off"``), or a report that does not
    #: tell it. The client compares ``rss`` with it (``limit`` when None) to say whether
    #: a worker past its limit is still high
    terminate_at: int | None = None


@message()
class TaskRecord(Message):
    """One task as seen by the scheduler, for status queries and the console."""

    key: str
    state: str
    category: str
    worker: str | None = None
    tries: int = 0  #: the tries made: those ended, and the one under way while processing
    client: str = ""  #: the name of the client whose submission brought it ("": not known)
    pool: str | None = None  #: the pool it was submitted to (None: any pool)
    #: why an erred or cancelled task is so: its error's ``Type: first line of its
    #: text``, at most 200 characters (``actors.scheduler_records.error_line``); ""
    #: for the others
    error: str = ""


@message()
class TryRecord(Message):
    """One attempt at running a task."""

    key: str
    worker: str
    start: float
    stop: float
    outcome: Outcome
    cause: str | None = None
    #: when its task became ready for this try (entered ``queued``), on the scheduler's
    #: clock: the try waited from then until it was sent, in ``worker``'s pool. None for
    #: a speculative copy, also one that became the task's try (it started while its
    #: task ran elsewhere: no wait of its own)
    queued: float | None = None
    #: seconds it ran, when known otherwise than from ``start`` and ``stop``: 0.0 for a
    #: try lost with a worker that said, as it left, that the task was not executing
    #: (queued behind others, fetching inputs: it never started), or that had said
    #: other tries filled all its threads (it waited in the queue; not a crash of its
    #: doing: ``TaskState.crashes``). None: ``stop -
    #: start`` (for ``worker-lost``: from being sent to the loss)
    ran: float | None = None


# --------------------------------------------------------------------------------------
# Cluster protocol between the actors of one cluster. These carry live objects (task
# nodes, results, exceptions, actor references), so they are ``local`` (the codec
# refuses them); between processes runtime/remote.py sends each as a ``PickledMsg``,
# accepted only from authenticated peers.
# --------------------------------------------------------------------------------------


@message(local=True)
class SubmitGraphRequest(Message):
    """Client -> manager: run ``graph`` and hand back ``keys``. Reply:
    :class:`SubmitReply`."""

    graph: Any
    keys: tuple[Any, ...]
    client: str
    priority: float = 0
    retries: int = 0
    resources: dict[str, float] | None = None
    pool: str | None = None
    timeout: float | None = None  #: seconds each try may execute (None: no limit)
    #: count how the graph's tasks move, for :class:`ProgressQuery` asks of its run
    #: (dask's callbacks active around the compute: ``runtime/progress.py``)
    progress: bool = False


@message(local=True)
class SubmitRoleGraphRequest(SubmitGraphRequest):
    """Gateway -> manager, in the manager's process: a :class:`SubmitGraphRequest` as it
    came from a connection with the submit token (``runtime.node._Door`` makes it), so
    that the manager holds it to ``[scheduler] submit_max_priority``. Never sent by a
    client: the gateway lets the submit role send only :class:`SubmitGraphRequest`."""


@message(local=True)
class SubmitSpecs(Message):
    """Manager -> scheduler: validated task specs and the keys clients want. ``specs``:
    the graph as a tuple of :class:`runtime.graph.SpecPiece` in dependency order
    (:func:`runtime.graph.in_pieces`); the scheduler takes in one piece per turn, so
    other messages go between the pieces of a large graph."""

    run: str
    specs: Any
    wanted: tuple[Any, ...]
    #: ``(pool, why)``: the pools the tasks name that are not configured, each with
    #: what to say of it (``Manager.not_configured``). Each new task of one that no
    #: worker has joined says so in its story; asked (not posted), the scheduler
    #: answers which of these pools no worker has joined
    unconfigured: tuple[tuple[str, str], ...] = ()
    #: the keys the submitting client (``client``) wanted already: once the graph is
    #: in, the scheduler says where each stands (``KeyTaken``, after what it says again)
    echo: tuple[Any, ...] = ()
    client: str = ""
    #: ``(resource, amount)``: what the first task of no pool asks that no configured
    #: pool's worker has (``runtime.graph.Unplaced.asks``); asked, the scheduler answers
    #: whether a connected worker has it
    unplaced: tuple[tuple[str, float], ...] = ()
    #: the submission's ``SubmitGraphRequest.progress``: the scheduler counts its tasks
    progress: bool = False


@message()
class SubmitReply(Message):
    """Manager -> client: a submission was taken as run ``run``. ``warnings``: what the
    client logs of it at once, each a sentence (tasks of a pool that is not configured
    and that no worker has joined, or a task of no pool that no worker configured or
    connected has enough for: they wait until one joins; annotations dask's
    optimization changed; a memory resource too small to be bytes). ``echoed``: the keys the
    client wanted already, of which a ``KeyTaken`` comes (``SubmitSpecs.echo``): what
    came of those before it is older than this submission."""

    run: str
    warnings: tuple[str, ...] = ()
    echoed: tuple[Any, ...] = ()


@message(local=True)
class RegisterWorker(Message):
    """Worker -> scheduler (through the manager): a worker is ready for tasks."""

    info: WorkerInfo
    ref: Any


@message(local=True)
class WorkerArrived(Message):
    """Scheduler -> alert monitor: a worker joined. The monitor evaluates its rules now
    (not at its next interval), so an alert of a fleet without workers
    (``CorralNoWorkers``) ends as the worker comes, not up to an interval later."""


@message()
class WorkerGone(Message):
    """A worker is lost (or left); ``cause`` is one of the worker-lost causes."""

    worker_id: str
    cause: str = "unknown"


@message()
class WorkerDropped(Message):
    """Gateway -> scheduler: ``worker_id``'s connection dropped without a goodbye, and
    its id is held for its rejoin. Until it rejoins (its ``RegisterWorker``) it is away:
    it takes no new work and its cores are not counted; if it does not rejoin, its
    ``WorkerGone`` follows and it is lost as of now, the drop, not the hold's end."""

    worker_id: str


@message()
class WorkersSuspended(Message):
    """Autoscaler -> scheduler: the batch system suspended the block of ``workers``
    (``suspended``: they take no new tasks, and one that goes silent meanwhile is lost
    as ``suspended``, a free loss), or resumed it (``suspended`` False)."""

    workers: tuple[str, ...]
    suspended: bool = True


@message()
class WorkersStopping(Message):
    """Autoscaler -> scheduler: the cluster shuts down and the autoscaler stops the
    blocks of ``workers``: however each goes now (a stop signal inside a Slurm job
    reads as a preemption to the worker), it leaves as ``shutdown``."""

    workers: tuple[str, ...]


@message(local=True)
class ClusterStopping(Message):
    """The cluster's stop -> alert monitor and scheduler (asked at once, the monitor's
    queued first): the cluster stops on purpose (a manager's orderly stop,
    ``Cluster.close``) and its workers are stopped next. The alerts hold still
    (``actors.alerts_state.Stopping``: the stop neither resolves nor fires one), and the
    run's tasks end (not finished: cancelled; a graph that comes later is cancelled as
    it comes), so that the workers leave as losses of nothing
    (``actors.scheduler_events.ClusterStops``). Answered once done."""


@message(local=True)
class PolicyNote(Message):
    """Autoscaler -> scheduler: the scaling policy failed (``problem``): a
    ``policy-error`` line in the cluster's story (``story -``), beside the scheduler's
    own policies' errors. The autoscaler counts it (its status's ``policy_errors``)."""

    problem: str


@message(local=True)
class ScalingSwapped(Message):
    """Manager -> scheduler: the autoscaler's scaling policy is now ``name`` with
    ``params`` (values), set by ``by`` (a client's or console's id): a ``policy`` line
    in the cluster's story and a row in the monitoring database, as the scheduler's own
    policies' swaps."""

    name: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    by: str = ""


@message()
class Leaving(Message):
    """Worker -> scheduler: I am about to go (``cause``: preempted, walltime, shutdown);
    give me no new tasks and say where my needed outputs should go
    (:class:`EvacuationPlan`)."""

    worker_id: str
    cause: str
    #: the tasks it executes now (``str`` of their keys): those it has in hand but
    #: not among these (queued behind them, fetching inputs) never started (None: not
    #: said; each counts as running since it was sent)
    executing: tuple[str, ...] | None = None
    #: seconds each of ``executing`` has executed (in its order; None: not said)
    executed: tuple[float, ...] | None = None


@message(local=True)
class EvacuationPlan(Message):
    """Scheduler -> a leaving worker: copy each output to a worker,
    ``(key, target worker, nbytes)``. One that comes while its copies are made is more
    of the plan (a target said it leaves meanwhile): those start too."""

    moves: tuple[Any, ...]


@message(local=True)
class Evacuated(Message):
    """Leaving worker -> scheduler, before its :class:`WorkerGone`: these outputs now
    have a copy on these workers, ``(key, worker)``."""

    worker_id: str
    moves: tuple[Any, ...]


@message(local=True)
class CheckpointSaved(Message):
    """Worker -> scheduler: running task ``key`` saved checkpoint number ``seq``, a
    file of ``nbytes`` on the worker's disk; ``data``: its bytes when it is small enough
    to travel (the scheduler may keep them: a copy off the worker), else None."""

    worker_id: str
    key: Any
    seq: int
    nbytes: int
    data: bytes | None


@message(local=True)
class OutputUnpicklable(Message):
    """Worker -> scheduler: the output of task ``key``, held here, cannot be pickled
    (``reason``: what pickling it raised), so it could not leave for ``to`` (a client
    through the manager, another worker's task): what asked for it got
    :class:`~runtime.errors.ResultNotPicklable`. The scheduler records it as the task's
    failure (its try ended ok, the output stays)."""

    worker_id: str
    key: Any
    reason: str
    to: str


@message(local=True)
class FetchCheckpoint(Message):
    """Scheduler -> worker (an ask): copy checkpoint ``seq`` of task ``key``
    (``nbytes``) from worker ``holder`` to your disk and keep it until told to drop it;
    the reply is :class:`CheckpointFetched`."""

    holder: str
    key: Any
    seq: int
    nbytes: int


@message(local=True)
class CheckpointFetched(Message):
    """The answer to :class:`FetchCheckpoint`: whether the copy is on disk (else why not)."""

    ok: bool
    reason: str = ""


@message(local=True)
class GetCheckpoint(Message):
    """Worker -> peer (an ask): serve your file of checkpoint ``seq`` of task ``key``;
    the reply is :class:`CheckpointStream`."""

    key: Any
    seq: int


@message(local=True)
class CheckpointStream(Message):
    """The answer to :class:`GetCheckpoint`: the stream to read the file from
    (:class:`~actors.transfer.StreamInfo`), or None when the peer has no such file;
    ``measuring``: not yet, the peer is measuring the file's sha256 (ask again)."""

    info: Any
    measuring: bool = False


@message(local=True)
class DropCheckpointsMsg(Message):
    """Scheduler -> worker: delete these checkpoint files, ``(key, seq)`` (``seq`` 0:
    every file of that task)."""

    items: tuple[Any, ...]


@message(local=True)
class CopyFrom(Message):
    """Leaving worker -> peer (an ask): fetch these outputs from me, ``(key, nbytes)``,
    and keep them; the reply is :class:`CopiesReply`."""

    holder: str
    keys: tuple[Any, ...]


@message(local=True)
class CopiesReply(Message):
    """The keys of a :class:`CopyFrom` the peer holds now."""

    got: tuple[Any, ...]


@message(local=True)
class RunTasks(Message):
    """Scheduler -> worker: run these ``ToRun`` tasks."""

    tasks: tuple[Any, ...]

    def for_wire(self, error: Callable[[BaseException], Any]) -> RunTasks:
        """The form that crosses a process boundary: each task's node pickled on its
        own, so one task that cannot be loaded on the worker fails alone. (``error``:
        see :meth:`TasksDone.for_wire`.)"""
        return RunTasks(tuple(t.with_pickled_node() for t in self.tasks))

    def split(self) -> list[RunTasks]:
        """One message per task: what a connection sends when the whole is more than
        one message may carry (``runtime.remote.Peer``)."""
        return [RunTasks((t,)) for t in self.tasks]


@message(local=True)
class TasksStarted(Message):
    """Worker -> scheduler: these tries have executed a while (``actors.worker_state.
    STARTED_AFTER`` seconds or more), ``(key, attempt, seconds executed)``, each said
    once: the scheduler counts a try's running time from its start, not from when it
    was sent (a try waiting in the worker's queue gets no speculative copy)."""

    worker_id: str
    started: tuple[Any, ...]


@message(local=True)
class TasksDone(Message):
    """Worker -> scheduler: how tries ended (``TaskResult`` objects), and ``rss``: the
    worker's RSS with its task processes as it sent them (its memory sample taken right
    after the tries ended, what its memory fences act on; 0: not measured). Each
    result's own ``rss`` is its task's: in ``process`` execution, its task process's."""

    worker_id: str
    results: tuple[Any, ...]
    rss: int = 0

    def for_wire(self, error: Callable[[BaseException], Any]) -> TasksDone:
        """The form that crosses a process boundary: the error of each result that
        carries one replaced by ``error(exc)`` (``runtime.remote.wire_error``: one
        that always loads on the other side), so the scheduler learns how every try
        ended. Results without an error (the usual case) are sent as they are, and so
        is anything that is not a result with an exception (the receiver refuses it)."""
        if all(not isinstance(getattr(r, "error", None), BaseException) for r in self.results):
            return self
        results = tuple(
            dataclasses.replace(r, error=error(r.error))
            if isinstance(getattr(r, "error", None), BaseException)
            else r
            for r in self.results
        )
        return TasksDone(self.worker_id, results, self.rss)

    def split(self) -> list[TasksDone]:
        """One message per try: what a connection sends when the whole is more than one
        message may carry (``runtime.remote.Peer``; a try whose report alone is too
        large fails with ``TaskErrorTooLarge``: ``runtime.node.unsendable_tries``)."""
        return [TasksDone(self.worker_id, (r,), self.rss) for r in self.results]


@message(local=True)
class DataMissing(Message):
    """Manager -> scheduler: asked for these outputs, ``worker`` did not have them (the
    scheduler forgets that replica and, if it was the last, makes the output again).
    ``reached`` false: the gather could not reach ``worker`` (gone, or its connection
    dropped): its replicas stand, and an output lost already is made again."""

    worker_id: str
    keys: tuple[Any, ...]
    reached: bool = True


@message(local=True)
class DataDelivered(Message):
    """Manager -> scheduler: gathers gave the values of these outputs to clients (an
    output that only clients hold then is made again, if lost, once needed)."""

    keys: tuple[Any, ...]


@message(local=True)
class ConfirmHolds(Message):
    """Scheduler -> worker that registered (rejoined over a new connection, or joined
    anew, maybe under an id it was declared lost with): reply (as a tell) with
    :class:`WorkerHolds`. Sent after everything the scheduler sent it before."""


@message(local=True)
class WorkerHolds(Message):
    """Worker -> scheduler, answering :class:`ConfirmHolds`: the tasks it has in hand
    (``active``: fetching, deferred, waiting for a thread or running) and the outputs it
    holds (``held``: ``(key, nbytes)`` pairs). Messages in flight when the old
    connection dropped are lost in either direction; with this the scheduler mends
    what it thinks the worker has."""

    worker_id: str
    active: tuple[Any, ...]
    held: tuple[Any, ...]


@message(local=True)
class CancelTasks(Message):
    """Scheduler -> worker: drop these tasks (queued ones never run, running ones'
    results are discarded)."""

    keys: tuple[Any, ...]


@message(local=True)
class DropKeys(Message):
    """Registry or scheduler -> worker: delete these outputs from the store."""

    keys: tuple[Any, ...]


#: bytes of values asked of one worker in one GetData: a reply is one message, and
#: messages have a size limit (the transport's max_message_bytes, 256 MiB by default)
GET_DATA_BYTES = 64 * 2**20


def get_data_batches(sized: Any, limit: int = GET_DATA_BYTES) -> list[tuple[Any, ...]]:
    """``(key, nbytes)`` pairs, in order, cut into groups of at most ``limit`` bytes (a
    larger key goes alone): the key tuples of the GetData requests to send."""
    out: list[tuple[Any, ...]] = []
    group: list[Any] = []
    total = 0
    for key, nbytes in sized:
        if group and total + nbytes > limit:
            out.append(tuple(group))
            group, total = [], 0
        group.append(key)
        total += nbytes
    if group:
        out.append(tuple(group))
    return out


@message(local=True)
class GetData(Message):
    """-> worker: reply with ``DataReply`` for the keys it holds. ``raw``: values as
    pickles (protocol 5), made once by the worker, for a requester in another process
    that only forwards them (the manager never decodes results). ``stream_over``: a
    value whose recorded size is at least this many bytes is not in the reply but
    opened as a stream (``DataReply.streams``) that the requester reads part by part
    (``actors/transfer.py``); 0, for a requester in the same process: never.
    ``files``: file outputs (``runtime/files.py``) come as streams of their bytes, to be
    copied (a peer fetching an input); otherwise as their ``File`` handles."""

    keys: tuple[Any, ...]
    raw: bool = False
    stream_over: int = 0
    files: bool = False


@message(local=True)
class DataReply(Message):
    """``streams``: ``actors.transfer.StreamInfo`` of the values sent as streams.
    ``nbytes``: the holder's recorded size of each value of ``data``, in its order
    (empty: not told), which a fetching worker records as it is instead of sizing each
    value again (``dask.sizeof`` of a pandas frame builds a Series per column)."""

    data: dict[Any, Any]
    missing: tuple[Any, ...] = ()
    raw: bool = False
    streams: tuple[Any, ...] = ()
    nbytes: tuple[int, ...] = ()


@message()
class ReadStream(Message):
    """-> worker (or -> manager, which relays it to ``worker``): bytes ``offset`` to
    ``offset + length`` of an open stream; reply ``StreamPart``."""

    stream: int
    offset: int
    length: int
    worker: str = ""


@message()
class StreamPart(Message):
    data: bytes


@message()
class CloseStream(Message):
    """-> worker (or -> manager, relayed to ``worker``): the reader gave up on a stream."""

    stream: int
    worker: str = ""


@message(local=True)
class FileFactsMsg(Message):
    """Scheduler -> registry: facts about outputs (``FileFact`` objects)."""

    facts: tuple[Any, ...]


@message(local=True)
class FilesReleasedMsg(Message):
    """Registry -> scheduler: these outputs were dropped from every worker."""

    keys: tuple[Any, ...]


@message(local=True)
class KeyUpdates(Message):
    """Scheduler -> manager -> client: wanted keys finished, failed or were cancelled
    (``KeyDone``/``KeyErred``/``KeyCancelled`` objects), or a submission of them by a
    client that wanted them already was taken in (``KeyTaken``), or a submission gave
    keys the cluster knows to other tasks (``KeysReused``, for its client alone)."""

    updates: tuple[Any, ...]

    def for_wire(self, error: Callable[[BaseException], Any]) -> KeyUpdates:
        """The form that crosses a process boundary (to a client in another process):
        each exception an update carries (a ``KeyErred``'s ``error`` and
        ``root_error``) replaced by ``error(exc)``, as :meth:`TasksDone.for_wire` does,
        so it arrives with its traceback and chain, or as a substitute that loads.

        Each distinct exception is made over once per message, however many updates
        share it: one failure spreads to every dependent, each a ``KeyErred`` whose
        ``root_error`` is that failure, and whose ``error`` (the scheduler's
        ``DependencyFailed``) has it as ``__cause__``. Such an ``error`` goes as a
        copy without its cause (a pickle of it is small and always loads), and the
        client sets the cause again from ``root_error`` (:func:`rejoin_causes`). So
        the failure travels once, and every dependent gets the same object, as in the
        scheduler. Updates without an exception are sent as they are."""
        made: dict[int, BaseException] = {}

        def once(exc: BaseException) -> BaseException:
            done = made.get(id(exc))
            if done is None:
                done = made[id(exc)] = error(exc)
            return done

        def wired(update: Any) -> Any:
            if not dataclasses.is_dataclass(update) or isinstance(update, type):
                return update
            root = getattr(update, "root_error", None)
            changes: dict[str, Any] = {}
            for f in dataclasses.fields(update):
                value = getattr(update, f.name)
                if not isinstance(value, BaseException):
                    continue
                if value is not root and root is not None and value.__cause__ is root:
                    changes[f.name] = bare_exception(value)
                else:
                    changes[f.name] = once(value)
            return dataclasses.replace(update, **changes) if changes else update

        updates = tuple(wired(u) for u in self.updates)
        same = all(a is b for a, b in zip(updates, self.updates, strict=True))
        return self if same else KeyUpdates(updates)


def bare_exception(exc: BaseException) -> BaseException:
    """A copy of ``exc`` without traceback, cause and context: the exception alone,
    even where a reducer pickles those (tblib's, which importing dask installs for the
    classes defined then)."""
    body = copy.copy(exc)
    body.__traceback__ = body.__cause__ = body.__context__ = None
    return body


def rejoin_causes(updates: tuple[Any, ...]) -> None:
    """Undo what :meth:`KeyUpdates.for_wire` left out, on arrival: an update's
    ``error`` that has no cause and is not its ``root_error`` gets that root error as
    its ``__cause__`` (a ``DependencyFailed`` and the failure it comes from)."""
    for update in updates:
        err, root = getattr(update, "error", None), getattr(update, "root_error", None)
        if (
            isinstance(err, BaseException)
            and isinstance(root, BaseException)
            and err is not root
            and err.__cause__ is None
        ):
            err.__cause__ = root


@message(local=True)
class ReleaseKeysRequest(Message):
    """Client -> manager -> scheduler: the client no longer wants these keys."""

    keys: tuple[Any, ...]
    client: str = ""


@message(local=True)
class CancelRequest(Message):
    """Client or console -> manager -> scheduler: cancel these keys. ``client``: the
    asking client (its cancel spares what other clients' keys need). ``spare`` (manager
    -> scheduler): the keys other clients hold; the scheduler then cancels only what none
    of them needs and answers the keys it spared."""

    keys: tuple[Any, ...]
    reason: str = "cancelled by request"
    client: str = ""
    spare: tuple[Any, ...] = ()


@message(local=True)
class OperatorCancel(Message):
    """Manager -> scheduler: the console's cancel of these keys, for every client that
    wants them. Answered with how many of ``keys`` were still to do (waiting, queued or
    running) and so were cancelled, each with everything that depends on it; finished
    or forgotten keys are not affected."""

    keys: tuple[Any, ...]
    reason: str


@message(local=True)
class GatherRequest(Message):
    """Client -> manager: the values of these finished keys (``raw``: as the workers'
    pickles, for a client in another process). ``files``: file outputs as streams of
    their bytes, which the client reads through the manager (a download)."""

    keys: tuple[Any, ...]
    raw: bool = False
    files: bool = False


@message()
class StatusRequest(Message):
    """-> manager: reply with the cluster's :class:`StatusReply` (the scheduler's status,
    with the file registry's and the autoscaler's folded in). Asked directly, the
    scheduler answers a dict of the scheduler's part of it (the fields of
    :class:`StatusReply` it fills), the registry a :class:`FilesStatus`, the autoscaler
    an :class:`AutoscalerStatus` and a worker a ``WorkerStatus``. ``categories``:
    False leaves the per-category statistics out (empty): the dashboard asks every
    second, and a run may have many thousands of categories. ``top_categories``: 0
    sends every category's statistics; ``n`` only the ``n`` with the most task time
    (tasks finished ok times their mean duration), then the most tasks (the console's
    ``status`` asks 20); ``StatusReply.categories_known`` says how many there are."""

    categories: bool = True
    top_categories: int = 0


@message()
class MetricsRequest(Message):
    """-> manager: reply with a :class:`MetricsReply`, the numbers ``GET /metrics``
    exposes (docs/monitoring.md). Asked directly, the scheduler answers a dict of its
    fields of the reply and the autoscaler a dict of ``blocks``. With ``details`` (the
    dashboard) the reply also has the latest failure groups with their tracebacks and
    the latest tries that ended; without, those stay empty. ``pools`` (manager ->
    scheduler): the configured pools, whose series stay while they have no task and no
    worker (another pool's go then)."""

    details: bool = False
    pools: tuple[str, ...] = ()


@message()
class UpcomingRequest(Message):
    """Autoscaler -> scheduler: reply with the next wave per pool (``"*"``: any pool),
    a dict of lists of the seconds until each task of it is expected to be ready,
    shortest first (``SchedulerState.upcoming``; at most ``most`` per pool). The next
    wave is the waiting tasks none of whose inputs waits: what a block requested now
    would be there for."""

    most: int = 1024


@message(local=True)
class DemandRequest(Message):
    """Autoscaler -> scheduler, in the manager's process: reply with a dict of what the
    autoscaler reads every tick, all from one turn of the scheduler (one view: tasks
    cannot move between two asks of it): ``queues`` (ready tasks per pool, ``"*"``:
    any pool), and the workers' ``processing`` (tasks in hand), ``draining``,
    ``retired``, ``leaving``, ``away``, ``walltime_draining`` and ``spent_draining`` as
    in the scheduler's status; and ``unfit``: per configured pool, the ready tasks it
    may run (its own; of no pool too, unless it is reserved) that ask for more cores,
    memory or disk than its configuration gives each of its workers
    (``SchedulerState.unfit_by_pool``): its blocks could never run them, so they are no
    demand for it."""


@message()
class PoolMetrics(Message):
    """One pool, from the scheduler's counters: ready tasks (``queue_depth``), how long
    the oldest of them has waited (seconds, 0 with none), wait quantiles over the latest
    waits served (``wait_quantiles``: quantile as text, e.g. ``"0.9"`` -> seconds),
    waits served and their sum (seconds), tasks running on its workers, its workers by
    state (idle, busy, draining, away: its connection dropped, its id held for its
    rejoin; its cores, RSS and throttle not counted) and those throttled, their RSS,
    bytes held in memory and spilled to disk now, and bytes ever spilled."""

    queue_depth: int = 0
    oldest_wait: float = 0.0
    wait_quantiles: dict[str, float] = dataclasses.field(default_factory=dict)
    waits: int = 0
    wait_sum: float = 0.0
    running: int = 0
    workers: dict[str, int] = dataclasses.field(default_factory=dict)
    throttled: int = 0
    rss_bytes: int = 0
    memory_bytes: int = 0
    spilled_bytes: int = 0
    spilled_total: int = 0
    #: of ``queue_depth``, the tasks held back after failed fetches (a backoff)
    held_back: int = 0
    #: retries held for their backoff (``RetryDecision.delay``): not ready, not in
    #: ``queue_depth``
    retry_held: int = 0
    #: 1 while the disk watchdog finds the pool stalled (``DiskStallInfo``), else 0
    disk_stalled: int = 0
    #: disk stalls the pool ever had (each one the watchdog declared)
    disk_stalls: int = 0
    #: 1 while the placement watchdog finds the pool stalled (``PlacementStallInfo``)
    placement_stalled: int = 0
    #: placement stalls the pool ever had (each one the watchdog declared)
    placement_stalls: int = 0
    #: the cores (threads) of its connected workers, draining ones too
    cores: int = 0
    #: of those, the cores its workers' tasks take (a task, or a speculative copy, a
    #: thread: at most a worker's cores), whether the worker drains or not
    cores_busy: int = 0
    #: the memory limits (``--memory``) of its connected workers, summed, as their RSS
    #: (``rss_bytes``): the dashboard's memory bar is one over the other
    memory_limit_bytes: int = 0
    #: its connected workers whose tasks run in threads and that went past their
    #: terminate fence (``WorkerMemoryReport.past_peak``): the fence could not kill
    workers_past_limit: int = 0
    #: seconds the oldest try sent to one of its workers and not known to execute (a
    #: worker says so after 0.5 s) has been there: queued behind others, fetching its
    #: inputs, or executing for under 0.5 s (0: none)
    worker_queue_oldest: float = 0.0
    #: seconds the try executing longest on its workers has executed (0: none said)
    longest_running: float = 0.0


@message()
class WorkerDiskMetrics(Message):
    """One connected worker's disk, from the scheduler's state: its ``pool``, its disk
    limit (``disk``, 0: not counted), the bytes on it that placement counts used
    (``used``: outputs, checkpoint files and copies under way, or more when its file
    system has less free) and its disk left as it last reported (``free``: the limit
    less ``used``, or less when the file system has less; None: no limit, not
    measured)."""

    pool: str
    disk: int = 0
    used: int = 0
    free: int | None = None


@message()
class CategoryMetrics(Message):
    """One task category: tries finished ok, their seconds (sum), the output bytes they
    produced and the input bytes they read, the highest worker RSS seen while one ran."""

    finished: int = 0
    duration_sum: float = 0.0
    output_bytes: int = 0
    input_bytes: int = 0
    peak_rss: int = 0


@message()
class FailureCount(Message):
    """Tries of ``category`` that ended with ``outcome`` (error, oom, worker-lost,
    timeout) for ``cause`` (the exception's type, or why the worker was lost)."""

    category: str
    outcome: str
    cause: str
    n: int


@message()
class PolicyErrorCount(Message):
    """The policy errors of the ``kind`` policy named ``policy`` since the manager
    started (it raised, answered out of bounds, or was slow), and of them its slow turns
    and spells (``slow``; a scaling policy is not timed: 0): ``corral_policy_errors_total``
    and ``corral_policy_slow_total`` (``policies.problems.PolicyProblems.counts``)."""

    kind: str
    policy: str
    errors: int
    slow: int = 0


@message()
class FailureGroupInfo(Message):
    """The failed tries of one task ``category`` for one ``cause`` (the exception's type,
    or why the worker was lost): ``n`` of them, and the latest one's task ``key``,
    ``worker``, ``outcome``, seconds since it failed (``ago``), its ``error``
    (``Type: message``) and ``traceback`` text (empty when there is none, as for a lost
    worker); of how many ``tasks`` the ``n`` tries were, and how many of those tasks
    then erred (``erred``; the others finished after a retry, or are still on their
    way). For the tasks that erred with no try of their own (outcome ``not-run``), ``n``
    counts tasks, and ``tasks`` and ``erred`` are ``n``."""

    category: str
    cause: str
    n: int
    key: str
    worker: str
    outcome: str
    ago: float
    error: str
    traceback: str = ""
    tasks: int = 0
    erred: int = 0


@message()
class RecentTry(Message):
    """A try that ended: its task ``key`` and ``category``, the ``worker``, how it ended
    (``outcome``, and ``cause`` for a lost worker), how long it ran and how many seconds
    ago it ended (``ago``), and its number among the tries that ended (``n``, from 1: the
    dashboard's feed sends a page only the tries after those it sent)."""

    key: str
    category: str
    worker: str
    outcome: str
    duration: float
    ago: float
    cause: str = ""
    n: int = 0


@message()
class BlockMetrics(Message):
    """One pool, from the autoscaler's core: its blocks by state (``requested``: asked of
    the provider, no answer yet; then the provider's words, e.g. pending, running), the
    age of the oldest block not running yet (seconds, 0 with none), its target and the
    policy's latest proposal; its size (``slots_per_block``: tasks a block runs at once,
    ``workers_per_block``), its ``max_blocks`` (0: not configured), how many of its
    blocks ever failed or ended unasked (``failed``) and how many were ever found not
    running by the pool's provisioning timeout and replaced (``stuck``); ``suspended``:
    1 while the pool asks for no block until an operator resumes it (its batch system
    refused too many submissions, or its blocks kept ending), else 0; ``last_failure``:
    the latest of its blocks that failed or ended unasked and why (its detail), "" with
    none; ``submit_failures``: its failed submissions in a row, refused or not answered
    (0 once one goes through); ``suspended_why``: while ``suspended``, why (the batch
    system's latest refusal, or the latest of the blocks that kept ending), else "";
    ``ends``: its blocks' ends and requeues ever, by cause (``preempted``, ``walltime``,
    ``drained``, ...: the causes the autoscaler lists them with); ``taken_back``: its
    blocks scaled in and taken back before they left (the pool wanted blocks again:
    their workers were un-drained instead of new blocks started), ever;
    ``taken_back_by_operator``: its drained blocks counted again because an operator
    took a worker of theirs back (the console's ``undrain``), ever."""

    states: dict[str, int] = dataclasses.field(default_factory=dict)
    oldest_pending: float = 0.0
    target: int = 0
    desired: int = 0
    slots_per_block: int = 0
    max_blocks: int = 0
    workers_per_block: int = 0
    failed: int = 0
    stuck: int = 0
    suspended: int = 0
    last_failure: str = ""
    submit_failures: int = 0
    suspended_why: str = ""
    ends: dict[str, int] = dataclasses.field(default_factory=dict)
    taken_back: int = 0
    taken_back_by_operator: int = 0


@message()
class ReplicasStatus(Message):
    """Temporary replicas of outputs (docs/files.md#replicas), from the scheduler's
    counters: replicas ``made`` and the bytes they copied, copies that ``failed``,
    ``recomputes_avoided`` (a worker holding an output was lost and only replicas kept
    it), and the outputs that have replicas now (``outputs``)."""

    made: int = 0
    copied_bytes: int = 0
    failed: int = 0
    recomputes_avoided: int = 0
    outputs: int = 0


@message()
class WorkerStorage(Message):
    """One worker's storage, in :class:`StorageStatus`: its disk limit (``disk``, 0: not
    counted), bytes of outputs on disk now and the most it reported (``disk_used``,
    ``disk_peak``), its free disk as last reported (``disk_free``, None: not measured),
    bytes of outputs in memory (``memory_bytes``), bytes copied to it and from it
    (``bytes_in``, ``bytes_out``) and its outputs recovered once it was lost
    (``recoveries``)."""

    disk: int = 0
    disk_used: int = 0
    disk_peak: int = 0
    disk_free: int | None = None
    memory_bytes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    recoveries: int = 0


@message()
class StorageStatus(Message):
    """Storage over time (docs/files.md, "Storage over time"), from the scheduler's
    counters: outputs copied between workers per kind (``fetch``, ``replica``,
    ``evacuation``) and their bytes, outputs recovered per way (``recomputed``,
    ``replica``), and per worker its :class:`WorkerStorage` (workers that left keep
    their counts, without a disk)."""

    transfers: dict[str, int] = dataclasses.field(default_factory=dict)
    transfer_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    recoveries: dict[str, int] = dataclasses.field(default_factory=dict)
    workers: dict[str, WorkerStorage] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, each worker's as a dict too."""
        out = self.to_fields()
        out["workers"] = {w: s.to_fields() for w, s in self.workers.items()}
        return out


@message()
class MetricsReply(Message):
    """The manager's answer to :class:`MetricsRequest`: per pool (``"*"``: tasks any
    pool may run), per category, failures by cause, tasks by state, per worker its disk
    (``disks``), and per pool the
    autoscaler's blocks (empty without an autoscaler, or when it did not answer in
    time: ``autoscaler_busy``), and per policy its errors (``policy_errors``). Asked
    with ``details``, besides: failures grouped by
    category and cause with the latest of each (``failure_groups``, the most recent
    groups first, at most ``MAX_FAILURE_GROUPS_SHOWN``; ``failure_groups_total``
    counts them all), the same of the tries lost with their worker (preempted, its
    walltime, drained, ...) and retried free, not failures (``free_groups``,
    ``free_groups_total``) and the latest tries that ended (``recent_tries``, oldest
    first)."""

    pools: dict[str, PoolMetrics] = dataclasses.field(default_factory=dict)
    categories: dict[str, CategoryMetrics] = dataclasses.field(default_factory=dict)
    failures: tuple[FailureCount, ...] = ()
    tasks_by_state: dict[str, int] = dataclasses.field(default_factory=dict)
    tasks_created: int = 0
    workers: int = 0  #: connected (not away: its connection dropped, its id held)
    #: per connected worker, its disk (``corral_worker_disk_*``)
    disks: dict[str, WorkerDiskMetrics] = dataclasses.field(default_factory=dict)
    replicas: ReplicasStatus = dataclasses.field(default_factory=ReplicasStatus)
    #: speculative copies (docs/files.md#speculative-copies): ``started``, and those
    #: that ended ``won``, ``lost`` or ``failed``
    speculative: dict[str, int] = dataclasses.field(default_factory=dict)
    blocks: dict[str, BlockMetrics] = dataclasses.field(default_factory=dict)
    autoscaler_busy: bool = False
    #: per policy in force, and per policy that had errors: its errors, the scheduler's
    #: kinds' and (from the autoscaler, left out with ``blocks``) the scaling policy's
    policy_errors: tuple[PolicyErrorCount, ...] = ()
    failure_groups: tuple[FailureGroupInfo, ...] = ()
    failure_groups_total: int = 0
    free_groups: tuple[FailureGroupInfo, ...] = ()
    free_groups_total: int = 0
    recent_tries: tuple[RecentTry, ...] = ()


#: the most failure groups a detailed MetricsReply carries (the most recent ones)
MAX_FAILURE_GROUPS_SHOWN = 50


@message()
class AlertInfo(Message):
    """One alert: a rule's instance for one label set (e.g. one pool). ``state``:
    ``pending`` (the condition holds, not for ``for`` yet), ``firing`` or ``resolved``
    (it fired and the condition no longer holds). ``labels``: the rule's labels and the
    instance's (``alertname``, ``pool``, ``team``, ``priority``); ``annotations``: the
    rule's (description, summary, dashboard URL). ``value``: the expression's value at
    the latest evaluation where it held: for a resolved alert, the last value before it
    stopped holding (past its threshold; as Prometheus keeps a resolved alert's value and
    sends it to Alertmanager). Times are wall-clock seconds: ``active_since`` (the condition
    began to hold), ``fired_at``, ``resolved_at``. ``fields``: the numbers a notification
    carries (for a queue rule ``max_queue_size``, ``max_queue_time_mins``,
    ``queue_size_threshold``, ``queue_time_threshold``, ``threshold_breached``)."""

    name: str
    state: Literal["pending", "firing", "resolved"]
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    value: float = 0.0
    active_since: float | None = None
    fired_at: float | None = None
    resolved_at: float | None = None
    fields: dict[str, float] = dataclasses.field(default_factory=dict)


@message()
class AuditInfo(Message):
    """One remediation audit entry of the alert monitor (docs/monitoring.md,
    "Remediation audit"): ``line`` as the log says it, and the same as data: ``rule``
    and the alert's ``labels`` it came from (empty: not known), ``pool``, ``action``
    (``scale-out``, ``no-scale-out``, ``restore``, ``restore-left``,
    ``restore-later``, ``scale-failed``: ``actors.alerts_state.AUDIT_ACTIONS``), the
    pool's block target before (``before``) and the one set (``after``; None where
    the entry names none), ``why``; ``time``: wall-clock seconds. ``seq``: its number
    in the monitor, from 1: a reader that kept the last number it read knows which are
    new, and which it missed (past the latest ones kept)."""

    seq: int
    time: float
    line: str
    rule: str = ""
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    pool: str = ""
    action: str = ""
    before: int | None = None
    after: int | None = None
    why: str = ""


@message()
class AlertsRequest(Message):
    """-> manager: reply with an :class:`AlertsReply` (the alert monitor's alerts and
    rules; empty when the manager runs none)."""


@message()
class AlertsReply(Message):
    """The alerts now pending, firing or recently resolved; the rules in force (each as
    its data: name, expr, for, labels, ...); the latest remediation audit lines, as
    text (with their UTC time) and as data (``actions``)."""

    alerts: tuple[AlertInfo, ...] = ()
    rules: tuple[dict[str, Any], ...] = ()
    audit: tuple[str, ...] = ()
    #: the same latest audit entries as data (the monitoring database's ``actions``)
    actions: tuple[AuditInfo, ...] = ()


@message(local=True)
class MonitorFeed(Message):
    """-> scheduler: up to ``limit`` monitoring entries numbered ``since`` and on
    (``SchedulerState.feed_since``; the ones before ``since`` count as read); the reply
    is a :class:`MonitorFeedReply`. Asked by the monitoring database's recorder
    (runtime/monitordb.py) in the same process: the feed has that one reader."""

    since: int = 0
    limit: int = 10_000


@message(local=True)
class MonitorFeedReply(Message):
    """The scheduler's monitoring entries (``(now, records)`` per handled event, ``now``
    on its clock; the records may carry keys and errors as ErrorRecords), the number to ask from
    next, how many entries were gone before they were read (``lost``: a gap), ``wall``:
    what to add to the scheduler's clock for Unix time, per worker its latest ``(rss,
    bytes held in memory, bytes on disk now, free disk or None, disk limit or 0)``, and
    how many records the feed holds
    unread at most (``capacity``)."""

    events: tuple[tuple[Any, ...], ...] = ()
    next: int = 0
    lost: int = 0
    wall: float = 0.0
    workers: dict[str, tuple[int, int, int, int | None, int]] = dataclasses.field(
        default_factory=dict
    )
    capacity: int = 0


@message()
class AlertRuleAdd(Message):
    """-> manager -> alert monitor (admin): add the alert rule ``rule`` (its data, as
    in a ``[[alerts]]`` table of the manager's configuration), or replace the rule of
    the same name. Answer: the rule as the monitor holds it, with ``warnings`` (texts)
    when a ``pool="X"`` of its expression names no pool of the cluster's, and with
    ``replaced`` when it replaced a rule (``rule``, ``dropped_labels``: name -> value,
    ``dropped_annotations``: names; the old rule's labels and annotations the new one
    does not give, which are gone); a bad rule raises
    :class:`~runtime.errors.AlertConfigError`."""

    rule: dict[str, Any]


@message()
class AlertRuleRemove(Message):
    """-> manager -> alert monitor (admin): remove the alert rule called ``name`` (its
    alerts end). Answer: the names of the rules left."""

    name: str


@message()
class PoolLife(Message):
    """How long a pool's workers live: ``lives`` counted (those that left, and those
    alive, censored), ``deaths`` among them (preempted, crashed, lost), the Kaplan-Meier
    ``median`` in seconds (None: not known yet) and ``survive_1h``, the estimated
    probability that a worker lives past an hour (None: not known, no worker of the
    pool seen living an hour; Kaplan-Meier says nothing past the longest life)."""

    lives: int = 0
    deaths: int = 0
    median: float | None = None
    survive_1h: float | None = None


@message()
class CategoryStatus(Message):
    """What the scheduler learned about one task category: tasks finished ok, tries
    that raised, were lost with their worker or killed for memory; seconds; output and
    input bytes; the highest worker RSS seen while one ran, the largest RSS growth; the
    largest output and the tries whose output did not fit on disk."""

    count: int = 0
    errors: int = 0
    lost: int = 0
    oom: int = 0
    mean_duration: float = 0.0
    max_duration: float = 0.0
    p90_duration: float = 0.0  #: over its latest ok tries
    total_nbytes: int = 0
    consumed_nbytes: int = 0
    peak_rss: int = 0
    max_rss_growth: int = 0  #: the largest ever
    #: the largest of its latest ``RISE_WINDOW`` (16) rises: what memory admission uses
    rss_rise: int = 0
    max_nbytes: int = 0  #: largest output (ok tries and disk-full ones)
    disk_full: int = 0  #: tries whose output did not fit on their worker's disk


@message()
class FilesStatus(Message):
    """The file registry's summary: outputs it tracks, per state, bytes stored per
    worker, the outputs (and their bytes over all replicas) dropped so far, and the file
    outputs on workers now (``runtime/files.py``) and their bytes over all replicas."""

    files: int = 0
    states: dict[str, int] = dataclasses.field(default_factory=dict)
    stored_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    released: int = 0
    released_bytes: int = 0
    file_outputs: int = 0
    file_bytes: int = 0


@message()
class BlockEndInfo(Message):
    """How a block ended, or was requeued (``state`` ``requeued``: the batch system runs
    the same job again as its next incarnation): its final ``state``, the ``cause`` its
    workers were reported gone with (``preempted``, ``walltime``, ``drained``, ``crash``,
    ``unknown``), whether it spent the replacement budget (``charged``), when (``at``,
    Unix time), which run of it ended (``incarnation``, from 1) and the provider's words
    on it (``detail``: for a Slurm block, its state, exit code, the head and tail of its
    stderr and that file's path; at most 4000 characters)."""

    block: str
    pool: str
    state: str
    cause: str
    charged: bool
    at: float
    incarnation: int = 1
    detail: str = ""


@message()
class BatchErrorInfo(Message):
    """The batch system's latest failure for a pool: the ``command`` (``sbatch
    --parsable``, ``squeue``, ...) and its ``error`` (what it printed and what to do),
    ``at`` (Unix time), ``suspended`` (the pool asks for no block until an operator
    resumes it: console ``resume POOL``), ``retry_in`` (seconds until it asks again,
    None: not backing off), ``failures`` (failures in a row: submissions, or those
    seen while watching the blocks), ``asking`` (a submission of the pool is under way
    now), ``since`` (Unix time of the first of those failures in a row: when the
    outage began; 0: not known) and ``operation`` (what failed, which says when it is
    tried again: ``submit``, a block asked for; ``poll``, the blocks' states asked for
    (``squeue``); ``cancel``, a block stopped)."""

    command: str
    error: str
    at: float
    suspended: bool = False
    retry_in: float | None = None
    failures: int = 0
    asking: bool = False
    since: float = 0.0
    operation: str = "submit"


@message()
class AutoscalerStatus(Message):
    """The autoscaler's state: target and desired blocks per pool, live blocks and
    their state (their pools and workers: ``block_pools``, ``block_workers``), the
    ones retiring, blocks ended so far, pools it gave up on (their workers kept
    ending), its policy and the policy's refused answers; per live block
    its incarnation when the batch system requeued it (``incarnations``) and the
    provider's words (``details``); the latest ends (``ends``); the unasked ends
    that spent the replacement budget in its window (``budget_spent``, summed, and
    ``budget_by_pool``; each pool gives up past ``budget``); per pool the batch
    system's latest error (``batch_errors``), the pools paused until resumed
    (``paused``) and the latest of its blocks that failed or ended unasked, and why
    (``last_failures``: what a pool that gave up last saw)."""

    targets: dict[str, int] = dataclasses.field(default_factory=dict)
    desired: dict[str, int] = dataclasses.field(default_factory=dict)
    blocks: dict[str, str] = dataclasses.field(default_factory=dict)
    retiring: tuple[str, ...] = ()
    ended: int = 0
    gave_up: tuple[str, ...] = ()
    policy: str = ""
    #: the parameters the policy was given (``policies.param_values``, as
    #: ``PolicyInfo.params``: each as its value; none: its defaults)
    policy_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    policy_errors: int = 0
    #: per pool: its policy errors, and the latest as text (what it raised or answered)
    policy_errors_by: dict[str, int] = dataclasses.field(default_factory=dict)
    policy_problems: dict[str, str] = dataclasses.field(default_factory=dict)
    #: per pool whose latest ask of the policy failed (it keeps its last good proposal
    #: meanwhile), that failure as text; a pool leaves it once the policy answers again
    policy_failing: dict[str, str] = dataclasses.field(default_factory=dict)
    incarnations: dict[str, int] = dataclasses.field(default_factory=dict)
    details: dict[str, str] = dataclasses.field(default_factory=dict)
    ends: tuple[BlockEndInfo, ...] = ()
    budget_spent: int = 0
    budget: int = 0
    #: per pool with unasked ends in the window, how many (each pool has its own budget)
    budget_by_pool: dict[str, int] = dataclasses.field(default_factory=dict)
    batch_errors: dict[str, BatchErrorInfo] = dataclasses.field(default_factory=dict)
    paused: tuple[str, ...] = ()
    #: per live block, its pool and its workers' ids
    block_pools: dict[str, str] = dataclasses.field(default_factory=dict)
    block_workers: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    last_failures: dict[str, str] = dataclasses.field(default_factory=dict)


#: The pool key of the tasks any pool may run (those submitted without ``pool=``): the
#: scheduler keys its per-pool counters and stalls by :func:`pool_key`, and the messages
#: below, the metrics (``pool="*"``), the console and the dashboard carry it.
ANY_POOL = "*"


def pool_key(pool: str | None) -> str:
    """The key a task's pool (``spec.pool``) is counted under: :data:`ANY_POOL` for None,
    the name otherwise (no pool is named ``""`` or ``"*"``: every entry refuses them,
    :func:`pool_name_problem`)."""
    return ANY_POOL if pool is None else pool


def pool_of_key(key: str) -> str | None:
    """The pool a pool key stands for: None (any pool) for :data:`ANY_POOL`, the pool's
    name otherwise; ``pool_of_key(pool_key(p)) == p`` for every pool."""
    return None if key == ANY_POOL else key


def pool_name_problem(name: object) -> str:
    """Why ``name`` cannot be a pool's name, or ``""`` when it can: a pool's name is a
    string, not empty nor blank, and not :data:`ANY_POOL`, the key the tasks of any
    pool are counted under. Each entry that takes a pool's name (``submit(pool=)``, a
    ``[pools.NAME]`` table, a worker's ``--pool``, ``Cluster(pool=)``, ``scale``, a retry
    policy's move or ``fallback``, an alert's scale-out) refuses it with its own error,
    saying this and what to give instead."""
    if not isinstance(name, str):
        return f"a pool's name is a string, not {type(name).__name__}"
    if not name.strip():
        return "a pool's name is not empty nor blank"
    if name == ANY_POOL:
        return (
            f"{ANY_POOL!r} is not a pool's name: it is the key of any pool, under which the "
            "tasks submitted without pool= are counted"
        )
    return ""


def pool_name(pool: str | None) -> str:
    """A pool, or a pool key, for people: any pool (None, or its key :data:`ANY_POOL`)
    is ``any``, as in ``stalled in pool any``."""
    return "any" if pool is None or pool == ANY_POOL else pool


@message()
class DiskStallInfo(Message):
    """A disk stall of one pool (``"*"``: the tasks any pool may run), as the
    scheduler's disk watchdog declared it: every worker of the pool (``workers``) ran
    nothing for ``stall_timeout`` seconds while ready tasks of the pool waited for disk
    (docs/files.md#disks). ``since``: when it was declared (the scheduler's clock);
    ``stalled_for``: seconds since then, at the status. ``disk_used`` and ``disk``: the
    bytes those workers' disks use and their limits, summed; ``holding``: what fills
    them that the scheduler knows by category, ``(category, bytes, outputs)`` of the
    file outputs on them (a copy on each holder counts), largest first; ``foreign``:
    of ``disk_used``, what their file systems lack beyond what the workers count as
    their own (other programs' files there); the rest of ``disk_used`` is spilled
    outputs, checkpoint files and copies under way.
    ``waiting``: the pool's ready tasks by category, ``(category, tasks)``, most
    first, ``queued`` of them in all."""

    pool: str
    since: float
    workers: tuple[str, ...] = ()
    disk_used: int = 0
    disk: int = 0
    #: ``(category, bytes, outputs)`` each (``Any``: the codec's fast path types no
    #: fixed-length tuple, rule 1)
    holding: tuple[Any, ...] = ()
    waiting: tuple[Any, ...] = ()  #: ``(category, tasks)`` each
    queued: int = 0
    stalled_for: float = 0.0
    foreign: int = 0


@message()
class PlacementStallInfo(Message):
    """A placement stall of one pool (``"*"``: the tasks any pool may run), as the
    scheduler's placement watchdog declared it: the pool had ready tasks (``queued``)
    and an idle connected worker, and no task of it was placed or finished for
    ``stall_timeout`` seconds, nor did its ready tasks wait for disk (that is a
    ``DiskStallInfo``). ``since``: when its last task was placed or finished, or its
    first task became ready (the scheduler's clock); ``stalled_for``: seconds since
    then, at the status. ``workers``: its connected workers; ``busy``: how many of them
    run tasks; ``idle``: why each of the others takes nothing, ``(worker, reason,
    detail)``, the reason one of ``PLACEMENT_STALL_REASONS``; ``head``: the first ready
    task in priority, whose story says more (``story KEY``)."""

    pool: str
    since: float
    queued: int = 0
    workers: tuple[str, ...] = ()
    busy: int = 0
    #: ``(worker, reason, detail)`` each (``Any``: the codec's fast path types no
    #: fixed-length tuple, rule 1)
    idle: tuple[Any, ...] = ()
    head: str = ""
    stalled_for: float = 0.0


#: why an idle worker of a stalled pool takes nothing (``PlacementStallInfo.idle``):
#: its block is suspended; it drains; it was sent its pool's tasks_per_worker tasks and
#: is kept only for outputs still needed; it is past its memory throttle fence; the
#: scheduler counts its slots as taken; the first ready task asks for more cores or
#: memory than it has; the placement rules or a policy kept the tasks off it
PLACEMENT_STALL_REASONS = (
    "paused", "draining", "kept", "throttled", "full", "resources", "refused",
)  # fmt: skip


@message()
class ConfigSetting(Message):
    """One setting of a manager process as it runs (``status()["config"]``, the
    console's ``config``): its ``section`` (``manager``, ``scheduler``,
    ``pools.NAME``, ``alerting``, ``policies``), its ``key``, its ``value`` as text
    (as a TOML file writes it, sizes in bytes; ``none``: not set) and where it came
    from: ``default``, ``file`` (the ``--config`` file), ``flag --NAME`` or ``env
    NAME``. Never a token (docs/configuration.md#the-configuration-in-force)."""

    section: str
    key: str
    value: str
    source: str = "default"


def config_dict(settings: tuple[ConfigSetting, ...]) -> dict[str, dict[str, dict[str, str]]]:
    """``status()["config"]``: the settings by section and key, each ``{"value",
    "source"}``, in the order the manager gave them."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for s in settings:
        out.setdefault(s.section, {})[s.key] = {"value": s.value, "source": s.source}
    return out


@message(local=True)
class SettingsAt(Message):
    """-> manager: the settings its process runs with, once it listens (the rows of
    ``status()["config"]``)."""

    settings: tuple[ConfigSetting, ...]


@message()
class StatusReply(Message):
    """The cluster's status, the manager's answer to :class:`StatusRequest`: typed
    records only, so it crosses processes without a pickle. ``to_dict()`` gives the
    dict ``Cluster.status()`` documents (docs/api.md).

    Worker ids key ``processing`` (tasks sent and not finished), ``rss`` (after its
    latest task) and ``memory`` (its latest report); ``queues`` counts ready tasks per
    pool (``"*"``: any pool); ``recent_runs`` how many keys each of the latest runs has,
    ``run_clients`` the name of the client that submitted each of them.
    ``autoscaler`` is None without an autoscaler, or when it did not answer in time
    (``autoscaler_busy``)."""

    workers: tuple[WorkerInfo, ...] = ()
    processing: dict[str, int] = dataclasses.field(default_factory=dict)
    draining: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()
    #: workers whose connection dropped, their ids held for their rejoin (away: they
    #: take no new task and their cores are not counted until they rejoin or are lost)
    away: tuple[str, ...] = ()
    #: of ``draining``, the workers the scheduler drains because their walltime is near
    walltime_draining: tuple[str, ...] = ()
    #: of ``draining``, the workers drained because they were sent their pool's
    #: ``tasks_per_worker`` tries: their blocks count against ``max_blocks`` while a
    #: task runs there
    spent_draining: tuple[str, ...] = ()
    rss: dict[str, int] = dataclasses.field(default_factory=dict)
    memory: dict[str, WorkerMemoryReport] = dataclasses.field(default_factory=dict)
    throttled: tuple[str, ...] = ()
    #: per worker, the seconds it has been throttled since it joined (its episode under
    #: way counted to now); workers never throttled are left out
    throttled_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    tasks_by_state: dict[str, int] = dataclasses.field(default_factory=dict)
    queued: int = 0
    queues: dict[str, int] = dataclasses.field(default_factory=dict)
    #: per pool of ``queues``, seconds the oldest of its ready tasks has waited (as
    #: ``corral_queue_oldest_wait_seconds``)
    queue_oldest_wait: dict[str, float] = dataclasses.field(default_factory=dict)
    #: of the queued, those held back after failing to get their inputs (a backoff)
    held_back: int = 0
    #: retries held for their backoff (``RetryDecision.delay``): waiting, not ready
    #: (among the ``waiting`` of ``tasks_by_state``)
    retry_held: int = 0
    categories: dict[str, CategoryStatus] = dataclasses.field(default_factory=dict)
    #: categories the scheduler keeps statistics for (``categories`` may hold fewer:
    #: ``StatusRequest.top_categories``)
    categories_known: int = 0
    survival: dict[str, PoolLife] = dataclasses.field(default_factory=dict)
    policies: dict[str, str] = dataclasses.field(default_factory=dict)
    #: per kind, the parameters its policy was given (``policies.param_values``, as
    #: ``PolicyInfo.params``: each as its value; none: its defaults)
    policy_params: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    policy_errors: int = 0
    #: per policy kind, its policy errors (slow turns included) and the latest as text
    policy_errors_by: dict[str, int] = dataclasses.field(default_factory=dict)
    policy_problems: dict[str, str] = dataclasses.field(default_factory=dict)
    #: per kind, the latest problem of the policy in force now, if it had one since it
    #: was set (``policy_problems`` keeps the latest of any policy of the kind)
    policy_failing: dict[str, str] = dataclasses.field(default_factory=dict)
    files: FilesStatus = dataclasses.field(default_factory=FilesStatus)
    replicas: ReplicasStatus = dataclasses.field(default_factory=ReplicasStatus)
    storage: StorageStatus = dataclasses.field(default_factory=StorageStatus)
    #: speculative copies: ``started``, and those that ended ``won``, ``lost``, ``failed``
    speculative: dict[str, int] = dataclasses.field(default_factory=dict)
    #: checkpoints (docs/files.md#checkpoints): ``held`` now (and ``held_bytes``), and
    #: ever ``saved``, ``resumed`` (tries started from one), ``pruned``
    checkpoints: dict[str, int] = dataclasses.field(default_factory=dict)
    #: pools the disk watchdog finds stalled now (docs/files.md#disks), by pool
    disk_stalls: tuple[DiskStallInfo, ...] = ()
    #: tries that ended ``disk-full``, and tasks that failed with ``DiskFull`` (ever)
    disk_full_tries: int = 0
    disk_full_failed: int = 0
    #: disk stalls each pool had (ever; ``"*"``: any pool), and the stored outputs the
    #: stall breaker dropped to make room (made again when their readers run)
    disk_stalls_total: dict[str, int] = dataclasses.field(default_factory=dict)
    disk_dropped: int = 0
    #: pools the placement watchdog finds stalled now (ready tasks, an idle worker,
    #: nothing placed for ``stall_timeout``), by pool; and how many each pool ever had
    placement_stalls: tuple[PlacementStallInfo, ...] = ()
    placement_stalls_total: dict[str, int] = dataclasses.field(default_factory=dict)
    runs: int = 0
    recent_runs: dict[str, int] = dataclasses.field(default_factory=dict)
    run_clients: dict[str, str] = dataclasses.field(default_factory=dict)
    wanted_keys: int = 0
    wanted_pending: int = 0
    #: the manager's process: ``pid``, ``rss`` (bytes), ``threads``, ``fds`` (-1: not
    #: known), ``asyncio_tasks`` (actors/manager.py ``process_figures``)
    process: dict[str, int] = dataclasses.field(default_factory=dict)
    autoscaler: AutoscalerStatus | None = None
    autoscaler_busy: bool = False
    #: what the scheduler warns of now, as texts (the workers of one machine that
    #: together claim more memory than it has: docs/memory.md#workers-sharing-a-machine)
    warnings: tuple[str, ...] = ()
    #: the tasks still to run whose tries were lost with workers that ended unexpectedly
    #: while they may have executed them (what may be killing them), newest first, each
    #: with those workers (``SchedulerState.crash_suspects``; at most 20)
    crash_suspects: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: the keys of ``crash_suspects`` whose workers all ran their tasks in task
    #: processes (``WorkerInfo.execution``: ``SchedulerState.contained_suspects``)
    contained_suspects: tuple[str, ...] = ()
    #: the settings a manager process runs with (empty: an embedded cluster)
    config: tuple[ConfigSetting, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The status as the documented dict: each field by name, the nested records
        (memory, categories, files, autoscaler) as dicts of their fields, ``workers``
        as :class:`WorkerInfo` objects and id lists as lists; ``autoscaler`` is left
        out without an autoscaler and None when it did not answer in time."""
        out = self.to_fields()
        out["memory"] = {w: m.to_fields() for w, m in self.memory.items()}
        out["categories"] = {c: stats.to_fields() for c, stats in self.categories.items()}
        out["survival"] = {p: life.to_fields() for p, life in self.survival.items()}
        out["files"] = self.files.to_fields()
        out["replicas"] = self.replicas.to_fields()
        out["storage"] = self.storage.to_dict()
        out["disk_stalls"] = [s.to_fields() for s in self.disk_stalls]
        out["placement_stalls"] = [s.to_fields() for s in self.placement_stalls]
        lists = (
            "draining", "retired", "leaving", "walltime_draining", "spent_draining",
            "throttled", "warnings", "contained_suspects",
        )  # fmt: skip
        for name in lists:
            out[name] = list(out[name])
        out["config"] = config_dict(self.config)
        out["crash_suspects"] = {k: list(ws) for k, ws in self.crash_suspects.items()}
        busy, auto = out.pop("autoscaler_busy"), out.pop("autoscaler")
        if auto is not None:
            out["autoscaler"] = {
                **auto.to_fields(),
                "retiring": list(auto.retiring),
                "gave_up": list(auto.gave_up),
                "paused": list(auto.paused),
                "ends": [e.to_fields() for e in auto.ends],
                "batch_errors": {p: e.to_fields() for p, e in auto.batch_errors.items()},
            }
        elif busy:
            out["autoscaler"] = None
        return out


@message(local=True)
class StoryRequest(Message):
    """-> scheduler: transitions of these keys."""

    keys: tuple[Any, ...]


@message()
class ScaleRequest(Message):
    """-> autoscaler: keep ``n`` blocks of workers in ``pool``; with ``hold`` (seconds),
    only for that long, then back to the target set before (a scale-out that leaves
    scaling in to the scaling policy)."""

    n: int
    pool: str = "default"
    hold: float | None = None


@message(local=True)
class RestoreRequest(Message):
    """alert monitor -> autoscaler: set ``pool``'s target back to ``n`` (a scale-out
    action's ``restore``, its alerts resolved). Unlike ``ScaleRequest``, the blocks
    beyond it that run tasks are not drained now: each goes once it runs nothing
    (``TargetSet.idle_only``, until the next target). Reply as ``ScaleRequest``'s."""

    n: int
    pool: str = "default"


@message()
class ResumeRequest(Message):
    """-> manager -> autoscaler: submit ``pool``'s blocks again (after the batch system
    failed too often, or the pool gave up): resumes its provider and clears the
    autoscaler's pause, back-off and giving up for it."""

    pool: str


@message()
class WaitForWorkersRequest(Message):
    """-> manager -> scheduler: answer once at least ``n`` workers are registered."""

    n: int


@message(local=True)
class RunRequest(Message):
    """Client -> manager: call a function once on each of ``workers`` (None: every
    worker the scheduler knows), outside the task graph (``Cluster.run``, dask's
    ``Client.run``). ``call``: the client's pickle of ``(func, args, kwargs)``, opened
    by the workers only; from a client in the manager's own process (an embedded
    cluster), the tuple itself, which its in-process workers call as it is (the manager
    pickles it, in a thread, for its worker processes); ``name``: the function's name,
    for the logs and errors; ``timeout``: the seconds each worker has to answer.
    Answered with a tuple of :class:`RunOutcome`, one per worker, within ``timeout`` (a
    worker that leaves or does not answer in time gets a ``RunNoAnswer`` outcome)."""

    call: Any
    name: str
    workers: tuple[str, ...] | None
    timeout: float


@message(local=True)
class RunTargets(Message):
    """Manager -> scheduler: the workers a :class:`RunRequest` goes to, as
    ``(worker id, reference)`` pairs: those ``workers`` names (None: every worker
    registered, away ones too: they may come back within the call), chosen by the core
    (``SchedulerState.run_targets``; ``UnknownWorkers`` for an id it does not know)."""

    workers: tuple[str, ...] | None


@message(local=True)
class RunCall(Message):
    """Manager -> worker: open ``call`` (a :class:`RunRequest`'s: bytes, or to an
    in-process worker the tuple itself) and call it once, in a thread of the worker's
    process, off its event loop; answer a :class:`RunOutcome`. ``timeout``: the seconds
    left of the request's when sent: a call that has no thread by then is dropped, not
    run (its outcome a ``RunNoAnswer``)."""

    call: Any
    name: str
    timeout: float


@dataclasses.dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one worker's call of a :class:`RunRequest` came to: ``ok`` and ``payload``
    the pickle of the value it returned, else ``payload`` the pickle of the error
    (``runtime.remote.pack_error``: it loads, or a stand-in does), ``kind`` its type's
    name and ``text`` its traceback, for a side that cannot load it (``RemoteError``).
    Pickled by the worker, opened by the client only: the manager relays the bytes. A
    call that came as objects (an in-process worker's) answers with objects: the value
    or the exception itself (``pickled`` False)."""

    worker: str
    ok: bool
    payload: Any
    kind: str = ""
    text: str = ""
    pickled: bool = True


@message()
class ClientGone(Message):
    """Gateway -> manager: a client's connection ended; release what it held."""

    name: str


@message()
class ClientCame(Message):
    """Gateway (an embedded cluster: its own client) -> manager: a client connected. The
    manager knows so which clients a policy change affects (:class:`ClientGone` ends
    one)."""

    name: str


# --------------------------------------------------------------------------------------
# Console queries and commands. Wire messages (plain fields): a read-only console may
# send the ...Query ones; the others need the admin token.
# --------------------------------------------------------------------------------------


@message()
class TasksQuery(Message):
    """-> manager -> scheduler: up to ``limit`` tasks (0: as many as a page holds,
    ``MAX_LISTING``) in ``state`` and ``category`` and submitted by the client named
    ``client`` and of pool ``pool`` (``None``: any; a pool the scheduler does not know
    is a ``ValueError`` naming the pools it knows), skipping the first ``offset`` that
    match. Reply: a tuple of :class:`TaskRecord`."""

    state: str | None = None
    category: str | None = None
    limit: int = 100
    offset: int = 0
    client: str | None = None
    pool: str | None = None


@message()
class ProgressQuery(Message):
    """-> manager -> scheduler: how far run ``run`` is, a submission made with
    ``SubmitGraphRequest.progress``. Reply: ``None`` (no such run counted: never asked
    for, or let go), or a dict: ``total`` (the tasks its graph holds, as taken in so
    far), ``finished`` (of those, how many ended: in memory, erred or cancelled; a task
    done before the run came counts as finished at once), ``erred``, ``waiting``,
    ``ready`` (queued), ``running`` (processing), ``complete`` (its whole graph is
    taken in) and ``ended``: ``(key, worker, state)`` of each task that ended since
    the previous ask, so a client asking a few times a second is sent each key once.
    ``stop``: let the run's counts go after this answer (the client is done with them)."""

    run: str
    stop: bool = False


@message()
class StoryQuery(Message):
    """-> manager -> scheduler: transitions of the keys whose text (``str(key)``) is one
    of ``keys`` (at most ``MAX_STORY_KEYS``), the latest ``limit`` of them (at most
    ``MAX_LISTING``). Reply: ``[key, start, finish, stimulus id, time]`` lists of
    strings."""

    keys: tuple[str, ...]
    limit: int = 1000


#: the most rows a TasksQuery or StoryQuery answers with (a page)
MAX_LISTING = 10_000
#: the most keys one StoryQuery may name
MAX_STORY_KEYS = 100


@message()
class PolicyQuery(Message):
    """-> manager -> scheduler: per kind the policy in use and the available ones.
    Reply: a tuple of :class:`PolicyInfo`."""


@message()
class DrainRequest(Message):
    """-> manager -> scheduler: give ``worker`` no new tasks; stop it (``Stop``) once
    its running tasks have finished. Admin only."""

    worker: str


@message()
class UndrainRequest(Message):
    """Autoscaler -> scheduler (its pool wants the worker again), or -> manager ->
    scheduler (an operator's ``undrain``, admin only): take draining ``worker`` back:
    it takes new tasks again and is not retired. Reply: ``{"worker", "undrained",
    "why"}``: ``undrained`` False, and why, for a worker that is not draining, was
    retired, leaves on its own, or drains for its walltime or its pool's
    ``tasks_per_worker``; an unknown worker: ValueError."""

    worker: str


@message()
class ForgetCategoryRequest(Message):
    """-> manager -> scheduler (an operator's ``forget CATEGORY``, admin only): start
    ``category``'s statistics afresh (``CategoryForgotten``): memory admission, placement
    and estimates treat its tasks as a new category's until its tries teach them again.
    Reply: ``{"category", "count", "rss_rise", "max_rss_growth"}``: what it forgot (ok
    tries, the rise admission used, the largest rise ever); an unknown category:
    ``UnknownCategory``."""

    category: str


@message()
class MoveRequest(Message):
    """Client or console -> manager -> scheduler: move the tasks of ``keys`` (and of
    ``texts``, keys as text, as ``tasks`` shows them: the console's) that are still
    waiting or queued to pool ``pool`` and/or priority ``priority`` (None: as they are);
    they keep their keys and dependents (``TasksMoved``). A pool the scheduler does not
    know, a name no pool may have or a priority that is not a whole number:
    ``ValueError``, nothing moved; a key text no task has: ``ValueError``. Reply:
    ``{"moved": [key text, ...], "left": {key text: why}}``. Admin only."""

    keys: tuple[Any, ...] = ()
    texts: tuple[str, ...] = ()
    pool: str | None = None
    priority: int | None = None


@message()
class CancelKeysRequest(Message):
    """Console -> manager: cancel the keys whose text is in ``keys`` and, with ``run``,
    every key of that run; with ``key_or_run``, the run of that id or the key of that
    text, whichever it names (a text that names both is refused, nothing cancelled).
    The manager maps the texts to keys and sends a ``CancelRequest``. Admin only."""

    keys: tuple[str, ...] = ()
    run: str = ""
    key_or_run: str = ""
