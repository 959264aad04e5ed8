"""The memory governor's pure core, driven by events with an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

from actors.memory import (
    Defer,
    Finished,
    Kill,
    MemoryConfig,
    MemoryConfigError,
    MemoryGovernor,
    Ready,
    Run,
    Sampled,
    Spill,
    Throttled,
    Tick,
)

LIMIT = 1000


def gov(**kw: Any) -> MemoryGovernor:
    return MemoryGovernor(MemoryConfig(LIMIT, **kw))


def test_below_the_fences_everything_runs() -> None:
    g = gov()
    assert g.handle(Sampled(0.0, 100)) == []
    assert g.handle(Ready(0.0, "load-1", producer=True)) == [Run("load-1")]
    assert g.handle(Ready(0.0, "sum-1", producer=False)) == [Run("sum-1")]
    assert g.admits(True) and g.admits(False)


def test_past_the_throttle_producers_wait_a_growing_bit_and_consumers_run() -> None:
    g = gov(spill=None, throttle=0.6, first_delay=0.1, growth=2.0, max_delay=0.3)
    assert g.handle(Sampled(1.0, 650)) == [Throttled(True, 650)]
    assert not g.admits(True) and g.admits(False)
    assert g.handle(Ready(1.0, "load-1", producer=True)) == [Defer("load-1", 1.1)]
    assert g.handle(Ready(1.0, "sum-1", producer=False)) == [Run("sum-1")]
    # Not yet due: nothing happens.
    assert g.handle(Tick(1.05)) == []
    # Due, memory still high: deferred again, twice as long, then capped.
    assert g.handle(Tick(1.1)) == [Defer("load-1", pytest.approx(1.3))]
    assert g.handle(Tick(1.3)) == [Defer("load-1", pytest.approx(1.6))]
    assert g.handle(Tick(1.6)) == [Defer("load-1", pytest.approx(1.9))]


def test_memory_falling_resumes_every_deferred_producer_at_once() -> None:
    g = gov(spill=None, first_delay=0.5)
    g.handle(Sampled(0.0, 700))
    assert g.handle(Ready(0.0, "a", True), Ready(0.1, "b", True)) == [
        Defer("a", 0.5),
        Defer("b", pytest.approx(0.6)),
    ]
    # Long before the timers: memory is back under the fence.
    assert g.handle(Sampled(0.2, 300)) == [Throttled(False, 300), Run("a"), Run("b")]
    assert g.deferred == {} and g.deferrals == {}
    assert g.handle(Tick(0.5)) == []  # the stale timers do nothing
    # Throttled again later: deferrals start short again.
    g.handle(Sampled(1.0, 710))
    assert g.handle(Ready(1.0, "c", True)) == [Defer("c", 1.5)]


def test_a_consumer_arriving_while_throttled_runs_at_once() -> None:
    g = gov(spill=None)
    g.handle(Sampled(0.0, 800), Ready(0.0, "load", True))
    assert g.handle(Ready(0.01, "reduce", False)) == [Run("reduce")]
    assert "load" in g.deferred


def test_throttle_state_is_reported_once_per_change() -> None:
    g = gov(spill=None)
    assert g.handle(Sampled(0.0, 750)) == [Throttled(True, 750)]
    assert g.handle(Sampled(0.1, 760)) == []
    assert g.handle(Sampled(0.2, 100)) == [Throttled(False, 100)]
    assert g.handle(Sampled(0.3, 120)) == []


def test_spilling_starts_below_the_throttle_and_goes_to_ninety_percent_of_its_fence() -> None:
    g = gov(spill=0.6, throttle=0.7)
    assert g.handle(Sampled(0.0, 650)) == [Spill(650 - 540)]
    assert not g.throttled  # spilling alone: producers still run
    assert g.handle(Sampled(0.1, 720)) == [Spill(720 - 540), Throttled(True, 720)]
    assert g.handle(Sampled(0.2, 500)) == [Throttled(False, 500)]


def test_spill_off_never_asks_to_spill() -> None:
    g = gov(spill=None, terminate=None)
    assert g.handle(Sampled(0.0, 999)) == [Throttled(True, 999)]


def test_past_the_terminate_fence_the_largest_task_process_is_killed_once() -> None:
    g = gov(spill=None, terminate=0.95)
    tasks = (("small", 100), ("hog", 700), ("other", 150))
    assert g.handle(Sampled(1.0, 960, tasks)) == [Throttled(True, 960), Kill("hog", 960, LIMIT)]
    # "hog" was asked for once; still over the fence: the next largest goes.
    assert g.handle(Sampled(1.1, 970, tasks)) == [Kill("other", 970, LIMIT)]
    g.handle(Finished(1.2, "hog"))
    assert g.killed == {"other"}


def test_ties_kill_the_newest_task() -> None:
    g = gov(spill=None)
    cmds = g.handle(Sampled(0.0, 990, (("old", 400), ("new", 400))))
    assert Kill("new", 990, LIMIT) in cmds


def test_nothing_to_kill_when_no_task_can_be_killed() -> None:
    # Thread execution: the shell reports no killable tasks; the fence cannot act.
    g = gov()
    assert g.handle(Sampled(0.0, 990)) == [Spill(990 - 540), Throttled(True, 990)]


def test_a_finished_task_forgets_its_deferral() -> None:
    g = gov(spill=None, first_delay=0.1)
    g.handle(Sampled(0.0, 700), Ready(0.0, "a", True), Tick(0.1))
    assert g.deferrals["a"] == 2
    g.handle(Finished(0.15, "a"))  # e.g. cancelled while deferred
    assert "a" not in g.deferrals and "a" not in g.deferred
    assert g.handle(Tick(1.0)) == []


@pytest.mark.parametrize(
    "kw",
    [
        {"throttle": 0.8, "terminate": 0.8},
        {"terminate": 1.5},
        {"throttle": 0.0},
        {"spill": 0.0},
        {"spill": 1.2},
        {"spill": 0.9, "throttle": 0.7},  # spilling comes before throttling
        {"throttle": 0.5},  # under the default spill fence (0.6)
        {"first_delay": 0.0},
        {"growth": 0.5},
        {"max_delay": 0.01, "first_delay": 0.1},
        {"interval": 0},
        {"execution": "fiber"},
        {"disk_limit": -1},
    ],
)
def test_bad_configuration_is_refused_with_a_clear_error(kw: dict[str, Any]) -> None:
    with pytest.raises(MemoryConfigError, match=r"docs/memory\.md"):
        MemoryConfig(LIMIT, **kw)


def test_a_value_of_the_wrong_type_is_refused_naming_it() -> None:
    """``terminate="off"`` (the command line's word) raised "'<' not supported"."""
    with pytest.raises(MemoryConfigError, match=r"terminate must be a number, or None to turn"):
        MemoryConfig.of(LIMIT, {"terminate": "off"})
    with pytest.raises(MemoryConfigError, match=r"throttle must be a number; got '0.7' \(str\)"):
        MemoryConfig.of(LIMIT, {"throttle": "0.7"})
    with pytest.raises(MemoryConfigError, match="interval must be a number; got True"):
        MemoryConfig.of(LIMIT, {"interval": True})
    with pytest.raises(MemoryConfigError, match="spill must be a number"):
        MemoryConfig.of(LIMIT, {"spill": float("nan")})


def test_zero_limit_and_unknown_options_are_refused() -> None:
    with pytest.raises(MemoryConfigError, match="positive"):
        MemoryConfig(0)
    with pytest.raises(MemoryConfigError, match=r"unknown option.*thrtle.*known: spill"):
        MemoryConfig.of(LIMIT, {"thrtle": 0.5})
    cfg = MemoryConfig.of(LIMIT, {"throttle": 0.65, "execution": "process"})
    assert MemoryConfig.of(LIMIT, cfg.options()) == cfg


def test_unknown_events_are_refused() -> None:
    with pytest.raises(TypeError, match="cannot handle"):
        gov().handle(object())  # type: ignore[arg-type]
