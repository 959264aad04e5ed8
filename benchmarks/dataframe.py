"""A dask.dataframe feature pipeline: Corral beside dask's schedulers (a user audit).

    python benchmarks/dataframe.py                       # 12 partitions x 250,000 rows, best of 3
    python benchmarks/dataframe.py --partitions 24 --rows 500000 --repeat 2   # the audit's size
    python benchmarks/dataframe.py --systems threaded,corral-get --profile /tmp/df.prof

The pipeline (after the audit's ``pipeline.py``): ``--partitions`` partitions of
``--rows`` synthetic events each, made inside tasks with ``dd.from_map``, and a users
table of ``--users`` rows in 4 partitions; four outputs computed together in one
``dask.compute``: a per-user groupby-agg, events merged with users (a hash join: Corral
runs dask's task shuffle) grouped by segment x category, a per-partition ``map_partitions``
1 h time rolling mean grouped by category, and a ``Series.rolling(1000)`` across
partitions (overlap) summed.

Systems (``--systems``), each alternating with the others run by run, the best of
``--repeat`` counting:

- ``threaded``: dask's threaded scheduler, 2 threads (the reference every result is
  checked against, and the denominator of the ratios);
- ``threaded-tasks``: the same with dask's task shuffle (Corral's) in place of its
  default disk shuffle;
- ``distributed``: dask.distributed's ``LocalCluster`` of 2 worker processes x 1 thread
  (started once, outside the timing), computed through its ``Client``;
- ``corral-get``: ``dask.compute(..., scheduler=runtime.get, num_workers=2)``: an
  in-process cluster (one worker, 2 threads) started and stopped by each call (timed);
- ``corral-processes``: ``runtime.get`` with ``address=`` against a manager and 2 worker
  processes (``--cores 1`` each) started once, outside the timing.

Every system's four outputs are compared with the threaded scheduler's
(``pd.testing.assert_frame_equal`` after sorting the index). Per run: the wall time, the
CPU seconds of this process (all its threads: the client, an in-process cluster, dask's
threads) and of the other processes (the worker processes; Corral's manager too, also
apart), and with ``corral-processes`` the bytes of outputs copied between workers (the
manager's ``status()["storage"]``). Also printed: the number of tasks of the lowered
graph, the time dask takes to lower it, and what pickling a partition costs (the events
frames cross processes in a shuffle). With ``--profile PATH``, every ``corral-get`` run
is profiled with cProfile in all of this process's threads (the client, the cluster's
event loop, the executor threads: the threads started while it runs); the merged stats
go to PATH and the top functions are printed. C calls that release the GIL (``poll``,
``pread``, pyarrow's) count the time spent waiting to take it back.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pickle
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import psutil
from dask._expr import FinalizeCompute
from dask.base import collections_to_expr

import runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_processes import manager_and_workers

SYSTEMS = ("threaded", "threaded-tasks", "distributed", "corral-get", "corral-processes")


def make_events(i: int, rows: int, users: int) -> pd.DataFrame:
    rng = np.random.default_rng(i)
    start = pd.Timestamp("2026-01-01") + pd.Timedelta(days=i)
    ms = np.sort(rng.integers(0, 86_400_000, rows))
    return pd.DataFrame(
        {
            "user_id": rng.integers(0, users, rows),
            "ts": start + pd.to_timedelta(ms, unit="ms"),
            "amount": rng.gamma(2.0, 10.0, rows),
            "category": rng.integers(0, 50, rows).astype("int32"),
            "score": rng.normal(size=rows),
        },
        index=pd.RangeIndex(i * rows, (i + 1) * rows),
    )


def make_users(i: int, users: int) -> pd.DataFrame:
    rng = np.random.default_rng(10_000 + i)
    n = users // 4
    return pd.DataFrame(
        {
            "user_id": np.arange(i * n, (i + 1) * n),
            "segment": rng.integers(0, 8, n).astype("int16"),
            "age": rng.integers(18, 90, n).astype("int16"),
        }
    )


def roll(df: pd.DataFrame) -> pd.DataFrame:
    s = df.set_index("ts")["amount"].rolling("1h").mean()
    return pd.DataFrame({"roll_mean": s.to_numpy(), "category": df["category"].to_numpy()})


def build(partitions: int, rows: int, users: int) -> tuple[Any, ...]:
    """The four outputs, fresh collections (fresh keys) on every call."""
    divisions = [i * rows for i in range(partitions)] + [partitions * rows - 1]
    ev = dd.from_map(make_events, range(partitions), rows=rows, users=users, divisions=divisions)
    us = dd.from_map(make_users, range(4), users=users)
    per_user = ev.groupby("user_id").agg(
        {"amount": ["sum", "mean", "count"], "score": ["std", "max"]}
    )
    per_user.columns = ["amt_sum", "amt_mean", "n", "score_std", "score_max"]
    joined = ev.merge(us, on="user_id", how="inner")
    seg = joined.groupby(["segment", "category"]).agg(
        {"amount": "sum", "score": "mean", "age": "mean"}
    )
    rolled = ev.map_partitions(roll, meta={"roll_mean": "f8", "category": "i4"})
    roll_feat = rolled.groupby("category").roll_mean.agg(["mean", "max"])
    r2 = ev["amount"].rolling(1000).mean().sum()
    return per_user, seg, roll_feat, r2


def check(ref: tuple[Any, ...], got: tuple[Any, ...], system: str) -> None:
    """Raise if ``got`` differs from the threaded scheduler's ``ref``."""
    for name, a, b in zip(("per_user", "seg", "roll_feat", "rolling"), ref, got, strict=True):
        if isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a.sort_index(), b.sort_index(), obj=f"{system} {name}")
        elif not np.isclose(a, b, rtol=1e-9):
            raise AssertionError(f"{system} {name}: {b!r}, the threaded scheduler gave {a!r}")


