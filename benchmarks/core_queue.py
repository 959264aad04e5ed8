"""The scheduler core alone: N independent no-op tasks submitted to ``SchedulerState``,
placed on four 2-core workers and finished; prints the best of 5 runs in seconds.

Every task enters and leaves the ready queue once, so this times the core's hot path,
metrics bookkeeping included, without the event loop, threads or messages around it.

    python benchmarks/core_queue.py            # 20,000 tasks
    python benchmarks/core_queue.py 50000
    python benchmarks/core_queue.py --monitor  # off and on, interleaved: the feed's cost

``--monitor`` times the core without and with the monitoring feed a monitoring
database reads (``SchedulerConfig(monitor=True)``), read the way the recorder does
(``feed_since`` after every batch of finishes), alternating the two 5 times each.

``--tree``: the graph is ``throughput.py``'s tree instead (N leaves summed 8 at a
time, level by level). ``--profile``: one run under cProfile; prints its total calls
and the functions with the most time of their own (these counts are the same from
run to run, unlike the times):

    python benchmarks/core_queue.py --profile          # independent
    python benchmarks/core_queue.py --tree --profile
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections.abc import Hashable
from typing import Any

from actors.protocol import TaskResult
from actors.scheduler_events import Command, Execute, GraphSubmitted, TasksFinished, WorkerJoined
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from runtime.graph import Task, build_specs


def _noop() -> None:
    return None


def once(
    n: int,
    monitor: bool = False,
    shape: str = "independent",
    profile: cProfile.Profile | None = None,
) -> float:
    st = SchedulerState(SchedulerConfig(monitor=monitor))
    since = 0
    dsk: dict[Hashable, Any]
    if shape == "tree":
        from throughput import tree  # (benchmarks/ is on the path when run as a script)

        dsk, root = tree(n)
        wanted: list[Hashable] = [root]
    else:
        dsk = {f"t-{i}": Task(f"t-{i}", _noop) for i in range(n)}
        wanted = list(dsk)
    specs = build_specs(dsk, wanted)
    if profile is not None:  # the core's work only, not the graph's making
        profile.enable()
    start = time.perf_counter()
    now = 1.0
    out: list[Command] = []
    for w in range(4):
        out += st.handle(WorkerJoined(f"j{w}", now, f"w{w}", 2, 2**30, "default"))
    out += st.handle(GraphSubmitted("s", now, specs=specs, wanted=tuple(wanted)))
    while out:
        now += 0.001
        done: list[Command] = []
        for cmd in out:
            if isinstance(cmd, Execute):
                res = tuple(TaskResult(t.key, "ok", now, now, 8) for t in cmd.tasks)
                done += st.handle(TasksFinished("f", now, cmd.worker, res))
        if monitor:  # the recorder reads what was recorded, as it does between polls
            _, since, _ = st.feed_since(since, 1_000_000)
        out = done
    took = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    return took


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print("usage: python benchmarks/core_queue.py [N] [--monitor] [--tree] [--profile]\n"
              "  N: tasks (default 20,000); --monitor: feed off against on, best of 5;\n"
              "  --tree: a tree of N leaves (fan-in 8); --profile: one run, cProfile")  # fmt: skip
        sys.exit(0)
    args = [a for a in sys.argv[1:] if a not in ("--monitor", "--tree", "--profile")]
    n = int(args[0]) if args else 20_000
    shape = "tree" if "--tree" in sys.argv else "independent"
    if "--profile" in sys.argv:
        profile = cProfile.Profile()
        once(n, shape=shape, profile=profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    elif "--monitor" in sys.argv:
        off, on = [], []
        for _ in range(5):
            off.append(once(n))
            on.append(once(n, monitor=True))
        print(f"feed off: best {min(off):.3f} s, feed on: best {min(on):.3f} s for {n} tasks")
        print(f"on/off: {min(on) / min(off):.2f}x (best of 5 each, interleaved)")
    else:
        print(f"{min(once(n, shape=shape) for _ in range(5)):.3f} s for {n} tasks ({shape})")
