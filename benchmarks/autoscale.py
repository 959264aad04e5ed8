"""Autoscaling under bursts: Corral's autoscaler against Parsl's ``simple`` strategy and a
KEDA-style queue-length scaler, on a virtual clock.

The load is CI-like (issue 12's seed: jobs queued an hour on an autoscaled fleet):
bursts of jobs arrive at random (a push, a merge train), each a mix of short jobs
(30 s-3 min) and long ones (10-40 min), over two pools of one-job runners: ``cpu``
(up to 40 blocks) and ``gpu``, scarce (up to 4). A block (a runner: one worker, one
job at a time) takes 2-5 min from its request to running. In the second scenario
some blocks are *stuck*: the provider accepts them but they only come up after 30-60
min (no capacity in the zone, a quota, a broken image pulled again and again). In the
third, ``pipelines``, each burst is one CI pipeline: a build stage of 1-3 short ``cpu``
jobs, then the test stage, the burst's other jobs (the same mix of pools and
durations), each needing every build of its pipeline (GitLab's ``needs:``, a graph's
edges). A test job is ready, and its wait begins, when its builds are done; before
that no queue holds it, so Parsl (whose DataFlowKernel submits a task to the executor
only once its dependencies are done) and KEDA (which sees a job once it is queued)
do not see it. Corral's scheduler does: its next wave (``SchedulerState.upcoming``),
which the ``demand`` strategy counts by default (``lookahead``), is played here by
:meth:`Cluster.upcoming` the same way: each waiting job whose needs are all done,
running or ready, due in the longest of its needs' mean durations left (a category's
mean of the jobs finished so far, the scheduler's ``unknown_duration`` before one has;
left out while a need runs past twice that).

Nothing here re-implements Corral's autoscaler. A discrete-event loop (a heap of timed
events, no threads, no sleeps, no processes) plays the cluster: a FIFO queue per pool,
runners that take the next job the moment they are free, blocks that come up after
their sampled delay. It drives, for ``corral``, the real pure core
:class:`AutoscalerState` with the ``demand`` strategy as the manager runs it: a
``QueuesSeen`` every second (the shell's tick), ``BlockRunning`` when a block comes up,
its commands carried out (``StartBlock``: a block is requested; ``DrainWorker``: the
runner takes no new job and exits when idle; ``StopBlock``: the block is cancelled,
which the loop checks is never a busy one). The pools have Corral's settings
``max_idletime = 120`` (Parsl's default) and ``provisioning_timeout = 600``.

The peers are written here from their sources and documentation:

- ``parsl``: Parsl's ``simple`` strategy (``parsl/jobs/strategy.py``,
  ``_general_strategy``), every 5 s (its ``strategy_period``), per pool: active tasks
  (queued + running) against active slots (running + pending blocks, so a pending
  block counts as capacity however long it stays pending); scale out by the missing
  blocks up to ``max_blocks``; scale in only when the pool has had no active task for
  ``max_idletime`` (120 s), then every block above ``min_blocks`` (pending ones first,
  as ``HighThroughputExecutor.scale_in`` orders them).
- ``keda``: a KEDA ``ScaledObject`` per pool over a queue-length trigger with a target
  of 1 job per replica, the metric counting ready and unacknowledged (running) jobs
  (RabbitMQ's HTTP mode). KEDA polls every ``pollingInterval`` (30 s): it activates a
  pool at zero replicas when the metric is above 0 and scales it to zero after
  ``cooldownPeriod`` (300 s) without activity. In between, the HPA (every 15 s, its sync
  period) sets ``ceil(metric / 1)`` replicas, within a 10% tolerance, scale-up limited
  to its default ``max(+100%, +4 pods)`` per period, scale-down stabilised over 300 s
  (the highest recommendation of the window). Scale-down deletes pods the way a
  ReplicaSet chooses them (pending first, then the newest running), busy or not: a busy
  runner gets a 30 s grace period, then its job is cut and queued again at the front.

With ``--systems all``, rows for the knobs each system has: ``corral-forecast``, the
``demand`` strategy with its arrival forecast (``forecast = 0.9``: spare blocks for the
tasks that arrived in nine spans of one provisioning delay in ten over the last hour);
``corral-spare``, the ``demand`` strategy keeping ``--spare`` (12) idle blocks per pool
beyond the active tasks' at all times (GitLab Runner's ``IdleCount``; Parsl and KEDA
have no such knob); and ``corral-warm``, ``parsl-warm``, ``keda-warm``: 4 blocks kept in
the scarce pool from the start (``--warm`` sets other floors; Corral's and Parsl's
``min_blocks`` and ``init_blocks``, KEDA's ``minReplicaCount``, under which it neither
activates nor scales to zero); and ``corral-nolookahead``, the ``demand`` strategy
without its lookahead (``lookahead = None``: ready and running tasks only, as the peers
see them).

Beside them, by default and with ``--systems all``, two clairvoyant rows that no real
scaler can beat: they know every job (arrival, pool, duration) and every block's
provisioning delay in advance (not in scenario ``pipelines``, where when a test job is
ready depends on each system's schedule of its builds: no bound there). ``oracle``
keeps every block a pool allows (``max_blocks``) from its first job's arrival to its
last job's end, each requested exactly early enough to be up at that arrival. Its
waits are the *FIFO bound*
(:func:`fifo_bound`): with FIFO dispatch per pool and never more than ``max_blocks``
runners at work, no job can start sooner than when every allowed runner is up all the
time from the shortest provisioning delay on (a job starts at the earliest of its
arrival and its FIFO turn on those runners; fewer runners up, or a job cut and run
again, only move every later start later). ``oracle-budget`` reaches the same waits with
as few blocks as the bound's schedule keeps busy: each requested exactly early enough
for the job it is for, released as soon as idle unless a job needs it before another
block could come up. Both skip a block they know will be stuck (asked for and cancelled
at once, no worker-time). The run checks that no job of any system waited less than the
bound allows (an error otherwise) and counts the oracles' jobs that waited longer (0:
the row is the bound). The bound holds for FIFO dispatch only: a queue that starts a
scarce pool's short jobs first would beat it, with any autoscaler (see the README).

Measured per run: p95 and max queue wait (a job's time from ready to start, summed over
its tries if it was cut), worker-hours (each block from its request to its end, so
provisioning time is billed, for all three alike: a cloud VM bills while it boots; the
stuck blocks' waiting time is billed too, which if anything counts against Corral,
which replaces them; the run ends when the last job finishes, and a block still up
then is billed to that moment), makespan (first arrival to last finish), jobs cut,
blocks requested, stuck blocks replaced. The same seed gives every system the same jobs and
the same provisioning delays (the n-th block requested in a pool comes up after the
same delay in all three).

    python benchmarks/autoscale.py                  # the three scenarios, seeds 1-5
    python benchmarks/autoscale.py --scenario pipelines
    python benchmarks/autoscale.py --seeds 3 --scenario stuck
    python benchmarks/autoscale.py --seeds 10 --first-seed 6   # seeds 6-15
    python benchmarks/autoscale.py --pool-limit cpu.max_idletime=420   # Corral's rows
    python benchmarks/autoscale.py --quick --json   # small (the test's size)
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import heapq
import itertools
import json
import math
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import policies  # noqa: E402
from actors import alerts_state  # noqa: E402
from actors.autoscaler_state import (  # noqa: E402
    AutoscalerConfig,
    AutoscalerState,
    BlockEnded,
    BlockRunning,
    BlockStarted,
    BlockStopped,
    BlockStuck,
    Command,
    DrainAnswered,
    DrainWorker,
    Event,
    GaveUp,
    QueuesSeen,
    ReportGone,
    StartBlock,
    StopBlock,
    TargetRaised,
    TargetSet,
)
from actors.scheduler_records import SchedulerConfig  # noqa: E402
from policies.scaling import PoolLimits  # noqa: E402
from runtime.messages import BlockMetrics, MetricsReply, PoolMetrics  # noqa: E402
from runtime.metrics import SAMPLE_LABELS, samples  # noqa: E402

MIN, HOUR = 60.0, 3600.0
#: the scheduler's duration estimate for a category none of whose tasks has finished
UNKNOWN_DURATION = SchedulerConfig().unknown_duration
SYSTEMS = ("corral", "parsl", "keda")
PEERS = ("parsl", "keda")
#: with ``--systems all``: Corral's autoscaler alone, without the alert rule; with its
#: scale-outs raising the target for the action's cooldown (``scale(n, hold=...)``)
#: instead of until the alert resolves; and with them setting a target that stays
EXTRA = ("corral-noalert", "corral-hold", "corral-floor")
#: with ``--systems all``, too: Corral's ``demand`` strategy with its arrival forecast
#: (``forecast = 0.9``) and with ``Settings.spare`` idle blocks kept per pool, and each
#: system with ``Settings.warm`` blocks kept (by default 4 in the scarce pool; Corral's
#: and Parsl's ``min_blocks``, KEDA's ``minReplicaCount``)
KNOBS = (
    "corral-forecast",
    "corral-spare",
    "corral-warm",
    "corral-nolookahead",
    "parsl-warm",
    "keda-warm",
)
#: the clairvoyant rows (by default too): every block allowed all the time, and the
#: bound's schedule with as few blocks as it needs
ORACLES = ("oracle", "oracle-budget")
#: the ``demand`` strategy's parameters in the ``corral-forecast`` row
FORECAST: dict[str, Any] = {"forecast": 0.9}


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    max_blocks: int
    share: float  #: of the jobs


@dataclasses.dataclass(frozen=True)
class Settings:
    """The load, the fleet and each system's settings. Seconds of virtual time."""

    hours: float = 8.0  #: bursts arrive during this long
    burst_gap: float = 20 * MIN  #: mean time between bursts (exponential)
    burst_jobs: tuple[int, int] = (5, 40)  #: jobs per burst (uniform)
    burst_spread: float = 60.0  #: a burst's jobs arrive within this long
    short: tuple[float, float] = (30.0, 180.0)  #: a short job's duration (uniform)
    long: tuple[float, float] = (10 * MIN, 40 * MIN)  #: a long job's duration (uniform)
    long_share: float = 0.3
    pools: tuple[Pool, ...] = (Pool("cpu", 40, 0.85), Pool("gpu", 4, 0.15))
    provisioning: tuple[float, float] = (2 * MIN, 5 * MIN)  #: request to running
    stuck_share: float = 0.0  #: of the blocks: come up only after ``stuck_delay``
    #: each burst is one pipeline: a build stage of ``build_jobs`` short ``cpu`` jobs,
    #: then the burst's other jobs, each needing every build (scenario ``pipelines``)
    pipelines: bool = False
    build_jobs: tuple[int, int] = (1, 3)  #: build jobs per pipeline (uniform)
    stuck_delay: tuple[float, float] = (30 * MIN, 60 * MIN)
    # Corral
    max_idletime: float = 120.0
    provisioning_timeout: float = 600.0
    corral_tick: float = 1.0
    alert_every: float = 15.0  #: seconds between evaluations of the alert rules
    # Parsl
    parsl_period: float = 5.0
    # KEDA / HPA
    keda_polling: float = 30.0
    keda_cooldown: float = 300.0
    hpa_sync: float = 15.0
    hpa_tolerance: float = 0.1
    hpa_down_window: float = 300.0
    grace: float = 30.0  #: terminationGracePeriodSeconds
    # the clairvoyant rows
    oracle_tick: float = 1.0  #: seconds between their looks at the pools
    #: the ``-warm`` rows: blocks kept per pool at least, from the start (``--warm``)
    warm: tuple[tuple[str, int], ...] = (("gpu", 4),)
    #: the ``corral-spare`` row: blocks kept beyond the active tasks' (``--spare``)
    spare: int = 12
    #: every Corral row's pool limits changed from the defaults above, as a user would
    #: set them in a pool's configuration: (pool, field, value) (``--pool-limit``)
    corral_limits: tuple[tuple[str, str, float], ...] = ()
    tail: float = 4 * HOUR  #: after the last arrival, the most the run goes on


