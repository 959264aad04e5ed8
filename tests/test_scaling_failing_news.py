"""A scaling policy failing while its pool has no block: the client's "no worker to
run the ready tasks" warning and the console's status name it, and a client that
replaced it does not propose it back at its close.

A user audit: a pool with ``min_blocks = 0`` whose scaling policy raised kept its last
good proposal, 0 blocks, and its tasks waited for good; the client said "start
workers", and after the user set a working policy, its close proposed setting back
the one that raised. The autoscaler core is fed events (time as data); the client's
warnings are checked as functions and against a real manager (in-process, over the
codec), gated on the log lines.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import anyio
import pytest

from actors.autoscaler_state import PolicyChanged, Tick, policy_failing_text
from policies import REGISTRY, PoolView
from runtime import Cluster
from runtime.client import _no_workers_news, _policies_left_news, _scaling_failing
from runtime.console import jsonable
from runtime.messages import AlertInfo, AutoscalerStatus, PolicyInfo
from tests.helpers import log_lines, status_text, wait_until
from tests.test_console import hosted
from tests.test_dashboard import _answers
from tests.test_policy_guards import Answers, busy_pool

LIMIT = 60.0
PROBLEM = "desired raised RuntimeError('boom in scaling')"


def test_the_core_tells_which_pools_policy_fails_now() -> None:
    s = busy_pool()
    s.handle(PolicyChanged(3.0, Answers(RuntimeError("boom in scaling"))))
    assert s.policy_failing == {"sweep": PROBLEM}
    s.handle(Tick(4.0))
    assert s.policy_failing == {"sweep": PROBLEM}
    s.handle(PolicyChanged(5.0, Answers(3)))  # answers again: no longer failing
    assert s.policy_failing == {} and s.policy_problem == {"sweep": PROBLEM}  # (history)
    s.validate()


def _pending(pool: str) -> AlertInfo:
    return AlertInfo("CorralNoWorkers", "pending", {"pool": pool}, value=3, active_since=1.0)  # type: ignore[arg-type]


def test_the_no_workers_warning_names_a_failing_scaling_policy() -> None:
    failing_now = {"night": PROBLEM}
    auto = AutoscalerStatus(policy="raises", desired={"night": 0}, policy_failing=failing_now)
    failing = _scaling_failing(auto)
    assert failing == {"night": policy_failing_text("raises", "night", PROBLEM, 0)}
    with log_lines("corral.client", logging.WARNING) as log:
        _no_workers_news([_pending("night"), _pending("other")], set(), "m", failing)
        night, other = log.lines
    assert "pool='night'" in night and "the scaling policy 'raises' fails for pool night" in night
    assert PROBLEM in night and "0 block(s)" in night and "start workers" not in night
    assert "policy set scaling NAME" in night
    assert "start workers" in other and "scaling policy" not in other  # not its pool's
    assert _scaling_failing(None) == {} and _scaling_failing(AutoscalerStatus()) == {}


def test_the_status_names_a_pool_whose_scaling_policy_fails() -> None:
    import dataclasses

    _, status, _ = _answers()
    auto = AutoscalerStatus(
        policy="raises", desired={"night": 0}, policy_errors=2, policy_errors_by={"night": 2},
        policy_problems={"night": PROBLEM}, policy_failing={"night": PROBLEM},
    )  # fmt: skip
    text = " ".join(status_text(jsonable(dataclasses.replace(status, autoscaler=auto))).split())
    assert "the scaling policy 'raises' fails for pool night" in text
    assert "its last good proposal, 0 block(s)" in text
    recovered = dataclasses.replace(auto, policy_failing={})
    text = status_text(jsonable(dataclasses.replace(status, autoscaler=recovered)))
    assert "fails for pool" not in text


def test_a_failing_policy_replaced_is_not_proposed_back() -> None:
    before = PolicyInfo("scaling", "raises")
    mine = PolicyInfo("scaling", "queue", params={"maximum": "2"})
    with log_lines("corral.client", logging.WARNING) as log:
        told = _policies_left_news(
            {"scaling": (before, mine)}, [mine], "m", {"scaling": f"pool night: {PROBLEM}"}
        )
        (line,) = log.lines
    assert told == ["scaling"]
    assert "set_policy('scaling', 'raises')" not in line and "policy set scaling raises" not in line
    assert "'raises', was failing (pool night: desired raised" in line
    assert "console: policy list lists the others" in line


class ScaleRaises:
    def desired(self, pool: PoolView) -> int:
        raise RuntimeError("boom in scaling")


@pytest.mark.anyio
async def test_a_client_names_the_failing_scaling_policy_and_does_not_propose_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # registered for this test only (other tests list the scaling policies)
    monkeypatch.setitem(REGISTRY._factories["scaling"], "test-scale-raises", ScaleRaises)
    with anyio.fail_after(LIMIT), log_lines("corral.client", logging.WARNING) as log:
        async with hosted(0, alerting={"interval": 0.1}) as (address, _):
            async with Cluster(address, manager_alerts=None) as first:
                await first.set_policy("scaling", "test-scale-raises")
            async with Cluster(address, manager_alerts=0.1) as cluster:
                fut = cluster.submit(operator.add, 1, 2)
                line: Any = await wait_until(
                    lambda: log.with_("no worker to run the ready tasks"), "the warning"
                )
                assert "the scaling policy 'test-scale-raises' fails for pool default" in line
                assert "boom in scaling" in line and "start workers" not in line
                await cluster.set_policy("scaling", "queue", maximum=1)
                assert await fut == 3
            left = [ln for ln in log.lines if "stays in force" in ln]
    assert "'test-scale-raises', was failing (pool default: desired raised" in left[-1]
    assert "set_policy('scaling', 'test-scale-raises')" not in left[-1]
