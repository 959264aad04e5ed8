"""Worker memory under pressure: Corral beside dask.distributed, in the same run.

Three cases, each a dask array computation sized well beyond the workers' memory:

- ``mean``: ``(x + x.T).mean()`` over a random ``--size`` x ``--size`` float64 array
  (default 20,000: 3.2 GB in ``--chunk`` x ``--chunk`` chunks, default 2,000: 32 MB);
- ``stack``: ``da.stack([a, b]).sum(axis=0).mean()`` over two random ``--size`` x
  ``--size / 2`` arrays (default two 1.6 GB arrays);
- ``persist``: ``y = x.persist()`` of a square random array of ``--persist-factor``
  (default 1.5) times the workers' combined pause threshold (``workers x 0.8 x
  --limit``, rounded up to whole chunks: 2.59 GB at the defaults), then
  ``y.sum().compute()``. Users report dask.distributed hanging for ever here.
- the loader cases, a memory-bound user's read_parquet-shaped graphs as
  ``dask.delayed``: ``--loads`` (default 80) loaders, each making a float64 array of
  50-150 MB (``load_elements``), consumed by reductions that free them:
  ``loads-pairwise`` (pairs of loads reduced together, then a binary tree),
  ``loads-wide`` (sum each load, then one combine of all the sums) and
  ``loads-fanout`` (every 10th load feeds 10 slices, the others one sum: an unbalanced
  fan-out). Their result is checked exactly, not within 1%.

Systems, each with ``--workers`` (default 2) worker processes of one thread and
``--limit`` (default 1 GiB) of memory each, the scheduler and the client in the
process that runs the case:

- ``dask-queuing-on``: ``LocalCluster(n_workers, threads_per_worker=1, memory_limit,
  processes=True)`` with ``distributed.scheduler.worker-saturation`` 1.1 (dask's
  default) and dask's default memory fractions set explicitly (target 0.6, spill 0.7,
  pause 0.8, terminate 0.95); a sync ``Client``; ``client.compute`` /
  ``client.persist``, which optimize the graph as ``dask.compute`` does;
- ``dask-queuing-off``: the same with worker-saturation ``inf``;
- ``corral``: ``Cluster(processes=n, threads_per_worker=1, memory_per_worker=limit,
  gc_threshold=50_000)``;
  the collection is optimized with ``dask.optimize`` (what ``dask.compute`` does before
  calling a scheduler) and run with ``await cluster.compute(graph, keys)``. Persist is
  ``submit_graph`` of the optimized array, a wait on every future, then ``compute`` of
  the sum's graph without the persisted keys (they are on the cluster). When
  ``Cluster`` takes a ``memory_options`` keyword (Corral's memory management), it gets
  ``{"execution": "thread", "spill_dir": <the run's scratch directory>}``, so Corral's
  fences are its own defaults (printed at the start; ``--corral-option KEY=VALUE``
  overrides any setting); a Corral without that keyword runs without it, as a baseline;
- ``corral-process`` (not run unless named in ``--systems``): the same with
  ``"execution": "process"`` (tasks in child processes of the worker). It is reported
  as a clear error while ``Cluster`` has no ``memory_options``.

Method. Every (system, case) runs in a fresh child process (this script re-invoked with
``--one SYSTEM CASE``) in a session of its own, so no run's leftover memory, spill files
or hung cluster can touch the next; runs are interleaved (for each repeat, for each
case, every system) so drift on this shared machine hits all systems alike. The parent
process measures, from outside:

- **peak RSS per worker**: every ``--interval`` seconds (default 0.025) the RSS of each
  worker process, summed over its process tree (Corral's process execution mode runs
  tasks in the worker's children). Worker processes are the direct children of the run's
  process whose command line is ``python -m runtime worker ...`` (Corral) or
  ``multiprocessing.spawn ... spawn_main`` (dask's workers, started by nannies that live
  in the run's process; multiprocessing's resource tracker is not a worker). The process
  list is rescanned every 0.1 s, so workers that appear (dask restarts killed workers,
  Corral replaces crashed ones) are picked up and each counts as a worker of its own.
  Sampling runs from the start of the child process until the child reports its result.
- **worker deaths**: a worker process that ends before the result. For dask that is a
  nanny restart; the nanny's "exceeded 95% memory budget" lines in the run's stderr are
  counted too.
- **disk peak**: the largest size of the run's scratch directory (dask's
  ``local_directory``, Corral's ``spill_dir`` when it has one), sampled every 0.5 s.
- the RSS of the run's own process (scheduler, client), as ``main``.
- for ``persist``, the peak while persisting and after it (the sum), split at the moment
  the run's process reports the persist done (in the table's notes).

The run's process measures **wall time** (from before graph optimization and submission
to the result in hand; persist: persist, wait, sum; cluster start-up is timed apart and
not included) and **bytes spilled** as each system counts them: dask, polled every second
with ``client.run`` on every worker, the spill buffer's cumulative ``disk-write`` bytes
(``SpillBuffer.cumulative_metrics``; ``spilled_total.disk`` if that is missing), the
largest value seen per worker, summed over workers; Corral, likewise from ``await
cluster.status()`` polled every second, ``status["memory"][worker]["spilled_total"]``
(bytes ever spilled), or ``n/a`` when the status has no such figures. Both count bytes
written, so data read back and spilled again counts again: the figure can exceed the
input. Each poll is also sent to the parent at once, so a run killed by the harness
still shows the last figures.

Outcome of a run: ``finished`` (a result, checked against the expected value within
1%), ``clear error`` (an exception with a message reached the caller; also a wrong
result), ``hang`` (no result within ``--timeout`` seconds, default 180, from the end of
cluster start-up) or ``OOM``: a worker's sampled RSS went above ``--limit``, a worker
died with its RSS near the limit or its nanny logged the memory restart, or the harness
killed the run because a worker went above ``--guard`` x limit (default 2.0x; this keeps
a runaway run from eating the machine; the run is also killed if the machine has less
than 2 GiB available). An OOM's notes say what the run did besides (``then: finished``,
``then: killed``...); an OOM run that returned the right result still has a wall time.
A hung or guarded run is killed: the run's process group with SIGKILL, then every
worker process it started (Corral's have sessions of their own).

Judged per case, Corral (and ``corral-process``) against ``dask-queuing-on``: Corral
never exceeds a worker's limit, never hangs, its peak worker RSS is at most dask's, at
no more than 1.2x dask's wall time. With ``--repeat`` above 1 a system's peak is the
largest over its runs, its wall time the best of the runs that returned the right
result, its outcome the worst.

Caveats:

- Sampling every 25 ms (and in practice a few ms more on a busy machine: the achieved
  mean and largest gaps are in the JSON) can miss a peak shorter than that; the OS's
  own high-water mark is not used because it covers the process's whole life. dask's
  nanny samples every 100 ms and terminates at 95%, so a fast allocation can take a dask
  worker above its limit before the nanny sees it: that counts as OOM here too.
- RSS includes each worker's interpreter and imported libraries (about 60-100 MB) and
  memory freed by Python but kept by the allocator. Summing a process tree counts pages
  shared between processes (libraries mapped by a worker and by its task processes)
  once per process.
- dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (glibc then gives
  freed memory back sooner); Corral's workers run with the environment they inherit.
  ``--malloc-trim`` sets the same for the run's process and so for Corral's workers.
- This machine is shared: other work competes for the two cores (the load averages
  before and after each run are in the JSON), so wall times drift run to run; compare
  ratios, and repeat.

    python benchmarks/memory.py                                  # defaults, a few minutes
    python benchmarks/memory.py --size 8000 --timeout 60         # quick check
    python benchmarks/memory.py --systems corral,dask-queuing-on,corral-process
    python benchmarks/memory.py --cases persist --repeat 3 --json out.json
    python benchmarks/memory.py --cases loads-pairwise,loads-wide,loads-fanout --loads 120
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

#: The checkout this script belongs to. Runs import Corral from it (also the worker
#: processes, through PYTHONPATH), whether or not the package is installed.
ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("runtime") is None:
    sys.path.insert(0, str(ROOT))

SYSTEMS = ("dask-queuing-on", "dask-queuing-off", "corral", "corral-process")
DEFAULT_SYSTEMS = ("dask-queuing-on", "dask-queuing-off", "corral")
CASES = ("mean", "stack", "persist", "loads-pairwise", "loads-wide", "loads-fanout")
#: The loader cases (``loads-*``): ``--loads`` loaders, each an array of 50-150 MB.
LOAD_CASES = ("loads-pairwise", "loads-wide", "loads-fanout")
#: dask's default worker memory fractions, set explicitly for both dask systems.
DASK_MEMORY = {"target": 0.6, "spill": 0.7, "pause": 0.8, "terminate": 0.95}
#: Corral may take at most this many times dask-queuing-on's wall time.
WALL_TARGET = 1.2
#: The run is killed if the machine has less than this available.
MACHINE_RESERVE = 2 * 2**30
#: Seconds a run's process has to start its cluster, and to exit after its result.
STARTUP_TIMEOUT = 180.0
EXIT_GRACE = 60.0
#: Extra seconds the parent waits beyond ``--timeout`` for the child's own hang report.
HANG_GRACE = 30.0
RESTART_LINE = re.compile(r"exceeded \d+% memory budget")
GIB = 2**30


def source_digest() -> str:
    """A digest of Corral's sources as run (they change while the memory work lands)."""
    digest = hashlib.sha256()
    for package in ("runtime", "actors", "policies", "transport"):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def parse_size(text: str) -> int:
    from runtime.client import parse_bytes

    return parse_bytes(text)


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f}"


