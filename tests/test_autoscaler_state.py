"""Tests of the autoscaler's pure core (actors/autoscaler_state.py).

No event loop, no provider, no clock: every test feeds events with the time in them
(``now``, a virtual clock) to ``AutoscalerState.handle`` and checks the exact commands
it returns; ``run`` validates the state (``validate()``) after every step. The state
machine at the end plays provider and scheduler at random and checks the invariants and
that no block is ever stopped while a worker of it is known to the scheduler.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import policies
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockEnd,
    BlockEnded,
    BlockHeld,
    BlockLost,
    BlockRequeued,
    BlockRunning,
    BlockStarted,
    BlockStartFailed,
    BlockStopped,
    BlockStuck,
    Command,
    DrainAnswered,
    DrainWorker,
    Event,
    GaveUp,
    HoldWorkers,
    PolicyChanged,
    PolicyFailed,
    QueuesSeen,
    ReportGone,
    Resumed,
    Shutdown,
    StartBlock,
    StopBlock,
    TargetRaised,
    TargetSet,
    Tick,
    UndrainAnswered,
    UndrainWorker,
    WorkerRefused,
    WorkersLeft,
)
from policies import PolicyParamsError, PoolView
from policies.scaling import PoolLimits

SPEC = "spec"  # opaque to the core: handed back in StartBlock


def make(max_replacements: int = 10, window: float = 60.0, policy: Any = None) -> AutoscalerState:
    return AutoscalerState(AutoscalerConfig(max_replacements, window), policy)


def run(state: AutoscalerState, *events: Event) -> list[Command]:
    out = state.handle(*events)
    state.validate()
    return out


def started(state: AutoscalerState, now: float, n: int, pool: str = "default") -> None:
    """Answer the first ``n`` requests: block-<request> with worker w-<request>."""
    for request in sorted(state.requests)[:n]:
        assert state.requests[request] == pool
        out = run(state, BlockStarted(now, request, f"block-{request}", (f"w-{request}",)))
        assert out == []


def only(cmds: list[Command], kind: type) -> list[Any]:
    return [c for c in cmds if isinstance(c, kind)]


# ----------------------------------------------------------------------------- targets


def test_a_target_starts_blocks_and_answers_make_them_live() -> None:
    s = make()
    assert run(s, TargetSet(0.0, "default", 2, SPEC)) == [
        StartBlock(1, "default", SPEC),
        StartBlock(2, "default", SPEC),
    ]
    assert s.counts() == {"default": 2}  # requests count: nothing more is asked
    assert run(s, Tick(0.5)) == []
    started(s, 1.0, 2)
    assert sorted(s.blocks) == ["block-1", "block-2"]
    assert run(s, TargetSet(2.0, "default", 3, SPEC)) == [StartBlock(3, "default", SPEC)]


def test_pools_are_kept_apart() -> None:
    s = make()
    out = run(s, TargetSet(0.0, "gpu", 1, "gpu-spec"), TargetSet(0.0, "cpu", 1, "cpu-spec"))
    assert out == [StartBlock(1, "gpu", "gpu-spec"), StartBlock(2, "cpu", "cpu-spec")]
    assert run(s, TargetSet(1.0, "gpu", 0, "gpu-spec")) == []  # request 1 in flight
    assert run(s, BlockStarted(2.0, 1, "block-1", ("w-1",))) == [DrainWorker("w-1", "block-1")]
    assert s.counts() == {"gpu": 0, "cpu": 1}


def test_a_negative_or_fractional_target_is_refused() -> None:
    s = make()
    for n in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"cannot scale pool 'default' to .* blocks: "):
            s.handle(TargetSet(0.0, "default", n, SPEC))  # type: ignore[arg-type]
    assert s.pools == {} and s.requests == {}


def test_a_configured_pools_target_stays_within_min_and_max_blocks() -> None:
    """`scale cpu 99999999999` in a pool of max_blocks 2 was stored and shown (status,
    corral_blocks_target, the floor a `fit` action keeps) as 99999999999; `scale cpu 0`
    with min_blocks 1 as 0. The blocks were capped; now the target is too."""
    s = make()
    limits = PoolLimits(min_blocks=1, max_blocks=2, init_blocks=1)
    assert run(s, TargetSet(0.0, "cpu", 1, SPEC, limits)) == [StartBlock(1, "cpu", SPEC)]
    assert run(s, TargetSet(1.0, "cpu", 99_999_999_999, SPEC)) == [StartBlock(2, "cpu", SPEC)]
    assert s.pools["cpu"].target == 2 and s.counts() == {"cpu": 2}
    run(s, TargetSet(2.0, "cpu", 0, SPEC))
    assert s.pools["cpu"].target == 1
    # an unconfigured pool (no limits) keeps what it is given
    run(s, TargetSet(3.0, "default", 3, SPEC))
    assert s.pools["default"].target == 3


def test_an_unconfigured_pools_target_past_max_unconfigured_is_refused_with_nothing_changed() -> (
    None
):
    """The pool of an embedded cluster (no limits: its workers run on this machine) with
    ``max_unconfigured`` set: a target above it, set or raised for a while, is refused
    saying what to do, and the pool keeps its target and blocks; a configured pool's
    target is still kept within its own max_blocks."""
    s = AutoscalerState(AutoscalerConfig(max_unconfigured=4))
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [StartBlock(1, "default", SPEC)]
    for ev in (TargetSet(1.0, "default", 2**40, SPEC), TargetRaised(1.0, "default", 5, 9.0)):
        with pytest.raises(ValueError, match="takes at most 4 blocks here; ask for at most 4"):
            s.handle(ev)
    assert s.pools["default"].target == 1 and s.target("default") == 1
    assert s.counts() == {"default": 1} and list(s.requests) == [1]
    assert run(s, TargetSet(2.0, "default", 4, SPEC)) == [
        StartBlock(2, "default", SPEC), StartBlock(3, "default", SPEC),
        StartBlock(4, "default", SPEC),
    ]  # fmt: skip
    limits = PoolLimits(min_blocks=0, max_blocks=2, init_blocks=0)
    run(s, TargetSet(3.0, "cpu", 2**40, SPEC, limits))
    assert s.pools["cpu"].target == 2


# ----------------------------------------------------------------------------- scale in


def test_scale_in_drains_the_last_block_and_never_stops_it() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    started(s, 0.1, 2)
    assert run(s, TargetSet(1.0, "default", 1, SPEC)) == [DrainWorker("w-2", "block-2")]
    assert s.counts() == {"default": 1}
    # The scheduler drains it; the block stays until its worker, retired, exits.
    assert run(s, DrainAnswered(1.1, "w-2", True)) == []
    assert run(s, Tick(5.0)) == []
    assert "block-2" in s.blocks
    # It ends (an in-process worker's block reads "failed" once its actor stopped),
    # and the shell read in its story that the scheduler retired it: drained, not a
    # crash, and not replaced.
    assert run(s, BlockEnded(6.0, "block-2", "failed", drained=True)) == [
        ReportGone("block-2", ("w-2",), "drained", "failed")
    ]
    assert list(s.replacements) == [] and s.ended == 1


def test_a_worker_that_crashes_while_it_drains_for_a_scale_in_is_a_crash() -> None:
    """A busy worker of a block being scaled in crashes (killed, SIGKILL or the OOM
    killer) before it finished draining: the block fails and the scheduler never
    retired it (the shell reads no retirement in its story, so the end comes without
    ``drained``). Its end is ``crash``, not ``drained``: its tasks were lost, not
    handed over. Its place was given up when the scale-in began, so it is not
    replaced and spends no budget."""
    s = make(max_replacements=0)
    run(s, TargetSet(0.0, "default", 2, SPEC))
    started(s, 0.1, 2)
    assert run(s, TargetSet(1.0, "default", 1, SPEC)) == [DrainWorker("w-2", "block-2")]
    assert run(s, DrainAnswered(1.1, "w-2", True)) == []
    busy = {"w-1": 0, "w-2": 1}  # w-2 still at its task: draining, not retired
    assert run(s, QueuesSeen(2.0, {}, busy, frozenset({"w-2"}))) == []
    assert run(s, BlockEnded(3.0, "block-2", "failed")) == [
        ReportGone("block-2", ("w-2",), "crash", "failed")
    ]
    assert s.ends[-1] == BlockEnd("block-2", "default", "failed", "crash", False, 3.0)
    assert list(s.replacements) == [] and s.gave_up == set()
    assert s.counts() == {"default": 1} and list(s.blocks) == ["block-1"]


def test_a_failed_end_of_a_scale_in_without_the_stories_is_not_called_a_crash() -> None:
    """The scheduler did not answer the shell's question about the workers' stories in
    time (``known=False``): whether it retired the worker is not known, so the failed
    end of a block being scaled in is the drain's, as an in-process block's always
    reads: a crash is reported only when the stories show one."""
    s = make(max_replacements=0)
    run(s, TargetSet(0.0, "default", 2, SPEC))
    started(s, 0.1, 2)
    assert run(s, TargetSet(1.0, "default", 1, SPEC)) == [DrainWorker("w-2", "block-2")]
    assert run(s, DrainAnswered(1.1, "w-2", True)) == []
    assert run(s, BlockEnded(2.0, "block-2", "failed", known=False)) == [
        ReportGone("block-2", ("w-2",), "drained", "failed")
    ]


def test_a_pending_block_goes_first_and_is_stopped_at_once() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1",)))
    run(s, BlockStarted(0.1, 2, "block-2", (), "pending"))  # e.g. queued in a batch system
    assert run(s, TargetSet(1.0, "default", 1, SPEC)) == [StopBlock("block-2")]
    assert run(s, BlockStopped(1.5, "block-2")) == []
    assert run(s, BlockEnded(1.6, "block-2", "scaled-in")) == []  # the watcher, late
    assert sorted(s.blocks) == ["block-1"] and s.ended == 1


def test_a_pending_block_with_workers_is_asked_before_it_is_stopped() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1",), "pending"))
    run(s, BlockStarted(0.1, 2, "block-2", ("w-2",), "pending"))
    # The core has not heard that they run: their workers are asked, not stopped.
    assert run(s, TargetSet(1.0, "default", 0, SPEC)) == [
        DrainWorker("w-1", "block-1"),
        DrainWorker("w-2", "block-2"),
    ]
    assert run(s, DrainAnswered(1.1, "w-2", False)) == [StopBlock("block-2")]  # never joined
    assert run(s, DrainAnswered(1.2, "w-1", True)) == []  # joined meanwhile: drained
    assert run(s, BlockEnded(9.0, "block-1", "completed")) == [
        ReportGone("block-1", ("w-1",), "drained", "completed")
    ]


def test_a_block_whose_workers_never_joined_is_stopped() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b")))
    assert run(s, TargetSet(1.0, "default", 0, SPEC)) == [
        DrainWorker("w-1a", "block-1"),
        DrainWorker("w-1b", "block-1"),
    ]
    assert run(s, DrainAnswered(1.1, "w-1a", False)) == []  # one answer: wait for both
    assert run(s, DrainAnswered(1.2, "w-1b", False)) == [StopBlock("block-1")]


def test_a_block_with_a_known_worker_is_never_stopped_on_scale_in() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b")))
    run(s, TargetSet(1.0, "default", 0, SPEC))
    assert run(s, DrainAnswered(1.1, "w-1a", False), DrainAnswered(1.2, "w-1b", True)) == []
    assert run(s, BlockEnded(9.0, "block-1", "completed")) == [
        ReportGone("block-1", ("w-1a", "w-1b"), "drained", "completed")
    ]


def test_scaling_out_again_does_not_take_back_a_block_whose_drain_is_unanswered() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    assert run(s, TargetSet(1.0, "default", 0, SPEC)) == [DrainWorker("w-1", "block-1")]
    assert run(s, TargetSet(2.0, "default", 1, SPEC)) == [StartBlock(2, "default", SPEC)]


BUILD = PoolLimits(0, 2, 1)  # the audit's pool: max_blocks 2


def drained_busy_then_idle(s: AutoscalerState, pool: str = "default") -> None:
    """Two blocks of ``pool`` run a task each; a ``restore`` sets the target back to 0
    and both are drained while busy; then their tasks end, but they stay (their outputs
    are held by the client and no worker stays to take a copy), idle, while two new
    tasks wait in the queue."""
    run(s, TargetSet(0.0, pool, 2, SPEC, BUILD))
    started(s, 0.1, 2, pool)
    run(s, QueuesSeen(1.0, {pool: 0}, {"w-1": 1, "w-2": 1}))
    assert run(s, TargetSet(2.0, pool, 0, SPEC)) == [
        DrainWorker("w-1", "block-1"),
        DrainWorker("w-2", "block-2"),
    ]
    assert run(s, DrainAnswered(2.1, "w-1", True), DrainAnswered(2.1, "w-2", True)) == []
    seen = QueuesSeen(30.0, {pool: 2}, {"w-1": 0, "w-2": 0}, frozenset({"w-1", "w-2"}))
    assert run(s, seen) == []
    assert s.counts() == {pool: 0} and all(b.retiring for b in s.blocks.values())


def test_a_pool_that_wants_blocks_again_takes_its_draining_ones_back_first() -> None:
    """A user audit (fixed scaling, a queue-time rule's ``fit`` scale-out with
    ``restore``): the alert fires again and sets the target to 2 while the two drained
    blocks are still there. They are taken back (their workers un-drained: they take
    the queued tasks), count against max_blocks 2, and no block is started: before,
    two new blocks were started beside them, four blocks paid on a pool of two."""
    s = make()
    drained_busy_then_idle(s)
    assert run(s, TargetSet(40.0, "default", 2, SPEC)) == [
        UndrainWorker("w-1", "block-1"),
        UndrainWorker("w-2", "block-2"),
    ]
    assert s.counts() == {"default": 2} and s.requests == {}
    assert s.taken_back == {"default": 2}
    assert s.block_metrics(40.0, {})["default"]["taken_back"] == 2
    assert not any(b.retiring for b in s.blocks.values())
    assert run(s, UndrainAnswered(40.1, "w-1", True), UndrainAnswered(40.1, "w-2", True)) == []
    # They work again: later counts neither drain them nor start anything.
    assert run(s, QueuesSeen(41.0, {"default": 0}, {"w-1": 1, "w-2": 1})) == []
    assert s.counts() == {"default": 2} and s.requests == {}
    # Scaled in again later, they are drained as any block (and end as drained).
    assert run(s, TargetSet(50.0, "default", 0, SPEC)) == [
        DrainWorker("w-1", "block-1"),
        DrainWorker("w-2", "block-2"),
    ]


def scaled_out_and_busy() -> AutoscalerState:
    """A queue alert's ``fit`` scale-out on a fixed pool (target 1 -> 3): block-2 and
    block-3 join at 16 s and take the queued tasks at once; every block is busy."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC, PoolLimits(0, 3, 1)))
    started(s, 0.1, 1)
    assert run(s, TargetSet(1.0, "default", 3, SPEC)) == [
        StartBlock(2, "default", SPEC),
        StartBlock(3, "default", SPEC),
    ]
    started(s, 16.0, 2)
    assert run(s, QueuesSeen(16.5, {"default": 0}, {"w-1": 1, "w-2": 2, "w-3": 1})) == []
    return s


