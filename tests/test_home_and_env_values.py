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

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import Cluster
from runtime.errors import CorralError, CorralHomeDenied, CorralHomeError
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


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Run the block as a user with no rights to root's directories: root may enter
    any directory, so a test running as root runs its call as ``nobody`` (65534, the
    effective user id only: root's is taken back at the end). Nothing is imported in
    the block (nobody may not read the interpreter's files)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_corral_home_under_a_directory_this_user_may_not_enter_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 1206e F8: on Python 3.11 ``Path.is_dir`` raises ``PermissionError`` for a
    path under a directory the user may not enter, so ``corral_home()`` (read at every
    token lookup) raised it bare, on every call. It is a ``CorralHomeDenied`` (a
    ``CorralHomeError``, and a ``PermissionError`` as before) naming that directory and
    what to do. A real directory of mode 000 (under one of mode 711 in /tmp, which the
    user may enter)."""
    base = Path(tempfile.mkdtemp(prefix="corral-home-"))
    locked = base / "locked"
    try:
        base.chmod(0o711)
        locked.mkdir(mode=0o000)
        monkeypatch.setenv("CORRAL_HOME", str(locked / "sub" / "corral"))
        with as_nobody():
            uid = os.geteuid()
            try:
                corral_home()
            except CorralHomeDenied as caught:
                err = caught
            else:
                raise AssertionError("corral_home() took a path this user may not reach")
        assert isinstance(err, PermissionError) and isinstance(err, CorralHomeError)
        assert str(err) == (
            f"CORRAL_HOME={str(locked / 'sub' / 'corral')!r} is under {locked}, which this "
            f"user (uid {uid}) may not enter: Corral keeps its token files, run directories "
            "and console history there. Set CORRAL_HOME to a directory this user may reach "
            "(one that does not exist yet is made), or unset it for ~/.corral; or let this "
            f"user enter {locked} (chmod u+x, g+x or o+x, whichever applies to it)"
        )
        assert (err.blocker, err.variable) == (str(locked), True)
        locked.chmod(0o700)  # the owner (this user, when not root) may enter it now
        if uid == os.geteuid():
            assert corral_home() == locked / "sub" / "corral"
    finally:
        locked.chmod(0o700)
        shutil.rmtree(base)


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
