"""dask code moved onto a Cluster: collections computed on memory-limited worker
processes (``Cluster.compute(x)``, ``submit_graph(x)``, ``cluster.get``) give what
dask's synchronous scheduler gives, and dask.distributed's own ``submit``/``map``
keywords are refused at the call unless the function takes them."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from runtime import Cluster
from runtime.errors import CorralError, DaskOnlyArgument, ParslOnlyArgument
from tests.helpers import free_port_between

BOUND = 60


def _array() -> Any:
    return (da.arange(4000, chunks=500).reshape(40, 100) * 2).sum(axis=0)  # 8 chunks in


def _frame() -> Any:
    pdf = pd.DataFrame({"g": [1, 2, 3, 1, 2] * 8, "v": np.arange(40.0)})
    return dd.from_pandas(pdf, npartitions=4).groupby("g").v.mean()


@pytest.mark.anyio
async def test_collections_computed_on_memory_limited_processes_are_dasks_values() -> None:
    x, g = _array(), _frame()
    (want_x, want_top), want_g = (
        dask.compute(x, x.max(), scheduler="sync"),
        g.compute(scheduler="sync"),
    )
    port = free_port_between(39000, 39999)
    with anyio.fail_after(BOUND):
        async with Cluster(processes=1, memory_per_worker="300MiB", port=port) as cluster:
            got_x = await cluster.compute(x)  # the value, not the blocks
            got_g = await cluster.compute(g)
            both = await cluster.compute(x, [x.max()])  # several, as dask.compute gives them
    assert isinstance(got_x, np.ndarray) and np.array_equal(got_x, want_x)
    pd.testing.assert_series_equal(got_g, want_g)
    assert isinstance(both, tuple) and len(both) == 2
    assert np.array_equal(both[0], want_x) and both[1] == [want_top]


@pytest.mark.anyio
async def test_submit_graph_and_a_get_bound_to_the_cluster_take_collections() -> None:
    x, g = _array(), _frame()
    want_x, want_g = x.compute(scheduler="sync"), g.compute(scheduler="sync")
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            [fx] = await cluster.submit_graph(x)
            [fg] = await cluster.submit_graph([g])
            got_x, got_g = await cluster.gather([fx, fg])
            compute = functools.partial(dask.compute, g, scheduler=cluster.get)
            (in_thread,) = await anyio.to_thread.run_sync(compute)
            persisted = await anyio.to_thread.run_sync(
                functools.partial(x.persist, scheduler=cluster.get)
            )
            with pytest.raises(CorralError, match="would block the loop"):
                dask.compute(x, scheduler=cluster.get)  # here, in the cluster's loop
    assert np.array_equal(got_x, want_x)
    pd.testing.assert_series_equal(got_g, want_g)
    pd.testing.assert_series_equal(in_thread, want_g)
    assert np.array_equal(persisted.compute(scheduler="sync"), want_x)


def inc(x: int, **kwargs: Any) -> int:
    return x + 1


def placed(x: int, workers: Any = None, fifo_timeout: Any = None) -> tuple[int, Any, Any]:
    return x, workers, fifo_timeout


@pytest.mark.anyio
async def test_dask_distributed_only_keywords_are_refused_unless_the_function_takes_them() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(DaskOnlyArgument, match=r"workers= .* pool='gpu'") as info:
                cluster.submit(inc, 1, workers=["w1"])
            assert isinstance(info.value, TypeError)
            assert (info.value.name, info.value.func) == ("workers", "inc")
            for name in ("allow_other_workers", "fifo_timeout", "actor", "actors"):
                with pytest.raises(DaskOnlyArgument, match=f"{name}= is a dask.distributed"):
                    cluster.submit(inc, 1, **{name: True})  # **kwargs takes no such name
                with pytest.raises(DaskOnlyArgument, match=f"{name}= is a dask.distributed"):
                    cluster.map(inc, [1, 2], **{name: True})
            # a function whose signature names it gets it, as any other keyword
            assert await cluster.submit(placed, 1, workers="a") == (1, "a", None)
            mapped = cluster.map(placed, [1, 2], fifo_timeout="1s")
            assert await cluster.gather(mapped) == [(1, None, "1s"), (2, None, "1s")]


def run_step(x: int, inputs: Any = None) -> tuple[int, Any]:
    return x, inputs


def step(x: int) -> int:
    return x


def wrapper(x: int, **kw: Any) -> tuple[int, dict[str, Any]]:
    return x, kw


@pytest.mark.anyio
async def test_parsl_app_keywords_are_refused_unless_the_function_takes_them() -> None:
    """A user audit (parsl): a workflow converted from Parsl that kept an app call's
    keywords, cluster.submit(step, 1, walltime=60) (or stdout=, outputs=, ...), had its
    task fail on its worker with ``TypeError: step() got an unexpected keyword argument
    'walltime'``, after it was sent; now the call is refused at once, saying what to use
    (timeout=), as dask.distributed's keywords are."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(ParslOnlyArgument, match=r"walltime= .* timeout= here") as info:
                cluster.submit(step, 1, walltime=60)
            assert isinstance(info.value, TypeError)
            assert (info.value.name, info.value.func) == ("walltime", "step")
            said = {
                "stdout": "capture_output=True",
                "stderr": "check_returncode",
                "inputs": "file output's Future",
                "outputs": r"output_path\(name\)",
                "parsl_resource_specification": r"resources=, in bytes",
            }
            for name, instead in said.items():
                with pytest.raises(ParslOnlyArgument, match=f"{name}= is a keyword of a Parsl"):
                    cluster.submit(step, 1, **{name: "x"})
                with pytest.raises(ParslOnlyArgument, match=instead):
                    cluster.map(step, [1, 2], **{name: "x"})
            # a function whose signature names it gets it, as any other keyword
            assert await cluster.submit(run_step, 1, inputs=["a"]) == (1, ["a"])
            assert await cluster.gather(cluster.map(run_step, [2], inputs="b")) == [(2, "b")]
            # and one that takes **kwargs (a wrapper handing them on, a review)
            assert await cluster.submit(wrapper, 1, stdout=-1) == (1, {"stdout": -1})
            assert await cluster.gather(cluster.map(wrapper, [2], walltime=5)) == [
                (2, {"walltime": 5})
            ]
