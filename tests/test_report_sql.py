"""The report's numbers computed by SQLite and its series thinned as they are read
(runtime/report.py reads no table whole): each equals what the rows, all in memory,
give in plain Python (the report's way before), on databases of known rows."""

from __future__ import annotations

import random
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from runtime import report
from runtime.monitordb import MonitorWriter, open_db
from runtime.report import _cdf, _memory, _Run, _summary, _thin, _Thinned, _timeline

RUN = "run-1"
T0 = 1_700_000_000.0
TRY = (
    "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, outcome, "
    "cause, error_type) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
TASK = (
    "INSERT INTO tasks (run_id, key, category, submitted, ready, started, finished, state) "
    "VALUES (?,?,?,?,?,?,?,?)"
)


def _db(tmp_path: Path, tries: list[tuple[Any, ...]] = (), tasks: list[tuple[Any, ...]] = (),
        samples: list[tuple[Any, ...]] = ()) -> Path:  # fmt: skip
    """A monitoring database with run ``RUN`` (over 3,600 s) and these rows, and an
    older run whose rows must not count."""
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()  # the schema
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "INSERT INTO runs (run_id, started, ended, host, pid) VALUES (?,?,?,?,?)",
            (RUN, T0, T0 + 3600.0, "host", 1),
        )
        conn.execute(
            "INSERT INTO runs (run_id, started, ended, host, pid) VALUES (?,?,?,?,?)",
            ("before", T0 - 9000.0, T0 - 8000.0, "host", 1),
        )
        conn.execute(TRY, ("before", "x-1", 1, "fit", "w", 0.0, T0 - 8500.0, T0 - 8100.0,
                           "ok", None, None))  # fmt: skip
        conn.execute(TASK, ("before", "x-1", "fit", T0 - 8999.0, T0 - 8999.0, T0 - 8500.0,
                            T0 - 8100.0, "memory"))  # fmt: skip
        conn.executemany(TRY, [(RUN, *r) for r in tries])
        conn.executemany(TASK, [(RUN, *r) for r in tasks])
        conn.executemany(
            "INSERT INTO resource_samples (run_id, time, worker, rss) VALUES (?,?,?,?)",
            [(RUN, *r) for r in samples],
        )
    conn.close()
    return db


def _run(db: Path, run_id: str | None = None) -> _Run:
    conn = open_db(db)
    try:
        return _Run(conn, run_id, lambda line: None)
    finally:
        conn.close()


def _traces(fig: Any) -> list[tuple[str, list[Any], list[Any]]]:
    return [(t.name, list(t.x), list(t.y)) for t in fig.data]


