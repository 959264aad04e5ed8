"""The executors: tasks in threads (:class:`Executor`) and in killable task processes
(:class:`ProcessExecutor`).

Everything runs for real: task processes are spawned children, kills are SIGKILLs, a
dying task really ends its process. Every wait is on results handed to ``deliver`` (or
on a polled condition) inside ``anyio.fail_after``, never sleep-then-assert. Task
functions live at module level so a task process can import them by reference.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import psutil
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from dask._task_spec import Task, TaskRef
from dask.sizeof import sizeof

from actors.executor import (
    GLIBC,
    BaseExecutor,
    Executor,
    ProcessExecutor,
    TaskProcessDied,
    rss,
)
from actors.protocol import TaskResult, ToRun
from runtime.errors import ResultNotPicklable
from runtime.graph import Key
from tests.helpers import held_at_gate, wait_until

pytestmark = pytest.mark.anyio

BOUND = 15  # seconds any single wait may take (task processes start in about a second)
HOG = 64 * 2**20  # bytes a memory hog holds while it waits to be killed
ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- tasks


class Boom(Exception):
    """A user exception type only this module knows."""


class Stubborn(Exception):
    """Pickles, but does not load again (its __init__ wants two arguments)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a} and {b}")


def where(delay: float = 0.0) -> tuple[int, str]:
    """Which process and thread ran the task, after ``delay`` seconds."""
    if delay:
        time.sleep(delay)
    return os.getpid(), threading.current_thread().name


def double_in_place(x: np.ndarray) -> np.ndarray:
    x *= 2  # inputs arrive writable in a task process, as they are in a thread
    return x


def total(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.sum() + b.sum())


def boom(x: int) -> int:
    raise Boom(f"boom {x}")


def stubborn() -> None:
    raise Stubborn(1, 2)


def unpicklable_result() -> Any:
    return threading.Lock()


def hog(nbytes: int, seconds: float) -> int:
    """Hold ``nbytes`` of touched memory for up to ``seconds`` (until killed)."""
    block = b"\x01" * nbytes
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return len(block)


_KEPT: list[bytes] = []  #: what ``keep`` left in its task process


def keep(nbytes: int) -> int:
    """Leave ``nbytes`` of touched memory in the task process after the task (as an
    allocator or a library's cache keeps memory a task freed)."""
    _KEPT.append(b"\x01" * nbytes)
    return os.getpid()


def churn(nbytes: int, times: int) -> int:
    """Allocate ``nbytes`` of touched memory and free it, ``times`` over (as a task's
    temporaries, or the pickled outputs and inputs that pass through a worker); the
    bytes of RSS its process kept of them."""
    before = rss()
    for _ in range(times):
        block = b"\x01" * nbytes
        del block
    return rss() - before


def die_by_signal(sig: int) -> None:
    os.kill(os.getpid(), sig)


def job(key: Key, func: Callable[..., Any], *args: Any) -> ToRun:
    return ToRun(key, Task(key, func, *args), "test", ())


# ----------------------------------------------------------------------------- harness


class Delivered:
    """What an executor delivered, by key; ``get`` waits for a key's result."""

    def __init__(self) -> None:
        self.results: dict[Key, tuple[TaskResult, Any]] = {}
        self.batches = 0
        self._changed = anyio.Event()

    def __call__(self, batch: list[tuple[TaskResult, Any]]) -> None:
        assert threading.current_thread() is threading.main_thread()  # the loop's thread
        self.batches += 1
        for result, value in batch:
            assert result.key not in self.results
            self.results[result.key] = (result, value)
        self._changed.set()

    async def get(self, key: Key) -> tuple[TaskResult, Any]:
        with anyio.fail_after(BOUND):
            while key not in self.results:
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.results.pop(key)


@contextlib.asynccontextmanager
async def process_executor(
    n: int = 1, recycle_over: int = 0
) -> AsyncIterator[tuple[ProcessExecutor, Delivered]]:
    delivered = Delivered()
    ex = ProcessExecutor(n, "w1", delivered, recycle_over=recycle_over)
    try:
        yield ex, delivered
    finally:
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ----------------------------------------------------------------------------- process mode


