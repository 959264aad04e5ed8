"""Values larger than a frame, alone or together, between real processes over real
websockets.

A manager process and two worker processes (pools ``a`` and ``b``, so a task in pool
``b`` must fetch its input from the worker of pool ``a``) started through the CLI, and a
client in this process. The frame cap (``runtime.codec.MAX_FRAME_BYTES``, 256 MiB) is
what these values are larger than; they travel as streams (actors/transfer.py). Values
under 32 MiB travel inline, and a result of many of them, larger in all than a frame,
reaches a remote client in several answers (``GatherResult.later``).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import psutil
import pytest

from actors.transfer import PART_BYTES, WINDOW
from runtime import Cluster
from runtime.codec import MAX_FRAME_BYTES
from runtime.errors import ValueTooLarge
from tests.helpers import Cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
LIMIT = 90  # seconds per test
N = MAX_FRAME_BYTES // 8 + 4 * 2**20  # float64 elements: 288 MiB, past the frame cap


@pytest.fixture
def cluster_procs(
    tmp_path: Path, request: Any
) -> Iterator[tuple[str, subprocess.Popen[str], subprocess.Popen[str]]]:
    """(address, worker of pool a, worker of pool b); ``request.param``: extra
    arguments for the worker of pool b."""
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager()
        a = cli.worker(address, "--cores", "1", "--pool", "a")
        b = cli.worker(address, "--cores", "1", "--pool", "b", *getattr(request, "param", []))
        yield address, a, b


def make(n: int) -> Any:
    import numpy as np

    return np.arange(n, dtype=np.float64)


def digest(x: Any) -> tuple[Any, ...]:
    return (x.shape, float(x[0]), float(x[-1]), float(x[:: 2**20].sum()), x.flags.writeable)


class Holder:
    """An object dask.sizeof cannot see into: its recorded size is a few dozen bytes."""

    def __init__(self, array: Any) -> None:
        self.array = array


def make_holder(n: int) -> Holder:
    import numpy as np

    return Holder(np.ones(n, dtype=np.uint8))


def holder_sum(h: Holder) -> int:
    return int(h.array.sum())


class Peak:
    """Samples a process's RSS in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


async def test_a_value_past_the_frame_cap_moves_between_workers_and_to_the_client(
    cluster_procs: tuple[str, subprocess.Popen[str], subprocess.Popen[str]],
) -> None:
    address, a, _ = cluster_procs
    expected = (
        (N,), 0.0, float(N - 1), float(np.arange(N, dtype=np.float64)[:: 2**20].sum()), True,
    )  # fmt: skip
    assert N * 8 > MAX_FRAME_BYTES
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            (big,) = await c.submit_graph({"big": (make, N)}, ["big"], pool="a")
            await big.wait()
            # The sender holds a few parts beyond the value, not a copy of it.
            bound = WINDOW * PART_BYTES + 48 * 2**20
            before = psutil.Process(a.pid).memory_info().rss
            with Peak(a.pid) as sender:
                (check,) = await c.submit_graph({"check": (digest, "big")}, ["check"], pool="b")
                assert await check == expected  # worker b read it from worker a
                value = await big  # and the client, through the manager
            assert value.shape == (N,) and value.dtype == np.float64
            assert value[0] == 0 and value[-1] == N - 1 and value[12345] == 12345
            assert value.flags.writeable
            grew = sender.peak - before
            assert grew < bound, f"the sender grew {grew / 2**20:.0f} MiB while streaming"


async def test_a_value_whose_size_dask_cannot_see_still_moves(
    cluster_procs: tuple[str, subprocess.Popen[str], subprocess.Popen[str]],
) -> None:
    address, _, _ = cluster_procs
    n = MAX_FRAME_BYTES + 2**20  # bytes, in an object sizeof sizes at a few dozen
    graph = {"held": (make_holder, n), "total": (holder_sum, "held")}
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            (held,) = await c.submit_graph({"held": graph["held"]}, ["held"], pool="a")
            await held.wait()
            (total,) = await c.submit_graph({"total": graph["total"]}, ["total"], pool="b")
            assert await total == n
            st = await c.status()
            assert st["categories"]["held"]["total_nbytes"] < 1000  # as recorded


