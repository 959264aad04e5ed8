"""Scaling policies: how many blocks of workers each pool should have.

The autoscaler core (``actors/autoscaler_state.py``) asks ``desired(pool)`` after every
event it handles and checks the answer; how blocks are started, drained, replaced and
counted against the replacement budget stays in the core.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Annotated

from policies.base import REGISTRY, PoolView

__all__ = [
    "DELAYS_KEPT",
    "HISTORY",
    "LOOKAHEAD",
    "DemandBlocks",
    "FixedTarget",
    "LoadView",
    "PoolLimits",
    "QueueProportional",
    "forecast_headroom",
    "provisioning_delay",
]


@dataclasses.dataclass(frozen=True, slots=True)
class PoolLimits:
    """A configured pool's limits, as the autoscaler core and the ``demand`` strategy
    read them (Parsl's names: ``actors/pools.py`` builds them from the configuration)."""

    min_blocks: int = 0
    max_blocks: int = 1
    init_blocks: int = 1
    parallelism: float = 1.0  #: slots wanted per active task, 0..1
    slots_per_block: int = 1  #: tasks a block runs at once (workers x cores per worker)
    max_idletime: float = 120.0  #: seconds a block may stay idle before it is drained
    #: blocks the ``demand`` strategy keeps beyond what the active tasks need (idle
    #: runners ready for the next burst), at least its own ``spare``
    spare_blocks: int = 0
    walltime: float | None = None  #: seconds a block may run (None: no limit known)
    #: seconds from a block's request after which a block not running yet stops
    #: counting as capacity and is replaced (None: a pending block counts until it runs)
    provisioning_timeout: float | None = None
    #: seconds a running block may go on once every worker of it that joined has left
    #: the scheduler without a word, before it is stopped and replaced as lost (the
    #: autoscaler core's ``lost_grace``, per pool; None: never)
    lost_grace: float | None = 60.0
    #: its blocks run tasks of no pool (``pool=`` not given) too, so they count in its
    #: active tasks; False (the pool's ``any_pool_tasks = false``): only its own do
    any_pool_tasks: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.min_blocks <= self.init_blocks <= self.max_blocks:
            raise ValueError(
                f"need 0 <= min_blocks <= init_blocks <= max_blocks, got {self.min_blocks}, "
                f"{self.init_blocks}, {self.max_blocks}"
            )
        if not 0 <= self.parallelism <= 1:
            raise ValueError(f"parallelism must be in [0, 1], got {self.parallelism}")
        if self.slots_per_block < 1:
            raise ValueError(f"slots_per_block must be >= 1, got {self.slots_per_block}")
        if self.max_idletime < 0:
            raise ValueError(f"max_idletime must be >= 0, got {self.max_idletime}")
        if not 0 <= self.spare_blocks <= self.max_blocks:
            raise ValueError(
                f"spare_blocks must be from 0 to max_blocks ({self.max_blocks}), "
                f"got {self.spare_blocks}"
            )
        if self.lost_grace is not None and not self.lost_grace > 0:
            raise ValueError(f"lost_grace must be > 0 (None: never), got {self.lost_grace}")
        if self.provisioning_timeout is not None and not self.provisioning_timeout > 0:
            raise ValueError(
                f"provisioning_timeout must be > 0 (None: off), got {self.provisioning_timeout}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class LoadView(PoolView):
    """A :class:`~policies.PoolView` with the pool's configured limits (None: the pool
    was not configured, e.g. ``Cluster(workers=...)``) and its load: ``active``, the
    tasks it may run that are ready or running on its blocks (None until the autoscaler
    has read the scheduler's counts), and ``idle_for``, how long each of its running
    blocks whose workers all run nothing has been idle, in seconds, longest first."""

    limits: PoolLimits | None = None
    active: int | None = None
    idle_for: tuple[float, ...] = ()
    #: the autoscaler's clock now, seconds
    now: float = 0.0
    #: tasks seen arriving, ``(when, how many)``: each rise of ``active`` between two
    #: counts of the scheduler's, over the last :data:`HISTORY` seconds, oldest first
    arrivals: tuple[tuple[float, int], ...] = ()
    #: the latest blocks' provisioning delays (request to running), seconds, oldest first
    provisioning: tuple[float, ...] = ()
    #: the next wave it may run: waiting tasks none of whose inputs waits, as the
    #: seconds until each is expected to be ready, shortest first (empty: none, or not
    #: asked for: the strategy does not look ahead)
    upcoming: tuple[float, ...] = ()
    #: seconds since each block of ``blocks + requested`` that has not run yet (queued
    #: at the batch system, held before it ever ran, or asked of the provider with no
    #: answer yet) was asked for, longest first: capacity that is not there yet
    waiting_for: tuple[float, ...] = ()
    #: the most ``active`` tasks counted over the last ``max_idletime`` seconds, now
    #: included (None: not known, and every block asked for is kept until it runs)
    peak: int | None = None
    #: blocks of the pool that have come up (run) so far, each counted once (a requeued
    #: block's next run is not counted again; ``provisioning`` keeps only the latest
    #: delays, so its length is no count of them)
    came_up: int = 0


#: seconds of arrivals the autoscaler core keeps for the ``demand`` strategy's forecast
HISTORY = 3600.0
#: provisioning delays it keeps per pool (the latest)
DELAYS_KEPT = 20
#: seconds the ``demand`` strategy looks ahead in a pool none of whose blocks has come
#: up yet (its provisioning delay is not known)
LOOKAHEAD = 300.0


@REGISTRY.register("scaling", "fixed")
class FixedTarget:
    """Default. Exactly the target: the number of blocks given at start or by
    ``scale(n)``."""

    name = "fixed"
    uses_queues = False

    def desired(self, pool: PoolView) -> int:
        return pool.target


@REGISTRY.register("scaling", "queue")
class QueueProportional:
    """One block per ``tasks_per_block`` ready tasks of the pool, at least the target and
    at most ``maximum`` (never below the target, so ``scale(n)`` stays a floor). Before
    the autoscaler has seen the queues, the target."""

    name = "queue"
    uses_queues = True

    def __init__(self, tasks_per_block: int = 100, maximum: int = 16) -> None:
        if isinstance(tasks_per_block, bool) or not isinstance(tasks_per_block, int):
            raise TypeError("tasks_per_block must be a whole number")
        if tasks_per_block < 1:
            raise ValueError("tasks_per_block must be >= 1")
        if isinstance(maximum, bool) or not isinstance(maximum, int) or maximum < 0:
            raise ValueError("maximum must be a whole number >= 0")
        self.tasks_per_block = tasks_per_block
        self.maximum = maximum

    def desired(self, pool: PoolView) -> int:
        if pool.queued is None:
            return pool.target
        wanted = math.ceil(pool.queued / self.tasks_per_block)
        return max(pool.target, min(wanted, self.maximum))


@REGISTRY.register("scaling", "demand")
class DemandBlocks:
    """Parsl's block strategy, per configured pool (the default when pools are
    configured). At start, ``init_blocks``. Then enough blocks for the active tasks:
    ``ceil(active * parallelism / slots_per_block)`` (at least one while any task is
    active), never fewer than the target (``min_blocks``, or what ``scale(n)`` set) nor
    more than ``max_blocks``. Blocks beyond that are kept until they have been idle
    ``max_idletime`` seconds; the core then drains the longest idle first (a draining
    worker finishes what it runs: no busy worker is ever stopped). A pool without
    limits keeps its target, as ``fixed`` does.

    ``forecast`` (a quantile, e.g. 0.9; default None: off) adds spare blocks for the
    tasks expected to arrive within one provisioning delay (:func:`forecast_headroom`),
    at most ``max_headroom`` blocks (None: up to ``max_blocks``), so a burst finds
    blocks running instead of waiting for new ones. The spare blocks stay while the
    forecast asks for them (their time is the cost); once it drops, the idle ones are
    drained after ``max_idletime`` as usual.

    ``spare`` (a whole number, default 0) keeps that many blocks beyond what the active
    tasks need, whether or not tasks are active, within ``max_blocks``: idle runners
    ready for the next burst whenever it comes (GitLab Runner's ``IdleCount``). A pool's
    own ``spare_blocks`` (its limits) sets it per pool; the larger of the two applies.
    Their time is the cost, all the time; ``min_blocks`` is the other way to keep
    capacity warm (a floor on all blocks, busy ones included).

    ``lookahead`` (default ``"provisioning"``) counts the next wave of the task graph
    as active too: waiting tasks none of whose inputs waits (each input is done, running
    or ready), expected to be ready within one provisioning delay of the pool (the
    median of its latest blocks' delays; :data:`LOOKAHEAD` seconds before one is known),
    each input's expected time left being its category's mean duration (from its start
    if it runs; a task whose input runs past twice that is left out, see
    ``SchedulerState.upcoming``). A block requested now comes up about when such a task
    is ready, so the second stage of a pipeline does not wait a provisioning delay after
    the first; a task whose inputs take longer is not counted until they are nearly
    done. A number of seconds sets the horizon; ``0`` or None turns it off (Parsl's and
    a queue-length scaler's view: ready and running tasks only).

    Level-triggered: the answer depends only on the view now. Blocks requested or
    pending count in ``blocks + requested`` like running ones, so nothing is asked
    twice, while they are wanted: the demand at any count over the last
    ``max_idletime`` seconds (``peak``: active tasks and the whole next wave) needs
    them, or they were asked for less than ``max_idletime`` ago (``waiting_for``), or
    fewer than ``init_blocks`` blocks of the pool have come up yet. Beyond that they
    are proposed away and the core cancels them before they run (it scales in what is
    not there yet before running blocks, but for the blocks idle ``max_idletime``
    beyond the floor): a block queued for a burst that the running blocks finished is
    not kept to come up and sit idle, and a lull shorter than ``max_idletime`` cancels
    nothing (no block cancelled and asked for again a moment later). The core stops
    counting one past the pool's ``provisioning_timeout`` (it is scaled in, and this
    answer, asked again, replaces it)."""

    name = "demand"
    uses_queues = True

    def __init__(
        self,
        forecast: Annotated[float | None, "a quantile in (0, 1] or None"] = None,
        max_headroom: int | None = None,
        spare: Annotated[int, "a whole number of blocks >= 0"] = 0,
        lookahead: float | str | None = "provisioning",
    ) -> None:
        if forecast is not None and (
            isinstance(forecast, bool)
            or not isinstance(forecast, (int, float))
            or not 0 < forecast <= 1
        ):
            raise ValueError(f"forecast must be a quantile in (0, 1] or None, got {forecast!r}")
        if max_headroom is not None and (
            isinstance(max_headroom, bool) or not isinstance(max_headroom, int) or max_headroom < 0
        ):
            raise ValueError(f"max_headroom must be a whole number >= 0, got {max_headroom!r}")
        if isinstance(spare, bool) or not isinstance(spare, int) or spare < 0:
            raise ValueError(f"spare must be a whole number of blocks >= 0, got {spare!r}")
        if (
            lookahead != "provisioning"
            and lookahead is not None
            and (
                isinstance(lookahead, bool)
                or not isinstance(lookahead, (int, float))
                or not 0 <= lookahead < math.inf
            )
        ):
            raise ValueError(
                'lookahead must be "provisioning" (one provisioning delay), a number of '
                f"seconds >= 0, or None (off), got {lookahead!r}"
            )
        self.forecast = None if forecast is None else float(forecast)
        self.max_headroom = max_headroom
        self.spare = spare
        self.lookahead: float | str | None = (
            lookahead if lookahead == "provisioning" or not lookahead else float(lookahead)
        )

    @property
    def uses_upcoming(self) -> bool:
        """Whether the autoscaler should ask the scheduler for the next wave."""
        return bool(self.lookahead)

    def horizon(self, pool: LoadView) -> float:
        """Seconds ahead the next wave counts in ``pool`` (0: not at all)."""
        if not self.lookahead:
            return 0.0
        if self.lookahead != "provisioning":
            assert isinstance(self.lookahead, float)
            return self.lookahead
        return provisioning_delay(pool) if pool.provisioning else LOOKAHEAD

    def desired(self, pool: PoolView) -> int:
        limits: PoolLimits | None = getattr(pool, "limits", None)
        if limits is None:
            return pool.target
        lo = min(max(pool.target, limits.min_blocks), limits.max_blocks)
        active: int | None = getattr(pool, "active", None)
        if active is None:  # the load is not known yet: the start
            return max(lo, limits.init_blocks)
        if isinstance(pool, LoadView) and pool.upcoming and self.lookahead:
            active += bisect.bisect_right(pool.upcoming, self.horizon(pool))
        extra = max(self.spare, limits.spare_blocks)
        if self.forecast is not None and isinstance(pool, LoadView):
            spare = forecast_headroom(pool, self.forecast)
            spare = math.ceil(spare * limits.parallelism / limits.slots_per_block)
            if self.max_headroom is not None:
                spare = min(spare, self.max_headroom)
            extra += spare
        needed = _blocks_for(active, limits) + extra
        idle = sum(1 for t in getattr(pool, "idle_for", ()) if t >= limits.max_idletime)
        peak: int | None = getattr(pool, "peak", None)
        if peak is None or not isinstance(pool, LoadView):  # every block kept till it runs
            keep = pool.blocks + pool.requested - idle
        else:
            # Running blocks stay until idle max_idletime; blocks not running yet while
            # the demand of the last max_idletime seconds wants them, or asked for less
            # than that ago, or (the blocks asked at the start) until init_blocks came up.
            waiting = len(pool.waiting_for)
            young = sum(1 for t in pool.waiting_for if t < limits.max_idletime)
            running = pool.blocks + pool.requested - waiting - idle
            recent = max(needed, _blocks_for(peak, limits) + extra)
            if pool.came_up < limits.init_blocks:
                recent = max(recent, limits.init_blocks)
            keep = running + max(young, min(waiting, max(recent - running, 0)))
        return min(max(lo, needed, keep), limits.max_blocks)


def _blocks_for(active: int, limits: PoolLimits) -> int:
    """Blocks ``active`` tasks need in a pool with ``limits`` (at least one if any)."""
    needed = math.ceil(active * limits.parallelism / limits.slots_per_block)
    return max(needed, 1) if active > 0 else needed


def forecast_headroom(pool: LoadView, quantile: float) -> int:
    """Tasks expected to arrive in ``pool`` within one provisioning delay: the last
    :data:`HISTORY` seconds of ``pool.arrivals`` cut into spans of the median of
    ``pool.provisioning`` (ending now), and the ``quantile`` (nearest rank) of the
    tasks that arrived per span. 0 until a block has come up (no delay measured yet)."""
    delay = provisioning_delay(pool)
    if delay <= 0:
        return 0
    spans = max(int(HISTORY // delay), 1)
    counts = [0] * spans
    for at, n in pool.arrivals:
        i = int((pool.now - at) // delay)
        if 0 <= i < spans:
            counts[i] += n
    counts.sort()
    return counts[max(math.ceil(quantile * spans) - 1, 0)]


def provisioning_delay(pool: LoadView) -> float:
    """The median (lower) of ``pool``'s latest provisioning delays, seconds (0: none)."""
    if not pool.provisioning:
        return 0.0
    delays = sorted(pool.provisioning)
    return delays[(len(delays) - 1) // 2]
