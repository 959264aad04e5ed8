"""A task that segfaults leaves its Python stack on the worker's stderr.

A user audit (why do my tasks fail?) found that a segfault in a task (thread execution,
the default) killed the worker process with no Python stack anywhere: the shell said
``Segmentation fault``, nothing more. The worker process, and each task process of
process execution, now enables :mod:`faulthandler` as it starts, so a fatal signal
prints every thread's stack, the task's function among the frames.

Real manager and worker processes on 127.0.0.1, ports 62110-62129; every wait bounded.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import TaskProcessDied
from tests.helpers import Cli

LIMIT = 60  # seconds for the manager and the worker to start, and the crash to print


def segfaults_in_the_task() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("execution", "port"), [("thread", 62110), ("process", 62120)], ids=["thread", "process"]
)
async def test_a_task_that_segfaults_prints_its_stack_on_the_workers_stderr(
    execution: str, port: int, tmp_path: Path
) -> None:
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        line = await anyio.to_thread.run_sync(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        worker = cli.start(
            "worker", address, "--execution", execution, "--port-range", f"{port + 1}-{port + 5}"
        )  # (its output: stdout and stderr, as Cli reads them)
        await anyio.to_thread.run_sync(cli.line_with, worker, "joined")
        async with Cluster(address) as c:
            fut = c.submit(segfaults_in_the_task, pure=False)
            if execution == "process":  # the worker tells (thread: nothing left to run it)
                with pytest.raises(TaskProcessDied, match="SIGSEGV"):
                    await fut
            seen: list[str] = []
            await anyio.to_thread.run_sync(
                lambda: cli.line_with(worker, "Fatal Python error: Segmentation fault", seen=seen)
            )
            stack = await anyio.to_thread.run_sync(
                lambda: cli.line_with(worker, "in segfaults_in_the_task", seen=seen)
            )
        assert "test_worker_crash_stack.py" in stack, seen[-20:]
        if execution == "thread":  # the worker process itself died of it
            assert await anyio.to_thread.run_sync(worker.wait, LIMIT) == -11
        else:  # its task process did; the worker goes on
            assert worker.poll() is None
