"""Moving queued work to another pool or priority (``TasksMoved``): the pure core, with
exact commands and its invariants (``validate``) after every event; the scheduler's
refusals; and an embedded cluster whose queued task, moved from a pool with no worker to
one with a worker, runs, its dependent with it (``Cluster.move``)."""

from __future__ import annotations

import pytest

from actors.scheduler_events import MoveAnswer, TasksFinished, TasksMoved
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from tests.helpers import MB, Factory, assigned, event, join, make_state, result, run, submit

__all__ = ["make_state"]


def move(s: SchedulerState, keys: tuple[str, ...], **kw: object) -> tuple[MoveAnswer, list]:
    """Handle a ``TasksMoved``; its answer (first of the commands) and every command."""
    ev = event(TasksMoved, keys=keys, **kw)
    cmds = run(s, ev)
    assert cmds[0] == MoveAnswer(ev.stimulus_id, *_answer(cmds))
    return cmds[0], cmds


def _answer(cmds: list) -> tuple[tuple, tuple]:
    (answer,) = [c for c in cmds if type(c) is MoveAnswer]
    return answer.moved, answer.left


def finish(s: SchedulerState, worker: str, *keys: str) -> list:
    return run(s, event(TasksFinished, worker=worker, results=tuple(result(k) for k in keys)))


def busy_gpu(make_state: Factory) -> SchedulerState:
    """A ``gpu`` worker busy with ``train``; a ``cpu`` worker with a core free."""
    s = make_state(saturation=1.0)
    join(s, "g1", pool="gpu")
    join(s, "c1", pool="cpu")
    assert assigned(submit(s, {"train": []}, ["train"], pool="gpu")) == {"g1": ["train"]}
    return s


def test_queued_tasks_move_to_another_pool_and_their_dependent_follows(
    make_state: Factory,
) -> None:
    s = busy_gpu(make_state)
    table = {"e1": [], "e2": [], "report": ["e1", "e2"]}
    assert assigned(submit(s, table, ["report"], pool="gpu")) == {}
    assert s.queued_by_pool() == {"gpu": 2}
    answer, cmds = move(s, ("e1", "e2", "report"), pool="cpu")
    assert answer.moved == ("e1", "e2", "report") and answer.left == ()
    ((first,),) = assigned(cmds).values()  # c1 has one core: the other waits for it
    second = "e2" if first == "e1" else "e1"
    assert assigned(cmds) == {"c1": [first]} and s.queued_by_pool() == {"cpu": 1}
    assert s.pool_tasks == {"gpu": 1, "cpu": 3}
    assert [t.spec.pool for t in (s.tasks[second], s.tasks["report"])] == ["cpu", "cpu"]
    assert ("pool", "gpu->cpu") in [(t[1], t[2]) for t in s.story(second)]
    # The gpu worker frees: nothing moved is sent there (no entry left in gpu's heap).
    assert assigned(finish(s, "g1", "train")) == {}
    assert assigned(finish(s, "c1", first)) == {"c1": [second]}
    assert assigned(finish(s, "c1", second)) == {"c1": ["report"]}
    finish(s, "c1", "report")
    assert s.tasks["report"].state == "memory"


def test_a_higher_priority_puts_a_queued_task_first(make_state: Factory) -> None:
    s = busy_gpu(make_state)
    submit(s, {"a": [], "b": [], "c": []}, ["a", "b", "c"], pool="gpu")
    answer, cmds = move(s, ("c",), priority=10)
    assert answer.moved == ("c",) and assigned(cmds) == {}
    assert s.tasks["c"].spec.priority == 10 and s.tasks["c"].spec.pool == "gpu"
    assert ("priority", "0->10") in [(t[1], t[2]) for t in s.story("c")]
    assert assigned(finish(s, "g1", "train")) == {"g1": ["c"]}


def test_a_lower_priority_puts_a_queued_task_last(make_state: Factory) -> None:
    s = busy_gpu(make_state)
    submit(s, {"a": [], "b": []}, ["a", "b"], pool="gpu")
    first = min(("a", "b"), key=lambda k: s.tasks[k].spec.order)  # the one due first
    other = "b" if first == "a" else "a"
    answer, _ = move(s, (first,), priority=-1)
    assert answer.moved == (first,)
    # its entry of priority 0 is gone from the heap: the other goes first
    assert assigned(finish(s, "g1", "train")) == {"g1": [other]}
    assert assigned(finish(s, "g1", other)) == {"g1": [first]}


