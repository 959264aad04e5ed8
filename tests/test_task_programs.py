"""Programs a task starts (``subprocess.run`` of an external tool, as a Parsl
``bash_app`` does): in process execution they are stopped with their task's try (a
timeout, a cancel, the terminate fence, the executor's shutdown: each task process leads
a process group of its own, signalled whole), and the memory they hold counts in their
worker's samples, in both execution modes, so the memory fences act on it as on the
task's own memory.

Everything is real: the programs are child processes of the task (a Python that touches
the memory it is told, writes its pid to a file, then sleeps), and every wait polls a
condition within a bound (their pid file, their disappearance), never sleep-then-assert.
The clusters are embedded (in-process workers): no sockets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from actors.executor import (
    Executor,
    ProcessExecutor,
    descendants,
    kill_task_processes,
    rss,
    tree_rss,
)
from actors.worker import LEFT_PROGRAMS
from runtime import Cluster
from runtime.errors import TaskOutOfMemory, TaskTimeout
from tests.helpers import Cli, wait_until
from tests.test_executor import Delivered, job

pytestmark = pytest.mark.anyio
BOUND = 30  # seconds a test may take (task processes start in about a second)
TOOL_BYTES = 200 * 2**20  # what a memory-hungry tool holds

#: the external tool: writes its pid to argv[1] (whole, by a rename), touches argv[2]
#: bytes, says so (creates argv[1] + ".ready"), then sleeps argv[3] seconds
TOOL = """
import os, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
block = bytearray(int(sys.argv[2]))
block[::4096] = b"1" * len(block[::4096])
open(sys.argv[1] + ".ready", "w").close()
time.sleep(float(sys.argv[3]))
"""


def run_tool(pidfile: str, nbytes: int = 0, seconds: float = 100.0) -> int:
    """A task body: run the tool to its end (as a bash_app's command), its exit code."""
    argv = [sys.executable, "-c", TOOL, pidfile, str(nbytes), str(seconds)]
    return subprocess.run(argv, check=False).returncode


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def tool_pid(pidfile: Path, ready: bool = False) -> int:
    """The pid the tool wrote, once it has (``ready``: and touched its memory)."""
    await wait_until(pidfile.exists, f"the tool's pid in {pidfile}", limit=BOUND)
    if ready:
        done = Path(f"{pidfile}.ready")
        await wait_until(done.exists, f"the tool's memory ({done})", limit=BOUND)
    return read_pid(pidfile)


def read_pid(pidfile: Path) -> int:
    return int(pidfile.read_text())


@contextlib.contextmanager
def reaping(*pidfiles: Path) -> Iterator[None]:
    """Kill what the tools of ``pidfiles`` left running when the test ends, whatever
    happened (a test on the old code leaves them orphaned)."""
    try:
        yield
    finally:
        for pidfile in pidfiles:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


# ----------------------------------------------------------------------------- executor


@contextlib.asynccontextmanager
async def executor(
    mode: str, n: int, *pidfiles: Path
) -> AsyncIterator[tuple[Executor | ProcessExecutor, Delivered]]:
    """An executor of ``n`` slots (``mode``), shut down (waited for) on the way out,
    and the tools of ``pidfiles`` killed (:func:`reaping`)."""
    delivered = Delivered()
    ex = (ProcessExecutor if mode == "process" else Executor)(n, f"w-{mode}", delivered)
    with reaping(*pidfiles):
        try:
            yield ex, delivered
        finally:
            with anyio.fail_after(BOUND):
                await anyio.to_thread.run_sync(ex.shutdown, True)


@pytest.mark.parametrize("how", ["timeout", "cancelled", "oom"])
async def test_a_killed_task_process_takes_the_programs_its_task_started(
    tmp_path: Path, how: str
) -> None:
    pidfile = tmp_path / "tool.pid"
    async with executor("process", 1, pidfile) as (ex, delivered):
        assert isinstance(ex, ProcessExecutor)
        ex.submit(job("tool", run_tool, str(pidfile)), {})
        pid = await tool_pid(pidfile)
        (task_pid,) = ex.running().values()
        # The task process leads a process group of its own, which the tool is in; the
        # worker (this process) is never in it. (A session of its own too, unless this
        # process leads one: runtime.lifeline.own_process_group.)
        assert os.getpgid(task_pid) == task_pid
        assert os.getsid(task_pid) in (task_pid, os.getsid(0))
        assert os.getpgid(pid) == task_pid != os.getpgrp()
        assert pid in descendants(task_pid)
        if how == "cancelled":
            ex.cancel("tool")
        else:
            assert ex.kill("tool", how)
        assert (await delivered.get("tool"))[0].outcome == how
        await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)


