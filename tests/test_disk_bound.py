"""The disk stall breaker's bound (docs/files.md, "Waiting, and the error"): it gives up
when it would drop again the last copy of an output it made again, with no task
finished on the pool's workers since that it did not make again. Its bookkeeping:

- only a drop that leaves no copy is noted (and made again): dropping a copy held
  elsewhere too, then the last one, is no "again";
- a task of no pool that finishes on a pool's worker is progress for that pool;
- a give-up that leaves no pool with drops noted forgets the remakes, and a remake
  that is cancelled, released or fails is none any more.

Pure-core tests (events in, exact commands out, a virtual clock; ``make_state``
validates every state, and ``validate()`` checks the remakes are active tasks noted
while drops are). Pool ``p``: workers w1 and w2, 10 MiB disks reported 9 MiB used;
``t-0`` declares a 5 MiB output and waits for disk, which no drop can make (the
breaker drops the one output cheapest to make again, once per stall_timeout); ``r-0``
reads the outputs to drop and ``u-0``, which runs on ``wq`` (pool ``q``).
"""

from __future__ import annotations

from typing import Any

from actors.scheduler_events import KeyErred
from actors.scheduler_state import SchedulerState
from runtime.errors import TaskTooBigForDisk
from tests.helpers import MB, Factory, assigned, files_released, make_state, of, release, submit
from tests.test_disk_breaker import dropped, wrote
from tests.test_disk_placement import disk_used, join, tick

__all__ = ["make_state"]  # the fixture, used by name

P = {"pool": "p"}
Q = {"pool": "q"}


def pools(s: SchedulerState, cores: int = 1) -> None:
    join(s, "w1", disk=10 * MB, pool="p", cores=cores)
    join(s, "wq", disk=0, pool="q", cores=cores)


def full_and_waiting(s: SchedulerState) -> float:
    """Both disks of pool p report 9 MiB used and ``t-0`` (5 MiB, declared) waits:
    returns when the stall is first suspected."""
    disk_used(s, "w1", 9 * MB)
    if "w2" in s.workers:
        disk_used(s, "w2", 9 * MB)
    attrs = {"t-0": {"pool": "p", "resources": {"disk": float(5 * MB)}}}
    assert not assigned(submit(s, {"t-0": []}, ["t-0"], attrs=attrs))
    assert s.tasks["t-0"].state == "queued"
    start = s._now
    assert not dropped(tick(s, start))
    return start


def erred(cmds: list[Any]) -> list[Any]:
    return [c.key for c in of(cmds, KeyErred)]


