"""runtime.Client: a Cluster on an event loop of its own thread, with synchronous calls,
as a notebook user of dask.distributed's Client expects.

The tests reproduce a notebook kernel's conditions in the main thread: an event loop
running there (an anyio test, as a cell's top-level ``await`` runs in the kernel's loop),
a cell that blocks that loop with local work, and a Ctrl-C (the stop button) arriving as
``KeyboardInterrupt`` in the main thread while a call waits. Every test is bounded
(pytest-timeout: the calls block); tasks wait on ``threading.Event`` gates the test
sets, with a timeout of their own.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from typing import Any

import dask
import pytest

from runtime import Client, ClientFuture, Cluster, futures_of
from runtime.errors import CorralError, UnknownPolicyError

BOUND = 20  # seconds any single test may take (blocking calls: pytest-timeout bounds it)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(BOUND)]

GATE = 10  # seconds a gated task waits at most before giving up


def inc(x: int) -> int:
    return x + 1


def _waits_in(thread: int, function: str, limit: float) -> bool:
    """Whether ``thread`` comes to wait inside a call of ``function`` within ``limit`` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread)
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
        time.sleep(0.01)
    return False


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "corral-client-loop"]


async def test_the_cluster_runs_tasks_while_the_calling_loop_is_blocked() -> None:
    """A notebook cell that computes locally blocks the kernel's event loop: an embedded
    Cluster's scheduler stops with it (tasks not yet sent wait for the cell's end). The
    Client's cluster runs on a loop of its own: all four tasks, one at a time on its one
    worker thread, finish while this (running) loop is blocked in a synchronous wait."""
    done = threading.Event()
    seen: list[int] = []

    def record(i: int) -> int:
        seen.append(i)
        if len(seen) == 4:
            done.set()
        return i

    with Client(workers=1, threads_per_worker=1) as client:
        futures = client.map(record, range(4), pure=False)
        assert done.wait(GATE), f"only {seen} ran while the calling loop was blocked"
        assert client.gather(futures) == [0, 1, 2, 3]


async def test_synchronous_calls_work_inside_a_running_loop() -> None:
    """dask.distributed's habits in a notebook cell: ``fut.result()``, a future as a
    dependency, ``client.gather``, ``client.compute``, ``x.compute()`` on the cluster
    (set as dask's scheduler until close), and ``await fut`` in the cell's own loop."""
    before = dask.config.get("scheduler", None)
    with Client(workers=1) as client:
        a = client.submit(inc, 1)
        b = client.submit(inc, a)
        assert isinstance(b, ClientFuture)
        assert (a.result(), b.result(), await b) == (2, 3, 3)
        assert b.status == "finished" and b.done()
        assert repr(b) == f"<ClientFuture {b.key!r} finished>"
        assert repr(client).startswith("<Client running: address in-process; workers 1")
        assert client.gather([a, b]) == [2, 3]
        assert client.gather(b) == 3
        delayed = dask.delayed(inc)(41)
        assert client.compute(delayed) == 42
        runs = client.status()["runs"]
        assert delayed.compute() == 42  # dask's default scheduler: the client's
        assert client.status()["runs"] == runs + 1
        assert [f.result() for f in client.as_completed(client.map(inc, [5]))] == [6]
        persisted = futures_of(client.persist(dask.delayed(inc)(6)))  # the cluster's Futures
        assert list(client.as_completed(persisted, with_results=True)) == [(persisted[0], 7)]
    assert dask.config.get("scheduler", None) is before
    with pytest.raises(CorralError, match="this Client was closed"):
        client.submit(inc, 1)
    with pytest.raises(CorralError, match="this Client was closed"):
        await b  # (was RuntimeError: Event loop is closed)
    assert not _loop_threads()


async def test_two_clients_closed_in_start_order_give_dask_its_scheduler_back() -> None:
    """Each Client set as default saves the scheduler before it: closed first, the first
    one leaves the second's in place; the second, closed next, must not put back the
    first, closed one's (``x.compute()`` then raised 'the cluster is not running')."""
    before = dask.config.get("scheduler", None)
    first, second = Client(workers=1), Client(workers=1)
    first.close()
    assert dask.delayed(inc)(1).compute() == 2  # the second's, still running
    second.close()
    assert dask.config.get("scheduler", None) is before
    assert dask.delayed(inc)(2).compute() == 3


