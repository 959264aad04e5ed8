"""Preemption on a checkpoint partition: Corral's default retry policy against a
Parsl-style one, on the real scheduler core driven by a virtual clock.

The workload is issue 11's seed (astronomers on a Slurm "checkpoint" partition plus a few
permanent nodes): many tasks of 5-7 min, thousands of ~20 min, a few hundred of hours, and
some *bad* tasks that always raise. The checkpoint pool ``ckpt`` keeps one-core workers
whose lives follow a Weibull distribution (shape > 1: the older a worker, the likelier it
is taken back; median 30 min); a preempted worker's block is replaced by the autoscaler
and the new one joins after a queue wait. The pool ``owner`` has a few permanent workers.
Every task is submitted to ``ckpt``.

Nothing here re-implements scheduling. A discrete-event loop (a heap of timed events, no
threads, no sleeps) feeds the real pure cores: :class:`SchedulerState` (placement,
tries, retry decisions, the pool's survival estimate), :class:`AutoscalerState` (blocks
and their replacement) and the file registry's :class:`FileTable` (results released once
the client has them). It carries out their commands: an ``Execute`` starts the task on
its simulated worker and schedules its end at ``now + duration`` (or its error, for a bad
task); a preemption at its sampled time is a ``WorkerLeft(cause="preempted")`` to the
scheduler and a ``BlockEnded`` to the autoscaler. It runs until every task is done or
failed.

Two systems, on the same seed, so the same task durations, the same bad tasks and the
same sampled worker lives (the n-th checkpoint block waits and lives the same in both):

- ``parsl-style``: a retry policy written here (:class:`ParslStyleRetry`): every try
  that did not end ok, preemptions included, spends the user's ``retries`` (3, Parsl's
  common setting); a retry keeps its place in the queue (ahead of work submitted after
  it), no fallback pool, no notion of a worker's life;
- ``corral``: Corral's defaults, ``DefaultRetry(fallback={"ckpt": "owner"})`` with
  ``retries=0``: errors fail fast, tries lost to preemption are free (up to
  ``max_lost``, then it moves to ``owner`` instead of failing), retries go behind fresh
  work, and a task preempted after running past the pool's median worker life
  (Kaplan-Meier, once known), or whose category's finished tasks average that long,
  moves to ``owner``.

One more, only when asked (``--systems all``), is a prototype written here to measure
what the defaults lack, not Corral's behaviour:

- ``corral-drain``: the defaults, and a checkpoint worker that just became idle is
  drained (and its block replaced) when the pool's survival estimate gives it less than
  even odds of living through a typical task (issue 11 item 6, roughly).

All run one task at a time per one-core worker (``saturation=1``: nothing waits on a
worker, so a preemption cuts at most the task that runs there).

    python benchmarks/preemption.py                   # the default size, seed 1
    python benchmarks/preemption.py --repeat 3        # seeds 1, 2, 3
    python benchmarks/preemption.py --quick --json    # small, machine-readable
    python benchmarks/preemption.py --systems all     # with the prototype (corral-drain)

Measured per system: makespan, core-hours lost to preemption (the work of tries cut
short), tries cut, good tasks failed, tries spent on bad tasks (total and the most per
bad task), tasks moved to ``owner``; then the ratios corral / parsl-style and the issue's
targets (at least 30% fewer core-hours lost, no good task failed, bad tasks failed within
2 tries), each said met or not.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import math
import random
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from actors.autoscaler_state import (  # noqa: E402
    AutoscalerConfig,
    AutoscalerState,
    BlockEnded,
    BlockStarted,
    GaveUp,
    ReportGone,
    StartBlock,
    TargetSet,
)
from actors.protocol import TaskResult  # noqa: E402
from actors.registry import FilesDropped, FileTable  # noqa: E402
from actors.scheduler_events import (  # noqa: E402
    CancelOnWorker,
    Event,
    Execute,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    KeyCancelled,
    KeyDone,
    KeyErred,
    KeysReleased,
    RetireWorker,
    TasksFinished,
    WorkerDraining,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_records import SchedulerConfig  # noqa: E402
from actors.scheduler_state import SchedulerState  # noqa: E402
from policies import RetryDecision, TaskView  # noqa: E402
from policies.retry import DefaultRetry  # noqa: E402
from runtime.graph import Key, Task, TaskSpec, build_specs  # noqa: E402

HOUR = 3600.0
SYSTEMS = ("parsl-style", "corral", "corral-drain")
DEFAULT_SYSTEMS = ("parsl-style", "corral")


class BadInput(ValueError):
    """What a bad task raises, every time."""


@dataclasses.dataclass(frozen=True)
class Params:
    """The workload and the fleet. Durations in seconds of virtual time."""

    n_short: int = 10_000  #: tasks of 5-7 min
    n_medium: int = 3_000  #: tasks of ~20 min
    n_long: int = 300  #: tasks of 1-4 h
    bad_fraction: float = 0.01  #: of all tasks: raise every time, after 10-120 s
    ckpt_workers: int = 100  #: one-core workers (blocks) kept in the checkpoint pool
    owner_workers: int = 8  #: permanent one-core workers
    median_life: float = 30 * 60.0  #: of a checkpoint worker
    shape: float = 2.0  #: Weibull shape (> 1: the hazard grows with age)
    wait: tuple[float, float] = (30.0, 180.0)  #: queue wait of a checkpoint block
    retries: int = 3  #: the parsl-style baseline's user retries (Corral's: 0)
    #: Corral's ``DefaultRetry(max_lost=...)``; ``None``: the policy's default
    max_lost: int | None = None
    #: the autoscaler's replacement budget (unasked block ends per 60 s before it gives
    #: up on the pools); ``None``: one per checkpoint worker (see ``Simulation``)
    replacements: int | None = None

    @property
    def n_tasks(self) -> int:
        return self.n_short + self.n_medium + self.n_long


#: ``--quick``: a few seconds per system (the test uses it)
QUICK = Params(n_short=600, n_medium=180, n_long=20, ckpt_workers=20, owner_workers=2)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What each task does: ``seconds[key]`` until it ends (ok, or its error for a bad
    one); ``order``: the submission order (shuffled, the mix a user submits)."""

    seconds: Mapping[str, float]
    bad: frozenset[str]
    order: tuple[str, ...]

    def kind(self, key: str) -> str:
        return key.split("-", 1)[0]


