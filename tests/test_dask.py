"""Real dask through Corral's dask scheduler: ``dask.compute(x, scheduler=runtime.get)``.

What lives here: dask's own conformance mixin for ``get`` functions, real dask
collections (array, bag, delayed) checked against dask's synchronous scheduler,
annotations (priority, retries), errors, and ``get`` called from a running event loop.
"""

from __future__ import annotations

import asyncio
import operator
import re
import threading
from typing import Any

import anyio
import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
from dask._task_spec import Task, TaskRef
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.utils_test import GetFunctionTestMixin

import runtime
from runtime import Cluster
from runtime.errors import CycleError, GraphError, MissingKeysError
from runtime.messages import SubmitGraphRequest


class TestGet(GetFunctionTestMixin):
    get = staticmethod(runtime.get)


# ----------------------------------------------------------------------------- helpers


class Boom(Exception):
    """A user exception type only this module knows."""


class Counter:
    """A thread-safe call counter (tasks run in worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.n = 0

    def bump(self) -> int:
        with self._lock:
            self.n += 1
            return self.n


class Recorder:
    """A task function that records, thread-safely, the values it was called with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.order: list[Any] = []

    def __call__(self, value: Any) -> Any:
        with self._lock:
            self.order.append(value)
        return value


def both(x: Any) -> tuple[Any, Any]:
    """``x`` computed by dask's synchronous scheduler and by Corral."""
    (expected,) = dask.compute(x, scheduler="sync")
    (got,) = dask.compute(x, scheduler=runtime.get)
    return expected, got


# ----------------------------------------------------------------------------- collections


def test_array_reductions_over_100_chunks() -> None:
    x = da.random.RandomState(0).random((2000, 2000), chunks=(200, 200))
    assert x.npartitions >= 100
    y = x + x.T
    expected, got = both(y.mean())
    np.testing.assert_allclose(got, expected)
    expected, got = both(y.sum(axis=0))
    assert got.shape == (2000,)
    np.testing.assert_allclose(got, expected)
    # Several collections in one compute share the graph.
    m, s = dask.compute(y.mean(), x.std(), scheduler=runtime.get)
    em, es = dask.compute(y.mean(), x.std(), scheduler="sync")
    np.testing.assert_allclose([m, s], [em, es])


def test_bag_map_filter_fold() -> None:
    b = db.from_sequence(range(1000), npartitions=20)
    c = b.map(lambda i: i * 3).filter(lambda i: i % 2 == 0)
    expected, got = both(c.fold(operator.add))
    assert got == expected == sum(i * 3 for i in range(1000) if (i * 3) % 2 == 0)
    expected, got = both(c.map(lambda i: i % 7).frequencies())
    assert sorted(got) == sorted(expected)
    expected, got = both(c)
    assert list(got) == list(expected)


def test_delayed_diamond_and_fan_in() -> None:
    @dask.delayed
    def inc(i: int) -> int:
        return i + 1

    @dask.delayed
    def add(a: int, b: int) -> int:
        return a + b

    @dask.delayed
    def total(items: list[int]) -> int:
        return sum(items)

    top = inc(1)
    diamond = add(inc(top), add(top, 10))  # top feeds two branches that join again
    fan_in = total([inc(i) for i in range(50)])
    out = add(diamond, fan_in)
    expected, got = both(out)
    assert got == expected == (3 + 12) + sum(range(1, 51))
    assert dask.compute(diamond, fan_in, scheduler=runtime.get) == (15, 1275)


def test_task_error_reaches_caller_with_its_type() -> None:
    @dask.delayed
    def div(a: int, b: int) -> float:
        return a / b

    @dask.delayed
    def inc(i: float) -> float:
        return i + 1

    with pytest.raises(ZeroDivisionError):
        dask.compute(inc(div(1, 0)), scheduler=runtime.get)

    @dask.delayed
    def boom(i: int) -> int:
        raise Boom(f"bad {i}")

    with pytest.raises(Boom, match="bad 3") as info:
        dask.compute(inc(boom(3)), scheduler=runtime.get)
    assert "boom" in "".join(_frames(info.value))


def _frames(err: BaseException) -> list[str]:
    import traceback

    return traceback.format_tb(err.__traceback__)


# ----------------------------------------------------------------------------- annotations


