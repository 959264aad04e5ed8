"""The Cluster API end to end, in-process: futures, errors, cancellation, ordering,
statistics, release of results, transfers, scaling, worker loss, policies, story, and
running inside an existing aiohttp application.

Every test is bounded with ``anyio.fail_after``; waits are on events or on polled
conditions inside a bound, never sleep-then-assert. Tasks that must stay running wait
on a ``threading.Event`` that the test sets (with a timeout of their own, so a failing
test never leaves a thread blocked for long).
"""

from __future__ import annotations

import asyncio
import operator
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import anyio
import dask
import pytest
from aiohttp import web
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

import policies
from policies import PolicyParamsError
from runtime import Cluster
from runtime.errors import (
    CancelledError,
    CorralError,
    CycleError,
    DependencyFailed,
    GraphError,
    MissingKeysError,
    UnknownPolicyError,
    WorkersTimeout,
)
from runtime.messages import PolicyInfo, StatusRequest
from tests.helpers import wait_until, worker_statuses

pytestmark = pytest.mark.anyio

BOUND = 15  # seconds any single test may take (they take well under one)
GATE = 10  # seconds a gated task waits at most before giving up


# ----------------------------------------------------------------------------- helpers


class Boom(Exception):
    """A user exception type only this module knows."""


def inc(x: int) -> int:
    return x + 1


def add(a: int, b: int) -> int:
    return a + b


def boom_task(x: int) -> int:
    raise Boom(f"boom {x}")


def worker_of_thread() -> str:
    """The worker running the current task: executor threads are ``<worker id>-<i>``."""
    return threading.current_thread().name.rsplit("-", 1)[0]


class Recorder:
    """Thread-safe record of what ran, in order, and where."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[Any] = []
        self.where: dict[Any, str] = {}

    def __call__(self, name: Any) -> Any:
        with self.lock:
            self.order.append(name)
            self.where[name] = worker_of_thread()
        return name

    @property
    def n(self) -> int:
        with self.lock:
            return len(self.order)


def gated(started: threading.Event, go: threading.Event, value: Any = None) -> Any:
    """A task that signals it started, then waits for the test to let it go."""
    started.set()
    if not go.wait(GATE):
        raise TimeoutError("the test never released the gate")
    return value


# ----------------------------------------------------------------------------- futures


async def test_submit_map_gather_and_await() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            one = cluster.submit(inc, 1)
            assert await one == 2
            assert await one.result() == 2
            assert one.status == "finished" and one.done()
            futs = cluster.map(inc, range(10))
            assert await cluster.gather(futs) == list(range(1, 11))
            pairs = cluster.map(add, range(5), range(5, 10))
            assert await cluster.gather(pairs) == [5, 7, 9, 11, 13]
            # Same function and arguments: same key (pure), one task.
            assert cluster.submit(inc, 1).key == one.key
            impure = [cluster.submit(inc, 1, pure=False) for _ in range(2)]
            assert impure[0].key != impure[1].key
            assert await cluster.gather(impure) == [2, 2]


class CountedPickles:
    """A callable that counts how often it is pickled (``pickled``): tokenizing it for a
    key pickles it, as dask tokenizes a function of the user's script."""

    pickled = 0

    def __call__(self, x: int) -> int:
        return x + 1

    def __reduce__(self) -> tuple[Any, ...]:
        CountedPickles.pickled += 1
        return (CountedPickles, ())


async def test_a_pure_call_on_futures_has_one_key_however_often_submitted() -> None:
    """A future tokenizes as its key: the same pure call on the same futures is the same
    task (it used to get a random key each time, the future not being picklable), and
    on other futures another one."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            a, b = cluster.submit(inc, 1), cluster.submit(inc, 2)
            first = cluster.submit(sum, [a, b])
            assert cluster.submit(sum, [a, b]).key == first.key
            assert cluster.submit(sum, [b, a]).key != first.key
            assert cluster.submit(sum, [a]).key != first.key
            assert await first == 5


async def test_map_tokenizes_its_function_once_with_the_keys_submit_gives() -> None:
    """``map`` tokenizes (pickles) its function once per call, not once per item, and
    its keys are still those of ``submit`` of each item."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            func = CountedPickles()
            CountedPickles.pickled = 0
            cluster.submit(func, -1)
            per_call = CountedPickles.pickled
            CountedPickles.pickled = 0
            futs = cluster.map(func, range(50))
            assert CountedPickles.pickled <= per_call
            assert [f.key for f in futs] == [cluster.submit(func, i).key for i in range(50)]
            assert [f.key for f in cluster.map(func, range(3), retries=1)] == [
                cluster.submit(func, i, retries=1).key for i in range(3)
            ]
            assert await cluster.gather(futs[:3]) == [1, 2, 3]


