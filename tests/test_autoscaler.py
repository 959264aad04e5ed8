"""Tests of the autoscaler actor (actors/autoscaler.py) in an embedded cluster.

The decisions are tested in tests/test_autoscaler_state.py; these check that the shell
carries them out: scale-in drains a busy worker through the scheduler instead of
stopping it, and the scaling policy is swapped at runtime with ``set_policy``. Every
test is bounded; waits poll a condition under a deadline.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import actors.autoscaler
from actors.autoscaler import _Tick
from actors.worker import host_cpus
from policies import REGISTRY
from runtime import Cluster
from runtime.errors import AskTimeout, UnknownPolicyError
from runtime.messages import DrainRequest, PolicyInfo, PolicyQuery, RestoreRequest
from runtime.preflight import LOCAL_WORKERS_PER_CPU
from tests.helpers import autoscalers_made, block_end, no_ticks, wait_until

pytestmark = pytest.mark.anyio

BOUND = 20  # seconds any single test may take
GATE = 10  # seconds a gated task waits at most


class Gated:
    """A task function that counts its runs and waits for the gate."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[int] = Counter()
        self.gate = threading.Event()

    def __call__(self, i: int) -> int:
        with self.lock:
            self.runs[i] += 1
        if not self.gate.wait(GATE):
            raise TimeoutError("gate never opened")
        return i * 10

    def open(self) -> None:
        self.gate.set()


async def running_on_both(cluster: Cluster, task: Gated | GatedEach, n: int) -> list[Any]:
    """Map ``task`` over ``range(n)`` on a cluster of two workers once both joined;
    return the futures once a task runs on each worker."""
    await cluster.wait_for_workers(2)
    futs = cluster.map(task, range(n))
    await wait_until(lambda: len(task.runs) == 2, "a task running on each worker", limit=BOUND)
    return futs


async def test_scale_in_drains_a_busy_worker_instead_of_stopping_it() -> None:
    task = Gated()
    async with gated_cluster(task, workers=2) as cluster:
        state = cluster.scheduler_state
        futs = await running_on_both(cluster, task, 4)
        assert await cluster.scale(1) == {"default": 1}
        # The newest block's worker drains: no new tasks, and it keeps the ones it
        # has (the scheduler retires it only once they are done).
        await wait_until(
            lambda: state.workers["worker-2"].draining, "worker-2 draining", limit=BOUND
        )
        busy = {ts.key for ts in state.workers["worker-2"].processing}
        assert busy and not state.workers["worker-2"].retired
        assert sorted(task.runs.values()) == [1, 1]  # one thread each; none again
        task.gate.set()
        assert await cluster.gather(futs) == [0, 10, 20, 30]
        # Its tasks finished there; no try was lost with it. (Outputs it held are
        # made again elsewhere once it has left: a drain does not move data.)
        for key in busy:
            tries = [(t.worker, t.outcome) for t in state.tasks[key].tries]
            assert tries[0] == ("worker-2", "ok"), tries
            assert {outcome for _, outcome in tries} == {"ok"}, tries
        await wait_until(lambda: "worker-2" not in state.workers, "worker-2 to leave", limit=BOUND)
        auto = (await cluster.status())["autoscaler"]
        assert (auto["targets"], auto["ended"], auto["gave_up"]) == ({"default": 1}, 1, [])
        assert list(auto["blocks"]) == ["block-1"]


class GatedEach:
    """A task function whose run ``i`` waits for its own gate."""

    def __init__(self, n: int) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[int] = Counter()
        self.gates = [threading.Event() for _ in range(n)]

    def __call__(self, i: int) -> int:
        with self.lock:
            self.runs[i] += 1
        if not self.gates[i].wait(GATE):
            raise TimeoutError("gate never opened")
        return i

    def open(self) -> None:
        for gate in self.gates:
            gate.set()


@asynccontextmanager
async def gated_cluster(*tasks: Gated | GatedEach, **options: Any) -> AsyncIterator[Cluster]:
    """``Cluster(**options)`` within ``BOUND`` seconds; on the way out, whatever
    happened, every gate of ``tasks`` is opened (no task thread is left waiting)."""
    try:
        with anyio.fail_after(BOUND):
            async with Cluster(**options) as cluster:
                yield cluster
    finally:
        for task in tasks:
            task.open()


@asynccontextmanager
async def two_busy_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Any, Cluster, list[Any], GatedEach]]:
    """An embedded cluster of two workers whose autoscaler ticks only when asked, a
    gated task running on each, and a tick: the core saw both blocks busy. Yields the
    autoscaler, the cluster, the futures and the task."""
    monkeypatch.setattr(actors.autoscaler.Autoscaler, "_ticks", no_ticks)
    made = autoscalers_made(monkeypatch)
    task = GatedEach(2)
    async with gated_cluster(task, workers=2) as cluster:
        (auto,) = made
        futs = await running_on_both(cluster, task, 2)
        await auto.ref.ask(_Tick())  # the core sees both blocks running, busy
        yield auto, cluster, futs, task


