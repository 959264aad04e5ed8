"""Tests of the file registry's pure core, ``FileTable`` (actors/registry.py).

``FileTable.handle(facts)`` takes the scheduler's absolute facts about task outputs and
answers with ``DropReplicas`` (one per worker) and ``FilesDropped`` (back to the
scheduler). No actors, no event loop.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.protocol import FileFact, TaskResult
from actors.registry import DropReplicas, FilesDropped, FileTable
from actors.scheduler_events import (
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    KeysReleased,
    TasksFinished,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from runtime.graph import Task, TaskRef, build_specs
from tests.helpers import Loop, event


def fact(
    key: str,
    state: Any = "created",
    nbytes: int = 100,
    replicas: tuple[str, ...] = ("w1",),
    consumers: int = 0,
    wanted: bool = False,
) -> FileFact:
    return FileFact(key, state, nbytes, replicas, consumers, wanted)


def nonzero(stored: dict[str, int]) -> dict[str, int]:
    """Bytes per worker, leaving out workers that hold nothing."""
    return {w: b for w, b in stored.items() if b}


def test_a_created_file_with_consumers_is_kept() -> None:
    t = FileTable()
    assert t.handle((fact("a", consumers=2),)) == []
    info = t.files["a"]
    assert (info.state, info.replicas, info.consumers, info.wanted) == (
        "created",
        ("w1",),
        2,
        False,
    )
    assert t.stored == {"w1": 100}
    assert t.released_total == 0


def test_a_file_nobody_needs_is_dropped_from_every_replica() -> None:
    t = FileTable()
    cmds = t.handle((fact("a", nbytes=50, replicas=("w1", "w2")),))
    assert cmds == [
        DropReplicas("w1", ("a",)),
        DropReplicas("w2", ("a",)),
        FilesDropped(("a",)),
    ]
    info = t.files["a"]
    assert info.state == "released" and info.replicas == ()
    assert nonzero(t.stored) == {}
    assert t.released_total == 1 and t.released_bytes == 100  # two replicas of 50


def test_a_file_is_dropped_when_its_last_consumer_is_done() -> None:
    t = FileTable()
    assert t.handle((fact("a", "pending", 0, (), consumers=2),)) == []
    assert t.handle((fact("a", consumers=2),)) == []
    assert t.handle((fact("a", consumers=1),)) == []
    assert t.stored == {"w1": 100}
    assert t.handle((fact("a", consumers=0),)) == [
        DropReplicas("w1", ("a",)),
        FilesDropped(("a",)),
    ]
    assert nonzero(t.stored) == {}


def test_a_wanted_file_is_never_dropped() -> None:
    t = FileTable()
    assert t.handle((fact("a", consumers=0, wanted=True),)) == []
    assert t.handle((fact("a", consumers=3, wanted=True),)) == []
    assert t.handle((fact("a", consumers=0, wanted=True, replicas=("w1", "w2")),)) == []
    assert t.files["a"].state == "created"
    # The client let go of it: now it goes.
    cmds = t.handle((fact("a", consumers=0, wanted=False, replicas=("w1", "w2")),))
    assert cmds[-1] == FilesDropped(("a",))
    assert sorted(c.worker for c in cmds if isinstance(c, DropReplicas)) == ["w1", "w2"]


def test_pending_and_released_files_are_not_dropped() -> None:
    t = FileTable()
    assert t.handle((fact("p", "pending", 0, ()),)) == []
    assert t.handle((fact("r", "released", 10, ()),)) == []
    assert t.files["p"].state == "pending" and t.files["r"].state == "released"
    assert t.released_total == 0


def test_drops_are_grouped_per_worker() -> None:
    t = FileTable()
    cmds = t.handle(
        (
            fact("a", replicas=("w1", "w2")),
            fact("b", replicas=("w1",)),
            fact("kept", replicas=("w1",), consumers=1),
            fact("c", replicas=("w3",), wanted=True),
        )
    )
    assert cmds == [
        DropReplicas("w1", ("a", "b")),
        DropReplicas("w2", ("a",)),
        FilesDropped(("a", "b")),
    ]
    assert nonzero(t.stored) == {"w1": 100, "w3": 100}


def test_stored_bytes_follow_replicas_and_sizes() -> None:
    t = FileTable()
    t.handle((fact("a", nbytes=10, consumers=1), fact("b", nbytes=5, consumers=1)))
    assert t.stored == {"w1": 15}
    t.handle((fact("a", nbytes=10, replicas=("w1", "w2"), consumers=1),))  # copied to w2
    assert t.stored == {"w1": 15, "w2": 10}
    t.handle((fact("b", nbytes=7, consumers=1),))  # size corrected
    assert t.stored == {"w1": 17, "w2": 10}
    t.handle((fact("a", nbytes=10, replicas=("w2",), consumers=1),))  # w1 left
    assert t.stored == {"w1": 7, "w2": 10}
    t.handle((fact("a", "pending", 10, (), consumers=1),))  # lost everywhere
    # w2 holds nothing now: not listed (status() listed every worker that ever held an
    # output, at 0 B: 31 entries after an audit's churn of killed and replaced workers)
    assert t.stored == {"w1": 7}
    assert t.summary()["stored_bytes"] == {"w1": 7}


def test_forgotten_files_leave_the_table() -> None:
    t = FileTable()
    t.handle((fact("a", "released", 100, ()), fact("b", consumers=1)))
    assert t.handle((fact("a", "forgotten", 100, ()),)) == []
    assert "a" not in t.files
    # Forgotten while still stored (the scheduler forgot it first): free the copies,
    # but the scheduler needs no FilesDropped for a key it already forgot.
    assert t.handle((fact("b", "forgotten", 100, ("w1", "w2")),)) == [
        DropReplicas("w1", ("b",)),
        DropReplicas("w2", ("b",)),
    ]
    assert t.files == {} and nonzero(t.stored) == {}
    assert t.released_total == 0
    # Forgetting a key it never saw is harmless.
    assert t.handle((fact("zzz", "forgotten", 0, ()),)) == []


def test_a_recomputed_file_can_be_released_again() -> None:
    t = FileTable()
    t.handle((fact("a"),))
    assert t.files["a"].state == "released"
    assert t.handle((fact("a", "pending", 100, (), consumers=1),)) == []
    assert t.handle((fact("a", replicas=("w3",), consumers=1),)) == []
    assert t.stored["w3"] == 100
    assert t.handle((fact("a", replicas=("w3",)),)) == [
        DropReplicas("w3", ("a",)),
        FilesDropped(("a",)),
    ]
    assert t.released_total == 2 and t.released_bytes == 200


def test_summary() -> None:
    t = FileTable()
    t.handle(
        (
            fact("a", nbytes=10, replicas=("w1", "w2"), consumers=1),
            fact("b", "pending", 0, ()),
            fact("c", nbytes=30, replicas=("w2",)),
            fact("d", nbytes=5, wanted=True),
        )
    )
    assert t.summary() == {
        "files": 4,
        "states": {"created": 2, "pending": 1, "released": 1},
        "stored_bytes": {"w1": 15, "w2": 10},
        "released": 1,
        "released_bytes": 30,
        "file_outputs": 0,
        "file_bytes": 0,
    }


def test_the_facts_of_a_scheduler_run_release_intermediates_only() -> None:
    def fn(*args: Any) -> None:
        return None

    table = {"a": [], "b": ["a"], "c": ["b"]}
    dsk = {k: Task(k, fn, *(TaskRef(d) for d in deps)) for k, deps in table.items()}
    ids = itertools.count()
    s = SchedulerState()
    t = FileTable()
    dropped: list[Any] = []

    def feed(ev_cls: Any, **kw: Any) -> None:
        cmds = s.handle(ev_cls(stimulus_id=f"s{next(ids)}", now=0.0, **kw))
        for c in cmds:
            if isinstance(c, FileFacts):
                for rc in t.handle(c.facts):
                    if isinstance(rc, FilesDropped):
                        dropped.extend(rc.keys)
                        feed(FilesReleased, keys=rc.keys)
        s.validate()

    feed(WorkerJoined, worker="w1", cores=1, memory=2**30)
    feed(GraphSubmitted, specs=build_specs(dsk, ["c"]), wanted=("c",))
    for key, size in (("a", 1), ("b", 2), ("c", 4)):
        feed(TasksFinished, worker="w1", results=(TaskResult(key, "ok", nbytes=size),))
    assert dropped == ["a", "b"]  # c is wanted
    assert t.summary()["stored_bytes"] == {"w1": 4}
    assert {k: i.state for k, i in t.files.items()} == {
        "a": "released",
        "b": "released",
        "c": "created",
    }


@st.composite
def scheduler_fact(draw: st.DrawFn) -> FileFact:
    """A fact the scheduler can send: only created (or just-forgotten) outputs have
    replicas."""
    state = draw(st.sampled_from(["pending", "created", "released", "forgotten"]))
    workers = st.lists(st.sampled_from(["w1", "w2", "w3"]), unique=True, min_size=1)
    replicas = tuple(draw(workers)) if state in ("created", "forgotten") else ()
    if state == "forgotten" and draw(st.booleans()):
        replicas = ()
    return FileFact(
        draw(st.sampled_from("abcde")),
        state,  # type: ignore[arg-type]
        draw(st.integers(0, 1000)),
        replicas,
        draw(st.integers(0, 2)),
        draw(st.booleans()),
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(scheduler_fact(), max_size=6, unique_by=lambda f: f.key).map(tuple),
        max_size=12,
    )
)
def test_random_facts_keep_the_accounting_right(batches: list[tuple[FileFact, ...]]) -> None:
    t = FileTable()
    for batch in batches:
        cmds = t.handle(batch)
        dropped = next((c.keys for c in cmds if isinstance(c, FilesDropped)), ())
        for key in dropped:
            # Only a created output nobody needs is released, and it stays known.
            assert any(
                f.key == key and f.state == "created" and not f.consumers and not f.wanted
                for f in batch
            ), key
            assert key in t.files
        for c in cmds:
            if isinstance(c, DropReplicas):
                assert len(set(c.keys)) == len(c.keys)
        # Stored bytes are exactly the replicas the table knows about.
        expect: dict[str, int] = {}
        for info in t.files.values():
            for w in info.replicas:
                expect[w] = expect.get(w, 0) + info.nbytes
        assert nonzero(t.stored) == nonzero(expect)
        for info in t.files.values():
            assert info.state != "forgotten"
            if info.state == "released":
                assert info.replicas == ()
            if info.state == "created":
                assert info.consumers or info.wanted


def _fn(*args: Any) -> int:
    return 1


def test_an_output_wanted_again_during_its_release_is_let_go_after_its_rerun() -> None:
    # Two clients compute the same key: one lets it go, the registry releases it, and
    # the other's submission arrives before the registry's answer. The scheduler runs it
    # again; once the second client lets it go too, its output must leave the worker
    # (it stayed there for good, the registry taking the new output's facts for stale).
    w = Loop(SchedulerState(), hold=True)
    w.run(event(WorkerJoined, worker="w1", cores=1, memory=2**30))
    w.run(event(GraphSubmitted, specs=build_specs({"a": Task("a", _fn)}, ["a"]), wanted=("a",)))
    w.finish("w1", "a", nbytes=8)
    w.run(event(KeysReleased, keys=("a",)))  # the first client lets go: the registry decides
    assert w.answers == [("a",)] and w.drops == [("w1", ("a",))]
    w.run(event(GraphSubmitted, specs={}, wanted=("a",)))  # the second client, before the answer
    w.deliver()  # the output is gone: run again
    assert w.state.tasks["a"].state == "processing"
    assert w.table.files["a"].state == "pending"
    w.finish("w1", "a", nbytes=8)
    assert w.table.files["a"].state == "created"
    assert w.table.summary()["stored_bytes"] == {"w1": 8}
    w.run(event(KeysReleased, keys=("a",)))  # the second client lets go
    assert w.drops == [("w1", ("a",)), ("w1", ("a",))]
    assert w.table.summary()["stored_bytes"] == {}
    w.deliver()
    assert "a" not in w.state.tasks


def test_an_input_released_then_run_again_for_a_lost_output_is_let_go_again() -> None:
    # a -> b, b wanted: a's output is released once b has it. b's worker is lost, so b
    # runs again, and a with it. Once b is done again, a's new output must be released
    # too (it stayed on the worker, the registry taking its facts for stale).
    w = Loop(SchedulerState(), hold=True)
    w.run(event(WorkerJoined, worker="w1", cores=1, memory=2**30))
    dsk = {"a": Task("a", _fn), "b": Task("b", _fn, TaskRef("a"))}
    w.run(event(GraphSubmitted, specs=build_specs(dsk, ["b"]), wanted=("b",)))
    w.finish("w1", "a", nbytes=8)
    w.finish("w1", "b", nbytes=8)
    w.deliver()
    assert w.state.tasks["a"].state == "released" and w.drops == [("w1", ("a",))]
    w.run(event(WorkerJoined, worker="w2", cores=1, memory=2**30))
    w.run(event(WorkerLeft, worker="w1", cause="crash"))
    assert w.state.tasks["a"].state == "processing"
    w.finish("w2", "a", nbytes=8)
    w.finish("w2", "b", nbytes=8)
    assert w.drops == [("w1", ("a",)), ("w2", ("a",))]
    assert w.table.summary()["stored_bytes"] == {"w2": 8}  # b's alone