async def test_waiting_for_more_workers_than_join_says_how_many_did() -> None:
    """``wait_for_workers`` past its timeout raises WorkersTimeout, a TimeoutError that
    says how many joined and where to look; the cluster goes on as before."""
    with anyio.fail_after(30):
        async with Cluster(workers=1) as cluster:
            await cluster.wait_for_workers(1)
            with pytest.raises(WorkersTimeout) as info:
                await cluster.wait_for_workers(3, timeout=0.2)
            err = info.value
            assert isinstance(err, TimeoutError)
            assert (err.wanted, err.joined, err.seconds) == (3, 1, 0.2)
            assert "waited 0.2 s for 3 worker(s); 1 joined" in str(err)
            assert "status()['autoscaler']" in str(err)
            assert await cluster.submit(operator.add, 1, 2) == 3


async def test_futures_as_arguments_also_nested() -> None:
    def total(items: list[int], extra: dict[str, Any]) -> int:
        return sum(items) + extra["a"] + sum(extra["b"])

    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            a = cluster.submit(inc, 1)  # 2
            b = cluster.submit(inc, a)  # 3
            c = cluster.submit(add, a, b)  # 5
            nested = cluster.submit(total, [a, b, 10], {"a": c, "b": (a, b)})
            kw = cluster.submit(add, 1, b=c)
            assert await nested == 2 + 3 + 10 + 5 + 2 + 3
            assert await kw == 6
            assert await c == 5


# ----------------------------------------------------------------------------- as_completed


def gated_boom(started: threading.Event, go: threading.Event) -> Any:
    gated(started, go)
    raise Boom("gated boom")


class Gates:
    """``n`` gated tasks on one worker with a thread each, all running (so the test
    decides, one gate at a time, the order they finish); task ``fail`` raises ``Boom``."""

    def __init__(self, cluster: Cluster, n: int, fail: int = -1) -> None:
        self.started = [threading.Event() for _ in range(n)]
        self.go = [threading.Event() for _ in range(n)]
        self.futures = [
            cluster.submit(gated_boom, s, g, pure=False)
            if i == fail
            else cluster.submit(gated, s, g, i, pure=False)
            for i, (s, g) in enumerate(zip(self.started, self.go, strict=True))
        ]

    async def running(self) -> None:
        for s in self.started:
            await wait_until(s.is_set, "a gated task to start", limit=GATE)

    def open_all(self) -> None:
        for g in self.go:
            g.set()


async def test_as_completed_gives_futures_in_the_order_they_finish() -> None:
    """Finish order 2, 0 (fails), 3, 1: the futures come in that order, the failed one
    among them (not raised: awaiting it raises), and the loop ends after the last."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1, threads_per_worker=4) as cluster:
            gates = Gates(cluster, 4, fail=0)
            try:
                await gates.running()
                seen = []
                order = iter([2, 0, 3, 1])
                gates.go[next(order)].set()
                async for fut in cluster.as_completed(gates.futures):
                    assert fut.done()
                    seen.append(gates.futures.index(fut))
                    gates.go[next(order, 0)].set()  # only now may the next one finish
                assert seen == [2, 0, 3, 1]
                with pytest.raises(Boom):
                    await gates.futures[0]
                assert await gates.futures[2] == 2
            finally:
                gates.open_all()


async def test_as_completed_with_results_raises_or_gives_the_error() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1, threads_per_worker=3) as cluster:
            gates = Gates(cluster, 3, fail=1)
            try:
                await gates.running()
                it = cluster.as_completed(gates.futures, with_results=True)
                gates.go[2].set()
                assert await anext(it) == (gates.futures[2], 2)
                gates.go[1].set()
                with pytest.raises(Boom):  # as gather raises it
                    await anext(it)
                gates.go[0].set()
                assert [pair async for pair in it] == [(gates.futures[0], 0)]
                # raise_errors=False: the error is the value; futures already done come
                # in the order given
                pairs = [
                    pair
                    async for pair in cluster.as_completed(
                        gates.futures, with_results=True, raise_errors=False
                    )
                ]
                assert [f for f, _ in pairs] == gates.futures
                assert isinstance(pairs[1][1], Boom) and pairs[2][1] == 2
            finally:
                gates.open_all()


async def test_as_completed_takes_futures_added_while_it_iterates() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1, threads_per_worker=3) as cluster:  # one for inc
            gates = Gates(cluster, 2)
            try:
                await gates.running()
                first, second = gates.futures
                done = cluster.submit(inc, 1)
                await done.wait()
                it = cluster.as_completed([first])
                seen = []
                gates.go[0].set()
                async for fut in it:
                    seen.append(fut)
                    if fut is first:
                        it.add(second)  # pending: comes when it finishes
                        it.update([done])  # done already: comes next
                        assert it.count() == 2
                    elif fut is done:
                        gates.go[1].set()
                assert seen == [first, done, second] and it.is_empty()
            finally:
                gates.open_all()


def started_since(before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """The tasks running now that were not in ``before``, but for the actors' own
    (started by the kernel, as timers come and go; anyio names a task by its function)."""
    return [
        t for t in asyncio.all_tasks() - before if not t.get_name().startswith("runtime.kernel.")
    ]


async def test_as_completed_left_early_or_cancelled_leaves_nothing_behind() -> None:
    """A break, or a cancel while it waits: no task of its own is left running, and the
    iterator, dropped, holds none of its futures (their results are let go)."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1, threads_per_worker=3) as cluster:
            gates = Gates(cluster, 3)
            client = cluster._client_actor
            try:
                await gates.running()
                before = asyncio.all_tasks()
                gates.go[0].set()
                async for fut in cluster.as_completed(gates.futures):
                    assert fut is gates.futures[0]
                    break
                with anyio.move_on_after(0.05) as scope:  # cancelled while waiting
                    async for _ in cluster.as_completed(gates.futures[1:]):
                        raise AssertionError("no future was done")
                assert scope.cancelled_caught
                assert not started_since(before)
                keys = [f.key for f in gates.futures]
                del fut
                gates.futures.clear()
                await wait_until(lambda: not client.watches.keys() & set(keys),
                                 "the dropped futures to be let go", limit=GATE)  # fmt: skip
            finally:
                gates.open_all()
            assert await cluster.submit(inc, 41) == 42  # and the cluster is fine


