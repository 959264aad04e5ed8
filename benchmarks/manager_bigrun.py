"""One large flat run on a manager process and local worker processes (the scale audit,
findings 3-4): how long the manager's event loop stalls while it takes in, runs and lets
go of a 100,000-task ``map``, how many full garbage collections it makes and how long
the longest takes, and how much memory it keeps once nothing is wanted.

    python benchmarks/manager_bigrun.py --tasks 100000
    python benchmarks/manager_bigrun.py --tasks 100000 --manager-flags="--gc-threshold 700"

It starts a real manager (``python -m runtime manager --no-monitoring``, through this
file's ``_manager`` entry: a probe in the manager's event loop sleeps 20 ms in a loop
and records each overrun past 0.25 s, and a ``gc.callbacks`` hook times every
generation-2 collection; SIGUSR1 writes both and starts anew) and ``--workers`` worker
processes (1 core each), then from this process a client ``Cluster(ADDRESS)`` maps
``inc`` over ``range(--tasks)``, takes the results with ``as_completed`` and closes (its
keys are let go). Printed: ``map()``'s seconds, the last result's, the manager's RSS
(``/proc/PID/status``) at its peak and ``--after`` seconds after the close, and per
phase (the run; the close and the ``--after`` seconds after it) the loop's worst stall,
its stalls over 1 s, and the full collections (count, longest, their sum); then the
manager's log line of its give-back after the run, if it logged one (the manager runs
with ``--log-level info``).

``--second N``: a second client (another ``Cluster(ADDRESS, name="second")``) maps
``inc`` over N other items once the manager has the large ``map``'s every key (its
scheduler then takes it in): how long until its N results came, and whether the large
intake was still under way then (``--fair``: the ``fair`` priority, set by the first
client, ``set_policy``).

    python benchmarks/manager_bigrun.py --tasks 100000 --second 10 --fair

Ports: ``--port`` (the manager's) and ``--port-range`` (the workers') on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
PROBE = 0.02  #: seconds the manager's probe sleeps
NOTED = 0.25  #: overruns past this are recorded


def inc(x: int) -> int:
    return x + 1


# -- the manager (in this file's ``_manager`` entry) ----------------------------------


def serve_manager(outdir: str, argv: list[str]) -> int:
    """``python -m runtime manager ARGV...`` in this process, probed."""
    import anyio

    import runtime.node

    lags: list[tuple[float, float]] = []  #: (unix time, overrun) past NOTED
    worst = [0.0]
    fulls: list[tuple[float, float]] = []  #: (unix time, seconds) of each gen-2 collection
    began = [0.0]
    taken = [0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            fulls.append((time.time(), time.perf_counter() - began[0]))

    gc.callbacks.append(timed)

    def dump(signum: int, frame: Any) -> None:
        taken[0] += 1
        out = {"lags": list(lags), "worst": worst[0], "fulls": list(fulls)}
        lags.clear()
        fulls.clear()
        worst[0] = 0.0
        path = Path(outdir) / f"probe-{taken[0]}.json"
        path.with_suffix(".tmp").write_text(json.dumps(out))
        path.with_suffix(".tmp").rename(path)

    signal.signal(signal.SIGUSR1, dump)

    async def probe() -> None:
        while True:
            t = time.perf_counter()
            await anyio.sleep(PROBE)
            over = time.perf_counter() - t - PROBE
            worst[0] = max(worst[0], over)
            if over > NOTED:
                lags.append((time.time(), over))

    real = runtime.node.run_manager

    async def probed(*args: Any, **kwargs: Any) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            await real(*args, **kwargs)
            tg.cancel_scope.cancel()

    runtime.node.run_manager = probed  # type: ignore[assignment]
    from runtime.__main__ import main

    return main(["--log-level", "info", "manager", *argv])  # (its give-back line is INFO)


# -- the driver -----------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Peak:
    """The manager's RSS, sampled every 0.5 s in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except (OSError, RuntimeError):
                return


async def probed(pid: int, outdir: Path, n: int, limit: float = 120) -> dict[str, Any]:
    """SIGUSR1 the manager and read what its probe wrote (``probe-N.json``)."""
    os.kill(pid, signal.SIGUSR1)
    path = outdir / f"probe-{n}.json"
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the manager wrote no {path.name} within {limit} s")
        await asyncio.sleep(0.1)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def show(phase: str, p: dict[str, Any], t0: float) -> None:
    fulls = p["fulls"]
    longest = max((s for _, s in fulls), default=0.0)
    print(
        f"{phase}: loop's worst stall {p['worst']:.2f} s; stalls > 1 s: "
        + (", ".join(f"{s:.1f} s at +{at - t0:.0f} s" for at, s in p["lags"] if s > 1) or "none")
        + f"; full collections {len(fulls)}, longest {longest:.2f} s, "
        f"sum {sum(s for _, s in fulls):.2f} s"
        + "".join(f"; {s:.1f} s at +{at - t0:.0f} s" for at, s in fulls if s > 1),
        flush=True,
    )