async def first_task_done(cluster: Cluster, futs: list[Any], task: GatedEach) -> None:
    """Let worker-1's task finish; return once worker-1 runs nothing."""
    first = cluster.scheduler_state.workers["worker-1"]
    (i,) = [ts.key for ts in first.processing]
    task.gates[[f.key for f in futs].index(i)].set()
    await wait_until(lambda: not first.processing, "worker-1 idle", limit=BOUND)


async def test_scale_in_judges_idle_blocks_by_the_counts_now_not_the_last_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The core last saw both blocks busy; since, one worker finished its task and the
    other still runs one. An operator's scale-in retires the block idle now. Before,
    it went by the last tick's counts (both busy) and drained the busy block (the last
    by id), which also left the idle one running."""
    async with two_busy_blocks(monkeypatch) as (auto, cluster, futs, task):
        state = cluster.scheduler_state
        core = auto.state
        assert [(b.state, b.idle_since) for b in core.blocks.values()] == [
            ("running", None),
            ("running", None),
        ]
        owner = {w: bid for bid, b in core.blocks.items() for w in b.workers}
        await first_task_done(cluster, futs, task)
        assert await cluster.scale(1) == {"default": 1}
        idle, busy = core.blocks[owner["worker-1"]], core.blocks[owner["worker-2"]]
        assert idle.retiring and not busy.retiring
        assert not state.workers["worker-2"].draining
        task.open()
        assert sorted(await cluster.gather(futs)) == [0, 1]
        await wait_until(lambda: "worker-1" not in state.workers, "worker-1 to leave", limit=BOUND)
        assert list((await cluster.status())["autoscaler"]["blocks"]) == [busy.block_id]


async def test_an_idle_in_process_worker_drained_ends_free() -> None:
    """An operator drains an idle worker of an embedded cluster: the scheduler retires
    it at once and its block reads ``failed`` (an in-process worker's block does once
    its actor stopped). The worker's story says the scheduler retired it, so the end is
    ``drained``, free, and the block is replaced. Before, it was a crash and spent the
    replacement budget."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=2) as cluster:
            await cluster.wait_for_workers(2)
            await cluster._plane.refs["scheduler"].ask(DrainRequest("worker-2"))

            end = await block_end(cluster, "block-2", limit=BOUND)
            assert (end["state"], end["cause"], end["charged"]) == ("failed", "drained", False)
            assert (await cluster.status())["autoscaler"]["budget_spent"] == 0
            await wait_until(
                lambda: "worker-3" in cluster.scheduler_state.workers,
                "the replacement",
                limit=BOUND,
            )


