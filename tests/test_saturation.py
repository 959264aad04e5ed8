"""Which tasks a worker gets beyond its cores (``SchedulerConfig.saturation``).

The slots past one per core hide the round trip for short tasks. A task expected to
run ``long_task`` (1 s) or longer, or of a category with no finished try yet, goes only
to a worker with a core free of tasks: sent to a busy worker it would wait in that
worker's queue, where a worker that joins meanwhile could not take it (the operator
audit: two 30 s builds of a new category both went to the first 1-core worker of a
pool scaling out from 0 to 2, the second worker was drained idle, and the queue-time
alert resolved while a build waited). It stays queued, and counted as waiting, until a
core frees or a worker joins.

Pure-core tests (events in, exact commands out), and one embedded cluster.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import Execute
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import LongTaskError
from tests.helpers import (
    Factory,
    assigned,
    by_order,
    finish,
    held_at_gate,
    join,
    make_state,
    of,
    states,
    submit,
    wait_until,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


def _learn(s: SchedulerState, category: str, duration: float) -> None:
    """One task of ``category`` runs ``duration`` seconds on a worker of another pool:
    the category's mean duration is known, and pool ``build`` is left alone."""
    join(s, f"teacher-{category}", pool=f"teach-{category}")
    submit(s, {f"{category}-99": []}, [f"{category}-99"], pool=f"teach-{category}")
    finish(s, f"teacher-{category}", f"{category}-99", duration=duration)


def test_a_task_of_a_new_category_waits_for_a_core_and_goes_to_the_worker_that_joins(
    make_state: Factory,
) -> None:
    s = make_state()  # the defaults: saturation 2, so a 1-core worker has 2 slots
    table = {"build-0": [], "build-1": []}
    submit(s, table, list(table), pool="build")
    first, second = by_order(s, table)

    cmds = join(s, "w1", cores=1, pool="build")
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w1" and [t.key for t in ex.tasks] == [first]
    assert states(s) == {first: "processing", second: "queued"}
    # Still waiting in the scheduler's queue: the pool's queue depth and oldest wait
    # (what the queue-time alert and the demand strategy read) count it.
    m = s.pool_metrics(1e6)["build"]
    assert (m["queue_depth"], m["running"]) == (1, 1) and m["oldest_wait"] > 0.0

    cmds = join(s, "w2", cores=1, pool="build")
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w2" and [t.key for t in ex.tasks] == [second]
    m = s.pool_metrics(1e6)["build"]
    assert (m["queue_depth"], m["running"], m["oldest_wait"]) == (0, 2, 0.0)


