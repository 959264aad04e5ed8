"""The floor of a numpy+dask worker in ``process`` execution, and a cube's median on it
(the array audit's finding 2).

    python benchmarks/array_floor.py --port 52010                       # the floor only
    python benchmarks/array_floor.py --port 52030 --memory 1GiB --median
    python benchmarks/array_floor.py --port 52030 --memory 600MiB --median --chunk-size 32MiB

``Cluster(processes=1, memory_per_worker=MEMORY, memory_options={"execution":
"process"})``: one worker process with one task process. It computes one numpy task's
worth of dask.array (the mean of a 20 x 1024 x 1024 float32 cube of random chunks, 40
MiB each), waits ``--idle`` seconds and prints the worker's RSS from ``status()`` (the
worker process and its task process, holding no output: its floor) and, with psutil,
each process of the tree. With ``--median``, then the audit's median of a
``--frames`` x 1024 x 1024 cube rechunked from time chunks into 128 x 128 space chunks
(``--chunk-size`` sets dask's ``array.chunk-size``, which bounds the rechunk's
intermediate chunks), its outcome and wall time, and the worker's RSS after it.
"""

from __future__ import annotations

import argparse
import time

import anyio
import dask
import dask.array as da
import numpy as np
import psutil

from runtime import Cluster

MiB = 2**20


def cube(frames: int) -> da.Array:
    rng = da.random.default_rng(0)
    return rng.standard_normal((frames, 1024, 1024), chunks=(10, 1024, 1024), dtype=np.float32)


async def main(args: argparse.Namespace) -> None:
    async with Cluster(
        processes=1,
        port=args.port,
        memory_per_worker=args.memory,
        memory_options={"execution": "process"},
    ) as cluster:

        async def rss(what: str) -> None:
            await anyio.sleep(args.idle)
            (m,) = (await cluster.status())["memory"].values()
            print(f"{what}: status rss {m['rss'] / MiB:.1f} MiB (floor {m['floor'] / MiB:.1f})")
            for p in psutil.Process().children(recursive=True):
                with_rss = p.memory_info().rss / MiB
                print(f"  pid {p.pid} {with_rss:.1f} MiB: {' '.join(p.cmdline())[:70]}")

        await cluster.compute(cube(20).mean(axis=0).sum())
        await rss("after one numpy task")
        if args.median:
            x = cube(args.frames)
            t0 = time.perf_counter()
            try:
                await cluster.compute(da.median(x.rechunk((args.frames, 128, 128)), axis=0))
                print(f"median: done in {time.perf_counter() - t0:.1f} s")
            except Exception as e:  # the outcome is what is measured
                print(f"median: {type(e).__name__} after {time.perf_counter() - t0:.1f} s")
                print(f"  {str(e)[:700]}")
            await rss("after the median")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=52010)
    ap.add_argument("--memory", default="400MiB")
    ap.add_argument("--idle", type=float, default=8.0, help="seconds idle before a sample")
    ap.add_argument("--median", action="store_true")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--chunk-size", default="", help="dask's array.chunk-size (default 128MiB)")
    args = ap.parse_args()
    if args.chunk_size:
        dask.config.set({"array.chunk-size": args.chunk_size})
    anyio.run(main, args)