async def test_shutdown_stops_the_program_of_a_running_task(tmp_path: Path) -> None:
    """The executor's shutdown (the worker's, on Ctrl-C or SIGTERM: the terminal's
    SIGINT no longer reaches a task process's group) stops the program of a running
    task. (One an ended task left running is killed as that task returns:
    :func:`test_programs_a_task_left_running_are_killed_and_named`.)"""
    running = tmp_path / "running.pid"
    async with executor("process", 2, running) as (ex, delivered):
        ex.submit(job("running", run_tool, str(running)), {})
        pid = await tool_pid(running)
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)
        assert (await delivered.get("running"))[0].outcome == "cancelled"
        await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_the_memory_of_programs_a_task_started_is_counted(tmp_path: Path, mode: str) -> None:
    pidfile = tmp_path / "tool.pid"
    async with executor(mode, 1, pidfile) as (ex, delivered):
        assert ex.children_rss() < TOOL_BYTES
        ex.submit(job("tool", run_tool, str(pidfile), TOOL_BYTES), {})
        pid = await tool_pid(pidfile, ready=True)
        assert ex.children_rss() >= TOOL_BYTES
        assert ex.total_rss() >= rss() + TOOL_BYTES - 2**20
        if isinstance(ex, ProcessExecutor):
            (task_pid,) = ex.running().values()
            assert tree_rss(task_pid) >= TOOL_BYTES
            running, total = ex.running_rss()
            assert running["tool"] >= TOOL_BYTES  # what the terminate fence compares
            assert total >= rss() + TOOL_BYTES
            assert ex.began()["tool"] < TOOL_BYTES  # taken before the tool ran
        os.kill(pid, signal.SIGKILL)
        assert (await delivered.get("tool"))[0].outcome == "ok"
        assert ex.children_rss() < TOOL_BYTES


async def test_kill_task_processes_takes_the_programs_their_tasks_started(tmp_path: Path) -> None:
    """What a worker process does before it exits at once (a second Ctrl-C, a lost
    lifeline): its task processes would die with it, their programs would not."""
    pidfile = tmp_path / "tool.pid"
    async with executor("process", 1, pidfile) as (ex, delivered):
        ex.submit(job("tool", run_tool, str(pidfile)), {})
        pid = await tool_pid(pidfile)
        assert kill_task_processes() >= 1
        await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)
        assert (await delivered.get("tool"))[0].outcome == "error"  # its process died


SHARED = 256 * 2**20  #: the buffer forked children share with their task
FORKS = 4


def fork_sharing(gate: str) -> int:
    """A task body: load a buffer (``SHARED`` bytes), fork ``FORKS`` children that
    share it (as ``multiprocessing`` with fork does, ``Pool(FORKS)`` after a load), say
    so (``gate + ".ready"``) and wait, with them, until the gate exists."""
    block = bytearray(SHARED)
    block[::4096] = b"1" * len(block[::4096])
    pids = []
    for _ in range(FORKS):
        pid = os.fork()
        if pid == 0:  # the child: holds the buffer, never writes it
            try:
                while not os.path.exists(gate):
                    time.sleep(0.01)
            finally:
                os._exit(0)
        pids.append(pid)
    open(gate + ".ready", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.01)
    for pid in pids:
        os.waitpid(pid, 0)
    return len(block) // 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux PSS")
