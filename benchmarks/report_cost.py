"""What ``python -m runtime report`` costs on the database of a long-running manager.

The longrun audit (defect 7) saw 17.4 s, 153 MB and 7.1 MB of HTML for 33,574 tasks, and
12 s for ``report --list``, on a loaded machine. This makes a database of that shape, of
``--tasks`` tasks, through Corral's own writer (:class:`runtime.monitordb.MonitorWriter`
and the recorder's statements: the rows a manager writes), then times, in fresh
processes, ``report DB -o OUT`` (wall, max RSS, bytes written, of which the inlined
plotly.js) and ``report DB --list`` (wall, and whether plotly was imported), for each
tree given (``--tree``, ``PYTHONPATH`` of the run: the old tree beside this one),
interleaved, ``--repeat`` times::

    git archive main | tar -x -C /tmp/old-report
    python benchmarks/report_cost.py --tree /tmp/old-report --tree . --repeat 3

The database: batches of a calibration graph as the audit's client submitted
(``load -> bias -> flat -> check`` per frame, one ``stats`` per 50 frames; one frame in
97 raises ``ValueError``, its dependents erred without running), a pause of 2 to 20 s
after each, on four workers (threads, ``--cores 2``);
the samples a manager writes every 2 s (queue depth and oldest wait per pool, worker
RSS and disk), transfers between workers, and two alerts that fired and resolved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.monitordb import (  # noqa: E402
    _ALERT,
    _METRIC,
    _RESOURCE,
    _TASK,
    _TRANSFER,
    _TRY,
    _WORKER_JOINED,
    _WORKER_LEFT,
    MonitorWriter,
)

RUN = "benchrun0001"
T0 = 1_796_530_207.5
WORKERS = ("w-0", "w-1", "w-2", "w-3")
CORES = 2  #: tries each worker runs at once
#: seconds a try of each category runs (mean): about the audit's
DURATION = {"load": 0.02, "bias": 0.01, "flat": 0.015, "check": 0.005, "stats": 0.002}
INTERVAL = 2.0  #: seconds between the manager's samples


def _key(cat: str, rng: random.Random) -> str:
    return f"{cat}-{rng.getrandbits(128):032x}"


def make_db(path: Path, tasks: int, seed: int = 0) -> dict[str, int]:
    """A monitoring database at ``path`` of one ended run of about ``tasks`` tasks;
    the rows written, by table."""
    rng = random.Random(seed)
    writer = MonitorWriter(path, max_rows=10_000_000)
    argv = json.dumps(["python", "-m", "runtime", "manager", "--listen", "127.0.0.1:34001"])
    writer.submit([("event", "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [(RUN, T0, T0, None, "benchhost", 4242, argv, "3.11.7", 0, 0)])])  # fmt: skip
    counts: dict[str, int] = {}

    def put(kind: str, sql: str, rows: list[tuple[object, ...]], table: str) -> None:
        if rows:
            writer.submit([(kind, sql, rows)])
            counts[table] = counts.get(table, 0) + len(rows)

    put("event", _WORKER_JOINED,
        [(RUN, w, 1, "default", None, CORES, 2**30, T0 + 1.0 + i) for i, w in enumerate(WORKERS)],
        "workers")  # fmt: skip
    free = {(w, c): T0 + 5.0 for w in WORKERS for c in range(CORES)}  # lane -> free at
    task_rows: list[tuple[object, ...]] = []
    try_rows: list[tuple[object, ...]] = []
    transfer_rows: list[tuple[object, ...]] = []
    made = 0
    frame = 0
    while made < tasks:
        # a batch: 41 to 3,015 tasks, as the audit's, submitted at once
        frames = rng.randint(10, 700)
        # the next batch a cron-like pause after the last one ended
        submitted = max(free.values()) + rng.uniform(2.0, 20.0)
        for lane in free:
            free[lane] = max(free[lane], submitted)
        stats_keys: list[str] = []
        for f in range(frames):
            frame += 1
            bad = frame % 97 == 0
            prev_end = submitted
            prev_key: str | None = None
            prev_worker: str | None = None
            failed_key: str | None = None
            for cat in ("load", "bias", "flat", "check"):
                key = _key(cat, rng)
                made += 1
                if failed_key is not None:  # a dependency failed: erred, not run
                    task_rows.append((RUN, key, cat, "default", submitted, None, None, prev_end,
                                      "erred", None, 0, None, None, None, "dependency-failed",
                                      f"dependency {failed_key!r} failed: ValueError: saturated "
                                      f"frame {frame}", failed_key))  # fmt: skip
                    continue
                lane = min(free, key=free.__getitem__)
                worker = lane[0]
                sent = max(free[lane], prev_end)
                started = sent + rng.uniform(0.0005, 0.004)
                ended = started + rng.expovariate(1.0 / DURATION[cat])
                free[lane] = ended
                fail = bad and cat == "bias"
                outcome = "error" if fail else "ok"
                try_rows.append((RUN, key, cat, worker, sent, started, ended, outcome, None,
                                 "ValueError" if fail else None,
                                 f"saturated frame {frame}: 1.19" if fail else None,
                                 None if fail else 16384, prev_end,
                                 "Traceback (most recent call last):\n  ...\nValueError: "
                                 f"saturated frame {frame}: 1.19" if fail else None,
                                 None, None, None))  # fmt: skip
                task_rows.append((RUN, key, cat, "default", submitted, prev_end, started, ended,
                                  "erred" if fail else "memory", worker, 1,
                                  ended - started, None if fail else 16384, None, None, None,
                                  None))  # fmt: skip
                if prev_worker is not None and prev_worker != worker and prev_key is not None:
                    transfer_rows.append((RUN, started, prev_key, "fetch", 16384, prev_worker,
                                          worker, rng.uniform(0.001, 0.2)))  # fmt: skip
                if fail:
                    failed_key = key
                prev_end, prev_key, prev_worker = ended, key, worker
            if f % 50 == 49:
                stats_keys.append(_key("stats", rng))
        for key in stats_keys:
            made += 1
            lane = min(free, key=free.__getitem__)
            sent = free[lane]
            started, ended = sent + 0.001, sent + 0.001 + rng.expovariate(1 / DURATION["stats"])
            free[lane] = ended
            try_rows.append((RUN, key, "stats", lane[0], sent, started, ended, "ok", None, None,
                             None, 24, sent, None, None, None, None))  # fmt: skip
            task_rows.append((RUN, key, "stats", "default", submitted, sent, started, ended,
                              "memory", lane[0], 1, ended - started, 24, None, None, None,
                              None))  # fmt: skip
        if len(try_rows) > 20_000:
            put("event", _TASK, task_rows, "tasks")
            put("event", _TRY, try_rows, "tries")
            task_rows, try_rows = [], []
    put("event", _TASK, task_rows, "tasks")
    put("event", _TRY, try_rows, "tries")
    put("event", _TRANSFER, transfer_rows, "transfers")
    end = max(free.values()) + 5.0
    span = end - T0
    # the manager's samples every INTERVAL: queue depth and oldest wait (a row when the
    # value changed), worker RSS and disk
    metric_rows: list[tuple[object, ...]] = []
    resource_rows: list[tuple[object, ...]] = []
    labels = json.dumps({"pool": "default"})
    depth = wait = -1.0
    rss = dict.fromkeys(WORKERS, 110 * 2**20)
    at = T0
    while at < end:
        busy = rng.random() < 0.8
        new_depth = float(rng.randint(0, 3000)) if busy else 0.0
        new_wait = rng.uniform(0.0, 30.0) if busy else 0.0
        if new_depth != depth:
            metric_rows.append((RUN, at, "corral_queue_depth", labels, new_depth))
            depth = new_depth
        if new_wait != wait:
            metric_rows.append((RUN, at, "corral_queue_oldest_wait_seconds", labels, new_wait))
            wait = new_wait
        for w in WORKERS:
            rss[w] = max(60 * 2**20, rss[w] + rng.randint(-4, 5) * 2**20)
            resource_rows.append((RUN, at, w, rss[w], 0, rng.choice((0, 0, 2**20)), 30 * 2**30,
                                  60 * 2**30))  # fmt: skip
        at += INTERVAL
    put("metric", _METRIC, metric_rows, "metric_samples")
    put("resource", _RESOURCE, resource_rows, "resource_samples")
    alert_rows = []
    for name, start in (("QueueStalled", T0 + span * 0.3), ("WorkerMemoryHigh", T0 + span * 0.7)):
        lab = json.dumps({"pool": "default"})
        alert_rows += [
            (RUN, start, name, "pending", lab, "{}", 1.0, start, None, None, None),
            (RUN, start + 60, name, "firing", lab, "{}", 1.0, start, start + 60, None, None),
            (RUN, start + 300, name, "resolved", lab, "{}", 0.0, start, start + 60, start + 300,
             None),
        ]  # fmt: skip
    put("event", _ALERT, alert_rows, "alerts")
    put("event", _WORKER_LEFT, [(end, "shutdown", RUN, w, 1) for w in WORKERS], "worker ends")
    writer.submit([("event", "UPDATE runs SET ended = ?, last_seen = ? WHERE run_id = ?",
                    [(end, end, RUN)])])  # fmt: skip
    writer.close(timeout=600.0)
    if writer.dropped:
        raise SystemExit(f"the writer dropped rows: {dict(writer.dropped)}")
    return counts


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, int, str]:
    """Run ``cmd``: its wall seconds, its max RSS in bytes, and its stdout; exit on
    failure."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        # (in the tree: `python -m` and `-c` put the working directory first on the path)
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # (this child's own rusage)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit(
                f"{' '.join(cmd)} failed ({proc.returncode}): {err.read().decode()[-2000:]}"
            )
        return wall, usage.ru_maxrss * 1024, out.read().decode()


