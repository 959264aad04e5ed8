"""The autoscaler's lookahead: the scheduler core's next wave (waiting tasks none of whose
inputs waits) and when each of its tasks is expected to be ready, the ``demand``
strategy counting those due within one provisioning delay, and the autoscaler core
asking for their blocks. Pure cores, fed events, exact answers. (A real cluster doing
it: ``tests/test_pools.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

import policies
from actors import scheduler_state
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockRunning,
    BlockStarted,
    QueuesSeen,
    StartBlock,
    TargetSet,
)
from actors.scheduler_events import TasksRunning
from policies import PolicyParamsError
from policies.scaling import LOOKAHEAD, LoadView, PoolLimits
from tests.helpers import Factory, cancel, finish, join, leave, make_state, submit

__all__ = ["make_state"]  # the autouse fixture, used by name


def wave(s: Any) -> dict[str, list[str]]:
    return {pool: [t.key for t in w] for pool, w in s.next_wave.items() if w}


# ----------------------------------------------------------------------------- scheduler


def test_the_next_wave_leaves_out_a_task_no_configured_pool_could_run(
    make_state: Factory,
) -> None:
    """A waiting task asking for more cores than every configured pool's workers have
    is no demand for a block (``unfit_by_pool``) once ready, nor before: the lookahead
    leaves it out, so no block is asked for it ahead of time either. One a pool could
    run is looked ahead for as before."""
    s = make_state(pools=("cpu", "big"), pool_cores={"cpu": 1, "big": 8}, unknown_duration=0.5)
    table = {"in-0": [], "huge": ["in-0"], "wide": ["in-0"]}
    attrs = {"huge": {"resources": {"cores": 16}}, "wide": {"resources": {"cores": 4}}}
    submit(s, table, ["huge", "wide"], attrs=attrs)
    assert sorted(wave(s)["*"]) == ["huge", "wide"]
    assert s.upcoming(s._now) == {"big": [0.5]}  # wide's: huge fits no pool's workers


def test_the_next_wave_counts_a_task_only_some_pools_could_run_under_those_only(
    make_state: Factory,
) -> None:
    """A waiting task of no pool asking for 4 cores: 'big' (8-core workers) could run
    it, 'cpu' (1 core) could not. Under ``"*"``, the autoscaler counted it in every
    pool's lookahead, so 'cpu' had a block asked for ahead of time that could never run
    it (and idled out); it is due under 'big' alone. A reserved pool gets no task of no
    pool, however large its workers."""
    s = make_state(
        pools=("cpu", "big", "own"), pool_cores={"cpu": 1, "big": 8, "own": 8},
        reserved_pools=frozenset({"own"}), unknown_duration=0.5,
    )  # fmt: skip
    table = {"in-0": [], "wide": ["in-0"], "small": ["in-0"]}
    attrs = {"wide": {"resources": {"cores": 4}}, "small": {"resources": {"cores": 1}}}
    submit(s, table, ["wide", "small"], attrs=attrs)
    upcoming = s.upcoming(s._now)
    assert upcoming == {"big": [0.5], "*": [0.5]}  # wide's; small's
    a = AutoscalerState(AutoscalerConfig(), demand())
    limits = PoolLimits(max_blocks=4, init_blocks=0, max_idletime=60.0)
    for pool in ("cpu", "big"):
        assert a.handle(TargetSet(0.0, pool, 0, "spec", limits)) == []
    seen = QueuesSeen(1.0, {}, {}, upcoming=upcoming)
    started = [(1, "cpu"), (2, "big"), (3, "big")]
    assert a.handle(seen) == [StartBlock(i, pool, "spec") for i, pool in started]
    assert (a.pools["cpu"].desired, a.pools["big"].desired) == (1, 2)  # small; both
    a.validate()


def test_the_next_wave_is_the_waiting_tasks_whose_inputs_are_all_under_way(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, unknown_duration=0.5)
    join(s, "w1")  # one slot
    submit(s, {"build-9": []}, ["build-9"])
    finish(s, "w1", "build-9", duration=4.0)  # builds take 4 s (the category's mean)
    submit(s, {"busy-0": []}, ["busy-0"])  # w1 is busy
    table = {
        "build-0": [],
        "test-0": ["build-0"],
        "test-1": ["build-0"],
        "deploy-0": ["test-0", "test-1"],
    }
    submit(s, table, ["deploy-0"], attrs={"test-1": {"pool": "gpu"}})
    # The build is ready, the tests wait for it, the deploy for them.
    assert s.tasks["build-0"].state == "queued"
    assert wave(s) == {"*": ["test-0"], "gpu": ["test-1"]}
    # The build has not started: its tests are due in a whole build, 4 s.
    assert s.upcoming(s._now) == {"*": [4.0], "gpu": [4.0]}
    finish(s, "w1", "busy-0")  # the build runs
    sent = s.tasks["build-0"].sent
    assert s.upcoming(sent + 1.0) == {"*": [3.0], "gpu": [3.0]}
    assert s.upcoming(sent + 6.0) == {"*": [0.0], "gpu": [0.0]}  # overdue: due now
    assert s.upcoming(sent + 8.5) == {}  # past twice its mean: late, nothing known
    finish(s, "w1", "build-0", duration=4.0)
    # test-0 runs on w1, test-1 waits for a gpu worker: the deploy is the next wave. No
    # test has finished yet: each is estimated at unknown_duration (0.5 s), and test-0,
    # which runs, is late a second after it was sent.
    assert s.tasks["test-0"].state == "processing" and s.tasks["test-1"].state == "queued"
    assert wave(s) == {"*": ["deploy-0"]}
    sent = s.tasks["test-0"].sent
    assert s.upcoming(sent + 0.2) == {"*": [0.5]}  # test-1's whole 0.5 s
    assert s.upcoming(sent + 1.1) == {}
    submit(s, {"build-1": [], "test-2": ["build-1"]}, ["test-2"])
    assert wave(s) == {"*": ["deploy-0", "test-2"]}
    assert s.upcoming(sent + 1.1) == {"*": [4.0]}
    assert s.upcoming(sent + 0.2) == {"*": [0.5, 4.0]}
    assert s.upcoming(sent + 0.2, most=1) == {"*": [0.5]}  # a bounded look, oldest first


def test_an_input_s_time_left_counts_from_its_start_once_its_worker_says_it_began(
    make_state: Factory,
) -> None:
    """A try sent to a worker may wait there behind others: once the worker says it
    executes (``TasksRunning``), its time left counts from that start, not from when
    it was sent (which made its dependents look due, then late, too soon)."""
    s = make_state(saturation=1.0, unknown_duration=0.5)
    join(s, "w1")
    submit(s, {"build-9": []}, ["build-9"])
    finish(s, "w1", "build-9", duration=4.0)  # builds take 4 s
    submit(s, {"build-0": [], "test-0": ["build-0"]}, ["test-0"])
    ts = s.tasks["build-0"]
    assert ts.state == "processing" and ts.started is None
    sent = ts.sent
    assert s.upcoming(sent + 3.0) == {"*": [1.0]}  # not known to run: from when sent
    # The worker says it has executed 0.5 s, 2.5 s after it was sent: it began at +2 s.
    began = TasksRunning(
        stimulus_id="running", now=sent + 2.5, worker="w1", started=(("build-0", 0, 0.5),)
    )
    s.handle(began)
    s.validate()
    assert ts.started == sent + 2.0
    assert s.upcoming(sent + 3.0) == {"*": [3.0]}
    assert s.upcoming(sent + 8.5) == {"*": [0.0]}  # overdue, not yet late
    assert s.upcoming(sent + 10.5) == {}  # past twice its mean from its start: late


def test_a_chain_shows_one_wave_at_a_time_and_a_lost_input_takes_its_dependents_back(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    submit(s, {"a-0": [], "a-1": ["a-0"], "a-2": ["a-1"], "a-3": ["a-2"]}, ["a-3"])
    assert wave(s) == {"*": ["a-1"]}  # a-2 waits for a-1, which waits itself
    join(s, "w1")
    finish(s, "w1", "a-0")
    assert wave(s) == {"*": ["a-2"]}
    finish(s, "w1", "a-1")
    assert wave(s) == {"*": ["a-3"]}
    # w1 goes with every output while a-2 runs: a-0 and a-1 must be made again. a-1
    # waits for a-0 (ready: a-1 is the next wave), a-2 waits for a-1, a-3 for a-2.
    leave(s, "w1")
    assert [s.tasks[f"a-{i}"].state for i in range(4)] == ["queued"] + ["waiting"] * 3
    assert wave(s) == {"*": ["a-1"]}
    cancel(s, "a-3")
    assert wave(s) == {}
    assert s.upcoming(s._now) == {}


def test_the_look_at_the_next_wave_stops_at_its_budget_of_inputs(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call looks at UPCOMING_INPUTS inputs at most: a task with very many inputs
    cannot make the autoscaler's tick long on the scheduler's loop."""
    s = make_state(unknown_duration=0.5)
    table: dict[str, list[str]] = {"a-0": [], "b-0": []}
    table.update({f"c-{i}": ["a-0", "b-0"] for i in range(3)})
    submit(s, table, [f"c-{i}" for i in range(3)])  # no worker: a-0 and b-0 are ready
    assert s.upcoming(s._now) == {"*": [0.5, 0.5, 0.5]}
    monkeypatch.setattr(scheduler_state, "UPCOMING_INPUTS", 5)  # two tasks' inputs
    assert s.upcoming(s._now) == {"*": [0.5, 0.5]}


