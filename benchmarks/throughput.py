"""Task throughput: Corral beside dask's schedulers, in one process, as ratios.

Three workloads of no-op tasks:

- ``independent``: N tasks with no dependencies, all results requested;
- ``tree``: a tree reduction of N leaves with fan-in 8, the root requested;
- ``chain``: a linear chain of 2,000 tasks, the last requested (latency bound).

Schedulers, all in this process, each given the same number of threads (one per core
unless ``--threads``):

- ``corral-get``: ``runtime.get`` as ``dask.compute(..., scheduler=get)`` uses it; it
  starts an in-process cluster for every call, and that start is timed too;
- ``corral-cluster``: ``Cluster.compute`` on a cluster started once, outside the timing;
- ``dask-threaded`` and ``dask-sync``: dask's own local schedulers.

This machine is shared and noisy, so every scheduler runs each workload ``--repeat``
times, interleaved, and the best run counts; ratios are printed against both dask
schedulers. Absolute rates drift from run to run; the ratios are what to compare.

    python benchmarks/throughput.py                 # default sizes
    python benchmarks/throughput.py -n 50000 --repeat 5

``--mode distributed`` compares Corral with dask.distributed, each with its scheduler in
this process and two single-threaded worker processes on this machine: ``Cluster(
processes=2, threads_per_worker=1)`` against ``LocalCluster(n_workers=2,
threads_per_worker=1, processes=True)`` with a ``Client``. Workloads: ``independent``
(default 5,000 tasks, every result gathered back to the client on both sides) and
``chain`` (the last key only). Both clusters start once, outside the timing (their
start-up times are printed apart), and run one small warm-up graph; each timed run is
``cluster.compute(dsk, keys)`` against ``client.get(dsk, keys)`` on fresh keys, called
from this thread (each side's event loop runs in a thread of its own), best of
``--repeat`` interleaved runs. The garbage collector's threshold is process-wide: it is
Corral's (``--no-gc-tuning``: Python's default) during Corral's runs and Python's
default, as dask.distributed ships, during dask's.

    python benchmarks/throughput.py --mode distributed --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import dask
import dask.local
import dask.threaded

from runtime import Cluster, get
from runtime.client import GC_THRESHOLD


def noop(*args: Any) -> None:
    return None


def independent(n: int, run: int = 0) -> tuple[dict[Any, Any], Any]:
    dsk = {(f"noop-{run}", i): (noop, i) for i in range(n)}
    return dsk, list(dsk)


def tree(n: int, run: int = 0, fan_in: int = 8) -> tuple[dict[Any, Any], Any]:
    dsk: dict[Any, Any] = {(f"leaf-{run}", i): (noop, i) for i in range(n)}
    prev = [(f"leaf-{run}", i) for i in range(n)]
    level = 0
    while len(prev) > 1:
        level += 1
        nxt = []
        for j in range(0, len(prev), fan_in):
            key = (f"sum-{run}-{level}", j // fan_in)
            dsk[key] = (noop, *prev[j : j + fan_in])
            nxt.append(key)
        prev = nxt
    return dsk, prev[0]


def chain(n: int = 2000, run: int = 0) -> tuple[dict[Any, Any], Any]:
    dsk: dict[Any, Any] = {f"link-{run}-0": (noop, 0)}
    for i in range(1, n):
        dsk[f"link-{run}-{i}"] = (noop, f"link-{run}-{i - 1}")
    return dsk, f"link-{run}-{n - 1}"


def time_call(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode",
        choices=("in-process", "distributed"),
        default="in-process",
        help="in-process: Corral beside dask's local schedulers (the default); "
        "distributed: Corral's worker processes against dask.distributed's",
    )
    parser.add_argument(
        "-n",
        type=int,
        default=None,
        help="tasks (independent, tree leaves); default 20,000 (in-process), 5,000 "
        "(distributed)",
    )
    parser.add_argument("--chain", type=int, default=2_000, help="length of the chain")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scheduler; best counts")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="run Corral with Python's default garbage-collector threshold",
    )
    args = parser.parse_args(argv)
    gc_threshold = None if args.no_gc_tuning else GC_THRESHOLD
    if args.mode == "distributed":
        return run_distributed(5_000 if args.n is None else args.n, args.chain, args.repeat,
                               gc_threshold)  # fmt: skip
    if args.n is None:
        args.n = 20_000
    threads = args.threads
    builders: dict[str, Callable[[int], tuple[dict[Any, Any], Any]]] = {
        "independent": lambda run: independent(args.n, run),
        "tree": lambda run: tree(args.n, run),
        "chain": lambda run: chain(args.chain, run),
    }
    # Every run gets graphs with keys of its own, built before the clock starts: a
    # scheduler that keeps results (a persistent cluster) must compute them again.
    runs = itertools.count()
    workloads = {name: build(0) for name, build in builders.items()}
    print(
        f"python {sys.version.split()[0]}, dask {dask.__version__}, {os.cpu_count()} cores, "
        f"{threads} threads per scheduler, best of {args.repeat}, Corral's gc threshold: "
        f"{gc_threshold or 'Python default'}"
    )

    async def run_cluster() -> dict[str, float]:
        best: dict[str, float] = {}
        async with Cluster(
            workers=1, threads_per_worker=threads, gc_threshold=gc_threshold
        ) as cluster:
            await cluster.wait_for_workers(1)
            for name, build in builders.items():
                for _ in range(args.repeat):
                    dsk, keys = build(next(runs))
                    start = time.perf_counter()
                    await cluster.compute(dsk, keys)
                    elapsed = time.perf_counter() - start
                    best[name] = min(best.get(name, float("inf")), elapsed)
        return best

    schedulers: dict[str, Callable[[dict[Any, Any], Any], Any]] = {
        "corral-get": lambda d, k: get(d, k, threads_per_worker=threads, gc_threshold=gc_threshold),
        "dask-threaded": lambda d, k: dask.threaded.get(d, k, num_workers=threads),
        "dask-sync": dask.local.get_sync,
    }
    best: dict[tuple[str, str], float] = {}
    for name, build in builders.items():
        for _ in range(args.repeat):  # interleaved, so drift hits every scheduler alike
            for sched, fn in schedulers.items():
                dsk, keys = build(next(runs))
                elapsed = time_call(functools.partial(fn, dsk, keys))
                best[(sched, name)] = min(best.get((sched, name), float("inf")), elapsed)
    for name, elapsed in anyio.run(run_cluster).items():
        best[("corral-cluster", name)] = elapsed

    order = ["corral-get", "corral-cluster", "dask-threaded", "dask-sync"]
    header = f"{'workload':<12} {'tasks':>7} " + " ".join(f"{s:>15}" for s in order)
    print(header + f" {'get/threaded':>13} {'get/sync':>9}")
    for name, (dsk, _keys) in workloads.items():
        rates = {s: len(dsk) / best[(s, name)] for s in order}
        cells = " ".join(f"{rates[s]:>13,.0f}/s" for s in order)
        print(
            f"{name:<12} {len(dsk):>7} {cells} "
            f"{rates['corral-get'] / rates['dask-threaded']:>12.2f}x "
            f"{rates['corral-get'] / rates['dask-sync']:>8.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
