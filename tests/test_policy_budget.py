"""The scheduler core's time budget for policy calls (docs/policies.md, "Be fast").

A pure core fed events, with a fake timer that the slow policies below advance: no
sleeps, no event loop. One kind's calls may take ``policy_budget`` seconds per turn (one
``handle``); past it the kind is not asked again in that turn, its built-in fallback
answers, a policy problem naming the policy is told once, and after
``policy_slow_turns`` slow turns the policy is replaced by the default one.
"""

from __future__ import annotations

from typing import Any

from actors.scheduler_events import GraphSubmitted, PolicyChanged, PolicyFailed, Tick
from policies.priority import GraphPriority
from runtime.messages import PolicyErrorCount
from tests.helpers import Factory, assigned, event, join, make_state, run, specs_for, submit

__all__ = ["make_state"]  # the autouse fixture, used by name


class FakeTimer:
    """Seconds that pass only when a slow policy says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowPriority:
    """The audit's ``slow`` priority policy: 0.5 s per call (on the fake timer)."""

    name = "slow"

    def __init__(self, timer: FakeTimer, seconds: float = 0.5) -> None:
        self.timer, self.seconds, self.calls = timer, seconds, 0

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        self.calls += 1
        self.timer.now += self.seconds
        return (task.order,)


class SlowPlacement:
    name = "slow-place"

    def __init__(self, timer: FakeTimer) -> None:
        self.timer, self.calls = timer, 0

    def choose(self, task: Any, candidates: Any, stats: Any) -> Any:
        self.calls += 1
        self.timer.now += 0.4
        return candidates[-1]


def failed(cmds: list[Any]) -> list[PolicyFailed]:
    return [c for c in cmds if type(c) is PolicyFailed]


def three_slow_calls(cmds: list[Any], policy: str, other: int, errors: int) -> PolicyFailed:
    """What a turn of three 0.5 s priority calls tells, the fallback answering ``other``
    calls: the policy problem of the turn's last command."""
    return PolicyFailed(
        cmds[-1].stimulus_id, "priority", policy,
        f"priority policy {policy!r} took 1.5 s over 3 call(s) in one turn of the "
        "scheduler (its budget: 1 s per turn); the scheduler is blocked meanwhile. "
        f"The built-in fallback answered the turn's other {other} call(s)",
        errors,
    )  # fmt: skip


def test_a_slow_priority_policy_is_asked_for_its_budget_then_the_fallback_answers(
    make_state: Factory,
) -> None:
    timer = FakeTimer()
    slow = SlowPriority(timer)
    s = make_state(timer=timer)
    keys = [f"t-{i}" for i in range(40)]
    submit(s, dict.fromkeys(keys, ()), keys)
    # The audit's repro: 40 ready tasks, then the swap re-ranks all of them at once.
    cmds = run(s, event(PolicyChanged, kind="priority", policy=slow))
    # 0.5 + 0.5 is the budget (1 s), the third call passes it: no more calls this turn.
    assert slow.calls == 3
    assert failed(cmds) == [three_slow_calls(cmds, "slow", 37, 1)]
    assert s.policy_errors == 1 and s.problems.by == {"priority": 1}
    assert s.problems.problem["priority"].startswith("priority policy 'slow' took 1.5 s")
    # The tasks the fallback ranked have the fallback's priority (graph order).
    ts = s.tasks["t-39"]
    assert ts.prio == GraphPriority().priority(ts, s.stats)
    # The next turn asks the policy afresh: within budget, no problem.
    more = ["u-0"]
    assert failed(submit(s, dict.fromkeys(more, ()), more)) == []
    assert slow.calls == 4 and s.policy_errors == 1


