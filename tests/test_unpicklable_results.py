"""A task output that cannot be pickled (a lock, a DB connection, a file handle) and
must leave its worker's process fails what needed it, at once, with
:class:`ResultNotPicklable` naming that task; nothing else on either worker is lost.

It used to hang: the holder's reply to a peer's ``GetData`` failed as it was pickled,
the fetching worker's helper task raised, and the kernel restarted the worker actor,
whose default restart (``on_stop``, ``on_start``) dropped every output it held without
a word to the scheduler, while the task waiting for the input stayed ``processing`` for
ever. A remote client gathering such an output got a bare ``TypeError`` naming no task.

The worker actors in-process (gated on their messages), then real processes: a manager,
two worker processes in two pools (so producer and consumer are on different workers)
and a remote client over websockets on 127.0.0.1. Every wait is bounded; none sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.protocol import ToRun
from actors.worker import Worker
from runtime import Cluster
from runtime.errors import DependencyFailed, ResultNotPicklable
from runtime.graph import Task, TaskRef
from runtime.kernel import Actor, ActorSystem, handles
from runtime.messages import DataReply, GetData, OutputUnpicklable, RunTasks
from tests.helpers import Cli, SchedulerRecorder

pytestmark = pytest.mark.anyio

LIMIT = 90  # seconds for a test with processes to start (a busy machine is slow)
PROMPT = 20  # seconds a consumer may take to fail (it used to hang for ever)
UNIT = 30  # seconds for a test of in-process actors


def open_conn() -> threading.Lock:
    return threading.Lock()  # stands for a DB connection or a file handle


def use(conn: Any) -> int:
    return 1


def inc(x: int) -> int:
    return x + 1


def make(log: str, i: int) -> list[int]:
    with open(log, "a") as f:
        f.write(f"{i}\n")
    return [i] * 100


def runs(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


# ----------------------------------------------------------------------------- in-process


def task(key: str, func: Callable[..., Any], *args: Any, holder: str = "w1") -> ToRun:
    deps = tuple((a.key, (holder,)) for a in args if isinstance(a, TaskRef))
    return ToRun(key, Task(key, func, *args), key.split("-")[0], deps)


@asynccontextmanager
async def workers(
    tmp_path: Path, peers: dict[str, Any] | None = None
) -> AsyncIterator[tuple[dict[str, Worker], dict[str, Any], SchedulerRecorder]]:
    """Worker actors w1 and w2 in this process, reporting to a recorder; ``peers``:
    more actors the workers reach by id."""
    sched = SchedulerRecorder()
    refs: dict[str, Any] = dict(peers or {})
    made: dict[str, Worker] = {}
    async with ActorSystem() as system:
        sref = await system.spawn(sched, "scheduler")
        for wid in ("w1", "w2"):
            made[wid] = Worker(wid, sref, refs.get, memory_options={"spill_dir": str(tmp_path)})
            refs[wid] = await system.spawn(made[wid], wid)
        for name, actor in (peers or {}).items():
            refs[name] = await system.spawn(actor, name)
        yield made, refs, sched


async def test_the_holder_names_the_output_that_does_not_pickle(tmp_path: Path) -> None:
    """What another process asks for is serialized in the handler (``stream_over=1``,
    ``raw``): an output that does not pickle raises ResultNotPicklable naming its key,
    and the streams opened for the others in the same reply are closed."""
    with anyio.fail_after(UNIT):
        async with workers(tmp_path) as (made, refs, sched):
            refs["w1"].post(RunTasks((task("conn-0", open_conn), task("data-0", inc, 1))))
            await sched.until(lambda: {"conn-0", "data-0"} <= sched.done.keys())
            with pytest.raises(ResultNotPicklable) as info:
                await refs["w1"].ask(GetData(("data-0", "conn-0"), stream_over=1, files=True))
            err = info.value
            assert err.key == "conn-0" and err.worker == "w1"
            assert err.reason == "TypeError: cannot pickle '_thread.lock' object"
            assert "Return a value that pickles" in str(err)
            assert isinstance(err, TypeError)  # what pickling it raised before
            assert len(made["w1"].streams) == 0  # data-0's stream was closed
            with pytest.raises(ResultNotPicklable) as info:  # a remote client's gather
                await refs["w1"].ask(GetData(("conn-0",), raw=True))
            assert info.value.key == "conn-0" and "client" in info.value.to

            # The scheduler is told each time, to record the task's failure (user
            # audit failures, 7: it never heard of it).
            def told() -> list[Any]:
                return [m for m in sched.messages if isinstance(m, OutputUnpicklable)]

            await sched.until(lambda: len(told()) == 2)
            assert told() == [
                OutputUnpicklable("w1", "conn-0", err.reason, "another process"),
                OutputUnpicklable("w1", "conn-0", err.reason, "a client (through the manager)"),
            ]
            # Both stay: the output is the task's, fine where it is.
            reply: DataReply = await refs["w1"].ask(GetData(("data-0", "conn-0")))
            assert reply.data["data-0"] == 2 and not reply.missing


async def test_a_failed_message_restarts_a_worker_without_losing_its_outputs(
    tmp_path: Path,
) -> None:
    """The kernel's rule 2 on a worker: a told message or helper task that fails loses
    that message only. The default restart (``on_stop``, ``on_start``) closed the store:
    every output held was gone, and the scheduler was not told."""
    with anyio.fail_after(UNIT):
        async with workers(tmp_path) as (made, refs, sched):
            w1 = made["w1"]
            refs["w1"].post(RunTasks((task("keep-0", inc, 41),)))
            await sched.until(lambda: "keep-0" in sched.done)
            failed = anyio.Event()

            async def on_failure(error: BaseException, msg: Any) -> None:
                failed.set()

            async def helper() -> None:
                raise RuntimeError("a helper task's bug")

            w1.on_failure = on_failure  # type: ignore[method-assign]
            w1.start_soon(helper)
            await failed.wait()  # the restart runs before the next message
            reply: DataReply = await refs["w1"].ask(GetData(("keep-0",)))
            assert reply.data == {"keep-0": 42} and not reply.missing
            refs["w1"].post(RunTasks((task("next-0", inc, TaskRef("keep-0")),)))
            res = await sched.result("next-0")
            assert res.outcome == "ok"
            reply = await refs["w1"].ask(GetData(("next-0",)))
            assert reply.data == {"next-0": 43}


class Broken(Actor):
    """A peer whose GetData handler fails with an error nobody expects."""

    @handles(GetData)
    def get_data(self, msg: GetData) -> DataReply:
        raise RuntimeError("the holder's handler broke")


async def test_an_unexpected_fetch_failure_is_the_fetchs_not_the_workers(tmp_path: Path) -> None:
    """Any error of a fetch answers the core (the next holder, else ``missing``: the
    scheduler makes the input again). Raised on, it restarted the worker and the task
    waiting for the input never ended."""
    with anyio.fail_after(UNIT):
        async with workers(tmp_path, {"broken": Broken()}) as (_, refs, sched):
            refs["w2"].post(RunTasks((task("keep-0", inc, 1),)))
            await sched.until(lambda: "keep-0" in sched.done)
            refs["w2"].post(RunTasks((task("need-0", inc, TaskRef("x-0"), holder="broken"),)))
            res = await sched.result("need-0")
            assert res.outcome == "missing" and res.missing == (("x-0", "broken"),)
            reply: DataReply = await refs["w2"].ask(GetData(("keep-0",)))
            assert reply.data == {"keep-0": 2}


# ----------------------------------------------------------------------------- processes


async def test_a_consumer_on_another_worker_process_fails_at_once_naming_the_producer(
    tmp_path: Path,
) -> None:
    log = tmp_path / "runs"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await anyio.to_thread.run_sync(cli.manager)
        for pool in ("a", "b"):
            await anyio.to_thread.run_sync(cli.worker, address, "--pool", pool, "--name", pool)
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            held = [c.submit(make, str(log), i, pool="ab"[i % 2], pure=False) for i in range(8)]
            assert await c.gather(held) == [[i] * 100 for i in range(8)]
            assert runs(log) == 8

            conn = c.submit(open_conn, pool="a", pure=False)
            consumer = c.submit(use, conn, pool="b", pure=False)
            after = c.submit(inc, consumer, pool="b", pure=False)
            with anyio.fail_after(PROMPT), pytest.raises(ResultNotPicklable) as info:
                await consumer
            err = info.value
            assert err.key == conn.key and err.worker == "a"
            assert "cannot pickle '_thread.lock' object" in err.reason
            assert err.to.startswith("worker 'b'")
            assert repr(conn.key) in str(err) and "Return a value that pickles" in str(err)
            with anyio.fail_after(PROMPT), pytest.raises(DependencyFailed):
                await after

            # Nothing either worker held was lost: no make() ran again.
            assert await c.gather(held) == [[i] * 100 for i in range(8)]
            assert runs(log) == 8

            # Gathered to this (remote) client: the same error, naming the task.
            with anyio.fail_after(PROMPT), pytest.raises(ResultNotPicklable) as info:
                await conn
            assert info.value.key == conn.key and "client" in info.value.to
            assert await c.submit(inc, 1, pool="b") == 2  # the cluster goes on


async def test_an_output_that_does_not_pickle_gathered_from_a_worker_process_names_its_task() -> (
    None
):
    """The client in the manager's process, the worker in its own: the manager's gather
    reply from the worker could not be pickled and raised a bare TypeError."""
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, threads_per_worker=1) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            conn, fine = c.submit(open_conn, pure=False), c.submit(inc, 1)
            with anyio.fail_after(PROMPT), pytest.raises(ResultNotPicklable) as info:
                await conn
            assert info.value.key == conn.key and info.value.reason.startswith("TypeError")
            assert await fine == 2
            assert await c.gather([fine]) == [2]
