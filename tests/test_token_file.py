"""``--token-file PATH`` of a worker and a console, ``Cluster(address, token_file=...)``:
the token read from a file (a ``--token`` shows in ``ps`` to every user of a login node;
docs/security.md#tokens-on-another-machine).

The file is one token, whitespace around it stripped, or the manager's own token file
(JSON): a worker takes its worker entry (its admin entry if it has none), a client its
admin entry, a console too, or its read entry with ``--read-only``. It wins over
``CORRAL_TOKEN``, as ``--token`` does. A file that is missing, a directory, empty, open
to group or others, not one token, or given with a token too is a
:class:`TokenFileError` saying what to do (unit tests below); the real processes show
the token taken from it: a manager, workers and consoles on 127.0.0.1 whose
``CORRAL_HOME`` is elsewhere (no token file to find, as on another machine) and whose
``CORRAL_TOKEN`` is wrong."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

import runtime.node as node
from runtime import Cluster, CorralError, PermissionDenied, TokenFileError
from runtime.__main__ import main
from tests.helpers import Cli

LIMIT = 60
run = anyio.to_thread.run_sync
WRONG = "0" * 64  #: a CORRAL_TOKEN the manager does not know
SECRET = "c0ffee" * 10  #: a token the errors must never quote


def token_file(path: Path, text: str | bytes, mode: int = 0o600) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(mode)
    return path


# ----------------------------------------------------------------------------- reading


def test_the_token_is_the_file_s_text_stripped(tmp_path: Path) -> None:
    path = token_file(tmp_path / "token", f"  \n{SECRET}\r\n\n")
    assert node.read_token_file(path) == SECRET
    assert node.read_token_file(str(path), "read") == SECRET  # one token: the role is not asked


def test_a_leading_tilde_is_the_home_directory(tmp_path: Path, monkeypatch: Any) -> None:
    """``Cluster(address, token_file="~/...")``: no shell expands it there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    token_file(tmp_path / "t", SECRET)
    assert node.read_token_file("~/t") == SECRET


def test_the_manager_s_own_token_file_gives_its_admin_or_read_entry(tmp_path: Path) -> None:
    """Pointed at the file a manager writes (``Tokens.write``, e.g. on a shared file
    system): a worker or client takes its admin token, a --read-only console its read
    token."""
    tokens = node.Tokens.generate()
    path = tmp_path / "h_1.json"
    tokens.write(path)
    assert node.read_token_file(path) == tokens.admin
    assert node.read_token_file(path, "read") == tokens.read
    assert node.find_token("ws://h:1", None, "read", token_file=path) == tokens.read