# ----------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Sizes:
    size: int
    chunk: int
    persist_side: int
    loads: int = 80

    def nbytes(self, case: str) -> int:
        if case in LOAD_CASES:
            return sum(load_elements(i) * 8 for i in range(self.loads))
        if case == "persist":
            return self.persist_side**2 * 8
        return self.size * self.size * 8  # mean: one n x n array; stack: two n x n/2


def sizes_of(args: argparse.Namespace) -> Sizes:
    pause_total = args.workers * DASK_MEMORY["pause"] * args.limit
    target = args.persist_factor * pause_total
    side = math.ceil(math.sqrt(target / 8) / args.chunk) * args.chunk
    return Sizes(args.size, args.chunk, side, args.loads)


def load_elements(i: int) -> int:
    """Float64 elements of loader ``i``'s array: 50-150 MB, varying with ``i``."""
    return (50 + (i * 37) % 101) * 1_000_000 // 8


def load(i: int) -> Any:
    """A loader (a read_parquet-like task): a large array made of nothing."""
    import numpy as np

    return np.full(load_elements(i), float(i % 7 + 1))


def total_of(a: Any) -> float:
    return float(a.sum())


def pair_total(a: Any, b: Any) -> float:
    return float(a.sum()) + float(b.sum())


def add(a: float, b: float) -> float:
    return a + b


def combine(*parts: float) -> float:
    return float(sum(parts))


def slice_total(a: Any, j: int, n: int) -> float:
    return float(a[j::n].sum())


