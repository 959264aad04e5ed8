"""A key the cluster has is the same task (as in dask), and the submission that gives it
to another task is told so.

A user audit (an aiohttp service embedding Corral for many users): two users' graphs
that both named a task ``"a"``, ``{"a": (load, "sample-1")}`` and then
``{"a": (load, "sample-2")}``, silently shared the first one's result. The semantics
stay; now the scheduler core compares a submitted task with the task it knows by the
same key (``runtime.graph.node_fingerprint``, only for keys it knows already) and, once
the submission is in, says which keys named other tasks (``KeysReused``, at most
``REUSED_NAMED`` keys and a count), which the manager and the submitting client log as
a warning. The same computation submitted again (a pure ``submit`` twice, a dask
collection computed twice, a graph submitted again after a release) says nothing.

The core tests feed events to ``SchedulerState.handle`` and check the exact commands
(``make_state``, tests/helpers.py); the cluster tests run an embedded cluster, and a
manager whose clients talk to it over a connection with the codec on (``nodes``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import dask
import pytest
from dask._task_spec import Task, TaskRef

import actors.scheduler_state
from actors.scheduler_events import REUSED_NAMED, FileFacts, GraphSubmitted, KeyDone, KeysReused
from runtime import Cluster
from runtime.graph import FINGERPRINT_BYTES, build_specs, node_fingerprint
from tests.helpers import Factory, cancel, event, finish, join, make_state, nodes, run

__all__ = ["make_state"]  # the autouse fixture, used by name

LIMIT = 60


def load(sample: str) -> str:
    return f"data of {sample}"


def other(sample: str) -> str:
    return f"other {sample}"


def inc(x: int) -> int:
    return x + 1


def submitted(s: Any, graph: dict[Any, Any], wanted: tuple[Any, ...], **kw: Any) -> Any:
    """The ``GraphSubmitted`` of ``graph`` (a dask graph), as the manager builds it."""
    specs = build_specs(graph, wanted, known=lambda k: k in s.tasks)
    return event(GraphSubmitted, specs=specs, wanted=wanted, echo_to="B", **kw)


def said(cmds: list[Any]) -> list[Any]:
    """The commands, but the registry's file facts (what a want changes there)."""
    return [c for c in cmds if type(c) is not FileFacts]


# ----------------------------------------------------------------------------- the core


