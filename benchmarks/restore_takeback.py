"""A second pipeline after a queue alert's ``restore``, on a ``fixed`` pool of
``max_blocks = 2`` (an operator's audit, docs: policies.md#scaling).

A manager process with one local pool (1 core per block, a provisioning delay of 15 s)
and a queue-time rule whose ``fit`` scale-out restores the target once it resolves.
Pipeline A (2 builds of 30 s) waits for the alert, which scales the pool to 2; it
resolves once both run, and the target goes back to 0 (before 4dd6cb0 both workers
were drained then, busy; since, a restore drains a block only once it runs nothing).
Pipeline B (2 builds of 5 s) is submitted then, A's futures kept (its outputs held, so
drained workers cannot leave). The script prints when A and B end, B's wait, and
the blocks the pool had at once (sampled every 0.5 s) and in all.

    python benchmarks/restore_takeback.py [--port 21301]

Compare two trees with ``PYTHONPATH`` (the manager and its workers import the same
``runtime``, ``cluster_processes.manager_and_workers``), from outside the checkout
(``python -m runtime`` puts the working directory first on their path):
``cd /tmp && PYTHONPATH=/tmp/old python CHECKOUT/benchmarks/restore_takeback.py --port
21311``. Takes 1-2 minutes; bounded (300 s per wait). Measured: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import anyio
from cluster_processes import manager_and_workers  # (benchmarks/: on the path)

CONFIG = """
[pools.build]
provider = "local"
min_blocks = 0
init_blocks = 0
max_blocks = 2
workers_per_node = 1
cores_per_worker = 1
memory_per_worker = "512MiB"
provision_delay = 15
max_idletime = 60

[policies]
scaling = "fixed"

[alerting]
interval = 2

[[alerts]]
name = "CIQueueTime"
expr = 'corral_queue_depth{pool="build"} > 0 and EXPR_WAIT > 20'
for = "10s"
action = {scale_out = {fit = true, max_blocks = 2, max_cost = 2, cooldown = "30s"}}
""".replace("EXPR_WAIT", 'corral_queue_oldest_wait_seconds{pool="build"}')


def build(name: str, secs: float) -> str:
    time.sleep(secs)
    return name


async def pipelines(port: int, token: Path) -> None:
    from runtime import Cluster

    seen: set[str] = set()
    most = 0
    async with Cluster(f"ws://127.0.0.1:{port}", token_file=str(token)) as c:

        async def sample() -> None:
            nonlocal most
            while True:
                blocks = (await c.status())["autoscaler"]["blocks"]
                seen.update(blocks)
                most = max(most, len(blocks))
                await anyio.sleep(0.5)

        async def until_firing(wanted: bool) -> None:
            """Poll the alerts every second until CIQueueTime fires (or no longer)."""
            while True:
                alerts = (await c.alerts()).alerts
                if any(a.name == "CIQueueTime" and a.state == "firing" for a in alerts) == wanted:
                    return
                await anyio.sleep(1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            t0 = time.time()
            a = [c.submit(build, f"A{i}", 30, key=f"buildA-{i}", pool="build") for i in range(2)]
            with anyio.fail_after(300):
                await until_firing(True)
                await until_firing(False)
            print(f"{time.time() - t0:.0f} s: CIQueueTime resolved; submitting B", flush=True)
            tb = time.time()
            b = [c.submit(build, f"B{i}", 5, key=f"buildB-{i}", pool="build") for i in range(2)]
            with anyio.fail_after(300):
                for f in a:
                    await f
                print(f"{time.time() - t0:.0f} s: A done", flush=True)
                for f in b:
                    await f
            print(f"{time.time() - t0:.0f} s: B done; B waited and ran {time.time() - tb:.0f} s "
                  "(5 s of work)", flush=True)  # fmt: skip
            tg.cancel_scope.cancel()
    print(f"blocks at once: at most {most}; blocks in all: {len(seen)} ({', '.join(sorted(seen))})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=21301, help="the manager's port")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-takeback-") as tmp:
        home, config, log = Path(tmp) / "home", Path(tmp) / "corral.toml", Path(tmp) / "log"
        config.write_text(CONFIG)
        os.environ["CORRAL_HOME"] = str(home)  # the client's too
        # (the later --listen wins over manager_and_workers' own)
        manager = ["--listen", f"127.0.0.1:{args.port}", "--config", str(config),
                   "--no-monitoring"]  # fmt: skip
        try:
            with manager_and_workers(str(home), [], manager, str(log)):
                token = home / "tokens" / f"127.0.0.1_{args.port}.json"
                anyio.run(pipelines, args.port, token)
        finally:
            for line in log.read_text().splitlines() if log.exists() else ():
                if "took back" in line or "scale pool" in line:
                    print("  manager:", line[:300])


if __name__ == "__main__":
    main()