def test_retries_annotation_is_honoured() -> None:
    def make(counter: Counter) -> Any:
        @dask.delayed(pure=False)
        def flaky() -> str:
            if counter.bump() <= 2:
                raise Boom("not yet")
            return "ok"

        return flaky

    counter = Counter()
    with dask.annotate(retries=2):
        x = make(counter)()
    (got,) = dask.compute(x, scheduler=runtime.get)
    assert got == "ok"
    assert counter.n == 3

    counter = Counter()
    x = make(counter)()
    with pytest.raises(Boom):
        dask.compute(x, scheduler=runtime.get)
    assert counter.n == 1


def test_retries_option_applies_to_every_task() -> None:
    counter = Counter()

    def flaky() -> int:
        if counter.bump() <= 1:
            raise Boom("first call fails")
        return 7

    assert runtime.get({"x": (flaky,)}, "x", retries=1) == 7
    assert counter.n == 2


def test_priority_annotation_orders_ready_tasks() -> None:
    record = Recorder()
    lows = [dask.delayed(record, pure=False)(f"low-{i}") for i in range(5)]
    with dask.annotate(priority=10):
        highs = [dask.delayed(record, pure=False)(f"high-{i}") for i in range(5)]
    # lows come first in graph order; the annotation must still put highs first.
    got = dask.compute(*lows, *highs, scheduler=runtime.get, num_workers=1)
    assert sorted(got) == sorted([f"low-{i}" for i in range(5)] + [f"high-{i}" for i in range(5)])
    assert all(name.startswith("high") for name in record.order[:5]), record.order


def test_independent_delayeds_run_in_the_order_given() -> None:
    # They used to run backwards: the graph was culled into reverse order.
    record = Recorder()
    values = [dask.delayed(record, pure=False)(i) for i in range(8)]
    assert dask.compute(*values, scheduler=runtime.get, num_workers=1) == tuple(range(8))
    assert record.order == list(range(8))


# ----------------------------------------------------------------------------- calling get


def test_get_from_inside_a_running_event_loop() -> None:
    x = da.ones((100, 100), chunks=(10, 10)).sum()

    async def main() -> Any:
        (value,) = dask.compute(x, scheduler=runtime.get)
        return value

    assert asyncio.run(main()) == 10_000


def test_get_rejects_unknown_options() -> None:
    with pytest.raises(TypeError, match="bogus"):
        runtime.get({"x": 1}, "x", bogus=True)


def test_missing_key_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        runtime.get({"x": 1}, "y")
    # A dependency the graph does not define (an explicit reference), named in the error.
    dsk = {"x": 1, "y": Task("y", operator.add, TaskRef("x"), TaskRef("nowhere"))}
    with pytest.raises(MissingKeysError, match="nowhere") as info:
        runtime.get(dsk, "y")
    assert isinstance(info.value, KeyError)


def test_cycle_is_rejected_naming_the_keys() -> None:
    counter = Counter()

    def f(*args: Any) -> int:
        counter.bump()
        return 1

    dsk = {"a": (f, "b"), "b": (f, "c"), "c": (f, "a"), "d": (f,)}
    with pytest.raises(CycleError) as info:
        runtime.get(dsk, ["a", "d"])
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, GraphError)
    for k in ("a", "b", "c"):
        assert repr(k) in str(err)
    assert counter.n == 0


def test_invalid_annotations_are_rejected_before_anything_runs() -> None:
    counter = Counter()

    def f() -> int:
        counter.bump()
        return 1

    layers = {"a": MaterializedLayer({"x": (f,)}, annotations={"priority": "urgent"})}
    with pytest.raises(GraphError, match=r"'x'.*priority"):
        runtime.get(HighLevelGraph(layers, {"a": set()}), "x")
    with pytest.raises(GraphError, match="retries"):
        runtime.get({"x": (f,)}, "x", retries=-1)
    with pytest.raises(ValueError):
        runtime.get({"x": (f,)}, "x", priority="soon")
    assert counter.n == 0


# ----------------------------------------------------------------------------- error notes

BOUND = 30  # seconds any single cluster test may take (task processes start in about a second)


def _fails() -> None:
    raise Boom("boom")


def noted(err: BaseException, key: str) -> bool:
    """``err`` has one note, the one naming task ``key``, its worker and its try."""
    notes = getattr(err, "__notes__", [])
    pattern = rf"\(raised by task {re.escape(repr(key))} on worker '[^']+', try 1 of 1\)"
    return len(notes) == 1 and re.fullmatch(pattern, notes[0]) is not None


