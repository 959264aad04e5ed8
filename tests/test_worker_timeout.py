"""A task that holds Python's GIL stops its worker's event loop, and so its heartbeats:
the manager counts a worker silent for longer than its worker timeout as lost (10 s by
default; ``Cluster(worker_timeout=...)``, ``python -m runtime manager --worker-timeout``).
With a longer timeout the task's worker is kept: neither side closes the connection (the
worker does not count the manager's silence while its own loop was blocked), and the
worker warns once that its loop was blocked, naming the task. Worker processes on
127.0.0.1; a hold of 12 s each."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.kernel import ActorSystem
from runtime.node import (
    DEAD_AFTER,
    LOOP_BLOCKED_WARN,
    Tokens,
    loop_blocked_why,
    run_manager,
    serve_gateway,
    start_control_plane,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.slow
LIMIT = 60
HOLD = 12  #: seconds a task holds the GIL: more than the default timeout, less than 30


def hold_gil(seconds: int) -> int:
    """Sleep in libc with the GIL held (a long call into compiled code)."""
    ctypes.PyDLL(None).sleep(seconds)
    return seconds


def lines(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


@contextlib.asynccontextmanager
async def one_worker_process(
    caplog: pytest.LogCaptureFixture, **options: Any
) -> AsyncIterator[Cluster]:
    """A cluster of one worker process, joined (the whole test bounded by LIMIT), its
    logs (the worker's relayed) in ``caplog``."""
    caplog.set_level(logging.INFO, logger="corral")
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, **options) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            yield c


@pytest.mark.anyio
async def test_a_longer_worker_timeout_keeps_a_worker_whose_task_holds_the_gil(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one_worker_process(caplog, worker_timeout=30) as c:
        start = time.monotonic()
        fut = c.submit(hold_gil, HOLD)
        assert await fut == HOLD
        assert time.monotonic() - start < HOLD + 5
        # The worker warned once, when its loop ran again, naming the task.
        (blocked,) = await wait_until(lambda: lines(caplog, "event loop blocked"))
        assert f"running=[{fut.key!r}]" in blocked and "--worker-timeout" in blocked
        seconds = float(blocked.split("seconds=")[1].split()[0])
        assert HOLD - 2 < seconds <= HOLD, blocked
        assert await c.submit(sum, [1, 2]) == 3  # the same connection still serves
    for gone in ("peer silent", "worker connection dropped", "worker lost", "lost the manager"):
        assert lines(caplog, gone) == [], gone
    assert len(lines(caplog, "event loop blocked")) == 1


@pytest.mark.anyio
async def test_by_default_a_worker_whose_task_holds_the_gil_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one_worker_process(caplog) as c:
        assert c.worker_timeout == DEAD_AFTER == 10
        fut = c.submit(hold_gil, HOLD)
        (silent,) = await wait_until(lambda: lines(caplog, "peer silent"))
        assert "peer='worker-1'" in silent  # the manager's side: the worker is dropped
        await wait_until(lambda: lines(caplog, "worker connection dropped"))
        fut.cancel()


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "30", True])
def test_a_bad_worker_timeout_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="worker_timeout must be a number of seconds > 0"):
        Cluster(processes=1, worker_timeout=bad)  # type: ignore[arg-type]


def test_a_worker_timeout_is_the_manager_process_own() -> None:
    with pytest.raises(ValueError, match="--worker-timeout SECONDS"):
        Cluster("ws://127.0.0.1:1", worker_timeout=30)


