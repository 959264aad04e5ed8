"""``python -m runtime`` (and the ``corral`` script) as a command line: an unknown
command is a usage error naming the commands, and the usage lines name the program as
it was invoked."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from runtime.__main__ import COMMANDS, main


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
