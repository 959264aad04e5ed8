"""Load then pairwise reduce on small workers: the spill fence on against spilling off.

    python benchmarks/spill_reduce.py               # 3 rounds, each way once a round
    python benchmarks/spill_reduce.py --rounds 5

Each run: ``Cluster(processes=2, memory_per_worker="300MiB")``, 40 ``load`` tasks each
returning a 40 MB numpy array (``np.ones(5_000_000)``), 20 ``red(a, b)`` tasks over
pairs of them (the sum of both) and a ``sum`` of those, submitted at once. The two ways,
interleaved: the default memory options (spill fence 0.6) and ``{"spill": None}``.
Printed per run: the wall time from the submission to the result, the peak RSS of the
``load`` category (``status()["categories"]["load"]["peak_rss"]``) and the MiB each
worker ever spilled (``status()["memory"][worker]["spilled_total"]``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
import numpy as np

from runtime import Cluster

MiB = 2**20


def load(i: int) -> np.ndarray:
    return np.ones(5_000_000)


def red(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.sum() + b.sum())


async def one(options: dict[str, Any]) -> tuple[float, float, list[int]]:
    async with Cluster(processes=2, memory_per_worker="300MiB", memory_options=options) as c:
        await c.wait_for_workers(2)
        start = time.perf_counter()
        loads = [c.submit(load, i) for i in range(40)]
        reds = [c.submit(red, loads[2 * i], loads[2 * i + 1]) for i in range(20)]
        del loads
        total = await c.submit(sum, reds)
        wall = time.perf_counter() - start
        assert total == 40 * 5_000_000
        status = await c.status()
        peak = status["categories"]["load"]["peak_rss"] / MiB
        spilled = [round(m["spilled_total"] / MiB) for m in status["memory"].values()]
        return wall, peak, spilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ways: dict[str, dict[str, Any]] = {"spill 0.6": {}, "spill off": {"spill": None}}
    print("| round | way | wall | load peak RSS | spilled per worker |")
    print("|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for name, options in ways.items():
            wall, peak, spilled = anyio.run(one, options)
            mib = ", ".join(map(str, spilled))
            print(f"| {r} | {name} | {wall:.2f} s | {peak:.0f} MiB | {mib} MiB |", flush=True)


if __name__ == "__main__":
    main()
