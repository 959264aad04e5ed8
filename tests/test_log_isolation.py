"""Each test starts from the logging the one before it started from (tests/conftest.py).

The first test here runs the command line in this process, as the console and CLI tests
do (``runtime.__main__.main``, which calls ``runtime.log.configure``: the ``corral``
logger at error, with its own handler and no propagation), and changes the rest of what
a test could: the root logger, a ``corral`` child made during the test, and
``logging.disable``. The second, run after it (pytest keeps a file's order), finds none
of that, and ``caplog`` sees a Corral warning; without the reset it saw nothing, as
tests/test_key_reuse.py did after tests/test_console.py's one-shot test (CI103).
"""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from runtime.log import get_logger

#: a logger made by the first test only
CHILD = "corral.test_log_isolation"
#: the handlers the first test added, and the root logger's level before it
ADDED: list[logging.Handler] = []
ROOT_LEVEL: list[int] = []


def test_a_command_line_run_in_this_process_sets_corral_logging_up_for_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from runtime.__main__ import main

    root, corral = logging.getLogger(), logging.getLogger("corral")
    ROOT_LEVEL.append(root.level)
    before = set(corral.handlers)
    assert main(["console", "inproc://nobody-listens-here", "status"]) == 1
    assert "nobody-listens-here" in capsys.readouterr().err
    assert corral.level == logging.ERROR and corral.propagate is False
    ADDED.extend(h for h in corral.handlers if h not in before)
    assert [getattr(h, "_corral", False) for h in ADDED] == [True]
    mine = logging.StreamHandler(io.StringIO())
    root.addHandler(mine)
    root.setLevel(logging.CRITICAL)
    child = logging.getLogger(CHILD)
    child.addHandler(mine)
    child.setLevel(logging.DEBUG)
    child.propagate, child.disabled = False, True
    ADDED.append(mine)
    logging.disable(logging.WARNING)


def test_the_next_test_finds_logging_as_before_and_caplog_sees_corral_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loggers = [logging.getLogger(), logging.getLogger("corral"), logging.getLogger(CHILD)]
    kept: list[tuple[Any, ...]] = [
        (lg.level, lg.propagate, lg.disabled, [h for h in lg.handlers if h in ADDED])
        for lg in loggers
    ]
    root_level = ROOT_LEVEL[0] if ROOT_LEVEL else logging.getLogger().level
    assert kept == [
        (root_level, True, False, []),
        (logging.NOTSET, True, False, []),
        (logging.NOTSET, True, False, []),
    ]
    assert logging.getLogger().manager.disable == logging.NOTSET
    caplog.set_level(logging.WARNING)
    get_logger("corral.client").warning("seen by caplog")
    assert [(r.name, r.levelno) for r in caplog.records if "seen by caplog" in r.getMessage()] == [
        ("corral.client", logging.WARNING)
    ]
