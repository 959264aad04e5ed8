"""``python -m runtime`` (and the ``corral`` script) as a command line: an unknown
command is a usage error naming the commands, and the usage lines name the program as
it was invoked."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dask
import pytest

from runtime import __version__
from runtime.__main__ import COMMANDS, main
from runtime.messages import PROTOCOL_VERSION
from tests.helpers import Cli, free_port_between


@pytest.mark.parametrize(
    "argv", [["nosuchcmd"], ["--log-level", "debug", "nosuchcmd"], ["nosuchcmd", "--json"]]
)
def test_an_unknown_command_is_a_usage_error_listing_the_commands(
    capsys: Any, argv: list[str]
) -> None:
    """Not ``unrecognized arguments: nosuchcmd`` from the demo (the default command)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    err = out.err.strip().splitlines()[-1]
    assert err.startswith("python -m runtime: error: unknown command 'nosuchcmd'; the commands"), (
        err
    )
    assert all(name in err for name in COMMANDS), err
    assert "unrecognized arguments" not in out.err


@pytest.mark.parametrize(
    ("argv0", "prog"),
    [("/opt/venv/bin/corral", "corral"), ("/src/runtime/__main__.py", "python -m runtime")],
)
def test_the_usage_names_the_program_as_invoked(
    capsys: Any, monkeypatch: Any, argv0: str, prog: str
) -> None:
    """The installed ``corral`` script's help says ``usage: corral ...``, its
    subcommands' ``corral worker ...``; ``python -m runtime`` says that."""
    for words, usage in (
        (["--help"], f"usage: {prog} [-h]"),
        (["worker", "-h"], f"usage: {prog} worker [-h]"),
    ):
        monkeypatch.setattr(sys, "argv", [argv0, *words])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == 0
        assert capsys.readouterr().out.startswith(usage)
    monkeypatch.setattr(sys, "argv", [argv0, "nosuchcmd"])
    with pytest.raises(SystemExit):
        main()
    assert f"`{prog} --help`" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["console"], ["console", "--json"]])
def test_a_console_without_an_address_asks_for_the_address_only(
    capsys: Any, argv: list[str]
) -> None:
    """Before: 'the following arguments are required: ADDRESS, COMMAND', though without
    a COMMAND the console is a shell."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "python -m runtime console: error: the following argument is required: ADDRESS"
    ), err
    assert "COMMAND is optional" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--deadline", "3600"], "--deadline 3600 (or CORRAL_DEADLINE) is 1970-01-01 01:00:00 UTC"),
        (["--deadline", "-5"], "is 1969-12-31 23:59:55 UTC, "),
        (["--deadline", "nan"], "--deadline must be a time, in seconds since the epoch, got nan"),
        (["--grace", "-1"], "--grace must be >= 0 (the seconds between a stop signal"),
        (["--pool", ""], "--pool must name a pool, got ''"),
        (["--pool", " "], "--pool must name a pool"),
    ],
)
def test_a_worker_refuses_a_bad_deadline_grace_or_pool_before_it_joins(
    capsys: Any, monkeypatch: Any, flags: list[str], said: str
) -> None:
    """A deadline that has passed (a duration given for the epoch time, ``--deadline
    3600``) made the worker join, retire at once and exit 0 without a word; a negative
    grace and an empty pool were taken too. Each is an error, exit 1, before joining."""
    joined: list[Any] = []
    monkeypatch.setattr("runtime.__main__._run_worker", lambda *a: joined.append(a))
    monkeypatch.delenv("CORRAL_DEADLINE", raising=False)
    assert main(["worker", "ws://127.0.0.1:9", "--memory", "1GiB", *flags]) == 1
    err = capsys.readouterr().err
    assert said in err, err
    if flags[1] in ("3600", "-5"):
        assert "seconds since the epoch, not a duration" in err
        assert "--deadline $(( $(date +%s) + 3600 ))" in err
    assert joined == []
    # A deadline to come, no grace and a named pool are fine: the worker would join.
    soon = str(time.time() + 3600)
    good = ["--deadline", soon, "--grace", "0", "--pool", "gpu"]
    assert main(["worker", "ws://127.0.0.1:9", "--memory", "1GiB", *good]) == 0
    assert len(joined) == 1


def test_a_bad_corral_deadline_is_only_the_workers_concern(capsys: Any, monkeypatch: Any) -> None:
    """The parser builder did ``float(os.environ["CORRAL_DEADLINE"])``: a stray
    non-number in it crashed every command (``version`` too) with a traceback."""
    monkeypatch.setenv("CORRAL_DEADLINE", "soon")
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("corral ")
    with pytest.raises(SystemExit) as exit_:  # the console's own usage error, as without it
        main(["console"])
    assert exit_.value.code == 2
    assert "CORRAL_DEADLINE" not in capsys.readouterr().err


def test_a_worker_refuses_a_non_number_corral_deadline_as_a_usage_error(
    capsys: Any, monkeypatch: Any
) -> None:
    """As ``--deadline soon`` is: exit 2, one error line naming the variable."""
    joined: list[Any] = []
    monkeypatch.setattr("runtime.__main__._run_worker", lambda *a: joined.append(a))
    monkeypatch.setenv("CORRAL_DEADLINE", "soon")
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "ws://127.0.0.1:9", "--memory", "1GiB"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m runtime worker: error: argument --deadline: 'soon'"), err
    assert "CORRAL_DEADLINE" in err
    assert joined == []
    # A number in it is taken (and checked as --deadline is)
    monkeypatch.setenv("CORRAL_DEADLINE", str(time.time() + 3600))
    assert main(["worker", "ws://127.0.0.1:9", "--memory", "1GiB"]) == 0
    assert len(joined) == 1


def _cli(*words: str) -> subprocess.CompletedProcess[str]:
    """The real command line, a process of its own (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "runtime", *words], capture_output=True, text=True, timeout=120
    )