def test_repeated_slow_turns_are_told_once_then_the_default_policy_replaces_it(
    make_state: Factory,
) -> None:
    timer = FakeTimer()
    slow = SlowPriority(timer)
    s = make_state(timer=timer, priority=slow)
    told = []
    for turn in range(3):
        keys = [f"g{turn}-{i}" for i in range(10)]
        told.append(failed(submit(s, dict.fromkeys(keys, ()), keys)))
    assert slow.calls == 9  # 3 per turn
    assert [len(t) for t in told] == [1, 0, 1]  # the second slow turn is not told again
    last = told[2][0]
    assert last.replaced and last.errors == 3 and last.policy == "slow"
    assert last.problem.endswith(
        ". 3 slow turns within 300 s: replaced by the default priority policy 'graph'"
    )
    assert s.policies["priority"].name == "graph"
    # counted under the policy for /metrics: errors, and of them slow turns; the default
    # in force now at 0
    assert s.problems.counts([("priority", "graph")]) == (
        PolicyErrorCount("priority", "graph", 0, 0),
        PolicyErrorCount("priority", "slow", 3, 3),
    )
    assert [e[2] for e in s.story("-")] == [
        "priority:graph replaced (slow: 3 slow turns within 300 s)"
    ]
    keys = ["after"]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert slow.calls == 9  # never asked again


def test_slow_turns_further_apart_than_the_window_keep_the_policy(make_state: Factory) -> None:
    timer = FakeTimer()
    slow = SlowPriority(timer)
    s = make_state(timer=timer, priority=slow, policy_slow_window=0.5)
    for turn in range(4):  # (each event is one second later on the core's clock)
        keys = [f"g{turn}-{i}" for i in range(10)]
        submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policies["priority"] is slow and s.policy_errors == 4


def test_a_slow_placement_policy_places_the_rest_of_the_turn_by_the_fallback(
    make_state: Factory,
) -> None:
    timer = FakeTimer()
    slow = SlowPlacement(timer)
    s = make_state(timer=timer, placement=slow, saturation=1.0, unknown_long=False)
    for w in ("w1", "w2", "w3", "w4"):
        join(s, w)
    keys = [f"p-{i}" for i in range(4)]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    # 0.4 + 0.4 + 0.4 > 1 s: the fourth placement is the fallback's (the first candidate)
    assert slow.calls == 3
    got = assigned(cmds)
    assert sorted(got) == ["w1", "w2", "w3", "w4"]
    [told] = failed(cmds)
    assert told.kind == "placement" and told.policy == "slow-place"
    assert "took 1.2 s over 3 call(s)" in told.problem and "other 1 call(s)" in told.problem


def test_a_core_without_a_timer_never_finds_a_policy_slow(make_state: Factory) -> None:
    timer = FakeTimer()
    slow = SlowPriority(timer)
    s = make_state(priority=slow)  # no timer: simulations and tests keep their answers
    keys = [f"t-{i}" for i in range(40)]
    assert failed(submit(s, dict.fromkeys(keys, ()), keys)) == []
    assert slow.calls == 40 and s.policy_errors == 0


def test_a_single_call_that_blocks_for_seconds_replaces_the_policy_at_once(
    make_state: Factory,
) -> None:
    """A call cannot be cut short: one that takes half the peers' silence timeout is
    not waited for again (three such turns would lose every client and worker)."""
    timer = FakeTimer()
    slow = SlowPriority(timer, seconds=6.0)
    s = make_state(timer=timer, priority=slow)
    keys = [f"t-{i}" for i in range(5)]
    [told] = failed(submit(s, dict.fromkeys(keys, ()), keys))
    assert slow.calls == 1 and told.replaced
    assert told.problem == (
        "priority policy 'slow' took 6.0 s over 1 call(s) in one turn of the scheduler "
        "(its budget: 1 s per turn); the scheduler is blocked meanwhile. The built-in "
        "fallback answered the turn's other 4 call(s). 5 s or more in one turn: replaced "
        "by the default priority policy 'graph'"
    )
    assert s.policies["priority"].name == "graph"


class PausedGraph(GraphPriority):
    """Corral's own ``graph`` priority, each call of it caught by a pause of the
    machine (a garbage collection, SIGSTOP, a starved CPU: 2 s on the fake timer)."""

    def __init__(self, timer: FakeTimer) -> None:
        super().__init__()
        self.timer, self.calls = timer, 0

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        self.calls += 1
        self.timer.now += 2.0
        return super().priority(task, stats)