@contextmanager
def profiled(path: str | None) -> Iterator[None]:
    """cProfile in this thread and in every thread started meanwhile (``threading.setprofile``
    starts one profiler per new thread); the merged stats are added to ``path``."""
    if path is None:
        yield
        return
    profiles: list[cProfile.Profile] = []

    def start_in_thread(*_: object) -> None:
        p = cProfile.Profile()
        profiles.append(p)
        p.enable()  # replaces this hook in the new thread

    main = cProfile.Profile()
    profiles.append(main)
    threading.setprofile(start_in_thread)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.setprofile(None)
        stats = pstats.Stats(main)
        for p in profiles[1:]:
            p.disable()  # only stops it if still on in this thread; stats are kept
            with suppress(TypeError):  # a thread that made no call
                stats.add(p)
        if os.path.exists(path):
            stats.add(path)
        stats.dump_stats(path)


def cpu(pids: list[int]) -> float:
    """CPU seconds (user and system) of the processes ``pids`` and their children, or of
    this process (all its threads) for none."""
    if not pids:
        t = os.times()
        return t.user + t.system
    total = 0.0
    for pid in pids:
        proc = psutil.Process(pid)
        for p in (proc, *proc.children(recursive=True)):
            with suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
    return total


async def fetched_bytes(address: str) -> int:
    """Bytes of outputs Corral's manager has had copied between workers so far."""
    async with runtime.Cluster(address) as c:
        return int((await c.status())["storage"]["transfer_bytes"].get("fetch", 0))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def sizes(partitions: int, rows: int, users: int) -> None:
    """What the data and the graph are: partition size, pickling cost, task count."""
    part = make_events(0, rows, users)
    nbytes = int(part.memory_usage(deep=True).sum())
    blob, dumps = timed(lambda: pickle.dumps(part, protocol=5))
    _, loads = timed(lambda: pickle.loads(blob))

    def tasks(method: str) -> int:
        with dask.config.set({"dataframe.shuffle.method": method}):
            expr = FinalizeCompute(collections_to_expr(build(partitions, rows, users)))
            return len(expr.optimize().__dask_graph__())

    ntasks, lower = timed(lambda: tasks("tasks"))
    print(
        f"data: {partitions} x {rows:,} rows of events, {nbytes / 2**20:.1f} MiB a partition "
        f"({partitions * nbytes / 2**20:.0f} MiB); pickle a partition: dumps {dumps * 1e3:.1f} ms,"
        f" loads {loads * 1e3:.1f} ms, {len(blob) / 2**20:.1f} MiB\n"
        f"graph: {ntasks} tasks with the task shuffle (Corral's; {lower:.2f} s to lower and "
        f"optimize here), {tasks('disk')} with the disk shuffle (the threaded scheduler's)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rows", type=int, default=250_000, help="rows per partition")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--profile", metavar="PATH", help="cProfile the corral-get runs")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    if unknown := set(systems) - set(SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
    if args.users % 4 or args.users < 4:
        parser.error("--users must be a positive multiple of 4 (4 partitions of users)")
    if args.profile and os.path.exists(args.profile):
        os.remove(args.profile)
    print(
        f"python {sys.version.split()[0]}, dask {dask.__version__}, pandas {pd.__version__}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    sizes(args.partitions, args.rows, args.users)

    def build_() -> tuple[Any, ...]:
        return build(args.partitions, args.rows, args.users)

    runners: dict[str, Callable[[], Any]] = {}
    pids: dict[str, list[int]] = {}  # the worker processes of a system
    address = ""

    def fetched() -> int:
        return anyio.run(fetched_bytes, address) if address else 0

    with ExitStack() as stack:
        runners["threaded"] = lambda: dask.compute(*build_(), scheduler="threads", num_workers=2)

        def threaded_tasks() -> Any:
            with dask.config.set({"dataframe.shuffle.method": "tasks"}):
                return dask.compute(*build_(), scheduler="threads", num_workers=2)

        runners["threaded-tasks"] = threaded_tasks
        if "distributed" in systems:
            from distributed import Client, LocalCluster

            t0 = time.perf_counter()
            lc = stack.enter_context(LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                silence_logs=50))  # fmt: skip
            client = stack.enter_context(Client(lc, set_as_default=False))
            print(f"distributed start-up: {time.perf_counter() - t0:.2f} s", flush=True)
            runners["distributed"] = lambda: tuple(client.compute(list(build_()), sync=True))
            pids["distributed"] = list(client.run(os.getpid).values())
        if "corral-get" in systems:
            runners["corral-get"] = lambda: dask.compute(
                *build_(), scheduler=runtime.get, num_workers=2
            )
        if "corral-processes" in systems:
            home = stack.enter_context(tempfile.TemporaryDirectory())
            os.environ["CORRAL_HOME"] = home
            t0 = time.perf_counter()
            two = [["--cores", "1"], ["--cores", "1"]]
            address, workers = stack.enter_context(
                manager_and_workers(home, two, manager=["--no-monitoring"])
            )
            print(f"corral-processes start-up: {time.perf_counter() - t0:.2f} s", flush=True)
            runners["corral-processes"] = lambda: dask.compute(
                *build_(), scheduler=runtime.get, address=address
            )
            manager = [p.pid for p in psutil.Process().children() if "manager" in p.cmdline()]
            pids["corral-processes"] = [w.pid for w in workers] + manager
            pids["corral-manager"] = manager
        ref, _ = timed(runners["threaded"])  # a warm-up, and the reference
        walls: dict[str, list[float]] = {s: [] for s in systems}
        cpus: dict[str, list[tuple[float, float]]] = {s: [] for s in systems}
        for _ in range(args.repeat):
            for s in systems:
                prof = args.profile if s == "corral-get" else None
                mgr = cpu(pids["corral-manager"]) if s == "corral-processes" else 0.0
                here, there, moved = cpu([]), cpu(pids.get(s, [])), fetched()
                with profiled(prof):
                    got, wall = timed(runners[s])
                here = cpu([]) - here
                there = cpu(pids[s]) - there if s in pids else 0.0
                moved = fetched() - moved if s == "corral-processes" else 0
                mgr = cpu(pids["corral-manager"]) - mgr if s == "corral-processes" else 0.0
                check(ref, got, s)
                walls[s].append(wall)
                cpus[s].append((here, there))
                fetch = (
                    f" (manager {mgr:.2f}), {moved / 2**20:.0f} MiB fetched between workers"
                    if moved
                    else ""
                )
                print(f"  {s:<17} {wall:7.2f} s; CPU s: this process {here:.2f}, other "
                      f"processes {there:.2f}{fetch}", flush=True)  # fmt: skip
    base = min(walls["threaded"]) if walls.get("threaded") else None
    print(f"system             best (s)  /threaded  CPU s (here+others)  every run (s); "
          f"load average now {os.getloadavg()[0]:.1f}")  # fmt: skip
    for s in systems:
        ratio = f"{min(walls[s]) / base:8.2f}x" if base else "        -"
        runs = " ".join(f"{w:.2f}" for w in walls[s])
        here, there = cpus[s][walls[s].index(min(walls[s]))]
        print(f"{s:<17} {min(walls[s]):9.2f}  {ratio}  {here:8.2f}+{there:<10.2f}  {runs}")
    print("every result equal to the threaded scheduler's")
    if args.profile:
        print(f"\ncProfile of the corral-get runs, all threads (in {args.profile}):")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
