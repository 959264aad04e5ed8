"""``Cluster.run(func, *args, workers=None, timeout=30, on_error="raise", **kwargs)``:
dask.distributed's ``Client.run``. ``func`` is called once on every worker (or the ones
named), outside the task graph, in a thread of the worker's process (not its event
loop, not a task slot), and the answer is ``{worker id: value}``; an error raises on the
client as itself (or per ``on_error``); a worker that leaves or does not answer in time
is a ``RunNoAnswer`` naming it, within the timeout (docs/api.md, "Controlling the
cluster"). In-process workers, worker processes of an embedded cluster and of a manager
process; ports of 127.0.0.1 from 47500 to 47999 only."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_state import SchedulerState
from actors.worker_state import RUN_THREADS
from runtime import Cluster
from runtime.client import RUN_TIMEOUT, _run_results
from runtime.codec import Frame
from runtime.errors import (
    CorralError,
    DaskOnlyArgument,
    RemoteError,
    RunNoAnswer,
    TaskExited,
    UnknownWorkers,
)
from runtime.messages import ErrorReply, RunOutcome, RunRequest
from runtime.node import ALLOWED, Hello, Tokens, Welcome
from runtime.pickling import cloudpickle_dumps
from runtime.remote import to_wire
from tests.helpers import (
    Cli,
    free_port_between,
    join,
    leave,
    manager_with_a_worker,
    wait_until,
)
from tests.test_hostile_auth import _next, in_process_gateway, raw

pytestmark = pytest.mark.anyio
LIMIT = 60
#: this file's ports: a manager's or an embedded gateway's (a wide range: one a test
#: closed may stay unbindable for a while, in TIME_WAIT), and its workers' for peers
PORTS = (47500, 47899)
WORKER_PORTS = "47900-47999"


class CheckFailed(Exception):
    """An error of this module's own, raised on a worker."""


def fails(what: str) -> None:
    raise CheckFailed(f"no {what} here")


async def async_pid(delay: float) -> tuple[int, bool]:
    """An ``async def`` function: awaited on the worker, as dask awaits one; on an event
    loop of its own, in a thread that is not the main one."""
    await asyncio.sleep(delay)
    return os.getpid(), threading.current_thread() is threading.main_thread()


def add(a: int, b: int = 0) -> int:
    return a + b


def exits() -> None:
    raise SystemExit(3)


def sleeps_on(victim: int, mark: str) -> int:
    """On the process ``victim`` (killed meanwhile): says so in the file ``mark``, then
    sleeps for a minute; elsewhere answers at once."""
    if os.getpid() == victim:
        Path(mark).touch()
        time.sleep(60)
    return os.getpid()


def held(started: threading.Event, gate: threading.Event) -> bool:
    """A task (or a call) that says it started, then waits for ``gate``."""
    started.set()
    return gate.wait(30)


# ----------------------------------------------------------------------------- pure parts


def test_the_core_chooses_every_worker_registered_or_the_ones_named() -> None:
    s = SchedulerState()
    for wid in ("w2", "w1", "w3"):
        join(s, wid)
    leave(s, "w3")
    assert s.run_targets(None) == ("w1", "w2")
    assert s.run_targets(["w2", "w1", "w2"]) == ("w1", "w2")
    with pytest.raises(UnknownWorkers, match=r"names 'w3'.*Its workers now: 'w1', 'w2'") as info:
        s.run_targets(["w1", "w3"])
    assert info.value.unknown == ("w3",) and info.value.known == ("w1", "w2")
    with pytest.raises(UnknownWorkers, match=r"did you mean 'w1'\?"):
        s.run_targets(["w11"])
    s.validate()


def _failed(worker: str, error: BaseException) -> RunOutcome:
    return RunOutcome(worker, False, cloudpickle_dumps(error), type(error).__name__, "tb")


