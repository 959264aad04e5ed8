"""``Cluster.run``'s calls that do not return (docs/api.md, "Controlling the cluster"):
each runs in a daemon thread, so a worker process (or an embedded cluster's program)
ends without waiting for it; a worker runs at most ``RUN_THREADS`` at once, keeps at
most ``RUN_WAITING`` more waiting (the next is a ``RunQueueFull``), and drops, never
runs, a waiting call whose timeout ran out (its client was told ``RunNoAnswer``). The
manager answers within the timeout, its scheduler's choice and the pickling included
(``RunNotSent`` when the call reached no worker). Ports of 127.0.0.1 from 52500 to
52999 only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.manager import Manager
from actors.worker_state import RUN_THREADS, RUN_WAITING, RunSlots
from runtime import Cluster
from runtime.errors import RunNoAnswer, RunNotSent, RunQueueFull
from runtime.log import get_logger
from runtime.messages import RunRequest
from runtime.remote import check_run_timeout
from tests.helpers import Cli, free_port_between, log_lines, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60
#: this file's ports: a manager's, and its workers' for peers
PORTS = (52500, 52899)
WORKER_PORTS = "52900-52999"
#: what a worker logs as it drops a call that waited for a thread past its timeout
DROPPED = "dropped a Cluster.run call that had no thread by its timeout"


def add(a: int, b: int = 0) -> int:
    return a + b


def waits_for(path: str) -> bool:
    """Waits (at most a minute) until the file ``path`` exists: a gate another process
    can open."""
    end = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
    return True


def touch(path: str) -> None:
    Path(path).touch()


# ----------------------------------------------------------------------------- pure parts


def test_calls_run_up_to_the_threads_then_wait_then_are_refused() -> None:
    s = RunSlots(threads=2, most_waiting=2)
    assert [s.arrive(1, 10.0), s.arrive(2, 10.0)] == ["run", "run"]
    assert [s.arrive(3, 5.0), s.arrive(4, 20.0)] == ["wait", "wait"]
    assert s.arrive(5, 20.0) == "refuse"
    assert s.running == {1, 2} and s.waiting == {3: 5.0, 4: 20.0}


def test_a_freed_thread_goes_to_the_first_call_still_in_time_the_late_ones_dropped() -> None:
    s = RunSlots(threads=1, most_waiting=3)
    assert s.arrive(1, 10.0) == "run"
    for call, deadline in ((2, 5.0), (3, 6.0), (4, 20.0)):
        assert s.arrive(call, deadline) == "wait"
    # at 7.0, calls 2 and 3 are past their deadlines: dropped, call 4 runs
    assert s.ended(1, 7.0) == (4, (2, 3))
    assert s.running == {4} and s.waiting == {}
    assert s.ended(4, 8.0) == (None, ())
    assert s.running == set()


def test_a_call_expired_while_waiting_is_dropped_one_given_a_thread_is_not() -> None:
    s = RunSlots(threads=1, most_waiting=2)
    s.arrive(1, 10.0)
    s.arrive(2, 10.0)
    s.arrive(3, 10.0)
    assert s.expired(2) is True and s.waiting == {3: 10.0}
    assert s.ended(1, 1.0) == (3, ())
    assert s.expired(3) is False and s.running == {3}
    assert s.arrive(4, 10.0) == "wait"  # (the place call 2 had is free again)


def test_an_int_timeout_too_large_for_a_float_is_the_documented_value_error() -> None:
    with pytest.raises(ValueError, match=r"a finite number > 0, got 1000000"):
        check_run_timeout(10**400)
    for bad in (True, "5", None, float("nan"), -(10**400), 0):
        with pytest.raises(ValueError, match="a finite number > 0"):
            check_run_timeout(bad)
    assert check_run_timeout(3) == 3.0 and isinstance(check_run_timeout(3), float)


def test_the_no_answer_text_says_a_waiting_call_was_dropped_and_the_full_one_what_to_do() -> None:
    text = str(RunNoAnswer("w1", "mark", 0.5, left=False))
    assert "if mark() started there it may still be running" in text
    assert "it was dropped and will not run" in text
    full = RunQueueFull("w1", "mark", RUN_THREADS, RUN_WAITING)
    assert f"its {RUN_THREADS} run threads are taken" in str(full)
    assert "Nothing was run there" in str(full) and "let those calls return" in str(full)
    assert isinstance(full, RuntimeError) and full.waiting == RUN_WAITING


# ----------------------------------------------------------------------------- the manager


class _Stuck:
    """A scheduler reference whose asks never answer (a scheduler far behind)."""

    async def ask(self, msg: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        await anyio.sleep_forever()


class _Remote:
    """A worker process's reference, as the scheduler's choice gives it (not local)."""


class _Targets:
    async def ask(self, msg: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        return (("w1", _Remote()),)


class SlowToPickle:
    """An argument whose pickling takes 2 s."""

    def __reduce__(self) -> Any:
        time.sleep(2)
        return (SlowToPickle, ())


def _manager(scheduler: Any) -> Manager:
    """A manager (not spawned: its ``_run`` called as its handler's answer is)."""
    manager = Manager(lambda: scheduler, lambda: None, lambda: None, lambda name: None)  # type: ignore[arg-type,return-value]
    manager._log = get_logger("corral", actor="manager")
    return manager


async def test_a_scheduler_that_does_not_name_the_workers_in_time_is_run_not_sent() -> None:
    request = RunRequest((add, (1,), {}), "add", None, 0.2)
    with anyio.fail_after(LIMIT), pytest.raises(RunNotSent, match=r"its scheduler had not said"):
        await _manager(_Stuck())._run(request)


async def test_pickling_past_the_timeout_is_run_not_sent() -> None:
    request = RunRequest((add, (SlowToPickle(),), {}), "add", None, 0.2)
    began = time.monotonic()
    with anyio.fail_after(LIMIT), pytest.raises(RunNotSent, match=r"still pickling") as info:
        await _manager(_Targets())._run(request)
    assert info.value.stage == "pickle" and time.monotonic() - began < 2  # not the pickling's


# ----------------------------------------------------------------------------- in-process


async def test_a_call_that_timed_out_waiting_for_a_thread_never_runs() -> None:
    gate, ran = threading.Event(), []
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(workers=1) as c:
                for _ in range(RUN_THREADS):  # calls that do not return take the threads
                    await c.run(gate.wait, 30, timeout=0.1, on_error="ignore")
                with log_lines() as logs, pytest.raises(RunNoAnswer, match="dropped and will"):
                    await c.run(ran.append, "late", timeout=0.3)
                    # (the worker counts the timeout from when the call reached it)
                    await wait_until(lambda: logs.has(DROPPED), "the worker to drop it")
                gate.set()  # the threads come free: the late call is not run on them
                assert await c.run(add, 1) == {"worker-1": 1}
                assert await c.run(ran.append, "now") == {"worker-1": None}
                assert ran == ["now"]
    finally:
        gate.set()


async def test_past_the_calls_a_worker_keeps_waiting_the_next_is_refused_at_once() -> None:
    gate, ran = threading.Event(), []
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(workers=1) as c:
                for _ in range(RUN_THREADS):
                    await c.run(gate.wait, 30, timeout=0.1, on_error="ignore")
                got: list[Any] = []

                async def call() -> None:
                    got.extend((await c.run(ran.append, 1, timeout=2, on_error="return")).values())

                with log_lines() as logs:
                    async with anyio.create_task_group() as tg:
                        for _ in range(RUN_WAITING + 1):
                            tg.start_soon(call)
                    await wait_until(
                        lambda: sum(DROPPED in line for line in logs.lines) == RUN_WAITING,
                        "the worker to drop the calls that waited",
                    )
                assert sorted(type(e).__name__ for e in got) == (
                    ["RunNoAnswer"] * RUN_WAITING + ["RunQueueFull"]
                )
                (full,) = [e for e in got if isinstance(e, RunQueueFull)]
                assert full.worker == "worker-1" and "Nothing was run there" in str(full)
                gate.set()
                assert await c.run(add, 2) == {"worker-1": 2}
                assert ran == []  # none of those that waited ran later
    finally:
        gate.set()


HANGS = """
import time, anyio
from runtime import Cluster
from runtime.errors import RunNoAnswer

async def main():
    async with Cluster(workers=1) as c:
        try:
            await c.run(time.sleep, 600, timeout=0.3)
        except RunNoAnswer:
            print("no answer", flush=True)

anyio.run(main)
"""


def test_an_embedded_cluster_s_program_ends_without_waiting_for_a_hung_call() -> None:
    """The call's thread is a daemon thread: the interpreter's end does not join it (an
    anyio worker thread, joined, kept the program 600 s)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HANGS)],
        capture_output=True,
        text=True,
        timeout=LIMIT,  # well under the call's 600 s
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout == "no answer\n", proc.stderr[-2000:]


# ----------------------------------------------------------------------------- processes


def _cluster(cli: Cli) -> tuple[str, str, subprocess.Popen[str]]:
    """A manager process and one worker process joined to it: the manager's address,
    the submit token and the worker's process."""
    port = free_port_between(*PORTS)
    proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
    line = cli.line_with(proc, "manager listening on")
    address = line.split("manager listening on", 1)[1].strip()
    worker = cli.worker(address, "--cores", "1", "--port-range", WORKER_PORTS)
    return address, cli.tokens(address)["submit"], worker


@pytest.mark.slow  # worker processes start: 2-10 s on a loaded machine
def test_a_worker_process_with_a_hung_call_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    async def hang(address: str, token: str) -> None:
        with anyio.fail_after(LIMIT):
            async with Cluster(address, token=token) as c:
                await c.wait_for_workers(1, timeout=LIMIT)
                with pytest.raises(RunNoAnswer):
                    await c.run(time.sleep, 600, timeout=0.5)

    with Cli(tmp_path / "home") as cli:
        address, token, worker = _cluster(cli)
        anyio.run(hang, address, token)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0  # well under the call's 600 s


@pytest.mark.slow  # worker processes start: 2-10 s on a loaded machine
def test_a_worker_process_drops_a_call_that_timed_out_waiting(tmp_path: Path) -> None:
    gate, late = tmp_path / "gate", tmp_path / "late"

    async def calls(address: str, token: str) -> None:
        with anyio.fail_after(LIMIT):
            async with Cluster(address, token=token) as c:
                await c.wait_for_workers(1, timeout=LIMIT)
                for _ in range(RUN_THREADS):
                    await c.run(waits_for, str(gate), timeout=0.1, on_error="ignore")
                with pytest.raises(RunNoAnswer, match="it was dropped and will not run"):
                    await c.run(touch, str(late), timeout=0.3)
                # (the worker counts the timeout from when the call reached it)
                await anyio.to_thread.run_sync(cli.line_with, worker, DROPPED)
                gate.touch()  # the threads come free: the late call is not run on them
                (pid,) = (await c.run(os.getpid)).values()
                assert pid != os.getpid() and not late.exists()

    with Cli(tmp_path / "home") as cli:
        address, token, worker = _cluster(cli)
        anyio.run(calls, address, token)