def test_a_built_in_policy_is_not_timed_so_a_pause_does_not_replace_it(
    make_state: Factory,
) -> None:
    """A review: a pause of the manager during a built-in policy's call counted as the
    policy's (one of 5 s replaced it by the default, the default by itself, with an
    ERROR and every queued task ranked again). Corral's own policies are not timed."""
    timer = FakeTimer()
    paused = PausedGraph(timer)
    assert PausedGraph.__module__ != "policies.priority"  # a test class: timed...
    PausedGraph.__module__ = "policies.priority"  # ...unless it is one of Corral's
    try:
        s = make_state(timer=timer)
        keys = [f"t-{i}" for i in range(10)]
        submit(s, dict.fromkeys(keys, ()), keys)
        cmds = run(s, event(PolicyChanged, kind="priority", policy=paused))
        assert paused.calls == 10  # every call asked: no fallback
        assert failed(cmds) == [] and s.policies["priority"] is paused
        assert s.policy_errors == 0
    finally:
        PausedGraph.__module__ = __name__


def test_the_budget_settings_are_checked() -> None:
    """A review: a NaN budget made every turn a slow one (replaced after 3), 0 replaced
    on the first call; nothing refused either."""
    import math

    import pytest

    from actors.scheduler_records import SchedulerConfig

    for field, bad in [("policy_budget", math.nan), ("policy_budget", 0), ("policy_too_slow", -1),
                       ("policy_slow_window", "5"), ("policy_slow_turns", 0),
                       ("policy_slow_turns", 2.5), ("policy_budget", True)]:  # fmt: skip
        with pytest.raises(ValueError, match=field):
            SchedulerConfig(**{field: bad})
    SchedulerConfig(policy_budget=math.inf, policy_slow_turns=1)  # inf: never over budget


def test_a_slow_policy_asked_once_per_turn_is_noticed_over_turns(make_state: Factory) -> None:
    """The sweep audit: a sweep submits one trial at a time, so a 0.9 s priority policy
    is asked once per turn, under the 1 s per-turn budget for ever, blocking the
    scheduler 0.9 s per task unnoticed. Its calls are now summed over turns too (over
    ``POLICY_SPREAD * policy_budget`` seconds): past the budget there, a slow spell,
    told and counted as a slow turn is, and three replace it by the default."""
    timer = FakeTimer()
    slow = SlowPriority(timer, 0.9)
    s = make_state(timer=timer, priority=slow)
    told = []
    for trial in range(6):  # one submit per turn, each one second later on the core's clock
        told.append(failed(submit(s, {f"trial-{trial}": ()}, [f"trial-{trial}"])))
    assert slow.calls == 6
    assert [len(t) for t in told] == [0, 1, 0, 0, 0, 1]  # told once, then at the replacement
    first = told[1][0]
    assert (first.kind, first.policy, first.errors, first.replaced) == (
        "priority",
        "slow",
        1,
        False,
    )
    assert first.problem == (
        "priority policy 'slow' took 1.8 s over 2 call(s) in 2 turns of the scheduler within "
        "1.0 s (its budget: 1 s per turn, and per 4 s over turns); the scheduler is blocked "
        "meanwhile"
    )
    last = told[5][0]
    assert last.replaced and last.errors == 3
    assert s.policies["priority"].name == "graph"
    submit(s, {"after": ()}, ["after"])
    assert slow.calls == 6  # never asked again


def test_a_policy_asked_now_and_then_is_not_slow(make_state: Factory) -> None:
    """0.9 s calls further apart than the span (4 s) are not summed together."""
    timer = FakeTimer()
    slow = SlowPriority(timer, 0.9)
    s = make_state(timer=timer, priority=slow)
    for trial in range(6):
        submit(s, {f"trial-{trial}": ()}, [f"trial-{trial}"])
        for _ in range(4):
            run(s, event(Tick))  # four seconds pass on the core's clock
    assert slow.calls == 6 and s.policy_errors == 0


