"""A worker started by hand when its manager stops: told so (SIGTERM to the manager), it
leaves at once, quietly, with status 0; not told (``kill -9``: a crash), it retries for
its 10 s, logs the error and exits with status 1, so that a service manager restarts it.
Real manager and worker processes over websockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.helpers import Cli

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
