"""A worker or client of another Corral version than its manager's.

A soak audit: a newer worker (its ``WorkerInfo`` has fields an older manager lacks)
joining an older, long-running manager said only ``expected a Welcome, got
ErrorReply``, while the manager logged the reason. Now the worker says the manager's
reason, and that the manager runs another Corral version: upgrade it first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import __version__
from runtime.codec import Frame
from runtime.errors import CorralError, ProtocolError, ProtocolMismatch
from runtime.messages import PROTOCOL_VERSION, ErrorReply, Ping
from runtime.node import Hello, Welcome, say_hello
from runtime.remote import Refused, not_welcomed
from tests.helpers import Cli, free_port_between

LO, HI = 62000, 62999  # the range given to these tests


def _newer(when: str, change: str, command: str) -> str:
    """The code of a process of a newer Corral: each frame it sends whose ``header``
    matches ``when`` gets ``change``; then it runs ``main(command)`` (python -m runtime)."""
    return f"""
import sys
import runtime.codec as codec

plain = codec._frame_header

def newer(frame, bufs):
    header = plain(frame, bufs)
    if {when}:
        {change}
    return header

codec._frame_header = newer
from runtime.__main__ import main
sys.exit(main({command}))
"""


#: A worker of a newer Corral: its Hello's info carries a field this manager lacks.
NEWER_WORKER = _newer(
    'header.get("t") == "corral.Hello" and header["f"].get("info")',
    'header["f"]["info"]["f"]["gpus"] = 1  # a field of a newer WorkerInfo',
    '["worker", sys.argv[1]]',
)

#: What a manager of an older version answered such a Hello with (its transport's text).
OLD_MANAGERS_TEXT = (
    "malformed message dropped (1 of at most 10 before the connection is closed): "
    "corral.Hello.info.host: unknown field (known: address, block, cores, deadline, disk, "
    "memory, pool, worker_id). The peer sent a malformed or incompatible frame; make sure "
    "both ends run the same Corral version."
)


def test_a_newer_worker_says_the_managers_reason_and_to_upgrade_it(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring")
        worker = cli.spawn([sys.executable, "-c", NEWER_WORKER, address])
        try:
            code = worker.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker did not stop: {cli.rest(worker, 1)}") from None
        out = "".join(cli.rest(worker))
        assert code == 1, out
        assert f"error: ProtocolError: the manager at {address} refused this worker's" in out
        assert "corral.Hello.info.gpus: unknown field" in out, out
        # the manager names its version, the worker its own and what to do
        assert f"this side runs Corral {__version__}" in out, out
        assert "The manager runs another Corral version" in out, out
        assert "upgrade the manager first (or run the same version on both)" in out, out
        assert "expected a Welcome" not in out
        assert manager.poll() is None  # the manager serves on


def test_the_refusal_of_an_older_manager_is_said_with_what_to_do() -> None:
    error = not_welcomed(ErrorReply("ProtocolError", OLD_MANAGERS_TEXT), "ws://m:1", "worker")
    assert isinstance(error, ProtocolError)
    assert str(error) == (
        f"the manager at ws://m:1 refused this worker's Hello: {OLD_MANAGERS_TEXT[:-1]}. The "
        f"manager runs another Corral version (this worker runs Corral {__version__}): "
        "upgrade the manager first (or run the same version on both)"
    )
    # another reason is said as it is, with no word about versions
    other = not_welcomed(ErrorReply("ProtocolError", "too many bad frames"), "ws://m:1", "client")
    assert str(other) == "the manager at ws://m:1 refused this client's Hello: too many bad frames"
    # an answer that is not an error at all
    odd = not_welcomed(object(), "ws://m:1", "client")
    assert "answered this client's Hello with a object, not a Welcome" in str(odd)


#: A manager of a newer Corral: its StatusReply carries a field this client lacks (as a
#: commit that added ``retry_held`` did, while both still said Corral 0.1.0).
NEWER_MANAGER = _newer(
    'header.get("t") == "StatusReply"',
    'header["f"]["gpus_idle"] = 0  # a field of a newer StatusReply',
    '["manager", "--listen", "127.0.0.1:0", "--no-monitoring"]',
)


def test_a_reply_of_a_newer_manager_says_the_two_sides_run_different_code(
    tmp_path: Path,
) -> None:
    """An audit: status() against a manager of a newer checkout failed with a bare
    ``ProtocolError: the reply could not be read: StatusReply.retry_held: unknown
    field``, both sides saying Corral 0.1.0. Now the error says that the other side
    runs different Corral code, and to run the same code on both."""
    from runtime import Cluster

    async def status(address: str) -> None:
        with anyio.fail_after(60):
            async with Cluster(address, manager_alerts=None) as cluster:
                await cluster.status()

    with Cli(tmp_path) as cli:
        manager = cli.spawn([sys.executable, "-c", NEWER_MANAGER])
        line = cli.line_with(manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        with pytest.raises(ProtocolError) as info:
            anyio.run(status, address)
        text = str(info.value)
        assert "the reply could not be read: StatusReply.gpus_idle: unknown field" in text
        assert (
            f"The other side runs different Corral code than this side (Corral {__version__})"
            in (text)
        ), text
        assert "Run the same Corral code on both sides" in text, text
        assert manager.poll() is None  # the manager serves on


#: A console of a newer Corral: its Hello carries a field this manager lacks (as a
#: console with protocol versions did to a manager of before them).
NEWER_CONSOLE = _newer(
    'header.get("t") == "corral.Hello"',
    'header["f"]["gpus"] = 1  # a field of a newer Hello',
    '["console", *sys.argv[1:]]',
)


@pytest.mark.parametrize("interactive", [False, True])
def test_a_newer_console_waits_for_the_hellos_answer_and_says_to_upgrade_the_manager(
    tmp_path: Path, interactive: bool
) -> None:
    """A user audit (upgrade F4): a new console against an old manager sent its
    StatusRequest and a Ping without waiting for the answer to its Hello, and said only
    the old manager's refusal of the Ping (``the first frame ... must be a Hello ...
    got Ping``); interactively it sometimes crashed with two tracebacks. Now it waits
    for the answer, says the manager's reason and to upgrade the manager first, as a
    worker and a client do, and exits 1."""
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring", port=free_port_between(LO, HI))
        words = [] if interactive else ["status"]
        console = subprocess.Popen(
            [sys.executable, "-c", NEWER_CONSOLE, address, *words],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "CORRAL_HOME": str(cli.home)},
        )  # fmt: skip
        try:
            out, err = console.communicate("status\n", timeout=30)
        except subprocess.TimeoutExpired:
            console.kill()
            raise AssertionError(f"the console did not end: {console.communicate()}") from None
        assert console.returncode == 1, (out, err)
        assert err.startswith(
            f"error: ProtocolError: the manager at {address} refused this console's Hello: "
        ), err
        assert "corral.Hello.gpus: unknown field" in err, err
        assert (
            f"The manager runs another Corral version (this console runs Corral {__version__}): "
            "upgrade the manager first (or run the same version on both)"
        ) in err, err
        assert "Traceback" not in err and "got Ping" not in err, err
        assert manager.poll() is None  # the manager serves on


def test_a_console_of_another_protocol_is_refused_at_its_hello_with_what_to_do(
    tmp_path: Path,
) -> None:
    """The manager's ProtocolMismatch reaches the console as its first answer."""
    code = _newer(
        'header.get("t") == "corral.Hello"',
        'header["f"]["protocol"] += 1',
        '["console", *sys.argv[1:]]',
    )
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring", port=free_port_between(LO, HI))
        done = subprocess.run(
            [sys.executable, "-c", code, address, "status"], capture_output=True, text=True,
            timeout=30, env={**os.environ, "CORRAL_HOME": str(cli.home)},
        )  # fmt: skip
        assert done.returncode == 1, done
        assert done.stderr.startswith("error: ProtocolError: the manager refused this console"), (
            done.stderr
        )
        assert (
            f"it speaks Corral protocol {PROTOCOL_VERSION + 1}, newer than the manager's"
        ) in done.stderr, done.stderr
        assert "upgrade the manager first" in done.stderr, done.stderr
        assert manager.poll() is None


