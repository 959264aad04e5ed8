"""What the cores and the registry do with a user's policy that misbehaves.

Pure cores fed events (time as data), their exact commands checked: a scaling policy
that starts raising mid-run keeps its pool's last good proposal (no drain of a busy
pool), counted per pool and told once per distinct problem; a retry policy that always
answers retry stops at the core's ceiling with a typed error; a retry policy moving a
task to a pool nobody serves is a policy error and the task stays in its pool. The
registry refuses a policy of the wrong kind and names a constructor's failure; a
``--policy-module`` file named like one of Corral's packages does not replace it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import policies
from actors.autoscaler_state import (
    POLICY_ERROR_EVERY,
    AutoscalerState,
    BlockStarted,
    DrainWorker,
    PolicyChanged,
    PolicyFailed,
    QueuesSeen,
    StartBlock,
    TargetSet,
    Tick,
)
from actors.scheduler_events import KeyErred, PolicyNoted
from policies import REGISTRY, PoolView, RetryDecision
from policies.scaling import PoolLimits
from runtime.errors import (
    PolicyCreateError,
    PolicyKindError,
    RetryPolicyLoop,
    UnknownPolicyError,
)
from tests.helpers import (
    Factory,
    assigned,
    event,
    finish,
    join,
    make_state,
    of,
    run,
    submit,
)

__all__ = ["make_state"]

# ----------------------------------------------------------------------------- scaling


class Answers:
    """A scaling policy that answers what it is told (raising an exception it is
    given)."""

    name = "answers"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def desired(self, pool: PoolView) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def busy_pool() -> AutoscalerState:
    """A configured pool whose policy asked for 3 blocks; all 3 run, each busy."""
    s = AutoscalerState(policy=Answers(3))
    limits = PoolLimits(max_blocks=3, slots_per_block=1)
    assert s.handle(TargetSet(0.0, "sweep", 0, "spec", limits)) == [
        StartBlock(i, "sweep", "spec") for i in (1, 2, 3)
    ]
    for i in (1, 2, 3):
        s.handle(BlockStarted(1.0, i, f"b{i}", (f"w{i}",)))
    s.handle(QueuesSeen(2.0, {"sweep": 20}, {"w1": 1, "w2": 1, "w3": 1}))
    s.validate()
    return s


def test_a_scaling_policy_that_starts_raising_keeps_the_pools_last_good_proposal() -> None:
    """Before: the pool fell back to its target (min_blocks, 0) and every busy worker
    was drained with tasks queued; the exception's text was lost."""
    s = busy_pool()
    out = s.handle(PolicyChanged(3.0, Answers(RuntimeError("boom in scaling"))))
    problem = "desired raised RuntimeError('boom in scaling')"
    assert out == [PolicyFailed("sweep", problem, 3, 1, "answers")]
    assert not of(out, DrainWorker) and s.pools["sweep"].desired == 3
    # the same problem again: counted, not told again until POLICY_ERROR_EVERY
    assert s.handle(Tick(4.0)) == []
    assert s.handle(Tick(3.0 + POLICY_ERROR_EVERY)) == [
        PolicyFailed("sweep", problem, 3, 3, "answers")
    ]
    assert s.policy_errors == 3 and s.policy_errors_by == {"sweep": 3}
    assert s.policy_problem == {"sweep": problem}
    # another problem is told at once, with its own words
    out = s.handle(PolicyChanged(70.0, Answers("three")))
    assert out == [
        PolicyFailed("sweep", "desired returned 'three' (str), not a whole number", 3, 4, "answers")
    ]
    s.validate()
    # a good answer again: the pool follows it
    assert s.handle(PolicyChanged(71.0, Answers(1))) == [
        DrainWorker("w2", "b2"),
        DrainWorker("w3", "b3"),
    ]


def test_a_scaling_policy_failing_from_the_start_keeps_the_target_and_the_blocks() -> None:
    s = AutoscalerState(policy=Answers(ValueError("no")))
    out = s.handle(TargetSet(0.0, "p", 2, "spec"))
    assert out == [
        PolicyFailed("p", "desired raised ValueError('no')", 2, 1, "answers"),
        StartBlock(1, "p", "spec"),
        StartBlock(2, "p", "spec"),
    ]