async def test_forked_children_sharing_their_task_s_memory_count_it_once(tmp_path: Path) -> None:
    """A task process that loads a buffer and forks children sharing it: its sampled
    memory (what the terminate fence compares, and the worker's total) is about the
    buffer, not the buffer once more per child (their RSS each counts it whole)."""
    gate = tmp_path / "gate"
    async with executor("process", 1) as (ex, delivered):
        assert isinstance(ex, ProcessExecutor)
        try:
            ex.submit(job("forks", fork_sharing, str(gate)), {})
            ready = Path(f"{gate}.ready")
            await wait_until(ready.exists, "the children to be forked", limit=BOUND)
            (task_pid,) = ex.running().values()
            assert len(descendants(task_pid)) == FORKS
            sampled, total = ex.running_rss()
            # Counted (the task process itself holds about 100 MiB more), and once: not
            # once per process (FORKS + 1 times: 1.25 GiB more)
            assert SHARED <= sampled["forks"] < 2 * SHARED
            assert total < rss() + 2 * SHARED
            assert ex.children_rss() < 2 * SHARED
            assert tree_rss(task_pid) < 2 * SHARED
        finally:
            gate.touch()
        assert (await delivered.get("forks"))[0].outcome == "ok"


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux PSS")
async def test_forked_children_of_a_thread_worker_s_task_add_little(tmp_path: Path) -> None:
    """In thread execution the children a task forks share the worker's memory (the
    task's buffer and everything else the worker holds): they add at most what the
    worker wrote since they were forked (its pages the children still hold the old
    copies of, really held twice), never the worker's RSS once more per child.

    Here the worker is the test's own process, whose heap the event loop and the
    garbage collector keep writing: after a long test session (CI) those copies came
    to about the buffer's size, so the bound is the worker's RSS, not a fraction of
    the buffer; the old count, each child's RSS whole, is about FORKS times it."""
    gate = tmp_path / "gate"
    async with executor("thread", 1) as (ex, delivered):
        try:
            ex.submit(job("forks", fork_sharing, str(gate)), {})
            ready = Path(f"{gate}.ready")
            await wait_until(ready.exists, "the children to be forked", limit=BOUND)
            worker = rss()  # the buffer and the rest of this process
            assert ex.children_rss() < worker
            assert ex.total_rss() < 2 * worker
        finally:
            gate.touch()
        assert (await delivered.get("forks"))[0].outcome == "ok"


@pytest.mark.parametrize("interrupts", [1, 2])
async def test_ctrl_c_of_a_worker_stops_the_programs_its_tasks_started(
    tmp_path: Path, interrupts: int
) -> None:
    """A worker process in process execution, interrupted (SIGINT, as a terminal's
    Ctrl-C; twice: it exits at once) while its task runs a tool: the tool, in its task
    process's process group, which the terminal's Ctrl-C does not reach, is stopped by the
    worker."""
    pidfile = tmp_path / "tool.pid"
    port = 56400 + 20 * interrupts  # this test's ports: 56420-56439, 56440-56459
    with Cli(tmp_path / "home") as cli, reaping(pidfile), anyio.fail_after(BOUND * 2):
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        cli.line_with(manager, "manager listening on")
        address = f"ws://127.0.0.1:{port}"
        flags = [
            "--execution",
            "process",
            "--cores",
            "1",
            "--port-range",
            f"{port + 1}-{port + 19}",
        ]
        worker = cli.worker(address, *flags)
        async with Cluster(address) as c:
            fut = c.submit(run_tool, str(pidfile))
            pid = await tool_pid(pidfile)
            for _ in range(interrupts):
                worker.send_signal(signal.SIGINT)
            await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)
            await wait_until(lambda: worker.poll() is not None, "the worker's exit", limit=BOUND)
            fut.release()


# ----------------------------------------------------------------------------- multiprocessing


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def pool_map(how: str) -> tuple[int, list[int], list[str]]:
    """A task body: map over a 2-process pool (``how``: a fork ``multiprocessing.Pool``
    or a ``ProcessPoolExecutor``), closed at the ``with``'s exit; the sum, the pids that
    did the work, and each pool process's SIGTERM action, as it saw it."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if how == "pool":
        with mp.get_context("fork").Pool(2) as pool:
            done = pool.map(_square_and_pid, range(20))
            actions = pool.map(_sigterm_action, range(2))
    else:
        with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
            done = list(ex.map(_square_and_pid, range(20)))
            actions = list(ex.map(_sigterm_action, range(2)))
    return sum(n for n, _ in done), sorted({pid for _, pid in done}), actions


def _sigterm_action(_: int) -> str:
    return repr(signal.getsignal(signal.SIGTERM))


def pool_and_wait(how: str, pidfile: str) -> int:
    """A task body: start a 2-process pool (``how`` as :func:`pool_map`), write its
    processes' pids to ``pidfile`` (whole, by a rename), then wait for ever."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if how == "pool":
        pool = mp.get_context("fork").Pool(2)
        pids = [p.pid for p in pool._pool]  # type: ignore[attr-defined]
    else:
        ex = ProcessPoolExecutor(2, mp_context=mp.get_context("fork"))
        list(ex.map(_square_and_pid, range(2)))  # (its processes start as work comes)
        pids = list(ex._processes)
    tmp = Path(pidfile + ".tmp")
    tmp.write_text(" ".join(map(str, pids)))
    tmp.rename(pidfile)
    while True:
        time.sleep(1)


