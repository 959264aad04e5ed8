"""A worker whose connection drops is away while the gateway holds its id for its
rejoin (``WorkerDropped`` -> the core's ``WorkerAway``): it takes no new work and its
cores are not counted; lost after all, its life and the tries it was running end at the
drop, not at the hold's end (a user audit found a SIGKILLed worker recorded 10 s late:
its life, the lost try's ``ended`` and "seconds run", the fleet plot, and its cores in
``corral_cores`` for those 10 s). A worker that rejoins within the grace goes on as
before: its life continues, its tries and outputs are kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import (
    GraphSubmitted,
    TasksFinished,
    WorkerAway,
    WorkerJoined,
    WorkerLeft,
)
from runtime import Cluster
from runtime.console import jsonable
from tests.helpers import (
    GB,
    Cli,
    Factory,
    assigned,
    free_port_between,
    make_state,
    result,
    specs_for,
    status_text,
    wait_until,
)
from tests.test_monitordb import LIMIT, T0, WALL, _recorder, _rows, cli, kill_the_holder

__all__ = ["cli", "make_state"]  # fixtures

PORTS = (56000, 56999)  #: the process test's manager and workers listen only here


def _ev(cls: type, now: float, **fields: object) -> object:
    return cls(stimulus_id=f"{cls.__name__}@{now}", now=now, **fields)


@pytest.mark.anyio
async def test_a_worker_lost_after_its_connection_dropped_ends_at_the_drop(
    tmp_path: Path, make_state: Factory
) -> None:
    """``w1`` runs ``long`` (started at T0 + 100); its connection drops at T0 + 105 and
    the gateway reports it lost at T0 + 115, its grace over. Away, it gets no new task
    (``b``, submitted at T0 + 107, goes to ``w2``) and its core is not counted. Its life,
    the lost try's end and the survival estimate's life end at T0 + 105."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, saturation=1.0)
    recorder, writer = _recorder(db, s)
    s.handle(_ev(WorkerJoined, T0, worker="w1", cores=1, memory=GB))
    s.handle(_ev(WorkerJoined, T0, worker="w2", cores=2, memory=GB))
    out = s.handle(
        _ev(GraphSubmitted, T0 + 99, specs=specs_for(s, {"long": []}, ["long"]), wanted=("long",))
    )
    assert assigned(out) == {"w1": ["long"]}
    assert s.handle(_ev(WorkerAway, T0 + 105, worker="w1")) == []
    s.validate()
    assert s.workers["w1"].away == T0 + 105 and "w1" not in s.free
    m = s.pool_metrics(T0 + 106)["default"]
    assert (m["cores"], m["workers"], m["running"]) == (
        2, {"idle": 1, "busy": 0, "draining": 0, "away": 1}, 1,
    )  # fmt: skip
    out = s.handle(
        _ev(GraphSubmitted, T0 + 107, specs=specs_for(s, {"b": []}, ["b"]), wanted=("b",))
    )
    assert assigned(out) == {"w2": ["b"]}
    out = s.handle(_ev(WorkerLeft, T0 + 115, worker="w1", cause="crash"))
    s.validate()
    assert assigned(out) == {"w2": ["long"]}  # retried at once, on the worker left
    (lost,) = s.tasks["long"].tries
    assert (lost.outcome, lost.start, lost.stop) == ("worker-lost", T0 + 99, T0 + 105)
    assert list(s.lives["default"]) == [(105.0, True)]
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    assert _rows(db, 'SELECT worker, life, joined, "left", cause FROM workers ORDER BY worker') == [
        ("w1", 1, WALL + T0, WALL + T0 + 105, "crash"),
        ("w2", 1, WALL + T0, None, None),
    ]
    assert _rows(db, "SELECT worker, outcome, sent, ended FROM tries WHERE key = 'long'") == [
        ("w1", "worker-lost", WALL + T0 + 99, WALL + T0 + 105)
    ]


