"""xarray's dask-backed objects on a Cluster, as dask's own scheduler computes them: a
``Dataset`` is a dask collection that is also a mapping (before, ``compute`` took it for
no collection: "got 1 argument(s) and no collection")."""

from __future__ import annotations

from typing import Any

import anyio
import dask
import dask.array as da
import pytest
import xarray as xr

from runtime import Cluster
from runtime.errors import GraphError
from runtime.graph import reject_collection

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
