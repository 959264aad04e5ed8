"""The scheduler asks every worker that registers what it holds (``ConfirmHolds``): one
that rejoined over a new connection, and one that joins anew under an id it was declared
lost with, which may still hold outputs (files on its disk) nothing tracks any more. The
core's answer to what it holds is tested in tests/test_scheduler_failures.py; this is
the shell's asking, with the real scheduler actor in an actor system."""

from __future__ import annotations

import anyio
import pytest

from runtime.kernel import Actor, ActorSystem, handles
from runtime.messages import (
    ConfirmHolds,
    MonitorFeed,
    RegisterWorker,
    WorkerGone,
    WorkerInfo,
    WorkerMemoryReport,
)
from runtime.node import start_control_plane
from tests.helpers import GB

pytestmark = pytest.mark.anyio
LIMIT = 20


class Probe(Actor):
    """Stands for a worker: counts the times it is asked what it holds."""

    def __init__(self) -> None:
        self.asked = 0
        self.changed = anyio.Event()

    @handles(ConfirmHolds)
    def confirm(self, msg: ConfirmHolds) -> None:
        self.asked += 1
        self.changed.set()
        self.changed = anyio.Event()


async def test_a_worker_is_asked_what_it_holds_when_it_joins_and_when_it_joins_anew() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            plane = await start_control_plane(system, alerting=None)
            scheduler = plane.refs["scheduler"]
            probe = Probe()
            ref = await system.spawn(probe, "probe")
            info = WorkerInfo("w1", 1, GB)
            for times in (1, 2):
                waiting = probe.changed
                scheduler.post(RegisterWorker(info, ref))
                await waiting.wait()
                assert probe.asked == times
                # Declared lost (a stall past the grace): it comes back as a new worker.
                scheduler.post(WorkerGone("w1", "unknown"))


async def test_a_worker_has_no_resource_sample_until_its_memory_is_measured() -> None:
    """The monitoring database's samples come from the scheduler's latest numbers per
    worker: one that joined (or joined again, a requeued block's) and has not reported
    its memory yet has no sample, rather than an RSS of 0 (which the report drew as a
    drop to nothing)."""
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            plane = await start_control_plane(system, alerting=None)
            scheduler = plane.refs["scheduler"]
            probe = Probe()
            ref = await system.spawn(probe, "probe")
            waiting = probe.changed
            scheduler.post(RegisterWorker(WorkerInfo("w1", 1, GB), ref))
            await waiting.wait()
            reply = await scheduler.ask(MonitorFeed())
            assert "w1" not in reply.workers
            scheduler.post(WorkerMemoryReport("w1", False, 300 * 2**20, GB, GB))
            reply = await scheduler.ask(MonitorFeed())
            assert reply.workers["w1"][0] == 300 * 2**20


async def test_a_worker_logs_joined_at_its_first_join_not_rejoined() -> None:
    """The worker's answer to the ConfirmHolds of its first join is logged as 'joined'
    (it said 'rejoined', before any rejoin); later ones say 'rejoined'."""
    from runtime import Cluster
    from tests.helpers import log_lines, wait_until

    with anyio.fail_after(LIMIT), log_lines("corral") as logs:
        async with Cluster(workers=1) as cluster:
            await cluster.wait_for_workers(1)
            await wait_until(lambda: logs.has("joined", "held=0"), "the worker's join line")
            assert logs.has("event='joined'", "held=0"), logs.lines
            assert not logs.has("rejoined"), logs.lines
