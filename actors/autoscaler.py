"""The autoscaler actor: a thin shell around :class:`AutoscalerState`.

What lives here: :class:`Autoscaler`, which turns messages (``ScaleRequest``,
``SetPolicyRequest`` of kind ``scaling``, the ends of blocks it watches, a tick every
``tick`` seconds) into core events with ``now`` from its clock, calls
``AutoscalerState.handle`` and carries out the commands: it starts and stops blocks
through a :class:`Provider`, asks the scheduler to drain workers (``DrainRequest``) or
to take draining ones back (``UndrainRequest``) and tells it which workers are gone
(``WorkerGone``). No decisions are made here; they are in
``actors/autoscaler_state.py`` and the scaling policy (``policies/scaling.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockEnded,
    BlockHeld,
    BlockLost,
    BlockRecord,
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
    check_blocks,
    check_pool,
)
from actors.providers import Block, BlockSpec, BlockState, Provider
from policies import ON_PURPOSE, REGISTRY, PolicyRegistry, param_values
from policies.scaling import PoolLimits
from runtime.errors import (
    ActorStopped,
    AskTimeout,
    BatchSystemError,
    SubmissionsSuspended,
    did_you_mean,
)
from runtime.kernel import Actor, ActorRef, handles
from runtime.messages import (
    AutoscalerStatus,
    BatchErrorInfo,
    BlockMetrics,
    DemandRequest,
    DrainRequest,
    Message,
    MetricsReply,
    MetricsRequest,
    PolicyInfo,
    PolicyNote,
    PolicyQuery,
    RestoreRequest,
    ResumeRequest,
    ScaleRequest,
    SetPolicyRequest,
    StatusRequest,
    StoryRequest,
    UndrainRequest,
    UpcomingRequest,
    WorkerGone,
    WorkersStopping,
    WorkersSuspended,
    message,
)

if TYPE_CHECKING:
    from actors.scheduler import Scheduler

__all__ = [
    "DRAIN_RETRY",
    "MAX_DRAIN_RETRY",
    "Autoscaler",
    "PoolTarget",
    "RefusedWorker",
    "requeue_line",
]

#: seconds before a drain the scheduler did not answer in time is asked again, doubled
#: per miss up to :data:`MAX_DRAIN_RETRY` (a busy scheduler is not hurried)
DRAIN_RETRY = 0.5
MAX_DRAIN_RETRY = 30.0


@message(local=True)
class _BlockEnded(Message):
    block: Any
    state: str
    bid: str = ""  #: the block's id in the core (see Autoscaler._bid)


@message(local=True)
class _Answered(Message):
    """Autoscaler-internal: how a block request or a drain asked in the background
    went."""

    event: Any


@message(local=True)
class RefusedWorker(Message):
    """From the manager: it refused worker ``worker`` at its Hello, for ``reason`` (it
    runs another Corral protocol version): its block's end is not a crash, and its pool
    gives up at once (:class:`~actors.autoscaler_state.WorkerRefused`)."""

    worker: str
    reason: str


@message(local=True)
class _Tick(Message):
    """Autoscaler-internal: time passed."""


def _since_joined(story: Iterable[Any]) -> dict[str, list[str]]:
    """Per worker, the states its ``story`` (the scheduler's ``(key, start, finish,
    stimulus, time)`` entries, oldest first) shows since it last joined, or since its
    drain was last taken back (``undrained``: a worker taken back is as one that joined)."""
    since: dict[str, list[str]] = {}
    for e in story:
        if not isinstance(e, (list, tuple)) or len(e) < 3:
            continue
        if (e[1], e[2]) in (("-", "joined"), ("draining", "undrained")):
            since[str(e[0])] = []
        else:
            since.setdefault(str(e[0]), []).append(str(e[2]))
    return since


def drained_since_joined(story: Iterable[Any], retired: bool = False) -> bool:
    """Whether, in the scheduler's ``story`` of some workers (``(key, start, finish,
    stimulus, time)`` entries, oldest first), one of them was drained since it last
    joined (``retired``: retired, told to stop); what came before a worker's latest
    join (an earlier run of a requeued block, under the same id) does not count."""
    since = _since_joined(story)
    if retired:
        return any("retired" in seen for seen in since.values())
    return any(s.startswith("draining") for seen in since.values() for s in seen)


def left_since_joined(story: Iterable[Any]) -> dict[str, str]:
    """Per worker, why it left since it last joined, as the scheduler's ``story`` of
    some workers says: its latest ``left:CAUSE``, else its latest ``leaving:CAUSE`` (it
    said it leaves); a worker that did neither is not in it."""
    left: dict[str, str] = {}
    for wid, seen in _since_joined(story).items():
        said = [s.split(":", 1)[1] for s in seen if s.startswith(("left:", "leaving:"))]
        gone = [s.split(":", 1)[1] for s in seen if s.startswith("left:")]
        if gone or said:
            left[wid] = (gone or said)[-1]
    return left


def drained_for_walltime(story: Iterable[Any]) -> bool:
    """Whether, in the scheduler's ``story`` of some workers, the scheduler drained one
    of them since it last joined because its walltime was near (``draining:walltime
    in N s``), not for an operator (``draining``)."""
    since = _since_joined(story)
    return any(s.startswith("draining:walltime") for seen in since.values() for s in seen)


def requeue_line(cmd: ReportGone) -> tuple[str, str]:
    """The log level and line of a requeued block's report (``cmd.state`` is
    ``requeued``): the block comes back as its next run, at info for a preemption's
    requeue (expected, free), at warning for another (an operator's); one the pool was
    scaling in (``scaled_in``: a one-task block of a ``tasks_per_worker`` pool, say) is
    stopped instead, at info whatever requeued it (the pool stops it on purpose)."""
    if cmd.scaled_in:
        return "info", (
            "worker block requeued: its workers are gone, and the pool stops the block "
            "(it was being scaled in): it does not come back"
        )
    level = "info" if cmd.cause == "preempted" else "warning"
    return level, "worker block requeued: its workers are gone, the block comes back"


@dataclasses.dataclass(slots=True)
class _WatchFailures:
    """A run of a pool's provider's failures while watching its blocks (a failing
    ``squeue``), until it answers again: the latest ``error`` and when it was seen
    (``at``), when the first of the run was seen (``since``; Unix times) and how many
    failures were seen (each new error the provider reports counts one)."""

    error: Exception
    since: float
    at: float
    failures: int = 1


def batch_operation(command: str) -> str:
    """What a batch system's ``command`` was doing, by which the status words when it
    is tried again: ``submit`` (``sbatch``), ``cancel`` (``scancel``), else ``poll``
    (watching the blocks: ``squeue``, ``scontrol``)."""
    word = command.split(" ", 1)[0]
    return {"sbatch": "submit", "scancel": "cancel"}.get(word, "poll")


@dataclasses.dataclass(slots=True)
class PoolTarget:
    """A pool's blocks at start: ``n`` (the target) made from ``spec``; ``limits`` are
    a configured pool's (``actors/pools.py``): min, max and init blocks, parallelism,
    idle time."""

    n: int
    spec: BlockSpec
    limits: PoolLimits | None = None


class Autoscaler(Actor):
    """Drives a :class:`Provider` so each pool has the blocks its scaling policy wants
    (by default its target number). ``provider`` may be one provider for every pool or
    a provider per pool (``{pool: provider}``, configured pools): then the core knows
    each block as ``<pool>/<block id>`` (two providers may both have a ``block-1``)."""

    #: a shutdown gives its on_stop this long: it stops every block, one after the
    #: other, each within its provider's own bounds (a local block: SIGTERM, 5 s,
    #: SIGKILL, 5 s more), so that a block that needs SIGKILL is not left running by
    #: the kernel's default bound (10 s) cutting the stop short
    stop_timeout = 60.0

    def __init__(
        self,
        provider: Provider | Mapping[str, Provider],
        scheduler: ActorRef[Scheduler],
        targets: dict[str, PoolTarget],
        *,
        max_replacements: int = 10,
        replacement_window: float = 60.0,
        policy: Any = None,
        policies: PolicyRegistry = REGISTRY,
        tick: float = 1.0,
        drain_timeout: float = 10.0,
        max_unconfigured: int | None = None,
    ) -> None:
        self.providers: dict[str, Provider] | None = None  #: by pool, if one per pool
        if isinstance(provider, Provider):
            self.provider: Provider | None = provider
        else:
            self.provider, self.providers = None, dict(provider)
        self.scheduler = scheduler
        self.policy_registry = policies
        config = AutoscalerConfig(
            max_replacements, replacement_window, max_unconfigured=max_unconfigured
        )
        self.state = AutoscalerState(config, policy)
        self._initial = dict(targets)
        self._handles: dict[str, Block] = {}  #: provider's block objects by core id
        self._owners: dict[str, Provider] = {}  #: the provider of each, by core id
        self.tick = tick  #: seconds between ticks of the core
        self.drain_timeout = drain_timeout  #: seconds to wait for a drain's answer
        self.drains_unanswered = 0  #: drains asked that got no answer in time (then again)
        #: per pool: the provider's run of failures while watching its blocks
        self._watch_errors: dict[str, _WatchFailures] = {}
        #: kinds of request the scheduler failed to answer (logged once each)
        self._unreadable: set[str] = set()

    # -- views -----------------------------------------------------------------------

    def _ending(self) -> list[tuple[str, BlockRecord]]:
        """The live blocks and those whose end waits for their workers' leaves."""
        return [*((b, h.record) for b, h in self.state.held.items()), *self.state.blocks.items()]

    @property
    def blocks(self) -> dict[str, Block]:
        """Live blocks (not ended) by id."""
        return {b: self._handles[b] for b in self.state.blocks}

    @property
    def gave_up(self) -> set[str]:
        """Pools whose workers kept ending."""
        return set(self.state.gave_up)

    def live(self, pool: str) -> list[Block]:
        return [self._handles[b.block_id] for b in self.state.live(pool)]

    def provider_for(self, pool: str) -> Provider:
        """The provider of ``pool``'s blocks; ValueError for a pool that has none."""
        if self.providers is None:
            assert self.provider is not None
            return self.provider
        found = self.providers.get(pool)
        if found is None:
            raise ValueError(
                f"there is no pool {pool!r}{did_you_mean(pool, self.providers, '.')} The "
                f"configured pools: {', '.join(self.providers)}"
            )
        return found

    def _bid(self, pool: str, block: Block) -> str:
        """The block's id in the core: the provider's, prefixed with the pool when
        there is a provider per pool."""
        return block.block_id if self.providers is None else f"{pool}/{block.block_id}"

    # -- lifetime --------------------------------------------------------------------

    async def on_start(self) -> None:
        now = self.clock.now()
        await self._handle(
            *(TargetSet(now, p, t.n, t.spec, t.limits) for p, t in self._initial.items())
        )
        self.start_soon(self._ticks)

    async def on_stop(self) -> None:
        """Scale every pool in: stopping the autoscaler stops the workers it started."""
        await self._handle(Shutdown(self.clock.now()))

    async def _ticks(self) -> None:
        while True:
            await anyio.sleep(self.tick)
            if self.ref.mailbox.closed:
                return
            with contextlib.suppress(ActorStopped):
                self.ref.post(_Tick())

    async def _watch(self, provider: Provider, bid: str, block: Block) -> None:
        state = await provider.wait_ended(block)
        with contextlib.suppress(ActorStopped):
            self.ref.post(_BlockEnded(block, state.value, bid))

    # -- feeding the core --------------------------------------------------------------

    async def _handle(self, *events: Event) -> None:
        """Feed ``events``; carry out the commands, feeding back what came of them."""
        todo: deque[Event] = deque(events)
        while todo:
            for cmd in self.state.handle(todo.popleft()):
                followup = await self._execute(cmd)
                if followup is not None:
                    todo.append(followup)

    async def _execute(self, cmd: Command) -> Event | None:
        if type(cmd) is StartBlock:
            if self._slow(cmd.pool):
                # A batch system may take long to answer (or not answer, for its whole
                # command timeout): ask in the background, so that status, scale and
                # resume are answered meanwhile; the answer comes back as a message.
                self.start_soon(self._start_in_background, cmd)
                return None
            return await self._start(cmd)
        return await self._carry_out(cmd)

    async def _drain(self, cmd: DrainWorker) -> DrainAnswered | None:
        """Ask the scheduler to drain ``cmd.worker``: whether it knows the worker, or
        None when it did not answer within ``drain_timeout`` (busy: it may well know the
        worker, which may run tasks, so that is no answer)."""
        try:
            await self.scheduler.ask(DrainRequest(cmd.worker), timeout=self.drain_timeout)
        except AskTimeout:
            self.drains_unanswered += 1
            self.log.warning(
                "the scheduler did not answer a drain in time; asking again",
                worker=cmd.worker, block=cmd.block, timeout=self.drain_timeout,
            )  # fmt: skip
            return None
        except (ValueError, ActorStopped) as exc:
            # Not known to the scheduler (it never joined, or left): it runs nothing.
            self.log.info("worker to scale in is not known", worker=cmd.worker, why=str(exc))
            return DrainAnswered(self.clock.now(), cmd.worker, False)
        self.log.info("scaling in: draining worker", worker=cmd.worker, block=cmd.block)
        return DrainAnswered(self.clock.now(), cmd.worker, True)

    async def _undrain(self, cmd: UndrainWorker) -> UndrainAnswered:
        """Ask the scheduler to take draining ``cmd.worker`` back (its pool wants blocks
        again): whether it did. No answer within ``drain_timeout`` is a refusal: the
        core drains the block again, and the scheduler, if it did take it back
        meanwhile, drains it again too."""
        pool = b.pool if (b := self.state.blocks.get(cmd.block)) is not None else ""
        try:
            reply = await self.scheduler.ask(UndrainRequest(cmd.worker), timeout=self.drain_timeout)
        except AskTimeout:
            why = f"the scheduler did not answer within {self.drain_timeout:g} s"
        except (ValueError, ActorStopped) as exc:
            why = f"the scheduler does not know it ({exc})"
        else:
            if reply.get("undrained"):
                self.log.warning(
                    "scaling out: took back a draining worker instead of starting a block; "
                    "it takes tasks again", worker=cmd.worker, block=cmd.block, pool=pool,
                )  # fmt: skip
                return UndrainAnswered(self.clock.now(), cmd.worker, True)
            why = str(reply.get("why") or "refused")
        self.log.info("could not take back a draining worker: its block is scaled in for good",
                      worker=cmd.worker, block=cmd.block, pool=pool, why=why)  # fmt: skip
        return UndrainAnswered(self.clock.now(), cmd.worker, False, why)

    async def _drain_in_background(self, cmd: DrainWorker) -> None:
        """Ask again until the scheduler answers (each miss is logged), pausing
        :data:`DRAIN_RETRY` seconds at first, doubled per miss up to
        :data:`MAX_DRAIN_RETRY`; the answer goes to the core."""
        pause = DRAIN_RETRY
        while True:
            await anyio.sleep(pause)
            answer = await self._drain(cmd)
            if answer is not None:
                break
            pause = min(pause * 2, MAX_DRAIN_RETRY)
        with contextlib.suppress(ActorStopped):
            self.ref.post(_Answered(answer))

    def _slow(self, pool: str) -> bool:
        """``pool``'s provider may take long to start a block."""
        try:
            return self.provider_for(pool).slow_start
        except ValueError:
            return False

    async def _start_in_background(self, cmd: StartBlock) -> None:
        ev = await self._start(cmd)
        with contextlib.suppress(ActorStopped):
            self.ref.post(_Answered(ev))

    async def _start(self, cmd: StartBlock) -> Event:
        """Ask the provider for a block: the event that says how it went."""
        try:
            provider = self.provider_for(cmd.pool)
            block = await provider.start_block(cmd.spec)
        except SubmissionsSuspended as exc:
            self.log.error("the batch system refused too often: pool paused until resumed",
                           pool=cmd.pool, error=str(exc))  # fmt: skip
            return BlockStartFailed(
                self.clock.now(), cmd.request, str(exc), command="sbatch", suspended=True
            )
        except BatchSystemError as exc:
            if provider.suspended():  # this refusal stopped its submissions: pause now
                self.log.error("the batch system refused too often: pool paused until resumed",
                               pool=cmd.pool, error=str(exc))  # fmt: skip
                return BlockStartFailed(
                    self.clock.now(), cmd.request, str(exc), command=exc.command, suspended=True
                )
            wait = provider.retry_in()
            self.log.error("the batch system did not take a block; backing off",
                           pool=cmd.pool, error=str(exc), retry_in=wait)  # fmt: skip
            now = self.clock.now()
            return BlockStartFailed(
                now, cmd.request, str(exc), batch=True, command=exc.command,
                retry_at=None if wait is None else now + wait,
            )  # fmt: skip
        except Exception as exc:
            self.log.error("could not start a block", pool=cmd.pool, error=repr(exc))
            return BlockStartFailed(self.clock.now(), cmd.request, repr(exc))
        bid = self._bid(cmd.pool, block)
        self._handles[bid] = block
        self._owners[bid] = provider
        self.start_soon(self._watch, provider, bid, block)
        return BlockStarted(
            self.clock.now(), cmd.request, bid, tuple(block.workers), block.state.value
        )

    async def _carry_out(self, cmd: Command) -> Event | None:
        if type(cmd) is StopBlock:
            b = self.state.blocks.get(cmd.block)
            if self.state.closing and b is not None and b.workers:
                # Stopped because the cluster shuts down: its workers leave as
                # ``shutdown`` (a Slurm job's stop signal reads as a preemption to them).
                with contextlib.suppress(ActorStopped):
                    await self.scheduler.tell(WorkersStopping(b.workers))
            block = self._handles.pop(cmd.block)
            await self._owners.pop(cmd.block).stop_block(block)
            return BlockStopped(self.clock.now(), cmd.block, block.state.value)
        if type(cmd) is DrainWorker:
            answer = await self._drain(cmd)
            if answer is None:  # no answer in time: ask again, in the background
                self.start_soon(self._drain_in_background, cmd)
            return answer
        if type(cmd) is UndrainWorker:
            return await self._undrain(cmd)
        if type(cmd) is ReportGone:
            if cmd.block not in self.state.blocks:  # ended (a requeued block lives on)
                self._handles.pop(cmd.block, None)
                self._owners.pop(cmd.block, None)
            why = {"detail": cmd.detail} if cmd.detail else {}
            if cmd.state == "requeued":  # not an end: the same job runs again
                level, text = requeue_line(cmd)
                getattr(self.log, level)(
                    text, block=cmd.block, cause=cmd.cause, incarnation=cmd.incarnation
                )
            elif cmd.cause not in ON_PURPOSE:
                self.log.warning(
                    "worker block ended unasked", block=cmd.block, state=cmd.state,
                    cause=cmd.cause, **why,
                )  # fmt: skip
            elif cmd.cause != "drained":  # its walltime, or a shutdown: as planned
                self.log.info(
                    "worker block ended", block=cmd.block, state=cmd.state, cause=cmd.cause, **why
                )
            for wid in cmd.workers:
                with contextlib.suppress(ActorStopped):
                    await self.scheduler.tell(WorkerGone(wid, cmd.cause))
            return None
        if type(cmd) is HoldWorkers:
            self.log.warning(
                "block suspended: its workers take no new tasks" if cmd.held
                else "block resumed: its workers take tasks again",
                block=cmd.block, workers=list(cmd.workers),
            )  # fmt: skip
            with contextlib.suppress(ActorStopped):
                await self.scheduler.tell(WorkersSuspended(cmd.workers, cmd.held))
            return None
        if type(cmd) is BlockLost:
            b = self.state.blocks.get(cmd.block)
            if b is not None and not b.stopping:  # some of its workers are still there
                what = ("block lost in part: a worker of it left without a word while the "
                        "block still runs (stopped, hung or cut off): draining its other "
                        "workers, then stopping it; replacing it")  # fmt: skip
            else:
                what = ("block lost: every worker of it left without a word while it still "
                        "runs (stopped, hung or cut off): stopping it, replacing it")  # fmt: skip
            self.log.warning(
                what, block=cmd.block, pool=cmd.pool, workers=list(cmd.workers),
                seconds=round(cmd.seconds, 1),
            )  # fmt: skip
            return None
        if type(cmd) is BlockStuck:
            self.log.warning(
                "block not running by its provisioning timeout: scaling it in, replacing it",
                block=cmd.block, pool=cmd.pool, state=cmd.state, age=round(cmd.age, 1),
                provisioning_timeout=cmd.timeout,
            )  # fmt: skip
            return None
        if type(cmd) is PolicyFailed:
            self.log.error(
                "the scaling policy failed: the pool keeps its last good proposal",
                pool=cmd.pool, policy=cmd.policy, problem=cmd.problem, kept=cmd.kept,
                errors=cmd.errors,
            )  # fmt: skip
            note = (
                f"scaling policy {cmd.policy!r}, pool {cmd.pool!r}: {cmd.problem}; "
                f"kept {cmd.kept} block(s) ({cmd.errors} error(s) in the pool)"
            )
            with contextlib.suppress(ActorStopped):
                await self.scheduler.tell(PolicyNote(note))
            return None
        if type(cmd) is GaveUp and cmd.refused:
            self.log.error(
                "the manager refused this pool's workers (another Corral version); not "
                "starting any more of them until `resume POOL`",
                pool=cmd.pool, latest=cmd.latest,
            )  # fmt: skip
            return None
        if type(cmd) is GaveUp:
            self.log.error(
                "workers keep ending; not replacing them any more",
                pool=cmd.pool, ended=cmd.ended, window=cmd.window, latest=cmd.latest,
            )  # fmt: skip
            return None
        raise TypeError(f"autoscaler has no shell for {type(cmd).__name__}")  # pragma: no cover

    # -- handlers --------------------------------------------------------------------

    @handles(_BlockEnded)
    async def block_ended(self, msg: _BlockEnded) -> None:
        block: Block = msg.block
        bid = msg.bid or block.block_id
        drained = walltime = False
        known = True
        left: dict[str, str] = {}
        b = self.state.blocks.get(bid)
        if b is not None:
            block.state = BlockState(msg.state)
            failed = msg.state == "failed"
            unseen = not (b.sched_drained or b.retiring)  # no count showed a drain
            if (
                (msg.state == "completed" and not b.retiring)
                or (msg.state == "failed" and (unseen or b.retiring))
            ) and not (b.stopping or self.state.closing):
                # A failed end is the drain's only if the scheduler retired the worker
                # (told it to stop: an in-process worker's block then reads failed);
                # one that failed while draining, before that, crashed: asked of a
                # block being scaled in or drained too. A completed end unasked is
                # also told by its workers' leaves (walltime, at the batch system's
                # warning signal): one a count showed leaving is read as a drain.
                seen = await self._drained_by_scheduler(b.workers, failed)
                known = seen is not None
                drained, walltime, left = seen or (False, False, {})
        now = self.clock.now()
        ended = BlockEnded(now, bid, msg.state, drained, walltime, known, block.detail)
        await self._handle(*([WorkersLeft(now, left)] if left else []), ended)

    async def _drained_by_scheduler(
        self, workers: tuple[str, ...], retired: bool
    ) -> tuple[bool, bool, dict[str, str]] | None:
        """Whether the scheduler drained (``retired``: and retired) one of ``workers``
        since it last joined (before a walltime, an operator's drain, a scale-in), as
        their stories say: an idle worker is drained, retired and gone within a tick,
        so no count may have shown it; whether it drained one because its walltime
        was near; and why each of them left, if it did (:func:`left_since_joined`). A
        drain of an earlier run of the block (Slurm requeues it under the same worker
        ids) does not count. None if the scheduler does not answer within a tick."""
        if not workers:
            return False, False, {}
        story = await self._read(StoryRequest(tuple(workers)))
        if story is None:
            return None
        return (
            drained_since_joined(story, retired),
            drained_for_walltime(story),
            left_since_joined(story),
        )

    async def _leaves(self, now: float) -> WorkersLeft | None:
        """The leaves of the workers of the blocks whose end waits for them
        (``AutoscalerState.held``), and of the running blocks none of whose workers
        the scheduler knows (``lost_candidates``: a block whose workers left on purpose
        is not lost), as their stories say now (None: none asked, none heard, or no
        answer within a tick: the core decides at the grace's end)."""
        held = {w for h in self.state.held.values() for w in h.record.workers}
        workers = sorted(held.union(self.state.lost_candidates()))
        if not workers:
            return None
        story = await self._read(StoryRequest(tuple(workers)))
        left = left_since_joined(story) if story is not None else {}
        return WorkersLeft(now, left) if left else None

    @handles(_Answered)
    async def answered(self, msg: _Answered) -> None:
        await self._handle(msg.event)

    @handles(RefusedWorker)
    async def refused_worker(self, msg: RefusedWorker) -> None:
        await self._handle(WorkerRefused(self.clock.now(), msg.worker, msg.reason))

    @handles(_Tick)
    async def on_tick(self, msg: _Tick) -> None:
        now = self.clock.now()
        requeued = [
            BlockRequeued(now, bid, h.incarnation, h.requeue_cause or "requeued")
            for bid, b in self.state.blocks.items()
            if (h := self._handles.get(bid)) is not None and h.incarnation > b.incarnation
        ]
        running = [
            BlockRunning(now, bid)
            for bid, b in self.state.blocks.items()
            if b.state != "running"
            and (h := self._handles.get(bid)) is not None
            and h.state is BlockState.RUNNING
            and h.incarnation <= b.incarnation
        ]
        held = [
            BlockHeld(now, bid)
            for bid, b in self.state.blocks.items()
            if not b.suspended
            and (h := self._handles.get(bid)) is not None
            and h.state is BlockState.HELD
            and h.incarnation <= b.incarnation
        ]
        if requeued or running or held:
            await self._handle(*requeued, *running, *held)
        leaves = await self._leaves(now)
        if leaves is not None:
            await self._handle(leaves)
        self._note_batch_errors()
        seen = await self._queues_seen(now)
        await self._handle(seen if seen is not None else Tick(now))

    async def _queues_seen(self, now: float) -> QueuesSeen | None:
        """The scheduler's counts now (None: no answer within a tick). Whatever the
        policy: besides the queues, the core learns here which blocks' workers the
        scheduler drained (an end after that is free: walltime or drained) and which
        blocks are idle (scaled in first)."""
        # one ask: the queues, the workers and the unfit tasks from one scheduler turn
        status = await self._read(DemandRequest())
        if not isinstance(status, dict) or not isinstance(status.get("queues"), dict):
            return None
        processing = status.get("processing")
        if not isinstance(processing, dict):
            processing = None
        draining = frozenset(str(w) for k in ("draining", "retired") for w in status.get(k) or ())
        leaving = frozenset(str(w) for w in status.get("leaving") or ())
        walltime = frozenset(str(w) for w in status.get("walltime_draining") or ())
        spent = frozenset(str(w) for w in status.get("spent_draining") or ())
        retired = frozenset(str(w) for w in status.get("retired") or ())
        upcoming = await self._upcoming()
        # the ready tasks no block of a pool could run (too large for its workers): no
        # demand for it
        unfit = status.get("unfit")
        return QueuesSeen(
            now, status["queues"], processing, draining, upcoming, leaving, walltime, spent,
            retired, unfit if isinstance(unfit, dict) else {},
        )  # fmt: skip

    async def _upcoming(self) -> dict[str, list[float]] | None:
        """The scheduler's next wave, if the strategy looks ahead (None: not asked, or
        no answer within a tick: the strategy then sees ready and running tasks only)."""
        if not getattr(self.state.policy, "uses_upcoming", False):
            return None
        reply = await self._read(UpcomingRequest())
        return reply if isinstance(reply, dict) else None

    async def _read(self, msg: Message) -> Any:
        """The scheduler's answer to ``msg`` (counts, stories: what the core is told,
        never needed to go on), or None: no answer within a tick, or an error, logged
        once per kind of request (a scheduler that cannot answer it, of another
        version or a stand-in), so the autoscaler keeps scaling without it."""
        try:
            return await self.scheduler.ask(msg, timeout=self.tick)
        except (ActorStopped, AskTimeout):
            return None
        except Exception as exc:
            kind = type(msg).__name__
            if kind not in self._unreadable:
                self._unreadable.add(kind)
                self.log.warning("the scheduler could not answer; going on without it",
                                 request=kind, error=repr(exc))  # fmt: skip
            return None

    def _pool_providers(self) -> dict[str, Provider]:
        if self.providers is not None:
            return dict(self.providers)
        assert self.provider is not None
        return {p: self.provider for p in self.state.pools}

    def _note_batch_errors(self) -> None:
        """Remember each pool's provider's run of failures of the batch system while
        watching its blocks (squeue, scontrol): since when it fails (the first failure
        of the run, kept while new ones come), the latest and how many were seen."""
        now = time.time()
        for pool, provider in self._pool_providers().items():
            err = provider.batch_error()
            run = self._watch_errors.get(pool)
            if err is None:
                self._watch_errors.pop(pool, None)
            elif run is None:
                self._watch_errors[pool] = _WatchFailures(err, now, now)
            elif run.error is not err:
                run.error, run.at, run.failures = err, now, run.failures + 1

    @handles(ResumeRequest)
    async def resume(self, msg: ResumeRequest) -> dict[str, object]:
        """An operator resumes ``msg.pool``: its provider submits again, and the core
        asks for its blocks now."""
        check_pool(msg.pool, "resume", "the console's `resume gpu`, a pool status lists")
        provider = self.provider_for(msg.pool)
        if msg.pool not in self.state.pools:
            raise ValueError(f"there is no pool {msg.pool!r}")
        was = {
            "paused": msg.pool in self.state.paused or provider.suspended(),
            "backing_off": self.state.waiting(msg.pool) is not None,
            "gave_up": msg.pool in self.state.gave_up,
        }
        provider.resume()
        self.log.info("pool resumed by an operator", pool=msg.pool, **was)
        await self._handle(Resumed(self.clock.now(), msg.pool))
        return {"pool": msg.pool, **was, "blocks": self.state.counts().get(msg.pool, 0)}

    @handles(RestoreRequest)
    async def restore(self, msg: RestoreRequest) -> dict[str, int]:
        """A scale-out's target set back once its alerts resolved: the blocks beyond it
        go as they go idle (``TargetSet.idle_only``)."""
        return await self.scale(ScaleRequest(msg.n, msg.pool), idle_only=True)

    @handles(ScaleRequest)
    async def scale(self, msg: ScaleRequest, idle_only: bool = False) -> dict[str, int]:
        check_blocks(msg.pool, msg.n)
        if self.providers is not None:
            self.provider_for(msg.pool)  # a pool that was not configured: ValueError
        ps = self.state.pools.get(msg.pool)
        now = self.clock.now()
        if msg.hold is not None:
            if not msg.hold > 0:
                raise ValueError(f"hold must be > 0 seconds, got {msg.hold!r}")
            if ps is None:
                raise ValueError(f"there is no pool {msg.pool!r} to scale out for a while")
            await self._handle(TargetRaised(now, msg.pool, msg.n, now + msg.hold))
            return self.state.counts()
        if ps is None:  # no pool is configured (else provider_for refused it): a new one
            self._new_pool(msg.pool)
        spec = ps.spec if ps is not None else BlockSpec(pool=msg.pool)
        events: list[Event] = []
        if ps is not None and msg.n < self.state.counts().get(msg.pool, 0):
            # Scaling in picks idle blocks first: judge them by the counts now, not
            # by the last tick's (a block idle then may have taken tasks since).
            seen = await self._queues_seen(self.clock.now())
            if seen is not None:
                events.append(seen)
        target = TargetSet(self.clock.now(), msg.pool, msg.n, spec, idle_only=idle_only)
        await self._handle(*events, target)
        return self.state.counts()

    def _new_pool(self, pool: str) -> None:
        """``scale(n, pool)`` names a pool this autoscaler, which configures none, has
        not had: it makes it (documented: tasks of that pool get workers so), and says
        so, with the pools there are, so that a misspelt name does not cost workers
        unseen."""
        known = sorted(self.state.pools)
        self.log.warning(
            "scale makes a new pool",
            pool=pool,
            pools=", ".join(known) or "none",
            hint=f"no pool is configured, so scale(n, pool={pool!r}) starts workers in a "
            f"new pool of that name, which only tasks given pool={pool!r} use"
            f"{did_you_mean(pool, known, '.')} scale(0, pool={pool!r}) stops them",
        )

    @handles(PolicyQuery)
    def policy(self, msg: PolicyQuery) -> PolicyInfo:
        """The scaling policy in use and the names one may switch to."""
        return self.policy_registry.info("scaling", self.state.policy)

    @handles(SetPolicyRequest)
    async def set_policy(self, msg: SetPolicyRequest) -> PolicyInfo:
        if msg.kind != "scaling":
            raise ValueError(f"the autoscaler has only a scaling policy, not {msg.kind!r}")
        policy = self.policy_registry.create(msg.kind, msg.name, msg.params)
        await self._handle(PolicyChanged(self.clock.now(), policy))
        return self.policy_registry.info(msg.kind, policy)

    @handles(MetricsRequest)
    def metrics(self, msg: MetricsRequest) -> MetricsReply:
        """The autoscaler's fields of a ``MetricsReply``: per pool, its blocks by state,
        the age of the oldest not running yet, and whether it is suspended (by the core,
        or by its provider); the scaling policy's errors."""
        states = {b: self._handles[b].state.value for b in self.state.blocks}
        blocks = self.state.block_metrics(self.clock.now(), states)
        for pool, provider in self._pool_providers().items():
            if pool in blocks and provider.suspended():
                blocks[pool]["suspended"] = 1
        stuck = self.state.stuck
        name = str(getattr(self.state.policy, "name", type(self.state.policy).__name__))
        return MetricsReply(
            blocks={
                pool: BlockMetrics(**m, stuck=stuck.get(pool, 0)) for pool, m in blocks.items()
            },
            policy_errors=self.state.problems.counts([("scaling", name)]),
        )

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> AutoscalerStatus:
        st = self.state
        now, wall = self.clock.now(), time.time()
        self._note_batch_errors()
        errors: dict[str, BatchErrorInfo] = {}
        for pool, provider in self._pool_providers().items():
            suspended = pool in st.paused or provider.suspended()
            problem = st.errors.get(pool)
            if problem is not None:
                errors[pool] = BatchErrorInfo(
                    problem.command, problem.error, wall - (now - problem.at), suspended,
                    st.waiting(pool), problem.failures, pool in st.requests.values(),
                    wall - (now - problem.since), "submit",
                )  # fmt: skip
            elif (run := self._watch_errors.get(pool)) is not None:
                command = getattr(run.error, "command", "") or type(run.error).__name__
                errors[pool] = BatchErrorInfo(
                    command, str(run.error), run.at, suspended, failures=run.failures,
                    since=run.since, operation=batch_operation(command),
                )  # fmt: skip
        return AutoscalerStatus(
            targets={p: s.target for p, s in st.pools.items()},
            desired={p: s.desired for p, s in st.pools.items()},
            # a block whose end waits for its workers' leaves is listed as it was until
            # its end is decided, listed once with its cause (not as an end without one)
            blocks={
                **{b: h.record.state for b, h in st.held.items()},
                **{b: self._handles[b].state.value for b in st.blocks},
            },
            retiring=tuple(sorted(b.block_id for b in st.blocks.values() if b.retiring)),
            ended=st.ended,
            gave_up=tuple(sorted(st.gave_up)),
            policy=getattr(st.policy, "name", type(st.policy).__name__),
            policy_params=param_values(st.policy),
            policy_errors=st.policy_errors,
            policy_errors_by=dict(st.policy_errors_by),
            policy_problems=dict(st.policy_problem),
            policy_failing=dict(st.policy_failing),
            incarnations={
                b: self._handles[b].incarnation
                for b in st.blocks
                if self._handles[b].incarnation > 1
            },
            details={b: self._handles[b].detail for b in st.blocks if self._handles[b].detail},
            ends=tuple(dataclasses.replace(e, at=wall - (now - e.at)) for e in st.ends),
            budget_spent=st.spent(),
            budget_by_pool={p: st.spent(p) for p in st.replacements},
            budget=st.config.max_replacements,
            batch_errors=errors,
            paused=tuple(sorted(st.paused)),
            block_pools={b: r.pool for b, r in self._ending()},
            block_workers={b: tuple(r.workers) for b, r in self._ending()},
            last_failures=dict(st.last_failure),
        )
