"""Each test starts from the logging the one before it started from (tests/conftest.py).

The proof runs pytest in a subprocess, with ``tests/conftest.py`` as its only plugin, on
a file of two tests, in that order (its own session: nothing ran before the first, and
nothing else can come between them). The first runs the command line in its process,
as the console and CLI tests do (``runtime.__main__.main``, which calls
``runtime.log.configure``: the ``corral`` logger at error, with its own handler and no
propagation), and changes the rest of what a test could: the root logger, a ``corral``
child made during the test, a file handler on both, and ``logging.disable``. The second
finds none of that, the file handler closed, and ``caplog`` sees a Corral warning;
without the conftest's reset it saw nothing, as tests/test_key_reuse.py did after
tests/test_console.py's one-shot test (CI103). In this process, the order of these
tests and what ran before them do not matter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TWO_TESTS = """
import logging

import pytest

from runtime.log import get_logger

CHILD = "corral.test_log_isolation"  # a logger made by the first test only
SEEN: dict = {}  # what the first test added, and the root logger's level before it


def test_a_command_line_run_in_this_process_sets_corral_logging_up_for_a_terminal(
    capsys, tmp_path
):
    from runtime.__main__ import main

    root, corral = logging.getLogger(), logging.getLogger("corral")
    SEEN["root_level"] = root.level
    before = set(corral.handlers)
    assert main(["console", "inproc://nobody-listens-here", "status"]) == 1
    assert "nobody-listens-here" in capsys.readouterr().err
    assert corral.level == logging.ERROR and corral.propagate is False
    added = [h for h in corral.handlers if h not in before]
    assert [getattr(h, "_corral", False) for h in added] == [True]
    mine = logging.FileHandler(tmp_path / "mine.log")
    root.addHandler(mine)
    root.setLevel(logging.CRITICAL)
    child = logging.getLogger(CHILD)
    child.addHandler(mine)
    child.setLevel(logging.DEBUG)
    child.propagate, child.disabled = False, True
    logging.disable(logging.WARNING)
    SEEN["added"], SEEN["mine"] = added + [mine], mine


def test_the_next_test_finds_logging_as_before_and_caplog_sees_corral_records(caplog):
    added = SEEN["added"]
    loggers = [logging.getLogger(), logging.getLogger("corral"), logging.getLogger(CHILD)]
    kept = [
        (lg.level, lg.propagate, lg.disabled, [h for h in lg.handlers if h in added])
        for lg in loggers
    ]
    assert kept == [
        (SEEN["root_level"], True, False, []),
        (logging.NOTSET, True, False, []),
        (logging.NOTSET, True, False, []),
    ]
    assert logging.getLogger().manager.disable == logging.NOTSET
    assert SEEN["mine"].stream is None  # closed when it was taken off: no open file left
    caplog.set_level(logging.WARNING)
    get_logger("corral.client").warning("seen by caplog")
    assert [(r.name, r.levelno) for r in caplog.records if "seen by caplog" in r.getMessage()] == [
        ("corral.client", logging.WARNING)
    ]
"""


def test_a_test_that_changes_logging_leaves_the_next_test_the_logging_it_found(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\ntimeout = 60\n")
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), path]))}
    args = ["-p", "tests.conftest", "-p", "no:cacheprovider", "-c", str(ini)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args, "--rootdir", str(tmp_path), "test_two.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
