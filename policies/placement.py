"""Placement policies: which worker (of those with a free slot) runs a task.

:class:`KeepsDataLocal` holds the default hooks of
:class:`~policies.base.DataLocality` (consumers stay with their data); a placement
policy that inherits it keeps those rules, one that does not has them off.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from policies.base import REGISTRY, CategoryStats, TaskView, WorkerView

__all__ = ["KeepsDataLocal", "LeastLoadedPlacement", "LocalityPlacement", "RoundRobinPlacement"]


def downstream(task: TaskView, depth: int = 2, cap: int = 64) -> set[Hashable]:
    """Keys of the tasks up to ``depth`` steps downstream of ``task``; none if there are
    more than ``cap`` (a root feeding that much is no one consumer's partner, and the
    answer must not depend on set order)."""
    seen: set[Hashable] = set()
    frontier = [task]
    for _ in range(depth):
        nxt = []
        for t in frontier:
            for d in t.dependents:
                if d.key not in seen:
                    seen.add(d.key)
                    nxt.append(d)
        if len(seen) > cap:
            return set()
        frontier = nxt
    return seen


class KeepsDataLocal:
    """The default :class:`~policies.base.DataLocality` hooks: consumers stay with
    their data (see docs/memory.md). Inherit it to keep them; override one to change
    that rule alone."""

    #: a ready consumer whose inputs are all on a worker stays there up to this many
    #: times the worker's slots (the core caps it at the worker's ``limit``)
    stay_factor = 2

    def partner(self, task: TaskView, worker: WorkerView, next_root: TaskView) -> bool:
        """The root next in line often feeds the same consumer as ``task`` (``x[i, j]``
        and ``x[j, i]`` of ``x + x.T``; ``a[i]`` and ``b[i]`` of ``a + b``): if it does
        (within two steps downstream), it goes with ``task``, so the consumer finds
        both inputs there and nothing moves."""
        return not downstream(task).isdisjoint(downstream(next_root))

    def stays_with_data(self, task: TaskView, worker: WorkerView) -> bool:
        """It frees memory and moves nothing, where waiting for a slot would send it
        (and its inputs) elsewhere: up to ``stay_factor`` times the worker's slots."""
        return worker.n_processing < self.stay_factor * worker.slots

    def data_holder(self, task: TaskView, holders: Sequence[WorkerView]) -> WorkerView | None:
        """The first holder by id: it only becomes a candidate, and ``choose`` weighs
        its load against moving the inputs (tasks queued on a worker take no memory
        until they run; their inputs are there already)."""
        return holders[0]


@REGISTRY.register("placement", "locality")
class LocalityPlacement(KeepsDataLocal):
    """Default. Weighs data locality against load, and keeps consumers with their data
    (the :class:`KeepsDataLocal` hooks).

    Cost of a worker = seconds to fetch the inputs it lacks (``bandwidth`` bytes/s)
    + its load (tasks running per core) times the category's mean duration so far
    (``min_duration`` seconds before anything is known). The cheapest worker wins; ties
    go to the first candidate.
    """

    name = "locality"

    def __init__(self, bandwidth: float = 500e6, min_duration: float = 0.001) -> None:
        if bandwidth <= 0:
            raise ValueError("bandwidth must be positive")
        if not min_duration >= 0:
            raise ValueError(f"min_duration must be >= 0 seconds, got {min_duration!r}")
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
        deps = task.dep_locations
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
