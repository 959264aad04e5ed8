"""``Cluster.persist`` and ``Cluster.scatter``, dask.distributed's ``Client.persist`` and
``Client.scatter``: a persisted collection is rebuilt on the futures of its chunks, so a
collection made from it runs only its new tasks; scattered values are futures to pass
to ``submit``. Before, neither method existed.

The chunks' tasks count their runs in this process (in-process workers run them in
threads), so "did not run again" is a count, not a timing. Every test is bounded.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections import Counter
from typing import Any

import anyio
import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask._task_spec import Task

import runtime.graph
from runtime import Cluster, Future, futures_of
from runtime.client import _LIVE_CLIENTS, _LOCAL_CHECK, nested_computes_on
from runtime.codec import MAX_FRAME_BYTES
from runtime.errors import (
    CorralError,
    DaskOnlyArgument,
    EagerComputeOnCluster,
    TaskArgumentsTooLarge,
)
from runtime.graph import normalize_graph
from tests.helpers import nodes

pytestmark = pytest.mark.anyio

LIMIT = 30

RUNS: Counter[str] = Counter()  #: runs of each chunk task, by test
_LOCK = threading.Lock()


def counted(block: np.ndarray, name: str) -> np.ndarray:
    if block.size:  # (not dask's call on an empty block, to learn its type)
        with _LOCK:
            RUNS[name] += 1
    return block + 1


def chunks(name: str) -> da.Array:
    """A 4x4 array of 2x2 chunks, each made by a task that counts its runs under
    ``name``: its value is all 2s."""
    return da.ones((4, 4), chunks=2).map_blocks(counted, name, dtype=float)


async def test_a_reduction_of_a_persisted_array_reads_its_chunks_without_running_them_again() -> (
    None
):
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            x = await cluster.persist(chunks("reduce"))
            assert isinstance(x, da.Array)
            futures = list(dict(x.__dask_graph__()).values())
            assert len(futures) == 4
            await cluster.gather(futures)  # the four chunks, computed once
            assert RUNS["reduce"] == 4
            assert await cluster.compute(x.sum()) == 32.0
            assert await cluster.compute((x * 3).max()) == 6.0
            np.testing.assert_array_equal(await cluster.compute(x), np.full((4, 4), 2.0))
            assert RUNS["reduce"] == 4  # the chunks' tasks did not run again
            # they stay on the cluster as long as the persisted collection's futures
            status = {f.status for f in futures}
            assert status == {"finished"}


async def test_the_chunks_stay_while_the_persisted_collection_lives_and_go_after() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            x = await cluster.persist(chunks("lives"))
            name = x.name

            def held() -> list[object]:
                tasks = cluster.scheduler_state.tasks
                return [k for k in tasks if isinstance(k, tuple) and k[0] == name]

            assert await cluster.compute(x.sum()) == 32.0
            assert len(held()) == 4  # computed from, and still there
            del x
            while held():  # let go once the collection (its futures) is gone
                gc.collect()
                await anyio.sleep(0.05)
            assert RUNS["lives"] == 4


async def test_persist_of_several_collections_keeps_their_shape() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            a, b = chunks("many-a"), chunks("many-b") * 2
            pa, pb = await cluster.persist(a, b)
            (la,) = await cluster.persist([a])
            assert isinstance(pa, da.Array) and isinstance(la, da.Array)
            assert await cluster.compute(pa.sum() + pb.sum()) == 32.0 + 64.0
            assert await cluster.compute(la.sum()) == 32.0
            assert RUNS["many-a"] == 4  # persisted twice: one task per chunk
            assert RUNS["many-b"] == 4
            with pytest.raises(TypeError, match="persist takes dask collections"):
                await cluster.persist([1, 2])


async def test_persist_of_a_dict_of_collections_gives_a_dict() -> None:
    """An audit: ``compute({"a": x})`` gives a dict, but ``persist({"a": x})`` raised
    ``TypeError: persist takes dask collections ... got dict``. A dict of collections
    (one argument, as ``compute`` and ``dask.persist`` take it) now gives a dict of the
    persisted collections under the same names; a dict holding a value that is no
    collection is still the TypeError, naming it."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            a, b = chunks("dict-a"), chunks("dict-b") * 2
            got = await cluster.persist({"a": a, "b": b})
            assert type(got) is dict and list(got) == ["a", "b"]
            assert all(isinstance(v, da.Array) for v in got.values())
            assert await cluster.compute(got["a"].sum() + got["b"].sum()) == 32.0 + 64.0
            assert RUNS["dict-a"] == RUNS["dict-b"] == 4  # computed once, by the persist
            assert await cluster.persist({}) == {}
            with pytest.raises(TypeError, match=r"persist takes dask collections.* got int 1"):
                await cluster.persist({"a": a, "one": 1})