# ----------------------------------------------------------------------------- strategy


def view(
    upcoming: tuple[float, ...], provisioning: tuple[float, ...] = (), active: int = 1
) -> LoadView:
    """Pool p: ``active`` tasks on as many running blocks, none idle."""
    limits = PoolLimits(max_blocks=10, init_blocks=0, max_idletime=60.0)
    return LoadView("p", 0, active, 0, 0, 0, limits, active, (), 100.0, (), provisioning, upcoming)


def demand(**params: Any) -> Any:
    return policies.REGISTRY.create("scaling", "demand", params)


def test_the_demand_strategy_counts_the_tasks_due_within_one_provisioning_delay() -> None:
    due = (0.0, 30.0, 100.0, 250.0, 400.0)
    # No block has come up yet: LOOKAHEAD (300 s) ahead.
    assert LOOKAHEAD == 300.0
    assert demand().desired(view(due)) == 1 + 4
    # The median of the latest delays (lower: 60 of 40, 60, 90, 200): 60 s ahead.
    assert demand().desired(view(due, (200.0, 40.0, 90.0, 60.0))) == 1 + 2
    assert demand(lookahead=120).desired(view(due, (200.0,))) == 1 + 3
    assert demand(lookahead=None).desired(view(due)) == 1
    assert demand(lookahead=0).desired(view(due)) == 1
    assert demand().desired(view((), (60.0,))) == 1
    # Nothing active and nothing due soon: no block.
    assert demand().desired(view((400.0,), active=0)) == 0
    assert demand().desired(view((10.0,), active=0)) == 1
    assert demand().uses_upcoming and not demand(lookahead=None).uses_upcoming


