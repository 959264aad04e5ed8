"""Checkpoints (docs/files.md#checkpoints): a running task saves its progress with
``checkpoint(obj)`` (or ``checkpoint_file(path)``) as a file on its worker's disk; a
try that starts after its worker was lost gets it back with ``restore()`` (or
``restore_path()``).

First the scheduler's pure core, the checkpoint registry: what it keeps, where it has
copies made, what a try after a loss starts from, what it has deleted and when. Then
the task-side API and the worker's table of checkpoint files. Then clusters: thread
and process execution, the disk budget, pruning, and real worker processes killed with
SIGKILL: a task of 30 steps, checkpointing after each, killed twice, finishes having
redone at most one step per kill (threads and task processes); a checkpoint too large
to travel, copied to a peer, outlives its worker.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.checkpoints import CheckpointFiles
from actors.scheduler_events import (
    CheckpointCopied,
    CopyCheckpoint,
    DropCheckpoints,
    Execute,
    TaskCheckpointed,
    Tick,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
    WorkerMemory,
)
from actors.scheduler_state import SchedulerState
from runtime import CheckpointError, WorkerLost, checkpoint, checkpoint_file, restore, restore_path
from runtime.task import TaskContext, checkpoint_name, running
from tests.helpers import (
    GB,
    Cli,
    Factory,
    event,
    finish,
    join,
    make_state,
    of,
    run,
    submit,
    wait_until,
)

__all__ = ["make_state"]

LIMIT = 100  # seconds for the test with processes


# ----------------------------------------------------------------------------- the core

MB = 2**20


def saved(s: SchedulerState, worker: str, key: str, seq: int, obj: Any) -> list[Any]:
    """A small checkpoint: its bytes travel with it."""
    data = pickle.dumps(obj)
    return run(
        s, event(TaskCheckpointed, worker=worker, key=key, seq=seq, nbytes=len(data), data=data)
    )


def saved_large(s: SchedulerState, worker: str, key: str, seq: int, nbytes: int) -> list[Any]:
    """A checkpoint too large to travel: only its size does."""
    return run(s, event(TaskCheckpointed, worker=worker, key=key, seq=seq, nbytes=nbytes))


def copied(s: SchedulerState, worker: str, key: str, seq: int, ok: bool = True) -> list[Any]:
    return run(s, event(CheckpointCopied, worker=worker, key=key, seq=seq, ok=ok))


def drops(cmds: list[Any]) -> dict[str, tuple[Any, ...]]:
    return {c.worker: c.items for c in of(cmds, DropCheckpoints)}


def sent_to(cmds: list[Any], key: str) -> Any:
    (task,) = [t for c in of(cmds, Execute) for t in c.tasks if t.key == key]
    return task


def join_disk(s: SchedulerState, worker: str, disk: int, pool: str = "default") -> None:
    run(s, event(WorkerJoined, worker=worker, cores=1, memory=GB, pool=pool, disk=disk))


def running_on_w1(make_state: Factory, *peers: str) -> SchedulerState:
    """``long-0`` runs on w1; ``peers`` joined after it; each offers 100 MB of disk."""
    s = make_state()
    join_disk(s, "w1", 100 * MB)
    submit(s, {"long-0": []}, ["long-0"])
    for peer in peers:
        join_disk(s, peer, 100 * MB)
    return s


def test_the_latest_checkpoint_goes_to_the_try_after_a_loss_and_is_dropped_at_the_end(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    first = sent_to(submit(s, {"long-0": []}, ["long-0"]), "long-0")
    assert first.checkpoint is None  # a first try starts from nothing
    saved(s, "w1", "long-0", 1, {"step": 1})
    cmds = saved(s, "w1", "long-0", 2, {"step": 2})
    two = pickle.dumps({"step": 2})
    # Held by the scheduler (a copy off the worker): the older one's file goes.
    assert drops(cmds) == {"w1": (("long-0", 1),)} and not of(cmds, CopyCheckpoint)
    ((cp,),) = s.checkpoints.values()
    assert (cp.seq, cp.data, cp.owner, cp.holders) == (2, two, "w1", {"w1"})
    assert s.checkpoint_counts["saved"] == 2 and s.checkpoint_held == len(two)
    join(s, "w2")
    retry = sent_to(run(s, event(WorkerLeft, worker="w1", cause="crash")), "long-0")
    assert retry.checkpoint == (2, two, "", len(two))
    assert s.checkpoint_counts["resumed"] == 1
    story = [e[1:3] for e in s.story("long-0")]
    assert ("checkpoint", f"checkpoint:2:{len(two)}") in story
    assert story[-1] == ("resume", f"checkpoint:2:{len(two)}")
    cmds = finish(s, "w2", "long-0")
    assert drops(cmds) == {"w2": (("long-0", 0),)}  # the file the retry started from
    assert s.checkpoints == {} and s.checkpoint_counts["pruned"] == 1 and s.checkpoint_held == 0


def test_an_older_a_late_or_a_stranger_s_checkpoint_is_deleted_from_its_worker(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    join(s, "w2")
    submit(s, {"long-0": []}, ["long-0"])
    runner = s.tasks["long-0"].worker or ""
    other = "w2" if runner == "w1" else "w1"
    saved(s, runner, "long-0", 3, "three")
    assert drops(saved(s, runner, "long-0", 2, "two")) == {runner: (("long-0", 2),)}
    assert drops(saved(s, other, "long-0", 4, "not mine")) == {other: (("long-0", 4),)}
    assert s.checkpoints["long-0"][0].seq == 3
    assert drops(finish(s, runner, "long-0")) == {runner: (("long-0", 0),)}
    assert drops(saved(s, runner, "long-0", 4, "after the end")) == {runner: (("long-0", 4),)}
    assert drops(saved(s, runner, "other", 1, "unknown key")) == {runner: (("other", 1),)}
    assert s.checkpoints == {} and s.checkpoint_counts["saved"] == 1


def test_a_speculative_copy_starts_from_the_latest_checkpoint(make_state: Factory) -> None:
    from tests.test_speculation import T0, at, straggler

    s = straggler(make_state)  # t-5 runs long on w1, w2 idles
    at(s, TaskCheckpointed, T0 + 1, worker="w1", key="t-5", seq=4, nbytes=4, data=b"four")
    (copy,) = [t for c in of(at(s, Tick, T0 + 2.1), Execute) if c.worker == "w2" for t in c.tasks]
    assert copy.key == "t-5" and copy.checkpoint == (4, b"four", "", 4)
    at(s, TaskCheckpointed, T0 + 3, worker="w2", key="t-5", seq=5, nbytes=4, data=b"five")
    ((cp,),) = s.checkpoints.values()  # the copy's own, numbered on
    assert (cp.seq, cp.data, cp.owner) == (5, b"five", "w2")


def test_a_failed_task_drops_its_checkpoint(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    saved(s, "w1", "long-0", 1, "one")
    assert drops(finish(s, "w1", "long-0", "error")) == {"w1": (("long-0", 0),)}
    assert s.tasks["long-0"].state == "erred" and s.checkpoints == {}


def test_past_the_scheduler_s_budget_a_checkpoint_stays_on_its_worker_s_disk(
    make_state: Factory,
) -> None:
    one = len(pickle.dumps(b"x" * 100))
    s = make_state(checkpoint_bytes=2 * one)
    join(s, "w1", cores=3)
    submit(s, {"a-0": [], "b-0": [], "c-0": []}, ["a-0", "b-0", "c-0"])
    saved(s, "w1", "a-0", 1, b"x" * 100)
    saved(s, "w1", "b-0", 1, b"x" * 100)
    saved(s, "w1", "a-0", 2, b"y" * 100)  # replaces its own: the total stays
    cmds = saved(s, "w1", "c-0", 1, b"x" * 100)  # a third: past the budget
    assert not of(cmds, CopyCheckpoint)  # no peer to copy it to: on w1 only
    (c,) = s.checkpoints["c-0"]
    assert c.data is None and c.holders == {"w1"} and s.checkpoint_held == 2 * one
    assert s.checkpoints["a-0"][0].seq == 2 and s.checkpoint_counts["refused"] == 1
    assert ("c-0", "checkpoint-refused") in [e[:2] for e in s.story_log]
    assert ("c-0", "checkpoint-uncopied") in [e[:2] for e in s.story_log]
    finish(s, "w1", "a-0")
    saved(s, "w1", "c-0", 2, b"x" * 100)  # room again: held, and the older one goes
    assert [c.seq for c in s.checkpoints["c-0"]] == [2] and s.checkpoint_held == 2 * one


def test_a_large_checkpoint_is_copied_to_the_peer_with_most_disk_in_its_pool(
    make_state: Factory,
) -> None:
    s = running_on_w1(make_state, "w2", "w3")
    join_disk(s, "w4", 10 * MB)  # too little room
    join_disk(s, "x1", 900 * MB, pool="other")  # another pool
    run(s, event(WorkerMemory, worker="w2", throttled=False, rss=0, throttle_at=0,
                 limit=GB, disk_used=50 * MB))  # fmt: skip
    cmds = saved_large(s, "w1", "long-0", 1, 20 * MB)
    assert of(cmds, CopyCheckpoint) == [
        CopyCheckpoint(cmds[0].stimulus_id, "w3", "w1", "long-0", 1, 20 * MB)
    ]
    assert not drops(cmds)
    cmds = copied(s, "w3", "long-0", 1)
    ((cp,),) = s.checkpoints.values()
    assert cp.holders == {"w1", "w3"} and cp.off_worker and s.checkpoint_counts["copied"] == 1
    assert s.storage.transfers["checkpoint"] == 1  # in the storage view, as a transfer
    # The next one is not off w1 yet: the one before stays until its copy is made.
    cmds = saved_large(s, "w1", "long-0", 2, 20 * MB)
    assert [c.seq for c in s.checkpoints["long-0"]] == [2, 1] and not drops(cmds)
    assert [(c.worker, c.seq) for c in of(cmds, CopyCheckpoint)] == [("w3", 2)]
    cmds = copied(s, "w3", "long-0", 2)
    assert drops(cmds) == {"w1": (("long-0", 1),), "w3": (("long-0", 1),)}
    assert [c.seq for c in s.checkpoints["long-0"]] == [2]
    cmds = finish(s, "w1", "long-0")
    assert drops(cmds) == {"w1": (("long-0", 0),), "w3": (("long-0", 0),)}


def test_losing_the_owner_resumes_from_the_newest_checkpoint_that_survived(
    make_state: Factory,
) -> None:
    s = running_on_w1(make_state, "w2")
    saved_large(s, "w1", "long-0", 1, 20 * MB)
    copied(s, "w2", "long-0", 1)
    saved_large(s, "w1", "long-0", 2, 20 * MB)  # its copy is not made yet
    join_disk(s, "w3", 100 * MB)
    retry = sent_to(run(s, event(WorkerLeft, worker="w1", cause="preempted")), "long-0")
    assert retry.checkpoint == (1, None, "w2", 20 * MB)  # where the newest survivor is
    assert s.checkpoint_counts["lost"] == 1
    assert ("long-0", "checkpoint-lost", "checkpoint:2:w1") in [e[:3] for e in s.story_log]
    # The copy of 2 answers late (its copier got the file, but 2 is gone): deleted.
    assert drops(copied(s, "w2", "long-0", 2)) == {"w2": (("long-0", 2),)}
    # The retry's checkpoints number on and replace it.
    runner = s.tasks["long-0"].worker or ""
    saved(s, runner, "long-0", 2, "two again")
    assert [c.seq for c in s.checkpoints["long-0"]] == [2]


def test_a_checkpoint_on_a_lost_worker_only_is_lost_and_the_retry_starts_over(
    make_state: Factory,
) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"long-0": []}, ["long-0"])
    saved_large(s, "w1", "long-0", 1, 20 * MB)  # no peer: on w1 only
    join(s, "w2")
    cmds = copied(s, "w2", "long-0", 1, ok=False)  # (a stray failed copy changes nothing)
    assert s.checkpoint_counts["copy-failed"] == 1 and not drops(cmds)
    retry = sent_to(run(s, event(WorkerLeft, worker="w1", cause="crash")), "long-0")
    assert retry.checkpoint is None and s.checkpoints == {}
    assert s.checkpoint_counts["lost"] == 1


def lost_in_turn(s: SchedulerState, key: str, losses: int, cause: str, save: bool) -> None:
    """``losses`` times: the worker running ``key`` saves a checkpoint (``save``), a
    fresh worker joins and the one running it is lost with ``cause``."""
    for _ in range(losses):
        ts = s.tasks[key]
        assert ts.state == "processing" and ts.worker is not None, s.story(key)[-2:]
        worker = ts.worker
        if save:
            saved(s, worker, key, (ts.resumed[0] if ts.resumed else 0) + 1, "progress")
        join(s, f"w{len(s.workers) + len(s.story_log)}")
        run(s, event(WorkerLeft, worker=worker, cause=cause))


@pytest.mark.parametrize("cause", ["walltime", "preempted"])
def test_a_task_whose_every_try_saves_a_checkpoint_outlives_any_number_of_losses(
    make_state: Factory, cause: str
) -> None:
    """A user audit (a condo cluster): a long task that checkpoints, on blocks whose
    walltime is shorter than the task, failed with WorkerLost at its 6th walltime
    ('lost 6 times', the default max_lost = 5), its progress thrown away, though each
    block had moved it on: every loss counted, progress or not. A loss after which a
    checkpoint of its try survives now starts the count again."""
    s = make_state()
    join(s, "w0")
    submit(s, {"long-0": []}, ["long-0"])
    lost_in_turn(s, "long-0", 12, cause, save=True)
    ts = s.tasks["long-0"]
    assert (ts.state, ts.lost_tries, ts.lost_since_saved) == ("processing", 12, 0)
    assert ts.resumed is not None and ts.resumed[0] == 12  # its 13th try goes on from 12
    finish(s, ts.worker or "", "long-0")
    assert s.tasks["long-0"].state == "memory"


def test_losses_that_save_nothing_still_fail_the_task_after_max_lost_in_a_row(
    make_state: Factory,
) -> None:
    """Progress earlier does not exempt a task that stops saving: more than max_lost (5)
    losses in a row with no checkpoint of their try left fail it, as before, and the
    error says how many tries it had and that checkpoints would let it go on."""
    s = make_state()
    join(s, "w0")
    submit(s, {"long-0": []}, ["long-0"])
    lost_in_turn(s, "long-0", 3, "walltime", save=True)
    lost_in_turn(s, "long-0", 5, "walltime", save=False)
    ts = s.tasks["long-0"]
    assert (ts.state, ts.lost_tries, ts.lost_since_saved) == ("processing", 8, 5)
    lost_in_turn(s, "long-0", 1, "walltime", save=False)
    assert (ts.state, ts.lost_since_saved) == ("erred", 6)
    assert isinstance(ts.error, WorkerLost) and "after 9 tries" in str(ts.error), ts.error
    assert "checkpoint" in str(ts.error)  # says what lets a long task go on


def test_a_leaving_worker_s_only_copies_go_to_a_peer_within_its_grace(
    make_state: Factory,
) -> None:
    s = running_on_w1(make_state)
    saved_large(s, "w1", "long-0", 1, 20 * MB)  # no peer yet: on w1 only
    join_disk(s, "w2", 100 * MB)
    cmds = run(s, event(WorkerLeaving, worker="w1", cause="preempted"))
    (copy,) = of(cmds, CopyCheckpoint)
    assert (copy.worker, copy.source, copy.key, copy.seq) == ("w2", "w1", "long-0", 1)
    copied(s, "w2", "long-0", 1)
    retry = sent_to(run(s, event(WorkerLeft, worker="w1", cause="preempted")), "long-0")
    assert retry.checkpoint == (1, None, "w2", 20 * MB) and s.checkpoint_counts["lost"] == 0


def test_a_pool_s_leaving_workers_holding_every_copy_copy_it_to_another_pool_s_survivor(
    make_state: Factory,
) -> None:
    """One preemption takes both workers of pool ``ckpt`` (owner and peer copy): the
    first to say it leaves has the checkpoint copied to ``owner-1`` of pool ``owner``,
    the only survivor, within the grace; the retry resumes from that copy (the ckpt
    audit's defect 2: it was lost, ``checkpoint-lost``, and the retry started over)."""
    s = make_state()
    join_disk(s, "ckpt-1", 100 * MB, pool="ckpt")
    submit(s, {"long-0": []}, ["long-0"])
    join_disk(s, "ckpt-2", 100 * MB, pool="ckpt")
    join_disk(s, "owner-1", 100 * MB, pool="owner")
    cmds = saved_large(s, "ckpt-1", "long-0", 1, 20 * MB)
    assert [(c.worker, c.source) for c in of(cmds, CopyCheckpoint)] == [("ckpt-2", "ckpt-1")]
    copied(s, "ckpt-2", "long-0", 1)  # its pool's peer: the copy of the docs
    cmds = run(s, event(WorkerLeaving, worker="ckpt-2", cause="preempted"))
    assert not of(cmds, CopyCheckpoint)  # ckpt-1 stays, for all the scheduler knows
    cmds = run(s, event(WorkerLeaving, worker="ckpt-1", cause="preempted"))
    assert of(cmds, CopyCheckpoint) == [
        CopyCheckpoint(cmds[0].stimulus_id, "owner-1", "ckpt-1", "long-0", 1, 20 * MB)
    ]
    copied(s, "owner-1", "long-0", 1)
    run(s, event(WorkerLeft, worker="ckpt-2", cause="preempted"))
    retry = sent_to(run(s, event(WorkerLeft, worker="ckpt-1", cause="preempted")), "long-0")
    assert retry.checkpoint == (1, None, "owner-1", 20 * MB)
    assert s.checkpoint_counts["lost"] == 0


def test_a_leaving_block_s_copy_in_flight_to_its_sibling_goes_to_a_survivor(
    make_state: Factory,
) -> None:
    """The owner's copy is on its way to a peer of its pool when both leave: the
    second Leaving (the copy's target) has it copied to the other pool's survivor."""
    s = make_state()
    join_disk(s, "a1", 100 * MB, pool="a")
    submit(s, {"long-0": []}, ["long-0"])
    join_disk(s, "a2", 100 * MB, pool="a")
    cmds = saved_large(s, "a1", "long-0", 1, 20 * MB)
    assert [c.worker for c in of(cmds, CopyCheckpoint)] == ["a2"]
    join_disk(s, "b1", 100 * MB, pool="b")
    cmds = run(s, event(WorkerLeaving, worker="a1", cause="preempted"))
    assert not of(cmds, CopyCheckpoint)  # on its way to a2, which stays so far
    cmds = run(s, event(WorkerLeaving, worker="a2", cause="preempted"))
    assert [(c.worker, c.source) for c in of(cmds, CopyCheckpoint)] == [("b1", "a1")]


# ----------------------------------------------------------------------------- the task API


def context(tmp_path: Path, room: int = 10**9) -> tuple[TaskContext, list[Any]]:
    """A task context writing to ``tmp_path``, granting ``room`` bytes per checkpoint."""
    got: list[Any] = []

    def reserve(key: Any, seq: int, nbytes: int) -> str | None:
        return None if nbytes <= room else f"{nbytes} bytes, {room} left"

    ctx = TaskContext("k", 0, None, str(tmp_path), reserve, lambda *a: got.append(a))
    return ctx, got


def test_checkpoint_and_restore_write_files_in_the_context_s_directory(tmp_path: Path) -> None:
    ctx, got = context(tmp_path)
    with running(ctx):
        assert restore() is None and restore_path() is None
        assert checkpoint([1, 2]) == 1
        assert checkpoint([1, 2, 3]) == 2
        assert restore() == [1, 2, 3]
        assert restore_path() == str(tmp_path / checkpoint_name("k", 2))
    assert [(k, n) for k, n, _, _ in got] == [("k", 1), ("k", 2)]
    for _, n, path, nbytes in got:
        assert os.path.getsize(path) == nbytes and Path(path).name == checkpoint_name("k", n)
    assert not list(tmp_path.glob("*.tmp"))  # written to a temporary name, renamed
    # A later try starts from the latest file and numbers on from it.
    with running(TaskContext("k", 2, got[-1][2], str(tmp_path), ctx.reserve, ctx.saved)):
        assert restore() == [1, 2, 3] and checkpoint("next") == 3


def test_checkpoint_file_copies_the_task_s_own_state_file(tmp_path: Path) -> None:
    ctx, got = context(tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    state = tmp_path / "state.bin"
    state.write_bytes(b"\x00state" * 1000)
    with running(ctx):
        assert checkpoint_file(state) == 1
        state.write_bytes(b"changed later")  # the checkpoint is a copy
        path = restore_path()
        assert path is not None and Path(path).read_bytes() == b"\x00state" * 1000
        with pytest.raises(CheckpointError, match="restore_path"):
            restore()  # not a pickle
        with pytest.raises(CheckpointError, match="cannot be read"):
            checkpoint_file(tmp_path / "missing")
    assert got[0][3] == 6000


def test_a_checkpoint_past_the_room_left_is_refused_and_the_task_goes_on(tmp_path: Path) -> None:
    ctx, got = context(tmp_path, room=100)
    with running(ctx):
        checkpoint("small")
        with pytest.raises(CheckpointError, match="bytes, 100 left") as info:
            checkpoint(b"x" * 1000)
        assert restore() == "small" and checkpoint("small again") == 2
    assert "docs/files.md#checkpoints" in str(info.value)
    assert [n for _, n, _, _ in got] == [1, 2]


def test_bad_calls_get_a_typed_error_that_says_what_to_do() -> None:
    for call in (lambda: checkpoint(1), restore, restore_path, lambda: checkpoint_file("f")):
        with pytest.raises(CheckpointError, match="outside a running task"):
            call()
    with running(TaskContext("k", why="no checkpoints here, for a reason.")):
        with pytest.raises(CheckpointError, match="for a reason") as info:
            checkpoint(1)
        assert restore() is None
    assert "docs/files.md#checkpoints" in str(info.value)


def test_the_worker_s_table_counts_reserved_and_written_files_in_one_budget(
    tmp_path: Path,
) -> None:
    left = [1000]
    files = CheckpointFiles(str(tmp_path / "checkpoints"), "w1", lambda: left[0])
    assert files.reserve("k", 1, 600) is None and files.nbytes == 600
    left[0] = 400  # what the worker's disk has left now counts the reservation
    assert "600 bytes, more than the 400 bytes of disk worker 'w1' has left" in (
        files.reserve("k", 2, 600) or ""
    )
    path = files.path("k", 1)
    Path(path).write_bytes(b"x" * 600)
    files.commit("k", 1, path, 600)
    assert files.nbytes == 600 and files.latest("k") == (1, path)
    assert files.reserve("k", 2, 300) is None
    files.release("k", 2)  # its write failed
    assert files.nbytes == 600
    assert files.reserve("k", 3, 100) is None and files.pending
    Path(path.replace("-1.ckpt", "-3.ckpt.tmp")).write_bytes(b"partial")
    files.settle("k")  # its try ended (a task process killed mid-write)
    assert files.nbytes == 600 and not files.pending and not list(tmp_path.rglob("*.tmp"))
    # Killed once its file was in place but before the worker heard of it: it goes too.
    assert files.reserve("k", 4, 100) is None
    Path(files.path("k", 4)).write_bytes(b"whole")
    files.settle("k")
    assert files.nbytes == 600 and not os.path.exists(files.path("k", 4))
    assert os.path.exists(path)  # the recorded one stays
    # A copy of k's checkpoint being fetched from a peer is not the try's: it stays.
    assert files.reserve("k", 5, 200, fetch=True) is None
    assert files.reserve("k", 6, 100) is None and files.nbytes == 900
    files.settle("k")  # a try of k ended here meanwhile (a speculative copy, say)
    assert files.nbytes == 800 and files.pending
    files.commit("k", 5, files.path("k", 5), 200)  # the copy landed
    assert files.nbytes == 800 and not files.pending
    files.drop("k", 5)
    assert files.drop("k") == 600 and not os.path.exists(path) and files.nbytes == 0
    directory = files.directory
    files.close()
    assert not os.path.exists(directory)
    # The worker stopped: a task thread still running cannot make the directory again.
    assert "stopped while task 'k' ran" in (files.reserve("k", 4, 1) or "")
    assert not os.path.exists(directory)


def test_the_console_status_counts_the_checkpoints() -> None:
    from runtime.messages import StatusReply
    from tests.helpers import status_text as text

    assert "checkpoints:" not in text(StatusReply().to_dict())
    counts = {"held": 1, "held_bytes": 120, "saved": 31, "resumed": 2, "pruned": 0, "refused": 0}
    st = StatusReply(checkpoints=counts).to_dict()
    assert "checkpoints: 1 held (120 B), 31 saved, 2 resumed, 0 pruned, 0 refused\n" in text(st)
    counts |= {"disk_bytes": 3 * 2**20, "copied": 4, "lost": 1}
    st = StatusReply(checkpoints=counts).to_dict()
    assert "0 refused, 3.0 MiB on worker disks, 4 copied to peers, 1 lost" in text(st)


# ----------------------------------------------------------------------------- processes

STEPS = 30


def stepper(log: str, steps: int, pause: float) -> int:
    """``steps`` steps, each noted in ``log`` (with the process running it) and then
    checkpointed; started again, it goes on from the step after its checkpoint."""
    import time

    from runtime import checkpoint, restore

    done = restore() or 0
    for i in range(done, steps):
        time.sleep(pause)
        with open(log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        checkpoint(i + 1)
    return sum(range(steps))


def _lines(log: Path) -> list[tuple[int, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        step, pid = line.split()
        out.append((int(step), int(pid)))
    return out


def _reached(log: Path, steps: int) -> Callable[[], bool]:
    return lambda: len(_lines(log)) >= steps


def _worker_of(pid: int, by_pid: dict[int, str]) -> str:
    """The worker whose process is ``pid`` or the parent of ``pid`` (a task process)."""
    import psutil

    if pid in by_pid:
        return by_pid[pid]
    return by_pid[psutil.Process(pid).ppid()]


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_a_task_killed_twice_redoes_at_most_one_step_per_kill(
    tmp_path: Path, execution: str
) -> None:
    from runtime import Cluster

    log = tmp_path / "steps"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        procs = {
            name: cli.worker(address, "--name", name, "--execution", execution,
                             "--spill-dir", str(tmp_path / name))
            for name in ("w-a", "w-b", "w-c")
        }  # fmt: skip
        by_pid = {p.pid: name for name, p in procs.items()}
        async with Cluster(address) as c:
            await c.wait_for_workers(3)
            (x,) = await c.submit_graph({"steps-0": (stepper, str(log), STEPS, 0.1)}, ["steps-0"])
            killed: list[str] = []
            killed_pids: list[int] = []
            for at in (5, 15):  # kill whoever runs it once it has done `at` steps
                await wait_until(_reached(log, at), f"step {at}", limit=40)
                pid = _lines(log)[-1][1]
                name = _worker_of(pid, by_pid)  # its process, or its task process's parent
                assert name not in killed
                procs[name].send_signal(signal.SIGKILL)
                procs[name].wait(10)
                killed.append(name)
                killed_pids.append(pid)
            assert await x == sum(range(STEPS))
            st = (await c.status())["checkpoints"]
            survivor = next(n for n in procs if n not in killed)
            # Pruned at the end: the files are deleted from the survivor's disk too.
            await wait_until(
                lambda: not list((tmp_path / survivor).rglob("*.ckpt")), "files deleted", limit=20
            )
    lines = _lines(log)
    steps = [s for s, _ in lines]
    assert sorted(set(steps)) == list(range(STEPS))
    redone = len(steps) - STEPS
    assert 0 <= redone <= 2, lines  # at most one step (one checkpoint interval) per kill
    assert all(steps.count(i) <= 2 for i in range(STEPS))
    pids = [p for _, p in lines]
    assert len(set(pids)) == 3  # three tries, each in another process
    assert set(killed_pids) <= set(pids[: steps.index(STEPS - 1)])
    assert st["resumed"] == 2 and st["held"] == 0 and st["pruned"] == 1
    assert st["saved"] >= STEPS and st["refused"] == 0 and st["held_bytes"] == 0


def saves_in_a_task_process(n: int, state: str) -> tuple[Any, ...]:
    import multiprocessing

    from runtime import checkpoint, checkpoint_file, restore, restore_path

    seqs = [checkpoint({"i": i}) for i in range(n)]
    got = restore()
    with open(state, "wb") as f:
        f.write(b"own state")
    seqs.append(checkpoint_file(state))
    with open(restore_path() or "", "rb") as f:
        own = f.read()
    return seqs, got, own, multiprocessing.parent_process() is not None


def too_big_for_the_disk(nbytes: int) -> tuple[int, str, int]:
    from runtime import CheckpointError, checkpoint

    first = checkpoint("small")
    try:
        checkpoint(b"x" * nbytes)
    except CheckpointError as exc:
        return first, str(exc), checkpoint("goes on")  # the task carries on
    return first, "", 0


@pytest.mark.anyio
async def test_process_execution_checkpoints_and_the_disk_budget(tmp_path: Path) -> None:
    from runtime import Cluster

    spill = tmp_path / "disk"
    options = {"execution": "process", "spill_dir": str(spill)}
    with anyio.fail_after(90):
        async with Cluster(
            processes=1, threads_per_worker=1, memory_options=options, disk_per_worker=8 * MB
        ) as c:
            await c.wait_for_workers(1, timeout=60)
            seqs, got, own, child = await c.submit(
                saves_in_a_task_process, 3, str(tmp_path / "state")
            )
            assert seqs == [1, 2, 3, 4] and got == {"i": 2} and own == b"own state"
            assert child  # it ran in a task process
            first, error, after = await c.submit(too_big_for_the_disk, 10 * MB)
            assert (first, after) == (1, 2)
            size = len(pickle.dumps(b"x" * (10 * MB), protocol=pickle.HIGHEST_PROTOCOL))
            assert f"is {size} bytes, more than the" in error, error
            assert "bytes of disk worker" in error
            assert "docs/files.md#checkpoints" in error
            await wait_until(lambda: not list(spill.rglob("*.ckpt")), "files deleted", limit=20)
            st = (await c.status())["checkpoints"]
    assert st["saved"] == 6 and st["pruned"] == 2 and st["held"] == 0 and st["held_bytes"] == 0


BIG = 6 * MB  #: more than a worker sends to the scheduler: it stays on disks


def big_state(log: str) -> tuple[str, int, bool, int]:
    """Save a state file of ``BIG`` bytes, then work on (until killed); started again
    from a checkpoint, return what it got."""
    import time

    from runtime import checkpoint_file, restore_path

    path = restore_path()
    if path is not None:
        with open(path, "rb") as f:
            data = f.read()
        return "resumed", len(data), data.startswith(b"progress"), os.getpid()
    state = f"{log}.{os.getpid()}"
    with open(state, "wb") as f:
        f.write(b"progress" + b"\x00" * (BIG - 8))
    checkpoint_file(state)
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(60)
    return "never killed", 0, False, os.getpid()


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT + 30)
async def test_a_large_checkpoint_copied_to_a_peer_outlives_its_worker(tmp_path: Path) -> None:
    """The task needs 2 cores: it runs on w-a or w-c. Its 6 MiB checkpoint is copied to
    the peer with the most disk, w-b (1 core). Its worker killed, the retry runs on the
    other 2-core worker, which fetches the file from w-b before it starts."""
    from runtime import Cluster

    log = tmp_path / "saved"
    shapes = {"w-a": ("2", "200MiB"), "w-b": ("1", "500MiB"), "w-c": ("2", "200MiB")}
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager()
        procs = {
            name: cli.worker(address, "--name", name, "--spill-dir", str(tmp_path / name),
                             "--cores", cores, "--disk", disk)
            for name, (cores, disk) in shapes.items()
        }  # fmt: skip
        by_pid = {p.pid: name for name, p in procs.items()}
        async with Cluster(address) as c:
            await c.wait_for_workers(3)
            (x,) = await c.submit_graph(
                {"big-0": (big_state, str(log))}, ["big-0"], resources={"cores": 2}
            )

            async def copied() -> bool:
                return bool((await c.status())["checkpoints"]["copied"] >= 1)

            await wait_until(copied, "the copy on a peer", limit=40, step=0.1)
            owner = by_pid[int(log.read_text().split()[0])]
            st = (await c.status())["checkpoints"]
            assert st["held_bytes"] == 0 and st["disk_bytes"] == 2 * BIG  # owner and copy
            holders = {n for n in procs if list((tmp_path / n).rglob("*.ckpt"))}
            assert holders == {owner, "w-b"}

            async def counted() -> bool:  # in the disk use the scheduler places by
                disks = (await c.status())["storage"]["workers"]
                return all(disks[n]["disk_used"] >= BIG for n in holders)

            await wait_until(counted, "the files in the disks' use", limit=20, step=0.1)
            procs[owner].send_signal(signal.SIGKILL)
            procs[owner].wait(10)
            how, nbytes, intact, pid = await x
            assert (how, nbytes, intact) == ("resumed", BIG, True)
            assert by_pid[pid] == ({"w-a", "w-c"} - {owner}).pop()  # fetched from w-b
            st = (await c.status())["checkpoints"]
            assert st["resumed"] == 1 and st["pruned"] == 1 and st["lost"] == 0
            storage = (await c.status())["storage"]
            assert storage["transfers"]["checkpoint"] == 1
            assert storage["transfer_bytes"]["checkpoint"] == BIG
            survivors = [n for n in procs if n != owner]
            await wait_until(
                lambda: not any(list((tmp_path / n).rglob("*.ckpt")) for n in survivors),
                "files deleted",
                limit=20,
            )
