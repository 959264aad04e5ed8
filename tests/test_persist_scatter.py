"""``Cluster.persist`` and ``Cluster.scatter``, dask.distributed's ``Client.persist`` and
``Client.scatter``: a persisted collection is rebuilt on the futures of its chunks, so a
collection made from it runs only its new tasks; scattered values are futures to pass
to ``submit``. Before, neither method existed.

The chunks' tasks count their runs in this process (in-process workers run them in
threads), so "did not run again" is a count, not a timing. Every test is bounded.
"""

from __future__ import annotations

import gc
import threading
from collections import Counter

import anyio
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from runtime import Cluster
from runtime.codec import MAX_FRAME_BYTES
from runtime.errors import CorralError, DaskOnlyArgument, TaskArgumentsTooLarge
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