async def cancelled(args: argparse.Namespace, address: str) -> None:
    """``--cancel``: the scale audit's finding 2. ``map`` of ``--tasks``, then, once the
    manager has every key (``status()["wanted_keys"]``, while its scheduler still takes
    the graph in), ``cancel`` of them all; how long until every future is settled, and
    how many tasks finished after the cancel."""
    from runtime import Cluster
    from runtime.errors import CancelledError

    async with Cluster(address) as c:
        futures = c.map(inc, range(args.tasks))
        await until_taken(c, args.tasks)
        before = sum(f.status == "finished" for f in futures)
        began = time.monotonic()
        await c.cancel(futures)
        returned = time.monotonic() - began
        ok = stopped = 0
        async for f in c.as_completed(futures):
            try:
                await f
                ok += 1
            except CancelledError:
                stopped += 1
        settled = time.monotonic() - began
    print(f"cancel() returned {returned:.2f} s; every future settled {settled:.1f} s after "
          f"the cancel; {stopped} cancelled, {ok - before} finished after the cancel "
          f"({before} before it)", flush=True)  # fmt: skip


async def until_taken(c: Any, n: int) -> None:
    """Once the manager has ``n`` wanted keys (the scheduler then takes them in)."""
    for _ in range(3000):  # (polled: at most 5 minutes)
        if (await c.status())["wanted_keys"] >= n:
            return
        await asyncio.sleep(0.1)


async def second(args: argparse.Namespace, address: str) -> None:
    """``--second N``: a second client's N tasks submitted while the large ``map`` is
    taken in; how long until its results came."""
    from runtime import Cluster

    async with Cluster(address, name="first") as c, Cluster(address, name="second") as s:
        if args.fair:
            await c.set_policy("priority", "fair")
        began = time.monotonic()
        futures = c.map(inc, range(args.tasks))
        await until_taken(c, args.tasks)
        sent = time.monotonic()
        assert await s.gather(s.map(inc, range(-args.second, 0))) == list(range(1 - args.second, 1))
        small = time.monotonic() - sent
        done = sum(f.status == "finished" for f in futures)
        async for _ in c.as_completed(futures):
            pass
        last = time.monotonic() - began
    print(f"second client's {args.second} tasks: results {small:.1f} s after they were "
          f"sent ({sent - began:.1f} s after map(), when the manager had its keys), "
          f"{done} of the large run's {args.tasks} finished by then; the large run's last "
          f"result {last:.1f} s after map()", flush=True)  # fmt: skip


async def drive(args: argparse.Namespace, address: str, pid: int, outdir: Path) -> None:
    from runtime import Cluster

    if args.cancel:
        await cancelled(args, address)
        return
    if args.second:
        await second(args, address)
        return
    peak = Peak(pid)
    print(f"manager RSS before: {rss_mb(pid):.0f} MB", flush=True)
    t0 = time.time()
    async with Cluster(address) as c:
        began = time.monotonic()
        futures = c.map(inc, range(args.tasks))
        mapped = time.monotonic() - began
        n = 0
        async for _ in c.as_completed(futures):
            n += 1
        last = time.monotonic() - began
        print(f"map() {mapped:.1f} s; last of {n} results {last:.1f} s; "
              f"RSS {rss_mb(pid):.0f} MB", flush=True)  # fmt: skip
        show("run", await probed(pid, outdir, 1), t0)
        del futures
    closed = time.monotonic()
    await asyncio.sleep(args.after)
    after = rss_mb(pid)
    show(f"close and {args.after:g} s after", await probed(pid, outdir, 2), t0)
    peak.stop.set()
    print(f"manager RSS peak {peak.peak:.0f} MB; {time.monotonic() - closed:.0f} s after "
          f"the close {after:.0f} MB", flush=True)  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["_manager"]:
        sys.exit(serve_manager(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--after", type=float, default=30.0, help="seconds watched after")
    parser.add_argument("--port", type=int, default=59510, help="the manager's port")
    parser.add_argument("--port-range", default="59520-59599", help="the workers' ports")
    parser.add_argument("--manager-flags", default="", help="more flags for the manager")
    parser.add_argument("--cancel", action="store_true", help="cancel the run during its intake")
    parser.add_argument(
        "--second", type=int, default=0, help="a second client's tasks, sent during the intake"
    )
    parser.add_argument("--fair", action="store_true", help="the fair priority (with --second)")
    args = parser.parse_args()
    from runtime.cli_processes import TREE, Cli

    with (
        tempfile.TemporaryDirectory(prefix="corral-bigrun-") as tmp,
        Cli(Path(tmp) / "home", cwd=TREE, grace=30) as procs,
    ):
        outdir = Path(tmp) / "probe"
        outdir.mkdir()
        flags = ["--listen", f"127.0.0.1:{args.port}", "--no-monitoring"]
        flags += shlex.split(args.manager_flags)
        proc = procs.spawn([sys.executable, str(HERE), "_manager", str(outdir), *flags])
        line = procs.line_with(proc, "manager listening on", limit=120)
        address = line.split("manager listening on", 1)[1].strip()
        workers = [
            procs.start("worker", address, "--cores", "1", "--memory", "1GiB",
                        "--port-range", args.port_range)
            for _ in range(args.workers)
        ]  # fmt: skip
        for w in workers:
            procs.line_with(w, "joined", limit=120)
        print(f"manager {address} pid {proc.pid}; flags {' '.join(flags)}", flush=True)
        asyncio.run(drive(args, address, proc.pid, outdir))
        try:  # (the manager logs its give-back after a large run: runtime.node._give_back)
            print(procs.line_with(proc, "gave memory back", limit=1).strip(), flush=True)
        except AssertionError:
            print("the manager logged no give-back", flush=True)


if __name__ == "__main__":
    main()
