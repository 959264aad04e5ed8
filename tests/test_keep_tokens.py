"""``manager --keep-tokens``: a manager restarted takes up the tokens of its token file
instead of making new ones, so workers, clients and Prometheus holding copies of them
(machines without a shared file system) are not locked out by each restart; removing
the file rotates them (docs/security.md#keeping-tokens-across-restarts). Before, every
start made new tokens and there was no way to keep them."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import pytest

import runtime.node as node
from runtime import Cluster, TokenFileError
from tests.helpers import Cli, free_port

LIMIT = 60
run = anyio.to_thread.run_sync
ADMIN, READ, SUBMIT = "a1" * 32, "b2" * 32, "c3" * 32


def manager_file(path: Path, data: object, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(data))
    path.chmod(mode)
    return path


def inc(x: int) -> int:
    return x + 1


# ----------------------------------------------------------------------------- the file


def test_no_file_means_new_tokens(tmp_path: Path) -> None:
    assert node.Tokens.kept(tmp_path / "none.json") is None


def test_a_manager_s_own_file_is_kept(tmp_path: Path) -> None:
    path = manager_file(tmp_path / "t.json", {"admin": ADMIN, "read": READ, "submit": SUBMIT})
    kept = node.Tokens.kept(path)  # (a new worker token: tests/test_worker_token.py)
    assert kept is not None and (kept.admin, kept.read, kept.submit) == (ADMIN, READ, SUBMIT)
    # One from before the submit role: its two tokens kept, a new submit token made.
    path = manager_file(tmp_path / "t.json", {"admin": ADMIN, "read": READ})
    kept = node.Tokens.kept(path)
    assert kept is not None and (kept.admin, kept.read) == (ADMIN, READ)
    assert kept.submit not in (ADMIN, READ, SUBMIT) and len(kept.submit) == 64


@pytest.mark.parametrize(
    ("data", "mode", "said"),
    [
        ({"admin": ADMIN, "read": READ}, 0o644, "let other users read or change it"),
        ({"admin": ADMIN}, 0o600, "nor a manager's token file with the 'read' entry"),
        (
            None,
            0o600,
            "holds one token (or the same one twice)",
        ),  # one token, not the manager's file
        ({"admin": ADMIN, "read": ADMIN}, 0o600, "not a manager's admin and read tokens"),
        (
            {"admin": ADMIN, "read": READ, "submit": ADMIN},
            0o600,
            "not a manager's admin and read tokens (and its submit and worker tokens",
        ),
        ({"admin": ADMIN, "read": READ, "submit": "short"}, 0o600, "32 characters or more"),
        ({"admin": "short", "read": READ}, 0o600, "32 characters or more"),
    ],
)
def test_a_file_that_cannot_be_kept_is_refused_saying_how_to_rotate(
    tmp_path: Path, data: object, mode: int, said: str
) -> None:
    """Not new tokens made in its place: that would lock out, without a word, every
    holder of the old ones (the very thing --keep-tokens is for)."""
    path = tmp_path / "t.json"
    if data is None:
        path.write_text(ADMIN)
        path.chmod(mode)
    else:
        manager_file(path, data, mode)
    with pytest.raises(TokenFileError) as info:
        node.Tokens.kept(path)
    text = str(info.value)
    assert said in text, text
    assert "(--keep-tokens: it must be the manager's own token file" in text, text
    assert "remove it, or start the manager without --keep-tokens" in text, text
    assert ADMIN not in text and "write the manager's admin token" not in text, text


def test_keep_tokens_needs_a_fixed_port_or_a_token_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--keep-tokens needs a fixed port"):
        node._kept_token_path("ws://127.0.0.1:0", None)
    assert node._kept_token_path("ws://127.0.0.1:0", tmp_path / "t") == tmp_path / "t"


# ----------------------------------------------------------------------------- processes


@pytest.mark.anyio
async def test_a_restarted_manager_keeps_accepting_the_copied_admin_token(
    tmp_path: Path,
) -> None:
    """A worker and a client elsewhere (their own CORRAL_HOME, the admin token copied to
    a file of their own): the manager is killed (-9) and started again with
    --keep-tokens; the worker rejoins it with its copy and the client's task runs.
    Then rotation: stopped, its token file removed, started again, it has new tokens
    and refuses the old one (HTTP 403)."""
    port = free_port()
    listen = ["manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--keep-tokens"]
    with Cli(tmp_path / "home") as cli, anyio.fail_after(2 * LIMIT):
        cli.env.pop("CORRAL_TOKEN", None)
        first = cli.start(*listen)
        line = await run(cli.line_with, first, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        old = cli.tokens(address)
        assert set(old) == {"admin", "read", "submit", "worker"}
        copy = tmp_path / "elsewhere" / "worker.token"  # another machine's copy
        copy.parent.mkdir()
        copy.write_text(old["admin"] + "\n")
        copy.chmod(0o600)
        cli.env["CORRAL_HOME"] = str(tmp_path / "elsewhere")  # no token file to find
        worker = cli.start(
            "worker", address, "--name", "w", "--token-file", str(copy), "--connect-retry", "60"
        )
        await run(cli.line_with, worker, f"joined {address}")

        first.kill()  # a crash; systemd's Restart=on-failure starts it again
        await run(first.wait, LIMIT)
        cli.env["CORRAL_HOME"] = str(tmp_path / "home")
        second = cli.start(*listen)
        await run(cli.line_with, second, "manager listening on")
        assert cli.tokens(address) == old
        async with Cluster(address, token=old["admin"], manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1)  # the worker rejoined with its copy
            assert await cluster.submit(inc, 1) == 2
        async with Cluster(address, token=old["submit"], manager_alerts=None) as cluster:
            assert await cluster.submit(inc, 2) == 3  # a student's copy of the submit token
        assert worker.poll() is None

        second.send_signal(signal.SIGTERM)  # rotation: stop, remove the file, start
        assert await run(second.wait, LIMIT) == 0
        os.remove(cli.home / "tokens" / f"127.0.0.1_{port}.json")
        third = cli.start(*listen)
        await run(cli.line_with, third, "manager listening on")
        new = cli.tokens(address)
        assert all(new[role] != old[role] for role in ("admin", "read", "submit"))
        proc = cli.start("console", address, "status", "--token-file", str(copy))
        out = "".join(await run(cli.rest, proc, LIMIT))
        assert await run(proc.wait, LIMIT) == 1
        assert "HTTP 403" in out, out
