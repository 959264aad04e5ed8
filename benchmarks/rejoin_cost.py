"""What the scheduler core takes to settle a worker that rejoins holding many outputs
no task wants any more (``WorkerHeld``: the outputs of released tasks are junk, and
the core answers one ``DropData`` with them all). A pure-core figure: no cluster, one
event, timed with ``perf_counter``.

    python benchmarks/rejoin_cost.py                 # 10,000 and 30,000 outputs
    python benchmarks/rejoin_cost.py 100000
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from actors.scheduler_events import DropData, WorkerHeld, WorkerJoined
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState


def settle(n: int) -> float:
    """Seconds the core takes over one rejoin holding ``n`` unwanted outputs."""
    state = SchedulerState(SchedulerConfig())
    state.handle(WorkerJoined("join", 1.0, worker="w1", cores=1, memory=2**30, pool="default"))
    held = tuple((f"gone-{i}", 100) for i in range(n))
    start = time.perf_counter()
    out = state.handle(WorkerHeld("held", 2.0, worker="w1", active=frozenset(), held=held))
    took = time.perf_counter() - start
    (drop,) = [c for c in out if isinstance(c, DropData)]
    assert len(drop.keys) == n, "every unwanted output is dropped, once"
    return took


def main(argv: list[str]) -> int:
    for n in [int(a) for a in argv] or [10_000, 30_000]:
        print(f"{n:>8,} outputs held: {settle(n):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
