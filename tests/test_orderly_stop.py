"""An orderly stop (SIGTERM to a manager, ``Cluster.close``) ends the run before its
workers go, and the monitoring database says what happened, not what the stop did.

Before: the pools' workers were stopped first, so the scheduler took their going for
losses. A task that had finished minutes before, whose output was on such a worker, went
back to waiting (a ``recovery``, ``how='recomputed'``, though nothing ran again), then
was cancelled at the stop: ``tasks.state='cancelled'`` and ``tasks.finished`` the stop's
time. And the firing alerts the manager ended at the stop (Alertmanager heard
``ended_by="manager stopped"``) kept a last ``alerts`` row ``firing``: "latest state per
alert" queries said they fired for ever.

Now the stop's first step (``runtime.node.end_run``) holds the alerts still and ends the
run's tasks: those not finished are cancelled (a running one's try ``cancelled``, cause
``shutdown``), a finished one keeps its end; the workers that go next lose nothing (a
task whose output goes with them stays as it ended: no recovery, no evacuation, no
replica made). The recorder's end of the
run writes a ``resolved`` row, ``ended_by``, per alert still firing.

First the pure cores (exact commands), then a real manager process with a local pool,
stopped by SIGTERM mid-run, and its database's rows.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from actors.alerts_state import (
    AlertState,
    Audit,
    Evaluate,
    Labels,
    Notify,
    Scale,
    Stopping,
    parse_rule,
)
from actors.protocol import FileFact
from actors.scheduler_events import (
    CancelOnWorker,
    ClusterStops,
    Evacuate,
    FileFacts,
    KeyCancelled,
    KeyDone,
    ReplicasCopied,
    Replicate,
    WorkerLeaving,
    WorkerLeft,
)
from actors.scheduler_state import STOPPED_REASON, SchedulerState
from runtime.errors import ManagerStopping
from runtime.kernel import Actor, ActorSystem, handles
from runtime.messages import ClusterStopping
from runtime.metrics import SAMPLE_LABELS
from tests.helpers import (
    MB,
    Cli,
    Factory,
    event,
    finish,
    free_port_between,
    held_at_gate,
    join,
    make_state,
    of,
    run,
    states,
    submit,
    wait_until,
)

__all__ = ["make_state"]

LIMIT = 60  # seconds for the test with processes
PORTS = (49000, 49499)  # this file's ports on 127.0.0.1


def feed_after(s: SchedulerState, seq: int) -> list[tuple[Any, ...]]:
    """The feed's records from entry ``seq`` on, each cut to its first fields."""
    items, _, _ = s.feed_since(seq, 10_000)
    return [(r[0], r[1], r[8], r[9]) if r[0] == "try" else r[:4] for _, recs in items for r in recs]


# ----------------------------------------------------------------------------- the core


def test_at_a_stop_the_tasks_end_first_and_the_workers_then_lose_nothing(
    make_state: Factory,
) -> None:
    s = make_state(monitor=True)
    join(s, "w1")
    join(s, "w2")
    submit(s, {"done": [], "long": [], "later": []}, ["done", "long", "later"])
    finish(s, "w1", "done")  # its output on w1, held by the client; "later" goes there
    assert states(s) == {"done": "memory", "long": "processing", "later": "processing"}
    s.feed_since(0, 10_000)
    seq = s.feed_next

    out = run(s, stop := event(ClusterStops))
    # Running tries stopped on their workers; no client told (the stop tells them).
    assert out == [
        CancelOnWorker(stop.stimulus_id, "w1", ("later",)),
        CancelOnWorker(stop.stimulus_id, "w2", ("long",)),
    ]
    # w1 goes: it copies nothing off (nothing will read it) ...
    out = run(s, leaving := event(WorkerLeaving, worker="w1", cause="shutdown"))
    assert out == [Evacuate(leaving.stimulus_id, "w1", ())]
    # ... and the task whose output goes with it stays as it ended, not made again.
    out = run(s, left := event(WorkerLeft, worker="w1", cause="shutdown"))
    fact = FileFact("done", "created", 100, (), 0, True, False)
    assert out == [FileFacts(left.stimulus_id, (fact,))]  # (no replica left to drop)
    assert states(s) == {"done": "memory", "long": "cancelled", "later": "cancelled"}
    assert feed_after(s, seq) == [
        ("try", "later", "cancelled", "shutdown"),
        ("state", "later", "cancelled", "later"),
        ("try", "long", "cancelled", "shutdown"),
        ("state", "long", "cancelled", "long"),
        ("left", "w1", "shutdown", left.now),  # no "recovery", no new state for "done"
    ]
    assert str(s.tasks["long"].error) == (
        "task 'long' was cancelled: the cluster stopped before it finished"
    )