@pytest.mark.parametrize("how", ["pool", "executor"])
async def test_a_task_process_s_task_can_use_a_multiprocessing_pool(how: str) -> None:
    """A task in process execution maps over a pool of 2 processes and returns: the
    task process is not daemonic (a daemonic process may start no child: every pool
    failed with 'daemonic processes are not allowed to have children'), and the pool's
    processes have SIGTERM's default action, not the task process's no-op, which made
    ``Pool.terminate`` at the ``with``'s exit hang on workers that never stopped. Five
    tasks in a row, in the same task process."""
    async with executor("process", 1) as (ex, delivered):
        assert isinstance(ex, ProcessExecutor)
        for i in range(5):
            ex.submit(job(f"{how}-{i}", pool_map, how), {})
            result, value = await delivered.get(f"{how}-{i}")
            assert result.outcome == "ok", result.error
            total, pids, actions = value
            assert total == sum(x * x for x in range(20))
            assert 1 <= len(pids) <= 2 and not set(pids) & set(ex.pids())  # real processes
            assert actions == [repr(signal.SIG_DFL)] * 2
        (task_pid,) = ex.pids()
        assert descendants(task_pid) == []  # each pool was closed with its task


@pytest.mark.parametrize("how", ["pool", "executor"])
async def test_a_cancelled_task_s_pool_processes_are_gone(tmp_path: Path, how: str) -> None:
    pidfile = tmp_path / "pool.pid"
    async with executor("process", 1) as (ex, delivered):
        ex.submit(job("pool", pool_and_wait, how, str(pidfile)), {})
        await wait_until(pidfile.exists, "the pool's pids", limit=BOUND)
        pids = list(map(int, pidfile.read_text().split()))
        assert len(pids) == 2 and not any(gone(p) for p in pids)
        ex.cancel("pool")
        assert (await delivered.get("pool"))[0].outcome == "cancelled"
        await wait_until(lambda: all(gone(p) for p in pids), "the pool to be gone", limit=BOUND)


# ----------------------------------------------------------------------------- left running


def leave_sleep(pidfile: str) -> int:
    """A task body: start ``sleep 600`` and return without waiting for it; its pid is
    in ``pidfile``."""
    pid = subprocess.Popen(["sleep", "600"]).pid
    tmp = Path(pidfile + ".tmp")
    tmp.write_text(str(pid))
    tmp.rename(pidfile)
    return pid


