"""SIGHUP (the operator's terminal closing, ``kill -HUP``) stops a manager or a worker
process as SIGTERM does: in order, with the ``stopping on signal`` line naming it and
exit status 0. Before, Python's default action ended the manager at once (status 129)
and its local pool's workers died with it, untold. Real processes on 127.0.0.1, ports
57500-57999 only; every wait is bounded. A manager started under ``nohup`` keeps
SIGHUP ignored, as ``nohup`` means it to."""

from __future__ import annotations

import ast
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psutil
import pytest

from tests.helpers import Cli, free_port_between, http_get, wait_until

pytestmark = pytest.mark.anyio

LIMIT = 60
run = anyio.to_thread.run_sync
Proc = subprocess.Popen[str]

CONFIG = """
[pools.local]
provider = "local"
max_blocks = 1
cores_per_worker = 1
worker_port_range = "57900-57949"
"""


def _listen() -> tuple[str, str]:
    return "--listen", f"127.0.0.1:{free_port_between(57500, 57899)}"


async def test_sighup_stops_the_manager_in_order_and_its_local_workers_first(
    tmp_path: Path,
) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        flags = (*_listen(), "--no-monitoring", "--config", str(config), "--log-level", "info")
        manager = cli.start("manager", *flags)
        started = await run(cli.line_with, manager, "block started")
        pid = ast.literal_eval(started.split("pids=", 1)[1].strip())["local-1"]
        await run(cli.line_with, manager, "worker local-1 joined")
        manager.send_signal(signal.SIGHUP)
        assert await run(manager.wait, 20) == 0  # not 129: Python's default action
        said = await run(cli.rest, manager)
        stopping = [x for x in said if "event='stopping on signal'" in x]
        assert len(stopping) == 1 and "signal='SIGHUP'" in stopping[0], said
        # In order: its worker told the scheduler it leaves, then its block ended with
        # the worker's own exit, not a lost connection.
        order = [
            next(i for i, x in enumerate(said) if needle in x)
            for needle in (
                "event='stopping on signal'",
                "event='worker left' actor='scheduler'",
                "event='block ended'",
            )
        ]
        assert order == sorted(order), said
        ended = said[order[-1]]
        assert "state='scaled-in'" in ended and "local-1 exit code 0" in ended, ended
        assert not [x for x in said if "worker connection dropped" in x], said
        await wait_until(lambda: not psutil.pid_exists(pid), "worker gone", limit=10)