async def test_computing_from_released_persisted_futures_raises_and_runs_nothing() -> None:
    """Documented choice: the persisted collection's graph holds only its futures, so
    once they are released it cannot be remade: CorralError naming the key, nothing run."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            x = await cluster.persist(chunks("released"))
            y = x.sum()
            for f in dict(x.__dask_graph__()).values():
                f.release()
            with pytest.raises(CorralError, match="was released") as info:
                await cluster.compute(y)
            assert info.value.fields["key"][0] == x.name
            assert await cluster.submit(int, 7) == 7  # the cluster goes on


async def test_a_persisted_collection_computes_through_a_manager_process_connection() -> None:
    """A manager behind a connection (the codec pickles each message): the futures in
    the graph travel as references to their keys. An array's and a dataframe's."""
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            x = await cluster.persist(chunks("remote"))
            assert await cluster.compute(x.sum()) == 32.0
            assert RUNS["remote"] == 4
            frame = pd.DataFrame({"a": range(100), "b": range(100)})
            df = dd.from_pandas(frame, npartitions=4)
            kept = await cluster.persist(df[df.a > 10])
            assert isinstance(kept, dd.DataFrame)
            assert await cluster.compute(kept.b.sum()) == frame[frame.a > 10].b.sum()


def timeseries(seed: int) -> dd.DataFrame:
    """720 rows in 6 partitions (a seed per test: dask keeps the divisions it computed
    for a frame, by its name)."""
    return dask.datasets.timeseries(
        start="2000-01-01", end="2000-01-01T02:00", freq="10s", partition_freq="20min", seed=seed
    )


async def test_a_persisted_dataframe_sets_its_index_on_the_workers() -> None:
    """``set_index`` (and ``sort_values``) compute their divisions while dask optimizes,
    with dask's threads unless told otherwise: on a persisted frame, whose chunks are on
    the workers only, that was ``ValueError: Missing dependency``. They run on the
    cluster now, and give what dask's own scheduler gives from the original frame."""
    ts = timeseries(3)
    with dask.config.set({"dataframe.shuffle.method": "tasks"}):
        expected = dask.compute(
            ts.set_index("x").y.sum(),
            ts.sort_values("y").y,
            scheduler="sync",
        )
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            kept = await cluster.persist(ts)
            got = await cluster.compute(kept.set_index("x").y.sum(), kept.sort_values("y").y)
            assert got[0] == pytest.approx(expected[0], rel=1e-12)  # (summed in another order)
            pd.testing.assert_series_equal(got[1], expected[1])
            frame = await cluster.compute(kept.set_index("x"))
            assert frame.index.is_monotonic_increasing and len(frame) == 720


async def test_an_eager_compute_of_a_persisted_frame_in_the_loop_says_what_to_do() -> None:
    """``len(x)`` of a persisted frame in the cluster's event loop (in a loop over
    steps, say) is computed at once by dask's threads, which cannot read the chunks on
    the workers: that was dask's ``ValueError: Missing dependency``, which said nothing
    of the cluster (a left-over audit problem). It is ``EagerComputeOnCluster`` (a
    ``ValueError``) naming what to do, each time; awaited, the cluster gives the length,
    and in a thread under ``cluster.get`` the eager ``len`` runs on the cluster. A frame
    that is not persisted is computed by dask's threads as before."""
    ts = timeseries(6)
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            kept = await cluster.persist(ts)
            for _ in range(2):
                with pytest.raises(EagerComputeOnCluster, match=r"await cluster\.compute") as got:
                    len(kept)
                assert isinstance(got.value, ValueError)
                assert {f.key for f in futures_of(kept)} >= set(got.value.keys)
            assert await cluster.compute(kept.shape[0]) == 720
            assert len(ts) == 720

            def in_thread() -> int:
                with dask.config.set(scheduler=cluster.get):
                    return len(kept)

            assert await anyio.to_thread.run_sync(in_thread) == 720