async def test_programs_a_task_left_running_are_killed_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that returns with a program still running (a ``Popen`` it did not wait
    for): the program is killed before its result comes, the worker says so at warning
    with the task's key and the program, and the next task in the slot starts without
    it (it counted in that task's memory, and got it killed at the terminate fence)."""
    pidfile = tmp_path / "sleep.pid"
    with caplog.at_level("WARNING", logger="corral"):
        async with executor("process", 1, pidfile) as (ex, delivered):
            assert isinstance(ex, ProcessExecutor)
            ex.submit(job("leaves-sleep", leave_sleep, str(pidfile)), {})
            result, pid = await delivered.get("leaves-sleep")
            assert result.outcome == "ok", result.error
            await wait_until(lambda: gone(pid), "the sleep to be gone", limit=BOUND)
            (task_pid,) = ex.pids()
            assert descendants(task_pid) == []  # reaped too: no zombie left
            (record,) = [r for r in caplog.records if "left programs running" in r.getMessage()]
            assert "leaves-sleep" in record.getMessage()
            assert f"sleep (pid {pid}," in record.getMessage()
            ex.submit(job("next", sum, [1, 2]), {})
            assert (await delivered.get("next"))[1] == 3
            assert ex.pids() == [task_pid]  # the same task process went on
    assert len([r for r in caplog.records if "left programs running" in r.getMessage()]) == 1


def joblib_squares() -> tuple[int, list[int]]:
    """A task body: ``joblib.Parallel(n_jobs=2)`` (loky, its default backend, which
    scikit-learn's ``n_jobs`` uses) over 4 items; the sum and the pids that did them."""
    import joblib

    done = joblib.Parallel(n_jobs=2)(joblib.delayed(_square_and_pid)(x) for x in range(4))
    return sum(n for n, _ in done), sorted({pid for _, pid in done})


async def test_consecutive_joblib_tasks_each_get_a_working_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two tasks in a row in one task process each run ``joblib.Parallel(n_jobs=2)``:
    both succeed in parallel. loky keeps its pool (and its resource tracker) for the next
    call; killed as the first task's leftovers, the pool was handed to the second with
    its workers dead (``TerminatedWorkerError``). It is shut down at each task's end
    instead, so nothing of it is left running (nor reported as left)."""
    with caplog.at_level("WARNING", logger="corral"):
        async with executor("process", 1) as (ex, delivered):
            for i in range(2):
                ex.submit(job(f"joblib-{i}", joblib_squares), {})
                result, value = await delivered.get(f"joblib-{i}")
                assert result.outcome == "ok", result.error
                total, pids = value
                assert total == sum(x * x for x in range(4))
                assert pids and not set(pids) & set(ex.pids())  # its own processes
                (task_pid,) = ex.pids()
                assert not set(pids) & set(descendants(task_pid))  # the pool is gone
    assert not [r for r in caplog.records if "left programs running" in r.getMessage()]


#: a task process's kept pool (:func:`kept_pool_squares`), for the next task
_KEPT: dict[str, Any] = {}


def kept_pool_squares(how: str) -> tuple[int, list[int]]:
    """A task body: map over a 2-process pool (``how`` as :func:`pool_map`) that the
    task process keeps, unclosed, for the next task; the sum and the pids."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if how not in _KEPT:
        ctx = mp.get_context("fork")
        _KEPT[how] = ctx.Pool(2) if how == "pool" else ProcessPoolExecutor(2, mp_context=ctx)
    done = list(_KEPT[how].map(_square_and_pid, range(20)))
    return sum(n for n, _ in done), sorted({pid for _, pid in done})


@pytest.mark.parametrize("how", ["pool", "executor"])
async def test_a_pool_kept_for_the_next_task_keeps_working(how: str) -> None:
    """A task leaves a pool it keeps (a module-level ``Pool`` or ``ProcessPoolExecutor``,
    unclosed): its processes are not killed as leftovers, so the next task uses it (a
    killed pool was broken: ``BrokenProcessPool``, or a ``Pool`` that hangs)."""
    async with executor("process", 1) as (ex, delivered):
        seen = []
        for i in range(2):
            ex.submit(job(f"{how}-{i}", kept_pool_squares, how), {})
            result, value = await delivered.get(f"{how}-{i}")
            assert result.outcome == "ok", result.error
            assert value[0] == sum(x * x for x in range(20))
            seen.append(value[1])
        assert set(seen[1]) <= set(descendants(ex.pids()[0]))  # the same, kept processes


def leave_shell_with_child(pidfile: str) -> int:
    """A task body: start a shell that starts ``sleep 600`` (its child, the task
    process's grandchild) and return without waiting; the sleep's pid is in
    ``pidfile``."""
    subprocess.Popen(
        ["sh", "-c", f"sleep 600 & echo $! > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"]
    )
    while not Path(pidfile).exists():
        time.sleep(0.01)
    pid = int(Path(pidfile).read_text())
    # ``$!`` is known once the shell forks, before the child has become ``sleep``:
    # return only once it has, so the leftover is named by what it runs
    deadline = time.monotonic() + 10
    while psutil.Process(pid).name() != "sleep":
        assert time.monotonic() < deadline, "the shell's child never became sleep"
        time.sleep(0.01)
    return pid


async def test_a_program_s_children_left_running_are_killed_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task leaves a shell running with a child of its own: both are killed and named
    (the child is not the task process's to reap: it is only seen gone or a zombie, for
    a bounded time, so where PID 1 does not reap it does not hold the result back)."""
    pidfile = tmp_path / "sleep.pid"
    with caplog.at_level("WARNING", logger="corral"):
        async with executor("process", 1, pidfile) as (ex, delivered):
            ex.submit(job("shell", leave_shell_with_child, str(pidfile)), {})
            result, pid = await delivered.get("shell")
            assert result.outcome == "ok", result.error
            # (killed before the result came; it may take the kernel a moment)
            await wait_until(lambda: gone(pid), "the sleep to be gone", limit=BOUND)
    (record,) = [r for r in caplog.records if "left programs running" in r.getMessage()]
    assert f"sleep (pid {pid}," in record.getMessage() and "sh (pid" in record.getMessage()


def leave_daemon(pidfile: str, setsid: bool) -> int:
    """A task body: start a daemon the classic way (fork; the child, in a session of
    its own with ``setsid``, forks ``sleep 600`` and exits at once) and return; the
    sleep's pid (written to ``pidfile`` by its own shell before it execs)."""
    pid = os.fork()
    if pid == 0:
        if setsid:
            os.setsid()
        if os.fork() == 0:
            script = f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 600"
            os.execvp("sh", ["sh", "-c", script])
        os._exit(0)
    os.waitpid(pid, 0)  # the middle one is gone: the daemon is an orphan now
    deadline = time.monotonic() + 10
    while (
        not Path(pidfile).exists()
        or psutil.Process(daemon := int(Path(pidfile).read_text())).name() != "sleep"
    ):
        assert time.monotonic() < deadline, "the daemon never became sleep"
        time.sleep(0.01)
    return daemon


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER")
@pytest.mark.parametrize("setsid", [False, True])
async def test_a_daemon_a_task_left_running_is_killed_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, setsid: bool
) -> None:
    """A task double-forks a daemon (also one in a session of its own) and returns: the
    daemon, an orphan, went to init and ran on (a left-over audit problem). The task
    process adopts its orphans now, so the daemon is killed and named with the other
    leftovers, and reaped: nothing is left under the task process."""
    pidfile = tmp_path / "daemon.pid"
    with caplog.at_level("WARNING", logger="corral"):
        async with executor("process", 1, pidfile) as (ex, delivered):
            ex.submit(job("daemon", leave_daemon, str(pidfile), setsid), {})
            result, pid = await delivered.get("daemon")
            assert result.outcome == "ok", result.error
            await wait_until(lambda: gone(pid), "the daemon to be gone", limit=BOUND)
            (task_pid,) = ex.pids()
            await wait_until(lambda: descendants(task_pid) == [], "its reaping", limit=BOUND)
    (record,) = [r for r in caplog.records if "left programs running" in r.getMessage()]
    assert f"sleep (pid {pid}," in record.getMessage()