async def test_as_completed_refuses_what_gather_refuses() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster, Cluster(workers=1) as other:
            fut = cluster.submit(inc, 1)
            for bad in (3, fut, "x", {fut: 1}, [fut, 2]):
                with pytest.raises(TypeError, match="as_completed takes"):
                    cluster.as_completed(bad)  # type: ignore[arg-type]
            it = cluster.as_completed([fut])
            with pytest.raises(TypeError, match="as_completed takes Futures"):
                it.add("x")  # type: ignore[arg-type]
            with pytest.raises(CorralError, match="another cluster"):
                it.add(other.submit(inc, 1))
            with pytest.raises(TypeError, match="async for"):
                for _ in it:
                    pass
            gone = cluster.submit(inc, 2)
            gone.release()
            with pytest.raises(CorralError, match="released"):
                cluster.as_completed([gone])
            assert [f async for f in it] == [fut]  # the refused ones were not taken


# ----------------------------------------------------------------------------- errors


async def test_task_error_keeps_type_and_traceback() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            # Submitted together: the failure happens while the dependents wait.
            bad = cluster.submit(boom_task, 7)
            dependent = cluster.submit(inc, bad)
            further = cluster.submit(add, 1, [dependent])
            with pytest.raises(Boom, match="boom 7") as info:
                await bad
            frames = "".join(traceback.format_tb(info.value.__traceback__))
            assert "boom_task" in frames
            assert bad.status == "error"
            err = await bad.exception()
            assert isinstance(err, Boom)
            for fut in (dependent, further):
                with pytest.raises(DependencyFailed) as dinfo:
                    await fut
                assert same_error(dinfo.value.__cause__, err)
                assert repr(bad.key) in str(dinfo.value)
                assert fut.status == "error"

            # gather raises the first failure; the healthy future still has its value.
            ok = cluster.submit(inc, 1)
            with pytest.raises(DependencyFailed):
                await cluster.gather([ok, dependent])
            assert await ok == 2


def same_error(cause: BaseException | None, err: BaseException | None) -> bool:
    """``cause`` is the error ``err`` copies (``fut.exception()`` gives a copy of the
    one the client keeps): of its type, with its args and notes."""
    return (
        type(cause) is type(err)
        and getattr(cause, "args", None) == getattr(err, "args", None)
        and getattr(cause, "__notes__", None) == getattr(err, "__notes__", None)
    )


async def test_submit_onto_an_already_failed_future() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            bad = cluster.submit(boom_task, 8)
            err = await bad.exception()
            assert isinstance(err, Boom)
            # The dependency failed before these were submitted.
            dependent = cluster.submit(inc, bad)
            further = cluster.submit(inc, dependent)
            for fut in (dependent, further):
                with pytest.raises(DependencyFailed) as dinfo:
                    await fut
                assert same_error(dinfo.value.__cause__, err)
            assert await cluster.submit(inc, 1) == 2


