"""One large value between processes: Corral beside dask.distributed.

Each system runs a manager/scheduler and two worker processes (one thread each) on this
machine, with the client in this process. Per size and repeat:

1. a task on worker A makes a float64 array of that size (not timed);
2. **worker -> worker**: a task pinned to worker B reads it (a checksum of a few
   elements, so the time is the transfer);
3. **gather**: the client receives the array (Corral: through the manager, which relays
   the parts; dask: straight from the worker).

Reported: seconds and MB/s of 2 and 3, and how much worker A's RSS grew above its size
after step 1 while it sent (sampled every 5 ms): what the sender holds besides the value.

    python benchmarks/transfer.py                    # 64, 256 and 512 MiB, best of 3
    python benchmarks/transfer.py --sizes 300MiB --repeat 1 --systems corral

Corral pins tasks with pools (worker A in pool ``a``, B in ``b``), dask with
``workers=``. The systems run one after the other; ratios are of best times.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cluster_processes import manager_and_workers  # noqa: E402  (benchmarks/: on the path)

from runtime.client import parse_bytes  # noqa: E402

MiB = 2**20


def make(nbytes: int, seed: int) -> Any:
    import numpy as np

    x = np.arange(nbytes // 8, dtype=np.float64)
    x[0] = seed  # fresh content for every repeat
    return x


def digest(x: Any) -> float:
    return float(x[0] + x[-1] + x[len(x) // 2])


class Peak:
    """Highest RSS of ``pid`` while the block runs (a 5 ms sampling thread)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def grew(self) -> int:
        return self.peak - self.start


Row = dict[str, Any]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# ------------------------------------------------------------------------------ dask


def run_dask(sizes: list[int], repeat: int) -> list[Row]:
    from distributed import Client, LocalCluster, wait

    rows = []
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = sorted(client.scheduler_info()["workers"])
        pid_a = client.run(os.getpid, workers=[a])[a]
        for nbytes in sizes:
            for rep in range(repeat):
                x = client.submit(make, nbytes, rep, workers=[a], pure=False)
                wait(x)
                with Peak(pid_a) as sender:
                    check = client.submit(digest, x, workers=[b], pure=False)
                    _, w2w = timed(check.result)
                    value, gather = timed(x.result)
                assert value.nbytes == nbytes
                rows.append(row("dask", nbytes, w2w, gather, sender.grew))
                del value, x, check
    return rows


# ---------------------------------------------------------------------------- corral


def run_corral(sizes: list[int], repeat: int) -> list[Row]:
    from runtime import Cluster

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as home:
        os.environ["CORRAL_HOME"] = home
        pinned = [["--cores", "1", "--pool", "a"], ["--cores", "1", "--pool", "b"]]
        with manager_and_workers(home, pinned) as (address, (worker_a, _)):

            async def main() -> None:
                async with Cluster(address) as c:
                    await c.wait_for_workers(2)
                    n = 0
                    for nbytes in sizes:
                        for rep in range(repeat):
                            n += 1
                            key = f"x-{n}"
                            (x,) = await c.submit_graph({key: (make, nbytes, rep)}, [key], pool="a")
                            await x.wait()
                            with Peak(worker_a.pid) as sender:
                                t0 = time.perf_counter()
                                (check,) = await c.submit_graph(
                                    {f"d-{n}": (digest, key)}, [f"d-{n}"], pool="b"
                                )
                                await check
                                w2w = time.perf_counter() - t0
                                t0 = time.perf_counter()
                                value = await x
                                gather = time.perf_counter() - t0
                            assert value.nbytes == nbytes
                            rows.append(row("corral", nbytes, w2w, gather, sender.grew))
                            del value, x, check

            anyio.run(main)
    return rows


# ---------------------------------------------------------------------------- report


def row(system: str, nbytes: int, w2w: float, gather: float, grew: int) -> Row:
    return {"system": system, "nbytes": nbytes, "w2w": w2w, "gather": gather, "grew": grew}


def best(rows: list[Row], system: str, nbytes: int) -> Row | None:
    mine = [r for r in rows if r["system"] == system and r["nbytes"] == nbytes]
    if not mine:
        return None
    return {
        "w2w": min(r["w2w"] for r in mine),
        "gather": min(r["gather"] for r in mine),
        "grew": max(r["grew"] for r in mine),
    }


def report(rows: list[Row], sizes: list[int], systems: list[str]) -> None:
    head = f"{'size':>8} {'system':>7} {'w->w s':>8} {'MB/s':>7} {'gather s':>9} {'MB/s':>7}"
    print(head + f" {'sender grew':>12}")
    for nbytes in sizes:
        for system in systems:
            b = best(rows, system, nbytes)
            if b is None:
                continue
            print(
                f"{nbytes / MiB:>5.0f}MiB {system:>7} {b['w2w']:>8.3f} "
                f"{nbytes / b['w2w'] / 1e6:>7.0f} {b['gather']:>9.3f} "
                f"{nbytes / b['gather'] / 1e6:>7.0f} {b['grew'] / MiB:>9.0f}MiB"
            )
    if set(systems) >= {"corral", "dask"}:
        print("\nratio of best times, dask / corral (above 1: Corral faster)")
        for nbytes in sizes:
            c, d = best(rows, "corral", nbytes), best(rows, "dask", nbytes)
            if c and d:
                print(
                    f"{nbytes / MiB:>5.0f}MiB  worker->worker {d['w2w'] / c['w2w']:.2f}x  "
                    f"gather {d['gather'] / c['gather']:.2f}x"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64MiB,256MiB,512MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--systems", default="corral,dask")
    args = parser.parse_args(argv)
    sizes = [int(parse_bytes(s)) for s in args.sizes.split(",")]
    systems = args.systems.split(",")
    rows: list[Row] = []
    for system in systems:
        t0 = time.perf_counter()
        rows += (
            run_corral(sizes, args.repeat) if system == "corral" else run_dask(sizes, args.repeat)
        )
        print(f"# {system}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    python = sys.version.split()[0]
    print(f"# numpy {np.__version__}, {psutil.cpu_count()} cores, Python {python}")
    report(rows, sizes, systems)
    return 0


if __name__ == "__main__":
    sys.exit(main())
