"""The autoscaler's pure core when the batch system takes blocks back or does not answer
(actors/autoscaler_state.py), driven by a virtual clock: events in, exact commands out.

- A block ended by preemption, or requeued by it (a new incarnation of the same job),
  is reported with cause ``preempted`` and costs no replacement budget; one that ended
  at its walltime (TIMEOUT, or COMPLETED after the scheduler drained it) is ``walltime``,
  free too. Crashes, vanished jobs and unexplained ends still spend the budget.
- ``sbatch`` failing backs the pool off (the provider's ``retry_at``, else the core's
  exponential back-off) without spending the budget; a provider that stopped
  submitting pauses the pool until ``Resumed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from actors.autoscaler import PoolTarget, drained_since_joined, requeue_line
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BatchProblem,
    BlockEnd,
    BlockEnded,
    BlockRequeued,
    BlockStarted,
    BlockStartFailed,
    BlockStopped,
    Command,
    DrainAnswered,
    DrainWorker,
    Event,
    GaveUp,
    QueuesSeen,
    ReportGone,
    Resumed,
    Shutdown,
    StartBlock,
    StopBlock,
    TargetSet,
    Tick,
)
from actors.providers import Block, BlockSpec, BlockState, InProcessProvider
from actors.scheduler_events import (
    WorkerDraining,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
    WorkerUndrained,
)
from actors.scheduler_state import SchedulerState
from policies.scaling import PoolLimits
from runtime.kernel import ActorSystem
from runtime.messages import AutoscalerStatus, DrainRequest, StatusRequest, WorkerGone
from runtime.node import start_control_plane, worker_factory
from tests.helpers import event, join, log_lines, submit, wait_until

SPEC = "spec"


def make(max_replacements: int = 1, **kw: float) -> AutoscalerState:
    return AutoscalerState(AutoscalerConfig(max_replacements, 60.0, **kw))  # type: ignore[arg-type]


def run(state: AutoscalerState, *events: Event) -> list[Command]:
    out = state.handle(*events)
    state.validate()
    return out


def one_block(s: AutoscalerState, now: float, request: int, pool: str = "ckpt") -> str:
    bid = f"{pool}/block-{request}"
    assert run(s, BlockStarted(now, request, bid, (f"w-{request}",))) == []
    return bid


def test_preempted_blocks_are_replaced_for_free_however_many() -> None:
    s = make(max_replacements=1)  # one crash is tolerated, two give up
    assert run(s, TargetSet(0.0, "ckpt", 1, SPEC)) == [StartBlock(1, "ckpt", SPEC)]
    for i in range(1, 6):  # five preemptions within the window
        bid = one_block(s, i * 2.0, i)
        assert run(s, BlockEnded(i * 2.0 + 1, bid, "preempted")) == [
            ReportGone(bid, (f"w-{i}",), "preempted", "preempted"),
            StartBlock(i + 1, "ckpt", SPEC),
        ]
    assert list(s.replacements) == [] and s.gave_up == set()
    assert [(e.cause, e.charged) for e in s.ends] == [("preempted", False)] * 5
    # A crash still spends the budget: the second one within the window gives up.
    bid = one_block(s, 20.0, 6)
    assert run(s, BlockEnded(21.0, bid, "failed")) == [
        ReportGone(bid, ("w-6",), "crash", "failed"),
        StartBlock(7, "ckpt", SPEC),
    ]
    bid = one_block(s, 22.0, 7)
    assert run(s, BlockEnded(23.0, bid, "missing")) == [
        ReportGone(bid, ("w-7",), "unknown", "missing"),
        GaveUp("ckpt", 2, 60.0),
    ]
    assert s.ends[-1] == BlockEnd(bid, "ckpt", "missing", "unknown", True, 23.0)


def test_a_requeued_block_reports_its_workers_preempted_and_stays() -> None:
    s = make(max_replacements=0)  # any charged end would give up at once
    run(s, TargetSet(0.0, "ckpt", 1, SPEC))
    bid = one_block(s, 1.0, 1)
    assert run(s, BlockRequeued(5.0, bid, 2, "preempted")) == [
        ReportGone(bid, ("w-1",), "preempted", "requeued")
    ]
    assert s.blocks[bid].incarnation == 2 and s.blocks[bid].state == "pending"
    assert run(s, BlockRequeued(5.5, bid, 2, "preempted")) == []  # seen already
    assert s.counts() == {"ckpt": 1}  # no second block: Slurm runs the same job again
    assert list(s.replacements) == [] and s.gave_up == set()
    assert s.ends[-1] == BlockEnd(bid, "ckpt", "requeued", "preempted", False, 5.0, 1)
    # A requeue for another reason (an operator's scontrol requeue): unknown, still free.
    assert run(s, BlockRequeued(9.0, bid, 3, "requeued")) == [
        ReportGone(bid, ("w-1",), "unknown", "requeued")
    ]
    # The third run is preempted for good (PreemptMode=CANCEL): free, replaced.
    assert run(s, BlockEnded(12.0, bid, "preempted")) == [
        ReportGone(bid, ("w-1",), "preempted", "preempted"),
        StartBlock(2, "ckpt", SPEC),
    ]
    assert s.ends[-1].incarnation == 3 and s.gave_up == set()


def test_walltime_ends_are_free_and_say_walltime() -> None:
    s = make(max_replacements=0)
    limits = PoolLimits(min_blocks=1, max_blocks=2, init_blocks=1, walltime=180.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC, limits))
    bid = one_block(s, 1.0, 1)
    assert run(s, BlockEnded(181.0, bid, "timeout")) == [
        ReportGone(bid, ("w-1",), "walltime", "timeout"),
        StartBlock(2, "ckpt", SPEC),
    ]
    # COMPLETED after the scheduler drained its worker before the walltime. The
    # replacement is asked for when the drain is seen, to come up while the worker
    # finishes its task, not a provisioning delay after the block ended.
    bid = one_block(s, 182.0, 2)
    w2 = frozenset({"w-2"})
    assert run(s, QueuesSeen(300.0, {"ckpt": 0}, {"w-2": 1}, w2, walltime=w2)) == [
        StartBlock(3, "ckpt", SPEC)
    ]
    assert s.counts() == {"ckpt": 1} and s.blocks[bid].retiring
    assert run(s, BlockEnded(340.0, bid, "completed")) == [
        ReportGone(bid, ("w-2",), "walltime", "completed")
    ]
    assert s.ends[-1] == BlockEnd(bid, "ckpt", "completed", "walltime", False, 340.0, 1)
    assert list(s.replacements) == [] and s.gave_up == set()


def test_a_drain_no_count_showed_is_told_with_the_end() -> None:
    """An idle worker drained before its walltime is retired and gone between two
    ticks: the shell finds the drain in its story and says so with the end, which is
    then ``walltime``, free, and replaced as usual."""
    s = make(max_replacements=0)
    limits = PoolLimits(min_blocks=1, max_blocks=1, init_blocks=1, walltime=180.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC, limits))
    bid = one_block(s, 1.0, 1)
    assert run(s, BlockEnded(170.0, bid, "completed", drained=True, walltime=True)) == [
        ReportGone(bid, ("w-1",), "walltime", "completed"),
        StartBlock(2, "ckpt", SPEC),
    ]
    assert list(s.replacements) == [] and s.gave_up == set()


def test_an_operators_drain_in_a_pool_with_a_walltime_ends_drained() -> None:
    """A pool with a walltime, whose workers an operator drains (the console's
    ``drain``, ``DrainRequest``), long before their walltime: their blocks' ends are
    ``drained``. Only the scheduler's own drain before the walltime (its status's
    ``walltime_draining``, or ``draining:walltime`` in the worker's story) is
    ``walltime``. Before, every drained block of a pool with a walltime said
    ``walltime``. Both are free."""
    s = make(max_replacements=0)
    limits = PoolLimits(min_blocks=1, max_blocks=2, init_blocks=1, walltime=3600.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC, limits))
    # Seen draining in a count, for an operator (not among the walltime's).
    bid = one_block(s, 1.0, 1)
    w1 = frozenset({"w-1"})
    assert run(s, QueuesSeen(10.0, {"ckpt": 0}, {"w-1": 1}, w1)) == [StartBlock(2, "ckpt", SPEC)]
    assert run(s, BlockEnded(20.0, bid, "completed")) == [
        ReportGone(bid, ("w-1",), "drained", "completed")
    ]
    assert s.ends[-1] == BlockEnd(bid, "ckpt", "completed", "drained", False, 20.0, 1)
    # Drained, retired and gone between two ticks: told with the end, the same.
    bid = one_block(s, 21.0, 2)
    assert run(s, BlockEnded(30.0, bid, "completed", drained=True)) == [
        ReportGone(bid, ("w-2",), "drained", "completed"),
        StartBlock(3, "ckpt", SPEC),
    ]
    # An in-process worker's block reads failed once the scheduler retired it.
    bid = one_block(s, 31.0, 3)
    assert run(s, BlockEnded(40.0, bid, "failed", drained=True)) == [
        ReportGone(bid, ("w-3",), "drained", "failed"),
        StartBlock(4, "ckpt", SPEC),
    ]
    # The scheduler's own drain before the walltime, seen in a count: walltime.
    bid = one_block(s, 41.0, 4)
    w4 = frozenset({"w-4"})
    assert run(s, QueuesSeen(50.0, {"ckpt": 0}, {"w-4": 0}, w4, walltime=w4)) == [
        StartBlock(5, "ckpt", SPEC)
    ]
    assert run(s, BlockEnded(51.0, bid, "completed")) == [
        ReportGone(bid, ("w-4",), "walltime", "completed")
    ]
    # ... or told with the end.
    bid = one_block(s, 52.0, 5)
    assert run(s, BlockEnded(60.0, bid, "failed", drained=True, walltime=True)) == [
        ReportGone(bid, ("w-5",), "walltime", "failed"),
        StartBlock(6, "ckpt", SPEC),
    ]
    assert [e.cause for e in s.ends] == ["drained"] * 3 + ["walltime"] * 2
    assert list(s.replacements) == [] and s.gave_up == set()


def test_a_worker_that_crashes_while_the_scheduler_drains_it_is_a_crash() -> None:
    """The scheduler drains a busy worker (before its walltime, or an operator's
    drain): its block stops counting and its replacement is asked for. The worker is
    killed before it finished its task (SIGKILL, the OOM killer): the block fails and
    the scheduler never retired it. Its end is ``crash``, not ``walltime`` nor
    ``drained``: its drain did not finish, its tasks were lost. Already replaced, it
    spends no budget. Once retired (its story says so), a failed end is the drain's."""
    s = make(max_replacements=0)
    limits = PoolLimits(min_blocks=1, max_blocks=2, init_blocks=1, walltime=3600.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC, limits))

    def drained(now: float, n: int, walltime: bool) -> str:
        """Block ``n`` starts and the scheduler is seen draining its busy worker."""
        bid = one_block(s, now, n)
        w = frozenset({f"w-{n}"})
        why = w if walltime else frozenset()  # for its walltime, or an operator's
        seen = QueuesSeen(now + 1, {"ckpt": 0}, {f"w-{n}": 1}, w, walltime=why)
        assert run(s, seen) == [StartBlock(n + 1, "ckpt", SPEC)]
        return bid

    bid = drained(10.0, 1, walltime=True)
    assert run(s, BlockEnded(12.0, bid, "failed")) == [ReportGone(bid, ("w-1",), "crash", "failed")]
    assert s.ends[-1] == BlockEnd(bid, "ckpt", "failed", "crash", False, 12.0, 1)
    bid = drained(20.0, 2, walltime=True)
    assert run(s, BlockEnded(22.0, bid, "failed", drained=True, walltime=True)) == [
        ReportGone(bid, ("w-2",), "walltime", "failed")
    ]
    bid = drained(30.0, 3, walltime=False)  # an operator's drain
    assert run(s, BlockEnded(32.0, bid, "failed")) == [ReportGone(bid, ("w-3",), "crash", "failed")]
    assert [e.cause for e in s.ends] == ["crash", "walltime", "crash"]
    assert [e.charged for e in s.ends] == [False] * 3
    assert list(s.replacements) == [] and s.gave_up == set() and s.counts() == {"ckpt": 1}


