"""Clients sharing one manager: the client's name reaches the scheduler core's task
records and the policies' ``TaskView`` (``client``).

The core tests feed events to ``SchedulerState.handle`` and check the exact commands
(tests/helpers.py: ``make_state`` validates every state at teardown)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from actors.scheduler_events import GraphSubmitted
from actors.scheduler_records import TaskStateView
from runtime import Cluster
from runtime.graph import client_id, client_name
from tests.helpers import Factory, event, make_state, run, specs_for

__all__ = ["make_state"]  # the autouse fixture, used by name


def submit_as(s: Any, client: str, keys: list[str]) -> list[Any]:
    specs = specs_for(s, {k: [] for k in keys}, keys)
    return run(s, event(GraphSubmitted, specs=specs, wanted=tuple(keys), echo_to=client))


def test_policies_see_the_submitting_clients_name(make_state: Factory) -> None:
    s = make_state(unknown_long=False)
    submit_as(s, client_id("alice"), ["a-0"])
    submit_as(s, "an-older-client", ["b-0"])
    run(s, event(GraphSubmitted, specs=specs_for(s, {"c-0": []}, ["c-0"]), wanted=("c-0",)))
    views = {k: TaskStateView(s.tasks[k]) for k in ("a-0", "b-0", "c-0")}
    assert {k: v.client for k, v in views.items()} == {
        "a-0": "alice",
        "b-0": "an-older-client",
        "c-0": "",
    }


def test_client_names_are_checked_and_default_to_the_user_name() -> None:
    assert client_name(client_id("alice")) == "alice"
    assert client_id("alice") != client_id("alice")  # one id per connection
    assert client_name(client_id()) not in ("", "client-")
    for bad in ("", "al ice", "-x", "x" * 41, 3):
        with pytest.raises(ValueError, match="name must be 1 to 40 letters"):
            client_id(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be"):
        Cluster("ws://127.0.0.1:33999", name="a/b")


def _inc(x: int) -> int:
    return x + 1


@pytest.mark.timeout(60)
def test_a_clusters_name_reaches_the_scheduler_core() -> None:
    async def main() -> str:
        async with Cluster(workers=1, name="alice") as cluster:
            future = cluster.submit(_inc, 1, key="inc-1")
            assert await future == 2
            return str(cluster._scheduler_actor.state.tasks["inc-1"].client)

    client = anyio.run(main)
    assert client_name(client) == "alice" and client.startswith("alice-")