def test_a_replica_holder_going_at_a_stop_spares_no_recompute_and_gets_no_new_replica(
    make_state: Factory,
) -> None:
    s = make_state(monitor=True)
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    join(s, "w2")
    join(s, "w3")
    out = finish(s, "w1", "long-0", duration=40.0, nbytes=5 * MB)
    assert [(c.worker, c.source) for c in of(out, Replicate)] == [("w2", "w1")]
    run(s, event(ReplicasCopied, worker="w2", asked=("long-0",), got=("long-0",)))
    s.feed_since(0, 10_000)
    seq = s.feed_next
    assert run(s, event(ClusterStops)) == []  # nothing ran
    out = run(s, left := event(WorkerLeft, worker="w1", cause="shutdown"))
    fact = FileFact("long-0", "created", 5 * MB, ("w2",), 0, True, False)
    assert out == [  # no Replicate to w3
        KeyDone(left.stimulus_id, "long-0", "w2", 5 * MB),
        FileFacts(left.stimulus_id, (fact,)),
    ]
    assert s.recomputes_avoided == 0
    assert feed_after(s, seq) == [("left", "w1", "shutdown", left.now)]  # no "recovery"


def test_a_graph_that_comes_after_the_stop_is_cancelled_as_it_comes_and_its_client_told(
    make_state: Factory,
) -> None:
    """Work that reaches the scheduler after the run ended (a remote client's graph
    before the goodbye, an embedded client's flush queued when close() began) is
    cancelled as it comes, with the stop's reason, and its client hears it: it is never
    placed on the workers about to go, and it does not stay queued or waiting in the
    monitoring database once they went."""
    s = make_state(monitor=True)
    join(s, "w1")
    join(s, "w2")
    assert run(s, event(ClusterStops)) == []
    s.feed_since(0, 10_000)
    seq = s.feed_next
    out = submit(s, {"b": [], "c": ["b"]}, ["b", "c"])
    stimulus = out[0].stimulus_id
    assert out == [  # no Execute: told, each with the stop's reason
        KeyCancelled(stimulus, "c", STOPPED_REASON),
        KeyCancelled(stimulus, "b", STOPPED_REASON),
        FileFacts(stimulus, ()),
    ]
    assert states(s) == {"b": "cancelled", "c": "cancelled"}
    assert str(s.tasks["b"].error) == f"task 'b' was cancelled: {STOPPED_REASON}"
    # the workers go: nothing was sent to them, nothing goes back to queued or waiting
    assert run(s, left1 := event(WorkerLeft, worker="w1", cause="shutdown")) == []
    assert run(s, left2 := event(WorkerLeft, worker="w2", cause="shutdown")) == []
    assert states(s) == {"b": "cancelled", "c": "cancelled"}
    assert feed_after(s, seq) == [
        ("state", "c", "waiting", "c"),
        ("state", "c", "cancelled", "c"),
        ("state", "b", "waiting", "b"),
        ("state", "b", "cancelled", "b"),
        ("left", "w1", "shutdown", left1.now),
        ("left", "w2", "shutdown", left2.now),
    ]
    # a client's resubmit of a key the stop cancelled: cancelled again, not queued
    out = submit(s, {"b": []}, ["b"])
    assert out == [
        KeyCancelled(out[0].stimulus_id, "b", STOPPED_REASON),
        FileFacts(out[0].stimulus_id, ()),
    ]
    assert states(s) == {"b": "cancelled", "c": "cancelled"}


QUEUED = parse_rule({
    "name": "Queued", "expr": "corral_queue_depth > 0", "for": 0,
    "action": {"scale_out": {"by": 1, "max_blocks": 4}},
}, SAMPLE_LABELS)  # fmt: skip


def depth(n: float, target: float = 1.0) -> dict[tuple[str, Labels], float]:
    pool: Labels = (("pool", "p"),)
    return {("corral_queue_depth", pool): n, ("corral_blocks_target", pool): target}