def test_a_drain_counts_from_the_workers_latest_join_in_their_story() -> None:
    """The shell tells a drain no count showed from the scheduler's story (a real
    ``SchedulerState``'s): a drain of a block's earlier run, whose workers joined again
    under the same ids after a requeue, is not this run's; a failed end is the drain's
    only once the worker was retired."""
    sch = SchedulerState()
    w = ("w.0", "w.1")
    sch.handle(WorkerJoined("s1", 1.0, "w.0", 1, 0), WorkerJoined("s2", 1.0, "w.1", 1, 0))
    assert not drained_since_joined(sch.story(*w))
    sch.handle(WorkerDraining("s3", 2.0, "w.0"))  # idle: retired at once
    assert drained_since_joined(sch.story(*w))
    assert drained_since_joined(sch.story(*w), retired=True)
    sch.handle(WorkerLeft("s4", 3.0, "w.0", "drained"))
    sch.handle(
        WorkerLeaving("s5", 4.0, "w.1", "preempted"), WorkerLeft("s6", 5.0, "w.1", "preempted")
    )
    assert drained_since_joined(sch.story(*w))
    # The block is requeued; its second run's workers join under the same ids.
    sch.handle(WorkerJoined("s7", 10.0, "w.0", 1, 0), WorkerJoined("s8", 10.0, "w.1", 1, 0))
    assert not drained_since_joined(sch.story(*w))
    assert not drained_since_joined(sch.story(*w), retired=True)


