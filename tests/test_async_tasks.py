"""An ``async def`` task runs to its end on its worker (its coroutine on an event loop
of its own, in the task's thread or process), as dask's workers await one. Before, the
future held the coroutine object itself, 'finished', and the coroutine never ran (with
worker processes: "cannot pickle 'coroutine' object")."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from runtime import Cluster

pytestmark = pytest.mark.anyio

LIMIT = 60


async def fetch(x: int) -> int:
    await asyncio.sleep(0.01)
    return x + 1


async def fails(x: int) -> int:
    await asyncio.sleep(0)
    raise ValueError(f"no {x}")


@pytest.mark.parametrize("kind", ["in-process", "processes"])
async def test_an_async_def_task_is_awaited_on_its_worker(kind: str) -> None:
    options = {"workers": 1} if kind == "in-process" else {"processes": 1}
    with anyio.fail_after(LIMIT):
        async with Cluster(**options) as cluster:  # type: ignore[arg-type]
            assert await cluster.submit(fetch, 1) == 2
            assert await cluster.compute({"a": (fetch, 2), "b": (fetch, "a")}, "b") == 4
            with pytest.raises(ValueError, match="no 3"):
                await cluster.submit(fails, 3)
