"""The scheduler core's vocabulary: the events :meth:`SchedulerState.handle
<actors.scheduler_state.SchedulerState.handle>` takes (each with ``now`` and a
``stimulus_id``) and the commands it returns for its shell (``actors/scheduler.py``) to
carry out. Plain frozen data: no behaviour, no clock, no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from actors.protocol import FileFact, TaskResult, ToRun
from runtime.graph import Key, TaskSpec
from runtime.messages import DiskStallInfo, PlacementStallInfo

__all__ = [
    "REUSED_NAMED",
    "CancelOnWorker",
    "CancelRequested",
    "CancelSpared",
    "CategoryForgotten",
    "CheckpointCopied",
    "ClusterStops",
    "Command",
    "CopyCheckpoint",
    "DiskShared",
    "DiskStallBegan",
    "DiskStallEnded",
    "DropCheckpoints",
    "DropData",
    "Evacuate",
    "Event",
    "Execute",
    "FileFacts",
    "FilesReleased",
    "GraphSubmitted",
    "HostOvercommitCleared",
    "HostOvercommitted",
    "KeyCancelled",
    "KeyDone",
    "KeyErred",
    "KeyTaken",
    "KeysReleased",
    "KeysReused",
    "MoveAnswer",
    "OutputUnreadable",
    "PlacementStallBegan",
    "PlacementStallEnded",
    "PolicyChanged",
    "PolicyFailed",
    "PolicyNoted",
    "ProgressAnswer",
    "ProgressAsked",
    "ReplicasCopied",
    "ReplicasMissing",
    "Replicate",
    "RetireWorker",
    "ScalingChanged",
    "StoppedWithCluster",
    "Suspended",
    "TaskCheckpointed",
    "TasksFinished",
    "TasksMoved",
    "TasksRunning",
    "Tick",
    "ValuesDelivered",
    "WorkerAway",
    "WorkerDraining",
    "WorkerFloor",
    "WorkerHeld",
    "WorkerJoined",
    "WorkerLeaving",
    "WorkerLeft",
    "WorkerMemory",
    "WorkerPastLimit",
    "WorkerUndrained",
]


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    stimulus_id: str
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class GraphSubmitted(Event):
    """New tasks (``specs``) and the keys a client wants from them (or earlier ones).

    A large graph comes as several, one per piece (``runtime.graph.in_pieces``): in
    dependency order (a piece's tasks read earlier pieces' tasks, its own, or tasks
    known before), each with the wanted keys among its tasks (the first also the
    wanted keys known before). ``continued``: a later piece of ``echo_to``'s
    submission before it (one submission for the priority policies: one generation).
    The pieces of different submissions may come between each other (the scheduler's
    intake takes one piece of each client in turn, and of each of a client's
    submissions that reads and names none of the keys of its earlier ones still being
    taken in); ``run``: the submission's id (the manager's run), which tells one
    client's submissions apart (""; one client's pieces come one submission after the
    other). ``hold``: keys of
    this piece a later piece reads, kept (counted as wanted) until ``unhold``, in the
    piece that brings their last reader, lets them go. ``unconfigured``: ``(pool,
    why)`` for the pools the submission's tasks name that are not configured (the
    manager's ``SubmitSpecs.unconfigured``): a new task of one that no worker has
    joined says ``why`` in its story. ``echo``: keys the submitting client,
    ``echo_to``, wanted already (the last piece's): once the submission is in, the core
    says where each stands (:class:`KeyTaken`). ``final``: the submission's last piece:
    the core then says which of its keys named other tasks it knew (:class:`KeysReused`,
    for ``echo_to``)."""

    specs: Mapping[Key, TaskSpec]
    wanted: tuple[Key, ...]
    continued: bool = False
    hold: tuple[Key, ...] = ()
    unhold: tuple[Key, ...] = ()
    unconfigured: tuple[tuple[str, str], ...] = ()
    echo: tuple[Key, ...] = ()
    echo_to: str = ""
    final: bool = True
    run: str = ""
    #: count how the submission's tasks move, for :class:`ProgressAsked` asks of ``run``
    progress: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerJoined(Event):
    """``deadline``: when its walltime ends, on this core's clock (``None``: never)."""

    worker: str
    cores: int
    memory: int
    pool: str = "default"
    deadline: float | None = None
    disk: int = 0  #: bytes of disk it offers for outputs (0: no limit known)
    #: the block it belongs to ("": unknown): the core plans no evacuation onto a
    #: leaving worker's block siblings, which go with it
    block: str = ""
    #: the machine it runs on and that machine's memory (bytes), and its process id
    #: ("", 0: not told, an older worker): the limits of one machine's workers are
    #: added up (``actors.host_memory``), those of workers in one process once
    host: str = ""
    host_memory: int = 0
    process: int = 0
    #: the file system it keeps its outputs on (``actors.shared_disk.disk_key``; "":
    #: not told) and the bytes it had free when the worker joined; ``disk_auto``: its
    #: ``disk`` is the free-space default (no ``--disk``), so it gets a share of that
    #: file system with the other such workers on it (``actors.shared_disk.DiskShares``)
    filesystem: str = ""
    fs_free: int = 0
    disk_auto: bool = False
    #: the CPUs its machine lets it use (0: not told): the ``cores`` of one machine's
    #: workers are added up against them (``SchedulerState.host_cores``)
    host_cpus: int = 0
    #: its spill fence is on (False: off, or not told): an evacuated copy needs room in
    #: its memory only to land (``scheduler_state._has_room``)
    spills: bool = False
    #: it runs its tasks in task processes (execution ``process``): a task that crashes
    #: there ends its task process, not the worker (``TaskCrashedWorkers`` says so)
    contained: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerAway(Event):
    """``worker``'s connection dropped (``now``: when) and its id is held for its
    rejoin: it takes no new work and its cores do not count as capacity until it joins
    again (:class:`WorkerJoined`, its work kept); if it is lost instead
    (:class:`WorkerLeft`), its life and the tries it was running end at the drop."""

    worker: str


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerLeft(Event):
    """``worker`` is gone (``cause``: a worker-lost cause). ``evacuated``: outputs it
    copied to other workers before it went, ``(key, worker)``: they are not lost."""

    worker: str
    cause: str = "unknown"
    evacuated: tuple[tuple[Key, str], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerLeaving(Event):
    """``worker`` is about to go (``cause``: preempted, walltime, shutdown) and has a
    short grace: give it no new tasks and say where its needed outputs should go
    (:class:`Evacuate`). ``executing``: the tasks it executes now (``str`` of their
    keys); the others it has in hand never started, and when it goes their tries count
    as having run 0 s (``TryRecord.ran``). ``None``: it did not say (from being sent).
    ``executed``: ``(key, seconds it has executed)`` of those it said (empty: not said);
    a try lost to the walltime after executing about its worker's whole life is too
    long for its pool (``policies.WalltimeLoss``)."""

    worker: str
    cause: str
    executing: frozenset[str] | None = None
    executed: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicasMissing(Event):
    """Asked for these outputs (a gather), ``worker`` did not have them; ``reached``
    false: the gather could not ask it (gone, or its connection dropped), so it may
    hold them still. Either way the gather's client needs them."""

    worker: str
    keys: tuple[Key, ...]
    reached: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class ValuesDelivered(Event):
    """Gathers gave the values of these outputs to clients (``TaskState.delivered``)."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicasCopied(Event):
    """The answer to :class:`Replicate` (a replica, or a copy off a draining worker):
    of the ``asked`` outputs, ``worker`` holds ``got`` now (the others could not be
    copied)."""

    worker: str
    asked: tuple[Key, ...]
    got: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerHeld(Event):
    """A worker that rejoined over a new connection says what it has in hand
    (``active`` keys) and holds (``held``: ``(key, nbytes)``)."""

    worker: str
    active: frozenset[Key]
    held: tuple[tuple[Key, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TasksFinished(Event):
    """How tries on ``worker`` ended, and the worker's RSS with its task processes
    then (``rss``: ``TasksDone.rss``; 0: not measured). Each result's ``rss`` is its
    task's, for the category's statistics, not the worker's."""

    worker: str
    results: tuple[TaskResult, ...]
    rss: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TasksRunning(Event):
    """Tries on ``worker`` that have executed a while: ``(key, attempt, seconds
    executed)`` each (``attempt`` 0: not said)."""

    worker: str
    started: tuple[tuple[Key, int, float], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class CancelRequested(Event):
    """Cancel these keys and what depends on them, except what a key in ``spare`` (held
    by other clients) needs: those run on (:class:`CancelSpared` names the keys asked
    for that did).

    ``coming``: those of ``keys`` that pieces of graphs not taken in yet bring (once per
    piece that brings it; the shell's intake, ``GraphSubmitted`` to come). The cancel
    is carried out now on the tasks the core has, and each of these is cancelled as its
    piece brings it, never queued (its clients are told now when the core does not have
    it yet); none of ``spare`` may be among them (the shell carries such a cancel out
    once the intake is over)."""

    keys: tuple[Key, ...]
    reason: str = "cancelled by request"
    spare: frozenset[Key] = frozenset()
    coming: tuple[Key, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class TasksMoved(Event):
    """An operator's or a client's move of queued work: each of ``keys`` still waiting
    or queued (sent to no worker yet) takes ``pool`` and/or ``priority`` (None: as it
    is) and is re-queued by them, keeping its key and its dependents. A running task,
    a finished one or a key the core does not have is left as it is; so is every key
    when ``pool`` is no pool's name (``pool_name_problem``) or a pool the core does
    not know (:meth:`SchedulerState.known_pools`). :class:`MoveAnswer` says which
    keys moved and why the others did not."""

    keys: tuple[Key, ...]
    pool: str | None = None
    priority: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ProgressAsked(Event):
    """A client asks how far counted run ``run`` is (``ProgressQuery``): answered by a
    :class:`ProgressAnswer`, which hands over the keys that ended since the last ask
    (each is said once); ``stop``: the run's counts are let go after it."""

    run: str
    stop: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class KeysReleased(Event):
    """A client no longer wants these keys (one release per earlier want)."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class FilesReleased(Event):
    """The file registry dropped these outputs from every worker."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyChanged(Event):
    kind: str
    policy: Any
    by: str = ""  #: the id of the client (or console) that asked ("": not said)
    #: why the core replaced a policy on its own (a slow one): "" for a swap asked for
    why: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ScalingChanged(Event):
    """The autoscaler's scaling policy was swapped (to ``name`` with ``params``, by
    ``by``): a ``policy`` line in the cluster's story and a swap in the monitoring
    feed, as the scheduler's own kinds' swaps are."""

    name: str
    params: dict[str, Any]
    by: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerDraining(Event):
    """Give ``worker`` no new tasks; retire it (:class:`RetireWorker`) once the tasks it
    runs have finished. Its outputs stay available to peers until it leaves."""

    worker: str


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerUndrained(Event):
    """Take draining ``worker`` back (the autoscaler's pool wants it again): it takes
    new tasks again, as before its :class:`WorkerDraining`, and is not retired. Only a
    worker drained by a :class:`WorkerDraining` that is still there: not retired, not
    leaving on its own, not drained for its walltime nor its pool's
    ``tasks_per_worker`` (:meth:`SchedulerState.undrain_refusal` says why not); any
    other is left as it is."""

    worker: str


@dataclasses.dataclass(frozen=True, slots=True)
class CategoryForgotten(Event):
    """An operator's ``forget CATEGORY``: the category's statistics start afresh (as
    those of a category never seen: no rise, no durations, no sizes), its tasks placed
    as a new category's until its tries teach them again. A category the core does not
    know is let be (the shell refuses it first: ``UnknownCategory``)."""

    category: str


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyNoted(Event):
    """A policy that is not the scheduler's (the autoscaler's scaling policy) failed:
    ``problem`` goes into the cluster's story (key ``"-"``) as a ``policy-error``; it
    is counted where it happened, not in the scheduler's ``policy_errors``."""

    problem: str


@dataclasses.dataclass(frozen=True, slots=True)
class Suspended(Event):
    """The batch system suspended the block of ``workers`` (``suspended``), or resumed
    it (``suspended`` False). Suspended, they get no new tasks (what they run stays
    theirs: it goes on when they resume), and one lost meanwhile with no cause
    (``unknown``: it went silent) is lost as ``suspended``, a free loss."""

    workers: tuple[str, ...]
    suspended: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class StoppedWithCluster(Event):
    """The cluster shuts down and the autoscaler stops the blocks of ``workers``: each
    is lost as ``shutdown`` whatever cause its end is reported with (not a loss: its
    life does not count as ended unasked in its pool's survival), unless it leaves
    on purpose anyway (drained, walltime)."""

    workers: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterStops(Event):
    """The cluster stops on purpose (a manager's orderly stop, ``Cluster.close``),
    before its workers are stopped: the run's tasks end now. Each task not finished
    (waiting, queued, running) is cancelled, its clients not told (they learn that the
    cluster stopped); a running one's try ends ``cancelled`` with cause ``shutdown``.
    A finished task keeps its end. The run takes no new work: a task a graph brings
    from now on (new, or a resubmitted key) is cancelled as it comes, with the same
    reason, and its clients are told (``KeyCancelled``). From now on a worker that goes
    loses nothing: a task whose output goes with it stays as it ended (``memory``, not
    computed again, no recovery, no replica made) and a leaving worker copies none off."""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskCheckpointed(Event):
    """Running task ``key`` on ``worker`` saved its checkpoint number ``seq``, a file
    of ``nbytes`` on that worker's disk; ``data``: its bytes when they travelled with
    it (small ones), else None. The core records it until the task ends and gives the
    newest one that survives to the task's next try (docs/files.md#checkpoints)."""

    worker: str
    key: Key
    seq: int
    nbytes: int
    data: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class OutputUnreadable(Event):
    """``worker`` holds task ``key``'s output but cannot pickle it (``reason``), so it
    could not go to ``to``, which got :class:`~runtime.errors.ResultNotPicklable`. The
    core counts it as a failed try of the task (outcome ``error``, cause
    ``ResultNotPicklable``): its failure group and the monitoring feed say it; the task
    stays as it ended (its output stays usable on that worker)."""

    worker: str
    key: Key
    reason: str
    to: str


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointCopied(Event):
    """The answer to :class:`CopyCheckpoint`: ``worker`` holds a copy of checkpoint
    ``seq`` of task ``key`` now (``ok``), or could not copy it."""

    worker: str
    key: Key
    seq: int
    ok: bool


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerMemory(Event):
    """A worker's memory state: ``throttled`` (deferring producers: past its throttle
    fence), its ``rss`` and where its throttle fence is (``throttle_at`` bytes) out of
    its ``limit``; ``disk_used``: bytes of its outputs on disk now; ``memory_bytes``:
    bytes of outputs in its memory (-1: not told); ``abandoned``: its threads still
    running a cancelled try, each replaced by a fresh one; ``held``: its threads
    holding their slot with a try that was stopped but could not be (thread execution,
    as many abandoned already as it has threads): no task goes to those slots."""

    worker: str
    throttled: bool
    rss: int
    throttle_at: int
    limit: int
    disk_used: int = 0
    memory_bytes: int = -1
    #: the highest RSS it sampled past its terminate fence with its tasks in threads,
    #: which that fence cannot kill (``WorkerMemoryReport.past_peak``; 0: never)
    past_peak: int = 0
    abandoned: int = 0
    held: int = 0
    #: its floor (memory that is not outputs) when at or past its resume mark, and the
    #: warning its worker logged of it (``WorkerMemoryReport.floor``, ``floor_warning``;
    #: 0 and "": the configured marks hold)
    floor: int = 0
    floor_warning: str = ""
    #: of ``disk_used``, the bytes the file system holding its disk lacks beyond what
    #: the worker counts as its own (other programs' files there; 0: none)
    disk_foreign: int = 0
    #: spills refused for want of disk room so far (``WorkerMemoryReport.spill_refused``)
    #: and the spill directory they were refused on: ``MemoryStalled`` names them
    spill_refused: int = 0
    spill_dir: str = ""
    #: its terminate fence, bytes, as it told it (``WorkerMemoryReport.terminate_at``;
    #: None: turned off, or not told): the core's own fence tests use it
    #: (:func:`~actors.scheduler_state.terminate_fence`)
    terminate_at: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Tick(Event):
    """Time passed (the watchdog's clock); nothing else happened."""


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    stimulus_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyFailed(Command):
    """The ``kind`` policy (named ``policy``) gave no usable answer: ``problem`` (it
    raised, answered out of bounds, or took longer than its budget); its fallback
    answered instead; ``errors``: the kind's policy errors so far. Once per distinct
    problem of a kind, and again every ``POLICY_ERROR_EVERY`` seconds while it goes on
    (:class:`policies.problems.PolicyProblems`). ``replaced``: the policy was replaced
    by the default one (too slow too often). The shell logs it at ERROR."""

    kind: str
    policy: str
    problem: str
    errors: int
    replaced: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class HostOvercommitted(Command):
    """The workers connected on ``host`` claim more memory than it has: ``claimed``
    bytes, the sum of their limits (``workers``: ``(worker, limit)``, in id order; those
    sharing one process count once), against its ``host_memory``; so none of their
    fences acts before the machine runs out. ``processes``: how many worker processes
    share it. Said again when the set of its workers (or their limits) changes while it
    holds. ``resource`` ``"cores"``: the same of their declared ``cores`` (each worker
    counted) against the CPUs the machine lets them use, in ``host_memory``."""

    host: str
    host_memory: int
    claimed: int
    workers: tuple[tuple[str, int], ...]
    processes: int
    resource: str = "memory"


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerPastLimit(Command):
    """``worker`` (of memory ``limit``) ran past its terminate fence, its tasks in
    threads, which the fence cannot kill: its RSS reached ``peak``, a new high, while it
    had tasks of ``categories`` (sorted) sent to it. ``peak`` 0: the worker left, the
    warning ends. The shell shows it in ``status()["warnings"]`` at every new peak
    (:func:`past_limit_text`) and logs it when ``log``: the first crossing, then each
    doubling of the excess over the limit (:func:`past_limit_logged`)."""

    worker: str
    limit: int
    peak: int
    categories: tuple[str, ...] = ()
    log: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerFloor(Command):
    """``worker``'s floor (memory that is not outputs: libraries, task processes) is
    ``floor`` bytes, at or past its resume mark, as ``warning`` says, or (``floor`` 0)
    no longer: it went back under the mark, or the worker left. The shell shows
    ``warning`` in ``status()["warnings"]`` while it holds
    (docs/memory.md#the-floor-memory-that-is-not-outputs)."""

    worker: str
    floor: int
    warning: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class DiskShared(Command):
    """The workers on ``filesystem`` (a ``actors.shared_disk.disk_key``) that took the
    free-space default for their disk (no ``--disk``) share it: ``shares`` is each
    one's disk budget now, ``(worker, bytes)`` in id order, what the core places
    within: ``budget`` (the most free space one of them measured, less its margin) less
    ``explicit`` (the budgets of the workers on it given a ``--disk``), over
    ``processes`` worker processes. Said when a worker joining or leaving it changed a
    share."""

    filesystem: str
    budget: int
    explicit: int
    processes: int
    shares: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class HostOvercommitCleared(Command):
    """The workers on ``host`` no longer claim more than its memory (some left, or
    joined again with smaller limits); ``workers``: those connected on it now;
    ``resource``: of :class:`HostOvercommitted`."""

    host: str
    workers: tuple[str, ...]
    resource: str = "memory"


@dataclasses.dataclass(frozen=True, slots=True)
class Execute(Command):
    worker: str
    tasks: tuple[ToRun, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class CancelOnWorker(Command):
    worker: str
    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class DropData(Command):
    """Outputs a worker holds that nothing tracks (a stale or cancelled result)."""

    worker: str
    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Evacuate(Command):
    """The answer to :class:`WorkerLeaving`: copy each output ``key`` (``nbytes``) that
    is still needed and held only by ``worker`` to ``target``, ``(key, target, nbytes)``,
    largest first. Later, more of the plan: a target named for ``key`` said it leaves
    too while the copy was on its way, and ``key`` goes to another as well."""

    worker: str
    moves: tuple[tuple[Key, str, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Replicate(Command):
    """Temporary replicas: ``worker`` copies each output of ``keys``, ``(key, nbytes)``,
    from ``source`` and keeps it (the copy path of data evacuation); the answer comes
    back as :class:`ReplicasCopied`. Also how the outputs only a draining ``source``
    holds are copied off it before it is retired: those copies are evacuations, not
    replicas (the core knows which is which)."""

    worker: str
    source: str
    keys: tuple[tuple[Key, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class CopyCheckpoint(Command):
    """``worker`` copies checkpoint ``seq`` of task ``key`` (``nbytes``) from the disk
    of ``source`` to its own and keeps it; the answer comes back as
    :class:`CheckpointCopied`."""

    worker: str
    source: str
    key: Key
    seq: int
    nbytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class DropCheckpoints(Command):
    """``worker`` deletes these checkpoint files, ``(key, seq)`` (``seq`` 0: every file
    of that task)."""

    worker: str
    items: tuple[tuple[Key, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class RetireWorker(Command):
    """A draining worker has finished its tasks: tell it to stop. It stays known (and
    draining) until it leaves (:class:`WorkerLeft`). ``cause``: why it was drained, the
    cause it leaves with: ``walltime`` for the core's own drain before its walltime,
    ``drained`` for any other (an operator's, a scale-in, its pool's ``tasks_per_worker``)."""

    worker: str
    cause: str = "drained"


@dataclasses.dataclass(frozen=True, slots=True)
class KeyDone(Command):
    key: Key
    worker: str
    nbytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class KeyErred(Command):
    """A wanted key failed. ``error`` is what its future raises; ``root`` the task whose
    own try failed and ``root_error`` that try's exception; ``worker`` the worker that
    try ran on, ``attempt`` its number among the tries of the root's latest submission
    and ``attempts`` the tries it could have made (its ``retries=`` budget left added,
    as a retry policy may decline to retry): the client's
    note on a task's own exception, ``try 3 of 3``. "", 0 and 0 for a failure with no
    try of its own (not run, cancelled, or failed in the client)."""

    key: Key
    error: BaseException
    root: Key
    root_error: BaseException
    worker: str = ""
    attempt: int = 0
    attempts: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class KeyCancelled(Command):
    key: Key
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class KeyTaken(Command):
    """A submission of ``key`` by ``client``, which wanted it already, was taken in:
    what was said of the key before this is older than that submission. ``pending``:
    the key runs (again: it had failed or been cancelled, and the submission runs it
    again); else the ``KeyDone``/``KeyErred``/``KeyCancelled`` right before this says
    again where it stands. For ``client`` alone (the manager sends it to no other)."""

    key: Key
    pending: bool
    client: str


@dataclasses.dataclass(frozen=True, slots=True)
class KeysReused(Command):
    """A submission by ``client`` gave keys the cluster knows already to other tasks (a
    different function or arguments: ``runtime.graph.node_fingerprint``); the tasks
    known by those keys stand, and their results are what the submission gets.
    ``keys``: the first of them (at most :data:`REUSED_NAMED`), ``count``: how many
    there were among the keys compared. One per submission, once it is all in; the
    manager logs it and tells ``client`` alone, which logs it too."""

    keys: tuple[Key, ...]
    count: int
    client: str

    @property
    def key(self) -> Key:  # what KeyUpdates' readers route by: the first key named
        return self.keys[0]

    def text(self) -> str:
        """The warning, for people."""
        named = ", ".join(map(repr, self.keys))
        more = self.count - len(self.keys)
        return (
            f"{self.count} key(s) of this submission ({named}"
            f"{f' and {more} more' if more > 0 else ''}) already name other tasks on the "
            "cluster, with another function or arguments: those tasks stand, and their "
            "results are what this submission gets (a key the cluster has is the same "
            "task, as in dask). Give each request's keys a unique prefix (say "
            "f'{request_id}-a'), or use submit, whose pure keys are tokens of the call"
        )


#: Keys a :class:`KeysReused` names (the rest it counts).
REUSED_NAMED = 5


@dataclasses.dataclass(frozen=True, slots=True)
class CancelSpared(Command):
    """Keys a cancel asked for that run on, since keys other clients hold need them
    (the answer to the canceller, not a word to every client)."""

    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class MoveAnswer(Command):
    """The answer to a :class:`TasksMoved` (to the mover, not a word to every client):
    the keys moved, and each key left as it was with why."""

    moved: tuple[Key, ...]
    left: tuple[tuple[Key, str], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ProgressAnswer(Command):
    """The answer to a :class:`ProgressAsked` (to the asker alone): ``counts`` is
    ``ProgressQuery``'s reply (None: the run is not counted)."""

    run: str
    counts: dict[str, Any] | None


@dataclasses.dataclass(frozen=True, slots=True)
class FileFacts(Command):
    facts: tuple[FileFact, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class DiskStallBegan(Command):
    """The disk watchdog found a pool stalled (``stall``: which, its workers, what
    fills their disks and what waits): for the log, once per stall."""

    stall: DiskStallInfo


@dataclasses.dataclass(frozen=True, slots=True)
class DiskStallEnded(Command):
    """A pool's disk stall ended after ``lasted`` seconds: a task of the pool fits a
    disk again, or none waits for one."""

    stall: DiskStallInfo
    lasted: float


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementStallBegan(Command):
    """The placement watchdog found a pool stalled (``stall``: which, its ready tasks,
    and why each idle worker of it takes nothing): for the log, once per stall."""

    stall: PlacementStallInfo


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementStallEnded(Command):
    """A pool's placement stall ended ``lasted`` seconds after its last progress
    (``stall.since``): a task of the pool was placed or finished, none is ready any
    more, or its ready tasks wait for disk (the disk watchdog's case)."""

    stall: PlacementStallInfo
    lasted: float