async def test_futures_of_gives_a_persisted_collections_chunks_to_wait_for() -> None:
    """``futures_of``, dask.distributed's: the futures of a persisted dataframe (whose
    graph holds dask's aliases beside them, so the graph's values, which the docs said
    to gather, were a ``TypeError``), of a collection made from it and of an array."""
    ts = timeseries(5)
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            kept = await cluster.persist(ts)
            futures = futures_of(kept)
            assert len(futures) == ts.npartitions == 6
            assert all(isinstance(f, Future) for f in futures)
            frames = await cluster.gather(futures)
            assert sum(len(f) for f in frames) == 720
            assert {f.key for f in futures_of(kept.x + 1, [kept])} == {f.key for f in futures}
            arr = await cluster.persist(chunks("futures-of"))
            assert len(futures_of(arr)) == 4
            assert futures_of(ts) == []  # nothing persisted: no future
            with pytest.raises(TypeError, match="futures_of takes dask collections"):
                futures_of(futures)


async def test_a_dataframes_divisions_are_computed_on_the_workers() -> None:
    """The quantiles of a ``set_index`` run as the cluster's tasks (a category of its
    own in ``status()``), as with a dask.distributed client, not in the client's threads
    outside the workers' memory limits; dask's config is left as it was."""
    ts = timeseries(4)
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            sums = await cluster.compute(ts.set_index("x").y.sum(), ts.y.sum())
            assert sums[0] == pytest.approx(sums[1], rel=1e-12)
            categories = (await cluster.status())["categories"]
            assert "repartitionquantiles" in categories, list(categories)
    assert dask.config.get("scheduler", None) is None


