"""xarray's dask-backed objects on a Cluster, as dask's own scheduler computes them: a
``Dataset`` is a dask collection that is also a mapping (before, ``compute`` took it for
no collection: "got 1 argument(s) and no collection"); the finalize task of an object
made from a persisted one takes that object, whose dask data hold the persisted
futures, and runs on a worker process (before, it failed: "cannot pickle
'_asyncio.Task' object"), since a Future pickles as a reference to its key."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import anyio
import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from dask._task_spec import TaskRef

from runtime import Cluster
from runtime.errors import GraphError
from runtime.graph import futures_as_refs, reject_collection, unpicklable_error
from tests.helpers import free_port_between

pytestmark = pytest.mark.anyio

LIMIT = 30


def _cube() -> Any:
    return da.random.default_rng(0).standard_normal((20, 8, 8), chunks=(5, 8, 8))


def _dataset() -> xr.Dataset:
    x = _cube()
    return xr.Dataset({"a": (("t", "y", "x"), x), "b": (("t",), x.sum(axis=(1, 2)))})


async def test_a_dataset_is_computed_and_persisted_as_dasks_sync_scheduler_computes_it() -> None:
    ds = _dataset()
    want, want_mean = dask.compute(ds, ds.mean(), scheduler="sync")
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            xr.testing.assert_identical(await cluster.compute(ds), want)
            got, got_mean = await cluster.compute(ds, ds.mean())
            (fut,) = await cluster.submit_graph(ds)
            from_future = await fut
            kept = await cluster.persist(ds)
            assert isinstance(kept, xr.Dataset) and dask.is_dask_collection(kept)
            kept_value, kept_mean = await cluster.compute(kept, kept.mean())
    for value, expected in [
        (got, want),
        (from_future, want),
        (kept_value, want),
        (got_mean, want_mean),
        (kept_mean, want_mean),
    ]:
        xr.testing.assert_identical(value, expected)


def test_a_dataset_given_where_a_graph_belongs_is_refused_as_a_collection() -> None:
    with pytest.raises(GraphError, match="got a dask collection with keys"):
        reject_collection(_dataset())
    reject_collection({"k": 1})  # a graph: no error


async def test_a_persisted_dataarray_is_computed_on_a_worker_process() -> None:
    """The finalize task of ``p.mean()`` (and of ``p``) takes an xarray object whose dask
    graph maps ``p``'s keys to their futures: it goes to the worker process with each
    future as a reference to its key, and gives numpy's values."""
    values = np.arange(20 * 8 * 8, dtype=float).reshape(20, 8, 8)  # (sums exact)
    x = da.from_array(values, chunks=(5, 8, 8))
    port = free_port_between(53000, 53999)
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, port=port) as cluster:
            p = await cluster.persist(xr.DataArray(x, dims=("t", "y", "x")))
            futures = list(dict(p.data.__dask_graph__()).values())
            mean = await cluster.compute(p.mean())
            whole = await cluster.compute(p)
            by_time = await cluster.compute(xr.Dataset({"a": p}).mean("t"))
            assert {f.status for f in futures} == {"finished"}  # held: p lives
    assert isinstance(mean, xr.DataArray) and float(mean) == values.mean()
    assert isinstance(whole, xr.DataArray) and np.array_equal(whole.values, values)
    assert np.array_equal(by_time.a.values, values.mean(axis=0))


async def test_a_future_pickles_as_a_reference_in_a_collection_and_copies_as_itself() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            fut = cluster.submit(sum, [1, 2])
            with futures_as_refs():  # in the tasks of a collection (review 1207g F2)
                loaded = pickle.loads(pickle.dumps(fut))
            assert type(loaded) is TaskRef and loaded.key == fut.key
            with pytest.raises(TypeError, match="Pass the future as an argument"):
                pickle.dumps(fut)  # anywhere else
            assert copy.copy(fut) is fut and copy.deepcopy([fut])[0] is fut
            assert await fut == 3


def test_the_unpicklable_error_tells_what_to_do_for_a_collections_own_task() -> None:
    message = str(unpicklable_error("finalize-1", "TypeError: cannot pickle 'X' object"))
    assert "inside the task" in message  # an argument of your own
    assert "finalize step takes the collection itself" in message
    assert "Cluster(workers=N)" in message


async def test_a_dict_of_collections_is_computed_as_dask_compute_computes_it() -> None:
    """``dask.compute`` looks into dicts, sets and dataclasses as into lists: a dict of an
    analysis's results (``{"mean": ..., "std": ...}``) comes back a dict of their values
    (before, "got 1 argument(s) and no collection"), beside another collection too; a
    graph and its keys, ``compute({"k": task}, "k")``, stays a graph."""
    ds = _dataset()
    results = {"mean": ds.a.mean(), "by_t": ds.b, "n": 3, "both": [ds.a.max(), (ds.a.min(),)]}
    want, want_sum = dask.compute(results, ds.a.sum(), scheduler="sync")
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            got = await cluster.compute(results)
            got_again, got_sum = await cluster.compute(results, ds.a.sum())
            assert await cluster.compute({"k": (sum, [1, 2])}, "k") == 3
    for value in (got, got_again):
        assert type(value) is dict and value.keys() == want.keys() and value["n"] == 3
        for name in ("mean", "by_t"):
            xr.testing.assert_identical(value[name], want[name])
        assert value["both"] == want["both"]
    assert got_sum == want_sum