def test_a_scaling_policy_error_is_a_line_of_the_clusters_story(make_state: Factory) -> None:
    s = make_state()
    run(s, event(PolicyNoted, problem="scaling policy 'answers', pool 'sweep': boom"))
    assert [e[1:3] for e in s.story("-")] == [
        ("policy-error", "scaling policy 'answers', pool 'sweep': boom")
    ]
    assert s.policy_errors == 0  # counted by the autoscaler, where it happened


def test_the_scaling_policys_errors_are_in_the_status_text_and_the_dashboard() -> None:
    """Before: the console's status said nothing of them and the dashboard showed the
    scheduler's policy errors only ('policy_errors': 0)."""
    import dataclasses

    from runtime.console import jsonable
    from runtime.dashboard import build_snapshot
    from runtime.messages import AutoscalerStatus
    from tests.helpers import status_text
    from tests.test_dashboard import _answers

    metrics, status, alerts = _answers()
    problem = "desired raised RuntimeError('boom in scaling')"
    auto = AutoscalerStatus(
        policy="buggy", policy_errors=7, policy_errors_by={"sweep": 7},
        policy_problems={"sweep": problem},
    )  # fmt: skip
    status = dataclasses.replace(status, autoscaler=auto)
    assert build_snapshot(metrics, status, alerts, now=1000.0)["policy_errors"] == 7
    text = status_text(jsonable(status))
    assert "scaling policy errors: 7 (see story -)" in text
    assert f"pool sweep: 7, latest: {problem}" in text


# ----------------------------------------------------------------------------- retry


class Always:
    name = "always"

    def __init__(self, charge: bool = False) -> None:
        self.charge = charge

    def decide(self, task: Any, outcome: str, cause: str | None) -> RetryDecision:
        return RetryDecision(True, charge=self.charge, reason="again")


def test_a_retry_policy_that_always_retries_stops_at_the_ceiling(make_state: Factory) -> None:
    """Before: the task ran again and again, thousands of tries a second, for good."""
    s = make_state(retry=Always(charge=True), max_free_retries=3)
    join(s, "w1")
    submit(s, {"a": []}, ["a"], retries=1)
    boom = RuntimeError("transient?")
    for _ in range(4):  # one charged to its budget, then 3 charged past it: free
        cmds = finish(s, "w1", "a", "error", error=boom)
        assert assigned(cmds) == {"w1": ["a"]} and not of(cmds, KeyErred)
    (erred,) = of(finish(s, "w1", "a", "error", error=boom), KeyErred)
    err = erred.error
    assert isinstance(err, RetryPolicyLoop) and err.__cause__ is boom
    assert (err.policy, err.free, err.tries, err.reason) == ("always", 3, 5, "again")
    assert "kept answering retry" in str(err) and "RetryDecision(False)" in str(err)
    # uncharged retries are free from the first
    s = make_state(retry=Always(), max_free_retries=3)
    join(s, "w1")
    submit(s, {"b": []}, ["b"], retries=5)
    for _ in range(3):
        assert not of(finish(s, "w1", "b", "error", error=boom), KeyErred)
    (erred,) = of(finish(s, "w1", "b", "error", error=boom), KeyErred)
    assert isinstance(erred.error, RetryPolicyLoop) and erred.error.tries == 4


def test_the_default_retry_policy_is_not_bounded_by_the_ceiling(make_state: Factory) -> None:
    s = make_state(retry="default")
    join(s, "w1")
    submit(s, {"a": []}, ["a"], retries=150)
    for _ in range(150):  # charged retries within the budget: not free ones
        assert not of(finish(s, "w1", "a", "error", error=ValueError()), KeyErred)
    assert s.tasks["a"].free_retries == 0


class ToPool:
    name = "to-pool"

    def __init__(self, pool: str) -> None:
        self.pool = pool

    def decide(self, task: Any, outcome: str, cause: str | None) -> RetryDecision:
        return RetryDecision(task.retries_left > 0, charge=True, reason="move", pool=self.pool)


