"""The scheduler's pure core: task states, ready queues, placement, tries, statistics.

What lives here: :class:`SchedulerState`. The events it takes and the commands it
returns are in ``actors/scheduler_events.py``; its configuration and its records of
tasks and workers (and the views policies get of them) in
``actors/scheduler_records.py``. ``SchedulerState.handle(*events) -> list[Command]`` is
the only way to change it. No anyio, no sockets, no clock, no threads: events carry ``now`` and a
``stimulus_id``; the actor (``actors/scheduler.py``) carries out the commands.

Task states and the transitions allowed between them are data (``TRANSITIONS``); any
other move raises :class:`InvalidTransition` with the task's story.

    waiting ──► queued ──► processing ──► memory ──► released ──► (forgotten)
       │          │            │  ▲           │          │
       │          │            │  └─ retry ───┘(lost)    └── (recompute) ──► waiting
       └──────────┴────────────┴──► erred | cancelled ──► (forgotten)

- ``waiting``: some dependency is not in memory yet (``waiting_on`` counts them), or a
  retry is held for its backoff (``retry_at``, the retry policy's ``delay``, at most
  ``MAX_RETRY_DELAY``; in the ``retry_held`` heap), or both: queued at the first event
  at or past ``retry_at`` (``_release_retries``) once its inputs are all in memory.
- ``queued``: every dependency is in memory; in a ready queue, not yet on a worker.
- ``processing``: sent to ``worker``; at most ``slots`` such tasks per worker.
- ``memory``: finished; its output lives on the workers in ``who_has``.
- ``released``: finished, but the file registry dropped its output (nobody needed it);
  kept while a dependent may need it recomputed (lineage).
- ``erred`` / ``cancelled``: terminal until forgotten or resubmitted.

A task is *active* while waiting, queued or processing: it still needs its inputs, so it
counts in each dependency's ``consumers``. A task is forgotten (deleted) once it is
released, erred or cancelled, no client wants it and it has no dependents left.

The file registry learns about outputs through :class:`FileFacts` commands (absolute
facts per key: replicas, size, consumers, wanted) and answers with
:class:`FilesReleased` events once it dropped an output nobody needs.

Pruning depth (``SchedulerConfig.prune_depth``, docs/files.md): the ``consumers`` a
fact reports are not 0 while a task within that many steps downstream is active
(``_holds``; with depth 1 the task's own ``consumers``), so the registry keeps an output
until they are done. Replicas: when a task finishes, the replication policy proposes how many
temporary copies its output gets; the core bounds the answer and emits
:class:`Replicate`, and :class:`ReplicasCopied` adds the copies made to ``who_has``. A
lost holder of an output kept by its replicas triggers no recompute; a new replica
replaces the lost copy while the output is needed (``_holder_gone``); so does one on
another worker when a copy fails (never twice on one worker while its holders stay
the same: ``copy_failed``). A copy
whose target is lost stops counting as on its way at once (``_copies_lost``). The copies
off a draining worker (``_copy_off``) go the same way but are evacuations, like those
off a worker that leaves (``evacuating``, ``_evacuated``): no replicas, and a drained
worker that leaves loses nothing, so its going spares no recompute. A worker that
leaves copies each needed output it holds, its own or fetched, that no worker that stays
holds and no other leaving holder's plan copies (``_to_evacuate``: several workers
stopped together copy an output they all hold once); one that goes without a planned
copy has it asked of another leaving holder (``_evacuate_unmade``), as is an output a
worker lost (a survivor or keeper a copy landed on) held with leaving workers only. A copy goes only
to a worker whose memory limit less its memory now and the copies coming to it (on
their way, or planned by any leaving worker) has room for it, or, one that spills (and
no spill of it was refused lately) with disk room for it, whose memory has room for it
to land under its throttle fence (``_has_room``).

Speculative copies (docs/files.md#speculative-copies): on a :class:`Tick`, while a
worker idles (free, running nothing: after ``_fill`` no ready task can go to it), the
speculation policy may propose a copy of a running task; the core places it as any
task on an idle worker (``_candidates``), never where the task runs. Whatever the
policy proposes, no copy is made of a try whose worker is throttled or past its
terminate fence (``_fenced``: the try is slow because of its worker's memory), nor
placed on a worker whose memory limit is not above the RSS rise the try has shown so
far (``_rise_so_far``); its story says why, once. The task stays
``processing`` with its first try in ``worker``; ``copies`` holds the other workers
running it (each copy takes a slot there, ``WorkerState.copies``, and its disk
reservation). The first to finish ok wins (``_copy_finished``, or ``_finished_ok``
cancels the copies); a try or copy that fails or is lost while another runs is
recorded and the other carries on, without a retry (``_promote_copy``); draining a
worker cancels its copies; a task that ends cancels all of them (``_unassign``).

Draining: after :class:`WorkerDraining` a worker gets no new tasks (it is never in
``free``); once the tasks it runs have finished, one :class:`RetireWorker` command says
to stop it. It stays known, serving its outputs, until :class:`WorkerLeft`. Until it is
retired it may be taken back (:class:`WorkerUndrained`, the autoscaler's pool wants it
again): it takes tasks again, and the draining workers waiting to copy their outputs
off may copy them to it; one drained for its walltime or its pool's
``tasks_per_worker``, or leaving on its own, is not (``undrain_refusal``). The core
drains a worker by itself too: before its walltime (``_drain_before_walltime``), and
once it was sent its pool's ``tasks_per_worker`` tries (``SchedulerConfig``; counted in
``_send``, drained in ``_assign`` with the last one: fresh workers, each block ending
after so many tasks, docs/deployment.md).

Suspended: after :class:`Suspended` (the batch system suspended its block) a worker
gets no new tasks either (never in ``free``, no evacuation, copy or replica goes to
it), but it is not retired: what it runs goes on when it resumes (``Suspended`` with
``suspended`` False). Lost meanwhile for no known cause (``unknown``: a stopped
process goes silent), it is lost as ``suspended`` (:meth:`SchedulerState.lost_cause`),
a free loss like ``preempted``: its tasks are not suspects.
Away: after :class:`WorkerAway` (its connection dropped; the gateway holds its id for
its rejoin) a worker gets no new work either, and its cores are not in the metrics; a
:class:`WorkerJoined` (its rejoin) brings it back with its work. Lost instead
(:class:`WorkerLeft`), its life and the tries it was running end at the drop.
After :class:`StoppedWithCluster` (the autoscaler stops its block because the cluster
shuts down) a worker is lost as ``shutdown`` whatever its end says (inside a Slurm job
the stop signal reads as ``preempted`` to it), unless it left on purpose anyway.
After :class:`ClusterStops` (an orderly stop, before the workers are stopped) every task
not finished is cancelled (``stopping``); a task a graph brings after it (new, or a
resubmitted key) is cancelled as it comes, with the same reason, and its clients are told
(``KeyCancelled``): nothing is placed on the workers about to go. The workers that go
after it lose nothing:
a finished task still wanted keeps its end (``memory``, its holders gone with the run:
the one case of ``memory`` with no ``who_has``), never computed again nor recorded as a
recovery, and a leaving worker copies nothing off.

Memory (see docs/memory.md): the memory policy marks categories as *producers* (their
outputs are much larger than their inputs; before any has finished, tasks with no
dependencies). Ready tasks wait in one heap per (pool, producer). A producer goes only to
a worker that is not throttled (:class:`WorkerMemory`) and holds fewer than ``slots``
tasks: roots are withheld beyond saturation, however short. A throttled worker's
producers (deferred there) do not take the slots or the cores consumers need
(``_taken``). Under pressure (some worker throttled) producers yield to consumers when
the memory policy says so. When a category's class flips, its ready tasks move heaps.

Data locality: policies propose, the core decides. The placement policy's optional
hooks (``policies.DataLocality``; the defaults in ``policies.placement.KeepsDataLocal``)
keep consumers with their data: ``partner`` may send the root next in line with a root
just placed, one task past the worker's slots (``_assign_partner``); ``stays_with_data``
may run a consumer that just became ready on the worker holding all its inputs, past
its slots (``_stays_with_its_data``); ``data_holder`` picks a busy worker holding all
the inputs of the consumer to place, which joins ``choose``'s candidates
(``_data_holder``; as the only candidate, only where ``stays_with_data`` agrees too).
The core asks only where the move is allowed (``_may_stay``: the worker is known, not
draining, under its limit, allows the task's pool, resources and memory admission; a
partner also needs a worker not throttled and at most at its slots) and checks the
answer; a missing hook is a rule that is off; a hook that raises
or answers out of bounds is a policy error and nothing moves. Policies see
:class:`TaskStateView` and :class:`WorkerStateView`, never the core's objects.

Long tasks: a task expected to run ``long_task`` seconds or longer, or of a category
with no finished try (``_long``), goes only to a worker running fewer tries than it has
cores (``_core_free``; in ``_candidates``, ``_may_stay`` and ``_assign_partner``): sent
to a busy worker it would wait in that worker's queue, where no worker that joins or
frees up meanwhile could take it. It stays queued (counted in its pool's queue depth and
oldest wait) until a core frees or a worker joins, and while it heads its ready heap,
the tasks behind it there wait too (``_fill``): short ones filling the spare slots
would otherwise keep every core busy and it would never start.

Disk-aware placement, the disk watchdog and its stall breaker are in
``actors/scheduler_disk.py`` (:class:`~actors.scheduler_disk.DiskPlacement`, which
:class:`SchedulerState` inherits; docs/files.md, "Disks").

The memory watchdog (``_watch_memory``), per pool: if every worker of a pool stays
throttled, nothing but producers of it is active there, none of them executing (a try
that executes ends, or is killed, and frees its memory; but one that has executed
longer than its bound, ``_executing_bound``, may hang for ever and no longer counts),
and nothing finishes on them for ``stall_timeout`` seconds, and no task elsewhere
reads an output held there (``_read_elsewhere``), the pool's active tasks fail with
:class:`~runtime.errors.MemoryStalled` (the tries past their bound there among them,
of whatever pool) and the other pools run on; tasks of any pool (``"*"``) only when
every worker that may run them is, and then every active task of no pool or of a pool
with a worker but a reserved pool's fails (``_stalls_with``). What waits, for a pool
and for ``"*"``: a task it would fail that is ready or sent there and not executing,
never one waiting for its inputs (a hung try's own dependents wait for it alone: no
stall).
A pool with a worker away is not stalled while it is away.

Memory admission: a task whose inputs alone are larger than the memory limit of every
worker that could run it is never placed; it fails with
:class:`~runtime.errors.TaskTooLarge`. ``in_nbytes`` is the known size of a task's inputs
(the ``nbytes`` of those that have finished); ``largest`` the largest limit per pool
among workers not draining (0 is no limit). The check is made when an input finishes
(so a task fails as soon as the inputs computed so far are too large, without waiting
for the rest), when a task becomes waiting or queued, and when the limits fall (a
worker leaves or drains, or a pool gets its first worker). A pool with no worker decides
nothing: its tasks wait. Decided against the workers present then: a worker joining
later with a larger limit helps the tasks still waiting, not those that failed. Where
only some workers fit, only they are candidates (``_candidates``,
``_takes_consumer_here``). The failed task's inputs that nothing else needs are
cancelled as unneeded, as for any failure (``_set``); its dependents fail as usual.
Besides, a task whose category is known to raise RSS while it runs (``_rise``: its
``max_rss_growth``) goes only to a worker whose last told RSS plus the rises of the
tries that may run beside it there plus its own stay under the terminate fence, or to
one with none beside it (``_rss_fits``, in ``_candidates``, ``_takes_consumer_here``
and ``_assign_partner``); otherwise it waits in its ready heap.

Retries after a kill for memory (docs/memory.md): a try that ended ``oom`` adds
``(worker, limit, peak)`` to ``TaskState.ooms`` (and whether it ran alone to ``oom_alone``: not
when its own process, the worker's memory that is not outputs and its inputs stay under
the terminate fence); the retry
policy says whether the task
runs again, the core where: only on a worker whose limit passes ``oom_floor``
(``_roomier``, in ``_candidates``, ``_takes_consumer_here`` and ``_assign_partner``). The
retry waits while such a worker of its pool takes tasks or a configured pool's workers
have more (``SchedulerConfig.pool_memory``), and otherwise fails at once with
:class:`~runtime.errors.TaskOutOfMemory` naming every such try (``_no_larger_worker``:
after the retry decision, and for a waiting retry when the limits fall, like memory
admission). A resubmitted task starts afresh.

File outputs (``TaskState.file``) count apart: ``in_nbytes`` leaves them out and
``in_files`` is the known size of a task's inputs that are file outputs, read from disk
and never held in memory; disk-aware placement counts both.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import math
import numbers
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Literal

from actors.host_memory import HostLedger
from actors.protocol import FileFact, TaskResult, ToRun, past_limit_logged
from actors.scheduler_disk import (
    DECLARED_OUTPUT,
    FIRM_OUTPUTS,
    GUESSED_OUTPUT,
    MEASURED_AT_LEAST,
    MEASURED_OUTPUT,
    MEMORY_OUTPUT,
    SEEN_OUTPUT,
    DiskPlacement,
)
from actors.scheduler_events import (
    REUSED_NAMED,
    CancelOnWorker,
    CancelRequested,
    CancelSpared,
    CategoryForgotten,
    CheckpointCopied,
    ClusterStops,
    Command,
    CopyCheckpoint,
    DiskShared,
    DropCheckpoints,
    DropData,
    Evacuate,
    Event,
    Execute,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    KeyCancelled,
    KeyDone,
    KeyErred,
    KeysReleased,
    KeysReused,
    KeyTaken,
    MoveAnswer,
    OutputUnreadable,
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
    ACTIVE,
    DEPENDENCY_FAILED,
    MAX_DEPENDENCY_NOTE,
    NO_LIMIT,
    Checkpoint,
    ErrorRecord,
    FailureGroup,
    NotRunGroup,
    PoolWaits,
    SchedulerConfig,
    TaskState,
    TaskStateView,
    WorkerState,
    dependency_failed_text,
    error_line,
    error_record,
    runs_on,
    unsaved_work,
    walltime_loss,
)
from actors.scheduler_stall import PlacementWatch
from actors.shared_disk import DiskShares
from actors.storage_state import StorageLedger
from policies import (
    BENIGN_LOSSES,
    DEFAULTS,
    MAX_RETRY_DELAY,
    NOT_LOADABLE,
    ON_PURPOSE,
    REGISTRY,
    CategoryStats,
    CategoryStatsView,
    MemoryPolicy,
    PlacementPolicy,
    PriorityPolicy,
    ReplicationPolicy,
    RetryDecision,
    RetryPolicy,
    SpeculationPolicy,
    WalltimeLoss,
    param_values,
    params_of,
    values_text,
)
from policies.priority import FairPriority
from policies.problems import PolicyProblems
from policies.survival import Survival, kaplan_meier
from runtime.client_ids import client_name
from runtime.errors import (
    CancelledError,
    DependencyFailed,
    DiskFull,
    InputsUnreachable,
    InvalidTransition,
    MemoryStalled,
    MissingKeysError,
    ResultNotPicklable,
    RetryPolicyLoop,
    TaskCrashedWorkers,
    TaskLongerThanWalltime,
    TaskNotLoadable,
    TaskOutOfMemory,
    TaskTooLarge,
    UnknownWorkers,
    WorkerLost,
    did_you_mean,
    error_name,
    size_text,
)
from runtime.graph import Key, TaskSpec, node_fingerprint
from runtime.messages import (
    ANY_POOL,
    Outcome,
    TryRecord,
    pool_key,
    pool_name,
    pool_name_problem,
    pool_of_key,
)

__all__ = [
    "ACTIVE",
    "DECLARED_OUTPUT",
    "GUESSED_OUTPUT",
    "MEASURED_AT_LEAST",
    "MEASURED_OUTPUT",
    "MEMORY_OUTPUT",
    "SEEN_OUTPUT",
    "TRANSITIONS",
    "FileFact",
    "InvalidTransition",
    "SchedulerState",
    "TaskResult",
    "ToRun",
]

MAX_LIVES = 1000  #: worker lives kept per pool for its survival estimate
#: A kind's policy calls are also summed over turns, over the last ``POLICY_SPREAD *
#: policy_budget`` seconds (4 s by default): past the budget there too (the policy held
#: the scheduler more than a quarter of that time, a sweep submitting one task per turn
#: to a 0.9 s priority policy), it is a slow spell, counted as a slow turn is
POLICY_SPREAD = 4.0
#: Seconds below which a policy call never counts towards a slow spell: a fast policy
#: asked often (a priority for each of many tasks, its calls stretched by a loaded
#: machine's wall time) is not a slow one; the per-turn budget still bounds how long
#: the calls of one turn hold the scheduler, however short each is
POLICY_CALL_FLOOR = 0.001
#: Seconds per call a turn's calls of one kind must average for the turn to be part of
#: a slow spell: many cheap calls in one turn (a priority for each task of a large
#: intake) are not a slow policy, even when a few of them took 1 ms or more in wall time
#: (a thread switch inside a call: task threads in the same process hold the GIL for
#: milliseconds); a policy asked once or a few times per turn, each call slow, still is.
#: Such cheap calls are excused only while the turn's calls total less than
#: ``policy_budget / POLICY_SPREAD`` (0.25 s): a policy of 9 ms a call asked for 100
#: tasks a turn holds the scheduler 0.9 s of each turn, and its turns are a spell
POLICY_SPELL_MEAN = 0.01


def _cheap_turn(seconds: float, calls: float, budget: float) -> bool:
    """Whether a turn's ``calls`` of one kind, ``seconds`` in all, are many cheap calls
    that are no part of a slow spell: they average under ``POLICY_SPELL_MEAN`` and,
    together, held the scheduler less than ``budget / POLICY_SPREAD``."""
    return seconds < POLICY_SPELL_MEAN * calls and seconds < budget / POLICY_SPREAD


#: tasks that were executing on a worker when it crashed kept, the latest, for the
#: suspects the status names (:meth:`SchedulerState.crash_suspects`)
MAX_SUSPECTS = 20
WAIT_QUANTILES = (0.5, 0.9, 0.99)  #: the wait quantiles the metrics give
#: tasks of the next wave :meth:`SchedulerState.upcoming` looks at per pool, at most
UPCOMING_MOST = 1024
#: inputs it looks at per call, at most (a task with very many inputs costs its share)
UPCOMING_INPUTS = 20_000
RECENT_TRIES = 300  #: the latest tries that ended (any outcome) kept for the task stream
#: why a task not finished when the cluster stopped on purpose was cancelled
#: (:class:`ClusterStops`): its ``CancelledError``'s reason
STOPPED_REASON = "the cluster stopped before it finished"
#: a task whose inputs could not be had from connected workers this many times in a
#: row, for ``SchedulerConfig.unreachable_for`` seconds, fails with InputsUnreachable
#: instead of waiting for them again
MAX_INPUTS_UNREACHABLE = 5
#: seconds such a task is held back (queued, not placed) after its second try in a row
#: that could not have its inputs, doubled per try after that up to
#: :data:`MAX_INPUTS_BACKOFF`: a worker cut off from its peers otherwise has its inputs
#: made again and fetched in vain as fast as the workers go (thousands of tries a second)
INPUTS_BACKOFF = 0.5
MAX_INPUTS_BACKOFF = 10.0
#: seconds an output a gather could not reach (``unreached``) waits, its holder seen
#: connected, before a :class:`Tick` tells its clients again where it is: the holder
#: rejoined before the gather's word came, or the word of its drop (``WorkerAway``) is
#: still on its way (then the client is sent back to it once more, in vain)
UNREACHED_AGAIN = 0.5
MAX_FAILURE_GROUPS = 1000  #: failure groups kept; later new causes count under "(other)"
#: task categories the metrics label by name; later ones count under OTHER_CATEGORY
MAX_METRIC_CATEGORIES = 500
#: the most task categories whose statistics the scheduler keeps (``stats``, and with
#: them the class, the policies' views, the pools' lists, the counts of failed tries
#: ``failures``): a new one past it makes it
#: forget the category finished least recently that has no task it knows; a
#: long-lived manager sees ever new categories, run after run
MAX_CATEGORIES = 2_000
#: a worker's terminate fence, as a fraction of its memory limit, where it has not told
#: its own (``WorkerMemory.terminate_at``: before its first memory report, or with its
#: fence off): the default of ``MemoryConfig.terminate`` (:func:`terminate_fence`)
TERMINATE = 0.95
#: a category's RSS rise under this many bytes is noise (pages, allocator slack): not held
MIN_RISE = 2**20
#: categories looked at per forgetting, oldest first (those with tasks go to the back)
FORGET_SCAN = 8
#: Keys of one submission, known already, whose tasks the core compares with the known
#: ones (:meth:`SchedulerState._note_reuse`: a pickle of each node, some tens of
#: microseconds): a graph submitted again whole costs at most this many comparisons
REUSE_CHECKS = 1_000
#: clients whose turns are kept (``SchedulerState.turns``) before those with no turn
#: ahead of the one being served are dropped (they start at ``turn_floor`` anyway)
MAX_CLIENT_TURNS = 1024
OTHER_CATEGORY = "(other)"
#: a try that executes holds its pool's memory watchdog off (it ends, or is stopped,
#: and frees its memory) for at most this many ``stall_timeout``s, or twice its
#: category's longest ok try, or its ``timeout=``, whichever is longest
#: (``SchedulerState._executing_bound``): past that it may hang for ever, and a pool
#: stalled otherwise fails with MemoryStalled, that try among the tasks failed
EXECUTING_STALLS = 30


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of ``ordered`` (sorted, nearest rank; 0.0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


State = Literal["waiting", "queued", "processing", "memory", "released", "erred", "cancelled"]
#: after an event of the first kind a draining worker that keeps outputs only it holds
#: may let some go (copied, released, no longer read) or find a worker to copy them to;
#: after one of the second (a worker joined, went, drains or leaves, or said what it
#: holds), what it keeps is counted again from what it holds
_FILTER, _RECOUNT = 1, 2
_KEEPING_EVENTS: dict[type[Event], int] = {
    ReplicasCopied: _FILTER,
    ReplicasMissing: _FILTER,
    TasksFinished: _FILTER,
    KeysReleased: _FILTER,
    FilesReleased: _FILTER,
    CancelRequested: _FILTER,
    WorkerJoined: _RECOUNT,
    WorkerLeft: _RECOUNT,
    WorkerHeld: _RECOUNT,
    WorkerDraining: _RECOUNT,
    WorkerUndrained: _RECOUNT,
    WorkerLeaving: _RECOUNT,
}

#: Allowed (start, finish) pairs. Anything else is a bug and raises InvalidTransition.
TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("new", "waiting"),
        ("new", "queued"),
        ("waiting", "queued"),
        ("waiting", "erred"),
        ("waiting", "cancelled"),
        ("queued", "processing"),
        ("queued", "waiting"),
        ("queued", "erred"),
        ("queued", "cancelled"),
        ("processing", "memory"),
        ("processing", "queued"),
        ("processing", "waiting"),
        ("processing", "erred"),
        ("processing", "cancelled"),
        ("memory", "released"),
        ("memory", "waiting"),
        ("memory", "queued"),
        ("released", "waiting"),
        ("released", "queued"),
        ("erred", "waiting"),
        ("erred", "queued"),
        ("cancelled", "waiting"),
        ("cancelled", "queued"),
    }
)


#: states where a task's checkpoint is of no more use (its try will not be resumed)
_ENDED: frozenset[str] = frozenset({"memory", "erred", "cancelled"})

#: each allowed transition's index into ``SchedulerState.moves`` (counts of each move)
_MOVES: dict[tuple[str, str], int] = {m: i for i, m in enumerate(sorted(TRANSITIONS))}
#: per move index: +1 if it enters ``queued``, -1 if it leaves it, else 0
_QUEUED_DELTA: tuple[int, ...] = tuple(
    (finish == "queued") - (start == "queued") for start, finish in sorted(TRANSITIONS)
)
#: per allowed move, what ``SchedulerState._set`` needs of it, worked out once here
#: rather than on every move: its ``_MOVES`` index, whether it leaves and enters an
#: active state, whether it enters or leaves ``waiting`` (either), whether it ends the
#: task's try for good (``_ENDED``), and its ``_QUEUED_DELTA``
_MOVE_FACTS: dict[tuple[str, str], tuple[int, bool, bool, bool, bool, int]] = {
    (start, finish): (
        i,
        start in ACTIVE,
        finish in ACTIVE,
        (start == "waiting") != (finish == "waiting"),
        finish in _ENDED,
        _QUEUED_DELTA[i],
    )
    for (start, finish), i in _MOVES.items()
}


@dataclasses.dataclass(slots=True)
class MetricTotals:
    """The counters of one metrics label (a ``CategoryMetrics``), added to as tries
    end: tries finished ok, their seconds, output and input bytes, the highest RSS."""

    finished: int = 0
    duration_sum: float = 0.0
    output_bytes: int = 0
    input_bytes: int = 0
    peak_rss: int = 0


@dataclasses.dataclass(slots=True)
class _Submission:
    """A submission being taken in (its pieces, ``GraphSubmitted``, may come between
    other clients' pieces): its ``generation``, the turn it starts from (``turn_base``,
    ``_take_turns``), and its keys that named other known tasks (the first
    ``REUSED_NAMED``), how many, and how many known keys were compared (``_note_reuse``)."""

    generation: int
    turn_base: float = 0
    reused: list[Key] = dataclasses.field(default_factory=list)
    reused_count: int = 0
    reuse_checks: int = 0


#: runs counted for ``ProgressQuery`` at once: past it one is let go (a client that
#: asked and never came back for its counts holds no more than these): the oldest of
#: those whose tasks all ended and were all handed over, else the oldest of those whose
#: tasks all ended, else the oldest (:meth:`SchedulerState._progress_victim`); its
#: client's next ask is answered None, and the client says so
MAX_PROGRESS_RUNS = 64

#: a state's place among ``RunProgress.counts``: waiting (any state not named), ready
#: (``queued``), running (``processing``)
_PROGRESS_SLOT: dict[str, int] = {"queued": 1, "processing": 2}


def _ran_on(ts: TaskState) -> str:
    """The worker ``ts``'s latest try ran on ("" for none)."""
    return ts.worker or (ts.tries[-1].worker if ts.tries else "")


@dataclasses.dataclass(slots=True)
class RunProgress:
    """How the tasks of one counted submission (``GraphSubmitted.progress``) moved:
    ``total`` taken in so far, ``finished`` (ended: memory, erred or cancelled, each
    once), ``erred``, ``counts`` of the others (waiting, ready, running), ``ended``:
    ``(key, worker, state)`` of those ended since the last ask, ``complete``: the
    submission's last piece is in."""

    total: int = 0
    finished: int = 0
    erred: int = 0
    counts: list[int] = dataclasses.field(default_factory=lambda: [0, 0, 0])
    ended: list[tuple[Key, str, str]] = dataclasses.field(default_factory=list)
    complete: bool = False
    gone: bool = False  # let go: its tasks' moves count no more


@dataclasses.dataclass(slots=True)
class _Room:
    """What :func:`_has_room` weighs, per worker id of the survivors an evacuation plan
    may copy outputs to (``SchedulerState._room_counts``): the bytes of the outputs it
    holds (``held``), those coming to it (``coming``: ``SchedulerState._coming``), those
    the plan being made adds (``added``, 0 at first) and whether it spills now
    (``spills``: ``SchedulerState._spills_now``)."""

    held: dict[str, int]
    coming: dict[str, int]
    added: dict[str, int]
    spills: dict[str, bool]

    def fits(self, ws: WorkerState, ts: TaskState) -> bool:
        """A copy of ``ts``'s output fits ``ws`` beside what it holds and what comes
        (:func:`_has_room`)."""
        i = ws.id
        return _has_room(ws, ts, self.held[i], self.added[i], self.coming[i], self.spills[i])

    def place(self, fits: list[WorkerState], nbytes: int) -> WorkerState:
        """Of ``fits``, the worker that will then hold the fewest bytes (held, coming
        and added; the lowest id among equals), which the plan puts ``nbytes`` more on."""
        to = min(fits, key=lambda w: (self.held[w.id] + self.coming[w.id] + self.added[w.id], w.id))
        self.added[to.id] += nbytes
        return to


#: seconds within which keepers' walltimes count as ending together
#: (:func:`_longest_lived`): each worker's deadline is its walltime read at its own
#: join, so one block's workers, or blocks started together, differ by microseconds to
#: seconds; among those alike, a copy goes to the one that will hold the fewest bytes
KEEPERS_ALIKE = 60.0


def _longest_lived(workers: list[WorkerState]) -> list[WorkerState]:
    """Of ``workers``, those whose walltime ends last (``deadline``; none: last of
    all), or within :data:`KEEPERS_ALIKE` of it: a copy put on one about to reach its
    walltime would be lost again with it."""
    last = max(math.inf if w.deadline is None else w.deadline for w in workers)
    return [
        w
        for w in workers
        if (math.inf if w.deadline is None else w.deadline) >= last - KEEPERS_ALIKE
    ]


class _NotATuple(Exception):
    """A priority policy answered text: what it answered, for the story."""


class _OverBudget(Exception):
    """A policy kind's calls took their budget for this turn: it is not asked again
    until the next one (:meth:`SchedulerState._ask`); its fallback answers."""


@dataclasses.dataclass(slots=True)
class _PolicyTurn:
    """One policy kind's calls in this turn of the scheduler (:meth:`SchedulerState._ask`),
    settled at its end (:meth:`SchedulerState._end_turn`)."""

    seconds: float = 0.0  #: what its calls took
    calls: int = 0
    skipped: int = 0  #: calls not made, over its budget (its fallback answered)
    #: of its calls, those of ``POLICY_CALL_FLOOR`` or more (what a slow spell sums):
    #: their seconds and their number
    slow: float = 0.0
    slow_calls: int = 0


def terminate_fence(ws: WorkerState) -> float:
    """Bytes where ``ws``'s terminate fence is, as the core's own fence tests take it:
    the fence it told in its latest memory report (its ``memory_options``' terminate),
    else ``TERMINATE`` of its memory limit. Memory admission by RSS rise keeps the tries
    running on a worker under it (``_rss_fits``), a try killed for memory under it
    beside the worker's outputs was not the kill's cause alone (``oom_alone``), and no
    speculative copy is made of a try on a worker at or past it (``_fenced``)."""
    return ws.memory * TERMINATE if ws.terminate_at is None else ws.terminate_at


def _raised(where: str, exc: BaseException) -> str:
    """What makes two raises of a policy the same problem: where, and the type."""
    return f"{where} raised {type(exc).__name__}"


def _no_timer() -> float:
    """The timer of a core given none: no time passes, no policy is ever over budget."""
    return 0.0


