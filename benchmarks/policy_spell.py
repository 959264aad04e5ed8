"""A cheap priority policy of your own during a large ``map`` in an embedded cluster: is
it made slow (a slow spell) and replaced? (docs/policies.md, "Be fast".)

    python benchmarks/policy_spell.py                       # this tree, 3 rounds
    python benchmarks/policy_spell.py --tree /tmp/old       # against another tree too
    python benchmarks/policy_spell.py --cost 20e-6 --tasks 60000 --rounds 2

Each round runs in a fresh process: a priority policy ``costly`` that busy-waits
``--cost`` seconds a call (20 µs of CPU) and ranks by ``task.order`` is set on
``Cluster(workers=2, threads_per_worker=2)``, which computes ``map(inc, range(N))``.
The round prints the priority policy in force at the end (``costly``: kept; ``graph``:
replaced by the default), the kinds with a policy problem, and the policy's calls as
it measured them: wall time and CPU per call (the wall time includes the waits for
the GIL behind the task threads), and how many calls took 1 ms or more in wall time.

With ``--tree DIR`` (a checkout of another version, e.g. ``git archive main | tar -x -C
DIR``) each round runs with ``PYTHONPATH=DIR`` too, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def inc(x: int) -> int:
    return x + 1


def child(cost: float, n: int) -> dict[str, Any]:
    """One round in this process."""
    import anyio

    import policies
    from runtime import Cluster

    calls: list[tuple[float, float]] = []  # (wall, cpu) seconds of each call

    @policies.register("priority", "costly")
    class Costly:
        name = "costly"

        def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
            wall, cpu = time.perf_counter(), time.thread_time()
            end = wall + cost
            while time.perf_counter() < end:
                pass
            calls.append((time.perf_counter() - wall, time.thread_time() - cpu))
            return (task.order,)

    out: dict[str, Any] = {}

    async def main() -> None:
        async with Cluster(workers=2, threads_per_worker=2) as c:
            await c.set_policy("priority", "costly")
            began = time.perf_counter()
            await c.gather(c.map(inc, range(n)))
            out["seconds"] = time.perf_counter() - began
            status = await c.status()
            out["policy"] = status["policies"].get("priority")
            out["problems"] = sorted(status.get("policy_problems", {}))

    anyio.run(main)
    out["calls"] = len(calls)
    out["wall_us"] = sum(w for w, _ in calls) / max(len(calls), 1) * 1e6
    out["cpu_us"] = sum(c for _, c in calls) / max(len(calls), 1) * 1e6
    out["over_1ms"] = sum(w >= 0.001 for w, _ in calls)
    return out


def run(tree: str | None, cost: float, n: int) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    cmd = [sys.executable, __file__, "--child", "--cost", repr(cost), "--tasks", str(n)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost", type=float, default=20e-6, help="seconds of CPU a call")
    ap.add_argument("--tasks", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", help="another tree to run against, interleaved")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.cost, args.tasks)))
        return
    trees: list[tuple[str, str | None]] = [("this", None)]
    if args.tree:
        trees.append(("other", args.tree))
    print(f"{args.tasks:,} tasks, {args.cost * 1e6:g} µs a call; load {os.getloadavg()[0]:.1f}")
    for r in range(1, args.rounds + 1):
        for name, tree in trees:
            got = run(tree, args.cost, args.tasks)
            print(
                f"  round {r} {name:5}: policy now {got['policy']!r}, problems "
                f"{got['problems']}; {got['seconds']:.1f} s; {got['calls']} calls, wall "
                f"{got['wall_us']:.1f} µs, cpu {got['cpu_us']:.1f} µs a call, "
                f"{got['over_1ms']} of 1 ms or more; load {os.getloadavg()[0]:.1f}"
            )


if __name__ == "__main__":
    main()
