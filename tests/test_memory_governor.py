"""The memory governor's pure core, driven by events with an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

from actors.memory import (
    OUTPUT_WINDOW,
    SPILL_GRACE,
    TRIM_EVERY,
    Alone,
    Defer,
    Finished,
    Floor,
    Kill,
    MemoryConfig,
    MemoryConfigError,
    MemoryGovernor,
    Ready,
    Run,
    Sampled,
    Spared,
    Spill,
    Throttled,
    Tick,
    Trim,
)

LIMIT = 1000


def gov(**kw: Any) -> MemoryGovernor:
    return MemoryGovernor(MemoryConfig(LIMIT, **kw))


def test_below_the_fences_everything_runs() -> None:
    g = gov()
    assert g.handle(Sampled(0.0, 100)) == []
    assert g.handle(Ready(0.0, "load-1", producer=True)) == [Run("load-1")]
    assert g.handle(Ready(0.0, "sum-1", producer=False)) == [Run("sum-1")]
    assert not g.throttled and g.producing == {"load-1": 0}  # its output: not known yet


def test_past_the_throttle_producers_wait_a_growing_bit_and_consumers_run() -> None:
    g = gov(spill=None, throttle=0.6, first_delay=0.1, growth=2.0, max_delay=0.3)
    assert g.handle(Sampled(1.0, 650)) == [Throttled(True, 650)]
    assert g.throttled
    assert g.handle(Ready(1.0, "load-1", producer=True)) == [Defer("load-1", 1.1)]
    assert g.handle(Ready(1.0, "sum-1", producer=False)) == [Run("sum-1")]
    # Not yet due: nothing happens.
    assert g.handle(Tick(1.05)) == []
    # Due, memory still high: deferred again, twice as long, then capped.
    assert g.handle(Tick(1.1)) == [Defer("load-1", pytest.approx(1.3))]
    assert g.handle(Tick(1.3)) == [Defer("load-1", pytest.approx(1.6))]
    assert g.handle(Tick(1.6)) == [Defer("load-1", pytest.approx(1.9))]


def test_memory_falling_resumes_every_deferred_producer_of_unknown_size_at_once() -> None:
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


def test_a_throttled_worker_resumes_only_under_the_resume_mark() -> None:
    """One sample just under the throttle fence released every deferred producer (a
    user audit: 'throttled' and 'unthrottled' alternated 5 times in 0.3 s, RSS 293,
    273, 298 MB... about a 294 MB fence, and the worker went past its limit). A
    throttled worker now resumes only under the resume mark, ``hysteresis`` (0.1) of
    the limit under the fence: 600 of 1000 here."""
    g = gov(spill=None, first_delay=0.5)
    g.handle(Sampled(0.0, 710))
    assert g.handle(Ready(0.0, "a", True)) == [Defer("a", 0.5)]
    for t, rss in ((0.1, 690), (0.2, 650), (0.3, 600), (0.4, 705)):
        assert g.handle(Sampled(t, rss)) == [], rss  # under the fence: still throttled
    assert g.throttled and "a" in g.deferred
    assert g.handle(Sampled(0.5, 599)) == [Throttled(False, 599), Run("a")]
    assert g.config.resume_at == 600


def test_the_resume_mark_is_never_under_the_spill_fence() -> None:
    """Spilling acts from the spill fence down: a resume mark under it could leave a
    throttled worker stuck between the two with outputs it could move to disk."""
    assert MemoryConfig(LIMIT, spill=0.6, throttle=0.7, hysteresis=0.3).resume_at == 600
    assert MemoryConfig(LIMIT, spill=None, throttle=0.7, hysteresis=0.3).resume_at == 400
    assert MemoryConfig(LIMIT, spill=0.7, throttle=0.7).resume_at == 700
    assert MemoryConfig(LIMIT, spill=0.4, throttle=0.5, hysteresis=0.0).resume_at == 500


def learnt(g: MemoryGovernor, category: str, nbytes: int) -> None:
    """``g`` ran one producer of ``category`` whose output was ``nbytes``."""
    assert g.handle(Ready(0.0, f"{category}-0", True, category)) == [Run(f"{category}-0")]
    g.handle(Finished(0.0, f"{category}-0", nbytes))


def test_released_producers_stay_under_the_fence_by_their_expected_output() -> None:
    """Under the resume mark, deferred producers run oldest first only while the RSS
    plus the expected outputs of those running and its own stays under the throttle
    fence: released together, they do not take memory past it."""
    g = gov(spill=None, first_delay=0.5)
    learnt(g, "load", 100)  # a load makes 100 bytes here
    assert g.outputs == {"load": 100} and not g.producing
    assert g.handle(Sampled(1.0, 710)) == [Throttled(True, 710)]
    deferred = g.handle(*(Ready(1.0, k, True, "load") for k in "bcd"))
    assert deferred == [Defer(k, 1.5) for k in "bcd"]
    # 450 + 100 + 100 < 700, a third would reach 750: b and c run, d waits (throttled).
    assert g.handle(Sampled(1.1, 450)) == [Run("b"), Run("c")]
    assert g.producing == {"b": 100, "c": 100} and list(g.deferred) == ["d"]
    assert g.throttled
    g.handle(Finished(1.2, "b", 100), Finished(1.2, "c", 100))
    assert g.handle(Sampled(1.3, 650)) == []  # above the resume mark: nothing more
    assert g.handle(Sampled(1.4, 590)) == [Throttled(False, 590), Run("d")]


def test_a_producer_whose_output_would_cross_the_fence_waits_for_those_running() -> None:
    """Not throttled: a producer whose expected output would take memory past the fence
    with those running waits (without throttling) for them to end; once they ended, a
    sample under the fence runs it if it fits."""
    g = gov(spill=None)
    learnt(g, "load", 200)
    g.handle(Sampled(1.0, 100))
    assert g.handle(*(Ready(1.0, k, True, "load") for k in "abc")) == [
        Run("a"),
        Run("b"),
        Defer("c", pytest.approx(1.05)),  # 100 + 3 x 200 = 700: at the fence
    ]
    assert not g.throttled
    g.handle(Finished(1.1, "a", 200))
    assert g.handle(Sampled(1.1, 290)) == [Run("c")]  # 290 + 200 (b) + 200 < 700
    assert not g.throttled


def test_a_worker_running_no_producer_starts_one_that_fits_under_the_terminate_fence() -> None:
    """A producer larger than the room under the throttle fence still runs, alone,
    while its expected output fits under the terminate fence (the limit with it off);
    one that fits nowhere waits and the worker throttles (the scheduler's watchdog
    fails the run if nothing frees memory)."""
    g = gov(spill=None)
    learnt(g, "big", 500)
    g.handle(Sampled(1.0, 400))
    assert g.handle(Ready(1.0, "b1", True, "big")) == [Run("b1")]  # 900 < 950
    assert g.handle(Ready(1.0, "b2", True, "big")) == [Defer("b2", pytest.approx(1.05))]
    assert not g.throttled  # b1 runs: b2 waits for it
    g.handle(Finished(1.2, "b1", 500))
    assert g.handle(Sampled(1.2, 460)) == [Throttled(True, 460)]  # 960: not even alone
    assert g.handle(Sampled(1.3, 440)) == [Throttled(False, 440), Run("b2")]  # 940
    g = gov(spill=None, terminate=None)
    learnt(g, "big", 500)
    g.handle(Sampled(1.0, 499))
    assert g.handle(Ready(1.0, "b", True, "big")) == [Run("b")]  # 999 < the limit


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


# Spilling by the outputs' bytes (managed memory): LIMIT 1000, spill fence 600, target
# 540. The groupby benchmark's shape (benchmarks/groupby_memory.py): a worker's RSS is
# mostly not outputs (interpreter, pandas, memory the allocator keeps), past the target
# by itself, and one fresh output of a few percent whose consumer comes within a moment.


def test_a_spill_asks_for_no_more_than_the_outputs_in_memory() -> None:
    g = gov(spill=0.6, throttle=0.7)
    # 650 of RSS, 200 of it outputs: the rest (450) is under the target, so the outputs
    # are what is over: the excess is spilled, as ever.
    assert g.handle(Sampled(0.0, 650, stored=200)) == [Spill(650 - 540)]
    # 650 with 30 of outputs: writing all 30 is all spilling can do (the old code asked
    # for 110, which the store cannot move: it moved every output).
    assert g.handle(Sampled(0.1, 650, stored=30)) == [Spill(30)]
    # Nothing in memory: nothing to move (the shell only hands freed heap back).
    assert g.handle(Sampled(0.2, 650, stored=0)) == [Spill(0)]
    # Not known (stored None): all of the excess counts as outputs, as before.
    assert g.handle(Sampled(0.3, 650)) == [Spill(650 - 540)]


def test_an_output_just_made_stays_while_what_is_over_the_fence_is_not_outputs() -> None:
    g = gov(spill=0.6, throttle=0.7)
    g.handle(Finished(0.0, "old", 40))
    g.handle(Finished(SPILL_GRACE, "part-1", 24))
    # 660 of RSS, 64 of outputs: 596 is not outputs, past the target by itself. The
    # output made just now stays (its consumer would read it straight back); the one
    # made SPILL_GRACE ago goes.
    assert g.handle(Sampled(SPILL_GRACE + 0.05, 660, stored=64)) == [
        Spill(64, frozenset({"part-1"}))
    ]
    # Past its grace, it goes too, with nothing kept.
    assert g.handle(Sampled(2 * SPILL_GRACE, 660, stored=24)) == [Spill(24)]
    assert g.fresh == {}


def test_fresh_outputs_go_when_outputs_are_what_is_over_the_fence() -> None:
    g = gov(spill=0.6, throttle=0.7)
    g.handle(Finished(0.0, "big", 200))
    # 650 with 200 of outputs: without them the worker is at 450, under the target, so
    # spilling brings it back under its fence: the fresh output is not kept.
    assert g.handle(Sampled(0.05, 650, stored=200)) == [Spill(650 - 540)]


def test_fresh_outputs_go_at_the_terminate_fence() -> None:
    g = gov(spill=0.6, throttle=0.7, terminate=0.95)
    g.handle(Finished(0.0, "part-1", 24))
    assert g.handle(Sampled(0.05, 949, stored=24)) == [
        Spill(24, frozenset({"part-1"})),
        Throttled(True, 949),
    ]
    # At the terminate fence every byte counts: nothing is kept.
    assert g.handle(Sampled(0.1, 950, stored=24)) == [Spill(24)]


def test_a_failed_task_or_a_file_output_is_not_fresh() -> None:
    g = gov()
    g.handle(Finished(0.0, "failed", 0))
    assert g.fresh == {}
    assert g.handle(Sampled(0.05, 660, stored=24)) == [Spill(24)]


def test_spill_off_never_asks_to_spill() -> None:
    g = gov(spill=None, terminate=None)
    assert g.handle(Sampled(0.0, 999)) == [Throttled(True, 999)]


def test_past_the_terminate_fence_the_largest_task_process_is_killed_once() -> None:
    g = gov(spill=None, terminate=0.95)
    tasks = (("small", 100), ("hog", 700), ("other", 150))
    killed = [Throttled(True, 960), Kill("hog", 960, LIMIT, 700)]  # (its own RSS: 700)
    assert g.handle(Sampled(1.0, 960, tasks)) == killed
    # "hog" was asked for once; still over the fence: the next largest goes.
    assert g.handle(Sampled(1.1, 970, tasks)) == [Kill("other", 970, LIMIT, 150)]
    g.handle(Finished(1.2, "hog"))
    assert g.killed == {"other"}


def test_ties_kill_the_newest_task() -> None:
    g = gov(spill=None)
    cmds = g.handle(Sampled(0.0, 990, (("old", 400), ("new", 400))))
    assert Kill("new", 990, LIMIT, 400) in cmds


def test_past_the_terminate_fence_the_task_whose_process_grew_most_is_killed() -> None:
    """Killing frees what a task took: the process that grew since its task began, not
    the largest one (a task process holds its libraries whatever it runs)."""
    g = gov(spill=None)
    tasks, began = (("big", 700), ("grower", 400)), (("big", 690), ("grower", 100))
    cmds = g.handle(Sampled(1.0, 960, tasks, began=began))
    assert cmds == [Throttled(True, 960), Kill("grower", 960, LIMIT, 400)]


def test_past_the_terminate_fence_no_task_is_killed_when_none_grew() -> None:
    """A user audit's 500 MiB process workers killed a dask ``barrier`` task, which
    holds no data, because its process was the largest when the worker process's own
    memory took the worker past the fence: the kill freed nothing of that and failed a
    try. A task process that grew less than the margin (50 here) is spared, and the
    governor says so (the worker logs it once per climb)."""
    g = gov(spill=None)
    assert g.margin == 50
    sample = Sampled(1.0, 960, (("barrier", 300),), began=(("barrier", 251),))
    assert g.handle(sample) == [Throttled(True, 960), Spared(960, LIMIT, 49)]
    assert g.killed == set()
    # It grows by the margin: it is the cause now.
    sample = Sampled(1.1, 960, (("barrier", 301),), began=(("barrier", 251),))
    assert g.handle(sample) == [Kill("barrier", 960, LIMIT, 301)]


def test_a_task_with_no_rss_at_its_start_counts_whole() -> None:
    """What the shell did not measure (a task process it could not read) counts all of
    its RSS as grown, so the fence acts as it did before."""
    g = gov(spill=None)
    sample = Sampled(1.0, 960, (("a", 300), ("b", 200)), began=(("a", 290),))
    assert g.handle(sample) == [Throttled(True, 960), Kill("b", 960, LIMIT, 200)]


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
        {"hysteresis": -0.1},
        {"hysteresis": 0.7},  # as much as the throttle fence
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


# ----------------------------------------------------------------------------- trim


def test_idle_over_the_resume_mark_asks_for_one_trim_and_the_next_sample_decides() -> None:
    g = gov()  # spill and resume at 600, throttle at 700
    # Idle (no task, no output in memory) over the resume mark: nothing to spill, so
    # give memory back, once; the next sample is what is left.
    assert g.handle(Sampled(0.0, 650, idle=True)) == [Trim(), Spill(650 - 540)]
    assert g.handle(Sampled(0.05, 640, idle=True)) == [Floor(640, 690, 740), Spill(640 - 540)]
    assert g.handle(Sampled(0.1, 700, idle=True)) == [Spill(700 - 540)]  # not again...
    assert g.handle(Sampled(TRIM_EVERY, 700, idle=True)) == [Trim(), Spill(700 - 540)]  # ...soon


def test_no_trim_while_tasks_run_or_under_the_resume_mark() -> None:
    g = gov()
    assert g.handle(Sampled(0.0, 650)) == [Spill(650 - 540)]  # not idle: spilling acts
    assert g.handle(Sampled(1.0, 590, idle=True)) == []  # under the mark: nothing stuck


# ----------------------------------------------------------------------------- the floor


def test_an_idle_floor_past_the_resume_mark_unthrottles_the_worker_and_is_said_once() -> None:
    g = gov(first_delay=0.5)  # resume at 600, throttle at 700; margin max(50, 20) = 50
    g.handle(Sampled(0.0, 720))  # a run took it past the throttle fence
    assert g.throttled
    assert g.handle(Ready(0.1, "load", True)) == [Defer("load", 0.6)]
    # Idle, everything spilled: a trim first; what is left is not outputs (the floor).
    assert g.handle(Sampled(1.0, 640, idle=True)) == [Trim(), Spill(640 - 540)]
    assert g.handle(Sampled(1.05, 630, idle=True)) == [
        Floor(630, 680, 730),
        Spill(630 - 540),
        Throttled(False, 630),
        Run("load"),
    ]
    assert (g.floor, g.resume_at, g.throttle_at) == (630, 680, 730)
    # No flapping: it throttles again only past floor + 2 margins, and resumes under
    # floor + margin; the floor is said once.
    assert g.handle(Sampled(1.1, 720)) == [Spill(720 - 540)]
    assert g.handle(Sampled(1.2, 735)) == [Spill(735 - 540), Throttled(True, 735)]
    assert g.handle(Sampled(1.3, 690, idle=True)) == [Spill(690 - 540)]  # over 680: no trim yet
    assert g.handle(Sampled(1.4, 660, idle=True)) == [Spill(660 - 540), Throttled(False, 660)]
    assert g.handle(Sampled(1.5, 640, idle=True)) == [Spill(640 - 540)]  # no Floor again


def test_a_floor_that_rose_is_measured_again_after_a_trim_and_said_again() -> None:
    g = gov()
    g.handle(Sampled(0.0, 640, idle=True), Sampled(0.05, 630, idle=True))
    assert (g.resume_at, g.throttle_at) == (680, 730)
    assert g.handle(Sampled(1.0, 700, idle=True)) == [Spill(700 - 540)]  # trimmed 1 s ago
    assert g.handle(Sampled(TRIM_EVERY, 700, idle=True)) == [Trim(), Spill(700 - 540)]
    assert g.handle(Sampled(TRIM_EVERY + 0.05, 690, idle=True)) == [
        Floor(690, 740, 790),
        Spill(690 - 540),
    ]
    # An idle sample under the floor lowers it; under the resume mark, the marks are back.
    assert g.handle(Sampled(TRIM_EVERY + 1, 500, idle=True)) == []
    assert (g.floor, g.resume_at, g.throttle_at) == (500, 600, 700)


def test_a_floor_under_the_resume_mark_leaves_the_old_behaviour() -> None:
    g = gov(first_delay=0.5)
    g.handle(Sampled(0.0, 720))
    g.handle(Ready(0.1, "load", True))
    assert g.handle(Sampled(1.0, 650, idle=True)) == [Trim(), Spill(650 - 540)]
    # The trim freed enough: under the mark, the configured marks hold, nothing is said.
    assert g.handle(Sampled(1.05, 590, idle=True)) == [
        Throttled(False, 590),
        Run("load"),
    ]
    assert (g.resume_at, g.throttle_at) == (600, 700)
    assert not g.moved  # its reports say floor 0
    assert g.handle(Sampled(1.1, 690)) == [Spill(690 - 540)]
    assert g.handle(Sampled(1.2, 700)) == [Spill(700 - 540), Throttled(True, 700)]
    assert g.handle(Sampled(1.3, 610)) == [Spill(610 - 540)]  # not idle: no trim, throttled


def test_a_floor_near_the_terminate_fence_moves_the_throttle_fence_no_higher() -> None:
    g = gov()  # terminate at 950
    g.handle(Sampled(0.0, 930, idle=True))
    assert g.handle(Sampled(0.05, 920, idle=True))[0] == Floor(920, 950, 950)
    assert g.moved  # its reports carry the floor


def test_an_idle_worker_holding_back_producers_under_its_moved_marks_measures_its_floor_again() -> (
    None
):
    """A floor measured high (memory a later collection frees: a user audit's second
    dask groupby on 400 MiB workers) moves the marks up to the terminate fence; the RSS
    then sits between the floor and the moved resume mark, where no trim was asked, and
    a producer whose expected output does not fit waited until the scheduler's watchdog
    failed the run with MemoryStalled. Idle and holding back a producer, the worker
    gives memory back and measures its floor again every TRIM_EVERY seconds."""
    g = gov(first_delay=0.5)  # resume 600, throttle 700, terminate 950
    learnt(g, "collect", 100)
    assert g.handle(Sampled(0.0, 930, idle=True)) == [
        Trim(),
        Spill(930 - 540),
        Throttled(True, 930),
    ]
    assert g.handle(Sampled(0.05, 900, idle=True)) == [
        Floor(900, 950, 950),
        Spill(900 - 540),
        Throttled(False, 900),
    ]
    # 900 + 100 passes the moved throttle mark and, alone, the terminate fence: it waits.
    assert g.handle(Ready(1.0, "c", True, "collect")) == [Throttled(True, 900), Defer("c", 1.5)]
    assert g.handle(Sampled(1.1, 890, idle=True)) == [Spill(890 - 540)]  # trimmed 1 s ago
    # Under the resume mark (950), but the producer cannot start: give memory back...
    assert g.handle(Sampled(TRIM_EVERY, 890, idle=True)) == [Trim(), Spill(890 - 540)]
    # ...and what is left is the floor: the configured marks hold again, it runs.
    assert g.handle(Sampled(TRIM_EVERY + 0.05, 520, idle=True)) == [Throttled(False, 520), Run("c")]
    assert (g.floor, g.resume_at, g.throttle_at) == (520, 600, 700)


def test_deferred_producers_that_fit_ask_for_no_trim() -> None:
    """Idle under the resume mark with a deferred producer that fits: it runs, and no
    trim is asked for."""
    g = gov(first_delay=0.5)
    learnt(g, "load", 100)
    g.handle(Sampled(0.0, 720))
    assert g.handle(Ready(0.1, "a", True, "load")) == [Defer("a", 0.6)]
    assert g.handle(Sampled(TRIM_EVERY, 500, idle=True)) == [Throttled(False, 500), Run("a")]


def test_a_task_process_is_recycled_once_its_idle_rss_crept_past_a_share_of_the_limit() -> None:
    from actors.memory import RECYCLE_MIN, recycle_over, recycle_task_process

    mib = 2**20
    assert recycle_over(500 * mib, 1) == 100 * mib  # the audit's 500 MiB process worker
    assert recycle_over(1000 * mib, 4) == 50 * mib  # a fifth of each one's share
    assert recycle_over(100 * mib, 4) == RECYCLE_MIN == 32 * mib  # at least this
    assert recycle_over(0, 1) == 0 and recycle_over(500 * mib, 0) == 0  # never
    over = 100 * mib
    assert not recycle_task_process(150 * mib, 249 * mib, over)
    assert recycle_task_process(150 * mib, 250 * mib, over)
    assert not recycle_task_process(0, 900 * mib, over)  # no fresh floor known yet
    assert not recycle_task_process(150 * mib, 900 * mib, 0)  # recycling off
    assert not recycle_task_process(300 * mib, 150 * mib, over)  # it shrank


def test_a_held_back_producer_under_the_spill_fence_spills_outputs_to_make_room() -> None:
    """The chaos audit's silent hang (D1), on a 1 GiB worker scaled to 1000: the worker
    had made 750 of category ``big`` in an earlier run, held a 330 input now, at 410
    (under its spill fence, 600), and a ``big`` producer came. 410 + 750 passes the
    terminate fence, so it was deferred and the worker throttled; under the spill
    fence nothing spilled, nothing ran, for ever. Spilling comes first: the worker
    moves outputs to disk until the producer fits alone, then runs it."""
    g = gov(first_delay=0.5)  # spill 600, resume 600, throttle 700, terminate 950
    learnt(g, "big", 750)
    g.handle(Finished(0.5, "big-0", 330))  # the input it holds now (fresh until 1.5)
    g.handle(Sampled(10.0, 410, stored=330))
    assert g.handle(Ready(10.0, "big-1", True, "big")) == [
        Throttled(True, 410),
        Defer("big-1", 10.5),
    ]
    # The next sample asks for room: under min(resume 600, 950 - 750 = 200).
    assert g.handle(Sampled(10.05, 410, stored=330)) == [Spill(410 - 199)]
    assert g.handle(Sampled(10.1, 410, stored=330)) == [Spill(410 - 199)]  # until done
    # Spilled: the producer fits alone under the terminate fence and runs.
    assert g.handle(Sampled(10.2, 80, stored=0)) == [Throttled(False, 80), Run("big-1")]


def test_a_held_back_producer_spills_no_output_made_in_the_last_second() -> None:
    """Outputs made less than SPILL_GRACE ago stay in memory (their consumer usually
    comes within it): the room is asked of the others; once the grace is over, of
    them too."""
    g = gov(first_delay=0.5)
    learnt(g, "big", 750)
    g.handle(Sampled(2.0, 410, stored=330))
    g.handle(Ready(2.0, "big-1", True, "big"))
    g.handle(Finished(2.1, "small", 20))
    assert g.handle(Sampled(2.2, 430, stored=350)) == [Spill(430 - 199, frozenset({"small"}))]
    assert g.handle(Sampled(2.1 + SPILL_GRACE, 430, stored=350)) == [Spill(430 - 199)]


def test_a_held_back_producer_spills_nothing_when_no_spill_would_make_room() -> None:
    """Spilling off, producers running (it waits for them), or too few outputs in
    memory for the producer to fit even with all of them on disk: no spill asked."""
    g = gov(spill=None, first_delay=0.5)
    learnt(g, "big", 750)
    g.handle(Sampled(0.0, 410, stored=330), Ready(0.0, "big-1", True, "big"))
    assert g.handle(Sampled(0.1, 410, stored=330)) == []
    g = gov(first_delay=0.5)
    learnt(g, "big", 750)
    g.handle(Sampled(0.0, 410, stored=100), Ready(0.0, "big-1", True, "big"))
    assert g.handle(Sampled(0.1, 410, stored=100)) == []  # 410 - 100 + 750 >= 950
    g = gov(first_delay=0.5)
    learnt(g, "big", 250)
    g.handle(Sampled(0.0, 100, stored=0))
    assert g.handle(Ready(0.0, "b1", True, "big"), Ready(0.0, "b2", True, "big")) == [
        Run("b1"),
        Run("b2"),
    ]
    assert g.handle(Ready(0.0, "b3", True, "big")) == [Defer("b3", 0.5)]
    assert g.handle(Sampled(0.1, 500, stored=0)) == []  # b1, b2 running: b3 waits for them


def test_an_outlier_output_is_forgotten_after_a_window_of_smaller_ones() -> None:
    """A producer's expected output is the largest of its category's latest
    OUTPUT_WINDOW outputs here: an earlier run's 750 does not hold later producers that
    make 300 to the worker's room for ever (the chaos audit's poisoned category)."""
    g = gov()
    learnt(g, "big", 750)
    for i in range(1, OUTPUT_WINDOW + 1):
        assert g.outputs == {"big": 750}
        g.handle(Ready(float(i), f"big-{i}", True, "big"), Finished(float(i), f"big-{i}", 300))
    assert g.outputs == {"big": 300}
    g.handle(Ready(9.0, "big-9", True, "big"), Finished(9.0, "big-9", 0))  # failed: no size
    assert g.outputs == {"big": 300}


def test_an_idle_worker_starts_alone_a_producer_that_fits_nowhere_after_its_trim() -> None:
    """A 1.5 GB output made once on a 1 GiB thread worker (it ran past the limit, as
    a first task of unknown size does): the next task of that category was deferred
    there for ever, the worker throttled at 80 MiB of RSS holding nothing, its peer
    idle, no error. Idle and holding back a producer that fits nowhere, the worker
    trims, measures its floor, and then starts the oldest such producer alone, with a
    warning; the others wait for it."""
    g = gov(first_delay=0.5)  # resume 600, throttle 700, terminate 950
    learnt(g, "big", 1500)
    assert g.handle(Sampled(1.0, 80, idle=True, stored=0)) == []
    assert g.handle(Ready(1.0, "big-1", True, "big"), Ready(1.0, "big-2", True, "big")) == [
        Throttled(True, 80),
        Defer("big-1", 1.5),
        Defer("big-2", 1.5),
    ]
    # Not idle (an output in memory, or a task running): no trim, nothing starts.
    assert g.handle(Sampled(1.1, 80, stored=10)) == []
    # Idle: give memory back first, then the floor decides.
    assert g.handle(Sampled(2.0, 80, idle=True, stored=0)) == [Trim()]
    assert g.handle(Sampled(2.05, 78, idle=True, stored=0)) == [
        Run("big-1"),
        Alone("big-1", 1500, 78),
    ]
    assert g.throttled and list(g.deferred) == ["big-2"]  # it waits for big-1
    assert g.handle(Sampled(4.1, 900, stored=0)) == [Spill(0)]  # big-1 runs: not alone
    g.handle(Finished(5.0, "big-1", 0))  # gone to the client
    assert g.handle(Sampled(5.0, 78, idle=True, stored=0)) == [Trim()]
    assert g.handle(Sampled(5.05, 78, idle=True, stored=0)) == [
        Run("big-2"),
        Alone("big-2", 1500, 78),
        Throttled(False, 78),
    ]
