"""Leaving a ``Cluster`` block by cancellation stops the cluster as leaving it normally
does (docs/api.md#cluster): a cancel scope cancelled around it, a deadline (``fail_after``,
``move_on_after``) passing, a sibling task failing in the same task group. Nothing is left
behind: no actor task, no worker process, no listening port, no connection to a manager
(which then no longer wants the client's keys). And a cluster that is not running raises
``CorralError`` from every public method."""

from __future__ import annotations

import asyncio
import errno
import inspect
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import psutil
import pytest

from runtime import Cluster
from runtime.errors import CorralError
from tests.helpers import Cli, held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60
HOW = ["cancel", "deadline", "sibling"]


@asynccontextmanager
async def cancelled_once(how: str, go: anyio.Event) -> AsyncIterator[None]:
    """The body runs until ``go`` is set, then is cancelled ``how``: its cancel scope
    cancelled, its ``fail_after`` deadline reached (``TimeoutError`` comes out), or a
    sibling task of its task group failing (an exception group with it comes out)."""
    if how == "cancel":
        with anyio.CancelScope() as scope:

            async def cancel() -> None:
                await go.wait()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel)
                yield
        assert scope.cancelled_caught
    elif how == "deadline":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(LIMIT) as scope:

                async def expire() -> None:
                    await go.wait()
                    scope.deadline = anyio.current_time()  # as if the time ran out now

                async with anyio.create_task_group() as tg:
                    tg.start_soon(expire)
                    yield
    else:
        with pytest.RaisesGroup(pytest.RaisesExc(LookupError, match="sibling")):
            async with anyio.create_task_group() as tg:

                async def fail() -> None:
                    await go.wait()
                    raise LookupError("a sibling task failed")

                tg.start_soon(fail)
                yield


def _other_tasks(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    return set(asyncio.all_tasks()) - before - {asyncio.current_task()}


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _refused(address: str) -> bool:
    """Whether nothing listens at ``address`` (ws://host:port) any more."""
    parts = urlsplit(address)
    with socket.socket() as s:
        return s.connect_ex((parts.hostname or "", parts.port or 0)) == errno.ECONNREFUSED


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()  # the worker threads' tasks end


def _held(started: threading.Event, gate: threading.Event) -> str:
    started.set()
    gate.wait(LIMIT)
    return "opened"


@pytest.mark.parametrize("how", HOW)
async def test_cancelling_an_embedded_cluster_block_stops_every_actor(
    how: str, gate: threading.Event
) -> None:
    """The user's finding: ``move_on_after`` around ``async with Cluster(workers=2)``
    left 15 tasks of the cluster running (close was cancelled at its first wait, with
    the cluster already marked closed); a normal exit leaves none."""
    before = set(asyncio.all_tasks())
    go = anyio.Event()
    started = threading.Event()
    with anyio.fail_after(LIMIT):
        async with cancelled_once(how, go), Cluster(workers=2) as c:
            await c.wait_for_workers(2)
            held = c.submit(_held, started, gate, pure=False)
            await wait_until(started.is_set, "the task to start")  # another thread
            go.set()
            await held  # held at its gate until the cancellation comes
    assert _other_tasks(before) == set()
    assert c._system is None
    with pytest.raises(CorralError, match="not running"):
        await c.status()


async def test_a_close_cancelled_while_it_runs_still_stops_the_cluster() -> None:
    """``close()`` called in a cancelled scope (the same as ``__aexit__`` under a
    cancellation) stops the cluster before it returns."""
    before = set(asyncio.all_tasks())
    with anyio.fail_after(LIMIT):
        cluster = Cluster(workers=1)
        await cluster.start()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await cluster.close()
    assert _other_tasks(before) == set()


@pytest.mark.parametrize("how", HOW)
async def test_cancelling_a_cluster_of_processes_stops_its_processes_and_listener(
    how: str,
) -> None:
    """The user's finding: with ``Cluster(processes=2)`` the two worker processes and the
    listening port outlived a cancelled block."""
    before = set(asyncio.all_tasks())
    children = _children()
    go = anyio.Event()
    with anyio.fail_after(LIMIT):
        async with cancelled_once(how, go), Cluster(processes=2) as c:
            await c.wait_for_workers(2, timeout=LIMIT)
            assert len(_children() - children) == 2
            go.set()
            await anyio.sleep_forever()
    assert _children() - children == set()
    assert _refused(c.gateway_address)
    assert _other_tasks(before) == set()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[Cli, str]]:
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager()
        cli.worker(address, "--cores", "2")
        yield cli, address


async def _wanted(address: str) -> int:
    async with Cluster(address, manager_alerts=None) as other:
        return int((await other.status())["wanted_keys"])


