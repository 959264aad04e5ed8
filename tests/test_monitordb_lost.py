"""What tries lost with their worker cost, in the monitoring database and the report:
when each began (as its worker said as it left, or never), what followed it (a free or
charged retry, a move to the fallback pool), and the report's "what preemption cost"."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import (
    GraphSubmitted,
    TaskCheckpointed,
    TasksFinished,
    TasksRunning,
    WorkerJoined,
    WorkerLeaving,
    WorkerLeft,
)
from policies import REGISTRY
from runtime.monitordb import SCHEMA_VERSION, MonitorWriter, open_db
from runtime.report import FAILURES_TITLE, FREE_TITLE, _Run, build_report, list_runs
from tests.helpers import GB, Factory, assigned, make_state, result, specs_for
from tests.test_monitordb import LIMIT, T0, TO_VERSION_7, WALL, _at, _doc_sql, _recorder, _rows
from tests.test_report import _one_run_db

__all__ = ["make_state"]


def _sent(s: Any, cls: type, now: float, **fields: Any) -> dict[str, list[Any]]:
    out = s.handle(cls(stimulus_id=f"{cls.__name__}@{now}", now=now, **fields))
    s.validate()
    return assigned(out)


async def _written(recorder: Any, writer: MonitorWriter) -> None:
    """What the core's feed holds, read by ``recorder`` and written by ``writer``."""
    with anyio.fail_after(LIMIT):
        await recorder.poll()
    writer.close()


@pytest.mark.anyio
async def test_a_lost_try_s_start_and_what_followed_it_are_recorded(
    tmp_path: Path, make_state: Factory
) -> None:
    """Two ``ckpt`` workers preempted at 100 s and 120 s (median life 120 s). ``c1``
    runs ``long`` and holds ``queued``; preempted at T0 + 300, it says it has executed
    ``long`` 140 s and not ``queued``: ``long`` began at T0 + 160 and moves to
    ``owner`` (past the median life), ``queued`` ran 0 s (began as it was lost) and is
    retried free in ``ckpt``, on ``c2``, which vanishes (a crash, nothing said): that
    try's start is not known. Each lost try's row says what followed it."""
    db = tmp_path / "monitoring.db"
    retry = REGISTRY.create("retry", "default", {"fallback": {"ckpt": "owner"}})
    s = make_state(monitor=True, retry=retry, saturation=1.0)
    recorder, writer = _recorder(db, s)
    for w in ("old1", "old2"):
        _at(s, WorkerJoined, T0, worker=w, cores=1, memory=GB, pool="ckpt")
    _at(s, WorkerJoined, T0, worker="c1", cores=2, memory=GB, pool="ckpt")
    _at(s, WorkerJoined, T0, worker="o1", cores=1, memory=GB, pool="owner")
    _at(s, WorkerLeft, T0 + 100, worker="old1", cause="preempted")
    _at(s, WorkerLeft, T0 + 120, worker="old2", cause="preempted")
    specs = specs_for(s, {"long": [], "queued": []}, ["long", "queued"], pool="ckpt")
    sent = _sent(s, GraphSubmitted, T0 + 150, specs=specs, wanted=("long", "queued"))
    assert sent == {"c1": ["long", "queued"]}
    _at(s, WorkerLeaving, T0 + 300, worker="c1", cause="preempted",
        executing=frozenset({"long"}), executed=(("long", 140.0),))  # fmt: skip
    sent = _sent(s, WorkerLeft, T0 + 300, worker="c1", cause="preempted")
    assert sent == {"o1": ["long"]}
    sent = _sent(s, WorkerJoined, T0 + 310, worker="c2", cores=1, memory=GB, pool="ckpt")
    assert sent == {"c2": ["queued"]}
    _at(s, WorkerLeft, T0 + 320, worker="c2", cause="crash")
    _at(s, TasksFinished, T0 + 330, worker="o1", results=(result("long", start=T0 + 310),))
    await _written(recorder, writer)
    rows = _rows(
        db, "SELECT key, try, worker, cause, started, ended, retry, moved_to FROM tries "
        "ORDER BY key, try",
    )  # fmt: skip
    assert rows == [
        ("long", 1, "c1", "preempted", WALL + T0 + 160, WALL + T0 + 300, "free", "owner"),
        ("long", 2, "o1", None, T0 + 310, T0 + 311, None, None),
        ("queued", 1, "c1", "preempted", WALL + T0 + 300, WALL + T0 + 300, "free", None),
        ("queued", 2, "c2", "crash", None, WALL + T0 + 320, "free", None),
    ]