@pytest.mark.parametrize("bad", [-1, "soon", True, float("inf"), [60]])
def test_a_bad_lookahead_is_refused_with_what_to_give(bad: Any) -> None:
    with pytest.raises(PolicyParamsError, match="lookahead must be"):
        demand(lookahead=bad)


# ----------------------------------------------------------------------------- autoscaler


def test_the_autoscaler_asks_for_the_next_waves_blocks_with_the_ready_ones() -> None:
    s = AutoscalerState(AutoscalerConfig(), demand())
    limits = PoolLimits(max_blocks=6, init_blocks=1, max_idletime=60.0)
    assert s.handle(TargetSet(0.0, "p", 0, "spec", limits)) == [StartBlock(1, "p", "spec")]
    assert s.handle(BlockStarted(0.0, 1, "block-1", ("w-1",), "pending")) == []
    assert s.handle(BlockRunning(100.0, "block-1")) == []  # a delay of 100 s learnt
    # One task runs; of the next wave, two are due within 100 s and one later, and one
    # task of any pool is due now: three more blocks.
    seen = QueuesSeen(101.0, {}, {"w-1": 1}, upcoming={"p": (20.0, 90.0, 150.0), "*": (0.0,)})
    assert s.handle(seen) == [StartBlock(i, "p", "spec") for i in (2, 3, 4)]
    assert s.pools["p"].desired == 4
    # Without the next wave in the counts, the blocks asked for stay (pending) and
    # drain only once idle: the strategy does not take them back.
    assert s.handle(QueuesSeen(102.0, {}, {"w-1": 1})) == []
    s.validate()


def test_a_try_due_at_its_block_s_walltime_brings_the_replacement_ahead_of_it() -> None:
    """The one block of a pool is drained for its walltime while a long try runs there
    that will not end by it: the scheduler has that try due at the deadline
    (tests/test_walltime.py), so the replacement is asked for once the deadline is
    within one provisioning delay, and comes up as the try is lost, not a delay after."""
    s = AutoscalerState(AutoscalerConfig(), demand())
    limits = PoolLimits(max_blocks=1, init_blocks=1, max_idletime=60.0)
    assert s.handle(TargetSet(0.0, "p", 0, "spec", limits)) == [StartBlock(1, "p", "spec")]
    assert s.handle(BlockStarted(0.0, 1, "block-1", ("w-1",), "pending")) == []
    assert s.handle(BlockRunning(20.0, "block-1")) == []  # a delay of 20 s learnt
    drained = frozenset({"w-1"})
    seen = QueuesSeen(70.0, {}, {"w-1": 1}, drained, {"p": (30.0,)}, walltime=drained)
    assert s.handle(seen) == []  # due in 30 s: later than a block takes to come up
    seen = QueuesSeen(85.0, {}, {"w-1": 1}, drained, {"p": (15.0,)}, walltime=drained)
    assert s.handle(seen) == [StartBlock(2, "p", "spec")]
    s.validate()