FULL = Settings()
#: each pool's max_blocks, which ``--warm`` and ``--pool-limit`` check against
MAX_BLOCKS = {p.name: p.max_blocks for p in FULL.pools}
QUICK = dataclasses.replace(FULL, hours=1.5)
#: per scenario: the share of stuck blocks, and whether bursts are pipelines
SCENARIOS: dict[str, tuple[float, bool]] = {
    "healthy": (0.0, False),
    "stuck": (0.05, False),
    "pipelines": (0.0, True),
}


def scenario_settings(s: Settings, scenario: str) -> Settings:
    stuck, pipelines = SCENARIOS[scenario]
    return dataclasses.replace(s, stuck_share=stuck, pipelines=pipelines)


# ----------------------------------------------------------------------------- the load


@dataclasses.dataclass
class Job:
    jid: int
    pool: str
    ready: float
    duration: float
    queued_at: float = 0.0  #: when it last went into the queue
    waited: float = 0.0  #: time in the queue, over all its tries
    started: float | None = None  #: its latest start
    finished: float | None = None
    cut: int = 0  #: tries cut short (KEDA deleting its runner)
    burst: int = 0  #: which burst it came in (its index in arrival order)
    #: the jobs it needs done first (ids): it is ready, at ``ready``, once they are
    #: (until then ``ready`` is ``inf``)
    needs: tuple[int, ...] = ()
    category: str = "job"  #: as the scheduler's statistics group it (a key prefix)

    @property
    def running(self) -> bool:
        """Started and neither finished nor cut since."""
        return self.started is not None and self.finished is None and self.started >= self.queued_at


def make_jobs(s: Settings, seed: int) -> list[Job]:
    """The same list for every system on a seed: bursts of jobs, or of pipelines."""
    return make_pipelines(s, seed) if s.pipelines else make_bursts(s, seed)


def _bursts(s: Settings, rng: random.Random) -> Iterator[tuple[int, float]]:
    """Each burst's index and time: exponential gaps, for ``s.hours``."""
    t = rng.expovariate(1 / s.burst_gap)
    burst = 0
    while t < s.hours * HOUR:
        yield burst, t
        t += rng.expovariate(1 / s.burst_gap)
        burst += 1


def _kind(s: Settings, rng: random.Random) -> tuple[tuple[float, float], str]:
    """A job's range of durations (short or long) and its pool."""
    span = s.long if rng.random() < s.long_share else s.short
    return span, rng.choices([p.name for p in s.pools], [p.share for p in s.pools])[0]


def make_bursts(s: Settings, seed: int) -> list[Job]:
    """Bursts of jobs, at random."""
    rng = random.Random(f"jobs-{seed}")
    jobs: list[Job] = []
    for burst, t in _bursts(s, rng):
        for _ in range(rng.randint(*s.burst_jobs)):
            span, pool = _kind(s, rng)
            at = t + rng.uniform(0, s.burst_spread)
            jobs.append(Job(len(jobs), pool, at, rng.uniform(*span), burst=burst))
    jobs.sort(key=lambda j: (j.ready, j.jid))
    return jobs