@pytest.mark.anyio
async def test_a_try_s_checkpoint_and_the_work_a_loss_really_cost_are_recorded(
    tmp_path: Path, make_state: Factory
) -> None:
    """A user audit: the database counted checkpointed work as lost and had no trace of
    checkpoints. ``sim`` executes on ``c1`` from T0 + 11, saves checkpoints 1 and 2
    (held by the scheduler) at T0 + 21 and T0 + 31, and is preempted at T0 + 34: 23 s
    run, 3 s of them after checkpoint 2 (20 s of work). Its retry on ``c2`` resumes from
    2, executes from T0 + 40, saves 3 at T0 + 46 (a file on ``c2`` only: 26 s of work)
    and is preempted at T0 + 50, checkpoint 3 lost with it: the newest left is 2, so
    the 10 s since 2 are lost. The third try resumes from 2 again and finishes."""
    db = tmp_path / "monitoring.db"
    s = make_state(monitor=True)
    recorder, writer = _recorder(db, s)
    _at(s, WorkerJoined, T0, worker="c1", cores=1, memory=GB, pool="ckpt")
    specs = specs_for(s, {"sim": []}, ["sim"], pool="ckpt")
    assert _sent(s, GraphSubmitted, T0 + 10, specs=specs, wanted=("sim",)) == {"c1": ["sim"]}
    _at(s, TasksRunning, T0 + 12, worker="c1", started=(("sim", 0, 1.0),))
    for seq, at in ((1, 21), (2, 31)):
        _at(s, TaskCheckpointed, T0 + at, worker="c1", key="sim", seq=seq, nbytes=1, data=b"x")
    _at(s, WorkerLeft, T0 + 34, worker="c1", cause="preempted")
    sent = _sent(s, WorkerJoined, T0 + 40, worker="c2", cores=1, memory=GB, pool="ckpt")
    assert sent == {"c2": ["sim"]}
    _at(s, TasksRunning, T0 + 41, worker="c2", started=(("sim", 0, 1.0),))
    _at(s, TaskCheckpointed, T0 + 46, worker="c2", key="sim", seq=3, nbytes=9)
    _at(s, WorkerLeft, T0 + 50, worker="c2", cause="preempted")
    sent = _sent(s, WorkerJoined, T0 + 55, worker="c3", cores=1, memory=GB, pool="ckpt")
    assert sent == {"c3": ["sim"]}
    _at(s, TasksFinished, T0 + 70, worker="c3", results=(result("sim", start=T0 + 56),))
    await _written(recorder, writer)
    rows = _rows(
        db, "SELECT try, worker, cause, started - ?1, ended - ?1, resumed, resumed_work, "
        "unsaved FROM tries ORDER BY try", WALL + T0,
    )  # fmt: skip
    assert rows == [
        (1, "c1", "preempted", 11.0, 34.0, None, None, 3.0),
        (2, "c2", "preempted", 40.0, 50.0, 2, 20.0, 10.0),
        (3, "c3", None, 56.0 - WALL, 57.0 - WALL, 2, 20.0, None),  # (the worker's clock)
    ]
    assert _rows(
        db, "SELECT time - ?, key, seq, event, worker, work FROM checkpoints ORDER BY rowid",
        WALL + T0,
    ) == [
        (21.0, "sim", 1, "saved", "c1", 10.0),
        (31.0, "sim", 2, "saved", "c1", 20.0),
        (46.0, "sim", 3, "saved", "c2", 26.0),
        (50.0, "sim", 3, "lost", "c2", 26.0),
    ]  # fmt: skip
    cost = _rows(db, _DOCUMENTED_NET_COST)
    assert cost == [("preempted", 2, 33.0, 13.0, 1)]  # (try 2's checkpoint 3 was lost)


#: docs/monitoring.md's query "what did preemption cost, net of checkpoints", kept to
#: the latest run as the doc says
_DOCUMENTED_NET_COST = """
SELECT cause, count(*) AS tries_lost,
       round(sum(ended - started), 1) AS work_lost_s,
       round(sum(COALESCE(unsaved, ended - started)), 1) AS net_of_checkpoints_s,
       sum(unsaved < ended - started) AS tries_a_checkpoint_saved
FROM tries
WHERE outcome = 'worker-lost' AND cause IN ('preempted', 'walltime')
  AND run_id = (SELECT run_id FROM runs ORDER BY started DESC LIMIT 1)
GROUP BY cause
"""