@pytest.mark.timeout(60)
def test_duration_quantiles_per_category_from_sqlite_equal_those_sorted_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tries of known durations in categories of 1 to 500 successful tries (with 37
    points a line at most, so most are thinned to evenly spaced quantiles): each
    category's CDF has the very points the durations sorted in Python give. Failed
    tries, tries not started or not ended, and the other run's tries are left out; a
    negative duration (a clock step) counts as 0; no category, '' and '?' are one."""
    most = 37
    monkeypatch.setattr(report, "MAX_POINTS", most)
    rnd = random.Random(5)
    tries = []
    for c, (cat, n) in enumerate([("fit", 500), ("load", 120), ("one", 1), ("two", 37),
                                  (None, 20), ("", 18), ("?", 1), ("z", 38)]):  # fmt: skip
        for i in range(n):
            started = T0 + rnd.uniform(0, 3000)
            duration = rnd.choice([rnd.expovariate(1.0), 0.5, 2.0, -0.25])  # ties, a step
            tries.append((f"{cat}-{c}-{i}", 1, cat, f"w-{i % 7}", started, started,
                          started + duration, "ok", None, None))  # fmt: skip
        tries.append((f"{cat}-{c}-failed", 1, cat, "w-1", T0, T0 + 1, T0 + 99, "error",
                      None, "KeyError"))  # fmt: skip
        tries.append((f"{cat}-{c}-lost", 1, cat, "w-1", T0, None, T0 + 99, "ok", None, None))
        tries.append((f"{cat}-{c}-running", 1, cat, "w-1", T0, T0 + 1, None, "ok", None, None))
    run = _run(_db(tmp_path, tries=tries))

    per: dict[str, list[float]] = defaultdict(list)
    for _, _, cat, _, _, started, ended, outcome, _, _ in tries:
        if outcome == "ok" and started is not None and ended is not None:
            per[cat or "?"].append(max(ended - started, 0.0))
    expected = []
    for cat, ds in sorted(per.items()):
        ds.sort()
        n = len(ds)
        at = (
            range(n)
            if n <= most
            else sorted({k * (n - 1) // (most - 1) for k in range(most)})
        )  # fmt: skip
        expected.append((f"{cat} ({n})", [ds[i] for i in at], [(i + 1) / n for i in at]))
    assert _traces(_cdf(run)) == expected
    names = [name for name, _, _ in expected]
    assert names == ["? (39)", "fit (500)", "load (120)", "one (1)", "two (37)", "z (38)"]
    assert all(len(xs) <= most and xs[0] == 0.0 for _, xs, _ in expected[:2])  # thinned


@pytest.mark.timeout(60)
def test_the_summary_counted_by_sqlite_equals_the_rows_counted_in_python(
    tmp_path: Path,
) -> None:
    """Tasks in states (none, '' and unknown ones), with and without their times, and
    failed tries of causes of equal counts: the states, the makespan, the median wait
    and the failures (by count, then by their first try's end, one not ended first)
    are those of the rows counted in Python."""
    rnd = random.Random(11)
    tasks = []
    for i in range(301):
        submitted = T0 + rnd.uniform(0, 100) if i % 17 else None
        ready = submitted + rnd.uniform(0, 5) if submitted is not None and i % 5 else None
        started = ready + rnd.choice([0.0, 0.5, rnd.uniform(0, 9)]) if ready else None
        finished = started + rnd.uniform(0, 60) if started and i % 3 else None
        state = rnd.choice(["memory", "released", "erred", None, "", "?", "waiting"])
        tasks.append((f"t-{i}", "t", submitted, ready, started, finished, state))
    causes = [("error", None, "KeyError"), ("error", "", "ValueError"), ("oom", "oom", None),
              ("worker-lost", "crash", None), ("timeout", None, None)]  # fmt: skip
    tries = []
    for i in range(60):
        outcome, cause, error = causes[i % 5]  # 12 of each: a tie
        ended = None if i == 0 else T0 + 1000 - 10 * i  # the later, the sooner it ended
        tries.append((f"t-{i}", 1, "t", "w-1", T0, T0, ended, outcome, cause, error))
    tries.append(("t-99", 1, "t", "w-1", T0, T0, T0 + 5000, "oom", "oom", None))  # 13 of it
    tries += [(f"t-{i}", 2, "t", "w-1", T0, T0, T0 + 2000, "ok", None, None) for i in range(60)]
    db = _db(tmp_path, tries=tries, tasks=tasks)
    run = _run(db)

    states: dict[str, int] = defaultdict(int)
    for t in tasks:
        states[t[6] or "?"] += 1
    assert run.states == dict(states) and run.tasks == 301 and run.tries == 121
    starts = [t[2] for t in tasks if t[2] is not None]
    ends = [t[5] for t in tasks if t[5] is not None]
    assert run.makespan == max(ends) - min(starts)
    waits = sorted(t[4] - t[3] for t in tasks if t[3] is not None and t[4] is not None)
    assert run.median_wait == waits[len(waits) // 2]
    failures: dict[tuple[str, str], int] = defaultdict(int)
    in_order = sorted(tries, key=lambda r: (r[6] is not None, r[6] or 0.0))  # ORDER BY ended
    for r in in_order:
        if r[7] != "ok":
            failures[(r[7], r[8] or r[9] or "")] += 1
    expected = [(o, c, n) for (o, c), n in sorted(failures.items(), key=lambda kv: -kv[1])]
    assert run.failures == expected
    # oom: 13; then 12 each: KeyError (a try not ended), timeout (ended first), ...
    assert [(o, c) for o, c, _ in run.failures] == [
        ("oom", "oom"), ("error", "KeyError"), ("timeout", ""), ("worker-lost", "crash"),
        ("error", "ValueError"),
    ]  # fmt: skip
    page = _summary(run)
    assert "<th>tasks</th><td>301</td>" in page and "<th>tries</th><td>121</td>" in page
    median = f"{waits[len(waits) // 2]:.3f} s"
    assert f"<th>median wait ready to sent to a worker</th><td>{median}" in page
    # the other run, a few of the rows (read through the index on run_id)
    before = _run(db, "before")
    assert (before.tasks, before.states, before.tries, before.median_wait) == (
        1, {"memory": 1}, 1, 499.0
    )  # fmt: skip
    assert before.makespan == 899.0 and before.durations == {"fit": (1, [400.0], [1.0])}


@pytest.mark.timeout(60)
def test_the_timeline_keeps_the_latest_tries_those_lost_together_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for 25 bars: the 25 tries that ended last, in order of end; tries that
    ended at one time (lost with their worker) by worker, then start, then as written;
    tries not ended are not drawn but counted in the title."""
    monkeypatch.setattr(report, "MAX_BARS", 25)
    tries = [(f"ok-{i}", 1, "fit", f"w-{i % 3}", T0, T0 + i, T0 + i + 1.5, "ok", None, None)
             for i in range(40)]  # fmt: skip
    lost = T0 + 30.25  # among the latest
    for key, worker in [("lost-d", "w-9"), ("lost-c", "w-2"), ("lost-b", "w-9"),
                        ("lost-a", "w-2")]:  # fmt: skip
        tries.append((key, 1, "fit", worker, T0, None, lost, "worker-lost", "crash", None))
    tries.append(("running", 1, "fit", "w-0", T0, T0 + 50, None, "ok", None, None))
    run = _run(_db(tmp_path, tries=tries))
    ended = sorted(
        (r for r in tries if r[6] is not None),
        key=lambda r: (r[6], r[3], r[5] is not None, r[5] or 0.0),  # then as written
    )
    assert [r[0] for r in run.latest] == [r[0] for r in ended[-25:]]
    together = [r[0] for r in run.latest if r[0].startswith("lost")]
    assert together == ["lost-c", "lost-a", "lost-d", "lost-b"]  # w-2's, then w-9's
    fig = _timeline(run)
    assert "(the latest 25 of 45 tries)" in fig.layout.title.text
    assert sum(len(t.y) for t in fig.data) == 25


def _old_thin(xs: list[float], ys: list[float], most: int) -> tuple[list[float], list[float]]:
    """The report's thinning as it was, on a whole series in memory."""
    n = len(xs)
    if n <= most:
        return xs, ys
    stretches = max(most // 2, 1)
    out_x: list[float] = []
    out_y: list[float] = []
    for k in range(stretches):
        lo, hi = k * n // stretches, (k + 1) * n // stretches
        if lo >= hi:
            continue
        part = range(lo, hi)
        low = min(part, key=ys.__getitem__)
        high = max(part, key=ys.__getitem__)
        for i in sorted({low, high}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


@pytest.mark.timeout(60)
def test_a_series_thinned_as_it_is_read_keeps_the_same_points_as_thinned_whole() -> None:
    """Series of every length around the limit, of few distinct values (ties: the first
    lowest and highest of a stretch stay): thinned point by point, the very points the
    whole series thinned gives."""
    rnd = random.Random(3)
    for most in (2, 3, 10, 101, 2000):
        for n in {0, 1, most - 1, most, most + 1, 2 * most - 1, 2 * most + 3, 7 * most + 5}:
            xs = [float(i) for i in range(max(n, 0))]
            ys = [float(rnd.randint(0, 4)) for _ in xs]
            line = _Thinned(len(xs), most)
            for x, y in zip(xs, ys, strict=True):
                line.add(x, y)
            line.done()
            assert (line.xs, line.ys) == _old_thin(xs, ys, most), (most, n)
            assert _thin(xs, ys, most) == _old_thin(xs, ys, most)


@pytest.mark.timeout(60)
def test_a_workers_memory_longer_than_its_share_of_points_keeps_its_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers' RSS, 3,000 samples each (not reported yet: none, then 0), drawn
    with at most 400 points a line: each line is its whole series thinned, its peak and
    its dip among the points."""
    monkeypatch.setattr(report, "FIGURE_POINTS", 800)
    rnd = random.Random(7)
    samples = []
    series: dict[str, tuple[list[float], list[float]]] = {"w-a": ([], []), "w-b": ([], [])}
    for i in range(3000):
        for j, worker in enumerate(series):
            rss = None if i == 0 else 0 if i == 1 else rnd.randint(2**27, 2**28)
            if (i, j) in ((1234, 0), (2222, 1)):
                rss = 2**33  # a peak
            if (i, j) in ((2345, 0), (777, 1)):
                rss = 2**20  # a dip
            at = T0 + i + j / 10
            samples.append((at, worker, rss))
            if rss:
                series[worker][0].append(at - T0)
                series[worker][1].append(rss / 2**20)
    rnd.shuffle(samples)  # written in any order: read in time order
    fig = _memory(_run(_db(tmp_path, samples=samples)))
    expected = [(w, *_old_thin(xs, ys, 400)) for w, (xs, ys) in sorted(series.items())]
    assert _traces(fig) == expected
    for _, xs, ys in expected:
        assert len(xs) <= 400 and 8192.0 in ys and 1.0 in ys


def test_tries_of_a_worker_and_category_closer_than_the_gap_are_one_bar() -> None:
    """_merge_bars, on rows in order of worker then start: a try beginning at most
    ``gap`` after its worker's bar of the same colour ends joins it (overlapping tries,
    of threads side by side, too); a category not drawn apart shares the grey bar of
    the others; a bar never spans two workers."""
    rows = [  # (worker, category, start, end), T0-based
        ("w-1", "fit", T0 + 0.0, T0 + 1.0),
        ("w-1", "fit", T0 + 0.5, T0 + 1.5),  # overlaps: same bar
        ("w-1", "io", T0 + 1.6, T0 + 1.7),  # another colour between: no break for fit
        ("w-1", "fit", T0 + 1.9, T0 + 2.0),  # 0.4 s after fit's end: same bar
        ("w-1", "fit", T0 + 2.6, T0 + 3.0),  # 0.6 s: a bar of its own
        ("w-1", "rare", T0 + 3.1, T0 + 3.2),  # not drawn apart: grey
        ("w-1", "odd", T0 + 3.3, T0 + 3.4),  # grey too, 0.1 s later: same grey bar
        ("w-2", "fit", T0 + 3.05, T0 + 3.5),  # another worker: never w-1's bar
    ]
    merged = report._merge_bars(iter(rows), {"fit", "io"}, 0.5, T0)
    assert merged.tries == 8 and merged.count == 5 and merged.gap == 0.5
    workers, starts, widths, counts, ran = merged.bars["fit"]
    assert workers == ["w-1", "w-1", "w-2"] and counts == [3, 1, 1]
    assert starts == pytest.approx([0.0, 2.6, 3.05])
    assert widths == pytest.approx([2.0, 0.4, 0.45])
    assert ran == pytest.approx([1.0 + 1.0 + 0.1, 0.4, 0.45])  # side by side: more than 2.0
    assert merged.bars["io"][0] == ["w-1"]
    grey = merged.bars[None]
    assert (grey[0], grey[3]) == (["w-1"], [2]) and grey[1] == pytest.approx([3.1])


def test_a_run_of_many_tries_draws_them_merged_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past EACH_TRY_UP_TO tries the timeline draws every try of the run (not the latest
    MAX_BARS alone): the successful ones merged per worker and category, the failed
    ones a bar each; its title says how many tries as how many bars, and the gap (the
    span drawn over TIMELINE_BINS)."""
    monkeypatch.setattr(report, "EACH_TRY_UP_TO", 50)
    monkeypatch.setattr(report, "MAX_BARS", 30)  # (of one bar per try: not these)
    tries = [  # 120 tries of 1 s back to back on each of 2 workers: one bar each
        (f"ok-{w}-{i}", 1, "fit", f"w-{w}", T0 + i, T0 + i, T0 + i + 1.0, "ok", None, None)
        for w in range(2)
        for i in range(60)
    ]
    tries += [  # after a pause of 100 s (past 3,600 / 2,000 s): a bar of their own
        (f"late-{i}", 1, "fit", "w-0", T0 + 200 + i, T0 + 200 + i, T0 + 201 + i, "ok", None,
         None)
        for i in range(5)
    ]  # fmt: skip
    tries.append(("bad", 1, "fit", "w-1", T0 + 70, T0 + 70, T0 + 71, "error", None, "KeyError"))
    run = _run(_db(tmp_path, tries=tries))
    assert run.merged is not None and run.merged.tries == 125
    assert run.merged.gap == pytest.approx(3600 / report.TIMELINE_BINS)
    assert [r[0] for r in run.latest] == ["bad"]  # one bar per try: the failed only
    fig = _timeline(run)
    fit = next(t for t in fig.data if t.name == "fit")
    assert list(fit.y) == ["w-0", "w-0", "w-1"]
    assert [c[0] for c in fit.customdata] == [60, 5, 60]
    assert list(fit.base) == pytest.approx([0.0, 200.0, 0.0])
    assert list(fit.x) == pytest.approx([60.0, 5.0, 60.0])
    assert [t.name for t in fig.data].count("failed: error") == 1
    title = fig.layout.title.text
    assert "126 tries, merged" in title and "(125 as 3: the count under" in title
    assert fig.layout.barmode == "group"  # a stripe per category: none hides another
    assert "less than 1.8 s apart are one bar" in title and "failed tries a bar each" in title
    assert "a stripe per category" in title
    # at most EACH_TRY_UP_TO tries: one bar per try, as before
    monkeypatch.setattr(report, "EACH_TRY_UP_TO", 126)
    (tmp_path / "each").mkdir()
    run = _run(_db(tmp_path / "each", tries=tries))
    assert run.merged is None and len(run.latest) == 30
    each = _timeline(run)
    assert "(the latest 30 of 126 tries)" in each.layout.title.text
    assert each.layout.barmode == "overlay"  # (a worker's threads side by side overlap)


def test_a_poison_task_s_group_says_the_error_its_client_got(tmp_path: Path) -> None:
    """User audit (failures, 9): the report's "Why tasks failed" said the last try's
    'worker w2 was lost (crash)' for a poison task; it says the task's error, the
    TaskCrashedWorkers its client got, as the dashboard's group does. A group of lost
    tries whose task was retried and finished keeps the loss."""
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    verdict = "TaskCrashedWorkers: task 'segv-0' was running ... 'w2' (crash, 2 times: ...)"
    lost = "worker w2 was lost (crash) with 'segv-0' sent to it"
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO runs (run_id, started) VALUES ('r', 100.0)")
    conn.executemany(
        "INSERT INTO tasks (run_id, key, category, finished, state, tries, error) "
        "VALUES ('r', ?, ?, 110, ?, ?, ?)",
        [("segv-0", "segv", "erred", 3, verdict), ("ok-0", "ok", "memory", 2, None)],
    )
    for key, n, worker, outcome, at in [
        ("segv-0", 1, "w1", "worker-lost", 101.0), ("segv-0", 2, "w2", "worker-lost", 102.0),
        ("segv-0", 3, "w2", "worker-lost", 109.0), ("ok-0", 1, "w1", "worker-lost", 101.0),
        ("ok-0", 2, "w2", "ok", 105.0),
    ]:  # fmt: skip
        message = None if outcome == "ok" else lost.replace("segv-0", key).replace("w2", worker)
        conn.execute(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, ended, outcome, "
            "cause, error_message) VALUES ('r', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, n, key.split("-")[0], worker, at - 1, at, outcome,
             None if outcome == "ok" else "crash", message),
        )  # fmt: skip
    conn.commit()
    conn.close()
    groups = {g[0]: g for g in _run(db, "r").why_failed}
    assert groups["segv"][:7] == ("segv", "crash", "worker-lost", 3, "segv-0", "w2", verdict)
    assert groups["ok"][6] == "worker w1 was lost (crash) with 'ok-0' sent to it"


def _window_and_whole(db: Path, since: float, until: float) -> tuple[_Run, _Run]:
    """The report of the window from ``since`` to ``until`` (Unix seconds), and of the
    whole run ``RUN``."""
    read = open_db(db)
    try:
        return _Run(read, None, lambda line: None, str(since), str(until)), _Run(
            read, RUN, lambda line: None
        )
    finally:
        read.close()


def test_the_worker_time_of_a_window_is_cut_to_it(tmp_path: Path) -> None:
    """The summary's worker time of a window (``--since``/``--until``): a worker of 2
    cores alive from T0 to T0 + 1000 and its tries from 100 to 300 s (ok) and 500 to
    700 s (failed), in the window from 200 to 600 s: 800 core-seconds alive, 200 s
    executing, 100 s of them in the failed try; the whole run: 2,000, 400 and 200."""
    db = _db(tmp_path, tries=[
        ("a-1", 1, "a", "w", T0 + 100, T0 + 100, T0 + 300, "ok", None, None),
        ("b-1", 1, "b", "w", T0 + 500, T0 + 500, T0 + 700, "error", "ValueError", "ValueError"),
    ])  # fmt: skip
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "INSERT INTO workers (run_id, worker, pool, cores, joined, left, cause) "
            "VALUES (?, 'w', 'cpu', 2, ?, ?, 'shutdown')",
            (RUN, T0, T0 + 1000),
        )
    conn.close()
    window, whole = _window_and_whole(db, T0 + 200, T0 + 600)
    cut = window.worker_time["cpu"]
    assert (cut.alive, cut.executing, cut.failed, cut.busy) == (800.0, 200.0, 100.0, 0.25)
    assert window.time_lost == [("error", "failed", 1, 100.0)]
    run = whole.worker_time["cpu"]
    assert (run.alive, run.executing, run.failed) == (2000.0, 400.0, 200.0)