def test_a_stop_holds_the_alerts_still() -> None:
    """After ``Stopping`` an evaluation changes nothing: the queue the stop empties
    resolves no alert, a queue that grows fires none and scales nothing."""
    core = AlertState([QUEUED])
    out = core.handle(Evaluate(10.0, depth(3)))
    assert [type(c) for c in out] == [Notify, Scale, Audit]
    assert isinstance(out[1], Scale) and (out[1].pool, out[1].target) == ("p", 2)
    before = core.alerts()
    assert [a.state for a in before] == ["firing"]
    assert core.handle(Stopping(20.0)) == []
    assert core.handle(Evaluate(21.0, depth(0))) == []  # would resolve it
    assert core.handle(Evaluate(40.0, depth(9, 2.0))) == []  # would scale again
    assert core.alerts() == before and core.stopped_at == 20.0
    assert core.handle(Stopping(30.0)) == [] and core.stopped_at == 20.0  # the first counts


# ----------------------------------------------------------------------------- a manager


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as con:
        return con.execute(sql).fetchall()


def _inc(x: int) -> int:
    return x + 1


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_sigterm_mid_run_leaves_finished_tasks_and_firing_alerts_as_they_were(
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    port = free_port_between(*PORTS)
    config = tmp_path / "corral.toml"
    config.write_text(
        "[pools.a]\nprovider = 'local'\nmin_blocks = 1\ninit_blocks = 1\nmax_blocks = 1\n"
        f"worker_port_range = '{PORTS[0]}-{PORTS[1]}'\n"
        "[alerting]\ninterval = 0.2\ndefault_rules = false\n"
        "[[alerts]]\nname = 'Queued'\nexpr = 'corral_queue_depth{pool=\"a\"} > 0'\nfor = 0\n"
    )
    db = tmp_path / "run.sqlite"
    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}", "--config", str(config),
            "--monitoring", str(db), "--monitoring-interval", "0.2",
        )  # fmt: skip
        line = await anyio.to_thread.run_sync(cli.line_with, manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        try:
            async with Cluster(address) as c:
                done = c.submit(_inc, 1, pool="a", key="done")  # held: its output is wanted
                assert await done == 2
                held = c.submit(held_at_gate, str(gate), str(started), pool="a", key="held")
                # behind it, more than the worker takes: the alert fires
                queued = [c.submit(_inc, i, pool="a", key=f"queued-{i}") for i in range(4)]
                await wait_until(started.exists, "the held task running")

                async def firing() -> bool:
                    return any(a.state == "firing" for a in (await c.alerts()).alerts)

                await wait_until(firing, "the queue alert firing")
                stopped = time.time()
                manager.send_signal(signal.SIGTERM)
                assert await anyio.to_thread.run_sync(manager.wait, LIMIT) == 0
                for f in (held, *queued):  # told the manager stopped, not cancelled
                    assert isinstance(await f.exception(), ManagerStopping)
        finally:
            gate.touch()

    rows = _rows(db, "SELECT key, state, finished FROM tasks")
    tasks = {key: (state, finished) for key, state, finished in rows}
    # Finished before the stop: its end kept, its finish time too ("released" once the
    # client's connection closed at the goodbye let its key go, if the run's end was
    # recorded after that).
    assert tasks["done"][0] in ("memory", "released") and tasks["done"][1] < stopped
    assert _rows(db, "SELECT outcome FROM tries WHERE key = 'done'") == [("ok",)]
    # Not finished: cancelled at the stop, the running one's try cancelled as the stop's.
    assert {k: state for k, (state, _) in tasks.items() if k != "done"} == {
        k: "cancelled" for k in ("held", "queued-0", "queued-1", "queued-2", "queued-3")
    }
    assert tasks["held"][1] >= stopped
    assert _rows(db, "SELECT outcome, cause FROM tries WHERE key = 'held'") == [
        ("cancelled", "shutdown")
    ]
    assert _rows(db, "SELECT * FROM recoveries") == []  # nothing was made again
    # The alert the stop ended: its latest row says so, as Alertmanager hears it.
    ((state, annotations, resolved_at, fields),) = _rows(
        db, "SELECT state, annotations, resolved_at, fields FROM alerts WHERE name = 'Queued' "
        "ORDER BY time DESC, rowid DESC LIMIT 1",
    )  # fmt: skip
    assert state == "resolved" and resolved_at >= stopped
    assert json.loads(annotations)["ended_by"] == "manager stopped"
    assert json.loads(fields)["threshold_breached"] == 1  # not seen to clear: ended
    (ended,) = _rows(db, "SELECT ended FROM runs")[0]
    assert resolved_at <= ended


@pytest.mark.anyio
async def test_a_stop_step_that_fails_in_an_actor_still_stops_the_cluster(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop's first step (``end_run``) asks the scheduler to end the run; a failure
    there (a defect in its handler) is logged and the close goes on: the workers and
    the actors stop, where it used to raise out of close() and leave them all up."""
    import actors.scheduler_state as core
    from runtime import Cluster

    def broken(self: SchedulerState, ev: Any) -> None:
        raise RuntimeError("a defect in the stop's cancel")

    monkeypatch.setitem(core._DISPATCH, core.ClusterStops, broken)
    with anyio.fail_after(30):
        cluster = Cluster(workers=1)
        await cluster.start()
        assert await cluster.submit(sum, [1, 2]) == 3
        refs = dict(cluster._plane.refs)
        await cluster.close()
    assert all(ref.stopped for ref in refs.values()), {n: r.stopped for n, r in refs.items()}
    assert "an actor failed to take the cluster's stop; the stop goes on" in caplog.text


@pytest.mark.anyio
async def test_a_submit_whose_graph_crosses_close_ends_with_the_stops_cancel_not_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A submit made just before close(), whose graph reaches the scheduler only after
    close() ended the run (its client's flush held until then), is not run on the
    workers about to go (it used to be, and its future got its result) but cancelled as
    it comes: its future raises CancelledError saying the cluster stopped."""
    import runtime.client as client_module
    from runtime import Cluster
    from runtime.errors import CancelledError

    ended = anyio.Event()  # the run ended: the held graph may go
    seen: list[BaseException | None] = []
    end_run, for_manager = client_module.end_run, client_module._for_manager

    async def held(manager: Any, request: Any, **kw: Any) -> Any:
        if "late" in request.keys:
            await ended.wait()
        return await for_manager(manager, request, **kw)

    async def end_run_then_wait(plane: Any) -> None:
        await end_run(plane)
        ended.set()
        with anyio.fail_after(10):  # its answer, before the client and workers stop
            seen.append(await late.exception())

    monkeypatch.setattr(client_module, "_for_manager", held)
    monkeypatch.setattr(client_module, "end_run", end_run_then_wait)
    with anyio.fail_after(30):
        async with Cluster(workers=1) as cluster:
            assert await cluster.submit(_inc, 1, key="early") == 2
            late = cluster.submit(_inc, 2, key="late")
    (err,) = seen
    assert isinstance(err, CancelledError), repr(err)
    assert str(err) == "task 'late' was cancelled: the cluster stopped before it finished"


class _TakesTheStop(Actor):
    """Takes ``ClusterStopping``: says it got it, then answers once ``then`` is set (at
    once without one)."""

    def __init__(self, then: anyio.Event | None = None) -> None:
        self.got = anyio.Event()
        self.then = then

    @handles(ClusterStopping)
    async def cluster_stopping(self, msg: ClusterStopping) -> None:
        self.got.set()
        if self.then is not None:
            await self.then.wait()


@pytest.mark.anyio
async def test_the_stops_first_step_asks_the_monitor_and_the_scheduler_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``end_run`` asks both at once under one bound, so a slow monitor does not hold
    the scheduler's cancel back (one after the other, each with its own bound, the
    workers' stop waited up to twice END_RUN_TIMEOUT: past Slurm's KillWait, a
    SIGTERMed manager could be killed before it cancelled its blocks). Here the monitor
    answers only once the scheduler has the stop: asked one after the other, the
    monitor's ask timed out (logged) before the scheduler was asked."""
    import runtime.node as node

    monkeypatch.setattr(node, "END_RUN_TIMEOUT", 2.0)
    scheduler = _TakesTheStop()
    monitor = _TakesTheStop(then=scheduler.got)
    with anyio.fail_after(10):
        async with ActorSystem() as system:
            refs = {
                "monitor": await system.spawn(monitor, "monitor"),
                "scheduler": await system.spawn(scheduler, "scheduler"),
            }
            await node.end_run(cast(node.ControlPlane, SimpleNamespace(refs=refs)))
    assert monitor.got.is_set() and scheduler.got.is_set()
    assert "did not take the cluster's stop" not in caplog.text
