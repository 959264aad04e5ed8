"""The scheduler core's disks: disk-aware placement, the disk watchdog, its stall breaker.

What lives here: :class:`DiskPlacement`, the part of the scheduler's pure core that
decides whether a worker's disk holds a task and what to do when a pool is stuck on
disk, with the state only it keeps (``_init_disk``), and the sources of a task's
expected output (``SEEN_OUTPUT`` ... ``FIRM_OUTPUTS``, named in its errors).
:class:`~actors.scheduler_state.SchedulerState` (``actors/scheduler_state.py``, the
rest of the core) inherits it: ``_candidates`` and ``_fill`` ask it where a task's disk
fits, ``_watch`` runs its watchdog, and it places, fails and recomputes tasks through
the core's own methods. Those, and the core's attributes it reads, are declared (not
defined) in one block of the class, and in :class:`~actors.scheduler_stall.CorePart`,
which it shares with the placement watchdog (``actors/scheduler_stall.py``, which leaves
a pool whose ready tasks wait for disk to this watchdog); this module imports nothing of
``actors/scheduler_state.py`` (no two modules import each other: tests/test_layers.py).
Pure like the rest of the core: no anyio, no sockets, no clock, no threads.

Disk-aware placement (see docs/files.md, "Disks"): a worker that advertises a disk
(``WorkerJoined.disk``, 0: no limit known) gets a task only if its free disk holds the
file inputs it must copy there plus the task's expected output (``_disk_fits``): only
what lands on the disk (inputs in memory are fetched into memory). Free disk is
its limit less the bytes it last reported on disk (``WorkerMemory.disk_used``) less what
the core reserved for the tasks it sent there and that have not finished
(``disk_reserved``). The expected output (``_expected_output``) is firm or an estimate.
Firm: the largest output a try of this very task wrote that did not fit (``disk-full``,
``disk_measured``; a refused input copy, ``DiskFull.input``, measures nothing), or a
declared ``resources={"disk": bytes}`` (it replaces the category's estimate, smaller or
larger), the larger of the two. Estimates: the largest of the category's latest
outputs (``CategoryStats.out_recent``, including tries whose output ended
``disk-full``: an earlier run's large outputs stop counting), or 0 if all its outputs
so far stayed in memory (none a file output, none ``disk-full``: ``_seen_output``), else a
guess.
A ready task that only lacks disk waits (its story says so), and the worker it would
have the most disk left on is kept for it from the producers after it in that ``_fill``
(``disk_held``): they would fill the room it waits for. One that no worker of its
pool could hold even with an empty disk fails with
:class:`~runtime.errors.TaskTooBigForDisk` only for what is firm: its inputs to fetch plus
a firm output. An estimate no worker could hold counts for nothing: the task is tried on
the worker with the most disk left after its inputs (``_candidates``), and a try that
does not fit ends ``disk-full``, which measures it.

A producer also keeps room for its consumer step's expected output beside its own
(``_consumer_room``): loads do not fill a disk their skims then cannot write on. At
most what the largest disk of its pool leaves beside its own output (a room no disk
holds even empty would make it wait for nothing), and let go in the last resort below.

The disk watchdog (``_watch_disk``): when every worker of a pool runs nothing while
ready tasks of the pool wait for disk, for ``stall_timeout`` seconds, each idle worker
takes one such task past its disk estimate until one fits again: only a task whose run
frees outputs there (``_frees``, by the pruning rule ``_holds`` at ``prune_depth``), the
one freeing the most (``_pick_past``), and only where its known output fits. If that
places nothing, the stall breaker (``_break_disk_stall``) drops stored outputs that can
be had again and whose readers have not started, cheapest first, to make room for the
first waiting task (the room placement asks for: a producer's with its consumer's;
never what that task's readers and their readers read, ``_kept_for``, nor what the
waiting tasks before it keep so); without such a plan, the one output cheapest to make
again that no waiting task keeps so. It gives up (``_breaks_again``) when it would
drop the last copy of a key whose last copy it dropped (so made it again) since a
task it did not make again last finished on a worker of the pool (a task of any
pool: ``_disk_progress``): the waiting tasks fail with TaskTooBigForDisk and the
stall's account (``_give_up_on_disk``). Only with
nothing to drop are tasks tried past their estimates regardless (``disk_last_resort``),
so the run ends with DiskFull rather than hangs (docs/files.md); there a producer
whose own output fits an idle worker runs there without its consumer's room
(``_roomy``), firm or not. Never past a firm need: in that last resort a task whose
firm need fits no worker's free disk fails with TaskTooBigForDisk
(``_least_need_now``), its pool having nothing that runs or can be dropped to free disk.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from actors.scheduler_events import DiskStallBegan, DiskStallEnded, DropData
from actors.scheduler_records import (
    ACTIVE,
    NO_LIMIT,
    ErrorRecord,
    TaskState,
    WorkerState,
    disk_stall_parts,
    error_record,
)
from actors.scheduler_stall import CorePart
from policies import CategoryStats
from runtime.errors import TaskTooBigForDisk
from runtime.graph import Key
from runtime.messages import DiskStallInfo, pool_key, pool_name

__all__ = [
    "DECLARED_OUTPUT",
    "FIRM_OUTPUTS",
    "GUESSED_OUTPUT",
    "MEASURED_AT_LEAST",
    "MEASURED_OUTPUT",
    "MEMORY_OUTPUT",
    "SEEN_OUTPUT",
    "DiskPlacement",
]

#: where a task's expected output comes from (disk-aware placement; in its error)
SEEN_OUTPUT = "the largest of its category's latest outputs"
#: a category whose outputs so far all stayed in memory: nothing counts on disk
MEMORY_OUTPUT = "none: the outputs of its category so far stayed in memory"
DECLARED_OUTPUT = 'declared with resources={"disk": ...}'
MEASURED_OUTPUT = "measured: a try of this task wrote that much and ended disk-full"
#: measured by a try the file system stopped partway (ENOSPC): the output is larger
MEASURED_AT_LEAST = TaskTooBigForDisk.AT_LEAST
GUESSED_OUTPUT = "a guess: no task of its category has finished yet"
#: the firm sources: what the user declared for this task, what this very task was
#: measured to write. Only a firm output (with the known sizes of the inputs) may
#: refuse a task (TaskTooBigForDisk); an estimate (the category's, a guess) steers.
FIRM_OUTPUTS = frozenset({DECLARED_OUTPUT, MEASURED_OUTPUT, MEASURED_AT_LEAST})


class DiskPlacement(CorePart):
    """Disk-aware placement, the disk watchdog and its stall breaker (the module
    docstring): the scheduler core's disk part, a mixin of
    :class:`~actors.scheduler_state.SchedulerState`."""

    if TYPE_CHECKING:
        # What else of the core (SchedulerState, ``CorePart``) the disk part uses: its
        # state...
        stats: dict[str, CategoryStats]
        replicas: dict[TaskState, set[str]]
        copy_failed: dict[TaskState, set[str]]
        _depth: int
        _files: dict[Key, TaskState]

        # ... and its methods.
        def _fill(self) -> None: ...
        def _candidates(self, ts: TaskState) -> list[WorkerState]: ...
        def _assign(self, ts: TaskState, ws: WorkerState) -> None: ...
        def _fail(
            self, ts: TaskState, err: BaseException, not_run: ErrorRecord | None = None
        ) -> None: ...
        def _recompute(self, root: TaskState) -> None: ...
        def _unheld(self, ts: TaskState, ws: WorkerState) -> None: ...
        def _holds(self, ts: TaskState, done: TaskState | None = None) -> int: ...
        def _upstream(self, ts: TaskState) -> set[TaskState]: ...
        def _holding(self, on: set[str] | None = None) -> list[tuple[str, int, int]]: ...

    def _init_disk(self) -> None:
        """The disk part's own state (the core's ``__init__`` calls this). The core
        writes some of it too: ``_limits_changed`` sets ``largest_disk``, ``_try_failed``
        records ``disk_measured`` (``_maybe_forget`` drops it), and each ``_fill``
        starts by clearing ``disk_parked``, ``disk_held`` and ``_past_picks``."""
        #: disk-aware placement: the largest disk limit among the workers that take new
        #: tasks, per pool and over every pool (``None``); 0 (no limit) is ``inf``
        self.largest_disk: dict[str | None, float] = {}
        #: the disk watchdog (``_watch_disk``): pools with a ready task the latest
        #: ``_fill`` kept waiting for disk; since when each such pool has run nothing;
        #: the pools whose idle workers take a task past its disk estimate
        self.disk_parked: set[str | None] = set()
        #: the workers whose free disk the latest ``_fill`` kept for a task waiting for
        #: it (each waiting task's best worker): producers that come after it in that
        #: fill do not take their disk (``_candidates``)
        self.disk_held: dict[str, Key] = {}
        self.disk_stalled_since: dict[str | None, float] = {}
        self.disk_override: set[str | None] = set()
        #: the stalls the watchdog declared and that have not ended (a pool leaves when
        #: it leaves ``disk_override``), for the log, the status and the metrics; and
        #: how many each pool ever had (its metric's key: ``"*"`` for any pool)
        self.disk_stalls: dict[str | None, DiskStallInfo] = {}
        self.disk_stall_count: Counter[str] = Counter()
        #: the stall breaker (``_break_disk_stall``): when it last dropped an output in
        #: each pool past its estimates, and how many outputs it dropped in all
        self.disk_broken_at: dict[str | None, float] = {}
        self.disk_dropped = 0
        #: pools where the stall breaker found nothing to drop: the disk watchdog then
        #: tries tasks past their estimates anyway (the run ends with DiskFull rather
        #: than waits for ever)
        self.disk_last_resort: set[str | None] = set()
        #: the stall breaker's bound: the keys whose last copy it dropped in each pool
        #: (made again) since a task that is not one it made again (``disk_remakes``)
        #: last finished on a worker of the pool. Dropping one of them again would only
        #: undo its remake: the breaker makes no progress, and the pool's waiting tasks
        #: fail (``_give_up_on_disk``). A copy dropped while another stays is not noted
        self.disk_dropped_since: dict[str | None, set[Key]] = {}
        #: the tasks the breaker's drops made run again (a dropped output with no copy
        #: left and the inputs it needs that were gone): their finishes are no
        #: progress. Active tasks only (one that ends otherwise is none any more:
        #: ``_disk_task_ended``), and only while some pool has drops noted
        self.disk_remakes: set[TaskState] = set()
        #: the disk watchdog's picks in the running ``_fill``, per pool: each idle
        #: worker's ready task that frees the most there (``_pick_past``)
        self._past_picks: dict[str | None, dict[str, tuple[TaskState, int]]] = {}
        #: the largest output a try of each task wrote that did not fit on its worker's
        #: disk (``disk-full``): what that very task needs, firm (``_expected_output``),
        #: and whether it is a lower bound (the file system stopped that try's write
        #: partway, ENOSPC: its output is larger); dropped when the task is forgotten
        self.disk_measured: dict[TaskState, tuple[int, bool]] = {}
        #: the categories a finished try of which wrote a file output (the core adds
        #: them): only their outputs are expected on disk (``_seen_output``)
        self.file_categories: set[str] = set()

    def _consumer_room(self, ts: TaskState, out: int) -> int:
        """The disk producer ``ts`` keeps free for the output of its consumer step
        beside its own (``out``): the largest expected output of its active dependents,
        where known (declared, or their category's latest largest); 0 while none is.
        Never more than the largest disk of its pool leaves beside ``out`` and ``ts``'s
        file inputs: a room no disk could hold even empty would make it wait for
        nothing (a long-lived manager's estimates from an earlier run's larger data)."""
        room = 0
        for d in ts.dependents:
            if d.state not in ACTIVE:
                continue
            declared = d.spec.resources.get("disk")
            if declared is not None:
                room = max(room, int(declared))
                continue
            seen = self._seen_output(d.spec.category)
            if seen is not None:
                room = max(room, seen[0])
        if room:
            left = self.largest_disk.get(ts.spec.pool, NO_LIMIT) - ts.in_files - out
            room = max(0, int(min(room, left)))
        return room

    def _frees(self, ts: TaskState, ws: WorkerState) -> int:
        """Bytes of outputs on ``ws`` that ``ts``'s run lets go there: those the pruning
        rule (``_holds``, at ``prune_depth``) keeps now, and no longer once ``ts`` is
        done, that no client wants. With depth 1, its inputs no other active task
        reads; deeper, outputs up to that many steps upstream; with 0, none."""
        if self._depth == 0:
            return 0
        wid = ws.id
        ups = set(ts.deps) if self._depth == 1 else self._upstream(ts)
        return sum(
            d.nbytes
            for d in ups
            if wid in d.who_has and not d.wanted and self._holds(d) and not self._holds(d, ts)
        )

    def _past_fits(self, ts: TaskState, ws: WorkerState) -> int:
        """What ``ts`` frees on idle ``ws`` when the disk watchdog may place it there
        past its disk estimate, else 0: only a task whose run frees disk there (inputs
        pruned), and only where its known output and the file inputs it must copy there
        fit in the free disk now (a guessed output may be smaller: it is tried)."""
        if ws.processing:
            return 0
        frees = self._frees(ts, ws)
        if not frees:
            return 0
        out, source = self._expected_output(ts)
        must = self._fetch_bytes(ts, ws)
        if source != GUESSED_OUTPUT:
            must += out
        return frees if must <= ws.disk_free() else 0

    def _past_pick(self, ts: TaskState, cands: list[WorkerState]) -> WorkerState | None:
        """The idle worker of ``cands`` on which the disk watchdog places ``ts`` past its
        disk estimate: one where, of the ready tasks of its pool, ``ts`` frees the most
        (``_past_fits``; ties: the first in priority), the most freed first; ``None``
        if there is none (it waits: placing it would free nothing or overflow)."""
        picks = self._past_picks.get(ts.spec.pool)
        if picks is None:
            picks = self._past_picks[ts.spec.pool] = self._pick_past(ts.spec.pool, ts)
        mine = [w for w in cands if picks.get(w.id, (None, 0))[0] is ts and not w.processing]
        if not mine:
            return None
        return max(mine, key=lambda w: (picks[w.id][1], w.id))

    def _pick_past(self, pool: str | None, head: TaskState) -> dict[str, tuple[TaskState, int]]:
        """For each idle worker of ``pool`` with a disk, the ready task of the pool that
        frees the most there among those the watchdog may place on it (``_past_fits``),
        the first in priority among equals, with what it frees. ``head``: the task
        ``_fill`` took off its heap, first in priority."""
        idle = [
            w for w in self.free.values()
            if w.disk and not w.processing and self._runs_on(pool, w)
        ]  # fmt: skip
        picks: dict[str, tuple[TaskState, int]] = {}
        if not idle:
            return picks
        ready = [head]
        for q, heap in self.queues.items():
            if q[0] == pool:
                ready.extend(entry[3] for entry in sorted(heap))
        for t in ready:
            if t.state != "queued" or not t.deps:
                continue
            for w in idle:
                frees = self._past_fits(t, w)
                if frees and frees > picks.get(w.id, (t, 0))[1]:
                    picks[w.id] = (t, frees)
        return picks

    def _tell_disk_held(self, ts: TaskState, held: list[WorkerState]) -> None:
        """Say in producer ``ts``'s story, once per change, that the disk of the workers
        that would take it (``held``) is kept for tasks ahead of it that wait for it."""
        ws = min(held, key=lambda w: w.id)
        why = (
            f"waiting for disk: {ws.id}'s free disk is kept for "
            f"{self.disk_held[ws.id]!r}, which comes first and waits for it"
        )
        if why != ts.wait_said:
            ts.wait_said = why
            self._log(ts.key, "queued", why)

    def _most_disk_left(
        self, ts: TaskState, cands: list[WorkerState], out: int, *, idle: bool = True
    ) -> WorkerState:
        """The worker of ``cands`` (the idle ones, with ``idle``) with the most disk
        left after ``ts``'s inputs to fetch plus ``out``."""
        pick = [w for w in cands if not w.processing] if idle else cands
        return max(pick, key=lambda w: (w.disk_free() - self._fetch_bytes(ts, w) - out, w.id))

    def _roomy(self, ts: TaskState, cands: list[WorkerState], out: int) -> list[WorkerState]:
        """The idle workers of ``cands`` whose free disk holds ``ts``'s inputs to fetch
        and ``out``: the room kept for a consumer's output left out (the last resort)."""
        return [w for w in cands if not w.processing and self._disk_fits(ts, w, out)]

    # Disk-aware placement (the module docstring; docs/files.md, "Disks").

    def _expected_output(self, ts: TaskState) -> tuple[int, str]:
        """The output ``ts`` is expected to write, and where that figure comes from.

        Firm (``FIRM_OUTPUTS``): the largest output a try of this very task wrote that
        did not fit (``disk-full``), or its declared ``resources={"disk": ...}``,
        whichever is larger: a declaration replaces the category's estimate, smaller
        or larger. Else estimates: what its category put on disk so far
        (``_seen_output``), else a guess (at most half of what the largest disk of
        its pool leaves beside its file inputs)."""
        declared = ts.spec.resources.get("disk")
        if self.disk_measured:  # (usually empty: no lookup then)
            measured, at_least = self.disk_measured.get(ts, (None, False))
            if measured is not None and (declared is None or measured >= declared):
                return measured, MEASURED_AT_LEAST if at_least else MEASURED_OUTPUT
        if declared is not None:
            return max(0, int(declared)), DECLARED_OUTPUT
        seen = self._seen_output(ts.spec.category)
        if seen is not None:
            return seen
        room = self.largest_disk.get(ts.spec.pool, NO_LIMIT) - ts.in_files
        return int(max(0, min(self.config.unknown_output, room / 2))), GUESSED_OUTPUT

    def _seen_output(self, category: str) -> tuple[int, str] | None:
        """What a task of ``category`` is expected to put on disk from what its tasks
        wrote so far (``None``: none finished). Only file outputs land on a disk for
        sure: a category whose outputs all stayed in memory (none a file output, none
        ended ``disk-full``) counts 0. A worker spills an in-memory output only up to
        its ``--disk``, and one that does not fit there ends ``disk-full``: from then
        on its category's largest output counts."""
        st = self.stats.get(category)
        if st is None or not (st.count or st.disk_full):
            return None
        if st.disk_full or category in self.file_categories:
            return st.out_recent, SEEN_OUTPUT
        return 0, MEMORY_OUTPUT

    @staticmethod
    def _fetch_bytes(ts: TaskState, ws: WorkerState) -> int:
        """Bytes of ``ts``'s file inputs that ``ws`` does not hold: it must copy them
        to its disk (inputs in memory are fetched into memory, not onto its disk)."""
        wid = ws.id
        return sum(d.nbytes for d in ts.deps if d.file and wid not in d.who_has)

    def _disk_fits(self, ts: TaskState, ws: WorkerState, out: int) -> bool:
        """``ws``'s free disk holds the file inputs ``ts`` must fetch there plus ``out``."""
        if not ws.disk:
            return True
        free = ws.disk - ws.disk_used - ws.disk_reserved
        if ts.in_files + out <= free:
            return True  # even with every input to fetch
        if out > free:
            return False
        return self._fetch_bytes(ts, ws) + out <= free

    @staticmethod
    def _held_files(ts: TaskState, ws: WorkerState) -> int:
        """Bytes of ``ts``'s file inputs that ``ws`` holds: on its disk, and they stay
        there while ``ts`` needs them."""
        wid = ws.id
        return sum(d.nbytes for d in ts.deps if d.file and wid in d.who_has)

    def _least_need(self, ts: TaskState, out: int) -> tuple[int | None, int, int]:
        """``(None, 0, 0)`` if some worker of ``ts``'s pool (taking new tasks) could
        hold the inputs ``ts`` must fetch there plus ``out`` with its disk otherwise
        empty: all but ``ts``'s file inputs that it holds already (they stay while
        ``ts`` waits for them). Else the least disk it needs on any of them (those
        file inputs counted), the largest of their disks, and the bytes of file inputs
        held on the worker it needs least on (among equal needs, the one holding the
        most: its error then says they are on that disk already, not to be fetched)."""
        pool = ts.spec.pool
        if ts.in_files + out <= self.largest_disk.get(pool, NO_LIMIT):
            return None, 0, 0  # fits the largest disk even with every input to fetch
        least: tuple[int, int] | None = None  # (need, of which held, negated)
        largest = 0
        for w in self.workers.values():
            if w.draining or (pool is not None and w.pool != pool):
                continue
            held = self._held_files(ts, w)
            need = self._fetch_bytes(ts, w) + held + out
            if not w.disk or need <= w.disk:
                return None, 0, 0  # it fits there once that disk has room
            least = (need, -held) if least is None else min(least, (need, -held))
            largest = max(largest, w.disk)
        if least is None:
            return None, largest, 0
        return least[0], largest, -least[1]

    def _least_need_now(self, ts: TaskState, out: int) -> tuple[int | None, int, str]:
        """As ``_least_need``, but against the disk the workers of ``ts``'s pool have
        free now, for a pool stuck on disk with nothing to drop (``disk_last_resort``:
        none of them runs a task, no stored output can be made again elsewhere): what
        is free now is all they will have, so a firm need larger than every free disk
        cannot be met by waiting. ``(None, 0, "")`` while some worker of the pool runs
        a task (it may free disk) or some worker has the room; else ``ts``'s need on
        the worker it comes closest to fitting on, that worker's free disk and its id
        (``_closest_fit``)."""
        workers = self._pool_workers(ts.spec.pool)
        if not workers or any(w.processing for w in workers):
            return None, 0, ""
        need, free, wid = self._closest_fit(ts, out, workers)
        if need <= free:
            return None, 0, ""
        return need, free, wid

    def _held_by_futures(self, pool: str | None) -> tuple[tuple[str, int, int], ...]:
        """The file outputs on the disks of ``pool``'s workers that only a client's
        futures hold (a client wants them, no active task reads them): ``(category,
        bytes, outputs)``, the most bytes first, four categories at most (a copy on
        each holder counting). What a stuck pool's TaskTooBigForDisk advises releasing
        first: the stall breaker never drops them."""
        held: dict[str, list[int]] = {}
        for w in self._pool_disks(pool):
            for t in w.has_what:
                if t.file and t.wanted and not t.consumers and t.nbytes:
                    entry = held.setdefault(t.spec.category, [0, 0])
                    entry[0] += t.nbytes
                    entry[1] += 1
        ranked = sorted(held.items(), key=lambda kv: (-kv[1][0], kv[0]))[:4]
        return tuple((c, b, n) for c, (b, n) in ranked)

    def _closest_fit(
        self, ts: TaskState, out: int, workers: list[WorkerState]
    ) -> tuple[int, int, str]:
        """Of ``workers`` (at least one), the one ``ts`` comes closest to fitting on now:
        its need there (the file inputs it must fetch plus ``out``), its free disk and
        its id; the least shortfall first, then the least need. Need and free are one
        worker's, so that an error compares like with like (a need counted where its
        inputs are held against the free disk of another worker read as a contradiction:
        a user audit's "needs 38.1 MiB, more than ... 61.9 MiB")."""
        best: tuple[tuple[int, int, str], int] | None = None  # ((short, need, id), free)
        for w in workers:
            free = max(0, int(w.disk_free()))
            need = self._fetch_bytes(ts, w) + out
            rank = (need - free, need, w.id)
            if best is None or rank < best[0]:
                best = (rank, free)
        assert best is not None
        (_, need, wid), free = best
        return need, free, wid

    def _waits_for_disk(self, ts: TaskState, refused: list[WorkerState]) -> bool:
        """``ts`` is ready and the free workers in ``refused`` would take it but for
        their disk. If some worker of its pool (taking new tasks) could hold it with its
        disk otherwise empty, it waits, and its story says for what (the refused worker
        with the most disk to spare, when that changes); else it fails with
        TaskTooBigForDisk. Only what is firm refuses a task: the inputs it must fetch
        and a firm output (``FIRM_OUTPUTS``); an estimate no worker could hold counts
        for nothing (``_candidates`` tries the task where its inputs fit). Returns
        whether it waits."""
        out, source = self._expected_output(ts)
        least_need, largest, held = self._least_need(ts, out)
        stuck = False  # largest: the disk free now on worker ``on``, not the largest limit
        on = ""
        if least_need is None and source in FIRM_OUTPUTS and ts.spec.pool in self.disk_last_resort:
            least_need, largest, on = self._least_need_now(ts, out)
            stuck = least_need is not None
        if least_need is not None and source not in FIRM_OUTPUTS:
            out, source = 0, TaskTooBigForDisk.UNCOUNTED
            least_need, largest, held = self._least_need(ts, 0)
        if least_need is None:
            keep = self._consumer_room(ts, out) if ts.producer else 0
            best: tuple[float, str, int, float] | None = None  # (room after, id, need, free)
            for w in refused:
                need = self._fetch_bytes(ts, w) + out + keep
                free = w.disk_free()
                if best is None or (free - need, w.id) > (best[0], best[1]):
                    best = (free - need, w.id, need, free)
            if best is not None:
                _, wid, need, free = best
                # Told once per change of what it needs (its output, the room it keeps),
                # not per change of the free bytes or of the best worker: those move
                # with every report while it waits.
                mark = f"waiting for disk: {out} {source} {keep}"
                if mark != ts.wait_said:
                    ts.wait_said = mark
                    why = f"needs {need} B, best worker {wid} has {max(0, int(free))} B free"
                    if keep:
                        why += f" (of which {keep} B kept for its consumer's output)"
                    self._log(ts.key, "queued", f"waiting for disk: {why}")
                self.disk_held.setdefault(wid, ts.key)
            return True
        last = ts.tries[-1] if ts.tries else None
        err = TaskTooBigForDisk(
            str(ts.key), least_need, largest, ts.spec.pool, out, source,
            held=held,
            tries=len(ts.tries),
            outcome=last.outcome if last is not None else "",
            worker=last.worker if last is not None else "",
            stuck=stuck, on=on,
            held_by=self._held_by_futures(ts.spec.pool) if stuck else (),
        )  # fmt: skip
        self._log(ts.key, "disk", f"too big: needs {least_need} B > {largest} B")
        self._fail(ts, err, error_record(err))
        return False

    def _watch_disk(self) -> None:
        """The disk watchdog: a pool whose ready tasks wait for disk while every one of
        its workers runs nothing for ``stall_timeout`` seconds would wait for ever (only
        a task that runs frees disk: its inputs pruned, spilled outputs read back). Its
        idle workers then take such tasks past their disk estimate (``_candidates``),
        one each at a time, until a task fits again or none waits."""
        for pool in list(self.disk_stalled_since):
            if pool not in self.disk_parked or pool in self.disk_override:
                del self.disk_stalled_since[pool]
        self.disk_override = {
            p for p in self.disk_override if any(h for q, h in self.queues.items() if q[0] == p)
        }
        for pool in self.disk_parked - self.disk_override:
            if self._pool_runs(pool):
                self.disk_stalled_since.pop(pool, None)  # a task runs: it may free disk
                continue
            since = self.disk_stalled_since.get(pool)
            if since is None:
                self.disk_stalled_since[pool] = self._now
                self._log("-", "disk", f"stall-suspected in pool {pool_name(pool)}")
            elif self._now - since >= self.config.stall_timeout:
                del self.disk_stalled_since[pool]
                self.disk_override.add(pool)
                self._log("-", "disk", f"stalled in pool {pool_name(pool)}: placing past estimates")
                self._disk_stall_began(pool)
                self._fill()
        # The stall breaker: a pool past its estimates whose workers still run nothing
        # (no ready task frees disk where it could run) drops a stored output that can
        # be made again, at once and then once per stall_timeout while that lasts.
        for pool in list(self.disk_broken_at):
            if pool not in self.disk_override:
                del self.disk_broken_at[pool]
        self.disk_last_resort &= self.disk_override
        for pool in sorted(self.disk_override & self.disk_parked, key=str):
            if self._pool_runs(pool):
                self.disk_broken_at.pop(pool, None)
                continue
            at = self.disk_broken_at.get(pool)
            if at is not None and self._now - at < self.config.stall_timeout:
                continue
            self.disk_broken_at[pool] = self._now
            # Whatever it did (dropped outputs, found nothing to drop: the last resort;
            # failed the waiting tasks), placement asks again.
            self._break_disk_stall(pool)
            self._fill()

    def _pool_runs(self, pool: str | None) -> bool:
        """Some worker of ``pool`` (not draining) runs a task."""
        return any(ws.processing for ws in self._pool_workers(pool))

    def _break_disk_stall(self, pool: str | None) -> bool:
        """Every worker of ``pool`` is stuck on disk and nothing can run: drop stored
        outputs that can be had again (another copy, or made again from their spec:
        lineage) and whose readers have not started, to make room. For the first task
        in priority that waits for disk (a task that reads inputs first: its run frees
        them), on the worker where that costs least: copies held elsewhere too, then
        the cheapest to make again (``remake``), the largest first among equals, never
        what it and its readers read nor what the waiting tasks before it read
        (``_room_plan``), until it fits; it gets the room. Without such a task, the one
        output cheapest to make again anywhere in the pool that no waiting task (nor
        its readers) reads. Their stories say so; what is gone is made again when its
        readers' turn comes. Dropping again what it made again, with no task finished
        on the pool's workers since, fails the waiting tasks instead (``_breaks_again``).
        Returns whether anything was dropped."""
        ready = sorted(
            (e for q, heap in self.queues.items() if q[0] == pool for e in heap),
            key=lambda e: (not e[3].deps, e),
        )
        waiting: list[TaskState] = []  # (a heap may hold a stale entry of a task queued again)
        for entry in ready:
            t: TaskState = entry[3]
            if t.state == "queued" and t not in waiting:
                waiting.append(t)
        ahead: set[TaskState] = set()  # what the waiting tasks before ``t`` read
        for t in waiting:
            plan = self._room_plan(t, pool, ahead)
            ahead |= self._kept_for(t)
            if plan is not None:
                ws, drops = plan
                if self._breaks_again(pool, drops, ws, waiting):
                    return False
                for d in drops:
                    self._drop_for_room(d, ws, pool, t)
                # The room goes to the task it was made for: what the latest fill kept
                # for waiting tasks (``disk_held``) does not keep it from this one.
                self.disk_held.clear()
                if ws in self._candidates(t):
                    self._assign(t, ws)
                return True
        # Without a plan, never what a waiting task reads (nor its readers' other
        # inputs): its remake would take back the room the waiting task needs, and
        # that task would wait again (the diskfull audit's loop, every stall_timeout).
        kept = ahead
        best: tuple[tuple[Any, ...], TaskState, WorkerState] | None = None
        for ws in self._pool_disks(pool):
            for d in ws.has_what:
                if d not in kept and self._droppable(d):
                    rank = (not d.file, *self._drop_rank(d))
                    if best is None or rank < best[0]:
                        best = (rank, d, ws)
        if best is None:
            self.disk_last_resort.add(pool)
            self._log("-", "disk", f"stalled in pool {pool_name(pool)}: nothing to drop")
            return False
        if self._breaks_again(pool, [best[1]], best[2], waiting):
            return False
        self._drop_for_room(best[1], best[2], pool, None)
        return True

    def _breaks_again(
        self,
        pool: str | None,
        drops: list[TaskState],
        ws: WorkerState,
        waiting: list[TaskState],
    ) -> bool:
        """The stall breaker's bound: would dropping ``drops`` from ``ws`` drop the
        last copy of a key whose last copy it dropped in ``pool`` already, with no task
        it did not make again finished on the pool's workers since
        (``disk_dropped_since``)? Then breaking makes no progress (the remake takes the
        room back, the same stall comes again): the ``waiting`` tasks fail
        (``_give_up_on_disk``), and it returns True. Else it notes those of ``drops``
        that leave no copy (they are made again). Dropping a copy held elsewhere too
        makes nothing again: it is neither noted nor ever "again"."""
        wid = ws.id
        last = [d for d in drops if d.who_has <= {wid}]
        since = self.disk_dropped_since.get(pool, set())
        again = next((d for d in last if d.key in since), None)
        if again is None:
            if last:
                self.disk_dropped_since.setdefault(pool, set()).update(d.key for d in last)
            return False
        self._give_up_on_disk(pool, again, waiting)
        return True

    def _disk_progress(self, ts: TaskState, ws: WorkerState) -> None:
        """``ts`` finished on ``ws`` (the core calls this while the breaker has dropped
        outputs): unless the breaker made it run again, the pools whose disks ``ws``
        is one of made progress (its task's pool, its own pool, and any pool:
        ``None``), and what the breaker dropped there may be dropped again."""
        if ts in self.disk_remakes:
            self.disk_remakes.discard(ts)
            return
        for pool in (ts.spec.pool, ws.pool, None):
            self.disk_dropped_since.pop(pool, None)
        if not self.disk_dropped_since:
            self.disk_remakes.clear()

    def _disk_task_ended(self, ts: TaskState) -> None:
        """``ts`` left the active states (the core calls this while the breaker has
        remakes): done, cancelled, released or failed, it is no remake any more; a
        later run of it (run again, resubmitted) is not one the breaker made."""
        self.disk_remakes.discard(ts)

    def _give_up_on_disk(
        self, pool: str | None, again: TaskState, waiting: list[TaskState]
    ) -> None:
        """The stall breaker cannot make progress in ``pool``: it would drop ``again``
        once more, made again since it dropped it with no task finished on the pool's
        workers between. Each ``waiting`` task fails with TaskTooBigForDisk
        (``stuck``), with the stall's account: what fills the disks, and the other
        programs' files on their file systems, for which a larger --disk cannot help.
        With no pool's drops noted any more, no task is a remake (``disk_remakes``)."""
        stall = self._stall_info(pool)
        parts = disk_stall_parts(stall)
        account = f"{parts['disk']}, holding {parts['holding']}"
        self._log(
            "-", "disk",
            f"stall in pool {pool_name(pool)} cannot be broken: {again.key!r} would be "
            "dropped again with no task finished since",
        )  # fmt: skip
        self.disk_dropped_since.pop(pool, None)
        if not self.disk_dropped_since:
            self.disk_remakes.clear()
        workers = self._pool_disks(pool)
        held_by = self._held_by_futures(pool)
        for t in waiting:
            if t.state != "queued":
                continue
            out, source = self._expected_output(t)
            need, free, on = self._closest_fit(t, out, workers) if workers else (out, 0, "")
            last = t.tries[-1] if t.tries else None
            err = TaskTooBigForDisk(
                str(t.key), need, free, t.spec.pool, out, source,
                tries=len(t.tries),
                outcome=last.outcome if last is not None else "",
                worker=last.worker if last is not None else "",
                stuck=True, stall=account, foreign=stall.foreign, again=str(again.key), on=on,
                held_by=held_by,
            )  # fmt: skip
            self._log(t.key, "disk", f"no room can be made: needs {need} B > {free} B free")
            self._fail(t, err, error_record(err))

    def _pool_disks(self, pool: str | None) -> list[WorkerState]:
        """The workers of ``pool`` with a disk limit, not draining."""
        return [
            w for w in self.workers.values()
            if w.disk and not w.draining and self._runs_on(pool, w)
        ]  # fmt: skip

    def _droppable(self, d: TaskState) -> bool:
        """The stall breaker may drop ``d``'s output: stored, wanted by no client, read
        by active tasks none of which has started (it would be reading it), and with
        no temporary replicas (those are kept for a reason)."""
        return (
            d.state == "memory"
            and not d.wanted
            and d.consumers > 0
            and d not in self.replicas
            and not any(r.state == "processing" for r in d.dependents)
        )

    @staticmethod
    def _drop_rank(d: TaskState) -> tuple[float, int, str]:
        """What dropping one copy of ``d`` costs, least first: nothing when another
        worker holds it too, else the work to make it again; the most bytes first."""
        return (0.0 if len(d.who_has) > 1 else d.remake, -d.nbytes, str(d.key))

    def _room_plan(
        self, ts: TaskState, pool: str | None, ahead: set[TaskState]
    ) -> tuple[WorkerState, list[TaskState]] | None:
        """The worker where dropping file outputs (``_droppable``) makes room for ``ts``
        at the least cost, and those outputs; ``None`` if no worker can be made to hold
        it. The room is what placement asks for (``_candidates``): with a producer's,
        the room it keeps for its consumer's output (``_consumer_room``). Never dropped:
        ``ts``'s inputs, nor the other inputs of its readers and of their readers
        (``_kept_for``): dropping a skim for a load whose merge reads that skim would
        only undo the load's use, and the skim's remake takes that room first. Nor
        ``ahead``: what the waiting tasks before ``ts`` keep so (a plan for a later
        task that dropped an earlier one's input would send that one back to wait)."""
        out = self._expected_output(ts)[0]
        if ts.producer:
            out += self._consumer_room(ts, out)
        own = self._kept_for(ts)  # (and ``ahead``: tested apart, not copied per task)
        best: tuple[tuple[float, int, str], WorkerState, list[TaskState]] | None = None
        for ws in self._pool_disks(pool):
            short = self._fetch_bytes(ts, ws) + out - ws.disk_free()
            if short <= 0:
                continue
            drops: list[TaskState] = []
            freed = cost = 0.0
            may = [
                d for d in ws.has_what
                if d.file and d not in own and d not in ahead and self._droppable(d)
            ]  # fmt: skip
            for d in sorted(may, key=self._drop_rank):
                drops.append(d)
                freed += d.nbytes
                cost += self._drop_rank(d)[0]
                if freed >= short:
                    break
            if freed < short:
                continue
            rank = (cost, len(drops), ws.id)
            if best is None or rank < best[0]:
                best = (rank, ws, drops)
        return None if best is None else (best[1], best[2])

    @staticmethod
    def _kept_for(ts: TaskState) -> set[TaskState]:
        """The outputs the stall breaker keeps when it makes room for ``ts``: its inputs
        and those of its active readers and of their active readers (two steps down)."""
        kept = set(ts.deps)
        step = [d for d in ts.dependents if d.state in ACTIVE]
        for _ in range(2):
            nxt: list[TaskState] = []
            for r in step:
                kept.update(r.deps)
                nxt.extend(d for d in r.dependents if d.state in ACTIVE)
            step = nxt
        return kept

    def _drop_for_room(
        self, d: TaskState, ws: WorkerState, pool: str | None, waiter: TaskState | None
    ) -> None:
        """Drop ``d``'s copy on ``ws`` to make room (the stall breaker); with no copy
        left, it is made again from its spec when its readers need it."""
        d.who_has.discard(ws.id)
        self._unheld(d, ws)
        if d.file:  # off its disk now; its next report says the rest
            ws.disk_used = max(0, ws.disk_used - d.nbytes)
        self._out.append(DropData(self._stimulus, ws.id, (d.key,)))
        self._files[d.key] = d
        self.copy_failed.pop(d, None)
        self.disk_dropped += 1
        again = (
            f"another copy stays on {', '.join(sorted(d.who_has))}"
            if d.who_has
            else f"it is made again (about {d.remake:.3g} s of work) when its readers run"
        )
        why = f" for {waiter.key!r}" if waiter is not None else ""
        self._log(
            d.key, "disk",
            f"dropped from {ws.id} to make room{why}: every worker of pool {pool_name(pool)} "
            f"was stuck on disk with nothing to run; {d.nbytes} B freed, {again}",
        )  # fmt: skip
        self._log("-", "disk", f"stall broken in pool {pool_name(pool)}: dropped {d.key!r}")
        if not d.who_has:
            gone: set[TaskState] = set()  # the inputs its remake needs made again too
            stack = list(d.deps)
            while stack:
                t = stack.pop()
                if t not in gone and t.state != "memory" and t.state not in ACTIVE:
                    gone.add(t)
                    stack.extend(t.deps)
            self._recompute(d)
            self.disk_remakes.add(d)
            self.disk_remakes.update(t for t in gone if t.state in ACTIVE)

    def _disk_stall_began(self, pool: str | None) -> None:
        """The watchdog found ``pool`` stalled for disk: keep its account (its workers,
        what fills their disks, what waits) and tell the shell, once per stall."""
        stall = self._stall_info(pool)
        self.disk_stalls[pool] = stall
        self.disk_stall_count[stall.pool] += 1
        self._out.append(DiskStallBegan(self._stimulus, stall))

    def _stall_info(self, pool: str | None) -> DiskStallInfo:
        """The account of ``pool``'s disk stall now: its workers, what fills their
        disks (other programs' files apart), what waits."""
        workers = self._pool_workers(pool)
        ready = {  # (a heap may hold a stale entry of a task queued again)
            entry[3]
            for (p, _), heap in self.queues.items()
            if p == pool
            for entry in heap
            if entry[3].state == "queued"
        }
        waiting = Counter(ts.spec.category for ts in ready)
        return DiskStallInfo(
            pool=pool_key(pool),
            since=self._now,
            workers=tuple(sorted(ws.id for ws in workers)),
            disk_used=sum(ws.disk_used for ws in workers),
            disk=sum(ws.disk for ws in workers),
            holding=tuple(self._holding({ws.id for ws in workers})),
            waiting=tuple(waiting.most_common()),
            queued=sum(waiting.values()),
            foreign=sum(ws.disk_foreign for ws in workers),
        )

    def _disk_stalls_ended(self) -> None:
        """A pool the watchdog no longer finds stalled (it left ``disk_override``: a
        task of it fits a disk again, or none waits) ends its stall."""
        for pool in [p for p in self.disk_stalls if p not in self.disk_override]:
            stall = self.disk_stalls.pop(pool)
            self._log("-", "disk", f"stall in pool {pool_name(pool)} ended")
            self._out.append(DiskStallEnded(self._stimulus, stall, self._now - stall.since))
