"""A free retry that resumes from a checkpoint keeps its place in the queue.

The ckpt audit's note: retries go behind fresh work, so a ``simulate`` that had saved a
checkpoint waited 88 s, after its preemption, behind two fresh long tasks; meanwhile
its checkpoint, on a preemptible worker's disk, could go with the next preemption. The
default retry policy now answers ``behind=False`` for a free retry whose task resumes
from a checkpoint (``TaskView.saved_work`` not None), unless ``resumable_keeps_place``
is off, and the scheduler core honours it even when an earlier retry of the task went
behind (docs/policies.md, retry).

The scheduler's pure core is fed the preemption with fresh long tasks queued, at chosen
times (time is data), and the order the tasks are then sent in is asserted exactly;
then the decision itself, per outcome, and the parameter's checks.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from actors.scheduler_events import (
    Command,
    Event,
    Execute,
    GraphSubmitted,
    PolicyChanged,
    TaskCheckpointed,
    TasksFinished,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_records import TaskState, TaskStateView
from actors.scheduler_state import SchedulerState
from policies import REGISTRY, PolicyParamsError
from policies.retry import DefaultRetry
from runtime.console import _params as console_params
from runtime.graph import TaskSpec
from tests.helpers import Factory, assigned, make_state, of, result, run, specs_for

__all__ = ["make_state"]

T0 = 2e6  # later than any time tests.helpers.event has handed out
FRESH = ("fresh-a", "fresh-b")
KEEPS = "it keeps its place in the queue, not behind fresh work"


def at(state: SchedulerState, t: float, cls: type[Event], **fields: Any) -> list[Command]:
    return run(state, cls(stimulus_id=f"{cls.__name__}@{t}", now=T0 + t, **fields))


def submit_at(s: SchedulerState, t: float, *keys: str, **kw: Any) -> list[Command]:
    specs = specs_for(s, dict.fromkeys(keys, ()), list(keys), **kw)
    return at(s, t, GraphSubmitted, specs=specs, wanted=keys)


def checkpointed_at(s: SchedulerState, t: float, worker: str, key: str, large: bool) -> None:
    """A small checkpoint (its bytes held by the scheduler: it survives its worker), or
    a ``large`` one, on its worker's disk only (no peer copied it: lost with it)."""
    if large:
        at(s, t, TaskCheckpointed, worker=worker, key=key, seq=1, nbytes=2**30)
        return
    data = pickle.dumps({"step": 30})
    at(s, t, TaskCheckpointed, worker=worker, key=key, seq=1, nbytes=len(data), data=data)


def preempted_with_fresh_work(
    make_state: Factory,
    retry: Any = None,
    checkpoint: str | None = "small",
    erred_first: bool = False,
) -> SchedulerState:
    """``sim`` runs on w1 (1 core) from 0 (from 5 after an error, ``erred_first``) and
    saves a checkpoint at 30 (``checkpoint``: ``small``, ``large``, or None); two fresh
    long tasks are submitted at 31 and queue; w1 is preempted at 40, with no other
    worker: ``sim``'s retry is queued with them."""
    s = make_state(retry=retry)
    at(s, 0, WorkerJoined, worker="w1", cores=1, memory=2**30)
    assert assigned(submit_at(s, 0, "sim", retries=1)) == {"w1": ["sim"]}
    if erred_first:  # a charged retry first: behind fresh work (there is none yet)
        out = at(s, 5, TasksFinished, worker="w1", results=(result("sim", "error"),))
        assert assigned(out) == {"w1": ["sim"]} and s.tasks["sim"].behind
    if checkpoint is not None:
        checkpointed_at(s, 30, "w1", "sim", large=checkpoint == "large")
    assert assigned(submit_at(s, 31, *FRESH)) == {}  # long (unknown): w1's core is busy
    assert assigned(at(s, 40, WorkerLeft, worker="w1", cause="preempted")) == {}
    assert s.tasks["sim"].state == "queued"
    return s


def dispatch_order(s: SchedulerState) -> tuple[list[str], list[Execute]]:
    """w2 (1 core) joins at 41 and runs every queued task, one at a time, 60 s each:
    the keys in the order they were sent, and the Execute commands."""
    sent: list[Execute] = []
    out = at(s, 41, WorkerJoined, worker="w2", cores=1, memory=2**30)
    t = 41.0
    while of(out, Execute):
        (cmd,) = of(out, Execute)
        (task,) = cmd.tasks
        sent.append(cmd)
        res = result(task.key, start=T0 + t, duration=60.0)
        t += 60.0
        out = at(s, t, TasksFinished, worker="w2", results=(res,))
    assert all(s.tasks[k].state == "memory" for k in ("sim", *FRESH))
    return [c.tasks[0].key for c in sent], sent


def retry_reasons(s: SchedulerState, key: str) -> list[str]:
    return [t[2] for t in s.story(key) if t[1] == "retry"]


# ----------------------------------------------------------------------------- the core