def test_a_restore_drains_no_block_that_runs_tasks_they_go_as_they_go_idle() -> None:
    """The alert resolves once the blocks it added took the queue, and its ``restore``
    sets the target back to 1 at 17 s, a second after they joined. Before, the core
    drained the two busy blocks then (the last by id), as for an operator's scale: their
    outputs were copied off and the tasks reading them ran elsewhere. Now a target set
    back by a restore (``idle_only``) scales in only blocks that run nothing: block-3,
    idle at the next count, goes then; block-2 at the first count that shows it idle."""
    t = scaled_out_and_busy()  # an operator's scale to 1 drains busy blocks at once
    assert run(t, TargetSet(17.0, "default", 1, SPEC)) == [
        DrainWorker("w-2", "block-2"),
        DrainWorker("w-3", "block-3"),
    ]
    s = scaled_out_and_busy()  # a restore drains none of them while they run tasks
    assert run(s, TargetSet(17.0, "default", 1, SPEC, idle_only=True)) == []
    assert s.counts() == {"default": 3} and s.pools["default"].desired == 1
    assert run(s, QueuesSeen(18.0, {"default": 0}, {"w-1": 1, "w-2": 1, "w-3": 0})) == [
        DrainWorker("w-3", "block-3")
    ]
    assert run(s, QueuesSeen(19.0, {"default": 0}, {"w-1": 1, "w-2": 1, "w-3": 0})) == []
    assert run(s, QueuesSeen(30.0, {"default": 0}, {"w-1": 1, "w-2": 0, "w-3": 0})) == [
        DrainWorker("w-2", "block-2")
    ]
    assert s.counts() == {"default": 1}
    # Wanted again meanwhile: the busy blocks it kept count, nothing is started; a later
    # operator's scale drains busy blocks again.
    u = scaled_out_and_busy()
    run(u, TargetSet(17.0, "default", 1, SPEC, idle_only=True))
    assert run(u, TargetSet(20.0, "default", 3, SPEC)) == [] and u.counts() == {"default": 3}
    assert run(u, TargetSet(21.0, "default", 2, SPEC)) == [DrainWorker("w-3", "block-3")]