async def test_compute_raises_the_root_exception() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            dsk = {"a": 1, "b": (boom_task, "a"), "c": (inc, "b"), "d": (inc, "c")}
            with pytest.raises(Boom, match="boom 1"):
                await cluster.compute(dsk, "d")
            with pytest.raises(Boom):
                await cluster.compute(dsk, ["a", ["d"]])
            assert await cluster.compute({"x": 1, "y": (inc, "x")}, ["x", ["y"]]) == (1, (2,))


async def test_cancel_a_long_running_graph() -> None:
    started, go = threading.Event(), threading.Event()
    after = Recorder()
    dsk: dict[str, Any] = {f"root-{i}": (gated, started, go, i) for i in range(4)}
    dsk.update({f"child-{i}": (after, f"root-{i}") for i in range(4)})
    dsk["total"] = (sum, [f"child-{i}" for i in range(4)])
    try:
        with anyio.fail_after(BOUND):
            async with Cluster(workers=2) as cluster:
                futs = await cluster.submit_graph(dsk, ["total", "root-0", "child-1"])
                await wait_until(started.is_set, "a root task to start", limit=10)
                await cluster.cancel(futs)
                for f in futs:
                    await f.wait()
                go.set()
                for f in futs:
                    assert f.status == "cancelled"
                    with pytest.raises(CancelledError):
                        await f
                # The cluster is still healthy, and nothing downstream ran.
                assert await cluster.submit(inc, 41) == 42
                for f in futs:
                    f.release()
                await wait_until(lambda: not cluster.scheduler_state.tasks.keys() & dsk.keys(),
                            "the cancelled tasks to be forgotten", limit=10)  # fmt: skip
                assert after.n == 0
    finally:
        go.set()


async def test_failed_graph_computed_again_runs_again() -> None:
    calls = Recorder()

    def flaky(x: int) -> int:
        calls(x)
        if calls.n == 1:
            raise Boom("first call fails")
        return x * 2

    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            dsk = {"x": 21, "y": (flaky, "x"), "z": (inc, "y")}
            with pytest.raises(Boom):
                await cluster.compute(dsk, "z")
            assert await cluster.compute(dsk, "z") == 43
            assert calls.n == 2


async def test_bad_graphs_are_rejected_before_anything_runs() -> None:
    ran = Recorder()
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            cyclic = {"a": (ran, "b"), "b": (ran, "c"), "c": (ran, "a"), "ok": (ran, "ran ok")}
            with pytest.raises(CycleError) as info:
                await cluster.submit_graph(cyclic, ["a", "ok"])
            assert isinstance(info.value, GraphError) and isinstance(info.value, ValueError)
            for k in "abc":
                assert repr(k) in str(info.value)

            missing = {"ok": (ran, "ran ok"), "x": Task("x", ran, TaskRef("ghost"))}
            with pytest.raises(MissingKeysError, match="ghost"):
                await cluster.submit_graph(missing, ["x", "ok"])
            with pytest.raises(MissingKeysError, match="nope"):
                await cluster.compute({"ok": (ran, "ran ok")}, ["ok", "nope"])

            # Later work runs (FIFO behind the rejected ones): they really never ran.
            assert await cluster.compute({"fine": (ran, "ran fine")}, "fine") == "ran fine"
            assert ran.order == ["ran fine"]
            assert not cluster.scheduler_state.tasks.keys() & {"a", "b", "c", "ok", "x"}


async def test_a_key_of_an_earlier_submission_is_known_while_a_client_holds_it() -> None:
    def echo(x: Any) -> Any:
        return x

    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            [held] = await cluster.submit_graph({"calib": (inc, 41)}, ["calib"])
            assert await held == 42
            assert await cluster.compute({"use": (echo, "calib")}, "use") == 42
            held.release()
            # As in dask: a string that names no key of the graph, and none a client
            # holds, is data. A reference says it is one: missing, it is refused.
            assert await cluster.compute({"use2": (echo, "calib")}, "use2") == "calib"
            with pytest.raises(MissingKeysError, match="holds a Future of it"):
                await cluster.compute({"use3": (echo, TaskRef("calib"))}, "use3")
            # A release does not overtake a submit() made before it, whose task reads
            # the key (the graph of submit calls goes out first: a review found it).
            x = cluster.submit(inc, 1)
            assert await x == 2
            y = cluster.submit(inc, x)
            x.release()
            assert await cluster.compute({"z": (inc, 10)}, "z") == 11
            assert await y == 3


# ----------------------------------------------------------------------------- ordering


def gated_recorded(rec: Recorder, started: threading.Event, go: threading.Event) -> Any:
    rec(("gate", 0))
    return gated(started, go, "gate")


