"""A small request's latency while another request's large ``map`` is taken in, with
one client, as a service that embeds Corral has (docs/embedding.md, "One big request
delays the others").

    python benchmarks/request_latency.py                      # this tree, 3 rounds
    python benchmarks/request_latency.py --tree /tmp/old      # against another tree
    python benchmarks/request_latency.py --manager            # Cluster(address) client
    PYTHONPATH=/tmp/old python benchmarks/request_latency.py --manager   # the other tree's

Each measure runs in a fresh process: ``Cluster(workers=2)`` (with ``--manager``, a
``Cluster(address)`` client of a manager process on 127.0.0.1 with two worker
processes of one core each, on the ``--port`` and ``--port-range`` given), a warm-up
task, then ``map(square, range(--items), pure=False)`` (20,000) gathered in a task
of its own; once the scheduler has taken in some of it (the tasks it knows,
``status()["tasks_by_state"]``, grew: polled every 10 ms), ``submit(square, 3,
pure=False, priority=P)`` for P of ``--priorities`` (0 and 100, one measure each).
Reported, in seconds from the ``map`` call: when the small request was made, when its
result came, when the scheduler had taken in the whole map (the same count, polled),
and when the map's results had all come; and the small request's latency (its
result's time less its submit's).

With ``--tree DIR`` (a checkout of another version, e.g. ``git archive main | tar -x -C
DIR``) each round runs the same measures with ``PYTHONPATH=DIR`` too, interleaved, and
prints the medians side by side. The machine's load shows in the figures: compare trees
in one run. With ``--manager`` the scheduler is the manager process's, which runs the
tree this script imports: run it with ``PYTHONPATH=DIR`` for another tree's
(``--tree`` is refused there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

POLL = 0.01  # seconds between status polls


def square(x: int) -> int:
    return x * x


async def known(c: Any) -> int:
    """The tasks the scheduler knows (taken in, not forgotten)."""
    return sum((await c.status())["tasks_by_state"].values())


def child(items: int, priority: float, address: str | None) -> dict[str, float]:
    """One measure in this process: the times (seconds from the ``map`` call)."""
    import anyio

    from runtime import Cluster

    async def main() -> dict[str, float]:
        got: dict[str, float] = {}
        kw: dict[str, Any] = {"address": address} if address else {"workers": 2}
        async with Cluster(**kw) as c, anyio.create_task_group() as tg:
            warm = c.submit(square, 2, pure=False)  # (held: the count below keeps it)
            assert await warm == 4
            base = await known(c)
            t0 = time.perf_counter()

            def now() -> float:
                return time.perf_counter() - t0

            big = c.map(square, range(items), pure=False)

            async def gather() -> None:
                await c.gather(big)
                got["map_done"] = now()

            async def until(enough: int) -> float:
                """When the scheduler knew ``enough`` tasks (polled)."""
                while True:
                    if await known(c) >= enough:
                        return now()
                    await anyio.sleep(POLL)

            async def intake() -> None:
                got["map_in"] = await until(base + items + 1)  # (the small request's too)

            tg.start_soon(gather)
            await until(base + 1)  # some of the map is in
            tg.start_soon(intake)
            got["small_sent"] = now()
            small = c.submit(square, 3, pure=False, priority=priority)  # (held: counted)
            assert await small == 9
            got["small_done"] = now()
            got["latency"] = got["small_done"] - got["small_sent"]
        return got

    return anyio.run(main)


def run(tree: str | None, items: int, priority: float, address: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    argv = [sys.executable, __file__, "--child", "--items", str(items), "--priority", str(priority)]
    if address:
        argv += ["--address", address]
    out = subprocess.run(
        argv, env=env, cwd="/", capture_output=True, text=True, timeout=600, check=True
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def rounds(a: argparse.Namespace, address: str | None) -> None:
    trees: dict[str, str | None] = {"this": None}
    if a.tree:
        trees[a.tree] = a.tree
    rows: dict[tuple[str, float], dict[str, list[float]]] = {}
    where = f"a manager process at {address}" if address else "embedded, workers=2"
    print(
        f"map of {a.items:,} items, {where}; {a.rounds} rounds, interleaved; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    for r in range(a.rounds):
        for name, tree in trees.items():
            for prio in a.priorities:
                got = run(tree, a.items, prio, address)
                for k, v in got.items():
                    rows.setdefault((name, prio), {}).setdefault(k, []).append(v)
                print(
                    f"  round {r + 1} {name} priority={prio:g}: small sent {got['small_sent']:.2f}"
                    f" s, done {got['small_done']:.2f} s (latency {got['latency']:.2f} s); map "
                    f"taken in {got['map_in']:.2f} s, done {got['map_done']:.2f} s; load "
                    f"{os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    print("medians (s):")
    for (name, prio), runs in rows.items():
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(
            f"  {name} priority={prio:g}: small latency {med['latency']:.2f} (sent "
            f"{med['small_sent']:.2f}, done {med['small_done']:.2f}); map taken in "
            f"{med['map_in']:.2f}, done {med['map_done']:.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", help="another checkout to compare with (PYTHONPATH=TREE)")
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--priorities", type=float, nargs="+", default=[0, 100])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--manager", action="store_true", help="a Cluster(address) client")
    p.add_argument("--port", type=int, default=59510, help="the manager's port (--manager)")
    p.add_argument("--port-range", default="59520-59599", help="the workers' ports (--manager)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--priority", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.items, a.priority, a.address)))
        return
    if not a.manager:
        rounds(a, None)
        return
    if a.tree:
        p.error("--tree compares clients only with --manager: run with PYTHONPATH=TREE")
    from runtime.cli_processes import TREE, Cli

    with (
        tempfile.TemporaryDirectory(prefix="corral-latency-") as tmp,
        Cli(Path(tmp) / "home", cwd=TREE, grace=15) as procs,
    ):
        manager = procs.start("manager", "--listen", f"127.0.0.1:{a.port}", "--no-monitoring")
        line = procs.line_with(manager, "manager listening on", limit=120)
        address = line.split("manager listening on", 1)[1].strip()
        for _ in range(2):
            w = procs.start("worker", address, "--cores", "1", "--port-range", a.port_range)
            procs.line_with(w, "joined", limit=120)
        rounds(a, address)


if __name__ == "__main__":
    main()