def test_a_retry_moving_a_task_to_a_pool_nobody_serves_is_a_policy_error(
    make_state: Factory,
) -> None:
    """Before: the task moved to 'gpu-typo' and waited for good, unseen."""
    s = make_state(retry=ToPool("gpu-typo"), pools=("cpu", "gpu"))
    join(s, "w1", pool="cpu")
    submit(s, {"a": []}, ["a"], retries=1, pool="cpu")
    cmds = finish(s, "w1", "a", "error", error=ValueError())
    assert assigned(cmds) == {"w1": ["a"]}  # retried where it was
    assert s.tasks["a"].spec.pool == "cpu" and s.policy_errors == 1
    (line,) = [e[2] for e in s.story("a") if e[1] == "policy-error"]
    assert line == (
        "retry moved the task to pool 'gpu-typo', which is not configured (pools: cpu, "
        "gpu) and which no worker has joined: it would wait for good; it stays in pool cpu"
    )


def test_without_configured_pools_a_retry_move_waits_and_says_so(make_state: Factory) -> None:
    """Workers started by hand: one may yet join any pool, so the move is made, and the
    task's story says what a submission naming that pool is told."""
    s = make_state(retry=ToPool("gpu-typo"))
    join(s, "w1", pool="cpu")
    submit(s, {"a": []}, ["a"], retries=1, pool="cpu")
    assert assigned(finish(s, "w1", "a", "error", error=ValueError())) == {}
    assert s.tasks["a"].spec.pool == "gpu-typo" and s.policy_errors == 0
    assert [e[1:3] for e in s.story("a")][-2:] == [
        ("processing", "queued"),
        (
            "queued",
            "waiting for a worker of pool 'gpu-typo', which no worker has joined (this "
            "manager configures no pool: the pools are those its workers' --pool name): it "
            "runs once a worker joins with --pool gpu-typo",
        ),
    ]


def test_a_retry_may_move_a_task_to_a_configured_pool_without_workers_yet(
    make_state: Factory,
) -> None:
    s = make_state(retry=ToPool("gpu"), pools=("cpu", "gpu"))
    join(s, "w1", pool="cpu")
    submit(s, {"a": []}, ["a"], retries=1, pool="cpu")
    finish(s, "w1", "a", "error", error=ValueError())
    assert s.tasks["a"].spec.pool == "gpu" and s.policy_errors == 0


# ----------------------------------------------------------------------------- priority


class Text:
    name = "text"

    def priority(self, task: Any, stats: Any) -> Any:
        return "high"


def test_a_priority_policy_answering_text_is_told_so(make_state: Factory) -> None:
    s = make_state(priority=Text())
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    (line,) = [e[2] for e in s.story("a") if e[1] == "policy-error"]
    assert line == "priority returned a str ('high'), not a tuple of numbers"


# ----------------------------------------------------------------------------- registry


def test_a_policy_of_the_wrong_kind_is_refused_when_registered_or_set() -> None:
    """A class lacking its kind's method is refused at ``register`` (before, it was
    registered and listed as available, and refused only when set: audit policy.md,
    defect 8); what a function factory makes is refused when it is set."""
    registry = policies.PolicyRegistry()

    class TrainFirst:  # a priority policy registered as a placement one
        def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
            return (0.0,)

    with pytest.raises(PolicyKindError) as info:
        registry.register("placement", "train-first")(TrainFirst)
    assert info.value.missing == ["choose"] and isinstance(info.value, TypeError)
    assert str(info.value).startswith(
        "placement policy 'train-first' has no method choose (it has priority: a policy "
        "of another kind?)"
    )
    assert "train-first" not in registry.names("placement")  # not listed as available

    class Misnamed:  # a typo of the method's name
        def prioritise(self, task: Any, stats: Any) -> tuple[float, ...]:
            return (0.0,)

    with pytest.raises(PolicyKindError, match="priority policy 'typo' has no method priority"):
        registry.register("priority", "typo")(Misnamed)
    assert registry.names("priority") == []
    registry.register("memory", "half")(lambda: type("Half", (), {"producer": print})())
    with pytest.raises(PolicyKindError, match="has no method yields"):
        registry.create("memory", "half")

    class Proxy:  # its instances answer any method through __getattr__: checked when set
        def __getattr__(self, name: str) -> Any:
            return lambda *args: (0.0,)

    registry.register("priority", "proxy")(Proxy)
    assert registry.create("priority", "proxy").priority(None, {}) == (0.0,)


def test_every_built_in_policy_has_its_kinds_methods() -> None:
    for kind in policies.KINDS:
        for name in REGISTRY.names(kind):
            REGISTRY.create(kind, name)