def test_the_file_wins_over_corral_token(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("CORRAL_TOKEN", WRONG)
    path = token_file(tmp_path / "token", SECRET)
    assert node.find_token("ws://h:1", None, token_file=path) == SECRET
    assert node.find_token("ws://h:1", None) == WRONG  # without it, the environment, as before


# ----------------------------------------------------------------------------- refusals


def refusal(path: Path | str, role: str = "admin") -> str:
    with pytest.raises(TokenFileError) as caught:
        node.read_token_file(path, role)
    text = str(caught.value)
    assert caught.value.path == os.fspath(path) and text.startswith(f"token file {path}: ")
    assert SECRET not in text, text  # never the file's text
    assert isinstance(caught.value, ValueError)
    return text


def test_a_missing_file_is_refused_saying_what_to_put_there(tmp_path: Path) -> None:
    text = refusal(tmp_path / "nope")
    assert "no such file; write the manager's admin token in it" in text, text
    assert f"chmod 600 {tmp_path / 'nope'}" in text, text


def test_a_missing_file_names_the_token_of_the_role_that_reads_it(tmp_path: Path) -> None:
    """A worker is told to write the worker token, a Python client the submit token (or
    the operator's admin token), a console the admin or read token it reads; each was
    told the admin token (audit ops F6), which would spread it to workers and to every
    person sharing the manager. So is the missing token file of the manager on this
    machine (``Tokens.read_file``)."""
    where = "(the {0!r} entry of the manager's own token file, ~/.corral/tokens/HOST_PORT.json"
    missing = tmp_path / "nope"
    said = refusal(missing, "worker")
    assert "no such file; write the manager's worker token in it " + where.format("worker") in said
    said = refusal(missing, "read")
    assert "no such file; write the manager's read token in it " + where.format("read") in said
    with pytest.raises(TokenFileError) as caught:
        node.find_token("ws://h:1", None, token_file=missing, give=node.GIVE_TOKEN_PY)
    assert (
        "no such file; write the manager's submit token in it "
        + where.format("submit")
        + " on its machine; its 'admin' entry if you are the cluster's operator), readable by "
        f"you only (chmod 600 {missing})"
    ) in str(caught.value), caught.value
    file = tmp_path / "127.0.0.1_8786.json"
    copies = {
        node.GIVE_TOKEN_WORKER: "copy the worker token (its 'worker' entry) from that file",
        node.GIVE_TOKEN_PY: "copy the submit token (its 'submit' entry; the admin token if you "
        "are the cluster's operator) from that file",
        node.GIVE_TOKEN_CLI: "copy the admin token from that file",
    }
    for give, copy in copies.items():
        with pytest.raises(CorralError) as info:
            node.Tokens.read_file(file, give)
        assert f"Otherwise {copy} on the manager's machine and pass it {give}" in str(info.value)


def test_a_relative_missing_path_names_the_working_directory(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    text = refusal("nope")
    assert f"no such file (from the working directory {tmp_path})" in text, text


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert "is a directory: give the path of the file that holds the token" in refusal(tmp_path)


@pytest.mark.parametrize("text", ["", " \n\t\n"])
def test_an_empty_file_is_refused(tmp_path: Path, text: str) -> None:
    assert ": is empty; write the manager's admin token" in refusal(
        token_file(tmp_path / "t", text)
    )


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620, 0o660, 0o601], ids=oct)
def test_a_file_open_to_group_or_others_is_refused_with_the_chmod_that_fixes_it(
    tmp_path: Path, mode: int
) -> None:
    """As ssh refuses a private key that is too open: any permission for group or
    others, read or write, even when the token in it is right."""
    path = token_file(tmp_path / "my token", SECRET, mode)
    text = refusal(path)
    assert "let other users read or change it" in text, text
    assert text.endswith(f"Make it yours only: chmod 600 '{path}'"), text  # shell-quoted
    path.chmod(0o600)
    assert node.read_token_file(path) == SECRET  # fixed as it says
    path.chmod(0o400)
    assert node.read_token_file(path) == SECRET  # read-only for the owner is fine too


@pytest.mark.parametrize(
    "text, says",
    [
        (f"{SECRET} {SECRET}", "holds more than one word"),
        (f"{SECRET}\n{SECRET}\n", "holds more than one word"),
        (f"{SECRET}\x00", "holds control characters"),
        (b"\xff\xfe" + SECRET.encode(), "is not text"),
        ('{"read": "' + SECRET + '"}', "nor a manager's token file with the 'admin' entry"),
        ("{" + SECRET, "nor a manager's token file with the 'admin' entry"),
        ("x" * (64 * 1024 + 1), "holds more than 64 KiB"),
    ],
)
def test_a_file_that_is_not_one_token_is_refused(
    tmp_path: Path, text: str | bytes, says: str
) -> None:
    assert says in refusal(token_file(tmp_path / "t", text)), says


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    """A named pipe with no writer would block an open(): refused without waiting."""
    os.mkfifo(tmp_path / "fifo", 0o600)
    assert "is not a regular file" in refusal(tmp_path / "fifo")


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    """Another user's file, mode 0600. Root reads any file, so as root the test reads
    it as ``nobody`` (its effective user id, for the call only)."""
    if os.geteuid() != 0:
        assert "this user may not read it" in refusal(token_file(tmp_path / "t", SECRET, 0))
        return
    with tempfile.TemporaryDirectory() as where:
        os.chmod(where, 0o755)  # nobody may look in it, not read the file
        path = token_file(Path(where) / "t", SECRET)
        os.seteuid(65534)
        try:
            text = refusal(path)
        finally:
            os.seteuid(0)
    assert "this user may not read it" in text, text


def test_a_token_and_a_token_file_together_are_refused(tmp_path: Path) -> None:
    path = token_file(tmp_path / "t", SECRET)
    with pytest.raises(TokenFileError, match=r"given together with a token .*give one of them"):
        node.find_token("ws://h:1", SECRET, token_file=path)
    with pytest.raises(TokenFileError, match="given together with a token"):
        Cluster("ws://h:1", token=SECRET, token_file=path)  # at once, not at connect


