"""Task throughput: Corral beside dask's schedulers, in the same run, as ratios.

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
``chain`` (the last key only); ``--threads`` does not apply. Both clusters start once,
outside the timing (their start-up times are printed apart), and run one small warm-up
graph; each timed run is ``cluster.compute(dsk, keys)`` against ``client.get(dsk,
keys)`` on fresh keys, called from this thread (each side's event loop runs in a thread
of its own), best of ``--repeat`` interleaved runs. Also printed: wall and CPU time per
task over all timed runs, in this process and in the side's worker processes. The
garbage collector's threshold is process-wide: it is Corral's (``--no-gc-tuning``:
Python's default) during Corral's runs and Python's default, as dask.distributed ships,
during dask's.

    python benchmarks/throughput.py --mode distributed --repeat 3

``--categories N`` (in-process mode) names the ``independent`` workload's keys in ``N``
task categories, about ``n / N`` tasks each (the scheduler keeps statistics and a
producer/consumer class per category):

    python benchmarks/throughput.py --categories 5000 --repeat 1

``--monitoring`` (in-process mode) also runs ``corral-cluster`` with a monitoring
database (``Cluster(monitoring=PATH)``: the scheduler core's feed, the recorder and the
writer thread) and prints its rates against the same cluster without one, the two
alternating run by run.
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
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import dask
import dask.local
import dask.threaded

from runtime import Cluster, get
from runtime.client import GC_THRESHOLD


def noop(*args: Any) -> None:
    return None


def independent(n: int, run: int = 0, categories: int = 0) -> tuple[dict[Any, Any], Any]:
    """``categories``: the keys are named in that many task categories, round robin
    (``noop17-<run>``: category ``noop17``), as keys named by field or sample are."""
    if categories:
        dsk = {(f"noop{i % categories}-{run}", i): (noop, i) for i in range(n)}
    else:
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


# ----------------------------------------------------------------------------- distributed

#: Workers and threads per worker on each side in ``--mode distributed``.
DIST_WORKERS = 2
DIST_THREADS = 1
#: What Corral should reach in ``--mode distributed``: this many times dask.distributed.
DIST_TARGET = 3.0


def run_distributed(n: int, chain_length: int, repeat: int, gc_threshold: int | None) -> int:
    """Corral's ``Cluster(processes=2)`` against dask.distributed's ``LocalCluster``."""
    import distributed
    import psutil
    from anyio.from_thread import start_blocking_portal
    from distributed import Client, LocalCluster

    # dask.distributed logs at INFO/WARNING about every worker start, stop and slow
    # event-loop tick, and Corral warns as its worker processes stop at the close; only
    # errors should reach the terminal.
    for name in ("distributed", "tornado", "asyncio", "corral"):
        logging.getLogger(name).setLevel(logging.ERROR)

    builders: dict[str, Callable[[int], tuple[dict[Any, Any], Any]]] = {
        "independent": lambda run: independent(n, run),
        "chain": lambda run: chain(chain_length, run),
    }
    sizes = {name: len(build(0)[0]) for name, build in builders.items()}
    runs = itertools.count(1)
    me = psutil.Process()
    default_gc = gc.get_threshold()  # before Corral raises it; dask runs with this
    print(
        f"python {sys.version.split()[0]}, dask {dask.__version__}, distributed "
        f"{distributed.__version__}, {os.cpu_count()} cores; each side: scheduler in this "
        f"process, {DIST_WORKERS} worker processes x {DIST_THREADS} thread; best of {repeat}; "
        f"gc threshold: Corral {gc_threshold or default_gc[0]}, dask {default_gc[0]}",
        flush=True,
    )

    with contextlib.ExitStack() as stack:
        # Corral's event loop runs in a thread of its own (as a sync dask Client's does),
        # so both sides are driven alike from this thread. The portal outlives the
        # cluster: Corral's worker processes are tied to the thread that spawned them.
        portal = stack.enter_context(start_blocking_portal("asyncio"))

        start = time.perf_counter()
        corral = stack.enter_context(
            portal.wrap_async_context_manager(
                Cluster(
                    processes=DIST_WORKERS,
                    threads_per_worker=DIST_THREADS,
                    gc_threshold=gc_threshold,
                )
            )
        )
        portal.call(corral.wait_for_workers, DIST_WORKERS, 120.0)
        corral_start = time.perf_counter() - start
        corral_gc = gc.get_threshold()
        corral_procs = me.children(recursive=True)

        def corral_compute(dsk: dict[Any, Any], keys: Any) -> Any:
            return portal.call(corral.compute, dsk, keys)

        gc.set_threshold(*default_gc)
        try:
            start = time.perf_counter()
            local = stack.enter_context(
                LocalCluster(
                    n_workers=DIST_WORKERS,
                    threads_per_worker=DIST_THREADS,
                    processes=True,
                    dashboard_address=None,
                    # CRITICAL, not ERROR: at the close a worker's heartbeat may race the
                    # scheduler's shutdown and log a harmless ERROR with a traceback. A
                    # task that fails still raises in client.get.
                    silence_logs=logging.CRITICAL,
                )
            )
            client = stack.enter_context(Client(local))
            client.wait_for_workers(DIST_WORKERS, timeout=120)
            dask_start = time.perf_counter() - start
        finally:
            gc.set_threshold(*corral_gc)
        corral_pids = {p.pid for p in corral_procs}
        dask_procs = [p for p in me.children(recursive=True) if p.pid not in corral_pids]

        def dask_compute(dsk: dict[Any, Any], keys: Any) -> Any:
            gc.set_threshold(*default_gc)
            try:
                return client.get(dsk, keys)
            finally:
                gc.set_threshold(*corral_gc)

        sides = {"corral": corral_compute, "dask.distributed": dask_compute}
        workers_of = {"corral": corral_procs, "dask.distributed": dask_procs}
        print(
            f"start-up (outside the timing): corral {corral_start:.2f} s, "
            f"dask.distributed {dask_start:.2f} s",
            flush=True,
        )

        # Warm-up: one small graph each (connections, function pickles, first imports).
        for compute in sides.values():
            warm, warm_keys = independent(100, next(runs))
            check(compute(warm, warm_keys), warm_keys)

        rates: dict[tuple[str, str], list[float]] = {}
        # CPU seconds used during the timed runs: by this process (the scheduler, the
        # client and their event-loop threads; the other side's loop idles meanwhile)
        # and by the side's worker processes (dask's include its nannies).
        cpu: dict[tuple[str, str], list[float]] = {}
        for name, build in builders.items():
            for _ in range(repeat):  # interleaved, so drift hits both sides alike
                for side, compute in sides.items():
                    dsk, keys = build(next(runs))
                    here, there = cpu_seconds([me]), cpu_seconds(workers_of[side])
                    start = time.perf_counter()
                    result = compute(dsk, keys)
                    elapsed = time.perf_counter() - start
                    here, there = cpu_seconds([me]) - here, cpu_seconds(workers_of[side]) - there
                    check(result, keys)
                    rates.setdefault((side, name), []).append(len(dsk) / elapsed)
                    used = cpu.setdefault((side, name), [0.0, 0.0, 0.0])
                    used[0] += elapsed
                    used[1] += here
                    used[2] += there

    print(
        f"{'workload':<12} {'tasks':>6} {'corral':>13} {'dask.distributed':>17} "
        f"{'corral/dask':>12}  target {DIST_TARGET:g}x"
    )
    for name, size in sizes.items():
        ours, theirs = max(rates[("corral", name)]), max(rates[("dask.distributed", name)])
        ratio = ours / theirs
        verdict = "met" if ratio >= DIST_TARGET else "MISSED"
        print(
            f"{name:<12} {size:>6} {ours:>11,.0f}/s {theirs:>15,.0f}/s {ratio:>11.2f}x  {verdict}"
        )
    print("every run, tasks/s (in the order run):")
    for (side, name), values in rates.items():
        print(f"  {name:<12} {side:<17} " + " ".join(f"{v:>8,.0f}" for v in values))
    print("per task over all timed runs, µs: wall, CPU in this process, CPU in worker processes")
    for (side, name), (wall, here, there) in cpu.items():
        tasks = sizes[name] * repeat
        print(
            f"  {name:<12} {side:<17} {wall / tasks * 1e6:>8,.0f} {here / tasks * 1e6:>8,.0f} "
            f"{there / tasks * 1e6:>8,.0f}"
        )
    return 0


def cpu_seconds(procs: Sequence[Any]) -> float:
    """User plus system CPU seconds of ``procs`` (``psutil.Process``) so far."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(Exception):  # psutil.Error: gone meanwhile
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def check(result: Any, keys: Any) -> None:
    """Both sides must hand back what was asked: a value per key, or the one value."""
    if isinstance(keys, list) and len(result) != len(keys):
        raise AssertionError(f"asked for {len(keys)} results, got {len(result)}")


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
        help="tasks (independent, tree leaves); default 20,000 (in-process), 5,000 (distributed)",
    )
    parser.add_argument("--chain", type=int, default=2_000, help="length of the chain")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scheduler; best counts")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads per scheduler (in-process mode only)",
    )
    parser.add_argument(
        "--monitoring",
        action="store_true",
        help="also time corral-cluster writing a monitoring database (in-process mode)",
    )
    parser.add_argument(
        "--categories",
        type=int,
        default=0,
        help="name the independent workload's keys in this many task categories (in-process)",
    )
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="run Corral with Python's default garbage-collector threshold",
    )
    args = parser.parse_args(argv)
    gc_threshold = None if args.no_gc_tuning else GC_THRESHOLD
    if args.mode == "distributed":
        n = 5_000 if args.n is None else args.n
        return run_distributed(n, args.chain, args.repeat, gc_threshold)
    if args.n is None:
        args.n = 20_000
    threads = args.threads
    builders: dict[str, Callable[[int], tuple[dict[Any, Any], Any]]] = {
        "independent": lambda run: independent(args.n, run, args.categories),
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
        + (f", independent in {args.categories} categories" if args.categories else "")
    )

    async def run_cluster(db: str | None = None) -> dict[str, float]:
        best: dict[str, float] = {}
        async with contextlib.AsyncExitStack() as stack:
            plain = await stack.enter_async_context(
                Cluster(workers=1, threads_per_worker=threads, gc_threshold=gc_threshold)
            )
            clusters = {"": plain}
            if db is not None:
                clusters["+db"] = await stack.enter_async_context(
                    Cluster(
                        workers=1, threads_per_worker=threads, gc_threshold=gc_threshold,
                        monitoring=db,
                    )
                )  # fmt: skip
            for cluster in clusters.values():
                await cluster.wait_for_workers(1)
            for name, build in builders.items():
                for _ in range(args.repeat):
                    for tag, cluster in clusters.items():  # alternating, as drift goes
                        dsk, keys = build(next(runs))
                        start = time.perf_counter()
                        await cluster.compute(dsk, keys)
                        elapsed = time.perf_counter() - start
                        best[name + tag] = min(best.get(name + tag, float("inf")), elapsed)
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
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "monitoring.db") if args.monitoring else None
        cluster_best = anyio.run(run_cluster, db)
    for name, elapsed in cluster_best.items():
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
    if args.monitoring:
        print("corral-cluster with a monitoring database, against without one:")
        for name, (dsk, _keys) in workloads.items():
            plain, with_db = best[("corral-cluster", name)], best[("corral-cluster", name + "+db")]
            print(
                f"{name:<12} {len(dsk) / plain:>10,.0f}/s without, {len(dsk) / with_db:>10,.0f}/s "
                f"with: {plain / with_db:.2f}x the rate"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
