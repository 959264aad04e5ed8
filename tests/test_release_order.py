"""A future let go right after it was passed to ``submit`` (the checkpoint audit, finding
3): dask's idiom for "I only want the total",

    sims = [c.submit(sim, i, key=f"s{i}") for i in range(4)]
    tot = c.submit(comb, sims, key="total")
    for s in sims: s.release()      # or: del sims
    await tot

raised ``MissingKeysError: ... 's0' (needed by 'total')``: a release took an input's
task out of the batch of ``submit`` calls not sent yet, and a release queued before
that batch (one made earlier in the same turn of the event loop) carried the keys let
go after it. Now the release of a key that an unsent (or in-flight) submission reads
takes effect after that submission, as in dask: the total is right. A cancel made after
the submits reaches the manager after them too.

A task let go before it was sent, with every task still to go that reads it, is not sent
at all (review finding F3): ``y = submit(g, x)``, then ``y.release()`` and
``x.release()`` in the same turn sent ``x`` (y had marked it as read when it was
queued), which then ran.

Each case runs on an embedded cluster and on a client of a manager over websockets
(real sockets on 127.0.0.1, ports of 51000-51499, and 59500-59599 for the tests of
what is never sent), whose worker runs in this process.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CancelledError
from runtime.node import Tokens, run_manager, run_worker
from tests.helpers import wait_until

pytestmark = pytest.mark.anyio
LIMIT = 20

#: a manager port and a range for its worker's peer port, per test using a manager
PORTS = iter(range(51000, 51400, 10))
#: the same, for the tests of what is never sent
UNSENT_PORTS = iter(range(59500, 59600, 10))


def sim(i: int) -> int:
    return i * 10


def comb(xs: list[int]) -> int:
    return sum(xs)


#: what gated() waits on (a module's: a lock does not pickle, to a manager process)
GATE = threading.Event()


def gated() -> int:
    if not GATE.wait(LIMIT):
        raise TimeoutError("the test never opened the gate")
    return 1


@asynccontextmanager
async def over_websockets(tmp_path: Path, ports: Iterator[int] = PORTS) -> AsyncIterator[Cluster]:
    """A client of a manager on ws://127.0.0.1 with one worker (both in this process),
    on the next port of ``ports`` (its worker's on the 9 after it)."""
    port = next(ports)
    where: list[tuple[str, Tokens]] = []
    up = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        where.append((address, tokens))
        up.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_manager(
                f"127.0.0.1:{port}", ready=ready, token_file=tmp_path / "tokens.json"
            )
        )
        await up.wait()
        address, tokens = where[0]
        tg.start_soon(lambda: run_worker(address, token=tokens.worker, port=(port + 1, port + 9)))
        async with Cluster(address, token=tokens.admin) as cluster:
            await cluster.wait_for_workers(1)
            yield cluster
        tg.cancel_scope.cancel()


@asynccontextmanager
async def embedded(tmp_path: Path, ports: Iterator[int] = PORTS) -> AsyncIterator[Cluster]:
    """An embedded cluster of one worker (``ports`` unused: over_websockets' signature)."""
    async with Cluster(workers=1) as cluster:
        yield cluster


CLUSTERS = {"embedded": embedded, "websockets": over_websockets}


@pytest.mark.parametrize("where", CLUSTERS)
@pytest.mark.parametrize("how", ["release", "del", "release-after-an-earlier-release"])
async def test_inputs_let_go_right_after_their_consumer_was_submitted_still_feed_it(
    tmp_path: Path, where: str, how: str
) -> None:
    """``release()`` of each input, or ``del`` of the only list that holds them (garbage
    collection), in the same turn of the event loop as the submits; and the same after
    an unrelated release earlier in that turn (its batch was queued before the submits,
    and must not carry the inputs' releases ahead of the total's graph)."""
    with anyio.fail_after(LIMIT):
        async with CLUSTERS[where](tmp_path) as c:
            if how == "release-after-an-earlier-release":
                sims = [c.submit(sim, i, key=f"s{i}") for i in range(4)]
                other = c.submit(sim, 9, key="other")
                await c.gather([*sims, other])  # all sent and done
                other.release()
            else:
                sims = [c.submit(sim, i, key=f"s{i}") for i in range(4)]
            tot = c.submit(comb, sims, key="total")
            if how == "del":
                del sims  # (no await since the submits: the batch is not sent yet)
            else:
                for s in sims:
                    s.release()
            assert await tot == 60
            if where == "embedded":  # and the inputs were let go: once the total is, too,
                tot.release()  # the scheduler forgets every task
                tasks = c.scheduler_state.tasks
                await wait_until(lambda: not tasks, "every task forgotten")
            # a new submission of them is computed again
            again = c.submit(comb, [c.submit(sim, i, key=f"s{i}") for i in range(4)])
            assert await again == 60


