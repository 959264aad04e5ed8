"""Retry policies: what happens to a task whose try did not end ``ok``."""

from __future__ import annotations

from policies.base import REGISTRY, RetryDecision, TaskView

__all__ = ["DefaultRetry", "NeverRetry"]


@REGISTRY.register("retry", "default")
class DefaultRetry:
    """Default. An error raised by the task is retried only while the user's budget
    (``retries=``) lasts, and each retry spends it. A try lost with its worker
    (preempted, crashed, drained, ...) is retried for free, up to ``max_lost`` losses of
    the same task; then the task fails with :class:`~runtime.errors.WorkerLost`. A task
    that was running on ``max_crashes`` workers that ended unexpectedly (not drained or
    preempted) is a suspect, a *poison task* that may be what kills them: it fails with
    :class:`~runtime.errors.TaskCrashedWorkers` instead of taking another worker. A try
    killed at its worker's memory terminate fence (``oom``) is retried for free up to
    ``max_oom`` times (memory others held may be free by then); then the task fails with
    :class:`~runtime.errors.TaskOutOfMemory`. Retries go behind work that has not been
    tried yet."""

    name = "default"

    def __init__(
        self,
        max_lost: int = 5,
        charge_lost: bool = False,
        max_oom: int = 1,
        max_crashes: int = 3,
    ) -> None:
        if max_lost < 0:
            raise ValueError("max_lost must be >= 0")
        if max_oom < 0:
            raise ValueError("max_oom must be >= 0")
        if max_crashes < 1:
            raise ValueError("max_crashes must be >= 1")
        self.max_lost = int(max_lost)
        self.max_oom = int(max_oom)
        self.max_crashes = int(max_crashes)
        self.charge_lost = bool(charge_lost)

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        if outcome == "worker-lost":
            if task.crash_tries >= self.max_crashes:
                return RetryDecision(
                    False, reason=f"running when {task.crash_tries} workers crashed: a suspect"
                )
            if task.lost_tries > self.max_lost:
                return RetryDecision(False, reason=f"lost {task.lost_tries} times")
            if self.charge_lost:
                if task.retries_left <= 0:
                    return RetryDecision(False, reason="retry budget spent")
                return RetryDecision(True, charge=True, reason=f"worker lost ({cause})")
            return RetryDecision(True, charge=False, reason=f"worker lost ({cause}); free retry")
        if outcome == "oom":
            if task.oom_tries > self.max_oom:
                return RetryDecision(False, reason=f"killed for memory {task.oom_tries} times")
            return RetryDecision(True, charge=False, reason="killed for memory; free retry")
        if outcome in ("error", "timeout"):
            if task.retries_left > 0:
                return RetryDecision(True, charge=True, reason=f"{outcome}; retry budget left")
            return RetryDecision(False, reason=f"{outcome}; no retry budget left")
        return RetryDecision(False, reason=outcome)


@REGISTRY.register("retry", "never")
class NeverRetry:
    """Nothing is retried, not even tries lost with their worker."""

    name = "never"

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        return RetryDecision(False, reason=f"{outcome}; retry policy 'never'")
