"""Tests of the scheduler's pure core (actors/scheduler_state.py): where ready tasks go
and what a finished task sets off (slots, pools, memory, priority and graph order,
dependents, category statistics, backlog).

No event loop, no threads, no clock: every test feeds events to
``SchedulerState.handle`` and checks the exact commands it returns. The autouse fixture
``make_state`` (tests/helpers.py) builds the states and runs ``validate()`` (the
invariant check) on every one of them when the test ends; the ``run`` helper also
validates after each step. Graphs come from :func:`tests.helpers.graph`, a
``{key: [dependency keys]}`` table turned into specs by ``build_specs`` as the client does.
"""

from __future__ import annotations

import pytest

from actors.protocol import FileFact, TaskResult
from actors.scheduler_events import Execute, KeyDone, TasksFinished, TasksMoved
from actors.scheduler_records import TaskStateView
from tests.helpers import (
    GB,
    MB,
    Factory,
    assigned,
    by_order,
    event,
    facts,
    finish,
    finish_all,
    join,
    leave,
    make_state,
    of,
    on,
    run,
    states,
    submit,
    worker_of,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


# ----------------------------------------------------------------------------- ready / assign


def test_independent_tasks_fill_each_workers_slots_and_the_rest_stay_queued(
    make_state: Factory,
) -> None:
    s = make_state(unknown_long=False, saturation=2.0)
    join(s, "w1", cores=2)  # 4 slots
    join(s, "w2", cores=1)  # 2 slots
    keys = [f"x-{i}" for i in range(10)]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)

    got = assigned(cmds)
    assert sorted(got) == ["w1", "w2"]
    assert len(got["w1"]) == 4 and len(got["w2"]) == 2
    sent = got["w1"] + got["w2"]
    assert len(set(sent)) == 6
    # The six best by priority went out; the other four wait in the queue.
    assert set(sent) == set(by_order(s, keys)[:6])
    assert s.count("processing") == 6 and s.count("queued") == 4
    assert s.workers["w1"].slots == 4 and s.workers["w2"].slots == 2
    assert not s.free
    for c in of(cmds, Execute):
        for t in c.tasks:
            assert t.node is s.tasks[t.key].spec.node
            assert t.category == "x" and t.deps == ()
    # The registry hears about an output only once it exists: none does yet.
    assert facts(cmds) == {}