async def test_a_drain_the_scheduler_does_not_answer_in_time_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler answers no drain within ``drain_timeout``: the autoscaler asks
    again (logged each time) and keeps the busy block, whose tasks finish there. Before,
    no answer counted as "worker not known": the block was stopped under its tasks."""
    late = {"answers": 3}  # the scheduler's next three answers come too late

    class Busy:
        """The scheduler's reference, whose answers to drains come too late (the
        scheduler gets the request and drains the worker; the answer misses)."""

        def __init__(self, ref: Any) -> None:
            self.ref = ref

        def __getattr__(self, name: str) -> Any:
            return getattr(self.ref, name)

        async def ask(self, msg: Any, **kwargs: Any) -> Any:
            if isinstance(msg, DrainRequest) and late["answers"] > 0:
                late["answers"] -= 1
                await self.ref.tell(msg)
                raise AskTimeout(self.ref.name, type(msg).__name__, 10.0)
            return await self.ref.ask(msg, **kwargs)

    made = autoscalers_made(monkeypatch, Busy)
    monkeypatch.setattr(actors.autoscaler, "DRAIN_RETRY", 0.05)  # then 0.1, 0.2
    task = Gated()
    async with gated_cluster(task, workers=2) as cluster:
        (auto,) = made
        state = cluster.scheduler_state
        futs = await running_on_both(cluster, task, 4)
        assert await cluster.scale(1) == {"default": 1}
        await wait_until(lambda: auto.drains_unanswered == 2, "the drain asked again", limit=BOUND)
        block = auto.state.blocks["block-2"]
        assert block.retiring and not block.stopping
        assert "worker-2" in state.workers and state.workers["worker-2"].processing
        await wait_until(lambda: "worker-2" in block.drained, "the drain answered", limit=BOUND)
        assert auto.drains_unanswered == 3 and not block.stopping
        assert state.workers["worker-2"].draining
        busy = {ts.key for ts in state.workers["worker-2"].processing}
        task.gate.set()
        assert await cluster.gather(futs) == [0, 10, 20, 30]
        for key in busy:  # they finished where they ran: no try lost
            tries = [(t.worker, t.outcome) for t in state.tasks[key].tries]
            assert tries == [("worker-2", "ok")], tries
        await wait_until(lambda: "worker-2" not in state.workers, "worker-2 to leave", limit=BOUND)


async def test_a_held_scale_out_goes_back_to_the_target_by_draining() -> None:
    task = Gated()
    async with gated_cluster(task, workers=1) as cluster:
        await cluster.wait_for_workers(1)
        state = cluster.scheduler_state
        futs = cluster.map(task, range(3))
        # 3 blocks for 3 s (as an alert's scale-out asks); the target stays 1.
        assert await cluster.scale(3, hold=3.0) == {"default": 3}
        await wait_until(lambda: len(task.runs) == 3, "a task on each", limit=BOUND)
        auto = (await cluster.status())["autoscaler"]
        assert auto["targets"] == {"default": 1}
        # The hold ends while all three are busy: two are drained, none stopped.
        await wait_until(
            lambda: sum(w.draining for w in state.workers.values()) == 2,
            "two workers draining after the hold",
            limit=BOUND,
        )
        task.gate.set()
        assert await cluster.gather(futs) == [0, 10, 20]
        await wait_until(lambda: len(state.workers) == 1, "back to 1 worker", limit=BOUND)
        for fut in futs:
            assert {t.outcome for t in state.tasks[fut.key].tries} == {"ok"}
        with pytest.raises(ValueError, match="hold must be > 0"):
            await cluster.scale(2, hold=0.0)


async def test_the_scaling_policy_is_swapped_at_runtime() -> None:
    task = Gated()
    async with gated_cluster(task, workers=1) as cluster:
        await cluster.wait_for_workers(1)
        info = await cluster.set_policy("scaling", "queue", tasks_per_block=10, maximum=3)
        assert info == PolicyInfo(
                "scaling", "queue", ("demand", "fixed", "queue"),
                {"maximum": 3, "tasks_per_block": 10}, REGISTRY.defaults("scaling"),
            )  # fmt: skip
        assert info.defaults["queue"] == {"tasks_per_block": "100", "maximum": "16"}
        with pytest.raises(UnknownPolicyError):
            await cluster.set_policy("scaling", "no-such-policy")
        # What the console's `policy list` shows: the scaling row too.
        infos = await cluster._plane.refs["manager"].ask(PolicyQuery())
        assert infos[-1] == info and {i.kind for i in infos[:-1]} >= {"placement"}
        # 40 ready tasks, 10 per block: the policy asks for 3 blocks (its maximum)
        # at the autoscaler's next tick, above the target of 1.
        futs = cluster.map(task, range(40))
        state = cluster.scheduler_state
        await wait_until(lambda: len(state.workers) == 3, "3 workers", limit=BOUND)
        auto = (await cluster.status())["autoscaler"]
        assert (auto["policy"], auto["targets"], auto["desired"]) == (
            "queue",
            {"default": 1},
            {"default": 3},
        )
        task.gate.set()
        assert await cluster.gather(futs) == [i * 10 for i in range(40)]
        # The queue is empty: back to the target, by draining.
        await wait_until(lambda: len(state.workers) == 1, "back to 1 worker", limit=BOUND)
        # Scaled in by draining: no try was lost with a worker.
        for fut in futs:
            assert {t.outcome for t in state.tasks[fut.key].tries} == {"ok"}


async def test_the_scaling_policy_is_chosen_at_construction() -> None:
    task = Gated()
    policies = {"scaling": ("queue", {"tasks_per_block": 10, "maximum": 2})}
    async with gated_cluster(task, workers=1, policies=policies) as cluster:
        auto = (await cluster.status())["autoscaler"]
        assert auto["policy"] == "queue"
        # 20 ready tasks, 10 per block: the policy asks for its maximum, 2 blocks.
        futs = cluster.map(task, range(20))
        state = cluster.scheduler_state
        await wait_until(lambda: len(state.workers) == 2, "2 workers", limit=BOUND)
        task.gate.set()
        assert await cluster.gather(futs) == [i * 10 for i in range(20)]


async def test_a_bad_scaling_policy_at_construction_fails_the_start() -> None:
    with anyio.fail_after(BOUND), pytest.raises(UnknownPolicyError, match="queue"):
        async with Cluster(workers=1, policies={"scaling": "no-such-policy"}):
            pass


async def test_scaling_an_embedded_pool_past_this_machine_is_refused_before_anything_starts() -> (
    None
):
    """``Cluster(workers=1)`` then ``scale(2**40)`` started 1024 workers (the core's cap,
    silently) and kept 2**40 as the target. A pool without max_blocks of its own runs its
    workers on this machine: past ``runtime.node.machine_blocks()`` the call is refused
    saying what to do, with or without ``hold``, and nothing starts or changes."""
    most = LOCAL_WORKERS_PER_CPU * (host_cpus() or 1)  # runtime.node.machine_blocks
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            await cluster.wait_for_workers(1)
            for hold in (None, 5.0):
                with pytest.raises(ValueError) as err:
                    await cluster.scale(2**40, hold=hold)
                said = str(err.value)
                assert f"takes at most {most} blocks here" in said, said
                assert "'max_blocks'" in said and "docs/configuration.md#pools" in said, said
            with pytest.raises(ValueError, match=f"scale\\({most + 1}\\) of pool 'default'"):
                await cluster.scale(most + 1)
            status = await cluster.status()
            assert status["autoscaler"]["targets"] == {"default": 1}, status["autoscaler"]
            assert len(status["workers"]) == 1 and len(status["autoscaler"]["blocks"]) == 1
            assert await cluster.scale(2) == {"default": 2}  # within it: as before


async def test_a_restore_drains_no_busy_worker_each_goes_once_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An alert's ``restore`` (``RestoreRequest``, as the alert monitor asks it) sets the
    target from 2 back to 1 while both workers run a task: neither is drained then (an
    operator's ``scale(1)`` would drain the last by id at once). worker-1's task ends:
    at the next tick it is drained and leaves; worker-2 keeps working, and the next
    task runs there."""
    then = Gated()
    then.gate.set()
    async with two_busy_blocks(monkeypatch) as (auto, cluster, futs, task):
        state = cluster.scheduler_state
        assert await auto.ref.ask(RestoreRequest(1)) == {"default": 2}
        # the answer comes once the commands were carried out: no drain was asked
        assert not any(w.draining for w in state.workers.values())
        assert (await cluster.status())["autoscaler"]["targets"] == {"default": 1}
        await first_task_done(cluster, futs, task)
        await auto.ref.ask(_Tick())
        await wait_until(lambda: "worker-1" not in state.workers, "worker-1 to leave", limit=BOUND)
        assert not state.workers["worker-2"].draining
        task.open()
        assert sorted(await cluster.gather(futs)) == [0, 1]
        assert await cluster.submit(then, 7, key="later") == 70
        assert state.tasks["later"].tries[-1].worker == "worker-2"