async def _block_single_worker(cluster: Cluster, rec: Recorder) -> tuple[threading.Event, Any]:
    started, go = threading.Event(), threading.Event()
    gate = cluster.submit(gated_recorded, rec, started, go, key="gate")
    await wait_until(started.is_set, "the gate task to start", limit=10)
    return go, gate


async def _ran_behind_a_gate(
    submit: Callable[[Cluster, Recorder], Awaitable[list[Any]]],
) -> list[Any]:
    """What one worker with one thread ran, in order, of the futures ``submit`` made
    while a gate task kept the thread busy (all queued before any started)."""
    rec = Recorder()
    go = threading.Event()
    try:
        with anyio.fail_after(BOUND):
            async with Cluster(workers=1, threads_per_worker=1, saturation=1) as cluster:
                go, gate = await _block_single_worker(cluster, rec)
                futs = await submit(cluster, rec)
                go.set()
                await cluster.gather([gate, *futs])
                return rec.order[1:]
    finally:
        go.set()


async def test_user_priority_runs_first_on_one_thread() -> None:
    async def submit(cluster: Cluster, rec: Recorder) -> list[Any]:
        low = {f"low-{i}": (rec, ("low", i)) for i in range(5)}
        high = {f"high-{i}": (rec, ("high", i)) for i in range(5)}
        mid = {f"mid-{i}": (rec, ("mid", i)) for i in range(3)}
        f_low = await cluster.submit_graph(low, list(low))
        f_high = await cluster.submit_graph(high, list(high), priority=10)
        # Annotations on the layers of a HighLevelGraph work per task.
        hlg = HighLevelGraph(
            {"m": MaterializedLayer(mid, annotations={"priority": 5})},
            {"m": set()},
        )
        f_mid = await cluster.submit_graph(hlg, list(mid))
        return [*f_low, *f_high, *f_mid]

    ran = await _ran_behind_a_gate(submit)
    assert [n[0] for n in ran] == ["high"] * 5 + ["mid"] * 3 + ["low"] * 5, ran


async def test_dask_annotate_priority_in_one_graph() -> None:
    async def submit(cluster: Cluster, rec: Recorder) -> list[Any]:
        lows = [dask.delayed(rec, pure=False)(("low", i)) for i in range(4)]
        with dask.annotate(priority=3):
            highs = [dask.delayed(rec, pure=False)(("high", i)) for i in range(4)]
        graph = dask.delayed(list)([*lows, *highs]).__dask_graph__()
        return await cluster.submit_graph(graph, [x.key for x in (*lows, *highs)])

    ran = await _ran_behind_a_gate(submit)
    assert [n[0] for n in ran] == ["high"] * 4 + ["low"] * 4, ran


async def test_fifo_between_submissions() -> None:
    async def submit(cluster: Cluster, rec: Recorder) -> list[Any]:
        futs = []
        for batch in "abc":
            dsk = {f"{batch}-{i}": (rec, (batch, i)) for i in range(4)}
            futs += await cluster.submit_graph(dsk, list(dsk))
        return futs

    ran = await _ran_behind_a_gate(submit)
    assert [n[0] for n in ran] == list("aaaabbbbcccc"), ran


async def test_map_and_submits_run_in_the_order_made() -> None:
    # They used to run backwards: the graph of a batch was culled into reverse order.
    async def submit(cluster: Cluster, rec: Recorder) -> list[Any]:
        mapped = cluster.map(rec, [("map", i) for i in range(6)])
        return [*mapped, *(cluster.submit(rec, ("submit", i)) for i in range(6))]

    ran = await _ran_behind_a_gate(submit)
    assert ran == [("map", i) for i in range(6)] + [("submit", i) for i in range(6)]


# ----------------------------------------------------------------------------- state


async def test_status_has_per_category_statistics() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            futs = cluster.map(inc, range(10))
            sums = [cluster.submit(sum, [f, f]) for f in futs[:4]]
            bad = cluster.submit(boom_task, 0)
            await cluster.gather([*futs, *sums])
            await bad.wait()
            status = await cluster.status()
            cats = status["categories"]
            assert cats["inc"]["count"] == 10
            assert cats["inc"]["total_nbytes"] > 0
            assert cats["inc"]["mean_duration"] >= 0
            assert cats["sum"]["count"] == 4
            assert cats["boom_task"]["errors"] == 1 and cats["boom_task"]["count"] == 0
            assert len(status["workers"]) == 2
            assert status["policies"]["placement"] == "locality"
            stored = status["files"]["stored_bytes"]
            assert sum(stored.values()) > 0
            # What the dashboard and the autoscaler ask every second: no categories (a
            # run with 50,000 made a status of 16 MB, built every second for a page).
            lean = await cluster._manager.ask(StatusRequest(categories=False))
            assert lean.categories == {} and len(lean.workers) == 2
            assert (
                lean.tasks_by_state == (await cluster._manager.ask(StatusRequest())).tasks_by_state
            )