@pytest.mark.anyio
async def test_a_worker_back_within_its_grace_goes_on_as_before(
    tmp_path: Path, make_state: Factory
) -> None:
    """``w1``'s connection drops at T0 + 105 and it rejoins at T0 + 108: its life goes
    on (one row, not left), ``long`` stays its try (no retry), it takes new tasks again
    and its core counts again; lost later (T0 + 130, nothing dropped), it ends then."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, saturation=1.0)
    recorder, writer = _recorder(db, s)
    s.handle(_ev(WorkerJoined, T0, worker="w1", cores=2, memory=GB))
    out = s.handle(
        _ev(GraphSubmitted, T0 + 99, specs=specs_for(s, {"long": []}, ["long"]), wanted=("long",))
    )
    assert assigned(out) == {"w1": ["long"]}
    s.handle(_ev(WorkerAway, T0 + 105, worker="w1"))
    out = s.handle(
        _ev(GraphSubmitted, T0 + 106, specs=specs_for(s, {"b": []}, ["b"]), wanted=("b",))
    )
    assert assigned(out) == {}  # no worker takes new work: it waits
    out = s.handle(_ev(WorkerJoined, T0 + 108, worker="w1", cores=2, memory=GB))
    s.validate()
    assert assigned(out) == {"w1": ["b"]} and s.workers["w1"].away is None
    assert s.tasks["long"].worker == "w1" and s.tasks["long"].tries == []
    assert s.pool_metrics(T0 + 109)["default"]["cores"] == 2
    res = result("b", start=T0 + 108.5)
    s.handle(_ev(TasksFinished, T0 + 110, worker="w1", results=(res,)))
    s.handle(_ev(WorkerLeft, T0 + 130, worker="w1", cause="crash"))
    s.validate()
    (lost,) = s.tasks["long"].tries
    assert lost.stop == T0 + 130
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    assert _rows(db, 'SELECT worker, life, joined, "left" FROM workers') == [
        ("w1", 1, WALL + T0, WALL + T0 + 130)
    ]
    story = [(start, finish) for _, start, finish, *_ in s.story("w1")]
    assert story == [
        ("-", "joined"), ("joined", "away"), ("joined", "back"), ("-", "joined"),
        ("joined", "left:crash"),
    ]  # fmt: skip


@pytest.mark.anyio
async def test_a_retry_after_the_grace_waited_ready_since_the_drop(
    tmp_path: Path, make_state: Factory
) -> None:
    """The user audit: a worker kill -9'd at 45.27, another joined idle at 49.84, and the
    task's retry was queued and sent at 55.27, the end of the 10 s rejoin grace: its try
    had ``queued = sent``, and the 10 s it waited with a worker idle were neither wait
    nor execution. Its retry is ready since the drop: ``w1`` drops at T0 + 105 running
    ``long``; ``b``, submitted away (T0 + 107), takes ``w2`` as it joins (T0 + 109);
    ``c`` is submitted at T0 + 110; the grace ends at T0 + 115. ``long``'s retry waited
    from T0 + 105, ahead of ``c`` in the pool's waits (the oldest wait is 10 s then),
    and its try's row says so."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True, saturation=1.0)
    recorder, writer = _recorder(db, s)
    s.handle(_ev(WorkerJoined, T0, worker="w1", cores=1, memory=GB))

    def submit(now: float, key: str) -> object:
        return s.handle(
            _ev(GraphSubmitted, now, specs=specs_for(s, {key: []}, [key]), wanted=(key,))
        )

    assert assigned(submit(T0 + 99, "long")) == {"w1": ["long"]}
    assert s.handle(_ev(WorkerAway, T0 + 105, worker="w1")) == []
    assert assigned(submit(T0 + 107, "b")) == {}
    out = s.handle(_ev(WorkerJoined, T0 + 109, worker="w2", cores=1, memory=GB))
    assert assigned(out) == {"w2": ["b"]}
    assert assigned(submit(T0 + 110, "c")) == {}
    assert assigned(s.handle(_ev(WorkerLeft, T0 + 115, worker="w1", cause="crash"))) == {}
    s.validate()  # (each pool's waits oldest first)
    assert [t.key for t in s.pool_waits["*"].since] == ["long", "c"]
    assert s.oldest_wait("*", T0 + 115) == 10.0
    for now, ended, then in ((T0 + 116, "b", "c"), (T0 + 118, "c", "long")):
        res = result(ended, start=now - 1)
        out = s.handle(_ev(TasksFinished, now, worker="w2", results=(res,)))
        assert assigned(out) == {"w2": [then]}
        s.validate()
    assert list(s.pool_waits[s.workers["w2"].pool].recent) == [0, 2, 6, 13]  # long, b, c, long
    res = result("long", start=T0 + 118)
    s.handle(_ev(TasksFinished, T0 + 120, worker="w2", results=(res,)))
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()
    assert _rows(db, "SELECT key, worker, outcome, queued, sent FROM tries ORDER BY key, try") == [
        ("b", "w2", "ok", WALL + T0 + 107, WALL + T0 + 109),
        ("c", "w2", "ok", WALL + T0 + 110, WALL + T0 + 116),
        ("long", "w1", "worker-lost", WALL + T0 + 99, WALL + T0 + 99),
        ("long", "w2", "ok", WALL + T0 + 105, WALL + T0 + 118),
    ]


