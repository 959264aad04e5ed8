"""Tests for local worker processes (actors/processes.py), with real processes.

The children are the small programs in ``tests/helpers_child.py``. Every test is bounded
with ``anyio.fail_after``; nothing sleeps and then asserts: the tests wait on process
exits, on pipes, or poll a condition (a child's log line, a pid being gone) in short
steps inside such a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psutil
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from actors.autoscaler import Autoscaler, PoolTarget
from actors.processes import (
    LIFELINE_ENV,
    LIFELINE_EXIT_CODE,
    LocalProcessProvider,
    describe_exit,
    run_command,
    spawn_child,
)
from actors.providers import Block, BlockSpec, BlockState
from runtime.kernel import Actor, ActorSystem, handles
from runtime.lifeline import (
    ORPHANED_EXIT_CODE,
    die_with_parent_preexec,
    kill_session,
    session_members,
)
from runtime.messages import WorkerGone
from tests.helpers import LogLines, log_lines, wait_until

pytestmark = pytest.mark.anyio

LIMIT = 15.0  # seconds; the bound on every test (a child takes ~0.5 s to import anyio)
CHILD = [sys.executable, str(Path(__file__).with_name("helpers_child.py"))]


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def corral_log() -> Iterator[LogLines]:
    with log_lines() as lines:
        yield lines


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (a zombie waiting for init to reap it counts)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def sleeper(*flags: str) -> Callable[[str, int], list[str]]:
    return lambda block_id, index: [*CHILD, "sleep", *flags]


async def one_child_block(mode: str) -> None:
    """A block of one ``helpers_child.py MODE`` child, run until it completes."""
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(lambda b, i: [*CHILD, mode]) as provider:
            block = await provider.start_block(BlockSpec())
            assert await provider.wait_ended(block) is BlockState.COMPLETED


async def wait_ready(log: LogLines, provider: LocalProcessProvider, block: Block) -> dict[str, int]:
    pids = provider.pids(block)
    await wait_until(lambda: all(log.has(f"ready {pid} {wid}") for wid, pid in pids.items()))
    return pids


# ----------------------------------------------------------------------------- spawn_child


async def test_closing_the_lifeline_ends_a_watching_child() -> None:
    with anyio.fail_after(LIMIT):
        child = await spawn_child([*CHILD, "sleep", "--hook"], pdeathsig=None)
        async with child:
            assert child.stdout is not None
            lines = BufferedByteReceiveStream(child.stdout)
            ready = await lines.receive_until(b"\n", 1000)
            assert ready.startswith(f"ready {child.pid} ".encode())
            child.close_lifeline()
            assert await lines.receive_until(b"\n", 1000) == b"hook ran"
            assert await child.wait() == LIFELINE_EXIT_CODE
    assert gone(child.pid)


async def test_a_child_without_lifeline_has_no_lifeline_variable() -> None:
    code = f"import os; print(os.environ.get({LIFELINE_ENV!r}, 'none'))"
    with anyio.fail_after(LIMIT):
        async with await spawn_child(
            [sys.executable, "-c", code], env={**os.environ, LIFELINE_ENV: "7"}, lifeline=False
        ) as child:
            assert child.stdout is not None
            line = await BufferedByteReceiveStream(child.stdout).receive_until(b"\n", 100)
            assert line == b"none"
            assert await child.wait() == 0


async def test_run_command_returns_status_and_both_outputs() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    with anyio.fail_after(LIMIT):
        done = await run_command([sys.executable, "-c", code])
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")
    with pytest.raises(FileNotFoundError):
        await run_command(["/no/such/program"])


@pytest.mark.parametrize("start", ["run_command", "spawn_child"])
def test_a_start_cancelled_halfway_leaves_no_child_behind(
    start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncio starts a child in steps (fork and exec, then a task connecting its pipes);
    # cancelled between them and then left by an event loop that ends, it abandoned the
    # child: never reaped ("subprocess N is still running"), a pipe never closed. A
    # Slurm provider closing while its squeue started did that. The cancellation here
    # lands after the k-th turn of the loop, which covers every step; each run ends its
    # loop at once, then the thread asyncio waits for the child with must have ended.
    leaks: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: leaks.append(repr(u.exc_value)))
    pids: list[int] = []

    async def cancelled_start(turns: int) -> None:
        loop = asyncio.get_running_loop()
        with anyio.CancelScope() as scope:

            def after(n: int) -> None:
                if n == 0:
                    scope.cancel()
                else:
                    loop.call_soon(after, n - 1)

            loop.call_soon(after, turns)
            if start == "run_command":
                await run_command(["sleep", "1"])
            else:
                async with await spawn_child(["sleep", "1"], lifeline=False) as child:
                    pids.append(child.pid)  # started before the cancellation: owned here
                    await anyio.sleep_forever()
        assert scope.cancelled_caught

    for turns in range(10):
        anyio.run(cancelled_start, turns)
        for thread in threading.enumerate():
            if thread.name.startswith("waitpid-"):  # asyncio's ThreadedChildWatcher
                thread.join(timeout=LIMIT)
                assert not thread.is_alive(), f"{thread.name}: a child still runs"
        gc.collect()
        assert leaks == [], f"cancelled after {turns} turns"
    assert all(gone(pid) for pid in pids)


def test_a_child_whose_parent_died_before_prctl_exits_at_once() -> None:
    # The check after prctl compares getppid() with the pid that spawned the child; a
    # pid that cannot be the parent's stands for "the parent died and we were adopted".
    setup = die_with_parent_preexec(signal.SIGTERM, parent_pid=-1)
    if setup is None:
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    done = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        preexec_fn=setup,
        stdout=subprocess.PIPE,
        timeout=LIMIT,
        check=False,
    )
    assert done.stdout == b""  # it never reached exec
    assert done.returncode == ORPHANED_EXIT_CODE


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-9) == "killed by SIGKILL (signal 9)"


# ----------------------------------------------------------------------------- blocks


async def test_block_runs_forwards_output_and_scales_in(corral_log: LogLines) -> None:
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(sleeper(), grace=5.0) as provider:
            block = await provider.start_block(BlockSpec(workers=2))
            assert provider.poll(block) is BlockState.RUNNING
            assert block.workers == ["worker-1.0", "worker-1.1"]
            pids = await wait_ready(corral_log, provider, block)
            assert all(psutil.pid_exists(pid) for pid in pids.values())
            for wid, pid in pids.items():  # the child's id is on its forwarded lines
                assert corral_log.has(f"ready {pid} {wid}", f"child='{wid}'", "stream='stdout'")

            await provider.stop_block(block)
            assert block.state is BlockState.SCALED_IN
            assert provider.poll(block) is BlockState.SCALED_IN
            assert await provider.wait_ended(block) is BlockState.SCALED_IN
            assert "worker-1.0 killed by SIGTERM" in block.detail
            # Reaped by us: the pids do not even exist as zombies.
            assert not any(psutil.pid_exists(pid) for pid in pids.values())


async def test_exit_code_3_fails_the_block(corral_log: LogLines) -> None:
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(lambda b, i: [*CHILD, "exit", "3"]) as provider:
            block = await provider.start_block(BlockSpec())
            assert await provider.wait_ended(block) is BlockState.FAILED
            assert "exit code 3" in block.detail
            assert block.detail.startswith("worker-1 failed")
            assert corral_log.has("exiting 3", "child='worker-1'")


async def test_a_corral_childs_record_is_logged_with_its_own_event_and_fields(
    corral_log: LogLines,
) -> None:
    """A Corral child (a worker) writes its records as JSON lines for the provider,
    which logs each at the child's level with its event and fields, and the child's id:
    before, the child's whole rendered line was quoted inside one event, with two
    timestamps and nested quoting."""
    await one_child_block("log")
    line = corral_log.with_("disk nearly full")
    assert line is not None
    assert line.startswith("timestamp=") and line.count("timestamp=") == 1
    assert "level='warning' event='disk nearly full'" in line
    assert "free=12 where=['a b'] child='worker-1' stream='stderr'" in line


async def test_exit_code_0_completes_the_block() -> None:
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(lambda b, i: [*CHILD, "exit", "0"]) as provider:
            block = await provider.start_block(BlockSpec(workers=2))
            assert await provider.wait_ended(block) is BlockState.COMPLETED
            assert block.detail == "completed: worker-1.0 exit code 0, worker-1.1 exit code 0"


async def test_a_provision_delay_holds_the_block_pending_then_starts_it(
    corral_log: LogLines,
) -> None:
    delay = 0.5
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(sleeper(), provision_delay=delay) as provider:
            t0 = time.monotonic()
            block = await provider.start_block(BlockSpec(workers=2))
            assert block.state is BlockState.PENDING
            assert block.workers == ["worker-1.0", "worker-1.1"]  # known while pending
            assert provider.pids(block) == {}
            await wait_until(lambda: block.state is BlockState.RUNNING, "the block to run")
            assert time.monotonic() - t0 >= delay
            await wait_ready(corral_log, provider, block)
            assert set(provider.pids(block)) == {"worker-1.0", "worker-1.1"}

            pending = await provider.start_block(BlockSpec())
            assert pending.state is BlockState.PENDING
            await provider.stop_block(pending)  # stopped while pending: nothing starts
            assert await provider.wait_ended(pending) is BlockState.SCALED_IN
            assert provider.pids(pending) == {}
    with pytest.raises(ValueError, match="provision_delay"):
        LocalProcessProvider(sleeper(), provision_delay=-1)


async def test_a_pools_provider_names_its_blocks_in_its_log_lines_as_the_autoscaler_does(
    corral_log: LogLines,
) -> None:
    """Two pools' providers both have a ``block-1``: their log lines say ``build/block-1``
    and ``scarce/block-1``, the documented block id (``<pool>/block-<n>``), as the
    autoscaler's lines do. Before, both said ``block='block-1'``."""
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(
            lambda b, i: [*CHILD, "exit", "0"], pool="build", provision_delay=0.01
        ) as provider:  # fmt: skip
            block = await provider.start_block(BlockSpec(pool="build"))
            assert block.block_id == "block-1"  # the provider's own id (the core adds the pool)
            assert await provider.wait_ended(block) is BlockState.COMPLETED
    for event in ("block pending", "block started", "block ended"):
        assert corral_log.has(f"event='{event}'", "block='build/block-1'"), event
    assert not corral_log.has("block='block-1'")