def make_workload(p: Params, seed: int) -> Workload:
    rng = random.Random(f"workload-{seed}")
    seconds: dict[str, float] = {}
    for i in range(p.n_short):
        seconds[f"short-{i}"] = rng.uniform(5 * 60, 7 * 60)
    for i in range(p.n_medium):
        seconds[f"medium-{i}"] = rng.uniform(18 * 60, 22 * 60)
    for i in range(p.n_long):
        seconds[f"long-{i}"] = rng.uniform(1 * HOUR, 4 * HOUR)
    keys = list(seconds)
    n_bad = round(p.bad_fraction * len(keys))
    bad = rng.sample(keys, n_bad)
    for key in bad:
        seconds[key] = rng.uniform(10, 120)  # a bad input raises early
    rng.shuffle(keys)
    return Workload(seconds, frozenset(bad), tuple(keys))


class Lives:
    """The n-th checkpoint block's queue wait and life, drawn once per seed from a
    stream of their own: every system sees the same blocks wait and die the same."""

    def __init__(self, p: Params, seed: int) -> None:
        self._rng = random.Random(f"lives-{seed}")
        self._scale = p.median_life / math.log(2) ** (1 / p.shape)
        self._shape = p.shape
        self._wait = p.wait
        self._drawn: list[tuple[float, float]] = []

    def __getitem__(self, n: int) -> tuple[float, float]:
        while len(self._drawn) <= n:
            wait = self._rng.uniform(*self._wait)
            life = self._rng.weibullvariate(self._scale, self._shape)
            self._drawn.append((wait, life))
        return self._drawn[n]