@pytest.mark.timeout(300)
def test_usage_errors_name_the_subcommand_and_the_close_match() -> None:
    """A misspelt option of a subcommand was refused with the top-level usage and a bare
    ``unrecognized arguments``; a misspelt choice with argparse's bare ``invalid
    choice``: each now says its subcommand's usage and the close match."""
    done = _cli("manager", "--listne", "127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("usage: python -m runtime manager "), done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m runtime manager: error: unrecognized arguments: --listne 127.0.0.1:1; "
        "did you mean '--listen'?"
    ), done.stderr
    done = _cli("worker", "ws://127.0.0.1:1", "--execution", "processes")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m runtime worker: error: argument --execution: invalid choice: 'processes' "
        "(choose from 'thread', 'process'); did you mean 'process'?"
    ), done.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("before", [[], ["--log-level", "info"]])
def test_dash_dash_version_prints_the_versions(before: list[str]) -> None:
    """``corral --version`` was refused (``unrecognized arguments: --version``)."""
    done = _cli(*before, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == _cli("version").stdout and done.stdout.startswith("corral "), done
    # the protocol version tells two checkouts of one release apart (user audit upgrade F3)
    assert done.stdout == (
        f"corral {__version__} (protocol {PROTOCOL_VERSION}, Python "
        f"{platform.python_version()}, dask {dask.__version__})\n"
    ), done


@pytest.mark.timeout(60)
def test_a_relative_monitoring_path_is_printed_absolute(tmp_path: Path) -> None:
    """A user audit (analyst, 8): ``manager --monitoring rel.db`` printed ``report:
    python -m runtime report rel.db -o report.html``, a command that works only in the
    manager's directory. Now the database's path and its report command are absolute
    (the manager's directory joined with the path given)."""
    work = tmp_path / "work"
    work.mkdir()
    with Cli(tmp_path / "home", cwd=work) as cli:
        port = free_port_between(63000, 63999)
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--monitoring", "rel.db")
        seen: list[str] = []
        cli.line_with(manager, "manager listening on", seen=seen)
    db = work / "rel.db"
    assert f"monitoring database: {db}\n" in seen, seen
    (report,) = [ln for ln in seen if ln.startswith("  report: ")]
    assert report.endswith(f" report {db} -o report.html\n"), report
    assert db.is_file()
