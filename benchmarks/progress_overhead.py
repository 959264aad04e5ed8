"""What following a map's progress costs: a ``map`` of ``--tasks`` (10,000) no-op tasks
on ``Cluster(workers=2)``, timed from the ``map`` call until every value is gathered,
with no display (``gather``), with ``cluster.progress(futures)`` writing to a log (not
a terminal: a line every 10 s) or to a terminal (a bar drawn every 0.2 s) before the
``gather``, and with ``gather`` under dask's ``ProgressBar``; the kinds interleaved,
``--repeat`` (5) rounds. Prints, per kind, the wall seconds and the process's CPU
seconds (the cluster is in-process: the workers' threads count too), best and median;
then the client's part alone (median of 5): taking the ``--tasks`` futures in as
pending (``runtime.client._Ends``), telling each its end, one answer and draw.

    python benchmarks/progress_overhead.py
    python benchmarks/progress_overhead.py --tasks 10000 --repeat 7
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from typing import Any

import anyio
from dask.diagnostics import ProgressBar

from runtime import Cluster
from runtime.client import _Ends
from runtime.progress import TextBar


class _Terminal(io.StringIO):
    """A terminal as ``progress`` tells one: ``isatty()`` true."""

    def isatty(self) -> bool:
        return True


def inc(x: int) -> int:
    return x + 1


async def _one(cluster: Cluster, kind: str, tasks: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    futures = cluster.map(inc, range(tasks), pure=False)
    values: list[Any]
    if kind == "gather":
        values = await cluster.gather(futures)
    elif kind == "ProgressBar+gather":
        with ProgressBar(out=io.StringIO()):
            values = await cluster.gather(futures)
    else:
        out = _Terminal() if kind == "progress(tty)+gather" else io.StringIO()
        counts = await cluster.progress(futures, out=out)
        assert counts["finished"] == tasks, counts
        values = await cluster.gather(futures)
    assert values[-1] == tasks
    return time.perf_counter() - wall, time.process_time() - cpu


async def main(tasks: int, repeat: int) -> None:
    kinds = ("gather", "progress(log)+gather", "progress(tty)+gather", "ProgressBar+gather")
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    async with Cluster(workers=2) as cluster:
        await cluster.gather(cluster.map(inc, range(1000), pure=False))  # warm up
        for _ in range(repeat):
            for kind in kinds:
                runs[kind].append(await _one(cluster, kind, tasks))
                await anyio.sleep(0.5)
        part = await _client_part(cluster, tasks)
    print(f"{tasks} tasks, {repeat} rounds: seconds, best / median")
    for kind, got in runs.items():
        wall, cpu = [w for w, _ in got], [c for _, c in got]
        print(
            f"{kind:22s} wall {min(wall):5.2f} / {statistics.median(wall):5.2f}"
            f"   CPU {min(cpu):5.2f} / {statistics.median(cpu):5.2f}"
        )
    print(part)


async def _client_part(cluster: Cluster, tasks: int) -> str:
    futures = cluster.map(inc, range(tasks), pure=False)
    await cluster.gather(futures)  # done: each watch holds its KeyDone
    client, keys = cluster._client_actor, [f.key for f in futures]
    taken, told, drawn = [], [], []
    for _ in range(5):
        words = {k: client.watches[k].update for k in keys}
        for k in keys:  # as if none had ended
            client.watches[k].update = None
        t0 = time.perf_counter()
        ends = _Ends(client, keys)
        t1 = time.perf_counter()
        for k in keys:  # each word comes: the client actor pops the key's waiters
            client.watches[k].update = words[k]
            client.waiters.pop(k, None)
            ends.settle(k, True)
        t2 = time.perf_counter()
        TextBar(io.StringIO(), 0.0).draw(ends.tally.answer(), 1.0)
        t3 = time.perf_counter()
        assert ends.tally.finished == tasks and not ends.pending
        taken.append(t1 - t0)
        told.append(t2 - t1)
        drawn.append(t3 - t2)
    m = statistics.median
    return (
        f"client's part, median of 5: {tasks} futures taken in {m(taken) * 1e3:.1f} ms, "
        f"their ends told {m(told) * 1e3:.1f} ms ({m(told) / tasks * 1e6:.2f} us each), "
        f"an answer and a draw {m(drawn) * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    anyio.run(main, args.tasks, args.repeat)
