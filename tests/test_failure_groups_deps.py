"""Tasks that erred because a dependency failed (DependencyFailed) in the dashboard's
"why tasks fail": the scheduler core groups them per category as it fails them (cause
``dependency-failed``, counted in tasks, not tries: they never ran), their story says
which dependency failed and why, and the page and the story page show the group.

A user audit found them invisible: ``tasks_by_state`` said 10 erred, the failure groups
(built from tries) covered 7, and such a task's story read ``waiting -> erred`` with no
reason. Pure-core tests feed events to ``SchedulerState.handle`` (no loop, no clock);
the dashboard-level ones take the core's groups through ``_failure_groups`` (the
scheduler's MetricsReply field), ``build_snapshot`` and ``story_page``, and render the
snapshot in a headless Chromium.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors import scheduler_state
from actors.scheduler import _failure_groups
from actors.scheduler_records import MAX_DEPENDENCY_NOTE, error_record
from actors.scheduler_state import SchedulerState
from runtime.dashboard import build_snapshot, story_page
from runtime.errors import DependencyFailed
from runtime.graph import Key
from runtime.messages import AlertsReply, FailureGroupInfo, MetricsReply, StatusReply
from tests.helpers import GB, MB, Cli, Factory, finish, join, make_state, submit
from tests.test_dashboard import Dashboard, browser

#: the autouse fixture (tests/helpers.py) that validates every state, and the dashboard
#: tests' Chromium
__all__ = ["browser", "make_state"]

pytestmark = pytest.mark.timeout(60)


def _raises(text: str) -> ValueError:
    """A ValueError as a task raises it (with a traceback)."""

    def load_rows() -> None:
        raise ValueError(text)

    try:
        load_rows()
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def _notes(s: SchedulerState, key: str) -> list[tuple[str, str]]:
    """``(start, finish)`` of each entry of ``key``'s story."""
    return [(str(e[1]), str(e[2])) for e in s.story(key)]


def _two_failures(make_state: Factory) -> SchedulerState:
    """load-0 <- parse-0 <- summary-0 and load-1 <- parse-1: load-0 fails, then load-1
    (each with ValueError, once: no retry)."""
    s = make_state(saturation=1.0)
    table: dict[Key, list[Key]] = {
        "load-0": [],
        "parse-0": ["load-0"],
        "summary-0": ["parse-0"],
        "load-1": [],
        "parse-1": ["load-1"],
    }
    submit(s, table, ["summary-0", "parse-1"])
    join(s, "w", cores=2)
    finish(s, "w", "load-0", "error", error=_raises("bad row 3"))
    finish(s, "w", "load-1", "error", error=_raises("bad row 7"))
    return s


def test_dependents_that_erred_are_grouped_and_their_story_says_why(
    make_state: Factory,
) -> None:
    s = _two_failures(make_state)
    assert {k: ts.state for k, ts in s.tasks.items() if ts.state == "erred"} == dict.fromkeys(
        ["load-0", "parse-0", "summary-0", "load-1", "parse-1"], "erred"
    )
    # The tries' counts and groups are as before: two failed tries, of load.
    assert s.failure_counts() == {("load", "error", "ValueError"): 2}
    assert {k: g.n for k, g in s.failure_groups.items()} == {("load", "ValueError"): 2}
    assert [r.key for r, _, _ in s.recent_tries] == ["load-0", "load-1"]

    # The tasks not run, grouped per category: how many, and the latest one.
    groups = s.not_run_groups
    assert list(groups) == [("parse", "dependency-failed"), ("summary", "dependency-failed")]
    parse, summary = (
        groups[("parse", "dependency-failed")],
        groups[("summary", "dependency-failed")],
    )
    assert (parse.n, parse.key, parse.dependency, parse.root) == (2, "parse-1", "load-1", "load-1")
    assert parse.error.summary == "ValueError: bad row 7"
    assert (summary.n, summary.key, summary.dependency, summary.root) == (
        1, "summary-0", "parse-0", "load-0",
    )  # fmt: skip
    assert summary.error.summary == "ValueError: bad row 3"
    assert s.tasks["parse-1"].tries == []  # no try: not counted as one
    assert parse.at == s.story("parse-1")[-1][4]  # the core's time it erred

    # Every erred task is accounted for: 2 tries of load, 3 tasks not run.
    erred = sum(ts.state == "erred" for ts in s.tasks.values())
    assert (
        sum(g.n for g in s.failure_groups.values()) + sum(g.n for g in s.not_run_groups.values())
        == erred
        == 5
    )

    # Its story says which dependency failed, and why, before it erred.
    assert _notes(s, "parse-1") == [
        ("new", "waiting"),
        ("dependency-failed", "dependency 'load-1' failed: ValueError: bad row 7"),
        ("waiting", "erred"),
    ]
    assert _notes(s, "summary-0") == [
        ("new", "waiting"),
        (
            "dependency-failed",
            "dependency 'parse-0' failed because 'load-0' failed: ValueError: bad row 3",
        ),
        ("waiting", "erred"),
    ]
    # Told under the stimulus that failed it, as its transition is.
    (_, note, erred_row) = s.story("parse-1")
    assert note[3] == erred_row[3] == s.story("load-1")[-1][3]
    # Its future's error is unchanged (it names the task that failed first).
    err = s.tasks["summary-0"].error
    assert isinstance(err, DependencyFailed)
    assert str(err).startswith(
        "task 'summary-0' was not run: dependency 'load-0' failed (ValueError: bad row 3)."
    )