def make_pipelines(s: Settings, seed: int) -> list[Job]:
    """Each burst one pipeline (a push): ``build_jobs`` short ``cpu`` build jobs at once,
    then the test stage, the burst's other jobs with the same mix of pools and
    durations as :func:`make_bursts`, each needing every build of its pipeline
    (GitLab's ``needs:``, or a graph's edges). Only the builds have an arrival time."""
    rng = random.Random(f"pipelines-{seed}")
    jobs: list[Job] = []
    for burst, t in _bursts(s, rng):
        n = rng.randint(*s.burst_jobs)
        builds = []
        for _ in range(min(rng.randint(*s.build_jobs), n - 1)):
            build = Job(len(jobs), "cpu", t, rng.uniform(*s.short), burst=burst, category="build")
            jobs.append(build)
            builds.append(build.jid)
        for _ in range(n - len(builds)):
            span, pool = _kind(s, rng)
            jobs.append(
                Job(len(jobs), pool, math.inf, rng.uniform(*span), burst=burst,
                    needs=tuple(builds), category="test")
            )  # fmt: skip
    return jobs


class Delays:
    """Provisioning delays: the n-th block requested in a pool comes up after the n-th
    delay of that pool's sequence, whichever system asks."""

    def __init__(self, s: Settings, seed: int) -> None:
        self.s = s
        self.rngs = {p.name: random.Random(f"delays-{seed}-{p.name}") for p in s.pools}
        self.seen: dict[str, list[tuple[float, bool]]] = {p.name: [] for p in s.pools}

    def __call__(self, pool: str, n: int) -> tuple[float, bool]:
        seq = self.seen[pool]
        while len(seq) <= n:
            rng = self.rngs[pool]
            stuck = rng.random() < self.s.stuck_share
            normal = rng.uniform(*self.s.provisioning)
            late = rng.uniform(*self.s.stuck_delay)
            seq.append((late if stuck else normal, stuck))
        return seq[n]


# ----------------------------------------------------------------------------- the cluster


@dataclasses.dataclass(eq=False)
class Block:
    bid: str
    pool: str
    requested: float
    up_at: float
    stuck: bool  #: drew a stuck delay
    ran: float | None = None  #: when it came up (its runner joined)
    ended: float | None = None
    job: Job | None = None
    draining: bool = False  #: Corral: takes no new job, exits when idle
    deleting: bool = False  #: KEDA: deleted, in its grace period
    idle_since: float = 0.0

    @property
    def worker(self) -> str:
        return f"w-{self.bid}"


class Scaler:
    """What the loop asks of a system."""

    name = ""
    period = 1.0

    def tick(self, now: float) -> None:
        raise NotImplementedError

    def on_running(self, b: Block) -> None:
        """``b`` came up."""

    def on_exited(self, b: Block) -> None:
        """``b``'s drained runner finished its job and exited."""


class Cluster:
    """The simulated world: queues, blocks, the heap of timed events."""

    def __init__(self, s: Settings, jobs: list[Job], delays: Delays) -> None:
        self.s = s
        self.jobs = jobs
        self.delays = delays
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = itertools.count()
        self.queues: dict[str, deque[Job]] = {p.name: deque() for p in s.pools}
        self.live: dict[str, Block] = {}  #: blocks not ended, by id
        self.ended: list[Block] = []
        self.asked = {p.name: 0 for p in s.pools}
        self.unfinished = len(jobs)
        self.scaler: Scaler | None = None
        self.busy_stops = 0  #: blocks stopped while running a job (must stay 0 for Corral)
        #: the graph: the jobs each job's end lets go, and how many each one still needs
        self.dependents: dict[int, list[Job]] = {}
        self.missing: dict[int, int] = {}
        for job in jobs:
            self.missing[job.jid] = len(job.needs)
            for need in job.needs:
                self.dependents.setdefault(need, []).append(job)
        self.by_id = {job.jid: job for job in jobs}
        #: jobs submitted (their pipeline has begun), not ready yet, in that order
        self.waiting: dict[int, Job] = {}
        #: per category: finished jobs and their time, for the scheduler's estimates
        self.done_stats: dict[str, tuple[int, float]] = {}

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))

    def blocks(self, pool: str) -> list[Block]:
        return [b for b in self.live.values() if b.pool == pool]

    # -- blocks ------------------------------------------------------------------------

    def request(self, pool: str) -> Block:
        n = self.asked[pool]
        self.asked[pool] += 1
        delay, stuck = self.delays(pool, n)
        b = Block(f"{pool}-{n + 1}", pool, self.now, self.now + delay, stuck)
        self.live[b.bid] = b
        self.at(b.up_at, self._up, b)
        return b

    def _up(self, b: Block) -> None:
        if b.ended is not None:
            return  # cancelled while pending
        b.ran = b.idle_since = self.now
        assert self.scaler is not None
        self.scaler.on_running(b)
        self.dispatch()

    def _end(self, b: Block) -> None:
        b.ended = self.now
        del self.live[b.bid]
        self.ended.append(b)

    def cancel(self, b: Block) -> None:
        """Stop ``b`` now (a pending block, or an idle one)."""
        if b.job is not None:
            self.busy_stops += 1
            self._cut(b)
        self._end(b)

    def drain(self, b: Block) -> bool:
        """``b`` takes no new job and exits once idle: True if it exited now."""
        b.draining = True
        if b.job is None:
            self._end(b)
            return True
        return False

    def delete(self, b: Block) -> None:
        """Kubernetes deletes ``b``'s pod: an idle or pending one goes at once, a busy
        one after the grace period (its job cut then, unless it finished)."""
        b.deleting = True
        if b.job is None:
            self._end(b)
        else:
            self.at(self.now + self.s.grace, self._grace_over, b)

    def _grace_over(self, b: Block) -> None:
        if b.ended is None:
            if b.job is not None:
                self._cut(b)
            self._end(b)
            self.dispatch()

    def _cut(self, b: Block) -> None:
        job = b.job
        assert job is not None
        job.cut += 1
        job.queued_at = self.now
        self.queues[b.pool].appendleft(job)
        b.job = None

    # -- jobs --------------------------------------------------------------------------

    def _arrive(self, job: Job) -> None:
        job.queued_at = self.now
        self.waiting.pop(job.jid, None)
        self.queues[job.pool].append(job)
        for later in self.dependents.get(job.jid, ()):
            if later.ready == math.inf:  # submitted with the pipeline: it waits
                self.waiting.setdefault(later.jid, later)
        self.dispatch()

    def estimate(self, job: Job) -> float:
        """The scheduler's estimate of ``job``'s duration: its category's mean so far
        (its ``unknown_duration`` before one has finished)."""
        n, total = self.done_stats.get(job.category, (0, 0.0))
        return total / n if n else UNKNOWN_DURATION

    def upcoming(self) -> dict[str, list[float]]:
        """What ``SchedulerState.upcoming`` answers: per pool, the next wave (waiting
        jobs none of whose needs waits), as the seconds until each is expected to be
        ready (the longest of its needs' estimates left: done 0; running, its estimate
        from its start; ready, a whole estimate), shortest first; a job left out while
        a need runs past twice its estimate (late)."""
        out: dict[str, list[float]] = {}
        for job in self.waiting.values():
            needs = [self.by_id[n] for n in job.needs]
            if any(n.ready == math.inf for n in needs):
                continue  # a need waits itself: not the next wave
            left = 0.0
            for n in needs:
                if n.finished is not None:
                    continue
                mean = self.estimate(n)
                t = (n.started or 0.0) + mean - self.now if n.running else mean
                if t < -mean:
                    break  # late
                left = max(left, t)
            else:
                out.setdefault(job.pool, []).append(max(left, 0.0))
        return {pool: sorted(times) for pool, times in out.items()}

    def dispatch(self) -> None:
        """Every free runner takes the next job of its pool."""
        for pool, queue in self.queues.items():
            if not queue:
                continue
            free = sorted(
                (
                    b
                    for b in self.blocks(pool)
                    if b.ran is not None and b.job is None and not b.draining and not b.deleting
                ),
                key=lambda b: b.bid,
            )
            for b in free:
                if not queue:
                    break
                job = queue.popleft()
                job.waited += self.now - job.queued_at
                job.started = self.now
                b.job = job
                self.at(self.now + job.duration, self._finish, b, job)

    def _finish(self, b: Block, job: Job) -> None:
        if b.job is not job:
            return  # cut before it finished
        job.finished = self.now
        self.unfinished -= 1
        n, total = self.done_stats.get(job.category, (0, 0.0))
        self.done_stats[job.category] = (n + 1, total + job.duration)
        for later in self.dependents.get(job.jid, ()):
            self.missing[later.jid] -= 1
            if not self.missing[later.jid]:
                later.ready = self.now
                self._arrive(later)
        b.job = None
        b.idle_since = self.now
        if b.draining:
            self._end(b)
            assert self.scaler is not None
            self.scaler.on_exited(b)
        elif b.deleting:
            self._end(b)
        self.dispatch()

    def _tick(self) -> None:
        assert self.scaler is not None
        self.scaler.tick(self.now)
        self.dispatch()
        if self.unfinished or self.live:
            self.at(self.now + self.scaler.period, self._tick)

    # -- the run -----------------------------------------------------------------------

    def run(self, scaler: Scaler) -> None:
        self.scaler = scaler
        for job in self.jobs:
            if not job.needs:
                self.at(job.ready, self._arrive, job)
        self.at(0.0, self._tick)
        last = max((j.ready for j in self.jobs if not j.needs), default=0.0)
        while self.heap:
            t, _, fn, args = heapq.heappop(self.heap)
            if t > last + self.s.tail:
                break
            self.now = t
            fn(*args)
            if not self.unfinished:
                break  # the last job finished: the run is over, and so is its fleet
        for b in list(self.live.values()):  # up at the end (or the cut-off): billed to it
            self._end(b)


