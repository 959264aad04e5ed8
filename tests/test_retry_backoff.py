"""Retry backoff: a retry policy's ``RetryDecision.delay`` holds the retry (waiting,
not ready, not placed) until then; the scheduler core releases it at the first event
at or past that time (the shell's ``Tick``). The ``default`` retry policy's ``backoff``
and ``max_backoff`` (docs/policies.md, retry).

A user audit: ``retries=2`` on a flaky read of remote storage ran its tries about
0.1 s apart, with no way to wait for a storage hiccup to pass.

Pure-core tests feed events with their ``now`` and assert the exact commands; the
autouse fixture ``make_state`` validates every state at teardown, ``run`` after each
step. One test runs a real ``Cluster`` (in-process workers), gated on the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import (
    CancelRequested,
    Event,
    Execute,
    FileFacts,
    GraphSubmitted,
    KeyCancelled,
    KeyErred,
    KeysReleased,
    PolicyFailed,
    TasksFinished,
    Tick,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from policies import MAX_RETRY_DELAY, REGISTRY, PolicyParamsError, RetryDecision, TaskView
from runtime.client import Cluster
from runtime.console import _held_back
from runtime.graph import Key
from tests.helpers import GB, Factory, make_state, of, result, run, specs_for

__all__ = ["make_state"]  # the autouse fixture, used by name

BOUND = 60.0


def at(cls: type[Event], now: float, /, **fields: Any) -> Any:
    """An event at ``now`` exactly (time as data)."""
    return cls(stimulus_id=f"{cls.__name__}@{now:g}", now=now, **fields)


def backoff_state(make_state: Factory, **params: Any) -> SchedulerState:
    """One worker (one core) at t=0 and task ``a`` sent to it at t=1 (``retries=2``)."""
    s = make_state(retry=REGISTRY.create("retry", "default", params))
    run(s, at(WorkerJoined, 0.0, worker="w1", cores=1, memory=GB, pool="default"))
    specs = specs_for(s, {"a": []}, ["a"], retries=2)
    run(s, at(GraphSubmitted, 1.0, specs=specs, wanted=("a",)))
    assert s.tasks["a"].state == "processing"
    return s


def fails(s: SchedulerState, now: float, key: Key = "a", outcome: str = "error") -> list[Any]:
    res = result(key, outcome, error=OSError("storage hiccup"), attempt=s.tasks[key].attempt)
    return run(s, at(TasksFinished, now, worker="w1", results=(res,)))


def held(s: SchedulerState) -> tuple[str, int, int, int]:
    """``a``'s state, the retries held (metrics), the queue depth and its pool's
    oldest wait."""
    m = s.pool_metrics(s._now)["*"]  # (a task any pool may run)
    return s.tasks["a"].state, m["retry_held"], m["queue_depth"], int(m["oldest_wait"])


def test_a_failed_try_is_held_for_its_backoff_doubled_then_sent_at_its_time(
    make_state: Factory,
) -> None:
    s = backoff_state(make_state, backoff=4.0)
    # the first try fails at t=10: held 4 s, nothing sent, not ready
    assert fails(s, 10.0) == []
    assert held(s) == ("waiting", 1, 0, 0)
    assert [e[2] for e in s.story("a") if e[1] == "retry"] == [
        "error; retry budget left (OSError: storage hiccup); retry in 4 s"
    ]
    assert s.retry_held_by_pool() == {"*": 1} and s.n_queued == 0
    assert run(s, at(Tick, 13.9)) == []  # not yet
    cmds = run(s, at(Tick, 14.0))
    (ex,) = cmds
    assert type(ex) is Execute and ex.worker == "w1" and [t.key for t in ex.tasks] == ["a"]
    assert ex.stimulus_id == "Tick@14"
    assert s.tasks["a"].queued == 14.0  # ready at 14: the backoff is no queue wait
    assert held(s) == ("processing", 0, 0, 0)
    # the second fails at t=20: held 8 s (doubled), sent at t=28
    assert fails(s, 20.0) == []
    assert run(s, at(Tick, 27.5)) == []
    (ex2,) = run(s, at(Tick, 28.0))
    assert ex2 == dataclasses.replace(ex, stimulus_id="Tick@28", tasks=(
        dataclasses.replace(ex.tasks[0], attempt=s.tasks["a"].attempt),
    ))  # fmt: skip
    retries = [(e[2], e[4]) for e in s.story("a") if e[1] == "retry"]
    assert retries == [
        ("error; retry budget left (OSError: storage hiccup); retry in 4 s", 10.0),
        ("ready: its backoff is over", 14.0),
        ("error; retry budget left (OSError: storage hiccup); retry in 8 s", 20.0),
        ("ready: its backoff is over", 28.0),
    ]
    # the budget spent: the third failure errs at once, nothing held
    (ke,) = of(fails(s, 30.0), KeyErred)
    assert ke.key == "a" and s.tasks["a"].state == "erred" and s.retry_held == []
    assert [t.queued for t in s.tasks["a"].tries] == [1.0, 14.0, 28.0]
    assert s.pool_waits["default"].recent == deque([0.0, 0.0, 0.0])  # no wait counted


def test_the_backoff_is_capped_by_max_backoff(make_state: Factory) -> None:
    s = backoff_state(make_state, backoff=4.0, max_backoff=5.0)
    fails(s, 10.0)
    assert run(s, at(Tick, 14.0)) != []  # 4 s
    fails(s, 20.0)
    assert run(s, at(Tick, 24.9)) == []
    assert [type(c) for c in run(s, at(Tick, 25.0))] == [Execute]  # 5 s, not 8


def test_without_a_backoff_a_retry_goes_at_once_as_before(make_state: Factory) -> None:
    s = backoff_state(make_state)
    cmds = fails(s, 10.0)
    assert [type(c) for c in cmds] == [Execute] and cmds[0].stimulus_id == "TasksFinished@10"
    assert s.retry_held == []


def test_a_free_retry_after_a_lost_worker_stays_immediate(make_state: Factory) -> None:
    s = backoff_state(make_state, backoff=4.0)
    run(s, at(WorkerJoined, 2.0, worker="w2", cores=1, memory=GB, pool="default"))
    wid = s.tasks["a"].worker
    cmds = run(s, at(WorkerLeft, 10.0, worker=wid, cause="preempted"))
    (ex,) = of(cmds, Execute)
    assert [t.key for t in ex.tasks] == ["a"] and s.retry_held_by_pool() == {}


def test_a_held_retry_is_cancelled_and_never_sent(make_state: Factory) -> None:
    s = backoff_state(make_state, backoff=4.0)
    fails(s, 10.0)
    cmds = run(s, at(CancelRequested, 11.0, keys=("a",), reason="by test"))
    assert cmds == [KeyCancelled("CancelRequested@11", "a", "by test")]
    assert s.tasks["a"].state == "cancelled" and s.tasks["a"].retry_at == 0.0
    assert s.retry_held_by_pool() == {}
    assert run(s, at(Tick, 14.0)) == []  # its time comes: nothing
    assert s.retry_held == []


def test_a_held_retry_released_by_its_client_is_forgotten_and_never_sent(
    make_state: Factory,
) -> None:
    s = backoff_state(make_state, backoff=4.0)
    fails(s, 10.0)
    assert run(s, at(KeysReleased, 11.0, keys=("a",))) == [FileFacts("KeysReleased@11", ())]
    assert "a" not in s.tasks and s.retry_held_by_pool() == {}
    assert run(s, at(Tick, 14.0)) == []


def input_lost_while_held(make_state: Factory) -> tuple[SchedulerState, list[Any]]:
    """``b`` reads ``a``; ``b`` fails on ``w1`` at t=10 and is held until t=14; ``w1``,
    the only holder of ``a``, leaves at t=11: ``a`` is made again on ``w2``. The state,
    and the commands of the leave."""
    s = make_state(retry=REGISTRY.create("retry", "default", {"backoff": 4.0}))
    run(s, at(WorkerJoined, 0.0, worker="w1", cores=1, memory=GB, pool="default"))
    specs = specs_for(s, {"a": [], "b": ["a"]}, ["b"], retries=1)
    run(s, at(GraphSubmitted, 1.0, specs=specs, wanted=("b",)))
    run(s, at(TasksFinished, 2.0, worker="w1", results=(result("a"),)))
    run(s, at(WorkerJoined, 3.0, worker="w2", cores=1, memory=GB, pool="default"))
    res = result("b", "error", error=OSError("hiccup"), attempt=s.tasks["b"].attempt)
    assert run(s, at(TasksFinished, 10.0, worker="w1", results=(res,))) == []
    return s, run(s, at(WorkerLeft, 11.0, worker="w1", cause="preempted"))


def test_a_held_retry_whose_input_is_lost_waits_for_both(make_state: Factory) -> None:
    """``b`` is sent once both its backoff is over and ``a`` is back."""
    s, cmds = input_lost_while_held(make_state)
    b = s.tasks["b"]
    assert [(c.worker, [t.key for t in c.tasks]) for c in of(cmds, Execute)] == [("w2", ["a"])]
    assert (b.state, b.waiting_on) == ("waiting", 1)
    assert run(s, at(Tick, 14.0)) == []  # backoff over, its input not back yet
    assert b.retry_at == 0.0 and s.retry_held_by_pool() == {}
    done = result("a", attempt=s.tasks["a"].attempt)
    cmds = run(s, at(TasksFinished, 15.0, worker="w2", results=(done,)))
    assert [(c.worker, [t.key for t in c.tasks]) for c in of(cmds, Execute)] == [("w2", ["b"])]


def test_an_input_back_before_the_backoff_ends_does_not_release_it_early(
    make_state: Factory,
) -> None:
    s, _ = input_lost_while_held(make_state)
    done = result("a", attempt=s.tasks["a"].attempt)
    cmds = run(s, at(TasksFinished, 12.0, worker="w2", results=(done,)))
    assert of(cmds, Execute) == [] and s.tasks["b"].state == "waiting"  # held until 14
    (ex,) = of(run(s, at(Tick, 14.0)), Execute)
    assert [t.key for t in ex.tasks] == ["b"]


class Asks:
    """A retry policy answering ``delay`` for every charged retry."""

    name = "asks"

    def __init__(self, delay: Any) -> None:
        self.delay = delay

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        return RetryDecision(task.retries_left > 0, charge=True, delay=self.delay)


def test_a_huge_delay_is_cut_to_the_longest_hold(make_state: Factory) -> None:
    for delay in (1e9, math.inf):
        s = backoff_state(make_state)
        s.policies["retry"] = Asks(delay)
        assert fails(s, 10.0) == []
        assert s.tasks["a"].retry_at == 10.0 + MAX_RETRY_DELAY
        assert run(s, at(Tick, 10.0 + MAX_RETRY_DELAY - 1)) == []
        assert [type(c) for c in run(s, at(Tick, 10.0 + MAX_RETRY_DELAY))] == [Execute]
        assert f"cut to {MAX_RETRY_DELAY:g} s" in str(s.story("a"))
        assert s.policy_errors == 0


@pytest.mark.parametrize("delay", [-1.0, math.nan, "5", None, True])
def test_a_delay_that_is_not_seconds_is_a_policy_error_and_the_retry_goes_at_once(
    make_state: Factory, delay: Any
) -> None:
    s = backoff_state(make_state)
    s.policies["retry"] = Asks(delay)
    cmds = fails(s, 10.0)
    # the retry goes at once, and the policy error is told (logged once by the shell)
    assert [type(c) for c in cmds] == [PolicyFailed, Execute]
    assert (cmds[0].kind, cmds[0].errors) == ("retry", 1)
    assert s.policy_errors == 1 and s.retry_held == []
    (err,) = [e[2] for e in s.story("a") if e[1] == "policy-error"]
    assert f"retry asked a delay of {delay!r}" in err


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"backoff": -1}, "backoff must be a number of seconds from 0 to 3600"),
        ({"backoff": math.inf}, "backoff must be a number of seconds from 0 to 3600"),
        ({"backoff": math.nan}, "backoff must be a number of seconds from 0 to 3600"),
        ({"max_backoff": 1e9}, "max_backoff must be a number of seconds from 0 to 3600"),
        ({"backoff": "2s"}, "backoff must be a number (a float or an int), got '2s'"),
        ({"backoff": True}, "backoff must be a number (a float or an int), got True"),
    ],
)
def test_bad_backoff_parameters_are_refused_with_what_to_give(
    params: dict[str, Any], says: str
) -> None:
    with pytest.raises(PolicyParamsError) as info:
        REGISTRY.create("retry", "default", params)
    assert (info.value.kind, info.value.name) == ("retry", "default")
    assert says in str(info.value)


def test_a_config_file_sets_the_backoff_and_refuses_a_bad_one(tmp_path: Path) -> None:
    from actors.pools import load_policies
    from runtime.errors import PolicyConfigError

    path = tmp_path / "corral.toml"
    path.write_text('[policies.retry]\nname = "default"\nbackoff = 2\nmax_backoff = 30\n')
    assert load_policies(path, REGISTRY) == {
        "retry": ("default", {"backoff": 2, "max_backoff": 30})
    }
    path.write_text('[policies.retry]\nname = "default"\nbackoff = -2\n')
    with pytest.raises(PolicyConfigError, match="backoff must be a number of seconds from 0"):
        load_policies(path, REGISTRY)


def test_the_console_line_counts_held_retries() -> None:
    assert _held_back({"retry_held": 2}) == ", 2 held for retry (backoff)"
    assert _held_back({"held_back": 1, "retry_held": 0}) == " (1 held back: inputs unreachable)"


# ----------------------------------------------------------------------------- a real cluster

_tries: dict[str, int] = {}


def flaky_read(name: str) -> str:
    """Fails its first two tries (a storage hiccup), then reads."""
    _tries[name] = _tries.get(name, 0) + 1
    if _tries[name] <= 2:
        raise OSError(f"remote storage hiccup ({_tries[name]})")
    return f"read {name}"


@pytest.mark.anyio
async def test_a_cluster_backs_off_between_tries_of_a_flaky_read() -> None:
    """With ``backoff=0.5`` a task failing twice then succeeding has its tries at least
    0.5 s and 1.0 s apart, by its story's timestamps; the status shows it held."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            info = await cluster.set_policy("retry", "default", backoff=0.5)
            assert info.params == {"backoff": 0.5}
            fut = cluster.submit(flaky_read, "run-42.root", retries=2)
            seen_held = 0
            while not fut.done():  # bounded by fail_after; each look is one ask
                status = await cluster.status()
                seen_held = max(seen_held, status.get("retry_held", 0))
                await anyio.sleep(0.02)
            assert await fut == "read run-42.root"
            story = await cluster.story(fut.key)
    sends = [e[4] for e in story if e[2] == "processing"]
    assert len(sends) == 3, story
    assert sends[1] - sends[0] >= 0.5 and sends[2] - sends[1] >= 1.0, sends
    retries = [e[2] for e in story if e[1] == "retry"]
    assert retries[0].endswith("retry in 0.5 s") and retries[2].endswith("retry in 1 s"), retries
    assert seen_held == 1