def test_a_pool_short_of_its_draining_blocks_takes_them_back_and_starts_the_rest() -> None:
    """Mixed: one drained block is there, the target asks for three: the one is taken
    back, two are started; with max_blocks 2 only one is started."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC, PoolLimits(0, 3, 1)))
    started(s, 0.1, 1)
    assert run(s, TargetSet(1.0, "default", 0, SPEC)) == [DrainWorker("w-1", "block-1")]
    run(s, DrainAnswered(1.1, "w-1", True))
    assert run(s, TargetSet(2.0, "default", 3, SPEC)) == [
        UndrainWorker("w-1", "block-1"),
        StartBlock(2, "default", SPEC),
        StartBlock(3, "default", SPEC),
    ]
    t = make()
    run(t, TargetSet(0.0, "default", 1, SPEC, BUILD))
    started(t, 0.1, 1)
    run(t, TargetSet(1.0, "default", 0, SPEC), DrainAnswered(1.1, "w-1", True))
    assert run(t, TargetSet(2.0, "default", 3, SPEC)) == [
        UndrainWorker("w-1", "block-1"),
        StartBlock(2, "default", SPEC),
    ]
    assert t.counts() == {"default": 2}


def test_only_as_many_draining_blocks_as_wanted_are_taken_back_the_busiest_first() -> None:
    s = make()
    drained_busy_then_idle(s)
    run(s, QueuesSeen(31.0, {"default": 2}, {"w-1": 0, "w-2": 1}, frozenset({"w-1", "w-2"})))
    assert run(s, TargetSet(40.0, "default", 1, SPEC)) == [UndrainWorker("w-2", "block-2")]
    assert [b.block_id for b in s.live("default")] == ["block-2"]
    assert s.blocks["block-1"].retiring


def test_a_refused_take_back_drains_the_block_again_for_good_and_replaces_it() -> None:
    """The scheduler retired the worker meanwhile (or it is gone): the block is scaled in
    again, never taken back, and the pool gets a new block instead."""
    s = make()
    drained_busy_then_idle(s)
    run(s, TargetSet(40.0, "default", 2, SPEC))
    assert run(s, UndrainAnswered(40.1, "w-1", True)) == []
    assert run(s, UndrainAnswered(40.1, "w-2", False, "it was retired (told to stop)")) == [
        DrainWorker("w-2", "block-2"),
        StartBlock(3, "default", SPEC),
    ]
    assert s.blocks["block-2"].leaves and s.blocks["block-2"].retiring
    # Only the block taken back counts (corral_blocks_taken_back_total): not the refused.
    assert s.block_metrics(40.1, {})["default"]["taken_back"] == 1
    run(s, DrainAnswered(40.2, "w-2", True))
    assert run(s, TargetSet(41.0, "default", 0, SPEC)) == [DrainWorker("w-1", "block-1")]
    run(s, DrainAnswered(41.1, "w-1", True))
    # block-2 leaves for good; block-1 is taken back, and the request in flight that
    # was cancelled at 41.0 counts again: nothing is started.
    assert run(s, TargetSet(42.0, "default", 2, SPEC)) == [UndrainWorker("w-1", "block-1")]
    assert s.counts() == {"default": 2} and s.cancelled == set()
    assert s.taken_back == {"default": 2}  # block-1 twice


def test_blocks_going_for_good_or_drained_by_others_are_not_taken_back() -> None:
    """Not the core's own scale-in, or a worker going for good as the latest count says
    (retired, leaving on its own, drained for its walltime or tasks_per_worker): new
    blocks are started instead."""
    for going in ("retired", "leaving", "walltime", "spent"):
        s = make()
        drained_busy_then_idle(s)
        both = frozenset({"w-1", "w-2"})
        run(s, QueuesSeen(31.0, {"default": 2}, {"w-1": 0, "w-2": 0}, both,
                          **{going: frozenset({"w-1"})}))  # fmt: skip
        assert run(s, TargetSet(40.0, "default", 2, SPEC)) == [
            UndrainWorker("w-2", "block-2"),
            StartBlock(3, "default", SPEC),
        ], going
    # An operator's drain (the scheduler drains a block's workers on its own): the
    # block stops counting and is replaced; it is not taken back.
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    assert run(s, QueuesSeen(1.0, {}, {"w-1": 1}, frozenset({"w-1"}))) == [
        StartBlock(2, "default", SPEC)
    ]
    # A worker of the block that is no longer in the scheduler's counts: gone.
    s = make()
    drained_busy_then_idle(s)
    run(s, QueuesSeen(31.0, {"default": 2}, {"w-2": 0}, frozenset({"w-2"})))
    assert run(s, TargetSet(40.0, "default", 2, SPEC)) == [
        UndrainWorker("w-2", "block-2"),
        StartBlock(3, "default", SPEC),
    ]


def test_a_block_an_operator_takes_back_counts_again_and_its_replacement_goes() -> None:
    """An operator drained block-1's worker (the console's ``drain``): it stopped
    counting and block-2 replaced it. The operator then takes it back (``undrain``):
    the next count shows it known and no longer draining. It counts again, so the pool
    has a block too many and the idle one, the replacement, is scaled in. Before, the
    core held block-1 as retiring for good: it ran tasks uncounted and never ended."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    assert run(s, QueuesSeen(1.0, {}, {"w-1": 1}, frozenset({"w-1"}))) == [
        StartBlock(2, "default", SPEC)
    ]
    started(s, 1.1, 1)
    assert s.blocks["block-1"].retiring and s.counts() == {"default": 1}
    assert run(s, QueuesSeen(2.0, {}, {"w-1": 1, "w-2": 0})) == [DrainWorker("w-2", "block-2")]
    b = s.blocks["block-1"]
    assert not b.retiring and not b.drained and not b.sched_drained
    assert [x.block_id for x in s.live("default")] == ["block-1"]
    # The operator's take-back, not the core's: corral_blocks_taken_back_total{by=operator}
    assert s.taken_back == {} and s.taken_back_by_operator == {"default": 1}
    m = s.block_metrics(2.0, {})["default"]
    assert (m["taken_back"], m["taken_back_by_operator"]) == (0, 1)


def test_a_scaled_in_block_an_operator_takes_back_counts_again_for_the_policy() -> None:
    """The core scaled both blocks in (target 0); the operator takes w-1 back. Its
    block counts again and the policy decides: the fixed target 0 scales it in again
    (a drain, as any block's). Later, wanted again, it is a live block: nothing is
    asked of the scheduler (before, it was taken back by an UndrainWorker, which the
    scheduler refused as the worker was not draining, and the block was drained for
    good and replaced)."""
    s = make()
    drained_busy_then_idle(s)
    undone = QueuesSeen(31.0, {"default": 0}, {"w-1": 1, "w-2": 0}, frozenset({"w-2"}))
    assert run(s, undone) == [DrainWorker("w-1", "block-1")]
    assert s.blocks["block-2"].retiring and s.blocks["block-2"].drained == {"w-2"}
    # With a target of 1 meanwhile, block-1 stays counted: no drain, nothing started.
    t = make()
    drained_busy_then_idle(t)
    t.pools["default"].target = 1  # (as a TargetSet would, without its take-back)
    assert run(t, undone) == []
    assert [b.block_id for b in t.live("default")] == ["block-1"]
    assert t.counts() == {"default": 1} and t.requests == {}
    assert t.taken_back == {} and t.taken_back_by_operator == {"default": 1}
    # A count made before the drain showed (w-2 not yet seen draining) is no undrain.
    u = make()
    run(u, TargetSet(0.0, "default", 1, SPEC))
    started(u, 0.1, 1)
    run(u, TargetSet(1.0, "default", 0, SPEC), DrainAnswered(1.1, "w-1", True))
    assert run(u, QueuesSeen(1.2, {}, {"w-1": 1})) == [] and u.blocks["block-1"].retiring


def two_blocks_of_two_one_scaled_in() -> AutoscalerState:
    """Two blocks of two workers each, all busy, under a fixed target 2; the operator
    scales the pool to 1: block-2 (the last by id, all busy) is drained, both its
    workers, and a count shows them draining."""
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC, PoolLimits(0, 4, 2)))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b")))
    run(s, BlockStarted(0.1, 2, "block-2", ("w-2a", "w-2b")))
    busy = {"w-1a": 1, "w-1b": 1, "w-2a": 1, "w-2b": 1}
    run(s, QueuesSeen(1.0, {"default": 0}, busy))
    assert run(s, TargetSet(2.0, "default", 1, SPEC)) == [
        DrainWorker("w-2a", "block-2"),
        DrainWorker("w-2b", "block-2"),
    ]
    run(s, DrainAnswered(2.1, "w-2a", True), DrainAnswered(2.1, "w-2b", True))
    both = frozenset({"w-2a", "w-2b"})
    assert run(s, QueuesSeen(3.0, {"default": 0}, busy, both)) == []
    return s


def test_an_operator_taking_back_one_worker_of_a_scaled_in_block_takes_the_block_back() -> None:
    """A block of several workers scaled in by the core, one of whose workers an
    operator takes back (``undrain w-2a``): the block counts again, so its other
    worker, which the core drained, is un-drained too (a block counted whole works
    whole). Meanwhile block-1 went idle: the pool has a block too many and block-1 is
    scaled in. Before, w-2b was left draining: it would be retired and leave, and
    block-2 counted as a whole block with one worker in it."""
    s = two_blocks_of_two_one_scaled_in()
    seen = {"w-1a": 0, "w-1b": 0, "w-2a": 1, "w-2b": 1}
    assert run(s, QueuesSeen(4.0, {"default": 0}, seen, frozenset({"w-2b"}))) == [
        DrainWorker("w-1a", "block-1"),
        DrainWorker("w-1b", "block-1"),
        UndrainWorker("w-2b", "block-2"),
    ]
    assert [b.block_id for b in s.live("default")] == ["block-2"]
    assert s.taken_back == {} and s.taken_back_by_operator == {"default": 1}
    assert run(s, UndrainAnswered(4.1, "w-2b", True)) == []
    # Refused (w-2b retired meanwhile): the operator's worker works on, its block counted.
    t = two_blocks_of_two_one_scaled_in()
    run(t, QueuesSeen(4.0, {"default": 0}, seen, frozenset({"w-2b"})))
    assert run(t, UndrainAnswered(4.1, "w-2b", False, "it was retired (told to stop)")) == []
    assert [b.block_id for b in t.live("default")] == ["block-2"]
    assert t.taken_back == {} and t.taken_back_by_operator == {"default": 1}
    # A worker going for good (retired as the count says) is not asked.
    u = two_blocks_of_two_one_scaled_in()
    retired = frozenset({"w-2b"})
    assert run(u, QueuesSeen(4.0, {"default": 0}, seen, retired, retired=retired)) == [
        DrainWorker("w-1a", "block-1"),
        DrainWorker("w-1b", "block-1"),
    ]
    # Not kept by the proposal (block-1 busy, the last by id goes): drained again
    # whole, nothing un-drained.
    v = two_blocks_of_two_one_scaled_in()
    busy = {"w-1a": 1, "w-1b": 1, "w-2a": 1, "w-2b": 1}
    assert run(v, QueuesSeen(4.0, {"default": 0}, busy, frozenset({"w-2b"}))) == [
        DrainWorker("w-2a", "block-2"),
        DrainWorker("w-2b", "block-2"),
    ]