# ----------------------------------------------------------------------------- corral


#: the queue-time rule of the benchmark: the default ``CorralQueueTime`` rule with a
#: scale-out action (enough blocks in all for the running and ready tasks, within the
#: pool's max_blocks),
#: which sets the pool's target back once the alert resolved
QUEUE_RULE: dict[str, Any] = {
    "name": "QueueTimeScaleOut",
    "expr": "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 60",
    "for": "1m",
    "labels": {"team": "ci", "priority": "P2"},
    "action": {"scale_out": {"fit": True, "cooldown": "5m", "restore": True}},
}


class CorralScaler(Scaler):
    """The real autoscaler core with the ``demand`` strategy, fed as the shell feeds it;
    and the real alert core, evaluating :data:`QUEUE_RULE` on the metrics every
    ``alert_every`` seconds. ``alerts``: ``"restore"`` (what the manager's alert
    monitor does: each ``Scale`` sets the pool's target, ``TargetSet``; the rule sets it
    back once its alert resolved), ``"floor"`` (the same rule without ``restore``: the
    target stays), ``"hold"`` (each scale-out raises the target for the action's
    cooldown, ``TargetRaised``), or None (no alert rule)."""

    name = "corral"

    def __init__(
        self,
        cluster: Cluster,
        alerts: str | None = "restore",
        demand_params: dict[str, Any] | None = None,
        floor: dict[str, int] | None = None,
    ) -> None:
        s = cluster.s
        self.c = cluster
        self.period = s.corral_tick
        demand = policies.REGISTRY.create("scaling", "demand", demand_params)
        floor = floor or {}
        self.state = AutoscalerState(AutoscalerConfig(), demand)
        self.stuck = 0
        self.gave_up = 0
        self.alerts: alerts_state.AlertState | None = None
        self.fired = self.scale_outs = 0
        self.hold = 0.0
        self.mode = alerts
        if alerts is not None:
            raw = QUEUE_RULE
            if alerts != "restore":
                action = {**raw["action"]["scale_out"], "restore": False}
                raw = {**raw, "action": {"scale_out": action}}
            rule = alerts_state.parse_rule(raw, SAMPLE_LABELS)
            assert rule.action is not None
            self.hold = rule.action.cooldown
            self.alerts = alerts_state.AlertState([rule])
        self.next_alert = 0.0
        events: list[Event] = []
        for p in s.pools:
            warm = floor.get(p.name, 0)
            limits = PoolLimits(
                min_blocks=warm, max_blocks=p.max_blocks, init_blocks=warm, parallelism=1.0,
                slots_per_block=1, max_idletime=s.max_idletime,
                provisioning_timeout=s.provisioning_timeout,
            )  # fmt: skip
            limits = dataclasses.replace(limits, **_limits_of(s, p.name))
            events.append(TargetSet(0.0, p.name, 0, p.name, limits))
        self.feed(*events)

    def feed(self, *events: Event) -> None:
        todo: deque[Event] = deque(events)
        while todo:
            for cmd in self.state.handle(todo.popleft()):
                todo.extend(self.carry_out(cmd))

    def carry_out(self, cmd: Command) -> list[Event]:
        now = self.c.now
        if isinstance(cmd, StartBlock):
            b = self.c.request(cmd.pool)
            return [BlockStarted(now, cmd.request, b.bid, (b.worker,), "pending")]
        if isinstance(cmd, StopBlock):
            self.c.cancel(self.c.live[cmd.block])
            return [BlockStopped(now, cmd.block, "cancelled")]
        if isinstance(cmd, DrainWorker):
            b = self.c.live[cmd.block]
            if b.ran is None:  # its runner never joined: the scheduler does not know it
                return [DrainAnswered(now, cmd.worker, False)]
            out: list[Event] = [DrainAnswered(now, cmd.worker, True)]
            if self.c.drain(b):
                out.append(BlockEnded(now, b.bid, "completed"))
            return out
        if isinstance(cmd, BlockStuck):
            self.stuck += 1
        elif isinstance(cmd, GaveUp):
            self.gave_up += 1
        else:
            assert isinstance(cmd, ReportGone), cmd
        return []

    def tick(self, now: float) -> None:
        queued = {pool: len(q) for pool, q in self.c.queues.items()}
        processing = {
            b.worker: int(b.job is not None) for b in self.c.live.values() if b.ran is not None
        }
        upcoming = self.c.upcoming() if self.state.policy.uses_upcoming else None
        self.feed(QueuesSeen(now, queued, processing, upcoming=upcoming))
        if self.alerts is not None and now >= self.next_alert:
            self.next_alert = now + self.c.s.alert_every
            self.evaluate(now)

    def metrics(self, now: float) -> MetricsReply:
        """What ``GET /metrics`` would show now: the cluster's queues and workers, and
        the autoscaler core's block metrics as its shell makes them."""
        pools: dict[str, PoolMetrics] = {}
        for pool, queue in self.c.queues.items():
            up = [b for b in self.c.blocks(pool) if b.ran is not None]
            busy = sum(1 for b in up if b.job is not None)
            pools[pool] = PoolMetrics(
                queue_depth=len(queue),
                oldest_wait=max((now - j.queued_at for j in queue), default=0.0),
                running=busy,
                workers={"busy": busy, "idle": len(up) - busy},
            )
        states = {
            bid: ("running" if b.ran is not None else "pending")
            for bid, b in self.c.live.items()
            if bid in self.state.blocks
        }
        blocks = {
            pool: BlockMetrics(**m, stuck=self.state.stuck.get(pool, 0))
            for pool, m in self.state.block_metrics(now, states).items()
        }
        return MetricsReply(pools=pools, blocks=blocks)

    def evaluate(self, now: float) -> None:
        assert self.alerts is not None
        cmds = self.alerts.handle(alerts_state.Evaluate(now, samples(self.metrics(now))))
        for cmd in cmds:
            if isinstance(cmd, alerts_state.Scale):
                if cmd.target > self.state.pools[cmd.pool].target:
                    self.scale_outs += 1  # (not a restore)
                if self.mode == "hold":
                    self.feed(TargetRaised(now, cmd.pool, cmd.target, now + self.hold))
                else:
                    self.feed(TargetSet(now, cmd.pool, cmd.target, cmd.pool))
            elif isinstance(cmd, alerts_state.Notify) and cmd.alert.state == "firing":
                self.fired += 1

    def on_running(self, b: Block) -> None:
        if b.bid in self.state.blocks:
            self.feed(BlockRunning(self.c.now, b.bid))

    def on_exited(self, b: Block) -> None:
        self.feed(BlockEnded(self.c.now, b.bid, "completed"))


