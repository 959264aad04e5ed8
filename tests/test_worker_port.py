"""A worker's port for its peers: ``--port PORT`` and ``--port-range LO-HI``
(``python -m runtime worker``), for sites whose firewalls open only some ports.

Before, a worker always listened for its peers on a random free port of ``--host``.
Now ``--port`` fixes it (in use: exit 1 with the typed ``AddressInUse`` naming the
flag, as the manager's ``--listen``) and ``--port-range`` takes the first free one of a
range (none free: ``AddressInUse`` naming the range). Real processes, real sockets on
127.0.0.1: a worker on a chosen port serves its peers from it (a task of another pool
fetches its input there)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.__main__ import main
from tests.helpers import ROOT, Cli

LIMIT = 60  # seconds per process or test


@contextmanager
def listening(n: int) -> Iterator[list[socket.socket]]:
    """``n`` sockets listening on ``n`` consecutive ports of 127.0.0.1 (closed at the
    end; close one to free its port for a worker)."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        with ExitStack() as stack:
            socks = []
            try:
                for port in range(base, base + n):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
                    sock.listen()
                    socks.append(sock)
            except OSError:
                continue
            yield socks
            return
    raise AssertionError(f"no {n} consecutive free ports found")


def port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def worker(*flags: str) -> subprocess.CompletedProcess[str]:
    """A worker process to its end (for a manager that is not there: it listens first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "ws://127.0.0.1:9", "--token", "t" * 64,
         *flags],
        env=env, capture_output=True, text=True, timeout=LIMIT, cwd=ROOT,
    )  # fmt: skip


def error_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "joined" not in done.stdout
    return done.stderr.strip().splitlines()[-1]


def make(n: int) -> list[int]:
    return list(range(n))


def total(xs: list[int]) -> int:
    return sum(xs)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_workers_listen_on_their_port_and_range_and_their_peers_fetch_there(
    tmp_path: Path,
) -> None:
    with Cli(tmp_path / "home") as cli, listening(3) as socks:
        _, address = cli.manager()
        fixed, taken, free = (port(s) for s in socks)
        socks[0].close()  # --port: this one
        socks[2].close()  # --port-range: the first one is taken, the next is free
        a = cli.start("worker", address, "--pool", "a", "--port", str(fixed))
        b = cli.start("worker", address, "--pool", "b", "--port-range", f"{taken}-{free}")
        # A worker's id is the address it listens on for its peers.
        assert f"worker ws://127.0.0.1:{fixed} joined" in cli.line_with(a, "joined")
        assert f"worker ws://127.0.0.1:{free} joined" in cli.line_with(b, "joined")
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as c:
                await c.wait_for_workers(2)
                (xs,) = await c.submit_graph({"xs": (make, 1000)}, ["xs"], pool="a")
                await xs.wait()
                # b fetches xs from a, on a's --port; then a fetches from b, on its range's
                (n,) = await c.submit_graph({"n": (total, "xs")}, ["n"], pool="b")
                assert await n == 499500
                (ys,) = await c.submit_graph({"ys": (make, 10)}, ["ys"], pool="b")
                await ys.wait()
                (m,) = await c.submit_graph({"m": (total, "ys")}, ["m"], pool="a")
                assert await m == 45


def test_a_port_in_use_exits_1_with_address_in_use_naming_the_flag() -> None:
    with listening(1) as (sock,):
        taken = port(sock)
        err = error_of(worker("--port", str(taken)))
    assert err.startswith(f"error: AddressInUse: address ws://127.0.0.1:{taken} is already")
    assert f"(--port {taken}: stop what listens there, or choose another port" in err


def test_a_range_with_no_free_port_exits_1_naming_the_range() -> None:
    with listening(2) as socks:
        lo, hi = port(socks[0]), port(socks[1])
        err = error_of(worker("--port-range", f"{lo}-{hi}"))
    assert err.startswith(f"error: AddressInUse: address ws://127.0.0.1:{lo}-{hi} is already")
    assert f"(--port-range {lo}-{hi}: every port of it is in use" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--port", "70000"], "--port must be a port from 1 to 65535 (0: a free one), got 70000"),
        (["--port", "-1"], "--port must be a port from 1 to 65535"),
        (["--port-range", "9010-9000"], "--port-range takes LO-HI, two ports from 1 to 65535"),
        (["--port-range", "9000"], "got '9000'"),
        (["--port-range", "0-9"], "--port-range takes LO-HI"),
        (["--port-range", "a-b"], "--port-range takes LO-HI"),
    ],
)
def test_a_bad_port_or_range_is_refused_before_the_worker_starts(
    capsys: Any, monkeypatch: Any, flags: list[str], said: str
) -> None:
    started: list[Any] = []
    monkeypatch.setattr("runtime.__main__._run_worker", lambda *a: started.append(a))
    assert main(["worker", "ws://127.0.0.1:9", "--memory", "1GiB", *flags]) == 1
    assert said in capsys.readouterr().err
    assert started == []
    assert main(["worker", "ws://127.0.0.1:9", "--memory", "1GiB", "--port-range", "9-10"]) == 0
    assert started[0][0].peer_port == (9, 10)


def test_port_and_port_range_together_are_a_usage_error(capsys: Any) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["worker", "ws://127.0.0.1:9", "--port", "1", "--port-range", "1-2"])
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_pools_worker_port_range_is_where_its_worker_listens() -> None:
    """The Slurm audit: a pool could not pin its workers' ports (a firewalled site
    must). A local pool's ``worker_port_range`` reaches its worker process's command
    line: the range's first port is taken, so the worker listens on the next."""
    with listening(2) as socks:
        taken, free = (port(s) for s in socks)
        socks[1].close()
        pools = {"cpu": {"worker_port_range": f"{taken}-{free}", "grace": 2}}
        with anyio.fail_after(LIMIT):
            async with Cluster(pools=pools, processes=True) as c:
                await c.wait_for_workers(1, timeout=LIMIT)
                (info,) = (await c.status())["workers"]
                assert (info.worker_id, info.address) == ("cpu-1", f"ws://127.0.0.1:{free}")
                with socket.create_connection(("127.0.0.1", free), timeout=5):
                    pass  # it listens there
                assert await c.submit(total, [1, 2, 3]) == 6
