"""Scaling policies: how many blocks of workers each pool should have.

The autoscaler core (``actors/autoscaler_state.py``) asks ``desired(pool)`` after every
event it handles and checks the answer; how blocks are started, drained, replaced and
counted against the replacement budget stays in the core.
"""

from __future__ import annotations

import math

from policies.base import REGISTRY, PoolView

__all__ = ["FixedTarget", "QueueProportional"]


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