def test_a_finished_task_frees_its_slot_for_the_next_queued_task(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    keys = ["x-0", "x-1", "x-2"]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    first, second, third = by_order(s, keys)
    assert assigned(cmds) == {"w1": [first]}

    cmds = finish(s, "w1", first, nbytes=7)
    assert of(cmds, KeyDone) == [KeyDone(cmds[0].stimulus_id, first, "w1", 7)]
    assert assigned(cmds) == {"w1": [second]}
    assert s.tasks[first].state == "memory" and s.tasks[third].state == "queued"

    assert assigned(finish(s, "w1", second)) == {"w1": [third]}
    cmds = finish(s, "w1", third)
    assert assigned(cmds) == {}
    assert states(s) == dict.fromkeys(keys, "memory")


def test_no_work_without_workers_then_work_when_one_joins(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    cmds = submit(s, {"a": [], "b": ["a"]}, ["b"])
    assert of(cmds, Execute) == []
    assert states(s) == {"a": "queued", "b": "waiting"}
    assert s.tasks["b"].waiting_on == 1
    assert facts(cmds) == {}  # nothing created yet: nothing for the registry

    cmds = join(s, "w1", cores=1)
    assert len(of(cmds, Execute)) == 1
    (ex,) = of(cmds, Execute)
    assert ex.worker == "w1" and [t.key for t in ex.tasks] == ["a"]
    assert s.tasks["a"].worker == "w1" and s.tasks["a"].state == "processing"


def test_each_try_names_its_worker_in_the_story(make_state: Factory) -> None:
    """A user reading ``story KEY`` sees where each try ran (the audit: only
    ``queued -> processing``, the worker only in the monitoring database's tries)."""
    s = make_state(saturation=1.0)
    join(s, "w1", cores=1)
    cmds = submit(s, {"a": []}, ["a"])
    sid = cmds[0].stimulus_id
    assert [e[1:4] for e in s.story("a")] == [
        ("new", "queued", sid),
        ("queued", "processing", sid),
        ("processing", "runs-on:w1", sid),
    ]
    join(s, "w2", cores=1)
    leave(s, "w1")  # its try is lost: the retry runs on w2
    assert s.tasks["a"].worker == "w2"
    rows = [e[1:3] for e in s.story("a")]
    assert rows[-2:] == [("queued", "processing"), ("processing", "runs-on:w2")]
    assert [f for _, f in rows if f.startswith("runs-on:")] == ["runs-on:w1", "runs-on:w2"]


def test_pool_tasks_only_go_to_workers_of_that_pool(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "cpu", cores=4)
    join(s, "gpu1", cores=2, pool="gpu")
    gkeys = [f"g-{i}" for i in range(4)]
    cmds = submit(s, dict.fromkeys(gkeys, ()), gkeys, pool="gpu")
    got = assigned(cmds)
    assert list(got) == ["gpu1"] and len(got["gpu1"]) == 2
    assert s.count("queued") == 2  # the cpu worker is free but not in the pool
    assert "cpu" in s.free

    # Tasks without a pool run anywhere, here on the free cpu worker.
    assert assigned(submit(s, {"p": []}, ["p"])) == {"cpu": ["p"]}

    cmds = join(s, "gpu2", cores=2, pool="gpu")
    assert sorted(assigned(cmds)["gpu2"]) == sorted(set(gkeys) - set(got["gpu1"]))
    assert s.count("queued") == 0


def test_a_task_needing_more_memory_than_any_worker_waits_for_a_bigger_one(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", cores=2, memory=GB)
    cmds = submit(
        s,
        {"big": [], "fat": [], "x": []},
        ["big", "fat", "x"],
        attrs={"big": {"resources": {"memory": 8 * GB}}, "fat": {"resources": {"cores": 4}}},
    )
    assert assigned(cmds) == {"small": ["x"]}  # the others do not fit; x still runs
    assert s.tasks["big"].state == "queued" and s.tasks["fat"].state == "queued"
    assert "small" in s.free  # a free slot, yet nothing it can run

    assert assigned(join(s, "medium", cores=2, memory=4 * GB)) == {}
    cmds = join(s, "huge", cores=8, memory=16 * GB)
    assert {w: sorted(ks) for w, ks in assigned(cmds).items()} == {"huge": ["big", "fat"]}


def test_a_task_no_worker_has_the_resources_for_says_so_in_its_story_once(
    make_state: Factory,
) -> None:
    """Why it waits: the most cores and memory a worker of its pool has (told once, not
    on every look at the queue); nothing while a worker that has them is busy."""
    s = make_state(saturation=1.0)
    join(s, "small", cores=2, memory=GB)
    join(s, "other", cores=16, memory=64 * GB, pool="gpu")  # not its pool
    submit(
        s,
        {"big": [], "fat": [], "x": [], "y": []},
        ["big", "fat", "x", "y"],
        attrs={"big": {"resources": {"memory": 8 * GB, "cores": 4}, "pool": "default"},
               "fat": {"resources": {"cores": 2}, "pool": "default"}},
    )  # fmt: skip

    def why(key: str) -> list[str]:
        return [e[2] for e in s.story_log if e[0] == key and e[2].startswith("waiting")]

    for _ in range(4):  # x and y run anywhere, fat on "small" (2 cores, it has 2)
        for w in ("small", "other"):
            finish_all(s, w, on(s, w))
    assert s.tasks["fat"].state == "memory" and s.tasks["big"].state == "queued"
    assert why("fat") == []  # it only waited for "small" to be free
    assert why("big") == [
        f"waiting for a worker with 4 cores and {8 * GB:,} B of memory: every worker of "
        f"pool 'default' has less (at most 2 cores and {GB:,} B); it runs once one with "
        "enough joins"
    ]
    join(s, "medium", cores=2, memory=4 * GB)  # another look: still too small
    assert len(why("big")) == 1  # told once
    cmds = join(s, "huge", cores=8, memory=16 * GB)
    assert "big" in assigned(cmds)["huge"]


def test_ready_tasks_no_configured_pools_workers_could_run_are_counted_and_told(
    make_state: Factory,
) -> None:
    """Per configured pool, the ready tasks it may run that ask for more cores or memory
    than its configuration gives its workers (``unfit_by_pool``: no demand for its
    blocks, the autoscaler's ``DemandRequest``); the counters follow moves and starts
    (``validate`` recounts them). A task no configured pool could run says so in its
    story, with no worker joined yet."""
    s = make_state(pools=("cpu", "big"), pool_cores={"cpu": 1, "big": 8}, pool_memory={"cpu": GB})
    submit(
        s,
        {"wide": [], "huge": [], "fat": [], "small": []},
        ["wide", "huge", "fat", "small"],
        attrs={"wide": {"resources": {"cores": 4}}, "huge": {"resources": {"cores": 16}},
               "fat": {"resources": {"memory": 2 * GB}, "pool": "cpu"},
               "small": {"resources": {"cores": 1}}},
    )  # fmt: skip
    assert states(s) == dict.fromkeys(["wide", "huge", "fat", "small"], "queued")
    assert s.unfit_by_pool() == {"cpu": 3, "big": 1}  # wide, huge, fat; huge

    def why(key: str) -> list[str]:
        return [e[2] for e in s.story_log if e[0] == key and e[2].startswith("waiting")]

    assert why("wide") == why("small") == []  # a block of 'big' can run it
    assert why("huge") == [
        "waiting for a worker with enough: no configured pool it may run in has workers "
        "with enough ('cpu': 1 core; 'big': 8 cores), so no block is started or kept for "
        "it; give it a pool whose workers have enough (pool=), raise that pool's "
        "cores_per_worker or memory_per_worker, or start a worker with enough by hand"
    ]
    assert len(why("fat")) == 1 and f"('cpu': {GB:,} B of memory)" in why("fat")[0]
    run(s, event(TasksMoved, keys=("fat",), pool="big"))  # big's memory is not known
    assert s.unfit_by_pool() == {"cpu": 2, "big": 1}
    cmds = join(s, "hand", cores=16, memory=4 * GB, pool="big")  # a worker by hand
    assert sorted(assigned(cmds)["hand"]) == ["fat", "huge", "small", "wide"]
    assert s.unfit_by_pool() == {}


def test_a_ready_task_asking_for_more_disk_than_a_pools_workers_have_is_no_demand_for_it(
    make_state: Factory,
) -> None:
    """A pool whose workers' disk is an amount (``disk_per_worker``, ``pool_disk``):
    a task of no pool asking for more is unfit for it (no block started for it) as for
    cores and memory; one whose disk is not known (the file system's) has enough."""
    s = make_state(pools=("small", "big"), pool_cores={"small": 1, "big": 1},
                   pool_disk={"small": GB})  # fmt: skip
    submit(s, {"scratch": [], "tiny": []}, ["scratch", "tiny"],
           attrs={"scratch": {"resources": {"disk": 2 * GB}},
                  "tiny": {"resources": {"disk": GB // 2}}})  # fmt: skip
    assert s.unfit_by_pool() == {"small": 1}  # scratch; big's disk is not known
    s2 = make_state(pools=("small",), pool_cores={"small": 1}, pool_disk={"small": GB})
    submit(s2, {"scratch": []}, ["scratch"], attrs={"scratch": {"resources": {"disk": 2 * GB}}})
    assert s2.unfit_by_pool() == {"small": 1}
    (why,) = [e[2] for e in s2.story_log if e[0] == "scratch" and e[2].startswith("waiting")]
    assert f"('small': {GB:,} B of disk)" in why and "disk_per_worker" in why, why


def test_ready_tasks_run_by_user_priority_then_submission_then_graph_order(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    first = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(first, ()), first)  # generation 1, priority 0
    submit(s, {"y": []}, ["y"])  # generation 2, priority 0
    submit(s, {"z": []}, ["z"], priority=5)  # generation 3, but urgent
    submit(s, {"low": []}, ["low"], priority=-1)  # generation 4, below everything
    expected = ["z", *by_order(s, first), "y", "low"]

    join(s, "w1")
    seen = [s.tasks[k].key for k in on(s, "w1")]
    for _ in range(len(expected) - 1):
        (key,) = on(s, "w1")
        nxt = assigned(finish(s, "w1", key))["w1"]
        seen.extend(nxt)
    assert seen == expected


def test_a_workflow_submitted_a_task_at_a_time_runs_each_consumer_next_to_its_inputs(
    make_state: Factory,
) -> None:
    """One submission per task (the audit's script: every load, then every skim, then
    the merge): a task reading outputs of earlier submissions continues their work, so
    it ranks as its latest input's generation, not behind every producer submitted
    before it (docs/policies.md#priority). Here two loads are done when the skims come:
    their skims run before the next load, as one graph would run them, where the old
    FIFO between submissions ran load-3 first and left load-0's and load-1's outputs
    waiting (on a small disk, for the disk to fill with loads: the audit's stalls).
    skim-2 runs next to its load either way: it joins its input's worker as it becomes
    ready (the locality policy's stays_with_data)."""
    s = make_state(saturation=1.0)
    join(s, "w1")
    for i in range(4):
        submit(s, {f"load-{i}": []}, [f"load-{i}"])  # generations 1 to 4
    seen = list(on(s, "w1"))

    def run_next() -> None:
        (key,) = on(s, "w1")
        seen.extend(assigned(finish(s, "w1", key, nbytes=10)).get("w1", []))

    run_next()
    run_next()  # load-0 and load-1 done, load-2 runs, load-3 is queued
    for i in range(4):
        submit(s, {f"skim-{i}": [f"load-{i}"]}, [f"skim-{i}"])  # 5 to 8
    submit(s, {"merge": [f"skim-{i}" for i in range(4)]}, ["merge"])  # 9
    assert s.generation == 9
    # The generation the priority policy sees (TaskView.generation); order is 0 for all.
    assert {k: ts.generation for k, ts in s.tasks.items()} == {
        "load-0": 1, "load-1": 2, "load-2": 3, "load-3": 4,
        "skim-0": 1, "skim-1": 2, "skim-2": 3, "skim-3": 4,  # each continues its load
        "merge": 4,  # ... and the merge its latest skim
    }  # fmt: skip
    while s.count("processing"):
        run_next()
    assert seen == [
        "load-0", "load-1", "load-2", "skim-2", "skim-0", "skim-1", "load-3", "skim-3",
        "merge",
    ]  # fmt: skip


def test_a_later_graph_continues_only_the_tasks_that_read_earlier_submissions(
    make_state: Factory,
) -> None:
    """In a later graph, only the tasks reading outputs of earlier submissions (and what
    reads them in turn) take their generation; a task that also reads a fresh branch of
    its own graph, and the fresh branch, keep the graph's own: FIFO with the tasks
    submitted in between holds for them, and one graph's order is untouched."""
    s = make_state(saturation=1.0)
    submit(s, {"old": []}, ["old"])  # 1
    submit(s, {"between": []}, ["between"])  # 2
    table = {"a": ["old"], "b": ["a"], "fresh": [], "c": ["b", "fresh"]}
    submit(s, table, ["c"])  # 3
    seen = {k: TaskStateView(s.tasks[k]) for k in ("old", "between", "a", "b", "fresh", "c")}
    assert {k: v.generation for k, v in seen.items()} == {
        "old": 1, "between": 2,
        "a": 1, "b": 1,  # they continue old
        "fresh": 3, "c": 3,
    }  # fmt: skip
    # Two readers of old: both before what was submitted after old, by their own order.
    s2 = make_state(saturation=1.0)
    submit(s2, {"old": []}, ["old"])
    submit(s2, {"between": []}, ["between"])
    join(s2, "w1")
    finish(s2, "w1", "old", nbytes=10)
    submit(s2, {"a1": ["old"], "a2": ["old"]}, ["a1", "a2"])
    ranks = sorted(("a1", "a2", "between"), key=lambda k: s2.tasks[k].prio)
    assert ranks == [*by_order(s2, ["a1", "a2"]), "between"]
    # One graph alone: every task keeps its own place.
    submit(s, {"x": [], "y": ["x"], "z": ["x", "y"]}, ["z"])  # 4
    assert {s.tasks[k].generation for k in "xyz"} == {4}


def test_graph_order_finishes_a_branch_before_starting_the_next(make_state: Factory) -> None:
    # Two independent branches joined at the end: dask.order runs one branch to its
    # end before starting the other, and the scheduler follows it. (Memory-blind: with
    # the default memory policy the two roots, which feed the same consumer, would be
    # sent together; see test_scheduler_memory.py.)
    s = make_state(saturation=1.0, memory="blind")
    table = {"a-0": [], "a-1": ["a-0"], "b-0": [], "b-1": ["b-0"], "c": ["a-1", "b-1"]}
    submit(s, table, ["c"])
    join(s, "w1")
    seen = []
    while s.count("processing"):
        (key,) = on(s, "w1")
        seen.append(key)
        finish(s, "w1", key)
    assert seen == by_order(s, table)
    branch = [k[0] for k in seen[:2]]
    assert branch[0] == branch[1]  # both tasks of the first branch come first


def test_execute_tells_each_task_where_its_inputs_live(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1")
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    cmds = finish(s, "w1", "a", nbytes=123)
    (ex,) = of(cmds, Execute)
    (todo,) = ex.tasks
    assert todo.key == "b" and todo.deps == (("a", ("w1",)),) and todo.category == "b"
    assert facts(cmds)["a"] == FileFact("a", "created", 123, ("w1",), 1, False)


def test_a_worker_registering_again_keeps_its_work(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", cores=1)
    keys = ["x-0", "x-1", "x-2"]
    submit(s, dict.fromkeys(keys, ()), keys)
    (running,) = on(s, "w1")
    cmds = join(s, "w1", cores=2)  # reconnected, now with more cores
    assert len(assigned(cmds)["w1"]) == 1
    assert running in on(s, "w1") and s.workers["w1"].slots == 2
    assert s.tasks[running].state == "processing"


# ----------------------------------------------------------------------------- finish


def test_dependents_become_ready_only_when_all_inputs_are_in_memory(make_state: Factory) -> None:
    s = make_state(saturation=2.0)
    join(s, "w1", cores=2)
    cmds = submit(s, {"a": [], "b": [], "c": ["a", "b"]}, ["c"])
    assert sorted(assigned(cmds)["w1"]) == ["a", "b"]
    assert s.tasks["c"].waiting_on == 2

    cmds = finish(s, "w1", "a")
    assert assigned(cmds) == {} and s.tasks["c"].state == "waiting"
    assert s.tasks["c"].waiting_on == 1
    assert of(cmds, KeyDone) == []  # a is not wanted

    cmds = finish(s, "w1", "b")
    assert assigned(cmds) == {"w1": ["c"]}
    cmds = finish(s, "w1", "c", nbytes=5)
    assert [(c.key, c.worker, c.nbytes) for c in of(cmds, KeyDone)] == [("c", "w1", 5)]


def test_key_done_is_sent_only_for_wanted_keys(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1", cores=4)
    submit(s, {"a": [], "b": ["a"], "c": ["a"]}, ["b", "c"])
    assert of(finish(s, "w1", "a"), KeyDone) == []
    cmds = finish_all(s, "w1", ["b", "c"], nbytes=9)
    assert sorted((c.key, c.worker, c.nbytes) for c in of(cmds, KeyDone)) == [
        ("b", "w1", 9),
        ("c", "w1", 9),
    ]
    # a lost its last consumer: the registry may drop it now.
    assert facts(cmds)["a"] == FileFact("a", "created", 100, ("w1",), 0, False)


def test_category_statistics_are_learned_from_results(make_state: Factory) -> None:
    s = make_state(saturation=4.0)
    join(s, "w1", cores=2)
    keys = ["load-0", "load-1", "load-2", "load-3"]
    submit(s, dict.fromkeys(keys, ()), keys)
    finish(s, "w1", "load-0", start=10.0, duration=1.0, nbytes=100, rss=5 * MB)
    finish(s, "w1", "load-1", start=11.0, duration=3.0, nbytes=300, rss=9 * MB)
    finish(s, "w1", "load-2", start=12.0, duration=2.0, nbytes=200, rss=7 * MB)
    finish(s, "w1", "load-3", "error", error=ValueError("bad input"))

    st_ = s.stats["load"]
    assert st_.count == 3
    assert st_.mean_duration == pytest.approx(2.0)
    assert st_.max_duration == pytest.approx(3.0)
    assert st_.total_nbytes == 600 and st_.mean_nbytes == pytest.approx(200)
    assert st_.peak_rss == 9 * MB
    assert st_.errors == 1 and st_.lost == 0
    assert [t.outcome for t in s.tasks["load-3"].tries] == ["error"]
    assert [(t.worker, t.start, t.stop) for t in s.tasks["load-1"].tries] == [("w1", 11.0, 14.0)]


def test_lost_tries_are_counted_per_category(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"job-0": []}, ["job-0"])
    leave(s, "w1", cause="oom")
    assert s.stats["job"].lost == 1 and s.stats["job"].count == 0


def test_categories_learn_bytes_consumed_and_rss_growth(make_state: Factory) -> None:
    s = make_state(unknown_long=False)
    join(s, "w1")
    submit(s, {"load-1": [], "load-2": [], "sum-3": ["load-1", "load-2"]}, ["sum-3"])
    s.handle(
        TasksFinished(
            "f1", 1.0, "w1",
            (
                TaskResult("load-1", "ok", 0.0, 0.1, 1000, rss=5000, rss_before=4000),
                TaskResult("load-2", "ok", 0.1, 0.2, 3000, rss=8000, rss_before=5000),
            ),
        )
    )  # fmt: skip
    s.handle(
        TasksFinished(
            "f2", 2.0, "w1", (TaskResult("sum-3", "ok", 0.2, 0.3, 8, rss=7000, rss_before=8000),)
        )
    )
    load, total = s.stats["load"], s.stats["sum"]
    assert (load.total_nbytes, load.consumed_nbytes, load.max_rss_growth) == (4000, 0, 3000)
    assert (total.total_nbytes, total.consumed_nbytes, total.max_rss_growth) == (8, 4000, 0)
    assert load.production_ratio == float("inf")  # a root that makes data: a producer
    assert total.production_ratio == 8 / 4000  # a reduction: a consumer


def test_short_tasks_get_a_backlog_beyond_their_slots_up_to_the_limit(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0, backlog=0.05, max_per_core=10, unknown_duration=0.5)
    join(s, "w1", cores=2)
    ws = s.workers["w1"]
    assert (ws.slots, ws.limit) == (2, 20)
    keys = [f"tiny-{i}" for i in range(100)]
    submit(s, dict.fromkeys(keys, ()), keys)
    assert ws.n_processing == 2  # duration unknown: only the slots

    first = sorted(on(s, "w1"), key=str)
    finish(s, "w1", first[0], duration=0.001)
    assert ws.n_processing == 2  # the other unknown task still weighs 0.5 s
    finish(s, "w1", first[1], duration=0.001)
    # Now the category is known to be tiny: the worker gets a batch up to its limit.
    assert ws.n_processing == ws.limit == 20
    assert ws.occupancy == pytest.approx(20 * 0.001)
    assert s.count("queued") == 100 - 2 - 20

    # Each finished task is replaced at once while under the limit.
    cmds = finish(s, "w1", sorted(on(s, "w1"), key=str)[0], duration=0.001)
    assert len(assigned(cmds)["w1"]) == 1
    assert ws.n_processing == 20


def test_long_tasks_get_no_backlog(make_state: Factory) -> None:
    s = make_state(saturation=1.0, backlog=0.05, max_per_core=10)
    join(s, "w1", cores=2)
    keys = [f"slow-{i}" for i in range(10)]
    submit(s, dict.fromkeys(keys, ()), keys)
    for _ in range(4):
        finish(s, "w1", sorted(on(s, "w1"), key=str)[0], duration=2.0)
        assert s.workers["w1"].n_processing == 2


# ----------------------------------------------------------------------------- long tasks


def test_a_long_task_is_not_queued_behind_another_and_goes_to_a_worker_that_joins(
    make_state: Factory,
) -> None:
    """A worker gets ``saturation`` (2) tasks per core, the second to start without a
    round trip; a task whose category ran ``long_task`` (1 s) or longer gets a core
    of its own instead. A block started for the work (seen with 30 s tasks on Slurm)
    then takes the next one, which queued on a busy worker could not move."""
    s = make_state()
    join(s, "w1")
    submit(s, {"job-0": []}, ["job-0"])
    finish(s, "w1", "job-0", duration=30.0)  # the category runs 30 s
    table = {f"job-{i}": [] for i in range(1, 4)}
    cmds = submit(s, table, list(table))
    ((first,),) = assigned(cmds).values()  # not two: its core is taken
    assert assigned(cmds) == {"w1": [first]}
    assert sorted(states(s)[k] for k in table) == ["processing", "queued", "queued"]
    cmds = join(s, "w2")
    ((second,),) = assigned(cmds).values()
    assert assigned(cmds) == {"w2": [second]} and second != first
    cmds = finish(s, "w1", first, duration=30.0)
    (third,) = set(table) - {first, second}
    assert assigned(cmds) == {"w1": [third]}
    # Short tasks still go two per core, and more within the backlog.
    finish(s, "w2", second, duration=30.0)
    submit(s, {"a-0": []}, ["a-0"])
    finish(s, worker_of(s, "a-0"), "a-0", duration=0.01)
    short = {f"a-{i}": [] for i in range(1, 6)}
    submit(s, short, list(short))
    assert len(on(s, "w2")) >= 2
