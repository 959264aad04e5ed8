"""A task killed for memory is retried only on a worker with a larger memory limit:
real manager and worker processes (``--execution process``) of two memory sizes over
websockets on 127.0.0.1, a task process really killed at the terminate fence.

The user audit: a task growing past 1 GiB was killed on a 1 GiB worker, got its free
retry on a 512 MiB one, and failed there too. The pure core's rules are pinned in
tests/test_scheduler_memory.py; this is the same rule end to end."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from runtime import Cluster
from tests.helpers import Cli, held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 120  # seconds: three Python processes start on a shared machine
MiB = 2**20


def hog(gate: str, nbytes: int) -> int:
    """Allocate ``nbytes`` (touched: resident), then hold them until the test opens
    ``gate`` and 2 s more, so the worker's 50 ms memory samples see them (at most 60 s:
    on a worker too small for them, the terminate fence kills it first)."""
    block = np.ones(nbytes // 8)
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    held_until = time.monotonic() + 2.0
    while time.monotonic() < held_until:
        time.sleep(0.01)
    return int(block[0])


async def test_a_task_killed_for_memory_is_retried_on_the_larger_worker_not_the_free_one(
    tmp_path: Path,
) -> None:
    """``small`` (256 MiB) is free and ``large`` (768 MiB) busy when the 320 MiB hog is
    killed on ``small``: the retry waits for ``large`` and finishes there. (Before, it
    went back to ``small``, the cheaper free worker, and failed with TaskOutOfMemory
    after two tries.)"""
    gate, started = tmp_path / "gate", tmp_path / "started"
    run = anyio.to_thread.run_sync
    flags = ("--cores", "1", "--execution", "process", "--spill", "off")
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        try:
            _, address = await run(cli.manager)
            small = await run(lambda: cli.worker(address, "--name", "small", "--memory",
                                                 "256MiB", *flags))  # fmt: skip
            await run(lambda: cli.worker(address, "--name", "large", "--memory", "768MiB",
                                         *flags))  # fmt: skip
            async with Cluster(address) as c:
                await c.wait_for_workers(2, timeout=60)
                # Only large has the memory the blocker asks for: it keeps large busy.
                blocker = c.submit(
                    held_at_gate, str(gate), str(started), key="blocker",
                    resources={"memory": 600 * MiB},
                )  # fmt: skip
                await wait_until(started.exists, "the blocker to start", limit=60, step=0.01)
                big = c.submit(hog, str(gate), 320 * MiB, key="hog-0")
                # Killed on small (free; large runs the blocker), past its terminate fence.
                line = await run(cli.line_with, small, "killed a task past the terminate fence")
                assert "hog-0" in line, line
                gate.touch()  # the blocker ends; large is free for the retry
                assert await blocker == "opened"
                assert await big == 1
                st = await c.status()
        finally:
            gate.touch()
            cli.stop()
    # One try killed (on small); the retry finished, so on large: on small, whose
    # terminate fence is at 243 MiB, 320 MiB are killed again.
    hogs = st["categories"]["hog"]
    assert (hogs["oom"], hogs["count"]) == (1, 1), hogs
    assert hogs["peak_rss"] > 320 * MiB  # seen on large, where it was not killed
