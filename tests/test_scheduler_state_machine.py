"""Tests of the scheduler's pure core (actors/scheduler_state.py): the transition table,
the story of a task, and the Hypothesis state machine that drives random workloads
and checks the invariants after every step.

No event loop, no threads, no clock: every test feeds events to
``SchedulerState.handle`` and checks the exact commands it returns. The autouse fixture
``make_state`` (tests/helpers.py) builds the states and runs ``validate()`` (the
invariant check) on every one of them when the test ends; the ``run`` helper also
validates after each step. Graphs come from :func:`tests.helpers.graph`, a
``{key: [dependency keys]}`` table turned into specs by ``build_specs`` as the client does.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from actors.protocol import TaskResult
from actors.registry import FilesDropped, FileTable
from actors.scheduler_events import (
    CancelOnWorker,
    CancelRequested,
    Command,
    DropData,
    Event,
    Execute,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    KeyCancelled,
    KeyDone,
    KeyErred,
    KeysReleased,
    PolicyChanged,
    Suspended,
    TasksFinished,
    TasksRunning,
    Tick,
    WorkerAway,
    WorkerDraining,
    WorkerHeld,
    WorkerJoined,
    WorkerLeft,
    WorkerUndrained,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import ACTIVE, TRANSITIONS, SchedulerState
from policies import REGISTRY
from runtime.errors import (
    DependencyFailed,
    InvalidTransition,
)
from runtime.graph import Key, build_specs
from tests.helpers import (
    GB,
    Factory,
    event,
    graph,
    join,
    make_state,
    result,
    run,
    specs_for,
    states,
    submit,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


# ----------------------------------------------------------------------------- transitions, story


def test_an_invalid_transition_raises_with_the_story(make_state: Factory) -> None:
    s = make_state()
    cmds = submit(s, {"a": []}, ["a"])
    ts = s.tasks["a"]
    assert ("queued", "memory") not in TRANSITIONS
    with pytest.raises(InvalidTransition) as info:
        s._set(ts, "memory")
    err = info.value
    assert (err.key, err.start, err.finish) == ("a", "queued", "memory")
    assert err.story == [("a", "new", "queued", cmds[0].stimulus_id, err.story[0][4])]
    assert "queued -> memory" in str(err) and "report" in str(err)
    assert ts.state == "queued"  # nothing changed


def test_every_allowed_transition_starts_and_ends_in_a_known_state() -> None:
    known = {"new", "waiting", "queued", "processing", "memory", "released", "erred"}
    known |= {"cancelled"}
    assert {a for a, _ in TRANSITIONS} <= known and {b for _, b in TRANSITIONS} <= known
    assert all(b != "new" for _, b in TRANSITIONS)


def test_story_lists_a_tasks_transitions_with_their_stimulus_ids(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    sub = event(GraphSubmitted, specs=specs_for(s, {"a": [], "b": ["a"]}, ["b"]), wanted=("b",))
    run(s, sub)
    fin = event(TasksFinished, worker="w1", results=(result("a"),))
    run(s, fin)
    assert s.story("a") == [
        ("a", "new", "queued", sub.stimulus_id, sub.now),
        ("a", "queued", "processing", sub.stimulus_id, sub.now),
        ("a", "processing", "runs-on:w1", sub.stimulus_id, sub.now),
        ("a", "processing", "memory", fin.stimulus_id, fin.now),
    ]
    assert [e[1:4] for e in s.story("b")] == [
        ("new", "waiting", sub.stimulus_id),
        ("waiting", "queued", fin.stimulus_id),
        ("queued", "processing", fin.stimulus_id),
        ("processing", "runs-on:w1", fin.stimulus_id),
    ]
    assert len(s.story("a", "b")) == 8
    assert s.story("nope") == []


def test_handle_refuses_unknown_events(make_state: Factory) -> None:
    s = make_state()
    with pytest.raises(TypeError):
        s.handle(event(Event))


# ----------------------------------------------------------------------------- random workloads


class RandomWorkload(RuleBasedStateMachine):
    """Random graphs, workers that come and go (drained, and taken back while they
    drain), random outcomes, cancels and releases, speculative copies (eager: past the
    p90 alone, up to two per task) and their outcomes, retries held for a backoff, with
    the registry core answering the FileFacts. ``validate()`` after every step;
    ``settle`` runs everything to the end and checks every wanted key's outcome."""

    def __init__(self) -> None:
        super().__init__()
        eager = {"min_finished": 1, "factor": 1.0, "min_excess": 0.0, "max_copies": 2}
        self.state = SchedulerState(
            SchedulerConfig(saturation=1.0),
            speculation=REGISTRY.create("speculation", "idle-tail", eager),
        )
        self.table = FileTable()
        self.dropped: list[Key] = []  #: released by the registry, not yet told
        self.wants: Counter[Key] = Counter()  #: the test client's holds per key
        self.note: dict[Key, str] = {}  #: last done/erred/cancelled message per key
        self.n_graphs = 0
        self.n_workers = 0

    # -- plumbing ----------------------------------------------------------------------
    def handle(self, ev: Event) -> list[Command]:
        cmds = self.state.handle(ev)
        for c in cmds:
            if isinstance(c, FileFacts):
                for rc in self.table.handle(c.facts):
                    if isinstance(rc, FilesDropped):
                        self.dropped.extend(rc.keys)
            elif isinstance(c, KeyDone):
                assert self.state.tasks[c.key].state == "memory"
                assert c.worker in self.state.tasks[c.key].who_has
                self.note[c.key] = "memory"
            elif isinstance(c, KeyErred):
                self.note[c.key] = "erred"
                if c.root != c.key:
                    assert isinstance(c.error, DependencyFailed)
                    assert c.error.dependency == str(c.root)
            elif isinstance(c, KeyCancelled):
                self.note[c.key] = "cancelled"
            elif isinstance(c, Execute):
                assert not self.state.workers[c.worker].suspended, ("sent to a suspended", c)
                ws = self.state.workers[c.worker]
                # (a worker of a pool with tasks_per_worker is drained with its last try)
                assert not ws.draining or self.state.tasks_left(ws) <= 0, ("sent to a draining", c)
                for t in c.tasks:
                    ts = self.state.tasks[t.key]
                    assert ts.worker == c.worker or c.worker in self.state.copies[ts]
        self.state.validate()
        return cmds

    def with_state(self, *names: str) -> list[Key]:
        return [k for k, ts in self.state.tasks.items() if ts.state in names]

    def pick(self, rnd: random.Random, items: Iterable[Any]) -> Any:
        pool = sorted(items, key=str)
        return rnd.choice(pool) if pool else None

    # -- rules -------------------------------------------------------------------------
    @rule(seed=st.integers(0, 2**32 - 1), size=st.integers(20, 60))
    def submit(self, seed: int, size: int) -> None:
        rnd = random.Random(seed)
        g = self.n_graphs
        self.n_graphs += 1
        existing = sorted(self.state.tasks, key=str)
        table: dict[Key, list[Key]] = {}
        for i in range(size):
            deps = rnd.sample(list(table), min(len(table), rnd.choice([0, 1, 1, 2, 3])))
            if existing and rnd.random() < 0.05:
                deps.append(rnd.choice(existing))  # a result of an earlier graph
            table[f"g{g}{'abc'[i % 3]}-{i}"] = deps
        keys = list(table)
        wanted = [k for k in keys if rnd.random() < 0.2] or [keys[-1]]
        specs = build_specs(
            graph(table),
            wanted,
            known=lambda k: k in self.state.tasks,
            retries=rnd.choice([0, 0, 1]),
        )
        # dask.order breaks ties by string hashes, which differ between processes; a
        # fixed order keeps the examples reproducible.
        position = {k: i for i, k in enumerate(table)}
        specs = {k: dataclasses.replace(v, order=position[k]) for k, v in specs.items()}
        self.handle(event(GraphSubmitted, specs=specs, wanted=tuple(wanted)))
        self.wants.update(wanted)

    @precondition(lambda m: m.with_state("erred", "cancelled"))
    @rule(seed=st.integers(0, 2**32 - 1))
    def resubmit_failed(self, seed: int) -> None:
        rnd = random.Random(seed)
        failed = [k for k, ts in self.state.tasks.items() if ts.state in ("erred", "cancelled")]
        key = self.pick(rnd, failed)
        if key is None:
            return
        spec = self.state.tasks[key].spec
        self.handle(event(GraphSubmitted, specs={key: spec}, wanted=(key,)))
        self.wants[key] += 1

    @rule(cores=st.integers(1, 3), large=st.booleans())
    def join(self, cores: int, large: bool = False) -> None:
        """A worker joins, with 1 GiB (or 2 GiB: an oom retry's larger worker)."""
        if len(self.state.workers) >= 5:
            return
        wid = f"w{self.n_workers}"
        self.n_workers += 1
        memory = 2 * GB if large else GB
        self.handle(event(WorkerJoined, worker=wid, cores=cores, memory=memory))

    @precondition(lambda m: m.state.workers)
    @rule(
        seed=st.integers(0, 2**32 - 1),
        cause=st.sampled_from(["preempted", "oom", "crash", "unknown"]),
    )
    def leave(self, seed: int, cause: str) -> None:
        wid = self.pick(random.Random(seed), self.state.workers)
        if wid is not None:
            self.handle(event(WorkerLeft, worker=wid, cause=cause))

    @precondition(lambda m: m.state.workers)
    @rule(seed=st.integers(0, 2**32 - 1), suspended=st.booleans())
    def suspend(self, seed: int, suspended: bool) -> None:
        """Slurm suspends (or resumes) a worker's block: suspended, it takes nothing new."""
        wid = self.pick(random.Random(seed), self.state.workers)
        if wid is None:
            return
        before = {k for k, ts in self.state.tasks.items() if ts.worker == wid}
        cmds = self.handle(event(Suspended, workers=(wid,), suspended=suspended))
        if suspended:
            assert cmds == [] and wid not in self.state.free
            assert {k for k, ts in self.state.tasks.items() if ts.worker == wid} == before

    @precondition(lambda m: m.state.workers)
    @rule(seed=st.integers(0, 2**32 - 1))
    def drop(self, seed: int) -> None:
        """A worker's connection drops, its id held for its rejoin: away, it takes
        nothing new and keeps what it has (``leave`` may lose it meanwhile)."""
        wid = self.pick(random.Random(seed), self.state.workers)
        if wid is None:
            return
        before = {k for k, ts in self.state.tasks.items() if ts.worker == wid}
        assert self.handle(event(WorkerAway, worker=wid)) == []
        assert wid not in self.state.free and self.state.workers[wid].away is not None
        assert {k for k, ts in self.state.tasks.items() if ts.worker == wid} == before

    @precondition(lambda m: any(ws.away is not None for ws in m.state.workers.values()))
    @rule(seed=st.integers(0, 2**32 - 1))
    def rejoin(self, seed: int) -> None:
        """An away worker rejoins within its grace: it registers again and says what
        it has (all it was sent reached it), and takes work again."""
        away = [w for w, ws in self.state.workers.items() if ws.away is not None]
        self._rejoin(self.pick(random.Random(seed), away))

    def _rejoin(self, wid: str) -> None:
        ws = self.state.workers[wid]
        before = {k for k, ts in self.state.tasks.items() if ts.worker == wid}
        self.handle(event(WorkerJoined, worker=wid, cores=ws.cores, memory=ws.memory))
        assert ws.away is None
        active = frozenset(ts.key for ts in ws.processing | ws.copies)
        held = tuple((ts.key, ts.nbytes or 0) for ts in ws.has_what)
        self.handle(event(WorkerHeld, worker=wid, active=active, held=held))
        assert before <= {k for k, ts in self.state.tasks.items() if ts.worker == wid}

    @precondition(lambda m: m.state.workers)
    @rule(seed=st.integers(0, 2**32 - 1))
    def drain(self, seed: int) -> None:
        """A worker is drained (a scale-in, an operator): it takes nothing new."""
        wid = self.pick(random.Random(seed), self.state.workers)
        if wid is not None:
            self.handle(event(WorkerDraining, worker=wid))
            assert wid not in self.state.free

    @precondition(lambda m: any(ws.draining for ws in m.state.workers.values()))
    @rule(seed=st.integers(0, 2**32 - 1))
    def undrain(self, seed: int) -> None:
        """A draining worker is taken back (its pool wants it again): unless it was
        retired (or leaves), it takes tasks again; else nothing changes."""
        draining = [w for w, ws in self.state.workers.items() if ws.draining]
        wid = self.pick(random.Random(seed), draining)
        ws = self.state.workers[wid]
        refused = self.state.undrain_refusal(ws)
        self.handle(event(WorkerUndrained, worker=wid))
        assert ws.draining == bool(refused), (wid, refused)
        assert refused or wid not in self.state.draining

    @precondition(lambda m: m.state.workers)
    @rule(seed=st.integers(0, 2**32 - 1), cores=st.integers(1, 3))
    def churn(self, seed: int, cores: int) -> None:
        """One worker is preempted and a fresh one takes its place."""
        self.leave(seed, "preempted")
        self.join(cores)

    @precondition(lambda m: m.with_state("processing"))
    @rule(
        seed=st.integers(0, 2**32 - 1),
        outcome=st.sampled_from(["ok", "ok", "ok", "ok", "error", "timeout", "missing", "oom"]),
    )
    def finish(self, seed: int, outcome: str) -> None:
        rnd = random.Random(seed)
        busy = [ts for ts in self.state.tasks.values() if ts.state == "processing"]
        ts = self.pick(rnd, busy)
        if ts is None:
            return
        wid = ts.worker
        in_memory = [d for d in ts.deps if d.state == "memory"]
        fetched = tuple(d.key for d in in_memory if rnd.random() < 0.5 and wid not in d.who_has)
        if outcome == "missing":
            holders = [(d.key, w) for d in in_memory for w in sorted(d.who_has) if w != wid]
            if not holders:
                outcome = "ok"
            else:
                res = TaskResult(ts.key, "missing", missing=(rnd.choice(holders),))
                self.handle(event(TasksFinished, worker=wid, results=(res,)))
                return
        error = ValueError(f"boom {ts.key}") if outcome != "ok" else None
        start = rnd.random()
        res = TaskResult(
            ts.key,
            outcome,  # type: ignore[arg-type]
            start=start,
            stop=start + rnd.random(),
            nbytes=rnd.randrange(1, 1000),
            error=error,
            fetched=fetched if outcome == "ok" else (),
        )
        self.handle(event(TasksFinished, worker=wid, results=(res,)))

    @rule(seed=st.integers(0, 2**32 - 1), stale=st.booleans())
    def running(self, seed: int, stale: bool) -> None:
        """A worker says a try (a first try or a copy) has executed a while (``stale``:
        of an earlier try there: nothing changes)."""
        rnd = random.Random(seed)
        busy = [ts for ts in self.state.tasks.values() if ts.state == "processing"]
        ts = self.pick(rnd, busy)
        if ts is None:
            return
        wid = self.pick(rnd, [ts.worker, *self.state.copies.get(ts, ())])
        attempt = self.state._attempt_on(ts, wid)
        before = ts.started
        said = ((ts.key, attempt + 1 if stale else attempt, rnd.random() * 3),)
        self.handle(event(TasksRunning, worker=wid, started=said))
        if stale:
            assert ts.started == before
        elif wid == ts.worker:
            assert ts.started is not None and ts.sent <= ts.started

    @rule(fresh=st.booleans())
    def tick(self, fresh: bool) -> None:
        """Time passes: idle workers may get speculative copies (``fresh``: a worker
        joins first, idle unless ready work is waiting for it)."""
        if fresh:
            self.join(1)
        self.handle(event(Tick))

    @precondition(lambda m: m.state.copies)
    @rule(
        seed=st.integers(0, 2**32 - 1),
        outcome=st.sampled_from(["ok", "ok", "error", "cancelled", "missing"]),
    )
    def finish_copy(self, seed: int, outcome: str) -> None:
        """A speculative copy ends: it wins, fails, is cancelled or misses an input."""
        rnd = random.Random(seed)
        ts = self.pick(rnd, self.state.copies)
        if ts is None:
            return
        wid = self.pick(rnd, self.state.copies[ts])
        first = ts.worker
        if outcome == "missing":
            holders = [(d.key, w) for d in ts.deps for w in sorted(d.who_has) if w != wid]
            if not holders:
                outcome = "error"
            else:
                res = TaskResult(ts.key, "missing", missing=(rnd.choice(holders),))
                self.handle(event(TasksFinished, worker=wid, results=(res,)))
                assert ts.worker == first and wid not in self.state.copies.get(ts, ())
                return
        error = ValueError(f"boom {ts.key}") if outcome == "error" else None
        res = TaskResult(ts.key, outcome, start=0.0, stop=0.5, nbytes=7, error=error)  # type: ignore[arg-type]
        cmds = self.handle(event(TasksFinished, worker=wid, results=(res,)))
        if outcome == "ok":  # the copy won: the first try is cancelled, the task done
            assert ts.state == "memory" and wid in ts.who_has
            assert (first, (ts.key,)) in [
                (c.worker, c.keys) for c in cmds if isinstance(c, CancelOnWorker)
            ]
            assert ts.tries[-1].cause == "speculative"
        else:  # the first try runs on
            assert ts.state == "processing" and ts.worker == first

    @precondition(lambda m: m.state.workers and m.with_state("erred", "cancelled"))
    @rule(seed=st.integers(0, 2**32 - 1))
    def stale_result(self, seed: int) -> None:
        rnd = random.Random(seed)
        done = [k for k, ts in self.state.tasks.items() if ts.state in ("cancelled", "erred")]
        key = self.pick(rnd, done)
        wid = self.pick(rnd, self.state.workers)
        if key is None or wid is None:
            return
        res = TaskResult(key, "ok", nbytes=1)
        before = states(self.state)
        cmds = self.handle(event(TasksFinished, worker=wid, results=(res,)))
        assert [(c.worker, c.keys) for c in cmds if isinstance(c, DropData)] == [(wid, (key,))]
        assert states(self.state) == before

    @precondition(lambda m: m.with_state(*ACTIVE))
    @rule(seed=st.integers(0, 2**32 - 1))
    def cancel(self, seed: int) -> None:
        active = [k for k, ts in self.state.tasks.items() if ts.state in ACTIVE]
        key = self.pick(random.Random(seed), active)
        if key is not None:
            self.handle(event(CancelRequested, keys=(key,), reason="random"))

    @precondition(lambda m: any(m.wants.values()))
    @rule(seed=st.integers(0, 2**32 - 1))
    def release(self, seed: int) -> None:
        key = self.pick(random.Random(seed), [k for k, n in self.wants.items() if n])
        if key is not None:
            self.wants[key] -= 1
            self.handle(event(KeysReleased, keys=(key,)))

    @precondition(lambda m: m.dropped)
    @rule(n=st.integers(1, 5))
    def deliver_releases(self, n: int) -> None:
        keys, self.dropped = self.dropped[:n], self.dropped[n:]
        if keys:
            self.handle(event(FilesReleased, keys=tuple(keys)))

    @rule(name=st.sampled_from(["locality", "round-robin", "least-loaded"]))
    def placement(self, name: str) -> None:
        policy = REGISTRY.create("placement", name)
        self.handle(event(PolicyChanged, kind="placement", policy=policy))

    @rule(backoff=st.sampled_from([0.0, 1.5, 3.0]))
    def retry_backoff(self, backoff: float) -> None:
        """The default retry policy with a backoff (events are 1 s apart: a retry is
        held over a few of them, while inputs are lost, cancels and releases come)."""
        policy = REGISTRY.create("retry", "default", {"backoff": backoff, "max_backoff": 5.0})
        self.handle(event(PolicyChanged, kind="retry", policy=policy))

    @rule()
    def settle(self) -> None:
        """All workers present, only ok outcomes: everything must come to an end."""
        for wid in sorted(w for w, ws in self.state.workers.items() if ws.draining):
            self.handle(event(WorkerUndrained, worker=wid))  # taken back, if not retired
        if all(ws.draining for ws in self.state.workers.values()):
            wid = f"w{self.n_workers}"
            self.n_workers += 1
            self.handle(event(WorkerJoined, worker=wid, cores=2, memory=GB))
        for wid in sorted(w for w, ws in self.state.workers.items() if ws.away is not None):
            self._rejoin(wid)  # back: they take tasks again
        suspended = tuple(w for w, ws in sorted(self.state.workers.items()) if ws.suspended)
        if suspended:  # resumed: they take tasks again
            self.handle(event(Suspended, workers=suspended, suspended=False))
        for _ in range(10_000):
            progressed = False
            if self.dropped:
                keys, self.dropped = tuple(self.dropped), []
                self.handle(event(FilesReleased, keys=keys))
                progressed = True
            for wid in sorted(self.state.workers):
                ws = self.state.workers.get(wid)
                if ws is None or not ws.processing:
                    continue
                results = tuple(
                    TaskResult(ts.key, "ok", start=0.0, stop=0.01, nbytes=10)
                    for ts in sorted(ws.processing, key=lambda t: str(t.key))
                )
                self.handle(event(TasksFinished, worker=wid, results=results))
                progressed = True
            if not progressed and (self.state.held or self.state.retry_held):
                # tasks backing off, or retries held for their backoff: time passes
                self.handle(event(Tick))
                progressed = True
            if not progressed:
                break
        stuck = {
            (k, ts.state): [(d.key, d.state) for d in ts.deps if d.state != "memory"]
            for k, ts in self.state.tasks.items()
            if ts.state in ACTIVE
        }
        assert not stuck, ("stuck tasks and their missing inputs", stuck)
        for key, n in self.wants.items():
            if not n:
                continue
            ts = self.state.tasks.get(key)
            assert ts is not None, key
            assert ts.state in ("memory", "erred", "cancelled"), (ts, self.state.story(key))
            assert self.note.get(key) == ts.state, (ts, self.note.get(key))


def test_random_workloads_keep_the_invariants_and_finish() -> None:
    run_state_machine_as_test(
        RandomWorkload,
        settings=settings(
            max_examples=300,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,  # the same examples on every run
            database=None,
            # Shrinking these graphs takes close to a minute; a failure prints its full
            # step list and the story of the stuck or wrong tasks instead.
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target),
            suppress_health_check=list(HealthCheck),
        ),
    )