def test_token_file_without_an_address_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("token_file= is for Cluster(address, ...)")):
        Cluster(token_file=tmp_path / "t")


def test_the_worker_command_refuses_a_bad_file_before_it_starts(
    tmp_path: Path, capsys: Any
) -> None:
    """Exit 1 and one line saying what to do, before it listens or dials anything (no
    manager listens at the address: it never gets that far)."""
    path = token_file(tmp_path / "t", SECRET, 0o644)
    assert main(["worker", "ws://127.0.0.1:9", "--token-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: TokenFileError: token file {path}: its permissions"), err
    assert err.rstrip().endswith(f"chmod 600 {path}") and SECRET not in err, err
    argv = ["worker", "ws://127.0.0.1:9", "--token", SECRET, "--token-file", str(path)]
    assert main(argv) == 1
    assert "given together with a token" in capsys.readouterr().err


@pytest.mark.parametrize(
    "where",
    [["--token", "T", "ws://127.0.0.1:9", "status"], ["ws://127.0.0.1:9", "status", "--token=T"]],
)
def test_the_console_refuses_a_token_and_a_token_file_together(
    tmp_path: Path, capsys: Any, where: list[str]
) -> None:
    """--token and --token-file, before or after the address: exit 1, nothing dialled."""
    path = token_file(tmp_path / "t", SECRET)
    assert main(["console", *where, "--token-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: TokenFileError: token file {path}: given together"), err


def test_the_console_takes_token_file_before_or_after_the_address() -> None:
    from runtime.__main__ import build_parser
    from runtime.console import split_cli_options

    args = build_parser().parse_args(["console", "--token-file", "/p", "ws://h:1", "status"])
    assert args.token_file == "/p" and args.words == ["status"]
    words, found = split_cli_options(["status", "--token-file=/q", "--read-only"])
    assert words == ["status"] and found == {"token_file": "/q", "read_only": True}


# ----------------------------------------------------------------------------- processes


def inc(x: int) -> int:
    return x + 1


@pytest.mark.anyio
async def test_workers_consoles_and_a_client_take_the_token_from_a_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A manager; everything else runs as on another machine (``CORRAL_HOME`` empty:
    no token file to find) with a wrong ``CORRAL_TOKEN``, which ``--token-file`` wins
    over. A worker reads a file of one token, another the manager's own file (its worker
    entry); a one-shot console sees both; a read-only console given the manager's file
    presents its read token and may not drain; a ``Cluster(address, token_file=...)``
    runs a task on them; a console with the manager's file drains a worker, which
    leaves with status 0."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager, address = await run(cli.manager)
        parts = urlsplit(address)
        tokens_json = cli.home / "tokens" / f"{parts.hostname}_{parts.port}.json"
        plain = token_file(tmp_path / "admin.token", f"{cli.tokens(address)['admin']}\n")
        cli.env = dict(cli.env, CORRAL_HOME=str(elsewhere), CORRAL_TOKEN=WRONG)

        def once(*words: str) -> tuple[int, str]:
            proc = cli.start("console", address, *words)
            out = "".join(cli.rest(proc, LIMIT))
            return proc.wait(LIMIT), out

        a = await run(cli.worker, address, "--name", "a", "--token-file", str(plain))
        b = await run(cli.worker, address, "--name", "b", "--token-file", str(tokens_json))

        code, out = await run(once, "--token-file", str(plain), "status", "--json")
        assert code == 0, out
        assert {w["worker_id"] for w in json.loads(out)["workers"]} == {"a", "b"}, out

        code, out = await run(once, "drain", "a", "--token-file", str(tokens_json), "--read-only")
        assert code == 1 and "PermissionDenied: DrainRequest needs the admin token" in out, out

        read = token_file(tmp_path / "read.token", cli.tokens(address)["read"])
        with monkeypatch.context() as env:  # undone before Cli restores CORRAL_HOME
            env.setenv("CORRAL_HOME", str(elsewhere))
            env.setenv("CORRAL_TOKEN", WRONG)
            async with Cluster(address, token_file=plain, manager_alerts=None) as cluster:
                assert await cluster.submit(inc, 1) == 2
            with pytest.raises(PermissionDenied) as refused:
                async with Cluster(address, token_file=read, manager_alerts=None):
                    pass
        said = str(refused.value)
        assert f"This client presented the token of its token_file={str(read)!r}" in said, said

        code, out = await run(once, "--token-file", str(tokens_json), "drain", "b")
        assert code == 0, out
        assert await run(b.wait, LIMIT) == 0  # drained: it leaves, status 0
        assert a.poll() is None and manager.poll() is None


@pytest.mark.anyio
async def test_a_token_the_manager_does_not_know_is_refused_saying_where_it_came_from(
    tmp_path: Path,
) -> None:
    """The other half of the test above: the same console, without ``--token-file``,
    presents the wrong ``CORRAL_TOKEN`` and is refused (HTTP 403), saying so; with a
    file of a token the manager does not know, it says it presented that file's."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await run(cli.manager)
        cli.env = dict(cli.env, CORRAL_HOME=str(elsewhere), CORRAL_TOKEN=WRONG)
        proc: subprocess.Popen[str] = cli.start("console", address, "status")
        out = "".join(await run(cli.rest, proc, LIMIT))
        assert await run(proc.wait, LIMIT) == 1
        assert "AuthenticationFailed" in out and "HTTP 403" in out, out
        assert "presented CORRAL_TOKEN from the environment" in out, out

        stale = token_file(tmp_path / "stale.token", "f" * 64)  # a restarted manager's, say
        proc = cli.start("console", address, "status", "--token-file", str(stale))
        out = "".join(await run(cli.rest, proc, LIMIT))
        assert await run(proc.wait, LIMIT) == 1
        assert "HTTP 403" in out and f"presented the token of --token-file {stale}" in out, out


@pytest.mark.anyio
async def test_a_worker_rejoins_a_restarted_manager_with_the_new_token_of_its_file(
    tmp_path: Path,
) -> None:
    """The manager crashes (kill -9) and restarts on the same port, writing a new
    token into its --token-file, which the worker's --token-file names: the worker
    reads the file again at each try and rejoins, and runs the next client's task; it
    retried the old token and exited 1 after 10 s before."""
    from tests.helpers import free_port

    tokens = tmp_path / "tokens.json"
    listen = ["manager", "--listen", f"127.0.0.1:{free_port()}", "--token-file", str(tokens)]
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        first = cli.start(*listen)
        line = await run(cli.line_with, first, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        old = json.loads(tokens.read_text())["admin"]
        worker = await run(cli.worker, address, "--name", "w", "--token-file", str(tokens))
        first.kill()
        await run(first.wait, LIMIT)
        second = cli.start(*listen)
        await run(cli.line_with, second, "manager listening on")
        assert json.loads(tokens.read_text())["admin"] != old
        async with Cluster(address, token_file=tokens, manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1)
            assert await cluster.submit(inc, 1) == 2
        assert worker.poll() is None


@pytest.mark.anyio
async def test_a_worker_with_connect_retry_waits_for_a_manager_started_after_it(
    tmp_path: Path,
) -> None:
    """``--connect-retry 60``: a worker started before its manager (no one listens, its
    --token-file not written yet) logs each failed try and joins once the manager is
    up; without it, it exited 1 at once."""
    from tests.helpers import free_port

    tokens = tmp_path / "tokens.json"
    port = free_port()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        worker = cli.start(
            "worker", f"ws://127.0.0.1:{port}", "--token-file", str(tokens),
            "--connect-retry", "60",
        )  # fmt: skip
        await run(cli.line_with, worker, "could not reach the manager; retrying")
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--token-file", str(tokens))
        line = await run(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        await run(cli.line_with, worker, f"joined {address}")
        async with Cluster(address, token_file=tokens, manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1)
            assert await cluster.submit(inc, 1) == 2


# ----------------------------------------------------------------------------- no one there


def _nothing_listens(text: str, home: Path, port: int) -> None:
    """``text`` says that nothing listens at 127.0.0.1:``port`` (the real cause), and
    where its token file would be, not that a token is to be copied."""
    assert f"could not connect to ws://127.0.0.1:{port}: nothing accepted the connection" in (
        " ".join(text.split())
    ), text
    assert "Check that a listener is running at that address" in text, text
    assert f"Nor is there a token file for that address on this machine, at {home / 'tokens'}" in (
        text
    ), text
    assert "copy the admin token" not in text, text


@pytest.mark.anyio
async def test_a_client_at_a_port_where_nothing_listens_is_told_so_not_to_copy_a_token(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``Cluster("ws://127.0.0.1:PORT")`` with no token and no token file for it: a
    wrong port, or a manager not up yet, is ``ConnectFailed`` (nothing accepted the
    connection), not "no token file ... copy the admin token" (a user audit found it)."""
    from runtime import ConnectFailed
    from tests.helpers import free_port

    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    port = free_port()
    with anyio.fail_after(LIMIT), pytest.raises(ConnectFailed) as info:
        async with Cluster(f"ws://127.0.0.1:{port}", manager_alerts=None):
            pass
    _nothing_listens(str(info.value) + " ".join(info.value.__notes__), tmp_path, port)


@pytest.mark.anyio
async def test_a_console_and_a_worker_at_a_port_where_nothing_listens_say_so(
    tmp_path: Path,
) -> None:
    """The console and a worker (one try) exit 1 with ``ConnectFailed``; a console at a
    manager that listens there but wrote its tokens elsewhere (--token-file) is told of
    the missing token file, as before."""
    from tests.helpers import free_port

    port = free_port()
    home = tmp_path / "home"
    with Cli(home) as cli, anyio.fail_after(LIMIT):
        cli.env.pop("CORRAL_TOKEN", None)
        for argv in (["console", f"ws://127.0.0.1:{port}", "status"],
                     ["worker", f"ws://127.0.0.1:{port}"]):  # fmt: skip
            proc = cli.start(*argv)
            out = "".join(await run(cli.rest, proc, LIMIT))
            assert proc.wait(LIMIT) == 1, out
            assert "error: ConnectFailed:" in out, out
            _nothing_listens(out, home, port)
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "t.json")
        )
        await run(cli.line_with, manager, "manager listening on")
        proc = cli.start("console", f"ws://127.0.0.1:{port}", "status")
        out = "".join(await run(cli.rest, proc, LIMIT))
        assert proc.wait(LIMIT) == 1, out
        assert f"error: CorralError: no token file at {home / 'tokens'}" in out, out
        assert "copy the admin token" in out, out
        assert "with --token-file PATH (or --token, which ps shows" in out, out
        assert "to look only, pass the read token" in out, out
        # A worker is pointed at --token-file and the admin token, not at --token and
        # the read token, which it cannot use (it said both: audit newcomer, defect 7).
        proc = cli.start("worker", f"ws://127.0.0.1:{port}")
        out = " ".join("".join(await run(cli.rest, proc, LIMIT)).split())
        assert proc.wait(LIMIT) == 1, out
        assert f"error: CorralError: no token file at {home / 'tokens'}" in out, out
        assert (
            "copy the worker token (its 'worker' entry) from that file on the manager's "
            "machine and pass it to this worker in a file readable by you only (chmod 600) "
            "with --token-file PATH (or set CORRAL_TOKEN); a worker needs the worker token "
            "(that file's 'worker' entry: the better choice) or the admin token, not the read "
            "token"
        ) in out, out
        assert "--token " not in out and "to look only" not in out, out