def test_the_report_says_what_preemption_cost(tmp_path: Path) -> None:
    """Tries lost to preemption and the walltime: how many, the seconds they had run
    (those with a start), free and charged retries, tries not retried, and the tasks
    moved to the fallback pool, by the pool they left."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 600.0)
    with conn:
        conn.executemany(
            "INSERT INTO workers (run_id, worker, pool, joined) VALUES ('run-1', ?, ?, ?)",
            [("ckpt-1", "ckpt", t0), ("ckpt-2", "ckpt", t0), ("owner-1", "owner", t0)],
        )
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome, cause, retry, moved_to) VALUES ('run-1',?,?,?,?,?,?,?,?,?,?,?)",
            [("deep-0", 1, "deep", "ckpt-1", t0, t0 + 1, t0 + 23, "worker-lost",
              "preempted", "free", "owner"),
             ("deep-0", 2, "deep", "owner-1", t0 + 24, t0 + 24, t0 + 70, "ok", None, None,
              None),
             ("img-1", 1, "img", "ckpt-2", t0, t0 + 20, t0 + 30, "worker-lost", "preempted",
              "charged", None),
             ("img-2", 1, "img", "ckpt-2", t0, None, t0 + 30, "worker-lost", "preempted",
              "free", None),
             ("mosaic", 1, "mosaic", "ckpt-1", t0, t0 + 5, t0 + 156, "worker-lost",
              "walltime", "free", "owner"),
             ("mosaic", 2, "mosaic", "owner-1", t0 + 160, t0 + 160, t0 + 330, "ok", None,
              None, None),
             ("img-3", 1, "img", "ckpt-2", t0, t0 + 2, t0 + 4, "worker-lost", "crash", None,
              None)],
        )  # fmt: skip
    conn.close()
    page = build_report(db)
    assert (
        "4 tries lost, 183.0 s of work lost, 183.0 s net of checkpoints (1 with no start "
        "recorded: not counted), 3 free retries, 1 charged, 0 not retried, 2 tasks moved "
        "ckpt-&gt;owner 2; checkpoints: 0 saved, 0 tries resumed from one, 0 lost"
    ) in page
    lost = page[page.index("tries lost with their worker: cause") :]
    assert "<td>preempted</td><td>3</td><td>32.0</td><td>1</td><td>2</td><td>1</td>" in lost
    assert "<td>walltime</td><td>1</td><td>151.0</td><td>0</td><td>1</td><td>0</td>" in lost
    assert "<td>crash</td><td>1</td><td>2.0</td><td>0</td><td>0</td><td>0</td><td>1</td>" in lost
    moved = page[page.index("tasks moved to another pool") :]
    assert "<td>ckpt</td><td>owner</td><td>2</td><td>2</td>" in moved


def test_the_report_gives_the_work_preemption_lost_net_of_checkpoints(tmp_path: Path) -> None:
    """A user audit: "4 tries lost, 107.1 s of work lost" though the tries resumed from
    checkpoints saved just before. ``sim-0`` preempted after 22 s, 2 s past its latest
    checkpoint, resumed from it; ``sim-1`` after 30 s with checkpoint 5 lost (10 s
    past the one it resumed from); ``long`` (no checkpoint) after 31 s; a walltime loss
    with nothing recorded of it (an older Corral: all it ran counts)."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 600.0)
    with conn:
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome, cause, retry, resumed, resumed_work, unsaved) "
            "VALUES ('run-1',?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [("sim-0", 1, "sim", "ckpt-1", t0, t0, t0 + 22, "worker-lost", "preempted",
              "free", None, None, 2.0),
             ("sim-0", 2, "sim", "ckpt-2", t0 + 23, t0 + 23, t0 + 40, "ok", None, None, 10,
              20.0, None),
             ("sim-1", 1, "sim", "ckpt-2", t0, t0, t0 + 30, "worker-lost", "preempted",
              "free", None, None, 10.0),
             ("sim-1", 2, "sim", "ckpt-3", t0 + 31, t0 + 31, t0 + 50, "ok", None, None, 4,
              20.0, None),
             ("long", 1, "long", "ckpt-1", t0, t0, t0 + 31, "worker-lost", "preempted",
              "free", None, None, 31.0),
             ("old", 1, "old", "ckpt-1", t0, t0, t0 + 5, "worker-lost", "walltime",
              "free", None, None, None)],
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO checkpoints VALUES ('run-1', ?, ?, ?, ?, ?, ?)",
            [(t0 + 20, "sim-0", 10, "saved", "ckpt-1", 20.0),
             (t0 + 20, "sim-1", 4, "saved", "ckpt-2", 20.0),
             (t0 + 29, "sim-1", 5, "saved", "ckpt-2", 29.0),
             (t0 + 30, "sim-1", 5, "lost", "ckpt-2", 29.0)],
        )  # fmt: skip
    conn.close()
    assert (
        "4 tries lost, 88.0 s of work lost, 48.0 s net of checkpoints, 4 free retries, 0 "
        "charged, 0 not retried, 0 tasks moved; checkpoints: 3 saved, 2 tries resumed from "
        "one, 1 lost; finished outputs lost with a worker and made again: 0, 0.0 s run again"
    ) in build_report(db)
    # The tasks that saved none ran again from the start: the report says how to resume
    # (a user audit: a preempted sweep's trials re-ran whole, and nothing said why).
    assert (
        "tasks that saved no checkpoint ran again from the start: long: 1 try, 31.0 s; old: "
        "1 try, 5.0 s. A task that saves its progress with checkpoint(obj) or "
        "checkpoint_file(path) and reads it back with restore() or restore_path() resumes "
        "from it after a preemption (docs/files.md#checkpoints)"
    ) in build_report(db, text=True)


