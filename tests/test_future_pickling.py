"""Review 1207g F2: a Future pickles as a reference to its key (``TaskRef``) only in
the tasks of a graph or dask collection (compute, persist, submit_graph), where dask
reads a nested future as a reference. Inside an object, a dict key, a closure or a
scattered value given to ``submit``, it reached a task process or a manager process as
a bare ``TaskRef`` (no value, no dependency) while thread workers saw the Future; it is
refused again, saying to pass the future as an argument."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import dask.array as da
import pytest

from runtime import Cluster
from runtime.errors import DependencyFailed, GraphError
from tests.helpers import Cli, free_port_between, held_at_gate, manager_with_a_worker, wait_until

pytestmark = pytest.mark.anyio

LIMIT = 60
PORTS = (57000, 57899)
WORKER_PORTS = "57900-57999"
ADVICE = "Pass the future as an argument"


@dataclasses.dataclass
class Box:
    item: object


def peek(x: Any) -> str:
    return repr(x)


def forty_one() -> int:
    return 41


@pytest.mark.timeout(LIMIT)
async def test_a_future_hidden_in_an_argument_is_refused_by_a_task_process() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, memory_options={"execution": "process"}) as c:
            fut = c.submit(forty_one)
            await fut
            for hidden in (
                lambda: c.submit(peek, Box(fut)),  # in an object
                lambda: c.submit(peek, {fut: 1}),  # as a dict key
                lambda: c.submit(lambda: repr(fut)),  # in a closure
            ):
                with pytest.raises(TypeError, match=ADVICE):
                    await hidden()
            scattered = await c.scatter(Box(fut))  # a scattered object
            with pytest.raises(DependencyFailed, match=ADVICE):
                await c.submit(peek, scattered)
            # As an argument, or in a list among them: its value.
            assert await c.submit(peek, fut) == "41"
            assert await c.submit(peek, [fut, {"a": fut}]) == "[41, {'a': 41}]"
            # A persisted collection's futures in its graph: references, computed.
            p = await c.persist(da.ones(10, chunks=5))
            assert await c.compute(p.sum()) == 10


def first(x: Any, _gate: Any) -> Any:
    return x


@pytest.mark.timeout(LIMIT)
async def test_a_hidden_future_is_refused_after_its_tasks_own_future_is_let_go(
    tmp_path: Path,
) -> None:
    # Review of 1207g F2's fix: the refusal held only while the client held the task's
    # own future, so submit(g, submit(f, Box(fut))) (a temporary future) or
    # submit(f, await scatter(Box(fut))) gave the task Box(TaskRef(...)), no error.
    go, started = tmp_path / "go", tmp_path / "started"
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, memory_options={"execution": "process"}) as c:
            fut = c.submit(forty_one)
            await fut
            gate = c.submit(held_at_gate, str(go), str(started))  # until the futures go
            inner = c.submit(first, Box(fut), gate)
            outer = c.submit(first, inner, gate)
            [scattered] = await c.scatter([Box(fut)])
            reader = c.submit(first, scattered, gate)
            keys = (inner.key, scattered.key)
            del inner, scattered
            for key in keys:  # their client lets go of them (garbage collected)
                await wait_until(lambda k=key: k not in c._client_actor.watches)
            go.touch()
            for future in (outer, reader):
                with pytest.raises(DependencyFailed, match=ADVICE):
                    await future


async def _to_manager(address: str, token: str) -> None:
    async with Cluster(address, token=token) as c:
        await c.wait_for_workers(1, timeout=LIMIT)
        fut = c.submit(forty_one)
        await fut
        # (refused as the submission is pickled: the task fails, nothing of it sent)
        with pytest.raises(GraphError, match=ADVICE):
            await c.submit(peek, Box(fut))
        assert await c.submit(peek, [fut]) == "[41]"
        p = await c.persist(da.ones(10, chunks=5))
        assert await c.compute(p.sum()) == 10


@pytest.mark.timeout(LIMIT)
def test_a_future_hidden_in_an_argument_is_refused_on_the_way_to_a_manager_process(
    tmp_path: Path,
) -> None:
    port = free_port_between(*PORTS)

    async def main(address: str, token: str) -> None:
        with anyio.fail_after(LIMIT):
            await _to_manager(address, token)

    with Cli(tmp_path / "home") as cli:
        anyio.run(main, *manager_with_a_worker(cli, port, WORKER_PORTS))
