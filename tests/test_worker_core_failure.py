"""A worker whose pure core raises (a bug in Corral) leaves as lost instead of keeping
tasks it will never run: the scheduler runs them elsewhere, and a task that breaks every
core it reaches fails with ``TaskCrashedWorkers`` after ``max_crashes`` workers, as a
task that kills its workers does (docs/architecture.md, "Worker").

Before, the failed message was logged and dropped ("worker kept its outputs and tasks
after a failed message"): the tasks of that ``RunTasks`` never ran and their futures
waited forever. The fault is injected by wrapping ``WorkerState.handle``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from actors import worker_state as ws
from runtime import Cluster
from runtime.errors import TaskCrashedWorkers, WorkerCoreFailed
from tests.helpers import log_lines

pytestmark = pytest.mark.anyio

LIMIT = 60.0  #: seconds, at most, of each run


def inc(x: int) -> int:
    return x + 1


def poison(x: int) -> int:
    return x


@pytest.fixture
def broken_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., list[str]]]:
    """``broken_core(when)``: from now on a worker core raises on events for which
    ``when(events)`` holds; returns the list of the workers whose core raised."""

    def arm(when: Callable[[tuple[Any, ...]], bool]) -> list[str]:
        failed: list[str] = []
        original = ws.WorkerState.handle

        def handle(self: ws.WorkerState, *events: Any) -> Any:
            if when(events):
                failed.append(self.worker_id)
                raise RuntimeError("a bug in the worker core")
            return original(self, *events)

        monkeypatch.setattr(ws.WorkerState, "handle", handle)
        return failed

    yield arm


def first_assignment() -> Callable[[tuple[Any, ...]], bool]:
    once: list[bool] = []

    def when(events: tuple[Any, ...]) -> bool:
        if once or not any(isinstance(e, ws.TasksAssigned) for e in events):
            return False
        once.append(True)
        return True

    return when


def assigns_poison(events: tuple[Any, ...]) -> bool:
    return any(
        isinstance(e, ws.TasksAssigned) and any("poison" in str(t.key) for t in e.tasks)
        for e in events
    )


async def test_an_embedded_workers_failed_core_loses_no_task(
    broken_core: Callable[..., list[str]],
) -> None:
    """The core of the first worker to be given tasks raises: every result still comes
    back (the scheduler counts that worker lost, cause crash, and runs its tasks on the
    other or on the replacement the pool starts)."""
    async with Cluster(workers=2) as cluster:
        with anyio.fail_after(LIMIT):
            await cluster.wait_for_workers(2)
            failed = broken_core(first_assignment())
            futures = [cluster.submit(inc, i) for i in range(10)]
            assert await cluster.gather(futures) == list(range(1, 11))
    assert len(failed) == 1, failed


async def test_a_worker_process_whose_core_fails_leaves_and_its_tasks_run_elsewhere(
    broken_core: Callable[..., list[str]],
) -> None:
    """The same through a manager and two workers run as worker processes run
    (``run_manager`` and ``run_worker`` over the codec, in this process so that the
    fault reaches them): the broken worker leaves with cause ``crash`` and its
    ``run_worker`` raises :class:`WorkerCoreFailed` (the command line exits 1, so a
    service manager starts another), and the other runs its tasks."""
    from runtime.node import Tokens, run_manager, run_worker

    where: list[str] = []
    up = anyio.Event()
    ended: dict[int, BaseException | None] = {}
    gone = anyio.Event()  #: a worker's run_worker ended

    def ready(address: str, tokens: Tokens) -> None:
        where.append(address)
        up.set()

    async def worker(i: int) -> None:
        try:
            await run_worker(where[0], listen_options={"codec": True})
            ended[i] = None
        except Exception as exc:
            ended[i] = exc
        gone.set()

    with log_lines() as logs, anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_manager("inproc://", ready=ready, listen_options={"codec": True})
            )
            await up.wait()
            for i in range(2):
                tg.start_soon(worker, i)
            async with Cluster(where[0]) as cluster:
                await cluster.wait_for_workers(2)
                failed = broken_core(first_assignment())
                futures = [cluster.submit(inc, i) for i in range(10)]
                assert await cluster.gather(futures) == list(range(1, 11))
                await gone.wait()  # the broken worker's run_worker ends
                status = await cluster.status()
            tg.cancel_scope.cancel()
    assert len(failed) == 1, failed
    assert failed[0] not in [w.worker_id for w in status["workers"]], status["workers"]
    (error,) = [e for e in ended.values() if e is not None]
    assert isinstance(error, WorkerCoreFailed) and error.worker == failed[0], error
    assert logs.has("leaving", "cause='crash'"), logs.lines
    assert not logs.has("cause='drained'"), logs.lines


async def test_a_task_that_breaks_every_core_fails_after_max_crashes(
    broken_core: Callable[..., list[str]],
) -> None:
    """A task whose assignment breaks every core it reaches is not given to worker
    after worker for ever: after ``max_crashes`` (3) lost workers it fails with
    TaskCrashedWorkers, and the other tasks finish."""
    async with Cluster(workers=2) as cluster:
        with anyio.fail_after(LIMIT):
            await cluster.wait_for_workers(2)
            failed = broken_core(assigns_poison)
            bad = cluster.submit(poison, 1)
            good = [cluster.submit(inc, i) for i in range(5)]
            with pytest.raises(TaskCrashedWorkers):
                await bad
            assert await cluster.gather(good) == list(range(1, 6))
    assert len(failed) == 3, failed
