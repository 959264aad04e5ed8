"""A manager process serving cron-like client sessions one after another: does what it
keeps grow with the sessions? (The longrun audit's defect 3: RSS 76.5 -> 127 MB over
502 sessions, still rising slowly.)

It starts a real manager (``python -m runtime manager``, monitoring on as deployed, or
``--no-monitoring``) and two workers (one thread worker with 2 cores, one process
worker), then runs ``--sessions`` client sessions from this process, each a new
``Cluster(ADDRESS)`` connection that submits a calibration-like graph of about
``--tasks`` tasks (``load -> bias -> flat -> check`` per frame, a ``stats`` per 50
frames, frames with ``seed % 97 == 0`` raise ``ValueError``; fresh keys per session),
waits for all of it with ``as_completed`` and disconnects. Every ``--every`` sessions
it prints the manager's RSS (``/proc/PID/status``) and, from ``status()``, its runs.

With ``--tracemalloc FRAMES`` the manager runs through this file's ``_manager`` entry
(which runs ``python -m runtime manager`` in-process): after session ``--trace-from``
the driver sends it SIGUSR2, on which it starts ``tracemalloc`` (from then on only: it
slows the manager several times), and at each session of ``--snap-at`` SIGUSR1, on
which it collects garbage, writes a snapshot and the counts of live objects by type.
At the end the growth between the first and the last snapshot is printed by source
line (top 25), by traceback (top 5) and by object type. (A bounded store that fills
and then turns over shows as steady between two snapshots; one that grows, as growth.)

    python benchmarks/manager_growth.py --sessions 400 --tasks 300
    python benchmarks/manager_growth.py --sessions 400 --tasks 300 \\
        --tracemalloc 6 --trace-from 100 --snap-at 250,400

Ports: ``--port`` (the manager's) on 127.0.0.1; workers take free ports of 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


# -- the tasks (functions of __main__: they travel by value) ------------------------


def load(session: int, seed: int) -> bytes:
    if seed % 97 == 0:
        raise ValueError(f"frame {seed} unreadable")
    return bytes(256) + seed.to_bytes(8, "little") + session.to_bytes(8, "little")


def bias(frame: bytes) -> bytes:
    return frame[::-1]


def flat(frame: bytes) -> bytes:
    return frame[::-1]


def check(frame: bytes) -> int:
    return len(frame)


def stats(*sizes: int) -> int:
    return sum(sizes)


# -- the manager under tracemalloc ----------------------------------------------------


def serve_manager(snapdir: str, frames: int, argv: list[str]) -> int:
    """``python -m runtime manager ARGV...`` in this process. SIGUSR2: start tracemalloc
    (``frames`` deep); SIGUSR1: collect, snapshot (when tracing), count objects by type,
    then mark done."""
    import tracemalloc

    taken = 0

    def start(signum: int, frame: Any) -> None:
        gc.collect()
        tracemalloc.start(frames)
        (Path(snapdir) / "tracing").write_text("")

    def snap(signum: int, frame: Any) -> None:
        nonlocal taken
        taken += 1
        gc.collect()
        out = Path(snapdir)
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(out / f"snap-{taken}.pickle"))
        objects = gc.get_objects()
        types = Counter(type(o).__qualname__ for o in objects)
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        info = {"types": dict(types), "traced": traced, "objects": sum(types.values()),
                "holders": holders(objects)}  # fmt: skip
        del objects
        (out / f"types-{taken}.json").write_text(json.dumps(info))
        (out / f"done-{taken}").write_text("")

    signal.signal(signal.SIGUSR1, snap)
    signal.signal(signal.SIGUSR2, start)
    from runtime.__main__ import main

    return main(["manager", *argv])


def holders(objects: list[Any]) -> dict[str, int]:
    """What holds the tasks' category names (a string per task, ``"check"``...) and
    their keys (``"check-<token>"``): for one string in every hundred, the containers
    that refer to it (a tuple of strings alone is not tracked by the collector: it is
    found inside the containers that are), counted by type and shape."""
    names = {"load", "bias", "flat", "check", "stats"}
    found: Counter[str] = Counter()
    seen: set[int] = set()

    def look(x: Any, holder: Any, parent: Any) -> None:
        if type(x) is str and id(x) not in seen and (x in names or x[:5].split("-")[0] in names):
            seen.add(id(x))
            if len(seen) % 100 == 0:
                kind = "name" if x in names else "key"
                found[f"{kind} <- {type(parent).__qualname__}{_shape(holder)}"] += 1

    for o in objects:
        t = type(o)
        if t is dict:
            items: Any = [*o.keys(), *o.values()]
        elif t in (list, tuple, set, frozenset) or t.__name__ == "deque":
            items = o
        else:
            slots = getattr(t, "__slots__", ())
            items = [getattr(o, a, None) for a in (slots if isinstance(slots, tuple) else ())]
        for x in items:
            if type(x) is tuple and not gc.is_tracked(x):
                for y in x:
                    look(y, x, o)
            else:
                look(x, o, o)
    return dict(found.most_common(20))


def _shape(o: Any) -> str:
    if type(o) is tuple:
        return f"/{len(o)}:{'/'.join(type(x).__name__ for x in o[:6])}"
    if type(o) is dict:
        return f"/keys:{','.join(map(str, list(o)[:5]))}"
    return ""


# -- the driver -----------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def session(address: str, number: int, tasks: int) -> tuple[int, int]:
    """One cron-like client session; (tasks submitted, tasks failed)."""
    from runtime import Cluster

    frames = max(1, tasks * 50 // 201)  # 4 per frame and 1 stats per 50 frames
    async with Cluster(address) as c:
        checks = []
        for i in range(frames):
            seed = number * 100_003 + i
            f = c.submit(load, number, seed)
            checks.append(c.submit(check, c.submit(flat, c.submit(bias, f))))
        sums = [c.submit(stats, *checks[i : i + 50]) for i in range(0, frames, 50)]
        failed = 0
        async for fut in c.as_completed([*checks, *sums]):
            try:
                await fut
            except Exception:
                failed += 1
    return frames * 4 + len(sums), failed


async def drive(args: argparse.Namespace, address: str, pid: int, snapdir: Path) -> None:
    from runtime import Cluster

    snap_at = sorted(int(s) for s in args.snap_at.split(",") if s)
    taken = 0
    t0 = time.monotonic()
    total = 0
    print(f"{'session':>7} {'tasks':>8} {'secs':>6} {'rss MB':>7} {'runs':>5} "
          f"{'traced MB':>9} {'objects':>9}", flush=True)  # fmt: skip
    for n in range(1, args.sessions + 1):
        done, _ = await session(address, n, args.tasks)
        total += done
        if args.tracemalloc and n == args.trace_from:
            os.kill(pid, signal.SIGUSR2)
            await until(snapdir / "tracing")
        snapped = n in snap_at
        if snapped:
            taken += 1
            os.kill(pid, signal.SIGUSR1)
            await until(snapdir / f"done-{taken}")
        if n % args.every == 0 or snapped or n == 1:
            async with Cluster(address) as c:
                status = await c.status()
            line = (f"{n:>7} {total:>8} {time.monotonic() - t0:>6.0f} {rss_mb(pid):>7.1f} "
                    f"{status['runs']:>5}")  # fmt: skip
            if snapped:
                info = json.loads((snapdir / f"types-{taken}.json").read_text())
                line += f" {info['traced'] / 2**20:>9.1f} {info['objects']:>9}"
            print(line, flush=True)
    if taken >= 2:
        compare(snapdir, 1, taken, snap_at)


async def until(marker: Path, limit: float = 300) -> None:
    """Wait (bounded) for the manager to write ``marker``."""
    deadline = time.monotonic() + limit
    while not await asyncio.to_thread(marker.exists):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the manager wrote no {marker.name} within {limit} s")
        await asyncio.sleep(0.2)


def compare(snapdir: Path, first: int, last: int, snap_at: list[int]) -> None:
    import tracemalloc

    print(f"\ngrowth between session {snap_at[first - 1]} and {snap_at[last - 1]}")
    ta = json.loads((snapdir / f"types-{first}.json").read_text())["types"]
    tb = json.loads((snapdir / f"types-{last}.json").read_text())["types"]
    grown = sorted(((tb.get(k, 0) - ta.get(k, 0), k) for k in set(ta) | set(tb)), reverse=True)
    print("objects by type (top 15):")
    for diff, name in grown[:15]:
        print(f"  {diff:>+8} {name} ({tb.get(name, 0)})")
    for n in (first, last):
        held = json.loads((snapdir / f"types-{n}.json").read_text())["holders"]
        print(f"what holds the tasks' names and keys at snapshot {n} (sampled 1/100):")
        for what, count in held.items():
            print(f"  {count:>6} {what}")
    if not (snapdir / f"snap-{first}.pickle").exists():
        return
    a = tracemalloc.Snapshot.load(str(snapdir / f"snap-{first}.pickle"))
    b = tracemalloc.Snapshot.load(str(snapdir / f"snap-{last}.pickle"))
    skip = [tracemalloc.Filter(False, tracemalloc.__file__)]
    a, b = a.filter_traces(skip), b.filter_traces(skip)
    print(f"traced: {sum(t.size for t in a.traces) / 2**20:.1f} MB -> "
          f"{sum(t.size for t in b.traces) / 2**20:.1f} MB; by line (top 25):")  # fmt: skip
    for stat in b.compare_to(a, "lineno")[:25]:
        where = stat.traceback[0]
        print(f"  {stat.size_diff / 1024:>9.1f} KiB {stat.count_diff:>+8} blocks  "
              f"{'/'.join(where.filename.split('/')[-2:])}:{where.lineno}")  # fmt: skip
    print("by traceback (top 5):")
    for stat in b.compare_to(a, "traceback")[:5]:
        print(f"  {stat.size_diff / 1024:>9.1f} KiB {stat.count_diff:>+8} blocks")
        for fr in stat.traceback.format()[-12:]:
            print(f"      {fr}")


def main() -> None:
    if sys.argv[1:2] == ["_manager"]:
        sys.exit(serve_manager(sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--tasks", type=int, default=300, help="tasks per session (about)")
    parser.add_argument("--every", type=int, default=25, help="print a sample every N")
    parser.add_argument("--port", type=int, default=36100, help="the manager's port")
    parser.add_argument("--no-monitoring", action="store_true")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES")
    parser.add_argument("--trace-from", type=int, default=100, help="start tracing after it")
    parser.add_argument("--snap-at", default="250,400", help="sessions to snapshot at")
    parser.add_argument("--snapshots", help="keep the snapshots in this directory")
    args = parser.parse_args()
    from runtime.cli_processes import TREE, Cli

    with (
        tempfile.TemporaryDirectory(prefix="corral-growth-") as tmp,
        Cli(Path(tmp) / "home", cwd=TREE, grace=30) as procs,
    ):
        snapdir = Path(args.snapshots or Path(tmp) / "snaps")
        snapdir.mkdir(parents=True, exist_ok=True)
        flags = ["--listen", f"127.0.0.1:{args.port}"]
        flags += ["--no-monitoring"] if args.no_monitoring else []
        proc = procs.spawn(
            [sys.executable, str(HERE), "_manager", str(snapdir), str(args.tracemalloc), *flags]
        )
        line = procs.line_with(proc, "manager listening on", limit=120)
        address = line.split("manager listening on", 1)[1].strip()
        workers = [
            procs.start("worker", address, "--name", "wthr", "--cores", "2", "--memory", "1GiB"),
            procs.start("worker", address, "--name", "wproc", "--execution", "process",
                        "--cores", "1", "--memory", "1GiB"),
        ]  # fmt: skip
        for w in workers:
            procs.line_with(w, "joined", limit=120)
        print(f"manager {address} pid {proc.pid}; "
              f"monitoring {'off' if args.no_monitoring else 'on'}; "
              f"tracemalloc {args.tracemalloc or 'off'}", flush=True)  # fmt: skip
        asyncio.run(drive(args, address, proc.pid, snapdir))


if __name__ == "__main__":
    main()