def daemon_then_wait(pidfile: str) -> int:
    """A task body: start a daemon in a session of its own (:func:`leave_daemon`), then
    hang, as a task that started a server and waits on it."""
    leave_daemon(pidfile, True)
    time.sleep(100)
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER")
@pytest.mark.parametrize("how", ["timeout", "cancelled"])
async def test_a_daemon_of_a_session_of_its_own_goes_with_a_stopped_try(
    tmp_path: Path, how: str
) -> None:
    """An audit: a task that started a daemon with ``setsid`` (a session and process
    group of its own) and was then stopped (its timeout, a cancel) left the daemon
    running: the kill of the task process's group missed it, and with the task process
    gone it went to init. The task process's descendants (the daemon among them: it
    adopts its orphans) are killed first now, while they are still under it."""
    pidfile = tmp_path / "daemon.pid"
    async with executor("process", 1, pidfile) as (ex, delivered):
        assert isinstance(ex, ProcessExecutor)
        ex.submit(job("daemon", daemon_then_wait, str(pidfile)), {})
        await wait_until(pidfile.exists, "the daemon's pid", limit=BOUND)
        await wait_until(
            lambda: psutil.Process(read_pid(pidfile)).name() == "sleep", "its exec", limit=BOUND
        )
        pid = read_pid(pidfile)
        (task_pid,) = ex.running().values()
        assert os.getsid(pid) == os.getpgid(pid) != os.getpgid(task_pid)  # out of its group
        if how == "cancelled":
            ex.cancel("daemon")
        else:
            assert ex.kill("daemon", how)
        assert (await delivered.get("daemon"))[0].outcome == how
        await wait_until(lambda: gone(pid), "the daemon to be gone", limit=BOUND)


# ----------------------------------------------------------------------------- cluster

PROCESS = {"workers": 1, "threads_per_worker": 1, "memory_options": {"execution": "process"}}


async def test_a_timeout_stops_the_program_its_task_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "tool.pid"
    with reaping(pidfile), anyio.fail_after(BOUND):
        async with Cluster(**PROCESS) as c:
            await c.wait_for_workers(1, timeout=BOUND)
            # A try's time counts from when it begins, which in a task process includes
            # loading its function: this module is loaded there once beforehand.
            assert await c.submit(run_tool, str(tmp_path / "warm.pid"), 0, 0.0) == 0
            fut = c.submit(run_tool, str(pidfile), timeout=2)
            pid = await tool_pid(pidfile)
            with pytest.raises(TaskTimeout) as info:
                await fut
            assert info.value.stopped and "the programs it started" in str(info.value)
            await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)


