"""dask's callbacks (``dask.diagnostics.ProgressBar``, a ``dask.callbacks.Callback`` of
one's own) called by Corral's ``get``, ``cluster.get`` and ``compute`` from the
scheduler's counts of the run's tasks (runtime/progress.py): counts that rise as the
tasks end, on an in-process cluster and on worker processes, and ``finish`` on errors."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import dask
import pytest
from dask.callbacks import Callback
from dask.diagnostics import ProgressBar

import runtime
from actors.scheduler_state import MAX_PROGRESS_RUNS
from runtime import Cluster
from runtime.graph import TaskOptions
from runtime.progress import Counted
from tests.helpers import Cli, log_lines, wait_until

LIMIT = 60


class Record(Callback):
    """What the hooks were called with: each call as a tuple, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def _add(self, *call: Any) -> None:
        with self.lock:
            self.calls.append(call)

    def _start(self, dsk: Any) -> None:
        self._add("start")

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        self._add("start_state", len(state["finished"]))

    def _pretask(self, key: Any, dsk: Any, state: dict[str, Any]) -> None:
        self._add("pretask", key)

    def _posttask(
        self, key: Any, result: Any, dsk: Any, state: dict[str, Any], worker: Any
    ) -> None:
        rest = len(state["waiting"]) + len(state["ready"]) + len(state["running"])
        self._add("posttask", key, len(state["finished"]), rest, worker)

    def _finish(self, dsk: Any, state: dict[str, Any], errored: bool) -> None:
        self._add("finish", errored, len(state["finished"]))

    def finished(self) -> list[Any]:
        with self.lock:
            return [c[1] for c in self.calls if c[0] == "posttask"]


def gated(i: int, gate: str) -> int:
    """Wait (bounded) for the file ``gate``, then return ``i``."""
    deadline = time.monotonic() + LIMIT
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return i


def fails(i: int) -> int:
    raise ValueError(f"task {i} fails")


def square(i: int) -> int:
    return i * i


def _named(i: int) -> Any:
    return f"part-{i}"


async def _one_by_one(cluster: Cluster, tmp_path: Path, name: Any = _named) -> None:
    """Four tasks (keys ``name(i)``), each let go in turn: after each, the Record's
    counts and the bar show it (and no more) ended, until the compute returns their
    values."""
    gates = [tmp_path / f"gate-{i}" for i in range(4)]
    parts = [dask.delayed(gated)(i, str(g), dask_key_name=name(i)) for i, g in enumerate(gates)]
    rec, out = Record(), io.StringIO()
    results: list[Any] = []

    def compute() -> None:
        with ProgressBar(out=out, dt=0.05), rec:
            results.extend(dask.compute(*parts, scheduler=cluster.get))

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, compute)
        await wait_until(lambda: rec.calls, "start")
        for n, gate in enumerate(gates, 1):
            gate.touch()
            await wait_until(lambda n=n: len(rec.finished()) == n, f"{n} tasks told ended")
            assert rec.finished()[-1] == name(n - 1)
            if n < 4:  # the bar shows it: n of 4 ended (drawn while some are left)
                pct = f"| {n * 25}% Completed"
                await wait_until(lambda pct=pct: pct in out.getvalue(), pct)
    assert results == [0, 1, 2, 3]
    assert rec.calls[:2] == [("start",), ("start_state", 0)]
    posts = [c for c in rec.calls if c[0] == "posttask"]
    assert [(c[1], c[2], c[3]) for c in posts] == [(name(i), i + 1, 3 - i) for i in range(4)]
    assert all(isinstance(c[4], str) and c[4] for c in posts)  # the worker it ran on
    pres = [c for c in rec.calls if c[0] == "pretask"]
    assert [c[1] for c in pres] == [name(i) for i in range(4)]
    assert rec.calls[-1] == ("finish", False, 4)
    assert out.getvalue().split("\r")[-1].startswith("[" + "#" * 40 + "] | 100% Completed")


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_rises_task_by_task_in_process(tmp_path: Path) -> None:
    async with Cluster(workers=1, threads_per_worker=4) as cluster:
        await _one_by_one(cluster, tmp_path)


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_rises_task_by_task_on_worker_processes(tmp_path: Path) -> None:
    async with Cluster(processes=2, threads_per_worker=2) as cluster:
        await _one_by_one(cluster, tmp_path)


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_rises_task_by_task_through_a_manager_process(tmp_path: Path) -> None:
    """A manager and workers in processes of their own: the counts and the keys that
    ended cross the connection (tuple keys arrive as tuples)."""
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager()
        for _ in range(2):
            cli.worker(address, "--cores", "2")
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(2)
            await _one_by_one(cluster, tmp_path, lambda i: ("part", i))


