"""The retry policy sees what the failing try raised: ``TaskView.error_type``,
``error_types`` (its type's and its bases' names) and ``error_message``
(docs/policies.md, retry).

A user audit: a survey's retry policy meant to give up at once on ``ValueError`` (bad
data) and retry ``OSError`` could not be written: ``decide`` got outcome ``error``,
cause None and a view with no trace of the exception, so a corrupt input was tried 6
times. Pure-core tests feed events and assert the exact answers; one test runs the
docs' own ``survey-retry`` example in a real ``Cluster``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import KeyErred
from actors.scheduler_records import MAX_ERROR_CHARS, TaskStateView
from policies import REGISTRY, RetryDecision, TaskView
from runtime.client import Cluster
from runtime.errors import STANDS_FOR
from tests.helpers import Factory, assigned, finish, join, leave, make_state, of, submit

__all__ = ["make_state"]  # the autouse fixture, used by name

BOUND = 60.0
DOCS = Path(__file__).resolve().parent.parent / "docs" / "policies.md"


class Seeing:
    """Records what each ``decide`` saw; gives up on ValueError, retries the rest
    (charged) while the budget lasts."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, tuple[str, ...], str | None]] = []

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision:
        self.seen.append((outcome, task.error_type, task.error_types, task.error_message))
        if "ValueError" in task.error_types:
            return RetryDecision(False, reason="bad data")
        return RetryDecision(task.retries_left > 0, charge=True)


def test_the_retry_policy_sees_the_error_s_type_bases_and_text(make_state: Factory) -> None:
    policy = Seeing()
    s = make_state(retry=policy)
    join(s, "w1", cores=2)
    submit(s, {"bad": [], "flaky": []}, ["bad", "flaky"], retries=5)
    (ke,) = of(finish(s, "w1", "bad", "error", error=ValueError("corrupt FITS")), KeyErred)
    assert isinstance(ke.error, ValueError)  # given up at once: one try of five
    assert len(s.tasks["bad"].tries) == 1
    cmds = finish(s, "w1", "flaky", "error", error=FileNotFoundError(2, "no such file"))
    assert assigned(cmds) == {"w1": ["flaky"]}  # an OSError: retried
    assert policy.seen == [
        ("error", "ValueError", ("ValueError", "Exception", "BaseException"), "corrupt FITS"),
        (
            "error",
            "FileNotFoundError",
            ("FileNotFoundError", "OSError", "Exception", "BaseException"),
            "[Errno 2] no such file",
        ),
    ]
    leave(s, "w1", cause="crash")  # a loss: no exception to see
    assert policy.seen[-1] == ("worker-lost", None, (), None)


def test_an_error_that_stands_for_one_the_manager_could_not_load(make_state: Factory) -> None:
    """A task's own exception that could not travel comes as a ``RuntimeError`` standing
    for it: its own name is known, not its bases; its text is bounded."""
    policy = Seeing()
    s = make_state(retry=policy)
    join(s, "w1")
    submit(s, {"a": []}, ["a"], retries=1)
    error = RuntimeError("x" * (MAX_ERROR_CHARS + 500))
    setattr(error, STANDS_FOR, "labops.TwoArgError")
    finish(s, "w1", "a", "error", error=error)
    ((outcome, name, names, text),) = policy.seen
    assert (outcome, name, names) == ("error", "TwoArgError", ("TwoArgError",))
    assert text == "x" * MAX_ERROR_CHARS


def test_other_policies_see_no_error(make_state: Factory) -> None:
    s = make_state()
    join(s, "w1")
    submit(s, {"a": []}, ["a"])
    view = TaskStateView(s.tasks["a"])
    assert (view.error_type, view.error_types, view.error_message) == (None, (), None)


def _docs_survey_retry() -> str:
    """The docs' ``survey-retry`` example, up to its ``async with`` (which needs a loop)."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    (block,) = [b for b in blocks if '"survey-retry"' in b]
    return block.split("\nasync with", 1)[0]


_tries: dict[str, int] = {}


def corrupt(name: str) -> None:
    _tries[name] = _tries.get(name, 0) + 1
    raise ValueError(f"corrupt FITS header in {name}")


def missing_then_there(name: str) -> str:
    _tries[name] = _tries.get(name, 0) + 1
    if _tries[name] <= 2:
        raise FileNotFoundError(2, "not staged yet", name)
    return f"read {name}"


@pytest.mark.anyio
async def test_the_docs_survey_retry_tries_value_errors_once_and_retries_os_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what the example registers is unregistered after the test (others list the names)
    monkeypatch.setitem(REGISTRY._factories, "retry", dict(REGISTRY._factories["retry"]))
    namespace: dict[str, Any] = {}
    exec(compile(_docs_survey_retry(), str(DOCS), "exec"), namespace)
    assert "survey-retry" in REGISTRY.names("retry")
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1, policies={"retry": "survey-retry"}) as cluster:
            bad = cluster.submit(corrupt, "night-20261201.fits", retries=5)
            flaky = cluster.submit(missing_then_there, "night-20261202.fits", retries=3)
            with pytest.raises(ValueError, match="corrupt FITS header"):
                await bad
            assert await flaky == "read night-20261202.fits"
    assert _tries == {"night-20261201.fits": 1, "night-20261202.fits": 3}
