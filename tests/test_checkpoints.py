"""Checkpoints (docs/files.md#checkpoints): a running task saves its progress with
``checkpoint(obj)``; a try that starts after its worker was lost gets it back with
``restore()``.

First the scheduler's pure core: what it keeps, what it hands to the next try, when it
drops it. Then the task-side API in a thread executor and its typed errors. Then real
worker processes: a task of 30 steps, checkpointing after each, whose worker is killed
with SIGKILL twice, finishes with the right result having redone at most one step per
kill.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_state import Execute, SchedulerState, TaskCheckpointed, Tick, WorkerLeft
from runtime import CheckpointError, checkpoint, restore
from runtime.task import MAX_CHECKPOINT, TaskContext, running
from tests.helpers import (
    Cli,
    Factory,
    event,
    finish,
    join,
    make_state,
    of,
    run,
    submit,
    wait_until,
)

__all__ = ["make_state"]

LIMIT = 100  # seconds for the test with processes


def saved(s: SchedulerState, worker: str, key: str, seq: int, obj: Any) -> list[Any]:
    data = pickle.dumps(obj)
    return run(s, event(TaskCheckpointed, worker=worker, key=key, seq=seq, data=data))


def sent_to(cmds: list[Any], key: str) -> Any:
    (task,) = [t for c in of(cmds, Execute) for t in c.tasks if t.key == key]
    return task


# ----------------------------------------------------------------------------- the core


def test_the_latest_checkpoint_goes_to_the_try_after_a_loss_and_is_dropped_at_the_end(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    first = sent_to(submit(s, {"long-0": []}, ["long-0"]), "long-0")
    assert first.checkpoint is None  # a first try starts from nothing
    saved(s, "w1", "long-0", 1, {"step": 1})
    saved(s, "w1", "long-0", 2, {"step": 2})
    assert s.checkpoints["long-0"][0] == 2 and s.checkpoint_counts["saved"] == 2
    join(s, "w2")
    retry = sent_to(run(s, event(WorkerLeft, worker="w1", cause="crash")), "long-0")
    assert retry.checkpoint == (2, pickle.dumps({"step": 2}))
    assert s.checkpoint_counts["resumed"] == 1
    story = [e[1:3] for e in s.story("long-0")]
    assert ("checkpoint", "checkpoint:2:" + str(len(pickle.dumps({"step": 2})))) in story
    assert story[-1][0] == "resume"
    finish(s, "w2", "long-0")
    assert "long-0" not in s.checkpoints and s.checkpoint_counts["pruned"] == 1


def test_an_older_or_a_late_checkpoint_changes_nothing(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    saved(s, "w1", "long-0", 3, "three")
    saved(s, "w1", "long-0", 2, "two")  # older: a race between tries
    assert s.checkpoints["long-0"][:2] == (3, pickle.dumps("three"))
    finish(s, "w1", "long-0")
    saved(s, "w1", "long-0", 4, "after the end")  # the task is done: nothing to resume
    saved(s, "w1", "other", 1, "unknown key")
    assert s.checkpoints == {} and s.checkpoint_counts["saved"] == 1


def test_only_the_worker_running_the_task_can_save_its_checkpoint(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    submit(s, {"long-0": []}, ["long-0"])
    runner = s.tasks["long-0"].worker
    other = "w2" if runner == "w1" else "w1"
    saved(s, other, "long-0", 1, "not mine")
    assert s.checkpoints == {}
    saved(s, runner or "", "long-0", 1, "mine")
    assert s.checkpoints["long-0"][2] == runner


def test_a_speculative_copy_starts_from_the_latest_checkpoint(make_state: Factory) -> None:
    from tests.test_speculation import T0, at, straggler

    s = straggler(make_state)  # t-5 runs long on w1, w2 idles
    run(s, TaskCheckpointed("cp-1", T0 + 1, worker="w1", key="t-5", seq=4, data=b"four"))
    (copy,) = [t for c in of(at(s, Tick, T0 + 2.1), Execute) if c.worker == "w2" for t in c.tasks]
    assert copy.key == "t-5" and copy.checkpoint == (4, b"four")
    run(s, TaskCheckpointed("cp-2", T0 + 3, worker="w2", key="t-5", seq=5, data=b"five"))
    assert s.checkpoints["t-5"] == (5, b"five", "w2")  # the copy's own, numbered on


def test_a_failed_task_drops_its_checkpoint(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    saved(s, "w1", "long-0", 1, "one")
    finish(s, "w1", "long-0", "error")
    assert s.tasks["long-0"].state == "erred" and s.checkpoints == {}


def test_past_the_scheduler_s_budget_a_checkpoint_is_refused_and_the_last_stays(
    make_state: Factory,
) -> None:
    one = len(pickle.dumps(b"x" * 100))
    s = make_state(checkpoint_bytes=2 * one)
    join(s, "w1", cores=3)
    submit(s, {"a-0": [], "b-0": [], "c-0": []}, ["a-0", "b-0", "c-0"])
    saved(s, "w1", "a-0", 1, b"x" * 100)
    saved(s, "w1", "b-0", 1, b"x" * 100)
    saved(s, "w1", "a-0", 2, b"y" * 100)  # replaces its own: the total stays
    saved(s, "w1", "c-0", 1, b"x" * 100)  # a third: past the budget
    assert set(s.checkpoints) == {"a-0", "b-0"} and s.checkpoint_held == 2 * one
    assert s.checkpoints["a-0"][0] == 2 and s.checkpoint_counts["refused"] == 1
    assert ("c-0", "checkpoint-refused") in [e[:2] for e in s.story_log]
    finish(s, "w1", "a-0")
    saved(s, "w1", "c-0", 2, b"x" * 100)  # room again
    assert set(s.checkpoints) == {"b-0", "c-0"} and s.checkpoint_held == 2 * one


# ----------------------------------------------------------------------------- the task API


def test_checkpoint_and_restore_inside_a_task_context() -> None:
    got: list[tuple[Any, int, bytes]] = []
    ctx = TaskContext("k", 0, None, lambda key, seq, data: got.append((key, seq, data)))
    with running(ctx):
        assert restore() is None
        assert checkpoint([1, 2]) == 1
        assert checkpoint([1, 2, 3]) == 2
        assert restore() == [1, 2, 3]
    assert [(k, n, pickle.loads(d)) for k, n, d in got] == [("k", 1, [1, 2]), ("k", 2, [1, 2, 3])]
    # A later try starts from the latest and numbers on from it.
    with running(TaskContext("k", 2, got[-1][2], lambda *a: got.append(a))):
        assert restore() == [1, 2, 3] and checkpoint("next") == 3


def test_bad_calls_get_a_typed_error_that_says_what_to_do() -> None:
    with pytest.raises(CheckpointError, match="outside a running task"):
        checkpoint(1)
    with pytest.raises(CheckpointError, match="outside a running task"):
        restore()
    ctx = TaskContext("k", 0, None, lambda *a: None)
    with running(ctx), pytest.raises(CheckpointError, match="more than the") as info:
        checkpoint(b"x" * (MAX_CHECKPOINT + 1))
    assert "docs/files.md#checkpoints" in str(info.value)
    ctx = TaskContext("k", 0, None, None, "runs in a task process; use threads.")
    with running(ctx), pytest.raises(CheckpointError, match="use threads"):
        checkpoint(1)


def test_the_console_status_counts_the_checkpoints() -> None:
    import io

    from rich.console import Console

    from runtime.console import render_status
    from runtime.messages import StatusReply

    def text(st: dict[str, Any]) -> str:
        buf = io.StringIO()
        Console(file=buf, width=200, color_system=None).print(render_status(st))
        return buf.getvalue()

    assert "checkpoints:" not in text(StatusReply().to_dict())
    counts = {"held": 1, "held_bytes": 120, "saved": 31, "resumed": 2, "pruned": 0, "refused": 0}
    st = StatusReply(checkpoints=counts).to_dict()
    assert "checkpoints: 1 held (120 B), 31 saved, 2 resumed, 0 pruned, 0 refused" in text(st)


# ----------------------------------------------------------------------------- processes

STEPS = 30


def stepper(log: str, steps: int, pause: float) -> int:
    """``steps`` steps, each noted in ``log`` (with the process running it) and then
    checkpointed; started again, it goes on from the step after its checkpoint."""
    import time

    from runtime import checkpoint, restore

    done = restore() or 0
    for i in range(done, steps):
        time.sleep(pause)
        with open(log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        checkpoint(i + 1)
    return sum(range(steps))


def _lines(log: Path) -> list[tuple[int, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        step, pid = line.split()
        out.append((int(step), int(pid)))
    return out


def _reached(log: Path, steps: int) -> Callable[[], bool]:
    return lambda: len(_lines(log)) >= steps


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT + 30)
async def test_a_task_killed_twice_redoes_at_most_one_step_per_kill(tmp_path: Path) -> None:
    from runtime import Cluster

    log = tmp_path / "steps"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        procs = {name: cli.worker(address, "--name", name) for name in ("w-a", "w-b", "w-c")}
        by_pid = {p.pid: name for name, p in procs.items()}
        async with Cluster(address) as c:
            await c.wait_for_workers(3)
            (x,) = await c.submit_graph({"steps-0": (stepper, str(log), STEPS, 0.1)}, ["steps-0"])
            killed: list[str] = []
            for at in (5, 15):  # kill whoever runs it once it has done `at` steps
                await wait_until(_reached(log, at), f"step {at}", limit=40)
                pid = _lines(log)[-1][1]
                name = by_pid[pid]  # thread mode: the task runs in its worker's process
                assert name not in killed
                procs[name].send_signal(signal.SIGKILL)
                procs[name].wait(10)
                killed.append(name)
            assert await x == sum(range(STEPS))
            st = (await c.status())["checkpoints"]
    lines = _lines(log)
    steps = [s for s, _ in lines]
    assert sorted(set(steps)) == list(range(STEPS))
    redone = len(steps) - STEPS
    assert 0 <= redone <= 2, lines  # at most one step (one checkpoint interval) per kill
    assert all(steps.count(i) <= 2 for i in range(STEPS))
    pids = [p for _, p in lines]
    assert len(set(pids)) == 3  # three tries, each on another worker process
    assert {by_pid[p] for p in pids[: steps.index(STEPS - 1)]} >= set(killed)
    assert st["resumed"] == 2 and st["held"] == 0 and st["pruned"] == 1
    assert st["saved"] >= STEPS and st["refused"] == 0 and st["held_bytes"] == 0


def checkpoints_once() -> int:
    from runtime import checkpoint

    return checkpoint("progress")


@pytest.mark.anyio
async def test_in_process_execution_checkpoint_says_to_use_threads() -> None:
    from runtime import Cluster

    options = {"execution": "process"}
    with anyio.fail_after(60):
        async with Cluster(processes=1, threads_per_worker=1, memory_options=options) as c:
            await c.wait_for_workers(1, timeout=60)
            with pytest.raises(CheckpointError, match="thread mode") as info:
                await c.submit(checkpoints_once)
    assert "docs/files.md#checkpoints" in str(info.value)