def test_the_preemption_cost_counts_the_finished_outputs_made_again(tmp_path: Path) -> None:
    """A user audit (slurmscale F1): 110 s of finished tasks ran again after their
    outputs went with preempted blocks, and "what preemption cost" left it out. Each
    output made again counts the ok try that made it again (its first after the
    recovery), not the one before it; a replica's recovery runs nothing."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 600.0)
    with conn:
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome) VALUES ('run-1',?,?,?,?,?,?,?,?)",
            [("sim-0", 1, "sim", "scav-1", t0, t0, t0 + 40, "ok"),
             ("sim-0", 2, "sim", "scav-2", t0 + 59, t0 + 59.2, t0 + 99.2, "ok"),
             ("sim-1", 1, "sim", "scav-1", t0, t0, t0 + 30, "ok"),
             ("sim-1", 2, "sim", "scav-2", t0 + 59, None, t0 + 89, "ok"),
             ("sim-2", 1, "sim", "scav-1", t0, t0, t0 + 20, "ok")],
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO recoveries VALUES ('run-1', ?, ?, 'sim', 'scav-3', ?)",
            [(t0 + 56, "sim-0", "recomputed"), (t0 + 56, "sim-1", "recomputed"),
             (t0 + 56, "sim-2", "replica")],
        )  # fmt: skip
    conn.close()
    assert "finished outputs lost with a worker and made again: 2, 70.0 s run again" in (
        build_report(db)
    )
    assert "saved no checkpoint" not in build_report(db)  # no try lost: nothing to say


def test_the_preemption_cost_counts_the_copies_off_leaving_and_drained_workers(
    tmp_path: Path,
) -> None:
    """A user audit (astro): short-lived blocks (``tasks_per_worker = 10``) passed a
    fan-in's 200 inputs on, block after block, 1,666 copies in all, which no line of
    the report showed. ``cat-0`` hops three times (two drains, one preemption), ``cat-1``
    once; a task's fetch of it is not such a copy."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 600.0)
    with conn:
        conn.executemany(
            "INSERT INTO transfers (run_id, time, key, kind, bytes, source, target, "
            "duration) VALUES ('run-1',?,?,?,?,?,?,0.1)",
            [(t0 + 10, "cat-0", "evacuation", 2**20, "ckpt-1", "ckpt-2"),
             (t0 + 20, "cat-0", "evacuation", 2**20, "ckpt-2", "ckpt-3"),
             (t0 + 30, "cat-0", "evacuation", 2**20, "ckpt-3", "ckpt-4"),
             (t0 + 30, "cat-1", "evacuation", 2**19, "ckpt-3", "ckpt-4"),
             (t0 + 40, "cat-0", "fetch", 2**20, "ckpt-4", "ckpt-5")],
        )  # fmt: skip
    conn.close()
    assert (
        "outputs copied off workers that left or drained: 4 copies of 2 outputs, 3.50 MiB"
    ) in build_report(db)