def test_a_fast_policy_asked_often_is_never_a_slow_spell(make_state: Factory) -> None:
    """A priority policy of 0.9 ms per call (each call under ``POLICY_CALL_FLOOR``,
    1 ms; on a loaded machine a fast call takes longer in wall time), asked 500 times per
    turn: 0.45 s per turn, within the turn's budget. Before, its calls were summed over
    turns too, and the third turn within 4 s made it a slow spell (1.35 s), the fallback
    answering, and three such spells replaced it. A slow spell is made of calls of 1 ms
    or more only; the budget of one turn still counts every call."""
    timer = FakeTimer()
    fast = SlowPriority(timer, 0.0009)
    s = make_state(timer=timer, priority=fast)
    for turn in range(8):  # one second apart on the core's clock: 3.6 s of calls in 8 s
        keys = [f"g{turn}-{i}" for i in range(500)]
        assert failed(submit(s, dict.fromkeys(keys, ()), keys)) == []
    assert fast.calls == 8 * 500 and s.policy_errors == 0
    assert s.policies["priority"] is fast
    # One turn of 1200 such calls passes the turn's budget (1 s): a slow turn as before.
    keys = [f"big-{i}" for i in range(1200)]
    [told] = failed(submit(s, dict.fromkeys(keys, ()), keys))
    assert told.problem.startswith("priority policy 'slow' took 1.0 s over 1112 call(s) in one")


def test_a_policy_set_by_the_user_does_not_inherit_the_slow_turns_of_the_one_it_replaced(
    make_state: Factory,
) -> None:
    """Review 1207f F2: the slow turns of a policy were kept for its kind when the user
    set another, so after two slow turns of the old one the new one was replaced at its
    first, in the very turn of the swap (its re-ranking of the ready tasks), and the
    message blamed it for "3 slow turns". A swap now counts the new policy's turns afresh,
    as it does its errors and its calls over turns."""
    timer = FakeTimer()
    old = SlowPriority(timer)  # 0.5 s a call: three calls, a slow turn, each submit
    s = make_state(timer=timer, priority=old)
    for turn in range(2):  # two slow turns of the old policy
        keys = [f"g{turn}-{i}" for i in range(10)]
        submit(s, dict.fromkeys(keys, ()), keys)
    assert s.policies["priority"] is old and s.policy_errors == 2
    new = SlowPriority(timer)
    new.name = "new"
    # The swap re-ranks the 20 ready tasks: the new policy's first slow turn, told (its
    # problems are told afresh) and not replaced.
    cmds = run(s, event(PolicyChanged, kind="priority", policy=new, by="client-x"))
    # (errors: the kind's so far, the old policy's two and this one)
    assert failed(cmds) == [three_slow_calls(cmds, "new", 17, 3)]
    assert s.policies["priority"] is new
    # Its own third slow turn replaces it.
    keys = [f"g2-{i}" for i in range(10)]
    assert failed(submit(s, dict.fromkeys(keys, ()), keys)) == []  # its second: told already
    assert s.policies["priority"] is new
    keys = [f"g3-{i}" for i in range(10)]
    [last] = failed(submit(s, dict.fromkeys(keys, ()), keys))
    assert last.policy == "new" and last.replaced and last.errors == 5
    assert last.problem.endswith(
        ". 3 slow turns within 300 s: replaced by the default priority policy 'graph'"
    )
    assert s.policies["priority"].name == "graph"


def test_a_policy_set_in_a_turn_is_not_charged_for_its_predecessors_calls_in_it(
    make_state: Factory,
) -> None:
    """A swap handled in the same turn as events its predecessor was asked about: the
    turn's budget for the new policy starts afresh (before, the old policy's 0.8 s and the
    new one's 0.5 s made a slow turn of 1.3 s blamed on the new one)."""
    timer = FakeTimer()
    old = SlowPriority(timer, 0.8)
    s = make_state(timer=timer, priority=old)
    new = SlowPriority(timer, 0.5)
    new.name = "new"
    specs = specs_for(s, {"a": ()}, ["a"])
    cmds = run(
        s,
        event(GraphSubmitted, specs=specs, wanted=("a",)),  # the old policy: 0.8 s
        event(PolicyChanged, kind="priority", policy=new, by="client-x"),  # re-ranks: 0.5 s
    )
    assert (old.calls, new.calls) == (1, 1)
    assert failed(cmds) == [] and s.policy_errors == 0
    assert s.policies["priority"] is new


