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

import pytest

from tests.helpers import ROOT

LIMIT = 60  # seconds per process: it fails at once (or, unfixed, runs until killed)


@pytest.fixture
def taken() -> Iterator[int]:
    """A port of 127.0.0.1 something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def manager(
    home: Path, *flags: str, before: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m runtime [BEFORE...] manager FLAGS...``, to its end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), PYTHONPATH=str(ROOT))
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
