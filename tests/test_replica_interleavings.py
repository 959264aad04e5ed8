"""Temporary replicas (docs/files.md#replicas) under random interleavings: the scheduler's
pure core gets copies answered late, failed or after their worker or output is gone,
workers lost, rejoining, draining and leaving with evacuations, outputs released by the
file registry's core with a delay, clients releasing and resubmitting, inputs found
missing; ``validate()`` after every event. Seeded and bounded: the same runs every time.

Then the cases those runs are about, one by one: a copy to a worker that is lost, a
failed copy asked again elsewhere (never twice of one worker), and replicas placed in
the pool their readers run in.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from actors.registry import FilesDropped, FileTable
from actors.scheduler_events import (
    CancelOnWorker,
    CancelRequested,
    Execute,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    KeysReleased,
    PolicyChanged,
    ReplicasCopied,
    ReplicasMissing,
    Replicate,
    TasksFinished,
    Tick,
    WorkerDraining,
    WorkerHeld,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
    WorkerMemory,
)
from actors.scheduler_state import SchedulerState
from policies import REGISTRY
from runtime.graph import Key
from tests.helpers import (
    MB,
    Factory,
    event,
    finish,
    join,
    make_state,
    of,
    result,
    run,
    specs_for,
    submit,
    worker_of,
)

__all__ = ["make_state"]  # the autouse fixture, used by name

SEEDS = range(40)
STEPS = 400


class Interleaver:
    """One random run: the core, the registry's core and what the workers are doing
    (tasks handed to them, copies asked of them), all driven by one seeded ``rng``."""

    def __init__(self, s: SchedulerState, rng: random.Random) -> None:
        self.s = s
        self.rng = rng
        self.table = FileTable()
        self.queues: dict[str, list[Key]] = {}  #: tasks each worker was handed
        self.copies: list[Replicate] = []  #: copies asked for, not answered yet
        self.dropped: list[tuple[Key, ...]] = []  #: FilesDropped not delivered yet
        self.wanted: list[Key] = []
        self.n_workers = 0
        self.n_graphs = 0

    def feed(self, ev: Any) -> None:
        for c in run(self.s, ev):  # validates
            if isinstance(c, Execute):
                self.queues.setdefault(c.worker, []).extend(t.key for t in c.tasks)
            elif isinstance(c, Replicate):
                assert c.worker in self.s.workers and c.worker != c.source
                assert c.source in self.s.tasks[c.keys[0][0]].who_has
                self.copies.append(c)
            elif isinstance(c, CancelOnWorker) and c.worker in self.queues:
                self.queues[c.worker] = [k for k in self.queues[c.worker] if k not in c.keys]
            elif isinstance(c, FileFacts):
                for rc in self.table.handle(c.facts):
                    if isinstance(rc, FilesDropped):
                        self.dropped.append(rc.keys)

    def join(self, pool: str = "default") -> None:
        self.n_workers += 1
        wid = f"w{self.n_workers}"
        self.queues[wid] = []
        memory = self.rng.choice([2**30, 2000, 0])  # 0: no limit known
        cores = self.rng.choice([1, 2])
        self.feed(event(WorkerJoined, worker=wid, cores=cores, memory=memory, pool=pool))

    def submit(self) -> None:
        """A few loads, a skim of each (some also reading an older output) and a merge;
        the merge wanted, sometimes a load too."""
        rng = self.rng
        self.n_graphs += 1
        g = self.n_graphs
        older = sorted(self.s.tasks, key=str)
        table: dict[Key, list[Key]] = {}
        fan = rng.randint(1, 4)
        for i in range(fan):
            table[f"a{g}-{i}"] = []
            table[f"b{g}-{i}"] = [f"a{g}-{i}"]
            if older and rng.random() < 0.3:
                table[f"b{g}-{i}"].append(rng.choice(older))
        table[f"c{g}"] = [f"b{g}-{i}" for i in range(fan)]
        want: list[Key] = [f"c{g}"]
        if rng.random() < 0.3:
            want.append(f"a{g}-0")
        self.wanted.extend(want)
        specs = specs_for(self.s, table, want)
        self.feed(event(GraphSubmitted, specs=specs, wanted=tuple(want)))

    def finish_one(self) -> bool:
        rng, s = self.rng, self.s
        busy = sorted(w for w, q in self.queues.items() if q and w in s.workers)
        if not busy:
            return False
        w = rng.choice(busy)
        key = self.queues[w].pop(rng.randrange(len(self.queues[w])))
        ts = s.tasks.get(key)
        outcome = rng.choices(["ok", "error", "missing"], [8, 1, 1])[0]
        fetched: tuple[Key, ...] = ()
        missing: tuple[tuple[Key, str], ...] = ()
        if ts is not None:
            others = sorted((d.key for d in ts.deps if d.who_has and w not in d.who_has), key=str)
            if outcome == "missing" and others:
                dk = rng.choice(others)
                missing = ((dk, min(s.tasks[dk].who_has)),)
            elif outcome == "ok":
                fetched = tuple(others)  # copies of its inputs, made for it
            else:
                outcome = "error"
        res = result(
            key, outcome, duration=rng.choice([1.0, 40.0]), nbytes=rng.choice([100, 1000]),
            missing=missing, fetched=fetched,
            error=RuntimeError("boom") if outcome == "error" else None,
        )  # fmt: skip
        self.feed(event(TasksFinished, worker=w, results=(res,)))
        return True

    def answer_copy(self) -> None:
        c = self.copies.pop(self.rng.randrange(len(self.copies)))
        keys = tuple(k for k, _ in c.keys)
        got = keys if self.rng.random() < 0.7 else ()
        self.feed(event(ReplicasCopied, worker=c.worker, asked=keys, got=got))

    def lose_worker(self) -> None:
        rng, s = self.rng, self.s
        w = rng.choice(sorted(s.workers))
        self.queues.pop(w, None)
        evacuated: tuple[tuple[Key, str], ...] = ()
        if rng.random() < 0.3:  # it said it would go, and copied some outputs first
            self.feed(event(WorkerLeaving, worker=w, cause="preempted"))
            others = sorted(x for x in s.workers if x != w)
            held = sorted((ts.key for ts in s.workers[w].has_what), key=str)
            evacuated = tuple((k, rng.choice(others)) for k in held if rng.random() < 0.5)
        cause = rng.choice(["crash", "preempted"])
        self.feed(event(WorkerLeft, worker=w, cause=cause, evacuated=evacuated))
        if rng.random() < 0.8:
            self.join()

    def rejoin(self) -> None:
        """A worker reconnects and says what it has in hand and holds."""
        w = self.rng.choice(sorted(self.s.workers))
        ws = self.s.workers[w]
        self.feed(event(WorkerJoined, worker=w, cores=ws.cores, memory=ws.memory, pool=ws.pool))
        active = frozenset(ts.key for ts in ws.processing if self.rng.random() < 0.8)
        held = tuple(sorted((ts.key, ts.nbytes) for ts in ws.has_what))
        self.feed(event(WorkerHeld, worker=w, active=active, held=held))

    def step(self) -> None:
        rng, s = self.rng, self.s
        r = rng.random()
        if r < 0.40 and self.finish_one():
            return
        if r < 0.55 and self.copies:
            self.answer_copy()
        elif r < 0.63 and self.dropped:
            keys = self.dropped.pop(rng.randrange(len(self.dropped)))
            self.feed(event(FilesReleased, keys=keys))
        elif r < 0.68 and len(s.workers) > 1:
            self.lose_worker()
        elif r < 0.72:
            self.join(rng.choice(["default", "default", "other"]))
        elif r < 0.76 and self.wanted:
            key = self.wanted.pop(rng.randrange(len(self.wanted)))
            self.feed(event(KeysReleased, keys=(key,)))
        elif r < 0.80:
            self.submit()
        elif r < 0.84:
            held = sorted((str(ts.key), w) for ts in s.tasks.values() for w in ts.who_has)
            if held:
                key, w = rng.choice(held)
                self.feed(event(ReplicasMissing, worker=w, keys=(key,)))
        elif r < 0.86 and len(s.workers) > 1:
            self.feed(event(WorkerDraining, worker=rng.choice(sorted(s.workers))))
        elif r < 0.89 and s.workers:
            self.rejoin()
        elif r < 0.92 and s.workers:
            self.feed(event(WorkerMemory, worker=rng.choice(sorted(s.workers)),
                            throttled=rng.random() < 0.2, rss=0, throttle_at=0, limit=0,
                            disk_used=rng.choice([0, 500])))  # fmt: skip
        elif r < 0.94:
            self.feed(event(Tick))
        elif r < 0.96:
            n = rng.choice([0, 1, 2, 3])
            policy = REGISTRY.create("replication", "fixed", {"replicas": n})
            self.feed(event(PolicyChanged, kind="replication", policy=policy))
        elif s.tasks:
            self.feed(event(CancelRequested, keys=(rng.choice(sorted(s.tasks, key=str)),)))


def interleave(make_state: Factory, seed: int) -> SchedulerState:
    """One seeded run of ``STEPS`` random steps, then every copy still asked for is
    answered (retries included: they end, as each worker fails a copy at most once)."""
    rng = random.Random(seed)
    s = make_state(
        replication=REGISTRY.create("replication", "fixed", {"replicas": rng.choice([1, 2])}),
        retry=REGISTRY.create("retry", "default", {"max_lost": 1000}),
        prune_depth=rng.choice([1, 1, 2]),
    )
    it = Interleaver(s, rng)
    for _ in range(3):
        it.join()
    it.submit()
    for _ in range(STEPS):
        it.step()
    for _ in range(1000):
        if not it.copies:
            break
        it.answer_copy()
    assert it.copies == [] and s.copying == {}  # nothing left in flight
    return s


@pytest.mark.parametrize("seed", SEEDS)
def test_random_interleavings_of_copies_losses_and_releases_keep_the_invariants(
    make_state: Factory, seed: int
) -> None:
    interleave(make_state, seed)


def test_the_random_runs_make_lose_and_fail_replicas(make_state: Factory) -> None:
    """The runs above reach what they are about (not a test that cannot fail)."""
    runs = [interleave(make_state, seed) for seed in SEEDS[:8]]
    assert sum(s.replicas_made for s in runs) > 20
    assert sum(s.replicas_failed for s in runs) > 5
    assert sum(s.recomputes_avoided for s in runs) > 0
    assert sum(len(s.copy_failed) for s in runs) > 0


# ----------------------------------------------------------------------------- one by one


def long_on_w1(s: SchedulerState) -> list[Any]:
    """w1 ran long-0 (40 s, read by use-0 once slow-0 is done); returns the commands."""
    join(s, "w1")
    submit(s, {"slow-0": [], "long-0": [], "use-0": ["long-0", "slow-0"]}, ["use-0"])
    join(s, "w2")
    join(s, "w3")
    return finish(s, "w1", "long-0", duration=40.0)


def copied(s: SchedulerState, worker: str, key: str, *, got: bool) -> list[Any]:
    return run(s, event(ReplicasCopied, worker=worker, asked=(key,), got=(key,) if got else ()))


def test_a_copy_to_a_worker_that_is_lost_is_made_again_elsewhere(make_state: Factory) -> None:
    s = make_state(unknown_long=False)
    (asked,) = of(long_on_w1(s), Replicate)
    target = asked.worker
    assert s.copying == {"long-0": {target: 100}}
    run(s, event(WorkerLeft, worker=target, cause="crash"))
    assert s.copying == {}  # it will never land: it holds nothing back
    # The shell answers the copy as failed: it is asked of the worker left.
    out = copied(s, target, "long-0", got=False)
    (again,) = of(out, Replicate)
    assert again.worker not in (target, "w1") and again.source == "w1"
    assert s.replicas_failed == 1
    copied(s, again.worker, "long-0", got=True)
    assert s.tasks["long-0"].who_has == {"w1", again.worker}


def test_a_failed_copy_is_asked_of_another_worker_never_twice_of_one(
    make_state: Factory,
) -> None:
    s = make_state(unknown_long=False)
    (first,) = of(long_on_w1(s), Replicate)
    out = copied(s, first.worker, "long-0", got=False)
    (second,) = of(out, Replicate)
    assert second.worker not in (first.worker, "w1")
    out = copied(s, second.worker, "long-0", got=False)
    assert of(out, Replicate) == []  # both other workers failed it: no third try
    assert s.replicas_failed == 2 and s.copy_failed[s.tasks["long-0"]] == {"w2", "w3"}
    story = [f for _, _, f, _, _ in s.story("long-0")]
    assert "replica-failed:w2" in story and "replica-failed:w3" in story


def test_a_failed_copy_of_an_output_nothing_needs_is_not_asked_again(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    join(s, "w2")
    join(s, "w3")
    (asked,) = of(finish(s, "w1", "long-0", duration=40.0), Replicate)
    run(s, event(KeysReleased, keys=("long-0",)))  # nobody wants it any more
    out = copied(s, asked.worker, "long-0", got=False)
    assert of(out, Replicate) == []


def test_a_replica_goes_to_the_pool_its_readers_run_in(make_state: Factory) -> None:
    """long-0's reader runs in pool gpu: its replica goes to the other gpu worker,
    though the cpu worker holds fewer bytes (a copy there would be read across pools)."""
    s = make_state()
    gpu = {"pool": "gpu"}
    join(s, "g2", pool="gpu")
    submit(s, {"pre-0": []}, ["pre-0"], attrs={"pre-0": gpu})
    finish(s, "g2", "pre-0", nbytes=5 * MB)  # 1 s: no replica; g2 holds 5 MiB now
    join(s, "g1", pool="gpu")
    join(s, "c1", pool="cpu")
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"],
           attrs={"long-0": gpu, "use-0": gpu})  # fmt: skip
    holder = worker_of(s, "long-0")
    out = finish(s, holder, "long-0", duration=40.0)
    assert [c.worker for c in of(out, Replicate)] == [({"g1", "g2"} - {holder}).pop()]
    assert s.held_bytes.get("c1", 0) < s.held_bytes["g2"]


def test_without_a_worker_of_the_readers_pool_a_replica_goes_to_another(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "g1", pool="gpu", cores=2)
    gpu = {"pool": "gpu"}
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"],
           attrs={"long-0": gpu, "use-0": gpu})  # fmt: skip
    join(s, "c1", pool="cpu")
    out = finish(s, "g1", "long-0", duration=40.0)
    assert [c.worker for c in of(out, Replicate)] == ["c1"]


def test_after_a_holder_is_lost_a_worker_that_failed_a_copy_may_get_one_again(
    make_state: Factory,
) -> None:
    """A copy may fail because its source went away: once a holder is lost, the
    workers that failed a copy of the output are asked again."""
    s = make_state(replication=REGISTRY.create("replication", "fixed", {"replicas": 2}))
    join(s, "w1")
    submit(s, {"long-0": [], "use-0": ["long-0"]}, ["use-0"])
    join(s, "w2")
    join(s, "w3")
    asked = sorted(c.worker for c in of(finish(s, "w1", "long-0", duration=40.0), Replicate))
    assert asked == ["w2", "w3"]
    copied(s, "w2", "long-0", got=True)
    copied(s, "w3", "long-0", got=False)  # w1 was dying: nowhere else to try
    assert s.copy_failed[s.tasks["long-0"]] == {"w3"}
    join(s, "w4")
    out = run(s, event(WorkerLeft, worker="w1", cause="crash"))
    assert s.tasks["long-0"].who_has == {"w2"}  # kept by its replica
    assert sorted(c.worker for c in of(out, Replicate)) == ["w3", "w4"]
    assert all(c.source == "w2" for c in of(out, Replicate))
