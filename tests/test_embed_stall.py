"""An embedded cluster's manager runs on its host's event loop (a Jupyter kernel's): a
host that blocks that loop for longer than its workers wait for the manager (a long
synchronous cell, ``time.sleep``, ``runtime.get`` in a cell) must not cost the work
they go on doing. Worker processes started by the cluster (a lifeline: their manager is
their parent) wait for a manager that does not answer while its port takes connections,
keep running their tasks and rejoin with them; the manager warns once, when its loop
runs again, that it was blocked.

Real worker processes on 127.0.0.1, with the workers' limits made small (silence 2 s,
the close 0.5 s, the rejoin window 2 s: they gave up after about 5 s of stall) so
that a stall of 8 s is past them; without the fix each worker exited 1, was replaced,
and its task ran again.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import runtime.node
from runtime import Cluster
from runtime.node import port_takes_connections
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.anyio

LIMIT = 60  #: seconds the whole test may take, however it fails
STALL = 8.0  #: seconds the test blocks its event loop: past the workers' 2 + 0.5 + 2 s
#: the worker processes' limits, set before their command line runs: a ping every
#: 0.5 s, the manager silent for 2 s is closed (waiting 0.5 s for its close frame, not
#: 5), 2 s to rejoin
SMALL_LIMITS = (
    "import sys, runtime.node as n, transport.ws as ws; n.HEARTBEAT = 0.5; "
    "n.DEAD_AFTER = 2.0; n.RECONNECT = 2.0; ws.DEFAULT_CLOSE_TIMEOUT = 0.5; "
    "from runtime.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def impatient_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes of ``Cluster(processes=N)`` run with :data:`SMALL_LIMITS`."""
    real = runtime.node.worker_argv

    def argv(*args: Any, **kwargs: Any) -> list[str]:
        line = [arg for arg in real(*args, **kwargs) if arg != "-P"]
        assert line[:3] == [sys.executable, "-m", "runtime"], line
        return [sys.executable, "-c", SMALL_LIMITS, *line[3:]]

    monkeypatch.setattr(runtime.node, "worker_argv", argv)


def gated(i: int, starts: str, release: str) -> int:
    """Note each start of this try (one line in ``starts``), then run until ``release``
    exists (bounded: a test that fails does not leave it running)."""
    with open(starts, "a") as f:
        f.write(f"{i} {os.getpid()}\n")
    end = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < end:
        time.sleep(0.05)
    return i


def manager_blocked(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The manager's ``event loop blocked`` records (not its workers', relayed)."""
    return [
        r for r in caplog.records
        if r.name == "corral.node" and "event loop blocked" in r.getMessage()
        and "child=" not in r.getMessage()
    ]  # fmt: skip


def joined(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The scheduler's ``worker joined`` records so far (a rejoin is one too)."""
    return [r.getMessage() for r in caplog.records if "event='worker joined'" in r.getMessage()]


def nap(i: int, starts: str, seconds: float) -> int:
    with open(starts, "a") as f:
        f.write(f"{i} {os.getpid()}\n")
    time.sleep(seconds)
    return i


def started(starts: Path) -> list[str]:
    return starts.read_text().splitlines() if starts.exists() else []


