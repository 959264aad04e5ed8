"""Retry policies: what happens to a task whose try did not end ``ok``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from policies.base import MAX_RETRY_DELAY, NOT_LOADABLE, REGISTRY, RetryDecision, TaskView
from runtime.messages import pool_name_problem

__all__ = ["DefaultRetry", "NeverRetry"]


#: What a retry that keeps its place says (after its reason).
KEEPS = "it keeps its place in the queue, not behind fresh work"

#: The causes of a try lost with its worker that are the batch system's doing, not the
#: task's: its free retry keeps its place (``lost_keeps_place``).
BATCH_LOSSES = frozenset({"preempted", "suspended", "walltime"})


@REGISTRY.register("retry", "default")
class DefaultRetry:
    """Default. An error raised by the task is retried only while the user's budget
    (``retries=``) lasts, and each retry spends it; not a task whose function or an
    argument could not be loaded on its worker (cause ``not-loadable``,
    :class:`~runtime.errors.TaskNotLoadable`: the workers of one installation all fail
    alike). A try lost with its worker
    (preempted, crashed, drained, past its walltime, ...) is retried for free, up to
    ``max_lost`` losses of the same task in a row that left no checkpoint of their try
    behind (:attr:`~policies.TaskView.lost_since_saved`); then the task fails with
    :class:`~runtime.errors.WorkerLost`. A loss after which a checkpoint the try saved
    survives starts that count again: a long task that checkpoints outlives any number
    of blocks (walltimes, preemptions) while each try saves some of its work. A task
    that was running, or may have been, on ``max_crashes`` workers that ended
    unexpectedly (not drained or preempted) is a suspect, a *poison task* that may be
    what kills them: it fails with :class:`~runtime.errors.TaskCrashedWorkers` instead
    of taking another worker. A try that surely waited in its worker's queue does not
    count (:attr:`~policies.TaskView.crash_tries`: the scheduler core decides that). A try
    killed at its worker's memory terminate fence (``oom``) is retried for free up to
    ``max_oom`` times; then the task fails with :class:`~runtime.errors.TaskOutOfMemory`.
    The scheduler core sends such a retry only to a worker with a larger memory limit
    than every one the task was killed on, waits for one while one may come, and fails
    the task at once when none can (docs/memory.md). A try whose output did not fit on its
    worker's disk (``disk-full``) is retried for free up to ``max_disk_full`` times: the
    scheduler now expects outputs that large and places the retry on a worker with the
    room (or it waits for one); then the task fails with
    :class:`~runtime.errors.DiskFull`. Retries go behind work that has not been tried yet
    (the scheduler core keeps the place of a retry that a task waits for beside stored
    outputs: docs/policies.md, retry), but one: a free retry that resumes from a
    checkpoint (:attr:`~policies.TaskView.saved_work` not None) keeps its place
    (``behind=False``), with ``resumable_keeps_place`` (true by default). Queued behind
    fresh long tasks it would wait their length, and its checkpoint, on a preemptible
    worker's disk, could go with the next preemption meanwhile; its reason says it
    keeps its place. So does, with ``lost_keeps_place`` (true by default), a free retry
    of a try lost to its batch system (:data:`BATCH_LOSSES`: its worker preempted,
    suspended, or past its walltime), the batch system's doing, not the task's: put
    behind the work submitted since, in a campaign that keeps submitting it waited for
    all of it (an audit: 16 preempted tasks waited 5 to 19 minutes and more, none sent
    again, while 700 tasks submitted after them ran).

    ``fallback`` maps a pool to the pool its *long* tasks move to: a task preempted
    after running at least as long as its pool's workers' median life (the pool's
    Kaplan-Meier survival estimate, :attr:`~policies.TaskView.survival`), or whose
    category's finished tasks took that long on average, would likely be preempted
    again there, so its retry runs in the fallback pool (e.g. ``{"ckpt": "owner"}``:
    off the checkpoint partition, onto the owners' nodes). A task whose retry resumes
    from a checkpoint (:attr:`~policies.TaskView.saved_work`) is judged by what the
    preemption cost it, its run since that checkpoint
    (:attr:`~policies.TaskView.unsaved_for`), not by its whole run or its category: it
    moves only when that reached the median life, and its story says why it stayed when
    its run or its category alone would have moved it. While the median is unknown
    (fewer than half of the pool's workers seen dying), nothing moves for being long;
    but a task lost more than ``max_lost`` times in a pool with a fallback moves there
    instead of failing.

    A try lost to its worker's walltime after executing about the whole life a worker
    of its pool gets (:attr:`~policies.WalltimeLoss.whole_life`: from the first drain
    period of its worker's life to the walltime) cannot fit in that pool: it moves to
    its pool's ``fallback`` if there is one, else it is not retried and fails with
    :class:`~runtime.errors.TaskLongerThanWalltime`. A try lost to the walltime after
    starting later in its worker's life gets its free retry (a fresh worker may give it
    the time).

    ``backoff`` (seconds, 0 by default: at once) holds a charged retry of an ``error``
    or ``timeout`` before it is ready: ``backoff`` before the first, doubled for each
    charged retry before (``backoff * 2 ** charged_tries``), at most ``max_backoff``
    (60 s by default, at most :data:`~policies.MAX_RETRY_DELAY`): a transient hiccup of
    remote storage gets time to pass. Free retries (a lost worker, a kill for memory, a
    full disk) stay immediate."""

    name = "default"

    def __init__(
        self,
        max_lost: int = 5,
        charge_lost: bool = False,
        max_oom: int = 1,
        max_crashes: int = 3,
        fallback: Mapping[str, str] | None = None,
        max_disk_full: int = 2,
        backoff: float = 0.0,
        max_backoff: float = 60.0,
        resumable_keeps_place: bool = True,
        lost_keeps_place: bool = True,
    ) -> None:
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if not math.isfinite(value) or not 0 <= value <= MAX_RETRY_DELAY:
                raise ValueError(
                    f"{name} must be a number of seconds from 0 to {MAX_RETRY_DELAY:g} "
                    f"(the longest the scheduler holds a retry), got {value!r}"
                )
        for knob, flag in (
            ("resumable_keeps_place", resumable_keeps_place),
            ("lost_keeps_place", lost_keeps_place),
        ):
            if not isinstance(flag, bool):  # (the registry checks it first)
                raise TypeError(f"{knob} must be true or false (a bool), got {flag!r}")
        if max_lost < 0:
            raise ValueError("max_lost must be >= 0")
        if max_oom < 0:
            raise ValueError("max_oom must be >= 0")
        if max_disk_full < 0:
            raise ValueError("max_disk_full must be >= 0")
        if max_crashes < 1:
            raise ValueError("max_crashes must be >= 1")
        self.max_lost = int(max_lost)
        self.max_oom = int(max_oom)
        self.max_disk_full = int(max_disk_full)
        self.max_crashes = int(max_crashes)
        self.charge_lost = bool(charge_lost)
        fallback = dict(fallback or {})
        for pool, to in fallback.items():
            problem = pool_name_problem(pool) or pool_name_problem(to)
            if problem:
                raise ValueError(
                    f"fallback maps pool names to pool names, got {pool!r}: {to!r} ({problem}): "
                    "map each pool to the pool its long tasks move to, e.g. "
                    "fallback={'spot': 'owned'}"
                )
            if pool == to:
                raise ValueError(f"pool {pool!r} cannot fall back to itself")
        self.fallback = fallback
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.resumable_keeps_place = resumable_keeps_place
        self.lost_keeps_place = lost_keeps_place

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        decision = self._decide(task, outcome, cause)
        if not (decision.retry and not decision.charge):
            return decision
        # (read only for a free retry: a policy's own task views may lack it)
        saved = task.saved_work if self.resumable_keeps_place else None
        if saved is not None:
            reason = f"{decision.reason}; its checkpoint holds {saved:.0f} s of work: {KEEPS}"
            return dataclasses.replace(decision, behind=False, reason=reason)
        if self.lost_keeps_place and outcome == "worker-lost" and cause in BATCH_LOSSES:
            # (its reason as before: worker lost (preempted); free retry)
            return dataclasses.replace(decision, behind=False)
        return decision  # it starts over: behind fresh work, as any retry

    def _decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        """The decision, a retry behind fresh work (:meth:`decide` keeps a resumable
        free retry's place)."""
        if outcome == "worker-lost":
            if task.crash_tries >= self.max_crashes:
                return RetryDecision(
                    False, reason=f"running when {task.crash_tries} workers crashed: a suspect"
                )
            too_long = self._too_long(task, cause)
            if too_long is not None:
                return too_long
            # Losses in a row that saved nothing: a task whose tries each leave a
            # checkpoint behind progresses, however many workers it outlives.
            lost = task.lost_since_saved
            if lost > self.max_lost:
                times = f"{lost} times"
                if lost != task.lost_tries:
                    times += f" in a row with no checkpoint saved ({task.lost_tries} in all)"
                to = self.fallback.get(task.pool) if task.pool is not None else None
                if to is not None and cause == "preempted":
                    reason = f"lost {times} to preemption: moved to {to!r}"
                    return RetryDecision(True, charge=False, reason=reason, pool=to)
                return RetryDecision(False, reason=f"lost {times}")
            if self.charge_lost:
                if task.retries_left <= 0:
                    return RetryDecision(False, reason="retry budget spent")
                return RetryDecision(True, charge=True, reason=f"worker lost ({cause})")
            moved = self._long(task, cause)
            if moved is not None:
                return moved
            return RetryDecision(True, charge=False, reason=f"worker lost ({cause}); free retry")
        if outcome == "oom":
            if task.oom_tries > self.max_oom:
                return RetryDecision(False, reason=f"killed for memory {task.oom_tries} times")
            return RetryDecision(True, charge=False, reason="killed for memory; free retry")
        if outcome == "disk-full":
            full = task.disk_full_tries
            if full > self.max_disk_full:
                return RetryDecision(False, reason=f"output did not fit on disk {full} times")
            return RetryDecision(
                True, charge=False, reason="output did not fit on disk; free retry"
            )
        if outcome in ("error", "timeout"):
            if cause == NOT_LOADABLE:
                return RetryDecision(
                    False, reason="its code could not be loaded on the worker: a retry fails alike"
                )
            if task.retries_left > 0:
                reason = f"{outcome}; retry budget left"
                if not self.backoff:
                    return RetryDecision(True, charge=True, reason=reason)
                # (read only with a backoff: a policy's own task views may lack it)
                doubled = self.backoff * 2.0 ** min(task.charged_tries, 64)
                delay = min(doubled, self.max_backoff)
                return RetryDecision(True, charge=True, reason=reason, delay=delay)
            return RetryDecision(False, reason=f"{outcome}; no retry budget left")
        return RetryDecision(False, reason=outcome)

    def _too_long(self, task: TaskView, cause: str | None) -> RetryDecision | None:
        """For a try lost to the walltime after its worker's whole life: a move to the
        fallback pool, else no retry (None: not such a try)."""
        loss = task.walltime_loss if cause == "walltime" else None
        if loss is None or not loss.whole_life:
            return None
        why = (
            f"lost to the walltime after running {loss.ran:.0f} s of the {loss.walltime:.0f} s "
            f"a worker of {loss.pool!r} lives: longer than its walltime"
        )
        to = self.fallback.get(task.pool) if task.pool is not None else None
        if to is not None:
            return RetryDecision(True, charge=False, reason=f"{why}, moved to {to!r}", pool=to)
        return RetryDecision(False, reason=why)

    def _long(self, task: TaskView, cause: str | None) -> RetryDecision | None:
        """A free retry in the fallback pool for a task too long for its own; a free
        retry that stays, saying why, for a checkpointed task the rule would have moved
        for its whole run; None: the rule has nothing to say."""
        if cause != "preempted" or task.pool is None:
            return None
        to = self.fallback.get(task.pool)
        if to is None:
            return None
        median = task.survival.median
        if median is None:
            return None
        ran = task.ran_for
        saved = task.saved_work
        # What a preemption cost it: its run since the newest surviving checkpoint.
        unsaved = ran if saved is None else task.unsaved_for
        life = f"the median life of {task.pool!r} workers ({median:.0f} s)"
        stats = task.stats
        mean = stats.mean_duration if stats is not None and stats.count else 0.0
        if unsaved >= median:
            why = f"preempted after {ran:.0f} s"
            if saved is not None:
                why += f", {unsaved:.0f} s of it not in a checkpoint"
        elif saved is not None:
            if ran < median and mean < median:
                return None
            # Long by its run or its category, but it resumes and lost little: it stays.
            reason = (
                f"worker lost (preempted); free retry in {task.pool!r}: it resumes from its "
                f"checkpoint, {unsaved:.0f} s of its {ran:.0f} s run not in it, under {life}"
            )
            if ran < median:
                reason += f" (its category takes {mean:.0f} s on average)"
            return RetryDecision(True, charge=False, reason=reason)
        elif mean >= median:
            why = f"preempted; its category takes {mean:.0f} s on average"
        else:
            return None
        reason = f"{why}, past {life}: a long task, moved to {to!r}; free retry"
        return RetryDecision(True, charge=False, reason=reason, pool=to)


@REGISTRY.register("retry", "never")
class NeverRetry:
    """Nothing is retried, not even tries lost with their worker."""

    name = "never"

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        return RetryDecision(False, reason=f"{outcome}; retry policy 'never'")
