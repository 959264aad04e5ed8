"""The scheduler's intake serves clients in turn: a small graph of one client is taken
in between the pieces of another client's large graph (before, it waited for the whole
large intake: the scale audit measured 141 s, or 71 s with the ``fair`` priority, for a
second client's 10 tasks behind 300,000 being taken in).

- The shell (``actors.scheduler._IntakeQueue``) keeps each client's submissions,
  releases and cancels in the order they came, and lets no request go ahead of another
  client's earlier one that brings or reads one of its keys.
- The core keeps each submission's generation and turns while other clients' pieces
  come between its pieces.

Core tests feed ``SchedulerState`` directly (the ``make_state`` fixture validates every
state); cluster tests are gated on events and bounded by ``fail_after``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

import runtime.graph
from actors.scheduler import Scheduler, _IntakeQueue, _Job, _Turn
from actors.scheduler_events import Execute, GraphSubmitted
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.graph import Key, build_specs, in_pieces
from runtime.messages import ReleaseKeysRequest, SubmitSpecs
from tests.helpers import Factory, event, make_state, wait_until
from tests.test_graph_intake import chains, inc

__all__ = ["make_state"]  # the autouse fixture, used by name


def piece_event(
    piece: runtime.graph.SpecPiece, i: int, last: int, client: str, run: str = ""
) -> Any:
    more = {"run": run} if run else {}
    return event(
        GraphSubmitted, specs=piece.specs, wanted=piece.keys, continued=i > 0, hold=piece.hold,
        unhold=piece.unhold, echo_to=client, final=i == last, **more,
    )  # fmt: skip


# -- the core ----------------------------------------------------------------------------


def test_a_submission_keeps_its_generation_and_turns_across_another_clients_graph(
    make_state: Factory,
) -> None:
    """Client a's graph in 3 pieces, client b's small graph between its first two: a's
    later pieces are of a's submission (its generation, its turns), b's of its own.
    (Before, the core took any piece marked ``continued`` as part of the submission
    taken in latest: a's later tasks became b's generation.)"""
    state = make_state(priority="fair")
    big, big_ends = chains(15, 2, "a")  # 30 tasks: 3 pieces of 10
    small, small_ends = chains(2, 1, "b")
    pieces = in_pieces(build_specs(big, big_ends), big_ends, 10)
    assert len(pieces) == 3
    state.handle(piece_event(pieces[0], 0, 2, "a"))
    (b_piece,) = in_pieces(build_specs(small, small_ends), small_ends, 10)
    state.handle(piece_event(b_piece, 0, 0, "b"))
    for i in (1, 2):
        state.handle(piece_event(pieces[i], i, 2, "a"))
    gens = {key: state.tasks[key].generation for key in [*big, *small]}
    assert {gens[k] for k in big} == {1}, gens
    assert {gens[k] for k in small} == {2}
    turns = sorted(state.tasks[k].turn for k in big)
    assert turns == sorted(big_spec.order for big_spec in build_specs(big, big_ends).values())
    assert {state.tasks[k].client for k in big} == {"a"}
    assert {state.tasks[k].client for k in small} == {"b"}
    assert not state._open  # both submissions are in


def test_one_clients_submissions_keep_their_generations_when_their_pieces_interleave(
    make_state: Factory,
) -> None:
    """Client a's graph in 3 pieces (run-1), then a's own small graph (run-2) between
    its first two, as the intake now takes a client's later submission in: each keeps
    its own generation and turns. (Before, the core kept one submission under way per
    client: the small graph's last piece closed it, and a's later pieces became the
    small graph's generation.)"""
    state = make_state(priority="fair")
    big, big_ends = chains(15, 2, "a")  # 30 tasks: 3 pieces of 10
    small, small_ends = chains(2, 1, "s")
    specs = build_specs(big, big_ends)
    pieces = in_pieces(specs, big_ends, 10)
    state.handle(piece_event(pieces[0], 0, 2, "a", "run-1"))
    first = max(state.tasks[k].turn for k in pieces[0].specs)
    (s_piece,) = in_pieces(build_specs(small, small_ends), small_ends, 10)
    state.handle(piece_event(s_piece, 0, 0, "a", "run-2"))
    for i in (1, 2):
        state.handle(piece_event(pieces[i], i, 2, "a", "run-1"))
    assert {state.tasks[k].generation for k in big} == {1}
    assert {state.tasks[k].generation for k in small} == {2}
    assert sorted(state.tasks[k].turn for k in big) == sorted(s.order for s in specs.values())
    assert min(state.tasks[k].turn for k in small) > first  # after what was in before it
    assert not state._open  # both submissions are in


# -- the shell's queue --------------------------------------------------------------------


def counted(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[str]:
    """Calls of ``_Job``'s methods ``names`` (each a look at a job), as they happen."""
    calls: list[str] = []
    for name in names:
        method = getattr(_Job, name)

        def wrapper(self: _Job, *args: Any, _m: Any = method, _n: str = name) -> Any:
            calls.append(_n)
            return _m(self, *args)

        monkeypatch.setattr(_Job, name, wrapper)
    return calls


def test_one_clients_waiting_jobs_cost_the_queue_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 1207d F1: one client's large graph (its first piece taken), then N small
    jobs of the same client that each read a key of its last piece. Each waits for the
    graph; once it is in, they go in the order they came. The queue looks at a job a
    bounded number of times per job added and per turn: O(N) in all (it compared each
    new job with every waiting one and walked every waiting job per turn: O(N^2))."""

    def apply(stimulus: str) -> None:
        pass

    def load(n: int) -> tuple[list[_Turn], int]:
        q = _IntakeQueue()
        big = [_Turn(apply, f"big-{p}", specs=dict.fromkeys([("big", p)])) for p in range(5)]
        q.add(q.job("c", big))
        assert q.pop() is big[0]
        calls = counted(monkeypatch, "keys", "ready")
        for j in range(n):
            small = _Turn(apply, f"small-{j}", specs={("small", j): None}, keys=({("big", 4)},))
            job = q.job("c", [small])
            q.add(job)
            assert not job.ready()
        taken = []
        while (turn := q.pop()) is not None:
            taken.append(turn)
        assert not q
        assert [t.stimulus for t in taken] == [
            *(f"big-{p}" for p in range(1, 5)),
            *(f"small-{j}" for j in range(n)),
        ]
        monkeypatch.undo()
        return taken, len(calls)

    _, looks_100 = load(100)
    _, looks_400 = load(400)
    assert looks_400 <= 4 * 400 + 20, looks_400  # a few looks per job, not one per pair
    assert looks_400 <= 5 * looks_100, (looks_100, looks_400)


# -- the scheduler -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_small_graph_goes_in_between_the_pieces_of_its_own_clients_large_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client a's graph of 60 pieces, then a's own graph of 10 tasks, which reads and
    names none of its keys (a service's one client: one request's large map, then
    another's small one): the small one is taken in while the large one has pieces
    still to come, after at most one of them. (Before, one client's submissions went in
    one after the other: the small one waited for all 60 pieces.)"""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    scheds: list[Scheduler] = []
    big, big_ends = chains(600, 5, "a")
    small, small_ends = chains(10, 1, "s")
    seen = noting_pieces(monkeypatch, scheds, set(small))
    with anyio.fail_after(30):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            scheds.append(sched)
            submit(sched, "run-big", big, big_ends, "a")
            submit(sched, "run-small", small, small_ends, "a")
            await wait_until(lambda: sched.state.created == 3010 and not sched._intake)
            assert {sched.state.tasks[k].state for k in small} == {"queued"}
            assert {sched.state.tasks[k].generation for k in small} == {2}
    which = [s[0] for s in seen]
    assert which.count("big") == 60 and which.count("small") == 1
    at = which.index("small")
    assert at <= 2, which[: at + 1]  # after at most the piece under way and one more
    _, final, left, _ = seen[at]
    assert final and left >= 50  # the large graph's pieces still to come


@pytest.mark.anyio
async def test_a_submit_during_its_own_clients_large_map_runs_before_the_intake_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the API, one cluster (one client): a ``map`` of 3,000 tasks (60 pieces),
    and, once its first piece is in, an earlier request's future let go of and
    ``submit(..., priority=100)``: the small task is taken in and sent to the worker
    while the map's pieces are still being taken in, and its result comes. (Before, it
    reached the scheduler only after the map's last piece: ``priority=`` did not help
    during the intake; the release, of a key the map does not touch, does not hold it
    up either.)"""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    scheds: list[Scheduler] = []
    keys: set[Key] = set()
    seen = noting_pieces(monkeypatch, scheds, keys)
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            sched = cluster._scheduler_actor
            scheds.append(sched)
            earlier = cluster.submit(inc, 1000, pure=False)
            keys.add(earlier.key)
            assert await earlier == 1001
            big = cluster.map(inc, range(3000), pure=False)
            await wait_until(lambda: "big" in [s[0] for s in seen], step=0)  # a piece is in
            earlier.release()  # (an earlier request done: its future goes)
            small = cluster.submit(inc, -1, pure=False, priority=100)
            keys.add(small.key)
            assert await small == 0
            assert len(await cluster.gather(big)) == 3000
    left = [s[2] for s in seen if s[0] == "small"][1]  # (the first: the earlier's)
    assert left > 0, "the small graph waited for the whole intake"
    last = next(i for i, s in enumerate(seen) if s[0] == "big" and s[1])  # the map's last
    sent = set().union(*(s[1] for s in seen[:last] if s[0] == "execute"))
    assert small.key in sent, "the small task was sent only after the map's intake"


def noting_pieces(
    monkeypatch: pytest.MonkeyPatch, scheds: list[Scheduler], small: set[Key] | None = None
) -> list[Any]:
    """The ``(client, final, pieces left in the intake, states of the piece's tasks after
    it)`` of each piece the core takes in, and ``("execute", keys)`` of each Execute
    command, in order; with ``small``, ``"small"`` in place of the client for a piece
    bringing one of its keys, else ``"big"``."""
    seen: list[Any] = []
    handle = SchedulerState.handle

    def noting(self: SchedulerState, *events: Any) -> Any:
        out = handle(self, *events)
        for ev in events:
            if isinstance(ev, GraphSubmitted):
                left = len(scheds[0]._intake) if scheds else 0
                states = {self.tasks[k].state for k in ev.specs}
                which = (
                    ev.echo_to
                    if small is None
                    else ("big", "small")[not small.isdisjoint(ev.specs)]
                )
                seen.append((which, ev.final, left, states))
        run = {t.key for c in out if isinstance(c, Execute) for t in c.tasks}
        if run:
            seen.append(("execute", run))
        return out

    monkeypatch.setattr(SchedulerState, "handle", noting)
    return seen


def submit(
    sched: Scheduler,
    run: str,
    dsk: dict[Key, Any],
    keys: list[Key],
    client: str,
    known: Callable[[Key], bool] | None = None,
) -> None:
    """Post ``dsk`` to the scheduler as the manager does, for ``client``."""
    specs = build_specs(dsk, keys, known=known)
    sched.ref.post(SubmitSpecs(run, in_pieces(specs, keys), tuple(keys), client=client))


async def large_then_small(sched: Scheduler) -> tuple[dict[Key, Any], dict[Key, Any]]:
    """Client a's graph of 3,000 tasks (60 pieces), then client b's of 10, both taken
    in; their graphs."""
    big, big_ends = chains(600, 5, "a")
    small, small_ends = chains(10, 1, "b")
    assert len(in_pieces(build_specs(big, big_ends), big_ends)) == 60
    submit(sched, "run-a", big, big_ends, "a")
    submit(sched, "run-b", small, small_ends, "b")
    await wait_until(lambda: sched.state.created == 3010 and not sched._intake)
    return big, small


@pytest.mark.anyio
async def test_a_small_graph_goes_in_between_the_pieces_of_another_clients_large_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client a's graph of 60 pieces, then client b's of 10 tasks: b's is taken in (its
    tasks ready) while a's has pieces still to come, after at most one of them."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    scheds: list[Scheduler] = []
    seen = noting_pieces(monkeypatch, scheds)
    with anyio.fail_after(30):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            scheds.append(sched)
            await large_then_small(sched)
    order = [s[0] for s in seen]
    assert order.count("a") == 60 and order.count("b") == 1
    at = order.index("b")
    assert at <= 2, order[: at + 1]  # after at most the piece under way and one more
    _, final, left, states = seen[at]
    assert final and left >= 50  # a's pieces still to come
    assert states == {"queued"}  # b's tasks are ready (no worker to run them)


@pytest.mark.anyio
async def test_under_fair_the_small_graph_runs_before_the_large_intake_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the ``fair`` priority and a worker, b's tasks go to the worker as slots
    free up while a's large graph is still being taken in: the first of them before a's
    last piece (a's tasks taken in by then run meanwhile: the turns of b's tie with
    theirs)."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    scheds: list[Scheduler] = []
    seen = noting_pieces(monkeypatch, scheds)
    with anyio.fail_after(30):
        async with Cluster(workers=1) as cluster:
            await cluster.set_policy("priority", "fair")
            sched = cluster._scheduler_actor
            scheds.append(sched)
            _, small = await large_then_small(sched)
            await wait_until(lambda: all(sched.state.tasks[k].state == "memory" for k in small))
    a_done = next(i for i, s in enumerate(seen) if s[0] == "a" and s[1])  # a's last piece
    sent = set().union(*(s[1] for s in seen[:a_done] if s[0] == "execute"))
    assert set(small) & sent, "b's tasks waited for the whole intake"


@pytest.mark.anyio
async def test_a_later_graph_reading_keys_still_being_taken_in_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client a's second graph reads keys of its first, whose pieces are still to come;
    client b's graph reads them too, and client c releases one of them (c wants it as
    well): each waits for the piece that brings the key, so every task finds its inputs
    (none fails as missing), while client d's unrelated graph goes ahead."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    scheds: list[Scheduler] = []
    seen = noting_pieces(monkeypatch, scheds)
    big, big_ends = chains(60, 5, "a")  # 300 tasks: 6 pieces
    last = big_ends[-1]  # in a's last piece
    known = set(big_ends).__contains__
    later = {"later": (sum, list(big_ends))}
    theirs = {"theirs": (inc, last)}
    other, other_ends = chains(3, 1, "d")

    with anyio.fail_after(30):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            scheds.append(sched)
            submit(sched, "run-a", big, big_ends, "a", known)
            submit(sched, "run-c", {}, [last], "c", known)  # c wants a's key
            submit(sched, "run-a2", later, ["later"], "a", known)
            submit(sched, "run-b", theirs, ["theirs"], "b", known)
            sched.ref.post(ReleaseKeysRequest((last,), "c"))
            submit(sched, "run-d", other, other_ends, "d", known)
            await wait_until(lambda: sched.state.created == 300 + 2 + 3 and not sched._intake)
            tasks = sched.state.tasks
            assert {tasks[k].state for k in ("later", "theirs")} == {"waiting"}
            assert {d.key for d in tasks["theirs"].deps} == {last}
            assert tasks[last].wanted == 1  # a's want; c's came and went
    order = [s[0] for s in seen if s[0] != "execute"]
    assert order.count("a") == 7
    sixth = [i for i, client in enumerate(order) if client == "a"][5]  # a's first graph in
    assert order.index("d") < sixth  # d's graph did not wait for a's
    assert min(order.index("b"), order.index("c"), order.index("a", sixth + 1)) > sixth


@pytest.mark.anyio
async def test_a_release_of_a_key_that_a_piece_still_to_come_reads_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client e's key ``e0`` is in; client y's graph of 6 pieces reads it in its last
    piece; e lets ``e0`` go while y's first pieces go in: the release waits for y's
    graph (had it gone ahead, ``e0`` would have been forgotten, wanted by no one and
    read by no task yet, and y's reader would have failed as missing)."""
    monkeypatch.setattr(runtime.graph, "INTAKE_PIECE", 50)
    big, big_ends = chains(60, 5, "y")  # 300 tasks: 6 pieces
    big["yz"] = (sum, [big_ends[-1], "e0"])  # (in the last piece)
    with anyio.fail_after(30):
        async with Cluster(workers=0) as cluster:
            sched = cluster._scheduler_actor
            submit(sched, "run-e", {"e0": (inc, 0)}, ["e0"], "e")
            await wait_until(lambda: "e0" in sched.state.tasks and not sched._intake)
            submit(sched, "run-y", big, [*big_ends, "yz"], "y", {"e0"}.__contains__)
            sched.ref.post(ReleaseKeysRequest(("e0",), "e"))
            await wait_until(lambda: sched.state.created == 302 and not sched._intake)
            tasks = sched.state.tasks
            assert tasks["yz"].state == "waiting", sched.state.story("yz")
            assert tasks["e0"].state == "queued" and tasks["e0"].wanted == 0