def test_nested_computes_go_to_their_threads_scheduler_and_config_is_restored() -> None:
    """Two overlapping blocks in two threads: each thread's compute goes to its own
    scheduler, a third thread's to the one dask's config named before, and dask's
    config names it again once both ended (whichever ends first)."""
    calls: list[str] = []

    def recording(name: str) -> Any:
        def get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return dask.get(dsk, keys)

        return get

    inside = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]

    def block(i: int) -> None:
        with nested_computes_on(recording(f"cluster-{i}")):
            assert dask.delayed(int)(i).compute() == i
            inside[i].set()
            assert release[i].wait(LIMIT)

    before = recording("before")
    with dask.config.set(scheduler=before):
        threads = [threading.Thread(target=block, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for e in inside:
            assert e.wait(LIMIT)
        other: list[int] = []
        elsewhere = threading.Thread(target=lambda: other.append(dask.delayed(int)(7).compute()))
        elsewhere.start()
        elsewhere.join(LIMIT)
        assert other == [7]
        release[0].set()  # the first to start ends first
        threads[0].join(LIMIT)
        assert dask.config.get("scheduler") is not before  # the other block still runs
        release[1].set()
        threads[1].join(LIMIT)
        assert dask.config.get("scheduler") is before
        assert sorted(calls) == ["before", "cluster-0", "cluster-1"]


def test_a_nested_block_left_in_dasks_config_by_another_thread_is_not_its_own_before() -> None:
    """Another thread's ``dask.config.set`` block that began inside a nested block and
    ended after it puts the nested scheduler back in dask's config; the next nested
    block took it as the scheduler dask named before, so a compute of another thread
    meanwhile called it again and again: RecursionError. Now such a compute runs in
    dask's threads, as with nothing named, and dask's config names nothing after."""
    calls: list[str] = []

    def on_cluster(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        calls.append("cluster")
        return dask.get(dsk, keys)

    with nested_computes_on(on_cluster):
        other = dask.config.set(scheduler="sync")  # another thread's block ...
        other.__enter__()
    other.__exit__(None, None, None)  # ... that ends after this one
    try:
        with nested_computes_on(on_cluster):
            out: list[Any] = []
            elsewhere = threading.Thread(
                target=lambda: out.append(dask.delayed(sum)([1, 2]).compute())
            )
            elsewhere.start()
            elsewhere.join(LIMIT)
            assert out == [3]
            assert dask.delayed(int)(4).compute() == 4  # this thread's: its cluster's
        assert calls == ["cluster"]
        assert dask.config.get("scheduler", None) is None
    finally:
        dask.config.set(scheduler=None)


def add(a: float, b: float) -> float:
    return a + b


async def test_a_future_inside_a_graph_is_a_dependency_on_its_key() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            nodes(1) as (address, _),
            Cluster(address) as remote,
            Cluster(workers=1) as embedded,
        ):
            for cluster in (embedded, remote):
                f = cluster.submit(add, 1, 1)
                graph = {"y": (add, f, 10), "z": f, "w": [f, "y"]}
                assert await cluster.compute(graph, ["y", "z", "w"]) == (12, 2, [2, 12])
                (got,) = await cluster.submit_graph({"v": (add, f, f)}, ["v"])
                assert await got == 4
                f.release()
                with pytest.raises(CorralError, match="was released"):
                    await cluster.compute({"y2": (add, f, 10)}, "y2")
                with pytest.raises(CorralError, match="another cluster"):
                    other = embedded if cluster is remote else remote
                    await cluster.compute({"y3": (add, other.submit(add, 2, 2), 1)}, "y3")


def total(*parts: object) -> float:
    return float(sum(np.sum(p) for p in parts))  # type: ignore[call-overload]


async def test_scattered_lists_and_dicts_are_futures_for_submit() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            a, b = await cluster.scatter([1, np.arange(4)])
            d = await cluster.scatter({"p": 10, "q": np.ones(3)})
            assert set(d) == {"p", "q"}
            one = await cluster.scatter(5)
            assert await cluster.submit(total, a, b, d["p"], d["q"], one) == 1 + 6 + 10 + 3 + 5
            assert await cluster.gather([a, d["p"]]) == [1, 10]
            # pure by default: the same value is the same key; hash=False, a new one
            (again,) = await cluster.scatter([1])
            assert again.key == a.key
            (fresh,) = await cluster.scatter([1], hash=False)
            assert fresh.key != a.key and await fresh == 1
            for name in ("broadcast", "workers"):
                with pytest.raises(DaskOnlyArgument, match=f"{name}= .* scatter does not"):
                    await cluster.scatter([1], **{name: True})


async def test_scatter_of_a_value_over_the_argument_limit_raises_at_the_call() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            too_large = b"\0" * (MAX_FRAME_BYTES + 1)
            with pytest.raises(TaskArgumentsTooLarge, match="Scatter it in parts") as info:
                await cluster.scatter([too_large])
            assert info.value.fields["size"] > MAX_FRAME_BYTES
            assert info.value.fields["limit"] == MAX_FRAME_BYTES
            del too_large
            assert await cluster.scatter(b"small") is not None


async def test_a_cluster_closes_while_dask_computes_in_another_thread() -> None:
    """dask's local schedulers swap dask's process-wide ``Callback.active`` for an empty
    set while they compute (``local_callbacks``) and put it back after. A cluster that
    closed meanwhile (the last of the process) removed its eager-compute check from
    that empty set: ``KeyError`` out of ``close``, whose actors and workers were never
    stopped, and the check, put back by dask, stayed active as if a user's callback.
    One that started meanwhile had its check put away with the empty set: ``close``
    raised ``KeyError`` too. The cluster closes; a cluster started after it checks eager
    computes again and computes a persisted collection as before."""
    inside, go = threading.Event(), threading.Event()

    def step() -> int:
        inside.set()
        go.wait(LIMIT)
        return 1

    def local() -> int:
        (value,) = dask.compute(dask.delayed(step)(), scheduler="sync")
        return int(value)

    async def local_while(cluster: Cluster, start: bool) -> None:
        inside.clear()
        go.clear()
        async with anyio.create_task_group() as tg:
            results: list[int] = []

            async def run_local() -> None:
                results.append(await anyio.to_thread.run_sync(local))

            tg.start_soon(run_local)
            try:
                assert await anyio.to_thread.run_sync(inside.wait, LIMIT)
                await (cluster.start() if start else cluster.close())
            finally:
                go.set()
        assert results == [1]

    with anyio.fail_after(LIMIT):
        cluster = Cluster(workers=1)
        await cluster.start()
        await local_while(cluster, start=False)  # the last cluster closes meanwhile
        cluster = Cluster(workers=1)
        await local_while(cluster, start=True)  # the first cluster starts meanwhile
        await cluster.close()
        async with Cluster(workers=1) as cluster:
            kept = await cluster.persist(chunks("while"))
            with pytest.raises(EagerComputeOnCluster):
                kept.sum().compute(scheduler="sync")
            assert await cluster.compute(kept.sum()) == 32.0


@pytest.mark.timeout(LIMIT)
def test_a_cluster_whose_event_loop_ends_unclosed_lets_go_of_the_process() -> None:
    """An audit: a cluster started (``await cluster.start()``) in an event loop that
    ended without ``close`` (``asyncio.run`` of a function that forgot it, a notebook
    kernel's loop) stayed in the process's list of running clusters for good, so it and
    its in-process workers' outputs were never freed, its client's keys were still
    checked by every dask compute of the process and its check stayed in dask's
    ``Callback.active``, and a raised gc threshold (``gc_threshold=``) was never put
    back. The end of its actors' task now lets go of all that, as ``close`` does."""
    threshold = gc.get_threshold()

    async def started() -> weakref.ref[Cluster]:
        cluster = Cluster(workers=1, gc_threshold=threshold[0] + 1000)
        await cluster.start()
        kept = await cluster.persist(chunks("unclosed"))
        await cluster.gather(futures_of(kept))
        assert _LOCAL_CHECK in dask.callbacks.Callback.active
        assert gc.get_threshold()[0] == threshold[0] + 1000
        return weakref.ref(cluster)

    cluster = asyncio.run(started())
    gc.collect()
    assert cluster() is None  # nothing holds it any more
    assert gc.get_threshold() == threshold
    assert not _LIVE_CLIENTS  # (no other cluster runs) so its check is gone too
    assert _LOCAL_CHECK not in dask.callbacks.Callback.active


def _plus(a: int, b: int = 0) -> int:
    return a + b


def _sum_values(d: dict[str, int]) -> int:
    return sum(d.values())


@pytest.mark.parametrize("processes", [False, True])
async def test_a_future_in_a_delayed_call_is_a_dependency(processes: bool) -> None:
    """``dask.delayed(f)(fut)``: dask's ``Task`` counts only its own ``TaskRef``s as
    dependencies, so such a task ran with no dependency: in a thread ``f`` got the Future
    object (``TypeError: unsupported operand type(s) for +: 'Future' and 'int'``), in a
    worker process a reference to a key it was never given (``KeyError``). Now each
    future among a delayed call's arguments (a list's, a dict's, a keyword's too) is a
    dependency and its value the argument, as with dask.distributed."""
    with anyio.fail_after(LIMIT):
        size = {"processes": 1} if processes else {"workers": 1}
        async with Cluster(**size) as cluster:  # type: ignore[arg-type]
            f, g = cluster.submit(_plus, 1), cluster.submit(_plus, 2)
            assert await cluster.compute(dask.delayed(_plus)(f, 10)) == 11
            assert await cluster.compute(dask.delayed(sum)([f, g])) == 3
            assert await cluster.compute(dask.delayed(_plus)(f, b=g)) == 3
            assert await cluster.compute(dask.delayed(_plus)(dask.delayed(_plus)(f), 1)) == 2
            # with a delayed beside it, dask makes the list or dict a List or Dict task
            beside = dask.delayed(_plus)(5)
            assert await cluster.compute(dask.delayed(sum)([f, beside])) == 6
            assert await cluster.compute(dask.delayed(_sum_values)({"f": f, "d": beside})) == 6
            # a tuple with a delayed is an inline task, tuple(List(...))
            assert await cluster.compute(dask.delayed(sum)((f, beside))) == 6
            # and dask.delayed of such a list or dict is a List or Dict node of its own
            assert await cluster.compute(dask.delayed([f, beside])) == [1, 5]
            assert await cluster.compute(dask.delayed({"f": f, "d": beside})) == {"f": 1, "d": 5}


def test_normalize_graph_keeps_no_type_of_an_argument_for_ever() -> None:
    """normalize_graph notes, per type, whether an argument of that type is a future:
    the table kept every type it was ever shown, so each class made while a program
    ran (defined in a function, a notebook cell run again) stayed in memory for good.
    It holds a bounded number of types: an early one is let go."""

    def normalized_with_a_new_class() -> weakref.ref[type]:
        cls = type("Made", (), {})
        normalize_graph({"t": Task("t", _plus, cls())})
        return weakref.ref(cls)

    first = normalized_with_a_new_class()
    gc.collect()
    assert first() is not None  # (the table holds it: what this test is about)
    for _ in range(runtime.graph.KINDS_KEPT):
        normalized_with_a_new_class()
    gc.collect()
    assert first() is None


class _MarkedFuture:
    """A scheduler's future as dask knows one: ``__dask_future__`` and a key."""

    __dask_future__ = True
    key = "elsewhere"


def test_a_list_met_while_the_type_table_starts_again_is_still_looked_into(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread's normalize_graph may empty the table of types (at KINDS_KEPT) as
    this one looks up ``list``: found missing, ``list`` was noted as no container, and
    the futures in lists went unseen (run on the Future object) until the next reset."""
    monkeypatch.setattr(runtime.graph, "_KINDS", {})  # (emptied, not refilled yet)
    for _ in range(2):
        (node,) = normalize_graph({"t": Task("t", sum, [_MarkedFuture()])}).values()
        assert node.dependencies == {"elsewhere"}
