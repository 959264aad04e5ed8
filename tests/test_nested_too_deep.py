"""A task nested inside the arguments of tasks more deeply than Python's recursion
limit lets a graph be read, ``(inc, (inc, (... 0)))`` 1500 levels deep: ``submit_graph``
and ``compute`` raised a raw ``RecursionError`` (from dask's graph conversion in the
manager) and now raise a ``GraphError`` saying the limit and what to do; nothing ran and
the cluster goes on. Also through a manager process (127.0.0.1), where the client
pickles the graph first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import GraphError
from tests.helpers import Cli

pytestmark = pytest.mark.anyio
LIMIT = 60
DEPTH = 1500


def inc(x: int) -> int:
    return x + 1


def nested(depth: int) -> Any:
    task: Any = 0
    for _ in range(depth):
        task = (inc, task)
    return task


async def refused(c: Cluster) -> None:
    with pytest.raises(GraphError) as caught:
        await c.compute({"x": nested(DEPTH)}, "x")
    assert not isinstance(caught.value, RecursionError)
    text = str(caught.value)
    assert "recursion limit" in text and "keys of their own" in text, text
    assert await c.compute({"x": nested(50)}, "x") == 50  # the cluster goes on


async def test_a_task_nested_too_deeply_is_a_graph_error() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            await refused(c)


async def test_a_task_nested_too_deeply_is_a_graph_error_with_a_manager(tmp_path: Path) -> None:
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await anyio.to_thread.run_sync(cli.manager, "--no-monitoring")
        await anyio.to_thread.run_sync(cli.worker, address)
        async with Cluster(address) as c:
            await refused(c)
