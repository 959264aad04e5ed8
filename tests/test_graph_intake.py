"""A large graph is taken in by pieces, with the event loop and other messages between
them (before, a survey-scale submission stalled a manager's loop for seconds: the
manager held its mailbox while it validated the graph in a thread, and the scheduler's
core took the whole graph as one event).

- The manager validates a large graph in a thread while it goes on with other messages;
  the requests that must follow a submission (the next submission, releases, a client
  gone, cancels) wait for it, in the order they came.
- ``runtime.graph.in_pieces`` cuts the specs in dependency order; the scheduler takes
  one piece per message, and a release or cancel that comes meanwhile is carried out
  once the graph is whole. An output a later piece reads is kept for it (``hold``).
- A refused graph (missing keys, cycles) is refused whole: nothing of it is kept.

Core tests feed ``SchedulerState`` directly (the ``make_state`` fixture validates every
state); cluster tests are gated on events and bounded by ``fail_after``.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import runtime.graph
from actors.scheduler import Scheduler
from actors.scheduler_events import (
    CancelOnWorker,
    CancelRequested,
    Execute,
    GraphSubmitted,
    KeyCancelled,
    KeyDone,
    KeysReleased,
)
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import CancelledError as CorralCancelledError
from runtime.errors import CycleError, MissingKeysError
from runtime.graph import Key, Task, TaskRef, build_specs, in_pieces
from runtime.messages import (
    CancelRequest,
    ClientCame,
    ClientGone,
    ReleaseKeysRequest,
    StatusRequest,
    SubmitGraphRequest,
    SubmitSpecs,
)
from tests.helpers import (
    Factory,
    Loop,
    assigned,
    chain,
    event,
    join,
    make_state,
    of,
    specs_for,
    wait_until,
)
from tests.helpers import (
    run as run_core,
)

__all__ = ["make_state"]  # the autouse fixture, used by name


def inc(x: int) -> int:
    return x + 1


def chains(n: int, length: int, prefix: str = "c") -> tuple[dict[Key, Any], list[Key]]:
    """``n`` chains of ``length`` tasks (a legacy dask graph) and their last keys."""
    dsk: dict[Key, Any] = {}
    ends = []
    for c in range(n):
        dsk[f"{prefix}{c}-0"] = (inc, c)
        for i in range(1, length):
            dsk[f"{prefix}{c}-{i}"] = (inc, f"{prefix}{c}-{i - 1}")
        ends.append(f"{prefix}{c}-{length - 1}")
    return dsk, ends


def feed(state: SchedulerState, specs: dict[Key, Any], wanted: list[Key], size: int) -> list[Any]:
    """Take ``specs`` in as the scheduler's shell does, by pieces of ``size``."""
    out = []
    for i, piece in enumerate(in_pieces(specs, wanted, size)):
        ev = event(
            GraphSubmitted, specs=piece.specs, wanted=piece.keys, continued=i > 0,
            hold=piece.hold, unhold=piece.unhold,
        )  # fmt: skip
        out += state.handle(ev)
        state.validate()
    return out


# -- the pieces ------------------------------------------------------------------------


def balanced(specs: dict[Key, Any], pieces: tuple[runtime.graph.SpecPiece, ...]) -> None:
    """Every task in exactly one piece, its inputs in an earlier piece or its own, held
    from its piece to the piece of its last reader in a later piece."""
    seen: set[Key] = set()
    held: set[Key] = set()
    for piece in pieces:
        for key, spec in piece.specs.items():
            for d in spec.deps:
                assert d in seen or d in piece.specs or d not in specs, (key, d)
                if d in seen:
                    assert d in held, (d, "read by a later piece but not held")
        seen |= piece.specs.keys()
        held |= set(piece.hold)
        held -= set(piece.unhold)
        assert set(piece.hold) <= piece.specs.keys()
    assert not held and seen == specs.keys()