class StretchedPriority:
    """A cheap priority policy (20 µs a call) whose every 25th call takes 12 ms of wall
    time: the calls a thread switch interrupted, the scheduler waiting for the GIL behind
    task threads in the same process (review 1207f F1: 55-116 µs a call in wall time for
    20 µs of CPU in an embedded ``Cluster``, a few calls of several ms)."""

    name = "stretched"

    def __init__(self, timer: FakeTimer) -> None:
        self.timer, self.calls = timer, 0

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        self.calls += 1
        self.timer.now += 0.012 if self.calls % 25 == 0 else 0.00002
        return (task.order,)


def test_a_cheap_policy_asked_for_a_large_intake_is_not_a_slow_spell(
    make_state: Factory,
) -> None:
    """Review 1207f F1: a large ``map`` taken in by pieces, one turn each, asks the
    priority policy for each task; a few of its cheap calls, stretched past 1 ms by
    thread switches, added up over the turns to a slow spell (and three spells replaced
    the policy in the middle of the run). A turn whose calls average under
    ``POLICY_SPELL_MEAN`` (10 ms) is not part of a spell; one turn's budget still counts
    every call."""
    timer = FakeTimer()
    cheap = StretchedPriority(timer)
    s = make_state(timer=timer, priority=cheap)
    for piece in range(8):  # one second apart: 0.25 s of calls each, 1 ms or more 0.24 s
        keys = [f"p{piece}-{i}" for i in range(500)]
        assert failed(submit(s, dict.fromkeys(keys, ()), keys)) == []
    assert cheap.calls == 8 * 500 and s.policy_errors == 0
    assert s.policies["priority"] is cheap
    # The ranks are the policy's, none the fallback's.
    assert all(ts.prio == (ts.order,) for ts in s.tasks.values())


class NineMs:
    """A priority policy of 9 ms a call: under ``POLICY_SPELL_MEAN`` (10 ms)."""

    name = "nine-ms"

    def __init__(self, timer: FakeTimer) -> None:
        self.timer, self.calls = timer, 0

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        self.calls += 1
        self.timer.now += 0.009
        return (task.order,)


def test_a_policy_holding_most_of_each_turn_in_cheap_calls_is_a_slow_spell(
    make_state: Factory,
) -> None:
    """Review 1207g F3: a priority policy of 9 ms a call asked for 100 tasks a turn held
    the scheduler 0.9 s of each second, turn after turn, and, its calls averaging under
    ``POLICY_SPELL_MEAN``, was never a spell: never told, never replaced. Cheap calls are
    excused only while the turn's total stays under ``policy_budget / POLICY_SPREAD``."""
    timer = FakeTimer()
    pol = NineMs(timer)
    s = make_state(timer=timer, priority=pol)
    told = []
    for piece in range(7):  # 0.9 s of calls a turn, then 0.1 s of the rest of the turn
        keys = [f"p{piece}-{i}" for i in range(100)]
        told.append(failed(submit(s, dict.fromkeys(keys, ()), keys)))
        timer.now += 0.1
    assert [len(t) for t in told] == [0, 1, 0, 0, 0, 1, 0]  # told once, then replaced
    # The second turn: 28 calls (0.25 s) and the first turn's 0.9 s pass the budget over
    # turns, a spell; the fallback answers the other 72.
    spell = (
        "priority policy 'nine-ms' took 1.2 s over 128 call(s) in 2 turns of the scheduler "
        "within 1.0 s (its budget: 1 s per turn, and per 4 s over turns); the scheduler is "
        "blocked meanwhile. The built-in fallback answered the turn's other 72 call(s)"
    )
    first, last = told[1][0], told[5][0]
    assert (first.policy, first.problem, first.errors, first.replaced) == (
        "nine-ms",
        spell,
        1,
        False,
    )
    assert (last.problem, last.errors, last.replaced) == (
        spell + ". 3 slow turns within 300 s: replaced by the default priority policy 'graph'",
        3,
        True,
    )
    assert pol.calls == 3 * (100 + 28)  # never asked after the replacement
    assert s.policies["priority"].name == "graph"
