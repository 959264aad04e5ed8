"""The placement policy's data-locality hooks (``policies.DataLocality``) and the read-only
views policies get, against the scheduler's pure core: events in, exact commands out.

Policies propose, the core decides: a policy without the hooks places tasks without the
locality rules; a hook's answer out of bounds (or a hook that raises) is refused and
counted in ``policy_errors``; the views cannot change the core."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pytest

from actors.scheduler_events import PolicyChanged, WorkerDraining, WorkerMemory
from actors.scheduler_records import TaskStateView, WorkerStateView
from actors.scheduler_state import SchedulerState
from policies import (
    CategoryStats,
    CategoryStatsView,
    DataLocality,
    PlacementPolicy,
    TaskView,
    WorkerView,
)
from policies.memory import ProducersYield
from policies.placement import KeepsDataLocal, LeastLoadedPlacement, LocalityPlacement
from tests.helpers import (
    GB,
    MB,
    Factory,
    assigned,
    event,
    finish,
    finish_all,
    join,
    make_state,
    on,
    run,
    submit,
)

__all__ = ["make_state"]  # the fixture, used by name


def pairs(n: int) -> dict[str, list[str]]:
    """``x-{2i}`` and ``x-{2i+1}`` (roots) both feed ``add-i``."""
    table: dict[str, list[str]] = {f"x-{i}": [] for i in range(2 * n)}
    table.update({f"add-{i}": [f"x-{2 * i}", f"x-{2 * i + 1}"] for i in range(n)})
    return table


def errors(s: SchedulerState, key: str) -> list[str]:
    return [e[2] for e in s.story(key) if e[1] == "policy-error"]


class FirstCandidate:
    """Chooses the first candidate; no locality hooks: those rules are off."""

    name = "first"

    def choose(
        self, task: TaskView, candidates: Sequence[WorkerView], stats: Mapping[str, CategoryStats]
    ) -> WorkerView:
        return candidates[0]


class FirstCandidateKeepingLocality(KeepsDataLocal, FirstCandidate):
    """The same choice, with the default locality hooks kept."""


def busy_consumer(s: SchedulerState) -> None:
    """w1 (one slot) ran ``a`` (32 MB); ``b`` reads it, ``z`` outranks everything."""
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    submit(s, {"b": ["a"], "z": []}, ["b", "z"], attrs={"z": {"priority": 10}})


# ----------------------------------------------------------------------------- keep or drop


def test_the_default_locality_policy_keeps_its_hooks() -> None:
    policy = LocalityPlacement()
    assert isinstance(policy, PlacementPolicy) and isinstance(policy, DataLocality)
    assert not isinstance(LeastLoadedPlacement(), DataLocality)


def test_roots_feeding_one_consumer_pair_up_with_the_default_hooks(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0, placement=FirstCandidateKeepingLocality())
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, pairs(2), ["add-0", "add-1"])
    assert assigned(cmds) == {"w1": ["x-1", "x-0"], "w2": ["x-3", "x-2"]}


def test_a_policy_without_the_hooks_places_roots_without_pairing(make_state: Factory) -> None:
    s = make_state(saturation=1.0, placement=FirstCandidate())
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, pairs(2), ["add-0", "add-1"])
    assert assigned(cmds) == {"w1": ["x-1"], "w2": ["x-0"]}
    assert s.policy_errors == 0


def test_a_consumer_stays_with_its_data_only_with_the_hook(make_state: Factory) -> None:
    kept = make_state(saturation=1.0, placement=FirstCandidateKeepingLocality())
    busy_consumer(kept)
    # b's input is on w1: it runs there at once, past the slot; z waits.
    assert assigned(finish(kept, "w1", "a", nbytes=32 * MB)) == {"w1": ["b"]}
    assert kept.tasks["z"].state == "queued"

    dropped = make_state(saturation=1.0, placement=FirstCandidate())
    busy_consumer(dropped)
    # Without the hooks the freed slot goes by priority: z; b waits for a slot.
    assert assigned(finish(dropped, "w1", "a", nbytes=32 * MB)) == {"w1": ["z"]}
    assert dropped.tasks["b"].state == "queued"


def test_one_hook_set_to_none_drops_that_rule_alone(make_state: Factory) -> None:
    class NoPartner(FirstCandidateKeepingLocality):
        partner = None

    s = make_state(saturation=1.0, placement=NoPartner())
    join(s, "w1")
    join(s, "w2")
    assert assigned(submit(s, pairs(2), ["add-0", "add-1"])) == {"w1": ["x-1"], "w2": ["x-0"]}
    t = make_state(saturation=1.0, placement=NoPartner())
    busy_consumer(t)
    assert assigned(finish(t, "w1", "a", nbytes=32 * MB)) == {"w1": ["b"]}  # still stays


def test_swapping_the_placement_policy_at_runtime_swaps_its_hooks(make_state: Factory) -> None:
    s = make_state(saturation=1.0)  # locality: hooks on
    join(s, "w1")
    join(s, "w2")
    run(s, event(PolicyChanged, kind="placement", policy=FirstCandidate()))
    assert assigned(submit(s, pairs(2), ["add-0", "add-1"])) == {"w1": ["x-1"], "w2": ["x-0"]}


def test_a_queued_consumer_joins_a_busy_holder_only_with_the_hook(make_state: Factory) -> None:
    def setup(placement: Any) -> SchedulerState:
        s = make_state(unknown_long=False, saturation=1.0, placement=placement)
        join(s, "w1")
        submit(s, {"a": []}, ["a"])
        finish(s, "w1", "a", nbytes=32 * MB)
        submit(s, {"x": []}, ["x"])  # keeps w1's one slot busy
        return s

    kept = setup("locality")
    assert assigned(submit(kept, {"b": ["a"]}, ["b"])) == {"w1": ["b"]}
    dropped = setup("least-loaded")
    assert assigned(submit(dropped, {"b": ["a"]}, ["b"])) == {}  # waits for a slot
    assert dropped.tasks["b"].state == "queued"


class LeastLoadedKeepingData(KeepsDataLocal, LeastLoadedPlacement):
    """docs/policies.md's example: least-loaded, consumers stay with their data up to 4x
    the worker's slots, roots are not paired."""

    stay_factor = 4
    partner = None


