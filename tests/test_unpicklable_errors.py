"""A task error that cannot be pickled and loaded again still reaches its caller.

A worker in another process sends how its tries ended (``TasksDone``) pickled; an
exception that pickles but does not load again (its ``__init__`` wants other arguments
than its ``args``), or that does not load where the scheduler runs, used to make the
whole batch unreadable there: the task stayed running forever and the ok results of the
same batch were lost. Now each error travels on its own and, when it cannot, a
``RuntimeError`` that names it, says its text and carries its traceback stands for it
(``runtime.remote.pack_error``, ``wire_error``).

The cluster tests run real worker processes (``Cluster(processes=N)``); every wait is
bounded with ``anyio.fail_after`` and waits on the result itself, never sleeps.
"""

from __future__ import annotations

import pickle
from typing import Any

import anyio
import cloudpickle
import pytest

from actors.protocol import TaskResult
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import STANDS_FOR, error_name
from runtime.messages import MetricsRequest, TasksDone
from runtime.remote import PickledMsg, from_wire, pack_error, to_wire, wire_error
from tests.helpers import finish, join, submit

LIMIT = 60  # seconds for a cluster of worker processes to start
PROMPT = 20  # seconds a failed task may take to raise (it used to hang forever)
KIND = "tests.test_unpicklable_errors.MyError"