def test_pieces_follow_the_graph_order_and_keep_what_later_pieces_read(
    make_state: Factory,
) -> None:
    table = {**chain("a", 7), **chain("b", 5), "sum": ["a-6", "b-4"]}
    specs = specs_for(make_state(), table, ["sum", "b-2"])
    pieces = in_pieces(specs, ["sum", "b-2", "sum"], 3)
    assert [len(p.specs) for p in pieces] == [3, 3, 3, 3, 1]
    balanced(specs, pieces)
    order = [k for p in pieces for k in p.specs]
    assert order == sorted(specs, key=lambda k: specs[k].order)  # graph order: a dependency order
    assert [k for p in pieces for k in p.keys] == ["b-2", "sum"]  # each once, with its task
    # small enough: one piece, as given, every requested key with it (known ones too)
    (whole,) = in_pieces(specs, ["sum", "old"], len(specs))
    assert list(whole.specs) == list(specs) and whole.keys == ("sum", "old")
    assert whole.hold == whole.unhold == ()


def test_pieces_follow_the_dependencies_when_the_graph_order_does_not(
    make_state: Factory,
) -> None:
    table = {**chain("a", 6), **chain("b", 6)}
    specs = specs_for(make_state(), table, ["a-5", "b-5"])
    n = len(specs)
    backwards = {k: dataclasses.replace(s, order=n - s.order) for k, s in specs.items()}
    pieces = in_pieces(backwards, ["a-5", "b-5"], 4)
    balanced(backwards, pieces)
    assert pieces[0].keys == ()
    assert {k for p in pieces for k in p.keys} == {"a-5", "b-5"}


# -- the core ----------------------------------------------------------------------------


def test_a_graph_taken_in_by_pieces_ends_as_the_whole_graph_would(make_state: Factory) -> None:
    table = {**chain("a", 9), **chain("b", 4), "c": ["a-3", "b-3"], "d": ["c", "a-8"]}
    whole, pieced = make_state(), make_state()
    specs = specs_for(whole, table, ["d", "b-1"])
    whole.handle(event(GraphSubmitted, specs=specs, wanted=("d", "b-1")))
    feed(pieced, specs, ["d", "b-1"], 2)
    assert whole.generation == pieced.generation == 1  # one submission, all its pieces
    for key, ts in whole.tasks.items():
        other = pieced.tasks[key]
        assert (other.state, other.wanted, other.waiting_on) == (ts.state, ts.wanted, ts.waiting_on)
        assert other.generation == ts.generation
    # queued tasks have the priorities the whole graph gives them (policy unchanged)
    queued = {k: ts.prio for k, ts in whole.tasks.items() if ts.state == "queued"}
    assert queued == {k: pieced.tasks[k].prio for k in queued}
    # the next submission is the next generation, as after a whole graph (its task
    # that reads d continues d's: docs/policies.md#priority)
    feed(pieced, specs_for(pieced, {"e": ["d"], "f": []}, ["e", "f"]), ["e", "f"], 2)
    assert pieced.generation == 2
    assert (pieced.tasks["e"].generation, pieced.tasks["f"].generation) == (1, 2)


def test_an_output_a_later_piece_reads_is_kept_until_that_piece_comes(
    make_state: Factory,
) -> None:
    """A task of one piece may finish before the pieces that read it come: its output,
    which nothing known reads yet, is kept for them (without ``hold``, the registry
    dropped it and the reader failed with MissingKeysError)."""
    state = make_state()
    loop = Loop(state)
    join(state, "w")
    table = chain("a", 3)
    specs = specs_for(state, table, ["a-2"])
    pieces = in_pieces(specs, ["a-2"], 1)
    assert [p.hold for p in pieces] == [("a-0",), ("a-1",), ()]

    def take(i: int) -> list[Any]:
        p = pieces[i]
        return loop.run(
            event(
                GraphSubmitted, specs=p.specs, wanted=p.keys, continued=i > 0, hold=p.hold,
                unhold=p.unhold,
            )
        )  # fmt: skip

    assert [t.key for c in of(take(0), Execute) for t in c.tasks] == ["a-0"]
    loop.finish("w", "a-0")  # before a-1 is known
    assert state.tasks["a-0"].state == "memory" and not loop.dropped
    assert [t.key for c in of(take(1), Execute) for t in c.tasks] == ["a-1"]
    assert state.tasks["a-0"].wanted == 0  # read by a-1 now: held no more
    loop.finish("w", "a-1")
    assert loop.dropped == ["a-0"]  # let go once its reader is done, as usual
    take(2)
    done = of(loop.finish("w", "a-2"), KeyDone)
    assert [d.key for d in done] == ["a-2"]
    assert {k: ts.state for k, ts in state.tasks.items() if ts.state != "released"} == {
        "a-2": "memory"
    }