def test_an_operator_taking_back_one_worker_of_a_block_it_drained_leaves_the_others() -> None:
    """The operator drained both workers of block-1 (``drain`` twice: the block stops
    counting and block-2 replaces it), then takes one back: the block counts again,
    and the other worker's drain, the operator's own, is left as it is."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b")))
    both = frozenset({"w-1a", "w-1b"})
    assert run(s, QueuesSeen(1.0, {}, {"w-1a": 1, "w-1b": 1}, both)) == [
        StartBlock(2, "default", SPEC)
    ]
    run(s, BlockStarted(1.1, 2, "block-2", ("w-2",)))
    seen = {"w-1a": 1, "w-1b": 1, "w-2": 1}
    assert run(s, QueuesSeen(2.0, {}, seen, frozenset({"w-1b"}))) == [DrainWorker("w-2", "block-2")]
    assert s.taken_back_by_operator == {"default": 1}


# ----------------------------------------------------------------------------- replacements


def test_a_block_that_ends_unasked_is_reported_and_replaced() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    started(s, 0.1, 2)
    assert run(s, BlockEnded(5.0, "block-1", "failed")) == [
        ReportGone("block-1", ("w-1",), "crash", "failed"),
        StartBlock(3, "default", SPEC),
    ]
    # Completed with nothing to explain it: replaced at once; its cause waits for its
    # worker's leave (a walltime signal's may come after the end), at most
    # leave_grace (10 s): then unknown, charged, listed at the time it ended.
    assert run(s, BlockEnded(6.0, "block-2", "completed")) == [StartBlock(4, "default", SPEC)]
    assert run(s, Tick(15.9)) == [] and s.spent() == 1
    assert run(s, Tick(16.0)) == [ReportGone("block-2", ("w-2",), "unknown", "completed")]
    assert s.ends[-1] == BlockEnd("block-2", "default", "completed", "unknown", True, 6.0)
    assert list(s.replacements["default"]) == [5.0, 16.0] and s.spent() == 2


def test_a_block_killed_for_memory_loses_its_workers_with_cause_oom() -> None:
    """Slurm ended the job OUT_OF_MEMORY (the provider's block state ``oom``): the
    workers are lost with the documented cause ``oom``, not ``crash``; replaced, and
    charged to the budget (the next block may be killed the same way: a loop)."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b")))
    assert run(s, BlockEnded(5.0, "block-1", "oom")) == [
        ReportGone("block-1", ("w-1a", "w-1b"), "oom", "oom"),
        StartBlock(2, "default", SPEC),
    ]
    assert s.ends[-1] == BlockEnd("block-1", "default", "oom", "oom", True, 5.0)
    assert s.spent() == 1


def test_a_block_killed_for_memory_while_it_drains_is_oom() -> None:
    """Being scaled in, its worker still busy: killed for memory before its drain
    finished, its loss is ``oom`` (not ``drained``, nor ``crash``); not replaced."""
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    started(s, 0.1, 2)
    assert run(s, TargetSet(1.0, "default", 1, SPEC)) == [DrainWorker("w-2", "block-2")]
    assert run(s, DrainAnswered(1.1, "w-2", True)) == []
    assert run(s, BlockEnded(3.0, "block-2", "oom")) == [
        ReportGone("block-2", ("w-2",), "oom", "oom")
    ]
    assert s.ends[-1] == BlockEnd("block-2", "default", "oom", "oom", False, 3.0)
    assert list(s.replacements) == []


def test_the_replacement_budget_gives_up_and_a_new_target_restores_it() -> None:
    s = make(max_replacements=2, window=10.0)
    run(s, TargetSet(0.0, "default", 1, SPEC))
    for i, now in enumerate((1.0, 2.0), start=1):
        run(s, BlockStarted(now, i, f"block-{i}", (f"w-{i}",)))
        assert run(s, BlockEnded(now + 0.5, f"block-{i}", "failed")) == [
            ReportGone(f"block-{i}", (f"w-{i}",), "crash", "failed"),
            StartBlock(i + 1, "default", SPEC),
        ]
    run(s, BlockStarted(3.0, 3, "block-3", ("w-3",)))
    assert run(s, BlockEnded(3.5, "block-3", "failed")) == [
        ReportGone("block-3", ("w-3",), "crash", "failed"),
        GaveUp("default", 3, 10.0),
    ]
    assert s.gave_up == {"default"}
    # Time alone does not restore it (the window empties, the pool stays given up).
    assert run(s, Tick(100.0)) == []
    assert list(s.replacements) == []
    assert run(s, TargetSet(101.0, "default", 1, SPEC)) == [StartBlock(4, "default", SPEC)]
    assert s.gave_up == set()


def test_a_block_whose_worker_the_manager_refused_is_no_crash_and_its_pool_gives_up() -> None:
    """A pool whose workers run another Corral protocol version: the manager refuses
    each at its Hello and it exits 1. That end was a ``crash``, spending the budget,
    replaced every few seconds until the pool gave up as "workers keep ending" (the
    CorralBlocksFailing alert on the way). Now it is ``refused``, free, and the pool
    gives up at its first such end, saying to install the manager's Corral."""
    s = make(max_replacements=10, window=60.0)
    run(s, TargetSet(0.0, "cpu", 1, SPEC), TargetSet(0.0, "gpu", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "cpu-1", ("c1",)), BlockStarted(0.1, 2, "gpu-1", ("g1",)))
    reason = "the manager refused this worker ('c1'): it speaks Corral protocol 3"
    assert run(s, WorkerRefused(1.0, "c1", reason), WorkerRefused(1.0, "nobody", "x")) == []
    out = run(s, BlockEnded(2.0, "cpu-1", "failed", detail="c1 failed: exit code 1"))
    latest = (
        f"cpu-1 ended failed (refused): {reason}. Each block of pool 'cpu' would be "
        "refused the same way, so none is started any more: install the manager's Corral "
        "where the pool's workers run (the same release or checkout), then `resume cpu`"
    )
    assert out == [
        ReportGone("cpu-1", ("c1",), "refused", "failed", "c1 failed: exit code 1"),
        GaveUp("cpu", 1, 60.0, latest, refused=True),
    ]
    assert s.gave_up == {"cpu"} and s.last_failure["cpu"] == latest
    assert s.ends[-1].cause == "refused" and not s.ends[-1].charged
    assert (s.spent("cpu"), s.failed.get("cpu", 0)) == (0, 0)  # no crash loop counted
    # The other pool's crash is a crash, replaced as before.
    assert run(s, BlockEnded(3.0, "gpu-1", "failed")) == [
        ReportGone("gpu-1", ("g1",), "crash", "failed"),
        StartBlock(3, "gpu", SPEC),
    ]
    # Resumed (the install fixed): it asks again, and a block of it that crashes then,
    # with no refusal, is a crash.
    assert run(s, Resumed(4.0, "cpu")) == [StartBlock(4, "cpu", SPEC)]
    run(s, BlockStarted(4.5, 4, "cpu-2", ("c2",)))
    (gone,) = only(run(s, BlockEnded(5.0, "cpu-2", "failed")), ReportGone)
    assert gone.cause == "crash" and s.spent("cpu") == 1


def test_each_pool_has_its_own_replacement_budget() -> None:
    """A pool that crash-loops gives up; another pool's first crash is replaced (before,
    the budget was shared: the healthy pool gave up on its first crash)."""
    s = make(max_replacements=3, window=60.0)
    run(s, TargetSet(0.0, "gpu", 1, SPEC), TargetSet(0.0, "cpu", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "gpu-1", ("g1",)), BlockStarted(0.1, 2, "cpu-1", ("c1",)))
    for i in range(1, 4):
        (replaced,) = only(run(s, BlockEnded(float(i), f"gpu-{i}", "failed")), StartBlock)
        run(s, BlockStarted(i + 0.5, replaced.request, f"gpu-{i + 1}", (f"g{i + 1}",)))
    assert run(s, BlockEnded(4.0, "gpu-4", "failed")) == [
        ReportGone("gpu-4", ("g4",), "crash", "failed"),
        GaveUp("gpu", 4, 60.0),
    ]
    assert run(s, BlockEnded(10.0, "cpu-1", "failed")) == [
        ReportGone("cpu-1", ("c1",), "crash", "failed"),
        StartBlock(6, "cpu", SPEC),
    ]
    assert s.gave_up == {"gpu"}
    assert (s.spent("gpu"), s.spent("cpu"), s.spent()) == (4, 1, 5)
    run(s, Tick(100.0))  # the window slid past them all
    assert (s.spent(), s.replacements) == (0, {})


def test_a_suspended_block_holds_its_workers_until_it_runs_again() -> None:
    """Slurm suspended a running block (SUSPENDED: held): the scheduler is told to give
    its workers no new tasks, and told again when it resumes. Meanwhile it counts as
    before, is never stuck (its provisioning timeout counts from its request, long
    past) and its resume is no provisioning delay."""
    s = make()
    limits = PoolLimits(0, 3, 1, provisioning_timeout=30.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC, limits))
    run(s, BlockStarted(1.0, 1, "ckpt-2", ("ckpt-2.0", "ckpt-2.1")))
    assert run(s, BlockHeld(100.0, "ckpt-2")) == [
        HoldWorkers("ckpt-2", ("ckpt-2.0", "ckpt-2.1"), True)
    ]
    assert s.blocks["ckpt-2"].state == "held" and s.counts() == {"ckpt": 1}
    assert run(s, BlockHeld(101.0, "ckpt-2"), Tick(200.0)) == []  # told once; not stuck
    assert s.block_metrics(200.0, {})["ckpt"]["oldest_pending"] == 0.0
    assert run(s, BlockRunning(228.0, "ckpt-2")) == [
        HoldWorkers("ckpt-2", ("ckpt-2.0", "ckpt-2.1"), False)
    ]
    assert list(s.pools["ckpt"].provisioning) == [1.0]  # its start only, not its resume
    # A block held before it ever ran (pending-like) is not the scheduler's business.
    run(s, TargetSet(229.0, "ckpt", 2, SPEC))
    assert run(s, BlockStarted(230.0, 2, "ckpt-3", ("ckpt-3.0",), "held")) == []
    assert run(s, BlockHeld(230.5, "ckpt-3")) == []
    assert run(s, BlockRunning(231.0, "ckpt-3")) == []
    # Suspended before the provider saw it run, its workers joined already (the
    # scheduler's counts show them): suspended all the same.
    run(s, TargetSet(232.0, "ckpt", 3, SPEC))
    run(s, BlockStarted(233.0, 3, "ckpt-4", ("ckpt-4.0",), "pending"))
    assert run(s, BlockHeld(234.0, "ckpt-4")) == []  # none of its workers joined
    run(s, QueuesSeen(235.0, {}, {"ckpt-2.0": 0, "ckpt-2.1": 0, "ckpt-4.0": 1}))
    assert run(s, BlockHeld(236.0, "ckpt-4")) == [HoldWorkers("ckpt-4", ("ckpt-4.0",), True)]