def build_loads(case: str, loads: int) -> tuple[Any, float]:
    """The loader cases: user read_parquet-shaped graphs, as dask.delayed."""
    from dask import delayed

    expected = float(sum(load_elements(i) * (i % 7 + 1) for i in range(loads)))
    arrays = [delayed(load, pure=True)(i, dask_key_name=f"load-{i}") for i in range(loads)]
    if case == "loads-wide":  # sum each, then combine all
        sums = [delayed(total_of)(a, dask_key_name=f"sum-{i}") for i, a in enumerate(arrays)]
        return delayed(combine)(*sums, dask_key_name="combine"), expected
    if case == "loads-pairwise":  # pairs of loads reduced together, then a binary tree
        level = [
            delayed(pair_total)(arrays[i], arrays[i + 1], dask_key_name=f"pair-{i}")
            if i + 1 < loads
            else delayed(total_of)(arrays[i], dask_key_name=f"pair-{i}")
            for i in range(0, loads, 2)
        ]
        depth = 0
        while len(level) > 1:
            depth += 1
            level = [
                delayed(add)(level[i], level[i + 1], dask_key_name=f"tree-{depth}-{i}")
                if i + 1 < len(level)
                else level[i]
                for i in range(0, len(level), 2)
            ]
        return level[0], expected
    # loads-fanout: every 10th load feeds 10 slices, the others one sum: unbalanced
    parts = []
    for i, a in enumerate(arrays):
        if i % 10 == 0:
            parts += [
                delayed(slice_total)(a, j, 10, dask_key_name=f"slice-{i}-{j}") for j in range(10)
            ]
        else:
            parts.append(delayed(total_of)(a, dask_key_name=f"sum-{i}"))
    return delayed(combine)(*parts, dask_key_name="combine"), expected