async def test_sighup_stops_a_worker_in_order(tmp_path: Path) -> None:
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start("manager", *_listen(), "--no-monitoring", "--log-level", "info")
        line = await run(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        port = free_port_between(57950, 57999)
        flags = ("--name", "by-hand", "--port", str(port), "--log-level", "info")
        worker = cli.start("worker", address, *flags)
        # The line it prints once its signal handlers are in place (the log's
        # event='joined' may come before them).
        await run(cli.line_with, worker, f"worker by-hand joined {address}")
        worker.send_signal(signal.SIGHUP)
        said = await run(cli.rest, worker, 20)
        assert worker.wait(5) == 0, said
        assert [x for x in said if "stopping on signal" in x and "signal='SIGHUP'" in x], said
        assert [x for x in said if "left" in x and "stopped by a signal (" in x], said
        await run(cli.line_with, manager, "worker left")


async def test_a_worker_still_joining_stops_in_order_on_sigterm(tmp_path: Path) -> None:
    """Its stop signals are handled from before its first connection: a worker that
    waits for its manager (``--connect-retry``) stops at SIGTERM with status 0, saying
    so, and one that the manager has just taken in leaves with its WorkerGone. Before,
    the handlers came after the join, and such a SIGTERM ended it by Python's default
    (status -15): an embedded ``Cluster(processes=N)`` closed right after
    ``wait_for_workers`` had the manager warn ``worker connection dropped``."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        nobody = f"ws://127.0.0.1:{free_port_between(57500, 57899)}"  # nothing listens
        flags = ("--name", "early", "--connect-retry", "60", "--log-level", "info")
        worker = cli.start("worker", nobody, "--token", "t" * 32, *flags)
        await run(cli.line_with, worker, "could not reach the manager; retrying")
        worker.send_signal(signal.SIGTERM)
        said = await run(cli.rest, worker, 20)
        assert worker.wait(5) == 0, said
        assert [x for x in said if "stopping on signal" in x and "SIGTERM" in x], said
        assert [x for x in said if "stopped before it joined" in x], said


@contextlib.asynccontextmanager
async def _relay_holding_answers(
    address: str, held: anyio.Event, release: anyio.Event, *, drop: int = 0
) -> AsyncIterator[int]:
    """A relay to the manager at ``address`` that passes a worker's connection and Hello
    but holds the manager's answer, as a slow network would: ``held`` is set once it
    holds one, which goes through once ``release`` is set. The first ``drop``
    connections are dropped instead once their answer is held (a manager gone, or
    restarting, as the worker said Hello). Yields the relay's port."""
    dropping = [drop]

    async def relay(worker_side: anyio.abc.SocketStream) -> None:
        manager_side = await anyio.connect_tcp("127.0.0.1", int(address.rsplit(":", 1)[1]))
        dropped, dropping[0] = dropping[0] > 0, dropping[0] - 1

        async def pipe(src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream) -> None:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                async for data in src:
                    await dst.send(data)
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await dst.send_eof()

        async def answers() -> None:  # the HTTP upgrade passes; then held
            head = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while b"\r\n\r\n" not in head:
                    head += await manager_side.receive()
                upgrade, rest = head.split(b"\r\n\r\n", 1)
                await worker_side.send(upgrade + b"\r\n\r\n")
                if not rest:
                    rest = await manager_side.receive()
                held.set()
                if dropped:
                    tg.cancel_scope.cancel()  # both sides closed, the answer never sent
                    return
                await release.wait()
                await worker_side.send(rest)
            await pipe(manager_side, worker_side)

        async with worker_side, manager_side, anyio.create_task_group() as tg:
            tg.start_soon(pipe, worker_side, manager_side)
            await answers()

    port = free_port_between(57500, 57899)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, relay)
        yield port
        tg.cancel_scope.cancel()


async def _manager(cli: Cli) -> tuple[Proc, str, str]:
    """A manager started: it, its address and its worker token."""
    manager = cli.start("manager", *_listen(), "--no-monitoring", "--log-level", "info")
    line = await run(cli.line_with, manager, "manager listening on")
    address = line.split("manager listening on", 1)[1].strip()
    return manager, address, cli.tokens(address)["worker"]


@contextlib.asynccontextmanager
async def _signalled_while_welcome_held(
    cli: Cli, name: str
) -> AsyncIterator[tuple[Proc, Proc, anyio.Event]]:
    """A manager, and a worker ``name`` joining it through a relay that passes its
    connection and Hello but holds the manager's answer (:func:`_relay_holding_answers`);
    the worker is sent SIGTERM once the answer is held, and has said it is stopping.
    Yields the manager, the worker and the event that lets the answer through."""
    manager, address, token = await _manager(cli)
    held, release = anyio.Event(), anyio.Event()
    async with _relay_holding_answers(address, held, release) as port:
        flags = ("--name", name, "--port", str(free_port_between(57950, 57999)))
        worker = cli.start(
            "worker", f"ws://127.0.0.1:{port}", "--token", token, *flags, "--log-level", "info"
        )
        await held.wait()  # its Hello said, the manager's answer held
        worker.send_signal(signal.SIGTERM)
        await run(cli.line_with, worker, "stopping on signal")
        yield manager, worker, release