def test_on_error_raises_the_first_failure_returns_it_or_leaves_the_worker_out() -> None:
    outcomes = [
        _failed("w3", KeyError("late")),
        RunOutcome("w1", True, cloudpickle_dumps(1)),
        _failed("w2", CheckFailed("gpu")),
    ]
    with pytest.raises(CheckFailed, match="gpu") as info:
        _run_results(outcomes, "raise", "probe")
    assert info.value.__notes__ == ["(raised on worker 'w2' in Cluster.run's call of probe())"]
    got = _run_results(outcomes, "return", "probe")
    assert list(got) == ["w1", "w2", "w3"] and got["w1"] == 1
    assert isinstance(got["w2"], CheckFailed) and isinstance(got["w3"], KeyError)
    assert _run_results(outcomes, "ignore", "probe") == {"w1": 1}


def test_an_error_that_does_not_load_here_is_a_remote_error_and_an_exit_task_exited() -> None:
    unloadable = RunOutcome("w1", False, b"not a pickle", "NoSuchError", "Traceback: ...")
    with pytest.raises(RemoteError, match=r"remote NoSuchError: Traceback: \.\.\.") as info:
        _run_results([unloadable], "raise", "probe")
    assert info.value.kind == "NoSuchError"
    with pytest.raises(TaskExited, match=r"called sys.exit\(3\)") as exited:
        _run_results([_failed("w1", SystemExit(3))], "raise", "probe")
    assert isinstance(exited.value.__cause__, SystemExit)


def test_the_submit_token_may_run_functions_the_read_token_not() -> None:
    assert RunRequest in ALLOWED["submit"] and RunRequest in ALLOWED["admin"]
    assert RunRequest not in ALLOWED["read"] and RunRequest not in ALLOWED["worker"]


async def test_a_read_token_asking_to_run_a_function_is_refused_unopened() -> None:
    """A read-only console's RunRequest (a pickle: code) is refused at the gateway
    before it is opened, saying the submit token is needed; the manager's own client
    test below runs with the submit token."""
    tokens = Tokens.generate()
    with anyio.fail_after(LIMIT):
        async with (
            in_process_gateway(tokens, PORTS) as (_, address),
            raw(address, tokens.read, Hello("console", "looker")) as conn,
        ):
            assert await _next(conn) == Welcome("")
            request = RunRequest(cloudpickle_dumps((os.getpid, (), {})), "getpid", None, 1.0)
            await conn.send(Frame(to_wire(request), request_id=7))
            reply = await _next(conn)
    assert isinstance(reply, ErrorReply), reply
    assert "refusing a pickled RunRequest: this connection has the read token" in reply.text
    assert "use the submit token" in reply.text


async def test_the_manager_refuses_a_timeout_that_would_not_bound_the_call() -> None:
    """The client checks ``timeout`` at the call; a client that sends one anyway (any
    number crosses the wire) is refused by the manager, which the timeout bounds."""
    tokens = Tokens.generate()
    call = cloudpickle_dumps((os.getpid, (), {}))
    with anyio.fail_after(LIMIT):
        async with (
            in_process_gateway(tokens, PORTS) as (_, address),
            raw(address, tokens.submit, Hello("client", "hasty")) as conn,
        ):
            assert isinstance(await _next(conn), Welcome)
            for n, bad in enumerate([float("inf"), float("nan"), -1.0, 0.0]):
                request = RunRequest(call, "getpid", None, bad)
                await conn.send(Frame(to_wire(request), request_id=n + 1))
                reply = await _next(conn)
                assert isinstance(reply, ErrorReply) and reply.kind == "ValueError", reply
                assert "a finite number > 0" in reply.text, reply.text


# ----------------------------------------------------------------------------- in-process


async def test_in_process_workers_run_it_once_each_and_answer_by_worker_id() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as c:
            assert await c.run(os.getpid) == {"worker-1": os.getpid(), "worker-2": os.getpid()}
            assert await c.run(add, 1, b=2, workers=["worker-2"]) == {"worker-2": 3}
            pid, main_thread = (await c.run(async_pid, 0.01, workers=["worker-1"]))["worker-1"]
            assert pid == os.getpid() and not main_thread
            with pytest.raises(CheckFailed, match="no gpu here") as info:
                await c.run(fails, "gpu")
            assert "(raised on worker 'worker-1' in Cluster.run's call of fails())" in (
                info.value.__notes__
            )
            assert "in fails" in "".join(traceback.format_tb(info.value.__traceback__))
            answers = await c.run(fails, "gpu", on_error="return")
            assert sorted(answers) == ["worker-1", "worker-2"]
            assert all(isinstance(e, CheckFailed) for e in answers.values())
            assert await c.run(fails, "gpu", on_error="ignore") == {}
            with pytest.raises(TaskExited, match=r"sys.exit\(3\)"):
                await c.run(exits)
            with pytest.raises(UnknownWorkers, match="'worker-3'"):
                await c.run(os.getpid, workers=["worker-1", "worker-3"])
            assert await c.submit(add, 2, 2) == 4  # the workers went on
            # in-process workers call the objects themselves, unpickled, as their tasks
            cache = {"x": threading.Lock()}
            assert await c.run(cache.clear, workers=["worker-1"]) == {"worker-1": None}
            assert cache == {}