def test_a_constructor_that_fails_otherwise_is_named_with_its_parameters() -> None:
    registry = policies.PolicyRegistry()

    @registry.register("priority", "needs-gpu")
    class NeedsGpu:
        def __init__(self, device: int = 0) -> None:
            raise RuntimeError("no GPU visible")

        def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
            return (0.0,)

    with pytest.raises(PolicyCreateError) as info:
        registry.create("priority", "needs-gpu", {"device": 1})
    assert str(info.value).startswith(
        "priority policy 'needs-gpu' could not be created (parameters: device=1): its "
        "constructor raised RuntimeError: no GPU visible."
    )
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_unknown_kind_lists_the_kinds_and_does_not_say_register_it() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        REGISTRY.create("prioirty", "graph")
    text = str(info.value)
    assert text.startswith("no kind of policy named 'prioirty'; did you mean 'priority'?")
    assert "Register it" not in text and "a kind cannot be registered" in text


# ----------------------------------------------------------------------------- modules


def test_a_policy_module_file_named_policies_does_not_replace_corrals(tmp_path: Path) -> None:
    from runtime.__main__ import _import_policy_module

    (tmp_path / "policies.py").write_text(
        "import policies\n"
        "@policies.register('priority', 'mine-guards-test')\n"
        "class Mine:\n"
        "    def priority(self, task, stats):\n"
        "        return (task.order,)\n"
    )
    corral = sys.modules["policies"]
    try:
        _import_policy_module(str(tmp_path / "policies.py"))
        assert sys.modules["policies"] is corral
        assert "mine-guards-test" in REGISTRY.names("priority")
    finally:
        sys.modules["policies"] = corral
        REGISTRY._factories["priority"].pop("mine-guards-test", None)
        for name in [n for n in sys.modules if n.startswith("_corral_policy_module_policies_")]:
            del sys.modules[name]


# ----------------------------------------------------------------------------- a cluster