async def test_a_cancel_stops_the_program_its_task_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "tool.pid"
    with reaping(pidfile), anyio.fail_after(BOUND):
        async with Cluster(**PROCESS) as c:
            await c.wait_for_workers(1, timeout=BOUND)
            fut = c.submit(run_tool, str(pidfile))
            pid = await tool_pid(pidfile)
            await c.cancel(fut)
            await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)
            assert await c.submit(sum, [1, 2]) == 3  # the slot went on


async def test_a_timeout_in_thread_execution_says_its_program_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The error says so, and the worker warns naming the program and its pid (it
    said nothing of them: a program a hung thread started ran on unseen)."""
    pidfile = tmp_path / "tool.pid"
    with reaping(pidfile), anyio.fail_after(BOUND), caplog.at_level("WARNING"):
        async with Cluster(workers=1, threads_per_worker=1) as c:
            await c.wait_for_workers(1, timeout=BOUND)
            fut = c.submit(run_tool, str(pidfile), 0, 30.0, timeout=0.5)
            pid = await tool_pid(pidfile)
            with pytest.raises(TaskTimeout) as info:
                await fut
            err = info.value
            assert not err.stopped and "given up there, but not stopped" in str(err)
            assert 'execution="process"' in str(err)
            assert not gone(pid)  # as it says: nothing stopped it
            (said,) = [r.getMessage() for r in caplog.records if LEFT_PROGRAMS in r.getMessage()]
            name = psutil.Process(pid).name()
            assert f"programs='{name} (pid {pid})'" in said, said
            assert f"key='{fut.key}'" in said, said
            os.kill(pid, signal.SIGKILL)  # the abandoned thread's call returns


async def test_the_terminate_fence_kills_a_task_whose_program_holds_the_memory(
    tmp_path: Path,
) -> None:
    """A worker (process execution, spill off) whose task's tool takes it past its
    terminate fence: its sample counts the tool, so the task is killed (``oom``), the
    tool with it, and the worker lives on, as for memory the task held itself."""
    pidfile = tmp_path / "tool.pid"
    base = psutil.Process().memory_info().rss  # in-process workers share this process's
    limit = base + 400 * 2**20  # a task process takes about 100 MiB of it
    tool = 600 * 2**20
    options = {"execution": "process", "spill": None}
    with reaping(pidfile), anyio.fail_after(BOUND):
        async with Cluster(
            workers=1, threads_per_worker=1, memory_per_worker=limit, memory_options=options
        ) as c:
            await c.wait_for_workers(1, timeout=BOUND)
            fut = c.submit(run_tool, str(pidfile), tool, 60.0)
            with pytest.raises(TaskOutOfMemory) as info:
                await fut
            err = info.value
            # Killed as the tool's memory climbed: the worker and its task process alone
            # hold about base + 100 MiB, well under the fence.
            assert err.limit == limit and err.rss >= 0.95 * limit
            pid = read_pid(pidfile)
            await wait_until(lambda: gone(pid), "the tool to be gone", limit=BOUND)
            assert await c.submit(sum, [1, 2, 3]) == 6  # the worker lives on
            assert (await c.status())["categories"]["run_tool"]["oom"] == 1


def test_a_timeout_s_message_says_what_was_stopped() -> None:
    stopped = TaskTimeout("k", "w-1", 1.0, 1.5)
    given_up = TaskTimeout("k", "w-1", 1.0, 1.5, stopped=False)
    assert stopped.stopped and "was stopped there" in str(stopped)
    assert not given_up.stopped and "not stopped" in str(given_up)
    assert "was stopped there" not in str(given_up)


# ----------------------------------------------------------------------------- descriptors


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_thread_executors_leave_no_descriptor_open_once_shut_down() -> None:
    """A thread executor keeps a descriptor open per thread (its list of children) for
    its memory samples: its shutdown closes them, and a sample after it opens none (an
    embedded cluster that closes leaves none behind)."""
    await anyio.to_thread.run_sync(rss)  # (anyio's worker thread; rss() keeps its file)
    before = open_fds()
    for i in range(5):
        ex = Executor(4, f"w-fds-{i}", Delivered())
        assert ex.children_rss() == 0  # (the descriptors are open now)
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)
        assert ex.children_rss() == 0
    assert open_fds() == before


# ----------------------------------------------------------------------------- pid reuse


def exited(pid: int) -> bool:
    """Whether child ``pid`` has ended, every thread of it (it can be reaped), without
    reaping it. (Its main thread shows as a zombie before its other threads end.)"""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="tells a reaped child by waitid")
@pytest.mark.parametrize("how", ["stopped", "died-idle"])
async def test_a_task_process_is_never_signalled_by_number_once_reaped(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Without a pidfd (macOS, Linux before 5.3) or without group signals through one
    (Linux before 6.9), a task process and its group are signalled by number: only
    before it is reaped (its number, and its group's, may be another process's after).
    ``stopped``: the executor's shutdown stops it; ``died-idle``: it died between tasks
    and is replaced when the next comes."""
    from actors import executor as module

    monkeypatch.delattr(os, "pidfd_open", raising=False)
    monkeypatch.setattr(module, "_pidfd_groups", False)
    calls: list[tuple[str, int, bool]] = []

    def recording(name: str, real: Any) -> Any:
        def call(pid: int, sig: int) -> None:
            try:  # (never reaps: WNOWAIT)
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                reaped = False
            except ChildProcessError:
                reaped = True
            calls.append((name, pid, reaped))
            real(pid, sig)

        return call

    async with executor("process", 1) as (ex, delivered):
        assert isinstance(ex, ProcessExecutor)
        ex.submit(job("first", sum, [1, 2]), {})
        assert (await delivered.get("first"))[0].outcome == "ok"
        (task_pid,) = ex.pids()
        if how == "died-idle":
            os.kill(task_pid, signal.SIGKILL)
            await wait_until(lambda: exited(task_pid), "the task process to end", limit=BOUND)
        monkeypatch.setattr(os, "kill", recording("kill", os.kill))
        monkeypatch.setattr(os, "killpg", recording("killpg", os.killpg))
        if how == "died-idle":
            ex.submit(job("next", sum, [3, 4]), {})
            result = (await delivered.get("next"))[0]
            assert result.outcome == "ok", result.error
        else:
            with anyio.fail_after(BOUND):
                await anyio.to_thread.run_sync(ex.shutdown, True)
    ours = [c for c in calls if c[1] == task_pid]
    assert ("killpg", task_pid, False) in ours  # its group was signalled ...
    assert not [c for c in ours if c[2]]  # ... and nothing once it was reaped