def build(case: str, sizes: Sizes) -> tuple[Any, float]:
    """The case's collection (for persist: the array to persist) and its expected value."""
    if case in LOAD_CASES:
        return build_loads(case, sizes.loads)
    import dask.array as da

    n, c = sizes.size, (sizes.chunk, sizes.chunk)
    if case == "mean":
        x = da.random.random((n, n), chunks=c)
        return (x + x.T).mean(), 1.0
    if case == "stack":
        a = da.random.random((n, n // 2), chunks=c)
        b = da.random.random((n, n // 2), chunks=c)
        return da.stack([a, b]).sum(axis=0).mean(), 1.0
    m = sizes.persist_side
    return da.random.random((m, m), chunks=c), m * m / 2


def check_value(value: Any, expected: float, exact: bool = False) -> float:
    """The value, checked within 1% (random arrays), or exactly (the loader cases)."""
    got = float(value)
    if not math.isfinite(got) or abs(got - expected) > (0 if exact else 0.01 * abs(expected)):
        raise AssertionError(f"wrong result: got {got!r}, expected about {expected!r}")
    return got


# ----------------------------------------------------------------------------- child side


class Reporter:
    """JSON lines to the parent, one per event, flushed at once."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (kept open for the run)
        self.lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        with self.lock:
            self.file.write(json.dumps({"event": event, **fields}, default=repr) + "\n")
            self.file.flush()


def jsonable(obj: Any, depth: int = 0) -> Any:
    """Status dicts (with message dataclasses and tuple keys) as plain JSON values."""
    if depth > 8:
        return repr(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v, depth + 1) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return repr(obj)


def corral_spill(status: Any) -> dict[str, dict[str, int]] | None:
    """Per worker: bytes ever spilled and bytes on disk now, from ``cluster.status()``.

    ``status["memory"][worker]`` has ``spilled_total`` (ever) and ``spilled_bytes`` (now);
    ``None`` when the status has no ``memory`` entry (a Corral without spilling); empty
    while no worker has reported (they report once they spill or throttle).
    """
    memory = status.get("memory") if isinstance(status, dict) else None
    if not isinstance(memory, dict):
        return None  # no memory reports at all: this Corral does not spill
    out = {}
    for worker, m in memory.items():
        if not isinstance(m, dict) or not ({"spilled_total", "spilled_bytes"} & set(m)):
            continue
        on_disk = int(m.get("spilled_bytes") or 0)
        out[str(worker)] = {"written": int(m.get("spilled_total") or on_disk), "on_disk": on_disk}
    return out


def merge_spill(
    seen: dict[str, dict[str, int]], now: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Keep the largest figures seen per worker (a worker that died keeps its last)."""
    for worker, figures in now.items():
        old = seen.setdefault(worker, {"written": 0, "on_disk": 0})
        old["written"] = max(old["written"], figures["written"])
        old["on_disk"] = max(old["on_disk"], figures["on_disk"])
    return seen


def _dask_spill_stats(dask_worker: Any) -> dict[str, Any]:
    """Runs on each dask worker: what its spill buffer wrote to disk so far."""
    data = dask_worker.data
    metrics = getattr(data, "cumulative_metrics", None) or {}
    written = metrics.get(("disk-write", "bytes"))
    total = getattr(data, "spilled_total", None)
    on_disk = int(total.disk) if total is not None else 0
    return {
        "written": None if written is None else int(written),
        "on_disk": on_disk,
        "status": str(getattr(dask_worker, "status", "")),
        "pid": os.getpid(),
    }


def run_dask(args: argparse.Namespace, case: str, report: Reporter) -> None:
    import logging

    import dask
    from distributed import Client, LocalCluster, wait

    queuing = args.one[0] == "dask-queuing-on"
    config = {
        "distributed.scheduler.worker-saturation": 1.1 if queuing else float("inf"),
        **{f"distributed.worker.memory.{k}": v for k, v in DASK_MEMORY.items()},
    }
    sizes = sizes_of(args)
    spill: dict[str, dict[str, int]] = {}  # worker address -> largest figures seen
    statuses: dict[str, str] = {}  # worker address -> its status at the last poll
    stop = threading.Event()

    with dask.config.set(config):
        start = time.perf_counter()
        cluster = LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=args.limit,
            dashboard_address=None,
            local_directory=str(Path(args.scratch) / "dask"),
            silence_logs=logging.WARNING,  # the nanny's memory-restart warning reaches stderr
        )
        client = Client(cluster)
        client.wait_for_workers(args.workers, timeout=STARTUP_TIMEOUT)
        report.write("ready", startup_s=time.perf_counter() - start, config=config)

        def poll_once() -> None:
            stats = client.run(_dask_spill_stats, on_error="ignore")
            merge_spill(
                spill,
                {
                    addr: {"written": st["written"] or st["on_disk"], "on_disk": st["on_disk"]}
                    for addr, st in stats.items()
                },
            )
            statuses.update({addr: st["status"] for addr, st in stats.items()})
            report.write(
                "poll",
                spilled_bytes=sum(f["written"] for f in spill.values()),
                worker_status=statuses,
            )

        def poll() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    poll_once()
                stop.wait(1.0)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        collection, expected = build(case, sizes)
        deadline = time.perf_counter() + args.timeout
        phases: dict[str, float] = {}
        outcome, value, error = "finished", None, None
        t0 = time.perf_counter()
        try:
            if case == "persist":
                y = client.persist(collection)
                wait(y, timeout=args.timeout)
                phases["persist_s"] = time.perf_counter() - t0
                report.write("phase", name="persisted")
                fut = client.compute(y.sum())
            else:
                fut = client.compute(collection)
            value = check_value(
                fut.result(timeout=max(0.0, deadline - time.perf_counter())),
                expected,
                case in LOAD_CASES,
            )
        except TimeoutError:
            outcome = "hang"
        except Exception as exc:
            outcome, error = "error", f"{type(exc).__name__}: {exc}"
        wall = time.perf_counter() - t0
        stop.set()
        poller.join(timeout=5)
        if outcome != "hang":
            with contextlib.suppress(Exception):
                poll_once()
        result = {
            "outcome": outcome,
            "wall_s": wall,
            "phases": phases,
            "value": value,
            "error": error,
            "spill": spill,
            "spilled_bytes": sum(s["written"] for s in spill.values()),
            "worker_status": statuses,
        }
        if outcome == "hang":
            report.write("result", **result)
            os._exit(3)  # a hung cluster may not close; the parent kills what is left
        with contextlib.suppress(Exception):
            result["restart_events"] = len(client.get_events("worker-restart-memory"))
        report.write("result", **result)
        client.close(timeout=30)
        cluster.close(timeout=30)


def corral_kwargs(args: argparse.Namespace, system: str) -> tuple[dict[str, Any], str | None]:
    """Cluster keywords, and why memory_options were not passed (None if they were)."""
    from runtime import Cluster

    kwargs: dict[str, Any] = {
        "processes": args.workers,
        "threads_per_worker": 1,
        "memory_per_worker": args.limit,
    }
    if "gc_threshold" in inspect.signature(Cluster).parameters:
        kwargs["gc_threshold"] = 50_000  # opt-in now; earlier runs had it by default

    if "memory_options" not in inspect.signature(Cluster).parameters:
        return kwargs, "Cluster has no memory_options keyword (yet)"
    options: dict[str, Any] = {
        "execution": "process" if system == "corral-process" else "thread",
        "spill_dir": str(Path(args.scratch or tempfile.gettempdir()) / "corral-spill"),
    }
    for item in args.corral_option:
        key, _, text = item.partition("=")
        try:
            options[key] = json.loads(text)
        except ValueError:
            options[key] = text
    kwargs["memory_options"] = options
    return kwargs, None


def corral_effective(args: argparse.Namespace, system: str) -> str:
    """Corral's memory settings as its workers will use them, for the header."""
    kwargs, missing = corral_kwargs(args, system)
    if missing:
        return missing
    try:
        from actors.memory import MemoryConfig

        config = MemoryConfig.of(args.limit, kwargs["memory_options"])
        shown = {k: v for k, v in config.options().items() if k != "spill_dir"}
        return ", ".join(f"{k}={v}" for k, v in shown.items())
    except Exception as exc:
        return f"cannot read them ({type(exc).__name__}: {exc})"


async def corral_case(
    cluster: Any, case: str, sizes: Sizes, phases: dict[str, float], report: Reporter
) -> float:
    import dask
    from dask.core import flatten

    collection, expected = build(case, sizes)
    t0 = time.perf_counter()
    (optimized,) = dask.optimize(collection)
    if case != "persist":
        (value,) = await cluster.compute(optimized.__dask_graph__(), optimized.__dask_keys__())
        return check_value(value, expected, case in LOAD_CASES)
    keys = list(flatten(collection.__dask_keys__()))
    futures = await cluster.submit_graph(optimized.__dask_graph__(), keys)
    try:
        for fut in futures:
            await fut.wait()
        for fut in futures:
            if fut.status != "finished":
                exc = await fut.exception()
                raise exc if exc is not None else RuntimeError(f"{fut.key!r}: {fut.status}")
        phases["persist_s"] = time.perf_counter() - t0
        report.write("phase", name="persisted")
        total = collection.sum()
        persisted = set(keys)
        graph = {k: v for k, v in dict(total.__dask_graph__()).items() if k not in persisted}
        (value,) = await cluster.compute(graph, total.__dask_keys__())
        return check_value(value, expected)
    finally:
        for fut in futures:
            fut.release()


def run_corral(args: argparse.Namespace, case: str, report: Reporter) -> None:
    import anyio

    from runtime import Cluster

    system = args.one[0]
    kwargs, missing = corral_kwargs(args, system)
    if missing and system == "corral-process":
        report.write("ready", startup_s=0.0, kwargs=jsonable(kwargs))
        report.write(
            "result",
            outcome="error",
            wall_s=None,
            error=f"corral-process not run: {missing}",
            spilled_bytes=None,
        )
        return
    sizes = sizes_of(args)
    polled: dict[str, Any] = {"spill": None, "status": None}

    async def poll(cluster: Any) -> None:
        while True:
            with contextlib.suppress(Exception):
                status = await cluster.status()
                polled["status"] = status
                spill = corral_spill(status)
                if spill is not None:
                    polled["spill"] = merge_spill(polled["spill"] or {}, spill)
                memory = status.get("memory") or {}
                report.write(
                    "poll",
                    spilled_bytes=None
                    if polled["spill"] is None
                    else sum(f["written"] for f in polled["spill"].values()),
                    throttled=status.get("throttled"),
                    corral_rss={w: m.get("rss") for w, m in memory.items()},
                    tasks_by_state=status.get("tasks_by_state"),
                )
            await anyio.sleep(1.0)

    async def main() -> None:
        start = time.perf_counter()
        async with Cluster(**kwargs) as cluster:
            await cluster.wait_for_workers(args.workers, STARTUP_TIMEOUT)
            report.write(
                "ready",
                startup_s=time.perf_counter() - start,
                kwargs=jsonable(kwargs),
                memory_options=missing or "passed",
            )
            phases: dict[str, float] = {}
            outcome, value, error = "hang", None, None
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll, cluster)
                with anyio.move_on_after(args.timeout):
                    try:
                        value = await corral_case(cluster, case, sizes, phases, report)
                        outcome = "finished"
                    except Exception as exc:
                        outcome, error = "error", f"{type(exc).__name__}: {exc}"
                wall = time.perf_counter() - t0
                tg.cancel_scope.cancel()
            status = polled["status"]
            if outcome != "hang":
                with contextlib.suppress(Exception):
                    status = await cluster.status()
                    spill = corral_spill(status)
                    if spill is not None:
                        polled["spill"] = merge_spill(polled["spill"] or {}, spill)
            report.write(
                "result",
                outcome=outcome,
                wall_s=wall,
                phases=phases,
                value=value,
                error=error,
                spill=polled["spill"],
                spilled_bytes=None
                if polled["spill"] is None
                else sum(f["written"] for f in polled["spill"].values()),
                status=jsonable(status),
            )
            if outcome == "hang":
                os._exit(3)  # a hung cluster may not close; the parent kills what is left

    anyio.run(main)


def run_one(args: argparse.Namespace) -> int:
    system, case = args.one
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    report = Reporter(args.report)
    try:
        if system.startswith("dask"):
            run_dask(args, case, report)
        else:
            run_corral(args, case, report)
    except BaseException as exc:
        report.write("failed", error=f"{type(exc).__name__}: {exc}")
        raise
    report.write("closed")
    return 0


# ----------------------------------------------------------------------------- parent side


def is_worker(system: str, cmdline: list[str]) -> bool:
    if system.startswith("dask"):
        text = " ".join(cmdline)
        return "spawn_main" in text and "resource_tracker" not in text
    for i, arg in enumerate(cmdline[:-1]):
        if arg == "runtime" and cmdline[i + 1] == "worker":
            return True
    return bool(cmdline) and Path(cmdline[0]).name == "corral" and "worker" in cmdline[1:2]


@dataclasses.dataclass
class Tracked:
    """One worker process (and its descendants) as sampled from outside."""

    root: psutil.Process
    first_seen: float
    procs: list[psutil.Process]
    peak: int = 0
    last: int = 0
    ended_at: float | None = None


def tree_rss(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def dir_size(path: Path) -> int:
    total = 0
    stack = [path]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
    return total


class DiskWatch(threading.Thread):
    """The largest size of a directory, sampled every 0.5 s in a thread of its own (a
    scan of thousands of spill files must not delay the RSS samples)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.peak = max(self.peak, dir_size(self.path))

    def stop(self) -> int:
        self.done.set()
        self.join(timeout=30)
        return self.peak


def kill_tree(proc: subprocess.Popen[bytes], extra: list[psutil.Process]) -> None:
    """SIGKILL the run's process group, its descendants and the workers seen."""
    try:
        found = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        found = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    victims = {p.pid: p for p in [*found, *extra]}
    for p in victims.values():
        with contextlib.suppress(psutil.Error):
            p.kill()  # psutil checks the pid still names the process it saw
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    psutil.wait_procs(list(victims.values()), timeout=10)


def child_argv(args: argparse.Namespace, system: str, case: str, report: Path, scratch: Path):
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        system,
        case,
        "--report",
        str(report),
        "--scratch",
        str(scratch),
        "--size",
        str(args.size),
        "--chunk",
        str(args.chunk),
        "--limit",
        str(args.limit),
        "--workers",
        str(args.workers),
        "--timeout",
        str(args.timeout),
        "--persist-factor",
        str(args.persist_factor),
        "--loads",
        str(args.loads),
    ]
    for item in args.corral_option:
        argv += ["--corral-option", item]
    return argv


def read_events(path: Path, pos: int) -> tuple[list[dict[str, Any]], int]:
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return [], pos
    end = data.rfind(b"\n") + 1
    events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return events, pos + end


def measure(args: argparse.Namespace, system: str, case: str, rep: int) -> dict[str, Any]:
    """Run one (system, case) in a child process and sample it from here."""
    scratch = Path(tempfile.mkdtemp(prefix=f"corral-memory-{system}-{case}-"))
    report_path = scratch / "report.jsonl"
    log_path = scratch / "stderr.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if args.malloc_trim:
        env["MALLOC_TRIM_THRESHOLD_"] = "65536"
    run: dict[str, Any] = {
        "system": system,
        "case": case,
        "repeat": rep,
        "array_bytes": sizes_of(args).nbytes(case),
        "loadavg_before": os.getloadavg(),
    }
    tracked: list[Tracked] = []
    events: list[dict[str, Any]] = []
    timeline: list[tuple[float, list[int], int]] = []
    gaps: list[float] = []
    killed: str | None = None
    pos = 0
    disk = DiskWatch(scratch / "work")
    main_peak = 0
    ready_at: float | None = None
    result_at: float | None = None

    with open(log_path, "wb") as log:
        start = time.monotonic()
        proc = subprocess.Popen(
            child_argv(args, system, case, report_path, scratch / "work"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        disk.start()
        try:
            me = psutil.Process(proc.pid)
            next_scan = last = start
            while True:
                now = time.monotonic()
                gaps.append(now - last)
                last = now
                if now >= next_scan:
                    next_scan = now + 0.1
                    try:
                        kids = me.children()
                    except psutil.Error:
                        kids = []
                    known = {t.root.pid for t in tracked}
                    for kid in kids:
                        if kid.pid in known:
                            continue
                        with contextlib.suppress(psutil.Error):
                            if is_worker(system, kid.cmdline()):
                                tracked.append(Tracked(kid, now - start, [kid]))
                    for t in tracked:
                        if t.ended_at is not None:
                            continue
                        if not alive(t.root):
                            t.ended_at = now - start
                            continue
                        with contextlib.suppress(psutil.Error):
                            t.procs = [t.root, *t.root.children(recursive=True)]
                    if psutil.virtual_memory().available < MACHINE_RESERVE and not killed:
                        killed = "machine"
                if result_at is None:
                    rss = []
                    for t in tracked:
                        t.last = tree_rss(t.procs) if t.ended_at is None else 0
                        t.peak = max(t.peak, t.last)
                        rss.append(t.last)
                        if t.last > args.guard * args.limit and not killed:
                            killed = "guard"
                    main_now = 0
                    with contextlib.suppress(psutil.Error):
                        main_now = me.memory_info().rss
                    main_peak = max(main_peak, main_now)
                    timeline.append((now - start, rss, main_now))
                new, pos = read_events(report_path, pos)
                for ev in new:
                    ev["t"] = now - start
                    events.append(ev)
                    if ev["event"] == "ready":
                        ready_at = now
                    elif ev["event"] == "result":
                        result_at = now
                if proc.poll() is not None:
                    new, pos = read_events(report_path, pos)
                    events.extend({**ev, "t": now - start} for ev in new)
                    break
                if killed:
                    break
                if ready_at is None and now - start > STARTUP_TIMEOUT:
                    killed = "startup"
                    break
                if (
                    ready_at is not None
                    and result_at is None
                    and now - ready_at > args.timeout + HANG_GRACE
                ):
                    killed = "hang"
                    break
                if result_at is not None and now - result_at > EXIT_GRACE:
                    killed = "teardown"
                    break
                time.sleep(args.interval)
        finally:
            disk_peak = disk.stop()
            if proc.poll() is None or killed:
                kill_tree(proc, [p for t in tracked for p in t.procs])
            # Whatever the run's process left behind (it should have stopped them).
            leftovers = [p for t in tracked for p in t.procs if alive(p)]
            if leftovers:
                psutil.wait_procs(leftovers, timeout=10)
                for p in leftovers:
                    with contextlib.suppress(psutil.Error):
                        p.kill()

    log_text = log_path.read_text(errors="replace")
    shutil.rmtree(scratch, ignore_errors=True)
    by_name = {ev["event"]: ev for ev in events}
    result = by_name.get("result", {})
    last_poll = by_name.get("poll", {})  # the last one: the figures of a killed run
    marks = {ev["name"]: ev["t"] for ev in events if ev["event"] == "phase"}
    phase_peaks: dict[str, int] = {}
    if "persisted" in marks:
        cut = marks["persisted"]
        phase_peaks["persist"] = max(
            (max(r, default=0) for t, r, _ in timeline if t < cut), default=0
        )
        phase_peaks["after"] = max(
            (max(r, default=0) for t, r, _ in timeline if t >= cut), default=0
        )
    ready = by_name.get("ready", {})
    end_of_run = (result_at or time.monotonic()) - start
    deaths = [t for t in tracked if t.ended_at is not None and t.ended_at < end_of_run]
    restarts_logged = len(RESTART_LINE.findall(log_text))
    peaks = [t.peak for t in tracked]
    peak_max = max(peaks, default=0)

    if "outcome" in result:
        base = {"finished": "finished", "error": "clear error", "hang": "hang"}[result["outcome"]]
    elif killed == "hang":
        base = "hang"
    elif killed in ("guard", "machine"):
        base = "killed"
    elif "failed" in by_name:
        base = "clear error"
    else:
        base = "crashed"
    oom: list[str] = []
    if killed == "guard":
        oom.append(f"harness killed the run: a worker above {args.guard:g}x the limit")
    if killed == "machine":
        oom.append("harness killed the run: machine memory low")
    memory_deaths = [t for t in deaths if t.peak >= 0.9 * args.limit]
    if memory_deaths or restarts_logged:
        oom.append(f"{max(len(memory_deaths), restarts_logged)} worker(s) killed/restarted")
    if peak_max > args.limit:
        oom.append(f"peak RSS {gib(peak_max)} GiB above the limit")
    outcome = "OOM" if oom else base
    notes = [*oom]
    if oom:
        notes.append(f"then: {base}")
    other_deaths = len(deaths) - len(memory_deaths)
    if other_deaths > 0:
        notes.append(f"{other_deaths} worker(s) died below 90% of the limit")
    if phase_peaks:
        during, after = gib(phase_peaks["persist"]), gib(phase_peaks["after"])
        notes.append(f"peak while persisting {during}, after {after}")
    interval_max = max(gaps[1:], default=0.0)
    if interval_max > 4 * args.interval:
        notes.append(f"RSS sampling gap up to {interval_max * 1000:.0f} ms")
    if killed == "startup":
        notes.append("cluster did not start")
    if killed == "teardown":
        notes.append("did not exit after its result; killed")
    if result.get("error"):
        notes.append(result["error"][:300])
    if "failed" in by_name:
        notes.append(by_name["failed"]["error"][:300])

    # 0.25 s buckets of the largest sample, for the JSON.
    buckets: dict[int, tuple[float, list[int], int]] = {}
    for t, rss, main_rss in timeline:
        b = int(t / 0.25)
        prev = buckets.get(b)
        if prev is None:
            buckets[b] = (t, list(rss), main_rss)
        else:
            merged = [max(x, y) for x, y in zip(prev[1], rss, strict=False)]
            merged += rss[len(merged) :]
            buckets[b] = (prev[0], merged, max(prev[2], main_rss))
    run.update(
        outcome=outcome,
        result_ok=base == "finished",
        notes=notes,
        wall_s=result.get("wall_s") if base != "hang" else None,
        waited_s=result.get("wall_s"),
        phases=result.get("phases", {}),
        value=result.get("value"),
        startup_s=ready.get("startup_s"),
        peaks=peaks,
        peak_max=peak_max,
        limit=args.limit,
        worker_pids=[t.root.pid for t in tracked],
        worker_first_seen_s=[round(t.first_seen, 3) for t in tracked],
        worker_deaths=len(deaths),
        restarts_logged=restarts_logged,
        spilled_bytes=result.get("spilled_bytes", last_poll.get("spilled_bytes")),
        phase_marks_s=marks,
        phase_peaks=phase_peaks,
        last_poll=last_poll,
        disk_peak=disk_peak,
        main_peak=main_peak,
        killed_by_harness=killed,
        samples=len(timeline),
        interval_mean=sum(gaps[1:]) / max(1, len(gaps) - 1),
        interval_max=interval_max,
        loadavg_after=os.getloadavg(),
        child_report={k: v for k, v in result.items() if k not in ("status",)},
        corral_status=result.get("status"),
        ready=ready,
        timeline=[[round(t, 3), rss, m] for t, rss, m in buckets.values()],
    )
    if outcome != "finished":
        run["log_tail"] = log_text.splitlines()[-40:]
    return run


# ----------------------------------------------------------------------------- report

OUTCOME_RANK = {"finished": 0, "clear error": 1, "crashed": 2, "hang": 3, "OOM": 4}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several repeats of one (system, case): largest peak, worst outcome, and the best
    wall time of the runs that returned the right result (an OOM run may have)."""
    finished = [r["wall_s"] for r in runs if r["result_ok"] and r["wall_s"]]
    return {
        "outcome": max((r["outcome"] for r in runs), key=lambda o: OUTCOME_RANK.get(o, 5)),
        "peak_max": max(r["peak_max"] for r in runs),
        "wall_s": min(finished) if finished else None,
        "killed": any(r["killed_by_harness"] in ("guard", "machine") for r in runs),
    }


def table(rows: list[list[str]], header: list[str]) -> Iterator[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        cells = [
            str(c).ljust(w) if i in (0, len(row) - 1) else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        yield "  ".join(cells).rstrip()


def print_case(case: str, runs: list[dict[str, Any]], limit: int) -> None:
    header = [
        "system",
        "outcome",
        "wall s",
        "peak RSS per worker, GiB",
        "max/limit",
        "spilled GiB",
        "disk peak GiB",
        "deaths",
        "main GiB",
        "notes",
    ]
    rows = []
    for r in runs:
        label = r["system"] + (f" #{r['repeat']}" if r["repeat"] else "")
        peaks = "/".join(gib(p) for p in r["peaks"]) or "n/a"
        wall = r["wall_s"] if r["wall_s"] is not None else r["waited_s"]
        wall_text = "n/a" if wall is None else f"{wall:.1f}" + ("" if r["wall_s"] else "+")
        rows.append(
            [
                label,
                r["outcome"],
                wall_text,
                peaks,
                f"{r['peak_max'] / limit:.2f}",
                gib(r["spilled_bytes"]),
                gib(r["disk_peak"]),
                str(r["worker_deaths"]),
                gib(r["main_peak"]),
                "; ".join(r["notes"])[:240],
            ]
        )
    for line in table(rows, header):
        print("  " + line)


def verdicts(case: str, runs: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    by_system: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_system.setdefault(r["system"], []).append(r)
    if "dask-queuing-on" not in by_system:
        return []
    ref = summarize(by_system["dask-queuing-on"])
    out = []
    for system in ("corral", "corral-process"):
        if system not in by_system:
            continue
        ours = summarize(by_system[system])
        rss_ratio = ours["peak_max"] / ref["peak_max"] if ref["peak_max"] else None
        wall_ratio = ours["wall_s"] / ref["wall_s"] if ours["wall_s"] and ref["wall_s"] else None
        within = ours["peak_max"] <= limit and ours["outcome"] != "OOM"
        if ours["wall_s"] is None:
            wall_ok, wall_text = False, f"{system} returned no result"
        elif ref["wall_s"] is None:
            wall_ok, wall_text = True, "dask-queuing-on returned no result"
        else:
            wall_ok = wall_ratio is not None and wall_ratio <= WALL_TARGET
            wall_text = f"{wall_ratio:.2f}x"
        checks = [
            (
                "never exceeds a worker's limit",
                within,
                f"peak {gib(ours['peak_max'])} GiB of {gib(limit)}, outcome {ours['outcome']}",
            ),
            (
                "never hangs",
                # A run the harness killed for memory never showed whether it would hang.
                None if ours["killed"] and ours["outcome"] != "hang" else ours["outcome"] != "hang",
                f"outcome {ours['outcome']}"
                + (", killed by the harness before a result" if ours["killed"] else ""),
            ),
            (
                "peak RSS <= dask-queuing-on's",
                rss_ratio is not None and rss_ratio <= 1.0,
                "n/a" if rss_ratio is None else f"{rss_ratio:.2f}x",
            ),
            (f"wall <= {WALL_TARGET:g}x dask-queuing-on's", wall_ok, wall_text),
        ]
        out.append(
            {
                "system": system,
                "case": case,
                "peak_rss_ratio": rss_ratio,
                "wall_ratio": wall_ratio,
                "checks": [{"criterion": c, "pass": ok, "figure": f} for c, ok, f in checks],
            }
        )
    return out


def print_verdicts(found: list[dict[str, Any]]) -> None:
    for v in found:
        rss = "n/a" if v["peak_rss_ratio"] is None else f"{v['peak_rss_ratio']:.2f}x"
        wall = "n/a" if v["wall_ratio"] is None else f"{v['wall_ratio']:.2f}x"
        print(f"  {v['system']} / dask-queuing-on: peak RSS {rss}, wall {wall}")
        for c in v["checks"]:
            verdict = {True: "PASS", False: "FAIL", None: "n/a "}[c["pass"]]
            print(f"    {verdict}  {c['criterion']:<34} {c['figure']}")


# ----------------------------------------------------------------------------- main


def list_arg(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}")
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=20_000, help="array side (default 20000)")
    parser.add_argument("--chunk", type=int, default=2_000, help="chunk side (default 2000)")
    parser.add_argument(
        "--loads", type=int, default=80, help="loaders of the loads-* cases (default 80)"
    )
    parser.add_argument(
        "--limit", type=parse_size, default=GIB, help="memory per worker (default 1GiB)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds without result = hang (180)"
    )
    parser.add_argument(
        "--cases", type=list_arg(CASES), default=list(CASES), help=f"of {', '.join(CASES)}"
    )
    parser.add_argument(
        "--systems",
        type=list_arg(SYSTEMS),
        default=list(DEFAULT_SYSTEMS),
        help=f"of {', '.join(SYSTEMS)} (default: all but corral-process)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (default 1)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument(
        "--persist-factor",
        type=float,
        default=1.5,
        help="persist case: array size over the workers' combined pause threshold (1.5)",
    )
    parser.add_argument(
        "--guard",
        type=float,
        default=2.0,
        help="kill a run when a worker's RSS passes this many times the limit (2.0)",
    )
    parser.add_argument(
        "--interval", type=float, default=0.025, help="RSS sampling interval, s (0.025)"
    )
    parser.add_argument(
        "--corral-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one of Corral's memory_options (value read as JSON if it parses)",
    )
    parser.add_argument(
        "--malloc-trim",
        action="store_true",
        help="set MALLOC_TRIM_THRESHOLD_=65536 for every run (dask's nanny sets it anyway)",
    )
    parser.add_argument("--one", nargs=2, metavar=("SYSTEM", "CASE"), help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.one:
        return run_one(args)

    import dask
    import distributed

    from runtime import Cluster

    sizes = sizes_of(args)
    has_options = "memory_options" in inspect.signature(Cluster).parameters
    print(
        f"python {sys.version.split()[0]}, dask {dask.__version__}, distributed "
        f"{distributed.__version__}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / GIB:.0f} GiB; {args.workers} workers x 1 thread, "
        f"limit {gib(args.limit)} GiB each; timeout {args.timeout:g} s; sampling every "
        f"{args.interval * 1000:g} ms",
        flush=True,
    )
    digest = source_digest()
    print(f"  dask: {', '.join(f'{k} {v}' for k, v in DASK_MEMORY.items())}")
    print(f"  Corral sources (runtime, actors, policies, transport): sha256 {digest}")
    for system in [s for s in args.systems if s.startswith("corral")]:
        print(f"  {system}: {corral_effective(args, system)}", flush=True)
    for case in args.cases:
        print(f"  {case}: {gib(sizes.nbytes(case))} GiB of input", flush=True)
    runs: list[dict[str, Any]] = []
    total = args.repeat * len(args.cases) * len(args.systems)
    for rep in range(args.repeat):
        for case in args.cases:
            for system in args.systems:
                r = measure(args, system, case, rep + 1 if args.repeat > 1 else 0)
                runs.append(r)
                wall = r["wall_s"] if r["wall_s"] is not None else r["waited_s"]
                print(
                    f"[{len(runs)}/{total}] {system} {case}: {r['outcome']}, "
                    f"{'n/a' if wall is None else f'{wall:.1f} s'}, peak "
                    f"{'/'.join(gib(p) for p in r['peaks'])} GiB, load "
                    f"{r['loadavg_after'][0]:.1f}",
                    flush=True,
                )

    found = []
    for case in args.cases:
        case_runs = [r for r in runs if r["case"] == case]
        print(f"\n{case} ({gib(sizes.nbytes(case))} GiB of input, limit {gib(args.limit)} GiB)")
        print_case(case, case_runs, args.limit)
        v = verdicts(case, case_runs, args.limit)
        print_verdicts(v)
        found.extend(v)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k != "json"},
                    "versions": {
                        "python": sys.version,
                        "dask": dask.__version__,
                        "distributed": distributed.__version__,
                    },
                    "corral_memory_options": has_options,
                    "corral_source_digest": digest,
                    "sizes": dataclasses.asdict(sizes),
                    "runs": runs,
                    "verdicts": found,
                },
                indent=1,
                default=str,
            )
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