@pytest.mark.parametrize("where", CLUSTERS)
async def test_a_cancel_after_the_submits_and_releases_reaches_the_manager_after_them(
    tmp_path: Path, where: str
) -> None:
    """Cancel of the total in the same turn as its submit and its inputs' release: the
    cancel comes after the graph (the total says cancelled, not MissingKeysError), and
    the cluster goes on."""
    gate = GATE
    gate.clear()
    try:
        with anyio.fail_after(LIMIT):
            async with CLUSTERS[where](tmp_path) as c:
                first = c.submit(gated, key="gate")  # the worker is busy meanwhile
                sims = [c.submit(sim, i, key=f"s{i}") for i in range(4)]
                tot = c.submit(comb, sims, key="total")
                for s in sims:
                    s.release()
                tot.cancel()
                with pytest.raises(CancelledError):
                    await tot
                gate.set()
                assert await first == 1
                assert await c.submit(comb, [c.submit(sim, 1), c.submit(sim, 2)]) == 30
    finally:
        gate.set()


# -- what is let go before it goes, with all that reads it, never goes -------------------


def inc(v: int) -> int:
    return v + 1


def add(a: int, b: int) -> int:
    return a + b


async def heard_of(c: Cluster, *keys: str) -> set[str]:
    """Which of ``keys`` reached the scheduler: a submit after them is computed (its graph
    went after theirs, from the same batch or a later one), then their story is read."""
    assert await c.submit(sum, [1, 2], pure=False) == 3
    return {entry[0] for entry in await c.story(*keys)}


@pytest.mark.parametrize("where", CLUSTERS)
@pytest.mark.parametrize("order", ["reader-first", "input-first"])
async def test_an_input_let_go_with_its_only_reader_before_they_go_is_never_sent(
    tmp_path: Path, where: str, order: str
) -> None:
    """``y = submit(inc, x)``, then both released in the same turn, in either order:
    neither reaches the manager (before, x went and ran, and its release came after)."""
    with anyio.fail_after(LIMIT):
        async with CLUSTERS[where](tmp_path, UNSENT_PORTS) as c:
            x = c.submit(sim, 1, key="x")
            y = c.submit(inc, x, key="y")
            for fut in [y, x] if order == "reader-first" else [x, y]:
                fut.release()
            assert await heard_of(c, "x", "y") == set()
            # and they are submitted again as new
            assert await c.submit(inc, c.submit(sim, 1, key="x"), key="y") == 11


@pytest.mark.parametrize("order", list(itertools.permutations("xyz")), ids="".join)
async def test_a_chain_let_go_before_it_goes_is_never_sent_whatever_the_order(
    tmp_path: Path, order: tuple[str, ...]
) -> None:
    """z reads y reads x, all three released in one turn, in any order: none is sent."""
    with anyio.fail_after(LIMIT):
        async with embedded(tmp_path) as c:
            x = c.submit(sim, 1, key="x")
            y = c.submit(inc, x, key="y")
            futs = {"x": x, "y": y, "z": c.submit(inc, y, key="z")}
            for name in order:
                futs[name].release()
            assert await heard_of(c, "x", "y", "z") == set()


@pytest.mark.parametrize("held", ["z", "w", None])
async def test_a_diamond_sends_what_a_held_task_reads_and_nothing_else(
    tmp_path: Path, held: str | None
) -> None:
    """x read by y and z, both read by w; every future but ``held``'s released in one
    turn (the readers first, so the inputs are still read when let go): what the held
    task reads goes with it, the rest does not."""
    with anyio.fail_after(LIMIT):
        async with embedded(tmp_path) as c:
            x = c.submit(sim, 1, key="x")
            y = c.submit(inc, x, key="y")
            z = c.submit(inc, x, key="z")
            futs = {"x": x, "y": y, "z": z, "w": c.submit(add, y, z, key="w")}
            for name in "wzyx":
                if name != held:
                    futs[name].release()
            sent = {"z": {"x", "z"}, "w": {"x", "y", "z", "w"}, None: set()}[held]
            assert await heard_of(c, *futs) == sent
            if held is not None:
                assert await futs[held] == {"z": 11, "w": 22}[held]
