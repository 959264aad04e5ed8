"""The client's "no worker to run the ready tasks" warning names the task that may be
killing the workers.

A user audit (failures, 5): in thread execution a task calling ``os._exit(3)`` killed
each of the two hand-started workers that ran it, and then waited for ever. The manager
logged ``worker lost ... cause='crash' running=['exit3-...']`` twice, but the client
said only that the ready tasks waited for a worker to join. Now the scheduler's core
keeps the latest tasks whose tries were lost with workers that ended unexpectedly
(``SchedulerState.crash_suspects``, from the crashes it counts for
``TaskCrashedWorkers``), ``status()["crash_suspects"]`` lists those still to run, and
the warning's hint names them first.

The core is fed events (no clock); the warning is checked as a function and against a
manager and a worker in this process (over the codec, ``inproc://``: no port), gated on
the log line.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import pytest

from actors.scheduler_events import WorkerJoined
from actors.scheduler_state import MAX_SUSPECTS
from runtime import Cluster
from runtime.client import SUSPECTS_NAMED, _no_workers_news, crash_suspects_text
from runtime.errors import TaskCrashedWorkers
from runtime.messages import AlertInfo, StatusReply
from runtime.monitor import alerting_config
from runtime.node import Tokens, run_manager, run_worker
from tests.helpers import (
    GB,
    Factory,
    event,
    finish,
    join,
    leave,
    log_lines,
    make_state,
    on,
    run,
    submit,
    wait_until,
)

__all__ = ["make_state"]  # the autouse fixture, used by name

LIMIT = 30.0


def test_the_core_names_the_tasks_running_on_workers_that_crashed(make_state: Factory) -> None:
    s = make_state()
    submit(s, {"exit3": []}, ["exit3"])
    assert s.crash_suspects() == {}
    join(s, "w1")
    leave(s, "w1", cause="preempted")  # says nothing of the task
    assert s.crash_suspects() == {}
    for wid in ("w2", "w3"):  # (a third would fail it: TaskCrashedWorkers)
        join(s, wid)
        assert on(s, wid) == {"exit3"}
        leave(s, wid, cause="crash")
    assert s.crash_suspects() == {"exit3": ("w2", "w3")}
    join(s, "w4")
    finish(s, "w4", "exit3")  # it finished: no longer a suspect
    assert s.crash_suspects() == {}


def test_the_core_keeps_the_latest_suspects_only(make_state: Factory) -> None:
    s = make_state()
    n = MAX_SUSPECTS + 5
    keys = [f"t{i:02d}" for i in range(n)]
    submit(s, {k: [] for k in keys}, keys)
    join(s, "big", cores=n)
    assert on(s, "big") == set(keys)
    leave(s, "big", cause="crash")
    suspects = s.crash_suspects()
    assert len(suspects) == MAX_SUSPECTS and set(suspects) < set(keys)
    assert set(suspects.values()) == {("big",)}
    status = StatusReply(crash_suspects=suspects).to_dict()
    assert status["crash_suspects"] == {k: ["big"] for k in suspects}


def _pending() -> AlertInfo:
    return AlertInfo("CorralNoWorkers", "pending", {"pool": "*"}, value=1, active_since=1.0)  # type: ignore[arg-type]


def test_the_warning_names_the_suspects_first() -> None:
    suspects = {"exit3-1": ("w1", "w2"), "b": ("w2",)}
    text = crash_suspects_text(suspects)
    assert text.startswith(
        "task 'exit3-1' was running, or may have been, on 2 workers when they ended "
        "unexpectedly ('w1', 'w2'); task 'b' was running, or may have been, on 1 worker "
        "when it ended unexpectedly ('w2'). It may be what kills them"
    )
    assert "execution 'process'" in text
    assert "(2 lives)" in crash_suspects_text({"a": ("w1", "w1")})
    many = {f"t{i}": ("w1",) for i in range(SUSPECTS_NAMED + 2)}
    assert "; and 2 more (status()['crash_suspects'])." in crash_suspects_text(many)
    assert crash_suspects_text({}) == ""
    with log_lines("corral.client", logging.WARNING) as log:
        _no_workers_news([_pending()], set(), "m", suspects=suspects)
        _no_workers_news([_pending()], set(), "m")
        named, plain = log.lines
    assert "hint=\"task 'exit3-1' was running" in named, named
    assert ". They wait for a worker to join" in named
    assert "was running" not in plain and "hint='they wait for a worker to join" in plain


def test_the_warning_does_not_send_process_workers_to_process_execution() -> None:
    """Workers that run their tasks in task processes already: the hint does not tell
    them to (a user audit's Cluster(processes=1, memory_options={"execution":
    "process"}) was told to run its workers with execution 'process')."""
    text = crash_suspects_text({"a": ("w1",)}, contained=True)
    assert "execution 'process'" not in text
    assert "run their tasks in task processes already" in text
    assert text.endswith("(docs/api.md#errors, TaskCrashedWorkers)")
    with log_lines("corral.client", logging.WARNING) as log:
        _no_workers_news([_pending()], set(), "m", suspects={"a": ("w1",)}, contained=True)
    (line,) = log.lines
    assert "task processes already" in line and "execution 'process'" not in line


def _crashed(s: Any, contained: tuple[bool, ...]) -> Any:
    """Core ``s`` with task "a" run on workers w0, w1, ... in turn, each of which
    crashed while it ran it, and ran its tasks in task processes as ``contained`` says."""
    submit(s, {"a": []}, ["a"])
    for i, process in enumerate(contained):
        run(s, event(WorkerJoined, worker=f"w{i}", cores=1, memory=GB, contained=process))
        assert on(s, f"w{i}") == {"a"}
        leave(s, f"w{i}", cause="crash")
    return s


@pytest.mark.parametrize(
    ("contained", "said"), [((True, True), True), ((True, False), False), ((False,) * 2, False)]
)
def test_the_status_says_which_suspects_crashed_only_process_workers(
    make_state: Factory, contained: tuple[bool, ...], said: bool
) -> None:
    """The client's hint told "run the workers with execution 'process'" from a guess of
    its own: its own settings for an embedded cluster, never for a ``Cluster(address)``,
    whose manager's workers may run task processes already. Now the core says, per
    suspect, whether every worker it crashed ran its tasks in task processes
    (``WorkerInfo.execution``), and the status carries it."""
    s = _crashed(make_state(), contained)
    assert s.crash_suspects() == {"a": ("w0", "w1")}
    assert s.contained_suspects() == (("a",) if said else ())
    status = StatusReply(
        crash_suspects=s.crash_suspects(), contained_suspects=s.contained_suspects()
    ).to_dict()
    assert status["contained_suspects"] == (["a"] if said else [])


def test_the_error_does_not_send_process_workers_to_process_execution() -> None:
    """``TaskCrashedWorkers`` of workers that ran their tasks in task processes
    (``contained``) does not advise execution 'process', which they had: it says a
    crash in a task ends its task process there and names what ends a worker itself.
    Of thread workers it advises process execution, as before."""
    crashes = [("w1", "crash"), ("w2", "exit code 1")]
    threads = str(TaskCrashedWorkers("a", crashes))
    assert "run workers with execution 'process' to contain it" in threads
    assert "os._exit, a crash in compiled code" in threads
    assert "task processes already" not in threads
    processes = str(TaskCrashedWorkers("a", crashes, contained=True))
    assert "execution 'process' to contain" not in processes
    assert "os._exit" not in processes
    assert (
        "the workers ran their tasks in task processes already (execution 'process'), "
        "where a crash in a task ends its task process, not its worker, so look for what "
        "ends the workers themselves: the kernel's OOM killer"
    ) in processes
    assert "max_crashes=20" in processes and "max_crashes=20" in threads
    # Silent workers: a task holding the GIL cannot silence a process worker
    silent = [("w1", "unknown"), ("w2", "unknown")]
    quiet = str(TaskCrashedWorkers("a", silent, contained=True))
    assert "holds Python's GIL" not in quiet and "with execution 'process'" not in quiet
    assert "no task held their GIL" in quiet and "--worker-timeout SECONDS" in quiet
    assert "holds Python's GIL for long" in str(TaskCrashedWorkers("a", silent))
    assert TaskCrashedWorkers("a", crashes, contained=True).contained is True


@pytest.mark.parametrize(
    ("contained", "advised"),
    [((True, True, True), False), ((True, False, True), True), ((False,) * 3, True)],
)
def test_the_core_advises_process_execution_unless_every_crashed_worker_ran_it(
    make_state: Factory, contained: tuple[bool, ...], advised: bool
) -> None:
    """The core knows each worker's execution (``WorkerInfo.execution``, joined as
    ``WorkerJoined.contained``): its ``TaskCrashedWorkers`` is ``contained`` when every
    worker the task crashed ran its tasks in task processes."""
    s = _crashed(make_state(), contained)
    err = s.tasks["a"].error
    assert isinstance(err, TaskCrashedWorkers) and err.contained is not advised
    assert ("run workers with execution 'process'" in str(err)) is advised


#: set at the end of the cluster test: lets the task's thread (in this process) end
RELEASE = threading.Event()


def holds(x: int) -> int:
    RELEASE.wait(LIMIT)
    return x


@pytest.mark.anyio
async def test_a_client_s_warning_names_the_task_that_was_running_on_the_lost_worker() -> None:
    """A worker that vanishes while it runs a task (as one a task's os._exit kills): the
    client's warning that no worker is left names that task."""
    ready = anyio.Event()
    where: dict[str, str] = {}

    def manager_ready(address: str, tokens: Tokens) -> None:
        where["address"] = address
        ready.set()

    try:
        with (
            anyio.fail_after(LIMIT),
            log_lines("corral.client", logging.WARNING) as log,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: run_manager(
                        "inproc://", ready=manager_ready, listen_options={"codec": True},
                        reconnect_timeout=0.2, alerting=alerting_config({"interval": 0.1}),
                    )
                )  # fmt: skip
                await ready.wait()
                worker = anyio.CancelScope()

                async def one_worker() -> None:
                    with worker:
                        await run_worker(where["address"], listen_options={"codec": True})

                tg.start_soon(one_worker)
                async with Cluster(where["address"], manager_alerts=0.1) as c:
                    await c.wait_for_workers(1, timeout=LIMIT)
                    fut = c.submit(holds, 1, key="exit3-1")
                    await wait_until(
                        lambda: _running(c), "the task running on the worker", limit=LIMIT
                    )
                    worker.cancel()  # it vanishes with the task
                    line = await wait_until(
                        lambda: log.with_("no worker to run the ready tasks"), "the warning"
                    )
                    assert "task 'exit3-1' was running, or may have been, on 1 worker" in line
                    assert "ended unexpectedly" in line and "They wait for a worker" in line
                    status = await c.status()
                    assert status["crash_suspects"] == {"exit3-1": [status_worker(line)]}
                    assert not fut.done()
                tg.cancel_scope.cancel()
    finally:
        RELEASE.set()


async def _running(c: Cluster) -> bool:
    status: dict[str, Any] = await c.status()
    return sum(status["processing"].values()) == 1


def status_worker(line: str) -> str:
    """The worker id the warning's suspect text names (``... ('ID')``)."""
    return line.split("ended unexpectedly ('", 1)[1].split("'", 1)[0]
