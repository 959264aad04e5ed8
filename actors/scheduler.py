"""The scheduler actor: a thin shell around :class:`SchedulerState`.

What lives here: :class:`Scheduler`, which turns messages into core events (adding
``now`` from its clock and the causal id as ``stimulus_id``), calls
``SchedulerState.handle`` and carries out the commands it returns. No decisions are made
here; they are all in ``actors/scheduler_state.py`` (its events and commands in
``actors/scheduler_events.py``, its records in ``actors/scheduler_records.py``) and the
policies.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import heapq
import linecache
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel

import runtime.graph
from actors.host_memory import CORES_FLAG, HostLedger, cores_overcommit_text, overcommit_text
from actors.scheduler_events import (
    CancelOnWorker,
    CancelRequested,
    CancelSpared,
    CategoryForgotten,
    CheckpointCopied,
    ClusterStops,
    Command,
    CopyCheckpoint,
    DiskShared,
    DiskStallBegan,
    DiskStallEnded,
    DropCheckpoints,
    DropData,
    Evacuate,
    Event,
    Execute,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    HostOvercommitCleared,
    HostOvercommitted,
    KeyCancelled,
    KeyDone,
    KeyErred,
    KeysReleased,
    KeysReused,
    KeyTaken,
    MoveAnswer,
    OutputUnreadable,
    PlacementStallBegan,
    PlacementStallEnded,
    PolicyChanged,
    PolicyFailed,
    PolicyNoted,
    ProgressAnswer,
    ProgressAsked,
    ReplicasCopied,
    ReplicasMissing,
    Replicate,
    RetireWorker,
    ScalingChanged,
    StoppedWithCluster,
    Suspended,
    TaskCheckpointed,
    TasksFinished,
    TasksMoved,
    TasksRunning,
    Tick,
    ValuesDelivered,
    WorkerAway,
    WorkerDraining,
    WorkerFloor,
    WorkerHeld,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
    WorkerMemory,
    WorkerPastLimit,
    WorkerUndrained,
)
from actors.scheduler_records import (
    NOT_RUN,
    ErrorRecord,
    FailureGroup,
    NotRunGroup,
    SchedulerConfig,
    WorkerState,
    disk_stall_parts,
    error_line,
    lost_worker_text,
    not_run_text,
    placement_stall_parts,
)
from actors.scheduler_state import SchedulerState
from actors.shared_disk import disk_claim, disk_key, disk_shared_text, shared_disk_text
from policies import ON_PURPOSE, REGISTRY, PolicyRegistry, param_values
from policies.survival import Survival
from runtime.client_ids import client_name
from runtime.errors import (
    PAST_LIMIT_ADVICE,
    ActorStopped,
    CorralError,
    UnknownCategory,
    size_text,
)
from runtime.graph import SpecPiece
from runtime.kernel import Actor, ActorRef, Envelope, Later, current_causal_id, handles
from runtime.messages import (
    MAX_FAILURE_GROUPS_SHOWN,
    MAX_LISTING,
    MAX_STORY_KEYS,
    CancelRequest,
    CancelTasks,
    CategoryMetrics,
    CategoryStatus,
    CheckpointFetched,
    CheckpointSaved,
    ClusterStopping,
    ConfirmHolds,
    CopiesReply,
    CopyFrom,
    DataDelivered,
    DataMissing,
    DemandRequest,
    DrainRequest,
    DropCheckpointsMsg,
    DropKeys,
    Evacuated,
    EvacuationPlan,
    FailureCount,
    FailureGroupInfo,
    FetchCheckpoint,
    FileFactsMsg,
    FilesReleasedMsg,
    ForgetCategoryRequest,
    KeyUpdates,
    Leaving,
    Message,
    MetricsRequest,
    MonitorFeed,
    MonitorFeedReply,
    MoveRequest,
    OperatorCancel,
    OutputUnpicklable,
    PolicyInfo,
    PolicyNote,
    PolicyQuery,
    PoolLife,
    PoolMetrics,
    ProgressQuery,
    RecentTry,
    RegisterWorker,
    ReleaseKeysRequest,
    ReplicasStatus,
    RunTargets,
    RunTasks,
    ScalingSwapped,
    SetPolicyRequest,
    StatusRequest,
    Stop,
    StorageStatus,
    StoryQuery,
    StoryRequest,
    SubmitSpecs,
    TaskRecord,
    TasksDone,
    TasksQuery,
    TasksStarted,
    TryRecord,
    UndrainRequest,
    UpcomingRequest,
    WaitForWorkersRequest,
    WorkerArrived,
    WorkerDiskMetrics,
    WorkerDropped,
    WorkerGone,
    WorkerHolds,
    WorkerInfo,
    WorkerMemoryReport,
    WorkersStopping,
    WorkersSuspended,
    WorkerStorage,
    message,
    pool_name,
    pool_name_problem,
)

__all__ = ["MAX_TRACEBACK_TEXT", "Scheduler", "format_error", "traceback_text"]


@message(local=True)
class _Tick(Message):
    """Scheduler-internal: time passed (the memory watchdog's clock)."""


@message(local=True)
class _Copied(Message):
    """Scheduler-internal: how a :class:`Replicate` command ended (see
    ``Scheduler._replicate``)."""

    worker: str
    asked: tuple[Any, ...]
    got: tuple[Any, ...]


class _Turn(NamedTuple):
    """What waits in the scheduler's intake (:meth:`Scheduler._take_in`):
    ``apply(stimulus)``. ``alone``: in a turn of its own (a piece of a graph, a part of a
    large release); else carried out at once with what follows it (a release, or a
    cancel that must wait, that came after them). ``specs``: a piece's tasks; ``keys``:
    the other keys it touches, in some collections (the inputs a piece reads from
    outside its graph and the keys it wants, a release's keys)."""

    apply: Callable[[str], Any]
    stimulus: str
    alone: bool = True
    specs: Mapping[Any, Any] | None = None
    keys: tuple[Collection[Any], ...] = ()


class _Job:
    """A submission, a release or a request that waits, in the intake: its turns, its
    client (``lane``; None: a request that waits for everything before it, and that
    everything after it waits for), how many of the jobs that came before it it still
    waits for (``waits``: those, its own client's or another's, that bring or touch one
    of its keys, found through the latest job to touch each key: see
    :meth:`_IntakeQueue.job`) and the later jobs that wait for it (``later``)."""

    __slots__ = ("before", "counts", "done", "lane", "later", "turns", "waits")

    def __init__(self, lane: str | None, turns: Iterable[_Turn]) -> None:
        self.lane = lane
        self.turns = deque(turns)
        self.before: list[_Job] = []  # (until it is added: whom it will wait for)
        self.later: list[_Job] = []
        self.waits = 0
        self.done = False
        #: key -> how many of its turns still to come bring or touch it
        self.counts: dict[Any, int] | None = None

    def keys(self) -> Collection[Any]:
        """The keys its turns still to come bring or touch."""
        if self.counts is None:
            self.counts = {}
            for t in self.turns:
                for key in _turn_keys(t):
                    self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts.keys()

    def ready(self) -> bool:
        """Whether every job it waits for is done."""
        return not self.waits


def _turn_keys(turn: _Turn) -> set[Any]:
    """The keys ``turn`` brings or touches."""
    some: set[Any] = set(turn.specs) if turn.specs is not None else set()
    for keys in turn.keys:
        some.update(keys)
    return some


class _IntakeQueue:
    """What waits to be taken in, by client: each client's jobs in the order they came,
    the clients served one turn each in turn (round robin), and within a client its
    jobs that may go, one turn each in turn; a job goes once the jobs before it that
    it waits for are done. So a small graph goes in between the pieces of a large one,
    of another client or of its own (a service's one client: a request made during
    another request's large ``map``), while a job that touches keys an earlier job
    brings (or reads, or lets go of) waits for that one, and a cancel that must wait
    waits for everything before it.

    Each job waits only for the latest earlier job to touch each of its keys (that one
    waits for the one before it, and so on) and for the latest request that waits for
    everything: adding a job costs its keys, a turn costs its keys, and a job that
    becomes ready goes to the end of its client's jobs that may go (none is looked at
    while it waits)."""

    def __init__(self) -> None:
        #: client -> its jobs that may go, in the order they are served next (a job
        #: served goes to the end of its client's); the clients with jobs waiting, in
        #: the order they are served next (a client served goes to the end)
        self.lanes: dict[str | None, deque[_Job]] = {}
        #: the jobs waiting, in the order they came; by client, how many
        self.pending: dict[_Job, None] = {}
        self.sizes: dict[str | None, int] = {}
        #: key -> the latest job waiting whose turns still to come bring or touch it
        self.last: dict[Any, _Job] = {}
        #: the latest request waiting that waits for everything (lane None)
        self.barrier: _Job | None = None

    def __len__(self) -> int:
        """The turns still to take."""
        return sum(len(j.turns) for j in self.pending)

    def __bool__(self) -> bool:
        return bool(self.pending)

    def jobs(self) -> Iterator[_Job]:
        return iter(self.pending)

    def turns(self) -> Iterator[_Turn]:
        for job in self.jobs():
            yield from job.turns

    def job(self, lane: str | None, turns: Iterable[_Turn]) -> _Job:
        """A job of ``lane``, with the jobs now waiting that it must wait for (every
        one for a request that waits for everything; else the latest to touch each of
        its keys, and the latest request that waits for everything)."""
        job = _Job(lane, turns)
        if lane is None:
            job.before = list(self.pending)
        else:
            last = self.last
            before = {last[k]: None for k in job.keys() if k in last}  # noqa: SIM118
            if self.barrier is not None:
                before[self.barrier] = None
            job.before = list(before)
        job.waits = len(job.before)
        return job

    def add(self, job: _Job) -> None:
        if not job.turns:
            return
        for earlier in job.before:
            earlier.later.append(job)
        job.before = []
        self.pending[job] = None
        if job.lane is None:
            self.barrier = job
        else:
            self.last.update(dict.fromkeys(job.keys(), job))
        jobs = self.lanes.setdefault(job.lane, deque())
        self.sizes[job.lane] = self.sizes.get(job.lane, 0) + 1
        if not job.waits:
            jobs.append(job)

    def pop(self, job: _Job | None = None) -> _Turn | None:
        """The next turn: of the first client in turn that has a job that may go, its
        first such job's (``job``'s, when given, if it may go); None if none may."""
        if job is None:
            job = next((jobs[0] for jobs in self.lanes.values() if jobs), None)
            if job is None:
                return None
        elif job.done or job.waits:
            return None
        name = job.lane
        jobs = self.lanes[name]
        turn = job.turns.popleft()
        if jobs[0] is job:  # (O(1) while its client has one job under way)
            jobs.popleft()
        elif jobs[-1] is job:  # (a job just added)
            jobs.pop()
        else:
            jobs.remove(job)
        self._taken(job, turn)
        if job.turns:  # (to the end: its client's other jobs go first)
            jobs.append(job)
        else:
            self._done(job)
        del self.lanes[name]
        if self.sizes[name]:  # (to the end: the others go first)
            self.lanes[name] = jobs
        else:
            del self.sizes[name]
        return turn

    def _taken(self, job: _Job, turn: _Turn) -> None:
        """``job``'s ``turn`` is taken: the keys only it brought or touched are no
        longer the job's."""
        if job.counts is None:
            return
        counts, last = job.counts, self.last
        for key in _turn_keys(turn):
            left = counts.get(key, 0) - 1
            if left > 0:
                counts[key] = left
                continue
            counts.pop(key, None)
            if last.get(key) is job:
                del last[key]

    def _done(self, job: _Job) -> None:
        """``job`` has no turn left: the jobs that waited only for it may go."""
        job.done = True
        del self.pending[job]
        self.sizes[job.lane] -= 1
        if self.barrier is job:
            self.barrier = None
        for key in job.counts or ():  # (none left: each went with its last turn)
            if self.last.get(key) is job:
                del self.last[key]
        for later in job.later:
            later.waits -= 1
            if not later.waits:
                self.lanes[later.lane].append(later)
        job.later = []


@message(local=True)
class _Intake(Message):
    """Scheduler-internal: take in the next piece of the graphs being taken in."""


@message(local=True)
class _CheckpointCopied(Message):
    """Scheduler-internal: how a :class:`CopyCheckpoint` command ended."""

    worker: str
    key: Any
    seq: int
    ok: bool


#: seconds a worker may take to copy replicas or a checkpoint before the copy counts as
#: failed, plus a second per :data:`COPY_RATE_FLOOR` bytes copied (the copy itself is
#: bounded part by part by the worker's ``fetch_timeout``: this is a backstop, which a
#: large copy on a slow link must not hit)
REPLICATE_TIMEOUT = 600.0
#: tasks a ``worker lost`` log line names of those the worker was running (``more``: the rest)
LOST_NAMES = 10


def _executed(ws: WorkerState) -> list[str]:
    """The keys of the tasks ``ws`` executed as it left (all it has in hand when it did
    not say), sorted."""
    keys = (str(ts.key) for ts in ws.processing)
    return sorted(k for k in keys if ws.executing is None or k in ws.executing)


COPY_RATE_FLOOR = 10 * 2**20


def past_limit_text(cmd: WorkerPastLimit) -> str:
    """What the manager logs and shows (status, dashboard) of ``cmd``: the worker, its
    limit, the highest RSS it reached, the categories it ran, and what to do."""
    cats = ", ".join(cmd.categories[:5]) + (" ..." if len(cmd.categories) > 5 else "")
    share = f"{cmd.peak / cmd.limit:.0%} of " if cmd.limit else ""
    return (
        f"worker {cmd.worker}: its RSS reached {size_text(cmd.peak)}, {share}its memory limit "
        f"of {size_text(cmd.limit)}, while it ran tasks of {cats or 'no known category'}; "
        f"{PAST_LIMIT_ADVICE}"
    )


def spill_refused_text(msg: WorkerMemoryReport) -> str:
    """What status, the console and the dashboard show of a worker whose spills found
    no disk room (``WorkerMemoryReport.spill_refused``): while it is connected."""
    when = time.strftime("%H:%M:%S", time.localtime(msg.spill_refused_at))
    n = msg.spill_refused
    return (
        f"worker {msg.worker_id}: spill refused: no disk room on {msg.spill_dir!r} ({n} "
        f"time{'s' * (n != 1)}, last at {when}: {msg.spill_refused_why or 'no room'}); "
        "its outputs stay in memory: past its throttle fence it starts no producer, and a "
        "pool whose every worker is so fails with MemoryStalled. Free space on that file "
        "system, give the worker a --spill-dir on a larger one, or a larger --disk"
    )


def copy_timeout(nbytes: int) -> float:
    """Seconds a copy of ``nbytes`` may take before the scheduler calls it failed."""
    return REPLICATE_TIMEOUT + max(nbytes, 0) / COPY_RATE_FLOOR


class Scheduler(Actor):
    """Owns :class:`SchedulerState`; the manager, workers and registry talk to it."""

    def __init__(
        self,
        # Not ActorRef[Manager] / ActorRef[FileRegistry]: naming them would import
        # actors.manager and actors.registry, which import this module to name the
        # scheduler, and the acyclic contract (pyproject.toml) counts TYPE_CHECKING imports.
        manager: Callable[[], ActorRef[Any]],
        registry: Callable[[], ActorRef[Any]],
        *,
        config: SchedulerConfig | None = None,
        policies: PolicyRegistry = REGISTRY,
        initial: dict[str, tuple[str, dict[str, Any]]] | None = None,
        cores_advice: str = CORES_FLAG,
        pool_keys: Collection[str] = (),
        monitor: Callable[[], ActorRef[Any] | None] = lambda: None,
    ) -> None:
        self.policy_registry = policies
        #: the end of a cores warning: what to change, ``{cpus}`` the CPUs (an embedded
        #: cluster's workers are sized by its keywords, not by --cores)
        self.cores_advice = cores_advice
        #: the configured pools (``[pools.NAME]``, ``Cluster(pools=...)``): a machine's
        #: warning tells their workers' users to set the pool's key (memory_per_worker,
        #: cores_per_worker), not a worker's flag they never pass
        self.pool_keys = frozenset(pool_keys)
        if "scaling" in (initial or {}):
            raise ValueError(
                "the scaling policy belongs to the autoscaler: choose it with "
                "set_policy('scaling', ...) once the cluster runs"
            )
        made = {
            kind: policies.create(kind, name, params)
            for kind, (name, params) in (initial or {}).items()
        }
        # the core times its policy calls on this timer (docs/policies.md, "Be fast")
        self.state = SchedulerState(config, **made, timer=time.perf_counter)
        self._manager = manager
        self._registry = registry
        #: the alert monitor, when the cluster runs one: told each worker that joins
        self._monitor = monitor
        #: worker id -> its reference: a local worker's, or the link to one in another
        #: process (so not narrowed)
        self.workers: dict[str, ActorRef[Any]] = {}
        #: leaving worker -> ``(key, worker)`` copies it made, until its WorkerGone
        self._evacuated: dict[str, tuple[Any, ...]] = {}
        self.infos: dict[str, WorkerInfo] = {}
        self.memory: dict[str, WorkerMemoryReport] = {}  #: worker id -> latest report
        #: pool -> bytes its workers ever spilled, those gone included (a counter: a
        #: worker that leaves keeps its share; one whose count starts again adds it)
        self.spilled: dict[str, int] = {}
        self._worker_waiters: list[tuple[int, anyio.Event]] = []
        #: host -> the warning in force that its workers claim more memory than it has;
        #: file system (:func:`~actors.shared_disk.disk_key`) -> that its workers count
        #: more of its free space than it has
        self.host_warnings: dict[str, str] = {}
        #: the workers on each file system and their disk budgets: the shell's, since
        #: only the manager's log and status say it (docs/files.md, "Workers sharing a
        #: file system")
        self.disks = HostLedger()
        #: what waits to be taken in, per client: pieces of graphs and parts of large
        #: releases (one per :class:`_Intake`, so the messages that came meanwhile go
        #: between them, the clients served in turn), and the releases and cancels
        #: that came after them; while it is not empty, one ``_Intake`` is on its way
        #: (:meth:`_take_in`)
        self._intake = _IntakeQueue()
        #: when the core is next ticked for a retry held for its backoff (inf: not
        #: asked): the ticks' period (``stall_timeout / 10``) may be longer than a backoff
        self._retry_wake = float("inf")

    async def on_start(self) -> None:
        self.start_soon(self._ticks)

    async def _ticks(self) -> None:
        """Tick the core (the stall watchdog) ten times per ``stall_timeout``."""
        period = max(0.05, self.state.config.stall_timeout / 10)
        tick = Envelope(_Tick(), "")
        while True:
            await anyio.sleep(period)
            if self.ref.mailbox.closed:
                return
            self.ref.mailbox.put_nowait(tick, force=True)

    async def wait_for_workers(self, n: int) -> None:
        """Return once at least ``n`` workers are registered."""
        if len(self.workers) < n:
            event = anyio.Event()
            self._worker_waiters.append((n, event))
            await event.wait()

    # -- feeding the core ------------------------------------------------------------

    def _handle(self, *events: Event) -> None:
        self._execute(self.state.handle(*events))
        held = self.state.retry_held
        if held and held[0][0] < self._retry_wake:
            self._retry_wake = held[0][0]
            self.start_soon(self._wake_for_retry, self._retry_wake)

    async def _wake_for_retry(self, due: float) -> None:
        """Tick the core at ``due`` (on its clock), when a retry held for its backoff
        is ready; the tick's handling asks for the next one."""
        await anyio.sleep(max(due - self.clock.now(), 0.0))
        if self._retry_wake == due:
            self._retry_wake = float("inf")
        if not self.ref.mailbox.closed:
            self.ref.mailbox.put_nowait(Envelope(_Tick(), ""), force=True)

    def _execute(self, commands: list[Command]) -> None:
        updates: list[Any] = []
        for cmd in commands:
            if type(cmd) is Execute:
                self._to_worker(cmd.worker, RunTasks(cmd.tasks))
            elif type(cmd) is FileFacts:
                self._registry().post(FileFactsMsg(cmd.facts))
            elif type(cmd) in (KeyDone, KeyErred, KeyCancelled, KeyTaken, KeysReused):
                updates.append(cmd)
            elif type(cmd) is CancelOnWorker:
                self._to_worker(cmd.worker, CancelTasks(cmd.keys))
            elif type(cmd) is DropData:
                self._to_worker(cmd.worker, DropKeys(cmd.keys))
            elif type(cmd) is RetireWorker:
                self.log.info("retiring drained worker", worker=cmd.worker, cause=cmd.cause)
                self._to_worker(cmd.worker, Stop(cmd.cause))
            elif type(cmd) is Evacuate:
                self._to_worker(cmd.worker, EvacuationPlan(cmd.moves))
            elif type(cmd) is Replicate:
                self.start_soon(self._replicate, cmd)
            elif type(cmd) is CopyCheckpoint:
                self.start_soon(self._copy_checkpoint, cmd)
            elif type(cmd) is DropCheckpoints:
                self._to_worker(cmd.worker, DropCheckpointsMsg(cmd.items))
            elif isinstance(cmd, DiskStallBegan | PlacementStallBegan):
                self._stall_began(cmd)
            elif isinstance(cmd, DiskStallEnded | PlacementStallEnded):
                kind = "disk" if type(cmd) is DiskStallEnded else "placement"
                self.log.info(
                    f"{kind} stall in pool {pool_name(cmd.stall.pool)} ended",
                    pool=cmd.stall.pool, seconds=round(cmd.lasted, 1),
                )  # fmt: skip
            elif isinstance(cmd, HostOvercommitted | HostOvercommitCleared):
                self._overcommit(cmd, disk=False)
            elif type(cmd) is DiskShared:
                self._disk_shared(cmd)
            elif type(cmd) is WorkerPastLimit:
                self._past_limit(cmd)
            elif type(cmd) is WorkerFloor:
                self._floor(cmd)
            elif type(cmd) is PolicyFailed:
                what = (
                    "replaced by the default" if cmd.replaced else "its built-in fallback answered"
                )
                self.log.error(
                    f"the {cmd.kind} policy failed: {what}", kind=cmd.kind, policy=cmd.policy,
                    problem=cmd.problem, errors=cmd.errors,
                )  # fmt: skip
            else:  # pragma: no cover - a new command without a shell is a bug
                raise TypeError(f"scheduler has no shell for {type(cmd).__name__}")
        if updates:
            self._manager().post(KeyUpdates(tuple(updates)))

    def _stall_began(self, cmd: DiskStallBegan | PlacementStallBegan) -> None:
        """A watchdog's stall, at WARNING: what it is, and its parts as fields (what
        to do among them)."""
        stall, pool = cmd.stall, pool_name(cmd.stall.pool)
        waited = f"{self.state.config.stall_timeout:g} s"
        if isinstance(cmd, DiskStallBegan):
            what = f"disk stall in pool {pool}: its workers ran nothing for {waited} while "
            what += "tasks wait for disk"
            parts = disk_stall_parts(cmd.stall)
        else:
            what = f"placement stall in pool {pool}: {cmd.stall.queued} ready tasks and an "
            what += f"idle worker, and nothing placed or finished for {waited}"
            parts = placement_stall_parts(cmd.stall)
        self.log.warning(what, pool=stall.pool, **parts)

    def _to_worker(self, worker: str, msg: Any) -> None:
        """Send to a worker. One that is gone already becomes a lost worker (by a message
        to ourselves, so the core hears of it as an event of its own); the message is
        dropped."""
        ref = self.workers.get(worker)
        if ref is None:
            return
        try:
            ref.post(msg)
        except ActorStopped:
            self.ref.post(WorkerGone(worker, "crash"))

    async def _replicate(self, cmd: Replicate) -> None:
        """Have the target copy the outputs from their holder through the copy path of
        data evacuation (``CopyFrom``), then tell the core what it holds."""
        got: tuple[Any, ...] = ()
        ref = self.workers.get(cmd.worker)
        if ref is not None:
            try:
                nbytes = sum(n for _, n in cmd.keys)
                reply = await ref.ask(CopyFrom(cmd.source, cmd.keys), timeout=copy_timeout(nbytes))
                if isinstance(reply, CopiesReply):
                    got = tuple(reply.got)
            except (CorralError, TimeoutError) as exc:
                self.log.warning("replicas not copied", worker=cmd.worker, error=str(exc))
            except Exception as exc:
                # Whatever the worker or the transport raised (not the core: it runs in
                # ``copied``), the copy failed: the core must still hear of it, or the
                # copy would count as on its way for ever. Logged as an error with its
                # traceback: an exception other than the two above is a bug to report.
                self.log.error(
                    "replicas not copied", worker=cmd.worker, error=repr(exc),
                    traceback="".join(traceback.format_exception(exc))[-4000:],
                )  # fmt: skip
        if not self.ref.mailbox.closed:
            asked = tuple(key for key, _ in cmd.keys)
            self.ref.post(_Copied(cmd.worker, asked, got), causal_id=cmd.stimulus_id or None)

    async def _copy_checkpoint(self, cmd: CopyCheckpoint) -> None:
        """Have a peer copy a checkpoint file from its owner's disk, then tell the core."""
        ok = False
        ref = self.workers.get(cmd.worker)
        if ref is not None:
            try:
                reply = await ref.ask(
                    FetchCheckpoint(cmd.source, cmd.key, cmd.seq, cmd.nbytes),
                    timeout=copy_timeout(cmd.nbytes),
                )
                ok = isinstance(reply, CheckpointFetched) and reply.ok
                if not ok:
                    why = getattr(reply, "reason", "")
                    self.log.warning("checkpoint not copied", worker=cmd.worker, reason=why)
            except Exception as exc:  # unreachable, timed out, killed mid-copy
                self.log.warning("checkpoint not copied", worker=cmd.worker, error=repr(exc))
        if not self.ref.mailbox.closed:
            self.ref.post(
                _CheckpointCopied(cmd.worker, cmd.key, cmd.seq, ok),
                causal_id=cmd.stimulus_id or None,
            )

    @handles(_CheckpointCopied)
    def checkpoint_copied(self, msg: _CheckpointCopied) -> None:
        self._handle(CheckpointCopied(*self._ev(), msg.worker, msg.key, msg.seq, msg.ok))

    @handles(_Copied)
    def copied(self, msg: _Copied) -> None:
        self._handle(ReplicasCopied(*self._ev(), msg.worker, msg.asked, msg.got))

    def _ev(self) -> tuple[str, float]:
        return current_causal_id(), self.clock.now()

    # -- handlers --------------------------------------------------------------------

    @handles(SubmitSpecs)
    def submit(self, msg: SubmitSpecs) -> tuple[tuple[str, ...], str]:
        """Take in a graph: its pieces (``runtime.graph.in_pieces``, made by the
        manager off the event loop) one per message handled, behind the graphs still
        being taken in. The answer (to a manager that asks: its submission names pools
        that are not configured, or has a task of no pool no configured pool's worker
        could run) comes at once: those of ``msg.unconfigured`` that no worker has
        joined, and, for ``msg.unplaced``, "" when a connected worker has enough, else
        what the connected workers have (``SchedulerState.short_workers``)."""
        stimulus = current_causal_id()
        wanted = frozenset(msg.wanted)
        unconfigured = msg.unconfigured

        last = len(msg.specs) - 1

        def piece(p: SpecPiece, i: int) -> Callable[[str], None]:
            keys = tuple(k for k in p.keys if k in wanted)
            echo = msg.echo if i == last else ()  # once the whole graph is in
            return lambda stimulus: self._handle(
                GraphSubmitted(
                    stimulus, self.clock.now(), p.specs, keys, i > 0, p.hold, p.unhold,
                    unconfigured, echo, msg.client, i == last, msg.run, msg.progress,
                )
            )  # fmt: skip

        empty = tuple(self.state.pools_without_worker(pool for pool, _ in unconfigured))
        short = self.state.short_workers(msg.unplaced) if msg.unplaced else ""
        turns = (
            _Turn(piece(p, i), stimulus, specs=p.specs, keys=(p.reads, p.keys))
            for i, p in enumerate(msg.specs)
        )
        self._queue(self._intake.job(msg.client, turns))
        return empty, short

    def _queue(self, job: _Job) -> None:
        """Add ``job`` to the intake; its first turn now if it may go (nothing before
        it that it waits for: the pieces of the graphs under way, its own client's
        too, wait for the next turn)."""
        busy = bool(self._intake)
        self._intake.add(job)
        if not busy:
            self._take_in()
        elif job.ready():  # (one _Intake is on its way already)
            self._take_in(job, again=False)

    @property
    def taking_in(self) -> bool:
        """Whether graphs or a large release are being taken in (:meth:`_take_in`)."""
        return bool(self._intake)

    @handles(_Intake)
    async def intake(self, msg: _Intake) -> None:
        # The actor yields to the event loop only every so many messages, and this one
        # posts itself again: the other actors and connections run between pieces.
        await anyio.lowlevel.checkpoint()
        self._take_in()

    def _take_in(self, job: _Job | None = None, *, again: bool = True) -> None:
        """Take in the next piece, of the next client in turn (of ``job`` only, when
        given), and carry out the releases and cancels before it; while anything is
        left, the next ``_Intake`` goes to the end of the mailbox (unless not
        ``again``: one is on its way)."""
        try:
            while (turn := self._intake.pop(job)) is not None:
                turn.apply(turn.stimulus)
                if turn.alone:
                    break
        finally:  # (a failure is the handler's, and the rest is still taken in)
            if again and self._intake and not self.ref.mailbox.closed:
                self.ref.post(_Intake())

    def _after_intake(
        self,
        apply: Callable[[str], Any],
        lane: str | None = None,
        keys: Collection[Any] = (),
        before: Iterable[_Turn] = (),
    ) -> Later | None:
        """``apply(stimulus)`` (after ``before``, turns of their own) now, or, while
        jobs it must wait for are being taken in (``lane``'s, the other clients' that
        bring or read ``keys``; with no ``lane``, every one), once they are (as the
        manager sent them: a release or cancel of their keys finds them whole);
        ``Later`` of its answer then."""
        stimulus = current_causal_id()
        first = list(before)
        job = self._intake.job(lane, [*first, _Turn(apply, stimulus, alone=False, keys=(keys,))])
        if not first and job.ready():
            return apply(stimulus)  # type: ignore[no-any-return]
        done = anyio.Event()
        box: list[Any] = []
        failed: list[Exception] = []

        def run(stimulus: str) -> None:
            try:
                box.append(apply(stimulus))
            except Exception as exc:  # the request's failure, its asker's to see (rule 1)
                failed.append(exc)
            finally:
                done.set()

        async def answer() -> Any:
            await done.wait()
            if failed:
                raise failed[0]
            return box[0]

        job.turns[-1] = _Turn(run, stimulus, alone=False, keys=(keys,))
        self._queue(job)
        return Later(answer())

    @handles(RegisterWorker)
    def register(self, msg: RegisterWorker) -> None:
        info: WorkerInfo = msg.info
        self.workers[info.worker_id] = msg.ref
        self.infos[info.worker_id] = info
        self.log.info("worker joined", worker=info.worker_id, cores=info.cores, pool=info.pool)
        monitor = self._monitor()
        if monitor is not None:  # (its metrics ask comes after this handler: it sees it)
            with contextlib.suppress(ActorStopped):
                monitor.post(WorkerArrived())
        waiting = []
        for n, event in self._worker_waiters:
            if len(self.workers) >= n:
                event.set()
            else:
                waiting.append((n, event))
        self._worker_waiters = waiting
        # Its deadline (wall clock) on the core's clock.
        deadline = self.clock.now() + (info.deadline - time.time()) if info.deadline else None
        key = disk_key(info)
        if key:  # what that file system has free: the most one of its workers saw
            free = max(i.disk_fs_free for i in self.infos.values() if disk_key(i) == key)
            self.disks.joined(
                info.worker_id, key, free, disk_claim(info), info.pid, self.clock.now()
            )
        # After the warning's ledger: the core's new shares (DiskShared) replace the
        # claims of the workers without --disk there.
        self._handle(
            WorkerJoined(
                *self._ev(), info.worker_id, info.cores, info.memory, info.pool, deadline,
                info.disk, info.block, info.host, info.host_memory, info.pid,
                key, info.disk_fs_free, info.disk_auto, info.host_cpus, info.spills,
                info.execution == "process",
            )
        )  # fmt: skip
        # Rejoined over a new connection: what was in flight on the old one is lost, so
        # it is asked what arrived. Joined as new: it may be a worker declared lost that
        # came back, holding outputs (files on its disk) nothing tracks now: asked too,
        # and told to drop them (a fresh worker holds nothing: an empty answer).
        msg.ref.post(ConfirmHolds())

    @handles(DataMissing)
    def data_missing(self, msg: DataMissing) -> None:
        self._handle(ReplicasMissing(*self._ev(), msg.worker_id, msg.keys, msg.reached))

    @handles(DataDelivered)
    def data_delivered(self, msg: DataDelivered) -> None:
        self._handle(ValuesDelivered(*self._ev(), msg.keys))

    @handles(WorkerHolds)
    def worker_holds(self, msg: WorkerHolds) -> None:
        self._handle(WorkerHeld(*self._ev(), msg.worker_id, frozenset(msg.active), msg.held))

    @handles(WorkersSuspended)
    def workers_suspended(self, msg: WorkersSuspended) -> None:
        """The batch system suspended (or resumed) a block: its workers take no new
        tasks (or take them again)."""
        self._handle(Suspended(*self._ev(), tuple(msg.workers), msg.suspended))

    @handles(WorkersStopping)
    def workers_stopping(self, msg: WorkersStopping) -> None:
        """The autoscaler stops these workers' blocks because the cluster shuts down:
        they leave as ``shutdown``, not as the preemption their stop signal reads as."""
        self._handle(StoppedWithCluster(*self._ev(), tuple(msg.workers)))

    @handles(ClusterStopping)
    def cluster_stopping(self, msg: ClusterStopping) -> None:
        """The cluster stops on purpose, its workers next: the run's tasks end now
        (those not finished cancelled, and those a graph brings later as they come), so
        that the workers' going loses nothing."""
        self._handle(ClusterStops(*self._ev()))

    @handles(PolicyNote)
    def policy_note(self, msg: PolicyNote) -> None:
        """The autoscaler's scaling policy failed: a line in the cluster's story."""
        self._handle(PolicyNoted(*self._ev(), msg.problem))

    @handles(ScalingSwapped)
    def scaling_swapped(self, msg: ScalingSwapped) -> None:
        """The autoscaler's scaling policy was swapped: a line in the cluster's story,
        a record of the monitoring feed."""
        self._handle(ScalingChanged(*self._ev(), msg.name, dict(msg.params), msg.by))

    @handles(WorkerDropped)
    def worker_dropped(self, msg: WorkerDropped) -> None:
        """A worker's connection dropped and its id is held for its rejoin: away (no
        new work, its cores not counted) from now, the end of its life if it is lost."""
        if msg.worker_id in self.workers:
            self._handle(WorkerAway(*self._ev(), msg.worker_id))

    @handles(WorkerGone)
    def worker_gone(self, msg: WorkerGone) -> None:
        if self.workers.pop(msg.worker_id, None) is None:
            return
        # One that went silent while its block was suspended is lost as ``suspended``.
        msg = WorkerGone(msg.worker_id, self.state.lost_cause(msg.worker_id, msg.cause))
        self.infos.pop(msg.worker_id, None)
        self.disks.left(msg.worker_id, self.clock.now())
        self.memory.pop(msg.worker_id, None)
        self.host_warnings.pop(f"{msg.worker_id} spill", None)  # its warning ends with it
        # A worker drained, past its walltime or shut down with the cluster left as
        # planned; anything else is a loss worth a warning.
        planned = msg.cause in ON_PURPOSE
        if planned:
            self.log.info("worker left", worker=msg.worker_id, cause=msg.cause)
            ws = self.state.workers.get(msg.worker_id)
            # The tasks it executed, cut short by its walltime: each is retried, or
            # fails if it is too long for the walltime (TaskLongerThanWalltime).
            cut = [] if ws is None or msg.cause != "walltime" else _executed(ws)
            if ws is not None and cut:
                self.log.warning(
                    "tasks ran into the walltime", worker=msg.worker_id, pool=ws.pool,
                    running=cut[:LOST_NAMES], more=max(0, len(cut) - LOST_NAMES),
                )  # fmt: skip
        else:
            # What it was running may be what killed it (a poison task): named here.
            ws = self.state.workers.get(msg.worker_id)
            running = sorted(str(ts.key) for ts in ws.processing) if ws is not None else []
            self.log.warning(
                "worker lost", worker=msg.worker_id, cause=msg.cause,
                running=running[:LOST_NAMES], more=max(0, len(running) - LOST_NAMES),
            )  # fmt: skip
        evacuated = self._evacuated.pop(msg.worker_id, ())
        self._handle(WorkerLeft(*self._ev(), msg.worker_id, msg.cause, evacuated))

    @handles(Leaving)
    def leaving(self, msg: Leaving) -> None:
        """A worker about to go: no new tasks for it; its plan of copies goes back."""
        self.log.info("worker leaving", worker=msg.worker_id, cause=msg.cause)
        executing = frozenset(msg.executing) if msg.executing is not None else None
        executed = tuple(zip(msg.executing or (), msg.executed or (), strict=False))
        self._handle(WorkerLeaving(*self._ev(), msg.worker_id, msg.cause, executing, executed))

    @handles(Evacuated)
    def evacuated(self, msg: Evacuated) -> None:
        """Copies a leaving worker made; they count once its WorkerGone comes (the same
        connection: in order)."""
        if msg.worker_id in self.workers:
            self._evacuated[msg.worker_id] = tuple(msg.moves)

    @handles(CheckpointSaved)
    def checkpoint_saved(self, msg: CheckpointSaved) -> None:
        if msg.worker_id in self.workers:
            self._handle(
                TaskCheckpointed(*self._ev(), msg.worker_id, msg.key, msg.seq, msg.nbytes, msg.data)
            )

    @handles(OutputUnpicklable)
    def output_unpicklable(self, msg: OutputUnpicklable) -> None:
        ev = OutputUnreadable(*self._ev(), msg.worker_id, msg.key, msg.reason, msg.to)
        self._handle(ev)

    @handles(TasksDone)
    def tasks_done(self, msg: TasksDone) -> None:
        self._handle(TasksFinished(*self._ev(), msg.worker_id, msg.results, msg.rss))

    @handles(TasksStarted)
    def tasks_started(self, msg: TasksStarted) -> None:
        self._handle(TasksRunning(*self._ev(), msg.worker_id, msg.started))

    @handles(WorkerMemoryReport)
    def worker_memory(self, msg: WorkerMemoryReport) -> None:
        if msg.worker_id not in self.workers:
            return
        before = self.memory.get(msg.worker_id)
        grown = msg.spilled_total - (before.spilled_total if before is not None else 0)
        ws = self.state.workers.get(msg.worker_id)
        if ws is not None:  # a count lower than before started again: all of it is new
            added = grown if grown >= 0 else msg.spilled_total
            self.spilled[ws.pool] = self.spilled.get(ws.pool, 0) + added
        self.memory[msg.worker_id] = msg
        # Disk used, as placement counts it: what the worker says is no longer free, of
        # the budget the core places within (its share, for a worker without --disk
        # on a file system shared: docs/files.md#workers-sharing-a-file-system).
        disk = ws.disk if ws is not None else 0
        own = used = max(msg.spilled_bytes, msg.disk_used)
        if disk and msg.disk_free is not None:
            used = max(used, disk - msg.disk_free)
        self._handle(
            WorkerMemory(
                *self._ev(), msg.worker_id, msg.throttled, msg.rss, msg.throttle_at, msg.limit,
                used, msg.memory_bytes, msg.past_peak, msg.abandoned, msg.held,
                msg.floor, msg.floor_warning, used - own,
                msg.spill_refused, msg.spill_dir, msg.terminate_at,
            )
        )  # fmt: skip
        if msg.spill_refused:  # (status()["warnings"], the console, the dashboard)
            self.host_warnings[f"{msg.worker_id} spill"] = spill_refused_text(msg)

    @handles(_Tick)
    def tick(self, msg: _Tick) -> None:
        # The watchdog has nothing to watch unless a worker is throttled; the walltime
        # drain nothing unless a worker has a deadline; speculation nothing with one
        # worker or when off; the held tasks nothing unless one backs off (or a retry
        # is held for its backoff); the disk watchdog nothing unless a task waits for disk;
        # the outputs a gather could not reach nothing unless there is one.
        st = self.state
        if (
            st.throttled or st.deadlines or st.speculates or st.held or st.retry_held
            or st.disk_parked or st.unreached
            or st.hosts.pending or st.host_cores.pending
        ):  # fmt: skip
            self._handle(Tick(*self._ev()))
        if self.disks.pending:
            for cmd in self.disks.check(self.clock.now(), current_causal_id()):
                self._overcommit(cmd, disk=True)

    def _disk_shared(self, cmd: DiskShared) -> None:
        """Log the new disk shares of a file system's workers without --disk, and count
        each one's share, not all the free space, in the file system's warning."""
        self.log.info(
            "workers share their file system's free space", filesystem=cmd.filesystem,
            shares=dict(cmd.shares), budget=cmd.budget, explicit=cmd.explicit,
            text=disk_shared_text(cmd),
        )  # fmt: skip
        now = self.clock.now()
        for worker, share in cmd.shares:
            info = self.infos.get(worker)
            if info is None or self.disks.where.get(worker) != cmd.filesystem:
                continue
            free = self.disks.memory.get(cmd.filesystem, info.disk_fs_free)
            self.disks.joined(worker, cmd.filesystem, free, share, info.pid, now)

    def _overcommit(self, cmd: HostOvercommitted | HostOvercommitCleared, disk: bool) -> None:
        """Log at WARNING and show (``status()["warnings"]``) a machine whose workers
        claim more memory than it has (the core's ``HostLedger``; or declare more cores
        than it has CPUs, ``resource`` ``"cores"``), or with ``disk`` a
        file system whose workers count more of its free space than it has
        (:attr:`disks`); or the end of that warning, as an alert's resolution."""
        cores = cmd.resource == "cores"
        where, total, said = (
            ("filesystem", "free", "count more disk than their file system has free")
            if disk
            else ("host", "cpus", "declare more cores than their host has CPUs")
            if cores
            else ("host", "host_memory", "claim more memory than their host has")
        )
        # a host's cores warning beside its memory warning, under a key of its own
        key = f"{cmd.host} cores" if cores else cmd.host
        if isinstance(cmd, HostOvercommitted):
            pools, by_hand = self._pools_of(cmd)
            text = (
                shared_disk_text(cmd)
                if disk
                else cores_overcommit_text(cmd, self.cores_advice, pools, by_hand)
                if cores
                else overcommit_text(cmd, pools, by_hand)
            )
            self.host_warnings[key] = text
            workers = [w for w, _ in cmd.workers]
            self.log.warning(
                f"workers {said}",
                **{where: cmd.host, "workers": workers, "claimed": cmd.claimed},
                **{total: cmd.host_memory, "warning": text},
            )
        elif isinstance(cmd, HostOvercommitCleared):
            self.host_warnings.pop(key, None)
            self.log.warning(
                f"workers no longer {said}", **{where: cmd.host, "workers": list(cmd.workers)}
            )

    def _pools_of(self, cmd: HostOvercommitted) -> tuple[tuple[str, ...], bool]:
        """The configured pools (:attr:`pool_keys`) whose blocks' workers ``cmd``
        names, sorted; and whether it names any other worker (one started by hand)."""
        pools: set[str] = set()
        by_hand = False
        for worker, _ in cmd.workers:
            info = self.infos.get(worker)
            if info is not None and info.block and info.pool in self.pool_keys:
                pools.add(info.pool)
            else:
                by_hand = True
        return tuple(sorted(pools)), by_hand

    def _past_limit(self, cmd: WorkerPastLimit) -> None:
        """Log at WARNING and show (``status()["warnings"]``) a worker that ran past its
        terminate fence with its tasks in threads, at its highest yet; forget it when
        the worker leaves (``peak`` 0)."""
        key = f"{cmd.worker} memory"
        if not cmd.peak:
            self.host_warnings.pop(key, None)
            return
        text = past_limit_text(cmd)
        self.host_warnings[key] = text
        if not cmd.log:  # a higher peak, shown; logged at the first and at each doubling
            return
        self.log.warning(
            "worker past its memory limit: its tasks run in threads and cannot be killed",
            worker=cmd.worker, limit=cmd.limit, peak=cmd.peak,
            categories=list(cmd.categories), warning=text,
        )  # fmt: skip

    def _floor(self, cmd: WorkerFloor) -> None:
        """Show (``status()["warnings"]``) a worker whose floor, memory that is not
        outputs, is at or past its resume mark, as its own log said; forget it when the
        floor falls under that mark or the worker leaves (``floor`` 0)."""
        key = f"{cmd.worker} floor"
        if cmd.floor and cmd.warning:
            self.host_warnings[key] = f"worker {cmd.worker}: {cmd.warning}"
        else:
            self.host_warnings.pop(key, None)

    @handles(CancelRequest)
    def cancel(self, msg: CancelRequest) -> Any:
        """Cancel; answers the keys spared because keys in ``msg.spare`` need them."""
        return self._cancel_soon(msg, 0)

    @handles(OperatorCancel)
    def operator_cancel(self, msg: OperatorCancel) -> Any:
        """The console's cancel; answers how many of its keys were still to do (what
        it cancelled), counted in the same turn as the cancel."""
        return self._cancel_soon(msg, 1)

    def _cancel_soon(self, msg: CancelRequest | OperatorCancel, answer: int) -> Any:
        """Cancel now, during an intake too: the core cancels the tasks it has, and
        those the pieces still to take in bring as they come (``coming``), so nothing
        of the cancelled keys is sent to a worker once the cancel is here (before, the
        cancel waited for the whole graph: a minute for 300,000 tasks, the taken-in
        pieces running meanwhile). A cancel that spares keys which pieces still to
        come bring waits for the intake (what it spares depends on their tasks).
        ``answer``: of :meth:`_cancel_now`'s answer."""
        coming = self._coming(msg.keys)
        if isinstance(msg, CancelRequest) and msg.spare and coming and self._brings(msg.spare):
            return self._after_intake(lambda stimulus: self._cancel_now(msg, stimulus)[answer])
        return self._cancel_now(msg, current_causal_id(), coming)[answer]

    def _coming(self, keys: Iterable[Any]) -> tuple[Any, ...]:
        """Those of ``keys`` that the pieces still to take in bring, once per piece."""
        pieces = [t.specs for t in self._intake.turns() if t.specs is not None]
        if not pieces:
            return ()
        asked = set(keys)
        return tuple(k for specs in pieces for k in specs.keys() & asked)

    def _brings(self, keys: Iterable[Any]) -> bool:
        """Whether a piece still to take in brings one of ``keys``."""
        some = set(keys)
        turns = self._intake.turns()
        return any(not some.isdisjoint(t.specs) for t in turns if t.specs is not None)

    def _cancel_now(
        self, msg: CancelRequest | OperatorCancel, stimulus: str, coming: tuple[Any, ...] = ()
    ) -> tuple[tuple[Any, ...], int]:
        """Cancel ``msg.keys`` (and, as they come, ``coming``: see ``CancelRequested``):
        the keys spared (what keys in ``msg.spare`` need) and how many of the keys were
        still to do."""
        spare = frozenset(msg.spare) if isinstance(msg, CancelRequest) else frozenset()
        to_do = self.state.count_active(msg.keys, coming)
        ev = CancelRequested(stimulus, self.clock.now(), msg.keys, msg.reason, spare, coming)
        commands = self.state.handle(ev)
        spared = tuple(k for c in commands if type(c) is CancelSpared for k in c.keys)
        self._execute([c for c in commands if type(c) is not CancelSpared])
        return spared, to_do

    @handles(ReleaseKeysRequest)
    def release(self, msg: ReleaseKeysRequest) -> Any:
        """Let go of keys; a release of more than ``INTAKE_PIECE`` keys (the end of a
        large run) in parts of that many, one per turn as the pieces of a graph, so
        that the messages meanwhile (results, status, metrics) go between them. The
        answer comes after the last part, and what its client sent after the release
        (a submission), or another client's request touching its keys, waits for it."""
        keys = tuple(msg.keys)
        step = runtime.graph.INTAKE_PIECE
        stimulus = current_causal_id()

        def part(some: tuple[Any, ...]) -> Callable[[str], Any]:
            return lambda stimulus: self._handle(KeysReleased(stimulus, self.clock.now(), some))

        last = max(0, (len(keys) - 1) // step * step)  # where the last part starts
        parts = (
            _Turn(part(keys[i : i + step]), stimulus, keys=(keys[i : i + step],))
            for i in range(0, last, step)
        )
        # the last part answers
        return self._after_intake(part(keys[last:]), msg.client, keys[last:], parts)

    @handles(FilesReleasedMsg)
    def files_released(self, msg: FilesReleasedMsg) -> None:
        self._handle(FilesReleased(*self._ev(), msg.keys))

    @handles(SetPolicyRequest)
    def set_policy(self, msg: SetPolicyRequest) -> PolicyInfo:
        if msg.kind == "scaling":  # a kind of the registry, but not the scheduler's
            raise ValueError("the scaling policy belongs to the autoscaler, not the scheduler")
        policy = self.policy_registry.create(msg.kind, msg.name, msg.params)
        self._handle(PolicyChanged(*self._ev(), msg.kind, policy, msg.by))
        return self.policy_registry.info(msg.kind, policy)

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> dict[str, Any]:
        """The scheduler's fields of a ``StatusReply``, by name (typed values)."""
        st = self.state  # counters kept by the core: no scan of the tasks
        stalls = st.disk_stalls.values()
        placement = st.placement_stalls.values()
        queues = st.queued_by_pool()
        # (a bare core in tests has no clock)
        now = self.clock.now() if stalls or placement or st.throttled or queues else 0.0
        return {
            "workers": tuple(self.infos.values()),
            **self._workers_now(),
            # each worker's RSS with its task processes, as the core last heard it
            "rss": {w: ws.rss for w, ws in st.workers.items() if ws.rss},
            "memory": dict(self.memory),
            "throttled": tuple(sorted(st.throttled)),
            "throttled_seconds": st.throttled_seconds(now),
            "tasks_by_state": st.by_state,
            "queued": st.count("queued"),
            "queues": queues,  #: ready tasks per pool ("*": any pool)
            "queue_oldest_wait": {pool: st.oldest_wait(pool, now) for pool in queues},
            "held_back": sum(st.held_back().values()),
            "retry_held": sum(st.retry_held_by_pool().values()),
            "categories": (
                {c: CategoryStatus(**_stats(s)) for c, s in _top(st.stats, msg.top_categories)}
                if msg.categories
                else {}
            ),
            "categories_known": len(st.stats),
            "survival": {pool: _life(st.survival(pool)) for pool in st.pools()},
            "policies": _policy_names(st),
            "policy_params": {k: ps for k, p in st.policies.items() if (ps := param_values(p))},
            "policy_errors": st.policy_errors,
            "policy_errors_by": dict(st.problems.by),
            "policy_problems": dict(st.problems.problem),
            "policy_failing": dict(st.failing),
            "replicas": _replicas(st),
            "storage": self._storage(),
            "speculative": dict(st.speculative),
            "checkpoints": _checkpoints(st),
            "disk_stalls": tuple(dataclasses.replace(d, stalled_for=now - d.since) for d in stalls),
            "disk_full_tries": st.disk_full_tries,
            "disk_full_failed": st.disk_full_failed,
            "disk_stalls_total": dict(st.disk_stall_count),
            "disk_dropped": st.disk_dropped,
            "placement_stalls": tuple(
                dataclasses.replace(p, stalled_for=now - p.since) for p in placement
            ),
            "placement_stalls_total": dict(st.placement_stall_count),
            "warnings": tuple(self.host_warnings[h] for h in sorted(self.host_warnings)),
            "crash_suspects": st.crash_suspects(),
            "contained_suspects": st.contained_suspects(),
        }

    def _storage(self) -> StorageStatus:
        """Storage over time: the core's ledger with each worker's latest report."""
        st = self.state
        led = st.storage
        workers = {}
        for wid in sorted({*st.workers, *led.bytes_in, *led.bytes_out, *led.disk_peak}):
            ws = st.workers.get(wid)
            report = self.memory.get(wid) if ws is not None else None
            workers[wid] = WorkerStorage(
                disk=ws.disk if ws is not None else 0,
                disk_used=led.disk_used.get(wid, 0),
                disk_peak=led.disk_peak.get(wid, 0),
                disk_free=self._disk_free(ws, report),
                memory_bytes=report.memory_bytes if report is not None else 0,
                bytes_in=led.bytes_in[wid],
                bytes_out=led.bytes_out[wid],
                recoveries=led.lost_by_worker[wid],
            )
        return StorageStatus(
            dict(led.transfers), dict(led.transfer_bytes), dict(led.recoveries), workers
        )

    @handles(UpcomingRequest)
    def upcoming(self, msg: UpcomingRequest) -> dict[str, list[float]]:
        """The next wave per pool, for the autoscaler's lookahead (from the core's wave
        sets: a bounded look at them, never a scan of every task)."""
        return self.state.upcoming(self.clock.now(), max(int(msg.most), 0))

    @handles(DemandRequest)
    def demand(self, msg: DemandRequest) -> dict[str, Any]:
        """What the autoscaler reads every tick, from one turn (from the core's
        counters): the queues, the workers' tasks and drains, and per configured pool
        the ready tasks its workers could never run."""
        st = self.state
        return {**self._workers_now(), "queues": st.queued_by_pool(), "unfit": st.unfit_by_pool()}

    def _workers_now(self) -> dict[str, Any]:
        """The workers' tasks in hand and the sets of those draining, retired, leaving,
        away, drained for their walltime or their tasks_per_worker, by worker id."""
        st = self.state
        return {
            "processing": {w: len(ws.processing) for w, ws in st.workers.items()},
            "draining": tuple(sorted(w for w, ws in st.workers.items() if ws.draining)),
            "retired": tuple(sorted(w for w, ws in st.workers.items() if ws.retired)),
            "leaving": tuple(sorted(w for w, ws in st.workers.items() if ws.leaving)),
            "away": tuple(sorted(w for w, ws in st.workers.items() if ws.away is not None)),
            "walltime_draining": tuple(
                sorted(w for w, ws in st.workers.items() if ws.walltime_drain)
            ),
            "spent_draining": tuple(sorted(w for w, ws in st.workers.items() if st.spent(ws))),
        }

    @handles(MetricsRequest)
    def metrics(self, msg: MetricsRequest) -> dict[str, Any]:
        """The scheduler's fields of a ``MetricsReply``: from the core's counters, its
        workers and their latest memory reports (never a scan of the tasks)."""
        st = self.state
        now = self.clock.now()
        pools = st.pool_metrics(now, msg.pools)
        for wid, report in self.memory.items():
            ws = st.workers.get(wid)
            if ws is None:
                continue
            m = pools[ws.pool]  # pool_metrics has every worker's pool
            m["memory_bytes"] = m.get("memory_bytes", 0) + report.memory_bytes
            m["spilled_bytes"] = m.get("spilled_bytes", 0) + report.spilled_bytes
        for pool, total in self.spilled.items():
            if pool in pools:
                pools[pool]["spilled_total"] = total
        disks = {wid: self._disk_metrics(ws) for wid, ws in st.workers.items()}
        # Per label, as the core keeps them (at most MAX_METRIC_CATEGORIES + 1 labels):
        # a scrape's cost does not grow with the number of categories.
        categories = {
            name: CategoryMetrics(
                m.finished, m.duration_sum, m.output_bytes, m.input_bytes, m.peak_rss
            )
            for name, m in st.metric_totals.items()
        }
        failures = sorted(st.metric_failures.items())
        out: dict[str, Any] = {
            "pools": {p: PoolMetrics(**m) for p, m in pools.items()},
            "categories": categories,
            "failures": tuple(FailureCount(*key, n) for key, n in failures),
            "tasks_by_state": {**dict.fromkeys(_STATES, 0), **st.by_state},  # 0s stay
            "tasks_created": st.created,
            # connected: a worker away (its connection dropped, its id held) is not
            "workers": sum(ws.away is None for ws in st.workers.values()),
            "disks": disks,
            "replicas": _replicas(st),
            "speculative": dict(st.speculative),
            "policy_errors": st.problems.counts(_policy_names(st).items()),
        }
        if msg.details:  # the dashboard's: not for every Prometheus scrape
            out["failure_groups"] = _failure_groups(st, now)
            out["failure_groups_total"] = len(st.failure_groups) + len(st.not_run_groups)
            out["free_groups"] = _failure_groups(st, now, free=True)
            out["free_groups_total"] = len(st.free_groups)
            first = st.tries_ended - len(st.recent_tries) + 1  # the oldest one's number
            out["recent_tries"] = tuple(
                _recent_try(r, category, now - at, first + i)
                for i, (r, category, at) in enumerate(st.recent_tries)
            )
        return out

    def _disk_metrics(self, ws: WorkerState) -> WorkerDiskMetrics:
        """``ws``'s disk as the core and its latest report have it (no task scanned):
        before its first report, a worker with a limit has that limit less what the
        core counts used."""
        report = self.memory.get(ws.id)
        free = self._disk_free(ws, report)
        if free is None and ws.disk:
            free = max(0, ws.disk - ws.disk_used)
        return WorkerDiskMetrics(ws.pool, ws.disk, ws.disk_used, free)

    def _disk_free(self, ws: WorkerState | None, report: WorkerMemoryReport | None) -> int | None:
        """The disk free that ``ws``'s latest report says (None: no report, or not
        counted); for a worker without --disk, at most what its share leaves, as the
        core places (docs/files.md#workers-sharing-a-file-system): the worker counts
        its whole measured budget."""
        if ws is None or report is None or report.disk_free is None:
            return None
        info = self.infos.get(ws.id)
        if info is not None and info.disk_auto and ws.disk:
            return max(0, min(report.disk_free, ws.disk - ws.disk_used))
        return report.disk_free

    @handles(MonitorFeed)
    def monitor_feed(self, msg: MonitorFeed) -> MonitorFeedReply:
        """The core's monitoring events from ``msg.since`` on, and each worker's latest
        memory numbers (for the monitoring database: runtime/monitordb.py)."""
        events, nxt, lost = self.state.feed_since(msg.since, msg.limit)
        workers: dict[str, tuple[int, int, int, int | None, int]] = {}
        for wid, ws in self.state.workers.items():
            report = self.memory.get(wid)
            if report is None:
                if not ws.rss:
                    continue  # not measured yet (it just joined or joined again): no sample
                workers[wid] = (ws.rss, 0, 0, None, ws.disk)
            else:
                workers[wid] = (
                    ws.rss, report.memory_bytes, report.spilled_bytes,
                    self._disk_free(ws, report), ws.disk,
                )  # fmt: skip
        wall = time.time() - self.clock.now()
        capacity = self.state.config.feed_length
        return MonitorFeedReply(tuple(events), nxt, lost, wall, workers, capacity)

    @handles(WaitForWorkersRequest)
    def workers_ready(self, msg: WaitForWorkersRequest) -> Later:
        async def ready() -> int:
            await self.wait_for_workers(msg.n)
            return len(self.workers)

        return Later(ready())

    @handles(RunTargets)
    def run_targets(self, msg: RunTargets) -> tuple[tuple[str, Any], ...]:
        """The workers a ``Cluster.run`` call goes to, as the core chooses them, with
        their references (None for one whose reference is gone already)."""
        return tuple((wid, self.workers.get(wid)) for wid in self.state.run_targets(msg.workers))

    @handles(StoryRequest)
    def story(self, msg: StoryRequest) -> list[tuple[Any, ...]]:
        return self.state.story(*msg.keys)

    # -- console queries and commands ------------------------------------------------

    @handles(StoryQuery)
    def story_query(self, msg: StoryQuery) -> list[list[str]]:
        """Transitions of the keys whose text (``str(key)``) is in ``msg.keys``, as text:
        ``[key, start, finish, stimulus id, time]``, the latest ``limit``. Worker ids
        match too (their joins, drains and departures are logged under the worker id).

        Bounded: each text is turned back into the key it was printed from (the text
        itself, or the literal it spells, such as a tuple), so the log is searched by
        hash, never by printing each of its entries."""
        if not 0 < msg.limit <= MAX_LISTING:
            raise ValueError(f"limit must be 1 to {MAX_LISTING}, got {msg.limit}")
        if len(msg.keys) > MAX_STORY_KEYS:
            raise ValueError(f"at most {MAX_STORY_KEYS} keys per story query, got {len(msg.keys)}")
        wanted: set[Any] = set()
        for text in msg.keys:
            wanted.add(text)
            with contextlib.suppress(
                ValueError, SyntaxError, TypeError, MemoryError, RecursionError
            ):
                key = ast.literal_eval(text) if len(text) < 10_000 else None
                if key is not None:
                    hash(key)
                    wanted.add(key)
        rows = self.state.story(*wanted)[-msg.limit :]
        return [
            [str(k), str(start), str(finish), str(stim), f"{now:.6f}"]
            for k, start, finish, stim, now in rows
            if str(k) in msg.keys
        ]

    @handles(ProgressQuery)
    def progress_query(self, msg: ProgressQuery) -> dict[str, Any] | None:
        """How far run ``msg.run`` is (the core's ``ProgressAnswer`` to a
        ``ProgressAsked``: the answer hands the keys that ended over, once)."""
        ev = ProgressAsked(current_causal_id(), self.clock.now(), msg.run, msg.stop)
        commands = self.state.handle(ev)
        answer = next(c for c in commands if type(c) is ProgressAnswer)
        self._execute([c for c in commands if type(c) is not ProgressAnswer])
        return answer.counts

    @handles(TasksQuery)
    def tasks_query(self, msg: TasksQuery) -> tuple[TaskRecord, ...]:
        """Up to ``limit`` tasks (0: a page, ``MAX_LISTING``) in ``state``,
        ``category``, of ``client`` and of ``pool`` (``None``: any), after the first
        ``offset`` that match."""
        if not 0 <= msg.limit <= MAX_LISTING:
            raise ValueError(f"limit must be 0 to {MAX_LISTING} (0: a page), got {msg.limit}")
        if msg.offset < 0:
            raise ValueError(f"offset must be >= 0, got {msg.offset}")
        if msg.state is not None and msg.state not in _STATES:
            raise ValueError(f"unknown task state {msg.state!r}; choose from {', '.join(_STATES)}")
        if msg.pool is not None:
            self.check_listed_pool(msg.pool)
        return tuple(
            self.task_records(
                msg.state, msg.category, msg.limit or MAX_LISTING, msg.offset, msg.client,
                msg.pool,
            )
        )  # fmt: skip

    def check_listed_pool(self, pool: str) -> None:
        """``ValueError`` for a pool a task listing asks for that is no pool's name
        (``pool_name_problem``), or that the scheduler does not know: not configured,
        no worker's, no task's (a misspelling, most likely: the pools it knows, and the
        closest)."""
        if pool_name_problem(pool):
            raise ValueError(
                f"{self.state.move_refusal(pool)}; name one pool, or leave the pool out for "
                "the tasks of every pool"
            )
        refusal = self.state.move_refusal(pool)
        if refusal:
            raise ValueError(refusal)

    def task_records(
        self,
        state: str | None = None,
        category: str | None = None,
        limit: int = 0,
        offset: int = 0,
        client: str | None = None,
        pool: str | None = None,
    ) -> list[TaskRecord]:
        out: list[TaskRecord] = []
        skip = offset
        for ts in self.state.tasks.values():
            if (
                (state is not None and ts.state != state)
                or (category is not None and ts.category != category)
                or (client is not None and client_name(ts.client) != client)
                or (pool is not None and ts.spec.pool != pool)
            ):
                continue
            if skip:
                skip -= 1
                continue
            worker = ts.worker
            if worker is None and ts.who_has:
                worker = min(ts.who_has)  # where its output is
            # the tries made: those ended, and the one under way (a running first try is 1)
            tries = len(ts.tries) + (ts.state == "processing")
            by = client_name(ts.client)
            ended = ts.state in ("erred", "cancelled") and ts.error is not None
            why = error_line(ts.error) if ended and ts.error is not None else ""
            out.append(
                TaskRecord(str(ts.key), ts.state, ts.category, worker, tries, by, ts.spec.pool, why)
            )
            if limit and len(out) >= limit:
                break
        return out

    @handles(PolicyQuery)
    def policy_query(self, msg: PolicyQuery) -> tuple[PolicyInfo, ...]:
        """Per kind: the policy in use and the names one may switch to."""
        return tuple(
            self.policy_registry.info(kind, policy) for kind, policy in self.state.policies.items()
        )

    @handles(DrainRequest)
    def drain(self, msg: DrainRequest) -> dict[str, Any]:
        """Stop giving ``msg.worker`` tasks; it is told to stop once its tasks finish."""
        ws = self.state.workers.get(msg.worker)
        if ws is None:
            known = ", ".join(sorted(self.state.workers)) or "none"
            raise ValueError(f"no worker {msg.worker!r} (known workers: {known})")
        self._handle(WorkerDraining(*self._ev(), msg.worker))
        keeping = len(ws.keeping or ())
        self.log.info(
            "draining worker", worker=msg.worker, running=len(ws.processing), keeping=keeping
        )
        return {
            "worker": msg.worker,
            "running": len(ws.processing),
            "retired": ws.retired,
            "keeping": keeping,
        }

    @handles(UndrainRequest)
    def undrain(self, msg: UndrainRequest) -> dict[str, Any]:
        """Take draining ``msg.worker`` back (the autoscaler's pool wants it again): it
        takes tasks again; or say why not (``SchedulerState.undrain_refusal``)."""
        ws = self.state.workers.get(msg.worker)
        if ws is None:
            known = ", ".join(sorted(self.state.workers)) or "none"
            raise ValueError(f"no worker {msg.worker!r} (known workers: {known})")
        why = self.state.undrain_refusal(ws)
        if not why:
            self._handle(WorkerUndrained(*self._ev(), msg.worker))
            # (drained again at once: its last task under its pool's tasks_per_worker)
            why = (self.state.undrain_refusal(ws) or "drained again") if ws.draining else ""
        if why:
            self.log.info("not taking back draining worker", worker=msg.worker, why=why)
        else:
            self.log.info("draining worker taken back: it takes tasks again",
                          worker=msg.worker, running=len(ws.processing))  # fmt: skip
        return {"worker": msg.worker, "undrained": not why, "why": why}

    @handles(MoveRequest)
    def move(self, msg: MoveRequest) -> Any:
        """Move the still waiting or queued tasks of ``msg.keys`` to ``msg.pool`` and/or
        ``msg.priority`` (``TasksMoved``), once the graphs bringing them are taken in;
        a pool the core does not know, or a priority that is no whole number:
        ``ValueError``, nothing moved."""
        refusal = self.state.move_refusal(msg.pool)
        if refusal:
            raise ValueError(f"{refusal}; nothing was moved")
        if msg.priority is not None and (
            isinstance(msg.priority, bool) or not isinstance(msg.priority, int)
        ):
            raise ValueError(
                f"priority must be a whole number (higher runs first), got "
                f"{type(msg.priority).__name__} {msg.priority!r}; nothing was moved"
            )
        if msg.pool is None and msg.priority is None:
            raise ValueError("nothing to change: give a pool, a priority or both")

        def apply(stimulus: str) -> dict[str, Any]:
            ev = TasksMoved(stimulus, self.clock.now(), tuple(msg.keys), msg.pool, msg.priority)
            commands = self.state.handle(ev)
            answer = next(c for c in commands if type(c) is MoveAnswer)
            self._execute([c for c in commands if type(c) is not MoveAnswer])
            return {
                "moved": [str(k) for k in answer.moved],
                "left": {str(k): why for k, why in answer.left},
            }

        if self._coming(msg.keys):
            return self._after_intake(apply)
        return apply(current_causal_id())

    @handles(ForgetCategoryRequest)
    def forget_category(self, msg: ForgetCategoryRequest) -> dict[str, Any]:
        """An operator's ``forget CATEGORY``: start its statistics afresh (a past
        outlier no longer holds its tasks back); say what was forgotten."""
        st = self.state.stats.get(msg.category)
        if st is None:
            raise UnknownCategory(msg.category, self.state.stats)
        was = {"count": st.count, "rss_rise": st.rss_rise, "max_rss_growth": st.max_rss_growth}
        self._handle(CategoryForgotten(*self._ev(), msg.category))
        self.log.warning("category statistics forgotten", category=msg.category, **was)
        return {"category": msg.category, **was}


#: What turning a story query's text back into a key may raise: it is then text only.
_NOT_A_LITERAL = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)

#: Task states a TasksQuery may filter on.
_STATES = ("waiting", "queued", "processing", "memory", "released", "erred", "cancelled")


#: The most characters of a traceback a failure group shows and the monitoring
#: database keeps per failed try (it keeps its end: the frame that raised and the error)
MAX_TRACEBACK_TEXT = 8_000

_RELATIONS = {
    "cause": "\nThe above exception was the direct cause of the following exception:\n\n",
    "context": "\nDuring handling of the above exception, another exception occurred:\n\n",
}


def format_error(record: ErrorRecord) -> str:
    """An :class:`ErrorRecord` as Python prints a traceback (source lines from files on
    this machine, when they are there)."""
    out: list[str] = []
    for name, text, frames, relation in record.chain:
        out.append(_RELATIONS.get(relation, ""))
        if frames:
            out.append("Traceback (most recent call last):\n")
        for filename, lineno, function in frames:
            out.append(f'  File "{filename}", line {lineno}, in {function}\n')
            line = linecache.getline(filename, lineno).strip()
            if line:
                out.append(f"    {line}\n")
        out.append(f"{name}: {text}\n" if text else f"{name}\n")
    return "".join(out)


def traceback_text(record: ErrorRecord, limit: int = MAX_TRACEBACK_TEXT) -> str:
    """:func:`format_error` of ``record``, cut to its last ``limit`` characters (the
    frame that raised and the error), a first line saying how many were cut: what the
    dashboard's failure groups show and the monitoring database keeps."""
    text = format_error(record)
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"(traceback cut: its first {cut} characters are left out)\n...{text[cut:]}"


def _at(item: tuple[tuple[str, str], FailureGroup | NotRunGroup]) -> float:
    return item[1].at


def _failure_groups(
    st: SchedulerState, now: float, free: bool = False
) -> tuple[FailureGroupInfo, ...]:
    """The core's most recent failure groups (at most ``MAX_FAILURE_GROUPS_SHOWN``), the
    latest first, with their latest error as text (formatted here, at read time, never
    when a try fails). The groups of failed tries, then those of tasks that erred with
    no failed try of their own (outcome ``not-run``, counted in tasks, no worker): a
    dependency failed (cause ``dependency-failed``: the error names the dependency and
    says its failure, the traceback is that failure's), or the core found they cannot
    run (cause the error's type). With ``free``, the groups of tries lost with their
    worker and retried free instead (``SchedulerState.free_groups``: not failures)."""
    groups: list[tuple[tuple[str, str], FailureGroup | NotRunGroup]] = (
        [*st.free_groups.items()]
        if free
        else [*st.failure_groups.items(), *st.not_run_groups.items()]
    )
    latest = heapq.nlargest(MAX_FAILURE_GROUPS_SHOWN, groups, key=_at)
    out = []
    for (category, cause), g in latest:
        if isinstance(g, NotRunGroup):
            worker, outcome, tasks, erred = "", NOT_RUN, g.n, g.n
            error = not_run_text(g.error, g.dependency, g.root)
            tb = traceback_text(g.error)
        else:
            worker, outcome, tasks, erred = g.worker, g.outcome, g.tasks, g.erred
            if g.error is None:
                error = lost_worker_text(g.worker, cause, g.key)
                tb = ""
            else:
                error = g.error.summary
                tb = traceback_text(g.error)
        ago = max(now - g.at, 0.0)
        info = FailureGroupInfo(
            category, cause, g.n, str(g.key), worker, outcome, ago, error, tb, tasks, erred
        )
        out.append(info)
    return tuple(out)


def _recent_try(r: TryRecord, category: str, ago: float, n: int) -> RecentTry:
    duration = r.ran if r.ran is not None else max(r.stop - r.start, 0.0)
    return RecentTry(
        r.key, category, r.worker, r.outcome, duration, max(ago, 0.0), r.cause or "", n
    )


def _policy_names(st: SchedulerState) -> dict[str, str]:
    """Per kind, the name of the core's policy in force."""
    return {k: str(getattr(p, "name", type(p).__name__)) for k, p in st.policies.items()}


def _replicas(st: SchedulerState) -> ReplicasStatus:
    return ReplicasStatus(
        st.replicas_made, st.replica_bytes, st.replicas_failed, st.recomputes_avoided,
        len(st.replicas),
    )  # fmt: skip


def _checkpoints(st: SchedulerState) -> dict[str, int]:
    counts = ("saved", "resumed", "pruned", "refused", "copied", "copy-failed", "lost")
    return {
        "held": len(st.checkpoints),
        "held_bytes": st.checkpoint_held,
        "disk_bytes": sum(len(c.holders) * c.nbytes for v in st.checkpoints.values() for c in v),
        **{k: st.checkpoint_counts[k] for k in counts},
    }


def _life(s: Survival) -> PoolLife:
    return PoolLife(s.lives, s.deaths, s.median, s.known_at(3600.0))


def _top(stats: dict[str, Any], n: int) -> list[tuple[str, Any]]:
    """``stats``' categories (all for ``n`` 0), else the ``n`` with the most task time,
    then the most tasks, in that order: O(categories x log n)."""
    items = list(stats.items())
    if n <= 0 or n >= len(items):
        return items
    return heapq.nlargest(n, items, key=lambda kv: (kv[1].total_duration, kv[1].count))


def _stats(s: Any) -> dict[str, Any]:
    return {
        "count": s.count,
        "errors": s.errors,
        "lost": s.lost,
        "oom": s.oom,
        "mean_duration": s.mean_duration,
        "max_duration": s.max_duration,
        "p90_duration": s.p90_duration,
        "total_nbytes": s.total_nbytes,
        "consumed_nbytes": s.consumed_nbytes,
        "peak_rss": s.peak_rss,
        "max_rss_growth": s.max_rss_growth,
        "rss_rise": s.rss_rise,
        "max_nbytes": s.max_nbytes,
        "disk_full": s.disk_full,
    }
