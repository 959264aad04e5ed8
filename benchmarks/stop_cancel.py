"""What an orderly stop's first step costs the scheduler: ``ClusterStops`` cancels every
live task of the run in one synchronous pass (``SchedulerState._cluster_stops``), and
the scheduler's event loop takes nothing else meanwhile.

    python benchmarks/stop_cancel.py                 # 50,000 live tasks, best of 3
    python benchmarks/stop_cancel.py 150000
    python benchmarks/stop_cancel.py --no-monitor    # no monitoring feed

The run: N tasks, half independent and half in chains of 10 (so that live tasks are
queued, waiting and running), submitted to a core with four 2-core workers and the
monitoring feed on (a manager with ``--monitoring``); the workers take their first
batches, then ``ClusterStops`` is timed alone. Printed: the pass's seconds and
microseconds per live task, the best of 3 runs (each on a fresh core).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Hashable
from typing import Any

from dask._task_spec import Task, TaskRef

from actors.scheduler_events import ClusterStops, GraphSubmitted, WorkerJoined
from actors.scheduler_records import ACTIVE, SchedulerConfig
from actors.scheduler_state import SchedulerState
from runtime.graph import build_specs


def _noop(*args: Any) -> None:
    return None


def once(n: int, monitor: bool) -> tuple[float, int]:
    """Seconds ``ClusterStops`` took on a core with ``n`` live tasks, and how many were live."""
    st = SchedulerState(SchedulerConfig(monitor=monitor))
    dsk: dict[Hashable, Any] = {}
    for i in range(n // 2):
        dsk[f"t-{i}"] = Task(f"t-{i}", _noop)
    for i in range(n - n // 2):
        key, prev = f"c-{i}", f"c-{i - 1}"
        dsk[key] = Task(key, _noop, TaskRef(prev)) if i % 10 else Task(key, _noop)
    specs = build_specs(dsk, list(dsk))
    for w in range(4):
        st.handle(WorkerJoined(f"j{w}", 1.0, f"w{w}", 2, 2**30, "default"))
    st.handle(GraphSubmitted("s", 1.0, specs=specs, wanted=tuple(dsk)))
    if monitor:  # the recorder has read what the submission recorded
        st.feed_since(0, 10**9)
    live = sum(ts.state in ACTIVE for ts in st.tasks.values())
    start = time.perf_counter()
    st.handle(ClusterStops("stop", 2.0))
    return time.perf_counter() - start, live


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print("usage: python benchmarks/stop_cancel.py [N] [--no-monitor]\n"
              "  N: tasks (default 50,000), all live at the stop; best of 3")  # fmt: skip
        sys.exit(0)
    args = [a for a in sys.argv[1:] if a != "--no-monitor"]
    n = int(args[0]) if args else 50_000
    monitor = "--no-monitor" not in sys.argv
    took, live = min(once(n, monitor) for _ in range(3))
    feed = "feed on" if monitor else "feed off"
    print(
        f"ClusterStops: {took:.3f} s for {live} live tasks, {took / live * 1e6:.1f} us per "
        f"live task ({feed}, best of 3)"
    )
