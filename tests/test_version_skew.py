"""A worker or client of another Corral version than its manager's.

A soak audit: a newer worker (its ``WorkerInfo`` has fields an older manager lacks)
joining an older, long-running manager said only ``expected a Welcome, got
ErrorReply``, while the manager logged the reason. Now the worker says the manager's
reason, and that the manager runs another Corral version: upgrade it first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime import __version__
from runtime.errors import ProtocolError
from runtime.messages import ErrorReply
from runtime.remote import not_welcomed
from tests.helpers import Cli

#: A worker of a newer Corral: its Hello's info carries a field this manager lacks.
NEWER_WORKER = """
import sys
import runtime.codec as codec

plain = codec._frame_header

def newer(frame, bufs):
    header = plain(frame, bufs)
    if header.get("t") == "corral.Hello" and header["f"].get("info"):
        header["f"]["info"]["f"]["gpus"] = 1  # a field of a newer WorkerInfo
    return header

codec._frame_header = newer
from runtime.__main__ import main
sys.exit(main(["worker", sys.argv[1]]))
"""

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
NEWER_MANAGER = """
import sys
import runtime.codec as codec

plain = codec._frame_header

def newer(frame, bufs):
    header = plain(frame, bufs)
    if header.get("t") == "StatusReply":
        header["f"]["gpus_idle"] = 0  # a field of a newer StatusReply
    return header

codec._frame_header = newer
from runtime.__main__ import main
sys.exit(main(["manager", "--listen", "127.0.0.1:0", "--no-monitoring"]))
"""


def test_a_reply_of_a_newer_manager_says_the_two_sides_run_different_code(
    tmp_path: Path,
) -> None:
    """An audit: status() against a manager of a newer checkout failed with a bare
    ``ProtocolError: the reply could not be read: StatusReply.retry_held: unknown
    field``, both sides saying Corral 0.1.0. Now the error says that the other side
    runs different Corral code, and to run the same code on both."""
    import anyio
    import pytest

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