@dataclasses.dataclass(frozen=True, slots=True)
class ParslStyleRetry:
    """The baseline: every try that did not end ok (an error raised by the task, or a
    worker lost to preemption) spends one of the user's ``retries``; the retry keeps its
    place in the queue (``behind=False``: ahead of work submitted after it); no fallback
    pool; nothing known of how long workers live."""

    name: str = "parsl-style"

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        if task.retries_left > 0:
            why = f"{outcome} ({cause})" if cause else outcome
            return RetryDecision(True, charge=True, behind=False, reason=f"{why}; retry")
        return RetryDecision(False, reason=f"{outcome}; retries spent")


def corral_retry(max_lost: int | None = None) -> DefaultRetry:
    """Corral's default retry policy, with the checkpoint pool's fallback set."""
    if max_lost is None:
        return DefaultRetry(fallback={"ckpt": "owner"})
    return DefaultRetry(max_lost=max_lost, fallback={"ckpt": "owner"})


@dataclasses.dataclass(slots=True)
class Attempt:
    key: str
    worker: str
    start: float
    token: int


@dataclasses.dataclass
class Result:
    """One system's run. ``cut``: ``(worker, key, start, stop)`` of every try cut short by a
    preemption; ``blocks``: ``(n, joined, life)`` of every checkpoint block that joined."""

    system: str
    seed: int
    makespan: float = 0.0
    done: set[str] = dataclasses.field(default_factory=set)
    failed: set[str] = dataclasses.field(default_factory=set)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  #: failed key -> error
    tries: dict[str, int] = dataclasses.field(default_factory=dict)
    cut: list[tuple[str, str, float, float]] = dataclasses.field(default_factory=list)
    blocks: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    on_owner: set[str] = dataclasses.field(default_factory=set)
    preemptions: int = 0
    drained: int = 0  #: checkpoint workers drained for their age (corral-drain)
    gave_up: int = 0
    unfinished: int = 0  #: tasks neither done nor failed when nothing was left to happen
    wall: float = 0.0
    bad: frozenset[str] = frozenset()

    @property
    def lost_core_hours(self) -> float:
        return sum(stop - start for _, _, start, stop in self.cut) / HOUR

    def lost_by_kind(self) -> dict[str, float]:
        """Core-hours lost to preemption per kind of task (short, medium, long)."""
        out: dict[str, float] = {}
        for _, key, start, stop in self.cut:
            kind = key.split("-", 1)[0]
            out[kind] = out.get(kind, 0.0) + (stop - start) / HOUR
        return out

    @property
    def good_failed(self) -> int:
        return len(self.failed - self.bad)

    @property
    def bad_tries(self) -> int:
        return sum(self.tries.get(k, 0) for k in self.bad)

    @property
    def bad_max_tries(self) -> int:
        return max((self.tries.get(k, 0) for k in self.bad), default=0)

    @property
    def bad_max_errors(self) -> int:
        """The most tries of one bad task that ended in its error (not cut short)."""
        cuts: dict[str, int] = {}
        for _, key, _, _ in self.cut:
            cuts[key] = cuts.get(key, 0) + 1
        return max((self.tries.get(k, 0) - cuts.get(k, 0) for k in self.bad), default=0)

    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "seed": self.seed,
            "makespan_h": round(self.makespan / HOUR, 3),
            "lost_core_hours": round(self.lost_core_hours, 2),
            **{f"lost_{k}": round(v, 2) for k, v in sorted(self.lost_by_kind().items())},
            "tries_cut": len(self.cut),
            "good_failed": self.good_failed,
            "bad_tries": self.bad_tries,
            "bad_max_tries": self.bad_max_tries,
            "bad_max_errors": self.bad_max_errors,
            "moved_to_owner": len(self.on_owner),
            "done": len(self.done),
            "failed": len(self.failed),
            "unfinished": self.unfinished,
            "preemptions": self.preemptions,
            "drained": self.drained,
            "autoscaler_gave_up": self.gave_up,
            "wall_s": round(self.wall, 2),
        }


