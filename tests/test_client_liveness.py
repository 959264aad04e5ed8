"""Every client wait is tied to the manager's liveness (issue 9): with a real manager
process and a worker process, a client whose manager is killed or stops answering gets
ManagerLost on every pending future within the documented bound, never a silent wait.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import transport
from runtime import Cluster
from runtime.client import ClientActor
from runtime.errors import ManagerLost
from runtime.messages import GetData
from runtime.node import DEAD_AFTER, HEARTBEAT
from runtime.remote import Peer
from tests.helpers import Cli, free_port, free_port_between, held_at_gate, wait_until

pytestmark = pytest.mark.anyio
LIMIT = 60


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with Cli(tmp_path / "home") as cli:
        mgr, address = cli.manager()
        cli.worker(address, "--cores", "1")
        yield address, mgr


@pytest.mark.parametrize("how", ["kill -9", "SIGSTOP"])
async def test_pending_futures_fail_with_manager_lost_within_the_bound(
    manager: tuple[str, subprocess.Popen[str]], tmp_path: Path, how: str
) -> None:
    address, mgr = manager
    mark = tmp_path / "started"
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            running = c.submit(held_at_gate, str(tmp_path / "never"), str(mark))
            queued = c.submit(held_at_gate, str(tmp_path / "never-either"), str(mark))
            # One of the two runs, the other waits behind it. Another process's progress
            # shows only in the filesystem: a bounded poll.
            await wait_until(mark.exists, "a task to start", limit=30)
            mgr.send_signal(signal.SIGKILL if how == "kill -9" else signal.SIGSTOP)
            start = time.monotonic()
            for fut in (running, queued):
                with pytest.raises(ManagerLost) as err:
                    await fut
                assert err.value.address == address
            took = time.monotonic() - start
            # A closed connection is seen at once; a silent manager after DEAD_AFTER
            # seconds without a message (checked every HEARTBEAT / 2).
            bound = 5.0 if how == "kill -9" else DEAD_AFTER + HEARTBEAT + 5.0
            assert took < bound, f"{how}: ManagerLost after {took:.1f} s"
            print(f"\n{how}: ManagerLost on both futures after {took:.2f} s")
            with pytest.raises(ManagerLost):
                await c.status()
            with pytest.raises(ManagerLost):
                await c.submit(sum, [1, 2])


async def test_the_websocket_heartbeat_does_not_cut_a_silent_client_before_its_allowance(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A client whose event loop is busy (here: a bare websocket client that neither
    sends nor answers pings) keeps its connection for the gateway's whole client
    allowance, and the gateway's own liveness check is what closes it then ("peer
    silent"), not aiohttp's heartbeat ping, which, at max(30 s, worker timeout), cut it
    after 45 s where the allowance is 120 s. Scaled down: a heartbeat of 0.5 s, an
    allowance of 4 s, a worker timeout of 1 s (the old heartbeat: 1 s, a cut at 1.5 s)."""
    import aiohttp
    from aiohttp import WSMsgType

    import transport.ws
    from runtime.codec import Frame, encode
    from runtime.node import Hello, Tokens, run_manager
    from tests.helpers import log_lines
    from transport.ws import SUBPROTOCOL, WINDOW_HEADER

    allowance = 4.0
    monkeypatch.setattr(transport.ws, "DEFAULT_HEARTBEAT", 0.5)
    where: list[tuple[str, Tokens]] = []
    listening = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        where.append((address, tokens))
        listening.set()

    with log_lines() as logs, anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_manager(
                    "127.0.0.1:0",
                    ready=ready,
                    worker_timeout=1.0,
                    client_timeout=allowance,
                    token_file=tmp_path / "tokens.json",
                )
            )
            await listening.wait()
            address, tokens = where[0]
            headers = {"Authorization": f"Bearer {tokens.admin}", WINDOW_HEADER: "1024"}
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(
                    address, protocols=(SUBPROTOCOL,), headers=headers, autoping=False
                )
                await ws.send_bytes(encode(Frame(Hello("client", "busy-client"))))
                start = time.monotonic()
                while True:  # read what comes (Welcome, heartbeats, pings: unanswered)
                    msg = await ws.receive()
                    if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
                        break
                took = time.monotonic() - start
                await ws.close()
            tg.cancel_scope.cancel()
    assert took >= allowance, f"closed after {took:.1f} s, before the {allowance} s allowance"
    assert logs.has("peer silent; closing", "busy-client"), logs.lines


