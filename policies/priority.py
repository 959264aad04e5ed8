"""Priority policies: which ready task runs first (smallest tuple first)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from policies.base import REGISTRY, CategoryStats, TaskView

__all__ = ["ConsumersFirstPriority", "FairPriority", "GraphPriority", "LongFirstPriority"]


@REGISTRY.register("priority", "graph")
class GraphPriority:
    """Default. User priority first, then submissions in order (FIFO), then graph order
    (``dask.order``: finish branches before starting new ones). A task that reads
    outputs of an earlier submission comes with its latest such input's generation
    (the core's ``_continue_generations``): it continues that work."""

    name = "graph"

    def priority(self, task: TaskView, stats: Mapping[str, CategoryStats]) -> tuple[float, ...]:
        return (-task.user_priority, task.generation, task.order)


@REGISTRY.register("priority", "fair")
class FairPriority:
    """For a manager shared by several clients: user priority first, then clients in
    turn (:attr:`TaskView.turn`: each client's n-th task from when its work came), then
    submissions in order and graph order. A client submitting 10 tasks behind another's
    3000 waits for about 10 of them, not for all 3000; alone, a client runs as with
    ``graph``."""

    name = "fair"

    def __init__(self, shares: Mapping[str, float] | None = None) -> None:
        shares = dict(shares or {})
        for who, share in shares.items():
            number = isinstance(share, int | float) and not isinstance(share, bool)
            if not number or not math.isfinite(share) or not share > 0:
                raise ValueError(
                    f"shares maps client names to numbers > 0, got {who!r}: {share!r}: give "
                    "each named client its share of the turns against 1 for the others, "
                    "e.g. shares={'alice': 2}"
                )
        self.shares = {who: float(share) for who, share in shares.items()}

    def share(self, client: str) -> float:
        """The share of the turns of the client named ``client`` (1 unless named in
        ``shares``): each of its tasks takes ``1 / share`` of a turn, so a client of
        share 2 has two tasks sent for each one of a client of share 1."""
        return self.shares.get(client, 1.0)

    def priority(self, task: TaskView, stats: Mapping[str, CategoryStats]) -> tuple[float, ...]:
        return (-task.user_priority, task.turn, task.generation, task.order)


@REGISTRY.register("priority", "long-first")
class LongFirstPriority:
    """User priority, then categories with the longest mean duration seen so far, then
    graph order. Long tasks start early so they do not dominate the tail of a run."""

    name = "long-first"

    def priority(self, task: TaskView, stats: Mapping[str, CategoryStats]) -> tuple[float, ...]:
        st = stats.get(task.category)
        mean = st.mean_duration if st is not None else 0.0
        return (-task.user_priority, -mean, task.generation, task.order)


@REGISTRY.register("priority", "consumers-first")
class ConsumersFirstPriority:
    """User priority, then tasks that read stored outputs of other tasks before tasks
    that read none (roots), those reading the most bytes first, then submissions in
    order and graph order. Once its consumers have run, an intermediate output is
    dropped from its workers (memory and disk): consuming the largest ones first frees
    disks sooner, where starting more roots would fill them (DaskVine's choice)."""

    name = "consumers-first"

    def priority(self, task: TaskView, stats: Mapping[str, CategoryStats]) -> tuple[float, ...]:
        n_inputs = 0
        nbytes = 0
        for _, size in task.dep_locations:
            n_inputs += 1
            nbytes += size
        return (
            -task.user_priority,
            float(not n_inputs),
            -float(nbytes),
            task.generation,
            task.order,
        )