@pytest.mark.slow  # about 15 s: the workers' start, then the stall
async def test_a_blocked_host_loop_costs_no_running_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    impatient_workers(monkeypatch)
    caplog.set_level(logging.INFO, logger="corral")
    starts, release = tmp_path / "starts", tmp_path / "release"
    with anyio.fail_after(LIMIT):
        async with Cluster(
            processes=2, threads_per_worker=2, port=free_port(), worker_timeout=2
        ) as cluster:
            await cluster.wait_for_workers(2, timeout=LIMIT)
            before = {w.worker_id: w.pid for w in (await cluster.status())["workers"]}
            futures = cluster.map(gated, range(2), starts=str(starts), release=str(release))
            # (one more, which ends 1 s into the stall: it reports once its worker is back)
            quick = cluster.submit(nap, 9, str(starts), 1.0)
            await wait_until(lambda: len(started(starts)) == 3, "the tasks running")
            joins = len(joined(caplog))
            time.sleep(STALL)  # noqa: ASYNC251 - the host blocks its loop: a long cell
            # Back once both workers rejoined (or, before the fix, were replaced).
            await wait_until(lambda: len(joined(caplog)) >= joins + 2, "two joins after")
            release.touch()
            assert await cluster.gather(futures) == [0, 1]
            assert await quick == 9
            after = {w.worker_id: w.pid for w in (await cluster.status())["workers"]}
            stories = {w: await cluster.story(w) for w in before}
    text = "\n".join(r.getMessage() for r in caplog.records)
    # Each task started once: none was run again on a replacement worker.
    assert len(started(starts)) == 3, text
    assert after == before, text  # the same worker processes, no replacement
    assert "worker process failed" not in text
    assert "manager unreachable" not in text
    # The workers did lose the manager for longer than their window, and waited.
    assert "the manager does not answer; waiting for it" in text, text
    for worker, story in stories.items():
        assert not [e for e in story if str(e[2]).startswith("left")], (worker, story)
    # The manager warned of its stall, once, as soon as its loop ran again.
    (warning,) = manager_blocked(caplog)
    assert warning.levelno == logging.WARNING
    assert "worker-1" in warning.getMessage() and "to_thread" in warning.getMessage()
    # ... and the cluster's next call (in the notebook's next cell) said it again.
    (again,) = [r for r in caplog.records if "blocked before this call" in r.getMessage()]
    assert again.name == "corral.client" and again.levelno == logging.WARNING
    assert "seconds=" in again.getMessage() and "to_thread" in again.getMessage()


@pytest.mark.slow  # about 12 s: the stall outlasts the worker's start and first try
async def test_a_worker_that_had_not_joined_waits_for_a_blocked_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker still starting when its host blocks the loop (a notebook cell run right
    after the cluster's): its first try to join hangs in the manager's backlog; it
    waits, rather than exit 1 and be replaced by another process."""
    impatient_workers(monkeypatch)
    monkeypatch.setenv("CORRAL_CONNECT_TIMEOUT", "2")  # its first try: 2 s, not 10
    caplog.set_level(logging.INFO, logger="corral")
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, port=free_port()) as cluster:
            assert not (await cluster.status())["workers"]  # (it imports for seconds)
            time.sleep(STALL + 1)  # noqa: ASYNC251 - past the worker's start and its try
            await cluster.wait_for_workers(1, timeout=LIMIT)
            (worker,) = (await cluster.status())["workers"]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert worker.worker_id == "worker-1", text
    assert "worker process failed" not in text
    assert "the manager does not answer; waiting for it" in text, text


async def test_a_port_that_takes_connections() -> None:
    with anyio.fail_after(10):
        port = free_port()
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        async with listener:
            assert await port_takes_connections(f"ws://127.0.0.1:{port}")
        assert not await port_takes_connections(f"ws://127.0.0.1:{port}")
        assert not await port_takes_connections("inproc://x")
        assert not await port_takes_connections("ws://127.0.0.1")  # no port


@pytest.fixture
def away_from_utc() -> Any:
    """This process's local time is UTC+5:45 (a POSIX zone: no tz database needed)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "XYZ-5:45"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


async def test_a_stall_kept_for_the_next_call_says_when_in_utc(
    away_from_utc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's stall record kept for an embedded Cluster's next call has ``at``:
    when its loop ran again, ``HH:MM:SS UTC``. It was local time labelled UTC, off by
    5:45 here. The gateway's watch warns from 0.3 s of stall (not 5) to keep this fast."""
    from runtime.kernel import ActorSystem
    from runtime.node import Gateway, start_control_plane

    monkeypatch.setattr(runtime.node, "LOOP_BLOCKED_WARN", 0.3)
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            plane = await start_control_plane(system)
            gateway = Gateway(plane, heartbeat=0.1)
            await system.start_service(gateway.watch_loop)
            await anyio.sleep(0.2)
            before = time.time()
            time.sleep(0.6)  # noqa: ASYNC251 - the stall under test
            (kept,) = await wait_until(lambda: plane.stalls)
            after = time.time()
    assert kept["seconds"] >= 0.3
    seconds = range(int(before), int(after) + 1)
    utc = {time.strftime("%H:%M:%S UTC", time.gmtime(t)) for t in seconds}
    assert kept["at"] in utc, (kept["at"], utc, time.strftime("%H:%M:%S %Z"))