# ----------------------------------------------------------------------------- parsl


class ParslSimple(Scaler):
    """Parsl's ``simple`` strategy, one executor per pool (see the module's docstring)."""

    name = "parsl"

    def __init__(self, cluster: Cluster, floor: dict[str, int] | None = None) -> None:
        self.c = cluster
        self.period = cluster.s.parsl_period
        self.idle_since: dict[str, float | None] = {p.name: None for p in cluster.s.pools}
        #: min_blocks per pool, also its init_blocks (started with the executor)
        self.min_blocks = {p.name: (floor or {}).get(p.name, 0) for p in cluster.s.pools}
        for pool, n in self.min_blocks.items():
            for _ in range(n):
                cluster.request(pool)

    def tick(self, now: float) -> None:
        s = self.c.s
        for p in s.pools:
            blocks = self.c.blocks(p.name)
            active_blocks = len(blocks)  # running + pending
            active_slots = active_blocks  # one worker, one slot per block
            busy = sum(1 for b in blocks if b.job is not None)
            active_tasks = len(self.c.queues[p.name]) + busy
            min_blocks, max_blocks, parallelism = self.min_blocks[p.name], p.max_blocks, 1.0
            if active_tasks > 0:
                self.idle_since[p.name] = None
            if active_tasks == 0:
                if active_blocks <= min_blocks:
                    continue
                since = self.idle_since[p.name]
                if since is None:
                    self.idle_since[p.name] = since = now
                if now - since > s.max_idletime:
                    self.scale_in(blocks, active_blocks - min_blocks)
            elif active_slots / active_tasks < parallelism:
                if active_blocks >= max_blocks:
                    continue
                excess_slots = math.ceil(active_tasks * parallelism - active_slots)
                excess_blocks = min(math.ceil(excess_slots / 1), max_blocks - active_blocks)
                for _ in range(excess_blocks):
                    self.c.request(p.name)

    def scale_in(self, blocks: list[Block], n: int) -> None:
        """``HighThroughputExecutor.scale_in``: the longest idle first, a block with no
        connected worker (pending) counting as idle forever."""
        now = self.c.now
        order = sorted(blocks, key=lambda b: -(math.inf if b.ran is None else now - b.idle_since))
        for b in order[:n]:
            self.c.cancel(b)


# ----------------------------------------------------------------------------- keda


class KedaQueue(Scaler):
    """A KEDA ScaledObject per pool over a queue-length trigger, and the HPA under it
    (see the module's docstring)."""

    name = "keda"

    def __init__(self, cluster: Cluster, floor: dict[str, int] | None = None) -> None:
        s = cluster.s
        self.c = cluster
        self.period = s.hpa_sync
        pools = [p.name for p in s.pools]
        #: minReplicaCount per pool (above 0: never scaled to zero, the HPA's minimum)
        self.min = {p: (floor or {}).get(p, 0) for p in pools}
        self.replicas = dict.fromkeys(pools, 0)
        self.last_active: dict[str, float] = dict.fromkeys(pools, -math.inf)
        self.recs: dict[str, deque[tuple[float, int]]] = {p: deque() for p in pools}
        self.max = {p.name: p.max_blocks for p in s.pools}
        self.n = 0
        for pool, n in self.min.items():
            if n > 0:
                self.set(pool, n)

    def pods(self, pool: str) -> list[Block]:
        return [b for b in self.c.blocks(pool) if not b.deleting]

    def tick(self, now: float) -> None:
        s = self.c.s
        poll = self.n % round(s.keda_polling / s.hpa_sync) == 0
        self.n += 1
        for pool in self.replicas:
            metric = len(self.c.queues[pool]) + sum(
                1 for b in self.c.blocks(pool) if b.job is not None and not b.deleting
            )
            if poll and self.min[pool] == 0:  # KEDA's own loop: activation, scale to zero
                if metric > 0:
                    self.last_active[pool] = now
                    if self.replicas[pool] == 0:
                        self.set(pool, 1)
                elif self.replicas[pool] > 0 and now - self.last_active[pool] >= s.keda_cooldown:
                    self.recs[pool].clear()
                    self.set(pool, 0)
            current = self.replicas[pool]
            if current == 0:
                continue  # the HPA does not scale from zero
            ratio = metric / current  # target: 1 job per replica
            rec = current if abs(ratio - 1) <= s.hpa_tolerance else math.ceil(metric)
            rec = min(max(rec, 1, self.min[pool]), self.max[pool])
            recs = self.recs[pool]
            recs.append((now, rec))
            while recs and recs[0][0] < now - s.hpa_down_window:
                recs.popleft()
            down = max(r for _, r in recs)  # scale-down stabilisation: the window's highest
            if rec > current:
                self.set(pool, min(rec, max(2 * current, current + 4)))
            elif current > down:
                self.set(pool, down)

    def set(self, pool: str, n: int) -> None:
        self.replicas[pool] = n
        pods = self.pods(pool)
        for _ in range(n - len(pods)):
            self.c.request(pool)
        if n < len(pods):
            # A ReplicaSet deletes pending pods first, then the newest running ones.
            order = sorted(pods, key=lambda b: (b.ran is not None, -(b.ran or 0.0)))
            for b in order[: len(pods) - n]:
                self.c.delete(b)


# ----------------------------------------------------------------------------- the oracle


def fifo_bound(s: Settings, jobs: Sequence[Job]) -> dict[int, float]:
    """Each job's earliest possible start, by job id: FIFO dispatch per pool on every
    runner the pool allows (``max_blocks``), all up from the shortest provisioning delay
    on. No system in this simulation can start a job sooner: no block comes up before
    that delay, none dispatches out of arrival order (a job cut goes back to the front),
    and fewer runners up or a job run twice only make every later start later."""
    shortest = min(s.provisioning[0], s.stuck_delay[0]) if s.stuck_share else s.provisioning[0]
    starts: dict[int, float] = {}
    for p in s.pools:
        free = [shortest] * p.max_blocks  # when each runner is next free
        for job in sorted((j for j in jobs if j.pool == p.name), key=lambda j: (j.ready, j.jid)):
            starts[job.jid] = start = max(job.ready, heapq.heappop(free))
            heapq.heappush(free, start + job.duration)
    return starts