def _plotly_js(page: str) -> int:
    """Bytes of the inlined plotly.js in a report (its largest ``<script>``)."""
    sizes = []
    at = 0
    while (start := page.find("<script", at)) >= 0:
        stop = page.find("</script>", start)
        sizes.append(stop - start)
        at = stop + 1
    return max(sizes, default=0)


#: run in the report's process: the modules it imported, as JSON on stdout
_LIST_PROBE = (
    "import json, sys, runpy; sys.argv = ['runtime', 'report', sys.argv[1], '--list'];\n"
    "import contextlib, io\n"
    "buf = io.StringIO()\n"
    "with contextlib.redirect_stdout(buf):\n"
    "    try: runpy.run_module('runtime', run_name='__main__')\n"
    "    except SystemExit: pass\n"
    "print(json.dumps(sorted(m for m in ('plotly', 'pandas', 'numpy', 'aiohttp') "
    "if m in sys.modules)))"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=50_000)
    ap.add_argument("--tree", action="append", default=None,
                    help="a Corral tree to time (PYTHONPATH); several: interleaved")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--db", help="use this database instead of making one")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in (args.tree or [str(ROOT)])]
    work = Path(tempfile.mkdtemp(prefix="report-cost-"))
    if args.db:
        db = Path(args.db)
    else:
        db = work / "monitoring.db"
        t = time.perf_counter()
        counts = make_db(db, args.tasks)
        print(f"made {db} in {time.perf_counter() - t:.1f} s: {counts}, "
              f"{db.stat().st_size / 2**20:.1f} MiB")  # fmt: skip
    results: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    imported: dict[str, str] = {}
    for i in range(args.repeat):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            out = work / f"report-{i}.html"
            wall, peak, _ = _timed([sys.executable, "-m", "runtime", "report", str(db), "-o",
                                    str(out)], env, tree)  # fmt: skip
            page = out.read_text()
            size = len(page.encode())
            js = _plotly_js(page)
            lwall, _, _ = _timed([sys.executable, "-m", "runtime", "report", str(db), "--list"],
                                 env, tree)  # fmt: skip
            _, _, mods = _timed([sys.executable, "-c", _LIST_PROBE, str(db)], env, tree)
            imported[tree] = mods.strip().splitlines()[-1]
            r = results[tree]
            for name, v in (("report s", wall), ("peak MB", peak / 1e6),
                            ("html MB", size / 1e6), ("plotly.js MB", js / 1e6),
                            ("other MB", (size - js) / 1e6), ("--list s", lwall)):  # fmt: skip
                r.setdefault(name, []).append(v)
            print(f"round {i + 1} {tree}: report {wall:.2f} s, {size / 1e6:.2f} MB "
                  f"({js / 1e6:.2f} MB plotly.js), --list {lwall:.2f} s", flush=True)  # fmt: skip
            out.unlink()
    print()
    print(f"{'tree':40} {'report s (best/median)':>24} {'html MB':>8} {'plotly.js':>9} "
          f"{'--list s (best/median)':>24}  imported by --list")  # fmt: skip
    for tree, r in results.items():
        print(f"{tree:40} {min(r['report s']):>11.2f} / {statistics.median(r['report s']):<10.2f}"
              f" {r['html MB'][0]:>8.2f} {r['plotly.js MB'][0]:>9.2f} "
              f"{min(r['--list s']):>11.2f} / {statistics.median(r['--list s']):<10.2f}"
              f"  {imported[tree]}\n{'':40} report max RSS {min(r['peak MB']):.0f} to "
              f"{max(r['peak MB']):.0f} MB, HTML other than plotly.js "
              f"{r['other MB'][0]:.2f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
