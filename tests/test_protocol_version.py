"""A worker or client of another protocol version than its manager's is refused at its
Hello, in a frame it can read, and nothing of it is registered.

A multimachine audit (finding 1): a worker of a checkout a day or two older than its
manager could not read the manager's ``Welcome`` (a field it did not know), but the
manager had registered it and sent it tasks; it died on each, rejoined (systemd,
``--connect-retry``), and after three lives the user's tasks failed with
``TaskCrashedWorkers``, blaming their own code. Now every ``Hello`` carries the
protocol version (``runtime.node.PROTOCOL_VERSION``; a Hello of before protocol
versions reads as 0), and a manager refuses a peer of another version with
:class:`ProtocolMismatch` in a ``Refused`` frame, whose shape never changed, pickled as
a plain ``ProtocolError`` for a peer from before protocol versions (whose code lacks the
class). The older peers are simulated by the frames their code sent (the shapes of
commits 477bcb2 and 1aeca3d, from git history) over a real websocket to a manager
process; ports from 65000-65535."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import pickle
import pkgutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from runtime import Cluster, __version__
from runtime.codec import Frame, decode, decode_batch, encode
from runtime.errors import ProtocolError, ProtocolMismatch
from runtime.messages import WorkerInfo
from runtime.node import PROTOCOL_VERSION, Hello
from runtime.remote import Refused
from tests.helpers import Cli, free_port_between

LO, HI = 65000, 65535  # the range given to these tests (ports end at 65535)

#: The fields of a 2026-12-04 worker's (1aeca3d) WorkerInfo, as its Hello carried it.
OLD_INFO = {
    "worker_id": "old-w",
    "cores": 1,
    "memory": 1 << 30,
    "disk": 0,
    "pool": "default",
    "address": "ws://127.0.0.1:9",
    "deadline": 0.0,
    "block": "",
}
#: The Hello of a worker of before protocol versions (477bcb2's and 1aeca3d's shape).
OLD_WORKER_HELLO = {
    "t": "corral.Hello",
    "f": {
        "kind": "worker",
        "name": "old-w",
        "info": {"t": "WorkerInfo", "f": OLD_INFO},
        "secret": "",
    },
}
OLD_CLIENT_HELLO = {"t": "corral.Hello", "f": {"kind": "client", "name": "old-c"}}
#: The fields of the Refused frame of those commits (and of every one since).
OLD_REFUSED_FIELDS = {"kind", "text", "pickled"}


def _frame(header: dict[str, Any]) -> bytes:
    """One frame as the old codec made it: magic 0xC7, wire format 1, a single frame."""
    head = orjson.dumps(header)
    return struct.pack(">BBBBI", 0xC7, 1, 1, 0, len(head)) + head


async def _answer(address: str, token: str, data: bytes) -> bytes:
    """Send ``data`` as the first frame of a websocket connection to the manager at
    ``address``; the first frame it answers with (heartbeats and the transport's own
    flow-control messages skipped), raw."""
    import aiohttp
    from aiohttp import WSMsgType

    from transport.ws import SUBPROTOCOL, WINDOW_HEADER

    headers = {"Authorization": f"Bearer {token}", WINDOW_HEADER: "1024"}
    with anyio.fail_after(30):
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(
                address, protocols=(SUBPROTOCOL,), headers=headers, autoping=False
            )
            await ws.send_bytes(data)
            while True:
                msg = await ws.receive()
                assert msg.type == WSMsgType.BINARY, msg
                if msg.data[0] == 0xC7 and _first(bytes(msg.data))[0].wire_name != "Ping":
                    await ws.close()
                    return bytes(msg.data)


def _first(raw: bytes) -> tuple[Any, dict[str, Any]]:
    """The first message in ``raw`` (a frame or a batch) other than a heartbeat (the
    first one when all are), with its frame's header as sent."""
    (head_len,) = struct.unpack_from(">I", raw, 4)
    header: dict[str, Any] = orjson.loads(raw[8 : 8 + head_len])
    entries = header.get("n", [header])
    frames = decode_batch(raw)
    pairs = [(f.msg, e) for f, e in zip(frames, entries, strict=True)]
    return next(((m, e) for m, e in pairs if m.wire_name != "Ping"), pairs[0])