def test_a_client_whose_cluster_was_closed_is_not_given_back_as_dasks_scheduler() -> None:
    """A cell run again: the first Client's variable now holds the second, so its cluster
    is closed as the warning says, ``await Cluster.running()[0].close()``. The second
    Client's close must not give dask back the first one's scheduler (its cluster is
    gone: ``x.compute()`` raised 'the cluster is not running')."""
    before = dask.config.get("scheduler", None)
    first = Client(workers=1)
    second = Client(workers=1)
    asyncio.run(first.cluster.close())  # (another loop than its own: closed on its own)
    second.close()
    assert dask.config.get("scheduler", None) is before
    assert dask.delayed(inc)(2).compute() == 3
    first.close()
    assert dask.config.get("scheduler", None) is before


def test_a_client_of_a_manager_process_is_given_back_as_dasks_scheduler() -> None:
    """A Client joined to a manager (``Client(address)``) runs, yet its cluster is not
    among ``Cluster.running()`` (which lists no client of a manager process): the next
    Client's close took it for closed and gave dask back the scheduler before it
    (None: ``x.compute()`` then ran in dask's local threads, not on the cluster)."""
    host = Client(processes=0, set_as_default=False)
    try:
        before = dask.config.get("scheduler", None)
        joined = Client(address=host.cluster.gateway_address, token=host.cluster._tokens.submit)
        try:
            Client(workers=1).close()
            assert dask.config.get("scheduler", None) == joined._default_get
        finally:
            joined.close()
        assert dask.config.get("scheduler", None) is before
    finally:
        host.close()


def test_close_called_on_the_clients_own_loop_is_refused_and_closes_nothing() -> None:
    """``client.close()`` in code the Client's loop runs (a callback there) would wait
    for its own loop: it stopped nothing and its thread waited for ever (dask's
    scheduler already set back). Refused, the Client still works and closes after."""
    before = dask.config.get("scheduler", None)
    client = Client(workers=1)

    async def close_there() -> None:
        client.close()

    with pytest.raises(CorralError, match="would block"):
        client._wait(close_there, "a callback")
    assert client.submit(inc, 1).result() == 2
    assert dask.delayed(inc)(2).compute() == 3  # still dask's scheduler
    client.close()
    assert dask.config.get("scheduler", None) is before


def test_close_called_from_two_threads_at_once_closes_once() -> None:
    """A notebook's cell and a thread of its own (a watchdog, a finalizer) closing the
    same Client: both return, the loop's thread ends. Unserialized, the second close
    stopped the loop the first one then waited on (a thread hung for good) or raised
    AttributeError / RuntimeError from the closed loop."""
    client = Client(workers=1, set_as_default=False)
    both = threading.Barrier(2)
    errors: list[BaseException] = []

    def close() -> None:
        both.wait(GATE)
        try:
            client.close()
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=close, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GATE)
    assert [t.is_alive() for t in threads] == [False, False]
    assert errors == []
    assert not _loop_threads()


async def test_an_interrupt_ends_the_wait_only() -> None:
    """The stop button (Ctrl-C: ``KeyboardInterrupt`` in the main thread) while a cell
    waits in ``fut.result()`` ends that wait; the task runs on, and its result is there
    for the next call, as an interrupted ``await cluster.gather`` leaves it."""
    started, release = threading.Event(), threading.Event()

    def gated() -> str:
        started.set()
        release.wait(GATE)
        return "done"

    with Client(workers=1) as client:
        fut = client.submit(gated)

        def interrupt() -> None:  # once the main thread waits in the call
            if started.wait(GATE) and _waits_in(main, "_wait", GATE):
                signal.pthread_kill(main, signal.SIGINT)  # as the stop button's SIGINT

        main = threading.get_ident()

        threading.Thread(target=interrupt, daemon=True).start()
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # ipykernel's
        try:
            with pytest.raises(KeyboardInterrupt):
                fut.result()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert fut.status == "pending"
        release.set()
        assert fut.result(timeout=GATE) == "done"


