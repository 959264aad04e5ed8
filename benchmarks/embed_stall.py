"""The host event loop's worst stall with an embedded cluster, as a service sees it: a
ticker in the same loop sleeping 10 ms at a time records the longest gap between its
ticks (docs/embedding.md, "Your event loop takes the graph in").

    python benchmarks/embed_stall.py                    # this tree, 3 rounds
    python benchmarks/embed_stall.py --tree /tmp/old    # this tree against another one
    python benchmarks/embed_stall.py --chains 4000 --rounds 2

Each measure runs in a fresh process (so its first ``Cluster()`` is the process's
first, as in a service), with ``runtime`` imported before the loop starts, as a
service's module imports it:

- ``start``: the gap while ``Cluster(workers=2)`` (``processes=2`` for ``start-procs``)
  is made and started in the running loop, and runs its first task;
- ``submit``: while a graph of ``--chains`` chains of 5 tasks (2,000: 10,000 tasks) is
  submitted and computed by ``compute`` (its results come back: the graph going in,
  running, and results gathered);
- ``release``: in the 2 s after ``compute`` returned (its keys let go of).

Besides, the longest full (generation 2) garbage collection in each phase, which holds
the loop as long (``--gc off`` runs with the collector disabled, ``--gc tuned`` with
``Cluster(gc_threshold=50_000)``, which makes collections rarer, process-wide).

With ``--tree DIR`` (a checkout of another version, e.g. ``git archive main | tar -x -C
DIR``) each round runs the same measures with ``PYTHONPATH=DIR`` too, interleaved, and
prints the medians side by side. The machine's load shows in the figures: compare trees
in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from loop_lag import FULL_GC, chains, time_full_gc  # (benchmarks/: on the path)

TICK = 0.01  # seconds the ticker sleeps
AFTER = 2.0  # seconds watched after compute returns


def child(what: str, n_chains: int, collector: str) -> dict[str, float]:
    """One measure in this process: the worst gaps (seconds) by phase, and the longest
    full garbage collection in each (``gc_`` + phase). ``collector``: ``on`` (Python's
    defaults), ``off`` (disabled) or ``tuned`` (``Cluster(gc_threshold=50_000)``)."""
    import gc

    import anyio

    if collector == "off":
        gc.disable()
    gc.callbacks.append(time_full_gc)

    from runtime import Cluster

    async def main() -> dict[str, float]:
        gaps: list[float] = [0.0]

        async def ticker() -> None:
            while True:
                t = time.perf_counter()
                await anyio.sleep(TICK)
                gaps[0] = max(gaps[0], time.perf_counter() - t - TICK)

        got: dict[str, float] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0.1)
            gaps[0] = 0.0
            FULL_GC.clear()
            kw: dict[str, Any] = {"processes": 2} if what == "start-procs" else {"workers": 2}
            if collector == "tuned":
                kw["gc_threshold"] = 50_000  # runtime.client.GC_THRESHOLD
            async with Cluster(**kw) as c:
                await c.submit(sum, [1, 2], pure=False)  # (a builtin: worker processes load it)
                got["start"] = gaps[0]
                got["gc_start"] = max(FULL_GC, default=0.0)
                if what == "submit":
                    dsk = chains(n_chains)
                    await anyio.sleep(0.2)
                    gaps[0] = 0.0
                    FULL_GC.clear()
                    start = time.perf_counter()
                    await c.compute(dsk, list(dsk))
                    got["compute_s"] = time.perf_counter() - start
                    got["submit"] = gaps[0]
                    got["gc_submit"] = max(FULL_GC, default=0.0)
                    del dsk
                    gaps[0] = 0.0
                    FULL_GC.clear()
                    await anyio.sleep(AFTER)
                    got["release"] = gaps[0]
                    got["gc_release"] = max(FULL_GC, default=0.0)
            tg.cancel_scope.cancel()
        return got

    return anyio.run(main)


def run(tree: str | None, what: str, n_chains: int, gc_on: str) -> dict[str, float]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, "--chains", str(n_chains), "--gc", gc_on],
        env=env, cwd="/", capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", help="another checkout to compare with (PYTHONPATH=TREE)")
    p.add_argument("--chains", type=int, default=2_000, help="chains of 5 tasks (2,000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--gc",
        choices=("on", "off", "tuned"),
        default="on",
        help="the garbage collector: Python's defaults, disabled, or Cluster(gc_threshold=50_000)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.chains, a.gc)))
        return
    trees: dict[str, str | None] = {"this": None}
    if a.tree:
        trees[a.tree] = a.tree
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    print(
        f"{a.chains * 5:,} tasks; {a.rounds} rounds, interleaved; garbage collector {a.gc}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    for r in range(a.rounds):
        for name, tree in trees.items():
            got = run(tree, "submit", a.chains, a.gc)
            procs = run(tree, "start-procs", a.chains, a.gc)
            got["start-procs"] = procs["start"]
            for k, v in got.items():
                rows[name].setdefault(k, []).append(v)
            print(
                f"  round {r + 1} {name}: worst gap start {got['start'] * 1000:.0f} ms "
                f"(processes=2: {got['start-procs'] * 1000:.0f} ms), submit+compute "
                f"{got['submit'] * 1000:.0f} ms (compute {got['compute_s']:.1f} s), release "
                f"{got['release'] * 1000:.0f} ms; longest full GC: start "
                f"{got['gc_start'] * 1000:.0f}, submit {got['gc_submit'] * 1000:.0f}, release "
                f"{got['gc_release'] * 1000:.0f} ms; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print("medians of the worst gaps (ms):")
    for name, runs in rows.items():
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(
            f"  {name}: start {med['start'] * 1000:.0f}, start processes=2 "
            f"{med['start-procs'] * 1000:.0f}, submit+compute {med['submit'] * 1000:.0f}, "
            f"release {med['release'] * 1000:.0f}; compute {med['compute_s']:.1f} s; longest "
            f"full GC during submit+compute {med['gc_submit'] * 1000:.0f}"
        )


if __name__ == "__main__":
    main()
