"""``[scheduler] submit_max_priority``: the highest ``priority=`` a client with the
submit token may give its tasks on a shared manager. Before it, under the ``fair``
priority, one person's 50,000 tasks submitted with ``priority=5`` ran ahead of another
person's 20 tasks of the default priority: those waited 226 s for the whole flood
against 1.0 s at the same priority (audit: a manager shared by five people). With the
cap, such a graph is refused whole with a :class:`PermissionDenied` that says what to
do; at or under the cap it runs; the operator's admin-token client is not held to it.

A real manager (``--config`` with the cap) and worker on 127.0.0.1 (ports
50500-50999); every wait is bounded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import dask
import pytest
from dask import delayed

from actors.pools import scheduler_settings
from actors.scheduler_records import SchedulerConfig
from runtime import Cluster
from runtime.node import PermissionDenied
from tests.helpers import Cli, free_port_between

LIMIT = 60


def inc(x: int) -> int:
    return x + 1


class Site:
    def __init__(self, address: str, tokens: dict[str, str]) -> None:
        self.address = address
        self.tokens = tokens


@pytest.fixture(scope="module")
def site(tmp_path_factory: Any) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("submitcap")
    config = tmp / "corral.toml"
    config.write_text('[policies]\npriority = "fair"\n\n[scheduler]\nsubmit_max_priority = 0\n')
    port = free_port_between(50_500, 50_999)
    with Cli(tmp / "home") as cli:
        cli.env.pop("CORRAL_TOKEN", None)
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--config",
            str(config),
        )  # fmt: skip
        line = cli.line_with(manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        wport = free_port_between(50_500, 50_999)
        worker = cli.start(
            "worker", address, "--host", "127.0.0.1", "--port", str(wport), "--cores", "2"
        )
        cli.line_with(worker, f"joined {address}")
        yield Site(address, cli.tokens(address))


@pytest.mark.anyio
async def test_a_submit_token_client_may_not_raise_its_tasks_above_the_cap(site: Site) -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(site.address, token=site.tokens["submit"], name="alice") as alice:
            await alice.wait_for_workers(1)
            raised = alice.submit(inc, 1, priority=5)
            with pytest.raises(PermissionDenied) as info:
                await raised
            text = str(info.value)
            assert (
                "has priority=5, above 0, the highest this manager lets a client with the "
                "submit token give ([scheduler] submit_max_priority)" in text
            ), text
            assert "Nothing of the graph was submitted" in text, text
            assert "ask the cluster's operator" in text, text
            # A layer's annotation is held to it too, and the whole graph is refused.
            with dask.annotate(priority=3):
                high = delayed(inc)(1, dask_key_name="high")
            low = delayed(inc)(high, dask_key_name="low")
            with pytest.raises(PermissionDenied, match="task 'high' has priority=3"):
                await alice.compute(low)
            # At or under the cap (a lower priority orders one's own work): it runs.
            assert await alice.submit(inc, 2, priority=0) == 3
            assert await alice.submit(inc, 3, priority=-4) == 4
            status = await alice.status()
            assert "high" not in str(status.get("recent_runs")), status


@pytest.mark.anyio
async def test_the_operator_s_admin_token_client_is_not_held_to_the_cap(site: Site) -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(site.address, token=site.tokens["admin"], name="op") as op:
            assert await op.submit(inc, 10, priority=5) == 11


def test_the_cap_is_a_scheduler_setting_checked_when_read() -> None:
    assert SchedulerConfig().submit_max_priority == float("inf")
    assert scheduler_settings({"submit_max_priority": 0}) == {"submit_max_priority": 0}
    assert scheduler_settings({"submit_max_priority": float("inf")}) == {
        "submit_max_priority": float("inf")
    }
    with pytest.raises(ValueError, match="key 'submit_max_priority' must be a number >= 0"):
        scheduler_settings({"submit_max_priority": -1})
    with pytest.raises(ValueError, match="submit_max_priority must be a number >= 0"):
        SchedulerConfig(submit_max_priority=-1)