def _noop() -> None:
    return None


def make_specs(work: Workload, retries: int) -> dict[Key, TaskSpec]:
    """Independent tasks in pool ``ckpt``, ordered as the user submits them."""
    graph: dict[Key, Any] = {key: Task(key, _noop) for key in work.order}
    specs = build_specs(graph, work.order, pool="ckpt", retries=retries)
    return {k: dataclasses.replace(specs[k], order=i) for i, k in enumerate(work.order)}


class Simulation:
    """One system on the virtual clock. :meth:`run` returns its :class:`Result`."""

    def __init__(self, system: str, p: Params, seed: int) -> None:
        if system not in SYSTEMS:
            raise ValueError(f"unknown system {system!r}: one of {SYSTEMS}")
        self.p = p
        self.work = make_workload(p, seed)
        self.lives = Lives(p, seed)
        retry: Any = ParslStyleRetry() if system == "parsl-style" else corral_retry(p.max_lost)
        self.drain_old = system == "corral-drain"
        self.joined: dict[str, float] = {}  #: live checkpoint worker -> when it joined
        self.retries = p.retries if system == "parsl-style" else 0
        self.core = SchedulerState(SchedulerConfig(saturation=1.0), retry=retry)
        # The autoscaler counts a preempted block as an unasked end against its
        # replacement budget (meant to stop a crash loop), 10 per 60 s by default: a
        # pool of 100 preemptible workers goes past that, and the core then stops
        # replacing them. Sized here to the pool instead.
        budget = p.replacements if p.replacements is not None else max(p.ckpt_workers, 10)
        self.scaler = AutoscalerState(AutoscalerConfig(max_replacements=budget))
        self.files = FileTable()
        self.result = Result(system, seed, bad=self.work.bad)
        self.now = 0.0
        self._events: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._tokens = itertools.count()
        self._ckpt_blocks = itertools.count()
        self.running: dict[str, Attempt] = {}  #: worker -> the try it runs
        self.waiting: dict[str, deque[str]] = {}  #: worker -> tasks sent, not started
        self.pool_of: dict[str, str] = {}  #: live worker -> pool

    # ------------------------------------------------------------------ the loop

    def run(self) -> Result:
        t0 = time.perf_counter()
        res = self.result
        n = self.p.n_tasks
        self._scale(
            TargetSet(0.0, "ckpt", self.p.ckpt_workers, None),
            TargetSet(0.0, "owner", self.p.owner_workers, None),
        )
        specs = make_specs(self.work, self.retries)
        self._feed(GraphSubmitted("submit", 0.0, specs, tuple(self.work.order)))
        while self._events and len(res.done) + len(res.failed) < n:
            when, _, kind, args = heapq.heappop(self._events)
            self.now = when
            if kind == "finish":
                self._finish(*args)
            elif kind == "up":
                self._up(*args)
            else:
                self._preempt(*args)
        res.unfinished = n - len(res.done) - len(res.failed)
        res.wall = time.perf_counter() - t0
        return res

    def _at(self, when: float, kind: str, *args: Any) -> None:
        heapq.heappush(self._events, (when, next(self._seq), kind, args))

    def _sid(self, kind: str) -> str:
        return f"{kind}@{self.now:.3f}"

    # ------------------------------------------------------------------ simulated world

    def _up(self, request: int, pool: str, n: int, life: float) -> None:
        """A block's worker starts and joins."""
        wid = f"{pool}-{n}"
        self.pool_of[wid] = pool
        self.waiting[wid] = deque()
        self.joined[wid] = self.now
        self._scale(BlockStarted(self.now, request, wid, (wid,), "running"))
        self._feed(WorkerJoined(self._sid("join"), self.now, wid, 1, 0, pool))
        if math.isfinite(life):
            self.result.blocks.append((n, self.now, life))
            self._at(self.now + life, "preempt", wid)

    def _preempt(self, wid: str) -> None:
        """The owner takes the block back: the worker says why at once (the
        scheduler), the provider reports the block ended (the autoscaler)."""
        if wid not in self.pool_of:
            return  # drained and gone before its owner wanted it back
        self.result.preemptions += 1
        att = self.running.pop(wid, None)
        if att is not None:
            self.result.cut.append((wid, att.key, att.start, self.now))
        del self.waiting[wid], self.pool_of[wid], self.joined[wid]
        self._feed(WorkerLeft(self._sid("preempt"), self.now, wid, "preempted"))
        self._scale(BlockEnded(self.now, wid, "preempted"))

    def _finish(self, wid: str, token: int) -> None:
        att = self.running.get(wid)
        if att is None or att.token != token:
            return  # cut short or cancelled meanwhile
        del self.running[wid]
        key = att.key
        if key in self.work.bad:
            err = BadInput(f"{key}: bad input")
            res = TaskResult(key, "error", att.start, self.now, error=err)
        else:
            res = TaskResult(key, "ok", att.start, self.now, nbytes=1000)
        self._start_next(wid)
        if self.drain_old and wid in self.joined and wid not in self.running:
            self._maybe_drain(wid)
        self._feed(TasksFinished(self._sid("finish"), self.now, wid, (res,)))

    def _maybe_drain(self, wid: str) -> None:
        """``corral-drain`` only, a prototype of issue 11 item 6 (not in Corral yet):
        a checkpoint worker that just became idle and is unlikely (< 50%, by the pool's
        survival estimate) to live through a typical task (the mean duration of the tries
        that finished ok so far) is drained, and its block replaced by a fresh one."""
        survival = self.core.survival("ckpt")
        if survival.median is None:
            return
        count = sum(st.count for st in self.core.stats.values())
        if not count:
            return
        typical = sum(st.total_duration for st in self.core.stats.values()) / count
        if survival.survives(self.now - self.joined[wid], typical) < 0.5:
            self.result.drained += 1
            self._feed(WorkerDraining(self._sid("drain"), self.now, wid))

    def _retire(self, wid: str) -> None:
        """The scheduler retired a drained worker: it exits and its block ends."""
        del self.waiting[wid], self.pool_of[wid], self.joined[wid]
        self._feed(WorkerLeft(self._sid("retired"), self.now, wid, "drained"))
        self._scale(BlockEnded(self.now, wid, "completed"))

    def _start_next(self, wid: str) -> None:
        queue = self.waiting.get(wid)
        if wid in self.running or not queue:
            return
        key = queue.popleft()
        token = next(self._tokens)
        self.running[wid] = Attempt(key, wid, self.now, token)
        tries = self.result.tries
        tries[key] = tries.get(key, 0) + 1
        if self.pool_of[wid] == "owner":
            self.result.on_owner.add(key)
        self._at(self.now + self.work.seconds[key], "finish", wid, token)

    # ------------------------------------------------------------------ the cores' shells

    def _feed(self, *events: Event) -> None:
        """Hand events to the scheduler core and carry out its commands."""
        todo: deque[Event] = deque(events)
        res = self.result
        while todo:
            for cmd in self.core.handle(todo.popleft()):
                t = type(cmd)
                if t is Execute:
                    assert isinstance(cmd, Execute)
                    self.waiting[cmd.worker].extend(str(run.key) for run in cmd.tasks)
                    self._start_next(cmd.worker)
                elif t is KeyDone:
                    assert isinstance(cmd, KeyDone)
                    res.done.add(str(cmd.key))
                    res.makespan = self.now
                    # The client has it: released, and the registry drops it.
                    todo.append(KeysReleased(self._sid("got"), self.now, (cmd.key,)))
                elif t is KeyErred or t is KeyCancelled:
                    assert isinstance(cmd, (KeyErred, KeyCancelled))
                    res.failed.add(str(cmd.key))
                    error = getattr(cmd, "error", None)
                    res.errors[str(cmd.key)] = type(error).__name__ if error else "cancelled"
                    res.makespan = self.now
                elif t is FileFacts:
                    assert isinstance(cmd, FileFacts)
                    for rc in self.files.handle(cmd.facts):
                        if isinstance(rc, FilesDropped):
                            todo.append(FilesReleased(self._sid("drop"), self.now, rc.keys))
                elif t is CancelOnWorker:
                    assert isinstance(cmd, CancelOnWorker)
                    self._cancel(cmd.worker, cmd.keys)
                elif t is RetireWorker:
                    assert isinstance(cmd, RetireWorker)
                    self._retire(cmd.worker)
                # DropData, Replicate: a simulated worker holds no data (no replica is
                # ever made); nothing else is expected.

    def _cancel(self, wid: str, keys: Sequence[Key]) -> None:
        att = self.running.get(wid)
        if att is not None and att.key in keys:
            del self.running[wid]
            self._start_next(wid)
        queue = self.waiting.get(wid)
        if queue:
            self.waiting[wid] = deque(k for k in queue if k not in keys)

    def _scale(self, *events: Any) -> None:
        """Hand events to the autoscaler core and carry out its commands."""
        for cmd in self.scaler.handle(*events):
            if isinstance(cmd, StartBlock):
                if cmd.pool == "ckpt":
                    n = next(self._ckpt_blocks)
                    wait, life = self.lives[n]
                else:
                    n, wait, life = cmd.request, 0.0, math.inf
                self._at(self.now + wait, "up", cmd.request, cmd.pool, n, life)
            elif isinstance(cmd, ReportGone):
                # The worker told the scheduler first, with the true cause: a no-op.
                for wid in cmd.workers:
                    self._feed(WorkerLeft(self._sid("gone"), self.now, wid, cmd.cause))
            elif isinstance(cmd, GaveUp):
                self.result.gave_up += 1
            else:  # a fixed target never scales in
                raise TypeError(f"unexpected autoscaler command {cmd!r}")


