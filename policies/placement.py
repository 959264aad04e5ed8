"""Placement policies: which worker (of those with a free slot) runs a task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.base import REGISTRY, CategoryStats, TaskView, WorkerView

__all__ = ["LeastLoadedPlacement", "LocalityPlacement", "RoundRobinPlacement"]


@REGISTRY.register("placement", "locality")
class LocalityPlacement:
    """Default. Weighs data locality against load.

    Cost of a worker = seconds to fetch the inputs it lacks (``bandwidth`` bytes/s)
    + its load (tasks running per core) times the category's mean duration so far
    (``min_duration`` seconds before anything is known). The cheapest worker wins; ties
    go to the first candidate.
    """

    name = "locality"
    #: the scheduler core may, besides: run a consumer whose inputs are all on one
    #: worker there at once (past its slots), and send the root next in line that feeds
    #: the same consumer as a root just placed to the same worker (see memory.md)
    keeps_consumers_with_data = True

    def __init__(self, bandwidth: float = 500e6, min_duration: float = 0.001) -> None:
        if bandwidth <= 0:
            raise ValueError("bandwidth must be positive")
        self.bandwidth = float(bandwidth)
        self.min_duration = float(min_duration)

    def choose(
        self,
        task: TaskView,
        candidates: Sequence[WorkerView],
        stats: Mapping[str, CategoryStats],
    ) -> WorkerView:
        if len(candidates) == 1:
            return candidates[0]
        deps = list(task.dep_locations)
        st = stats.get(task.category)
        duration = max(st.mean_duration if st else 0.0, self.min_duration)
        best = candidates[0]
        best_cost = float("inf")
        for w in candidates:
            missing = sum(nbytes for holders, nbytes in deps if w.id not in holders)
            cost = missing / self.bandwidth + duration * w.n_processing / max(w.cores, 1)
            if cost < best_cost:
                best, best_cost = w, cost
        return best


@REGISTRY.register("placement", "least-loaded")
class LeastLoadedPlacement:
    """The worker with the fewest running tasks per core; ignores where data lives."""

    name = "least-loaded"

    def choose(
        self,
        task: TaskView,
        candidates: Sequence[WorkerView],
        stats: Mapping[str, CategoryStats],
    ) -> WorkerView:
        return min(candidates, key=lambda w: w.n_processing / max(w.cores, 1))


@REGISTRY.register("placement", "round-robin")
class RoundRobinPlacement:
    """Cycles through workers by id, skipping the ones without a free slot."""

    name = "round-robin"

    def __init__(self) -> None:
        self._last = ""

    def choose(
        self,
        task: TaskView,
        candidates: Sequence[WorkerView],
        stats: Mapping[str, CategoryStats],
    ) -> WorkerView:
        ordered = sorted(candidates, key=lambda w: w.id)
        for w in ordered:
            if w.id > self._last:
                self._last = w.id
                return w
        self._last = ordered[0].id
        return ordered[0]
