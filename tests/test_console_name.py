"""A console names its operator (``console --name``, default the user name): a policy
it sets is recorded ``by console:NAME`` in ``story -`` and the manager's ``policy
changed`` line, where it said ``by console`` whoever set it (a user audit: with several
admins, nobody could tell who changed a policy).

A real manager process on a port of this file's range, and real console processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.__main__ import main
from runtime.client_ids import client_name, console_id
from runtime.console import ConsoleClient
from tests.helpers import Cli, free_port_between

#: the ports of 127.0.0.1 this file's managers listen on
PORTS = (53000, 53149)
LIMIT = 20


def _console(capsys: pytest.CaptureFixture[str], address: str, *words: str) -> tuple[int, str, str]:
    """``python -m runtime console ADDRESS WORDS...``, in this process (its command line,
    ``runtime.__main__.main``): its exit code, stdout and stderr."""
    code = main(["console", address, *words])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(2 * LIMIT)
def test_a_policy_set_from_a_console_names_its_operator_in_the_story_and_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with Cli(tmp_path) as cli:
        port = free_port_between(*PORTS)
        address = f"ws://127.0.0.1:{port}"
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--log-level", "info")
        cli.line_with(manager, "manager listening on")

        # --name after the address, as the console's other options may be
        code, out, err = _console(
            capsys, address, "policy", "set", "retry", "default", "max_lost=2", "--name", "alice"
        )
        assert (code, err) == (0, ""), err
        assert "retry policy is now default (max_lost=2)" in out
        line = cli.line_with(manager, "policy changed")
        assert "client='console:alice'" in line, line
        assert "by='console:alice-" in line and "level='info'" in line, line

        # no --name: the user name (LOGNAME, which getpass.getuser reads first), as a
        # Python client's
        monkeypatch.setenv("LOGNAME", "bob")
        code, out, err = _console(capsys, address, "policy", "set", "placement", "round-robin")
        assert (code, err) == (0, ""), err
        line = cli.line_with(manager, "policy changed")
        assert "client='console:bob'" in line and "name='round-robin'" in line, line

        code, out, err = _console(capsys, address, "story", "-", "--json")
        assert (code, err) == (0, ""), err
        assert [entry[:3] for entry in json.loads(out)["transitions"]] == [
            ["-", "policy", "retry:default(max_lost=2) by console:alice"],
            ["-", "policy", "placement:round-robin by console:bob"],
        ]
        code, out, err = _console(capsys, address, "--name", "carol", "story", "-")
        assert code == 0 and "retry:default(max_lost=2) by console:alice" in out, out + err

        # a name a client could not have: one line saying what to do, exit 1, and
        # nothing reaches the manager
        code, out, err = _console(capsys, address, "--name", "al ice", "policy", "set",
                                  "placement", "locality")  # fmt: skip
        assert code == 1 and out == "", out
        assert err.splitlines() == [
            "error: ValueError: name must be 1 to 40 letters, digits, '.', '_' or '-' "
            "starting with a letter or digit (who operates, as a policy change's records "
            "show it), got 'al ice': pass --name alice (ConsoleClient(..., name='alice')), "
            "or leave it out for your user name"
        ], err
        code, out, err = _console(capsys, address, "policy", "list", "--json")
        placement = {p["kind"]: p["name"] for p in json.loads(out)}["placement"]
        assert (code, placement) == (0, "round-robin"), err


def test_a_console_id_shows_as_console_and_its_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    assert client_name(console_id("alice")) == "console:alice"
    assert console_id("alice") != console_id("alice")  # a random tail per connection
    monkeypatch.setenv("LOGNAME", "dave")
    assert client_name(ConsoleClient("ws://127.0.0.1:1").name) == "console:dave"
    monkeypatch.setattr("getpass.getuser", _no_user)
    assert client_name(console_id()) == "console"  # no user name: the generic name
    with pytest.raises(ValueError, match="pass --name alice"):
        ConsoleClient("ws://127.0.0.1:1", name="-x")
    with pytest.raises(ValueError, match="got ''"):
        console_id("")


def _no_user() -> str:
    raise OSError("no user name")
