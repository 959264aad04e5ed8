"""``~/.corral`` is made 0700 by whoever makes it first (security audit, finding 8: the
console made it with the umask, 0755, and so did a manager without a monitoring
database, whose token directory inside was 0700). HOME is a fresh temporary directory,
CORRAL_HOME unset, the umask 022."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.console import history_path, keep_history
from runtime.node import Tokens, token_path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_HOME", raising=False)
    old = os.umask(0o022)
    try:
        yield tmp_path / ".corral"
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_manager_writing_its_token_file_makes_corral_home_0700(home: Path) -> None:
    path = token_path("ws://127.0.0.1:46001")
    assert path == home / "tokens" / "127.0.0.1_46001.json"
    Tokens("a" * 32, "r" * 32, "s" * 32).write(path)
    assert (_mode(home), _mode(home / "tokens"), _mode(path)) == (0o700, 0o700, 0o600)


def test_the_console_keeping_its_history_makes_corral_home_0700(home: Path) -> None:
    class Readline:
        def write_history_file(self, name: Path) -> None:
            Path(name).write_text("status\n")

    path = history_path()
    assert path == home / "console_history"
    keep_history(Readline(), path)
    assert path.read_text() == "status\n"
    assert _mode(home) == 0o700