class _Answers:
    """A connection whose manager answers a Hello with ``answer``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sent: list[Any] = []

    async def send(self, frame: Frame) -> None:
        self.sent.append(frame.msg)

    async def receive(self) -> Frame:
        return Frame(self.answer)


@pytest.mark.parametrize(
    ("kind", "answer", "error"),
    [
        ("console", Welcome(""), None),
        ("client", Welcome(""), None),
        # a manager of before consoles were welcomed (same protocol): its first heartbeat
        ("console", Ping(), None),
        ("client", Ping(), "answered this client's Hello with a Ping, not a Welcome"),
        ("console", ErrorReply("ProtocolError", OLD_MANAGERS_TEXT), "upgrade the manager first"),
        (
            "console",
            Refused("ProtocolMismatch", str(ProtocolMismatch("console", "c", 2, 1, "0.1.0"))),
            "remote ProtocolMismatch: the manager refused this console ('c')",
        ),
    ],
)
def test_say_hello_takes_the_welcome_and_raises_a_refusal(
    kind: str, answer: Any, error: str | None
) -> None:
    conn = _Answers(answer)
    hello = Hello(kind, "c")

    async def main() -> None:
        await say_hello(conn, hello, "ws://m:1", 5.0, allow_pickle=False)

    if error is None:
        anyio.run(main)
    else:
        with pytest.raises(CorralError, match=re.escape(error)):
            anyio.run(main)
    assert conn.sent == [hello]  # nothing before the answer
