"""Cancelling a running task frees its worker's slot (issue 9): the next task runs at
once, in thread execution (the stuck thread is abandoned and replaced) and in process
execution (the task process is killed), and the cluster's status shows the abandoned
thread until its task ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CancelledError
from tests.helpers import held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60


@pytest.mark.parametrize(
    "options",
    [
        {"workers": 1, "threads_per_worker": 1},
        {"processes": 1, "threads_per_worker": 1, "memory_options": {"execution": "process"}},
    ],
    ids=["thread", "process"],
)
async def test_cancelling_a_running_task_frees_its_slot(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(**options) as c:
                await c.wait_for_workers(1, timeout=60)
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
                if "processes" not in options:
                    (mem,) = st["memory"].values()
                    assert mem["abandoned"] == 1  # shown until its task ends
    finally:
        gate.touch()
