"""What the scheduler's intake queue (``actors.scheduler._IntakeQueue``) takes when one
client's many small submissions wait for its own large graph (review 1207d F1): a
40-piece graph (500 tasks a piece) has its first piece taken, then the same client
adds ``k`` one-piece jobs that each read a key of the graph's last piece, and the
queue is drained. A pure figure: no cluster, timed with ``perf_counter``. ``worst
pop`` is the longest single turn (one ``_Intake`` message on the scheduler's loop).

    python benchmarks/intake_queue.py                    # k = 1000, 2000, 4000
    python benchmarks/intake_queue.py --tree OTHER 4000  # another checkout's queue
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(k: int, pieces: int = 40) -> tuple[float, float, float, int]:
    """Seconds to add the ``k`` jobs, to drain the queue, the worst turn, turns."""
    from actors.scheduler import _IntakeQueue, _Turn

    def apply(stimulus: str) -> None:
        pass

    q = _IntakeQueue()
    big = [
        _Turn(apply, "s", specs=dict.fromkeys(("big", p, i) for i in range(500)), keys=())
        for p in range(pieces)
    ]
    q.add(q.job("c", big))
    q.pop()
    start = time.perf_counter()
    for j in range(k):
        reads = frozenset({("big", pieces - 1, 0)})
        q.add(q.job("c", [_Turn(apply, "s", specs={("small", j): None}, keys=(reads,))]))
    added = time.perf_counter()
    worst, turns = 0.0, 0
    while True:
        t0 = time.perf_counter()
        turn = q.pop()
        worst = max(worst, time.perf_counter() - t0)
        if turn is None:
            break
        turns += 1
    return added - start, time.perf_counter() - added, worst, turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("k", nargs="*", type=int, default=[1000, 2000, 4000])
    parser.add_argument("--tree", default=HERE, help="the checkout whose queue to time")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.tree))
    for k in args.k:
        add, drain, worst, turns = run(k)
        print(
            f"k={k}: add {add:.3f} s, drain {drain:.3f} s, worst pop {worst * 1000:.1f} ms"
            f" ({turns} turns)"
        )


if __name__ == "__main__":
    main()