def test_a_cancel_between_pieces_cancels_what_is_in_now_and_the_rest_as_it_comes(
    make_state: Factory,
) -> None:
    """The scale audit: a cancel of a 300,000-task run waited for the whole intake (a
    minute), the pieces taken in running meanwhile. Now the core cancels what it has at
    once, tells the clients of the keys still to come at once, and takes those in as
    cancelled: no task of the cancelled keys is sent to a worker after the cancel."""
    state = make_state()
    join(state, "w", cores=2)
    table: dict[Key, list[Key]] = {f"t{i}": [] for i in range(8)}
    table["sum"] = ["t6", "t7"]  # read by the last piece: its tasks fail with them
    keys = list(table)
    specs = specs_for(state, table, keys)
    pieces = in_pieces(specs, keys, 3)
    assert len(pieces) == 3

    def take(i: int) -> list[Any]:
        p = pieces[i]
        return run_core(
            state,
            event(
                GraphSubmitted, specs=p.specs, wanted=p.keys, continued=i > 0, hold=p.hold,
                unhold=p.unhold,
            ),
        )  # fmt: skip

    sent = assigned(take(0))["w"]
    assert sent  # the first piece runs
    coming = tuple(k for p in pieces[1:] for k in p.specs)
    cmds = run_core(state, event(CancelRequested, keys=tuple(keys), coming=coming))
    told = [c.key for c in of(cmds, KeyCancelled)]
    assert sorted(told, key=str) == sorted(keys, key=str)  # every key's clients, now, once
    assert {k for c in of(cmds, CancelOnWorker) for k in c.keys} == set(sent)  # stopped
    later = take(1) + take(2)
    assert of(later, Execute) == [] and of(later, KeyCancelled) == []  # told already
    assert {k: ts.state for k, ts in state.tasks.items()} == dict.fromkeys(keys, "cancelled")
    assert not state._cancel_ahead  # each key came once: nothing waits for it any more
    # the same keys submitted again after the cancel run again (as after any cancel)
    again = specs_for(state, {"t0": []}, ["t0"])
    assert assigned(run_core(state, event(GraphSubmitted, specs=again, wanted=("t0",)))) == {
        "w": ["t0"]
    }


def test_a_cancel_between_pieces_leaves_done_and_other_keys_alone(make_state: Factory) -> None:
    """Only the asked keys are cancelled as they come; a key the core has done stands
    (as a cancel after the intake left it), and the console's count of what was still
    to do counts the keys to come."""
    state = make_state()
    loop = Loop(state)
    join(state, "w")
    old = specs_for(state, {"old": []}, ["old"])
    loop.run(event(GraphSubmitted, specs=old, wanted=("old",)))
    loop.finish("w", "old")
    table: dict[Key, list[Key]] = {f"t{i}": [] for i in range(4)}
    specs = specs_for(state, table, list(table))
    specs.update(old)  # brought again by a later piece
    cut = [["t0", "t1"], ["t2", "old"], ["t3"]]
    pieces = [runtime.graph.SpecPiece({k: specs[k] for k in c}, tuple(c)) for c in cut]
    p0 = pieces[0]
    loop.run(event(GraphSubmitted, specs=p0.specs, wanted=p0.keys, hold=p0.hold, unhold=p0.unhold))
    coming = tuple(k for p in pieces[1:] for k in p.specs)
    asked = ("t0", "t2", "old")  # not t3
    assert state.count_active(asked, coming) == 2  # old is done
    cmds = loop.run(event(CancelRequested, keys=asked, coming=coming))
    assert "old" not in {c.key for c in of(cmds, KeyCancelled)}
    for p in pieces[1:]:
        loop.run(
            event(
                GraphSubmitted, specs=p.specs, wanted=p.keys, continued=True, hold=p.hold,
                unhold=p.unhold,
            )
        )  # fmt: skip
    states = {k: state.tasks[k].state for k in coming}
    assert states.pop("old") == "memory", state.story("t3")
    assert states.pop("t3") in ("queued", "processing"), state.story("t3")
    assert set(states.values()) == {"cancelled"}
    assert not state._cancel_ahead


