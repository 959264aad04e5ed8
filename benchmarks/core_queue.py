"""The scheduler core alone: N independent no-op tasks submitted to ``SchedulerState``,
placed on four 2-core workers and finished; prints the best of 5 runs in seconds.

Every task enters and leaves the ready queue once, so this times the core's hot path,
metrics bookkeeping included, without the event loop, threads or messages around it.

    python benchmarks/core_queue.py            # 20,000 tasks
    python benchmarks/core_queue.py 50000
"""

from __future__ import annotations

import sys
import time

from actors.protocol import TaskResult
from actors.scheduler_state import (
    Command,
    Execute,
    GraphSubmitted,
    SchedulerState,
    TasksFinished,
    WorkerJoined,
)
from runtime.graph import Task, build_specs


def _noop() -> None:
    return None


def once(n: int) -> float:
    st = SchedulerState()
    dsk = {f"t-{i}": Task(f"t-{i}", _noop) for i in range(n)}
    specs = build_specs(dsk, list(dsk))
    start = time.perf_counter()
    now = 1.0
    out: list[Command] = []
    for w in range(4):
        out += st.handle(WorkerJoined(f"j{w}", now, f"w{w}", 2, 2**30, "default"))
    out += st.handle(GraphSubmitted("s", now, specs=specs, wanted=tuple(dsk)))
    while out:
        now += 0.001
        done: list[Command] = []
        for cmd in out:
            if isinstance(cmd, Execute):
                res = tuple(TaskResult(t.key, "ok", now, now, 8) for t in cmd.tasks)
                done += st.handle(TasksFinished("f", now, cmd.worker, res))
        out = done
    return time.perf_counter() - start


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    print(f"{min(once(n) for _ in range(5)):.3f} s for {n} tasks")