def test_a_block_requeued_while_being_scaled_in_is_stopped() -> None:
    """Slurm requeued a block whose worker was draining: the new run's worker would
    join afresh and take tasks, and nothing would drain it. It is stopped instead."""
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    started(s, 1.0, 2)
    assert run(s, TargetSet(2.0, "default", 1, SPEC)) == [DrainWorker("w-2", "block-2")]
    assert run(s, DrainAnswered(2.1, "w-2", True)) == []
    assert run(s, BlockRequeued(3.0, "block-2", 2, "preempted")) == [
        ReportGone("block-2", ("w-2",), "preempted", "requeued"),
        StopBlock("block-2"),
    ]
    # not being scaled in: a requeued block stays
    assert run(s, BlockRequeued(4.0, "block-1", 2, "preempted")) == [
        ReportGone("block-1", ("w-1",), "preempted", "requeued"),
    ]


def test_a_worker_unknown_when_drained_is_drained_once_it_joins() -> None:
    """A block of two workers is scaled in while one of them has not joined yet: once
    the scheduler's counts show it, it is asked to drain too (before, nothing ever
    drained or stopped it, and it took tasks until the block's walltime)."""
    s = make()
    run(s, TargetSet(0.0, "p", 2, SPEC))
    run(s, BlockStarted(1.0, 1, "b1", ("b1-w0", "b1-w1")))
    run(s, BlockStarted(1.0, 2, "b2", ("b2-w0", "b2-w1")))
    assert run(s, TargetSet(2.0, "p", 1, SPEC)) == [
        DrainWorker("b2-w0", "b2"),
        DrainWorker("b2-w1", "b2"),
    ]
    assert run(s, DrainAnswered(2.1, "b2-w0", True), DrainAnswered(2.1, "b2-w1", False)) == []
    assert run(s, QueuesSeen(10.0, {"p": 5}, {"b1-w0": 1, "b1-w1": 1, "b2-w0": 0})) == []
    seen = {"b1-w0": 1, "b1-w1": 1, "b2-w1": 0}
    assert run(s, QueuesSeen(32.0, {"p": 5}, seen)) == [DrainWorker("b2-w1", "b2")]
    assert run(s, QueuesSeen(33.0, {"p": 5}, seen)) == []  # asked once
    assert run(s, DrainAnswered(33.1, "b2-w1", True)) == []
    assert s.blocks["b2"].drained == {"b2-w0", "b2-w1"}


def test_blocks_are_scaled_in_the_last_as_people_count_not_as_text_sorts() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 10, SPEC))
    started(s, 1.0, 10)
    # block-10 is the newest; as text it sorts before block-2
    assert run(s, TargetSet(2.0, "default", 9, SPEC)) == [DrainWorker("w-10", "block-10")]


def test_ends_spread_wider_than_the_window_are_always_replaced() -> None:
    s = make(max_replacements=1, window=10.0)
    run(s, TargetSet(0.0, "default", 1, SPEC))
    for i in range(1, 6):
        now = 11.0 * i  # one end per window
        run(s, BlockStarted(now, i, f"block-{i}", (f"w-{i}",)))
        out = run(s, BlockEnded(now + 1.0, f"block-{i}", "failed"))
        assert out[-1] == StartBlock(i + 1, "default", SPEC), (i, out)
    assert s.gave_up == set()


def test_a_suspended_pool_says_why_in_its_metrics() -> None:
    """CorralPoolSuspended's description reads ``suspended_why``: the batch system's
    latest refusal for a paused pool, the latest failed block for one that gave up; ""
    while the pool asks, and again once it is resumed or its target set."""
    s = make(max_replacements=1)
    run(s, TargetSet(0.0, "default", 1, SPEC))
    assert s.block_metrics(0.0, {})["default"]["suspended_why"] == ""
    run(s, BlockStartFailed(0.1, 1, "RuntimeError('no python')"))
    run(s, BlockStarted(0.2, 2, "block-2", ("w-2",)))
    run(s, BlockEnded(0.3, "block-2", "failed", detail="exit 127\nmodule: command not found"))
    assert s.gave_up == {"default"}
    assert s.block_metrics(0.3, {})["default"]["suspended_why"] == (
        "its blocks kept ending; the latest: block-2 ended failed (crash): exit 127\n"
        "module: command not found"
    )
    run(s, TargetSet(1.0, "default", 1, SPEC))
    assert s.block_metrics(1.0, {})["default"]["suspended_why"] == ""
    (request,) = list(s.requests)
    run(s, BlockStartFailed(1.1, request, "sbatch: Invalid account", command="sbatch",
                            suspended=True))  # fmt: skip
    metrics = s.block_metrics(1.1, {})["default"]
    assert metrics["suspended"] == 1
    assert metrics["suspended_why"] == (
        "its batch system refused its submissions: sbatch: Invalid account"
    )
    run(s, Resumed(2.0, "default"))
    assert s.block_metrics(2.0, {})["default"]["suspended_why"] == ""


def test_a_failed_start_counts_against_the_budget() -> None:
    s = make(max_replacements=1)
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [StartBlock(1, "default", SPEC)]
    assert run(s, BlockStartFailed(0.1, 1, "RuntimeError()")) == [StartBlock(2, "default", SPEC)]
    assert run(s, BlockStartFailed(0.2, 2, "RuntimeError()")) == [GaveUp("default", 2, 60.0)]
    assert s.counts() == {"default": 0} and s.ended == 2


def test_a_running_block_whose_workers_were_lost_is_stopped_and_replaced_as_lost() -> None:
    """A worker stopped (SIGSTOP), hung or cut off goes silent: the scheduler loses it
    after its timeout and grace, but its process lives on and the provider still says
    its block runs. Once every worker of the block that joined has been out of the
    scheduler's counts for ``lost_grace`` (60 s), the block is stopped, listed as
    ``lost`` and charged (a loop of hanging workers gives up), and the pool asks for
    a replacement. Before, such a block counted against max_blocks for ever."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    assert run(s, QueuesSeen(1.0, {"default": 3}, {"w-1": 1})) == []  # it joined, runs
    assert run(s, QueuesSeen(10.0, {"default": 3}, {})) == []  # lost to the scheduler
    assert run(s, QueuesSeen(69.0, {"default": 3}, {})) == []  # 59 s: within the grace
    assert s.counts() == {"default": 1}
    assert run(s, QueuesSeen(70.0, {"default": 3}, {})) == [
        BlockLost("block-1", "default", ("w-1",), 60.0),
        StopBlock("block-1"),
        StartBlock(2, "default", SPEC),
    ]
    assert s.spent("default") == 1 and s.failed == {"default": 1}
    assert "block-1 lost: its worker(s) w-1 left the scheduler" in s.last_failure["default"]
    assert run(s, BlockStopped(71.0, "block-1", "stopped")) == []
    why = s.last_failure["default"]
    assert s.ends[-1] == BlockEnd("block-1", "default", "stopped", "lost", True, 71.0, 1, why)
    assert s.ended_by == {"default": {"lost": 1}}


def test_a_block_that_lost_one_of_its_workers_is_drained_then_stopped_and_replaced() -> None:
    """Two workers per block, one stopped (SIGSTOP: the scheduler loses it, silent past
    its timeout), the other still working: after lost_grace the block is lost in part.
    It stops counting (its replacement is asked for now) and is charged; its other
    worker drains (finishes what it runs; never taken back); once that one has left,
    the block is stopped: the stopped process would hold the job until its walltime."""
    s = make()
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [StartBlock(1, "default", SPEC)]
    assert run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b"))) == []
    assert run(s, QueuesSeen(1.0, {"default": 2}, {"w-1a": 1, "w-1b": 1})) == []
    assert run(s, QueuesSeen(10.0, {"default": 2}, {"w-1a": 1})) == []  # w-1b lost
    assert s.lost_candidates() == ("w-1b",)  # (the shell asks why it left)
    assert run(s, QueuesSeen(69.0, {"default": 2}, {"w-1a": 1})) == []  # within the grace
    assert run(s, QueuesSeen(70.0, {"default": 2}, {"w-1a": 1})) == [
        BlockLost("block-1", "default", ("w-1b",), 60.0),
        DrainWorker("w-1a", "block-1"),
        DrainWorker("w-1b", "block-1"),
        StartBlock(2, "default", SPEC),
    ]
    assert s.spent("default") == 1
    assert "its other worker(s) w-1a drain, then it is stopped" in s.last_failure["default"]
    assert run(s, DrainAnswered(70.1, "w-1a", True), DrainAnswered(70.1, "w-1b", False)) == []
    assert run(s, QueuesSeen(80.0, {"default": 2}, {"w-1a": 1})) == []  # finishing its task
    assert run(s, QueuesSeen(90.0, {"default": 2}, {})) == [StopBlock("block-1")]  # it left
    assert run(s, BlockStopped(91.0, "block-1", "cancelled")) == []
    end = s.ends[-1]
    assert (end.block, end.cause, end.charged) == ("block-1", "lost", True)
    assert s.spent("default") == 1  # charged once


def test_each_worker_of_a_block_has_its_own_lost_grace() -> None:
    """w-1a is out of the count at 10.0 and back at 50.0; w-1b went at 40.0: at 70.0 it
    has been out 30 s, within its lost_grace (60 s), so the block is not lost; it is at
    100.0. Before, the grace ran from 10.0 for as long as any worker of the block was
    out, so w-1b was taken for lost 30 s after it went."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1a", "w-1b")))
    assert run(s, QueuesSeen(1.0, {}, {"w-1a": 1, "w-1b": 1})) == []
    assert run(s, QueuesSeen(10.0, {}, {"w-1b": 1})) == []  # w-1a out
    assert run(s, QueuesSeen(40.0, {}, {})) == []  # w-1b out too
    assert run(s, QueuesSeen(50.0, {}, {"w-1a": 1})) == []  # w-1a back
    assert run(s, QueuesSeen(70.0, {}, {"w-1a": 1})) == []  # w-1b: 30 s
    assert s.counts() == {"default": 1} and not s.failed
    assert only(run(s, QueuesSeen(100.0, {}, {"w-1a": 1})), BlockLost) == [
        BlockLost("block-1", "default", ("w-1b",), 60.0)
    ]