@pytest.mark.anyio
async def test_a_worker_with_connect_retry_waits_for_a_manager_whose_token_file_is_not_written(
    tmp_path: Path,
) -> None:
    """``--connect-retry`` on a fresh ``CORRAL_HOME`` with no token flag: nothing listens
    and the manager's token file on this machine is not written yet. The worker logs
    each failed try as nothing listening, and joins once the manager is up and has
    written the file (docs/deployment.md#as-systemd-services)."""
    from tests.helpers import free_port

    port = free_port()
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        cli.env.pop("CORRAL_TOKEN", None)
        worker = cli.start("worker", f"ws://127.0.0.1:{port}", "--connect-retry", "60")
        line = await run(cli.line_with, worker, "could not reach the manager; retrying")
        assert "nothing accepted the connection" in line, line
        assert not (tmp_path / "home" / "tokens").exists()
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}")
        line = await run(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        await run(cli.line_with, worker, f"joined {address}")
        async with Cluster(address, manager_alerts=None) as cluster:
            await cluster.wait_for_workers(1)
            assert await cluster.submit(inc, 1) == 2


@pytest.mark.anyio
async def test_a_worker_try_that_takes_its_whole_connect_timeout_is_a_warning(
    tmp_path: Path,
) -> None:
    """A manager that takes the TCP connection and answers nothing (stalled, or a
    network that drops its packets): each try to reach it lasts its connect timeout. The
    first such failed try is logged at warning, not at info as the quick first tries of
    a manager not listening are, so a worker waiting out a stall shows its progress at
    the default log level (multi audit, finding 4: 45 s of a 60 s stall said nothing)."""
    import socket

    with socket.socket() as mute, Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)  # never accepted: the kernel completes the TCP handshake only
        cli.env["CORRAL_CONNECT_TIMEOUT"] = "1.5"
        cli.env["CORRAL_TOKEN"] = "t" * 64
        address = f"ws://127.0.0.1:{mute.getsockname()[1]}"
        worker = cli.start("worker", address, "--connect-retry", "30")
        line = await run(cli.line_with, worker, "could not reach the manager; retrying")
    assert "no websocket connection within 1.5 s" in line, line
    assert "level='warning'" in line, line
    # the first try's line (of a 30 s window, 1.5 s gone), not the fifth's, whose backoff
    # (0.05 s doubling) reached a second after five tries of 1.5 s
    left = float(line.split("left=", 1)[1].split()[0])
    assert left > 30 - 2 * 1.5, line