@pytest.mark.anyio
async def test_run_manager_refuses_a_bad_worker_timeout() -> None:
    with anyio.fail_after(LIMIT), pytest.raises(ValueError, match="worker_timeout must be"):
        await run_manager("ws://127.0.0.1:0", worker_timeout=0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("seconds", "heartbeat"), [(DEAD_AFTER, 120.0), (60.0, 120.0), (300.0, 300.0)]
)
async def test_the_websocket_heartbeat_is_no_shorter_than_the_longest_allowance(
    seconds: float, heartbeat: float
) -> None:
    """aiohttp's ping (after 30 s of silence, a pong due within half that) would drop a
    worker or client silent for 45 s whatever the worker timeout and the clients' 120 s:
    it waits as long as the longest of them instead (tests/test_client_liveness.py has
    a client kept for its whole allowance)."""
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            plane = await start_control_plane(system)
            gateway, listener = await serve_gateway(
                plane, "ws://127.0.0.1:0", Tokens.generate(), worker_timeout=seconds
            )
            assert gateway.dead_after == seconds
            assert listener.options.heartbeat == heartbeat  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_stopped_and_continued_worker_says_so_not_that_a_task_held_the_gil(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker process stopped (SIGSTOP) for 7 s and continued warns `event loop
    blocked` saying the process was stopped and continued; it blamed a task holding
    the GIL, and told to run it with execution 'process'. The stop's length is the
    stimulus."""
    import os
    import signal

    async with one_worker_process(caplog, worker_timeout=30) as c:
        pid = await c.submit(os.getpid)
        os.kill(pid, signal.SIGSTOP)
        try:
            await anyio.sleep(LOOP_BLOCKED_WARN + 2)
        finally:
            os.kill(pid, signal.SIGCONT)
        # (a loaded machine may starve it of CPU before the stop too, CI 110: that
        # warning says so, and the stop's is the one that follows)
        stopped = await wait_until(
            lambda: [
                ln for ln in lines(caplog, "event loop blocked")
                if "the process was stopped (SIGSTOP" in ln
            ],
            "the stop's warning",
            limit=30,
        )  # fmt: skip
        assert len(stopped) == 1, stopped
        blocked = lines(caplog, "event loop blocked")
        assert not [ln for ln in blocked if "holds Python's GIL" in ln], blocked
        assert await c.submit(sum, [1, 2]) == 3


def test_a_loop_blocked_while_a_spill_ran_names_the_spill_not_the_cpu() -> None:
    """The audit's worker spilled an 800 MB output and warned its loop was blocked
    "no task was running: ... starved of CPU": a spill under way, or one that ended
    within the stall, is named instead; one that ended before it is not."""
    from actors.worker import Spilling

    now = 1000.0
    under_way = Spilling(began=now - 6, nbytes=800 * 2**20)
    why = loop_blocked_why(5.0, now, -math.inf, under_way, running=False)
    assert why.startswith(
        "the worker was spilling outputs to disk (800.0 MiB asked for) and still is"
    )
    assert "starved of CPU" not in why and "--spill-dir" in why and "--worker-timeout" in why
    ended = Spilling(began=now - 6, nbytes=2**30, ended=now - 1)
    assert "(1.00 GiB asked for): the spill" in loop_blocked_why(5.0, now, -math.inf, ended, False)
    # Stopped and continued: that is said first, whatever ran.
    assert "SIGCONT" in loop_blocked_why(5.0, now, now - 2, under_way, running=True)
    # No spill in the window: as before.
    assert "starved of CPU" in loop_blocked_why(5.0, now, -math.inf, None, running=False)
    assert "holds Python's GIL" in loop_blocked_why(5.0, now, -math.inf, None, running=True)


@pytest.mark.anyio
async def test_a_worker_names_the_spill_of_its_window_only(tmp_path: Any) -> None:
    """``Worker.spill_during``: the spill under way, or the last one, if it ran for
    half of the window or more; nothing before the first spill or for an older one.
    The audit's workers blamed "spilling outputs to disk (0.0 MiB asked for)" for an
    8 s stall: a spill that asked for nothing, or was over in a moment, is not named."""
    from actors.worker import Spilling, Worker
    from tests.helpers import SchedulerRecorder

    async with ActorSystem() as system:
        sref = await system.spawn(SchedulerRecorder(), "scheduler")
        w = Worker("w1", sref, lambda _: None, memory_options={"spill_dir": str(tmp_path)})
        assert w.spill_during(0.0, 10.0) is None
        w.spilled_last = Spilling(began=10.0, nbytes=1, ended=20.0)
        assert w.spill_during(15.0, 22.0) is w.spilled_last  # 5 of its 7 s
        assert w.spill_during(21.0, 25.0) is None  # ended before
        assert w.spill_during(12.0, 30.0) is None  # 8 of 18 s: under half
        w.spilling = Spilling(began=30.0, nbytes=2)
        assert w.spill_during(100.0, 105.0) is w.spilling
        w.spilling = Spilling(began=30.0, nbytes=0)  # nothing asked for: not named
        assert w.spill_during(100.0, 105.0) is None
        w.spilling, w.spilled_last = None, Spilling(began=104.9, nbytes=0, ended=104.9)
        assert w.spill_during(97.0, 105.0) is None


def test_a_loop_blocked_while_another_thread_was_busy_names_that_thread() -> None:
    """The audit's process workers warned of an 8 s stall with no task running and
    named a spill of 0.0 MiB; what took the GIL was the thread receiving a task
    process's 200 MB result (zeroing its buffer). A thread that used a quarter of the
    stall's seconds of CPU or more is named, the busiest; one that used less is not."""
    from actors.worker import Spilling

    now = 1000.0
    slot = "thread 'p1-0' (it hands tasks to their task process and reads back their results)"
    busy = [(slot, 6.5), ("thread 'AnyIO worker thread' (the worker's own)", 0.2)]
    spill = Spilling(began=now - 9, nbytes=2**30)
    why = loop_blocked_why(8.0, now, -math.inf, spill, False, busy)
    assert why.startswith(f"its {slot} used 6.5 s of CPU in those 8.0 s"), why
    assert "GIL" in why and "--worker-timeout" in why and "spilling" not in why
    # Too little CPU to have held the loop: the rest decides, as before.
    idle = [(slot, 1.0)]
    assert "starved of CPU" in loop_blocked_why(8.0, now, -math.inf, None, False, idle)
    assert "SIGCONT" in loop_blocked_why(8.0, now, now - 1, None, False, busy)


def test_the_cpu_a_thread_used_is_counted_by_its_native_id() -> None:
    """``thread_cpu``, the samples ``Worker.busy_threads`` compares: a thread that
    spun for 0.2 s of CPU shows about that under its native id."""
    import threading

    from actors.worker import thread_cpu

    ids: list[int] = []

    def spin() -> None:
        ids.append(threading.get_native_id())
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        after.update(thread_cpu())

    after: dict[int, float] = {}
    t = threading.Thread(target=spin)
    t.start()
    t.join(LIMIT)
    assert after[ids[0]] >= 0.15  # in clock ticks (0.01 s), rounded down
