"""``await cluster.cancel(futures)`` returns once those futures show the cancel:
``status`` is ``"cancelled"`` and ``done()`` is true right after it (a future whose task
had finished stays ``"finished"``). Before, ``cancel`` returned at the manager's answer
and the futures read ``"pending"`` until the scheduler's word came through, about a
second later on a loaded machine (audit asyncapi F6). Embedded, and as a client of a
manager (its words over a connection with the codec on)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CancelledError
from tests.helpers import held_at_gate, nodes, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 30


def add(x: int, y: int) -> int:
    return x + y


@asynccontextmanager
async def cluster(where: str) -> AsyncIterator[Cluster]:
    if where == "embedded":
        async with Cluster(workers=1, threads_per_worker=1) as c:
            yield c
    else:
        async with nodes(1) as (address, _), Cluster(address) as c:
            yield c


@pytest.mark.parametrize("where", ["embedded", "manager"])
async def test_the_futures_read_cancelled_when_cancel_returns(tmp_path: Path, where: str) -> None:
    gate = tmp_path / "gate"
    try:
        with anyio.fail_after(LIMIT):
            async with cluster(where) as c:
                await c.wait_for_workers(1, timeout=20)
                finished = c.submit(add, 1, 2)
                assert await finished == 3
                first = c.submit(held_at_gate, str(gate), str(tmp_path / "first"))
                # running too, or waiting for a slot
                second = c.submit(held_at_gate, str(gate), str(tmp_path / "second"))
                await wait_until((tmp_path / "first").exists, "the first to start", limit=20)
                await c.cancel([first, second, finished])
                assert (first.status, second.status, finished.status) == (
                    "cancelled", "cancelled", "finished",
                )  # fmt: skip
                assert first.done() and second.done()
                with pytest.raises(CancelledError):
                    await second
                assert await finished == 3
                await c.cancel(first)  # cancelled already: returns at once
                assert first.status == "cancelled"
    finally:
        gate.touch()
