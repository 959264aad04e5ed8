"""Clients sharing one manager: the client's name reaches the scheduler core's task
records and the policies' ``TaskView`` (``client``), and the ``fair`` priority takes
turns between clients (``turn``), so a client's few tasks do not wait behind the whole
of another's queue (docs/policies.md#priority).

The core tests feed events to ``SchedulerState.handle`` and check the exact commands
(tests/helpers.py: ``make_state`` validates every state at teardown)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from actors.scheduler_events import GraphSubmitted
from actors.scheduler_records import TaskStateView
from policies import REGISTRY
from runtime import Cluster
from runtime.client_ids import client_id, client_name
from runtime.errors import PolicyParamsError
from tests.helpers import Factory, assigned, event, finish, join, make_state, run, specs_for

__all__ = ["make_state"]  # the autouse fixture, used by name

BIG = "big-0123456789ab"
SMALL = "small-ba9876543210"


def submit_as(s: Any, client: str, keys: list[str]) -> list[Any]:
    specs = specs_for(s, {k: [] for k in keys}, keys)
    return run(s, event(GraphSubmitted, specs=specs, wanted=tuple(keys), echo_to=client))


def served(s: Any, cmds: list[Any]) -> list[str]:
    """Run every task sent to w1 to its end, one at a time: the keys in the order sent."""
    order = list(assigned(cmds).get("w1", []))
    done = 0
    while done < len(order):
        order += assigned(finish(s, "w1", order[done])).get("w1", [])
        done += 1
    return order


def big_then_small(s: Any) -> list[str]:
    join(s, "w1", cores=1)
    big = [f"big-{i}" for i in range(8)]
    sent = assigned(submit_as(s, BIG, big))["w1"]
    cmds = finish(s, "w1", sent[0])  # the big client's work is under way...
    cmds += submit_as(s, SMALL, [f"small-{i}" for i in range(3)])  # ...when the small's comes
    return sent + served(s, cmds)


def test_fair_priority_takes_turns_between_clients(make_state: Factory) -> None:
    s = make_state(priority="fair", unknown_long=False, saturation=1.0)
    order = big_then_small(s)
    # The small client's first task has the turn being served, then the two take
    # turns (a tie goes to the earlier submission): it waits for 2 of the 7 left of
    # the big client's tasks, not for all of them.
    assert [k.split("-")[0] for k in order] == (
        ["big"] * 2 + ["small", "big", "small", "big", "small"] + ["big"] * 4
    )
    assert [k for k in order if k.startswith("big")] == sorted(
        (f"big-{i}" for i in range(8)), key=lambda k: s.tasks[k].spec.order
    )


def test_the_default_priority_serves_clients_first_come_first_served(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    order = big_then_small(s)
    assert [k.split("-")[0] for k in order] == ["big"] * 8 + ["small"] * 3


def test_an_idle_client_saves_no_turns(make_state: Factory) -> None:
    """A client that comes back after the others ran long starts at the turn being
    served, not at its own last one: it shares, it does not take over."""
    s = make_state(priority="fair", unknown_long=False, saturation=1.0)
    join(s, "w1", cores=1)
    served(s, submit_as(s, SMALL, ["early-0"]))
    served(s, submit_as(s, BIG, [f"long-{i}" for i in range(20)]))
    floor = s.turn_floor
    assert floor >= 19
    submit_as(s, SMALL, ["late-0", "late-1"])
    assert [s.tasks[k].turn for k in ("late-0", "late-1")] == sorted([floor, floor + 1])


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


def test_a_task_continuing_its_clients_earlier_work_takes_that_turn(make_state: Factory) -> None:
    s = make_state(priority="fair", unknown_long=False, saturation=1.0)
    join(s, "w1", cores=1)
    served(s, submit_as(s, BIG, ["load-0"]))
    submit_as(s, BIG, [f"other-{i}" for i in range(5)])
    specs = specs_for(s, {"use-0": ["load-0"]}, ["use-0"])
    run(s, event(GraphSubmitted, specs=specs, wanted=("use-0",), echo_to=BIG))
    # ahead of the client's work queued after its input, not behind the turn served
    assert s.tasks["use-0"].turn == s.turn_floor < s.tasks["other-1"].turn
    assert TaskStateView(s.tasks["use-0"]).turn == s.turn_floor
    # another client's task reading it keeps its own turn
    specs = specs_for(s, {"peek-0": ["load-0"]}, ["peek-0"])
    run(s, event(GraphSubmitted, specs=specs, wanted=("peek-0",), echo_to=SMALL))
    assert s.tasks["peek-0"].turn >= s.turn_floor


def test_a_policy_change_says_who_in_the_story(make_state: Factory) -> None:
    from actors.scheduler_events import PolicyChanged
    from policies import REGISTRY

    s = make_state()
    policy = REGISTRY.create("priority", "fair")
    run(s, event(PolicyChanged, kind="priority", policy=policy, by=client_id("alice")))
    run(s, event(PolicyChanged, kind="priority", policy=REGISTRY.create("priority", "graph")))
    assert [e[2] for e in s.story("-") if e[1] == "policy"] == [
        "priority:fair by alice",
        "priority:graph",
    ]


def test_the_status_names_the_client_of_each_latest_run() -> None:
    from actors.manager import Manager
    from runtime.console import render_status, render_tasks

    def nothing() -> Any:
        return None

    m = Manager(nothing, nothing, nothing, lambda name: None, max_runs=2)
    m._remember_run("run-1", ("a",), "alice")
    m._remember_run("run-2", ("b",), "bob")
    m._remember_run("run-3", ("c",), "carol")  # the oldest run goes, and its client
    assert m.run_clients == {"run-2": "bob", "run-3": "carol"}
    text = _text(render_status({"recent_runs": {"run-2": 1, "run-3": 1},
                                "run_clients": m.run_clients}))  # fmt: skip
    assert "│ run-2 │    1 │ bob    │" in text and "│ run-3 │    1 │ carol  │" in text
    rows = [{"key": "k", "state": "memory", "category": "k", "worker": None, "tries": 1,
             "client": "alice"}]  # fmt: skip
    assert "alice" in _text(render_tasks(rows))


def _text(renderable: Any) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_work_continuing_long_served_outputs_takes_new_turns(make_state: Factory) -> None:
    """A review's scenario: a client that maps over its finished outputs (their turns
    long served) kept their turns, so all its new tasks ran before another client's
    few. The new tasks take turns from the one being served, as new work does."""
    s = make_state(priority="fair", unknown_long=False, saturation=1.0)
    join(s, "w1", cores=1)
    served(s, submit_as(s, BIG, [f"load-{i}" for i in range(8)]))
    uses = [f"use-{i}" for i in range(8)]
    specs = specs_for(s, {u: [f"load-{i}"] for i, u in enumerate(uses)}, uses)
    sent = assigned(run(s, event(GraphSubmitted, specs=specs, wanted=tuple(uses), echo_to=BIG)))
    order = list(sent["w1"])  # (with its partner: two at once)
    cmds = finish(s, "w1", order[0])  # the client's new work is under way...
    cmds += submit_as(s, SMALL, [f"small-{i}" for i in range(3)])  # ...when another's comes
    order += assigned(cmds).get("w1", [])
    done = 1
    while done < len(order):
        order += assigned(finish(s, "w1", order[done])).get("w1", [])
        done += 1
    kinds = [k.split("-")[0] for k in order]
    assert sorted(order) == sorted(uses + [f"small-{i}" for i in range(3)])
    # Before, every use-i kept load-i's long-served turn: all 8 ran first.
    assert kinds.index("small") <= 3 and kinds[-1] == "use", order
    assert all(s.tasks[u].turn >= 7 for u in uses if u in s.tasks)


def test_an_operators_share_gives_a_named_client_more_turns(make_state: Factory) -> None:
    """``fair(shares={"small": 2})``: each task of the client named ``small`` takes half
    a turn, so it has two tasks sent for each one of the others' (the big client, share
    1, keeps its own graph order). Before, the operator could give no one a share."""
    s = make_state(
        priority=REGISTRY.create("priority", "fair", {"shares": {"small": 2}}),
        unknown_long=False,
        saturation=1.0,
    )
    order = big_then_small(s)
    assert [k.split("-")[0] for k in order] == (
        ["big"] * 2 + ["small", "small", "big", "small"] + ["big"] * 5
    )
    assert [s.tasks[f"small-{i}"].turn for i in range(3)] == [1.0, 1.5, 2.0]


def test_shares_are_numbers_above_zero() -> None:
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(PolicyParamsError, match="shares maps client names to numbers > 0"):
            REGISTRY.create("priority", "fair", {"shares": {"alice": bad}})
    assert REGISTRY.create("priority", "fair").share("anyone") == 1.0
