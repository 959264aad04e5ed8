"""A seeded fault run (issue 9): a 2,000-task graph on 3 worker processes while a
schedule drawn from a seed kill -9s a worker, SIGSTOPs one, drops every worker's
connection to the manager and restarts a worker. Every result must be right, nothing
may hang, and the run's time against a fault-free run is reported.

The workers reach the manager through a TCP proxy in this process, so "drop the
connections" is real: the proxy closes both ends of every connection at once and the
workers must rejoin. Peers fetch from each other directly, as always.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from runtime import Cluster
from runtime.messages import StoryQuery, TasksQuery
from tests.helpers import Cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
LIMIT = 150  # seconds per seed
LEAVES = 1800


def leaf(i: int) -> int:
    time.sleep(0.008)
    return i * i % 997


def total(*parts: int) -> int:
    return sum(parts)


def fault_graph() -> tuple[dict[Any, Any], Any, int]:
    """1,800 leaves, 180 sums of 10, 19 sums of those, one total: 2,000 tasks."""
    dsk: dict[Any, Any] = {("leaf", i): (leaf, i) for i in range(LEAVES)}
    sums = LEAVES // 10
    for j in range(sums):
        dsk[("sum", j)] = (total, *[("leaf", i) for i in range(10 * j, 10 * j + 10)])
    for g in range(19):
        members = range(g * sums // 19, (g + 1) * sums // 19)
        dsk[("group", g)] = (total, *[("sum", j) for j in members])
    dsk["total"] = (total, *[("group", g) for g in range(19)])
    assert len(dsk) == 2000
    return dsk, "total", sum(i * i % 997 for i in range(LEAVES))


class Proxy:
    """A TCP proxy on 127.0.0.1 to ``target``; ``drop()`` closes every connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.streams: set[anyio.abc.SocketStream] = set()
        self.port = 0
        self.dropped = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._serve)

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        server: anyio.abc.SocketStream | None = None
        try:
            server = await anyio.connect_tcp("127.0.0.1", self.target_port)
            self.streams |= {client, server}
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump, client, server, tg.cancel_scope)
                tg.start_soon(self._pump, server, client, tg.cancel_scope)
        except OSError:
            pass
        finally:
            self.streams -= {client, server}
            with anyio.CancelScope(shield=True):
                for s in (client, server):
                    if s is not None:
                        await s.aclose()

    async def _pump(
        self, src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream, scope: anyio.CancelScope
    ) -> None:
        try:
            async for data in src:
                await dst.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def drop(self) -> None:
        self.dropped += 1
        for s in list(self.streams):
            await s.aclose()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as cli:
        yield cli


async def stuck(c: Cluster) -> str:
    """Where a run that does not finish stands: task states, and the stories of the
    tasks that are processing."""
    st = await c.status()
    running = await c._manager.ask(TasksQuery("processing", None, 5))
    stories = await c._manager.ask(StoryQuery(tuple(r.key for r in running)))
    return f"states {st['tasks_by_state']}; processing {running}; stories {stories}"


async def run_once(procs: Cli, seed: int | None) -> tuple[float, list[str]]:
    """Run the graph on 3 workers; with a seed, under that seed's fault schedule."""
    _, address = procs.manager()
    port = int(address.rsplit(":", 1)[1])
    token = procs.tokens(address)["admin"]
    log: list[str] = []
    async with anyio.create_task_group() as tg:
        proxy = Proxy(port)
        await tg.start(proxy.run)
        via = f"ws://127.0.0.1:{proxy.port}"

        def new_worker() -> subprocess.Popen[str]:
            return procs.worker(via, "--cores", "1", "--token", token)

        # (started from a thread: this loop must keep serving the proxy meanwhile)
        workers = [await anyio.to_thread.run_sync(new_worker) for _ in range(3)]
        dsk, key, expected = fault_graph()
        async with Cluster(address) as c:
            await c.wait_for_workers(3)
            start = time.monotonic()
            (fut,) = await c.submit_graph(dsk, [key])

            async def faults() -> None:
                rng = random.Random(seed)
                kinds = ["kill -9", "SIGSTOP", "drop connections", "restart"]
                rng.shuffle(kinds)
                for kind in kinds:
                    await anyio.sleep(rng.uniform(0.3, 1.2))
                    if fut.done():
                        log.append(f"{kind}: not needed, the run had finished")
                        continue
                    t = time.monotonic() - start
                    live = [w for w in workers if w.poll() is None]
                    victim = rng.choice(live)
                    if kind == "kill -9":
                        victim.kill()
                        workers.remove(victim)
                        workers.append(await anyio.to_thread.run_sync(new_worker))
                    elif kind == "SIGSTOP":
                        victim.send_signal(signal.SIGSTOP)
                        await anyio.sleep(rng.uniform(1.0, 3.0))
                        victim.send_signal(signal.SIGCONT)
                    elif kind == "drop connections":
                        await proxy.drop()
                    else:
                        victim.send_signal(signal.SIGTERM)
                        await anyio.to_thread.run_sync(victim.wait, 20)
                        workers.remove(victim)
                        workers.append(await anyio.to_thread.run_sync(new_worker))
                    log.append(f"{kind} at {t:.1f} s")

            async with anyio.create_task_group() as chaos:
                if seed is not None:
                    chaos.start_soon(faults)
                with anyio.move_on_after(60):
                    await fut.wait()
                if not fut.done():  # a hang: say where it stands before failing
                    pytest.fail(f"no result after 60 s; {log}; {await stuck(c)}")
                assert await fut == expected
                took = time.monotonic() - start
                chaos.cancel_scope.cancel()
            st = await c.status()
        log.append(
            f"lost tries {sum(v['lost'] for v in st['categories'].values())}, "
            f"connection drops {proxy.dropped}"
        )
        tg.cancel_scope.cancel()
    return took, log


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_graph_survives_a_seeded_fault_schedule(procs: Cli, seed: int) -> None:
    with anyio.fail_after(LIMIT):
        took, log = await run_once(procs, seed)
    print(f"\nseed {seed}: correct in {took:.1f} s; " + "; ".join(log))


async def test_the_same_graph_without_faults(procs: Cli) -> None:
    """The baseline the seeded runs are read against."""
    with anyio.fail_after(LIMIT):
        took, log = await run_once(procs, None)
    print(f"\nno faults: correct in {took:.1f} s; " + "; ".join(log))
