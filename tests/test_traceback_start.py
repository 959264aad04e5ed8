"""A task's traceback starts at the task's own code, wherever it is shown.

A user audit (failures, 10) found every remote traceback (the client's, the dashboard's,
the monitoring database's) began with the frames that ran the task: the executor's
``_execute`` (``_run_job`` in a task process) and ``_run_node``, then dask's
``_task_spec.py`` ``__call__``, before the user's first frame. Now the executor leaves
those leading frames out where it catches the task's exception
(``actors.executor.from_task_code``), in thread and process execution, so everything
made from that exception after (its pickle, its traceback text) starts at the task.

The cluster test runs a real worker process (on 127.0.0.1, ports 65000-65019), every
wait bounded.
"""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path
from typing import Any

import anyio
import pytest
from dask._task_spec import Task

from actors.executor import _load_node, _run_node, from_task_code
from runtime import Cluster
from runtime.messages import MetricsReply, MetricsRequest
from tests.helpers import free_port_between, wait_until
from tests.test_monitordb import _rows

LIMIT = 60  # seconds for the whole run, a worker process's start included
PORTS = (65000, 65009)  # the manager's
WORKER_PORTS = "65010-65019"

#: what the frames that ran a task showed before it (the executor's, dask's task spec)
HARNESS = ("actors/executor.py", "_task_spec.py")


def deep_down(x: int) -> int:
    raise ValueError(f"bad input {x}")


def outer(x: int) -> int:
    return deep_down(x) + 1


async def outer_async(x: int) -> int:
    await asyncio.sleep(0)
    return deep_down(x)


def first_frame(text: str) -> str:
    """The first ``File ...`` line of a traceback's text."""
    return next(line for line in text.splitlines() if line.lstrip().startswith("File "))


def names(err: BaseException) -> list[str]:
    return [f.name for f in traceback.extract_tb(err.__traceback__)]


@pytest.mark.anyio
@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_a_tasks_traceback_starts_at_its_own_frame_for_the_client_the_dashboard_and_the_db(
    execution: str, tmp_path: Path
) -> None:
    db = tmp_path / "monitoring.db"
    pools = {
        "default": {"min_blocks": 1, "worker_port_range": WORKER_PORTS, "execution": execution}
    }
    port = free_port_between(*PORTS)
    with anyio.fail_after(LIMIT):
        async with Cluster(
            pools=pools, processes=True, port=port, monitoring=db, monitoring_interval=0.2
        ) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            err = await c.submit(outer, 1, key="outer-1").exception()
            assert isinstance(err, ValueError) and names(err) == ["outer", "deep_down"]
            text = "".join(traceback.format_exception(err))
            assert not any(h in text for h in HARNESS), text
            assert "in outer" in first_frame(text)
            with pytest.raises(ValueError, match="bad input 2") as info:
                await c.submit(outer, 2, key="outer-2")
            # the client's own frames (the await), then the task's: none that ran it
            text = "".join(traceback.format_exception(info.value))
            assert not any(h in text for h in HARNESS), text
            assert names(info.value)[-2:] == ["outer", "deep_down"]
            err = await c.submit(outer_async, 3, key="outer_async-3").exception()
            assert isinstance(err, ValueError) and names(err) == ["outer_async", "deep_down"]
            run = await wait_until(
                lambda: _rows(db, "SELECT traceback FROM tries WHERE key = 'outer-1'"),
                "the failed try in the database",
                limit=30,
            )
            metrics: MetricsReply = await c._manager.ask(MetricsRequest(details=True))
    ((stored,),) = run
    assert "in outer" in first_frame(stored), stored
    assert not any(h in stored for h in HARNESS), stored
    (group,) = [g for g in metrics.failure_groups if g.category == "outer"]
    assert "in outer" in first_frame(group.traceback), group.traceback
    assert not any(h in group.traceback for h in HARNESS), group.traceback


def test_a_traceback_with_no_frame_of_the_task_is_kept_whole() -> None:
    """An error of Corral's own (the task's pickle does not load): every frame is the
    executor's or runtime's, and none is left out (never an empty traceback)."""
    with pytest.raises(Exception) as info:
        _load_node("k", b"not a pickle", "this test")
    err = info.value
    assert err.__traceback__ is not None
    err.__traceback__ = err.__traceback__.tb_next  # as the executor's catch sees it
    before = names(err)
    assert before and before[0] == "_load_node"
    assert from_task_code(err) is err and names(err) == before


def loads_a_bad_pickle(x: int) -> None:
    _load_node("k", b"not a pickle", "the task")


@pytest.mark.parametrize(
    ("func", "kept"),
    [(outer, ["outer", "deep_down"]), (loads_a_bad_pickle, ["loads_a_bad_pickle", "_load_node"])],
)
def test_only_the_leading_frames_that_ran_the_task_are_left_out(func: Any, kept: list[str]) -> None:
    """The executor's and dask's frames before the task's are left out; a frame of
    Corral's that the task's code called (after its own) stays."""
    with pytest.raises(Exception) as info:
        _run_node(Task("k", func, 1), {})
    err = info.value
    assert err.__traceback__ is not None
    err.__traceback__ = err.__traceback__.tb_next  # as the executor's catch sees it
    assert names(err)[:2] == ["_run_node", "__call__"]
    assert names(from_task_code(err))[:2] == kept