def test_the_next_task_of_a_new_category_goes_once_a_core_frees(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1", cores=2, pool="build")  # 4 slots, 2 cores
    table = {f"build-{i}": [] for i in range(4)}
    cmds = submit(s, table, list(table), pool="build")
    order = by_order(s, table)
    assert assigned(cmds) == {"w1": order[:2]}  # a core each, not the 4 slots
    # It finished in 2 s: the category is known long now; a core frees, one more goes.
    cmds = finish(s, "w1", order[0], duration=2.0)
    assert assigned(cmds) == {"w1": [order[2]]}


def test_known_short_tasks_still_fill_the_slots_beyond_the_cores(make_state: Factory) -> None:
    s = make_state(backlog=0.0)  # the slots alone, no backlog beyond them
    _learn(s, "lint", 0.01)
    join(s, "w1", cores=1, pool="build")
    table = {f"lint-{i}": [] for i in range(3)}
    cmds = submit(s, table, list(table), pool="build")
    assert assigned(cmds) == {"w1": by_order(s, table)[:2]}  # 2 slots on 1 core


def test_known_long_tasks_get_a_core_each_from_the_threshold_on(make_state: Factory) -> None:
    s = make_state(backlog=0.0)
    _learn(s, "build", 1.0)  # at the threshold (long_task, 1 s): long
    join(s, "w1", cores=1, pool="build")
    builds = {f"build-{i}": [] for i in range(2)}
    cmds = submit(s, builds, list(builds), pool="build")
    first, second = by_order(s, builds)
    assert assigned(cmds) == {"w1": [first]}
    assert assigned(join(s, "w2", cores=1, pool="build")) == {"w2": [second]}

    s = make_state(backlog=0.0)
    _learn(s, "check", 0.9)  # under it: short, two on the 1-core worker
    join(s, "w1", cores=1, pool="build")
    checks = {f"check-{i}": [] for i in range(2)}
    cmds = submit(s, checks, list(checks), pool="build")
    assert assigned(cmds) == {"w1": by_order(s, checks)}


def test_short_tasks_behind_a_waiting_long_one_do_not_take_its_core(make_state: Factory) -> None:
    """A long task at the head of the queue keeps the tasks behind it out of the spare
    slot: short ones pre-sent there would start as each core frees, and it never would."""
    s = make_state(backlog=0.0)
    _learn(s, "build", 30.0)
    _learn(s, "lint", 0.01)
    join(s, "w1", cores=1, pool="build")
    cmds = submit(s, {"build-0": []}, ["build-0"], pool="build", priority=2)
    assert assigned(cmds) == {"w1": ["build-0"]}
    cmds = submit(s, {"build-1": []}, ["build-1"], pool="build", priority=1)
    assert assigned(cmds) == {}
    cmds = submit(s, {"lint-0": []}, ["lint-0"], pool="build")
    assert assigned(cmds) == {}  # behind build-1: the spare slot stays empty
    cmds = finish(s, "w1", "build-0", duration=30.0)
    # build-1 takes the core; the short lint task then takes the spare slot.
    assert assigned(cmds) == {"w1": ["build-1", "lint-0"]}


def test_unknown_long_false_keeps_a_new_category_short(make_state: Factory) -> None:
    s = make_state(unknown_long=False)
    join(s, "w1", cores=1, pool="build")
    table = {"build-0": [], "build-1": []}
    cmds = submit(s, table, list(table), pool="build")
    assert assigned(cmds) == {"w1": by_order(s, table)}


@pytest.mark.anyio
async def test_a_worker_that_joins_runs_the_second_task_of_a_new_category(
    tmp_path: Path,
) -> None:
    """Embedded: two tasks of a new category on a 1-thread worker; a second worker
    joins while the first task runs, held at its gate, and runs the second (before,
    both were sent to the first worker: the second waited there behind the first)."""
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(2)]
    try:
        with anyio.fail_after(60):
            async with Cluster(workers=1, threads_per_worker=1) as c:
                await c.wait_for_workers(1, timeout=30)
                state = c.scheduler_state
                futs = [
                    c.submit(held_at_gate, str(gate), str(started[i]), key=f"build-{i}")
                    for i in range(2)
                ]
                await wait_until(
                    lambda: (
                        sorted(ts.state for ts in state.tasks.values()) == ["processing", "queued"]
                    ),
                    "one task sent, the other queued",
                    limit=20,
                )
                assert await c.scale(2) == {"default": 2}
                await wait_until(
                    lambda: all(p.exists() for p in started), "both tasks to run at once"
                )
                workers = {state.tasks[f"build-{i}"].worker for i in range(2)}
                assert len(workers) == 2
                gate.touch()
                assert await c.gather(futs) == ["opened", "opened"]
    finally:
        gate.touch()


@pytest.mark.parametrize(
    "options",
    [
        {"long_task": -1.0},
        {"long_task": float("nan")},
        {"long_task": "1"},
        {"long_task": True},
        {"unknown_long": 0},
        {"unknown_long": "no"},
    ],
)
def test_bad_long_task_settings_are_refused_with_what_to_do(options: dict[str, Any]) -> None:
    """``SchedulerConfig`` and ``Cluster(...)`` (when it is made) alike."""
    ((option, value),) = options.items()
    with pytest.raises(LongTaskError, match=f"^{option} must be") as info:
        SchedulerConfig(**options)
    assert info.value.fields == {"option": option, "value": value}
    assert "docs/configuration.md#schedulerconfig" in str(info.value)
    with pytest.raises(LongTaskError, match=f"^{option} must be"):
        Cluster(workers=1, **options)