async def test_it_runs_beside_a_running_task_and_leaves_the_event_loop_free() -> None:
    """One worker of one thread runs a task held on a gate: the call is not queued
    behind it (no task slot); and while a call waits on its own gate in the worker, the
    cluster (its event loop, the client's too here) goes on: the task ends."""
    task_started, task_gate = threading.Event(), threading.Event()
    run_started, run_gate = threading.Event(), threading.Event()
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(workers=1) as c:
                fut = c.submit(held, task_started, task_gate, pure=False)
                assert await anyio.to_thread.run_sync(task_started.wait, LIMIT)
                assert await c.run(add, 5) == {"worker-1": 5}  # the task holds the slot
                async with anyio.create_task_group() as tg:

                    async def call() -> None:
                        assert await c.run(held, run_started, run_gate) == {"worker-1": True}

                    tg.start_soon(call)
                    assert await anyio.to_thread.run_sync(run_started.wait, LIMIT)
                    task_gate.set()
                    assert await fut is True  # (the loop ran while the call was held)
                    run_gate.set()
    finally:
        task_gate.set()
        run_gate.set()


async def test_a_worker_that_does_not_answer_in_time_is_named_and_the_others_come() -> None:
    gate = threading.Event()
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(workers=2) as c:
                with pytest.raises(RunNoAnswer, match=r"'worker-1' did not answer within 0.5 s"):
                    await c.run(gate.wait, 30, workers=["worker-1"], timeout=0.5)
                got = await c.run(gate.wait, 30, timeout=0.5, on_error="return")
                assert [type(v) for v in got.values()] == [RunNoAnswer, RunNoAnswer]
                assert got["worker-2"].worker == "worker-2" and not got["worker-2"].left
                assert got["worker-2"].timeout == 0.5
                # calls that never return keep their threads (one each, above): past
                # RUN_THREADS of them a call waits, and is a RunNoAnswer at its timeout,
                # while the worker's tasks and threads of its own work go on
                for _ in range(RUN_THREADS - 1):
                    await c.run(gate.wait, 30, workers=["worker-1"], timeout=0.1, on_error="ignore")
                with pytest.raises(RunNoAnswer, match=r"'worker-1' did not answer within 0\.5 s"):
                    await c.run(add, 1, workers=["worker-1"], timeout=0.5)
                assert await c.run(add, 1, workers=["worker-2"]) == {"worker-2": 1}
                assert await c.gather(c.map(add, range(4))) == [0, 1, 2, 3]
                gate.set()
                assert await c.run(add, 1) == {"worker-1": 1, "worker-2": 1}
    finally:
        gate.set()  # the threads let go end


async def test_bad_arguments_are_refused_at_the_call_saying_what_to_do() -> None:
    def takes_worker(dask_worker: Any) -> None:
        return None

    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            with pytest.raises(ValueError, match=r"on_error=\.\.\.\) is one of 'raise'"):
                await c.run(os.getpid, on_error="warn")
            with pytest.raises(ValueError, match=r"timeout=\.\.\.\) is the seconds"):
                await c.run(os.getpid, timeout=0)
            with pytest.raises(ValueError, match="a finite number > 0, got inf"):
                await c.run(os.getpid, timeout=float("inf"))
            with pytest.raises(TypeError, match="a list of worker ids"):
                await c.run(os.getpid, workers="worker-1")
            with pytest.raises(TypeError, match="a worker id is a str, got 1"):
                await c.run(os.getpid, workers=[1])
            with pytest.raises(TypeError, match="must be callable"):
                await c.run(42)
            with pytest.raises(DaskOnlyArgument, match=r"wait= is a dask\.distributed keyword"):
                await c.run(os.getpid, wait=False)
            with pytest.raises(DaskOnlyArgument, match="nanny="):
                await c.run(os.getpid, nanny=True)
            with pytest.raises(DaskOnlyArgument, match="dask_worker="):
                await c.run(takes_worker)
            # dask's defaults are taken, and not passed to the function
            assert await c.run(add, 1, wait=True, nanny=False) == {"worker-1": 1}


