"""A task cancelled (or failed) and submitted again while its old future is alive runs
again, and its futures, old and new, get that run's result: the cancel's word, on its
way to the client when the task is submitted again, is older than the submission and
does not settle it (``KeyTaken``).

In this process (``Cluster(workers=1)``) and over a connection to a manager
(``nodes``: a manager and a worker over ``inproc://`` with the codec on). Tasks that
must keep running wait on a gate (a ``threading.Event``) the test opens; the test waits
for them to start on another event, never sleeps and then asserts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from runtime import Cluster
from tests.helpers import nodes

pytestmark = pytest.mark.anyio
LIMIT = 30

GATE = threading.Event()
STARTED = threading.Event()
TRIES: dict[str, int] = {}


def gated(x: int) -> int:
    """Says it started, then runs until the test opens the gate."""
    STARTED.set()
    if not GATE.wait(LIMIT):
        raise TimeoutError("the gate never opened")
    return x


def fails_first(name: str) -> str:
    """Raises on its first try, returns ``name`` on the next ones."""
    TRIES[name] = TRIES.get(name, 0) + 1
    if TRIES[name] == 1:
        raise ValueError(f"{name}: first try")
    return name


@pytest.fixture(autouse=True)
def gate() -> Iterator[None]:
    GATE.clear()
    STARTED.clear()
    TRIES.clear()
    yield
    GATE.set()  # never leave a worker thread blocked


@contextlib.asynccontextmanager
async def cluster(where: str) -> AsyncIterator[Cluster]:
    if where == "local":
        async with Cluster(workers=1, threads_per_worker=1) as c:
            yield c
        return
    async with nodes(n_workers=1) as (address, _), Cluster(address) as c:
        await c.wait_for_workers(1, timeout=LIMIT)
        yield c


async def started() -> None:
    assert await anyio.to_thread.run_sync(STARTED.wait, LIMIT), "the task never started"


@pytest.mark.parametrize("where", ["local", "remote"])
@pytest.mark.parametrize("how", ["submit", "map", "submit_graph", "compute"])
async def test_a_task_cancelled_and_submitted_again_at_once_gives_its_new_result(
    where: str, how: str
) -> None:
    """Submitted again right after ``await cancel(...)`` returns, before the cancel's
    word reached the client: the new future and the old one get the new run's result
    (they raised CancelledError although the task ran again to the end)."""
    with anyio.fail_after(LIMIT):
        async with cluster(where) as c:
            graph = {"k": (gated, 7)}
            if how in ("submit", "map"):
                old = c.submit(gated, 7)
            else:
                [old] = await c.submit_graph(graph, ["k"])
            await started()
            await c.cancel(old)
            if how == "submit":
                new = c.submit(gated, 7)
            elif how == "map":
                [new] = c.map(gated, [7])
            elif how == "submit_graph":
                [new] = await c.submit_graph(graph, ["k"])
            else:
                computed = c.compute(graph, "k")
            GATE.set()  # the cancelled try ends (its result dropped), the new one runs
            if how == "compute":
                assert await computed == 7
            else:
                assert new.key == old.key
                assert await new == 7
            assert await old == 7  # the same key: it follows the new run
            assert (await c.status())["tasks_by_state"] == {"memory": 1}


@pytest.mark.parametrize("where", ["local", "remote"])
async def test_a_cancelled_task_computed_again_once_its_futures_said_so_runs_again(
    where: str,
) -> None:
    """The cancel's word came (the old future raised CancelledError), then the graph is
    computed again while that future lives: it runs again and both get its result (the
    compute raised the old CancelledError while the task ran again)."""
    with anyio.fail_after(LIMIT):
        async with cluster(where) as c:
            graph = {"k": (gated, 5)}
            [old] = await c.submit_graph(graph, ["k"])
            await started()
            await c.cancel(old)
            assert await old.exception() is not None
            assert old.status == "cancelled"
            GATE.set()
            assert await c.compute(graph, "k") == 5
            assert old.status == "finished"
            assert await old == 5


@pytest.mark.parametrize("where", ["local", "remote"])
@pytest.mark.parametrize("how", ["submit", "compute"])
async def test_a_failed_task_submitted_again_runs_again(where: str, how: str) -> None:
    """A task that failed, submitted again while its old future lives, runs again (as
    the manager and scheduler do): it raised its old error at once, without running."""
    with anyio.fail_after(LIMIT):
        async with cluster(where) as c:
            if how == "submit":
                old = c.submit(fails_first, "a")
            else:
                [old] = await c.submit_graph({"k": (fails_first, "a")}, ["k"])
            with pytest.raises(ValueError, match="first try"):
                await old
            if how == "submit":
                assert await c.submit(fails_first, "a") == "a"
            else:
                assert await c.compute({"k": (fails_first, "a")}, "k") == "a"
            assert await old == "a"


async def test_a_known_failed_key_asked_for_again_without_its_task_says_its_error() -> None:
    """A failed key asked for again by a graph that does not hold its task (a key the
    cluster has) is not run again: the new future says its error, as the old one does."""
    with anyio.fail_after(LIMIT):
        async with cluster("local") as c:
            [old] = await c.submit_graph({"k": (fails_first, "b")}, ["k"])
            with pytest.raises(ValueError, match="first try"):
                await old
            new, j = await c.submit_graph({"j": (len, "xy")}, ["k", "j"])
            with pytest.raises(ValueError, match="first try"):
                await new
            assert await j == 2
            assert TRIES["b"] == 1


@pytest.mark.parametrize("where", ["local", "remote"])
async def test_tuple_keys_held_and_submitted_again_give_their_results(where: str) -> None:
    """dask's keys are tuples: submitted again while the client holds them, the
    manager's answer names them (``SubmitReply.echoed``), which crossed the wire as
    lists, and the client raised ``TypeError: unhashable type: 'list'`` (a helper
    session hit it gathering partitions twice)."""
    graph = {("part", i): (int, str(i)) for i in range(3)}
    keys = list(graph)
    with anyio.fail_after(LIMIT):
        async with cluster(where) as c:
            first = await c.submit_graph(graph, keys)
            assert await c.gather(first) == [0, 1, 2]
            again = await c.submit_graph(graph, keys)
            assert await c.gather(again) == [0, 1, 2]
