"""A dask.dataframe groupby-apply, twice, on small worker processes (a user audit).

    python benchmarks/groupby_memory.py                     # 2 workers of 400 MiB, 2 runs
    python benchmarks/groupby_memory.py --workers 3 --runs 3 --rows 6000000

Starts ``python -m runtime manager`` and ``--workers`` worker processes
(``--memory 400MiB --cores 2``), then computes
``df.groupby("name").apply(summary)`` of ``dd.from_pandas`` random data
(``--rows`` rows in ``--partitions`` partitions) with
``dask.compute(..., scheduler=runtime.get, address=...)``, ``--runs`` times in a row.
Printed per run: the wall time, whether it ended in ``MemoryStalled`` (or another
error), the MiB each worker spilled during it (``status()["memory"][w]["spilled_total"]``),
each worker process's peak RSS (``VmHWM``, since it started) and its RSS, floor and
throttled flag after the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

import runtime
from runtime import Cluster

MiB = 2**20


def summary(g: pd.DataFrame) -> pd.Series:
    return pd.Series({"n": len(g), "x": g["x"].mean(), "y": g["y"].std()})


def part(i: int, rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(i)
    names = np.array([f"name-{k:03d}" for k in range(200)])
    return pd.DataFrame(
        {
            "name": names[rng.integers(0, len(names), rows)],
            "id": rng.integers(0, 1_000_000, rows),
            "x": rng.random(rows),
            "y": rng.random(rows),
            "z": rng.random(rows),
        }
    )


def frame(rows: int, partitions: int) -> dd.DataFrame:
    """Random data made in its tasks (a graph carrying it would be too large to send)."""
    return dd.from_map(part, range(partitions), rows=rows // partitions)


def vmhwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def probe(i: int) -> dict[str, Any]:
    """What the worker process running it holds (--probe): its RSS, glibc's heap in use
    and free (mallinfo2), and the pandas objects alive, after a collection."""
    import ctypes
    import gc

    time.sleep(0.3)  # so that the probes spread over the workers
    gc.collect()

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    m = libc.mallinfo2()
    frames = [o for o in gc.get_objects() if isinstance(o, (pd.DataFrame, pd.Series))]
    held = sum(int(o.memory_usage(deep=True).sum()) if isinstance(o, pd.DataFrame)
               else int(o.memory_usage(deep=True)) for o in frames)  # fmt: skip
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"pid": os.getpid(), "rss": rss / MiB, "heap_in_use": m.uordblks / MiB,
            "heap_free": m.fordblks / MiB, "mmapped": m.hblkhd / MiB,
            "frames": len(frames), "frames_mib": held / MiB}  # fmt: skip


async def probes(address: str, token: str) -> list[dict[str, Any]]:
    async with Cluster(address, token=token) as c:
        futs = [c.submit(probe, i, pure=False) for i in range(6)]
        return list(await c.gather(futs))


async def status(address: str, token: str) -> dict[str, Any]:
    async with Cluster(address, token=token) as c:
        return await c.status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory", default="400MiB")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--partitions", type=int, default=60)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--probe", action="store_true", help="after each run, what workers hold")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="corral-groupby-")
    tokens = os.path.join(tmp, "tokens.json")
    address = f"ws://127.0.0.1:{args.port}"
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as files:
        try:
            run(args, tmp, tokens, address, procs, files)
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def run(args: argparse.Namespace, tmp: str, tokens: str, address: str,
        procs: list[subprocess.Popen[bytes]], files: contextlib.ExitStack) -> None:  # fmt: skip
    """Start the manager and the workers (into ``procs``) and compute the runs."""
    py = sys.executable
    log = files.enter_context(open(os.path.join(tmp, "manager.log"), "wb"))  # noqa: SIM115
    procs.append(subprocess.Popen(
        [py, "-m", "runtime", "manager", "--listen", f"127.0.0.1:{args.port}",
         "--token-file", tokens, "--no-monitoring"],
        stdout=log, stderr=log))  # fmt: skip
    for _ in range(1200):  # a loaded machine: up to 2 minutes
        if os.path.exists(tokens) and os.path.getsize(tokens):
            break
        time.sleep(0.1)
    with open(tokens) as f:
        token = json.load(f)["admin"]
    tfile = os.path.join(tmp, "worker.token")
    with open(os.open(tfile, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(token)
    workers = []
    for i in range(args.workers):
        wlog = files.enter_context(open(os.path.join(tmp, f"worker-{i}.log"), "wb"))  # noqa: SIM115
        p = subprocess.Popen(
            [py, "-m", "runtime", "worker", address, "--token-file", tfile,
             "--memory", args.memory, "--cores", str(args.cores), "--name", f"w{i}",
             "--log-level", "info"],
            stdout=wlog, stderr=wlog)  # fmt: skip
        procs.append(p)
        workers.append(p)
    print(f"logs in {tmp}", flush=True)
    df = frame(args.rows, args.partitions)
    size = part(0, args.rows // args.partitions).memory_usage(deep=True).sum()
    print(f"data: {size * args.partitions / MiB:.0f} MiB in {args.partitions} partitions",
          flush=True)  # fmt: skip
    for _ in range(100):
        st = anyio.run(status, address, token)
        if len(st["memory"]) >= args.workers:
            break
        time.sleep(0.2)
    before = {w: m["spilled_total"] for w, m in st["memory"].items()}
    for n in range(1, args.runs + 1):
        result = df.groupby("name").apply(summary, meta={"n": "f8", "x": "f8", "y": "f8"})
        start = time.perf_counter()
        outcome = "ok"
        try:
            dask.compute(result, scheduler=runtime.get, address=address, token=token)
        except Exception as e:  # the outcome is what is measured
            outcome = f"{type(e).__name__}: {str(e)[:300]}"
        wall = time.perf_counter() - start
        st = anyio.run(status, address, token)
        spilled = {w: (m["spilled_total"] - before.get(w, 0)) / MiB
                   for w, m in st["memory"].items()}  # fmt: skip
        before = {w: m["spilled_total"] for w, m in st["memory"].items()}
        peaks = [vmhwm(p.pid) / MiB for p in workers]
        print(f"run {n}: {wall:.1f} s, {outcome}", flush=True)
        print(f"  spilled MiB per worker: {', '.join(f'{v:.0f}' for v in spilled.values())}"
              f" (total {sum(spilled.values()):.0f})")  # fmt: skip
        print(f"  peak RSS (VmHWM) MiB: {', '.join(f'{v:.0f}' for v in peaks)}")
        for w, m in sorted(st["memory"].items()):
            held = m.get("memory_bytes", 0) / MiB
            floor = m.get("floor", 0) / MiB
            print(f"  {w}: rss {m['rss'] / MiB:.0f} MiB, floor {floor:.0f},"
                  f" throttled {m['throttled']}, in memory {held:.0f} MiB", flush=True)  # fmt: skip
        if args.probe:
            seen: dict[int, dict[str, Any]] = {}
            for r in anyio.run(probes, address, token):
                seen[r["pid"]] = r
            for r in seen.values():
                print("  probe", {k: round(v, 1) for k, v in r.items()}, flush=True)


if __name__ == "__main__":
    main()