# -- the cluster -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_loop_and_other_messages_run_between_the_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    dsk, ends = chains(60, 5)  # 300 tasks: 6 pieces
    ticks = 0
    at_piece: list[int] = []  #: the loop's ticks when each piece was taken in
    at_status: list[int] = []  #: pieces taken in when the scheduler answered a status
    handle = SchedulerState.handle
    status = Scheduler.status

    def counting(self: SchedulerState, *events: Any) -> Any:
        for ev in events:
            if isinstance(ev, GraphSubmitted):
                at_piece.append(ticks)
                if len(at_piece) == 1:  # a message that comes while the graph goes in
                    cluster._scheduler_actor.ref.post(StatusRequest())
        return handle(self, *events)

    def noting(self: Scheduler, msg: StatusRequest) -> Any:
        at_status.append(len(at_piece))
        return status(self, msg)

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    monkeypatch.setattr(SchedulerState, "handle", counting)
    monkeypatch.setattr(Scheduler, "status", noting)
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster, anyio.create_task_group() as tg:
            tg.start_soon(tick)
            assert await cluster.compute(dsk, ends) == tuple(c + 5 for c in range(60))
            tg.cancel_scope.cancel()
    assert len(at_piece) == 6
    assert all(b > a for a, b in itertools.pairwise(at_piece)), at_piece
    assert at_status[0] == 1  # handled after the first piece, before the second


