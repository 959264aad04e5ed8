"""Replication policies: how many temporary replicas a finished task's output gets.

A replica is a copy of an output on another worker, made as soon as the output exists
and dropped with it. When the worker holding the output is lost, a replica serves the
output and nothing is computed again. Copies cost transfer time and memory on the
receiving worker, so they pay off for outputs that are long to make again: the outputs
of long tasks, or of tasks whose inputs are gone and would have to be made again too.

The scheduler asks ``replicas(task, inputs, workers)`` when a task finishes ok; see
:class:`policies.base.ReplicationPolicy`. The answer is a proposal: the core bounds it
(at most ``workers - 1``; only workers with room; never a draining one).
"""

from __future__ import annotations

from policies.base import REGISTRY, TaskView

__all__ = ["FixedReplicas", "NoReplicas", "RecomputeCost"]


def _count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    return value


@REGISTRY.register("replication", "recompute-cost")
class RecomputeCost:
    """Default. ``replicas`` replicas for an output whose estimated cost to make again
    (its category's mean duration so far, plus the estimated cost of remaking its inputs
    that are not kept) is at least ``threshold`` seconds, when there are at least two
    workers; none otherwise."""

    name = "recompute-cost"

    def __init__(self, threshold: float = 30.0, replicas: int = 1) -> None:
        if not threshold >= 0:  # also refuses NaN
            raise ValueError(f"threshold must be >= 0 seconds, got {threshold!r}")
        self.threshold = float(threshold)
        self.count = _count(replicas, "replicas")
        self.min_cost = self.threshold if self.count else float("inf")

    def replicas(self, task: TaskView, inputs: float, workers: int) -> int:
        if workers < 2:
            return 0
        stats = task.stats
        mean = stats.mean_duration if stats is not None else 0.0
        return self.count if mean + inputs >= self.threshold else 0


@REGISTRY.register("replication", "fixed")
class FixedReplicas:
    """``replicas`` replicas of every output, however cheap (TaskVine's
    ``temp_replica_count``)."""

    name = "fixed"

    def __init__(self, replicas: int = 1) -> None:
        self.count = _count(replicas, "replicas")

    def replicas(self, task: TaskView, inputs: float, workers: int) -> int:
        return self.count


@REGISTRY.register("replication", "none")
class NoReplicas:
    """No replicas: a lost output is computed again from its lineage."""

    name = "none"
    min_cost = float("inf")  # never asked

    def replicas(self, task: TaskView, inputs: float, workers: int) -> int:
        return 0
