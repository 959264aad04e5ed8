"""A worker lost on small disks: how the run recovers (the users' audit, files on disks).

    python benchmarks/disk_recovery.py                 # both submissions, with and without the kill
    python benchmarks/disk_recovery.py --repeat 3 --loads 150
    python benchmarks/disk_recovery.py --ways per-task --no-kill   # one submission per task
    PYTHONPATH=/tmp/old python benchmarks/disk_recovery.py   # another tree's runtime

Each run is a manager process (``python -m runtime manager``) and three worker processes
(``python -m runtime worker ws://... --disk 300MiB``, one thread each, a spill directory
each) on 127.0.0.1, and a client (``Cluster(address)``) that submits ``--loads`` ``load``
tasks, each writing a ``--mb`` MB file output, as many ``skim`` tasks, each reading one
load and writing a file output of the same size, and a ``merge`` per ``--fan-in`` skims
(it returns the sum of its inputs' header numbers and sizes, checked here). Only the
merges are wanted. Two ways of submitting: ``graph`` (one ``submit_graph`` of every
task) and ``per-task`` (one ``submit_graph`` per task, in the order load, skim, merge,
as the audit's script did: every load comes before every merge in priority). With
``kill``, one worker is killed with SIGKILL ``--kill-after`` seconds after the
submission began and is not replaced.

Printed per run, from ``status()`` at the end: the wall time from the submission to the
last merge, the disk stalls (``disk_stalls_total``), the outputs the stall breaker
dropped (``disk_dropped``), the needed outputs lost with the worker and recomputed
(``storage.recoveries``) and the tasks that ran again (``categories[*].count`` beyond
one per task: recoveries, breaker drops, and the inputs they needed).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if "runtime" not in sys.modules:
    sys.path.append(str(ROOT))  # after PYTHONPATH: another tree's runtime wins

import anyio  # noqa: E402
from cluster_processes import manager_and_workers  # noqa: E402  (benchmarks/: on the path)

import runtime  # noqa: E402
from runtime.files import File, output_path  # noqa: E402

MB = 1_000_000
HEADER = 8


def load(i: int, nbytes: int) -> File:
    """A file of ``nbytes``: ``i`` in its first 8 bytes, then zeros."""
    path = output_path(f"load-{i}.bin")
    with open(path, "wb") as f:
        f.write(i.to_bytes(HEADER, "little"))
        f.write(bytes(nbytes - HEADER))
    return File(path)


def skim(events: File) -> File:
    """A file of the input's size: its header number plus one, then its bytes."""
    path = output_path("skim.bin")
    with open(events, "rb") as src, open(path, "wb") as dst:
        n = int.from_bytes(src.read(HEADER), "little")
        dst.write((n + 1).to_bytes(HEADER, "little"))
        while chunk := src.read(2**20):
            dst.write(chunk)
    return File(path)


def merge(*skims: File) -> int:
    """The sum of the skims' header numbers and of their sizes."""
    total = 0
    for s in skims:
        with open(s, "rb") as f:
            total += int.from_bytes(f.read(HEADER), "little")
        total += os.path.getsize(s)
    return total


def processes(
    home: str, workers: int, disk: str, log: str | None = None
) -> AbstractContextManager[tuple[str, list[Any]]]:
    """A manager and ``workers`` worker processes on 127.0.0.1, each worker with
    ``--disk`` and a spill directory of its own; their address, and the workers'
    ``Popen``. With ``log``, the manager's output is written there."""
    args = []
    for n in range(workers):
        spill = os.path.join(home, f"spill-{n}")
        os.makedirs(spill)
        args.append(["--disk", disk, "--spill-dir", spill])
    return manager_and_workers(home, args, ["--no-monitoring"], log)


def graph_of(loads: int, nbytes: int, fan_in: int) -> tuple[dict[str, Any], list[str], int]:
    """The workflow's tasks in the order load, skim, merge; the merges; their expected sum."""
    g: dict[str, Any] = {}
    for i in range(loads):
        g[f"load-{i}"] = (load, i, nbytes)
    for i in range(loads):
        g[f"skim-{i}"] = (skim, f"load-{i}")
    merges = []
    expected = 0
    for j in range(0, loads, fan_in):
        key = f"merge-{j // fan_in}"
        members = range(j, min(j + fan_in, loads))
        g[key] = (merge, *(f"skim-{i}" for i in members))
        merges.append(key)
        expected += sum(i + 1 + nbytes for i in members)
    return g, merges, expected