async def test_results_are_released() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            futs = cluster.map(inc, range(20))
            total = cluster.submit(sum, futs)
            assert await total == sum(range(1, 21))
            assert await cluster.gather(futs) == list(range(1, 21))
            statuses = await worker_statuses(cluster)
            assert sum(s.stored for s in statuses) >= 21
            for f in [*futs, total]:
                f.release()
            del futs, total
            state = cluster.scheduler_state
            await wait_until(
                lambda: not state.tasks, "the scheduler to forget every task", limit=10
            )
            stores: list[Any] = []

            async def stores_empty() -> bool:
                stores[:] = await worker_statuses(cluster)
                return all(s.stored == 0 and s.stored_bytes == 0 for s in stores)

            await wait_until(stores_empty, "the workers to drop every result", limit=10)
            assert len(stores) == 2
            status = await cluster.status()
            assert status["files"]["files"] == 0
            assert status["wanted_keys"] == 0
            assert not any(status["files"]["stored_bytes"].values())


async def test_same_keys_again_right_after_a_release() -> None:
    """A key released and at once wanted again (same graph computed twice in a row,
    a future released then resubmitted) is computed or kept, never lost in between."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            dsk = {"x": 1, "y": (inc, "x")}
            for _ in range(20):
                assert await cluster.compute(dsk, "y") == 2
            for _ in range(20):
                (fut,) = await cluster.submit_graph(dsk, ["y"])
                assert await fut == 2
                fut.release()
            for _ in range(20):
                fut = cluster.submit(inc, 1)
                assert await fut == 2
                fut.release()
            del fut
            await wait_until(
                lambda: not cluster.scheduler_state.tasks, "every task forgotten", limit=10
            )


async def test_story_lists_transitions() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            fut = cluster.submit(inc, 1)
            await fut
            story = await cluster.story(fut.key)
            moves = [(start, finish) for key, start, finish, *_ in story]
            assert all(entry[0] == fut.key for entry in story)
            assert ("queued", "processing") in moves and ("processing", "memory") in moves
            assert moves.index(("queued", "processing")) < moves.index(("processing", "memory"))
            assert all(len(entry) == 5 for entry in story)
            assert await cluster.story("never-heard-of-it") == []


# ----------------------------------------------------------------------------- workers


async def test_worker_to_worker_transfer() -> None:
    rec = Recorder()

    def make(name: str, n: int) -> list[int]:
        rec(name)
        return list(range(n))

    def combine(a: list[int], b: list[int]) -> int:
        rec("combine")
        return sum(a) + sum(b)

    with anyio.fail_after(BOUND):
        async with Cluster(workers=2, policies={"placement": "round-robin"}) as cluster:
            await cluster.wait_for_workers(2)
            a = cluster.submit(make, "a", 100)
            b = cluster.submit(make, "b", 200)
            await cluster.gather([a, b])
            assert rec.where["a"] != rec.where["b"], rec.where
            c = cluster.submit(combine, a, b)
            assert await c == sum(range(100)) + sum(range(200))
            # The worker that ran `combine` copied the input it lacked from its peer.
            state = cluster.scheduler_state
            replicas = {k: set(state.tasks[k].who_has) for k in (a.key, b.key)}
            ran_on = rec.where["combine"]
            assert all(ran_on in who for who in replicas.values()), (ran_on, replicas)
            assert max(len(who) for who in replicas.values()) == 2


async def test_scale_up_and_down() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            state = cluster.scheduler_state
            await cluster.wait_for_workers(1)
            assert await cluster.scale(3) == {"default": 3}
            await cluster.wait_for_workers(3)
            assert len(state.workers) == 3
            futs = cluster.map(inc, range(30))
            assert await cluster.gather(futs) == list(range(1, 31))
            assert await cluster.scale(1) == {"default": 1}
            await wait_until(lambda: len(state.workers) == 1, "two workers to leave", limit=10)
            more = cluster.map(inc, range(100, 110))
            assert await cluster.gather(more) == list(range(101, 111))
            # Results held by the workers that left are recomputed when needed again.
            assert await cluster.gather(futs) == list(range(1, 31))
            with pytest.raises(ValueError):
                await cluster.scale(-1)


async def test_crashed_worker_is_replaced_and_its_tasks_retried() -> None:
    started, go = threading.Event(), threading.Event()
    rec = Recorder()

    def slow(i: int) -> int:
        rec(i)
        started.set()
        if not go.wait(GATE):
            raise TimeoutError("gate never opened")
        return i * 10

    try:
        with anyio.fail_after(BOUND):
            async with Cluster(workers=2) as cluster:
                state = cluster.scheduler_state
                await cluster.wait_for_workers(2)
                futs = cluster.map(slow, range(8))
                await wait_until(lambda: rec.n >= 2, "both workers to start a task", limit=10)
                victim = rec.where[rec.order[0]]
                on_victim = {t.key for t in state.workers[victim].processing}
                assert on_victim
                ref = cluster._provider.ref(victim)
                assert ref is not None
                ref.stop("simulated crash")
                await wait_until(
                    lambda: victim not in state.workers, "the scheduler to drop it", limit=10
                )
                await wait_until(lambda: len(state.workers) == 2, "a replacement worker", limit=10)
                assert victim not in state.workers
                go.set()
                assert await cluster.gather(futs) == [i * 10 for i in range(8)]
                # The tasks that were on the lost worker were tried again, for free.
                for key in on_victim:
                    moves = [(s, f) for _, s, f, *_ in await cluster.story(key)]
                    assert any(s == "retry" for s, _ in moves), moves
                assert sum(st.lost for st in state.stats.values()) >= len(on_victim)
    finally:
        go.set()


async def test_a_result_the_client_was_given_is_made_again_only_when_awaited_again() -> None:
    """A user audit (slurmscale F1): a result the client had printed was made again at
    once when its worker was lost. Now only one the client was not given yet is; the
    other, once awaited again, through the manager's gather that finds its worker gone."""
    rec = Recorder()

    def make(name: str) -> str:
        rec(name)
        return name * 2

    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            state = cluster.scheduler_state
            await cluster.wait_for_workers(1)
            given = cluster.submit(make, "given", pure=False)
            kept = cluster.submit(make, "kept", pure=False)
            assert await given == "givengiven"
            await kept.wait()  # done, its value not asked for yet
            # (the manager tells the scheduler what gathers gave every quarter second)
            await wait_until(lambda: state.tasks[given.key].delivered, "the word", limit=5)
            assert not state.tasks[kept.key].delivered
            victim = rec.where["given"]
            ref = cluster._provider.ref(victim)
            assert ref is not None
            ref.stop("simulated crash")
            # The one not gathered yet runs again at once; the one gathered does not.
            await wait_until(lambda: rec.order.count("kept") == 2, "kept made again", limit=10)
            assert state.tasks[given.key].state == "released"
            assert rec.order.count("given") == 1
            assert await kept == "keptkept"
            assert await given == "givengiven"  # made again now: its future still works
            assert rec.order.count("given") == 2
            assert state.tasks[given.key].state == "memory"


