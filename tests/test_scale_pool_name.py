"""``scale(n, pool=...)`` naming a pool that is not there, and ``wait_for_workers(n < 0)``.

A bad-input audit: on ``Cluster(workers=2)``, ``scale(1, pool="nope")`` quietly made a
pool "nope" and started a worker in it. That is documented (docs/configuration.md: on a
cluster without pools, ``scale(n, pool='gpu')`` starts workers in it, as the warning
for a task of a pool nobody has says), so it stays; it is now said, with the pools
there are and the closest name. With pools configured, a pool that is not one of them
stays a ``ValueError``, now with the closest name. ``wait_for_workers(-1)`` returned
at once: a ``ValueError`` saying what ``n`` may be.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from runtime import Cluster
from tests.helpers import log_lines

LIMIT = 10.0
NEW = "scale makes a new pool"


@pytest.mark.anyio
async def test_scale_names_the_new_pool_it_makes_on_a_cluster_without_pools() -> None:
    with anyio.fail_after(LIMIT), log_lines("corral", logging.WARNING) as log:
        async with Cluster(workers=0) as cluster:
            assert await cluster.scale(1) == {"default": 1}  # its own pool: nothing said
            assert not log.has(NEW)
            assert await cluster.scale(1, pool="defualt") == {"default": 1, "defualt": 1}
            line = log.with_(NEW)
            assert line is not None and "pool='defualt'" in line and "pools='default'" in line
            assert "did you mean 'default'?" in line
            assert "only tasks given pool='defualt' use" in line
            assert "scale(0, pool='defualt') stops them" in line
            assert (await cluster.scale(0, pool="defualt"))["default"] == 1
            assert sum(NEW in ln for ln in log.lines) == 1  # known now: said once


@pytest.mark.anyio
async def test_scale_refuses_a_pool_that_is_not_configured_with_the_closest_name() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(pools={"cpu": {"max_blocks": 1}, "gpu": {"max_blocks": 1}}) as c:
            with pytest.raises(ValueError) as info:
                await c.scale(1, pool="cpus")
            assert (
                "there is no pool 'cpus'; did you mean 'cpu'? The configured pools: cpu, gpu"
                in str(info.value)
            )
            assert "did you mean 'cpu'?" in str(info.value)


@pytest.mark.anyio
@pytest.mark.parametrize("n", [-1, 1.5, True, "2"])
async def test_wait_for_workers_refuses_an_n_that_is_no_count(n: object) -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=0) as cluster:
            with pytest.raises(ValueError, match=r"wait_for_workers\(n\): n, the number of "):
                await cluster.wait_for_workers(n)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match=f"must be a whole number >= 0, got {n!r}"):
                await cluster.wait_for_workers(n)  # type: ignore[arg-type]
            await cluster.wait_for_workers(0)  # none: at once