async def one(args: argparse.Namespace, way: str, kill: bool) -> dict[str, Any]:
    from runtime import Cluster

    g, merges, expected = graph_of(args.loads, args.mb * MB, args.fan_in)
    with tempfile.TemporaryDirectory(prefix="corral-diskrec-") as home:
        os.environ["CORRAL_HOME"] = home
        log = f"{args.stories}-{way}-{'kill' if kill else 'none'}.log" if args.stories else None
        with processes(home, args.workers, args.disk, log) as (address, workers):
            async with Cluster(address) as c:
                await c.wait_for_workers(args.workers)
                start = time.perf_counter()
                killed = threading.Event()

                def killer() -> None:
                    if not killed.wait(args.kill_after):
                        workers[-1].send_signal(signal.SIGKILL)

                if kill:
                    threading.Thread(target=killer, daemon=True).start()
                if way == "graph":
                    futures = await c.submit_graph(g, merges)
                else:
                    # each task on its own, referring to its inputs' keys; a future is
                    # held until its readers are in, then released: only merges are wanted
                    held: dict[str, Any] = {}
                    futures = []
                    for key, task in g.items():
                        (f,) = await c.submit_graph({key: task}, [key])
                        for dep in task[1:]:
                            held.pop(dep, None)
                        if key in merges:
                            futures.append(f)
                        else:
                            held[key] = f
                        del f
                with anyio.fail_after(args.timeout):
                    values = [await f for f in futures]
                wall = time.perf_counter() - start
                killed.set()
                assert sum(values) == expected, (sum(values), expected)
                status = await c.status()
                # every task's story and the scheduler's, for a look (--stories)
                stories = await c.story("-", *g) if args.stories else []
    tasks = len(g)
    ran = sum(
        s["count"] for cat, s in status["categories"].items() if cat in {"load", "skim", "merge"}
    )
    return {
        "wall": wall,
        "stalls": sum(status.get("disk_stalls_total", {}).values()),
        "dropped": status.get("disk_dropped", 0),
        "recovered": sum(status["storage"]["recoveries"].values()),
        "again": ran - tasks,
        "stories": stories,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each way (interleaved)")
    parser.add_argument("--loads", type=int, default=150)
    parser.add_argument("--mb", type=int, default=20, help="MB of each load's and skim's file")
    parser.add_argument("--fan-in", type=int, default=10, help="skims per merge")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--disk", default="300MiB", help="each worker's --disk")
    parser.add_argument("--kill-after", type=float, default=6.0, help="seconds")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--ways", default="graph,per-task", help="graph, per-task or both")
    parser.add_argument(
        "--stories", help="write every story to STORIES-WAY-KILL.txt, the manager's log to .log"
    )
    parser.add_argument("--no-baseline", action="store_true", help="only the runs with the kill")
    parser.add_argument("--no-kill", action="store_true", help="only the runs without the kill")
    args = parser.parse_args()
    print(f"# runtime from {Path(runtime.__file__).parent}", flush=True)
    print("| round | submission | kill | wall | disk stalls | dropped | recovered | ran again |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for r in range(1, args.repeat + 1):
        for way in args.ways.split(","):
            kills = [k for k in (False, True) if not (args.no_kill if k else args.no_baseline)]
            for kill in kills:
                res = anyio.run(one, args, way, kill)
                if args.stories:
                    with open(f"{args.stories}-{way}-{'kill' if kill else 'none'}.txt", "w") as f:
                        for entry in sorted(res["stories"], key=lambda e: e[-1]):
                            print(*entry, sep="\t", file=f)
                print(
                    f"| {r} | {way} | {'kill -9' if kill else 'none'} | {res['wall']:.1f} s "
                    f"| {res['stalls']} | {res['dropped']} | {res['recovered']} | {res['again']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
