"""What one memory sample of a worker costs, before and after it counts the programs its
tasks started (their processes, under each task process or each executor thread).

    python benchmarks/descendants_cost.py             # 4 slots, 20,000 samples each
    python benchmarks/descendants_cost.py --slots 8 -n 50000
    python benchmarks/descendants_cost.py --programs 100 -n 500   # many programs per task

A worker samples its memory every ``interval`` (50 ms by default) and after fence
crossings: in process execution the RSS of each running task process, and the total;
in thread execution its own RSS. Timed here on real executors (``--slots`` task
processes or threads), idle (no program running: the common case) and with each slot's
task running ``--programs`` programs (``sleep``; 1 by default) under it:

- process, before: ``rss()`` plus ``rss_of(pid)`` per task process, the per-task figures
  read once more (the worker's ``_sample`` at main);
- process, after: ``ProcessExecutor.running_rss()``: one ``tree_rss`` per task process
  (its RSS and that of every process under it) for both;
- thread, before: ``rss()``; after: ``Executor.total_rss()`` (``rss()`` plus the
  programs the executor's threads started).

Printed: microseconds per sample (the best of 5 rounds of ``-n`` samples, so the load of
a shared machine counts least), and what share of one core that is at one sample per
50 ms.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dask._task_spec import Task

import actors.executor
from actors.executor import Executor, ProcessExecutor, descendants, rss, rss_of
from actors.protocol import ToRun

INTERVAL = 0.05  # the worker's memory tick, seconds


def run_program(gate: str, programs: int = 1) -> int:
    """A task body: run ``programs`` programs (``sleep``) until the benchmark opens the
    gate."""
    import subprocess

    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(programs)]
    try:
        while not Path(gate).exists():
            time.sleep(0.01)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return 0


def wait_idle(gate: str, programs: int = 0) -> int:
    """A task body: no program, until the benchmark opens the gate."""
    while not Path(gate).exists():
        time.sleep(0.01)
    return 0


def per_sample(fn: Callable[[], Any], n: int) -> float:
    """Microseconds per call of ``fn``, the best of 5 rounds of ``n`` calls."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def before_process(ex: ProcessExecutor) -> None:
    tasks = [(k, rss_of(pid)) for k, pid in ex.running().items()]
    rss() + sum(rss_of(pid) for pid in ex.pids())
    del tasks


def started(ex: Executor | ProcessExecutor, slots: int, programs: int) -> None:
    """Wait (at most a minute) until every slot runs its task, and its programs began
    (a task process takes seconds to start under load)."""
    deadline = time.monotonic() + 60

    def programs_up() -> bool:
        if isinstance(ex, ProcessExecutor):
            return all(len(descendants(pid)) >= programs for pid in ex.pids())
        return len(descendants(os.getpid())) >= slots * programs

    while time.monotonic() < deadline and not (len(ex.executing()) >= slots and programs_up()):
        time.sleep(0.05)
    time.sleep(0.5)


def show(what: str, micros: float) -> None:
    share = micros / 1e6 / INTERVAL * 100
    print(f"  {what:<44} {micros:8.1f} us/sample  ({share:.3f}% of a core at 20/s)")


async def measure(slots: int, n: int, programs: int, tmp: Path) -> None:
    body = run_program if programs else wait_idle
    label = f"{programs} program(s) under each slot" if programs else "no program"
    print(f"{slots} slots, {label}, {threading.active_count()} threads in this process:")
    for mode in ("process", "thread"):
        gate = tmp / f"gate-{mode}-{programs}"
        ex: Executor | ProcessExecutor
        if mode == "process":
            ex = ProcessExecutor(slots, "bench", lambda batch: None)
        else:
            ex = Executor(slots, "bench", lambda batch: None)
        try:
            for i in range(slots):
                key = f"t{i}"
                ex.submit(ToRun(key, Task(key, body, str(gate), programs), "t", ()), {})
            await anyio.to_thread.run_sync(started, ex, slots, programs)
            if isinstance(ex, ProcessExecutor):
                pe = ex
                show(
                    "process, before (rss_of per task process)",
                    per_sample(functools.partial(before_process, pe), n),
                )
                show("process, after (running_rss: trees)", per_sample(pe.running_rss, n))
                if programs and hasattr(actors.executor, "ProgramTree"):
                    # (walked at most once a second per task process: at 20 samples a
                    # second, a sample's share of the walks is slots x this / 20)
                    walk = functools.partial(actors.executor.program_rss, pe.pids()[0])
                    show("process, one walk of one tree (program_rss)", per_sample(walk, 20))
            else:
                show("thread, before (rss())", per_sample(rss, n))
                show("thread, after (total_rss(): + programs)", per_sample(ex.total_rss, n))
        finally:
            gate.touch()
            await anyio.to_thread.run_sync(ex.shutdown, True)


async def main(slots: int, n: int, programs: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for count in (0, programs):
            await measure(slots, n, count, Path(tmp))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4, help="task processes or threads")
    parser.add_argument("-n", type=int, default=20_000, help="samples per round")
    parser.add_argument("--programs", type=int, default=1, help="programs under each slot")
    args = parser.parse_args()
    anyio.run(main, args.slots, args.n, args.programs)