async def test_processes_that_end_while_the_block_starts() -> None:
    """``true`` may exit before its siblings are even spawned: the block still waits."""
    true, false = shutil.which("true"), shutil.which("false")
    assert true is not None and false is not None
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(lambda b, i: [true]) as provider:
            block = await provider.start_block(BlockSpec(workers=5))
            assert await provider.wait_ended(block) is BlockState.COMPLETED
            assert block.detail.count("exit code 0") == 5
        async with LocalProcessProvider(
            lambda b, i: [false] if i == 0 else [*CHILD, "sleep"]
        ) as provider:
            block = await provider.start_block(BlockSpec(workers=3))
            assert await provider.wait_ended(block) is BlockState.FAILED
            assert block.detail.startswith("worker-1.0 failed: exit code 1")
            assert not any(psutil.pid_exists(pid) for pid in provider.pids(block).values())


async def test_sigkill_from_outside_fails_the_block_and_stops_the_rest(
    corral_log: LogLines,
) -> None:
    """One worker of a block is killed (SIGKILL): the block fails and the rest of it
    is stopped, so that the autoscaler replaces it whole (a block that ran on short of
    a worker was counted at full size and never replaced: a review found it)."""
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(sleeper(), grace=5.0) as provider:
            block = await provider.start_block(BlockSpec(workers=2))
            pids = await wait_ready(corral_log, provider, block)
            os.kill(pids["worker-1.0"], signal.SIGKILL)
            assert await provider.wait_ended(block) is BlockState.FAILED
            assert block.detail.startswith("worker-1.0 failed: killed by SIGKILL (signal 9)")
            assert "stopped the rest of the block: worker-1.1 killed by SIGTERM" in block.detail
            assert not any(psutil.pid_exists(pid) for pid in pids.values())