async def test_a_worker_signalled_while_its_welcome_comes_leaves_in_order(
    tmp_path: Path,
) -> None:
    """SIGTERM after the worker said Hello, while the manager's Welcome is on its way
    (held here by a relay between them, as a slow network would): the manager has
    taken the worker in, so the worker reads its Welcome and leaves in order, its
    WorkerGone told. Before, the signal cut the join short ('stopped before it
    joined'): the manager saw the connection drop ('worker connection dropped; its id
    is held for its rejoin'), the race of a Cluster(processes=N) closed right after
    wait_for_workers."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        # (the Welcome is on its way: the worker is taken in)
        async with _signalled_while_welcome_held(cli, "late") as (manager, worker, release):
            release.set()
            said = await run(cli.rest, worker, 20)
            assert worker.wait(5) == 0, said
            assert not [x for x in said if "stopped before it joined" in x], said
            assert [x for x in said if "left" in x and "stopped by a signal (" in x], said
            await run(cli.line_with, manager, "worker left")
        cli.stop([manager])
        rest = await run(cli.rest, manager, 20)
        assert not [x for x in rest if "worker connection dropped" in x], rest


async def test_a_worker_signalled_while_its_hello_goes_unanswered_stops_soon(
    tmp_path: Path,
) -> None:
    """An audit: SIGTERM after the worker said Hello, to a manager whose answer never
    comes (held here by a relay): the worker read on for its Welcome, shielded from the
    stop, until it had waited the 10 s a silent manager is given, and only then
    stopped. Once stopping it waits at most a second more (a Welcome on its way is
    still taken: the test above), then stops, saying it did before it joined."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        async with _signalled_while_welcome_held(cli, "unanswered") as (manager, worker, _):
            # no answer will come (10 s before: the wait for an answer a silent manager is given)
            assert await run(worker.wait, 5) == 0
            said = await run(cli.rest, worker, 20)
            assert [x for x in said if "stopped before it joined" in x], said
        cli.stop([manager])


async def test_a_worker_whose_hello_the_manager_drops_tries_again(tmp_path: Path) -> None:
    """A review: the connection dropped after the worker said Hello (its manager gone,
    or restarting, before it answered) is a manager that did not answer, tried again
    under ``--connect-retry`` as before the stop signal's shorter wait for the Welcome
    was added; with it, the drop came out of the wait's task group as an
    ``ExceptionGroup``, which no ``except ConnectionClosed`` caught: the worker ended
    with a traceback, status 1, instead of joining on its next try."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address, token = await _manager(cli)
        held, release = anyio.Event(), anyio.Event()
        release.set()  # the second connection's answer passes
        async with _relay_holding_answers(address, held, release, drop=1) as port:
            flags = ("--name", "dropped", "--port", str(free_port_between(57950, 57999)))
            worker = cli.start(
                "worker", f"ws://127.0.0.1:{port}", "--token", token, *flags,
                "--connect-retry", "30", "--log-level", "info",
            )  # fmt: skip
            seen: list[str] = []
            await run(cli.line_with, worker, "worker dropped joined", 20, seen)
            assert [x for x in seen if "could not reach the manager; retrying" in x], seen
            worker.send_signal(signal.SIGTERM)
            said = await run(cli.rest, worker, 20)
            assert worker.wait(5) == 0, said
        cli.stop([manager])


async def test_a_manager_started_under_nohup_keeps_ignoring_sighup(tmp_path: Path) -> None:
    """``nohup`` (SIGHUP ignored from the start) is how a manager started by hand
    outlives its terminal: the manager leaves it ignored. A SIGHUP, then a request it
    answers, then a SIGTERM: it stops on the SIGTERM."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        argv = [sys.executable, "-m", "runtime", "manager", *_listen(), "--no-monitoring"]
        manager = cli.spawn(["nohup", *argv, "--log-level", "info"])
        line = await run(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        manager.send_signal(signal.SIGHUP)
        # Its answer to a request sent after the SIGHUP: had the signal been taken, its
        # handler would have noted it before this, and ahead of the SIGTERM below.
        token = cli.tokens(address)["read"]
        url = address.replace("ws://", "http://") + "/metrics"
        assert (await run(http_get, url, token))[0] == 200
        manager.send_signal(signal.SIGTERM)
        assert await run(manager.wait, 20) == 0
        said = await run(cli.rest, manager)
        stopping = [x for x in said if "stopping on signal" in x]
        assert len(stopping) == 1 and "signal='SIGTERM'" in stopping[0], said