async def test_drained_workers_holding_held_outputs_are_taken_back_not_replaced() -> None:
    """A user audit's shape, small (fixed scaling; a queue-time rule's scale-out with
    ``restore``): both workers are drained while busy (the target back to 0); once
    their tasks finish they stay, idle, holding outputs the client holds (no worker
    stays to take a copy), and refuse the queued work. Then the pool wants 2 blocks
    again: the two are taken back and run the queued tasks; no block is started.
    Before, two new blocks were started beside them (four on a pool of two) and the
    queued tasks waited for them."""
    first, then = GatedEach(2), Gated()
    async with gated_cluster(first, then, workers=2) as cluster:
        state = cluster.scheduler_state
        held = await running_on_both(cluster, first, 2)
        assert await cluster.scale(0) == {"default": 0}
        await wait_until(
            lambda: all(w.draining for w in state.workers.values()),
            "both workers draining",
            limit=BOUND,
        )
        first.open()
        assert sorted(await cluster.gather(held)) == [0, 1]
        await wait_until(
            lambda: all(w.keeping and not w.processing for w in state.workers.values()),
            "both idle, keeping the held outputs",
            limit=BOUND,
        )
        later = [cluster.submit(then, i, key=f"b-{i}") for i in range(2)]
        await wait_until(lambda: state.count("queued") == 2, "b queued", limit=BOUND)
        assert not any(w.processing for w in state.workers.values())  # refused

        assert await cluster.scale(2) == {"default": 2}
        await wait_until(lambda: len(then.runs) == 2, "b running", limit=BOUND)
        assert sorted(state.workers) == ["worker-1", "worker-2"]
        assert not any(w.draining for w in state.workers.values())
        auto = (await cluster.status())["autoscaler"]
        assert sorted(auto["blocks"]) == ["block-1", "block-2"]
        assert (auto["retiring"], auto["ended"]) == ([], 0)
        then.gate.set()
        assert await cluster.gather(later) == [0, 10]
        ran = {t.worker for f in later for t in state.tasks[f.key].tries}
        assert ran == {"worker-1", "worker-2"}
        story = await cluster.story("worker-1")
        assert ("draining", "undrained") in {(e[1], e[2]) for e in story}
