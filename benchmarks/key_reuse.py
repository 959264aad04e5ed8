"""What comparing tasks submitted again under known keys costs the scheduler core.

    python benchmarks/key_reuse.py            # 10,000 tasks, 5 rounds
    python benchmarks/key_reuse.py 20000 --rounds 3

A graph of N tasks is taken in by a ``SchedulerState`` (no workers), then the same
graph, built again from scratch (new node objects, as a second client's or a manager's
unpickled copy is), is taken in again: every key is known, so the core compares up to
``REUSE_CHECKS`` of them (``runtime.graph.node_fingerprint`` of the old and the new
node). Printed: the time of that second intake with the comparisons (the default
bound) and without them (``REUSE_CHECKS = 0``), interleaved, and the cost of one
fingerprint.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Hashable
from typing import Any

import actors.scheduler_state as core
from actors.scheduler_events import GraphSubmitted
from actors.scheduler_records import SchedulerConfig
from runtime.graph import build_specs, node_fingerprint


def load(sample: str) -> str:
    return sample


def inc(x: int) -> int:
    return x + 1


def graph(n: int) -> dict[Hashable, Any]:
    dsk: dict[Hashable, Any] = {}
    for i in range(n // 2):
        dsk[f"load-{i}"] = (load, f"sample-{i}")
        dsk[f"inc-{i}"] = (inc, f"load-{i}")
    return dsk


def again(n: int, checks: int) -> float:
    """Seconds the second intake of the graph took, with ``checks`` comparisons at most."""
    core.REUSE_CHECKS = checks
    s = core.SchedulerState(SchedulerConfig())
    first = build_specs(graph(n), [])
    s.handle(GraphSubmitted("s-1", 1.0, first, ()))
    second = build_specs(graph(n), [])
    t = time.perf_counter()
    s.handle(GraphSubmitted("s-2", 2.0, second, ()))
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tasks", nargs="?", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    bound = core.REUSE_CHECKS
    got: dict[str, list[float]] = {"compared": [], "not compared": []}
    for _ in range(a.rounds):
        got["compared"].append(again(a.tasks, bound))
        got["not compared"].append(again(a.tasks, 0))
    specs = list(build_specs(graph(a.tasks), []).values())
    t = time.perf_counter()
    for spec in specs:
        node_fingerprint(spec.node)
    each = (time.perf_counter() - t) / len(specs)
    on, off = (statistics.median(got[k]) for k in ("compared", "not compared"))
    print(
        f"{a.tasks:,} tasks submitted again, REUSE_CHECKS {bound:,}, {a.rounds} rounds: "
        f"median intake {on * 1000:.0f} ms compared, {off * 1000:.0f} ms not "
        f"(+{(on - off) * 1000:.0f} ms); one fingerprint {each * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