def test_a_drain_taken_back_no_longer_counts_in_the_story() -> None:
    """A worker drained for a scale-in while busy and taken back (its pool wanted it
    again) works on as any: if its block then ends unasked, its story shows no drain
    since it was taken back, so the end is not read as the drain's (free, ``drained``)."""
    sch = SchedulerState()
    join(sch, "w.0")
    submit(sch, {"x": []}, ["x"])
    sch.handle(event(WorkerDraining, worker="w.0"))  # busy: drains, not retired
    assert drained_since_joined(sch.story("w.0"))
    sch.handle(event(WorkerUndrained, worker="w.0"))
    assert not drained_since_joined(sch.story("w.0"))
    sch.handle(event(WorkerDraining, worker="w.0"))  # drained again: that counts
    assert drained_since_joined(sch.story("w.0"))


def test_a_block_leaves_the_count_only_once_every_worker_of_it_is_drained() -> None:
    """A block of two workers: one drained by the scheduler still leaves one at work,
    so it counts; both drained, it no longer does and its replacement is asked for at
    once. Preempted while they finish, it says so, spends nothing and is not replaced
    a second time."""
    s = make(max_replacements=0)
    assert run(s, TargetSet(0.0, "p", 1, SPEC)) == [StartBlock(1, "p", SPEC)]
    assert run(s, BlockStarted(1.0, 1, "b", ("w-a", "w-b"))) == []
    busy = {"w-a": 1, "w-b": 1}
    assert run(s, QueuesSeen(2.0, {}, busy, frozenset({"w-a"}))) == []
    assert s.counts() == {"p": 1} and not s.blocks["b"].retiring
    assert run(s, QueuesSeen(3.0, {}, busy, frozenset({"w-a", "w-b"}))) == [
        StartBlock(2, "p", SPEC)
    ]
    assert s.blocks["b"].drained == {"w-a", "w-b"}
    assert run(s, QueuesSeen(4.0, {}, busy, frozenset({"w-a", "w-b"}))) == []  # once
    assert run(s, BlockEnded(5.0, "b", "preempted")) == [
        ReportGone("b", ("w-a", "w-b"), "preempted", "preempted")
    ]
    assert s.ends[-1] == BlockEnd("b", "p", "preempted", "preempted", False, 5.0, 1)
    assert s.counts() == {"p": 1} and list(s.replacements) == []