def test_the_documented_example_keeps_some_rules_and_drops_one(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0, placement=LeastLoadedKeepingData())
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, pairs(2), ["add-0", "add-1"])
    assert sorted(len(keys) for keys in assigned(cmds).values()) == [1, 1]  # not paired
    t = make_state(unknown_long=False, saturation=1.0, placement=LeastLoadedKeepingData())
    join(t, "w1")  # one slot
    submit(t, {"r": []}, ["r"])
    consumers = [f"c-{i}" for i in range(6)]
    submit(t, {key: ["r"] for key in consumers}, consumers)
    join(t, "w2")  # idle
    # Four consumers stay with r's output on w1 (stay_factor 4, in priority order); of
    # the others, c-4 goes to idle w2 (least loaded), and c-5 waits for a free slot:
    # w1, the holder, is at four times its slots too.
    cmds = finish(t, "w1", "r", nbytes=100)
    assert assigned(cmds) == {"w1": ["c-0", "c-1", "c-2", "c-3"], "w2": ["c-4"]}
    assert t.tasks["c-5"].state == "queued"


# ----------------------------------------------------------------------------- the core checks


KEEP = object()  #: a hook answers as the default one does


class Proposing(KeepsDataLocal):
    """Locality hooks whose answers a test sets; records what it was asked."""

    name = "proposing"

    def __init__(self, *, partner: Any = KEEP, stays: Any = KEEP, holder: Any = KEEP) -> None:
        self.answers = {"partner": partner, "stays": stays, "holder": holder}
        self.asked: list[tuple[str, Any, tuple[str, ...]]] = []

    def choose(
        self, task: TaskView, candidates: Sequence[WorkerView], stats: Mapping[str, CategoryStats]
    ) -> WorkerView:
        return candidates[0]

    def _answer(self, hook: str, default: Any) -> Any:
        answer = self.answers[hook]
        if isinstance(answer, Exception):
            raise answer
        return default if answer is KEEP else answer

    def partner(self, task: TaskView, worker: WorkerView, next_root: TaskView) -> bool:
        self.asked.append(("partner", next_root.key, (worker.id,)))
        return self._answer("partner", super().partner(task, worker, next_root))  # type: ignore[no-any-return]

    def stays_with_data(self, task: TaskView, worker: WorkerView) -> bool:
        self.asked.append(("stays", task.key, (worker.id,)))
        return self._answer("stays", super().stays_with_data(task, worker))  # type: ignore[no-any-return]

    def data_holder(self, task: TaskView, holders: Sequence[WorkerView]) -> WorkerView | None:
        self.asked.append(("holder", task.key, tuple(w.id for w in holders)))
        return self._answer("holder", super().data_holder(task, holders))  # type: ignore[no-any-return]