def test_a_resumable_retry_runs_before_fresh_work_submitted_after_it(
    make_state: Factory,
) -> None:
    """The audit's case: preempted with a checkpoint of 30 s of work, its free retry
    keeps its place (ahead of the graph submitted after it), and resumes first. Before,
    it went behind both fresh long tasks, 120 s of them."""
    s = preempted_with_fresh_work(make_state)
    order, sent = dispatch_order(s)
    assert order == ["sim", "fresh-a", "fresh-b"]
    assert not s.tasks["sim"].behind
    assert sent[0].tasks[0].checkpoint is not None  # it resumes
    assert retry_reasons(s, "sim") == [
        f"worker lost (preempted); free retry; its checkpoint holds 30 s of work: {KEEPS}"
    ]


@pytest.mark.parametrize(
    ("checkpoint", "params"),
    [
        # (lost_keeps_place off: a preemption's retry keeps its place too by default)
        (None, {"lost_keeps_place": False}),  # nothing to resume: it starts over
        ("large", {"lost_keeps_place": False}),  # its only checkpoint went with its disk
        ("small", {"resumable_keeps_place": False, "lost_keeps_place": False}),  # knobs off
    ],
    ids=["never-checkpointed", "checkpoint-lost", "knob-off"],
)
def test_a_retry_that_starts_over_or_with_the_knob_off_goes_behind_fresh_work(
    make_state: Factory, checkpoint: str | None, params: dict[str, Any]
) -> None:
    retry = REGISTRY.create("retry", "default", params)
    s = preempted_with_fresh_work(make_state, retry, checkpoint)
    order, _ = dispatch_order(s)
    assert order == ["fresh-a", "fresh-b", "sim"]
    assert s.tasks["sim"].behind
    assert retry_reasons(s, "sim") == ["worker lost (preempted); free retry"]


def test_an_earlier_retry_behind_fresh_work_does_not_hold_a_resumable_one_behind(
    make_state: Factory,
) -> None:
    """The core took ``behind`` from the first retry that asked for it and kept it for
    every later one: a task that once erred (a charged retry, behind fresh work) went
    behind after its checkpointed preemption too, though the policy said it keeps its
    place. Each retry's place is its own decision's now."""
    s = preempted_with_fresh_work(make_state, erred_first=True)
    order, _ = dispatch_order(s)
    assert order == ["sim", "fresh-a", "fresh-b"]
    assert not s.tasks["sim"].behind
    assert retry_reasons(s, "sim") == [
        "error; retry budget left",
        f"worker lost (preempted); free retry; its checkpoint holds 25 s of work: {KEEPS}",
    ]


def test_the_knob_set_at_runtime_applies_to_the_next_retry(make_state: Factory) -> None:
    """``set_policy("retry", "default", resumable_keeps_place=False)`` ends in a
    PolicyChanged to the core: the next resumable retry goes behind fresh work."""
    no_place = REGISTRY.create("retry", "default", {"lost_keeps_place": False})
    s = preempted_with_fresh_work(make_state, no_place, checkpoint=None)  # a first loss, behind
    knobs = ["resumable_keeps_place=false", "lost_keeps_place=false"]
    policy = REGISTRY.create("retry", "default", console_params(knobs))
    assert policy.resumable_keeps_place is False and policy.lost_keeps_place is False
    at(s, 40.5, PolicyChanged, kind="retry", policy=policy)
    out = at(s, 41, WorkerJoined, worker="w2", cores=1, memory=2**30)
    assert assigned(out) == {"w2": ["fresh-a"]}
    at(s, 42, WorkerJoined, worker="w3", cores=1, memory=2**30)  # runs fresh-b
    checkpointed_at(s, 50, "w2", "fresh-a", large=False)
    at(s, 51, WorkerLeft, worker="w2", cause="preempted")
    assert s.tasks["fresh-a"].behind and s.tasks["fresh-a"].state == "queued"
    assert retry_reasons(s, "fresh-a") == ["worker lost (preempted); free retry"]


# ----------------------------------------------------------------------------- the decision


def view(saved: float | None, **counts: int) -> TaskStateView:
    ts = TaskState(TaskSpec("k", None, (), "k", retries=1), 0)  # type: ignore[arg-type]
    for name, n in counts.items():
        setattr(ts, name, n)
    return TaskStateView(ts, saved_work=saved)


@pytest.mark.parametrize(
    ("outcome", "cause", "counts", "behind"),
    [
        ("worker-lost", "preempted", {"lost_tries": 1}, False),
        ("worker-lost", "crash", {"lost_tries": 1}, False),
        ("oom", None, {}, False),
        ("disk-full", None, {}, False),
        ("error", None, {}, True),  # the task's own fault, charged: behind
        ("timeout", None, {}, True),
    ],
)
def test_only_a_free_retry_of_a_resumable_task_keeps_its_place(
    outcome: str, cause: str | None, counts: dict[str, int], behind: bool
) -> None:
    retry = REGISTRY.create("retry", "default", {"lost_keeps_place": False})
    decision = retry.decide(view(12.0, **counts), outcome, cause)
    assert decision.retry and decision.behind is behind
    assert (KEEPS in decision.reason) is not behind
    # The same try with nothing to resume from: behind, its reason as before.
    plain = retry.decide(view(None, **counts), outcome, cause)
    assert plain.behind and plain.reason == decision.reason.split("; its checkpoint")[0]