def test_the_tries_not_ended_ok_of_a_window_are_those_in_it(tmp_path: Path) -> None:
    """Review 1207f F3: in a window, "time in tries not ended ok" counted every such try
    of the run (their seconds cut to the window, 0 for those outside it), so it said 2
    failed tries where "failed tries" said 1. It counts the tries that overlap the
    window, as "failed tries" does: failed tries at 110-120 s and 800-810 s, an ok one
    at 820-830 s, the window 100-200 s."""
    db = _db(tmp_path, tries=[
        ("a-1", 1, "a", "w", T0 + 110, T0 + 110, T0 + 120, "error", "ValueError", "ValueError"),
        ("b-1", 1, "b", "w", T0 + 800, T0 + 800, T0 + 810, "error", "ValueError", "ValueError"),
        ("c-1", 1, "c", "w", T0 + 820, T0 + 820, T0 + 830, "ok", None, None),
    ])  # fmt: skip
    window, whole = _window_and_whole(db, T0 + 100, T0 + 200)
    assert window.failures == [("error", "ValueError", 1)]
    assert window.time_lost == [("error", "failed", 1, 10.0)]
    assert whole.time_lost == [("error", "failed", 2, 20.0)]


def _indexes(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        conn.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("indexed", [True, False])
def test_the_lives_named_by_their_blocks_ends_are_those_found_row_by_row(
    tmp_path: Path, indexed: bool
) -> None:
    """Review 1207g F4: the worker lives' ends (a preempted life named by the first end
    or requeue of its block at or after it, when that was an operator's) are read from
    the blocks' ends made once per query, fast on a file without the ``blocks_block``
    index too (one the report only reads): on many random blocks and lives, of this run
    and an older one, each life's end is the one found by walking its block's rows."""
    rng = random.Random(7)
    db = _db(tmp_path)
    conn = sqlite3.connect(db)
    blocks: dict[tuple[str, str], list[tuple[float, str, str | None]]] = defaultdict(list)
    with conn:
        if not indexed:  # a file a writer of this version never opened
            conn.execute("DROP INDEX blocks_block")
        for run in (RUN, "before"):
            for b in range(150):
                t = T0 + rng.uniform(0, 3000)
                for _ in range(rng.randint(1, 6)):
                    state = rng.choice(("pending", "running", "requeued", "cancelled",
                                        "completed", "stopped"))  # fmt: skip
                    cause = None if state in ("pending", "running") else rng.choice(
                        ("preempted", "user", "walltime", None))  # fmt: skip
                    t += rng.choice((0.0, rng.uniform(1, 300)))  # (ties too)
                    blocks[(run, f"b{b}")].append((t, state, cause))
                    conn.execute("INSERT INTO blocks VALUES (?,?,'p',?,?,?)",
                                 (run, f"b{b}", state, t, cause))  # fmt: skip
        lives = []
        for w in range(600):
            run = rng.choice((RUN, "before"))
            block = rng.choice([f"b{rng.randrange(150)}", None])
            joined = T0 + rng.uniform(0, 3000)
            left = rng.choice((None, joined + rng.uniform(0, 600)))
            cause = rng.choice(("preempted", "preempted", "shutdown", None))
            lives.append((run, f"w{w}", block, joined, left, cause))
        conn.executemany(
            "INSERT INTO workers (run_id, worker, pool, block, joined, left, cause) "
            "VALUES (?,?,'p',?,?,?,?)",
            lives,
        )
    conn.close()
    assert ("blocks_block" in _indexes(db)) is indexed

    def end(run: str, block: str | None, left: float | None, cause: str | None) -> Any:
        if cause != "preempted" or left is None:
            return cause
        later = [r for r in blocks.get((run, block or ""), []) if r[2] is not None and r[0] >= left]
        if not later:
            return cause
        first = min(later, key=lambda r: r[0])
        ties = [r for r in later if r[0] == first[0]]
        if len(ties) > 1:  # (which of rows of one time SQLite takes first is its own)
            return "tie"
        _, state, by = first
        return state if state in ("cancelled", "requeued") and by != "preempted" else cause

    expected = sorted(
        (worker, block, joined, left, end(run, block, left, cause))
        for run, worker, block, joined, left, cause in lives
        if run == RUN
    )
    got = sorted((w, b, j, left, how) for w, _, b, j, left, how in _run(db).workers)
    assert [r[:4] for r in got] == [r[:4] for r in expected]
    named = [(g[4], e[4]) for g, e in zip(got, expected, strict=True) if e[4] != "tie"]
    assert all(g == e for g, e in named)
    assert {e for _, e in named} >= {"cancelled", "requeued", "preempted", "shutdown", None}


def test_a_writer_adds_the_blocks_index_to_a_file_without_it(tmp_path: Path) -> None:
    """A file of this schema version made before ``blocks_block`` (an index an older
    Corral neither makes nor needs): the writer that opens it makes the index, and the
    version stays."""
    db = _db(tmp_path)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DROP INDEX blocks_block")
        version = conn.execute("SELECT version FROM schema_version").fetchone()
    conn.close()
    MonitorWriter(db).close()
    assert "blocks_block" in _indexes(db)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchone() == version
    finally:
        conn.close()
