"""The autoscaler with real worker processes (``Cluster(processes=N)``): a block's
worker process joins the scheduler under the id its block records, so scale-in drains
it through the scheduler, a killed one is lost the moment its process exits (not after
the gateway's reconnection grace), and peers named by their block still reach each
other for inputs.

Tasks run in other processes, so their progress shows only in the filesystem: each
task marks the worker it runs on (``CORRAL_WORKER_ID``, which the provider sets) and
waits, bounded, for a gate file. Waits are bounded polls (``wait_until``) with limits
below what they prove.
"""

from __future__ import annotations

import inspect
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.autoscaler import Autoscaler
from actors.providers import BlockState
from runtime import Cluster
from runtime.messages import DrainRequest
from runtime.node import serve_gateway
from tests.helpers import autoscalers_made, block_end, no_ticks, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 90  # seconds any test may take (two worker processes start in each)
GATE = 30.0  # seconds a task waits for its gate at most
#: the gateway's reconnection grace for a worker whose connection dropped
GRACE: float = inspect.signature(serve_gateway).parameters["reconnect_timeout"].default


def gated(i: int, marks: str, gate: str) -> int:
    """Mark this task's worker, then wait (bounded) until the gate file exists."""
    Path(marks, os.environ["CORRAL_WORKER_ID"]).touch()
    deadline = time.monotonic() + GATE
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return i * i


def both_marked(i: int, marks: str) -> int:
    """Mark this task's worker, then wait (bounded) until a task ran on each of two."""
    Path(marks, os.environ["CORRAL_WORKER_ID"]).touch()
    deadline = time.monotonic() + GATE
    while len(os.listdir(marks)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return i


async def one_running_on_each(cluster: Cluster, n: int, marks: Path, gate: Path) -> list[Any]:
    """Submit ``n`` gated tasks; return their futures once one runs on each of the two
    workers (the others wait behind them until the test opens the gate)."""
    futs = cluster.map(gated, range(n), marks=str(marks), gate=str(gate))
    await wait_until(
        lambda: {p.name for p in marks.iterdir()} == {"worker-1", "worker-2"},
        "a task running on each worker",
        limit=GATE,
    )
    return futs


def outcomes(state: Any, keys: list[Any]) -> dict[Any, list[str]]:
    """The outcome of every try of each of ``keys``."""
    return {k: [t.outcome for t in state.tasks[k].tries] for k in keys}


async def test_scaling_a_process_cluster_in_drains_its_busy_worker(tmp_path: Path) -> None:
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            state = cluster.scheduler_state
            provider = cluster._plane.provider
            # The scheduler knows the workers by the ids their blocks record.
            assert {w for b in provider.blocks.values() for w in b.workers} == set(state.workers)
            futs = await one_running_on_each(cluster, 4, marks, gate)
            assert await cluster.scale(1) == {"default": 1}
            # The newest block's worker drains: no new tasks; it finishes what it has.
            await wait_until(
                lambda: state.workers["worker-2"].draining, "worker-2 draining", limit=GATE
            )
            block = provider.blocks["block-2"]
            assert block.state is BlockState.RUNNING  # busy: not stopped
            gate.touch()
            assert await cluster.gather(futs) == [i * i for i in range(4)]
            # Once idle it is retired, its process exits by itself and the block ends.
            await wait_until(lambda: block.state.terminal, "block-2 ended", limit=GATE)
            assert block.state in (BlockState.COMPLETED, BlockState.CANCELLED), block.detail
            await wait_until(lambda: "worker-2" not in state.workers, "worker-2 gone", limit=GATE)
            # No try was lost with it, and nothing ran twice: the outputs it alone held,
            # which this client still holds, were copied to worker-1 before it was
            # retired (before, they were lost with it and computed again).
            tries = outcomes(state, [f.key for f in futs])
            assert all(per_key == ["ok"] for per_key in tries.values()), tries
            assert all(state.tasks[f.key].who_has == {"worker-1"} for f in futs)
            assert ("worker-2", "joined", "draining") in [e[:3] for e in state.story("worker-2")]
            assert provider.blocks["block-1"].state is BlockState.RUNNING
            auto = (await cluster.status())["autoscaler"]
            assert (list(auto["blocks"]), auto["ended"]) == (["block-1"], 1)


def square(i: int) -> int:
    return i * i


async def test_scaling_in_keeps_the_only_holder_of_a_result_the_client_holds() -> None:
    """Scaled to 0 while this client still holds a result only that worker has: the
    worker drains but is not retired (its output would be lost and computed again, as
    dask's adaptive scaling keeps such a worker); the result comes back from it, once;
    released, nothing keeps the worker and its block ends."""
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1) as cluster:
            await cluster.wait_for_workers(1, timeout=60)
            state = cluster.scheduler_state
            fut = cluster.submit(square, 7)
            assert await fut.wait() is None
            assert await cluster.scale(0) == {"default": 0}
            ws = state.workers["worker-1"]
            await wait_until(lambda: ws.draining, "worker-1 draining", limit=GATE)
            assert not ws.retired and ws.keeping == {state.tasks[fut.key]}
            assert ("worker-1", "draining", "keeping:1") in [e[:3] for e in state.story("worker-1")]
            assert await fut == 49
            assert [t.outcome for t in state.tasks[fut.key].tries] == ["ok"]
            fut.release()
            end = await block_end(cluster, "block-1", limit=GATE)
            assert (end["state"], end["cause"]) == ("completed", "drained"), end


