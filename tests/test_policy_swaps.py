"""Swapping policies at runtime (a user audit of policies, an ML engineer's long sweep):
what a client is told of the policy it leaves in force, and what the scheduler core
keeps of the policy in force now. Pure cores fed events; a hosted manager on
``inproc://`` (no port) for the client's close-time warning."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import PolicyChanged, ScalingChanged
from policies import REGISTRY, PoolView, param_values
from policies.priority import GraphPriority
from policies.scaling import PoolLimits
from runtime.client import Cluster, _policies_left_news
from runtime.console import ConsoleClient
from runtime.messages import PolicyInfo, SetPolicyRequest
from runtime.report import build_report
from tests.helpers import (
    Factory,
    event,
    log_lines,
    make_state,
    registered,
    run,
    status_text,
    submit,
    wait_until,
)
from tests.test_console import hosted

__all__ = ["make_state"]

LIMIT = 20


class Raises:
    name = "test-swaps-raises"

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        raise KeyError("night")


class Three:
    def desired(self, pool: PoolView) -> int:
        return 3


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    """The two policies above, registered for this module's tests only."""
    with registered(
        ("priority", "test-swaps-raises", Raises), ("scaling", "test-swaps-three", Three)
    ):
        yield


def test_the_core_keeps_the_problem_of_the_policy_in_force_only(make_state: Factory) -> None:
    """``failing``: the latest problem of the policy in force now (the status's
    ``policy_failing``); ``problems.problem`` keeps the kind's latest of any policy."""
    s = make_state(priority=Raises())
    submit(s, {"a": ()}, ["a"])
    assert s.failing == {"priority": "priority raised KeyError('night')"}
    run(s, event(PolicyChanged, kind="priority", policy=GraphPriority()))
    assert s.failing == {} and s.problems.problem == {
        "priority": "priority raised KeyError('night')"
    }


def test_a_failing_policy_replaced_is_not_proposed_back_and_the_command_works() -> None:
    """Before: ``console: policy list scaling lists the others``, a usage error of the
    console (``policy list`` takes no kind); and a failing priority policy was proposed
    back."""
    before = PolicyInfo("priority", "test-swaps-raises")
    mine = PolicyInfo("priority", "graph")
    with log_lines("corral.client", logging.WARNING) as log:
        told = _policies_left_news(
            {"priority": (before, mine)}, [mine], "m", {"priority": "priority raised KeyError"}
        )
        (line,) = log.lines
    assert told == ["priority"]
    assert "set_policy('priority', 'test-swaps-raises')" not in line
    assert "'test-swaps-raises', was failing (priority raised KeyError)" in line
    assert "console: policy list lists the others" in line
    assert "policy list priority" not in line


@pytest.mark.anyio
async def test_a_client_does_not_propose_back_a_priority_policy_that_was_failing() -> None:
    with anyio.fail_after(LIMIT), log_lines("corral", logging.INFO) as log:
        async with hosted(1) as (address, _):
            async with Cluster(address, manager_alerts=None) as first:
                await first.set_policy("priority", "test-swaps-raises")
                assert await first.submit(sum, [1, 2]) == 3  # the fallback answered
            async with Cluster(address, manager_alerts=None) as second:
                status = await second.status()
                assert status["policy_failing"] == {"priority": "priority raised KeyError('night')"}
                await second.set_policy("priority", "graph")
                assert (await second.status())["policy_failing"] == {}
            told = [ln for ln in log.lines if "stays in force" in ln]
            assert len(told) == 2, told
            assert "To set it back: await cluster.set_policy('priority', 'graph')" in told[0]
            assert "set_policy('priority', 'test-swaps-raises')" not in told[1]
            assert "'test-swaps-raises', was failing (priority raised KeyError" in told[1]


@pytest.mark.anyio
async def test_policy_set_scaling_says_which_blocks_the_new_policy_drains() -> None:
    """Before: ``scaling policy is now fixed`` and nothing else, while the pool's blocks
    kept by the policy before were drained down to the target."""
    limits = PoolLimits(max_blocks=3, slots_per_block=1)
    with anyio.fail_after(LIMIT):
        async with hosted(1, limits=limits) as (address, plane), ConsoleClient(address) as console:
            await console.set_policy("scaling", "test-swaps-three")
            workers = plane.scheduler.state.workers
            await wait_until(lambda: len(workers) == 3, "3 blocks' workers", limit=LIMIT / 2)
            text = await console.run_command("policy set scaling fixed")
            assert " ".join(text.split()) == (
                "scaling policy is now fixed pool default: 3 block(s) before, the policy "
                "wants 1: 2 being drained (no new tasks; each stops once its tasks are "
                "done): `scale default 3` keeps them (a draining block is taken back)"
            )
            # nothing drained: nothing more said
            text = await console.run_command("policy set scaling fixed")
            assert text.strip() == "scaling policy is now fixed"


def test_policy_info_gives_the_parameters_as_values() -> None:
    """Before: ``params={'tie': "'id'"}``, ``{'charge_lost': 'True'}``: reprs, which a
    script could not give back to ``set_policy``."""
    retry = REGISTRY.create("retry", "default", {"max_lost": 2, "charge_lost": True})
    info = REGISTRY.info("retry", retry)
    assert info.params == {"charge_lost": True, "max_lost": 2}
    again = REGISTRY.create("retry", info.name, info.params)
    assert REGISTRY.info("retry", again).params == info.params

    class Mine:
        name = "mine"

    odd = GraphPriority()
    odd.params = {"rank": ("a", 1, [None, 2.5], {"k": "v"}), "key": Mine}  # type: ignore[attr-defined]
    assert param_values(odd) == {"key": repr(Mine), "rank": ("a", 1, [None, 2.5], {"k": "v"})}


