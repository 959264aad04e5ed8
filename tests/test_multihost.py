"""Several "hosts" on one machine: a manager and two workers, each in a network namespace
of its own with its own IP address (see tests/netns.py), and a client (this test, in the
root namespace, over the test network's uplink). A graph's leaves run on both workers
(pinned by pool); its reduction runs on one of them and needs the other's outputs, which
it must fetch straight from that peer over the test network. Then the same hosts with
one worker cut off from the other (a blackhole route) while both reach the manager: the
task that needs the other's output backs off, and runs once the route is gone.

Needs root and iproute2; where namespaces cannot be made, the test is skipped with the
failing command's own message.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import dask
import psutil
import pytest

from runtime import Cluster
from tests.helpers import wait_until
from tests.netns import NetnsUnavailable, Network

PY = sys.executable
START_LIMIT = 20  #: seconds for the manager, then the workers, to come up
RUN_LIMIT = 30  #: seconds for the client's part
STOP_LIMIT = 10  #: seconds for SIGTERM to work before SIGKILL
LEAVES = 4  #: leaves per worker

pytestmark = pytest.mark.timeout(90)  # a backstop only: every wait below is bounded


# ----------------------------------------------------------------------------- tasks


def _where() -> dict[str, Any]:
    """Where the calling process runs: its IPv4 addresses (other than loopback), its
    network namespace and its process id."""
    ips = sorted(
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    )
    return {"ips": ips, "netns": os.readlink("/proc/self/ns/net"), "pid": os.getpid()}


def leaf(i: int) -> dict[str, Any]:
    """A leaf: ``i * i`` and where it ran."""
    return {"value": i * i, **_where()}


def reduce_leaves(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The reduction: the sum of the leaves, the leaves themselves, where it ran, and
    the remote addresses of this process's established TCP connections (the peer it
    fetched inputs from is among them)."""
    proc = psutil.Process()
    connections = getattr(proc, "net_connections", None) or proc.connections
    remote = sorted(
        {c.raddr.ip for c in connections(kind="tcp") if c.raddr and c.status == "ESTABLISHED"}
    )
    return {"total": sum(p["value"] for p in parts), "parts": parts, "remote": remote, **_where()}


# ----------------------------------------------------------------------------- processes


class Proc:
    """A child process whose output (stdout and stderr, merged) a thread collects, so
    waiting for a line is bounded even when the process prints nothing."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read, name=f"output of {name}", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, needle: str, deadline: float) -> str:
        """The first line containing ``needle``, before ``deadline`` (monotonic)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(
                    f"{self.name} ended (exit code {self.popen.wait(5)}) before printing "
                    f"{needle!r}:\n{self.text()}"
                )
            self.output.append(line)
            if needle in line:
                return line
        raise AssertionError(f"{self.name} printed no {needle!r} in time:\n{self.text()}")

    def text(self) -> str:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.output.append(line)
        return "".join(self.output) or "(no output)"


def _stop(procs: list[Proc]) -> None:
    """SIGTERM to all, then SIGKILL to whoever is still there after STOP_LIMIT."""
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_LIMIT
    for p in procs:
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(5)
    for p in procs:
        p._pump.join(5)
        if p.popen.stdout is not None:
            p.popen.stdout.close()


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def network() -> Iterator[Network]:
    net = Network(["manager", "b", "c"])
    try:
        net.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield net
    finally:
        problems = net.destroy()
        left = net.leftovers()
        assert not problems and not left, f"teardown: {problems}; still there: {left}"


@dataclass
class Deployment:
    address: str  #: the manager, ws://IP:PORT
    token: str
    manager: Proc
    workers: dict[str, Proc]  #: by role
    worker_ids: dict[str, str]  #: by role: the worker's id (its own listen address)