async def test_a_task_runs_in_a_task_process_and_reports_its_measurements() -> None:
    async with process_executor() as (ex, delivered):
        assert isinstance(ex, BaseExecutor)
        assert (ex.mode, ex.killable) == ("process", True)
        ex.submit(job("t", where, 0.05), {})
        result, value = await delivered.get("t")
        pid, _ = value
        assert result.outcome == "ok", result.error
        assert result.error is None
        assert pid != os.getpid()
        assert pid in ex.pids()
        assert result.stop - result.start >= 0.05
        assert result.start <= time.time()
        assert result.nbytes == sizeof(value) > 0
        assert result.rss > 0 and result.rss_before > 0  # the task process's RSS
        assert ex.running() == {}
        children = ex.children_rss()
        assert children > 0
        assert ex.total_rss() >= rss() + children // 2  # both sides, read at two moments


def corral_environ() -> dict[str, str]:
    """The CORRAL_ variables a task sees, and what a program it starts sees."""
    seen = {k: v for k, v in os.environ.items() if k.startswith("CORRAL")}
    shell = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    for line in shell.splitlines():
        name, _, value = line.partition("=")
        if name.startswith("CORRAL"):
            seen[name] = value
    return seen


async def test_a_task_process_has_no_token_in_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker started by a pool gets the admin token as CORRAL_TOKEN; its task
    processes do not keep it (nor do the programs their tasks start): a task's
    environment dump, a notebook's `env`, no longer shows it (security audit, finding
    5). Other CORRAL_ variables stay."""
    monkeypatch.setenv("CORRAL_TOKEN", "f" * 64)
    monkeypatch.setenv("CORRAL_WORKER_ID", "local-1")
    async with process_executor() as (ex, delivered):
        ex.submit(job("env", corral_environ), {})
        result, value = await delivered.get("env")
        assert result.outcome == "ok", result.error
        assert "CORRAL_TOKEN" not in value, value
        assert value.get("CORRAL_WORKER_ID") == "local-1", value


async def test_numpy_inputs_and_outputs_round_trip_writable() -> None:
    x = np.arange(1_000_000, dtype=np.float64)
    strided = np.arange(20.0)[::2]  # not contiguous: travels inside the pickle
    fortran = np.asfortranarray(np.ones((30, 20)))
    async with process_executor() as (ex, delivered):
        ex.submit(job("d", double_in_place, TaskRef("x")).with_pickled_node(), {"x": x})
        ex.submit(job("s", total, TaskRef("a"), TaskRef("b")), {"a": strided, "b": fortran})
        result, value = await delivered.get("d")
        assert result.outcome == "ok", result.error
        np.testing.assert_array_equal(value, np.arange(1_000_000, dtype=np.float64) * 2)
        assert value.flags.writeable
        assert result.nbytes == x.nbytes
        np.testing.assert_array_equal(x, np.arange(1_000_000, dtype=np.float64))  # a copy
        result, value = await delivered.get("s")
        assert result.outcome == "ok", result.error
        assert value == strided.sum() + 600


async def test_a_raising_task_reports_the_original_exception() -> None:
    async with process_executor() as (ex, delivered):
        ex.submit(job("b", boom, 3), {})
        ex.submit(job("s", stubborn), {})
        ex.submit(job("u", unpicklable_result), {})
        ex.submit(job("ok", where), {})
        result, value = await delivered.get("b")
        assert result.outcome == "error" and value is None
        assert type(result.error) is Boom
        assert str(result.error) == "boom 3"
        # its frames in the task process, once: no text copy of them as its cause
        assert "in boom" in "".join(traceback.format_tb(result.error.__traceback__))
        assert result.error.__cause__ is None
        assert result.rss > 0
        # An exception that cannot travel back arrives as a RuntimeError naming it.
        result, _ = await delivered.get("s")
        assert result.outcome == "error"
        assert type(result.error) is RuntimeError
        assert "Stubborn('1 and 2')" in str(result.error)
        # A result that cannot be pickled fails its task with ResultNotPicklable, as
        # an output that cannot leave its worker does in thread execution.
        result, _ = await delivered.get("u")
        assert result.outcome == "error"
        assert isinstance(result.error, ResultNotPicklable)
        assert result.error.key == "u" and "pickle" in result.error.reason
        # None of this harmed the task process.
        result, (pid, _) = await delivered.get("ok")
        assert result.outcome == "ok"
        assert ex.pids() == [pid]


async def test_kill_ends_a_running_task_as_oom_and_the_slot_goes_on() -> None:
    async with process_executor() as (ex, delivered):
        ex.submit(job("warm", where), {})
        _, (old_pid, _) = await delivered.get("warm")
        idle = ex.children_rss()
        ex.submit(job("hog", hog, HOG, 60.0), {})
        ex.submit(job("after", where), {})  # queued behind the hog: one slot
        await wait_until(
            lambda: ex.running() == {"hog": old_pid} and ex.children_rss() >= idle + HOG,
            limit=BOUND,
        )
        assert not ex.kill("after")  # queued tasks are not killed
        assert not ex.kill("nothing")
        assert ex.kill("hog")
        assert not ex.kill("hog")  # already killed
        result, value = await delivered.get("hog")
        assert result.outcome == "oom" and value is None
        assert result.error is None
        assert result.rss >= HOG  # the task process's RSS when it was killed
        assert result.stop >= result.start > 0
        result, (new_pid, _) = await delivered.get("after")
        assert result.outcome == "ok", result.error
        assert new_pid != old_pid
        assert gone(old_pid)
        assert ex.pids() == [new_pid]


@pytest.mark.parametrize(
    ("func", "arg", "says"),
    [
        (os._exit, 3, "exit code 3"),
        (die_by_signal, signal.SIGKILL, "SIGKILL (signal 9)"),
    ],
)
async def test_a_task_process_that_dies_fails_its_task_and_is_replaced(
    func: Callable[[int], None], arg: int, says: str
) -> None:
    async with process_executor() as (ex, delivered):
        ex.submit(job("die", func, arg), {})
        ex.submit(job("next", where), {})
        result, value = await delivered.get("die")
        assert result.outcome == "error" and value is None
        error = result.error
        assert isinstance(error, TaskProcessDied)
        assert says in str(error)
        # which worker (user audit failures, 9: the text named only the pid)
        assert error.worker == "w1" and f"(pid {error.pid} on worker 'w1') died" in str(error)
        assert error.exitcode == (arg if func is os._exit else -arg)
        result, (pid, _) = await delivered.get("next")
        assert result.outcome == "ok", result.error
        assert pid != error.pid
        assert gone(error.pid)


async def test_cancelled_tasks_do_not_start() -> None:
    async with process_executor() as (ex, delivered):
        ex.cancel("c")
        ex.submit(job("c", boom, 1), {})
        result, value = await delivered.get("c")
        assert result == TaskResult("c", "cancelled") and value is None
        # A task cancelled while it waits behind a running one does not start either.
        ex.submit(job("hog", hog, 0, 60.0), {})
        ex.submit(job("queued", boom, 2), {})
        await wait_until(lambda: "hog" in ex.running(), limit=BOUND)
        ex.cancel("queued")
        assert ex.kill("hog", "cancelled")
        result, _ = await delivered.get("hog")
        assert result.outcome == "cancelled"
        result, _ = await delivered.get("queued")
        assert result == TaskResult("queued", "cancelled")
        with pytest.raises(ValueError, match="kill outcome"):
            ex.kill("hog", "ok")


async def test_shutdown_leaves_no_task_process_alive() -> None:
    delivered = Delivered()
    ex = ProcessExecutor(2, "w2", delivered)
    ex.submit(job("a", where), {})
    ex.submit(job("hog", hog, 0, 60.0), {})
    await delivered.get("a")
    await wait_until(lambda: "hog" in ex.running() and len(ex.pids()) == 2, limit=BOUND)
    pids = ex.pids()
    ex.submit(job("queued", where), {})
    with anyio.fail_after(BOUND):
        ex.shutdown()
        await anyio.to_thread.run_sync(ex.shutdown, True)  # idempotent; waits
    assert ex.pids() == []
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not children & set(pids)
    assert all(gone(pid) for pid in pids)
    # The running task was killed and the queued one never started: both cancelled.
    assert (await delivered.get("hog"))[0].outcome == "cancelled"
    assert (await delivered.get("queued"))[0].outcome == "cancelled"


def process_ids() -> tuple[int, int, int]:
    return os.getpid(), os.getpgid(0), os.getsid(0)


async def test_a_task_process_leads_a_group_and_a_session_unless_its_worker_leads_one() -> None:
    """A task process leads a process group of its own (which the worker kills to stop
    it with its programs). A worker that does not lead a session (this test process,
    like a worker started from a shell) gives it a session of its own too, as before:
    a terminal's job control does not reach it."""
    async with process_executor() as (ex, delivered):
        ex.submit(job("ids", process_ids), {})
        result, (pid, group, session) = await delivered.get("ids")
    assert result.outcome == "ok", result.error
    assert group == pid
    assert session == (os.getpid() if os.getsid(0) == os.getpid() else pid)