def _manager(cli: Cli) -> tuple[subprocess.Popen[str], str]:
    port = free_port_between(LO, HI)
    proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
    cli.line_with(proc, "manager listening on")
    return proc, f"ws://127.0.0.1:{port}"


def _refused(raw: bytes, kind: str, name: str) -> str:
    """The text of ``raw``, a refusal an older peer reads: the old Refused shape, its
    error pickled as a class the old code has; the text says what to do."""
    refused, header = _first(raw)
    assert header["t"] == "corral.Refused", header
    assert set(header["f"]) == OLD_REFUSED_FIELDS, header
    assert isinstance(refused, Refused)
    assert refused.kind == "ProtocolMismatch"
    assert refused.pickled is not None
    error = pickle.loads(refused.pickled)
    assert type(error) is ProtocolError  # a class a Corral of before protocol versions has
    assert str(error) == refused.text
    assert refused.text == (
        f"the manager refused this {kind} ({name!r}): it speaks Corral protocol 0 (a "
        "Corral from before protocol versions, older than the manager's), and the "
        f"manager speaks protocol {PROTOCOL_VERSION} (Corral {__version__}), the only "
        f"one it serves: upgrade this {kind}'s Corral to the manager's (the same release "
        "or checkout) and start it again. See docs/deployment.md, Upgrading Corral"
    )
    return refused.text


def test_an_old_worker_is_refused_at_its_hello_and_no_task_goes_to_it(tmp_path: Path) -> None:
    async def run(address: str, tokens: dict[str, str]) -> list[str]:
        with anyio.fail_after(60):
            raw = await _answer(address, tokens["worker"], _frame(OLD_WORKER_HELLO))
            _refused(raw, "worker", "old-w")
            async with Cluster(address, token=tokens["admin"], manager_alerts=None) as c:
                assert await c.gather(c.map(abs, range(-4, 0))) == [4, 3, 2, 1]
                status = await c.status()
            return sorted(w.worker_id for w in status["workers"])

    with Cli(tmp_path) as cli:
        manager, address = _manager(cli)
        cli.worker(address, "--name", "good", "--port", str(free_port_between(LO, HI)))
        workers = anyio.run(run, address, cli.tokens(address))
        assert workers == ["good"]  # the old worker was never registered
        line = cli.line_with(manager, "refused a peer of another Corral protocol version")
        assert "kind='worker'" in line and "name='old-w'" in line, line
        assert f"its_protocol=0 protocol={PROTOCOL_VERSION}" in line, line
        assert f"version='{__version__}'" in line, line
        assert "upgrade this worker's Corral to the manager's" in line, line
        assert manager.poll() is None