def _env(home: Path) -> dict[str, str]:
    """The environment of one host: its own CORRAL_HOME (hosts share no token file), no
    CORRAL_TOKEN, and this checkout importable (the tasks live in this module)."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_TOKEN"}
    env["CORRAL_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    )
    return env


@pytest.fixture
def deployment(
    network: Network, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Deployment]:
    # This process is the client: it finds no token unless it is given one.
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home-client"))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    procs: list[Proc] = []
    try:
        host = network.hosts["manager"]
        manager = Proc(
            "manager",
            host.command([PY, "-m", "runtime", "manager", "--listen", f"{host.address}:0"]),
            _env(tmp_path / "home-manager"),
        )
        procs.append(manager)
        line = manager.wait_for("manager listening on", time.monotonic() + START_LIMIT)
        address = line.split("manager listening on", 1)[1].strip()
        assert address.startswith(f"ws://{host.address}:"), line
        port = address.rsplit(":", 1)[1]
        token_file = tmp_path / "home-manager" / "tokens" / f"{host.address}_{port}.json"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = json.loads(token_file.read_text())["admin"]

        workers = {}
        for role in ("b", "c"):
            w = network.hosts[role]
            # "--token=TOKEN": a token may begin with "-", and argparse would take
            # "--token -..." for an option without its value.
            argv = [
                PY, "-m", "runtime", "worker", address, "--host", w.address, "--cores", "1",
                "--pool", role, f"--token={token}",
            ]  # fmt: skip
            workers[role] = Proc(f"worker {role}", w.command(argv), _env(tmp_path / f"home-{role}"))
            procs.append(workers[role])
        deadline = time.monotonic() + START_LIMIT
        worker_ids = {}
        for role, proc in workers.items():
            joined = proc.wait_for(" joined ", deadline)
            worker_ids[role] = joined.split()[1]
            assert worker_ids[role].startswith(f"ws://{network.hosts[role].address}:"), joined
        yield Deployment(address, token, manager, workers, worker_ids)
    finally:
        _stop(procs)


# ----------------------------------------------------------------------------- the test


@pytest.mark.anyio
async def test_a_graph_runs_across_workers_on_different_hosts(
    deployment: Deployment, network: Network
) -> None:
    d = deployment
    ip = {role: host.address for role, host in network.hosts.items()}
    with anyio.fail_after(RUN_LIMIT):
        async with Cluster(d.address, token=d.token) as cluster:
            await cluster.wait_for_workers(2, timeout=RUN_LIMIT)
            status = await cluster.status()
            assert sorted(w.worker_id for w in status["workers"]) == sorted(d.worker_ids.values())
            # Leaves pinned to each worker's pool; the reduction may run on either, so
            # it needs the other worker's leaves.
            with dask.annotate(pool="b"):
                on_b = [dask.delayed(leaf, pure=False)(i) for i in range(LEAVES)]
            with dask.annotate(pool="c"):
                on_c = [dask.delayed(leaf, pure=False)(i) for i in range(LEAVES, 2 * LEAVES)]
            total = dask.delayed(reduce_leaves, pure=False)([*on_b, *on_c])
            got = await cluster.compute(total.__dask_graph__(), total.key)

    assert got["total"] == sum(i * i for i in range(2 * LEAVES))
    parts = got["parts"]
    assert [p["value"] for p in parts] == [i * i for i in range(2 * LEAVES)]
    # Each leaf ran in its worker's namespace, in that worker's process.
    for role, chunk in (("b", parts[:LEAVES]), ("c", parts[LEAVES:])):
        assert {tuple(p["ips"]) for p in chunk} == {(ip[role],)}, chunk
        assert {p["pid"] for p in chunk} == {d.workers[role].popen.pid}, chunk
    namespaces = {parts[0]["netns"], parts[-1]["netns"], os.readlink("/proc/self/ns/net")}
    assert len(namespaces) == 3, namespaces  # b, c and this process: all different
    # The reduction ran on one worker and holds a connection to the other one: the
    # leaves it lacked came straight from that peer over the test network.
    assert got["ips"] in ([ip["b"]], [ip["c"]]), got["ips"]
    here = "b" if got["ips"] == [ip["b"]] else "c"
    other = "c" if here == "b" else "b"
    assert got["pid"] == d.workers[here].popen.pid
    assert ip[other] in got["remote"], got["remote"]
    assert ip["manager"] in got["remote"], got["remote"]


def _route(host: Any, *args: str) -> None:
    """``ip route ARGS`` in ``host``'s namespace (the test's own; nothing else)."""
    done = subprocess.run(
        host.command(["ip", "route", *args]), capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.anyio
async def test_a_worker_cut_off_from_its_peer_backs_off_then_runs_once_the_way_is_open(
    deployment: Deployment, network: Network
) -> None:
    """Worker c cannot reach worker b (a blackhole route to b's address in c's
    namespace), though both reach the manager: the reduction, pinned to c, cannot fetch
    b's leaf. It is held back (status()["held_back"]) rather than sent round as fast as
    the workers go, and the leaf is made again only a few times; once the route is
    gone, it runs."""
    d = deployment
    b, c = network.hosts["b"], network.hosts["c"]
    _route(c, "add", "blackhole", f"{b.address}/32")
    with anyio.fail_after(RUN_LIMIT + 30):
        async with Cluster(d.address, token=d.token) as cluster:
            await cluster.wait_for_workers(2, timeout=RUN_LIMIT)
            with dask.annotate(pool="b"):
                part = dask.delayed(leaf, pure=False)(3)
            with dask.annotate(pool="c"):
                total = dask.delayed(reduce_leaves, pure=False)([part])
            (fut,) = await cluster.submit_graph(total.__dask_graph__(), [total.key])

            async def held() -> bool:
                return bool((await cluster.status())["held_back"] >= 1)

            await wait_until(held, "the reduction held back", limit=RUN_LIMIT, step=0.05)
            _route(c, "del", "blackhole", f"{b.address}/32")
            got = await fut
            story = await cluster.story(total.key, part.key)
    assert got["total"] == 9 and got["ips"] == [c.address]
    assert b.address in got["remote"]  # fetched from b once the way was open
    holds = [e for e in story if e[0] == total.key and e[1] == "unreachable"]
    assert holds and "held 0.5 s" in holds[0][2], story
    made = [e for e in story if e[0] == part.key and e[2] == "memory"]
    assert 2 <= len(made) <= 12, len(made)  # made again per failed fetch: a few, not thousands