def test_a_block_whose_worker_leaves_on_its_own_still_counts() -> None:
    """A worker that said it leaves (a preemption notice) is draining in the
    scheduler's eyes, but its block may be requeued and run again: it keeps counting,
    nothing is asked for, and its requeue is the same block's next run."""
    s = make()
    assert run(s, TargetSet(0.0, "ckpt", 1, SPEC)) == [StartBlock(1, "ckpt", SPEC)]
    bid = one_block(s, 1.0, 1)
    gone = frozenset({"w-1"})
    assert run(s, QueuesSeen(2.0, {}, {"w-1": 1}, gone, leaving=gone)) == []
    assert not s.blocks[bid].retiring and s.counts() == {"ckpt": 1}
    (gone,) = run(s, BlockRequeued(3.0, bid, 2, "preempted"))
    assert gone == ReportGone(bid, ("w-1",), "preempted", "requeued")
    assert s.counts() == {"ckpt": 1} and not s.blocks[bid].retiring
    assert not gone.scaled_in and requeue_line(gone) == (
        "info", "worker block requeued: its workers are gone, the block comes back",
    )  # fmt: skip
    assert requeue_line(dataclasses.replace(gone, cause="unknown"))[0] == "warning"


def test_a_block_preempted_while_being_scaled_in_says_preempted() -> None:
    s = make()
    assert run(s, TargetSet(0.0, "p", 2, SPEC)) == [
        StartBlock(1, "p", SPEC),
        StartBlock(2, "p", SPEC),
    ]
    one_block(s, 1.0, 1, "p")
    bid = one_block(s, 1.0, 2, "p")
    assert run(s, TargetSet(2.0, "p", 1, SPEC)) == [DrainWorker("w-2", bid)]
    assert run(s, BlockEnded(3.0, bid, "preempted")) == [
        ReportGone(bid, ("w-2",), "preempted", "preempted")
    ]
    assert s.ends[-1].cause == "preempted" and s.counts() == {"p": 1}