def test_dropping_the_last_copy_after_a_copy_is_no_drop_again(make_state: Factory) -> None:
    """x-0 is on w1 and on w2 (s-0 fetched it there). The breaker drops w1's copy
    (nothing made again), and a stall period later, with no task finished, w2's, the
    last: x-0 is made again, and t-0 keeps waiting. Before, the first drop noted
    x-0, and the second counted as dropping it again: t-0 failed with
    TaskTooBigForDisk although nothing had been made again."""
    s = make_state(saturation=1.0, memory="blind")
    pools(s)
    join(s, "w2", disk=10 * MB, pool="p")
    assert assigned(submit(s, {"u-0": []}, ["u-0"], attrs={"u-0": Q})) == {"wq": ["u-0"]}
    table = {"x-0": [], "r-0": ["x-0", "u-0"], "s-0": ["x-0"]}
    attrs = {"x-0": P, "r-0": P, "s-0": {"pool": "p", "resources": {"disk": float(MB)}}}
    assert assigned(submit(s, table, ["r-0", "s-0"], attrs=attrs)) == {"w1": ["x-0"]}
    disk_used(s, "w1", 9 * MB + MB // 2)  # s-0 does not fit beside x-0: it goes to w2
    assert assigned(wrote(s, "w1", "x-0", MB)) == {"w2": ["s-0"]}
    wrote(s, "w2", "s-0", MB, fetched=("x-0",))
    assert s.tasks["x-0"].who_has == {"w1", "w2"}
    start = full_and_waiting(s)
    cmds = tick(s, start + 10.0)
    assert dropped(cmds) == [("w1", ("x-0",))] and not erred(cmds)
    assert s.disk_dropped_since == {}  # a copy stays on w2: nothing is made again
    cmds = tick(s, start + 20.0)
    assert dropped(cmds) == [("w2", ("x-0",))]
    assert not erred(cmds)
    assert assigned(cmds) == {"w1": ["x-0"]}  # made again
    assert s.tasks["t-0"].state == "queued"
    assert s.disk_dropped_since == {"p": {"x-0"}}
    assert s.disk_remakes == {s.tasks["x-0"]}


def test_a_task_of_no_pool_finishing_on_the_pools_worker_is_progress(
    make_state: Factory,
) -> None:
    """The breaker dropped x-0 and made it again (its finish is no progress). Then
    n-0, a task of no pool, runs on w1 and finishes: room moved on pool p's disk, so
    dropping x-0 once more is no drop again. Before, only n-0's own pool (none) made
    progress: t-0 failed with TaskTooBigForDisk."""
    s = make_state(saturation=1.0, memory="blind")
    pools(s)
    assert assigned(submit(s, {"u-0": []}, ["u-0"], attrs={"u-0": Q})) == {"wq": ["u-0"]}
    table = {"x-0": [], "r-0": ["x-0", "u-0"]}
    assert assigned(submit(s, table, ["r-0"], attrs={"x-0": P, "r-0": P})) == {"w1": ["x-0"]}
    wrote(s, "w1", "x-0", MB)
    start = full_and_waiting(s)
    cmds = tick(s, start + 10.0)
    assert dropped(cmds) == [("w1", ("x-0",))]
    assert assigned(cmds) == {"w1": ["x-0"]}  # made again
    wrote(s, "w1", "x-0", MB)
    disk_used(s, "w1", 9 * MB)
    assert s.disk_dropped_since == {"p": {"x-0"}} and not s.disk_remakes
    # n-0 (no pool) goes to w1: wq runs u-0 on its one core.
    no_disk = {"n-0": {"resources": {"disk": 0.0}}}  # (its output stays in memory)
    assert assigned(submit(s, {"n-0": []}, ["n-0"], attrs=no_disk)) == {"w1": ["n-0"]}
    wrote(s, "w1", "n-0", 100)
    assert s.disk_dropped_since == {}
    cmds = tick(s, start + 20.0)
    assert dropped(cmds) == [("w1", ("x-0",))]
    assert not erred(cmds) and s.tasks["t-0"].state == "queued"


def remakes_left_active(s: SchedulerState) -> float:
    """a-0 (pool p, on w1) reads g-0 (pool q, released once a-0 ran); b-0 (pool p, on
    w1) costs more to make again. The breaker drops a-0 first: a-0 and g-0 are made
    again, g-0 on wq, a-0 waiting for it."""
    pools(s, cores=2)
    table = {"u-0": [], "g-0": [], "a-0": ["g-0"], "b-0": [], "r-0": ["a-0", "b-0", "u-0"]}
    attrs = {"a-0": P, "b-0": P, "r-0": P, "u-0": Q, "g-0": Q}
    assert assigned(submit(s, table, ["r-0"], attrs=attrs)) == {
        "wq": ["g-0", "u-0"], "w1": ["b-0"],
    }  # fmt: skip
    wrote(s, "wq", "g-0", 100, duration=0.1)
    wrote(s, "w1", "b-0", MB, duration=1.0)
    wrote(s, "w1", "a-0", MB, duration=0.1)
    files_released(s, "g-0")
    start = full_and_waiting(s)
    cmds = tick(s, start + 10.0)
    assert dropped(cmds) == [("w1", ("a-0",))] and assigned(cmds) == {"wq": ["g-0"]}
    assert s.disk_remakes == {s.tasks["a-0"], s.tasks["g-0"]}
    return start


def test_a_give_up_forgets_the_remakes(make_state: Factory) -> None:
    """Then b-0 is dropped and made again on w1 (a remake: no progress), and the next
    period would drop it again: the breaker gives up, t-0 fails. No pool has drops
    noted any more: a-0 and g-0 are remakes no more (before, they stayed remakes for
    the rest of the run, and their later finishes counted as no progress)."""
    s = make_state(saturation=1.0, memory="blind")
    start = remakes_left_active(s)
    cmds = tick(s, start + 20.0)
    assert dropped(cmds) == [("w1", ("b-0",))] and assigned(cmds) == {"w1": ["b-0"]}
    wrote(s, "w1", "b-0", MB)
    disk_used(s, "w1", 9 * MB)
    cmds = tick(s, start + 30.0)
    assert not dropped(cmds) and erred(cmds) == ["t-0"]
    err = of(cmds, KeyErred)[0].root_error
    assert isinstance(err, TaskTooBigForDisk) and err.again == "b-0"
    assert s.disk_dropped_since == {}
    assert s.disk_remakes == set()
    assert s.tasks["g-0"].state == "processing" and s.tasks["a-0"].state == "waiting"


def test_a_remake_cancelled_is_no_remake(make_state: Factory) -> None:
    """The client lets r-0 go: a-0 and g-0, made again for it, are cancelled as
    unneeded (and forgotten), and no longer remakes. Before, they stayed remakes: a
    TaskState made again later (run again, resubmitted) would finish as no progress,
    and the forgotten ones were kept alive."""
    s = make_state(saturation=1.0, memory="blind")
    remakes_left_active(s)
    release(s, "r-0")
    assert sorted(s.tasks) == ["b-0", "t-0"]  # the others let go: a-0 and g-0 forgotten
    assert s.disk_remakes == set()