def test_running_finished_and_unknown_keys_are_left_and_say_why(make_state: Factory) -> None:
    s = busy_gpu(make_state)
    submit(s, {"done": []}, ["done"], pool="cpu")
    finish(s, "c1", "done")
    submit(s, {"q": []}, ["q"], pool="gpu")
    answer, cmds = move(s, ("train", "done", "nope", "q", "q"), pool="gpu", priority=0)
    assert answer.moved == ()
    assert dict(answer.left) == {
        "train": "running on g1: a running task is not moved",
        "done": "memory: only a waiting or queued task is moved",
        "nope": "not known to the scheduler (finished and let go, or never submitted)",
        "q": "already in pool gpu with priority 0",
    }
    assert assigned(cmds) == {} and s.tasks["train"].worker == "g1"


def test_an_unknown_pool_moves_nothing_and_names_the_known_ones(make_state: Factory) -> None:
    s = busy_gpu(make_state)
    submit(s, {"q": []}, ["q"], pool="gpu")
    answer, _ = move(s, ("q",), pool="cpus")
    why = "no pool 'cpus': none is configured, has a worker or a task by that name"
    assert answer.moved == ()
    assert answer.left == (("q", f"{why} (pools: cpu, gpu; did you mean 'cpu'?)"),)
    answer, _ = move(s, ("q",), pool="*")
    assert answer.left[0][1].startswith("pool '*': ")
    assert s.tasks["q"].spec.pool == "gpu" and s.queued_by_pool() == {"gpu": 1}


def test_a_waiting_task_moved_keeps_its_inputs_and_runs_in_its_new_pool(
    make_state: Factory,
) -> None:
    s = busy_gpu(make_state)
    submit(s, {"x": [], "y": ["x"]}, ["y"], pool="cpu")  # x runs on c1, y waits for it
    answer, _ = move(s, ("y",), pool="gpu", priority=5)
    assert answer.moved == ("y",) and s.tasks["y"].state == "waiting"
    assert s.next_wave == {"cpu": {}, "gpu": {s.tasks["y"]: None}}
    assert assigned(finish(s, "c1", "x")) == {}  # y queued in gpu: g1 is busy
    assert s.queued_by_pool() == {"gpu": 1}
    assert assigned(finish(s, "g1", "train")) == {"g1": ["y"]}


def test_each_task_moved_is_a_record_of_the_monitoring_feed_as_it_moves(
    make_state: Factory,
) -> None:
    s = busy_gpu(make_state)
    submit(s, {"x": [], "y": ["x"], "z": []}, ["y", "z"], pool="gpu")  # x, z queued; y waits
    _, since, _ = s.feed_since(0, 0)  # a monitoring database reads the feed from here
    move(s, ("x", "y", "train"), pool="cpu", priority=4)  # (train runs: not moved)
    move(s, ("z",), priority=-1)
    entries, _, lost = s.feed_since(since, 100)
    moved = [r for _, records in entries for r in records if r[0] == "moved"]
    assert lost == 0 and moved == [
        ("moved", "x", "x", "gpu", "cpu", 0, 4),  # (key, category, pools, priorities)
        ("moved", "y", "y", "gpu", "cpu", 0, 4),
        ("moved", "z", "z", "gpu", "gpu", 0, -1),
    ]


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_cluster_moves_a_task_from_a_pool_with_no_worker_and_it_runs() -> None:
    async with Cluster(workers=1) as cluster:
        (worker,) = (await cluster.status())["workers"]
        pool = worker.pool
        stuck = cluster.submit(sum, [1, 2], pool="nowhere", pure=False)
        after = cluster.submit(lambda v: v * 10, stuck, pool=pool, pure=False)
        with pytest.raises(ValueError, match=rf"no pool 'elsewhere'.*pools: .*{pool}"):
            await cluster.move([stuck], pool="elsewhere")
        answer = await cluster.move([stuck, after], pool=pool)
        why = f"already in pool {pool} with priority 0"
        assert answer == {"moved": [str(stuck.key)], "left": {str(after.key): why}}
        assert await after == 30 and await stuck == 3
        left = await cluster.move(stuck, pool=pool)
        assert (
            left["moved"] == [] and "only a waiting or queued task" in left["left"][str(stuck.key)]
        )


def test_a_task_whose_inputs_fit_no_worker_of_the_pool_is_not_moved(make_state: Factory) -> None:
    s = busy_gpu(make_state)
    join(s, "small", memory=MB, pool="tiny")
    submit(s, {"x": []}, ["x"], pool="cpu")
    submit(s, {"y": ["x"]}, ["y"], pool="gpu")
    run(s, event(TasksFinished, worker="c1", results=(result("x", nbytes=64 * MB),)))
    assert s.tasks["y"].state == "queued"  # g1 is busy
    answer, _ = move(s, ("y",), pool="tiny")
    assert answer.moved == () and s.tasks["y"].spec.pool == "gpu"
    ((key, why),) = answer.left
    assert key == "y" and why.startswith("its inputs (64.0 MiB) fit no worker of pool tiny")
