"""Manager, workers and a client as separate actor systems joined by connections.

Everything runs in this process over ``inproc://`` with the codec on, so every message
is encoded and decoded as over a websocket; the process-level tests (real processes,
ws://) build on the same code.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

import anyio
import pytest

from runtime import Cluster
from tests.helpers import GATEWAYS, nodes, wait_until

LIMIT = 20


def add(x: int, y: int) -> int:
    return x + y


def where_am_i(x: int) -> tuple[int, str]:
    return x, threading.current_thread().name


@pytest.mark.anyio
async def test_a_client_runs_a_graph_on_remote_workers() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(2) as (address, _), Cluster(address) as cluster:
            await cluster.wait_for_workers(2)
            futures = cluster.map(where_am_i, range(40))
            results = await cluster.gather(futures)
            assert [r[0] for r in results] == list(range(40))
            assert len({r[1].rsplit("-", 1)[0] for r in results}) == 2  # both workers ran
            # A task needing inputs from both workers: worker-to-worker transfer.
            total = cluster.submit(lambda xs: sum(x for x, _ in xs), futures)
            assert await total == sum(range(40))
            dsk = {"a": 1, "b": (operator.add, "a", 10), "c": (add, "b", "a")}
            assert await cluster.compute(dsk, "c") == 12


@pytest.mark.anyio
async def test_a_task_error_reaches_the_remote_client_with_its_type() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            fut = cluster.submit(operator.truediv, 1, 0)
            with pytest.raises(ZeroDivisionError):
                await fut
            status = await cluster.status()
            assert status["categories"]["truediv"]["errors"] == 1


@pytest.mark.anyio
async def test_a_vanished_worker_is_replaced_by_the_others() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(2) as (address, scopes), Cluster(address) as cluster:
            await cluster.wait_for_workers(2)
            first = await cluster.gather(cluster.map(where_am_i, range(20)))
            assert len(first) == 20
            scopes[0].cancel()  # worker 0 disappears without a word
            futures = [cluster.submit(add, i, 1000) for i in range(30)]
            assert await cluster.gather(futures) == [i + 1000 for i in range(30)]


UNPICKLED: list[int] = []


class Tracked:
    """Counts how often it is rebuilt from a pickle."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> Any:
        return (_rebuild_tracked, (self.n,))


def _rebuild_tracked(n: int) -> Tracked:
    UNPICKLED.append(n)
    return Tracked(n)


def make_tracked(n: int) -> Tracked:
    return Tracked(n)


@pytest.mark.anyio
async def test_results_are_pickled_once_and_opened_only_by_the_client() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            UNPICKLED.clear()
            value = await cluster.submit(make_tracked, 5)
            assert isinstance(value, Tracked) and value.n == 5
            # One rebuild: the client's. The manager forwarded the worker's pickle as bytes.
            assert UNPICKLED == [5]


@pytest.mark.anyio
async def test_a_worker_whose_connection_drops_rejoins_and_keeps_its_work() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            gateway = GATEWAYS[-1]
            kept = cluster.submit(add, 20, 22)  # its result stays on the worker
            assert await kept == 42
            (name,) = [n for n in gateway.peers if n.startswith("inproc://")]
            old = gateway.peers[name]
            await old.aclose()  # the connection drops; the worker process lives on
            # It rejoins under the same id within the grace period: no task is lost,
            # the result it holds is still there, and new work runs on it.
            assert await cluster.submit(add, 1, 2) == 3
            assert await kept == 42
            assert gateway.peers[name] is not old
            status = await cluster.status()
            assert [w.worker_id for w in status["workers"]] == [name]
            assert sum(c["lost"] for c in status["categories"].values()) == 0


@pytest.mark.anyio
async def test_the_gateway_forgets_the_connections_that_ended() -> None:
    # A manager that runs for days sees a connection per client session and one per
    # worker that came and went: it keeps a record of the live ones only (it kept one
    # per connection ever made).
    with anyio.fail_after(LIMIT):
        async with nodes(2) as (address, scopes):
            gateway = GATEWAYS[-1]
            for _ in range(5):
                async with Cluster(address) as cluster:
                    await cluster.wait_for_workers(2)
            scopes[0].cancel()  # a worker vanishes: lost once its 0.5 s to rejoin are up
            await wait_until(lambda: len(gateway.peers) == 1, "the clients and worker gone")
            assert len(gateway.infos) == 1
            assert set(gateway._generation) == set(gateway.peers)


def _load_only_on_the_main_thread() -> Any:
    """Loads where the manager unpickles (the event loop's thread), fails in a worker's
    executor thread: a module the workers lack."""
    if threading.current_thread() is not threading.main_thread():
        raise ModuleNotFoundError("No module named 'only_on_the_client'")
    return LoadsOnlyHere()


class LoadsOnlyHere:
    def __reduce__(self) -> Any:
        return (_load_only_on_the_main_thread, ())


def identity(x: Any) -> Any:
    return x


@pytest.mark.anyio
async def test_a_task_the_worker_cannot_load_fails_alone_with_the_reason() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            bad = cluster.submit(identity, LoadsOnlyHere())
            good = [cluster.submit(add, i, 1) for i in range(5)]  # in the same batch
            with pytest.raises(ModuleNotFoundError, match="only_on_the_client") as info:
                await bad
            # Raised by a reducer, not by importing a function's module: the error itself,
            # with a note (a missing module of a global is TaskNotLoadable:
            # tests/test_not_importable.py)
            assert any("cannot be loaded there" in n for n in info.value.__notes__)
            assert await cluster.gather(good) == [1, 2, 3, 4, 5]


@pytest.mark.anyio
async def test_a_worker_registers_the_block_its_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider starts each worker with ``CORRAL_BLOCK_ID``: the worker's info carries
    it (over the codec) and the scheduler's core keeps it, to plan no evacuation onto
    a leaving worker's siblings."""
    monkeypatch.setenv("CORRAL_BLOCK_ID", "block-7")
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            (info,) = (await cluster.status())["workers"]
            assert info.block == "block-7"
            core = GATEWAYS[-1].plane.scheduler.state
            assert core.workers[info.worker_id].block == "block-7"
