"""A worker's token is none of its tasks' business (security audit: a submit-token
holder read the admin token in a thread-mode task, ``os.environ["CORRAL_TOKEN"]`` or
``subprocess.run(["env"])``, and could take over the manager).

1. A worker takes ``CORRAL_TOKEN`` out of its own environment once, at its start, and
   keeps it in memory for its rejoins (:func:`runtime.node.take_env_token`): a task run
   in the worker's process (thread execution, the default) does not see it, nor does a
   program the task starts.
2. The workers the manager starts itself get the ``worker`` token, which may say Hello
   as a worker and nothing else (not as a client or console; not ``/metrics``): what a
   task can still dig out of its worker (``/proc/self/environ``, the worker's memory) is
   that token, not the admin token. The admin token still joins a worker started by
   hand, and both kinds fetch from each other (the Welcome's ``peer_token``).

Real processes on 127.0.0.1, ports 41500-41999 only."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from runtime import Cluster, PermissionDenied, TokenFileError
from runtime.node import Tokens
from tests.helpers import Cli, free_port_between, http_get

LIMIT = 60
PORTS = (41500, 41999)  #: the ports these tests may use
PORT_RANGE = f"{PORTS[0]}-{PORTS[1]}"
run = anyio.to_thread.run_sync


def seen_token() -> tuple[str | None, list[str]]:
    """What a task sees of ``CORRAL_TOKEN``: its own ``os.environ``, and the lines of
    ``env`` run as a program it starts."""
    shell = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    return os.environ.get("CORRAL_TOKEN"), [
        line for line in shell.splitlines() if line.startswith("CORRAL_TOKEN")
    ]


def manager(cli: Cli, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """A manager on a free port of :data:`PORTS`; it and its address."""
    port = free_port_between(*PORTS)
    proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", *flags)
    line = cli.line_with(proc, "manager listening on")
    return proc, line.split("manager listening on", 1)[1].strip()


@pytest.mark.anyio
async def test_a_thread_task_and_its_programs_do_not_see_the_worker_s_token(
    tmp_path: Path,
) -> None:
    """A worker given the admin token as ``CORRAL_TOKEN`` (as the manager's own pools
    give it), on a machine with no token file to find (``CORRAL_HOME`` elsewhere): it
    joins with that token, and its thread-mode task finds no ``CORRAL_TOKEN`` in
    ``os.environ`` nor in what ``env`` prints. Before, both showed the admin token."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await run(manager, cli)
        admin = cli.tokens(address)["admin"]
        cli.env = dict(cli.env, CORRAL_HOME=str(elsewhere), CORRAL_TOKEN=admin)
        worker = await run(
            cli.worker, address, "--name", "w", "--port-range", PORT_RANGE, "--execution", "thread"
        )
        async with Cluster(address, token=admin, manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1)
            env, shell = await cluster.submit(seen_token)
        assert env is None, "the task read the worker's token in os.environ"
        assert shell == [], "a program the task started inherited the worker's token"
        assert worker.poll() is None


# ----------------------------------------------------------------------------- the token file


