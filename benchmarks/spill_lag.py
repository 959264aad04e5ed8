"""The event loop's worst stall while a worker's store spills one large output and a
task's input is read back: the store's synchronous spill and read (what the worker did
on its event loop before) against ``spill_keys_off_loop`` and ``load_opened`` in a
thread (what it does now), interleaved in one process.

    python benchmarks/spill_lag.py                  # 800 MB (np.ones, uint8), 3 rounds
    python benchmarks/spill_lag.py --mb 200 --rounds 5 --dir /some/disk

A probe sleeps 5 ms in a loop and records by how much each sleep overran. Printed, per
round and way: the seconds the spill (and the read back) took, and the probe's worst
overrun during each: the time no heartbeat, fetch or message could have been handled.
The spill files go to ``--dir`` (default: the temporary directory).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from actors.store import SpillStore, load_opened

PROBE = 0.005  # seconds the probe sleeps


async def worst_stall(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Run ``work()`` with the probe beside it; its seconds and the worst overrun."""
    worst = [0.0]
    done = anyio.Event()

    async def probe() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await anyio.sleep(PROBE)
            worst[0] = max(worst[0], time.perf_counter() - before - PROBE)

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe)
        await anyio.sleep(0.05)  # the probe is running
        start = time.perf_counter()
        await work()
        took = time.perf_counter() - start
        done.set()
    return took, worst[0]


async def one_round(nbytes: int, directory: str | None, off_loop: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    with SpillStore(directory) as store:
        store.put("big", np.ones(nbytes, dtype=np.uint8), nbytes)

        async def spill() -> None:
            if off_loop:
                moved = await store.spill_keys_off_loop(nbytes)
            else:
                moved = store.spill_keys(nbytes)
            assert moved == ["big"], moved

        async def read() -> None:
            if off_loop:
                value = await anyio.to_thread.run_sync(load_opened, store.open_spilled("big"))
            else:
                value = store.peek("big")
            assert value.nbytes == nbytes
            del value

        out["spill_s"], out["spill_stall_s"] = await worst_stall(spill)
        out["read_s"], out["read_stall_s"] = await worst_stall(read)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=800, help="the output's size, in MB (10^6)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where spill files go")
    args = parser.parse_args()
    nbytes = args.mb * 10**6
    directory = args.dir or tempfile.gettempdir()
    runs: dict[str, list[dict[str, float]]] = {"on the loop": [], "off the loop": []}
    for r in range(args.rounds):
        for way, off in (("on the loop", False), ("off the loop", True)):
            got = await one_round(nbytes, directory, off)
            runs[way].append(got)
            print(
                f"round {r + 1} {way:>12}: spill {got['spill_s']:.2f} s, worst stall "
                f"{got['spill_stall_s']:.3f} s; read {got['read_s']:.2f} s, worst stall "
                f"{got['read_stall_s']:.3f} s",
                flush=True,
            )
    for way, rows in runs.items():
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        print(
            f"median {way:>12}: spill {med['spill_s']:.2f} s (stall {med['spill_stall_s']:.3f} s), "
            f"read {med['read_s']:.2f} s (stall {med['read_stall_s']:.3f} s)"
        )


if __name__ == "__main__":
    anyio.run(main)