@pytest.mark.anyio
async def test_the_status_gives_the_parameters_as_policy_info_does() -> None:
    """Before: the status's ``policy_params`` (the autoscaler's too) were reprs,
    ``{'charge_lost': 'True', 'max_lost': '2'}``, where ``PolicyInfo.params`` has the
    values: now both come from ``param_values``."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1, manager_alerts=None) as cluster:
            retry = await cluster.set_policy("retry", "default", max_lost=2, charge_lost=True)
            scaling = await cluster.set_policy("scaling", "queue", maximum=3)
            status = await cluster.status()
    assert status["policy_params"]["retry"] == retry.params == {"charge_lost": True, "max_lost": 2}
    auto = status["autoscaler"]
    assert auto["policy_params"] == scaling.params == {"maximum": 3}
    text = status_text({k: status[k] for k in ("policies", "policy_params", "autoscaler")})
    assert re.search(r"retry\W+default\W+charge_lost=True, max_lost=2", text), text
    assert re.search(r"scaling\W+queue\W+maximum=3", text), text


@pytest.mark.anyio
async def test_a_parameter_no_connection_carries_goes_in_the_status_as_its_repr() -> None:
    """Before: a policy parameter the codec does not carry (a recompute-cost
    ``threshold = inf`` in ``[policies]``, which never replicates; an int past 64 bits)
    went into ``policy_params`` as its value, and every status reply failed to encode:
    ``status()`` raised ``ProtocolError: ... float inf is not finite``, for every client,
    console and dashboard of the manager. Such a value goes as its repr, as an object
    of a policy's own does."""
    big = GraphPriority()
    big.params = {"n": 2**70, "fine": 2.5}  # type: ignore[attr-defined]
    assert param_values(big) == {"fine": 2.5, "n": repr(2**70)}
    with anyio.fail_after(LIMIT):
        async with hosted(1) as (address, plane):
            await plane.manager.ask(
                SetPolicyRequest("replication", "recompute-cost", {"threshold": math.inf})
            )  # (in this process: no connection carries the request)
            async with Cluster(address, manager_alerts=None) as cluster:
                status = await cluster.status()
    assert status["policies"]["replication"] == "recompute-cost"
    assert status["policy_params"]["replication"] == {"threshold": "inf"}


def test_a_swap_is_a_story_line_with_its_parameters_and_a_feed_record(
    make_state: Factory,
) -> None:
    """Before: ``priority:slow by console:eng`` twice for ``delay=0.3`` then ``0.9``, no
    line for a scaling swap, and nothing in the monitoring database."""
    s = make_state()
    s.feed_on = True
    retry = REGISTRY.create("retry", "default", {"max_lost": 2})
    run(s, event(PolicyChanged, kind="retry", policy=retry, by="console:eng"))
    run(s, event(ScalingChanged, name="queue", params={"maximum": 3}, by="console:eng"))
    run(s, event(PolicyChanged, kind="priority", policy=GraphPriority(), why="slow: test"))
    assert [e[1:3] for e in s.story("-")] == [
        ("policy", "retry:default(max_lost=2) by console:eng"),
        ("policy", "scaling:queue(maximum=3) by console:eng"),
        ("policy", "priority:graph replaced (slow: test)"),
    ]
    records = [r for _, rs in s.feed for r in rs if r[0] == "policy"]
    assert records == [
        ("policy", "retry", "default", '{"max_lost": 2}', "console:eng", ""),
        ("policy", "scaling", "queue", '{"maximum": 3}', "console:eng", ""),
        ("policy", "priority", "graph", "{}", "", "slow: test"),
    ]


@pytest.mark.anyio
async def test_every_swap_is_a_row_of_the_monitoring_database(tmp_path: Path) -> None:
    db = tmp_path / "mon.db"
    with anyio.fail_after(LIMIT):
        async with Cluster(
            workers=1, monitoring=db, monitoring_interval=0.1, name="eng"
        ) as cluster:
            await cluster.set_policy("priority", "long-first")
            await cluster.set_policy("scaling", "queue", maximum=3)
            await cluster.set_policy("placement", "locality", min_duration=0.5)
            await wait_until(lambda: len(_policy_rows(db)) == 3, "3 rows", limit=LIMIT / 2)
    assert _policy_rows(db) == [
        ("priority", "long-first", "{}", "eng", None),
        ("scaling", "queue", '{"maximum": 3}', "eng", None),
        ("placement", "locality", '{"min_duration": 0.5}', "eng", None),
    ]
    # and the report lists them
    page = build_report(db)
    assert "<h2>Policy swaps</h2>" in page
    assert "<td>scaling</td><td>queue</td><td>maximum=3</td><td>eng</td>" in page


def _policy_rows(db: Path) -> list[tuple[Any, ...]]:
    import sqlite3

    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT kind, name, params, by, why FROM policies ORDER BY time, rowid"
        ).fetchall()
    except sqlite3.OperationalError:  # not made yet
        return []
    finally:
        conn.close()
