"""What a drain's copies count as (docs/files.md#replicas, #storage-over-time).

A drained worker's outputs that only it holds and that are still needed are copied to a
worker that stays before it is retired (``_copy_off``, sent as a ``Replicate``). Those
copies are *evacuations*, like the copies off a worker that leaves: a transfer of kind
``evacuation``, no replica (``replicas_made``, ``replica_bytes``, ``replicas``), and the
drained worker's leaving is no loss (no ``recomputes_avoided``, no recovery). The
replication policy's own copies are counted as before. The scheduler's pure core only:
events in, exact commands, counters and monitoring records out.
"""

from __future__ import annotations

from typing import Any

from actors.scheduler import _replicas
from actors.scheduler_events import (
    Command,
    DropData,
    Execute,
    KeyDone,
    ReplicasCopied,
    Replicate,
    RetireWorker,
    WorkerDraining,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from policies import REGISTRY
from runtime.messages import ReplicasStatus
from tests.helpers import (
    Factory,
    event,
    finish,
    finish_all,
    join,
    make_state,
    of,
    release,
    run,
    submit,
)

__all__ = ["make_state"]

NONE = REGISTRY.create("replication", "none")


def fixed(n: int = 1) -> Any:
    return REGISTRY.create("replication", "fixed", {"replicas": n})


def drain(s: SchedulerState, worker: str) -> list[Command]:
    return run(s, event(WorkerDraining, worker=worker))


def copied(s: SchedulerState, worker: str, *keys: str, got: bool = True) -> list[Command]:
    return run(s, event(ReplicasCopied, worker=worker, asked=keys, got=keys if got else ()))


def records(s: SchedulerState, kind: str) -> list[tuple[Any, ...]]:
    entries, _, _ = s.feed_since(0, 10_000)
    return [r for _, recs in entries for r in recs if r[0] == kind]


def counts(s: SchedulerState) -> tuple[int, int, int, int, int]:
    """``(made, bytes, failed, recomputes avoided, outputs with replicas)``."""
    return (s.replicas_made, s.replica_bytes, s.replicas_failed, s.recomputes_avoided,
            len(s.replicas))  # fmt: skip


def notes(s: SchedulerState, *keys: str) -> list[str]:
    return [str(f) for _, _, f, _, _ in s.story(*keys)]


def three_on_w1(s: SchedulerState) -> list[str]:
    """w1 made three outputs a client wants (no other worker then); w2 joins after."""
    keys = ["x-0", "x-1", "x-2"]
    join(s, "w1", cores=3)
    submit(s, dict.fromkeys(keys, ()), keys)
    finish_all(s, "w1", keys, nbytes=100)
    join(s, "w2")
    return keys


def test_a_drain_with_replication_none_copies_evacuations_not_replicas(
    make_state: Factory,
) -> None:
    s = make_state(monitor=True, replication=NONE)
    keys = three_on_w1(s)
    cmds = drain(s, "w1")
    sid = cmds[0].stimulus_id
    # Copied off all the same (the one copy path), before w1 is retired.
    assert of(cmds, Replicate) == [Replicate(sid, "w2", "w1", ((k, 100),)) for k in keys]
    assert of(cmds, RetireWorker) == []
    assert notes(s, "x-0")[-1] == "evacuate:w1->w2"
    cmds = copied(s, "w2", *keys)  # one event later: each copy took 1 s
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w1")]
    assert notes(s, "x-0")[-1] == "evacuated:w2"
    assert records(s, "transfer") == [
        ("transfer", k, "evacuation", 100, "w1", "w2", 1.0) for k in keys
    ]
    cmds = run(s, event(WorkerLeft, worker="w1", cause="drained"))
    sid = cmds[0].stimulus_id
    assert of(cmds, Execute) == []  # nothing lost, nothing made again
    done = sorted(of(cmds, KeyDone), key=lambda c: c.key)  # clients learn where
    assert done == [KeyDone(sid, k, "w2", 100) for k in keys]
    assert all(s.tasks[k].who_has == {"w2"} for k in keys)
    # No replica made, no recompute avoided, no recovery: what status and /metrics show.
    assert counts(s) == (0, 0, 0, 0, 0) and s.replicas == {}
    assert _replicas(s) == ReplicasStatus(0, 0, 0, 0, 0)
    assert dict(s.storage.transfers) == {"evacuation": 3}
    assert dict(s.storage.transfer_bytes) == {"evacuation": 300}
    assert dict(s.storage.recoveries) == {} and records(s, "recovery") == []
    assert s.storage.bytes_out["w1"] == 300 and s.storage.bytes_in["w2"] == 300


def test_the_copy_off_a_drained_worker_is_no_replica_whatever_the_policy(
    make_state: Factory,
) -> None:
    """With a policy that wants a replica of every output: made when w1 was alone, the
    outputs have none; the drain's copies are evacuations still."""
    s = make_state(monitor=True, replication=fixed())
    keys = three_on_w1(s)
    cmds = drain(s, "w1")
    assert [c.keys for c in of(cmds, Replicate)] == [((k, 100),) for k in keys]
    copied(s, "w2", *keys)
    run(s, event(WorkerLeft, worker="w1", cause="drained"))
    assert counts(s) == (0, 0, 0, 0, 0)
    assert dict(s.storage.transfers) == {"evacuation": 3}
    assert records(s, "recovery") == []


def test_a_failed_copy_off_a_drained_worker_is_no_failed_replica(make_state: Factory) -> None:
    s = make_state(monitor=True, replication=NONE)
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    join(s, "w2")
    join(s, "w3")
    drain(s, "w1")
    cmds = copied(s, "w2", "a", got=False)
    # Asked again of the other worker by the drain (not of w2 again), still no replica.
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, "w3", "w1", (("a", 100),))]
    assert "evacuation-failed:w2" in notes(s, "a")
    assert counts(s) == (0, 0, 0, 0, 0)
    cmds = copied(s, "w3", "a")
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w1")]
    assert dict(s.storage.transfers) == {"evacuation": 1} and counts(s) == (0, 0, 0, 0, 0)


