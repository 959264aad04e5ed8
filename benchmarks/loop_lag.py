"""The event loop's worst stall while an embedded cluster takes in a large graph and lets
go of it: the scheduler taking graphs and releases in pieces (``INTAKE_PIECE`` tasks or
keys per turn) against the same code taking each as one event (``INTAKE_PIECE`` set
above the graph's size), interleaved in one process.

    python benchmarks/loop_lag.py              # 8,000 chains of 5: 40,000 tasks, 3 rounds
    python benchmarks/loop_lag.py 20000 --rounds 2
    python benchmarks/loop_lag.py --gc off     # the same with the garbage collector off

Each run: ``Cluster(workers=2)`` in this process, ``compute`` of every key of the
chains (so ``compute`` releases 40,000 keys at once when it returns), and a probe that
sleeps 5 ms in a loop and records by how much each sleep overran. Printed: the worst
overrun from the submission until ``compute`` returns (the intake among the results),
and in the 3 s after (the release), for each way, with the ratio of their medians,
and the garbage collector's full (generation 2) collections during each run: how many,
and the longest.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Hashable
from typing import Any

import anyio

import runtime.graph
from runtime import Cluster

PROBE = 0.005  # seconds the probe sleeps
AFTER = 3.0  # seconds watched after compute returns


def inc(x: int) -> int:
    return x + 1


def chains(n: int, length: int = 5) -> dict[Hashable, Any]:
    dsk: dict[Hashable, Any] = {}
    for c in range(n):
        dsk[f"c{c}-0"] = (inc, c)
        for i in range(1, length):
            dsk[f"c{c}-{i}"] = (inc, f"c{c}-{i - 1}")
    return dsk


#: seconds each full collection took, in the run under way
FULL_GC: list[float] = []
_gc_started = [0.0]


def time_full_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    elif info["generation"] == 2:
        FULL_GC.append(time.perf_counter() - _gc_started[0])


async def once(dsk: dict[Hashable, Any]) -> tuple[float, float, float]:
    """(compute seconds, worst stall during it, worst stall in the AFTER s after)."""
    stalls: list[tuple[float, float]] = []
    FULL_GC.clear()

    async def probe() -> None:
        while True:
            t = time.perf_counter()
            await anyio.sleep(PROBE)
            now = time.perf_counter()
            stalls.append((now, now - t - PROBE))

    async with Cluster(workers=2) as c, anyio.create_task_group() as tg:
        tg.start_soon(probe)
        start = time.perf_counter()
        await c.compute(dsk, list(dsk))
        returned = time.perf_counter()
        await anyio.sleep(AFTER)
        tg.cancel_scope.cancel()
    during = max(s for t, s in stalls if t <= returned)
    after = max(s for t, s in stalls if t > returned)
    return returned - start, during, after


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("chains", nargs="?", type=int, default=8_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gc", choices=("on", "off"), default="on", help="the garbage collector")
    a = p.parse_args()
    if a.gc == "off":
        gc.disable()
    gc.callbacks.append(time_full_gc)
    dsk = chains(a.chains)
    piece = runtime.graph.INTAKE_PIECE
    ways = {"pieces": piece, "one event": 10 * len(dsk)}
    got: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
    print(
        f"{len(dsk):,} tasks; INTAKE_PIECE {piece:,}; {a.rounds} rounds, interleaved; "
        f"garbage collector {a.gc}"
    )
    for r in range(a.rounds):
        for way, size in ways.items():
            runtime.graph.INTAKE_PIECE = size
            try:
                took, during, after = anyio.run(once, dsk)
            finally:
                runtime.graph.INTAKE_PIECE = piece
            got[way].append((took, during, after))
            print(
                f"  round {r + 1} {way:>9}: compute {took:5.1f} s, worst stall during "
                f"{during * 1000:5.0f} ms, after {after * 1000:5.0f} ms; full GCs "
                f"{len(FULL_GC)}, longest {max(FULL_GC, default=0.0) * 1000:.0f} ms",
                flush=True,
            )
    med = {w: [statistics.median(x[i] for x in runs) for i in range(3)] for w, runs in got.items()}
    one, pieces = med["one event"], med["pieces"]
    print(
        f"median worst stall during compute: pieces {pieces[1] * 1000:.0f} ms, one event "
        f"{one[1] * 1000:.0f} ms ({one[1] / pieces[1]:.1f}x); after it (the release): "
        f"pieces {pieces[2] * 1000:.0f} ms, one event {one[2] * 1000:.0f} ms "
        f"({one[2] / pieces[2]:.1f}x); compute {pieces[0]:.1f} s against {one[0]:.1f} s"
    )


if __name__ == "__main__":
    main()