@pytest.mark.parametrize("how", HOW)
async def test_cancelling_a_client_block_releases_its_keys_on_the_manager(
    how: str, manager: tuple[Cli, str], tmp_path: Path
) -> None:
    """The user's finding: a client (``Cluster("ws://...")``) cancelled while it
    gathered kept its connection, and the manager kept wanting its keys (a second
    client saw ``wanted 2``)."""
    _, address = manager
    port = urlsplit(address).port
    gate = tmp_path / "gate"
    marks = [tmp_path / "started-1", tmp_path / "started-2"]
    before = set(asyncio.all_tasks())
    go = anyio.Event()
    try:
        with anyio.fail_after(LIMIT):
            async with cancelled_once(how, go), Cluster(address) as c:
                await c.wait_for_workers(1)
                futures = [c.submit(held_at_gate, str(gate), str(m)) for m in marks]
                # another process's progress shows only in the filesystem
                await wait_until(lambda: all(m.exists() for m in marks), "both tasks")
                assert await _wanted(address) == 2
                go.set()
                await c.gather(futures)
            assert _other_tasks(before) == set()
            mine = psutil.Process().net_connections()
            assert not [x for x in mine if x.raddr and x.raddr.port == port]
            # the manager learns of the closed connection by itself: a bounded poll
            await wait_until(lambda: _zero(address), "the manager to release the keys")
    finally:
        gate.touch()


async def _zero(address: str) -> bool:
    return await _wanted(address) == 0


# ----------------------------------------------------------------------------- not running

#: Arguments for each public method of Cluster (a new one must be added here).
_CALLS: dict[str, Callable[[Cluster], Any]] = {
    "submit": lambda c: c.submit(sum, [1]),
    "map": lambda c: c.map(abs, []),
    "submit_graph": lambda c: c.submit_graph({"a": 1}, ["a"]),
    "compute": lambda c: c.compute({"a": 1}, "a"),
    "get": lambda c: c.get({"a": 1}, "a"),
    "gather": lambda c: c.gather([]),
    "as_completed": lambda c: c.as_completed([]),
    "progress": lambda c: c.progress([]),
    "download": lambda c: c.download(None, "x"),  # type: ignore[arg-type]
    "cancel": lambda c: c.cancel([]),
    "move": lambda c: c.move([], priority=1),
    "set_policy": lambda c: c.set_policy("placement", "round-robin"),
    "scale": lambda c: c.scale(1),
    "status": lambda c: c.status(),
    "alerts": lambda c: c.alerts(),
    "story": lambda c: c.story("a"),
    "wait_for_workers": lambda c: c.wait_for_workers(1),
    "scheduler_state": lambda c: c.scheduler_state,
    "persist": lambda c: c.persist(),
    "scatter": lambda c: c.scatter(1),
    "run": lambda c: c.run(abs, 1),
    "run_sync": lambda c: c.run_sync(abs, 1),
}
#: Those that need no running cluster: starting and stopping it, reading its settings,
#: its dashboard's URL (None then), the clusters running (a static method).
_ANY_TIME = {"start", "close", "worker_memory", "worker_disk", "dashboard_link", "running"}


async def test_every_method_of_a_cluster_that_is_not_running_raises_corral_error() -> None:
    """``scheduler_state`` raised ``AttributeError`` on a cluster never started (and read
    the stale state of a closed one), ``map`` of nothing returned ``[]``: docs/api.md
    says every method raises ``CorralError`` then."""
    public = {n for n, _ in inspect.getmembers(Cluster) if not n.startswith("_")}
    assert public == set(_CALLS) | _ANY_TIME
    with anyio.fail_after(LIMIT):
        started = Cluster(workers=1)
        await started.start()
        await started.close()
        for cluster in (Cluster(workers=1), Cluster("ws://127.0.0.1:9"), started):
            for name, call in _CALLS.items():
                with pytest.raises(CorralError, match="not running"):
                    result = call(cluster)
                    if inspect.isawaitable(result):
                        await result
                    pytest.fail(f"{name} on a cluster not running returned {result!r}")


async def test_a_future_awaited_after_its_cluster_closed_says_it_was_closed() -> None:
    """It said "the cluster is not running; use `async with Cluster() as c:`", which
    reads as a misuse to a caller who did use ``async with``; a cluster never started
    still says to use it."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            fut = c.submit(sum, [1, 2])
            assert await fut == 3
            late = c.submit(sum, [3, 4])
        with pytest.raises(CorralError, match="it was closed") as caught:
            await late
        assert "use `async with" not in str(caught.value)
        with pytest.raises(CorralError, match="use `async with Cluster"):
            await Cluster(workers=1).status()
