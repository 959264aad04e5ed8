"""A survey pipeline through a manager: many small tile tasks, a reduction per 100 tiles,
four merges and a final merge, submitted from the Python API (``Cluster(address)``).

Prints the time of the ``submit``/``map`` calls, the time to the first tile's result,
the tasks per second from the end of submission to the final result, and this client's
RSS. With ``--categories N`` the tiles are named in N task categories (keys
``{prefix}{i % N:05d}x-{i:08x}``), as a survey naming its tasks by field would;
without it, one category (``map``).

    python -m runtime manager --listen 127.0.0.1:8786 &
    python -m runtime worker ws://127.0.0.1:8786 --cores 4 --memory 1GiB &   # two of them
    python benchmarks/survey.py ws://127.0.0.1:8786 --tiles 20000 --categories 5000

The manager's token is found as for any client (``CORRAL_TOKEN``, or the manager's
token file on this machine; ``--token-file`` to name one).
"""

from __future__ import annotations

import argparse
import time

import anyio
import psutil

from runtime import Cluster


def tile(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def total(xs: list[int]) -> int:
    return sum(xs)


def _rss() -> str:
    return f"{psutil.Process().memory_info().rss / 2**20:.0f} MiB"


async def survey(args: argparse.Namespace) -> bool:
    n, ncats = args.tiles, args.categories
    began = time.perf_counter()
    async with Cluster(args.address, token_file=args.token_file) as cluster:
        t0 = time.perf_counter()
        print(f"connected in {t0 - began:.2f} s", flush=True)
        if ncats:
            tiles = [
                cluster.submit(tile, i, args.sleep, key=f"{args.prefix}{i % ncats:05d}x-{i:08x}")
                for i in range(n)
            ]
        else:
            tiles = cluster.map(tile, range(n), seconds=args.sleep)
        fields = [cluster.submit(total, tiles[j : j + 100]) for j in range(0, n, 100)]
        step = max(1, len(fields) // 4)
        merges = [cluster.submit(total, fields[j : j + step]) for j in range(0, len(fields), step)]
        final = cluster.submit(total, merges)
        tasks = n + len(fields) + len(merges) + 1
        t1 = time.perf_counter()
        print(f"submit calls: {t1 - t0:.2f} s for {tasks:,} tasks; client RSS {_rss()}", flush=True)
        # Any tile's: the client has no "first of these" wait, so it looks every 50 ms.
        while not any(f.done() for f in tiles):  # noqa: ASYNC110
            await anyio.sleep(0.05)
        print(f"first result: {time.perf_counter() - t1:.2f} s", flush=True)
        value = await final
        t2 = time.perf_counter()
        ok = value == n * (n - 1) // 2
        print(
            f"final result: {t2 - t1:.2f} s, {tasks / (t2 - t1):,.0f} tasks/s, "
            f"{'right' if ok else 'WRONG'}; client RSS {_rss()}",
            flush=True,
        )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", help="the manager's address, ws://HOST:PORT")
    parser.add_argument("--tiles", type=int, default=20_000, help="tile tasks (default 20,000)")
    parser.add_argument(
        "--categories", type=int, default=0, help="task categories of the tiles (0: one, by map)"
    )
    parser.add_argument(
        "--sleep", type=float, default=0.005, help="seconds each tile sleeps (default 0.005)"
    )
    parser.add_argument("--prefix", default="tile", help="the tiles' key prefix (default tile)")
    parser.add_argument("--token-file", default=None, help="a file holding the manager's token")
    args = parser.parse_args()
    if args.tiles < 1 or args.categories < 0 or args.sleep < 0:
        parser.error("--tiles must be at least 1, --categories and --sleep at least 0")
    raise SystemExit(0 if anyio.run(survey, args) else 1)


if __name__ == "__main__":
    main()
