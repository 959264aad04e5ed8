"""Shared pytest configuration for Corral's tests.

What lives here: fixtures every test module may use. Async tests are marked
``@pytest.mark.anyio`` (anyio's own pytest plugin) and run on asyncio only.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio (Corral targets asyncio only)."""
    return "asyncio"
