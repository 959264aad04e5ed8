"""Shared pytest configuration for Corral's tests.

What lives here: fixtures every test module may use, and the logging state every test
starts from (:func:`pytest_runtest_protocol`). Async tests are marked
``@pytest.mark.anyio`` (anyio's own pytest plugin) and run on asyncio only.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import pytest

#: a logger's state a test may change: level, propagate, disabled, handlers
_LoggerState = tuple[int, bool, bool, list[logging.Handler]]
#: a logger made during a test is put back as a new one is
_NEW: _LoggerState = (logging.NOTSET, True, False, [])


def _kept_loggers() -> list[logging.Logger]:
    """The root logger and the ``corral`` tree's loggers made so far."""
    return [logging.getLogger()] + [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and (name == "corral" or name.startswith("corral."))
    ]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol() -> Generator[None, object, object]:
    """Each test leaves the root logger, the ``corral`` logger tree (level, propagate,
    disabled, handlers: those it added are taken off and closed) and ``logging.disable``
    as it found them. A command line run in this process (``runtime.__main__.main``:
    ``runtime.log.configure``) gives ``corral`` its own handler, a level and no
    propagation; kept, a later test's ``caplog`` saw nothing of it (CI103). Around the
    whole test (its setup, call and teardown), not in a fixture: pytest's own capture
    handlers, added and removed per phase, are not there to be kept or put back.
    structlog's global configuration is not kept: Corral never sets it (``runtime.log``
    passes its processors to each logger)."""
    manager = logging.Logger.manager
    kept: dict[logging.Logger, _LoggerState] = {
        logger: (logger.level, logger.propagate, logger.disabled, logger.handlers[:])
        for logger in _kept_loggers()
    }
    disable = manager.disable
    try:
        return (yield)
    finally:
        removed: list[logging.Handler] = []
        for logger in _kept_loggers():
            level, propagate, disabled, handlers = kept.get(logger, _NEW)
            if logger.level != level:
                logger.setLevel(level)  # (clears the loggers' cached levels)
            logger.propagate, logger.disabled = propagate, disabled
            if logger.handlers != handlers:
                removed += [h for h in logger.handlers if h not in handlers]
                logger.handlers[:] = handlers
        # Closed, those the test added (a FileHandler's file), unless a logger keeps them.
        still = {h for _, _, _, handlers in kept.values() for h in handlers}
        for handler in dict.fromkeys(h for h in removed if h not in still):
            handler.close()
        if manager.disable != disable:
            logging.disable(disable)


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio (Corral targets asyncio only)."""
    return "asyncio"


@pytest.fixture
def managers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The managers (``actors.manager.Manager``) that control planes started from now
    on made, in order: to read one's state, which no message reports."""
    import runtime.node
    from actors.manager import Manager

    made: list[Manager] = []

    class Recorded(Manager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runtime.node, "Manager", Recorded)
    return made
