"""What a worker process pays to receive a fetched partition, tree against tree.

A fetched value comes to a worker as a ``DataReply`` pickled in band
(``runtime.remote.to_wire``) in one frame of the websocket transport, 1 MiB chunks on
the wire. This times the receiving end alone, in a process set up as a worker process
is (glibc's mmap threshold fixed: ``actors.executor.give_back_freed_memory``, so every
large buffer it makes and frees costs fresh page faults): a sender process connects to
it over ``ws://127.0.0.1`` and sends ``--messages`` replies, each one partition of
``dataframe.py``'s events (250,000 rows, 8.6 MiB); the receiver takes each frame and
unpickles it (``from_wire``), as a worker does, and reports its own CPU (user + system)
and minor page faults per message, and how long ``dask.sizeof`` of one such frame takes
(what a fetching worker paid again per input before the holder's size came with it).

Each tree of ``--trees`` runs in fresh processes (``PYTHONPATH`` at it), by turns,
``--rounds`` times; reported per tree: the median of its rounds.

    git archive main | tar -x -C /tmp/old-fetchcopy
    python benchmarks/fetch_copies.py --trees old=/tmp/old-fetchcopy,new=. --port 35050
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def frame_value(rows: int) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dataframe import make_events  # the pipeline's partition

    return make_events(0, rows, 100_000)


async def receive(port: int, messages: int) -> dict[str, float]:
    import transport
    from runtime.remote import from_wire

    async with await transport.listen(f"ws://127.0.0.1:{port}/corral") as listener:
        print("listening", flush=True)
        async with await listener.accept() as conn:
            first = from_wire((await conn.receive()).msg, allow_pickle=True)  # warm-up
            del first
            use0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            for _ in range(messages):
                reply = from_wire((await conn.receive()).msg, allow_pickle=True)
                del reply
            wall = time.perf_counter() - t0
            use1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (use1.ru_utime - use0.ru_utime) + (use1.ru_stime - use0.ru_stime)
    return {
        "cpu_ms": 1000 * cpu / messages,
        "faults": (use1.ru_minflt - use0.ru_minflt) / messages,
        "wall_ms": 1000 * wall / messages,
    }


async def send(port: int, messages: int, rows: int) -> None:
    import transport
    from runtime.codec import Frame
    from runtime.messages import DataReply
    from runtime.remote import to_wire

    value = frame_value(rows)
    conn = await transport.connect(f"ws://127.0.0.1:{port}/corral", timeout=30)
    async with conn:
        for _ in range(messages + 1):
            await conn.send(Frame(to_wire(DataReply({"events-0": value}))))
        await conn.receive()  # until the receiver closes


def child(role: str, port: int, messages: int, rows: int) -> None:
    import anyio

    from actors.executor import give_back_freed_memory

    give_back_freed_memory()  # as in a worker process
    if role == "send":
        with contextlib.suppress(Exception):  # the receiver closed: done
            anyio.run(send, port, messages, rows)
        return
    out = anyio.run(receive, port, messages)
    from dask.sizeof import sizeof

    value = frame_value(rows)
    times = []
    for _ in range(15):
        t = time.perf_counter()
        sizeof(value)
        times.append(time.perf_counter() - t)
    out["sizeof_ms"] = 1000 * statistics.median(times)
    print("result " + json.dumps(out), flush=True)


def one_round(tree: str, port: int, messages: int, rows: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    me = str(Path(__file__).resolve())
    args = [str(port), str(messages), str(rows)]
    receiver = subprocess.Popen(
        [sys.executable, me, "--child", "receive", *args],
        env=env, cwd=tree, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "listening"
    sender = subprocess.Popen([sys.executable, me, "--child", "send", *args], env=env, cwd=tree)
    try:
        out, _ = receiver.communicate(timeout=600)
    finally:
        sender.kill()
        sender.wait()
        receiver.kill()
    line = next(x for x in out.splitlines() if x.startswith("result "))
    result: dict[str, float] = json.loads(line.removeprefix("result "))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default=f"this={ROOT}", help="name=path,name=path")
    parser.add_argument("--port", type=int, default=35050)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        role, port, messages, rows = args.child
        child(role, int(port), int(messages), int(rows))
        return
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; {args.messages} messages a round, {args.rows} rows a frame",
        flush=True,
    )
    got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, path in trees.items():
            res = one_round(str(Path(path).resolve()), args.port, args.messages, args.rows)
            got[name].append(res)
            print(
                f"  round {r + 1} {name:>6}: CPU {res['cpu_ms']:6.1f} ms, "
                f"{res['faults']:7.0f} minor faults, wall {res['wall_ms']:6.1f} ms a message; "
                f"sizeof {res['sizeof_ms']:.2f} ms",
                flush=True,
            )
    print(f"per received message, median of {args.rounds} rounds; load average now "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    for name, rows in got.items():
        med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
        print(
            f"{name:>8}: receiver CPU {med['cpu_ms']:6.1f} ms, {med['faults']:7.0f} minor "
            f"faults, wall {med['wall_ms']:6.1f} ms; dask.sizeof of the frame "
            f"{med['sizeof_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
