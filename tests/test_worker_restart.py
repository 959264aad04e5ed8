"""A worker killed and started again at once under the same id (a supervisor's restart
loop): the new process says Hello with no secret under an id held for the old one's
rejoin, so the hold ends at once, the old worker is lost (its tasks retried) and the new
one joins. A worker still connected keeps its id; a wrong secret is refused as before.

The gateway over ``inproc://`` with the codec (raw Hellos), then real manager and worker
processes over websockets on 127.0.0.1."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.codec import Frame
from runtime.kernel import ActorSystem
from runtime.messages import Ping, WorkerInfo
from runtime.node import Gateway, Hello, Welcome, start_control_plane
from runtime.remote import Refused
from tests.helpers import GB, AsRole, Cli, log_lines, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 20  #: in-process; far below the hold below: nothing waits it out
PROCESS_LIMIT = 90
HOLD = 60.0  #: the gateway's reconnect timeout in the in-process test


@asynccontextmanager
async def _gateway() -> AsyncIterator[tuple[Gateway, Any, Any]]:
    """A control plane behind a gateway (grace ``HOLD``) on ``inproc://``; yields it,
    an admin connector and a read-only connector."""
    from transport import connect, listen

    async with ActorSystem() as system:
        plane = await start_control_plane(system, alerting=None)
        gateway = Gateway(plane, reconnect_timeout=HOLD)
        listener = await listen("inproc://", codec=True)
        roles: list[str] = []

        async def handle(conn: Any) -> None:
            await gateway.handle(AsRole(conn, roles.pop(0)))

        async def admin() -> Any:
            roles.append("admin")
            return await connect(listener.address)

        async def read() -> Any:
            roles.append("read")
            return await connect(listener.address)

        await system.start_service(listener.serve, handle)
        try:
            yield gateway, admin, read
        finally:
            await listener.aclose()
            for peer in list(gateway.peers.values()):
                await peer.aclose()


async def _answer(conn: Any, hello: Hello) -> Any:
    """The gateway's answer to ``hello`` on ``conn`` (heartbeats skipped)."""
    await conn.send(Frame(hello))
    while type(msg := (await conn.receive()).msg) is Ping:
        pass
    return msg


async def test_a_fresh_hello_under_a_held_id_takes_it_over_and_the_old_worker_is_lost() -> None:
    info = WorkerInfo("w2", 1, GB)
    with anyio.fail_after(LIMIT), log_lines("corral") as logs:
        async with _gateway() as (gateway, admin, read):
            core = gateway.plane.scheduler.state
            first = await admin()
            welcome = await _answer(first, Hello("worker", "w2", info))
            assert isinstance(welcome, Welcome), welcome
            await wait_until(lambda: "w2" in core.workers, "w2 registered")
            await first.aclose()  # it dies: no goodbye, so its id is held for its rejoin
            await wait_until(lambda: logs.has("its id is held for its rejoin", "w2"), "the hold")

            # A read-only token may not say Hello as a worker, so it ends no hold.
            async with await read() as conn:
                refused = await _answer(conn, Hello("worker", "w2", info))
            assert isinstance(refused, Refused) and "read-only" in refused.text, refused
            # A wrong secret is not a fresh start: refused, the hold stays.
            async with await admin() as conn:
                refused = await _answer(conn, Hello("worker", "w2", info, "0" * 32))
            assert isinstance(refused, Refused), refused
            assert "worker id 'w2' is held for a rejoin" in refused.text, refused.text
            assert "a new process, with no secret, takes the id over at once" in refused.text
            assert not logs.has("worker lost"), logs.lines

            # A process started afresh under the id (no secret): the old worker is lost
            # now, and the new one joins, well before the 60 s grace would end.
            second = await admin()
            try:
                welcome2 = await _answer(second, Hello("worker", "w2", info))
                assert isinstance(welcome2, Welcome), welcome2
                assert welcome2.secret != welcome.secret
                line = logs.with_("worker restarted under its id: the old one is lost")
                assert line is not None and "worker='w2'" in line, logs.lines
                assert "cause='crash'" in line, line
                await wait_until(lambda: logs.has("worker lost", "w2", "crash"), "the loss")
                # The loss came first, then the join: w2 is the new worker in the core.
                joins = lambda: [ln for ln in logs.lines if "worker joined" in ln]  # noqa: E731
                await wait_until(lambda: len(joins()) == 2, "the new worker's join")
                assert "w2" in core.workers
                assert not logs.has("worker connection lost"), logs.lines  # not the grace's end

                # Its id is the new worker's: another Hello without the secret, and the
                # old worker's secret, are refused as for any worker connected now.
                for secret in ("", welcome.secret):
                    async with await admin() as conn:
                        refused = await _answer(conn, Hello("worker", "w2", info, secret))
                    assert isinstance(refused, Refused), refused
                    assert "belongs to a registered worker, connected now" in refused.text
                assert "w2" in gateway.peers and not gateway.peers["w2"].closed
            finally:
                await second.aclose()


def hold_then_answer(started: str, go: str, x: int) -> int:
    """Says it runs (its worker's pid in ``started``), then waits for ``go`` (bounded)."""
    Path(started).write_text(str(os.getpid()))
    deadline = time.monotonic() + PROCESS_LIMIT
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    return 2 * x


async def test_a_killed_worker_started_again_under_its_name_joins_at_once_and_its_task_runs(
    tmp_path: Path,
) -> None:
    run = anyio.to_thread.run_sync
    started, go = tmp_path / "started", tmp_path / "go"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(PROCESS_LIMIT):
        manager, address = await run(cli.manager)
        first = await run(cli.worker, address, "--name", "w2", "--cores", "1")
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            fut = cluster.submit(hold_then_answer, str(started), str(go), 21)
            await wait_until(started.exists, "the task running on w2")
            assert started.read_text() == str(first.pid)
            first.kill()  # kill -9 while it holds the task
            await run(first.wait, 10)
            await run(cli.line_with, manager, "its id is held for its rejoin")
            # Started again at once with the same command line, it joins (it exited 1
            # with "held for a rejoin" for the 10 s of the grace).
            second = await run(cli.worker, address, "--name", "w2", "--cores", "1")
            line = await run(cli.line_with, manager, "worker restarted under its id")
            assert "worker='w2'" in line and "cause='crash'" in line, line
            lost = await run(cli.line_with, manager, "worker lost")
            assert "worker='w2'" in lost and "hold_then_answer" in lost, lost
            go.touch()
            assert await fut == 42  # the task, retried, ran on the new worker
            assert started.read_text() == str(second.pid)
            status = await cluster.status()
            assert [w.worker_id for w in status["workers"]] == ["w2"]
        assert second.poll() is None
