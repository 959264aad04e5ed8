"""An exception raised inside ``async with ConsoleClient(...)`` comes out as itself, not
wrapped in an ``ExceptionGroup`` by the task group that serves the connection (a user
audit of policies, F4: ``except RemoteError`` around the block caught nothing; console.md
says the console's errors are raised as themselves). An in-process manager: no port."""

from __future__ import annotations

import anyio
import pytest

from runtime.console import ConsoleClient
from runtime.errors import RemoteError
from tests.helpers import nodes

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

LIMIT = 20


async def test_the_body_s_errors_come_out_as_themselves() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(0) as (address, _):
            # the manager's refusal of an unknown policy: caught by `except RemoteError`
            with pytest.raises(RemoteError, match="UnknownPolicyError") as caught:
                async with ConsoleClient(address, name="alice") as console:
                    await console.set_policy("priority", "nope", {})
            assert type(caught.value) is RemoteError
            assert console.closed  # the connection was closed
            # a plain error of the user's own
            with pytest.raises(ValueError, match=r"^mine$") as mine:
                async with ConsoleClient(address, name="alice"):
                    raise ValueError("mine")
            assert type(mine.value) is ValueError
            # the connection is usable again after such a block, and a clean exit is clean
            async with ConsoleClient(address, name="alice") as console:
                assert (await console.execute("policy list")).data
