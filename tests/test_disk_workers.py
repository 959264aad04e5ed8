"""Disk-aware placement on real worker processes (``python -m runtime worker --disk``).

Two CLI workers past their spill fence spill every output to disk soon after it is made,
each under a tiny ``--disk``: ``a`` (3 MiB, pool ``a``) and ``b`` (6 MiB, pool ``b``). Filling
them through their own pools leaves ``a`` nearly full. Then, with no pool:

- tasks that would overflow ``a`` never go there: ``b`` runs every one;
- a task neither can hold now waits (its story says so) and runs once a release frees
  ``b``'s disk;
- a task no worker could ever hold fails at once with TaskTooBigForDisk;
- a task whose output turns out larger than declared ends its try ``disk-full`` on
  ``a``; ``a`` removes the partial file and keeps working; the retry waits until ``a``
  has room for the size it now expects, and succeeds there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.errors import GraphError, TaskTooBigForDisk
from tests.helpers import MB, Cli, wait_until

pytestmark = pytest.mark.anyio


def make(nbytes: int) -> tuple[int, bytes]:
    """An output of about ``nbytes``, and the pid of the worker that made it."""
    return os.getpid(), b"x" * nbytes


@pytest.mark.timeout(200)  # a backstop: every wait below is bounded
async def test_a_nearly_full_disk_never_receives_a_task_that_would_overflow_it(
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    # Three worker-process starts and a dozen runs: about 10 s alone, a minute when the
    # machine is shared.
    with Cli(tmp_path / "home") as cli, anyio.fail_after(150):
        _, address = await anyio.to_thread.run_sync(cli.manager)
        token = cli.tokens(address)["admin"]
        # Past the spill fence from the start (1% of 2 GiB, below any worker's RSS):
        # every output is spilled to disk, and one larger than the room left is written
        # there at once (and ends disk-full when it does not fit).
        common = ["--memory", "2GiB", "--spill", "0.01", "--cores", "1"]

        def start(name: str, disk: str) -> Any:
            spill = str(tmp_path / f"spill-{name}")
            flags = [*common, "--disk", disk, "--pool", name, "--spill-dir", spill]
            return cli.worker(address, *flags)

        a = await anyio.to_thread.run_sync(start, "a", "3MiB")
        b = await anyio.to_thread.run_sync(start, "b", "6MiB")
        async with Cluster(address, token=token) as cluster:

            async def one(key: str, nbytes: int, **options: Any) -> Any:
                (fut,) = await cluster.submit_graph({key: (make, nbytes)}, [key], **options)
                return fut

            async def on_disk(pool: str) -> int:
                status = await cluster.status()
                wid = next(w.worker_id for w in status["workers"] if w.pool == pool)
                report = status["memory"].get(wid)
                return int(report["spilled_bytes"]) if report is not None else 0

            fill_a = await one("filla-1", 2 * MB, pool="a")
            fill_b = await one("fillb-1", 4 * MB + MB // 2, pool="b")
            assert (await fill_a.result())[0] == a.pid
            assert (await fill_b.result())[0] == b.pid
            await wait_until(lambda: _at_least(on_disk("a"), 2 * MB), "a's report", limit=20)
            await wait_until(lambda: _at_least(on_disk("b"), 4 * MB), "b's report", limit=20)

            # About 1 MiB left on a, 1.5 MiB on b: tasks declared at 1.2 MiB all go to b.
            small = [await one(f"small-{i}", 100, resources={"disk": 1.2 * MB}) for i in range(4)]
            assert [(await f.result())[0] for f in small] == [b.pid] * 4

            # 2 MiB fits neither now, and b once fillb is dropped: it waits, then runs.
            wide = await one("wide-1", 100, resources={"disk": 2 * MB})
            story = await wait_until(
                lambda: _waiting(cluster.story("wide-1")), "wide-1 waiting", limit=20
            )
            assert "needs 2097152 B" in story, story
            assert not wide.done()
            fill_b.release()
            assert (await wide.result())[0] == b.pid

            # 7 MiB fits no worker's disk at all: refused at once, naming the sizes.
            huge = await one("huge-1", 100, resources={"disk": 7 * MB})
            with pytest.raises(TaskTooBigForDisk) as info:
                await huge.result()
            assert (info.value.needed, info.value.largest) == (7 * MB, 6 * MB)

            # Declared at 100 kB, it writes 2 MiB on a (about 1 MiB left): disk-full.
            spill = await one("spill-1", 2 * MB, pool="a", resources={"disk": 100_000})
            story = await wait_until(
                lambda: _retried(cluster.story("spill-1")), "a disk-full retry", limit=20
            )
            assert "output did not fit on disk" in story, story
            # a removed the partial file: what it holds on disk is still only filla's.
            assert await on_disk("a") < 2 * MB + MB // 2
            # The retry expects 2 MiB: it waits for a's room, and runs once fill_a goes.
            await wait_until(
                lambda: _waiting(cluster.story("spill-1")), "spill-1 waiting", limit=20
            )
            assert not spill.done()
            fill_a.release()
            assert (await spill.result())[0] == a.pid
            status = await cluster.status()
            stats = status["categories"]["spill"]
            assert (stats["disk_full"], stats["count"]) == (1, 1)
            assert stats["max_nbytes"] >= 2 * MB
            # The console's status shows each worker's free disk of what it offers.
            text = _rendered(status)
            assert "disk free" in text and "of 3.0 MiB" in text and "of 6.0 MiB" in text
        assert a.poll() is None and b.poll() is None  # both workers lived through it


async def _at_least(value: Any, n: int) -> bool:
    return bool(await value >= n)


async def _waiting(story: Any) -> str:
    for entry in await story:
        if str(entry[2]).startswith("waiting for disk"):
            return str(entry[2])
    return ""


async def _retried(story: Any) -> str:
    for entry in await story:
        if entry[1] == "retry":
            return str(entry[2])
    return ""


# ----------------------------------------------------------------------------- settings


def test_a_worker_without_disk_offers_its_file_systems_free_space_less_a_margin(
    tmp_path: Path,
) -> None:
    from actors.shared_disk import DISK_MARGIN
    from actors.worker import Worker, disk_free

    options = {"spill_dir": str(tmp_path / "not-yet")}  # made at the first spill
    w = Worker("w", None, lambda _: None, memory_options=options)  # type: ignore[arg-type]
    try:
        free = disk_free(str(tmp_path))
        margin = min(DISK_MARGIN, free // 10)
        # Free space moves as other programs write: within a few MiB of the measure.
        assert abs(w.disk - (free - margin)) < 64 * MB
        assert w.data.disk_limit == w.disk  # the store keeps to it
        assert w.info.disk == w.disk  # announced when it registers
    finally:
        w.data.close()
    given = Worker("w", None, lambda _: None, disk=5 * MB, memory_options=options)  # type: ignore[arg-type]
    assert (given.disk, given.data.disk_limit, given.info.disk) == (5 * MB, 5 * MB, 5 * MB)
    given.data.close()
    with pytest.raises(ValueError, match="disk must be >= 0"):
        Worker("w", None, lambda _: None, disk=-1)  # type: ignore[arg-type]


def test_a_worker_given_a_disk_share_offers_that_share_and_still_shares_it(
    tmp_path: Path,
) -> None:
    """``--disk-share 3`` (a local pool's worker, one of 3): a third of the free space
    less the margin, and it counts as taking the default (``disk_auto``), so the
    scheduler shares its file system with the workers started there by hand rather
    than taking its budget as given (an operator's audit: a local pool's worker
    passed ``--disk <the whole free space>``, and three workers started by hand were
    told to share the 0.6 MiB left). 0 is refused."""
    from actors.shared_disk import DISK_MARGIN
    from actors.worker import Worker, disk_free

    options = {"spill_dir": str(tmp_path)}
    w = Worker("w", None, lambda _: None, disk_share=3, memory_options=options)  # type: ignore[arg-type]
    try:
        free = disk_free(str(tmp_path))
        assert abs(w.disk - (free - min(DISK_MARGIN, free // 10)) // 3) < 64 * MB
        assert (w.info.disk, w.info.disk_auto) == (w.disk, True)
    finally:
        w.data.close()
    with pytest.raises(ValueError, match="disk_share must be a whole number >= 1"):
        Worker("w", None, lambda _: None, disk_share=0)  # type: ignore[arg-type]


def test_bad_disk_settings_are_refused_with_what_to_write() -> None:
    from actors.pools import pools_from_dicts
    from runtime import Cluster
    from runtime.errors import PoolConfigError

    with pytest.raises(ValueError, match="disk_per_worker must be >= 0"):
        Cluster(workers=1, disk_per_worker=-1)
    # The worker command names its flag, before it looks for a token or a manager.
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "ws://127.0.0.1:9", "--disk=-1MB"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "error: ValueError: --disk must be >= 0 or 'off', got '-1MB'" in proc.stderr
    with pytest.raises(PoolConfigError, match="disk_per_worker") as info:
        pools_from_dicts({"p": {"disk_per_worker": "lots"}})
    assert "file system's free space" in str(info.value)
    (pool,) = pools_from_dicts({"p": {"disk_per_worker": "20GiB"}}).values()
    assert pool.block_spec().disk == 20 * 2**30


def test_an_output_that_does_not_fit_leaves_no_file_behind(tmp_path: Path) -> None:
    from actors.store import SpillStore

    with SpillStore(tmp_path, disk_limit=MB) as store:
        assert store.write("small", b"x" * 1000)
        assert store.on_disk("small") and store.disk_bytes > 1000
        before = store.disk_bytes
        assert not store.write("big", b"x" * 2 * MB)
        assert "big" not in store and store.disk_bytes == before
        left = sorted(p.name for p in Path(store.directory or "").iterdir())
        assert left == [".owner", "00000001.spill"]  # and its lock file


def _rendered(status: dict[str, Any]) -> str:
    import io

    from rich.console import Console

    from runtime.console import jsonable, render_status

    out = io.StringIO()
    Console(file=out, width=200).print(render_status(jsonable(status)))
    return out.getvalue()


def test_the_preflight_check_counts_disk_per_worker_as_the_most_a_pool_spills() -> None:
    from actors.pools import pools_from_dicts
    from runtime.preflight import expected_spill

    shape = {"memory_per_worker": "4GiB", "workers_per_node": 2, "max_blocks": 3}
    pools = pools_from_dicts({"p": {**shape, "disk_per_worker": "1GiB"}, "q": shape})
    # p: 2 x 3 workers keep at most 1 GiB each on disk; q spills up to its memory.
    assert expected_spill(pools) == (6 * 2**30 + 24 * 2**30, [])


def test_a_disk_that_is_not_counted_is_off_everywhere(tmp_path: Path) -> None:
    from actors.pools import pools_from_dicts
    from actors.providers import DISK_OFF
    from actors.worker import Worker
    from runtime import Cluster
    from runtime.node import worker_argv

    options = {"spill_dir": str(tmp_path)}
    w = Worker("w", None, lambda _: None, disk=None, memory_options=options)  # type: ignore[arg-type]
    # Announced as no limit (the scheduler places as if it had none), nothing enforced.
    assert (w.disk, w.info.disk, w.data.disk_limit) == (0, 0, 0)
    w.data.close()
    assert Cluster(workers=1, disk_per_worker="off").disk_per_worker == DISK_OFF
    (pool,) = pools_from_dicts({"p": {"disk_per_worker": "off"}}).values()
    assert pool.block_spec().disk == DISK_OFF
    argv = worker_argv("ws://127.0.0.1:1", 1, 0, "p", disk=DISK_OFF)
    assert argv[argv.index("--disk") + 1] == "off"
    assert "--disk" not in worker_argv("ws://127.0.0.1:1", 1, 0, "p")  # measured


async def test_an_embedded_cluster_counts_the_disk_per_worker_it_was_given() -> None:
    from runtime import Cluster

    async with Cluster(workers=2, disk_per_worker="3MiB") as cluster:
        with anyio.fail_after(30):
            await cluster.wait_for_workers(2)
            status = await cluster.status()
            assert [w.disk for w in status["workers"]] == [3 * MB, 3 * MB]
            (ok,) = await cluster.submit_graph(
                {"fits-1": (make, MB)}, ["fits-1"], resources={"disk": 2 * MB}
            )
            assert len((await ok.result())[1]) == MB
            # declared bigger than every worker's disk: refused at submit (GraphError)
            with pytest.raises(GraphError, match=r"raise disk_per_worker in Cluster") as info:
                await cluster.submit_graph(
                    {"big-1": (make, 10)}, ["big-1"], resources={"disk": 4 * MB}
                )
            assert (info.value.fields["asked"], info.value.fields["has"]) == (4 * MB, 3 * MB)