@pytest.mark.anyio
async def test_the_manager_answers_while_a_large_graph_is_validated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Status (and metrics) go through the manager: they are answered while it builds a
    large graph in its thread (before, they waited for the whole build)."""
    import actors.manager

    building = threading.Event()
    go_on = threading.Event()
    build = actors.manager.build_specs

    def held(*args: Any, **kwargs: Any) -> Any:
        building.set()
        assert go_on.wait(30), "the test did not let the build go on"
        return build(*args, **kwargs)

    monkeypatch.setattr(actors.manager, "build_specs", held)
    dsk, ends = chains(500, 5)  # 2,500 tasks: built in the thread
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            async with anyio.create_task_group() as tg:
                results: list[Any] = []

                async def compute() -> None:
                    results.append(await cluster.compute(dsk, ends))

                tg.start_soon(compute)
                await anyio.to_thread.run_sync(building.wait, 30)
                try:
                    status = await cluster.status()  # the build waits for go_on
                    assert status["runs"] == 0
                finally:
                    go_on.set()
            assert results == [tuple(c + 5 for c in range(500))]


@pytest.mark.anyio
async def test_a_large_graph_is_built_with_the_garbage_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The manager builds a large graph with automatic garbage collection off (before,
    the collector's full passes over the graph's objects took a third of the build and
    held the GIL for seconds: benchmarks/ingest.py), and turns it back on after; a
    small graph, built on the event loop, leaves it alone."""
    import gc

    import actors.manager

    seen: list[tuple[int, bool]] = []
    build = actors.manager.build_specs

    def noting(graph: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((len(graph), gc.isenabled()))
        return build(graph, *args, **kwargs)

    monkeypatch.setattr(actors.manager, "build_specs", noting)
    dsk, ends = chains(500, 5)  # 2,500 tasks: built in the thread
    small, small_ends = chains(3, 2)
    assert gc.isenabled()
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            assert await cluster.compute(dsk, ends) == tuple(c + 5 for c in range(500))
            assert gc.isenabled()
            assert await cluster.compute(small, small_ends) == (2, 3, 4)
    assert seen == [(len(dsk), False), (len(small), True)]
    assert gc.isenabled()


@pytest.mark.anyio
async def test_a_dask_collection_is_materialized_and_built_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A collection reaches the manager as dask's expression, whose tasks are not known
    until dask makes its graph: the manager builds it in its thread, as a large graph.
    Before, ``len()`` of the ``_ExprSequence`` that ``dask.compute`` hands a scheduler
    (the number of collections: 1) made it look small, and a dataframe shuffle of
    thousands of tasks was materialized and validated on the event loop (seconds with no
    message handled: ``event loop blocked``)."""
    import dask.dataframe as dd
    import pandas as pd

    import actors.manager

    threads: list[int] = []
    build = actors.manager.build_specs

    def noting(graph: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return build(graph, *args, **kwargs)

    monkeypatch.setattr(actors.manager, "build_specs", noting)
    frame = dd.from_pandas(pd.DataFrame({"a": range(100)}), npartitions=4)
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            assert await cluster.compute(frame.a.sum()) == 4950
            assert await cluster.compute(frame.a.sum(), frame.a.max()) == (4950, 99)
    assert len(threads) == 2
    assert threading.get_ident() not in threads


def test_the_garbage_collector_pause_nests_and_keeps_a_disabled_collector_off() -> None:
    """Builds in several threads (several managers in one process) overlap: the last to
    end turns the collector back on; one the program turned off stays off."""
    import gc

    from actors.manager import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer build goes on
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("the build failed")
    assert gc.isenabled()  # turned back on all the same
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the program's choice
    finally:
        gc.enable()


@pytest.mark.anyio
async def test_a_refused_large_graph_is_refused_whole() -> None:
    dsk, ends = chains(500, 5)
    missing = {**dsk, "last": Task("last", operator.add, TaskRef("c0-4"), TaskRef("nowhere"))}
    cyclic = {**dsk, "x": (inc, "y"), "y": (inc, "x")}
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(MissingKeysError):
                await cluster.compute(missing, [*ends, "last"])
            with pytest.raises(CycleError):
                await cluster.compute(cyclic, [*ends, "y"])
            status = await cluster.status()
            assert status["runs"] == 0 and status["wanted_keys"] == 0
            assert cluster._scheduler_actor.state.tasks == {}  # nothing of them kept
            assert await cluster.compute(dsk, ends[:3]) == (5, 6, 7)  # and it goes on


@pytest.mark.anyio
async def test_a_client_gone_while_its_graph_is_validated_leaves_nothing_behind() -> None:
    """The client's departure comes while its large graph is built in the manager's
    thread: it is carried out after the graph is registered, so the graph is released
    whole (not registered for a client that is gone, and run and kept for ever)."""
    dsk, ends = chains(500, 5)
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            manager = cluster._manager
            manager.post(SubmitGraphRequest(dsk, tuple(ends), "gone"))
            manager.post(ClientGone("gone"))
            # asked after both: answered once they are carried out (in turn)
            await manager.ask(ReleaseKeysRequest((), "gone"))
            await settled(cluster, len(dsk))
            assert cluster._scheduler_actor.state.tasks == {}
            assert (await cluster.status())["wanted_keys"] == 0


@pytest.mark.anyio
async def test_a_client_that_left_and_came_back_while_a_graph_is_validated_is_connected(
    managers: list[Any],
) -> None:
    """A client's departure waits behind a large graph being built in the manager's
    thread; its coming did not: a name that left and came back meanwhile was counted
    gone once the graph was in (review 1206d, finding 9). Now both keep their order."""
    dsk, ends = chains(500, 5)
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            manager = cluster._manager
            manager.post(ClientCame("back"))
            manager.post(SubmitGraphRequest(dsk, tuple(ends), "another"))
            manager.post(ClientGone("back"))
            manager.post(ClientCame("back"))
            # asked after them all: answered once they are carried out (in turn)
            await manager.ask(ReleaseKeysRequest((), "back"))
            assert "back" in managers[0].connected


async def settled(cluster: Cluster, n: int) -> None:
    """Once the scheduler has taken in ``n`` tasks and carried out everything that came
    after them."""
    sched = cluster._scheduler_actor
    await wait_until(lambda: sched.state.created == n and not sched._intake, "the intake")


@pytest.mark.parametrize("how", ["release", "cancel"])
@pytest.mark.anyio
async def test_a_release_or_cancel_during_the_intake_finds_the_graph_whole(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Posted to the scheduler right behind a graph of several pieces (no worker: nothing
    runs): a release is carried out once every piece is in, and a cancel at once on the
    pieces in and on the later pieces as they come; either reaches the keys of the later
    pieces too (before any piece of theirs came, they would have been missed)."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    dsk, ends = chains(60, 5)
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            pieces = in_pieces(build_specs(dsk, ends), ends)
            assert len(pieces) == 6
            sched.ref.post(SubmitSpecs("run-x", pieces, tuple(ends)))
            if how == "release":
                sched.ref.post(ReleaseKeysRequest(tuple(ends), "c"))
            else:
                sched.ref.post(CancelRequest(tuple(ends), "by test"))
            await settled(cluster, len(dsk))
            tasks = sched.state.tasks
            if how == "release":
                assert tasks == {}  # no longer wanted: cancelled and forgotten
            else:
                assert {ts.state for ts in tasks.values()} == {"cancelled"}
                assert set(ends) <= tasks.keys()


@pytest.mark.anyio
async def test_a_cancel_during_the_intake_is_carried_out_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scale audit: ``cancel()`` of a large ``map`` returned, but the scheduler
    carried it out only once the whole graph was in, and the pieces taken in ran
    meanwhile (123,000 of 300,000 tasks ran after the cancel). Now the core has it while
    pieces are still to come, no task is sent to a worker after it, and every future is
    cancelled, those of the pieces to come too."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    seen: list[tuple[str, int]] = []  #: (event or "execute", pieces left in the intake)
    scheds: list[Scheduler] = []
    handle = SchedulerState.handle

    def noting(self: SchedulerState, *events: Any) -> Any:
        out = handle(self, *events)
        left = len(scheds[0]._intake) if scheds else 0
        seen.extend((type(ev).__name__, left) for ev in events)
        seen.extend(("execute", left) for c in out if isinstance(c, Execute))
        return out

    monkeypatch.setattr(SchedulerState, "handle", noting)
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            sched = cluster._scheduler_actor
            scheds.append(sched)
            futures = cluster.map(inc, range(3000))  # 60 pieces
            await wait_until(lambda: len(sched._intake) > 5, "the intake under way")
            await cluster.cancel(futures)
            names = [name for name, _ in seen]
            assert "CancelRequested" in names, "cancel() returned before it was carried out"
            at = names.index("CancelRequested")
            assert seen[at][1] > 0, "carried out once the intake was over"
            assert "execute" not in names[at:], "a task was sent after the cancel"
            cancelled = 0
            for i, f in enumerate(futures):  # done before the cancel, or cancelled
                try:
                    assert await f == i + 1
                except CorralCancelledError:
                    cancelled += 1
            assert cancelled > 2000  # at least the keys of the pieces then to come
            await wait_until(lambda: not sched._intake, "the rest of the intake")
            assert "execute" not in [name for name, _ in seen[at:]]
            states = {ts.state for ts in sched.state.tasks.values()}
            assert states <= {"cancelled", "memory", "released"}, states


@pytest.mark.anyio
async def test_a_large_submission_is_logged_as_it_goes_and_once_taken_in(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The scale audit: a ``map`` of 300,000 items blocked its caller for 13-25 s and the
    client said nothing at INFO during the whole run. Now a large ``map`` says when it
    made its tasks, and a large submission when it goes and when the manager took it in,
    with counts and seconds; a small one says nothing."""
    import logging

    import runtime.client

    monkeypatch.setattr(runtime.client, "LOG_SUBMISSION", 50)
    caplog.set_level(logging.INFO, logger="corral")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name.startswith("corral.client")]

    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            assert await cluster.gather(cluster.map(inc, range(10))) == list(range(1, 11))
            assert said() == []
            futures = cluster.map(inc, range(100, 160))  # (new keys: all 60 are sent)
            (made,) = said()
            assert "map made its tasks" in made and "tasks=60" in made and "seconds=" in made
            assert "pure=False" in made
            assert await cluster.gather(futures) == list(range(101, 161))
            sending, taken = said()[1:]
            assert "sending a large submission to the manager" in sending and "tasks=60" in sending
            assert "the manager took in the submission" in taken and "tasks=60" in taken
            assert "seconds=" in taken
            await cluster.compute(*chains(20, 3))  # 60 tasks through compute
            assert len(said()) == 5 and "took in" in said()[-1]


