"""A task's ``timeout=``: each try may execute that long on its worker, counted from
when it begins there; past it the worker stops it as a cancel stops a running try
(thread execution abandons the thread, process execution kills the task process) and
it fails with ``TaskTimeout``, a failed try that ``retries=`` applies to. A bad value
is a ``GraphError`` at the call. The worker core's part (deadlines, the timer, the
report) is tested with virtual time in test_worker_state.py.
"""

from __future__ import annotations

import logging
import math
import pickle
from pathlib import Path
from typing import Any

import anyio
import pytest
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from runtime import Cluster
from runtime.errors import GraphError, TaskTimeout
from runtime.graph import SUBMISSION, TaskOptions, build_specs, category_of
from tests.helpers import ONE_SLOT, gated_cluster, held_at_gate, log_lines, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60  # seconds a test may take (task processes start in about a second)


def hang_on_first_try(tries: str, gate: str) -> str:
    """A task body: its first try hangs (at ``gate``, which the test never opens
    while it runs); each later try returns which try it is."""
    n = len(list(Path(tries).iterdir())) + 1
    Path(tries, str(n)).touch()
    if n == 1:
        held_at_gate(gate, str(Path(tries).with_suffix(".started")))
    return f"try {n}"


@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_a_hung_task_times_out_and_its_slot_is_freed(tmp_path: Path, execution: str) -> None:
    async with gated_cluster(tmp_path, LIMIT, **ONE_SLOT[execution]) as (c, gate, started):
        # A try's time counts from when it begins executing, which in a task process
        # includes loading its function: loaded here once beforehand.
        (tmp_path / "open").touch()
        warm = c.submit(held_at_gate, str(tmp_path / "open"), str(tmp_path / "warm"))
        assert await warm == "opened"
        hung = c.submit(held_at_gate, str(gate), str(started), timeout=0.5)
        with pytest.raises(TaskTimeout) as info:
            await hung
        err = info.value
        assert (err.key, err.timeout) == (hung.key, 0.5) and err.ran >= 0.5
        assert f"task {hung.key!r} ran" in str(err) and "raise its timeout=" in str(err)
        assert started.exists() and not gate.exists()  # it hung; it was stopped
        # One thread, one slot: the next task runs while the gate is still shut.
        assert await c.submit(sum, [1, 2, 3]) == 6
        state = c.scheduler_state
        assert state.failures[category_of(hung.key)][("timeout", "timeout")] == 1
        (tried,) = state.tasks[hung.key].tries
        assert (tried.outcome, tried.cause) == ("timeout", "timeout")
        st = await c.status()
        assert st["tasks_by_state"].get("processing", 0) == 0


@pytest.mark.parametrize("how", ["submit", "submit_graph", "annotation"])
async def test_a_timed_out_try_is_retried_and_the_retry_succeeds(tmp_path: Path, how: str) -> None:
    """``timeout=`` of submit, of submit_graph, or a dask annotation; one cluster each:
    a worker abandons at most as many hung threads as it has."""
    gate, tries = tmp_path / "gate", tmp_path / "tries"
    tries.mkdir()
    graph = {"t": (hang_on_first_try, str(tries), str(gate))}
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(**ONE_SLOT["thread"]) as c:
                await c.wait_for_workers(1, timeout=60)
                if how == "submit":
                    fut = c.submit(hang_on_first_try, str(tries), str(gate), timeout=0.5, retries=1)
                    assert await fut == "try 2"
                elif how == "submit_graph":
                    (fut,) = await c.submit_graph(graph, ["t"], timeout=0.5, retries=1)
                    assert await fut == "try 2"
                else:
                    layer = MaterializedLayer(graph, annotations={"timeout": 0.5, "retries": 1})
                    hlg = HighLevelGraph({"l": layer}, {"l": set()})
                    assert await c.compute(hlg, "t") == "try 2"
                key = fut.key if how != "annotation" else "t"
                ts = c.scheduler_state.tasks[key]
                assert ts.spec.timeout == 0.5
                assert [t.outcome for t in ts.tries] == ["timeout", "ok"]
                assert any(row[1] == "retry" for row in await c.story(key))
    finally:
        gate.touch()