@pytest.mark.parametrize("version", [6, 7])
def test_an_older_file_gets_the_retry_and_checkpoint_columns_and_is_still_read(
    tmp_path: Path, version: int
) -> None:
    """A file of schema version 7 (no ``tries.resumed``, ``resumed_work``, ``unsaved``,
    no ``checkpoints``) or 6 (no ``tries.retry``, ``moved_to`` either): the report
    reads it, saying it does not record checkpoints (nor retries, in version 6); a
    manager writing into it adds them, empty in the rows it had."""
    db = tmp_path / "monitoring.db"
    MonitorWriter(db).close()
    conn = sqlite3.connect(db)
    older = "" if version == 7 else (
        "ALTER TABLE tries DROP COLUMN retry; ALTER TABLE tries DROP COLUMN moved_to; "
        "UPDATE schema_version SET version = 6; "
    )  # fmt: skip
    conn.executescript(
        TO_VERSION_7 + older + "INSERT INTO runs (run_id, started, ended) "
        "VALUES ('r', 100.0, 110.0); INSERT INTO tries (run_id, key, try, worker, sent, "
        "started, ended, outcome, cause) "
        "VALUES ('r', 'a', 1, 'w1', 101.0, 101.0, 104.0, 'worker-lost', 'preempted');"
    )
    conn.close()
    page = build_report(db, run_id="r")
    assert "this file does not record checkpoints (schema version 7" in page
    assert ("does not record retries or moves" in page) == (version == 6)
    MonitorWriter(db).close()
    assert _rows(db, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _rows(db, "SELECT key, retry, moved_to, resumed, resumed_work, unsaved FROM tries") == [
        ("a", None, None, None, None, None)
    ]
    assert _rows(db, "SELECT count(*) FROM checkpoints") == [(0,)]
    assert "1 tries lost, 3.0 s of work lost, 3.0 s net of checkpoints" in build_report(
        db, run_id="r"
    )


def _preempted_run(db: Path, version_6: bool = False) -> None:
    """One run: ``deep-0`` and ``deep-1`` preempted on ``ckpt-1`` and retried free,
    then finished; ``img-1`` preempted and retried charged (as a policy with
    ``charge_lost`` does); ``img-2`` preempted too often, not retried: it failed. In a
    file of schema version 6 (``version_6``), without the ``retry`` column."""
    conn, t0 = _one_run_db(db, 600.0)
    if version_6:
        conn.executescript(
            TO_VERSION_7 + "ALTER TABLE tries DROP COLUMN retry; "
            "ALTER TABLE tries DROP COLUMN moved_to; UPDATE schema_version SET version = 6;"
        )
    rows = [
        ("deep-0", 1, "deep", "ckpt-1", t0, t0 + 1, t0 + 23, "worker-lost", "preempted", "free"),
        ("deep-0", 2, "deep", "ckpt-2", t0 + 24, t0 + 24, t0 + 70, "ok", None, None),
        ("deep-1", 1, "deep", "ckpt-1", t0, t0 + 1, t0 + 23.5, "worker-lost", "preempted", "free"),
        ("deep-1", 2, "deep", "ckpt-2", t0 + 24, t0 + 24, t0 + 80, "ok", None, None),
        ("img-1", 1, "img", "ckpt-1", t0, t0 + 1, t0 + 23, "worker-lost", "preempted", "charged"),
        ("img-1", 2, "img", "ckpt-2", t0 + 24, t0 + 24, t0 + 30, "ok", None, None),
        ("img-2", 1, "img", "ckpt-1", t0, t0 + 1, t0 + 23, "worker-lost", "preempted", None),
    ]
    with conn:
        conn.executemany(
            "INSERT INTO tasks (run_id, key, category, state) VALUES ('run-1', ?, ?, ?)",
            [("deep-0", "deep", "memory"), ("deep-1", "deep", "released"),
             ("img-1", "img", "memory"), ("img-2", "img", "erred")],
        )  # fmt: skip
        columns = "key, try, category, worker, sent, started, ended, outcome, cause"
        if version_6:
            conn.executemany(
                f"INSERT INTO tries (run_id, {columns}) VALUES ('run-1',?,?,?,?,?,?,?,?,?)",
                [r[:-1] for r in rows],
            )
        else:
            conn.executemany(
                f"INSERT INTO tries (run_id, {columns}, retry) VALUES "
                "('run-1',?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
    conn.close()


@pytest.mark.parametrize("version_6", [False, True], ids=["retries-recorded", "version-6"])
def test_free_retries_after_a_preemption_are_not_failures(tmp_path: Path, version_6: bool) -> None:
    """The tries preempted and retried free are in their own section and summary table,
    not under "Why tasks failed" nor counted as failed tries (in a version 6 file: a
    preempted try that another try of its task followed); a lost try that was charged,
    or after which the task failed, stays among the failures."""
    db = tmp_path / "monitoring.db"
    _preempted_run(db, version_6)
    conn = open_db(db)
    try:
        run = _Run(conn, None, lambda line: None)
    finally:
        conn.close()
    # (a version 6 file does not say img-1's retry was charged: it counts as free)
    charged = 0 if version_6 else 1
    assert run.free_lost == [("preempted", 3 - charged)]
    assert run.failures == [("worker-lost", "preempted", 1 + charged)]
    assert [(g[0], g[1], g[3]) for g in run.why_failed] == [("img", "preempted", 1 + charged)]
    assert ("deep", "preempted", 2, 2, 2, "deep-1", "ckpt-1") in run.why_free
    page = build_report(db)
    failed = page[page.index(f"<h2>{FAILURES_TITLE}") : page.index(f"<h2>{FREE_TITLE}")]
    assert "data-category='deep'" not in failed and "data-category='img'" in failed
    free = page[page.index(f"<h2>{FREE_TITLE}") :]
    assert "<td class=count>2 x</td><td>deep</td><td>preempted</td><td>2</td><td>2</td>" in free
    (listed,) = list_runs(db)
    assert listed.failed_tries == 1 + charged


def test_the_documented_failures_by_cause_add_up_to_the_report_s_failed_tries(
    tmp_path: Path,
) -> None:
    """A user audit (analyst, 3): docs/monitoring.md's "Failures by cause" counted the
    tries preempted and retried free (and the cancelled ones) as failures: 19 failed
    tries where the report and ``report --list`` said 17. Now its rows (but the tasks
    not run) add up to the report's failed tries: here the charged and the final
    preempted tries, and one error; not the two free retries nor a cancelled try."""
    db = tmp_path / "monitoring.db"
    _preempted_run(db)
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome, cause, error_type) VALUES ('run-1', ?, 1, ?, 'ckpt-2', 1, 2, 3, ?, ?, ?)",
            [("bad-0", "bad", "error", "ValueError", "ValueError"),
             ("slow-0", "slow", "cancelled", "cancelled", None)],
        )  # fmt: skip
    conn.close()
    why = _rows(db, _doc_sql("Failures by cause"))
    failed = [("bad", "error", "ValueError", 1), ("img", "worker-lost", "preempted", 2)]
    assert sorted(why) == failed
    (listed,) = list_runs(db)
    assert listed.failed_tries == 3 == sum(n for *_, n in why)
    read = open_db(db)
    try:
        run = _Run(read, None, lambda line: None)
    finally:
        read.close()
    assert sum(n for *_, n in run.failures) == 3  # (the cancelled try not counted)