def test_an_output_only_the_lost_worker_held_is_made_again_ready_since_the_drop(
    make_state: Factory,
) -> None:
    """``a`` finished on ``w1`` (its client not given it yet); ``w1`` drops at T0 + 105
    and is lost at T0 + 115 with ``w2`` idle all along: ``a`` is made again at once, its
    new try ready since the drop."""
    s = make_state(saturation=1.0)
    s.handle(_ev(WorkerJoined, T0, worker="w1", cores=1, memory=GB))
    out = s.handle(
        _ev(GraphSubmitted, T0 + 99, specs=specs_for(s, {"a": []}, ["a"]), wanted=("a",))
    )
    assert assigned(out) == {"w1": ["a"]}
    s.handle(_ev(TasksFinished, T0 + 100, worker="w1", results=(result("a", start=T0 + 99),)))
    s.handle(_ev(WorkerJoined, T0 + 101, worker="w2", cores=1, memory=GB))
    s.handle(_ev(WorkerAway, T0 + 105, worker="w1"))
    out = s.handle(_ev(WorkerLeft, T0 + 115, worker="w1", cause="crash"))
    assert assigned(out) == {"w2": ["a"]}
    assert s.tasks["a"].queued == T0 + 105


# ----------------------------------------------------------------------------- processes


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_worker_killed_with_sigkill_is_recorded_as_dying_when_it_died(
    cli: Cli, tmp_path: Path
) -> None:
    """kill -9 of a worker process running a task: the manager keeps its id for the
    rejoin grace (10 s), but the database's ``workers.left`` and the lost try's
    ``ended`` are the kill, within a second, not the grace's end."""
    db = tmp_path / "runs" / "monitoring.db"
    manager = cli.start("manager", "--listen", "127.0.0.1:0", "--monitoring", str(db),
                        "--monitoring-interval", "0.3")  # fmt: skip
    address = cli.line_with(manager, "manager listening on").split(" on ", 1)[1].strip()
    workers = [cli.worker(address, "--cores", "1") for _ in range(2)]
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(2)
            seen: list[str] = []

            async def away(pid: int) -> None:  # the killed worker, while its id is held
                async def held() -> dict[str, Any] | None:
                    st = await cluster.status()
                    return st if st["away"] else None

                st = await wait_until(held, "the killed worker to be away", limit=LIMIT)
                (wid,) = st["away"]
                assert {w.worker_id: w.pid for w in st["workers"]}[wid] == pid
                seen.append(status_text(jsonable(st)))

            _, killed = await kill_the_holder(cluster, workers, tmp_path, db, away)
    ((lost_worker, ended),) = _rows(
        db, "SELECT worker, ended FROM tries WHERE key = 'held' AND outcome = 'worker-lost'"
    )
    # While its id was held, status() listed it away and the console showed it so.
    (text,) = seen
    row = next(line for line in text.splitlines() if lost_worker in line)
    assert row.split("│")[-2].strip() == "away", text
    assert "1 away: connection dropped" in text, text
    ((left, cause),) = _rows(db, 'SELECT "left", cause FROM workers WHERE worker = ?', lost_worker)
    assert cause == "crash"
    # The drop is seen within a second of the kill; the grace is 10 s.
    assert killed <= left < killed + 1.5, left - killed
    assert killed <= ended < killed + 1.5, ended - killed


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_retry_of_a_task_lost_to_a_killed_worker_waited_from_the_drop(
    cli: Cli, tmp_path: Path
) -> None:
    """The user audit with processes: kill -9 of the worker running ``held`` while the
    other worker idles; the retry goes only at the end of the 2 s rejoin grace
    (``--reconnect-timeout 2``), and its try's row has it ready since the drop (the
    killed worker's ``left``, the lost try's ``ended``), not since the grace's end:
    ``sent - queued`` holds the grace, where it was 0."""
    db = tmp_path / "runs" / "monitoring.db"
    lo, hi = PORTS
    flags = ("--monitoring", str(db), "--monitoring-interval", "0.3", "--reconnect-timeout", "2")
    _, address = cli.manager(*flags, port=free_port_between(lo, hi))
    flags = ("--cores", "1", "--port-range", f"{lo}-{hi}")
    workers = [cli.start("worker", address, *flags) for _ in "12"]  # (started together)
    for worker in workers:
        cli.line_with(worker, "joined")
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(2)
            await kill_the_holder(cluster, workers, tmp_path, db)
    ((left,),) = _rows(db, 'SELECT "left" FROM workers WHERE "left" IS NOT NULL')
    rows = _rows(db, "SELECT outcome, queued, sent, ended FROM tries WHERE key = 'held' "
                 "ORDER BY try")  # fmt: skip
    (lost, lost_queued, lost_sent, lost_ended), (ok, queued, sent, _) = rows
    assert (lost, ok) == ("worker-lost", "ok"), rows
    assert lost_queued <= lost_sent <= lost_ended == left, rows
    assert queued == pytest.approx(left, abs=1e-3), rows  # ready since the drop
    assert sent - queued >= 1.9, rows  # not sent before the grace ended: a wait
