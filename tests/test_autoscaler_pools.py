"""The ``demand`` block strategy (policies/scaling.py) driven through the autoscaler's
pure core (actors/autoscaler_state.py) with a virtual clock: ``init_blocks`` at start,
``parallelism`` (blocks ~ ceil(active tasks x parallelism / slots per block)), ``min``
and ``max`` blocks, and idle blocks drained after ``max_idletime`` seconds, longest idle
first, never a busy one. Every test checks the exact commands; ``run`` validates the
core's invariants after every step.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockEnded,
    BlockStarted,
    Command,
    DrainAnswered,
    DrainWorker,
    Event,
    QueuesSeen,
    ReportGone,
    StartBlock,
    TargetSet,
    Tick,
)
from policies.scaling import LoadView, PoolLimits

SPEC = "spec"


def make(policy: Any = None) -> AutoscalerState:
    return AutoscalerState(
        AutoscalerConfig(), policy or policies.REGISTRY.create("scaling", "demand")
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
        StartBlock(i, "p", SPEC) for i in (1, 2, 3)
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
    assert seen[-1] == LoadView("p", 0, 1, 0, 0, 0, lim, 0, (3.0,))
    assert seen[-2] == LoadView("p", 0, 1, 0, 0, 3, lim, 3, (0.0,))  # runs nothing: idle


def test_a_pending_block_is_never_idle() -> None:
    s = make()
    run(s, TargetSet(0.0, "p", 0, SPEC, limits(init_blocks=2)))
    out = run(s, BlockStarted(0.5, 1, "block-1", ("w-1",), "pending"))
    assert out == []
    start(s, 0.6)  # block-2 running
    run(s, load(1.0, **{"w-1": 0, "w-2": 0}))
    assert s.blocks["block-1"].idle_since is None
    # Only the running block was idle 60 s: it goes, the pending one stays.
    assert run(s, load(61.0, **{"w-1": 0, "w-2": 0})) == [DrainWorker("w-2", "block-2")]
    assert s.blocks["block-1"].idle_since is None and not s.blocks["block-1"].retiring


# ----------------------------------------------------------------------------- at random


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
)
def test_the_demand_strategy_keeps_its_limits_and_drains_only_long_idle_blocks(
    lim: PoolLimits, steps: list[tuple[float, int, list[int]]]
) -> None:
    """Random loads on a virtual clock: the blocks stay within min and max (requests in
    flight included), and every block drained had been idle for max_idletime with
    every one of its workers running nothing."""
    s = make()
    now = 0.0
    run(s, TargetSet(now, "p", lim.min_blocks, SPEC, lim))
    for dt, queued, busy in steps:
        now += dt
        start(s, now)
        workers = [w for b in s.blocks.values() for w in b.workers if not b.retiring]
        processing = {w: (busy[i] if i < len(busy) else 0) for i, w in enumerate(workers)}
        for cmd in run(s, QueuesSeen(now, {"p": queued}, processing)):
            if isinstance(cmd, DrainWorker):
                b = s.blocks[cmd.block]
                assert all(processing[w] == 0 for w in b.workers), (cmd, processing)
                since = b.idle_since  # as of this event (idle from now, with 0 s)
                assert since is not None and now - since >= lim.max_idletime, (cmd, since)
        assert lim.min_blocks <= s.counts()["p"] <= lim.max_blocks, s.counts()
