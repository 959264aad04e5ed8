"""A client's cancel is its own, and a released future says so.

Cancel: two clients of one manager (``nodes``: a manager and a worker over ``inproc://``
with the codec on, in this process) that want the same task. One client's
``Cluster.cancel``/``Future.cancel`` ends that client's interest only: its future
raises ``CancelledError`` saying the task runs on, the other client gets the result (as
dask's ``Client.cancel`` without ``force``). A task only that client wants is still
cancelled with what depends on it, and the console's ``cancel`` is an operator's: it
cancels for every client.

Release: a future after ``release()`` is ``"released"``, done, and awaiting it, gathering
it or passing it to ``submit`` raises ``CorralError`` saying it was released, also when
it is released while awaited.

Tasks that must keep running wait on a gate (a ``threading.Event``) the test opens;
the test waits for them to start on another event, never sleeps and then asserts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from dask._task_spec import TaskRef

from runtime import Cluster, Future
from runtime.console import ConsoleClient
from runtime.errors import CancelledError, CorralError, UnknownFuture
from tests.helpers import nodes, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 30

GATES: dict[str, threading.Event] = {}
STARTED: dict[str, threading.Event] = {}


def gated(name: str, x: int) -> int:
    """Says it started, then runs until the test opens gate ``name``."""
    STARTED[name].set()
    if not GATES[name].wait(LIMIT):
        raise TimeoutError(f"gate {name} never opened")
    return x


def add(x: int, y: int) -> int:
    return x + y


@pytest.fixture
def gate() -> Iterator[Callable[[str], threading.Event]]:
    made: list[str] = []

    def make(name: str) -> threading.Event:
        GATES[name], STARTED[name] = threading.Event(), threading.Event()
        made.append(name)
        return GATES[name]

    yield make
    for name in made:  # never leave a worker thread blocked
        GATES.pop(name).set()
        STARTED.pop(name)


async def started(name: str) -> None:
    """Wait (bounded) until the task gated by ``name`` runs on its worker's thread."""
    assert await anyio.to_thread.run_sync(STARTED[name].wait, LIMIT), f"{name} never started"


async def transitions(cluster: Cluster, key: str) -> list[tuple[str, str]]:
    return [(row[1], row[2]) for row in await cluster.story(key)]


# ----------------------------------------------------------------------------- cancel


@pytest.mark.parametrize("how", ["Cluster.cancel", "Future.cancel"])
async def test_a_cancel_of_a_task_other_clients_want_is_this_clients_only(
    gate: Callable[[str], threading.Event], how: str
) -> None:
    opened = gate("shared")
    graph = {"shared-1": (gated, "shared", 20)}
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as a, Cluster(address) as b:
            # submit_graph returns once the manager has the submission: both want it.
            (fb,) = await b.submit_graph(graph, ["shared-1"])
            (fa,) = await a.submit_graph(graph, ["shared-1"])
            await started("shared")
            if how == "Cluster.cancel":
                await a.cancel([fa])
            else:
                fa.cancel()
            error = await fa.exception()
            assert isinstance(error, CancelledError), error
            assert "for this client only" in str(error) and "runs on for them" in str(error)
            assert fa.status == "cancelled"
            with pytest.raises(CancelledError, match="runs on for them"):
                await fa
            # The task itself was not cancelled: B's future waits for it, and gets it.
            assert not fb.done()
            assert ("processing", "cancelled") not in await transitions(b, "shared-1")
            opened.set()
            assert await fb == 20
            # A wants it again by submitting it again: its futures, old and new, get it.
            (again,) = await a.submit_graph(graph, ["shared-1"])
            assert await again == 20
            assert await fa == 20
            assert ("processing", "cancelled") not in await transitions(a, "shared-1")
            # A cancel of a finished task changes nothing, shared or not.
            await a.cancel([fa])
            assert fa.status == "finished" and await fa == 20


async def test_two_clients_cancelling_at_once_cancel_the_task_and_say_so(
    gate: Callable[[str], threading.Event],
) -> None:
    # Each cancel came while the other client still held the task, so each was told it
    # "runs on for them", and then both let it go: it stopped (a concurrent-clients
    # audit). The second cancel now finds the first client leaving: it cancels.
    gate("both")
    graph = {"both-1": (gated, "both", 20)}
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as a, Cluster(address) as b:
            (fa,) = await a.submit_graph(graph, ["both-1"])
            (fb,) = await b.submit_graph(graph, ["both-1"])
            await started("both")
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.cancel, [fa])
                tg.start_soon(b.cancel, [fb])
            errors = [await fa.exception(), await fb.exception()]
            assert all(isinstance(e, CancelledError) for e in errors), errors
            said = ["runs on for them" in str(e) for e in errors]
            assert said.count(True) <= 1, errors  # the last to cancel is told it stopped
            await wait_until(
                lambda: _has(transitions(a, "both-1"), ("processing", "cancelled")),
                "the task cancelled",
            )


async def _has(story: Any, step: tuple[str, str]) -> bool:
    return step in await story


async def test_a_cancel_of_a_task_no_other_client_wants_cancels_it_and_its_dependents(
    gate: Callable[[str], threading.Event],
) -> None:
    """As before, with another client connected: A's own task and what depends on it
    are cancelled; B's task runs."""
    opened = gate("mine")
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as a, Cluster(address) as b:
            mine = a.submit(gated, "mine", 1)
            after = a.submit(add, mine, 1)
            theirs = b.submit(add, 2, 2)
            await started("mine")
            await a.cancel([mine])
            with pytest.raises(CancelledError, match=r"cancelled: cancelled by request$"):
                await mine
            with pytest.raises(CancelledError):
                await after  # what depends on it goes too
            assert ("processing", "cancelled") in await transitions(a, mine.key)
            opened.set()
            assert await theirs == 4


