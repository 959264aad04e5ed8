"""The ``demand`` block strategy (policies/scaling.py) driven through the autoscaler's
pure core (actors/autoscaler_state.py) with a virtual clock: ``init_blocks`` at start,
``parallelism`` (blocks ~ ceil(active tasks x parallelism / slots per block)), ``min``
and ``max`` blocks, and idle blocks drained after ``max_idletime`` seconds, longest idle
first, never a busy one. Every test checks the exact commands; ``run`` validates the
core's invariants after every step.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import policies
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockEnded,
    BlockRunning,
    BlockStarted,
    BlockStartFailed,
    BlockStopped,
    BlockStuck,
    Command,
    DrainAnswered,
    DrainWorker,
    Event,
    PolicyFailed,
    QueuesSeen,
    ReportGone,
    Resumed,
    StartBlock,
    StopBlock,
    TargetRaised,
    TargetSet,
    Tick,
)
from policies import PolicyParamsError
from policies.scaling import LoadView, PoolLimits, forecast_headroom

SPEC = "spec"


def make(policy: Any = None, config: AutoscalerConfig | None = None) -> AutoscalerState:
    return AutoscalerState(
        config or AutoscalerConfig(), policy or policies.REGISTRY.create("scaling", "demand")
    )


def run(state: AutoscalerState, *events: Event) -> list[Command]:
    out = state.handle(*events)
    state.validate()
    return out


def limits(**kw: Any) -> PoolLimits:
    base: dict[str, Any] = dict(
        min_blocks=0, max_blocks=4, init_blocks=2, parallelism=1.0, slots_per_block=2,
        max_idletime=60.0,
    )  # fmt: skip
    return PoolLimits(**{**base, **kw})


def start(state: AutoscalerState, now: float, pool: str = "p") -> list[str]:
    """Answer every request in flight: block-<request> with worker w-<request>."""
    blocks = []
    for request in sorted(state.requests):
        assert state.requests[request] == pool
        out = run(state, BlockStarted(now, request, f"block-{request}", (f"w-{request}",)))
        assert out == []
        blocks.append(f"block-{request}")
    return blocks


def load(now: float, queued: int = 0, **processing: int) -> QueuesSeen:
    """What the scheduler counts: ``queued`` ready tasks of pool p, tasks per worker."""
    return QueuesSeen(now, {"p": queued}, processing)


def test_init_blocks_start_at_once_and_stay_while_the_load_is_unknown() -> None:
    s = make()
    assert run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=3))) == [
        StartBlock(i, "p", SPEC) for i in (1, 2, 3)
    ]
    start(s, 1.0)
    assert run(s, Tick(500.0)) == []  # no load seen: nothing is idle, nothing scales in
    assert s.counts() == {"p": 3}


def test_blocks_follow_the_active_tasks_times_parallelism_per_slot() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1, max_blocks=10)))
    start(s, 0.5)
    # 9 ready + 1 running, 2 slots per block, parallelism 1: ceil(10 / 2) = 5 blocks.
    assert run(s, load(1.0, 9, **{"w-1": 1})) == [StartBlock(i, "p", SPEC) for i in (2, 3, 4, 5)]
    assert s.pools["p"].desired == 5


def test_parallelism_below_one_asks_for_fewer_blocks() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1, max_blocks=10, parallelism=0.5)))
    start(s, 0.5)
    # ceil(10 * 0.5 / 2) = 3 blocks
    assert run(s, load(1.0, 10, **{"w-1": 0})) == [
        StartBlock(2, "p", SPEC),
        StartBlock(3, "p", SPEC),
    ]


def test_parallelism_zero_still_gives_active_tasks_one_block() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=0, parallelism=0.0)))
    assert s.counts() == {"p": 0}
    assert run(s, load(1.0, 50)) == [StartBlock(1, "p", SPEC)]


def test_max_blocks_is_a_ceiling_whatever_the_policy_says() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1, max_blocks=3)))
    start(s, 0.5)
    assert run(s, load(1.0, 1000, **{"w-1": 2})) == [
        StartBlock(2, "p", SPEC),
        StartBlock(3, "p", SPEC),
    ]

    class Greedy:
        name = "greedy"

        def desired(self, pool: Any) -> int:
            return 50

    s = make(Greedy())
    assert run(s, TargetSet(0.0, "p", 0, SPEC, limits(max_blocks=3))) == [
        PolicyFailed("p", "desired returned 50, not within 0..3", 3, 1, "greedy"),
        *(StartBlock(i, "p", SPEC) for i in (1, 2, 3)),
    ]
    assert s.policy_errors == 1  # the proposal beyond the pool's max counts as refused


def test_an_idle_block_is_drained_after_max_idletime_and_not_a_second_before() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 1, SPEC, limits(min_blocks=1, init_blocks=2)))
    start(s, 1.0)
    idle = {"w-1": 0, "w-2": 0}
    assert run(s, load(10.0, **idle)) == []  # both idle from t=10
    assert run(s, load(69.9, **idle)) == []
    # 60 s idle: one block goes (down to min_blocks), by drain, the last by id as a tie.
    assert run(s, load(70.0, **idle)) == [DrainWorker("w-2", "block-2")]
    assert run(s, DrainAnswered(70.1, "w-2", True)) == []
    assert run(s, load(200.0, **{"w-1": 0})) == []  # min_blocks: the last one stays
    # The drained block ends by itself: reported as drained, not replaced.
    assert run(s, BlockEnded(201.0, "block-2", "completed")) == [
        ReportGone("block-2", ("w-2",), "drained", "completed")
    ]
    assert s.counts() == {"p": 1}


def test_the_longest_idle_block_goes_first_and_a_busy_one_never() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=3)))
    start(s, 1.0)
    assert run(s, load(10.0, **{"w-1": 1, "w-2": 0, "w-3": 1})) == []  # w-2 idle from 10
    assert run(s, load(20.0, **{"w-1": 0, "w-2": 0, "w-3": 1})) == []  # w-1 idle from 20
    # Active: 1 task -> 1 block needed; at 70 only block-2 has been idle 60 s.
    assert run(s, load(70.0, **{"w-1": 0, "w-2": 0, "w-3": 1})) == [DrainWorker("w-2", "block-2")]
    assert run(s, load(80.0, **{"w-1": 0, "w-3": 1})) == [DrainWorker("w-1", "block-1")]
    # block-3 runs a task: never drained, whatever time passes while it is busy.
    assert run(s, load(10_000.0, **{"w-3": 1})) == []
    assert [b for b in s.blocks.values() if not b.retiring] == [s.blocks["block-3"]]


def test_a_block_that_works_again_starts_its_idle_time_over() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1)))
    start(s, 1.0)
    assert run(s, load(10.0, **{"w-1": 0})) == []
    assert run(s, load(60.0, 1, **{"w-1": 1})) == []  # busy again at 60
    assert run(s, load(65.0, **{"w-1": 0})) == []  # idle from 65
    assert run(s, load(124.0, **{"w-1": 0})) == []
    assert run(s, load(125.0, **{"w-1": 0})) == [DrainWorker("w-1", "block-1")]


def test_a_block_whose_worker_has_not_joined_is_not_idle() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1)))
    start(s, 1.0)
    assert run(s, load(10.0), load(1000.0)) == []  # w-1 unknown to the scheduler
    assert s.blocks["block-1"].idle_since is None


def test_active_tasks_count_any_pool_and_only_this_pools_workers() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1, max_blocks=10, slots_per_block=1)))
    start(s, 0.5)
    seen = QueuesSeen(1.0, {"p": 2, "*": 3, "q": 100}, {"w-1": 1, "elsewhere": 40})
    assert len(run(s, seen)) == 5  # 2 + 3 + 1 = 6 blocks
    assert s.active("p") == 6


def test_ready_tasks_a_pools_workers_could_never_run_are_no_demand_for_it() -> None:
    # A task of no pool asking for more cores than p's workers have (the scheduler's
    # unfit count, DemandRequest): no block is asked for it, and an idle block is
    # drained at its max_idletime as if the task were not there; q's workers are
    # large enough: it is q's demand.
    s = make()
    run(
        s,
        TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1, slots_per_block=1)),
        TargetSet(0.0, "q", 0, SPEC, limits(init_blocks=0, slots_per_block=1)),
    )
    assert start(s, 0.5) == ["block-1"]
    unfit = QueuesSeen(1.0, {"*": 1}, {"w-1": 0}, unfit={"p": 1})
    assert run(s, unfit) == [StartBlock(2, "q", SPEC)]
    assert (s.ready_for("p"), s.active("p"), s.ready_for("q")) == (0, 0, 1)
    assert run(s, dataclasses.replace(unfit, now=60.9)) == []
    assert run(s, dataclasses.replace(unfit, now=61.0)) == [DrainWorker("w-1", "block-1")]
    # Without the unfit count (before this fix, or no answer): it was p's demand.
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=0, slots_per_block=1)))
    assert run(s, QueuesSeen(1.0, {"*": 1}, {})) == [StartBlock(1, "p", SPEC)]
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=0, slots_per_block=1)))
    assert run(s, QueuesSeen(1.0, {"*": 1}, {}, unfit={"p": 1})) == []


def test_scale_sets_a_floor_within_the_limits() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1)))
    start(s, 0.5)
    run(s, load(1.0, **{"w-1": 0}))
    # A new target without limits keeps the pool's limits.
    assert run(s, TargetSet(2.0, "p", 3, SPEC)) == [
        StartBlock(2, "p", SPEC),
        StartBlock(3, "p", SPEC),
    ]
    assert s.pools["p"].limits == limits(init_blocks=1)
    assert run(s, TargetSet(3.0, "p", 9, SPEC)) == [StartBlock(4, "p", SPEC)]  # max_blocks 4


def test_a_pool_without_limits_keeps_its_target_under_demand() -> None:
    s = make()
    assert run(s, TargetSet(0.0, "default", 2, SPEC)) == [
        StartBlock(1, "default", SPEC),
        StartBlock(2, "default", SPEC),
    ]
    start(s, 0.5, "default")
    assert run(s, QueuesSeen(1.0, {}, {"w-1": 0, "w-2": 0}), Tick(5000.0)) == []


def test_the_strategy_sees_a_load_view() -> None:
    seen: list[Any] = []

    class Spy:
        name = "spy"

        def desired(self, pool: Any) -> int:
            seen.append(pool)
            return 1

    s = make(Spy())
    lim = limits(init_blocks=1)
    run(s, TargetSet(0.0, "p", 0, SPEC, lim))
    start(s, 0.5)
    run(s, load(1.0, 3, **{"w-1": 0}), load(4.0, **{"w-1": 0}))
    # block-1 came up 0.5 s after its request; the first count has nothing to rise from
    # (the 3 tasks counted at 1.0 are the peak of the last max_idletime, 60 s)
    assert seen[-1] == LoadView("p", 0, 1, 0, 0, 0, lim, 0, (3.0,), 4.0, (), (0.5,), (), (), 3, 1)
    assert seen[-2] == LoadView("p", 0, 1, 0, 0, 3, lim, 3, (0.0,), 1.0, (), (0.5,), (), (), 3, 1)
    # Rises of the active tasks are arrivals: 0 -> 5 -> 4 -> 6 (5 and 2 arrived).
    run(s, load(5.0, 4, **{"w-1": 1}), load(6.0, 3, **{"w-1": 1}), load(7.0, 5, **{"w-1": 1}))
    assert seen[-1].arrivals == ((5.0, 5), (7.0, 2))
    # They are kept an hour.
    run(s, load(3605.5, 5, **{"w-1": 1}))
    assert seen[-1].arrivals == ((7.0, 2),)


def test_a_pending_block_is_never_idle() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=2)))
    out = run(s, BlockStarted(0.5, 1, "block-1", ("w-1",), "pending"))
    assert out == []
    start(s, 0.6)  # block-2 running
    run(s, load(1.0, **{"w-1": 0, "w-2": 0}))
    assert s.blocks["block-1"].idle_since is None
    # Only the running block was idle 60 s: it goes, the pending one stays (one of the
    # pool's init_blocks, 2, has not come up yet).
    assert run(s, load(61.0, **{"w-1": 0, "w-2": 0})) == [DrainWorker("w-2", "block-2")]
    assert s.blocks["block-1"].idle_since is None and not s.blocks["block-1"].retiring


def burst_on_one_running_block(s: AutoscalerState) -> None:
    """block-1 runs (the pool's floor, min_blocks 1); 6 tasks arrive at 2.0: blocks 2-4
    are asked for and queue in the batch system (pending); block-1 runs the 6 tasks,
    done by 10.0 (the queue is empty, the blocks asked for have not run)."""
    lim = limits(min_blocks=1, init_blocks=1, max_blocks=4, slots_per_block=1, max_idletime=20.0)
    assert run(s, TargetSet(0.0, "p", 1, SPEC, lim)) == [StartBlock(1, "p", SPEC)]
    start(s, 0.5)
    assert run(s, load(1.0, **{"w-1": 0})) == []
    assert run(s, load(2.0, 5, **{"w-1": 1})) == [StartBlock(r, "p", SPEC) for r in (2, 3, 4)]
    for r in (2, 3, 4):
        assert run(s, BlockStarted(2.5, r, f"block-{r}", (f"w-{r}",), "pending")) == []
    assert run(s, load(10.0, **{"w-1": 0})) == []


def test_blocks_still_queued_when_the_burst_is_gone_are_cancelled_before_they_run() -> None:
    s = make()
    burst_on_one_running_block(s)
    # The 6 tasks counted at 2.0 are the demand of the last max_idletime (20 s) until
    # 30.0, and the blocks were asked for less than 20 s ago until 22.0: kept till then.
    for now in (15.0, 22.0, 29.9):
        assert run(s, load(now, **{"w-1": 0})) == [], now
    # Nothing wanted them for 20 s: the queued blocks are scaled in (their workers never
    # joined: stopped, i.e. scancel), the running block-1 holds min_blocks (though idle
    # 20 s itself: a floor is held by a running block, not by a queued one).
    queued = [DrainWorker(f"w-{r}", f"block-{r}") for r in (2, 3, 4)]
    assert run(s, load(30.0, **{"w-1": 0})) == queued
    for r in (2, 3, 4):
        assert run(s, DrainAnswered(30.1, f"w-{r}", False)) == [StopBlock(f"block-{r}")]
        assert run(s, BlockStopped(30.2, f"block-{r}", "cancelled")) == []
    assert [(e.block, e.cause, e.charged) for e in s.ends] == [
        (f"block-{r}", "drained", False) for r in (2, 3, 4)
    ]
    assert list(s.blocks) == ["block-1"] and s.counts() == {"p": 1}
    assert run(s, load(300.0, **{"w-1": 0})) == []  # the floor stays


def test_a_lull_shorter_than_max_idletime_cancels_nothing() -> None:
    """No flapping: the next burst comes 15 s after the last: the blocks still queued
    for the first are kept (not cancelled, then asked for again)."""
    s = make()
    burst_on_one_running_block(s)
    assert run(s, load(25.0, 3, **{"w-1": 1})) == []  # 4 active: the 4 blocks are wanted
    assert run(s, load(44.9, **{"w-1": 0})) == []  # done at 44.9: wanted until 64.9
    assert run(s, load(64.8, **{"w-1": 0})) == []
    queued = [DrainWorker(f"w-{r}", f"block-{r}") for r in (2, 3, 4)]
    assert run(s, load(64.9, **{"w-1": 0})) == queued


def test_a_queued_block_goes_before_a_running_idle_one() -> None:
    """Scaled in by hand (the fixed strategy) from 2 to 1 with block-1 running idle and
    block-2 still queued: block-2 is cancelled, block-1 (capacity now) stays; from 1 to 0
    block-1 goes too."""
    s = AutoscalerState(AutoscalerConfig(), policies.REGISTRY.create("scaling", "fixed"))
    asked = [StartBlock(1, "p", SPEC), StartBlock(2, "p", SPEC)]
    assert run(s, TargetSet(0.0, "p", 2, SPEC)) == asked
    assert run(s, BlockStarted(0.5, 1, "block-1", ("w-1",))) == []
    assert run(s, BlockStarted(0.5, 2, "block-2", ("w-2",), "pending")) == []
    assert run(s, load(1.0, **{"w-1": 0})) == []
    assert run(s, TargetSet(2.0, "p", 1, SPEC)) == [DrainWorker("w-2", "block-2")]
    assert run(s, TargetSet(3.0, "p", 0, SPEC)) == [DrainWorker("w-1", "block-1")]


def test_the_blocks_asked_at_the_start_are_kept_until_init_blocks_came_up() -> None:
    """No task yet (a client waits for its workers before it submits): the init blocks
    stay queued however long the batch system takes; once init_blocks came up, the
    usual rules (min_blocks 0: idle max_idletime, drained)."""
    s = make()
    assert run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=2))) == [
        StartBlock(1, "p", SPEC), StartBlock(2, "p", SPEC),
    ]  # fmt: skip
    for r in (1, 2):
        assert run(s, BlockStarted(0.5, r, f"block-{r}", (f"w-{r}",), "pending")) == []
    assert run(s, load(1.0), load(500.0), BlockRunning(600.0, "block-1")) == []
    assert run(s, load(601.0, **{"w-1": 0}), BlockRunning(650.0, "block-2")) == []
    assert run(s, load(651.0, **{"w-1": 0, "w-2": 0})) == []
    assert run(s, load(661.0, **{"w-1": 0, "w-2": 0})) == [DrainWorker("w-1", "block-1")]
    assert run(s, load(711.0, **{"w-2": 0})) == [DrainWorker("w-2", "block-2")]


def test_the_blocks_counted_up_for_init_blocks_are_all_those_that_ran() -> None:
    """init_blocks 21 (more than the 20 provisioning delays the core keeps): once the
    21 came up, the usual rules hold. They went idle and were drained; 2 blocks asked
    for a burst that was gone before they ran (its tasks cancelled) are cancelled once
    nothing wanted them for max_idletime (they were kept for ever: the count of blocks
    that came up was read from the 20 delays kept, never 21)."""
    s = make()
    lim = limits(init_blocks=21, max_blocks=24, slots_per_block=1, max_idletime=20.0)
    assert len(run(s, TargetSet(0.0, "p", 0, SPEC, lim))) == 21
    start(s, 0.5)
    idle = {f"w-{i}": 0 for i in range(1, 22)}
    assert run(s, load(1.0, **idle)) == []
    assert len(run(s, load(21.0, **idle))) == 21  # idle max_idletime: drained
    for i in range(1, 22):
        assert run(s, DrainAnswered(21.1, f"w-{i}", True)) == []
    assert run(s, load(22.0)) == []  # they retired: their blocks end by themselves
    for i in range(1, 22):
        end = BlockEnded(22.5, f"block-{i}", "completed", drained=True)
        assert run(s, end) == [ReportGone(f"block-{i}", (f"w-{i}",), "drained", "completed")]
    assert s.counts() == {"p": 0} and not s.blocks
    assert run(s, load(30.0, 2)) == [StartBlock(r, "p", SPEC) for r in (22, 23)]
    for r in (22, 23):
        assert run(s, BlockStarted(30.5, r, f"block-{r}", (f"w-{r}",), "pending")) == []
    assert run(s, load(31.0)) == []  # the tasks were cancelled: wanted until 50.5
    assert run(s, load(50.0)) == []
    queued = [DrainWorker(f"w-{r}", f"block-{r}") for r in (22, 23)]
    assert run(s, load(51.0)) == queued


# ----------------------------------------------------------------------------- at random


def test_a_raised_target_holds_until_its_time_then_idle_blocks_drain() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=1, max_blocks=6, slots_per_block=1)))
    start(s, 0.5)
    run(s, load(1.0, 0, **{"w-1": 1}))
    # An alert's scale-out: 4 blocks until t=300 (the pool's own target stays 0).
    assert run(s, TargetRaised(10.0, "p", 4, 300.0)) == [
        StartBlock(i, "p", SPEC) for i in (2, 3, 4)
    ]
    assert s.pools["p"].target == 0 and s.target("p") == 4
    start(s, 11.0)
    busy = {"w-1": 1, "w-2": 1, "w-3": 0, "w-4": 0}
    assert run(s, load(20.0, 0, **busy)) == []
    assert run(s, load(299.9, 0, **busy)) == []  # idle long enough, but the raise holds
    # The raise is over: the policy drains the blocks idle max_idletime, never a busy one.
    assert run(s, load(300.0, 0, **busy)) == [  # idle as long: the last by id first
        DrainWorker("w-4", "block-4"),
        DrainWorker("w-3", "block-3"),
    ]
    assert s.target("p") == 0
    assert run(s, load(5000.0, 0, **{"w-1": 1, "w-2": 1})) == []


def test_a_raised_target_is_checked() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits()))
    with pytest.raises(ValueError, match="no pool 'q'"):
        s.handle(TargetRaised(1.0, "q", 2, 10.0))
    with pytest.raises(ValueError, match=r"cannot scale pool 'p' to -1 blocks"):
        s.handle(TargetRaised(1.0, "p", -1, 10.0))


# ----------------------------------------------------------------------------- pending capacity


def pending(state: AutoscalerState, now: float, pool: str = "p") -> list[str]:
    """Answer every request in flight with a block still queued by the batch system:
    block-<request>, its worker w-<request> not started."""
    blocks = []
    for request in sorted(state.requests):
        block = f"block-{request}"
        assert run(state, BlockStarted(now, request, block, (f"w-{request}",), "pending")) == []
        blocks.append(block)
    return blocks


def test_pending_blocks_count_as_capacity_so_nothing_is_asked_twice() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=0, max_blocks=10, slots_per_block=1)))
    assert run(s, load(1.0, 3)) == [StartBlock(i, "p", SPEC) for i in (1, 2, 3)]
    assert run(s, load(2.0, 3)) == []  # requested, no answer yet: they count
    pending(s, 3.0)
    for now in (4.0, 60.0, 3600.0):  # no timeout: pending blocks count until they run
        assert run(s, load(now, 3)) == []
    # Two more tasks: two more blocks, not five.
    assert run(s, load(3601.0, 5)) == [StartBlock(4, "p", SPEC), StartBlock(5, "p", SPEC)]


def test_a_stuck_block_is_replaced_at_its_provisioning_timeout_and_not_before() -> None:
    s = make()
    lim = limits(init_blocks=0, max_blocks=10, slots_per_block=1, provisioning_timeout=300.0)
    run(s, TargetSet(0.0, "p", 0, SPEC, lim))
    assert run(s, load(10.0, 2)) == [StartBlock(1, "p", SPEC), StartBlock(2, "p", SPEC)]
    pending(s, 12.0)
    assert run(s, BlockRunning(100.0, "block-1")) == []  # runs in time: never stuck
    assert run(s, load(309.9, 1, **{"w-1": 1})) == []  # block-2 pending 299.9 s: counts
    # 300 s after its request: stuck. It no longer counts; its worker is asked to drain
    # (it may have joined meanwhile) and a replacement is asked for.
    assert run(s, load(310.0, 1, **{"w-1": 1})) == [
        BlockStuck("block-2", "p", "pending", 300.0, 300.0),
        DrainWorker("w-2", "block-2"),
        StartBlock(3, "p", SPEC),
    ]
    assert s.stuck == {"p": 1}
    # The scheduler never saw w-2: the block is stopped (cancelled in the batch system).
    assert run(s, DrainAnswered(310.1, "w-2", False)) == [StopBlock("block-2")]
    assert run(s, BlockStopped(310.2, "block-2", "cancelled")) == []
    assert (s.ends[-1].block, s.ends[-1].cause, s.ends[-1].charged) == ("block-2", "stuck", False)
    # Not an unasked end: the replacement budget is untouched.
    assert list(s.replacements) == [] and s.gave_up == set()
    # The replacement has its own timeout, from its own request.
    pending(s, 311.0)
    assert run(s, load(609.9, 1, **{"w-1": 1})) == []
    assert run(s, load(610.0, 1, **{"w-1": 1}))[0] == BlockStuck(
        "block-3", "p", "pending", 300.0, 300.0
    )
    assert s.stuck == {"p": 2}


def test_stuck_blocks_never_spend_the_replacement_budget() -> None:
    s = make(config=AutoscalerConfig(max_replacements=1, replacement_window=10_000.0))
    lim = limits(min_blocks=1, init_blocks=1, max_blocks=1, provisioning_timeout=60.0)
    run(s, TargetSet(0.0, "p", 1, SPEC, lim))
    now = 0.0
    for i in range(1, 6):  # five blocks in a row never run
        pending(s, now + 1.0)
        now += 60.0
        out = run(s, Tick(now))
        assert out == [
            BlockStuck(f"block-{i}", "p", "pending", 60.0, 60.0),
            DrainWorker(f"w-{i}", f"block-{i}"),
            StartBlock(i + 1, "p", SPEC),
        ], out
        assert run(s, DrainAnswered(now, f"w-{i}", False)) == [StopBlock(f"block-{i}")]
        run(s, BlockStopped(now, f"block-{i}", "cancelled"))
    assert s.stuck == {"p": 5} and list(s.replacements) == [] and s.gave_up == set()


def test_a_stuck_block_whose_worker_joined_is_drained_never_stopped() -> None:
    s = make()
    lim = limits(init_blocks=1, slots_per_block=1, provisioning_timeout=60.0)
    run(s, TargetSet(0.0, "p", 0, SPEC, lim))
    pending(s, 1.0)
    # The core has not heard that block-1 runs; its worker did join and runs a task
    # (which a draining worker finishes: nothing else is active, nothing is asked for).
    out = run(s, load(60.0, 0, **{"w-1": 1}))
    assert out == [BlockStuck("block-1", "p", "pending", 60.0, 60.0), DrainWorker("w-1", "block-1")]
    # The scheduler knows w-1: it drains it (finishes its task), nothing is stopped.
    assert run(s, DrainAnswered(60.1, "w-1", True)) == []
    assert run(s, load(500.0, 0, **{"w-1": 1}), Tick(5000.0)) == []
    assert run(s, BlockEnded(5001.0, "block-1", "completed")) == [
        ReportGone("block-1", ("w-1",), "stuck", "completed")
    ]
    assert list(s.replacements) == []


def test_a_pool_that_may_not_ask_keeps_its_stuck_blocks() -> None:
    s = make()
    lim = limits(init_blocks=2, slots_per_block=1, provisioning_timeout=60.0)
    run(s, TargetSet(0.0, "p", 0, SPEC, lim))
    assert run(s, BlockStarted(1.0, 1, "block-1", ("w-1",), "pending")) == []
    # The provider stops submitting (the second block): the pool pauses.
    run(s, BlockStartFailed(1.0, 2, "down", batch=True, command="sbatch", suspended=True))
    assert s.paused == {"p"}
    # Cancelling block-1 would leave nothing in its place: it stays.
    assert run(s, Tick(500.0)) == []
    assert s.stuck == {} and not s.blocks["block-1"].retiring
    # Resumed: it is replaced now (and the missing block asked for).
    assert run(s, Resumed(501.0, "p")) == [
        BlockStuck("block-1", "p", "pending", 501.0, 60.0),  # its age: from its request
        DrainWorker("w-1", "block-1"),
        StartBlock(3, "p", SPEC),
        StartBlock(4, "p", SPEC),
    ]


def test_a_stuck_block_is_not_replaced_when_the_load_is_gone() -> None:
    s = make()
    lim = limits(init_blocks=0, slots_per_block=1, provisioning_timeout=60.0)
    run(s, TargetSet(0.0, "p", 0, SPEC, lim))
    assert run(s, load(1.0, 1)) == [StartBlock(1, "p", SPEC)]
    pending(s, 2.0)
    # The task went elsewhere; level-triggered: nothing active, no replacement.
    assert run(s, load(61.0, 0)) == [
        BlockStuck("block-1", "p", "pending", 60.0, 60.0),
        DrainWorker("w-1", "block-1"),
    ]


def test_a_requeued_block_gets_its_timeout_again_from_the_requeue() -> None:
    s = make()
    lim = limits(init_blocks=1, slots_per_block=1, provisioning_timeout=60.0)
    run(s, TargetSet(0.0, "p", 0, SPEC, lim))
    start(s, 1.0)  # running at once
    assert run(s, Tick(1000.0)) == []  # running blocks are never stuck
    from actors.autoscaler_state import BlockRequeued

    out = run(s, BlockRequeued(1000.0, "block-1", 2, "preempted"))
    assert out == [ReportGone("block-1", ("w-1",), "preempted", "requeued")]
    assert run(s, Tick(1059.9)) == []
    assert run(s, Tick(1060.0))[0] == BlockStuck("block-1", "p", "pending", 60.0, 60.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # a block up taught the forecast a 1 s delay: it drained one idle 5 s
    lim=PoolLimits(0, 4, 2, 0.25, 2, 5.0),
    steps=[(2.0, 0, []), (3.0, 1, []), (1.0, 9, []), (1.0, 0, [])],
    forecast=1.0,
)
@given(
    lim=st.builds(
        PoolLimits,
        min_blocks=st.integers(0, 2),
        max_blocks=st.integers(2, 6),
        init_blocks=st.just(2),
        parallelism=st.sampled_from([0.0, 0.25, 1.0]),
        slots_per_block=st.integers(1, 3),
        max_idletime=st.sampled_from([0.0, 5.0, 30.0]),
    ),
    steps=st.lists(
        st.tuples(
            st.floats(0.1, 20.0), st.integers(0, 12), st.lists(st.integers(0, 2), max_size=8)
        ),
        max_size=25,
    ),
    forecast=st.sampled_from([None, 0.5, 1.0]),
)
def test_the_demand_strategy_keeps_its_limits_and_drains_only_long_idle_blocks(
    lim: PoolLimits, steps: list[tuple[float, int, list[int]]], forecast: float | None
) -> None:
    """Random loads on a virtual clock, with and without the forecast: the blocks stay
    within min and max (requests in flight included), and every block drained had been
    idle for max_idletime with every one of its workers running nothing, or was asked
    for and no longer wanted before it ran (a request taken back: its block is scaled
    in as it starts)."""
    s = make(policies.REGISTRY.create("scaling", "demand", {"forecast": forecast}))
    now = 0.0
    processing: dict[str, int] = {}  # the workers' tasks as last seen

    def drains_only_long_idle(out: list[Any], taken_back: str = "") -> None:
        for cmd in out:
            assert isinstance(cmd, StartBlock | DrainWorker), out
            if isinstance(cmd, DrainWorker) and cmd.block != taken_back:
                b = s.blocks[cmd.block]
                assert all(processing.get(w, 0) == 0 for w in b.workers), (cmd, processing)
                since = b.idle_since  # as of this event (idle from now, with 0 s)
                assert since is not None and now - since >= lim.max_idletime, (cmd, since)

    run(s, TargetSet(now, "p", lim.min_blocks, SPEC, lim))
    for dt, queued, busy in steps:
        now += dt
        while s.requests:  # a block up may teach the forecast a delay: it may ask more,
            for request in sorted(s.requests):  # or want fewer: a long-idle one drained
                bid = f"block-{request}"  # (or the request taken back, as it starts)
                taken_back = bid if request in s.cancelled else ""
                out = run(s, BlockStarted(now, request, bid, (f"w-{request}",)))
                drains_only_long_idle(out, taken_back)
            assert lim.min_blocks <= s.counts()["p"] <= lim.max_blocks, s.counts()
        workers = [w for b in s.blocks.values() for w in b.workers if not b.retiring]
        processing = {w: (busy[i] if i < len(busy) else 0) for i, w in enumerate(workers)}
        drains_only_long_idle(run(s, QueuesSeen(now, {"p": queued}, processing)))
        assert lim.min_blocks <= s.counts()["p"] <= lim.max_blocks, s.counts()


# ----------------------------------------------------------------------------- forecast


def forecasting(**params: Any) -> AutoscalerState:
    return make(policies.REGISTRY.create("scaling", "demand", {"forecast": 0.9, **params}))


def test_the_forecast_keeps_spare_blocks_for_the_arrivals_of_one_provisioning_delay() -> None:
    s = forecasting(max_headroom=3)
    lim = limits(init_blocks=1, max_blocks=10, slots_per_block=1)
    assert run(s, TargetSet(0.0, "p", 0, SPEC, lim)) == [StartBlock(1, "p", SPEC)]
    run(s, BlockStarted(0.0, 1, "block-1", ("w-1",), "pending"))
    # block-1 runs 1200 s after its request: the hour is three spans of 1200 s
    assert run(s, BlockRunning(1200.0, "block-1"), load(1201.0, **{"w-1": 0})) == []
    # 3 tasks arrive: 3 blocks for them and 3 spare (the busiest span, p90 of three)
    assert run(s, load(1202.0, 2, **{"w-1": 1})) == [StartBlock(i, "p", SPEC) for i in range(2, 7)]
    assert s.pools["p"].desired == 6
    for r in range(2, 7):
        run(s, BlockStarted(1202.5, r, f"block-{r}", (f"w-{r}",), "pending"))
    # the task is done: pending blocks count as capacity, the spare 3 are kept
    assert run(s, load(1300.0, **{"w-1": 0})) == []
    everyone = {f"w-{i}": 0 for i in range(1, 7)}
    # block-1, idle over 60 s, goes; so do the two blocks beyond the 3 spare still
    # pending (asked for 1200 s ago, nothing wanted them over the last 60 s): cancelled
    # before they run, not kept to sit idle for 60 s once up
    assert run(s, *(BlockRunning(2402.0, f"block-{r}") for r in range(2, 7))) == [
        DrainWorker("w-1", "block-1"), DrainWorker("w-5", "block-5"),
        DrainWorker("w-6", "block-6"),
    ]  # fmt: skip
    assert s.pools["p"].provisioning == deque([1200.0] * 4)  # (not those scaled in)
    # the 3 spare stay
    assert run(s, load(2403.0, **everyone)) == []
    assert run(s, load(2463.0, **everyone)) == []
    assert s.pools["p"].desired == 3
    for w in ("w-1", "w-6", "w-5"):
        run(s, DrainAnswered(2464.0, w, True))
    for b in ("block-1", "block-6", "block-5"):
        run(s, BlockEnded(2465.0, b, "completed"))
    idle = {f"w-{i}": 0 for i in (2, 3, 4)}
    # An hour after the arrivals, nothing is forecast: the spare blocks drain too.
    assert run(s, load(4801.0, **idle)) == []
    assert run(s, load(4802.5, **idle)) == [
        DrainWorker("w-4", "block-4"), DrainWorker("w-3", "block-3"),
        DrainWorker("w-2", "block-2"),
    ]  # fmt: skip
    assert s.pools["p"].desired == 0


def test_the_forecast_needs_a_measured_delay_and_stays_within_max_blocks() -> None:
    s = forecasting()  # no max_headroom: up to the pool's max_blocks
    lim = limits(init_blocks=1, max_blocks=5, slots_per_block=1)
    assert run(s, TargetSet(0.0, "p", 0, SPEC, lim)) == [StartBlock(1, "p", SPEC)]
    run(s, BlockStarted(0.0, 1, "block-1", ("w-1",), "pending"), load(1.0, **{"w-1": 0}))
    # block-1 is not running yet: no delay measured, no spare block; 2 arrive, 2 blocks
    assert run(s, load(2.0, 2)) == [StartBlock(2, "p", SPEC)]
    # once a delay is known, 2 tasks per span are expected: 2 + 2 blocks; then 3 more
    # arrive: 5 + 5 wanted, max_blocks 5
    assert run(s, BlockRunning(1800.0, "block-1")) == [StartBlock(3, "p", SPEC),
                                                        StartBlock(4, "p", SPEC)]  # fmt: skip
    assert run(s, load(1801.0, 5, **{"w-1": 0})) == [StartBlock(5, "p", SPEC)]
    assert s.pools["p"].desired == 5


def test_the_forecast_is_the_quantile_of_arrivals_per_provisioning_delay() -> None:
    lim = limits(max_blocks=40, slots_per_block=2)
    # median delay 200 s: the hour is 18 spans ending now; 4 spans had arrivals
    arrivals = ((3599.0, 5), (3500.0, 4), (3000.0, 7), (2000.0, 1), (1000.0, 20), (0.0, 9))
    view = LoadView("p", 0, 0, 0, 0, 0, lim, 0, (), 3600.0, arrivals, (300.0, 100.0, 200.0))
    counts = [9, 20, 1, 7]  # spans 0 (5 + 4), 13, 8, 3; the one at 0.0 is 18 spans ago
    assert forecast_headroom(view, 1.0) == max(counts)
    assert forecast_headroom(view, 0.9) == 9  # nearest rank 17 of 18: the second busiest
    assert forecast_headroom(view, 0.8) == 1  # rank 15: the fourth
    assert forecast_headroom(view, 0.5) == 0
    demand = policies.REGISTRY.create("scaling", "demand", {"forecast": 0.9})
    assert demand.desired(view) == 5  # ceil(9 / 2 slots per block)
    capped = policies.REGISTRY.create("scaling", "demand", {"forecast": 0.9, "max_headroom": 2})
    assert capped.desired(view) == 2
    assert forecast_headroom(dataclasses.replace(view, provisioning=()), 1.0) == 0


def test_forecast_parameters_are_checked() -> None:
    for params, words in (
        ({"forecast": 0}, "forecast must be a quantile"),
        ({"forecast": 1.5}, "forecast must be a quantile"),
        ({"forecast": True}, "forecast must be a quantile"),
        ({"forecast": 0.9, "max_headroom": -1}, "max_headroom must be a whole number"),
        ({"forecast": 0.9, "max_headroom": 2.5}, "max_headroom must be a whole number"),
    ):
        with pytest.raises(PolicyParamsError, match=words):
            policies.REGISTRY.create("scaling", "demand", params)


# ----------------------------------------------------------------------------- spare


def test_spare_blocks_stay_idle_beyond_the_active_tasks_within_max_blocks() -> None:
    """``spare = 2``: two blocks more than the active tasks need, from the moment the load
    is known, busy or not; the rest drain once idle ``max_idletime``; never past
    ``max_blocks``."""
    s = make(policies.REGISTRY.create("scaling", "demand", {"spare": 2}))
    lim = limits(init_blocks=0, max_blocks=5, slots_per_block=1)
    assert run(s, TargetSet(0.0, "p", 0, SPEC, lim)) == []  # the load is not known yet
    # nothing active: the 2 spare
    assert run(s, load(1.0)) == [StartBlock(1, "p", SPEC), StartBlock(2, "p", SPEC)]
    start(s, 2.0)
    # 2 tasks arrive and take the spare blocks: 2 + 2 wanted
    assert run(s, load(3.0, 0, **{"w-1": 1, "w-2": 1})) == [
        StartBlock(3, "p", SPEC), StartBlock(4, "p", SPEC)
    ]  # fmt: skip
    start(s, 4.0)
    # 2 more arrive and take the new blocks: 4 + 2 wanted, 5 allowed
    assert run(s, load(5.0, 0, **{f"w-{i}": 1 for i in range(1, 5)})) == [StartBlock(5, "p", SPEC)]
    assert s.pools["p"].desired == 5
    start(s, 6.0)
    # all done at 10: 2 spare stay, the other 3 drain once idle 60 s
    idle = {f"w-{i}": 0 for i in range(1, 6)}
    assert run(s, load(10.0, **idle)) == []
    assert run(s, load(69.0, **idle)) == []
    assert run(s, load(70.0, **idle)) == [
        DrainWorker("w-5", "block-5"), DrainWorker("w-4", "block-4"), DrainWorker("w-3", "block-3"),
    ]  # fmt: skip
    assert s.pools["p"].desired == 2


def test_spare_must_be_a_whole_number_of_blocks() -> None:
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(PolicyParamsError, match="spare must be a whole number of blocks"):
            policies.REGISTRY.create("scaling", "demand", {"spare": bad})


def test_a_pools_spare_blocks_and_the_strategys_spare_the_larger_applies() -> None:
    lim = limits(max_blocks=10, slots_per_block=1, spare_blocks=3)
    view = LoadView("p", 0, 2, 0, 0, 2, lim, 2, (), 0.0, (), ())
    assert policies.REGISTRY.create("scaling", "demand").desired(view) == 2 + 3
    assert policies.REGISTRY.create("scaling", "demand", {"spare": 5}).desired(view) == 2 + 5
    assert policies.REGISTRY.create("scaling", "demand", {"spare": 1}).desired(view) == 2 + 3
    capped = dataclasses.replace(view, limits=limits(max_blocks=4, slots_per_block=1,
                                                     spare_blocks=3))  # fmt: skip
    assert policies.REGISTRY.create("scaling", "demand").desired(capped) == 4
    with pytest.raises(ValueError, match=r"spare_blocks must be from 0 to max_blocks \(4\)"):
        limits(max_blocks=4, spare_blocks=5)
