"""What the scheduler core's watchdogs and a task's ``runs-on`` story row cost on the
hot path: the share of the event loop's profiled time they take while an in-process
cluster runs ``throughput.py``'s no-op workloads.

    python benchmarks/watchdog_cost.py              # 20,000 tasks per workload
    python benchmarks/watchdog_cost.py -n 50000

A share of one profile, not a rate: this machine is shared, and two runs' rates (with
and without the code) differ more from the load than by what the code costs, while the
share within one run holds. cProfile counts the event loop's thread only (the scheduler
core and the actors run there; the tasks run in the worker's threads) and adds its own
cost to every call, most to small calls, so the shares are upper bounds.

Printed per workload: the profiled seconds; the watchdogs' (``SchedulerState._watch``,
called after every event: the disk, placement and memory watchdogs, with what they
call); the placement watchdog's own code (``actors/scheduler_stall.py``); and the story
rows (``SchedulerState._log``: one per task, its ``runs-on`` row).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import sys
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import throughput

from runtime import Cluster


def shares(stats: pstats.Stats) -> dict[str, tuple[float, int]]:
    """Seconds and calls per part, from one profile."""
    out = {"watch": (0.0, 0), "stall": (0.0, 0), "log": (0.0, 0)}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (path, _line, func), (_cc, calls, own, cum, _callers) in raw.items():
        if path.endswith("scheduler_state.py") and func == "_watch":
            out["watch"] = (out["watch"][0] + cum, out["watch"][1] + calls)
        if path.endswith("scheduler_stall.py"):
            out["stall"] = (out["stall"][0] + own, out["stall"][1] + calls)
        if path.endswith("scheduler_state.py") and func == "_log":
            out["log"] = (out["log"][0] + own, out["log"][1] + calls)
    return out


async def run(n: int) -> None:
    runs = itertools.count(1)
    async with Cluster(workers=1, threads_per_worker=2) as cluster:
        await cluster.wait_for_workers(1)
        for name, build in (("independent", throughput.independent), ("tree", throughput.tree)):
            await cluster.compute(*build(n, next(runs)))  # warm: imports, caches
            dsk, keys = build(n, next(runs))
            profile = cProfile.Profile()
            profile.enable()
            await cluster.compute(dsk, keys)
            profile.disable()
            stats = pstats.Stats(profile)
            total: float = stats.total_tt  # type: ignore[attr-defined]
            parts = shares(stats)
            cells = ", ".join(
                f"{label} {secs:.3f} s ({100 * secs / total:.2f}%, {calls:,} calls)"
                for label, (secs, calls) in (
                    ("watchdogs", parts["watch"]),
                    ("placement watchdog's own", parts["stall"]),
                    ("story rows", parts["log"]),
                )
            )
            print(f"{name}: {len(dsk):,} tasks, {total:.2f} s profiled; {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000, help="tasks per workload")
    args = parser.parse_args(argv)
    anyio.run(run, args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