@pytest.mark.timeout(LIMIT)
def test_runtime_get_tells_each_task_of_the_graph_once() -> None:
    """``runtime.get`` (a cluster of its own): every task of the graph, the ones the
    client did not ask for among them, is told ended once, and the bar ends at 100%."""
    parts = [dask.delayed(square)(i, dask_key_name=f"sq-{i}") for i in range(10)]
    total = dask.delayed(sum)(parts, dask_key_name="total")
    rec, out = Record(), io.StringIO()
    with ProgressBar(out=out), rec:
        (value,) = dask.compute(total, scheduler=runtime.get)
    assert value == sum(i * i for i in range(10))
    assert sorted(rec.finished()) == sorted([f"sq-{i}" for i in range(10)] + ["total"])
    assert rec.calls[-1] == ("finish", False, 11)
    assert out.getvalue().split("\r")[-1].startswith("[" + "#" * 40 + "] | 100% Completed")
    assert not Callback.active  # the callbacks left with their `with`


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_an_error_calls_finish_errored_and_raises_the_task_error() -> None:
    bad = dask.delayed(fails)(3, dask_key_name="bad")
    after = dask.delayed(square)(bad, dask_key_name="after")
    good = dask.delayed(square)(2, dask_key_name="good")
    rec, out = Record(), io.StringIO()
    async with Cluster(workers=1) as cluster:
        with ProgressBar(out=out), rec, pytest.raises(ValueError, match="task 3 fails"):
            await cluster.compute(after, good)
    finishes = [c for c in rec.calls if c[0] == "finish"]
    assert finishes == [("finish", True, finishes[0][2])]
    assert "bad" in rec.finished()
    assert "100%" not in out.getvalue()  # an errored bar is not drawn full


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_without_callbacks_nothing_is_counted() -> None:
    async with Cluster(workers=1) as cluster:
        assert await cluster.compute(dask.delayed(square)(3)) == 9
        assert not _scheduler_state(cluster).progress  # no run was counted


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_a_counted_run_is_let_go_once_computed() -> None:
    async with Cluster(workers=1) as cluster:
        with Record():
            assert await cluster.compute(dask.delayed(square)(4)) == 16
        state = _scheduler_state(cluster)
        assert not state.progress
        assert not state._tracked


def _scheduler_state(cluster: Cluster) -> Any:
    return cluster._scheduler_actor.state


def test_the_counts_of_tasks_under_way_refuse_to_be_iterated() -> None:
    counted = Counted("running")
    counted.n = 3
    assert len(counted) == 3
    with pytest.raises(TypeError, match=r"state\['running'\] of a Corral compute is a count"):
        list(counted)
    with pytest.raises(TypeError, match="state\\['finished'\\] holds the keys"):
        _ = "x" in counted


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_a_compute_whose_counts_are_let_go_says_so_and_still_returns(
    tmp_path: Path,
) -> None:
    """The scheduler counts at most MAX_PROGRESS_RUNS runs at once: as many more
    submitted to be counted (as other clients' computes under callbacks are), none of
    them ended, let the compute's counts go. Its client says so (before, its bar froze
    without a word) and the compute still returns its values."""
    gate = tmp_path / "gate"
    quick = dask.delayed(square)(3, dask_key_name="quick")
    held = dask.delayed(gated)(0, str(gate), dask_key_name="held")
    rec = Record()
    async with Cluster(workers=1, threads_per_worker=2) as cluster:
        state = _scheduler_state(cluster)
        with log_lines("corral", logging.WARNING) as logs:
            with rec:
                first = asyncio.ensure_future(cluster.compute(quick, held))
                # its client had counts: "quick" was told ended
                await wait_until(lambda: rec.finished() == ["quick"], "quick told", limit=20)
            (run,) = state.progress
            for i in range(MAX_PROGRESS_RUNS):  # counted runs of their own, under way
                key = f"other-{i}"
                cluster._client_actor.watch(key).holders += 1  # (held, as compute holds)
                await cluster._submit({key: (gated, i, str(gate))}, [key], TaskOptions(),
                                      progress=True)  # fmt: skip
            told = lambda: logs.with_("progress no longer counted")  # noqa: E731
            said = await wait_until(told, "the let-go said", limit=20)
            gate.touch()
            assert await first == (9, 0)
    assert run in said and f"at most {MAX_PROGRESS_RUNS} computes at once" in said, said
    assert rec.finished() == ["quick"]  # told nothing after its counts were let go
    assert [c[:2] for c in rec.calls if c[0] == "finish"] == [("finish", False)]
    assert len([ln for ln in logs.lines if "progress no longer counted" in ln]) == 1


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_a_compute_followed_to_its_end_says_nothing_of_a_let_go(
    tmp_path: Path,
) -> None:
    """A compute whose counts were never let go says no 'progress no longer counted'
    (an ask answered None before the scheduler took its graph in, behind another
    graph's pieces, is not a let-go either: the client says it only once it had counts,
    or when its last ask finds none); its tasks are each told."""
    gate = tmp_path / "gate"
    parts = [dask.delayed(gated)(i, str(gate), dask_key_name=f"p-{i}") for i in range(2)]
    rec = Record()
    async with Cluster(workers=1, threads_per_worker=2) as cluster:
        with log_lines("corral", logging.WARNING) as logs, rec:
            compute = asyncio.ensure_future(cluster.compute(*parts))
            await wait_until(lambda: _scheduler_state(cluster).progress, "counted")
            gate.touch()
            assert await compute == (0, 1)
    assert sorted(rec.finished()) == ["p-0", "p-1"]
    assert not logs.has("progress no longer counted"), logs.lines


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_a_callback_whose_with_ends_during_a_compute_is_not_put_back(
    tmp_path: Path,
) -> None:
    """A ``with`` of a callback that ends while a compute on the cluster still awaits
    its tasks unregisters it for good, and one entered meanwhile stays registered: the
    compute takes the callbacks for its run as dask's ``local_callbacks`` does, but
    puts back the set as it stands when it ends. Before, the taken set came back whole,
    so the first stayed in ``Callback.active`` for ever (every later dask compute in
    the process called it) and the second was gone."""
    gate = tmp_path / "gate"
    left, entered = Record(), Record()
    async with Cluster(workers=1) as cluster:
        with left:
            computing = asyncio.ensure_future(
                cluster.compute(dask.delayed(gated)(0, str(gate), dask_key_name="held"))
            )
            await wait_until(lambda: left.calls[:1] == [("start",)], "the compute started")
        entered.__enter__()
        try:
            gate.touch()
            assert await computing == 0
            active = set(Callback.active)
            assert left._callback not in active
            assert entered._callback in active
        finally:
            entered.__exit__(None, None, None)
    assert entered._callback not in Callback.active