def test_a_lost_block_that_ends_by_itself_while_stopped_is_listed_as_lost() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    run(s, QueuesSeen(1.0, {}, {"w-1": 0}))
    run(s, QueuesSeen(2.0, {}, {}))
    assert only(run(s, QueuesSeen(62.0, {}, {})), StopBlock) == [StopBlock("block-1")]
    assert run(s, BlockEnded(62.5, "block-1", "failed")) == [
        ReportGone("block-1", ("w-1",), "lost", "failed", s.last_failure["default"])
    ]
    assert s.spent("default") == 1  # charged once, when it was found lost


def test_a_block_is_not_lost_while_a_worker_of_it_comes_back_or_never_joined() -> None:
    """The grace restarts when a worker of the block is counted again (it rejoined);
    a block whose workers never joined (still starting) is not lost: the provisioning
    timeout is for those; a block the scheduler drained (walltime, an operator's
    drain, preemption notice) ends on purpose."""
    s = make()
    run(s, TargetSet(0.0, "default", 2, SPEC))
    run(s, BlockStarted(0.1, 1, "block-1", ("w-1",)))
    run(s, BlockStarted(0.1, 2, "block-2", ("w-2",)))
    assert run(s, QueuesSeen(1.0, {}, {"w-1": 1})) == []  # w-2: starting
    assert run(s, QueuesSeen(10.0, {}, {})) == []
    assert run(s, QueuesSeen(40.0, {}, {"w-1": 1})) == []  # w-1 is back
    assert run(s, QueuesSeen(50.0, {}, {})) == []
    assert run(s, QueuesSeen(109.0, {}, {})) == []  # w-1: 59 s since 50
    assert run(s, QueuesSeen(200.0, {}, {}))[:1] == [
        BlockLost("block-1", "default", ("w-1",), 150.0)
    ]
    assert sorted(s.blocks) == ["block-1", "block-2"]  # block-1 stopping
    # A block the scheduler drained (its walltime is near) is left to end on purpose.
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    run(s, QueuesSeen(1.0, {}, {"w-1": 1}, frozenset({"w-1"}), walltime=frozenset({"w-1"})))
    assert only(run(s, QueuesSeen(2.0, {}, {})), BlockLost) == []
    assert only(run(s, QueuesSeen(500.0, {}, {})), BlockLost) == []


def test_a_block_whose_workers_left_on_purpose_unseen_is_not_lost() -> None:
    """An idle worker drained for its walltime (or preempted, or drained by an
    operator) is drained, retired and gone within a tick, so no count showed it
    draining; its block ends by itself, but a provider that does not see that end for
    a minute (Slurm not answering: its status polls back off to 60 s) still says it
    runs. The worker said why it left (its story's ``left:walltime``, heard as
    :class:`WorkersLeft`): the block is not lost, not stopped, not charged, and its
    end, when seen, is ``walltime``. Before, it was stopped as ``lost`` and charged
    to the replacement budget. A worker that rejoined since its leave and then went
    silent is lost as any."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    run(s, QueuesSeen(1.0, {}, {"w-1": 0}))
    run(s, QueuesSeen(2.0, {}, {}))  # gone between two ticks: never seen draining
    assert s.lost_candidates() == ("w-1",)  # the shell asks the scheduler why it left
    run(s, WorkersLeft(3.0, {"w-1": "walltime"}))
    assert only(run(s, QueuesSeen(500.0, {}, {})), BlockLost) == []
    assert s.spent("default") == 0 and not s.failed
    run(s, BlockEnded(501.0, "block-1", "completed"))
    assert s.ends[-1].cause == "walltime" and not s.ends[-1].charged
    # Left (heard), back under its id, then silent: lost.
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    run(s, QueuesSeen(1.0, {}, {"w-1": 0}))
    run(s, WorkersLeft(1.5, {"w-1": "drained"}))
    run(s, QueuesSeen(2.0, {}, {"w-1": 0}))  # it rejoined: its leave is of its last life
    run(s, QueuesSeen(3.0, {}, {}))
    run(s, WorkersLeft(3.5, {"w-1": "unknown"}))  # lost without a word
    assert only(run(s, QueuesSeen(63.0, {}, {})), BlockLost) == [
        BlockLost("block-1", "default", ("w-1",), 60.0)
    ]


def test_no_lost_blocks_with_lost_grace_none() -> None:
    s = AutoscalerState(AutoscalerConfig(lost_grace=None), None)
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    run(s, QueuesSeen(1.0, {}, {"w-1": 0}))
    assert run(s, QueuesSeen(2.0, {}, {})) == []
    assert run(s, QueuesSeen(1000.0, {}, {})) == []


def test_a_configured_pools_lost_grace_is_its_own() -> None:
    """A pool's ``lost_grace`` key (``PoolLimits.lost_grace``) sets how long its
    running block may go on once its workers all left without a word; None (``"off"``)
    never stops it. A pool without limits keeps the core's (60 s)."""

    def lost_at(grace: float | None, at: float) -> list[Any]:
        s = make()
        run(s, TargetSet(0.0, "p", 1, SPEC, PoolLimits(1, 1, 1, lost_grace=grace)))
        run(s, BlockStarted(0.1, 1, "block-1", ("w-1",)))
        run(s, QueuesSeen(1.0, {}, {"w-1": 1}))
        run(s, QueuesSeen(2.0, {}, {}))  # lost to the scheduler from 2 s
        return only(run(s, QueuesSeen(at, {}, {})), BlockLost)

    assert lost_at(5.0, 6.9) == []
    assert lost_at(5.0, 7.0) == [BlockLost("block-1", "p", ("w-1",), 5.0)]
    assert lost_at(300.0, 62.0) == []  # not the core's 60 s
    assert lost_at(None, 100_000.0) == []
    assert lost_at(60.0, 62.0) == [BlockLost("block-1", "p", ("w-1",), 60.0)]


# ----------------------------------------------------------------------------- shutdown


def test_shutdown_stops_every_block_and_replaces_nothing() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 3, SPEC))
    started(s, 0.1, 2)  # request 3 still in flight
    assert run(s, Shutdown(1.0)) == [StopBlock("block-1"), StopBlock("block-2")]
    assert run(s, BlockStopped(1.1, "block-1")) == []
    assert run(s, BlockStarted(1.2, 3, "block-3", ("w-3",))) == [StopBlock("block-3")]
    # The watcher saw block-2 end before the stop was reported: not a loss.
    assert run(s, BlockEnded(1.3, "block-2", "scaled-in")) == [
        ReportGone("block-2", ("w-2",), "drained", "scaled-in")
    ]
    assert run(s, TargetSet(2.0, "default", 5, SPEC)) == []


# ----------------------------------------------------------------------------- policies


class Proposes:
    """A scaling policy that answers whatever it is told to."""

    name = "proposes"

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.seen: list[PoolView] = []

    def desired(self, pool: PoolView) -> Any:
        self.seen.append(pool)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_the_policy_proposes_and_the_core_starts_what_it_asks() -> None:
    policy = Proposes(3)
    s = make(policy=policy)
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [
        StartBlock(i, "default", SPEC) for i in (1, 2, 3)
    ]
    assert policy.seen[0] == PoolView("default", 1, 0, 0, 0, None)
    assert s.policy_errors == 0


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (RuntimeError("boom"), "desired raised RuntimeError('boom')"),
        ("3", "desired returned '3' (str), not a whole number"),
        (2.0, "desired returned 2.0 (float), not a whole number"),
        (None, "desired returned None (NoneType), not a whole number"),
        (True, "desired returned True (bool), not a whole number"),
    ],
)
def test_a_policy_that_raises_or_answers_no_whole_number_keeps_the_target_at_first(
    answer: Any, problem: str
) -> None:
    """Before any good answer the pool keeps its target (or the blocks it has, if
    more); the problem is told with its text (tests/test_policy_guards.py: after a good
    answer, the pool keeps that one)."""
    s = make(policy=Proposes(answer))
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [
        PolicyFailed("default", problem, 1, 1, "proposes"),
        StartBlock(1, "default", SPEC),
    ]
    assert s.policy_errors == 1 and s.policy_errors_by == {"default": 1}


def test_a_proposal_out_of_bounds_is_clamped() -> None:
    s = AutoscalerState(AutoscalerConfig(max_blocks=2), Proposes(50))
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [
        PolicyFailed("default", "desired returned 50, not within 0..2", 2, 1, "proposes"),
        StartBlock(1, "default", SPEC),
        StartBlock(2, "default", SPEC),
    ]
    assert s.policy_errors == 1
    run(s, PolicyChanged(1.0, Proposes(-4)))
    assert s.pools["default"].desired == 0  # the requests in flight are cancelled
    assert s.counts() == {"default": 0} and s.cancelled == {1, 2}


def test_a_target_above_max_blocks_is_clamped_and_is_no_policy_error() -> None:
    """``scale(n)`` above ``max_blocks`` under ``fixed``: the pool gets ``max_blocks``;
    the policy answered what it was asked, so no policy error is counted (before,
    one was at every event, a counter that only grew)."""
    s = AutoscalerState(AutoscalerConfig(max_blocks=2))
    assert run(s, TargetSet(0.0, "default", 5, SPEC)) == [
        StartBlock(1, "default", SPEC),
        StartBlock(2, "default", SPEC),
    ]
    for now in (1.0, 2.0, 3.0):
        assert run(s, Tick(now)) == []
    assert s.policy_errors == 0 and s.pools["default"].desired == 2