async def test_run_sync_waits_from_another_thread_and_refuses_the_loop_s_own() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            got = await anyio.to_thread.run_sync(lambda: c.run_sync(add, 2, b=3))
            assert got == {"worker-1": 5}
            with pytest.raises(CorralError, match=r"`await cluster.run\(func\)`"):
                c.run_sync(add, 1)


# ----------------------------------------------------------------------------- processes


@pytest.mark.slow  # worker processes start: 2-10 s on a loaded machine
async def test_worker_processes_answer_with_their_own_pids_and_errors() -> None:
    pools = {"default": {"min_blocks": 2, "worker_port_range": WORKER_PORTS}}
    port = free_port_between(*PORTS)
    with anyio.fail_after(LIMIT):
        async with Cluster(pools=pools, processes=True, port=port) as c:
            await c.wait_for_workers(2, timeout=LIMIT)
            pids = await c.run(os.getpid)
            st = await c.status()
            assert pids == {w.worker_id: w.pid for w in st["workers"]}
            assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
            (one, *_) = sorted(pids)
            assert await c.run(async_pid, 0.01, workers=[one]) == {one: (pids[one], False)}
            with pytest.raises(CheckFailed, match="no gpu here"):
                await c.run(fails, "gpu")
            with pytest.raises(TypeError, match=r"add\(\) or its arguments cannot be pickled"):
                await c.run(add, threading.Lock())
            with pytest.raises(TypeError, match=r"lock\(\) returned a lock, which cannot be"):
                await c.run(threading.Lock)


@pytest.mark.slow  # worker processes start: 2-10 s on a loaded machine
async def test_a_worker_process_killed_mid_call_is_named_at_once_not_at_the_timeout(
    tmp_path: Path,
) -> None:
    pools = {"default": {"min_blocks": 2, "worker_port_range": WORKER_PORTS}}
    port = free_port_between(*PORTS)
    mark = tmp_path / "sleeping"
    with anyio.fail_after(LIMIT):
        async with Cluster(pools=pools, processes=True, port=port) as c:
            await c.wait_for_workers(2, timeout=LIMIT)
            pids = await c.run(os.getpid)
            victim, other = sorted(pids)
            answers: dict[str, Any] = {}
            began = time.monotonic()
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    got = await c.run(sleeps_on, pids[victim], str(mark), on_error="return")
                    answers.update(got)

                tg.start_soon(call)
                await wait_until(mark.exists, "the victim to run the call")
                os.kill(pids[victim], 9)
            took = time.monotonic() - began
            assert answers[other] == pids[other]
            lost = answers[victim]
            assert isinstance(lost, RunNoAnswer) and lost.left and lost.worker == victim
            assert f"worker {victim!r} left, or its connection dropped" in str(lost)
            assert took < RUN_TIMEOUT / 2, took  # not the call's timeout


@pytest.mark.slow  # worker processes start: 2-10 s on a loaded machine
def test_a_client_of_a_manager_process_gets_the_workers_answers(tmp_path: Path) -> None:
    port = free_port_between(*PORTS)

    async def main(address: str, token: str) -> None:
        with anyio.fail_after(LIMIT):
            await client(address, token)

    async def client(address: str, token: str) -> None:
        async with Cluster(address, token=token) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            (pid,) = (await c.run(os.getpid)).values()
            assert pid != os.getpid()
            assert [w.pid for w in (await c.status())["workers"]] == [pid]
            with pytest.raises(CheckFailed, match="no disk here") as info:
                await c.run(fails, "disk")
            assert "in fails" in "".join(traceback.format_tb(info.value.__traceback__))

    with Cli(tmp_path / "home") as cli:
        anyio.run(main, *manager_with_a_worker(cli, port, WORKER_PORTS))