# -- a large release ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_large_release_goes_in_parts_with_other_messages_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of a large run lets go of every key at once: one part of ``INTAKE_PIECE``
    keys per turn (before, one core event of 20-40k keys held the loop for seconds)."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    dsk, _ = chains(60, 5)
    keys = list(dsk)  # 300 keys wanted: a release in 6 parts
    parts: list[int] = []  #: the size of each part released
    at_status: list[int] = []  #: parts released when the scheduler answered a status
    handle = SchedulerState.handle
    status = Scheduler.status

    def counting(self: SchedulerState, *events: Any) -> Any:
        for ev in events:
            if isinstance(ev, KeysReleased):
                parts.append(len(ev.keys))
                if len(parts) == 1:  # a message that comes while the release goes on
                    cluster._scheduler_actor.ref.post(StatusRequest())
        return handle(self, *events)

    def noting(self: Scheduler, msg: StatusRequest) -> Any:
        at_status.append(len(parts))
        return status(self, msg)

    monkeypatch.setattr(SchedulerState, "handle", counting)
    monkeypatch.setattr(Scheduler, "status", noting)
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            pieces = in_pieces(build_specs(dsk, keys), keys)
            sched.ref.post(SubmitSpecs("run-x", pieces, tuple(keys)))
            await settled(cluster, len(dsk))
            await sched.ref.ask(ReleaseKeysRequest(tuple(keys), "c"))  # answered at the end
            assert parts == [50] * 6
            assert sched.state.tasks == {}  # no longer wanted: cancelled and forgotten
    assert at_status == [1]  # handled after the first part, before the second