class MyError(Exception):
    """Pickles (as ``MyError("404: not found")``) but does not load again."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


class Fine(Exception):
    """A user exception that travels as itself."""


def fine() -> None:
    raise Fine("fine")


def fails() -> None:
    raise MyError(404, "not found")


def fails_after(x: int) -> int:
    raise MyError(x, "after its input")


def inc(x: int) -> int:
    return x + 1


@pytest.fixture(autouse=True)
def plain_pickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """MyError pickles as Python pickles it by default. Importing dask.distributed (other
    tests do) installs tblib's reducer for every exception class then defined, which
    makes it load again in this process: not the case this file is about."""
    import copyreg

    for cls in (MyError, Fine):
        monkeypatch.delitem(copyreg.dispatch_table, cls, raising=False)


def raised(func: Any, *args: Any) -> BaseException:
    """The exception ``func(*args)`` raises, with its traceback."""
    try:
        func(*args)
    except BaseException as exc:
        return exc
    raise AssertionError("it did not raise")


def assert_stands_for_my_error(err: BaseException, text: str = "404: not found") -> None:
    assert type(err) is RuntimeError
    assert f"the task raised {KIND}: {text}" in str(err)
    assert "Traceback (most recent call last)" in str(err)
    assert "in fails" in str(err)  # the traceback where it was raised


# ----------------------------------------------------------------------------- packing


def test_pack_error_keeps_an_error_that_loads_again() -> None:
    parts, tb = pack_error(raised(fine), "a test")
    err = pickle.loads(parts[0])
    assert type(err) is Fine and str(err) == "fine"
    assert "Fine: fine" in tb


def test_pack_error_substitutes_an_error_that_does_not_load_again() -> None:
    exc = raised(fails)
    with pytest.raises(TypeError):  # the bug's premise: it pickles, it does not load
        pickle.loads(pickle.dumps(exc))
    parts, tb = pack_error(exc, "a test")
    err = pickle.loads(parts[0])
    assert_stands_for_my_error(err)
    assert "MyError('404: not found')" in str(err)
    assert "travel back from a test" in str(err)
    assert "in fails" in tb


def test_pack_error_substitutes_an_error_that_does_not_pickle() -> None:
    exc = Fine(lambda: None)  # a lambda: plain pickle refuses it
    parts, _ = pack_error(exc, "a test", lambda obj: [memoryview(pickle.dumps(obj))])
    err = pickle.loads(parts[0])
    assert type(err) is RuntimeError
    assert f"the task raised {__name__}.Fine: " in str(err)


def test_wire_error_travels_as_itself_or_as_its_substitute() -> None:
    back = pickle.loads(cloudpickle.dumps(wire_error(raised(fine))))
    assert type(back) is Fine and str(back) == "fine"
    assert_stands_for_my_error(pickle.loads(cloudpickle.dumps(wire_error(raised(fails)))))


def test_an_error_that_does_not_load_on_the_receiving_side_becomes_its_substitute() -> None:
    # It loads where it was raised (the check passes, it travels as itself), not where
    # it is received: as if its module were not installed there.
    carrier = wire_error(raised(fine))
    loader, (payload, *facts) = carrier.__reduce__()
    assert type(loader(payload, *facts)) is Fine
    missing = payload.replace(b"tests.test_unpicklable_errors", b"tests.not_installed_anywhere_")
    assert missing != payload and len(missing) == len(payload)
    err = loader(missing, *facts)
    assert type(err) is RuntimeError
    assert f"the task raised {__name__}.Fine: fine" in str(err)
    assert "cannot be loaded in this process" in str(err)
    assert "not_installed_anywhere_" in str(err)  # why: the import that failed
    assert "in fine" in str(err)  # the traceback where it was raised


def test_tasks_done_for_the_wire_always_loads_and_keeps_ok_results() -> None:
    ok = TaskResult("ok", "ok", 1.0, 2.0, 8)
    done = TasksDone("w", (ok,))
    assert done.for_wire(wire_error) is done  # nothing to do without errors
    bad = TaskResult("bad", "error", 1.0, 2.0, error=raised(fails))
    msg = to_wire(TasksDone("w", (ok, bad)))
    assert isinstance(msg, PickledMsg)
    back = from_wire(msg, allow_pickle=True)
    assert isinstance(back, TasksDone)
    assert [r.key for r in back.results] == ["ok", "bad"]
    assert back.results[0] == ok
    assert back.results[1].outcome == "error"
    assert_stands_for_my_error(back.results[1].error)


def test_the_substitute_counts_under_the_type_it_stands_for() -> None:
    """A user audit (monitor, defect 3): a failure of such an exception was counted and
    grouped under ``RuntimeError`` (``/metrics``' cause, the failure groups, the
    monitoring database's ``cause`` and ``error_type``), though its message named its
    type. The substitute keeps that type (``stands_for``, through every pickle on its
    way), and the scheduler core counts the try under its name."""
    parts, _ = pack_error(raised(fails), "a test")
    err = pickle.loads(parts[0])
    assert_stands_for_my_error(err)
    assert getattr(err, STANDS_FOR) == KIND and error_name(err) == "MyError"
    # made in a task process, it goes on from its worker to the scheduler as itself
    onward = pickle.loads(cloudpickle.dumps(wire_error(err)))
    assert type(onward) is RuntimeError and error_name(onward) == "MyError"
    # made in the worker (a thread ran the task), and where it cannot be loaded
    assert error_name(pickle.loads(cloudpickle.dumps(wire_error(raised(fails))))) == "MyError"
    loader, (payload, *facts) = wire_error(raised(fine)).__reduce__()
    missing = payload.replace(b"tests.test_unpicklable_errors", b"tests.not_installed_anywhere_")
    assert error_name(loader(missing, *facts)) == "Fine"
    # a task's own RuntimeError, and any other error, by its type's name
    assert error_name(RuntimeError("mine")) == "RuntimeError"
    assert error_name(MyError(1, "x")) == "MyError"
    # The core: the metrics' cause, the failure group and the database's error type.
    s = SchedulerState(SchedulerConfig())
    join(s, "w1")
    submit(s, {"fails-0": []}, ["fails-0"])
    finish(s, "w1", "fails-0", "error", error=err)
    assert dict(s.metric_failures) == {("fails", "error", "MyError"): 1}
    group = s.failure_groups[("fails", "MyError")]
    assert group.n == 1 and group.error is not None
    assert group.error.summary.startswith(f"MyError: the task raised {KIND}: 404: not found")


# ----------------------------------------------------------------------------- clusters


@pytest.mark.anyio
async def test_a_task_raising_an_unpicklable_error_fails_at_once_and_the_cluster_goes_on() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as c:
            await c.wait_for_workers(2, timeout=LIMIT)
            with anyio.fail_after(PROMPT), pytest.raises(RuntimeError) as info:
                await c.submit(fails)
            assert_stands_for_my_error(info.value)
            failures = (await c._manager.ask(MetricsRequest())).failures
            assert [(f.category, f.cause, f.n) for f in failures] == [("fails", "MyError", 1)]
            # Its slot was given back and the workers still run a graph.
            dsk: dict[Any, Any] = {("inc", i): (inc, i) for i in range(20)}
            dsk["total"] = (sum, [("inc", i) for i in range(20)])
            assert await c.compute(dsk, "total") == sum(range(1, 21))
            st = await c.status()
            assert not any(st["processing"].values()), st["processing"]


@pytest.mark.anyio
async def test_an_ok_result_reported_with_an_unpicklable_error_is_not_lost() -> None:
    # One worker, one thread: both tasks become ready together when their input is
    # done, go to the worker together, run back to back and are reported together.
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, threads_per_worker=1) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            first = c.submit(inc, 1)
            ok, bad = c.submit(inc, first), c.submit(fails_after, first)
            with anyio.fail_after(PROMPT):
                err = await bad.exception()
                assert err is not None
                assert_stands_for_my_error(err, "2: after its input")
                assert await ok == 3
