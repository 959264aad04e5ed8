"""Temporary replicas (docs/files.md#replicas): outputs that are long to make again get
copies on other workers, so a lost worker does not mean a long recompute.

First the scheduler's pure core (and the registry's, through ``tests.helpers.Loop``):
which copies it asks for, within which bounds, what a loss of a worker then does (no
``Execute`` for a replicated output; without replicas, exactly one), and how the
replicas go with the output. Then the policies. Then real worker processes: a long
task's output is replicated, the worker holding the original is killed with SIGKILL,
the run completes and the long task ran once.
"""

from __future__ import annotations

import os
import random
import signal
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.scheduler_events import (
    CancelOnWorker,
    DropData,
    Execute,
    FileFacts,
    ReplicasCopied,
    Replicate,
    WorkerDraining,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from policies import REGISTRY, PolicyParamsError
from runtime.graph import Key
from tests.helpers import (
    MB,
    Cli,
    Factory,
    Loop,
    event,
    facts,
    finish,
    finish_all,
    join,
    make_state,
    of,
    run,
    submit,
    wait_until,
    worker_statuses,
)

__all__ = ["make_state"]

LIMIT = 90  # seconds for the test with processes


def copied(s: SchedulerState, worker: str, *keys: str, got: bool = True) -> list[Any]:
    return run(s, event(ReplicasCopied, worker=worker, asked=keys, got=keys if got else ()))


def sent(cmds: list[Any]) -> list[tuple[str, str]]:
    return [(c.worker, t.key) for c in of(cmds, Execute) for t in c.tasks]


# ----------------------------------------------------------------------------- the core


def test_the_time_a_copy_may_take_grows_with_its_bytes() -> None:
    """The scheduler's backstop for a copy (replicas, a checkpoint) is 10 minutes plus a
    second per 10 MiB: a 100 GiB checkpoint on a slow link is not called failed (and
    left untracked on its target) after 10 minutes."""
    from actors.scheduler import copy_timeout

    assert copy_timeout(0) == 600.0 and copy_timeout(10 * MB) == 601.0
    assert copy_timeout(100 * 2**30) == 600.0 + 10 * 1024


def test_a_long_output_gets_one_replica_on_the_emptiest_other_worker(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"])
    join(s, "w2")
    join(s, "w3")
    # w2 and w3 hold nothing: the first by id
    out = finish(s, "w1", "long-0", duration=40.0, nbytes=5 * MB)
    assert of(out, Replicate) == [Replicate(out[0].stimulus_id, "w2", "w1", (("long-0", 5 * MB),))]
    # Until the copy is made, only w1 holds it.
    assert s.tasks["long-0"].who_has == {"w1"} and s.replicas_made == 0
    out = copied(s, "w2", "long-0")
    assert s.tasks["long-0"].who_has == {"w1", "w2"}
    assert facts(out)["long-0"].replicas in (("w1", "w2"), ("w2", "w1"))
    assert (s.replicas_made, s.replica_bytes, s.replicas_failed) == (1, 5 * MB, 0)
    assert s.replicas == {s.tasks["long-0"]: {"w2"}}


def test_a_short_output_gets_none_and_one_worker_means_none(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"short-0": [], "long-0": []}, ["short-0", "long-0"])
    out = finish(s, "w1", "long-0", duration=40.0)  # one worker: nowhere to copy to
    assert of(out, Replicate) == []
    join(s, "w2")
    out = finish(s, "w1", "short-0", duration=1.0)
    assert of(out, Replicate) == []


def test_an_input_that_is_not_kept_counts_in_the_cost(make_state: Factory) -> None:
    """skim takes 15 s, below the 30 s threshold; but its input (load, 20 s) is dropped
    once skim is done, so losing skim's output means 35 s of work: it is replicated."""
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    submit(s, {"load-0": [], "skim-0": ["load-0"], "keep-0": [], "skim-1": ["keep-0"]},
           ["skim-0", "skim-1", "keep-0"])  # fmt: skip
    w = s.tasks["load-0"].worker or ""
    assert of(finish(s, w, "load-0", duration=20.0), Replicate) == []
    out = finish(s, s.tasks["skim-0"].worker or "", "skim-0", duration=15.0)
    assert [c.keys for c in of(out, Replicate)] == [(("skim-0", 100),)]
    assert s.tasks["skim-0"].remake == 35.0
    # keep-0 is wanted, so it is kept: skim-1 costs its own 15 s only.
    finish(s, s.tasks["keep-0"].worker or "", "keep-0", duration=20.0)
    out = finish(s, s.tasks["skim-1"].worker or "", "skim-1", duration=15.0)
    assert of(out, Replicate) == [] and s.tasks["skim-1"].remake == 15.0


def test_an_input_the_pruning_depth_keeps_does_not_count(make_state: Factory) -> None:
    """With prune_depth 2, load stays while skim's reader runs: losing skim's output
    costs skim's 15 s only, below the threshold: no replica."""
    s = make_state(prune_depth=2)
    join(s, "w1")
    join(s, "w2")
    submit(s, {"load-0": [], "skim-0": ["load-0"], "use-0": ["skim-0"]}, ["use-0"])
    finish(s, s.tasks["load-0"].worker or "", "load-0", duration=20.0)
    out = finish(s, s.tasks["skim-0"].worker or "", "skim-0", duration=15.0)
    assert of(out, Replicate) == [] and s.tasks["skim-0"].remake == 15.0
    assert s.tasks["load-0"].state == "memory"


def test_the_core_bounds_the_count_and_picks_workers_with_room(make_state: Factory) -> None:
    s = make_state(replication=REGISTRY.create("replication", "fixed", {"replicas": 5}))
    join(s, "w1")
    submit(s, {"x": []}, ["x"])
    join(s, "small", memory=10 * MB)  # cannot hold a 20 MB output
    join(s, "leaving")
    run(s, event(WorkerDraining, worker="leaving"))
    join(s, "w2")
    join(s, "w3")
    out = finish(s, "w1", "x", nbytes=20 * MB)
    # 5 asked, at most workers - 1 = 4; small has no room, leaving takes nothing new.
    assert sorted(c.worker for c in of(out, Replicate)) == ["w2", "w3"]
    assert all(c.source == "w1" for c in of(out, Replicate))


def test_copies_in_flight_count_so_outputs_spread_over_the_workers(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", cores=2)
    submit(s, {"long-0": [], "long-1": []}, ["long-0", "long-1"])
    join(s, "w2")
    join(s, "w3")
    out = finish_all(s, "w1", ["long-0", "long-1"], duration=40.0, nbytes=10 * MB)
    # w2 was the emptiest for long-0; with that copy on its way, w3 is for long-1.
    assert [(c.worker, c.keys[0][0]) for c in of(out, Replicate)] == [
        ("w2", "long-0"),
        ("w3", "long-1"),
    ]
    assert s.copying == {"long-0": {"w2": 10 * MB}, "long-1": {"w3": 10 * MB}}
    copied(s, "w2", "long-0")
    out = copied(s, "w3", "long-1", got=False)
    # The failed copy is asked again of another worker (w2: w3 failed it, w1 holds it).
    assert [(c.worker, c.keys[0][0]) for c in of(out, Replicate)] == [("w2", "long-1")]
    copied(s, "w2", "long-1")
    assert s.copying == {} and (s.replicas_made, s.replicas_failed) == (2, 1)


def test_losing_the_original_runs_nothing_again_and_restores_the_replica(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1", cores=2)
    submit(s, {"long-0": [], "use-0": ["long-0"], "slow-0": []}, ["use-0", "slow-0"])
    join(s, "w2")
    finish(s, "w1", "long-0", duration=40.0)
    copied(s, "w2", "long-0")
    use = s.tasks["use-0"]
    assert use.state == "processing" and use.worker == "w1"  # stays with its data
    join(s, "w3")
    out = run(s, event(WorkerLeft, worker="w1", cause="crash"))
    assert "long-0" not in [k for _, k in sent(out)]  # not recomputed
    assert s.tasks["long-0"].state == "memory" and s.tasks["long-0"].who_has == {"w2"}
    assert s.recomputes_avoided == 1
    # use-0 (lost with w1) runs again, reading the replica; a new replica replaces w1's.
    (task,) = [t for c in of(out, Execute) for t in c.tasks if t.key == "use-0"]
    assert task.deps == (("long-0", ("w2",)),)
    assert [(c.worker, c.source, c.keys) for c in of(out, Replicate)] == [
        ("w3", "w2", (("long-0", 100),))
    ]


def test_without_replicas_a_lost_output_is_made_again_exactly_once(make_state: Factory) -> None:
    s = make_state(replication="none")
    join(s, "w1", cores=2)
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"])
    join(s, "w2")
    out = finish(s, "w1", "long-0", duration=40.0)
    assert of(out, Replicate) == []
    out = run(s, event(WorkerLeft, worker="w1", cause="crash"))
    assert sent(out) == [("w2", "long-0")]  # once, and use-0 waits for it
    assert s.tasks["use-0"].state == "waiting" and s.recomputes_avoided == 0
    out = finish(s, "w2", "long-0", duration=40.0)
    assert sent(out) == [("w2", "use-0")]


def long_done(s: SchedulerState) -> Loop:
    """w1 ran long-0 (40 s: replicated), which use-0 reads; w2 joined meanwhile."""
    loop = Loop(s)
    join(s, "w1")
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"])
    join(s, "w2")
    loop.finish("w1", "long-0", duration=40.0)
    return loop


def test_the_replicas_go_with_the_output(make_state: Factory) -> None:
    s = make_state()
    loop = long_done(s)
    loop.run(event(ReplicasCopied, worker="w2", asked=("long-0",), got=("long-0",)))
    worker = s.tasks["use-0"].worker or ""
    out = loop.finish(worker, "use-0")
    # use-0 was long-0's only reader: the registry drops it from both workers.
    assert sorted(loop.drops) == [("w1", ("long-0",)), ("w2", ("long-0",))]
    assert s.tasks.get("long-0") is None or s.tasks["long-0"].state == "released"
    assert s.replicas == {}
    # The scheduler also drops its replicas itself, in case the registry did not know
    # of them yet when it decided.
    assert ("w2", ("long-0",)) in [(c.worker, c.keys) for c in of(out, DropData)]


def test_a_copy_that_arrives_after_the_release_is_dropped(make_state: Factory) -> None:
    s = make_state()
    loop = long_done(s)
    loop.finish(s.tasks["use-0"].worker or "", "use-0")
    out = copied(s, "w2", "long-0")
    assert [(c.worker, c.keys) for c in of(out, DropData)] == [("w2", ("long-0",))]
    assert s.replicas_made == 0 and of(out, FileFacts) == []


def test_a_failed_copy_is_counted_and_changes_nothing(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    join(s, "w2")
    finish(s, "w1", "long-0", duration=40.0)
    copied(s, "w2", "long-0", got=False)
    assert s.tasks["long-0"].who_has == {"w1"}
    assert (s.replicas_made, s.replicas_failed) == (0, 1)


def retry_lost() -> Any:
    """Tries lost with a preempted worker are retried, however often (the kills)."""
    return REGISTRY.create("retry", "default", {"max_lost": 100})


def simulate(
    s: SchedulerState, seed: int, groups: int = 20, fan: int = 5
) -> tuple[Counter[Key], int]:
    """Run ``groups`` subgraphs (``fan`` loads -> a skim each -> one merge) on four
    workers, finishing tasks in a seeded random order, and kill a random worker (a
    replacement joins) at six random points (preempted: the tasks they ran are tried
    again, not suspected of killing them). Copies asked for are made
    at once. Checks that no task finished more often than once plus the kills after
    its first finish. Returns how often each task finished ok, and the kills."""
    rng = random.Random(seed)
    table: dict[Key, list[Key]] = {}
    for g in range(groups):
        for i in range(fan):
            table[f"load-{g}-{i}"] = []
            table[f"skim-{g}-{i}"] = [f"load-{g}-{i}"]
        table[f"merge-{g}"] = [f"skim-{g}-{i}" for i in range(fan)]
    merges = [f"merge-{g}" for g in range(groups)]
    queues: dict[str, list[Key]] = {}
    finished: Counter[Key] = Counter()
    kills = 0
    kills_before: dict[Key, int] = {}  #: kills before each task's first finish

    def carry(out: list[Any]) -> None:
        for c in out:
            if isinstance(c, Execute):
                queues[c.worker].extend(t.key for t in c.tasks)
            elif isinstance(c, Replicate):
                ok = c.worker in queues and c.source in queues
                keys = tuple(k for k, _ in c.keys)
                carry(run(s, event(ReplicasCopied, worker=c.worker, asked=keys,
                                   got=keys if ok else ())))  # fmt: skip
            elif isinstance(c, CancelOnWorker) and c.worker in queues:
                queues[c.worker] = [k for k in queues[c.worker] if k not in c.keys]

    for i in range(4):
        queues[f"w{i}"] = []
        carry(join(s, f"w{i}", cores=2))
    carry(submit(s, table, merges))
    kill_at = set(rng.sample(range(1, len(table)), 6))  # steps before the last task
    for step in range(10 * len(table)):  # bounded: a recovery loop fails here
        if all(s.tasks[m].state == "memory" for m in merges):
            # A task may be made again once per loss after it first finished, no more.
            for key, n in finished.items():
                assert n - 1 <= kills - kills_before[key], (key, n, kills_before[key])
            return finished, kills
        if step in kill_at:
            victim = rng.choice(sorted(queues))
            del queues[victim]
            kills += 1
            carry(run(s, event(WorkerLeft, worker=victim, cause="preempted")))
            queues[f"w{4 + kills}"] = []
            carry(join(s, f"w{4 + kills}", cores=2))
            continue
        busy = [w for w, q in queues.items() if q]
        assert busy, "nothing runs and the run is not complete"
        w = rng.choice(busy)
        key = queues[w].pop(rng.randrange(len(queues[w])))
        if s.tasks[key].state == "processing" and s.tasks[key].worker == w:
            finished[key] += 1
            kills_before.setdefault(key, kills)
        duration = 40.0 if str(key).startswith("load") else 1.0
        carry(finish(s, w, key, duration=duration))
    raise AssertionError("the run did not complete: a recovery loop?")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("policy", [("fixed", {"replicas": 1}), ("recompute-cost", {})])
def test_seeded_kills_with_replicas_never_make_a_finished_output_again(
    make_state: Factory, seed: int, policy: tuple[str, dict[str, Any]]
) -> None:
    """Loads take 40 s: by the default policy they get a replica, and so do the skims
    and merges, whose inputs (pruned once read) cost that much to make again."""
    s = make_state(replication=REGISTRY.create("replication", *policy), retry=retry_lost())
    finished, kills = simulate(s, seed)
    assert kills == 6 and len(finished) == 220
    assert set(finished.values()) == {1}  # every task ran to the end once
    assert s.recomputes_avoided >= 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeded_kills_without_replicas_make_each_lost_output_again_at_most_once_per_loss(
    make_state: Factory, seed: int
) -> None:
    s = make_state(replication="none", retry=retry_lost())
    finished, kills = simulate(s, seed)
    assert kills == 6 and len(finished) == 220
    assert sum(finished.values()) > len(finished)  # some were made again
    assert s.replicas_made == 0


class Raises:
    def replicas(self, task: Any, inputs: float, workers: int) -> int:
        raise RuntimeError("broken")


class Answers:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def replicas(self, task: Any, inputs: float, workers: int) -> Any:
        return self.answer


@pytest.mark.parametrize("policy", [Raises(), Answers(-1), Answers(1.0), Answers(True)])
def test_a_bad_answer_is_a_policy_error_and_makes_no_copy(make_state: Factory, policy: Any) -> None:
    s = make_state(replication=policy)
    join(s, "w1")
    submit(s, {"x": []}, ["x"])
    join(s, "w2")
    out = finish(s, "w1", "x", duration=100.0)
    assert of(out, Replicate) == [] and s.policy_errors == 1
    assert any(e[0] == "x" and e[1] == "policy-error" for e in s.story_log)


class Counting:
    """One replica always; counts the calls. ``min_cost``: below it, never asked."""

    def __init__(self, min_cost: Any) -> None:
        self.min_cost = min_cost
        self.calls = 0

    def replicas(self, task: Any, inputs: float, workers: int) -> int:
        self.calls += 1
        return 1


@pytest.mark.parametrize(("min_cost", "asked"), [(10.0, ["long-0"]), (0, ["short-0", "long-0"]),
                                                 ("x", ["short-0", "long-0"])])  # fmt: skip
def test_below_the_policys_min_cost_it_is_not_asked(
    make_state: Factory, min_cost: Any, asked: list[str]
) -> None:
    policy = Counting(min_cost)
    s = make_state(replication=policy)
    join(s, "w1", cores=2)
    join(s, "w2")
    submit(s, {"short-0": [], "long-0": []}, ["short-0", "long-0"])
    made = []
    for key, duration in (("short-0", 1.0), ("long-0", 20.0)):
        out = finish(s, s.tasks[key].worker or "", key, duration=duration)
        made += [c.keys[0][0] for c in of(out, Replicate)]
    assert made == asked and policy.calls == len(asked)


# ----------------------------------------------------------------------------- policies


class View:
    def __init__(self, mean: float | None) -> None:
        self.stats = None if mean is None else type("S", (), {"mean_duration": mean})()


def test_recompute_cost_compares_mean_plus_inputs_with_its_threshold() -> None:
    p = REGISTRY.create("replication", "recompute-cost", {"threshold": 10, "replicas": 2})
    assert p.replicas(View(12.0), 0.0, 3) == 2
    assert p.replicas(View(4.0), 6.0, 3) == 2  # long because of its inputs
    assert p.replicas(View(4.0), 5.0, 3) == 0
    assert p.replicas(View(None), 0.0, 3) == 0
    assert p.replicas(View(12.0), 0.0, 1) == 0  # a single worker: nowhere to copy to
    default = REGISTRY.create("replication", "recompute-cost")
    assert (default.threshold, default.count) == (30.0, 1)
    assert REGISTRY.create("replication", "none").replicas(View(1e9), 1e9, 9) == 0
    assert REGISTRY.create("replication", "fixed", {"replicas": 3}).replicas(View(0), 0, 2) == 3


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("recompute-cost", {"threshold": -1}),
        ("recompute-cost", {"threshold": float("nan")}),
        ("recompute-cost", {"replicas": -1}),
        ("recompute-cost", {"replicas": 1.5}),
        ("fixed", {"replicas": "2"}),
        ("fixed", {"count": 2}),
    ],
)
def test_bad_parameters_are_refused(name: str, params: dict[str, Any]) -> None:
    with pytest.raises(PolicyParamsError):
        REGISTRY.create("replication", name, params)


def test_the_console_status_counts_the_replicas() -> None:
    from runtime.messages import ReplicasStatus, StatusReply
    from tests.helpers import status_text as text

    assert "replicas:" not in text(StatusReply().to_dict())
    st = StatusReply(replicas=ReplicasStatus(3, 3 * 2**20, 1, 2, 1)).to_dict()
    assert (
        "replicas: 3 made (3.0 MiB copied), 1 failed, 1 outputs have replicas now, "
        "2 recomputes avoided"
    ) in text(st)


# ----------------------------------------------------------------------------- a cluster


def array(n: int) -> Any:
    import numpy as np

    return np.ones(n)


@pytest.mark.anyio
async def test_in_a_cluster_a_replica_is_stored_and_dropped_with_its_output() -> None:
    from runtime import Cluster

    policies = {"replication": ("fixed", {"replicas": 1})}
    with anyio.fail_after(60):
        async with Cluster(workers=2, policies=policies) as c:
            await c.wait_for_workers(2)
            x = c.submit(array, 1000)
            assert (await x).sum() == 1000

            async def stored() -> list[int]:
                return sorted(w.stored for w in await worker_statuses(c))

            async def status() -> dict[str, Any]:
                return dict((await c.status())["replicas"])

            await wait_until(lambda: _is(status, "made", 1), "the replica", limit=30)
            assert await stored() == [1, 1]  # the output on both workers
            x.release()
            await wait_until(lambda: _is(status, "outputs", 0), "the release", limit=30)
            await wait_until(lambda: _equal(stored, [0, 0]), "both copies to be dropped", limit=30)


async def _is(status: Any, field: str, value: int) -> bool:
    return bool((await status())[field] == value)


async def _equal(get: Any, value: Any) -> bool:
    return bool(await get() == value)


# ----------------------------------------------------------------------------- processes


def long_task(log: str, n: int) -> Any:
    """A task of the long category: it notes each run, takes a second, makes n floats."""
    import time

    import numpy as np

    with open(log, "a") as f:
        f.write(f"ran in {os.getpid()}\n")
    time.sleep(1.0)
    return np.arange(n, dtype=np.float64)


def total(x: Any) -> float:
    return float(x.sum())


def scrape(address: str, token: str) -> dict[str, float]:
    """The manager's unlabelled metrics, read with the read token."""
    url = address.replace("ws://", "http://", 1).rstrip("/") + "/metrics"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


@pytest.mark.anyio
async def test_a_replica_survives_a_kill_9_of_the_original_and_nothing_runs_again(
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    log = tmp_path / "runs"
    n = 2**18  # 2 MiB
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        procs = {name: cli.worker(address, "--name", name) for name in ("w-a", "w-b")}
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            # A second is long here: outputs of categories averaging 0.5 s get a replica.
            await c.set_policy("replication", "recompute-cost", threshold=0.5)
            (x,) = await c.submit_graph({"long-0": (long_task, str(log), n)}, ["long-0"])
            await x.wait()

            async def made() -> bool:
                return bool((await c.status())["replicas"]["made"] == 1)

            await wait_until(made, "the replica", limit=30, step=0.05)
            story = await c.story("long-0")
            (copy,) = [f for _, _, f, _, _ in story if str(f).startswith("replica:")]
            (target,) = [w for w in procs if copy == f"replica:{w}"]
            (original,) = [w for w in procs if w != target]
            procs[original].send_signal(signal.SIGKILL)  # no warning, no evacuation
            procs[original].wait(10)
            (y,) = await c.submit_graph({"use-0": (total, "long-0")}, ["use-0"])
            assert await y == float(n * (n - 1) / 2)
            value = await x
            assert value.shape == (n,) and value[-1] == n - 1

            async def avoided() -> dict[str, Any]:
                status = await c.status()
                return status if status["replicas"]["recomputes_avoided"] == 1 else {}

            status = await wait_until(avoided, "the loss to be seen", limit=30, step=0.05)
            assert [w.worker_id for w in status["workers"]] == [target]
            replicas = status["replicas"]
            assert replicas["copied_bytes"] >= 8 * n and replicas["failed"] == 0
            story = await c.story("long-0")
            metrics = await anyio.to_thread.run_sync(scrape, address, cli.tokens(address)["read"])
        assert metrics["corral_replicas_total"] == 1
        assert metrics["corral_recomputes_avoided_total"] == 1
        assert metrics["corral_replica_bytes_total"] == replicas["copied_bytes"]
        assert log.read_text().count("ran") == 1  # the long task ran once
        assert [(s, f) for _, s, f, _, _ in story if f == "memory" and s == "processing"] == [
            ("processing", "memory")
        ]
        assert ("memory", f"kept-by-replica:{target}") in [(s, f) for _, s, f, _, _ in story]