def holder_case(s: SchedulerState) -> None:
    """``a`` (32 MB) is on w1, whose one slot ``x`` keeps busy; w2 is busy too."""
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a", nbytes=32 * MB)
    submit(s, {"x": []}, ["x"])
    join(s, "w2")
    submit(s, {"y": []}, ["y"])
    assert on(s, "w1") == {"x"} and on(s, "w2") == {"y"}


@pytest.mark.parametrize("answer", ["w2", "w9", 3, object()])
def test_a_holder_that_is_not_one_offered_is_refused_and_counted(
    make_state: Factory, answer: Any
) -> None:
    policy = Proposing(holder=answer)
    s = make_state(unknown_long=False, saturation=1.0, placement=policy)
    holder_case(s)
    cmds = submit(s, {"b": ["a"]}, ["b"])
    assert assigned(cmds) == {}  # no holder: b waits for a free slot
    assert s.tasks["b"].state == "queued"
    assert ("holder", "b", ("w1",)) in policy.asked  # only the worker with its input
    assert s.policy_errors >= 1
    assert all("not a holder" in e for e in errors(s, "b"))
    # Once a slot frees up, b is placed as usual.
    assert assigned(finish(s, "w2", "y")) == {"w2": ["b"]}


def test_a_holder_given_by_its_id_is_taken(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0, placement=Proposing(holder="w1"))
    holder_case(s)
    assert assigned(submit(s, {"b": ["a"]}, ["b"])) == {"w1": ["b"]}
    assert s.policy_errors == 0


def test_a_draining_holder_is_never_offered(make_state: Factory) -> None:
    policy = Proposing()
    s = make_state(saturation=1.0, placement=policy)
    holder_case(s)
    run(s, event(WorkerDraining, worker="w1"))
    assert assigned(submit(s, {"b": ["a"]}, ["b"])) == {}
    assert not [a for a in policy.asked if a[0] == "holder"]
    assert s.policy_errors == 0


def test_a_holder_too_small_for_the_inputs_is_never_offered(make_state: Factory) -> None:
    policy = Proposing(stays=True, holder="w1")
    s = make_state(saturation=1.0, placement=policy)
    join(s, "w1", memory=100 * MB)
    submit(s, {"a": [], "c": []}, ["a", "c"])
    while on(s, "w1"):
        finish(s, "w1", min(on(s, "w1")), nbytes=60 * MB)
    join(s, "w2", memory=GB)
    submit(s, {"y1": [], "y2": []}, ["y1", "y2"])
    (y,) = on(s, "w2")
    # d reads both (120 MB), all on busy w1; but w1 (100 MB) may not take it, whatever
    # the policy would say: it is not offered, and d waits for w2.
    assert assigned(submit(s, {"d": ["a", "c"]}, ["d"])) == {}
    assert not [a for a in policy.asked if a[1] == "d"]
    assert assigned(finish(s, "w2", y)) == {"w2": ["d"]}
    assert s.policy_errors == 0


