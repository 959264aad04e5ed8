"""Task arguments (values in the graph itself, not inputs from other tasks) that are
large, sent to a worker process: a batch of tasks whose arguments together pass the
256 MiB one message may carry goes a task at a time; a single task's arguments past
it fail that task with TaskArgumentsTooLarge, saying what to do, and the worker goes
on. Before, the batch was dropped and the connection's sender stopped: nothing more
reached that worker, with no error and no log (a dask user's da.from_array of a 610
MiB array on Cluster(processes=1) hung)."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from runtime import Cluster, DependencyFailed, GraphError, TaskArgumentsTooLarge
from runtime.codec import MAX_FRAME_BYTES
from tests.helpers import Cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 120


def total(a: np.ndarray) -> float:
    return float(a.sum())


def size(b: bytes) -> int:
    return len(b)


def inc(x: int) -> int:
    return x + 1


async def test_large_arguments_go_a_task_at_a_time_and_one_too_large_fails_alone() -> None:
    chunk = np.ones(MAX_FRAME_BYTES // 8 * 5 // 8)  # 5/8 of the limit: two pass it
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, memory_per_worker="3GiB") as cluster:
            await cluster.wait_for_workers(1)
            graph = {("x", 0): (total, chunk), ("x", 1): (total, chunk * 2)}
            got = await cluster.compute(graph, [("x", 0), ("x", 1)])
            assert got == (chunk.size, 2.0 * chunk.size)
            too_large = b"\0" * (MAX_FRAME_BYTES + 1)
            with pytest.raises(TaskArgumentsTooLarge, match="make or load it in a task") as info:
                await cluster.compute({"big": (size, too_large)}, "big")
            assert info.value.fields["limit"] == MAX_FRAME_BYTES
            assert info.value.fields["size"] > MAX_FRAME_BYTES
            assert await cluster.submit(inc, 2) == 3  # the worker goes on


async def test_a_remote_client_sends_large_submits_apart_and_fails_only_what_cannot_go(
    tmp_path: Path,
) -> None:
    """Submits made together go to a manager process as one graph; past the limit the
    client sends them in halves, a task whose own arguments are too large fails alone
    (its dependents with it), and a graph too large for compute() is a GraphError."""
    chunk = np.ones(MAX_FRAME_BYTES // 8 * 5 // 8)
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager()
        cli.worker(address, "--memory", "3GiB")
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as cluster:
                a = cluster.submit(total, chunk)
                b = cluster.submit(total, chunk * 2)
                too_large = cluster.submit(size, b"\0" * (MAX_FRAME_BYTES + 1))
                after = cluster.submit(inc, too_large)
                assert await cluster.gather([a, b]) == [chunk.size, 2.0 * chunk.size]
                with pytest.raises(TaskArgumentsTooLarge, match="make or load it in a task"):
                    await too_large
                with pytest.raises(DependencyFailed):
                    await after
                graph = {"big": (size, b"\0" * (MAX_FRAME_BYTES + 1))}
                with pytest.raises(GraphError, match="nothing of it was sent"):
                    await cluster.compute(graph, "big")
                assert await cluster.submit(inc, 2) == 3