# ----------------------------------------------------------------------------- killed outright


def start_and_wait(pidfile: str, own_group: bool) -> int:
    """A task body: start ``sleep 300`` (with ``own_group``, in a process group of its
    own, as a shell with job control runs its pipelines), write ``<its pid> <this
    process's pid> <this process's parent's pid> <this process's session>`` to
    ``pidfile`` (whole, by a rename) and wait for it. Its retry, once the file is
    there, returns at once."""
    path = Path(pidfile)
    if path.exists():
        return 0
    program = subprocess.Popen(["sleep", "300"], process_group=0 if own_group else None)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{program.pid} {os.getpid()} {os.getppid()} {os.getsid(0)}")
    tmp.rename(path)
    return program.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions are read in /proc")
@pytest.mark.parametrize(
    ("execution", "own_group", "port"),
    [("process", False, 40510), ("thread", False, 40530), ("thread", True, 40550)],
)
async def test_a_worker_killed_outright_takes_the_programs_its_tasks_started(
    tmp_path: Path, execution: str, own_group: bool, port: int
) -> None:
    """A worker process that the OOM killer (or ``kill -9``) ends runs nothing more: the
    program its task started (a task process's child, in process execution; its own,
    in thread execution, also in a process group of its own) was left running,
    re-parented to init. Its parent, the cluster's local process provider, now kills
    what is left in the worker's session once the worker has exited."""
    pidfile = tmp_path / "program.pid"
    pool = {
        "provider": "local",
        "execution": execution,
        "worker_port_range": f"{port + 1}-{port + 19}",
    }
    with anyio.fail_after(BOUND * 2):  # (two worker processes start)
        try:
            async with Cluster(pools={"p": pool}, processes=True, port=port) as c:
                fut = c.submit(start_and_wait, str(pidfile), own_group)
                await wait_until(pidfile.exists, f"the program's pid in {pidfile}", limit=BOUND)
                program, runner, parent, session = map(int, pidfile.read_text().split())
                worker = runner if execution == "thread" else parent
                line = [arg for arg in psutil.Process(worker).cmdline() if arg != "-P"]
                assert line[1:4] == ["-m", "runtime", "worker"]
                assert not gone(program)
                os.kill(worker, signal.SIGKILL)
                await wait_until(lambda: gone(program), "the program to be gone", limit=20)
                assert session == worker  # a task process stayed in its worker's session
                fut.release()
        finally:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