class SchedulerState(DiskPlacement, PlacementWatch):
    """The scheduler's state. Change it only through :meth:`handle`."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        priority: PriorityPolicy | None = None,
        placement: PlacementPolicy | None = None,
        retry: RetryPolicy | None = None,
        memory: MemoryPolicy | None = None,
        replication: ReplicationPolicy | None = None,
        speculation: SpeculationPolicy | None = None,
        timer: Callable[[], float] = _no_timer,
    ) -> None:
        self.config = config or SchedulerConfig()
        #: seconds, for timing policy calls (the shell's ``time.perf_counter``): time as
        #: data, read around each policy call only (:meth:`_ask`)
        self._timer = timer
        #: per policy kind asked in this turn, its calls; settled at the end of the
        #: turn (:meth:`_end_turn`)
        self._turn: dict[str, _PolicyTurn] = {}
        #: per kind, when its latest slow turns were (within ``policy_slow_window``)
        self._slow_turns: dict[str, deque[float]] = {}
        #: per kind, its earlier turns' policy calls of ``POLICY_CALL_FLOOR`` or more
        #: within ``POLICY_SPREAD * policy_budget`` seconds, of the turns that were not
        #: many cheap calls (:func:`_cheap_turn`): (when, seconds, calls), and
        #: [their seconds, calls]
        self._spent: dict[str, deque[tuple[float, float, int]]] = {}
        self._spent_sum: dict[str, list[float]] = {}
        #: policy errors per kind, the latest problem of each, and what to tell
        self.problems = PolicyProblems()
        #: per kind, the latest problem of the policy in force now (none since its swap)
        self.failing: dict[str, str] = {}
        self.tasks: dict[Key, TaskState] = {}  #: every task not yet forgotten
        self.workers: dict[str, WorkerState] = {}  #: workers by id
        #: pool -> (seconds lived, died unasked) of the workers that left it, newest last
        self.lives: dict[str, deque[tuple[float, bool]]] = {}
        #: the latest tasks (at most MAX_SUSPECTS, newest last) whose try was lost with
        #: a worker that ended unexpectedly while it may have executed them
        #: (:meth:`TaskState.crashes`): what may have killed it (:meth:`crash_suspects`)
        self.crashed: dict[Key, None] = {}
        self.deadlines = 0  #: workers with a walltime deadline
        self.free: dict[str, WorkerState] = {}  #: workers with a free slot
        #: (category, pool) of tasks that memory admission by RSS rise held back in this
        #: fill, since its latest placement: the next of them wait without being asked
        self._rise_held: set[tuple[str, str | None]] = set()
        #: at least the largest ``rss_rise`` of any category (lowered only when one's
        #: largest rise leaves its window, or it is forgotten): a bound that lets
        #: ``_rss_fits`` say yes without looking at a worker's tries, far from its fence
        #: (which is nearly always)
        self.max_rise = 0
        self.draining: set[str] = set()  #: draining workers not yet retired
        #: ready heaps by (pool, producer); an entry ``(behind, prio, seq, task)`` is
        #: stale once its task is not queued or is of the other class (``_live``)
        self.queues: dict[tuple[str | None, bool], list[tuple[Any, ...]]] = {}
        #: per category, its tasks in a ready heap and their heap entries: a class flip
        #: moves these alone (``_reclassify``), not every ready task
        self.ready_entries: dict[str, dict[TaskState, tuple[Any, ...]]] = {}
        #: queued tasks backing off, ``(until, seq, task)`` (stale entries are skipped:
        #: an entry counts while its task is queued and ``held_until`` is ``until``)
        self.held: list[tuple[float, int, TaskState]] = []
        #: retries held for their backoff (``RetryDecision.delay``), ``(until, seq,
        #: task)``: waiting, not ready, until then (an entry counts while its task's
        #: ``retry_at`` is ``until``; ``_release_retries``)
        self.retry_held: list[tuple[float, int, TaskState]] = []
        #: per-category statistics, the category finished least recently first; at
        #: most ``MAX_CATEGORIES`` of them but those with known tasks (``_stat``)
        self.stats: dict[str, CategoryStats] = {}
        #: per category, how many tasks of it ``tasks`` holds (categories with none left out)
        self.category_tasks: dict[str, int] = {}
        self.categories_forgotten = 0  #: categories whose statistics were forgotten
        self._forgotten_finished = 0  #: tasks finished ok of the forgotten categories
        #: per pool, the categories that finished on its workers: the tasks whose
        #: length sets its workers' default drain margin (``drain_margin``)
        self.pool_categories: dict[str, set[str]] = {}
        #: the metrics' per-category counters, kept as tries end so that a scrape reads
        #: at most ``MAX_METRIC_CATEGORIES + 1`` of them, whatever the number of
        #: categories: the categories labelled by name (the first ones with a try that
        #: ended; a label once given stays, every counter only grows), the totals per
        #: label (``OTHER_CATEGORY``: the rest), failed tries per (label, outcome, cause)
        self.metric_labels: set[str] = set()
        self.metric_totals: dict[str, MetricTotals] = {}
        self.metric_failures: Counter[tuple[str, str, str]] = Counter()
        #: per category, the ``metric_totals`` entry it counts in (``_metric``)
        self._category_totals: dict[str, MetricTotals] = {}
        #: what policies see of them: a read-only view per category (made with its
        #: statistics, in ``_stat``) in a read-only mapping
        self._stat_views: dict[str, CategoryStatsView] = {}
        self._stats_view = MappingProxyType(self._stat_views)
        self.policies: dict[str, Any] = {
            "priority": priority or REGISTRY.create("priority", DEFAULTS["priority"]),
            "placement": placement or REGISTRY.create("placement", DEFAULTS["placement"]),
            "retry": retry or REGISTRY.create("retry", DEFAULTS["retry"]),
            "memory": memory or REGISTRY.create("memory", DEFAULTS["memory"]),
            "replication": replication or REGISTRY.create("replication", DEFAULTS["replication"]),
            "speculation": speculation or REGISTRY.create("speculation", DEFAULTS["speculation"]),
        }
        #: the placement policy's DataLocality hooks (None: that rule is off)
        self._partner: Any = None
        self._stays: Any = None
        self._holder: Any = None
        self._locality_hooks()
        #: the kinds whose policy is timed (:meth:`_ask`): a user's, not a built-in one
        #: (Corral's own answer in microseconds: a slow turn of one is the machine's,
        #: a garbage collection or a paused process, which must not replace it)
        self._timed = {k for k, p in self.policies.items() if not _builtin(p)}
        self._min_cost = 0.0  #: the replication policy's ``min_cost`` (0: ask always)
        self._replication_floor()
        self.classes: dict[str, bool] = {}  #: category -> is a memory producer
        self.throttled: set[str] = set()  #: workers past their throttle fence
        #: the workers of each pool and how many of them are throttled: the memory
        #: watchdog finds the pools whose every worker is throttled in O(pools)
        self.pool_members: dict[str, dict[str, WorkerState]] = {}
        self.throttled_in: Counter[str] = Counter()
        #: memory admission: the largest memory limit among the workers that take new
        #: tasks (not draining), per pool and over every pool (``None``); a limit of 0 is
        #: no limit (``inf``). A pool without such a worker is absent: nothing is decided
        self.largest: dict[str | None, float] = {}
        #: the smallest of ``largest``'s limits: a task whose known inputs are no larger
        #: fits some worker of any pool (the one comparison on the hot path)
        self._floor = NO_LIMIT
        #: the most cores of a worker that takes new tasks, the same way (the story of
        #: a task none can run says so: ``_tell_resources_wait``)
        self.largest_cores: dict[str | None, float] = {}
        #: per pool (``"*"``: every worker, the tasks of any pool), when the memory
        #: watchdog saw a stall of it begin
        self.stalled_since: dict[str, float] = {}
        self._init_disk()  # the disk part's own state (actors/scheduler_disk.py)
        self._init_placement_watch()  # the placement watchdog's (actors/scheduler_stall.py)
        self.disk_full_tries = 0  #: tries that ended ``disk-full``
        self.disk_full_failed = 0  #: tasks that failed with ``DiskFull``
        self._flipped: set[str] = set()  #: categories whose class flipped this event
        #: the checkpoint registry (docs/files.md#checkpoints): per task that saved one
        #: and has not ended, its latest checkpoint first and, when that one has no copy
        #: off its worker yet, the newest one that has; dropped when the task ends
        self.checkpoints: dict[Key, list[Checkpoint]] = {}
        self.checkpoint_held = 0  #: bytes of checkpoints the scheduler holds
        #: per task with checkpoints, the workers that may have files of them (owners,
        #: copy holders, workers that fetched one to resume): told to drop them at the end
        self.checkpoint_workers: dict[Key, set[str]] = {}
        #: checkpoints ``saved``, tries started from one (``resumed``), tasks whose
        #: checkpoints were dropped at their end (``pruned``), checkpoints not held by
        #: the scheduler past its budget (``refused``), copies made on a peer
        #: (``copied``), checkpoints lost with every copy of them (``lost``)
        self.checkpoint_counts: Counter[str] = Counter()
        self.generation = 0  #: submissions so far
        #: per client id, the turn after its latest task's (``_take_turns``); a client
        #: whose turns are all behind ``turn_floor`` is dropped from it
        self.turns: dict[str, float] = {}
        #: the turn of the task sent to a worker latest: a client's next submission
        #: starts at it at the earliest (an idle client saves no turns)
        self.turn_floor = 0.0
        #: the submissions being taken in, by client and run (``GraphSubmitted.echo_to``,
        #: ``run``): the pieces of different submissions may come between each other's
        #: (the shell's intake serves clients in turn, and a client's submissions that
        #: share no key in turn); ``_latest``: the one started last
        self._open: dict[tuple[str, str], _Submission] = {}
        self._latest = _Submission(0)
        self._sub = self._latest  #: the submission of the piece being taken in
        self.story_log: deque[tuple[Any, ...]] = deque(maxlen=self.config.story_length)
        #: the monitoring feed, kept once a reader asked (:meth:`feed_since`): one
        #: entry per handled event that changed anything a monitor records, ``(now,
        #: records)``, not read yet; ``feed_next`` is the number the next entry gets,
        #: ``feed_held`` counts the records held; ``_records``: this event's so far
        self.feed: deque[tuple[float, list[tuple[Any, ...]]]] = deque()
        self.feed_on = self.config.monitor
        #: disks, transfers and recoveries over time (docs/files.md, "Storage over time")
        self.storage = StorageLedger()
        #: the workers of each machine and whether their limits pass its memory
        self.hosts = HostLedger()
        #: the same for the workers' ``cores`` against the CPUs their machine lets them
        #: use (each worker counted: threads of one process run tasks side by side)
        self.host_cores = HostLedger("cores")
        #: the workers of each file system, and the disk share of those without --disk
        #: (docs/files.md#workers-sharing-a-file-system)
        self.disk_shares = DiskShares()
        self.feed_next = 0
        self.feed_held = 0
        self._records: list[tuple[Any, ...]] = []
        #: how often each transition happened (by ``_MOVES`` index), tasks created and
        #: tasks forgotten per state, and queued tasks per pool ("*": any pool): kept in
        #: step with every transition, so status counts tasks without scanning them
        self.moves: list[int] = [0] * len(_MOVES)
        #: the counted runs (``ProgressQuery``), oldest first, and per task not ended
        #: yet the runs counting it: empty (one falsy check per move) when none is
        self.progress: dict[str, RunProgress] = {}
        self._tracked: dict[TaskState, list[RunProgress]] = {}
        self.created = 0
        self.forgotten: Counter[str] = Counter()
        self.queued_counts: Counter[str] = Counter()
        #: per configured pool, the ready tasks it may run (its own; of no pool too,
        #: unless it is reserved) that ask for more cores or memory than its configuration
        #: gives each of its workers (:meth:`unfit_pools`): no demand for its blocks
        self.unfit_counts: Counter[str] = Counter()
        #: tasks known (not forgotten) per pool ("*": any pool): a pool with none, no
        #: worker and no configuration leaves the metrics (:meth:`pool_metrics`)
        self.pool_tasks: Counter[str] = Counter()
        #: the next wave, per pool (``"*"``: any pool): waiting tasks none of whose
        #: inputs waits (each is being made, queued or done), in the order they joined
        self.next_wave: dict[str, dict[TaskState, None]] = {}
        #: per pool ("*": any pool): its ready tasks (``since``) and, per pool of the
        #: workers that took them, the waits served (:class:`PoolWaits`)
        self.pool_waits: dict[str, PoolWaits] = {}
        #: failed tries per category, per (outcome, cause): kept with the category's
        #: statistics and forgotten with them (``_forget_categories``, past
        #: ``MAX_CATEGORIES``); the metrics' counters (``metric_failures``) keep counting
        self.failures: dict[str, Counter[tuple[str, str]]] = {}
        self._forgotten_failures = 0  #: failed tries of the forgotten categories
        #: per (category, cause): the count and latest failed try (:class:`FailureGroup`)
        self.failure_groups: dict[tuple[str, str], FailureGroup] = {}
        #: per (category, cause): the tries lost with their worker for a cause that says
        #: nothing of the task (``BENIGN_LOSSES``: preempted, walltime, drained, ...)
        #: and retried free, kept apart from ``failure_groups``: not failures (the
        #: dashboard's "Tries lost with their worker (free retries)"); in ``failures``
        #: and the metrics' counters still, as every lost try is
        self.free_groups: dict[tuple[str, str], FailureGroup] = {}
        #: per (category, cause): the count and latest of its tasks that erred with no
        #: failed try of their own (:class:`NotRunGroup`: a dependency failed, or the
        #: core found they cannot run), so in neither ``failures`` nor ``failure_groups``
        self.not_run_groups: dict[tuple[str, str], NotRunGroup] = {}
        #: the failed task and root failure the latest dependent inherited, with what
        #: was made of them (reason, story note, error record): a failure spreading to
        #: many dependents formats and records its error once. Cleared once the
        #: failures have spread, so it holds no task nor exception past that
        self._inherited: tuple[TaskState, BaseException, str, str, ErrorRecord] | None = None
        #: the latest tries that ended: (record, category, core time it ended)
        self.recent_tries: deque[tuple[TryRecord, str, float]] = deque(maxlen=RECENT_TRIES)
        #: the tries that ended, ever: the latest of recent_tries is the tries_ended-th
        self.tries_ended = 0
        #: temporary replicas (docs/files.md#replicas): per output in memory, the
        #: workers holding a replica made for it; replicas made, their bytes, copies that
        #: failed, and losses of a holder after which only replicas kept the output
        self.replicas: dict[TaskState, set[str]] = {}
        #: copies asked for and not answered yet (:class:`Replicate`, until its
        #: :class:`ReplicasCopied`, or until the target is lost): key -> {target: bytes}
        self.copying: dict[Key, dict[str, int]] = {}
        #: the copies of ``copying`` a draining worker's :meth:`_copy_off` asked for,
        #: ``(key, target)``: evacuations, not replicas (no replication policy made them).
        #: Kept until answered (the answer always comes), even when the target is lost
        #: meanwhile, so that a late answer is not taken for a replica's
        self.evacuating: set[tuple[Key, str]] = set()
        #: the copies a leaving worker's plan (:class:`Evacuate`) sends, per target:
        #: target -> {key: the leaving source}, until the source's :class:`WorkerLeft`
        #: says which were made. A target that says it leaves meanwhile has them
        #: copied from the source to a survivor instead (:meth:`_worker_leaving`)
        self.evac_planned: dict[str, dict[Key, str]] = {}
        #: an event that may change what a draining worker keeps (``_retire_idle``): 0
        #: none; ``_FILTER``: some of it may be let go; ``_RECOUNT``: a holder went
        self._keeping_changed = 0
        #: per output in memory, the workers a copy of it failed to (not asked again)
        self.copy_failed: dict[TaskState, set[str]] = {}
        #: bytes of the outputs each worker holds (its ``has_what``), kept as they move
        self.held_bytes: dict[str, int] = {}
        self.replicas_made = 0
        self.replica_bytes = 0
        self.replicas_failed = 0
        self.recomputes_avoided = 0
        #: outputs lost with their workers that only clients hold, each given to a
        #: client already (``TaskState.delivered``), with the worker each was lost
        #: with: ``released`` and still wanted, made again only once something needs
        #: one (a task reading it, a gather of it, a submission naming it: ``_recompute``)
        self.lost_held: dict[TaskState, str] = {}
        #: outputs in memory, still wanted, that a gather could not reach on their
        #: holder (``ReplicasMissing`` with ``reached`` false: it is away), with that
        #: worker and when: the manager forgot its word on each, and the gathering
        #: client waits for the next one. Not ``delivered`` meanwhile, whatever word of
        #: an earlier gather comes (lost, it is made again at once); told again
        #: (``KeyDone``) once a connected worker holds it (``_held_again``: its holder
        #: back, or a copy), or on a Tick :data:`UNREACHED_AGAIN` after, held by one
        #: (its holder came back before the gather's word: ``_tell_unreached``)
        self.unreached: dict[TaskState, tuple[str, float]] = {}
        #: the cluster stops on purpose (:class:`ClusterStops`): its tasks ended, and a
        #: worker that goes now takes nothing anyone will read
        self.stopping = False
        #: speculative copies (docs/files.md#speculative-copies): per running task, the
        #: workers running a copy of it besides ``TaskState.worker``, each with when the
        #: copy was sent and the disk reserved for it there
        #: speculative copies running: task -> worker -> (sent, disk reserved, attempt)
        self.copies: dict[TaskState, dict[str, tuple[float, int, int]]] = {}
        #: (task, worker) -> when a copy there began to execute (``TasksRunning``)
        self.copy_started: dict[tuple[TaskState, str], float] = {}
        self._attempts = 0  #: tries sent so far (each try's ``ToRun.attempt``)
        #: copies started, and how the ones that ended did: ``won`` (finished first),
        #: ``lost`` (cancelled: the other try finished first, or the task ended),
        #: ``failed`` (the copy failed or its worker was lost while the other try ran)
        self.speculative: Counter[str] = Counter({"started": 0, "won": 0, "lost": 0, "failed": 0})
        self._max_copies = 0  #: the speculation policy's ``max_copies`` (0: off)
        self._speculation_bound()
        self._depth = self.config.prune_depth
        self._seq = itertools.count()
        # Per-handle scratch, flushed into commands at the end of handle().
        self._out: list[Command] = []
        self._execute: dict[str, list[ToRun]] = {}
        #: the tries in ``_execute``: (worker, key) -> attempt; and the attempts taken
        #: back before ``_flush`` sent them (``_cancel_on``)
        self._unsent: dict[tuple[str, Key], int] = {}
        self._withdrawn: set[int] = set()
        self._files: dict[Key, TaskState] = {}
        self._forgotten: list[Key] = []
        self._to_fail: list[tuple[TaskState, TaskState]] = []
        self._to_cancel: list[tuple[TaskState, str]] = []
        #: keys cancelled while pieces of graphs that bring them were still to come
        #: (``CancelRequested.coming``): key -> [reason, pieces still to bring it]; each
        #: is cancelled as it comes, never queued (:meth:`_graph_submitted`)
        self._cancel_ahead: dict[Key, list[Any]] = {}
        self._too_large: list[TaskState] = []  #: to check (and fail) for admission
        #: tasks killed for memory to check (and fail) for a larger worker
        self._oom_stuck: list[TaskState] = []
        #: the free workers the last ``_candidates`` call refused for their disk alone
        #: (empty unless disk was all that kept the task from every free worker)
        self._short_of_disk: list[WorkerState] = []
        self._stimulus = ""
        self._now = 0.0

    # ----------------------------------------------------------------- the one mutator

    def handle(self, *events: Event) -> list[Command]:
        """Apply ``events`` in order; return the commands to carry out."""
        for ev in events:
            self._stimulus = ev.stimulus_id
            self._now = ev.now
            method = _DISPATCH.get(type(ev))
            if method is None:
                raise TypeError(f"SchedulerState cannot handle {type(ev).__name__}")
            method(self, ev)
            self._spread_failures()
            if self._flipped:
                self._reclassify()
            if self.held and self.held[0][0] <= self._now:
                self._release_held()
            if self.retry_held and self.retry_held[0][0] <= self._now:
                self._release_retries()
            self._fill()
            while self._to_fail or self._to_cancel or self._too_large or self._oom_stuck:
                self._spread_failures()  # a task placement failed (TaskTooBigForDisk)
                self._fill()
            self._watch()
            if self.draining:
                self._keeping_changed = max(self._keeping_changed, _KEEPING_EVENTS.get(type(ev), 0))
                self._retire_idle()
            self._flush()
            if self._records:
                self._feed_append()
                self._records = []
        if self._turn:
            self._end_turn()
            if self._records:  # a slow policy replaced: its swap's record
                self._feed_append()
                self._records = []
        out, self._out = self._out, []
        return out

    # ----------------------------------------------------------------- policy calls

    @property
    def policy_errors(self) -> int:
        """Policy calls that raised or answered out of bounds, and slow turns."""
        return self.problems.total

    def _ask(self, kind: str, method: Callable[..., Any], *args: Any) -> Any:
        """Call ``method`` of the ``kind`` policy, timed; raise :class:`_OverBudget`
        instead when that kind's calls took more than ``policy_budget`` seconds in this
        turn (the caller's fallback answers). A call is never cut short: the budget
        bounds the calls after it."""
        if kind not in self._timed:
            return method(*args)
        turn = self._turn.get(kind)
        budget = self.config.policy_budget
        if turn is None:
            turn = self._turn[kind] = _PolicyTurn()
            self._spent_since(kind)
        elif turn.seconds > budget or (
            turn.slow + self._spent_sum.get(kind, [0.0])[0] > budget
            and not _cheap_turn(turn.seconds, turn.calls, budget)  # slow so far: a spell
        ):
            turn.skipped += 1
            raise _OverBudget
        began = self._timer()
        try:
            return method(*args)
        finally:
            took = self._timer() - began
            turn.seconds += took
            turn.calls += 1
            if took >= POLICY_CALL_FLOOR:  # a slow spell sums only these
                turn.slow += took
                turn.slow_calls += 1

    def _spent_since(self, kind: str) -> None:
        """Forget the ``kind`` calls of turns older than ``POLICY_SPREAD *
        policy_budget`` seconds."""
        spent = self._spent.get(kind)
        if not spent:
            return
        total = self._spent_sum[kind]
        horizon = self._now - POLICY_SPREAD * self.config.policy_budget
        while spent and spent[0][0] < horizon:
            _, seconds, calls = spent.popleft()
            total[0] -= seconds
            total[1] -= calls
        if not spent:
            total[:] = [0.0, 0]  # no float dust

    def _end_turn(self) -> None:
        """Each policy kind whose calls took more than its budget in this turn, or whose
        calls of ``POLICY_CALL_FLOOR`` or more did over turns that were not many cheap
        calls (:func:`_cheap_turn`; a slow spell): a policy
        problem (told once), and after ``policy_slow_turns`` such turns within
        ``policy_slow_window`` seconds its policy is replaced by the default one."""
        turn, self._turn = self._turn, {}
        budget = self.config.policy_budget
        for kind, calls_of in turn.items():
            seconds, calls, skipped = calls_of.seconds, calls_of.calls, calls_of.skipped
            counted, counted_calls = calls_of.slow, calls_of.slow_calls
            spent = self._spent.setdefault(kind, deque())
            before = self._spent_sum.setdefault(kind, [0.0, 0])
            if _cheap_turn(seconds, calls, budget):
                continue  # many cheap calls, a small share of the turn: no spell
            if seconds <= budget and counted + before[0] <= budget:  # this turn and lately
                spent.append((self._now, counted, int(counted_calls)))
                before[0] += counted
                before[1] += counted_calls
                continue
            policy = self.policies[kind]
            name = str(getattr(policy, "name", type(policy).__name__))
            slow = self._slow_turns.setdefault(kind, deque())
            slow.append(self._now)
            while slow[0] < self._now - self.config.policy_slow_window:
                slow.popleft()
            if seconds > budget:
                problem = (
                    f"{kind} policy {name!r} took {seconds:.1f} s over {calls:g} call(s) in "
                    f"one turn of the scheduler (its budget: {budget:g} s per turn); the "
                    f"scheduler is blocked meanwhile. The built-in fallback answered the "
                    f"turn's other {skipped:g} call(s)"
                )
            else:  # a slow spell: a call or a few per turn, over several turns
                span = self._now - spent[0][0] if spent else 0.0
                problem = (
                    f"{kind} policy {name!r} took {counted + before[0]:.1f} s over "
                    f"{counted_calls + before[1]:g} call(s) in {len(spent) + 1} turns of the "
                    f"scheduler within {span:.1f} s (its budget: {budget:g} s per turn, and "
                    f"per {POLICY_SPREAD * budget:g} s over turns); the scheduler is blocked "
                    f"meanwhile"
                ) + (f". The built-in fallback answered the turn's other {skipped:g} call(s)"
                     if skipped else "")  # fmt: skip
            spent.clear()  # a slow turn or spell counts once: the sums start afresh
            before[:] = [0.0, 0]
            too_slow = seconds >= self.config.policy_too_slow
            replaced = too_slow or len(slow) >= self.config.policy_slow_turns
            if replaced:
                default = REGISTRY.create(kind, DEFAULTS[kind])
                why = (
                    f"{self.config.policy_too_slow:g} s or more in one turn"
                    if too_slow
                    else f"{len(slow)} slow turns within {self.config.policy_slow_window:g} s"
                )
                problem += f". {why}: replaced by the default {kind} policy {DEFAULTS[kind]!r}"
                slow.clear()
                self._policy_changed(
                    PolicyChanged(self._stimulus, self._now, kind, default, why=f"slow: {why}")
                )
            self._policy_problem(kind, name, problem, f"{kind} slow {replaced}", replaced, True)

    def _policy_error(self, kind: str, key: Key, problem: str, same: str) -> None:
        """The ``kind`` policy gave no usable answer about ``key`` (``"-"``: none):
        ``problem``, a ``policy-error`` line of its story, counted and told once per
        ``same``, what makes two problems the same (without the task's values)."""
        self._log(key, "policy-error", problem)
        policy = self.policies[kind]
        self._policy_problem(
            kind, str(getattr(policy, "name", type(policy).__name__)), problem, same
        )

    def _policy_problem(
        self,
        kind: str,
        name: str,
        problem: str,
        same: str | None = None,
        replaced: bool = False,
        slow: bool = False,
    ) -> None:
        """Count a policy error of ``kind`` (policy ``name``; ``slow``: a slow turn or
        spell); tell it (:class:`PolicyFailed`) when it is new for the kind (``same``:
        what makes two problems the same, when not their text)."""
        errors = self.problems.note(kind, problem, self._now, same, policy=(kind, name), slow=slow)
        if not replaced:  # replaced: the policy in force now is another
            self.failing[kind] = problem
        if errors is not None:
            self._out.append(PolicyFailed(self._stimulus, kind, name, problem, errors, replaced))

    # ----------------------------------------------------------------- queries

    def pools_without_worker(self, pools: Iterable[str]) -> list[str]:
        """Those of ``pools`` that no worker connected now belongs to (draining ones
        count), in their order."""
        joined = {ws.pool for ws in self.workers.values()}
        return [pool for pool in pools if pool not in joined]

    def run_targets(self, wanted: Iterable[str] | None) -> tuple[str, ...]:
        """The workers a ``Cluster.run`` call goes to, sorted: ``wanted`` (None: every
        worker registered now, away, draining and leaving ones too, which still run
        code and may answer within the call); :class:`UnknownWorkers` if it names one
        this core does not know (nothing is run then)."""
        if wanted is None:
            return tuple(sorted(self.workers))
        wanted = tuple(dict.fromkeys(wanted))
        unknown = [w for w in wanted if w not in self.workers]
        if unknown:
            raise UnknownWorkers(unknown, self.workers)
        return tuple(sorted(wanted))

    def short_workers(self, asks: Iterable[tuple[str, float]]) -> str:
        """ "": a worker connected now that takes new tasks of no pool (not draining, not
        of a reserved pool: ``_runs_on``) has at least each of ``asks`` (``(resource,
        amount)``, cores and memory; a memory limit of 0 is none); else what they have,
        in words (none connected: says so)."""
        asks = tuple(asks)
        most: dict[str, float] = {}
        for ws in self.workers.values():
            if ws.draining or not self._runs_on(None, ws):
                continue
            values = {"cores": float(ws.cores), "memory": float(ws.memory) or NO_LIMIT}
            if all(values[r] >= a for r, a in asks):
                return ""
            for r, _ in asks:
                most[r] = max(most.get(r, 0.0), values[r])
        if not most:
            return "no worker that takes tasks is connected"
        has = " and ".join(
            f"{v:g} core{'' if v == 1 else 's'}" if r == "cores" else f"{int(v):,} B of memory"
            for r, v in most.items()
        )
        return f"no worker connected has enough (at most {has})"

    def story(self, *keys: Key) -> list[tuple[Any, ...]]:
        """Transitions of ``keys``: ``(key, start, finish, stimulus_id, now)``."""
        wanted = set(keys)
        return [entry for entry in self.story_log if entry[0] in wanted]

    def feed_since(
        self, since: int, limit: int
    ) -> tuple[list[tuple[float, list[tuple[Any, ...]]]], int, int]:
        """Up to ``limit`` monitoring entries numbered ``since`` and on, oldest first;
        the number to ask from next time; how many entries from ``since`` on are gone
        (the feed keeps the latest ``feed_length``). Costs the entries read (plus a skip
        over the older ones kept), never a scan of the tasks.

        Entries before ``since`` were read: they are let go (the feed has one reader).
        Nothing is kept before the first call, unless ``SchedulerConfig.monitor``. At
        most ``feed_length`` records wait to be read; past that the oldest entries go
        (the next read says how many).

        One entry per handled event (so a graph of a million tasks submitted at once is
        one entry per piece it is taken in by, ``runtime.graph.INTAKE_PIECE`` tasks
        each): ``(now, records)``, the records in the order things happened:
        ``("state", key, finish, category, pool, worker, client)`` per transition
        (``worker``: where it was sent, for ``processing``; ``released``: its output was
        released, nothing needs it; ``client``: the id of the client that submitted it),
        ``("try", key, category, worker, number, sent, start, stop,
        outcome, cause, error, nbytes, queued, failure, resumed, resumed_work,
        unsaved)`` per try ended (``error``: the
        exception or None; ``start``, ``stop``: the worker's wall clock, except for
        ``worker-lost``: this core's clock, ``start`` when it began executing as its
        worker said (``now`` for one it had not started; None: the worker never said)
        and ``stop`` the loss, ``now`` (the drop of its worker's connection for one
        lost while away, :class:`WorkerAway`); ``queued``: when the
        task became ready for this try, this core's clock (the drop of the connection
        of a worker lost while away for the retries it sent back: ``_ready_since``),
        None for a speculative copy: ``TryRecord.queued``; ``failure``: for a try
        that failed with an error, out of memory, by timeout or for its disk, the cause
        it is counted under in the
        failure counts and groups, the metrics' ``cause``, else None; ``resumed``,
        ``resumed_work``: the number of the checkpoint the try started from and the
        seconds of the task's execution it held (:attr:`Checkpoint.work`), None when it
        started from none (and for a speculative copy); ``unsaved``: for ``worker-lost``
        with a known ``start``, the seconds of the task's execution the newest
        checkpoint that survived does not hold, the work really lost, else None),
        ``("not-run",
        key, category, cause, error, dependency, root)`` per task erring with no failed
        try of its own, before its ``erred`` transition (its :class:`NotRunGroup`'s
        cause; ``error``: an :class:`ErrorRecord`, for a dependency's failure the
        root's; ``dependency``, ``root``: the dependency whose failure it inherited and
        the task that failed first, or None),
        ``("verdict", key, error)`` per task this core fails with an error of its own
        after a failed try, before its ``erred`` transition (``error``: an
        :class:`ErrorRecord` of :class:`~runtime.errors.TaskCrashedWorkers`,
        ``WorkerLost``, ``RetryPolicyLoop``, ...: what its client gets, not the try's),
        ``("unreadable", key, category, worker, error)`` per task whose output
        ``worker`` could not pickle for a client or another worker
        (:class:`OutputUnreadable`; ``error``: the ErrorRecord of its
        ``ResultNotPicklable``),
        ``("retry", key, charged, pool, moved)`` per retry decided, after the ``try``
        record of the try it follows (``charged``: it spent the task's ``retries=``
        budget, else a free retry; ``pool``: the task's pool then; ``moved``: the pool
        the retry policy moved it to, or None),
        ``("moved", key, category, from_pool, to_pool, from_priority, to_priority)``
        per waiting or queued task moved to another pool or priority
        (:class:`TasksMoved`: ``Cluster.move``, the console's ``move``; None: no pool),
        ``("joined", worker, pool, cores, memory)``, ``("left", worker, cause, ended)``
        (``ended``: when its life ended, this core's clock: ``now``, or the drop of its
        connection for a worker lost while away),
        ``("checkpoint", key, seq, event, worker, work)`` per checkpoint ``saved`` (by
        ``worker``) or ``lost`` (with ``worker``, its last copy; ``work``:
        :attr:`Checkpoint.work`),
        ``("transfer", key, kind, nbytes, source, target, duration)`` per output copied
        between workers and ``("recovery", key, category, worker, how)`` per needed
        output lost with a worker (:mod:`actors.storage_state`)."""
        self.feed_on = True
        feed = self.feed
        first = self.feed_next - len(feed)
        while feed and first < since:  # read already
            self.feed_held -= len(feed.popleft()[1])
            first += 1
        start = max(since, first)
        items = list(itertools.islice(feed, 0, max(limit, 0)))
        return items, start + len(items), max(first - since, 0)

    def _feed_append(self) -> None:
        self.feed.append((self._now, self._records))
        self.feed_next += 1
        self.feed_held += len(self._records)
        while self.feed_held > self.config.feed_length and len(self.feed) > 1:
            self.feed_held -= len(self.feed.popleft()[1])  # unread: lost

    def _tried(
        self,
        ts: TaskState,
        rec: TryRecord,
        error: BaseException | None,
        nbytes: int = 0,
        failure: str | None = None,
        began: float | None = None,
    ) -> ErrorRecord | None:
        """A try ended: kept with its task, in the ring of recent tries (the dashboard)
        and, while a monitoring database reads the feed, as a feed record; ``failure``:
        the cause a failed try is counted under (:meth:`_failed_try`), when it is not
        the record's own; ``began``: for a try lost with its worker, when it began
        executing there (:meth:`_began`), and for a try cancelled while it executed,
        when its worker said it began (``TasksRunning``): the feed's ``start`` (None:
        not known to have begun). The feed gets ``error``
        as an :class:`ErrorRecord`, made now: the exception's frames, as a failure
        group keeps them (an embedded cluster's client raises the very exception later,
        adding its own frames to it). Returns that record (None: none made), for
        :meth:`_failed_try`."""
        ts.tries.append(rec)
        self.recent_tries.append((rec, ts.spec.category, self._now))
        self.tries_ended += 1
        if not self.feed_on:
            return None
        record = error_record(error) if error is not None else None
        start = began if rec.outcome in ("worker-lost", "cancelled") else rec.start
        # (its try's, not a speculative copy's: the copy ends while its try runs)
        resumed = ts.resumed if ts.worker in (None, rec.worker) else None
        unsaved = None
        if rec.outcome == "worker-lost" and start is not None:
            # Its work (with what it resumed from) less what the newest checkpoint that
            # survived the loss holds (its files already counted out: _checkpoints_lost)
            saved = self._saved_work(ts)
            ran = max(rec.stop - start, 0.0)
            unsaved = unsaved_work(resumed[1] if resumed else 0.0, ran, saved or 0.0)
        self._records.append(
            ("try", ts.key, ts.spec.category, rec.worker, len(ts.tries), ts.sent,
             start, rec.stop, rec.outcome, rec.cause, record, nbytes, rec.queued,
             failure, None if resumed is None else resumed[0],
             None if resumed is None else resumed[1], unsaved)
        )  # fmt: skip
        return record

    def _began(self, ts: TaskState, ws: WorkerState, ran: float | None, end: float) -> float | None:
        """When ``ts``'s try, lost with ``ws`` at ``end``, began executing there, on
        this core's clock: as the worker said when it left (``WorkerLeaving.executed``)
        or while it ran (``TasksRunning``); ``end`` for a try it said it had not started
        (it ran 0 s); None when the worker never said (it vanished before its first
        report of the try)."""
        if ran is not None:
            return end - ran
        began = ws.executed.get(str(ts.key))
        if began is None and ts.worker == ws.id:
            began = ts.started
        return None if began is None else min(max(began, ts.sent), end)

    def _filled(self, ws: WorkerState) -> frozenset[str] | None:
        """The keys of the tries the worker said execute (``TasksRunning``, after 0.5 s)
        when they fill its threads (``cores``: a worker executes no more at once): then
        its other tries wait in its queue and never started. None when fewer did: any
        of the others may execute (begun under 0.5 s ago, or its report on its way),
        and a crash of the worker may be its doing (docs/policies.md, retry)."""
        said = [
            str(ts.key)
            for ts in ws.processing
            if str(ts.key) in ws.executed or (ts.worker == ws.id and ts.started is not None)
        ]
        copies = sum((ts, ws.id) in self.copy_started for ts in ws.copies)
        return frozenset(said) if len(said) + copies >= ws.cores else None

    def count(self, state: str) -> int:
        return self.by_state.get(state, 0)

    @property
    def by_state(self) -> dict[str, int]:
        """Tasks per state (the states with any), from counters kept as tasks move."""
        counts: Counter[str] = Counter({"new": self.created})
        counts.subtract(self.forgotten)
        for (start, finish), i in _MOVES.items():
            n = self.moves[i]
            counts[start] -= n
            counts[finish] += n
        return {state: n for state, n in counts.items() if n}

    @property
    def n_queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def _suspect(self, key: Key) -> None:
        self.crashed.pop(key, None)
        self.crashed[key] = None
        if len(self.crashed) > MAX_SUSPECTS:
            del self.crashed[next(iter(self.crashed))]

    def crash_suspects(self) -> dict[str, tuple[str, ...]]:
        """The tasks still to run (waiting, ready or running) whose tries were lost with
        workers that ended unexpectedly while they may have executed them (a crash, a
        kill, a lost connection: not a preemption, a walltime or a drain), newest
        first, each with those workers in order (a restarted one once per life:
        :meth:`TaskState.crashes`, what ``TaskCrashedWorkers`` names). What may be
        killing the workers: the client's "no worker to run the ready tasks" warning
        names them. At most :data:`MAX_SUSPECTS`, looked up by key: no scan."""
        out: dict[str, tuple[str, ...]] = {}
        for key in reversed(self.crashed):
            ts = self.tasks.get(key)
            crashes = ts.crashes() if ts is not None and ts.state in ACTIVE else []
            if crashes:
                out[str(key)] = tuple(worker for worker, _ in crashes)
        return out

    def contained_suspects(self) -> tuple[str, ...]:
        """The keys of :meth:`crash_suspects` whose every crash was of a worker that ran
        its tasks in task processes (``WorkerJoined.contained``: its
        ``WorkerInfo.execution``), where a task's crash ends its task process, not its
        worker: the client's hint then does not advise execution 'process'."""
        out = []
        for key in self.crash_suspects():
            ts = self.tasks.get(key)
            if ts is not None and ts.contained_crashes >= len(ts.crashes()):
                out.append(key)
        return tuple(out)

    def queued_by_pool(self) -> dict[str, int]:
        """Ready tasks per pool (``"*"``: tasks any pool may run), from counters."""
        return {pool: n for pool, n in self.queued_counts.items() if n}

    def unfit_pools(self, pool: str | None, resources: Mapping[str, float]) -> list[str]:
        """The configured pools a task of ``pool`` asking for ``resources`` may run in
        (its own; for a task of no pool, every pool but a reserved one) whose workers,
        as configured (``SchedulerConfig.pool_cores``, ``pool_memory``, ``pool_disk``),
        all have fewer cores, less memory or less disk than it asks: blocks of them
        could never run it. A pool whose workers' memory or disk is not known (the
        machine's, the file system's free space) is taken to have enough; so is one for
        a resource no pool's configuration says (a custom one: workers say theirs when
        they join)."""
        if not resources:
            return []
        cfg = self.config
        cores, memory = resources.get("cores", 0), resources.get("memory", 0)
        disk = resources.get("disk", 0)
        return [
            p
            for p, has in cfg.pool_cores.items()
            if runs_on(pool, p, cfg.reserved_pools)
            and (
                cores > has
                or memory > cfg.pool_memory.get(p, memory)
                or disk > cfg.pool_disk.get(p, disk)
            )
        ]

    def _no_pool_fits(self, pool: str | None, resources: Mapping[str, float]) -> bool:
        """Some configured pool may run a task of ``pool`` asking for ``resources``, and
        none of them has workers with enough (:meth:`unfit_pools`): no block of any
        configured pool could run it."""
        cfg = self.config
        could = sum(1 for p in cfg.pool_cores if runs_on(pool, p, cfg.reserved_pools))
        return bool(could) and len(self.unfit_pools(pool, resources)) == could

    def unfit_by_pool(self) -> dict[str, int]:
        """Per configured pool, the ready tasks it may run that none of its workers
        could (:meth:`unfit_pools`), from counters: the autoscaler counts them out of
        its demand, so no block is started or kept for them."""
        return {pool: n for pool, n in self.unfit_counts.items() if n}

    def oldest_wait(self, pool: str, now: float) -> float:
        """Seconds the oldest ready task of ``pool`` has waited at ``now`` (0.0: none)."""
        pw = self.pool_waits.get(pool)
        if pw is None or not pw.since:
            return 0.0
        return max(now - next(iter(pw.since.values())), 0.0)

    def wait_quantiles(self, pool: str) -> dict[str, float]:
        """The :data:`WAIT_QUANTILES` of the latest waits served in ``pool`` (empty: none)."""
        pw = self.pool_waits.get(pool)
        recent = sorted(pw.recent) if pw is not None else []
        return {str(q): quantile(recent, q) for q in WAIT_QUANTILES} if recent else {}

    def pool_metrics(self, now: float, configured: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
        """Per pool, the numbers of a ``PoolMetrics`` at ``now``: from the counters and
        the workers (their tasks counted, ``len``, never gone through), never from the
        tasks. The pools are those with a task (``"*"``:
        tasks any pool may run), a worker, or ``configured``: a pool that has none of
        them any more (a misspelt pool's tasks, released) leaves the metrics."""
        out: dict[str, dict[str, Any]] = {}

        def of(pool: str) -> dict[str, Any]:
            m = out.get(pool)
            if m is None:
                m = out[pool] = {
                    "queue_depth": 0, "oldest_wait": 0.0, "wait_quantiles": {}, "waits": 0,
                    "wait_sum": 0.0, "running": 0, "workers": {"idle": 0, "busy": 0,
                    "draining": 0, "away": 0}, "throttled": 0, "rss_bytes": 0, "held_back": 0,
                    "retry_held": 0, "disk_stalled": 0, "disk_stalls": 0,
                    "placement_stalled": 0, "placement_stalls": 0, "cores": 0,
                    "cores_busy": 0, "memory_limit_bytes": 0, "workers_past_limit": 0,
                    "worker_queue_oldest": 0.0, "longest_running": 0.0,
                }  # fmt: skip
            return m

        for pool in {*self.pool_tasks, *configured, *(ws.pool for ws in self.workers.values())}:
            m = of(pool)
            pw = self.pool_waits.get(pool)
            if pw is None:
                continue
            m["queue_depth"] = self.queued_counts[pool]
            m["oldest_wait"] = self.oldest_wait(pool, now)
            m["wait_quantiles"] = self.wait_quantiles(pool)
            m["waits"] = pw.n
            m["wait_sum"] = pw.total
        for pool, n in self.held_back().items():
            of(pool)["held_back"] = n
        for pool, n in self.retry_held_by_pool().items():
            of(pool)["retry_held"] = n
        for name, n in self.disk_stall_count.items():
            of(name)["disk_stalls"] = n
        for stall in self.disk_stalls.values():
            of(stall.pool)["disk_stalled"] = 1
        for name, n in self.placement_stall_count.items():
            of(name)["placement_stalls"] = n
        for name in self.placement_stalls:
            of(name)["placement_stalled"] = 1
        for ws in self.workers.values():
            m = of(ws.pool)
            n = len(ws.processing)
            m["running"] += n  # (an away worker's tasks: held for its rejoin)
            if ws.away is not None:  # its connection dropped: no capacity of its own
                m["workers"]["away"] += 1
                continue
            state = "draining" if ws.draining else "busy" if n else "idle"
            m["workers"][state] += 1
            # Its cores, and those its tasks (speculative copies among them) take: one
            # thread each, draining or not; the tasks beyond wait on it for a thread.
            m["cores"] += ws.cores
            m["cores_busy"] += min(ws.cores, n + len(ws.copies))
            # The try waiting longest on it (the first sent of those not known to
            # execute) and the one executing longest (its threads: a few): no task
            # is gone through.
            if ws.waiting:
                first = next(iter(ws.waiting))
                m["worker_queue_oldest"] = max(m["worker_queue_oldest"], now - first.sent)
            if ws.began:
                m["longest_running"] = max(m["longest_running"], now - min(ws.began.values()))
            m["throttled"] += ws.throttled
            m["rss_bytes"] += ws.rss
            m["memory_limit_bytes"] += ws.memory
            m["workers_past_limit"] += ws.past_peak > 0
        return out

    @property
    def pressure(self) -> bool:
        """Some worker is past its throttle fence."""
        return bool(self.throttled)

    # ----------------------------------------------------------------- event handlers

    def _graph_submitted(self, ev: GraphSubmitted) -> None:
        which = (ev.echo_to, ev.run)
        sub = self._open.get(which) if ev.continued else None
        if not ev.continued:  # every piece of one submission shares its generation
            self.generation += 1
            sub = self._latest = _Submission(self.generation)
        elif sub is None:  # (a core fed pieces each marked final: the latest submission's)
            sub = self._latest
        if ev.final:
            self._open.pop(which, None)
        else:
            self._open[which] = sub
        self._sub = sub
        gen = sub.generation
        new: list[TaskState] = []
        resubmitted = False
        for key, spec in ev.specs.items():
            ts = self.tasks.get(key)
            if ts is None:
                ts = TaskState(spec, gen)
                self.tasks[key] = ts
                counts = self.category_tasks
                counts[spec.category] = counts.get(spec.category, 0) + 1
                self.created += 1
                self.pool_tasks[pool_key(spec.pool)] += 1
                new.append(ts)
            elif ts.state in ("erred", "cancelled"):
                # Resubmitting a failed key runs it again with the new spec.
                resubmitted = True
                self._repool(ts, spec)
                ts.generation = gen
                ts.retries_left = spec.retries
                ts.first_try = len(ts.tries)
                ts.lost_tries = ts.lost_since_saved = 0
                ts.ooms = ts.oom_alone = ()  # a fresh start: any worker may run it again
                ts.oom_own = ts.oom_worker_floor = ts.oom_rest = 0
                ts.oom_exited = False
                ts.free_retries = 0
                ts.behind = False
                ts.unneeded = False
                ts.error = ts.root = None
                for d in ts.deps:
                    d.dependents.discard(ts)
                ts.deps = []
                ts.waiting_deps = 0
                ts.in_nbytes = ts.in_files = 0
                new.append(ts)
            else:  # the known task stands (as in dask): say so if this one differs
                self._note_reuse(ts.spec, spec)
        if ev.progress:
            self._count_progress(ev, new)
        # cancelled before this piece came: cancelled as it comes, never queued
        ahead = self._arrived_cancelled(ev.specs, new) if self._cancel_ahead else None
        if ev.final and sub.reused_count:  # said before any result of the submission
            self._out.append(
                KeysReused(self._stimulus, tuple(sub.reused), sub.reused_count, ev.echo_to)
            )
            sub.reused, sub.reused_count = [], 0
        broken: dict[TaskState, list[Key]] = {}
        continues = False  # some new task reads a task of an earlier submission
        for ts in new:
            for dk in ts.spec.deps:
                dep = self.tasks.get(dk)
                if dep is None:  # forgotten meanwhile (the manager validated the graph)
                    broken.setdefault(ts, []).append(dk)
                    continue
                ts.deps.append(dep)
                continues |= dep.generation < gen
                ts.waiting_deps += dep.state == "waiting"
                if dep.file:
                    ts.in_files += dep.nbytes
                else:
                    ts.in_nbytes += dep.nbytes
                dep.dependents.add(ts)
        turning = [t for t in new if t not in ahead] if ahead else new  # (cancelled: no turn)
        self._take_turns(turning, ev.echo_to, ev.continued)
        if continues:
            _continue_generations(new, gen, self.turn_floor, self._turn_step(ev.echo_to))
        # Count the wants first, so nothing a client asks for is forgotten while the new
        # tasks settle (a task on an erred input fails at once).
        wanted = [self.tasks[key] for key in ev.wanted]
        for ts in wanted:
            ts.wanted += 1
            ts.delivered = False  # (this client was not given its value)
            self._files[ts.key] = ts
        for key in ev.hold:  # read by a later piece: kept for it as if wanted
            ts = self.tasks[key]
            ts.wanted += 1
            ts.delivered = False
            self._files[key] = ts
        fresh = set(new)
        # Brand-new tasks may be placed in any order: a new input is not in memory yet,
        # so it counts as missing whichever comes first. Resubmitted ones (erred or
        # cancelled before) must follow dependency order, or a dependent would see its
        # input's old failure.
        for ts in _topological(new) if resubmitted else new:
            if ts in broken:
                self._set(ts, "waiting")
                err = MissingKeysError([str(k) for k in broken[ts]], requested=True)
                ts.error, ts.root = err, (ts.key, err, "", 0, 0)
                self._not_run(ts, "MissingKeysError", error_record(err))
                self._set(ts, "erred")
                self._terminal(ts)
                continue
            if ahead and ts in ahead:  # (its clients were told when it was cancelled)
                self._set(ts, "waiting")
                self._cancel(ts, ahead[ts], tell=False)
                continue
            if self.stopping:  # the run ended (ClusterStops): nothing new runs; told why
                self._set(ts, "waiting")
                self._cancel(ts, STOPPED_REASON)
                continue
            self._activate(ts)
        for ts in wanted:
            if ts not in fresh:  # (a fresh one is told through the normal path)
                self._tell_where(ts)
        if ev.unhold:  # their last readers came with this piece: held no more
            self._unwant(ev.unhold)
        for key in ev.echo:  # wanted by the client already: where each stands now
            ts = self.tasks.get(key)
            if ts is not None:  # (not forgotten while wanted)
                self._tell_where(ts)
                self._out.append(KeyTaken(self._stimulus, key, ts.state in ACTIVE, ev.echo_to))
        if ev.unconfigured:
            self._tell_no_worker(new, ev.unconfigured)

    def _arrived_cancelled(
        self, specs: Mapping[Key, TaskSpec], new: list[TaskState]
    ) -> dict[TaskState, str]:
        """Of the tasks ``specs`` bring, the ``new`` ones (or run again) cancelled before
        they came (``_cancel_ahead``), with the cancel's reason; each key's count of
        pieces still to bring it goes down."""
        ahead = self._cancel_ahead
        out: dict[TaskState, str] = {}
        fresh = set(new)
        for key in specs:
            entry = ahead.get(key)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                del ahead[key]
            ts = self.tasks[key]
            if ts in fresh:
                out[ts] = entry[0]
        return out

    def _take_turns(self, new: list[TaskState], client: str, continued: bool) -> None:
        """The new tasks of ``client``'s submission take their turns: the submission
        starts at the turn after the client's latest task's, or at ``turn_floor`` (the
        turn being served) when that is later, and each task is its graph order
        (``TaskSpec.order``) further on. Each client's n-th task of its work has the
        n-th turn from when it came: the ``fair`` priority serves clients turn by turn
        (docs/policies.md#priority). O(1) per task; no task is gone through again."""
        turns = self.turns
        if not continued:  # (every piece of one submission starts from the same turn)
            if len(turns) > MAX_CLIENT_TURNS:  # the clients with no turn ahead: as new
                floor = self.turn_floor
                for gone in [c for c, t in turns.items() if t <= floor]:
                    del turns[gone]
            self._sub.turn_base = max(turns.get(client, 0), self.turn_floor)
        base = self._sub.turn_base
        end = turns.get(client, 0)
        step = self._turn_step(client)
        for ts in new:
            ts.client = client
            ts.turn = turn = base + ts.spec.order * step
            if turn >= end:
                end = turn + step
        if new:
            turns[client] = end

    def _turn_step(self, client: str) -> float:
        """The part of a turn each task of ``client`` takes: ``1 / share`` of its name
        under the ``fair`` priority's ``shares`` (an operator's), else 1."""
        policy = self.policies["priority"]
        if isinstance(policy, FairPriority):
            return 1.0 / policy.share(client_name(client))
        return 1.0

    def _note_reuse(self, known: TaskSpec, spec: TaskSpec) -> None:
        """``spec`` came under the key of ``known``, a task the core has, which stands:
        counted for :class:`KeysReused` when it computes something else (its node's
        fingerprint differs; one that cannot be made, say an argument that does not
        pickle, counts as the same). The same node object, or the same call made again
        (a pure ``submit`` twice, a dask collection computed twice), is not counted.
        At most :data:`REUSE_CHECKS` keys of a submission are compared."""
        sub = self._sub
        if spec.node is known.node or sub.reuse_checks >= REUSE_CHECKS:
            return
        sub.reuse_checks += 1
        new, old = node_fingerprint(spec.node), node_fingerprint(known.node)
        if new is None or old is None or new == old:
            return
        sub.reused_count += 1
        if len(sub.reused) < REUSED_NAMED:
            sub.reused.append(spec.key)

    def _tell_where(self, ts: TaskState) -> None:
        """Tell the clients of a wanted task that is done or failed so, again; one whose
        output was dropped is made again."""
        if ts.state == "memory":
            holder = next(iter(ts.who_has), None)  # (none: gone with the run's stop)
            if holder is not None:
                self._key_done(ts, holder)
        elif ts.state in ("erred", "cancelled"):
            self._notify_failed(ts)
        elif ts.state == "released":
            self._recompute(ts)

    def _tell_no_worker(
        self, new: list[TaskState], unconfigured: Iterable[tuple[str, str]]
    ) -> None:
        """Say in the story of each task of ``new`` that waits for a worker of a pool of
        ``unconfigured`` (``(pool, why)``: not configured) that no worker has joined it,
        and until when it waits."""
        told = dict(unconfigured)
        empty = set(self.pools_without_worker(told))
        for ts in new:
            pool = ts.spec.pool
            if pool in empty:
                self._no_worker_note(ts, pool, told[pool])

    def _no_worker_note(self, ts: TaskState, pool: str, why: str) -> None:
        """Say in ``ts``'s story that it waits for a worker of ``pool`` (``why``: what
        that pool is, which no worker has joined), and until when."""
        if ts.state in ("waiting", "queued"):
            self._log(
                ts.key, ts.state,
                f"waiting for a worker of {why}: it runs once a worker joins with --pool {pool}",
            )  # fmt: skip

    def _worker_joined(self, ev: WorkerJoined) -> None:
        ws = self.workers.get(ev.worker)
        if ws is None:
            ws = WorkerState(ev.worker, ev.cores, ev.memory, ev.pool, self.config.saturation)
            ws.joined = self._now
            ws.deadline = ev.deadline
            ws.disk = max(0, ev.disk)
            self.deadlines += ev.deadline is not None
            self.workers[ev.worker] = ws
            self.pool_members.setdefault(ws.pool, {})[ws.id] = ws
            self.storage.joined(ev.worker)  # a new life: an old one's peak goes
        else:  # a known worker re-registering (e.g. after a reconnect) keeps its work
            ws.unconfirmed = ws.processing | ws.copies  # until it says what reached it
            if ev.pool != ws.pool:
                self._left_pool(ws)
                ws.pool = ev.pool
                self.pool_members.setdefault(ws.pool, {})[ws.id] = ws
                if ws.throttled:
                    self.throttled_in[ws.pool] += 1
            ws.cores, ws.memory = ev.cores, ev.memory
            ws.disk = max(0, ev.disk)
            self.deadlines += (ev.deadline is not None) - (ws.deadline is not None)
            ws.deadline = ev.deadline
            ws.slots = max(1, round(ev.cores * self.config.saturation))
            if ws.retired:  # its Stop may have been lost with the old connection
                ws.retired = False
                self.draining.add(ws.id)
            if ws.away is not None:  # back within its grace: its life goes on
                ws.away = None
                self._log(ws.id, "joined", "back")
        ws.block, ws.spills, ws.contained = ev.block, ev.spills, ev.contained
        self.hosts.joined(ev.worker, ev.host, ev.host_memory, ev.memory, ev.process, self._now)
        self.host_cores.joined(ev.worker, ev.host, ev.host_cpus, ev.cores, 0, self._now)
        self._disk_shared(
            self.disk_shares.joined(
                ev.worker, ev.filesystem, ev.fs_free, ev.disk, ev.disk_auto, ev.process,
                self._stimulus,
            )
        )  # fmt: skip
        ws.limit = max(ws.slots, ev.cores * self.config.max_per_core)
        self._update_free(ws)
        self._log(ev.worker, "-", "joined")
        if self.feed_on:
            self._records.append(("joined", ws.id, ws.pool, ws.cores, ws.memory))
        self._limits_changed()

    def _disk_shared(self, commands: list[DiskShared]) -> None:
        """Workers sharing a file system without --disk have new shares: each one's
        disk budget is its share from now on (outputs it stores past it stay; it gets
        nothing placed until it is below), and the shell says so."""
        for cmd in commands:
            for worker, share in cmd.shares:
                ws = self.workers.get(worker)
                if ws is not None:
                    ws.disk = share
            self._out.append(cmd)

    def _worker_held(self, ev: WorkerHeld) -> None:
        """Mend what a dropped connection lost. A task sent before the worker rejoined
        that it neither has in hand nor holds the output of never reached it: ready
        again, free (no try is recorded: nothing ran). One whose output it holds
        finished, and the result was lost: done now. Outputs it holds of tasks that are
        released or forgotten are junk (their DropKeys was lost): dropped. So are those
        of tasks waiting or running elsewhere: a worker declared lost that joins again
        as new kept its earlier outputs (its files count on its disk), which are being
        made again. Outputs of tasks in memory elsewhere become replicas. One a gather
        could not reach here meanwhile (``unreached``) is told again (``KeyDone``)."""
        ws = self.workers.get(ev.worker)
        if ws is None:
            return
        sent_before, ws.unconfirmed = ws.unconfirmed, set()
        held = dict(ev.held)
        for ts in sorted(sent_before & ws.processing, key=_prio_key):
            if ts.key in ev.active or ts.worker != ws.id:
                continue
            self._release_slot(ts, ws)
            if ts.key in held:
                self._log(ts.key, "processing", "result-lost")
                now = self._now
                self._finished_ok(ts, ws, TaskResult(ts.key, "ok", now, now, held[ts.key]))
            else:
                self._log(ts.key, "processing", "lost-in-transit")
                if not self._promote_copy(ts):
                    self._back_to_ready(ts)
        junk: dict[Key, None] = {}  # an ordered set: a rejoin may hold 100,000s of keys
        for ts in sorted(sent_before & ws.copies, key=_prio_key):
            if ts.key not in ev.active:  # never reached it, or its result was lost
                self._log(ts.key, "processing", f"copy-lost-in-transit:{ws.id}")
                self._end_copy(ts, ws, "cancelled", "lost-in-transit")
                self.speculative["failed"] += 1
                if ts.key in held:
                    junk[ts.key] = None
        for key in held:
            out = self.tasks.get(key)
            if key in junk:
                continue
            if out is None or out.state in ("released", "erred", "cancelled"):
                junk[key] = None
            elif out.state == "memory":
                if ws.id not in out.who_has:
                    self._add_replica(out, ws)
                elif self.unreached:  # back: a gather that could not reach it waits
                    self._held_again(out, ws)
            elif not self._expected_on(out, ws.id):
                # Kept from before it was declared lost (it joined again as new): the
                # task is being made again; its own report settles one running here.
                junk[key] = None
        if junk:
            self._out.append(DropData(self._stimulus, ws.id, tuple(junk)))

    def lost_cause(self, worker: str, cause: str) -> str:
        """Why ``worker`` is lost, reported with ``cause``: ``shutdown`` for one whose
        block is stopped because the cluster shuts down (:class:`StoppedWithCluster`;
        its stop signal reads as a preemption inside a Slurm job) unless it left on
        purpose anyway; ``suspended`` for one whose block is suspended that went silent
        (``unknown``); else ``cause``."""
        ws = self.workers.get(worker)
        if ws is not None and ws.with_cluster and cause not in ON_PURPOSE:
            return "shutdown"
        return "suspended" if cause == "unknown" and ws is not None and ws.suspended else cause

    def _stopped_with_cluster(self, ev: StoppedWithCluster) -> None:
        for wid in ev.workers:
            ws = self.workers.get(wid)
            if ws is not None:  # one not joined (or gone) has no end to record
                ws.with_cluster = True

    def _cluster_stops(self, ev: ClusterStops) -> None:
        """The run ends (an orderly stop, before the workers are stopped): every task not
        finished is cancelled, without telling its clients (the cluster's stop tells
        them), a running one on its worker with its try ``cancelled`` (``shutdown``).
        Only then do the workers go, as losses of nothing (``stopping``); a graph that
        comes meanwhile is cancelled as it comes (``_graph_submitted``), its clients told.
        One synchronous pass over the tasks (its cost per live task:
        benchmarks/stop_cancel.py)."""
        self.stopping = True
        for ts in list(self.tasks.values()):
            if ts.state in ACTIVE:  # (one ended on the way, a dependent, stays so)
                self._cancel(ts, STOPPED_REASON, tell=False, cause="shutdown")

    def _policy_noted(self, ev: PolicyNoted) -> None:
        self._log("-", "policy-error", ev.problem)

    def _scaling_changed(self, ev: ScalingChanged) -> None:
        self._swapped("scaling", ev.name, ev.params, ev.by, "")

    def _swapped(self, kind: str, name: str, params: dict[str, Any], by: str, why: str) -> None:
        """A policy swap: a ``policy`` line of the cluster's story (``-``), with its
        parameters and who asked, or why the core replaced it on its own
        (``priority:slow(delay=0.9) by console:eng``, ``priority:graph replaced (slow:
        3 slow turns within 300 s)``), and a ``policy`` record of the monitoring feed:
        ``(kind, name, its parameters as JSON, who asked, why)``."""
        given = values_text(params)
        who = client_name(by) if by else ""
        line = f"{kind}:{name}" + (f"({given})" if given else "")
        line += f" by {who}" if who else ""
        line += f" replaced ({why})" if why else ""
        self._log("-", "policy", line)
        if self.feed_on:
            text = json.dumps(params, sort_keys=True, default=repr)
            self._records.append(("policy", kind, name, text, who, why))

    def _suspended(self, ev: Suspended) -> None:
        for wid in ev.workers:
            ws = self.workers.get(wid)
            if ws is None or ws.suspended == ev.suspended:
                continue  # not joined (or gone), or told already
            ws.suspended = ev.suspended
            self._log(wid, "joined", "suspended" if ev.suspended else "resumed")
            self._update_free(ws)

    def _worker_away(self, ev: WorkerAway) -> None:
        ws = self.workers.get(ev.worker)
        if ws is None or ws.away is not None:
            return  # not joined (or gone), or away already: the first drop counts
        ws.away = self._now
        self._log(ws.id, "joined", "away")
        self._update_free(ws)

    def _worker_left(self, ev: WorkerLeft) -> None:
        cause = self.lost_cause(ev.worker, ev.cause)
        if cause != ev.cause:
            ev = dataclasses.replace(ev, cause=cause)
        ws = self.workers.pop(ev.worker, None)
        if ws is None:
            return
        self.deadlines -= ws.deadline is not None
        self.hosts.left(ev.worker, self._now)
        self.host_cores.left(ev.worker, self._now)
        self._disk_shared(self.disk_shares.left(ev.worker, self._stimulus))
        self.free.pop(ev.worker, None)
        self.draining.discard(ev.worker)
        self._left_pool(ws)
        self.throttled.discard(ev.worker)
        if ws.past_peak:  # its warning ends with it
            self._out.append(WorkerPastLimit(self._stimulus, ws.id, ws.memory, 0))
        if ws.floor:  # so does its floor's
            self._out.append(WorkerFloor(self._stimulus, ws.id, 0))
        self._log(ev.worker, "joined", f"left:{ev.cause}")
        if self.held:  # the holder that would not hand over may be this one: try again
            self._release_held(every=True)
        # Lost while away: it ended when its connection dropped, not at its hold's end.
        end = self._now if ws.away is None else ws.away
        if self.feed_on:
            self._records.append(("left", ws.id, ev.cause, end))
        if self.checkpoint_workers:  # before its tasks are sent again: what survived
            self._checkpoints_lost(ws.id)
        # Copies a leaving worker's plan sent to it go to a worker that stays instead,
        # as when it says it leaves (a keeper, say, killed at its walltime): its source
        # still holds them. Its own plan's copies are made or not, as it says: none is
        # on its way any more.
        self._redirect_planned(ws)
        unmade: list[Key] = []  # planned by it: made, or left to the other holders
        for planned in self.evac_planned.values():
            for key in [k for k, source in planned.items() if source == ws.id]:
                del planned[key]
                unmade.append(key)
        onward = []  # copies that landed on a worker that said it leaves meanwhile
        for key, target in ev.evacuated:
            ts = self.tasks.get(key)
            to = self.workers.get(target)
            if ts is not None and to is not None and ws.id in ts.who_has:
                self._evacuated(ts, ws.id, to, self.storage.left_after(ws.id, self._now))
                onward.append((ts, to))
        lives = self.lives.get(ws.pool)
        if lives is None:
            lives = self.lives[ws.pool] = deque(maxlen=MAX_LIVES)
        lives.append((end - ws.joined, ev.cause not in ON_PURPOSE))
        self._limits_changed()  # before its tasks go back to ready: they are checked
        self._copies_lost(ws.id)
        # A leaving worker said which of its tasks it executed: the others never started
        # (they ran 0 s: a preempted one is not long, a crash is not theirs); so did one
        # that said tries filling all its threads executed (``_filled``); else each ran
        # since it was sent.
        executing = ws.executing if ws.executing is not None else self._filled(ws)
        # Its tries and outputs lost: ready again now, for a worker lost while away
        # since the drop (``_ready_since``).
        lost = [*ws.processing, *ws.has_what] if end < self._now else []
        crash = ev.cause not in BENIGN_LOSSES  # what TaskState.crashes counts
        for ts in sorted(ws.copies, key=_prio_key):  # the first try runs on: no retry
            self._end_copy(ts, ws, "worker-lost", ev.cause, ended=end)
            ts.contained_crashes += crash and ws.contained
            self.speculative["failed"] += 1
        for ts in sorted(ws.processing, key=_prio_key):
            ran = 0.0 if executing is not None and str(ts.key) not in executing else None
            rec = TryRecord(
                str(ts.key), ws.id, ts.sent, max(end, ts.sent), "worker-lost", ev.cause,
                ts.queued, ran,
            )  # fmt: skip
            self._tried(ts, rec, None, began=self._began(ts, ws, ran, rec.stop))
            ts.lost_tries += 1
            # A checkpoint of this try survived (newer than the one it resumed from):
            # it made progress its retry keeps, so it starts the count of losses again.
            cps = self.checkpoints.get(ts.key) if self.checkpoints else None
            resumed = ts.resumed[0] if ts.resumed is not None else 0
            ts.lost_since_saved = 0 if cps and cps[0].seq > resumed else ts.lost_since_saved + 1
            self._stat(ts).lost += 1
            if crash and ran != 0.0:  # it may be what killed it
                self._suspect(ts.key)
                ts.contained_crashes += ws.contained
            self._failed_try(ts, "worker-lost", ev.cause, None, ws.id, grouped=False)
            ts.worker = None
            ts.disk_need = 0
            loss = self._walltime_lost(ts, ws) if ev.cause == "walltime" else None
            if self._promote_copy(ts):  # a copy runs on: no retry, nothing charged
                free = True
                if self.feed_on:  # (the report's free retries: not a failure)
                    self._records.append(("retry", ts.key, False, ts.spec.pool, None))
            else:
                free = self._after_failure(ts, "worker-lost", ev.cause, None, ws.id, loss)
            groups = self.free_groups if free and ev.cause in BENIGN_LOSSES else None
            # What followed; erred, its group says why (TaskCrashedWorkers, WorkerLost).
            verdict = ts.error if ts.state == "erred" else None
            self._group(ts, "worker-lost", ev.cause, verdict, ws.id, groups)
        ws.processing.clear()
        ws.waiting.clear()
        ws.began.clear()
        ws.n_producers = 0
        stranded: list[Key] = []  # held now only by workers that leave
        for ts in list(ws.has_what):
            ts.who_has.discard(ws.id)
            if self._only_leaving_hold(ts):
                # Its other holders all leave (one left it to a copy that landed here, a
                # survivor or keeper lost with it): one of them copies it on instead.
                stranded.append(ts.key)
            self._files[ts.key] = ts
            self.copy_failed.pop(ts, None)  # they may have failed for want of this source
            if ts in self.replicas:
                # A retired worker (drained) lost nothing: what it alone held and was
                # needed was copied off first (``_retire_idle``).
                self._holder_gone(ts, ws.id, lost=not ws.retired)
            if not ts.who_has and ts.state == "memory":
                self._output_lost(ts, ws.id)
            elif ts.wanted and ts.state == "memory":
                # Still held elsewhere (a replica, an evacuated copy): clients that were
                # told it is here learn where it is now.
                self._key_done(ts, min(ts.who_has))
        ws.has_what.clear()
        self.held_bytes.pop(ws.id, None)
        self.storage.forget(ws.id)
        if lost:
            self._ready_since(lost, end)
        for ts, to in onward:
            self._pass_on(ts, to, ws)
        if unmade or stranded:
            self._evacuate_unmade(list(dict.fromkeys([*unmade, *stranded])))

    def _ready_since(self, tasks: list[TaskState], at: float) -> None:
        """Of ``tasks``, those queued now (in this event) became ready at ``at``: a
        worker lost at the end of the grace for its rejoin ended at the drop of its
        connection, and the retries of its tries and the outputs it alone held, made
        again, have waited since, ready, while its id was held (their tries' ``queued``,
        their pools' waits served and ``oldest_wait``). Each pool's ``since`` stays
        oldest first: what became ready after ``at`` moves behind them."""
        back: dict[str, list[TaskState]] = {}
        for ts in tasks:
            pool = pool_key(ts.spec.pool)
            pw = self.pool_waits.get(pool)
            if ts.state == "queued" and pw is not None and pw.since.get(ts) == self._now:
                back.setdefault(pool, []).append(ts)
        for pool, queued in back.items():
            since = self.pool_waits[pool].since
            moved = set(queued)
            later = []  # ready after ``at``, newest first
            for ts, t in reversed(since.items()):
                if t <= at:
                    break
                if ts not in moved:
                    later.append(ts)
            for ts in queued:
                since[ts] = at
            for ts in reversed(later):
                since.move_to_end(ts)

    def _tasks_finished(self, ev: TasksFinished) -> None:
        ws = self.workers.get(ev.worker)
        if ws is not None and ws.jammed and any(r.key not in ws.jammed for r in ev.results):
            ws.jammed.clear()  # a try it ran ended: a thread of it is free again
            self._update_free(ws)
        # Something finished: progress, in the pool of its worker and over all of them.
        self.stalled_since.pop(ANY_POOL, None)
        if ws is not None:
            self.stalled_since.pop(ws.pool, None)
        if self.placement_since:
            for res in ev.results:
                done = self.tasks.get(res.key)
                if done is not None:
                    self._placed(done.spec.pool)
        if ws is not None and ev.rss:  # its RSS with its task processes, after these
            ws.rss = ev.rss  # (a result's own is its task's: its task process's)
        for res in ev.results:
            ts = self.tasks.get(res.key)
            untracked: list[Key] = []
            if ws is not None:
                for dk, peer, nbytes, took in res.fetches:  # copies made for it
                    self._moved("fetch", dk, nbytes, peer, ws.id, took)
                # Inputs the worker copied from peers: replicas if still wanted, else junk.
                for dk in res.fetched:
                    dep = self.tasks.get(dk)
                    if dep is not None and dep.state == "memory":
                        self._add_replica(dep, ws)
                    else:
                        untracked.append(dk)
            copy = (
                ts is not None
                and ws is not None
                and ts.state == "processing"
                and ts.worker != ev.worker
                and ev.worker in self.copies.get(ts, ())
            )
            stale = (
                ts is None
                or ws is None
                or ts.state != "processing"
                or (not copy and ts.worker != ev.worker)
                or (
                    res.attempt
                    and res.attempt
                    != (ts.attempt if ts.worker == ev.worker else self._attempt_on(ts, ev.worker))
                )
            )
            if stale:
                # Stale: cancelled, retried elsewhere, from a worker we dropped, a
                # speculative copy (or first try) that lost the race, or an earlier try
                # on this worker (cancelled, the key sent here again since).
                self._log(res.key, "stale", f"result:{res.outcome}")
                if res.outcome == "ok" and not self._expected_on(ts, ev.worker):
                    untracked.append(res.key)
            if untracked and ws is not None:
                self._out.append(DropData(self._stimulus, ev.worker, tuple(untracked)))
            if stale:
                continue
            assert ts is not None and ws is not None
            if copy:
                self._copy_finished(ts, ws, res)
                continue
            self._release_slot(ts, ws)
            if res.outcome == "ok":
                self._finished_ok(ts, ws, res)
            elif res.outcome == "missing":
                self._inputs_missing(ts, res, ws.id)
            elif res.outcome == "cancelled":
                if self._promote_copy(ts):
                    continue
                self._set(ts, "cancelled")
                ts.error = CancelledError(str(ts.key), "cancelled on the worker")
                self._terminal(ts)
            else:
                error = self._try_failed(ts, ws, res, None)
                if not self._promote_copy(ts):  # else a copy runs on: it may still do
                    # A task whose code did not load: the retry policy may tell (cause).
                    cause = NOT_LOADABLE if isinstance(error, TaskNotLoadable) else None
                    self._after_failure(ts, res.outcome, cause, error, ws.id)

    def _tasks_running(self, ev: TasksRunning) -> None:
        """The worker says these tries have executed for a while: each one's running
        time (what speculation weighs) counts from its start there, not from when it
        was sent (it may have waited in the worker's queue). A throttled worker's
        producer that executes holds its thread (``_taken``): whether the worker is
        free is looked at again."""
        if ev.worker not in self.workers:
            return
        now, wid = self._now, ev.worker
        ws = self.workers[wid]
        for key, attempt, seconds in ev.started:
            ts = self.tasks.get(key)
            if ts is None or ts.state != "processing":
                continue
            if attempt and attempt != self._attempt_on(ts, wid):
                continue  # an earlier try of it there (cancelled, sent again since)
            if ts.worker == wid:
                ts.started = max(ts.sent, now - seconds)
                ts.rss_began = ws.rss
                ws.waiting.pop(ts, None)
                ws.began[ts] = ts.started
            elif wid in self.copies.get(ts, ()):
                sent = self.copies[ts][wid][0]
                self.copy_started[(ts, wid)] = max(sent, now - seconds)
        if ws.throttled:
            self._update_free(ws)

    def _attempt_on(self, ts: TaskState, wid: str) -> int:
        """The number of the try of ``ts`` running on ``wid`` (its first, or a copy)."""
        if ts.worker == wid:
            return ts.attempt
        copy = self.copies.get(ts, {}).get(wid)
        return copy[2] if copy is not None else 0

    def _expected_on(self, ts: TaskState | None, wid: str) -> bool:
        """Whether ``wid`` holds ``ts``'s output, or runs a try of it that will: a stale
        result's output there is then not dropped (it is, or will be, the output)."""
        if ts is None:
            return False
        if wid in ts.who_has:
            return True
        return ts.state == "processing" and (ts.worker == wid or wid in self.copies.get(ts, ()))

    def _try_failed(
        self, ts: TaskState, ws: WorkerState, res: TaskResult, cause: str | None
    ) -> BaseException | None:
        """A try of ``ts`` on ``ws`` ended ``error``, ``timeout``, ``oom`` or
        ``disk-full``: count it in its category, record it (with ``cause``, or the
        outcome's own) and return the error it ended with."""
        outcome = res.outcome
        if outcome == "ok" or outcome == "missing":
            raise ValueError(f"not a failed try: {outcome}")
        stat = self._stat(ts)
        error = res.error
        try_cause = cause
        if res.outcome == "oom":
            stat.oom += 1
            # What it reached before the kill: the category's peak, the one that matters.
            stat.peak_rss = max(stat.peak_rss, res.rss_peak)
            m = self._metric(ts.spec.category)
            m.peak_rss = max(m.peak_rss, res.rss_peak)
        elif res.outcome == "disk-full":
            self.disk_full_tries += 1
            # A refused copy of a file input (``error.input``): ``nbytes`` is that
            # input's, known to placement already; the task wrote nothing, so nothing
            # is learnt of its output, or its category's.
            if not (isinstance(error, DiskFull) and error.input):
                # Its output did not fit on the worker's disk: the category's outputs
                # are estimated this large from now on (steering its other tasks)...
                stat.disk_full += 1
                stat.add_output(res.nbytes)
                # ... and this very task needs at least that much: firm, for its
                # retries; only a lower bound if the file system stopped its write.
                cut = isinstance(error, DiskFull) and error.partial
                before = self.disk_measured.get(ts, (0, False))
                if res.nbytes > before[0] or (res.nbytes == before[0] and not cut):
                    self.disk_measured[ts] = (res.nbytes, cut)
            try_cause = cause or "disk-full"
            if not isinstance(error, DiskFull):  # the worker's own names the room
                room = max(0, ws.disk - ws.disk_used) if ws.disk else 0
                error = DiskFull(str(ts.key), ws.id, res.nbytes, room, ws.disk)
            error = self._disk_full_context(ts, ws, error)
        else:
            stat.errors += 1
            if outcome == "timeout":  # stopped past its timeout= (TaskTimeout)
                try_cause = cause or "timeout"
        failure: str
        if outcome == "disk-full" or outcome == "timeout":
            failure = outcome
        else:
            failure = error_name(error) if error is not None else res.outcome
        rec = TryRecord(str(ts.key), ws.id, res.start, res.stop, outcome, try_cause, ts.queued)
        if outcome == "oom":  # this try counted with the earlier ones
            ts.ooms += ((ws.id, ws.memory, max(res.rss_peak, res.rss)),)
            # Alone on its worker, the kill was its own; beside other tasks, theirs
            # counted too, and a worker as large may do when it runs it with fewer. So
            # too when what the task needs stays under the terminate fence without the
            # outputs its worker held (process execution, where the worker tells its
            # own process's RSS, ``own_rss``): that process, the rest of the worker that
            # is not outputs (its floor, copies on their way) and its inputs, which a
            # worker running it holds anyway. The outputs were the worker's, not the
            # task's; an emptier worker as large may run it.
            own = res.own_rss
            rest = max(0, res.rss - own - max(0, ws.memory_bytes)) if own else 0
            alone = not any(t is not ts for t in ws.processing)
            if alone and own and ws.memory and own + rest + ts.in_nbytes < terminate_fence(ws):
                alone = False
            ts.oom_alone += (alone,)
            ts.oom_own, ts.oom_worker_floor, ts.oom_rest = own, ws.floor, rest
            # a thread worker stops itself (exit); a task process tells its own RSS
            ts.oom_exited = not ws.contained and not own
            tries = len(ts.tries) + 1
            error = TaskOutOfMemory(
                str(ts.key), ws.id, res.rss, ws.memory, tries, ts.ooms,
                own=own, floor=ws.floor, rest=rest, exited=ts.oom_exited,
                copied=ts.in_nbytes if own else 0,
            )  # fmt: skip
        record = self._tried(ts, rec, error, failure=failure)
        self._failed_try(ts, outcome, failure, error, ws.id, record)
        return error

    def _disk_full_context(self, ts: TaskState, ws: WorkerState, error: DiskFull) -> DiskFull:
        """``error``, told what filled ``ws``'s disk when other tasks' outputs did (the
        output or input that did not fit would fit on that disk empty: the disk was not
        too small for it, but full), and whether ``ts`` declared its output's size, so
        that its message advises what helps (docs/files.md)."""
        declared = "disk" in ts.spec.resources
        filled: dict[str, list[int]] = {}
        held: dict[str, list[int]] = {}  # of those, held only by a client's futures
        kept: dict[str, list[int]] = {}  # of those, read by all their readers: prune_depth's
        if ws.disk and not error.filesystem and error.nbytes <= ws.disk:
            for t in ws.has_what:
                if t is ts or not t.nbytes:
                    continue
                # kept: no reader left, and prune_depth keeps it (with depth 1 such an
                # output is being dropped: not the setting's doing)
                also = (
                    () if t.consumers
                    else (held,) if t.wanted
                    else (kept,) if self._holds(t)
                    else ()
                )  # fmt: skip
                for by in (filled, *also):
                    entry = by.setdefault(t.spec.category, [0, 0])
                    entry[0] += t.nbytes
                    entry[1] += 1
        if sum(b for b, _ in filled.values()) < error.nbytes - error.room:
            filled = held = kept = {}  # not what kept it out: nothing known fills that disk
        if not filled and declared == getattr(error, "declared", False):
            return error  # nothing to add: the worker's own

        def top(by: dict[str, list[int]]) -> tuple[tuple[str, int, int], ...]:
            return tuple(
                (c, b, n) for c, (b, n) in sorted(by.items(), key=lambda kv: (-kv[1][0], kv[0]))[:4]
            )

        first = getattr(self.policies["priority"], "name", "") == "consumers-first"
        return error.with_context(
            top(filled), declared, top(held), first, top(kept), self.config.prune_depth
        )

    def count_active(self, keys: Iterable[Key], coming: Iterable[Key] = ()) -> int:
        """How many of ``keys`` are still to do (waiting, queued or running, or brought
        by pieces still to come, ``coming``, and not done): what a cancel of them would
        stop. A query: it changes nothing."""
        tasks = self.tasks
        later = set(coming)
        return sum(
            1
            for key in keys
            if ((ts := tasks.get(key)) is not None and ts.state in ACTIVE)
            or (key in later and (ts is None or ts.state in ("erred", "cancelled")))
        )

    def _cancel_requested(self, ev: CancelRequested) -> None:
        spared: list[Key] = []
        told = (
            {k for k in ev.coming if (t := self.tasks.get(k)) and t.state in ACTIVE and t.wanted}
            if ev.coming
            else set()
        )
        for key in ev.keys:
            ts = self.tasks.get(key)
            if ts is None or ts.state not in ACTIVE:
                continue
            below, keep = self._kept_by(ts, ev.spare) if ev.spare else ((), set())
            if not keep:
                self._cancel(ts, ev.reason)
                continue
            # A key another client holds needs ``ts``: it runs on, and so does every
            # task between them. What only the canceller's branches need is cancelled
            # where it leaves them (what depends on that fails with it, as usual).
            spared.append(ts.key)
            for t in below:
                if t not in keep and t.state in ACTIVE and any(d in keep for d in t.deps):
                    self._cancel(t, ev.reason)
        if spared:
            self._out.append(CancelSpared(self._stimulus, tuple(spared)))
        if ev.coming:
            self._cancel_coming(ev, told.union(spared), frozenset(spared))

    def _cancel_coming(self, ev: CancelRequested, told: set[Key], spared: frozenset[Key]) -> None:
        """The keys of ``ev`` that pieces still to come bring (``ev.coming``, once per
        piece): each is cancelled as it comes (``_cancel_ahead``), and its clients are
        told now (the manager knows who wants it), but for a key the core has done
        (memory, released: it stands, as a cancel after the intake would leave it),
        spared, or told already (cancelled just now while wanted)."""
        ahead = self._cancel_ahead
        tasks = self.tasks
        asked = set(ev.keys)
        for key, pieces in Counter(ev.coming).items():
            if key in spared or key not in asked:
                continue
            ts = tasks.get(key)
            if ts is not None and ts.state not in ACTIVE and ts.state not in ("erred", "cancelled"):
                continue
            first = key not in ahead
            ahead[key] = [ev.reason, pieces]  # (pieces: all those still to come now)
            if first and key not in told:
                self._out.append(KeyCancelled(self._stimulus, key, ev.reason))

    @staticmethod
    def _kept_by(root: TaskState, spare: frozenset[Key]) -> tuple[list[TaskState], set[TaskState]]:
        """``root``'s active dependents (transitively, ``root`` first) and, of those
        and ``root``, the ones a task in ``spare`` is or needs. A worklist each way."""
        below = [root]
        seen = {root}
        for t in below:  # grows while walked: breadth first
            for d in t.dependents:
                if d not in seen and d.state in ACTIVE:
                    seen.add(d)
                    below.append(d)
        keep: set[TaskState] = set()
        stack = [t for t in below if t.key in spare]
        while stack:
            t = stack.pop()
            if t not in keep:
                keep.add(t)
                stack.extend(d for d in t.deps if d in seen)
        return below, keep

    def _keys_released(self, ev: KeysReleased) -> None:
        self._unwant(ev.keys)

    def _unwant(self, keys: Iterable[Key]) -> None:
        """One want less of each of ``keys`` (a client's, or a piece's hold)."""
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None or ts.wanted == 0:
                continue
            ts.wanted -= 1
            self._files[key] = ts
            if ts.wanted == 0:
                if self.lost_held:
                    self.lost_held.pop(ts, None)  # (a released task like any other now)
                if self.unreached:
                    self.unreached.pop(ts, None)  # (no client waits for its word)
                if ts.state in ACTIVE and ts.consumers == 0:
                    self._cancel(ts, "no longer wanted", unneeded=True)
                self._maybe_forget(ts)

    def _files_released(self, ev: FilesReleased) -> None:
        for key in ev.keys:
            ts = self.tasks.get(key)
            if ts is None or ts.state != "memory":
                continue
            for wid in ts.who_has:
                ws = self.workers.get(wid)
                if ws is not None:
                    self._unheld(ts, ws)
            ts.who_has.clear()
            if self.copy_failed:
                self.copy_failed.pop(ts, None)
            copies = self.replicas.pop(ts, None) if self.replicas else None
            if copies:
                # The registry may have decided before it heard of them: drop them too.
                for wid in sorted(copies):
                    self._out.append(DropData(self._stimulus, wid, (ts.key,)))
            self._set(ts, "released")
            if ts.consumers or ts.wanted:
                # Needed again since the registry decided (a new submission): recompute.
                self._recompute(ts)
            else:
                self._maybe_forget(ts)

    def _worker_draining(self, ev: WorkerDraining) -> None:
        ws = self.workers.get(ev.worker)
        if ws is None or ws.draining:
            return  # unknown (gone meanwhile) or draining already
        self._drain(ws, "draining")

    def _drain(self, ws: WorkerState, why: str) -> None:
        """Give ``ws`` no new tasks from now on, and retire it once it runs none
        (:meth:`_retire_idle`); ``why``: its story's line (``draining``, for an
        operator's drain or a scale-in; ``draining:walltime in N s``;
        ``draining:tasks_per_worker N``, its pool's limit reached). The speculative
        copies it runs are cancelled."""
        ws.draining = True
        self.draining.add(ws.id)
        self.free.pop(ws.id, None)
        self._log(ws.id, "joined", why)
        self._copies_off(ws, "drained")
        self._limits_changed()

    def undrain_refusal(self, ws: WorkerState) -> str:
        """Why draining ``ws`` may not be taken back (:class:`WorkerUndrained`), "" when
        it may: it drains (a :class:`WorkerDraining`), is not retired (told to stop),
        does not leave on its own, and was not drained for its walltime nor its pool's
        ``tasks_per_worker``."""
        if not ws.draining:
            return "it is not draining"
        if ws.leaving:
            return "it is leaving on its own"
        if ws.retired:
            return "it was retired (told to stop)"
        if ws.walltime_drain:
            return "it drains because its walltime is near"
        if self.tasks_left(ws) <= 0:
            return "it was sent its pool's tasks_per_worker tries"
        return ""

    def _category_forgotten(self, ev: CategoryForgotten) -> None:
        """Start ``ev.category``'s statistics afresh, in place (policies' views of it
        stay live): a past outlier (one huge try's rise, duration or output) no longer
        steers admission, placement or estimates. Its finished tries stay counted
        (``_forgotten_finished``: the metrics' counters do not go back), as do its
        failures by cause and its memory class (asked again as its tries end)."""
        st = self.stats.get(ev.category)
        if st is None:
            return
        self._forgotten_finished += st.count
        fresh = CategoryStats()
        for field in dataclasses.fields(CategoryStats):
            setattr(st, field.name, getattr(fresh, field.name))
        self._recount_max_rise()
        self._rise_held.clear()
        self._log("-", "category-forgotten", ev.category)

    def _worker_undrained(self, ev: WorkerUndrained) -> None:
        ws = self.workers.get(ev.worker)
        if ws is None or self.undrain_refusal(ws):
            return  # gone meanwhile, or going for good: left as it is
        ws.draining = False
        ws.keeping = None
        self.draining.discard(ws.id)
        self._log(ws.id, "draining", "undrained")
        self._update_free(ws)
        self._limits_changed()

    def _worker_leaving(self, ev: WorkerLeaving) -> None:
        ws = self.workers.get(ev.worker)
        if ws is None:
            self._out.append(Evacuate(self._stimulus, ev.worker, ()))
            return
        self.storage.leaving(ws.id, self._now)
        if ev.executing is not None:  # what it has in hand but does not execute: unstarted
            ws.executing = ev.executing
        if ev.executed:  # when each began, by what it says it has executed
            ws.executed = {key: self._now - ran for key, ran in ev.executed}
        if not ws.leaving:
            # No new tasks, and nothing to retire: it leaves by itself.
            ws.draining = ws.leaving = True
            self.draining.discard(ws.id)
            self.free.pop(ws.id, None)
            if not ws.retired:  # a retired one's story says so already
                self._log(ws.id, "joined", f"leaving:{ev.cause}")
            self._copies_off(ws, f"leaving:{ev.cause}")
            self._limits_changed()
        if self.checkpoints:  # copies of the checkpoints only leaving disks hold
            self._checkpoints_off(ws)
        self._redirect_planned(ws)
        needed = self._to_evacuate(ws)
        self._out.append(Evacuate(self._stimulus, ws.id, self._plan_moves(ws, needed, ws)))

    def _to_evacuate(self, ws: WorkerState) -> list[TaskState]:
        """What leaving ``ws`` must copy out: each output it holds (its own, or a copy
        it fetched) that is still needed (a client holds it, a task will read it) and
        that no other holder keeps: a holder that drains, said it leaves or is of
        ``ws``'s block (:meth:`_survivors`: going too, though its own Leaving may not be
        here yet) keeps nothing. Not one already planned by another leaving holder
        (:meth:`_evacuation_planned`) or on its way to a worker that stays: one copy
        on a survivor suffices. One job that stops several workers at once thus loses
        none of the outputs they all hold."""
        if self.stopping:  # the run ended: nothing will read them
            return []
        blocks = {(ws.block, ws.pool)} if ws.block else set()
        planned = self._evacuation_planned(blocks)
        return [
            ts
            for ts in ws.has_what
            if (ts.consumers > 0 or ts.wanted)
            and ts.key not in planned
            and not any(self._holds_on(h, blocks) for h in ts.who_has)
            and not self._copy_landing(ts)
        ]

    def _holds_on(self, wid: str, blocks: set[tuple[str, str]]) -> bool:
        """Whether worker ``wid`` keeps what it holds: it is here, neither drains nor
        said it leaves, and is of none of ``blocks`` (``(block, pool)`` of leaving
        workers: their siblings go with them)."""
        w = self.workers.get(wid)
        return w is not None and not w.draining and (w.block, w.pool) not in blocks

    def _evacuation_planned(self, blocks: set[tuple[str, str]]) -> set[Key]:
        """The outputs a leaving worker's plan (``evac_planned``) copies to a worker
        that stays (:meth:`_holds_on`, ``blocks`` as there)."""
        return {
            key
            for target, plan in self.evac_planned.items()
            if self._holds_on(target, blocks)
            for key in plan
        }

    def _plan_moves(
        self, ws: WorkerState, needed: Iterable[TaskState], *going: WorkerState
    ) -> tuple[tuple[Key, str, int], ...]:
        """Where leaving ``ws`` copies each output of ``needed``: largest first, each to
        the survivor of ``going`` (:meth:`_survivors`) with room for it (:func:`_has_room`:
        in its memory, or, spilling, on its disk) that will then hold the fewest bytes
        (with no survivor, of the keepers with room, :meth:`_keepers`, one of those
        whose walltime ends last: :func:`_longest_lived`);
        one that fits no survivor is computed again instead, as a lost output is. Each
        move is planned (``evac_planned``) until ``ws`` says which copies it made. None
        once the run ended (``stopping``: nothing will read them, as in :meth:`_to_evacuate`),
        more of a plan neither (:meth:`_plan_more`)."""
        if self.stopping:
            return ()
        survivors = self._survivors(*going)
        targets = survivors or self._keepers(*going)
        if not targets:
            return ()
        room = self._room_counts(targets)
        moves = []
        for ts in sorted(needed, key=lambda t: (-t.nbytes, str(t.key))):
            if not survivors and self._on_keepers(ts, targets):
                continue  # a keeper holds it, or another leaving holder copies it to one
            fits = [w for w in targets if w.id not in ts.who_has and room.fits(w, ts)]
            if not fits:
                continue  # no survivor has room for it: recompute it instead
            if not survivors:  # keepers: those that stay longest
                fits = _longest_lived(fits)
            target = room.place(self._lasting(fits), ts.nbytes)
            moves.append((ts.key, target.id, ts.nbytes))
            self.evac_planned.setdefault(target.id, {})[ts.key] = ws.id
        return tuple(moves)

    def _lasting(self, fits: list[WorkerState]) -> list[WorkerState]:
        """Of ``fits`` (workers with room for a copy of an output), those of no
        ``tasks_per_worker`` limit, if any: a copy put on a worker that drains after its
        pool's ``tasks_per_worker`` is copied on again when it does (with short-lived
        blocks, block after block: an audit's 191 outputs were copied 1,666 times),
        where one put on a worker without that limit stays."""
        lasting = [w for w in fits if self.tasks_left(w) == NO_LIMIT]
        return lasting or fits

    def _survivors(self, *going: WorkerState) -> list[WorkerState]:
        """The workers that may take the outputs of the leaving workers ``going``: they
        take new work (so none that said it leaves), and none is of the block of one of
        ``going``: a preempted block's workers all leave at once, though their own
        Leaving may not be here yet."""
        blocks = {(g.block, g.pool) for g in going if g.block}
        return [
            w for w in self.workers.values() if _takes_new(w) and (w.block, w.pool) not in blocks
        ]

    def _keepers(self, *going: WorkerState) -> list[WorkerState]:
        """When no worker takes new work (:meth:`_survivors`: every other one drains, for
        its walltime, a scale-in or an operator), the draining workers that stay a while
        and may hold the outputs of the leaving workers ``going``: none that said it
        leaves, was retired, is suspended or away, or is of a block of ``going``. A
        drained worker keeps what only it holds (:meth:`_retire_idle`): it copies it on
        to a worker that takes tasks once one joins, or stays holding it until it is
        released, where with no target the output was lost and computed again (an
        audit: a preemption while the other pool's workers drained before their
        walltime ran 15 finished tasks a second time)."""
        blocks = {(g.block, g.pool) for g in going if g.block}
        return [
            w
            for w in self.workers.values()
            if w.draining
            and not (w.leaving or w.retired or w.suspended)
            and w.away is None
            and (w.block, w.pool) not in blocks
        ]

    def _on_keepers(self, ts: TaskState, keepers: list[WorkerState]) -> bool:
        """Whether one of ``keepers`` (:meth:`_keepers`) holds ``ts``'s output or has a
        copy of it coming (a leaving holder's plan, ``evac_planned``): it stays there
        (a drained holder keeps what it alone holds, :meth:`_keeps`), and a second
        copy would take a leaving worker's grace for nothing (two workers of a
        preempted block, each holding it, copied it both)."""
        return any(w.id in ts.who_has or ts.key in self.evac_planned.get(w.id, ()) for w in keepers)

    def _only_leaving_hold(self, ts: TaskState) -> bool:
        """``ts``'s output is still needed (a client holds it, a task will read it) and
        every worker holding it is leaving: it is lost unless copied on."""
        if ts.state != "memory" or not (ts.consumers or ts.wanted) or not ts.who_has:
            return False
        return all((w := self.workers.get(h)) is None or w.leaving for h in ts.who_has)

    def _redirect_planned(self, ws: WorkerState) -> None:
        """``ws`` is leaving, and may be the target of another leaving worker's plan
        (chosen before its own Leaving came: both of a preemption that took several
        blocks at once). What that plan copies to ``ws`` would go with it: each such
        output still needed and only held by leaving workers is copied by its source,
        which holds it until it goes, to a survivor instead: more of the source's plan
        (a second :class:`Evacuate`), which it carries out with the first."""
        by_source: dict[str, list[TaskState]] = {}
        for key, source in self.evac_planned.pop(ws.id, {}).items():
            ts = self.tasks.get(key)
            if ts is not None and source in self.workers and self._only_leaving_hold(ts):
                by_source.setdefault(source, []).append(ts)
        self._plan_more(by_source, ws)

    def _plan_more(self, by_source: dict[str, list[TaskState]], *going: WorkerState) -> None:
        """More of each leaving source's plan (a second :class:`Evacuate`, carried out
        with the first): its outputs ``by_source``, each to a survivor of it and
        ``going``."""
        for source, needed in sorted(by_source.items()):
            src = self.workers[source]
            moves = self._plan_moves(src, needed, src, *going)
            for key, target, _ in moves:
                self._log(key, "memory", f"evacuate:{source}->{target}")
            if moves:
                self._out.append(Evacuate(self._stimulus, source, moves))

    def _evacuate_unmade(self, keys: list[Key]) -> None:
        """A leaving worker went without some copies its plan was to make (one failed,
        or it died first): each of those outputs still needed and held only by other
        leaving workers (which left it to that plan: :meth:`_to_evacuate`) is copied to
        a survivor by one of them, more of its plan. One whose copies are over ignores
        it: the output is then computed again once that one goes, as with no copy.
        So with a worker lost holding outputs whose other holders all leave (a copy
        landed on it, and they then copied none)."""
        by_source: dict[str, list[TaskState]] = {}
        planned: dict[frozenset[tuple[str, str]], set[Key]] = {}  # by the holders' blocks
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None or not self._only_leaving_hold(ts) or self._copy_landing(ts):
                continue
            holders = sorted(h for h in ts.who_has if h in self.workers)
            blocks = frozenset((w.block, w.pool) for h in holders if (w := self.workers[h]).block)
            if blocks not in planned:
                planned[blocks] = self._evacuation_planned(set(blocks))
            if holders and key not in planned[blocks]:
                by_source.setdefault(holders[0], []).append(ts)
        self._plan_more(by_source)

    def _pass_on(self, ts: TaskState, to: WorkerState, source: WorkerState | None) -> None:
        """An evacuated copy of ``ts`` landed on ``to``, which says it is leaving too
        (its Leaving came while the copy was on its way): copied on to a survivor,
        unless one holds it or a copy of it is on its way."""
        if to.leaving and self._only_leaving_hold(ts):
            self._copy_off(to, {ts}, going=(to,) if source is None else (to, source))

    def _retire_idle(self) -> None:
        """Retire the draining workers that run nothing any more, but never the only
        holder of an output still needed (a client holds it, or a task will read it):
        such outputs are first copied to workers that take new tasks
        (:meth:`_copy_off`); while none can take one, the worker stays, holding it,
        until it is released, or copied once a worker joins. Looked at again only after
        an event that may change that (``_keeping_changed``)."""
        changed, self._keeping_changed = self._keeping_changed, 0
        for wid in sorted(self.draining):
            ws = self.workers[wid]
            if ws.processing or self.evac_planned.get(wid):
                # (copies a leaving worker's plan sends it: kept until it says which
                # it made, and they are counted then, its WorkerLeft)
                continue
            if ws.keeping is None or changed >= _RECOUNT:
                # Idle now (nothing new comes to it), or a holder went or drains: what
                # only it holds is counted again from what it holds.
                first = ws.keeping is None
                ws.keeping = {ts for ts in ws.has_what if self._keeps(ts, wid)}
                if first and ws.keeping:
                    self._log(wid, "draining", f"keeping:{len(ws.keeping)}")
            elif changed:
                ws.keeping = {ts for ts in ws.keeping if self._keeps(ts, wid)}
            else:
                continue
            if ws.keeping:
                self._copy_off(ws, ws.keeping)
                continue
            self.draining.discard(wid)
            ws.retired = True
            self._log(wid, "draining", "retired")
            cause = "walltime" if ws.walltime_drain else "drained"
            self._out.append(RetireWorker(self._stimulus, wid, cause))

    def _held_and_coming(self, workers: list[WorkerState]) -> dict[str, int]:
        """Per worker of ``workers``, the bytes it holds and those being copied to it."""
        coming = self._coming(workers)
        return {wid: self.held_bytes.get(wid, 0) + n for wid, n in coming.items()}

    def _coming(self, workers: list[WorkerState]) -> dict[str, int]:
        """Per worker of ``workers``, the bytes being copied to it (``copying``) and
        those a leaving worker's plan copies to it (``evac_planned``, until that worker
        says which copies it made): two workers leaving one after the other plan onto
        one survivor, the second counting the first's copies."""
        coming = {w.id: 0 for w in workers}
        for copies in self.copying.values():
            for wid, nbytes in copies.items():
                if wid in coming:
                    coming[wid] += nbytes
        for wid in coming:
            for key in self.evac_planned.get(wid, ()):
                ts = self.tasks.get(key)
                if ts is not None:
                    coming[wid] += ts.nbytes
        return coming

    def _room_counts(self, targets: list[WorkerState]) -> _Room:
        """What :func:`_has_room` weighs, per worker of ``targets`` (:class:`_Room`): the
        bytes of the outputs it holds, those coming to it (:meth:`_coming`), those a plan
        being made adds (0 so far) and whether it spills now (:meth:`_spills_now`)."""
        held = {w.id: self.held_bytes.get(w.id, 0) for w in targets}
        return _Room(held, self._coming(targets), dict.fromkeys(held, 0), self._spills_now(targets))

    def _spill_refused_lately(self, ws: WorkerState) -> bool:
        """``ws`` said a spill found no disk room within ``10 * stall_timeout`` (an
        older refusal has cleared since)."""
        recent = 10 * self.config.stall_timeout
        return bool(ws.spill_refused) and self._now - ws.spill_refused_at <= recent

    def _spills_now(self, workers: list[WorkerState]) -> dict[str, bool]:
        """Per worker of ``workers``, whether it writes outputs to disk past its spill
        fence now: its spill fence is on (``spills``) and no spill was refused lately
        (:meth:`_spill_refused_lately`: what it does not write stays in its memory)."""
        return {w.id: w.spills and not self._spill_refused_lately(w) for w in workers}

    def _copy_landing(self, ts: TaskState) -> bool:
        """Whether a copy of ``ts``'s output is on its way to a worker that stays (a
        drained worker's :meth:`_copy_off`): not planned a second time."""
        for target in self.copying.get(ts.key, ()):
            w = self.workers.get(target)
            if w is not None and not w.draining:
                return True
        return False

    def _keeps(self, ts: TaskState, wid: str) -> bool:
        """Whether draining ``wid`` must keep ``ts``'s output before it is retired: it is
        still needed (a client holds it, a task will read it) and no other holder will
        stay with it. A holder stays unless it drains, leaves or was retired; of the
        draining holders the lowest id keeps it (so one of them, not all, waits)."""
        if ts.state != "memory" or not (ts.consumers or ts.wanted):
            return False
        for h in ts.who_has:
            w = self.workers.get(h) if h != wid else None
            if w is None or w.retired or w.leaving:
                continue
            if not w.draining or h < wid:
                return False
        return True

    def _copy_off(
        self,
        ws: WorkerState,
        keys: set[TaskState],
        going: tuple[WorkerState, ...] = (),
        to: WorkerState | None = None,
    ) -> None:
        """Have each output in ``keys`` (held by ``ws`` alone) copied to a worker that
        takes new tasks and has room for it, the one holding the fewest bytes; none
        already being copied or planned to be (a leaving holder's plan), none to a
        worker that failed a copy of it. The copy goes
        as a :class:`Replicate` (the one copy path), but it is an *evacuation*
        (``evacuating``): not a replica; it counts as an evacuation when it lands
        (:meth:`_evacuated`), as are the copies off a worker that leaves. ``going``:
        leaving workers whose blocks' workers take none of them (:meth:`_survivors`).
        ``to``: that worker instead, if it has room (a kept worker gathering the kept
        outputs of its pool, :meth:`~actors.scheduler_stall.PlacementWatch._gather_kept`)."""
        if self.stopping:  # the run ended: nothing will read them (as _to_evacuate)
            return
        targets = [to] if to is not None else self._survivors(*going)
        if not targets:
            return
        room = self._room_counts(targets)
        planned = self._evacuation_planned(set())
        for ts in sorted(keys, key=lambda t: (-t.nbytes, str(t.key))):
            if self.copying.get(ts.key) or ts.key in planned:
                # On its way; or a leaving holder copies it (:meth:`_to_evacuate`
                # counts no draining holder): kept till that one says it did.
                continue
            failed = self.copy_failed.get(ts, ())
            fits = [
                w
                for w in targets
                if w.id not in failed and w.disk_free() >= ts.nbytes and room.fits(w, ts)
            ]
            if not fits:
                continue
            to = room.place(self._lasting(fits), ts.nbytes)
            self.copying.setdefault(ts.key, {})[to.id] = ts.nbytes
            self.evacuating.add((ts.key, to.id))
            self.storage.copy_sent(ts.key, to.id, ws.id, self._now)
            self._log(ts.key, "memory", f"evacuate:{ws.id}->{to.id}")
            self._out.append(Replicate(self._stimulus, to.id, ws.id, ((ts.key, ts.nbytes),)))

    def _policy_changed(self, ev: PolicyChanged) -> None:
        if ev.kind not in self.policies:
            raise KeyError(f"unknown policy kind {ev.kind!r}")
        self.policies[ev.kind] = ev.policy
        if _builtin(ev.policy):
            self._timed.discard(ev.kind)
        else:
            self._timed.add(ev.kind)
        self.problems.afresh(ev.kind)  # a new policy's errors are told afresh
        self.failing.pop(ev.kind, None)
        # a new policy's time is summed afresh: its predecessor's calls in this turn, over
        # turns (a spell) and its slow turns are not the new one's
        self._turn.pop(ev.kind, None)
        self._spent.pop(ev.kind, None)
        self._spent_sum.pop(ev.kind, None)
        self._slow_turns.pop(ev.kind, None)
        name = str(getattr(ev.policy, "name", ev.policy))
        self._swapped(ev.kind, name, param_values(ev.policy), ev.by, ev.why)
        if ev.kind == "placement":
            self._locality_hooks()
        if ev.kind == "replication":
            self._replication_floor()
        if ev.kind == "speculation":
            self._speculation_bound()
        if ev.kind == "memory":
            self.classes = {}  # asked again of the new policy as tasks are re-queued
        if ev.kind in ("priority", "memory"):
            self._requeue_all()

    def _worker_memory(self, ev: WorkerMemory) -> None:
        ws = self.workers.get(ev.worker)
        if ws is None:
            return
        ws.rss, ws.throttle_at, ws.memory_bytes = ev.rss, ev.throttle_at, ev.memory_bytes
        ws.terminate_at = ev.terminate_at
        ws.disk_used = max(0, ev.disk_used)
        ws.disk_foreign = min(ws.disk_used, max(0, ev.disk_foreign))
        if ev.spill_refused != ws.spill_refused:
            if ev.spill_refused > ws.spill_refused:
                ws.spill_refused_at = self._now
            ws.spill_refused, ws.spill_dir = ev.spill_refused, ev.spill_dir
        if ev.past_peak > ws.past_peak:  # past a fence that cannot kill: the client is told
            ws.past_peak = ev.past_peak
            log = past_limit_logged(ws.past_logged, ev.past_peak, ev.limit)
            if log:
                ws.past_logged = ev.past_peak
            categories = tuple(sorted({ts.spec.category for ts in ws.processing}))
            self._out.append(
                WorkerPastLimit(self._stimulus, ws.id, ev.limit, ev.past_peak, categories, log)
            )
        if ev.floor != ws.floor:  # its floor's warning, shown while it holds
            ws.floor = ev.floor
            self._out.append(WorkerFloor(self._stimulus, ws.id, ev.floor, ev.floor_warning))
        self.storage.disk(ws.id, ws.disk_used)
        ws.abandoned = max(0, ev.abandoned)
        held = max(0, ev.held)
        if held != ws.held:
            ws.held = held
            self._log(
                ws.id, "held",
                f"{held} of its {ws.cores:g} threads held by tries that could not be "
                "stopped (as many abandoned already as it has threads): no task goes to "
                "their slots until the calls return" if held else "no thread held",
            )  # fmt: skip
            self._update_free(ws)
        if ev.throttled == ws.throttled:
            return
        ws.throttled = ev.throttled
        if ev.throttled:
            self.throttled.add(ws.id)
            self.throttled_in[ws.pool] += 1
            ws.throttled_since = self._now
        else:
            self.throttled.discard(ws.id)
            self._unthrottled_in(ws.pool)
            ws.throttled_total += max(0.0, self._now - ws.throttled_since)
            self.stalled_since.pop(ANY_POOL, None)  # memory came down: progress
            self.stalled_since.pop(ws.pool, None)
        self._log(ws.id, "memory", "throttled" if ev.throttled else "unthrottled")
        self._update_free(ws)

    def throttled_seconds(self, now: float) -> dict[str, float]:
        """Per worker, the seconds it has been throttled since it joined, its episode
        under way counted to ``now``; workers never throttled are left out (what a
        client's throttle hint reads: ``StatusReply.throttled_seconds``)."""
        out = {}
        for wid, ws in self.workers.items():
            seconds = ws.throttled_total
            if ws.throttled:
                seconds += max(0.0, now - ws.throttled_since)
            if seconds or ws.throttled:
                out[wid] = seconds
        return out

    def _tick(self, ev: Tick) -> None:
        """Drain workers whose walltime is near (the watchdog runs after every event);
        propose speculative copies of long tasks to idle workers."""
        if self.deadlines:
            self._drain_before_walltime()
        if self._max_copies:
            self._speculate()
        self._take_back()
        if self.unreached:
            self._tell_unreached()
        for ledger in (self.hosts, self.host_cores):  # workers of a machine came or
            if ledger.pending:  # went: their memory, their cores
                self._out.extend(ledger.check(self._now, self._stimulus))

    @property
    def speculates(self) -> bool:
        """Speculative copies are on and there is another worker to run one: the
        shell sends :class:`Tick` events for them to be considered."""
        return self._max_copies > 0 and len(self.workers) > 1

    def drain_margin(self, ws: WorkerState) -> float:
        """How long before its walltime worker ``ws`` is drained: its pool's
        ``drain_period`` (``drain_periods``), else ``drain_period`` if set, else
        ``walltime_grace`` plus the longest expected task of its pool (the largest p90
        duration of the categories that finished on its pool's workers), at most half
        the time it had from joining to its walltime: so that one long task, or one
        pool's, never drains a worker the moment it joins."""
        return self._drain_margin(ws, {})

    def _drain_margin(self, ws: WorkerState, longest: dict[str, float]) -> float:
        """:meth:`drain_margin`; ``longest``: the longest expected task per pool, filled
        as pools are met (one computation per pool for a pass over the workers)."""
        period = self.config.drain_periods.get(ws.pool, self.config.drain_period)
        if period is not None:
            return period
        if ws.pool not in longest:
            cats = self.pool_categories.get(ws.pool, ())
            longest[ws.pool] = max((self.stats[c].p90_duration for c in cats), default=0.0)
        margin = self.config.walltime_grace + longest[ws.pool]
        if ws.deadline is not None:
            margin = min(margin, (ws.deadline - ws.joined) / 2)
        return margin

    def _walltime_lost(self, ts: TaskState, ws: WorkerState) -> WalltimeLoss | None:
        """``ts``'s try is lost with ``ws``, which reached its walltime: how long it had
        run against the walltime of its pool, for its retry's decision
        (``WalltimeLoss``), unless a checkpoint of it lets a retry resume (None). Its
        story says how long it ran."""
        if ts.key in self.checkpoints:
            return None
        could = [w for w in self.workers.values() if self._runs_on(ts.spec.pool, w)]
        loss = walltime_loss(ts, ws, could, self._drain_margin(ws, {}), self._now)
        if loss is None:
            return None
        self._log(
            ts.key, "processing",
            f"walltime:ran {loss.ran:.0f} s of {loss.walltime:.0f} s (drain {loss.drain:.0f} s)",
        )  # fmt: skip
        return loss

    def _drain_before_walltime(self) -> None:
        longest: dict[str, float] = {}
        for ws in list(self.workers.values()):
            if ws.deadline is None or ws.draining:
                continue
            left = ws.deadline - self._now
            if left > self._drain_margin(ws, longest):
                continue
            ws.walltime_drain = True
            self._drain(ws, f"draining:walltime in {max(0.0, left):.0f} s")

    def _long_enough(self, ts: TaskState, cands: list[WorkerState]) -> list[WorkerState]:
        """Workers whose walltime leaves room for ``ts`` (its category's p90 duration),
        while another worker could take it: a task is not started where it would be cut
        short. When no worker of its pool has the time, any candidate will do."""
        st = self.stats.get(ts.spec.category)
        need = st.p90_duration if st is not None else 0.0
        if not need:
            return cands
        now = self._now
        fits = [w for w in cands if w.deadline is None or w.deadline - now >= need]
        if fits:
            return fits
        pool = ts.spec.pool
        later = any(
            self._runs_on(pool, w)
            and not w.draining
            and (w.deadline is None or w.deadline - now >= need)
            for w in self.workers.values()
        )
        return [] if later else cands

    # ----------------------------------------------------------------- transitions

    def _set(self, ts: TaskState, finish: str) -> None:
        start = ts.state
        facts = _MOVE_FACTS.get((start, finish))
        if facts is None:
            raise InvalidTransition(ts.key, start, finish, self.story(ts.key))
        move, was_active, now_active, wave, ended, queued = facts
        if was_active != now_active:
            delta = 1 if now_active else -1
            files = self._files
            for d in ts.deps:
                d.consumers += delta
                files[d.key] = d
            if self._depth > 1:
                self._upstream_changed(ts)
        ts.state = finish
        if start == "memory" and self.unreached:
            self.unreached.pop(ts, None)  # (made again, or let go: its word comes then)
        if wave:
            if start == "waiting":
                ts.retry_at = 0.0  # (a retry held for its backoff is held no more)
            self._wave_moved(ts, finish == "waiting")
        self.moves[move] += 1
        if self._tracked:
            runs = self._tracked.get(ts)
            if runs is not None:
                self._progress_moved(ts, start, finish, ended, runs)
        if ended and self.checkpoint_workers and ts.key in self.checkpoint_workers:
            self._prune_all_checkpoints(ts.key)
        if queued:
            pool = pool_key(ts.spec.pool)
            self.queued_counts[pool] += queued
            if ts.spec.resources and (unfit := self.unfit_pools(ts.spec.pool, ts.spec.resources)):
                for p in unfit:
                    self.unfit_counts[p] += queued
                if queued > 0 and not ts.wait_said:
                    self._tell_resources_wait(ts)  # (no block comes for it: say so now)
            pw = self.pool_waits.get(pool)
            if pw is None:
                pw = self.pool_waits[pool] = PoolWaits()
            if queued > 0:
                pw.since[ts] = self._now
            else:
                ready = self.ready_entries.get(ts.spec.category)
                if ready is not None and ready.pop(ts, None) is not None and not ready:
                    del self.ready_entries[ts.spec.category]
                at = pw.since.pop(ts, None)
                if finish == "processing":  # its try's records say when it became ready
                    ts.queued = at
                if at is not None and finish == "processing":  # served: its wait counts,
                    self._served(ts, self._now - at)  # in the pool of the worker taking it
        self.story_log.append((ts.key, start, finish, self._stimulus, self._now))
        if self.feed_on:
            self._records.append(
                ("state", ts.key, finish, ts.spec.category, ts.spec.pool, ts.worker,
                 ts.client)
            )  # fmt: skip
        if was_active and not now_active:
            if self.disk_remakes:  # (the stall breaker's remakes are active tasks)
                self._disk_task_ended(ts)
            for d in ts.deps:
                if d.consumers == 0 and d.wanted == 0 and d.state in ACTIVE:
                    self._to_cancel.append((d, f"only needed by {ts.key!r}, which is {finish}"))

    def _count_progress(self, ev: GraphSubmitted, new: list[TaskState]) -> None:
        """Count the tasks of ``ev``'s piece for its run's progress: those it added or
        runs again (``new``) and those known still under way, from the state they are
        in; those known done (in memory, or released) as finished at once."""
        p = self.progress.get(ev.run)
        if p is None:
            if len(self.progress) >= MAX_PROGRESS_RUNS:  # a client that never came back
                self.progress.pop(self._progress_victim()).gone = True
            p = self.progress[ev.run] = RunProgress()
        fresh = set(new)
        tracked = self._tracked
        for key in ev.specs:
            ts = self.tasks[key]
            p.total += 1
            if ts not in fresh and ts.state in ("memory", "released"):
                p.finished += 1
                p.ended.append((key, _ran_on(ts), "memory"))
                continue
            if ts not in fresh and ts.state in _ENDED:  # (not run again: ended)
                p.finished += 1
                p.erred += ts.state == "erred"
                p.ended.append((key, _ran_on(ts), ts.state))
                continue
            p.counts[_PROGRESS_SLOT.get(ts.state, 0)] += 1
            runs = tracked.get(ts)
            if runs is None:
                tracked[ts] = [p]
            else:
                runs.append(p)
        p.complete = ev.final

    def _progress_moved(
        self, ts: TaskState, start: str, finish: str, ended: bool, runs: list[RunProgress]
    ) -> None:
        """``ts``, counted for ``runs``, moved from ``start`` to ``finish``."""
        was = _PROGRESS_SLOT.get(start, 0)
        if ended:
            del self._tracked[ts]
            worker = _ran_on(ts)
            for p in runs:
                p.counts[was] -= 1
                p.finished += 1
                p.erred += finish == "erred"
                if not p.gone:
                    p.ended.append((ts.key, worker, finish))
            return
        now = _PROGRESS_SLOT.get(finish, 0)
        if now != was:
            for p in runs:
                p.counts[was] -= 1
                p.counts[now] += 1

    def _progress_victim(self) -> str:
        """The counted run to let go for a new one: the oldest whose tasks all ended and
        were all handed over (only its client's last ask is missing), else the oldest
        whose tasks all ended, else the oldest (a bar that stops short: its client says
        so)."""
        done = [r for r, p in self.progress.items() if p.complete and p.finished == p.total]
        told = next((r for r in done if not self.progress[r].ended), None)
        return told or (done[0] if done else next(iter(self.progress)))

    def _progress_asked(self, ev: ProgressAsked) -> None:
        """How far counted run ``ev.run`` is (``ProgressQuery``'s answer, a
        :class:`ProgressAnswer`), its ``ended`` handed over (each ended task is said
        once); ``ev.stop``: let it go after this. ``None`` for a run not counted."""
        p = self.progress.pop(ev.run, None) if ev.stop else self.progress.get(ev.run)
        counts: dict[str, Any] | None = None
        if p is not None:
            if ev.stop:
                p.gone = True
            ended, p.ended = p.ended, []
            waiting, ready, running = p.counts
            counts = {
                "total": p.total, "finished": p.finished, "erred": p.erred,
                "waiting": waiting, "ready": ready, "running": running,
                "complete": p.complete, "ended": ended,
            }  # fmt: skip
        self._out.append(ProgressAnswer(self._stimulus, ev.run, counts))

    def _served(self, ts: TaskState, wait: float) -> None:
        """``ts``, ready for ``wait`` seconds, is sent to ``ts.worker``: the wait counts
        in that worker's pool (as the monitoring database's ``tries`` and ``workers``
        rows count it: docs/monitoring.md), not in ``"*"`` for a task any pool may run."""
        ws = self.workers.get(ts.worker) if ts.worker is not None else None
        pool = ws.pool if ws is not None else pool_key(ts.spec.pool)
        pw = self.pool_waits.get(pool)
        if pw is None:
            pw = self.pool_waits[pool] = PoolWaits()
        pw.recent.append(wait)
        pw.n += 1
        pw.total += wait

    def _repool(self, ts: TaskState, spec: TaskSpec) -> None:
        """``ts`` takes ``spec``, whose pool may differ (a resubmission, a fallback)."""
        old, new = pool_key(ts.spec.pool), pool_key(spec.pool)
        ts.spec = spec
        if old != new:
            self.pool_tasks[new] += 1
            self._pool_task_gone(old)

    def _pool_task_gone(self, pool: str) -> None:
        self.pool_tasks[pool] -= 1
        if not self.pool_tasks[pool]:
            del self.pool_tasks[pool]

    def _estimate(self, ts: TaskState) -> float:
        """Seconds ``ts`` is expected to run: its category's mean duration so far
        (``unknown_duration`` before any of the category has finished)."""
        st = self.stats.get(ts.spec.category)
        return st.mean_duration if st is not None and st.count else self.config.unknown_duration

    def _long(self, ts: TaskState) -> bool:
        """``ts`` is expected to run ``long_task`` seconds or longer (its category's
        mean duration), or its category has no finished try (``unknown_long``): it
        goes only to a worker with a core free of tasks (``_core_free``), never to wait
        in a busy worker's queue, from which no worker that joins could take it."""
        st = self.stats.get(ts.spec.category)
        if st is None or not st.count:
            return self.config.unknown_long
        return st.mean_duration >= self.config.long_task

    def _no_core_for(self, pool: str | None, producer: bool) -> bool:
        """No free worker of ``pool`` (any, for None) that takes the ready heap's tasks
        (producers, for ``producer``) has a core free of tasks (``_core_free``)."""
        return not any(
            self._runs_on(pool, w) and (not producer or self._takes_producer(w)) and _core_free(w)
            for w in self.free.values()
        )

    def _wave_moved(self, ts: TaskState, entered: bool) -> None:
        """``ts`` entered or left ``waiting``: keep its dependents' ``waiting_deps`` and
        :attr:`next_wave` up to date (one pass over its dependents, once per move)."""
        delta = 1 if entered else -1
        for d in ts.dependents:
            d.waiting_deps += delta
            if d.state == "waiting" and d.waiting_deps == (1 if entered else 0):
                self._in_wave(d, not entered)
        self._in_wave(ts, entered and ts.waiting_deps == 0)

    def _in_wave(self, ts: TaskState, on: bool) -> None:
        pool = pool_key(ts.spec.pool)
        wave = self.next_wave.get(pool)
        if on:
            if wave is None:
                wave = self.next_wave[pool] = {}
            wave[ts] = None
        elif wave is not None:
            wave.pop(ts, None)

    def upcoming(self, now: float, most: int = UPCOMING_MOST) -> dict[str, list[float]]:
        """Per pool (``"*"``: any pool), the seconds until each task of the next wave is
        expected to be ready, shortest first: the longest of its inputs' expected times
        left (done: 0; running: its category's mean duration from when it began, as its
        worker said (``TasksRunning``), else from when it was sent, at least 0;
        otherwise not started: a whole mean duration; ``unknown_duration`` before any
        of its category has finished, as for placement). A task is left out
        while an input runs past twice that (late: nothing says when it ends, and the
        blocks asked for it would wait idle). At most ``most`` tasks per pool are looked
        at, the earliest to join the wave first, and at most :data:`UPCOMING_INPUTS`
        inputs in all: the answer is a hint for the autoscaler, whose pools are bounded
        anyway, asked every tick on the scheduler's loop. Tries on workers drained for
        their walltime that are not expected to end by it count too, due at that
        deadline (:meth:`_walltime_cut`): their retries need a block then. A task no
        configured pool's workers could run (:meth:`unfit_pools`) is left out; one of
        no pool that only some could run counts under each of those, not ``"*"`` (a
        pool whose blocks could never run it had one asked for ahead of time, idle);
        so for those tries cut at a walltime (:meth:`_upcoming_keys`)."""
        out: dict[str, list[float]] = {}
        budget = UPCOMING_INPUTS
        for pool, wave in self.next_wave.items():
            for ts in itertools.islice(wave, most):
                keys = self._upcoming_keys(pool, ts)
                if not keys:
                    continue  # no block of a configured pool could run it: none is asked
                budget -= len(ts.deps)
                if budget < 0:
                    break
                left = ts.retry_at - now  # (a retry held for its backoff: until then)
                for d in ts.deps:
                    if d.state == "memory":
                        continue
                    mean = self._estimate(d)
                    if d.state == "processing":  # from its start, once its worker said it
                        t = (d.sent if d.started is None else d.started) + mean - now
                    else:
                        t = mean
                    if t < -mean:
                        break  # running past twice its mean: late
                    left = max(left, t)
                else:
                    for key in keys:
                        out.setdefault(key, []).append(max(left, 0.0))
        for ts, deadline in self._walltime_cut(now):
            for key in self._upcoming_keys(pool_key(ts.spec.pool), ts):
                out.setdefault(key, []).append(max(deadline - now, 0.0))
        for times in out.values():
            times.sort()
            del times[most:]
        return out

    def _upcoming_keys(self, pool: str, ts: TaskState) -> tuple[str, ...]:
        """Under which pools :meth:`upcoming` counts ``ts`` of the wave of ``pool``: its
        own (``"*"``: any pool); none when no configured pool it may run in has
        workers with the cores or memory it asks (:meth:`unfit_pools`); for a task of no
        pool that only some of them could run, each of those."""
        res = ts.spec.resources
        unfit = self.unfit_pools(ts.spec.pool, res) if res else []
        if not unfit:
            return (pool,)
        cfg = self.config
        return tuple(
            p for p in cfg.pool_cores
            if p not in unfit and runs_on(ts.spec.pool, p, cfg.reserved_pools)
        )  # fmt: skip

    def _walltime_cut(self, now: float) -> Iterator[tuple[TaskState, float]]:
        """The tries on workers drained for their walltime that are not expected to end
        by it, with that deadline: their category's mean from their start ends past it,
        or they run past twice that (late: nothing says when they end). A try waiting
        for a core in its worker's queue (not known to execute, beyond as many as the
        worker has cores free, the first sent first) begins no sooner than now: its wait
        is no run, and it is cut if its mean from now ends past the deadline. They are
        lost at the deadline and ready again then: :meth:`upcoming` has them due at it,
        so a block for their retry is asked for a provisioning delay ahead, not after."""
        for wid in sorted(self.draining):
            ws = self.workers.get(wid)
            if ws is None or not ws.walltime_drain or ws.deadline is None:
                continue
            queued = set(itertools.islice(ws.waiting, max(ws.cores - len(ws.began), 0), None))
            for ts in ws.processing:
                mean = self._estimate(ts)
                if ts in queued:
                    cut = now + mean > ws.deadline
                else:
                    began = ts.sent if ts.started is None else ts.started
                    cut = began + mean > ws.deadline or now - began > 2 * mean
                if cut:
                    yield ts, ws.deadline

    def _spread_failures(self) -> None:
        """Work through failures and cancellations that spread along the graph (tasks
        too large to admit, dependents of a failed task, inputs nothing needs any more).

        Kept as worklists, not recursion, so a chain of any length is safe. (Not to be
        confused with draining a worker: see ``draining`` and ``_retire_idle``.)
        """
        while self._to_fail or self._to_cancel or self._too_large or self._oom_stuck:
            while self._too_large:
                self._admit(self._too_large.pop())
            while self._oom_stuck:
                ts = self._oom_stuck.pop()
                if ts.state in ("waiting", "queued"):
                    self._no_larger_worker(ts, ts.spec.pool)
            while self._to_fail:
                ts, failed = self._to_fail.pop()
                if ts.state in ACTIVE:
                    if ts.state == "processing":
                        self._unassign(ts, cancel=True, cause="dependency-failed")
                    self._fail_dependent(ts, failed)
            while self._to_cancel:
                ts, reason = self._to_cancel.pop()
                if ts.state in ACTIVE and ts.consumers == 0 and ts.wanted == 0:
                    self._cancel(ts, reason, unneeded=True)
        self._inherited = None

    def _activate(self, ts: TaskState) -> None:
        """Put a new (or resubmitted) task in waiting or queued by its inputs' states."""
        for d in self._wait_or_queue(ts):
            self._recompute(d)

    def _wait_or_queue(self, ts: TaskState) -> list[TaskState]:
        """Move ``ts`` to queued (all inputs in memory) or waiting.

        Inputs that failed (erred, or cancelled by a user) fail ``ts`` through the
        worklist; the ones that must be produced again (released, or cancelled only
        because nothing needed them then) are returned for the caller to recompute.
        """
        too_large = ts.in_nbytes > self._floor and ts.in_nbytes > self.largest.get(
            ts.spec.pool, NO_LIMIT
        )
        if too_large:
            self._too_large.append(ts)  # failed in _spread_failures, once it is waiting or queued
        missing = [d for d in ts.deps if d.state != "memory"] if ts.deps else []
        ts.waiting_on = len(missing)
        if not missing and ts.retry_at > self._now:  # a retry held for its backoff
            self._set(ts, "waiting")
            return []
        if not missing:
            self._set(ts, "queued")
            self._enqueue(ts)
            return []
        self._set(ts, "waiting")
        if too_large:
            return []  # nothing to recompute for it
        revive = []
        for d in missing:
            if d.state == "erred" or (d.state == "cancelled" and not d.unneeded):
                self._to_fail.append((ts, d))
            elif d.state in ("released", "cancelled"):
                revive.append(d)
        return revive

    def _admit(self, ts: TaskState) -> None:
        """Memory admission: fail ``ts`` with TaskTooLarge if the known size of its
        inputs is more than every worker in its pool can hold (see the module
        docstring). Not placed yet (waiting or queued) only; no worker in the pool: no
        decision."""
        if ts.state not in ("waiting", "queued"):
            return  # failed, cancelled or placed meanwhile
        largest = self.largest.get(ts.spec.pool, NO_LIMIT)
        if ts.in_nbytes <= largest:
            return  # a worker that fits it joined meanwhile
        inputs = [d for d in ts.deps if not d.file]  # (in_nbytes leaves file outputs out)
        done = sum(d.nbytes > 0 for d in inputs)
        err = TaskTooLarge(
            str(ts.key), ts.in_nbytes, int(largest), ts.spec.pool, inputs=len(inputs), done=done
        )
        self._log(ts.key, "admission", f"too large: {ts.in_nbytes} > {int(largest)}")
        self._fail(ts, err, error_record(err))

    def _no_larger_worker(self, ts: TaskState, pool: str | None) -> bool:
        """``ts`` was killed for memory (``ts.ooms``): its next try goes only to a
        worker of ``pool`` (for None, any but a reserved pool's) whose limit passes ``ts.oom_floor``
        (``TaskState.oom_fits``). It waits for one (False) while one takes new tasks there (busy
        or not), a configured pool it may run in gives its workers more (the autoscaler
        may start one), or no worker of its pool is there and none is known to come
        (nothing is decided, as for memory admission). Else it fails now with
        TaskOutOfMemory naming every try killed for memory (True)."""
        largest = self.largest.get(pool)
        if largest is not None and ts.oom_fits(largest):
            return False
        shapes = self.config.pool_memory
        reserved = self.config.reserved_pools  # (their workers never run a task of no pool)
        if any(ts.oom_fits(m) for p, m in shapes.items() if runs_on(pool, p, reserved)):
            return False
        if largest is None:
            if pool is None or pool not in shapes:
                return False  # no worker of its pool, none known to come: nothing decided
            size = ts.oom_size(shapes[pool])
            has = f"pool {pool!r} has no worker that takes tasks (its workers have {size})"
        else:
            where = "worker" if pool is None else f"worker of pool {pool!r}"
            has = f"the largest {where} that takes tasks has {ts.oom_size(largest)}"
        configured = "" if not shapes else ", and no pool is configured to start larger workers"
        nowhere = (
            f"a retry goes only to a worker with a memory limit {ts.oom_need}, and "
            f"{has}{configured}"
        )
        wid, limit, peak = ts.ooms[-1]
        err = TaskOutOfMemory(
            str(ts.key), wid, peak, limit, len(ts.tries), ts.ooms, nowhere,
            own=ts.oom_own, floor=ts.oom_worker_floor, rest=ts.oom_rest,
            exited=ts.oom_exited, copied=ts.in_nbytes if ts.oom_own else 0,
        )  # fmt: skip
        self._log(ts.key, "oom", f"not retried: {nowhere}")
        self._fail(ts, err)
        return True

    def _roomier(self, ts: TaskState, ws: WorkerState) -> bool:
        """``ws``'s memory limit passes every one ``ts`` was killed for memory under
        (``TaskState.oom_fits``; no limit passes any); True for a task never killed so."""
        return ts.oom_fits(ws.memory)

    def _limits_changed(self) -> None:
        """Workers came, went or started draining: recompute the largest limit per pool;
        where it fell (or a pool got its first worker, or lost its last), check every
        task not placed: for memory admission, and a retry after a kill for memory for a
        larger worker (``_no_larger_worker``)."""
        reserved = self.config.reserved_pools
        largest = _largest_per_pool(self.workers.values(), "memory", reserved)
        before, self.largest = self.largest, largest
        self._floor = min(largest.values(), default=NO_LIMIT)
        self.largest_disk = _largest_per_pool(self.workers.values(), "disk", reserved)
        self.largest_cores = _largest_per_pool(self.workers.values(), "cores", reserved)
        fell = any(limit < before.get(pool, NO_LIMIT) for pool, limit in largest.items())
        if not fell and before.keys() <= largest.keys():
            return
        for ts in self.tasks.values():
            if ts.state not in ("waiting", "queued"):
                continue
            if ts.in_nbytes and ts.in_nbytes > largest.get(ts.spec.pool, NO_LIMIT):
                self._too_large.append(ts)
            elif ts.ooms:  # killed for memory: a larger worker may have been the last
                self._oom_stuck.append(ts)

    def _enqueue(self, ts: TaskState) -> bool:
        """Put queued ``ts`` in its ready heap; or, while it backs off, among the held
        (False)."""
        if ts.held_until > self._now:
            heapq.heappush(self.held, (ts.held_until, next(self._seq), ts))
            return False
        if ts.ooms:  # a larger worker may have left since it was killed (_spread_failures)
            self._oom_stuck.append(ts)
        ts.prio = self._priority(ts)
        ts.producer = self._is_producer(ts)
        q = (ts.spec.pool, ts.producer)
        heap = self.queues.get(q)
        if heap is None:  # (not setdefault: no list made per task)
            heap = self.queues[q] = []
        entry = (ts.behind, ts.prio, next(self._seq), ts)
        heapq.heappush(heap, entry)
        ready = self.ready_entries.get(ts.spec.category)
        if ready is None:
            ready = self.ready_entries[ts.spec.category] = {}
        ready[ts] = entry
        return True

    def held_back(self) -> dict[str, int]:
        """Per pool (``"*"``: any pool), the queued tasks held back now
        (``_inputs_missing``): a look at the held heap, not at the tasks."""
        out: dict[str, int] = {}
        for until, _, ts in self.held:
            if ts.state == "queued" and ts.held_until == until:
                pool = pool_key(ts.spec.pool)
                out[pool] = out.get(pool, 0) + 1
        return out

    def _release_held(self, every: bool = False) -> None:
        """Held tasks whose time has come (``every``: all of them) go to their ready
        heaps."""
        held = self.held
        while held and (every or held[0][0] <= self._now):
            until, _, ts = heapq.heappop(held)
            if ts.state == "queued" and ts.held_until == until:
                ts.held_until = 0.0
                self._enqueue(ts)

    def retry_held_by_pool(self) -> dict[str, int]:
        """Per pool (``"*"``: any pool), the retries held for their backoff now: waiting,
        not ready (a look at the retry heap, not at the tasks)."""
        out: dict[str, int] = {}
        for until, _, ts in self.retry_held:
            if ts.retry_at == until:
                pool = pool_key(ts.spec.pool)
                out[pool] = out.get(pool, 0) + 1
        return out

    def _release_retries(self) -> None:
        """Retries whose backoff is over become ready (queued), or wait on for an input
        lost meanwhile, as any waiting task."""
        heap = self.retry_held
        while heap and heap[0][0] <= self._now:
            until, _, ts = heapq.heappop(heap)
            if ts.retry_at != until:
                continue  # it left waiting meanwhile (cancelled, failed, ...)
            ts.retry_at = 0.0
            if ts.waiting_on:
                continue
            self._log(ts.key, "retry", "ready: its backoff is over")
            self._set(ts, "queued")
            self._enqueue(ts)

    def _retry_delay(self, ts: TaskState, delay: Any) -> float:
        """The seconds the retry of ``ts`` is held, from the retry policy's ``delay``:
        cut to :data:`~policies.MAX_RETRY_DELAY`; anything but a number of seconds at
        least 0 is a policy error, and the retry is ready at once (0.0)."""
        number = isinstance(delay, numbers.Real) and not isinstance(delay, bool)
        if number and delay == 0:
            return 0.0
        if not number or not delay >= 0:  # (NaN too)
            self._policy_error(
                "retry", ts.key,
                f"retry asked a delay of {delay!r}, not a number of seconds >= 0: "
                "the retry is ready at once",
                "retry asked a delay that is not a number of seconds >= 0",
            )  # fmt: skip
            return 0.0
        if delay > MAX_RETRY_DELAY:
            self._log(
                ts.key, "retry",
                f"a delay of {float(delay):g} s cut to {MAX_RETRY_DELAY:g} s (MAX_RETRY_DELAY)",
            )  # fmt: skip
            return MAX_RETRY_DELAY
        return float(delay)

    def _finished_ok(
        self, ts: TaskState, ws: WorkerState, res: TaskResult, cause: str | None = None
    ) -> None:
        if ts in self.copies:  # this try won: its copies are cancelled, outputs dropped
            self.speculative["lost"] += len(self.copies[ts])
            self._cancel_copies(ts, "superseded")
        if self.disk_dropped_since:  # the stall breaker dropped outputs: progress?
            self._disk_progress(ts, ws)
        self._tried(
            ts,
            TryRecord(str(ts.key), ws.id, res.start, res.stop, "ok", cause, ts.queued),
            None,
            res.nbytes,
        )
        # Not 0 only once per task, unless recomputed; file outputs count apart.
        grown = (0 if res.file else res.nbytes) - (0 if ts.file else ts.nbytes)
        grown_files = (res.nbytes if res.file else 0) - (ts.nbytes if ts.file else 0)
        ts.nbytes = res.nbytes
        ts.file = res.file
        stat = self._stat(ts)
        # Comparisons below, not max(): each is what max(old, new) does (new replaces old
        # only if greater), without a builtin call; a finish makes seven of them.
        duration = res.stop - res.start
        if duration < 0.0:
            duration = 0.0
        category = ts.spec.category
        pool_categories = self.pool_categories.get(ws.pool)
        if pool_categories is None:
            pool_categories = self.pool_categories[ws.pool] = set()
        pool_categories.add(category)
        if res.file:
            self.file_categories.add(category)
        nbytes = res.nbytes
        rss = res.rss_peak if res.rss_peak > res.rss else res.rss
        stat.count += 1
        stat.total_duration += duration
        if duration > stat.max_duration:
            stat.max_duration = duration
        stat.recent.append(duration)
        stat.total_nbytes += nbytes
        stat.add_output(nbytes)
        consumed = sum(d.nbytes for d in ts.deps) if ts.deps else 0
        stat.consumed_nbytes += consumed
        if rss > stat.peak_rss:
            stat.peak_rss = rss
        if res.rss_before:
            # From right before it to its peak (sampled while it ran, or right after
            # it): a burst it frees before it ends counts (memory admission, _rss_fits).
            # Admission reads the window's largest (stat.rss_rise), not the all-time one:
            # an outlier long past does not hold the category back for good.
            was = stat.rss_rise
            stat.add_rise(rss - res.rss_before)
            if stat.rss_rise > self.max_rise:
                self.max_rise = stat.rss_rise
            elif stat.rss_rise < was == self.max_rise:
                self._recount_max_rise()
        m = self._metric(category)
        m.finished += 1
        m.duration_sum += duration
        m.output_bytes += nbytes
        m.input_bytes += consumed
        if rss > m.peak_rss:
            m.peak_rss = rss
        known = self.classes.get(category)
        if known is not None and known != self._ask_producer(
            category, self._stat_views[category], not ts.deps
        ):
            self._flipped.add(category)
        self._set(ts, "memory")
        ts.unreadable = False  # a new output: it may pickle
        self._add_replica(ts, ws)
        inputs = self._inputs_remake(ts) if ts.deps else 0.0
        ts.remake = duration + inputs
        if len(self.workers) > 1 and stat.mean_duration + inputs >= self._min_cost:
            self._replicate(ts, inputs)
        ready = []
        floor = self._floor
        for dep in ts.dependents:
            dep.in_files += grown_files
            if grown:
                dep.in_nbytes += grown
                if dep.in_nbytes > floor and dep.state == "waiting":
                    # Maybe too large already, whatever its other inputs: if so, it
                    # fails now (_admit, from _spread_failures), not once they are all computed.
                    self._too_large.append(dep)
            if dep.state == "waiting":
                dep.waiting_on -= 1
                if dep.waiting_on == 0 and not dep.retry_at:  # (held: _release_retries)
                    self._set(dep, "queued")
                    if self._enqueue(dep):
                        ready.append(dep)
        if len(ready) > 1:
            ready.sort(key=_prio_key)  # set order must not decide who gets the room
        if self._stays is not None:
            for dep in ready:
                if self._stays_with_its_data(dep, ws):
                    self._assign(dep, ws)
        if ts.wanted:
            self._key_done(ts, ws.id)

    def _inputs_missing(self, ts: TaskState, res: TaskResult, wid: str) -> None:
        """``ts`` could not get inputs on ``wid``: forget those replicas (making the
        outputs again where they were the last) and put it back, or, after
        :data:`MAX_INPUTS_UNREACHABLE` times in a row from holders still connected, the
        first ``unreachable_for`` seconds ago or more, fail it with
        :class:`InputsUnreachable` (a worker that cannot reach its peers would otherwise
        fetch, fail and recompute for ever), unless a copy of it runs elsewhere, which
        then becomes its try. From the second such try in a row on, it goes back held
        (queued, not placed) for :data:`INPUTS_BACKOFF` seconds, doubled per try up to
        :data:`MAX_INPUTS_BACKOFF`: a few tries a minute, not thousands a second, while
        the holder may still hand over or be declared lost (which frees every held
        task)."""
        held = tuple((dk, h) for dk, h in res.missing if h in self.workers)
        if not held:
            ts.unreachable = 0
        elif not ts.unreachable:
            ts.unreachable, ts.unreachable_since = 1, self._now
        else:
            ts.unreachable += 1
        over = self._now - ts.unreachable_since
        give_up = ts.unreachable >= MAX_INPUTS_UNREACHABLE and over >= self.config.unreachable_for
        if give_up and not self._promote_copy(ts):
            pairs = tuple((str(dk), h) for dk, h in held)
            err = InputsUnreachable(str(ts.key), wid, pairs, ts.unreachable, over)
            self._log(ts.key, "unreachable", f"{ts.unreachable} times: {pairs}")
            # Why it failed, where failures are counted and grouped (metrics, dashboard).
            self._failed_try(ts, "missing", "InputsUnreachable", err, wid)
            self._fail(ts, err)
        for dk, holder in res.missing:
            self._not_on(dk, holder)
        if not give_up and not self._promote_copy(ts):
            if ts.unreachable > 1:
                hold = min(INPUTS_BACKOFF * 2 ** (ts.unreachable - 2), MAX_INPUTS_BACKOFF)
                ts.held_until = self._now + hold
                self._log(ts.key, "unreachable", f"{ts.unreachable} times: held {hold:g} s")
            self._back_to_ready(ts)

    def _not_on(self, key: Key, wid: str) -> None:
        """``wid`` turned out not to hold ``key``'s output, or could not hand it over
        (unreachable, too slow, a copy that failed its checksum): forget that replica,
        and make the output again if it was the last one. A ``wid`` still here is told
        to drop whatever it has of ``key``, so nothing it keeps goes untracked."""
        dep = self.tasks.get(key)
        if dep is None:
            return
        if wid in dep.who_has:
            dep.who_has.discard(wid)
            w = self.workers.get(wid)
            if w is not None:
                self._unheld(dep, w)
                self._out.append(DropData(self._stimulus, wid, (key,)))
            self._files[key] = dep
            self.copy_failed.pop(dep, None)  # they may have failed for want of this source
            if dep in self.replicas:
                self._holder_gone(dep, wid)
        if dep.state == "memory" and not dep.who_has:
            self._output_lost(dep, wid)

    def _replicas_missing(self, ev: ReplicasMissing) -> None:
        """A gather did not find these outputs on ``ev.worker`` (``reached`` false: it
        could not reach it, gone or away, whose replicas then stand): each is needed.
        The manager forgot its word on each: one still in memory is told again at once
        if another worker holds it, connected, else once one does (``unreached``): its
        holder back (it may not be away yet here, the drop's word still on its way, and
        a word now would only send the client back to it, until it gives up), or, on a
        connected worker, on a Tick :data:`UNREACHED_AGAIN` later (back already)."""
        for key in ev.keys:
            ts = self.tasks.get(key)
            if ts is None:
                continue
            ts.delivered = False  # its client asks for it again: it does not have it
            if ev.reached:
                self._not_on(key, ev.worker)  # (the last replica: made again at once)
            elif ts.state == "memory" and ts.wanted and ts.who_has:
                live = [w for w in ts.who_has if w != ev.worker and self.workers[w].away is None]
                if live:
                    self._key_done(ts, min(live))
                else:
                    self.unreached[ts] = (ev.worker, self._now)
            if ts in self.lost_held:  # lost already
                self._recompute(ts)

    def _values_delivered(self, ev: ValuesDelivered) -> None:
        """Gathers gave these outputs' values to clients; but not to the client whose
        gather of one could not reach its holder since (``unreached``): that word was
        sent before, it came after."""
        for key in ev.keys:
            ts = self.tasks.get(key)
            if ts is not None and ts.state == "memory" and ts not in self.unreached:
                ts.delivered = True

    def _key_done(self, ts: TaskState, holder: str) -> None:
        """Tell ``ts``'s clients its output is on ``holder`` (``KeyDone``): a gather
        that could not reach it (``unreached``) waits for this word no more."""
        if self.unreached:
            self.unreached.pop(ts, None)
        self._out.append(KeyDone(self._stimulus, ts.key, holder, ts.nbytes))

    def _tell_unreached(self) -> None:
        """Tell again where each output is that a gather could not reach, noted
        :data:`UNREACHED_AGAIN` ago or more, that a connected worker holds: its holder
        rejoined (``WorkerHeld``) before the gather's ``ReplicasMissing`` came, which
        then found it connected, as it would if its drop's word were still on its way,
        and so waits for a word that already came."""
        due = self._now - UNREACHED_AGAIN
        for ts, (_, since) in list(self.unreached.items()):
            live = [w for w in ts.who_has if self.workers[w].away is None]
            if since <= due and live:
                self._key_done(ts, min(live))

    def _held_again(self, ts: TaskState, ws: WorkerState) -> None:
        """``ws`` holds ``ts``'s output: if it is connected and a gather could not
        reach the output's holder before (``unreached``), its clients are told."""
        if ts in self.unreached and ws.away is None:
            self._key_done(ts, ws.id)

    def _back_to_ready(self, ts: TaskState) -> None:
        """A processing task returns to waiting or queued, by its inputs' states."""
        for d in self._wait_or_queue(ts):
            self._recompute(d)

    def failure_counts(self) -> dict[tuple[str, str, str], int]:
        """Failed tries per (category, outcome, cause) of the categories kept (``failures``
        flattened)."""
        return {(c, o, cause): n for c, counts in self.failures.items()
                for (o, cause), n in counts.items()}  # fmt: skip

    def _failed_try(
        self,
        ts: TaskState,
        outcome: str,
        cause: str,
        error: BaseException | None,
        wid: str,
        record: ErrorRecord | None = None,
        grouped: bool = True,
    ) -> None:
        """Count a failed try by (category, outcome, cause) and keep it as the latest of
        its (category, cause) group (unless not ``grouped``: the caller groups it once
        it knows what followed, :meth:`_group`): O(1), no scan. ``record``: ``error``'s,
        if made already (:meth:`_tried`)."""
        category = ts.spec.category
        counts = self.failures.get(category)
        if counts is None:
            if category not in self.stats:
                self._stat(ts)  # among the categories kept: forgotten with them
            counts = self.failures[category] = Counter()
        counts[(outcome, cause)] += 1
        self.metric_failures[(self._metric_label(category), outcome, cause)] += 1
        if grouped:
            self._group(ts, outcome, cause, error, wid, None, record)

    def _group(
        self,
        ts: TaskState,
        outcome: str,
        cause: str,
        error: BaseException | None,
        wid: str,
        groups: dict[tuple[str, str], FailureGroup] | None = None,
        record: ErrorRecord | None = None,
    ) -> None:
        """Keep a try that did not end ``ok`` as the latest of its (category, cause)
        group in ``groups`` (``failure_groups``, or ``free_groups``), at most
        ``MAX_FAILURE_GROUPS`` groups in each."""
        category = ts.spec.category
        groups = self.failure_groups if groups is None else groups
        group = groups.get((category, cause))
        if group is None:
            if len(groups) >= MAX_FAILURE_GROUPS:
                category, cause = "(other)", "(other)"  # bounded, whatever the causes
                group = groups.get((category, cause))
            if group is None:
                group = groups[(category, cause)] = FailureGroup(
                    0, ts.key, wid, outcome, None, self._now
                )
        group.n += 1
        if ts.failed_in is None:
            ts.failed_in = [group]
            group.tasks += 1
        elif group not in ts.failed_in:  # (a task's groups are few: its causes)
            ts.failed_in.append(group)
            group.tasks += 1
        group.key, group.worker, group.outcome = ts.key, wid, outcome
        if record is None and error is not None:
            record = error_record(error)
        group.error = record
        group.at = self._now

    def _after_failure(
        self,
        ts: TaskState,
        outcome: str,
        cause: str | None,
        error: BaseException | None,
        wid: str,
        loss: WalltimeLoss | None = None,
    ) -> bool:
        """Retry ``ts`` or fail it, as the retry policy decides; ``loss``: how long a
        try lost to its worker's walltime ran against the pool's (``_walltime_lost``).
        Returns whether it was retried free (its ``retries=`` budget untouched)."""
        decision = self._retry_decision(ts, outcome, cause, loss, error)
        looping = False
        if decision.retry and not (decision.charge and ts.retries_left > 0):  # beyond budget
            ts.free_retries += 1
            looping = ts.free_retries > self.config.max_free_retries
        if decision.retry and not looping:
            if ts.ooms and self._no_larger_worker(ts, decision.pool or ts.spec.pool):
                return False  # failed: no worker with more memory is there or can come
            if decision.charge:
                ts.retries_left -= 1
            # This retry's place, not an earlier one's: a retry the policy keeps in
            # place (a resumable one) is not held behind by an earlier try's answer.
            ts.behind = decision.behind and not self._awaited(ts)
            reason = decision.reason
            if isinstance(error, DiskFull) and error.input:  # its output never began
                reason = reason.replace(
                    "output did not fit on disk",
                    f"input {error.input!r} could not be copied to {wid}: no room on its disk",
                )
            elif isinstance(error, DiskFull) and error.partial:  # the file system refused
                reason = reason.replace(
                    "output did not fit on disk",
                    f"the task's writes filled the file system on {wid} (ENOSPC)",
                )
            delay = self._retry_delay(ts, decision.delay)
            if delay:  # held, not ready, until then (_wait_or_queue, _release_retries)
                ts.retry_at = self._now + delay
                heapq.heappush(self.retry_held, (ts.retry_at, next(self._seq), ts))
            if outcome == "error" and error is not None:  # what the try raised
                reason = f"{reason} ({error_line(error)})"
            if delay:
                reason = f"{reason}; retry in {delay:g} s"
            self._log(ts.key, "retry", reason)
            tried_on = self.workers.get(wid)
            if outcome == "timeout" and tried_on is not None and tried_on.held:
                self._log(
                    ts.key, "held",
                    f"its try could not be stopped on {wid} (thread execution, as many "
                    "threads abandoned there as it has): that thread keeps its slot until "
                    "the call returns; the retry goes to a free slot, or waits here for one",
                )  # fmt: skip
            pool = decision.pool
            served = pool is not None and pool != ts.spec.pool and self._serves(ts, pool)
            moved = pool if pool is not None and served else None
            if self.feed_on:
                self._records.append(("retry", ts.key, decision.charge, ts.spec.pool, moved))
            if moved is not None:
                self._log(ts.key, "pool", f"{pool_key(ts.spec.pool)}->{moved}")
                self._repool(ts, dataclasses.replace(ts.spec, pool=moved))
            self._back_to_ready(ts)
            if pool is not None and isinstance(served, str):  # a pool no worker joined yet
                self._no_worker_note(ts, pool, served)
            return not decision.charge
        if looping:
            policy = self.policies["retry"]
            name = str(getattr(policy, "name", type(policy).__name__))
            err: BaseException = RetryPolicyLoop(
                str(ts.key), name, ts.free_retries - 1, len(ts.tries), decision.reason
            )
            err.__cause__ = error
            self._log(ts.key, "retry", f"refused: {ts.free_retries - 1} retries beyond its budget")
        elif outcome == "worker-lost":
            crashes = ts.crashes()
            # It may be what kills them; not when this try waited in the queue (its
            # losses passed max_lost: a WorkerLost).
            charged = not ts.tries or ts.tries[-1].ran != 0.0
            if len(crashes) > 1 and cause not in BENIGN_LOSSES and charged:
                contained = ts.contained_crashes >= len(crashes)
                err = TaskCrashedWorkers(str(ts.key), crashes, contained=contained)
            elif loss is not None and loss.whole_life:
                err = TaskLongerThanWalltime(
                    str(ts.key), wid, loss.pool, loss.ran, loss.walltime, loss.drain, len(ts.tries)
                )
            else:  # which knob to turn: the policy in force and the task's budget say
                policy = self.policies["retry"]
                err = WorkerLost(
                    str(ts.key), wid, cause or "unknown", len(ts.tries),
                    str(getattr(policy, "name", type(policy).__name__)), params_of(policy),
                    ts.retries_left,
                )  # fmt: skip
        else:
            err = error or RuntimeError(f"task {ts.key!r} failed ({outcome})")
            if outcome == "disk-full":
                self.disk_full_failed += 1
        if err is not error and self.feed_on:  # this core's verdict, not its try's error
            self._records.append(("verdict", ts.key, error_record(err)))
        self._fail(ts, err)
        return False

    def _awaited(self, ts: TaskState) -> bool:
        """Some task downstream of ``ts`` waits for it beside outputs already stored
        (held on workers, in memory or on disk, until it comes). A retry of such a task
        (lost with its worker, its output did not fit, ...) is not put behind fresh
        work (docs/policies.md, retry): run last, it would hold those outputs for the
        rest of the run, and a fan-in whose other inputs fill small disks would stall
        every later one (the disk recovery audit, benchmarks/disk_recovery.py)."""
        seen = {ts}
        stack = [ts]
        while stack:
            for d in stack.pop().dependents:
                if d in seen or d.state != "waiting":
                    continue
                if any(x.state == "memory" for x in d.deps):
                    return True
                seen.add(d)
                stack.append(d)
        return False

    def _serves(self, ts: TaskState, pool: str) -> bool | str:
        """Whether a retry policy may move ``ts`` to ``pool``: True for a configured
        pool, or one a worker has joined (now or before). Without configured pools
        (workers started by hand, each in the pool its ``--pool`` names) any pool may be
        joined later: the move is made, and the answer is what to say of the pool in
        the task's story (as a submission naming it is told). With configured pools,
        any other pool (a misspelt name) would keep the task waiting for good, as
        ``check_fallback`` refuses for the default policy's ``fallback``: a policy
        error, and the task stays in its pool (False)."""
        if pool in self.config.pools or pool in self.lives:
            return True
        if any(ws.pool == pool for ws in self.workers.values()):
            return True
        if not self.config.pools:
            return (
                f"pool {pool!r}, which no worker has joined (this manager configures no "
                "pool: the pools are those its workers' --pool name)"
            )
        known = sorted({*self.config.pools, *self.lives, *(w.pool for w in self.workers.values())})
        where = (
            f"which is not configured (pools: {', '.join(known)}"
            f"{did_you_mean(pool, known)}) and which no worker has joined"
        )
        self._policy_error(
            "retry", ts.key,
            f"retry moved the task to pool {pool!r}, {where}: it would wait for good; "
            f"it stays in pool {pool_key(ts.spec.pool)}",
            f"retry moved a task to pool {pool!r}",
        )  # fmt: skip
        return False

    def _fail_dependent(self, ts: TaskState, failed: TaskState) -> None:
        assert failed.root is not None
        root_key, root_err = failed.root[:2]
        ts.root = failed.root
        if failed.state == "cancelled":
            ts.error = CancelledError(str(ts.key), f"dependency {failed.key!r} was cancelled")
            self._set(ts, "cancelled")
        else:
            reason, note, record = self._inherit(failed, root_key, root_err)
            err = DependencyFailed(str(ts.key), str(root_key), reason)
            err.__cause__ = root_err
            ts.error = err
            # Why, in its story and where the dashboard groups failures (as a task not
            # run: no try, so not in the tries' counts): O(1), no scan.
            self._log(ts.key, DEPENDENCY_FAILED, note)
            self._not_run(ts, DEPENDENCY_FAILED, record, failed.key, root_key)
            self._set(ts, "erred")
        self._terminal(ts)

    def _inherit(
        self, failed: TaskState, root_key: Key, root_err: BaseException
    ) -> tuple[str, str, ErrorRecord]:
        """What a dependent of ``failed`` (whose failure came from ``root_key``) says
        of it: the reason (``Type: text``), its story's note and the root's error
        record, made once for all the dependents a failure spreads to in a row."""
        known = self._inherited
        if known is not None and known[0] is failed and known[1] is root_err:
            return known[2], known[3], known[4]
        reason = f"{type(root_err).__name__}: {root_err}"
        note = dependency_failed_text(failed.key, root_key, reason)
        if len(note) > MAX_DEPENDENCY_NOTE:
            note = note[: MAX_DEPENDENCY_NOTE - 3] + "..."
        record = error_record(root_err)
        self._inherited = (failed, root_err, reason, note, record)
        return reason, note, record

    def _not_run(
        self,
        ts: TaskState,
        cause: str,
        record: ErrorRecord,
        dependency: Key | None = None,
        root: Key | None = None,
    ) -> None:
        """Count ``ts``, erring with no failed try of its own, in the
        :class:`NotRunGroup` of its category and ``cause``, and keep it as the latest:
        O(1), no scan (at most ``MAX_FAILURE_GROUPS`` groups, later new ones count
        under category "(other)", by cause)."""
        groups = self.not_run_groups
        category = ts.spec.category
        group = groups.get((category, cause))
        if group is None:
            if len(groups) >= MAX_FAILURE_GROUPS:
                category = "(other)"  # bounded, whatever the categories
                group = groups.get((category, cause))
            if group is None:
                group = groups[(category, cause)] = NotRunGroup(0, ts.key, record, self._now)
        group.n += 1
        group.key, group.error, group.at = ts.key, record, self._now
        group.dependency, group.root = dependency, root
        if self.feed_on:
            self._records.append(("not-run", ts.key, ts.spec.category, cause, record,
                                  dependency, root))  # fmt: skip

    def _fail(self, ts: TaskState, err: BaseException, not_run: ErrorRecord | None = None) -> None:
        """``ts`` fails with ``err``, its own error (the root its dependents name); with
        ``not_run`` (``err``'s record), it failed without a try of its own and counts
        in the not-run groups under ``err``'s type; else its latest try is the one that
        failed, whose worker and number its client is told (``TaskState.root``). Erred,
        with ``err``'s line in its story (an ``erred`` row: :func:`error_line`), then
        the client and its dependents are told (inputs it alone needed are cancelled as
        unneeded)."""
        ts.error = err
        n = len(ts.tries) - ts.first_try  # (this submission's)
        if not_run is None and n > 0:  # a try of its own failed: the latest
            ts.root = (ts.key, err, ts.tries[-1].worker, n, n + ts.retries_left)
        else:
            ts.root = (ts.key, err, "", 0, 0)
        if not_run is not None:
            self._not_run(ts, type(err).__name__, not_run)
        self._set(ts, "erred")
        self._log(ts.key, "erred", error_line(err))  # why, in its story
        self._terminal(ts)

    def _terminal(self, ts: TaskState, *, tell: bool = True) -> None:
        """``ts`` just erred or was cancelled: tell the client (unless not ``tell``:
        told already), fail what depends on it; an erred task counts as erred in the
        failure groups of its failed tries."""
        if ts.failed_in is not None and ts.state == "erred":
            for group in ts.failed_in:
                group.erred += 1
            ts.failed_in = None  # counted: erring again after a resubmission counts anew
        if ts.root is None:
            assert ts.error is not None
            ts.root = (ts.key, ts.error, "", 0, 0)
        if tell:
            self._notify_failed(ts)
        self._to_fail.extend((d, ts) for d in ts.dependents if d.state in ACTIVE)
        self._maybe_forget(ts)

    def _notify_failed(self, ts: TaskState) -> None:
        if not ts.wanted:
            return
        assert ts.error is not None and ts.root is not None
        if ts.state == "cancelled":
            reason = getattr(ts.error, "reason", None) or str(ts.error)
            self._out.append(KeyCancelled(self._stimulus, ts.key, reason))
        else:
            self._out.append(KeyErred(self._stimulus, ts.key, ts.error, *ts.root))

    def _cancel(
        self,
        ts: TaskState,
        reason: str,
        *,
        unneeded: bool = False,
        tell: bool = True,
        cause: str | None = None,
    ) -> None:
        """Cancel ``ts``. ``unneeded``: not asked by a user, only nothing needs it now; it
        is then run again if something comes to need it. ``tell``: the clients that want
        it are told (else they were already, or the cluster's stop tells them).
        ``cause``: its running try's (default ``unneeded`` or ``cancelled``)."""
        if ts.state == "processing":
            if cause is None:
                cause = "unneeded" if unneeded else "cancelled"
            self._unassign(ts, cancel=True, cause=cause)
        ts.unneeded = unneeded
        ts.error = CancelledError(str(ts.key), reason)
        ts.root = (ts.key, ts.error, "", 0, 0)
        self._set(ts, "cancelled")
        self._terminal(ts, tell=tell)

    def _unassign(self, ts: TaskState, *, cancel: bool, cause: str | None = None) -> None:
        """``ts`` no longer runs where it was sent; ``cancel``: tell its worker to stop
        it, and with a ``cause``, record its try as ``cancelled`` (``cause``)."""
        if ts in self.copies:  # the task ends (cancelled, failed): its copies too
            self.speculative["lost"] += len(self.copies[ts])
            self._cancel_copies(ts, "task-ended")
        wid = ts.worker
        ts.worker = None
        ws = self.workers.get(wid) if wid is not None else None
        if ws is not None:
            began = ws.began.get(ts)  # when it began executing there, as the worker said
            self._release_slot(ts, ws)
            if cancel:
                self._cancel_on(ws, ts)
                if cause is not None:
                    rec = TryRecord(
                        str(ts.key), ws.id, ts.sent, self._now, "cancelled", cause, ts.queued
                    )
                    self._tried(ts, rec, None, began=began)

    def _output_lost(self, ts: TaskState, wid: str) -> None:
        """The last replica of ``ts``'s output is gone (last held by ``wid``). Made
        again at once if a task reads it, or a client wants it that was not given its
        value yet (also one whose gather could not reach it: ``unreached``, never
        ``delivered``); one that only clients hold that were given it is made again once
        something needs it (``lost_held``)."""
        self._log(ts.key, "memory", "lost")
        self.copy_failed.pop(ts, None)
        if (ts.consumers or ts.wanted) and self.stopping:
            return  # the run ended: it stays as it ended, finished, held to the end
        if ts.consumers or (ts.wanted and not ts.delivered):
            self._recovered(ts, wid, "recomputed")
            self._recompute(ts)
            return
        self._set(ts, "released")
        if ts.wanted:
            self.lost_held[ts] = wid
            self._log(ts.key, "released", "lost-after-gather: made again when needed")
        else:
            self._maybe_forget(ts)

    def _recompute(self, root: TaskState) -> None:
        """Run ``root`` again from its spec (lineage), and every input it needs that is
        gone (released, or cancelled as unneeded). Its dependents that counted on its
        output go back to waiting. A worklist, not recursion: chains of any length."""
        stack = [root]
        while stack:
            ts = stack.pop()
            if ts.state == "cancelled" and ts.unneeded:
                ts.error = ts.root = None
                ts.unneeded = False
            elif ts.state not in ("memory", "released"):
                continue
            if self.lost_held:
                wid = self.lost_held.pop(ts, None)
                if wid is not None:  # lost while only clients held it: needed now
                    self._recovered(ts, wid, "recomputed")
            # The registry hears it is made again ("pending"): it takes an output
            # "created" after it released one for stale, and would never let it go.
            self._files[ts.key] = ts
            stack.extend(self._wait_or_queue(ts))
            for dep in ts.dependents:
                if dep.state in ("waiting", "queued"):
                    self._recount(dep)

    def _recount(self, ts: TaskState) -> None:
        """Recount a waiting or queued task's missing inputs after one was lost."""
        ts.waiting_on = sum(1 for d in ts.deps if d.state != "memory")
        if ts.waiting_on and ts.state == "queued":
            self._set(ts, "waiting")

    def _maybe_forget(self, ts: TaskState) -> None:
        if ts.wanted or ts.dependents or ts.state not in ("released", "erred", "cancelled"):
            return  # (the loop's first test, before a stack is made: most calls end here)
        stack = [ts]
        while stack:
            t = stack.pop()
            if (
                t.state not in ("released", "erred", "cancelled")
                or t.wanted
                or t.dependents
                or self.tasks.get(t.key) is not t
            ):
                continue
            del self.tasks[t.key]
            if self.lost_held:
                self.lost_held.pop(t, None)
            self._pool_task_gone(pool_key(t.spec.pool))
            self._category_task_gone(t.spec.category)
            if self.disk_measured:
                self.disk_measured.pop(t, None)
            self.forgotten[t.state] += 1
            self._forgotten.append(t.key)
            self._files[t.key] = t
            self.story_log.append((t.key, t.state, "forgotten", self._stimulus, self._now))
            for d in t.deps:
                d.dependents.discard(t)
                stack.append(d)
            for wid in t.who_has:
                w = self.workers.get(wid)
                if w is not None:
                    self._unheld(t, w)

    def _add_replica(self, ts: TaskState, ws: WorkerState) -> None:
        ts.who_has.add(ws.id)
        if ts not in ws.has_what:
            ws.has_what.add(ts)
            self.held_bytes[ws.id] = self.held_bytes.get(ws.id, 0) + ts.nbytes
        self._files[ts.key] = ts
        if self.unreached:
            self._held_again(ts, ws)

    def _unheld(self, ts: TaskState, ws: WorkerState) -> None:
        """``ws`` no longer holds ``ts``'s output (``who_has`` is the caller's)."""
        if ts in ws.has_what:
            ws.has_what.discard(ts)
            self.held_bytes[ws.id] -= ts.nbytes

    # ----------------------------------------------------------------- pruning depth

    def _holds(self, ts: TaskState, done: TaskState | None = None) -> int:
        """What keeps ``ts``'s output, as the file registry's ``consumers``: its own
        ``consumers`` (active readers), else 1 if a task within ``prune_depth`` steps
        downstream of it is still active (found breadth first: the search stops at the
        first), else 0. Depth 0 never lets it go. With ``done`` (an active task): what
        would keep it once ``done`` is done (``_frees``)."""
        consumers = ts.consumers
        if done is not None:
            consumers -= done.deps.count(ts)  # as ``_set`` counts it
        if consumers or self._depth == 1:
            return consumers
        if self._depth == 0:
            return 1
        seen: set[TaskState] = set()
        level = list(ts.dependents)  # none active (but ``done``): the readers, all done
        for _ in range(self._depth - 1):
            below = []
            for t in level:
                for d in t.dependents:
                    if d in seen:
                        continue
                    if d.state in ACTIVE and d is not done:
                        return 1
                    seen.add(d)
                    below.append(d)
            level = below
        return 0

    def _upstream(self, ts: TaskState) -> set[TaskState]:
        """The tasks up to ``prune_depth`` steps upstream of ``ts``: those whose outputs
        ``ts`` being active may keep (``_holds``)."""
        seen: set[TaskState] = set()
        level = ts.deps
        for _ in range(self._depth):
            above = []
            for t in level:
                if t not in seen:
                    seen.add(t)
                    above.extend(t.deps)
            level = above
        return seen

    def _upstream_changed(self, ts: TaskState) -> None:
        """``ts`` became active or stopped being: with ``prune_depth`` > 1 the outputs up
        to that many steps upstream may be kept or dropped now (facts sent again)."""
        files = self._files
        for t in self._upstream(ts):
            files[t.key] = t

    # ----------------------------------------------------------------- replicas

    def _inputs_remake(self, ts: TaskState) -> float:
        """Estimated seconds of work to make ``ts``'s inputs again if its output were
        lost now: those not kept (released, or in memory but neither wanted nor held by
        a task within the pruning depth), each with its own ``remake``."""
        total = 0.0
        for d in ts.deps:
            if d.state != "memory" or not (d.wanted or self._holds(d)):
                total += d.remake
        return total

    def _replication_floor(self) -> None:
        """The replication policy's optional ``min_cost``: below it (the category's
        mean duration plus the inputs' cost) a finished task's output gets no replica
        and the policy is not asked. Not a number >= 0: asked always."""
        floor = getattr(self.policies["replication"], "min_cost", 0.0)
        ok = isinstance(floor, int | float) and not isinstance(floor, bool) and floor >= 0
        self._min_cost = float(floor) if ok else 0.0

    def _replicate(self, ts: TaskState, inputs: float) -> None:
        """Ask the replication policy how many replicas ``ts``'s output (in memory)
        should have, and have the missing ones copied (:class:`Replicate`): at most one
        per other worker, to workers that take new tasks, have memory and disk room for
        it and did not fail a copy of it before; workers of the pools its readers run in
        first, then the one holding the fewest bytes (copies in flight count:
        ``copying``)."""
        workers = len(self.workers)
        try:
            view = TaskStateView(ts, self.survival, self._stats_view)
            policy = self.policies["replication"]
            k = self._ask("replication", policy.replicas, view, inputs, workers)
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise TypeError(f"returned {k!r}, not a whole number >= 0")
        except _OverBudget:
            return
        except Exception as exc:
            self._hook_error(ts.key, f"replication.replicas: {exc!r}", exc)
            return
        inflight = self.copying.get(ts.key, {})
        want = min(k, workers - 1) - (len(ts.who_has) - 1) - len(inflight)
        if want <= 0 or not ts.who_has:
            return
        failed = self.copy_failed.get(ts, ())
        candidates = [
            w
            for w in self.workers.values()
            if _takes_new(w)
            and w.id not in ts.who_has
            and w.id not in inflight
            and w.id not in failed
            and (not w.memory or ts.file or w.memory >= ts.nbytes)
            and w.disk_free() >= ts.nbytes  # a copy may be spilled: never past its disk
        ]
        if not candidates:
            return
        held = self._held_and_coming(candidates)
        source = min(ts.who_has)
        pools = self._reader_pools(ts, source)
        fits = sorted(
            (
                w
                for w in candidates
                if not w.memory or ts.file or held[w.id] + ts.nbytes <= w.memory
            ),
            key=lambda w: (w.pool not in pools, held[w.id], w.id),
        )
        for w in fits[:want]:
            self.copying.setdefault(ts.key, {})[w.id] = ts.nbytes
            self.storage.copy_sent(ts.key, w.id, source, self._now)
            self._log(ts.key, "memory", f"replicate:{source}->{w.id}")
            self._out.append(Replicate(self._stimulus, w.id, source, ((ts.key, ts.nbytes),)))

    def _reader_pools(self, ts: TaskState, source: str) -> set[str]:
        """The pools where ``ts``'s output will be read: those its waiting readers are
        bound to, else (readers of any pool, or none) the pool of the worker holding it."""
        pools = {d.spec.pool for d in ts.dependents if d.state in ACTIVE and d.spec.pool}
        return pools or {self.workers[source].pool}

    def _copies_lost(self, wid: str) -> None:
        """``wid`` is gone: the copies it was making will never land. Forgotten now, so
        a replica to replace its lost outputs is not held back by them (the answer still
        comes, as a failed copy, and retries it elsewhere)."""
        for key in [k for k, targets in self.copying.items() if wid in targets]:
            targets = self.copying[key]
            del targets[wid]
            if not targets:
                del self.copying[key]

    def _replicas_copied(self, ev: ReplicasCopied) -> None:
        """The answer to :class:`Replicate`: a temporary replica the replication policy
        asked for, or (``evacuating``) a copy off a draining worker, an evacuation."""
        ws = self.workers.get(ev.worker)
        got = set(ev.got)
        junk = []
        retry = []
        for key in ev.asked:
            inflight = self.copying.get(key)
            if inflight is not None:
                inflight.pop(ev.worker, None)
                if not inflight:
                    del self.copying[key]
            evacuation = (key, ev.worker) in self.evacuating
            self.evacuating.discard((key, ev.worker))
            source, took = self.storage.copy_ended(key, ev.worker, self._now)
            ts = self.tasks.get(key)
            if key not in got:
                if not evacuation:
                    self.replicas_failed += 1
                if ts is not None and ts.state == "memory":
                    # Tried again elsewhere if still needed (a drained worker's copy:
                    # by ``_retire_idle``, after this event); never on this worker.
                    self.copy_failed.setdefault(ts, set()).add(ev.worker)
                    failed = "evacuation-failed" if evacuation else "replica-failed"
                    self._log(key, "memory", f"{failed}:{ev.worker}")
                    if not evacuation:
                        retry.append(ts)
                continue
            if ws is None:
                continue  # gone, with the copy
            if ts is None or ts.state != "memory":
                junk.append(key)  # released meanwhile: the copy is not needed
                continue
            if ws.id in ts.who_has:
                continue  # it fetched it meanwhile (an input of one of its tasks)
            if evacuation:
                if not (ts.wanted or self._holds(ts)):
                    # Let go meanwhile: the registry drops (or dropped) it where it
                    # knew it to be, without this copy, which is not kept either.
                    junk.append(key)
                    continue
                self._evacuated(ts, source, ws, took)
                self._log(key, "memory", f"evacuated:{ws.id}")
                if ws.keeping is not None and self._keeps(ts, ws.id):
                    ws.keeping.add(ts)  # a draining worker keeps what it gathered
                self._pass_on(ts, ws, self.workers.get(source))
                continue
            self._add_replica(ts, ws)
            self.replicas.setdefault(ts, set()).add(ws.id)
            self.replicas_made += 1
            self.replica_bytes += ts.nbytes
            self._moved("replica", ts.key, ts.nbytes, source, ws.id, took)
            self._log(key, "memory", f"replica:{ws.id}")
        if junk and ws is not None:
            self._out.append(DropData(self._stimulus, ws.id, tuple(junk)))
        for ts in retry:
            if ts.state == "memory" and (ts.wanted or self._holds(ts)):
                self._replicate(ts, self._inputs_remake(ts))

    def _evacuated(self, ts: TaskState, source: str, to: WorkerState, took: float | None) -> None:
        """``ts``'s output was copied off ``source`` (a worker leaving, or draining) to
        ``to``: an evacuation (a transfer of that kind), not a replica. ``to`` holds it
        as any holder does; no replication policy made it, so it is not in
        ``replicas``, nor are its bytes ``replica_bytes``."""
        if to.id not in ts.who_has:
            self._moved("evacuation", ts.key, ts.nbytes, source, to.id, took)
        self._add_replica(ts, to)

    def _moved(
        self, kind: str, key: Key, nbytes: int, source: str, target: str, took: float | None
    ) -> None:
        """``key``'s output was copied from ``source`` to ``target`` (a transfer)."""
        rec = self.storage.transfer(kind, key, nbytes, source, target, took)
        if self.feed_on:
            self._records.append(rec)

    def _recovered(self, ts: TaskState, wid: str, how: str) -> None:
        """``ts``'s output, still needed, was lost with ``wid``: ``how`` it came back."""
        rec = self.storage.recovery(ts.key, ts.spec.category, wid, how)
        if self.feed_on:
            self._records.append(rec)

    def _holder_gone(self, ts: TaskState, wid: str, *, lost: bool = True) -> None:
        """``wid`` no longer holds ``ts``'s output, which has replicas. If ``wid`` was
        lost (not a drained worker that left: ``lost`` false), only replicas hold it now
        and it is still needed, they spared a recompute; a needed output gets new
        replicas to replace the copy that went."""
        copies = self.replicas[ts]
        copies.discard(wid)
        kept = ts.state == "memory" and ts.who_has and not self.stopping  # (stopping: unread)
        if kept and (ts.wanted or self._holds(ts)):
            # Without them it would be made again now if a task or client needs it (an
            # output kept only by the pruning depth would just be released).
            if lost and ts.who_has <= copies and (ts.consumers or ts.wanted):
                self.recomputes_avoided += 1
                self._recovered(ts, wid, "replica")
                self._log(ts.key, "memory", f"kept-by-replica:{min(ts.who_has)}")
            self._replicate(ts, self._inputs_remake(ts))
        if not copies or not ts.who_has:
            del self.replicas[ts]

    # ----------------------------------------------------------------- speculation
    # Speculative copies (docs/files.md#speculative-copies): the policy proposes, the
    # core places a copy only on an idle worker that may run the task, and keeps the
    # first try in ``TaskState.worker`` (``processing``) and the copies in ``copies``.

    def _speculation_bound(self) -> None:
        """The speculation policy's ``max_copies`` (0, or missing: off)."""
        bound = getattr(self.policies["speculation"], "max_copies", 0)
        ok = isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0
        self._max_copies = bound if ok else 0

    def _speculate(self) -> None:
        """Offer each idle worker (not draining, running nothing: after ``_fill`` no
        ready task can go to it) a copy of a task executing elsewhere, the longest
        running first, as the speculation policy proposes. A try runs from when its
        worker says it began to execute (``TasksRunning``), not from when it was sent:
        one waiting in its worker's queue is never copied."""
        # Not to a worker whose pool's tasks_per_worker leaves it one task or none: that
        # one is for a first try (a copy would drain it, and draining cancels copies).
        idle = {
            wid: w
            for wid, w in self.free.items()
            if not w.processing and not w.copies and self.tasks_left(w) > 1
        }
        if not idle:
            return
        now = self._now
        # Running: a try its worker said executes. One sent but waiting in its worker's
        # queue behind others (or fetching its inputs) has not started: no copy of it.
        running = sorted(
            (
                (ts.started, ts.spec.order, str(ts.key), ts)
                for w in self.workers.values()
                for ts in w.processing
                if ts.started is not None
            ),
            key=lambda t: t[:3],
        )
        policy = self.policies["speculation"]
        for started, _, _, ts in running:
            while idle and len(self.copies.get(ts, ())) < self._max_copies:
                view = TaskStateView(ts, self.survival, self._stats_view)
                ran = max(0.0, now - started)
                if not self._ask_yes(ts.key, "speculation.copy", policy.copy, view, ran, len(idle)):
                    break
                first = self.workers[ts.worker] if ts.worker is not None else None
                if first is not None and (why := self._fenced(first)):
                    # (once per fence: the figures in parentheses move every report)
                    self._tell_no_copy(ts, why.split(" (")[0], f"its worker {first.id!r} {why}")
                    break
                copies = self.copies.get(ts, {})
                cands = [
                    w
                    for w in self._candidates(ts)
                    if w.id in idle and w.id != ts.worker and w.id not in copies
                ]
                self._short_of_disk = []
                rise = self._rise_so_far(ts, first)
                roomy = [w for w in cands if not w.memory or w.memory > rise]
                if cands and not roomy:
                    self._tell_no_copy(
                        ts,
                        "rise",
                        f"it raised its worker's RSS by "
                        f"{rise / 2**20:.0f} MiB so far, more than the memory limit of any "
                        "idle worker that could take it",
                    )
                cands = roomy
                if not cands:
                    break
                ws = self._place(ts, cands)
                del idle[ws.id]
                self._start_copy(ts, ws)
            if not idle:
                return

    # ----------------------------------------------------------------- take-back

    def _take_back(self) -> None:
        """Tries queued on a worker behind tries that hold all its threads (it said they
        execute: ``_filled``), sent ``takeback_after`` seconds ago or more, are taken back
        (``CancelOnWorker``, their try recorded ``cancelled``/``moved``) and queued
        again, all of them, while another worker of their pool takes tasks (it is
        free): in the ready queue they go to the first slot that frees, by priority.
        The worker is ``jammed``: it takes no task until a try of it ends. (A hung task
        held a one-core worker while 33 tasks of another batch waited behind it for 7
        minutes; moved only as fast as the busy worker had a core free of tasks, they
        still waited up to 43 s.)"""
        after = self.config.takeback_after
        now = self._now
        if not self.free:
            return
        if self.throttled:
            self._take_back_deferred(after, now)
        # Free workers per pool, counted once (not per worker: a tick with many workers
        # scanned them all for each), again only after a take-back changed them.
        free_in = Counter(w.pool for w in self.free.values())
        for ws in list(self.workers.values()):
            if len(ws.processing) + len(ws.copies) <= ws.cores:
                continue
            if free_in[ws.pool] - (ws.id in self.free) <= 0:
                continue  # no free worker of its pool, or only itself
            # Its threads all run tries it said execute (as ``_filled``, from the few
            # that began); the others wait, the first sent first: no scan of them all.
            copies = sum((ts, ws.id) in self.copy_started for ts in ws.copies)
            if len(ws.began) + copies < ws.cores:
                continue
            waiting = []
            for ts in ws.waiting:
                if now - ts.sent < after:
                    break
                waiting.append(ts)
            for ts in sorted(waiting, key=_prio_key):
                ws.jammed.add(ts.key)
                self._log(ts.key, "processing", f"taken-back:{ws.id}")
                self._unassign(ts, cancel=True, cause="moved")
                self._wait_or_queue(ts)
            if waiting:
                self._update_free(ws)
                free_in = Counter(w.pool for w in self.free.values())

    def _take_back_deferred(self, after: float, now: float) -> None:
        """Producers sent to a throttled worker ``takeback_after`` seconds ago or more
        and not executing there (deferred by its memory governor) are taken back and
        queued again, while a worker of their pool that is not throttled is free: a
        throttled worker gets no producer, so from the queue they go to it. (A worker
        holding a client's 500 MB output with spilling off kept a producer deferred for
        ever, throttled, while its peer idled: no error, since the memory watchdog
        needs every worker of the pool throttled.) Not ``jammed``: the worker's
        consumers are what frees its memory, and the throttle keeps producers away.
        Only while such a free worker did not defer it before, or holds fewer bytes of
        outputs than it did then (:meth:`_deferred_by`): else it stays, and its story
        says why (:meth:`_tell_kept_deferred`). (Spilling off, two
        workers holding outputs and a producer fitting neither: it went from one to the
        other every ``takeback_after`` for ever, each throttling in turn.)"""
        free_in: dict[str, list[WorkerState]] = {}
        for w in self.free.values():
            if not w.throttled:
                free_in.setdefault(w.pool, []).append(w)
        for wid in list(self.throttled):
            ws = self.workers.get(wid)
            if ws is None or ws.pool not in free_in:
                continue
            stuck = [t for t in ws.waiting if t.producer and now - t.sent >= after]
            for ts in sorted(stuck, key=_prio_key):
                if all(self._deferred_by(ts, w) for w in free_in[ws.pool]):
                    self._tell_kept_deferred(ts, ws)
                    continue
                ts.deferred_by[ws.id] = self.held_bytes.get(ws.id, 0)
                self._log(ts.key, "processing", f"taken-back:{ws.id} (throttled)")
                self._unassign(ts, cancel=True, cause="moved")
                self._wait_or_queue(ts)

    def _deferred_by(self, ts: TaskState, ws: WorkerState) -> bool:
        """``ws`` deferred ``ts`` before (it was taken back from it) and holds as many
        bytes of outputs as it did then, or more: it would defer it again. One that let
        outputs go since has more room: a producer kept deferred elsewhere may go to it
        (else it waited for ever on a worker whose memory never fell, beside one whose
        did)."""
        held = ts.deferred_by.get(ws.id)
        return held is not None and self.held_bytes.get(ws.id, 0) >= held

    def _tell_kept_deferred(self, ts: TaskState, ws: WorkerState) -> None:
        """Say in ``ts``'s story, once per worker, that it stays deferred on the
        throttled ``ws``: every free worker of its pool deferred it before."""
        if ts.kept_on == ws.id:
            return
        ts.kept_on = ws.id
        self._log(
            ts.key, "processing",
            f"deferred on {ws.id} (throttled), not taken back again: every free worker of "
            f"its pool deferred it before ({', '.join(ts.deferred_by)}), its expected "
            "output fitting under none of their memory fences beside what they hold; it "
            "waits for memory to fall there, or for one of them to let outputs go. To go "
            "on: release the results you no longer "
            "need, turn spilling on, or give the workers more memory (memory_per_worker, "
            "--memory)",
        )  # fmt: skip

    @staticmethod
    def _fenced(ws: WorkerState) -> str:
        """Why a task running on ``ws`` gets no speculative copy: ``ws`` is throttled,
        or its RSS as last told is at or past its terminate fence (the one it told, else
        ``TERMINATE`` of its memory limit: :func:`terminate_fence`). Such a task is slow
        because of its worker's memory, and a copy would take as much on another worker
        ("": neither)."""
        of = f"({ws.rss / 2**20:.0f} MiB of its {ws.memory / 2**20:.0f} MiB limit)"
        if ws.memory and ws.rss >= terminate_fence(ws):
            return f"is past its terminate fence {of}"
        if ws.throttled:
            return f"is throttled {of}"
        return ""

    @staticmethod
    def _rise_so_far(ts: TaskState, ws: WorkerState | None) -> int:
        """What ``ts``'s running try on ``ws`` has raised its worker's RSS by, as far as
        this core knows: the rise of ``ws``'s RSS since the try began to execute, while
        it runs alone there (with other tries beside it, the rise may be theirs: 0)."""
        if ws is None or ws.copies or len(ws.processing) != 1:
            return 0
        return max(0, ws.rss - ts.rss_began)

    def _tell_no_copy(self, ts: TaskState, reason: str, why: str) -> None:
        """Say in ``ts``'s story why its running try gets no speculative copy
        (``why``), once per try and ``reason``."""
        if ts.copy_said != reason:
            ts.copy_said = reason
            self._log(ts.key, "processing", f"no speculative copy: {why}")

    def _start_copy(self, ts: TaskState, ws: WorkerState) -> None:
        need = 0
        if ws.disk:  # reserved as for a first try
            need = self._fetch_bytes(ts, ws) + self._expected_output(ts)[0]
            ws.disk_reserved += need
        copies = self.copies.setdefault(ts, {})
        copies[ws.id] = (self._now, need, 0)
        ws.copies.add(ts)
        self._update_free(ws)
        self.speculative["started"] += 1
        self._log(ts.key, "processing", f"speculative-copy:{ws.id}")
        copies[ws.id] = (self._now, need, self._send(ts, ws))

    def _end_copy(
        self,
        ts: TaskState,
        ws: WorkerState,
        outcome: Outcome,
        cause: str | None,
        *,
        cancel: bool = False,
        record: bool = True,
        ended: float | None = None,
    ) -> None:
        """The copy of ``ts`` on ``ws`` ends (``ended``; None: now): its slot and disk are
        free again; its try is recorded as ``outcome`` (``cause``); ``cancel``: tell the
        worker to stop it."""
        copies = self.copies[ts]
        sent, need, _ = copies.pop(ws.id)
        if not copies:
            del self.copies[ts]
        # when its worker said it began (None: not known to have begun)
        began = self.copy_started.pop((ts, ws.id), None) if self.copy_started else None
        ws.copies.discard(ts)
        ws.disk_reserved -= need
        self._update_free(ws)
        if cancel and ws.id in self.workers:
            self._cancel_on(ws, ts)
        if record:
            stop = self._now if ended is None else max(ended, sent)
            rec = TryRecord(str(ts.key), ws.id, sent, stop, outcome, cause)
            self._tried(ts, rec, None, began=began)

    def _cancel_copies(self, ts: TaskState, cause: str) -> None:
        for wid in sorted(self.copies.get(ts, ())):
            self._log(ts.key, "processing", f"copy-cancelled:{wid}:{cause}")
            self._end_copy(ts, self.workers[wid], "cancelled", cause, cancel=True)

    def _copies_off(self, ws: WorkerState, cause: str) -> None:
        """``ws`` takes no new work any more: the copies it runs are cancelled (each is
        a spare; the first try runs on)."""
        for ts in sorted(ws.copies, key=_prio_key):
            self.speculative["lost"] += 1
            self._log(ts.key, "processing", f"copy-cancelled:{ws.id}:{cause}")
            self._end_copy(ts, ws, "cancelled", cause, cancel=True)

    def _promote_copy(self, ts: TaskState) -> bool:
        """``ts``'s running try ended without an output (its slot released already):
        if a copy runs, the oldest one becomes its try, and nothing is retried."""
        copies = self.copies.get(ts)
        if not copies:
            return False
        wid = min(copies, key=lambda w: (copies[w][0], w))
        ws = self.workers[wid]
        sent, need, attempt = copies[wid]
        ts.started = self.copy_started.get((ts, wid))  # (None: not known to run yet)
        ts.rss_began = ws.rss  # its rise so far is counted from now on
        ts.copy_said = ""
        self._end_copy(ts, ws, "ok", None, record=False)
        ws.disk_reserved += need  # moves with it: now the try's own reservation
        ts.worker = wid
        ts.sent = sent
        ts.queued = None  # a copy: it did not wait in the queue (its task's try did)
        ts.attempt = attempt
        ts.disk_need = need
        ts.est = self._estimate(ts)
        ws.occupancy += ts.est
        ws.processing.add(ts)
        if ts.started is None:
            ws.waiting[ts] = None
        else:
            ws.began[ts] = ts.started
        ws.n_producers += ts.producer
        self._update_free(ws)
        self._log(ts.key, "processing", f"copy-runs-on:{wid}")
        return True

    def _copy_finished(self, ts: TaskState, ws: WorkerState, res: TaskResult) -> None:
        """A speculative copy of ``ts`` ended on ``ws`` while its first try runs."""
        if res.outcome == "ok":  # it won: the first try (and other copies) are cancelled
            self.speculative["won"] += 1
            copy_sent = self.copies[ts][ws.id][0]
            self._end_copy(ts, ws, "ok", None, record=False)
            if ts in self.copies:
                self.speculative["lost"] += len(self.copies[ts])
                self._cancel_copies(ts, "superseded")
            first = self.workers.get(ts.worker) if ts.worker is not None else None
            if first is not None:
                self._log(ts.key, "processing", f"superseded:{first.id}")
                rec = TryRecord(str(ts.key), first.id, ts.sent, self._now, "cancelled",
                                "superseded", ts.queued)  # fmt: skip
                self._tried(ts, rec, None, began=first.began.get(ts))
            self._unassign(ts, cancel=True)  # cancels the other copies too
            ts.sent = copy_sent  # the winning try's own, as its record says
            ts.queued = None  # a copy's: no wait of its own
            self._finished_ok(ts, ws, res, "speculative")
            return
        self.speculative["failed"] += 1
        if res.outcome == "missing":  # it did not start: the first try runs on
            for dk, wid in res.missing:
                self._not_on(dk, wid)
            self._end_copy(ts, ws, "cancelled", "inputs-missing")
        elif res.outcome == "cancelled":
            self._end_copy(ts, ws, "cancelled", "speculative")
        else:
            self._end_copy(ts, ws, "cancelled", None, record=False)
            self._try_failed(ts, ws, res, "speculative")

    # ----------------------------------------------------------------- scheduling

    def _fill(self) -> None:
        """Give ready tasks to workers with free slots, best priority first.

        The heads of the heaps compete; under memory pressure (when the memory policy
        yields) a producer head ranks after every consumer head; then a retry queued behind
        fresh work after the rest, then the user's ``priority=``; among equals a head of a
        pool ranks before a head of no pool (a free worker runs its own pool's ready
        tasks before those any pool may run; never over a higher ``priority=``, which
        would starve a task of no pool behind a pool's stream), and a task of no pool
        goes to a worker whose pool has no ready task of its own first (``_own_first``),
        never to one of a reserved pool (``SchedulerConfig.reserved_pools``)."""
        parked: list[tuple[tuple[str | None, bool], tuple[Any, ...]]] = []
        yields = self._yields()
        reserved = self.config.reserved_pools
        pooled = any(q[0] is not None for q in self.queues)  # a pool has a heap: _own_first
        if self.disk_parked:  # (no new set per fill: this runs after every event)
            self.disk_parked.clear()
        if self._past_picks:
            self._past_picks.clear()
        if self.disk_held:
            self.disk_held.clear()
        held = self._rise_held
        if held:
            held.clear()
        while True:
            best: tuple[Any, ...] | None = None
            best_q: tuple[str | None, bool] = (None, False)
            best_holder: WorkerState | bool | None = False  # False: not asked yet
            for q, heap in self.queues.items():
                while heap and not _live(heap[0], q[1]):
                    heapq.heappop(heap)  # stale (cancelled, failed, re-queued, flipped)
                if not heap:
                    continue
                pool, producer = q
                head = heap[0]  # (behind, prio, seq, ts): _enqueue
                rank = (producer and yields, head[0], -head[3].spec.priority, pool is None, head)
                if best is not None and rank >= best:
                    continue
                no_free_worker = not self.free or (
                    (pool is not None or producer or reserved)
                    and not any(
                        self._runs_on(pool, w) and (not producer or self._takes_producer(w))
                        for w in self.free.values()
                    )
                )
                if not no_free_worker and self._long(heap[0][3]):
                    # A long (or unknown) head waits here for a core free of tasks, not
                    # on a busy worker; what is behind it waits too (no overtaking it).
                    no_free_worker = self._no_core_for(pool, producer)
                # With no free worker for it, a consumer may still join its data.
                holder: WorkerState | bool | None = False
                if no_free_worker:
                    if producer:
                        continue
                    holder = self._data_holder(heap[0][3], alone=True)
                    if holder is None:
                        continue
                best, best_q, best_holder = rank, q, holder
            if best is None:
                break
            entry = heapq.heappop(self.queues[best_q])
            ts: TaskState = entry[3]
            if held and (ts.spec.category, ts.spec.pool) in held:
                # Another of its category found no room and nothing was placed since:
                # the same answer (thousands of held bursts cost one look per fill).
                if not ts.wait_said:
                    self._tell_rss_wait(ts, self._rise(ts))
                parked.append((best_q, entry))
                continue
            candidates = self._candidates(ts)
            if pooled and ts.spec.pool is None and len(candidates) > 1:
                candidates = self._own_first(candidates, parked)
            # Asked in the scan already (nothing changed since), or asked now (_data_holder's
            # first test inline: a producer, a task without inputs, no hook: none).
            if best_holder is not False:
                holder = best_holder
            elif ts.producer or not ts.deps or self._holder is None:
                holder = None
            else:
                holder = self._data_holder(ts, alone=not candidates)
            if isinstance(holder, WorkerState):
                candidates.append(holder)  # busy, but it has every input
            if not candidates:
                if self._short_of_disk:
                    if not self._waits_for_disk(ts, self._short_of_disk):
                        continue  # no worker could ever hold it: failed
                    self.disk_parked.add(ts.spec.pool)
                elif ts.ooms and not ts.wait_said:
                    self._tell_oom_wait(ts)
                elif ts.spec.resources and not ts.wait_said:
                    self._tell_resources_wait(ts)
                elif rise := self._rise(ts):
                    if not ts.ooms and not ts.spec.resources:
                        held.add((ts.spec.category, ts.spec.pool))
                    if not ts.wait_said:
                        self._tell_rss_wait(ts, rise)
                parked.append((best_q, entry))  # resources or disk: wait for a worker
                continue
            ws = self._place(ts, candidates)
            self._assign(ts, ws)
            if held:
                held.clear()  # a worker's room changed: ask again
            if ts.producer and not ts.deps and self._partner is not None:
                self._assign_partner(ts, ws, self.queues[best_q])
        for q, entry in parked:
            heapq.heappush(self.queues[q], entry)

    def _own_first(
        self,
        candidates: list[WorkerState],
        parked: list[tuple[tuple[str | None, bool], tuple[Any, ...]]],
    ) -> list[WorkerState]:
        """Of the free workers that may take a task of no pool, those whose pool has no
        ready task of its own (in its heaps, or parked in this fill: they wait for a
        worker of the pool), if there are any: the others are kept for their pool's
        tasks (a scarce pool's worker is not taken by work any worker may run)."""
        waiting = {q[0] for q, heap in self.queues.items() if heap and q[0] is not None}
        waiting.update(q[0] for q, _ in parked if q[0] is not None)
        if not waiting:
            return candidates
        free = [w for w in candidates if w.pool not in waiting]
        return free or candidates

    def _any_pool_workers(self) -> dict[str, WorkerState]:
        """The workers that may run tasks of no pool (``_runs_on(None, w)``): every
        worker but those of a reserved pool (``SchedulerConfig.reserved_pools``)."""
        if not self.config.reserved_pools:
            return self.workers
        return {w.id: w for w in self.workers.values() if self._runs_on(None, w)}

    def _rise(self, ts: TaskState) -> int:
        """How much ``ts`` is expected to raise its worker's RSS while it runs: its
        category's ``rss_rise``, the largest of its latest ``RISE_WINDOW`` rises (0: no
        try of it finished yet, or under ``MIN_RISE``: not known to matter)."""
        stat = self.stats.get(ts.spec.category)
        rise = stat.rss_rise if stat is not None else 0
        return rise if rise >= MIN_RISE else 0

    def _rss_fits(self, rise: int, ws: WorkerState) -> bool:
        """Memory admission by RSS rise (docs/memory.md): a task expected to raise its
        worker's RSS by ``rise`` starts on ``ws`` only if the RSS ``ws`` last told, plus
        the rises of the tries that may run beside it there (the largest of its
        ``processing``, at most ``cores - 1`` of them, counted whole: the RSS may hold
        part of them already), plus ``rise``, stays under its terminate fence. Else it
        waits, or goes to another worker. A worker with nothing to run beside it (none
        sent, or one core) always takes it: a task larger than the limit ends as
        before (killed for memory, ``TaskOutOfMemory``), and nothing deadlocks."""
        beside = min(len(ws.processing), int(ws.cores) - 1)
        if beside <= 0 or not ws.memory:
            return True
        fence = terminate_fence(ws)
        if ws.rss + beside * self.max_rise + rise < fence:
            return True  # whatever runs beside it: no need to look (O(1))
        rises = heapq.nlargest(beside, map(self._rise, ws.processing))
        return ws.rss + sum(rises) + rise < fence

    def _recount_max_rise(self) -> None:
        """``max_rise`` again from every category's ``rss_rise`` (one's largest rise left
        its window, or was forgotten): O(categories), only then."""
        self.max_rise = max((st.rss_rise for st in self.stats.values()), default=0)

    def _tell_rss_wait(self, ts: TaskState, rise: int) -> None:
        """Say in ``ts``'s story, once per wait, that memory admission holds it back:
        its RSS rise does not fit beside the tries running on the workers free now."""
        ts.wait_said = why = (
            f"waiting: its category raised a worker's RSS by up to {rise / 2**20:.0f} MiB, "
            "more than fits under the terminate fence beside the tries running on the "
            "workers free for it; it starts once some of them end"
        )
        self._log(ts.key, "admission", why)

    def _tell_oom_wait(self, ts: TaskState) -> None:
        """Say in ``ts``'s story, once per wait, that it waits for a worker with a
        larger memory limit than those it was killed for memory under."""
        wid, limit, _ = ts.ooms[-1]
        ts.wait_said = why = (
            f"waiting for a worker with a memory limit {ts.oom_need}: killed for memory "
            f"on {wid!r} ({ts.oom_size(limit)}), it runs again only on a "
            + ("larger one" if ts.oom_strict else "worker at least as large")
        )
        self._log(ts.key, "queued", why)

    def _tell_resources_wait(self, ts: TaskState) -> None:
        """Say in ``ts``'s story, once, that no worker of its pool that takes tasks
        (not draining) has the cores or memory it asks for (a bigger one may join: it
        waits, and the queue-time alert fires if none does), and when no configured
        pool it may run in has workers with enough, that no block is started for it
        (:meth:`_no_block_for`). Nothing when one has them (it is busy), or when none
        has joined and a configured pool's blocks could run it. Reads ``largest`` and
        ``largest_cores``."""
        pool, res = ts.spec.pool, ts.spec.resources
        most_memory = self.largest.get(pool)
        if most_memory is None:  # no worker of its pool takes tasks
            if nowhere := self._no_block_for(ts):
                ts.wait_said = why = f"waiting for a worker with enough: {nowhere}"
                self._log(ts.key, "queued", why)
            return
        most_cores = self.largest_cores[pool]
        short = []
        cores, memory = res.get("cores", 0), res.get("memory", 0)
        if cores > most_cores:
            plural = "s" if most_cores != 1 else ""
            short.append((f"{cores:g} cores", f"{most_cores:g} core{plural}"))
        if memory > most_memory:
            short.append((f"{int(memory):,} B of memory", f"{int(most_memory):,} B"))
        if short:
            where = "worker" if pool is None else f"worker of pool {pool!r}"
            nowhere = self._no_block_for(ts)
            ts.wait_said = why = (
                f"waiting for a worker with {' and '.join(a for a, _ in short)}: every "
                f"{where} has less (at most {' and '.join(b for _, b in short)}); it runs "
                "once one with enough joins" + (f"; {nowhere}" if nowhere else "")
            )
            self._log(ts.key, "queued", why)

    def _no_block_for(self, ts: TaskState) -> str:
        """Why no block is started for ``ts`` when every configured pool it may run in
        has workers with fewer cores or less memory than it asks (:meth:`unfit_pools`:
        the autoscaler counts it out of their demand), with what to do; "" when one of
        them could run it, or none is configured."""
        cfg, pool, res = self.config, ts.spec.pool, ts.spec.resources
        if not self._no_pool_fits(pool, res):
            return ""
        unfit = self.unfit_pools(pool, res)
        parts = []
        for p in unfit:  # what each has of what ``ts`` asks for
            cores, memory = cfg.pool_cores[p], cfg.pool_memory.get(p)
            has = [f"{cores:g} core{'s' if cores != 1 else ''}"] if "cores" in res else []
            if "memory" in res and memory is not None:
                has.append(f"{memory:,} B of memory")
            if "disk" in res and (space := cfg.pool_disk.get(p)) is not None:
                has.append(f"{space:,} B of disk")
            parts.append(f"{p!r}: {' and '.join(has)}")
        disk = ", disk_per_worker" if any(p in cfg.pool_disk for p in unfit) else ""
        return (
            f"no configured pool it may run in has workers with enough ({'; '.join(parts)}), so no "
            "block is started or kept for it; give it a pool whose workers have enough "
            f"(pool=), raise that pool's cores_per_worker or memory_per_worker{disk}, or "
            "start a worker with enough by hand"
        )

    def _candidates(self, ts: TaskState) -> list[WorkerState]:
        pool = ts.spec.pool
        res = ts.spec.resources
        mem = res.get("memory", 0)
        cores = res.get("cores", 0)
        producer = ts.producer
        need = ts.in_nbytes  # memory admission: its inputs fit under the limit (0: none)
        rise = self._rise(ts)  # ... and its RSS rise beside the tries running there
        cands = [
            w
            for w in self.free.values()
            if self._runs_on(pool, w)
            and w.memory >= mem
            and w.cores >= cores
            and (w.memory >= need or not w.memory)
            and (not producer or self._takes_producer(w))
            and (not ts.ooms or self._roomier(ts, w))
            and (not rise or self._rss_fits(rise, w))
        ]
        if cands and self._long(ts):
            # A long task: not queued behind another on its worker (SchedulerConfig).
            cands = [w for w in cands if _core_free(w)]
        if len(cands) > 1 and ts.spec.timeout is not None:
            # A try with a timeout goes where it can be stopped at its timeout if it
            # can: a worker with as many threads abandoned as it has threads (thread
            # execution) could not give that try's slot back.
            stoppable = [w for w in cands if w.abandoned < w.cores]
            if stoppable:
                cands = stoppable
        if self._short_of_disk:  # (an empty one stays: no list made per call)
            self._short_of_disk = []
        past = tried = relaxed = False
        some_disk = False
        for w in cands:
            if w.disk:
                some_disk = True
                break
        if some_disk:
            out, source = self._expected_output(ts)
            # A producer keeps room for its consumer's output beside its own: disks
            # filled with producers' outputs leave their consumers no room to run.
            keep = self._consumer_room(ts, out) if producer else 0
            fits = [w for w in cands if self._disk_fits(ts, w, out + keep)]
            if fits and producer and self.disk_held:
                kept = [w for w in fits if w.id not in self.disk_held or not (
                    out or self._fetch_bytes(ts, w))]  # fmt: skip
                if not kept:
                    self._tell_disk_held(ts, fits)
                    return []
                fits = kept
            if fits:
                self.disk_override.discard(pool)  # room again: the estimates rule
            elif pool in self.disk_override and (pick := self._past_pick(ts, cands)):
                fits, past = [pick], True
            elif (
                keep
                and pool in self.disk_last_resort
                and not self._pool_runs(pool)
                and (roomy := self._roomy(ts, cands, out))
            ):
                # Nothing runs and nothing can be dropped: the room a producer keeps for
                # its consumer's output is a preference, not a need. Its own output (firm
                # or not) fits an idle worker: it runs there, the most disk left first
                # (one producer at a time: while one runs, the others wait for the next
                # stall).
                fits, past, relaxed = [self._most_disk_left(ts, roomy, out)], True, True
            elif (
                pool in self.disk_last_resort
                and source not in FIRM_OUTPUTS  # a firm need is never tried where too big
                and any(not w.processing for w in cands)
            ):
                fits, past = [self._most_disk_left(ts, cands, out)], True
            elif source not in FIRM_OUTPUTS and self._least_need(ts, out)[0] is not None:
                # An estimate no worker of its pool could hold even with its disk empty
                # says nothing of where the task fits: only its inputs are firm. It is
                # tried where they fit, on the worker with the most disk left after them.
                fits = [w for w in cands if self._disk_fits(ts, w, 0)]
                tried = bool(fits)
                if not tried:
                    self._short_of_disk = cands
            else:
                self._short_of_disk = cands
            cands = fits
        if self.deadlines and cands:
            cands = self._long_enough(ts, cands)
        if tried and cands:
            ws = self._most_disk_left(ts, cands, 0, idle=False)
            cands = [ws]
            why = (
                f"past its disk estimate on {ws.id} (needs {self._fetch_bytes(ts, ws) + out}"
                f" B, {max(0, int(ws.disk_free()))} B free): no worker of its pool could hold"
                f" its expected output ({out} B, {source}), so it is tried where the most "
                "disk is free"
            )
            if why != ts.wait_said:  # once (a running task's copies ask again and again)
                ts.wait_said = why
                self._log(ts.key, "queued", why)
        if relaxed and cands:
            ws = cands[0]
            self._log(
                ts.key, "queued",
                f"without the room kept for its consumer's output on {ws.id} (needs "
                f"{self._fetch_bytes(ts, ws) + out} B, {max(0, int(ws.disk_free()))} B "
                "free): every worker of its pool ran nothing and no stored output could be "
                "dropped, so waiting would not make that room",
            )  # fmt: skip
        elif past and cands:
            ws = cands[0]
            frees = self._frees(ts, ws)
            self._log(
                ts.key, "queued",
                f"past its disk estimate on {ws.id} (needs {self._fetch_bytes(ts, ws) + out}"
                f" B, {max(0, int(ws.disk_free()))} B free): every worker of its pool ran "
                "nothing, so waiting would not make room; "
                + (
                    f"its run frees {frees} B of inputs there"
                    if frees
                    else "no stored output could be dropped to make room, so it is tried"
                ),
            )  # fmt: skip
        return cands

    # The data-locality rules. The placement policy's hooks (policies.DataLocality)
    # propose; these decide where a proposal is allowed, ask only then, and check the
    # answer. A hook that raises or answers out of bounds is a policy error: no move.

    def _locality_hooks(self) -> None:
        policy = self.policies["placement"]
        self._partner = getattr(policy, "partner", None)
        self._stays = getattr(policy, "stays_with_data", None)
        self._holder = getattr(policy, "data_holder", None)

    def _hook_error(self, key: Key, problem: str, exc: BaseException | None = None) -> None:
        """A policy error of a hook: ``problem`` begins with ``kind.hook``; ``exc``: what
        it raised (two raises of one type are the same problem, for the log)."""
        hook = problem.split(" ", 1)[0].rstrip(":")
        same = _raised(hook, exc) if exc is not None else hook
        self._policy_error(hook.split(".", 1)[0], key, problem, same)

    def _ask_yes(self, key: Key, name: str, hook: Callable[..., Any], *args: Any) -> bool:
        """Ask a policy's yes-or-no ``hook`` (``name``, for the story) about ``key``:
        True only if it answers True; an answer not a bool, or a raise, is a policy
        error and counts as no."""
        try:
            answer = self._ask(name.split(".")[0], hook, *args)
        except _OverBudget:
            return False
        except Exception as exc:
            self._hook_error(key, f"{name} raised {exc!r}", exc)
            return False
        if answer is True or answer is False:
            return answer
        self._hook_error(key, f"{name} returned {answer!r}, not a bool")
        return False

    def _assign_partner(self, ts: TaskState, ws: WorkerState, heap: list[tuple[Any, ...]]) -> None:
        """Root producer ``ts`` just went to ``ws``: ask the placement policy whether the
        root next in line goes with it (``partner``), one task past the worker's slots
        at most, if ``ws`` may take it (not throttled or draining, under its limit,
        resources)."""
        while heap and not _live(heap[0], True):
            heapq.heappop(heap)
        if not heap:
            return
        nxt: TaskState = heap[0][3]
        if (
            nxt.deps
            or not nxt.producer
            or ws.throttled
            or not _takes_new(ws)
            or ws.id not in self.workers
            or len(ws.processing) + ws.held > ws.slots
            or len(ws.processing) + ws.held >= ws.limit
            or _cores_held(ws) >= ws.cores
            or (not _core_free(ws) and self._long(nxt))
        ):
            return
        res = nxt.spec.resources
        if ws.memory < res.get("memory", 0) or ws.cores < res.get("cores", 0):
            return
        if nxt.ooms and not self._roomier(nxt, ws):
            return
        rise = self._rise(nxt)
        if rise and not self._rss_fits(rise, ws):
            return
        out = self._expected_output(nxt)[0]
        if ws.disk and not self._disk_fits(nxt, ws, out + self._consumer_room(nxt, out)):
            return
        views = (TaskStateView(ts), ws.view, TaskStateView(nxt))
        if not self._ask_yes(nxt.key, "placement.partner", self._partner, *views):
            return
        heapq.heappop(heap)
        self._assign(nxt, ws)

    def _may_stay(self, ts: TaskState, ws: WorkerState) -> bool:
        """Consumer ``ts`` may run on ``ws`` past its slots: ``ws`` is known, not
        draining, under its limit, allows ``ts`` (pool, resources, memory admission)
        and holds every input of it; a long ``ts`` (``_long``) only with a core free."""
        return (
            _takes_new(ws)
            and ws.id in self.workers
            and len(ws.processing) + ws.held < ws.limit
            and _cores_held(ws) < ws.cores
            and (_core_free(ws) or not self._long(ts))
            and self._takes_consumer_here(ts, ws)
            and all(ws.id in d.who_has for d in ts.deps)
        )

    def _stays_with_its_data(self, ts: TaskState, ws: WorkerState) -> bool:
        """Consumer ``ts`` just became ready on ``ws``'s result, or ``ws`` holding its
        inputs is the only worker it could go to now: where it may stay (``_may_stay``),
        the placement policy's ``stays_with_data`` says whether it runs there now (the
        default: up to twice its slots; no hook: no)."""
        stays = self._stays
        if stays is None or ts.producer or not ts.deps or not self._may_stay(ts, ws):
            return False
        return self._ask_yes(ts.key, "placement.stays_with_data", stays, TaskStateView(ts), ws.view)

    def _takes_consumer_here(self, ts: TaskState, ws: WorkerState) -> bool:
        """Pool, resources and memory admission allow ``ts`` on ``ws``."""
        if not self._runs_on(ts.spec.pool, ws):
            return False
        if ws.memory and ws.memory < ts.in_nbytes:
            return False
        if ts.ooms and not self._roomier(ts, ws):
            return False
        res = ts.spec.resources
        if ws.memory < res.get("memory", 0) or ws.cores < res.get("cores", 0):
            return False
        rise = self._rise(ts)
        if rise and not self._rss_fits(rise, ws):
            return False
        return not ws.disk or self._disk_fits(ts, ws, self._expected_output(ts)[0])

    def _data_holder(self, ts: TaskState, alone: bool = False) -> WorkerState | None:
        """A busy worker (not free) holding every input of consumer ``ts`` that may
        take it past its slots (``_may_stay``), as the placement policy's
        ``data_holder`` prefers among them; ``None`` if there is none. It only becomes
        a candidate: ``choose`` weighs its load against moving the inputs.

        ``alone``: no other worker is a candidate, so nothing weighs its load: the
        holder chosen runs ``ts`` past its slots only as a consumer that stays with its
        data would (``_stays_with_its_data``, the default twice its slots). Otherwise,
        while the others are busy, every queued consumer of a fan-out would go to it at
        once."""
        if ts.producer or not ts.deps or self._holder is None:
            return None
        common = set(ts.deps[0].who_has)
        for d in ts.deps[1:]:
            common &= d.who_has
            if not common:
                return None
        holders = []
        for wid in sorted(common):
            ws = self.workers.get(wid)
            if ws is not None and wid not in self.free and self._may_stay(ts, ws):
                holders.append(ws)
        if not holders:
            return None
        try:
            answer = self._ask(
                "placement", self._holder, TaskStateView(ts), tuple(w.view for w in holders)
            )
        except _OverBudget:
            return None
        except Exception as exc:
            self._hook_error(ts.key, f"placement.data_holder raised {exc!r}", exc)
            return None
        if answer is None:
            return None
        wid = getattr(answer, "id", answer)
        chosen = next((w for w in holders if w.id == wid), None) if isinstance(wid, str) else None
        if chosen is None:
            self._hook_error(ts.key, f"placement.data_holder chose {wid!r}, not a holder")
        elif alone and not self._stays_with_its_data(ts, chosen):
            return None
        return chosen

    @staticmethod
    def _takes_producer(ws: WorkerState) -> bool:
        """Producers (roots among them) are withheld beyond saturation, and from
        throttled workers."""
        return not ws.throttled and len(ws.processing) + ws.held < ws.slots

    def _place(self, ts: TaskState, candidates: list[WorkerState]) -> WorkerState:
        try:
            views = [w.view for w in candidates]
            policy = self.policies["placement"]
            chosen = self._ask(
                "placement", policy.choose, TaskStateView(ts), views, self._stats_view
            )
        except _OverBudget:
            return candidates[0]
        except Exception as exc:
            problem = f"placement raised {exc!r}"
            self._policy_error("placement", ts.key, problem, _raised("placement", exc))
            return candidates[0]
        wid = getattr(chosen, "id", chosen)
        if isinstance(wid, str):
            for ws in candidates:
                if ws.id == wid:
                    return ws
        problem = f"placement chose {wid!r}, not a candidate"
        self._policy_error("placement", ts.key, problem, "placement chose a non-candidate")
        return candidates[0]

    def _assign(self, ts: TaskState, ws: WorkerState) -> None:
        ts.worker = ws.id  # first: the transition's monitoring record names it
        self._set(ts, "processing")
        self._log(ts.key, "processing", f"runs-on:{ws.id}")  # its story names the worker
        ts.sent = self._now
        self._placed(ts.spec.pool)  # the placement watchdog: the pool moves
        if ts.turn > self.turn_floor and not ts.spec.priority:
            # only forward, and by tasks sent in their turn: a retry or a take-back of
            # an old task moved it back, a task sent first for its priority= forward
            # (a review: a client coming next then queued behind another's whole work)
            self.turn_floor = ts.turn
        ts.started = None  # until the worker says it executes
        ts.rss_began = ws.rss
        ts.copy_said = ""
        ts.est = self._estimate(ts)
        ws.occupancy += ts.est
        ws.processing.add(ts)
        ws.waiting[ts] = None
        ws.n_producers += ts.producer
        ts.wait_said = ""
        if ws.disk:  # reserved until it finishes; the worker's reports count it after
            ts.disk_need = self._fetch_bytes(ts, ws) + self._expected_output(ts)[0]
            ws.disk_reserved += ts.disk_need
        self._update_free(ws)
        ts.attempt = self._send(ts, ws)
        most = self.config.tasks_per_worker.get(ws.pool)
        if most is not None and ws.tasks_sent >= most and not ws.draining:
            # Its last task: no other comes to it, and it is retired once that one is
            # done (its block ends, and the autoscaler starts a fresh one if needed).
            self._drain(ws, f"draining:tasks_per_worker {most}")

    def spent(self, ws: WorkerState) -> bool:
        """``ws`` is drained because it was sent its pool's ``tasks_per_worker`` tries
        (not leaving on its own): its block counts against ``max_blocks`` while it runs
        a task (the scheduler's status ``spent_draining``)."""
        return ws.draining and not ws.leaving and self.tasks_left(ws) <= 0

    def tasks_left(self, ws: WorkerState) -> float:
        """How many more tries ``ws`` may be sent before its pool's
        ``tasks_per_worker`` drains it (``inf``: no limit)."""
        most = self.config.tasks_per_worker.get(ws.pool)
        return NO_LIMIT if most is None else most - ws.tasks_sent

    def _send(self, ts: TaskState, ws: WorkerState) -> int:
        """Add a try of ``ts`` to the batch of tasks ``ws`` gets at the end of this
        event; return its number (``ToRun.attempt``). Counted in ``ws.tasks_sent``."""
        ws.tasks_sent += 1
        if ts.deps:
            deps = tuple((d.key, tuple(d.who_has)) for d in ts.deps)
            sizes = tuple(d.nbytes for d in ts.deps)
        else:
            deps = sizes = ()
        batch = self._execute.get(ws.id)
        if batch is None:
            batch = self._execute[ws.id] = []
        cps = self.checkpoints.get(ts.key) if self.checkpoints else None
        resume = None
        if cps:
            resume = self._resume_from(ts, cps[0], ws)
        if ws.id == ts.worker:  # its try, not a speculative copy
            ts.resumed = (cps[0].seq, cps[0].work) if cps else None
        self._attempts += 1
        n, spec = self._attempts, ts.spec
        batch.append(
            ToRun(
                ts.key, spec.node, spec.category, deps, ts.producer, sizes, resume, n, spec.timeout
            )
        )
        self._unsent[(ws.id, ts.key)] = n
        return n

    def _cancel_on(self, ws: WorkerState, ts: TaskState) -> None:
        """Stop ``ts``'s try (or copy) on ``ws``. One sent in this same event, whose
        ``Execute`` waits for ``_flush``, is taken back instead: the worker would get
        the cancel first, then the task, and run it for nothing."""
        n = self._unsent.pop((ws.id, ts.key), None)
        if n is None:
            self._out.append(CancelOnWorker(self._stimulus, ws.id, (ts.key,)))
        else:
            self._withdrawn.add(n)
            ws.tasks_sent -= 1  # never sent: it uses none of tasks_per_worker

    # ----------------------------------------------------------------- checkpoints

    def _resume_from(
        self, ts: TaskState, cp: Checkpoint, ws: WorkerState
    ) -> tuple[int, bytes | None, str, int]:
        """What ``ts``'s try on ``ws`` starts from: ``cp``'s bytes when the scheduler
        holds them, else the worker whose disk has its file (``ws`` itself if it can)."""
        self.checkpoint_workers.setdefault(ts.key, set()).add(ws.id)  # it gets a file
        self.checkpoint_counts["resumed"] += 1
        self._log(ts.key, "resume", f"checkpoint:{cp.seq}:{cp.nbytes}")
        if cp.data is not None:
            return (cp.seq, cp.data, "", cp.nbytes)
        holder = ws.id if ws.id in cp.holders else min(cp.holders)
        return (cp.seq, None, holder, cp.nbytes)

    def _output_unreadable(self, ev: OutputUnreadable) -> None:
        """A worker could not pickle task ``ev.key``'s output for a client's gather or
        another worker's task (user audit failures, 7: the task read as a success
        everywhere but that worker's log). Its try ended ok and the output stays, but
        what asked for it failed: counted as a failed try of the task (outcome
        ``error``, cause ``ResultNotPicklable``) in its failure group, its story and the
        feed (the database's try and task), once per output (``TaskState.unreadable``: a
        second gather of it is the same failure, also once the failure groups are full
        and it is filed under ``(other)``)."""
        ts = self.tasks.get(ev.key)
        if ts is None or ts.unreadable:
            return
        ts.unreadable = True
        cause = "ResultNotPicklable"
        error = ResultNotPicklable(str(ev.key), ev.reason, ev.worker, ev.to)
        record = error_record(error)
        self._failed_try(ts, "error", cause, error, ev.worker, record)
        self._log(ts.key, "unreadable", f"{cause}: its output on {ev.worker} does not pickle")
        if self.feed_on:
            self._records.append(("unreadable", ts.key, ts.spec.category, ev.worker, record))

    def _checkpoint_saved(self, ev: TaskCheckpointed) -> None:
        ts = self.tasks.get(ev.key)
        cps = self.checkpoints.get(ev.key, [])
        if (
            ts is None
            or ts.state != "processing"  # ended or cancelled meanwhile: nothing to resume
            or (ev.worker != ts.worker and ev.worker not in self.copies.get(ts, ()))
            or (cps and cps[0].seq >= ev.seq)  # an older one, from a try that lost a race
        ):
            if ev.worker in self.workers:  # its file is of no use: off its disk
                self._out.append(DropCheckpoints(self._stimulus, ev.worker, ((ev.key, ev.seq),)))
            return
        if ev.worker == ts.worker:  # its try: what it resumed from, and its time since
            began = ts.started if ts.started is not None else ts.sent
            work = (ts.resumed[1] if ts.resumed else 0.0) + max(self._now - began, 0.0)
        else:  # a speculative copy: its own time executing (what it resumed from untold)
            work = max(self._now - self.copy_started.get((ts, ev.worker), self._now), 0.0)
        cp = Checkpoint(ev.seq, ev.nbytes, ev.worker, work, holders={ev.worker})
        self.checkpoint_workers.setdefault(ev.key, set()).add(ev.worker)
        self.checkpoint_counts["saved"] += 1
        self._log(ev.key, "checkpoint", f"checkpoint:{ev.seq}:{ev.nbytes}")
        if self.feed_on:
            self._records.append(("checkpoint", ev.key, ev.seq, "saved", ev.worker, work))
        if ev.data is not None and len(ev.data) <= self.config.checkpoint_inline_bytes:
            # Held here, it replaces the older ones (pruned below): count their bytes out.
            freed = sum(len(c.data) for c in cps if c.data is not None)
            if self.checkpoint_held - freed + len(ev.data) <= self.config.checkpoint_bytes:
                cp.data = ev.data
                self.checkpoint_held += len(ev.data)
            else:  # the scheduler's memory comes first: it stays on disks
                self.checkpoint_counts["refused"] += 1
                self._log(ev.key, "checkpoint-refused", f"checkpoint:{ev.seq}:{ev.nbytes}")
        self.checkpoints[ev.key] = [cp, *cps]
        if cp.data is None:
            self._copy_checkpoint(ev.key, cp)
        self._prune_checkpoints(ev.key)

    def _copy_checkpoint(self, key: Key, cp: Checkpoint, *going: WorkerState) -> None:
        """Ask a peer of a worker holding ``cp`` (its owner first; same pool, not
        going, disk room for it; the most room first) to copy it from there; none: it
        stays where it is. With ``going`` (leaving workers holding every copy), any
        survivor of them (:meth:`_survivors`, as for their outputs), its pool first."""
        source = self.workers.get(cp.owner if cp.owner in cp.holders else min(cp.holders))
        if source is None:
            return
        if going:
            candidates = self._survivors(*going)
        else:
            candidates = [w for w in self.workers.values() if w.pool == source.pool]
        peers = [
            w
            for w in candidates
            if w.id not in cp.holders
            and _takes_new(w)
            and not w.leaving
            and w.disk_free() >= cp.nbytes
        ]
        if not peers:
            self._log(key, "checkpoint-uncopied", f"checkpoint:{cp.seq}:{cp.nbytes}")
            return
        peer = max(peers, key=lambda w: (w.pool == source.pool, w.disk_free(), w.id))
        cp.copying, cp.copy_source, cp.copy_sent = peer.id, source.id, self._now
        self.checkpoint_workers.setdefault(key, set()).add(peer.id)
        self._out.append(CopyCheckpoint(self._stimulus, peer.id, source.id, key, cp.seq, cp.nbytes))

    def _checkpoints_off(self, ws: WorkerState) -> None:
        """``ws`` is leaving: have each checkpoint it holds (or is copying) whose copies
        are all on leaving workers (it, one that said it leaves or drains, one of its
        block: going with it, :meth:`_holds_on`), and none on its way to a survivor,
        copied to a survivor (:meth:`_copy_checkpoint`: its pool first, else any) while
        they still serve them (within their grace). One preemption that takes every
        worker of a pool thus loses none of their checkpoints while a worker of another
        pool stays."""
        blocks = {(ws.block, ws.pool)} if ws.block else set()
        for key, cps in self.checkpoints.items():
            for c in cps:
                if ws.id not in c.holders and c.copying != ws.id:
                    continue  # not its concern
                if c.data is not None or (c.copying and self._holds_on(c.copying, blocks)):
                    continue
                if c.holders and not any(self._holds_on(h, blocks) for h in c.holders):
                    self._copy_checkpoint(key, c, ws)

    def _checkpoint_copied(self, ev: CheckpointCopied) -> None:
        cp = next((c for c in self.checkpoints.get(ev.key, ()) if c.seq == ev.seq), None)
        if cp is not None and cp.copying == ev.worker:
            cp.copying = ""
        if not ev.ok:
            self.checkpoint_counts["copy-failed"] += 1
            self._log(ev.key, "checkpoint-uncopied", f"checkpoint:{ev.seq}:{ev.worker}")
            return
        if cp is None or ev.worker not in self.workers:  # pruned meanwhile
            if ev.worker in self.workers:
                self._out.append(DropCheckpoints(self._stimulus, ev.worker, ((ev.key, ev.seq),)))
            return
        cp.holders.add(ev.worker)
        self.checkpoint_counts["copied"] += 1
        took = self._now - cp.copy_sent if cp.copy_sent is not None else None
        self._moved("checkpoint", ev.key, cp.nbytes, cp.copy_source, ev.worker, took)
        self._log(ev.key, "checkpoint-copied", f"checkpoint:{ev.seq}:{ev.worker}")
        self._prune_checkpoints(ev.key)

    def _prune_checkpoints(self, key: Key) -> None:
        """Keep ``key``'s latest checkpoint and, unless it has a copy off its worker,
        the newest one that has; drop the others (their bytes here, their files)."""
        cps = self.checkpoints[key]
        keep = [cps[0]]
        if not cps[0].off_worker:
            safe = next((c for c in cps[1:] if c.off_worker), None)
            if safe is not None:
                keep.append(safe)
        drops: dict[str, list[tuple[Key, int]]] = {}
        for c in cps:
            if any(c is k for k in keep):
                continue
            if c.data is not None:
                self.checkpoint_held -= len(c.data)
            for wid in c.holders | ({c.copying} if c.copying else set()):
                drops.setdefault(wid, []).append((key, c.seq))
        self.checkpoints[key] = keep
        for wid in sorted(drops):
            if wid in self.workers:
                self._out.append(DropCheckpoints(self._stimulus, wid, tuple(drops[wid])))

    def _prune_all_checkpoints(self, key: Key) -> None:
        """``key`` ended: its checkpoints go, here and on every worker that may have one."""
        cps = self.checkpoints.pop(key, None)
        if cps:
            self.checkpoint_held -= sum(len(c.data) for c in cps if c.data is not None)
            self.checkpoint_counts["pruned"] += 1
        for wid in sorted(self.checkpoint_workers.pop(key, ())):
            if wid in self.workers:
                self._out.append(DropCheckpoints(self._stimulus, wid, ((key, 0),)))

    def _checkpoints_lost(self, wid: str) -> None:
        """Worker ``wid`` is gone and its disk with it: its checkpoint files are lost; a
        checkpoint with no copy left is gone (the next try starts from an older one that
        survived, or from nothing)."""
        for key in list(self.checkpoint_workers):
            workers = self.checkpoint_workers[key]
            if wid not in workers:
                continue
            workers.discard(wid)
            cps = self.checkpoints.get(key)
            if not cps:
                continue
            for c in cps:
                c.holders.discard(wid)
                if c.copying == wid:
                    c.copying = ""
            alive = [c for c in cps if c.data is not None or c.holders]
            for c in cps:
                if not any(c is a for a in alive):
                    self.checkpoint_counts["lost"] += 1
                    self._log(key, "checkpoint-lost", f"checkpoint:{c.seq}:{wid}")
                    if self.feed_on:
                        self._records.append(("checkpoint", key, c.seq, "lost", wid, c.work))
            if alive:
                self.checkpoints[key] = alive
            else:
                del self.checkpoints[key]

    def _release_slot(self, ts: TaskState, ws: WorkerState) -> None:
        if ts in ws.processing:
            ws.processing.discard(ts)
            ws.waiting.pop(ts, None)
            ws.began.pop(ts, None)
            ws.n_producers -= ts.producer
            ws.disk_reserved -= ts.disk_need
        ts.disk_need = 0
        left = ws.occupancy - ts.est  # (max(0.0, left) by a comparison: no builtin call)
        ws.occupancy = left if ws.processing and left > 0.0 else 0.0
        ts.worker = None
        self._update_free(ws)

    def _is_free(self, ws: WorkerState) -> bool:
        if ws.jammed:
            return False  # its threads run long tries: a task would wait (_take_back)
        if _cores_held(ws) >= ws.cores:
            # A task sent there would wait behind its stuck threads, or behind
            # speculative copies: a copy is of a straggler, which may run for as long
            # again or hang (the audit's 33 tasks of another batch queued 7 minutes
            # behind a hung task's copy on a one-core worker). A copy takes a whole core.
            return False
        n = _taken(ws)  # a throttled worker's producers are deferred: not counted
        total = len(ws.processing) + _cores_held(ws)
        if n < ws.slots and total < ws.limit:
            return True
        return total < ws.limit and ws.occupancy < ws.cores * self.config.backlog

    def _update_free(self, ws: WorkerState) -> None:
        if ws.id in self.workers and _takes_new(ws) and self._is_free(ws):
            self.free[ws.id] = ws
        else:
            self.free.pop(ws.id, None)

    def _priority(self, ts: TaskState) -> tuple[float, ...]:
        policy = self.policies["priority"]
        try:
            answer = self._ask("priority", policy.priority, TaskStateView(ts), self._stats_view)
            if isinstance(answer, (str, bytes)):  # (a tuple of its letters otherwise)
                raise _NotATuple(f"a {type(answer).__name__} ({answer!r})")
            prio = tuple(answer)
        except _NotATuple as what:
            problem = f"priority returned {what}, not a tuple of numbers"
            same = "priority returned text"
        except _OverBudget:
            return (-ts.spec.priority, ts.generation, ts.spec.order)
        except Exception as exc:
            problem, same = f"priority raised {exc!r}", _raised("priority", exc)
        else:
            try:
                total = sum(prio)  # numbers only: anything else fails here, not inside the heap
            except TypeError:
                problem = f"priority returned {prio!r}, not a tuple of numbers"
                same = "priority returned a tuple not all numbers"
            else:
                # NaN compares false with everything: in the heap it scrambles the order
                # of the other tasks too. (A sum without NaN is a number: one comparison.)
                if total == total or not any(p != p for p in prio):
                    return prio
                problem = f"priority returned NaN in {prio!r}, not a tuple of numbers"
                same = "priority returned NaN"
        self._policy_error("priority", ts.key, problem, same)
        return (-ts.spec.priority, ts.generation, ts.spec.order)

    def pools(self) -> list[str]:
        """Pools with workers now or worker lives recorded."""
        return sorted({w.pool for w in self.workers.values()} | set(self.lives))

    def survival(self, pool: str | None) -> Survival:
        """How long the workers of ``pool`` live (Kaplan-Meier): the last ``MAX_LIVES``
        that left, and the ones alive now (censored at their age)."""
        now = self._now
        pools = self.lives if pool is None else {pool: self.lives.get(pool, ())}
        lives = [life for kept in pools.values() for life in kept]
        lives.extend(
            (now - w.joined, False) for w in self.workers.values() if pool is None or w.pool == pool
        )
        return kaplan_meier(lives)

    def _saved_work(self, ts: TaskState) -> float | None:
        """The work (:attr:`Checkpoint.work`) of ``ts``'s newest checkpoint, the one its
        next try resumes from (None: it has none, or none survived)."""
        cps = self.checkpoints.get(ts.key) if self.checkpoints else None
        return cps[0].work if cps else None

    def _retry_decision(
        self,
        ts: TaskState,
        outcome: str,
        cause: str | None,
        loss: WalltimeLoss | None = None,
        error: BaseException | None = None,
    ) -> RetryDecision:
        """Asks the retry policy, with a view of ``ts`` that has what it needs as data:
        its pool's survival, its category's statistics, ``loss``, the work its newest
        surviving checkpoint holds (``TaskView.saved_work``, ``unsaved_for``) and the
        failing try's ``error`` (``TaskView.error_type``, ``error_types``,
        ``error_message``)."""
        saved = self._saved_work(ts)
        view = TaskStateView(ts, self.survival, self._stats_view, loss, saved, error)
        try:
            decision = self._ask("retry", self.policies["retry"].decide, view, outcome, cause)
            if isinstance(decision, RetryDecision):
                return self._pool_checked(ts, decision)
            problem = f"retry returned {decision!r}, not a RetryDecision"
            same = f"retry returned a {type(decision).__name__}"
        except _OverBudget:
            problem = same = ""
        except Exception as exc:
            problem, same = f"retry raised {exc!r}", _raised("retry", exc)
        if problem:
            self._policy_error("retry", ts.key, problem, same)
        fallback: RetryDecision = REGISTRY.create("retry", "default").decide(view, outcome, cause)
        return fallback

    def _pool_checked(self, ts: TaskState, decision: RetryDecision) -> RetryDecision:
        """``decision`` as the core takes it: a move to a pool no pool may be named
        (``""``, ``"*"``, the key of any pool: ``pool_name_problem``) is a policy error,
        and the retry, if any, stays in the task's pool."""
        problem = "" if decision.pool is None else pool_name_problem(decision.pool)
        if not problem:
            return decision
        self._policy_error(
            "retry", ts.key,
            f"retry moved the task to pool {decision.pool!r}, a name no pool may have "
            f"({problem}): it stays in pool {pool_key(ts.spec.pool)}; a retry policy keeps "
            "a task in its pool with RetryDecision(pool=None)",
            f"retry moved a task to pool {decision.pool!r}",
        )  # fmt: skip
        return dataclasses.replace(decision, pool=None)

    def known_pools(self) -> list[str]:
        """The pools a task may be moved to or listed by: configured, with a worker now
        or before, or with a task."""
        tasks = (p for p, n in self.pool_tasks.items() if n)
        return sorted({*self.config.pools, *self.pools(), *tasks} - {ANY_POOL})

    def move_refusal(self, pool: str | None) -> str:
        """Why no task may be moved to ``pool`` ("": it may; None: no pool change): no
        pool's name (``pool_name_problem``), or a pool :meth:`known_pools` lacks."""
        if pool is None:
            return ""
        problem = pool_name_problem(pool)
        if problem:
            return f"pool {pool!r}: {problem}"
        known = self.known_pools()
        if pool in known:
            return ""
        return (
            f"no pool {pool!r}: none is configured, has a worker or a task by that name "
            f"(pools: {', '.join(known) or 'none'}{did_you_mean(pool, known)})"
        )

    def _tasks_moved(self, ev: TasksMoved) -> None:
        """Move each of ``ev.keys`` still waiting or queued to ``ev.pool`` and/or
        ``ev.priority``: its pool counters (tasks, ready tasks, waits, the next wave)
        follow it, and a ready one leaves its heap for its new pool's, placed by its new
        priority (its wait there counts from the move). Answers :class:`MoveAnswer`."""
        moved: list[Key] = []
        left: list[tuple[Key, str]] = []
        refusal = self.move_refusal(ev.pool)
        stale: set[tuple[str | None, bool]] = set()
        for key in dict.fromkeys(ev.keys):
            ts = self.tasks.get(key)
            why = refusal or self._unmovable(ts, ev.pool, ev.priority)
            if why or ts is None:
                left.append((key, why))
                continue
            spec = ts.spec
            pool = spec.pool if ev.pool is None else ev.pool
            priority = spec.priority if ev.priority is None else ev.priority
            old, new = pool_key(spec.pool), pool_key(pool)
            queued = ts.state == "queued"
            ready = self.ready_entries.get(spec.category) if queued else None
            in_heap = ready is not None and ready.pop(ts, None) is not None
            if in_heap:
                if not ready:
                    del self.ready_entries[spec.category]
                stale.add((spec.pool, ts.producer))
            if queued and old != new:
                self.queued_counts[old] -= 1
                self.queued_counts[new] += 1
                for unfit in self.unfit_pools(spec.pool, spec.resources):
                    self.unfit_counts[unfit] -= 1
                for unfit in self.unfit_pools(pool, spec.resources):
                    self.unfit_counts[unfit] += 1
                was = self.pool_waits.get(old)
                if was is not None:
                    was.since.pop(ts, None)
                pw = self.pool_waits.get(new)
                if pw is None:
                    pw = self.pool_waits[new] = PoolWaits()
                pw.since[ts] = self._now  # (its waits stay oldest first)
            wave = ts.state == "waiting" and ts.waiting_deps == 0
            if wave:
                self._in_wave(ts, False)
            if old != new:
                self._log(ts.key, "pool", f"{old}->{new}")
            if priority != spec.priority:
                self._log(ts.key, "priority", f"{spec.priority:g}->{priority:g}")
            if self.feed_on:
                self._records.append(
                    ("moved", ts.key, spec.category, spec.pool, pool, spec.priority, priority)
                )
            self._repool(ts, dataclasses.replace(spec, pool=pool, priority=priority))
            if wave:
                self._in_wave(ts, True)
            if in_heap:
                self._enqueue(ts)  # (a held one goes to its new heap when released)
            if pool is not None and not any(w.pool == pool for w in self.workers.values()):
                self._no_worker_note(ts, pool, f"pool {pool!r}, which has no worker now")
            moved.append(key)
        for q in stale:  # the moved tasks' old entries out (no two live entries of one)
            heap = self.queues.get(q)
            if heap is not None:
                heap[:] = [
                    e for e in heap if self.ready_entries.get(e[3].spec.category, {}).get(e[3]) is e
                ]
                heapq.heapify(heap)
        self._out.append(MoveAnswer(self._stimulus, tuple(moved), tuple(left)))

    def _unmovable(self, ts: TaskState | None, pool: str | None, priority: int | None) -> str:
        """Why ``ts`` is not moved to ``pool`` and ``priority`` ("": it is)."""
        if ts is None:
            return "not known to the scheduler (finished and let go, or never submitted)"
        if ts.state == "processing":
            return f"running on {ts.worker}: a running task is not moved"
        if ts.state not in ("waiting", "queued"):
            return f"{ts.state}: only a waiting or queued task is moved"
        same_pool = pool is None or pool == ts.spec.pool
        if same_pool and (priority is None or priority == ts.spec.priority):
            return f"already in pool {pool_name(ts.spec.pool)} with priority {ts.spec.priority:g}"
        to = ts.spec.pool if pool is None else pool
        limit = self.largest.get(to, NO_LIMIT)
        if ts.in_nbytes > limit:
            return (
                f"its inputs ({size_text(ts.in_nbytes)}) fit no worker of pool "
                f"{pool_name(to)} (the largest holds {size_text(int(limit))})"
            )
        return ""

    def _requeue_all(self) -> None:
        entries = [e[3] for heap in self.queues.values() for e in heap if e[3].state == "queued"]
        self.queues = {}
        seen: set[Key] = set()
        for ts in entries:
            if ts.key not in seen:
                seen.add(ts.key)
                self._enqueue(ts)

    # ----------------------------------------------------------------- memory

    def _yields(self) -> bool:
        """Do producers yield to consumers now? Asked of the memory policy with the
        pressure as it is (some worker throttled or not); one that raises falls back
        to: yield under pressure only."""
        pressure = bool(self.throttled)
        try:
            return bool(self._ask("memory", self.policies["memory"].yields, pressure))
        except _OverBudget:
            return pressure
        except Exception as exc:
            problem = f"memory.yields raised {exc!r}"
            self._policy_error("memory", "-", problem, _raised("memory.yields", exc))
            return pressure

    def _is_producer(self, ts: TaskState) -> bool:
        category = ts.spec.category
        known = self.classes.get(category)
        if known is None:
            known = self.classes[category] = self._ask_producer(
                category, self._stat_views.get(category), not ts.deps
            )
        return known

    def _ask_producer(self, category: str, stats: CategoryStatsView | None, root: bool) -> bool:
        try:
            return bool(
                self._ask("memory", self.policies["memory"].producer, category, stats, root)
            )
        except _OverBudget:
            return root
        except Exception as exc:
            problem = f"memory.producer({category!r}) raised {exc!r}"
            self._policy_error("memory", "-", problem, _raised("memory.producer", exc))
            return root

    def _reclassify(self) -> None:
        """Categories whose class flipped: flip the cached class and move their ready
        tasks to the other heap of their pool (same entry, so the same place among
        equals; no policy calls). Only the flipped categories' tasks are touched
        (``ready_entries``): the entries left behind are stale (``_live``) and dropped
        when they reach the top, so a flip costs its own tasks, not every ready task
        (a run of 5,000 categories flipped 5,000 times over 20,000 ready tasks)."""
        flipped, self._flipped = self._flipped, set()
        for category in flipped:
            if category not in self.classes:
                continue  # forgotten meanwhile: no task of it is left
            producer = self.classes[category] = not self.classes[category]
            kind = "producer" if producer else "consumer"
            self._log("-", "memory", f"{category} is a {kind}")
            for ts, entry in self.ready_entries.get(category, {}).items():
                if ts.producer != producer:
                    ts.producer = producer
                    q = (ts.spec.pool, producer)
                    heap = self.queues.get(q)
                    if heap is None:
                        heap = self.queues[q] = []
                    heapq.heappush(heap, entry)

    def _watch(self) -> None:
        """The stall watchdogs: the memory one (the module docstring), the disk one
        (``_watch_disk``, ``actors/scheduler_disk.py``) and the placement one
        (``_watch_placement``, ``actors/scheduler_stall.py``), which leaves a pool whose
        ready tasks wait for disk to the disk one."""
        if self.disk_parked or self.disk_stalled_since or self.disk_override or self.disk_broken_at:
            self._watch_disk()
        if self.disk_stalls:
            self._disk_stalls_ended()
        if self.placement_since or self.queued_counts:
            self._watch_placement()
        if self.throttled or self.stalled_since:
            self._watch_memory()

    def _left_pool(self, ws: WorkerState) -> None:
        """``ws`` leaves its pool's members (it left, or re-registered in another)."""
        members = self.pool_members.get(ws.pool)
        if members is not None and members.pop(ws.id, None) is not None and not members:
            del self.pool_members[ws.pool]
        if ws.throttled:
            self._unthrottled_in(ws.pool)

    def _unthrottled_in(self, pool: str) -> None:
        self.throttled_in[pool] -= 1
        if not self.throttled_in[pool]:
            del self.throttled_in[pool]

    def _watch_memory(self) -> None:
        """The memory watchdog (the module docstring), per pool: a pool whose every
        worker is throttled, none of them away, none executing a try within its bound
        (``_executing_bound``) or running a consumer (but a try past its bound), no
        consumer ready with room for it there (``_room_for``) and tasks of the pool
        waiting, for ``stall_timeout``, fails those tasks with
        :class:`~runtime.errors.MemoryStalled`, unless a task running
        or ready elsewhere reads an output held there (``_read_elsewhere``: then its
        clock starts again); the other pools run on. ``"*"`` (the tasks of no pool, which
        any worker but a reserved pool's may run) only when every such worker is
        throttled (an idle worker of a reserved pool cannot run them), and then every
        task still to run of no pool or of a pool with a worker, but a reserved pool's,
        fails (``_stalls_with``; the tries past their bound among them).
        O(pools) per event: a pool's workers, and the tries executing there, are looked
        at only while every one of them is throttled, the running and ready tasks only
        when its clock runs out, its tasks only when it fails."""
        stalled = self.stalled_since
        keys = [p for p, n in self.throttled_in.items() if n >= len(self.pool_members.get(p, ()))]
        runs = self._any_pool_workers() if self.throttled else {}
        if runs and len(self.throttled) >= len(runs) and all(w in self.throttled for w in runs):
            keys.insert(0, ANY_POOL)  # first: it fails every task it may run
        for key in [k for k in stalled if k not in keys]:
            del stalled[key]
        for key in keys:
            if self._memory_moves(key):
                stalled.pop(key, None)
                continue
            since = stalled.get(key)
            if since is None:
                stalled[key] = self._now
                self._log("-", "memory", f"stall-suspected in pool {pool_name(key)}")
                continue
            if self._now - since < self.config.stall_timeout:
                continue
            if key != ANY_POOL and self._read_elsewhere(self.pool_members[key]):
                stalled[key] = self._now  # they will free memory there: look again later
                continue
            self._fail_stalled(key, self._now - since)

    def _memory_moves(self, key: str) -> str:
        """Why pool ``key``, every worker of which is throttled, is not stalled for
        memory ("": it is): nothing of the pool was submitted, a worker of it is away
        (held for its rejoin, it cannot say its memory came down), a try executes on
        one of its workers within its bound (``WorkerState.began``, producer or not: it
        ends and frees what it holds, or is killed at the terminate fence or past its
        ``timeout=``; its own memory is no stall of its pool, and the clock starts when
        it ends or passes its bound, ``_executing_bound``: a try with no ``timeout=``
        may hang for ever), a consumer runs on one of them (it may free memory; one
        past its bound does not count, nor one waiting on a worker whose every thread
        runs such a try, is held by a stopped try or runs a speculative copy), one is
        ready and a worker of the pool has room for it (``_room_for``: a consumer
        waiting for slots or cores that deferred producers hold waits for ever), or
        nothing it would fail (``_stalls_with``) waits for memory: is ready, or sent to
        its workers and not executing (memory held is the results; a task waiting for
        its inputs, a hung try's own dependents among them, waits for them). No scan of
        tasks: its workers, the tries executing there, the ready heads, the counters."""
        pool = pool_of_key(key)
        if pool is not None and not self.pool_tasks[pool]:
            return "nothing of the pool to run"
        workers = self._any_pool_workers() if pool is None else self.pool_members.get(pool, {})
        if any(ws.away is not None for ws in workers.values()):
            return "a worker is away"
        if sum(len(ws.began) for ws in workers.values()) > len(self._hung_tries(workers)):
            return "a try executes"
        # Every try executing there is past its bound now: a consumer executing is one
        # of them, and one waiting on a worker whose every thread runs one, is held by a
        # stopped try or runs a speculative copy (``_cores_held``) waits behind them.
        if any(
            len(ws.began) + _cores_held(ws) < ws.cores
            and len(ws.processing) - ws.n_producers > sum(not ts.producer for ts in ws.began)
            for ws in workers.values()
        ):
            return "a consumer runs"
        reserved = self.config.reserved_pools
        for q, heap in self.queues.items():
            if q[1] or (pool is not None and q[0] not in (pool, None)) or q[0] in reserved:
                continue
            while heap and not _live(heap[0], False):
                heapq.heappop(heap)  # stale (cancelled, failed, re-queued, flipped)
            if heap and any(self._room_for(heap[0][3], ws) for ws in workers.values()):
                return "a consumer can still be placed"
        # Waits for memory: a task it fails (``_stalls_with``) that is ready or sent
        # there and not executing. Not one waiting for its inputs: it waits for them
        # (a hung try's own dependents wait for that try alone, which is no stall).
        if not any(
            n and self._stalls_with(key, pool_of_key(p)) for p, n in self.queued_counts.items()
        ) and not any(
            self._stalls_with(key, ts.spec.pool) for ws in workers.values() for ts in ws.waiting
        ):
            return "nothing to run" if pool is None else "nothing of the pool to run"
        return ""

    def _stalls_with(self, key: str, pool: str | None) -> bool:
        """A task of ``pool`` is one the memory stall of pool ``key`` counts as waiting
        and fails: one of that pool; for ``"*"`` one of no pool or of a pool with a
        worker (all of them throttled then), not a reserved pool's (its workers are not
        among those stalled) nor one of a pool with no worker yet (it waits for one)."""
        return runs_on(pool_of_key(key), pool, self.config.reserved_pools) and (
            pool is None or pool in self.pool_members
        )

    def _hung_tries(
        self, workers: dict[str, WorkerState]
    ) -> list[tuple[TaskState, str, float, float]]:
        """The tries executing on ``workers`` for longer than their bound
        (``_executing_bound``), as ``(task, worker, seconds executed, bound)``: those no
        longer count as progress for the memory watchdog. O(tries executing there)."""
        now = self._now
        return [
            (ts, ws.id, now - started, bound)
            for ws in workers.values()
            for ts, started in ws.began.items()
            if now - started > (bound := self._executing_bound(ts))
        ]

    def _executing_bound(self, ts: TaskState) -> float:
        """Seconds a try of ``ts`` may execute and still hold its pool's memory watchdog
        off (docs/memory.md, "A task that runs is not a stall"): the longest of
        :data:`EXECUTING_STALLS` ``stall_timeout``s, twice the longest ok try of its
        category so far (a category known to run long is given its time) and its own
        ``timeout=`` (past which its worker stops it)."""
        st = self.stats.get(ts.spec.category)
        return max(
            EXECUTING_STALLS * self.config.stall_timeout,
            2 * st.max_duration if st is not None else 0.0,
            ts.spec.timeout or 0.0,
        )

    def _room_for(self, ts: TaskState, ws: WorkerState) -> bool:
        """The memory watchdog's test (``_memory_moves``) that consumer ``ts``, ready,
        can still be placed on ``ws``: ``ws`` takes new work and holds fewer tries than
        its slots, and than its cores if ``ts`` is long (``_long``), deferred producers
        counted. Not ``_taken``'s count, by which placement leaves them out: a consumer
        kept from the slots or cores that a throttled worker's deferred producers hold,
        whatever kept it, is a stall, not progress (a user audit's hang: the watchdog
        counted such a ``sum-partial`` as progress at every tick and never fired)."""
        n = len(ws.processing) + _cores_held(ws)
        return _takes_new(ws) and n < ws.slots and (n < ws.cores or not self._long(ts))

    def _read_elsewhere(self, members: dict[str, WorkerState]) -> bool:
        """A task that runs on a worker not in ``members``, or a consumer ready in a
        pool with workers, reads an output held on one of ``members``: when it ends,
        that output may be released there (a pool that loads for another pool's
        consumers). A ready producer does not count: it may be held back for ever. One
        pass over the running and the ready tasks, made only when a pool's clock runs
        out."""

        def reads(ts: TaskState) -> bool:
            return any(not members.keys().isdisjoint(d.who_has) for d in ts.deps)

        for ws in self.workers.values():
            if ws.id not in members and any(reads(ts) for ts in ws.processing):
                return True
        return any(
            _live(entry, False) and reads(entry[3])
            for (pool, producer), heap in self.queues.items()
            if not producer and (pool is None or pool in self.pool_members)
            for entry in heap
        )

    def _holding(
        self, on: set[str] | None = None, files: bool = True
    ) -> list[tuple[str, int, int]]:
        """What the workers hold, by category: ``(category, bytes, outputs)``, largest
        first (a stall's account: ``MemoryStalled.holding``, ``DiskStallInfo.holding``).
        Every output in memory or spilled; with ``on``, those on these workers, a copy on
        each holder counting: only the file outputs (on their disks) with ``files``. One
        pass over the tasks, made only when a stall is declared."""
        held: dict[str, list[int]] = {}
        for ts in self.tasks.values():
            if ts.state != "memory":
                continue
            copies = 1
            if on is not None:
                if files and not ts.file:
                    continue
                copies = len(ts.who_has & on)
                if not copies:
                    continue
            h = held.setdefault(ts.spec.category, [0, 0])
            h[0] += ts.nbytes * copies
            h[1] += copies
        return sorted(((c, b, n) for c, (b, n) in held.items()), key=lambda x: -x[1])

    def _fail_stalled(self, key: str, stalled_for: float) -> None:
        """Pool ``key`` stalled for memory: its tasks still to run (``_stalls_with``)
        and the tries executing past their bound on its workers, of whatever pool
        (``_hung_tries``: named in ``MemoryStalled.executing``, not counted as waiting),
        fail with :class:`~runtime.errors.MemoryStalled`, with the account of its
        workers. One pass over the tasks, made only when a stall is declared."""
        pool = pool_of_key(key)
        members = self._any_pool_workers() if pool is None else self.pool_members.get(pool, {})
        workers = list(members.values())
        active = {
            ts: None
            for ts in self.tasks.values()
            if ts.state in ACTIVE and self._stalls_with(key, ts.spec.pool)
        }
        holding = self._holding(None if pool is None else set(members), files=False)
        hung = {h[0]: h for h in self._hung_tries(members)}
        # A hung try of no pool on a pool's worker held it too: it fails with it, named.
        active.update(dict.fromkeys(hung))
        executing = [(ts.key, *hung[ts][1:]) for ts in active if ts in hung]
        producers = [ts for ts in active if ts.producer and ts not in hung]
        needed = 0
        # Each producer makes an output as large as the mean of those made so far of its
        # layer (a dask array's other chunks: a tuple key's name), else its category's
        # mean. Not the category's alone: one category (dask's "random") gathers every
        # array of a manager's life, chunks of 8 MB and 3 GB and fused reductions of 336
        # bytes (the memprio audit's "85 producers need 6.25 GiB" for 85 chunks of
        # 128 MB).
        layers: dict[str, list[int]] = {}
        for ts in self.tasks.values():
            if ts.state in ("memory", "released") and (layer := _layer(ts.key)) is not None:
                made = layers.setdefault(layer, [0, 0])
                made[0] += ts.nbytes
                made[1] += 1
        for ts in producers:
            layer = _layer(ts.key)
            if layer is not None and layer in layers:
                size = layers[layer][0] // layers[layer][1]
            else:
                st = self.stats.get(ts.spec.category)
                size = int(st.mean_nbytes) if st is not None else 0
            needed += size
        available = sum(max(0, ws.throttle_at - ws.rss) for ws in workers)
        rss = sum(ws.rss for ws in workers)
        told = [ws.memory_bytes for ws in workers]
        in_memory = None if any(n < 0 for n in told) else sum(told)
        limit = max((ws.memory for ws in workers), default=0)
        refused = tuple(
            (ws.id, ws.spill_dir, ws.spill_refused, self._now - ws.spill_refused_at)
            for ws in sorted(workers, key=lambda w: w.id)
            if self._spill_refused_lately(ws)
        )
        err = MemoryStalled(
            holding, needed, available, len(producers), stalled_for, rss, in_memory, limit,
            pool=pool, workers=len(workers), spill_refused=refused, executing=executing,
        )  # fmt: skip
        record = error_record(err)  # once for all the tasks it fails
        self._log("-", "memory", f"stalled in pool {pool_name(key)}")
        del self.stalled_since[key]
        for ts in active:
            if ts.state not in ACTIVE:
                continue  # failed meanwhile
            if ts.state == "processing":
                self._unassign(ts, cancel=True, cause="memory-stalled")
            self._fail(ts, err, record)

    # ----------------------------------------------------------------- output

    def _flush(self) -> None:
        if self._execute:
            withdrawn = self._withdrawn
            for wid, batch in self._execute.items():
                runs = tuple(r for r in batch if r.attempt not in withdrawn) if withdrawn else batch
                if runs:
                    self._out.append(Execute(self._stimulus, wid, tuple(runs)))
            self._execute, self._unsent, self._withdrawn = {}, {}, set()
        if self._files:
            facts = []
            forgotten = set(self._forgotten)
            depth1 = self._depth == 1
            for key, ts in self._files.items():
                state: Literal["pending", "created", "released", "forgotten"]
                if key in forgotten:
                    state = "forgotten"
                elif ts.state in ("memory", "released"):
                    state = "created" if ts.state == "memory" else "released"
                else:
                    state = "pending"
                if not ts.registered:
                    # The registry learns of a file when it is first created; before that
                    # (and if it never is) there is nothing for it to track.
                    if state != "created":
                        continue
                    ts.registered = True
                holds = ts.consumers if depth1 else self._holds(ts)
                facts.append(
                    FileFact(
                        key, state, ts.nbytes, tuple(ts.who_has), holds, ts.wanted > 0, ts.file
                    )
                )
            self._out.append(FileFacts(self._stimulus, tuple(facts)))
            self._files = {}
            self._forgotten = []

    def _stat(self, ts: TaskState) -> CategoryStats:
        """``ts``'s category's statistics, made now if new, now the most recent."""
        category = ts.spec.category
        stats = self.stats
        st = stats.pop(category, None)
        if st is None:
            if len(stats) >= MAX_CATEGORIES:
                self._forget_categories()
            st = CategoryStats()
            self._stat_views[category] = CategoryStatsView(st)
            self._metric(category)  # its label, counting from 0 (in the metrics)
        stats[category] = st  # (re-inserted: the last is the most recent)
        return st

    def _forget_categories(self) -> None:
        """Below ``MAX_CATEGORIES`` again: forget the categories finished least recently
        that have no task in ``tasks``. At most ``FORGET_SCAN`` looked at (O(1) per new
        category); one with tasks goes to the back, so the next look meets others. What
        is learnt again if the category comes back: its statistics, its class (asked
        of the memory policy), its place in its pools' drain margin, whether its outputs
        are files."""
        stats = self.stats
        for category in list(itertools.islice(stats, FORGET_SCAN)):
            if len(stats) < MAX_CATEGORIES:
                return
            if self.category_tasks.get(category):
                stats[category] = stats.pop(category)
                continue
            self._forgotten_finished += stats.pop(category).count
            self._forgotten_failures += sum(self.failures.pop(category, {}).values())
            del self._stat_views[category]
            self.classes.pop(category, None)
            self.file_categories.discard(category)
            self._category_totals.pop(category, None)  # (its metrics label stays)
            for cats in self.pool_categories.values():
                cats.discard(category)
            self.categories_forgotten += 1

    def _category_task_gone(self, category: str) -> None:
        """A task of ``category`` left ``tasks``. With none left, a category without
        statistics (no try ended) forgets its class too, and past ``MAX_CATEGORIES``
        (a graph of more categories than that) some are forgotten."""
        counts = self.category_tasks
        n = counts[category] - 1
        if n:
            counts[category] = n
            return
        del counts[category]
        if category not in self.stats:
            self.classes.pop(category, None)
        elif len(self.stats) > MAX_CATEGORIES:
            self._forget_categories()  # over the cap while their tasks were known

    def _metric_label(self, category: str) -> str:
        """The label ``category`` has in the metrics: itself for the first
        ``MAX_METRIC_CATEGORIES`` categories with a try that ended, ``OTHER_CATEGORY``
        for the rest (keys that make a category per task, ``part_0``, ``part_1``, ...,
        would make the series grow without bound). O(1)."""
        labels = self.metric_labels
        if category in labels:
            return category
        if len(labels) < MAX_METRIC_CATEGORIES:
            labels.add(category)
            return category
        return OTHER_CATEGORY  # the set is full for good: the rest stay here

    def _metric(self, category: str) -> MetricTotals:
        """The metrics' totals ``category`` counts in (made at its first use). A
        category's label never changes once given (``_metric_label``), so the totals
        it counts in are kept per category: one lookup per finished try."""
        m = self._category_totals.get(category)
        if m is None:
            label = self._metric_label(category)
            m = self.metric_totals.get(label)
            if m is None:
                m = self.metric_totals[label] = MetricTotals()
            self._category_totals[category] = m
        return m

    def _log(self, key: Any, start: str, finish: str) -> None:
        self.story_log.append((key, start, finish, self._stimulus, self._now))

    # ----------------------------------------------------------------- invariants

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the first broken one."""
        actual = Counter(ts.state for ts in self.tasks.values())
        assert self.by_state == dict(actual), ("state counters", self.by_state, actual)
        finished = sum(s.count for s in self.stats.values()) + self._forgotten_finished
        counted = sum(m.finished for m in self.metric_totals.values())
        assert finished == counted, ("metric totals", finished, counted)
        assert self.stats.keys() == self._stat_views.keys(), "category views"
        tasks_per_category = Counter(ts.spec.category for ts in self.tasks.values())
        assert self.category_tasks == dict(tasks_per_category), "tasks per category"
        assert len(self.metric_labels) <= MAX_METRIC_CATEGORIES, "metric labels"
        failed = sum(n for c in self.failures.values() for n in c.values())
        failed += self._forgotten_failures
        assert failed == sum(self.metric_failures.values()), ("metric failures", failed)
        assert self.failures.keys() <= self.stats.keys(), "failures of forgotten categories"
        assert self.file_categories <= self.stats.keys(), "file outputs of forgotten categories"
        assert all(st.rss_rise <= self.max_rise for st in self.stats.values()), "max_rise"
        for key, cps in self.checkpoints.items():  # dropped when their task ends
            assert self.tasks[key].state in ACTIVE, ("checkpoint of an ended task", key)
            assert cps and len(cps) <= 2, ("checkpoints kept", key, cps)
            assert all(c.data is not None or c.holders for c in cps), ("dead checkpoint", key)
            assert key in self.checkpoint_workers, ("checkpoint workers", key)
        held = sum(len(c.data) for cps in self.checkpoints.values() for c in cps if c.data)
        assert self.checkpoint_held == held, ("checkpoint bytes", self.checkpoint_held, held)
        pools = Counter(
            pool_key(ts.spec.pool) for ts in self.tasks.values() if ts.state == "queued"
        )
        assert self.queued_by_pool() == dict(pools), ("queue counters", self.queued_counts, pools)
        unfit = Counter(
            p
            for ts in self.tasks.values()
            if ts.state == "queued"
            for p in self.unfit_pools(ts.spec.pool, ts.spec.resources)
        )
        assert self.unfit_by_pool() == dict(unfit), ("unfit counters", self.unfit_counts, unfit)
        for pool, pw in self.pool_waits.items():  # oldest first (``oldest_wait``)
            times = list(pw.since.values())
            assert times == sorted(times), ("ready since, oldest first", pool, times)
        pools = Counter(pool_key(ts.spec.pool) for ts in self.tasks.values())
        assert self.pool_tasks == pools, ("pool task counters", self.pool_tasks, pools)
        members = sum(len(m) for m in self.pool_members.values())
        assert members == len(self.workers) and all(self.pool_members.values()), "members"
        pools = Counter(self.workers[w].pool for w in self.throttled)
        assert self.throttled_in == pools, ("throttled per pool", self.throttled_in, pools)
        retry_entries = {(until, ts) for until, _, ts in self.retry_held}
        for key, ts in self.tasks.items():
            assert ts.key == key
            assert ts.state in ACTIVE | {"memory", "released", "erred", "cancelled"}, ts
            for d in ts.deps:
                assert ts in d.dependents, (ts, d)
                assert self.tasks.get(d.key) is d, (ts, "dep forgotten", d)
            for dep in ts.dependents:
                assert ts in dep.deps, (ts, dep)
            active = sum(1 for dep in ts.dependents if dep.state in ACTIVE)
            assert ts.consumers == active, (ts, ts.consumers, active)
            not_ready = sum(1 for d in ts.deps if d.state != "memory")
            in_memory = sum(d.nbytes for d in ts.deps if not d.file)
            assert ts.in_nbytes == in_memory, (ts, ts.in_nbytes)
            assert ts.in_files == sum(d.nbytes for d in ts.deps) - in_memory, (ts, ts.in_files)
            if ts.state in ("waiting", "queued"):
                # Memory admission: nothing waits that no worker of its pool could hold.
                limit = self.largest.get(ts.spec.pool, NO_LIMIT)
                assert ts.in_nbytes <= limit, (ts, "too large", ts.in_nbytes, limit)
            if ts.state == "waiting":
                # waiting for an input, or a retry held for its backoff, or both
                assert ts.waiting_on == not_ready, (ts, ts.waiting_on, not_ready)
                assert not_ready > 0 or ts.retry_at > 0, (ts, "waiting for nothing")
            if ts.retry_at:
                # held: waiting, at most MAX_RETRY_DELAY, in the retry heap, not past due
                assert ts.state == "waiting", (ts, "retry_at while not waiting")
                assert self._now < ts.retry_at <= self._now + MAX_RETRY_DELAY, (ts, ts.retry_at)
                assert (ts.retry_at, ts) in retry_entries, (ts, "held retry in no heap entry")
            waiting = sum(1 for d in ts.deps if d.state == "waiting")
            assert ts.waiting_deps == waiting, (ts, "waiting inputs", ts.waiting_deps, waiting)
            if ts.state in ("queued", "processing"):
                assert not_ready == 0 or ts.state == "processing", (ts, not_ready)
            if ts.state == "processing":
                assert ts.worker in self.workers, ts
                ws = self.workers[ts.worker]
                assert ts in ws.processing, ts
                assert (ts in ws.waiting) == (ts.started is None) != (ts in ws.began), ts
            else:
                assert ts.worker is None, ts
            if ts.state == "memory":  # (but one whose holders the run's stop ended)
                assert ts.who_has or self.stopping, ts
            if ts.state != "memory":
                assert not ts.who_has, (ts, ts.who_has)
            for wid in ts.who_has:
                assert ts in self.workers[wid].has_what, (ts, wid)
            if ts.state in ("erred", "cancelled"):
                assert ts.error is not None, ts
            # released while a client wants it: lost after a gather, until needed
            lost_held = ts.state == "released" and ts.wanted > 0
            assert lost_held == (ts in self.lost_held), (ts, "lost_held", lost_held)
        assert all(self.tasks.get(t.key) is t for t in self.lost_held), "lost_held forgotten"
        for t in self.unreached:  # in memory, wanted, its word due: never delivered
            assert self.tasks.get(t.key) is t, (t, "unreached forgotten")
            assert t.state == "memory" and t.wanted and not t.delivered, (t, "unreached")
        wave = {
            ts
            for ts in self.tasks.values()
            if ts.state == "waiting" and not any(d.state == "waiting" for d in ts.deps)
        }
        kept = {ts for w in self.next_wave.values() for ts in w}
        assert kept == wave, ("next wave", kept ^ wave)
        for pool, w in self.next_wave.items():
            assert all(pool_key(ts.spec.pool) == pool for ts in w), ("next wave pool", pool)
        queued = {e[3] for q, heap in self.queues.items() for e in heap if _live(e, q[1])}
        for category, ready in self.ready_entries.items():
            assert ready, ("empty ready entries", category)
            for ts in ready:
                assert ts.state == "queued" and ts.spec.category == category, ts
                assert ts in queued, (ts, "ready entry in no heap of its class")
        holding = {e[2] for e in self.held if e[2].state == "queued" and e[2].held_until == e[0]}
        for ts in self.tasks.values():
            if ts.state == "queued":
                assert ts in queued or ts in holding, (ts, "queued but in no ready queue")
        for ts, wid in self.copy_started:
            assert wid in self.copies.get(ts, ()), (ts, wid, "start of no copy")
        for ts, running in self.copies.items():
            # Speculative copies: of running tasks only, never where the try runs.
            assert ts.state == "processing" and running, (ts, running)
            assert self.tasks.get(ts.key) is ts, (ts, "copies of a forgotten task")
            for wid in running:
                assert wid != ts.worker and ts in self.workers[wid].copies, (ts, wid)
        for wid, ws in self.workers.items():
            assert len(ws.processing) + len(ws.copies) <= ws.limit, ws
            for ts in ws.copies:
                assert wid in self.copies.get(ts, ()), (ws, "untracked copy", ts)
            assert not (ws.draining and ws.copies), (ws, "draining with copies")
            assert ws.n_producers == sum(ts.producer for ts in ws.processing), ws
            assert ws.throttled == (wid in self.throttled), ws
            assert self.pool_members[ws.pool].get(wid) is ws, (ws, "pool members")
            for ts in ws.processing:
                assert ts.state == "processing" and ts.worker == wid, ts
            reserved = sum(ts.disk_need for ts in ws.processing)
            reserved += sum(self.copies[ts][wid][1] for ts in ws.copies)
            assert ws.disk_reserved == reserved, (ws, "disk reserved", ws.disk_reserved, reserved)
            for ts in ws.has_what:
                assert wid in ts.who_has, (ws, ts)
            held = sum(ts.nbytes for ts in ws.has_what)
            assert self.held_bytes.get(wid, 0) == held, (ws, self.held_bytes.get(wid), held)
            # A draining worker is never free, whatever its load.
            assert (wid in self.free) == (_takes_new(ws) and self._is_free(ws)), ws
            # Draining: retired exactly once it runs nothing; retired: told to stop.
            assert (wid in self.draining) == (ws.draining and not ws.retired and not ws.leaving)
            if ws.leaving:
                assert ws.draining, (ws, "leaving but given tasks")
            elif ws.draining:
                # retired once it runs nothing, keeps no output only it holds that
                # something needs (those are copied off first: ``_retire_idle``) and no
                # leaving worker's plan copies to it (a keeper: ``_keepers``)
                if ws.processing or self.evac_planned.get(wid):
                    assert not ws.retired, (ws, "retired while it runs tasks or copies come")
                else:
                    assert ws.retired or ws.keeping, (ws, "draining but not retired")
            else:
                assert not ws.retired, ws
            # Sent its pool's tasks_per_worker tries: it takes no other.
            assert self.tasks_left(ws) > 0 or ws.draining, (ws, "past tasks_per_worker")
        assert self.draining <= self.workers.keys(), self.draining
        for ts, copies in self.replicas.items():
            assert ts.state == "memory" and copies and copies <= ts.who_has, (ts, copies)
        for ts in self.copy_failed:
            assert ts.state == "memory", (ts, "failed copies of an output not in memory")
        for key, targets in self.copying.items():
            assert targets and targets.keys() <= self.workers.keys(), (key, "copying", targets)
        apart = self.config.reserved_pools
        largest = _largest_per_pool(self.workers.values(), "memory", apart)
        assert self.largest == largest, (self.largest, largest)
        disks = _largest_per_pool(self.workers.values(), "disk", apart)
        assert self.largest_disk == disks, (self.largest_disk, disks)
        cores = _largest_per_pool(self.workers.values(), "cores", apart)
        assert self.largest_cores == cores, (self.largest_cores, cores)
        for ts in self.disk_measured:
            assert self.tasks.get(ts.key) is ts, (ts, "a measured output of a forgotten task")
        # The stall breaker's remakes: active tasks, and only while it notes drops.
        for ts in self.disk_remakes:
            assert ts.state in ACTIVE, (ts, "a remake no longer active")
        assert self.disk_dropped_since or not self.disk_remakes, "remakes, no drops noted"
        assert self._floor == min(largest.values(), default=NO_LIMIT), self._floor
        # No ready task may wait while a worker that could run it has a free slot,
        # unless a long task heads its heap and waits for a core (``_fill``).
        behind_long = set()
        for q, heap in self.queues.items():
            live = [e for e in heap if _live(e, q[1])]
            if live and self._long(min(live)[3]) and self._no_core_for(*q):
                behind_long.add(q)
        for ts in queued:
            if (ts.spec.pool, ts.producer) in behind_long:
                continue
            assert not self._candidates(ts), (ts, "queued while a candidate worker is free")


def _largest_per_pool(
    workers: Iterable[WorkerState],
    limit: Literal["memory", "disk", "cores"],
    reserved: frozenset[str] = frozenset(),
) -> dict[str | None, float]:
    """The largest ``limit`` (memory, disk or cores; 0 is no limit: ``inf``) among ``workers``
    that take new tasks (not draining), per pool and, for the tasks of no pool
    (``None``), over every pool but the ``reserved`` ones (``any_pool_tasks = false``)."""
    largest: dict[str | None, float] = {}
    for ws in workers:
        if not ws.draining:
            n = getattr(ws, limit)
            value = float(n) if n > 0 else NO_LIMIT
            largest[ws.pool] = max(largest.get(ws.pool, 0.0), value)
            if runs_on(None, ws.pool, reserved):
                largest[None] = max(largest.get(None, 0.0), value)
    return largest


def _builtin(policy: object) -> bool:
    """``policy`` is one of Corral's own (a class of the ``policies`` package)."""
    return type(policy).__module__.split(".")[0] == "policies"


def _continue_generations(
    new: list[TaskState], gen: int, floor: float = 0, step: float = 1.0
) -> None:
    """A task of submission ``gen`` that reads outputs of earlier submissions continues
    their work: its generation (the priority policies' FIFO between submissions)
    becomes the latest of its inputs', when that is earlier than ``gen``; in dependency
    order, so a task reading such a task continues it too. A workflow submitted a task
    (or a map) at a time then ranks as one graph would: a consumer next to its inputs,
    ahead of the producers submitted after them, not behind every one of them
    (docs/policies.md#priority). A task whose inputs are all of ``gen`` keeps it: one
    graph's order is untouched. (No field of its own: a slot more on every task moved
    one-graph runs' set orders, tests/test_disk_stall.py's end-to-end stall among them.)
    Its client's turn (``fair``) moves up to that of its latest input of the same
    client too, but never behind ``floor``, the turn being served, plus its graph order
    (each task ``step`` of a turn, its client's ``1 / share``):
    a turn long served would put the new work ahead of every other client's queue (a
    review: a client mapping over its finished futures ran all 3000 new tasks before
    another client's 10)."""
    for ts in _topological(new):
        if ts.deps:
            latest = max(d.generation for d in ts.deps)
            if latest < gen:
                ts.generation = latest
                # and its client's turn: that of its latest input of the same client,
                # never behind the turn being served (its graph order on from it)
                own = [d.turn for d in ts.deps if d.client == ts.client]
                if own:
                    turn = max(max(own), floor + ts.spec.order * step)
                    if turn < ts.turn:
                        ts.turn = turn


def _topological(tasks: Iterable[TaskState]) -> list[TaskState]:
    tasks = list(tasks)
    members = set(tasks)
    out: list[TaskState] = []
    done: set[TaskState] = set()
    for root in tasks:
        if root in done:
            continue
        stack: list[tuple[TaskState, bool]] = [(root, False)]
        while stack:
            ts, expanded = stack.pop()
            if ts in done:
                continue
            if expanded:
                done.add(ts)
                out.append(ts)
                continue
            stack.append((ts, True))
            for d in ts.deps:
                if d in members and d not in done:
                    stack.append((d, False))
    return out


def _takes_new(ws: WorkerState) -> bool:
    """``ws`` may be given new work (a task, a copy, an evacuated output): it neither
    drains nor is suspended nor away (its connection dropped, its id held)."""
    return not (ws.draining or ws.suspended) and ws.away is None


def _has_room(
    ws: WorkerState, ts: TaskState, held: int, added: int, coming: int, spills: bool
) -> bool:
    """An evacuated copy of ``ts``'s output fits ``ws``: its memory limit less what it
    holds now (its RSS as last told, or the ``held`` bytes of its outputs if more), less
    the copies on their way to it or planned its way by other leaving workers
    (``coming``) and less the ``added`` bytes this plan puts there is at least the
    output's size. Or ``ws`` spills now (``spills``: its spill fence is on and no spill
    was refused lately, :meth:`SchedulerState._spills_now`) and its disk has room for
    the copy and for ``coming`` and ``added``: then its memory needs room only for them
    to land beside its RSS, under its throttle fence (its limit if it has not told
    one). A copy lands whole in memory (the worker puts it in its store), and the worker
    writes outputs to disk past its spill fence at its next memory sample, least
    recently used first: the outputs it holds (``held``, often on disk already) do not
    stay in its memory (a review: survivors near their throttle fence in a memory-heavy
    run had a drained worker's large outputs computed again rather than copied); under
    the throttle fence the copy takes the worker past neither it nor its terminate
    fence (a later review: landing up to the limit passed both, and a worker killed
    there loses every output it holds). A file output (on disk) and a worker with no
    limit always have room."""
    landing = coming + added + ts.nbytes
    if ts.file or not ws.memory or max(ws.rss, held) + landing <= ws.memory:
        return True
    fence = ws.throttle_at or ws.memory
    return spills and ws.disk_free() >= landing and ws.rss + landing <= fence


def _cores_held(ws: WorkerState) -> int:
    """The cores of ``ws`` no task sent there now could use: those whose threads a
    stopped try holds (``WorkerState.held``) and those its speculative copies take (a
    copy is of a straggler: it may run as long again, or hang). With all of them held,
    ``ws`` takes no task to queue behind them (``_is_free``, ``_may_stay``, partners)."""
    return ws.held + len(ws.copies)


def _taken(ws: WorkerState) -> int:
    """The slots of ``ws`` a consumer sent there now would wait behind: its tasks and
    speculative copies, and the threads a stopped try holds (``WorkerState.held``). A
    throttled worker's producers are deferred there, on no thread, and left out: a
    consumer that arrives runs at once (docs/memory.md), and it may be what frees the
    memory they wait for. Only those not known to execute (``waiting``): a producer that
    began before the worker throttled holds its thread until it ends."""
    n = len(ws.processing) + _cores_held(ws)
    return n - sum(t.producer for t in ws.waiting) if ws.throttled else n


def _core_free(ws: WorkerState) -> bool:
    """``ws`` runs fewer tries than it has cores (``_taken``: a throttled worker's
    deferred producers do not count, else a consumer of a new category, long until one
    finishes (``unknown_long``), waits for a core they never free: a user audit's hang,
    every slot of two throttled workers held by deferred producers and a ready
    ``sum-partial`` queued for good)."""
    return _taken(ws) < ws.cores


def _live(entry: tuple[Any, ...], producer: bool) -> bool:
    """A ready heap's ``entry`` counts: its task is queued and of the heap's class
    (``producer``); else it is stale, left behind by a cancel, a failure, a re-queue or
    a class flip (``SchedulerState._reclassify``)."""
    ts: TaskState = entry[3]
    return ts.state == "queued" and ts.producer == producer


def _layer(key: Key) -> str | None:
    """The layer a key belongs to: a tuple key's name (``('random-<token>', 3, 1)``:
    one dask array's chunks), None for another key."""
    if type(key) is tuple and key and type(key[0]) is str:
        return key[0]
    return None


def _prio_key(ts: TaskState) -> tuple[Any, ...]:
    return (ts.behind, ts.prio)


_DISPATCH: dict[type, Any] = {
    GraphSubmitted: SchedulerState._graph_submitted,
    WorkerJoined: SchedulerState._worker_joined,
    WorkerLeft: SchedulerState._worker_left,
    WorkerAway: SchedulerState._worker_away,
    WorkerHeld: SchedulerState._worker_held,
    ReplicasMissing: SchedulerState._replicas_missing,
    ValuesDelivered: SchedulerState._values_delivered,
    ReplicasCopied: SchedulerState._replicas_copied,
    TasksFinished: SchedulerState._tasks_finished,
    TasksRunning: SchedulerState._tasks_running,
    CancelRequested: SchedulerState._cancel_requested,
    KeysReleased: SchedulerState._keys_released,
    FilesReleased: SchedulerState._files_released,
    PolicyChanged: SchedulerState._policy_changed,
    WorkerDraining: SchedulerState._worker_draining,
    WorkerUndrained: SchedulerState._worker_undrained,
    CategoryForgotten: SchedulerState._category_forgotten,
    TasksMoved: SchedulerState._tasks_moved,
    ProgressAsked: SchedulerState._progress_asked,
    WorkerLeaving: SchedulerState._worker_leaving,
    Suspended: SchedulerState._suspended,
    StoppedWithCluster: SchedulerState._stopped_with_cluster,
    ClusterStops: SchedulerState._cluster_stops,
    PolicyNoted: SchedulerState._policy_noted,
    ScalingChanged: SchedulerState._scaling_changed,
    WorkerMemory: SchedulerState._worker_memory,
    TaskCheckpointed: SchedulerState._checkpoint_saved,
    OutputUnreadable: SchedulerState._output_unreadable,
    CheckpointCopied: SchedulerState._checkpoint_copied,
    Tick: SchedulerState._tick,
}
