"""The memory governor's pure core, driven by events with an injected clock."""

from __future__ import annotations

import pytest

from actors.memory import (
    Defer,
    Finished,
    Kill,
    MemoryConfig,
    MemoryGovernor,
    Ready,
    Run,
    Sampled,
    Spill,
    Started,
    Throttled,
    Tick,
)

LIMIT = 1000


def gov(**kw: float) -> MemoryGovernor:
    return MemoryGovernor(MemoryConfig(limit=LIMIT, **kw))  # type: ignore[arg-type]


def test_below_the_throttle_everything_runs() -> None:
    g = gov()
    assert g.handle(Sampled(0.0, 100)) == []
    assert g.handle(Ready(0.0, "load-1", producer=True)) == [Run("load-1")]
    assert g.handle(Ready(0.0, "sum-1", producer=False)) == [Run("sum-1")]


def test_past_the_throttle_producers_wait_a_growing_bit_and_consumers_run() -> None:
    g = gov(throttle=0.6, first_delay=0.1, growth=2.0, max_delay=0.3)
    assert g.handle(Sampled(1.0, 650)) == [Throttled(True, 650)]
    assert g.handle(Ready(1.0, "load-1", producer=True)) == [Defer("load-1", 1.1)]
    assert g.handle(Ready(1.0, "sum-1", producer=False)) == [Run("sum-1")]
    # Not yet due: nothing happens.
    assert g.handle(Tick(1.05)) == []
    # Due, memory still high: deferred again, twice as long, then capped.
    assert g.handle(Tick(1.1)) == [Defer("load-1", pytest.approx(1.3))]
    assert g.handle(Tick(1.3)) == [Defer("load-1", pytest.approx(1.6))]
    assert g.handle(Tick(1.6)) == [Defer("load-1", pytest.approx(1.9))]


def test_memory_falling_resumes_every_deferred_producer_at_once() -> None:
    g = gov(first_delay=0.5)
    g.handle(Sampled(0.0, 700))
    assert g.handle(Ready(0.0, "a", True), Ready(0.1, "b", True)) == [
        Defer("a", 0.5),
        Defer("b", pytest.approx(0.6)),
    ]
    # Long before the timers: memory is back under the fence.
    assert g.handle(Sampled(0.2, 300)) == [Throttled(False, 300), Run("a"), Run("b")]
    assert g.deferred == {}
    assert g.handle(Tick(0.5)) == []  # the stale timers do nothing


def test_throttle_state_is_reported_once_per_change() -> None:
    g = gov()
    assert g.handle(Sampled(0.0, 650)) == [Throttled(True, 650)]
    assert g.handle(Sampled(0.1, 660)) == []
    assert g.handle(Sampled(0.2, 100)) == [Throttled(False, 100)]
    assert g.handle(Sampled(0.3, 120)) == []


def test_past_the_spill_fence_ask_to_spill_down_to_the_throttle() -> None:
    g = gov(throttle=0.6, spill=0.7)
    assert g.handle(Sampled(0.0, 750)) == [Throttled(True, 750), Spill(150)]
    assert g.handle(Sampled(0.1, 720)) == [Spill(120)]


def test_past_the_terminate_fence_the_task_that_grew_most_is_killed_once() -> None:
    g = gov(terminate=0.95)
    g.handle(Started(0.0, "small", 100), Started(0.0, "hog", 200), Started(0.0, "other", 900))
    cmds = g.handle(Sampled(1.0, 960))
    assert cmds == [Throttled(True, 960), Spill(360), Kill("small", 960, LIMIT)]
    # "small" grew 860 since it started (the most); asked once, then the next worst.
    cmds = g.handle(Sampled(1.1, 970))
    assert Kill("hog", 970, LIMIT) in cmds and Kill("small", 970, LIMIT) not in cmds
    g.handle(Finished(1.2, "small"), Finished(1.2, "hog"))
    assert g.running == {"other": 900}


def test_nothing_to_kill_when_nothing_runs() -> None:
    g = gov()
    assert g.handle(Sampled(0.0, 990)) == [Throttled(True, 990), Spill(390)]


def test_a_finished_task_forgets_its_deferral_count() -> None:
    g = gov(first_delay=0.1)
    g.handle(Sampled(0.0, 700), Ready(0.0, "a", True), Tick(0.1))
    assert g.deferrals["a"] == 2
    g.handle(Finished(0.5, "a"))
    assert "a" not in g.deferrals


@pytest.mark.parametrize(
    "kw",
    [
        {"throttle": 0.8, "spill": 0.7},
        {"spill": 0.95, "terminate": 0.95},
        {"terminate": 1.5},
        {"throttle": 0.0},
        {"first_delay": 0.0},
        {"growth": 0.5},
        {"max_delay": 0.01, "first_delay": 0.1},
    ],
)
def test_bad_configuration_is_refused_with_a_clear_error(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        MemoryConfig(limit=LIMIT, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        MemoryConfig(limit=0)


def test_unknown_events_are_refused() -> None:
    with pytest.raises(TypeError, match="cannot handle"):
        gov().handle(object())  # type: ignore[arg-type]
