"""The demo's closing summary (``runtime.demo.render_summary``): its cluster line counts
in words (``2 in-process workers x 1 thread``, not ``2 worker (in-process) x 1
thread(s)``), and its last line says what to do next: the same on worker processes,
then across machines (the real flags, docs/deployment.md). Its run directories: the
newest ``--keep-runs`` of the demo's own are kept, never a manager's."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import dask
import pytest
from rich.console import Console

from runtime.__main__ import build_parser
from runtime.demo import (
    NEXT_ACROSS_MACHINES,
    NEXT_STEP,
    DemoConfig,
    DemoRun,
    build_graph,
    category_totals,
    cluster_text,
    prune_demo_runs,
    render_summary,
)
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("workers", "threads", "processes", "says"),
    [
        (2, 1, False, "2 in-process workers x 1 thread"),
        (1, 2, False, "1 in-process worker x 2 threads"),
        (4, 1, True, "4 worker processes x 1 thread"),
        (1, 3, True, "1 worker process x 3 threads"),
    ],
)
def test_the_cluster_is_counted_in_words(
    workers: int, threads: int, processes: bool, says: str
) -> None:
    assert cluster_text(workers, threads, processes) == says


def test_the_summary_ends_with_what_to_do_next() -> None:
    cfg = DemoConfig(datasets=1, chunks=2, events=200)
    graph, final = build_graph(cfg)
    result = dask.get(graph, final)
    run = DemoRun(
        config=cfg, graph=graph, final=final, result=result, status={},
        totals=category_totals(graph), workers=2, threads=1, startup=0.1, wall=0.5,
    )  # fmt: skip
    out = io.StringIO()
    render_summary(run, Console(file=out, width=300, color_system=None))
    text = out.getvalue()
    assert "2 in-process workers x 1 thread, started in 100 ms" in text, text
    assert "thread(s)" not in text and "worker (in-process)" not in text, text
    assert text.strip().splitlines()[-1] == NEXT_STEP, text


def test_a_run_on_worker_processes_is_not_told_to_run_on_worker_processes() -> None:
    """After ``--workers 4`` the last line goes on to machines; it used to say "next: the
    demo on worker processes: python -m runtime --workers 4", what had just run."""
    cfg = DemoConfig(datasets=1, chunks=2, events=200)
    graph, final = build_graph(cfg)
    run = DemoRun(
        config=cfg, graph=graph, final=final, result=dask.get(graph, final), status={},
        totals=category_totals(graph), workers=4, threads=1, startup=0.1, wall=0.5,
        processes=True,
    )  # fmt: skip
    out = io.StringIO()
    render_summary(run, Console(file=out, width=300, color_system=None))
    text = out.getvalue()
    assert "4 worker processes x 1 thread" in text, text
    last = text.strip().splitlines()[-1]
    assert last == "next: " + NEXT_ACROSS_MACHINES, last
    assert "--workers" not in last and "manager --listen 0.0.0.0:8786" in last, last


def test_the_next_step_names_flags_the_command_line_takes() -> None:
    """--workers of the demo, --listen of the manager, a worker's ADDRESS and the
    --token-file it needs on another machine (no token file of the manager's there): all
    real."""
    parser = build_parser()
    assert parser.parse_args(["demo", "--workers", "4"]).workers == 4
    assert parser.parse_args(["manager", "--listen", "0.0.0.0:8786"]).listen == "0.0.0.0:8786"
    worker = "worker ws://HOST:8786 --token-file ~/.corral/worker.token"
    args = parser.parse_args(worker.split())
    assert (args.address, args.token_file) == ("ws://HOST:8786", "~/.corral/worker.token")
    for words in ("python -m runtime --workers 4", "manager --listen 0.0.0.0:8786",
                  worker, "docs/deployment.md"):  # fmt: skip
        assert words in NEXT_STEP, words


#: the date of the run directories a test makes itself, before any real run's
SEEDED = "20000101-"