class Oracle(Scaler):
    """Clairvoyant: knows every job and every block's provisioning delay (the same
    :class:`Delays` the cluster draws from) and keeps, at each moment, the runners a
    *need* asks for up: ``every_block``, all of a pool's ``max_blocks`` from its first
    arrival to its last job's end; otherwise the runners the :func:`fifo_bound` schedule
    keeps busy. It asks for a block at the last look (every ``oracle_tick``) from which
    the next blocks' delays still bring them up in time, skips a block it knows will be
    stuck (asked for and cancelled at once), and releases an idle block when the need
    can do without it until a new block could come up."""

    def __init__(self, cluster: Cluster, every_block: bool) -> None:
        s = cluster.s
        self.c = cluster
        self.name = "oracle" if every_block else "oracle-budget"
        self.period = s.oracle_tick
        self.stuck = 0  #: blocks known to be stuck: asked for and cancelled at once
        starts = fifo_bound(s, cluster.jobs)
        #: per pool: the times the need changes, and the runners it asks for from each on
        self.need: dict[str, tuple[list[float], list[int]]] = {}
        for p in s.pools:
            jobs = [j for j in cluster.jobs if j.pool == p.name]
            steps: dict[float, int] = {}
            if every_block and jobs:
                last = max(starts[j.jid] + j.duration for j in jobs)
                steps = {min(j.ready for j in jobs): p.max_blocks, last: -p.max_blocks}
            elif not every_block:
                for j in jobs:
                    start = starts[j.jid]
                    steps[start] = steps.get(start, 0) + 1
                    steps[start + j.duration] = steps.get(start + j.duration, 0) - 1
            times = sorted(steps)
            self.need[p.name] = (times, list(itertools.accumulate(steps[t] for t in times)))

    def tick(self, now: float) -> None:
        for p in self.c.s.pools:
            blocks = self.c.blocks(p.name)
            ups = sorted(b.up_at for b in blocks)
            for b in sorted(blocks, key=lambda b: b.bid, reverse=True):
                if b.ran is None or b.job is not None:
                    continue
                rest = list(ups)
                rest.remove(b.up_at)
                if not self.in_time(p.name, now, rest):
                    break  # the idle blocks are alike: none can go
                self.c.cancel(b)
                ups = rest
            while len(ups) < p.max_blocks and not self.in_time(p.name, now, ups):
                ups = sorted([*ups, self.request(p.name).up_at])

    def in_time(self, pool: str, now: float, ups: list[float]) -> bool:
        """Whether blocks asked for at the next look come up in time for what the need
        asks beyond the blocks up or coming up at ``ups`` (sorted)."""
        late = self.short(pool, now, ups)
        nexts = sorted(now + self.period + d for d in self.upcoming(pool, len(late)))
        return all(up <= by for up, by in zip(nexts, late, strict=True))

    def short(self, pool: str, now: float, ups: list[float]) -> list[float]:
        """By when the need asks for a first, second, ... block more than ``ups``, up to
        the last moment a block asked for at the next look could be for."""
        times, levels = self.need[pool]
        horizon = now + self.period + self.c.s.provisioning[1]
        i = max(bisect.bisect_right(times, now) - 1, 0)
        out: list[float] = []
        while i < len(times) and times[i] <= horizon:
            by = max(times[i], now)
            out.extend([by] * (levels[i] - bisect.bisect_right(ups, by) - len(out)))
            i += 1
        return out

    def upcoming(self, pool: str, n: int) -> list[float]:
        """The delays of the next ``n`` blocks the pool would get, stuck ones skipped."""
        out: list[float] = []
        k = self.c.asked[pool]
        while len(out) < n:
            delay, stuck = self.c.delays(pool, k)
            k += 1
            if not stuck:
                out.append(delay)
        return out

    def request(self, pool: str) -> Block:
        while True:
            b = self.c.request(pool)
            if not b.stuck:
                return b
            self.c.cancel(b)
            self.stuck += 1


FACTORIES: dict[str, Callable[[Cluster], Scaler]] = {
    "corral": CorralScaler,
    "parsl": ParslSimple,
    "keda": KedaQueue,
    "corral-noalert": lambda c: CorralScaler(c, alerts=None),
    "corral-hold": lambda c: CorralScaler(c, alerts="hold"),
    "corral-floor": lambda c: CorralScaler(c, alerts="floor"),
    "corral-forecast": lambda c: CorralScaler(c, demand_params=FORECAST),
    "corral-spare": lambda c: CorralScaler(c, demand_params={"spare": c.s.spare}),
    "corral-warm": lambda c: CorralScaler(c, floor=dict(c.s.warm)),
    "corral-nolookahead": lambda c: CorralScaler(c, demand_params={"lookahead": None}),
    "parsl-warm": lambda c: ParslSimple(c, floor=dict(c.s.warm)),
    "keda-warm": lambda c: KedaQueue(c, floor=dict(c.s.warm)),
    "oracle": lambda c: Oracle(c, every_block=True),
    "oracle-budget": lambda c: Oracle(c, every_block=False),
}


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class Result:
    system: str
    seed: int
    scenario: str
    jobs: int
    unfinished: int
    p95_wait: float  #: seconds
    max_wait: float
    p95_wait_by_pool: dict[str, float]
    worker_hours: float
    makespan: float  #: seconds
    blocks: int
    jobs_cut: int
    busy_stops: int
    stuck_replaced: int
    alerts_fired: int
    scale_outs: int  #: the alert rule's scale-out actions
    over_bound: int  #: jobs that waited longer than the FIFO bound allows (0: the bound)
    wall: float  #: seconds the simulation took


def p95(values: Sequence[float]) -> float:
    """The nearest-rank 95th percentile (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def simulate(system: str, s: Settings, seed: int, scenario: str = "healthy") -> Result:
    s = scenario_settings(s, scenario)
    if s.pipelines and system in ORACLES:
        raise ValueError(f"{system} knows arrivals; in scenario {scenario} jobs wait for others")
    t0 = time.perf_counter()
    jobs = make_jobs(s, seed)
    cluster = Cluster(s, jobs, Delays(s, seed))
    scaler = FACTORIES[system](cluster)
    cluster.run(scaler)
    done = [j for j in jobs if j.finished is not None]
    # The FIFO bound is for jobs that arrive on their own (not waiting for others).
    bound = {} if s.pipelines else fifo_bound(s, jobs)
    slack = {j.jid: j.waited - (bound[j.jid] - j.ready) for j in done if j.jid in bound}
    below = [jid for jid, d in slack.items() if d < -1e-6]
    if below:
        raise AssertionError(f"{system}, seed {seed}: jobs {below} waited less than the bound")
    waits = [j.waited for j in done]
    by_pool = {p.name: p95([j.waited for j in done if j.pool == p.name]) for p in s.pools}
    blocks = cluster.ended
    first = min((j.ready for j in jobs), default=0.0)
    last = max((j.finished or 0.0 for j in jobs), default=0.0)
    return Result(
        system=system, seed=seed, scenario=scenario, jobs=len(jobs),
        unfinished=len(jobs) - len(done), p95_wait=p95(waits),
        max_wait=max(waits, default=0.0), p95_wait_by_pool=by_pool,
        worker_hours=sum((b.ended or 0.0) - b.requested for b in blocks) / HOUR,
        makespan=last - first, blocks=len(blocks),
        jobs_cut=sum(j.cut for j in jobs), busy_stops=cluster.busy_stops,
        stuck_replaced=getattr(scaler, "stuck", 0), alerts_fired=getattr(scaler, "fired", 0),
        scale_outs=getattr(scaler, "scale_outs", 0),
        over_bound=sum(1 for d in slack.values() if d > 1e-6),
        wall=time.perf_counter() - t0,
    )  # fmt: skip


def ratios(runs: dict[str, Result], system: str = "corral") -> dict[str, float]:
    """``system``'s figure over the best peer's (the lower of the two), per figure."""
    c = runs[system]

    def best(get: Callable[[Result], float]) -> float:
        peer = min(get(runs[p]) for p in PEERS)
        return get(c) / peer if peer > 0 else (1.0 if get(c) == 0 else math.inf)

    return {
        "p95_wait": best(lambda r: r.p95_wait),
        "max_wait": best(lambda r: r.max_wait),
        "worker_hours": best(lambda r: r.worker_hours),
        "makespan": best(lambda r: r.makespan),
    }


def _hours_vs_best_p95(runs: dict[str, Result], system: str) -> float:
    """``system``'s worker-hours over those of the peer with the lower p95 wait."""
    peer = min(PEERS, key=lambda p: (runs[p].p95_wait, runs[p].worker_hours))
    return runs[system].worker_hours / runs[peer].worker_hours


