"""Fresh workers: a pool's ``tasks_per_worker`` (docs/configuration.md#pools).

Users on a preemptible "condo" partition, where a job's chance of being preempted grows
with its age, asked for the block that ran a task to be scaled in and another block
scaled out for the next task in line, rather than one block running task after task
until the queue is empty or its walltime is reached.

- The scheduler's pure core, exact commands: a worker of such a pool is sent at most
  that many tries; with the last one it is drained (its story says why), so it takes
  no other task, and it is retired once that try is done and no output only it holds
  is still needed (those are kept, as every drain keeps them). Other pools' workers
  are not limited. No speculative copy takes a worker's last task.
- The autoscaler's pure core: such drains, seen in a count or told with the end (read
  from a real scheduler core's story, as the shell reads it), end blocks as
  ``drained``, each one replaced, and none spends the replacement budget, however
  many end within its window. A block drained with its last task counts against
  ``max_blocks`` while that task runs: its replacement waits for room.
- The pool key is checked like every other: a typed error, with the number meant.
- End to end, real worker processes of a local pool: with ``tasks_per_worker = 1``,
  four tasks run on four workers, one block each, and every result comes back.
  With ``max_blocks = 2``, six tasks held at a gate: two blocks, two tasks at once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from actors.autoscaler import drained_for_walltime, drained_since_joined
from actors.autoscaler_state import (
    AutoscalerConfig,
    AutoscalerState,
    BlockEnded,
    BlockStarted,
    QueuesSeen,
    ReportGone,
    StartBlock,
    TargetSet,
)
from actors.autoscaler_state import Tick as Waited
from actors.pools import pools_from_dicts
from actors.scheduler_events import (
    Evacuate,
    Execute,
    FileFacts,
    GraphSubmitted,
    KeyDone,
    Replicate,
    RetireWorker,
    Tick,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from policies.scaling import PoolLimits
from runtime import Cluster
from runtime.errors import PoolConfigError
from runtime.node import pool_tasks_per_worker
from tests.helpers import (
    GB,
    Factory,
    assigned,
    block_end,
    event,
    finish,
    make_state,
    of,
    release,
    run,
    specs_for,
    submit,
    wait_until,
)
from tests.test_scheduler_state_machine import RandomWorkload
from tests.test_speculation import T0, at, sent, straggler

__all__ = ["make_state"]


def joined(s: SchedulerState, worker: str, pool: str = "fresh", cores: int = 1) -> list[Any]:
    block = f"{pool}/block-{worker[1:]}"
    return run(
        s, event(WorkerJoined, worker=worker, cores=cores, memory=GB, pool=pool, block=block)
    )


def lines(s: SchedulerState, worker: str) -> list[tuple[Any, ...]]:
    return [e[:3] for e in s.story(worker)]


# ----------------------------------------------------------------------------- scheduler core


def test_a_worker_gets_one_task_is_drained_with_it_and_retired_once_it_is_not_needed(
    make_state: Factory,
) -> None:
    """tasks_per_worker 1: of three ready tasks, the worker (two slots by saturation)
    is sent one, and drained with it. Done, its output (which the client holds, and
    only it has) keeps it until released: no worker taking tasks is there to take a
    copy (the next one drains with its own task as it joins). Released: retired."""
    s = make_state(saturation=2.0, tasks_per_worker={"fresh": 1})
    assert joined(s, "w1") == []
    cmds = submit(s, {"a": [], "b": [], "c": []}, ["a", "b", "c"])
    assert [type(c) for c in cmds] == [Execute, FileFacts]
    assert assigned(cmds) == {"w1": ["a"]}
    ws = s.workers["w1"]
    assert ws.draining and s.draining == {"w1"} and "w1" not in s.free
    assert ws.tasks_sent == 1
    assert ("w1", "joined", "draining:tasks_per_worker 1") in lines(s, "w1")

    cmds = finish(s, "w1", "a")
    sid = cmds[0].stimulus_id
    assert of(cmds, KeyDone) == [KeyDone(sid, "a", "w1", 100)]
    assert of(cmds, Execute) == [] and of(cmds, RetireWorker) == []
    assert ws.keeping == {s.tasks["a"]}

    # The next block's worker: one task, drained with it; w1 keeps a still.
    cmds = joined(s, "w2")
    assert [type(c) for c in cmds] == [Execute] and assigned(cmds) == {"w2": ["b"]}
    assert s.workers["w2"].draining
    cmds = release(s, "a")
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w1", "drained")]
    assert s.draining == {"w2"}


def test_an_input_a_drained_worker_alone_holds_is_kept_until_its_reader_has_it(
    make_state: Factory,
) -> None:
    """a -> b, tasks_per_worker 1: w1 runs a and stays (``keeping:1``) while b waits
    for a fresh worker; w2 runs b, fetching a from w1; once b is done nothing needs a
    and w1 is retired. Nothing is computed twice."""
    s = make_state(tasks_per_worker={"fresh": 1})
    joined(s, "w1")
    assert assigned(submit(s, {"a": [], "b": ["a"]}, ["b"])) == {"w1": ["a"]}
    cmds = finish(s, "w1", "a")
    assert [type(c) for c in cmds] == [FileFacts]
    assert ("w1", "draining", "keeping:1") in lines(s, "w1")
    (cmd,) = joined(s, "w2")
    assert isinstance(cmd, Execute) and [(t.key, t.deps) for t in cmd.tasks] == [
        ("b", (("a", ("w1",)),))
    ]
    cmds = finish(s, "w2", "b", fetched=("a",))
    sid = cmds[0].stimulus_id
    assert of(cmds, KeyDone) == [KeyDone(sid, "b", "w2", 100)]
    assert of(cmds, RetireWorker) == [RetireWorker(sid, "w1", "drained")]
    assert [len(s.tasks[k].tries) for k in "ab"] == [1, 1]


def test_a_drained_workers_kept_output_goes_to_a_worker_without_a_task_limit(
    make_state: Factory,
) -> None:
    """A user audit (astro, on Slurm): with ``tasks_per_worker = 10`` each drained
    worker copied what only it held to the next fresh worker, which drained in its turn
    and copied it all on: 191 outputs copied 1,666 times. ``w1`` (``fresh``, one task)
    keeps ``a`` for the client; of the workers taking tasks, fresh ``w2`` holds nothing
    and ``o1`` (``owner``, no limit) holds ``b``: the copy goes to ``o1``, where it stays,
    not to ``w2``, which would copy it on after its own task."""
    s = make_state(saturation=1.0, tasks_per_worker={"fresh": 1})
    joined(s, "o1", pool="owner")
    assert assigned(submit(s, {"b": []}, ["b"], pool="owner")) == {"o1": ["b"]}
    finish(s, "o1", "b")
    joined(s, "w1")
    assert assigned(submit(s, {"a": []}, ["a"], pool="fresh")) == {"w1": ["a"]}
    assert joined(s, "w2") == []  # idle: it takes tasks
    cmds = finish(s, "w1", "a")
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, "o1", "w1", (("a", 100),))]
    assert s.workers["w1"].keeping == {s.tasks["a"]}  # until the copy lands


def test_a_preempted_workers_outputs_go_to_a_worker_without_a_task_limit(
    make_state: Factory,
) -> None:
    """The same for a worker that leaves on a preemption: of the survivors, ``o1``
    (``owner``, no limit, holding ``b``) takes the copy of ``a``, not fresh ``w2``
    (empty, but drained after its one task, and then copying it on again)."""
    s = make_state(saturation=1.0, tasks_per_worker={"fresh": 1})
    joined(s, "o1", pool="owner")
    submit(s, {"b": []}, ["b"], pool="owner")
    finish(s, "o1", "b")
    joined(s, "w1", pool="ckpt")
    assert assigned(submit(s, {"a": []}, ["a"], pool="ckpt")) == {"w1": ["a"]}
    finish(s, "w1", "a")
    assert joined(s, "w2") == []
    out = run(s, event(WorkerLeaving, worker="w1", cause="preempted"))
    assert [(p.worker, p.moves) for p in of(out, Evacuate)] == [("w1", (("a", "o1", 100),))]


def test_a_worker_is_sent_its_n_tasks_at_once_and_drained_with_the_last(
    make_state: Factory,
) -> None:
    """tasks_per_worker 3 with two slots: two now, the third as one finishes, then
    nothing more; retired when its last is done and its outputs are released. A
    worker of another pool is not limited."""
    s = make_state(
        unknown_long=False, long_task=float("inf"), saturation=2.0, tasks_per_worker={"fresh": 3}
    )
    joined(s, "w1")
    keys = [f"t-{i}" for i in range(6)]
    cmds = submit(s, dict.fromkeys(keys, ()), keys)
    assert assigned(cmds) == {"w1": ["t-0", "t-1"]} and not s.workers["w1"].draining
    cmds = finish(s, "w1", "t-0")
    assert assigned(cmds) == {"w1": ["t-2"]} and s.workers["w1"].draining
    assert ("w1", "joined", "draining:tasks_per_worker 3") in lines(s, "w1")
    cmds = finish(s, "w1", "t-1")
    assert assigned(cmds) == {} and of(cmds, RetireWorker) == []
    # A worker of a pool without the key takes the rest, as many as its slots allow.
    cmds = joined(s, "w9", pool="steady")
    assert assigned(cmds) == {"w9": ["t-3", "t-4"]} and not s.workers["w9"].draining
    # w1's outputs (held by the client) are copied to w9, which takes tasks, before
    # w1 is retired.
    finish(s, "w1", "t-2")
    copies = {k for k, ts in s.tasks.items() if "w9" in s.copying.get(k, {})}
    assert copies == {"t-0", "t-1", "t-2"}
    release(s, "t-0", "t-1", "t-2")
    assert s.workers["w1"].retired
    assert s.workers["w9"].tasks_sent == 2


def test_every_try_counts_a_retry_too(make_state: Factory) -> None:
    """A try that failed counts: the worker that ran it is drained all the same, and
    the retry goes to a fresh worker."""
    s = make_state(tasks_per_worker={"fresh": 1})
    joined(s, "w1")
    submit(s, {"x": []}, ["x"], retries=1)
    cmds = finish(s, "w1", "x", "error", error=ValueError("boom"))
    assert assigned(cmds) == {} and of(cmds, RetireWorker) == [
        RetireWorker(cmds[0].stimulus_id, "w1", "drained")
    ]
    assert assigned(joined(s, "w2")) == {"w2": ["x"]}


def test_no_speculative_copy_takes_a_workers_last_task(make_state: Factory) -> None:
    """An idle worker with one task left gets no speculative copy (the copy would
    drain it, and draining cancels copies); with two left it gets one, and is not
    drained by it."""

    def fresh(n: int) -> Any:
        def factory(**kw: Any) -> SchedulerState:
            return make_state(tasks_per_worker={"fresh": n}, **kw)

        return factory

    s = straggler(fresh(1), workers=1)  # t-5 runs long on w1 (pool default)
    at(s, WorkerJoined, T0 + 0.1, worker="w2", cores=1, memory=GB, pool="fresh")
    assert at(s, Tick, T0 + 10) == []
    assert s.workers["w2"].tasks_sent == 0 and not s.workers["w2"].draining

    s = straggler(fresh(2), workers=1)
    at(s, WorkerJoined, T0 + 0.1, worker="w2", cores=1, memory=GB, pool="fresh")
    assert sent(at(s, Tick, T0 + 10)) == [("w2", "t-5")]
    assert s.workers["w2"].tasks_sent == 1 and not s.workers["w2"].draining


def test_the_scheduler_config_refuses_a_limit_below_one() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tasks_per_worker of pool 'p' must be a whole"):
            SchedulerConfig(tasks_per_worker={"p": bad})  # type: ignore[dict-item]


class FreshWorkers(RandomWorkload):
    """The random workloads of test_scheduler_state_machine.py (workers joining,
    preempted, suspended; tries failing, copies, cancels, releases) on workers of a
    pool with tasks_per_worker 2: a retired worker leaves (``drained``), and while
    work waits that no worker takes, a fresh one joins, as the autoscaler replaces
    such blocks. Invariants after every step (validate: a worker sent its two tries
    drains), at most two tries sent to any worker, and everything finishes."""

    def __init__(self) -> None:
        super().__init__()
        self.state.config.tasks_per_worker = {"default": 2}
        self.sent: Counter[str] = Counter()  #: tries sent to each worker (Execute)

    def handle(self, ev: Any) -> list[Any]:
        cmds = super().handle(ev)
        for c in of(cmds, Execute):
            self.sent[c.worker] += len(c.tasks)
            assert self.sent[c.worker] <= 2, (c.worker, self.state.story(c.worker))
        for c in cmds:
            if isinstance(c, RetireWorker) and c.worker in self.state.workers:
                self.handle(event(WorkerLeft, worker=c.worker, cause=c.cause))
        takers = [w for w in self.state.workers.values() if not (w.draining or w.suspended)]
        if not takers and self.with_state("queued"):
            wid = f"w{self.n_workers}"
            self.n_workers += 1
            self.handle(event(WorkerJoined, worker=wid, cores=2, memory=GB))
        return cmds


def test_random_workloads_on_fresh_workers_keep_the_invariants_and_finish() -> None:
    run_state_machine_as_test(
        FreshWorkers,
        settings=settings(
            max_examples=100,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            database=None,
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target),
            suppress_health_check=list(HealthCheck),
        ),
    )


# ----------------------------------------------------------------------------- autoscaler core


def blocks_at_work(s: AutoscalerState, pool: str) -> int:
    """Blocks of ``pool`` at work as max_blocks counts them: live, requested, and
    spent by tasks_per_worker while a task runs there."""
    return s.counts()[pool] + s.spent_at_work(pool)


def test_spent_blocks_count_against_max_blocks_while_their_task_runs() -> None:
    """max_blocks 2, tasks_per_worker 1, six tasks ready: the scheduler drains each
    worker as it is sent its one task (``spent``). The exact commands: two blocks are
    asked for, and a third only once a spent block's task is done (its worker keeps an
    output: it stays, idle, and no longer counts) or its block ends; never more than
    two at work. An operator's drain keeps its allowance: its replacement is asked for
    at once."""
    s = AutoscalerState(AutoscalerConfig(max_replacements=2))
    limits = PoolLimits(min_blocks=0, max_blocks=2, init_blocks=2)
    assert s.handle(TargetSet(0.0, "fresh", 2, "spec", limits)) == [
        StartBlock(1, "fresh", "spec"),
        StartBlock(2, "fresh", "spec"),
    ]
    assert s.handle(BlockStarted(1.0, 1, "fresh/block-1", ("w1",))) == []
    assert s.handle(BlockStarted(1.0, 2, "fresh/block-2", ("w2",))) == []
    both = frozenset({"w1", "w2"})
    # Each is sent its one task and drained with it; four tasks wait.
    seen = QueuesSeen(2.0, {"fresh": 4}, {"w1": 1, "w2": 1}, both, spent=both)
    assert s.handle(seen) == []  # old: two more StartBlock, four blocks at work
    assert s.spent_at_work("fresh") == 2 and blocks_at_work(s, "fresh") == 2
    s.validate()
    assert (
        s.handle(Waited(3.0), QueuesSeen(4.0, {"fresh": 4}, {"w1": 1, "w2": 1}, both, spent=both))
        == []
    )
    # w1's task is done; it keeps its output (the client holds it): it is idle, its
    # block no longer counts, and one block is asked for in its place.
    seen = QueuesSeen(5.0, {"fresh": 4}, {"w1": 0, "w2": 1}, both, spent=both)
    assert s.handle(seen) == [StartBlock(3, "fresh", "spec")]
    assert blocks_at_work(s, "fresh") == 2
    # w2's block ends: one more.
    assert s.handle(BlockEnded(6.0, "fresh/block-2", "completed")) == [
        ReportGone("fresh/block-2", ("w2",), "drained", "completed"),
        StartBlock(4, "fresh", "spec"),
    ]
    assert blocks_at_work(s, "fresh") == 2
    s.validate()
    assert s.handle(BlockStarted(7.0, 3, "fresh/block-3", ("w3",))) == []
    assert s.handle(BlockStarted(7.0, 4, "fresh/block-4", ("w4",))) == []
    # An operator drains w3 (not spent): its allowance, a replacement at once.
    seen = QueuesSeen(
        8.0, {"fresh": 2}, {"w1": 0, "w3": 1, "w4": 1}, frozenset({"w1", "w3", "w4"}),
        spent=frozenset({"w1", "w4"}),
    )  # fmt: skip
    assert s.handle(seen) == [StartBlock(5, "fresh", "spec")]
    assert s.spent_at_work("fresh") == 1 and s.counts()["fresh"] == 1
    s.validate()
    assert s.spent("fresh") == 0


def test_one_task_blocks_end_drained_are_replaced_and_spend_no_budget() -> None:
    """Twelve one-task blocks end within a minute, with a budget of two unasked ends:
    each end is ``drained`` (the drain seen in a count, or told with the end, read
    from the scheduler core's story as the shell reads it), free, and replaced as it
    ends (a spent block counts against max_blocks while its task runs); the pool never
    gives up. Were they charged as unasked ends, the third would have
    stopped its replacements."""
    sched = SchedulerState(SchedulerConfig(tasks_per_worker={"fresh": 1}))
    s = AutoscalerState(AutoscalerConfig(max_replacements=2, replacement_window=60.0))
    limits = PoolLimits(min_blocks=1, max_blocks=1, init_blocks=1)
    assert s.handle(TargetSet(0.0, "fresh", 1, "spec", limits)) == [StartBlock(1, "fresh", "spec")]
    now = 1.0
    for n in range(1, 13):
        bid, wid = f"fresh/block-{n}", f"fresh-{n}"
        assert s.handle(BlockStarted(now, n, bid, (wid,))) == []
        # The scheduler core sends the worker its one task and drains it.
        key = f"task-{n}"
        cmds = run(
            sched,
            event(WorkerJoined, worker=wid, cores=1, memory=GB, pool="fresh", block=bid),
            event(GraphSubmitted, specs=specs_for(sched, {key: []}, [key]), wanted=(key,)),
        )
        assert assigned(cmds) == {wid: [key]}
        story = sched.story(wid)
        assert drained_since_joined(story) and not drained_for_walltime(story)
        if n % 2:  # seen draining in a count, spent by its one task: it counts while
            # that task runs (max_blocks 1), so its replacement comes as it ends
            seen = QueuesSeen(
                now + 1, {"fresh": 1}, {wid: 1}, frozenset({wid}), spent=frozenset({wid})
            )
            assert s.handle(seen) == []
            assert s.handle(BlockEnded(now + 2, bid, "completed")) == [
                ReportGone(bid, (wid,), "drained", "completed"),
                StartBlock(n + 1, "fresh", "spec"),
            ]
        else:  # drained, retired and gone between two counts: told with the end
            assert s.handle(BlockEnded(now + 2, bid, "completed", drained=True)) == [
                ReportGone(bid, (wid,), "drained", "completed"),
                StartBlock(n + 1, "fresh", "spec"),
            ]
        s.validate()
        now += 4.0
    assert [(e.cause, e.charged) for e in s.ends] == [("drained", False)] * 12
    assert s.spent("fresh") == 0 and s.gave_up == set() and s.counts() == {"fresh": 1}


# ----------------------------------------------------------------------------- configuration


def refused(settings: dict[str, Any]) -> PoolConfigError:
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts({"fresh": settings})
    assert (info.value.pool, info.value.key) == ("fresh", "tasks_per_worker")
    return info.value


def test_the_pool_key_is_off_by_default_and_reaches_the_scheduler() -> None:
    pools = pools_from_dicts({"fresh": {"tasks_per_worker": 1}, "steady": {}})
    assert pools["fresh"].tasks_per_worker == 1 and pools["steady"].tasks_per_worker is None
    assert pool_tasks_per_worker(pools) == {"fresh": 1}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0, "got 0"),
        (-2, "got -2"),
        (True, "got True"),
        (2.5, "got 2.5"),
        ("1", "got '1'; did you mean tasks_per_worker = 1 (a number, not a string)?"),
        (3.0, "got 3.0; did you mean tasks_per_worker = 3?"),
        ("one", "got 'one'"),
    ],
)
def test_a_bad_value_is_refused_saying_what_is_allowed(value: Any, says: str) -> None:
    err = refused({"tasks_per_worker": value})
    assert "must be a whole number >= 1" in str(err) and "leave it out: no limit" in str(err)
    assert says in str(err)
    assert isinstance(err, ValueError)


def test_a_misspelt_key_gets_the_closest_name(tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts({"fresh": {"tasks_per_block": 1}})
    assert "key 'tasks_per_block' is unknown; did you mean 'tasks_per_worker'?" in str(info.value)


# ----------------------------------------------------------------------------- end to end

LIMIT = 120  # seconds the test may take: four worker processes start one after another


@contextlib.asynccontextmanager
async def fresh_pool(
    tmp_path: Path, fn: Any, n: int, *, init_blocks: int
) -> AsyncIterator[tuple[Cluster, Path, list[Any]]]:
    """A cluster of one local pool of worker processes, ``tasks_per_worker = 1`` and
    ``max_blocks = 2``, running ``fn(i, marks)`` for ``i`` in ``range(n)`` (``marks``: a
    fresh directory the tasks mark), all within ``LIMIT`` seconds."""
    marks = tmp_path / "marks"
    marks.mkdir()
    pools = {"fresh": {"tasks_per_worker": 1, "max_blocks": 2, "init_blocks": init_blocks}}
    with anyio.fail_after(LIMIT):
        async with Cluster(pools=pools, processes=True) as cluster:
            yield cluster, marks, cluster.map(fn, range(n), marks=str(marks))


def marked(i: int, marks: str) -> int:
    """Record which worker ran this task (one file per task, named by the worker)."""
    Path(marks, f"{os.environ['CORRAL_WORKER_ID']}-{i}").touch()
    return i * 10


@pytest.mark.anyio
@pytest.mark.slow
async def test_four_tasks_run_on_four_fresh_workers_one_block_each(tmp_path: Path) -> None:
    """A local pool of worker processes with tasks_per_worker 1 and at most two
    blocks at work: four tasks run on four distinct workers, each of its own block,
    one task each; every result comes back; each block ends ``drained``, free."""
    async with fresh_pool(tmp_path, marked, 4, init_blocks=1) as (cluster, marks, futures):
        assert await cluster.gather(futures) == [0, 10, 20, 30]
        ran = sorted(p.name.rsplit("-", 1) for p in marks.iterdir())
        workers = [w for w, _ in ran]
        assert len(ran) == 4 and len(set(workers)) == 4, ran
        state = cluster.scheduler_state
        tries = {f.key: [(t.worker, t.outcome) for t in state.tasks[f.key].tries] for f in futures}
        assert sorted(w for per_key in tries.values() for w, _ in per_key) == sorted(workers)
        assert all(len(per_key) == 1 and per_key[0][1] == "ok" for per_key in tries.values())
        for w in workers:
            assert "draining:tasks_per_worker 1" in [e[2] for e in state.story(w)]
        # Released, no worker keeps a result: every block ends, drained, free.
        for f in futures:
            f.release()
        for w in workers:
            block = f"fresh/block-{w.rsplit('-', 1)[1]}"
            end = await block_end(cluster, block, limit=LIMIT / 2)
            assert (end["state"], end["cause"], end["charged"]) == (
                "completed", "drained", False,
            ), end  # fmt: skip
        assert (await cluster.status())["autoscaler"]["budget_spent"] == 0


def gated(i: int, marks: str) -> int:
    """Mark this task running (``run-<i>``) and how many run with it as it starts
    (``seen-<i>-<n>``); wait for the test's gate (``go``), then end."""
    d = Path(marks)
    (d / f"run-{i}").touch()
    (d / f"seen-{i}-{len(list(d.glob('run-*')))}").touch()
    while not (d / "go").exists():  # the gate: the test opens it (in a worker process)
        time.sleep(0.02)
    (d / f"run-{i}").unlink()
    return i


@pytest.mark.anyio
@pytest.mark.slow
async def test_max_blocks_caps_one_task_blocks_and_tasks_running(tmp_path: Path) -> None:
    """max_blocks 2, tasks_per_worker 1, six tasks held at a gate: once the two blocks'
    workers run a task each (drained with it), the pool holds back: two blocks, two
    tasks running, no third block asked for (before the fix every drained block was
    replaced at once: six blocks, six tasks running). Gate open: all six finish, never
    more than two of them running at once."""
    async with fresh_pool(tmp_path, gated, 6, init_blocks=2) as (cluster, marks, futures):

        async def at_peak() -> tuple[list[str], list[str]] | None:
            """The tasks started and the pool's blocks once two tasks run and the
            pool holds back (both blocks spent), or once more have started."""
            started = sorted(p.name for p in marks.glob("seen-*"))
            auto = (await cluster.status())["autoscaler"]
            blocks = sorted(b for b, p in auto["block_pools"].items() if p == "fresh")
            held = len(started) == 2 and set(blocks) <= set(auto["retiring"])
            if held or len(started) > 2 or len(blocks) > 2:
                return started, blocks
            return None

        started, blocks = await wait_until(at_peak, "two tasks running")
        assert len(started) == 2 and len(blocks) == 2, (started, blocks)
        (marks / "go").touch()
        assert sorted(await cluster.gather(futures)) == list(range(6))
        seen = [int(p.name.rsplit("-", 1)[1]) for p in marks.glob("seen-*")]
        assert len(seen) == 6 and max(seen) <= 2, seen