@pytest.mark.parametrize("answer", [RuntimeError("stays bug"), "yes", 1])
def test_a_stay_answer_that_is_not_a_bool_or_raises_is_refused(
    make_state: Factory, answer: Any
) -> None:
    s = make_state(saturation=1.0, placement=Proposing(stays=answer, holder=None))
    busy_consumer(s)
    cmds = finish(s, "w1", "a", nbytes=32 * MB)
    assert assigned(cmds) == {"w1": ["z"]}  # as without the hook
    assert s.policy_errors == 1
    (problem,) = errors(s, "b")
    assert "stays_with_data" in problem


def test_a_stay_is_not_offered_on_a_draining_worker(make_state: Factory) -> None:
    policy = Proposing(stays=True)
    s = make_state(saturation=1.0, placement=policy)
    busy_consumer(s)
    join(s, "w2")  # z goes there
    run(s, event(WorkerDraining, worker="w1"))
    cmds = finish(s, "w1", "a", nbytes=32 * MB)
    assert not [a for a in policy.asked if a[0] == "stays"]
    assert "w1" not in assigned(cmds)


@pytest.mark.parametrize("answer", [RuntimeError("partner bug"), "yes"])
def test_a_partner_answer_that_is_not_a_bool_or_raises_is_refused(
    make_state: Factory, answer: Any
) -> None:
    s = make_state(unknown_long=False, saturation=1.0, placement=Proposing(partner=answer))
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, pairs(2), ["add-0", "add-1"])
    assert assigned(cmds) == {"w1": ["x-1"], "w2": ["x-0"]}  # no pairs
    assert s.policy_errors == 2
    assert "placement.partner" in errors(s, "x-3")[0]


# ----------------------------------------------------------------------------- read-only views


class Meddler(FirstCandidate):
    """Tries to change the core through what it is given."""

    name = "meddler"

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def choose(
        self, task: TaskView, candidates: Sequence[WorkerView], stats: Mapping[str, CategoryStats]
    ) -> WorkerView:
        self.seen.append((task, list(candidates)))
        task.state = "memory"  # type: ignore[misc]
        return candidates[0]


def test_policies_get_views_not_the_cores_objects(make_state: Factory) -> None:
    seen: list[Any] = []

    class Looking(FirstCandidate):
        def choose(
            self,
            task: TaskView,
            candidates: Sequence[WorkerView],
            stats: Mapping[str, CategoryStats],
        ) -> WorkerView:
            seen.append((task, tuple(candidates), task.dep_locations, task.dependents))
            return candidates[0]

    s = make_state(placement=Looking())
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    finish(s, "w1", "a", nbytes=10)
    (task_a, cands_a, deps_a, dependents_a), (task_b, _, deps_b, _) = seen
    assert type(task_a) is TaskStateView and type(cands_a[0]) is WorkerStateView
    assert task_a.key == "a" and task_a.category == "a" and deps_a == ()
    assert [d.key for d in dependents_a] == ["b"] and type(dependents_a[0]) is TaskStateView
    # a tuple, as the docs say of every collection a view returns (a user audit found a
    # one-shot generator: summed twice it gave 0 the second time, and was truthy with
    # no inputs)
    assert deps_b == ((frozenset({"w1"}), 10),) and not deps_a
    assert cands_a[0].id == "w1" and cands_a[0].slots == 2 and cands_a[0].limit == 500
    assert not cands_a[0].throttled
    # A view follows the task: b is now processing, and its view says nothing else.
    assert task_b.key == "b" and task_b.retries_left == 0


def test_views_cannot_be_changed(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    task = TaskStateView(s.tasks["a"])
    worker = s.workers["w1"].view
    for view, name in ((task, "key"), (task, "state"), (task, "producer"), (worker, "slots")):
        with pytest.raises(AttributeError):
            setattr(view, name, 1)
        with pytest.raises(AttributeError):
            delattr(view, name)
    with pytest.raises(AttributeError):
        worker.processing  # type: ignore[attr-defined]  # noqa: B018
    assert s.tasks["a"].state == "processing" and s.workers["w1"].slots == 2


def test_a_policy_that_writes_to_a_view_is_refused_and_the_core_unchanged(
    make_state: Factory,
) -> None:
    policy = Meddler()
    s = make_state(placement=policy)
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"a": []}, ["a"])  # validated by the helper: the core is consistent
    assert assigned(cmds) == {"w1": ["a"]}  # the fallback: the first candidate
    assert s.tasks["a"].state == "processing"
    assert s.policy_errors == 1
    assert "read-only" in errors(s, "a")[0]