def simulate(system: str, p: Params, seed: int) -> Result:
    return Simulation(system, p, seed).run()


# ----------------------------------------------------------------------------- report

ROWS: tuple[tuple[str, str, str], ...] = (
    ("makespan_h", "makespan (h)", "{:.2f}"),
    ("lost_core_hours", "core-hours lost to preemption", "{:.1f}"),
    ("lost_short", "  of tasks of 5-7 min", "{:.1f}"),
    ("lost_medium", "  of tasks of 18-22 min", "{:.1f}"),
    ("lost_long", "  of tasks of 1-4 h", "{:.1f}"),
    ("tries_cut", "tries cut by preemption", "{:d}"),
    ("good_failed", "good tasks failed", "{:d}"),
    ("bad_tries", "tries on bad tasks", "{:d}"),
    ("bad_max_tries", "most tries on one bad task", "{:d}"),
    ("bad_max_errors", "  of them ending in its error", "{:d}"),
    ("moved_to_owner", "tasks run on owner", "{:d}"),
    ("done", "tasks done", "{:d}"),
    ("failed", "tasks failed", "{:d}"),
    ("preemptions", "checkpoint workers preempted", "{:d}"),
    ("drained", "checkpoint workers drained (age)", "{:d}"),
    ("wall_s", "wall time of the simulation (s)", "{:.1f}"),
)