CLIENT = """
import sys, anyio
from runtime import Cluster

async def main():
    async with Cluster(sys.argv[1], manager_alerts=None) as c:
        fut = c.submit(sum, [1, 2])  # no worker: it stays pending
        print("connected", flush=True)
        try:
            await fut
        except Exception as exc:
            print("raised", type(exc).__name__, exc, flush=True)

anyio.run(main)
"""


def test_a_client_paused_past_its_allowance_gets_manager_lost_saying_why(
    tmp_path: Path,
) -> None:
    """A client process stopped (SIGSTOP) for longer than the manager's client allowance
    is dropped by the manager ("peer silent"); on SIGCONT its pending future fails with
    ManagerLost naming the address, the manager's reason for closing and this client's
    own pause, not with ActorStopped or a ManagerLost of reason ''."""
    import sys

    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    with Cli(tmp_path / "home") as cli:
        # A client allowance of 6 s (--client-timeout; the worker timeout, 1 s, is
        # below it). The client sends every HEARTBEAT (2 s) and checks its loop every
        # 1 s, so its pause is then over 3 s, more than the HEARTBEAT its loop must
        # miss to count as stalled.
        argv = ["--listen", "127.0.0.1:0", "--worker-timeout", "1", "--client-timeout", "6"]
        mgr = cli.start("manager", *argv)
        address = cli.line_with(mgr, "manager listening on").split("listening on", 1)[1].strip()
        client = cli.spawn([sys.executable, str(script), address])
        cli.line_with(client, "connected", limit=LIMIT)
        client.send_signal(signal.SIGSTOP)
        try:
            cli.line_with(mgr, "peer silent; closing", limit=LIMIT)
        finally:
            client.send_signal(signal.SIGCONT)
        line = cli.line_with(client, "raised", limit=LIMIT)
    assert "raised ManagerLost" in line, line
    assert address in line, line
    assert "no message from you for" in line, line  # the manager's reason
    assert "this side's event loop had not run for" in line, line  # and the pause