def test_the_token_file_round_trips_the_four_tokens(tmp_path: Path) -> None:
    """The manager writes its worker token as the ``worker`` entry (0600), and reads
    it back, as ``Tokens.read_file`` and ``--keep-tokens`` do; it is a role of its own."""
    tokens = Tokens.generate()
    path = tmp_path / "h_1.json"
    tokens.write(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {
        "admin": tokens.admin, "read": tokens.read, "submit": tokens.submit,
        "worker": tokens.worker,
    }  # fmt: skip
    assert Tokens.read_file(path) == tokens == Tokens.kept(path)
    assert tokens.roles()[tokens.worker] == "worker" and tokens.of("worker") == tokens.worker
    assert len(set(tokens.entries().values())) == 4


def test_a_kept_file_without_a_worker_entry_loads_and_gets_a_new_worker_token(
    tmp_path: Path,
) -> None:
    """``--keep-tokens`` with a file written before the worker role: its tokens are
    kept, a new worker token is made (and written with them); a worker entry that
    repeats another token is refused."""
    old = Tokens.generate()
    path = tmp_path / "h_1.json"
    path.write_text(json.dumps({"admin": old.admin, "read": old.read, "submit": old.submit}))
    path.chmod(0o600)
    kept = Tokens.kept(path)
    assert kept is not None
    assert (kept.admin, kept.read, kept.submit) == (old.admin, old.read, old.submit)
    assert len(kept.worker) == 64 and kept.worker not in (old.admin, old.read, old.submit)
    kept.write(path)
    assert Tokens.kept(path) == kept  # the next start keeps that worker token too
    path.write_text(json.dumps({**old.entries(), "worker": old.admin}))
    with pytest.raises(TokenFileError, match="the same one twice"):
        Tokens.kept(path)


# ----------------------------------------------------------------------------- processes

#: a local pool of one worker, thread execution, its peer port among ours
POOL = f"""
[pools.local]
provider = "local"
min_blocks = 1
max_blocks = 1
cores_per_worker = 1
execution = "thread"
worker_port_range = "{PORT_RANGE}"
"""


def started_with() -> str | None:
    """The ``CORRAL_TOKEN`` its worker process was started with: what a task can still
    read in ``/proc/self/environ`` after the worker took it out of ``os.environ``."""
    for entry in Path("/proc/self/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"CORRAL_TOKEN="):
            return entry.partition(b"=")[2].decode()
    return None


def inc(x: int) -> int:
    return x + 1


@pytest.mark.anyio
async def test_the_manager_s_workers_get_the_worker_token_and_fetch_from_admin_workers(
    tmp_path: Path,
) -> None:
    """A manager with a local pool, and a worker started by hand with the admin token
    (pool ``hand``). The pool's worker was started with the worker token, not the admin
    token (before: the admin token); the two workers fetch each other's outputs, as
    both present the manager's worker token to their peers."""
    config = tmp_path / "pools.toml"
    config.write_text(POOL)
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await run(manager, cli, "--config", str(config))
        tokens = cli.tokens(address)
        assert set(tokens) == {"admin", "read", "submit", "worker"}
        await run(
            cli.worker, address, "--name", "by-hand", "--pool", "hand", "--port-range",
            PORT_RANGE, "--token", tokens["admin"],
        )  # fmt: skip
        async with Cluster(address, token=tokens["admin"], manager_alerts=None) as cluster:
            await cluster.wait_for_workers(2)
            assert await cluster.submit(started_with, pool="local") == tokens["worker"]
            there = cluster.submit(inc, 1, pool="local")
            back = cluster.submit(inc, cluster.submit(inc, there, pool="hand"), pool="local")
            assert await back == 4  # local -> hand -> local: fetched both ways


@pytest.mark.anyio
async def test_the_worker_token_joins_a_worker_and_nothing_else(tmp_path: Path) -> None:
    """A worker given the worker token joins and runs a task. As a client, a console or
    on ``/metrics`` the worker token is refused, saying what to use; the submit token as
    a worker is still refused, naming the worker token."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await run(manager, cli)
        tokens = cli.tokens(address)
        worker_file = tmp_path / "worker.token"
        worker_file.write_text(tokens["worker"])
        worker_file.chmod(0o600)
        await run(
            cli.worker, address, "--name", "w", "--port-range", PORT_RANGE,
            "--token-file", str(worker_file),
        )  # fmt: skip
        async with Cluster(address, token=tokens["submit"], manager_alerts=None) as cluster:
            assert await cluster.submit(inc, 1) == 2

        with pytest.raises(PermissionDenied) as refused:
            async with Cluster(address, token=tokens["worker"], manager_alerts=None):
                pass
        said = str(refused.value)
        assert "this token is the worker token, which only joins workers" in said, said
        assert "a client (Cluster, runtime.get) needs the submit token" in said, said

        console = cli.start("console", address, "status", "--token-file", str(worker_file))
        out = "".join(await run(cli.rest, console, LIMIT))
        assert await run(console.wait, LIMIT) == 1, out
        assert "PermissionDenied" in out and "this token is the worker token" in out, out
        assert "a console the read token to look" in out, out

        url = address.replace("ws://", "http://") + "/metrics"
        assert (await run(http_get, url, tokens["worker"]))[0] == 403

        submit = cli.start(
            "worker", address, "--port-range", PORT_RANGE, "--token", tokens["submit"]
        )
        assert await run(submit.wait, LIMIT) == 1
        out = "".join(await run(cli.rest, submit, LIMIT))
        assert "this token is the submit token; workers need the worker token" in out, out
