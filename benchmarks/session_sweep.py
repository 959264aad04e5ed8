"""What the clean-up after a worker process's exit costs, and how soon the programs a
worker killed outright left are gone.

    python benchmarks/session_sweep.py                     # 0 and 1,000 extra processes
    python benchmarks/session_sweep.py --extra 0 3000 --runs 5
    python benchmarks/session_sweep.py --port 40800        # the embedded cluster's port

Two parts:

- **The pass over /proc.** :func:`runtime.lifeline.kill_session` reads every process's
  /proc/<pid>/stat to find a session's members: its cost grows with the machine's
  process table. Timed for a session with no member left (a clean stop's case), with
  ``--extra`` idle processes (``sleep``) added to the machine's, the best of 5 rounds of
  20 passes (so the load of a shared machine counts least).
- **SIGKILL to gone.** An embedded cluster with a ``local`` pool of one worker process
  (listening on ``--port`` and the 19 ports after it); a task starts ``sleep 300`` and
  waits for it; the worker is killed with SIGKILL, and the time until the program is
  gone (or a zombie) is measured, ``--runs`` times per execution mode.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Cluster
from runtime.lifeline import session_members


def pass_cost(extra: int) -> tuple[int, float]:
    """The machine's process count with ``extra`` more, and one pass's best time (ms)."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    try:
        count = len(psutil.pids())
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                session_members(2**22 + 1)  # (above any pid: a session nobody is in)
            best = min(best, (time.perf_counter() - start) / 20)
        return count, best * 1000
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def start_and_wait(pidfile: str) -> int:
    """The task: start ``sleep 300``, write its pid and the worker's, wait for it (its
    retry, once the file is there, returns at once)."""
    path = Path(pidfile)
    if path.exists():
        return 0
    program = subprocess.Popen(["sleep", "300"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{program.pid} {os.getpid()} {os.getppid()}")
    tmp.rename(path)
    return program.wait()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def until(condition: Callable[[], bool], limit: float, step: float) -> None:
    """Poll ``condition`` every ``step`` seconds until it holds (TimeoutError past
    ``limit`` seconds)."""
    with anyio.fail_after(limit):
        while True:
            if condition():
                return
            await anyio.sleep(step)


async def kill_to_gone(execution: str, port: int, directory: Path, run: int) -> float:
    """Seconds from the worker's SIGKILL until its task's program is gone."""
    pidfile = directory / f"{execution}-{run}.pid"
    pool = {
        "provider": "local",
        "execution": execution,
        "worker_port_range": f"{port + 1}-{port + 19}",
    }
    async with Cluster(pools={"p": pool}, processes=True, port=port) as c:
        fut = c.submit(start_and_wait, str(pidfile))
        await until(pidfile.exists, 120, 0.01)
        program, runner, parent = map(int, pidfile.read_text().split())
        worker = runner if execution == "thread" else parent
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        try:
            await until(lambda: gone(program), 30, 0.001)
        finally:
            if not gone(program):
                os.kill(program, signal.SIGKILL)
        took = time.monotonic() - start
        fut.release()
    return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", type=int, nargs="+", default=[0, 1000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=40800)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    for extra in args.extra:
        count, ms = pass_cost(extra)
        print(f"pass over /proc: {count} processes, {ms:.2f} ms ({ms * 1000 / count:.1f} us each)")
    with tempfile.TemporaryDirectory() as tmp:
        for execution in ("thread", "process"):
            took = [
                await kill_to_gone(execution, args.port, Path(tmp), run) for run in range(args.runs)
            ]
            print(
                f"{execution}: SIGKILL to gone, median {statistics.median(took) * 1000:.0f} ms,"
                f" max {max(took) * 1000:.0f} ms ({args.runs} runs)"
            )


if __name__ == "__main__":
    anyio.run(main)