async def test_a_timed_out_thread_that_cannot_be_abandoned_holds_its_slot_yet_fails_at_once(
    tmp_path: Path,
) -> None:
    """Thread execution abandons at most as many threads as the worker has: a second
    hung task on a one-thread worker keeps its thread past its timeout and the worker
    logs a warning saying so, but its try fails with TaskTimeout at once all the same.
    The worker reports the slot held: the next task waits in the scheduler, and runs
    once the first abandoned thread ends (the held one is abandoned in its place)."""
    second = tmp_path / "second"
    try:
        with log_lines("corral", logging.WARNING) as log:
            async with gated_cluster(tmp_path, LIMIT, **ONE_SLOT["thread"]) as (c, gate, started):
                first = c.submit(held_at_gate, str(gate), str(started), timeout=0.5)
                with pytest.raises(TaskTimeout):
                    await first  # its thread abandoned
                stuck = c.submit(held_at_gate, str(second), str(tmp_path / "s"), timeout=0.5)
                with pytest.raises(TaskTimeout) as info:
                    await stuck  # while its task still hangs
                assert info.value.ran >= 0.5 and not second.exists()
                assert log.has("could not be stopped", stuck.key)
                (ws,) = c.scheduler_state.workers.values()
                assert ws.held == 1  # reported before the try
                nxt = c.submit(sum, [1, 2, 3])
                state = c.scheduler_state
                await wait_until(
                    lambda: nxt.key in state.tasks and state.tasks[nxt.key].state == "queued",
                    "the next task queued in the scheduler",
                    limit=30,
                    step=0.01,
                )
                gate.touch()  # the abandoned thread ends: the held one is abandoned instead
                assert await nxt == 6 and not second.exists()
    finally:
        second.touch()


BAD = [0, -1, math.nan, math.inf, "5", True, [1]]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_timeout_is_refused_naming_the_task(bad: Any) -> None:
    with pytest.raises(GraphError, match=r"task 'x' has timeout=.*; it must be a number"):
        TaskOptions.of("x", timeout=bad)
    with pytest.raises(GraphError, match="the submission has timeout="):
        build_specs({"x": (sum, [1])}, ["x"], timeout=bad)
    layer = MaterializedLayer({"x": (sum, [1])}, annotations={"timeout": bad})
    with pytest.raises(GraphError, match="task 'x' has timeout="):
        build_specs(HighLevelGraph({"l": layer}, {"l": set()}), ["x"])


def test_a_good_timeout_is_seconds_as_a_float() -> None:
    assert TaskOptions.of(SUBMISSION, timeout=2).timeout == 2.0
    assert TaskOptions.of(SUBMISSION).timeout is None
    (spec,) = build_specs({"x": (sum, [1])}, ["x"], timeout=1.5).values()
    assert spec.timeout == 1.5


async def test_a_bad_timeout_is_refused_at_the_call() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(**ONE_SLOT["thread"]) as c:
            for bad in (0, -2.0, math.nan, math.inf, "10"):
                with pytest.raises(GraphError, match="timeout="):
                    c.submit(sum, [1], key="bad-1", timeout=bad)
                with pytest.raises(GraphError, match="timeout="):
                    await c.submit_graph({"x": (sum, [1])}, ["x"], timeout=bad)
            assert not c._client_actor.pending
            assert "bad-1" not in c.scheduler_state.tasks


def test_task_timeout_pickles_with_its_fields() -> None:
    err = TaskTimeout(("x", 1), "w-1", 0.5, 0.75)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is TaskTimeout and str(back) == str(err)
    assert (back.key, back.worker, back.timeout, back.ran) == (("x", 1), "w-1", 0.5, 0.75)
