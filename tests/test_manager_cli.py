"""``python -m runtime manager`` that cannot start: every listener it opens says which
flag's address is taken (a typed ``AddressInUse``, as the main ``--listen``), and a
start-up failure (an option out of range, a bad address, a port in use) prints no
monitoring database nor report command and leaves no run directory or token file
behind: the options are checked before anything starts, and the database is made once
the manager listens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, Cli, free_port_between

LIMIT = 60  # seconds per process: it fails at once (or, unfixed, runs until killed)


@pytest.fixture
def taken() -> Iterator[int]:
    """A port of 127.0.0.1 something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def manager(
    home: Path, *flags: str, before: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m runtime [BEFORE...] manager FLAGS...``, to its end (``env``: variables
    besides its ``CORRAL_HOME``; none of this process's ``CORRAL_*``)."""
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), PYTHONPATH=str(ROOT), **extra)
    try:
        return subprocess.run(
            [sys.executable, "-m", "runtime", *before, "manager", *flags],
            env=env, capture_output=True, text=True, timeout=LIMIT, cwd=ROOT,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the manager did not stop: {exc.stdout!r}") from None


def assert_nothing_left(done: subprocess.CompletedProcess[str], home: Path) -> str:
    """It failed (exit 1) before printing or creating anything; its one-line error."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "monitoring database" not in done.stdout and "report:" not in done.stdout
    assert "manager listening" not in done.stdout
    assert not (home / "runs").exists()  # no empty run directory, no database
    assert not (home / "tokens").exists()
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("error: ")
    return err


def test_a_metrics_port_in_use_is_address_in_use_naming_the_flag(
    tmp_path: Path, taken: int
) -> None:
    home = tmp_path / "home"
    done = manager(home, "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{taken}")
    err = assert_nothing_left(done, home)
    assert err.startswith(f"error: AddressInUse: address http://127.0.0.1:{taken} is already")
    assert f"(--metrics-listen 127.0.0.1:{taken}: stop what listens there" in err
    assert "OSError" not in err and "Errno" not in err


def test_the_listen_port_in_use_names_the_flag_and_leaves_no_run(
    tmp_path: Path, taken: int
) -> None:
    home = tmp_path / "home"
    err = assert_nothing_left(manager(home, "--listen", f"127.0.0.1:{taken}"), home)
    assert err.startswith(f"error: AddressInUse: address ws://127.0.0.1:{taken} is already")
    assert f"(--listen 127.0.0.1:{taken}: stop what listens there" in err


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--prune-depth", "-1"], "error: PruneDepthError: prune_depth must be"),
        (["--long-task", "-1"], "error: LongTaskError: long_task must be a number of seconds"),
        (["--long-task", "nan"], "error: LongTaskError: long_task must be a number of seconds"),
        (["--listen", "nonsense"], "error: InvalidAddress: invalid transport address 'ws://"),
        (["--listen", "foo://x"], "error: InvalidAddress: invalid transport address 'foo://x'"),
        (["--metrics-listen", "127.0.0.1:99999"], "error: ValueError: --metrics-listen takes"),
        (["--monitoring-interval", "0"], "error: ValueError: --monitoring-interval must be"),
        (["--monitoring-keep", "7 days"], "error: ValueError: --monitoring-keep '7 days': a "),
        (["--monitoring-keep", "0"], "error: ValueError: --monitoring-keep '0': a positive"),
        (["--worker-timeout", "0"], "error: ValueError: --worker-timeout must be a number of"),
        (["--worker-timeout", "nan"], "error: ValueError: --worker-timeout must be a number"),
        (["--client-timeout", "-5"], "error: ValueError: --client-timeout must be a number of"),
        (["--client-timeout", "inf"], "error: ValueError: --client-timeout must be a number"),
        (["--reconnect-timeout", "0"], "error: ValueError: --reconnect-timeout must be a number"),
        (["--reconnect-timeout", "-1"], "error: ValueError: --reconnect-timeout must be a "),
        (["--reconnect-timeout", "inf"], "error: ValueError: --reconnect-timeout must be a "),
        (["--reconnect-timeout", "nan"], "error: ValueError: --reconnect-timeout must be a "),
        (["--gc-threshold", "0"], "error: ValueError: --gc-threshold must be a whole number"),
    ],
)
def test_a_bad_option_is_refused_before_anything_is_created(
    tmp_path: Path, flags: list[str], error: str
) -> None:
    home = tmp_path / "home"
    err = assert_nothing_left(manager(home, "--listen", "127.0.0.1:0", *flags), home)
    assert err.startswith(error), err


@pytest.mark.parametrize("where", ["before the command", "after it"])
def test_log_level_counts_before_the_command_as_after_it(tmp_path: Path, where: str) -> None:
    """``python -m runtime --log-level debug manager ...``, as docs/configuration.md
    writes it, logs at debug as ``manager --log-level debug`` does: a failed start shows
    its traceback. (The subcommands share the flag's action, and a default set on the
    top-level parser once overwrote the level given before the command.)"""
    home = tmp_path / "home"
    flags = ("--listen", "127.0.0.1:99999")
    level = ("--log-level", "debug")
    if where == "before the command":
        done = manager(home, *flags, before=level)
    else:
        done = manager(home, *flags, *level)
    err = assert_nothing_left(done, home)
    assert err.startswith("error: InvalidAddress"), err
    assert "Traceback (most recent call last)" in done.stderr, done.stderr
    quiet = manager(home, *flags)  # at warning, the default: the error line alone
    assert assert_nothing_left(quiet, home) == err
    assert "Traceback" not in quiet.stderr, quiet.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [None, "info"])
def test_the_listening_line_is_on_stdout_with_the_token_file_not_a_warning(
    tmp_path: Path, level: str | None
) -> None:
    """The manager's start line was a ``level='warning'`` record on stderr (every start
    looked like a warning in a log aggregator); it is printed on stdout, as a worker's
    join line is, with the token file; the record is at info."""
    home = tmp_path / "home"
    err_path = tmp_path / "stderr"
    env = dict(os.environ, CORRAL_HOME=str(home), PYTHONUNBUFFERED="1")
    flags = ["--log-level", level] if level else []
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", "manager", "--listen", "127.0.0.1:0",
             "--no-monitoring", *flags],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            out = []
            for line in proc.stdout:  # bounded by the test's timeout
                out.append(line)
                if line.startswith("dashboard on"):
                    break
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
    address = out[0].removeprefix("manager listening on").strip()
    port = address.rsplit(":", 1)[1]
    token_file = home / "tokens" / f"127.0.0.1_{port}.json"
    assert out[:2] == [f"manager listening on {address}\n", f"  token file: {token_file}\n"], out
    assert token_file.exists()
    logged = [ln for ln in err_path.read_text().splitlines() if "manager listening" in ln]
    if level is None:  # the default level (warning): no record of it
        assert logged == [], logged
    else:
        assert len(logged) == 1 and "level='info'" in logged[0], logged


@pytest.mark.parametrize("variables", [["CORRAL_TLS_CERT"], ["CORRAL_TLS_CERT", "CORRAL_TLS_KEY"]])
def test_tls_variables_with_a_plaintext_listen_address_are_refused(
    tmp_path: Path, variables: list[str]
) -> None:
    """``CORRAL_TLS_CERT=/nonexistent.pem python -m runtime manager --listen HOST:PORT``
    served plaintext ws:// (tokens in clear) without a word about the variable. Whoever
    set it asked for TLS: the manager now refuses to start, before it makes anything,
    saying how to get TLS and how to choose plaintext."""
    home = tmp_path / "home"
    where = f"127.0.0.1:{free_port_between(36000, 36999)}"
    pem = tmp_path / "nonexistent.pem"
    env = dict.fromkeys(variables, str(pem))
    err = assert_nothing_left(manager(home, "--listen", where, env=env), home)
    said = " and ".join(f"{name}='{pem}' (no such file)" for name in variables)
    verb = "are" if len(variables) > 1 else "is"
    assert err.startswith(
        f"error: ValueError: {said} {verb} set, but --listen {where} is not wss://"
    ), err
    assert f"For TLS, --listen wss://{where} with files that are there" in err, err
    unset = " and ".join(variables)
    assert f"to serve plaintext on purpose, --listen ws://{where} or unset {unset}" in err, err


def test_tls_variables_with_the_default_listen_address_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default --listen (127.0.0.1:8786, no scheme) is refused as one given: the
    check that runs before the manager starts, called here (no process on port 8786)."""
    from runtime.__main__ import _plaintext_despite_tls_env, build_parser

    monkeypatch.setenv("CORRAL_TLS_CERT", str(tmp_path / "cert.pem"))
    monkeypatch.delenv("CORRAL_TLS_KEY", raising=False)
    (tmp_path / "cert.pem").write_text("a certificate, say")
    listen = build_parser().parse_args(["manager"]).listen
    with pytest.raises(ValueError) as refused:
        _plaintext_despite_tls_env(listen, explicit=False)
    assert str(refused.value).startswith(
        f"CORRAL_TLS_CERT='{tmp_path / 'cert.pem'}' is set, but --listen 127.0.0.1:8786 is "
        "not wss://: the manager would serve plaintext ws:// (tokens in clear) and ignore "
        "it. For TLS, --listen wss://127.0.0.1:8786; to serve plaintext on purpose"
    ), refused.value
    monkeypatch.setenv("CORRAL_TLS_CERT", "")  # set empty: unset, as transport.tls reads it
    _plaintext_despite_tls_env(listen, explicit=False)


