"""A worker's spills that found no disk room (the diskfull user audit's finding 5: a
spill that hit ENOSPC was seen only in the worker's log): the store counts them, the
worker's memory report carries them, and the scheduler shows them as the worker's
warning (``status()["warnings"]``, which the console and the dashboard show) until the
worker leaves. ``MemoryStalled`` naming them: tests/test_memory_stall_pools.py."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from actors.store import SpillStore
from runtime.console import jsonable
from runtime.kernel import ActorSystem
from runtime.messages import (
    RegisterWorker,
    StatusReply,
    StatusRequest,
    WorkerGone,
    WorkerInfo,
    WorkerMemoryReport,
)
from runtime.node import start_control_plane
from tests.helpers import GB, status_text
from tests.test_rejoin_holds import Probe


def test_a_store_counts_the_spills_its_disk_had_no_room_for(tmp_path: Path) -> None:
    store = SpillStore(tmp_path, disk_limit=100)
    store.put("a", np.ones(1000), 8000)
    assert store.spill(10**6) == 0 and store.spill(10**6) == 0
    assert store.spill_refused == 2 and store.spill_refused_why == "disk_limit 100 B reached"
    store.close()


@pytest.mark.anyio
async def test_a_refused_spill_reaches_the_status_and_the_console_until_the_worker_goes() -> None:
    """The worker's memory report carries its refused spills; the scheduler shows them
    as that worker's warning (status()["warnings"]: the console and the dashboard show
    those) and drops it when the worker leaves."""
    with anyio.fail_after(20):
        async with ActorSystem() as system:
            plane = await start_control_plane(system, alerting=None)
            scheduler = plane.refs["scheduler"]
            ref = await system.spawn(Probe(), "probe")
            scheduler.post(RegisterWorker(WorkerInfo("w4", 1, GB, pool="spill"), ref))
            at = time.mktime((2026, 12, 6, 10, 51, 7, 0, 0, -1))
            report = WorkerMemoryReport(
                "w4", True, GB, GB // 2, GB, spill_refused=3, spill_refused_at=at,
                spill_refused_why="OSError(28, 'No space left on device')",
                spill_dir="/scratch3",
            )  # fmt: skip
            scheduler.post(report)
            st = await scheduler.ask(StatusRequest(categories=False))
            (warning,) = st["warnings"]
            assert warning.startswith(
                "worker w4: spill refused: no disk room on '/scratch3' (3 times, last at "
                "10:51:07: OSError(28, 'No space left on device')); its outputs stay in "
                "memory"
            )
            assert warning.endswith(
                "give the worker a --spill-dir on a larger one, or a larger --disk"
            )
            assert st["memory"]["w4"].spill_refused == 3
            text = " ".join(status_text(jsonable(StatusReply(warnings=(warning,)))).split())
            assert "warning: worker w4: spill refused: no disk room on '/scratch3'" in text
            scheduler.post(WorkerGone("w4", "unknown"))
            st = await scheduler.ask(StatusRequest(categories=False))
            assert st["warnings"] == ()
