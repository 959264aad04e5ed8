"""A worker's name (``--name``) between its workers: free again at once when its worker
leaves cleanly, held for a lost worker's rejoin (and a worker refused under it is told
until when; a process started afresh under it takes it over: tests/test_worker_restart.py).
Real manager and worker processes over websockets on 127.0.0.1."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import anyio
import pytest

from tests.helpers import Cli

LIMIT = 90


@pytest.mark.anyio
async def test_a_name_is_free_once_its_worker_left_and_held_saying_until_when_once_lost(
    tmp_path: Path,
) -> None:
    run = anyio.to_thread.run_sync
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = await run(cli.manager)
        first = await run(cli.worker, address, "--name", "probe2")
        first.send_signal(signal.SIGTERM)  # a clean leave: cause 'shutdown'
        assert await run(first.wait, 30) == 0
        # Started again at once under the same name, it joins: the name was freed when
        # its worker left (it was held for the 10 s rejoin grace, and refused meanwhile).
        second = await run(cli.worker, address, "--name", "probe2")

        second.kill()  # lost: no goodbye, so its name is held for its rejoin
        await run(second.wait, 10)
        held = await run(cli.line_with, manager, "its id is held for its rejoin")
        assert "worker='probe2'" in held and "seconds=10.0" in held, held
        # A worker under it with a secret not its own is refused, told until when (a
        # bare Hello: a worker process could take much of the 10 s to start on a busy
        # machine; with no secret at all, a process started afresh, it would take the
        # id over).
        refused_at = time.time()
        line = await _hello_refused(address, cli.tokens(address)["admin"], "probe2")
        assert "worker id 'probe2' is held for a rejoin" in line, line
        assert "the manager keeps the id and the worker's work for 10 s" in line, line
        found = re.search(r"The id is free at (\d\d:\d\d:\d\d) UTC: wait (\d+) s", line)
        assert found is not None, line
        assert 0 < int(found[2]) <= 10, line
        free_at = time.strftime("%H:%M:%S", time.gmtime(refused_at + int(found[2])))
        assert abs(_seconds(free_at) - _seconds(found[1])) <= 2, (free_at, line)
        # Its grace over, the name is free: a new worker joins under it.
        await run(cli.line_with, manager, "worker connection lost")
        await run(cli.worker, address, "--name", "probe2")


async def _hello_refused(address: str, token: str, name: str) -> str:
    """The text of the manager's refusal of a worker Hello under ``name`` with a
    secret that is not its worker's."""
    from runtime.codec import Frame
    from runtime.messages import Ping, WorkerInfo
    from runtime.node import Hello
    from runtime.remote import Refused
    from transport import connect

    async with await connect(address, token=token) as conn:
        await conn.send(Frame(Hello("worker", name, WorkerInfo(name, 1, 0), "0" * 32)))
        while type(msg := (await conn.receive()).msg) is Ping:
            pass
    assert isinstance(msg, Refused), msg
    return msg.text


def _seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + s
