"""dask dataframe shuffles through ``runtime.get`` (docs/api.md#dask-shuffles).

Without a dask.distributed client, dask lowers a merge, a groupby-shuffle or a set_index
to its disk shuffle (partd), whose tasks append rows to a directory outside their
outputs: a task run again (a lost worker's, a speculative copy) appended its rows twice,
and the answer came back wrong with no error (audit mleng, defect 1). Corral runs the
task shuffle instead when the method is unset, and refuses a disk or p2p shuffle asked
for (or found in a graph) with ``ShuffleMethodError`` before any task runs.
"""

from __future__ import annotations

import graphlib
from pathlib import Path
from typing import Any

import dask
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import runtime
from runtime.errors import ShuffleMethodError
from runtime.graph import build_specs
from tests.helpers import captured

pytestmark = pytest.mark.timeout(60)

N, ROWS = 4, 1000
METHOD = "dataframe.shuffle.method"
#: The categories of dask's disk shuffle's tasks.
DISK = {"zpartd", "shuffle-partition", "barrier", "diskshuffle"}


def _part(i: int, marks: str | None = None) -> pd.DataFrame:
    if marks is not None:
        (Path(marks) / f"part-{i}").touch()
    rng = np.random.default_rng(i)
    index = pd.RangeIndex(i * ROWS, (i + 1) * ROWS)
    return pd.DataFrame({"k": rng.integers(0, 100, ROWS), "v": np.ones(ROWS)}, index=index)


def _users(i: int) -> pd.DataFrame:
    return pd.DataFrame({"k": np.arange(i * 25, i * 25 + 25), "g": i})


def _merged(marks: str | None = None) -> Any:
    """Rows per group ``g`` of the N * ROWS events joined with their users."""
    events = dd.from_map(_part, range(N), marks=marks)
    return events.merge(dd.from_map(_users, range(4)), on="k").groupby("g").v.sum()


def _mod3(x: int) -> int:
    return x % 3


def _expected() -> pd.Series:
    events = pd.concat([_part(i) for i in range(N)])
    users = pd.concat([_users(i) for i in range(4)])
    return events.merge(users, on="k").groupby("g").v.sum()


def test_a_merge_with_the_method_unset_runs_as_the_task_shuffle() -> None:
    """What ``dask.compute`` hands ``runtime.get`` is lowered to the disk shuffle (the
    method is unset, no distributed client); the tasks Corral makes are the task
    shuffle's, and the keys asked for are there."""
    assert dask.config.get(METHOD, None) is None
    expr, keys = captured(_merged())
    wanted = list(dask.core.flatten(keys))
    specs = build_specs(expr, wanted)
    categories = {s.category for s in specs.values()}
    assert {"split-taskshuffle", "group-taskshuffle"} <= categories, categories
    assert not categories & DISK, categories
    assert all(k in specs for k in wanted)
    assert dask.config.get(METHOD, None) is None  # set for the lowering only


def test_a_merge_through_runtime_get_gives_dasks_answer() -> None:
    (got,) = dask.compute(_merged(), scheduler=runtime.get, num_workers=2)
    pd.testing.assert_series_equal(got.sort_index(), _expected().sort_index())
    assert dask.config.get(METHOD, None) is None


def test_a_finished_shuffle_task_run_again_adds_no_rows() -> None:
    """Each task of the graph Corral runs is run a second time once it has finished, as
    a retry after a lost worker or a speculative copy runs it (its first output kept):
    the disk shuffle's tasks appended their rows again, the task shuffle's are pure."""
    expr, keys = captured(_merged())
    wanted = list(dask.core.flatten(keys))
    specs = build_specs(expr, wanted)
    done: dict[Any, Any] = {}
    for key in graphlib.TopologicalSorter({k: s.deps for k, s in specs.items()}).static_order():
        node = specs[key].node
        inputs = {d: done[d] for d in specs[key].deps}
        done[key] = node(inputs)
        node(inputs)  # run again; its output is dropped, its side effects are not
    (got,) = [done[k] for k in wanted]
    assert got.sum() == N * ROWS
    pd.testing.assert_series_equal(got.sort_index(), _expected().sort_index())


@pytest.mark.parametrize("method", ["disk", "p2p"])
def test_a_method_corral_cannot_run_is_refused_before_any_task_runs(
    method: str, tmp_path: Path
) -> None:
    merged = _merged(str(tmp_path))
    made = sorted(tmp_path.iterdir())  # dask calls _part(0) for the frame's columns
    with dask.config.set({METHOD: method}), pytest.raises(ShuffleMethodError) as caught:
        dask.compute(merged, scheduler=runtime.get, num_workers=2)
    err = caught.value
    assert err.method == method
    assert f"dask.config's {METHOD} is {method!r}" in str(err)
    assert "dask.config.set({'dataframe.shuffle.method': 'tasks'})" in str(err)
    if method == "disk":
        assert "a speculative copy" in str(err) and "do not share" in str(err)
    assert sorted(tmp_path.iterdir()) == made  # no part ran


def test_a_graph_with_disk_shuffle_tasks_is_refused(tmp_path: Path) -> None:
    """A graph dask made with the disk shuffle, as a dict (a dataframe's graph, lowered
    in the client) or in a bag's groupby, is refused by its tasks."""
    merged = _merged(str(tmp_path))
    graph = dict(merged.__dask_graph__())
    made = sorted(tmp_path.iterdir())
    keys = merged.__dask_keys__()
    assert {dask.utils.key_split(k) for k in graph} & DISK
    with pytest.raises(ShuffleMethodError, match=r"disk shuffle \(task ") as caught:
        runtime.get(graph, keys, num_workers=2)
    assert caught.value.method == "disk"
    assert sorted(tmp_path.iterdir()) == made  # no part ran
    items = db.from_sequence(range(10), npartitions=3)
    with pytest.raises(ShuffleMethodError, match=r"disk shuffle \(task "):
        items.groupby(_mod3).compute(scheduler=runtime.get, num_workers=1)
    # the advice works: the task shuffle
    groups = items.groupby(_mod3, shuffle="tasks").compute(scheduler=runtime.get, num_workers=1)
    assert sorted((k, sorted(v)) for k, v in groups) == [
        (0, [0, 3, 6, 9]), (1, [1, 4, 7]), (2, [2, 5, 8]),
    ]  # fmt: skip
