"""Tests of the scheduler's pure core (actors/scheduler_state.py): swapping policies and
policies that misbehave (raise, answer garbage), which fall back and are counted.

No event loop, no threads, no clock: every test feeds events to
``SchedulerState.handle`` and checks the exact commands it returns. The autouse fixture
``make_state`` (tests/helpers.py) builds the states and runs ``validate()`` (the
invariant check) on every one of them when the test ends; the ``run`` helper also
validates after each step. Graphs come from :func:`tests.helpers.graph`, a
``{key: [dependency keys]}`` table turned into specs by ``build_specs`` as the client does.
"""

from __future__ import annotations

from typing import Any

import dask.order
import pytest

from actors import scheduler_state
from actors.scheduler_events import KeyErred, PolicyChanged
from policies import REGISTRY, PolicyParamsError, RetryDecision
from policies.priority import GraphPriority
from runtime.errors import (
    UnknownPolicyError,
)
from runtime.graph import build_specs
from tests.helpers import (
    GB,
    Factory,
    assigned,
    by_order,
    chain,
    event,
    files_released,
    finish,
    graph,
    join,
    leave,
    make_state,
    of,
    on,
    release,
    run,
    states,
    submit,
    worker_of,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


# ----------------------------------------------------------------------------- policies


def test_placement_policy_change_moves_where_later_tasks_go(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=2.0)  # default placement: locality
    for w in ("w1", "w2", "w3"):
        join(s, w, cores=1, memory=8 * GB)  # room for the 4 GB input (memory admission)
    submit(s, {"big": []}, ["big"])
    wbig = worker_of(s, "big")
    finish(s, wbig, "big", nbytes=4 * GB)
    keys = ["use-0", "use-1"]
    cmds = submit(s, {k: ["big"] for k in keys}, keys)
    # Locality: both readers go where the 4 GB input already is.
    assert assigned(cmds) == {wbig: by_order(s, keys)}

    run(
        s,
        event(PolicyChanged, kind="placement", policy=REGISTRY.create("placement", "round-robin")),
    )
    assert s.policies["placement"].name == "round-robin"
    keys = ["more-0", "more-1", "more-2", "more-3"]
    cmds = submit(s, {k: ["big"] for k in keys}, keys)
    got = assigned(cmds)
    # Round-robin ignores the data: the free slots of every worker are used in turn.
    others = sorted({"w1", "w2", "w3"} - {wbig})
    assert sorted(got) == others and all(len(v) == 2 for v in got.values())
    assert any(e[2] == "placement:round-robin" for e in s.story("-"))


def test_least_loaded_placement_spreads_work(make_state: Factory) -> None:
    s = make_state(saturation=2.0, placement="least-loaded")
    join(s, "w1", cores=1)
    join(s, "w2", cores=1)
    keys = ["x-0", "x-1"]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    assert sorted(len(v) for v in assigned(cmds).values()) == [1, 1]


class Reversed:
    """A priority policy for tests: graph order backwards."""

    name = "reversed"

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        return (-task.order,)


def test_a_priority_policy_swap_reorders_the_queue(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    keys = [f"x-{i}" for i in range(5)]
    submit(s, dict.fromkeys(keys, ()), keys)
    run(s, event(PolicyChanged, kind="priority", policy=Reversed()))
    join(s, "w1")
    seen = list(on(s, "w1"))
    while len(seen) < len(keys):
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    assert seen == by_order(s, keys)[::-1]


def test_long_first_priority_starts_long_categories_first(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    submit(s, {"quick-99": [], "slow-99": []}, ["quick-99", "slow-99"])
    while s.count("processing"):
        (key,) = on(s, "w1")
        finish(s, "w1", key, duration=60.0 if key.startswith("slow") else 1.0)
    submit(s, {"block": []}, ["block"])  # keeps w1 busy while the queue fills
    quick = [f"quick-{i}" for i in range(3)]
    slow = [f"slow-{i}" for i in range(3)]
    submit(s, dict.fromkeys(quick, ()), quick)  # earlier submission: first by default
    submit(s, dict.fromkeys(slow, ()), slow)
    policy = REGISTRY.create("priority", "long-first")
    run(s, event(PolicyChanged, kind="priority", policy=policy))
    seen = ["block"]
    while len(seen) < 7:
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    assert seen[1:] == by_order(s, slow) + by_order(s, quick)


class Raising:
    name = "raising"

    def choose(self, task: Any, candidates: Any, stats: Any) -> Any:
        raise RuntimeError("placement bug")

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        raise RuntimeError("priority bug")

    def decide(self, task: Any, outcome: str, cause: str | None) -> RetryDecision:
        raise RuntimeError("retry bug")


class Elsewhere:
    """A placement policy that answers with a worker that is not a candidate."""

    name = "elsewhere"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def choose(self, task: Any, candidates: Any, stats: Any) -> Any:
        return self.answer


def test_a_placement_policy_that_raises_falls_back_and_is_counted(make_state: Factory) -> None:
    s = make_state(placement=Raising())
    join(s, "w1")
    join(s, "w2")
    cmds = submit(s, {"a": []}, ["a"])
    assert assigned(cmds) == {"w1": ["a"]}  # the first candidate
    assert s.policy_errors == 1
    assert any(e[1] == "policy-error" and "placement bug" in e[2] for e in s.story("a"))


@pytest.mark.parametrize("answer", ["nobody", "busy", 42, None])
def test_a_placement_policy_choosing_a_non_candidate_falls_back(
    make_state: Factory, answer: Any
) -> None:
    s = make_state(saturation=1.0)
    join(s, "busy")
    submit(s, {"x": []}, ["x"])
    assert on(s, "busy") == {"x"}
    join(s, "w1")
    pol = Elsewhere(s.workers["busy"] if answer == "busy" else answer)
    run(s, event(PolicyChanged, kind="placement", policy=pol))
    cmds = submit(s, {"a": []}, ["a"])
    assert assigned(cmds) == {"w1": ["a"]}
    assert s.policy_errors == 1
    assert any("not a candidate" in e[2] for e in s.story("a"))


def test_a_priority_policy_that_raises_falls_back_to_graph_order(make_state: Factory) -> None:
    s = make_state(saturation=1.0, priority=Raising())
    keys = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policy_errors == 3
    join(s, "w1")
    seen = list(on(s, "w1"))
    while len(seen) < 3:
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    assert seen == by_order(s, keys)
    ts = s.tasks["x-0"]
    assert ts.prio == GraphPriority().priority(ts, s.stats)


class NaNNights:
    """The audit's priority of a night (``-night``), NaN for every third (a ``0/0``)."""

    name = "nan-nights"

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        return (float("nan") if task.order % 3 == 0 else -task.order, task.order)


def test_a_priority_with_nan_is_refused_and_the_others_keep_their_order(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, priority=NaNNights())
    keys = [f"n-{i}" for i in range(12)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policy_errors == 4  # n-0, n-3, n-6, n-9
    story = [e[2] for e in s.story("n-3") if e[1] == "policy-error"]
    assert story == ["priority returned NaN in (nan, 3), not a tuple of numbers"]
    join(s, "w1")
    seen = list(on(s, "w1"))
    while len(seen) < 12:
        seen.extend(assigned(finish(s, "w1", seen[-1]))["w1"])
    # The policy's answers in order (-11 first), then the refused ones by the fallback
    # (graph order), which no NaN scrambled.
    assert [s.tasks[k].spec.order for k in seen] == [11, 10, 8, 7, 5, 4, 2, 1, 0, 3, 6, 9]


class Garbage:
    """Policies answering with values of the wrong type."""

    name = "garbage"

    def priority(self, task: Any, stats: Any) -> tuple[Any, ...]:
        return ("high", task.order)

    def decide(self, task: Any, outcome: str, cause: str | None) -> Any:
        return True


def test_a_priority_policy_answering_non_numbers_falls_back(make_state: Factory) -> None:
    s = make_state(saturation=1.0, priority=Garbage())
    keys = ["x-0", "x-1"]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policy_errors == 2
    assert any("not a tuple of numbers" in e[2] for e in s.story("x-0"))
    assert [s.tasks[k].prio for k in keys] == [
        GraphPriority().priority(s.tasks[k], s.stats) for k in keys
    ]


def test_a_retry_policy_answering_garbage_falls_back(make_state: Factory) -> None:
    s = make_state(retry=Garbage())
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    boom = ValueError()
    (ke,) = of(finish(s, "w1", "a", "error", error=boom), KeyErred)  # default: no budget
    assert ke.error is boom and s.policy_errors == 1
    assert any("not a RetryDecision" in e[2] for e in s.story("a"))


def test_a_retry_policy_that_raises_falls_back_to_the_default(make_state: Factory) -> None:
    s = make_state(unknown_long=False, retry=Raising())
    join(s, "w1")
    submit(s, {"a": [], "b": []}, ["a", "b"], retries=1)
    cmds = finish(s, "w1", "a", "error", error=ValueError())
    assert s.policy_errors == 1 and s.tasks["a"].retries_left == 0  # default: charged
    assert "a" in {k for ks in assigned(cmds).values() for k in ks}
    cmds = leave(s, "w1")
    assert s.policy_errors == 3  # a and b, lost with w1: free retries by default
    assert states(s) == {"a": "queued", "b": "queued"}


def test_unknown_policy_names_raise_unknown_policy_error() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        REGISTRY.create("placement", "telepathy")
    assert info.value.kind == "placement" and info.value.name == "telepathy"
    assert "locality" in info.value.available and "round-robin" in info.value.available
    assert "telepathy" in str(info.value)
    with pytest.raises(UnknownPolicyError):
        REGISTRY.create("mood", "happy")
    with pytest.raises(KeyError):  # it is a KeyError too
        REGISTRY.create("retry", "forever")
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("retry", "default", {"max_lost": -1})
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("placement", "locality", {"colour": "red"})
    assert REGISTRY.names("priority") == ["consumers-first", "fair", "graph", "long-first"]


def test_a_policy_change_of_an_unknown_kind_is_refused(make_state: Factory) -> None:
    s = make_state()
    with pytest.raises(KeyError):
        s.handle(event(PolicyChanged, kind="mood", policy=Reversed()))


# ----------------------------------------------------------------------------- graph order


def _sent(make_state: Factory, table: dict[str, list[str]], wanted: list[str]) -> list[str]:
    """What is sent to one single-slot worker, in order, of ``table`` submitted as one
    graph asking for ``wanted`` (after ``base``, a result held), the tasks finishing
    one at a time in the order sent."""
    s = make_state(saturation=1.0)
    join(s, "w1")
    submit(s, {"base": []}, ["base"])
    finish(s, "w1", "base")
    sent = assigned(submit(s, table, wanted)).get("w1", [])
    for key in sent:
        sent.extend(assigned(finish(s, "w1", key)).get("w1", []))
    assert sorted(sent) == sorted(table)
    return sent


def test_independent_tasks_of_one_graph_run_in_the_order_asked_for(make_state: Factory) -> None:
    # One map or a batch of submits: tasks sharing nothing, asked for in this order (the
    # culling walk used to hand them to the ordering backwards).
    keys = [f"job-{i}" for i in range(12)]
    assert _sent(make_state, {k: [] for k in keys}, keys) == keys
    # With a dependency each on an earlier result (a map over futures): dask.order
    # used to order them by key.
    keys = ["job-b", "job-a", "job-d", "job-c"]
    assert _sent(make_state, {k: ["base"] for k in keys}, keys) == keys


def test_independent_branches_run_one_after_another_in_the_order_asked_for(
    make_state: Factory,
) -> None:
    # dask.compute(*[fin(load(i)) for i in ...]): each branch finished before the next
    # starts, the branches in the order of their requested keys.
    table: dict[str, list[str]] = {}
    for i in "badc":
        table[f"load-{i}"] = []
        table[f"fin-{i}"] = [f"load-{i}"]
    wanted = [f"fin-{i}" for i in "badc"]
    expected = [k for i in "badc" for k in (f"load-{i}", f"fin-{i}")]
    assert _sent(make_state, table, wanted) == expected


def test_one_connected_graph_keeps_dask_order(make_state: Factory) -> None:
    table = {**chain("a", 3), **chain("b", 3), "sum": ["a-2", "b-2"]}
    specs = build_specs(graph(table), ["sum"])
    expected = dask.order.order(graph(table))
    assert {k: s.order for k, s in specs.items()} == expected


# ----------------------------------------------------------------------------- categories


def test_failure_counts_of_forgotten_categories_are_forgotten_with_them(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``failures`` (failed tries per category, outcome and cause) grew with every new
    category that failed, for ever. It is kept per category with the category's
    statistics (``MAX_CATEGORIES``, least recently used forgotten first): a category
    forgotten takes its counts along; the metrics' counters keep counting."""
    monkeypatch.setattr(scheduler_state, "MAX_CATEGORIES", 4, raising=False)
    s = make_state()
    join(s, "w1", cores=2)
    for i in range(12):  # more failing categories than the cap, each with no task left
        key = f"bad{i}-0"
        submit(s, {key: []}, [key])
        finish(s, "w1", key, "error", error=ValueError(f"boom {i}"))
        assert s.tasks[key].state == "erred"
        release(s, key)
    assert not s.tasks and len(s.failures) <= 4, s.failures
    assert set(s.failures) <= set(s.stats) and "bad11" in s.failures
    assert s.failures["bad11"] == {("error", "ValueError"): 1}
    assert "bad0" not in s.failures and s.categories_forgotten >= 8
    assert sum(s.metric_failures.values()) == 12  # every failed try, still counted
    s.validate()


def test_the_file_output_categories_of_forgotten_categories_are_forgotten_with_them(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file_categories`` (whose outputs disk placement expects on disk) grew with every
    category that ever wrote a file output. It goes with the category's statistics past
    ``MAX_CATEGORIES``, and is learnt again if the category comes back."""
    monkeypatch.setattr(scheduler_state, "MAX_CATEGORIES", 4, raising=False)
    s = make_state()
    join(s, "w1", cores=2)
    for i in range(12):
        key = f"write{i}-0"
        submit(s, {key: []}, [key])
        finish(s, "w1", key, file=True)
        release(s, key)
        files_released(s, key)
    assert len(s.file_categories) <= 4 and s.file_categories <= set(s.stats)
    assert "write11" in s.file_categories and "write0" not in s.file_categories
    s.validate()


def test_past_the_cap_the_categories_used_least_recently_without_tasks_are_forgotten(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long-lived manager sees new categories run after run; their statistics were
    # kept for ever (5,260 then 10,265 categories; RSS 74 MiB -> 650 MiB, never back).
    monkeypatch.setattr(scheduler_state, "MAX_CATEGORIES", 4, raising=False)
    s = make_state()
    join(s, "w1", cores=2)
    submit(s, {"keep-0": []}, ["keep-0"])  # finished, and its output still wanted
    finish(s, "w1", "keep-0")
    for i in range(10):
        for key in (f"run{i}-0", f"often-{i}"):  # "often" finishes in every run
            submit(s, {key: []}, [key])
            finish(s, "w1", key)
            release(s, key)
            files_released(s, key)  # the registry dropped its output: forgotten
    assert set(s.tasks) == {"keep-0"}
    # The cap holds; "keep" (a task is known) and "often" (finished recently) stay.
    assert list(s.stats) == ["keep", "run8", "run9", "often"]
    assert s.categories_forgotten == 8 and s.stats["often"].count == 10
    for gone in (f"run{i}" for i in range(8)):
        assert gone not in s.classes and gone not in s.pool_categories["default"]
    # The metrics' counters, made for scrapes, keep counting every finish.
    assert sum(m.finished for m in s.metric_totals.values()) == 21
    submit(s, {"run0-1": []}, ["run0-1"])  # a forgotten category comes back: learnt anew
    finish(s, "w1", "run0-1")
    assert s.stats["run0"].count == 1 and len(s.stats) == 4
    # A graph of more categories than the cap: kept while their tasks are known, then
    # forgotten down to the cap as they go.
    wide = {f"wide{i}-0": [] for i in range(6)}
    submit(s, wide, list(wide))
    while on(s, "w1"):
        for key in sorted(on(s, "w1")):
            finish(s, "w1", key)
    assert list(s.stats) == ["keep", "run0", *(f"wide{i}" for i in range(6))]  # 8 > 4
    release(s, *wide)
    files_released(s, *wide)
    assert len(s.stats) == 4 and {"keep", "run0"} <= set(s.stats)
