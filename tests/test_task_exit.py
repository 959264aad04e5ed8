"""A task that calls ``sys.exit()`` or raises ``KeyboardInterrupt`` fails as a task.

A bad-input audit: a task calling ``sys.exit(1)`` made ``await cluster.gather(...)``
raise the bare ``SystemExit``, which ``except Exception`` lets through, so the client
program ended with status 1, printing nothing, and the other results were lost; a
task's ``KeyboardInterrupt`` looked like the user's Ctrl-C. The worker always took it
as the task's failure; the caller now raises a
:class:`~runtime.errors.TaskExited` (an ``Exception``, a ``CorralError``) whose
``__cause__`` is that exception: in process (``gather``, ``await fut``,
``fut.exception()``, ``root_errors=True``, ``compute``, ``runtime.get``) and from
worker processes.
"""

from __future__ import annotations

import operator
import pickle
import sys
from typing import Any

import anyio
import pytest

import runtime
from runtime import Cluster
from runtime.errors import CorralError, DependencyFailed, TaskExited
from tests.helpers import free_port

LIMIT = 30  # seconds (a cluster of a worker process starts within it)


class Halt(BaseException):
    """A BaseException of the user's own, not an Exception."""


def maybe_exit(i: int) -> int:
    if i == 3:
        sys.exit(1)
    return i


def interrupt() -> None:
    raise KeyboardInterrupt


def halt() -> None:
    raise Halt("stop everything")


def _exited(err: BaseException, key: Any, kind: type[BaseException]) -> TaskExited:
    assert isinstance(err, TaskExited) and isinstance(err, Exception)
    assert isinstance(err, CorralError)
    assert type(err.__cause__) is kind
    assert err.key == key
    return err


@pytest.mark.anyio
async def test_a_task_calling_sys_exit_fails_as_a_task_and_the_others_are_kept() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            futures = cluster.map(maybe_exit, range(6))
            with pytest.raises(TaskExited) as info:  # an Exception: `except Exception` holds
                await cluster.gather(futures)
            err = _exited(info.value, futures[3].key, SystemExit)
            assert (err.kind, err.code) == ("SystemExit", 1)
            text = str(err)
            assert f"task {futures[3].key!r} called sys.exit(1) (SystemExit)" in text
            assert "raise an Exception" in text and "return a value" in text
            assert "__cause__" in text
            assert [await f for f in futures if f is not futures[3]] == [0, 1, 2, 4, 5]
            assert futures[3].status == "error"
            with pytest.raises(TaskExited):  # awaited alone, too
                await futures[3]
            assert isinstance(await futures[3].exception(), TaskExited)
            # a dependent: DependencyFailed as for any failure; its root, as TaskExited
            after = cluster.submit(operator.add, futures[3], 1)
            with pytest.raises(DependencyFailed) as dep:
                await after
            assert type(dep.value.__cause__) is SystemExit
            with pytest.raises(TaskExited) as root:
                await cluster.gather([after], root_errors=True)
            _exited(root.value, futures[3].key, SystemExit)
            with pytest.raises(TaskExited) as computed:
                await cluster.compute({"x": (sys.exit, "bye")}, "x")
            assert _exited(computed.value, "x", SystemExit).code == "bye"
            assert "called sys.exit('bye')" in str(computed.value)
            assert await cluster.submit(operator.add, 2, 3) == 5  # the cluster goes on


@pytest.mark.anyio
async def test_a_tasks_keyboard_interrupt_is_not_the_users_ctrl_c() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(TaskExited) as info:
                await cluster.submit(interrupt, key="ki")
            err = _exited(info.value, "ki", KeyboardInterrupt)
            assert "raised KeyboardInterrupt (the task's own, not a Ctrl-C" in str(err)
            with pytest.raises(TaskExited) as own:
                await cluster.submit(halt, key="halt")
            err = _exited(own.value, "halt", Halt)
            assert err.kind == "tests.test_task_exit.Halt" and err.code is None
            assert "raised tests.test_task_exit.Halt: stop everything, a BaseException" in str(err)
            assert await cluster.submit(operator.neg, 1) == -1


def test_runtime_get_raises_it_too() -> None:
    """The synchronous scheduler (``dask.compute(x, scheduler=runtime.get)``)."""
    with pytest.raises(TaskExited) as info:
        runtime.get({"a": 1, "b": (sys.exit, 2)}, ["a", "b"])
    assert _exited(info.value, "b", SystemExit).code == 2


def test_it_pickles_with_its_fields() -> None:
    err = TaskExited.of(SystemExit(4), "k")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is TaskExited and str(again) == str(err)
    assert (again.key, again.kind, again.code) == ("k", "SystemExit", 4)
    assert TaskExited.of(SystemExit(object()), "k").code.startswith("<object")
    plain = ValueError("x")
    assert TaskExited.of(plain, "k") is plain  # an Exception is raised as itself


@pytest.mark.anyio
async def test_from_a_worker_process() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, port=free_port()) as cluster:
            futures = cluster.map(maybe_exit, range(5))
            with pytest.raises(TaskExited) as info:
                await cluster.gather(futures)
            assert _exited(info.value, futures[3].key, SystemExit).code == 1
            with pytest.raises(TaskExited) as ki:
                await cluster.submit(interrupt, key="ki")
            _exited(ki.value, "ki", KeyboardInterrupt)
            assert await futures[4] == 4
