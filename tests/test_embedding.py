"""Embedding: hosted actor systems and clusters, helper-task failures, crash reporting."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import ActorCrashed, ActorStopped, CorralError, UnknownPolicyError
from runtime.kernel import Actor, ActorSystem, handles
from runtime.messages import Message, Ping, Pong, ReleaseKeysRequest, TasksDone, message

LIMIT = 15


@message("test.embedding.Work")
class Work(Message):
    n: int


class Echo(Actor):
    @handles(Ping)
    def ping(self, msg: Ping) -> Pong:
        return Pong(msg.token)


class HelperRunner(Actor):
    """Starts a helper task that raises; records what the supervisor does."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.restarted = anyio.Event()
        self.starts = 0

    async def on_start(self) -> None:
        self.starts += 1
        if self.starts > 1:
            self.restarted.set()

    async def on_failure(self, error: BaseException, msg: Message) -> None:
        self.failures.append(repr(error))

    @handles(Work)
    def work(self, msg: Work) -> None:
        async def helper() -> None:
            raise ValueError(f"helper {msg.n} broke")

        self.start_soon(helper)

    @handles(Ping)
    def ping(self, msg: Ping) -> Pong:
        return Pong(msg.token)


@pytest.mark.anyio
async def test_hosted_system_starts_in_one_task_and_stops_in_another() -> None:
    with anyio.fail_after(LIMIT):
        system = ActorSystem()

        async def setup() -> Any:
            await system.start()
            return await system.spawn(Echo(), "echo")

        loop = asyncio.get_running_loop()
        ref = await loop.create_task(setup())
        assert system.running
        assert await ref.ask(Ping(7)) == Pong(7)
        await loop.create_task(system.stop())
        assert ref.stopped
        assert not system.running
        with pytest.raises(ActorStopped):
            await ref.ask(Ping(1))


class SlowToStop(Actor):
    """An actor whose ``on_stop`` waits (it flushes, says goodbye) before it is done."""

    def __init__(self) -> None:
        self.done = False

    async def on_stop(self) -> None:
        await anyio.sleep(0.05)
        self.done = True


@pytest.mark.anyio
async def test_a_hosted_system_stopped_in_a_cancelled_scope_has_stopped_when_it_returns() -> None:
    """``stop()`` went on with the shutdown in the background when its caller was
    cancelled, and returned before the actors had stopped."""
    with anyio.fail_after(LIMIT):
        system = ActorSystem()
        await system.start()
        actor = SlowToStop()
        ref = await system.spawn(actor, "slow")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await system.stop()
    assert ref.stopped and actor.done
    assert not system.running


@pytest.mark.anyio
async def test_a_cluster_entered_in_a_cancelled_scope_leaves_nothing_running() -> None:
    """A deadline already passed when the block is entered: the actor system's own
    task, started before ``start()`` saw the cancellation, was left waiting for ever."""
    before = set(asyncio.all_tasks())
    with anyio.fail_after(LIMIT):
        with anyio.CancelScope() as scope:
            scope.cancel()
            async with Cluster(workers=1):
                pytest.fail("the block ran in a cancelled scope")  # pragma: no cover
    assert scope.cancelled_caught
    assert set(asyncio.all_tasks()) - before - {asyncio.current_task()} == set()


@pytest.mark.anyio
async def test_a_failing_helper_task_restarts_the_actor_and_the_system_lives_on() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = HelperRunner()
            ref = await system.spawn(actor, max_restarts=3)
            await ref.tell(Work(1))
            await actor.restarted.wait()
            assert actor.failures == ["ValueError('helper 1 broke')"]
            assert await ref.ask(Ping(3)) == Pong(3)  # still serving


@pytest.mark.anyio
async def test_a_helper_failing_past_the_budget_crashes_the_system() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(ActorCrashed, match="helper 2 broke"):
            async with ActorSystem() as system:
                ref = await system.spawn(HelperRunner(), max_restarts=0)
                await ref.tell(Work(2))
                await ref.wait_stopped()


@pytest.mark.anyio
async def test_cluster_start_and_close_from_different_tasks() -> None:
    with anyio.fail_after(LIMIT):
        cluster = Cluster(workers=1)
        loop = asyncio.get_running_loop()
        await loop.create_task(cluster.start())
        fut = cluster.submit(sum, [1, 2, 3])
        assert await fut == 6
        await loop.create_task(cluster.close())
        with pytest.raises(CorralError, match="not running"):
            cluster.submit(sum, [1])


@pytest.mark.anyio
async def test_the_gc_thresholds_change_only_when_asked() -> None:
    """The collector's thresholds belong to the process: a cluster leaves them alone
    unless given ``gc_threshold``, and then restores them when it stops."""
    before = gc.get_threshold()
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            assert await cluster.submit(sum, [1, 2]) == 3
            assert gc.get_threshold() == before
        assert gc.get_threshold() == before
        async with Cluster(workers=1, gc_threshold=before[0] + 50_000) as cluster:
            assert await cluster.submit(sum, [1, 2]) == 3
            assert gc.get_threshold() == (before[0] + 50_000, *before[1:])
        assert gc.get_threshold() == before


@pytest.mark.anyio
async def test_cluster_start_errors_come_out_unwrapped() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(UnknownPolicyError, match="no placement policy named 'nope'"):
            async with Cluster(workers=1, policies={"placement": "nope"}):
                pass


@pytest.mark.anyio
async def test_a_user_exception_in_the_cluster_block_comes_out_as_itself() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(LookupError, match="mine"):
            async with Cluster(workers=1):
                raise LookupError("mine")


@pytest.mark.anyio
async def test_a_crashed_control_actor_is_reported_by_close() -> None:
    with anyio.fail_after(LIMIT):
        cluster = Cluster(workers=1)
        await cluster.start()
        manager = cluster._manager
        # Crash the manager for good: a told message its handler chokes on (keys=None is
        # not iterable), more times than its restart budget (3 in 60 s) allows.
        for _ in range(10):  # more failures than the default budget of 3 in 60 s
            if manager.stopped:
                break
            manager.post(ReleaseKeysRequest(None, "client"))  # type: ignore[arg-type]
        await manager.wait_stopped()
        with pytest.raises(ActorCrashed, match="manager"):
            await cluster.close()


@pytest.mark.anyio
async def test_pending_futures_fail_when_the_cluster_crashes() -> None:
    with anyio.fail_after(LIMIT):
        cluster = Cluster(workers=1)
        await cluster.start()
        waiting = cluster.submit(_block, key="blocked")
        # Crash the scheduler (no restarts): a told message whose handler raises.
        cluster._refs["scheduler"].post(TasksDone("nobody", None))  # type: ignore[arg-type]
        with pytest.raises(CorralError, match="cluster stopped"):
            await waiting
        _RELEASE.set()
        with pytest.raises(ActorCrashed, match="scheduler"):
            await cluster.close()


_RELEASE = threading.Event()


def _block() -> int:
    _RELEASE.wait(10)
    return 1