# ----------------------------------------------------------------------------- policies


async def test_set_policy_and_its_errors() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            info = await cluster.set_policy("placement", "round-robin")
            assert isinstance(info, PolicyInfo)
            assert info.name == "round-robin" and "locality" in info.available
            assert (await cluster.status())["policies"]["placement"] == "round-robin"
            with pytest.raises(UnknownPolicyError, match="no-such-policy"):
                await cluster.set_policy("placement", "no-such-policy")
            with pytest.raises(UnknownPolicyError):
                await cluster.set_policy("no-such-kind", "default")
            with pytest.raises(PolicyParamsError):
                await cluster.set_policy("placement", "locality", bandwidth=-1)
            with pytest.raises(PolicyParamsError):
                await cluster.set_policy("retry", "default", nonsense=1)
            # The failed swaps changed nothing; the cluster still works.
            assert (await cluster.status())["policies"]["placement"] == "round-robin"
            assert "placement" not in (await cluster.status())["policy_params"]  # defaults
            assert await cluster.gather(cluster.map(inc, range(4))) == [1, 2, 3, 4]
            # The status shows the parameters a policy was given, beside its name.
            await cluster.set_policy("placement", "locality", bandwidth=2e8)
            status = await cluster.status()
            assert status["policies"]["placement"] == "locality"
            assert status["policy_params"]["placement"] == {"bandwidth": 2e8}


class PinFirst:
    """Placement: always the worker with the smallest id."""

    def choose(self, task: Any, candidates: Sequence[Any], stats: Any) -> Any:
        return min(candidates, key=lambda w: w.id)


policies.register("placement", "test-pin-first")(PinFirst)