async def test_a_start_that_fails_raises_and_leaves_no_thread() -> None:
    before: Any = dask.config.get("scheduler", None)
    with pytest.raises(UnknownPolicyError):
        Client(workers=1, policies={"placement": "no-such-policy"})
    assert not _loop_threads()
    assert dask.config.get("scheduler", None) is before


async def test_result_timeout_ends_the_wait_only() -> None:
    release = threading.Event()

    def gated() -> int:
        release.wait(GATE)
        return 7

    with Client(workers=1) as client:
        fut = client.submit(gated)
        with pytest.raises(TimeoutError):
            fut.result(timeout=0.2)
        release.set()
        assert fut.result() == 7


def test_the_clusters_coroutines_refuse_another_loop_and_its_close_closes_there() -> None:
    """A Client's cluster is in Cluster.running(), and the warning of a second start
    says to close it with ``await old.close()`` (``Cluster.running()[i]`` once no
    variable holds the Client: a cell run again). Awaited in the notebook's loop, that
    close (shielded) hung the loop for good, with the cluster marked closed and its
    actors running. Now its other calls from another loop raise at once, nothing done,
    and its close closes it on its own loop."""
    client = Client(workers=1)
    cluster = client.cluster

    async def from_another_loop() -> None:
        with pytest.raises(CorralError, match="runs in another event loop"):
            await cluster.status()
        with pytest.raises(CorralError, match="runs in another event loop"):
            cluster.submit(inc, 1)
        assert client.submit(inc, 1).result() == 2
        assert Cluster.running() == [cluster]
        await Cluster.running()[0].close()
        assert Cluster.running() == []

    try:
        asyncio.run(from_another_loop())
        assert repr(client) == "<Client closed>"
    finally:
        client.close()
    assert not _loop_threads()


def _nested_compute(x: int) -> int:
    return dask.delayed(inc)(x).compute()  # type: ignore[no-any-return]


def test_a_task_that_computes_inside_does_not_wait_for_its_own_slot() -> None:
    """With the Client as dask's default scheduler, a task of an in-process worker that
    calls ``.compute()`` sent that compute to the cluster and waited, in the only slot,
    for a slot: for ever (a notebook cell hung until interrupted). In a task, dask's
    threads compute it, as in a worker process, where the Client is nobody's default."""
    with Client(workers=1, threads_per_worker=1) as client:
        assert client.submit(_nested_compute, 1).result(timeout=GATE) == 2


def _add(a: int, b: int = 0) -> int:
    return a + b


def _pick(d: dict[str, int]) -> int:
    return d["x"]


def test_a_future_in_a_delayed_call_is_its_value() -> None:
    """``dask.delayed(f)(fut)``, a dask habit: dask's ``Task`` counts only its own
    ``TaskRef``s as dependencies, so the task ran ``f`` on the future object (``TypeError:
    unsupported operand type(s) for +: 'Future' and 'int'``), or, on worker processes,
    failed with a ``KeyError``, and a ``ClientFuture`` could not be pickled. Now each is a
    dependency, its value the argument (also in a list, a dict, a keyword)."""
    with Client(workers=1) as client:
        f, g = client.submit(inc, 1), client.submit(inc, 2)
        assert dask.delayed(inc)(f).compute() == 3
        assert client.compute(dask.delayed(sum)([f, g])) == 5
        assert client.compute(dask.delayed(_add)(f.future, b=g)) == 5
        assert client.compute(dask.delayed(_pick)({"x": f})) == 2
        # checked as its Future is (was MissingKeysError, or another cluster's same key)
        with (
            Client(workers=1, set_as_default=False) as other,
            pytest.raises(CorralError, match="belongs to another cluster"),
        ):
            other.compute(dask.delayed(inc)(f))
        g.release()
        with pytest.raises(CorralError, match="was released"):
            client.compute(dask.delayed(inc)(g))