@pytest.mark.anyio
async def test_what_comes_after_a_large_release_waits_for_all_its_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same graph submitted again right behind its release: the submission's wants
    come after every part (had it gone between, the later parts would have taken its
    wants away, and its tasks would have been cancelled)."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    dsk, _ = chains(60, 5)
    keys = list(dsk)
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            specs = build_specs(dsk, keys)
            sched.ref.post(SubmitSpecs("run-x", in_pieces(specs, keys), tuple(keys)))
            await settled(cluster, len(dsk))
            sched.ref.post(ReleaseKeysRequest(tuple(keys), "c"))
            sched.ref.post(SubmitSpecs("run-y", in_pieces(specs, keys), tuple(keys)))
            await wait_until(lambda: not sched._intake, "the release and the submission")
            tasks = sched.state.tasks
            assert tasks.keys() == dsk.keys()
            waiting = {(1, "waiting"), (1, "queued")}  # wanted once, not cancelled
            assert {(ts.wanted, ts.state) for ts in tasks.values()} <= waiting


@pytest.mark.anyio
async def test_a_cancel_sparing_other_clients_keys_does_not_hold_up_the_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With another client connected, a cancel asks the scheduler which keys it spared,
    and the scheduler answers once the graph it is taking in is whole. Meanwhile the
    manager answers status (before, it waited in the cancel's handler, its mailbox held
    until the whole intake was over)."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    left_at_status: list[int] = []  #: pieces still to take in when status was answered
    status = Scheduler.status

    def noting(self: Scheduler, msg: StatusRequest) -> Any:
        left_at_status.append(len(self._intake))
        return status(self, msg)

    monkeypatch.setattr(Scheduler, "status", noting)
    dsk, ends = chains(600, 5)  # 3,000 tasks: 60 pieces
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            manager, sched = cluster._manager, cluster._scheduler_actor
            await manager.ask(SubmitGraphRequest({"k": (inc, 1)}, ("k",), "b"))  # another client
            await manager.ask(SubmitGraphRequest({"z": (inc, 1)}, ("z",), "a"))
            manager.post(SubmitGraphRequest(dsk, tuple(ends), "a"))
            await wait_until(lambda: len(sched._intake) > 1, "the intake under way")
            cancelled = manager.post_ask(CancelRequest(("z",), "by test", "a"), timeout=None)
            await manager.ask(StatusRequest(categories=False))
            assert left_at_status and left_at_status[0] > 0, left_at_status
            assert await cancelled == ()  # nothing spared: z is a's alone
            assert sched.state.tasks["z"].state == "cancelled"
            await settled(cluster, len(dsk) + 2)


