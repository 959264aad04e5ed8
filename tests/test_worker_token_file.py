"""A worker pointed at the manager's own token file (``--token-file PATH``, or the
manager's token file on its machine) takes the file's ``worker`` entry, and its
``admin`` entry only from a file without one (written by a manager from before the
worker token): a worker on another machine does not hold the admin token
(docs/security.md#the-worker-token). Before, it took the admin entry.

Real processes on 127.0.0.1, ports 47000-47499 only."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

import runtime.node as node
from runtime import TokenFileError
from runtime.node import Tokens
from tests.helpers import Cli, free_port_between

LIMIT = 60
PORTS = (47000, 47499)  #: the ports these tests may use
PORT_RANGE = f"{PORTS[0]}-{PORTS[1]}"
run = anyio.to_thread.run_sync


def private(path: Path, data: dict[str, str]) -> Path:
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------- reading


def test_a_worker_takes_the_worker_entry_of_a_manager_s_token_file(tmp_path: Path) -> None:
    """``--token-file`` and the manager's token file on this machine alike: the worker
    entry; from a file without one, the admin entry. Other roles are as they were."""
    tokens = Tokens.generate()
    full = private(tmp_path / "full.json", tokens.entries())
    old = private(tmp_path / "old.json", {"admin": tokens.admin, "read": tokens.read})
    assert node.read_token_file(full, "worker") == tokens.worker
    assert node.read_token_file(old, "worker") == tokens.admin
    assert node.read_token_file(full) == node.read_token_file(old) == tokens.admin
    assert node.find_token("ws://h:1", None, "worker", token_file=full) == tokens.worker
    assert node.find_token("ws://h:1", None, "worker", token_file=old) == tokens.admin


def test_the_local_token_file_gives_a_worker_its_worker_entry(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """No token given, no ``CORRAL_TOKEN``: the manager's token file of the address on
    this machine, its worker entry; one written before the worker token, its admin."""
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    tokens = Tokens.generate()
    tokens.write(node.token_path("ws://h:1"))
    assert node.find_token("ws://h:1", None, "worker") == tokens.worker
    assert node.find_token("ws://h:1", None) == tokens.admin  # a client's, a console's
    private(node.token_path("ws://h:2"), {"admin": tokens.admin, "read": tokens.read})
    assert node.find_token("ws://h:2", None, "worker") == tokens.admin


def test_a_json_file_with_neither_entry_is_refused_naming_both(tmp_path: Path) -> None:
    path = private(tmp_path / "t.json", {"read": "e" * 64})
    with pytest.raises(TokenFileError) as refused:
        node.read_token_file(path, "worker")
    said = str(refused.value)
    assert "nor a manager's token file with the 'worker' entry (or 'admin')" in said, said
    assert "write the manager's worker token in it (the 'worker' entry" in said, said
    assert "e" * 64 not in said


# ----------------------------------------------------------------------------- processes

#: the manager's log record of a worker joining: its id and its token's role
CONNECTED = re.compile(r"worker connected.*\bworker='?([\w-]+)'?.*\brole='?(\w+)")


def joined_roles(cli: Cli, manager: subprocess.Popen[str], n: int) -> dict[str, str]:
    """Worker id -> the role of the token it joined with, from the manager's next ``n``
    ``worker connected`` records."""
    roles = {}
    for _ in range(n):
        line = cli.line_with(manager, "worker connected", LIMIT)
        found = CONNECTED.search(line)
        assert found is not None, line
        roles[found[1]] = found[2]
    return roles


@pytest.mark.anyio
async def test_a_worker_given_the_manager_s_token_file_joins_with_the_worker_token(
    tmp_path: Path,
) -> None:
    """A manager, and workers as on another machine (``CORRAL_HOME`` empty, no
    ``CORRAL_TOKEN``): one given the manager's token file joins as ``worker`` (before:
    ``admin``), one given a copy without the ``worker`` entry (an older manager's) joins
    with its admin token. (A worker given neither reads the manager's token file of its
    address on this machine the same way: the unit test above.)"""
    port = free_port_between(*PORTS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start(
            "--log-level", "info", "manager", "--listen", f"127.0.0.1:{port}",
            "--no-monitoring",
        )  # fmt: skip
        line = await run(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        tokens = cli.tokens(address)
        own = cli.home / "tokens" / f"127.0.0.1_{port}.json"
        older = private(tmp_path / "older.json", {"admin": tokens["admin"], "read": tokens["read"]})
        cli.env = dict(cli.env, CORRAL_HOME=str(elsewhere))
        cli.env.pop("CORRAL_TOKEN", None)

        def worker(name: str, *flags: str) -> subprocess.Popen[str]:
            return cli.start("worker", address, "--name", name, "--port-range", PORT_RANGE, *flags)

        started = [
            worker("w-file", "--token-file", str(own)),
            worker("w-older", "--token-file", str(older)),
        ]
        for proc in started:  # started together: each joins in its own time
            await run(cli.line_with, proc, f"joined {address}", LIMIT)
        assert await run(joined_roles, cli, manager, 2) == {"w-file": "worker", "w-older": "admin"}