def test_tls_variables_with_an_explicit_ws_address_start_with_a_warning(tmp_path: Path) -> None:
    """``--listen ws://HOST:PORT`` chooses plaintext in so many words: the manager starts,
    but warns, before it listens, that the variable is ignored and tokens travel in clear."""
    port = free_port_between(36000, 36999)
    with Cli(tmp_path / "home") as cli:
        cli.env["CORRAL_TLS_CERT"] = str(tmp_path / "nonexistent.pem")
        cli.env.pop("CORRAL_TLS_KEY", None)
        proc = cli.start("manager", "--listen", f"ws://127.0.0.1:{port}", "--no-monitoring")
        seen: list[str] = []
        warning = cli.line_with(proc, "TLS variables ignored", seen=seen)
        assert "level='warning'" in warning and "tokens travel in clear" in warning, warning
        assert "ignored=['CORRAL_TLS_CERT']" in warning, warning
        assert f"fix='--listen wss://127.0.0.1:{port} for TLS, or unset CORRAL_TLS_CERT'" in warning
        cli.line_with(proc, f"manager listening on ws://127.0.0.1:{port}", seen=seen)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("flags", "held"), [((), 10.0), (("--reconnect-timeout", "45"), 45.0)])
def test_reconnect_timeout_reaches_the_managers_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], held: float
) -> None:
    """``--reconnect-timeout SECONDS``: how long the manager holds a dropped worker's id
    for its rejoin (``run_manager``'s ``reconnect_timeout``, 10 s by default, had no
    flag). The manager starts for real and stops once its gateway is made."""
    import anyio

    import runtime.node
    from runtime.__main__ import main

    real = runtime.node.run_manager
    gateways: list[runtime.node.Gateway] = []

    async def stops_once_it_listens(*args: Any, **kw: Any) -> None:
        with anyio.CancelScope() as scope:

            def on_gateway(gateway: runtime.node.Gateway) -> None:
                gateways.append(gateway)
                scope.cancel()

            await real(*args, **{**kw, "on_gateway": on_gateway})

    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(runtime.node, "run_manager", stops_once_it_listens)
    port = free_port_between(45000, 45999)
    argv = ["manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", *flags]
    assert main(argv) == 0
    (gateway,) = gateways
    assert gateway.reconnect_timeout == held