async def test_a_cancel_spares_a_task_another_clients_task_needs(
    gate: Callable[[str], threading.Event],
) -> None:
    """A holds ``base``; B holds only ``after``, which needs it (B's graph names
    ``base`` too, as two dask collections share a key). A's cancel of ``base`` is A's
    alone: A's future says it runs on, and B gets ``after``."""
    opened = gate("base")
    base = {"base-1": (gated, "base", 5)}
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as a, Cluster(address) as b:
            (fa,) = await a.submit_graph(base, ["base-1"])
            await started("base")
            (fb,) = await b.submit_graph({**base, "after-1": (add, "base-1", 1)}, ["after-1"])
            await a.cancel([fa])
            with pytest.raises(CancelledError, match="runs on for them"):
                await fa
            assert not fb.done()
            opened.set()
            assert await fb == 6
            assert ("processing", "cancelled") not in await transitions(b, "base-1")


async def test_the_consoles_cancel_cancels_for_every_client(
    gate: Callable[[str], threading.Event],
) -> None:
    """An operator's cancel of a key (or a run) is not one client's: every client that
    wants the task gets CancelledError."""
    gate("console")
    graph = {"console-1": (gated, "console", 1)}
    with anyio.fail_after(LIMIT):
        async with (
            nodes(1) as (address, _),
            Cluster(address) as a,
            Cluster(address) as b,
            ConsoleClient(address) as console,
        ):
            (fa,) = await a.submit_graph(graph, ["console-1"])
            (fb,) = await b.submit_graph(graph, ["console-1"])
            await started("console")
            await console.run_command("cancel console-1")
            for fut in (fa, fb):
                with pytest.raises(CancelledError, match="cancelled from the console"):
                    await fut


async def test_future_cancel_right_after_submit_cancels_the_task(
    gate: Callable[[str], threading.Event],
) -> None:
    """``Future.cancel`` goes after the submission made before it (both through the
    client actor), so it finds the task to cancel."""
    gate("early")
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            fut = c.submit(gated, "early", 1)
            fut.cancel()
            with anyio.fail_after(10):  # not cancelled: it would wait for its gate
                error = await fut.exception()
            assert isinstance(error, CancelledError), error
            assert await c.submit(add, 1, 1) == 2


# ----------------------------------------------------------------------------- release


def inc(x: int) -> int:
    return x + 1


async def test_a_released_future_says_it_was_released() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            x = c.submit(inc, 1)
            same = c.submit(inc, 1)  # another Future of the same key
            assert await x == 2
            x.release()
            assert x.status == "released" and x.done()
            assert "released" in repr(x)
            with pytest.raises(CorralError, match=r"was released .*cannot be awaited") as err:
                await x
            assert err.value.key == x.key
            assert "submit its task again" in str(err.value)
            with pytest.raises(CorralError, match="was released"):
                await x.result()
            with pytest.raises(CorralError, match="was released"):
                await c.gather([same, x])
            with pytest.raises(CorralError, match="cannot be passed to submit"):
                c.submit(inc, x)
            assert isinstance(await x.exception(), CorralError)
            await x.wait()  # at once: nothing to wait for
            await c.cancel([x])  # nothing of this future's to cancel
            x.cancel()
            # The other Future of its key still holds it; the same call again works.
            assert same.status == "finished" and await same == 2
            same.release()
            assert await c.submit(inc, 1) == 2


async def test_a_future_released_while_awaited_fails_saying_so(
    gate: Callable[[str], threading.Event],
) -> None:
    gate("awaited")
    errors: list[BaseException] = []
    ended = anyio.Event()
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            fut = c.submit(gated, "awaited", 1)
            await started("awaited")

            async def awaiter() -> None:
                try:
                    await fut
                except Exception as exc:
                    errors.append(exc)
                finally:
                    ended.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(awaiter)
                # The awaiter waits on the key in the client actor (in-process state).
                await wait_until(lambda: fut.key in c._client_actor.waiters, "the await", limit=10)
                fut.release()
                with anyio.fail_after(10):  # without the fix it waits for ever
                    await ended.wait()
            (error,) = errors
            assert isinstance(error, CorralError) and "was released" in str(error), error
            assert await c.submit(add, 1, 1) == 2


# ----------------------------------------------------------------------------- by hand


async def test_a_future_made_by_hand_of_a_key_this_client_does_not_hold_is_refused() -> None:
    # Future(key, cluster) for another client's key, or a key no task has, was a future
    # nothing ever answered: awaiting or gathering it waited forever (a left-over audit
    # problem). It is refused when made, saying what to do; one more Future of a key
    # this client holds is fine, and reads another client's result as the message says.
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as a, Cluster(address) as b:
            fa = a.submit(add, 1, 2, key="theirs")
            assert await fa == 3
            for key in ("theirs", "no-such-key"):
                with pytest.raises(UnknownFuture, match="holds no Future of that key") as got:
                    Future(key, b)
                assert got.value.key == key and "TaskRef(key)" in str(got.value)
            assert await Future("theirs", a) == 3  # a holds it: one more future of it
            assert await b.submit(add, TaskRef("theirs"), 10) == 13