def test_a_scale_in_while_blocks_are_asked_for_takes_back_the_requests_first() -> None:
    """scale(2), then scale(1) before the batch system answered: the request in flight
    is cancelled (its block scaled in as it starts), the running block stays. Before,
    the running block was drained and the pool waited a provisioning delay for the new
    one."""
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    assert run(s, TargetSet(1.0, "default", 2, SPEC)) == [StartBlock(2, "default", SPEC)]
    assert run(s, TargetSet(2.0, "default", 1, SPEC)) == []
    assert s.cancelled == {2} and s.counts() == {"default": 1}
    assert run(s, BlockStarted(3.0, 2, "block-2", ("w-2",), "pending")) == [
        DrainWorker("w-2", "block-2")
    ]
    assert run(s, DrainAnswered(3.1, "w-2", False)) == [StopBlock("block-2")]
    assert s.blocks["block-1"].state == "running" and not s.blocks["block-1"].retiring
    # wanted again before its answer: the request counts once more, nothing asked twice
    assert run(s, TargetSet(4.0, "default", 2, SPEC)) == [StartBlock(3, "default", SPEC)]
    assert run(s, TargetSet(5.0, "default", 1, SPEC)) == []
    assert run(s, TargetSet(6.0, "default", 2, SPEC)) == []
    assert s.cancelled == set() and s.counts() == {"default": 2}


def test_swapping_the_policy_takes_effect_on_the_event_that_swaps_it() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    assert run(s, PolicyChanged(1.0, Proposes(2))) == [StartBlock(2, "default", SPEC)]
    fixed = policies.REGISTRY.create("scaling", "fixed")
    started(s, 1.1, 1)
    assert run(s, PolicyChanged(2.0, fixed)) == [DrainWorker("w-2", "block-2")]


def test_the_queue_policy_follows_the_ready_tasks_above_the_target() -> None:
    queue = policies.REGISTRY.create("scaling", "queue", {"tasks_per_block": 100, "maximum": 4})
    s = make(policy=queue)
    assert run(s, TargetSet(0.0, "default", 1, SPEC)) == [StartBlock(1, "default", SPEC)]
    started(s, 0.1, 1)
    # 250 ready tasks for the pool, 10 any pool may run: 3 blocks.
    assert run(s, QueuesSeen(1.0, {"default": 250, "*": 10})) == [
        StartBlock(2, "default", SPEC),
        StartBlock(3, "default", SPEC),
    ]
    started(s, 1.1, 2)
    assert run(s, QueuesSeen(2.0, {"default": 10_000})) == [StartBlock(4, "default", SPEC)]
    started(s, 2.1, 1)
    # The queue empties: back to the target, by draining the last blocks.
    assert run(s, QueuesSeen(3.0, {})) == [
        DrainWorker("w-2", "block-2"),
        DrainWorker("w-3", "block-3"),
        DrainWorker("w-4", "block-4"),
    ]


def test_scaling_policies_are_registered_and_check_their_parameters() -> None:
    assert policies.REGISTRY.names("scaling") == ["demand", "fixed", "queue"]
    assert policies.DEFAULTS["scaling"] == "fixed"
    assert isinstance(make().policy, policies.scaling.FixedTarget)
    with pytest.raises(PolicyParamsError, match="tasks_per_block"):
        policies.REGISTRY.create("scaling", "queue", {"tasks_per_block": 0})
    with pytest.raises(PolicyParamsError, match="maximum"):
        policies.REGISTRY.create("scaling", "queue", {"maximum": -1})


# ----------------------------------------------------------------------------- validate


def test_validate_catches_a_retiring_block_that_nobody_drains() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    s.blocks["block-1"].retiring = True  # as a bug that forgot DrainWorker would
    with pytest.raises(AssertionError):
        s.validate()


def test_validate_catches_a_pool_short_of_its_proposal() -> None:
    s = make()
    run(s, TargetSet(0.0, "default", 1, SPEC))
    started(s, 0.1, 1)
    del s.blocks["block-1"]  # as a bug that lost a block without replacing it
    with pytest.raises(AssertionError):
        s.validate()


def test_an_unknown_event_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cannot handle"):
        make().handle(Event(0.0))


# ----------------------------------------------------------------------------- state machine


