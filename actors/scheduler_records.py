"""The scheduler core's records: its configuration (:class:`SchedulerConfig`), what it
knows of each task and worker (:class:`TaskState`, :class:`WorkerState`), the read-only
views policies get of them (:class:`TaskStateView`, :class:`WorkerStateView`), a
checkpoint, the waits per pool and the failure records the dashboard groups. The core
(``actors/scheduler_state.py``) is the only writer of them."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from policies import (
    BENIGN_LOSSES,
    CategoryStatsView,
    WalltimeLoss,
)
from policies.survival import Survival
from runtime.client_ids import client_name
from runtime.errors import (
    LongTaskError,
    PruneDepthError,
    command_output,
    disk_size,
    error_name,
    memory_sizes,
)
from runtime.graph import Key, TaskSpec
from runtime.messages import DiskStallInfo, PlacementStallInfo, TryRecord

__all__ = [
    "ACTIVE",
    "DEPENDENCY_FAILED",
    "MAX_DEPENDENCY_NOTE",
    "MAX_ERROR_CHAIN",
    "MAX_ERROR_CHARS",
    "MAX_ERROR_FRAMES",
    "MAX_ERROR_LINE",
    "NOT_RUN",
    "NO_LIMIT",
    "RECENT_WAITS",
    "Checkpoint",
    "ErrorRecord",
    "FailureGroup",
    "Frame",
    "NotRunGroup",
    "PoolWaits",
    "Root",
    "SchedulerConfig",
    "TaskState",
    "TaskStateView",
    "WorkerState",
    "WorkerStateView",
    "dependency_failed_text",
    "error_line",
    "error_record",
    "lost_worker_text",
    "not_run_text",
    "runs_on",
    "unsaved_work",
]

#: retries of one task a retry policy may make beyond the task's ``retries=`` budget
#: (``SchedulerConfig.max_free_retries``): a policy that always answers retry would
#: otherwise run a failing task in a hot loop for good
MAX_FREE_RETRIES = 100
RECENT_WAITS = 1000  #: the latest waits served kept per pool, for the wait quantiles
NO_LIMIT = float("inf")  #: the memory limit of a worker that reports none (0)
#: the states of an active task: it still needs its inputs, so it counts in each
#: dependency's ``consumers`` (the scheduler core's docstring)
ACTIVE: frozenset[str] = frozenset({"waiting", "queued", "processing"})


# ----------------------------------------------------------------------------- state


@dataclasses.dataclass(slots=True)
class SchedulerConfig:
    """How much work the scheduler hands each worker ahead of time.

    A worker always gets up to ``saturation`` tasks per core (a task expected to run
    ``long_task`` seconds or longer, or of a category with no finished try yet: only
    to a worker with a core free of tasks). Beyond that it gets more
    while the estimated run time of what it holds stays under ``backlog`` seconds per
    core, up to ``max_per_core`` tasks per core: short tasks travel in large batches,
    long ones are held back where they can still be placed well. Estimates are each
    category's mean duration so far (``unknown_duration`` before any has finished).
    """

    saturation: float = 2.0
    backlog: float = 0.05
    max_per_core: int = 500
    unknown_duration: float = 0.5
    #: a task expected to run this long or longer (its category's mean duration) goes
    #: only to a worker with a core free of tasks, else it stays in the ready queue:
    #: the slots beyond one per core save a round trip (milliseconds, under 1% of such
    #: a task), and a task queued on a worker behind another cannot move to a worker
    #: that joins or frees up meanwhile (a block started for the work) (inf: off)
    long_task: float = 1.0
    #: a task of a category with no finished try yet counts as long for that rule (its
    #: duration is a guess, ``unknown_duration``; a first wave of short tasks then
    #: fills only the cores until one of them finishes). False: it counts as short
    unknown_long: bool = True
    story_length: int = 100_000
    #: monitoring records kept unread for :meth:`SchedulerState.feed_since` (the
    #: newest; a reader that falls further behind is told how many entries it missed)
    feed_length: int = 1_000_000
    #: keep the monitoring feed from the start (else from its first read)
    monitor: bool = False
    #: the watchdogs' patience, seconds: every worker may stay throttled with nothing
    #: but producers to run and nothing finishing that long before the run fails with
    #: MemoryStalled; a pool whose workers all ran nothing that long while its ready
    #: tasks waited for disk is stalled for disk (``actors/scheduler_disk.py``); a pool
    #: with ready tasks and an idle connected worker that placed and finished nothing
    #: that long is stalled for placement (``actors/scheduler_stall.py``)
    stall_timeout: float = 10.0
    #: seconds before its walltime a worker is drained, unless its pool has its own
    #: (``drain_periods``). None: walltime_grace plus the longest expected task of its
    #: pool (the largest p90 duration of the categories that finished on its pool's
    #: workers), at most half the time from its joining to its walltime
    drain_period: float | None = None
    #: per pool, the ``drain_period`` of its workers (a pool's ``drain_period`` key)
    drain_periods: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: per pool, the tasks each of its workers runs (tries sent to it, speculative
    #: copies among them) before it is drained, so that its block ends and a fresh one
    #: replaces it (a pool's ``tasks_per_worker`` key); a pool not named: no limit
    tasks_per_worker: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: what a worker needs at the end of its walltime besides its last task (to leave)
    walltime_grace: float = 60.0
    #: disk-aware placement: the output expected of a task whose category has no
    #: finished try and that declares no ``resources={"disk": ...}`` (at most half the
    #: largest disk of its pool, so that a guess alone never keeps a task off every worker)
    unknown_output: int = 16 * 2**20
    #: how far downstream an output's readers must be done before it is dropped: 1 its
    #: readers, 2 their readers too, ...; 0 never (see docs/files.md#pruning-depth)
    prune_depth: int = 1
    #: bytes of task checkpoints the scheduler holds at most, over all running tasks;
    #: past it a checkpoint is not held here (it stays on its worker's disk, and a copy
    #: on a peer's if one can be made)
    checkpoint_bytes: int = 2**30
    #: checkpoints up to this size are held by the scheduler (their copy off the
    #: worker); larger ones are copied to a peer's disk. Workers send the bytes of
    #: checkpoints up to ``runtime.task``'s 4 MiB with them, so more than that changes
    #: nothing
    checkpoint_inline_bytes: int = 4 * 2**20
    #: a task whose inputs could not be had from holders still connected
    #: (``MAX_INPUTS_UNREACHABLE`` tries or more in a row) fails with InputsUnreachable
    #: once the first of those tries is this many seconds old: long enough for a
    #: worker that was killed, stopped or cut off to be declared lost or to come back
    unreachable_for: float = 120.0
    #: a try sent to a worker whose threads are all held by tries it said execute (0.5 s
    #: or more), waiting there this many seconds without starting, is taken back and
    #: placed again while another worker of its pool is free (inf: never)
    takeback_after: float = 10.0
    #: per configured pool, the memory limit of each of its workers when known
    #: (``memory_per_worker``; an embedded cluster's one pool): a task killed for
    #: memory waits for a worker with a larger limit while such a pool may start one
    pool_memory: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: per configured pool, the cores of each of its workers (``cores_per_worker``; an
    #: embedded cluster's one pool): a ready task asking for more cores (or memory, by
    #: ``pool_memory``) than a pool's workers have is no demand for that pool
    #: (:meth:`~actors.scheduler_state.SchedulerState.unfit_by_pool`)
    pool_cores: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: per configured pool, the disk of each of its workers when it is an amount
    #: (``disk_per_worker`` a number of bytes): a ready task asking for more ``disk``
    #: is no demand for that pool either
    pool_disk: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: retries of one task the retry policy may make beyond its ``retries=`` budget
    #: (free, or charged to a budget spent already); past it the task fails with
    #: RetryPolicyLoop. The default retry policy's limits stay far below it
    #: (``max_lost`` 5 + ``max_oom`` 1 + ``max_disk_full`` 2)
    max_free_retries: int = MAX_FREE_RETRIES
    #: the configured pools (and an embedded cluster's own pool): a retry policy may
    #: move a task to one of them, or to a pool a worker has joined
    pools: tuple[str, ...] = ()
    #: the pools whose workers run only the tasks that name them (a pool's
    #: ``any_pool_tasks = false``): a task of no pool never goes to one of their workers
    reserved_pools: frozenset[str] = frozenset()
    #: seconds one kind of policy's calls may take in one turn of the core (one
    #: ``handle``, on the clock the shell injects): past it that kind is not asked again
    #: in the turn, its built-in fallback answers, and the turn counts as a slow one
    #: (docs/policies.md#writing-and-registering-your-own, "Be fast")
    policy_budget: float = 1.0
    #: slow turns of one kind within ``policy_slow_window`` seconds after which its policy
    #: is replaced by the default one
    policy_slow_turns: int = 3
    policy_slow_window: float = 300.0
    #: a turn whose calls of one kind took this long (a single call cannot be cut
    #: short) replaces its policy by the default one at once: half the 10 s after which
    #: workers and clients close a silent manager
    policy_too_slow: float = 5.0
    #: the highest ``priority=`` a task of a submit-token client may have (the manager
    #: refuses a graph with one above it, nothing of it kept); inf: no cap. Under the
    #: ``fair`` priority a user's own priority ranks before the turns, so without a cap
    #: one person's ``priority=5`` flood runs ahead of everyone else's work
    submit_max_priority: float = math.inf

    def __post_init__(self) -> None:
        depth = self.prune_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise PruneDepthError(depth)
        long = self.long_task
        if isinstance(long, bool) or not isinstance(long, int | float) or not long >= 0:
            raise LongTaskError("long_task", long)
        if not isinstance(self.unknown_long, bool):
            raise LongTaskError("unknown_long", self.unknown_long)
        for pool, n in self.tasks_per_worker.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(
                    f"tasks_per_worker of pool {pool!r} must be a whole number >= 1, got {n!r}"
                )
        if not self.takeback_after >= 0:
            raise ValueError(
                f"takeback_after must be seconds >= 0 (inf: never), got {self.takeback_after!r}"
            )
        if not self.unreachable_for >= 0:
            raise ValueError(
                f"unreachable_for must be seconds >= 0 (inf: never), got {self.unreachable_for!r}"
            )
        for name in ("policy_budget", "policy_slow_window", "policy_too_slow"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be seconds > 0 (inf: never), got {value!r}")
        cap = self.submit_max_priority
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not cap >= 0:
            raise ValueError(
                f"submit_max_priority must be a number >= 0 (inf: no cap), got {cap!r}"
            )
        turns = self.policy_slow_turns
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ValueError(f"policy_slow_turns must be a whole number >= 1, got {turns!r}")


@dataclasses.dataclass(slots=True, eq=False)
class Checkpoint:
    """One checkpoint of a running task in the registry: number ``seq``, ``nbytes``,
    saved by worker ``owner``; ``data`` its bytes when the scheduler holds them;
    ``holders`` the workers whose disk has its file (the owner, peers' copies);
    ``copying`` the peer asked to copy it (from ``copy_source``, since ``copy_sent``),
    "" when none; ``work``: the seconds of the task's execution it holds (the work of
    the checkpoint its try resumed from, plus that try's time executing until the save,
    on the scheduler's clock)."""

    seq: int
    nbytes: int
    owner: str
    work: float = 0.0
    data: bytes | None = None
    holders: set[str] = dataclasses.field(default_factory=set)
    copying: str = ""
    copy_source: str = ""
    copy_sent: float | None = None

    @property
    def off_worker(self) -> bool:
        """Whether a copy survives the loss of its owner (held here, or on a peer)."""
        return self.data is not None or any(h != self.owner for h in self.holders)


class WorkerState:
    """One worker as the scheduler sees it."""

    __slots__ = (
        "abandoned",
        "away",
        "began",
        "block",
        "contained",
        "copies",
        "cores",
        "deadline",
        "disk",
        "disk_foreign",
        "disk_reserved",
        "disk_used",
        "draining",
        "executed",
        "executing",
        "floor",
        "has_what",
        "held",
        "id",
        "jammed",
        "joined",
        "keeping",
        "leaving",
        "limit",
        "memory",
        "memory_bytes",
        "n_producers",
        "occupancy",
        "past_logged",
        "past_peak",
        "pool",
        "processing",
        "retired",
        "rss",
        "slots",
        "spill_dir",
        "spill_refused",
        "spill_refused_at",
        "spills",
        "suspended",
        "tasks_sent",
        "terminate_at",
        "throttle_at",
        "throttled",
        "throttled_since",
        "throttled_total",
        "unconfirmed",
        "view",
        "waiting",
        "walltime_drain",
        "with_cluster",
    )

    def __init__(self, wid: str, cores: int, memory: int, pool: str, saturation: float) -> None:
        self.view = WorkerStateView(self)  #: what policies see of it
        self.id = wid
        self.cores = cores  #: cores it offers
        self.memory = memory  #: bytes of memory it offers
        self.pool = pool  #: the pool it belongs to
        self.block = ""  #: the block it belongs to ("": unknown; WorkerJoined.block)
        self.joined = 0.0  #: when it joined (first registered)
        self.deadline: float | None = None  #: when its walltime ends (None: never)
        self.slots = max(1, round(cores * saturation))  #: tasks it always may hold
        self.limit = self.slots  #: tasks it may hold when they are short
        self.occupancy = 0.0  #: estimated seconds of work it holds
        self.processing: set[TaskState] = set()  #: tasks sent to it, not finished
        #: of ``processing``, the tries not known to execute, in the order they were sent
        #: (the first waited longest: ``corral_worker_queue_oldest_seconds``) ...
        self.waiting: dict[TaskState, None] = {}
        #: ... and the others: when each began to execute, as it said (``TasksRunning``)
        self.began: dict[TaskState, float] = {}
        self.has_what: set[TaskState] = set()  #: tasks whose output it holds
        self.draining = False  #: gets no new tasks; retired once it runs none
        self.leaving = False  #: going by itself (WorkerLeaving): drained, never retired
        #: ``str`` of the keys it executed when it said it was leaving (None: not said):
        #: the other tasks it has in hand when it goes never started
        self.executing: frozenset[str] | None = None
        #: ``str`` of the keys it executed when it said it was leaving -> when each
        #: began executing, on the scheduler's clock (what it said it had executed)
        self.executed: dict[str, float] = {}
        self.retired = False  #: told to stop (RetireWorker) after draining
        #: drained and idle: the outputs only it holds, copied off before it is retired
        #: while something needs them (None: not looked at yet)
        self.keeping: set[TaskState] | None = None
        #: drained by the core because its walltime is near (not by an operator's
        #: drain, ``WorkerDraining``): its end is ``walltime``, not ``drained``
        self.walltime_drain = False
        #: its block is stopped because the cluster shuts down: it leaves as
        #: ``shutdown``, whatever its end says (``StoppedWithCluster``)
        self.with_cluster = False
        #: tries sent to it, speculative copies among them (its pool's
        #: ``tasks_per_worker`` drains it once they reach that many)
        self.tasks_sent = 0
        self.throttled = False  #: past its throttle fence: deferring producers
        self.throttled_since = 0.0  #: when it was last throttled (while ``throttled``)
        self.throttled_total = 0.0  #: seconds it was throttled, its episodes that ended
        #: its block is suspended by the batch system: no new tasks until it resumes
        self.suspended = False
        #: when its connection dropped, its id held for its rejoin (None: connected):
        #: no new work, its cores not counted; lost, it ends then (``WorkerAway``)
        self.away: float | None = None
        #: its RSS with its task processes, as last reported (with its results, in its
        #: memory reports): what its memory fences act on
        self.rss = 0
        #: the highest RSS it said it reached past its terminate fence with tasks in
        #: threads (0: never; ``WorkerMemory.past_peak``)
        self.past_peak = 0
        self.past_logged = 0  #: of those, the peak last logged (``past_limit_logged``)
        #: its floor (memory that is not outputs) when at or past its resume mark, as last
        #: reported (0: under it; ``WorkerMemory.floor``)
        self.floor = 0
        self.throttle_at = 0  #: bytes where its throttle fence is (0: not reported)
        #: bytes where its terminate fence is, as it last told (None: not told, or
        #: turned off: ``TERMINATE`` of ``memory`` stands for it, ``terminate_fence``)
        self.terminate_at: int | None = None
        #: spills its disk had no room for, as last reported (``WorkerMemory``), when
        #: the latest of them was first told (the core's clock) and its spill directory
        self.spill_refused = 0
        self.spill_refused_at = 0.0
        self.spill_dir = ""
        #: its spill fence is on: past it, it writes outputs to disk (WorkerJoined.spills)
        self.spills = False
        #: it runs its tasks in task processes (WorkerJoined.contained): a crash of a
        #: task there ends its task process, not this worker
        self.contained = False
        self.memory_bytes = -1  #: bytes of outputs in its memory, as last reported (-1: not)
        #: threads still running a cancelled try, replaced by fresh ones (thread
        #: execution), as last reported: at ``cores`` it can stop no other running try
        #: without holding that try's slot (``held``)
        self.abandoned = 0
        #: threads holding their slot with a try that was stopped but could not be, as
        #: last reported: they take no task (``SchedulerState._is_free``) until they end
        self.held = 0
        #: the keys of tries taken back from it (``SchedulerState._take_back``): its
        #: threads are all held by tries that run long; while any is here it takes no
        #: task, until a report of another try of it comes (one of its threads is free)
        self.jammed: set[Key] = set()
        self.n_producers = 0  #: producers among ``processing``
        self.disk = 0  #: bytes of disk it offers (0: no limit known)
        self.disk_used = 0  #: bytes of outputs it holds on disk, as last reported
        self.disk_reserved = 0  #: disk the core expects its unfinished tasks to take
        #: of ``disk_used``, what the file system holding its disk lacks beyond what
        #: the worker counts as its own: other programs' files (``WorkerMemory``)
        self.disk_foreign = 0
        #: tasks sent to it before it rejoined over a new connection: they may have been
        #: lost with the old one, until it says what it has (WorkerHeld)
        self.unconfirmed: set[TaskState] = set()
        #: speculative copies it runs of tasks whose first try runs elsewhere (each
        #: takes a slot as a task does; see ``SchedulerState.copies``)
        self.copies: set[TaskState] = set()

    @property
    def n_processing(self) -> int:
        return len(self.processing)

    def disk_free(self) -> float:
        """Its disk left for new tasks (``inf``: no limit known)."""
        if not self.disk:
            return NO_LIMIT
        return self.disk - self.disk_used - self.disk_reserved

    def __repr__(self) -> str:
        return f"<WorkerState {self.id} {len(self.processing)}/{self.slots}>"


#: What a failed task's client is told of the task whose failure it is: ``(key, its
#: exception, the worker its failed try ran on, that try's number, the tries it could
#: have made)`` (``TaskState.root``; the last three "", 0, 0 for a failure with no try)
Root = tuple[Key, BaseException, str, int, int]


class TaskState:
    """One task as the scheduler sees it."""

    __slots__ = (
        "attempt",
        "behind",
        "client",
        "consumers",
        "contained_crashes",
        "copy_said",
        "deferred_by",
        "delivered",
        "dependents",
        "deps",
        "disk_need",
        "error",
        "est",
        "failed_in",
        "file",
        "first_try",
        "free_retries",
        "generation",
        "held_until",
        "in_files",
        "in_nbytes",
        "kept_on",
        "key",
        "lost_since_saved",
        "lost_tries",
        "nbytes",
        "oom_alone",
        "oom_exited",
        "oom_own",
        "oom_rest",
        "oom_worker_floor",
        "ooms",
        "prio",
        "producer",
        "queued",
        "registered",
        "remake",
        "resumed",
        "retries_left",
        "retry_at",
        "root",
        "rss_began",
        "sent",
        "spec",
        "started",
        "state",
        "tries",
        "turn",
        "unneeded",
        "unreachable",
        "unreachable_since",
        "unreadable",
        "wait_said",
        "waiting_deps",
        "waiting_on",
        "wanted",
        "who_has",
        "worker",
    )

    def __init__(self, spec: TaskSpec, generation: int) -> None:
        self.key = spec.key
        self.spec = spec
        self.state: str = "new"
        self.deps: list[TaskState] = []  #: tasks whose outputs this one reads
        self.dependents: set[TaskState] = set()  #: tasks that read this one's output
        self.waiting_on = 0  #: dependencies not in memory (while waiting)
        #: dependencies that are waiting themselves (0 while waiting: the next wave)
        self.waiting_deps = 0
        self.consumers = 0  #: active dependents (they still need this output)
        self.wanted = 0  #: client holds on this key
        #: a gather gave its output's value to a client, and no client came to want it
        #: since, nor did a gather find it missing: lost with its workers while no task
        #: reads it, it is made again only once something needs it (``lost_held``)
        self.delivered = False
        self.who_has: set[str] = set()  #: workers holding the output
        self.nbytes = 0  #: output size
        #: its output is a file output: ``nbytes`` on its holders' disks, not in memory
        self.file = False
        #: known size of its inputs in memory: the sum of its dependencies' ``nbytes``
        #: (0 for the ones that never finished), but file outputs'; memory admission
        #: compares it with worker limits
        self.in_nbytes = 0
        self.in_files = 0  #: the known size of its inputs that are file outputs
        self.worker: str | None = None  #: worker running it (while processing)
        self.sent = 0.0  #: when it was last sent to a worker
        #: when its running try began to execute on its worker, as the worker said
        #: (``TasksStarted``, once it has executed a while); None: not known to
        self.started: float | None = None
        #: the checkpoint its running try resumed from: ``(number, its work in seconds:
        #: Checkpoint.work)``; None: it started from none
        self.resumed: tuple[int, float] | None = None
        #: its worker's RSS as last told when it said the running try began to execute
        #: (``TasksRunning``): what that RSS rose by since, while the try runs alone
        #: there, is the try's rise so far (``SchedulerState._rise_so_far``)
        self.rss_began = 0
        #: why no speculative copy of its running try was made, as last told in its
        #: story (each reason once per try; "" when none was told)
        self.copy_said = ""
        #: the throttled workers it was taken back from while deferred there (its
        #: expected output fitting under none of their fences), with the bytes of
        #: outputs each held then: it is taken back only to a free worker not among
        #: them, or one holding less since, so never bounced between two for ever
        self.deferred_by: dict[str, int] = {}
        #: the worker where its story last told it is kept deferred, not taken back
        #: again (each such wait told once per worker; "": none told)
        self.kept_on = ""
        #: when it became ready for its running try (``TryRecord.queued``; None: a copy)
        self.queued: float | None = None
        self.attempt = 0  #: the number of its running try (``ToRun.attempt``)
        #: the submission whose work it continues: the one it came in with, or the
        #: latest of its inputs' when that is earlier (``_continue_generations``)
        self.generation = generation
        #: the id of the client whose submission brought it ("": not known)
        self.client = ""
        #: its client's turn (``SchedulerState._take_turns``): the ``fair`` priority's
        self.turn: float = 0
        self.prio: tuple[float, ...] = ()  #: queue priority from the priority policy
        self.est = 0.0  #: estimated duration when it was assigned
        self.disk_need = 0  #: disk reserved for it on its worker (while processing)
        #: why it waits, as last told in its story (for disk; for a worker with the
        #: resources, or the memory limit after a kill for memory, it needs; for room
        #: for its RSS rise): each wait is told once; "" once it is sent to a worker
        self.wait_said = ""
        self.unneeded = False  #: cancelled only because nothing needed it
        self.registered = False  #: the file registry knows its output
        #: estimated seconds of work to make its output again from the outputs that are
        #: kept (its latest try, plus the inputs that are not kept, in turn)
        self.remake = 0.0
        self.behind = False  #: its latest retry queues behind fresh work
        self.producer = False  #: a memory producer (as of its latest enqueue)
        self.retries_left = spec.retries  #: user retry budget left
        self.lost_tries = 0  #: tries lost with their worker
        #: of those, the latest in a row whose loss took every checkpoint the try saved
        #: (or that saved none): a loss after which a checkpoint of the try survives,
        #: progress its retry resumes from, starts the count again
        self.lost_since_saved = 0
        #: of its tries lost with a worker that ended unexpectedly (``crashes``), those
        #: whose worker ran its tasks in task processes (``WorkerState.contained``)
        self.contained_crashes = 0
        #: its tries killed at a worker's terminate fence, oldest first: ``(worker, its
        #: memory limit, the peak RSS seen)``; a retry goes only to a worker whose limit
        #: is above every one of these (``oom_floor``)
        self.ooms: tuple[tuple[str, int, int], ...] = ()
        #: for each of ``ooms``, whether it ran alone on its worker: then only a larger
        #: limit may do; a try that shared its worker with others may go to one as large
        self.oom_alone: tuple[bool, ...] = ()
        #: its latest try killed for memory in a task process: that process's highest
        #: RSS, the task's own memory (0: not known, or none killed)
        self.oom_own = 0
        #: the floor of the worker of that try (memory that is not outputs) when it was
        #: at or past its resume mark, the kill's likelier cause (0: under it)
        self.oom_worker_floor = 0
        #: of that try's worker RSS, what was neither that process nor outputs in
        #: memory: the worker's floor (its own process, its other task processes, copies
        #: on their way; 0: not known)
        self.oom_rest = 0
        #: that try's worker ran its tasks in threads and stopped itself past its exit
        #: mark (the memory option ``exit``): it was not killed at the terminate fence
        self.oom_exited = False
        #: retries beyond its budget (free, or charged with none left): at most
        #: ``SchedulerConfig.max_free_retries``
        self.free_retries = 0
        #: times its inputs could not be had from workers still connected (in a row)
        self.unreachable = 0
        self.unreachable_since = 0.0  #: when the first of those tries ended
        #: queued but not placed before this time (backing off: ``_inputs_missing``)
        self.held_until = 0.0
        #: while > 0: its retry is held (waiting, not ready) until this time, a backoff
        #: the retry policy asked for (``RetryDecision.delay``); 0 once it leaves waiting
        self.retry_at = 0.0
        self.tries: list[TryRecord] = []  #: every attempt
        #: where its latest submission's tries begin in ``tries`` (a failed key
        #: submitted again counts its tries afresh: ``try 1 of 1`` in its client's note)
        self.first_try = 0
        #: the failure groups its failed tries count in (None: none), each once: a
        #: group counts its tasks and, as they err, those that erred
        self.failed_in: list[FailureGroup] | None = None
        #: its output was found not to pickle and counted as a failed try (once per
        #: output: a later gather of it is the same failure); cleared when it is made anew
        self.unreadable = False
        self.error: BaseException | None = None  #: what its future raises (erred/cancelled)
        #: the task whose failure it is (itself, or a dependency's), as the client is
        #: told (``KeyErred``'s last five fields): ``(key, its exception, the worker of
        #: its failed try, that try's number, the tries it could have made)``; ("", 0,
        #: 0) when it failed with no try of its own
        self.root: Root | None = None

    def __repr__(self) -> str:
        return f"<TaskState {self.key!r} {self.state}>"

    # -- TaskView -----------------------------------------------------------------------
    @property
    def category(self) -> str:
        return self.spec.category

    @property
    def order(self) -> int:
        return self.spec.order

    @property
    def user_priority(self) -> float:
        return self.spec.priority

    @property
    def dep_locations(self) -> tuple[tuple[frozenset[str], int], ...]:
        return tuple((frozenset(d.who_has), d.nbytes) for d in self.deps)

    @property
    def oom_tries(self) -> int:
        return sum(1 for t in self.tries if t.outcome == "oom")

    @property
    def oom_floor(self) -> float:
        """The memory limit a worker must reach to run ``ts`` again: the largest limit
        (or, for a try that ran alone, peak RSS seen) of its tries killed for memory;
        ``NO_LIMIT`` if one was on a worker without a limit (none is larger), -1.0 if
        none was killed. Reaching it does only if none of those tries ran alone at it
        (``oom_strict``); else the limit must be above it."""
        return max(self._oom_bounds(), default=(-1.0, False))[0]

    @property
    def oom_strict(self) -> bool:
        """A worker must have more than ``oom_floor`` (a try killed at it ran alone on
        its worker), not just as much (the tries killed there shared their worker with
        other tasks, whose memory counted too)."""
        return max(self._oom_bounds(), default=(-1.0, False))[1]

    def _oom_bounds(self) -> list[tuple[float, bool]]:
        out = []
        for (_, limit, peak), alone in zip(self.ooms, self.oom_alone, strict=True):
            bound = float(limit) if limit > 0 else NO_LIMIT
            out.append((max(bound, float(peak)), True) if alone else (bound, False))
        return out

    def oom_fits(self, memory: float) -> bool:
        """A worker with ``memory`` as its limit (0: none) may run ``ts`` again after
        its kills for memory (:attr:`oom_floor`, :attr:`oom_strict`)."""
        if not self.ooms or not memory:
            return True
        floor, strict = max(self._oom_bounds())
        return memory > floor or (memory == floor and not strict)

    @property
    def oom_need(self) -> str:
        """What :meth:`oom_fits` asks, in words: ``above 1.00 GiB`` or ``of 1.00 GiB
        or more`` (in :meth:`oom_size`'s unit)."""
        size = self.oom_size(self.oom_floor)
        return f"above {size}" if self.oom_strict else f"of {size} or more"

    def oom_size(self, n: float) -> str:
        """``n`` bytes in the unit :class:`~runtime.errors.TaskOutOfMemory` names the
        limits and peaks of ``ooms`` in (MiB when all are under a GiB), so that a
        message about them has one unit."""
        return memory_sizes(n, top=max((max(lim, p) for _, lim, p in self.ooms), default=0))[0]

    @property
    def disk_full_tries(self) -> int:
        return sum(1 for t in self.tries if t.outcome == "disk-full")

    @property
    def crash_tries(self) -> int:
        return len(self.crashes())

    def crashes(self) -> list[tuple[str, str]]:
        """``(worker, cause)`` of the tries lost with a worker that ended unexpectedly,
        but those known never to have started (``TryRecord.ran`` 0: they waited in the
        worker's queue, so they cannot have killed it)."""
        return [
            (t.worker, t.cause or "unknown")
            for t in self.tries
            if t.outcome == "worker-lost" and t.cause not in BENIGN_LOSSES and t.ran != 0.0
        ]


class TaskStateView:
    """What policies see of a :class:`TaskState` (the :class:`~policies.TaskView`
    protocol): reads only, made per policy call. Its attributes cannot be set,
    collections come as frozensets and tuples, and no public attribute leads back to
    the core's objects."""

    __slots__ = ("_error", "_loss", "_saved", "_stats", "_survival", "_ts")
    _ts: TaskState
    _survival: Callable[[str | None], Survival] | None
    _stats: Mapping[str, CategoryStatsView] | None
    _loss: WalltimeLoss | None
    _saved: float | None
    _error: BaseException | None

    def __init__(
        self,
        ts: TaskState,
        survival: Callable[[str | None], Survival] | None = None,
        stats: Mapping[str, CategoryStatsView] | None = None,
        walltime_loss: WalltimeLoss | None = None,
        saved_work: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        # Through the slots' own descriptors (bound below the class), not
        # object.__setattr__ by name: a view is made per policy call, several per task.
        _set_ts(self, ts)
        _set_survival(self, survival)
        _set_stats(self, stats)
        _set_loss(self, walltime_loss)
        _set_saved(self, saved_work)
        _set_error(self, error)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a task view is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a task view is read-only (cannot delete {name!r})")

    def __repr__(self) -> str:
        return f"<TaskView {self._ts.key!r}>"

    @property
    def key(self) -> Key:
        return self._ts.key

    @property
    def category(self) -> str:
        return self._ts.spec.category

    @property
    def order(self) -> int:
        return self._ts.spec.order

    @property
    def user_priority(self) -> float:
        return self._ts.spec.priority

    @property
    def generation(self) -> int:
        return self._ts.generation

    @property
    def client(self) -> str:
        return client_name(self._ts.client)

    @property
    def turn(self) -> float:
        return self._ts.turn

    @property
    def retries_left(self) -> int:
        return self._ts.retries_left

    @property
    def charged_tries(self) -> int:
        return self._ts.spec.retries - self._ts.retries_left

    @property
    def lost_tries(self) -> int:
        return self._ts.lost_tries

    @property
    def lost_since_saved(self) -> int:
        return self._ts.lost_since_saved

    @property
    def oom_tries(self) -> int:
        return self._ts.oom_tries

    @property
    def disk_full_tries(self) -> int:
        return self._ts.disk_full_tries

    @property
    def crash_tries(self) -> int:
        return self._ts.crash_tries

    @property
    def producer(self) -> bool:
        return self._ts.producer

    @property
    def dep_locations(self) -> tuple[tuple[frozenset[str], int], ...]:
        return self._ts.dep_locations

    @property
    def pool(self) -> str | None:
        return self._ts.spec.pool

    @property
    def ran_for(self) -> float:
        tries = self._ts.tries
        if not tries:
            return 0.0
        last = tries[-1]
        return last.ran if last.ran is not None else max(0.0, last.stop - last.start)

    @property
    def saved_work(self) -> float | None:
        return self._saved

    @property
    def unsaved_for(self) -> float:
        ran = self.ran_for
        saved = self._saved
        if saved is None:
            return ran
        resumed = self._ts.resumed
        return min(ran, unsaved_work(resumed[1] if resumed else 0.0, ran, saved))

    @property
    def survival(self) -> Survival:
        survival = self._survival
        return survival(self._ts.spec.pool) if survival is not None else Survival()

    @property
    def walltime_loss(self) -> WalltimeLoss | None:
        return self._loss

    @property
    def stats(self) -> CategoryStatsView | None:
        stats = self._stats
        return stats.get(self._ts.spec.category) if stats is not None else None

    @property
    def dependents(self) -> tuple[TaskStateView, ...]:
        return tuple(TaskStateView(d) for d in self._ts.dependents)

    @property
    def error_type(self) -> str | None:
        error = self._error
        return error_name(error) if error is not None else None

    @property
    def error_types(self) -> tuple[str, ...]:
        return error_types(self._error)

    @property
    def error_message(self) -> str | None:
        error = self._error
        return error_text(error) if error is not None else None


_set_ts = vars(TaskStateView)["_ts"].__set__
_set_survival = vars(TaskStateView)["_survival"].__set__
_set_stats = vars(TaskStateView)["_stats"].__set__
_set_loss = vars(TaskStateView)["_loss"].__set__
_set_saved = vars(TaskStateView)["_saved"].__set__
_set_error = vars(TaskStateView)["_error"].__set__


class WorkerStateView:
    """What policies see of a :class:`WorkerState` (the :class:`~policies.WorkerView`
    protocol): reads only, one per worker (``WorkerState.view``). Its attributes cannot
    be set, and no public attribute leads back to the core's objects."""

    __slots__ = ("_ws",)
    _ws: WorkerState

    def __init__(self, ws: WorkerState) -> None:
        object.__setattr__(self, "_ws", ws)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a worker view is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a worker view is read-only (cannot delete {name!r})")

    def __repr__(self) -> str:
        return f"<WorkerView {self._ws.id} {len(self._ws.processing)}/{self._ws.slots}>"

    @property
    def id(self) -> str:
        return self._ws.id

    @property
    def cores(self) -> int:
        return self._ws.cores

    @property
    def memory(self) -> int:
        return self._ws.memory

    @property
    def pool(self) -> str:
        return self._ws.pool

    @property
    def n_processing(self) -> int:
        return len(self._ws.processing)

    @property
    def slots(self) -> int:
        return self._ws.slots

    @property
    def limit(self) -> int:
        return self._ws.limit

    @property
    def throttled(self) -> bool:
        return self._ws.throttled

    @property
    def disk(self) -> int:
        return self._ws.disk

    @property
    def disk_free(self) -> float:
        """Disk left for new tasks: its limit less what it holds on disk and what its
        unfinished tasks are expected to take (``inf``: no limit known)."""
        return self._ws.disk_free()


class PoolWaits:
    """One pool's ready tasks and waits: ``since`` maps each ready task to when it
    became ready, oldest first (its first entry is the oldest: O(1)); ``recent`` the
    latest :data:`RECENT_WAITS` waits served (ready to sent to a worker, seconds); ``n``
    and ``total`` count and sum every wait served."""

    __slots__ = ("n", "recent", "since", "total")

    def __init__(self) -> None:
        self.since: OrderedDict[TaskState, float] = OrderedDict()
        self.recent: deque[float] = deque(maxlen=RECENT_WAITS)
        self.n = 0
        self.total = 0.0


Frame = tuple[str, int, str]  #: (file name, line number, function name)
MAX_ERROR_FRAMES = 50  #: frames kept per exception (the innermost ones)
MAX_ERROR_CHAIN = 5  #: exceptions kept of a chain (__cause__ / __context__)
MAX_ERROR_CHARS = 2_000  #: characters kept of an exception's text


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorRecord:
    """An exception as plain data, for the failure groups: per exception of its chain
    (the oldest first) its type name, its text, its frames and how it relates to the one
    before ("cause", "context" or ""). It holds no frame: a traceback's frames keep
    their locals (a task's inputs) alive, and a failure group lives long."""

    chain: tuple[tuple[str, str, tuple[Frame, ...], str], ...]

    @property
    def summary(self) -> str:
        """``Type: text`` of the exception itself."""
        name, text, _, _ = self.chain[-1]
        return f"{name}: {text}" if text else name


def error_text(error: BaseException) -> str:
    """``str(error)``, at most :data:`MAX_ERROR_CHARS` characters of it (a user's
    ``__str__`` that raises gives a note instead), then, for an external command's
    error, the end of what the command wrote (its note,
    :func:`~runtime.errors.note_command_output`: at most ``MAX_COMMAND_OUTPUT``
    characters more)."""
    try:
        text = str(error)[:MAX_ERROR_CHARS]
    except Exception:
        text = "(its text could not be read)"
    output = command_output(error)
    return text if output is None else f"{text}\n{output}"


MAX_ERROR_LINE = 200  #: characters kept of an error's one line (:func:`error_line`)


def error_line(error: BaseException) -> str:
    """Why a task failed, in one line: ``Type: the first line of its text`` (``Type``
    alone for an empty text), at most :data:`MAX_ERROR_LINE` characters (cut with
    ``...``). What its story's ``retry`` and ``erred`` rows and the console's task
    listing say (a user's ``__str__`` that raises gives a note instead)."""
    try:
        text = str(error)[:MAX_ERROR_CHARS].strip()
    except Exception:
        text = "(its text could not be read)"
    first = text.partition("\n")[0].rstrip()
    line = f"{error_name(error)}: {first}" if first else error_name(error)
    return line if len(line) <= MAX_ERROR_LINE else line[: MAX_ERROR_LINE - 3] + "..."


def error_types(error: BaseException | None) -> tuple[str, ...]:
    """The names of ``error``'s type and of its base classes, the type's own first
    (:func:`~runtime.errors.error_name`'s, then its ``__mro__`` less ``object``): what
    the retry policy tests as ``"OSError" in task.error_types``, as ``isinstance``
    would. For a ``RuntimeError`` that stands for an exception that could not travel
    between processes, only the name of the type it stands for (its bases are not
    known here). Empty for None."""
    if error is None:
        return ()
    name = error_name(error)
    if type(error) is RuntimeError and name != "RuntimeError":
        return (name,)
    return tuple(c.__name__ for c in type(error).__mro__ if c is not object)


def error_record(error: BaseException) -> ErrorRecord:
    """``error`` as an :class:`ErrorRecord`: a walk over its frames (a few µs), no
    formatting and no source lines."""
    parts: list[tuple[str, str, tuple[Frame, ...], str]] = []
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen and len(parts) < MAX_ERROR_CHAIN:
        seen.add(id(exc))
        text = error_text(exc)
        frames: list[Frame] = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            frames.append((code.co_filename, tb.tb_lineno or 0, code.co_name))
            tb = tb.tb_next
        if exc.__cause__ is not None:
            older, relation = exc.__cause__, "cause"
        elif exc.__context__ is not None and not exc.__suppress_context__:
            older, relation = exc.__context__, "context"
        else:
            older, relation = None, ""
        parts.append((error_name(exc), text, tuple(frames[-MAX_ERROR_FRAMES:]), relation))
        exc = older
    parts.reverse()  # the oldest first, as Python prints a chain: each part's relation
    name, text, frames_, _ = parts[0]  # is to the one before it; the first has none
    parts[0] = (name, text, frames_, "")
    return ErrorRecord(tuple(parts))


@dataclasses.dataclass(slots=True)
class FailureGroup:
    """The failed tries of one (category, cause): how many (``n``), of how many tasks
    (``tasks``), how many of those tasks then erred (``erred``: the others were retried
    and finished, or are still on their way), and the latest of them (its task, worker,
    outcome, error and the core's time). Updated as each try fails and as a task of
    the group errs (each task keeps its groups, ``TaskState.failed_in``), never
    rebuilt from the tasks."""

    n: int
    key: Key
    worker: str
    outcome: str
    error: ErrorRecord | None
    at: float
    tasks: int = 0
    erred: int = 0


DEPENDENCY_FAILED = "dependency-failed"  #: a :class:`NotRunGroup`'s cause: a dependency failed
NOT_RUN = "not-run"  #: a :class:`NotRunGroup`'s outcome on the dashboard (no try, no worker)
MAX_DEPENDENCY_NOTE = 300  #: characters kept of the failure a story's note repeats


@dataclasses.dataclass(slots=True)
class NotRunGroup:
    """The tasks of one category that erred for one cause without a failed try of
    their own, so in no :class:`FailureGroup`: because a task they depend on failed
    (cause :data:`DEPENDENCY_FAILED`, :class:`~runtime.errors.DependencyFailed`), or
    because the core found they could not run (cause the error's type: TaskTooLarge,
    TaskTooBigForDisk, MemoryStalled, MissingKeysError). How many (tasks, not tries),
    and the latest of them: its task, its ``error`` (for a dependency's failure: that
    failure's, the root's), the core's time and, for a dependency's failure, the
    dependency whose failure it inherited (``dependency``) and the task that failed
    first (``root``: that dependency, or one further up the graph). Updated as each
    such task errs, never rebuilt from the tasks."""

    n: int
    key: Key
    error: ErrorRecord
    at: float
    dependency: Key | None = None
    root: Key | None = None


def dependency_failed_text(dependency: Key, root: Key, summary: str) -> str:
    """Why a task erred with DependencyFailed, in a line: the dependency that failed,
    the task that failed first when that is another one, and its error (``summary``:
    ``Type: text``). The story's note and the failure group's error both say it so."""
    first = "" if root == dependency else f" because {root!r} failed"
    return f"dependency {dependency!r} failed{first}: {summary}"


def not_run_text(error: ErrorRecord, dependency: Key | None, root: Key | None) -> str:
    """Why a task erred with no failed try of its own, in a line, as the dashboard's
    failure group and the monitoring database's ``tasks.error`` say it: for a
    dependency's failure, :func:`dependency_failed_text` of it (``error``: that
    failure's, the root's); else the error itself (``Type: text``)."""
    if dependency is not None and root is not None:
        return dependency_failed_text(dependency, root, error.summary)
    return error.summary


def lost_worker_text(worker: str, cause: str | None, key: Key) -> str:
    """What a try lost with its worker says instead of an error, as the dashboard's
    failure group and the monitoring database's ``tries.error_message`` say it."""
    return f"worker {worker} was lost ({cause or 'unknown'}) with {key!r} sent to it"


def unsaved_work(resumed: float, ran: float, saved: float) -> float:
    """Seconds of a task's execution that its newest checkpoint surviving a loss does
    not hold: the work its try resumed with (``resumed``, :attr:`Checkpoint.work`; 0
    from none) plus the ``ran`` seconds the try executed, less the work that checkpoint
    holds (``saved``; 0 when none survived). The monitoring database's ``tries.unsaved``
    and, capped at the try's run, the retry policy's :attr:`~policies.TaskView.unsaved_for`."""
    return max(resumed + ran - saved, 0.0)


def runs_on(pool: str | None, worker_pool: str | None, reserved: frozenset[str]) -> bool:
    """A task of ``pool`` may run on a worker of ``worker_pool``: one of its pool, or for
    a task of no pool (None) a worker of any pool but the ``reserved`` ones
    (``any_pool_tasks = false``: ``SchedulerConfig.reserved_pools``). The one test of
    it: the core asks it of a worker through ``CorePart._runs_on``."""
    return worker_pool == pool if pool is not None else worker_pool not in reserved


def walltime_loss(
    ts: TaskState, ws: WorkerState, workers: Iterable[WorkerState], drain: float, now: float
) -> WalltimeLoss | None:
    """How ``ts``'s try on ``ws``, lost to ``ws``'s walltime at ``now``, stands against
    the walltime of ``workers``, those that could run it (those of its pool; for a task
    of no pool every worker but a reserved pool's: ``_runs_on``): None when that is not
    known (``ws`` did not say how long it had executed it, or has no deadline) or no
    wall (one of those ``workers`` has no walltime: it could give the task longer).
    ``walltime``: the longest life, from joining to its deadline, of ``ws`` and
    ``workers``; ``drain``: ``ws``'s drain margin."""
    began = ws.executed.get(str(ts.key))
    if began is None or ws.deadline is None:
        return None
    life = ws.deadline - ws.joined
    for w in workers:
        if w.deadline is None:
            return None
        life = max(life, w.deadline - w.joined)
    return WalltimeLoss(max(0.0, now - began), life, drain, ws.pool)


#: what to do about a disk stall (the manager's log, the console's status, the alert)
DISK_STALL_ADVICE = (
    "Give the workers a larger --disk (disk_per_worker), run consumers first "
    "(policy set priority consumers-first), or release the futures you no longer need; "
    "meanwhile idle workers take waiting tasks whose run frees disk, and outputs that "
    "can be made again are dropped to make room"
)
#: what fills a worker's disk that is not Corral's: its file system lacks that much
#: beyond what the worker counts (the stall's ``holding``; docs/files.md)
FOREIGN_FILES = "other files on the file system (not Corral's)"
#: ... and what to do about a disk stall then: a larger --disk cannot help
DISK_STALL_ADVICE_FOREIGN = (
    "Free space on the file system holding the workers' spill directories (other "
    "programs' files take part of it: a larger --disk cannot help), or give the workers "
    "a --spill-dir on a larger file system; release the futures you no longer need. "
    "Meanwhile outputs that can be made again are dropped to make room, and the waiting "
    "tasks fail with TaskTooBigForDisk once that makes no progress"
)


def disk_stall_parts(stall: DiskStallInfo) -> dict[str, str]:
    """A disk stall for people, in parts (the manager's log line has them as fields,
    the console's status joins them): ``workers``, ``disk`` (used of the limit),
    ``holding`` (the file outputs on those disks by category, and the rest),
    ``waiting`` (the ready tasks by category) and ``advice``."""
    files = sum(b for _, b, _ in stall.holding)
    held = [f"{c} {disk_size(b)} in {n}" for c, b, n in stall.holding[:5]]
    if len(stall.holding) > 5:
        held.append(f"{len(stall.holding) - 5} more categories")
    foreign = min(stall.foreign, max(0, stall.disk_used - files))
    rest = max(0, stall.disk_used - files - foreign)
    others = "spilled outputs, checkpoint files and copies under way"
    holding = (f"file outputs: {', '.join(held)}; " if held else "no file outputs; ") + (
        f"{disk_size(rest)} {others}" if rest else f"no {others}"
    )
    if foreign:
        holding += f"; {disk_size(foreign)} {FOREIGN_FILES}"
    waiting = ", ".join(f"{c} {n}" for c, n in stall.waiting[:5])
    if len(stall.waiting) > 5:
        waiting += f", {len(stall.waiting) - 5} more categories"
    return {
        "workers": ", ".join(stall.workers) or "none",
        "disk": f"{disk_size(stall.disk_used)} used of {disk_size(stall.disk)}",
        "holding": holding,
        "waiting": f"{stall.queued} ready tasks wait for disk ({waiting})",
        "advice": DISK_STALL_ADVICE_FOREIGN if foreign else DISK_STALL_ADVICE,
    }


#: what to do about a placement stall, per reason an idle worker takes nothing
#: (``PlacementStallInfo.idle``; the manager's log and the console's status)
PLACEMENT_STALL_ADVICE = {
    "paused": "resume its block (Slurm: scontrol resume) or let the autoscaler start others",
    "draining": "undrain it (undrain WORKER) or scale the pool out",
    "kept": (
        "these blocks keep outputs a waiting task needs, and hold their share of the "
        "batch system while they do (undrain cannot take them back; two or more gather "
        "their outputs up to checkpoint_inline_bytes on one, and the others end): "
        "release the results "
        "the client no longer needs, set a max_blocks the partition can really run at "
        "once beside the kept blocks, or cancel a kept block (Slurm: scancel): its "
        "outputs are computed again"
    ),
    "throttled": (
        "its memory is past the throttle fence: give the workers more memory "
        "(memory_per_worker, --memory), release the futures you no longer need, or let "
        "consumers run first (policy set priority consumers-first)"
    ),
    "full": (
        "threads held by stopped tries or speculative copies take its slots: they free "
        "them when their calls return; restart the worker if they never do, or use "
        "process execution, whose tries can be killed"
    ),
    "resources": (
        "start a worker with enough cores and memory in the pool (cores_per_worker, "
        "memory_per_worker), or lower the tasks' resources="
    ),
    "refused": (
        "read the first ready task's story (story KEY) for the rule that keeps it off, "
        "and check the placement and priority policies (policy)"
    ),
}


def placement_stall_parts(stall: PlacementStallInfo) -> dict[str, str]:
    """A placement stall for people, in parts (the manager's log line has them as
    fields, the console's status joins them): ``workers`` (connected, the first 5 and
    how many more, and how many run tasks), ``idle`` (each idle worker and why it takes
    nothing, the first 5 and how many more), ``waiting`` (the ready tasks and the first
    of them) and ``advice`` (what to do, per reason)."""
    reasons = list(dict.fromkeys(r for _, r, _ in stall.idle))
    idle = "; ".join(f"{w} {r}: {d}" for w, r, d in stall.idle[:5])
    if len(stall.idle) > 5:
        idle += f"; {len(stall.idle) - 5} more idle workers"
    workers = ", ".join(stall.workers[:5]) or "none"
    if len(stall.workers) > 5:
        workers += f", {len(stall.workers) - 5} more"
    busy = f", {stall.busy} running tasks" if stall.busy else ""
    first = f", the first {stall.head}" if stall.head else ""
    return {
        "workers": f"{workers}{busy}",
        "idle": idle,
        "waiting": f"{stall.queued} ready tasks placed nowhere{first}",
        "advice": "; ".join(f"{r}: {PLACEMENT_STALL_ADVICE[r]}" for r in reasons),
    }
