"""A worker started by hand when its manager stops: told so (SIGTERM to the manager), it
leaves at once, quietly, with status 0 (with ``--connect-retry SECONDS``, once it has
tried that long to rejoin a manager started again there: a planned restart); not told
(``kill -9``: a crash), it retries for its 10 s, logs the error and exits with status 1,
so that a service manager restarts it. Real manager and worker processes over
websockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.helpers import Cli, free_port_between

LIMIT = 60
run = anyio.to_thread.run_sync
Proc = subprocess.Popen[str]


@contextlib.asynccontextmanager
async def by_hand(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[Cli, Proc, str, Proc]]:
    """A manager and a worker started by hand (``flags``) joined to it, within LIMIT:
    the Cli, the manager, its address and the worker."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = await run(cli.manager)
        worker = await run(cli.worker, address, "--name", "by-hand", *flags)
        yield cli, manager, address, worker


@pytest.mark.anyio
async def test_a_worker_told_the_manager_stops_leaves_at_once_with_status_0(
    tmp_path: Path,
) -> None:
    async with by_hand(tmp_path, "--log-level", "info") as (cli, manager, address, worker):
        manager.send_signal(signal.SIGTERM)  # as `systemctl stop` does
        line = await run(cli.line_with, worker, "the manager stopped; leaving")
        assert f"manager='{address}'" in line, line
        # Well within its 10 s of retries: it did not try them.
        assert await run(worker.wait, 5) == 0
        said = await run(cli.rest, worker)
        assert not [x for x in said if "warning" in x or "error" in x], said
        assert await run(manager.wait, 10) == 0
        out = await run(cli.rest, manager)
        assert not [x for x in out if "held for its rejoin" in x], out


@pytest.mark.anyio
async def test_a_worker_that_loses_its_manager_untold_exits_1_after_its_retries(
    tmp_path: Path,
) -> None:
    async with by_hand(tmp_path) as (cli, manager, address, worker):
        manager.kill()  # a crash: no goodbye
        await run(cli.line_with, worker, "lost the manager; reconnecting")
        line = await run(cli.line_with, worker, "manager unreachable; stopping", 20)
        assert await run(worker.wait, 10) == 1
        assert f"manager='{address}'" in line, line
        said = await run(cli.rest, worker)
        assert [x for x in said if "error: ManagerUnreachable" in x], said


@pytest.mark.anyio
async def test_the_goodbye_closes_with_going_away_not_policy_violation(tmp_path: Path) -> None:
    """SIGTERM: a connection gets the ManagerStopping goodbye, then a websocket close
    with code 1001 (going away), not 1008 (policy violation: a refusal's)."""
    from runtime.codec import Frame
    from runtime.node import Hello, Welcome
    from runtime.remote import Refused
    from transport import ConnectionClosed, connect

    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = await run(cli.manager)
        conn = await connect(address, token=cli.tokens(address)["admin"])
        async with conn:
            await conn.send(Frame(Hello("client", "bare-client")))
            assert isinstance((await conn.receive()).msg, Welcome)
            manager.send_signal(signal.SIGTERM)
            goodbye = (await conn.receive()).msg
            assert isinstance(goodbye, Refused) and goodbye.kind == "ManagerStopping", goodbye
            with pytest.raises(ConnectionClosed):
                await conn.receive()
            reason = conn.close_reason or ""
            assert "websocket close code 1001" in reason, reason
            assert "stopped on purpose" in reason, reason
        assert await run(manager.wait, 10) == 0


@pytest.mark.anyio
async def test_a_clients_pending_calls_raise_manager_stopping_on_the_goodbye(
    tmp_path: Path,
) -> None:
    """SIGTERM to the manager while a client waits on a future (no worker: it never
    runs) and on wait_for_workers: both raise ManagerStopping (a ManagerLost) at once,
    as do later calls; the client logs at info that the manager stopped, and no
    `lost the manager` warning."""
    from runtime import Cluster
    from runtime.errors import ManagerLost, ManagerStopping
    from tests.helpers import log_lines

    with Cli(tmp_path / "home") as cli, log_lines() as logs, anyio.fail_after(LIMIT):
        manager, address = await run(cli.manager)
        async with Cluster(address) as c:
            fut = c.submit(sum, [1, 2])
            outcome: dict[str, BaseException] = {}

            async def waits() -> None:
                try:
                    await c.wait_for_workers(1, timeout=LIMIT)
                except BaseException as exc:
                    outcome["wait_for_workers"] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(waits)
                await c.status()  # after the graph and the wait, on the same connection
                manager.send_signal(signal.SIGTERM)
                with anyio.fail_after(10):  # the goodbye comes at once
                    with pytest.raises(ManagerStopping) as err:
                        await fut
            assert isinstance(err.value, ManagerLost)
            assert err.value.address == address
            assert "stopped on purpose" in str(err.value), err.value
            # and what to do next, as ManagerLost's text says (multiuser audit, defect 6)
            assert f"make a new Cluster({address!r}) and submit" in str(err.value), err.value
            assert isinstance(outcome.get("wait_for_workers"), ManagerStopping), outcome
            with pytest.raises(ManagerStopping):
                await c.status()
        assert await run(manager.wait, 10) == 0
    said = logs.with_("event='the manager stopped'", address)
    assert said is not None and "level='info'" in said, logs.lines
    assert not logs.has("lost the manager"), logs.lines