def test_a_charged_loss_goes_behind_and_a_refusal_stays_a_refusal() -> None:
    charged = REGISTRY.create("retry", "default", {"charge_lost": True})
    decision = charged.decide(view(12.0, lost_tries=1), "worker-lost", "preempted")
    assert decision.retry and decision.charge and decision.behind
    lost_too_often = REGISTRY.create("retry", "default", {"max_lost": 0})
    lost = view(12.0, lost_tries=1, lost_since_saved=1)
    decision = lost_too_often.decide(lost, "worker-lost", "preempted")
    assert not decision.retry and decision.reason == "lost 1 times"


def test_max_lost_bounds_the_losses_in_a_row_that_saved_nothing() -> None:
    """Losses after which a checkpoint of the try survived do not count towards
    max_lost (the core restarts TaskView.lost_since_saved): a task that progresses goes
    on; one lost too often in a row with nothing saved fails, saying both counts."""
    retry = REGISTRY.create("retry", "default", {"max_lost": 2})
    going = retry.decide(view(12.0, lost_tries=9, lost_since_saved=0), "worker-lost", "walltime")
    assert going.retry and not going.charge
    stuck = retry.decide(view(12.0, lost_tries=9, lost_since_saved=3), "worker-lost", "walltime")
    assert not stuck.retry
    assert stuck.reason == "lost 3 times in a row with no checkpoint saved (9 in all)"


# ----------------------------------------------------------------------------- the parameter


@pytest.mark.parametrize("bad", ["no", "false", 0, 1, None])
def test_a_bad_resumable_keeps_place_is_refused_with_what_to_give(bad: Any) -> None:
    with pytest.raises(PolicyParamsError) as info:
        REGISTRY.create("retry", "default", {"resumable_keeps_place": bad})
    assert (info.value.kind, info.value.name) == ("retry", "default")
    text = str(info.value)
    assert f"resumable_keeps_place must be true or false (a bool), got {bad!r}" in text
    assert "resumable_keeps_place=true or resumable_keeps_place=false" in text
    with pytest.raises(TypeError, match="resumable_keeps_place must be true or false"):
        DefaultRetry(resumable_keeps_place=bad)
    assert REGISTRY.defaults("retry")["default"]["resumable_keeps_place"] == "True"


def test_a_config_file_sets_the_knob_and_refuses_a_bad_one(tmp_path: Path) -> None:
    from actors.pools import load_policies
    from runtime.errors import PolicyConfigError

    path = tmp_path / "corral.toml"
    path.write_text('[policies.retry]\nname = "default"\nresumable_keeps_place = false\n')
    loaded = load_policies(path, REGISTRY)
    assert loaded == {"retry": ("default", {"resumable_keeps_place": False})}
    assert REGISTRY.create("retry", *loaded["retry"]).resumable_keeps_place is False
    path.write_text('[policies.retry]\nname = "default"\nresumable_keeps_place = "no"\n')
    with pytest.raises(PolicyConfigError, match="resumable_keeps_place must be true or false"):
        load_policies(path, REGISTRY)


# ------------------------------------------------------- a retry lost to the batch system


def test_a_preempted_task_that_starts_over_keeps_its_place_before_work_submitted_since(
    make_state: Factory,
) -> None:
    """Audit fleet: in a campaign that kept submitting, 16 tasks preempted (never
    checkpointed) went behind every task submitted after them and waited 5 to 19
    minutes and more, none sent again, while 700 later tasks ran: the client awaiting
    them waited as long. A free retry of a try lost to the batch system keeps its
    place: ``sim`` runs before the two tasks submitted after it."""
    s = preempted_with_fresh_work(make_state, checkpoint=None)
    order, _ = dispatch_order(s)
    assert order == ["sim", "fresh-a", "fresh-b"]
    assert not s.tasks["sim"].behind
    assert retry_reasons(s, "sim") == ["worker lost (preempted); free retry"]


@pytest.mark.parametrize(
    ("cause", "behind"),
    [("preempted", False), ("suspended", False), ("walltime", False),
     ("crash", True), ("unknown", True), ("drained", True)],
)  # fmt: skip
def test_only_a_loss_that_is_the_batch_system_s_doing_keeps_its_place(
    cause: str, behind: bool
) -> None:
    """A crash may be the task's doing (a suspect: behind fresh work), and so may an
    unknown loss; a preemption, a suspension and a walltime are the batch system's."""
    decision = REGISTRY.create("retry", "default").decide(
        view(None, lost_tries=1), "worker-lost", cause
    )
    assert decision.retry and not decision.charge and decision.behind is behind
    off = REGISTRY.create("retry", "default", {"lost_keeps_place": False})
    assert off.decide(view(None, lost_tries=1), "worker-lost", cause).behind
