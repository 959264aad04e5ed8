"""Time to the first task, and in all, of a large dask graph: ``runtime.get`` against a
dask.distributed ``LocalCluster(processes=False)`` of as many threads, interleaved in one
process; and the garbage collector's full collections while each ran (each holds the
GIL, so the event loop and the console wait for it).

    python benchmarks/ingest.py                      # 100,000-item bag, 100,000 partitions
    python benchmarks/ingest.py bag 100000 --partitions 1000
    python benchmarks/ingest.py delayed 100000       # 100,000 dask.delayed, summed by 100s
    python benchmarks/ingest.py --ways corral --rounds 1
    python benchmarks/ingest.py --build              # the manager's build alone, GC paused or not

``--build``: only what the manager's thread does with the graph (``build_specs`` and
``in_pieces``), in this thread, with the garbage collector paused as the manager pauses
it (``actors.manager.gc_paused``) and left on as before, interleaved: CPU seconds of
the thread and full collections.

The first task is the first call of the mapped function, in any thread (a file made
with O_EXCL). Run it with ``PYTHONPATH`` set to another tree of Corral to compare two
versions in the same conditions.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from typing import Any

import dask
import dask.bag as db
from loop_lag import FULL_GC, _time_full_gc  # benchmarks/: its full collections timer

import runtime

MARK = os.path.join(tempfile.gettempdir(), f"corral-ingest-{os.getpid()}")
THREADS = 2


def f(x: int) -> int:
    if not os.path.exists(MARK):
        try:
            fd = os.open(MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, repr(time.time()).encode())
            os.close(fd)
    return x + 1


def total(xs: list[int]) -> int:
    return sum(xs)


def collection(kind: str, n: int, partitions: int | None) -> Any:
    if kind == "bag":
        return db.from_sequence(range(n), npartitions=partitions or n).map(f).sum()
    parts = [dask.delayed(f)(i) for i in range(n)]
    while len(parts) > 1:  # a tree of sums of 100
        parts = [dask.delayed(total)(parts[i : i + 100]) for i in range(0, len(parts), 100)]
    return parts[0]


def once(way: str, x: Any) -> tuple[float, float]:
    """(seconds to the first task, seconds in all) of ``x`` computed ``way``."""
    if os.path.exists(MARK):
        os.remove(MARK)
    gc.collect()
    FULL_GC.clear()
    if way == "corral":
        start = time.time()
        dask.compute(x, scheduler=runtime.get, num_workers=THREADS)
    else:
        from distributed import Client, LocalCluster

        with (
            LocalCluster(
                n_workers=1, threads_per_worker=THREADS, processes=False, dashboard_address=None
            ) as cluster,
            Client(cluster),
        ):
            start = time.time()
            dask.compute(x)
    took = time.time() - start
    with open(MARK) as file:
        first = float(file.read()) - start
    os.remove(MARK)
    return first, took


def build(x: Any, paused: bool) -> tuple[float, int]:
    """(CPU seconds, tasks) of the manager's build of ``x``'s graph (``_build``)."""
    from contextlib import nullcontext

    import dask.base
    from dask.core import flatten

    from actors.manager import gc_paused
    from runtime.graph import build_specs, in_pieces

    expr = dask.base.collections_to_expr([x], optimize_graph=True).optimize()
    keys = list(flatten(expr.__dask_keys__()))
    gc.collect()
    FULL_GC.clear()
    start = time.thread_time()
    with gc_paused() if paused else nullcontext():
        specs = build_specs(expr, keys)
        in_pieces(specs, keys)
    return time.thread_time() - start, len(specs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", nargs="?", choices=("bag", "delayed"), default="bag")
    p.add_argument("n", nargs="?", type=int, default=100_000)
    p.add_argument("--partitions", type=int, help="a bag's (default: one per item)")
    p.add_argument("--ways", default="corral,distributed")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--build", action="store_true", help="the manager's build alone")
    a = p.parse_args()
    gc.callbacks.append(_time_full_gc)
    if a.build:
        for r in range(a.rounds):
            for paused in (False, True):
                cpu, tasks = build(collection(a.kind, a.n, a.partitions), paused)
                print(
                    f"  round {r + 1} GC {'paused' if paused else 'on':>6}: {tasks:,} tasks, "
                    f"{cpu:5.1f} CPU s; full GCs {len(FULL_GC)}, {sum(FULL_GC):.1f} s, "
                    f"longest {max(FULL_GC, default=0.0) * 1000:.0f} ms",
                    flush=True,
                )
        return
    ways = a.ways.split(",")
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    print(f"{a.kind} of {a.n:,} ({a.partitions or a.n:,} partitions); corral from "
          f"{os.path.dirname(runtime.__file__)}; {a.rounds} rounds, interleaved")  # fmt: skip
    for r in range(a.rounds):
        for way in ways:
            first, took = once(way, collection(a.kind, a.n, a.partitions))
            got[way].append((first, took))
            print(
                f"  round {r + 1} {way:>11}: first task {first:6.1f} s, in all {took:6.1f} s; "
                f"full GCs {len(FULL_GC)}, {sum(FULL_GC):.1f} s, longest "
                f"{max(FULL_GC, default=0.0) * 1000:.0f} ms",
                flush=True,
            )
    for way, runs in got.items():
        print(
            f"{way}: median first task {statistics.median(x[0] for x in runs):.1f} s, "
            f"in all {statistics.median(x[1] for x in runs):.1f} s"
        )


if __name__ == "__main__":
    main()
