"""Worker lives, their survival estimate, and long tasks moving off a preemptible pool.

The Kaplan-Meier estimate is checked against figures worked out by hand; the scheduler's
pure core is fed worker joins, preemptions and finishes at chosen times (time is data)
and must move a task preempted after its pool's median worker life to the fallback pool,
free of the user's retry budget, with a story that says why, and leave a short task
where it was, and a checkpointed one whose run since its checkpoint was short.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from actors.scheduler import _life
from actors.scheduler_events import (
    Command,
    Event,
    GraphSubmitted,
    TaskCheckpointed,
    TasksFinished,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
)
from actors.scheduler_records import TaskState, TaskStateView
from actors.scheduler_state import SchedulerState
from policies import REGISTRY
from policies.survival import Survival, kaplan_meier
from runtime.graph import TaskSpec
from runtime.messages import TryRecord
from tests.helpers import Factory, assigned, make_state, result, run, specs_for

__all__ = ["make_state"]

T0 = 1e6  # later than any time tests.helpers.event has handed out


def test_kaplan_meier_by_hand() -> None:
    # Deaths at 1 and 3 (two), censored at 2 and 4: at risk 5, then 3 at t=3.
    s = kaplan_meier([(1, True), (2, False), (3, True), (3, True), (4, False)])
    assert [t for t, _ in s.steps] == [1.0, 3.0]
    assert [p for _, p in s.steps] == pytest.approx([0.8, 0.8 / 3])
    assert (s.lives, s.deaths) == (5, 3)
    assert s.at(0.5) == 1.0 and s.at(1) == 0.8 and s.at(2.9) == 0.8
    assert s.median == 3.0 and s.quantile(0.1) == 1.0
    assert s.survives(1, 2) == pytest.approx(1 / 3)


def test_without_deaths_nothing_is_known() -> None:
    s = kaplan_meier([(10, False), (20, False)])
    assert s.steps == () and s.median is None and s.at(100) == 1.0
    assert Survival().median is None
    with pytest.raises(ValueError, match="negative"):
        kaplan_meier([(-1, True)])
    with pytest.raises(ValueError, match="q must be"):
        s.quantile(1.0)


def at(state: SchedulerState, t: float, cls: type[Event], **fields: Any) -> list[Command]:
    return run(state, cls(stimulus_id=f"{cls.__name__}@{t}", now=T0 + t, **fields))


def ckpt_history(s: SchedulerState) -> None:
    """Two checkpoint workers that were preempted after 100 s and 120 s; two live ones
    (``c1``, ``c2``) and an owner worker, all joined at 0."""
    for w in ("old1", "old2", "c1", "c2"):
        at(s, 0, WorkerJoined, worker=w, cores=1, memory=2**30, pool="ckpt")
    at(s, 0, WorkerJoined, worker="o1", cores=1, memory=2**30, pool="owner")
    at(s, 100, WorkerLeft, worker="old1", cause="preempted")
    at(s, 120, WorkerLeft, worker="old2", cause="preempted")


def submit_at(s: SchedulerState, t: float, key: str) -> list[Command]:
    specs = specs_for(s, {key: []}, [key], pool="ckpt")
    return at(s, t, GraphSubmitted, specs=specs, wanted=(key,))


def test_a_long_task_preempted_moves_to_the_fallback_pool(make_state: Factory) -> None:
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(retry=retry, saturation=1.0)
    ckpt_history(s)
    sent = assigned(submit_at(s, 150, "long"))
    (w,) = sent
    # c1 or c2 runs it; preempted at 300 after 150 s of work, past the median life.
    out = at(s, 300, WorkerLeft, worker=w, cause="preempted")
    assert s.survival("ckpt").median == 120.0
    assert assigned(out) == {"o1": ["long"]}
    ts = s.tasks["long"]
    # (free, and its place kept in owner's queue: a preemption is not the task's doing)
    assert ts.spec.pool == "owner" and ts.retries_left == 0 and not ts.behind
    (try_,) = ts.tries
    assert (try_.worker, try_.start, try_.stop, try_.cause) == (w, T0 + 150, T0 + 300, "preempted")
    story = [(t[1], t[2]) for t in s.story("long")]
    assert ("pool", "ckpt->owner") in story
    (why,) = [t[2] for t in s.story("long") if t[1] == "retry"]
    assert "past the median life of 'ckpt' workers (120 s)" in why
    out = at(s, 310, TasksFinished, worker="o1", results=(result("long"),))
    assert s.tasks["long"].state == "memory"


def test_a_short_task_preempted_stays_in_its_pool(make_state: Factory) -> None:
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(retry=retry, saturation=1.0)
    ckpt_history(s)
    (w,) = assigned(submit_at(s, 290, "short"))
    out = at(s, 300, WorkerLeft, worker=w, cause="preempted")
    other = "c2" if w == "c1" else "c1"
    assert assigned(out) == {other: ["short"]}
    assert s.tasks["short"].spec.pool == "ckpt"


def test_without_a_fallback_or_a_known_median_nothing_moves(make_state: Factory) -> None:
    s = make_state(saturation=1.0)  # the default: no fallback
    ckpt_history(s)
    (w,) = assigned(submit_at(s, 150, "long"))
    at(s, 300, WorkerLeft, worker=w, cause="preempted")
    assert s.tasks["long"].spec.pool == "ckpt"
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s2 = make_state(retry=retry, saturation=1.0)
    for wid in ("c1", "c2"):  # no worker has died yet: the median is unknown
        at(s2, 0, WorkerJoined, worker=wid, cores=1, memory=2**30, pool="ckpt")
    (w,) = assigned(submit_at(s2, 150, "long"))
    at(s2, 300, WorkerLeft, worker=w, cause="preempted")
    assert s2.tasks["long"].spec.pool == "ckpt"


def test_lives_ended_on_purpose_are_censored(make_state: Factory) -> None:
    s = make_state()
    for w in ("a", "b", "c"):
        at(s, 0, WorkerJoined, worker=w, cores=1, memory=2**30, pool="ckpt")
    at(s, 50, WorkerLeft, worker="a", cause="drained")
    at(s, 60, WorkerLeft, worker="b", cause="walltime")
    at(s, 70, WorkerLeft, worker="c", cause="preempted")
    assert list(s.lives["ckpt"]) == [(50.0, False), (60.0, False), (70.0, True)]
    assert s.survival("ckpt").steps == ((70.0, 0.0),)


@pytest.mark.parametrize(
    "fallback", [{"ckpt": "ckpt"}, {"ckpt": 3}, {"": "owner"}], ids=["self", "int", "empty"]
)
def test_a_bad_fallback_is_refused(fallback: dict[str, object]) -> None:
    with pytest.raises(Exception, match="fall"):
        REGISTRY.create("retry", "default", {"fallback": fallback})


def test_a_task_lost_too_often_moves_to_the_fallback_instead_of_failing(
    make_state: Factory,
) -> None:
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}, "max_lost": 1})
    s = make_state(retry=retry, saturation=1.0)
    for w in ("c1", "c2", "c3"):
        at(s, 0, WorkerJoined, worker=w, cores=1, memory=2**30, pool="ckpt")
    at(s, 0, WorkerJoined, worker="o1", cores=1, memory=2**30, pool="owner")
    (w,) = assigned(submit_at(s, 1, "t"))
    (w,) = assigned(at(s, 2, WorkerLeft, worker=w, cause="preempted"))  # free retry
    out = at(s, 3, WorkerLeft, worker=w, cause="preempted")  # lost twice: past max_lost
    assert assigned(out) == {"o1": ["t"]}
    assert s.tasks["t"].state == "processing" and s.tasks["t"].spec.pool == "owner"


def test_a_preempted_task_that_never_started_is_not_long(make_state: Factory) -> None:
    """A worker holds more tasks than it runs at once: one queued behind a long task
    when the worker is preempted never started, however long ago it was sent. Its
    worker's Leaving said what executed: the queued one ran 0 s and stays in its pool
    (a free retry); the long one moves."""
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(unknown_long=False, retry=retry, saturation=2.0)  # 1 core, 2 tasks at a time
    for w in ("old1", "old2", "c1"):
        at(s, 0, WorkerJoined, worker=w, cores=1, memory=2**30, pool="ckpt")
    at(s, 0, WorkerJoined, worker="o1", cores=1, memory=2**30, pool="owner")
    at(s, 100, WorkerLeft, worker="old1", cause="preempted")
    at(s, 120, WorkerLeft, worker="old2", cause="preempted")
    specs = specs_for(s, {"long": [], "flaky": []}, ["long", "flaky"], pool="ckpt")
    out = at(s, 150, GraphSubmitted, specs=specs, wanted=("long", "flaky"))
    assert sorted(assigned(out)["c1"]) == ["flaky", "long"]
    # Preempted at 300, 150 s after both were sent: past the median life (120 s).
    at(s, 300, WorkerLeaving, worker="c1", cause="preempted", executing=frozenset({"long"}))
    out = at(s, 300.5, WorkerLeft, worker="c1", cause="preempted")
    assert assigned(out) == {"o1": ["long"]}
    flaky = s.tasks["flaky"]
    assert flaky.state == "queued" and flaky.spec.pool == "ckpt"
    assert flaky.retries_left == 0 and flaky.lost_tries == 1  # free
    (try_,) = flaky.tries
    assert (try_.start, try_.stop, try_.outcome, try_.ran) == (
        T0 + 150, T0 + 300.5, "worker-lost", 0.0,
    )  # fmt: skip
    assert TaskStateView(flaky).ran_for == 0.0
    assert [t[2] for t in s.story("flaky") if t[1] == "retry"] == [
        "worker lost (preempted); free retry"
    ]
    assert ("pool", "ckpt->owner") not in [(t[1], t[2]) for t in s.story("flaky")]
    long = s.tasks["long"]  # it executed: from being sent, as before
    assert long.spec.pool == "owner" and long.tries[-1].ran is None
    assert TaskStateView(long).ran_for == 150.5


def test_survival_past_the_longest_life_seen_is_not_known() -> None:
    """Kaplan-Meier says nothing past the longest life seen: ``known_at`` (and the
    status' ``survive_1h``) is None there, not the curve's last value; within it, it is
    ``at``. The audit: ten ``ckpt`` workers preempted within a minute gave
    ``survive_1h`` 0.2."""
    lives = [(20.0 + i, i < 8) for i in range(10)]  # 8 deaths by 27 s, 2 censored
    s = kaplan_meier(lives)
    assert s.longest == 29.0 and s.at(3600) == pytest.approx(0.2)
    assert s.known_at(3600) is None and s.known_at(29.5) is None
    assert s.known_at(21.0) == s.at(21.0) == pytest.approx(0.8)
    assert s.known_at(29.0) == pytest.approx(0.2)
    assert Survival().known_at(0.0) is None
    assert kaplan_meier([(4000.0, False)]).known_at(3600) == 1.0
    life = _life(s)
    assert (life.lives, life.deaths, life.median, life.survive_1h) == (10, 8, 24.0, None)
    assert _life(kaplan_meier([(7200.0, True), (100.0, True)])).survive_1h == 0.5


def checkpointed_at(
    s: SchedulerState, t: float, worker: str, key: str, seq: int, large: bool = False
) -> list[Command]:
    """``key``'s try on ``worker`` saves checkpoint ``seq`` at ``t``: a small one, whose
    bytes the scheduler holds (it survives its worker), or a ``large`` one, on the
    worker's disk only (no peer has said it copied it)."""
    if large:
        return at(s, t, TaskCheckpointed, worker=worker, key=key, seq=seq, nbytes=2**30)
    data = pickle.dumps({"epoch": seq})
    return at(s, t, TaskCheckpointed, worker=worker, key=key, seq=seq, nbytes=len(data), data=data)


def retry_reasons(s: SchedulerState, key: str) -> list[str]:
    return [t[2] for t in s.story(key) if t[1] == "retry"]


def test_a_checkpointed_task_that_lost_little_stays_in_its_pool(make_state: Factory) -> None:
    """The ckpt audit's defect 7: ``train`` checkpointed (epoch 7 of 12) shortly before it
    was preempted past the pool's median life, and was moved to the small permanent pool
    for its whole run. What the preemption cost it is its run since that checkpoint,
    under the median: its retry resumes in its own pool, and its story says why it
    stayed."""
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(retry=retry, saturation=1.0)
    ckpt_history(s)  # median life 120 s
    (w,) = assigned(submit_at(s, 150, "train"))
    checkpointed_at(s, 290, w, "train", 7)  # 140 s of its work saved
    out = at(s, 300, WorkerLeft, worker=w, cause="preempted")  # ran 150 s, 10 s of it unsaved
    other = "c2" if w == "c1" else "c1"
    assert assigned(out) == {other: ["train"]}
    ts = s.tasks["train"]
    assert ts.spec.pool == "ckpt" and ts.retries_left == 0 and ts.resumed == (7, 140.0)
    assert retry_reasons(s, "train") == [
        "worker lost (preempted); free retry in 'ckpt': it resumes from its checkpoint, "
        "10 s of its 150 s run not in it, under the median life of 'ckpt' workers (120 s); "
        "its checkpoint holds 140 s of work: it keeps its place in the queue, not behind "
        "fresh work"
    ]
    assert not ts.behind
    assert ("pool", "ckpt->owner") not in [(t[1], t[2]) for t in s.story("train")]


@pytest.mark.parametrize(
    ("saved_at", "large", "why", "place"),
    [
        (
            160,
            False,
            "preempted after 150 s, 140 s of it not in a checkpoint",
            "; its checkpoint holds 10 s of work: it keeps its place in the queue, not "
            "behind fresh work",
        ),
        (290, True, "preempted after 150 s", ""),  # its checkpoint went with its worker
    ],
    ids=["saved-early", "checkpoint-lost"],
)
def test_a_checkpointed_task_that_lost_a_median_life_moves(
    make_state: Factory, saved_at: float, large: bool, why: str, place: str
) -> None:
    """A checkpoint helps only with the work it holds: one saved 10 s into a 150 s run
    leaves 140 s unsaved, past the median life (120 s); one lost with its worker's disk
    leaves the whole run. Either moves, as an un-checkpointed task does."""
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(retry=retry, saturation=1.0)
    ckpt_history(s)
    (w,) = assigned(submit_at(s, 150, "train"))
    checkpointed_at(s, saved_at, w, "train", 1, large=large)
    out = at(s, 300, WorkerLeft, worker=w, cause="preempted")
    assert assigned(out) == {"o1": ["train"]}
    assert s.tasks["train"].spec.pool == "owner"
    assert retry_reasons(s, "train") == [
        f"{why}, past the median life of 'ckpt' workers (120 s): a long task, moved to "
        f"'owner'; free retry{place}"
    ]
    assert not s.tasks["train"].behind  # preempted: it keeps its place, resumed or not


@pytest.mark.parametrize("checkpointed", [False, True], ids=["moves", "checkpointed-stays"])
def test_a_task_of_a_long_category_moves_on_its_first_preemption(
    make_state: Factory, checkpointed: bool
) -> None:
    """A category that averages past the median life moves its tasks on their first
    preemption, however short the try; not one that resumes from a checkpoint: what it
    loses to each preemption is its run since the checkpoint, not its length."""
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(retry=retry, saturation=1.0)
    ckpt_history(s)  # median life 120 s
    (w,) = assigned(submit_at(s, 150, "long-1"))
    at(s, 350, TasksFinished, worker=w, results=(result("long-1", duration=200.0),))
    (w,) = assigned(submit_at(s, 360, "long-2"))
    if checkpointed:
        checkpointed_at(s, 368, w, "long-2", 1)
    out = at(s, 370, WorkerLeft, worker=w, cause="preempted")  # after only 10 s
    (why,) = retry_reasons(s, "long-2")
    if not checkpointed:
        assert assigned(out) == {"o1": ["long-2"]}
        assert why.startswith("preempted; its category takes 200 s on average")
        return
    other = "c2" if w == "c1" else "c1"
    assert assigned(out) == {other: ["long-2"]}
    assert s.tasks["long-2"].spec.pool == "ckpt"
    assert why == (
        "worker lost (preempted); free retry in 'ckpt': it resumes from its checkpoint, "
        "2 s of its 10 s run not in it, under the median life of 'ckpt' workers (120 s) "
        "(its category takes 200 s on average); its checkpoint holds 8 s of work: it keeps "
        "its place in the queue, not behind fresh work"
    )


@pytest.mark.parametrize(
    ("resumed", "saved", "unsaved"),
    [
        (None, None, 50.0),  # never checkpointed: its whole run
        ((3, 100.0), None, 50.0),  # every checkpoint lost: its whole run (no more)
        ((3, 100.0), 100.0, 50.0),  # saved nothing since it resumed
        ((3, 100.0), 130.0, 20.0),  # saved 30 s into its run
        ((3, 100.0), 60.0, 50.0),  # the one it resumed from lost, an older one left
        (None, 50.0, 0.0),  # saved as it was lost
    ],
)
def test_a_task_view_s_unsaved_run_is_its_run_since_its_newest_checkpoint(
    resumed: tuple[int, float] | None, saved: float | None, unsaved: float
) -> None:
    ts = TaskState(TaskSpec("k", None, (), "k", pool="ckpt"), 0)  # type: ignore[arg-type]
    ts.resumed = resumed
    ts.tries.append(TryRecord("k", "c1", T0, T0 + 50.0, "worker-lost", "preempted"))
    view = TaskStateView(ts, saved_work=saved)
    assert (view.ran_for, view.saved_work, view.unsaved_for) == (50.0, saved, unsaved)
