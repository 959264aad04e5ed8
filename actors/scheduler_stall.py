"""The scheduler core's placement watchdog: a pool whose ready tasks go nowhere is told.

What lives here: :class:`PlacementWatch`, the part of the scheduler's pure core that
notices a pool with ready tasks and an idle connected worker in which nothing moves, and
says why each idle worker takes nothing, with the state only it keeps
(``_init_placement_watch``). :class:`~actors.scheduler_state.SchedulerState` inherits it
(beside :class:`~actors.scheduler_disk.DiskPlacement`, the disk watchdog): ``_assign``
and ``_tasks_finished`` report progress (``_placed``), ``_watch`` runs the watchdog
(``_watch_placement``). The core's attributes and methods it reads are declared (not
defined) in one block of the class; this module imports nothing of
``actors/scheduler_state.py``. Pure like the rest of the core: no anyio, no sockets, no
clock, no threads.

The rule (docs/architecture.md, docs/monitoring.md#placement-stalls): no wait without a
bound or a word. Per pool (``"*"``: the tasks any pool may run) the core keeps since when
nothing moved (``placement_since``): the pool's first task became ready, or a task of it
was placed or finished. A pool that has had ready tasks for ``stall_timeout`` seconds
since then, with a connected worker (not away) that runs nothing, is *stalled*: the core
emits :class:`PlacementStallBegan` once, with why each idle worker of the pool takes
nothing (``PlacementStallInfo.idle``: ``paused``, its block suspended; ``draining``;
``kept``, drained because it was sent its pool's ``tasks_per_worker`` tasks, and kept
only for outputs still needed (no worker taking new tasks is there to copy them to);
``throttled``, past its memory throttle fence; ``full``, its slots counted taken by
held threads or speculative copies; ``resources``, the first ready task asks for more
cores or memory than it has, or it was killed for memory on one as large; ``refused``,
the placement rules kept the tasks off it: walltime, disk kept for a task ahead, a
backoff after failed fetches; the first ready task's story says which), and
:class:`PlacementStallEnded` when a task of the pool is placed or finishes, none is
ready, or no idle connected worker is left (its idle workers left or went away), with
how long it lasted. Not a stall: a pool without a connected worker (the
``CorralNoWorkers`` alert's case), one whose workers all run tasks (they finish:
saturation; the clock starts again), one with a worker busy whose idle workers wait
for it (``_waits_for_busy``: each ``paused``, ``draining``, ``kept``, ``throttled``, or short of
``resources`` a worker of the pool has: backpressure, a heterogeneous pool, a retry
after a kill for memory waiting for the larger worker; ``refused``, ``full`` and
resources no worker of the pool has are stalls whatever runs), and one whose ready
tasks wait for disk (``disk_parked``: the disk watchdog's case, which keeps its own
message; a placement stall in force there ends), nor while the memory watchdog
suspects a stall of the pool (every worker of it throttled, ``stalled_since``; for any
pool's tasks, ``"*"``, every worker: its tasks fail with ``MemoryStalled`` at the same
timeout).

Cost: a dict look-up per placement and per finished try; per handled event a pass over
the pools with ready tasks (``queued_counts``, O(pools)); the pool's workers are looked
at only once its clock passed ``stall_timeout`` (at most once per ``stall_timeout`` per
pool while its workers are busy), and per event for a stalled pool, until its first
idle connected worker (``_idle_connected``); never its tasks.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from actors.scheduler_events import Command, PlacementStallBegan, PlacementStallEnded
from actors.scheduler_records import (
    SchedulerConfig,
    TaskState,
    WorkerState,
    runs_on,
)
from runtime.messages import ANY_POOL, PlacementStallInfo, pool_key, pool_name, pool_of_key

__all__ = ["CorePart", "PlacementWatch"]


class CorePart:
    """A part of the scheduler's pure core, a mixin of
    :class:`~actors.scheduler_state.SchedulerState` (its disk part,
    :class:`~actors.scheduler_disk.DiskPlacement`, and its placement watchdog,
    :class:`PlacementWatch`): what the core provides that each part reads, declared
    (not defined), and the helpers the parts share."""

    if TYPE_CHECKING:
        config: SchedulerConfig
        workers: dict[str, WorkerState]
        free: dict[str, WorkerState]
        queues: dict[tuple[str | None, bool], list[tuple[Any, ...]]]
        _out: list[Command]
        _stimulus: str
        _now: float

        def _log(self, key: Any, start: str, finish: str) -> None: ...

    def _runs_on(self, pool: str | None, ws: WorkerState) -> bool:
        """A task of ``pool`` may run on ``ws``: one of its pool, or for a task of no
        pool (None) any worker whose pool is not reserved (``any_pool_tasks = false``:
        ``SchedulerConfig.reserved_pools``); the test is ``runs_on``."""
        return runs_on(pool, ws.pool, self.config.reserved_pools)

    def _pool_workers(self, pool: str | None) -> list[WorkerState]:
        """The workers that may run tasks of ``pool`` (None: no pool), not draining:
        those of the pool, or every one but a reserved pool's (``_runs_on``)."""
        return [ws for ws in self.workers.values() if not ws.draining and self._runs_on(pool, ws)]


