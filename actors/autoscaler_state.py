"""The autoscaler's pure core: targets, blocks, scale-in by drain, the replacement budget.

What lives here: :class:`AutoscalerState` and the events it takes and the commands it
returns. ``AutoscalerState.handle(*events) -> list[Command]`` is the only way to change
it. No anyio, no providers, no clock: events carry ``now``; the actor
(``actors/autoscaler.py``) calls the provider and the scheduler as the commands say, and
feeds back what happened as events. A virtual-clock simulation drives it the same way.

Per pool there is a *target* (``TargetSet``, from ``ScaleRequest``) and a block spec.
The scaling policy (``policies/scaling.py``) proposes how many blocks each pool should
have; the core checks the proposal (a whole number from 0 to ``max_blocks``; anything
else, or a policy that raises, is a policy error: the pool keeps its last good proposal,
or before any the blocks it has, at least its target, counted per pool in
``policy_errors_by`` and told, once per distinct problem and pool, or again after
:data:`POLICY_ERROR_EVERY` seconds, as :class:`PolicyFailed`) and converges on it:

- too few: :class:`StartBlock` (a *request*, until :class:`BlockStarted` or
  :class:`BlockStartFailed` says how it went), unless the pool gave up (below);
- too many: blocks are *retired*: running ones idle ``max_idletime`` (any idle one in
  a pool without limits) beyond the pool's target first, the longest idle first, then
  what is not there yet: requests in flight are taken back (``cancelled``: a request
  cannot be withdrawn before the provider answers, so its block is retired as soon as
  it starts; asked for again meanwhile, it counts once more), then blocks that have
  not run (pending, held before they ran; the last by block id), then other idle
  blocks, then the last by block id (after a target set with ``idle_only``, an
  alert's ``restore``: only blocks none of whose workers runs a task; a busy one is
  scaled in once a count shows it idle). A running block is capacity now, a queued
  one is not, and a floor is held by a running block. A retired
  block with workers is never stopped while a worker of it may be busy: each worker
  gets :class:`DrainWorker` (the scheduler's drain path: no new tasks,
  ``RetireWorker`` once idle, and the worker exits). The block then ends by itself
  (:class:`BlockEnded`) and its workers are reported gone as ``drained``. Only a block
  whose workers the scheduler does not know (``DrainAnswered(known=False)``: they never
  joined, so they run nothing), or that has no workers, is stopped (:class:`StopBlock`);
  a pending block's workers are asked too, as one may have joined since the core last
  heard that the block runs; a worker the scheduler did not know when asked, seen
  later in its counts (it joined since), is asked to drain then.

A pool never has more than ``max_blocks`` blocks at work: live blocks and requests,
and also the blocks drained because their workers were sent the pool's
``tasks_per_worker`` tries (``QueuesSeen.spent``) while a task still runs there
(:meth:`AutoscalerState.spent_at_work`): a replacement for such a block is asked for
when it ends (or its last task is done), or earlier only if the pool has room. Without
this, each one-task block would stop counting as its task was sent, and a pool of
``max_blocks = 2`` would hold a new block for every task in line. Other drained blocks
(before their walltime, an operator's drain) stop counting at once: their
replacements come up while they finish, for a drain period on top of ``max_blocks``.

A pool that wants blocks again while blocks it scaled in are still there *takes them
back* before it starts any (:class:`UndrainWorker`: the scheduler un-drains their workers,
which take tasks again; the answer is :class:`UndrainAnswered`): a draining worker that
is still present is capacity, and a taken-back block counts against ``max_blocks`` as
any live block does; only the shortfall is asked of the provider. Without this, a
worker drained while busy that holds outputs a client still holds (it may not leave
before they are copied to a worker that stays, and none does) sat idle beside the
pool's queue while new blocks were started beside it. Only blocks the core scaled in
itself (not stuck ones) whose workers the scheduler drains and knows are taken back,
none of whose workers it retired, drains for their walltime or its pool's
``tasks_per_worker``, or that leave on their own (the latest :class:`QueuesSeen`
says), nor one with a drain still unanswered. A worker the scheduler will not un-drain
(retired meanwhile, gone) has its block scaled in again, for good: the proposal
replaces it.

A block that ends unasked is reported (:class:`ReportGone`) with the cause its end
state says and replaced. Ends that cost nothing are expected: ``preempted`` (the batch
system took the node back) and ``walltime`` (TIMEOUT, or COMPLETED after the scheduler
drained its workers before their walltime, ``QueuesSeen.walltime`` or
``BlockEnded.walltime``; ``drained`` for another drain: an operator's, a scale-in).
A COMPLETED end is also explained by its workers' leaves (:class:`WorkersLeft`: a
worker stopped by the batch system's warning signal before its walltime, Slurm's
``--signal``, leaves as ``walltime``; ``preempted`` and ``drained`` leaves too), which
may be heard before the end or after it: a COMPLETED end unasked that nothing explains
yet is *held* (:attr:`AutoscalerState.held`): replaced at once, but reported, listed
and charged only once a leave heard explains it, every leave is heard, or
``leave_grace`` (10 s) passed, so its cause is decided once, before anything records
it. A
drain ends when the scheduler retires the worker: a block that FAILED before that
(``BlockEnded.drained`` false: the workers' stories show no retirement) crashed while
draining and is reported ``crash``, free if it was scaled in already. A requeued
block (:class:`BlockRequeued`: same job, a new incarnation) is not an end: its workers
are reported gone (``preempted`` if a preemption requeued it) and the block stays,
unless it was being scaled in: then it is stopped (the new run's workers would join
afresh and take tasks, and nothing would drain them). The
others (FAILED: ``crash``; MISSING, CANCELLED by someone else, COMPLETED unasked:
``unknown``) spend the *replacement budget*, which stops crash loops: more than
``max_replacements`` of them (and failed starts that are not the batch system's)
within ``replacement_window`` seconds and the pool *gives up* (:class:`GaveUp`) until
its target is set again or it is resumed. Each pool has its own budget: a pool that
crash-loops does not stop another's replacements.
A block a worker of which the manager refused at its Hello (:class:`WorkerRefused`: it
runs another Corral protocol version) ends as ``refused`` instead: free, and its pool
gives up at once (:class:`GaveUp` with ``refused``), since every block it started would
be refused the same way; ``resume`` asks again once the installation is fixed.

A target may also be raised for a while (:class:`TargetRaised`, ``scale(n, hold=...)``):
until then the policy sees the higher one; afterwards the target set before is back,
and the blocks beyond what the policy wants are scaled in as usual (by ``demand``, once
idle ``max_idletime``). So a scale-out never becomes a floor that nothing lowers.

A block not running yet (requested, pending or held) counts as capacity: the policy's
proposal includes it, so nothing is asked twice. With a pool's ``provisioning_timeout``
(:class:`~policies.scaling.PoolLimits`), only until then, counted from its request (or
from its requeue): a block still not running is *stuck* (:class:`BlockStuck`, counted
per pool in :attr:`AutoscalerState.stuck`). It stops counting, is scaled in as any
other (its workers asked to drain, so one that joined meanwhile finishes what it runs;
stopped once the scheduler knows none of them) and the proposal, asked again, replaces
it. That is not an unasked end: it spends no replacement budget (the batch system is
slow, the workers did not fail, and the timeout itself bounds how often it happens).
A pool that may not ask for a block now (gave up, paused, backing off) keeps its stuck
blocks: cancelling one would leave nothing in its place. The core learns that a block
runs from :class:`BlockRunning` (the provider's word; the shell looks every tick).

A block that ran and is held now (:class:`BlockHeld`: Slurm suspended it) is not an
end: it still counts, is not stuck, and the scheduler is told (:class:`HoldWorkers`)
to give its workers no new tasks; a worker of it that goes silent meanwhile is lost as
``suspended``, a free loss. When it runs again (:class:`BlockRunning`) the scheduler
is told so; workers back within the manager's grace rejoin as usual.

The batch system not answering (:class:`BlockStartFailed` with ``batch=True``) spends
no budget: the pool *backs off*, asking again at the provider's ``retry_at`` or after
its own exponential back-off (``backoff`` doubled per failure in a row, up to
``max_backoff``); a provider that stopped submitting (``suspended=True``) *pauses* the
pool until :class:`Resumed`. The latest error of each pool is kept for the status
(:attr:`AutoscalerState.errors`) until a block of it starts again.

Each end keeps the provider's words on it (``BlockEnded.detail``: for Slurm its state,
exit code and stderr; cut to :data:`MAX_DETAIL`), in the status's ends, the
:class:`ReportGone` the shell logs and, for an end that spent the budget, the pool's
:attr:`AutoscalerState.last_failure`, which :class:`GaveUp` and the metrics (the
``CorralBlocksFailing`` alert) carry.

:class:`Shutdown` stops every block (no replacements afterwards).

Every end is listed (:attr:`AutoscalerState.ends`) with its cause, a block the core
stops itself (:class:`BlockStopped`) included: ``stuck``, ``shutdown`` while closing,
else the drain's (``drained``: scaled in, or requeued while it was drained). Each end
and requeue is also counted per pool and cause, ever (:attr:`AutoscalerState.ended_by`,
the ``corral_block_ends_total`` metric).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from policies import DEFAULTS, REGISTRY, PoolView, ScalingPolicy
from policies.problems import POLICY_ERROR_EVERY, PolicyProblems
from policies.scaling import DELAYS_KEPT, HISTORY, LoadView, PoolLimits
from runtime.errors import PoolNameError
from runtime.messages import ANY_POOL, pool_name_problem
from runtime.messages import BlockEndInfo as BlockEnd

__all__ = [
    "MAX_BLOCKS",
    "POLICY_ERROR_EVERY",
    "AutoscalerConfig",
    "AutoscalerState",
    "BatchProblem",
    "BlockEnd",
    "BlockEnded",
    "BlockHeld",
    "BlockLost",
    "BlockRecord",
    "BlockRequeued",
    "BlockRunning",
    "BlockStartFailed",
    "BlockStarted",
    "BlockStopped",
    "BlockStuck",
    "Command",
    "DrainAnswered",
    "DrainWorker",
    "Event",
    "GaveUp",
    "HeldEnd",
    "HoldWorkers",
    "PolicyChanged",
    "PolicyFailed",
    "PoolState",
    "QueuesSeen",
    "ReportGone",
    "Resumed",
    "Shutdown",
    "StartBlock",
    "StopBlock",
    "TargetRaised",
    "TargetSet",
    "Tick",
    "UndrainAnswered",
    "UndrainWorker",
    "WorkerRefused",
    "WorkersLeft",
    "bounded_detail",
    "brief_detail",
    "check_blocks",
    "check_pool",
]

#: block states (``BlockState`` values in ``actors/providers.py``) that are not final
LIVE_STATES = frozenset({"pending", "running", "held"})

#: how many ended blocks the core remembers for the status
MAX_ENDS = 50

#: the most characters of a block's detail (the provider's words: Slurm's state, exit
#: code, the head and tail of its stderr) the core keeps with an end
MAX_DETAIL = 4000


def bounded_detail(detail: str, most: int = MAX_DETAIL) -> str:
    """``detail`` cut to at most ``most`` characters, keeping its head and tail (where
    a failure says why: the first lines of a stderr and its last)."""
    if len(detail) <= most:
        return detail
    mark = f"\n[... {len(detail) - most} characters ...]\n"
    keep = max(most - len(mark), 0)
    return detail[: keep // 2] + mark + detail[len(detail) - (keep - keep // 2) :]


def policy_failing_text(policy: str, pool: str, problem: str, kept: int) -> str:
    """Why ``pool`` gets no more workers while its scaling policy fails, and what to do:
    the client's "no worker to run the ready tasks" warning and the console's status
    say it so."""
    return (
        f"the scaling policy {policy!r} fails for pool {pool} ({problem}): the pool keeps "
        f"its last good proposal, {kept} block(s), until the policy answers again. Set a "
        "working scaling policy (await cluster.set_policy('scaling', NAME); console: "
        "policy set scaling NAME) or scale(n, pool) the pool; the manager's log has the "
        "error (docs/policies.md#scaling)"
    )


def brief_detail(detail: str, tail: int = 2) -> str:
    """A block's detail in a few lines: its first (Slurm's state and exit code, where
    its stderr is) and its last ``tail`` (where a failure usually says why)."""
    rows = [r for r in detail.splitlines() if r.strip()]
    if len(rows) <= tail + 1:
        return "\n".join(rows)
    return "\n".join([rows[0], *rows[-tail:]])


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class TargetSet(Event):
    """Keep ``n`` blocks in ``pool``, each made from ``spec`` (opaque to the core: the
    shell hands it to the provider). Clears the pool's giving up. ``limits``: the
    pool's configured limits (min, max, init blocks, parallelism, idle time), which the
    scaling policy sees and whose ``max_blocks`` the core enforces (``n`` is kept
    within ``min_blocks`` and ``max_blocks``); None keeps those the pool has (if any).
    ``idle_only``: until the next target, blocks beyond the proposal are scaled in
    only once they run nothing (an alert's ``restore``: the blocks it added go as they
    go idle, not drained busy a second after they joined); False (an operator's
    ``scale``): busy ones are drained at once if there are not enough idle ones."""

    pool: str
    n: int
    spec: Any
    limits: PoolLimits | None = None
    idle_only: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class TargetRaised(Event):
    """Keep at least ``n`` blocks in ``pool`` until ``until`` (the core's clock), then
    go back to its target (:class:`TargetSet`): a scale-out that leaves scaling in to
    the policy. A later raise replaces an earlier one."""

    pool: str
    n: int
    until: float


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStarted(Event):
    """The provider answered :class:`StartBlock` ``request`` with block ``block`` (its
    workers, by id, and its state: ``pending``, ``running``, or already final)."""

    request: int
    block: str
    workers: tuple[str, ...]
    state: str = "running"


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStartFailed(Event):
    """The provider raised on :class:`StartBlock` ``request``. ``batch``: the batch
    system did not answer or refused (``command`` says which call): the pool backs off
    (until ``retry_at`` when the provider says, else by its own back-off) and spends no
    budget; ``suspended``: the provider stopped submitting until resumed (the pool
    pauses). Any other failure counts as an unasked end."""

    request: int
    error: str
    batch: bool = False
    command: str = ""
    retry_at: float | None = None
    suspended: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class BlockEnded(Event):
    """The provider says ``block`` reached the final ``state``. ``drained``: the
    scheduler had drained a worker of it since it joined (its story says so), whether
    or not a count showed it (an idle worker is drained, retired and gone between two
    ticks); with ``state`` ``failed``: it retired the worker (told it to stop), so the
    end is the drain's (a block that failed before that crashed, draining or not).
    ``walltime``: that drain was the scheduler's own, because the worker's walltime
    was near (not an operator's drain, nor a scale-in). ``known``: the shell read the
    stories; False when the scheduler did not answer in time, so ``drained`` says
    nothing (a block being scaled in that fails is then taken for the drain's end,
    not for a crash: no crash is reported without the stories showing one)."""

    block: str
    state: str
    drained: bool = False
    walltime: bool = False
    known: bool = True
    #: the provider's words on how it ended (Slurm's state, exit code, the head and tail
    #: of its stderr and where that file is); kept with the end, cut to MAX_DETAIL
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkersLeft(Event):
    """The scheduler heard these workers say they leave, or saw them leave: ``left``,
    by worker id, the cause of each (``walltime``, ``preempted``, ``drained``, ...: its
    story's latest ``left:CAUSE``, else ``leaving:CAUSE``). It may come before its
    block's :class:`BlockEnded` or after it: a block that ends ``completed`` unasked
    is classified by its workers' leaves (:attr:`AutoscalerState.held`)."""

    left: Mapping[str, str]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRefused(Event):
    """The manager refused ``worker`` at its Hello (``reason``: it runs another Corral
    protocol version, so a replacement started from the same installation would be
    refused too). Its block's end is then ``refused``: free, and the pool gives up at
    once, saying why, instead of replacing it (:class:`GaveUp` with ``refused``)."""

    worker: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class BlockRequeued(Event):
    """The batch system requeued ``block`` (same job, run ``incarnation``, counted from
    1) because of ``cause`` (``preempted``, or ``requeued`` for any other reason): its
    workers of the earlier run are gone; the block itself lives on (pending)."""

    block: str
    incarnation: int
    cause: str = "preempted"


@dataclasses.dataclass(frozen=True, slots=True)
class BlockRunning(Event):
    """The provider says ``block`` (started ``pending`` or ``held``, or requeued) runs
    now."""

    block: str


@dataclasses.dataclass(frozen=True, slots=True)
class BlockHeld(Event):
    """The provider says ``block`` is held now. One that ran (seen running, or a worker
    of it known to the scheduler) is suspended (Slurm's SUSPENDED: its processes are
    stopped, they go silent and may come back when it resumes); one that never ran is
    left as it was (not running yet)."""

    block: str


@dataclasses.dataclass(frozen=True, slots=True)
class Resumed(Event):
    """An operator resumed ``pool``: ask for its blocks again now (clears its pause,
    its back-off and its giving up)."""

    pool: str


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStopped(Event):
    """:class:`StopBlock` was carried out: ``block`` is stopped (in ``state``)."""

    block: str
    state: str = "scaled-in"


@dataclasses.dataclass(frozen=True, slots=True)
class DrainAnswered(Event):
    """The scheduler's answer to :class:`DrainWorker`: it knows ``worker`` and drains it
    (``known``), or it does not know it (the worker never joined: it runs nothing)."""

    worker: str
    known: bool


@dataclasses.dataclass(frozen=True, slots=True)
class UndrainAnswered(Event):
    """The scheduler's answer to :class:`UndrainWorker`: it un-drained ``worker`` (``ok``:
    it takes tasks again), or would not (``why``: retired meanwhile, gone, drained for
    its walltime, ...; or no answer in time)."""

    worker: str
    ok: bool
    why: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class QueuesSeen(Event):
    """Ready tasks per pool, as the scheduler counts them (``"*"``: any pool), and, if
    known, the tasks each worker has in hand (``processing``, by worker id: the workers
    the scheduler knows), and the workers it drains (``draining``: a block whose
    workers the scheduler drained, e.g. before their walltime, ends on purpose). With
    ``processing`` the core knows which running blocks are
    idle (every worker of it known and running nothing) and since when, and how many
    tasks are active per pool (its ready tasks, those of any pool, and those its
    blocks run). ``upcoming``, if the strategy looks ahead: the scheduler's next wave
    per pool (``"*"``: any pool), the seconds until each of its tasks is expected to be
    ready (``UpcomingRequest``). ``leaving``: the workers among ``draining`` that
    leave on their own (they said so: a preemption notice, a signal): a block all of
    whose workers the scheduler drains stops counting at once, unless one of them
    leaves on its own (such a block may be requeued and run again). ``walltime``: the
    workers among ``draining`` the scheduler drains because their walltime is near; the
    others were drained by an operator (or for a scale-in): a drained block's end is
    ``walltime`` or ``drained`` by this, not by whether its pool has a walltime.
    ``spent``: the workers among ``draining`` drained because they were sent their
    pool's ``tasks_per_worker`` tries (:meth:`AutoscalerState.spent_at_work`).
    ``retired``: the workers among ``draining`` the scheduler retired (told to stop):
    their blocks are never taken back."""

    queued: Mapping[str, int]
    processing: Mapping[str, int] | None = None
    draining: frozenset[str] = frozenset()  #: workers the scheduler drains (or retired)
    upcoming: Mapping[str, Sequence[float]] | None = None
    leaving: frozenset[str] = frozenset()  #: of those, the ones leaving on their own
    walltime: frozenset[str] = frozenset()  #: of those, the ones drained for their walltime
    #: of those, the ones drained because they were sent their pool's tasks_per_worker
    #: tries: their block still counts against max_blocks while a task runs there
    spent: frozenset[str] = frozenset()
    retired: frozenset[str] = frozenset()  #: of those, the ones told to stop
    #: per configured pool, the ready tasks of ``queued`` it may run that ask for more
    #: cores or memory than its workers have (``DemandRequest``): its blocks could never
    #: run them, so they are no demand for it
    unfit: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyChanged(Event):
    policy: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Tick(Event):
    """Time passed; nothing else happened."""


@dataclasses.dataclass(frozen=True, slots=True)
class Shutdown(Event):
    """Stop every block; start and replace nothing any more."""


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class StartBlock(Command):
    """Ask the provider for a block of ``spec``; answer with :class:`BlockStarted` or
    :class:`BlockStartFailed` for ``request``."""

    request: int
    pool: str
    spec: Any


@dataclasses.dataclass(frozen=True, slots=True)
class StopBlock(Command):
    """Stop ``block`` (it runs nothing: no worker of it joined, or the cluster is
    shutting down); answer with :class:`BlockStopped`."""

    block: str


@dataclasses.dataclass(frozen=True, slots=True)
class DrainWorker(Command):
    """Ask the scheduler to drain ``worker`` (of ``block``); answer with
    :class:`DrainAnswered`."""

    worker: str
    block: str


@dataclasses.dataclass(frozen=True, slots=True)
class UndrainWorker(Command):
    """Ask the scheduler to un-drain ``worker`` (of ``block``, scaled in and now taken
    back: the pool wants it again): it takes tasks again. Answer with
    :class:`UndrainAnswered`."""

    worker: str
    block: str


@dataclasses.dataclass(frozen=True, slots=True)
class ReportGone(Command):
    """Tell the scheduler that ``block``'s workers are gone, with ``cause``; ``state`` is
    how the block ended (``requeued``: it did not end, the batch system runs it again as
    run ``incarnation``); ``detail``: the provider's words on it (bounded);
    ``scaled_in``: a requeued block the pool stops at once (it was being scaled in),
    so it does not come back. The last three are for the log: two reports are equal
    without them."""

    block: str
    workers: tuple[str, ...]
    cause: str
    state: str
    detail: str = dataclasses.field(default="", compare=False)
    incarnation: int = dataclasses.field(default=1, compare=False)
    scaled_in: bool = dataclasses.field(default=False, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class HoldWorkers(Command):
    """Tell the scheduler that ``block``'s ``workers`` are suspended (``held``: give them
    no new tasks; one that goes silent meanwhile is lost as ``suspended``, a free
    loss), or that they run again (``held`` False)."""

    block: str
    workers: tuple[str, ...]
    held: bool


@dataclasses.dataclass(frozen=True, slots=True)
class BatchProblem:
    """The latest failed submission of a pool: the ``command`` and its ``error``,
    ``at`` (the core's clock), whether the provider ``suspended`` submissions, and when
    the pool asks again (``retry_at``; None while suspended); ``since``: when the first
    of the failures in a row was (the core's clock)."""

    command: str
    error: str
    at: float
    suspended: bool
    retry_at: float | None
    failures: int = 1  #: in a row
    since: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStuck(Command):
    """``block`` of ``pool`` is not running (``state``) ``age`` seconds after its
    request, past the pool's ``timeout``: it no longer counts and is scaled in (its
    :class:`DrainWorker` or :class:`StopBlock` follow); the proposal replaces it. For
    the log and the alerts: nothing to carry out."""

    block: str
    pool: str
    state: str
    age: float
    timeout: float


@dataclasses.dataclass(frozen=True, slots=True)
class BlockLost(Command):
    """Workers of ``block`` of ``pool`` that joined (``workers``) have been lost to the
    scheduler for ``seconds`` (silent past its timeout, not back within the grace for a
    rejoin) while the provider still says the block runs: a worker process stopped,
    hung or cut off from the manager. Its end is listed as ``lost``, charged to the
    replacement budget, and the proposal replaces it at once. If they were all its
    workers that joined, it is stopped (:class:`StopBlock` follows); else (lost in
    part) its other workers are drained (:class:`DrainWorker` follows) and it is
    stopped once they have left. For the log: nothing to carry out."""

    block: str
    pool: str
    workers: tuple[str, ...]
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class GaveUp(Command):
    """``pool``'s workers keep ending (``ended`` in ``window`` seconds): no more
    replacements until its target is set again. ``latest``: the latest of those ends
    and why (:attr:`AutoscalerState.last_failure`; for the log: not compared)."""

    pool: str
    ended: int
    window: float
    latest: str = dataclasses.field(default="", compare=False)
    #: the manager refused the pool's workers (another Corral version,
    #: :class:`WorkerRefused`): it gave up at the first such end, not after a crash loop
    refused: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyFailed(Command):
    """The scaling policy failed for ``pool``: ``problem`` (it raised, with the text, or
    what it answered); the pool keeps ``kept`` blocks instead; ``errors``: the pool's
    policy errors so far. Once per distinct problem of a pool, and again every
    :data:`POLICY_ERROR_EVERY` seconds while it goes on. For the log and the cluster's
    story: nothing to carry out."""

    pool: str
    problem: str
    kept: int
    errors: int
    policy: str = ""


# ----------------------------------------------------------------------------- state


@dataclasses.dataclass(slots=True)
class AutoscalerConfig:
    max_replacements: int = 10  #: unasked ends tolerated within the window
    replacement_window: float = 60.0  #: seconds
    max_blocks: int = 1024  #: per pool: the most any proposal may ask for
    #: the most blocks of a pool without limits of its own (None: ``max_blocks``): the
    #: pool of ``Cluster(workers=N)`` or ``Cluster(processes=N)``, whose workers all run
    #: on this machine; a target above it is refused (ValueError), nothing started
    #: (None: such a target is kept, its blocks capped at ``max_blocks``)
    max_unconfigured: int | None = None
    backoff: float = 2.0  #: seconds after a first batch-system failure, doubled per failure
    max_backoff: float = 120.0  #: seconds, the longest back-off
    #: seconds a block that ended ``completed`` unasked, none of whose drains explains
    #: it, waits for its workers' leaves (:class:`WorkersLeft`) before it is taken as
    #: ``unknown`` (and spends the budget): a worker stopped by the batch system's
    #: warning signal before its walltime (Slurm's ``--signal``) leaves as ``walltime``,
    #: and the scheduler may hear so after the provider saw the job end
    leave_grace: float = 10.0
    #: seconds a running block may go on after every worker of it that joined has left
    #: the scheduler without a word (lost: silent past the manager's worker timeout,
    #: not back within its grace for a rejoin) before it is stopped and replaced as
    #: ``lost`` (:class:`BlockLost`): a worker stopped (SIGSTOP), hung or cut off
    #: whose process the provider still reports running (None: never)
    lost_grace: float | None = 60.0


@dataclasses.dataclass(slots=True)
class BlockRecord:
    """One block as the core sees it."""

    block_id: str
    pool: str
    workers: tuple[str, ...]
    state: str  #: pending, running, held (the provider's word, until it ends)
    retiring: bool = False  #: chosen for scale-in
    stopping: bool = False  #: StopBlock sent
    draining: set[str] = dataclasses.field(default_factory=set)  #: drain asked, no answer
    drained: set[str] = dataclasses.field(default_factory=set)  #: the scheduler drains them
    unknown: set[str] = dataclasses.field(default_factory=set)  #: the scheduler knows not
    idle_since: float | None = None  #: when its workers were first seen all idle
    incarnation: int = 1  #: the batch system's run of it (a requeue starts the next)
    sched_drained: bool = False  #: the scheduler was seen draining a worker of it
    #: ... because that worker's walltime was near (not an operator's drain)
    walltime: bool = False
    since: float = 0.0  #: when it started (or was requeued): its age while not running
    stuck: bool = False  #: scaled in because it was not running by its provisioning timeout
    suspended: bool = False  #: held after it ran (the scheduler was told: HoldWorkers)
    #: drained because its workers were sent their pool's ``tasks_per_worker`` tries:
    #: it counts against max_blocks while a task runs there (``spent_at_work``)
    spent: bool = False
    #: scaled in by the core itself (a proposal below the blocks it had): it may be
    #: taken back while its workers are still there (:class:`UndrainWorker`)
    scaled_in: bool = False
    #: a take-back of it was refused (a worker retired meanwhile): it leaves for good
    leaves: bool = False
    #: workers asked to un-drain (:class:`UndrainWorker`), no answer yet
    undraining: set[str] = dataclasses.field(default_factory=set)
    #: of ``drained``, those a count showed draining (``QueuesSeen.draining``): one a
    #: later count shows known but not draining was taken back by someone else
    seen_draining: set[str] = dataclasses.field(default_factory=set)
    #: counted again because an operator took a worker of it back (``undrain``), not
    #: the core: a refused :class:`UndrainWorker` for its other workers leaves it counted
    by_operator: bool = False
    #: its other workers to un-drain, so that an operator's take-back of one worker of a
    #: block the core scaled in takes the whole block back (sent by ``_converge`` if
    #: the proposal keeps the block)
    rejoin: set[str] = dataclasses.field(default_factory=set)
    #: its workers' leaves heard (:class:`WorkersLeft`): worker id -> cause
    left: dict[str, str] = dataclasses.field(default_factory=dict)
    #: why the manager refused a worker of it at its Hello (:class:`WorkerRefused`;
    #: "": none was)
    refused: str = ""
    #: its workers the scheduler was seen to know (they joined, in a count)
    joined: set[str] = dataclasses.field(default_factory=set)
    #: since when each worker of it that joined has been out of the scheduler's count
    #: while the provider says it runs (not back, no leave on purpose heard): each its
    #: own, so a worker back does not leave its grace to another gone later
    missing_since: dict[str, float] = dataclasses.field(default_factory=dict)
    #: why it was stopped because its workers were lost while it ran
    #: (:class:`BlockLost`; "": it was not)
    lost: str = ""


@dataclasses.dataclass(slots=True)
class HeldEnd:
    """A block that ended ``completed`` unasked whose cause waits for its workers'
    leaves (:attr:`AutoscalerState.held`): decided once each worker's leave is heard,
    or at ``until`` with what was heard (the core's clock)."""

    record: BlockRecord
    state: str  #: the provider's final state
    at: float  #: when it ended (the core's clock)
    until: float  #: decided by then
    detail: str = ""


#: the leaves that explain a block's ``completed`` end, the first found among its
#: workers' leaves winning: the job reached its walltime, the batch system took the
#: node back, or the scheduler drained them
FREE_LEAVES = ("walltime", "preempted", "drained")


@dataclasses.dataclass(slots=True)
class PoolState:
    """One pool: what the user asked for, what the policy proposed (as checked) and the
    counts as of the latest event."""

    pool: str
    target: int
    spec: Any
    limits: PoolLimits | None = None  #: configured limits (None: not configured)
    desired: int = 0  #: the latest proposal, as checked by the core
    #: the latest proposal the policy made that was a whole number (clamped): what the
    #: pool keeps while the policy fails (None: it never made one)
    good: int | None = None
    blocks: int = 0  #: live blocks not retiring
    requested: int = 0  #: StartBlock sent, no answer yet
    retiring: int = 0  #: blocks being scaled in
    raised: int = 0  #: a raised target (TargetRaised), in force until ``raised_until``
    #: blocks beyond the proposal are scaled in only once idle (``TargetSet.idle_only``)
    idle_only: bool = False
    raised_until: float = 0.0
    #: tasks seen arriving: ``(when, how many)``, each rise of ``active`` between two
    #: counts, over the last ``HISTORY`` seconds (for the ``demand`` forecast)
    arrivals: deque[tuple[float, int]] = dataclasses.field(default_factory=deque)
    last_active: int | None = None  #: ``active`` at the latest count
    #: ``active`` and the next wave (``upcoming``, however far) at the latest count
    demand: int | None = None
    #: the latest blocks' delays from request to running, seconds
    provisioning: deque[float] = dataclasses.field(
        default_factory=lambda: deque(maxlen=DELAYS_KEPT)
    )
    #: its blocks that have come up (run), each once (``provisioning`` keeps only the
    #: latest delays): the ``demand`` strategy keeps the blocks asked at the start
    #: until ``init_blocks`` came up
    came_up: int = 0
    #: ``demand`` as counted before the latest count, ``(how many, until when)``, over
    #: the last ``max_idletime`` seconds: each is larger than those after it (a smaller
    #: one earlier is covered), so the first still in the window is the peak
    #: (:meth:`AutoscalerState.peak`)
    peaks: deque[tuple[int, float]] = dataclasses.field(default_factory=deque)


def _size(ps: PoolState) -> dict[str, int]:
    """The size of ``ps``'s blocks and its max_blocks, as ``block_metrics`` gives them."""
    workers = getattr(ps.spec, "workers", 1)
    slots = workers * getattr(ps.spec, "threads", 1)
    if ps.limits is None:
        return {"slots_per_block": slots, "max_blocks": 0, "workers_per_block": workers}
    return {"slots_per_block": ps.limits.slots_per_block,
            "max_blocks": ps.limits.max_blocks, "workers_per_block": workers}  # fmt: skip


class AutoscalerState:
    """Targets, blocks requested / running / ended, and the replacement budget."""

    def __init__(
        self, config: AutoscalerConfig | None = None, policy: ScalingPolicy | None = None
    ) -> None:
        self.config = config or AutoscalerConfig()
        self.policy: Any = policy or REGISTRY.create("scaling", DEFAULTS["scaling"])
        self.pools: dict[str, PoolState] = {}  #: by name, in the order first set
        self.blocks: dict[str, BlockRecord] = {}  #: live blocks by id
        self.requests: dict[int, str] = {}  #: StartBlock requests in flight -> pool
        #: requests in flight no longer wanted: their block is scaled in once it starts
        #: (a request cannot be taken back before the provider answers it)
        self.cancelled: set[int] = set()
        self.requested_at: dict[int, float] = {}  #: when each request in flight was made
        self.ended = 0  #: blocks that ended (asked or not)
        #: per pool, when its unasked ends within the window happened (its budget)
        self.replacements: dict[str, deque[float]] = {}
        self.failed: dict[str, int] = {}  #: per pool, unasked ends ever (a counter)
        #: per pool, the latest end that spent its budget and why: ``"<block> ended
        #: <state> (<cause>): <detail>"``, or the failed start's error (bounded)
        self.last_failure: dict[str, str] = {}
        self.gave_up: set[str] = set()  #: pools whose workers kept ending
        self.paused: set[str] = set()  #: pools whose provider stopped submitting
        self.retry_at: dict[str, float] = {}  #: pools backing off: no request before then
        self.errors: dict[str, BatchProblem] = {}  #: the latest failed submission per pool
        #: the latest ends and requeues (``at``: the core's clock)
        self.ends: deque[BlockEnd] = deque(maxlen=MAX_ENDS)
        #: per pool, per cause: the ends and requeues listed in ``ends``, ever
        self.ended_by: dict[str, dict[str, int]] = {}
        #: blocks that ended ``completed`` unasked, unexplained so far, whose cause waits
        #: for their workers' leaves (at most ``leave_grace``), by id: not live (their
        #: replacements are asked for at once), not listed in ``ends`` yet
        self.held: dict[str, HeldEnd] = {}
        self.closing = False
        #: policy errors per pool, the latest as text (for the status), and what to tell
        #: (:data:`POLICY_ERROR_EVERY`): the scheduler's core keeps its own, per kind
        self.problems = PolicyProblems()
        self.policy_errors_by = self.problems.by  #: per pool
        self.policy_problem = self.problems.problem  #: per pool, the latest as text
        #: per pool whose latest ask of the policy failed, what went wrong (it keeps its
        #: last good proposal until the policy answers again, or another is set)
        self.policy_failing: dict[str, str] = {}
        self.stuck: dict[str, int] = {}  #: per pool: blocks found stuck (BlockStuck), ever
        self.queued: Mapping[str, int] | None = None
        #: per pool, the ready tasks of ``queued`` its blocks could never run
        #: (:attr:`QueuesSeen.unfit`): no demand for it
        self.unfit: Mapping[str, int] = {}
        self.processing: Mapping[str, int] | None = None  #: tasks in hand per worker
        #: workers the latest count showed going for good (retired, leaving on their
        #: own, drained for their walltime or tasks_per_worker): never taken back
        self.going: frozenset[str] = frozenset()
        #: per pool: blocks taken back (their drain undone, :class:`UndrainWorker`), ever
        self.taken_back: dict[str, int] = {}
        #: per pool: blocks counted again because an operator took a worker of theirs
        #: back (the console's ``undrain``, :meth:`_undrained_elsewhere`), ever
        self.taken_back_by_operator: dict[str, int] = {}
        #: the scheduler's next wave per pool, as last seen (``QueuesSeen.upcoming``)
        self.upcoming: dict[str, tuple[float, ...]] = {}
        self._ids = itertools.count(1)
        self._out: list[Command] = []
        self._now = 0.0

    # ----------------------------------------------------------------- the one mutator

    def handle(self, *events: Event) -> list[Command]:
        """Apply ``events`` in order; return the commands to carry out."""
        for ev in events:
            self._now = ev.now
            method = _DISPATCH.get(type(ev))
            if method is None:
                raise TypeError(f"AutoscalerState cannot handle {type(ev).__name__}")
            method(self, ev)
            self._settle()
            self._prune()
            if not self.closing:
                self._converge()
        out, self._out = self._out, []
        return out

    # ----------------------------------------------------------------- queries

    def live(self, pool: str) -> list[BlockRecord]:
        """Blocks of ``pool`` that count towards it (started, not retiring)."""
        return [b for b in self.blocks.values() if b.pool == pool and not b.retiring]

    def counts(self) -> dict[str, int]:
        """Per pool: blocks started or requested and not retiring."""
        return {p: s.blocks + s.requested for p, s in self.pools.items()}

    def block_metrics(self, now: float, states: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """Per pool, the numbers of a ``BlockMetrics`` at ``now``: blocks by state
        (``requested``: no answer from the provider yet; else ``states[block]``, the
        provider's word now, or the core's), and the age of the oldest block that is not
        running yet (requested, pending or held), counted from its request; the pool's
        size and ``max_blocks`` (0: not configured) and its blocks that failed or ended
        unasked (those that spend the replacement budget), ever, and the latest of them
        and why (``last_failure``); whether it asks for no block until resumed
        (``suspended``: paused, or it gave up) and why (``suspended_why``: the batch
        system's latest refusal, or the latest of the blocks that kept ending); its failed
        submissions in a row (``submit_failures``: 0 once a block of it started); its
        ends and requeues ever, by cause (``ends``); its blocks scaled in and taken back,
        ever: by the core (``taken_back``) and by an operator's ``undrain``
        (``taken_back_by_operator``)."""
        out: dict[str, dict[str, Any]] = {
            pool: {"states": {}, "oldest_pending": 0.0, "target": ps.target,
                   "desired": ps.desired, **_size(ps), "failed": self.failed.get(pool, 0),
                   "ends": dict(self.ended_by.get(pool, {})),
                   "taken_back": self.taken_back.get(pool, 0),
                   "taken_back_by_operator": self.taken_back_by_operator.get(pool, 0),
                   "suspended": int(pool in self.paused or pool in self.gave_up),
                   "suspended_why": self._suspended_why(pool),
                   "last_failure": self.last_failure.get(pool, ""),
                   "submit_failures": e.failures if (e := self.errors.get(pool)) else 0}
            for pool, ps in self.pools.items()
        }  # fmt: skip

        def count(pool: str, state: str, since: float, ran: bool = False) -> None:
            m = out.setdefault(pool, {"states": {}, "oldest_pending": 0.0})
            m["states"][state] = m["states"].get(state, 0) + 1
            if state != "running" and not ran:
                m["oldest_pending"] = max(m["oldest_pending"], now - since)

        for request, pool in self.requests.items():
            count(pool, "requested", self.requested_at.get(request, now))
        for b in self.blocks.values():
            count(b.pool, states.get(b.block_id, b.state), b.since, b.suspended)
        return out

    # ----------------------------------------------------------------- handlers

    def _target_set(self, ev: TargetSet) -> None:
        check_blocks(ev.pool, ev.n)
        ps = self.pools.get(ev.pool)
        limits = ev.limits if ev.limits is not None or ps is None else ps.limits
        self._within_machine(ev.pool, ev.n, limits)
        # a configured pool's target stays within its min_blocks and max_blocks (what
        # status, the metrics and a `fit` action read as the target)
        n = ev.n if limits is None else min(max(ev.n, limits.min_blocks), limits.max_blocks)
        if ps is None:
            self.pools[ev.pool] = PoolState(ev.pool, n, ev.spec, ev.limits, idle_only=ev.idle_only)
        else:
            ps.target, ps.spec = n, ev.spec
            ps.idle_only = ev.idle_only
            if ev.limits is not None:
                ps.limits = ev.limits
        self.gave_up.discard(ev.pool)

    def _target_raised(self, ev: TargetRaised) -> None:
        check_blocks(ev.pool, ev.n)
        ps = self.pools.get(ev.pool)
        if ps is None:
            raise ValueError(f"there is no pool {ev.pool!r}")
        self._within_machine(ev.pool, ev.n, ps.limits)
        ps.raised, ps.raised_until = ev.n, ev.until

    def _within_machine(self, pool: str, n: int, limits: PoolLimits | None) -> None:
        """ValueError, before anything changes, for a target of ``n`` blocks of a pool
        without limits of its own (its workers run on this machine) above
        ``max_unconfigured``; a configured pool's target is kept within its limits (and
        without ``max_unconfigured``, an unconfigured one's blocks within ``max_blocks``)."""
        most = self.config.max_unconfigured
        if limits is None and most is not None and n > most:
            raise ValueError(
                f"scale({n}) of pool {pool!r}: a pool without max_blocks of its own (the "
                "pool of Cluster(workers=N) or Cluster(processes=N), whose workers all run "
                f"on this machine) takes at most {most} blocks here; ask for at most {most}, "
                "or give the cluster configured pools, each with the max_blocks it may "
                f"reach (Cluster(pools={{{pool!r}: {{'max_blocks': N}}}}), "
                "docs/configuration.md#pools)"
            )

    def target(self, pool: str) -> int:
        """``pool``'s target now: the one set, or a raised one while it is in force."""
        ps = self.pools[pool]
        return max(ps.target, ps.raised) if self._now < ps.raised_until else ps.target

    def _block_started(self, ev: BlockStarted) -> None:
        pool = self.requests.pop(ev.request)
        state = ev.state if ev.state in LIVE_STATES else "running"  # ends: BlockEnded
        asked = self.requested_at.pop(ev.request, self._now)
        self.blocks[ev.block] = BlockRecord(ev.block, pool, ev.workers, state, since=asked)
        if state == "running":
            self.pools[pool].provisioning.append(self._now - asked)
            self.pools[pool].came_up += 1
        self.retry_at.pop(pool, None)  # the batch system answers again
        self.errors.pop(pool, None)
        if self.closing:
            self._stop(self.blocks[ev.block])
        elif ev.request in self.cancelled:
            self.cancelled.discard(ev.request)
            self._retire(self.blocks[ev.block])  # no longer wanted since it was asked for

    def _suspended_why(self, pool: str) -> str:
        """Why ``pool`` asks for no block until resumed, "" while it asks: its batch
        system's latest refusal (paused), or the latest of the blocks that kept ending
        (gave up)."""
        if pool in self.paused:
            e = self.errors.get(pool)
            return f"its batch system refused its submissions: {e.error}" if e else (
                "its batch system refused its submissions"
            )  # fmt: skip
        if pool in self.gave_up:
            latest = self.last_failure.get(pool)
            return f"its blocks kept ending; the latest: {latest}" if latest else (
                "its blocks kept ending"
            )  # fmt: skip
        return ""

    def _block_start_failed(self, ev: BlockStartFailed) -> None:
        pool = self.requests.pop(ev.request)
        self.requested_at.pop(ev.request, None)
        self.cancelled.discard(ev.request)
        if not (ev.batch or ev.suspended):
            self.ended += 1
            self._unasked_end(pool, f"a block could not start: {ev.error}")
            return
        # The batch system did not answer or refused: not the workers' fault.
        before = self.errors.get(pool)
        failures = before.failures + 1 if before is not None else 1
        retry_at: float | None = None
        if ev.suspended or pool in self.paused:  # paused already: it stays paused
            self.paused.add(pool)
            self.retry_at.pop(pool, None)
        else:
            own = self._now + min(
                self.config.backoff * 2 ** (failures - 1), self.config.max_backoff
            )
            retry_at = ev.retry_at if ev.retry_at is not None and ev.retry_at > self._now else own
            self.retry_at[pool] = retry_at
        since = before.since if before is not None else self._now
        self.errors[pool] = BatchProblem(
            ev.command, ev.error, self._now, pool in self.paused, retry_at, failures, since
        )

    def _block_ended(self, ev: BlockEnded) -> None:
        b = self.blocks.pop(ev.block, None)
        if b is None:
            return  # stopped on purpose (BlockStopped came first) or unknown
        self.ended += 1
        b.sched_drained = b.sched_drained or ev.drained
        b.walltime = b.walltime or (ev.drained and ev.walltime)
        if b.retiring or self.closing:
            # Scaled in, or leaving: its place was given up already, so its end is
            # not replaced and spends nothing; the cause says how it went.
            if b.lost:
                cause = "lost"  # charged when it was found lost
            elif b.stuck:
                cause = "stuck"
            elif ev.state in ("preempted", "timeout", "oom"):
                cause = self._cause(b, ev.state)[0]
            elif (
                ev.state == "failed" and ev.known and not (ev.drained or b.stopping or self.closing)
            ):
                # A drained worker's block may read "failed" once it stopped (an
                # in-process worker's does): that is the drain's end only if the
                # scheduler retired the worker (its story says so). Before that, it
                # crashed while draining: its drain never finished.
                cause = "crash"
            else:
                cause = self._drain_cause(b)
            self._ended(b, ev.state, cause, False, ev.detail or b.lost)
            return
        drain_end = ev.drained and ev.state in ("completed", "failed")
        state = "completed" if drain_end else ev.state
        if state == "completed" and self._unexplained(b) and self.config.leave_grace > 0:
            # Nothing explains it yet, but a worker's leave may: the batch system's
            # warning signal (Slurm's --signal) stops a worker before its walltime,
            # which leaves as ``walltime``, and the scheduler may hear so after the
            # provider saw the job complete. Its cause waits for its workers' leaves
            # (WorkersLeft), at most ``leave_grace``; it is replaced at once.
            self.held[b.block_id] = HeldEnd(
                b, ev.state, self._now, self._now + self.config.leave_grace, ev.detail
            )
            return
        self._decide(b, ev.state, state, self._now, ev.detail)

    def _decide(self, b: BlockRecord, state: str, read: str, at: float, detail: str) -> None:
        """Report and list block ``b``'s unasked end in ``state`` (read as ``read``:
        ``completed`` for a drain's end), charging the budget if its cause may be a
        crash loop."""
        cause, charged = self._cause(b, read)
        end = self._ended(b, state, cause, charged, detail, at)
        if cause == "refused":
            self._refused(b, state)
        if charged:
            why = f"{b.block_id} ended {state} ({cause})"
            self._unasked_end(b.pool, f"{why}: {end.detail}" if end.detail else why)

    def _refused(self, b: BlockRecord, state: str) -> None:
        """Block ``b`` ended after the manager refused a worker of it: its pool gives up
        at once (every replacement would run the same installation), saying why."""
        why = bounded_detail(
            f"{b.block_id} ended {state} (refused): {b.refused}. Each block of pool "
            f"{b.pool!r} would be refused the same way, so none is started any more: "
            f"install the manager's Corral where the pool's workers run (the same "
            f"release or checkout), then `resume {b.pool}`"
        )
        self.last_failure[b.pool] = why
        if b.pool not in self.gave_up:
            self.gave_up.add(b.pool)
            self._out.append(GaveUp(b.pool, 1, self.config.replacement_window, why, refused=True))

    def _worker_refused(self, ev: WorkerRefused) -> None:
        for b in (*self.blocks.values(), *(h.record for h in self.held.values())):
            if ev.worker in b.workers:
                b.refused = b.refused or ev.reason

    def _workers_left(self, ev: WorkersLeft) -> None:
        for b in (*self.blocks.values(), *(h.record for h in self.held.values())):
            b.left.update((w, ev.left[w]) for w in b.workers if w in ev.left)

    def _settle(self, force: bool = False) -> None:
        """Decide each held end that a leave heard explains (a worker's ``walltime``),
        whose workers' leaves were all heard, or whose grace ran out (``force``: every
        one, the cluster shuts down) with what was heard."""
        for bid in sorted(self.held):
            h = self.held[bid]
            if force or self._now >= h.until or not self._unexplained(h.record):
                del self.held[bid]
                self._decide(h.record, h.state, "completed", h.at, h.detail)

    def _unexplained(self, b: BlockRecord) -> bool:
        """Block ``b``'s ``completed`` end would spend the budget, and a leave of its
        workers not heard yet may still explain it."""
        return self._cause(b, "completed")[1] and not set(b.workers) <= b.left.keys()

    def _cause(self, b: BlockRecord, state: str) -> tuple[str, bool]:
        """Why block ``b`` ended in ``state`` unasked, and whether that spends the
        replacement budget (only ends that may be a crash loop do)."""
        if b.refused and state not in ("preempted", "timeout"):
            return "refused", False  # not a crash: the pool gives up at once (_refused)
        if state == "preempted":
            return "preempted", False
        if state == "timeout":
            return "walltime", False
        if state == "completed":
            left = set(b.left.values())
            if b.walltime or "walltime" in left:
                return "walltime", False
            if left and left <= set(FREE_LEAVES):  # each leave heard explains it
                return next(c for c in FREE_LEAVES if c in left), False
            if b.sched_drained:
                return self._drain_cause(b), False
        if state == "failed":
            return "crash", True
        if state == "oom":  # killed for memory (Slurm's OUT_OF_MEMORY, the OOM killer)
            return "oom", True  # the next block would be killed too: a loop is charged
        return "unknown", True

    def _drain_cause(self, b: BlockRecord) -> str:
        """The cause of the end of block ``b``, drained: ``walltime`` when the scheduler
        drained a worker of it because its walltime was near, else ``drained`` (an
        operator's drain, or a scale-in)."""
        return "walltime" if b.walltime else "drained"

    def _ended(
        self,
        b: BlockRecord,
        state: str,
        cause: str,
        charged: bool,
        detail: str = "",
        at: float | None = None,
    ) -> BlockEnd:
        detail = bounded_detail(detail)
        self._out.append(ReportGone(b.block_id, b.workers, cause, state, detail, b.incarnation))
        at = self._now if at is None else at
        end = BlockEnd(b.block_id, b.pool, state, cause, charged, at, b.incarnation, detail)
        self._list_end(end)
        return end

    def _list_end(self, end: BlockEnd) -> None:
        """List ``end`` (an end or a requeue) and count it under its pool and cause."""
        self.ends.append(end)
        causes = self.ended_by.setdefault(end.pool, {})
        causes[end.cause] = causes.get(end.cause, 0) + 1

    def _block_requeued(self, ev: BlockRequeued) -> None:
        b = self.blocks.get(ev.block)
        if b is None or ev.incarnation <= b.incarnation:
            return  # ended, or this run was reported already
        b.incarnation = ev.incarnation
        b.idle_since = None
        b.sched_drained = False
        b.left.clear()  # the next run's workers join afresh, under the same ids
        b.joined.clear()
        b.missing_since.clear()
        b.state = "pending"
        b.suspended = False  # its workers are reported gone: the scheduler forgets them
        b.since = self._now
        cause = "preempted" if ev.cause == "preempted" else "unknown"
        stop = b.retiring and not b.stopping
        self._out.append(
            ReportGone(
                b.block_id, b.workers, cause, "requeued", incarnation=ev.incarnation,
                scaled_in=stop,
            )
        )  # fmt: skip
        self._list_end(
            BlockEnd(b.block_id, b.pool, "requeued", cause, False, self._now, ev.incarnation - 1)
        )
        if stop:
            # It was being scaled in: its workers of the run that ended were drained,
            # the new run's would join afresh and take tasks. Stop it instead.
            self._stop(b)

    def _resumed(self, ev: Resumed) -> None:
        if ev.pool not in self.pools:
            raise ValueError(f"there is no pool {ev.pool!r}")
        self.paused.discard(ev.pool)
        self.retry_at.pop(ev.pool, None)
        self.gave_up.discard(ev.pool)
        self.errors.pop(ev.pool, None)

    def _block_stopped(self, ev: BlockStopped) -> None:
        b = self.blocks.pop(ev.block, None)
        if b is not None:
            # Every end is listed with its cause: stopped because it was not running by
            # its provisioning timeout, because the cluster shuts down, or scaled in
            # (no worker of it joined, or requeued while it was being drained).
            self.ended += 1
            cause = (
                "lost" if b.lost
                else "stuck" if b.stuck
                else "shutdown" if self.closing
                else self._drain_cause(b)
            )  # fmt: skip
            self._list_end(
                BlockEnd(
                    b.block_id, b.pool, ev.state, cause, bool(b.lost), self._now,
                    b.incarnation, b.lost,
                )
            )  # fmt: skip

    def _block_running(self, ev: BlockRunning) -> None:
        b = self.blocks.get(ev.block)
        if b is not None:
            if b.suspended:  # resumed: its workers take tasks again
                b.suspended = False
                self._out.append(HoldWorkers(b.block_id, b.workers, False))
            elif b.state != "running" and not b.retiring:
                self.pools[b.pool].provisioning.append(self._now - b.since)
                if b.incarnation == 1:  # a requeued block came up before
                    self.pools[b.pool].came_up += 1
            b.state = "running"

    def _block_held(self, ev: BlockHeld) -> None:
        b = self.blocks.get(ev.block)
        if b is None or b.suspended:
            return
        # It ran: seen running, or a worker of it joined before the provider's
        # latest look said so (a block held before it ever ran is not running yet).
        joined = self.processing is not None and any(w in self.processing for w in b.workers)
        if b.state == "running" or joined:
            # Suspended: it still counts (it resumes where it was), is not stuck and
            # not idle; its workers take no new tasks until it runs again.
            b.state = "held"
            b.suspended = True
            b.idle_since = None
            self._out.append(HoldWorkers(b.block_id, b.workers, True))

    def _drain_answered(self, ev: DrainAnswered) -> None:
        for b in self.blocks.values():
            if ev.worker in b.draining:
                b.draining.discard(ev.worker)
                (b.drained if ev.known else b.unknown).add(ev.worker)
                if not b.stopping and b.unknown == set(b.workers):
                    self._stop(b)  # none of its workers joined: nothing runs there
                return

    def _undrain_answered(self, ev: UndrainAnswered) -> None:
        for b in self.blocks.values():
            if ev.worker in b.undraining:
                b.undraining.discard(ev.worker)
                if not ev.ok and b.by_operator:
                    # Completing an operator's take-back: the worker the operator took
                    # back works on; this one goes as the scheduler has it.
                    return
                if not ev.ok:
                    # Not taken back after all (retired meanwhile, gone): the block
                    # leaves, for good; the proposal replaces it. It was counted as
                    # taken back when asked: once per block, so not if another of its
                    # workers was refused already.
                    if not b.leaves:
                        self.taken_back[b.pool] -= 1
                    b.leaves = True
                    if not b.retiring and not self.closing:
                        self._retire(b)
                return

    def _queues_seen(self, ev: QueuesSeen) -> None:
        self.queued = dict(ev.queued)
        self.unfit = dict(ev.unfit)
        self.going = ev.retired | ev.leaving | ev.walltime | ev.spent
        self.upcoming = {p: tuple(ts) for p, ts in (ev.upcoming or {}).items()}
        if ev.draining:
            for b in self.blocks.values():
                if not b.retiring and ev.draining.intersection(b.workers):
                    b.sched_drained = True
                    b.walltime = b.walltime or not ev.walltime.isdisjoint(b.workers)
                    if ev.draining.issuperset(b.workers) and ev.leaving.isdisjoint(b.workers):
                        # The scheduler drains every worker of it (its walltime is
                        # near, an operator drained it): it no longer counts, so its
                        # replacement is asked for now and comes up while they finish
                        # their tasks, not a provisioning delay after. A block drained
                        # because its workers used their tasks_per_worker (``spent``)
                        # still counts against max_blocks while a task runs there
                        # (``spent_at_work``). (A worker that leaves on its own,
                        # preempted, may come back: the batch system may run its block
                        # again.)
                        b.retiring = True
                        b.drained.update(b.workers)
                        b.spent = not ev.spent.isdisjoint(b.workers)
        if ev.processing is None:
            return
        self.processing = dict(ev.processing)
        self._undrained_elsewhere(ev.draining)
        self._find_lost()
        for b in self.blocks.values():
            if b.retiring and not b.stopping and b.unknown:
                # A worker the scheduler did not know when asked to drain has joined
                # since (it runs tasks): drain it too, or nothing would ever stop it.
                for wid in sorted(w for w in b.unknown if w in self.processing):
                    b.unknown.discard(wid)
                    b.draining.add(wid)
                    self._out.append(DrainWorker(wid, b.block_id))
            idle = (
                b.state == "running"
                and not b.retiring
                and bool(b.workers)
                and all(self.processing.get(w, -1) == 0 for w in b.workers)
            )
            if not idle:
                b.idle_since = None
            elif b.idle_since is None:
                b.idle_since = ev.now
        for ps in self.pools.values():
            active = self.active(ps.pool)
            assert active is not None  # queued and processing are known
            if ps.last_active is not None and active > ps.last_active:
                ps.arrivals.append((ev.now, active - ps.last_active))
            ps.last_active = active
            if ps.demand is not None:  # it held until now
                while ps.peaks and ps.peaks[-1][0] <= ps.demand:
                    ps.peaks.pop()
                ps.peaks.append((ps.demand, ev.now))
            while ps.peaks and ps.peaks[0][1] <= ev.now - self._window(ps):
                ps.peaks.popleft()
            ps.demand = active + len(self.upcoming_in(ps.pool))
            while ps.arrivals and ps.arrivals[0][0] < ev.now - HISTORY:
                ps.arrivals.popleft()

    def _undrained_elsewhere(self, draining: frozenset[str]) -> None:
        """Count again each block being scaled in (or drained by the scheduler) a
        worker of which the scheduler knows and no longer drains: someone else took it
        back (an operator's ``undrain``), so it takes tasks and its block will not end
        (counted in :attr:`taken_back_by_operator`). The proposal then decides (a block
        too many is scaled in as any: ``demand`` once it is idle). If it keeps the
        block and the core had scaled it in, its other workers the scheduler still
        drains and may take back are un-drained too (``rejoin``, sent by
        :meth:`_converge`): the core drained them, not the operator, and a block
        counted whole must work whole. An operator's own drains of its other workers
        (a block the scheduler drained) are left as they are."""
        assert self.processing is not None
        for b in self.blocks.values():
            if not b.retiring or b.stopping or b.stuck or b.draining or self.closing:
                continue  # counted, stopped, not running, or a drain not answered yet
            b.seen_draining |= b.drained & draining
            if all(w in draining or w not in self.processing for w in b.seen_draining):
                continue
            self.taken_back_by_operator[b.pool] = self.taken_back_by_operator.get(b.pool, 0) + 1
            b.by_operator = True
            if b.scaled_in and not b.leaves:
                b.rejoin = {
                    w
                    for w in b.drained
                    if w in draining and w in self.processing and w not in self.going
                }
            b.retiring = b.scaled_in = b.leaves = b.spent = False
            b.drained.clear()
            b.seen_draining.clear()
            b.unknown.clear()
            b.idle_since = None
            b.sched_drained = not draining.isdisjoint(b.workers)

    def _policy_changed(self, ev: PolicyChanged) -> None:
        self.policy = ev.policy
        self.problems.afresh()  # a new policy's errors are told afresh
        self.policy_failing.clear()  # and it is asked afresh

    def _tick(self, ev: Tick) -> None:
        pass  # time moved: the budget window slides, the policy is asked again

    def _shutdown(self, ev: Shutdown) -> None:
        self.closing = True
        self._settle(force=True)  # reported before the shell stops
        for b in sorted(self.blocks.values(), key=lambda b: b.block_id):
            if not b.stopping:
                self._stop(b)

    # ----------------------------------------------------------------- internals

    def _unasked_end(self, pool: str, why: str) -> None:
        self.failed[pool] = self.failed.get(pool, 0) + 1
        self.last_failure[pool] = bounded_detail(why)
        ends = self.replacements.setdefault(pool, deque())
        ends.append(self._now)
        self._prune()
        if len(ends) > self.config.max_replacements and pool not in self.gave_up:
            self.gave_up.add(pool)
            self._out.append(
                GaveUp(pool, len(ends), self.config.replacement_window, self.last_failure[pool])
            )

    def _prune(self) -> None:
        horizon = self._now - self.config.replacement_window
        for pool, ends in list(self.replacements.items()):
            while ends and ends[0] < horizon:
                ends.popleft()
            if not ends:
                del self.replacements[pool]

    def spent(self, pool: str | None = None) -> int:
        """Unasked ends within the window that spent ``pool``'s replacement budget (each
        pool has its own; None: summed over the pools)."""
        if pool is not None:
            return len(self.replacements.get(pool, ()))
        return sum(len(ends) for ends in self.replacements.values())

    def _find_lost(self) -> None:
        """Stop and replace each running block a worker of which that joined has left
        the scheduler's count for ``lost_grace`` seconds (a configured pool's own, its
        ``lost_grace`` key: :attr:`PoolLimits.lost_grace`; every one that joined: stopped
        now; only some: its other workers drained first, stopped once they have left),
        though the provider says it runs and the scheduler never drained one of it (a
        drain, a walltime, a preemption notice or ``tasks_per_worker`` ends a block on
        purpose, and its end is told), nor did the worker say it left so (its leave,
        :data:`FREE_LEAVES`, heard through :meth:`lost_candidates`): a worker stopped
        (SIGSTOP), hung or cut off, whose process would otherwise hold its place in
        ``max_blocks`` (and its machine) until its walltime."""
        assert self.processing is not None
        for b in sorted(self.blocks.values(), key=lambda b: b.block_id):
            ps = self.pools.get(b.pool)  # a configured pool's own (its lost_grace key)
            grace = (
                ps.limits.lost_grace if ps is not None and ps.limits is not None
                else self.config.lost_grace
            )  # fmt: skip
            known = [w for w in b.workers if w in self.processing]
            b.joined.update(known)
            for w in known:
                b.left.pop(w, None)  # back (or still there): a leave heard is of a past life
            if b.lost and not (b.stopping or b.draining or known):
                # Its other workers were drained and left; the lost one still holds the
                # job (a stopped or hung process): stop it.
                self._stop(b)
                continue
            missing = sorted(
                w for w in b.joined if w not in self.processing and b.left.get(w) not in FREE_LEAVES
            )
            if (
                not missing
                or b.state != "running"
                or b.retiring
                or b.suspended
                or b.sched_drained
                or grace is None
            ):
                b.missing_since.clear()
                continue
            # Each worker's grace runs from when it went: one back leaves the count.
            since = {w: b.missing_since.get(w, self._now) for w in missing}
            b.missing_since = since
            seconds = self._now - min(since.values())
            if seconds < grace:
                continue
            workers = tuple(missing)
            b.lost = (
                f"{b.block_id} lost: its worker(s) {', '.join(workers)} left the scheduler "
                f"without a word {seconds:.0f} s ago while the block still ran (a worker "
                "stopped, hung or cut off from the manager); "
            )
            if known:
                # Part of it is lost: it no longer counts (its replacement is asked for
                # now); its other workers finish what they run (drained, never taken
                # back), then it is stopped.
                b.lost += (
                    f"its other worker(s) {', '.join(known)} drain, then it is stopped; replaced"
                )
            else:
                b.lost += "stopped and replaced"
            self._out.append(BlockLost(b.block_id, b.pool, workers, seconds))
            self._unasked_end(b.pool, b.lost)
            if known:
                b.leaves = True
                self._retire(b)
            else:
                self._stop(b)

    def lost_candidates(self) -> tuple[str, ...]:
        """The workers that joined of the running blocks a worker of which the
        scheduler no longer knows (:meth:`_find_lost` counts down their
        ``lost_grace``): the shell asks the scheduler why they left
        (:class:`WorkersLeft`), so a worker that left on purpose is not taken for lost."""
        known = self.processing or {}
        return tuple(
            sorted(
                w
                for b in self.blocks.values()
                if b.missing_since
                for w in b.joined
                if w not in known
            )
        )

    def _stop(self, b: BlockRecord) -> None:
        b.retiring = b.stopping = True
        self._out.append(StopBlock(b.block_id))

    def _retire(self, b: BlockRecord) -> None:
        """Scale ``b`` in: stop it if it has no workers; else drain them, a pending
        block's too (one may have joined since the core last heard that the block
        runs): it is stopped once the scheduler knows none of them."""
        b.retiring = True
        b.scaled_in = not (b.stuck or b.leaves)  # may be taken back (_take_back)
        if not b.workers:
            self._stop(b)  # no worker of it started
            return
        for wid in b.workers:
            b.draining.add(wid)
            self._out.append(DrainWorker(wid, b.block_id))

    def _takeable(self, pool: str) -> list[BlockRecord]:
        """The blocks of ``pool`` the core scaled in that may be taken back, the ones
        that run the most first (then by block id): running, not stopped, every drain
        answered, each worker the scheduler knows still there (in the latest count, when
        there is one) and none going for good (:attr:`going`)."""
        found = [
            b
            for b in self.blocks.values()
            if b.pool == pool
            and b.retiring
            and b.scaled_in
            and not (b.stopping or b.stuck or b.leaves or b.spent or b.draining)
            and b.state == "running"
            and b.drained
            and self.going.isdisjoint(b.workers)
            and (self.processing is None or all(w in self.processing for w in b.drained))
        ]
        busy = self.processing or {}
        return sorted(
            found, key=lambda b: (-sum(busy.get(w, 0) for w in b.workers), _natural(b.block_id))
        )

    def _take_back(self, b: BlockRecord) -> None:
        """Count scaled-in ``b`` again: its workers the scheduler drains are un-drained
        (:class:`UndrainWorker`); those it never knew are left to join as any worker."""
        b.retiring = b.scaled_in = b.by_operator = False
        b.idle_since = None
        b.undraining = set(b.drained)
        b.drained.clear()
        b.seen_draining.clear()
        b.unknown.clear()
        self.taken_back[b.pool] = self.taken_back.get(b.pool, 0) + 1
        for wid in sorted(b.undraining):
            self._out.append(UndrainWorker(wid, b.block_id))

    def _runs_any(self, pool: str) -> bool:
        """``pool``'s workers run tasks of no pool too (its limits' ``any_pool_tasks``;
        a pool without limits: yes), so they count in its demand."""
        ps = self.pools.get(pool)
        return ps is None or ps.limits is None or ps.limits.any_pool_tasks

    def ready_for(self, pool: str) -> int | None:
        """Ready tasks ``pool`` may run: its own and, unless it runs only those
        (``any_pool_tasks = false``), those of no pool, less those its workers could
        never run (:attr:`QueuesSeen.unfit`: they ask for more cores or memory than its
        configuration gives them); None until the scheduler's counts were seen."""
        if self.queued is None:
            return None
        own = self.queued.get(pool, 0)
        ready = own + self.queued.get(ANY_POOL, 0) if self._runs_any(pool) else own
        return max(ready - self.unfit.get(pool, 0), 0)

    def active(self, pool: str) -> int | None:
        """Tasks ``pool`` may run that are ready (:meth:`ready_for`) or in the hands of
        its blocks' workers (not those being scaled in); None until the scheduler's
        counts were seen."""
        ready = self.ready_for(pool)
        if ready is None or self.processing is None:
            return None
        running = sum(self.processing.get(w, 0) for b in self.live(pool) for w in b.workers)
        return ready + running

    def spent_at_work(self, pool: str) -> int:
        """Blocks of ``pool`` drained because their workers were sent the pool's
        ``tasks_per_worker`` tries that still run a task (or whose tasks are not
        counted yet): unlike other drained blocks, they count against ``max_blocks``,
        so a pool of one-task blocks never has more blocks at work than that."""
        return sum(
            1
            for b in self.blocks.values()
            if b.pool == pool
            and b.spent
            and (self.processing is None or any(self.processing.get(w, 0) for w in b.workers))
        )

    def upcoming_in(self, pool: str) -> tuple[float, ...]:
        """The next wave ``pool`` may run (its own and, as for :meth:`ready_for`, those
        of no pool), as last seen: the seconds until each task is expected to be ready,
        shortest first."""
        own = self.upcoming.get(pool, ())
        anywhere = self.upcoming.get(ANY_POOL, ()) if self._runs_any(pool) else ()
        return tuple(sorted((*own, *anywhere))) if anywhere else own

    def idle_for(self, pool: str) -> tuple[float, ...]:
        """Seconds each idle block of ``pool`` (not retiring) has been idle, longest
        first."""
        since = sorted(b.idle_since for b in self.live(pool) if b.idle_since is not None)
        return tuple(self._now - t for t in since)

    @staticmethod
    def _window(ps: PoolState) -> float:
        """Seconds a block of ``ps`` not running yet stays wanted after the demand for
        it dropped: its ``max_idletime``, as long as a running block stays idle (0 for
        a pool without limits)."""
        return ps.limits.max_idletime if ps.limits is not None else 0.0

    def waiting_for(self, pool: str) -> tuple[float, ...]:
        """Seconds since each block of ``pool`` not running yet (not retiring) and each
        request of it in flight (not cancelled) was asked for, longest first."""
        since = [b.since for b in self.live(pool) if _waiting(b)]
        since += [
            self.requested_at.get(r, self._now)
            for r, p in self.requests.items()
            if p == pool and r not in self.cancelled
        ]
        return tuple(self._now - t for t in sorted(since))

    def peak(self, pool: str) -> int | None:
        """The most tasks ``pool`` had active (:meth:`active`) or in its next wave
        (:meth:`upcoming_in`, however far ahead) at a count over the last
        ``max_idletime`` seconds, now included (None until counted): the ``demand``
        strategy keeps the blocks not running yet that this wants, so a dip shorter
        than that cancels none (no block cancelled and asked for again a moment
        later)."""
        ps = self.pools[pool]
        if ps.demand is None:
            return None
        since = self._now - self._window(ps)
        earlier = next((n for n, until in ps.peaks if until > since), 0)
        return max(ps.demand, earlier)

    def _desired(self, ps: PoolState) -> int:
        """The policy's proposal for ``ps``, checked: clamped to 0..max_blocks (and the
        pool's own max_blocks); if it is not a whole number, or the policy raises, a
        policy error: the pool's last good proposal (:meth:`_policy_failed`)."""
        queued = self.ready_for(ps.pool)
        active = self.active(ps.pool)
        target = self.target(ps.pool)
        view: PoolView = PoolView(ps.pool, target, ps.blocks, ps.requested, ps.retiring, queued)
        if ps.limits is not None or active is not None:  # what LoadView adds is known
            view = LoadView(
                ps.pool, target, ps.blocks, ps.requested, ps.retiring, queued,
                ps.limits, active, self.idle_for(ps.pool), self._now,
                tuple(ps.arrivals), tuple(ps.provisioning), self.upcoming_in(ps.pool),
                self.waiting_for(ps.pool), self.peak(ps.pool), ps.came_up,
            )  # fmt: skip
        most = self._most(ps)
        try:
            n = self.policy.desired(view)
        except Exception as exc:
            return self._policy_failed(ps, f"desired raised {exc!r}", target, most)
        if isinstance(n, bool) or not isinstance(n, int):
            problem = f"desired returned {n!r} ({type(n).__name__}), not a whole number"
            return self._policy_failed(ps, problem, target, most)
        if not 0 <= n <= most:
            asked, n = n, min(max(n, 0), most)
            if asked != target:  # a target above max_blocks is the operator's, clamped
                self._policy_error(ps.pool, f"desired returned {asked}, not within 0..{most}", n)
        ps.good = n
        self.policy_failing.pop(ps.pool, None)
        return n

    def _policy_failed(self, ps: PoolState, problem: str, target: int, most: int) -> int:
        """The policy gave no number for ``ps``: it keeps its last good proposal (before
        any, the blocks it has), at least its target: a failing policy neither drains a
        busy pool nor grows one."""
        kept = ps.good if ps.good is not None else ps.blocks + ps.requested
        kept = min(max(kept, target, 0), most)
        self._policy_error(ps.pool, problem, kept)
        self.policy_failing[ps.pool] = problem
        return kept

    def _policy_error(self, pool: str, problem: str, kept: int) -> None:
        """Count a policy error of ``pool``; tell it (:class:`PolicyFailed`) when it is
        new for the pool, or every POLICY_ERROR_EVERY seconds while it goes on."""
        name = str(getattr(self.policy, "name", type(self.policy).__name__))
        errors = self.problems.note(pool, problem, self._now, policy=("scaling", name))
        if errors is not None:
            self._out.append(PolicyFailed(pool, problem, kept, errors, name))

    @property
    def policy_errors(self) -> int:
        """Policy errors over all pools."""
        return self.problems.total

    def _may_request(self, pool: str) -> bool:
        """``pool`` may ask for a block now: it did not give up, is not paused and is
        not backing off."""
        if pool in self.gave_up or pool in self.paused:
            return False
        return self._now >= self.retry_at.get(pool, self._now)

    def waiting(self, pool: str) -> float | None:
        """Seconds until ``pool`` asks again after a batch-system failure (None: it is
        not backing off)."""
        at = self.retry_at.get(pool)
        return None if at is None or at <= self._now else at - self._now

    def _most(self, ps: PoolState) -> int:
        """The most blocks ``ps`` may have."""
        return self._most_of(ps.limits)

    def _most_of(self, limits: PoolLimits | None) -> int:
        """The most blocks a pool with ``limits`` (None: not configured) may have."""
        if limits is None:
            return min(self.config.max_unconfigured or self.config.max_blocks,
                       self.config.max_blocks)  # fmt: skip
        return min(limits.max_blocks, self.config.max_blocks)

    def _unstick(self, ps: PoolState) -> None:
        """Scale in ``ps``'s blocks not running by its provisioning timeout (only when
        the pool may ask for their replacements)."""
        timeout = ps.limits.provisioning_timeout if ps.limits is not None else None
        if timeout is None or not self._may_request(ps.pool):
            return
        for b in sorted(self.live(ps.pool), key=lambda b: b.block_id):
            if b.state != "running" and not b.suspended and self._now - b.since >= timeout:
                b.stuck = True
                self.stuck[ps.pool] = self.stuck.get(ps.pool, 0) + 1
                self._out.append(
                    BlockStuck(b.block_id, ps.pool, b.state, self._now - b.since, timeout)
                )
                self._retire(b)

    def _converge(self) -> None:
        for ps in self.pools.values():
            self._unstick(ps)
            live = self.live(ps.pool)
            ps.blocks = len(live)
            asked = sorted(r for r, p in self.requests.items() if p == ps.pool)
            ps.requested = sum(1 for r in asked if r not in self.cancelled)
            ps.retiring = sum(1 for b in self.blocks.values() if b.pool == ps.pool and b.retiring)
            ps.desired = want = self._desired(ps)
            have = ps.blocks + ps.requested
            # At most max_blocks at work: the blocks spent by tasks_per_worker that
            # still run a task count too (their replacements wait for them to end).
            room = self._most(ps) - self.spent_at_work(ps.pool)
            # Wanted again: the blocks it scaled in whose workers are still there are
            # taken back first (capacity present now, at no cost), then requests.
            for b in self._takeable(ps.pool):
                if have >= min(want, room):
                    break
                self._take_back(b)
                live.append(b)
                ps.blocks += 1
                ps.retiring -= 1
                have += 1
            for r in asked:  # wanted again: a cancelled request counts once more
                if have < want and r in self.cancelled:
                    self.cancelled.discard(r)
                    ps.requested += 1
                    have += 1
            while have < min(want, room) and self._may_request(ps.pool):
                request = next(self._ids)
                self.requests[request] = ps.pool
                self.requested_at[request] = self._now
                self._out.append(StartBlock(request, ps.pool, ps.spec))
                ps.requested += 1
                have += 1
            if have <= want:
                continue
            # Too many: first the blocks idle max_idletime (the longest idle first; all
            # idle ones in a pool without limits) beyond the pool's target (a floor is
            # held by a running block, not a queued one), then what is not there yet:
            # requests in flight (the latest first: their blocks are scaled in as they
            # start), then blocks not running yet (cancelled in the batch system before
            # they cost anything, the last by block id), then the other idle blocks,
            # then busy ones. A running block is capacity now; one still queued is not,
            # and would come up only to sit idle for max_idletime.
            excess = have - want
            running = [b for b in live if not _waiting(b)]
            after = ps.limits.max_idletime if ps.limits is not None else 0.0
            idle = [
                b for b in running
                if b.idle_since is not None and self._now - b.idle_since >= after
            ]  # fmt: skip
            spare = max(len(running) - self.target(ps.pool), 0)
            retire = _to_retire(idle, min(excess, len(idle), spare))
            excess -= len(retire)
            for r in reversed(asked):
                if excess and r not in self.cancelled:
                    self.cancelled.add(r)
                    ps.requested -= 1
                    excess -= 1
            rest = [b for b in live if b not in retire]
            if ps.idle_only:
                # Set back by a restore: a block that runs tasks is not drained now
                # (its work, and the consumers of its outputs, would move to others);
                # it goes once a count shows it idle.
                rest = [b for b in rest if not self._busy(b)]
            waiting = sorted((b for b in rest if _waiting(b)), key=lambda b: _natural(b.block_id))
            queued = waiting[max(len(waiting) - excess, 0) :]  # the last by block id
            rest = [b for b in rest if b not in queued]
            retire += queued
            for b in retire + _to_retire(rest, excess - len(queued)):
                self._retire(b)
                ps.blocks -= 1
                ps.retiring += 1
        self._rejoin()

    def _busy(self, b: BlockRecord) -> bool:
        """A worker of ``b`` runs tasks, as the latest count says (or no count yet)."""
        return self.processing is None or any(self.processing.get(w, 0) for w in b.workers)

    def _rejoin(self) -> None:
        """Un-drain the other workers of each block an operator took back (the core had
        scaled it in, :meth:`_undrained_elsewhere`) that the proposal keeps; a block
        scaled in again has its drains sent already."""
        for b in self.blocks.values():
            rejoin, b.rejoin = b.rejoin, set()
            if b.retiring:
                continue
            for wid in sorted(rejoin):
                b.undraining.add(wid)
                self._out.append(UndrainWorker(wid, b.block_id))

    # ----------------------------------------------------------------- invariants

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the first broken one."""
        for bid, b in self.blocks.items():
            assert b.block_id == bid, b
            assert b.pool in self.pools, (b, "block of an unknown pool")
            assert b.state in LIVE_STATES, b
            assert not b.suspended or b.state == "held", (b, "suspended but not held")
            assert b.draining | b.drained | b.unknown <= set(b.workers), b
            assert not (b.draining & b.drained or b.draining & b.unknown), b
            assert not (b.drained & b.unknown), b
            assert b.undraining <= set(b.workers), b
            assert b.seen_draining <= b.drained, b
            assert not b.rejoin or self.closing, (b, "un-drains left unsent")
            if b.scaled_in or b.leaves:
                assert b.retiring, (b, "scaled in or leaving but counted")
            assert not b.lost or b.retiring, (b, "lost but counted")
            if b.stopping or b.draining or b.drained or b.unknown or b.stuck:
                assert b.retiring, (b, "scaled in but not retiring")
            if b.retiring and not self.closing and not b.stopping:
                # A retiring block that is not stopped has its workers draining.
                assert b.draining | b.drained | b.unknown == set(b.workers), b
                assert b.unknown != set(b.workers), (b, "idle but not stopped")
        assert not self.held.keys() & self.blocks.keys(), (self.held, "held but live")
        for h in self.held.values():
            assert h.at <= self._now < h.until and not self.closing, (h, "held past its grace")
            assert self._unexplained(h.record), (h, "held, explained")
        assert set(self.requests.values()) <= self.pools.keys(), self.requests
        assert self.gave_up <= self.pools.keys(), self.gave_up
        assert self.paused <= self.pools.keys(), self.paused
        assert self.retry_at.keys() <= self.pools.keys(), self.retry_at
        assert not (self.paused & self.retry_at.keys()), (self.paused, self.retry_at)
        horizon = self._now - self.config.replacement_window
        assert self.replacements.keys() <= self.pools.keys(), self.replacements
        for ends in self.replacements.values():
            assert ends and all(horizon <= t <= self._now for t in ends), self.replacements
            assert list(ends) == sorted(ends), self.replacements
        if self.closing:
            assert all(b.stopping for b in self.blocks.values()), "closing: a block not stopped"
            return
        assert self.cancelled <= self.requests.keys(), (self.cancelled, self.requests)
        for pool, ps in self.pools.items():
            live = len(self.live(pool)) + sum(
                1 for r, p in self.requests.items() if p == pool and r not in self.cancelled
            )
            assert 0 <= ps.desired <= self._most(ps), ps
            # Exactly the proposal (at most, once the pool may not ask): requests in
            # flight beyond it are cancelled, their blocks scaled in as they start.
            # ... and at most max_blocks with the spent blocks that still run a task.
            room = self._most(ps) - self.spent_at_work(pool)
            # ... or more, with a restore's target, by blocks still busy.
            busy = sum(1 for b in self.live(pool) if self._busy(b)) if ps.idle_only else 0
            if live > ps.desired:
                assert live - ps.desired <= busy, (pool, live, ps, "beyond it, not busy")
            elif not self._may_request(pool):
                assert live <= ps.desired, (pool, live, ps)
            else:
                assert live == ps.desired or (live < ps.desired and live >= room), (pool, live, ps)
            assert ps.blocks + ps.requested == live, (ps, live)


#: the most blocks ``scale(n)`` takes: what one message (``ScaleRequest.n``) carries
MAX_BLOCKS = 2**63 - 1


def check_blocks(pool: str, n: object) -> None:
    """ValueError unless ``n`` is a whole number of blocks from 0 to :data:`MAX_BLOCKS`
    (a pool is sized in blocks: what ``scale(n)`` keeps), and :func:`check_pool`. Checked
    where it is asked (``Cluster.scale``, the console's ``scale``) and where it is done,
    alike."""
    check_pool(pool, "scale", "scale(n, pool='gpu'), the console's `scale gpu N`")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_BLOCKS:
        raise ValueError(
            f"cannot scale pool {pool!r} to {n!r} blocks: give a whole number of blocks "
            f"from 0 to {MAX_BLOCKS:,} (2**63 - 1)"
        )


def check_pool(pool: object, given: str, example: str) -> None:
    """:class:`~runtime.errors.PoolNameError` for a pool that an operator or a client
    targets (``given``: ``scale``, ``resume``; ``example``: how to name one there) with
    a name no pool has (``""``, ``"*"``: :func:`~runtime.messages.pool_name_problem`)."""
    problem = pool_name_problem(pool)
    if problem:
        raise PoolNameError(
            pool, given, problem,
            f"Name one pool ({example}); the tasks submitted without pool= run in any pool",
        )  # fmt: skip


def _waiting(b: BlockRecord) -> bool:
    """``b`` has not run yet: queued in the batch system, or held before it ever ran."""
    return b.state != "running" and not b.suspended


def _to_retire(live: list[BlockRecord], m: int) -> list[BlockRecord]:
    """The ``m`` blocks to scale in: the idle ones, longest idle first (the last by
    block id among equals); then those not running (pending, held); then the last
    by block id."""
    idle = sorted((b for b in live if b.idle_since is not None), key=lambda b: _natural(b.block_id))
    idle = sorted(idle[::-1], key=lambda b: b.idle_since or 0)  # ties: the last by id
    rest = sorted(
        (b for b in live if b.idle_since is None),
        key=lambda b: (b.state != "running", _natural(b.block_id)),
    )
    chosen = idle[:m]
    left = m - len(chosen)
    return chosen + (rest[len(rest) - left :] if left > 0 else [])


def _natural(block_id: str) -> tuple[tuple[int, str], ...]:
    """``block_id`` ordered as people count: ``block-9`` before ``block-10``."""
    return tuple(
        (1, part) if not part.isdigit() else (0, f"{int(part):020d}")
        for part in re.split(r"(\d+)", block_id)
        if part
    )


_DISPATCH: dict[type, Any] = {
    TargetSet: AutoscalerState._target_set,
    TargetRaised: AutoscalerState._target_raised,
    BlockStarted: AutoscalerState._block_started,
    BlockStartFailed: AutoscalerState._block_start_failed,
    BlockEnded: AutoscalerState._block_ended,
    BlockStopped: AutoscalerState._block_stopped,
    BlockRequeued: AutoscalerState._block_requeued,
    WorkersLeft: AutoscalerState._workers_left,
    WorkerRefused: AutoscalerState._worker_refused,
    BlockRunning: AutoscalerState._block_running,
    BlockHeld: AutoscalerState._block_held,
    Resumed: AutoscalerState._resumed,
    DrainAnswered: AutoscalerState._drain_answered,
    UndrainAnswered: AutoscalerState._undrain_answered,
    QueuesSeen: AutoscalerState._queues_seen,
    PolicyChanged: AutoscalerState._policy_changed,
    Tick: AutoscalerState._tick,
    Shutdown: AutoscalerState._shutdown,
}