def test_every_block_the_core_stops_is_listed_with_its_cause() -> None:
    """A block requeued after its worker was drained with its one task
    (tasks_per_worker) is stopped: its end is listed, ``drained``, after its
    ``requeued`` row (it had none: the monitoring DB wrote ``ended`` with no cause);
    a block scaled in before a worker of it joined ends ``drained``, one stopped
    because the cluster shuts down ``shutdown``. None spends the budget."""
    s = make(max_replacements=0)
    limits = PoolLimits(min_blocks=0, max_blocks=2, init_blocks=2)
    run(s, TargetSet(0.0, "condo", 2, SPEC, limits))
    used, idle = one_block(s, 1.0, 1, "condo"), one_block(s, 1.0, 2, "condo")
    seen = QueuesSeen(2.0, {"condo": 1}, {"w-1": 1, "w-2": 0}, frozenset({"w-1"}),
                      spent=frozenset({"w-1"}))  # fmt: skip
    assert run(s, seen) == []
    out = run(s, BlockRequeued(3.0, used, 2, "preempted"))
    assert out == [ReportGone(used, ("w-1",), "preempted", "requeued"), StopBlock(used)]
    # Its log line does not say it comes back: the pool stops it (audit checkpoint F4).
    assert out[0].scaled_in and requeue_line(out[0]) == (
        "info",
        "worker block requeued: its workers are gone, and the pool stops the block (it "
        "was being scaled in): it does not come back",
    )
    assert run(s, BlockStopped(3.5, used, "cancelled")) == [StartBlock(3, "condo", SPEC)]
    assert [(e.block, e.state, e.cause, e.charged) for e in s.ends] == [
        (used, "requeued", "preempted", False),
        (used, "cancelled", "drained", False),
    ]
    # Scaled in (to 0: the request in flight is taken back, then the running block is
    # drained); its worker never joined (the scheduler does not know it): stopped.
    assert run(s, TargetSet(4.0, "condo", 0, SPEC)) == [DrainWorker("w-2", idle)]
    assert s.cancelled == {3}
    assert run(s, DrainAnswered(4.1, "w-2", False)) == [StopBlock(idle)]
    assert run(s, BlockStopped(4.2, idle, "cancelled")) == []
    # The cluster shuts down: the block asked for is stopped as it starts.
    assert run(s, Shutdown(5.0), BlockStarted(5.1, 3, "condo/block-3", ("w-3",))) == [
        StopBlock("condo/block-3")
    ]
    s.handle(BlockStopped(5.2, "condo/block-3", "cancelled"))
    assert [(e.block, e.cause, e.charged) for e in s.ends][2:] == [
        (idle, "drained", False),
        ("condo/block-3", "shutdown", False),
    ]
    assert s.spent("condo") == 0


def test_completed_unasked_without_a_drain_spends_the_budget() -> None:
    s = make(max_replacements=0)
    run(s, TargetSet(0.0, "p", 1, SPEC))
    bid = one_block(s, 1.0, 1, "p")
    # No walltime configured, drained by the scheduler (an operator's drain): drained.
    run(s, QueuesSeen(2.0, {}, {"w-1": 0}, frozenset({"w-1"})))
    assert run(s, BlockEnded(3.0, bid, "completed"))[0] == ReportGone(
        bid, ("w-1",), "drained", "completed"
    )
    # Nothing explains it: replaced at once, charged once no leave came in the grace.
    bid = one_block(s, 4.0, 2, "p")
    assert run(s, BlockEnded(5.0, bid, "completed")) == [StartBlock(3, "p", SPEC)]
    assert run(s, Tick(15.0)) == [
        ReportGone(bid, ("w-2",), "unknown", "completed"),
        GaveUp("p", 1, 60.0),
    ]