class RandomCluster(RuleBasedStateMachine):
    """Plays provider and scheduler at random against the core: answers starts (or fails
    them), drains (knowing the worker or not), take-backs of drained workers (or refuses
    them), stops, ends blocks unasked, ends drained ones, moves the virtual clock, swaps
    policies and shuts down. Checks ``validate()``
    after every step, and that no block is stopped while a worker of it is known to the
    scheduler (unless the cluster is shutting down)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = AutoscalerState(AutoscalerConfig(max_replacements=3, replacement_window=5.0))
        self.now = 0.0
        self.starts: list[StartBlock] = []
        self.stops: list[StopBlock] = []
        self.drains: list[DrainWorker] = []
        self.undrains: list[UndrainWorker] = []
        self.taken_back = 0  #: UndrainWorker commands seen
        self.joined: set[str] = set()  #: workers the scheduler knows
        self.drained: set[str] = set()  #: workers the scheduler drains
        self.undone: set[str] = set()  #: drained workers an operator took back
        self.reported: set[str] = set()  #: blocks reported gone
        self.running: set[str] = set()  #: blocks that run (their workers may join)
        self.suspended: set[str] = set()  #: blocks whose workers the scheduler holds
        self.n = 0

    def feed(self, ev: Event) -> None:
        for cmd in self.state.handle(ev):
            if isinstance(cmd, StartBlock):
                self.starts.append(cmd)
            elif isinstance(cmd, StopBlock):
                b = self.state.blocks[cmd.block]
                if not self.state.closing:
                    assert not (set(b.workers) & self.joined), ("stopped a known worker", b)
                self.stops.append(cmd)
            elif isinstance(cmd, DrainWorker):
                assert self.state.blocks[cmd.block].retiring
                self.drains.append(cmd)
            elif isinstance(cmd, UndrainWorker):
                # Only a worker the scheduler drains, of a block counted again.
                b = self.state.blocks[cmd.block]
                assert not b.retiring and cmd.worker in b.workers, (cmd, b)
                # (or one an operator took back since the latest count: it is refused)
                assert cmd.worker in self.drained | self.undone and cmd.worker in self.joined, cmd
                self.undrains.append(cmd)
                self.taken_back += 1
            elif isinstance(cmd, HoldWorkers):
                assert (cmd.block in self.suspended) != cmd.held, cmd  # once each way
                (self.suspended.add if cmd.held else self.suspended.discard)(cmd.block)
            elif isinstance(cmd, ReportGone):
                assert cmd.block not in self.reported, cmd
                self.suspended.discard(cmd.block)  # its workers are forgotten
                if cmd.state != "requeued":  # a requeued block lives on
                    self.reported.add(cmd.block)
                self.joined -= set(cmd.workers)
            elif isinstance(cmd, BlockStuck):
                b = self.state.blocks[cmd.block]
                assert b.stuck and b.retiring and cmd.block not in self.running, cmd
                assert cmd.block not in self.suspended, ("a suspended block is not stuck", cmd)
                assert cmd.age >= cmd.timeout, cmd
            elif isinstance(cmd, PolicyFailed):  # told once per problem, kept in bounds
                assert 0 <= cmd.kept == self.state.pools[cmd.pool].desired, cmd
            else:
                assert isinstance(cmd, GaveUp), cmd
        self.state.validate()

    def _later(self, dt: float = 0.25) -> float:
        self.now += dt
        return self.now

    @rule(
        pool=st.sampled_from(["a", "b"]), n=st.integers(0, 4),
        timeout=st.sampled_from([None, 1.0, 3.0]), idle_only=st.booleans(),
    )  # fmt: skip
    def set_target(self, pool: str, n: int, timeout: float | None, idle_only: bool) -> None:
        limits = PoolLimits(0, 4, 0, provisioning_timeout=timeout)
        self.feed(TargetSet(self._later(), pool, n, pool, limits, idle_only))

    @rule(pool=st.sampled_from(["a", "b"]), n=st.integers(0, 4), hold=st.floats(0.0, 5.0))
    def raise_target(self, pool: str, n: int, hold: float) -> None:
        if pool in self.state.pools:
            now = self._later()
            self.feed(TargetRaised(now, pool, n, now + hold))

    @precondition(lambda self: self.starts)
    @rule(
        i=st.integers(0, 7), workers=st.integers(0, 2), pending=st.booleans(), ok=st.booleans(),
        how=st.sampled_from(["other", "batch", "suspended"]),
    )  # fmt: skip
    def answer_start(self, i: int, workers: int, pending: bool, ok: bool, how: str) -> None:
        cmd = self.starts.pop(i % len(self.starts))
        if not ok:
            now = self._later()
            batch, suspended = how == "batch", how == "suspended"
            self.feed(BlockStartFailed(now, cmd.request, "no", batch, "sbatch", None, suspended))
            return
        self.n += 1
        wids = tuple(f"w-{self.n}.{j}" for j in range(workers if pending else workers or 1))
        state = "pending" if pending else "running"
        if not pending:
            self.running.add(f"block-{self.n}")
        self.feed(BlockStarted(self._later(), cmd.request, f"block-{self.n}", wids, state))

    @precondition(lambda self: any(b not in self.running for b in self.state.blocks))
    @rule(i=st.integers(0, 7))
    def block_runs(self, i: int) -> None:
        bids = sorted(b for b in self.state.blocks if b not in self.running)
        bid = bids[i % len(bids)]
        self.running.add(bid)
        self.feed(BlockRunning(self._later(), bid))

    @precondition(lambda self: self.state.blocks)
    @rule(i=st.integers(0, 7))
    def block_held(self, i: int) -> None:
        bid = sorted(self.state.blocks)[i % len(self.state.blocks)]
        self.running.discard(bid)  # suspended (or held before it ran): block_runs resumes it
        self.feed(BlockHeld(self._later(), bid))

    @precondition(lambda self: any(b.workers for b in self.state.blocks.values()))
    @rule(i=st.integers(0, 7))
    def worker_joins(self, i: int) -> None:
        # Only a worker of a block that runs can join.
        wids = sorted(
            w for b in self.state.blocks.values() if b.block_id in self.running for w in b.workers
        )
        if wids:
            self.joined.add(wids[i % len(wids)])

    @precondition(lambda self: self.drains)
    @rule(i=st.integers(0, 7))
    def answer_drain(self, i: int) -> None:
        cmd = self.drains.pop(i % len(self.drains))
        known = cmd.worker in self.joined
        if known:
            self.drained.add(cmd.worker)
        self.feed(DrainAnswered(self._later(), cmd.worker, known))

    @precondition(lambda self: not self.state.closing)
    @rule(pool=st.sampled_from(["a", "b"]), n=st.integers(1, 4))
    def scaled_in_then_wanted_again(self, pool: str, n: int) -> None:
        """The pool's requests are answered (a running block each), the workers of its
        running blocks join, it is scaled in to 0, every drain is answered, then it
        wants ``n`` blocks: the scaled-in blocks still there are taken back before any
        is started."""
        if pool not in self.state.pools:
            return
        for cmd in [c for c in self.starts if c.pool == pool]:
            self.answer_start(self.starts.index(cmd), 1, False, True, "other")
        self.joined.update(
            w
            for b in self.state.blocks.values()
            if b.pool == pool and b.block_id in self.running
            for w in b.workers
        )
        limits = PoolLimits(0, 4, 0)
        self.feed(TargetSet(self._later(), pool, 0, pool, limits))
        while self.drains:
            self.answer_drain(0)
        self.feed(TargetSet(self._later(), pool, n, pool, limits))

    @precondition(lambda self: self.undrains)
    @rule(i=st.integers(0, 7), ok=st.booleans())
    def answer_undrain(self, i: int, ok: bool) -> None:
        cmd = self.undrains.pop(i % len(self.undrains))
        ok = ok and cmd.worker in self.joined and cmd.worker in self.drained
        if ok:
            self.drained.discard(cmd.worker)
        self.feed(UndrainAnswered(self._later(), cmd.worker, ok))

    @precondition(lambda self: not self.state.closing)
    @rule(busy=st.sets(st.integers(0, 15)), queued=st.integers(0, 3))
    def counts(self, busy: set[int], queued: int) -> None:
        """The scheduler's counts: the workers it knows (some busy) and those it drains."""
        known = sorted(self.joined)
        processing = {w: int(i in busy) for i, w in enumerate(known)}
        draining = frozenset(self.drained & self.joined)
        self.feed(QueuesSeen(self._later(), {"a": queued}, processing, draining))

    @precondition(lambda self: self.drained & self.joined)
    @rule(i=st.integers(0, 7))
    def operator_undrains(self, i: int) -> None:
        """An operator takes a draining worker back (the console's ``undrain``): the
        core learns it from the next count."""
        wid = sorted(self.drained & self.joined)[i % len(self.drained & self.joined)]
        self.drained.discard(wid)
        self.undone.add(wid)

    @precondition(lambda self: self.stops)
    @rule(i=st.integers(0, 7))
    def answer_stop(self, i: int) -> None:
        cmd = self.stops.pop(i % len(self.stops))
        self.feed(BlockStopped(self._later(), cmd.block))

    @precondition(lambda self: self.state.blocks)
    @rule(
        i=st.integers(0, 7),
        state=st.sampled_from(["failed", "completed", "timeout", "preempted", "missing"]),
    )
    def block_ends(self, i: int, state: str) -> None:
        bids = sorted(self.state.blocks)
        self.feed(BlockEnded(self._later(), bids[i % len(bids)], state))

    @precondition(
        lambda self: any(
            b.workers and set(b.workers) <= self.drained for b in self.state.blocks.values()
        )
    )
    @rule()
    def drained_block_exits(self) -> None:
        b = next(
            b
            for b in sorted(self.state.blocks.values(), key=lambda b: b.block_id)
            if b.workers and set(b.workers) <= self.drained
        )
        self.feed(BlockEnded(self._later(), b.block_id, "completed"))
        assert self.state.blocks.get(b.block_id) is None

    @precondition(lambda self: self.state.blocks)
    @rule(i=st.integers(0, 7), preempted=st.booleans())
    def block_requeued(self, i: int, preempted: bool) -> None:
        b = self.state.blocks[sorted(self.state.blocks)[i % len(self.state.blocks)]]
        cause = "preempted" if preempted else "requeued"
        self.running.discard(b.block_id)  # pending again
        self.feed(BlockRequeued(self._later(), b.block_id, b.incarnation + 1, cause))

    @rule(pool=st.sampled_from(["a", "b"]))
    def resume(self, pool: str) -> None:
        if pool in self.state.pools:
            self.feed(Resumed(self._later(), pool))

    @rule(dt=st.floats(0.0, 10.0))
    def tick(self, dt: float) -> None:
        self.feed(Tick(self._later(dt)))

    @rule(name=st.sampled_from(["fixed", "queue", "broken"]), queued=st.integers(0, 500))
    def swap_policy(self, name: str, queued: int) -> None:
        if name == "broken":
            policy: Any = Proposes(RuntimeError("broken"))
        else:
            policy = policies.REGISTRY.create("scaling", name)
        self.feed(PolicyChanged(self._later(), policy))
        self.feed(QueuesSeen(self._later(), {"a": queued}))

    @precondition(lambda self: not self.state.closing)
    @rule()
    def shutdown(self) -> None:
        self.feed(Shutdown(self._later()))

    @invariant()
    def requests_match(self) -> None:
        assert set(self.state.requests) == {c.request for c in self.starts}


def test_random_clusters_keep_the_invariants() -> None:
    run_state_machine_as_test(
        RandomCluster,
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,  # the same examples on every run
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_a_failed_blocks_detail_stays_with_its_end_and_the_give_up_names_the_latest() -> None:
    """A user audit: blocks whose worker_init failed ended ``failed`` with nothing to
    say why: the end, the report (logged), the pool's giving up and its metrics (the
    CorralBlocksFailing alert) had no detail, and the block's own was gone with it.
    Now each keeps the provider's words, bounded."""
    from actors.autoscaler_state import MAX_DETAIL

    s = make(max_replacements=1, window=60.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC))
    why = (
        "Slurm job 42 FAILED (NonZeroExitCode); exit code 127; stderr (/run/block-1.err):\n"
        "corral: block block-1, Slurm job 42\n"
        "/run/block-1.sh: line 12: module: command not found\n"
        "corral: worker_init failed (exit status 127): no worker started"
    )
    run(s, BlockStarted(1.0, 1, "block-1", ("w-1",)))
    out = run(s, BlockEnded(2.0, "block-1", "failed", detail=why))
    (gone,) = only(out, ReportGone)
    assert gone.detail == why
    assert s.ends[-1].detail == why and s.ends[-1].cause == "crash"
    assert s.last_failure["ckpt"] == f"block-1 ended failed (crash): {why}"
    assert s.block_metrics(2.0, {})["ckpt"]["last_failure"] == s.last_failure["ckpt"]
    # The second failure gives up: the give-up names it, cut to a bound.
    (request,) = [r for r, p in s.requests.items() if p == "ckpt"]
    run(s, BlockStarted(3.0, request, "block-2", ("w-2",)))
    long = why + "\n" + "x" * (3 * MAX_DETAIL) + "\nthe last line"
    (gave_up,) = only(run(s, BlockEnded(4.0, "block-2", "failed", detail=long)), GaveUp)
    assert gave_up.latest.startswith("block-2 ended failed (crash): Slurm job 42 FAILED")
    assert gave_up.latest.endswith("the last line") and len(gave_up.latest) <= MAX_DETAIL
    assert len(s.ends[-1].detail) <= MAX_DETAIL and s.ends[-1].detail.endswith("the last line")
    # A free end (preempted) keeps its detail but is no failure of the pool.
    run(s, TargetSet(5.0, "ckpt", 1, SPEC))
    (request,) = [r for r, p in s.requests.items() if p == "ckpt"]
    run(s, BlockStarted(6.0, request, "block-3", ("w-3",)))
    run(s, BlockEnded(7.0, "block-3", "preempted", detail="Slurm job 44 PREEMPTED"))
    assert s.ends[-1].detail == "Slurm job 44 PREEMPTED"
    assert s.last_failure["ckpt"].startswith("block-2 ended failed")


def test_failed_submissions_in_a_row_are_in_the_metrics_until_one_goes_through() -> None:
    """The CorralSubmissionsFailing alert reads them: a controller that cannot be
    reached backs the pool off without pausing it, and the next block started clears
    them."""
    s = make()
    run(s, TargetSet(0.0, "ckpt", 1, SPEC))
    now = 0.0
    for n in range(1, 5):
        (request,) = list(s.requests)
        run(s, BlockStartFailed(now, request, "connect failure", batch=True, command="sbatch"))
        assert s.block_metrics(now, {})["ckpt"]["submit_failures"] == n
        assert s.block_metrics(now, {})["ckpt"]["suspended"] == 0
        now = s.retry_at["ckpt"]
        run(s, Tick(now))
    (request,) = list(s.requests)
    run(s, BlockStarted(now, request, "block-1", ("w-1",)))
    assert s.block_metrics(now, {})["ckpt"]["submit_failures"] == 0
    assert s.errors == {} and s.paused == set()