@pytest.mark.anyio
async def test_a_request_that_fails_during_the_intake_fails_for_its_asker_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel carried out after the graph is whole raises: its asker gets that error
    (as a cancel asked outside an intake does), the scheduler is not restarted, and the
    rest of the graph is taken in."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    handle = SchedulerState.handle
    restarts: list[str] = []

    def failing(self: SchedulerState, *events: Any) -> Any:
        if any(isinstance(ev, CancelRequested) for ev in events):
            raise LookupError("the core could not cancel")
        return handle(self, *events)

    async def on_restart(self: Scheduler) -> None:
        restarts.append("restart")

    monkeypatch.setattr(SchedulerState, "handle", failing)
    monkeypatch.setattr(Scheduler, "on_restart", on_restart)
    dsk, ends = chains(60, 5)  # 6 pieces
    with anyio.fail_after(60):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            pieces = in_pieces(build_specs(dsk, ends), ends)
            sched.ref.post(SubmitSpecs("run-x", pieces, tuple(ends)))
            with pytest.raises(LookupError, match="could not cancel"):
                await sched.ref.ask(CancelRequest(tuple(ends), "by test", spare=("c0-4",)))
            await settled(cluster, len(dsk))
            assert restarts == []
            tasks = sched.state.tasks  # the whole graph, still wanted (nothing cancelled)
            assert tasks.keys() == dsk.keys() and {tasks[k].wanted for k in ends} == {1}


def test_categories_of_fresh_keys_leave_nothing_in_dasks_key_split_cache() -> None:
    """The longrun audit: a manager serving one fresh graph after another grew over its
    first 100,000 tasks, partly because every new key went into ``dask.utils.key_split``'s
    process-wide cache of 100,000 keys (about 17 MB once full, holding keys of tasks
    long forgotten). Now a task's category is split without that cache: many graphs of
    fresh keys, named and in chunks, leave it as it was, and the categories are the same."""
    from dask.utils import key_split

    before = key_split.cache_info()
    for run in range(20):
        graph: dict[Key, Any] = {
            f"check-{run:04d}{i:028x}": (operator.add, 1, i) for i in range(50)
        }
        graph.update({(f"flat-{run:04d}{'0' * 28}", i): (operator.add, 2, i) for i in range(50)})
        specs = build_specs(graph, list(graph))
        assert sorted({s.category for s in specs.values()}) == ["check", "flat"]
    after = key_split.cache_info()
    assert (after.hits, after.misses, after.currsize) == (
        before.hits, before.misses, before.currsize
    )  # fmt: skip
