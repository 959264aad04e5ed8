"""An ``async def`` task in thread execution is stopped when its try is given up: a
cancel, a release or its ``timeout=`` cancels its coroutine on the event loop it runs
on (``asyncio.CancelledError`` at the await it waits in), so it ends there and its
thread with it. Before, the coroutine ran to its end (``asyncio.run`` in the task's
thread, nothing told), keeping its thread, and a slot once the worker's abandoned
threads were spent (audit asyncapi F5). A sync task is still only given up."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CancelledError, TaskTimeout
from tests.helpers import ONE_SLOT, held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 30  # the whole test, cluster start and stop included
SEEN = 5.0  # seconds a cancelled coroutine has to say it saw the cancellation


def write(path: str, text: str) -> None:
    Path(path).write_text(text)


async def sleeper(started: str, seen: str) -> str:
    """Says it started (and in which thread), then sleeps a minute; writes what ended
    its sleep to ``seen``."""
    write(started, str(threading.get_ident()))
    try:
        await anyio.sleep(60)
    except BaseException as exc:
        write(seen, type(exc).__name__)
        raise
    return "slept"


def read(path: Path) -> Callable[[], str]:
    """What ``path`` holds ("" while it does not exist), for :func:`wait_until`."""
    return lambda: path.read_text() if path.exists() else ""


async def until_its_thread_ends(started: Path, seen: Path) -> None:
    """The coroutine saw ``asyncio.CancelledError`` and the (in-process) worker's thread
    that ran it, abandoned, ended."""
    said = await wait_until(read(seen), "the coroutine to see its cancellation", limit=SEEN)
    assert said == "CancelledError"
    ident = int(read(started)())
    await wait_until(
        lambda: all(t.ident != ident for t in threading.enumerate()),
        "the abandoned thread to end",
        limit=SEEN,
    )


async def test_an_async_task_past_its_timeout_has_its_coroutine_cancelled(tmp_path: Path) -> None:
    started, seen = tmp_path / "started", tmp_path / "seen"
    with anyio.fail_after(LIMIT):
        async with Cluster(**ONE_SLOT["thread"]) as c:  # type: ignore[arg-type]
            await c.wait_for_workers(1, timeout=20)
            fut = c.submit(sleeper, str(started), str(seen), timeout=0.5)
            with anyio.fail_after(10), pytest.raises(TaskTimeout) as info:
                await fut
            err = info.value
            assert err.ran >= 0.5 and err.stopped and err.coroutine
            assert "its coroutine (an async def task, run in a thread) was cancelled" in str(err)
            await until_its_thread_ends(started, seen)
            assert await c.submit(sum, [1, 2]) == 3


@pytest.mark.parametrize("how", ["cancel", "release"])
async def test_a_cancelled_or_released_async_task_has_its_coroutine_cancelled(
    tmp_path: Path, how: str
) -> None:
    started, seen = tmp_path / "started", tmp_path / "seen"
    with anyio.fail_after(LIMIT):
        async with Cluster(**ONE_SLOT["thread"]) as c:  # type: ignore[arg-type]
            await c.wait_for_workers(1, timeout=20)
            fut = c.submit(sleeper, str(started), str(seen))
            await wait_until(started.exists, "the task to start", limit=20)
            if how == "cancel":
                await c.cancel(fut)
                with pytest.raises(CancelledError):
                    await fut
            else:
                fut.release()
            await until_its_thread_ends(started, seen)


async def test_a_held_async_tasks_thread_gets_its_slot_back_once_cancelled(
    tmp_path: Path,
) -> None:
    """A one-thread worker with its one abandoned thread spent (a sync task that hangs,
    cancelled): a cancelled async task cannot have its thread abandoned, so the thread
    keeps its slot, but only until its coroutine ends at its cancellation: the next
    task runs while the sync one still hangs. Before, it waited for the whole sleep."""
    gate, started, seen = tmp_path / "gate", tmp_path / "started", tmp_path / "seen"
    stuck: Any = None
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(**ONE_SLOT["thread"]) as c:  # type: ignore[arg-type]
                await c.wait_for_workers(1, timeout=20)
                stuck = c.submit(held_at_gate, str(gate), str(tmp_path / "s"))
                await wait_until((tmp_path / "s").exists, "the sync task to start", limit=20)
                await c.cancel(stuck)
                fut = c.submit(sleeper, str(started), str(seen))
                await wait_until(started.exists, "the async task to start", limit=20)
                await c.cancel(fut)
                await wait_until(seen.exists, "the coroutine's cancellation", limit=SEEN)
                with anyio.fail_after(SEEN):
                    assert await c.submit(sum, [1, 2, 3]) == 6
                assert not gate.exists()
    finally:
        gate.touch()