@pytest.mark.anyio
async def test_a_python_client_with_no_token_file_is_told_of_token_not_the_cli_flag(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``Cluster(address)`` and ``runtime.get(..., address=...)`` at a manager whose token
    file is not in this process's ``CORRAL_HOME``: the error says ``token=``,
    ``token_file=``, ``CORRAL_TOKEN`` and ``CORRAL_HOME``, not the commands' ``--token``
    (audit mleng, defect 5), and not the read token, which a client cannot use."""
    import dask

    import runtime
    from runtime.errors import CorralError
    from tests.helpers import free_port

    port = free_port()
    home = tmp_path / "home"
    address = f"ws://127.0.0.1:{port}"
    monkeypatch.setenv("CORRAL_HOME", str(home))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with Cli(home) as cli, anyio.fail_after(LIMIT):
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "t.json")
        )
        await run(cli.line_with, manager, "manager listening on")
        with pytest.raises(CorralError) as info:
            async with Cluster(address, manager_alerts=None):
                pass
        texts = [str(info.value)]

        def get() -> None:
            dask.compute(dask.delayed(abs)(-1), scheduler=runtime.get, address=address)

        with pytest.raises(CorralError) as info:
            await run(get)
        texts.append(str(info.value))
    for text in texts:
        assert f"no token file at {home / 'tokens'}" in text, text
        assert "as token= (or the path of a file holding it as token_file=)" in text, text
        assert "or set CORRAL_TOKEN" in text and "set the same CORRAL_HOME here" in text, text
        assert "--token " not in text and "--token)" not in text, text
        assert "read token" not in text, text
        assert (
            "Otherwise copy the submit token (its 'submit' entry; the admin token if you are "
            "the cluster's operator) from that file on the manager's machine"
        ) in text, text


@pytest.mark.anyio
async def test_a_worker_refused_at_its_start_says_why_and_what_to_do(tmp_path: Path) -> None:
    """A worker given a token the manager does not know got the listener's generic 403
    text at its start; only when rejoining did it ask whether the manager was restarted
    with new tokens. Now its first refusal says so too, and what to do for where its
    token came from (--token, --token-file, CORRAL_TOKEN, the manager's token file on
    this machine), and that --keep-tokens keeps a manager's tokens across restarts."""
    from tests.helpers import free_port_between

    port = free_port_between(36000, 36999)
    elsewhere = tmp_path / "elsewhere"  # as on another machine: no token file to find
    stale = token_file(tmp_path / "stale.token", "f" * 64)  # a restarted manager's, say
    with Cli(tmp_path / "home") as cli, anyio.fail_after(4 * LIMIT):
        first = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        await run(cli.line_with, first, "manager listening on")
        address = f"ws://127.0.0.1:{port}"
        local = elsewhere / "tokens" / f"127.0.0.1_{port}.json"  # an old manager's there
        local.parent.mkdir(parents=True)
        token_file(local, json.dumps({"admin": WRONG, "read": "e" * 64}))
        cases = [
            (["--token", WRONG], {}, "presented the token it was given (--token): start it "
             "again with the manager's current worker token (or its admin token)"),
            (["--token-file", str(stale)], {}, f"presented the token of --token-file {stale} "
             "(its 'worker' entry, or its 'admin' entry if it has none, if it is a manager's "
             "token file): write the manager's current worker token (or its admin token) in "
             "it and start the worker again"),
            ([], {"CORRAL_TOKEN": WRONG}, "presented CORRAL_TOKEN from the environment (it "
             "wins over the manager's token file on this machine): set it to the manager's "
             "current worker token (or its admin token), or unset it"),
            ([], {}, "presented the worker token (or, without one, the admin token) of "
             f"{local}, where a manager listening at "
             "that address on this machine writes its tokens"),
        ]  # fmt: skip
        base = dict(cli.env, CORRAL_HOME=str(elsewhere))
        base.pop("CORRAL_TOKEN", None)
        for flags, env, says in cases:
            cli.env = dict(base, **env)
            proc = cli.start("worker", address, *flags)
            out = "".join(await run(cli.rest, proc, LIMIT))
            assert await run(proc.wait, LIMIT) == 1, out
            assert (
                f"error: AuthenticationFailed: could not connect to {address}: the manager "
                "refused this worker's token (HTTP 403); was it restarted with new tokens? "
                f"This worker {says}"
            ) in out, out
            assert "started with --keep-tokens keeps its tokens across restarts" in out, out
            assert WRONG not in out, out


@pytest.mark.anyio
async def test_a_client_refused_its_token_says_where_it_came_from_and_to_use_the_submit_token(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A client whose token the manager does not know (a restart made new ones, say) got
    the listener's generic 403 text, which named only the admin and read tokens and
    ended with the transport's listen(..., tokens=...): now it says, as a worker's and a
    console's refusals do, where its token came from (token=, token_file=, CORRAL_TOKEN,
    the manager's token file on this machine) and that a client needs the submit token
    (audit ops F4)."""
    from runtime import AuthenticationFailed
    from tests.helpers import free_port_between

    port = free_port_between(50000, 50499)
    address = f"ws://127.0.0.1:{port}"
    elsewhere = tmp_path / "elsewhere"  # as on another machine: no token file to find
    stale = token_file(tmp_path / "stale.token", "f" * 64)
    local = elsewhere / "tokens" / f"127.0.0.1_{port}.json"
    needs = (
        "A client (Cluster, runtime.get) needs the submit token, the 'submit' entry of the "
        "manager's token file ($CORRAL_HOME/tokens/HOST_PORT.json of the manager's user on "
        "its machine, CORRAL_HOME being ~/.corral unless set, or the file its --token-file "
        "names), or the admin token if you are the cluster's operator: ask the operator for "
        "the current one (a manager makes new tokens each time it starts, unless it runs "
        "with --keep-tokens: docs/security.md#keeping-tokens-across-restarts)."
    )
    refused = (
        f"could not connect to {address}: the manager refused this client's token (HTTP "
        "403: it matches none of the manager's tokens). "
    )
    cases = [
        ({"token_file": stale}, {}, f"This client presented the token of its token_file="
         f"{str(stale)!r} (its 'admin' entry, if it is a manager's token file): write the "
         "manager's current submit token in it. "),
        ({"token": WRONG}, {}, "This client presented the token it was given (token=...): "
         "pass the manager's current submit token. "),
        ({}, {"CORRAL_TOKEN": WRONG}, "This client presented CORRAL_TOKEN from the "
         "environment (it wins over the token file): set it to the manager's current submit "
         "token, or unset it. "),
        ({}, {}, f"This client presented the admin token of {local}, where a manager "
         "listening at that address on this machine writes its tokens: stale if that "
         "manager was restarted since, or another manager's if this one runs elsewhere "
         "(another machine, another CORRAL_HOME or --token-file): pass the manager's current "
         "submit token as token_file= or token=. "),
    ]  # fmt: skip
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        await run(cli.line_with, manager, "manager listening on")
        local.parent.mkdir(parents=True)
        token_file(local, json.dumps({"admin": WRONG, "read": "e" * 64}))
        for kwargs, env, says in cases:
            with monkeypatch.context() as patch:  # undone before Cli restores CORRAL_HOME
                patch.setenv("CORRAL_HOME", str(elsewhere))
                patch.delenv("CORRAL_TOKEN", raising=False)
                for name, value in env.items():
                    patch.setenv(name, value)
                with pytest.raises(AuthenticationFailed) as caught:
                    async with Cluster(address, manager_alerts=None, **kwargs):
                        pass
            assert str(caught.value) == refused + says + needs
            assert caught.value.status == 403 and WRONG not in str(caught.value)
