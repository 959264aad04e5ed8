"""Memory policies: which categories are memory *producers*, and whether they yield.

A memory policy answers two questions for the scheduler:

- ``producer(category, stats, root)``: does a task of this category add memory (its
  outputs are much larger than its inputs, like a loader)? Producers are the tasks a
  throttled worker defers and the scheduler withholds beyond each worker's saturation.
- ``yields(pressure)``: when some worker is over its throttle fence (``pressure``), do
  ready consumers go before ready producers, whatever their graph order?

The scheduler asks ``producer`` again after each batch of results of a category; when
the answer flips, that category's ready tasks are re-queued.
"""

from __future__ import annotations

from policies.base import REGISTRY, CategoryStats

__all__ = ["BlindMemory", "ProducersYield"]


@REGISTRY.register("memory", "producers-yield")
class ProducersYield:
    """Default. A category is a producer once its tasks have, on average, made at least
    ``min_nbytes`` of output and ``ratio`` times more bytes than they read. Before any
    has finished, tasks with no dependencies (roots: loaders, random arrays) count as
    producers and the others do not. Under memory pressure, producers yield to the rest.
    """

    name = "producers-yield"

    def __init__(self, ratio: float = 2.0, min_nbytes: int = 1 << 20) -> None:
        if ratio <= 0:
            raise ValueError(f"ratio must be > 0, got {ratio}")
        if min_nbytes < 0:
            raise ValueError(f"min_nbytes must be >= 0, got {min_nbytes}")
        self.ratio = float(ratio)
        self.min_nbytes = int(min_nbytes)

    def producer(self, category: str, stats: CategoryStats | None, root: bool) -> bool:
        if stats is None or stats.count == 0:
            return root
        return stats.mean_nbytes >= self.min_nbytes and stats.production_ratio >= self.ratio

    def yields(self, pressure: bool) -> bool:
        return pressure


@REGISTRY.register("memory", "blind")
class BlindMemory:
    """No task is a producer: graph order only, no withholding of roots beyond the
    backlog rule, workers never defer anything. Memory fences still spill and kill."""

    name = "blind"

    def producer(self, category: str, stats: CategoryStats | None, root: bool) -> bool:
        return False

    def yields(self, pressure: bool) -> bool:
        return False