def test_sbatch_failing_backs_off_to_the_providers_retry_at_and_spends_nothing() -> None:
    s = make(max_replacements=0)
    assert run(s, TargetSet(0.0, "ckpt", 1, SPEC)) == [StartBlock(1, "ckpt", SPEC)]
    failed = BlockStartFailed(
        1.0, 1, "'sbatch --parsable' failed: Unable to contact slurm controller", batch=True,
        command="sbatch --parsable", retry_at=9.0,
    )  # fmt: skip
    assert run(s, failed) == []  # not every tick: it waits
    assert s.errors["ckpt"] == BatchProblem(
        "sbatch --parsable", failed.error, 1.0, False, 9.0, 1, since=1.0
    )
    assert s.waiting("ckpt") == 8.0
    for now in (2.0, 5.0, 8.9):
        assert run(s, Tick(now)) == []
    assert run(s, Tick(9.0)) == [StartBlock(2, "ckpt", SPEC)]
    # Without a retry_at from the provider: the core's own back-off, doubling.
    assert run(s, BlockStartFailed(9.5, 2, "x", batch=True, command="sbatch")) == []
    assert s.errors["ckpt"].retry_at == 9.5 + 4.0  # second failure in a row: 2 s x 2
    assert run(s, Tick(13.4)) == []
    assert run(s, Tick(13.5)) == [StartBlock(3, "ckpt", SPEC)]
    assert run(s, BlockStartFailed(14.0, 3, "x", batch=True, command="sbatch")) == []
    assert s.errors["ckpt"].retry_at == 14.0 + 8.0
    assert (s.errors["ckpt"].at, s.errors["ckpt"].since) == (14.0, 1.0)  # the outage's start
    assert list(s.replacements) == [] and s.gave_up == set() and s.ended == 0
    # Slurm answers: the error goes, the back-off is reset.
    assert run(s, Tick(22.0)) == [StartBlock(4, "ckpt", SPEC)]
    one_block(s, 22.5, 4)
    assert s.errors == {} and s.waiting("ckpt") is None


def test_the_back_off_is_capped() -> None:
    s = make(backoff=1.0, max_backoff=5.0)
    run(s, TargetSet(0.0, "ckpt", 1, SPEC))
    now, request = 0.0, 1
    for _ in range(6):
        assert run(s, BlockStartFailed(now, request, "x", batch=True)) == []
        problem = s.errors["ckpt"]
        assert problem.retry_at is not None and problem.retry_at - now <= 5.0
        now = problem.retry_at
        (cmd,) = run(s, Tick(now))
        assert isinstance(cmd, StartBlock)
        request = cmd.request
    assert s.errors["ckpt"].failures == 6 and s.errors["ckpt"].retry_at == now


def test_suspended_submissions_pause_the_pool_until_resumed() -> None:
    s = make()
    run(s, TargetSet(0.0, "ckpt", 2, SPEC), TargetSet(0.0, "owner", 1, SPEC))
    assert sorted(s.requests) == [1, 2, 3]
    suspended = BlockStartFailed(
        1.0, 1, "the Slurm provider stopped submitting blocks", command="sbatch",
        suspended=True,
    )  # fmt: skip
    assert run(s, suspended) == []
    assert s.paused == {"ckpt"} and s.errors["ckpt"].suspended
    assert s.errors["ckpt"].retry_at is None
    assert run(s, BlockStartFailed(1.1, 2, "the same", suspended=True, command="sbatch")) == []
    for now in (10.0, 1000.0):  # however long: nothing is asked
        assert run(s, Tick(now)) == []
    one_block(s, 1000.5, 3, "owner")  # the other pool is not paused
    assert run(s, Resumed(1001.0, "ckpt")) == [
        StartBlock(4, "ckpt", SPEC),
        StartBlock(5, "ckpt", SPEC),
    ]
    assert s.paused == set() and "ckpt" not in s.errors
    with pytest.raises(ValueError, match="no pool 'nope'"):
        s.handle(Resumed(1002.0, "nope"))


def test_resuming_a_pool_that_gave_up_asks_again() -> None:
    s = make(max_replacements=0)
    run(s, TargetSet(0.0, "p", 1, SPEC))
    bid = one_block(s, 1.0, 1, "p")
    assert run(s, BlockEnded(2.0, bid, "failed"))[-1] == GaveUp("p", 1, 60.0)
    assert run(s, Resumed(3.0, "p")) == [StartBlock(2, "p", SPEC)]


# ----------------------------------------------------------------------------- the shell