async def test_a_worker_failing_after_the_rest_ended_says_so(tmp_path: Path) -> None:
    """The last worker of a block fails after the others ended on their own: nothing
    is left to stop, and the block's detail says the rest had ended (not stopped)."""
    true, sh = shutil.which("true"), shutil.which("sh")
    assert true is not None and sh is not None
    flag = tmp_path / "go"
    last = [sh, "-c", f"until [ -e '{flag}' ]; do sleep 0.05; done; exit 3"]
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(lambda b, i: [true] if i == 0 else last) as provider:
            block = await provider.start_block(BlockSpec(workers=2))
            rec = provider._record(block)
            await wait_until(lambda: not rec.starting and rec.live == 1, "worker-1.0 to end")
            flag.touch()
            assert await provider.wait_ended(block) is BlockState.FAILED
            assert block.detail == (
                "worker-1.1 failed: exit code 3; the rest had ended: worker-1.0 exit code 0"
            )


async def test_a_worker_killed_by_the_oom_killer_ends_its_block_oom(
    corral_log: LogLines, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGKILL while the worker's memory cgroup counted an OOM kill (``oom_kill`` in
    ``memory.events`` went up): the block ends OOM (its workers lost with cause
    ``oom``), not FAILED (``crash``). A SIGKILL without such a count stays FAILED."""
    import actors.processes as processes

    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\n")
    monkeypatch.setattr(processes, "_oom_events", lambda pid: (events, 2))
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(sleeper(), grace=5.0) as provider:
            plain = await provider.start_block(BlockSpec(workers=1))
            pids = await wait_ready(corral_log, provider, plain)
            os.kill(pids["worker-1"], signal.SIGKILL)
            assert await provider.wait_ended(plain) is BlockState.FAILED
            assert plain.detail == "worker-1 failed: killed by SIGKILL (signal 9)"

            oom = await provider.start_block(BlockSpec(workers=1))
            pids = await wait_ready(corral_log, provider, oom)
            events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 3\n")  # the kernel
            os.kill(pids["worker-2"], signal.SIGKILL)
            assert await provider.wait_ended(oom) is BlockState.OOM
            assert oom.detail == (
                f"worker-2 failed: killed by SIGKILL (signal 9) "
                f"(the OOM killer: oom_kill in {events} went 2 -> 3)"
            )


def test_the_oom_kill_count_is_read_from_the_memory_cgroup(tmp_path: Path) -> None:
    from actors.processes import _oom_events, _oom_kills

    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    assert (_oom_kills(v2), _oom_kills(v1), _oom_kills(tmp_path / "none")) == (1, 4, None)
    found = _oom_events(os.getpid())  # wherever this machine's memory cgroup is, if any
    assert found is None or found[1] >= 0


async def test_a_program_that_cannot_start_fails_the_block() -> None:
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(lambda b, i: ["/nonexistent/corral-worker"]) as provider:
            block = await provider.start_block(BlockSpec(workers=2))
            assert block.state is BlockState.FAILED
            assert await provider.wait_ended(block) is BlockState.FAILED
            assert "could not start" in block.detail and "/nonexistent" in block.detail
            assert block.workers == []


async def test_output_to_files(tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(
            lambda b, i: [*CHILD, "exit", "0"], log_dir=tmp_path / "logs"
        ) as provider:
            block = await provider.start_block(BlockSpec())
            assert await provider.wait_ended(block) is BlockState.COMPLETED
    assert (tmp_path / "logs" / "worker-1.stdout").read_text() == "exiting 0\n"
    assert (tmp_path / "logs" / "worker-1.stderr").read_text() == ""


# ----------------------------------------------------------------------------- leaving


async def test_leaving_kills_a_child_that_ignores_sigterm(corral_log: LogLines) -> None:
    grace = 0.3

    def argv_for(block_id: str, index: int) -> list[str]:
        return [*CHILD, "sleep", *(["--ignore-term"] if index == 0 else [])]

    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(argv_for, grace=grace) as provider:
            block = await provider.start_block(BlockSpec(workers=2))
            pids = await wait_ready(corral_log, provider, block)  # SIG_IGN is set by now
            left = time.monotonic()
        took = time.monotonic() - left
    assert took >= grace  # the SIGTERM was ignored: SIGKILL came after the grace period
    assert not any(psutil.pid_exists(pid) for pid in pids.values())
    assert block.state is BlockState.SCALED_IN
    assert "worker-1.0 killed by SIGKILL (signal 9) after ignoring SIGTERM for 0.3 s" in (
        block.detail
    )
    assert "worker-1.1 killed by SIGTERM" in block.detail


async def test_processes_a_worker_leaves_behind_are_killed_with_a_warning(
    corral_log: LogLines,
) -> None:
    """A child that exits leaving a process of its own behind (in its process group):
    the provider kills it and says so at warning."""
    await one_child_block("orphan")
    line = corral_log.with_("grandchild ")
    assert line is not None
    pid = int(line.split("grandchild ")[1].split("'")[0])
    assert corral_log.has(
        "level='warning'",
        "killed processes the worker left in its session",
        "child='worker-1'",
    )
    with anyio.fail_after(LIMIT):
        await wait_until(lambda: gone(pid))


#: a child that starts ``sleep 300`` in a process group of its own (as a worker's task
#: process is), prints its pid and waits
GROUP_MAKER = """
import subprocess, time
program = subprocess.Popen(["sleep", "300"], process_group=0)
print(program.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions are read in /proc")
async def test_a_killed_child_s_process_groups_in_its_session_are_killed_after_it() -> None:
    """A child killed outright (SIGKILL) leaves a program in a process group of its own,
    in the child's session: the clean-up after the child's exit (a worker's, by its
    provider) kills it; it reached the child's process group alone."""
    with anyio.fail_after(LIMIT):
        child = await spawn_child([sys.executable, "-c", GROUP_MAKER], pdeathsig=None)
        async with child:
            assert child.stdout is not None
            line = await BufferedByteReceiveStream(child.stdout).receive_until(b"\n", 64)
            program = int(line)
            try:
                assert os.getpgid(program) == program and os.getsid(program) == child.pid
                os.kill(child.pid, signal.SIGKILL)
                await child.wait()
                assert child.kill_leftovers() == 0  # not in the child's process group
                assert child.kill_leftovers(session=True) == 1
                await wait_until(lambda: gone(program))
                assert child.kill_leftovers(session=True) == 0  # nothing left
            finally:
                with contextlib.suppress(OSError):
                    os.kill(program, signal.SIGKILL)


def test_kill_session_never_signals_this_process_s_session() -> None:
    """Neither this process's session (a manager's, a user's shell's) nor init's, nor a
    session nobody is in: nothing signalled."""
    assert kill_session(os.getsid(0)) == []
    assert kill_session(1) == []
    assert kill_session(0) == []
    child = subprocess.Popen(["true"], start_new_session=True)
    child.wait()
    assert kill_session(child.pid) == []  # an ended session, none of it left


def test_kill_session_leaves_a_session_whose_number_a_live_process_has() -> None:
    """Once a dead child's session has emptied, its number may go to a new process,
    which may lead a session of its own (``setsid``): that session is not the child's,
    and nothing of it is signalled (review 1206f). Here the leader of a live session
    stands for that new process; before, it and its member were killed."""
    script = "import subprocess, sys; subprocess.Popen(['sleep', '60']); sys.stdin.read()"
    leader = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while len(session_members(leader.pid)) < 2:  # the leader and its `sleep`
            assert time.monotonic() < deadline, "the session's `sleep` never started"
            time.sleep(0.05)
        members = session_members(leader.pid)
        assert kill_session(leader.pid) == []
        assert session_members(leader.pid) == members  # all still there
    finally:
        for pid, _ in session_members(leader.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        leader.wait(timeout=10)
        assert leader.stdin is not None
        leader.stdin.close()


def test_a_task_process_of_a_session_leader_with_a_terminal_gets_a_session_of_its_own() -> None:
    """A worker that leads a session with a terminal (a container's first process run
    with one): its task process makes a session of its own, not a background group of
    the terminal's session, where a program reading the terminal would be stopped
    (SIGTTIN; review 1206f). A pty's child leads such a session and starts a child that
    does what a task process does first."""
    task = (
        "import os; from runtime.lifeline import own_process_group; "
        "own_process_group(os.getppid()); "
        "print('own' if os.getsid(0) == os.getpid() else 'joined')"
    )
    leader = (
        "import os, subprocess, sys; "
        f"r = subprocess.run([sys.executable, '-c', {task!r}], capture_output=True, text=True); "
        "print(os.getsid(0) == os.getpid(), r.stdout.strip() or r.stderr[-300:])"
    )
    pid, fd = pty.fork()
    if pid == 0:  # (the child: exec at once)
        os.execv(sys.executable, [sys.executable, "-c", leader])
    out = b""
    try:
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child is gone and the pty closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    assert out.decode().split() == ["True", "own"]


async def test_an_error_in_the_body_stops_children_and_propagates_unwrapped(
    corral_log: LogLines,
) -> None:
    with anyio.fail_after(LIMIT), pytest.raises(KeyError, match="boom"):
        async with LocalProcessProvider(sleeper()) as provider:
            block = await provider.start_block(BlockSpec())
            pids = await wait_ready(corral_log, provider, block)
            raise KeyError("boom")
    assert not any(psutil.pid_exists(pid) for pid in pids.values())
    assert block.state is BlockState.SCALED_IN


async def test_cancelling_run_stops_children(corral_log: LogLines) -> None:
    provider = LocalProcessProvider(sleeper())
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            await tg.start(provider.run)
            block = await provider.start_block(BlockSpec(workers=2))
            pids = await wait_ready(corral_log, provider, block)
            tg.cancel_scope.cancel()
    assert not any(psutil.pid_exists(pid) for pid in pids.values())
    assert block.state is BlockState.SCALED_IN
    with pytest.raises(RuntimeError, match="not running"):
        await provider.start_block(BlockSpec())


# ----------------------------------------------------------------------------- autoscaler


class FakeScheduler(Actor):
    def __init__(self) -> None:
        self.gone: list[WorkerGone] = []

    @handles(WorkerGone)
    def worker_gone(self, msg: WorkerGone) -> None:
        self.gone.append(msg)


async def test_autoscaler_replaces_a_killed_worker(corral_log: LogLines) -> None:
    scheduler = FakeScheduler()
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(sleeper(), grace=5.0) as provider:
            async with ActorSystem() as system:
                sched_ref = await system.spawn(scheduler, "scheduler")
                autoscaler = Autoscaler(
                    provider, sched_ref, {"default": PoolTarget(2, BlockSpec())}
                )
                await system.spawn(autoscaler, "autoscaler")
                await provider.wait_blocks_started(2)
                first = sorted(autoscaler.blocks.values(), key=lambda b: b.block_id)
                pids = {wid: pid for b in first for wid, pid in provider.pids(b).items()}
                for b in first:
                    await wait_ready(corral_log, provider, b)

                victim = first[0]
                os.kill(provider.pids(victim)["worker-1"], signal.SIGKILL)
                await provider.wait_blocks_started(3)

                assert victim.state is BlockState.FAILED
                assert "SIGKILL" in victim.detail
                live = sorted(autoscaler.blocks.values(), key=lambda b: b.block_id)
                assert [b.block_id for b in live] == ["block-2", "block-3"]
                assert all(provider.poll(b) is BlockState.RUNNING for b in live)
                await wait_ready(corral_log, provider, live[1])
                pids.update(provider.pids(live[1]))
                await wait_until(
                    lambda: (
                        [(g.worker_id, g.cause) for g in scheduler.gone] == [("worker-1", "crash")]
                    )
                )
                # This scheduler answers no count or story: the autoscaler goes on
                # without them, and says so once per kind of request.
                kinds = [
                    ln.split("request='")[1].split("'")[0]
                    for ln in corral_log.lines
                    if "could not answer" in ln
                ]
                assert kinds and len(kinds) == len(set(kinds)), kinds
            # The actor system stopped the autoscaler, which scaled its blocks in.
            assert all(b.state is BlockState.SCALED_IN for b in live)
    assert not any(psutil.pid_exists(pid) for pid in pids.values())


async def test_a_worker_the_oom_killer_killed_is_lost_with_cause_oom(
    corral_log: LogLines, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """End to end through the autoscaler: the provider's block ends OOM (its cgroup
    counted the kill), so the scheduler is told the worker is gone with the documented
    cause ``oom``, not ``crash``; the block is replaced."""
    import actors.processes as processes

    events = tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    monkeypatch.setattr(processes, "_oom_events", lambda pid: (events, 0))
    scheduler = FakeScheduler()
    with anyio.fail_after(LIMIT):
        async with (
            LocalProcessProvider(sleeper(), grace=5.0) as provider,
            ActorSystem() as system,
        ):
            sched_ref = await system.spawn(scheduler, "scheduler")
            autoscaler = Autoscaler(provider, sched_ref, {"default": PoolTarget(1, BlockSpec())})
            await system.spawn(autoscaler, "autoscaler")
            await provider.wait_blocks_started(1)
            (victim,) = autoscaler.blocks.values()
            pid = (await wait_ready(corral_log, provider, victim))["worker-1"]
            events.write_text("oom_kill 1\n")
            os.kill(pid, signal.SIGKILL)
            await provider.wait_blocks_started(2)
            assert victim.state is BlockState.OOM
            await wait_until(lambda: scheduler.gone)
            assert [(g.worker_id, g.cause) for g in scheduler.gone] == [("worker-1", "oom")]
            (end,) = autoscaler.state.ends
            assert (end.state, end.cause, end.charged) == ("oom", "oom", True)


# ----------------------------------------------------------------------------- no orphans


@pytest.mark.parametrize("kind", ["pdeathsig", "lifeline"])
async def test_no_orphans_when_the_parent_is_sigkilled(kind: str) -> None:
    """An intermediate parent starts two grandchildren; ``kill -9`` it; both go.

    ``pdeathsig``: the grandchildren do not watch their lifeline, only PDEATHSIG can end
    them. ``lifeline``: PDEATHSIG is off, only the lifeline can end them.
    """
    with anyio.fail_after(LIMIT):
        async with await spawn_child([*CHILD, "parent", kind], stderr=None) as parent:
            assert parent.stdout is not None
            out = BufferedByteReceiveStream(parent.stdout)
            line = b""
            while not line.startswith(b"pids "):
                line = await out.receive_until(b"\n", 100_000)
            pids = [int(p) for p in line.split()[1:]]
            assert len(pids) == 2
            ready: set[int] = set()
            while ready != set(pids):
                line = await out.receive_until(b"\n", 100_000)
                ready |= {pid for pid in pids if f"ready {pid} ".encode() in line}
            assert not any(gone(pid) for pid in pids)

            killed = time.monotonic()
            os.kill(parent.pid, signal.SIGKILL)
            assert await parent.wait() == -signal.SIGKILL
            await wait_until(lambda: all(gone(pid) for pid in pids), step=0.001)
            took = time.monotonic() - killed
    print(f"{kind}: grandchildren gone {took * 1000:.1f} ms after the SIGKILL")