def test_long_task_zero_and_inf_are_taken() -> None:
    """0: every task counts as long; inf: none does by its duration."""
    assert SchedulerConfig(long_task=0).long_task == 0
    assert SchedulerConfig(long_task=math.inf).long_task == math.inf


def _two_gated(c: Any, gate: Path, started: list[Path]) -> list[Any]:
    return [c.submit(held_at_gate, str(gate), str(started[i]), key=f"build-{i}") for i in range(2)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "learn", "sent"),
    [
        ({}, False, ["processing", "queued"]),  # a new category counts as long
        ({"unknown_long": False}, False, ["processing", "processing"]),
        ({}, True, ["processing", "processing"]),  # known short (ms) tasks fill the slots
        ({"long_task": 0.0}, True, ["processing", "queued"]),  # every task counts as long
    ],
)
async def test_a_clusters_long_task_settings_reach_the_scheduler(
    tmp_path: Path, options: dict[str, Any], learn: bool, sent: list[str]
) -> None:
    """Embedded, one 1-thread worker (2 slots at saturation 2): two tasks of one
    category, held at a gate, are both sent to it, or one is and the other waits in
    the scheduler for the core. ``learn``: one task of the category finished first."""
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(2)]
    try:
        with anyio.fail_after(60):
            async with Cluster(workers=1, threads_per_worker=1, **options) as c:
                await c.wait_for_workers(1, timeout=30)
                if learn:
                    assert await c.submit(str, 1, key="build-99") == "1"
                state = c.scheduler_state
                futs = _two_gated(c, gate, started)
                await wait_until(started[0].exists, "the first task to run", limit=30)
                got = sorted(state.tasks[f"build-{i}"].state for i in range(2))
                assert got == sent
                gate.touch()
                assert await c.gather(futs) == ["opened", "opened"]
    finally:
        gate.touch()


@pytest.mark.anyio
@pytest.mark.parametrize(("unknown_long", "processing"), [(True, 1), (False, 2)])
async def test_a_managers_unknown_long_reaches_its_scheduler(
    tmp_path: Path, unknown_long: bool, processing: int
) -> None:
    """``run_manager(unknown_long=...)`` (``--no-unknown-long``), one 1-core worker, a
    client: two tasks of a new category are both sent to the worker, or only one."""
    from runtime.node import Tokens, run_manager, run_worker

    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(2)]
    where: list[str] = []
    up = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        where.append(address)
        up.set()

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: run_manager(
                        "inproc://", ready=ready, listen_options={"codec": True},
                        unknown_long=unknown_long,
                    )
                )  # fmt: skip
                await up.wait()
                tg.start_soon(lambda: run_worker(where[0], cores=1, listen_options={"codec": True}))
                async with Cluster(where[0]) as c:
                    await c.wait_for_workers(1, timeout=30)
                    futs = _two_gated(c, gate, started)
                    await wait_until(started[0].exists, "the first task to run", limit=30)
                    status = await c.status()
                    assert list(status["processing"].values()) == [processing]
                    gate.touch()
                    assert await c.gather(futs) == ["opened", "opened"]
                tg.cancel_scope.cancel()
    finally:
        gate.touch()


def test_the_manager_command_line_passes_its_long_task_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--long-task`` and ``--no-unknown-long`` reach ``run_manager`` (whose scheduler
    the test above shows them reaching); without them, None: the scheduler's defaults,
    or its ``[scheduler]`` table in ``--config``, which the flags win over."""
    import runtime.node
    from runtime.__main__ import main

    seen: list[dict[str, Any]] = []

    async def fake(listen: str, **kwargs: Any) -> None:
        seen.append(kwargs)

    monkeypatch.setattr(runtime.node, "run_manager", fake)
    base = ["manager", "--listen", "127.0.0.1:0", "--no-monitoring"]
    assert main([*base, "--long-task", "30", "--no-unknown-long"]) == 0
    assert main(base) == 0
    assert [(k["long_task"], k["unknown_long"]) for k in seen] == [(30.0, False), (None, None)]