ORPHANED = """
import asyncio, os
from dask._task_spec import Task
from actors.executor import ProcessExecutor
from actors.scheduler_state import ToRun

async def main():
    done = asyncio.Event()
    ex = ProcessExecutor(1, "orphan", lambda batch: (print(batch[0][1], flush=True), done.set()))
    ex.submit(ToRun("pid", Task("pid", os.getpid), "pid", ()), {})
    await done.wait()
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_task_processes_die_with_their_worker() -> None:
    argv = [sys.executable, "-c", ORPHANED]
    with anyio.fail_after(BOUND):
        async with await anyio.open_process(argv, cwd=ROOT, stderr=subprocess.DEVNULL) as worker:
            assert worker.stdout is not None
            line = await BufferedByteReceiveStream(worker.stdout).receive_until(b"\n", 64)
            pid = int(line)
            assert psutil.Process(pid).ppid() == worker.pid
            worker.kill()  # SIGKILL: nothing in the worker gets to clean up
            await worker.wait()
        await wait_until(lambda: gone(pid), limit=BOUND)


# ----------------------------------------------------------------------------- thread mode


async def test_the_thread_executor_runs_tasks_in_this_process_and_cannot_kill() -> None:
    delivered = Delivered()
    ex = Executor(2, "w3", delivered)
    try:
        assert (ex.mode, ex.killable) == ("thread", False)
        ex.submit(job("t", where, 0.01), {})
        ex.submit(job("b", boom, 4), {})
        result, (pid, thread) = await delivered.get("t")
        assert result.outcome == "ok", result.error
        assert pid == os.getpid() and thread.startswith("w3-")
        assert result.stop - result.start >= 0.01
        assert result.nbytes == sizeof((pid, thread))
        assert result.rss > 0 and result.rss_before > 0
        result, _ = await delivered.get("b")
        assert type(result.error) is Boom
        ex.cancel("c")
        ex.submit(job("c", where), {})
        assert (await delivered.get("c"))[0] == TaskResult("c", "cancelled")
        assert not ex.kill("t")
        assert ex.children_rss() == 0
        assert ex.total_rss() > 0
    finally:
        ex.shutdown()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)


# ----------------------------------------------------------------------------- cancel


async def test_cancelling_a_running_thread_task_frees_its_slot_at_once(tmp_path: Path) -> None:
    delivered = Delivered()
    ex = Executor(1, "w1", delivered)
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        ex.submit(job("stuck", held_at_gate, str(gate), str(started)), {})
        ex.submit(job("next", where), {})
        await wait_until(started.exists, limit=BOUND)
        ex.cancel("stuck")
        result, value = await delivered.get("stuck")
        assert result.outcome == "cancelled" and value is None
        assert ex.abandoned == 1
        # The one slot is free: the next task runs on a fresh thread while the old one
        # is still inside the cancelled task.
        result, (pid, thread) = await delivered.get("next")
        assert result.outcome == "ok" and pid == os.getpid() and thread == "w1-1"
        gate.touch()
        await wait_until(lambda: ex.abandoned == 0, limit=BOUND)
        assert "stuck" not in delivered.results  # its late result was dropped
        # Queued tasks cancelled before they start never run.
        ex.cancel("queued")
        ex.submit(job("queued", boom, 1), {})
        assert (await delivered.get("queued"))[0] == TaskResult("queued", "cancelled")
    finally:
        gate.touch()
        ex.shutdown(wait=True)


async def test_abandoned_threads_are_bounded_and_past_the_bound_a_thread_holds_its_slot(
    tmp_path: Path,
) -> None:
    """Past ``max_abandoned`` a cancelled task's thread is held: its try is reported
    ``cancelled`` at once all the same (a timeout bounds the wait), the thread keeps its
    slot (``held``), and when the abandoned thread ends the held one is abandoned in its
    place and a fresh thread takes the slot."""
    delivered = Delivered()
    ex = Executor(1, "w1", delivered, max_abandoned=1)
    gate_a, gate_b = tmp_path / "gate-a", tmp_path / "gate-b"
    try:
        ex.submit(job("a", held_at_gate, str(gate_a), str(tmp_path / "a")), {})
        await wait_until((tmp_path / "a").exists, limit=BOUND)
        ex.cancel("a")
        assert (await delivered.get("a"))[0].outcome == "cancelled"
        ex.submit(job("b", held_at_gate, str(gate_b), str(tmp_path / "b")), {})
        await wait_until((tmp_path / "b").exists, limit=BOUND)
        ex.cancel("b")  # a second abandoned thread would pass the bound: b holds its slot
        assert (await delivered.get("b"))[0].outcome == "cancelled"  # reported at once
        assert (ex.abandoned, ex.held) == (1, 1) and ex.executing() == ()
        ex.submit(job("c", where), {})  # waits: the one slot is held
        gate_a.touch()  # a's thread ends: b's is abandoned in its place, c gets a fresh one
        result, (_, thread) = await delivered.get("c")
        assert result.outcome == "ok" and thread == "w1-2"
        assert (ex.abandoned, ex.held) == (1, 0)
        gate_b.touch()
        await wait_until(lambda: ex.abandoned == 0, limit=BOUND)
        assert "b" not in delivered.results  # its late result was dropped
        ex.submit(job("b", where), {})  # and the key may run here again
        assert (await delivered.get("b"))[0].outcome == "ok"
    finally:
        gate_a.touch()
        gate_b.touch()
        ex.shutdown(wait=True)


async def test_cancelling_a_running_process_task_kills_it(tmp_path: Path) -> None:
    async with process_executor() as (ex, delivered):
        ex.submit(job("stuck", hog, 0, 60.0), {})
        ex.submit(job("next", where), {})
        await wait_until(lambda: "stuck" in ex.running(), limit=BOUND)
        pid = ex.running()["stuck"]
        ex.cancel("stuck")
        assert (await delivered.get("stuck"))[0].outcome == "cancelled"
        result, (ran_in, _) = await delivered.get("next")
        assert result.outcome == "ok" and ran_in != pid  # a fresh task process
        await wait_until(lambda: gone(pid), limit=BOUND)


class Payload:
    """An output or input a weak reference can watch."""


def make_payload() -> Payload:
    return Payload()


def read_payload(p: Payload) -> int:
    return 1


async def test_a_thread_lets_go_of_its_last_task_s_inputs_and_output_while_idle() -> None:
    """Once delivered and dropped by everyone else, the last task's output and inputs are
    freed with no further task. A thread's frame held them until its next job: a large
    output spilled (or sent) stayed in memory, and a worker kept over its throttle fence
    by it got no next job (MemoryStalled for ever)."""
    import gc
    import weakref

    delivered = Delivered()
    ex = Executor(1, "w4", delivered)
    try:
        ex.submit(job("make", make_payload), {})
        result, value = await delivered.get("make")
        assert result.outcome == "ok" and isinstance(value, Payload)
        output = weakref.ref(value)
        del value
        given = Payload()
        inputs = weakref.ref(given)
        ex.submit(ToRun("read", Task("read", read_payload, TaskRef("x")), "test", ()), {"x": given})
        del given
        assert (await delivered.get("read"))[0].outcome == "ok"

        def freed() -> bool:
            gc.collect()
            return output() is None and inputs() is None

        # The thread's own progress after it delivered: a bounded poll.
        await wait_until(freed, "the idle thread to let go of them", limit=BOUND, step=0.01)
    finally:
        ex.shutdown()
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)


@pytest.mark.parametrize("kind", ["long", "short"])
async def test_a_short_result_is_not_held_behind_a_long_task_run_back_to_back(
    tmp_path: Path, kind: str
) -> None:
    """A thread runs queued tasks back to back and hands their results over together,
    but a short task's result goes back before a task that may run long starts (here
    one that waits at a gate), not when that one ends, which would hold up everything
    that needs the short one: at once when the next one's kind has not run short here
    (``long``), within the batch delay when it has (``short``: a task of a kind that ran
    short may hang, as the longrun audit's hung frame, whose trivial siblings reported
    only when it returned, 7 minutes later)."""
    delivered = Delivered()
    ex = Executor(1, "w1", delivered)
    first, second = tmp_path / "first", tmp_path / "second"
    try:
        if kind == "short":
            ex.submit(ToRun("warm", Task("warm", where), kind, ()), {})
            await delivered.get("warm")  # the kind ran short here
        ex.submit(
            ToRun(
                "blocker",
                Task("blocker", held_at_gate, str(first), str(tmp_path / "b")),
                "gate",
                (),
            ),
            {},
        )
        ex.submit(ToRun("short", Task("short", where), "short", ()), {})
        long = Task("long", held_at_gate, str(second), str(tmp_path / "in"))
        ex.submit(ToRun("long", long, kind, ()), {})
        first.touch()  # blocker ends: short and long now run back to back
        await delivered.get("blocker")
        result, _ = await delivered.get("short")  # while long waits at its gate
        assert result.outcome == "ok" and not second.exists()
        await wait_until((tmp_path / "in").exists, limit=BOUND)
        assert "long" not in delivered.results
        second.touch()
        assert (await delivered.get("long"))[0].outcome == "ok"
    finally:
        first.touch()
        second.touch()
        ex.shutdown(wait=True)


@pytest.mark.parametrize("kept", [0, HOG])
async def test_a_task_process_whose_idle_memory_crept_is_replaced_between_tasks(
    kept: int,
) -> None:
    """The audit's process workers' floor crept from 300 to 440 MiB over a run (memory
    the task processes kept) until the terminate fence killed a trivial task. A task
    process whose idle RSS grew past ``recycle_over`` over its floor after its first
    task is replaced before its next task; one that kept little is not."""
    async with process_executor(recycle_over=HOG // 2) as (ex, delivered):
        pids = []
        for i, (func, arg) in enumerate([(keep, 0), (keep, 0), (keep, kept), (keep, 0)]):
            ex.submit(job(f"t{i}", func, arg), {})
            result, pid = await delivered.get(f"t{i}")
            assert result.outcome == "ok", result.error
            pids.append(pid)
        # t0 loads the modules, its process is measured idle before t1 (its fresh
        # floor) and again before t2 and t3: after t2 kept HOG, t3 runs in a new one.
        assert pids[:3] == [pids[0]] * 3
        assert (pids[3] != pids[0], ex.recycled) == ((True, 1) if kept else (False, 0))


async def test_a_task_process_is_never_replaced_for_memory_with_recycling_off() -> None:
    async with process_executor() as (ex, delivered):
        pids = []
        for i, arg in enumerate([0, 0, HOG, 0]):
            ex.submit(job(f"t{i}", keep, arg), {})
            result, pid = await delivered.get(f"t{i}")
            assert result.outcome == "ok", result.error
            pids.append(pid)
        assert set(pids) == {pids[0]} and ex.recycled == 0


CHURN = 24 * 2**20  #: under glibc's largest mmap threshold (32 MiB): the heap may keep it


@pytest.mark.skipif(GLIBC is None, reason="glibc's allocator")
async def test_a_task_process_gives_back_memory_its_tasks_freed() -> None:
    """The audit's process workers' floor crept up with memory their processes kept:
    glibc raises its mmap threshold to the size of each large block freed, so the next
    blocks of that size come from the heap and stay resident once freed. A task process
    keeps its threshold fixed (:func:`give_back_freed_memory`): what its tasks freed
    leaves its RSS."""
    async with process_executor() as (ex, delivered):
        ex.submit(job("t0", churn, CHURN, 3), {})
        result, kept = await delivered.get("t0")
        assert result.outcome == "ok", result.error
        assert kept < CHURN // 4  # before: about CHURN (24 MiB) kept


@pytest.mark.skipif(GLIBC is None, reason="glibc's allocator")
@pytest.mark.parametrize("fixed", [False, True])
def test_give_back_freed_memory_keeps_freed_blocks_out_of_the_heap(fixed: bool) -> None:
    """What the worker process (``python -m runtime worker``) calls when it starts, in a
    fresh interpreter: without it, glibc keeps the freed blocks."""
    code = (
        "import sys\n"
        "from actors.executor import give_back_freed_memory\n"
        "from tests.test_executor import churn\n"
        f"assert give_back_freed_memory() if {fixed} else True\n"
        f"print(churn({CHURN}, 3))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=4 * BOUND,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    kept = int(out.stdout)
    assert kept < CHURN // 4 if fixed else kept >= CHURN // 2
