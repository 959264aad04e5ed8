"""``dask.annotate`` through dask's graph optimization (``dask.compute``'s default
``optimize_graph=True``): the annotations apply to the tasks that carry out the annotated
work, however dask fused them (array blockwise fusion, bag and delayed linear fusion).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest

import runtime
from runtime.errors import GraphError
from runtime.graph import build_specs
from tests.helpers import Cli, captured, log_lines

pytestmark = pytest.mark.timeout(60)


class FirstTryFails:
    """A function that fails the first call for each value of ``key(args)``."""

    def __init__(self, fn: Any, key: Any) -> None:
        self.fn, self.key = fn, key
        self.lock = threading.Lock()
        self.calls: dict[Any, int] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        which = self.key(*args, **kwargs)
        with self.lock:
            self.calls[which] = n = self.calls.get(which, 0) + 1
        if n == 1:
            raise RuntimeError(f"first try of {which} fails")
        return self.fn(*args, **kwargs)


def _block(b: Any, block_info: Any = None) -> int:
    return int(block_info[0]["chunk-location"][0])


def test_array_retries_annotation_survives_blockwise_fusion() -> None:
    # map_blocks is fused with ones_like and sum's chunk step into one task per block
    flaky = FirstTryFails(lambda b, block_info=None: b + 1, _block)

    def block_fn(b: Any, block_info: Any = None) -> Any:  # map_blocks reads the signature
        return flaky(b, block_info=block_info)

    x = da.ones((400,), chunks=100)
    with dask.annotate(retries=1):
        y = x.map_blocks(block_fn, dtype=float)
    (got,) = dask.compute(y.sum(), scheduler=runtime.get, num_workers=2)
    assert got == 800.0
    assert flaky.calls == {0: 2, 1: 2, 2: 2, 3: 2}


def test_array_resources_annotation_no_worker_has_is_refused() -> None:
    x = da.ones((200, 200), chunks=100)
    with dask.annotate(resources={"gpu": 1}):
        g = x * 5
    with pytest.raises(GraphError, match=r"resources \['gpu'\], which no worker announces"):
        dask.compute(g.sum(), scheduler=runtime.get, num_workers=1)


def test_array_priority_annotation_reaches_the_fused_tasks_specs() -> None:
    x = da.ones((400,), chunks=100)
    with dask.annotate(priority=7):
        y = x + 1
    expr, keys = captured((y * 2).sum())
    specs = build_specs(expr, list(dask.core.flatten(keys)))
    high = [s for s in specs.values() if s.priority == 7]
    assert len(high) == 4, {k: s.priority for k, s in specs.items()}  # one per block
    for s in high:  # the tasks that compute the blocks of y (fused with their readers)
        assert s.category.startswith("sum"), s.key


def test_bag_retries_annotation_survives_linear_fusion() -> None:
    flaky = FirstTryFails(lambda v: v * 10, lambda v: v)
    b = db.from_sequence(range(6), npartitions=6)
    with dask.annotate(retries=1):
        c = b.map(flaky)
    (got,) = dask.compute(c.sum(), scheduler=runtime.get, num_workers=2)
    assert got == 150
    assert flaky.calls == dict.fromkeys(range(6), 2)


def test_fused_tasks_of_different_pools_are_refused() -> None:
    b = db.from_sequence(range(4), npartitions=2)
    with dask.annotate(pool="a"):
        c = b.map(lambda v: v + 1)
    with dask.annotate(pool="b"):
        d = c.map(lambda v: v * 2)
    with pytest.raises(GraphError, match=r"different pools \('a', 'b'\).*optimize_graph=False"):
        dask.compute(d.sum(), scheduler=runtime.get, num_workers=1)


def test_delayed_linear_fusion_keeps_retries_and_says_what_a_timeout_bounds() -> None:
    flaky = FirstTryFails(lambda v: v + 1, lambda v: "one")

    @dask.delayed(pure=False)
    def start() -> int:
        return 1

    with dask.annotate(retries=1):
        mid = dask.delayed(flaky, pure=False)(start())
    with dask.config.set({"optimization.fuse.delayed": True}):
        (got,) = dask.compute(dask.delayed(int, pure=False)(mid), scheduler=runtime.get)
        assert got == 2 and flaky.calls == {"one": 2}

        with dask.annotate(timeout=30):
            slow = dask.delayed(np.negative, pure=False)(start())
        expr, keys = captured(dask.delayed(int, pure=False)(slow))
        notes: list[str] = []
        specs = build_specs(expr, list(dask.core.flatten(keys)), notes=notes)
    assert [s.timeout for s in specs.values() if s.timeout] == [30.0]
    assert any("timeout=" in n and "optimize_graph=False" in n for n in notes), notes


def test_unannotated_and_delayed_graphs_compute_as_before() -> None:
    counter = FirstTryFails(lambda: 5, lambda: "d")
    with dask.annotate(retries=1):
        d = dask.delayed(counter, pure=False)()
    x = da.arange(10, chunks=5)
    got = dask.compute(d, (x * 2).sum(), scheduler=runtime.get, num_workers=2)
    assert got == (5, 90)


def test_the_client_is_told_what_a_fused_timeout_bounds() -> None:
    b = db.from_sequence(range(4), npartitions=2)
    with dask.annotate(timeout=30):
        c = b.map(lambda v: v + 1)
    with log_lines("corral.client", logging.WARNING) as log:
        (got,) = dask.compute(c.sum(), scheduler=runtime.get, num_workers=1)
    assert got == 10
    line = log.with_("fused tasks, some with timeout=", "optimize_graph=False")
    assert line is not None and "from_sequence-lambda-sum-part" in line, log.lines


def _first_try_fails_on_disk(b: Any, marks: str = "", block_info: Any = None) -> Any:
    """A block function failing its first try per block, counted in files (the worker
    runs it in another process)."""
    i = block_info[0]["chunk-location"][0]
    mark = Path(marks) / f"block-{i}"
    tries = len(list(Path(marks).glob(f"block-{i}*")))
    Path(f"{mark}-{tries}").touch()
    if tries == 0:
        raise RuntimeError(f"first try of block {i} fails")
    return b + 1


@pytest.mark.timeout(120)
def test_a_manager_elsewhere_honours_array_annotations(tmp_path: Path) -> None:
    # the expression is pickled to the manager, which optimizes it there
    marks = tmp_path / "marks"
    marks.mkdir()
    x = da.ones((400,), chunks=100)
    with dask.annotate(retries=1):
        y = x.map_blocks(_first_try_fails_on_disk, marks=str(marks), dtype=float)
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager("--no-monitoring")
        cli.worker(address, "--cores", "2")
        (got,) = dask.compute(y.sum(), scheduler=runtime.get, address=address)
    assert got == 800.0
    assert sorted(p.name for p in marks.iterdir()) == [
        f"block-{i}-{t}" for i in range(4) for t in range(2)
    ]