def test_get_notes_the_task_that_raised() -> None:
    # docs/api.md: compute/get raise the original exception with a note "(raised by
    # task '<key>' on worker ..., try 1 of 1)": when the requested key is the one that
    # failed, as when a dependency of it did.
    for dsk, key in [({"a": (_fails,)}, "a"), ({"a": (_fails,), "b": (str, "a")}, "b")]:
        with pytest.raises(Boom) as info:
            runtime.get(dsk, key)
        assert noted(info.value, "a"), (key, info.value.__notes__)


def test_delayed_compute_notes_the_task_that_raised() -> None:
    x = dask.delayed(_fails)(dask_key_name="boom-1")
    with pytest.raises(Boom) as info:
        x.compute(scheduler=runtime.get)
    assert noted(info.value, "boom-1"), info.value.__notes__


@pytest.mark.anyio
@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_cluster_compute_and_futures_note_once(execution: str) -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1, memory_options={"execution": execution}) as cluster:
            fut = cluster.submit(_fails, key="f")
            # Future and gather: the note, once, however often raised.
            for _ in range(2):
                with pytest.raises(Boom) as info:
                    await fut
                assert noted(info.value, "f"), info.value.__notes__
                with pytest.raises(Boom) as info:
                    await cluster.gather([fut], root_errors=True)
                assert noted(info.value, "f"), info.value.__notes__
            # compute: the note, once, though the same exception object is raised again.
            for _ in range(2):
                with pytest.raises(Boom) as info:
                    await cluster.compute({"g": (_fails,)}, "g")
                assert noted(info.value, "g"), info.value.__notes__
            # A graph reading "g" by name while a Future holds it (compute let it go).
            [held] = await cluster.submit_graph({"g": (_fails,)}, ["g"])
            with pytest.raises(Boom) as info:
                await cluster.compute({"h": (str, "g")}, ["h"])
            assert noted(info.value, "g"), info.value.__notes__
            held.release()


# ----------------------------------------------------------------------------- not a graph

COLLECTIONS = {
    "array-1d": lambda: da.arange(10, chunks=5),
    "array-0d": lambda: da.arange(10, chunks=5).sum(),
    "delayed": lambda: dask.delayed(operator.add)(1, 2),
    "bag": lambda: db.from_sequence([1, 2, 3], npartitions=2),
}


@pytest.mark.anyio
async def test_a_dask_collection_with_keys_is_refused_and_alone_is_computed() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for name, make in COLLECTIONS.items():
                x = make()
                keys = list(flatten(x.__dask_keys__()))
                with pytest.raises(TypeError, match="beside dask collections"):
                    await cluster.compute(x, keys)
                with pytest.raises(TypeError, match="a collection's keys are its own"):
                    await cluster.submit_graph(x, keys)
                # The manager checks too, before anything else looks at the graph (for a
                # client that did not check, say one of another version).
                request = SubmitGraphRequest(x, tuple(keys), cluster._client_actor.name)
                with pytest.raises(GraphError, match="got a dask collection with keys"):
                    await cluster._manager.ask(request, timeout=None)
                (expected,) = dask.compute(x, scheduler="sync")
                assert _same(await cluster.compute(x), expected), name
                [future] = await cluster.submit_graph(x)
                assert _same(await future, expected), name
                got = await cluster.compute(x.__dask_graph__(), keys)
                assert len(got) == len(keys), name


@pytest.mark.anyio
async def test_a_dict_of_collections_given_with_keys_is_refused_not_returned_uncomputed() -> None:
    """``compute({"a": x.sum()}, "a")``: a dict of collections with keys is no graph (a
    graph holds tasks). Read as one, its collection was a literal and came back
    itself, a dask array, not its value; now a GraphError says to give the dict
    alone, which gives a dict of values. submit_graph alike; a graph's own tasks
    stand."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for name, make in COLLECTIONS.items():
                x = make()
                for keys in ("a", ["a"], 3):
                    with pytest.raises(GraphError, match="value for key 'a' is a dask coll"):
                        await cluster.compute({"a": x}, keys)
                with pytest.raises(GraphError, match="a dict of collections is computed"):
                    await cluster.submit_graph({"b": 1, "a": x}, ["a"])
                (expected,) = dask.compute(x, scheduler="sync")
                got = await cluster.compute({"a": x})
                assert got.keys() == {"a"} and _same(got["a"], expected), name
            assert await cluster.compute({"a": 1, "b": (operator.add, "a", 2)}, "b") == 3


def _same(got: object, expected: object) -> bool:
    """Whether a computed value is dask's (arrays compared by value)."""
    if isinstance(expected, np.ndarray | np.generic):
        return type(got) is type(expected) and bool(np.array_equal(got, expected))
    return type(got) is type(expected) and got == expected