@pytest.mark.anyio
async def test_a_cluster_keeps_its_blocks_and_says_why_when_the_scaling_policy_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shell's side, end to end in one process: the error is logged once with its
    text, counted per pool in the status and is a line of ``story -``; the pool keeps
    its blocks (before, it was drained to its target, 0)."""
    import anyio

    from runtime import Cluster
    from tests.helpers import log_lines, wait_until

    scaling = REGISTRY._factories["scaling"]  # registered for this test only
    monkeypatch.setitem(scaling, "guards-two", lambda: Answers(2))
    monkeypatch.setitem(scaling, "guards-buggy", lambda: Answers(RuntimeError("boom in scaling")))
    with anyio.fail_after(60), log_lines() as logs:
        async with Cluster(
            pools={"sweep": {"max_blocks": 3, "init_blocks": 1}},
            policies={"scaling": "guards-two"},
        ) as c:
            await c.set_policy("scaling", "guards-buggy")

            async def noted() -> bool:
                return any(e[1] == "policy-error" for e in await c.story("-"))

            await wait_until(noted, "the policy error in story -", limit=30)
            auto = (await c.status())["autoscaler"]
            assert auto["desired"] == {"sweep": 2} and auto["policy_errors_by"]["sweep"] >= 1
            problem = "desired raised RuntimeError('boom in scaling')"
            assert auto["policy_problems"] == {"sweep": problem}
            lines = [e[2] for e in await c.story("-") if e[1] == "policy-error"]
            said = f"scaling policy 'guards-buggy', pool 'sweep': {problem}; kept 2"
            assert lines[0].startswith(said)
    told = [line for line in logs.lines if "the scaling policy failed" in line]
    assert len(told) == 1 and "boom in scaling" in told[0]


# ----------------------------------------------------------------------------- [policies]


def test_a_config_files_policies_table_is_read_and_checked(tmp_path: Path) -> None:
    from actors.pools import load_policies
    from runtime.errors import PolicyConfigError

    path = tmp_path / "corral.toml"
    path.write_text(
        '[policies]\npriority = "long-first"\n\n[policies.retry]\nname = "default"\nmax_lost = 2\n'
    )
    assert load_policies(path, REGISTRY) == {
        "priority": ("long-first", {}),
        "retry": ("default", {"max_lost": 2}),
    }

    def refused(text: str) -> str:
        path.write_text(text)
        with pytest.raises(PolicyConfigError) as info:
            load_policies(path, REGISTRY)
        assert isinstance(info.value, ValueError) and info.value.source == str(path)
        return str(info.value)

    assert refused('[policies]\nprioirty = "graph"\n').startswith(
        f"[policies] in {path}: key 'prioirty' is not a kind of policy; did you mean "
        "'priority'? The kinds are: priority, placement,"
    )
    unknown = refused('[policies]\npriority = "fastest"\n')
    assert "no priority policy named 'fastest'" in unknown
    # a name of one's own: the manager must import its module (the audit's defect 7)
    assert "start the manager with `--policy-module MODULE`" in unknown
    assert "Register it with policies.register()" not in unknown
    text = refused('[policies.retry]\nname = "default"\nmax_lots = 2\n')
    assert "no parameter 'max_lots'; did you mean 'max_lost'?" in text
    assert text.endswith("See docs/configuration.md#policies.")
    assert "must be a policy's name" in refused("[policies]\nretry = 3\n")
    assert "needs pools" in refused('[policies]\nscaling = "queue"\n')
    # with pools, a scaling policy is taken
    path.write_text('[pools.cpu]\nmax_blocks = 2\n\n[policies]\nscaling = "queue"\n')
    assert load_policies(path, REGISTRY) == {"scaling": ("queue", {})}


# ----------------------------------------------------- the scheduler's policies: told


class _Raises:
    """A priority, placement and retry policy that raise on every call."""

    name = "raiser"

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        raise KeyError(f"night of {task.key}")  # the text differs per task

    def choose(self, task: Any, candidates: Any, stats: Any) -> Any:
        raise RuntimeError("placement bug")

    def decide(self, task: Any, outcome: str, cause: str | None) -> RetryDecision:
        raise RuntimeError("retry bug")


def test_a_scheduler_policy_error_is_told_once_per_problem_and_kept_by_kind(
    make_state: Factory,
) -> None:
    """Before: no log line, no command; only a count over every kind (the audit's
    policy_errors=10 and nothing else)."""
    from actors.scheduler_events import PolicyChanged as Swapped
    from actors.scheduler_events import PolicyFailed as Told

    bad = _Raises()
    s = make_state(priority=bad, placement=bad, retry=bad)
    keys = [f"t-{i}" for i in range(10)]
    out = submit(s, dict.fromkeys(keys, ()), keys)
    told = [c for c in out if type(c) is Told]  # 10 errors, each with its own key: told once
    assert [(c.kind, c.policy, c.errors) for c in told] == [("priority", "raiser", 1)]
    assert told[0].problem.startswith("priority raised KeyError('night of t-")
    out = join(s, "w1", cores=2)
    told = [c for c in out if type(c) is Told]
    assert [(c.kind, c.problem, c.errors) for c in told] == [
        ("placement", "placement raised RuntimeError('placement bug')", 1)
    ]
    (first, *_) = (ts.key for ts in s.workers["w1"].processing)
    out = finish(s, "w1", first, "error")
    told = [c for c in out if type(c) is Told]
    assert [(c.kind, c.problem, c.errors) for c in told] == [
        ("retry", "retry raised RuntimeError('retry bug')", 1)
    ]
    assert s.problems.by["priority"] == 10 and s.problems.by["retry"] == 1
    assert s.problems.by["placement"] >= 2
    assert s.problems.problem["priority"].startswith("priority raised KeyError('night of t-")
    assert s.policy_errors == sum(s.problems.by.values())
    # a new policy of the kind has its errors told afresh
    out = run(s, event(Swapped, kind="priority", policy=bad))  # (re-ranks the ready ones)
    told = [c for c in out + submit(s, {"u": []}, ["u"]) if type(c) is Told]
    assert [(c.kind, c.errors) for c in told] == [("priority", 11)]


def test_the_scheduler_policys_problems_are_in_the_status_text() -> None:
    import dataclasses

    from runtime.console import jsonable
    from tests.helpers import status_text
    from tests.test_dashboard import _answers

    _, status, _ = _answers()
    status = dataclasses.replace(
        status, policy_errors=14, policy_errors_by={"priority": 10, "retry": 4},
        policy_problems={
            "priority": "priority raised KeyError('night')",
            "retry": "retry returned True, not a RetryDecision",
        },
    )  # fmt: skip
    text = status_text(jsonable(status))
    assert "policy errors: 14 (see the tasks' stories)" in text
    assert "priority: 10, latest: priority raised KeyError('night')" in text
    assert "retry: 4, latest: retry returned True, not a RetryDecision" in text