def test_the_dashboard_groups_show_the_dependency_groups_after_the_tries(
    make_state: Factory,
) -> None:
    s = _two_failures(make_state)
    now = s.not_run_groups[("parse", "dependency-failed")].at + 4.0
    groups = _failure_groups(s, now)
    assert [(g.category, g.cause, g.n, g.key, g.worker, g.outcome) for g in groups] == [
        ("load", "ValueError", 2, "load-1", "w", "error"),  # ties: the tries first
        ("parse", "dependency-failed", 2, "parse-1", "", "not-run"),
        ("summary", "dependency-failed", 1, "summary-0", "", "not-run"),
    ]
    load, parse, summary = groups
    assert (load.ago, parse.ago) == (4.0, 4.0)
    assert parse.error == "dependency 'load-1' failed: ValueError: bad row 7"
    assert summary.error == (
        "dependency 'parse-0' failed because 'load-0' failed: ValueError: bad row 3"
    )
    # The traceback is the failure's that the task inherited.
    assert "Traceback (most recent call last)" in parse.traceback
    assert "in load_rows" in parse.traceback
    assert parse.traceback.endswith("ValueError: bad row 7\n")


def test_dependency_groups_do_not_count_as_tries_and_are_bounded(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_state, "MAX_FAILURE_GROUPS", 1)
    s = make_state(saturation=1.0)
    table: dict[Key, list[Key]] = {
        "load-0": [],
        "parse-0": ["load-0"],
        "sum-0": ["load-0"],
        "plot-0": ["load-0"],
    }
    submit(s, table, ["parse-0", "sum-0", "plot-0"])
    join(s, "w")
    finish(s, "w", "load-0", "error", error=ValueError("x"))
    groups = s.not_run_groups
    assert len(groups) == 2 and sum(g.n for g in groups.values()) == 3
    (first,) = set(groups) - {("(other)", "dependency-failed")}
    assert groups[first].n == 1 and groups[("(other)", "dependency-failed")].n == 2
    assert s.failure_counts() == {("load", "error", "ValueError"): 1}


def test_tasks_the_scheduler_fails_unrun_are_grouped_too(make_state: Factory) -> None:
    """Not only a dependency's failure: a task failed by the core before any try (here
    TaskTooLarge: its inputs fit on no worker) is in a group of its own, and so are its
    dependents."""
    s = make_state(saturation=1.0)
    join(s, "w1", memory=GB)
    submit(s, {"x": [], "y": []}, ["x", "y"])
    for _ in range(2):  # one at a time (one core)
        (key,) = (k for k, ts in s.tasks.items() if ts.state == "processing")
        finish(s, "w1", key, nbytes=600 * MB)
    submit(s, {"sum-0": ["x", "y"], "plot-0": ["sum-0"]}, ["plot-0"])
    assert (s.tasks["sum-0"].state, s.tasks["plot-0"].state) == ("erred", "erred")
    assert s.failure_counts() == {} and s.failure_groups == {}  # no try failed
    assert {k: g.n for k, g in s.not_run_groups.items()} == {
        ("sum", "TaskTooLarge"): 1,
        ("plot", "dependency-failed"): 1,
    }
    too_large, plot = _failure_groups(s, now=s._now)
    assert (too_large.category, too_large.cause, too_large.key, too_large.worker) == (
        "sum", "TaskTooLarge", "sum-0", "",
    )  # fmt: skip
    assert too_large.outcome == "not-run" and too_large.error.startswith("TaskTooLarge: ")
    assert plot.error.startswith("dependency 'sum-0' failed: TaskTooLarge: ")
    assert [e[1:3] for e in s.story("plot-0")][-2][0] == "dependency-failed"