def test_a_late_answer_from_a_lost_target_is_no_failed_replica(make_state: Factory) -> None:
    s = make_state(replication=NONE)
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    join(s, "w2")
    drain(s, "w1")  # a -> w2
    run(s, event(WorkerLeft, worker="w2", cause="preempted"))
    cmds = join(s, "w3")  # the copy to w2 is forgotten: asked of w3 now
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, "w3", "w1", (("a", 100),))]
    copied(s, "w2", "a", got=False)  # the answer for w2 comes after all
    assert counts(s) == (0, 0, 0, 0, 0)
    cmds = copied(s, "w3", "a")
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w1")]
    assert s.evacuating == set() and dict(s.storage.transfers) == {"evacuation": 1}


def test_a_copy_off_a_drained_worker_of_an_output_let_go_meanwhile_is_dropped(
    make_state: Factory,
) -> None:
    """The client lets ``a`` go while its copy is on its way: the registry drops it where
    it knew it to be (w1), so the copy that lands on w2 is dropped, not tracked."""
    s = make_state(monitor=True, replication=NONE)
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    finish(s, "w1", "a")
    join(s, "w2")
    drain(s, "w1")
    cmds = release(s, "a")
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w1")]
    cmds = copied(s, "w2", "a")
    assert of(cmds, DropData) == [DropData(cmds[0].stimulus_id, "w2", ("a",))]
    assert s.tasks["a"].who_has == {"w1"} and records(s, "transfer") == []


def test_the_replication_policy_s_copies_count_as_before(make_state: Factory) -> None:
    s = make_state(monitor=True, replication=fixed())
    join(s, "w1")
    join(s, "w2")
    submit(s, {"a": []}, ["a"])
    holder = s.tasks["a"].worker or ""
    other = "w2" if holder == "w1" else "w1"
    cmds = finish(s, holder, "a", nbytes=100)
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, other, holder, (("a", 100),))]
    copied(s, other, "a")
    assert counts(s) == (1, 100, 0, 0, 1) and s.replicas == {s.tasks["a"]: {other}}
    assert [r[2] for r in records(s, "transfer")] == ["replica"]
    # The holder of the original is lost: the replica spares a recompute.
    cmds = run(s, event(WorkerLeft, worker=holder, cause="crash"))
    assert of(cmds, Execute) == []
    assert counts(s) == (1, 100, 0, 1, 1)
    assert records(s, "recovery") == [("recovery", "a", "a", holder, "replica")]
    assert dict(s.storage.transfers) == {"replica": 1}


def test_draining_a_worker_whose_outputs_have_replicas_counts_nothing_more(
    make_state: Factory,
) -> None:
    """``a`` has a replica on w2 (one made, counted); ``b`` has none. Draining w1 copies
    ``b`` alone (an evacuation); w1 leaving loses nothing: no recompute avoided."""
    s = make_state(monitor=True, replication=fixed())
    join(s, "w1", cores=2)
    submit(s, {"a": [], "b": []}, ["a", "b"])
    finish(s, "w1", "b", nbytes=50)  # alone: no replica
    join(s, "w2")
    cmds = finish(s, "w1", "a", nbytes=100)
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, "w2", "w1", (("a", 100),))]
    copied(s, "w2", "a")
    assert counts(s) == (1, 100, 0, 0, 1)
    cmds = drain(s, "w1")
    assert of(cmds, Replicate) == [Replicate(cmds[0].stimulus_id, "w2", "w1", (("b", 50),))]
    cmds = copied(s, "w2", "b")
    assert of(cmds, RetireWorker) == [RetireWorker(cmds[0].stimulus_id, "w1")]
    cmds = run(s, event(WorkerLeft, worker="w1", cause="drained"))
    assert of(cmds, Execute) == [] and of(cmds, Replicate) == []  # one worker left
    assert counts(s) == (1, 100, 0, 0, 1)
    assert dict(s.storage.transfers) == {"replica": 1, "evacuation": 1}
    assert dict(s.storage.recoveries) == {} and records(s, "recovery") == []
    assert "kept-by-replica:w2" not in notes(s, "a")
