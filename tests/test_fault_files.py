"""Fault injection on worker processes (issue 13's must-show, the real-process version of
the core's in tests/test_replicas.py): 20 homogeneous subgraphs (load -> skim -> merge
of 5 files each, 100 files) on three worker processes, two of them killed with SIGKILL
at random points (after a random number of skims, a random victim) under three seeds;
with Python outputs, and with file outputs (the loads and skims write real files in their
workers' sandboxes, a few KiB each, and each merge reads its inputs' files and returns
the sha256 of their bytes).

Every run completes with the right sums; each lost output is made again at most once
per loss (the monitoring database's ``recoveries``: one row per output and loss; its
``tries``: no task ends ok more often than once plus once per loss); no recovery loop
(the tries of the run are bounded by the graph plus what the losses could need). Once
every output is released, no file is left in a surviving worker's sandbox, and no
sandbox is left at all once the cluster stops: the killed workers' (which nothing
stops cleanly) are removed by the workers that replace them."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import anyio
import pytest

from tests.helpers import load_bench

LIMIT = 150
KILLS = 2


@pytest.mark.timeout(180)  # a backstop: the run is bounded by LIMIT
@pytest.mark.anyio
@pytest.mark.parametrize("file_outputs", [False, True], ids=["values", "files"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_kill_9_at_random_points_completes_and_recomputes_once_per_loss(
    tmp_path: Path, seed: int, file_outputs: bool
) -> None:
    bench = load_bench("files")
    nbytes = 8 * 1024 if file_outputs else 32 * 1024  # files: 8 KiB loads, ~2 KiB skims
    wf = bench.Workflow(datasets=20, files=5, seed=seed, load_s=0.04, skim_s=0.01,
                        nbytes=nbytes, file_outputs=file_outputs)  # fmt: skip
    rng = random.Random(seed)
    points = sorted(rng.sample(range(wf.n_files // 5, wf.n_files * 4 // 5), KILLS))
    db = tmp_path / "monitoring.db"
    with anyio.fail_after(LIMIT):
        res = await bench.run_workflow(
            wf, workers=3, monitoring=db, kill_after=points, kill_seed=rng.randrange(1 << 30)
        )
    assert res.correct  # with files: each merge's sha256 of its inputs' bytes
    if file_outputs:
        assert all(isinstance(v, str) for v in wf.expected().values())
    killed = res.killed.split(",")
    assert len(killed) == KILLS
    conn = sqlite3.connect(db)
    try:
        # (the workers stopped with the cluster at the end leave too: not counted here)
        per_loss = [
            row
            for row in conn.execute(
                "SELECT key, worker, count(*) FROM recoveries GROUP BY key, worker"
            )
            if row[1] in killed
        ]
        ok = dict(conn.execute("SELECT key, count(*) FROM tries WHERE outcome = 'ok' GROUP BY key"))
        too_many = _too_many_ok(conn, ok)
        tries = conn.execute("SELECT count(*) FROM tries").fetchone()[0]
        fetches = conn.execute(
            "SELECT count(*), count(source), count(duration), min(bytes) FROM transfers "
            "WHERE kind = 'fetch'"
        ).fetchone()
    finally:
        conn.close()
    assert all(n == 1 for _, _, n in per_loss)  # one recovery per output and loss
    n_tasks = 2 * wf.n_files + wf.datasets
    assert len(ok) == n_tasks  # every task ended ok at least once
    assert not too_many, too_many  # at most once more per loss (what happened, if not)
    # No loop: the graph's tries, plus the tries the losses cut and the work they undid.
    assert tries <= n_tasks * (1 + KILLS) + 3 * KILLS
    assert sum(res.recoveries.values()) == len(per_loss)
    # Merges read skims from other workers: each copy recorded with its peer and time.
    n, sources, durations, smallest = fetches
    assert n > 0 and sources == durations == n and smallest > 0
    # Released, nothing stays on the surviving workers' disks; what a SIGKILL leaves
    # behind (the killed workers' sandboxes) was swept by their replacements.
    assert res.left == []
    assert res.stale_sandboxes == 0


def _too_many_ok(conn: sqlite3.Connection, ok: dict[str, int]) -> str:
    """The story, from the monitoring database, of every task that ended ok more than
    once plus once per loss: its tries, the recoveries of its dataset's outputs and
    the workers' comings and goings, so a failure says why it ran again."""
    lines = []
    for key, n in sorted(ok.items()):
        if n <= 1 + KILLS:
            continue
        dataset = key.split("-")[1]
        lines.append(f"{key}: {n} ok tries")
        lines.extend(
            f"  try {row}"
            for row in conn.execute(
                "SELECT try, worker, sent, started, ended, outcome, cause, error_type, "
                "error_message FROM tries WHERE key = ? ORDER BY try",
                (key,),
            )
        )
        lines.extend(
            f"  recovery {row}"
            for row in conn.execute(
                "SELECT time, key, worker, how FROM recoveries WHERE key IN (?, ?) "
                "OR key LIKE ? OR key LIKE ? ORDER BY time",
                (key, f"merge-{dataset}", f"skim-{dataset}-%", f"load-{dataset}-%"),
            )
        )
    if lines:
        lines.extend(
            f"  worker {row}"
            for row in conn.execute("SELECT worker, joined, left, cause, joins FROM workers")
        )
    return "\n".join(lines)
