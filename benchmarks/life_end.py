"""The report's worker lives (``runtime.report._LIFE_END``, each preempted life named by
its block's end) on a file of many block rows and preempted lives: seconds, and the
query plan, with and without the ``blocks_block`` index, against the query before
(each life's end read from ``blocks`` through ``blocks_time``).

    python benchmarks/life_end.py --blocks 20000 --lives 5000 [--old]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import time

from runtime.monitordb import SCHEMA
from runtime.report import _BLOCK_ENDS, _LIFE_END

#: the query before review 1207g F4: each life's end read from ``blocks``
OLD = _LIFE_END.replace("FROM ends b", "FROM blocks b").replace(
    "b.block = w.block AND", "b.block = w.block AND b.cause IS NOT NULL AND"
)


def build(blocks: int, lives: int, index: bool) -> sqlite3.Connection:
    """``blocks`` blocks of 5 state rows each over a 10 h run, ``lives`` preempted lives
    that ended in its first 20 minutes (the worst case: every later row is after them)."""
    rng = random.Random(1)
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA if index else SCHEMA.replace("blocks_block", "unused"))
    if not index:
        conn.execute("DROP INDEX unused")
    rows = []
    for b in range(blocks):
        t0 = rng.uniform(0, 36000)
        for i, st in enumerate(("pending", "running", "requeued", "running", "cancelled")):
            cause = None if st in ("pending", "running") else rng.choice(("preempted", "user"))
            rows.append(("r", f"b{b}", "p", st, t0 + i * 60, cause))
    conn.executemany("INSERT INTO blocks VALUES (?,?,?,?,?,?)", rows)
    conn.executemany(
        'INSERT INTO workers (run_id, worker, pool, block, joined, "left", cause) '
        "VALUES ('r', ?, 'p', ?, ?, ?, 'preempted')",
        [(f"w{w}", f"b{rng.randrange(blocks)}", 10.0 * w / lives, 100.0 + 1000 * w / lives)
         for w in range(lives)],
    )  # fmt: skip
    return conn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=20000)
    ap.add_argument("--lives", type=int, default=5000)
    ap.add_argument("--old", action="store_true", help="also the query before (slow)")
    a = ap.parse_args()
    for index in (True, False):
        conn = build(a.blocks, a.lives, index)
        queries = [("now", _BLOCK_ENDS, _LIFE_END)] + ([("before", "", OLD)] if a.old else [])
        for name, with_, end in queries:
            sql = f"{with_}SELECT worker, {end} FROM workers w WHERE run_id = 'r' ORDER BY worker"
            t = time.perf_counter()
            out = conn.execute(sql).fetchall()
            took = time.perf_counter() - t
            plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
            ends = sorted({r[1] for r in out})
            print(f"index {index!s:5} {name:6}: {took:7.2f} s, {len(out)} lives, ends {ends}")
            print(f"  plan: {plan}")


if __name__ == "__main__":
    main()
