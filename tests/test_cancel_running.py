"""Cancelling a running task frees its worker's slot (issue 9): the next task runs at
once, in thread execution (the stuck thread is abandoned and replaced) and in process
execution (the task process is killed), and the cluster's status shows the abandoned
thread until its task ends.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CancelledError
from tests.helpers import ONE_SLOT, gated_cluster, held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60


@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_cancelling_a_running_task_frees_its_slot(tmp_path: Path, execution: str) -> None:
    async with gated_cluster(tmp_path, LIMIT, **ONE_SLOT[execution]) as (c, gate, started):
        blocked = c.submit(held_at_gate, str(gate), str(started))
        # Another thread's or process's progress: a bounded poll.
        await wait_until(started.exists, "the task to start", limit=30, step=0.005)
        await c.cancel(blocked)
        with pytest.raises(CancelledError):
            await blocked
        # One thread, one slot: the next task runs while the gate is still shut.
        assert await c.submit(sum, [1, 2, 3]) == 6
        st = await c.status()
        assert st["tasks_by_state"].get("processing", 0) == 0
        if execution == "thread":
            (mem,) = st["memory"].values()
            assert mem["abandoned"] == 1  # shown until its task ends


def inc(x: int) -> int:
    return x + 1


async def test_a_key_cancelled_on_its_worker_and_submitted_again_computes(
    tmp_path: Path,
) -> None:
    """The same pure call, cancelled while it waits on the worker behind a running task,
    then submitted again: the worker has the cancelled try still, so the new try runs
    after it there, and its report, not the cancelled one's, settles the key."""
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(workers=1, threads_per_worker=1) as c:
                await c.wait_for_workers(1, timeout=60)
                # inc known short, so it is sent to wait behind the running task
                # (a category with no finished try waits for a free core instead)
                assert await c.submit(inc, 0) == 1
                blocked = c.submit(held_at_gate, str(gate), str(started))
                await wait_until(started.exists, "the task to start", limit=30, step=0.005)
                first = c.submit(inc, 41)
                key = first.key

                async def sent(times: int) -> bool:
                    story = await c.story(key)
                    return [row[1:3] for row in story].count(("queued", "processing")) == times

                await wait_until(lambda: sent(1), "inc to be sent to the worker", limit=30)
                await c.cancel(first)
                with pytest.raises(CancelledError):
                    await first
                again = c.submit(inc, 41)  # with ``first`` still held
                assert again.key == key
                await wait_until(lambda: sent(2), "inc to be sent again", limit=30)
                gate.touch()
                assert await again == 42
                assert await first == 42  # the same key: it follows the run
                assert await blocked == "opened"
    finally:
        gate.touch()
