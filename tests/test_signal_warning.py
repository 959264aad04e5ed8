"""A block whose workers left before its walltime at the batch system's warning signal
(a Slurm pool's ``signal_warning``: ``--signal=B:TERM@N``) ends ``walltime``, free,
whichever the autoscaler hears first: the provider's ``COMPLETED`` or the workers'
leave (a user audit: 1 run of 3 recorded ``completed`` / ``unknown`` / ``spent``, logged
``worker block ended unasked``).

The pure core (actors/autoscaler_state.py) is fed both orders on a virtual clock, with
the exact commands asserted: a ``completed`` end nothing explains yet is held (its
replacement asked for at once) until its workers' leaves are heard
(:class:`WorkersLeft`), at most ``leave_grace``, and decided once, before anything
is reported or listed. The shell (actors/autoscaler.py) is checked with an in-process
block and a real scheduler: it reads the leaves in the workers' stories, at the end
and at each tick while an end is held.
"""

from __future__ import annotations

import pytest

from actors.autoscaler import left_since_joined
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockEnd,
    BlockEnded,
    BlockRequeued,
    BlockStarted,
    Command,
    Event,
    GaveUp,
    QueuesSeen,
    ReportGone,
    Shutdown,
    StartBlock,
    StopBlock,
    TargetSet,
    Tick,
    WorkersLeft,
)
from actors.providers import BlockState
from actors.scheduler_events import WorkerJoined, WorkerLeaving, WorkerLeft
from actors.scheduler_state import SchedulerState
from policies.scaling import PoolLimits
from runtime.messages import AutoscalerStatus, StatusRequest, WorkerGone
from tests.helpers import log_lines, wait_until
from tests.test_autoscaler_preemption import one_recorded_block

SPEC = "spec"
LIMITS = PoolLimits(min_blocks=1, max_blocks=1, init_blocks=1, walltime=90.0)


def make() -> AutoscalerState:
    """A pool ``ckpt`` of one block (walltime 90 s) whose every charged end gives up
    (max_replacements 0): an end wrongly charged shows as a ``GaveUp``."""
    s = AutoscalerState(AutoscalerConfig(0, 60.0))
    assert run(s, TargetSet(0.0, "ckpt", 1, SPEC, LIMITS)) == [StartBlock(1, "ckpt", SPEC)]
    return s


def run(state: AutoscalerState, *events: Event) -> list[Command]:
    out = state.handle(*events)
    state.validate()
    return out


def started(s: AutoscalerState, now: float, n: int, *workers: str) -> str:
    bid = f"ckpt/block-{n}"
    assert run(s, BlockStarted(now, n, bid, workers or (f"w-{n}",))) == []
    return bid


def test_the_leave_heard_before_the_end_makes_it_walltime() -> None:
    """The audit's run: the worker left ``walltime`` (Slurm's SIGTERM 30 s before the
    walltime) 4 s before the provider read the job COMPLETED. Before, the end was
    ``unknown``, charged (here: the pool gave up)."""
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, WorkersLeft(62.0, {"w-1": "walltime"})) == []
    assert run(s, BlockEnded(66.0, bid, "completed", detail="Slurm job 52 COMPLETED")) == [
        ReportGone(bid, ("w-1",), "walltime", "completed"),
        StartBlock(2, "ckpt", SPEC),
    ]
    assert s.ends[-1] == BlockEnd(
        bid, "ckpt", "completed", "walltime", False, 66.0, 1, "Slurm job 52 COMPLETED"
    )
    assert s.spent() == 0 and s.gave_up == set() and s.ended_by == {"ckpt": {"walltime": 1}}