@pytest.mark.parametrize("cluster_procs", [["--memory", "300MiB"]], indirect=True)
async def test_a_value_larger_than_the_receivers_memory_limit_fails_at_once(
    cluster_procs: tuple[str, subprocess.Popen[str], subprocess.Popen[str]],
) -> None:
    address, _, b = cluster_procs
    n = 400 * 2**20  # the recorded size is tiny, so the scheduler lets it go to b
    with anyio.fail_after(LIMIT):
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            (held,) = await c.submit_graph({"held": (make_holder, n)}, ["held"], pool="a")
            await held.wait()
            (total,) = await c.submit_graph({"total": (holder_sum, "held")}, ["total"], pool="b")
            start = time.monotonic()
            with pytest.raises(ValueTooLarge) as err:
                await total
            took = time.monotonic() - start
            assert err.value.key == "held"
            assert err.value.nbytes > n and err.value.limit == 300 * 2**20
            assert "(its memory limit)" in str(err.value) and "400.0 MiB" in str(err.value)
            assert took < 20, f"took {took:.1f} s"
            # nothing was lost: the value is still where it was made, b still works
            assert (await held).array.nbytes == n
            (small,) = await c.submit_graph({"small": (sum, [1, 2, 3])}, ["small"], pool="b")
            assert await small == 6
    assert b.poll() is None


async def test_a_local_client_of_worker_processes_gets_a_value_past_the_frame_cap() -> None:
    """``Cluster(processes=1)``: the manager is in this process and reads the stream."""
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1) as c:
            await c.wait_for_workers(1, timeout=60)
            value = await c.submit(make, N)
    assert value.shape == (N,) and value[-1] == N - 1 and value.flags.writeable


def part(i: int) -> Any:
    """A 1 MiB array filled with ``i``: a value that travels inline (under 32 MiB)."""
    import numpy as np

    return np.full(2**20 // 8, float(i))


def held_part(i: int) -> Holder:
    """1 MiB (filled with ``i % 256``) that dask.sizeof records as a few dozen bytes."""
    import numpy as np

    return Holder(np.full(2**20, i % 256, dtype=np.uint8))


def manager_and_workers(cli: Cli, *pools: str) -> tuple[subprocess.Popen[str], str]:
    """A manager (and its address) with a worker of one core in each of ``pools``
    ("": in none)."""
    manager, address = cli.manager()
    for pool in pools:
        cli.worker(address, "--cores", "1", *(["--pool", pool] if pool else []))
    return manager, address


def unsent_replies(cli: Cli, manager: subprocess.Popen[str]) -> list[str]:
    """The manager's lines saying a reply could not be sent (it is stopped to read them)."""
    cli.stop([manager])
    return [line for line in cli.rest(manager) if "could not send a reply" in line]


async def test_inline_values_past_the_frame_cap_in_all_reach_a_remote_client(
    tmp_path: Path,
) -> None:
    """Many values under 32 MiB, 288 MiB in all: more than one frame may carry. The
    manager answers with at most 64 MiB of them at a time; the client asks for the rest
    (``GatherResult.later``)."""
    n = MAX_FRAME_BYTES // 2**20 + 32
    with Cli(tmp_path / "home") as cli:
        manager, address = manager_and_workers(cli, "", "")
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as c:
                await c.wait_for_workers(2)
                keys = [("part", i) for i in range(n)]
                values = await c.compute({k: (part, k[1]) for k in keys}, keys)
                assert len(values) == n
                for i, v in enumerate(values):
                    assert v.shape == (2**17,) and v[0] == v[-1] == i
                # and the futures' way
                keys = [("neg", i) for i in range(n)]
                futures = await c.submit_graph({k: (part, -k[1]) for k in keys}, keys)
                got = await c.gather(futures)
                assert [float(v[7]) for v in got] == [-float(i) for i in range(n)]
        assert unsent_replies(cli, manager) == []


async def test_inline_values_whose_size_dask_cannot_see_reach_a_remote_client(
    tmp_path: Path,
) -> None:
    """40 MiB of arrays on one worker, then 220 MiB of values recorded at a few dozen
    bytes on the other: together past the frame cap, though each worker's reply fits
    in a frame. The manager finds the second far larger than recorded and asks for it
    again as streams."""
    arrays = {("a", i): (part, i) for i in range(40)}
    held = {("h", i): (held_part, i) for i in range(220)}
    with Cli(tmp_path / "home") as cli:
        manager, address = manager_and_workers(cli, "a", "b")
        with anyio.fail_after(LIMIT):
            async with Cluster(address) as c:
                await c.wait_for_workers(2)
                first = await c.submit_graph(arrays, list(arrays), pool="a")
                then = await c.submit_graph(held, list(held), pool="b")
                values = await c.gather([*first, *then])
        assert unsent_replies(cli, manager) == []
    assert [float(v[0]) for v in values[:40]] == [float(i) for i in range(40)]
    assert [int(h.array[-1]) for h in values[40:]] == [i % 256 for i in range(220)]
    assert all(h.array.nbytes == 2**20 for h in values[40:])