def targets(base: Mapping[str, Any], corral: Mapping[str, Any]) -> dict[str, bool]:
    lost_ok = corral["lost_core_hours"] <= 0.7 * base["lost_core_hours"]
    return {
        "lost_at_least_30pct_less": bool(lost_ok),
        "no_good_task_failed": corral["good_failed"] == 0,
        "bad_failed_within_2_tries": corral["bad_max_tries"] <= 2,
    }


def _ratio(a: float, b: float) -> str:
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}x"


def table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """One column per system (the baseline first), then each other one's ratio to the
    baseline, then whether each meets the targets."""
    names = list(runs)
    base = runs[names[0]]
    others = names[1:]
    width = {n: max(13, len(n)) + 2 for n in names}
    ratios = {n: f"{n}/parsl" for n in others}
    head = f"{'metric':34s}" + "".join(f"{n:>{width[n]}s}" for n in names)
    head += "".join(f"{ratios[n]:>{len(ratios[n]) + 2}s}" for n in others)
    lines = [head]
    for field, label, fmt in ROWS:
        row = f"{label:34s}"
        for n in names:
            row += f"{fmt.format(runs[n].get(field, 0)):>{width[n]}s}"
        for n in others:
            ratio = _ratio(runs[n].get(field, 0), base.get(field, 0))
            row += f"{ratio:>{len(ratios[n]) + 2}s}"
        lines.append(row)
    for n in others:
        met = targets(base, runs[n])
        verdicts = ", ".join(f"{name} {'MET' if ok else 'NOT MET'}" for name, ok in met.items())
        lines.append(f"targets ({n}): {verdicts}")
    return "\n".join(lines)


