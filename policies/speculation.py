"""Speculation policies: when a long-running task gets a speculative copy.

A speculative copy runs the same task a second time on another worker while the first
try still runs; the first to finish well wins, the other is cancelled and its output,
if one arrives, dropped. Copies pay off in the tail of a run, when workers would idle
anyway while a few stragglers (a slow disk, a busy host) hold up the end.

The scheduler asks ``copy(task, running_for, idle)`` about a running task (one its
worker says executes, ``running_for`` seconds since it began there) only when
some worker is idle (it runs nothing and no ready task could go to it) and the task has
fewer than the policy's ``max_copies`` copies; see :class:`policies.base.SpeculationPolicy`.
The answer is a proposal: the core places a copy only on an idle worker that may run
the task (its pool, resources, memory admission and free disk, as for any placement),
never on a worker already running it.
"""

from __future__ import annotations

from policies.base import REGISTRY, TaskView

__all__ = ["IdleTail", "NoSpeculation"]


@REGISTRY.register("speculation", "idle-tail")
class IdleTail:
    """Default. A copy of a task that has run longer than its category's p90 duration
    times ``factor`` and at least ``min_excess`` seconds beyond that p90, once at least
    ``min_finished`` tasks of its category have finished (so the p90 means something);
    at most ``max_copies`` copies per task at a time."""

    name = "idle-tail"

    def __init__(
        self,
        min_finished: int = 5,
        factor: float = 1.5,
        min_excess: float = 1.0,
        max_copies: int = 1,
    ) -> None:
        for what, value in (("min_finished", min_finished), ("max_copies", max_copies)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
        if not factor >= 1.0:  # also refuses NaN
            raise ValueError(f"factor must be a number >= 1, got {factor!r}")
        if not min_excess >= 0.0:
            raise ValueError(f"min_excess must be >= 0 seconds, got {min_excess!r}")
        self.min_finished = min_finished
        self.factor = float(factor)
        self.min_excess = float(min_excess)
        self.max_copies = max_copies

    def copy(self, task: TaskView, running_for: float, idle: int) -> bool:
        stats = task.stats
        if stats is None or stats.count < max(1, self.min_finished):  # 0: as 1, a p90 needs one
            return False
        p90 = stats.p90_duration
        return running_for > max(p90 * self.factor, p90 + self.min_excess)


@REGISTRY.register("speculation", "off")
class NoSpeculation:
    """No speculative copies."""

    name = "off"
    max_copies = 0  # never asked

    def copy(self, task: TaskView, running_for: float, idle: int) -> bool:
        return False
