"""A few values Corral took unchecked: ``CORRAL_HOME`` at a file, ``CORRAL_LOG_JSON=yes``,
``worker --name ''``.

A bad-input audit: ``CORRAL_HOME=/etc/passwd python -m runtime console ...`` ended with a
raw ``NotADirectoryError`` about ``/etc/passwd/tokens/...`` that named neither the
variable nor what to set; ``CORRAL_LOG_JSON=yes`` was taken as "no" without a word (the
docs say ``1``); ``worker --name ''`` fell back to the default id, and a name too long
for the manager was refused only after connecting. Each is now refused where it is
read, saying what to give. The command lines are real processes, bounded; nothing
listens on the ports they name (this module's range: 59030-59039).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import Cluster
from runtime.errors import CorralError, CorralHomeError
from runtime.home import corral_home
from runtime.log import json_lines
from tests.test_preflight import ROOT

NOBODY = "ws://127.0.0.1:59031"  # no manager there: each refusal comes before a dial


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **env)
    return subprocess.run(
        [sys.executable, "-m", "runtime", *argv],
        env=full, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_corral_home_at_a_file_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "home.txt"
    a_file.write_text("not a directory")
    monkeypatch.setenv("CORRAL_HOME", str(a_file))
    with pytest.raises(CorralHomeError) as info:
        corral_home()
    err = info.value
    assert isinstance(err, NotADirectoryError) and isinstance(err, CorralError)
    assert f"CORRAL_HOME={str(a_file)!r} is a file, not a directory" in str(err)
    assert "Set CORRAL_HOME to a directory" in str(err) and "unset it" in str(err)
    assert (err.path, err.blocker, err.variable) == (str(a_file), str(a_file), True)
    monkeypatch.setenv("CORRAL_HOME", str(a_file / "corral"))  # under a file
    with pytest.raises(CorralHomeError, match=f"is under {a_file}, which is a file"):
        corral_home()
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "new" / "corral"))  # made when needed
    assert corral_home() == tmp_path / "new" / "corral"
    monkeypatch.delenv("CORRAL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".corral").write_text("")
    with pytest.raises(CorralHomeError) as default:
        corral_home()
    assert "Corral's directory" in str(default.value) and "Move that file away" in str(
        default.value
    )
    assert default.value.variable is False


def test_the_console_says_which_variable_to_set(tmp_path: Path) -> None:
    a_file = tmp_path / "home.txt"
    a_file.write_text("")
    done = _run("console", NOBODY, "status", CORRAL_HOME=str(a_file))
    assert done.returncode == 1
    assert f"error: CorralHomeError: CORRAL_HOME={str(a_file)!r} is a file" in done.stderr
    assert "NotADirectoryError: [Errno" not in done.stderr


def test_corral_log_json_takes_1_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for ok, expected in (("1", True), ("", False)):
        monkeypatch.setenv("CORRAL_LOG_JSON", ok)
        assert json_lines() is expected
    monkeypatch.delenv("CORRAL_LOG_JSON")
    assert json_lines() is False
    for bad in ("yes", "true", "0"):
        monkeypatch.setenv("CORRAL_LOG_JSON", bad)
        with pytest.raises(ValueError, match=f"CORRAL_LOG_JSON={bad!r} is not 1: set it to 1"):
            json_lines()
        with pytest.raises(ValueError, match="or unset it for key=value lines"):
            Cluster(workers=0)


def test_the_command_line_refuses_a_bad_corral_log_json() -> None:
    done = _run("version", CORRAL_LOG_JSON="yes")
    assert done.returncode == 1 and done.stdout == ""
    assert "error: ValueError: CORRAL_LOG_JSON='yes' is not 1" in done.stderr
    assert _run("version", CORRAL_LOG_JSON="1").returncode == 0


@pytest.mark.parametrize(
    ("name", "said"),
    [("", "--name must name the worker, got ''"), ("  ", "--name must name the worker"),
     ("w" * 300, "--name must be at most 256 characters (the manager refuses a longer")],
)  # fmt: skip
def test_worker_refuses_an_empty_or_too_long_name_before_it_connects(name: str, said: str) -> None:
    done = _run("worker", NOBODY, "--name", name)
    assert done.returncode == 1, done.stderr
    assert f"error: ValueError: {said}" in done.stderr
    assert "could not reach" not in done.stderr and "ConnectFailed" not in done.stderr