def test_a_failure_spreading_to_many_dependents_is_recorded_once(
    make_state: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure that fails 2,000 dependents: its error is recorded (frames walked) and
    the story's note made once, not per dependent; a huge error is cut in the note."""
    calls = []
    record = error_record

    def counting(error: BaseException) -> Any:
        calls.append(type(error).__name__)
        return record(error)

    monkeypatch.setattr(scheduler_state, "error_record", counting)
    s = make_state(saturation=1.0)
    n = 2000
    table: dict[Key, list[Key]] = {"load-0": []}
    table.update({f"parse-{i}": ["load-0"] for i in range(n)})
    submit(s, table, [f"parse-{i}" for i in range(n)])
    join(s, "w")
    finish(s, "w", "load-0", "error", error=ValueError("y" * 5000))
    assert calls == ["ValueError", "ValueError"]  # its try's group, its dependents' group
    assert s.not_run_groups[("parse", "dependency-failed")].n == n
    notes = {id(e[2]) for e in s.story_log if e[1] == "dependency-failed"}
    assert len(notes) == 1  # one text, shared by the 2,000 stories
    note = next(e[2] for e in s.story_log if e[1] == "dependency-failed")
    assert len(note) == MAX_DEPENDENCY_NOTE and note.endswith("...")
    assert note.startswith("dependency 'load-0' failed: ValueError: yyy")
    assert s._inherited is None  # nothing held once the failure has spread


# ----------------------------------------------------------------------------- the page


def _snapshot(make_state: Factory) -> tuple[dict[str, Any], tuple[FailureGroupInfo, ...]]:
    s = _two_failures(make_state)
    groups = _failure_groups(s, now=s.not_run_groups[("parse", "dependency-failed")].at + 4.0)
    by_state: dict[str, int] = {}
    for ts in s.tasks.values():
        by_state[ts.state] = by_state.get(ts.state, 0) + 1
    metrics = MetricsReply(
        tasks_by_state=by_state,
        tasks_created=len(s.tasks),
        failure_groups=groups,
        failure_groups_total=len(s.failure_groups) + len(s.not_run_groups),
    )
    return build_snapshot(metrics, StatusReply(), AlertsReply(), now=1000.0), groups


def test_the_snapshot_and_the_story_page_account_for_every_erred_task(
    make_state: Factory,
) -> None:
    snap, groups = _snapshot(make_state)
    assert snap["tasks_by_state"]["erred"] == 5
    assert snap["failure_groups"] == 3
    not_run = [f for f in snap["failures"] if f["outcome"] == "not-run"]
    tries = [f for f in snap["failures"] if f["outcome"] != "not-run"]
    assert sum(f["n"] for f in not_run) == 3 and sum(f["n"] for f in tries) == 2
    assert not_run[0]["key"] == "parse-1"
    assert not_run[0]["error"] == "dependency 'load-1' failed: ValueError: bad row 7"

    # The story page of the latest task of a group: the group, why, the traceback.
    rows = [["parse-1", "new", "waiting", "s-1", "1.0"],
            ["parse-1", "dependency-failed",
             "dependency 'load-1' failed: ValueError: bad row 7", "s-2", "2.0"],
            ["parse-1", "waiting", "erred", "s-2", "2.0"]]  # fmt: skip
    page = story_page("parse-1", rows, [g for g in groups if g.key == "parse-1"])
    assert "Latest of parse / dependency-failed (2 tasks not run)" in page
    assert "not run: a task it depends on failed" in page
    assert "dependency &#x27;load-1&#x27; failed: ValueError: bad row 7" in page
    assert "tries)" not in page and "on worker" not in page
    assert "in load_rows" in page


@pytest.mark.slow
def test_chromium_shows_dependency_groups_one_click_from_a_story(
    browser: Any, tmp_path: Path, make_state: Factory
) -> None:
    """The page draws a dependency group as tasks not run (no worker), its latest
    task a link to its story."""
    snap, _ = _snapshot(make_state)
    with Cli(tmp_path / "home") as cli:
        proc, _ = cli.manager()
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.get(url)
        page = Dashboard(browser)
        page.wait("return document.body.dataset.snapshots >= 1", "a first snapshot")
        shown = browser.execute_script(
            "render(arguments[0]);"
            "return [...document.querySelectorAll('.failure')].map(f => [f.dataset.category,"
            " f.dataset.cause, f.innerText,"
            " f.querySelector('.story-link').getAttribute('href')]);",
            snap,
        )
    assert [(c, cause) for c, cause, _, _ in shown] == [
        ("load", "ValueError"),
        ("parse", "dependency-failed"),
        ("summary", "dependency-failed"),
    ]
    load, parse, summary = (text for _, _, text, _ in shown)
    assert "2 x" in load and "on w," in load
    assert parse.startswith("2 tasks parse · dependency-failed (not run) · latest parse-1, ")
    assert "dependency 'load-1' failed: ValueError: bad row 7" in parse
    assert " on " not in parse.splitlines()[0]
    assert summary.startswith("1 task summary · dependency-failed (not run) · latest summary-0")
    assert shown[1][3] == "/dashboard/story?key=parse-1"
