"""Shared pytest configuration for Corral's tests.

What lives here: fixtures every test module may use. Async tests are marked
``@pytest.mark.anyio`` (anyio's own pytest plugin) and run on asyncio only.
"""

from __future__ import annotations

from typing import Any

import pytest


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