def test_a_key_given_to_another_task_is_said_once_the_submission_is_in(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    run(s, submitted(s, {"a": (load, "sample-1")}, ("a",)))  # A's: running on w1
    ev = submitted(s, {"a": (load, "sample-2")}, ("a",))  # B's, another task under "a"
    assert said(run(s, ev)) == [KeysReused(ev.stimulus_id, ("a",), 1, "B")]
    assert s.tasks["a"].spec.node.args == ("sample-1",)  # A's task stands (as in dask)
    # Done, the result is what B's submission gets, right after the word.
    finish(s, "w1", "a")
    ev = submitted(s, {"a": (other, "sample-1")}, ("a",))  # another function
    cmds = said(run(s, ev))
    assert cmds == [
        KeysReused(ev.stimulus_id, ("a",), 1, "B"),
        KeyDone(ev.stimulus_id, "a", "w1", 100),  # (the helper's output size)
    ]


def test_the_same_task_submitted_again_is_not_said(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    run(s, submitted(s, {"a": (load, "sample-1"), "b": (inc, "a")}, ("b",)))
    # Built again from scratch (new node objects), as a second request or client does;
    # and the very same graph dict again.
    again = {"a": (load, "sample-1"), "b": (inc, "a")}
    assert said(run(s, submitted(s, again, ("b",)))) == []
    assert said(run(s, submitted(s, again, ("b",)))) == []
    # A pure submit's node, made twice (the client's make_task), with a future's key.
    for i in range(2):
        y = Task("inc-1", inc, TaskRef("a"))
        specs = build_specs({"inc-1": y}, ["inc-1"], known=s.tasks.__contains__)
        cmds = said(run(s, event(GraphSubmitted, specs=specs, wanted=("inc-1",))))
        assert not [c for c in cmds if type(c) is KeysReused], i


def test_a_failed_or_cancelled_key_submitted_again_runs_the_new_task_unsaid(
    make_state: Factory,
) -> None:
    s = make_state()
    run(s, submitted(s, {"a": (load, "sample-1")}, ("a",)))
    cancel(s, "a")
    cmds = run(s, submitted(s, {"a": (load, "sample-2")}, ("a",)))
    assert not [c for c in cmds if type(c) is KeysReused]
    assert s.tasks["a"].spec.node.args == ("sample-2",)


def test_the_word_names_the_first_keys_and_counts_them_all_once_per_submission(
    make_state: Factory,
) -> None:
    s = make_state()
    n = REUSED_NAMED + 3
    keys = tuple(f"k-{i}" for i in range(n))
    run(s, submitted(s, {k: (load, "one") for k in keys}, keys))
    # In two pieces (continued): said once, with the last one.
    half = n // 2
    first = submitted(s, {k: (load, "two") for k in keys[:half]}, keys[:half], final=False)
    assert said(run(s, first)) == []
    last = submitted(s, {k: (load, "two") for k in keys[half:]}, keys[half:], continued=True)
    (cmd,) = said(run(s, last))
    named = tuple(k for k in s.tasks if k in cmd.keys)  # in the order the graphs gave them
    assert len(named) == REUSED_NAMED
    assert cmd == KeysReused(last.stimulus_id, cmd.keys, n, "B")


def test_comparisons_are_bounded_per_submission(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.scheduler_state, "REUSE_CHECKS", 2)
    s = make_state()
    keys = ("k-0", "k-1", "k-2", "k-3")
    run(s, submitted(s, {k: (load, "one") for k in keys}, keys))
    ev = submitted(s, {k: (load, "two") for k in keys}, keys)
    (cmd,) = said(run(s, ev))
    assert cmd == KeysReused(ev.stimulus_id, cmd.keys, 2, "B") and len(set(cmd.keys)) == 2


def test_a_task_whose_node_cannot_be_fingerprinted_counts_as_the_same(
    make_state: Factory,
) -> None:
    s = make_state()
    run(s, submitted(s, {"a": (load, "sample-1")}, ("a",)))
    lock = threading.Lock()  # does not pickle
    assert node_fingerprint(Task("a", load, lock)) is None
    assert said(run(s, submitted(s, {"a": (load, lock)}, ("a",)))) == []


def test_a_fingerprint_tells_functions_and_arguments_apart_and_not_copies() -> None:
    import cloudpickle

    def local(x: int) -> int:  # pickled by value, as a script's function is
        return x

    node = Task("a", local, 1)
    copy = cloudpickle.loads(cloudpickle.dumps(node))  # as a manager process gets it
    assert copy.func is not local and node_fingerprint(copy) == node_fingerprint(node)
    assert node_fingerprint(Task("a", local, 2)) != node_fingerprint(node)
    assert node_fingerprint(Task("a", inc, 1)) != node_fingerprint(node)
    assert node_fingerprint(Task("a", lambda x: x, 1)) != node_fingerprint(
        Task("a", lambda x: x + 1, 1)
    )


# ----------------------------------------------------------------------------- a cluster


def reused(caplog: pytest.LogCaptureFixture, logger: str = "corral.client") -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == logger and "already name other tasks" in r.getMessage()
    ]


GATE, STARTED = threading.Event(), threading.Event()


def gated(x: int) -> int:
    """Says it started, then runs until the test opens the gate."""
    STARTED.set()
    if not GATE.wait(LIMIT):
        raise TimeoutError("the gate never opened")
    return x


async def same_work_twice(c: Cluster) -> None:
    """The same computations submitted again while the cluster has their keys, each said
    nothing of: each awaits a result that comes after the word would have
    (``KeysReused`` goes before the submission's results)."""
    GATE.clear()
    STARTED.clear()
    try:
        f1 = c.submit(gated, 1)
        assert await anyio.to_thread.run_sync(STARTED.wait, LIMIT)
        f2 = c.submit(gated, 1)  # a pure submit twice, the first running: sent again
        assert f2.key == f1.key
    finally:
        GATE.set()
    assert await c.gather([f1, f2]) == [1, 1]

    def local(x: int) -> int:  # a script's function: pickled by value to a manager
        return x * 10

    x = dask.delayed(inc)(dask.delayed(local)(1))  # a dask collection computed twice
    held = await c.submit_graph(dict(x.__dask_graph__()), [x.key])  # the first held
    assert await c.compute(dict(x.__dask_graph__()), x.key) == 11
    graph: dict[Hashable, Any] = {"job-1-a": (load, "s"), "job-1-b": (inc, 1)}  # after a release
    (fa,) = await c.submit_graph(graph, ["job-1-a"])
    assert await fa == "data of s"
    fa.release()
    assert await c.compute(graph, ["job-1-a", "job-1-b"]) == ("data of s", 2)
    del held


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["embedded", "manager"])
async def test_two_users_naming_a_task_alike_get_a_warning_and_the_same_work_none(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    caplog.set_level(logging.WARNING)
    compared: list[Any] = []

    def fingerprint(node: Any) -> Any:
        compared.append(node)
        return node_fingerprint(node)

    monkeypatch.setattr(actors.scheduler_state, "node_fingerprint", fingerprint)
    with anyio.fail_after(LIMIT):
        async with _cluster(where) as c:
            await same_work_twice(c)
            assert reused(caplog) == []
            # Compared (old and new node) and found the same: the pure submit, the
            # graph after its release (its key still known) and, from another process
            # (unpickled anew: a by-value function too), the dask collection's tasks;
            # in-process those are the very node objects of the first, not compared.
            keys = [str(n.key).split("-")[0] for n in compared]
            dask_keys = [] if where == "embedded" else ["inc", "inc", "local", "local"]
            assert keys == ["gated", "gated", *dask_keys, "job", "job"]
            # The audit's two users: B gets A's result (as in dask), and is told.
            (fa,) = await c.submit_graph({"a": (load, "sample-1")}, ["a"])
            assert await fa == "data of sample-1"
            assert await c.compute({"a": (load, "sample-2")}, "a") == "data of sample-1"
            (said,) = reused(caplog)
            assert "('a')" in said and "unique prefix" in said and "submit" in said
            assert len(reused(caplog, "corral")) == 1  # and the manager, once


@asynccontextmanager
async def _cluster(where: str) -> AsyncIterator[Cluster]:
    """An embedded ``Cluster(workers=1)``, or a client of a manager over a connection
    with the codec on (what crosses is what crosses between processes)."""
    if where == "embedded":
        async with Cluster(workers=1) as c:
            yield c
        return
    async with nodes(1) as (address, _), Cluster(address) as c:
        yield c


def test_a_task_carrying_large_data_is_not_fingerprinted() -> None:
    big = b"x" * (FINGERPRINT_BYTES + 1)
    assert node_fingerprint(Task("a", load, big)) is None
    assert node_fingerprint(Task("a", load, big[:1000])) is not None