COLUMNS: tuple[tuple[str, Callable[[Result], float], str], ...] = (
    ("p95 wait", lambda r: r.p95_wait / MIN, "{:.1f}"),
    ("p95 cpu", lambda r: r.p95_wait_by_pool["cpu"] / MIN, "{:.1f}"),
    ("p95 gpu", lambda r: r.p95_wait_by_pool["gpu"] / MIN, "{:.1f}"),
    ("max wait", lambda r: r.max_wait / MIN, "{:.1f}"),
    ("worker-h", lambda r: r.worker_hours, "{:.1f}"),
    ("makespan h", lambda r: r.makespan / HOUR, "{:.2f}"),
    ("blocks", lambda r: float(r.blocks), "{:.0f}"),
    ("jobs cut", lambda r: float(r.jobs_cut), "{:.1f}"),
    ("stuck repl.", lambda r: float(r.stuck_replaced), "{:.1f}"),
    ("alerts", lambda r: float(r.alerts_fired), "{:.1f}"),
    ("scale-outs", lambda r: float(r.scale_outs), "{:.1f}"),
    ("unfinished", lambda r: float(r.unfinished), "{:.0f}"),
)


def table(scenario: str, per_seed: list[dict[str, Result]]) -> str:
    """One row per system, averaged over the seeds (waits in minutes), then Corral's
    ratios to the best peer (averaged over the seeds) and the issue's target."""
    n = len(per_seed)
    seeds = ", ".join(str(runs["corral"].seed) for runs in per_seed)
    jobs = sum(runs["corral"].jobs for runs in per_seed) / n
    width = 12
    systems = [name for name in (*SYSTEMS, *EXTRA, *KNOBS, *ORACLES) if name in per_seed[0]]
    lines = [
        f"scenario {scenario}: seeds {seeds}, {jobs:.0f} jobs per seed on average; "
        "waits in minutes",
        f"{'system':15}" + "".join(f"{label:>{width}}" for label, _, _ in COLUMNS),
    ]
    for system in systems:
        cells = "".join(
            f"{fmt.format(sum(get(runs[system]) for runs in per_seed) / n):>{width}}"
            for _, get, fmt in COLUMNS
        )
        lines.append(f"{system:15}{cells}")

    def mean_ratios(system: str) -> dict[str, float]:
        rs = [ratios(runs, system) for runs in per_seed]
        return {k: sum(r[k] for r in rs) / n for k in rs[0]}

    avg = mean_ratios("corral")
    by_p95 = sum(_hours_vs_best_p95(runs, "corral") for runs in per_seed) / n
    lines.append(
        "corral / best peer (mean over seeds): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in avg.items())
        + f" (worker_hours {by_p95:.2f}x the best-p95 peer's)"
    )
    met = avg["p95_wait"] <= 0.5 and avg["worker_hours"] <= 1.0
    lines.append(
        "target (p95 wait <= 0.5x the best peer's at <= 1.0x its worker-hours): "
        + ("MET" if met else "NOT MET")
    )
    loose = ["corral"] if avg["p95_wait"] <= 0.5 and by_p95 <= 1.0 else []
    for system in (s for s in (*EXTRA, *KNOBS) if s.startswith("corral-") and s in per_seed[0]):
        r = mean_ratios(system)
        by_p95 = sum(_hours_vs_best_p95(runs, system) for runs in per_seed) / n
        lines.append(
            f"{system} / best peer: p95_wait {r['p95_wait']:.2f}x, worker_hours "
            f"{r['worker_hours']:.2f}x ({by_p95:.2f}x the best-p95 peer's)"
        )
        if r["p95_wait"] <= 0.5 and by_p95 <= 1.0:
            loose.append(system)
    lines.append(
        "the target read against the best-p95 peer alone (half its p95 at no more than its "
        "worker-hours): " + (f"met by {', '.join(loose)}" if loose else "met by no Corral row")
    )
    for system in (o for o in ORACLES if o in per_seed[0]):
        r = mean_ratios(system)
        off = sum(runs[system].over_bound for runs in per_seed)
        lines.append(
            f"{system} / best peer: p95_wait {r['p95_wait']:.2f}x, worker_hours "
            f"{r['worker_hours']:.2f}x; jobs waiting longer than the FIFO bound: {off}"
        )
    if "oracle" in per_seed[0]:
        bound = mean_ratios("oracle")["p95_wait"]
        verdict = (
            "rules out 0.5x for every scaler"
            if bound > 0.5
            else "does not rule out 0.5x (a scaler that knew the arrivals would reach it)"
        )
        lines.append(
            "the FIFO bound (oracle's p95: no scaler beats it within max_blocks) is "
            f"{bound:.2f}x the best peer's p95: it {verdict}"
        )
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Needs:
    """What the target asks of one seed's waits (:func:`needs`)."""

    seed: int
    half: float  #: half the best peer's p95 wait, seconds
    jobs: int
    allowed: int  #: jobs that may wait longer than ``half`` with the p95 at most ``half``
    over: dict[str, int]  #: per pool, the jobs whose FIFO bound is already longer
    cpu_bursts: tuple[int, ...]  #: ``cpu`` jobs per burst, sorted

    @property
    def left(self) -> int:
        """Jobs that may still wait longer than ``half`` (negative: no scaler can)."""
        return self.allowed - sum(self.over.values())


def needs(s: Settings, scenario: str, runs: dict[str, Result]) -> Needs:
    """A p95 (nearest rank) of at most half the best peer's lets ``N - ceil(0.95 N)``
    jobs wait longer than that. Every job of every system waits at least its FIFO bound,
    so the jobs the bound already makes wait longer take their share first; only the
    rest is left for every other job."""
    s = scenario_settings(s, scenario)
    seed = runs["corral"].seed
    half = 0.5 * min(runs[p].p95_wait for p in PEERS)
    jobs = make_jobs(s, seed)
    bound = fifo_bound(s, jobs)
    over = Counter(j.pool for j in jobs if bound[j.jid] - j.ready > half)
    bursts = Counter(j.burst for j in jobs if j.pool == "cpu")
    return Needs(
        seed, half, len(jobs), len(jobs) - math.ceil(0.95 * len(jobs)), dict(sorted(over.items())),
        tuple(sorted(bursts.values())),
    )  # fmt: skip