class PlacementWatch(CorePart):
    """The placement watchdog (the module docstring): a mixin of
    :class:`~actors.scheduler_state.SchedulerState`."""

    if TYPE_CHECKING:
        # What else of the core the watchdog reads: its state and methods.
        queued_counts: Counter[str]
        disk_parked: set[str | None]
        stalled_since: dict[str, float]

        def _roomier(self, ts: TaskState, ws: WorkerState) -> bool: ...
        def spent(self, ws: WorkerState) -> bool: ...
        def _copy_off(self, ws: WorkerState, keys: set[TaskState], *, to: WorkerState) -> None: ...

    def _init_placement_watch(self) -> None:
        """The watchdog's own state (the core's ``__init__`` calls this)."""
        #: per pool with ready tasks (``"*"``: any pool), since when nothing moved there:
        #: its first task became ready, or a task of it was placed or finished
        self.placement_since: dict[str, float] = {}
        #: the stalls declared and not ended, for the log, the status and the metrics;
        #: and how many each pool ever had (its metric's key)
        self.placement_stalls: dict[str, PlacementStallInfo] = {}
        self.placement_stall_count: Counter[str] = Counter()

    def _placed(self, pool: str | None) -> None:
        """A task of ``pool`` was placed or finished: the pool moves (O(1))."""
        key = pool_key(pool)
        if key in self.placement_since:
            self.placement_since[key] = self._now
            if key in self.placement_stalls:
                self._placement_stall_ended(key, "a task was placed or finished")

    def _watch_placement(self) -> None:
        """The watchdog's look after each event: O(pools with ready tasks), and a pool's
        workers only once its clock ran out (the module docstring)."""
        since = self.placement_since
        for key in [k for k in since if not self.queued_counts[k]]:
            del since[key]  # none ready: nothing waits
            if key in self.placement_stalls:
                self._placement_stall_ended(key, "no task is ready")
        timeout = self.config.stall_timeout
        for key, n in self.queued_counts.items():
            if not n:
                continue
            at = since.get(key)
            if at is None:
                since[key] = self._now
                continue
            if pool_of_key(key) in self.disk_parked:
                since[key] = self._now  # waits for disk: the disk watchdog's case
                if key in self.placement_stalls:
                    self._placement_stall_ended(key, "its ready tasks wait for disk")
                continue
            if key in self.placement_stalls:
                if not self._idle_connected(pool_of_key(key)):
                    since[key] = self._now  # its idle workers left: not a stall now
                    self._placement_stall_ended(key, "no idle connected worker")
                continue
            if self._now - at < timeout:
                continue
            if key in self.stalled_since or ANY_POOL in self.stalled_since:
                since[key] = self._now  # its workers all throttled: MemoryStalled's case
                continue
            stall = self._placement_account(key, at, n)
            if stall is None:
                since[key] = self._now  # no idle worker, or they wait for a busy one
                continue
            self.placement_stalls[key] = stall
            self.placement_stall_count[key] += 1
            reasons = ", ".join(sorted({r for _, r, _ in stall.idle}))
            self._log("-", "placement", f"stalled in pool {pool_name(key)}: {reasons}")
            self._out.append(PlacementStallBegan(self._stimulus, stall))
            self._gather_kept(stall)

    def _gather_kept(self, stall: PlacementStallInfo) -> None:
        """A stalled pool with idle workers ``kept`` for their outputs (drained by its
        ``tasks_per_worker``, no worker taking new tasks to copy them to): each kept
        worker's outputs, when every one is at most ``checkpoint_inline_bytes``, are
        copied to the kept worker of the lowest id (which then keeps them: the lowest
        id of the draining holders keeps an output), so the others are retired and
        their blocks end, freeing their share of the batch system for the fresh
        blocks the pool waits for (audit checkpoint, finding 1). Once per stall."""
        kept = [self.workers[w] for w, why, _ in stall.idle if why == "kept"]
        if len(kept) < 2:
            return
        to, *others = sorted(kept, key=_id)
        bound = self.config.checkpoint_inline_bytes
        for ws in others:
            keys = ws.keeping or set()
            if not keys or any(ts.nbytes > bound for ts in keys):
                continue
            self._log(
                ws.id, "draining",
                f"kept outputs gathered on {to.id} (its pool stalled): its block may end",
            )  # fmt: skip
            self._copy_off(ws, keys, to=to)

    def _placement_stall_ended(self, key: str, why: str) -> None:
        stall = self.placement_stalls.pop(key)
        self._log("-", "placement", f"stall in pool {pool_name(key)} ended: {why}")
        self._out.append(PlacementStallEnded(self._stimulus, stall, self._now - stall.since))

    def _placement_account(self, key: str, since: float, queued: int) -> PlacementStallInfo | None:
        """The stall of pool ``key``: its connected workers and why each idle one takes
        nothing; None when it is not a stall: it has no idle connected worker (none at
        all, or all busy), or some worker of it is busy and every idle one waits for
        that (``_waits_for_busy``). O(the pool's workers)."""
        pool = pool_of_key(key)
        connected = self._connected(pool)
        idle = [ws for ws in connected if _idle(ws)]
        if not idle:
            return None
        head = self._ready_head(pool)
        why = [(ws.id, *self._takes_nothing(ws, head)) for ws in sorted(idle, key=_id)]
        busy = len(connected) - len(idle)
        if busy and self._waits_for_busy({r for _, r, _ in why}, connected, head):
            return None
        return PlacementStallInfo(
            pool=key,
            since=since,
            queued=queued,
            workers=tuple(sorted(ws.id for ws in connected)),
            busy=busy,
            idle=tuple(why),
            head="" if head is None else repr(head.key),
        )

    def _connected(self, pool: str | None) -> list[WorkerState]:
        """The connected workers (not away, not retired) of ``pool`` (None: those that
        take tasks of no pool, the reserved pools' left out)."""
        return [
            ws for ws in self.workers.values()
            if ws.away is None and not ws.retired and self._runs_on(pool, ws)
        ]  # fmt: skip

    def _idle_connected(self, pool: str | None) -> bool:
        """``pool`` (None: any) has a connected worker that runs nothing: a stall of it
        holds on (O(the pool's workers), for a stalled pool only; the first idle one
        ends the look)."""
        return any(_idle(ws) for ws in self._connected(pool))

    def _waits_for_busy(
        self, reasons: set[str], connected: list[WorkerState], head: TaskState | None
    ) -> bool:
        """With a worker of the pool busy, the idle ones (``reasons``) wait for it to
        finish, not a stall: each is ``paused``, ``draining`` or ``throttled`` (a
        finish frees memory or a slot: backpressure, saturation), or short of
        ``resources`` that a connected worker of the pool has (the busy one takes the
        task once free: a heterogeneous pool, a retry after a kill for memory waiting
        for the larger worker). ``refused``, ``full``, and resources no worker of the
        pool has are stalls whatever runs."""
        if not reasons <= {"paused", "draining", "kept", "throttled", "resources"}:
            return False
        if "resources" not in reasons or head is None:
            return True
        return any(not ws.draining and not self._short(ws, head) for ws in connected)

    def _ready_head(self, pool: str | None) -> TaskState | None:
        """The first ready task of ``pool`` in priority: the heads of its two heaps
        (consumers, producers), each live after the ``_fill`` before the watchdog."""
        best: tuple[Any, ...] | None = None
        for producer in (False, True):
            heap = self.queues.get((pool, producer))
            if heap and heap[0][3].state == "queued" and (best is None or heap[0] < best):
                best = heap[0]
        return None if best is None else best[3]

    def _takes_nothing(self, ws: WorkerState, head: TaskState | None) -> tuple[str, str]:
        """Why idle ``ws`` takes no ready task, ``(reason, detail)``, from what the core
        keeps of it and of the first ready task ``head`` (the module docstring)."""
        if ws.suspended:
            return "paused", "its block is suspended by the batch system"
        if ws.draining and self.spent(ws):
            n = len(ws.keeping or ())
            return "kept", (
                "it was sent its pool's tasks_per_worker tasks and stays only for "
                f"{n} output(s) still needed (a waiting task reads them or a client "
                "holds them)"
            )
        if ws.draining:
            return "draining", "it drains: it takes no new task"
        if ws.throttled:
            return "throttled", (
                f"its RSS passed its throttle fence ({ws.throttle_at:,} B): producers are "
                "held back until its memory falls"
            )
        if ws.id not in self.free:
            return "full", (
                f"its slots count as taken: {ws.held} thread(s) held by stopped tries, "
                f"{len(ws.copies)} speculative copies, {len(ws.jammed)} long tries "
                f"jamming it, with {ws.cores} core(s)"
            )
        if head is not None and (short := self._short(ws, head)):
            return "resources", f"{head.key!r} needs {' and '.join(short)}"
        return "refused", (
            "the placement rules kept the ready tasks off it (its walltime ends before "
            "their usual run while another worker of the pool has the time, its free "
            "disk is kept for a task ahead that waits for disk, or they are held back "
            "after failed fetches of their inputs, up to 10 s)"
            + (f": the story of {head.key!r} says which" if head is not None else "")
        )

    def _short(self, ws: WorkerState, head: TaskState) -> list[str]:
        """What of the resources ready task ``head`` asks for ``ws`` lacks (empty: it
        has them all): cores, memory, memory for its inputs, a memory limit larger than
        one it was killed for memory under."""
        res = head.spec.resources
        cores, memory = res.get("cores", 0), res.get("memory", 0)
        short = []
        if cores > ws.cores:
            short.append(f"{cores:g} cores (it has {ws.cores})")
        if memory > ws.memory:
            short.append(f"{int(memory):,} B of memory (it has {ws.memory:,} B)")
        if ws.memory and head.in_nbytes > ws.memory:
            short.append(f"{head.in_nbytes:,} B of inputs in memory (it has {ws.memory:,} B)")
        if head.ooms and not self._roomier(head, ws):
            short.append(f"a memory limit {head.oom_need} (killed for memory before)")
        return short


def _id(ws: WorkerState) -> str:
    return ws.id


def _idle(ws: WorkerState) -> bool:
    """``ws`` runs nothing: no task, no speculative copy."""
    return not ws.processing and not ws.copies