def describe(p: Params) -> str:
    n_bad = round(p.bad_fraction * p.n_tasks)
    return (
        f"{p.n_short:,} tasks of 5-7 min, {p.n_medium:,} of 18-22 min, {p.n_long:,} of 1-4 h, "
        f"{n_bad} of them bad; ckpt: {p.ckpt_workers} one-core workers, Weibull lives "
        f"(shape {p.shape:g}, median {p.median_life / 60:g} min), queue wait "
        f"{p.wait[0]:g}-{p.wait[1]:g} s; owner: {p.owner_workers} permanent workers; "
        f"parsl-style retries={p.retries}, corral retries=0"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="seeds seed .. seed+repeat-1")
    parser.add_argument("--quick", action="store_true", help="a small run (seconds)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--short", type=int, help="tasks of 5-7 min")
    parser.add_argument("--medium", type=int, help="tasks of ~20 min")
    parser.add_argument("--long", type=int, help="tasks of 1-4 h")
    parser.add_argument("--bad", type=float, help="fraction of tasks that always raise")
    parser.add_argument("--ckpt", type=int, help="checkpoint workers")
    parser.add_argument("--owner", type=int, help="permanent owner workers")
    parser.add_argument("--median-life", type=float, help="minutes (checkpoint workers)")
    parser.add_argument("--shape", type=float, help="Weibull shape of worker lives")
    parser.add_argument("--retries", type=int, help="the parsl-style baseline's retries")
    parser.add_argument("--max-lost", type=int, help="Corral's DefaultRetry(max_lost=...)")
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated, the baseline first, of {', '.join(SYSTEMS)}; or all",
    )
    args = parser.parse_args(argv)
    p = QUICK if args.quick else Params()
    changes: dict[str, Any] = {}
    for flag, field in (
        ("short", "n_short"), ("medium", "n_medium"), ("long", "n_long"),
        ("bad", "bad_fraction"), ("ckpt", "ckpt_workers"), ("owner", "owner_workers"),
        ("shape", "shape"), ("retries", "retries"), ("max_lost", "max_lost"),
    ):  # fmt: skip
        value = getattr(args, flag)
        if value is not None:
            changes[field] = value
    if args.median_life is not None:
        changes["median_life"] = args.median_life * 60
    p = dataclasses.replace(p, **changes)
    chosen = ",".join(SYSTEMS) if args.systems == "all" else args.systems
    systems = [s.strip() for s in chosen.split(",") if s.strip()]
    if not systems or systems[0] != "parsl-style" or not set(systems) <= set(SYSTEMS):
        parser.error(f"--systems: parsl-style first, then any of {', '.join(SYSTEMS[1:])}")
    runs = []
    if not args.json:
        print(describe(p))
    for seed in range(args.seed, args.seed + args.repeat):
        results = {name: simulate(name, p, seed).summary() for name in systems}
        base = results["parsl-style"]
        met = {name: targets(base, results[name]) for name in systems[1:]}
        runs.append({"seed": seed, **results, "targets": met})
        if not args.json:
            print(f"\nseed {seed}")
            print(table(results))
    if args.json:
        print(json.dumps({"params": dataclasses.asdict(p), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
