"""Awaiting many finished futures one by one (``for f in futs: r = await f``), the loop a
user audit's client ran (slurmscale F1): each ``await`` is a gather through the
manager, which also tells the scheduler which values it gave (``DataDelivered``, at
most every ``DELIVERED_EVERY``: one message for all the gathers of that time, not one
per gather).

    python benchmarks/await_each.py                          # this tree
    PYTHONPATH=/tmp/old python benchmarks/await_each.py      # another tree's

``Cluster(workers=2)``, ``map(inc, range(--items))`` (3,000) gathered once, then
``--rounds`` (3) loops awaiting each future in turn; prints each loop's seconds and the
best. Run the trees one after the other, twice or more: the machine's load shows in the
figures.
"""

from __future__ import annotations

import argparse
import time

import anyio

from runtime import Cluster


def inc(x: int) -> int:
    return x + 1


async def main(items: int, rounds: int) -> None:
    async with Cluster(workers=2) as cluster:
        await cluster.wait_for_workers(2)
        futures = cluster.map(inc, range(items))
        await cluster.gather(futures)
        took = []
        for _ in range(rounds):
            t = time.perf_counter()
            for f in futures:
                await f
            took.append(time.perf_counter() - t)
    print(
        f"{items} awaits one by one: best {min(took):.3f} s, "
        f"rounds {', '.join(f'{s:.3f}' for s in took)}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, args.items, args.rounds)
