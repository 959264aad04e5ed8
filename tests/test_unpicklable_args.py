"""A task argument that cannot be pickled (a lock, an open connection...) fails that task
alone, with a clear error, wherever it would have to be pickled: by the client for a
remote manager, by the scheduler for a worker process. The other tasks of the batch run,
and the cluster keeps working.

Every test is bounded with ``anyio.fail_after``; nothing sleeps and then asserts.
"""

from __future__ import annotations

import operator
import threading

import anyio
import pytest

from runtime import Cluster, unpickling
from runtime.errors import DependencyFailed, GraphError
from runtime.graph import PickledNode, make_task
from tests.helpers import nodes

pytestmark = pytest.mark.anyio

LIMIT = 30.0  # seconds; a worker process takes a while to start on a busy machine


def inc(x: int) -> int:
    return x + 1


def _not_a_future(obj: object) -> None:
    return None


async def _check(cluster: Cluster) -> None:
    lock = threading.Lock()
    bad = cluster.submit(inc, lock)  # type: ignore[arg-type]
    good = cluster.submit(inc, 1)  # the same batch: submitted before anything awaits
    after = cluster.submit(inc, bad)  # depends on the bad one
    assert await good == 2
    with pytest.raises(GraphError) as info:
        await bad
    message = str(info.value)
    assert repr(bad.key) in message
    assert "cannot be pickled" in message and "_thread.lock" in message
    assert "inside the task" in message
    with pytest.raises((DependencyFailed, GraphError)):
        await after
    # The cluster still works: another batch, and a graph.
    assert await cluster.submit(inc, 41) == 42
    dsk = {"a": 1, "b": (operator.add, "a", 10)}
    assert await cluster.compute(dsk, "b") == 11


async def test_a_remote_manager_fails_only_the_task_that_does_not_pickle() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            await _check(cluster)


async def test_a_worker_process_fails_only_the_task_that_does_not_pickle() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, threads_per_worker=1) as cluster:
            await _check(cluster)


def test_a_node_that_does_not_pickle_loads_as_one_that_fails() -> None:
    node = make_task("inc-1", inc, (threading.Lock(),), {}, _not_a_future)
    pickled = PickledNode.of("inc-1", node)  # does not raise
    assert pickled.key == "inc-1"
    loaded = unpickling.loads(pickled.payload)
    with pytest.raises(GraphError, match=r"'inc-1'.*cannot be pickled.*_thread\.lock"):
        loaded({})
    # A node that pickles is unchanged.
    fine = unpickling.loads(
        PickledNode.of("inc-2", make_task("inc-2", inc, (1,), {}, _not_a_future)).payload
    )
    assert fine({}) == 2