class Recording(InProcessProvider):
    """In-process blocks, remembered so a test can play the batch system on them."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.started: list[Block] = []
        self.scheduler: Any = None  #: the scheduler's ref

    async def start_block(self, spec: BlockSpec) -> Block:
        block = await super().start_block(spec)
        self.started.append(block)
        return block


class SignalledAsPreempted(Recording):
    """Stopping a block reads to its worker as a preemption, as the stop signal
    (``scancel``'s SIGTERM) does to a worker inside a Slurm job: it leaves
    ``preempted``, then stops."""

    async def stop_block(self, block: Block) -> None:
        for wid in block.workers:
            await self.scheduler.tell(WorkerGone(wid, "preempted"))
        await super().stop_block(block)


@asynccontextmanager
async def one_recorded_block(
    kind: type[Recording] = Recording,
) -> AsyncIterator[tuple[Any, SchedulerState, Block, Recording]]:
    """A control plane with one in-process block (``worker-1``, joined) of a ``kind``
    of provider: the autoscaler's ref, the scheduler's core, the block and its
    provider, for a test to play the batch system on; bounded by 20 s."""
    made: list[Recording] = []

    def provider(plane: Any) -> Recording:
        made.append(kind(plane.system, worker_factory(plane.refs["scheduler"])))
        made[0].scheduler = plane.refs["scheduler"]
        return made[0]

    with anyio.fail_after(20):
        async with ActorSystem() as system:
            plane = await start_control_plane(
                system, provider=provider,
                targets={"default": PoolTarget(1, BlockSpec(1, 1, 0, 0, "default"))},
            )  # fmt: skip
            scheduler = plane.scheduler.state
            await wait_until(lambda: "worker-1" in scheduler.workers, limit=10)
            (block,) = made[0].started
            yield plane.refs["autoscaler"], scheduler, block, made[0]


async def with_ends(autoscaler: Any) -> AutoscalerStatus | None:
    """The autoscaler's status once it lists an end (or a requeue), else None."""
    st: AutoscalerStatus = await autoscaler.ask(StatusRequest())
    return st if st.ends else None


async def ended_as(autoscaler: Any, block: Block, provider: Recording, state: BlockState) -> Any:
    """End the one block of :func:`one_recorded_block` in ``state`` (its worker stops,
    the provider reads ``state``): its end, once the status lists it."""
    block.state = state
    ref = provider.ref("worker-1")
    assert ref is not None
    ref.stop()
    (end,) = (await wait_until(lambda: with_ends(autoscaler), "block-1 ended", limit=10)).ends
    return end


@pytest.mark.anyio
async def test_workers_whose_blocks_the_autoscaler_stops_at_shutdown_leave_as_shutdown() -> None:
    """The manager stops: the autoscaler stops its blocks, and their workers read the
    stop signal as a preemption. The scheduler is told first, so the worker's end is
    ``shutdown`` (its story, its pool's survival), not ``preempted``."""
    async with one_recorded_block(SignalledAsPreempted) as (autoscaler, scheduler, _, _):
        autoscaler.stop()
        await wait_until(lambda: "worker-1" not in scheduler.workers, "worker-1 gone", limit=10)
        left = [t[2] for t in scheduler.story_log if t[:2] == ("worker-1", "joined")]
        assert left[-1] == "left:shutdown", left
        assert [unasked for _, unasked in scheduler.lives["default"]] == [False]


@pytest.mark.anyio
async def test_the_shell_reports_a_requeue_and_keeps_the_block() -> None:
    async with one_recorded_block() as (autoscaler, scheduler, block, _):
        # The batch system requeued it after a preemption: a new incarnation.
        block.incarnation, block.requeue_cause = 2, "preempted"

        async def requeue_reported() -> AutoscalerStatus | None:
            st: AutoscalerStatus = await autoscaler.ask(StatusRequest())
            return st if st.ends else None

        st = await wait_until(requeue_reported, limit=10)
        (end,) = st.ends
        assert (end.block, end.state, end.cause, end.charged) == (
            "block-1", "requeued", "preempted", False,
        )  # fmt: skip
        assert st.blocks == {"block-1": "running"} and st.incarnations == {"block-1": 2}
        assert st.budget_spent == 0
        # Its worker of the first run was reported gone, as preempted.
        assert "worker-1" not in scheduler.workers
        assert ("worker-1", "joined", "left:preempted") in [t[:3] for t in scheduler.story_log]


@pytest.mark.anyio
async def test_the_shell_tells_the_scheduler_a_block_is_suspended_and_resumed() -> None:
    """The provider sees a running block held (Slurm's SUSPENDED): the scheduler holds
    its worker (no new tasks; silent, it would be lost as ``suspended``) until the
    provider sees it run again. Before, a held block was never passed on."""
    async with one_recorded_block() as (autoscaler, scheduler, block, _):
        block.state = BlockState.HELD
        await wait_until(lambda: scheduler.workers["worker-1"].suspended, limit=10)
        assert scheduler.lost_cause("worker-1", "unknown") == "suspended"
        assert "worker-1" not in scheduler.free
        st: AutoscalerStatus = await autoscaler.ask(StatusRequest())
        assert st.blocks == {"block-1": "held"} and not st.ends
        block.state = BlockState.RUNNING
        await wait_until(lambda: not scheduler.workers["worker-1"].suspended, limit=10)
        assert "worker-1" in scheduler.free
        story = [t[2] for t in scheduler.story_log if t[:2] == ("worker-1", "joined")]
        assert story == ["suspended", "resumed"]


@pytest.mark.anyio
async def test_the_shell_reports_an_operators_drain_in_a_walltime_pool_as_drained() -> None:
    """An operator drains the idle in-process worker of a pool with a walltime, an
    hour before it: the scheduler retires it at once, its block ends (``failed``, as an
    in-process block does once its worker stopped) before any count showed the drain,
    and the shell reads in the worker's story that the drain was an operator's, and
    finished. The end is ``drained``, free; before, any drained block of a pool with a
    walltime ended ``walltime``."""
    limits = PoolLimits(min_blocks=1, max_blocks=1, init_blocks=1, walltime=3600.0)
    spec = BlockSpec(1, 1, 0, 0, "default")
    with anyio.fail_after(20):
        async with ActorSystem() as system:
            plane = await start_control_plane(
                system,
                provider=lambda plane: InProcessProvider(
                    plane.system, worker_factory(plane.refs["scheduler"])
                ),
                targets={"default": PoolTarget(1, spec, limits)},
            )
            autoscaler, scheduler = plane.refs["autoscaler"], plane.scheduler.state
            await wait_until(lambda: "worker-1" in scheduler.workers, limit=10)
            await plane.refs["scheduler"].ask(DrainRequest("worker-1"))

            async def ended() -> AutoscalerStatus | None:
                st: AutoscalerStatus = await autoscaler.ask(StatusRequest())
                return st if st.ends else None

            (end,) = (await wait_until(ended, "block-1 ended", limit=10)).ends
            assert (end.block, end.state, end.cause, end.charged) == (
                "block-1", "failed", "drained", False,
            )  # fmt: skip
            assert ("worker-1", "joined", "left:drained") in [t[:3] for t in scheduler.story_log]
            # Replaced, as any drained block is: the pool keeps its one block.
            await wait_until(lambda: "worker-2" in scheduler.workers, limit=10)


@pytest.mark.anyio
async def test_a_block_at_its_walltime_ends_as_planned_not_unasked() -> None:
    """A block that reached its walltime ends as its pool planned (cause ``walltime``):
    logged at info, not as ``worker block ended unasked``, the warning for a block
    that ended when nobody meant it to (before, any cause but ``drained`` was)."""
    with log_lines("corral") as log:
        async with one_recorded_block() as (autoscaler, _, block, provider):
            end = await ended_as(autoscaler, block, provider, BlockState.TIMEOUT)
            assert (end.block, end.state, end.cause) == ("block-1", "timeout", "walltime")
        line = log.with_("worker block ended", "cause='walltime'")
        assert line is not None and "level='info'" in line
        assert not log.has("ended unasked", "block='block-1'")


@pytest.mark.anyio
async def test_a_requeue_is_logged_as_a_requeue_not_as_an_end() -> None:
    """A user audit: a REQUEUE preemption logged ``worker block ended unasked ...
    state='requeued'`` at warning level, though the block comes back. It is logged (at
    info: a preemption's requeue is expected) as what it is."""
    with log_lines("corral") as log:
        async with one_recorded_block() as (autoscaler, _, block, _):
            block.incarnation, block.requeue_cause = 2, "preempted"
            await wait_until(lambda: with_ends(autoscaler), "the requeue reported", limit=10)
        line = log.with_("worker block requeued", "block='block-1'")
        assert line is not None and "level='info'" in line, line
        assert "cause='preempted'" in line and "incarnation=2" in line
        # (an in-process block then ends: its worker stops once reported gone)
        assert not log.has("ended unasked", "state='requeued'")


@pytest.mark.anyio
async def test_a_block_that_ended_unasked_logs_why() -> None:
    """A user audit: ``worker block ended unasked ... state='failed' cause='crash'``
    and nothing else; the provider's detail (for Slurm: its state, exit code and
    stderr, and where the .err file is) was dropped with the block. It is in the log
    line, and in the status's end."""
    why = "Slurm job 42 FAILED; stderr (/run/block-1.err):\nmodule: command not found"
    with log_lines("corral") as log:
        async with one_recorded_block() as (autoscaler, _, block, provider):
            block.detail = why
            end = await ended_as(autoscaler, block, provider, BlockState.FAILED)
            assert (end.state, end.cause, end.detail) == ("failed", "crash", why)
        line = log.with_("worker block ended unasked", "block='block-1'")
        assert line is not None and "/run/block-1.err" in line, line
        assert "module: command not found" in line