def _run_dir(runs: Path, name: str, *files: str) -> Path:
    path = runs / name
    path.mkdir(parents=True)
    for f in files:
        (path / f).write_bytes(b"x")
    return path


def _demo(runs: Path, *flags: str) -> str:
    """``python -m runtime`` (a small demo) with its run directories under ``runs``;
    its standard output, once it ended with status 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(runs.parent / "home"), CORRAL_RUNS_DIR=str(runs))
    env.update(PYTHONPATH=str(ROOT), COLUMNS="300")
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "--datasets", "1", "--chunks", "2", "--events",
         "200", "--no-progress", *flags],
        env=env, capture_output=True, text=True, timeout=50, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_demo_runs_are_pruned_to_the_newest_keeping_every_other_run(tmp_path: Path) -> None:
    """Each demo run left a new run directory under ~/.corral/runs: ten runs, ten. Now
    a demo's run directory is named ``...-demo`` and, after a run, the oldest of those
    go so that the newest ``--keep-runs`` (this one among them) remain, with a line
    saying so; a manager's run, a demo run holding a file of the user's, and a symlink
    stay."""
    runs = tmp_path / "runs"
    manager_run = _run_dir(runs, "20000101-000000-abcdef", "monitoring.db")
    annotated = _run_dir(runs, "20000101-000001-abcdef-demo", "monitoring.db", "notes.txt")
    old = [_run_dir(runs, f"20000101-00000{i}-abcdef-demo", "monitoring.db", "monitoring.db-wal")
           for i in (2, 3)]  # fmt: skip
    (runs / "20000101-000004-abcdef-demo").symlink_to(manager_run)
    out = _demo(runs, "--keep-runs", "2")
    assert f"demo runs: removed 1 older, keeping the newest 2 in {runs} (--keep-runs N; 0 " in out
    first = sorted(p.name for p in runs.iterdir() if not p.name.startswith(SEEDED))
    assert not old[0].exists() and old[1].exists(), sorted(os.listdir(runs))
    assert len(first) == 1 and first[0].endswith("-demo"), first
    assert f"monitoring database: {runs / first[0] / 'monitoring.db'}" in out, out

    out = _demo(runs, "--keep-runs", "2")
    assert "demo runs: removed 1 older, keeping the newest 2" in out, out
    mine = sorted(p.name for p in runs.iterdir() if not p.name.startswith(SEEDED))
    assert len(mine) == 2 and mine[0] == first[0], mine  # the newest two: both real runs
    assert not old[1].exists()
    assert (manager_run / "monitoring.db").exists() and (annotated / "notes.txt").exists()
    assert (runs / "20000101-000004-abcdef-demo").is_symlink()

    out = _demo(runs, "--keep-runs", "0")  # 0: keep all, and no line about it
    assert "demo runs:" not in out, out
    assert len([p for p in runs.iterdir() if not p.name.startswith(SEEDED)]) == 3


def test_pruning_counts_only_the_demo_s_own_directories(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    current = _run_dir(runs, "20261206-120000-000000-demo", "monitoring.db")
    older = [_run_dir(runs, f"20261206-11000{i}-00000{i}-demo", "monitoring.db") for i in range(3)]
    _run_dir(runs, "20261206-100000-abcdef", "monitoring.db")  # a manager's
    _run_dir(runs, "20261206-090000-abcdef-demo", "monitoring.db", "report.html")
    (runs / "notes-demo").mkdir()
    assert prune_demo_runs(current / "monitoring.db", 3) == older[:1]
    assert prune_demo_runs(current / "monitoring.db", 3) == []
    assert prune_demo_runs(current / "monitoring.db", 1) == older[1:]
    assert sorted(p.name for p in runs.iterdir()) == [
        "20261206-090000-abcdef-demo", "20261206-100000-abcdef",
        "20261206-120000-000000-demo", "notes-demo",
    ]  # fmt: skip