def test_the_leave_heard_after_the_end_makes_it_walltime() -> None:
    """The race the other way: the provider's poll reads COMPLETED before the
    scheduler heard the worker leave. The end is held: its replacement is asked for at
    once, nothing is reported, listed or charged; the leave decides it, once."""
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, BlockEnded(64.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    assert list(s.held) == [bid] and not s.ends and s.spent() == 0 and s.ended_by == {}
    assert run(s, Tick(65.0)) == []
    assert run(s, WorkersLeft(66.0, {"w-1": "walltime"})) == [
        ReportGone(bid, ("w-1",), "walltime", "completed")
    ]
    # Listed once, at the time it ended, free; nothing held any more.
    assert list(s.ends) == [BlockEnd(bid, "ckpt", "completed", "walltime", False, 64.0, 1)]
    assert s.held == {} and s.spent() == 0 and s.gave_up == set()
    assert s.ended_by == {"ckpt": {"walltime": 1}}
    assert run(s, Tick(80.0)) == []  # decided: the grace's end changes nothing


@pytest.mark.parametrize("cause", ["preempted", "drained"])
def test_a_preempted_or_drained_leave_after_the_end_says_so(cause: str) -> None:
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, BlockEnded(30.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    assert run(s, WorkersLeft(31.0, {"w-1": cause})) == [
        ReportGone(bid, ("w-1",), cause, "completed")
    ]
    assert s.ends[-1].cause == cause and not s.ends[-1].charged and s.spent() == 0


def test_a_leave_counted_as_a_drain_is_walltime_once_heard() -> None:
    """A count caught the worker leaving (the scheduler's ``draining`` lists a worker
    that said it leaves): before, such an end said ``drained``; its leave says
    ``walltime``, whichever comes first."""
    s = make()
    bid = started(s, 1.0, 1)
    gone = frozenset({"w-1"})
    assert run(s, QueuesSeen(62.0, {}, {"w-1": 1}, gone, leaving=gone)) == []
    assert run(s, WorkersLeft(62.5, {"w-1": "walltime"}), BlockEnded(64.0, bid, "completed")) == [
        ReportGone(bid, ("w-1",), "walltime", "completed"),
        StartBlock(2, "ckpt", SPEC),
    ]


def test_an_end_nothing_explains_is_unknown_and_charged_at_the_graces_end() -> None:
    """No leave heard within ``leave_grace`` (10 s): ``unknown``, charged then (the pool
    gives up here); a leave heard later rewrites nothing."""
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, BlockEnded(20.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    assert run(s, Tick(29.9)) == [] and s.spent() == 0
    assert run(s, Tick(30.0)) == [
        ReportGone(bid, ("w-1",), "unknown", "completed"),
        GaveUp("ckpt", 1, 60.0),
    ]
    assert list(s.ends) == [BlockEnd(bid, "ckpt", "completed", "unknown", True, 20.0, 1)]
    assert run(s, WorkersLeft(31.0, {"w-1": "walltime"})) == []
    assert [e.cause for e in s.ends] == ["unknown"] and s.spent() == 1


def test_a_leave_that_explains_nothing_decides_at_once() -> None:
    """A worker lost silently (the gateway's ``unknown``) or crashed: every leave of
    the block heard, none explains the end: ``unknown``, charged, without waiting."""
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, BlockEnded(20.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    assert run(s, WorkersLeft(21.0, {"w-1": "unknown"})) == [
        ReportGone(bid, ("w-1",), "unknown", "completed"),
        GaveUp("ckpt", 1, 60.0),
    ]


def test_a_block_of_two_is_decided_by_the_first_leave_that_explains_it() -> None:
    """A leave that explains the end (the batch system's signal reaches the whole
    job) decides it at once; one that does not (a crash) waits for the other's."""
    s = AutoscalerState(AutoscalerConfig(0, 60.0))
    limits = PoolLimits(min_blocks=1, max_blocks=2, init_blocks=1, walltime=90.0)
    assert run(s, TargetSet(0.0, "ckpt", 1, SPEC, limits)) == [StartBlock(1, "ckpt", SPEC)]
    bid = started(s, 1.0, 1, "w-a", "w-b")
    assert run(s, BlockEnded(30.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    assert run(s, WorkersLeft(31.0, {"w-a": "preempted"})) == [
        ReportGone(bid, ("w-a", "w-b"), "preempted", "completed")
    ]
    bid = started(s, 33.0, 2, "w-c", "w-d")
    assert run(s, BlockEnded(60.0, bid, "completed")) == [StartBlock(3, "ckpt", SPEC)]
    assert run(s, WorkersLeft(61.0, {"w-c": "crash"})) == []  # w-d may explain it
    assert run(s, WorkersLeft(62.0, {"w-d": "walltime"})) == [
        ReportGone(bid, ("w-c", "w-d"), "walltime", "completed")
    ]
    assert s.spent() == 0


def test_a_requeued_blocks_earlier_leaves_do_not_explain_its_next_runs_end() -> None:
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, WorkersLeft(10.0, {"w-1": "preempted"})) == []
    assert run(s, BlockRequeued(11.0, bid, 2, "preempted")) == [
        ReportGone(bid, ("w-1",), "preempted", "requeued")
    ]
    assert run(s, BlockEnded(40.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    assert list(s.held) == [bid]


def test_a_held_end_is_decided_when_the_cluster_shuts_down() -> None:
    s = make()
    bid = started(s, 1.0, 1)
    assert run(s, BlockEnded(20.0, bid, "completed")) == [StartBlock(2, "ckpt", SPEC)]
    new = started(s, 21.0, 2)
    assert run(s, Shutdown(22.0)) == [
        ReportGone(bid, ("w-1",), "unknown", "completed"),
        GaveUp("ckpt", 1, 60.0),
        StopBlock(new),
    ]
    assert s.held == {}


def test_the_shell_reads_each_workers_leave_in_its_story() -> None:
    """``left_since_joined`` over a real scheduler core's story: the latest ``left:``,
    else ``leaving:`` (it said it leaves), since the worker last joined."""
    sch = SchedulerState()
    w = ("w.0", "w.1", "w.2")
    sch.handle(*(WorkerJoined(f"j{i}", 1.0, wid, 1, 0) for i, wid in enumerate(w)))
    assert left_since_joined(sch.story(*w)) == {}
    sch.handle(WorkerLeaving("s1", 60.0, "w.0", "walltime"))
    assert left_since_joined(sch.story(*w)) == {"w.0": "walltime"}
    sch.handle(WorkerLeft("s2", 61.0, "w.0", "walltime"), WorkerLeft("s3", 62.0, "w.1", "crash"))
    assert left_since_joined(sch.story(*w)) == {"w.0": "walltime", "w.1": "crash"}
    sch.handle(WorkerJoined("s4", 70.0, "w.0", 1, 0))  # the block's next run
    assert left_since_joined(sch.story(*w)) == {"w.1": "crash"}


async def _ends(autoscaler: object) -> AutoscalerStatus | None:
    st: AutoscalerStatus = await autoscaler.ask(StatusRequest())  # type: ignore[attr-defined]
    return st if st.ends else None


@pytest.mark.anyio
async def test_the_shell_ends_a_block_walltime_when_its_worker_left_first() -> None:
    """The scheduler heard the worker leave ``walltime``, then the block completes:
    the end is ``walltime``, free, logged at info (before: ``unknown``, spent, and
    ``worker block ended unasked`` at warning)."""
    with log_lines("corral") as log:
        async with one_recorded_block() as (autoscaler, scheduler, block, provider):
            await autoscaler.ask(StatusRequest())  # (the ref is up)
            await provider.scheduler.tell(WorkerGone("worker-1", "walltime"))
            await wait_until(lambda: "worker-1" not in scheduler.workers, limit=10)
            block.state = BlockState.COMPLETED
            ref = provider.ref("worker-1")
            assert ref is not None
            ref.stop()
            st = await wait_until(lambda: _ends(autoscaler), "block-1 ended", limit=10)
            (end,) = st.ends
            assert (end.block, end.state, end.cause, end.charged) == (
                "block-1", "completed", "walltime", False,
            )  # fmt: skip
            assert st.budget_spent == 0
        assert not log.has("ended unasked", "block='block-1'")


@pytest.mark.anyio
async def test_the_shell_holds_a_completed_end_until_its_workers_leave_is_heard() -> None:
    """The block completes before the scheduler heard its worker leave: the end is
    held (the status lists the block as it was, no end, nothing spent: what the
    monitoring database records stays right), its replacement comes at once, and the
    leave, read at the next tick, makes it ``walltime``, free."""
    with log_lines("corral") as log:
        async with one_recorded_block() as (autoscaler, _, block, provider):
            block.state = BlockState.COMPLETED
            ref = provider.ref("worker-1")
            assert ref is not None
            ref.stop()

            async def held() -> AutoscalerStatus | None:
                st: AutoscalerStatus = await autoscaler.ask(StatusRequest())
                return st if "block-2" in st.blocks else None

            st = await wait_until(held, "the replacement asked for", limit=10)
            assert not st.ends and st.budget_spent == 0
            assert st.blocks["block-1"] == "running" and st.block_pools["block-1"] == "default"
            await provider.scheduler.tell(WorkerGone("worker-1", "walltime"))
            st = await wait_until(lambda: _ends(autoscaler), "block-1 ended", limit=10)
            (end,) = st.ends
            assert (end.block, end.state, end.cause, end.charged) == (
                "block-1", "completed", "walltime", False,
            )  # fmt: skip
            assert st.budget_spent == 0 and "block-1" not in st.blocks
        assert not log.has("ended unasked", "block='block-1'")
        line = log.with_("worker block ended", "block='block-1'")
        assert line is not None and "cause='walltime'" in line and "level='info'" in line