def test_an_old_client_is_refused_at_its_hello(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        manager, address = _manager(cli)
        token = cli.tokens(address)["admin"]
        raw = anyio.run(_answer, address, token, _frame(OLD_CLIENT_HELLO))
        _refused(raw, "client", "old-c")
        cli.line_with(manager, "name='old-c'")
        assert manager.poll() is None


#: What makes a process speak the next protocol version: its Hello says so (this
#: manager's code can read the Hello of a newer worker).
NEWER_HELLO = """
import runtime.codec as codec

plain = codec._frame_header

def newer(frame, bufs):
    header = plain(frame, bufs)
    if header.get("t") == "corral.Hello":
        header["f"]["protocol"] += 1
    return header

codec._frame_header = newer
"""
#: A worker of a newer protocol version.
NEWER_WORKER = f"""
import sys
{NEWER_HELLO}
from runtime.__main__ import main
sys.exit(main(["worker", sys.argv[1], "--port", sys.argv[2]]))
"""


def test_a_newer_worker_is_told_to_upgrade_the_manager_first(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        manager, address = _manager(cli)
        port = str(free_port_between(LO, HI))
        worker = cli.spawn([sys.executable, "-c", NEWER_WORKER, address, port])
        try:
            code = worker.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker did not stop: {cli.rest(worker, 1)}") from None
        out = "".join(cli.rest(worker))
        assert code == 1, out
        assert "error: ProtocolMismatch: the manager refused this worker" in out, out
        assert (
            f"it speaks Corral protocol {PROTOCOL_VERSION + 1}, newer than the manager's, "
            f"and the manager speaks protocol {PROTOCOL_VERSION}"
        ) in out, out
        assert "upgrade the manager first (or run the same version on both)" in out, out
        assert manager.poll() is None


def test_a_hello_without_a_protocol_reads_as_protocol_0() -> None:
    """The codec: a field an older peer's frame lacks reads as ``absent_reads_as``
    says, not as its default, which is what this side's code builds with."""
    assert Hello("client", "c").protocol == PROTOCOL_VERSION
    assert decode(encode(Frame(Hello("client", "c")))).msg.protocol == PROTOCOL_VERSION
    assert decode(_frame(OLD_CLIENT_HELLO)).msg == Hello("client", "old-c", protocol=0)
    old = decode(_frame(OLD_WORKER_HELLO)).msg
    assert old.protocol == 0 and old.info == WorkerInfo(**OLD_INFO)


@pytest.mark.parametrize("peer", [0, PROTOCOL_VERSION + 1])
def test_the_mismatch_pickles_as_itself(peer: int) -> None:
    error = ProtocolMismatch("client", "c", peer, PROTOCOL_VERSION, __version__)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is ProtocolMismatch and str(back) == str(error)
    assert (back.kind, back.name, back.peer) == ("client", "c", peer)
    assert back.manager == PROTOCOL_VERSION


#: The messages' catalogue (every message class of Corral's packages: its wire name,
#: whether it is process-local, its fields and their annotations), fingerprinted, for
#: each protocol version it was current at: a change to it is a decision about
#: PROTOCOL_VERSION, which the test below asks for.
CATALOGUES = {
    "00a4c9616b4200300203c84d2bd3c8ee7265aab104aeaa865a8365708325368a": 1,
    # ForgetWork, a worker process's own message to its worker actor: it never crosses
    "11f49b158ab42ec7f9ec510a6097ba51f12eeaa80a9191e5a88840ed870916d1": 1,
    # PolicyInfo.params as values, the swaps' records: before version 1 was released
    "78157f1ded0ad726f9eeb667ff3528cf4c5f49085dd32391234e6f8b38a521f4": 1,
    # DataMissing.reached, DataDelivered, _SendDelivered: manager and scheduler, one
    # process's own messages: they never cross
    "89604b8cd4a7c7fd5bb9dbbf8728e351dfc91590de4d1f49f2b7def424221987": 1,
    # StatusReply.policy_params and AutoscalerStatus.policy_params as values, as
    # PolicyInfo.params (a client of version 1 cannot read them), PolicyErrorCount,
    # MetricsReply.policy_errors: version 2
    "4ec56ee15975aa9c9795674a6675bc77d7b8e7f20b9b8ad97971ff897ec1553e": 2,
    # WorkerInfo.execution and WorkerInfo.accelerator (a worker's execution mode and the
    # device it is pinned to): version 2
    "47bd45021253a0b9d0b60cc89f38ac94395a6374b25cecd1963acef9b5d4485b": 2,
    # RefusedWorker, the manager's own message to its autoscaler: it never crosses
    "8a54cd593de6ce37cb9c0261e76d48f923332e0d99f42372f3405a374286521b": 2,
    # StatusReply.contained_suspects (the suspects whose workers all ran task
    # processes, for the client's hint): a client of version 2, released, cannot read
    # it: version 3
    "f13833cfceb41e1499f8370e3bd009560afd770abfad62db0dcc6c4c7c988fd3": 3,
    # SubmitGraphRequest.progress and ProgressQuery (a compute under dask callbacks,
    # counted by the scheduler and asked how far it is), SubmitSpecs.progress (local):
    # still version 3, not released
    "34b0a9b96ebe8f0964be450c303713ddf38fc28e587cb5bad6cd5ceab0813969": 3,
    # SubmitRoleGraphRequest, the gateway's own marking of a submit-token connection's
    # SubmitGraphRequest for the manager in its process: it never crosses
    "b803eb4f5419c4bbb668025c6796b785a578ca1fd91d9c2a7b22ee56d62dd8d4": 3,
    # WorkerArrived, the scheduler's own word to the alert monitor in its process that
    # a worker joined (evaluate now): it never crosses
    "de0bd122b6e3511e8c218463839c2a3631bbc41e05c0577055ad361a51eb45d8": 3,
    # UnfitRequest, the autoscaler's own question to the scheduler in its process (the
    # ready tasks a pool's workers could never run): it never crosses
    "55b903647acc5500ea12a5d1cf49f0b1a847d6a9efa8e3e3aafb68f3aab50d35": 3,
    # DemandRequest in place of UnfitRequest: the autoscaler's one question per tick to
    # the scheduler in its process (queues, workers and unfit tasks from one turn): it
    # never crosses
    "792b9b25d2f17f7eec8456cea700d8b3b7f1c030711c5d3777c759be6978bdaa": 3,
}
PACKAGES = ("runtime", "actors", "policies", "transport")


def _catalogue() -> str:
    """The fingerprint of the messages' catalogue, every module of the packages loaded."""
    from runtime.messages import MESSAGE_TYPES

    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, name + "."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)
    rows = [
        [wire, cls.local, [[f.name, str(f.type)] for f in dataclasses.fields(cls)]]  # type: ignore[arg-type]
        for wire, cls in sorted(MESSAGE_TYPES.items())
        if cls.__module__.split(".")[0] in PACKAGES  # not a test's own messages
    ]
    return hashlib.sha256(orjson.dumps(rows)).hexdigest()


def test_a_change_to_the_messages_is_a_decision_about_the_protocol_version() -> None:
    found = _catalogue()
    assert CATALOGUES.get(found) == PROTOCOL_VERSION, (
        f"the messages' catalogue changed (now {found}). If the code of before this "
        "change could not read what this code sends, or would misread it (a field "
        "added, removed, renamed or retyped in a message that crosses between "
        "processes, typed or pickled: runtime/node.py's PROTOCOL_VERSION says what "
        "counts), raise PROTOCOL_VERSION by one. Either way, record the catalogue in "
        f"CATALOGUES: {found!r}: <the version>"
    )


#: A ``sitecustomize`` that makes the worker processes started under it (a pool's: the
#: manager's environment is theirs) speak the next protocol version, the manager not.
NEWER_POOL_WORKERS = 'import sys\nif "worker" in sys.orig_argv:\n' + textwrap.indent(
    NEWER_HELLO, "    "
)


def test_a_pool_whose_workers_the_manager_refuses_gives_up_at_once_saying_why(
    tmp_path: Path,
) -> None:
    """A pool's workers of another Corral than the manager's (a `git pull` under a
    running manager): each block's end was a ``crash``, replaced every few seconds,
    spending the budget (the CorralBlocksFailing alert), until the pool gave up as
    "workers keep ending". Now the first such end is ``refused`` and the pool gives up
    at once, saying to install the manager's Corral there."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NEWER_POOL_WORKERS)
    config = tmp_path / "pools.toml"
    config.write_text('[pools.cpu]\nprovider = "local"\nmin_blocks = 1\nmax_blocks = 1\n')
    with Cli(tmp_path) as cli:
        cli.env["PYTHONPATH"] = os.pathsep.join([str(site), cli.env["PYTHONPATH"]])
        port = free_port_between(LO, HI)
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--config",
            str(config), "--log-level", "info",
        )  # fmt: skip
        seen: list[str] = []
        line = cli.line_with(manager, "worker block ended unasked", limit=60, seen=seen)
        assert "block='cpu/block-1'" in line and "cause='refused'" in line, line
        line = cli.line_with(manager, "the manager refused this pool's workers", seen=seen)
        assert "pool='cpu'" in line, line
        assert "install the manager's Corral where the pool's workers run" in line, line
        assert "`resume cpu`" in line, line
        assert "speaks Corral protocol" in line, line

        async def status() -> dict[str, Any]:
            address = f"ws://127.0.0.1:{port}"
            token = cli.tokens(address)["admin"]
            with anyio.fail_after(30):
                async with Cluster(address, token=token, manager_alerts=None) as c:
                    return dict((await c.status())["autoscaler"])

        auto = anyio.run(status)
        assert auto["gave_up"] == ["cpu"], auto
        assert [(e["block"], e["cause"], e["charged"]) for e in auto["ends"]] == [
            ("cpu/block-1", "refused", False)
        ], auto["ends"]
        assert not any("cpu/block-2" in s for s in seen), seen  # none started after it
        assert manager.poll() is None