def test_a_try_lost_to_a_crash_and_retried_free_is_not_denied_in_the_free_section(
    tmp_path: Path,
) -> None:
    """A user audit: the report said "crash | 1 | ... | free retries 1" in its table of
    lost tries and, further down, "No try was lost with its worker and retried free."
    A crash is a suspect, so its free retry is under "Why tasks failed", not in the
    section of free retries; that section now says which losses it counts, and where
    the suspects retried free are."""
    db = tmp_path / "monitoring.db"
    conn, t0 = _one_run_db(db, 100.0)
    with conn:
        conn.execute(
            "INSERT INTO tasks (run_id, key, category, state) VALUES ('run-1', 'long-0', "
            "'long', 'memory')"
        )
        conn.executemany(
            "INSERT INTO tries (run_id, key, try, category, worker, sent, started, ended, "
            "outcome, cause, retry) VALUES ('run-1', 'long-0', ?, 'long', ?, ?, ?, ?, ?, ?, ?)",
            [(1, "w2", t0, t0 + 1, t0 + 6, "worker-lost", "crash", "free"),
             (2, "w1", t0 + 7, t0 + 7, t0 + 52, "ok", None, None)],
        )  # fmt: skip
    conn.close()
    page = build_report(db)
    assert ">crash</td><td>1</td><td>5.0</td><td>0</td><td>1</td>" in page  # free retries 1
    free = page[page.index(f"<h2>{FREE_TITLE}") :]
    free = free[: free.index("<h2>", 4)]
    assert "No try was lost with its worker and retried free." not in free
    assert "No try was lost with its worker for a reason that says nothing of the task" in free
    assert f"retried free too (crash: 1), are suspects: they are under {FAILURES_TITLE}" in free
    failed = page[page.index(f"<h2>{FAILURES_TITLE}") : page.index(f"<h2>{FREE_TITLE}")]
    assert "data-category='long' data-cause='crash'" in failed