async def test_a_client_rides_out_a_manager_stall_shorter_than_its_manager_timeout(
    manager: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """The manager stalls (SIGSTOP) for DEAD_AFTER + 3 s: a client with the default
    manager timeout gets ManagerLost at about DEAD_AFTER, while one given
    ``manager_timeout=30`` keeps its pending future, which completes once the manager
    runs again (its worker rejoins too). The stall's length is the stimulus here."""
    address, mgr = manager
    mark, gate = tmp_path / "started", tmp_path / "gate"
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as hasty, Cluster(address, manager_timeout=30) as patient:
            await patient.wait_for_workers(1)
            running = patient.submit(held_at_gate, str(gate), str(mark))
            await wait_until(mark.exists, "the task to start", limit=30)
            queued = hasty.submit(held_at_gate, str(gate), str(tmp_path / "second"))
            mgr.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                with pytest.raises(ManagerLost, match="no message for"):
                    await queued
                lost_after = time.monotonic() - stopped
                await anyio.sleep(DEAD_AFTER + 3 - lost_after)
            finally:
                mgr.send_signal(signal.SIGCONT)
            gate.touch()
            assert await running == "opened"
    assert DEAD_AFTER - 3 <= lost_after < DEAD_AFTER + HEARTBEAT + 2, lost_after


async def test_a_clients_websocket_heartbeat_does_not_cut_a_stall_within_its_manager_timeout(
    manager: tuple[str, subprocess.Popen[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client given ``manager_timeout=30`` rides out a manager stall of 6 s even when
    its websocket's own heartbeat is shorter than the stall: aiohttp's ping, at its
    default 30 s (a pong due 15 s later), ended such a client after 45 s of a 60 s stall
    with ``ManagerLost: ... did not answer the heartbeat ping`` (multi audit, finding
    3). Scaled down: a default heartbeat of 1 s (before, a cut at about 1.5 s)."""
    import transport.ws

    monkeypatch.setattr(transport.ws, "DEFAULT_HEARTBEAT", 1.0)
    address, mgr = manager
    mark, gate = tmp_path / "started", tmp_path / "gate"
    with anyio.fail_after(LIMIT):
        async with Cluster(address, manager_timeout=30) as patient:
            await patient.wait_for_workers(1)
            running = patient.submit(held_at_gate, str(gate), str(mark))
            await wait_until(mark.exists, "the task to start", limit=30)
            mgr.send_signal(signal.SIGSTOP)
            try:
                await anyio.sleep(6)  # the stall's length is the stimulus
            finally:
                mgr.send_signal(signal.SIGCONT)
            gate.touch()
            assert await running == "opened"


def test_manager_timeout_is_a_number_of_seconds_for_a_client_of_a_manager() -> None:
    for bad in (0, -1, float("inf"), True, "10"):
        with pytest.raises(ValueError, match="manager_timeout must be a number of seconds"):
            Cluster("ws://127.0.0.1:1", manager_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="manager_timeout= is for Cluster"):
        Cluster(manager_timeout=30)
    assert Cluster("ws://127.0.0.1:1", manager_timeout=45).manager_timeout == 45.0
    assert Cluster("ws://127.0.0.1:1").manager_timeout == DEAD_AFTER


async def test_a_client_timeout_below_the_worker_timeout_is_said_at_start(tmp_path: Path) -> None:
    """``--client-timeout`` below ``--worker-timeout`` is raised to it (a client is never
    dropped sooner than a worker), and the manager says so as it starts (an operator's
    re-check: ``--client-timeout 5 --worker-timeout 10`` started without a word)."""
    from runtime.node import Tokens, run_manager
    from tests.helpers import log_lines

    up = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        up.set()

    with log_lines() as logs, anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_manager(
                    "127.0.0.1:0", ready=ready, worker_timeout=10.0, client_timeout=5.0,
                    token_file=tmp_path / "tokens.json",
                )
            )  # fmt: skip
            await up.wait()
            tg.cancel_scope.cancel()
    line = logs.with_("client timeout below the worker timeout")
    assert line is not None and "client_timeout=5.0" in line and "worker_timeout=10.0" in line


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, as a traceback shows."""
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in out:
        out.append(seen)
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return out


async def test_a_cluster_that_lost_its_manager_says_it_is_closed_and_a_new_one_works(
    tmp_path: Path,
) -> None:
    """After a manager's restart (kill -9, then started again on its port) the old
    Cluster(address) stays closed: its calls raise ManagerLost saying so and to make a
    new Cluster(address), with no internal ActorStopped in the traceback; a new one
    (api.md's reconnect pattern) runs tasks on the restarted manager."""
    port = free_port()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):

        def start_manager() -> tuple[subprocess.Popen[str], str]:
            mgr = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
            line = cli.line_with(mgr, "manager listening on")
            return mgr, line.split("manager listening on", 1)[1].strip()

        mgr, address = await anyio.to_thread.run_sync(start_manager)
        await anyio.to_thread.run_sync(cli.worker, address)
        async with Cluster(address) as old:
            assert await old.submit(sum, [1, 2]) == 3
            mgr.kill()
            await anyio.to_thread.run_sync(mgr.wait, 10)
            _, again = await anyio.to_thread.run_sync(start_manager)
            assert again == address
            await anyio.to_thread.run_sync(cli.worker, address)
            for call in (old.status, lambda: old.submit(sum, [3, 4])):
                with pytest.raises(ManagerLost) as err:
                    await call()
                text = str(err.value)
                assert "this Cluster is closed for good" in text, text
                assert f"make a new Cluster({address!r})" in text, text
                chain = _chain(err.value)
                assert not [e for e in chain if type(e).__name__ == "ActorStopped"], chain
        async with Cluster(address) as new:
            assert await new.submit(sum, [3, 4]) == 7


class _Records(logging.Handler):
    """Every record of the ``corral`` logger, debug included, as it comes."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def dropped(self) -> list[logging.LogRecord]:
        return [r for r in self.records if "dropped a message" in r.getMessage()]


@pytest.fixture
def records() -> _Records:
    """The ``corral`` logger's records, debug included, for this test (conftest.py puts
    the logger back after it)."""
    logger, handler = logging.getLogger("corral"), _Records()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return handler


async def test_a_clean_close_drops_the_manager_s_crossing_updates_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: _Records
) -> None:
    """A cron client that closes normally wrote ``dropped a message for a stopped actor
    peer='manager'`` at warning (mailed as a fault): the manager's updates sent before
    it heard of the close come after the client's actor stopped, before the connection
    closes. Made certain here: the task ends once the client's actor has stopped, and the
    connection is held open until its update was dropped. Expected in a close: a debug
    record. (A drop with no close under way stays a warning: see the next test.)"""
    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli:
        port = free_port_between(44000, 44999)
        mgr = cli.start("manager", "--listen", f"127.0.0.1:{port}")
        address = cli.line_with(mgr, "manager listening on").split("listening on", 1)[1].strip()
        cli.worker(address, "--cores", "1")
        real_on_stop = ClientActor.on_stop

        async def on_stop(self: ClientActor) -> None:
            await real_on_stop(self)
            gate.touch()  # the task ends once the client's actor has stopped

        monkeypatch.setattr(ClientActor, "on_stop", on_stop)
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as cluster:
                await cluster.wait_for_workers(1, timeout=LIMIT)
                fut = cluster.submit(held_at_gate, str(gate), str(started), pure=False)
                await wait_until(started.exists, "the task started")
                system = cluster._system
                assert system is not None
                real_stop = system.stop

                async def stop() -> None:  # the connection closes once the update came
                    with anyio.move_on_after(LIMIT / 3):
                        await wait_until(records.dropped, "the update dropped")
                    await real_stop()

                monkeypatch.setattr(system, "stop", stop)
            del fut
    dropped = records.dropped()
    assert dropped, "no update crossed the close"
    assert {(r.levelno, "peer='manager'" in r.getMessage()) for r in dropped} == {
        (logging.DEBUG, True)
    }, [r.getMessage() for r in dropped]


async def test_a_client_that_gives_up_on_a_silent_manager_says_it_may_only_be_stalled(
    tmp_path: Path,
) -> None:
    """A manager stalled (SIGSTOP here; a long garbage collection, swapping) past a
    client's ``manager_timeout`` is given up on as a dead peer; the text said only to
    wait for a manager to run there again, where the manager never stopped (audit ops
    F8): it says the manager may still be running and names ``manager_timeout=`` to ride
    out stalls, before the usual next step. A connection that closed does not say so."""
    from runtime.errors import _resubmit

    port = free_port_between(50000, 50499)
    address = f"ws://127.0.0.1:{port}"
    timeout = 4.0  # over a heartbeat's 2 s (and its 1 s check): a live manager is heard
    stall = (
        "The manager may still be running, only stalled (a long garbage collection, "
        "swapping, a paused machine): this client gives up on a manager silent for 4 s; to "
        "ride out such stalls, give it longer with Cluster(address, manager_timeout=SECONDS) "
        "(docs/deployment.md#when-the-manager-stalls). "
    )
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        mgr = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        await anyio.to_thread.run_sync(cli.line_with, mgr, "manager listening on")
        async with Cluster(address, manager_timeout=timeout, manager_alerts=None) as c:
            pending = c.submit(sum, [1, 2])  # no worker: it waits
            mgr.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(ManagerLost) as err:
                    await pending
            finally:
                mgr.send_signal(signal.SIGCONT)
    reason = err.value.reason
    assert reason.startswith("no message for ") and reason.endswith(" s (dead peer)"), reason
    assert str(err.value) == f"lost the manager at {address}: {reason}. {stall}" + _resubmit(
        address
    )
    assert err.value.timeout == timeout
    closed = ManagerLost(address, "the connection closed")
    assert "manager_timeout" not in str(closed) and closed.timeout is None


#: A client that gathers a value large enough to be streamed (over STREAM_BYTES), and
#: says so once the manager's answer offered it the stream (then reads nothing: the
#: test kills it there, as a client killed mid-read).
GATHERER = """
import sys, anyio
import actors.transfer
from runtime import Cluster

async def stalled(ask, info, **kw):
    print("reading", flush=True)
    await anyio.sleep(3600)

actors.transfer.receive_parts = stalled

def big(n):
    return bytes(n)

async def main():
    async with Cluster(sys.argv[1]) as c:
        f = c.submit(big, 40 * 2**20)
        await f.wait()
        await f

anyio.run(main)
"""


def _open_streams() -> int:
    """In a worker's process (``Cluster.run``): the streams its table holds open."""
    import gc

    from actors.transfer import StreamTable

    return sum(len(o.open) for o in gc.get_objects() if type(o) is StreamTable)


async def test_a_client_killed_mid_gather_leaves_no_stream_open_on_its_worker(
    tmp_path: Path,
) -> None:
    """The service audit: clients SIGKILLed while they gathered a 200 MB result each took
    a worker from 73 MB to 835 MB with nothing stored, for two minutes: each stream the
    manager relayed to them stayed open on the worker, holding the value's pickle, until
    its idle expiry (IDLE_SECONDS, 120 s). Now the end of the client's connection closes
    the streams offered to it that it did not read to their end."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await anyio.to_thread.run_sync(cli.manager)
        await anyio.to_thread.run_sync(cli.worker, address)
        async with Cluster(address) as watch:
            await watch.wait_for_workers(1)
            client = cli.spawn([sys.executable, "-c", GATHERER, address])
            await anyio.to_thread.run_sync(cli.line_with, client, "reading", LIMIT)
            (opened,) = (await watch.run(_open_streams)).values()
            assert opened == 1
            client.kill()
            await anyio.to_thread.run_sync(client.wait, 10)
            start = time.monotonic()
            while sum((await watch.run(_open_streams)).values()):
                assert time.monotonic() - start < 20, "the stream is still open on the worker"
                await anyio.sleep(0.1)


def big(n: int) -> bytes:
    return bytes(n)


async def test_a_peer_gone_mid_fetch_leaves_no_stream_open_on_the_holder(tmp_path: Path) -> None:
    """The same for a worker's peers: a peer whose connection ends after a ``GetData``
    answer offered it a stream (a worker killed mid-fetch) leaves none open on the holder,
    which would otherwise hold the value's pickle for the stream's 120 s idle expiry. The
    peer here is this test, connected to the worker's peer listener with the worker token
    as a worker is."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await anyio.to_thread.run_sync(cli.manager)
        await anyio.to_thread.run_sync(cli.worker, address)
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            value = c.submit(big, 40 * 2**20, key="big")
            await value.wait()
            (holder,) = (await c.status())["workers"]
            token = cli.tokens(address)["worker"]
            peer = Peer(
                await transport.connect(holder.address, token=token),
                None,
                name="t",
                allow_pickle=True,
            )
            async with anyio.create_task_group() as tg:
                await tg.start(peer.run)
                reply = await peer.ref.ask(GetData(("big",), raw=True, stream_over=1))
                assert len(reply.streams) == 1
                assert (await c.run(_open_streams)) == {holder.worker_id: 1}
                await peer.aclose()
            start = time.monotonic()
            while sum((await c.run(_open_streams)).values()):
                assert time.monotonic() - start < 20, "the stream is still open on the holder"
                await anyio.sleep(0.1)