async def test_a_block_whose_worker_the_scheduler_drained_ends_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator drains a busy worker (the scheduler's drain, as before a walltime):
    under the default ``fixed`` policy too, the autoscaler sees it drained, asks for its
    replacement at once (it comes up while the drained worker still runs its task), and
    the block's end afterwards is cause ``drained``, free. Before, only policies that
    read the queues learnt of drains: the end was ``unknown`` and spent the replacement
    budget (with a walltime, every block's end did); and the replacement was asked for
    only once the block had ended."""
    made = autoscalers_made(monkeypatch)
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            (core,) = [a.state for a in made]
            futs = await one_running_on_each(cluster, 2, marks, gate)
            await cluster._plane.refs["scheduler"].ask(DrainRequest("worker-2"))
            await wait_until(
                lambda: core.blocks["block-2"].sched_drained, "the drain seen", limit=GATE
            )
            state = cluster.scheduler_state
            await wait_until(lambda: "worker-3" in state.workers, "the replacement", limit=GATE)
            assert state.workers["worker-2"].processing  # still at its task
            assert "block-2" in core.blocks
            gate.touch()
            assert await cluster.gather(futs) == [0, 1]

            end = await block_end(cluster, "block-2", limit=GATE)
            assert (end["state"], end["cause"], end["charged"]) == ("completed", "drained", False)
            auto = (await cluster.status())["autoscaler"]
            assert auto["budget_spent"] == 0
            await cluster.wait_for_workers(2, timeout=60)  # replaced: the target is 2


async def test_an_idle_worker_drained_between_two_ticks_ends_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler drains an idle worker process: it is retired and exits at once,
    and its block ends before any count of the autoscaler could show the drain (its
    ticks are off here, so none does). The autoscaler reads the drain in the worker's
    story: the end is ``drained``, free. Before, it was ``unknown`` and spent the
    replacement budget: with a walltime, every idle worker reaching it did, and a
    pool whose blocks all started together gave up."""
    monkeypatch.setattr(Autoscaler, "_ticks", no_ticks)
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            await cluster._plane.refs["scheduler"].ask(DrainRequest("worker-2"))

            end = await block_end(cluster, "block-2", limit=GATE)
            assert (end["state"], end["cause"], end["charged"]) == ("completed", "drained", False)
            assert (await cluster.status())["autoscaler"]["budget_spent"] == 0


async def test_a_worker_killed_while_it_drains_is_lost_as_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator drains a busy worker process, and it is killed (SIGKILL) before its
    task finished, so before the scheduler retired it: it did not finish draining.
    Its block's end is ``crash`` (free: the block was replaced when the drain was
    seen), the scheduler records the worker ``left:crash`` and the task lost with it
    as a crash, which runs again elsewhere. Before, the end said ``drained``: the
    loss looked planned (its tasks no suspects, its life censored, not a death)."""
    made = autoscalers_made(monkeypatch)
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            (core,) = [a.state for a in made]
            state = cluster.scheduler_state
            provider = cluster._plane.provider
            futs = await one_running_on_each(cluster, 2, marks, gate)
            await cluster._plane.refs["scheduler"].ask(DrainRequest("worker-2"))
            await wait_until(lambda: core.blocks["block-2"].retiring, "the drain seen", limit=GATE)
            draining = state.workers["worker-2"]
            assert draining.processing and not draining.retired  # at its task still
            os.kill(provider.pids(provider.blocks["block-2"])["worker-2"], signal.SIGKILL)

            end = await block_end(cluster, "block-2", limit=GATE)
            assert (end["state"], end["cause"], end["charged"]) == ("failed", "crash", False)
            await wait_until(lambda: "worker-2" not in state.workers, "worker-2 gone", limit=GATE)
            story = [e[:3] for e in state.story("worker-2")]
            assert story[-1] == ("worker-2", "joined", "left:crash"), story
            gate.touch()
            assert await cluster.gather(futs) == [0, 1]
            lost = [
                (t.worker, t.cause)
                for f in futs
                for t in state.tasks[f.key].tries
                if t.outcome == "worker-lost"
            ]
            assert lost == [("worker-2", "crash")]
            assert (await cluster.status())["autoscaler"]["budget_spent"] == 0


async def test_a_killed_worker_process_is_lost_at_once_not_after_the_grace() -> None:
    assert GRACE >= 10.0
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            state = cluster.scheduler_state
            provider = cluster._plane.provider
            victim = provider.blocks["block-1"]
            os.kill(provider.pids(victim)["worker-1"], signal.SIGKILL)
            killed = time.monotonic()
            # The provider sees the exit, the autoscaler tells the scheduler: well
            # before the gateway would give up waiting for the worker to reconnect.
            await wait_until(
                lambda: "worker-1" not in state.workers, "worker-1 lost", limit=GRACE / 3
            )
            took = time.monotonic() - killed
            assert victim.state is BlockState.FAILED and "SIGKILL" in victim.detail
            story = [e[:3] for e in state.story("worker-1")]
            assert story[-1] == ("worker-1", "joined", "left:crash"), story
            # It is replaced by a new block, whose worker joins under its own id.
            await wait_until(lambda: "worker-3" in state.workers, "worker-3 joined", limit=60)
            assert await cluster.submit(sum, [1, 2, 3]) == 6
    print(f"worker lost {took * 1000:.0f} ms after the SIGKILL (grace: {GRACE:g} s)")


async def test_workers_named_by_their_block_fetch_inputs_from_each_other(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            dsk: dict[Any, Any] = {("part", i): (both_marked, i, str(marks)) for i in range(6)}
            dsk["total"] = (sum, [("part", i) for i in range(6)])
            (total,) = await cluster.submit_graph(dsk, ["total"])
            assert await total == sum(range(6))
            # Parts ran on both workers, so the sum fetched some from its peer, found
            # through the manager (the peer's id is not its address), at the first try.
            assert {p.name for p in marks.iterdir()} == {"worker-1", "worker-2"}
            tries = outcomes(cluster.scheduler_state, list(dsk))
            assert all(per_key == ["ok"] for per_key in tries.values()), tries


def worker_process(wid: str) -> int:
    """The pid of worker process ``wid`` (started by this test's provider): the topmost
    process under this one whose environment names it (its task processes have it
    too)."""
    import psutil

    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.environ().get("CORRAL_WORKER_ID") == wid:
                parent = p.parent()
                if parent is None or parent.environ().get("CORRAL_WORKER_ID") != wid:
                    found.append(p.pid)
        except psutil.Error:
            continue
    assert len(found) == 1, found
    return found[0]


async def test_a_killed_worker_s_block_is_replaced_whole(tmp_path: Path) -> None:
    """A local pool of one block of two worker processes; a task runs on each; one
    worker process is killed (SIGKILL: a bad task, the OOM killer). The block ends, its
    block-mate stopped too, and the autoscaler replaces it whole: the pool gets both
    workers back and every task finishes. (A version that let the block-mate run on
    left the pool short of a worker for good: the block counted at full size and was
    never replaced, a review found.)"""
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    pools = {"local": {"workers_per_node": 2, "min_blocks": 1, "max_blocks": 1}}
    with anyio.fail_after(LIMIT):
        async with Cluster(pools=pools, processes=True) as cluster:
            await cluster.wait_for_workers(2, timeout=60)
            state = cluster.scheduler_state
            futs = cluster.map(gated, range(2), marks=str(marks), gate=str(gate))
            await wait_until(
                lambda: {p.name for p in marks.iterdir()} == {"local-1.0", "local-1.1"},
                "a task running on each worker",
                limit=GATE,
            )
            os.kill(worker_process("local-1.0"), signal.SIGKILL)
            await wait_until(
                lambda: {"local-2.0", "local-2.1"} <= set(state.workers),
                "the block replaced whole",
                limit=GRACE + GATE,
            )
            assert not {"local-1.0", "local-1.1"} & set(state.workers)
            gate.touch()
            assert await cluster.gather(futs) == [0, 1]
            status = await cluster.status()
            assert status["autoscaler"]["blocks"] == {"local/block-2": "running"}