@pytest.mark.anyio
async def test_a_cancelled_run_manager_stops_as_on_sigterm(tmp_path: Path) -> None:
    """An embedding program cancels the scope around run_manager: the same orderly stop
    as SIGTERM (its worker gets the goodbye and leaves with status 0, the monitoring
    database has the run's end and is closed, the port is free), and the cancellation
    then goes on."""
    import socket
    import sqlite3
    from urllib.parse import urlsplit

    from runtime.node import Tokens, run_manager

    db = tmp_path / "run.db"
    where: list[str] = []
    listening = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        where.append(address)
        listening.set()

    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        with anyio.CancelScope() as scope:  # the embedding program's
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: run_manager(
                        "127.0.0.1:0", ready=ready, monitoring=db, monitoring_interval=0.2
                    )
                )
                await listening.wait()
                worker = await run(cli.worker, where[0], "--log-level", "info")
                scope.cancel()
        assert scope.cancelled_caught
        line = await run(cli.line_with, worker, "the manager stopped; leaving", 15)
        assert f"manager='{where[0]}'" in line, line
        assert await run(worker.wait, 10) == 0
        with socket.socket() as s:  # nothing listens there any more (TIME_WAIT aside)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", urlsplit(where[0]).port or 0))
            s.listen()
        with contextlib.closing(sqlite3.connect(db)) as con:
            ended = con.execute("SELECT ended FROM runs").fetchall()
        assert len(ended) == 1 and ended[0][0] is not None, ended


def inc(x: int) -> int:
    return x + 1


def port_for_a_restart() -> int:
    """A port of 127.0.0.1 from 42000 to 42999 free just now, for a manager started
    twice on it (the same address: the worker rejoins the second one)."""
    return free_port_between(42_000, 42_999)


def manager_args() -> list[str]:
    """A manager's command line on such a port, one it may be started again with."""
    port = port_for_a_restart()
    return ["manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--keep-tokens"]


@pytest.mark.anyio
async def test_a_worker_with_connect_retry_rejoins_a_manager_restarted_on_purpose(
    tmp_path: Path,
) -> None:
    """A planned restart: the manager (--keep-tokens, a fixed port) is stopped with
    SIGTERM and started again. A worker with --connect-retry 30 says it tries to rejoin,
    rejoins the new manager (which never knew its secret, as after a kill -9) and runs a
    new client's task. Before, it left with status 0 at the goodbye, and every worker
    had to be started again by hand (multiuser audit, defect 6)."""
    from runtime import Cluster

    listen = manager_args()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(2 * LIMIT):
        first = cli.start(*listen)
        line = await run(cli.line_with, first, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        worker = await run(cli.worker, address, "--name", "stays", "--connect-retry", "30")
        first.send_signal(signal.SIGTERM)  # as `systemctl restart` does first
        line = await run(cli.line_with, worker, "the manager stopped on purpose; trying to rejoin")
        assert "seconds=30" in line and "--connect-retry" in line, line
        assert await run(first.wait, LIMIT) == 0
        second = cli.start(*listen)
        await run(cli.line_with, second, "manager listening on")
        async with Cluster(address, manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1, timeout=LIMIT)  # the worker is back
            assert await cluster.submit(inc, 1) == 2
            assert [w.worker_id for w in (await cluster.status())["workers"]] == ["stays"]
        assert worker.poll() is None


@pytest.mark.anyio
async def test_a_worker_with_connect_retry_leaves_with_status_0_if_no_manager_comes_back(
    tmp_path: Path,
) -> None:
    """The manager stopped on purpose and not started again: once its --connect-retry is
    up the worker leaves with status 0, as one without it does at once, saying so."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start(*manager_args())
        line = await run(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        worker = await run(cli.worker, address, "--name", "by-hand", "--connect-retry", "1")
        manager.send_signal(signal.SIGTERM)
        await run(cli.line_with, worker, "the manager stopped on purpose; trying to rejoin")
        line = await run(cli.line_with, worker, "worker by-hand left", 20)
        assert line.strip() == (
            f"worker by-hand left {address}: its manager stopped on purpose (SIGINT, "
            "SIGTERM or SIGHUP of the manager) and was not back within 1 s (--connect-retry)"
        ), line
        assert await run(worker.wait, 10) == 0
        assert await run(manager.wait, 10) == 0


def test_manager_stopping_says_what_a_client_does_next_as_manager_lost_does() -> None:
    """A client's ManagerStopping ends with ManagerLost's next step; the goodbye the
    manager sends (a websocket close reason too, consoles and workers show it) stays
    short."""
    from runtime.errors import ManagerLost, ManagerStopping

    address = "ws://127.0.0.1:42001"
    lost = str(ManagerLost(address, "the connection closed"))
    tail = lost.split("the connection closed. ", 1)[1]
    told = str(ManagerStopping(address, for_client=True))
    assert (
        told == f"the manager at {address} stopped on purpose (SIGINT, SIGTERM or SIGHUP). {tail}"
    )
    assert "make a new Cluster" in tail, tail
    said = str(ManagerStopping(address))
    assert said == f"the manager at {address} stopped on purpose (SIGINT, SIGTERM or SIGHUP)"