def test_statistics_reach_policies_read_only(make_state: Factory) -> None:
    seen: list[Any] = []

    class Looking(FirstCandidate):
        def choose(
            self,
            task: TaskView,
            candidates: Sequence[WorkerView],
            stats: Mapping[str, CategoryStats],
        ) -> WorkerView:
            seen.append(stats)
            return candidates[0]

    class Producing(ProducersYield):
        def producer(self, category: str, stats: CategoryStats | None, root: bool) -> bool:
            seen.append(stats)
            return super().producer(category, stats, root)

    s = make_state(placement=Looking(), memory=Producing())
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a", nbytes=10, duration=2.0)
    submit(s, {"a2": []}, ["a2"])
    stats = seen[-1]
    assert isinstance(stats, MappingProxyType) and set(stats) == {"a"} and "a" in stats
    st = stats["a"]
    assert type(st) is CategoryStatsView and stats.get("nothing") is None
    assert (st.count, st.mean_duration, st.total_nbytes) == (1, 2.0, 10)
    with pytest.raises(AttributeError):
        st.count = 5
    with pytest.raises(TypeError):
        stats["b"] = CategoryStats()  # type: ignore[index]
    assert all(type(x) is CategoryStatsView for x in seen if x is not None and x is not stats)
    assert s.stats["a"].count == 1 and set(s.stats) == {"a"}


def test_a_statistics_view_has_every_attribute_of_the_statistics() -> None:
    names = {f.name for f in dataclasses.fields(CategoryStats)}
    names |= {n for n, v in vars(CategoryStats).items() if isinstance(v, property)}
    stats = CategoryStats(count=2, total_duration=3.0, total_nbytes=8, consumed_nbytes=2)
    stats.recent.extend((1.0, 2.0))
    view = CategoryStatsView(stats)

    def plain(value: Any) -> Any:  # the view hands out a tuple where stats keep a deque
        return tuple(value) if isinstance(value, deque) else value

    assert {n: getattr(view, n) for n in names} == {n: plain(getattr(stats, n)) for n in names}
    assert view.recent == (1.0, 2.0) and view.p90_duration == 2.0
    assert view.mean_duration == 1.5 and view.production_ratio == 4.0


# ----------------------------------------------------------------------------- memory.yields


class Recording(ProducersYield):
    def __init__(self) -> None:
        super().__init__()
        self.pressures: list[bool] = []

    def yields(self, pressure: bool) -> bool:
        self.pressures.append(pressure)
        return super().yields(pressure)


def test_yields_is_asked_with_the_real_pressure(make_state: Factory) -> None:
    policy = Recording()
    s = make_state(memory=policy)
    join(s, "w1")
    assert policy.pressures and not any(policy.pressures)
    policy.pressures.clear()
    ev = event(WorkerMemory, worker="w1", throttled=True, rss=GB, throttle_at=GB // 2, limit=2 * GB)
    run(s, ev)
    assert policy.pressures == [True]
    policy.pressures.clear()
    ev = event(WorkerMemory, worker="w1", throttled=False, rss=0, throttle_at=GB // 2, limit=2 * GB)
    run(s, ev)
    assert policy.pressures == [False]


def test_pairs_then_consumers_stay_where_both_inputs_are(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1")
    join(s, "w2")
    submit(s, pairs(2), ["add-0", "add-1"])
    cmds = finish_all(s, "w1", ["x-1", "x-0"], nbytes=32 * MB)
    assert assigned(cmds) == {"w1": ["add-0"]}