async def test_swap_placement_policy_mid_run() -> None:
    rec = Recorder()
    reached, swapped = threading.Event(), threading.Event()

    def work(i: int, *after: Any) -> int:
        rec(i)
        return i

    def gate(*_: Any) -> int:
        rec("gate")
        reached.set()  # partway through the run: the test swaps the policy now
        if not swapped.wait(GATE):
            raise TimeoutError("the test never swapped")
        return 0

    first = {f"work-{i}": (work, i) for i in range(30)}
    gate_dsk = {"gate": (gate, *first)}  # after every first-phase task
    second = {f"work-{i}": (work, i, "gate") for i in range(30, 80)}
    dsk = {**first, **gate_dsk, **second}
    try:
        with anyio.fail_after(BOUND):
            async with Cluster(workers=2) as cluster:
                await cluster.wait_for_workers(2)
                state = cluster.scheduler_state
                futs = await cluster.submit_graph(dsk, list(dsk))
                await wait_until(reached.is_set, "the run to reach the gate", limit=10)
                info = await cluster.set_policy("placement", "test-pin-first")
                assert info.name == "test-pin-first"
                swapped.set()
                values = await cluster.gather(futs)
                assert values == [*range(30), 0, *range(30, 80)]
                # Every task placed after the swap ran on the smallest-id worker.
                log = list(state.story_log)
                swap_at = next(
                    i for i, e in enumerate(log) if e[1] == "policy" and "test-pin-first" in e[2]
                )
                placed_after = {
                    e[0] for e in log[swap_at:] if (e[1], e[2]) == ("queued", "processing")
                }
                assert placed_after >= set(second), set(second) - placed_after
                first_worker = min(state.workers)
                wrong = {k: rec.where[int(k.split("-")[1])] for k in placed_after & set(second)}
                wrong = {k: w for k, w in wrong.items() if w != first_worker}
                assert not wrong, wrong
                # A submission after the swap goes there too.
                later = cluster.map(work, range(100, 120))
                await cluster.gather(later)
                assert {rec.where[i] for i in range(100, 120)} == {first_worker}
    finally:
        swapped.set()


# ----------------------------------------------------------------------------- embedding


CLUSTER = web.AppKey("cluster", Cluster)


async def test_inside_an_aiohttp_application() -> None:
    started, go = threading.Event(), threading.Event()

    async def cluster_ctx(app: web.Application) -> Any:
        async with Cluster(workers=2) as cluster:
            app[CLUSTER] = cluster
            yield

    async def compute(request: web.Request) -> web.Response:
        cluster = request.app[CLUSTER]
        n = int(request.query["n"])
        squares = cluster.map(operator.mul, range(n), range(n))
        total = cluster.submit(sum, squares)
        graph = await cluster.compute({"x": n, "y": (inc, "x")}, "y")
        return web.json_response({"total": await total, "graph": graph})

    async def slow(request: web.Request) -> web.Response:
        value = await request.app[CLUSTER].submit(gated, started, go, "slow", pure=False)
        return web.json_response({"value": value})

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"pong": True})

    app = web.Application()
    app.cleanup_ctx.append(cluster_ctx)
    app.router.add_get("/compute", compute)
    app.router.add_get("/slow", slow)
    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app)
    # The cluster's task group lives from setup() to cleanup() in this task, so both
    # happen inside the same bound (cancel scopes must nest).
    with anyio.fail_after(BOUND):
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            base = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/compute", params={"n": "20"}) as resp:
                    assert resp.status == 200, await resp.text()
                    assert await resp.json() == {
                        "total": sum(i * i for i in range(20)),
                        "graph": 21,
                    }
                # While a computation is in flight the loop keeps serving requests.
                answers: dict[str, Any] = {}

                async def get_slow() -> None:
                    async with session.get(f"{base}/slow") as r:
                        answers["slow"] = await r.json()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(get_slow)
                    await wait_until(started.is_set, "the slow request's task to start", limit=10)
                    async with session.get(f"{base}/ping") as resp:
                        assert await resp.json() == {"pong": True}
                    assert "slow" not in answers
                    go.set()
                assert answers["slow"] == {"value": "slow"}
        finally:
            go.set()
            await runner.cleanup()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_cluster_is_sized_by_the_cpus_this_process_may_use() -> None:
    """``Cluster()`` started ``os.cpu_count()`` workers, the machine's CPUs, in a Slurm
    job or a container given a few of them (its CPU set): a 4-CPU allocation on a 64-core
    node got 64 workers on 4 CPUs. Now the default, and the local bound of ``scale``,
    follow the CPUs the process may run on. Checked in a child held to one CPU."""
    code = (
        "import os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from runtime import Cluster\n"
        "from runtime.node import machine_blocks\n"
        "from runtime.preflight import LOCAL_WORKERS_PER_CPU\n"
        "print(Cluster().n_workers, machine_blocks(), LOCAL_WORKERS_PER_CPU)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    workers, blocks, per_cpu = map(int, done.stdout.split())
    assert (workers, blocks) == (1, per_cpu), done.stdout