def target_needs(s: Settings, scenario: str, per_seed: list[dict[str, Result]]) -> str:
    """:func:`needs`, a line per seed."""
    lines = [
        "what 0.5x asks, per seed (jobs allowed to wait longer than half the best peer's "
        "p95; those the FIFO bound already makes wait longer; what is left for the rest):"
    ]
    for runs in per_seed:
        n = needs(s, scenario, runs)
        at_bound = sum(n.over.values())
        pools = ", ".join(f"{pool} {k}" for pool, k in n.over.items())
        bursts = n.cpu_bursts or (0,)
        lines.append(
            f"  seed {n.seed}: {n.half / MIN:.1f} min; {n.allowed} of {n.jobs} jobs may wait "
            f"longer; at the bound {at_bound} do ({pools or 'none'}); left for the "
            f"{n.jobs - at_bound} others: {n.left if n.left >= 0 else 'none'}; cpu jobs per "
            f"burst: median {bursts[len(bursts) // 2]}, largest {bursts[-1]}"
        )
    return "\n".join(lines)


def run_all(
    s: Settings,
    seeds: Sequence[int],
    scenarios: Sequence[str],
    systems: Sequence[str] = SYSTEMS,
) -> dict[str, list[dict[str, Result]]]:
    return {
        sc: [
            {
                sys_: simulate(sys_, s, seed, sc)
                for sys_ in systems
                if not (SCENARIOS[sc][1] and sys_ in ORACLES)  # no bound with pipelines
            }
            for seed in seeds
        ]
        for sc in scenarios
    }


def _warm(text: str) -> tuple[tuple[str, int], ...]:
    """``--warm cpu=20,gpu=4``: blocks kept per pool by the ``-warm`` rows."""
    pools = MAX_BLOCKS
    out = []
    for item in text.split(","):
        name, _, n = item.partition("=")
        if name not in pools or not n.isdigit() or int(n) > pools[name]:
            raise argparse.ArgumentTypeError(
                f"{item!r}: give POOL=N with POOL one of {', '.join(pools)} and N at most "
                "its max_blocks (" + ", ".join(f"{k} {v}" for k, v in pools.items()) + ")"
            )
        out.append((name, int(n)))
    return tuple(out)


#: the pool limits ``--pool-limit`` may change: the others are each pool's fleet
#: (``max_blocks``, the same for every system) or set by the rows (``min_blocks``)
POOL_LIMITS = {"max_idletime": float, "spare_blocks": int, "provisioning_timeout": float}


def _limits_of(s: Settings, pool: str) -> dict[str, Any]:
    """``s.corral_limits`` for ``pool``, as ``PoolLimits`` fields (the later wins)."""
    return {key: POOL_LIMITS[key](v) for name, key, v in s.corral_limits if name == pool}


def _pool_limit(text: str) -> tuple[str, str, float]:
    """``--pool-limit cpu.max_idletime=450``: one field of one pool's limits."""
    pools = MAX_BLOCKS
    target, _, value = text.partition("=")
    pool, _, key = target.partition(".")
    try:
        number = float(value)
        if math.isnan(number):
            raise ValueError("give a number, not nan")
        if pool not in pools or key not in POOL_LIMITS:
            raise ValueError(f"{target!r} is not POOL.FIELD")
        if POOL_LIMITS[key] is int and not number.is_integer():
            raise ValueError(f"{key} takes a whole number, got {value!r}")
        PoolLimits(max_blocks=pools[pool], **{key: POOL_LIMITS[key](number)})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give POOL.FIELD=VALUE with POOL one of {', '.join(pools)} and FIELD "
            f"one of {', '.join(POOL_LIMITS)} ({exc})"
        ) from None
    return pool, key, number


def _spare(text: str) -> int:
    """``--spare 12``: a whole number of blocks, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of blocks, 0 or more")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1.5 h of bursts, one seed")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 1..N (default 5; quick 1)")
    ap.add_argument(
        "--first-seed", type=int, default=1, metavar="K",
        help="count the --seeds from K instead of 1 (K..K+N-1): seeds no setting was "
        "chosen on, to check a figure holds beyond seeds 1-5",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=None, help="only this seed")
    ap.add_argument(
        "--scenario", choices=[*SCENARIOS, "all"], default="all",
        help="healthy: every block comes up in 2-5 min; stuck: 5%% take 30-60 min; "
        "pipelines: each burst a build stage, then tests that need it",
    )  # fmt: skip
    ap.add_argument(
        "--systems", choices=["three", "all"], default="three",
        help="three: corral, parsl and keda, beside the clairvoyant oracle and oracle-budget; "
        "all: also corral-noalert (no alert rule), corral-hold (scale-outs raise the "
        "target for the cooldown), corral-floor (the rule without restore), corral-forecast "
        "(the demand strategy's forecast = 0.9), corral-spare (its spare = 12 idle blocks) "
        "and corral-, parsl- and keda-warm (4 blocks kept in pool gpu: min_blocks, "
        "minReplicaCount)",
    )  # fmt: skip
    ap.add_argument(
        "--max-idletime", type=float, default=None,
        help="seconds an idle block stays (Corral's and Parsl's max_idletime; default 120)",
    )  # fmt: skip
    ap.add_argument(
        "--warm", type=_warm, default=None, metavar="POOL=N[,POOL=N]",
        help="the blocks the -warm rows keep per pool from the start (default gpu=4)",
    )  # fmt: skip
    ap.add_argument(
        "--spare", type=_spare, default=None, metavar="N",
        help="idle blocks the corral-spare row keeps per pool beyond the active tasks' "
        "(the demand strategy's spare; default 12)",
    )  # fmt: skip
    ap.add_argument(
        "--pool-limit", type=_pool_limit, action="append", default=[],
        metavar="POOL.FIELD=VALUE",
        help="a pool limit of every Corral row, as in a pool's configuration (repeat it): "
        f"FIELD one of {', '.join(POOL_LIMITS)}; e.g. cpu.max_idletime=450",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    s = QUICK if args.quick else FULL
    if args.max_idletime is not None:
        s = dataclasses.replace(s, max_idletime=args.max_idletime)
    if args.warm is not None:
        s = dataclasses.replace(s, warm=args.warm)
    if args.spare is not None:
        s = dataclasses.replace(s, spare=args.spare)
    if args.pool_limit:
        s = dataclasses.replace(s, corral_limits=tuple(args.pool_limit))
    systems = (
        (*SYSTEMS, *ORACLES) if args.systems == "three" else (*SYSTEMS, *EXTRA, *KNOBS, *ORACLES)
    )
    if args.seed is not None:
        seeds: list[int] = [args.seed]
    else:
        first = args.first_seed
        seeds = list(range(first, first + (args.seeds or (1 if args.quick else 5))))
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    t0 = time.perf_counter()
    results = run_all(s, seeds, scenarios, systems)
    if args.json:
        out = {
            sc: [
                {"seed": runs["corral"].seed, "ratios": ratios(runs),
                 **({"oracle_ratios": ratios(runs, "oracle")} if "oracle" in runs else {}),
                 **({} if SCENARIOS[sc][1] else {"needs": {
                     **dataclasses.asdict(n := needs(s, sc, runs)), "left": n.left}}),
                 **{k: dataclasses.asdict(v) for k, v in runs.items()}}
                for runs in per_seed
            ]
            for sc, per_seed in results.items()
        }  # fmt: skip
        print(json.dumps(out, indent=1))
        return 0
    if s.corral_limits:
        print("every Corral row's pool limits changed: " + ", ".join(
            f"{pool}.{key}={POOL_LIMITS[key](v)}" for pool, key, v in s.corral_limits))  # fmt: skip
    for sc, per_seed in results.items():
        print(table(sc, per_seed))
        if not SCENARIOS[sc][1]:  # the FIFO bound is for jobs that arrive on their own
            print(target_needs(s, sc, per_seed))
        print()
    print(f"simulated in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
